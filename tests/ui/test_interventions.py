"""Interventions on a live run and initial weights from a checkpoint: the handlers, without a browser."""

import time

import numpy as np
import pandas as pd
import pytest
import torch

import workbench
from workbench.instrument import load_run
from workbench.ui import live
from tests.models.test_efficientzero import lightzero_keys

# the weights hardly move and a batch is large: a statistic changes by the intervention alone (and by the
# batch drawn each step, a few per cent)
SLOW_LR = {"lr": 1e-6, "batch_size": 1024}


def start(manager, steps=100_000, store="run", **config):
    run, message = live.start_run(manager, "activation_mlp", {**SLOW_LR, **config}, 0, steps, 1, False, "*", store)
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
    rows = run.watch.to_pandas()
    rows = rows[(rows.module == module) & (rows.kind == kind)]
    return rows.set_index("step")[stat]


def test_an_intervention_changes_downstream_statistics_while_on_and_not_after(manager):
    run = start(manager)
    wait_for_step(run, 3)
    message = live.apply_intervention(manager, run.id, "layers.1", "scale", k=10.0)
    record = run.interventions[0]
    assert message.startswith("i1: **scale x10** at `layers.1`"), message
    wait_for_step(run, record.start + 4)
    assert "removed" in live.remove_applied(manager, run.id, "i1")
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
    live.apply_intervention(manager, run.id, "layers.3", "zero units", units="0-3, 7")
    record = run.interventions[0]
    wait_for_step(run, record.start + 2)
    live.remove_applied(manager, run.id, "i1")
    wait_for_step(run, record.end + 2)
    run.stop()
    assert record.what == "zero units [0, 1, 2, 3, 7]"
    # the recorded steps say it: its metric is in exactly the steps it was on
    metrics = run.watch.metrics()
    name = "intervention/i1: zero units [0, 1, 2, 3, 7] at layers.3"
    assert metrics.step[metrics[name].notna()].tolist() == list(range(record.start, record.end + 1))
    stored = load_run(run.watch.store.path)
    table = live.stored_interventions(stored)
    assert table.to_dict("records") == [{"id": "i1", "site": "layers.3", "intervention": "zero units [0, 1, 2, 3, 7]",
                                         "from step": record.start, "to step": record.end, "status": "recorded"}]
    # the units were zeroed in the rows of those steps (layers.3 is a 32-unit activation: 5/32 at least)
    zero = site_stat(run, "layers.3", "zero_frac")
    assert (zero.loc[record.start:record.end] >= 5 / 32).all()
    # the page: the band over its steps, the intervention named beside its site in the last-step table
    page = live.draw_page(live.RunView.from_run(stored), interventions=table)
    shapes = page.metrics_figure["layout"]["shapes"]
    assert {(s["x0"], s["x1"]) for s in shapes} == {(record.start - 0.5, record.end + 0.5)}
    assert not any(m.startswith("intervention/") for m in page.metrics)  # (not drawn as a metric panel)


def test_the_page_marks_a_site_while_its_intervention_is_on(manager):
    run = start(manager)
    wait_for_step(run, 2)
    live.apply_intervention(manager, run.id, "layers.1", "clamp", low=-0.1, high=0.1)
    wait_for_view(run, run.interventions[0].start + 1)
    page = live.draw_page(run.view, live.Controls(kind="activation"), interventions=run.intervention_frame())
    marks = dict(zip(page.latest.site, page.latest.intervention))
    assert marks["layers.1"] == "i1 clamp [-0.1, 0.1]" and marks["layers.2"] == ""
    assert page.latest.set_index("site").loc["layers.1", "max"] <= 0.1 + 1e-6
    sites, table, on = live.intervention_panel(manager, run.id)
    assert sites[:5] == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"] and on == ["i1"]
    assert table.status.tolist() == ["on"]


