"""The findings list as a view (workbench.ui.findings) and in the Jupyter Dashboard, live."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import workbench
from workbench.diagnose import diagnose
from workbench.ui import figures
from workbench.ui import findings as view
from workbench.ui.notebook import Dashboard
from workbench.ui.views import RunView

from tests.diagnose.conftest import mlp, train
from tests.diagnose.runs import one_step


def wait_for(condition, timeout=30.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def broken():
    """A dead ReLU layer, then log(0) from step 5: a warning and an error."""
    model = mlp("relu")
    with torch.no_grad():
        model.layers[2].bias.fill_(-20.0)
    w = train(model, steps=3)
    frame = diagnose(w.to_pandas(), w.metrics())
    return w, frame


def test_a_page_shows_what_was_found_where_in_one_column_its_names_breakable_and_the_values_as_text():
    table = pd.DataFrame({"severity": ["⚠ warning"], "steps": ["3"], "site": ["model.wte.weight"],
                          "finding": ["update_ratio_low"], "evidence": ["loss = 0.1514 < 2 at fc_reward_head.2"]},
                         columns=view.TABLE_COLUMNS)
    styled = view.shown_findings(table)
    shown = styled._compute()._translate(None, None)["body"][0]  # (what Gradio takes as the cells' display)
    assert [cell["display_value"] for cell in shown if cell["type"] == "td"] == [
        "⚠ warning · step 3<br><b>update_<wbr>ratio_<wbr>low</b><br><span>model.<wbr>wte.<wbr>weight</span>",
        "loss = 0.1514 &lt; 2 at fc_<wbr>reward_<wbr>head.<wbr>2"]  # (a number stays whole; the text is HTML)
    # the values (which a copy of the table takes): the same text, a line each
    assert styled.data.values.tolist() == [["⚠ warning · step 3\nupdate_ratio_low\nmodel.wte.weight",
                                            "loss = 0.1514 < 2 at fc_reward_head.2"]]
    assert list(styled.data.columns) == view.SHOWN_COLUMNS and view.SHOWN_DATATYPES == ["html", "html"]
    assert list(view.shown_findings(table.iloc[:0]).columns) == view.SHOWN_COLUMNS
    over = view.shown_findings(table.assign(steps="3–8")).data.finding[0]  # (one step: "step 3")
    assert over.startswith("⚠ warning · steps 3–8\n")


def test_the_table_lists_each_finding_in_order_with_its_steps(broken):
    _, frame = broken
    table = view.findings_table(frame)
    assert list(table.columns) == view.TABLE_COLUMNS
    assert table.finding.tolist() == frame.finding.tolist() and table.site.tolist() == frame.site.tolist()
    # the whole evidence, not its lead cut at "…": the numbers that made each finding fire
    assert table.evidence.tolist() == frame.evidence.tolist()
    dead = table[table.finding == "dead_units"].iloc[0]
    assert (dead.severity, dead.steps, dead.site) == ("⚠ warning", "1–3", "layers.3")
    assert view.findings_table(frame, limit=1).shape[0] == 1
    assert view.findings_table(frame.iloc[:0]).empty
    assert "nothing looks wrong so far" in view.findings_summary(frame.iloc[:0])
    assert "1 warning" in view.findings_summary(frame[frame.finding == "dead_units"])
    html = view.findings_html(frame)
    assert "dead_units" in html and "Hint:" in html and "layers.3" in html


def test_focus_names_the_site_as_the_views_do_and_marks_its_steps(broken):
    w, frame = broken
    runview = RunView()
    runview.feed(w.recorder.records())
    picked = frame.index[frame.finding == "dead_units"][0]
    target = view.focus(frame, int(picked), runview)
    assert (target.kind, target.site, target.statistic, target.step, target.last_step) == (
        "activation", "layers.3", "zero_frac", 1, 3)
    assert target.site in runview.site_order("activation")
    figure = view.mark_steps({"data": [], "layout": {}}, 1, 3)
    assert figure["layout"]["shapes"][0]["x0"] == 1 and figure["layout"]["shapes"][0]["x1"] == 3
    line = view.mark_steps({"data": [], "layout": {"shapes": [{"type": "rect"}]}}, 2, 2)["layout"]["shapes"]
    assert len(line) == 2 and line[1]["type"] == "line"
    panels = view.mark_steps({"data": [], "layout": {"xaxis": {}, "xaxis2": {}}}, 1, 3)["layout"]["shapes"]
    assert [(s["xref"], s["yref"]) for s in panels] == [("x", "y domain"), ("x2", "y2 domain")]


def test_a_metric_finding_focuses_the_metric():
    frame = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 8),
                                                   "loss": [1.0, 0.9, 0.8, float("nan")] + [float("nan")] * 3}))
    target = view.focus(frame, 0)
    assert (target.metric, target.kind, target.step) == ("loss", None, 4)


def test_bad_input_to_the_view_says_what_was_expected(broken):
    _, frame = broken
    with pytest.raises(IndexError, match=r"No finding number 9: the list has 2"):
        view.focus(frame, 9)
    with pytest.raises(IndexError, match=r"^No finding number 0: the list is empty: nothing looks wrong in the "
                                         r"steps so far\.$"):
        view.focus(frame.iloc[:0], 0)  # (it said "the list has 0 (0 to -1)")
    with pytest.raises(TypeError, match="Expected a findings frame"):
        view.findings_table(pd.DataFrame({"a": [1]}))
    with pytest.raises(ValueError, match="limit must be a positive int"):
        view.findings_table(frame, limit=0)


def test_the_dashboard_lists_findings_live_and_a_pick_focuses_the_views(tmp_path):
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)  # layers.1 dead from the first step
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    w = workbench.watch(model, store=tmp_path / "run")
    dash = Dashboard(w, interval=0.05)
    assert "no step recorded yet" in dash.findings_summary.value  # (nothing judged: not "nothing looks wrong")
    for step in range(1, 7):
        if step == 5:
            w.patch("layers.3", torch.log)  # -inf from step 5: an error, listed first
        loss = F.cross_entropy(model(x), y)
        one_step(w, opt, loss)
    wait_for(lambda: any("nan_origin" in o for o in dash.findings_list.options), what="the NaN's finding, live")
    wait_for(lambda: any("dead_units at layers.1" in o for o in dash.findings_list.options))
    options = dash.findings_list.options
    assert options[0].startswith("✖ nan_origin at layers.3, step 5")
    assert "error" in dash.findings_summary.value
    # picking the dead units moves kind, statistic and site there and shades their steps
    dash.findings_list.index = next(i for i, o in enumerate(options) if "dead_units" in o)
    assert (dash.kind.value, dash.statistic.value, dash.sites.value) == ("activation", "zero_frac", ("layers.1",))
    shapes = dash.figure("sites")["layout"]["shapes"]
    assert shapes[-1]["x0"] == 1 and shapes[-1]["x1"] >= 3
    assert "What to try:" in dash.findings_detail.value and "layers.1" in dash.findings_detail.value
    assert dash.figure("metrics")["layout"]["shapes"][-1]["x0"] == 1  # the metrics over the same steps
    # the same through the API; the list shown is the diagnosis of the rows
    target = dash.focus_finding(0)
    assert (target.site, target.step) == ("layers.3", 5)
    assert dash.statistic.value == "nan_count" and dash.sites.value == ("layers.3",)
    w.close()
    wait_for(lambda: "finished" in dash.header.value, what="the last draw")
    # (the NaN's origin is a cause: picking it listed its consequence, the NaN loss, under it)
    folded = view.merge_calls(diagnose(w.to_pandas(), w.metrics()))
    assert folded.folded[0] == 1 and dash.findings().cause[1] == "nan_origin at layers.3"
    pd.testing.assert_frame_equal(dash.findings(), view.merge_calls(diagnose(w.to_pandas(), w.metrics()),
                                                                    view.toggled((), folded.iloc[0])))
    assert dash.findings_list.options[:2] == ("✖ nan_origin at layers.3, step 5–6 · 1 consequence below",
                                              "↳ ✖ loss_not_finite at loss, step 5–6")
    # a stored run keeps them: its dashboard lists the same
    stored = Dashboard(workbench.load_run(tmp_path / "run"))
    assert stored.findings_list.options[0] == dash.findings_list.options[0].replace("1 consequence below",
                                                                                    "+1 consequence")
    assert stored.findings_list.options[1:] == dash.findings_list.options[2:]
    stored.focus_finding(0)  # (its consequence listed under it, as in the live one's)
    assert stored.findings_list.options == dash.findings_list.options
    pd.testing.assert_frame_equal(stored.findings(), dash.findings())


def test_a_module_called_several_times_is_one_finding_that_shows_every_call(tmp_path):
    """An unrolled network or a layer shared by several paths: the diagnosis finds dead units at each of
    its calls, the lists show one finding that names them, and picking it shows every call."""
    class Unrolled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.cell, self.act, self.out = (torch.nn.Linear(2, 16), torch.nn.Linear(16, 16),
                                                       torch.nn.ReLU(), torch.nn.Linear(16, 2))

        def forward(self, x):
            h = self.inp(x)
            for _ in range(3):
                h = h + self.act(self.cell(h))
            return self.out(h)

    torch.manual_seed(0)
    model = Unrolled()
    with torch.no_grad():
        model.cell.bias.fill_(-20.0)  # act outputs 0 at every call
    w = train(model, steps=3, store=tmp_path / "run")
    frame = diagnose(w.to_pandas(), w.metrics())
    dead = frame[frame.finding == "dead_units"]
    assert sorted(dead.site) == ["act#0", "act#1", "act#2"]
    merged = view.merge_calls(frame)
    assert len(merged) == len(frame) - 2 and merged.finding.tolist().count("dead_units") == 1
    row = merged[merged.finding == "dead_units"].iloc[0]
    assert (row.site, row.calls, row.step, row.last_step) == ("act (calls 0–2)", (0, 1, 2), dead.step.min(),
                                                               dead.last_step.max())
    assert row.evidence == f"call {row.call}: " + dead[dead.call == row.call].evidence.iloc[0]
    others = merged[merged.finding != "dead_units"].drop(columns=["calls", "call_sites", "folded", "listed",
                                                                  "trouble_steps"])
    others = others.reset_index(drop=True)
    pd.testing.assert_frame_equal(others, frame[frame.finding != "dead_units"].reset_index(drop=True))
    # a pick shows every call: through the API, and in a dashboard of the stored run
    runview = RunView.from_run(workbench.load_run(tmp_path / "run"))
    index = merged.finding.tolist().index("dead_units")
    assert view.focus(merged, index, runview).sites == ("act#0", "act#1", "act#2")
    dash = Dashboard(workbench.load_run(tmp_path / "run"))
    assert f"⚠ dead_units at act (calls 0–2), step {row.step}–{row.last_step}" in dash.findings_list.options
    dash.focus_finding(np.int64(index))  # (an index as numpy gives it, e.g. from np.flatnonzero)
    assert dash.sites.value == ("act#0", "act#1", "act#2") and dash.statistic.value == "zero_frac"


def finding(call, step=1, last_step=2, module="rnn.cell", tensor="out.0", name=None):
    return dict(step=step, last_step=last_step, site=name or f"{module}#{call} {tensor}", finding="saturated",
                severity="warning", evidence=f"e{call}", hint="h", kind="activation", module=module, call=call,
                tensor=tensor)


def test_merged_calls_are_named_in_spans_and_a_long_list_says_how_many():
    def frame(calls):
        return pd.DataFrame([finding(c) for c in calls])

    assert view.merge_calls(frame([0, 3, 6, 9, 12])).site.tolist() == ["rnn.cell out.0 (calls 0, 3, 6, 9, 12)"]
    assert view.merge_calls(frame([0, 1, 2, 3, 7, 8])).site.tolist() == ["rnn.cell out.0 (calls 0–3, 7, 8)"]
    assert view.merge_calls(frame(range(0, 40, 2))).site.tolist() == ["rnn.cell out.0 (calls 0, 2, 4, 6, 8, 10 … "
                                                                      "(20 calls))"]
    one = view.merge_calls(frame([4]))
    assert one.site.tolist() == ["rnn.cell#4 out.0"] and one.evidence.tolist() == ["e4"]  # (one call: as it was)
    assert one.calls.tolist() == [(4,)] and one.call_sites.tolist() == [("rnn.cell#4 out.0",)]
    empty = view.merge_calls(frame([]).reindex(columns=list(frame([0]).columns)))
    assert empty.empty and {"calls", "call_sites"} <= set(empty.columns)


def test_only_calls_over_the_same_steps_merge_and_a_call_s_episodes_stay_apart():
    # call 0 at steps 1-4 and again at 8-10 (two episodes, as diagnosed); call 1 at 2-3; call 2 at 20-30
    frame = pd.DataFrame([finding(0, 8, 10), finding(1, 2, 3), finding(0, 1, 4), finding(2, 20, 30)])
    merged = view.merge_calls(frame)
    assert merged[["site", "step", "last_step"]].values.tolist() == [
        ["rnn.cell#0 out.0", 8, 10], ["rnn.cell out.0 (calls 0, 1)", 1, 4], ["rnn.cell#2 out.0", 20, 30]]
    assert merged.evidence.iloc[1] == "call 0: e0"  # (the lowest call's, where the list had call 1 first)
    # a call under another call's steps twice: left as diagnosed
    twice = pd.DataFrame([finding(0, 1, 3), finding(0, 6, 8), finding(1, 1, 10)])
    assert view.merge_calls(twice).site.tolist() == twice.site.tolist()
    # a pick is kept as calls join the finding (its site's name changes)
    alone = view.merge_calls(pd.DataFrame([finding(0)]))
    joined = view.merge_calls(pd.DataFrame([finding(0), finding(1)]))
    assert view.pick_key(alone.iloc[0]) == view.pick_key(joined.iloc[0]) and alone.site[0] != joined.site[0]
    # ... and as a call that began earlier joins it (the merged finding's first step moves back)
    later = view.merge_calls(pd.DataFrame([finding(1, 2, 3)]))
    earlier = view.merge_calls(pd.DataFrame([finding(1, 2, 3), finding(0, 1, 4)]))
    assert view.picked_row(earlier, view.pick_key(later.iloc[0])) == 0 and earlier.step[0] == 1


def test_a_pick_stays_on_the_episode_picked_where_the_same_finding_held_twice_at_a_site():
    """Two episodes of one finding at one site (steps 1-4, again at 8-10: the newer listed first): the page's note
    and the re-pick after a tick keep the one picked, not the first row of that finding and site."""
    frame = view.merge_calls(pd.DataFrame([finding(0, 8, 10), finding(0, 1, 4), finding(1, 20, 30)]))
    assert frame[["step", "last_step"]].values.tolist() == [[8, 10], [1, 4], [20, 30]]
    older = view.pick_key(frame.iloc[1])
    assert view.pick_key(frame.iloc[0]) != older and view.picked_row(frame, older) == 1
    assert view.picked_row(frame, None) is None and view.picked_row(frame.iloc[[0, 2]], older) is None

    class Found:  # (a live run's findings: the run page reads their frame and how many steps they judged)
        error = None
        fed = 30

        def frame(self, listed=()):
            return frame

        def flush(self, timeout=None):
            return True

    run = type("Run", (), {"findings": Found(), "running": False, "intervention_frame": lambda self: None})()
    note, _table = view.page_findings(run, {"findings_pick": older})
    assert "**saturated** at `rnn.cell#0 out.0`, step 1–4" in note and "step 8–10" not in note


def test_a_merged_finding_of_a_container_called_several_times_focuses_its_sites():
    """A container whose output is its last child's is shown under the child: each call of it is found."""
    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

        def forward(self, x):
            for _ in range(3):
                x = self.cell(x)
            return x

    model, runview = Loop(), RunView()
    with workbench.watch(model) as w:
        w.subscribe(runview.feed)
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            w.step()
        w.recorder.flush()
    frame = view.merge_calls(pd.DataFrame([finding(c, module="cell", tensor="out", name=f"cell#{c}")
                                           for c in range(3)]))
    assert frame.site.tolist() == ["cell (calls 0–2)"]
    target = view.focus(frame, 0, runview)
    assert target.sites == ("cell.1#0", "cell.1#1", "cell.1#2") and target.site == "cell.1#0"
    assert set(target.sites) <= set(runview.site_order("activation"))
    assert view.focus(frame, 0).sites == ("cell#0", "cell#1", "cell#2")  # (no views: the diagnosis' names)


