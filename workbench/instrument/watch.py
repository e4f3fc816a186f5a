"""``Watch``: the facade a user holds. It validates the options, builds the pipeline
(:class:`~workbench.instrument.sites.CallSites` → :class:`~workbench.instrument.hooks.Hooks` →
:class:`~workbench.instrument.reduce.StepSums` → :class:`~workbench.instrument.recorder.Recorder`),
drives the step lifecycle and reads the recorded rows back. It imports no sink: :func:`workbench.watch`
(:mod:`workbench.instrument.compose`) attaches the run store.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch
from torch import nn

from workbench.instrument.hooks import Hooks, warn
from workbench.instrument.interventions import (LOG_COLUMNS, Intervention, check_units, listed, unit_index, warn_user,
                                                zero_units)
from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update
from workbench.instrument.reduce import REDUCER_NAMES, Reducer, StepSums, resolve_reducers
from workbench.instrument.schema import (ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, STATUSES, SUMS, UPDATE,
                                         anomalous, check_filter, checked_bins, whole_number)
from workbench.instrument.sites import CallSites, ModuleSelector, unwrap

__all__ = ["Watch", "Sink"]


class Sink(Protocol):
    """What a watch closes with it: something attached to its recorder (the run store)."""

    def close(self, status: str = "finished", error: str | None = None) -> None: ...


class Watch:
    """Records a module's activations, output gradients, parameters, parameter gradients and
    parameter updates, per call site, step by step. Create one with :func:`workbench.watch`.

    Attributes:
        model: the module watched (the module a ``torch.compile`` wrapper or a
            ``DistributedDataParallel`` holds).
        step_index: the step being recorded now; ``step()`` ends it.
        start_step: the number of the watch's first step (``watch(start_step=)``).
        errors: instrumentation failures, each a dict (step, module, call, kind, error,
            traceback); a failing site's kind is disabled, training goes on.
        recorder: the :class:`~workbench.instrument.recorder.Recorder` the recorded steps are
            published to.
        store: the run store attached by ``watch(store=...)``, or None.
        paths: every module path of the model.
        status: how the watch ended, as its store records it: ``running`` while open, then ``finished``,
            ``stopped`` or ``failed`` (:meth:`close`).
        error: the error a ``failed`` or ``stopped`` watch ended with, or None.
    """

    def __init__(self, model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None,
                 every: int = 1, activations: bool = True, gradients: bool = True, parameters: bool = True,
                 parameter_grads: bool = True, updates: bool = False, histograms: bool = True, bins: int = 32,
                 recorder: Recorder | None = None, start_step: int = 1,
                 reducers: Sequence[Reducer | str] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}.")
        every, bins, start_step = checked_counts(every, bins, start_step)
        flags = dict(activations=activations, gradients=gradients, parameters=parameters,
                     parameter_grads=parameter_grads, updates=updates, histograms=histograms)
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}.")
        if recorder is not None and not isinstance(recorder, Recorder):
            raise TypeError(f"recorder must be a workbench Recorder (or None for a new one), got {recorder!r}.")
        reducers = resolve_reducers(reducers)  # (before anything is hooked)
        _check_unshared(reducers, recorder)
        model, compiled = unwrap(model)  # sites named by the inner model's paths (DDP, compiled, in any order)
        _check_materialized(model)
        self.model, self.every = model, every
        self.options = dict(flags, bins=bins)
        sites = CallSites(model, modules, exclude)
        _warn_if_watched(model)  # (once the arguments are taken, before anything is attached)
        self.paths = sites.paths
        self._sites = sites
        param_paths = {module_path for module_path, _, _ in sites.parameters()}
        kinds = {ACTIVATION: set(sites.selected) if activations else set(),
                 GRAD_OUTPUT: set(sites.selected) if gradients else set(),
                 PARAM: set(param_paths) if parameters else set(),
                 PARAM_GRAD: set(param_paths) if parameter_grads else set(),
                 UPDATE: set(param_paths) if updates else set()}
        self.recorder = recorder if recorder is not None else Recorder()
        self.store: Any = None
        #: facts of yours about the run (``watch(metadata=)``), stored with it; its ``chance`` sets the
        #: diagnoses' chance level of loss metrics (:meth:`diagnose`)
        self.metadata: dict[str, Any] = {}
        self._sinks: list[Sink] = []
        self._metrics: dict[str, float] = {}
        self.closed = False
        self._made_in = os.getpid()  # the process that records: a child forked from it records nothing (_fork_off)
        self._forked_warned: int | None = None  # the pid of the forked child that was warned (once a process)
        self._watched_here: weakref.ref | None = None  # in a forked child: a watch made there that watches the model
        #: how the watch ended, as its store records it: ``running`` while open (and closing), then ``finished``,
        #: ``stopped`` or ``failed`` (:meth:`close`; a ``with`` block that raised: ``failed``), with ``error``
        self.status, self.error = "running", None
        self.step_index = self.start_step = start_step
        self._intervention_log: list[Intervention] = []
        self._wanted = {kind for kind, on in ((ACTIVATION, activations), (GRAD_OUTPUT, gradients),
                                              (PARAM, parameters), (PARAM_GRAD, parameter_grads), (UPDATE, updates))
                        if on}
        self._dropped: list[weakref.finalize] = []  # closes each sink should the watch be let go of unclosed
        self._record_next_at: int | None = None  # the step record_next() started recording, part-way perhaps
        self._record_next_step = False  # record the next step whatever every says (record_next() came too late)
        #: (the step's number, its record or None) once step() has ended the step in progress, until the next step
        #: has started: a step() interrupted in between (a KeyboardInterrupt), called again, ends it no second time
        self._ended: tuple[int, StepRecord | None] | None = None
        self._hooks = self._attach(sites, kinds, bins if histograms else None, reducers, compiled, updates)
        self.errors = self._hooks.errors
        for held in [*_parts(reducers), self.recorder]:  # (they serve this watch until it closes: _check_unshared)
            held._held_by = weakref.ref(self)
        self._start_step()
        _OPEN_WATCHES.add(self)

    def _attach(self, sites: CallSites, kinds: dict[str, set[str]], bins: int | None,
                reducers: Sequence[Reducer] | None, compiled: bool, updates: bool) -> Any:
        """The hooks that record into this watch (a subclass attaches others: ``CompiledWatch``)."""
        return Hooks(sites, StepSums(bins, reducers=reducers, fixed_ranges=True), kinds, compiled, updates,
                     self._wanted)

    def _start_step(self, record: bool = False) -> None:
        self._metrics = {}
        record = record or self._record_next_step or (self.step_index - 1) % self.every == 0
        self._hooks.start_step(self.step_index, record)
        self._record_next_step = False  # (once started: a start interrupted, made again, records it still)
        for intervention in self.interventions:  # (the hooks are in for them: this step's calls are counted)
            intervention.from_next_step = False
        self._ended = None

    # ------------------------------------------------------------------ the step
    def step(self, **metrics: float) -> StepRecord | None:
        """End the current step: record it (when it is a recorded step) and start the next.

        Args:
            **metrics: scalar metrics of this step (loss, accuracy ...), published with its statistics.

        Returns:
            The step's record, or None when the step was neither recorded nor given metrics.

        Raises:
            TypeError: a metric that is not a number (see :meth:`log`): the step is not ended, and none
                of the metrics given is logged.
            ValueError: a metric named ``step`` (see :meth:`log`): the step is not ended, and none is logged.
        """
        self._check_open()
        if self._in_forked_child():
            return None
        if metrics:
            self.log(**metrics)
        if self._ended is None:
            self._ended = (self.step_index, self._end_step())
        ended_step, record = self._ended
        if record is not None:
            self.recorder.publish(record)  # (published once: the same record again after an interrupt)
        self.step_index = ended_step + 1
        self._start_step()
        return record

    def _end_step(self) -> StepRecord | None:
        """End the step in progress: the record to publish, or None."""
        for intervention in self.interventions:  # (one made after this step's calls, the model called again since)
            self._first_acted(intervention)
        # (on until it failed, or until it was removed after this step's forward had run it)
        ended = [i for i in self._intervention_log if i.failed_step == self.step_index
                 or (i.error is None and i.end_step == self.step_index)]
        if self.interventions or ended:  # (the steps each was on: a stored run keeps them as its metrics)
            self.log(**{i.marker: 1.0 for i in [*self.interventions, *ended] if i.start_step <= self.step_index})
        hooks, record = self._hooks, None
        partial = self._record_next_at == self.step_index and hooks.recording and hooks.ran() is False
        self._record_next_at = None
        if partial:  # (its rows would be a part of a step: see record_next)
            self._record_next_step = True
            warn(f"workbench: w.record_next() was called part-way through step {self.step_index}, after the "
                 "model's forward (or its backward) had run, so that step would be recorded in part (no "
                 f"activations or output gradients, updates of zero). Step {self.step_index + 1} is recorded in "
                 "full instead. Call w.record_next() between two steps: after w.step(), before the model runs.")
        if hooks.recording and not partial:
            record = self._record(hooks.end_step(self.options["parameters"]))
        elif self._metrics or hooks.step_errors:
            record = StepRecord(self.step_index, metrics=dict(self._metrics), errors=tuple(hooks.step_errors),
                                time=time.time())
        return record

    def record_next(self) -> None:
        """Record the step in progress - the forward and backward that come before the next
        :meth:`step` - whatever ``every`` says: a run's last step, or a moment worth a look. Call
        it between two steps (after a :meth:`step`, before the model runs).

        Called part-way through a step, after its forward ran, it would record a part of the step
        (no activations or output gradients; updates of zero after the optimizer step): where no
        module call of the model comes between it and :meth:`step`, that part is not kept, and the
        next step is recorded in full instead, with a ``RuntimeWarning`` that says so. (A watch of
        parameters and their gradients alone has no module hook to tell by - a step with no backward
        is a step too - so it records the rest of the step in progress.)"""
        self._check_open()
        if self._in_forked_child():
            return
        if not self._hooks.recording:  # (the patches in place keep counting the step's calls from its start)
            self._hooks.record_rest_of_step()
            self._record_next_at = self.step_index

    def _record(self, entries: list) -> StepRecord:
        try:
            sums, counts = self._hooks.sums.rows()  # the one host transfer of the step
            binning = self._hooks.sums.binning() if counts is not None else None
        except Exception as exc:  # (a failed device transfer) the step's statistics are lost, not the run
            self._hooks.fail("", 0, "statistics", exc)
            entries, sums, counts, binning = [], np.empty((0, len(SUMS))), None, None
        keys, numel, rows = zip(*entries) if entries else ((), (), ())
        index = np.asarray(rows, np.intp)
        return StepRecord(self.step_index, tuple(keys), np.asarray(numel, np.int64), sums[index],
                          counts[index] if counts is not None else None, dict(self._metrics),
                          tuple(self._hooks.step_errors), index,
                          histogram_edges=binning[0][index] if binning is not None else None,
                          histogram_sampled=binning[1][index] if binning is not None else None, time=time.time())

    def discard_step(self) -> None:
        """Forget what the current step has recorded so far, and start it again (same number): a
        training step that raised leaves no partial step in the rows. A backward still to come of
        the discarded forward records nothing. A step to be recorded (by ``every`` or
        :meth:`record_next`) is recorded when run again."""
        self._check_open()
        if self._in_forked_child():
            return
        self._record_next_at = None  # (the step runs again from its start: recorded in full)
        for intervention in self._intervention_log:  # (what the discarded calls ran with does not count)
            if intervention.after_forward and intervention.start_step >= self.step_index:
                # (made after them, in this step: on from the step's first call now)
                intervention.after_forward, intervention.calls_before = False, 0
                intervention.start_step = self.step_index
            if intervention.error is None and intervention.end_step == self.step_index:
                intervention.end_step = self.step_index - 1  # (removed after them: not on in the step run again)
        self._start_step(record=self._hooks.recording)

    def log(self, **metrics: float) -> None:
        """Attach scalar metrics to the current step (published by ``step()``).

        Args:
            **metrics: real numbers (or one-element tensors or numpy arrays), by name; a name logged twice in a
                step keeps its last value.

        Raises:
            TypeError: a metric that is not a real number (or a one-element tensor or array): a bool, a complex
                number, a string, a tensor of several values; none of the metrics given is logged then.
            ValueError: a metric named ``step``, the name of the step numbers' column, or an int too large for a
                float; none is logged then.
        """
        if self._in_forked_child():
            return
        if "step" in metrics:  # (it took the place of the step numbers in metrics(), and a stored run's raised)
            raise ValueError(f"a metric cannot be named 'step' (got step={metrics['step']!r}): it is the column of "
                             "the step numbers in metrics(). Name it otherwise, e.g. global_step=...")
        checked = {}
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().item() if value.numel() == 1 else value
            elif isinstance(value, np.ndarray):  # (loss.detach().numpy() is a 0-d array)
                value = value.item() if value.size == 1 else value
            if (isinstance(value, (bool, np.bool_, complex, np.complexfloating))
                    or not isinstance(value, (int, float, np.number))):
                size = value.numel() if isinstance(value, torch.Tensor) else getattr(value, "size", None)
                many = (f", a {type(value).__name__} of {size} values: reduce it to one first (.mean())"
                        if isinstance(value, (torch.Tensor, np.ndarray)) else "")
                raise TypeError(f"metric {key!r} must be a number, got {value!r}{many}; a metric is an int or a float "
                                "(not a bool nor a complex number), or a tensor or numpy array of one value.")
            try:
                checked[key] = float(value)
            except OverflowError:  # (an int past float's range; one past 4300 digits has no str() to count them)
                magnitude = abs(int(value))
                size = (f"{len(str(magnitude))} digits" if magnitude.bit_length() <= 10_000
                        else f"{magnitude.bit_length():,} bits")
                raise ValueError(f"metric {key!r} is too large for a float64 metric, got an int of {size}; log it "
                                 "scaled (math.log10(x)).") from None
        self._metrics.update(checked)  # (all or none: a call that raised logged nothing)

    @contextlib.contextmanager
    def paused(self) -> Iterator[Watch]:
        """A block the watch stays out of, such as an evaluation pass between training steps: its
        module calls leave no rows, count no call and are not patched, and run without our hooks."""
        self._check_open()
        hooks = self._hooks
        hooks.paused += 1
        hooks.update()
        try:
            yield self
        finally:
            hooks.paused -= 1
            if not self.closed:
                hooks.update()

    # ------------------------------------------------------------------ interventions
    def patch(self, path: str, fn: Callable[[Any], Any], call: int | None = None,
              label: str | None = None) -> Intervention:
        """Replace the output of the call site ``path`` with ``fn(output)``, or let ``fn`` edit it in place.

        Args:
            path: a module path of the model (any of its alias paths; a module that one caller holds under
                several names has its calls named by the first that ``modules`` selects: a patch at another
                name applies to nothing, which the step that called the model without it warns of once).
            fn: takes the module's output and returns its replacement (same structure), or edits it in
                place and returns None, as a PyTorch forward hook may: the edited output stays the
                module's output. (``lambda out: out[:, 0].zero_()`` returns the zeroed column, which would
                replace the output: ``def fn(out): out[:, 0] = 0`` returns None.) An in-place edit of a
                tensor that autograd saved for the backward fails there, as in torch.
            call: only this call index within a step (None: every call).
            label: what it does, as the log, the metrics and the pages name it (default: ``fn``'s name).

        Returns:
            An :class:`~workbench.instrument.interventions.Intervention`; ``remove()`` ends it. The
            patched output is what the rest of the model sees, what is recorded and what gradients
            flow through.

        Raises:
            TypeError: ``fn`` is not callable.
            ValueError: no module at ``path``, or a bad ``call``.
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(f"patch() needs a callable fn, got {fn!r}.")
        return self._add_intervention(path, fn, call, _label(label, getattr(fn, "__name__", "patch")))

    def ablate(self, path: str, units: int | Iterable[int] | np.ndarray | torch.Tensor, dim: int | None = None,
               call: int | None = None, label: str | None = None) -> Intervention:
        """Zero ``units`` along ``dim`` of the call site's output (every floating-point tensor in it).

        Args:
            path: a module path of the model.
            units: an index or indices along ``dim`` (channels, features ...): an int, a numpy integer
                or a 0-d integer tensor, or a non-empty list, tuple, range, 1-d integer array or tensor of
                them.
            dim: the dimension that indexes units (an int, a numpy integer or a 0-d integer tensor); by
                default 1: the features of (B, F), the channels of (B, C, H, W), but the *positions* of a
                (B, S, F) sequence output, where features are ``dim=-1``. Left out on an output of 3 or
                more dims, a ``RuntimeWarning`` (once) names the site, its shape and the dim used; pass
                ``dim`` to say which you mean.
            call: only this call index within a step (None: every call).
            label: what it does, as the log, the metrics and the pages name it (default:
                ``ablate[units]@dim1``).

        Returns:
            An :class:`~workbench.instrument.interventions.Intervention`.

        Raises:
            TypeError: units or dim that are not integers (floats, bools, strings, an empty list).
            ValueError: units or dim out of range for the outputs recorded at ``path`` so far.
        """
        given = dim is not None
        index, dim = unit_index(units, 1 if dim is None else dim)
        label = _label(label, f"ablate{index}@dim{dim}")
        leaves = sorted(self._output_shapes(path), key=_leaf_order)  # known once a recorded step has seen the site
        for name, shape in leaves:
            try:
                check_units(path, index, dim, shape)
            except ValueError:
                if len({name for name, _ in leaves}) == 1:
                    raise
                # (several tensors: the one it does not fit may not be the one the user means)
                raise ValueError(f"ablate({path!r}): its output holds floating-point tensors "
                                 f"{', '.join(f'{n} {s}' for n, s in leaves)}, and ablate zeroes the units of each; "
                                 f"units {listed(index)} along dim {dim} do not fit {name} of shape {shape}. "
                                 f"{_patch_one_leaf(path, index, dim, leaves)}") from None
        return self._add_intervention(path, zero_units(path, index, dim, warn_default_dim=not given), call, label)

    @property
    def interventions(self) -> list[Intervention]:
        """The interventions in place."""
        return [i for items in self._hooks.interventions.values() for i in items]

    def intervention_log(self) -> pd.DataFrame:
        """Every intervention this watch has had, in order: ``id`` (``i1``, ``i2`` ...), ``site`` (its
        path, ``path#call`` for one call, ``(model)`` for the model itself), ``intervention`` (its
        label), ``from step``, ``to step`` (the last step it applied to; ``""`` while in place; the step it
        failed at for one that failed) and ``status`` (``on``, ``removed``, ``ended with the watch``,
        ``failed at step N: <error>``).
        :func:`workbench.ui.findings.during_interventions` reads it: a finding that held while one was
        in place names it (zeroed units read as dead ones). A stored run keeps it
        (``Run.interventions()``): each step logs a marker metric of each one in place."""
        rows = [{"id": i.id, "site": i.site, "intervention": i.label, "from step": i.start_step,
                 "to step": "" if i.end_step is None else i.end_step, "status": i.status}
                for i in self._intervention_log]
        return pd.DataFrame(rows, columns=LOG_COLUMNS)

    def _output_shapes(self, path: str) -> set[tuple]:
        return self._hooks.output_shapes(path)

    def _add_intervention(self, path: str, fn: Callable, call: int | None, label: str) -> Intervention:
        self._check_open()
        self._sites.check_path(path)
        if call is not None:
            call = whole_number("call", call, 0, "None (every call) or a call index >= 0")
        # (made after the step's model calls, it was not on in them: it first acts at the next step, unless the
        # model is called again in this one, which _first_acted tells. Where the step may have called the model
        # uncounted - a step not recorded, with the hooks out - it is taken to be made after them until a call of
        # its site in this step says it acted from this one; one of a call waits for the next step: which call of this
        # step is its call cannot be told)
        uncounted = self._hooks.calls_uncounted
        after = bool(self._model_calls()) or uncounted
        intervention = Intervention(path, fn, call, label, self._remove_intervention,
                                    f"i{len(self._intervention_log) + 1}", self.step_index + after)
        intervention.after_forward, intervention.calls_before = after, self._hooks.calls_made(path)
        intervention.from_next_step = call is not None and uncounted
        self._intervention_log.append(intervention)
        self._hooks.interventions.setdefault(path, []).append(intervention)
        self._hooks.update()
        return intervention

    def _model_calls(self) -> int:
        """The model's calls in the step so far (0 where the module hooks are out: they saw none)."""
        return self._hooks.calls_made()

    def _first_acted(self, intervention: Intervention) -> None:
        """Bring ``start_step`` to this step where the site of ``intervention``, made after the step's first
        calls, was called again in it since (the call it patches, for one of a ``call``): it acted from this step
        on, not the next. Calls of other modules do not count: a site that ran before it was made, then others
        (it was made in a forward hook), ran unpatched."""
        if intervention.start_step <= self.step_index or intervention.from_next_step:
            return
        before, now = intervention.calls_before, self._hooks.calls_made(intervention.path)
        if (now > before) if intervention.call is None else (before <= intervention.call < now):
            intervention.start_step = self.step_index

    def _remove_intervention(self, intervention: Intervention) -> None:
        interventions = self._hooks.interventions
        active = interventions.get(intervention.path, [])
        if intervention in active:
            active.remove(intervention)
            self._first_acted(intervention)
            # (one that failed was on until it failed; one removed after the step's model calls, which it was on
            # in, ends with this step; else the step in progress runs without it, and one made after this step's
            # calls and removed before the model ran again never acted: it ends before its first step)
            applied_now = bool(self._hooks.ran()) and intervention.start_step <= self.step_index
            intervention.end_step = (intervention.failed_step if intervention.error is not None
                                     else self.step_index if applied_now
                                     else max(self.step_index, intervention.start_step) - 1)
        if not active:
            interventions.pop(intervention.path, None)
        self._hooks.update()  # (also from inside a forward hook: torch iterates over a copy of the dicts)

    # ------------------------------------------------------------------ reading
    def subscribe(self, callback: Callable[[Update], object], max_pending: int = 1000,
                  interval: float = 0.0) -> Subscription:
        """Receive each recorded step (an :class:`~workbench.instrument.recorder.Update`) on a thread of
        its own.

        Args:
            callback: receives an :class:`~workbench.instrument.recorder.Update` (one or more records).
            max_pending: records kept for a subscriber that falls behind (older ones are dropped and counted).
            interval: seconds to gather records before each delivery (0: as they come).

        See :meth:`Recorder.subscribe <workbench.instrument.recorder.Recorder.subscribe>`.

        Raises:
            RuntimeError: the watch is closed (it records nothing more: a subscription would wait forever).
        """
        if self.closed:
            raise RuntimeError("This watch is closed: it records nothing more. Read what it recorded with "
                               "w.recorder.records() / w.to_pandas(), or start a new watch with "
                               "workbench.watch(model).")
        return self.recorder.subscribe(callback, max_pending, interval)

    def to_pandas(self) -> pd.DataFrame:
        """One row per tensor per call site per recorded step (see ``workbench.instrument.ROW_COLUMNS``).

        Raises:
            RuntimeError: the watch keeps no step in memory (``Recorder(max_rows=0)``): an empty frame would
                read as a run with no rows (and :meth:`diagnose` as one with nothing wrong).
        """
        self._check_kept("to_pandas")
        return self.recorder.to_pandas()

    def _check_kept(self, method: str) -> None:
        """Refuse to read ``method`` of a watch whose recorder keeps no step (``max_rows=0``), naming where to."""
        if self.recorder.max_rows == 0:
            stored = self.store.path if self.store is not None else None
            read = (f"read the stored run: workbench.load_run({str(stored)!r}).{method}()" if stored is not None
                    else "subscribe to it (w.subscribe(callback)) or give it a store (store='runs/<name>')")
            raise RuntimeError(f"This watch keeps no step in memory: its recorder was made with max_rows=0, which "
                               f"streams each step to the store and the subscribers alone. To read the steps, {read}; "
                               "to keep them in memory too, watch with recorder=workbench.Recorder(max_rows=...) "
                               "or the default recorder.")

    def metrics(self, long: bool = False) -> pd.DataFrame:
        """The metrics given to ``step()`` / ``log()``: one row per step, a column per metric (NaN: not
        logged that step, or logged NaN), in the order first logged (those first logged at one step by name),
        as a stored run's ``Run.metrics()`` has them (also once the oldest steps are evicted from memory:
        ``Recorder(max_rows=...)``).

        Args:
            long: one row per logged value instead, ``step, name, value`` (a metric not logged that
                step has no row; one logged NaN has a row with NaN).

        Raises:
            RuntimeError: the watch keeps no step in memory (``Recorder(max_rows=0)``).
            TypeError: ``long`` is not True or False (a metric name: ``w.metrics()['loss']`` takes one).
        """
        self._check_kept("metrics")
        return self.recorder.metrics(long)

    def histograms(self, module: str | None = None, kind: str | None = None) -> pd.DataFrame:
        """Histograms (recorded unless ``histograms=False``): one row per tensor with ``edges`` and ``counts``.

        Args:
            module: only this module path (None: every path).
            kind: only this kind (``activation``, ``grad_output``, ``param``, ``param_grad``, ``update``).

        Raises:
            RuntimeError: the watch was made with ``histograms=False``: it records none (an empty frame
                would read as sites that had no values); or it keeps no step in memory (``Recorder(max_rows=0)``).
            ValueError: an unknown ``module`` or ``kind``.
        """
        self._check_kept("histograms")
        if not self.options["histograms"]:
            raise RuntimeError("This watch records no histograms: it was made with histograms=False. Its "
                               "statistics are in w.to_pandas(); to record histograms, watch with histograms=True "
                               "(the default), e.g. workbench.watch(model, bins=32).")
        kept = {(key[0], key[2]) for record in self.recorder.records() for key in record.keys}
        check_filter("histograms", module, kind, self.paths, {k for _, k in kept})
        if module is not None and kept and module not in {m for m, _ in kept}:
            raise ValueError(f"histograms: module {module!r} has no rows: this watch does not record it (watch("
                             f"modules=...) selects the paths recorded, {_listed_paths({m for m, _ in kept})}).")
        return self.recorder.histograms(module, kind)

    def diagnose(self, thresholds: Any = None, **overrides: Any) -> pd.DataFrame:
        """What looks wrong with the run so far, where and since when: :func:`workbench.diagnose.diagnose`
        of :meth:`to_pandas` and :meth:`metrics`.

        Args:
            thresholds: a :class:`workbench.diagnose.Thresholds`, a dict of its fields, or None.
            **overrides: single thresholds (``persist=5``, ``dead_zero_frac=0.7``); the chance level of
                the loss is the run's metadata's ``chance`` unless given here.

        Raises:
            RuntimeError: the watch keeps no step in memory (``Recorder(max_rows=0)``): no finding would
                read as nothing wrong.
        """
        self._check_kept("diagnose")
        from workbench.diagnose import diagnose, with_run_facts  # (a reader of the rows, not a part of the pipeline)
        return diagnose(self.to_pandas(), self.metrics(long=True), thresholds,
                        **with_run_facts(self.metadata, thresholds, overrides))

    def anomalies(self) -> pd.DataFrame:
        """Rows with NaN or Inf values, in the order they were recorded: the first row is where a
        non-finite value first appeared (step, module path, call, kind).

        Raises:
            RuntimeError: the watch keeps no step in memory (``Recorder(max_rows=0)``).
        """
        self._check_kept("anomalies")
        frame = self.to_pandas()
        return frame[anomalous(frame)].reset_index(drop=True)

    # ------------------------------------------------------------------ sinks and closing
    def add_sink(self, sink: Sink) -> None:
        """Close ``sink`` with this watch, with its status (the sink attaches itself to ``recorder``).
        A watch let go of without ``close()`` closes it ``stopped`` when it is collected (the sink
        must not hold the watch: a callback into it holds it weakly).

        Args:
            sink: anything with ``close(status, error)``, such as a
                :class:`~workbench.instrument.store.RunStore`.
        """
        self._sinks.append(sink)
        dropped = weakref.finalize(self, sink.close, "stopped", "the watch was let go of without close()")
        dropped.atexit = False  # (a watch still open as the program ends: its store reads interrupted, as it was)
        self._dropped.append(dropped)

    def report_failure(self, kind: str, message: str, outcome: str | None = None) -> None:
        """A failure outside the hooks (a sink that could not write), kept in ``errors`` with a
        RuntimeWarning: never silent, never fatal.

        Args:
            kind: what failed (``"store"``, a sink's name).
            message: what happened, for the user.
            outcome: what the failure does to the sink's output, said in the warning (the run store's: its run
                will be marked failed). None: the warning says the watch marks nothing failed (only the sink
                can say what becomes of its output).

        Raises:
            TypeError: ``kind``, ``message`` or ``outcome`` is not text.
        """
        for name, text in (("kind", kind), ("message", message), ("outcome", outcome)):
            if not isinstance(text, str) and not (name == "outcome" and text is None):
                raise TypeError(f"report_failure(): {name} must be a str{' or None' if name == 'outcome' else ''}, "
                                f"got {text!r}.")
        self.errors.append({"step": None, "module": "", "call": 0, "kind": kind, "error": message, "traceback": ""})
        if outcome is None:  # (the watch marks no output: a sink that does says so itself, as the store does)
            outcome = (f"the watch keeps it in w.errors and marks nothing failed (what becomes of the {kind!r} "
                       "sink's output is the sink's to say)")
        warn(f"workbench: {message}; {outcome}. Training goes on.")

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Remove every hook (the model is as before ``watch``), close the sinks and wait until every
        subscriber has received the steps published (up to 10 s each). Idempotent.

        Args:
            status: how the run ended, written into its store: ``finished``, ``stopped`` (by the
                user) or ``failed`` (with ``error``). A store that could not write every step closes
                ``failed`` whatever is passed; so does the run when taking the hooks out or a sink's
                ``close()`` raises: every sink is closed still, the store last, its ``error`` and ``w.error``
                naming the error, which is raised once all are closed.
            error: the error of a ``failed`` run (a message or a formatted traceback).

        Raises:
            ValueError: an unknown status.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}.")
        if self.closed:
            return
        self.closed = True
        if self._made_in != os.getpid():  # (a forked child's copy: the sinks and the run are the parent's)
            self._hooks.close()
            return
        # every sink is closed, the store last, whatever raised before: taking the hooks out, or a sink's close().
        # Such an error makes the run failed, naming it, in the store and here alike; the first is raised once all
        # are closed (an interrupt while the hooks are taken out or a sink closes leaves the status as asked, and is
        # raised too)
        failure: BaseException | None = None

        def failed(what: str, exc: BaseException) -> None:
            nonlocal failure, status, error
            failure = failure or exc
            if isinstance(exc, Exception):
                message = f"{what} failed: {type(exc).__name__}: {exc}"
                status, error = "failed", f"{error}\n{message}" if error else message

        try:
            try:
                for intervention in self.interventions:  # (they end with the watch)
                    intervention.end_step, intervention._closed_with_watch = self.step_index - 1, True
                self._hooks.close()
            except BaseException as exc:
                failed("taking the watch's hooks out", exc)
            for dropped in self._dropped:
                dropped.detach()
            for sink in sorted(self._sinks, key=lambda sink: sink is self.store):
                try:
                    sink.close(status, error)  # (writes what is still queued first)
                except BaseException as exc:  # (an interrupt too: the sinks after it, the store, are closed still)
                    failed(f"closing the sink {type(sink).__name__}", exc)
            if failure is not None:
                raise failure
        finally:
            # the status is set once, final: ``running`` until the store's last writes are done (a dashboard
            # ends on it), then as the store records it
            lost = getattr(self.store, "lost", 0)
            if lost:  # (a store that lost steps closes failed whatever was asked: the watch says the same, and why)
                first = getattr(self.store, "errors", None)
                message = f"{lost} step(s) could not be stored" + (f"; the first: {first[0]}" if first else "")
                status, error = "failed", f"{error}\n{message}" if error else message
            self.status, self.error = status, error
        self.recorder.flush()  # a subscriber has every step once the watch is closed

    def _fork_off(self) -> None:
        """In a child forked from the process that made the watch (a DataLoader or multiprocessing worker): the
        watch records nothing here, and says so once, as the model is called here or a step ended (see
        :meth:`_in_forked_child`). Its sinks are the parent's: never closed from here (the run store lets go of
        what it holds itself)."""
        for dropped in self._dropped:
            dropped.detach()
        self._hooks.forked_off(self._forked_call)

    def _in_forked_child(self) -> bool:
        """Whether this is a child forked from the process that made the watch, where the watch records nothing
        (warned once)."""
        if self._made_in == os.getpid():
            return False
        self._warn_forked()
        return True

    def _forked_call(self) -> None:
        """A call of the model in a forked child: warned of, unless a watch made in this process watches the model
        (what the warning advises: the model is not unwatched here)."""
        if self._forked_warned == os.getpid():
            return
        here = self._watched_here() if self._watched_here is not None else None
        if here is None or here.closed or here._made_in != os.getpid():  # (one made here, open: not a parent's)
            here = next((other for other in list(_OPEN_WATCHES) if not other.closed
                         and _shared_with(self.model, other.model) is not None), None)
            self._watched_here = weakref.ref(here) if here is not None else None
        if here is None:
            self._warn_forked()

    def _warn_forked(self) -> None:
        if self._forked_warned == os.getpid():  # (once in each process: a child of the child is told too)
            return
        self._forked_warned = os.getpid()
        store = getattr(self.store, "path", None)
        warn(f"workbench: this process (pid {os.getpid()}) was forked from the process (pid {self._made_in}) that "
             f"made the watch {self!r}{f' recording into {str(store)!r}' if store is not None else ''}. A watch "
             "records in the process that made it: nothing it sees here is recorded or stored (the model runs "
             "unwatched here, its patches and ablations still applied; w.step() and w.log() do nothing here, "
             "and w.close() takes the hooks out of this process alone). To record what this process runs, watch "
             "the model in it, into a store of its own: workbench.watch(model, store=...) once the process has "
             "started (a DataLoader worker: in its worker_init_fn, closed as the worker ends, which runs no "
             "atexit: multiprocessing.util.Finalize(None, w.close, exitpriority=0)); to record processes training "
             "one model data-parallel as one run, "
             "workbench.instrument.distributed.watch_distributed(model, store=...).")

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("This watch is closed; start a new one with workbench.watch(model).")

    def __enter__(self) -> Watch:
        self._check_open()  # (a closed watch records nothing: the block would run unwatched)
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
        return (f"Watch({type(self.model).__name__}, {len(self._sites.selected)} call-site paths, "
                f"every={self.every}, {state}, {len(self.errors)} errors)")


