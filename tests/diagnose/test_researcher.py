"""Broken trainings as a researcher writes them (plain nn.Sequential and nn.Module, SGD or Adam, full-batch
synthetic data): what diagnose says about each must be true, name the site and step, and say what to do."""

from __future__ import annotations

import math

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from workbench.diagnose import MAX_ACCUMULATED_STEPS, Diagnoser

from tests.diagnose.runs import fit_steps, one_step


def data(n: int = 128, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


def fit(model: nn.Module, steps: int, lr: float = 0.05, loss_fn=None, before_step=None, params=None,
        **watch_options) -> workbench.Watch:
    """SGD on the full batch under a watch; ``before_step(step)`` runs before each step's forward."""
    x, y = data()
    opt = torch.optim.SGD(model.parameters() if params is None else params, lr=lr)
    return fit_steps(model, opt, lambda _step: (x, y), steps, loss_fn or F.cross_entropy, before_step, **watch_options)


class Log(nn.Module):
    """log of its input once switched on (a NaN for every negative input)."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) if self.on else x


def mlp(*middle: nn.Module, width: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), *middle, nn.Linear(width, 2))


def test_a_nan_made_by_the_loss_function_is_not_blamed_on_the_model_nor_called_divergence():
    # log of a negative inside the loss: the loss is NaN from step 1, its gradient (1/x) finite, the model fine
    w = fit(mlp(nn.ReLU()), steps=4, loss_fn=lambda out, y: F.cross_entropy(out, y) + torch.log(out.mean() - 100))
    f = w.diagnose()
    assert f.finding.tolist() == ["loss_not_finite"]
    row = f.iloc[0]
    assert (row.site, row.step, row.last_step, row.severity) == ("loss", 1, 4, "error")
    assert "no NaN or Inf at step 1" in row.evidence and "the loss computation made it" in row.evidence
    assert "log" in row.hint and "cross_entropy" in row.hint


def test_a_nan_made_between_two_modules_names_the_finite_site_recorded_before_it():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.act, self.b = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)
            self.broken = False

        def forward(self, x):
            h = self.a(x)
            if self.broken:
                h = torch.log(h)  # a function in forward(), no module of its own: its output is not recorded
            return self.b(self.act(h))

    torch.manual_seed(0)
    model = Net()
    w = fit(model, steps=6, before_step=lambda step: setattr(model, "broken", step >= 4))
    f = w.diagnose()
    origin = f[f.finding == "nan_origin"].iloc[0]
    assert (origin.site, origin.step, origin.kind) == ("act", 4, "activation")
    assert "a, whose output was recorded just before, is finite: it arose in act or in code that ran between" \
        in origin.evidence
    loss = f[f.finding == "loss_not_finite"].iloc[0]
    assert loss.step == 4 and "the first at act: nan_origin), which the loss inherited" in loss.evidence


def test_a_nan_born_at_a_step_not_recorded_is_not_pinned_on_the_first_site_recorded_with_it():
    model = mlp(Log())
    w = fit(model, steps=14, every=5, before_step=lambda step: setattr(model[1], "on", step >= 8))
    f = w.diagnose()
    # recorded: 1, 6, 11: the NaN came at 8 (the loss says so), its origin unseen; at 11 the weights of 0 carry it
    origin = f[f.finding == "nan_origin"].iloc[0]
    assert origin.step == 11
    assert "steps 7 to 10 were not recorded; loss was already nan at step 8" in origin.evidence
    assert "only inherited it. " in origin.evidence and "other site(s) have one too" in origin.evidence
    assert "(in the forward pass)" not in origin.evidence
    loss = f[f.finding == "loss_not_finite"].iloc[0]
    assert loss.step == 8 and "step 8 was not recorded, so where it came from is not known" in loss.evidence


def test_a_nan_in_the_model_s_first_output_points_at_its_input():
    torch.manual_seed(0)
    model = nn.Sequential(Log(), nn.Linear(4, 2))
    model[0].on = True  # log of the batch: half of it negative
    origin = fit(model, steps=2).diagnose().iloc[0]
    assert (origin.finding, origin.site, origin.step) == ("nan_origin", "0", 1)
    assert "no output was recorded before it at this step: it arose in 0, or its input (the batch?)" in origin.evidence


def relu_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))


def test_a_layer_left_out_of_the_optimizer_is_not_updated_with_or_without_update_rows():
    for updates, first in ((True, 1), (False, 2)):  # (without update rows: from the 2nd step, against the 1st)
        model = relu_mlp()
        params = [p for name, p in model.named_parameters() if not name.startswith("2.")]
        f = fit(model, steps=6, params=params, updates=updates).diagnose()
        assert f[["site", "finding", "severity"]].values.tolist() == [["2.weight", "not_updated", "warning"]]
        row = f.iloc[0]
        assert (row.step, row.last_step) == (first, 6)
        assert "though its gradient is not" in row.evidence and "the optimizer does not move it" in row.evidence
        assert "not in the optimizer's parameter groups" in row.hint


def test_a_layer_frozen_with_requires_grad_false_is_said_frozen_as_information_not_a_warning():
    for updates in (True, False):
        model = relu_mlp()
        model[2].requires_grad_(False)
        f = fit(model, steps=5, updates=updates).diagnose()
        assert f[["site", "finding", "severity"]].values.tolist() == [["2.weight", "frozen", "info"]]
        assert "it has no gradient (no param_grad row" in f.evidence[0] and "on purpose" in f.hint[0]


def test_weights_behind_a_dead_layer_say_no_gradient_reaches_them():
    model = relu_mlp()
    with torch.no_grad():
        model[2].bias.fill_(-20.0)  # the ReLU at 3 dies: nothing before it gets a gradient, 4 sees only zeros
    w = fit(model, steps=4, updates=True)
    f = w.diagnose()
    low = f[f.finding == "update_ratio_low"].set_index("site").evidence
    assert sorted(low.index) == ["0.weight", "2.weight", "4.weight"]
    # a weight's gradient is its output's gradient times its input: before the dead layer the first is 0, after it
    # the second; the evidence says which, from the output gradients the rows hold
    for site in ("0.weight", "2.weight"):
        assert f"its gradient is exactly 0: no gradient reaches the output of {site[0]} " in low[site]
    rows = w.to_pandas()
    out = rows[(rows.step == 4) & (rows.kind == "grad_output") & (rows.module == "4")].norm.item()
    said = f"the output of 4 gets a gradient (||grad|| {out:.3g}), so its input is all 0 (dead units before it)"
    assert out > 0 and said in low["4.weight"]
    assert f[f.finding == "dead_units"].site.tolist() == ["3"]
    vanishing = f[f.finding == "vanishing_gradients"].evidence.item()
    relu = rows[(rows.step == 4) & (rows.kind == "grad_output") & (rows.module == "3")]
    assert relu.norm.item() > 0  # (the dead ReLU's output gets a gradient and passes none back)
    rms = relu.norm.item() / relu.numel.item() ** 0.5
    assert f"It stops between 2 and 3: the output of 3 gets an RMS of {rms:.2g}" in vanishing


def test_inputs_that_would_be_judged_wrongly_or_not_at_all_are_refused_saying_what_to_pass():
    import pandas as pd
    import pytest

    from workbench.diagnose import Diagnoser, diagnose

    w = fit(relu_mlp(), steps=3)
    rows, metrics = w.to_pandas(), w.metrics()
    with pytest.raises(ValueError, match=r"must be in recorded order.*the row at position \d+ \(step 1\) comes after "
                                         r"step 3"):
        diagnose(rows.sort_values("module"), metrics)  # (the steps interleaved: the order within a step lost too)
    assert diagnose(rows[rows.kind != "param"], metrics).empty  # (a filter keeps the order)
    with pytest.raises(ValueError, match=r"loss_metrics=\('lss',\) names no metric of the run, which logged "
                                         r"\['loss'\]"):
        diagnose(rows, metrics, loss_metrics="lss")
    with pytest.raises(ValueError, match=r"column 'name' is not numbers; pass w.metrics\(\) .* or "
                                         r"w.metrics\(long=True\)"):
        diagnose(rows, w.metrics(long=True).rename(columns={"value": "val"}))
    for bad in (5, "abc", rows):
        with pytest.raises(TypeError, match=r"Diagnoser.feed\(\) takes a recorder's Update, a StepRecord or a list"):
            Diagnoser().feed(bad)
    with pytest.raises(TypeError, match=r"attach\(\) needs a workbench Watch .*, got DataFrame\.$"):
        Diagnoser().attach(rows)
    assert diagnose(pd.DataFrame(), pd.DataFrame({"step": [1, 2], "loss": ["0.7", "0.6"]})).empty  # (numbers as text)


def test_an_update_ratio_finding_gives_its_farthest_step_as_well_as_its_last():
    import pandas as pd

    from tests.diagnose.test_findings import param_rows
    from workbench.diagnose import diagnose

    rows = pd.concat([param_rows([step], ratio) for step, ratio in enumerate([0.9, 0.5, 0.104], 1)], ignore_index=True)
    [evidence] = diagnose(rows).evidence  # (not "0.1 at step 3 (threshold: above 0.1)", as two digits would say)
    assert evidence.startswith("||update|| / ||param|| 0.104 at step 3; up to 0.9 at step 1 (threshold: above 0.1")
    rows = pd.concat([param_rows([step], ratio) for step, ratio in enumerate([1e-9, 1e-7, 5e-7], 1)], ignore_index=True)
    [evidence] = diagnose(rows).evidence
    assert evidence.startswith("||update|| / ||param|| 5e-07 at step 3; down to 1e-09 at step 1 (threshold: "
                               "below 1e-06")


def test_a_loss_that_does_not_fall_is_a_plateau_one_finding_however_noisy_and_a_noisy_falling_one_is_not():
    import numpy as np
    import pandas as pd

    from workbench.diagnose import diagnose

    rng = np.random.default_rng(0)
    steps = np.arange(1, 201)
    for noise in (0.0, 0.05, 0.2):  # (batch-to-batch noise, relative)
        flat = 0.69 * (1 + noise * rng.standard_normal(200))
        f = diagnose(pd.DataFrame(), pd.DataFrame({"step": steps, "loss": flat}))
        assert f[["last_step", "site", "finding", "severity"]].values.tolist() == \
            [[200, "loss", "loss_plateau", "warning"]], noise
        assert 50 <= f.step[0] <= 60  # (from plateau_steps, once the last 20 are not 1% below the first 20)
        assert f.evidence[0].startswith(("loss has not fallen in its 200 steps: median ", "loss has fallen only "))
        assert "in its 200 steps" in f.evidence[0]
    # falling 20% per 100 steps through a noise of 5%: learning, slowly; and a converged loss is no plateau
    falling = 0.69 * (1 - 0.002 * steps) * (1 + 0.05 * rng.standard_normal(200))
    converged = 0.05 + 0.65 * np.exp(-steps / 20) + 0.01 * rng.standard_normal(200)
    for loss in (falling, converged):
        assert diagnose(pd.DataFrame(), pd.DataFrame({"step": steps, "loss": loss})).empty


def test_an_optimizer_built_on_a_copy_of_the_model_reads_as_a_plateau_and_weights_not_updated():
    import copy

    model = relu_mlp()
    w = fit(model, steps=60, params=copy.deepcopy(model).parameters())  # (steps the copy: the model stays)
    f = w.diagnose()
    assert f[f.finding == "loss_plateau"][["step", "last_step", "site"]].values.tolist() == [[50, 60, "loss"]]
    assert "has not fallen in its 60 steps" in f[f.finding == "loss_plateau"].evidence.iloc[0]
    assert sorted(f[f.finding == "not_updated"].site) == ["0.weight", "2.weight", "4.weight"]
    # the model's own .grad is never zeroed (zero_grad() clears the copy's): its gradients add up step after step,
    # which a bias the optimizer never changed reads as gradient accumulation over micro-batches whose optimizer step
    # has not come yet for MAX_ACCUMULATED_STEPS steps, then as gradients_accumulate; not_updated names the cause
    assert set(f.finding) == {"loss_plateau", "not_updated", "gradients_accumulate"}
    assert f[f.finding == "gradients_accumulate"].step.min() > MAX_ACCUMULATED_STEPS
    assert "it is not given this parameter" in f[f.finding == "not_updated"].evidence.iloc[0]
    assert fit(relu_mlp(), steps=60).diagnose().empty  # (the same net, its optimizer on it, learns)


def test_without_update_rows_weights_stilled_by_vanishing_gradients_are_not_a_row_each():
    # a deep sigmoid stack: its early weights' gradients are ~1e-10 of them, their steps round away in float32 on
    # some steps and not others; the cause is one finding, not a flickering row per weight
    torch.manual_seed(0)
    layers = [nn.Linear(4, 32), nn.Sigmoid()]
    for _ in range(9):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    f = fit(nn.Sequential(*layers, nn.Linear(32, 2)), steps=30, lr=0.1).diagnose()
    assert f[["step", "last_step", "site", "finding"]].values.tolist() == [[1, 30, "0", "vanishing_gradients"]]


def test_a_loss_set_back_by_a_bad_batch_is_no_plateau_and_a_long_flat_one_stays_one():
    import numpy as np
    import pandas as pd

    from workbench.diagnose import diagnose

    rng = np.random.default_rng(1)
    steps = np.arange(1, 201)
    # fell from 0.7 to ~0.01, thrown back to 0.7 at step 120 (labels flipped for a batch), falling again slowly
    loss = np.where(steps < 120, 0.01 + 0.69 * np.exp(-steps / 15), 0.01 + 0.69 * np.exp(-(steps - 120) / 60))
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": steps, "loss": loss * (1 + 0.01 * rng.standard_normal(200))}))
    assert "loss_plateau" not in set(f.finding), f.evidence.tolist()
    steps = np.arange(1, 2001)
    flat = 0.69 * (1 + 0.05 * rng.standard_normal(2000))
    f = diagnose(pd.DataFrame(), pd.DataFrame({"step": steps, "loss": flat}))
    assert f.finding.tolist() == ["loss_plateau"] and f.last_step[0] == 2000


def test_a_dead_layer_is_listed_before_the_weights_it_stills_though_those_tell_a_step_later():
    # (without update rows an unchanged weight tells from the 2nd step, against the 1st: listed newest first by their
    # first step, the weights a dead layer stills came before it, the effect above its cause)
    model = relu_mlp()
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    f = fit(model, steps=6).diagnose()
    assert f[["finding", "site", "step"]].values.tolist()[:2] == [["dead_units", "3", 1],
                                                                  ["vanishing_gradients", "0", 1]]
    stilled = f[f.finding == "update_ratio_low"]
    assert sorted(stilled.site) == ["0.weight", "2.weight", "4.weight"] and set(stilled.step) == {2}
    assert set(f.last_step) == {6}


def zero_last_layer_mlp() -> nn.Sequential:
    """A ReLU MLP 3 deep whose last layer is initialized at 0 (weights and bias)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 2))
    with torch.no_grad():
        model[6].weight.zero_()
        model[6].bias.zero_()
    return model


