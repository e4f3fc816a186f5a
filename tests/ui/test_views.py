"""The view layer: bounded histories, readable call sites, and views that hold what was recorded."""

import copy
import html
import re
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument import StepRecord
from workbench.instrument.schema import SUMS
from workbench.ui import figures, run_page, views
from workbench.ui.views import PERCENTILES, History, RunView


def test_a_history_stays_bounded_and_keeps_an_even_sample_with_its_envelope():
    values = np.random.default_rng(0).normal(size=10_000)
    history = History(capacity=256, recent=64)
    for step, value in enumerate(values, 1):
        history.append(step, [value])
        assert len(history) <= 256
    assert history.steps[-64:] == list(range(10_000 - 63, 10_001))  # the recent steps kept whole
    np.testing.assert_allclose(history.last(), [values[-1]], rtol=1e-6)  # (float32)
    steps, mean, lo, hi = history.arrays()
    # drawn spread evenly from the start, the recent steps too: a bucket of the stride each, the newest
    # up to the last step (32 whole steps at the end would read as a burst of noise)
    assert 1 < history.stride < 10_000 / 32 and steps[-1] == 10_000
    np.testing.assert_array_equal(steps[:-1], history.stride * np.arange(1, len(steps)))
    start = 0
    for i, end in enumerate(steps):  # each point: the mean, min and max of the steps it covers
        covered = values[start:end]
        assert mean[i, 0] == pytest.approx(covered.mean(), abs=1e-5)
        assert lo[i, 0] == pytest.approx(covered.min()) and hi[i, 0] == pytest.approx(covered.max())
        start = end


def test_a_history_draws_in_wider_buckets_the_means_of_every_value_in_them():
    values = np.random.default_rng(1).normal(size=3_000)
    history = History(capacity=64, recent=8)
    history.extend(np.arange(1, 3_001), values[:, None])
    wide = 4 * history.stride
    steps, mean, lo, hi = history.arrays(wide)
    buckets = np.arange(3_000) // wide  # (step - 1) // wide
    assert list(steps) == [int(np.flatnonzero(buckets == b)[-1]) + 1 for b in np.unique(buckets)]
    for i, b in enumerate(np.unique(buckets)):  # every value merged into the bucket, not a mean of means
        covered = values[buckets == b]
        assert mean[i, 0] == pytest.approx(covered.mean(), abs=1e-5)
        assert (lo[i, 0], hi[i, 0]) == pytest.approx((covered.min(), covered.max()))
    assert len(history.arrays(history.stride_within(10))[0]) <= 10 < len(history.arrays()[0])
    with pytest.raises(ValueError, match="stride must be a power of two .*, got 3"):
        history.arrays(3)
    # a stride finer than the history's own (asked before it thinned further) draws at its own
    np.testing.assert_array_equal(history.arrays(1)[0], history.arrays()[0])


def test_a_long_run_draws_its_sites_finely_and_its_heatmap_in_bounded_steps():
    """3,000 steps: each site's line keeps a point every few dozen steps (a coarse one hid a spike between
    two points); the heatmap, a cell per site and step, at most HEAT_STEPS steps, each the mean of its bucket."""
    def record(step):  # four values, each the step: its mean is the step
        sums = dict(sum=4.0 * step, sum_sq=4.0 * step**2, abs_sum=4.0 * step, min=step, max=step, nonzero=4)
        return StepRecord(step, keys=(("layer", 0, "activation", "out", (4,)),), numel=np.array([4]),
                          sums=np.array([[sums.get(name, 0.0) for name in SUMS]]))

    view = RunView()
    view.feed([record(s) for s in range(1, 3_001)])
    series = view.site_series("activation", "mean", ["layer"])
    assert 75 <= len(series) <= 150 and series.step.iloc[-1] == 3_000
    names, steps, matrix, stride = view.heatmap("activation", "mean", figures.HEAT_STEPS)
    assert names == ["layer"] and len(steps) <= figures.HEAT_STEPS and steps[-1] == 3_000 and stride > 1
    starts = np.r_[0, steps[:-1]]  # each cell: the mean of the steps of its bucket, start + 1 .. step
    np.testing.assert_allclose(matrix[0], (starts + 1 + steps) / 2, rtol=1e-6)
    fig = figures.heatmap_figure(view, "activation", "mean", log=False)
    assert len(figures.values(fig["data"][0]["x"])) == len(steps)
    assert f"a cell the mean of {stride} steps" in fig["layout"]["title"]["text"]
    assert f"the {stride} steps to %{{x}}" in fig["data"][0]["hovertemplate"]
    with pytest.raises(ValueError, match="max_steps must be a whole number >= 1 .*, got 0"):
        view.heatmap("activation", "mean", 0)


def test_a_history_of_other_values_keeps_the_last_of_each_bucket():
    history = History(capacity=16, recent=4, merge="last")
    for step in range(1, 101):
        history.append(step, f"h{step}")
    assert len(history) <= 16 and history.values()[-4:] == ["h97", "h98", "h99", "h100"]
    assert all(value == f"h{step}" for step, value in zip(history.steps, history.values()))