@pytest.fixture
def manager(tmp_path):
    from workbench.ui.runs import RunManager

    manager = RunManager(tmp_path / "runs")
    try:
        yield manager
    finally:
        manager.close()


def test_the_run_page_lists_a_live_runs_findings_and_a_click_focuses_its_views(manager, monkeypatch):
    """A run of the app whose training puts log(0) into layers.1 from step 3: the page's tick sends
    the list (once: nothing when it has not changed), a click on its row moves the views there."""
    import gradio as gr

    from workbench.experiments.activation_mlp import ActivationMLP
    from workbench.ui import live_run, run_page

    train_step = ActivationMLP.train_step

    def poisoned(self):
        if self.step_count == 2:
            self.watcher.patch("layers.1", torch.log)  # (the ReLU's zeros: -inf)
        return train_step(self)

    monkeypatch.setattr(ActivationMLP, "train_step", poisoned)
    run, message = live_run.start_run(manager, "activation_mlp", {"width": "8", "depth": "2", "batch_size": "16",
                                                             "n_samples": "64", "activation": "relu"},
                                  0, 5, 1, True, "*", "poisoned")
    assert run is not None, message
    run.join(60)
    state = run_page.new_page_state()
    wait_for(lambda: view.run_findings(run).diagnoser.flush() and not view.run_findings(run).frame().empty)
    note, table = view.page_findings(run, state)
    assert "error" in note and table.finding.iloc[0] == "nan_origin" and table.site.iloc[0] == "layers.1"
    assert table.steps.iloc[0] == "3–5" and table.evidence.iloc[0].startswith("46 Inf of 128 values in the output")
    assert table.evidence.iloc[0] == view.run_findings(run).frame().evidence.iloc[0]  # (whole: the page wraps it)
    assert all(isinstance(u, type(gr.skip())) for u in view.page_findings(run, state))  # nothing new: nothing sent
    expected = diagnose(*run.frames())
    pd.testing.assert_frame_equal(view.run_findings(run).frame(), view.merge_calls(expected))

    values = [None, 0.0, False, "grad_output", "norm", None, False, None, "grad_output", "norm", True]
    assert len(values) == len(run_page.CONTROLS)
    state, *updates, note, statistic, _list = view.focus_page(run, run.id, "header", state, values, 0)
    assert statistic == "nan_count"  # (the page's statistic picker is set to it)
    out = dict(zip(run_page.VIEW_OUTPUTS, updates))
    assert "**nan_origin** at `layers.1`, step 3–5" in note and "*What to try:*" in note
    assert note == view.page_findings(run, {**state, "findings": {}})[0]  # the tick keeps it in the note
    assert out["kind"] == "activation" and out["heat_kind"] == "activation"
    assert out["sites"].value == ["layers.1"] and not state["auto_sites"]
    series = json.loads(out["series"].plot)
    assert series["layout"]["title"]["text"].startswith("activation: nan_count")
    assert [t["name"] for t in series["data"] if "lines" in t.get("mode", "")] == ["layers.1"]
    assert series["layout"]["shapes"][-1]["x0"] == 3 and series["layout"]["shapes"][-1]["x1"] == 5
    # the next tick sends nothing new (the focus stays drawn until new steps arrive)
    skipped = run_page.redraw(run.view, "header", run.id, state, values, force=False)[1:]
    assert len(skipped) == len(run_page.VIEW_OUTPUTS) and all(isinstance(u, type(gr.skip())) for u in skipped)
    with pytest.raises(IndexError, match="No finding number 7"):
        view.focus_page(run, run.id, "header", state, values, 7)


