"""Interventions on a live run and initial weights from a checkpoint: the handlers, without a browser."""

import re
import time

import numpy as np
import pandas as pd
import pytest
import torch

import workbench
from workbench.instrument import load_run
from workbench.ui import intervention_menu, live_run, run_control, run_page, stored_runs, views, weights
from tests.models.test_efficientzero import lightzero_keys

# the weights hardly move and a batch is large: a statistic changes by the intervention alone (and by the
# batch drawn each step, a few per cent)
SLOW_LR = {"lr": 1e-6, "batch_size": 1024}


def start(manager, steps=100_000, store="run", **config):
    run, message = live_run.start_run(manager, "activation_mlp", {**SLOW_LR, **config}, 0, steps, 1, False, "*", store)
    assert run is not None, message
    return run


def wait_for_step(run, step, timeout=60.0):
    deadline = time.monotonic() + timeout
    while run.experiment.step_count < step:
        assert run.running, run.error
        assert time.monotonic() < deadline, f"the run never reached step {step}"
        time.sleep(0.01)


def wait_for_view(run, step, timeout=60.0):
    """Until the run's view (fed by its stream, a little behind the run) has taken in ``step``."""
    deadline = time.monotonic() + timeout
    while True:
        latest = run.view.latest("activation")
        if len(latest) and latest.step.max() >= step:
            return
        assert time.monotonic() < deadline, f"the view never reached step {step}"
        time.sleep(0.02)


def site_stat(run, module, stat="std", kind="activation"):
    rows, _ = run.frames()  # (from its store)
    rows = rows[(rows.module == module) & (rows.kind == kind)]
    return rows.set_index("step")[stat]


def test_an_intervention_changes_downstream_statistics_while_on_and_not_after(manager):
    run = start(manager)
    wait_for_step(run, 3)
    message = run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=10.0)
    record = run.interventions[0]
    assert message.startswith("i1: **scale x10** at `layers.1`"), message
    wait_for_step(run, record.start + 4)
    assert "removed" in run_control.remove_applied(manager, run.id, "i1")
    wait_for_step(run, record.end + 4)
    run.stop()
    first, last = record.start, record.end
    assert last >= first + 3
    own, downstream = site_stat(run, "layers.1"), site_stat(run, "layers.2")  # layers.2: the Linear after it
    steps = downstream.index
    before, during, after = steps[steps < first], steps[(steps >= first) & (steps <= last)], steps[steps > last]
    # applied between steps: the step before it is untouched, its first step is patched (x10)
    np.testing.assert_allclose(own[first] / own[first - 1], 10.0, rtol=0.1)
    np.testing.assert_allclose(own[during] / own[before].mean(), 10.0, rtol=0.1)
    assert (downstream[during] / downstream[before].mean()).min() > 5.0
    # removed: back to what it was (lr 1e-6: the weights have not moved)
    np.testing.assert_allclose(downstream[after] / downstream[before].mean(), 1.0, rtol=0.1)
    np.testing.assert_allclose(own[after] / own[before].mean(), 1.0, rtol=0.1)


def test_an_intervention_is_in_the_rows_step_and_in_the_stored_run(manager):
    run = start(manager)
    wait_for_step(run, 2)
    run_control.apply_intervention(manager, run.id, "layers.3", "zero units", units="0-3, 7")
    record = run.interventions[0]
    wait_for_step(run, record.start + 2)
    run_control.remove_applied(manager, run.id, "i1")
    wait_for_step(run, record.end + 2)
    run.stop()
    assert record.what == "zero units [0, 1, 2, 3, 7]"
    # the recorded steps say it: its metric is in exactly the steps it was on
    _, metrics = run.frames()
    name = "intervention/i1: zero units [0, 1, 2, 3, 7] at layers.3"
    assert metrics.step[metrics[name].notna()].tolist() == list(range(record.start, record.end + 1))
    stored = load_run(run.watch.store.path)
    table = stored_runs.stored_interventions(stored)
    assert table.to_dict("records") == [{"id": "i1", "site": "layers.3", "intervention": "zero units [0, 1, 2, 3, 7]",
                                         "from step": record.start, "to step": record.end, "status": "recorded"}]
    # the units were zeroed in the rows of those steps (layers.3 is a 32-unit activation: 5/32 at least)
    zero = site_stat(run, "layers.3", "zero_frac")
    assert (zero.loc[record.start:record.end] >= 5 / 32).all()
    # the page: the band over its steps, the intervention named beside its site in the last-step table
    page = run_page.draw_page(views.RunView.from_run(stored), interventions=table)
    shapes = page.metrics_figure["layout"]["shapes"]
    assert {(s["x0"], s["x1"]) for s in shapes} == {(record.start - 0.5, record.end + 0.5)}
    assert not any(m.startswith("intervention/") for m in page.metrics)  # (not drawn as a metric panel)


