"""The run page's views, without a browser: each view's data, drawn from the run's RunView."""

import dataclasses
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import workbench
from workbench.instrument import load_run
from workbench.ui import figures, live_run, run_control, run_page, stored_runs
from workbench.ui.views import NOTHING_RECORDED, RunView

TINY = {"width": "8", "depth": "2", "batch_size": "16", "n_samples": "64"}
LAYERS = ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"]


def finished(manager, steps=6, store="", histograms=False, seed=0, name="activation_mlp", values=None, **kwargs):
    run, message = live_run.start_run(manager, name, dict(TINY if values is None else values), seed, steps, 1,
                                      histograms, "*", store, **kwargs)
    assert run is not None, message
    run.join(120)
    assert run.outcome == "finished", run.error
    return run


def traces(figure, name=None):
    return [t for t in figure["data"] if name is None or t.get("name") == name]


def xy(trace):
    return figures.values(trace["x"]).tolist(), figures.values(trace["y"]).tolist()


def stored(rows, kind, site, statistic):
    part = rows[(rows.kind == kind) & (rows.module == site) & (rows.tensor == "out")]
    return part.step.tolist(), part[statistic].tolist()


def test_a_live_run_feeds_its_view_from_the_first_step_and_the_page_draws_from_the_view_alone(manager,
                                                                                               monkeypatch):
    run = finished(manager, steps=6, store="r")
    view = run.view
    assert view.steps_fed == 6 and view.status == "finished" and view.total == 6 and view.label == run.label
    rows = load_run(manager.root.path / "r").to_pandas()

    def no_frames(*args):
        raise AssertionError("a page read the whole history")

    monkeypatch.setattr(type(run.watch), "to_pandas", no_frames)
    monkeypatch.setattr(type(run.watch), "metrics", no_frames)
    page = run_page.draw_page(view)
    # (1) the header: status, step of total with a progress bar
    assert "`finished`" in page.header and "step 6 of 6" in page.header and "<progress" in page.header
    # (2) metrics: a panel each, every step
    assert page.metric_choices == ["accuracy", "loss"] == page.metrics
    steps, values = xy(traces(page.metrics_figure, "loss")[0])
    assert steps == [1, 2, 3, 4, 5, 6] and len(values) == 6
    # (3) a statistic per call site: the sites in forward order, the default selection the view's
    assert page.site_choices == LAYERS
    assert set(page.sites) == set(view.default_sites("activation", "std", run_page.DEFAULT_SITES))
    for site in page.sites:
        x, y = xy(traces(page.sites_figure, site)[0])
        want_x, want_y = stored(rows, "activation", site, "std")
        assert x == want_x and y == pytest.approx(want_y, rel=1e-5)
    assert "`layers.4` is the tensor `layers` and `(model)` return too" in page.site_note  # (one tensor, three names)
    # (4) no histograms: the page says how to get them
    assert page.dist_choices == [] and "Tick **histograms**" in page.dist_note
    # (5) the heatmap: grad_output norm of every site, forward order, log10
    [heat] = page.heatmap_figure["data"]
    assert heat["y"] == LAYERS
    z = figures.values(heat["z"])
    for i, site in enumerate(LAYERS):
        assert z[i].tolist() == pytest.approx(np.log10(stored(rows, "grad_output", site, "norm")[1]), rel=1e-4)
    # (6) no NaN/Inf
    assert page.first_anomaly is None and page.anomaly == "" and page.anomalies.empty
    # the last-step table follows the kind
    for kind in ("activation", "grad_output"):
        latest = run_page.draw_page(view, run_page.Controls(kind=kind)).latest
        assert list(latest.site) == LAYERS and set(latest.step) == {6}
        want = [stored(rows, kind, site, "norm")[1][-1] for site in LAYERS]
        assert latest.norm.tolist() == pytest.approx(want, rel=1e-5)
    # what the legacy frames say comes from the view too
    header, metrics, series, note, latest, anomalies, going = run_control.run_views(manager, run.id, "grad_output",
                                                                                    "norm", "layers.[01]")
    assert "step 6 of 6" in header and set(series.site) == {"layers.0", "layers.1"} and not going
    assert note == "2 of 5 call sites" and set(metrics.metric) == {"accuracy", "loss"}


def test_the_controls_pick_what_each_view_draws(manager):
    run = finished(manager, steps=5, histograms=True)
    controls = run_page.Controls(metrics=["loss"], smoothing=0.6, log_metrics=True, kind="grad_output",
                                 statistic="norm", sites=["layers.3", "layers.1", "nowhere"], log_sites=True,
                                 dist_site="layers.2", heat_kind="activation", heat_statistic="zero_frac",
                                 heat_log=False)
    page = run_page.draw_page(run.view, controls)
    assert page.metrics == ["loss"] and {t["name"] for t in page.metrics_figure["data"]} == {"loss",
                                                                                            "loss (smoothed)"}
    assert page.metrics_figure["layout"]["yaxis"]["type"] == "log"
    smoothed = figures.values(traces(page.metrics_figure, "loss (smoothed)")[0]["y"])
    raw = run.view.metrics_frame(["loss"]).value.to_numpy()
    assert smoothed[1] == pytest.approx((0.6 * 0.4 * raw[0] + 0.4 * raw[1]) / (0.4 + 0.6 * 0.4), rel=1e-5)
    # the picked sites in forward order; a name the kind lacks is left out, and said so
    assert page.sites == ["layers.1", "layers.3"] and [t["name"] for t in traces(page.sites_figure)
                                                      if "lines" in t.get("mode", "")] == ["layers.1", "layers.3"]
    assert "'nowhere'" in page.site_note and page.sites_figure["layout"]["yaxis"]["type"] == "log"
    assert "2 of 5 grad_output call sites (as picked)" in page.site_note  # (not "by default the ones ...")
    # distributions: the sites with histograms, the one picked
    assert page.dist_choices == LAYERS and page.dist_site == "layers.2"
    median = traces(page.distribution_figure, "median")[0]
    assert figures.values(median["x"]).tolist() == [1, 2, 3, 4, 5]
    bands, _, _, _ = run.view.distribution("grad_output", "layers.2")
    assert figures.values(median["y"]).tolist() == pytest.approx(bands.p50.tolist())
    # the heatmap of another kind and statistic, unlogged
    [heat] = page.heatmap_figure["data"]
    assert heat["y"] == LAYERS and "zero_frac" in page.heatmap_figure["layout"]["title"]["text"]
    _, _, matrix, _ = run.view.heatmap("activation", "zero_frac")
    np.testing.assert_allclose(figures.values(heat["z"]), matrix)
    # a site picked for the distribution that has none: the first chosen site with histograms
    page = run_page.draw_page(run.view, run_page.Controls(sites=["layers.4"], dist_site="elsewhere"))
    assert page.dist_site == "layers.4"


@pytest.mark.parametrize("controls, where, says", [
    (dict(kind="weights"), "sites_figure", "kind must be one of activation"),
    (dict(statistic="median"), "sites_figure", "statistic must be one of mean"),
    (dict(smoothing=1.5), "metrics_figure", "smoothing must be a number in [0, 0.99]"),
    (dict(smoothing="x"), "metrics_figure", "got 'x'"),
    (dict(heat_kind="grads"), "heatmap_figure", "heatmap kind must be one of"),
    (dict(heat_statistic=None), "heatmap_figure", "heatmap statistic must be one of"),
    (dict(sites=5), "sites_figure", "sites must be a list of names, got 5"),
])
def test_a_control_value_the_page_cannot_draw_is_a_message_in_that_view(manager, controls, where, says):
    run = finished(manager, steps=2)
    page = run_page.draw_page(run.view, run_page.Controls(**controls))
    assert says in page.__getattribute__(where)["layout"]["annotations"][0]["text"]
    assert page.metric_choices == ["accuracy", "loss"]  # the other views are drawn


def test_the_first_nan_is_shown_and_the_page_jumps_to_its_site(manager, nan_at_step_3):
    run, _ = live_run.start_run(manager, "activation_mlp", dict(TINY), 0, 5, 1, True, "*", "",
                                record=["activations", "output gradients"])
    run.join(60)
    page = run_page.draw_page(run.view, run_page.Controls(kind="grad_output"))
    first = page.first_anomaly
    assert first == {**first, "step": 3, "site": "layers.2", "kind": "activation"}, first
    assert "First NaN/Inf at step 3: `layers.2`" in page.anomaly and not page.anomalies.empty
    jumped = run_page.jump_controls(run.view, run_page.Controls(kind="grad_output", sites=["layers.0"]))
    assert (jumped.kind, list(jumped.sites), jumped.dist_site, jumped.heat_kind) == (
        "activation", ["layers.2"], "layers.2", "activation")
    page = run_page.draw_page(run.view, jumped)
    assert page.sites == ["layers.2"] and page.dist_site == "layers.2"
    assert [t["name"] for t in traces(page.sites_figure) if "lines" in t.get("mode", "")] == ["layers.2"]
    assert run_page.jump_controls(RunView(), run_page.Controls()) is None