def test_the_dashboards_pick_stays_while_its_finding_goes_on():
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 2)
    y = (x[:, 0] > 0).long()
    w = workbench.watch(model)
    dash = Dashboard(w, interval=0.05)

    def steps(n):
        for _ in range(n):
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
        w.recorder.flush()
        dash.refresh()

    steps(4)
    dead = next(i for i, o in enumerate(dash.findings_list.options) if "dead_units" in o)
    dash.findings_list.index = dead
    assert "step 1–4" in dash.findings_list.value
    steps(2)  # its label changes (the steps it held grew): still the one picked, its detail shown
    assert dash.findings_list.value.startswith("⚠ dead_units at layers.1, step 1–6")
    assert "dead_units" in dash.findings_detail.value and "step 1–6" in dash.findings_detail.value
    w.close()
    dash.close()


def test_a_stored_runs_findings_are_listed_and_focus_its_replayed_views(tmp_path):
    from workbench.ui import run_page, stored_runs
    from workbench.ui.runs import RunsRoot

    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)
    train(model, steps=4, store=tmp_path / "runs" / "dead")
    cache = stored_runs.ViewCache(RunsRoot(tmp_path / "runs"))
    note, table = view.stored_findings(cache, "dead")
    run = workbench.load_run(tmp_path / "runs" / "dead")
    expected = diagnose(run.to_pandas(), run.metrics())
    assert "warning" in note and table.finding.tolist() == expected.finding.tolist()
    none_note, none_table = view.stored_findings(cache, "")  # (no run open)
    assert none_note == "" and none_table.empty and list(none_table.columns) == view.TABLE_COLUMNS

    class Event:
        index = (int(expected.index[expected.finding == "dead_units"][0]), 0)

    def find(pick):
        replayed, _run, message = cache.get(pick)
        return replayed, "header", pd.DataFrame()

    values = [None, 0.0, False, "grad_output", "norm", None, False, None, "grad_output", "norm", True]
    state, *updates, note, statistic, _list = view.stored_select_handler(cache, find)("dead", None, *values, Event())
    out = dict(zip(run_page.VIEW_OUTPUTS, updates))
    assert statistic == "zero_frac" and out["kind"] == "activation" and out["sites"].value == ["layers.1"]
    assert "**dead_units** at `layers.1`, step 1–4" in note


