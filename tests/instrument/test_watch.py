"""workbench.watch: call sites, structured outputs, gradients, non-invasiveness, robustness, interventions."""

import collections
import copy
import dataclasses
import gc
import inspect
import io
import threading
import time
import warnings
import weakref

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument import ROW_COLUMNS, hooks
from workbench.instrument.reduce import StepSums
from tests.instrument.conftest import compiled_reducers, torch_reducers
from tests.threads import at_once
from workbench.instrument.reduce_cpu import CompiledCpuReducer
from workbench.instrument.reduce_torch import TorchReducer
from workbench.instrument.torch_internals import installed_hooks


def probe_step(name, model, w=None, seed=0):
    result = workbench.probe(name, model=model, batch_size=3, seed=seed)
    if w is not None:
        w.step()
    return result


def hook_dicts(model):
    """The hooks in torch's dicts: the model's modules' and parameters', and the process-wide ones."""
    return installed_hooks(model)


def process_hooks():
    """Counts of torch's process-wide module hooks (register_module_forward_hook ...)."""
    return installed_hooks()


class Counting(CompiledCpuReducer):
    """The compiled CPU reducer, keeping each tensor handed to ``add`` (one at a time)."""

    def __init__(self):
        super().__init__()
        self.added = []

    def add(self, x, row, defer):
        self.added.append(x)
        super().add(x, row, defer)


