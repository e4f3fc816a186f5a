"""A suite of deliberately broken trainings: each broken run's finding appears at the right site
within a few steps; healthy runs of every registered experiment family raise no warning or error."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import workbench
from workbench.diagnose import COLUMNS, diagnose
from workbench.experiments import create, list_experiments

from tests.diagnose.conftest import mlp, needs_updates, train
from tests.diagnose.runs import one_step


def findings(w, **thresholds) -> pd.DataFrame:
    frame = diagnose(w.to_pandas(), w.metrics(), **thresholds)
    assert list(frame.columns) == list(COLUMNS)
    return frame


def only(frame: pd.DataFrame, finding: str) -> pd.DataFrame:
    return frame[frame.finding == finding]


def test_relu_with_a_large_negative_bias_has_dead_units():
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)  # every pre-activation of layers.1 below 0
    f = only(findings(train(model, steps=5)), "dead_units")
    assert f.site.tolist() == ["layers.1"]  # the ReLU, not its container or the linear before
    row = f.iloc[0]
    assert (row.step, row.last_step, row.severity, row.kind) == (1, 5, "warning", "activation")
    assert "all 32 of its units output 0 for every input" in row.evidence


def test_a_healthy_relu_net_has_no_dead_units():
    assert only(findings(train(mlp("relu"), steps=5)), "dead_units").empty


def test_deep_sigmoid_net_with_large_weights_is_saturated():
    f = only(findings(train(mlp("sigmoid", depth=6, weight_scale=20.0), steps=5)), "saturated")
    assert "layers.1" in set(f.site)  # the first sigmoid, from the first step
    first = f[f.site == "layers.1"].iloc[0]
    assert first.step == 1 and first.last_step == 5
    assert set(f.site) <= {f"layers.{i}" for i in (1, 3, 5, 7, 9, 11)}  # sigmoids only, never a linear


def test_sigmoid_net_at_its_usual_scale_is_not_saturated():
    assert only(findings(train(mlp("sigmoid", depth=6), steps=5)), "saturated").empty


def test_deep_tanh_net_with_tiny_weights_has_vanishing_gradients():
    w = train(mlp("tanh", depth=8, weight_scale=0.05), steps=4)
    f = only(findings(w), "vanishing_gradients")
    assert f.site.tolist() == ["layers.0"] and f.iloc[0].step == 1
    # the evidence's numbers are the rows': first vs last site's output-gradient RMS
    rows = w.to_pandas()
    g = rows[(rows.kind == "grad_output") & (rows.step == 4)].set_index("module")
    rms = g.norm / g.numel ** 0.5
    assert f"{rms['layers.0']:.2g} at layers.0" in f.iloc[0].evidence
    assert f"{rms['layers.16']:.2g} at the last, layers.16" in f.iloc[0].evidence


def test_log_of_zero_inside_the_model_is_a_nan_origin_in_the_forward():
    # the ReLU's output goes through log: its zeros give -inf, which the layers after inherit
    f = findings(train(mlp("relu"), steps=3, patch=("layers.1", torch.log)))
    origin = only(f, "nan_origin")
    assert len(origin) == 1 and origin.iloc[0].site == "layers.1" and origin.iloc[0].step == 1
    assert origin.iloc[0].severity == "error" and origin.iloc[0].kind == "activation"
    assert "Inf" in origin.iloc[0].evidence and "forward" in origin.iloc[0].evidence
    assert "layers.2" in origin.iloc[0].evidence  # named as a site that only inherited it
    assert f.iloc[0].finding == "nan_origin"  # the most severe first


def test_a_nan_born_in_the_backward_pass_is_found_there():
    # sqrt of the negatives on the branch torch.where drops: a finite forward, a NaN gradient
    def root(t):
        return torch.where(t > 0, t.sqrt(), torch.zeros_like(t))

    w = train(mlp("relu"), steps=2, patch=("layers.2", root))
    origin = only(findings(w), "nan_origin").iloc[0]
    assert (origin.site, origin.kind, origin.step) == ("layers.1", "grad_output", 1)
    assert "backward" in origin.evidence
    rows = w.to_pandas()
    assert rows[(rows.step == 1) & (rows.kind == "activation")][["nan_count", "inf_count"]].sum().sum() == 0


def test_sgd_with_a_far_too_large_learning_rate_explodes_and_diverges():
    f = findings(train(mlp("relu"), steps=10, optimizer="sgd", lr=50.0))
    assert {"exploding_gradients", "update_ratio_high", "diverging"} <= set(f.finding)
    assert only(f, "exploding_gradients").step.min() <= 4
    assert set(only(f, "update_ratio_high").site) >= {"layers.0.weight"}
    assert f.iloc[0].severity == "error"


def test_a_bad_batch_is_a_loss_spike_at_its_step():
    f = only(findings(train(mlp("relu"), steps=20, spike_at=15)), "loss_spike")
    assert f.site.tolist() == ["loss"] and f.iloc[0].step == f.iloc[0].last_step == 15


@needs_updates
def test_sgd_far_too_large_learning_rate_update_ratio_is_high_per_parameter():
    w = train(mlp("relu"), steps=4, optimizer="sgd", lr=30.0, updates=True)
    f = only(findings(w), "update_ratio_high")
    assert "layers.0.weight" in set(f.site) and f.step.min() <= 1
    assert "||update|| / ||param|| " in f.iloc[0].evidence  # measured, not a bound


@needs_updates
def test_sgd_far_too_small_learning_rate_update_ratio_is_low():
    f = only(findings(train(mlp("relu"), steps=4, optimizer="sgd", lr=1e-7, updates=True)), "update_ratio_low")
    assert {"layers.0.weight", "layers.2.weight", "layers.4.weight"} <= set(f.site)
    assert f.step.min() == 1


@needs_updates
def test_a_healthy_adam_run_has_update_ratios_in_range():
    f = findings(train(mlp("relu"), steps=6, updates=True))
    assert f.empty


@pytest.mark.parametrize("name, config", [
    ("activation_mlp", {}),
    ("activation_mlp", {"activation": "relu", "depth": 4}),
    ("activation_mlp", {"activation": "sigmoid", "depth": 2}),
    ("activation_mlp", {"activation": "tanh", "depth": 3}),
    ("efficientzero_dynamics", {"batch_size": 8, "unroll_steps": 2, "lstm_hidden_size": 16}),
    ("ilql", {"batch_size": 8, "dataset_size": 64, "n_layer": 1, "n_embd": 32, "eval_prompts": 8}),
    ("query_stream", {"batch_size": 512}),
])
def test_healthy_runs_of_every_family_raise_no_warning_or_error(name, config):
    assert name in list_experiments()
    exp = create(name, **config)
    w = exp.watch()
    for _ in range(10):
        exp.step()
    w.close()
    f = findings(w)
    assert f[f.severity.isin(["warning", "error"])].empty, f.to_string()


def test_every_family_is_covered():
    assert set(list_experiments()) == {"activation_mlp", "efficientzero_dynamics", "ilql", "query_stream"}


def test_a_layer_no_gradient_reaches_has_vanishing_gradients():
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)  # layers.1 outputs 0 for every input: nothing flows back past it
    f = only(findings(train(model, steps=5)), "vanishing_gradients")
    assert f.site.tolist() == ["layers.0"]
    row = f.iloc[0]
    assert (row.step, row.last_step) == (1, 5) and "exactly 0" in row.evidence and "layers.0" in row.evidence


def test_a_run_recorded_every_nth_step_finds_what_persists_over_its_recorded_steps():
    """The loss is logged every step, the rows every 4th: the steps between do not end an episode
    of a condition seen in the rows (dead units for 3 recorded steps in a row), in a stored run's
    frames and in a live run's stream alike."""
    from workbench.diagnose import Diagnoser
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)
    x = torch.randn(64, 2)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    live = Diagnoser()
    with workbench.watch(model, every=4) as w:
        subscription = live.attach(w)
        for _ in range(12):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            one_step(w, opt, loss)
        live.flush()
        subscription.unsubscribe()
    assert sorted(set(w.to_pandas().step)) == [1, 5, 9] and len(w.metrics()) == 12
    for frame in (findings(w), live.findings()):
        dead = only(frame, "dead_units")
        assert dead.site.tolist() == ["layers.1"] and (dead.iloc[0].step, dead.iloc[0].last_step) == (1, 9)