def test_a_redraw_sends_nothing_when_nothing_is_new_and_the_pickers_only_when_they_change(manager):
    import gradio as gr

    run = finished(manager, steps=3)
    values = ([], 0.0, False, "activation", "std", [], False, None, "grad_output", "norm", True)
    drawn = run_page.redraw(run.view, "h", run.id, None, values, force=False)
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], drawn))
    state = out["state"]
    assert out["header"] == "h" and out["sites"].choices == [(s, s) for s in LAYERS]
    assert state["version"] == (run.id, 3, "finished", 0)
    # the next tick: no step came, nothing is sent
    again = run_page.redraw(run.view, "h", run.id, state, values, force=False)
    assert all(v == gr.skip() for v in again[1:])
    # a control changed (force): drawn again, the unchanged pickers not sent
    forced = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(run.view, "h", run.id, state, values)))
    assert forced["sites"] == gr.skip() and forced["metric_names"] == gr.skip()
    assert json.loads(forced["metrics"].plot)["data"]
    # a figure keeps the user's zoom across refreshes while it shows the same thing, not after
    revision = json.loads(forced["series"].plot)["layout"]["uirevision"]
    assert revision == json.loads(out["series"].plot)["layout"]["uirevision"]
    other = list(values)
    other[run_page.CONTROLS.index("stat")] = "norm"
    moved = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(run.view, "h", run.id, state, other)))
    assert json.loads(moved["series"].plot)["layout"]["uirevision"] != revision


def test_the_plots_start_sends_say_the_run_is_starting():
    plots = [json.loads(plot.plot) for plot in run_page.starting_plots("r1 activation_mlp")]
    assert len(plots) == len(run_page.PLOTS) and set(run_page.PLOTS) <= set(run_page.VIEW_OUTPUTS)
    for figure in plots:
        assert not figure["data"]
        assert [a["text"] for a in figure["layout"]["annotations"]] == [
            "r1 activation_mlp is starting: its views are drawn here as its steps are recorded."]


def test_a_page_without_a_run_says_why_in_every_figure_not_that_a_run_has_no_rows():
    values = ([], 0.0, False, "activation", "std", [], False, None, "grad_output", "norm", True)
    header = "_No run on this page: start one (New run), or attach to one below._"
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(None, header, None, None, values)))
    assert out["header"] == header and out["state"]["version"] is None
    for name in ("metrics", "series", "distribution", "heatmap"):
        figure = json.loads(out[name].plot)
        assert not figure["data"], name
        texts = [a["text"] for a in figure["layout"]["annotations"]]
        assert texts == ["No run on this page: start one (New run), or attach to one below."], (name, texts)


def test_what_a_refresh_sends_does_not_grow_with_the_run():
    """The page's figures at 100 and at 3,000 recorded steps: of the same bounded size."""
    import dataclasses

    import workbench

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    with exp.watch(histograms=True) as w:
        exp.step()
        record = w.recorder.records()[-1]
    sizes = {}
    for steps in (100, 3000):
        view = RunView(label="x", total=steps)
        for step in range(1, steps + 1):
            view.feed(dataclasses.replace(record, step=step, metrics={"loss": 1.0 / step}))
        page = run_page.draw_page(view, run_page.Controls(kind="activation"))
        sizes[steps] = sum(len(figures.to_json(getattr(page, f))) for f in
                           ("metrics_figure", "sites_figure", "distribution_figure", "heatmap_figure"))
    assert sizes[3000] < 1.5 * sizes[100], sizes


def test_the_last_step_table_keeps_tiny_values_and_a_page_shows_them_to_4_significant_digits(tmp_path):
    # (rounded to 6 decimals, a layer's activations of ~3e-8 read 0 in it)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with torch.no_grad():
        net[0].weight.fill_(1e-8), net[0].bias.zero_()
    with workbench.watch(net, store=tmp_path / "tiny", histograms=False) as w:
        net(torch.ones(2, 4)).sum().backward()
        w.step()
    page = run_page.draw_page(RunView.from_run(load_run(tmp_path / "tiny")), run_page.Controls(kind="activation"))
    [mean] = page.latest.loc[page.latest.site == "0", "mean"]
    assert mean == pytest.approx(4e-8, rel=1e-5)
    styled = run_page.shown_latest(page.latest)
    assert list(styled.data.columns) == run_page.LATEST_COLUMNS  # (the NaN/Inf counts are in the table above it)
    row = next(r for r in styled._compute()._translate(None, None)["body"] if r[1]["display_value"] == "0")
    assert [cell["display_value"] for cell in row if cell["type"] == "td"][2:5] == ["4e-08", "0", "4e-08"]
    sites = pd.DataFrame({"site": ["blocks.0.attn#1"], "step": [3], **{c: [-47.00724] for c in run_page.STATISTICS}})
    [row] = run_page.shown_latest(sites)._compute()._translate(None, None)["body"]
    assert [cell["display_value"] for cell in row if cell["type"] == "td"][:3] == [
        "blocks.<wbr>0.<wbr>attn<wbr>#1", "3", "-47.01"]
    assert run_page.shown_latest(sites.head(0)).columns.tolist() == run_page.LATEST_COLUMNS
    # at most 8 characters: fewer digits where 4 take more (a column of an 800 px window holds it on a line)
    assert [run_page.short_number(v) for v in (-0.000533, -1.2345e-5, 1234567.0, 0.1234567)] == [
        "-0.00053", "-1.2e-05", "1.23e+06", "0.1235"]


def test_a_stored_run_replays_into_the_same_views_once(manager):
    run = finished(manager, steps=4, store="stored", histograms=True)
    cache = stored_runs.ViewCache(manager.root)
    view, stored_run, message = cache.get("stored")
    assert "4 steps stored" in message and view.label == "stored" and view.status == "finished"
    assert cache.get("stored")[0] is view  # read once
    live_page, replayed = run_page.draw_page(run.view), run_page.draw_page(view)
    assert replayed.site_choices == live_page.site_choices and replayed.dist_choices == live_page.dist_choices
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(figures.values(traces(replayed.metrics_figure, name)[0]["y"]),
                                   figures.values(traces(live_page.metrics_figure, name)[0]["y"]), rtol=1e-6)
    np.testing.assert_allclose(figures.values(replayed.heatmap_figure["data"][0]["z"]),
                               figures.values(live_page.heatmap_figure["data"][0]["z"]), rtol=1e-5)
    assert cache.get("../x")[0] is None and "contains '..'" in cache.get("../x")[2]
    # its header says its status and steps once, and what it ran (the line that opened it goes once it is drawn)
    header = stored_runs.stored_header(view, stored_run, stored_runs.stored_interventions(stored_run))
    assert header.count("finished") == 1 and header.count("step 4 of 4") == 1, header
    assert "experiment: `activation_mlp`, model: `MLP`, seed: `0`" in header, header


def test_runs_whose_lines_coincide_are_named_under_the_comparison(manager):
    # (two runs of the same settings and seed drew the same lines: the second hid the first, without a word)
    finished(manager, steps=3, store="same/a", seed=1)
    finished(manager, steps=3, store="same/b", seed=1)
    finished(manager, steps=3, store="same/c", seed=2)
    cache = stored_runs.ViewCache(manager.root)
    message = stored_runs.compare_runs(cache, ["same/a", "same/b", "same/c"], "activation", "std", "layers.0")[4]
    assert ("`same/a` and `same/b` draw identical lines (the same settings and seed?): `same/b`'s line hides "
            "theirs.") in message, message
    assert "same/c` draw" not in message
    assert "identical" not in stored_runs.compare_runs(cache, ["same/a", "same/c"], "activation", "std", None)[4]


