"""Every use of torch's private machinery by the instrumentation, in one place.

Each function names the torch behaviour it relies on; ``tests/instrument/test_torch_internals.py``
has a test per function that fails if a torch release changes that behaviour. Nothing else in
:mod:`workbench.instrument` touches a private torch name.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["run_eagerly", "inline_only", "register_module_hooks", "HookSwitch", "register_param_grad_hook",
           "member_dicts", "restore_param_hook_dicts", "queue_end_of_backward", "call_raised", "calls_running",
           "in_backward", "keeps_graph", "GradientHook",
           "tensor_version", "view_base", "all_of_its_base", "functorch_unwrapped", "vmap_unwrapped",
           "functorch_disabled",
           "unwrap_compiled", "is_compiled", "CompiledEntry", "compiled_entry", "graph_break_counts",
           "graph_break_reasons", "is_compile_error", "installed_hooks"]


def _skip_frames(function: Callable) -> bool:
    """Have dynamo skip the frames of ``function``'s code (and the frames they call) rather than
    compile them; False on a torch without the API. Relies on: dynamo running a code object whose
    exec strategy is SKIP as plain Python; inlining it while tracing another frame is unaffected."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
        set_code_exec_strategy(function.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def run_eagerly(hook: Callable) -> Callable:
    """``hook``, marked for torch.compile to call as it is (in a graph break) and to trace nothing
    it calls: what ``torch.compiler.disable`` does, without its wrapper's cost on every module call
    of every model (the hooks are process-wide).

    Relies on: dynamo recognizing a function as disabled by its ``_torchdynamo_disable`` attribute
    while tracing, and skipping its frames (:func:`_skip_frames`, what the wrapper sets up each
    call). On a torch without them, the wrapper.
    """
    if not _skip_frames(hook):
        return torch.compiler.disable(hook)
    hook._torchdynamo_disable = True
    return hook


def inline_only(hook: Callable) -> Callable:
    """``hook``, traced by dynamo where a traced frame calls it (a module call inside a graph), but
    not compiled as a frame of its own where an eager frame calls it (a module that dynamo runs in
    a graph break): there it runs as plain Python, with all it calls - a graph of its own per call
    would be a graph the unwatched model does not have.

    Relies on: :func:`_skip_frames` (without the API the hook is still correct, with those extra
    graphs); unlike :func:`run_eagerly` it is not marked disabled, so dynamo inlines it.
    """
    _skip_frames(hook)
    return hook


def register_module_hooks(post_hook: Callable, pre_hook: Callable | None = None, traced: bool = False,
                          always_call: bool = False) -> list[Any]:
    """Register process-wide module forward hooks (``register_module_forward_hook``, public): torch
    runs them for every module call, before the module's own hooks, so nothing is written into the
    model. Under torch.compile they run eagerly (:func:`run_eagerly`), or with ``traced`` they are
    traced into the model's graphs (:func:`inline_only`). With ``always_call`` torch calls
    ``post_hook`` also when the call raises (:func:`call_raised` tells). Returns their handles."""
    # a torch.compile'd module warns on every call that process-wide hooks fire for it too (it is a
    # module): ours pass it over, as a module of no model they watch
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                            category=UserWarning)
    mark = inline_only if traced else run_eagerly
    handles = [nn.modules.module.register_module_forward_hook(mark(post_hook), always_call=always_call)]
    if pre_hook is not None:
        handles.append(nn.modules.module.register_module_forward_pre_hook(mark(pre_hook)))
    return handles