def test_findings_while_an_intervention_was_on_name_it(broken):
    """Zeroing a layer's units makes them dead: the list says which intervention was on, so a finding of
    its doing does not read as the model's problem."""
    _, frame = broken
    first, since = frame.iloc[0], int(frame.step.min())
    interventions = pd.DataFrame([
        {"id": "i1", "site": "layers.2", "intervention": "zero all units", "from step": since,
         "to step": "", "status": "on"},  # (on still: no last step)
        {"id": "i2", "site": "layers.0", "intervention": "scale by 2", "from step": 1000, "to step": 1001,
         "status": "removed"},  # (after every finding)
        {"id": "i3", "site": "layers.0", "intervention": "scale by 3", "from step": since + 1, "to step": since,
         "status": "removed"}])  # (taken out before the step it was to start at: never on)
    marked = view.during_interventions(frame, interventions)
    assert marked.iloc[0].evidence == (f"While i1 zero all units at layers.2 (from step {since}, still on) was on: "
                                       + first.evidence)
    assert set(marked.interventions) == {"i1"} and not {"i2", "i3"} & set("".join(marked.evidence).split())
    assert f"{len(frame)} of them held while an intervention was on" in view.findings_summary(marked)
    unmarked = view.during_interventions(frame, None)
    assert unmarked.evidence.tolist() == frame.evidence.tolist() and "intervention" not in view.findings_summary(
        unmarked)