def test_the_page_marks_a_site_while_its_intervention_is_on(manager):
    run = start(manager)
    wait_for_step(run, 2)
    run_control.apply_intervention(manager, run.id, "layers.1", "clamp", low=-0.1, high=0.1)
    wait_for_view(run, run.interventions[0].start + 1)
    page = run_page.draw_page(run.view, run_page.Controls(kind="activation"), interventions=run.intervention_frame())
    marks = dict(zip(page.latest.site, page.latest.intervention))
    assert marks["layers.1"] == "i1 clamp [-0.1, 0.1]" and marks["layers.2"] == ""
    assert page.latest.set_index("site").loc["layers.1", "max"] <= 0.1 + 1e-6
    # shown under its site's name, on a line of its own (no column of its own: the table fits a 1400 px window)
    styled = run_page.shown_latest(page.latest)
    assert list(styled.data.columns) == run_page.LATEST_COLUMNS
    cells = [cell["display_value"] for row in styled._compute()._translate(None, None)["body"] for cell in row]
    assert "layers.<wbr>1<br><small>i1 clamp [-0.1, 0.1]</small>" in cells and "layers.<wbr>2" in cells
    sites, table, on = run_control.intervention_panel(manager, run.id)
    assert sites[:5] == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"] and on == ["i1"]
    assert table.status.tolist() == ["on"]


def test_the_findings_a_zeroed_layer_causes_name_the_intervention(manager):
    """Zeroing every unit of a layer makes them dead: the page's findings say an intervention was on."""
    from workbench.ui import findings as findings_view

    run = start(manager, store="")
    wait_for_step(run, 2)
    run_control.apply_intervention(manager, run.id, "layers.1", "zero units", units="0-31")
    start_step = run.interventions[0].start
    deadline = time.monotonic() + 60
    while True:  # (the findings follow the run on their own thread)
        note, table = findings_view.page_findings(run, {})  # (a new page's state: both sent)
        dead = table[(table.site == "layers.1") & (table.finding == "dead_units")]
        if len(dead) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    run.stop()
    assert len(dead), table
    assert dead.evidence.iloc[0].startswith(f"While i1 zero units [0, 1, 2, 3, 4, ... 31] (32 of them) at layers.1 "
                                            f"(from step {start_step}, still on) was on: ")
    assert "all 32 of its units output 0 for every input" in dead.evidence.iloc[0]  # (not "at least 100%")
    assert "held while an intervention was on" in note


def test_noise_and_every_call_of_a_shared_module(manager):
    run, message = live_run.start_run(manager, "efficientzero_dynamics", {"batch_size": 4, "unroll_steps": 2}, 0,
                                      100_000, 1, False, "*", "")
    assert run is not None, message
    wait_for_view(run, 2)
    sites = intervention_menu.intervention_sites(run.view)
    assert "activation" in sites and "activation#0" in sites  # the shared ReLU: every call, or one
    labels = dict((value, label) for label, value in intervention_menu.site_choices(sites))
    assert labels["activation"] == "activation (every call)" and labels["activation#0"] == "activation#0"
    assert "Cannot" not in run_control.apply_intervention(manager, run.id, "activation#1", "noise", sigma=0.5)
    record = run.interventions[0]
    assert (record.module, record.call) == ("activation", 1)
    wait_for_step(run, record.start + 1)
    run.stop()
    assert run.interventions[0].status == "ended with the run" and run.outcome == "stopped"


@pytest.mark.parametrize("args, expected", [
    (("layers.1", "shrink"), "intervention must be one of zero units, scale, noise, clamp, got 'shrink'"),
    (("", "scale", "", 2.0), "Pick a call site"),
    (("layers.9", "scale", "", 2.0), "'layers.9' is not a call site of this run's model"),
    (("layers.1", "scale", "", None), "k (scale the output by k) must be a number"),
    (("layers.1", "scale", "", 1e9), "must lie in [-1e+06, 1e+06], got 1e+09"),
    (("layers.1", "scale", "", 1000001), "must lie in [-1e+06, 1e+06], got 1000001."),  # (it read "got 1e+06")
    (("layers.1", "noise", "", None, -1.0), "sigma (Gaussian noise's standard deviation) must lie in [0, 1e+06]"),
    (("layers.1", "clamp", "", None, None, 1.0, float("nan")), "b (clamp's upper bound) must be a number"),
    (("layers.1", "zero units", "a-b"), "units: 'a-b' is not an index or a range"),
    (("layers.1", "zero units", "5-2"), "the range 5-2 runs backwards"),
    (("layers.1", "zero units", "0-5000"), "at most 4096 units"),
    (("layers.1", "zero units", "40"), "units [40] are out of range for dim 1 of its output of shape (1024, 32)"),
    (("layers.1", "zero units", "0-99"), "units [32, 33, 34, 35, 36, ... 99] (68 of them) are out of range"),
    (("layers.1", "scale", "", None), "it is missing (an empty box, or one holding a number beyond the floating"),
])
def test_bad_choices_are_messages_and_change_nothing(manager, args, expected):
    run = start(manager, store="")
    wait_for_step(run, 1)
    message = run_control.apply_intervention(manager, run.id, *args)
    assert message.startswith("**Cannot intervene:**") and expected in message, message
    assert run.interventions == [] and run.watch.interventions == [] and run.running


