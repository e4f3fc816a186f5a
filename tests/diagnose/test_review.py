"""What a review of the diagnoses found open: a batch of one input read as dead units by chance, a pooling after a
dead ReLU found dead again, a forgotten ``zero_grad()``, a forward pass blown up through depth, and a diverging run's
consequences flooding its cause. Each through a real training run and the public API."""

from __future__ import annotations

import re

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from tests.diagnose.runs import diverging_mlp, mlp_on_halves, one_step


def relu_zero_fractions(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """The share of zeros of every ReLU-like hidden site of the registry's ``mlp`` over the inputs ``x``."""
    outputs: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
             for name, module in model.named_modules() if re.fullmatch(r"layers\.\d*[13579]", name)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: float((out == 0).float().mean()) for name, out in outputs.items()}


def test_a_healthy_relu_layer_trained_on_batches_of_one_input_has_no_dead_units():
    # at a batch of 1 a layer of 16 ReLU units reads more than 80% zeros for some inputs: 3 such steps in a row were a
    # dead_units warning until 2026-11-29 (this run: layers.1 at steps 192-197 and 229-231, layers.3 at 248-250),
    # though over the data its layers read 60% and 46% zeros
    exp = workbench.experiments.create("activation_mlp", activation="relu", depth=2, width=16, batch_size=1, seed=0,
                                       lr=3e-3, dataset="moons")
    with exp.watch() as w:
        exp.run(300, progress=False)
    rows = w.to_pandas()
    read = rows[(rows.kind == "activation") & rows.module.isin(["layers.1", "layers.3"])]
    assert (read.zero_frac >= 0.8).sum() >= 20  # (the steps a batch of one read past dead_zero_frac)
    assert max(relu_zero_fractions(exp.model, exp.x).values()) < 0.7
    assert "dead_units" not in set(w.diagnose().finding)


def test_a_dead_relu_layer_trained_on_batches_of_one_input_is_found_saying_what_the_finding_rests_on():
    exp = workbench.experiments.create("activation_mlp", activation="relu", depth=2, width=32, batch_size=1, seed=0,
                                       lr=1e-3, dataset="moons")
    with torch.no_grad():
        exp.model.layers[2].bias.fill_(-10.0)  # layers.3 never fires
    with exp.watch() as w:
        exp.run(40, progress=False)
    f = w.diagnose()
    dead = f[f.finding == "dead_units"]
    # 32 units as sparse as 80% zeros would all be 0 for 16 inputs in 32 x 0.8^16 = 0.9 of them by chance: from 16 on
    assert dead[["site", "step", "last_step"]].values.tolist() == [["layers.3", 1, 40]]
    assert "It held on 40 recorded steps of this episode, 40 entries per unit in all" in dead.evidence.iloc[0]
    with exp.watch() as w:
        exp.run(10, progress=False)
    assert "dead_units" not in set(w.diagnose().finding)  # (10 inputs: not yet evidence)