class Twice(nn.Module):
    """A shared activation called twice, and a container whose output is its last child's."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.head = nn.Linear(8, 8)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.head(self.act(self.inner(x))))


def watched(model, steps, **options):
    view = RunView(label="test", total=steps)
    torch.manual_seed(0)
    with workbench.watch(model, **options) as w:
        w.subscribe(view.feed)
        for step in range(steps):
            out = model(torch.randn(16, 4))
            out.square().mean().backward()
            w.step(loss=out.square().mean().item(), lr=0.1)
        w.recorder.flush()
    return view, w


def test_sites_are_named_readably_and_aliases_are_merged():
    view, w = watched(Twice(), 3)
    table = view.site_table("activation").set_index("name")
    # 'inner' returns its last child's tensor: one site, named by the child, the container an alias
    assert table.loc["inner.1", "aliases"] == "inner"
    # the shared activation is called twice: '#k'; a module called once has no index
    assert {"act#0", "act#1", "inner.0", "head"} <= set(table.index)
    # the model returns act's second output: an alias of act#1
    assert "(model)" in table.loc["act#1", "aliases"]
    # every row of the recorder is in a view, under its site or as an alias of one
    rows = w.to_pandas()
    assert len(view.site_table("activation")) + sum(len(a.split(", ")) for a in table.aliases if a) == \
        rows[(rows.kind == "activation") & (rows.step == 1)].shape[0]


def test_site_series_hold_the_recorded_statistics():
    view, w = watched(Twice(), 5)
    rows = w.to_pandas()
    series = view.site_series("grad_output", "norm", sites=["head", "inner.0"])
    for site in ("head", "inner.0"):
        want = rows[(rows.kind == "grad_output") & (rows.module == site)].sort_values("step")
        got = series[series.site == site]
        assert got.step.tolist() == want.step.tolist()
        np.testing.assert_allclose(got.value, want.norm, rtol=1e-6)
    with pytest.raises(ValueError, match="no grad_output call site named 'nope'"):
        view.site_series("grad_output", "norm", sites=["nope"])
    with pytest.raises(ValueError, match="statistic must be one of"):
        view.site_series("grad_output", "median")


def test_the_default_sites_are_those_that_changed_most():
    view = RunView()
    keys = tuple(("layer", i, "activation", "out", (4,)) for i in range(30))
    for step in range(1, 11):
        sums = np.zeros((30, len(SUMS)))
        sums[:, 0] = 4.0 + np.arange(30) * 1e-3  # a mean of about 1 everywhere ...
        sums[7, 0] = 4.0 * (step + 1)  # ... but two sites that grow
        sums[21, 0] = -8.0 * (step + 1)
        sums[:, 3], sums[:, 4], sums[:, 5] = -1, 1, 4
        view.feed(StepRecord(step, keys, np.full(30, 4), sums))
    assert view.default_sites("activation", "mean", k=2) == ["layer#21", "layer#7"]
    assert len(view.site_table("activation")) == 30  # (distinct statistics: no aliases)


def test_the_default_sites_take_one_call_of_each_module_first():
    # an unrolled module's calls change alike and would hide each other: the other module comes second
    view = RunView()
    keys = tuple(("cell", i, "activation", "out", (4,)) for i in range(5)) + (("head", 0, "activation", "out", (4,)),)
    for step in range(1, 11):
        sums = np.zeros((6, len(SUMS)))
        sums[:5, 0] = 4.0 * (step + 1) * (1 + np.arange(5) / 10)  # every call grows ...
        sums[5, 0] = 4.0 + step * 0.4  # ... more than the head does
        sums[:, 3], sums[:, 4], sums[:, 5] = -1, 1, 4
        view.feed(StepRecord(step, keys, np.full(6, 4), sums))
    first, second, _ = view.default_sites("activation", "mean", k=3)
    assert first.startswith("cell#") and second == "head"
    assert len(view.default_sites("activation", "mean", k=6)) == 6  # (then the other calls)


def test_the_heatmap_lists_every_site_in_forward_order():
    view, w = watched(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), 4)
    names, steps, values, _ = view.heatmap("grad_output", "norm")
    assert names == ["0", "1", "2"] and steps.tolist() == [1, 2, 3, 4]  # ((model) is an alias of '2')
    rows = w.to_pandas()
    want = rows[(rows.kind == "grad_output") & (rows.module == "0")].norm.to_numpy()
    np.testing.assert_allclose(values[0], want, rtol=1e-6)


class _ManySites:
    """A stand-in view whose heatmap has ``rows`` call sites (an unrolled network has a hundred and more)."""

    def __init__(self, rows):
        self.names = [f"resblocks.0.conv{i % 3}.0#{i // 3}" for i in range(rows)]

    def heatmap(self, kind, statistic, max_steps=None):
        return self.names, np.arange(1, 4), np.ones((len(self.names), 3)), 1


@pytest.mark.parametrize("rows", [3, 111, 400])
def test_the_heatmap_gives_each_label_room_to_read_however_many_sites(rows):
    view = _ManySites(rows)
    fig = figures.heatmap_figure(view, "grad_output", "norm")
    layout, yaxis = fig["layout"], fig["layout"]["yaxis"]
    assert fig["data"][0]["y"] == view.names  # every site drawn (its hover names it)
    labelled = yaxis.get("tickvals", view.names)
    assert labelled[0] == view.names[0] and set(labelled) <= set(view.names)
    assert yaxis.get("ticktext", labelled) == labelled  # (each label its site's whole name)
    # the rows' height over the labels shown: a readable font, and labels that do not overlap
    drawn = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
    assert yaxis["tickfont"]["size"] >= 10
    assert drawn / len(labelled) >= 1.3 * yaxis["tickfont"]["size"], (layout["height"], len(labelled))
    assert layout["height"] <= 2400  # (bounded: the rows beyond share the height)


@pytest.mark.parametrize("rows", [3, 40, 117, 400])
def test_a_heatmap_of_many_sites_scrolls_in_a_box_its_steps_and_colours_read_at_its_top(rows):
    """An ILQL agent's 117 activation sites made a heatmap some 1,800 px tall, its steps under the last row and its
    colour bar as tall: a page scrolls it in a box of HEAT_BOX px, and its first screen says what it shows."""
    from workbench.ui.run_tabs import CSS

    fig = figures.heatmap_figure(_ManySites(rows), "grad_output", "norm")
    layout, [heat, *top] = fig["layout"], fig["data"]
    if layout["height"] <= figures.HEAT_BOX:
        assert rows <= 40 and not top and "xaxis2" not in layout and "scroll" not in layout["title"]["text"]
        return
    assert rows > 40 and f"scroll for all {rows} rows" in layout["title"]["text"]
    assert layout["xaxis2"]["side"] == "top" and layout["xaxis2"]["matches"] == "x" and top[0]["xaxis"] == "x2"
    assert layout["yaxis"]["range"] == [rows - 0.5, -0.5]  # (first row at the top; the invisible marks add no room)
    colorbar = heat["colorbar"]
    assert colorbar["lenmode"] == "pixels" and colorbar["len"] + layout["margin"]["t"] < figures.HEAT_BOX
    assert (colorbar["y"], colorbar["yanchor"]) == (1, "top")
    rule = re.search(r"#live-heatmap, #replay-heatmap \{ max-height: (\d+)px; overflow-y: auto; \}", CSS)
    assert rule and int(rule[1]) == figures.HEAT_BOX


def test_distributions_come_from_the_histograms():
    model = nn.Sequential(nn.Linear(64, 256))
    view = RunView()
    x = torch.randn(512, 64)
    with workbench.watch(model, histograms=True, bins=64, parameters=False, gradients=False,
                         parameter_grads=False) as w:
        w.subscribe(view.feed)
        for _ in range(3):
            out = model(x)
            w.step()
        w.recorder.flush()
    bands, steps, grid, density = view.distribution("activation", "0")
    assert steps.tolist() == [1, 2, 3] and density.shape == (3, 64)
    reference = np.percentile(out.detach().numpy(), [7, 16, 50, 84, 93])
    got = bands.iloc[-1][[f"p{p}" for p in (7, 16, 50, 84, 93)]].to_numpy(dtype=float)
    width = (grid[-1] - grid[0]) / 64
    np.testing.assert_allclose(got, reference, atol=width)  # within a bin of the exact percentiles
    assert bands.iloc[-1].p0 == pytest.approx(out.min().item()) and bands.iloc[-1].p100 == pytest.approx(out.max().item())
    assert density[-1].sum() == pytest.approx(out.numel())
    assert list(bands.columns) == ["step"] + [f"p{p}" for p in PERCENTILES]


def test_the_first_nan_is_found_and_metrics_are_smoothed_as_tensorboard_does():
    class Breaks(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.log = nn.Linear(4, 4), nn.Identity()

        def forward(self, x):
            h = self.lin(x)
            return self.log(torch.log(h - h.detach().max()))  # log of values <= 0: NaN and -inf

    view, _ = watched(Breaks(), 3)
    assert view.first_anomaly["step"] == 1 and view.first_anomaly["site"] in ("log", "(model)")
    steps = view.anomaly_frame().step.tolist()
    assert set(steps) == {1, 2, 3} and steps == sorted(steps, reverse=True)  # (the most recent first)
    frame = view.metrics_frame(["lr"], smoothing=0.5)
    assert frame.smoothed.tolist() == pytest.approx([0.1, 0.1, 0.1])
    values = np.array([1.0, 3.0, 2.0])
    view = RunView()
    for step, v in enumerate(values, 1):
        view.feed(StepRecord(step, metrics={"loss": v}))
    smoothed = view.metrics_frame(smoothing=0.6).smoothed.to_numpy()
    # debiased EMA, by hand
    ema = [1.0, (0.6 * 0.4 * 1 + 0.4 * 3) / (1 - 0.6 ** 2), None]
    ema[2] = (0.6 ** 2 * 0.4 * 1 + 0.6 * 0.4 * 3 + 0.4 * 2) / (1 - 0.6 ** 3)
    np.testing.assert_allclose(smoothed, ema)
    with pytest.raises(ValueError, match=r"smoothing must lie in \[0, 1\)"):
        view.metrics_frame(smoothing=1.0)


def test_a_long_run_draws_like_a_short_one():
    """What a page receives per refresh is bounded: the figures of 10,000 steps are about the size of
    those of 1,000."""

    def fed(steps):
        view = RunView(total=steps)
        keys = tuple((f"layers.{i}", 0, kind, "out", (32, 64)) for kind in ("activation", "grad_output")
                     for i in range(12))
        rng = np.random.default_rng(0)
        for step in range(1, steps + 1):
            sums = rng.normal(size=(24, len(SUMS)))
            sums[:, 3], sums[:, 4] = -3, 3
            view.feed(StepRecord(step, keys, np.full(24, 2048), sums, metrics={"loss": 1 / step}))
        return view

    def size(view):
        return sum(len(figures.to_json(f)) for f in (figures.metrics_figure(view), figures.sites_figure(
            view, "activation", "std"), figures.heatmap_figure(view, "grad_output", "norm")))

    short, long = fed(1_000), fed(10_000)
    assert size(long) < 1.5 * size(short)
    assert len(long.stats["activation"]) <= long.capacity


def test_a_site_keeps_its_colour_whichever_sites_are_drawn_with_it():
    view, _ = watched(nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(6)]), 2)

    def colors(sites):
        fig = figures.sites_figure(view, "activation", "std", sites=sites)
        return {t["name"]: t["line"]["color"] for t in fig["data"] if "lines" in t.get("mode", "")}

    a, b, c = "0.1", "1.1", "2.1"  # (the Tanh layers)
    assert colors([a, b])[b] == colors([b, c])[b] == colors([c, b])[b]
    assert len(set(colors([a, b, c]).values())) == 3
    # a site that would share its colour with one before it takes a free one; the others keep theirs
    many = view.site_order("activation")
    assert len(many) > 10 and len(set(colors([many[0], many[10]]).values())) == 2
    assert colors([many[0], many[1], many[10]])[many[0]] == colors([many[0], many[1]])[many[0]]
    assert colors([many[0], many[1], many[10]])[many[1]] == colors([many[0], many[1]])[many[1]]
    # with the colours of its earlier drawings (a run page's, a dashboard's), a site keeps its colour
    # whichever sites are drawn beside it: many[10] took a free one beside many[0], and keeps it
    kept: dict[str, str] = {}
    first = figures.sites_figure(view, "activation", "std", sites=[many[0], many[10]], colors=kept)
    assert kept == {t["name"]: t["line"]["color"] for t in first["data"] if "lines" in t.get("mode", "")}
    page = run_page.draw_page(view, run_page.Controls(kind="activation", statistic="std", sites=[many[10], many[1]]),
                              site_colors=kept)
    again = {t["name"]: t["line"]["color"] for t in page.sites_figure["data"] if "lines" in t.get("mode", "")}
    assert again[many[10]] == kept[many[10]] != colors([many[10], many[1]])[many[10]]
    assert len(set(again.values())) == 2


def test_figures_carry_the_data_of_the_views():
    view, w = watched(Twice(), 4, histograms=True)
    rows = w.to_pandas()
    fig = figures.sites_figure(view, "activation", "std", sites=["head"])
    [line] = [t for t in fig["data"] if t.get("name") == "head"]
    want = rows[(rows.kind == "activation") & (rows.module == "head")]
    np.testing.assert_allclose(figures.values(line["y"]), want["std"], rtol=1e-6)
    assert figures.values(line["x"]).tolist() == want.step.tolist()
    metrics = figures.metrics_figure(view, smoothing=0.0)
    assert [a["text"] for a in metrics["layout"]["annotations"]] == ["loss", "lr"]
    loss = figures.values(metrics["data"][0]["y"])
    np.testing.assert_allclose(loss, w.metrics().loss, rtol=1e-6)
    heat = figures.heatmap_figure(view, "grad_output", "norm")
    names, _, matrix, _ = view.heatmap("grad_output", "norm")
    assert heat["data"][0]["y"] == names
    np.testing.assert_allclose(figures.values(heat["data"][0]["z"]), np.log10(np.abs(matrix)), rtol=1e-5)
    dist = figures.distribution_figure(view, "activation", "head")
    [median] = [t for t in dist["data"] if t.get("name") == "median"]
    assert figures.values(median["x"]).tolist() == [1, 2, 3, 4]
    assert figures.values(median["customdata"]).shape == (4, len(PERCENTILES))
    assert "step 4 of 4" in figures.header_markdown(view)
    plain, _ = watched(Twice(), 1, histograms=False)
    assert "record with histograms on" in figures.distribution_figure(plain, "activation", "head")["layout"][
        "annotations"][0]["text"]
    # a spec Plotly itself accepts as it is
    import plotly.graph_objects as go
    for spec in (fig, metrics, heat, dist):
        go.Figure(spec)


def test_a_stored_run_replays_into_the_same_views(tmp_path):
    model = Twice()
    view = RunView(label="live")
    torch.manual_seed(0)
    with workbench.watch(model, store=tmp_path / "run", histograms=True, every=2) as w:
        w.subscribe(view.feed)
        for step in range(7):
            out = model(torch.randn(16, 4))
            out.square().mean().backward()
            w.step(loss=out.square().mean().item())
        w.recorder.flush()
    replayed = RunView.from_run(workbench.load_run(tmp_path / "run"))
    assert replayed.header()["status"] == "finished" and replayed.header()["step"] == 7
    assert replayed.label == "run"
    for kind in ("activation", "grad_output", "param", "param_grad"):
        pd.testing.assert_frame_equal(replayed.site_table(kind), view.site_table(kind))
        for statistic in ("mean", "norm", "zero_frac"):
            live, stored = view.heatmap(kind, statistic), replayed.heatmap(kind, statistic)
            assert live[0] == stored[0] and live[1].tolist() == stored[1].tolist() == [1, 3, 5, 7]
            np.testing.assert_allclose(stored[2], live[2], rtol=1e-6)
    pd.testing.assert_frame_equal(replayed.metrics_frame(), view.metrics_frame())  # every step's loss
    assert replayed.metrics_frame().step.tolist() == list(range(1, 8))
    live_bands, stored_bands = view.distribution("activation", "head")[0], replayed.distribution("activation", "head")[0]
    pd.testing.assert_frame_equal(stored_bands, live_bands, rtol=1e-5)


def test_runs_are_compared_metric_by_metric_and_site_by_site():
    a, wa = watched(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), 3)
    b, wb = watched(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), 5)
    fig = figures.compare_metrics_figure({"tanh": a, "relu": b})
    loss = [t for t in fig["data"] if t["xaxis"] == "x"]  # the first panel: loss
    assert [t["name"] for t in loss] == ["tanh", "relu"]
    np.testing.assert_allclose(figures.values(loss[1]["y"]), wb.metrics().loss, rtol=1e-6)
    site = figures.compare_site_figure({"tanh": a, "relu": b}, "grad_output", "norm", "0")
    assert [t["name"] for t in site["data"]] == ["tanh", "relu"]
    assert figures.values(site["data"][1]["x"]).tolist() == [1, 2, 3, 4, 5]
    missing = figures.compare_site_figure({"tanh": a}, "grad_output", "norm", "nowhere")
    assert "No run has grad_output rows at nowhere" in missing["layout"]["annotations"][0]["text"]


def test_a_smaller_last_batch_is_the_same_site():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    view = RunView()
    with workbench.watch(model) as w:
        w.subscribe(view.feed)
        for batch in (16, 16, 7, 16, 5):
            model(torch.randn(batch, 4)).sum().backward()
            w.step()
        w.recorder.flush()
    assert view.site_table("activation").name.tolist() == ["0", "1", "2"]
    series = view.site_series("activation", "norm", ["0"])
    assert series.step.tolist() == [1, 2, 3, 4, 5] and series.value.notna().all()
    assert view.latest("activation").site.tolist() == ["0", "1", "2"]


def test_a_copy_of_a_network_replays_as_sites_of_its_own(tmp_path):
    """A stored run tells aliases by statistics; a copy of a network (a target network) equals the
    original at first, but is not the original's container: it stays a site of its own."""

    class WithTarget(nn.Module):
        def __init__(self):
            super().__init__()
            self.online = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
            self.target = copy.deepcopy(self.online)

        def forward(self, x):
            return self.online(x) + self.target(x).detach()

    model = WithTarget()
    view = RunView()
    with workbench.watch(model, store=tmp_path / "run") as w:
        w.subscribe(view.feed)
        for _ in range(2):
            model(torch.randn(8, 4)).sum().backward()
            w.step()
        w.recorder.flush()
    replayed = RunView.from_run(workbench.load_run(tmp_path / "run"))
    live = view.site_table("activation")
    assert {"target.0", "target.1", "online.0", "online.1"} <= set(live.name)
    pd.testing.assert_frame_equal(replayed.site_table("activation"), live)