def test_no_run_an_ended_run_and_removing_what_is_not_on(manager):
    assert "Not attached to a run" in run_control.apply_intervention(manager, None, "layers.1", "scale", k=2)
    assert "No run 'r9'" in run_control.apply_intervention(manager, "r9", "layers.1", "scale", k=2)
    run = start(manager, steps=3, store="")
    run.join(60)
    assert "has ended (finished)" in run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=2)
    assert "No intervention 'i1' is on" in run_control.remove_applied(manager, run.id, "i1")
    assert "pick an intervention" in run_control.remove_applied(manager, run.id, None)



def test_the_same_intervention_applied_twice_is_refused_and_acts_once(manager):
    # (a second Apply of scale x10 at layers.1, a double click on a slow page, put in a second patch: x100)
    run = start(manager, store="")
    wait_for_step(run, 1)
    assert run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=10).startswith("i1: ")
    message = run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=10)
    assert message.startswith("**Cannot intervene:** i1 already applies scale x10 at layers.1"), message
    assert [r.id for r in run.interventions] == ["i1"] and len(run.watch.interventions) == 1
    # (another value, another site, or the same once the first is removed: each goes in)
    assert run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=2).startswith("i2: ")
    assert run_control.apply_intervention(manager, run.id, "layers.3", "scale", k=10).startswith("i3: ")
    run_control.remove_applied(manager, run.id, "i1")
    assert run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=10).startswith("i4: ")
    run.stop()


def test_interventions_whose_labels_read_alike_but_whose_values_differ_both_go_in(manager):
    # (the check compared the labels: zero units 0-4, 8, 9, 7 read "[0, 1, 2, 3, 4, ... 7] (8 of them)" as 0-7 does,
    # and scale x1.0000001 read "scale x1" as x1.0000002 does; each was refused as already on)
    run = start(manager, store="")
    wait_for_step(run, 1)
    assert run_control.apply_intervention(manager, run.id, "layers.1", "zero units", units="0-7").startswith("i1: ")
    said = run_control.apply_intervention(manager, run.id, "layers.1", "zero units", units="0-4, 8, 9, 7")
    assert said.startswith("i2: "), said
    assert run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=1.0000001).startswith("i3: ")
    said = run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=1.0000002)
    assert said.startswith("i4: "), said
    assert run_control.apply_intervention(manager, run.id, "layers.1", "scale", k=1.0000002).startswith(
        "**Cannot intervene:** i4 already applies")
    run.stop()


# ---------------------------------------------------------------- initial weights
EXPERIMENT_DYNAMICS = dict(c=8, a=4, blocks=1, head=8, hw=(4, 4), hidden=32, layers=1, support=21, lstm=64)


def lightzero_file(path, seed=0, **shapes):
    """A whole EfficientZero model's saved dict in LightZero's layout, made from its key list alone."""
    g = torch.Generator().manual_seed(seed)
    state = {k: (torch.tensor(3) if k.endswith("num_batches_tracked") else
                 torch.rand(s, generator=g) + 0.5 if k.endswith("running_var") else torch.randn(s, generator=g) * 0.2)
             for k, s in lightzero_keys("BN", **{**EXPERIMENT_DYNAMICS, **shapes}).items()}
    torch.save({"model": {"representation_network.conv.weight": torch.randn(8, 3, 3, 3),
                          **{f"dynamics_network.{k}": v for k, v in state.items()}}, "last_iter": 3}, path)
    return state


