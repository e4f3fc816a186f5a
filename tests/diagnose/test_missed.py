"""What the diagnoses used to miss (a layer mostly, not wholly, dead; a loss stuck at chance after a first fall),
what they leave unsaid on purpose (a sigmoid at a saturation index of 0.7 that trains), and the live findings'
frame, which an open finding that grows each step no longer has drawn anew at every call."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import workbench
from tests.diagnose.conftest import mlp, train
from workbench.diagnose import Diagnoser, Thresholds, diagnose

from tests.diagnose.runs import one_step, shifted_mlp
from tests.diagnose.test_findings import row


def test_a_layer_three_quarters_dead_is_found_with_its_dead_units_counted():
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias[:24] = -10.0  # 24 of the 32 units of layers.1 never fire; the 8 others, half the time
    f = train(model, steps=6).diagnose()
    assert f[["site", "finding", "step", "last_step"]].values.tolist() == [["layers.1", "dead_units", 1, 6]]
    # ~86% zeros, below the bound's 90% of old; the bias before it counts them: its gradient is 0 at dead units
    assert "24 of its 32 units output 0 for every input (their entries of the gradient of layers.0.bias" \
        in f.evidence[0]


def test_a_layer_half_dead_is_found_below_the_zero_fraction_its_count_read_from_the_bias_before_it():
    # 16 of 32 units never fire (the 16 others, half the time): 75% zeros in all, below dead_zero_frac (80%); the bias
    # gradient before it counts them (on some batches one more unit of this init fires for no input: 17)
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias[:16] = -10.0
    w = train(model, steps=6)
    rows = w.to_pandas()
    assert rows[(rows.module == "layers.1") & (rows.kind == "activation")].zero_frac.max() < 0.8
    f = w.diagnose()
    assert f[["site", "finding", "step", "last_step"]].values.tolist() == [["layers.1", "dead_units", 1, 6]]
    assert re.match(r"1[67] of its 32 units \(5[03]%; threshold 50%\) output 0 for every input at step 6 \(their "
                    r"entries of the gradient of layers\.0\.bias", f.evidence[0])
    assert "the others fire for some inputs" in f.evidence[0]
    # under the share, not found (lower dead_unit_share to find it)
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias[:12] = -10.0
    w = train(model, steps=6)
    assert "dead_units" not in set(w.diagnose().finding)
    assert w.diagnose(dead_unit_share=0.3).finding.tolist() == ["dead_units"]


def test_a_bias_gradient_of_0_is_no_dead_unit_where_the_zeros_of_the_site_cannot_hold_it():
    # every entry of the feeding bias's gradient 0 (a layer after it initialized at 0 passes no gradient back), yet
    # only half the outputs are 0: each unit fires for half the inputs; no unit is dead
    def rows(step):
        return [row(step, "fc", "activation", shape="(64, 32)", numel=2048, min=-3.0, max=3.0),
                row(step, "act", "activation", shape="(64, 32)", numel=2048, min=0.0, max=3.0, zero_frac=0.5),
                row(step, "fc", "param_grad", "bias", "(32)", numel=32, zero_frac=1.0, norm=0.0)]
    frame = pd.DataFrame([r for s in range(1, 6) for r in rows(s)])
    assert "dead_units" not in set(diagnose(frame).finding)
    # the same gradient with three quarters of the outputs 0: room for the 16 dead units it counts
    frame.loc[frame.module == "act", "zero_frac"] = 0.75
    frame.loc[frame.kind == "param_grad", "zero_frac"] = 0.5
    assert diagnose(frame).finding.tolist() == ["dead_units"]


def test_a_sparse_layer_whose_every_unit_fires_for_some_input_is_not_dead():
    model = mlp("relu")
    with torch.no_grad():
        angle = torch.linspace(0, 2 * math.pi, 33)[:32]
        model.layers[0].weight.copy_(torch.stack([angle.cos(), angle.sin()], 1))  # a unit direction each
        model.layers[0].bias.fill_(-1.2)  # each unit fires for the ~12% of inputs beyond 1.2 along it: all alive
    w = train(model, steps=3, lr=1e-4)
    rows = w.to_pandas()
    assert rows[(rows.module == "layers.1") & (rows.kind == "activation")].zero_frac.min() > 0.8
    bias = rows[(rows.module == "layers.0") & (rows.tensor == "bias") & (rows.kind == "param_grad")]
    assert bias.zero_frac.max() == 0
    assert "dead_units" not in set(w.diagnose().finding)


def shuffled_labels(steps: int, optimizer: str = "adam", classes: int = 2, seed: int = 0,
                    **watch_options) -> workbench.Watch:
    """An MLP whose labels are drawn apart from its inputs, its last layer's weights x8: its loss falls from its
    confident first outputs to the class frequencies' (log C) and stays there, having learned nothing."""
    torch.manual_seed(seed)
    model = workbench.create_model("mlp", in_features=2, num_classes=classes, width=32, depth=2, activation="relu")
    with torch.no_grad():
        model.layers[4].weight.mul_(8.0)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 2, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.1)
    with workbench.watch(model, **watch_options) as w:
        for _ in range(steps):
            idx = torch.randint(1024, (64,), generator=g)
            loss = F.cross_entropy(model(x[idx]), torch.randint(classes, (64,), generator=g))
            one_step(w, opt, loss)
    return w


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_loss_that_fell_to_chance_and_stays_there_is_at_chance_given_the_chance_level(optimizer):
    w = shuffled_labels(60, optimizer)
    loss = w.metrics()["loss"]
    assert loss[:20].median() > 1.01 * math.log(2)  # it fell: not a plateau
    assert "loss_plateau" not in set(w.diagnose().finding)
    f = w.diagnose(chance=math.log(2))
    row = f[f.finding == "loss_at_chance"]
    assert row[["site", "step", "last_step", "severity"]].values.tolist() == [["loss", 50, 60, "warning"]]
    assert "its chance level 0.6931" in row.evidence.iloc[0] and "shuffled" in row.hint.iloc[0]
    assert f[f.finding == "loss_at_chance"].equals(w.diagnose(chance={"loss": math.log(2)})[lambda d: d.finding ==
                                                                                               "loss_at_chance"])


