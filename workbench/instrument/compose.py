"""``watch()``: a :class:`~workbench.instrument.watch.Watch` (on a compiled model, a
:class:`~workbench.instrument.compiled.CompiledWatch`) composed with its sinks.

The watch records into its :class:`~workbench.instrument.recorder.Recorder`; sinks subscribe to
the recorder and read the rows on threads of their own: the run store
(:class:`~workbench.instrument.store.RunStore`, with ``store=``), the app's and the notebook's
views (:class:`workbench.ui.views.RunView`), a TensorBoard export of a stored run
(:meth:`Run.export <workbench.instrument.runs.Run.export>`). Nothing in the hooks knows of them.
"""

from __future__ import annotations

import json
import math
import traceback
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from workbench.instrument.recorder import Recorder
from workbench.instrument.reduce import Reducer
from workbench.instrument.sites import ModuleSelector, module_class_tree
from workbench.instrument.torch_internals import compiled_entry
from workbench.instrument.store import RunStore, expanded, written_here
from workbench.instrument.watch import Watch, checked_counts

__all__ = ["watch", "with_store"]


def watch(model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None, every: int = 1,
          activations: bool = True, gradients: bool = True, parameters: bool = True,
          parameter_grads: bool = True, updates: bool = False, histograms: bool = True, bins: int = 32,
          recorder: Recorder | None = None, store: str | Path | None = None,
          metadata: dict[str, Any] | None = None, start_step: int = 1,
          reducers: Sequence[Reducer | str] | None = None) -> Watch:
    """Watch a module: record activations and gradients per call site, step by step.

    ::

        with workbench.watch(model) as w:
            for batch in data:
                loss = objective(model(batch)); loss.backward(); opt.step(); opt.zero_grad()
                w.step(loss=loss.item())
        w.to_pandas()

    A compiled model - ``torch.compile(model)``, or a module after ``model.compile()`` - is watched
    with the statistics inside its compiled graphs, at compiled speed
    (:func:`~workbench.instrument.compiled.watch_compiled`, a
    :class:`~workbench.instrument.compiled.CompiledWatch`; docs/compile.md). With ``updates=True``
    or ``reducers`` it is watched by the eager hooks instead, which run in graph breaks: the same
    rows, at eager speed.

    Args:
        model: any ``torch.nn.Module`` (a ``torch.compile`` wrapper or a ``DistributedDataParallel``
            is watched through the module it wraps, with that module's paths).
        modules: which call sites to record: a glob on the module path (``"*"``, ``"resblocks.*"``),
            a list of globs, or a predicate ``path -> bool``. The model itself has the path ``""``.
        exclude: call sites to leave out, in the same forms.
        every: record every Nth step (the 1st, N+1th ...); in between the hooks are out.
        activations: record module outputs (every tensor leaf of a structured output).
        gradients: record gradients w.r.t. module outputs (in training mode with grad enabled).
        parameters: record parameter values, once per recorded step.
        parameter_grads: record parameter gradients: one row per parameter per recorded step, its
            ``.grad`` after the step's last backward (with several backward passes per step, as in
            gradient accumulation, the gradient accumulated over them unless zeroed in between).
        updates: record each parameter's update over a recorded step (its value at ``step()`` less
            its value when the step started: the optimizer's step; kind ``update``). Costs a copy of
            the parameters per recorded step.
        histograms: also record a histogram of every tensor (on by default; ``histograms=False``
            records the statistics alone). On the CPU a tensor of 131,072 values or more is binned
            from a sample of 16,384 (the row says ``sampled``); see docs/watch.md.
        bins: histogram bins.
        recorder: publish into this Recorder (default: a new one); one that no open watch publishes into.
        store: a run directory to write the run into (SQLite, crash-safe); read it back with
            ``workbench.load_run(store)``.
        metadata: facts of yours stored with the run (a dict with str keys: config, ``model``, a
            name for the model, in place of its class name ...); they may not contradict how the
            watch records (``every``, ``start_step``, ``modules`` and the other options, which it stores
            itself).
            Values are stored as JSON (numbers, strings, bools, None, lists and dicts of them); any
            other value (a tensor, an object) is stored as its ``str``, with a warning naming its key.
        start_step: the number of the first step.
        reducers: the reduction backends, in order of preference: a list of
            :class:`~workbench.instrument.reduce.Reducer` objects or the names ``"cpu"`` (compiled CPU
            kernels), ``"triton"`` (CUDA tensors) and ``"torch"`` (any tensor), e.g. ``["torch"]``;
            None: :func:`~workbench.instrument.reduce.default_reducers`.

    Returns:
        A :class:`~workbench.instrument.watch.Watch`; a context manager. ``close()`` removes every
        hook and closes the store.

    Raises:
        TypeError: ``model`` is not a module, a flag (``activations`` ... ``histograms``) is not a
            bool, ``modules``/``exclude`` is not a glob, a list of globs or a predicate, ``recorder``
            is not a Recorder, ``reducers`` is not a list of reducers and their names, or ``metadata``
            is not a dict with str keys.
        ValueError: ``every``/``bins`` is not a positive int or ``start_step`` not a non-negative one
            (a float, a bool or a str included; any integer, a numpy one too, is an int here),
            ``reducers`` is an empty list, names an unknown reducer or holds a reducer object that another
            open watch uses, ``recorder`` is another open watch's (each open watch needs its own),
            ``modules`` selects nothing, ``metadata``
            contradicts a fact the watch stores, or ``activations``, ``gradients``, ``parameters``,
            ``parameter_grads`` and ``updates`` are all False (nothing would be recorded).
        OSError: the store cannot be written at ``store`` (no hook is left in): ``FileExistsError``
            where it holds a run, another writer writes there or it is a file; ``PermissionError``,
            ``NotADirectoryError`` ... where it cannot be created or written.
    """
    check_metadata(metadata)
    check_recorded(activations=activations, gradients=gradients, parameters=parameters,
                   parameter_grads=parameter_grads, updates=updates)
    every, bins, start_step = checked_counts(every, bins, start_step)  # (before the metadata is held to them)
    facts = {"every": every, "modules": repr(modules), "exclude": repr(exclude), "activations": activations,
             "gradients": gradients, "parameters": parameters, "parameter_grads": parameter_grads, "updates": updates,
             "histograms": histograms, "bins": bins, "start_step": start_step}
    if store is not None:  # (before anything is attached: a compiled model's would have it compile again)
        check_store(store, recorder, metadata, facts)
    if compiled_entry(model) is not None and updates is False and reducers is None:
        from workbench.instrument.compiled import _watch_compiled  # (which imports this module)
        return _watch_compiled(model, modules=modules, exclude=exclude, every=every, activations=activations,
                               gradients=gradients, parameters=parameters, parameter_grads=parameter_grads,
                               histograms=histograms, bins=bins, recorder=recorder, store=store,
                               metadata=metadata, start_step=start_step)
    w = Watch(model, modules=modules, exclude=exclude, every=every, activations=activations,
              gradients=gradients, parameters=parameters, parameter_grads=parameter_grads, updates=updates,
              histograms=histograms, bins=bins, recorder=recorder, start_step=start_step, reducers=reducers)
    return with_store(w, store, facts, metadata)