def test_an_uploaded_lightzero_checkpoint_is_inspected_and_fills_the_form(tmp_path):
    state = lightzero_file(tmp_path / "ez.pth.tar")
    text, tree, outputs, experiment, settings, tensors = weights.inspect_weights(str(tmp_path / "ez.pth.tar"))
    assert "LightZero EfficientZero dynamics network" in text
    assert tensors.empty  # (a model is built from it: its module tree and outputs say more)
    assert "dynamics_network.\\* keys taken out" in text  # (Markdown: an asterisk, not emphasis)
    assert experiment == "efficientzero_dynamics"
    assert settings == {"latent_channels": 8, "actions": 4, "spatial": 4, "num_res_blocks": 1,
                        "lstm_hidden_size": 64, "support_size": 21, "fc_reward_layers": [32]}
    assert "resblocks.0.conv1.0" in tree.module.tolist()
    # the outputs shown are those of the network with these weights on the example inputs
    model = workbench.models.efficientzero.DynamicsNetwork(
        observation_shape=[8, 4, 4], action_encoding_dim=4, num_channels=12, reward_head_channels=8,
        fc_reward_layers=[32], output_support_size=21, flatten_output_size_for_reward_head=128,
        lstm_hidden_size=64)
    model.load_state_dict(state)
    args, kwargs = workbench.get_spec("efficientzero_dynamics").example_inputs(model.eval(), 2,
                                                                               torch.Generator().manual_seed(0))
    with torch.no_grad():
        latent, _, value_prefix = model(*args, **kwargs)
    shown = outputs.set_index("output")
    assert shown.loc["out.0", "shape"] == "(2, 8, 4, 4)"
    np.testing.assert_allclose(shown.loc["out.2", ["mean", "std"]].astype(float),
                               [value_prefix.mean().item(), value_prefix.std().item()], atol=1e-6)
    np.testing.assert_allclose(shown.loc["out.0", "max"], latent.max().item(), atol=1e-6)


def test_a_run_trains_from_uploaded_weights(manager, tmp_path):
    state = lightzero_file(tmp_path / "ez.pt")
    run, message = live_run.start_run(manager, "efficientzero_dynamics", {"batch_size": 4}, 0, 2, 1, False, "*",
                                      "fromck", weights=str(tmp_path / "ez.pt"))
    assert run is not None, message
    run.join(60)
    assert run.outcome == "finished" and run.weights == "ez.pt"
    assert load_run(run.watch.store.path).metadata["initial_weights"] == "ez.pt"
    assert "from the weights: `ez.pt`" in stored_runs.replay(manager.root, "fromck")[1]  # (its replay says so)
    unstarted = live_run.LiveRun("efficientzero_dynamics", {"batch_size": 4}, 0, 1, weights=str(tmp_path / "ez.pt"))
    try:  # (made, not started: no step has moved its weights)
        for key, value in state.items():
            assert torch.equal(unstarted.experiment.model.state_dict()[key], value), key
    finally:
        unstarted.watch.close()


def test_weights_of_another_shape_are_refused_with_the_diff_and_the_settings_that_fit(manager, tmp_path):
    lightzero_file(tmp_path / "ez.pt", c=16, lstm=32)
    run, message = live_run.start_run(manager, "efficientzero_dynamics", {}, 0, 2, 1, False, "*", "",
                                      weights=str(tmp_path / "ez.pt"))
    assert run is None and manager.runs() == []
    assert message.startswith("**Could not start from these weights:**")
    assert "conv.weight checkpoint (16, 20, 3, 3) vs model (8, 12, 3, 3)" in message
    assert "latent_channels=16, actions=4" in message and "lstm_hidden_size=32" in message


@pytest.mark.parametrize("content, expected", [
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(10 * 2**20)), "not a torch checkpoint"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: torch.save({"model": {"layers.0.weight": torch.zeros(2)}, "x": pd.Timestamp(0)}, p),
     "refused unread"),
])
def test_bad_uploads_are_refused_by_inspection_and_by_start(manager, tmp_path, content, expected):
    path = tmp_path / "bad.pt"
    content(path)
    text, tree, outputs, experiment, _, tensors = weights.inspect_weights(str(path))
    assert text.startswith("**Refused:**") and expected in text, text
    assert tree.empty and outputs.empty and tensors.empty and experiment is None
    run, message = live_run.start_run(manager, "activation_mlp", {}, 0, 2, 1, False, "*", "", weights=str(path))
    assert run is None and expected in message


def test_a_plain_state_dict_starts_the_experiment_whose_model_it_fits(manager, tmp_path):
    source = workbench.experiments.create("activation_mlp", seed=5).model
    torch.save(source.state_dict(), tmp_path / "mlp.pt")
    text, tree, _, experiment, _, tensors = weights.inspect_weights(str(tmp_path / "mlp.pt"))
    assert "plain state_dict" in text and experiment is None
    assert "**Start** loads it into the experiment picked in the form" in text and "load_weights" not in text
    assert tree.empty and tensors.tensor.tolist() == list(source.state_dict())  # (its tensors, in its order)
    run, message = live_run.start_run(manager, "activation_mlp", {}, 0, 1, 1, False, "*", "",
                                      weights=str(tmp_path / "mlp.pt"))
    assert run is not None, message
    run.join(60)
    wrong, message = live_run.start_run(manager, "efficientzero_dynamics", {}, 0, 1, 1, False, "*", "",
                                        weights=str(tmp_path / "mlp.pt"))
    assert wrong is None and "missing (" in message and "unexpected (" in message


