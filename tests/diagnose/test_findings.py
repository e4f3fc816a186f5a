"""The findings engine on frames built by hand from the row schema, its thresholds and its inputs,
and its incremental form (fed the recorder's stream) against the frame form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import workbench
from workbench.diagnose import COLUMNS, FINDINGS, Diagnoser, Thresholds, diagnose, update_ratios

from tests.diagnose.conftest import mlp, train
from tests.diagnose.runs import one_step

STATS = ["numel", "mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count"]


def row(step, module, kind, tensor="out", shape="(8, 4)", **stats):
    numel = int(np.prod([int(x) for x in shape.strip("()").split(",") if x.strip()]))
    base = dict(numel=numel, mean=0.0, std=1.0, min=-2.0, max=2.0, abs_mean=0.8, norm=float(np.sqrt(numel)),
                zero_frac=0.0, nan_count=0, inf_count=0)
    base.update(stats)
    return {"step": step, "module": module, "call": 0, "kind": kind, "tensor": tensor, "shape": shape, **base}


def param_rows(steps, ratio, module="fc", numel=100):
    """Rows of a (10, 10) weight whose update norm is ``ratio`` of its norm every step."""
    out = []
    for s in steps:
        out.append(row(s, module, "param", "weight", "(10, 10)", norm=5.0))
        out.append(row(s, module, "update", "weight", "(10, 10)", norm=5.0 * ratio))
    return pd.DataFrame(out)


def test_update_ratio_is_the_update_norm_over_the_param_norm_of_the_same_step():
    rows = pd.concat([param_rows([1, 2], 1e-3), param_rows([1], 0.5, module="other")])
    ratios = update_ratios(rows).sort_values(["module", "step"]).reset_index(drop=True)
    assert ratios[["step", "module", "tensor"]].values.tolist() == [[1, "fc", "weight"], [2, "fc", "weight"],
                                                                    [1, "other", "weight"]]
    np.testing.assert_allclose(ratios.ratio, [1e-3, 1e-3, 0.5])


@pytest.mark.parametrize("ratio, finding", [(0.5, "update_ratio_high"), (1e-8, "update_ratio_low")])
def test_update_ratio_far_from_usual_is_a_finding_after_persist_steps(ratio, finding):
    f = diagnose(param_rows(range(1, 6), ratio), None)
    assert f.finding.tolist() == [finding]
    assert (f.step[0], f.last_step[0], f.site[0]) == (1, 5, "fc.weight")
    assert f"{ratio:.2g}" in f.evidence[0]
    # fewer recorded steps than persist: nothing yet
    assert diagnose(param_rows(range(1, 3), ratio), None).empty
    assert diagnose(param_rows(range(1, 6), 1e-3), None).empty  # the usual range


def test_a_parameter_grown_from_zero_is_judged_once_its_ratio_fell():
    # a zero-initialized weight: ratio 1 at its first step, ~1/t after (Adam's constant step)
    frames = [param_rows([t], 1.0 / t) for t in range(1, 30)]
    assert diagnose(pd.concat(frames), None).empty
    frames += [param_rows([t], 0.5) for t in range(30, 34)]  # then far too large for good
    f = diagnose(pd.concat(frames), None)
    assert f.finding.tolist() == ["update_ratio_high"] and f.step[0] == 30


def test_biases_are_not_judged_by_their_update_ratio_unless_asked():
    rows = pd.DataFrame([r for s in range(1, 6) for r in (
        row(s, "fc", "param", "bias", "(10)", norm=1e-3), row(s, "fc", "update", "bias", "(10)", norm=5e-4))])
    assert diagnose(rows).empty
    assert diagnose(rows, update_min_dims=1).finding.tolist() == ["update_ratio_high"]


def test_a_finding_that_misses_a_step_or_two_stays_one_finding():
    # an update ratio hovering at its threshold: out of range, back for a step or two, out again
    high, usual = 0.5, 1e-3
    hovering = [high] * 4 + [usual] + [high] * 3 + [usual] * 2 + [high] * 2
    f = diagnose(pd.concat([param_rows([s], r) for s, r in enumerate(hovering, 1)]), None)
    assert f[["step", "last_step", "finding"]].values.tolist() == [[1, 12, "update_ratio_high"]]
    # back for as many steps as it took to become a finding (persist, 3): it ended; it comes back anew
    ended = [high] * 4 + [usual] * 3 + [high] * 3
    f = diagnose(pd.concat([param_rows([s], r) for s, r in enumerate(ended, 1)]), None)
    assert sorted(f[["step", "last_step"]].values.tolist()) == [[1, 4], [8, 10]]
    # not yet a finding: one step out of range ends it (persist counts steps in a row)
    assert diagnose(pd.concat([param_rows([s], r) for s, r in enumerate([high, high, usual, high, high], 1)]),
                    None).empty


def test_nan_origin_tells_the_first_site_from_the_ones_that_inherited_it():
    rows = pd.DataFrame([
        row(1, "a", "activation"), row(1, "b", "activation"),
        row(2, "a", "activation"), row(2, "b", "activation", nan_count=3), row(2, "c", "activation", nan_count=32),
        row(2, "c", "grad_output", nan_count=32), row(3, "a", "activation", inf_count=1),
    ])
    f = diagnose(rows)
    assert f.finding.tolist() == ["nan_origin"]
    first = f.iloc[0]
    assert (first.step, first.last_step, first.site, first.kind, first.severity) == (2, 3, "b", "activation", "error")
    assert "3 NaN of 32 values" in first.evidence and "2 other site(s) only inherited it: a, c" in first.evidence


def test_dead_units_need_persistence_and_name_a_bound_on_units():
    # (8, 4): 8 entries per unit; 31 of 32 zero -> at least 1 - 8 * (1/32) = 75% of the units dead
    dead = dict(zero_frac=31 / 32, min=0.0, max=0.5, mean=0.01, std=0.05)
    rows = pd.DataFrame([row(s, "relu", "activation", **dead) for s in (1, 2)])
    assert diagnose(rows).empty  # two steps < persist=3
    assert diagnose(rows, persist=2).finding.tolist() == ["dead_units"]
    rows = pd.DataFrame([row(s, "relu", "activation", **dead) for s in (1, 2, 3)]
                        + [row(4, "relu", "activation", zero_frac=0.5, min=0.0)])
    f = diagnose(rows)
    assert (f.step[0], f.last_step[0]) == (1, 3) and "at least 75% of its 4 units (at least 3)" in f.evidence[0]
    # a (B, T, F) output: dim 1 is positions, named as what is counted; an all-zero one said whole
    seq = dict(shape="(2, 8, 16)", min=0.0, max=0.5, mean=0.01, std=0.05)
    partial = diagnose(pd.DataFrame([row(s, "mlp", "activation", zero_frac=255 / 256, **seq) for s in (1, 2, 3)]))
    assert "at least 88% of its 8 units along dim 1 of (2, 8, 16) (at least 7) output 0" in partial.evidence[0]
    whole = diagnose(pd.DataFrame([row(s, "mlp", "activation", **{**seq, "max": 0.0, "mean": 0.0, "std": 0.0},
                                       zero_frac=1.0) for s in (1, 2, 3)]))
    assert "its whole (2, 8, 16) output is 0 for every input" in whole.evidence[0]
    # a site with negative outputs is never dead (a linear layer that outputs zeros is something else)
    assert diagnose(pd.DataFrame([row(s, "lin", "activation", zero_frac=0.95, min=-1.0) for s in (1, 2, 3)])).empty


def test_saturation_index_of_a_two_point_output_is_one():
    # every value at 0 or 1 with mean 0.25: variance 0.25 * 0.75 (population) -> index 1
    n, mu = 32, 0.25
    std = np.sqrt(mu * (1 - mu) * n / (n - 1))
    rows = pd.DataFrame([row(s, "sig", "activation", mean=mu, std=std, min=0.0, max=1.0) for s in (1, 2, 3)])
    f = diagnose(rows)
    assert f.finding.tolist() == ["saturated"] and "saturation index 1.00" in f.evidence[0]
    mild = pd.DataFrame([row(s, "sig", "activation", mean=0.5, std=0.2, min=0.1, max=0.9) for s in (1, 2, 3)])
    assert diagnose(mild).empty


def test_a_loss_thrown_up_in_its_first_steps_is_a_spike():
    """A learning rate far too large: 0.7 -> 70 at steps 3-4, back down after, too early for the noise of 10 steps."""
    metrics = pd.DataFrame({"step": range(1, 13), "loss": [0.7, 0.69, 70.0, 65.0, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.4,
                                                           0.4]})
    f = diagnose(pd.DataFrame(), metrics)
    assert f.finding.tolist() == ["loss_spike"] and f.step[0] == 3, f
    assert "median of the 2 steps before: 0.695" in f.evidence[0]
    # a loss falling fast at first (each step a fraction of the one before) has not spiked
    assert diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 13), "loss": np.geomspace(20.0, 0.1, 12)})).empty
    assert diagnose(pd.DataFrame(), pd.DataFrame({"step": [1, 2, 3], "loss": [0.7, 0.9, 3.0]})).empty  # (4x: no)
    # thrown up at the second step already (Adam at a learning rate of 1 on a ReLU MLP): against its first value
    adam = pd.DataFrame({"step": range(1, 9), "loss": [0.744, 48.0, 184.5, 40.7, 12.2, 7.4, 0.81, 3.9]})
    f = diagnose(pd.DataFrame(), adam)
    assert f[["finding", "step", "last_step"]].values.tolist() == [["loss_spike", 2, 2]]
    assert f.evidence[0].startswith("loss = 48 at step 2: 63.5x its level (its first value: 0.744) above it")
    # a loss at exactly 0 at first (a hinge loss whose first batch is all within its margin) is no level to measure a
    # rise by: 0.05 after it read as a spike of 5e+10x
    hinge = pd.DataFrame({"step": range(1, 13), "loss": [0.0, 0.05, 0.04, 0.0, 0.03, 0.02, 0.01, 0.0, 0.02, 0.01, 0.0,
                                                         0.01]})
    assert diagnose(pd.DataFrame(), hinge).empty


def test_diverging_loss_and_non_finite_loss():
    metrics = pd.DataFrame({"step": range(1, 16),
                            "loss": [1.0, 0.8, 0.7, 0.6, 0.5] + [0.5 * 3 ** k for k in range(10)]})
    f = diagnose(pd.DataFrame(columns=COLUMNS[:0]), metrics)
    assert f.finding[0] == "diverging" and f.site[0] == "loss" and f.severity[0] == "error"
    assert set(f.finding) <= {"diverging", "loss_spike"}  # (3x jumps while it diverges are spikes too)
    nan = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [1.0, 0.9, 0.8, float("nan")],
                        "accuracy": [0.5, float("nan"), 0.6, 0.6]})
    f = diagnose(pd.DataFrame(), nan)
    assert f.finding.tolist() == ["loss_not_finite"] and f.step[0] == 4 and "nan" in f.evidence[0]
    # an evaluation's loss, logged every few steps, is not taken for a NaN in between
    sparse = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [1.0, 0.9, 0.8, 0.7], "eval_loss": [np.nan, 1.0, np.nan, 0.9]})
    assert diagnose(pd.DataFrame(), sparse, loss_metrics=("loss", "eval_loss")).empty
    # only the losses named are judged: a part of the objective rising 30x as a critic learns is not
    rising = pd.DataFrame({"step": range(1, 41), "loss": np.linspace(2.0, 1.0, 40),
                           "v_loss": np.geomspace(0.004, 0.12, 40)})
    assert diagnose(pd.DataFrame(), rising).empty
    assert diagnose(pd.DataFrame(), rising, loss_metrics=["v_loss"]).finding.tolist() == ["diverging"]
    # a metric that is not a loss is never judged; loss_metrics picks which are
    assert diagnose(pd.DataFrame(), nan.rename(columns={"loss": "reward"})).empty
    assert diagnose(pd.DataFrame(), nan.rename(columns={"loss": "reward"}),
                    loss_metrics=("reward",)).finding.tolist() == ["loss_not_finite"]
    # a wide frame of two metrics logged as `name` and `value` is read as wide (a long frame's names are strings)
    wide = nan.rename(columns={"loss": "name", "accuracy": "value"})
    assert diagnose(pd.DataFrame(), wide, loss_metrics=("name",)).finding.tolist() == ["loss_not_finite"]
    long = pd.DataFrame({"step": [1, 2, 3, 4], "name": ["loss"] * 4, "value": [1.0, 0.9, 0.8, float("nan")]})
    assert diagnose(pd.DataFrame(), long).finding.tolist() == ["loss_not_finite"]


def test_a_converged_noisy_loss_is_not_diverging():
    # a loss that fell from 0.7 to 0.003, then rises to ~0.05 amid batch-to-batch noise of ~0.03 (an
    # MLP at 99% accuracy does): 16x its lowest and rising, having given back 7% of what it fell
    rng = np.random.default_rng(0)
    t = np.arange(1, 201)
    level = np.where(t < 150, 0.003 + 0.7 * np.exp(-t / 10), 0.003 + 0.045 * np.clip((t - 150) / 20, 0, 1))
    loss = level + np.abs(rng.normal(0, np.where(t < 150, 0.001, 0.03)))
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": t, "loss": loss}))
    assert "diverging" not in set(f.finding)
    regain_ignored = diagnose(pd.DataFrame(), pd.DataFrame({"step": t, "loss": loss}), diverge_regain=0)
    assert "diverging" in set(regain_ignored.finding)
    # the same loss, then growing 15% a step: diverging once it is back above half its first level
    grown = np.concatenate([loss, loss[-1] * 1.15 ** np.arange(1, 41)])
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": np.arange(1, grown.size + 1), "loss": grown}))
    step = f[f.finding == "diverging"].step.min()
    median = np.median(grown[step - 5:step])
    assert step > 200 and median >= 0.5 * np.median(grown[:5]) and np.median(grown[step - 6:step - 1]) < median


def test_a_loss_that_rose_and_stays_up_is_one_divergence_not_one_a_bump_of_its_noise():
    """A model that had learned, then a layer zeroed (an ablation mid-run): the loss back at chance,
    its noise rising and falling there, was hundreds of `diverging` findings (930 on an app run)."""
    rng = np.random.default_rng(0)
    t = np.arange(1, 1001)
    loss = np.where(t < 200, 0.02 + 0.68 * np.exp(-t / 30), 0.693) + rng.normal(0, 0.01, t.size)
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": t, "loss": loss}))
    [row] = f[f.finding == "diverging"].to_dict("records")
    assert 200 <= row["step"] <= 205 and row["last_step"] == 1000 and "still up" in row["evidence"]
    # back down: the finding ends there, and a later rise is a finding of its own
    back = np.concatenate([loss[:400], 0.02 + rng.normal(0, 0.002, 300), 0.693 + rng.normal(0, 0.01, 300)])
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": t, "loss": back}))
    assert sorted(f[f.finding == "diverging"].step) == [pytest.approx(202, abs=3), pytest.approx(702, abs=3)]


def test_a_loss_back_up_from_about_0_says_how_far_back_not_a_ratio_to_0():
    """0.7, then 0 for ten steps, then climbing back: "infx its lowest (0)" told nothing."""
    loss = [0.7] * 5 + [0.0] * 10 + [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, len(loss) + 1), "loss": loss}))
    [evidence] = f[f.finding == "diverging"].evidence.tolist()  # (from step 21: 0.3-0.7, median 0.5)
    assert evidence == ("loss: median 0.5 over its last 5 steps and rising, up from its lowest (0), back 71% of the "
                        "way to its first median (0.7) (thresholds 10x, 50% back).")


def test_a_converged_loss_s_batch_to_batch_jumps_are_not_spikes():
    # a loss that fell from 0.7 to ~0.002 and jumps to 0.02-0.08 now and then (an MLP at 99%
    # accuracy, a hard batch): 10-40x its level, but a tenth of what it fell at most
    rng = np.random.default_rng(1)
    t = np.arange(1, 401)
    loss = 0.002 + 0.7 * np.exp(-t / 20) + rng.exponential(0.001, t.size)
    jumps = rng.choice(np.arange(100, 400), 12, replace=False)
    loss[jumps] += rng.uniform(0.02, 0.08, jumps.size)
    metrics = pd.DataFrame({"step": t, "loss": loss})
    assert "loss_spike" not in set(diagnose(pd.DataFrame(), metrics).finding)
    assert "loss_spike" in set(diagnose(pd.DataFrame(), metrics, spike_regain=0).finding)
    # a jump that gives back a third of the fall is one
    loss[300] = 0.25
    spikes = diagnose(pd.DataFrame(), pd.DataFrame({"step": t, "loss": loss}))
    assert spikes[spikes.finding == "loss_spike"].step.tolist() == [301]


def test_a_loss_thrown_up_orders_of_magnitude_early_is_diverging_though_it_does_not_rise():
    """A learning rate far too large: 1.41, then 3e5-6e6 from the second step on, swinging (never three
    rises in four steps) or flat: no lower median to rise from, a blow-up from its first value."""
    swinging = [1.41] + [3e5, 6e6] * 15
    flat = [1.41] + [1e6] * 30
    for loss in (swinging, flat):
        f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 32), "loss": loss}))
        [row] = f[f.finding == "diverging"].itertuples()
        assert (row.step, row.last_step) == (5, 31) and "its first value (1.41; threshold 100x)" in row.evidence
    # a loss that rises 50x its first value (under the threshold) and one that starts at 0 are not
    for loss in ([1.0] + [50.0] * 30, [0.0] + [1e6] * 30):
        f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 32), "loss": loss}))
        assert "diverging" not in set(f.finding)
    with pytest.raises(ValueError, match="diverge_blowup"):
        diagnose(pd.DataFrame(), pd.DataFrame({"step": [1], "loss": [1.0]}), diverge_blowup=1)


def test_a_loss_nan_every_other_step_is_one_finding_naming_its_first_nan():
    from workbench.instrument import StepRecord

    loss = [1.0] * 10 + [float("nan"), 1.0] * 15
    diagnoser = Diagnoser()
    diagnoser.feed([StepRecord(step, metrics={"loss": value}) for step, value in enumerate(loss, 1)])
    f = diagnoser.findings()
    [row] = f[f.finding == "loss_not_finite"].itertuples()  # (not fifteen: it holds again a step after it ended)
    assert (row.step, row.last_step) == (11, 39) and row.evidence == "loss is nan at step 11 (last finite: 1)."


def test_a_spike_over_consecutive_steps_is_one_finding_and_spikes_apart_are_two():
    loss = [1.0] * 40
    loss[20:23] = [20.0, 40.0, 20.0]  # (a few bad batches in a row: its level, a median of 5, stays low)
    loss[32] = 20.0
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": range(1, 41), "loss": loss}))
    spikes = f[f.finding == "loss_spike"].sort_values("step")
    assert spikes[["step", "last_step"]].values.tolist() == [[21, 23], [33, 33]]
    assert spikes.evidence.iloc[0].startswith("loss = 40 at step 22: 39.0x its level")  # (the largest of the three)


def test_findings_are_ordered_most_severe_then_newest():
    rows = pd.DataFrame([row(s, "relu", "activation", zero_frac=1.0, min=0.0, max=0.0, mean=0.0, std=0.0)
                         for s in range(1, 5)] + [row(4, "x", "activation", nan_count=1)])
    metrics = pd.DataFrame({"step": range(1, 25), "loss": [1.0] * 20 + [1.0, 50.0, 1.0, 1.0]})
    f = diagnose(rows, metrics)
    assert f.finding.tolist() == ["nan_origin", "loss_spike", "dead_units"]
    assert set(f.severity) <= {"info", "warning", "error"} and set(f.finding) <= set(FINDINGS)


@pytest.mark.parametrize("bad, message", [
    (dict(persist=0), "persist must be a whole number >= 1"),
    (dict(dead_zero_frac=1.5), "dead_zero_frac must be a fraction in (0, 1]"),
    (dict(spike_regain=-0.1), "spike_regain must be a fraction in [0, 1], got -0.1"),
    (dict(gradient_orders=float("nan")), "gradient_orders must be a positive number"),
    (dict(update_ratio_low=1.0, update_ratio_high=0.5), "update_ratio_low must be below update_ratio_high"),
    (dict(loss_metrics=("",)), "loss_metrics must be a tuple of non-empty strings"),
])
def test_bad_thresholds_say_what_and_how(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Thresholds(**bad)
    with pytest.raises(ValueError):
        diagnose(pd.DataFrame(), None, **bad)


def test_bad_inputs_say_what_was_expected():
    with pytest.raises(TypeError, match=r"Unknown threshold\(s\) \['persistence'\]"):
        diagnose(pd.DataFrame(), persistence=3)
    with pytest.raises(TypeError, match="pandas DataFrame"):
        diagnose([1, 2, 3])
    with pytest.raises(ValueError, match=r"lack the columns \['call'"):
        diagnose(pd.DataFrame({"step": [1], "module": ["a"]}))
    with pytest.raises(ValueError, match="needs a 'step' column"):
        diagnose(pd.DataFrame(), pd.DataFrame({"loss": [1.0]}))
    with pytest.raises(TypeError, match="thresholds must be"):
        diagnose(pd.DataFrame(), None, thresholds=3)
    with pytest.raises(TypeError, match="needs a workbench Watch"):
        Diagnoser().attach(object())


def test_thresholds_as_dict_or_dataclass_agree():
    w = train(mlp("relu"), steps=5, patch=("layers.1", lambda t: t * 0))
    rows, metrics = w.to_pandas(), w.metrics()
    a = diagnose(rows, metrics, {"dead_zero_frac": 0.99})
    b = diagnose(rows, metrics, Thresholds(dead_zero_frac=0.99))
    pd.testing.assert_frame_equal(a, b)
    assert "dead_units" in set(a.finding)


def test_live_diagnoser_on_the_stream_equals_the_frame_form(tmp_path):
    """Attached mid-run (the steps before read from the recorder's buffer, the rest from its
    subscription), fed off the training thread, the live findings equal diagnose() of the rows,
    and those of the stored run (which has no tensor identities: aliases told by statistics)."""
    import torch
    import torch.nn.functional as F

    model = mlp("relu")
    with torch.no_grad():
        model.layers[2].bias.fill_(-20.0)  # layers.3 dead
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(1))
    y = (x[:, 0] > 0).long()
    live = Diagnoser()
    with workbench.watch(model, store=tmp_path / "run") as w:
        for step in range(1, 9):
            if step == 4:
                live.attach(w)
            if step == 6:
                w.patch("layers.1", torch.log)  # -inf from step 6
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
        w.recorder.flush()
    live.detach()
    found = live.findings()
    assert {"dead_units", "nan_origin"} <= set(found.finding)
    pd.testing.assert_frame_equal(found, diagnose(w.to_pandas(), w.metrics()))
    pd.testing.assert_frame_equal(found, w.diagnose())
    run = workbench.load_run(tmp_path / "run")
    pd.testing.assert_frame_equal(found, diagnose(run.to_pandas(), run.metrics()))
    pd.testing.assert_frame_equal(found, run.diagnose())
    strict = diagnose(run.to_pandas(), run.metrics(), persist=1, dead_zero_frac=0.5)
    pd.testing.assert_frame_equal(strict, run.diagnose(persist=1, dead_zero_frac=0.5))
    origin = found[found.finding == "nan_origin"].iloc[0]
    assert (origin.site, origin.step) == ("layers.1", 6)


def test_gradients_growing_over_steps_are_found_in_one_stored_block():
    # one site's output gradient grows 10x a step from step 4: the scale of the first 3 steps is 1
    rows = pd.DataFrame([r for s in range(1, 11) for r in (
        row(s, "a", "activation"), row(s, "a", "grad_output", norm=np.sqrt(32) * (10.0 ** max(s - 3, 0))))])
    f = diagnose(rows)
    assert f.finding.tolist() == ["exploding_gradients"] and (f.step[0], f.last_step[0]) == (7, 10)
    assert "7.0 orders of magnitude above the largest of the first recorded steps (1;" in f.evidence[0]
    assert diagnose(rows[rows.step <= 8]).empty  # 2 steps past 3 orders: not yet persistent


def test_a_finding_that_comes_back_after_a_gap_short_for_the_run_so_far_is_one_finding():
    # too large at 5 steps, usual for the next 7, too large again: a gap a chart of 400 steps hardly
    # shows is one finding over both (2 % of the run so far); the same gap near the start is two, and
    # so near the start of a run that continues another from step 1001 (2 % of its steps, not of 1020)
    def flicker(start, first=1):
        usual = param_rows(range(first, start), 1e-3)
        return pd.concat([usual, param_rows(range(start, start + 5), 0.5), param_rows(range(start + 5, start + 12), 1e-3),
                          param_rows(range(start + 12, start + 20), 0.5)])

    late = diagnose(flicker(400), None)
    assert late[["step", "last_step", "finding"]].values.tolist() == [[400, 419, "update_ratio_high"]]
    early = diagnose(flicker(20), None).sort_values("step")
    assert early[["step", "last_step"]].values.tolist() == [[20, 24], [32, 39]]
    continued = diagnose(flicker(1020, first=1001), None).sort_values("step")
    assert continued[["step", "last_step"]].values.tolist() == [[1020, 1024], [1032, 1039]]


def test_first_sites_whose_gradient_is_now_0_now_tiny_are_one_vanishing_finding():
    # (a layer nearly dead passes a gradient for some batches and none for others: the two forms of vanishing
    # gradients took turns, each too short to be a finding or cut into several; Adam at a learning rate of 1 on a
    # ReLU MLP read as four rows in 60 steps)
    out = []
    for step in range(1, 13):
        first = 0.0 if step % 2 else 1e-9 * np.sqrt(32)  # (exactly 0 at odd steps; an RMS of 1e-9 at even ones)
        for module, norm in (("a", first), ("b", first), ("c", 1e-2 * np.sqrt(32))):
            out.append(row(step, module, "activation"))
            out.append(row(step, module, "grad_output", norm=norm))
    f = diagnose(pd.DataFrame(out), None)
    assert f[["step", "last_step", "site", "finding"]].values.tolist() == [[1, 12, "a", "vanishing_gradients"]]
    assert f.evidence[0].startswith("output-gradient RMS 1e-09 at a")  # (step 12's: an RMS, 7 orders below c's)
    odd = diagnose(pd.DataFrame([r for r in out if r["step"] <= 11]), None)
    assert odd.evidence[0].startswith("no gradient reaches 2 of 3 sites") and "It stops between b and c" in \
        odd.evidence[0]


def test_a_dead_gelu_whose_outputs_are_all_minus_zero_reads_max_0_not_max_minus_0():
    # (GELU of a large negative input is -0.0: the app's Diagnoses said "exactly 0 ... max -0" of such a layer)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        net[0].bias.fill_(-200.0)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    with workbench.watch(net) as w:
        for _ in range(40):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss.item())
    assert str(w.to_pandas().query("module == '1' and kind == 'activation'")["max"].iloc[-1]) == "-0.0"
    [dead] = w.diagnose().query("finding == 'dead_units' and site == '1'").evidence
    assert "; max 0." in dead and "-0" not in dead, dead
