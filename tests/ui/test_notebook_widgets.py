"""The notebook widgets, driven as a user would (set values, click), and background runs."""

import json
import re
import time

import pytest
import torch

import workbench
from workbench.ui import figures
from workbench.ui.notebook import FIGURES, PLOTLY_MIMETYPE, Dashboard, ModelBrowser


def wait_for(condition, timeout=120.0, what="the condition"):
    """Poll until ``condition()`` holds (a generous bound; no test depends on a duration)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------ model browser
def test_filter_select_fill_and_build():
    browser = ModelBrowser()
    browser.family.value = "activation"
    assert "mlp" not in browser.models.options and "prelu" in browser.models.options
    browser.pattern.value = "prelu"
    assert browser.models.options == ("prelu",) and browser.models.value == "prelu"
    assert "Parametric ReLU" in browser.overview.value
    labels = [w.description for w in browser.form.children]
    assert labels == ["num_parameters", "init"]
    browser.form.children[0].value = "3"  # (a box's text, as the page sends what is typed)
    browser.batch_size.value = "4"
    browser.build_button.click()
    assert browser.result.ok and browser.model.weight.shape == (3,)
    assert browser.result.tree["output"].iloc[0] == "(4, 3, 5)"
    assert "Built <strong>prelu</strong>" in browser.message.value


def test_typing_a_filter_keeps_the_model_picked_while_it_matches_and_never_drops_its_form_unsaid():
    """Each keystroke in the filter moved the selection to the first match: the form under it turned into
    another model's while the user typed, and what they had typed into it was gone."""
    browser = ModelBrowser()
    browser.models.value = "mlp"
    form = {box.description: box for box in browser.form.children}
    form["width"].value, form["activation"].value = "16", "tanh"
    for typed in ("m", "ml", "mlp"):  # (a change per keystroke)
        browser.pattern.value = typed
        assert browser.models.value == "mlp" and "MLP" in browser.overview.value
        assert list(browser.form.children) == list(form.values())
        assert (form["width"].value, form["activation"].value) == ("16", "tanh")
    browser.pattern.value = "mlpx"  # (a typo: no model matches, none shown)
    assert browser.models.value is None and browser.form.children == ()
    assert "width=16" in browser.message.value and "activation='tanh'" in browser.message.value
    browser.pattern.value = "mlp"  # (undone: the model and its form as they were)
    assert browser.models.value == "mlp" and list(browser.form.children) == list(form.values())
    assert form["width"].value == "16" and browser.message.value == ""
    browser.pattern.value = ""
    browser.models.value = "mlp"
    assert browser.models.value == "mlp" and form["width"].value == "16"  # (still: the list widened around it)
    browser.pattern.value = "lu"  # (mlp hidden: the first match shown, and the user told where the values are)
    assert browser.models.value == "gelu" and [box.description for box in browser.form.children] == ["approximate"]
    said = browser.message.value
    assert "The filter hid <strong>mlp</strong>; the form shows <strong>gelu</strong>" in said, said
    assert "Kept as you typed them: <strong>mlp</strong> (width=16, activation='tanh')" in said, said
    assert "Pick a model again to get its values back" in said, said
    browser.pattern.value = "t"  # (gelu hidden in turn, typing on: mlp's values still said to be kept)
    assert browser.models.value == "efficientzero_dynamics" and "<strong>mlp</strong> (width=16" in (
        browser.message.value), browser.message.value
    browser.pattern.value = ""
    browser.models.value = "mlp"  # (picked again: its form as it was left, and built with it)
    assert list(browser.form.children) == list(form.values()) and browser.message.value == ""
    assert browser.build().ok and browser.model.layers[0].out_features == 16
    assert type(browser.model.layers[1]).__name__ == "Tanh"


def test_invalid_value_shows_message_and_keeps_previous_model():
    browser = ModelBrowser(pattern="mlp")
    good = browser.build()
    assert good.ok and "layers.0" in browser.output.outputs[0]["data"]["text/html"]  # (its module tree)
    bad = browser.build(depth=0)
    assert not bad.ok and "must lie in [1, 32], got 0" in browser.message.value
    assert browser.model is good.model
    assert browser.output.outputs == ()  # (the message alone: no empty module table under it)


def test_build_reads_the_values_given_as_the_form_does_a_typo_or_a_value_its_box_would_bend_is_the_message():
    browser = ModelBrowser(pattern="mlp")
    good = browser.build(width="16", depth=3)  # (typed as a person types them)
    assert good.ok and [layer.out_features for layer in good.model.layers[:-1:2]] == [16, 16, 16]
    assert {box.description: box.value for box in browser.form.children}["width"] == "16"  # (the form shows it)
    for values, said in [({"dept": 3}, "has no parameter 'dept'; did you mean 'depth'? Its parameters: "),
                         ({"width": 2.5}, "width expects int, could not read 2.5: not a whole number"),  # (was 2)
                         ({"depth": "three"}, "depth expects int, could not read 'three'")]:  # (was a TraitError)
        result = browser.build(**values)
        assert not result.ok and said in result.message and said in browser.message.value, result.message
        assert browser.model is good.model


def test_a_number_box_holds_what_was_typed_and_build_refuses_what_is_no_whole_number():
    """An int field's box was an IntText, whose page cut what it was given to a whole number: 2.5 pasted
    was built as 2 while the box showed 2.5. Its boxes hold the number typed; build names the field."""
    browser = ModelBrowser(pattern="mlp")
    form = {box.description: box for box in browser.form.children}
    form["width"].value = "2.5"  # (typed or pasted)
    result = browser.build()
    assert not result.ok and "width expects int, could not read '2.5': not a whole number" in browser.message.value
    form["width"].value = "16"
    browser.batch_size.value = "2.5"
    result = browser.build()
    assert not result.ok and "example batch size must be a positive whole number, got '2.5'" in result.message
    browser.batch_size.value = "3"
    assert browser.build().ok and browser.model.layers[0].out_features == 16
    assert browser.result.tree["output"].iloc[0] == "(3, 2)"


def test_the_form_shows_the_values_a_build_used_however_they_were_written():
    """A value the form reads but its box cannot hold as written ("16.0" in a whole-number box) was built
    while the box kept its old value: the form said width 32 of a model 16 wide."""
    browser = ModelBrowser(pattern="mlp")
    result = browser.build(width="16.0", activation="relu")
    assert result.ok and result.model.layers[0].out_features == 16
    form = {box.description: box.value for box in browser.form.children}
    assert (form["width"], form["activation"]) == ("16", "relu")
    assert (result.values["width"], result.values["activation"]) == (16, "relu")  # (what it was built with)
    browser = ModelBrowser(pattern="efficientzero_dynamics")  # (text boxes: lists written as Python writes them)
    result = browser.build(fc_reward_layers="[16,8]")
    assert result.ok, result.message
    assert {box.description: box.value for box in browser.form.children}["fc_reward_layers"] == "16, 8"
    browser.form.children[0].value = "3, 8, 8"  # (then built with what the form holds)
    assert browser.build().ok and browser.result.values["observation_shape"] == [3, 8, 8]


def test_a_bad_batch_size_is_named_as_its_box_is_labelled():
    """The messages said "example batch size" of the box labelled "batch size"."""
    browser = ModelBrowser(pattern="mlp")
    for value, said in [(0, "must be a positive whole number, got 0"), (10**6, "must be at most 4096")]:
        browser.batch_size.value = str(value)
        result = browser.build()
        assert not result.ok and f"**Could not build the model.** {browser.batch_size.description} {said}" in (
            result.message), result.message


def test_an_unknown_family_is_refused_with_the_families_and_none_is_every_family():
    with pytest.raises(ValueError, match=r"ModelBrowser: no family 'activations'; did you mean 'activation'\? "
                                         r"The families are \['activation', "):
        ModelBrowser(family="activations")  # (was ipywidgets' TraitError: "Invalid selection: value not found")
    browser = ModelBrowser(family=None)
    assert browser.family.value == "all" and len(browser.models.options) == len(workbench.list_models())
    with pytest.raises(TypeError, match=r"ModelBrowser: pattern is the name filter, text such as 'lu' or '\*lu' "
                                        r"\(or '' for every model\), got 3 \(int\)"):
        ModelBrowser(pattern=3)  # (was ipywidgets' TraitError: "expected a unicode string, not the int 3")
    assert ModelBrowser(pattern=None).models.options == browser.models.options


def test_a_forms_boxes_line_up_whatever_its_labels():
    browser = ModelBrowser(pattern="efficientzero")  # (labels of 5 to 35 characters)
    widths = {widget.style.description_width for widget in [*browser.form.children, browser.batch_size]}
    longest = max(len(widget.description) for widget in browser.form.children)
    assert len(widths) == 1 and float(widths.pop().removesuffix("em")) >= 0.6 * longest


@pytest.mark.parametrize("name", ["gelu", "threshold", "prelu", "sigmoid"])
def test_formulas_reach_mathjax_as_written(name):
    browser = ModelBrowser(pattern=name)
    browser.models.value = name
    formula = workbench.get_spec(name).formula
    shown = browser.overview.value
    # the TeX as the specification wrote it (HTML-escaped, which the browser undoes): \, and \\ kept
    escaped = formula.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"$$ {escaped} $$" in shown
    if name == "gelu":
        assert r"0.5\,x\," in shown
    if name == "threshold":
        assert r"\begin{cases}" in shown and r" \\ " in shown