class Failing(CompiledCpuReducer):
    """The compiled CPU reducer, failing on the tensors of one shape (and on a batch that holds one)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def add(self, x, row, defer):
        if tuple(x.shape) == self.shape:
            raise RuntimeError("boom")
        super().add(x, row, defer)

    def add_many(self, entries):
        if any(tuple(x.shape) == self.shape for x, _ in entries):
            raise RuntimeError("boom")
        super().add_many(entries)


def rows(w, **where):
    frame = w.to_pandas()
    for key, value in where.items():
        frame = frame[frame[key] == value]
    return frame


# ---------------------------------------------------------------- every model
@pytest.mark.parametrize("name", workbench.list_models())
def test_outputs_and_gradients_are_bitwise_identical_with_and_without_watch(name):
    spec = workbench.get_spec(name)
    torch.manual_seed(1)
    bare_model = spec.build()
    watched_model = spec.build()
    watched_model.load_state_dict(bare_model.state_dict())
    before = hook_dicts(watched_model)
    bare = probe_step(name, bare_model)
    with workbench.watch(watched_model, histograms=True) as w:
        watched = probe_step(name, watched_model, w)
    assert not w.errors
    assert len(w.to_pandas()) > 0
    for a, b in zip(workbench.instrument.tree.tensor_leaves(bare.outputs),
                    workbench.instrument.tree.tensor_leaves(watched.outputs)):
        assert torch.equal(a[1], b[1]), a[0]
    for a, b in zip(bare.input_grads, watched.input_grads):
        assert (a is None and b is None) or torch.equal(a, b)
    for (pname, p), (_, q) in zip(bare_model.named_parameters(), watched_model.named_parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad), pname
    assert hook_dicts(watched_model) == before


def test_hooks_are_removed_when_the_with_body_raises():
    model = workbench.create_model("efficientzero_dynamics")
    before = hook_dicts(model)
    with pytest.raises(ZeroDivisionError):
        with workbench.watch(model):
            probe_step("efficientzero_dynamics", model)
            1 / 0
    assert hook_dicts(model) == before


def test_nothing_of_the_step_is_kept_alive():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    refs = []

    def keep_ref(module, args, output):
        refs.append(weakref.ref(output))

    handle = model[1].register_forward_hook(keep_ref)
    with workbench.watch(model, histograms=True) as w:
        for _ in range(3):
            model(torch.randn(5, 4)).square().sum().backward()
            w.step()
    handle.remove()
    gc.collect()
    assert refs and all(r() is None for r in refs)


# ----------------------------------------------------------------- call sites
def test_shared_activation_is_attributed_to_each_alias_path_with_call_indices():
    model = workbench.create_model("efficientzero_dynamics")
    with workbench.watch(model, gradients=False, parameters=False, parameter_grads=False) as w:
        probe_step("efficientzero_dynamics", model, w)
    acts = rows(w, kind="activation")
    relu_sites = set(zip(acts.module, acts.call))
    # the one ReLU object, reached through four names (see LightZero's layout)
    assert {("activation", 0), ("activation", 1), ("activation", 2), ("resblocks.0.act", 0),
            ("resblocks.0.conv1.2", 0), ("fc_reward_head.2", 0)} <= relu_sites
    paths = {p for p, _ in relu_sites}
    relu = model.activation
    aliases = {p for p, m in model.named_modules(remove_duplicate=False) if m is relu}
    assert aliases <= paths


def test_a_shared_modules_parameters_are_recorded_under_whichever_of_its_paths_is_selected():
    class Tied(nn.Module):  # one Linear under enc.0 and dec.0 (an embedding tied to an output layer)
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(4, 4))
            self.dec = nn.Sequential(self.enc[0], nn.ReLU())

        def forward(self, x):
            return self.dec(self.enc(x))

    model = Tied()
    for modules, path in [("dec.*", "dec.0"), ("enc.*", "enc.0"), ("*", "enc.0")]:
        with workbench.watch(model, modules=modules) as w:
            model(torch.randn(2, 4)).sum().backward()
            w.step()
        for kind in ("param", "param_grad"):
            found = rows(w, kind=kind)
            assert sorted(zip(found.module, found.tensor)) == [(path, "bias"), (path, "weight")], (modules, kind)


def test_a_call_is_named_by_its_one_path_or_by_the_caller_of_a_shared_module():
    def pre_hooks():
        return installed_hooks()["_global_forward_pre_hooks"]

    class Skip(nn.Module):  # calls a module registered under another parent
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
            self.b = nn.Sequential(nn.Linear(3, 3))

        def forward(self, x):
            return self.b(self.a[1](self.a(x)))

    plain, before = Skip(), pre_hooks()
    with workbench.watch(plain) as w:
        assert pre_hooks() == before + 1  # (where each forward of the model starts)
        plain(torch.randn(2, 3)).sum().backward()
        w.step()
    # each module under its one path, each call counted
    assert sorted(zip(*rows(w, kind="activation")[["module", "call"]].values.T)) == [
        ("", 0), ("a", 0), ("a.0", 0), ("a.1", 0), ("a.1", 1), ("b", 0), ("b.0", 0)]

    shared = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    shared.append(shared[1])  # one ReLU under two paths: which one ran is told by the caller
    with workbench.watch(shared, gradients=False) as w:
        assert pre_hooks() == before + 1
        shared(torch.randn(2, 3))
        w.step()
    # (twice under one parent: the first path, counted twice)
    assert sorted(zip(*rows(w, kind="activation")[["module", "call"]].values.T)) == [
        ("", 0), ("0", 0), ("1", 0), ("1", 1)]
    assert pre_hooks() == before


def test_a_model_holding_a_torchscript_module_is_watched_with_the_scripted_module_as_one_call_site():
    # a scripted module's member dicts are mappings, not dicts; its inner calls run in TorchScript, unhooked
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # (torch 2.13 deprecates TorchScript)
                self.body = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.body(x))

    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning that the model changed: its structure reads the same)
        with workbench.watch(model, histograms=False) as w:
            for _ in range(2):
                model(x).sum().backward()
                w.step()
    found = rows(w)
    assert set(zip(found.module, found.kind)) == {
        ("", "activation"), ("", "grad_output"), ("body", "activation"), ("body", "grad_output"),
        ("head", "activation"), ("head", "grad_output"), ("head", "param"), ("head", "param_grad"),
        ("body.0", "param"), ("body.0", "param_grad")}
    assert not w.errors and found.step.tolist().count(2) == len(found) // 2


def test_a_model_under_torch_func_transforms_records_every_samples_values_as_the_whole_batch_would():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(5, 4)
    stats = ["module", "call", "kind", "tensor", "numel", "mean", "std", "min", "max", "norm", "zero_frac"]

    def recorded(run):
        with workbench.watch(model, parameters=False, parameter_grads=False, histograms=False) as w:
            run()
            w.step()
        assert not w.errors
        return w.to_pandas()[stats].sort_values(["module", "kind"]).reset_index(drop=True)

    whole = recorded(lambda: model(x).sum().backward())
    params = {name: p.detach() for name, p in model.named_parameters()}
    call = torch.func.functional_call
    per_sample = torch.func.grad(lambda p, xi: call(model, p, (xi,)).sum())
    for run in (lambda: torch.vmap(model)(x).sum().backward(),  # (before: no rows, an error per site)
                lambda: torch.vmap(per_sample, in_dims=(None, 0))(params, x),  # per-sample gradients
                lambda: torch.func.grad(lambda p: call(model, p, (x,)).sum())(params),  # (before: NaN rows)
                lambda: torch.func.grad(lambda p: torch.vmap(lambda xi: call(model, p, (xi,)))(x).sum())(params)):
        pd.testing.assert_frame_equal(recorded(run), whole, rtol=1e-5)


def test_an_unrolled_network_gets_one_record_per_call():
    exp = workbench.experiments.create("efficientzero_dynamics", seed=0, unroll_steps=3, batch_size=4)
    with workbench.watch(exp.model) as w:
        exp.step()
        w.step()
    conv = rows(w, module="conv", kind="activation")
    assert sorted(conv.call) == [0, 1, 2]
    assert sorted(rows(w, module="conv", kind="grad_output").call) == [0, 1, 2]
    # parameters: once per recorded step, however many calls
    assert len(rows(w, module="conv", kind="param")) == 1
    assert len(rows(w, module="conv", kind="param_grad")) == 1
    assert not w.errors


def test_rows_have_the_schema_and_values_match_autograd():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    x = torch.randn(6, 3)
    with workbench.watch(model) as w:
        (model(x) ** 2).sum().backward()
        model(x)  # a second call of every module, not back-propagated
        w.step()
    frame = w.to_pandas()
    assert tuple(frame.columns) == ROW_COLUMNS
    act = rows(w, module="0", kind="activation")
    assert list(act.call) == [0, 1]
    act = act.iloc[0]
    ref = model[0](x).detach()
    assert act["numel"] == 24 and act["shape"] == "(6, 4)" and act["tensor"] == "out"
    assert act["mean"] == pytest.approx(ref.mean().item(), abs=1e-6)
    assert act["std"] == pytest.approx(ref.std().item(), rel=1e-5)
    assert act["max"] == pytest.approx(ref.max().item())
    # d/dh of sum(tanh(h)^2) = 2 tanh(h) (1 - tanh(h)^2), by hand
    t = torch.tanh(ref)
    want = 2 * t * (1 - t ** 2)
    grad = rows(w, module="0", kind="grad_output")
    assert list(grad.call) == [0]  # only call 0 was back-propagated
    assert grad.iloc[0]["norm"] == pytest.approx(want.norm().item(), rel=1e-5)
    assert grad.iloc[0]["abs_mean"] == pytest.approx(want.abs().mean().item(), rel=1e-5)
    pgrad = rows(w, module="0", kind="param_grad")
    assert set(pgrad.tensor) == {"weight", "bias"}
    bias_grad = pgrad[pgrad.tensor == "bias"].iloc[0]
    assert bias_grad["norm"] == pytest.approx(want.sum(0).norm().item(), rel=1e-5)
    weight = rows(w, module="0", kind="param")
    weight = weight[weight.tensor == "weight"].iloc[0]
    assert weight["mean"] == pytest.approx(model[0].weight.mean().item(), abs=1e-7)


# ------------------------------------------------------------ structured outputs
Pair = collections.namedtuple("Pair", "left right")


@dataclasses.dataclass
class Out:
    value: torch.Tensor
    count: int


class Structured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)
        self.lin = nn.Linear(5, 2)

    def forward(self, x):
        seq, (h, c) = self.lstm(x)
        y = self.lin(seq[:, -1])
        return {"pair": Pair(y, h), "data": Out(c, 3), "ids": torch.arange(4), "list": [y * 2]}


def test_structured_outputs_are_walked_and_each_leaf_named():
    model = Structured()
    with workbench.watch(model) as w:
        out = model(torch.randn(4, 6, 3))
        (out["pair"].left.sum() + out["data"].value.sum()).backward()
        w.step()
    assert not w.errors
    lstm = rows(w, module="lstm", kind="activation")
    assert list(lstm.tensor) == ["out.0", "out.1.0", "out.1.1"]
    root = rows(w, module="", kind="activation")
    assert list(root.tensor) == ["out.pair.left", "out.pair.right", "out.data.value", "out.ids", "out.list.0"]
    # the integer leaf has activation statistics only
    grads = rows(w, module="", kind="grad_output")
    assert "out.ids" not in set(grads.tensor)
    ids = root[root.tensor == "out.ids"].iloc[0]
    assert (ids["mean"], ids["max"]) == (1.5, 3.0)


def test_tensordict_outputs_are_walked():
    import tensordict

    class TD(nn.Module):
        def forward(self, x):
            return tensordict.TensorDict({"a": x * 2, "nested": {"b": x + 1}}, batch_size=[x.shape[0]])

    with workbench.watch(TD(), gradients=False) as w:
        w.model(torch.ones(3, 2))
        w.step()
    assert set(rows(w, kind="activation").tensor) == {"out.a", "out.nested.b"}


# ---------------------------------------------------------------- in-place ops
def test_in_place_relu_and_residual_add_record_gradients_without_error():
    model = workbench.create_model("efficientzero_dynamics")  # ReLU(inplace=True), x += ...
    with workbench.watch(model) as w:
        probe_step("efficientzero_dynamics", model, w)
    assert not w.errors
    grads = rows(w, kind="grad_output")
    assert {"activation", "resblocks.0.act", "resblocks.0", "conv"} <= set(grads.module)


# ------------------------------------------------------------------- every=N
def test_every_n_records_only_every_nth_step_and_hooks_idle_in_between():
    counting = Counting()
    reductions = counting.added
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    per_step = []
    with workbench.watch(model, every=3, reducers=[counting, TorchReducer()]) as w:
        for _ in range(7):
            before = len(reductions)
            model(torch.randn(4, 2)).sum().backward()
            w.step()
            per_step.append(len(reductions) - before)
    assert sorted(set(w.to_pandas().step)) == [1, 4, 7]
    assert [n > 0 for n in per_step] == [True, False, False, True, False, False, True]


def test_record_next_records_the_step_in_progress_whatever_every_says():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    with workbench.watch(model, every=3) as w:
        for step in range(1, 7):
            if step in (2, 4):  # (4 is recorded anyway)
                w.record_next()
            model(torch.randn(4, 2)).sum().backward()
            w.step()
    rows = w.to_pandas()
    assert sorted(set(rows.step)) == [1, 2, 4]
    assert len(rows[rows.step == 2]) == len(rows[rows.step == 1])  # (every kind of row, as a recorded step)
    with pytest.raises(RuntimeError, match="closed"):
        w.record_next()


def _train_step(model, opt, w, record_next_at=None):
    """One training step, calling ``w.record_next()`` at ``record_next_at`` ("start", "after forward",
    "after backward", "after optimizer step"; None: not at all)."""
    def at(point):
        if point == record_next_at:
            w.record_next()

    at("start")
    loss = model(torch.randn(4, 2)).pow(2).mean()
    at("after forward")
    loss.backward()
    at("after backward")
    opt.step()
    opt.zero_grad()
    at("after optimizer step")
    w.step(loss=loss.item())


@pytest.mark.parametrize("point", ["after forward", "after backward", "after optimizer step"])
def test_record_next_part_way_through_a_step_records_the_next_step_in_full_and_says_so(point):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with workbench.watch(model, every=10, updates=True) as w:
        _train_step(model, opt, w)  # step 1: recorded (every=10)
        with pytest.warns(RuntimeWarning, match=r"record_next\(\) was called part-way through step 2.*Step 3 is "
                                                r"recorded in full instead.*after w\.step\(\), before the model runs"):
            _train_step(model, opt, w, record_next_at=point)
        _train_step(model, opt, w)  # step 3
        _train_step(model, opt, w)  # step 4: not recorded (every=10)
    rows = w.to_pandas()
    assert sorted(set(rows.step)) == [1, 3]  # no partial step 2
    first, third = (rows[rows.step == step].reset_index(drop=True) for step in (1, 3))
    assert first[["module", "call", "kind", "tensor"]].equals(third[["module", "call", "kind", "tensor"]])
    assert (third[third.kind == "update"].norm > 0).all()  # the optimizer's step, not zero
    assert list(w.metrics().step) == [1, 2, 3, 4]  # (step 2's loss is kept)
    assert not w.errors


def test_record_next_on_a_watch_of_parameters_and_gradients_alone_records_the_step_in_progress():
    # (no module hook tells a step whose backward ran before record_next() from one with no backward: an
    # evaluation step, recorded between two steps as asked, was dropped with a warning that it came too late)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workbench.watch(model, every=10, activations=False, gradients=False) as w:  # no module hooks
            _train_step(model, opt, w)
            _train_step(model, opt, w, record_next_at="after forward")  # the backward comes after it
            w.record_next()  # an evaluation step: no backward
            with torch.no_grad():
                model(torch.randn(4, 2))
            w.step()
    rows = w.to_pandas()
    assert sorted(set(rows.step)) == [1, 2, 3]
    assert len(rows[rows.step == 2]) == len(rows[rows.step == 1]) == 4  # (2 parameters, 2 gradients)
    assert set(rows[rows.step == 3].kind) == {"param"}


def test_record_next_between_steps_says_nothing_and_a_discarded_step_is_recorded_when_run_again():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workbench.watch(model, every=10) as w:
            _train_step(model, opt, w)
            _train_step(model, opt, w, record_next_at="start")  # step 2, as record_next means
            w.record_next()
            model(torch.randn(4, 2))  # a step that raised after its forward ...
            w.discard_step()  # ... run again from its start: step 3, still to be recorded
            _train_step(model, opt, w)
            _train_step(model, opt, w)
    rows = w.to_pandas()
    assert sorted(set(rows.step)) == [1, 2, 3]
    assert len(rows[rows.step == 3]) == len(rows[rows.step == 1])


def test_idle_steps_run_without_our_hooks_which_return_to_their_place():
    from torch.nn.modules.module import _global_forward_hooks, register_module_forward_hook

    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    own = model[0].register_forward_hook(lambda m, a, out: out + 1)  # the user's, on the module
    module_hooks = hook_dicts(model)["modules"]
    before = register_module_forward_hook(lambda m, a, out: None)  # the user's, process-wide
    w = workbench.watch(model, every=2)
    after = late = register_module_forward_hook(lambda m, a, out: None)
    try:
        ours = [k for k in _global_forward_hooks if k not in (before.id, after.id)]
        assert len(ours) == 1 and list(_global_forward_hooks)[-3:] == [before.id, *ours, after.id]
        model(torch.randn(4, 2)).sum().backward()
        w.step()  # step 2 is not recorded: nothing of ours is left in torch's hook dicts
        assert list(_global_forward_hooks)[-2:] == [before.id, after.id]
        assert not any(installed_hooks(model)["parameters"])
        late = register_module_forward_hook(lambda m, a, out: None)
        model(torch.randn(4, 2)).sum().backward()
        w.step()  # step 3 is recorded: ours are back where they were, the late hook behind them
        assert list(_global_forward_hooks)[-4:] == [before.id, *ours, after.id, late.id]
        assert hook_dicts(model)["modules"] == module_hooks  # nothing of ours is ever put into the modules
        x = torch.randn(4, 2)
        model(x).sum().backward()
        w.step()
        # torch runs process-wide hooks before the module's own: the activation is what the
        # module's forward returned, and the next module's shows the user's hook's change
        linear = torch.nn.functional.linear(x, model[0].weight, model[0].bias)
        recorded = rows(w, step=3, module="0", kind="activation").iloc[0]
        assert recorded["mean"] == pytest.approx(linear.mean().item(), abs=1e-6)
        recorded = rows(w, step=3, module="1", kind="activation").iloc[0]
        assert recorded["mean"] == pytest.approx(torch.relu(linear + 1).mean().item(), abs=1e-6)
        assert sorted(set(w.to_pandas().step)) == [1, 3]
        w.close()
    finally:
        for handle in (before, after, late):
            handle.remove()
    own.remove()
    assert hook_dicts(model) == hook_dicts(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))


def test_a_watched_model_deep_copies_and_saves_as_before_and_a_copy_is_not_watched():
    # wandb.watch's hooks make torch.save(model) fail (wandb issues 961, 2588, 5573); a deep copy
    # (a target network, an EMA, a best-so-far snapshot) would carry per-module hooks along
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    before = hook_dicts(model)
    x = torch.randn(2, 3)
    with workbench.watch(model) as w:
        model(x).sum().backward()
        duplicate = copy.deepcopy(model)
        saved = io.BytesIO()
        torch.save(model, saved)
        with torch.no_grad():
            for p in duplicate.parameters():
                p.mul_(10)
        duplicate(torch.randn(5, 3)).sum().backward()  # another model: recorded nowhere
        w.step()
    assert not w.errors
    recorded = w.to_pandas()
    assert set(recorded[recorded.kind == "activation"]["shape"]) == {"(2, 4)", "(2, 1)"}
    weight_grad = rows(w, module="0", kind="param_grad", tensor="weight").iloc[0]
    assert weight_grad["norm"] == pytest.approx(model[0].weight.grad.norm().item(), rel=1e-6)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    for other in (duplicate, loaded):
        assert hook_dicts(other) == before
    assert torch.equal(loaded(x), model(x))


def test_a_watch_let_go_of_without_close_takes_its_hooks_out():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    before = hook_dicts(model)
    w = workbench.watch(model)
    model(torch.randn(2, 3)).sum().backward()
    w.step()
    collected = weakref.ref(w)
    del w
    gc.collect()
    assert collected() is None
    assert hook_dicts(model) == before
    model(torch.randn(2, 3)).sum().backward()  # runs without a trace of the watch


def test_modules_of_other_models_are_passed_over():
    inner = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    outer = nn.Sequential(inner, nn.Linear(4, 2))  # the watched model called inside an unwatched one
    other = nn.Sequential(nn.Linear(3, 3))
    with workbench.watch(inner) as w:
        other(torch.randn(2, 3))
        outer(torch.randn(2, 3)).sum().backward()
        other(torch.randn(2, 3))
        w.step()
    recorded = w.to_pandas()
    assert set(recorded.module) == {"", "0", "1"}
    assert set(recorded[recorded.kind == "activation"]["shape"]) == {"(2, 4)"}
    assert list(rows(w, kind="activation", module="").call) == [0]


def test_watches_of_models_trained_at_once_on_two_threads_record_only_their_own():
    # the hooks are process-wide: each watch sees the other model's calls, and takes its hooks
    # out and puts them back (every=2) while the other thread runs modules
    def train(width, results):
        model = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Sequential(nn.Linear(width, 2), nn.Tanh()))
        with workbench.watch(model, every=2) as w:
            for _ in range(30):
                model(torch.randn(5, 3)).sum().backward()
                w.step()
        results[width] = w

    results = {}
    threads = [threading.Thread(target=train, args=(width, results)) for width in (4, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for width, w in results.items():
        assert not w.errors
        recorded = w.to_pandas()
        assert sorted(set(recorded.step)) == list(range(1, 31, 2))
        assert set(recorded.call) == {0}
        assert len(recorded) == 15 * len(recorded[recorded.step == 1])
        shapes = set(recorded[recorded.kind == "activation"]["shape"])
        assert shapes == {f"(5, {width})", "(5, 2)"}


def test_a_paused_block_is_neither_recorded_nor_patched_and_runs_without_our_hooks():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    x = torch.randn(4, 2)
    clean = torch.relu(torch.nn.functional.linear(x, model[0].weight, model[0].bias))
    outside = process_hooks()
    with workbench.watch(model) as w:
        w.ablate("1", [0])
        model(x).sum().backward()
        grad = model[0].weight.grad.clone()
        with w.paused():
            assert process_hooks() == outside
            assert not any(installed_hooks(model)["parameters"])
            evaluation = model(x)
            evaluation.sum().backward()  # (accumulates into .grad: not recorded)
        assert torch.equal(evaluation, clean)  # the patch was not applied
        assert torch.equal(model(x), clean * torch.tensor([0.0, 1.0, 1.0]))  # and is again
        w.step()
    assert not w.errors
    assert list(rows(w, module="1", kind="activation").call) == [0, 1]  # the paused call is not counted
    recorded = rows(w, module="0", kind="param_grad", tensor="weight").iloc[0]
    assert recorded["norm"] == pytest.approx(grad.norm().item(), rel=1e-6)
    with pytest.raises(RuntimeError, match="closed"):
        with w.paused():
            pass


def test_an_intervention_keeps_hooks_in_on_idle_steps():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    x = torch.randn(4, 2)
    outside = process_hooks()
    with workbench.watch(model, every=10) as w:
        w.step()  # now idle
        assert process_hooks() == outside
        clean = torch.relu(torch.nn.functional.linear(x, model[0].weight, model[0].bias))
        patch = w.ablate("0", [0, 2])
        assert process_hooks() != outside
        assert torch.equal(model(x), clean * torch.tensor([0.0, 1.0, 0.0]))
        patch.remove()
        assert process_hooks() == outside
        assert torch.equal(model(x), clean)
        w.step()
        assert process_hooks() == outside


def test_a_watch_of_parameters_alone_runs_the_forward_and_backward_without_module_hooks():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    x = torch.randn(4, 2)
    outside = process_hooks()
    # parameter values only: no hook at all, the values are read in step()
    with workbench.watch(model, activations=False, gradients=False, parameter_grads=False) as w:
        assert process_hooks() == outside
        assert not any(installed_hooks(model)["parameters"])
        model(x).sum().backward()
        w.step()
        patch = w.ablate("1", [0])  # a patch needs the module hooks: in while it is there
        assert process_hooks() != outside
        hidden = torch.tanh(torch.nn.functional.linear(x, model[0].weight, model[0].bias))
        ablated = torch.nn.functional.linear(hidden * torch.tensor([0.0, 1.0, 1.0]), model[2].weight, model[2].bias)
        assert torch.allclose(model(x), ablated)
        patch.remove()
        assert process_hooks() == outside
    assert set(w.to_pandas().kind) == {"param"}
    weight = rows(w, kind="param", module="0", tensor="weight")
    assert list(weight.step) == [1] and weight["mean"].iloc[0] == pytest.approx(model[0].weight.mean().item())
    # parameter gradients only: their hooks, no module hook
    model.zero_grad()
    with workbench.watch(model, activations=False, gradients=False, parameters=False) as w:
        model(x).sum().backward()
        assert process_hooks() == outside
        w.step()
    assert set(w.to_pandas().kind) == {"param_grad"}
    grad = rows(w, kind="param_grad", module="2", tensor="weight")
    assert grad["norm"].iloc[0] == pytest.approx(model[2].weight.grad.norm().item(), rel=1e-6)


def test_sites_whose_every_kind_failed_leave_the_forward_without_module_hooks():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh())
    x = torch.randn(4, 2)
    outside = process_hooks()
    failing = [Failing((4, 3)), TorchReducer()]  # the Linear(2, 3) output and its gradient
    with workbench.watch(model, modules="0", parameters=False, parameter_grads=False, reducers=failing) as w:
        assert process_hooks() != outside
        model(x).sum().backward()
        w.step()  # both of site "0"'s kinds failed: nothing is left for the module hooks to take
        assert {(e["module"], e["kind"]) for e in w.errors} == {("0", "activation"), ("0", "grad_output")}
        assert process_hooks() == outside
        model(x).sum().backward()
        w.step()
    assert len(w.errors) == 2


def test_a_gradient_the_backward_hands_to_several_sites_is_reduced_once():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.branch = nn.Linear(3, 300), nn.Linear(300, 300)

        def forward(self, x):
            h = self.inp(x)
            return h + self.branch(h)  # AddBackward passes its incoming gradient on to both inputs as it is

    torch.manual_seed(0)
    model, x = Residual(), torch.randn(4, 3)
    # by hand: the gradient of sum(out^2) w.r.t. the model's output (and so w.r.t. the branch's) is
    # 2 out; w.r.t. h, 2 out + (2 out) W_branch
    h = model.inp(x).detach()
    out = h + model.branch(h).detach()
    want = {"": 2 * out, "branch": 2 * out, "inp": 2 * out + 2 * out @ model.branch.weight.detach()}
    counting = Counting()
    reduced = counting.added
    with workbench.watch(model, activations=False, parameters=False, parameter_grads=False,
                         reducers=[counting, TorchReducer()]) as w:
        model(x).square().sum().backward()
        w.step()
    grads = rows(w, kind="grad_output").set_index("module")
    assert sorted(grads.index) == ["", "branch", "inp"]
    for module, grad in want.items():
        assert grads.loc[module, "norm"] == pytest.approx(grad.norm().item(), rel=1e-5), module
        assert grads.loc[module, "mean"] == pytest.approx(grad.mean().item(), rel=1e-5), module
    assert len(reduced) == 2  # the model's and the branch's gradient is one tensor, reduced once


@pytest.mark.parametrize("shape", [(12, 3), (2, 6, 3)], ids=["plain", "view"])  # 3-D: Linear returns a view
def test_gradients_match_autograd_after_in_place_ops_and_for_multi_output_nodes(shape):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 5)
            self.act = nn.ReLU(inplace=True)  # modifies lin's output in place
            self.lstm = nn.LSTM(5, 4, batch_first=True)  # one node, three outputs

        def forward(self, x):
            h = self.lin(x)
            h = self.act(h)
            seq, (hn, cn) = self.lstm(h.reshape(2, 6, 5))
            return seq.square().sum() + 3 * hn.sum() + cn.pow(3).sum()

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(shape)
    # references by hand: retain_grad on an out-of-place copy of the same computation
    h = model.lin(x)
    h.retain_grad()
    seq, (hn, cn) = model.lstm(torch.relu(h).reshape(2, 6, 5))
    for t in (seq, hn, cn):
        t.retain_grad()
    (seq.square().sum() + 3 * hn.sum() + cn.pow(3).sum()).backward()
    want = {("lin", "out"): h.grad, ("lstm", "out.0"): seq.grad, ("lstm", "out.1.0"): hn.grad,
            ("lstm", "out.1.1"): cn.grad}
    model.zero_grad()
    with workbench.watch(model) as w:
        model(x).backward()
        w.step()
    assert not w.errors
    grads = rows(w, kind="grad_output").set_index(["module", "tensor"])
    for key, grad in want.items():
        assert grads.loc[key, "norm"] == pytest.approx(grad.norm().item(), rel=1e-5), key
        assert grads.loc[key, "mean"] == pytest.approx(grad.mean().item(), rel=1e-4, abs=1e-7), key


def test_a_part_of_a_tensor_returned_and_then_modified_in_place_keeps_its_gradient_row():
    """A module returning a slice of its layer's output, which the caller scales in place: the slice's
    own autograd node leaves the graph, and its output gradient still arrives (the base's, cut to it)."""
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            return self.lin(x)[:, 1::2]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = Head()

        def forward(self, x):
            y = self.head(x)
            y.mul_(2)
            return (y * torch.arange(y.numel()).view(y.shape)).sum()

    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 4)
    reference = model.head(x).detach().requires_grad_()  # the same computation, out of place
    (2 * reference * torch.arange(15).view(5, 3)).sum().backward()
    with workbench.watch(model) as w:
        model(x).backward()
        w.step()
    assert not w.errors
    grad = rows(w, kind="grad_output").set_index("module").loc["head"]
    assert grad["shape"] == "(5, 3)"
    for stat, value in [("mean", reference.grad.mean()), ("std", reference.grad.std()), ("max", reference.grad.max()),
                        ("norm", reference.grad.norm())]:
        assert grad[stat] == pytest.approx(value.item(), rel=1e-6), stat