def test_views_drawn_while_steps_arrive_on_another_thread():
    view = RunView()
    stop, failures = threading.Event(), []

    def feed():
        step = 0
        while not stop.is_set():
            step += 1
            n = 1 + step % 40  # ever more sites
            keys = tuple((f"l{i}", 0, "activation", "out", (4,)) for i in range(n))
            sums = np.tile(np.arange(len(SUMS), dtype=float), (n, 1)) + np.arange(n)[:, None] * 0.01 + step
            view.feed(StepRecord(step, keys, np.full(n, 4), sums, metrics={"loss": 1.0 / step}))
            time.sleep(0.0005)

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        for _ in range(50):
            try:
                figures.heatmap_figure(view, "activation", "mean")
                figures.sites_figure(view, "activation", "std")
                view.latest("activation")
            except Exception as exc:  # noqa: BLE001 (reported below)
                failures.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:3]


def test_view_arguments_are_checked():
    view, _ = watched(Twice(), 1)
    with pytest.raises(TypeError, match=r"names takes a list of metric names, got the string 'loss'; pass \['loss'\]"):
        view.metrics_frame("loss")
    with pytest.raises(TypeError, match=r"sites takes a list of site names, got the string 'head'"):
        view.site_series("activation", "std", "head")
    with pytest.raises(ValueError, match="kind must be one of"):
        figures.compare_site_figure({"a": view}, "activations", "std", "head")
    with pytest.raises(ValueError, match="histogram_capacity"):
        RunView(histogram_capacity=4)