def test_a_cause_is_not_merged_with_its_consequences_at_the_other_calls_of_its_module():
    """Exploding gradients found first at call 1 of an unrolled module, then at its call 0 as a consequence: the
    calls merged into one row under call 0's, whose cause named call 1's row, which was gone; the list showed two
    consequences of no row and its summary counted no finding ("**Diagnoses:** .") until 2026-11-29. The cause
    keeps its row; its consequences, merged by call among themselves, fold under it, counted a finding a call as its
    evidence names them (3: the two calls' rows merged into one, and the loss's)."""
    went_wrong = ("The run went wrong from here: 3 findings began at step 3 or later, its consequences: "
                  "exploding_gradients at dyn.act#0 out.0, step 4–9; exploding_gradients at dyn.act#2 out.0, step "
                  "4–8; loss_spike at loss, step 5–9.")
    cause = "exploding_gradients at dyn.act#1 out.0"

    def grad(call, step, last_step, cause="", evidence="e", consequences=0):
        return dict(finding(call, step, last_step, module="dyn.act"), finding="exploding_gradients", kind="grad_output",
                    severity="error", cause=cause, evidence=evidence, consequences=consequences)

    frame = pd.DataFrame([grad(1, 3, 9, evidence=f"e1. {went_wrong}", consequences=3), grad(0, 4, 9, cause),
                          grad(2, 4, 8, cause), dict(grad(0, 5, 9, cause), finding="loss_spike", kind="metric",
                                                     module="loss", site="loss", tensor="", call=0)])
    shown = view.merge_calls(frame)
    assert shown[["site", "cause", "folded"]].values.tolist() == [["dyn.act#1 out.0", "", 3]]
    assert shown.evidence[0] == f"e1. {went_wrong}"  # (as diagnose wrote it, naming each call's own finding)
    assert view.findings_summary(shown).startswith("**Diagnoses:** ✖ 1 error, and 3 consequences of it folded")
    listed = view.merge_calls(frame, view.toggled((), shown.iloc[0]))
    assert listed.site.tolist() == ["dyn.act#1 out.0", "dyn.act out.0 (calls 0, 2)", "loss"]