class Checkpointed(nn.Module):
    """A segment run under activation checkpointing (or not): its forward runs again in the backward."""

    def __init__(self, reentrant=None, shared_in_segment=False):
        super().__init__()
        self.reentrant, self.shared_in_segment = reentrant, shared_in_segment
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        self.act = nn.Tanh()  # called after the segment, and also in it with shared_in_segment
        self.head = nn.Linear(4, 1)

    def segment(self, x):
        return self.block(self.act(x) if self.shared_in_segment else x)

    def forward(self, x):
        if self.reentrant is None:
            h = self.segment(x)
        else:
            h = torch.utils.checkpoint.checkpoint(self.segment, x, use_reentrant=self.reentrant)
        return self.head(self.act(h))


def _checkpoint_run(reentrant, patch=None, shared_in_segment=False):
    torch.manual_seed(0)
    model = Checkpointed(reentrant, shared_in_segment)
    x = torch.randn(5, 4, requires_grad=True)  # reentrant checkpointing needs an input that requires grad
    with workbench.watch(model) as w:
        if patch:
            w.patch(*patch)
        model(x).sum().backward()
        w.step()
    frame = w.to_pandas().sort_values(["module", "call", "kind", "tensor"]).reset_index(drop=True)
    return frame, [p.grad.clone() for p in model.parameters()], w.errors


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_records_what_the_plain_forward_records(reentrant):
    plain, plain_grads, _ = _checkpoint_run(None)
    got, grads, errors = _checkpoint_run(reentrant)
    assert not errors
    # no rows for the recomputation; the gradients inside the segment still recorded (from the
    # recomputed graph when the forward ran under no_grad, as reentrant checkpointing does)
    cols = ["module", "call", "kind", "tensor"]
    assert got[cols].values.tolist() == plain[cols].values.tolist()
    np.testing.assert_allclose(got["mean"], plain["mean"], rtol=1e-6, atol=1e-7)
    # a patch of a site called once applies to its recomputation too: the gradients match
    patched, patched_grads, errors = _checkpoint_run(reentrant, patch=("block.1", lambda out: out * 3, 0))
    want, want_grads, _ = _checkpoint_run(None, patch=("block.1", lambda out: out * 3, 0))
    assert not errors
    for g, h in zip(patched_grads, want_grads):
        torch.testing.assert_close(g, h)
    assert not all(torch.equal(g, h) for g, h in zip(want_grads, plain_grads))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_call_indexed_patch_that_checkpointing_cannot_place_is_reported_and_removed(reentrant):
    # "act" runs twice in the forward, once in the segment: its recomputation is of an unknown call
    _, _, errors = _checkpoint_run(reentrant, patch=("act", lambda out: out * 3, 1), shared_in_segment=True)
    assert [(e["module"], e["kind"]) for e in errors] == [("act", "patch:<lambda>")]
    assert "call=None" in errors[0]["error"]