def test_steps_per_second_of_a_run_delivered_at_once_come_from_when_its_steps_ended():
    """A short run that ended before its dashboard first looked: one delivery, its pace all the same."""
    view = RunView(total=30)
    view.feed([StepRecord(s, time=1000.0 + s / 50) for s in range(1, 31)])  # 50 steps a second
    view.set_status("finished")
    assert view.header()["steps_per_s"] == pytest.approx(50.0)
    assert "50.0 steps/s" in figures.header_markdown(view)


def test_steps_per_second_leave_a_pause_out(monkeypatch):
    """A run paused for a while, then resumed: its header reads the pace it trains at, and the time
    left from it, not a pace slowed by the pause."""
    from workbench.instrument import StepRecord
    from workbench.ui import views

    clock = [0.0]
    monkeypatch.setattr(views.time, "monotonic", lambda: clock[0])
    view = RunView(total=1000)
    step = 0
    for seconds in [0.1] * 20 + [30.0] + [0.1] * 20:  # 10 steps a delivery, one a tenth of a second apart
        clock[0] += seconds
        step += 10
        view.feed([StepRecord(s) for s in range(step - 9, step + 1)])
    header = view.header()
    assert header["steps_per_s"] == pytest.approx(100.0)
    assert header["seconds_left"] == pytest.approx((1000 - 410) / 100.0)