def test_a_last_layer_initialized_at_0_whose_weights_grow_has_no_vanishing_gradients():
    # (the gradients behind it are exactly 0 at step 1 and scaled by its small weights until they grew: its init's
    # doing, not a vanishing; until 2026-11-29 a vanishing_gradients finding over steps 1-12)
    f = fit(zero_last_layer_mlp(), steps=20).diagnose()
    assert f.empty, f[["site", "finding", "step"]].values.tolist()
    assert fit(zero_last_layer_mlp(), steps=20, updates=True).diagnose().empty


def test_a_last_layer_initialized_at_0_before_a_log_softmax_module_has_no_vanishing_gradients_either():
    # the last layer with parameters is the one at 0; a parameter-free LogSoftmax after it (under nll_loss) was taken
    # for the last layer, and the run read as vanishing_gradients over steps 1-16
    model = zero_last_layer_mlp()
    model.append(nn.LogSoftmax(dim=1))
    f = fit(model, steps=20, loss_fn=F.nll_loss).diagnose()
    assert f.empty, f[["site", "finding", "step", "last_step"]].values.tolist()


def test_a_last_layer_at_0_not_known_to_grow_says_its_vanishing_is_across_it_and_one_frozen_at_0_vanishes():
    # without parameter rows its weights are not known to grow: the finding stands, saying where the drop is
    w = fit(zero_last_layer_mlp(), steps=40, parameters=False)
    f = w.diagnose()
    vanishing = f[f.finding == "vanishing_gradients"]
    assert len(vanishing) == 1 and vanishing.step.item() == 1 and vanishing.last_step.item() < 40  # (it ends)
    last = vanishing.last_step.item()
    rows = w.to_pandas()
    g = rows[(rows.step == last) & (rows.kind == "grad_output")].set_index("module")
    rms = g.norm / g.numel ** 0.5
    across = math.log10(rms["6"] / rms["5"])
    assert f"Most of it, {across:.1f} orders, is across the last site, from 5 to 6" in vanishing.evidence.item()
    assert "A last layer initialized at 0" in vanishing.hint.item()
    # a last layer at 0 that never moves (frozen): no gradient ever passes it, from step 1
    model = zero_last_layer_mlp()
    model[6].requires_grad_(False)
    f = fit(model, steps=6, params=[p for p in model.parameters() if p.requires_grad]).diagnose()
    vanishing = f[f.finding == "vanishing_gradients"]
    assert vanishing[["site", "step", "last_step"]].values.tolist() == [["0", 1, 6]]
    assert "no gradient reaches 6 of 7 sites" in vanishing.evidence.item()