def _compiled_run(order):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(5, 4)
    if order == "eager":
        w = workbench.watch(model)
        run = model
    elif order == "watch the compiled module":
        run = torch.compile(model, backend="aot_eager")  # dynamo and AOTAutograd, no C++ build
        w = workbench.watch(run)
    else:  # "compile after watch"
        w = workbench.watch(model)
        run = torch.compile(model, backend="aot_eager")
    with w:
        for _ in range(2):
            run(x).pow(2).sum().backward()
            w.step()
    return w.to_pandas().sort_values(["step", "module", "call", "kind", "tensor"]).reset_index(drop=True), w


# dynamo reads .grad of the tensors that cross a graph break (the hooks' breaks), which warns
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("order", ["watch the compiled module", "compile after watch"])
def test_a_compiled_model_is_recorded_as_the_eager_one(order):
    want, _ = _compiled_run("eager")
    got, w = _compiled_run(order)
    assert not w.errors and w.model is not None
    cols = ["step", "module", "call", "kind", "tensor"]
    assert got[cols].values.tolist() == want[cols].values.tolist()  # the paths of the uncompiled model
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-5, atol=1e-6)
    if order == "watch the compiled module":
        return  # (workbench.watch took the compiled watch: its hooks are traced on purpose, tests/instrument/test_compiled.py)
    # the eager hooks ran as they are: dynamo compiled none of the code they call
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    ours = [f for cls in (hooks.Hooks, StepSums, CompiledCpuReducer) for f in vars(cls).values() if inspect.isfunction(f)]
    assert len(ours) > 20 and not [f for f in ours if _debug_get_cache_entry_list(f.__code__)]


def test_parameter_gradients_accumulated_over_backwards_are_recorded_as_totals():
    model = nn.Linear(3, 2)
    xs = [torch.randn(4, 3) for _ in range(3)]
    with workbench.watch(model) as w:
        for x in xs:  # gradient accumulation: three backwards, one step
            model(x).square().sum().backward()
        total = model.weight.grad.clone()
        model.zero_grad(set_to_none=False)  # zeroes .grad in place before the step ends
        w.step()
    got = rows(w, kind="param_grad", tensor="weight").iloc[0]
    assert got["norm"] == pytest.approx(total.norm().item(), rel=1e-6)
    assert len(rows(w, kind="grad_output")) == 3  # one per call


def _optimizer_in_backward(model, lr=0.1):
    """The optimizer-in-backward pattern: each parameter steps in its post-accumulate-grad hook, and
    its gradient is set to None there."""
    def step_now(param):
        with torch.no_grad():
            param -= lr * param.grad
        param.grad = None

    return [p.register_post_accumulate_grad_hook(step_now) for p in model.parameters()]


def test_a_parameter_given_new_data_of_another_shape_is_recorded_as_it_is_now():
    model = nn.Linear(3, 2)
    with workbench.watch(model, activations=False, gradients=False) as w:
        model(torch.randn(4, 3)).sum().backward()
        w.step()
        with torch.no_grad():  # pruned to one output: new data, another shape, same Parameter object
            model.weight.data = torch.arange(3.0)[None] + 10
            model.bias.data = torch.tensor([-1.0])
        model.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        w.step()
    frame = w.to_pandas().set_index(["step", "kind", "tensor"])
    assert frame.loc[(1, "param", "weight"), "shape"] == "(2, 3)"
    assert frame.loc[(2, "param", "weight"), "shape"] == "(1, 3)"
    assert frame.loc[(2, "param", "weight"), "mean"] == pytest.approx(11.0)
    assert frame.loc[(2, "param_grad", "weight"), "shape"] == "(1, 3)"
    assert frame.loc[(2, "param_grad", "weight"), "mean"] == pytest.approx(4.0)  # d/dW of sum(W x + b), x = 1
    assert frame.loc[(2, "param_grad", "bias"), "numel"] == 1


def test_parameter_gradients_stepped_inside_the_backward_are_recorded_when_watch_came_first():
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    reference = copy.deepcopy(model)
    want = torch.autograd.grad(reference(x).square().sum(), [reference.weight, reference.bias])
    with workbench.watch(model) as w:
        handles = _optimizer_in_backward(model)
        model(x).square().sum().backward()
        w.step()
    for h in handles:
        h.remove()
    assert w.errors == [] and model.weight.grad is None
    for name, grad in zip(["weight", "bias"], want):
        assert rows(w, kind="param_grad", tensor=name).iloc[0]["norm"] == pytest.approx(grad.norm().item(), rel=1e-6)
    torch.testing.assert_close(model.weight, reference.weight - 0.1 * want[0])  # the step happened as without watch


def test_parameter_gradients_taken_before_watchs_hook_are_reported_and_training_goes_on():
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    handles = _optimizer_in_backward(model)
    before = model.weight.detach().clone()
    with workbench.watch(model) as w:
        model(x).square().sum().backward()
        w.step()
    for h in handles:
        h.remove()
    [error] = w.errors  # the first one disables the site (the model's own parameters)
    assert (error["module"], error["kind"]) == ("", "param_grad")
    assert "already None" in error["error"] and "Start watch() before" in error["error"]
    assert len(rows(w, kind="param_grad")) == 0 and len(rows(w, kind="param")) == 2
    assert not torch.equal(model.weight, before)  # the optimizer stepped


def test_no_gradient_hooks_under_no_grad_or_eval():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    with workbench.watch(model) as w:
        with torch.no_grad():
            model(torch.randn(4, 2))
        w.step()
        model.eval()
        model(torch.randn(4, 2))
        w.step()
    frame = w.to_pandas()
    assert set(frame.kind) == {"activation", "param"}


@pytest.mark.parametrize("path", ["compiled", "torch", "triton"])
def test_hooks_never_transfer_to_the_host(monkeypatch, request, path):
    # (the torch and Triton paths are those of tensors on a GPU)
    reducers = {"compiled": compiled_reducers, "torch": torch_reducers,
                "triton": lambda: request.getfixturevalue("interpreted_triton")()}[path]()
    model = workbench.create_model("efficientzero_dynamics")
    w = workbench.watch(model, reducers=reducers)

    def forbidden(*args, **kwargs):
        raise AssertionError("a hook synchronised with the host")

    for name in ("item", "cpu", "tolist", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    probe_step("efficientzero_dynamics", model)
    monkeypatch.undo()
    w.step()
    w.close()
    assert not w.errors
    assert {"activation", "grad_output", "param", "param_grad"} == set(w.to_pandas().kind)


# --------------------------------------------------------------- selection
def test_modules_and_exclude_select_call_sites():
    model = workbench.create_model("efficientzero_dynamics")
    with workbench.watch(model, modules="resblocks.*", exclude=["*.conv2*"]) as w:
        probe_step("efficientzero_dynamics", model, w)
    modules = set(w.to_pandas().module)
    assert modules and all(m.startswith("resblocks.") for m in modules)
    assert not any(".conv2" in m for m in modules)
    with workbench.watch(model, modules=lambda p: p == "lstm") as w:
        probe_step("efficientzero_dynamics", model, w)
    assert set(w.to_pandas().module) == {"lstm"}


def test_bad_options_get_clear_errors():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="matches no module.*''"):
        workbench.watch(model, modules="encoder.*")
    with pytest.raises(ValueError, match="every"):
        workbench.watch(model, every=0)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        workbench.watch(lambda x: x)
    with pytest.raises(TypeError, match="gradients must be True or False"):
        workbench.watch(model, gradients="yes")
    named = nn.Sequential(collections.OrderedDict(encoder=nn.Linear(2, 2), act=nn.ReLU()))
    with workbench.watch(named) as w:
        with pytest.raises(ValueError, match="No module at path 'encodr'. Did you mean 'encoder'"):
            w.patch("encodr", lambda out: out)
        with pytest.raises(ValueError, match="call must be None"):
            w.ablate("act", 0, call=-1)
        with pytest.raises(TypeError, match="units must be"):
            w.ablate("act", "first")
    with pytest.raises(RuntimeError, match="closed"):
        w.step()


# ---------------------------------------------------------------- robustness
def test_a_failing_hook_is_recorded_and_its_site_disabled():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 2)
    flaky = [Failing((4, 3)), TorchReducer()]  # only the Linear(2, 3) output and its gradient
    with workbench.watch(model, modules=["0", "2"], reducers=flaky) as w:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            w.step()
    assert {(e["module"], e["kind"]) for e in w.errors} == {("0", "activation"), ("0", "grad_output")}
    assert all(e["step"] == 1 and "boom" in e["error"] for e in w.errors)
    assert len(rows(w, module="2", kind="activation")) == 3  # the rest keeps recording


def test_a_parameter_that_cannot_be_summarized_stops_its_site_alone():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    # the bias of Linear(2, 3) and its gradient; the batch fails as a whole, then each tensor is tried alone
    failing = [Failing((3,)), TorchReducer()]
    with workbench.watch(model, activations=False, gradients=False, reducers=failing) as w:
        model(torch.randn(4, 2)).sum().backward()
        w.step()
    assert {(e["module"], e["kind"]) for e in w.errors} == {("0", "param"), ("0", "param_grad")}
    recorded = rows(w)
    assert sorted(zip(recorded.module, recorded.kind, recorded.tensor)) == sorted(
        [(module, kind, name) for module in ("0", "2") for kind in ("param", "param_grad")
         for name in ("weight", "bias") if (module, name) != ("0", "bias")])
    want = model[2].weight.grad.norm().item()
    assert rows(w, module="2", kind="param_grad", tensor="weight").iloc[0]["norm"] == pytest.approx(want, rel=1e-6)