def test_a_plain_state_dict_is_listed_by_its_tensors_name_shape_dtype_and_numel(tmp_path):
    torch.save({"encoder.embed.weight": torch.zeros(10, 4, dtype=torch.float16), "head.bias": torch.zeros(3),
                "steps": torch.tensor(7)}, tmp_path / "plain.pt")
    text, tree, outputs, experiment, settings, tensors = weights.inspect_weights(str(tmp_path / "plain.pt"))
    assert "3 tensors, 44 numbers, read from plain.pt" in text and "below, its tensors" in text
    assert tree.empty and outputs.empty and (experiment, settings) == (None, {})
    assert tensors.columns.tolist() == weights.TENSOR_COLUMNS == ["tensor", "shape", "dtype", "numel"]
    assert tensors.values.tolist() == [["encoder.embed.weight", "(10, 4)", "float16", 40],
                                       ["head.bias", "(3,)", "float32", 3], ["steps", "()", "int64", 1]]


def test_an_agilerl_layout_ilql_checkpoint_is_inspected_and_trained_from(manager, tmp_path):
    agent = workbench.create_model("ilql", n_layer=1, n_embd=32, n_head=2)
    agent.save_checkpoint(tmp_path / "agent.pt")
    text, tree, outputs, experiment, settings, tensors = weights.inspect_weights(str(tmp_path / "agent.pt"))
    assert "AgileRL-layout ILQL agent" in text and "ILQL.save_checkpoint's dict" in text and tensors.empty
    assert (experiment, settings) == ("ilql", {"n_layer": 1, "n_embd": 32, "n_head": 2})
    assert {"out.vs", "out.logits"} <= set(outputs.output) and "model.h.0.attn" in tree.module.tolist()
    run, message = live_run.start_run(manager, "ilql", {**settings, "eval_every": 0, "dataset_size": 64,
                                                        "batch_size": 8}, 0, 1, 1, False, "*", "",
                                      weights=str(tmp_path / "agent.pt"))
    assert run is not None, message
    run.join(60)
    assert run.outcome == "finished", run.error
    # the model a run starts from has the checkpoint's weights (a run made, not started: no step moves them)
    unstarted = live_run.LiveRun("ilql", {**settings, "eval_every": 0, "dataset_size": 64}, 0, 1,
                                 weights=str(tmp_path / "agent.pt"))
    try:
        for key, value in agent.state_dict().items():
            assert torch.equal(unstarted.experiment.model.state_dict()[key], value), key
    finally:
        unstarted.watch.close()


# ---------------------------------------------------------------- in the browser (chromium)
# a Gradio Dataframe as the page shows it: the column titles and each row's cell texts
TABLE = """el => ({
    heads: [...el.querySelectorAll('thead th')].map(th => th.getAttribute('title') || th.textContent.trim()),
    rows: [...el.querySelectorAll('tbody tr')].map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent.trim())),
})"""


def table(page, elem_id) -> pd.DataFrame:
    element = page.locator(f"#{elem_id}")
    element.scroll_into_view_if_needed()  # (a virtual table draws the rows in view only)
    found = element.evaluate(TABLE)
    rows = [r[:len(found["heads"])] for r in found["rows"] if len(r) >= len(found["heads"]) and any(r)]
    return pd.DataFrame(rows, columns=found["heads"])


def wait_table(page, elem_id, until, timeout=60.0) -> pd.DataFrame:
    """The table once ``until(frame)`` holds (the page refreshes every second)."""
    deadline = time.monotonic() + timeout
    while True:
        frame = table(page, elem_id)
        if not frame.empty and until(frame):
            return frame
        assert time.monotonic() < deadline, f"#{elem_id} never showed what was expected:\n{frame}"
        time.sleep(0.25)


def within(trace, low, high):
    """The values of a line's points that stand for steps in [low, high] alone: a point of a thinned history
    stands for the steps since the point before it (a bucket that straddles a boundary is left out)."""
    x, y = np.asarray(trace["x"], float), np.asarray([np.nan if v is None else v for v in trace["y"]], float)
    since = np.r_[0.0, x[:-1]] + 1  # the first step each point stands for
    return y[(since >= low) & (x <= high)]


def median_between(trace, low, high):
    """The median of a line's values over steps [low, high] (:func:`within`)."""
    return float(np.nanmedian(within(trace, low, high)))


