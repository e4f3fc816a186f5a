"""``watch``: activations and gradients of any ``nn.Module``, per call site, recorded step by step.

How it hooks in (see DESIGN.md, decisions 3 to 6):

- A forward hook, process-wide (torch's ``register_module_forward_hook``),
  sees every module call and passes over modules of other models. Nothing is
  written into the model: it deep-copies and pickles as before
  (``torch.save(model)`` mid-run), a copy is not watched, and the user's own
  hooks are untouched (torch runs the process-wide hooks first: an
  activation is what the module's forward returned). The hooks hold the
  watch weakly, so a watch let go of without ``close()`` takes them out when
  it is collected. Each call within a step gets an index. Where a module
  object is reachable under several names (a shared activation), a
  process-wide pre-hook also keeps a stack of the call sites being executed
  by the modules with children, so that the module is attributed to the
  alias path through which its parent called it.
- Output gradients come from hooks registered inside the forward hook on the
  autograd node that made each output (what a tensor hook is, at half its
  cost; see :class:`_GradSite`). Full backward hooks raise on in-place ops
  and skip dict outputs. Parameter gradients come from post-accumulate-grad
  hooks, once per backward; parameter values once per recorded step, in
  ``step()``.
- Hooks only reduce tensors to sums on their device; ``step()`` moves a
  step's sums to the host in one transfer and publishes them to the Recorder.
  Activations are reduced in the hook (a later in-place op may change them);
  small output gradients, which nothing changes meanwhile, are queued and
  reduced in one call at the end of the backward; parameter gradients are
  reduced together there, parameters together in ``step()``.
- Steps that are not recorded (``every``) and ``paused()`` blocks run without
  our hooks: they are taken out of torch's hook dicts and put back in their
  place (not for a compiled model, whose compiled code is guarded on them).
- A forward run inside a backward is activation checkpointing recomputing
  what the forward recorded: it records no rows, only the output gradients
  the forward could not hook (reentrant checkpointing runs it under no_grad).
- torch.compile runs the forward hooks eagerly, in graph breaks.
- A failure inside a hook is kept in ``errors`` and that site disabled; the
  forward and backward of the model go on untouched.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import sys
import traceback
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update
from workbench.instrument.schema import ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, anomalous
from workbench.instrument.store import STATUSES, RunStore
from workbench.instrument.stats import SUMS, StepSums
from workbench.instrument.tree import map_tensors, shape_of, tensor_leaves

__all__ = ["Watch", "watch", "Intervention"]

_ENGINE = torch.autograd.Variable._execution_engine  # runs callbacks at the end of a backward
_graph_task_id = torch._C._current_graph_task_id  # -1 outside a backward

ModuleSelector = str | Sequence[str] | Callable[[str], bool] | None


def _selector(spec: ModuleSelector, what: str) -> Callable[[str], bool]:
    if spec is None:
        return lambda path: False
    if callable(spec):
        return spec
    patterns = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple, set)) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{what} must be a glob string, a list of globs or a predicate on the module path, "
                        f"got {spec!r}.")
    return lambda path: any(fnmatch.fnmatchcase(path, p) for p in patterns)


class Intervention:
    """A patch on a call site's output; ``remove()`` takes it away."""

    def __init__(self, watch: Watch, path: str, fn: Callable[[Any], Any], call: int | None, label: str) -> None:
        self.path, self.fn, self.call, self.label = path, fn, call, label
        self._watch = watch

    def applies(self, call: int | None) -> bool:
        """Whether it applies to ``call`` (None: a call of unknown index, see ``Watch._post_hook``)."""
        return self.call is None or self.call == call

    def remove(self) -> None:
        self._watch._remove_intervention(self)

    def __repr__(self) -> str:
        at = "every call" if self.call is None else f"call {self.call}"
        return f"Intervention({self.label} at {self.path!r}, {at})"