class Layouts(nn.Module):
    """Outputs in every layout a module can return, gradients flowing through the sparse and nested ones."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        sparse = y.to_sparse()
        jagged = torch.nested.as_nested_tensor([y[:1], y[1:]], layout=torch.jagged)
        loss = torch.sparse.sum(sparse) + jagged.values().pow(2).sum()
        quantized = torch.quantize_per_tensor(y.detach(), 0.01, 0, torch.quint8)
        return {"sparse": sparse, "jagged": jagged, "quantized": quantized, "loss": loss}


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are "in beta"
def test_outputs_of_every_layout_are_recorded_as_their_dense_values():
    model = Layouts()
    x = torch.randn(4, 3)
    with workbench.watch(model) as w:
        model(x)["loss"].backward()
        w.step()
    assert not w.errors
    y = torch.relu(model.lin(x)).detach()
    got = rows(w, module="", kind="activation").set_index("tensor")
    assert list(got["shape"]) == ["(4, 3)", "(2, *, 3)", "(4, 3)", "()"]  # a ragged dimension is *
    for leaf in ("out.sparse", "out.jagged"):
        assert got.loc[leaf, "mean"] == pytest.approx(y.mean().item(), rel=1e-6)
        assert got.loc[leaf, "zero_frac"] == pytest.approx((y == 0).float().mean().item())
    assert got.loc["out.quantized", "max"] == pytest.approx(y.max().item(), abs=0.005)
    grads = rows(w, module="", kind="grad_output").set_index("tensor")
    # d(loss)/d(sparse) is 1 at the stored entries (the non-zeros of y); d/d(jagged) is 2 y
    assert grads.loc["out.sparse", "mean"] == pytest.approx((y != 0).float().mean().item())
    assert grads.loc["out.jagged", "mean"] == pytest.approx(2 * y.mean().item(), rel=1e-6)


def test_an_output_that_cannot_be_summarized_stops_its_site_not_the_model(monkeypatch):
    class Meta(nn.Module):
        def forward(self, x):
            return x.new_empty(x.shape, device="meta")  # a shape without values

    model = nn.Sequential(nn.Linear(2, 2), Meta())
    with workbench.watch(model) as w:
        for _ in range(2):
            out = model(torch.randn(3, 2))
            w.step()
    assert out.is_meta
    # the Sequential ("") returns its last child's output: both sites stop, at the first step
    assert [(e["step"], e["module"], e["kind"]) for e in w.errors] == [(1, "1", "activation"), (1, "", "activation")]
    assert all("meta device" in e["error"] for e in w.errors)
    assert len(rows(w, module="0", kind="activation")) == 2  # the other sites go on

    import workbench.instrument.hooks as hooks

    def broken_walk(output):
        raise RuntimeError("an output type the walk chokes on")

    monkeypatch.setattr(hooks, "tensor_leaves", broken_walk)
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)

        def forward(self, x):
            y = self.linear(x)
            return y, y  # a tuple: the walk runs

    pair = Pair()
    with workbench.watch(pair, modules="") as w:
        out = pair(torch.randn(3, 2))
        out[0].sum().backward()
        w.step()
    assert isinstance(out, tuple)
    assert {(e["module"], e["kind"]) for e in w.errors} == {("", "activation"), ("", "grad_output")}


def test_a_failed_host_transfer_loses_the_step_statistics_not_the_run():
    class FailingTransfer(TorchReducer):  # (the path of tensors on a GPU)
        fail = True

        def collect(self):
            found = super().collect()
            if self.fail:
                raise RuntimeError("transfer failed")
            return found

    model = nn.Linear(2, 2)
    reducer = FailingTransfer()
    with workbench.watch(model, reducers=[reducer]) as w:
        model(torch.randn(3, 2)).sum().backward()
        record = w.step(loss=1.0)
        reducer.fail = False
        model(torch.randn(3, 2)).sum().backward()
        w.step(loss=0.5)
    assert record.metrics == {"loss": 1.0} and len(record.keys) == 0
    assert [(e["step"], e["kind"]) for e in w.errors] == [(1, "statistics")]
    assert set(rows(w).step) == {2}


def test_anomalies_name_the_first_step_module_call_and_kind():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with workbench.watch(model) as w:
        for step in range(1, 5):
            if step == 3:
                handle = w.patch("0", lambda out: out.index_fill(1, torch.tensor([1]), float("nan")), call=0)
            model(torch.randn(4, 2)).sum().backward()
            w.step()
            if step == 3:
                handle.remove()
    first = w.anomalies().iloc[0]
    assert (first.step, first.module, first.call, first.kind) == (3, "0", 0, "activation")
    assert first.nan_count == 4


# -------------------------------------------------------------- interventions
def test_patch_and_ablate_change_outputs_recordings_and_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    bare = model(x)
    with workbench.watch(model) as w:
        handle = w.ablate("0", [1, 3])
        out = model(x)
        out.sum().backward()
        w.step()
        hidden = model[0](x).detach()
        hidden[:, [1, 3]] = 0
        torch.testing.assert_close(out, model[2](torch.relu(hidden)))
        act = rows(w, module="0", kind="activation").iloc[0]
        assert act.zero_frac == pytest.approx(0.5)
        # no gradient reaches the ablated units' weights
        assert torch.equal(model[0].weight.grad[[1, 3]], torch.zeros(2, 3))
        handle.remove()
        w.step()
        assert torch.equal(model(x), bare)  # call 0 of "2" in this step
        doubled = w.patch("2", lambda out: out * 2, call=1)
        first, second = model(x), model(x)  # calls 1 and 2
        assert torch.equal(first, bare * 2) and torch.equal(second, bare)
        assert w.interventions == [doubled]


def test_a_failing_patch_is_recorded_and_removed():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    x = torch.randn(2, 3)
    with workbench.watch(model) as w:
        w.ablate("0", [7])  # only 4 units: the watch has not seen the output yet
        with pytest.warns(RuntimeWarning, match=r"ablate\[7\]@dim1 at '0' failed and was removed"):
            out = model(x)  # not silent: the model runs unablated, and the user is told
        w.step()
    assert torch.equal(out, model(x))
    assert w.errors and "units [7] are out of range" in w.errors[0]["error"]
    assert w.interventions == []


def test_stepping_before_the_backward_warns_once_and_names_each_site_in_the_errors():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    with workbench.watch(model) as w:
        loss = model(torch.randn(2, 3)).sum()
        w.step()  # too early: this step's output gradients come after it ended
        with pytest.warns(RuntimeWarning, match=r"output gradients of step 1 arrived after w.step\(\) ended"):
            loss.backward()
        loss = model(torch.randn(2, 3)).sum()
        w.step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (once: not a warning a step)
            loss.backward()
    assert {e["module"] for e in w.errors} == {"", "0", "1"}
    assert all("call w.step() after loss.backward()" in e["error"] for e in w.errors)


def test_a_patch_of_a_call_the_step_never_made_is_reported_and_removed():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.lin = nn.Tanh(), nn.Linear(3, 3)

        def forward(self, x):
            return self.act(self.lin(self.act(x)))

    model, x = Twice(), torch.randn(2, 3)
    with workbench.watch(model, every=2) as w:  # (the first step is not recorded: patches apply all the same)
        w.patch("act", lambda out: out * 0, call=5)
        patched_nothing = model(x)
        with pytest.warns(RuntimeWarning, match=r"<lambda> at 'act' failed and was removed"):
            w.step()
    assert torch.equal(patched_nothing, model(x))
    assert "the step called 'act' 2 time(s): it has no call 5" in w.errors[0]["error"]
    assert "Patch a call from 0 to 1, or every call (call=None)" in w.errors[0]["error"]
    assert w.interventions == []


def test_an_ablation_out_of_range_of_a_recorded_output_is_refused_at_once():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with workbench.watch(model) as w:
        model(torch.randn(2, 3))
        w.step()  # the site's output (2, 4) is known now
        with pytest.raises(ValueError, match=r"units \[7\] are out of range for dim 1 .* shape \(2, 4\)"):
            w.ablate("0", [7])
        with pytest.raises(ValueError, match=r"dim=2 is out of range .* shape \(2, 4\)"):
            w.ablate("0", 1, dim=2)
        assert w.interventions == []
        w.ablate("0", [3])  # in range: taken
        assert torch.all(model(torch.randn(2, 3))[:, 3] == 0)


# ---------------------------------------------------------------------- live
def test_subscribers_receive_each_recorded_step_in_order():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    got, threads = [], set()

    def callback(update):
        threads.add(threading.get_ident())
        got.extend((r.step, len(r)) for r in update.records)

    with workbench.watch(model, every=2) as w:
        sub = w.subscribe(callback)
        for _ in range(6):
            model(torch.randn(4, 2)).sum().backward()
            w.step(loss=1.0)
        w.recorder.flush()
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6]
    assert [n > 0 for _, n in got] == [True, False, True, False, True, False]  # metrics-only steps
    assert threading.get_ident() not in threads
    sub.unsubscribe()
    assert list(w.metrics().step) == [1, 2, 3, 4, 5, 6]
    assert isinstance(w.to_pandas(), pd.DataFrame)


def test_the_compiled_and_the_torch_reduction_paths_record_the_same_rows():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(16, 4)
    frames = []
    for reducers in (compiled_reducers, torch_reducers):
        model.zero_grad()
        with workbench.watch(model, histograms=True, bins=6, reducers=reducers()) as w:
            model(x).sum().backward()
            w.step()
        frames.append((w.to_pandas(), w.histograms()))
    (rows_a, hist_a), (rows_b, hist_b) = frames
    pd.testing.assert_frame_equal(rows_a, rows_b, rtol=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(hist_a["counts"], hist_b["counts"]))


def test_the_triton_path_records_what_the_compiled_one_does_through_in_place_ops(interpreted_triton):
    """The dynamics network modifies module outputs in place (ReLU(inplace=True), ``x += ...``):
    the GPU path must reduce each output as it was when its module returned. (A fallback to torch's
    kernels would warn, and warnings are errors here.)"""
    model = workbench.create_model("efficientzero_dynamics")
    frames = []
    for reducers in (compiled_reducers, interpreted_triton):
        model.zero_grad()
        with workbench.watch(model, reducers=reducers()) as w:
            probe_step("efficientzero_dynamics", model, w)
        assert not w.errors
        frames.append(w.to_pandas())
    compiled, triton = frames
    pd.testing.assert_frame_equal(compiled, triton, rtol=1e-4, atol=1e-6)


def test_recorded_keys_leave_nothing_for_the_garbage_collector_to_track():
    """Kept keys that stay tracked pile up in the collector's oldest generation and bring full
    collections of the whole process (~0.25 s with torch loaded) every few dozen steps."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    with workbench.watch(model) as w:
        model(torch.randn(4, 2)).sum().backward()
        w.step()
    for _ in range(2):  # the collector stops tracking a tuple of untracked values when it sees one
        gc.collect()
    keys = w.recorder.records()[0].keys
    assert {kind for _, _, kind, _, _ in keys} == {"activation", "grad_output", "param", "param_grad"}
    assert not any(gc.is_tracked(key) or gc.is_tracked(key[4]) for key in keys)