def test_two_stored_runs_are_compared_metric_by_metric_and_at_one_site(manager):
    finished(manager, steps=4, store="cmp/a", seed=1)
    finished(manager, steps=6, store="cmp/b", seed=2)
    cache = stored_runs.ViewCache(manager.root)
    metrics, site, choices, chosen, message = stored_runs.compare_runs(cache, ["cmp/a", "cmp/b"], "grad_output", "norm",
                                                                       "layers.1")
    assert "Comparing `cmp/a`, `cmp/b`" in message and choices == LAYERS and chosen == "layers.1"
    loss = [t for t in metrics["data"] if t["name"] in ("cmp/a", "cmp/b") and t["yaxis"] == "y2"]
    assert [figures.values(t["x"]).tolist() for t in loss] == [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]
    rows = load_run(manager.root.path / "cmp" / "b").to_pandas()
    [b] = [t for t in site["data"] if t["name"] == "cmp/b"]
    assert figures.values(b["y"]).tolist() == pytest.approx(stored(rows, "grad_output", "layers.1", "norm")[1],
                                                            rel=1e-5)
    # no site named: the first run's default; fewer than two runs, or bad values: messages
    assert stored_runs.compare_runs(cache, ["cmp/a", "cmp/b"], "activation", "std", None)[3] in LAYERS
    assert "two or more" in stored_runs.compare_runs(cache, ["cmp/a"], "activation", "std", None)[4]
    assert "kind must be one of" in stored_runs.compare_runs(cache, ["cmp/a", "cmp/b"], "w", "std", None)[4]
    said = stored_runs.compare_runs(cache, ["cmp/a", "/etc"], "activation", "std", None)[4]
    assert "absolute path" in said and "two or more runs that open" in said