#: The watches made in this process, for :func:`_warn_if_watched` (held weakly: a watch let go of has its hooks
#: taken out, and leaves the set)
_OPEN_WATCHES: weakref.WeakSet[Watch] = weakref.WeakSet()


def _fork_off_in_child() -> None:
    """In a child forked from this process (``os.fork``, a ``DataLoader`` or ``multiprocessing`` worker with the fork
    start method): every open watch records nothing there (:meth:`Watch._fork_off`), and none counts as open there
    (a watch made in the child warns of none of them)."""
    watches = [w for w in list(_OPEN_WATCHES) if not w.closed]
    _OPEN_WATCHES.clear()
    for w in watches:
        w._fork_off()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_off_in_child)


def _warn_if_watched(model: nn.Module) -> None:
    """Warn, before anything is attached, where an open watch already watches ``model``, a module
    inside it or a model it is inside, naming that watch and its store. Two watches at once
    are allowed (another selection of modules, another ``every``) but are seldom meant: more often
    the other is left open from an earlier cell, and both record every call of the modules they
    share, each step paying both watches' hooks, their patches both applied. Where warnings are
    errors (``-W error``), the error refuses the second watch, nothing of it attached."""
    for other in list(_OPEN_WATCHES):
        shared = None if other.closed else _shared_with(model, other.model)
        if shared is None:
            continue
        store = getattr(other.store, "path", None)
        warn_user(f"workbench: {type(model).__name__} is watched twice: an open watch, {other!r}"
                  f"{f' recording into {str(store)!r}' if store is not None else ''}, already watches {shared}. "
                  "Both will record the modules they share, each into its own run, each step paying both watches' "
                  "hooks (and the patches of both apply). If that watch is left from before, close it "
                  "(w.close()) and watch again; one watch records several selections at once "
                  "(modules=[...]); both on purpose: warnings.filterwarnings('ignore', 'workbench: .* is watched "
                  "twice').", may_raise=True)
        return


