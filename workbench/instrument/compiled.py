"""Watching a ``torch.compile``'d model at compiled speed: the statistics are computed inside
the compiled graphs.

The eager watch's hooks are marked for dynamo to skip, so a compiled model under it graph-breaks
at every module call and runs none of its compiled code. Here the hooks are written for dynamo
to trace instead:

- One process-wide forward hook (``register_module_forward_hook``; nothing is written into the
  model) that dynamo inlines into the model's graph with every module call. On a recorded step
  it reduces each tensor leaf of the module's output to the raw :data:`SUMS` with plain torch ops
  (:func:`~workbench.instrument.reduce_torch.device_sums`, the reducers' torch reference; with
  histograms :func:`~workbench.instrument.reduce_torch.device_histogram`), which inductor fuses
  into the graph's kernels, and appends them to a list that the compiled call hands back (a side
  effect that dynamo replays after the graph: the sums are extra outputs of the graph).
- Output gradients: the hook passes each output leaf that requires grad through
  :class:`_GradProbe`, an autograd Function whose forward is ``clone()`` (fused into the
  producer's kernel by inductor; a view of the input would forbid the in-place ops models do
  on outputs) and whose backward passes the gradient on untouched and reduces it. The reduced
  row leaves the backward graph as the gradient of a *probe*: a small leaf tensor made for each
  compiled call, ``(capacity, 10)``, row ``k`` for the call's ``k``-th hooked output (the last
  column is 1 where a gradient came: a row without one is no row). No hook runs in the backward;
  the backward stays one compiled graph.
- Each call of the compiled model goes through :meth:`CompiledWatch._call` (set as the
  ``OptimizedModule``'s ``forward``, or as the module's ``_compiled_call_impl`` after
  ``model.compile()``), which gives the call its list and probe and keeps them for ``step()``.
  ``step()`` names the rows (module path, call index in order of the calls, kind, leaf, shape),
  reads the probes' gradients and moves the step's sums to the host in one transfer.
- Parameters and their gradients are outside the graphs: read by the eager reducers
  (:class:`~workbench.instrument.reduce.StepSums`) once per recorded step, and at the end of
  each backward (post-accumulate-grad hooks).
- ``every=N``: whether a step is recorded is a flag the hook reads, on which dynamo guards: two
  compiled variants of each graph (recording, and not - the model's own graph, nothing added),
  switched between without recompiling.
- Where dynamo does not compile a module call (a graph break, a skipped frame), the same hook
  runs eagerly and records the same rows; where no call at all was compiled in a recorded step
  (dynamo skips the model, or compiling failed), the watch warns why and hands over to the eager
  :class:`~workbench.instrument.watch.Watch` (recording the same rows, at eager speed).

Call sites are named by the module's first alias path (:class:`~workbench.instrument.sites.CallSites`
``aliases``); a module object reachable under several paths is recorded under its first (the
eager watch follows its caller instead). Everything torch-private used here: ``OptimizedModule``'s
``forward`` and ``_orig_mod``, ``Module._compiled_call_impl``, the process-wide hook dict through
``register_module_forward_hook``, and the engine's end-of-backward callback.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from workbench.instrument.interventions import Intervention, check_units, unit_index, zero_units
from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update
from workbench.instrument.reduce import EMPTY, StepSums
from workbench.instrument.reduce_torch import as_float, device_histogram
from workbench.instrument.schema import ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, SUMS, anomalous
from workbench.instrument.sites import CallSites, ModuleSelector
from workbench.instrument.store import STATUSES, RunStore
from workbench.instrument.tree import map_tensors, tensor_leaves

__all__ = ["CompiledWatch", "compiled_entry", "watch_compiled"]


def compiled_entry(model: nn.Module) -> tuple[nn.Module, nn.Module, str] | None:
    """``(holder, module, attribute)`` of a compiled model - the object whose ``attribute`` is the
    compiled callable every call goes through, and the module whose paths name the rows - or
    None when ``model`` is not compiled: ``torch.compile(module)`` (an ``OptimizedModule``, whose
    ``forward`` is the compiled ``module.__call__``) or ``module.compile()`` (``_compiled_call_impl``)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule):
        if "forward" not in model.__dict__:
            return None
        return model, model._orig_mod, "forward"
    if getattr(model, "_compiled_call_impl", None) is not None:
        return model, model, "_compiled_call_impl"
    return None