def test_a_comparison_of_runs_without_the_same_metrics_or_kinds_names_each_run_and_says_what_lacks(manager):
    """A run that recorded no output gradients beside one that did; metrics that only one run logged."""
    finished(manager, steps=4, store="mix/grads", seed=1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    with workbench.watch(model, gradients=False, store=manager.root.path / "mix" / "none") as w:
        for step in range(3):
            model(torch.randn(4, 3)).sum().backward()
            w.step(reward=float(step), **({"intervention/i1: zero units [0] at 0": 1.0} if step else {}))
    cache = stored_runs.ViewCache(manager.root)
    metrics, site, choices, chosen, message = stored_runs.compare_runs(cache, ["mix/none", "mix/grads"], "grad_output",
                                                                       "norm", None)
    assert choices == LAYERS and chosen in LAYERS and [t["name"] for t in site["data"]] == ["mix/grads"]
    assert site["layout"]["showlegend"] is True  # (the one line names its run: Plotly hides a legend of one)
    assert ("`mix/none` was recorded without grad_output rows (gradients=False): the sites of `mix/grads` are "
            "listed.") in message
    legend = [t["name"] for t in metrics["data"] if t.get("showlegend")]
    assert sorted(legend) == ["mix/grads", "mix/none"]  # (each run once, though they share no metric)
    titles = {a["text"] for a in metrics["layout"]["annotations"]}
    assert "reward" in titles and not any(t.startswith("intervention/") for t in titles)


def test_a_run_named_with_a_dot_is_exported_to_tensorboard(manager, tmp_path):
    # (exp__lr0.001-tensorboard was refused as a file of type '.001-tensorboard')
    finished(manager, steps=2, store="exp/lr0.001")
    paths, message = stored_runs.export_run(manager.root, "exp/lr0.001", "TensorBoard", tmp_path / "out")
    assert "Exported `exp/lr0.001` to TensorBoard" in message, message
    assert [Path(p).name for p in paths] == ["exp__lr0.001-tensorboard.zip"]


@pytest.mark.parametrize("fmt", ["CSV", "Parquet", "TensorBoard"])
def test_a_stored_run_is_exported_for_download(manager, tmp_path, fmt):
    finished(manager, steps=3, store="exp/run", histograms=fmt == "TensorBoard")
    paths, message = stored_runs.export_run(manager.root, "exp/run", fmt, tmp_path / "out")
    assert f"Exported `exp/run` to {fmt}" in message and all(Path(p).parent == tmp_path / "out" for p in paths)
    rows = load_run(manager.root.path / "exp" / "run").to_pandas()
    if fmt == "TensorBoard":
        [archive] = paths
        assert archive.endswith("exp__run-tensorboard.zip")
        assert any("tfevents" in n for n in zipfile.ZipFile(archive).namelist())
    else:
        read = pd.read_csv if fmt == "CSV" else pd.read_parquet
        assert [Path(p).name for p in paths] == [f"exp__run-{w}.{fmt.lower()}" for w in ("rows", "metrics")]
        assert len(read(paths[0])) == len(rows) and list(read(paths[1]).step) == [1, 2, 3]
    paths, message = stored_runs.export_run(manager.root, "exp/run", "XLS", tmp_path / "no")
    assert paths == [] and "format must be one of CSV, Parquet, TensorBoard, got 'XLS'" in message
    assert not (tmp_path / "no").exists()


def test_runs_compared_keep_their_colours_as_others_join_and_leave(manager):
    for name, seed in (("keep/a", 1), ("keep/b", 2), ("keep/c", 3)):
        finished(manager, steps=3, store=name, seed=seed)
    cache = stored_runs.ViewCache(manager.root)

    def drawn(picks, colors=None):
        metrics, site, *_ = stored_runs.compare_runs(cache, picks, "grad_output", "norm", "layers.1", colors=colors)
        in_site = {t["name"]: t["line"]["color"] for t in site["data"]}
        in_metrics = {t["name"]: t["line"]["color"] for t in metrics["data"] if t.get("showlegend")}
        assert in_site == in_metrics  # (a run is one colour in both figures)
        return in_site

    first = drawn(["keep/a", "keep/b", "keep/c"])
    assert len(set(first.values())) == 3
    # keep/a taken out: keep/b and keep/c stay as they were drawn (by their order alone they moved up)
    fewer = drawn(["keep/b", "keep/c"], colors=first)
    assert fewer == {"keep/b": first["keep/b"], "keep/c": first["keep/c"]}
    # keep/a back: a colour neither of the others has
    again = drawn(["keep/b", "keep/c", "keep/a"], colors=fewer)
    assert again["keep/b"] == first["keep/b"] and again["keep/c"] == first["keep/c"]
    assert len(set(again.values())) == 3
    # (the colours of a first drawing: in the runs' order, as before)
    assert figures.steady_colors(["x", "y"]) == {"x": "#1f77b4", "y": "#ff7f0e"}


def paced_run(n_steps: int):
    """A view to feed, an iterator of ``n_steps`` recorded steps of a small MLP (histograms on) and the run page's
    control values, for the tests of how ticks pace the views."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8, depth=2, batch_size=16, n_samples=64)
    with exp.watch(histograms=True) as w:
        exp.run(n_steps, progress=False)
        records = w.recorder.records()
    values = ([], 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True)
    return RunView(label="paced", total=100), iter(records), values


def test_a_tick_sends_the_views_in_view_the_heavy_ones_at_a_slower_pace_and_all_once_the_run_ends():
    import gradio as gr

    view, steps, values = paced_run(run_page.HEAVY_TICKS + 4)
    state = None

    sent = {}

    def skipped(update):
        return isinstance(update, dict) and update == gr.skip()

    def tick(in_view, new_step=True):
        nonlocal state
        if new_step:
            view.feed(next(steps))
        state, *updates = run_page.redraw(view, "h", "r1", state, values, force=False, in_view=in_view)
        out = {name: update for name, update in zip(run_page.VIEW_OUTPUTS, updates) if not skipped(update)}
        sent.update(out)
        return set(out) & set(run_page.PACED)

    assert tick({"metrics"}) == {"metrics", "latest"}  # (the other plots are out of view: not drawn)
    assert tick(set(run_page.PACED)) == set(run_page.IN_VIEW_ONLY)  # scrolled to: each drawn at once
    for i in range(run_page.HEAVY_TICKS - 1):  # then the metrics each tick, the heavy views every HEAVY_TICKS
        assert tick(set(run_page.PACED)) == {"metrics"} | ({"latest"} if i == run_page.HEAVY_TICKS - 2 else set())
    assert tick(set(run_page.PACED)) == set(run_page.IN_VIEW_ONLY)
    assert tick(set(run_page.PACED), new_step=False) == set()  # (nothing new: nothing sent)
    assert tick(set(run_page.PACED)) == {"metrics"}
    # the run ended: every view behind is drawn at its last step, in view or not (no tick may follow)
    view.set_status("finished")
    assert tick(set(), new_step=False) == set(run_page.PACED)
    [heat] = traces(json.loads(sent["heatmap"].plot))
    assert figures.values(heat["x"]).tolist()[-1] == view.last_step == run_page.HEAVY_TICKS + 3  # (steps fed)
    assert tick(set(), new_step=False) == set()
    # a control changed: every view drawn, in view or not
    state, *updates = run_page.redraw(view, "h", "r1", state, values, in_view=set())
    assert not any(skipped(u) for name, u in zip(run_page.VIEW_OUTPUTS, updates) if name in run_page.PACED[:4])


def test_a_plot_that_shows_no_rows_yet_is_drawn_at_the_first_tick_with_rows_in_view_or_not():
    # (held back while out of view, the heatmap drawn before the first step read "No grad_output rows yet." on a
    # run that had rows until the page was scrolled to it and a tick came)
    import gradio as gr

    from workbench.instrument.recorder import StepRecord

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8, depth=2, batch_size=16, n_samples=64)
    with exp.watch(histograms=True) as w:
        exp.run(2, progress=False)
        records = w.recorder.records()
    view = RunView(label="starting", total=100)
    values = ([], 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True)

    def draw(state, in_view=None, force=False):
        state, *updates = run_page.redraw(view, "h", "r1", state, values, force=force, in_view=in_view)
        return state, {name: update for name, update in zip(run_page.VIEW_OUTPUTS, updates)
                       if name in run_page.IN_VIEW_ONLY and update != gr.skip()}

    state, sent = draw(None, force=True)  # the page's first drawing, before the run's first step
    heat = json.loads(sent["heatmap"].plot)
    assert not heat["data"] and heat["layout"]["annotations"][0]["text"] == "No grad_output rows yet."
    # a step with no rows: the plots that said "yet" say so of the steps recorded, once (out of view too)
    view.feed(StepRecord(step=1, metrics={"loss": 1.0}))
    state, sent = draw(state, in_view={"metrics"})
    assert set(sent) == set(run_page.IN_VIEW_ONLY)
    said = json.loads(sent["heatmap"].plot)["layout"]["annotations"][0]["text"]
    assert said == "No grad_output rows in the steps recorded so far."
    view.feed(StepRecord(step=2, metrics={"loss": 1.0}))  # another: nothing new to say in the others
    state, sent = draw(state, in_view={"metrics"})
    assert set(sent) == {"metrics"}
    view.feed(dataclasses.replace(records[0], step=3))  # rows: the plots that said there were none drawn at
    state, sent = draw(state, in_view={"metrics"})      # once, out of view too
    assert set(sent) == set(run_page.IN_VIEW_ONLY)
    assert traces(json.loads(sent["heatmap"].plot))
    view.feed(dataclasses.replace(records[1], step=4))  # and paced again from then on: out of view, held back
    state, sent = draw(state, in_view={"metrics"})
    assert set(sent) == {"metrics"}


def test_metric_panels_share_one_range_of_steps_a_sparse_metric_is_not_a_lone_dot_on_its_own():
    import dataclasses

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8, depth=2, batch_size=16, n_samples=64)
    with exp.watch() as w:
        exp.run(1, progress=False)
        record = w.recorder.records()[-1]
    view = RunView(label="sparse")
    for step in range(1, 31):  # a loss each step, a reward evaluated at step 10 alone
        metrics = {"loss": 1.0 / step, **({"reward": 0.5} if step == 10 else {})}
        view.feed(dataclasses.replace(record, step=step, metrics=metrics))
    layout = run_page.draw_page(view).metrics_figure["layout"]
    axes = sorted(k for k in layout if k.startswith("xaxis"))
    assert len(axes) == 2
    # the panels after the first follow its axis (one autorange over every panel's steps, zoomed together)
    assert "matches" not in layout["xaxis"] and all(layout[a]["matches"] == "x" for a in axes[1:])


@pytest.mark.parametrize("status, pace", [("running", "| 50.0 steps/s"), ("stopping", "| 50.0 steps/s"),
                                          ("paused", "ran at 50.0 steps/s"), ("stopped", "ran at 50.0 steps/s"),
                                          ("finished", "ran at 50.0 steps/s")])
def test_the_header_of_a_run_that_does_not_train_now_says_its_pace_was_while_it_ran(status, pace):
    # (a paused run's header read "336.3 steps/s", as if it still went at that pace)
    from workbench.instrument import StepRecord

    view = RunView(total=1000)
    view.feed([StepRecord(s, time=1000.0 + s / 50) for s in range(1, 31)])  # 50 steps a second
    view.set_status(status)
    header = re.sub(r"<[^>]+>", "", figures.header_markdown(view)).replace(" · ", " | ")  # (its text)
    assert pace in header, header


def test_a_narrow_header_breaks_between_its_parts_never_inside_one():
    # (a dashboard in a narrow notebook read "step 124" | "of 1000000" and "33.0" | "steps/s", and a
    # progress bar on one line, its percentage on the next)
    from workbench.instrument import StepRecord

    view = RunView(label="mlp", total=1000)
    view.feed([StepRecord(s, time=1000.0 + s / 50) for s in range(1, 31)])
    view.set_status("running")
    header = figures.header_markdown(view)
    unbroken = r"<span style='white-space:nowrap'>(.*?)</span>"
    parts = re.findall(unbroken, header)
    assert parts[0] == "`running`" and parts[1].startswith("step 30 of 1000 <progress") and parts[1].endswith(" 3%")
    assert parts[2:] == ["50.0 steps/s", "about 19 s left"]
    assert re.sub(unbroken, "", header) == "**mlp** ·  ·  ·  · "  # (the label, and the breaks between the parts)


def test_every_picker_of_a_run_or_a_call_site_carries_the_pick_class(tmp_path):
    # (PICK's CSS ends a long name in an ellipsis before the arrow: a picker without it ran the name under it)
    import gradio as gr

    from workbench.ui import run_tabs
    from workbench.ui.app import build_app

    app = build_app(runs_root=tmp_path / "runs")
    try:
        pickers = {block.elem_id: block.elem_classes or [] for block in app.blocks.values()
                   if isinstance(block, gr.Dropdown) and (re.search(r"\bruns?\b|\bsites?\b", block.label or "")
                                                          or block.elem_id == "iv-on")}  # (interventions at a site)
    finally:
        app.run_manager.close()
    assert {"live-pick", "run-path", "compare-runs", "compare-site", "live-sites", "replay-dist-site", "iv-site",
            "iv-on", "explorer-run", "explorer-site"} <= set(pickers), sorted(pickers)
    assert [name for name, classes in pickers.items() if run_tabs.PICK not in classes] == []
    assert f".{run_tabs.PICK} input {{ text-overflow: ellipsis;" in app.workbench_css


def empty_text(figure):
    return figure["layout"]["annotations"][0]["text"]


def test_a_kind_the_run_is_not_recorded_with_says_so_live_and_stored_not_that_its_rows_are_yet_to_come(manager):
    # the form's "record" without output gradients; no run of the app records updates (watch's updates=False)
    run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), 0, 100_000, 1, False, "*", "r",
                                      record=["activations", "parameters"])
    assert run is not None, message
    try:
        live = run_page.draw_page(run.view, run_page.Controls(kind="grad_output"))
        assert empty_text(live.sites_figure) == live.site_note == (
            "No grad_output rows: this run is recorded without them (gradients=False).")
        live = run_page.draw_page(run.view, run_page.Controls(kind="update"))
        assert empty_text(live.distribution_figure) == (
            "No update rows: this run is recorded without them (updates=False).")
    finally:
        run.stop()
        run.join(120)
    view = RunView.from_run(load_run(manager.root.path / "r"))  # replayed: what its metadata says
    page = run_page.draw_page(view, run_page.Controls(kind="grad_output", heat_kind="update"))
    assert empty_text(page.sites_figure) == "No grad_output rows: this run was recorded without them (gradients=False)."
    assert "No update rows in this run" in page.heatmap_figure["layout"]["title"]["text"]  # (another kind drawn)
    # a kind the run records that has no rows: it recorded none once ended, else they are yet to come
    assert run_page.draw_page(view, run_page.Controls(kind="activation")).sites_figure["data"]
    empty = RunView()
    assert empty_text(run_page.draw_page(empty, run_page.Controls(kind="param")).sites_figure) == "No param rows yet."
    empty.set_status("stopped")  # (before its first step)
    assert empty_text(run_page.draw_page(empty, run_page.Controls(kind="param")).sites_figure) == (
        "This run ended before its first recorded step: it holds no rows and no metrics.")


def test_the_per_site_figure_is_log_scaled_where_a_line_dwarfs_the_others_until_the_user_sets_its_box(tmp_path):
    """A module returning hashes (std about 5e18) flattened every other line of the figure at zero unless
    log y was ticked: the figure chooses its scale while the box is left alone, and the box says which."""
    import gradio as gr

    workbench.experiments.create("query_stream", seed=0, key_space=2000, batch_size=64).start(
        3, store=tmp_path / "q").join()
    view = RunView.from_run(load_run(tmp_path / "q"))
    values = [[], 0.0, False, "activation", "std", [], False, None, "grad_output", "norm", True]
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "q", None, values)))
    assert "aggregator" in out["sites"].value and "hash_to_int" in out["sites"].value
    assert json.loads(out["series"].plot)["layout"]["yaxis"]["type"] == "log" and out["log_sites"] is True
    state, values[run_page.CONTROLS.index("log_sites")] = out["state"], True
    again = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "q", state, values)))
    assert again["log_sites"] == gr.skip()  # (sent once: the box says it already)
    # the user unticks it: linear from then on, the box theirs
    values[run_page.CONTROLS.index("log_sites")] = False
    mine = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(
        view, "h", "q", state, values, change={"auto_log_sites": False})))
    assert json.loads(mine["series"].plot)["layout"]["yaxis"]["type"] == "linear" and mine["log_sites"] == gr.skip()
    # another statistic: the figure's to choose again; a mean (hashes of either sign) has no log scale
    values[run_page.CONTROLS.index("stat")] = "mean"
    mean = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(
        view, "h", "q", mine["state"], values, change={"auto_log_sites": True})))
    assert json.loads(mean["series"].plot)["layout"]["yaxis"]["type"] == "linear" and mean["log_sites"] is False
    # the sites without the hashes, of sizes alike: linear
    plain = figures.sites_figure(view, "activation", "std", ["(model) out.observation", "(model) out.action"], None)
    assert plain["layout"]["yaxis"]["type"] == "linear"


@pytest.mark.parametrize("values, log", [([5e18, 4e2, 1.0], True), ([5e18, 4e2, 0.0], False),
                                         ([3.0, 1.0, 0.01], False), ([-5e18, 1.0, 2.0], False)])
def test_a_line_dwarfs_the_others_when_a_log_y_would_show_them_all(values, log):
    frame = pd.DataFrame({"site": ["a", "a", "b", "b", "c", "c"], "value": np.repeat(values, 2)})
    assert figures.dwarfed(frame) is log


def test_a_running_forward_only_model_is_not_said_to_have_gradients_yet_to_come(tmp_path):
    """query_stream's QueryModule is run forward only: its live page said "No grad_output rows yet." for as
    long as it ran. Its steps so far had none; the text stays the same from step to step (an empty plot is
    sent again only when what it says changes)."""
    workbench.experiments.create("query_stream", seed=0, key_space=2000, batch_size=64).start(
        2, store=tmp_path / "q").join()
    view = RunView.from_run(load_run(tmp_path / "q"))
    view.set_status("running")  # (as while it ran)
    said = "No grad_output rows in the steps recorded so far."
    page = run_page.draw_page(view, run_page.Controls(kind="grad_output", heat_kind="grad_output"))
    assert empty_text(page.sites_figure) == empty_text(page.distribution_figure) == page.site_note == said
    view.set_status("finished")
    page = run_page.draw_page(view, run_page.Controls(kind="grad_output"))
    assert empty_text(page.sites_figure) == "This run recorded no grad_output rows."


def test_a_run_that_ended_before_its_first_step_says_so_not_how_a_watch_is_given_metrics(tmp_path):
    net = torch.nn.Linear(2, 2)
    workbench.watch(net, store=tmp_path / "none").close()  # (an experiment stopped at once, a watch never stepped)
    view = RunView.from_run(load_run(tmp_path / "none"))
    said = "This run ended before its first recorded step: it holds no rows and no metrics."
    assert view.no_metrics() == view.no_rows("activation") == said
    assert said in json.dumps(run_page.draw_page(view).metrics_figure)


@pytest.mark.parametrize("every, start_step", [(10, 1), (3, 7)])
def test_a_run_with_every_n_that_ended_before_any_step_is_not_told_to_record_more_often(tmp_path, every, start_step):
    # (its first step would have been recorded: it read "stopped before its first recorded step (step 1 with
    # every=10) ... record more often (a smaller every=...)", when the run had no step at all)
    net = torch.nn.Linear(2, 2)
    workbench.watch(net, store=tmp_path / "none", every=every, start_step=start_step).close()
    view = RunView.from_run(load_run(tmp_path / "none"))
    assert view.first_recorded_step() is None
    assert view.no_metrics() == view.no_rows("activation") == NOTHING_RECORDED


def test_a_run_stopped_before_its_first_recorded_step_says_which_step_that_was_and_how_to_record(tmp_path):
    # (a resumed experiment watched with every=50, stopped at step 45, read "This run recorded no activation
    # rows.", as if its watch were broken)
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    exp.run(40, progress=False)  # (as resumed from a checkpoint of step 40)
    with exp.watch(store=tmp_path / "resumed", every=50):  # (exp.run would record its last step)
        for _ in range(5):
            exp.step()
    net = torch.nn.Linear(2, 2)
    with workbench.watch(net, store=tmp_path / "silent", every=10, start_step=5) as w:  # (no metrics either)
        for _ in range(3):
            net(torch.ones(1, 2)).sum().backward()
            w.step()
    resumed = RunView.from_run(load_run(tmp_path / "resumed"))
    said = ("This run stopped before its first recorded step (step 51 with every=50): it ended at step 45, with "
            "metrics but no rows. To record steps, record more often (a smaller every=, or w.record_next() before "
            "a step) or run more steps (to step 51 at least).")
    assert resumed.no_rows("activation") == resumed.no_rows("param") == said
    assert empty_text(run_page.draw_page(resumed, run_page.Controls(kind="activation")).sites_figure) == said
    silent = RunView.from_run(load_run(tmp_path / "silent"))
    said = ("This run stopped before its first recorded step (step 11 with every=10): it holds no rows and no "
            "metrics.")
    assert silent.no_rows("activation").startswith(said) and silent.no_metrics().startswith(said)
    assert load_run(tmp_path / "silent").metadata["start_step"] == 5
    # a run that reached its first recorded step says what it said before of the kinds it has no rows of
    with exp.watch(store=tmp_path / "reached", every=50, gradients=False):
        for _ in range(6):
            exp.step()
    reached = RunView.from_run(load_run(tmp_path / "reached"))
    assert reached.before_first_record() is None and reached.sites["activation"]
    assert reached.no_rows("grad_output") == (
        "No grad_output rows: this run was recorded without them (gradients=False).")


def test_a_stored_run_without_metrics_says_it_recorded_none_not_none_yet(tmp_path):
    # (a run recorded by workbench.watch() given no metrics read "No metrics yet." for good, as if some might come)
    net = torch.nn.Linear(2, 2)
    for name in ("a", "b"):
        with workbench.watch(net, store=tmp_path / name) as w:
            net(torch.ones(1, 2)).sum().backward()
            w.step()
    view = RunView.from_run(load_run(tmp_path / "a"))
    said = ("This run recorded no metrics (a watch records the metrics given to w.step(), "
            "e.g. w.step(loss=loss.item())).")
    assert json.dumps(run_page.draw_page(view).metrics_figure).count(said) == 1
    assert said in json.dumps(figures.metrics_figure(view))  # (the Dashboard's)
    views = {name: RunView.from_run(load_run(tmp_path / name)) for name in ("a", "b")}
    assert "None of these runs recorded metrics" in json.dumps(figures.compare_metrics_figure(views))
    assert "No metrics yet." in json.dumps(figures.metrics_figure(RunView()))  # (a run before its first step)


class _TwoBranches(torch.nn.Module):
    """Two call sites side by side, ``big`` and ``small``, of outputs of alike size until ``big`` is scaled."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.big, self.small = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.big(x).sum() + self.small(x).sum()


def test_a_streaming_runs_per_site_scale_is_kept_once_its_lines_settle_not_switched_by_later_steps():
    """A run page chose its per-site scale afresh at each tick: a line that came to dwarf the others while the run
    streamed in switched the figure from linear to log (and back where it stopped), under the user's eyes."""
    net, view = _TwoBranches(), RunView(label="x")
    values = [[], 0.0, False, "activation", "std", ["big", "small"], False, None, "grad_output", "norm", True]
    state, scales, boxes = None, [], []
    with workbench.watch(net) as w:
        for step in range(1, 4 * figures.SCALE_SETTLES_AT):
            if step == figures.SCALE_SETTLES_AT + 1:
                with torch.no_grad():
                    net.big.weight.mul_(1e6)  # (from here its line dwarfs the other)
            net(torch.randn(8, 3, generator=torch.Generator().manual_seed(step))).backward()
            w.step()
            view.feed(w.recorder.records()[-1])
            out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", state, values)))
            state = out["state"]
            scales.append(json.loads(out["series"].plot)["layout"]["yaxis"]["type"])
            boxes.append(out["log_sites"])
    assert scales == ["linear"] * len(scales) and True not in boxes, (scales, boxes)
    # the same lines drawn afresh, as by a page opened now, are log: they dwarf each other by then
    fresh = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", None, values)))
    assert json.loads(fresh["series"].plot)["layout"]["yaxis"]["type"] == "log" and fresh["log_sites"] is True
    # another statistic is the figure's to choose again (the scale kept is the run's, kind's and statistic's)
    values[run_page.CONTROLS.index("stat")] = "abs_mean"
    other = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", state, values,
                                                                        change={"auto_log_sites": True})))
    assert json.loads(other["series"].plot)["layout"]["yaxis"]["type"] == "log"