# ------------------------------------------------------------------ background runs
def test_a_background_run_returns_at_once_pauses_resumes_and_stops_between_steps(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    run = exp.start(100_000, store=tmp_path / "run")
    assert run.status == "running" and not run.done
    wait_for(lambda: run.step >= 3, what="three steps")
    assert run.pause() == "paused"  # returns when the step in progress has ended
    paused_at = run.step
    assert run.join(timeout=0.2) == "paused" and run.step == paused_at  # no step while paused
    run.resume()
    wait_for(lambda: run.step > paused_at, what="steps after resume")
    assert run.stop() == "stopped" and run.done
    stored = workbench.load_run(tmp_path / "run")
    assert stored.status == "stopped" and "stopped by the user" in stored.metadata["error"]
    rows = stored.to_pandas()
    per_step = rows.groupby("step").size()
    assert per_step.nunique() == 1 and per_step.index.max() == run.step  # every step whole, the last included
    assert len(run.history) == run.step and exp.watcher.closed


def test_a_failing_step_fails_the_run_and_its_store(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    step = exp.train_step
    exp.train_step = lambda: step() if exp.step_count < 3 else 1 / 0
    run = exp.start(10, store=tmp_path / "run")
    assert run.join() == "failed" and "ZeroDivisionError" in run.error and run.step == 3
    stored = workbench.load_run(tmp_path / "run")
    assert stored.status == "failed" and "ZeroDivisionError" in stored.metadata["error"]
    # the dashboard's header says why in short, as the app's run page: the traceback folded under it
    dash = Dashboard(run)
    assert "<pre><code>ZeroDivisionError: division by zero\n</code></pre>" in dash.header.value
    assert "<summary>traceback</summary>" in dash.header.value and "Traceback (most recent" in dash.header.value
    dash.close()
    # and a comparison's message, as the app's
    from workbench.ui.notebook import Compare

    other = workbench.experiments.create("activation_mlp", seed=1, width=8).start(2)
    other.join()
    compare = Compare(run, other)
    assert "failed: <code>ZeroDivisionError: division by zero</code>." in compare.message_html.value
    assert "Traceback" not in compare.message_html.value
    compare.close()


def test_an_experiment_training_in_the_background_refuses_another_run():
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    run = exp.start(100_000)
    try:
        for call in (lambda: exp.run(1), lambda: exp.start(1)):
            with pytest.raises(RuntimeError, match=r"training in the background.*\.stop\(\)"):
                call()
    finally:
        run.stop()
    assert len(exp.run(2, progress=False)) == 2  # once it stopped, the experiment is free again


@pytest.mark.parametrize("bad, error, match", [
    (dict(steps=-1), ValueError, "steps must be a non-negative int, got -1"),
    (dict(steps=2.5), ValueError, "got 2.5"),
    (dict(steps=5, progress="yes"), TypeError, "progress must be True or False, got 'yes'"),
    (dict(steps=5, evry=2), TypeError, "evry"),
])
def test_start_refuses_bad_input_by_name(bad, error, match):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    with pytest.raises(error, match=match):
        exp.start(**bad)
    assert exp.background is None and exp.step_count == 0


def test_join_refuses_a_negative_timeout():
    run = workbench.experiments.create("activation_mlp", seed=0, width=8).start(1)
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0, got -1"):
        run.join(-1)
    assert run.join() == "finished"


# ------------------------------------------------------------------ progress bars
def test_run_shows_a_progress_bar_unless_asked_not_to(capsys):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    exp.run(3, progress=True)
    err = capsys.readouterr().err
    assert "activation_mlp" in err and "3/3" in err and "loss" in err
    exp.run(3, progress=False)
    exp.run(3)  # default: only where it can be seen (stderr here is not a terminal)
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="progress must be True, False or None .*got 'no'"):
        exp.run(3, progress="no")


# ------------------------------------------------------------------ dashboard
def plotted(dash, name):
    """What the page was sent for a figure (the widget's output), with its arrays decoded."""
    out = {"metrics": dash.metrics_plot, "sites": dash.sites_plot, "heatmap": dash.heatmap_plot,
           "distribution": dash.distribution_plot}[name]
    return out.outputs[0]["data"][PLOTLY_MIMETYPE]


def loss_trace(figure):
    """The line of the loss in a metrics figure."""
    (trace,) = [t for t in figure["data"] if t.get("name") == "loss"]
    return trace


def test_the_dashboard_of_a_background_run_updates_live_and_its_buttons_act(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    run = exp.start(100_000, store=tmp_path / "run", every=2, histograms=True)
    dash = Dashboard(run, interval=0.05)
    header, buttons = dash.widget.children[0].children
    assert header is dash.header and [b.description for b in buttons.children] == ["Pause", "Resume", "Stop"]
    closed = ("sites", "heatmap", "distribution")
    first_sent = {name: plotted(dash, name) for name in closed}  # (every figure, once)

    def drawn_up_to():
        loss = [t for t in plotted(dash, "metrics")["data"] if t.get("name") == "loss"]  # ("No metrics yet": none)
        return int(figures.values(loss[0]["x"]).max(initial=0)) if loss else 0

    wait_for(lambda: drawn_up_to() >= 6, what="a redraw with six steps")
    first = drawn_up_to()
    wait_for(lambda: drawn_up_to() > first, what="a later redraw while training runs")
    metrics = plotted(dash, "metrics")
    assert {t.get("name") for t in metrics["data"]} - {None} == {"loss", "accuracy"}
    # then the page is sent the open figure only: the others when their tab opens
    assert dash.open_figure == "metrics"
    wait_for(lambda: drawn_up_to() > first + 4, what="more redraws")
    assert {name: plotted(dash, name) for name in closed} == first_sent
    for tab, name in enumerate(("sites", "heatmap", "distribution"), start=1):
        dash.tabs.selected_index = tab
        # drawn when opened, from what arrived (histograms recorded: the distribution over time)
        assert plotted(dash, name)["data"] and dash.open_figure == name
    dash.tabs.selected_index = 0
    assert dash.sites.value and set(dash.sites.value) <= set(dash.sites.options)

    dash.pause_button.click()
    # (the buttons' states too: a tick that read "running" just before the click may set them after it)
    wait_for(lambda: run.status == "paused" and "paused" in dash.header.value and dash.pause_button.disabled
             and not dash.resume_button.disabled)
    run.pause()  # (the button asks without waiting: this returns once the step in progress has ended)
    wait_for(lambda: dash.view.steps_fed == run.step, what="the last step before the pause")
    ticks = dash.ticks
    wait_for(lambda: dash.ticks >= ticks + 2, what="two ticks, to draw what arrived")
    drawn, ticks = dash.draws, dash.ticks
    wait_for(lambda: dash.ticks >= ticks + 3, what="three more ticks")
    assert dash.draws == drawn  # nothing new arrived: no redraw
    dash.resume_button.click()
    wait_for(lambda: run.status == "running" and dash.draws > drawn)
    dash.stop_button.click()
    assert run.join() == "stopped"
    wait_for(lambda: "stopped" in dash.header.value and dash.view.header()["step"] == run.step)
    assert dash.stop_button.disabled and dash.pause_button.disabled
    assert dash.stop_button.button_style == ""  # (greyed out: not red)
    assert workbench.load_run(tmp_path / "run").status == "stopped"
    # its findings are of a run that ended ("looked", not "so far"), drawn as it ended
    wait_for(lambda: "in this run" in dash.findings_summary.value, what="the findings of the ended run")


def test_opening_the_call_sites_tab_draws_its_list_anew_scrolled_to_the_sites_drawn():
    """The sites drawn by default were picked while the call sites' tab was hidden: opened, its list showed
    its first rows, the sites picked out of sight below (ipywidgets picks in a list without scrolling it). The
    list is drawn anew when the tab opens, which a browser scrolls to what is picked (tests/ui/test_jupyterlab
    checks the scrolling in a page)."""
    exp = workbench.experiments.create("activation_mlp", seed=0, depth=12, width=8)
    w = exp.watch()
    exp.run(2, progress=False)
    w.close()
    dash = Dashboard(w)
    row = dash.tabs.children[FIGURES.index("sites")].children[0]  # (the tab's row of controls)
    assert dash.sites in row.children
    rows_sent = []
    row.observe(lambda change: rows_sent.append(dash.sites in change["new"]), names="children")
    dash.tabs.selected_index = FIGURES.index("heatmap")
    assert rows_sent == []  # (another tab: the list left as it is)
    dash.tabs.selected_index = FIGURES.index("sites")
    assert rows_sent == [False, True]  # (taken out of its row and put back: drawn anew)
    assert dash.sites.value == tuple(dash.view.default_sites("activation", "std"))  # (its picks kept)


def test_a_dashboard_says_which_other_runs_train_in_the_kernel_while_its_run_trains():
    """A cell that starts a run and shows its Dashboard, run again, left the first run training unseen (its
    Dashboard gone), the two sharing the CPU without a word. The header names the others while its run trains."""
    first = workbench.experiments.create("activation_mlp", seed=7, width=8).start(1_000_000)
    again = workbench.experiments.create("activation_mlp", seed=8, width=8).start(1_000_000)
    dash = Dashboard(again, interval=0.05)
    try:
        wait_for(lambda: "Also training in this kernel: activation_mlp (seed 7) at step" in dash.header.value,
                 what="the header naming the other run")
        assert "activation_mlp (seed 8) at step" not in dash.header.value  # (not its own run)
        assert "<code>workbench.experiments.running()</code> lists them" in dash.header.value
        first.pause()  # (named still, as paused: it takes no share of the CPU, and may be resumed)
        wait_for(lambda: re.search(r"activation_mlp \(seed 7\) at step \d+ \(paused\)", dash.header.value),
                 what="the other run named as paused")
        first.stop()
        wait_for(lambda: "Also training" not in dash.header.value, what="the note gone with the other run")
    finally:
        first.stop()
        again.stop()
    wait_for(lambda: not dash.following and "stopped" in dash.header.value, what="the run's last draw")
    assert "Also training" not in dash.header.value


def test_the_end_of_a_run_stopped_by_its_button_stays_drawn():
    """The button's own redraw of the header ("stopping") never lands after the run's last draw."""
    import threading

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    run = exp.start(100_000)
    dash = Dashboard(run, interval=0.05)
    wait_for(lambda: dash.view.steps_fed > 0, what="a first step")
    set_status = dash.view.set_status

    def preempted(status, error=None):  # the button's thread, held up between reading the status and drawing it
        if status == "stopping" and threading.current_thread() is threading.main_thread():
            run.join(timeout=2.0)  # (the run ends meanwhile; its last draw waits for the button's, if it can)
        set_status(status, error)

    dash.view.set_status = preempted
    dash.stop_button.click()
    assert run.join() == "stopped"
    wait_for(lambda: not dash.following, what="the run's last draw")
    assert "<code>stopped</code>" in dash.header.value and dash.view.header()["step"] == run.step


def test_the_controls_choose_what_is_drawn(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    run = exp.start(12, histograms=True)
    dash = Dashboard(run, interval=0.05)
    run.join()
    wait_for(lambda: dash.view.header()["status"] == "finished" and dash.view.steps_fed == 12)
    dash.refresh()
    assert all(plotted(dash, name) == dash.figure(name) for name in ("metrics", "sites", "heatmap", "distribution"))
    assert dash.sites.value == tuple(dash.view.default_sites("activation", "std"))
    assert "5 of 5 activation call sites" in dash.site_note.value
    dash.tabs.selected_index = 1  # the call sites' figure, open: its controls redraw it
    dash.sites.value = ("layers.1",)
    assert [t["name"] for t in plotted(dash, "sites")["data"] if t.get("name")] == ["layers.1"]
    assert "1 of " in dash.site_note.value and "(as picked): <code>layers.1</code>" in dash.site_note.value
    dash.log_sites.value = True  # (a site far above the others squashes them: each figure has its log y)
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "log"
    assert plotted(dash, "metrics")["layout"]["yaxis"]["type"] == "linear"
    assert "NaN / Inf:</b> none in this run." in dash.anomalies.value  # (not "so far": it ended)
    # a line each, not a paragraph (its margins left blank bands between the header, findings and tabs)
    assert "<p>" not in dash.header.value and "<p>" not in dash.findings_summary.value
    dash.refresh()  # a user's choice stays through redraws
    assert dash.sites.value == ("layers.1",)
    dash.sites.value = ("layers.4",)  # the network's output: its container and the model return it too
    assert "<code>layers.4</code> is the tensor <code>layers</code> and <code>(model)</code> return too" \
        in dash.site_note.value
    dash.kind.value = "param_grad"  # another kind: its own default sites
    assert all(site.endswith((".weight", ".bias")) for site in dash.sites.value)  # (as named_parameters() names)
    assert not plotted(dash, "heatmap")["layout"]["title"]["text"].startswith("param_grad")  # (its tab closed)
    dash.tabs.selected_index = 2  # opened: drawn as the controls say
    assert plotted(dash, "heatmap")["layout"]["title"]["text"].startswith("param_grad")
    dash.tabs.selected_index = 0
    dash.log_y.value = True
    assert plotted(dash, "metrics")["layout"]["yaxis"]["type"] == "log"
    dash.smoothing.value = 0.5
    assert any("smoothed" in t["name"] for t in plotted(dash, "metrics")["data"])
    dash.tabs.selected_index = 3
    dash.distribution_site.value = dash.distribution_site.options[0]
    assert plotted(dash, "distribution")["data"]


def test_a_figure_that_cannot_be_drawn_says_why_in_its_tab_and_the_others_draw_on(monkeypatch):
    """A figure drawn from a tab's click (or the timer) that raised sent its error to no cell: the tab stayed
    blank and nothing said why. Its tab shows the error with its traceback; the other figures draw on."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch()
    exp.run(3, progress=False)
    w.close()
    dash = Dashboard(w)

    def broken(*args, **kwargs):
        raise RuntimeError("the heatmap broke")

    monkeypatch.setattr(figures, "heatmap_figure", broken)
    dash.tabs.selected_index = 2  # (the heatmap's tab, clicked)
    shown = dash.heatmap_plot.outputs
    assert len(shown) == 1 and shown[0]["output_type"] == "error", shown
    said = "\n".join(shown[0]["traceback"])
    assert said.startswith("The heatmap figure could not be drawn") and "RuntimeError: the heatmap broke" in said
    with pytest.raises(RuntimeError, match="the heatmap broke"):
        dash.figure("heatmap")
    dash.tabs.selected_index = 0  # (the others draw on)
    assert plotted(dash, "metrics")["data"]
    monkeypatch.undo()  # (mended: drawn again when its tab is opened)
    dash.tabs.selected_index = 2
    assert plotted(dash, "heatmap")["data"] and dash.figure("heatmap") == plotted(dash, "heatmap")


def test_the_dashboards_findings_name_a_patch_of_the_watch_that_was_in_place(tmp_path):
    """Zeroing every unit of a layer with w.ablate makes them dead: the finding says the ablation was in,
    live and in the stored run, which keeps the watch's log."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(histograms=False, store=tmp_path / "run")
    exp.run(2, progress=False)
    ablation = w.ablate("layers.1", list(range(8)))
    exp.run(8, progress=False)
    ablation.remove()
    exp.run(1, progress=False)
    log = w.intervention_log()
    assert log.to_dict("records") == [{"id": "i1", "site": "layers.1", "from step": 3, "to step": 10,
                                       "intervention": "ablate[0, 1, 2, 3, 4, 5, 6, 7]@dim1", "status": "removed"}]
    dash = Dashboard(w)
    dash.refresh()
    dead = [i for i, label in enumerate(dash.findings_list.options) if "dead_units at layers.1," in label]
    assert dead, dash.findings_list.options
    dash.findings_list.index = dead[0]  # (picked, as a person does: its evidence below the list)
    assert "dead_units</b> at <code>layers.1</code>" in dash.findings_detail.value
    # the call sites' tab opened on it, its site drawn there
    assert dash.open_figure == "sites" and dash.sites.value == ("layers.1",)
    assert [t["name"] for t in plotted(dash, "sites")["data"] if t.get("name")] == ["layers.1"]
    assert ("While i1 ablate[0, 1, 2, 3, 4, 5, 6, 7]@dim1 at layers.1 (steps 3–10) was on: "
            in dash.findings_detail.value)
    assert "held while an intervention was on" in dash.findings_summary.value
    assert_shaded(dash, 3, 10)
    w.close()
    stored = workbench.load_run(tmp_path / "run")
    assert stored.interventions().to_dict("records") == log.assign(status="recorded").to_dict("records")
    replay = Dashboard(stored)
    picked = [i for i, label in enumerate(replay.findings_list.options) if "dead_units at layers.1," in label]
    replay.findings_list.index = picked[0]
    assert ("While i1 ablate[0, 1, 2, 3, 4, 5, 6, 7]@dim1 at layers.1 (steps 3–10) was on"
            in replay.findings_detail.value)
    assert_shaded(replay, 3, 10)


def test_the_dashboards_pick_stays_on_the_episode_picked_where_a_finding_held_twice_at_a_site():
    """layers.1 zeroed at steps 1-6 and again at 17-22: dead units there twice, the newer listed first. Picking the
    older kept it through the timer's redraw (it jumped to the newer one, which has the same finding and site)."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(histograms=False)
    for _ in range(2):
        zeroed = w.patch("layers.1", lambda y: y * 0)
        exp.run(6, progress=False)
        zeroed.remove()
        exp.run(10, progress=False)
    w.close()
    dash = Dashboard(w)
    dash.refresh()
    dead = [i for i, label in enumerate(dash.findings_list.options) if "dead_units at layers.1," in label]
    assert [dash.findings_list.options[i].rsplit(", ", 1)[1] for i in dead] == ["step 17–22", "step 1–6"]
    dash.findings_list.index = dead[1]
    assert "step 1–6" in dash.findings_detail.value
    dash.refresh()  # (the timer's redraw)
    assert dash.findings_list.index == dead[1] and "step 1–6" in dash.findings_detail.value


def test_the_findings_muted_text_follows_the_notebooks_theme():
    """Its grey was a fixed #555: in JupyterLab's dark theme "What to try" read dark grey on black."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(histograms=False)
    w.patch("layers.1", lambda y: y * 0)
    exp.run(5, progress=False)
    w.close()
    dash = Dashboard(w)
    muted = "color:var(--jp-content-font-color2, #555)"  # (the theme's second text colour; #555 outside Jupyter)
    assert dash.findings_list.options and "Pick a finding" in dash.findings_detail.value
    assert muted in dash.findings_detail.value
    dash.focus_finding(0)
    assert "What to try" in dash.findings_detail.value and muted in dash.findings_detail.value
    assert "color:#555" not in dash.findings_detail.value


def test_a_dashboard_of_a_watch_stopped_before_its_first_recorded_step_says_so_live_and_replayed(tmp_path):
    # (it read "This run recorded no activation rows.", as if the watch were broken)
    net = torch.nn.Linear(2, 2)
    w = workbench.watch(net, every=10, start_step=5, store=tmp_path / "run")  # (records step 11 first)
    for _ in range(3):
        net(torch.ones(1, 2)).sum().backward()
        w.step(loss=1.0)
    w.close()
    said = ("This run stopped before its first recorded step (step 11 with every=10): it ended at step 7, with "
            "metrics but no rows.")
    for dash in (Dashboard(w), Dashboard(workbench.load_run(tmp_path / "run"))):
        wait_for(lambda: dash.view.steps_fed == 3)
        assert said in json.dumps(dash.figure("sites"))
    with workbench.watch(net, store=tmp_path / "recorded") as w:
        net(torch.ones(1, 2)).sum().backward()
        w.step(loss=1.0)
    from workbench.ui.notebook import Compare

    compare = Compare(tmp_path / "run", tmp_path / "recorded")
    assert "`run` stopped before its first recorded step (step 11 with every=10): the sites of `recorded`" in (
        compare.message)


def assert_shaded(dash, first, last):
    """The intervention's steps are a band over the metrics and the per-site figure; its marker is no panel."""
    metrics = dash.figure("metrics")["layout"]
    assert not any(a["text"].startswith("intervention/") for a in metrics["annotations"])
    for name in ("metrics", "sites"):
        bands = [(s["x0"], s["x1"]) for s in dash.figure(name)["layout"]["shapes"] if s.get("fillcolor") == "#f59e0b"]
        assert bands and set(bands) == {(first - 0.5, last + 0.5)}, (name, bands)


def test_a_dashboard_of_a_watch_follows_runs_in_later_cells_and_a_stored_run_replays(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(store=tmp_path / "run", histograms=False)  # (histograms are on by default)
    exp.run(3, progress=False)  # steps before the dashboard are shown too
    dash = Dashboard(exp, interval=0.05)
    exp.run(4, progress=False)
    wait_for(lambda: dash.view.steps_fed == 7 and dash.view.header()["step"] == 7)
    wait_for(lambda: figures.values(loss_trace(dash.figure("metrics"))["x"]).tolist() == list(range(1, 8)))
    assert dash.widget.children[0].children[1].children == ()  # no buttons: nothing runs in the background
    w.close()
    wait_for(lambda: "finished" in dash.header.value)

    stored = Dashboard(workbench.load_run(tmp_path / "run"))
    assert "finished" in stored.header.value and "step 7" in stored.header.value
    assert figures.values(loss_trace(stored.figure("metrics"))["x"]).tolist() == list(range(1, 8))
    assert stored.figure("distribution")["data"] == []  # (no histograms recorded: says so)
    assert "histograms=False" in str(stored.figure("distribution")["layout"])
    # its path, as Compare takes it: the same dashboard (was a TypeError asking for load_run)
    for path in (tmp_path / "run", str(tmp_path / "run")):
        by_path = Dashboard(path)
        assert by_path.stored is not None and by_path.header.value == stored.header.value
    with pytest.raises(workbench.instrument.RunError, match="nowhere"):
        Dashboard(tmp_path / "nowhere")


def test_a_dashboard_of_a_stored_run_still_being_written_follows_it_to_its_end(tmp_path):
    import threading

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opened, more = threading.Event(), threading.Event()

    def write():  # another writer of the store, on its own thread (its own process works the same)
        with workbench.watch(model, store=tmp_path / "run") as w:
            for step in range(1, 9):
                if step == 4:
                    opened.set()
                    more.wait()
                loss = model(torch.randn(8, 2)).pow(2).mean()
                loss.backward()
                w.step(loss=loss.item())

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert opened.wait(60)
        stored = workbench.load_run(tmp_path / "run")
        wait_for(lambda: len(stored.steps) == 3, what="three stored steps")
        assert stored.status == "running"
        dash = Dashboard(stored, interval=0.05)
        assert dash.view.steps_fed == 3 and "running" in dash.header.value and dash.following
        # its findings and NaN / Inf in the tense of a run going on (the findings said "in this run")
        assert "nothing looks wrong so far" in dash.findings_summary.value, dash.findings_summary.value
        assert "none so far" in dash.anomalies.value
    finally:
        more.set()
        writer.join()
    # the steps written after it opened are drawn, then the end, and it stops following
    wait_for(lambda: "finished" in dash.header.value, what="the end of the run")
    assert dash.view.steps_fed == 8
    assert figures.values(loss_trace(plotted(dash, "metrics"))["x"]).tolist() == list(range(1, 9))
    assert dash.view.site_order("activation") == ["0", "1", "2"]
    wait_for(lambda: not dash.following, what="the dashboard to stop following the ended run")


def test_a_watch_closed_while_its_dashboard_is_made_has_its_last_steps_drawn(monkeypatch):
    import torch

    model = torch.nn.Linear(2, 1)
    w = workbench.watch(model)

    def step():
        model(torch.randn(4, 2)).sum().backward()
        w.step()

    step()
    step()
    refresh = Dashboard._refresh  # (the draws of the timer and of the dashboard being made)

    def refresh_while_training_ends(self, every=False):  # a training thread takes a last step, closes the watch
        refresh(self, every)
        if self.draws == 1:
            step()
            w.close()

    monkeypatch.setattr(Dashboard, "_refresh", refresh_while_training_ends)
    dash = Dashboard(w, interval=0.05)
    wait_for(lambda: "finished" in dash.header.value, what="the end of the watch drawn")
    assert dash.view.header()["step"] == 3 and "step 3" in dash.header.value and not dash.following


def test_the_dashboard_shows_where_a_nan_first_appeared():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with workbench.watch(model) as w:
        for step in range(3):
            if step == 1:
                w.patch("0", lambda out: out / 0.0)
            model(torch.randn(4, 2)).sum().backward()
            w.step()
    dash = Dashboard(w)
    assert "first at step 2" in dash.anomalies.value and "<code>0</code>" in dash.anomalies.value
    assert "<strong>Sequential</strong>" in dash.header.value and "finished" in dash.header.value


@pytest.mark.parametrize("source, options, error, match", [
    (3, {}, TypeError, "Dashboard needs a run started with experiment.start.*or its path, got int"),
    ("runs/a", {}, workbench.instrument.RunError, "runs/a is not a workbench run"),
    (None, {"interval": 0}, ValueError, "interval must be a number of seconds > 0, got 0"),
    (None, {"kind": "grads"}, ValueError, "kind must be one of .*got 'grads'"),
    (None, {"statistic": "median"}, ValueError, "statistic must be one of .*got 'median'"),
    (None, {"smoothing": 1.0}, ValueError, r"smoothing must be a number in \[0, 1\), got 1.0"),
    # (a string is true: "no" drew a log scale)
    (None, {"log_y": "no"}, TypeError, r"log_y must be True \(a log scale\), False \(a linear one\) or None .*'no'"),
])
def test_the_dashboard_refuses_bad_input_by_name(source, options, error, match):
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    if source is None:
        source = exp.watch()
    with pytest.raises(error, match=match):
        Dashboard(source, **options)


def test_a_name_or_a_model_given_for_a_run_is_refused_with_how_to_show_one(tmp_path, monkeypatch):
    """An experiment's or a model's name given for a run was read as a folder, and the message spoke of folders
    only; a model was refused without a word on watching it."""
    from workbench.ui.notebook import Compare

    monkeypatch.chdir(tmp_path)  # (where no folder has those names)
    with pytest.raises(workbench.RunError, match=r"^'activation_mlp' names an experiment, not a stored run: .*"
                       r"create\('activation_mlp'\)\.start\(steps\); Dashboard\(run\)\. \(activation_mlp is not a "
                       r"workbench run: there is no such file or folder"):
        Dashboard("activation_mlp")
    with pytest.raises(workbench.RunError, match=r"^Did you mean 'gelu'\? It names a model, not a stored run: .*"
                       r"w = workbench\.watch\(workbench\.create_model\('gelu'\)\); Compare\(w, other\)"):
        Compare("gleu", "tanh")
    with pytest.raises(workbench.RunError, match=r"^no_such_name is not a workbench run"):  # (no name like it)
        Dashboard("no_such_name")
    (tmp_path / "gelu").mkdir()  # (a folder of that name: what it is said)
    with pytest.raises(workbench.RunError, match=r"^gelu is not a workbench run: it has no "):
        Dashboard("gelu")
    model = workbench.create_model("mlp")
    with pytest.raises(TypeError, match=r"got MLP\. To follow a model of your own \(MLP\), watch it and pass the "
                       r"watch: w = workbench\.watch\(model\)"):
        Dashboard(model)
    with workbench.watch(model) as w, pytest.raises(TypeError, match=r"run 2 must be .*got MLP\. To follow a model "
                                                                   r"of your own"):
        Compare(w, model)


def test_an_experiment_with_nothing_to_show_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"experiment.start\(steps\).*experiment.watch\(\)"):
        Dashboard(workbench.experiments.create("activation_mlp"))


def site_colours(dash):
    """Each call site's colour in the per-site figure, as drawn."""
    return {t["name"]: t["line"]["color"] for t in dash.figure("sites")["data"] if t.get("name")}


def test_a_site_keeps_its_colour_whichever_sites_are_drawn_beside_it():
    # 13 call sites for 10 colours: layers.10 has the colour of layers.0's place
    exp = workbench.experiments.create("activation_mlp", seed=0, depth=6, width=8)
    w = exp.watch(histograms=False)
    exp.run(2, progress=False)
    w.close()
    dash = Dashboard(w)
    dash.sites.value = ("layers.0", "layers.10")
    first = site_colours(dash)
    dash.sites.value = ("layers.0", "layers.1", "layers.10")
    assert site_colours(dash)["layers.10"] == first["layers.10"]
    dash.sites.value = ("layers.10",)
    assert site_colours(dash) == {"layers.10": first["layers.10"]}
    dash.sites.value = ("layers.0", "layers.1", "layers.2", "layers.10", "layers.11", "layers.12")
    colours = site_colours(dash)
    assert colours["layers.10"] == first["layers.10"] and len(set(colours.values())) == 6  # (none shared)
    dash.kind.value = "grad_output"
    dash.sites.value = ("layers.10", "layers.0")
    assert site_colours(dash) == {"layers.0": first["layers.0"], "layers.10": first["layers.10"]}


def test_a_model_browser_matching_no_model_says_so_in_its_saved_text(capsys):
    ModelBrowser(pattern="zzz")._ipython_display_()  # (IPython's display protocol; outside a kernel it prints)
    assert "workbench ModelBrowser (no model picked): ipywidgets" in capsys.readouterr().out


def test_the_bar_of_a_run_stopped_by_the_user_ends_amber_a_failed_one_red_a_finished_one_green(capsys):
    from workbench.experiments.base import _notebook_bar_class

    def ended(steps, stopped=False):
        bar = _notebook_bar_class()(total=10)
        bar.update(steps)
        bar.stopped = stopped
        bar.close()
        return bar.container.children[1].bar_style  # (the progress widget)

    assert (ended(4, stopped=True), ended(4), ended(10)) == ("warning", "danger", "success")


def test_the_bar_of_a_run_the_user_interrupts_ends_amber_as_its_store_says_stopped(monkeypatch, tmp_path):
    """The kernel's stop button (a KeyboardInterrupt) in the middle of exp.run(...): its store says
    "stopped", and its bar ended in the red of a failure."""
    from workbench.experiments import base

    bars = []

    def notebook_bar(progress, steps, name):  # (the bar exp.run shows in a notebook)
        bars.append(base._notebook_bar_class()(total=steps, desc=name))
        return bars[-1]

    monkeypatch.setattr(base, "_progress_bar", notebook_bar)
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    step = exp.train_step
    exp.train_step = lambda: step() if exp.step_count < 3 else (_ for _ in ()).throw(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        exp.run(10, store=tmp_path / "run")
    assert workbench.load_run(tmp_path / "run").status == "stopped" and exp.step_count == 3
    assert bars[0].container.children[1].bar_style == "warning"
    exp.train_step = lambda: step() if exp.step_count < 4 else 1 / 0  # (an error: red, as before)
    with pytest.raises(ZeroDivisionError):
        exp.run(10)
    assert bars[1].container.children[1].bar_style == "danger"


def test_a_kernel_interrupt_as_the_watch_records_a_step_is_raised_once_the_step_is_recorded(monkeypatch):
    """The kernel's stop button pressed as exp.run(...)'s watch recorded a step (after the training step, in
    JupyterLab at the first try): the step was counted and left open in the watch, the next step's rows went into
    it (every call site a second call, "layers.0#1", in the dashboard) and each step from then on was recorded under
    the one before; the progress bar read a step fewer than were taken."""
    import signal

    from workbench.experiments import base

    bars = []

    def notebook_bar(progress, steps, name):  # (the bar exp.run shows in a notebook)
        bars.append(base._notebook_bar_class()(total=steps, desc=name))
        return bars[-1]

    monkeypatch.setattr(base, "_progress_bar", notebook_bar)
    # (Python's own handler, as a kernel has it: a process started in the background inherits SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        exp = workbench.experiments.create("activation_mlp", seed=0, depth=2, width=8)
        w = exp.watch(histograms=False)
        dash = Dashboard(w, interval=3600)
        record = w.step

        def interrupted_as_it_records(**metrics):
            if exp.step_count == 2:
                signal.raise_signal(signal.SIGINT)  # (the kernel interrupted as its second step is recorded)
            return record(**metrics)

        monkeypatch.setattr(w, "step", interrupted_as_it_records)
        with pytest.raises(KeyboardInterrupt):
            exp.run(10)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (the handler given back)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exp.step_count == 2 and bars[0].n == 2 and bars[0].container.children[1].bar_style == "warning"
    exp.run(1, progress=False)
    w.close()
    dash.refresh()
    rows = w.to_pandas()
    assert sorted(rows.step.unique()) == [1, 2, 3]
    assert set(rows.call) == {0}, sorted(set(rows.module + "#" + rows.call.astype(str)))  # (no second call of a site)
    assert [m["step"] for m in w.metrics().to_dict("records")] == [1, 2, 3]
    assert "#1" not in " ".join(dash.sites.options) and "step 3" in dash.header.value


# ------------------------------------------------------------------ comparing runs
def run_lines(figure):
    """The runs drawn in a comparison's figure: name -> colour (one legend entry a run)."""
    return {t["name"]: t["line"]["color"] for t in figure["data"] if t.get("showlegend", True) and t.get("name")}


def pick(compare, *names):
    """Tick the boxes of the runs ``names`` and untick the others', a click each, as a person does."""
    for name, box in compare.run_checkboxes.items():
        if box.value != (name in names):
            box.value = name in names


def test_compare_draws_stored_runs_as_the_apps_runs_tab_does(tmp_path):
    from workbench.ui.stored_runs import ViewCache, compare_runs
    from workbench.ui.notebook import Compare
    from workbench.ui.runs import RunsRoot

    for activation in ("gelu", "relu"):
        exp = workbench.experiments.create("activation_mlp", seed=0, activation=activation, width=8)
        exp.run(6, store=tmp_path / activation, progress=False)
    compare = Compare(tmp_path / "gelu", workbench.load_run(tmp_path / "relu"), kind="grad_output",
                      statistic="norm")
    assert not compare.following and list(compare.runs) == ["gelu", "relu"]
    assert compare.message == "Comparing `gelu`, `relu`." and "<code>gelu</code>" in compare.message_html.value
    # the app's handler over the same runs draws the same figures
    metrics, site_fig, choices, site, _ = compare_runs(ViewCache(RunsRoot(tmp_path)), ["gelu", "relu"],
                                                       "grad_output", "norm", None)
    assert (compare.figure("metrics"), compare.figure("site")) == (metrics, site_fig)
    assert compare.sites == choices and compare.site.value == site and compare.site.options == tuple(choices)
    assert compare.metrics_plot.outputs[0]["data"][PLOTLY_MIMETYPE] == metrics
    assert set(run_lines(compare.figure("site"))) == {"gelu", "relu"}

    compare.site.value = "layers.0"
    assert compare.figure("site")["layout"]["title"]["text"] == "grad_output: norm at layers.0, by run"
    compare.log_site.value = True
    assert compare.figure("site")["layout"]["yaxis"]["type"] == "log"
    compare.kind.value = "param"  # another kind: its sites, the picked one kept where it is one of them
    assert compare.sites[0] == "layers.0.weight" and compare.site.value in compare.sites
    pick(compare, "gelu")  # one run: nothing to compare, and the figures go
    assert compare.message == "Pick two or more runs to compare."
    assert compare.figure("metrics") is None and compare.metrics_plot.outputs == ()
    # the site picked comes back with the runs, and with a kind that has it
    pick(compare, "gelu", "relu")
    compare.site.value = "layers.2.weight"
    compare.kind.value = "activation"
    pick(compare, "gelu")
    pick(compare, "gelu", "relu")
    compare.kind.value = "param"
    assert compare.site.value == "layers.2.weight"
    assert compare.figure("site")["layout"]["title"]["text"].endswith("at layers.2.weight, by run")


def test_a_run_whose_line_dwarfs_the_others_is_compared_on_a_log_y_in_the_app_and_the_notebook(tmp_path):
    """The run page's per-site figure chose a log y where a line dwarfs the others (figures.dwarfed); the
    comparison's per-site figure drew them on a linear one, the smaller run's line flat at zero."""
    import torch

    from workbench.ui.notebook import Compare
    from workbench.ui.runs import RunsRoot
    from workbench.ui.stored_runs import ViewCache, compare_runs

    for name, scale in (("small", 1.0), ("large", 1e5)):  # (the same net on inputs 1e5 times larger)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4))
        with workbench.watch(net, store=tmp_path / name) as w:
            for _ in range(3):
                net(torch.ones(2, 4) * scale).sum().backward()
                w.step()
    cache = ViewCache(RunsRoot(tmp_path))

    def scale(figure):
        return figure["layout"]["yaxis"]["type"]

    # the app's handler: None, the figure chooses (the app passes it until the user sets the box)
    metrics, site_fig, _, site, _ = compare_runs(cache, ["small", "large"], "activation", "norm", "0", log_y=None)
    assert site == "0" and scale(site_fig) == "log" and set(run_lines(site_fig)) == {"small", "large"}
    assert "log" not in json.dumps(metrics)  # (these runs recorded no metrics: no panel to draw log)
    assert scale(compare_runs(cache, ["small", "large"], "activation", "norm", "0", log_y=False)[1]) == "linear"
    # the notebook's Compare draws through the same code, and its box says what the figure chose
    compare = Compare(tmp_path / "small", tmp_path / "large", kind="activation", statistic="norm", site="0")
    assert scale(compare.figure("site")) == "log" and compare.log_site.value is True
    compare.log_site.value = False  # the user's scale from here
    assert scale(compare.figure("site")) == "linear" and compare.log_site.value is False
    compare.statistic.value = "abs_mean"  # another statistic: the figure chooses again
    assert scale(compare.figure("site")) == "log" and compare.log_site.value is True
    assert scale(Compare(tmp_path / "small", tmp_path / "large", kind="activation", statistic="norm",
                         log_y=False).figure("site")) == "linear"  # (a scale given: the user's)


def watched_runs(*activations):
    """A closed watch of a two-step run of the activation MLP per activation."""
    watches = []
    for activation in activations:
        exp = workbench.experiments.create("activation_mlp", seed=0, activation=activation, width=8)
        watches.append(exp.watch(histograms=False))
        exp.run(2, progress=False)
        watches[-1].close()
    return watches


def test_compare_reads_top_down_the_runs_then_a_tab_a_figure_each_with_its_controls():
    """The per-site figure's kind, statistic and call site and the metrics' smoothing stood beside the
    list of runs, above both tabs, whichever was open; and a click on a run in that list picked it
    alone (the comparison went) where a person meant to take it out."""
    import ipywidgets as w

    from workbench.ui.notebook import Compare

    compare = Compare(*watched_runs("gelu", "relu", "tanh"), names=["gelu", "relu", "tanh"])
    runs, message, errors, tabs = compare.widget.children
    assert [box.description for box in runs.children if isinstance(box, w.Checkbox)] == ["gelu", "relu", "tanh"]
    assert message is compare.message_html and tabs is compare.tabs and tabs.titles == ("metrics", "call site")
    assert errors is compare.errors.html and errors.value == ""  # (a callback's error, under the message)
    assert [list(page.children[0].children) for page in tabs.children] == [
        [compare.smoothing, compare.log_y], [compare.kind, compare.statistic, compare.site, compare.log_site]]
    assert [page.children[1] for page in tabs.children] == [compare.metrics_plot, compare.site_plot]

    compare.run_checkboxes["relu"].value = False  # a click takes that run out, the others stay
    assert compare.picked == ("gelu", "tanh") and set(run_lines(compare.figure("metrics"))) == {"gelu", "tanh"}
    compare.run_checkboxes["relu"].value = True  # and another puts it back
    assert set(run_lines(compare.figure("site"))) == {"gelu", "relu", "tanh"}
    site_scale = compare.figure("site")["layout"]["yaxis"]["type"]
    compare.log_y.value = True  # (a box a tab: the metrics' sets every metrics panel, and the call site's its figure)
    assert set(y_scales(compare.figure("metrics")).values()) == {"log"}
    assert compare.figure("site")["layout"]["yaxis"]["type"] == site_scale
    assert compare.log_site.value is (site_scale == "log")
    compare.log_site.value = True
    assert compare.figure("site")["layout"]["yaxis"]["type"] == "log"


def test_in_a_narrow_notebook_the_controls_wrap_whole_rather_than_squeeze():
    """The Dashboard's and Compare's tabs lay out their controls alike (``FigureTabs.page``): a row that
    wraps, each control at its own width (a row that did not wrap squeezed the list of call sites to a
    sliver, and a checkbox's default 300px put its "log y" on a line of its own). The dashboard's
    buttons wrap together under its header."""
    import ipywidgets as w

    from workbench.ui.notebook import Compare

    run = workbench.experiments.create("activation_mlp", seed=0, width=8).start(2)  # (a run: the buttons)
    run.join()
    dash, compare = Dashboard(run), Compare(*watched_runs("gelu", "relu"))
    for tabs in (dash.tabs, compare.tabs):
        for page in tabs.children:
            row = page.children[0]
            assert row.layout.flex_flow == "row wrap"
            assert all(box.layout.width == "auto" for box in row.children if isinstance(box, w.Checkbox))
    header_row = dash.widget.children[0]
    assert header_row.layout.flex_flow == "row wrap"
    assert header_row.children[1].children == (dash.pause_button, dash.resume_button, dash.stop_button)


def test_compare_follows_live_runs_to_their_end_and_each_run_keeps_its_colour(tmp_path):
    from workbench.ui.notebook import Compare

    exps = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1, 2)]
    exps[0].run(5, store=tmp_path / "stored", progress=False)
    runs = [exp.start(12) for exp in exps[1:]]
    compare = Compare({"stored": tmp_path / "stored", "seed 1": runs[0], "seed 2": exps[2]}, interval=0.05)
    for run in runs:
        run.join()
    wait_for(lambda: not compare.following, what="the comparison to stop following the ended runs")
    loss = {t["name"]: figures.values(t["x"]).tolist() for t in compare.figure("metrics")["data"]
            if t.get("name") and t["xaxis"] == "x"}  # (the first panel: the accuracy)
    assert loss == {"stored": list(range(1, 6)), "seed 1": list(range(1, 13)), "seed 2": list(range(1, 13))}
    colours = run_lines(compare.figure("metrics"))
    assert len(set(colours.values())) == 3
    pick(compare, "seed 1", "seed 2")  # a run taken out: the others keep their colours
    assert compare.picked == ("seed 1", "seed 2")
    assert run_lines(compare.figure("metrics")) == {name: colours[name] for name in ("seed 1", "seed 2")}
    pick(compare, "stored", "seed 1", "seed 2")
    assert run_lines(compare.figure("metrics")) == colours


def test_compare_sends_the_page_the_open_figure_and_the_other_when_opened_or_at_the_runs_end():
    """As the Dashboard's: each figure sent is a plot the browser builds anew, so a redraw sends the open one."""
    from workbench.ui.notebook import Compare

    runs = [workbench.experiments.create("activation_mlp", seed=seed, width=8).start(100_000) for seed in (0, 1)]
    compare = Compare(*runs, interval=0.05)

    def sent(name):  # what the page was sent for a figure
        out = {"metrics": compare.metrics_plot, "site": compare.site_plot}[name]
        return out.outputs[0]["data"][PLOTLY_MIMETYPE]

    def sent_up_to(name):  # the last step of the figure the page was sent
        return max((int(figures.values(t["x"]).max(initial=0)) for t in sent(name)["data"] if "x" in t), default=0)

    assert compare.open_figure == "metrics" and sent("site")  # (both figures, once, when made)
    wait_for(lambda: sent_up_to("metrics") >= 6, what="a redraw with six steps")
    closed = sent("site")
    first = sent_up_to("metrics")
    wait_for(lambda: sent_up_to("metrics") > first + 4, what="more redraws while the runs train")
    assert sent("site") == closed  # its tab closed: not sent again
    compare.tabs.selected_index = 1  # opened: drawn from what arrived, and redrawn while open
    assert compare.open_figure == "site" and sent_up_to("site") > first
    opened = sent_up_to("site")
    wait_for(lambda: sent_up_to("site") > opened, what="a redraw of the open call site's figure")
    compare.tabs.selected_index = 0
    for run in runs:
        run.stop()
    wait_for(lambda: not compare.following, what="the comparison to stop following the ended runs")
    last = max(run.step for run in runs)
    assert sent_up_to("metrics") == sent_up_to("site") == last  # both drawn at the runs' end
    assert (sent("metrics"), sent("site")) == (compare.figure("metrics"), compare.figure("site"))


def test_compare_names_runs_of_one_experiment_by_the_settings_they_differ_in():
    from workbench.ui.notebook import Compare

    exps = [workbench.experiments.create("activation_mlp", seed=0, activation=activation, width=8)
            for activation in ("gelu", "tanh")]
    watches = [exp.watch(histograms=False) for exp in exps]
    for exp in exps:
        exp.run(2, progress=False)
    assert list(Compare(*exps).runs) == ["activation=gelu", "activation=tanh"]
    other = workbench.experiments.create("activation_mlp", seed=1, width=8)
    watches.append(other.watch(histograms=False))
    other.run(1, progress=False)  # (beside a run of another seed, the experiment and seed come first)
    assert list(Compare(*exps, other).runs) == ["activation_mlp (seed 0): activation=gelu",
                                                "activation_mlp (seed 0): activation=tanh", "activation_mlp (seed 1)"]
    for w in watches:  # (each closed: a watch left open keeps its hooks on for the tests after this one)
        w.close()
    watches = watches[:2]
    assert list(Compare(*watches).runs) == ["MLP (1)", "MLP (2)"]  # (a watch alone: its model's class, numbered)
    assert list(Compare(*watches, names=["gelu", "tanh"]).runs) == ["gelu", "tanh"]


@pytest.mark.parametrize("sources, options, error, match", [
    (1, {}, ValueError, r"Compare needs two or more runs, got 1: Compare\(run_a, run_b\)"),
    (2, {"names": ["a"]}, ValueError, r"names must be a list of one name per run \(2\), got \['a'\]"),
    (2, {"names": ["a", "a"]}, ValueError, r"the names must differ .*got \['a', 'a'\]"),
    (2, {"kind": "grads"}, ValueError, "kind must be one of .*got 'grads'"),
    (2, {"statistic": "median"}, ValueError, "statistic must be one of .*got 'median'"),
    (2, {"site": "layers.9"}, ValueError, r"no call site 'layers.9' of kind 'activation' in these runs; the sites "
                                          r"are \['layers.0', "),
    (2, {"interval": 0}, ValueError, "interval must be a number of seconds > 0, got 0"),
    (2, {"log_y": "yes"}, TypeError, "log_y must be True .*got 'yes'"),
    (2, {"tab": "sites"}, ValueError, r"tab must be the figure shown first, one of \('metrics', 'site'\), got 'sites'"),
    ("not a run", {}, TypeError, "run 2 must be a run started with experiment.start.*got int"),
    ("no path", {}, workbench.RunError, "no-such-run"),
    # (the same run twice drew two lines, one over the other, as two runs)
    ("a watch twice", {}, ValueError, r"Compare: runs 1 and 3 are the same run; compare two or more different runs"),
    ("a run and its path", {}, ValueError, r"Compare: runs 2 and 3 are the same run \(stored in .*stored\)"),
])
def test_compare_refuses_bad_input_by_name(tmp_path, sources, options, error, match):
    from workbench.ui.notebook import Compare

    watches = []
    for seed, store in ((0, None), (1, tmp_path / "stored")):
        exp = workbench.experiments.create("activation_mlp", seed=seed, width=8)
        watches.append(exp.watch(histograms=False, store=store))
        exp.run(1, progress=False)
        watches[-1].close()
    w, other = watches
    given = {1: [w], 2: [w, other], "not a run": [w, 3], "no path": [w, tmp_path / "no-such-run"],
             "a watch twice": [w, other, w], "a run and its path": [w, other, str(tmp_path / "stored") + "/"]}[sources]
    with pytest.raises(error, match=match):
        Compare(*given, **options)


def test_the_dashboard_of_a_live_watch_judges_its_loss_against_the_runs_chance_level():
    """A loss that stays at the chance level the watch's metadata gives is said so in the list."""
    import torch

    net = torch.nn.Linear(2, 2)
    with workbench.watch(net, histograms=False, metadata={"chance": {"loss": 0.6931}}) as w:
        dash = Dashboard(w)
        for step in range(60):
            net(torch.randn(4, 2)).sum().backward()
            w.step(loss=0.6931 + 0.001 * (step % 3 - 1))  # (flat at chance, with a little noise)
    dash.refresh()
    assert any("loss_at_chance at loss" in label for label in dash.findings_list.options), dash.findings_list.options
    dash.close()


def empty_text(figure):
    """What a blank figure says (:func:`workbench.ui.figures.empty_figure`)."""
    return " ".join(a["text"] for a in figure["layout"].get("annotations", ()))


def test_compare_of_runs_before_their_first_step_keeps_the_site_given_and_draws_it_once_rows_arrive():
    """A comparison made as the runs start (their watch open, no step yet) was refused: "no call site
    'layers.1' ...; the sites are []"."""
    from workbench.ui.notebook import Compare

    exps = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1)]
    watches = [exp.watch(histograms=False) for exp in exps]
    compare = Compare(*exps, site="layers.1", interval=0.05)
    try:
        assert compare.sites == [] and compare.following
        assert empty_text(compare.figure("site")) == "None of these runs has activation rows yet."
        for exp in exps:
            exp.run(2, progress=False)
        wait_for(lambda: compare.site.value == "layers.1", what="the site given, once the runs have it")
        assert compare.sites[0] == "layers.0"  # (the given site drawn, not the first run's default)
        wait_for(lambda: compare.figure("site")["layout"]["title"]["text"].endswith("at layers.1, by run"),
                 what="the given site's figure")
    finally:
        compare.close()
    # a site the runs turn out not to have (mistyped): said once their rows arrive, another one drawn
    exps = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1)]
    watches += [exp.watch(histograms=False) for exp in exps]
    compare = Compare(*exps, site="layers.9", interval=0.05)
    try:
        for exp in exps:
            exp.run(2, progress=False)
        wait_for(lambda: compare.sites, what="the runs' sites")
        wait_for(lambda: "No call site 'layers.9' of kind 'activation' in these runs: showing" in compare.message,
                 what="the given site said missing")
    finally:
        compare.close()
        for w in watches:
            w.close()
    with pytest.raises(ValueError, match=r"no call site 'layers.9' of kind 'activation' in these runs; the sites "
                                         r"are \['layers.0', "):
        Compare(*watches, site="layers.9")  # (runs that have sites: a site they lack is refused)