def test_a_loss_fitted_to_exactly_0_in_its_first_steps_is_no_plateau():
    # (its first 20 values' median 0, the float noise of a fitted model later above it: "has not fallen in its 80
    # steps: median 2e-09 over its last 20, above its first 20 (0)")
    steps = pd.Series(range(1, 81))
    loss = np.where(steps <= 5, 0.7 * (5 - steps) / 4, 0.0)
    loss = np.where(steps > 40, 1e-9 * ((steps * 7919) % 5), loss)
    metrics = pd.DataFrame({"step": steps, "loss": loss})
    assert diagnose(pd.DataFrame(), metrics).empty
    live = Diagnoser()
    for part in np.array_split(np.arange(len(metrics)), 8):  # (fed live, in parts, as a running watch feeds it)
        live.feed_frame(pd.DataFrame(), metrics.iloc[part])
    assert live.findings().empty


def test_a_flat_loss_at_chance_is_said_once_as_at_chance_and_a_healthy_one_never():
    steps = pd.Series(range(1, 121))
    flat = pd.DataFrame({"step": steps, "loss": math.log(2) * (1 + 0.01 * ((steps * 7919) % 13 - 6) / 6)})
    assert diagnose(pd.DataFrame(), flat).finding.tolist() == ["loss_plateau"]
    assert diagnose(pd.DataFrame(), flat, chance=math.log(2)).finding.tolist() == ["loss_at_chance"]
    exp = workbench.experiments.create("activation_mlp", seed=0, activation="relu", dataset="moons")
    w = exp.watch()
    exp.run(60, progress=False)
    w.close()
    assert w.diagnose(chance=math.log(2)).empty