def test_a_per_site_figures_scale_is_kept_for_its_selection_once_each_line_has_enough_values():
    def figure(points, log):
        line = {"mode": "lines", "y": figures._array(np.arange(1.0, points + 1))}
        band = {"mode": "none", "y": figures._array([1.0])}  # (a min-max band is no line)
        return {"data": [band, line, {**line, "y": figures._array([np.nan] * points)}],  # (a scalar's std)
                "layout": {"yaxis": {"type": "log" if log else "linear"}}}

    settles = figures.SCALE_SETTLES_AT
    assert figures.settled_scale(figure(settles - 1, True)) is None  # (too short: the next steps may change it)
    assert figures.settled_scale(figure(settles, True)) is True
    assert figures.settled_scale(figure(settles, False)) is False
    assert figures.settled_scale(figures.empty_figure("No rows yet.")) is None
    kept = figures.keep_scale(None, ["run", "activation", "std"], figure(settles - 1, True))
    assert kept is None and figures.kept_scale(kept, ["run", "activation", "std"]) is None
    kept = figures.keep_scale(kept, ["run", "activation", "std"], figure(settles, False))
    assert figures.kept_scale(kept, ["run", "activation", "std"]) is False
    # kept through later drawings that would choose otherwise; not another selection's
    assert figures.keep_scale(kept, ["run", "activation", "std"], figure(50, True)) == kept
    assert figures.kept_scale(kept, ["run", "activation", "norm"]) is None
    assert figures.kept_scale(figures.keep_scale(kept, ["run", "activation", "norm"], figure(50, True)),
                              ["run", "activation", "norm"]) is True