def test_compare_says_of_a_live_run_without_rows_that_it_has_none_yet_and_of_an_ended_one_that_it_recorded_none():
    from workbench.ui.notebook import Compare

    exps = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1)]
    watches = [exp.watch(histograms=False) for exp in exps]
    exps[0].run(2, progress=False)
    compare = Compare(*exps, names=["ran", "waits"], interval=0.05)
    try:  # (a run still going was said to have "recorded no activation rows")
        wait_for(lambda: compare.sites, what="the first run's sites")
        assert "`waits` has no activation rows yet: the sites of `ran` are listed." in compare.message
    finally:
        compare.close()
    for w in watches:  # (the second ended without a step: it recorded none)
        w.close()
    compare = Compare(*watches, names=["ran", "waits"])
    assert not compare.following
    assert "`waits` recorded no activation rows: the sites of `ran` are listed." in compare.message


def test_the_per_site_figure_chooses_a_log_y_where_a_line_dwarfs_the_others_until_the_box_is_set():
    """Notebook 05's dashboard: the aggregator's hashes (std about 5e18) flattened every other line unless
    log y was ticked."""
    run = workbench.experiments.create("query_stream", seed=0, key_space=2000, batch_size=64).start(3)
    dash = Dashboard(run, interval=0.05, tab="sites")
    run.join()
    wait_for(lambda: not dash.following, what="the run's last draw")
    assert "aggregator" in dash.sites.value and "hash_to_int" in dash.sites.value
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "log" and dash.log_sites.value  # (it says so)
    dash.log_sites.value = False  # the user's scale from here, through redraws
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "linear"
    dash.refresh()
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "linear" and not dash.log_sites.value
    dash.statistic.value = "mean"  # another statistic: the figure's to choose (hashes of either sign: linear)
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "linear" and not dash.log_sites.value
    dash.statistic.value = "std"
    assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "log" and dash.log_sites.value