def test_a_pooling_and_a_flatten_after_a_dead_relu_are_not_found_dead_again():
    # an AdaptiveAvgPool2d and a Flatten after a dead ReLU output zeros too, inherited: three dead_units findings of
    # one dead layer until 2026-11-29
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(128, 2))
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = (x.mean((1, 2, 3)) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with workbench.watch(model) as w:
        for _ in range(6):
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
    rows = w.to_pandas()
    assert (rows[(rows.kind == "activation") & rows.module.isin(["1", "2", "3"])].zero_frac == 1.0).all()
    f = w.diagnose()
    assert f[f.finding == "dead_units"].site.tolist() == ["1"]


def train_without_zero_grad(zero_grad: bool, lr: float = 0.01, steps: int = 40) -> workbench.Watch:
    """The registry's ReLU ``mlp`` under SGD on batches of 64; ``zero_grad=False``: the gradients never zeroed."""
    return mlp_on_halves(lr, steps, batch=64, zero_grad=zero_grad)


def test_a_forgotten_zero_grad_is_found_as_gradients_that_accumulate_naming_the_cause():
    # no finding at all until 2026-11-29 (at lr 0.1 only its consequence, 'diverging'): the loss falls, slowly
    w = train_without_zero_grad(False)
    f = w.diagnose()
    assert f.finding.tolist() == ["gradients_accumulate"]
    assert f.site[0].endswith(".bias") and f.severity[0] == "error"
    assert "zero_grad() is likely not called each step" in f.evidence[0]
    assert "the most this step's backward pass can give it" in f.evidence[0]
    # the parameters' gradients grow with the step while the output gradients (this step's) do not
    rows = w.to_pandas()
    bias = rows[(rows.kind == "param_grad") & (rows.module == "layers.4") & (rows.tensor == "bias")].norm.to_numpy()
    out = rows[(rows.kind == "grad_output") & (rows.module == "layers.4")].norm.to_numpy()
    assert bias[-1] > 10 * bias[0] and out[-1] < out[0]
    # the same run with zero_grad(): none
    assert "gradients_accumulate" not in set(train_without_zero_grad(True).diagnose().finding)


def deep_relu(weight_std: float | None, depth: int = 6, width: int = 32) -> nn.Module:
    """A ReLU MLP of ``depth`` hidden layers; ``weight_std``: their weights drawn at that std (None: PyTorch's init)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(2, width)]
    for _ in range(depth):
        layer = nn.Linear(width, width)
        if weight_std is not None:
            nn.init.normal_(layer.weight, std=weight_std)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


def test_a_forward_pass_blown_up_through_depth_is_found_where_it_starts():
    # weights of std 1 on a width of 32 (the usual is ~1/sqrt(32)): each layer multiplies the scale by ~4; the outputs
    # reach ~3000x the first layer's: no finding until 2026-11-29
    def run(weight_std):
        model = deep_relu(weight_std)
        x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long()
        opt = torch.optim.SGD(model.parameters(), lr=1e-7)
        with workbench.watch(model) as w:
            for _ in range(6):
                loss = F.cross_entropy(model(x), y)
                one_step(w, opt, loss)
        return w

    f = run(1.0).diagnose()
    blown = f[f.finding == "exploding_activations"]
    assert blown[["site", "step", "last_step"]].values.tolist() == [["1", 1, 6]]  # (the first Linear of std 1)
    assert re.search(r"output RMS \S+ at 11, 3\.\d orders of magnitude above 1, the unit scale \(the first site in "
                     r"forward order, 0, reads 0\.\d+\)", blown.evidence.iloc[0])  # (counted from 1, where it is less)
    assert "it starts at 1" in blown.evidence.iloc[0]
    assert "exploding_activations" not in set(run(None).diagnose().finding)


def test_a_run_thrown_out_by_a_learning_rate_of_10_leads_with_the_cause_its_consequences_grouped_under_it(tmp_path):
    # 10 findings of equal rank until 2026-11-29, the first a dead ReLU at step 4, the update ratios of step 1 (the
    # learning rate) seventh
    f = diverging_mlp(store=tmp_path / "run").diagnose()
    assert f[["finding", "step", "cause"]].iloc[0].tolist() == ["update_ratio_high", 1, ""]
    assert "The run went wrong from here" in f.evidence[0]
    cause = f"update_ratio_high at {f.site[0]}"
    assert (f.cause[1:] == cause).all()  # (every other finding began after it: its consequences)
    assert {"loss_spike", "dead_units", "vanishing_gradients", "update_ratio_low"} <= set(f.finding[1:])
    # after it the same cause at its other sites, then the consequences in the order they began (the loss's spike ...)
    siblings = int(((f.finding[1:] == "update_ratio_high") & (f.step[1:] == 1)).sum())
    assert siblings == 2 and (f.finding[1:1 + siblings] == "update_ratio_high").all()
    assert f.step[1 + siblings:].tolist() == sorted(f.step[1 + siblings:]) and f.finding[1 + siblings] == "loss_spike"
    # what a list shows (the app's run page, the Dashboard): the cause alone, counting its consequences
    from workbench.ui.findings import merge_calls
    shown = merge_calls(f)
    assert shown.finding.tolist() == ["update_ratio_high"] and f"{len(f) - 1} findings began at step 1" in \
        shown.evidence[0]
    from workbench.ui.notebook import Dashboard
    dash = Dashboard(workbench.load_run(tmp_path / "run"))
    assert dash.findings().finding.tolist() == ["update_ratio_high"]
    assert list(dash.findings_list.options) == [f"⚠ update_ratio_high at {f.site[0]}, step 1–{f.last_step[0]} · "
                                                f"+{len(f) - 1} consequences over steps 1–40"]
    dash.focus_finding(0)
    assert dash.statistic.value == "norm"


def bias_free_mlp() -> nn.Sequential:
    """A ReLU MLP of Linear layers without bias (2 inputs, 32 wide, 2 classes), as LLaMA-style models have none."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 32, bias=False), nn.ReLU(), nn.Linear(32, 32, bias=False), nn.ReLU(),
                         nn.Linear(32, 2, bias=False))