def test_a_comparison_draws_its_site_figure_at_the_scale_kept_and_its_metrics_linear(manager):
    finished(manager, steps=4, store="kept/a", seed=1)
    finished(manager, steps=4, store="kept/b", seed=2)
    cache = stored_runs.ViewCache(manager.root)
    for kept in (True, False):
        metrics, site, *_ = stored_runs.compare_runs(cache, ["kept/a", "kept/b"], "grad_output", "norm", "layers.1",
                                                     log_y=None, kept_site_log=kept)
        assert site["layout"]["yaxis"]["type"] == ("log" if kept else "linear")
        assert metrics["layout"]["yaxis"].get("type", "linear") == "linear"


def _streamed(net, view, steps, values, change_at=None, change=None, state=None):
    """Redraw a run page after each of ``steps`` steps of ``net``; ``change()`` runs before step ``change_at``.
    Returns the page state and, per step, the per-site figure's scale and the outputs."""
    scales, outs = [], []
    with workbench.watch(net) as w:
        for step in range(1, steps + 1):
            if step == change_at:
                with torch.no_grad():
                    change()
            net(torch.randn(8, 3, generator=torch.Generator().manual_seed(step))).backward()
            w.step()
            view.feed(w.recorder.records()[-1])
            out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", state, values)))
            state = out["state"]
            scales.append(json.loads(out["series"].plot)["layout"]["yaxis"]["type"])
            outs.append(out)
    return state, scales, outs


def test_a_kept_log_scale_goes_linear_once_a_line_has_a_zero_as_a_fresh_figure_does():
    """A log scale kept once settled stayed log after a site's std fell to 0 (its output constant): the zeros
    vanished from the figure, which a page opened then drew linear."""
    net, view = _TwoBranches(), RunView(label="x")
    values = [[], 0.0, False, "activation", "std", ["big", "small"], False, None, "grad_output", "norm", True]

    def constant_small():
        net.small.weight.zero_()
        net.small.bias.zero_()

    with torch.no_grad():
        net.big.weight.mul_(1e6)  # (its line dwarfs the other's from the first step: the figure settles log)
    settles = figures.SCALE_SETTLES_AT
    _, scales, outs = _streamed(net, view, 3 * settles, values, change_at=2 * settles, change=constant_small)
    assert scales[:2 * settles - 1] == ["log"] * (2 * settles - 1)
    assert scales[2 * settles - 1:] == ["linear"] * (settles + 1), scales
    assert outs[2 * settles - 1]["log_sites"] is False  # (the box says so)
    fresh = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", None, values)))
    assert json.loads(fresh["series"].plot)["layout"]["yaxis"]["type"] == "linear"


def test_sites_the_user_picks_are_the_figures_to_choose_a_scale_for_again():
    """The scale kept for a run's kind and statistic was kept through a pick of other sites: adding a site whose
    line dwarfs the others left them flat at zero on a linear scale."""
    net, view = _TwoBranches(), RunView(label="x")
    with torch.no_grad():
        net.big.weight.mul_(1e6)
    values = [[], 0.0, False, "activation", "std", ["small"], False, None, "grad_output", "norm", True]
    state = {**run_page.new_page_state(), "auto_sites": False}  # (the user picked small alone)
    state, scales, _ = _streamed(net, view, 2 * figures.SCALE_SETTLES_AT, values, state=state)
    assert set(scales) == {"linear"}
    values[run_page.CONTROLS.index("sites")] = ["big", "small"]  # (then picks big too)
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "x", state, values)))
    assert json.loads(out["series"].plot)["layout"]["yaxis"]["type"] == "log" and out["log_sites"] is True


def test_a_comparisons_kept_log_scale_goes_linear_where_a_run_has_a_zero():
    def view_of(constant):
        net, view = _TwoBranches(), RunView(label="x")
        with torch.no_grad():
            net.small.weight.mul_(0.0 if constant else 1e6)  # (0: its output constant, its std 0)
            net.small.bias.mul_(0.0 if constant else 1.0)
        _streamed(net, view, figures.SCALE_SETTLES_AT, [[], 0.0, False, "activation", "std", None, False, None,
                                                        "grad_output", "norm", True])
        return view

    views = {"a": view_of(False), "b": view_of(True)}
    for kept, scale in ((True, "linear"), (False, "linear"), (None, "linear")):
        figure = figures.compare_site_figure(views, "activation", "std", "small", None, kept_log=kept)
        assert figure["layout"]["yaxis"]["type"] == scale, kept
    views["b"] = view_of(False)
    assert figures.compare_site_figure(views, "activation", "std", "small", None,
                                       kept_log=True)["layout"]["yaxis"]["type"] == "log"
    assert figures.compare_site_figure(views, "activation", "std", "small", True)["layout"]["yaxis"]["type"] == "log"


def _spiked_loss_run(path):
    """A run whose loss spikes to 300 at its second step (a learning rate of 1), then falls from 0.5."""
    model = torch.nn.Linear(2, 2)
    with workbench.watch(model, store=path) as w:
        for loss in [2.3, 300.0] + [0.5 * 0.97 ** i for i in range(40)]:
            model(torch.randn(4, 2)).sum().backward()
            w.step(loss=loss, lr=1.0)
    return load_run(path)