class Watch:
    """Records a module's activations, output gradients, parameters and parameter gradients.

    Use :func:`watch` to create one. See the module docstring for how.

    Attributes:
        step_index: the step being recorded now (1-based); ``step()`` ends it.
        errors: instrumentation failures (each disabled its site).
        recorder: the :class:`~workbench.instrument.recorder.Recorder` the
            recorded steps are published to.
    """

    def __init__(
        self,
        model: nn.Module,
        modules: ModuleSelector = "*",
        exclude: ModuleSelector = None,
        every: int = 1,
        activations: bool = True,
        gradients: bool = True,
        parameters: bool = True,
        parameter_grads: bool = True,
        histograms: bool = False,
        bins: int = 32,
        recorder: Recorder | None = None,
        store: str | Path | None = None,
        metadata: dict[str, Any] | None = None,
        start_step: int = 1,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}.")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int (record every Nth step), got {every!r}.")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise ValueError(f"bins must be a positive int, got {bins!r}.")
        for name, flag in [("activations", activations), ("gradients", gradients), ("parameters", parameters),
                           ("parameter_grads", parameter_grads), ("histograms", histograms)]:
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}.")
        dynamo = sys.modules.get("torch._dynamo")  # loaded by torch.compile
        # a torch.compile'd module: its module paths are those of the module it wraps
        self._compiled = dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)
        self.model = model._orig_mod if self._compiled else model
        model = self.model
        self.every = every
        self.options = dict(activations=activations, gradients=gradients, parameters=parameters,
                            parameter_grads=parameter_grads, histograms=histograms, bins=bins)
        if recorder is not None and not isinstance(recorder, Recorder):
            raise TypeError(f"recorder must be a workbench Recorder (or None for a new one), got {recorder!r}.")
        self.recorder = recorder if recorder is not None else Recorder()
        self.errors: list[dict[str, Any]] = []
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be a non-negative int, got {start_step!r}.")
        self.step_index = start_step
        self.closed = False
        # Read by the process-wide hooks, which fire for every model's modules on every thread
        # from the moment they are registered (another thread may be running its model while
        # this watch is still being set up): inactive until the first step starts
        self._active = self._recording = False
        self._generation = 0  # steps started, discarded ones included
        self._late_reported: set[str] = set()  # sites whose gradient arrived after its step ended

        # alias paths of every module object, in named_modules order
        self._aliases: dict[int, list[str]] = defaultdict(list)
        self._modules: dict[int, nn.Module] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self._aliases[id(module)].append(path)
            self._modules[id(module)] = module
        self.paths = [p for paths in self._aliases.values() for p in paths]

        include, skip = _selector(modules, "modules"), _selector(exclude, "exclude")
        self._selected = {p for p in self.paths if include(p) and not skip(p)}
        if not self._selected:
            raise ValueError(f"modules={modules!r} (exclude={exclude!r}) selects no module of "
                             f"{type(model).__name__}; its module paths are: {self._path_list()}.")

        self._resolved: dict[tuple[str | None, int], str] = {}
        # Row keys, one object per distinct key: a site's keys are the same every step, and each
        # recorded step keeps its keys. Made anew, every kept key would be an object for the garbage
        # collector to count: ~700 a step on the ILQL agent, a collection of the youngest generation
        # every step or two, and a full collection of the process (~0.2 s with torch loaded) every
        # few hundred steps. A new key is dropped for the kept one at once, and counts nothing.
        self._keys: dict[tuple, tuple] = {}
        # kind -> (names, shapes, (row key, numel) per tensor) of its last batch (see _record_parameters)
        self._param_batches: dict[str, tuple[list, list, list]] = {}
        self._stack: list[tuple[int, str]] = []
        self._calls: dict[str, int] = defaultdict(int)
        self._interventions: dict[str, list[Intervention]] = defaultdict(list)
        self._paused = 0  # paused() blocks entered

        # The call stack names a call through the alias path its caller used; only a module object
        # reachable under several paths (a shared activation) needs that. Without one, every module
        # has its one path, and no pre-hook is registered: torch's hooked call path costs ~1 us a
        # call more for it, and ours as much again.
        shared = any(len(paths) > 1 for paths in self._aliases.values())
        # ids of the modules that call others: the call stack only needs them (a module without
        # children finds its call site from the stack's top in its forward hook)
        self._containers = {id(m) for m in self._modules.values()
                            if next(m.children(), None) is not None} if shared else set()
        # the path of each module with one path, that does not keep the stack: looked up in one step
        self._single_path = {key: paths[0] for key, paths in self._aliases.items()
                             if len(paths) == 1 and key not in self._containers}
        # Process-wide module hooks (torch runs them for every module, before the module's own
        # hooks), which pass over modules of other models. Nothing is written into the model: it
        # deep-copies and pickles as before (torch.save(model) mid-run), and a copy is not watched.
        # torch.compile runs them eagerly, in a graph break: they read memory and keep Python state
        # that a traced graph cannot hold (see _run_eagerly)
        self._handles: list[Any] = [
            torch.nn.modules.module.register_module_forward_hook(_run_eagerly(_weakly(self._post_hook))),
        ]
        if self._containers:
            self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(
                _run_eagerly(_weakly(self._pre_hook))))
        # a torch.compile'd module warns on every call that process-wide hooks fire for it too
        # (it is a module): ours pass it over, as a module of no model they watch
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                                category=UserWarning)
        module_handles = len(self._handles)
        # parameters: unique tensors, named by the first module path that owns them
        self._params: list[tuple[str, str, nn.Parameter]] = []
        param_paths: set[str] = set()
        self._fresh_hook_dicts: list[nn.Parameter] = []
        seen: set[int] = set()
        for module_path, module in model.named_modules():
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen or module_path not in self._selected:
                    continue
                seen.add(id(param))
                self._params.append((module_path, name, param))
                param_paths.add(module_path)
                if parameter_grads and param.requires_grad:
                    if param._post_accumulate_grad_hooks is None:  # torch creates the dict lazily
                        self._fresh_hook_dicts.append(param)
                    self._handles.append(param.register_post_accumulate_grad_hook(
                        _weakly(self._record_param_grad, module_path, name)))
        # the hooks hold the watch weakly: a watch the user lets go of without close() takes its
        # hooks out when it is collected, instead of recording on for ever
        self._release = weakref.finalize(self, _remove_hooks, self._handles, self._fresh_hook_dicts)

        # (hooks dict, key, hook, order of the dict's keys when the hook was taken out) per handle,
        # the module hooks apart from the parameters' ones: each group is in only on the steps it
        # has something to do (see _update_hooks, _attach_hooks)
        slots = [[handle.hooks_dict_ref(), handle.id, handle.hooks_dict_ref()[handle.id], None]
                 for handle in self._handles]
        self._slots = {"module": slots[:module_handles], "param": slots[module_handles:]}
        self._attached = {"module": True, "param": True}

        # kind -> the paths whose tensors of that kind are recorded; a failure takes its path out
        self._sites: dict[str, set[str]] = {
            ACTIVATION: set(self._selected) if activations else set(),
            GRAD_OUTPUT: set(self._selected) if gradients else set(),
            PARAM: set(param_paths) if parameters else set(),
            PARAM_GRAD: set(param_paths) if parameter_grads else set(),
        }

        # the sums of a step's tensors, emptied for the next step (see _start_step)
        self._sums = StepSums(bins if histograms else None)
        self.store: RunStore | None = None
        if store is not None:
            facts = {"model": type(model).__name__, "every": every, "modules": repr(modules),
                     "exclude": repr(exclude), **self.options, **(metadata or {})}
            try:
                self.store = RunStore(store, facts, on_error=self._store_failed)
                self.store.attach(self.recorder)
            except BaseException as exc:  # no hook left in, and a store that started reads failed
                self.close("failed", "".join(traceback.format_exception(exc)))
                raise
        self._start_step()

    # ------------------------------------------------------------------ hooks
    def _start_step(self) -> None:
        self._generation += 1  # (a gradient hooked before this tells its step is over)
        self._recording = (self.step_index - 1) % self.every == 0
        self._update_hooks()
        # The step's state is emptied, not made anew: this runs at the end of every training step,
        # recorded or not, with the interpreter's and numpy's code gone cold, where a new StepSums
        # (numpy's allocation paths) took ~80 us, ~1% of the MLP's step (warm, ~3 us)
        self._stack.clear()
        self._calls.clear()
        self._sums.reset()  # (keeps its arrays, grown to the largest step so far)
        # (key, numel, row of _sums) per recorded tensor, in order; one append each, so threads
        # running hooks at once keep them aligned
        self._entries: list[tuple[tuple[str, int, str, str, tuple[int, ...]], int, int]] = []
        self._param_grads: dict[tuple[str, str], tuple] = {}  # (key, numel, row) per parameter
        self._pending_param_grads: list[tuple[str, str, torch.Tensor]] = []  # until the backward ends
        self._metrics: dict[str, float] = {}
        self._seen: dict[int, list] = {}  # id(tensor) -> see _seen_entry
        self._grads_hooked: set[str] = set()  # paths whose output gradients this step's forward hooked
        self._flush_queued = False  # an end-of-backward flush is queued
        self._step_errors: list[dict[str, Any]] = []

    def _update_hooks(self) -> None:
        """Whether the hooks act (a recorded step or patches to apply, and not paused), and which
        are in: the module hooks where activations, output gradients or patches are to be taken,
        the parameters' hooks where parameter gradients are (parameter values are read in step(),
        with no hook). A watch of parameters and their gradients (what wandb.watch records) runs
        every module call on torch's unhooked path; so do sites whose every kind has failed."""
        self._active = not self.closed and not self._paused and (self._recording or bool(self._interventions))
        # a compiled model keeps our hooks in: taking them out and back changes what its compiled
        # code was guarded on, and would recompile it every few steps
        compiled = self._compiled or getattr(self.model, "_compiled_call_impl", None) is not None
        sites, recording = self._sites, self._active and self._recording
        self._attach_hooks("module", compiled or (self._active and bool(self._interventions))
                           or (recording and bool(sites[ACTIVATION] or sites[GRAD_OUTPUT])))
        self._attach_hooks("param", compiled or (recording and bool(sites[PARAM_GRAD])))

    def _attach_hooks(self, group: str, attach: bool) -> None:
        """Put our hooks of ``group`` ("module": torch's process-wide module hooks, "param": the
        parameters' post-accumulate hooks) in (``attach``) or take them out of their dicts.

        Between recorded steps (``every``) the model runs with no hook of ours at all: a module
        without hooks takes torch's fast call path, so idle steps cost nothing. A hook goes back
        to its old place among the user's hooks (after those registered before it); hooks the
        user registered meanwhile stay behind it, as if registered later.
        """
        if attach == self._attached[group]:
            return
        for slot in self._slots[group]:
            hooks, key, hook, order = slot
            if not attach:
                slot[3] = list(hooks) if len(hooks) > 1 else None
                hooks.pop(key, None)
                continue
            hooks[key] = hook  # (at the end)
            if order is not None:
                # the hooks that were behind ours, and those registered meanwhile, go behind it
                # again; one move at a time: other threads running modules (the dict is
                # process-wide) never find a hook missing
                rank = {k: i for i, k in enumerate(order)}
                ours = rank[key]
                for later in [k for k in hooks if k != key and rank.get(k, len(rank)) > ours]:
                    hooks.move_to_end(later)
        self._attached[group] = attach

    def _resolve(self, parent: str | None, module: nn.Module) -> str:
        """The alias path through which ``parent`` (a call-site path) called ``module``."""
        key = (parent, id(module))
        path = self._resolved.get(key)
        if path is None:
            aliases = self._aliases.get(id(module)) or [f"<{type(module).__name__}>"]
            if parent is None:
                path = "" if "" in aliases else aliases[0]
            else:
                prefix = parent + "." if parent else ""
                direct = [a for a in aliases if a.startswith(prefix) and "." not in a[len(prefix):]]
                if direct:
                    path = direct[0]
                else:  # called from elsewhere: the alias closest to the caller
                    path = max(aliases, key=lambda a: len(_common_prefix(a, parent)))
            self._resolved[key] = path
        return path

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        if not self._active or id(module) not in self._containers:
            return
        if module is self.model:
            self._stack.clear()  # a forward that raised earlier may have left entries
        parent = self._stack[-1][1] if self._stack else None
        self._stack.append((id(module), self._resolve(parent, module)))

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not self._active:
            return None
        key = id(module)
        path = self._single_path.get(key)
        if path is None:
            if key not in self._modules:  # a module of another model
                return None
            if key not in self._containers:
                path = self._resolve(self._stack[-1][1] if self._stack else None, module)
            else:
                if not self._stack:  # hooks put in while this module ran
                    return None
                mid, path = self._stack.pop()
                while mid != key and self._stack:  # entries of children whose forward raised
                    mid, path = self._stack.pop()
        recomputing = _graph_task_id() != -1
        want_grads = (self._recording and path in self._sites[GRAD_OUTPUT] and module.training
                      and torch.is_grad_enabled())
        if recomputing:
            # a forward inside the backward: activation checkpointing recomputes outputs that the
            # forward recorded. No activation rows, no call counted; patches apply again, so that
            # the recomputed values are those the forward used. The gradients come from the
            # recomputed graph where the forward made none (reentrant checkpointing runs it under
            # no_grad). Which call is recomputed is known only when the forward called the site once.
            call = 0 if self._calls.get(path) == 1 else None
            record_activations = False
            record_grads = want_grads and call is not None and path not in self._grads_hooked
        else:
            call = self._calls[path]
            self._calls[path] = call + 1
            record_activations = self._recording and path in self._sites[ACTIVATION]
            record_grads = want_grads
        replaced = False
        if self._interventions:  # (most watches patch nothing)
            for intervention in tuple(self._interventions.get(path, ())):  # (a failing one is removed)
                if recomputing and call is None and intervention.call is not None:
                    self._fail(path, call, f"patch:{intervention.label}", RuntimeError(
                        f"activation checkpointing recomputes {path!r}, which the forward called "
                        f"{self._calls.get(path, 0)} times: a patch of call {intervention.call} cannot tell "
                        "which call is recomputed, and the gradients would not match the forward. Patch "
                        "every call (call=None), or a site outside the checkpointed segment."))
                    self._remove_intervention(intervention)
                elif intervention.applies(call):
                    try:
                        output = intervention.fn(output)
                        replaced = True
                    except Exception as exc:
                        self._fail(path, call, f"patch:{intervention.label}", exc)
                        self._remove_intervention(intervention)
        if record_activations or record_grads:
            try:
                # most outputs are one tensor: skip the walk
                leaves = (("out", output),) if isinstance(output, torch.Tensor) else tuple(tensor_leaves(output))
                self._record_output(path, call, leaves, record_activations, record_grads)
            except Exception as exc:  # an output the walk or the row keys cannot take: the site stops, the model goes on
                for kind in (ACTIVATION, GRAD_OUTPUT):
                    if path in self._sites[kind]:
                        self._fail(path, call, kind, exc)
        return output if replaced else None

    def _record_output(self, path: str, call: int, leaves: Sequence[tuple[str, torch.Tensor]],
                       activations: bool, grads: bool) -> None:
        for name, tensor in leaves:
            seen = self._seen_entry(tensor)
            shape = shape_of(tensor)  # a plain tuple: the garbage collector stops tracking the keys (not
            # so with torch.Size)
            if activations:
                try:
                    if seen[2] is None:
                        seen[2] = self._sums.add(tensor)
                    # one append (a list append is atomic): hooks on other threads cannot interleave a row
                    self._entries.append((self._intern((path, call, ACTIVATION, name, shape)),
                                          tensor.numel(), seen[2]))
                except Exception as exc:
                    self._fail(path, call, ACTIVATION, exc)
                    activations = False
            if grads and tensor.requires_grad:
                try:
                    if seen[3] is None:
                        seen[3] = self._hook_grad(tensor)
                    seen[3].keys.append((path, call, name, shape))
                    self._grads_hooked.add(path)
                except Exception as exc:
                    self._fail(path, call, GRAD_OUTPUT, exc)
                    grads = False

    def _intern(self, key: tuple) -> tuple:
        """The one kept object equal to ``key`` (see ``_keys``)."""
        return self._keys.setdefault(key, key)

    def _seen_entry(self, tensor: torch.Tensor) -> list:
        """``[weakref, version, row, grad site]`` of ``tensor`` in this step.

        A container's output is often its last child's output, the same tensor object (a
        Sequential, a residual block, the model): it is reduced and hooked once, and every
        call site that returned it gets a row. Likewise a gradient that the backward hands to
        several sites. The weakref proves identity without keeping the tensor alive, the
        version counter proves it was not modified in place since.
        """
        try:
            version = tensor._version
        except RuntimeError:  # inference-mode tensors have no version counter: never reused
            return [None, None, None, None]
        seen = self._seen.get(id(tensor))
        if seen is None or seen[0]() is not tensor or seen[1] != version:
            seen = self._seen[id(tensor)] = [weakref.ref(tensor), version, None, None]
        return seen

    def _hook_grad(self, tensor: torch.Tensor) -> _GradSite:
        """A :class:`_GradSite` that records the gradient w.r.t. ``tensor`` when the backward computes it."""
        site = _GradSite(self)
        node = tensor.grad_fn
        if node is None:  # a leaf: no node makes it, a tensor hook gets its gradient
            tensor.register_hook(site.tensor_hook)
            return site
        site.output = tensor.output_nr
        node.register_prehook(site.node_hook)
        if tensor._is_view():
            base = tensor._base
            if base.grad_fn is not None and base.numel() == tensor.numel():
                site.base_output = base.output_nr
                base.grad_fn.register_prehook(site.base_hook)
        return site

    def _record_grad(self, site: _GradSite, grad: torch.Tensor | None) -> None:
        if grad is None or self.closed or self._paused:
            return
        keys = [key for key in site.keys if key[0] in self._sites[GRAD_OUTPUT]]
        if site.generation != self._generation:
            if site.step == self.step_index:  # of a forward whose step was discarded
                return
            # the user's order, not the site, is at fault: the site records again from the next step.
            # Reported once per site: a loop that always steps too early would report every step
            for path, call, _, _ in keys:
                if path in self._late_reported:
                    continue
                self._late_reported.add(path)
                self._fail(path, call, GRAD_OUTPUT, RuntimeError(
                    f"the gradient of step {site.step} arrived after watch.step() ended that step; "
                    "call w.step() after loss.backward()"), disable=False)
            return
        try:
            if keys:
                # The backward often hands one gradient tensor to several sites: an add node
                # passes its incoming gradient on to both inputs as it is (the two branches of a
                # residual connection). While its Python object lives (a small gradient queued
                # below, a GPU batch's), it is found and reduced once. A large CPU gradient's
                # object dies with the hook: the backward keeps only the C++ tensor, whose address
                # a later gradient may reuse, so nothing proves it the same and it is reduced
                # again. Nothing changes a gradient once computed: small ones are queued and
                # reduced together at the end of the backward.
                seen = self._seen_entry(grad)
                if seen[2] is None:
                    seen[2] = self._sums.add(grad, defer=True)
                row = seen[2]
                self._entries.extend((self._intern((path, call, GRAD_OUTPUT, name, shape)), grad.numel(), row)
                                     for path, call, name, shape in keys)
                self._flush_when_backward_ends()
        except Exception as exc:
            for path, call, _, _ in keys:
                self._fail(path, call, GRAD_OUTPUT, exc)

    def _record_param_grad(self, module_path: str, name: str, param: nn.Parameter) -> None:
        if not (self._recording and self._active) or module_path not in self._sites[PARAM_GRAD]:
            return
        grad = param.grad
        if grad is None:  # a hook that ran before ours took it: an optimizer step inside the backward
            where = ".".join(filter(None, (module_path, name)))
            self._fail(module_path, 0, PARAM_GRAD, RuntimeError(
                f"the gradient of {where} was already None when watch's hook ran: a post-accumulate-grad "
                "hook registered before watch() took it (an optimizer step in the backward?). Start "
                "watch() before registering such hooks to record it."))
            return
        # the gradient as accumulated now (a hook behind ours may take it), reduced with the others
        # when the backward ends
        self._pending_param_grads.append((module_path, name, grad))
        self._flush_when_backward_ends()

    def _record_parameters(self, kind: str, items: list[tuple[str, str, torch.Tensor]]) -> None:
        """Rows of ``kind`` ("param" or "param_grad") for ``(module path, name, tensor)`` items, reduced
        together (``StepSums.add_many``); a tensor that cannot be reduced fails its site alone."""
        tensors = [tensor for _, _, tensor in items]
        try:
            rows = self._sums.add_many(tensors)
        except Exception:  # (a meta tensor ...) one by one, to tell which
            rows = []
            for module_path, _, tensor in items:
                try:
                    rows.append(self._sums.add(tensor, defer=True))
                except Exception as exc:
                    self._fail(module_path, 0, kind, exc)
                    rows.append(None)
        # The row keys and sizes of a batch stay the same while its names and shapes do (a step's
        # parameters, its gradients in the order the backward made them): built once, then
        # compared (warm, 0.33 us a tensor for all of this; looked up one by one, 0.54)
        names = [(module_path, name) for module_path, name, _ in items]
        shapes = [tensor.shape for tensor in tensors]
        batch = self._param_batches.get(kind)
        if batch is None or batch[0] != names or batch[1] != shapes:
            keys = [self._intern((module_path, 0, kind, name, shape_of(tensor))) for module_path, name, tensor in items]
            batch = self._param_batches[kind] = (names, shapes, list(zip(keys, [t.numel() for t in tensors])))
        entries = [(key, numel, row) for (key, numel), row in zip(batch[2], rows) if row is not None]
        if kind == PARAM:
            self._entries.extend(entries)
        else:  # the last backward of the step wins: .grad holds the accumulated total
            self._param_grads.update(zip([where for where, row in zip(names, rows) if row is not None], entries))

    def _flush_when_backward_ends(self) -> None:
        """Reduce the gradients deferred during this backward in one call when it ends (while
        they are still there: ``zero_grad`` may zero them in place)."""
        if self._flush_queued:
            return
        try:
            _ENGINE.queue_callback(self._end_of_backward)
            self._flush_queued = True
        except RuntimeError:  # not inside a backward (a hook run by hand): step() flushes
            pass

    def _end_of_backward(self) -> None:
        self._flush_queued = False
        self._flush_deferred()

    def _take_param_grads(self) -> None:
        if self._pending_param_grads:
            pending, self._pending_param_grads = self._pending_param_grads, []
            self._record_parameters(PARAM_GRAD, pending)

    def _flush_deferred(self) -> None:
        self._take_param_grads()
        try:
            self._sums.flush()
        except Exception as exc:
            self._fail("", 0, "statistics", exc)

    def _fail(self, path: str, call: int | None, kind: str, exc: BaseException, disable: bool = True) -> None:
        """Keep an instrumentation failure in ``errors`` and (``disable``) stop recording ``kind``
        at ``path``; a failing patch is removed instead, with a warning: the model no longer runs
        as the user asked."""
        if disable and kind in self._sites:
            self._sites[kind].discard(path)
        error = {"step": self.step_index, "module": path, "call": call, "kind": kind,
                 "error": f"{type(exc).__name__}: {exc}", "traceback": "".join(traceback.format_exception(exc))}
        self.errors.append(error)
        self._step_errors.append(error)
        if kind.startswith("patch:"):
            _warn(f"workbench: the intervention {kind[6:]} at {path!r} failed and was removed; the model "
                  f"runs unpatched from here ({error['error']}).")

    # ------------------------------------------------------------- the API
    def step(self, **metrics: float) -> StepRecord | None:
        """End the current step: record it (when it is a recorded step) and start the next.

        Args:
            **metrics: scalar metrics of this step (loss, accuracy ...),
                published with its statistics.

        Returns:
            The step's record, or None when the step was neither recorded nor
            given metrics.
        """
        self._check_open()
        if metrics:
            self.log(**metrics)
        record = None
        if self._recording:
            self._take_param_grads()  # (from hooks that ran outside a backward)
            if self.options["parameters"]:
                sites = self._sites[PARAM]
                self._record_parameters(PARAM, [item for item in self._params if item[0] in sites])
            self._entries.extend(self._param_grads.values())
            self._flush_deferred()
            record = self._flush()
        elif self._metrics or self._step_errors:
            record = StepRecord(self.step_index, metrics=dict(self._metrics), errors=tuple(self._step_errors))
        if record is not None:
            self.recorder.publish(record)
        self.step_index += 1
        self._start_step()
        return record

    def _flush(self) -> StepRecord:
        try:
            sums, counts = self._sums.rows()  # the one host transfer of the step
        except Exception as exc:  # (a failed device transfer) the step's statistics are lost, not the run
            self._fail("", 0, "statistics", exc)
            self._entries, sums, counts = [], np.empty((0, len(SUMS))), None
        keys, numel, rows = zip(*self._entries) if self._entries else ((), (), ())
        index = np.asarray(rows, np.intp)
        return StepRecord(self.step_index, tuple(keys), np.asarray(numel, np.int64), sums[index],
                          counts[index] if counts is not None else None, dict(self._metrics),
                          tuple(self._step_errors), index)

    def discard_step(self) -> None:
        """Forget what the current step has recorded so far, and start it again (same number):
        a training step that raised (a KeyboardInterrupt in the middle of a forward) leaves no
        partial step in the rows. A backward still to come of the discarded forward records nothing."""
        self._check_open()
        self._start_step()

    def log(self, **metrics: float) -> None:
        """Attach scalar metrics to the current step (published by ``step()``)."""
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().item() if value.numel() == 1 else value
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"metric {key!r} must be a number, got {value!r}.")
            self._metrics[key] = float(value)

    def patch(self, path: str, fn: Callable[[Any], Any], call: int | None = None) -> Intervention:
        """Replace the output of the call site ``path`` with ``fn(output)``.

        Args:
            path: a module path of the model (any of its alias paths).
            fn: takes the module's output, returns its replacement (same structure).
            call: only this call index within a step (None: every call).

        Returns:
            An :class:`Intervention`; ``remove()`` ends it. The patched output
            is what the rest of the model sees, what is recorded and what
            gradients flow through.
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(f"patch() needs a callable fn, got {fn!r}.")
        return self._add_intervention(path, fn, call, getattr(fn, "__name__", "patch"))

    def ablate(self, path: str, units: int | Iterable[int], dim: int = 1, call: int | None = None) -> Intervention:
        """Zero ``units`` along ``dim`` of the call site's output (every tensor in it).

        Args:
            path: a module path of the model.
            units: an index or indices along ``dim`` (channels, features ...).
            dim: the dimension that indexes units (1: channels of (B, C, ...)).
            call: only this call index within a step (None: every call).
        """
        index = [units] if isinstance(units, int) else list(units) if isinstance(units, (list, tuple, range)) else None
        if not index or not all(isinstance(u, int) and not isinstance(u, bool) for u in index):
            raise TypeError(f"units must be an int or a non-empty list of ints, got {units!r}.")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {dim!r}.")
        for shape in self._output_shapes(path):  # known when a recorded step has seen the site
            if not -len(shape) <= dim < len(shape):
                raise ValueError(f"ablate({path!r}): dim={dim} is out of range for its output of shape "
                                 f"{shape}; pass a dim in [{-len(shape)}, {len(shape) - 1}].")
            size = shape[dim]
            bad = [u for u in index if isinstance(size, int) and not -size <= u < size]
            if bad:
                raise ValueError(f"ablate({path!r}): units {bad} are out of range for dim {dim} of its output "
                                 f"of shape {shape}; pass units in [0, {size - 1}].")

        def zero_units(tensor: torch.Tensor) -> torch.Tensor:
            if not tensor.is_floating_point():
                return tensor
            if not -tensor.dim() <= dim < tensor.dim():
                raise ValueError(f"ablate({path!r}): dim={dim} is out of range for an output of shape "
                                 f"{tuple(tensor.shape)}.")
            size = tensor.shape[dim]
            bad = [u for u in index if not -size <= u < size]
            if bad:
                raise ValueError(f"ablate({path!r}): units {bad} are out of range for dim {dim} of size {size}.")
            return tensor.index_fill(dim, torch.tensor(index, device=tensor.device), 0)

        return self._add_intervention(path, lambda output: map_tensors(output, zero_units), call,
                                      f"ablate{index}@dim{dim}")

    def _output_shapes(self, path: str) -> set[tuple]:
        """The shapes of the activations recorded at ``path`` so far (none before a recorded step)."""
        return {key[4] for key in list(self._keys) if key[0] == path and key[2] == ACTIVATION}

    def _add_intervention(self, path: str, fn: Callable, call: int | None, label: str) -> Intervention:
        if path not in self.paths:
            close = difflib.get_close_matches(str(path), self.paths, n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"No module at path {path!r}.{hint} Module paths: {self._path_list()}.")
        if call is not None and (isinstance(call, bool) or not isinstance(call, int) or call < 0):
            raise ValueError(f"call must be None (every call) or a call index >= 0, got {call!r}.")
        intervention = Intervention(self, path, fn, call, label)
        self._interventions[path].append(intervention)
        self._update_hooks()
        return intervention

    def _remove_intervention(self, intervention: Intervention) -> None:
        active = self._interventions.get(intervention.path, [])
        if intervention in active:
            active.remove(intervention)
        if not active:
            self._interventions.pop(intervention.path, None)
        # (also from inside a forward hook: torch iterates over a copy of the hook dicts)
        self._update_hooks()

    @contextlib.contextmanager
    def paused(self) -> Iterator[Watch]:
        """A block the watch stays out of, such as an evaluation pass between training steps: its
        module calls leave no rows, count no call and are not patched, and run without our hooks."""
        self._check_open()
        self._paused += 1
        self._update_hooks()
        try:
            yield self
        finally:
            self._paused -= 1
            if not self.closed:
                self._update_hooks()

    @property
    def interventions(self) -> list[Intervention]:
        return [i for items in self._interventions.values() for i in items]

    def subscribe(self, callback: Callable[[Update], object], max_pending: int = 1000,
                  interval: float = 0.0) -> Subscription:
        """Receive each recorded step (an :class:`Update`) on a thread of its own; see ``Recorder.subscribe``."""
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
        """Rows with NaN or Inf values, in the order they were recorded: the first row is where
        a non-finite value first appeared (step, module path, call, kind)."""
        frame = self.to_pandas()
        return frame[anomalous(frame)].reset_index(drop=True)

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Remove every hook; the model is as before ``watch``. Idempotent.

        Args:
            status: how the run ended, written into its store: ``finished``, ``stopped`` (by
                the user) or ``failed`` (with ``error``, what went wrong). A store that could
                not write every step closes ``failed`` whatever is passed.
            error: the error of a ``failed`` run (a message or a formatted traceback).
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}.")
        if self.closed:
            return
        self.closed = True
        self._active = False
        self._release()
        self._slots.clear()
        if getattr(self, "store", None) is not None:
            self.store.close(status, error)  # writes what is still queued first
        self._interventions.clear()

    def _store_failed(self, message: str) -> None:
        """The run store could not write (on its writer thread): never silent, never fatal."""
        self.errors.append({"step": None, "module": "", "call": 0, "kind": "store", "error": message,
                            "traceback": ""})
        _warn(f"workbench: {message}; the run will be marked failed. Training goes on.")

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("This watch is closed; start a new one with workbench.watch(model).")

    def _path_list(self) -> str:
        shown = [p if p else "'' (the model itself)" for p in self.paths[:40]]
        more = f" ... and {len(self.paths) - 40} more" if len(self.paths) > 40 else ""
        return ", ".join(shown) + more

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
        elif isinstance(exc, KeyboardInterrupt):
            self.close("stopped", "interrupted by the user (KeyboardInterrupt)")
        else:
            self.close("failed", "".join(traceback.format_exception(exc)))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step_index}"
        return (f"Watch({type(self.model).__name__}, {len(self._selected)} call-site paths, every={self.every}, "
                f"{state}, {len(self.errors)} errors)")


class _GradSite:
    """The gradient w.r.t. one output tensor, recorded when the backward computes it, for every
    call site that returned the tensor (``keys``).

    The hook is a pre-hook on the node that made the tensor, and picks the tensor's gradient
    from the node's incoming gradients: what a tensor hook receives (the gradient w.r.t. the
    value the module returned, also after an in-place op changed it), for half the cost of
    ``register_hook``. An output that is a view of another tensor (a Linear on 3-D input
    returns one) loses its node when it is modified in place - a tensor hook on it would never
    fire either. For a view with all its base's elements, the base's node receives the same
    values, so its pre-hook records them when the view's own did not fire.
    """

    __slots__ = ("watch", "keys", "step", "generation", "output", "base_output", "fired")

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.keys: list[tuple[str, int, str, tuple[int, ...]]] = []  # (path, call, leaf name, shape) per call site
        self.step, self.generation = watch.step_index, watch._generation
        self.output = self.base_output = 0
        self.fired = False

    def tensor_hook(self, grad: torch.Tensor) -> None:
        self.watch._record_grad(self, grad)

    def node_hook(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        self.fired = True
        self.watch._record_grad(self, grads[self.output])

    def base_hook(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        if not self.fired:  # the view was modified in place: its node is no longer in the graph
            self.fired = True
            self.watch._record_grad(self, grads[self.base_output])


def _warn(message: str) -> None:
    """A RuntimeWarning that never raises into training or the store's writer (where warnings
    are turned into errors, the failure is still in ``Watch.errors``)."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        pass