def test_a_run_says_its_chance_level_in_its_metadata_and_every_diagnosis_of_it_reads_it(tmp_path):
    from workbench.ui.findings import RunFindings

    w = shuffled_labels(60, metadata={"chance": {"loss": math.log(2)}}, store=tmp_path / "run")
    run = workbench.load_run(tmp_path / "run")
    for found in (w.diagnose(), run.diagnose(), RunFindings(run).frame()):
        assert "loss_at_chance" in set(found.finding)
    assert "loss_at_chance" not in set(w.diagnose(chance=()).finding)  # (the caller's level, or none, is kept)
    # a built-in classification experiment records its own (its classes' frequencies: log 2), yours first
    exp = workbench.experiments.create("activation_mlp", seed=0, width=4, depth=1)
    assert exp.chance == {"loss": pytest.approx(math.log(2))}
    with exp.watch() as watched:
        assert watched.metadata["chance"] == exp.chance
    with exp.watch(metadata={"chance": {"loss": 0.5}}) as watched:
        assert watched.metadata["chance"] == {"loss": 0.5}
    # one that could not be a chance level is refused (before anything is attached)
    for bad in ("log 2", {"loss": float("nan")}, {1: 0.5}, True):
        with pytest.raises(ValueError, match=r"metadata\['chance'\] is the chance level"):
            workbench.watch(torch.nn.Linear(2, 2), metadata={"chance": bad})


def test_a_chance_level_is_refused_unless_a_finite_number_of_a_judged_loss_metric():
    assert Thresholds(chance=0.5).chance == (("loss", 0.5),)
    assert Thresholds(chance={"Loss": 2}, loss_metrics=("loss",)).chance == (("Loss", 2.0),)
    with pytest.raises(ValueError, match=r"Thresholds.chance must be levels of metrics in loss_metrics \('loss',\) "
                                         r"\(add the metric to loss_metrics"):
        Thresholds(chance={"accuracy": 0.5})
    for bad in (math.nan, "0.69", {"loss": None}, [0.69]):
        with pytest.raises(ValueError, match=r"Thresholds.chance must be a finite number or a dict \{loss metric: "
                                             r"chance level\}"):
            Thresholds(chance=bad)


def test_a_sigmoid_at_a_saturation_index_of_0_7_that_trains_is_no_finding():
    # weights x10 before 2 sigmoid layers: a median index of ~0.68 (0.19 at the usual scale), and the loss falls
    # as far as at the usual scale; where saturation hurts, its consequence is what is found (vanishing gradients)
    w = train(mlp("sigmoid", depth=2, weight_scale=10.0), steps=60, seed=1)
    rows = w.to_pandas()
    sig = rows[(rows.kind == "activation") & rows.module.isin(["layers.1", "layers.3"])]
    index = sig["std"] ** 2 / (sig["mean"] * (1 - sig["mean"]))
    assert 0.6 < index.median() < 0.75
    assert w.metrics()["loss"].iloc[-5:].mean() < 0.1
    assert w.diagnose().empty


class _CountingPandas:
    """``workbench.diagnose``'s pandas, counting the frames it draws."""

    def __init__(self) -> None:
        self.frames = 0

    def __getattr__(self, name: str):
        return getattr(pd, name)

    def DataFrame(self, *args, **kwargs):
        self.frames += 1
        return pd.DataFrame(*args, **kwargs)


def test_an_open_finding_that_grows_each_step_sets_its_cells_not_a_new_frame(monkeypatch):
    import workbench.diagnose as module

    w = shuffled_labels(70)
    records = w.recorder.records()
    counting = _CountingPandas()
    monkeypatch.setattr(module, "pd", counting)
    live = Diagnoser(chance=math.log(2))
    frames = []
    for record in records:
        live.feed(record)
        frames.append(live.findings())
    grown = [f for f in frames[50:] if "loss_at_chance" in set(f.finding)]
    assert len(grown) >= 15 and len({f.last_step.max() for f in grown}) >= 15  # it grew every step
    assert counting.frames <= 12  # (a new frame where a finding came or went, not at every step it grew)
    monkeypatch.undo()
    # and every frame is the one drawn anew from the same steps
    for n in (50, 60, 70):
        fresh = Diagnoser(chance=math.log(2))
        fresh.feed(records[:n])
        pd.testing.assert_frame_equal(frames[n - 1], fresh.findings())


# ------------------------------------------------------------- broken trainings whose findings misled


