"""The torch behaviours :mod:`workbench.instrument.torch_internals` relies on, one test per function:
each fails if a torch release changes what the function's docstring says it relies on.

Compiling is by dynamo with a counting backend (no inductor): what is checked is what dynamo
traces, skips and calls, not the kernels.
"""

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.testing import CompileCounter

from workbench.instrument import torch_internals as internals


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def double(x):
    return x * 2


class Tiny(nn.Module):
    """A model of our own (dynamo compiles its forward; torch's own modules' code it may skip)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x))


def test_run_eagerly_is_called_as_it_is_in_a_graph_break_and_never_compiled():
    calls = []

    def hook(x):
        calls.append(x.shape)
        return x * 2

    internals.run_eagerly(hook)
    counter = CompileCounter()
    out = torch.compile(lambda x: hook(x.sin()).cos(), backend=counter)(torch.ones(3))
    torch.testing.assert_close(out, (torch.ones(3).sin() * 2).cos())
    assert calls == [(3,)]  # ran, as Python
    assert (counter.frame_count, counter.op_count) == (2, 2)  # a break at the hook: sin | cos, its mul not traced
    counter = CompileCounter()
    torch.compile(hook, backend=counter)(torch.ones(3))  # a frame of its own: skipped
    assert counter.frame_count == 0 and len(calls) == 2


def test_inline_only_is_traced_where_a_traced_frame_calls_it_and_skipped_as_a_frame_of_its_own():
    hook = internals.inline_only(lambda x: x + 1)
    counter = CompileCounter()
    out = torch.compile(lambda x: hook(x.sin()).cos(), backend=counter)(torch.ones(3))
    torch.testing.assert_close(out, (torch.ones(3).sin() + 1).cos())
    assert (counter.frame_count, counter.op_count) == (1, 3)  # one graph: sin, add, cos
    counter = CompileCounter()
    torch.compile(hook, backend=counter)(torch.ones(3))
    assert counter.frame_count == 0


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_register_module_hooks_run_for_every_module_call_before_the_modules_own(traced):
    model = Tiny()
    x = torch.randn(3, 2)
    expected = 2 * torch.tanh(model.fc(x))
    seen = []
    model.act.register_forward_hook(lambda module, args, out: seen.append("own"))

    def post(module, args, out):
        seen.append(type(module).__name__)
        return out * 2 if isinstance(module, nn.Tanh) else None

    before = internals.installed_hooks()
    handles = internals.register_module_hooks(post, lambda module, args: None, traced=traced)
    try:
        out = model(x)
        torch.testing.assert_close(out, expected)  # the hook's return replaces the output
        assert seen == ["Linear", "Tanh", "own", "Tiny"]
        assert internals.installed_hooks()["_global_forward_pre_hooks"] == before["_global_forward_pre_hooks"] + 1
        # under torch.compile: eager hooks run as they are, in graph breaks (their mul is in no
        # graph); traced ones are in the model's one graph (linear, tanh, mul)
        counter = CompileCounter()
        seen.clear()
        torch.testing.assert_close(torch.compile(model, backend=counter)(x), out)
        assert seen[:4] == ["Linear", "Tanh", "own", "Tiny"]
        if traced:
            assert (counter.frame_count, counter.op_count) == (1, 3)
        else:
            assert counter.op_count < 3
    finally:
        for handle in handles:
            handle.remove()
    assert internals.installed_hooks() == before


def test_call_raised_tells_a_call_that_raised_from_one_that_returned():
    class Raises(nn.Module):
        def forward(self, x):
            raise ValueError("in forward")

    model = nn.Sequential(nn.Linear(2, 2), Raises())
    seen = []
    handles = internals.register_module_hooks(
        lambda module, args, out: seen.append((type(module).__name__, internals.call_raised(module))),
        always_call=True)
    try:
        with pytest.raises(ValueError, match="in forward"):
            model(torch.ones(1, 2))
        assert seen == [("Linear", False), ("Raises", True), ("Sequential", True)]
        seen.clear()
        try:
            raise KeyError("handled")
        except KeyError:  # a call that returns while another exception is handled
            model[0](torch.ones(1, 2))
        assert seen == [("Linear", False)]
    finally:
        for handle in handles:
            handle.remove()


def test_calls_running_counts_the_calls_of_a_module_on_the_stack():
    counts = []

    class Nested(nn.Module):
        def forward(self, x, depth=0):
            counts.append(internals.calls_running(self))
            return self(x, depth + 1) if depth < 2 else x

    model = Nested()
    model(torch.ones(1))
    assert counts == [1, 2, 3] and internals.calls_running(model) == 0


def test_hook_switch_takes_hooks_out_and_puts_them_back_in_their_place():
    module = nn.Identity()
    order = []

    def hook(name):
        return lambda m, args, out: order.append(name)

    module.register_forward_hook(hook("user before"))
    ours = module.register_forward_hook(hook("ours"))
    module.register_forward_hook(hook("user after"))
    switch = internals.HookSwitch([ours])
    switch.set(False)
    module(torch.ones(1))
    assert order == ["user before", "user after"]
    module.register_forward_hook(hook("registered while out"))
    switch.set(True)
    order.clear()
    module(torch.ones(1))
    assert order == ["user before", "ours", "user after", "registered while out"]
    ours.remove()  # the handle still removes it
    order.clear()
    module(torch.ones(1))
    assert "ours" not in order

    # a hook called also when the call raises: its flag goes out and back in with it
    before = internals.installed_hooks()
    handles = internals.register_module_hooks(hook("always"), always_call=True)
    switch = internals.HookSwitch(handles)
    switch.set(False)
    assert internals.installed_hooks() == before
    switch.set(True)
    order.clear()
    with pytest.raises(TypeError):
        module(torch.ones(1), torch.ones(1))  # (Identity takes one input: its forward raises)
    assert order == ["always"]
    handles[0].remove()
    assert internals.installed_hooks() == before


def test_a_param_grad_hook_and_the_hook_dict_restored_to_none():
    param, other = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    other.register_post_accumulate_grad_hook(lambda p: None)  # a dict of its own already
    assert param._post_accumulate_grad_hooks is None
    fresh, got = [], []
    handle = internals.register_param_grad_hook(param, lambda p: got.append(p.grad.clone()), fresh)
    internals.register_param_grad_hook(other, lambda p: None, fresh).remove()
    assert fresh == [param]
    (param * 3).sum().backward()
    assert len(got) == 1 and got[0].tolist() == [3.0, 3.0]
    handle.remove()
    internals.restore_param_hook_dicts(fresh)
    assert param._post_accumulate_grad_hooks is None and other._post_accumulate_grad_hooks is not None
    (param * 3).sum().backward()  # torch reads None as no hooks
    assert len(got) == 1 and param.grad.tolist() == [6.0, 6.0]


def test_queue_end_of_backward_runs_once_every_gradient_is_accumulated():
    assert internals.queue_end_of_backward(lambda: None) is False  # outside a backward
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    at_end, queued = [], []
    y = a * 2

    def on_gradient(grad):  # y's gradient: a's is still to come
        assert a.grad is None
        queued.append(internals.queue_end_of_backward(lambda: at_end.append(a.grad.clone())))

    y.register_hook(on_gradient)
    (y * b).sum().backward()
    assert queued == [True] and len(at_end) == 1
    torch.testing.assert_close(at_end[0], torch.full((2,), 2.0))


def test_in_backward_is_true_only_inside_a_backward():
    assert internals.in_backward() is False
    x = torch.ones(2, requires_grad=True)
    inside = []
    y = x * 2
    y.register_hook(lambda grad: inside.append(internals.in_backward()))
    y.sum().backward()
    assert inside == [True] and internals.in_backward() is False


def test_keeps_graph_tells_a_backward_that_retains_its_graph_from_one_that_frees_it():
    x = torch.ones(2, requires_grad=True)
    seen = []
    y = x * 2
    y.register_hook(lambda grad: seen.append(internals.keeps_graph()))
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    z = x.sin()
    z.register_hook(lambda grad: seen.append(internals.keeps_graph()))
    torch.autograd.grad(z.sum(), x, create_graph=True)
    assert seen == [True, False, True] and internals.keeps_graph() is True


class Received(internals.GradientHook):
    __slots__ = ("grads",)

    def __init__(self):
        self.grads = []

    def on_gradient(self, grad):
        self.grads.append(grad.clone())


VIEWS = {"flat": lambda t: t.view(-1), "transposed": lambda t: t.t(), "columns": lambda t: t[:, 1:],
         "strided": lambda t: t[::2, ::2], "row": lambda t: t[1]}


@pytest.mark.parametrize("case", ["output", "modified in place", *[f"view modified in place: {v}" for v in VIEWS],
                                  "leaf"])
def test_gradient_hook_receives_the_gradient_of_the_value_returned(case):
    x = torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(3, 4)
    received = Received()
    if case == "leaf":
        received.attach(x)
        (x * weight).sum().backward()
        expected = weight
    elif case.startswith("view modified in place"):
        view_of = VIEWS[case.split(": ")[1]]
        base = x * 1.0
        view = view_of(base)
        received.attach(view)
        view.mul_(3)  # its node leaves the graph; the base's node delivers the view's part of its gradient
        (base * weight).sum().backward()
        expected = 3 * view_of(weight)  # (the gradient w.r.t. the view as returned, before the mul_)
    else:
        out = x * 1.0
        received.attach(out)
        if case == "modified in place":
            out.mul_(3)
        (out * weight).sum().backward()
        expected = 3 * weight if case == "modified in place" else weight
    assert len(received.grads) == 1
    torch.testing.assert_close(received.grads[0], expected)


def test_tensor_version_counts_in_place_ops_and_is_none_in_inference_mode():
    t = torch.zeros(2)
    version = internals.tensor_version(t)
    t.add_(1)
    assert internals.tensor_version(t) == version + 1
    with torch.inference_mode():
        assert internals.tensor_version(torch.zeros(2)) is None


def test_view_base_is_the_base_of_a_view_wherever_it_starts_traced_without_a_break_and_kept_under_dynamic_shapes():
    w = torch.randn(4, 6, requires_grad=True)
    h = torch.randn(2, 4) @ w
    assert internals.view_base(h[:, :3]) is h and internals.view_base(h.view(3, 4)) is h
    assert internals.view_base(h[:, 3:]) is h and internals.view_base(h[1:]) is h  # (further in)
    assert internals.view_base(h) is None  # (no view)
    assert internals.view_base(w[:2]) is None  # (of a leaf)
    assert internals.view_base(torch.view_as_real(torch.fft.rfft(h))) is None  # (of another dtype: complex)

    def bases(x, w):  # (1.0 where the view at the base's start has its base, 2.0 where the one further in has)
        h = x @ w  # (B, T, 6)
        at_start, further = internals.view_base(h[:, :, :3]), internals.view_base(h[1:])
        return h.sum() * 0 + (1.0 if at_start is h else 0.0) + (2.0 if further is h else 0.0)

    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    counter = CompileCounter()
    compiled = torch.compile(bases, backend=counter)
    for steps in (3, 5, 7):  # (T dynamic from the second call on: one graph for 5 and 7)
        assert compiled(torch.randn(2, steps, 4), w).item() == 3.0
    assert counter.frame_count == 2 and sum(torch._dynamo.utils.counters["graph_break"].values()) == breaks


def test_all_of_its_base_tells_a_view_of_every_element_adding_no_guard_on_a_dynamic_size():
    h = torch.randn(2, 6)
    assert internals.all_of_its_base(h.t(), h) and internals.all_of_its_base(h[:2], h)  # (eagerly: the counts)
    assert not internals.all_of_its_base(h[:, :3], h)

    def whole(x):  # (1.0 for the transpose, all of it at any size; 2.0 for the first 2 rows, all of it at 2 rows)
        h = x * 2
        return h.sum() * 0 + (1.0 if internals.all_of_its_base(h.t(), h) else 0.0) + (
            2.0 if internals.all_of_its_base(h[:2], h) else 0.0)

    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    counter = CompileCounter()
    compiled = torch.compile(whole, backend=counter)
    x = torch.randn(2, 3)
    torch._dynamo.mark_dynamic(x, 0)  # (a guard on the rows' count would refuse the compile)
    assert compiled(x).item() == 1.0 and compiled(torch.randn(5, 3)).item() == 1.0
    assert counter.frame_count == 1 and sum(torch._dynamo.utils.counters["graph_break"].values()) == breaks

def test_functorch_unwrapped_and_vmap_unwrapped_peel_torch_funcs_wrappers():
    x, seen = torch.randn(5, 3), []

    def f(v):
        seen.append((internals.functorch_unwrapped(v), internals.vmap_unwrapped(v), v))
        return v.sum()

    torch.vmap(f)(x)  # a batched tensor over x: every sample's values, and no autograd of its own
    plain, tracked, _ = seen.pop()
    assert torch.equal(plain, x) and tracked is plain
    torch.func.grad(f)(x)  # grad's wrapper: its values, and the wrapper is the tensor autograd tracks
    plain, tracked, wrapper = seen.pop()
    assert torch.equal(plain, x) and tracked is wrapper and type(plain) is torch.Tensor
    assert internals.functorch_unwrapped(x) is x and internals.vmap_unwrapped(x) is x


def test_functorch_disabled_keeps_ops_on_an_unwrapped_tensor_plain_inside_a_grad_transform():
    found = []

    def f(v):
        plain = internals.functorch_unwrapped(v)
        with internals.functorch_disabled():
            found.append(plain * 2)
        found.append(plain * 2)
        return v.sum()

    torch.func.grad(f)(torch.ones(3))
    inside_off, inside_on = found
    assert not torch._C._functorch.is_functorch_wrapped_tensor(inside_off) and inside_off.data_ptr()
    assert torch._C._functorch.is_functorch_wrapped_tensor(inside_on)  # (what the context is for)


def test_unwrap_compiled_and_is_compiled():
    model = nn.Linear(2, 2)
    assert internals.unwrap_compiled(model) == (model, False)
    assert internals.unwrap_compiled(torch.compile(model, backend="eager")) == (model, True)
    assert not internals.is_compiled(model)
    model.compile(backend="eager")
    assert internals.is_compiled(model)


def test_contains_compiled_finds_a_compiled_module_anywhere_inside():
    assert not internals.contains_compiled(Tiny())
    for compile_part in (lambda m: setattr(m, "act", torch.compile(m.act, backend="eager")),
                         lambda m: m.fc.compile(backend="eager")):
        model = Tiny()
        compile_part(model)
        assert internals.contains_compiled(model)


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_compiled_entry_is_the_callable_every_call_runs(how):
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(3, 2)
    expected = model(x)
    assert internals.compiled_entry(model) is None
    counter = CompileCounter()
    if how == "model.compile()":
        model.compile(backend=counter)
        compiled, attribute = model, "_compiled_call_impl"
    else:
        compiled, attribute = torch.compile(model, backend=counter), "forward"
    entry = internals.compiled_entry(compiled)
    assert (entry.holder, entry.module, entry.attribute) == (compiled, model, attribute)
    inner, seen = entry.call, []

    def call(*args, **kwargs):
        seen.append(args)
        return inner(*args, **kwargs)

    entry.set_call(call)
    torch.testing.assert_close(compiled(x), expected)
    assert len(seen) == 1 and counter.frame_count == 1  # through ours, into the compiled code
    entry.set_call(inner)
    compiled(x)
    assert len(seen) == 1 and internals.compiled_entry(compiled).call is inner


def test_compile_again_has_a_graph_compiled_before_the_hooks_call_them():
    model = torch.compile(Tiny(), backend=CompileCounter())
    model(torch.ones(1, 2))  # compiled with no hook registered
    seen = []
    handles = internals.register_module_hooks(lambda module, args, out: seen.append(type(module).__name__),
                                              traced=True)
    try:
        model(torch.ones(1, 2))
        assert seen.count("Linear") == 0  # dynamo did not guard on the hooks: the old graph, no call
        internals.compile_again()
        model(torch.ones(1, 2))
        assert seen.count("Linear") == 1 and seen.count("Tanh") == 1
    finally:
        for handle in handles:
            handle.remove()


def test_graph_break_reasons_name_dynamos_reasons_since_a_count():
    def broken(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    def item(x):
        return x * 2 if x.sum().item() > 0 else x

    before = internals.graph_break_counts()
    assert internals.graph_break_reasons(since=before) == ""
    torch.compile(broken, backend="eager")(torch.ones(2))
    first = internals.graph_break_reasons(since=before)
    assert first != ""
    after_first = internals.graph_break_counts()
    with torch._dynamo.config.patch(capture_scalar_outputs=False):
        torch.compile(item, backend="eager")(torch.ones(2))
    second = internals.graph_break_reasons(since=after_first)
    assert second != "" and first not in second  # (the second function's breaks alone)


def test_is_compile_error_tells_compiling_failing_from_the_models_error():
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no backend today")

    with pytest.raises(Exception) as compiling:
        torch.compile(lambda x: x.sin() + 1, backend=failing_backend)(torch.ones(2))
    assert internals.is_compile_error(compiling.value)

    def model(x):
        if x.sum() > 0:  # data-dependent: run, not traced
            raise ValueError("the model's own error")
        return x

    with pytest.raises(ValueError, match="own error") as own:
        torch.compile(model, backend="eager")(torch.ones(2))
    assert not internals.is_compile_error(own.value)


def test_installed_hooks_counts_what_is_registered():
    model = nn.Sequential(nn.Linear(2, 2))
    before = internals.installed_hooks(model)
    assert before["parameters"] == [None, None]
    handles = [nn.modules.module.register_module_forward_hook(double),
               model[0].register_forward_hook(lambda m, a, o: None),
               model[0].weight.register_post_accumulate_grad_hook(lambda p: None)]
    after = internals.installed_hooks(model)
    assert after["_global_forward_hooks"] == before["_global_forward_hooks"] + 1
    assert len(after["modules"][1]["_forward_hooks"]) == 1 and len(after["parameters"][0]) == 1
    for handle in handles:
        handle.remove()
    assert internals.installed_hooks()["_global_forward_hooks"] == before["_global_forward_hooks"]