def test_a_metrics_panel_flattened_by_a_spike_is_log_scaled_kept_once_settled_until_the_user_sets_the_box(tmp_path):
    # a loss of 300 at step 2, then 0.5 and less: drawn linear, the whole curve after the spike lay flat at zero
    view = RunView.from_run(_spiked_loss_run(tmp_path / "spike"))
    figure = figures.metrics_figure(view, log_y=None)
    assert figure["layout"]["meta"]["metrics"] == ["loss", "lr"]
    assert (figure["layout"]["yaxis"]["type"], figure["layout"]["yaxis2"]["type"]) == ("log", "linear")
    assert figures.metrics_figure(view)["layout"]["yaxis"]["type"] == "linear"  # (asked for: as asked)
    assert figures.keep_scales(None, ["r"], figure) == {"loss": [["r"], True], "lr": [["r"], False]}
    # the run page: each panel chooses until the user ticks or unticks the box, which then holds for every panel
    values = [None, 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True]
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r", None, values)))
    assert json.loads(out["metrics"].plot)["layout"]["yaxis"]["type"] == "log"
    kept = out["state"]["kept_log_metrics"]
    assert figures.kept_scales(kept, [run_page.recording_of("r", view)]) == {"loss": True, "lr": False}
    mine = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r", out["state"], values,
                                                                       change={"auto_log_metrics": False})))
    assert json.loads(mine["metrics"].plot)["layout"]["yaxis"]["type"] == "linear"
    # a metric of values not all positive stays linear (a log y would drop its zeros)
    zeros = pd.DataFrame({"site": [""] * 3, "value": [0.0, 300.0, 0.5]})
    assert not figures.dwarfed(zeros)
    # the Dashboard the same, until its box is set
    from workbench.ui.notebook import Dashboard

    dash = Dashboard(load_run(tmp_path / "spike"))
    assert dash.figure("metrics")["layout"]["yaxis"]["type"] == "log"
    dash.log_y.value = True  # (the user's: every panel log, then every one linear)
    assert [dash.figure("metrics")["layout"][a]["type"] for a in ("yaxis", "yaxis2")] == ["log", "log"]
    dash.log_y.value = False
    assert [dash.figure("metrics")["layout"][a]["type"] for a in ("yaxis", "yaxis2")] == ["linear", "linear"]


def test_a_scale_settles_once_a_line_is_long_enough_though_a_site_began_later():
    # a site whose rows began later (or come rarely) held the settling back until its own line was long: till then
    # the scale the figure chose switched at each tick
    def figure(points_each, log):
        lines = [{"mode": "lines", "y": figures._array(np.arange(1.0, points + 1))} for points in points_each]
        return {"data": lines, "layout": {"yaxis": {"type": "log" if log else "linear"}}}

    settles = figures.SCALE_SETTLES_AT
    assert figures.settled_scale(figure([settles, 1], True)) is True  # (the late site's one point: not waited for)
    assert figures.settled_scale(figure([settles, 1], True), lines=2) is None  # (a comparison: each run's line)
    assert figures.settled_scale(figure([settles, settles], False), lines=2) is False


def _smooth_loss_run(path):
    """A run of as many steps as :func:`_spiked_loss_run`, its loss falling gently (a linear y shows it whole)."""
    model = torch.nn.Linear(2, 2)
    with workbench.watch(model, store=path) as w:
        for loss in [1.0 * 0.99 ** i for i in range(42)]:
            model(torch.randn(4, 2)).sum().backward()
            w.step(loss=loss, lr=1.0)
    return load_run(path)


def test_a_run_recorded_again_at_the_same_path_is_read_anew_and_chooses_its_own_scales(tmp_path):
    """A run recorded again where an old one was (its directory removed, the script run again) started on the old
    run's kept scales at the page's next List runs; with as many steps, the app's cache of stored runs even served
    the old run's views under the new one's name."""
    import shutil

    from workbench.ui.runs import RunsRoot

    cache = stored_runs.ViewCache(RunsRoot(tmp_path))
    _spiked_loss_run(tmp_path / "p")
    old, _, _ = cache.get("p")
    values = [None, 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True]
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(old, "h", "p", None, values)))
    assert json.loads(out["metrics"].plot)["layout"]["yaxis"]["type"] == "log"  # (kept: the spike's)
    shutil.rmtree(tmp_path / "p")
    _smooth_loss_run(tmp_path / "p")
    new, _, _ = cache.get("p")
    assert figures.values(traces(figures.metrics_figure(new), "loss")[0]["y"])[0] == pytest.approx(1.0)
    again = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(new, "h", "p", out["state"], values)))
    assert json.loads(again["metrics"].plot)["layout"]["yaxis"]["type"] == "linear"
    fresh = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(new, "h", "p", None, values)))
    assert json.loads(again["metrics"].plot) == json.loads(fresh["metrics"].plot)


def test_the_metrics_log_y_box_says_what_the_panels_chose_until_the_user_sets_it(tmp_path):
    """The panels chose log y where a spike flattened the rest, while the box beside them stayed unticked: a user
    read the log panel as linear, and a tick drew nothing new."""
    import gradio as gr

    view = RunView.from_run(_spiked_loss_run(tmp_path / "spike"))
    values = [None, 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True]
    box = run_page.CONTROLS.index("log_metrics")
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r", None, values)))
    assert json.loads(out["metrics"].plot)["layout"]["yaxis"]["type"] == "log" and out["log_metrics"] is True
    values[box] = True  # (the box as the page set it: not sent again)
    again = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r", out["state"], values)))
    assert again["log_metrics"] == gr.skip()
    # the user unticks it: every panel linear, the box theirs (not set back)
    values[box] = False
    mine = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(
        view, "h", "r", again["state"], values, change={"auto_log_metrics": False})))
    layout = json.loads(mine["metrics"].plot)["layout"]
    assert (layout["yaxis"]["type"], layout["yaxis2"]["type"]) == ("linear", "linear")
    assert mine["log_metrics"] == gr.skip()
    values[box] = True  # (and ticks it: every panel log)
    ticked = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r", mine["state"], values)))
    layout = json.loads(ticked["metrics"].plot)["layout"]
    assert (layout["yaxis"]["type"], layout["yaxis2"]["type"]) == ("log", "log") and ticked["log_metrics"] == gr.skip()
    # panels that all chose linear: the box says so
    smooth = RunView.from_run(_smooth_loss_run(tmp_path / "smooth"))
    values[box] = True
    plain = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(smooth, "h", "s", None, values)))
    assert json.loads(plain["metrics"].plot)["layout"]["yaxis"]["type"] == "linear" and plain["log_metrics"] is False


def test_a_comparisons_metrics_panels_choose_their_scale_as_a_run_pages_do_and_the_box_says_so(tmp_path):
    """The Runs tab's comparison drew its metrics linear until the box was ticked (a loss spike flattened every
    run's curve at zero), where a run page's panels choose: the same mechanism now, kept once settled, the box
    ticked while a figure is drawn log, and a run recorded again at its path choosing anew."""
    import shutil

    from workbench.ui.runs import RunsRoot

    _spiked_loss_run(tmp_path / "a")
    _spiked_loss_run(tmp_path / "b")
    cache = stored_runs.ViewCache(RunsRoot(tmp_path))
    metrics, site_fig, _, site, _, colors, boxes, auto, kept = stored_runs.compare_page(
        cache, ["a", "b"], "activation", "norm", None, (False, False), None, (True, True), None)
    assert (metrics["layout"]["yaxis"]["type"], metrics["layout"]["yaxis2"]["type"]) == ("log", "linear")
    assert boxes[0] is True and auto == (True, True)
    # the notebook's Compare the same (its figures are compare_page's), its box saying so
    from workbench.ui.notebook import Compare

    compare = Compare(tmp_path / "a", tmp_path / "b", kind="activation", statistic="norm")
    assert compare.figure("metrics")["layout"]["yaxis"]["type"] == "log" and compare.log_y.value is True
    compare.log_y.value = False
    assert compare.figure("metrics")["layout"]["yaxis"]["type"] == "linear" and compare.log_y.value is False
    compare.close()
    # the user unticks the metrics' box: every panel linear, that box theirs; the call site's figure still chooses
    metrics, site_fig, *_, boxes, auto, kept = stored_runs.compare_page(
        cache, ["a", "b"], "activation", "norm", site, (False, boxes[1]), colors, auto, kept,
        change={"metrics": False})
    assert {metrics["layout"][axis]["type"] for axis in ("yaxis", "yaxis2")} == {"linear"}
    assert boxes == (None, figures.drawn_log(site_fig)) and auto == (False, True)
    # another statistic: the call site's figure chooses again, the metrics' scale stays the user's
    metrics, site_fig, *_, boxes, auto, kept = stored_runs.compare_page(
        cache, ["a", "b"], "activation", "std", site, (False, False), colors, auto, kept, change={"site": True})
    assert boxes == (None, figures.drawn_log(site_fig)) and auto == (False, True)
    assert metrics["layout"]["yaxis"]["type"] == "linear"
    # the metrics choose again; both recorded again, their losses smooth (then List runs): the old runs' kept log
    # is not theirs
    for name in ("a", "b"):
        shutil.rmtree(tmp_path / name)
        _smooth_loss_run(tmp_path / name)
    metrics, *_, boxes, _, _ = stored_runs.compare_page(cache, ["a", "b"], "activation", "std", site, (False, False),
                                                        colors, auto, kept, change={"metrics": True})
    assert metrics["layout"]["yaxis"]["type"] == "linear" and boxes[0] is False