class HookSwitch:
    """Takes registered hooks out of torch's hook dicts and puts them back in their place, so that
    steps that record nothing run with no hook of ours (a module without hooks takes torch's fast
    call path).

    Relies on: a ``RemovableHandle`` keeping a weak reference to its (ordered) hooks dict
    (``hooks_dict_ref()``) and its key (``id``), and to the dicts of its flags (``extra_dict_ref``:
    ``always_call``), and torch calling the hooks in the dict's order. A hook goes back to its old
    place among the user's hooks (after those registered before it); hooks registered meanwhile
    stay behind it, as if registered later.
    """

    def __init__(self, handles: Iterable[Any]) -> None:
        # [hooks dict, key, hook, order of the dict's keys when the hook was taken out, the hook's flags]
        self._slots = [[h.hooks_dict_ref(), h.id, h.hooks_dict_ref()[h.id], None, _flags(h)] for h in handles]
        self.attached = True

    def set(self, attach: bool) -> None:
        if attach == self.attached:
            return
        for slot in self._slots:
            hooks, key, hook, order, flags = slot
            if not attach:
                slot[3] = list(hooks) if len(hooks) > 1 else None
                hooks.pop(key, None)
                for flag_dict, _ in flags:
                    flag_dict.pop(key, None)
                continue
            for flag_dict, value in flags:  # (before the hook: a thread calling it finds its flags)
                flag_dict[key] = value
            hooks[key] = hook  # (at the end)
            if order is not None:
                # the hooks that were behind ours, and those registered meanwhile, go behind it
                # again; one move at a time: other threads running modules (the dict is
                # process-wide) never find a hook missing
                rank = {k: i for i, k in enumerate(order)}
                ours = rank[key]
                for later in [k for k in hooks if k != key and rank.get(k, len(rank)) > ours]:
                    hooks.move_to_end(later)
        self.attached = attach

    def clear(self) -> None:
        self._slots.clear()


def _flags(handle: Any) -> list[tuple[dict, Any]]:
    """The flag dicts that hold ``handle``'s key (``always_call``, ``with_kwargs``), with its value there."""
    dicts = [ref() for ref in getattr(handle, "extra_dict_ref", ())]
    return [(d, d[handle.id]) for d in dicts if d is not None and handle.id in d]


def register_param_grad_hook(param: nn.Parameter, hook: Callable, fresh: list[nn.Parameter]) -> Any:
    """``param.register_post_accumulate_grad_hook(hook)`` (public), noting in ``fresh`` a parameter
    whose hook dict torch creates for it.

    Relies on: ``_post_accumulate_grad_hooks`` being None until a first hook is registered, so
    that :func:`restore_param_hook_dicts` can leave the parameter as it found it."""
    if param._post_accumulate_grad_hooks is None:
        fresh.append(param)
    return param.register_post_accumulate_grad_hook(hook)


def restore_param_hook_dicts(fresh: Iterable[nn.Parameter]) -> None:
    """Set the emptied hook dicts of parameters that had none back to None (torch keeps the C++
    hook it made to call the dict; it has no way to remove one, as after any register and remove).
    Relies on: torch reading ``_post_accumulate_grad_hooks is None`` as no hooks."""
    for param in fresh:
        if not param._post_accumulate_grad_hooks:
            param._post_accumulate_grad_hooks = None


def member_dicts(module: nn.Module) -> tuple[Mapping, Mapping]:
    """The dicts that hold ``module``'s own parameters and children (a TorchScript module's are
    mappings that wrap its C++ module), to compare their values' identities cheaply (replaced,
    added or removed ones) without walking the module tree.
    Relies on: ``nn.Module`` keeping them in ``_parameters`` and ``_modules``, changed in place by
    ``setattr``, ``register_parameter``, ``load_state_dict(assign=True)`` and container edits."""
    return module._parameters, module._modules