def test_a_learning_rate_schedule_that_grows_diverges_and_is_no_plateau():
    # a LambdaLR whose factor grows (1.15 ** step) instead of decaying: the loss falls to 0.13, then is thrown up;
    # its noise then, many times what it was as it fell, once hid the fall, and a "plateau" said "too small"
    model = mlp("relu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.15 ** step)
    x = torch.randn(1024, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] * x[:, 1] > 0).long()
    g = torch.Generator().manual_seed(0)
    with workbench.watch(model, updates=True) as w:
        for _ in range(80):
            idx = torch.randint(1024, (64,), generator=g)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            w.step(loss=loss.item())
    f = w.diagnose()
    assert {"diverging", "update_ratio_high"} <= set(f.finding) and "loss_plateau" not in set(f.finding)
    assert "a scheduler that raises it" in f[f.finding == "update_ratio_high"].hint.iloc[0]


def test_a_gradient_clipped_to_nothing_is_named_in_the_low_update_ratio_s_evidence():
    model = mlp("relu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    with workbench.watch(model, updates=True) as w:
        for _ in range(4):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
            opt.step()
            w.step(loss=loss.item())
    low = w.diagnose()
    low = low[low.finding == "update_ratio_low"]
    assert set(low.site) == {"layers.0.weight", "layers.2.weight", "layers.4.weight"}
    assert all("Its gradient is not small" in e and "clip_grad_norm_ with a tiny max_norm" in e for e in low.evidence)
    assert "clipping's max_norm" in low.hint.iloc[0]


def _clipped(max_norm: float, lr: float = 0.1, steps: int = 30) -> workbench.Watch:
    """The MLP trained by SGD with its gradients clipped to ``max_norm`` before each step, watched without
    update rows."""
    model = mlp("relu")
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    with workbench.watch(model) as w:
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            w.step(loss=loss.item())
    return w


def test_a_gradient_clipped_to_nothing_without_update_rows_is_one_not_updated_finding_over_the_whole_run():
    # clipped to 1e-6, each step moves an entry here and there by one float32 rounding: the statistics of
    # layers.2.weight stayed bit for bit on some steps, not others, and read as episodes 13-15 and 19-30
    # (the other weights as none); the condition holds at every step
    f = _clipped(1e-6).diagnose()
    assert sorted(f[["site", "finding", "step", "last_step"]].values.tolist()) == [
        [f"layers.{i}.weight", "not_updated", 2, 30] for i in (0, 2, 4)]
    assert "within float32's rounding" in f.evidence[0]
    # an update of 1e-5 of the weights' norm is one: no finding
    assert "not_updated" not in set(_clipped(1e-6, lr=1e3).diagnose().finding)


def test_a_run_that_continues_a_trained_model_is_judged_by_its_chance_level_not_its_first_steps():
    # a converged loss (0.0004, batch noise of 30 %) continued for 60 steps: a batch at 0.03, then a stretch at
    # 0.006. From its own first steps it reads as a spike, a divergence and a plateau; it fell from chance
    # (log 2) before the run began, and gave back under 1 % of that: none of them. A real divergence still is.
    steps = pd.Series(range(1501, 1561))
    wobble = 1 + 0.3 * ((steps * 7919) % 13 - 6) / 6
    loss = (0.0004 * wobble).where(steps < 1521, 0.006 * wobble)
    loss[steps == 1510] = 0.03
    continued = pd.DataFrame({"step": steps, "loss": loss})
    assert set(diagnose(pd.DataFrame(), continued).finding) == {"loss_spike", "diverging", "loss_plateau"}
    assert diagnose(pd.DataFrame(), continued, chance=math.log(2)).empty
    diverged = continued.assign(loss=loss.where(steps < 1530, 0.6 * 1.1 ** (steps - 1530)))
    assert "diverging" in set(diagnose(pd.DataFrame(), diverged, chance=math.log(2)).finding)


def pinned_tanh_net() -> torch.nn.Sequential:
    """A tanh MLP whose second tanh (site ``3``) gets pre-activations above 9: in float32 exactly 1 for every input."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2))
    with torch.no_grad():
        model[2].bias.fill_(20.0)
    return model


def fit_full_batch(model: torch.nn.Module, steps: int = 5) -> workbench.Watch:
    x = torch.randn(128, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with workbench.watch(model, updates=True) as w:
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
    return w


def test_a_tanh_pinned_at_its_bound_is_a_constant_output_named_where_the_gradient_stops():
    # (before: only its effects were found, vanishing gradients and weights not moving, blamed on dead units; a tanh
    # at exactly 1 has no variance for the saturation index to read)
    model = pinned_tanh_net()
    x = torch.randn(128, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert bool((model[:4](x) == 1.0).all())  # (independently: every output of the tanh at 3 is exactly 1)
    f = fit_full_batch(model).diagnose()
    constant = f[f.finding == "constant_output"]
    assert constant[["site", "step", "last_step", "severity"]].values.tolist() == [["3", 1, 5, "warning"]]
    assert f"all {128 * 16} of its outputs are 1 at step 5 (min = max)" in constant.evidence.item()
    assert "sigmoid/tanh" in constant.hint.item() and "softmax" in constant.hint.item()
    assert "It stops between 2 and 3" in f[f.finding == "vanishing_gradients"].evidence.item()
    assert "dead_units" not in set(f.finding) and "saturated" not in set(f.finding)


def test_a_softmax_over_a_dimension_of_size_1_is_a_constant_output():
    class Gated(torch.nn.Module):
        """A gate that is meant to weigh the features: its softmax is taken over a dimension of size 1 (dim=-1 of
        (B, 1)), so it is 1 for every input and its scorer never learns."""

        def __init__(self) -> None:
            super().__init__()
            self.score, self.soft = torch.nn.Linear(4, 1), torch.nn.Softmax(dim=-1)
            self.body, self.act, self.out = torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.act(self.body(x) * self.soft(self.score(x))))

    torch.manual_seed(0)
    f = fit_full_batch(Gated()).diagnose()
    assert f[f.finding == "constant_output"][["site", "step"]].values.tolist() == [["soft", 1]]
    assert "all 128 of its outputs are 1" in f[f.finding == "constant_output"].evidence.item()
    assert f[f.finding == "update_ratio_low"].site.tolist() == ["score.weight"]


def test_healthy_tanh_and_sigmoid_nets_and_an_all_zero_relu_layer_have_no_constant_output():
    for activation in ("tanh", "sigmoid"):
        assert "constant_output" not in set(train(mlp(activation, depth=3), steps=5).diagnose().finding)
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-10.0)  # (all 0: dead units, said once, not a constant output too)
    assert set(train(model, steps=5).diagnose().finding) >= {"dead_units"}
    assert "constant_output" not in set(train(model, steps=5).diagnose().finding)


def test_a_mask_all_true_is_no_constant_output():
    # (a padding mask of a batch without padding, all True, read 1 everywhere, as a tanh pinned at 1 does)
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask, self.body = torch.nn.Identity(), torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x * self.mask(x.abs() >= 0))

    torch.manual_seed(0)
    model = Masked()
    assert "constant_output" not in set(fit_full_batch(model).diagnose().finding)
    assert "constant_output" in set(fit_full_batch(pinned_tanh_net()).diagnose().finding)  # (still found)


def test_a_loss_thrown_up_many_orders_says_its_factors_as_a_person_reads_them():
    # (SGD at a learning rate of 5 on a ReLU MLP: the loss fell to 0.19, then rose to 1e10 before it overflowed;
    # the evidence said "back 6847750154893% of the way to its first median" and "15506440251784755200x its
    # step-to-step noise")
    loss = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.25, 0.2, 0.2, 0.19, 0.21, 0.2, 0.19, 0.2, 0.21, 0.2, 0.19, 0.2, 0.2, 0.21,
            0.2, 0.19, 0.2, 0.21, 0.2, 3e3, 4e5, 5e7, 6e9, 7e11, 8e13]
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, len(loss) + 1), "loss": loss}))
    diverging = f[f.finding == "diverging"].evidence.item()
    first = float(np.median(loss[:5]))  # (its first median of 5, what it fell from)
    now = float(np.median(loss[-5:]))
    assert f"{now / first:.3g}x its first median ({first:.4g})" in diverging and "% of the way" not in diverging
    spike = f[f.finding == "loss_spike"].evidence.iloc[0]
    assert re.search(r"\d\.\de\+\d\dx its level", spike) and not re.search(r"\d{5,}", spike.split(":", 1)[1])


def test_a_tanh_layer_saturated_once_the_loss_fell_to_a_tenth_is_information_and_one_saturated_from_the_start_not():
    # a 3-deep tanh MLP fits the half-planes to a loss of ~0.02 and its last hidden layer grows confident: saturated
    # from step 26, a warning with a hint to initialize smaller before 2026-11-29
    f = train(mlp("tanh", depth=3), steps=60).diagnose()
    assert f[["site", "finding", "severity"]].values.tolist() == [["layers.5", "saturated", "info"]]
    assert re.search(r"It began once loss had fallen from 0\.6\d+ to 0\.0\d+ \(the median of its last 5 values\): a "
                     r"layer saturated as the model fit its data", f.evidence[0])
    # weights 10x the usual: saturated from step 1, before the loss fell: a warning, as before
    f = train(mlp("tanh", depth=3, weight_scale=10.0), steps=12).diagnose()
    saturated = f[f.finding == "saturated"]
    assert len(saturated) and set(saturated.severity) == {"warning"} and set(saturated.step) == {1}
    assert not saturated.evidence.str.contains("It began once").any()


def test_a_loss_far_above_its_chance_level_says_the_outputs_are_confidently_wrong_as_a_factor():
    # a linear stack whose outputs grew 300x through 12 calls of one layer: cross-entropy ~35 against log 2 read
    # "4873.0% above its chance level" and named only targets apart from the inputs
    loss = 35.0 + np.sin(np.arange(60))
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 61), "loss": loss}), chance=math.log(2))
    assert f.finding.tolist() == ["loss_at_chance"]
    assert re.search(r"median 3\d\.\d+ over its last 20 values after 60 steps, 5\d\.\dx its chance level 0\.6931 "
                     r"\(from 3\d\.\d+ over its first 20\)", f.evidence[0])
    assert "worse than a model blind to its inputs: its outputs are confidently wrong, too large" in f.evidence[0]
    # just above chance: said as before
    near = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 61), "loss": 0.70 + 0.001 * np.sin(np.arange(60))}),
                    chance=math.log(2))
    assert "% above its chance level" in near.evidence[0] and "confidently wrong" not in near.evidence[0]


def relu_dropout_mlp(p: float) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Dropout(p), torch.nn.Linear(64, 2))


def test_a_dropout_after_a_live_relu_is_no_dead_units_and_after_a_dead_one_the_relu_alone_is():
    # a ReLU at ~52% zeros and a dropout of 0.6 after it read ~81% zeros: a dead_units warning before 2026-11-29,
    # though every unit fires for some inputs (the bias before the ReLU counts none dead)
    w = train(relu_dropout_mlp(0.6), steps=5)
    rows = w.to_pandas()
    assert rows[(rows.module == "2") & (rows.kind == "activation")].zero_frac.min() > 0.8
    assert "dead_units" not in set(w.diagnose().finding)
    # the ReLU dead: found there, once (not again at the dropout after it)
    model = relu_dropout_mlp(0.6)
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
    f = train(model, steps=5).diagnose()
    assert f[f.finding == "dead_units"].site.tolist() == ["1"]


def test_a_dropout_after_a_live_relu_whose_units_no_bias_counts_is_no_dead_units_either():
    # a Linear without bias before the ReLU, or a run without parameter gradients: nothing counts the ReLU's units,
    # and the dropout after it at ~80% zeros read as dead_units ('most of its units output 0') before 2026-11-29
    model = relu_dropout_mlp(0.6)
    model[0] = torch.nn.Linear(2, 64, bias=False)
    w = train(model, steps=20)
    rows = w.to_pandas()
    assert rows[(rows.module == "2") & (rows.kind == "activation")].zero_frac.max() > 0.8
    assert "dead_units" not in set(w.diagnose().finding)
    assert "dead_units" not in set(train(relu_dropout_mlp(0.6), steps=20, parameter_grads=False).diagnose().finding)
    # the ReLU dead, its units uncounted (no parameter gradients): found there, once, not again at the dropout
    model = relu_dropout_mlp(0.6)
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
    f = train(model, steps=5, parameter_grads=False).diagnose()
    assert f[f.finding == "dead_units"].site.tolist() == ["1"]



def test_a_sigmoid_output_saturated_once_the_loss_halved_is_confident_predictions_as_information():
    # a binary classifier's sigmoid probabilities at 0 and 1 once it fits (BCE from 0.69 to ~0.1): a warning to
    # initialize smaller before 2026-11-29, though confident predictions are what the loss asks for
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1), torch.nn.Sigmoid())
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).float()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with workbench.watch(model) as w:
        for _ in range(60):
            loss = F.binary_cross_entropy(model(x)[:, 0], y)
            one_step(w, opt, loss)
    f = w.diagnose()
    assert f[["site", "finding", "severity"]].values.tolist() == [["3", "saturated", "info"]]
    assert "the model's output (the last site in forward order): its predictions grew confident" in f.evidence[0]


def test_a_saturation_from_the_start_taken_up_again_after_the_loss_fell_stays_a_warning():
    # (whether it began after the loss fell is decided when the episode began: one that lets go for 3 steps, which ends
    # it, and comes back 4 steps after, within 2% of the run so far, is the same finding, with the severity it began
    # with)
    def site(step, saturated):
        return row(step, "act", "activation", shape="(64, 32)", numel=2048, mean=0.0, std=0.99 if saturated else 0.3,
                   min=-1.0, max=1.0)
    steps = range(1, 211)
    rows = pd.DataFrame([site(s, not 200 < s < 204) for s in steps])
    metrics = pd.DataFrame({"step": steps, "loss": np.geomspace(1.0, 0.001, 210)})
    f = diagnose(rows, metrics)
    assert f[["finding", "severity", "step", "last_step"]].values.tolist() == [["saturated", "warning", 1, 210]]
    assert "It began once" not in f.evidence[0]
    # from step 100 on only: after the loss fell some 25-fold, information
    rows = pd.DataFrame([site(s, s >= 100) for s in steps])
    f = diagnose(rows, metrics)
    assert f[["finding", "severity", "step"]].values.tolist() == [["saturated", "info", 100]]


def test_a_batch_too_small_to_tell_a_dead_unit_from_one_that_did_not_fire_for_its_inputs_counts_none():
    # a healthy ReLU MLP trained on batches of 1 input: about half its units output 0 for that input, and their
    # entries of the bias gradient are 0; none of the first layer's is dead over the data, and it has no dead_units
    # (16 of 32 read 50% before; the second layer, sparser, passes dead_zero_frac on some inputs: that rule's own)
    model = mlp("relu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 2, generator=g)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with workbench.watch(model) as w:
        for _ in range(60):
            i = torch.randint(512, (1,), generator=g)
            loss = F.cross_entropy(model(x[i]), y[i])
            one_step(w, opt, loss)
    with torch.no_grad():
        fired = model.layers[1](model.layers[0](x)) > 0
    assert int((~fired.any(0)).sum()) == 0  # (every unit of the first layer fires for some of the data)
    f = w.diagnose()
    assert "layers.1" not in set(f[f.finding == "dead_units"].site)


def test_the_share_of_dead_units_is_judged_where_the_batch_can_tell_them_from_units_quiet_by_chance():
    # 16 of 32 units counted by the bias gradient at 75% zeros: a finding on a batch of 64 inputs; on a batch of 4,
    # 32 x 0.75^4 = 10 units would be 0 for all its inputs at that rate by chance: no count to trust
    def rows(step, batch):
        return [row(step, "fc", "activation", shape=f"({batch}, 32)", numel=32 * batch, min=-3.0, max=3.0),
                row(step, "act", "activation", shape=f"({batch}, 32)", numel=32 * batch, min=0.0, max=3.0,
                    zero_frac=0.75),
                row(step, "fc", "param_grad", "bias", "(32)", numel=32, zero_frac=0.5)]
    assert diagnose(pd.DataFrame([r for s in range(1, 6) for r in rows(s, 64)])).finding.tolist() == ["dead_units"]
    assert "dead_units" not in set(diagnose(pd.DataFrame([r for s in range(1, 6) for r in rows(s, 4)])).finding)


def test_a_saturation_begun_as_the_model_fit_is_a_warning_again_once_the_loss_rose_back():
    # a tanh MLP fits half-planes to ~0.006, its layers saturating as it does (info); at step 200 a learning rate of 3
    # throws it out: the loss at ~30x its chance level, its layers pinned at their bounds; they were info for good
    model = mlp("tanh")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 2, generator=g)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with workbench.watch(model) as w:
        for step in range(1, 301):
            if step == 200:
                opt.param_groups[0]["lr"] = 3.0
            i = torch.randint(512, (64,), generator=g)
            loss = F.cross_entropy(model(x[i]), y[i])
            one_step(w, opt, loss)
    rows, metrics = w.to_pandas(), w.metrics()
    fitted = diagnose(rows[rows.step < 200], metrics[metrics.step < 200])
    fitted = fitted[fitted.finding == "saturated"]
    assert len(fitted) and set(fitted.severity) == {"info"}
    assert all("harmless while the loss stays low" in text for text in fitted.evidence)
    f = w.diagnose()
    thrown = f[f.finding == "saturated"]
    assert len(thrown) and set(thrown.severity) == {"warning"}
    assert all(re.search(r"loss has since risen back to \d+(\.\d+)?: the model no longer fits", text) and
               "harmless" not in text for text in thrown.evidence)


@pytest.mark.parametrize("activation", [torch.nn.GELU, torch.nn.SiLU])
@pytest.mark.parametrize("gradients", [True, False])
def test_a_gelu_or_silu_layer_dead_on_its_negative_tail_is_dead_units(activation, gradients):
    # its units output no exact 0 (GELU(-4) = -1.3e-4, SiLU(-4) = -0.07): "nothing looked wrong" until 2026-11-30
    w = shifted_mlp(activation, shift=4.0, gradients=gradients)
    f = w.diagnose()
    dead = f[f.finding == "dead_units"]
    assert dead[["site", "step", "last_step"]].values.tolist() == [["1", 1, 30]], f[["finding", "site"]]
    evidence = dead.evidence.iloc[0]
    rows = w.to_pandas()
    last = rows[(rows.step == 30) & (rows.module == "1") & (rows.kind == "activation")].iloc[0]
    assert last["max"] <= 0 and last["min"] < 0 and last.zero_frac < 0.8  # (the zero counts see nothing)
    assert re.match(r"all 32 of its units sit at the floor of the activation for every input at step 30: all 8192 of "
                    r"its outputs are at or below 0 \(max -?[0-9.e-]+, min -[0-9.e-]+; [0-9.]+% exactly 0\), with std "
                    r"[0-9.e-]+, 0\.0\d+ of the [0-9.]+ of 0, its input", evidence), evidence
    assert ("the gradient it passes back to 0 has norm" in evidence) == gradients
    # the same layer with its bias as initialized: no finding
    assert "dead_units" not in set(shifted_mlp(activation, shift=0.0, gradients=gradients).diagnose().finding)
    # a stricter dead_slope than the layer's slope: not found
    assert "dead_units" not in set(w.diagnose(dead_slope=0.005).finding)


@pytest.mark.parametrize("activation", [torch.nn.GELU, torch.nn.SiLU])
def test_the_vanished_gradients_behind_a_gelu_or_silu_layer_dead_on_its_tail_are_listed_under_it(activation):
    # listed as a finding of their own beside it until 2026-11-30, its hint naming saturating activations, small
    # weights, depth: the dead layer's flat tail, which passes almost no gradient back, is why
    import pandas as pd

    from workbench.diagnose import Diagnoser, diagnose
    from workbench.ui.findings import fold_consequences

    w = shifted_mlp(activation, shift=8.0)
    f = w.diagnose()
    live = Diagnoser()
    live.feed(w.recorder.records())
    pd.testing.assert_frame_equal(live.findings(), diagnose(w.to_pandas(), w.metrics(long=True)))
    assert f[["site", "finding", "cause", "consequences"]].values.tolist() == [
        ["1", "dead_units", "", 1], ["0", "vanishing_gradients", "dead_units at 1", 0]]
    assert f.evidence[0].endswith("Its consequence, the gradient its tail does not pass back: vanishing_gradients at "
                                  "0, step 1–30.")
    listed = fold_consequences(f)
    assert listed.finding.tolist() == ["dead_units"] and listed.folded.tolist() == [1]