def _graph_sums(x: torch.Tensor) -> torch.Tensor:
    """The :data:`SUMS` of ``x`` as a float64 row, written for inductor to fuse into one pass over
    ``x``: every reduction reads the same flat tensor (a ``dot`` or a chain of in-place ops, as in
    :func:`~workbench.instrument.reduce_torch.device_sums`, would be passes of their own). The
    same definitions as ``device_sums``: ``nonzero`` counts NaNs too, a NaN makes the sums NaN."""
    flat = as_float(x).reshape(-1)
    if flat.numel() == 0:
        return torch.tensor(EMPTY, dtype=torch.float64, device=flat.device)
    first = flat[0]
    shift = torch.where(torch.isfinite(first), first, torch.zeros_like(first))
    centred = flat - shift
    magnitude = flat.abs()
    # counts as float sums of 0/1 selected by where: inductor vectorizes those (a bool or int64 sum,
    # or a nansum, came out ~3x slower on the CPU)
    one, zero = torch.ones_like(flat), torch.zeros_like(flat)
    parts = [centred.sum(), (centred * centred).sum(), magnitude.sum(), flat.amin(), flat.amax(),
             torch.where(flat != 0, one, zero).sum(), torch.where(flat != flat, one, zero).sum(),  # noqa: PLR0124 (NaN)
             torch.where(magnitude == float("inf"), one, zero).sum(), shift]
    return torch.stack([p.to(torch.float64) for p in parts])


def _reduce(x: torch.Tensor, bins: int | None) -> torch.Tensor:
    """The float64 row of ``x``: its SUMS, its histogram counts (``bins``), a 1 (a row was made)."""
    sums = _graph_sums(x)
    parts = [sums]
    if bins:
        parts.append(device_histogram(x.detach(), sums, bins).double())
    parts.append(torch.ones(1, dtype=torch.float64, device=sums.device))
    return torch.cat(parts)


class _GradProbe(torch.autograd.Function):
    """The identity (a clone) on the way forward; on the way back the gradient goes on untouched and
    its reduced row becomes row ``row`` of the gradient of ``probe``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, probe: torch.Tensor, row: int, bins: int) -> torch.Tensor:
        ctx.row, ctx.rows, ctx.bins = row, probe.shape[0], bins
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        reduced = _reduce(grad, ctx.bins)
        # the row at ``row``, zeros elsewhere: the probe's gradients add up to one row per output
        out = torch.nn.functional.pad(reduced[None], (0, 0, ctx.row, ctx.rows - ctx.row - 1))
        return grad, out, None, None


class _State:
    """What the traced hook reads (dynamo guards on it) and writes (replayed after each graph)."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}  # id(module) -> path, for the model's modules with one path
        # where a module is shared (several alias paths): the modules with children keep a stack of
        # the paths being run; a shared module is named by (its caller's path, id) -> path
        self.containers: frozenset[int] = frozenset()
        self.shared: frozenset[int] = frozenset()
        self.resolve: dict[tuple[str | None, int], str] = {}
        self.stack: list[str] | None = None
        self.activation_sites: frozenset[str] = frozenset()
        self.grad_sites: frozenset[str] = frozenset()
        self.recording = False  # a recorded step, not paused
        self.patches: dict[str, tuple[Callable, ...]] = {}  # path -> fns, while not paused
        self.bins = 0
        # per compiled call (set by CompiledWatch._call): the entries, the probe, the probed rows
        self.out: list | None = None
        self.probe: torch.Tensor | None = None
        self.probed: list | None = None


def _make_hooks(state: _State) -> tuple[Callable, Callable]:
    """The process-wide forward pre-hook and hook, traced by dynamo into the model's graphs."""

    def pre_hook(module: nn.Module, args: Any) -> None:
        st = state
        if st.out is None:
            return
        key = id(module)
        if key in st.containers:  # (only where a module is shared: see CallSites)
            path = st.paths.get(key)
            if path is None:
                path = st.resolve.get((st.stack[-1] if st.stack else None, key))
            st.stack.append(path)

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        st = state
        if st.out is None:  # outside a watched call
            return None
        key = id(module)
        if key in st.containers:
            if not st.stack:
                return None
            path = st.stack.pop()
        else:
            path = st.paths.get(key)
            if path is None and key in st.shared:  # named by its caller's path
                path = st.resolve.get((st.stack[-1] if st.stack else None, key))
        if path is None:  # not of this model (or its root, recorded around the call)
            return None
        return _observe(st, path, module, output, torch.compiler.is_compiling())

    return _inline_only(pre_hook), _inline_only(hook)