W = TypeVar("W", bound=Watch)


def check_metadata(metadata: Any) -> None:
    """Refuse ``metadata`` that is not None or a dict with str keys, before anything is attached."""
    if metadata is not None and (not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata)):
        got = type(metadata).__name__ if not isinstance(metadata, Mapping) else \
            f"a key {next(k for k in metadata if not isinstance(k, str))!r}"
        raise TypeError(f"metadata must be a dict of facts with str keys, e.g. {{'name': 'baseline', 'lr': 1e-3}}, "
                        f"got {got}.")
    if metadata is None:
        return
    chance = metadata.get("chance")
    levels = chance.values() if isinstance(chance, Mapping) else [chance]
    if chance is not None and not (all(isinstance(k, str) for k in (chance if isinstance(chance, Mapping) else ()))
                                   and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and math.isfinite(v) for v in levels)):
        raise ValueError(f"metadata['chance'] is the chance level of the loss metrics the diagnoses judge: a finite "
                         f"number, or a dict {{metric name: finite number}}, e.g. {{'loss': math.log(10)}} for a "
                         f"cross-entropy over 10 balanced classes; got {chance!r}.")
    as_text = []
    for key, value in metadata.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            as_text.append(key)
    if as_text:
        warnings.warn(f"metadata {', '.join(map(repr, as_text))}: not a JSON value (a number, string, bool, None, "
                      "or a list or dict of them); the run stores its str. Convert it to keep it as a value, "
                      "e.g. float(x) or x.item() for a tensor or a numpy number, str(x) to keep the text.",
                      stacklevel=3)


def check_recorded(**flags: bool) -> None:
    """Refuse a watch whose flags (``activations=``, ``gradients=`` ...) record nothing."""
    if not any(flag is not False for flag in flags.values()):
        raise ValueError(f"{'=False, '.join(flags)}=False: this watch would record nothing; leave at least one "
                         "of them True (e.g. parameters=True, the cheapest: once per recorded step).")