def test_a_log_axis_past_ten_thousand_labels_its_ticks_as_powers_of_ten_in_every_figure():
    """Notebook 05's per-site figure, on its log y, read 1, 1000, 1M, 1B, 1T, then 10^15 and 10^18 (Plotly's
    default notation: SI letters up to T, powers past them). A log axis whose values reach past 10^4 (or below
    10^-3) writes powers; one within them, and a linear one, keep Plotly's plain numbers."""
    import torch

    from workbench.ui.notebook import Compare

    runs = [workbench.experiments.create("query_stream", seed=seed, key_space=2000, batch_size=64).start(2)
            for seed in (0, 1)]
    for run in runs:
        run.join()
    dash = Dashboard(runs[0], tab="sites")
    sites_axis = dash.figure("sites")["layout"]["yaxis"]  # (a log y, chosen for the hashes' std, about 5e18)
    assert sites_axis["type"] == "log" and sites_axis["exponentformat"] == "power"
    compared_axis = Compare(*runs, site="aggregator", log_y=True).figure("site")["layout"]["yaxis"]
    assert compared_axis["type"] == "log" and compared_axis["exponentformat"] == "power"
    dash.log_sites.value = False
    assert "exponentformat" not in dash.figure("sites")["layout"]["yaxis"]

    model = torch.nn.Linear(2, 1)
    for losses, power in (([1.0, 30.0, 2e5], True), ([0.9, 0.5, 0.02], False)):
        with workbench.watch(model) as w:
            for loss in losses:
                model(torch.randn(4, 2)).sum().backward()
                w.step(loss=loss)
        metrics = Dashboard(w, log_y=True).figure("metrics")["layout"]
        loss_axis = next(axis for name, axis in metrics.items() if name.startswith("yaxis"))
        assert loss_axis["type"] == "log" and (loss_axis.get("exponentformat") == "power") == power, losses