def _inline_only(hook: Callable) -> Callable:
    """``hook``, traced by dynamo where a traced frame calls it (a module call inside a graph), but
    not compiled as a frame of its own where an eager frame calls it (a module that dynamo runs
    eagerly, in a graph break): there it runs as plain Python, with all it calls (a graph of its
    own for each hook call would be a graph the unwatched model does not have).

    Relies on: dynamo skipping a frame whose code's exec strategy is SKIP (and, recursively, the
    frames it calls), which does not affect inlining while tracing - ``torch_internals.run_eagerly``
    sets the same strategy and also marks the function disabled, which this must not. Without the
    API (another torch), the hooks are still correct, with those extra graphs.
    """
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
        set_code_exec_strategy(hook.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except (ImportError, AttributeError, TypeError):
        pass
    return hook


def _observe(st: _State, path: str, module: nn.Module, output: Any, in_graph: bool | None) -> Any:
    """Patch and record one module call (traced, or run eagerly); returns the output to use, or None
    for the output as it is."""
    fns = st.patches.get(path)
    if fns is not None:
        for fn in fns:
            output = fn(output)
    if not st.recording:
        return output if fns is not None else None
    if isinstance(output, torch.Tensor):
        leaves = [("out", output)]
    else:
        leaves = list(tensor_leaves(output))
    record = path in st.activation_sites
    grads = path in st.grad_sites and module.training and torch.is_grad_enabled()
    names, shapes, reduced, probed = [], [], [], []
    replaced = fns is not None
    for name, tensor in leaves:
        names.append(name)
        shapes.append(tuple(tensor.shape))
        if record:
            reduced.append(_reduce(tensor, st.bins))
        row = -1
        if grads and tensor.requires_grad and tensor.is_floating_point():
            if st.probe is not None and len(st.probed) < st.probe.shape[0]:
                row = len(st.probed)
                st.probed.append(row)
            else:
                row = -2  # the probe is full: its capacity grows for the next call
        probed.append(row)
    if any(r >= 0 for r in probed):
        replaced = True
        rows = list(probed)  # (popped in the order tensor_leaves gave them; dynamo traces no next())
        probe, bins = st.probe, st.bins

        def through_probe(tensor: torch.Tensor) -> torch.Tensor:
            row = rows.pop(0)
            return _GradProbe.apply(tensor, probe, row, bins) if row >= 0 else tensor

        output = through_probe(output) if isinstance(output, torch.Tensor) else map_tensors(output, through_probe)
    stats = torch.stack(reduced) if reduced else None
    st.out.append((path, tuple(names), tuple(shapes), stats, tuple(probed), in_graph))
    return output if replaced else None


class CompiledWatch:
    """Records a compiled model's activations, output gradients, parameters and parameter
    gradients, per call site, step by step, with the statistics inside the compiled graphs.
    Create one with :func:`watch_compiled`; its API is :class:`~workbench.instrument.watch.Watch`'s.

    Attributes:
        model: the module the compiled wrapper holds (whose paths name the rows).
        compiled: the compiled model watched.
        step_index: the step being recorded now; ``step()`` ends it.
        errors: instrumentation failures (dicts: step, module, call, kind, error, traceback).
        recorder: the :class:`~workbench.instrument.recorder.Recorder` the steps are published to.
        fallback: the eager :class:`~workbench.instrument.watch.Watch` recording instead, once
            the model turned out not to compile (None while it compiles).
    """

    def __init__(self, model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None,
                 every: int = 1, activations: bool = True, gradients: bool = True, parameters: bool = True,
                 parameter_grads: bool = True, histograms: bool = False, bins: int = 32,
                 recorder: Recorder | None = None, start_step: int = 1, capacity: int | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch_compiled() needs a torch.nn.Module, got {type(model).__name__}.")
        entry = compiled_entry(model)
        if entry is None:
            raise TypeError(f"watch_compiled() needs a compiled module - torch.compile(model) or a module after "
                            f"model.compile() - got an uncompiled {type(model).__name__}; watch it with "
                            "workbench.watch(model).")
        for name, value, low in [("every", every, 1), ("bins", bins, 1), ("start_step", start_step, 0)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}.")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive int (gradient rows per compiled call) or None, "
                             f"got {capacity!r}.")
        flags = dict(activations=activations, gradients=gradients, parameters=parameters,
                     parameter_grads=parameter_grads, histograms=histograms)
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}.")
        if recorder is not None and not isinstance(recorder, Recorder):
            raise TypeError(f"recorder must be a workbench Recorder (or None for a new one), got {recorder!r}.")
        holder, inner, attribute = entry
        self.compiled, self.model, self.every = model, inner, every
        self.options = dict(flags, bins=bins)
        self._selection = dict(modules=modules, exclude=exclude)
        self._sites = sites = CallSites(inner, modules, exclude)
        self.paths = sites.paths
        self.recorder = recorder if recorder is not None else Recorder()
        self.errors: list[dict[str, Any]] = []
        self.step_index = start_step
        self.closed = False
        self.store: Any = None
        self.fallback: Any = None
        self._sinks: list[Any] = []
        self._metrics: dict[str, float] = {}
        self._step_errors: list[dict[str, Any]] = []
        self._paused = 0
        self._interventions: dict[str, list[Intervention]] = {}
        self._bins = bins if histograms else 0
        self._capacity = capacity or 2 * len(sites.paths) + 16
        self._device = next((p.device for p in inner.parameters()), torch.device("cpu"))
        self._saw_compiled = False
        self._checked = False
        self._output_shape: dict[str, set[tuple]] = defaultdict(set)

        st = self._state = _State()
        # the root's forward hook runs outside the model's graph (dynamo starts at its forward): its
        # output is recorded by _call, around the compiled call, not by a graph of its own
        root = id(inner)
        st.containers = frozenset(sites.containers - {root})
        st.shared = frozenset(key for key, paths in sites.aliases.items() if len(paths) > 1) - st.containers
        st.paths = {key: paths[0] for key, paths in sites.aliases.items()
                    if key != root and len(paths) == 1}
        parents = [None] + [p for key in sites.containers for p in sites.aliases[key]]
        st.resolve = {(parent, key): sites.resolve(parent, sites.modules[key])
                      for key in (st.shared | st.containers) for parent in parents}
        self._root_path = sites.aliases[root][0]
        st.activation_sites = frozenset(sites.selected) if activations else frozenset()
        st.grad_sites = frozenset(sites.selected) if gradients else frozenset()
        st.bins = self._bins
        self._params = sites.parameters()
        self._param_paths = {p for p, _, _ in self._params}

        # the per-call entry point: the compiled callable, wrapped; put back on close()
        self._holder, self._attribute = holder, attribute
        self._inner_call = holder.__dict__[attribute]
        ref = weakref.ref(self)
        inner_call = self._inner_call

        def call(*args: Any, **kwargs: Any) -> Any:
            watch = ref()
            return inner_call(*args, **kwargs) if watch is None else watch._call(inner_call, args, kwargs)

        holder.__dict__[attribute] = call
        pre_hook, hook = _make_hooks(st)
        self._handles: list[Any] = [torch.nn.modules.module.register_module_forward_hook(hook)]
        if st.containers:
            self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(pre_hook))
        # the OptimizedModule is a module too: torch warns on each call that the process-wide hooks
        # fire for it (ours passes it over)
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                                category=UserWarning)
        self._pending_grads: list[tuple[str, str, torch.Tensor]] = []
        self._param_grads: dict[tuple[str, str], torch.Tensor] = {}
        self._flush_queued = False
        if parameter_grads:
            for module_path, name, param in self._params:
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(
                        _weakly(self, "_on_param_grad", module_path, name)))
        self._release = weakref.finalize(self, _release, self._handles, holder, attribute, inner_call)
        self._start_step()

    # ------------------------------------------------------------------ the calls
    def _start_step(self) -> None:
        self._metrics = {}
        self._step_errors = []
        self._calls: list[tuple[list, torch.Tensor | None]] = []
        self._eager_out: list = []
        self._pending_grads = []
        self._param_grads = {}
        self._recording = (self.step_index - 1) % self.every == 0
        self._update()

    def _update(self) -> None:
        st = self._state
        live = not self.closed and not self._paused
        st.recording = live and self._recording
        st.patches = {path: tuple(i.fn for i in items) for path, items in self._interventions.items()} if live else {}

    def _call(self, inner_call: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the compiled model: its entries and probe are kept for ``step()``."""
        st = self._state
        if self.fallback is not None or not (st.recording or st.patches):
            return inner_call(*args, **kwargs)
        out: list = []
        probe = None
        if st.recording and st.grad_sites and torch.is_grad_enabled():
            probe = torch.zeros((self._capacity, len(SUMS) + self._bins + 1), dtype=torch.float64,
                                device=self._device, requires_grad=True)
        st.out, st.probe, st.probed, st.stack = out, probe, [], [self._root_path]
        try:
            result = inner_call(*args, **kwargs)
        except Exception as exc:
            st.out = st.probe = st.probed = None
            if not _from_dynamo(exc) or self._checked:
                raise
            # compiling failed with our hook traced in: the eager watch records instead, the call runs again
            self._hand_over(f"compiling the model with the watch's hooks failed ({type(exc).__name__}: {exc})")
            return inner_call(*args, **kwargs)
        except BaseException:
            st.out = st.probe = st.probed = None
            raise
        try:
            replaced = _observe(st, self._root_path, self.model, result, None)  # (counts as neither)
            if replaced is not None:
                result = replaced
        except Exception as exc:
            self._fail(self._root_path, None, ACTIVATION, exc)
        finally:
            st.out = st.probe = st.probed = None
        if st.recording:
            self._calls.append((out, probe))
        return result

    # ------------------------------------------------------------------ parameter gradients
    def _on_param_grad(self, module_path: str, name: str, param: nn.Parameter) -> None:
        if not self._state.recording or param.grad is None or self.fallback is not None:
            return
        self._pending_grads.append((module_path, name, param.grad))
        if not self._flush_queued:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                self._flush_queued = True
            except RuntimeError:  # not in a backward: step() takes them
                pass

    def _end_of_backward(self) -> None:
        """Reduce the parameter gradients now, before ``zero_grad`` may zero them in place."""
        self._flush_queued = False
        pending, self._pending_grads = self._pending_grads, []
        if not pending:
            return
        try:
            sums = StepSums(self._bins or None, capacity=len(pending))
            rows = sums.add_many([g for _, _, g in pending])
            sums.flush()
            values, counts = sums.rows()
            for (module_path, name, grad), row in zip(pending, rows):
                hist = counts[row] if counts is not None else None
                # the last backward of the step wins: .grad holds the accumulated total
                self._param_grads[(module_path, name)] = (tuple(grad.shape), grad.numel(), values[row], hist)
        except Exception as exc:
            self._fail("", 0, PARAM_GRAD, exc)

    # ------------------------------------------------------------------ the step
    def step(self, **metrics: float) -> StepRecord | None:
        """End the current step: record it (when it is a recorded step) and start the next.

        Args:
            **metrics: scalar metrics of this step, published with its statistics.

        Returns:
            The step's record, or None when the step was neither recorded nor given metrics.
        """
        self._check_open()
        if self.fallback is not None:
            record = self.fallback.step(**metrics)
            self.step_index = self.fallback.step_index
            return record
        if metrics:
            self.log(**metrics)
        record = None
        if self._recording:
            try:
                record = self._record()
            except Exception as exc:  # the step's rows are lost, not the run
                self._fail("", 0, "statistics", exc)
                record = StepRecord(self.step_index, metrics=dict(self._metrics), errors=tuple(self._step_errors))
        elif self._metrics or self._step_errors:
            record = StepRecord(self.step_index, metrics=dict(self._metrics), errors=tuple(self._step_errors))
        if record is not None:
            self.recorder.publish(record)
        self.step_index += 1
        if self.fallback is not None:  # handed over during this step
            self.fallback.step_index = self.step_index
            self.fallback._start_step()
        self._start_step()
        return record

    def _record(self) -> StepRecord:
        self._end_of_backward()  # (gradients hooked outside a backward)
        keys: list[tuple] = []
        numel: list[int] = []
        pieces: list[torch.Tensor] = []  # device rows, in the order of keys, for one transfer
        calls: dict[str, int] = defaultdict(int)
        compiled = eager = 0
        grad_keys: list[tuple] = []
        grad_rows: list[torch.Tensor] = []
        overflow = False
        for out, probe in self._calls:
            grad = probe.grad if probe is not None else None
            used = []
            for path, names, shapes, stats, probed, was_compiled in out:
                compiled += was_compiled is True
                eager += was_compiled is False
                call = calls[path]
                calls[path] = call + 1
                for i, (name, shape) in enumerate(zip(names, shapes)):
                    self._output_shape[path].add(shape)
                    size = int(np.prod(shape)) if shape else 1
                    if stats is not None:
                        keys.append((path, call, ACTIVATION, name, shape))
                        numel.append(size)
                        pieces.append(stats[i:i + 1])
                    row = probed[i]
                    overflow |= row == -2
                    if row >= 0 and grad is not None:
                        grad_keys.append(((path, call, GRAD_OUTPUT, name, shape), size))
                        used.append(row)
            if used:
                index = torch.tensor(used, device=grad.device)
                grad_rows.append(grad[index])
        if overflow:
            self._capacity *= 2
            self._fail("", 0, GRAD_OUTPUT, RuntimeError(
                f"more outputs needed a gradient row than the probe holds; it holds {self._capacity} from the next "
                "step on (one recompile); the gradients beyond the old capacity were not recorded this step"),
                disable=False)
        self._note_compiled(compiled, eager)
        width = len(SUMS) + self._bins + 1
        device_rows = torch.cat(pieces).to("cpu", torch.float64) if pieces else np.zeros((0, width))
        grads = torch.cat(grad_rows).to("cpu") if grad_rows else None  # (the one host transfer, with the above)
        device_rows = np.asarray(device_rows)
        sums_list = [device_rows[:, :len(SUMS)]]
        hist_list = [device_rows[:, len(SUMS):len(SUMS) + self._bins]]
        if grads is not None:
            grads = grads.numpy()
            keep = grads[:, -1] > 0  # rows whose gradient arrived
            for (key, size), kept in zip(grad_keys, keep):
                if kept:
                    keys.append(key)
                    numel.append(size)
            sums_list.append(grads[keep, :len(SUMS)])
            hist_list.append(grads[keep, len(SUMS):len(SUMS) + self._bins])
        if self.options["parameters"]:
            params = [(p, n, t) for p, n, t in self._params if p in self._param_paths]
            if params:
                sums = StepSums(self._bins or None, capacity=len(params))
                rows = sums.add_many([t.detach() for _, _, t in params])
                sums.flush()
                values, counts = sums.rows()
                for (module_path, name, t), row in zip(params, rows):
                    keys.append((module_path, 0, PARAM, name, tuple(t.shape)))
                    numel.append(t.numel())
                    sums_list.append(values[row:row + 1])
                    hist_list.append(counts[row:row + 1] if counts is not None else np.zeros((1, 0)))
        for (module_path, name), (shape, size, values, hist) in self._param_grads.items():
            keys.append((module_path, 0, PARAM_GRAD, name, shape))
            numel.append(size)
            sums_list.append(values[None])
            hist_list.append(hist[None] if hist is not None else np.zeros((1, 0)))
        sums = np.concatenate(sums_list) if keys else np.zeros((0, len(SUMS)))
        counts = np.concatenate(hist_list).astype(np.float64) if (self._bins and keys) else None
        return StepRecord(self.step_index, tuple(keys), np.asarray(numel, np.int64), sums, counts,
                          dict(self._metrics), tuple(self._step_errors))

    def _note_compiled(self, compiled: int, eager: int) -> None:
        """After the first recorded step with calls: warn about calls that ran outside dynamo's
        graphs, and hand over to the eager watch where none ran inside."""
        if compiled:
            self._saw_compiled = True
        if self._checked or not (compiled or eager):
            return
        self._checked = True
        if not compiled:
            reasons = _graph_break_reasons()
            self._hand_over("no module call of the model ran inside a compiled graph (dynamo skipped or broke "
                            f"every frame{': ' + reasons if reasons else ''})")
        elif eager:
            warnings.warn(f"workbench.watch_compiled: {eager} of {compiled + eager} module calls ran outside "
                          "dynamo's graphs (graph breaks in the model); they are recorded eagerly, the rest "
                          "inside the compiled graphs.", RuntimeWarning, stacklevel=4)

    def _hand_over(self, why: str) -> None:
        """The eager watch records from now on (the hook and the wrapper are taken out)."""
        from workbench.instrument.watch import Watch

        warnings.warn(f"workbench.watch_compiled: {why}; falling back to the eager watch (the same rows, "
                      "recorded at eager speed: its hooks run in graph breaks).", RuntimeWarning, stacklevel=4)
        self._checked = True
        self._release()
        options = {k: v for k, v in self.options.items()}
        self.fallback = Watch(self.compiled, every=self.every, recorder=self.recorder, start_step=self.step_index,
                              **self._selection, **options)
        self.fallback.errors.extend(self.errors)
        self.errors = self.fallback.errors

    def discard_step(self) -> None:
        """Forget what the current step has recorded so far, and start it again (same number)."""
        self._check_open()
        if self.fallback is not None:
            return self.fallback.discard_step()
        self._start_step()

    def log(self, **metrics: float) -> None:
        """Attach scalar metrics to the current step (published by ``step()``).

        Raises:
            TypeError: a metric that is not a number (or a one-element tensor).
        """
        if self.fallback is not None:
            return self.fallback.log(**metrics)
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().item() if value.numel() == 1 else value
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"metric {key!r} must be a number, got {value!r}.")
            self._metrics[key] = float(value)

    @contextlib.contextmanager
    def paused(self) -> Iterator[CompiledWatch]:
        """A block the watch stays out of (an evaluation pass): no rows, no calls counted, no patches.
        The compiled model runs its unrecorded variant (no recompile after the first)."""
        self._check_open()
        if self.fallback is not None:
            with self.fallback.paused():
                yield self
            return
        self._paused += 1
        self._update()
        try:
            yield self
        finally:
            self._paused -= 1
            self._update()

    # ------------------------------------------------------------------ interventions
    def patch(self, path: str, fn: Callable[[Any], Any], call: int | None = None) -> Intervention:
        """Replace the output of the call site ``path`` with ``fn(output)``, inside the compiled graph
        (``fn`` is traced by dynamo; adding or removing a patch recompiles once).

        Args:
            path: a module path of the model.
            fn: takes the module's output, returns its replacement (same structure).
            call: None (every call). A patch of one call index needs the eager watch: the call index
                is not known inside a compiled graph that runs for several calls of a step.

        Raises:
            TypeError: ``fn`` is not callable.
            ValueError: no module at ``path``, or a ``call`` other than None.
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(f"patch() needs a callable fn, got {fn!r}.")
        return self._add_intervention(path, fn, call, getattr(fn, "__name__", "patch"))

    def ablate(self, path: str, units: int | Iterable[int], dim: int = 1, call: int | None = None) -> Intervention:
        """Zero ``units`` along ``dim`` of the call site's output (every floating-point tensor in it).

        Raises:
            TypeError: units or dim of the wrong type.
            ValueError: units or dim out of range for the outputs recorded at ``path`` so far, or a
                ``call`` other than None.
        """
        index = unit_index(units, dim)
        for shape in self._output_shape.get(path, ()):
            check_units(path, index, dim, shape)
        return self._add_intervention(path, zero_units(path, index, dim), call, f"ablate{index}@dim{dim}")

    @property
    def interventions(self) -> list[Intervention]:
        """The interventions in place."""
        if self.fallback is not None:
            return self.fallback.interventions
        return [i for items in self._interventions.values() for i in items]

    def _add_intervention(self, path: str, fn: Callable, call: int | None, label: str) -> Intervention:
        self._check_open()
        self._sites.check_path(path)
        if call is not None:
            raise ValueError(f"call={call!r}: on a compiled model a patch applies to every call of {path!r} "
                             "(call=None); the call index of a call inside a compiled graph is not known there. "
                             "Patch every call, or watch the uncompiled model with workbench.watch to patch one.")
        if self.fallback is not None:
            return self.fallback._add_intervention(path, fn, call, label)
        intervention = Intervention(path, fn, call, label, self._remove_intervention)
        self._interventions.setdefault(path, []).append(intervention)
        self._update()
        return intervention

    def _remove_intervention(self, intervention: Intervention) -> None:
        active = self._interventions.get(intervention.path, [])
        if intervention in active:
            active.remove(intervention)
        if not active:
            self._interventions.pop(intervention.path, None)
        self._update()

    # ------------------------------------------------------------------ reading
    def subscribe(self, callback: Callable[[Update], object], max_pending: int = 1000,
                  interval: float = 0.0) -> Subscription:
        """Receive each recorded step on a thread of its own (see ``Recorder.subscribe``)."""
        return self.recorder.subscribe(callback, max_pending, interval)

    def to_pandas(self) -> pd.DataFrame:
        """One row per tensor per call site per recorded step (see ``workbench.instrument.ROW_COLUMNS``)."""
        return self.recorder.to_pandas()

    def metrics(self) -> pd.DataFrame:
        """The metrics given to ``step()`` / ``log()``: one row per step."""
        return self.recorder.metrics()

    def histograms(self, module: str | None = None, kind: str | None = None) -> pd.DataFrame:
        """Histograms (``histograms=True``): one row per tensor with ``edges`` and ``counts``."""
        return self.recorder.histograms(module, kind)

    def anomalies(self) -> pd.DataFrame:
        """Rows with NaN or Inf values, in the order they were recorded."""
        frame = self.to_pandas()
        return frame[anomalous(frame)].reset_index(drop=True)

    # ------------------------------------------------------------------ failures, sinks, closing
    def _fail(self, path: str, call: int | None, kind: str, exc: BaseException, disable: bool = True) -> None:
        error = {"step": self.step_index, "module": path, "call": call, "kind": kind,
                 "error": f"{type(exc).__name__}: {exc}", "traceback": "".join(traceback.format_exception(exc))}
        self.errors.append(error)
        self._step_errors.append(error)
        warnings.warn(f"workbench.watch_compiled: {error['error']}", RuntimeWarning, stacklevel=3)

    def add_sink(self, sink: Any) -> None:
        """Close ``sink`` with this watch, with its status."""
        self._sinks.append(sink)

    def report(self, kind: str, message: str) -> None:
        """A failure outside the hooks (a sink that could not write): kept in ``errors``, warned."""
        self.errors.append({"step": None, "module": "", "call": 0, "kind": kind, "error": message, "traceback": ""})
        warnings.warn(f"workbench: {message}; the run will be marked failed. Training goes on.", RuntimeWarning,
                      stacklevel=2)

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Take the hooks out and put the compiled callable back; close the sinks. Idempotent."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}.")
        if self.closed:
            return
        self.closed = True
        self._release()
        self._update()
        if self.fallback is not None:
            self.fallback.close(status, error)
        for sink in self._sinks:
            sink.close(status, error)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("This watch is closed; start a new one with workbench.watch_compiled(model).")

    def __enter__(self) -> CompiledWatch:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
        elif isinstance(exc, KeyboardInterrupt):
            self.close("stopped", "interrupted by the user (KeyboardInterrupt)")
        else:
            self.close("failed", "".join(traceback.format_exception(exc)))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step_index}"
        mode = "eager fallback" if self.fallback is not None else "compiled"
        return f"CompiledWatch({type(self.model).__name__}, {mode}, every={self.every}, {state}, {len(self.errors)} errors)"