def _shared_with(model: nn.Module, other: nn.Module) -> str | None:
    """What of ``model`` the watch of ``other`` watches too: ``it``, ``the model it is part of`` or ``a module inside
    it``; None where they share no module."""
    if other is model or any(m is model for m in other.modules()):
        return "it" if other is model else "the model it is part of"
    if any(m is other for m in model.modules()):
        return "a module inside it"
    return None


def _check_materialized(model: nn.Module) -> None:
    """Refuse, before anything is attached, a model with lazy modules not yet materialized
    (``nn.LazyLinear`` ...): their parameters do not exist until the first forward.

    Raises:
        ValueError: naming the lazy modules.
    """
    lazy = [path or "(the model)" for path, module in model.named_modules()
            if isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params()]
    if lazy:
        raise ValueError(f"watch() needs the model's parameters, and the lazy module(s) {', '.join(lazy[:8])}"
                         f"{' ...' if len(lazy) > 8 else ''} of {type(model).__name__} have none yet: run one forward "
                         "pass first (model(example_input)), which materializes them, then call watch(model).")


def checked_counts(every: Any, bins: Any, start_step: Any) -> tuple[int, int, int]:
    """``every``, ``bins`` and ``start_step`` as plain ints, each refused with its own message where it is not
    one in range (checked before anything else of a watch: a store's metadata is compared with them).

    Raises:
        ValueError: ``every`` or ``bins`` is not a positive int (``bins`` above
            :data:`~workbench.instrument.schema.MAX_BINS`), ``start_step`` not a non-negative one.
    """
    return (whole_number("every", every, 1, "a positive int (record every Nth step)"),
            checked_bins(bins),
            whole_number("start_step", start_step, 0, "a non-negative int"))