def test_the_distribution_tab_of_a_watch_recording_histograms_never_says_they_are_off():
    """The tab opened between two ticks, steps having arrived since the last: it said "this run was
    recorded with histograms=False" of a watch that records them."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    w = workbench.watch(model)  # (histograms on: the default)
    dash = Dashboard(w, interval=3600)  # (no tick in this test: what arrives is drawn when a tab is opened)
    try:
        assert empty_text(dash.figure("distribution")) == "No activation rows yet."
        for _ in range(2):
            model(torch.randn(8, 2)).sum().backward()
            w.step()
        wait_for(lambda: dash.view.steps_fed == 2, what="the steps delivered to the dashboard")
        dash.tabs.selected_index = 3  # (opened: drawn from what arrived)
        assert dash.open_figure == "distribution"
        drawn = plotted(dash, "distribution")
        assert "histograms=False" not in empty_text(drawn) and drawn["data"]  # (the histograms that arrived)
        assert dash.distribution_site.value in dash.view.histogram_sites("activation")
    finally:
        dash.close()
        w.close()
    off = workbench.watch(model, histograms=False)
    dash = Dashboard(off, interval=3600)
    try:  # (a watch without histograms says so at once)
        assert "histograms=False" in empty_text(dash.figure("distribution"))
    finally:
        dash.close()
        off.close()


def test_a_kind_the_run_does_not_record_is_said_so_never_awaited(tmp_path):
    """The kind list offers every kind: a run without updates (the default) said "No update rows yet." in
    each of its figures, live and stored, as though they were on their way."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    w = workbench.watch(model, gradients=False, store=tmp_path / "run")
    dash = Dashboard(w, interval=3600, kind="grad_output")
    try:
        model(torch.randn(8, 2)).sum().backward()
        w.step()
        wait_for(lambda: dash.view.steps_fed == 1, what="the step delivered to the dashboard")
        live = "No grad_output rows: this run is recorded without them (gradients=False)."
        assert [empty_text(dash.figure(name)) for name in ("sites", "heatmap", "distribution")] == [live] * 3
        assert live in dash.site_note.value
    finally:
        dash.close()
        w.close()
    stored = Dashboard(workbench.load_run(tmp_path / "run"))
    stored.kind.value = "update"  # (picked from the list, as a person does)
    said = "No update rows: this run was recorded without them (updates=False)."
    assert [empty_text(stored.figure(name)) for name in ("sites", "heatmap", "distribution")] == [said] * 3
    stored.kind.value = "activation"  # (a kind it records: drawn)
    assert stored.figure("sites")["data"] and stored.figure("heatmap")["data"]
    # a background run's last draw, sent as it ends (before it is done), says it ended
    run = workbench.experiments.create("activation_mlp", seed=0, width=8).start(3, gradients=False)
    ended = Dashboard(run, kind="grad_output", tab="sites", interval=0.05)
    run.join()
    wait_for(lambda: not ended.following, what="the run's last draw")
    assert empty_text(plotted(ended, "sites")) == (
        "No grad_output rows: this run was recorded without them (gradients=False).")