def test_recorded_steps_share_their_keys_and_leave_the_collector_nothing_new_to_count():
    """Each step's keys, made anew and kept, would add hundreds of objects a step to the collector's
    count on a real model: a collection every step or two, a full one every few hundred."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 2)

    def train_step(w=None):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if w is not None:
            w.step()

    def count_growth(w=None):  # tracked objects allocated and still alive, over 5 steps
        train_step(w)
        gc.disable()
        try:
            before = gc.get_count()[0]
            for _ in range(5):
                train_step(w)
            return gc.get_count()[0] - before
        finally:
            gc.enable()

    bare = count_growth()
    with workbench.watch(model) as w:
        watched = count_growth(w)
    first, *later = [record.keys for record in w.recorder.records()]
    assert len(first) == 16 and all(a is b for keys in later for a, b in zip(first, keys))
    assert watched - bare < 5 * 16  # a step's record, its tuple of keys ... not also its 16 keys and their shapes


def test_a_gradient_that_arrives_after_its_step_ended_is_reported_not_misfiled():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh())
    x = torch.randn(4, 2)
    with workbench.watch(model) as w:
        loss = model(x).sum()
        w.step()  # too early: the backward of step 1 runs during step 2
        loss.backward()  # training goes on
        w.step()
        for _ in range(2):  # in the right order again: the output gradients are recorded again
            model(x).sum().backward()
            w.step()
    assert model[0].weight.grad is not None
    late = [e for e in w.errors if e["kind"] == "grad_output"]
    assert {e["module"] for e in late} == {"", "0", "1"} and all("after watch.step()" in e["error"] for e in late)
    assert all(e["step"] == 2 for e in late)
    recorded = rows(w, kind="grad_output")
    assert sorted(set(recorded.step)) == [3, 4] and set(recorded.module) == {"", "0", "1"}


def test_a_loop_that_always_steps_too_early_is_reported_once_per_site():
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh())
    with workbench.watch(model) as w:
        for _ in range(20):
            loss = model(torch.randn(4, 2)).sum()
            w.step()
            loss.backward()
    assert sorted(e["module"] for e in w.errors) == ["", "0", "1"]


def test_gradients_taken_with_autograd_grad_are_recorded():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    with workbench.watch(model) as w:
        out = model(x).square().sum()
        (gw,) = torch.autograd.grad(out, [model[0].weight])  # no .backward(): no parameter gradients
        w.step()
    assert set(rows(w, kind="grad_output").module) == {"", "0", "1", "2"}
    assert len(rows(w, kind="param_grad")) == 0
    # the gradient w.r.t. the last Linear's output, by hand: d/dy sum(y^2) = 2y
    y = model(x).detach()
    got = rows(w, module="2", kind="grad_output").iloc[0]
    assert got["norm"] == pytest.approx((2 * y).norm().item(), rel=1e-5)


# ---------------------------------------------------------------- threads
def test_watches_on_several_threads_are_independent():
    """The app's sessions are threads: watches started, stepped and closed on several threads at
    once each record their own model exactly as alone (torch's process-wide hooks fire for every
    thread's modules, also while another watch is being set up)."""

    def make(seed):  # on the main thread: the global RNG is shared by every thread
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))

    models = {seed: make(seed) for seed in range(4)}

    def session(seed, barrier=None):
        model = copy.deepcopy(models[seed])
        x = torch.randn(32, 6, generator=torch.Generator().manual_seed(seed))
        if barrier is not None:
            barrier.wait()
        frames = []
        for _ in range(3):  # a new watch every few steps: set-ups overlap other threads' steps
            with workbench.watch(model) as w:
                for _ in range(4):
                    model(x).square().mean().backward()
                    w.step()
            assert not w.errors, w.errors
            frames.append(w.to_pandas())
        return pd.concat(frames, ignore_index=True)

    alone = {seed: session(seed) for seed in range(4)}
    # a watch of a large model takes a while to set up: other threads' models run meanwhile
    large = nn.Sequential(*[nn.Linear(2, 2) for _ in range(1000)])
    for _ in range(3):
        barrier = threading.Barrier(2)
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault(0, session(0, barrier)))
        thread.start()
        barrier.wait()
        while thread.is_alive():
            workbench.watch(large).close()
        thread.join()
        pd.testing.assert_frame_equal(result[0], alone[0])
    for _ in range(5):
        for seed, frame in at_once(session, range(4)).items():
            pd.testing.assert_frame_equal(frame, alone[seed])
    assert installed_hooks()["_global_forward_hooks"] == 0


def test_an_output_nested_too_deep_is_an_error_not_silence():
    class Deep(nn.Module):
        def forward(self, x):
            out = x * 2
            for _ in range(40):
                out = [out]
            return out

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.deep = nn.Linear(2, 2), Deep()

        def forward(self, x):
            return self.deep(self.lin(x))

    model = Model()
    with workbench.watch(model) as w:
        model(torch.randn(3, 2))
        w.step()
    assert {(e["module"], e["kind"]) for e in w.errors} >= {("deep", "activation")}
    assert all("nested deeper than 32 levels" in e["error"] for e in w.errors)
    assert set(rows(w, kind="activation").module) == {"lin"}  # the rest is recorded


def test_a_step_interrupted_in_the_middle_of_its_forward_leaves_no_partial_step():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(5, 3)

    def interrupt(module, args, output):
        raise KeyboardInterrupt

    with workbench.watch(model) as w:
        model(x).sum().backward()
        w.step()
        handle = model[1].register_forward_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            model(x)  # rows of '0' and '1' were taken before the interrupt
        handle.remove()
        w.discard_step()
        model(x).sum().backward()
        w.step()
    first, second = (rows(w, step=s) for s in (1, 2))
    assert len(first) == len(second)  # not the interrupted forward's rows too
    assert second.call.max() == 0  # no call counted twice


class SkipsOnce(nn.Module):
    """A model whose forward raises after its first layer when ``fail`` is set (an out-of-memory
    batch, say), and whose shared activation keeps the call stack."""

    def __init__(self):
        super().__init__()
        self.act = nn.Tanh()
        self.a, self.b = nn.Sequential(nn.Linear(3, 4), self.act), nn.Sequential(nn.Linear(4, 2), self.act)
        self.fail = False

    def forward(self, x):
        x = self.a(x)
        if self.fail:
            raise RuntimeError("out of memory (simulated)")
        return self.b(x)


def test_a_forward_that_raises_and_is_skipped_leaves_no_rows_and_no_calls_in_its_step():
    torch.manual_seed(0)
    model = SkipsOnce()
    reference = copy.deepcopy(model)
    batches = [torch.randn(5, 3) for _ in range(3)]
    with workbench.watch(model) as w, workbench.watch(reference) as ref:
        for step, x in enumerate(batches):
            model.fail = step == 1
            try:
                model(-x if model.fail else x).sum().backward()
            except RuntimeError:  # the batch is skipped, without w.discard_step(): the loop goes on
                model.fail = False
                model(x).sum().backward()
            w.step()
            reference(x).sum().backward()  # the same steps, none failing
            ref.step()
    got, expected = w.to_pandas(), ref.to_pandas()
    assert set(got.module) >= {"a.1", "b.1"}  # (the shared Tanh, named by its caller)
    assert got.call.max() == 0  # the failed forward's calls are not counted
    pd.testing.assert_frame_equal(got, expected)


@pytest.mark.parametrize("then", ["forward", "step"])
def test_a_forward_interrupted_leaves_no_rows_once_the_next_forward_starts_or_the_step_ends(then):
    # (a KeyboardInterrupt runs no hook: found when the next forward of the model starts, or w.step())
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 1)))
    x = torch.randn(5, 3)

    def interrupt(module, args, output):
        raise KeyboardInterrupt

    with workbench.watch(model) as w:
        model(x).sum().backward()
        w.step()
        model.zero_grad()
        handle = model[1][1].register_forward_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            model(x)  # rows of '0', '1.0' and '1.1' were taken before the interrupt
        handle.remove()
        if then == "forward":  # the cell run again, without w.discard_step()
            model(x).sum().backward()
        w.step()
    first, second = (rows(w, step=s) for s in (1, 2))
    if then == "forward":
        pd.testing.assert_frame_equal(second.drop(columns="step").reset_index(drop=True),
                                      first.drop(columns="step").reset_index(drop=True))
    else:  # the step's parameters alone
        assert set(second.kind) == {"param"}