def test_a_frozen_parameter_says_whether_a_gradient_reaches_its_module_s_output():
    # a layer whose own requires_grad is False gets a gradient at its output; a branch cut by .detach() and a head the
    # loss does not use get none there: the evidence says which (both read as requires_grad=False before 2026-11-29)
    model = mlp(nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), width=8)
    model[2].requires_grad_(False)
    f = fit(model, steps=5, params=[p for p in model.parameters() if p.requires_grad]).diagnose()
    assert f[["finding", "site", "severity"]].values.tolist() == [["frozen", "2.weight", "info"]]
    assert "The output of 2 gets a gradient (||grad|| " in f.evidence[0]
    assert "requires_grad=False on it" in f.evidence[0]
    # a parameter its module's forward leaves out (requires_grad True) reads the same: the evidence names both
    # (it said requires_grad=False of it, as a fact)
    assert "or the forward of 2 does not use it" in f.evidence[0]

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 8) * 0.3)
            self.gate = nn.Parameter(torch.randn(4, 8))  # (used only where use_gate is set)
            self.use_gate = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x @ self.weight
            return h * torch.sigmoid(self.gate).mean(0) if self.use_gate else h

    model = mlp(nn.ReLU(), Gated(), nn.ReLU(), width=8)
    assert model[2].gate.requires_grad
    f = fit(model, steps=5).diagnose()
    assert f[["finding", "site"]].values.tolist() == [["frozen", "2.gate"]]
    assert "or the forward of 2 does not use it (a parameter left out of its computation)" in f.evidence[0]

    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.kept, self.cut, self.unused = nn.Linear(4, 2), nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.unused(x)  # (an output the loss never sees)
            return self.kept(x) + self.cut(x).detach()

    f = fit(Branches(), steps=5).diagnose()
    assert sorted(f[["finding", "site"]].values.tolist()) == [["frozen", "cut.weight"], ["frozen", "unused.weight"]]
    for evidence, module in zip(f.evidence, f.module):
        assert f"No gradient reaches the output of {module} either" in evidence
        assert "the graph is cut after it (a .detach()" in evidence
    assert ".detach()" in f.hint[0]