def test_a_pick_draws_the_metrics_on_the_scales_the_page_kept(tmp_path):
    """A page that left the metrics' panels to choose their scale keeps each once settled (a linear loss at its
    first steps stays linear when it spikes later); a pick of a finding drew them on the scale the data chose
    anew, a log y that the next tick took back, until 2026-11-29."""
    from workbench.ui import run_page, stored_runs
    from workbench.ui.runs import RunsRoot

    model = torch.nn.Linear(2, 2)
    values = [None, 0.0, False, "activation", "std", None, False, None, "grad_output", "norm", True]
    cache = stored_runs.ViewCache(RunsRoot(tmp_path / "runs"))
    with workbench.watch(model, store=tmp_path / "runs" / "spiky") as w:
        for step in range(40):
            model(torch.randn(4, 2)).sum().backward()
            w.step(loss=500.0 if step == 20 else 1.0 + 0.01 * (step % 3))
            if step == 9:  # (the page drew its first 10 steps, read while the run records: its loss settled linear)
                w.recorder.flush()
                partial, _run, _message = cache.get("spiky")
                state, *_ = run_page.redraw(partial, "header", "spiky", None, values)
    assert figures.kept_scales(state["kept_log_metrics"], [run_page.recording_of("spiky", partial)])["loss"] is False
    _note, table = view.stored_findings(cache, "spiky")

    class Event:
        index = (table.finding.tolist().index("loss_spike"), 0)

    def find(pick):
        replayed, _run, _message = cache.get(pick)
        return replayed, "header", pd.DataFrame()

    assert figures.metrics_figure(find("spiky")[0], log_y=None)["layout"]["yaxis"]["type"] == "log"  # (chosen anew)
    state, *updates, _note, _statistic, _list = view.stored_select_handler(cache, find)("spiky", state, *values,
                                                                                         Event())
    metrics = json.loads(dict(zip(run_page.VIEW_OUTPUTS, updates))["metrics"].plot)
    assert metrics["layout"]["meta"]["metrics"] == ["loss"] and metrics["layout"]["yaxis"]["type"] == "linear"