def test_a_kind_a_running_model_has_not_given_in_its_steps_is_not_awaited_as_yet_to_come():
    """A model run forward only (query_stream's QueryModule, a module probed without a backward) said "No
    grad_output rows yet." for as long as it ran: rows that were never to come."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh())
    w = workbench.watch(model)  # (gradients on: the model is simply never backpropagated)
    dash = Dashboard(w, interval=3600, kind="grad_output", tab="sites")
    try:
        assert empty_text(dash.figure("sites")) == "No grad_output rows yet."  # (no step recorded: yet)
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(8, 2))
                w.step()
        wait_for(lambda: dash.view.steps_fed == 2, what="the steps delivered to the dashboard")
        dash.refresh()  # (as the timer's next tick does)
        said = "No grad_output rows in the steps recorded so far."
        assert [empty_text(dash.figure(name)) for name in ("sites", "heatmap", "distribution")] == [said] * 3
    finally:
        dash.close()
        w.close()


def test_compare_of_a_running_model_without_a_kind_in_its_steps_does_not_await_it_as_yet_to_come():
    """As the Dashboard: a model run forward only had "no grad_output rows yet" for as long as it ran."""
    import torch
    from workbench.ui.notebook import Compare

    models = [torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh()) for _ in range(2)]
    watches = [workbench.watch(model) for model in models]
    compare = Compare(*watches, names=["trained", "forward"], kind="grad_output", interval=0.05)
    try:
        assert empty_text(compare.figure("site")) == "None of these runs has grad_output rows yet."
        for model, w in zip(models, watches):
            with torch.no_grad():  # (never backpropagated)
                model(torch.randn(8, 2))
            w.step()
        wait_for(lambda: "so far" in empty_text(compare.figure("site")), what="the steps compared")
        assert empty_text(compare.figure("site")) == (
            "None of these runs has grad_output rows in the steps recorded so far.")
        models[0](torch.randn(8, 2)).sum().backward()
        watches[0].step()
        wait_for(lambda: compare.sites, what="the trained run's sites")
        assert "`forward` has no grad_output rows in its steps so far: the sites of `trained` are listed." in (
            compare.message)
    finally:
        compare.close()
        for w in watches:
            w.close()


def test_compare_of_runs_recorded_without_a_kind_says_so_not_that_its_rows_are_yet_to_come(tmp_path):
    """The kind list offers update, which runs record only with updates=True: "None of these runs has update
    rows yet." for good."""
    from workbench.ui.notebook import Compare

    exps = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1)]
    watches = [exps[0].watch(histograms=False), exps[1].watch(histograms=False, updates=True)]
    compare = Compare(*exps, kind="update", interval=0.05)
    try:  # (before any row: the run without them said so, not "yet")
        assert ("`activation_mlp (seed 0)` is recorded without update rows (updates=False); `activation_mlp (seed 1)` "
                "has no update rows yet.") in compare.message
        for exp in exps:
            exp.run(2, progress=False)
        wait_for(lambda: compare.sites, what="the update sites of the run that records them")
        wait_for(lambda: "`activation_mlp (seed 0)` is recorded without update rows (updates=False)"
                 in compare.message, what="the run without updates said so")
    finally:
        compare.close()
    for w in watches:
        w.close()
    watches = [exp.watch(histograms=False, gradients=False) for exp in exps]  # (neither records them)
    compare = Compare(*exps, kind="grad_output", interval=0.05)
    try:
        for exp in exps:
            exp.run(2, progress=False)
        wait_for(lambda: empty_text(compare.figure("site")) == (
            "None of these runs records grad_output rows (gradients=False)."), what="the figure saying so")
    finally:
        compare.close()
        for w in watches:
            w.close()


def test_a_whole_number_box_reads_1e3_as_1000_and_refuses_2_5_as_the_apps_box_does():
    """An IntText's view reads what is typed with JavaScript's parseInt: 1e3 typed was 1, 2.5 was 2, unsaid.
    The boxes are text, read in Python as the app's boxes are read."""
    import ipywidgets as w

    browser = ModelBrowser(pattern="mlp")
    boxes = {box.description: box for box in browser.form.children}
    whole = [boxes["width"], boxes["depth"], browser.batch_size]
    assert not any(isinstance(box, (w.IntText, w.FloatText)) for box in whole)
    boxes["width"].value = "1e1"
    browser.batch_size.value = "3.0"
    result = browser.build()
    assert result.ok and result.model.layers[0].out_features == 10, result.message
    boxes["width"].value = "2.5"
    result = browser.build()
    assert not result.ok and "width expects int, could not read '2.5': not a whole number" in result.message


def test_a_whole_number_shows_as_one_and_a_number_box_holding_no_number_says_so_at_once():
    """A FloatText showed an integer parameter as 16.0, and over text it could not read put back its last
    number without a word: the model was built with a value the user had not typed. Each box shows its
    number as Python writes it, keeps what was typed, and the form says at once what it cannot read."""
    browser = ModelBrowser(pattern="prelu")
    boxes = {box.description: box for box in browser.form.children}
    assert (boxes["num_parameters"].value, boxes["init"].value, browser.batch_size.value) == ("1", "0.25", "2")
    assert browser.form_message.value == ""
    boxes["num_parameters"].value = "four"  # (the box left: its text sent)
    said = browser.form_message.value
    assert boxes["num_parameters"].value == "four"  # (kept as typed, never put back)
    assert "num_parameters expects int, could not read &#x27;four&#x27;: not a number; enter a whole number" in said
    boxes["init"].value = "0.1.2"
    browser.batch_size.value = "lots"
    said = browser.form_message.value
    assert "init expects float, could not read &#x27;0.1.2&#x27;: not a number; enter a number such as 0.5" in said
    assert "Example batch size must be a positive whole number, got &#x27;lots&#x27;: not a number" in said
    assert "num_parameters" in said  # (every box that holds no value, not only the last one left)
    result = browser.build()
    assert not result.ok and "num_parameters expects int, could not read 'four'" in result.message
    boxes["num_parameters"].value, boxes["init"].value, browser.batch_size.value = 3, 0.1, 4  # (set from code)
    assert (boxes["num_parameters"].value, boxes["init"].value, browser.batch_size.value) == ("3", "0.1", "4")
    assert browser.form_message.value == ""  # (all mended: nothing said)
    result = browser.build()
    assert result.ok and result.model.weight.shape == (3,) and result.model.weight[0].item() == pytest.approx(0.1)
    boxes["num_parameters"].value = "0"  # (a number outside the parameter's range: its range said)
    assert "num_parameters" in browser.form_message.value and "got 0" in browser.form_message.value
    browser.pattern.value = "mlp"  # (another model's form: its own boxes checked)
    assert browser.models.value == "mlp" and browser.form_message.value == ""
    browser.pattern.value = "prelu"  # (back: what its form still holds said again)
    assert "num_parameters" in browser.form_message.value


def test_a_watch_given_no_metrics_says_so_never_that_they_are_yet_to_come(tmp_path):
    """A watch of a training loop of one's own records the metrics w.step() is given; one given none said
    "No metrics yet." after its last step and once closed, live and stored, as though they were on their way."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    w = workbench.watch(model, store=tmp_path / "run")
    dash = Dashboard(w, interval=0.05)
    how = "a watch records the metrics given to w.step(), e.g. w.step(loss=loss.item())"
    try:
        assert empty_text(dash.figure("metrics")) == "No metrics yet."  # (before its first step)
        model(torch.randn(8, 2)).sum().backward()
        w.step()
        wait_for(lambda: dash.view.steps_fed == 1, what="the step delivered to the dashboard")
        dash.refresh()
        assert empty_text(dash.figure("metrics")) == f"No metrics in the steps recorded so far ({how})."
    finally:
        w.close()
    wait_for(lambda: not dash.following, what="the watch's end")
    said = f"This run recorded no metrics ({how})."
    assert empty_text(dash.figure("metrics")) == empty_text(plotted(dash, "metrics")) == said
    dash.close()
    assert empty_text(Dashboard(tmp_path / "run").figure("metrics")) == said
    other = workbench.experiments.create("activation_mlp", seed=0, width=8)
    other.run(2, store=tmp_path / "other", progress=False)
    from workbench.ui.notebook import Compare

    compare = Compare(tmp_path / "run", tmp_path / "other")
    assert compare.figure("metrics")["data"]  # (one run's metrics: drawn, and the other named, not left out unsaid)
    assert compare.message.startswith("Comparing `run`, `other`. `run` recorded no metrics (a watch records the "
                                      "metrics given to w.step()). They share no activation call site"), compare.message
    compare.close()


def test_the_per_site_scale_the_figure_chose_is_kept_while_the_watch_streams_in_more_steps():
    """As a run page's (figures.keep_scale): a line that came to dwarf the others switched the figure to log."""
    import torch

    from tests.ui.test_run_page import _TwoBranches

    net = _TwoBranches()
    with workbench.watch(net) as w:
        dash = Dashboard(w, interval=3600, tab="sites")  # (drawn by refresh() here, not by its timer)
        try:
            scales = []
            for step in range(1, 4 * figures.SCALE_SETTLES_AT):
                if step == figures.SCALE_SETTLES_AT + 1:
                    with torch.no_grad():
                        net.big.weight.mul_(1e6)  # (from here its line dwarfs the other)
                net(torch.randn(8, 3, generator=torch.Generator().manual_seed(step))).backward()
                w.step()
                wait_for(lambda: dash.view.steps_fed == step, what=f"step {step} in the dashboard's view")
                dash.refresh()
                scales.append(plotted(dash, "sites")["layout"]["yaxis"]["type"])
            assert scales == ["linear"] * len(scales) and not dash.log_sites.value, scales
            dash.statistic.value = "abs_mean"  # another statistic: the figure's to choose again
            assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "log" and dash.log_sites.value
        finally:
            dash.close()