class ResidualBiasFree(nn.Module):
    """Linear layers without bias in a ModuleList, each added to its input (a residual), a head after them: the site
    before the head is the last block's output, not the head's input (the sum)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.inp = nn.Linear(2, width, bias=False)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width, bias=False), nn.ReLU()) for _ in range(2))
        self.head = nn.Linear(width, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2) -> (B, 2)
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def test_a_forgotten_zero_grad_on_a_model_without_biases_is_found_from_its_weights_in_a_sequential():
    # no bias to bound: nothing found in 40 steps at SGD 0.01 until 2026-11-30 (at larger learning rates only its
    # consequences, a loss spike and a diverging loss). A Sequential feeds each layer the output of the one before,
    # recorded: a weight's gradient is at most ||grad_output|| x ||input||, which the sum passes by step 3 or so
    from tests.diagnose.runs import fit_steps

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)
    y = (x[:, 0] > 0).long()

    def batch(_step: int, size: int = 64) -> tuple:
        i = torch.randint(1024, (size,), generator=g)
        return x[i], y[i]

    def run(model: nn.Module, zero_grad: bool, data=batch) -> "workbench.Watch":
        return fit_steps(model, torch.optim.SGD(model.parameters(), lr=0.01), data, 40, zero_grad=zero_grad)

    f = run(bias_free_mlp(), zero_grad=False).diagnose()
    found = f[f.finding == "gradients_accumulate"]
    assert len(found) == 1 and found.site.iloc[0].endswith(".weight") and found.step.iloc[0] <= 6
    assert found.severity.iloc[0] == "error" and "zero_grad() is likely not called each step" in found.evidence.iloc[0]
    assert "at most ||grad_output|| x ||input||, its input the output of" in found.evidence.iloc[0]
    # zeroed each step: none, on batches of 64 or of 1 (one sample: the gradient is exactly the bound)
    assert "gradients_accumulate" not in set(run(bias_free_mlp(), zero_grad=True).diagnose().finding)
    one = run(bias_free_mlp(), zero_grad=True, data=lambda step: batch(step, 1)).diagnose()
    assert "gradients_accumulate" not in set(one.finding)
    # a layer whose input the rows do not hold (the head after a residual sum: the site before it is the last block's
    # output) is not bounded: no finding
    assert "gradients_accumulate" not in set(run(ResidualBiasFree(), zero_grad=True).diagnose().finding)


def nested_bias_free_mlp() -> nn.Sequential:
    """The ReLU MLP of :func:`bias_free_mlp`, each Linear the first child of a Sequential of its own (a block)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(2, 32, bias=False), nn.ReLU()),
                         nn.Sequential(nn.Linear(32, 32, bias=False), nn.ReLU()),
                         nn.Sequential(nn.Linear(32, 2, bias=False)))