def test_a_run_with_no_step_recorded_says_so_rather_than_that_nothing_looked_wrong(tmp_path):
    """A run that ended before its first step said "Diagnoses: nothing looked wrong in this run." in the notebook
    and the app: nothing had been judged. The one summary says no step was recorded, live and once ended."""
    from workbench.ui import stored_runs
    from workbench.ui.runs import RunsRoot

    w = workbench.watch(mlp("relu"), store=tmp_path / "runs" / "empty")
    dash = Dashboard(w, interval=3600)
    assert "no step recorded yet" in dash.findings_summary.value
    w.close()
    dash.refresh()
    assert "this run recorded no step" in dash.findings_summary.value
    assert "nothing looked wrong" not in dash.findings_summary.value
    stored = Dashboard(workbench.load_run(tmp_path / "runs" / "empty"))  # (the notebook, replayed)
    assert "this run recorded no step" in stored.findings_summary.value
    note, table = view.stored_findings(stored_runs.ViewCache(RunsRoot(tmp_path / "runs")), "empty")  # (the app)
    assert note == "**Diagnoses:** none: this run recorded no step." and table.empty
    # a run with steps and no finding still says nothing looked wrong
    assert view.findings_summary(view.stored_frame(workbench.load_run(tmp_path / "runs" / "empty")),
                                 running=False, steps=3) == "**Diagnoses:** nothing looked wrong in this run."