@pytest.mark.browser
def test_intervene_on_a_live_run_in_the_browser(page):
    from playwright.sync_api import expect

    from tests.ui.test_browser import PATIENCE, _screenshot, choose, lines, options, start as start_in_page, traces

    start_in_page(page, "activation_mlp", 100_000, store="intervened", lr="0.000001", batch_size="1024")
    expect(page.locator("#run-status")).to_contain_text("running", timeout=60_000)
    page.locator("#intervene").get_by_text("Intervene on this run").click()  # (folded at first)
    expect(page.locator("#iv-apply")).to_be_visible()
    # the tick that draws the first recorded step lists its sites in the panel (an empty list does not open)
    expect(page.locator("#live-latest")).to_contain_text("layers.1", timeout=60_000)
    deadline = time.monotonic() + PATIENCE
    listed = options(page, "iv-site")
    while "layers.1" not in listed:  # the sites the run has recorded (read once a redraw has filled them)
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
        listed = options(page, "iv-site")
    assert listed[:5] == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"]
    choose(page, "iv-site", "layers.1")
    expect(page.locator("#iv-site input")).to_have_value("layers.1")
    page.locator("#iv-k input").fill("10")
    page.locator("#iv-apply").click()
    # (applied between two steps: the reply waits for the step in progress, of a batch of 1024)
    expect(page.locator("#iv-message")).to_contain_text("i1: scale x10 at layers.1 from step")
    first = int(re.search(r"from step (\d+)", page.locator("#iv-message").inner_text())[1])
    panel = wait_table(page, "iv-table", lambda f: f.status.tolist() == ["on"])
    assert panel[["id", "site", "intervention", "from step"]].values.tolist() == [["i1", "layers.1", "scale x10",
                                                                                   str(first)]]
    # the activation std per call site, as the page draws it: layers.2 (the Linear after layers.1) x10 while on
    on = lines(traces(page, "live-series", lambda t: "layers.2" in lines(t)
                      and len(within(lines(t)["layers.2"], first, 10**9)) >= 3))
    # (medians of the points whose buckets lie on one side: a long history is thinned into buckets)
    before, during = median_between(on["layers.2"], 1, first - 1), median_between(on["layers.2"], first, 10**9)
    assert during > 5 * before, (before, during)
    # the band over the steps it is on, on the metrics and the sites' figures
    for figure in ("live-series", "live-metrics"):
        bands = page.locator(f"#{figure} .js-plotly-plot").evaluate(
            "el => (el.layout.shapes || []).map(s => [s.x0, s.label && s.label.text])")
        assert [first - 0.5, "i1"] in bands, bands
    page.set_viewport_size({"width": 1400, "height": 1700})  # (the panel, the metrics and the sites' figure)
    page.locator("#intervene").evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(1500)
    _screenshot(page, "interventions.png", full_page=False)
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.locator("#iv-remove").click()
    expect(page.locator("#iv-message")).to_contain_text("i1 (scale x10 at layers.1) removed")
    removed = wait_table(page, "iv-table", lambda f: f.status.tolist() == ["removed"])
    end = int(removed["to step"].iloc[0])
    off = lines(traces(page, "live-series", lambda t: len(within(lines(t)["layers.2"], end + 1, 10**9)) >= 3))
    after = median_between(off["layers.2"], end + 1, 10**9)
    assert 0.8 < after / before < 1.25, (before, after)
    page.locator("#run-stop").click()
    expect(page.locator("#run-status")).to_contain_text("stopped")
    # the stored run: its replay names the intervention and bands its steps
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-table")).to_contain_text("intervened")
    choose(page, "run-path", "intervened")  # (after the refresh's reply, which sends the list anew)
    expect(page.locator("#replay-header")).to_contain_text(f"Interventions: i1 scale x10 at layers.1, steps "
                                                           f"{first}-{end}")
    bands = page.locator("#replay-series .js-plotly-plot").evaluate(
        "el => (el.layout.shapes || []).map(s => [s.x0, s.x1])")
    assert bands == [[first - 0.5, end + 0.5]]