def queue_end_of_backward(callback: Callable[[], None]) -> bool:
    """Have ``callback`` run when the current backward ends; False outside a backward.

    Relies on: the autograd engine's ``queue_callback``, which raises RuntimeError outside a
    backward and runs the callbacks once the graph task is done."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(callback)
    except RuntimeError:
        return False
    return True


_CALL_IMPL = nn.Module._call_impl.__code__


def call_raised(module: nn.Module) -> bool:
    """Whether a forward hook registered with ``always_call=True`` runs because the call of
    ``module`` raised (and not because it returned). Relies on: torch calling such hooks from the
    ``except`` clause of ``Module._call_impl`` (the exception being handled was caught in that
    call's frame), with the output None where the module's forward raised."""
    tb = sys.exc_info()[2]
    return tb is not None and tb.tb_frame.f_code is _CALL_IMPL and tb.tb_frame.f_locals.get("self") is module


def calls_running(module: nn.Module) -> int:
    """How many calls of ``module`` are running on this thread (frames of ``Module._call_impl`` for it
    on the stack). Walks the stack: for the rare case, not every call. Relies on: an eager module
    call running through ``Module._call_impl``, with the module as its ``self`` (a compiled call's
    frames may not show)."""
    count, frame = 0, sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            count += 1
        frame = frame.f_back
    return count


def in_backward() -> bool:
    """Whether this thread runs inside a backward (a forward there is activation checkpointing
    recomputing). Relies on: ``torch._C._current_graph_task_id()`` being -1 outside a backward."""
    return torch._C._current_graph_task_id() != -1


def keeps_graph() -> bool:
    """Whether the backward running on this thread keeps the graph (``retain_graph=True``, or
    ``create_graph=True``), so that another backward may pass through the same forward; True
    outside a backward. Relies on: ``torch._C._autograd._get_current_graph_task_keep_graph``
    reading the running graph task's ``keep_graph`` flag (and True where there is none)."""
    return torch._C._autograd._get_current_graph_task_keep_graph()


class GradientHook:
    """Receives the gradient w.r.t. a tensor when the backward computes it (:meth:`attach`), in
    :meth:`on_gradient` (subclasses define it).

    The hook is a pre-hook on the autograd node that made the tensor, picking the tensor's
    gradient from the node's incoming gradients: what a tensor hook receives (the gradient w.r.t.
    the value the module returned, also after an in-place op changed it), at half its cost. A
    view that is modified in place loses its node (a tensor hook on it would never fire either);
    the node of its base then receives the gradient w.r.t. the whole base, and its pre-hook
    delivers the view's elements of it (laid out as the base, then read with the view's sizes,
    strides and offset) when the view's own did not fire in that backward pass (each of several passes
    through one forward: until 2026-11-30 the first alone, a total of one pass, silently). A view of
    another dtype than its base's (``view_as_real`` of a complex tensor: its sizes and strides count
    other elements) has no such fallback.

    Relies on: ``grad_fn.register_prehook`` receiving the node's incoming gradients indexed by the
    tensor's ``output_nr``, and ``_is_view()`` / ``_base`` naming a view's base.
    """

    __slots__ = ("output", "base_output", "fired", "geometry")

    def on_gradient(self, grad: torch.Tensor | None) -> None:
        raise NotImplementedError

    def attach(self, tensor: torch.Tensor) -> Any:
        """Hook ``tensor``'s gradient. Returns the handle of a hook that outlives the backward, on a
        leaf (a parameter returned as a module's output: it stays on the tensor until removed), else
        None (a node's pre-hook goes with the graph)."""
        self.output = self.base_output = 0
        self.fired, self.geometry = False, None
        node = tensor.grad_fn
        if node is None:  # a leaf: no node makes it, a tensor hook gets its gradient
            return tensor.register_hook(self.on_gradient)
        self.output = tensor.output_nr
        node.register_prehook(self._node_hook)
        if tensor._is_view():
            base = tensor._base
            # (a view of another dtype - view_as_real of a complex base - is not read from its base's gradient)
            if base.grad_fn is not None and base.dtype == tensor.dtype:
                self.base_output = base.output_nr
                # (sizes and strides only: the hook keeps no tensor of the forward alive)
                self.geometry = (base.size(), base.stride(), tensor.size(), tensor.stride(),
                                 tensor.storage_offset() - base.storage_offset())
                base.grad_fn.register_prehook(self._base_hook)
        return None

    def _node_hook(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        self.fired = True
        self.on_gradient(grads[self.output])

    def _base_hook(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        # (each backward pass: the view's node, where it is in the graph, runs before its base's, which it passes
        # its gradient to; so the flag is the pass's, and taken back here for the next pass through the forward)
        if self.fired:
            self.fired = False
        else:  # the view was modified in place: its node is no longer in the graph
            grad = grads[self.base_output]
            if grad is not None:
                base_size, base_stride, size, stride, offset = self.geometry
                laid_out = grad.new_empty_strided(base_size, base_stride)
                laid_out.copy_(grad)
                grad = laid_out.as_strided(size, stride, offset)
            self.on_gradient(grad)


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The base of ``tensor`` where it is a view of a tensor autograd made (not a leaf), of its dtype (not
    ``view_as_real`` of a complex one: its sizes and strides count other elements); else None. Traced by dynamo
    without a graph break. Where the view starts in its base is not asked here: dynamo traces no
    ``storage_offset()``, and with dynamic shapes it moves (``h[1:]`` of a ``(B, T, D)`` tensor starts ``T * D``
    in); the compiled watch takes it when the graph runs (``compiled_graph.offset_in_base``).

    Relies on: ``_base`` naming a view's base (dynamo reads it from its fake tensors)."""
    base = tensor._base
    if base is None or base.is_leaf or base.dtype != tensor.dtype:
        return None
    return base


def all_of_its_base(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether ``view`` (a view of ``base``: :func:`view_base`) has as many elements as ``base`` at any size
    dynamo may give them (a reshape, a transpose, a ``Flatten``; a base autograd made fills its storage, so such a
    view starts where it starts): with sizes dynamo traced symbolically, False where that depends on them
    (``h[:2]`` of a batch of 2, marked dynamic), adding no guard (comparing the counts would guard the size, and a
    size marked dynamic refuses that guard). Eagerly, the counts compared.

    Relies on: ``torch.fx.experimental.symbolic_shapes.statically_known_true`` deciding a symbolic equality
    from the shape environment alone, traced by dynamo without a graph break."""
    return statically_known_true(view.numel() == base.numel())


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (bumped by every in-place op), or None for an inference-mode
    tensor, which has none. Relies on: ``Tensor._version``."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def functorch_unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor under ``tensor``'s ``torch.func`` wrappers, else ``tensor`` itself: under
    ``torch.vmap`` the values of every sample (the vmapped dimension included), under
    ``torch.func.grad`` the values tracked. Relies on: ``torch._C._functorch``'s
    ``is_functorch_wrapped_tensor`` and ``get_unwrapped``, which peels one level at a time."""
    while torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        tensor = torch._C._functorch.get_unwrapped(tensor)
    return tensor


def vmap_unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor under ``tensor``'s outer ``torch.vmap`` wrappers, else ``tensor``: the one whose
    autograd node makes it (vmap records no autograd of its own; ``torch.func.grad``'s wrappers
    do, and are kept). Relies on: ``torch._C._functorch.is_batchedtensor`` and ``get_unwrapped``."""
    while torch._C._functorch.is_batchedtensor(tensor):
        tensor = torch._C._functorch.get_unwrapped(tensor)
    return tensor


def functorch_disabled() -> Any:
    """A context in which torch ops on a tensor unwrapped by :func:`functorch_unwrapped` give plain
    tensors (inside a ``torch.func.grad`` transform they would be wrapped again, with no storage to
    read). Relies on: ``torch._C._DisableFuncTorch``."""
    return torch._C._DisableFuncTorch()


def unwrap_compiled(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module a ``torch.compile(module)`` wraps, and whether it was one. Relies on: dynamo's
    ``OptimizedModule`` keeping the original module as ``_orig_mod``."""
    dynamo = sys.modules.get("torch._dynamo")  # loaded by torch.compile
    if dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule):
        return model._orig_mod, True
    return model, False


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model.compile()`` compiled the module in place. Relies on: ``Module.compile``
    setting ``_compiled_call_impl``."""
    return getattr(model, "_compiled_call_impl", None) is not None


def contains_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or a module inside it is compiled (:func:`unwrap_compiled`, :func:`is_compiled`)."""
    return any(unwrap_compiled(module)[1] or is_compiled(module) for module in model.modules())


class CompiledEntry(NamedTuple):
    """Where every call of a compiled model goes through: the callable kept as ``holder.<attribute>``
    (on the instance), and ``module``, the module whose paths name the rows."""

    holder: nn.Module
    module: nn.Module
    attribute: str

    @property
    def call(self) -> Callable:
        """The compiled callable a call of the model runs now (None if it was taken away)."""
        return self.holder.__dict__.get(self.attribute)

    def set_call(self, call: Callable) -> None:
        """Have every call of the model run ``call`` instead (put the old one back to undo)."""
        self.holder.__dict__[self.attribute] = call


def compiled_entry(model: nn.Module) -> CompiledEntry | None:
    """The :class:`CompiledEntry` of a compiled model - ``torch.compile(module)`` or
    ``module.compile()`` - or None for anything else.

    Relies on: an ``OptimizedModule``'s ``__call__`` running the compiled ``module.__call__`` it
    keeps as the instance attribute ``forward`` (:func:`unwrap_compiled`), and ``Module.__call__``
    running ``_compiled_call_impl`` when ``Module.compile`` set it (:func:`is_compiled`)."""
    inner, wrapped = unwrap_compiled(model)
    if wrapped:
        return CompiledEntry(model, inner, "forward") if "forward" in model.__dict__ else None
    if isinstance(model, nn.Module) and is_compiled(model):
        return CompiledEntry(model, model, "_compiled_call_impl")
    return None


def compile_again() -> None:
    """Have every compiled frame of the process compile again at its next call, with the hooks
    registered now: dynamo does not guard a graph on the process-wide module hooks, so a graph
    compiled before they were registered would run on without ever calling them. Uses the public
    ``torch.compiler.reset()``: every compiled model in the process recompiles once. Relies on:
    dynamo tracing the process-wide hooks it finds as it compiles (a test checks both halves)."""
    torch.compiler.reset()


def graph_break_counts() -> dict[str, int]:
    """How many graph breaks dynamo has counted in this process so far, by reason (empty if
    torch.compile never ran): what :func:`graph_break_reasons` takes as ``since``. Relies on:
    dynamo counting them by reason in ``torch._dynamo.utils.counters["graph_break"]``, a count
    that ``torch.compiler.reset()`` does not clear."""
    dynamo = sys.modules.get("torch._dynamo")
    return dict(dynamo.utils.counters.get("graph_break", {})) if dynamo is not None else {}


def graph_break_reasons(since: Mapping[str, int], limit: int = 3) -> str:
    """The first ``limit`` reasons dynamo gave for graph breaks since the counts ``since``
    (:func:`graph_break_counts`), for a message ("" if none): the breaks of one model, not those of
    another compiled earlier in the process."""
    counts = graph_break_counts()
    return "; ".join([reason for reason, n in counts.items() if n > since.get(reason, 0)][:limit])


def is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` is torch.compile failing (to trace or to build the graph), not the model's
    code raising. Relies on: dynamo and inductor raising their own exception types, defined in
    ``torch._dynamo`` and ``torch._inductor`` (a model's own error reaches the caller as it is)."""
    return type(exc).__module__.startswith(("torch._dynamo", "torch._inductor"))


def installed_hooks(model: nn.Module | None = None) -> dict[str, Any]:
    """Counts of the hooks in torch's dicts: the process-wide module hooks, and (with ``model``) its
    modules' own hooks and its parameters' post-accumulate hooks (None where a parameter has no
    dict). For checking that a watch leaves nothing behind.

    Relies on: the process-wide hooks living in ``torch.nn.modules.module._global_*`` dicts, and a
    module's in its ``_forward_hooks``-like attributes."""
    out: dict[str, Any] = {name: len(getattr(nn.modules.module, name)) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_forward_hooks_always_called")}
    if model is not None:
        keys = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
        out["modules"] = [{key: dict(getattr(m, key)) for key in keys} for m in model.modules()]
        out["parameters"] = [None if p._post_accumulate_grad_hooks is None else dict(p._post_accumulate_grad_hooks)
                             for p in model.parameters()]
    return out