def test_runs_compared_are_drawn_in_the_same_buckets():
    """Two runs with the same losses, one stopped early: a long run is thinned into buckets, and the short
    one beside it step by step read as if they differed from the first step (a new user's comparison)."""
    from workbench.instrument import StepRecord

    losses = np.random.default_rng(0).normal(1.0, 0.3, size=1200)
    long, short = RunView(), RunView()
    long.feed([StepRecord(s, metrics={"loss": float(losses[s - 1])}) for s in range(1, 1201)])
    short.feed([StepRecord(s, metrics={"loss": float(losses[s - 1])}) for s in range(1, 61)])
    assert len(long.metrics_frame()) < 1200 and len(short.metrics_frame()) == 60  # (thinned; whole)
    lines = {t["name"]: t for t in figures.compare_metrics_figure({"long": long, "short": short})["data"]
             if "lines" in t.get("mode", "")}
    x_long, y_long = figures.values(lines["long"]["x"]), figures.values(lines["long"]["y"])
    x_short, y_short = figures.values(lines["short"]["x"]), figures.values(lines["short"]["y"])
    both = np.isin(x_long, x_short)
    np.testing.assert_array_equal(x_long[both], x_short[:both.sum()])
    np.testing.assert_allclose(y_long[both], y_short[:both.sum()], rtol=1e-6)
    # a run too short for a few of the long one's buckets is drawn at its own (it was one point)
    tiny = RunView()
    tiny.feed([StepRecord(s, metrics={"loss": float(losses[s - 1])}) for s in range(1, 21)])
    lines = {t["name"]: t for t in figures.compare_metrics_figure({"long": long, "tiny": tiny})["data"]
             if "lines" in t.get("mode", "")}
    assert figures.values(lines["tiny"]["x"]).tolist() == list(range(1, 21))


def test_a_metric_of_a_few_points_is_drawn_with_a_marker_at_each():
    """A reward evaluated every 50 steps is one point in a 60-step run: a line alone draws nothing."""
    view = RunView()
    view.feed([StepRecord(s, metrics={"loss": 1 / s, **({"reward": 0.5} if s == 50 else {})}) for s in range(1, 61)])
    drawn = {t["name"]: t for t in figures.metrics_figure(view)["data"] if "lines" in t.get("mode", "")}
    assert drawn["reward"]["mode"] == "lines+markers" and list(figures.values(drawn["reward"]["x"])) == [50]
    assert drawn["loss"]["mode"] == "lines"  # (60 points: a line)


def test_a_constant_metric_is_drawn_around_its_value_not_on_plotlys_plus_minus_one():
    """Plotly's own range for a flat line is value +- 1: a learning rate of 3e-4 would sit on the 0 line."""
    view = RunView()
    view.feed([StepRecord(s, metrics={"lr": 3e-4, "loss": 1 / s, "zero": 0.0}) for s in range(1, 30)])
    layout = figures.metrics_figure(view)["layout"]
    axes = {a["text"]: layout["yaxis" + ("" if i == 0 else str(i + 1))] for i, a in enumerate(layout["annotations"])}
    assert axes["lr"]["range"] == pytest.approx([1.5e-4, 4.5e-4])
    assert axes["zero"]["range"] == [-1.0, 1.0] and "range" not in axes["loss"]
    logged = figures.metrics_figure(view, ["lr"], log_y=True)["layout"]["yaxis"]
    assert logged["range"] == pytest.approx([np.log10(3e-4) - 1, np.log10(3e-4) + 1])