def test_a_kept_per_site_scale_is_the_sites_picked_and_a_kept_log_goes_linear_at_a_zero():
    """The Dashboard kept the scale settled for its kind and statistic through a pick of other sites (a site whose
    line dwarfs the others added: flat at zero, linear), and kept a log one after a line fell to 0 (the zeros
    vanished from the figure)."""
    import torch

    from tests.ui.test_run_page import _TwoBranches

    net = _TwoBranches()
    with torch.no_grad():
        net.big.weight.mul_(1e6)  # (its line dwarfs the other's from the first step)
    with workbench.watch(net) as w:
        dash = Dashboard(w, interval=3600, tab="sites")  # (drawn by refresh() here, not by its timer)
        try:
            def steps(first, last):
                for step in range(first, last + 1):
                    net(torch.randn(8, 3, generator=torch.Generator().manual_seed(step))).backward()
                    w.step()
                    wait_for(lambda: dash.view.steps_fed == step, what=f"step {step} in the dashboard's view")
                    dash.refresh()
                return plotted(dash, "sites")["layout"]["yaxis"]["type"]

            settles = figures.SCALE_SETTLES_AT
            assert steps(1, 1) == "log"
            dash.sites.value = ("small",)  # (the user's pick: one line, linear)
            assert steps(2, settles) == "linear"
            dash.sites.value = ("big", "small")  # (another pick: the figure's to choose again)
            assert plotted(dash, "sites")["layout"]["yaxis"]["type"] == "log" and dash.log_sites.value
            assert steps(settles + 1, 2 * settles) == "log"  # (kept for this pick)
            with torch.no_grad():
                net.small.weight.zero_()
                net.small.bias.zero_()  # (its output constant: its std 0 from the next step)
            assert steps(2 * settles + 1, 2 * settles + 1) == "linear" and not dash.log_sites.value
        finally:
            dash.close()


def test_a_comparisons_scale_is_kept_only_once_each_run_has_its_line():
    """A Compare settled its call site's scale on the one line of the run that had steps: the run that began later,
    dwarfing it, stayed on a linear y, flat at zero beside it."""
    import torch

    from tests.ui.test_run_page import _TwoBranches
    from workbench.ui.notebook import Compare

    early, late = _TwoBranches(), _TwoBranches()
    with torch.no_grad():
        late.big.weight.mul_(1e6)
    with workbench.watch(early) as w_early, workbench.watch(late) as w_late:
        compare = Compare({"early": w_early, "late": w_late}, kind="activation", statistic="std", site="big",
                          interval=3600, tab="site")  # (drawn by refresh() here, not by its timer)
        try:
            taken = {"early": 0, "late": 0}

            def steps(name, net, w, count):
                for step in range(1, count + 1):
                    net(torch.randn(8, 3, generator=torch.Generator().manual_seed(step))).backward()
                    w.step()
                taken[name] += count
                wait_for(lambda: compare.runs[name].view.steps_fed == taken[name], what=f"{name}'s steps")
                compare.refresh()
                return compare.figure("site")["layout"]["yaxis"]["type"]

            assert steps("early", early, w_early, 2 * figures.SCALE_SETTLES_AT) == "linear"  # (one line)
            assert steps("late", late, w_late, 1) == "log" and compare.log_site.value  # (the late run's dwarfs it)
        finally:
            compare.close()


def test_an_error_in_any_widgets_callback_is_said_in_the_widget_until_a_callback_succeeds(monkeypatch, tmp_path):
    """An exception raised in an observer or a click handler (the model browser's filter, a Dashboard's kind,
    a Compare's run box) went to JupyterLab's log console only: the user saw nothing happen. Each widget
    says it under its message, with the traceback folded, until a later callback of the widget succeeds."""
    from workbench.ui import model_browser, stored_runs
    from workbench.ui.notebook import Compare

    def broken(*args, **kwargs):
        raise RuntimeError("the handler broke")

    browser = ModelBrowser()
    assert browser.errors.html in browser.widget.children and browser.errors.html.value == ""
    monkeypatch.setattr(model_browser, "filter_models", broken)
    browser.pattern.value = "lu"  # (no exception reaches the caller: ipywidgets would only log it)
    assert isinstance(browser.errors.error, RuntimeError)
    assert "The name filter failed:</b> RuntimeError: the handler broke" in browser.errors.html.value
    assert "<details><summary>traceback</summary>" in browser.errors.html.value
    monkeypatch.undo()
    browser.pattern.value = "mlp"  # (a callback that succeeds: the message goes)
    assert browser.errors.html.value == "" and browser.errors.error is None and "mlp" in browser.models.options

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch()
    exp.run(3, progress=False)
    w.close()
    dash = Dashboard(w)
    assert dash.errors.html in dash.widget.children
    monkeypatch.setattr(dash.view, "site_order", broken)
    dash.kind.value = "param"
    assert "The kind picked failed:</b> RuntimeError: the handler broke" in dash.errors.html.value
    monkeypatch.undo()
    dash.statistic.value = "mean"
    assert dash.errors.html.value == ""

    for activation in ("gelu", "relu"):
        workbench.experiments.create("activation_mlp", seed=0, activation=activation, width=8).run(
            3, store=tmp_path / activation, progress=False)
    compare = Compare(tmp_path / "gelu", tmp_path / "relu")
    assert compare.errors.html in compare.widget.children
    monkeypatch.setattr(stored_runs, "compare_runs", broken)
    compare.run_checkboxes["relu"].value = False
    assert "The relu box failed:</b> RuntimeError: the handler broke" in compare.errors.html.value
    monkeypatch.undo()
    compare.run_checkboxes["relu"].value = True
    assert compare.errors.html.value == "" and compare.picked == ("gelu", "relu")


def test_a_callback_that_fails_inside_one_that_succeeds_keeps_its_message():
    """One callback set off by another (a filter that changes the model picked): the inner one's error stays
    said although the outer one returns normally."""
    from workbench.ui.notebook import CallbackErrors

    errors = CallbackErrors()

    def inner():
        raise ValueError("inner broke")

    outer = errors.guard(lambda: errors.guard(inner, "the inner pick")(), "the outer pick")
    outer()
    assert "The inner pick failed:</b> ValueError: inner broke" in errors.html.value
    import threading  # (a callback a dashboard's timer sets off, in its thread, leaves the message)

    timer = threading.Thread(target=errors.guard(lambda: None, "a control set by the timer"))
    timer.start()
    timer.join()
    assert "inner broke" in errors.html.value
    errors.guard(lambda: None, "another pick")()
    assert errors.html.value == "" and errors.error is None


def test_build_with_a_bad_box_says_its_error_once_and_a_box_shows_the_value_a_build_used():
    """Build clicked while a box held a bad value showed the same error twice, under the form and as the
    build's message; a box holding '1e1' kept '1e1' after Build built with 10."""
    browser = ModelBrowser(pattern="mlp")
    form = {box.description: box for box in browser.form.children}
    form["depth"].value = "0"
    assert "got 0" in browser.form_message.value  # (said as the box is left)
    browser.build_button.click()
    assert not browser.result.ok and "must lie in [1, 32], got 0" in browser.message.value
    assert browser.form_message.value == ""  # (said once: by the build's message)
    form["width"].value = "1e1"  # (another box edited: the depth's error is still said once)
    assert browser.form_message.value == "" and "got 0" in browser.message.value
    form["width"].value = "four"  # (a new problem, which the build's message does not say, is said under the form)
    assert "four" in browser.form_message.value and "got 0" not in browser.form_message.value
    form["width"].value, form["depth"].value = "1e1", "2"
    browser.batch_size.value = "3e0"
    browser.build_button.click()
    assert browser.result.ok and browser.model.layers[0].out_features == 10
    assert (form["width"].value, form["depth"].value, browser.batch_size.value) == ("10", "2", "3")
    assert browser.form_message.value == ""


@pytest.fixture
def shell():
    """An IPython shell whose cells carry an id, as JupyterLab's do (``cellId``)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def test_a_dashboard_no_cell_shows_any_more_stops_its_timer_and_one_shown_twice_goes_on(shell):
    """A Dashboard of a watch never closed kept polling after its cell was run again (a new Dashboard
    replacing it on the page). Its timer stops once no cell shows it, or its widget is closed; a dashboard
    shown by two cells goes on while one of them still shows it."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    shell.user_ns.update(w=exp.watch(), exp=exp, Dashboard=Dashboard)
    shell.run_cell("dash = Dashboard(w, interval=0.05); dash", cell_id="a")
    first = shell.user_ns["dash"]
    assert first.following
    shell.run_cell("dash = Dashboard(w, interval=0.05); dash", cell_id="a")  # (the cell run again)
    second = shell.user_ns["dash"]
    wait_for(lambda: not first.following, what="the replaced dashboard's timer to stop")
    assert second.following
    shell.run_cell("dash", cell_id="b")  # (shown twice)
    shell.run_cell("dash", cell_id="b")  # (a cell run again that shows it anew keeps it)
    shell.run_cell("1", cell_id="b")  # (b shows it no more; a still does)
    assert second.following
    shell.run_cell("exp.run(2, progress=False)", cell_id="c")  # (steps drawn by the dashboard shown)
    wait_for(lambda: second.view.steps_fed > 0, what="the steps to be drawn")
    shell.run_cell("pass", cell_id="a")  # (no cell shows it)
    wait_for(lambda: not second.following, what="the dashboard no cell shows to stop")

    third = Dashboard(shell.user_ns["w"], interval=0.05)
    assert third.following
    third.widget.close()  # (its widget closed, as a front end closes it)
    wait_for(lambda: not third.following, what="the closed widget's dashboard to stop")
    shell.user_ns["w"].close()


def test_a_dashboard_shown_outside_any_cell_is_not_stopped_when_the_last_cell_run_runs_again(shell):
    """A dashboard displayed by no cell (from a button's callback into an Output widget, between cells) was taken
    for one shown by the cell run last, and stopped when that cell ran again, though its output never held it."""
    from IPython.display import display

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    shell.user_ns.update(w=exp.watch(), Dashboard=Dashboard)
    shell.run_cell("shown = Dashboard(w, interval=0.05); shown", cell_id="a")  # (the cells followed from here)
    elsewhere = Dashboard(shell.user_ns["w"], interval=0.05)
    display(elsewhere)  # (between cells)
    shell.run_cell("1", cell_id="a")  # (cell a run again: its own dashboard goes, not the other)
    wait_for(lambda: not shell.user_ns["shown"].following, what="cell a's dashboard to stop")
    assert elsewhere.following
    elsewhere.close()
    shell.user_ns["w"].close()


def test_a_dashboard_stopped_while_its_run_goes_on_says_so_when_shown_again(shell):
    """A dashboard its cell no longer showed stopped following its run; shown again by another cell, it read as
    live (its header 'running') while no step since was drawn."""
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    shell.user_ns.update(w=exp.watch(), exp=exp, Dashboard=Dashboard)
    shell.run_cell("dash = Dashboard(w, interval=0.05); dash", cell_id="a")
    dash = shell.user_ns["dash"]
    assert "no longer follows" not in dash.header.value
    shell.run_cell("exp.run(1, progress=False)", cell_id="a")  # (cell a no longer shows it)
    wait_for(lambda: not dash.following, what="the dashboard no cell shows to stop")
    shell.run_cell("dash", cell_id="b")
    assert "no longer follows" in dash.header.value and "new Dashboard" in dash.header.value
    shell.user_ns["w"].close()