def test_a_run_recorded_again_at_its_path_lists_its_own_findings_not_the_old_runs(tmp_path):
    # a run recorded again where an old one was removed (the script run again), as many steps and ended alike: the
    # Runs tab's list kept the old run's findings, by its path, steps and status, under the new run's views, until
    # 2026-11-29's review (the views' cache was keyed by the start time too; the findings' was not)
    import shutil

    from tests.diagnose.runs import diverging_mlp, mlp_on_halves
    from workbench.ui import stored_runs
    from workbench.ui.runs import RunsRoot

    diverging_mlp(store=tmp_path / "runs" / "again")
    cache = stored_runs.ViewCache(RunsRoot(tmp_path / "runs"))
    _note, hot = view.stored_findings(cache, "again")
    assert "update_ratio_high" in set(hot.finding)
    shutil.rmtree(tmp_path / "runs" / "again")
    mlp_on_halves(0.05, updates=True, store=tmp_path / "runs" / "again")
    run = workbench.load_run(tmp_path / "runs" / "again")
    assert (len(run.steps), run.status) == (40, "finished")
    _note, calm = view.stored_findings(cache, "again")
    expected = view.merge_calls(run.diagnose())
    assert calm.finding.tolist() == expected.finding.tolist() and "update_ratio_high" not in set(calm.finding)