def _parts(reducers: Sequence[Reducer] | None) -> list[Reducer]:
    """Every reducer a watch with ``reducers`` holds: those given and those they hand tensors to."""
    return [part for reducer in reducers or () for part in reducer.parts()]


def _check_unshared(reducers: Sequence[Reducer] | None, recorder: Recorder | None) -> None:
    """Refuse a reducer object or a recorder that a watch still open uses; once that watch is closed
    they may serve another. A reducer keeps one watch's step (its rows and the tensors it holds until
    the step's rows are read): a second watch would take it over, and the first would record into
    the second's rows. A recorder shared would mix two watches' steps under the same step numbers
    (and each watch's store would write the other's rows).

    Raises:
        ValueError: naming the reducer or recorder and the watch that holds it.
    """
    for held in [*_parts(reducers), *([recorder] if recorder is not None else [])]:
        holder = held._held_by() if held._held_by is not None else None
        if holder is None or holder.closed:
            continue
        name = type(held).__name__
        if isinstance(held, Recorder):
            raise ValueError(f"recorder: this {name} is in use by {holder!r}, which is still open. Two open watches "
                             "publishing into one recorder would mix their steps under the same step numbers (and "
                             "each watch's store would write the other's rows): give each watch its own, e.g. "
                             "recorder=workbench.Recorder(max_rows=...), or None for a new one, or close the other "
                             "watch first.")
        raise ValueError(f"reducers: this {name} object is in use by {holder!r}, which is still open. A reducer "
                         "keeps one watch's step (its rows and the tensors it holds until the step ends), so "
                         f"two open watches cannot share one: give each watch its own (a new {name}, or the names "
                         f"{', '.join(map(repr, REDUCER_NAMES))}: new reducers each time), or close the other watch "
                         "first.")