def test_a_line_of_nan_says_so_rather_than_draw_an_empty_plot():
    """A run NaN from its first step: its loss and a site's statistic have no point to draw."""
    nan = float("nan")

    def record(step):
        sums = dict(sum=nan, sum_sq=nan, abs_sum=nan, min=nan, max=nan, nonzero=4, nan=4)
        return StepRecord(step, keys=(("layers.0", 0, "activation", "out", (4,)),), numel=np.array([4]),
                          sums=np.array([[sums.get(name, 0.0) for name in SUMS]]),
                          metrics={"loss": nan, "accuracy": 0.5})

    view = RunView()
    view.feed([record(s) for s in range(1, 11)])
    notes = [a["text"] for a in figures.metrics_figure(view)["layout"]["annotations"]]
    assert "loss: no finite value<br>(NaN or Inf) to draw" in notes
    assert not any(n.startswith("accuracy:") for n in notes)  # (its panel has its points)
    sites = figures.sites_figure(view, "activation", "std", ["layers.0"])
    assert [a["text"] for a in sites["layout"]["annotations"]] == ["layers.0: no finite value<br>(NaN or Inf) to draw"]
    heat = figures.heatmap_figure(view, "activation", "mean")["layout"]
    assert [a["text"] for a in heat["annotations"]] == [
        "every activation cell: no finite value<br>(NaN or Inf) to draw"]
    assert heat["xaxis"]["range"] == [0.5, 10.5] and heat["yaxis"]["categoryarray"] == ["layers.0"]  # (not -1..6)


def test_a_stored_run_nan_from_its_first_step_opens_and_says_what_it_cannot_draw(tmp_path):
    """Its histograms' ranges are NaN (NULL in SQLite): opening it raised a TypeError in the app."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with workbench.watch(model, store=tmp_path / "r") as w:
        for _ in range(3):
            model(torch.full((2, 3), float("nan"))).sum().backward()
            w.step(loss=float("nan"))
    run = workbench.load_run(tmp_path / "r")
    assert np.isnan(np.stack(run.histograms(kind="activation").edges)).all()
    view = RunView.from_run(run)
    note = figures.distribution_figure(view, "activation", "0")["layout"]["annotations"]
    assert [a["text"] for a in note] == ["0: no finite value<br>(NaN or Inf) to draw"]
    assert "loss: no finite value<br>(NaN or Inf) to draw" in [
        a["text"] for a in figures.metrics_figure(view)["layout"]["annotations"]]


def test_a_stored_run_read_a_few_steps_at_a_time_draws_as_one_read_at_once(tmp_path, monkeypatch):
    """RunView.from_run reads a long run in parts (its memory that of a part): the views are the same."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(store=tmp_path / "r")
    exp.run(2, progress=False)
    w.ablate("layers.1", list(range(8)))  # (findings from step 3 on: dead units, vanishing gradients)
    exp.run(9, progress=False)
    w.close()
    run = workbench.load_run(tmp_path / "r")
    whole = RunView.from_run(run)
    from workbench.ui.findings import RunFindings

    findings_whole = RunFindings(run).frame()
    assert {"dead_units", "vanishing_gradients"} <= set(findings_whole.finding)
    monkeypatch.setattr(RunView, "READ_STEPS", 3)
    parts = RunView.from_run(run)
    pd.testing.assert_frame_equal(parts.metrics_frame(), whole.metrics_frame())
    for kind in ("activation", "grad_output", "param"):
        assert parts.site_order(kind) == whole.site_order(kind)
        pd.testing.assert_frame_equal(parts.site_series(kind, "std", parts.site_order(kind)),
                                      whole.site_series(kind, "std", whole.site_order(kind)))
        for a, b in zip(parts.heatmap(kind, "norm", 100), whole.heatmap(kind, "norm", 100)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    site = whole.histogram_sites("activation")[0]  # (histograms are on by default)
    for a, b in zip(parts.distribution("activation", site), whole.distribution("activation", site)):
        pd.testing.assert_frame_equal(a, b) if isinstance(a, pd.DataFrame) else np.testing.assert_array_equal(a, b)
    assert parts.header() == whole.header() and parts.steps_fed == 11
    from workbench.ui.findings import RunFindings

    pd.testing.assert_frame_equal(RunFindings(run).frame(), findings_whole)  # (the findings read in parts too)


def test_a_stored_run_keeps_a_metric_logged_nan_apart_from_one_not_logged(tmp_path):
    """SQLite keeps a NaN as NULL: the replay shows the NaN loss's panel, and a sparse metric's gaps stay gaps."""
    model = torch.nn.Linear(3, 2)
    with workbench.watch(model, store=tmp_path / "r") as w:
        for step in range(1, 7):
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=float("nan") if step > 1 else 2.0, **({"reward": 1.0} if step % 3 == 0 else {}))
    run = workbench.load_run(tmp_path / "r")
    long = run.metrics(long=True)
    assert list(long.columns) == ["step", "name", "value"]
    assert long[long.name == "reward"].step.tolist() == [3, 6]
    assert long[long.name == "loss"].value.isna().tolist() == [False] + [True] * 5
    pd.testing.assert_frame_equal(long, w.metrics(long=True))
    view = RunView.from_run(run)
    frame = view.metrics_frame(["loss", "reward"])
    assert frame[frame.metric == "loss"].step.tolist() == [1, 2, 3, 4, 5, 6]
    assert frame[frame.metric == "reward"].step.tolist() == [3, 6]
    # the diagnosis reads them as logged: a loss NaN from its 2nd step (a wide frame cannot tell that from a gap)
    assert "loss is nan at step 2" in " ".join(run.diagnose().evidence)


def test_the_lowest_metric_panel_of_each_column_titles_its_x_axis_step():
    """Five panels in rows of three: the x axes under the last panel of each column say what they count."""
    view = RunView()
    view.feed([StepRecord(s, metrics={name: float(s) for name in "abcde"}) for s in range(1, 11)])
    layout = figures.metrics_figure(view, columns=3)["layout"]
    titled = {a["text"] for i, a in enumerate(layout["annotations"])
              if layout["xaxis" + ("" if i == 0 else str(i + 1))].get("title", {}).get("text") == "step"}
    assert titled == {"c", "d", "e"}  # (c heads a column with no panel under it)


