"""Watching a ``torch.compile``'d model at compiled speed: the statistics are computed inside the
compiled graphs. ``workbench.watch(compiled_model)`` comes here (:func:`watch_compiled`).

The eager watch's hooks are marked for dynamo to skip, so a compiled model under them breaks its
graph at every module call and runs none of its compiled code. Here the hooks are written for
dynamo to trace instead; one file a job:

- :mod:`~workbench.instrument.compiled_graph`: inside the graphs - the process-wide forward hook
  dynamo inlines at every module call, the statistics of outputs (fused into the graph's kernels)
  and of their gradients (a gradient hook on each output, traced into the backward graph, that
  reduces the gradient into a probe).
- :mod:`~workbench.instrument.compiled_hooks`: around the graphs - every call of the compiled
  model goes through :class:`~workbench.instrument.compiled_hooks.CompiledHooks`, which keeps each
  call's rows and names them when the step ends (one host transfer); parameters and their
  gradients, outside the graphs, by the eager reducers.
- Here: :class:`CompiledWatch`, the :class:`~workbench.instrument.watch.Watch` facade (the step
  lifecycle, interventions, reading, sinks) over those hooks, and the hand-over to the eager hooks
  where the model does not compile.

``every=N``: whether a step is recorded is a flag the hook reads, on which dynamo guards: two
compiled variants of each graph (recording, and not - the model's own graph, nothing added),
switched between without recompiling. Where dynamo does not compile a module call (a graph break)
the same hook runs eagerly and records the same rows; where no call of a recorded step was
compiled (dynamo skips the model) or compiling fails, the watch warns why and hands over to the
eager hooks (the same rows, at eager speed). Every torch-private API used is in
:mod:`~workbench.instrument.torch_internals`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from workbench.instrument import torch_internals as internals
from workbench.instrument.compiled_hooks import CompiledHooks
from workbench.instrument.compose import check_metadata, check_recorded, check_store, with_store
from workbench.instrument.hooks import _weakly, warn
from workbench.instrument.recorder import Recorder, StepRecord
from workbench.instrument.reduce import Reducer
from workbench.instrument.schema import whole_number
from workbench.instrument.sites import CallSites, ModuleSelector
from workbench.instrument.watch import Watch, checked_counts

__all__ = ["CompiledWatch", "compiled_entry", "watch_compiled"]

compiled_entry = internals.compiled_entry


class CompiledWatch(Watch):
    """Records a compiled model's activations, output gradients, parameters and parameter
    gradients, per call site, step by step, with the statistics inside the compiled graphs.
    Create one with :func:`workbench.watch` (or :func:`watch_compiled`); its API is
    :class:`~workbench.instrument.watch.Watch`'s. Adding or removing a patch recompiles once; a
    patch of one call (``call=k``) makes up to ``max(k + 2, 3)`` variants of a graph that reaches its
    site (dynamo specializes the graph on the site's call count so far, counted up to ``max(k + 1, 2)``).

    Attributes:
        model: the module the compiled model runs (whose paths name the rows).
        compiled: the compiled model watched.
        fallback: why the eager hooks record instead (the model did not compile), or None.
    """

    def __init__(self, model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None,
                 every: int = 1, activations: bool = True, gradients: bool = True, parameters: bool = True,
                 parameter_grads: bool = True, histograms: bool = True, bins: int = 32,
                 recorder: Recorder | None = None, start_step: int = 1, capacity: int | None = None) -> None:
        entry = internals.compiled_entry(model)
        if entry is None:
            raise TypeError(f"watch_compiled() needs a compiled module - torch.compile(model) or a module after "
                            f"model.compile() - got an uncompiled {type(model).__name__}; watch it with "
                            "workbench.watch(model).")
        if capacity is not None:
            capacity = whole_number("capacity", capacity, 1, "a positive int (gradient rows per compiled call) or None")
        self.compiled, self._entry, self._capacity = model, entry, capacity
        self.fallback: str | None = None
        super().__init__(model, modules, exclude, every, activations, gradients, parameters, parameter_grads,
                         updates=False, histograms=histograms, bins=bins, recorder=recorder, start_step=start_step)

    def _attach(self, sites: CallSites, kinds: dict[str, set[str]], bins: int | None,
                reducers: Sequence[Reducer] | None, compiled: bool, updates: bool) -> Any:
        return CompiledHooks(self._entry, sites, kinds, bins, self._capacity, _weakly(self._hand_over),
                             self._wanted)

    def step(self, **metrics: float) -> StepRecord | None:
        """End the current step, as :meth:`Watch.step <workbench.instrument.watch.Watch.step>` does;
        after the first recorded step, hand over to the eager hooks if it ran no compiled code."""
        record = super().step(**metrics)
        why = getattr(self._hooks, "hand_over", None)
        if why is not None:  # the first recorded step ran no compiled code
            self._hand_over(why)
        return record

    def _hand_over(self, why: str) -> None:
        """The eager hooks record from now on, in the current step (the compiled ones are taken out).
        In that step the eager hooks count call indices from the hand-over on (a patch of one call
        may land on another call once), and histograms start their ranges anew."""
        warn(f"workbench.watch_compiled: {why}; falling back to the eager watch (the same rows, recorded at "
             "eager speed: its hooks run in graph breaks).")
        old = self._hooks
        interventions = dict(old.interventions)
        old.close()
        bins = self.options["bins"] if self.options["histograms"] else None
        hooks = super()._attach(self._sites, old.kinds, bins, None, True, False)
        hooks.errors = self.errors  # (one list, as before)
        hooks.interventions.update(interventions)
        hooks.paused = old.paused
        self._hooks, self.fallback = hooks, why
        hooks.start_step(self.step_index, old.recording)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step_index}"
        mode = "eager fallback" if self.fallback is not None else "compiled"
        return (f"CompiledWatch({type(self.model).__name__}, {mode}, every={self.every}, {state}, "
                f"{len(self.errors)} errors)")


def watch_compiled(model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None, every: int = 1,
                   activations: bool = True, gradients: bool = True, parameters: bool = True,
                   parameter_grads: bool = True, histograms: bool = True, bins: int = 32,
                   recorder: Recorder | None = None, store: str | Path | None = None,
                   metadata: dict[str, Any] | None = None, start_step: int = 1) -> CompiledWatch:
    """Watch a compiled model - ``torch.compile(model)`` or ``model.compile()`` - with the
    statistics computed inside its compiled graphs: what :func:`workbench.watch` does for a compiled
    model (without ``updates`` or ``reducers``). Same arguments and rows.

    ::

        compiled = torch.compile(model)
        with workbench.watch_compiled(compiled) as w:
            for batch in data:
                loss = objective(compiled(batch)); loss.backward(); opt.step(); opt.zero_grad()
                w.step(loss=loss.item())

    Raises:
        TypeError: ``model`` is not a compiled module, an option has the wrong type (as
            :func:`workbench.watch` says), or ``metadata`` is not a dict with str keys.
        ValueError: ``every``/``bins`` is not a positive int or ``start_step`` not a non-negative one
            (a float or a str included), ``modules`` selects nothing, ``metadata`` contradicts a fact
            the watch stores or gives a ``chance`` that is not a finite number, or ``activations``,
            ``gradients``, ``parameters`` and ``parameter_grads`` are all False (nothing would be recorded).
        OSError: the store cannot be written at ``store`` (no hook is left in): ``FileExistsError``
            where it holds a run, another writer writes there or it is a file; ``PermissionError``,
            ``NotADirectoryError`` ... where it cannot be created or written.
    """
    # (as workbench.watch checks them, before it hands a compiled model on to here)
    check_metadata(metadata)
    check_recorded(activations=activations, gradients=gradients, parameters=parameters,
                   parameter_grads=parameter_grads)
    return _watch_compiled(model, modules=modules, exclude=exclude, every=every, activations=activations,
                           gradients=gradients, parameters=parameters, parameter_grads=parameter_grads,
                           histograms=histograms, bins=bins, recorder=recorder, store=store, metadata=metadata,
                           start_step=start_step)


def _watch_compiled(model: nn.Module, modules: ModuleSelector, exclude: ModuleSelector, every: int,
                    activations: bool, gradients: bool, parameters: bool, parameter_grads: bool, histograms: bool,
                    bins: int, recorder: Recorder | None, store: str | Path | None, metadata: dict[str, Any] | None,
                    start_step: int) -> CompiledWatch:
    """:func:`watch_compiled` of ``metadata`` and the kinds recorded already checked (:func:`workbench.watch`
    checks them itself)."""
    every, bins, start_step = checked_counts(every, bins, start_step)  # (before the metadata is held to them)
    facts = {"every": every, "modules": repr(modules), "exclude": repr(exclude), "compiled": True,
             "activations": activations, "gradients": gradients, "parameters": parameters,
             "parameter_grads": parameter_grads, "updates": False, "histograms": histograms, "bins": bins,
             "start_step": start_step}
    if store is not None:  # (before anything is attached: the model would compile again)
        check_store(store, recorder, metadata, facts)
    w = CompiledWatch(model, modules=modules, exclude=exclude, every=every, activations=activations,
                      gradients=gradients, parameters=parameters, parameter_grads=parameter_grads,
                      histograms=histograms, bins=bins, recorder=recorder, start_step=start_step)
    return with_store(w, store, facts, metadata)