def bias_free_conv_net(kernel: int) -> nn.Sequential:
    """Conv1d layers without bias (2 channels in, 32 wide, 2 classes per position), ``kernel`` wide, zero-padded."""
    torch.manual_seed(0)
    pad = kernel // 2
    return nn.Sequential(nn.Conv1d(2, 32, kernel, padding=pad, bias=False), nn.ReLU(),
                         nn.Conv1d(32, 32, kernel, padding=pad, bias=False), nn.ReLU(),
                         nn.Conv1d(32, 2, kernel, padding=pad, bias=False))


def test_a_forgotten_zero_grad_is_found_at_the_first_linear_of_a_nested_sequential_and_at_a_convolution():
    # each Linear the child 0 of its block: no weight bounded until 2026-11-30 (its input is its block's input, the
    # output of the block before it, a Sequential whose row is its last child's); Conv1d without bias: none bounded
    from tests.diagnose.runs import fit_steps
    from workbench.diagnose import Diagnoser, diagnose

    g = torch.Generator().manual_seed(0)
    points = torch.randn(1024, 2, generator=g)
    sequences = torch.randn(512, 2, 12, generator=g)

    def rows_of(x: torch.Tensor):
        def batch(_step: int) -> tuple:
            i = torch.randint(len(x), (64,), generator=g)
            return x[i], (x[i][:, 0] > 0).long()
        return batch

    def run(model: nn.Module, data, zero_grad: bool) -> "workbench.Watch":
        return fit_steps(model, torch.optim.SGD(model.parameters(), lr=0.01), data, 40, zero_grad=zero_grad)

    for make, data, first in ((nested_bias_free_mlp, rows_of(points), 6), (lambda: bias_free_conv_net(1),
                              rows_of(sequences), 6), (lambda: bias_free_conv_net(3), rows_of(sequences), 12)):
        w = run(make(), data, zero_grad=False)
        f = w.diagnose()
        live = Diagnoser()  # (the live stream: its rows' tensors tell a container's output from its last child's)
        live.feed(w.recorder.records())
        pd.testing.assert_frame_equal(live.findings(), diagnose(w.to_pandas(), w.metrics(long=True)))
        found = f[f.finding == "gradients_accumulate"]
        assert len(found) == 1 and found.step.iloc[0] <= first and found.last_step.iloc[0] == 40, f
        assert found.site.iloc[0] in {"1.0.weight", "2.0.weight", "2.weight", "4.weight"}
        assert "which its Sequential feeds it" in found.evidence.iloc[0]
        # zeroed each step: none
        assert "gradients_accumulate" not in set(run(make(), data, zero_grad=True).diagnose().finding)
    kernel_of_3 = found.evidence.iloc[0]
    assert re.search(r"= sqrt\(6\) x [0-9.e-]+ x [0-9.e-]+: a convolution's weight gradient", kernel_of_3), kernel_of_3
    # the first Linear of the model's own Sequential reads the model's input, which no row holds: not bounded alone
    only_first = nn.Sequential(nn.Linear(2, 2, bias=False))
    assert "gradients_accumulate" not in set(run(only_first, rows_of(points), zero_grad=False).diagnose().finding)