def test_a_stored_run_replays_with_the_pace_it_ran_at(tmp_path):
    """The header of a replayed run says how fast it trained: its steps' end times are stored, not the
    times its store wrote them (a second's steps at once)."""
    model = torch.nn.Linear(3, 2)
    with workbench.watch(model, store=tmp_path / "r") as w:
        started = time.time()
        for _ in range(12):
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=1.0)
            time.sleep(0.02)
        ended = time.time()
    times = workbench.load_run(tmp_path / "r").step_times()
    assert times.step.tolist() == list(range(1, 13)) and times.time.is_monotonic_increasing
    assert started <= times.time.iat[0] and times.time.iat[-1] <= ended
    assert (np.diff(times.time) >= 0.02).all()  # (a step ended after the sleep of the one before)
    pace = RunView.from_run(workbench.load_run(tmp_path / "r")).header()["steps_per_s"]
    assert 11 / (ended - started) <= pace <= 1 / 0.02


def test_an_ended_run_ran_at_the_same_pace_live_and_on_replay(tmp_path):
    """The live header's "ran at" read the last deliveries, its replay's steps spread over the run: 188.9
    against 278.5 steps/s for one run. Both now read the pace over all its steps (views.WholeRunPace)."""
    model = torch.nn.Linear(3, 2)
    view = RunView(label="live")
    with workbench.watch(model, store=tmp_path / "r") as w:
        w.subscribe(view.feed)
        for step in range(200):  # (fast, then slow: the last deliveries' pace is not the run's)
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=1.0)
            if step >= 120:
                time.sleep(0.004)
        w.recorder.flush()
    view.set_status("finished")
    replayed = RunView.from_run(workbench.load_run(tmp_path / "r"))
    assert view.steps_fed == 200 and replayed.header()["status"] == "finished"
    assert view.header()["steps_per_s"] == replayed.header()["steps_per_s"]
    times = workbench.load_run(tmp_path / "r").step_times()
    pace = views.WholeRunPace()
    for ended, step in zip(times.time, times.step):
        pace.add(ended, step)
    assert replayed.header()["steps_per_s"] == pace.rate() and len(pace.kept) <= pace.KEEP
    assert [k[2] for k in pace.kept] == list(range(1, 201, pace.stride))  # (spread evenly over the run)


def test_a_running_run_whose_steps_stopped_coming_says_for_how_long(monkeypatch):
    """A watch left open after its training cell reads `running`: its header says no step came since."""
    view = RunView(label="mine")
    view.set_status("running")
    view.feed([StepRecord(s, metrics={"loss": 1.0}) for s in (1, 2)])
    assert "no new step" not in figures.header_markdown(view)
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 42)
    assert "no new step for 42 s" in figures.header_markdown(view)
    view.set_status("finished")  # (an ended run has no steps to wait for)
    assert "no new step" not in figures.header_markdown(view)


def test_a_stored_run_whose_rows_change_replays_its_histograms_and_layouts_as_they_were_stored(tmp_path):
    """A replay reads a part's rows as arrays, a layout (the rows' keys) per step: sites that come and go,
    a step of metrics alone between, the model's own rows (module "") and a module called twice draw the
    values stored (``run.to_pandas()``, ``run.histograms()``) at their steps, as the live view drew them."""
    from workbench.instrument.store import RunStore

    rng = np.random.default_rng(0)
    layouts = {"ab": (("", 0, "activation", "out", (2, 3)), ("a", 0, "activation", "out", (2, 3)),
                      ("a", 1, "activation", "out", (2, 3)), ("b", 0, "grad_output", "out.0", (2, 3))),
               "ac": (("", 0, "activation", "out", (2, 3)), ("c", 0, "activation", "out", (4,)))}
    records = []
    for step, name in zip(range(1, 9), ["ab", "ab", "ab", None, "ac", "ac", "ab", "ac"]):
        if name is None:
            records.append(StepRecord(step, metrics={"loss": 1.0 / step}))
            continue
        keys = layouts[name]
        values = rng.normal(size=(len(keys), 6))
        sums = np.zeros((len(keys), len(SUMS)))
        sums[:, :6] = np.abs(values)  # (sums of a few positive values: finite statistics)
        ranges = np.sort(rng.normal(size=(len(keys), 2)), axis=1)
        records.append(StepRecord(step, keys, np.full(len(keys), 6), sums, rng.integers(0, 9, (len(keys), 5)),
                                  {"loss": 1.0 / step}, histogram_edges=ranges))
    store = RunStore(tmp_path / "run")
    for record in records:
        store.write(record)
    store.close()
    live = RunView()
    live.feed(records)
    run = workbench.load_run(tmp_path / "run")
    replayed = RunView.from_run(run)
    assert replayed.steps_fed == 8 and replayed.metrics_frame().step.tolist() == list(range(1, 9))
    rows, histograms = run.to_pandas(), run.histograms()
    for kind in ("activation", "grad_output"):
        pd.testing.assert_frame_equal(replayed.site_table(kind), live.site_table(kind))
        for site in live.site_table(kind).itertuples():
            stored = rows[(rows.module == site.module) & (rows.call == site.call) & (rows.kind == kind)]
            series = replayed.site_series(kind, "std", [site.name]).dropna(subset=["value"])
            assert series.step.tolist() == stored.step.tolist()
            np.testing.assert_array_equal(series.value, stored["std"].astype(np.float32))
            kept = histograms[(histograms.module == site.module) & (histograms.call == site.call)
                              & (histograms.kind == kind)]
            segments = replayed.distribution_segments(kind, site.name)
            assert np.concatenate([steps for steps, _, _ in segments]).tolist() == kept.step.tolist()
            for steps, edges, counts in segments:
                at = kept.set_index("step").loc[steps]
                np.testing.assert_allclose(np.stack(at.edges), np.tile(edges, (len(steps), 1)))
                np.testing.assert_array_equal(np.stack(at.counts), counts)
            for a, b in zip(live.distribution_segments(kind, site.name), segments):
                for x, y in zip(a, b):
                    np.testing.assert_allclose(x, y, rtol=1e-6)