@pytest.mark.browser
def test_upload_a_lightzero_checkpoint_inspect_it_and_train_from_it(page, runs_root, tmp_path):
    from playwright.sync_api import expect

    from tests.ui.test_browser import RULED, _screenshot, table_borders

    shapes = dict(c=6, a=3, blocks=2, hw=(3, 3), hidden=16, layers=1, support=11, lstm=16)  # not the form's defaults
    state = lightzero_file(tmp_path / "efficientzero_ckpt.pth.tar", seed=3, **shapes)
    page.get_by_role("tab", name="Experiments").click()
    if not page.locator("#experiment-list").is_visible():  # (the form folds away once a run starts)
        page.locator("#run-config").get_by_text("New run").click()
    page.locator("#run-weights input[type=file]").set_input_files(str(tmp_path / "efficientzero_ckpt.pth.tar"))
    summary = page.locator("#weights-summary")
    expect(summary).to_contain_text("LightZero EfficientZero dynamics network")
    expect(summary).to_contain_text("dynamics_network.* keys taken out")
    expect(summary).to_contain_text("It fits the efficientzero_dynamics experiment with latent_channels=6, actions=3, "
                                    "spatial=3, num_res_blocks=2, lstm_hidden_size=16, support_size=11")
    # the form of the experiment it fits, filled with its settings
    expect(page.locator("#experiment-list").get_by_label("efficientzero_dynamics", exact=True)).to_be_checked()
    form = page.locator("#run-config")
    expect(form.get_by_label("latent_channels", exact=True)).to_have_value("6")
    expect(form.get_by_label("lstm_hidden_size", exact=True)).to_have_value("16")
    # inspected: the module tree and its outputs on the example inputs are those of the module it was saved from
    expect(page.locator("#weights-tree")).to_contain_text("DynamicsNetwork")
    model = workbench.models.efficientzero.DynamicsNetwork(
        observation_shape=[6, 3, 3], action_encoding_dim=3, num_res_blocks=2, num_channels=9, reward_head_channels=8,
        fc_reward_layers=[16], output_support_size=11, flatten_output_size_for_reward_head=72, lstm_hidden_size=16)
    model.load_state_dict(state)
    args, kwargs = workbench.get_spec("efficientzero_dynamics").example_inputs(model.eval(), 2,
                                                                               torch.Generator().manual_seed(0))
    with torch.no_grad():
        latent, _, value_prefix = model(*args, **kwargs)
    outputs = wait_table(page, "weights-outputs", lambda f: "out.2" in set(f.output)).set_index("output")
    assert outputs.index.tolist() == ["out.0", "out.1.0", "out.1.1", "out.2"]
    assert outputs.loc["out.0", "shape"] == "(2, 6, 3, 3)"
    np.testing.assert_allclose(outputs.loc["out.0", ["mean", "std", "min", "max"]].astype(float),
                               [latent.mean(), latent.std(), latent.min(), latent.max()], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs.loc["out.2", ["mean", "std"]].astype(float),
                               [value_prefix.mean(), value_prefix.std()], rtol=1e-5, atol=1e-6)
    assert table_borders(page.locator("#weights-outputs table")) == RULED  # (a rule under each row, no frame)
    page.locator("#weights-inspect").evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    _screenshot(page, "checkpoint_upload.png", full_page=False)
    # Start: the run trains from these weights
    page.locator("#run-steps input").fill("3")
    page.locator("#run-store textarea, #run-store input").first.fill("from-lightzero")
    page.locator("#run-start").click()
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    stored = load_run(runs_root / "from-lightzero")
    assert stored.metadata["initial_weights"] == "efficientzero_ckpt.pth.tar"
    assert stored.metadata["config"]["latent_channels"] == 6 and stored.steps == [1, 2, 3]


@pytest.mark.browser
def test_bad_uploads_are_refused_and_the_server_stays_up(page, tmp_path):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Experiments").click()
    if not page.locator("#experiment-list").is_visible():  # (the form folds away once a run starts)
        page.locator("#run-config").get_by_text("New run").click()
    def upload(path):  # as a person does: clear the file shown (if any), then pick the next
        if not page.locator("#run-weights input[type=file]").count():
            page.locator("#run-weights button[aria-label='Clear']").click()
        page.locator("#run-weights input[type=file]").set_input_files(str(path))

    info, summary = page.locator("#weights-info"), page.locator("#weights-summary")
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "random.bin").write_bytes(np.random.default_rng(1).bytes(10 * 2**20))
    torch.save({"conv.weight": torch.zeros(2), "x": Payload()}, tmp_path / "code.pt")
    lightzero_file(tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 3])
    for name, expected in [("random.bin", "'random.bin' is not a torch checkpoint"),
                           ("code.pt", "refused unread (torch.load(weights_only=True)) and nothing in it ran"),
                           ("truncated.pt", "'truncated.pt' is not a readable torch checkpoint: it is damaged or "
                                            "truncated")]:
        upload(tmp_path / name)
        expect(info).to_contain_text(expected, timeout=60_000)  # ("Refused:" may be the last file's)
        expect(summary).to_contain_text(expected)
        expect(page.locator("#weights-tree")).to_be_hidden()  # (a file refused shows no table)
        expect(page.locator("#weights-tensors")).to_be_hidden()
    assert not marker.exists()
    # another architecture: inspected as a plain state_dict, refused by Start with the diff
    torch.save(workbench.experiments.create("activation_mlp").model.state_dict(), tmp_path / "mlp.pt")
    upload(tmp_path / "mlp.pt")
    expect(summary).to_contain_text("A plain state_dict names no model to build")
    tensors = page.locator("#weights-tensors")  # (its tensors, where no module tree is)
    expect(tensors).to_contain_text("layers.0.weight")
    listed = tensors.evaluate("""el => ({
        heads: [...el.querySelectorAll('thead th')].map(th => th.getAttribute('title')),
        first: [...el.querySelector('[role=row][data-index="0"]').querySelectorAll('[role=gridcell]')]
               .map(cell => cell.textContent.trim())})""")
    assert listed == {"heads": ["tensor", "shape", "dtype", "numel"],
                      "first": ["layers.0.weight", "(32, 2)", "float32", "64"]}, listed
    expect(page.locator("#weights-tree")).to_be_hidden()
    page.locator("#experiment-list").get_by_label("efficientzero_dynamics", exact=True).check()
    page.wait_for_selector("#experiment-overview:has-text('efficientzero_dynamics')")
    # (its form comes with a render of its own: Start before it would start the last form's experiment)
    expect(page.locator("#run-config").get_by_label("lstm_hidden_size", exact=True)).to_be_visible()
    page.locator("#run-start").click()
    message = page.locator("#start-message")
    expect(message).to_contain_text("Could not start from these weights")
    expect(message).to_contain_text("missing (")
    expect(message).to_contain_text("unexpected (")
    expect(page.locator("#run-status")).to_contain_text("No run on this page")
    # the server is up: a good checkpoint is read after the bad ones
    upload(tmp_path / "full.pt")
    expect(summary).to_contain_text("LightZero EfficientZero dynamics network")
    expect(page.locator("#weights-tree")).to_contain_text("DynamicsNetwork")
    expect(page.locator("#weights-tensors")).to_be_hidden()


