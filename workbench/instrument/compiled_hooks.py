"""The hooks of a watch on a compiled model: :class:`CompiledHooks`, with the interface of
:class:`~workbench.instrument.hooks.Hooks` that the :class:`~workbench.instrument.watch.Watch`
facade drives (``start_step``, ``end_step``, ``sums.rows()``, ``update``, ``interventions``,
``fail``, ``close``).

- Every call of the compiled model goes through :meth:`CompiledHooks._call` (set as the compiled
  callable: :func:`~workbench.instrument.torch_internals.compiled_entry`), which gives the call
  its list and probe (:mod:`~workbench.instrument.compiled_graph`) and keeps them for the step.
- :meth:`CompiledHooks.end_step` names the rows (module path, call index in order of the calls,
  kind, leaf, shape), reads the probes' gradients and moves the in-graph rows to the host in one
  transfer.
- With histograms, each compiled call gets the fixed ranges of the rows it makes (:class:`CallRanges`:
  by their place in the call, and the call's place in the step), kept or renewed from step to step
  as the eager watch's are: the same bins as the eager watch's rows.
- Parameters and their gradients are outside the graphs: reduced by a
  :class:`~workbench.instrument.reduce.StepSums`, parameter gradients when each backward ends
  (post-accumulate-grad hooks), values at the end of the step.
- Where no module call of the first recorded step ran inside a compiled graph (dynamo skips the
  model) or compiling fails with the hooks traced in, the hooks ask to be replaced by the eager
  ones (``hand_over``), saying why.
"""

from __future__ import annotations

import math
import traceback
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.instrument import torch_internals as internals
from workbench.instrument.compiled_graph import (MADE, SAMPLED, GraphState, hold_passes_of, holds_passes,
                                                 make_hooks, observe, release_passes_of, row_width)
from workbench.instrument.hooks import (MAX_HELD_PASSES, Entry, _remove_hooks, attached, hook_param_grads, reattach,
                                        replaced_message, unpaused_evaluation_message, warn)
from workbench.instrument.interventions import Intervention
from workbench.instrument.reduce import StepSums, next_ranges
from workbench.instrument.schema import ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, SUMS, site_name
from workbench.instrument.sites import CallSites
from workbench.instrument.tree import shape_of

__all__ = ["CompiledHooks", "MAX_CALLS_PER_STEP"]

#: Calls of the compiled model within one recorded step past which the step is taken to have been
#: forgotten (a loop that never calls ``w.step()``): each call keeps its rows' probe tensors until the
#: step ends. Past it nothing more of the step is recorded (memory stays bounded), with a warning.
MAX_CALLS_PER_STEP = 1000