def test_a_stored_run_whose_histograms_change_their_bins_replays_each_step_s(tmp_path):
    # (a run written part way with other bins: one layout of rows, steps of 5 bins then of 3; stacked as one, the
    # steps of a layout failed to open: "all input arrays must have the same shape")
    from workbench.instrument.store import RunStore

    keys = (("a", 0, "activation", "out", (2, 3)),)
    rng = np.random.default_rng(0)
    records = []
    for step, bins in zip(range(1, 5), [5, 5, 3, 3]):
        sums = np.zeros((1, len(SUMS)))
        sums[:, :6] = 1.0
        records.append(StepRecord(step, keys, np.full(1, 6), sums, rng.integers(0, 9, (1, bins)), {"loss": 1.0},
                                  histogram_edges=np.array([[0.0, 1.0]])))
    store = RunStore(tmp_path / "run")
    for record in records:
        store.write(record)
    store.close()
    segments = RunView.from_run(workbench.load_run(tmp_path / "run")).distribution_segments("activation", "a")
    assert [(steps.tolist(), counts.shape[1]) for steps, _, counts in segments] == [([1, 2], 5), ([3, 4], 3)]
    for steps, _, counts in segments:
        for step, row in zip(steps, counts):
            np.testing.assert_array_equal(row, records[step - 1].histograms[0])


def _raised(exc: BaseException, cause: BaseException | None = None) -> str:
    """``exc`` raised (from ``cause``, while handling it) and formatted as a run's error is."""
    import traceback

    try:
        try:
            if cause is not None:
                raise cause
        finally:
            raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def test_a_run_errors_short_message_is_its_last_exception_and_what_the_watch_added_the_traceback_apart():
    # (headers showed a traceback's last line: a store that lost steps said only "3 step(s) could not be stored",
    # not the exception that failed the run; the traceback was nowhere on the page)
    one = _raised(ZeroDivisionError("division by zero"))
    assert figures.error_parts(one) == ("ZeroDivisionError: division by zero", one.strip())
    added = one + "closing the sink Sink failed: OSError: disk full\n3 step(s) could not be stored"
    assert figures.error_parts(added)[0] == ("ZeroDivisionError: division by zero\nclosing the sink Sink failed: "
                                             "OSError: disk full\n3 step(s) could not be stored")
    assert figures.error_line(added).startswith("ZeroDivisionError: division by zero; closing the sink")
    chained = _raised(ValueError("the loss is NaN\nat step 3"), cause=KeyError("lr"))
    assert "During handling" in chained
    assert figures.error_parts(chained) == ("ValueError: the loss is NaN\nat step 3", chained.strip())
    # a message that is no traceback (a stopped run's) is itself, with nothing folded under it
    assert figures.error_parts("stopped by the user after step 4") == ("stopped by the user after step 4", None)
    assert figures.error_parts(None) == ("", None) and figures.error_markdown(None) == ""
    view = RunView(label="r", total=4)
    view.set_status("failed", chained)
    header = figures.header_markdown(view)
    assert "```\nValueError: the loss is NaN\nat step 3\n```" in header
    folded = header.split("\n\n")[-1]  # the traceback folded under it, one line of HTML (a blank line would end it)
    assert folded.startswith("<details") and folded.endswith("</details>") and "\n" not in folded
    assert "During handling of the above exception" in folded and "KeyError: 'lr'" in folded
    assert html.unescape(folded.replace("&#10;", "\n")).count("Traceback (most recent call last):") == 2
    view.set_status("stopped", "stopped by the user after step 4")
    assert figures.header_markdown(view).endswith("```\nstopped by the user after step 4\n```")


def test_a_run_resumed_after_a_long_pause_does_not_say_it_waits_for_steps(monkeypatch):
    """The idle note counts from the resume: a run paused for minutes, resumed, is not 'no new step for 3 min'."""
    view = RunView(label="mine")
    view.set_status("running")
    view.feed([StepRecord(s, metrics={"loss": 1.0}) for s in (1, 2)])
    now = time.monotonic()
    view.set_status("paused")
    monkeypatch.setattr(time, "monotonic", lambda: now + 180)
    view.set_status("running")  # (resumed after 3 minutes; its next step not there yet)
    view.set_status("running")  # (a page that sets the status it reads at every tick restarts nothing)
    assert "no new step" not in figures.header_markdown(view)
    monkeypatch.setattr(time, "monotonic", lambda: now + 180 + 42)
    assert "no new step for 42 s" in figures.header_markdown(view)  # (since the resume: it waits now)


def test_a_run_errors_message_with_a_fence_of_its_own_stays_in_its_code_block():
    # (a message line of three backticks closed the header's code block: the lines after it were read as Markdown
    # and HTML, an <img onerror=...> of the message reaching the page as a tag)
    import markdown_it

    error = _raised(ValueError("bad config:\n```\n<img src=x onerror=alert(1)>\n| a | b |\n|---|---|"))
    view = RunView(label="r", total=4)
    view.set_status("failed", error)
    rendered = markdown_it.MarkdownIt().render(figures.header_markdown(view))
    assert "<img" not in rendered and "&lt;img src=x onerror=alert(1)&gt;" in rendered
    code = rendered.split("<pre><code>", 1)[1].split("</code></pre>", 1)[0]
    assert html.unescape(code).strip() == figures.error_parts(error)[0]


def test_a_run_errors_short_message_keeps_every_line_of_the_exceptions_message():
    # (lines of the message that began with whitespace were dropped as if frames: a state_dict's missing keys, a
    # shape's lines; a DataLoader worker's "Original Traceback" was taken for the run's own, its RuntimeError lost;
    # an exception group's message was the traceback's last line, "+-----...")
    keys = _raised(RuntimeError("Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "
                                "\"fc.weight\".\n\tsize mismatch for fc.bias"))
    assert figures.error_parts(keys)[0] == ("RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) "
                                            "in state_dict: \"fc.weight\".\n\tsize mismatch for fc.bias")
    added = keys + "\n3 step(s) could not be stored"
    assert figures.error_parts(added)[0].endswith("size mismatch for fc.bias\n3 step(s) could not be stored")
    worker = _raised(RuntimeError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most "
                                  "recent call last):\n  File \"data.py\", line 3, in item\n    g()\nValueError: "
                                  "bad sample 7\n"))
    message = figures.error_parts(worker)[0]
    assert message.startswith("RuntimeError: Caught ValueError in DataLoader worker process 0.\nOriginal Traceback")
    assert message.endswith("ValueError: bad sample 7")
    group = _raised(ExceptionGroup("many", [ValueError("a"), TypeError("b")]))
    assert figures.error_parts(group) == ("ExceptionGroup: many (2 sub-exceptions)", group.strip())