def test_a_comparisons_log_y_box_is_its_own_figures_scale_alone(tmp_path):
    """The Runs tab's comparison had one log y box for its two figures: ticked while either drew log (over a linear
    call-site figure), and a click set both. A box a figure now, as the notebook's Compare (one compare_page)."""
    from workbench.ui.runs import RunsRoot

    _spiked_loss_run(tmp_path / "a")
    _spiked_loss_run(tmp_path / "b")
    cache = stored_runs.ViewCache(RunsRoot(tmp_path))
    drawn = stored_runs.compare_page(cache, ["a", "b"], "activation", "norm", None, (False, False), None,
                                     (True, True), None)
    metrics, site_fig, site, boxes, auto, kept = (drawn[0], drawn[1], drawn[3], *drawn[6:])
    assert boxes == (figures.drawn_log(metrics), figures.drawn_log(site_fig)) and boxes[0] is True
    # the call site's box set to log: its figure log, the metrics panels as they chose, their box as it was
    metrics, site_fig, *_, boxes, auto, kept = stored_runs.compare_page(
        cache, ["a", "b"], "activation", "norm", site, (True, True), None, auto, kept, change={"site": False})
    assert site_fig["layout"]["yaxis"]["type"] == "log" and auto == (True, False)
    assert (metrics["layout"]["yaxis"]["type"], metrics["layout"]["yaxis2"]["type"]) == ("log", "linear")
    assert boxes == (True, None)
    # the call site's box unticked: its figure linear; the metrics' box ticked: every panel log, the site untouched
    metrics, site_fig, *_, boxes, auto, kept = stored_runs.compare_page(
        cache, ["a", "b"], "activation", "norm", site, (True, False), None, auto, kept, change={"metrics": False})
    assert site_fig["layout"]["yaxis"]["type"] == "linear" and auto == (False, False) and boxes == (None, None)
    assert {metrics["layout"][axis]["type"] for axis in ("yaxis", "yaxis2")} == {"log"}
    # a pair that is not one: refused, naming it
    with pytest.raises(ValueError, match=r"log_y must be one value or a pair .*\(True, False, True\)"):
        stored_runs.compare_page(cache, ["a", "b"], "activation", "norm", site, (True, False, True), None, auto, kept)


def test_a_comparisons_kept_site_scale_is_the_site_drawns_whichever_site_was_asked(tmp_path):
    """The Runs tab's comparison looked its kept call-site scale up by the site asked but stored it under the site
    drawn (the same only once the dropdown showed it), where the notebook's Compare keyed both by the site asked (a
    site given before its rows came kept the scale of the site drawn in its place). One rule now: the site drawn."""
    from workbench.ui.runs import RunsRoot

    _spiked_loss_run(tmp_path / "a")
    _spiked_loss_run(tmp_path / "b")
    cache = stored_runs.ViewCache(RunsRoot(tmp_path))
    recordings = [[name, cache.get(name)[0].started] for name in ("a", "b")]
    for asked in (None, "no-such-site"):  # (an empty dropdown, the first drawing; a site these runs lack)
        _, site_fig, choices, drawn, *_, kept = stored_runs.compare_page(
            cache, ["a", "b"], "activation", "norm", asked, (False, False), None, (True, True), None)
        assert drawn in choices and drawn != asked
        chose = figures.kept_scale(kept["site"], [recordings, "activation", "norm", drawn])
        assert chose is not None and figures.drawn_log(site_fig) == chose
        # a scale kept for the site drawn (here the other one, as a run's later steps would have it) is the one
        # drawn when that site is drawn again, whichever site was asked
        other = {**kept, "site": [kept["site"][0], not chose]}
        for again_asked in (asked, drawn):
            _, again, *_ = stored_runs.compare_page(cache, ["a", "b"], "activation", "norm", again_asked,
                                                    (False, False), None, (True, True), other)
            assert figures.drawn_log(again) == (not chose), again_asked


def test_a_picker_is_sent_with_the_plot_it_picks_for_never_while_that_plot_is_held_back():
    # (live, the per-site chips named the sites that changed most at the latest step while the figure, held back
    # out of view or between its paced ticks, still drew the lines of an earlier pick: chips and legend disagreed)
    import gradio as gr

    view, steps, values = paced_run(run_page.HEAVY_TICKS + 3)
    picks = {"metric_names": "metrics", "sites": "series", "site_note": "series", "dist_site": "distribution",
             "dist_note": "distribution"}
    state, shown = None, {}
    for in_view in [{"metrics"}, {"metrics"}, set(run_page.PACED), *[set(run_page.PACED)] * run_page.HEAVY_TICKS]:
        view.feed(next(steps))
        state, *updates = run_page.redraw(view, "h", "r1", state, values, force=False, in_view=in_view)
        sent = {name: update for name, update in zip(run_page.VIEW_OUTPUTS, updates)
                if not (isinstance(update, dict) and update == gr.skip())}
        for picker, plot in picks.items():
            assert picker not in sent or plot in sent, (picker, in_view)
        shown.update(sent)
        # what the page shows: the chips are the lines drawn, the histogram picker the site the distribution draws
        lines = [t["name"] for t in json.loads(shown["series"].plot)["data"]] if "series" in shown else []
        assert lines == [value for value, _ in shown["sites"].choices if value in shown["sites"].value] \
            if "sites" in shown else not lines
        if "dist_site" in shown:
            title = json.loads(shown["distribution"].plot)["layout"]["title"]["text"]
            assert f" at {shown['dist_site'].value}:" in title


def test_the_last_step_table_names_the_section_whose_kind_it_shows_not_the_heatmaps_above_it(tmp_path):
    # (it read "the kind above", under the heatmap and its own kind picker (grad_output by default), while it
    # showed the kind picked under "Statistic per call site" (activation))
    import gradio as gr

    from workbench.ui.app import build_app

    app = build_app(tmp_path / "runs")
    blocks = list(app.blocks.values())
    headings = [b.value for b in blocks if isinstance(b, gr.Markdown) and isinstance(b.value, str)]
    assert any("Statistic per call site" in h for h in headings)
    tables = [b for b in blocks if isinstance(b, gr.Dataframe) and (b.elem_id or "").endswith("-latest")]
    assert len(tables) >= 2  # (the live run page's and the stored run's)
    for table in tables:
        assert "Statistic per call site" in table.label and "above" not in table.label, table.label
    # and it shows that kind's rows whichever kind the heatmap draws
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8, depth=2, batch_size=16, n_samples=64)
    with exp.watch() as w:
        exp.run(2, progress=False)
        records = w.recorder.records()
    view = RunView(label="kinds")
    for record in records:
        view.feed(record)
    values = ([], 0.0, False, "param", "std", None, False, None, "grad_output", "norm", True)
    out = dict(zip(["state", *run_page.VIEW_OUTPUTS], run_page.redraw(view, "h", "r1", None, values)))
    latest = getattr(out["latest"], "data", out["latest"])  # (a Styler: its DataFrame)
    assert set(latest["site"]) == set(view.site_order("param"))


def test_a_run_whose_statistics_pass_float32s_range_loads_and_draws_them_as_inf(tmp_path):
    """A float64 model's activations of 4e39: the views keep float32, where they are inf; loading and drawing
    the run raised "overflow encountered in cast" (an error under the tests' warnings filter). (The history's
    averages leave out values that are not finite, as they do a float32 model's inf: the table and the metric's
    line show a gap.)"""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4)).double()
    with torch.no_grad():
        net[0].weight.fill_(1e39), net[0].bias.zero_()
    with workbench.watch(net, store=tmp_path / "big") as w:
        net(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        w.log(huge=1e300)
        w.step()
    view = RunView.from_run(load_run(tmp_path / "big"))
    page = run_page.draw_page(view, run_page.Controls(kind="activation", heat_kind="activation"))
    assert page.latest.site.tolist() == ["0"]
    [huge] = page.metrics_figure["data"]
    assert huge["name"] == "huge" and not np.isfinite(figures.values(huge["y"])).any()