def with_store(w: W, store: str | Path | None, facts: dict[str, Any], metadata: dict[str, Any] | None) -> W:
    """``w``, writing into a run store at ``store`` (none if None) that it closes with it; the run's
    facts are the model's name, ``facts`` (how the watch was asked to record: the module selection
    ...), its ``every`` and options as the watch took them, and ``metadata``.

    Raises:
        OSError: the store cannot be written at ``store`` (``FileExistsError``, ``PermissionError`` ...,
            as :class:`~workbench.instrument.store.RunStore` raises; the watch is closed, as failed:
            no hook is left in).
    """
    w.metadata = dict(metadata or {})
    if store is None:
        return w
    facts = {"model": type(w.model).__name__, **facts, "every": w.every, **w.options,
             "module_class_tree": module_class_tree(w.model)}
    try:
        check_uncontradicted(metadata, facts)
        # (the watch's own value where metadata repeats it: np.int64(1) for every=1 would be stored as '1')
        facts.update({key: value for key, value in (metadata or {}).items() if key == "model" or key not in facts})
        w.store = RunStore(store, facts, on_error=_report_to(w))
        w.add_sink(w.store)  # (closed with the watch, as 'failed', should attaching fail)
        w.store.attach(w.recorder)
    except BaseException as exc:  # no hook left in
        w.close("failed", "".join(traceback.format_exception(exc)))
        if isinstance(exc, FileExistsError) and "another writer" in str(exc) and _plain_rank(w.recorder, store):
            raise _with_rank_hint(exc) from None
        raise
    return w


def check_uncontradicted(metadata: dict[str, Any] | None, facts: dict[str, Any]) -> None:
    """Refuse ``metadata`` that contradicts the ``facts`` a store writes of how the watch records (its
    ``model`` aside: a name of the user's for the model): the run's record of that stays true."""
    contradicted = {k: v for k, v in (metadata or {}).items() if k in facts and k != "model" and _differs(v, facts[k])}
    if contradicted:
        raise ValueError(f"metadata {contradicted!r} contradicts what the watch stores itself "
                         f"({', '.join(f'{k}={facts[k]!r}' for k in contradicted)}); give your facts other "
                         "names, e.g. {'my_" + next(iter(contradicted)) + "': ...}.")


def _differs(value: Any, fact: Any) -> bool:
    """Whether a metadata ``value`` differs from the watch's ``fact`` (an array of several numbers does:
    its comparison has no one truth value)."""
    try:
        return not bool(value == fact)
    except (TypeError, ValueError):
        return True


def check_store(store: str | Path, recorder: Recorder | None, metadata: dict[str, Any] | None,
                facts: dict[str, Any]) -> None:
    """:meth:`RunStore.check_path` of ``store`` and :func:`check_uncontradicted` of ``metadata`` by the
    ``facts`` the watch's arguments give, before a watch that will write it attaches anything; a run
    being written there under torch.distributed says how each rank gets a store (``recorder``: the
    watch's).

    Raises:
        TypeError, ValueError, OSError: as :meth:`RunStore.check_path`; ValueError: contradicting metadata.
    """
    check_uncontradicted(metadata, facts)
    try:
        RunStore.check_path(store)
    except FileExistsError as exc:
        if "another writer" in str(exc) and _plain_rank(recorder, store):
            raise _with_rank_hint(exc) from None
        raise


def _with_rank_hint(exc: FileExistsError) -> FileExistsError:
    return FileExistsError(f"{exc} Under torch.distributed every rank's watch writes its own store: use "
                           "workbench.instrument.distributed.watch_distributed(model, store=...), whose rank 0 "
                           "writes the run as one, or give each rank a directory of its own "
                           "(store=f'runs/name-rank{torch.distributed.get_rank()}').")


def _plain_rank(recorder: Recorder | None, store: str | Path) -> bool:
    """Whether a watch recording into ``recorder`` is a plain watch (not ``watch_distributed``'s) in a
    rank of an initialized ``torch.distributed`` group, and the writer of ``store`` is not of this process:
    the ranks may all be writing one store."""
    import torch.distributed as dist

    from workbench.instrument.distributed import DistributedRecorder  # (which imports this module)

    return (dist.is_available() and dist.is_initialized() and not isinstance(recorder, DistributedRecorder)
            and not written_here(expanded(store, "store")))


def _report_to(w: Watch) -> Callable[[str], None]:
    """A store's ``on_error`` that reports into ``w`` while it lives: held weakly, as the store's
    writer thread holds the store, and a watch let go of must be collected (closing its store)."""
    ref = weakref.ref(w)

    def report(message: str) -> None:
        watch = ref()
        if watch is not None:
            store = watch.store
            watch.report_failure("store", message, outcome=store.failure_outcome if store is not None else None)

    return report