def test_noise_and_every_call_of_a_shared_module(manager):
    run, message = live.start_run(manager, "efficientzero_dynamics", {"batch_size": 4, "unroll_steps": 2}, 0,
                                  100_000, 1, False, "*", "")
    assert run is not None, message
    wait_for_step(run, 2)
    sites = live.intervention_sites(run.view)
    assert "activation" in sites and "activation#0" in sites  # the shared ReLU: every call, or one
    assert "Cannot" not in live.apply_intervention(manager, run.id, "activation#1", "noise", sigma=0.5)
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
    (("layers.1", "noise", "", None, -1.0), "sigma (Gaussian noise's standard deviation) must lie in [0, 1e+06]"),
    (("layers.1", "clamp", "", None, None, 1.0, float("nan")), "b (clamp's upper bound) must be a number"),
    (("layers.1", "zero units", "a-b"), "units: 'a-b' is not an index or a range"),
    (("layers.1", "zero units", "5-2"), "the range 5-2 runs backwards"),
    (("layers.1", "zero units", "0-5000"), "at most 4096 units"),
    (("layers.1", "zero units", "40"), "units [40] are out of range for dim 1 of its output of shape (1024, 32)"),
])
def test_bad_choices_are_messages_and_change_nothing(manager, args, expected):
    run = start(manager, store="")
    wait_for_step(run, 1)
    message = live.apply_intervention(manager, run.id, *args)
    assert message.startswith("**Cannot intervene:**") and expected in message, message
    assert run.interventions == [] and run.watch.interventions == [] and run.running


def test_no_run_an_ended_run_and_removing_what_is_not_on(manager):
    assert "Not attached to a run" in live.apply_intervention(manager, None, "layers.1", "scale", k=2)
    assert "No run 'r9'" in live.apply_intervention(manager, "r9", "layers.1", "scale", k=2)
    run = start(manager, steps=3, store="")
    run.join(60)
    assert "has ended (finished)" in live.apply_intervention(manager, run.id, "layers.1", "scale", k=2)
    assert "No intervention 'i1' is on" in live.remove_applied(manager, run.id, "i1")
    assert "pick an intervention" in live.remove_applied(manager, run.id, None)


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
    text, tree, outputs, experiment, settings = live.inspect_weights(str(tmp_path / "ez.pth.tar"))
    assert "LightZero EfficientZero dynamics network" in text and "dynamics_network.* keys taken out" in text
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
    run, message = live.start_run(manager, "efficientzero_dynamics", {"batch_size": 4}, 0, 2, 1, False, "*", "fromck",
                                  weights=str(tmp_path / "ez.pt"))
    assert run is not None, message
    assert torch.equal(run.experiment.model.conv.weight.detach(), state["conv.weight"])  # (before its first step)
    run.join(60)
    assert run.outcome == "finished" and run.weights == "ez.pt"
    assert load_run(run.watch.store.path).metadata["initial_weights"] == "ez.pt"


def test_weights_of_another_shape_are_refused_with_the_diff_and_the_settings_that_fit(manager, tmp_path):
    lightzero_file(tmp_path / "ez.pt", c=16, lstm=32)
    run, message = live.start_run(manager, "efficientzero_dynamics", {}, 0, 2, 1, False, "*", "",
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
    text, tree, outputs, experiment, _ = live.inspect_weights(str(path))
    assert text.startswith("**Refused:**") and expected in text, text
    assert tree.empty and outputs.empty and experiment is None
    run, message = live.start_run(manager, "activation_mlp", {}, 0, 2, 1, False, "*", "", weights=str(path))
    assert run is None and expected in message


def test_a_plain_state_dict_starts_the_experiment_whose_model_it_fits(manager, tmp_path):
    source = workbench.experiments.create("activation_mlp", seed=5).model
    torch.save(source.state_dict(), tmp_path / "mlp.pt")
    text, tree, _, experiment, _ = live.inspect_weights(str(tmp_path / "mlp.pt"))
    assert "plain state_dict" in text and experiment is None
    run, message = live.start_run(manager, "activation_mlp", {}, 0, 1, 1, False, "*", "",
                                  weights=str(tmp_path / "mlp.pt"))
    assert run is not None, message
    run.join(60)
    wrong, message = live.start_run(manager, "efficientzero_dynamics", {}, 0, 1, 1, False, "*", "",
                                    weights=str(tmp_path / "mlp.pt"))
    assert wrong is None and "missing (" in message and "unexpected (" in message