@pytest.mark.browser
def test_a_continued_or_new_run_clears_the_intervention_message_of_the_run_before(page):
    # (the panel kept "i1 (scale x0 at layers.1) removed: ..." of the last run under the next one's empty table)
    from playwright.sync_api import expect

    from tests.ui.test_browser import start as start_in_page

    status, message = page.locator("#run-status"), page.locator("#iv-message")

    def say_something():  # Apply with no site picked: a message about the page's run
        page.locator("#iv-apply").click()
        expect(message).to_contain_text("Pick a call site")

    start_in_page(page, "activation_mlp", 100_000)
    expect(status).to_contain_text("running", timeout=60_000)
    page.locator("#run-pause").click()  # (the server answers at once while no run trains)
    expect(status).to_contain_text("paused")
    page.locator("#intervene").get_by_text("Intervene on this run").click()  # (folded at first)
    say_something()
    page.locator("#run-stop").click()
    expect(status).to_contain_text("stopped")
    expect(message).to_contain_text("Pick a call site")  # (about the run that ended: it stays)
    page.locator("#continue-steps input").fill("100000")
    page.locator("#run-continue").click()
    expect(page.locator("#live-message")).to_contain_text("continuing")
    expect(message).to_have_text("")
    page.locator("#run-pause").click()
    expect(status).to_contain_text("paused")
    say_something()
    start_in_page(page, "activation_mlp", 100_000)
    started = page.locator("#live-message")  # ("Started r<k> ...; this page is attached to it.", of the new run)
    expect(started).not_to_contain_text("continuing", timeout=60_000)
    expect(started).to_contain_text("this page is attached to it")
    expect(message).to_have_text("")
    page.locator("#run-stop").click()
    expect(status).to_contain_text("stopped")


@pytest.mark.browser
def test_the_interventions_table_shows_every_column_without_a_sideways_scroll(page):
    # (the intervention named in full, "zero units [0, 1, 2, 3, 4, ... 7] (8 of them)", pushed its steps and its
    # status out of sight to the right of the panel's table)
    from playwright.sync_api import expect

    from tests.ui.test_browser import PATIENCE, choose, options, start as start_in_page, assert_whole_at_widths

    status = page.locator("#run-status")
    start_in_page(page, "activation_mlp", 100_000)
    expect(status).to_contain_text("running", timeout=60_000)
    page.locator("#run-pause").click()
    expect(status).to_contain_text("paused")
    page.locator("#intervene").get_by_text("Intervene on this run").click()  # (folded at first)
    deadline = time.monotonic() + PATIENCE
    while "layers.1" not in options(page, "iv-site"):  # (the sites the run has recorded, once a redraw filled them)
        assert time.monotonic() < deadline
        time.sleep(0.5)
    choose(page, "iv-site", "layers.1")
    choose(page, "iv-op", "zero units")
    page.locator("#iv-units input, #iv-units textarea").first.fill("0-7")
    page.locator("#iv-apply").click()
    expect(page.locator("#iv-message")).to_contain_text("i1: zero units")
    table = page.locator("#iv-table")
    expect(table).to_contain_text("(8 of them)")
    assert_whole_at_widths(page, table, (1400, 800))
    header = [h.replace("⋮", "").strip() for h in table.locator("th").all_inner_texts()]
    assert header == ["id", "site", "intervention", "from step", "to step", "status"]
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.locator("#run-stop").click()
    expect(status).to_contain_text("stopped")