class StepRows:
    """A step's rows: those computed in the graphs (``graph``, on the host once the step ends),
    then those of the parameters (``params``); an entry's row indexes the two in that order."""

    def __init__(self, bins: int) -> None:
        self.bins = bins
        self.params = StepSums(bins or None, fixed_ranges=True)
        self.reset()

    def reset(self) -> None:
        self.graph = np.zeros((0, row_width(self.bins)))
        self.graph_edges = np.zeros((0, 2))  # the fixed range each graph row was binned over (NaN: its own)
        self.params.reset()

    def rows(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Host copies of the sums ``(rows, 9)`` and histogram counts ``(rows, bins)`` (or None)."""
        sums, counts = self.params.rows()
        all_sums = np.concatenate([self.graph[:, :len(SUMS)], sums])
        if not self.bins:
            return all_sums, None
        return all_sums, np.concatenate([self.graph[:, len(SUMS):len(SUMS) + self.bins], counts])

    def binning(self) -> tuple[np.ndarray, np.ndarray] | None:
        """As :meth:`StepSums.binning <workbench.instrument.reduce.StepSums.binning>`, for the graphs'
        rows (over their fixed range, or their own [min, max]; sampled as the row says) and the
        parameters'."""
        found = self.params.binning()
        if found is None:
            return None
        edges, sampled = found
        own = self.graph[:, [SUMS.index("min"), SUMS.index("max")]]
        graph = np.where(np.isfinite(self.graph_edges).all(axis=1)[:, None], self.graph_edges, own)
        return np.concatenate([graph, edges]), np.concatenate([self.graph[:, SAMPLED] > 0, sampled])


class CallRanges:
    """The fixed histogram ranges of the rows one compiled call makes, matched from step to step by
    the call's place in its step and each row's place in the call: ``activations`` and ``probe``
    (its probe's rows), (rows, 2) float64, NaN where a row bins over its own range. ``on_device``
    holds them on the model's device, uploaded when they are made (at the end of a step, which
    waits for the device anyway), so that a compiled call starts without a transfer."""

    def __init__(self, activations: np.ndarray, probe: np.ndarray, device: torch.device) -> None:
        self.activations, self.probe = activations, probe
        self.on_device = (torch.from_numpy(activations).to(device), torch.from_numpy(probe).to(device))

    @classmethod
    def empty(cls, activations: int, probe: int, device: torch.device) -> CallRanges:
        return cls(np.full((activations, 2), np.nan), np.full((probe, 2), np.nan), device)

    def resized(self, activations: int, probe: int, device: torch.device) -> CallRanges:
        """These ranges, with room for at least ``activations`` and ``probe`` rows (NaN in the new ones)."""
        return CallRanges(_grown(self.activations, activations), _grown(self.probe, probe), device)

    def after(self, activation_sums: np.ndarray, probed: list[int], probe_sums: np.ndarray,
              device: torch.device) -> CallRanges:
        """The ranges for the next step, from this step's rows binned over these: ``activation_sums``
        (the call's activation rows in order) and ``probe_sums`` (the rows of probe rows ``probed``),
        kept or renewed by :func:`~workbench.instrument.reduce.next_ranges`. Rows this step did not
        make (and probe rows that got no gradient) keep theirs, as the eager watch's rows do."""
        activations = _grown(self.activations, len(activation_sums))
        rows = len(activation_sums)
        activations[:rows] = next_ranges(activation_sums[:, :len(SUMS)], activations[:rows])
        probe = self.probe.copy()
        arrived = probe_sums[:, MADE] > 0
        given = [row for row, made in zip(probed, arrived) if made]
        probe[given] = next_ranges(probe_sums[arrived, :len(SUMS)], self.probe[given])
        return CallRanges(activations, probe, device)


def _grown(ranges: np.ndarray, rows: int) -> np.ndarray:
    """A copy of ``ranges`` with at least ``rows`` rows (NaN in the new ones)."""
    grown = np.full((max(len(ranges), rows), 2), np.nan)
    grown[:len(ranges)] = ranges
    return grown


class CompiledHooks:
    """The hooks of a watch on a compiled model, and the step they record into.

    Args:
        entry: the compiled model's entry (its calls go through :meth:`_call` until :meth:`close`).
        sites: names the module calls; the model's root is recorded around each compiled call.
        kinds: kind -> the paths whose tensors of that kind are recorded (no ``update`` kind).
        bins: histogram bins, or None.
        capacity: gradient rows per compiled call (None: twice the module paths, and some).
        on_hand_over: called with the reason where compiling the model with the hooks failed (the
            eager hooks take over, and the call runs again).
        wanted: the kinds the watch's options ask for (default: those with a path in ``kinds``): a
            module or parameter that appears after the start is recorded in these.

    The model may change under the watch, as under the eager one (a checkpoint loaded with
    ``load_state_dict(assign=True)``, a submodule swapped, a parameter unfrozen): compared at each
    recorded step (:meth:`_check_frozen`, :meth:`_check_structure`), re-attached where it did.
    """

    def __init__(self, entry: internals.CompiledEntry, sites: CallSites, kinds: dict[str, set[str]],
                 bins: int | None, capacity: int | None, on_hand_over: Callable[[str], None],
                 wanted: set[str] | None = None) -> None:
        self.sites, self.kinds, self.entry = sites, kinds, entry
        self._wanted = {kind for kind, paths in kinds.items() if paths} if wanted is None else set(wanted)
        self.bins = bins or 0
        self.errors: list[dict[str, Any]] = []
        self.step_errors: list[dict[str, Any]] = []
        self.step_index, self.recording, self.paused, self.closed = 0, False, 0, False
        self.interventions: dict[str, list[Intervention]] = {}
        #: why the eager hooks should record from the next step on (None while the model compiles)
        self.hand_over: str | None = None
        self._on_hand_over = on_hand_over
        self._capacity_given = capacity is not None
        self._capacity = capacity or 2 * len(sites.paths) + 16
        self._device = next((p.device for p in sites.model.parameters()), torch.device("cpu"))
        self._checked = False  # the calls of the first recorded step with calls were looked at
        # path -> (leaf name, shape) of the floating-point outputs recorded
        self._shapes: dict[str, set[tuple[str, tuple]]] = defaultdict(set)
        self.params = sites.parameters()
        self.sums = StepRows(self.bins)
        self._ranges: list[CallRanges] = []  # with histograms: for each compiled call of a step, by its place
        self.state = GraphState(sites, self.bins)
        self._set_sites()
        pre_hook, hook = make_hooks(self.state)
        # (the pre-hook keeps the stack of a model with a shared module: put in where the model has
        # one, as a module swapped in later may add the containers that need it)
        handles = internals.register_module_hooks(hook, pre_hook if sites.needs_stack else None, traced=True)
        internals.compile_again()  # (graphs the model compiled before the watch would never call the hooks)
        self._breaks_before = internals.graph_break_counts()  # (a warning names this model's breaks alone)
        self._handles, self._fresh = handles, []  # (every hook in, as the finalizer removes them)
        self._param_handles: dict[int, Any] = {}  # id(parameter) -> the handle of its gradient hook
        self._hook_params()
        self._structure = sites.structure()
        self._check_due = False  # the recorded step has not compared the parameters' flags yet
        self._change_reported = False
        self._eval_reported = False  # an unpaused evaluation call warned
        self._repeats_reported = False  # gradients of several passes, the first freeing the graph, warned
        self._held_reported = False  # gradients held for MAX_HELD_PASSES forwards let go, warned
        self._calls_reported = False  # MAX_CALLS_PER_STEP warned
        self._full = False  # the step made MAX_CALLS_PER_STEP recorded calls: no more of it is recorded
        inner_call, ref = entry.call, weakref.ref(self)

        def call(*args: Any, **kwargs: Any) -> Any:
            hooks = ref()
            return inner_call(*args, **kwargs) if hooks is None else hooks._call(inner_call, args, kwargs)

        entry.set_call(call)
        self._release = weakref.finalize(self, _release, handles, self._fresh, entry, call, inner_call)

    def _hook_params(self) -> None:
        """Hook the recorded parameters' gradients as they are now (:func:`hook_param_grads`)."""
        hook_param_grads(self.params, self.kinds[PARAM_GRAD] if PARAM_GRAD in self._wanted else set(),
                         self._on_param_grad, self._param_handles, self._handles, self._fresh)

    def _check_frozen(self) -> None:
        """Hook the gradients of parameters unfrozen since the last look, unhook those frozen: at the
        first call of the compiled model in a recorded step (only flags are compared, as the eager
        watch compares them there)."""
        flags = self.sites.requires_grad()
        if flags == self._structure[1]:
            return
        try:
            self._structure = (self._structure[0], flags)
            self._hook_params()
        except Exception as exc:  # never into training
            self.fail("", 0, "structure", exc, disable=False)

    def _check_structure(self) -> None:
        """Re-attach to the model as it is now when its parameters or modules were replaced, added or
        removed (or (un)frozen) since the last look: at the end of each recorded step, the model at
        rest, before its parameters are read. Its new modules are named and recorded from the next
        step (the traced hooks' tables are made anew: the graphs that read them recompile once), its
        current parameters read from this step and their gradients hooked. Warned of once per watch,
        as the eager watch warns."""
        if self.sites.structure() == self._structure:
            return
        try:
            before, self.params, changed = reattach(self.sites, self.params, self.kinds, self._wanted)
            self._structure = self.sites.structure()
            self._hook_params()
            if before[0] != attached(self.sites, ())[0]:  # (the modules changed: the graphs' tables too)
                self.state.index(self.sites)
                self._set_sites()
                self._ranges = []  # (a call's rows may lie elsewhere now: each bins over its own range once)
                if not self._capacity_given:
                    self._capacity = max(self._capacity, 2 * len(self.sites.paths) + 16)
        except Exception as exc:  # never into training
            self.fail("", 0, "structure", exc, disable=False)
            return
        if changed and not self._change_reported:
            self._change_reported = True
            warn(replaced_message(changed, "watch()"))

    def _set_sites(self) -> None:
        # (new sets only when a site fails: dynamo guards on them, a change recompiles)
        self.state.activation_sites = frozenset(self.kinds[ACTIVATION])
        self.state.grad_sites = frozenset(self.kinds[GRAD_OUTPUT])

    # ------------------------------------------------------------------ the step
    def start_step(self, step_index: int, recording: bool) -> None:
        """Start recording step ``step_index`` (``recording``: rows are taken, else only patches apply)."""
        self._take_failed_patches()  # (of direct calls of the uncompiled model)
        self._check_patched_calls()
        self._calls_before = 0  # the step's calls before its calls were counted from 0 again (record_rest_of_step)
        self.state.calls.clear()  # (the same dict: the traced hooks hold it)
        self._start(step_index, recording)

    def record_rest_of_step(self) -> None:
        """Record the step in progress from here on (``Watch.record_next`` part-way through a step), as the eager
        hooks do (``Hooks.record_rest_of_step``): its rows count calls from 0, while a patch of one call keeps
        counting the step's calls from its start (``state.calls``), so that it applies to that call once, and
        :meth:`calls_made` too."""
        self._take_failed_patches()
        self._calls_before += self._calls_made
        self._start(self.step_index, True)

    def _start(self, step_index: int, recording: bool) -> None:
        self._release_probes()
        self.step_index, self.recording = step_index, recording
        self.step_errors = []
        self._calls_made = 0  # every call since the step (or its recording) started, recorded or not (see _call)
        # per compiled call: its rows, its probe, the ranges its rows were binned over (with histograms)
        self._calls: list[tuple[list, torch.Tensor | None, CallRanges | None]] = []
        self._pending_grads: list[tuple[str, str, torch.Tensor]] = []  # until the backward ends
        self._param_grads: dict[tuple[str, str], Entry] = {}
        self._flush_queued = False
        self.sums.reset()
        self._check_due = recording
        self._full = False
        # whether the step's first call of the model trained (training mode, grad enabled), and any did
        self._first_call_trained: bool | None = None
        self._a_call_trained = False
        self.update()

    def _release_probes(self) -> None:
        """Let go of the gradients the step's probes held for backward passes still to come (``retain_graph=True``:
        :func:`~workbench.instrument.compiled_graph.hold_passes_of`): the step's rows are taken."""
        for _, probe, _ in getattr(self, "_calls", ()):
            if probe is not None:
                release_passes_of(probe)

    def ran(self) -> bool:
        """Whether the step so far (since :meth:`record_rest_of_step`, if called) called the compiled model (see
        ``Hooks.ran``): every call goes through :meth:`_call`, so this tells in a step not recorded too (the eager
        hooks, out there, cannot)."""
        return bool(self._calls_made)

    #: every call of the step is counted (see ``Hooks.calls_uncounted``)
    calls_uncounted = False

    def calls_made(self, path: str | None = None) -> int:
        """The calls of the compiled model the step made so far, recorded or not, whatever ``path`` (see
        ``Hooks.calls_made``): its sites' calls are not counted one by one, each is taken to be called once per
        call of the model."""
        return self._calls_made + self._calls_before

    def update(self) -> None:
        """What the traced hooks see: whether the step records, and the patches (none while paused)."""
        st = self.state
        live = not self.closed and not self.paused
        st.recording = live and self.recording and not self._full
        st.patches = ({path: tuple((i.fn, i.call) for i in items) for path, items in self.interventions.items()}
                      if live else {})
        st.counted = {path: max(2, max(at for _, at in items if at is not None) + 1)
                      for path, items in st.patches.items() if any(at is not None for _, at in items)}

    #: in a process forked from the one that made the watch: called at each call of the model there (see forked_off)
    on_forked_call: Callable[[], None] | None = None

    def forked_off(self, on_call: Callable[[], None]) -> None:
        """In a process forked from the one that made the watch: record nothing (the step in progress is the
        parent's; patches still apply), each call of the model calling ``on_call``."""
        self.on_forked_call = on_call
        self.recording = False
        self.update()

    def _call(self, inner_call: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the compiled model, with its rows and probe kept for the step."""
        if self.on_forked_call is not None:
            self.on_forked_call()
        st = self.state
        self._calls_made += 1
        if self._check_due:  # the first call of a recorded step
            self._check_due = False
            self._check_frozen()
        if not (st.recording or st.patches):
            return inner_call(*args, **kwargs)  # the model's own graph
        if st.recording and len(self._calls) >= MAX_CALLS_PER_STEP:  # w.step() forgotten? The step stops growing
            self._too_many()
            if not st.patches:
                return inner_call(*args, **kwargs)
        if st.recording:  # (an evaluation pass left unpaused, before the training calls? see end_step)
            trained = self.sites.model.training and torch.is_grad_enabled()
            if self._first_call_trained is None:
                self._first_call_trained = trained
            self._a_call_trained = self._a_call_trained or trained
        out: list = []
        probe = None
        if st.recording and st.grad_sites and torch.is_grad_enabled():
            # (written in the backward by the outputs' gradient hooks: compiled_graph.hook_gradient)
            probe = torch.zeros((self._capacity, row_width(self.bins)), dtype=torch.float64, device=self._device)
            self._let_go_of_old_totals()
            hold_passes_of(probe)  # (several backward passes: the row of their total, as the eager watch's)
        ranges = None
        if st.recording and self.bins:  # (tensors always, NaN at first: one graph variant)
            ranges = self._ranges_of_call(len(self._calls))
            st.edges, st.probe_edges = ranges.on_device
        st.out, st.probe, st.probed, st.activation_rows, st.stack = out, probe, [], [], [st.root_path]
        try:
            result = inner_call(*args, **kwargs)
        except Exception as exc:
            st.out = st.probe = st.edges = st.probe_edges = None
            st.stack = [st.root_path]  # (what a call that raised left on it names no later module)
            if probe is not None:
                release_passes_of(probe)
            if not internals.is_compile_error(exc) or self._checked:
                raise
            patched = bool(self.interventions)
            self._on_hand_over("compiling the model with the watch's hooks failed "
                               f"({type(exc).__name__}: {exc})")
            try:
                return inner_call(*args, **kwargs)  # (the eager hooks in)
            except Exception as again:
                if not internals.is_compile_error(again):
                    raise
                raise RuntimeError(
                    "workbench.watch: compiling the model with the watch's hooks failed "
                    f"({type(exc).__name__}: {_first_line(exc)}), and so did the eager watch that took over "
                    f"({type(again).__name__}: {_first_line(again)}): its hooks run in graph breaks, which a model "
                    "compiled with torch.compile(..., fullgraph=True) refuses. Compile it without fullgraph=True to "
                    "watch it" + (", and look at the patches in place (w.intervention_log()): one that dynamo "
                                  "cannot trace fails the compile" if patched else "") + ".") from again
        except BaseException:
            st.out = st.probe = st.edges = st.probe_edges = None
            st.stack = [st.root_path]  # (what a call that raised left on it names no later module)
            if probe is not None:
                release_passes_of(probe)
            raise
        try:  # the model's own output, outside its graph
            replaced = observe(st, st.root_path, self.sites.model, result, None)
            if replaced is not None:
                result = replaced
        except Exception as exc:
            self.fail(st.root_path, None, ACTIVATION, exc)
        finally:
            st.out = st.probe = st.edges = st.probe_edges = None
        self._take_failed_patches()
        if st.recording:
            self._calls.append((out, probe, ranges))
        return result

    def _let_go_of_old_totals(self) -> None:
        """Keep the gradients held for later backward passes (``retain_graph=True``) of the step's last
        :data:`~workbench.instrument.hooks.MAX_HELD_PASSES` forwards alone: a loop that keeps the graph on every
        backward and forgets ``w.step()`` would otherwise hold one gradient per hooked output of every call, up to
        :data:`MAX_CALLS_PER_STEP` calls. The rows of the forwards let go are those of the passes so far (each pass
        sets its total's row); a later pass through them is left out (:meth:`_leave_out_repeated_backwards`), as
        the eager watch does past its limit, with a warning once per watch."""
        holding = [probe for _, probe, _ in self._calls if probe is not None and holds_passes(probe)]
        if len(holding) < MAX_HELD_PASSES:
            return
        for probe in holding[:len(holding) - MAX_HELD_PASSES + 1]:
            release_passes_of(probe)
        if not self._held_reported:
            self._held_reported = True
            warn(f"workbench: backward passes keeping the graph (retain_graph=True) within step {self.step_index} "
                 f"held the output gradients of {len(holding)} calls of the model for another pass: the oldest are "
                 "recorded as they are and let go, and a later pass through those forwards is left out. Is "
                 "w.step() called after each training step? Said once per watch.")

    def _too_many(self) -> None:
        """Past :data:`MAX_CALLS_PER_STEP` calls of the model in one recorded step: nothing more of
        the step is recorded (its rows and probes are kept until it ends), with a warning (once per
        watch) and an error, as the eager watch does past its limits of backward passes and rows."""
        self._full = True
        self.update()
        if not self._calls_reported:
            self._calls_reported = True
            message = (f"the model was called {len(self._calls) + 1} times within step {self.step_index}: is "
                       f"w.step() called after each training step? Past {MAX_CALLS_PER_STEP} calls in one step "
                       "nothing more of the step is recorded. Call w.step() after loss.backward() and the "
                       "optimizer step")
            self.fail(self.state.root_path, None, "step", RuntimeError(message), disable=False, say=False)
            warn(f"workbench: {message}.")

    def _ranges_of_call(self, index: int) -> CallRanges:
        """The fixed ranges for the rows of the ``index``-th compiled call of the step: those the
        call at that place left when a step last reached it, with room for a probe of the current
        capacity (a larger tensor: one recompile)."""
        if index == len(self._ranges):
            self._ranges.append(CallRanges.empty(self._capacity, self._capacity, self._device))
        ranges = self._ranges[index]
        if len(ranges.probe) < self._capacity:
            ranges = self._ranges[index] = ranges.resized(0, self._capacity, self._device)
        return ranges

    def end_step(self, parameters: bool) -> list[Entry]:
        """The step's entries, their rows in ``sums`` (``parameters``: read the parameters' values now)."""
        self._end_of_backward()  # (gradients whose hooks ran outside a backward)
        self._check_due = False
        self._remove_unknown_call_patches()
        entries = self._graph_entries()
        self._release_probes()
        self._check_structure()  # (once this step's rows are named; before the parameters are read)
        if not self._eval_reported and self._first_call_trained is False and self._a_call_trained:
            self._eval_reported = True
            warn(unpaused_evaluation_message(self.step_index, self.sites.model))
        offset = len(self.sums.graph)
        if parameters:
            items = [item for item in self.params if item[0] in self.kinds[PARAM]]
            try:
                rows = self.sums.params.add_many([param.detach() for _, _, param in items])
                self.sums.params.flush()
                entries.extend(((module_path, 0, PARAM, name, shape_of(param)), param.numel(), offset + row)
                               for (module_path, name, param), row in zip(items, rows))
            except Exception as exc:
                self.fail("", 0, PARAM, exc, disable=False)
        entries.extend((key, numel, offset + row) for key, numel, row in self._param_grads.values())
        return entries

    def _graph_entries(self) -> list[Entry]:
        """Entries of the rows the compiled calls made, in the order of the calls; their rows moved to
        the host (``sums.graph``) in one transfer."""
        entries: list[Entry] = []
        grad_keys: list[tuple[tuple, int]] = []
        own_rows: list[int] = []  # of each gradient row from a view's base, the index of the view's own (else -1)
        pieces: list[torch.Tensor] = []  # device rows, activations first
        grad_pieces: list[torch.Tensor] = []
        calls: dict[str, int] = defaultdict(int)
        compiled = eager = 0
        outside: dict[str, None] = {}  # the paths of the calls that ran outside the graphs, in order
        overflow = False
        per_call: list[tuple[int, list[int]]] = []  # each call's count of activation rows, its probe rows used
        for out, probe, _ in self._calls:
            grad = probe  # (its rows, written by the backward; a row without a gradient is all zeros)
            used: list[int] = []
            before = len(entries)
            for path, names, shapes, rows, probed, from_base, in_graph, floating in out:
                compiled += in_graph is True
                eager += in_graph is False
                if in_graph is False:
                    outside[path] = None
                call = calls[path]
                calls[path] = call + 1
                if rows is not None:
                    pieces.append(rows)
                for name, shape, row, base_row, is_float in zip(names, shapes, probed, from_base, floating):
                    if is_float:  # (ablate zeroes floating-point tensors alone)
                        self._shapes[path].add((name, shape))
                    if rows is not None:
                        entries.append(((path, call, ACTIVATION, name, shape), math.prod(shape), len(entries)))
                    overflow |= row == -2 or base_row == -2
                    if row >= 0 and grad is not None:
                        key = (path, call, GRAD_OUTPUT, name, shape)
                        grad_keys.append((key, math.prod(shape)))
                        own_rows.append(-1)
                        used.append(row)
                        if base_row >= 0:
                            grad_keys.append((key, math.prod(shape)))
                            own_rows.append(len(grad_keys) - 2)
                            used.append(base_row)
            if used:  # (rows are taken in increasing order from 0: the first ones, a slice without an upload)
                k = len(used)
                grad_pieces.append(grad[:k] if used[-1] == k - 1 else grad[torch.tensor(used, device=grad.device)])
            per_call.append((len(entries) - before, used))
        if overflow:
            self._capacity *= 2
            self.fail("", 0, GRAD_OUTPUT, RuntimeError(
                f"more outputs needed a gradient row than the probe holds; it holds {self._capacity} from the next "
                "step on (one recompile); the gradients beyond the old capacity were not recorded this step"),
                disable=False)
        self._note_compiled(compiled, eager, list(outside))
        if pieces or grad_pieces:  # the one host transfer of the in-graph rows
            self.sums.graph = torch.cat(pieces + grad_pieces).to("cpu", torch.float64).numpy()
        first = len(entries)  # the gradients' rows follow the activations'
        self._leave_out_repeated_backwards(self.sums.graph[first:first + len(grad_keys)], grad_keys)
        arrived = self.sums.graph[first:, MADE] > 0  # a probe row without a gradient is no row
        # a view's row from its base stands in for its own row where that got no gradient (an in-place op on
        # the view took the view's node out of the graph), as in the eager watch (GradientHook)
        entries.extend((key, numel, first + i) for i, ((key, numel), own) in enumerate(zip(grad_keys, own_rows))
                       if arrived[i] and (own < 0 or not arrived[own]))
        if self.bins:
            self._binned_over(per_call, first)
        return entries

    def _leave_out_repeated_backwards(self, grads: np.ndarray, keys: list[tuple[tuple, int]]) -> None:
        """Mark as not made (in place) the probe rows ``grads`` that several backward passes through one forward
        reached where the first freed the graph (a graph whose nodes save no tensor runs again without
        ``retain_graph``): nothing held that pass's gradient (passes that keep the graph hold theirs, and record
        the row of the total: ``compiled_graph.add_row``), so the probe's row adds the passes' rows up, their
        sums, counts, min and max too, which describe no tensor. Each step that has them says so in ``errors``
        (with a warning the first time), as the eager watch leaves out the rows it cannot total."""
        repeated = grads[:, MADE] > 1
        if not repeated.any():
            return
        called_again = {path for (path, call, *_), _ in keys if call > 0}  # (named as the views name them)
        sites = list(dict.fromkeys(site_name(path, call, name, path in called_again)  # (a view's two rows: one)
                                   for ((path, call, _, name, _), _), r in zip(keys, repeated) if r))
        self.fail("", None, GRAD_OUTPUT, RuntimeError(
            f"the output gradients of {len(sites)} call site(s) ({', '.join(sites[:3])}{' ...' * (len(sites) > 3)}) "
            "came from several backward passes through one forward, the first of which freed the graph (no "
            "retain_graph=True): its gradient was gone when the next came, so their total cannot be recorded and "
            f"they are left out of step {self.step_index}. Pass retain_graph=True to every backward but the last, "
            "or back-propagate the sum of the losses once ((loss1 + loss2).backward())"),
            disable=False, say=not self._repeats_reported)
        self._repeats_reported = True
        grads[repeated, MADE] = 0  # (no row, and no histogram range from it)

    def _binned_over(self, per_call: list[tuple[int, list[int]]], first: int) -> None:
        """Set ``sums.graph_edges``, the range each graph row was binned over (activation rows from
        0, gradient rows from ``first``, call by call), and the ranges of the next step's calls."""
        graph = self.sums.graph
        activation_edges, grad_edges = [], []
        activations_at, grads_at = 0, first
        for index, ((count, used), (_, _, ranges)) in enumerate(zip(per_call, self._calls)):
            over = np.full((count, 2), np.nan)  # (rows past the call's ranges: their own range)
            rows = min(count, len(ranges.activations))
            over[:rows] = ranges.activations[:rows]
            activation_edges.append(over)
            grad_edges.append(ranges.probe[used])
            self._ranges[index] = ranges.after(graph[activations_at:activations_at + count], used,
                                               graph[grads_at:grads_at + len(used)], self._device)
            activations_at, grads_at = activations_at + count, grads_at + len(used)
        self.sums.graph_edges = np.concatenate(activation_edges + grad_edges) if per_call else np.zeros((0, 2))

    def _take_failed_patches(self) -> None:
        """Take out the patches that raised (the model ran on unpatched), each kept in ``errors`` and
        warned of at the line that made it, as the eager watch does."""
        failed, self.state.failed[:] = list(self.state.failed), []
        for path, fn, call, exc, output in failed:
            for intervention in [i for i in self.interventions.get(path, ()) if i.fn is fn]:
                self.fail(path, call, f"patch:{intervention.label}", exc, disable=False, say=False)
                intervention.fail(self.errors[-1], output)

    def _check_patched_calls(self) -> None:
        """A patch of call ``k`` of a module that the step just ended called, but fewer than ``k + 1``
        times, patched nothing: it fails (removed, with a warning), as in the eager watch. (The calls
        of a path with such a patch are counted up to ``k + 1``: :attr:`GraphState.counted`.)"""
        for path, items in tuple(self.interventions.items()):
            made = self.state.calls.get(path, 0)
            for intervention in tuple(items):
                if intervention.call is not None and 0 < made <= intervention.call:
                    self.fail(path, intervention.call, f"patch:{intervention.label}", ValueError(
                        f"the step called {path!r} {made} time(s): it has no call {intervention.call}, and the patch "
                        f"applied to nothing. Patch a call from 0 to {made - 1}, or every call (call=None)"),
                        disable=False, say=False)
                    intervention.fail(self.errors[-1])

    def _remove_unknown_call_patches(self) -> None:
        """Take out the patches of one call at sites that activation checkpointing recomputed without
        telling which call (the forward called them several times), saying so: the recomputation ran
        unpatched, and the step's gradients do not match its forward."""
        paths = sorted(self.state.unknown_calls)
        self.state.unknown_calls.clear()
        for path in paths:
            for intervention in [i for i in self.interventions.get(path, ()) if i.call is not None]:
                self.fail(path, intervention.call, f"patch:{intervention.label}", RuntimeError(
                    f"activation checkpointing recomputes {path!r}, which the forward called several times: a "
                    f"patch of call {intervention.call} cannot tell which call is recomputed, and this step's "
                    "gradients do not match its forward. Patch every call (call=None), or a site outside the "
                    "checkpointed segment."), disable=False)
                intervention.fail(self.errors[-1])  # (the log says it failed at this step)

    def _note_compiled(self, compiled: int, eager: int, outside: list[str]) -> None:
        """After the first recorded step with calls: warn of calls that ran outside dynamo's graphs,
        and ask for the eager hooks where none ran inside."""
        if self._checked or not (compiled or eager):
            return
        self._checked = True
        if not compiled:
            reasons = internals.graph_break_reasons(since=self._breaks_before)
            self.hand_over = ("no module call of the model ran inside a compiled graph (dynamo skipped or broke "
                              f"every frame{': ' + reasons if reasons else ''}){self._in_place_hint()}")
        elif eager:
            shown = ", ".join(repr(path) for path in outside[:8]) + (
                f" and {len(outside) - 8} more" if len(outside) > 8 else "")
            warn(f"workbench: {eager} of {compiled + eager} module calls of the compiled model ran outside "
                 f"dynamo's graphs (graph breaks in the model, at {shown}); they are recorded eagerly, the rest "
                 "inside the compiled graphs. torch._dynamo.explain(model)(*inputs) tells why dynamo breaks there.")

    def _in_place_hint(self) -> str:
        """What to say of a model that ran no compiled code where it is one of torch.nn's own classes
        compiled in place (``nn.Sequential(...).compile()``): dynamo skips the frames of torch.nn's
        files, so such a model runs uncompiled whether watched or not, which the fallback alone would
        leave the user to blame on the watch."""
        model = self.entry.module
        if self.entry.attribute != "_compiled_call_impl" or not type(model).__module__.startswith("torch.nn."):
            return ""
        name = type(model).__name__
        return (f". {name} is a class of torch.nn compiled in place (model.compile()), whose frames dynamo skips: "
                f"it runs uncompiled unwatched too. To run it compiled, compile a wrapper, compiled = "
                f"torch.compile(model), and watch and call that, or compile a module class of your own in place")

    def output_shapes(self, path: str) -> set[tuple[str, tuple]]:
        """The leaf names and shapes of the floating-point outputs (those ``ablate`` zeroes) recorded at
        ``path`` so far (none before a recorded step)."""
        return set(self._shapes.get(path, ()))

    # ------------------------------------------------------------------ parameter gradients
    def _on_param_grad(self, module_path: str, name: str, param: nn.Parameter) -> None:
        if not self.state.recording or module_path not in self.kinds[PARAM_GRAD] or param.grad is None:
            return
        self._pending_grads.append((module_path, name, param.grad))
        if not self._flush_queued:
            self._flush_queued = internals.queue_end_of_backward(self._end_of_backward)

    def _end_of_backward(self) -> None:
        """Reduce the parameter gradients now, before ``zero_grad`` may zero them in place."""
        self._flush_queued = False
        pending, self._pending_grads = self._pending_grads, []
        if not pending:
            return
        try:
            rows = self.sums.params.add_many([grad for _, _, grad in pending])
            self.sums.params.flush()
        except Exception as exc:
            self.fail("", 0, PARAM_GRAD, exc, disable=False)
            return
        for (module_path, name, grad), row in zip(pending, rows):
            # the last backward of the step wins: .grad holds the accumulated total
            key = (module_path, 0, PARAM_GRAD, name, shape_of(grad))
            self._param_grads[(module_path, name)] = (key, grad.numel(), row)

    # ------------------------------------------------------------------ failures, closing
    def fail(self, path: str, call: int | None, kind: str, exc: BaseException, disable: bool = True,
             say: bool = True) -> None:
        """Keep an instrumentation failure in ``errors``, with a warning (``say``: a failed patch's
        own warning says it), and (``disable``) stop recording ``kind`` at ``path``."""
        if disable and kind in self.kinds and path in self.kinds[kind]:
            self.kinds[kind].discard(path)
            self._set_sites()
        error = {"step": self.step_index, "module": path, "call": call, "kind": kind,
                 "error": f"{type(exc).__name__}: {exc}", "traceback": "".join(traceback.format_exception(exc))}
        self.errors.append(error)
        self.step_errors.append(error)
        if say:
            warn(f"workbench: {error['error']}")

    def close(self) -> None:
        """Remove every hook and put the compiled callable back (idempotent)."""
        self.closed = True
        self._release_probes()
        self._release()
        self.interventions.clear()
        self.update()


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (dynamo's run to many lines of hints)."""
    return next(iter(str(exc).strip().splitlines()), "")


def _release(handles: list, fresh: list[nn.Parameter], entry: internals.CompiledEntry, call: Callable,
             inner_call: Callable) -> None:
    """Take the hooks out, and the model's calls back to its compiled callable (unless it was
    compiled again since)."""
    _remove_hooks(handles, fresh)
    if entry.call is call:
        entry.set_call(inner_call)