class InterruptedOnce(TorchReducer):
    """A reducer whose statistics, read as ``w.step()`` ends step ``at``, are interrupted once (a Ctrl-C while
    the step's one host transfer waits for the device)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.reads = at, 0

    def collect(self):
        self.reads += 1
        if self.reads == self.at:
            raise KeyboardInterrupt
        return super().collect()


@pytest.mark.parametrize("then", ["step", "forward"])
def test_a_step_interrupted_in_w_step_and_ended_again_records_its_parameters_once(then):
    # (w.step() interrupted after it had taken the step's parameter rows took them again when called again: the
    # step had each parameter and its gradient twice, with the same key)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    reference = copy.deepcopy(model)
    x = torch.randn(5, 3)
    with workbench.watch(model, reducers=[InterruptedOnce(at=2)], updates=True) as w:
        for step in (1, 2, 3):
            model(x).sum().backward()
            try:
                w.step()
            except KeyboardInterrupt:  # (the cell run again: its step ended again, or its loop started again)
                if then == "forward":
                    model(x).sum().backward()
                w.step()
            model.zero_grad()
    with workbench.watch(reference, reducers=["torch"], updates=True) as ref:
        for step in (1, 2, 3):
            reference(x).sum().backward()
            if step == 2 and then == "forward":
                reference(x).sum().backward()
            ref.step()
            reference.zero_grad()
    got, expected = w.to_pandas(), ref.to_pandas()
    assert not got.duplicated(["step", "module", "call", "kind", "tensor"]).any()
    pd.testing.assert_frame_equal(got, expected)


class InterruptedAfterPublishing(workbench.Recorder):
    """A recorder whose publisher is interrupted once, as it publishes step ``at``: after the record is handed to
    it all (``after``), or part-way, in its warning that it is full, before the subscribers are offered it
    (``while``: its budget, ``max_rows``, holds the first step alone)."""

    def __init__(self, at: int, moment: str) -> None:
        super().__init__(max_rows=1 if moment == "while" else 500_000)
        self.at, self.moment, self.interrupted = at, moment, False

    def publish(self, record):
        interrupt = record.step == self.at and not self.interrupted
        self.interrupted = self.interrupted or interrupt
        if interrupt and self.moment == "while":
            def showwarning(*args, **kwargs):
                raise KeyboardInterrupt
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = showwarning
                super().publish(record)
        super().publish(record)
        if interrupt:
            raise KeyboardInterrupt


@pytest.mark.parametrize("moment", ["after", "while"])
def test_a_step_interrupted_as_it_is_published_and_ended_again_is_published_once(tmp_path, moment):
    # (w.step() interrupted once its record was published, before the step number moved on: called again, it
    # published the step again, and the run store, failing on the duplicate step, closed the run failed)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    reference = copy.deepcopy(model)
    x = torch.randn(5, 3)
    recorder = InterruptedAfterPublishing(at=2, moment=moment)
    with workbench.watch(model, store=tmp_path / "run", recorder=recorder) as w:
        for step in (1, 2, 3):
            model(x).sum().backward()
            try:
                w.step(loss=float(step))
            except KeyboardInterrupt:  # (the cell run again)
                w.step(loss=float(step))
            model.zero_grad()
    with workbench.watch(reference, reducers=["torch"]) as ref:
        for step in (1, 2, 3):
            reference(x).sum().backward()
            ref.step(loss=float(step))
            reference.zero_grad()
    assert recorder.interrupted and w.errors == [] and w.step_index == 4
    stored = workbench.load_run(tmp_path / "run")
    assert stored.status == "finished"
    assert stored.metrics().loss.tolist() == [1.0, 2.0, 3.0]
    got, expected = stored.to_pandas(), ref.to_pandas()
    assert not got.duplicated(["step", "module", "call", "kind", "tensor"]).any()
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    # (each step kept once in the recorder's memory: one step held, steps 1 and 2 evicted, once each)
    assert recorder.evicted == (2 if moment == "while" else 0)
    assert [record.step for record in recorder.records()] == ([3] if moment == "while" else [1, 2, 3])


def interrupted_then_back_propagated(model: nn.Module, interrupted: nn.Module, x: torch.Tensor):
    """(the watch, a reference watch): a forward of ``model`` whose loss is back-propagated only after a
    second forward, interrupted at ``interrupted``, beside one forward and backward of a copy of it."""
    reference = copy.deepcopy(model)

    def interrupt(module, args, output):
        raise KeyboardInterrupt

    with workbench.watch(model) as w:
        loss = model(x).sum()
        handle = interrupted.register_forward_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            model(x)
        handle.remove()
        loss.backward()
        w.step()
    with workbench.watch(reference) as ref:
        reference(x).sum().backward()
        ref.step()
    return w, ref


def test_the_rows_of_an_earlier_forward_that_arrive_after_one_interrupted_stay():
    # (its output gradients, from the loss back-propagated once the second forward was interrupted,
    # arrive after that forward's first rows: taken back with them, they were lost)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    w, ref = interrupted_then_back_propagated(model, model[2], torch.randn(5, 3))
    pd.testing.assert_frame_equal(w.to_pandas(), ref.to_pandas())


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_a_checkpointed_segment_of_an_earlier_forward_back_propagated_after_one_interrupted_keeps_its_rows(
        use_reentrant):
    # (the recomputation named its call by the calls of the step, the interrupted forward's among them: the
    # segment's site called "twice", its output gradient was left out, with no error, under reentrant checkpointing)
    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.act, self.last = nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(torch.utils.checkpoint.checkpoint(self.act, self.first(x), use_reentrant=use_reentrant))

    torch.manual_seed(0)
    model = Checkpointed()
    w, ref = interrupted_then_back_propagated(model, model.last, torch.randn(5, 3, requires_grad=True))
    pd.testing.assert_frame_equal(w.to_pandas(), ref.to_pandas())
    assert not w.errors


def test_a_model_that_calls_itself_keeps_the_rows_of_each_call():
    # (a forward of the model starting inside another is nested, not the next after one interrupted)
    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            if len(x) > 2:
                return torch.cat([self(x[: len(x) // 2]), self(x[len(x) // 2:])])
            return self.fc(x)

    model = Halves()
    with workbench.watch(model, gradients=False, parameters=False, parameter_grads=False) as w:
        model(torch.randn(4, 3))
        w.step()
    frame = w.to_pandas()
    assert sorted(zip(frame.module, frame.call)) == [("", 0), ("", 1), ("", 2), ("fc", 0), ("fc", 1)]


def test_a_forward_that_raises_takes_back_the_gradient_rows_of_a_tensor_it_returns_again():
    # learned queries returned as they are: the retried forward returns the same tensor, whose
    # gradient site the failed forward had named (queries, call 0) already
    class Queries(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Parameter(torch.randn(2, 3))

        def forward(self, x):
            return self.q

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.queries, self.fc = Queries(), nn.Linear(3, 3)
            self.fail = False

        def forward(self, x):
            q = self.queries(x)
            if self.fail:
                raise RuntimeError("out of memory (simulated)")
            return self.fc(q + x)

    torch.manual_seed(0)
    model = Model()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3)
    with workbench.watch(model, parameters=False, parameter_grads=False) as w, \
            workbench.watch(reference, parameters=False, parameter_grads=False) as ref:
        model.fail = True
        try:
            model(x)
        except RuntimeError:  # retried
            model.fail = False
            model(x).sum().backward()
        w.step()
        reference(x).sum().backward()
        ref.step()
    got = w.to_pandas()
    assert not got.duplicated(["module", "call", "kind", "tensor"]).any()
    pd.testing.assert_frame_equal(got, ref.to_pandas())


def test_forwards_of_the_model_on_two_threads_at_once_keep_their_rows():
    # (a forward starting while another thread's runs is not the next after one interrupted)
    inside, go = threading.Event(), threading.Event()

    class Waits(nn.Module):
        def forward(self, x):
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                go.wait(timeout=60)
            return x * 2

    model = nn.Sequential(nn.Linear(3, 3), Waits(), nn.Linear(3, 3))
    with workbench.watch(model, gradients=False, parameters=False, parameter_grads=False) as w:
        thread = threading.Thread(target=model, args=(torch.randn(2, 3),))
        thread.start()
        inside.wait(timeout=60)
        model(torch.randn(2, 3))  # while the other thread's forward waits in '1'
        go.set()
        thread.join()
        model(torch.randn(2, 3))  # a third forward, on this thread: nothing of the others' taken back
        w.step()
    frame = w.to_pandas()
    assert sorted(zip(frame.module, frame.call)) == [(path, call) for path in ["", "0", "1", "2"] for call in range(3)]


def test_a_parameter_returned_as_an_output_has_its_gradient_recorded_each_step_without_hooks_piling_up():
    # (each recorded step put a tensor hook on the parameter for good: from step 2 the last step's fired
    # too, said "the gradients of step 1 arrived after w.step()", and the hooks piled up)
    class Queries(nn.Module):
        def __init__(self):
            super().__init__()
            self.queries = nn.Parameter(torch.randn(3, 4))

        def forward(self):
            return self.queries

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.fc = Queries(), nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x * self.q())

    torch.manual_seed(0)
    model = Model()
    grads = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning of late gradients)
        with workbench.watch(model, histograms=False) as w:
            for _ in range(3):
                model.zero_grad()
                model(torch.randn(3, 4)).pow(2).sum().backward()
                grads.append(model.q.queries.grad.clone())  # (the gradient w.r.t. the output, used once)
                w.step()
                assert len(model.q.queries._backward_hooks or {}) == 1
    assert not model.q.queries._backward_hooks and w.errors == []
    got = rows(w, module="q", kind="grad_output")
    assert list(got.step) == [1, 2, 3]
    np.testing.assert_allclose(got["mean"], [g.mean().item() for g in grads], rtol=1e-5)
    np.testing.assert_allclose(got["norm"], [g.norm().item() for g in grads], rtol=1e-5)


def test_a_call_that_raises_inside_the_forward_is_not_counted():
    class Retries(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.softmax = nn.Linear(3, 3), nn.Softmax(-1)

        def forward(self, x):
            x = self.fc(x)
            try:
                return self.softmax(x.to(torch.int64))  # softmax raises on integers ...
            except RuntimeError:
                return self.softmax(x)  # ... and is called again: its call 0

    model = Retries()
    with workbench.watch(model) as w:
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            w.step()
    frame = w.to_pandas()
    assert sorted(set(frame.module)) == ["", "fc", "softmax"]
    assert frame.call.max() == 0  # the call that raised is no call
    assert w.errors == []


def test_an_experiment_step_that_raises_records_nothing_of_it():
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    w = exp.watch()
    exp.step()
    train_step = exp.train_step

    def broken():
        exp.model(torch.randn(8, 2))  # a forward ...
        raise KeyboardInterrupt  # ... then the user interrupts

    exp.train_step = broken
    with pytest.raises(KeyboardInterrupt):
        exp.step()
    exp.train_step = train_step
    exp.step()
    w.close()
    frame = w.to_pandas()
    assert sorted(set(frame.step)) == [1, 2] and exp.step_count == 2
    assert (frame.groupby("step").size().to_numpy() == len(frame[frame.step == 1])).all()


def test_a_subscriber_has_every_step_once_the_watch_is_closed():
    model = nn.Linear(2, 2)
    received = []

    def slow(update):  # (slower than the steps: records queue up behind it)
        time.sleep(0.05)
        received.extend(record.step for record in update.records)

    with workbench.watch(model) as w:
        w.subscribe(slow)
        for _ in range(5):
            model(torch.randn(3, 2)).sum().backward()
            w.step()
    assert received == [1, 2, 3, 4, 5]


KEY = ["step", "module", "call", "kind", "tensor"]
STATS = ["mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count"]


def _two_losses(passes, steps=2, **options):
    """Rows of a watch over ``steps`` steps of one forward and its two losses, back-propagated as
    ``passes`` says: "sum" ((l1 + l2).backward()), "retain" (l1 with retain_graph=True, then l2),
    "both retain" (retain_graph=True on both), "grad first" (torch.autograd.grad of l1, keeping the
    graph, then l2.backward()); and the parameter gradients of the last step."""
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.randn(5, 4)
    with workbench.watch(net, **options) as w:
        for _ in range(steps):
            net.zero_grad()
            out = net(x)
            first, second = out[:, 0].pow(2).mean(), out[:, 1].abs().mean()
            if passes == "sum":
                (first + second).backward()
            elif passes == "grad first":
                torch.autograd.grad(first, net[0].weight, retain_graph=True)
                second.backward()
            else:
                first.backward(retain_graph=True)
                second.backward(retain_graph=passes == "both retain")
            w.step()
    return w, w.to_pandas().set_index(KEY).sort_index(), [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("passes", ["retain", "both retain"])
def test_several_backward_passes_through_one_forward_record_one_row_of_their_total_gradient(passes):
    # as a parameter's .grad holds the sum of the passes' gradients, each output gradient row is of
    # the sum: the row back-propagating loss1 + loss2 once records, one per (step, site, call, kind)
    w, got, grads = _two_losses(passes)
    sums, want, want_grads = _two_losses("sum")
    want_histograms = sums.histograms().set_index(KEY).sort_index()
    assert got.index.is_unique and not w.errors
    assert got.index.equals(want.index) and len(got.xs("grad_output", level="kind")) == 2 * 4  # 2 steps, 4 sites
    pd.testing.assert_frame_equal(got[STATS], want[STATS], rtol=1e-6)
    assert all(torch.allclose(a, b) for a, b in zip(grads, want_grads))
    counts = [frame.xs("grad_output", level="kind").counts for frame in (w.histograms().set_index(KEY).sort_index(),
                                                                          want_histograms)]
    assert [c.tolist() for c in counts[0]] == [c.tolist() for c in counts[1]]


def test_a_single_backward_that_keeps_the_graph_records_the_rows_of_a_plain_one():
    # (held until the step ends, in case another pass comes)
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.randn(5, 4)
    frames = []
    for retain in (True, False):
        net.zero_grad()
        with workbench.watch(net) as w:
            net(x).sum().backward(retain_graph=retain)
            w.step()
        frames.append(w.to_pandas().set_index(KEY).sort_index())
    assert frames[0].index.is_unique and len(frames[0].xs("grad_output", level="kind")) == 4
    pd.testing.assert_frame_equal(frames[0][STATS], frames[1][STATS])


def test_a_graph_gradient_taken_before_the_backward_adds_to_the_rows_as_a_pass():
    # torch.autograd.grad through the forward is a backward pass too: its gradient adds to the total
    # (which the parameters' .grad do not hold: torch.autograd.grad leaves them alone)
    _, got, _ = _two_losses("grad first")
    _, want, _ = _two_losses("sum")
    assert got.index.is_unique and got.index.equals(want.index)
    pd.testing.assert_frame_equal(got[STATS].xs("grad_output", level="kind"),
                                  want[STATS].xs("grad_output", level="kind"), rtol=1e-6)


class _Shift(nn.Module):
    """x + bias: its AddBackward saves no tensor, so a second backward runs without retain_graph."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return x + self.bias