def _weakly(watch: CompiledWatch, method: str, *bound: Any) -> Callable:
    ref = weakref.ref(watch)

    def hook(*args: Any) -> None:
        w = ref()
        if w is not None:
            getattr(w, method)(*bound, *args)

    return hook


def _release(handles: list, holder: nn.Module, attribute: str, inner_call: Callable) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()
    if holder.__dict__.get(attribute) is not inner_call:
        holder.__dict__[attribute] = inner_call


def _from_dynamo(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("torch._dynamo", "torch._inductor"))


def _graph_break_reasons() -> str:
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return ""
    breaks = dynamo.utils.counters.get("graph_break", {})
    return "; ".join(list(breaks)[:3])


def watch_compiled(model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None, every: int = 1,
                   activations: bool = True, gradients: bool = True, parameters: bool = True,
                   parameter_grads: bool = True, histograms: bool = False, bins: int = 32,
                   recorder: Recorder | None = None, store: str | Path | None = None,
                   metadata: dict[str, Any] | None = None, start_step: int = 1) -> CompiledWatch:
    """Watch a compiled model - ``torch.compile(model)`` or ``model.compile()`` - with the
    statistics computed inside its compiled graphs. Same arguments and rows as :func:`workbench.watch`.

    ::

        compiled = torch.compile(model)
        with workbench.watch_compiled(compiled) as w:
            for batch in data:
                loss = objective(compiled(batch)); loss.backward(); opt.step(); opt.zero_grad()
                w.step(loss=loss.item())

    Raises:
        TypeError: ``model`` is not a compiled module, or an option has the wrong type.
        ValueError: ``every``/``bins`` not positive, or ``modules`` selects nothing.
    """
    w = CompiledWatch(model, modules=modules, exclude=exclude, every=every, activations=activations,
                      gradients=gradients, parameters=parameters, parameter_grads=parameter_grads,
                      histograms=histograms, bins=bins, recorder=recorder, start_step=start_step)
    if store is not None:
        facts = {"model": type(w.model).__name__, "every": every, "modules": repr(modules), "exclude": repr(exclude),
                 "compiled": True, **w.options, **(metadata or {})}
        try:
            w.store = RunStore(store, facts, on_error=lambda message: w.report("store", message))
            w.store.attach(w.recorder)
            w.add_sink(w.store)
        except BaseException as exc:
            w.close("failed", "".join(traceback.format_exception(exc)))
            raise
    return w