def test_a_compare_stopped_while_its_runs_go_on_says_so_when_shown_again(shell):
    """A Compare its cell no longer showed stopped following its runs, as a Dashboard does; shown again by another
    cell it said nothing of it (the Dashboard's header says it no longer follows its run), and read as live."""
    from workbench.ui.notebook import Compare

    experiments = [workbench.experiments.create("activation_mlp", seed=seed, width=8) for seed in (0, 1)]
    shell.user_ns.update(a=experiments[0].watch(), b=experiments[1].watch(), Compare=Compare)
    shell.run_cell("compare = Compare(a, b, interval=0.05); compare", cell_id="a")
    compare = shell.user_ns["compare"]
    assert compare.following and "no longer follows" not in compare.message_html.value
    shell.run_cell("1", cell_id="a")  # (cell a no longer shows it)
    wait_for(lambda: not compare.following, what="the comparison no cell shows to stop")
    shell.run_cell("compare", cell_id="b")
    assert "no longer follows its runs" in compare.message_html.value
    assert "Make a new Compare to follow them" in compare.message_html.value
    compare.refresh()  # (a redraw keeps saying so)
    assert "no longer follows its runs" in compare.message_html.value
    for name in ("a", "b"):
        shell.user_ns[name].close()


def y_scales(figure):
    """Each y axis's type, by axis name (a metrics figure's panels: ``yaxis``, ``yaxis2``, ...)."""
    return {name: axis.get("type") for name, axis in figure["layout"].items() if re.fullmatch(r"yaxis\d*", name)}


def test_the_dashboards_metrics_log_y_is_ticked_while_a_panel_chose_log_and_a_tick_sets_every_panel():
    """The app's run page ticks its metrics' log y while a panel chose log (figures.drawn_log); the Dashboard's box
    stayed unticked over a loss panel drawn log. Ticked by the panels' choice, the box set to True by the user
    (the value it shows) is still the user's scale: every panel log, as a tick in the app."""
    model = torch.nn.Linear(2, 1)
    with workbench.watch(model) as w:
        for loss, accuracy in ((1.0, 0.5), (30.0, 0.6), (2e5, 0.7), (20.0, 0.8)):  # (a loss spike: its panel log)
            model(torch.randn(4, 2)).sum().backward()
            w.step(loss=loss, accuracy=accuracy)
    dash = Dashboard(w)
    chosen = y_scales(dash.figure("metrics"))
    assert sorted(chosen.values()) == ["linear", "log"] and dash.log_y.value is True  # (the loss panel chose log)
    dash.refresh()  # (redrawn: the panels' choice, shown, not taken for the user's)
    assert y_scales(dash.figure("metrics")) == chosen and dash.log_y.value is True
    dash.log_y.value = True  # the user's tick, over the box the panels ticked: every panel log
    assert set(y_scales(dash.figure("metrics")).values()) == {"log"}
    dash.log_y.value = False  # and the untick: every panel linear, through redraws
    dash.refresh()
    assert set(y_scales(dash.figure("metrics")).values()) == {"linear"} and dash.log_y.value is False
    assert set(y_scales(Dashboard(w, log_y=False).figure("metrics")).values()) == {"linear"}  # (given: the user's)


def test_each_compare_tab_has_its_own_log_y_box_that_shows_the_scale_of_its_figure():
    """Compare had one "log y" box in both tabs, ticked while either figure drew log: a loss panel drawn log ticked
    it over the call site's figure drawn linear, and a tick there set the metrics too. A box a tab: each shows its
    figure's scale, and a tick sets that figure's alone."""
    from workbench.ui.notebook import Compare

    watches = {}
    for name in ("a", "b"):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        with workbench.watch(model) as watches[name]:
            for loss, accuracy in ((1.0, 0.5), (30.0, 0.6), (2e5, 0.7), (20.0, 0.8)):  # (a loss spike: its panel log)
                model(torch.ones(4, 2)).sum().backward()
                watches[name].step(loss=loss, accuracy=accuracy)
    compare = Compare(watches, kind="activation", statistic="norm")
    metrics_page, site_page = compare.tabs.children
    assert compare.log_y in metrics_page.children[0].children and compare.log_y not in site_page.children[0].children
    assert compare.log_site in site_page.children[0].children
    assert sorted(y_scales(compare.figure("metrics")).values()) == ["linear", "log"] and compare.log_y.value is True
    assert y_scales(compare.figure("site")) == {"yaxis": "linear"} and compare.log_site.value is False
    compare.tabs.selected_index = 1  # (the tab opened: its box says its figure's scale, whatever the other's)
    assert compare.open_figure == "site" and compare.log_site.value is False and compare.log_y.value is True
    compare.log_site.value = True  # a tick in the call site's tab: its figure log, the metrics as they chose
    assert y_scales(compare.figure("site")) == {"yaxis": "log"}
    assert sorted(y_scales(compare.figure("metrics")).values()) == ["linear", "log"] and compare.log_y.value is True
    compare.log_y.value = True  # the metrics' box, set to what it shows: the user's, every panel log
    assert set(y_scales(compare.figure("metrics")).values()) == {"log"}
    compare.log_y.value = False
    assert set(y_scales(compare.figure("metrics")).values()) == {"linear"}
    assert y_scales(compare.figure("site")) == {"yaxis": "log"} and compare.log_site.value is True
    compare.statistic.value = "std"  # another statistic: the call site's figure chooses again, the metrics' kept
    assert compare.log_site.value is (y_scales(compare.figure("site"))["yaxis"] == "log")
    assert set(y_scales(compare.figure("metrics")).values()) == {"linear"} and compare.log_y.value is False
    both = Compare(watches, kind="activation", statistic="norm", log_y=True)  # (a scale given: both figures')
    assert set(y_scales(both.figure("metrics")).values()) == {"log"} and both.log_y.value is True
    assert y_scales(both.figure("site")) == {"yaxis": "log"} and both.log_site.value is True


def test_a_log_y_box_set_to_the_scale_it_shows_is_the_users_in_compare_and_the_per_site_figure(tmp_path):
    """Compare's log y boxes and the Dashboard's per-site one show the figure's choice; set by the user to the value
    they showed, nothing was told (ipywidgets tells a change only) and the figures went on choosing."""
    from workbench.ui.notebook import Compare

    for name, scale in (("small", 1.0), ("large", 1e5), ("also small", 1.0)):  # (the large run's line dwarfs)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4))
        with workbench.watch(net, store=tmp_path / name) as w:
            for loss in (1.0, 0.9, 0.8):  # (a loss each panel draws on a linear y)
                net(torch.ones(2, 4) * scale).sum().backward()
                w.step(loss=loss)
    runs = [tmp_path / name for name in ("small", "large", "also small")]
    compare = Compare(*runs, kind="activation", statistic="norm", site="0")
    assert compare.log_site.value is True and y_scales(compare.figure("site")) == {"yaxis": "log"}
    compare.log_site.value = True  # (set to what it shows: the user's log from here)
    compare.run_checkboxes["large"].value = False  # (without the large run, the figure would choose linear)
    assert y_scales(compare.figure("site")) == {"yaxis": "log"} and compare.log_site.value is True
    chosen = Compare(*runs, kind="activation", statistic="norm", site="0")
    chosen.run_checkboxes["large"].value = False
    assert y_scales(chosen.figure("site")) == {"yaxis": "linear"} and chosen.log_site.value is False

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with torch.no_grad():
        net[1].weight.mul_(1e5)  # (the second layer's line dwarfs the first's: the per-site figure chooses log)
    with workbench.watch(net) as w:
        for _ in range(3):
            net(torch.ones(2, 4)).sum().backward()
            w.step()
    dash = Dashboard(w, kind="activation", statistic="norm", tab="sites")
    assert dash.log_sites.value is True and y_scales(dash.figure("sites")) == {"yaxis": "log"}
    dash.log_sites.value = True  # (the user's log: kept for the one site picked next, which alone draws linear)
    dash.sites.value = ("0",)
    assert y_scales(dash.figure("sites")) == {"yaxis": "log"} and dash.log_sites.value is True
    dash.kind.value = "param"  # (another kind: the figure's to choose again)
    dash.kind.value = "activation"
    dash.sites.value = ("0",)
    assert y_scales(dash.figure("sites")) == {"yaxis": "linear"} and dash.log_sites.value is False


def test_a_run_of_no_steps_after_an_experiments_steps_says_it_took_none_in_its_header():
    """``exp.start(0)`` after 4 steps said "finished · step 0 of 4 · 0%": the header read the step as the last one
    recorded (none), of a total counted from the experiment's first step. It says no step was taken; a run that
    continues an experiment counts its progress from where it began."""
    from workbench.ui.views import RunView

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    exp.start(4).join()
    run = exp.start(0)
    run.join()
    dash = Dashboard(run)
    assert "no steps taken (0 asked)" in dash.header.value and "step 0" not in dash.header.value
    assert dash.view.header()["step"] == run.step == 4
    more = exp.start(2)
    more.join()
    later = Dashboard(more)
    wait_for(lambda: "finished" in later.header.value, what="the run's end")
    assert "step 6 of 6" in later.header.value and "100%" in later.header.value
    # (before a continuing run's first step: where it began, none of its own steps taken)
    view = RunView(label="continued", total=15)
    view.first_step = 10
    header = figures.header_markdown(view)
    assert "step 10 of 15" in header and "value='0.000'" in header and " 0%" in header


@pytest.mark.parametrize("ending, status, said", [
    (ZeroDivisionError("a bug in the training loop"), "failed", "ZeroDivisionError: a bug in the training loop"),
    (KeyboardInterrupt(), "stopped", "interrupted by the user"),
    (None, "finished", None),
])
def test_a_dashboard_of_a_watch_says_how_it_ended_as_its_store_does(tmp_path, ending, status, said):
    # a training loop in a with-block that raised, was interrupted or ended: the dashboard drawn of the
    # watch says what the stored run says, never a bare "closed" over a loop that failed
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    try:
        with workbench.watch(model, store=tmp_path / "run") as w:
            dash = Dashboard(w, interval=0.05)
            for _ in range(2):
                model(torch.randn(4, 2)).sum().backward()
                w.step(loss=1.0)
            if ending is not None:
                raise ending
    except (ZeroDivisionError, KeyboardInterrupt):
        pass
    assert (w.status, workbench.load_run(tmp_path / "run").status) == (status, status)
    wait_for(lambda: not dash.following, what="the end of the watch drawn")
    assert dash.view.header()["status"] == status and f"<code>{status}</code>" in dash.header.value
    assert (said in dash.header.value) if said else (w.error is None)


def test_a_dashboard_and_a_compare_closed_just_after_their_watches_ended_show_the_end(shell):
    """Closed between two looks of their timers (``w.close(); dash.close()`` in one cell), the dashboard and the
    comparison kept what they drew before the end: shown again, the dashboard's header read ``running`` (and
    "no new step for 13 s") of a watch that had finished, and the comparison "no activation rows yet"."""
    from workbench.ui.notebook import Compare

    models = [torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)) for _ in range(2)]
    watches = [workbench.watch(model) for model in models]
    dash = Dashboard(watches[0], interval=3600)  # (its timer never looks: the end is drawn by close() or never)
    compare = Compare(*watches, interval=3600)
    for _ in range(3):
        for model, w in zip(models, watches):
            loss = model(torch.randn(8, 2)).pow(2).mean()
            loss.backward()
            w.step(loss=loss.item())
    for w in watches:
        w.close()
    dash.close()
    compare.close()
    dash.close()  # (twice: nothing more)
    compare.close()
    shell.user_ns.update(dash=dash, compare=compare)
    shell.run_cell("dash", cell_id="a")
    shell.run_cell("compare", cell_id="b")
    assert "finished" in dash.header.value and "step 3" in dash.header.value, dash.header.value
    assert "no longer follows" not in dash.header.value
    assert "none in this run" in dash.anomalies.value and "in this run" in dash.findings_summary.value
    assert figures.values(loss_trace(plotted(dash, "metrics"))["x"]).tolist() == [1, 2, 3]
    assert "rows yet" not in compare.message_html.value, compare.message_html.value
    assert "no longer follows" not in compare.message_html.value
    assert compare.figure("site") is not None and not dash.following and not compare.following


def test_a_dashboard_and_a_compare_of_stores_deleted_since_close_saying_why(tmp_path):
    """close() draws an ended run's end first: where its store was deleted since, reading it raised out of close(),
    and the dashboard went on following (its timer still running)."""
    import shutil

    from workbench.ui.notebook import Compare

    models = [torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)) for _ in range(2)]
    paths = [tmp_path / name for name in ("a", "b")]
    watches = [workbench.watch(model, store=path) for model, path in zip(models, paths)]
    for model, w in zip(models, watches):
        model(torch.randn(8, 2)).pow(2).mean().backward()
        w.step()
    dash = Dashboard(paths[0], interval=3600)  # (its timer never looks: the end is read by close())
    compare = Compare(*paths, interval=3600)
    for w, path in zip(watches, paths):
        w.close()
        shutil.rmtree(path)
    dash.close()
    compare.close()
    assert not dash.following and not compare.following
    assert "stopped updating" in dash.header.value and "stopped updating" in compare.message_html.value