def _leaf_order(leaf: tuple[str, tuple]) -> list:
    """The order of an output's leaves by name, numbers as numbers (``out.2`` before ``out.10``)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in leaf[0].split(".")]


def _patch_one_leaf(path: str, index: list[int], dim: int, leaves: list[tuple[str, tuple]]) -> str:
    """How to zero ``index`` along ``dim`` in one tensor of a site's output alone: a patch of the first
    element ``out.<i>`` those units fit, for an output that is a tuple (leaf names do not tell a tuple
    from a list or a dict with integer keys: said so), else in words."""
    for name, shape in leaves:
        element = name.removeprefix("out.")
        if not element.isdigit():
            continue
        try:
            check_units(path, index, dim, shape)
        except ValueError:
            continue
        i, units = int(element), str(index) if len(index) <= 8 else "units"
        before = f"*out[:{i}], " if i else ""
        return (f"To zero units of one tensor alone, patch it; for {name} of a tuple: w.patch({path!r}, lambda out: "
                f"({before}out[{i}].index_fill({dim}, torch.tensor({units}), 0.0), *out[{i + 1}:])).")
    return ("To zero units of one tensor alone, patch it: w.patch(path, fn), fn returning the output with that "
            "tensor's units zeroed (tensor.index_fill(dim, torch.tensor(units), 0.0)).")


def _label(label: Any, default: str) -> str:
    """An intervention's label: ``default`` for None, else one line of text."""
    if label is None:
        return default
    if not isinstance(label, str) or not label.strip() or "\n" in label:
        raise TypeError(f"label must be one line of text naming what the intervention does (e.g. 'zero units "
                        f"[0, 1]'), or None for {default!r}; got {label!r}.")
    return label


def _listed_paths(paths: set[str]) -> str:
    """Paths for a message: the first 20, in order, the model itself as ``''``."""
    ordered = sorted(paths)
    return ", ".join(map(repr, ordered[:20])) + (" ..." if len(ordered) > 20 else "")