def test_a_second_pass_after_one_that_freed_the_graph_leaves_the_row_out_with_an_error():
    # a graph whose nodes save no tensor runs a second backward without retain_graph: the first
    # pass's gradient is gone by then, so the total cannot be taken; the row is left out, not kept
    # as one pass's gradient
    model = _Shift()
    with pytest.warns(RuntimeWarning, match=r"output gradients of 1 call site\(s\) \(\(model\)\) came from several "
                                            r"backward passes .* freed the graph .* left out of step 1"):
        with workbench.watch(model) as w:
            for _ in range(2):
                model.zero_grad()
                out = model(torch.randn(4, 3))
                out.sum().backward()
                out.sum().backward()
                w.step()
    frame = w.to_pandas()
    assert set(frame.kind) == {"activation", "param", "param_grad"}  # (no grad_output row)
    assert [e["step"] for e in w.errors] == [1, 2] and all("freed the graph" in e["error"] for e in w.errors)
    assert frame[frame.kind == "param_grad"]["mean"].tolist() == [8.0, 8.0]  # the parameters' as before


def test_a_gradient_held_for_another_pass_is_let_go_when_the_step_is_discarded_or_the_watch_closed():
    # a backward that keeps the graph holds its output gradients for the next pass: a discarded step or
    # a closed watch lets them go while the user's graph lives on
    net, x = nn.Linear(3, 2), torch.randn(4, 3)
    for end in ("discard", "close"):
        w = workbench.watch(net)
        out = net(x)
        grads = []
        out.register_hook(lambda grad: grads.append(weakref.ref(grad)))
        out.sum().backward(retain_graph=True)
        w.discard_step() if end == "discard" else w.close()
        gc.collect()
        assert grads[0]() is None, end
        w.close()


def test_gradients_held_for_another_pass_are_recorded_at_once_past_the_limit_if_w_step_is_forgotten(monkeypatch):
    # a loop that keeps the graph on every backward and never calls w.step() would hold a gradient per
    # site and pass: after MAX_HELD_PASSES such passes they are recorded at once and let go, with a warning
    monkeypatch.setattr(hooks, "MAX_HELD_PASSES", 4)
    net, x = nn.Linear(3, 2), torch.randn(4, 3)
    grads = []
    with pytest.warns(RuntimeWarning, match=r"4 backward passes keeping the graph .* left 4 output gradients .* recorded now"):
        with workbench.watch(net) as w:
            for _ in range(6):
                out = net(x)
                out.register_hook(lambda grad: grads.append(weakref.ref(grad)))
                out.sum().backward(retain_graph=True)
            gc.collect()
            assert [grad() is None for grad in grads] == [True] * 4 + [False] * 2  # (the last two still held)
            w.step()
    rows = w.to_pandas()
    assert sorted(rows[rows.kind == "grad_output"].call) == [0, 1, 2, 3, 4, 5] and not w.errors


def test_the_sites_left_out_of_a_step_are_named_as_the_views_name_them():
    # a module called twice is shift#0 and shift#1 in the views: the error names its first call so too
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.shift = _Shift()

        def forward(self, x):
            return self.shift(self.shift(x))

    model = Twice()
    with pytest.warns(RuntimeWarning, match="freed the graph"):
        with workbench.watch(model) as w:
            out = model(torch.randn(4, 3))
            out.sum().backward()
            out.sum().backward()
            w.step()
    assert "((model), shift#0, shift#1)" in w.errors[0]["error"]


def test_a_sink_failure_is_warned_of_with_what_the_sink_says_becomes_of_its_output():
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with workbench.watch(model) as w:
        with pytest.warns(RuntimeWarning) as plain:
            w.report_failure("dashboard", "the dashboard could not be reached")
        with pytest.warns(RuntimeWarning) as told:
            w.report_failure("csv", "rows.csv could not be written", outcome="rows.csv lacks this step")
        with pytest.raises(TypeError, match="outcome must be a str or None, got 3"):
            w.report_failure("csv", "rows.csv could not be written", outcome=3)
    assert [str(m.message) for m in plain] == [
        "workbench: the dashboard could not be reached; the watch keeps it in w.errors and marks nothing failed "
        "(what becomes of the 'dashboard' sink's output is the sink's to say). Training goes on."]
    assert [str(m.message) for m in told] == [
        "workbench: rows.csv could not be written; rows.csv lacks this step. Training goes on."]
    assert [(e["kind"], e["error"]) for e in w.errors] == [("dashboard", "the dashboard could not be reached"),
                                                          ("csv", "rows.csv could not be written")]


def test_a_sink_whose_close_raises_fails_the_run_in_the_watch_and_its_store_alike(tmp_path):
    """w.status read 'finished' (the store too, closed first) while a run's thread read the raised error as
    failed: now every sink is closed, the store last, and all say failed, naming the sink's error."""

    class BrokenSink:
        def close(self, status, error=None):
            raise OSError("disk gone")

    net = torch.nn.Linear(2, 2)
    w = workbench.watch(net, store=tmp_path / "r")
    w.add_sink(BrokenSink())
    net(torch.ones(1, 2))
    w.step()
    with pytest.raises(OSError, match="disk gone"):
        w.close()
    said = "closing the sink BrokenSink failed: OSError: disk gone"
    assert (w.status, w.error) == ("failed", said)
    stored = workbench.load_run(tmp_path / "r").metadata
    assert (stored["status"], stored["error"]) == ("failed", said)


@pytest.mark.parametrize("raised", [RuntimeError("hook dict gone"), KeyboardInterrupt()])
def test_a_close_whose_hooks_cannot_be_taken_out_still_closes_every_sink_and_the_store_last(tmp_path, monkeypatch,
                                                                                           raised):
    """Taking the hooks out raised before any sink was closed: the store stayed open, its run locked and 'running'
    until the process ended (then 'interrupted'), the other sinks never told. Now every sink is closed, the store
    last; an error fails the run, naming it, and is raised once all are closed (an interrupt: raised, the run
    closed as asked)."""
    closed = []

    class Sink:
        def close(self, status, error=None):
            closed.append((status, error, w.store.closed))

    net = torch.nn.Linear(2, 2)
    w = workbench.watch(net, store=tmp_path / "r")
    w.add_sink(Sink())
    net(torch.ones(1, 2))
    w.step()

    def broken_close(self):
        raise raised

    monkeypatch.setattr(hooks.Hooks, "close", broken_close)
    with pytest.raises(type(raised)):
        w.close("stopped", "the user stopped it")
    monkeypatch.undo()
    if isinstance(raised, KeyboardInterrupt):
        status, error = "stopped", "the user stopped it"
    else:
        said = "taking the watch's hooks out failed: RuntimeError: hook dict gone"
        status, error = "failed", f"the user stopped it\n{said}"
    assert closed == [(status, error, False)]  # (the store closed after it)
    assert w.store.closed and (w.status, w.error) == (status, error)
    stored = workbench.load_run(tmp_path / "r").metadata
    assert (stored["status"], stored["error"]) == (status, error)
    w._hooks.close()  # (what the broken close left in)


class HeldUnderTwoNames(nn.Module):
    """One caller holds one block under two names, ``a`` and ``b``: which one a call goes through cannot be told."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.b = self.a

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("modules, named", [("*", "a"), ("b", "b"), ("b.*", "b"), ("a.0", "a")])
def test_a_module_held_under_two_names_is_recorded_under_the_one_selected(modules, named):
    # (its calls were named by the first name, `a`, whatever the selection: modules="b" or "b.*" recorded no
    # activation nor output gradient, unsaid)
    model = HeldUnderTwoNames()
    with workbench.watch(model, modules=modules) as w:
        model(torch.randn(2, 4)).sum().backward()
        w.step()
    rows = w.to_pandas()
    rows = rows[rows.module != ""]
    activations = rows[rows.kind == "activation"]
    assert set(activations.module.str.split(".").str[0]) == {named}
    assert set(rows[rows.kind == "grad_output"].module) == set(activations.module)
    # (two calls of each site it records, under one name)
    assert activations.groupby("module").call.apply(list).tolist() == [[0, 1]] * activations.module.nunique()


def test_an_interrupt_in_a_sink_s_close_still_closes_the_store_after_it(tmp_path):
    """A KeyboardInterrupt in a sink's close() (a Ctrl-C as a close waits) left the store open, its run locked and
    'running' for the rest of the process, and a second close() did nothing. Now the sinks after it are closed, the
    store last, as asked, and the interrupt is raised then."""
    from workbench.instrument.store import lock_held

    closed = []

    class Interrupted:
        def close(self, status, error=None):
            closed.append("interrupted")
            raise KeyboardInterrupt

    class After:
        def close(self, status, error=None):
            closed.append((status, w.store.closed))

    net = torch.nn.Linear(2, 2)
    w = workbench.watch(net, store=tmp_path / "r")
    w.add_sink(Interrupted())
    w.add_sink(After())
    net(torch.ones(1, 2))
    w.step()
    with pytest.raises(KeyboardInterrupt):
        w.close("stopped", "the user stopped it")
    assert closed == ["interrupted", ("stopped", False)]  # (the store closed after them)
    assert w.store.closed and not lock_held(tmp_path / "r", unreadable=False)
    assert (w.status, w.error) == ("stopped", "the user stopped it")
    run = workbench.load_run(tmp_path / "r")
    assert (run.status, run.metadata["error"], run.steps) == ("stopped", "the user stopped it", [1])