def test_a_layer_frozen_at_0_is_a_constant_output_found_at_the_layer_alone_not_again_at_the_model_in_a_stored_run():
    # (a live run's tensors say the model's output is its last layer's; a stored run's rows said so only of an output
    # not all 0, and listed the model's again: '(model)' dead_units beside '6'; and an output all 0 read as dead
    # units, a ReLU's, though the layer's parameters are all 0)
    model = zero_last_layer_mlp()
    model[6].requires_grad_(False)
    live = Diagnoser()
    x, y = data()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    with workbench.watch(model) as w:
        live.attach(w)
        for _ in range(4):
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
        live.flush()
    stored = w.diagnose()
    assert stored[stored.finding == "constant_output"].site.tolist() == ["6"]
    pd.testing.assert_frame_equal(live.findings(), stored)
    live.detach()
    # (and it is no dead_units, a ReLU's: a layer whose parameters are all 0 outputs 0 whatever its input)
    assert "dead_units" not in set(stored.finding)
    evidence = stored[stored.finding == "constant_output"].evidence.item()
    assert "all 256 of its outputs are 0 at step 4 (min = max)" in evidence
    assert "its parameters are all 0 (6.weight, 6.bias): it outputs 0 whatever its input, and passes no gradient " \
        "back to the layers before it" in evidence