def test_a_forgotten_zero_grad_under_gradient_clipping_is_found_while_the_clipped_sum_still_passes_its_bound():
    # clip_grad_norm_ rescales the summed .grad each step: with a max_norm above one step's gradient norm (~0.5 here)
    # the sum passes its bound before the clipping holds it
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)
    torch.manual_seed(0)
    model = workbench.create_model("mlp", in_features=2, num_classes=2, width=32, depth=2, activation="relu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with workbench.watch(model) as w:
        for _ in range(12):
            i = torch.randint(1024, (64,), generator=g)
            F.cross_entropy(model(x[i]), (x[i][:, 0] > 0).long()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            w.step()
    found = w.diagnose()
    assert found.finding.tolist() == ["gradients_accumulate"] and found.step[0] <= 4, found


def test_a_loss_on_the_mean_of_a_layer_norm_s_output_names_the_norm_not_small_weights_nor_the_learning_rate():
    # the mean of a LayerNorm's output over its features is 0 whatever its input: the loss is constant and no gradient
    # passes the norm back. Until 2026-11-30 the findings read as small weights or depth (vanishing_gradients) and a
    # learning rate too small ("each step too small to change a float32 value at this learning rate")
    from tests.diagnose.runs import fit_steps
    from workbench.diagnose import Diagnoser, diagnose

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)

    def batch(_step: int) -> tuple:
        i = torch.randint(1024, (64,), generator=g)
        return x[i], None

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 8), nn.LayerNorm(8, elementwise_affine=False))
    w = fit_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 60, loss_fn=lambda out, _: out.mean(),
                  updates=True)
    f = w.diagnose()
    live = Diagnoser()
    live.feed(w.recorder.records())
    pd.testing.assert_frame_equal(live.findings(), diagnose(w.to_pandas(), w.metrics(long=True)))
    # (the loss, 0 but for float32's rounding now and then, 1.5e-08 after 0: no spike, a level of 0 no scale)
    assert set(f.finding) == {"vanishing_gradients", "update_ratio_low"}, f
    vanishing = f[f.finding == "vanishing_gradients"]
    assert vanishing.site.tolist() == ["0"]
    assert re.search(r"Most of it, [0-9.]+ orders, is across 3 alone: its output gets an RMS of [0-9.e-]+, 2 before "
                     r"it [0-9.e-]+\. 3 passes almost none of its output's gradient back: a normalization whose output "
                     r"the loss reads only through what it normalizes away", vanishing.evidence.iloc[0])
    assert "small weights" not in vanishing.evidence.iloc[0].replace("not small weights", "")
    low = f[f.finding == "update_ratio_low"]
    assert sorted(low.site) == ["0.weight", "2.weight"]
    for text in low.evidence:
        assert re.search(r"the gradient reaching the output of [02] is [0-9.]+ orders of magnitude below the step's "
                         r"largest \(RMS [0-9.e-]+ against [0-9.e-]+ at 3: see vanishing_gradients\), not a learning "
                         r"rate too small\.", text), text
        assert "at this learning rate" not in text


def test_a_loss_fitted_to_exactly_0_that_then_jumps_is_a_spike():
    # a classification fitted exactly (its cross-entropy 0.0 in float32 for every step of its noise window), thrown up
    # to 300 by a batch of flipped labels: no loss_spike from 2026-11-30 (a level and noise of 0 read as no scale) until
    # the largest magnitude of the recent values became the scale there
    from workbench.diagnose import Diagnoser, diagnose

    torch.manual_seed(0)
    x = torch.randn(16, 2)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    losses = []
    with workbench.watch(model) as w:
        for step in range(1, 121):
            loss = F.cross_entropy(model(x), 1 - y if step == 110 else y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss.item())
            losses.append(loss.item())
    assert losses[85:109] == [0.0] * 24 and losses[109] > 100
    f = w.diagnose()
    live = Diagnoser()
    live.feed(w.recorder.records())
    pd.testing.assert_frame_equal(live.findings(), diagnose(w.to_pandas(), w.metrics(long=True)))
    spike = f[f.finding == "loss_spike"]
    assert spike.step.tolist() == [110], f


def test_a_global_average_pool_is_not_named_a_site_that_passes_no_gradient_back():
    # an AdaptiveAvgPool2d over 32x32 spreads its output's gradient over 1024 entries: its RMS 3 orders down, its norm
    # 1.5. From 2026-11-30 until the drop across a site was read by norms, a healthy CNN's vanishing_gradients named the
    # pool "passes almost none of its output's gradient back: a normalization ..., not small weights nor depth"
    from tests.diagnose.runs import fit_steps

    g = torch.Generator().manual_seed(0)
    images = torch.randn(256, 3, 32, 32, generator=g)

    def batch(_step: int) -> tuple:
        i = torch.randint(256, (16,), generator=g)
        return images[i], (images[i][:, 0].mean((1, 2)) > 0).long()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2))
    f = fit_steps(model, torch.optim.SGD(model.parameters(), lr=0.05), batch, 30).diagnose()
    for text in f.evidence:
        assert "passes almost none of its output's gradient back" not in text, text