def _weakly(method: Callable, *bound: Any) -> Callable:
    """A hook that calls ``method(*bound, *args)`` while ``method``'s watch lives, and does nothing
    after: torch's hook dicts hold it, and must not keep the watch alive."""
    watch_ref, function = weakref.ref(method.__self__), method.__func__

    def hook(*args: Any) -> Any:
        watch = watch_ref()
        return None if watch is None else function(watch, *bound, *args)

    return hook


def _run_eagerly(hook: Callable) -> Callable:
    """``hook``, marked for torch.compile to call as it is (in a graph break) and to trace nothing
    that it calls: what ``torch.compiler.disable`` does, without its wrapper, which costs ~0.7 us a
    call (measured warm) on every module call of every model.

    The mark is dynamo's own: the attribute by which it recognizes a disabled function while
    tracing, and a skip of the frames of ``hook``'s code and of all they call (what the wrapper
    sets up each call), kept on the code object. Without it (a torch that lacks it), the wrapper.
    """
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
        set_code_exec_strategy(hook.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except (ImportError, AttributeError, TypeError):
        return torch.compiler.disable(hook)
    hook._torchdynamo_disable = True
    return hook


def _remove_hooks(handles: list, fresh_hook_dicts: list[nn.Parameter]) -> None:
    """Take a watch's hooks out of torch's hook dicts (on close(), or when the watch is collected)."""
    for handle in handles:
        handle.remove()
    handles.clear()
    # the parameters' hook dicts as we found them (torch keeps the C++ hook it made to call the
    # dict, now empty: it has no way to remove one, as after any register_... and remove())
    for param in fresh_hook_dicts:
        if not param._post_accumulate_grad_hooks:
            param._post_accumulate_grad_hooks = None
    fresh_hook_dicts.clear()


def _common_prefix(a: str, b: str) -> list[str]:
    out = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        out.append(x)
    return out


def watch(model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None, every: int = 1,
          activations: bool = True, gradients: bool = True, parameters: bool = True,
          parameter_grads: bool = True, histograms: bool = False, bins: int = 32,
          recorder: Recorder | None = None, store: str | Path | None = None,
          metadata: dict[str, Any] | None = None, start_step: int = 1) -> Watch:
    """Watch a module: record activations and gradients per call site, step by step.

    ::

        with workbench.watch(model) as w:
            for batch in data:
                loss = objective(model(batch)); loss.backward(); opt.step(); opt.zero_grad()
                w.step(loss=loss.item())
        w.to_pandas()

    Args:
        model: any ``torch.nn.Module``.
        modules: which call sites to record: a glob on the module path
            (``"*"``, ``"resblocks.*"``), a list of globs, or a predicate
            ``path -> bool``. The model itself has the path ``""``.
        exclude: call sites to leave out, in the same forms.
        every: record every Nth step (the 1st, N+1th ...); in between the
            hooks return at once.
        activations: record module outputs (every tensor leaf of a structured output).
        gradients: record gradients w.r.t. module outputs (in training mode
            with grad enabled).
        parameters: record parameter values, once per recorded step.
        parameter_grads: record parameter gradients, once per backward.
        histograms: also record a histogram of every tensor.
        bins: histogram bins.
        recorder: publish into this Recorder (default: a new one).
        store: a run directory to write the run into (SQLite, crash-safe);
            read it back with ``workbench.load_run(store)``.
        metadata: facts stored with the run (model name, config ...).
        start_step: the number of the first step.

    Returns:
        A :class:`Watch`; a context manager. ``close()`` removes every hook.

    Raises:
        TypeError: ``model`` is not a module, or an option has the wrong type.
        ValueError: ``every``/``bins`` not positive, or ``modules`` selects nothing.
    """
    return Watch(model, modules=modules, exclude=exclude, every=every, activations=activations,
                 gradients=gradients, parameters=parameters, parameter_grads=parameter_grads,
                 histograms=histograms, bins=bins, recorder=recorder, store=store, metadata=metadata,
                 start_step=start_step)
