"""The Experiment base class and the experiment registry."""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import os
import functools
import inspect
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from workbench import checkpoints
from workbench.instrument import Watch, watch
from workbench.instrument.interrupts import interrupts_held
from workbench.instrument.schema import whole_number
from workbench.params import ParamInfo, check_memory, check_seed, params_of, validate_overrides
from workbench.registry import GLOBAL_RNG, close_names, memory_accounted

__all__ = ["Experiment", "ExperimentSpec", "BackgroundRun", "evaluation", "register_experiment", "list_experiments",
           "get_experiment_spec", "create", "resume", "resolve_device"]


# GLOBAL_RNG (workbench.registry) is held through setup() and each training step: their draws happen
# inside the model's forward, so the steps of concurrent experiments take turns (each one's still use
# torch's intra-op threads).


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device`, checked to be usable in this process.

    Args:
        device: a device or its name (``'cpu'``, ``'cuda'``, ``'cuda:1'`` ...).

    Returns:
        The `torch.device`.

    Raises:
        ValueError: not a device name, or a device this process cannot use (no CUDA build,
            no such GPU ...).
    """
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise ValueError(f"device must be a device name such as 'cpu', 'cuda' or 'cuda:0' (or a torch.device), "
                         f"got {device!r} ({type(device).__name__}); the default is 'cpu'.")
    try:
        resolved = torch.device(device)
        torch.empty(0, device=resolved)  # the cheapest proof that the device exists here
    except Exception as err:  # RuntimeError, AssertionError (torch built without CUDA), TypeError
        usable = ", ".join(repr(name) for name in ["cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count())),
                                                   *(["mps"] if torch.backends.mps.is_available() else [])])
        raise ValueError(f"device {device!r} cannot be used here ({err}); pass one this process has: "
                         f"{usable}.") from None
    if resolved.type == "meta":
        raise ValueError("device 'meta' holds shapes but no values: an experiment cannot train there; "
                         "pass 'cpu' or an accelerator such as 'cuda'.")
    return resolved


def evaluation(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks an experiment's evaluation: it runs without gradients and outside the experiment's
    watch (its module calls leave no rows and count no call), also inside a training step.

    While a background run (``Experiment.start``) trains the experiment, the method refuses with a
    RuntimeError unless the run is paused (``run.pause()``) or it is called from the run's own
    steps: it would otherwise run in the middle of a step (the model in eval mode, the watch paused,
    the batch generator rewound under the step).

    Args:
        method: an ``Experiment`` method, such as ``evaluate``.

    Returns:
        The method, wrapped so.
    """

    @functools.wraps(method)
    def evaluate(self: Experiment, *args: Any, **kwargs: Any) -> Any:
        # (GLOBAL_RNG first, while a background run goes: paused, it cannot resume into a step while this evaluates)
        running = self.background is not None and not self.background.done
        with GLOBAL_RNG if running else contextlib.nullcontext():
            self._check_not_in_background(f"{method.__name__}()", paused_ok=True)
            watcher = self.watcher if self.watcher is not None and not self.watcher.closed else None
            with torch.no_grad(), (watcher.paused() if watcher is not None else contextlib.nullcontext()):
                return method(self, *args, **kwargs)

    return evaluate


class Experiment:
    """A registered model, a synthetic task, a loss and an optimizer.

    Subclasses set ``Config`` (a dataclass whose fields are the experiment's
    parameters), build everything in :meth:`setup` and do one optimizer step
    in :meth:`train_step`. Construction and every step draw random numbers
    only from the experiment's own generator and a forked global RNG, so a
    seed fixes every result and the caller's RNG state is left alone.

    Attributes:
        config: the validated config dataclass instance.
        seed: the seed everything random derives from.
        model: the module being trained.
        step_count: how many steps have been taken.
        generator: the experiment's random number generator.
        watcher: the :class:`~workbench.Watch` attached by :meth:`watch`, if any.
        device: where the model and its batches live.
        optimizer: the optimizer that trains the model; None for an experiment without one
            (``query_stream``).
        resumed_from: ``{"path": ..., "step": ...}`` once :meth:`load` (or :func:`resume`) has
            restored a training checkpoint, else None.
        chance: the chance level of its loss metrics (``{"loss": log 2}`` for a cross-entropy over two
            balanced classes), where the task has one: what a model blind to its inputs scores. Its watch
            records it in the run's metadata, and the diagnoses judge the loss against it
            (``loss_at_chance``). Empty where there is none.
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    accelerated: ClassVar[bool] = True
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    resumed_from: dict[str, Any] | None = None
    chance: dict[str, float] = {}  # (a subclass sets its own: never changed in place)

    def __init__(self, config: Any, seed: int = 0, device: str | torch.device = "cpu") -> None:
        check_seed(seed, f"Experiment {self.name!r}")
        self.device = resolve_device(device)
        if self.device.type != "cpu" and not self.accelerated:
            raise ValueError(f"Experiment {self.name!r} runs on the CPU only, got device {str(device)!r}; "
                             "pass device='cpu'.")
        self.config = config
        self.seed = seed
        self.step_count = 0
        self.watcher: Watch | None = None
        self.generator = torch.Generator().manual_seed(seed)
        with GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            self._seed_global_rng(seed)  # parameter initialisation uses the global RNG
            self.setup()

    def _seed_global_rng(self, seed: int) -> None:
        """Seed the global generators the experiment draws from: the CPU's and, on a GPU, the
        GPUs'. (Not ``torch.manual_seed``: it also seeds every other backend torch has, and one
        not initialized queues the call with its stack formatted, at a cost to every step on a
        CPU-only machine.)"""
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed_all(seed)

    def setup(self) -> None:
        """Build ``self.model`` (on ``self.device``), the data and the optimizer."""
        raise NotImplementedError

    @classmethod
    def estimate_memory(cls, config: Any) -> dict[str, int] | None:
        """Bytes the experiment needs at its peak, by part (``parameters``, ``gradients``,
        ``optimizer``, ``data``, ``activations`` ...), estimated from ``config`` alone: nothing
        is built. :func:`create` refuses a configuration whose total exceeds the memory limit.

        Args:
            config: the experiment's validated ``Config``.

        Returns:
            Bytes by part, or None: no estimate (nothing is checked); a subclass without one
            gets this.
        """
        return None

    def to_device(self, data: Any) -> Any:
        """``data`` with every tensor moved to ``self.device``.

        Args:
            data: a tensor, or lists, tuples and dicts of them (other values pass as they are).

        Returns:
            The same structure, its tensors on the experiment's device.
        """
        if isinstance(data, torch.Tensor):
            return data.to(self.device)
        if isinstance(data, (list, tuple)):
            return type(data)(self.to_device(item) for item in data)
        if isinstance(data, dict):
            return {key: self.to_device(value) for key, value in data.items()}
        return data

    def train_step(self) -> dict[str, float]:
        """One training step, written by each experiment (`step` calls it and counts it).

        Returns:
            The step's metrics, ``loss`` at least.
        """
        raise NotImplementedError

    def step(self) -> dict[str, float]:
        """Take one training step.

        A step is taken whole or not at all: one that raises (an interrupt in the middle of a
        forward) is not counted, and the watch forgets what it had recorded of it.

        Returns:
            The step's metrics, with ``step`` (1-based) and ``loss`` at least.

        Raises:
            RuntimeError: a background run (`start`) is training this experiment.

        Examples:
            >>> import workbench
            >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
            >>> sorted(exp.step())
            ['accuracy', 'loss', 'step']
            >>> exp.step()["step"]
            2
        """
        self._check_not_in_background("step()")
        watcher = self.watcher if self.watcher is not None and not self.watcher.closed else None
        # a step taken is counted and recorded whole: a kernel interrupt that comes once the training step has
        # returned is held until its watch has recorded it (one that came as the watch recorded the step left the
        # watch's step open: the next step's rows went into it, every call site a second call '#1', and each step
        # recorded under the one before)
        with contextlib.ExitStack() as taken:
            try:
                with GLOBAL_RNG, torch.random.fork_rng(devices=[]):
                    self._seed_global_rng(self.seed + 1_000_003 * (self.step_count + 1))  # dropout etc.
                    metrics = self.train_step()
                    interrupted_twice = functools.partial(self._interrupted_twice, self.step_count + 1)
                    taken.enter_context(interrupts_held(interrupted_twice))
            except BaseException:  # (a KeyboardInterrupt in the middle of a forward): no partial step recorded
                if watcher is not None:
                    watcher.discard_step()
                raise
            self.step_count += 1
            if self.watcher is not None and not self.watcher.closed:
                self.watcher.step(**metrics)  # the metrics go into the same stream as the statistics
        return {"step": self.step_count, **metrics}

    def _interrupted_twice(self, step: int) -> None:
        warnings.warn(f"Experiment {self.name!r}: interrupted twice while step {step} was counted and "
                      "recorded: it may be counted and not recorded, or recorded in part. Close the watch and "
                      "watch again before more steps.", RuntimeWarning, stacklevel=3)

    def watch(self, store: str | Path | None = None, **options: Any) -> Watch:
        """Instrument the model; from now on every :meth:`step` ends the watch's step and
        publishes the step's metrics with it.

        Args:
            store: a run directory to record into (see ``workbench.load_run``);
                the run's metadata names the experiment, its config and seed.
            **options: options of :func:`workbench.watch` (modules, every, histograms ...);
                histograms are recorded unless ``histograms=False``.

        Returns:
            The :class:`~workbench.Watch`; ``close()`` it to detach.

        Raises:
            RuntimeError: the experiment is watched already (close that watch first), or a
                background run (`start`) is training it.
            ValueError: a bad watch option (the message names it).

        Examples:
            >>> import workbench
            >>> exp = workbench.experiments.create("activation_mlp", seed=0, depth=2, width=8)
            >>> w = exp.watch(every=2)
            >>> _ = exp.run(4, progress=False)
            >>> w.close()
            >>> sorted(w.to_pandas().step.unique().tolist())  # every 2nd step, and the run's last
            [1, 3, 4]
        """
        self._check_not_in_background("watch()")
        _check_watch_options(options)
        if self.watcher is not None and not self.watcher.closed:
            raise RuntimeError(f"Experiment {self.name!r} is already watched; close that watch first "
                               "(experiment.watcher.close()).")
        metadata = {**({"chance": self.chance} if self.chance else {}),  # (the caller's may set its own)
                    **(options.pop("metadata", None) or {}),  # (the caller's, beside what the experiment records)
                    "experiment": self.name, "config": dataclasses.asdict(self.config), "seed": self.seed,
                    **({"resumed_from": self.resumed_from} if self.resumed_from else {})}
        self.watcher = watch(self.model, store=store, metadata=metadata, start_step=self.step_count + 1, **options)
        return self.watcher

    def run(self, steps: int, store: str | Path | None = None, progress: bool | None = None,
            save: str | os.PathLike | None = None, save_every: int | None = None,
            **watch_options: Any) -> list[dict[str, float]]:
        """Take ``steps`` steps; returns the metrics of each.

        Args:
            steps: how many steps.
            store: record the steps into this run directory (a watch is
                attached for the run and closed after it).
            progress: a ``tqdm.auto`` progress bar (a widget in a notebook, text in a
                terminal): ``None`` (default) shows it in a notebook or a terminal and not
                when stderr goes to a file or a pipe; ``True`` always; ``False`` never.
            save: write a training checkpoint (:meth:`save`) into this file at the end of the run;
                :func:`resume` goes on from it.
            save_every: with ``save``, also every this many steps of the experiment (its steps
                ``save_every``, ``2 * save_every`` ...), each write replacing the last whole: a
                process that dies loses the steps since the last one.
            **watch_options: options of :func:`workbench.watch`; given
                without ``store``, the run is watched in memory.

        Returns:
            The metrics of each step, as `step` returns them.

        Raises:
            ValueError: ``steps`` not an int >= 0, ``save_every`` not an int >= 1 or without
                ``save``, a ``save`` path that is a directory or under a file, or a bad watch option.
            RuntimeError: a background run (`start`) is training this experiment.

        Examples:
            >>> import workbench
            >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
            >>> [m["step"] for m in exp.run(3, progress=False)]
            [1, 2, 3]
            >>> _ = exp.run(5, store="runs/mlp", progress=False)
            >>> workbench.load_run("runs/mlp").status
            'finished'
        """
        steps = _checked_steps(steps)
        _check_progress(progress)
        _check_save(save, save_every)
        self._check_not_in_background("run()")
        watching = self.watch(store=store, **watch_options) if store is not None or watch_options else None
        bar = _progress_bar(progress, steps, self.name)
        first = self.step_count
        # (the watch closes stopped on an interrupt, failed with the error on an exception)
        with watching or contextlib.nullcontext(), bar:
            history = []
            try:
                for i in range(steps):
                    history.append(_stepped(self, bar, last=i == steps - 1))
                    _save_due(self, save, save_every, end=i == steps - 1)
            except KeyboardInterrupt:  # stopped by the user: its bar ends amber, as a stopped background run's
                bar.stopped = True  # (the red of a failure said the run had broken)
                bar.update(self.step_count - first - bar.n)  # (a step taken whole, the interrupt raised as it ended)
                raise
            if not steps:
                _save_due(self, save, save_every, end=True)
            return history

    #: the last run started by :meth:`start` (running or ended), None before the first
    background: BackgroundRun | None = None

    def start(self, steps: int, store: str | Path | None = None, progress: bool = False,
              save: str | os.PathLike | None = None, save_every: int | None = None,
              **watch_options: Any) -> BackgroundRun:
        """Train ``steps`` steps on a thread of its own and return at once: in a notebook,
        the cell is free while the run goes on (``Dashboard(run)`` shows it live, with
        Pause / Resume / Stop buttons).

        The run is watched: by the experiment's open watch if it has one (and neither
        ``store`` nor watch options are given; that watch stays open after the run), or else
        by a watch attached for the run, recording into ``store`` if given, and closed when
        the run ends: ``finished``, ``stopped`` (by :meth:`BackgroundRun.stop`) or ``failed``
        (with the error), which a stored run records.

        Args:
            steps: how many steps.
            store: record the steps into this run directory.
            progress: also show a ``tqdm.auto`` progress bar where ``start`` is called.
            save: write a training checkpoint (:meth:`save`) into this file when the run finishes
                or is stopped (not when it fails).
            save_every: with ``save``, also every this many steps of the experiment, as in :meth:`run`.
            **watch_options: options of :func:`workbench.watch` (``every``, ``histograms`` ...).

        Returns:
            The :class:`BackgroundRun`: ``pause()``, ``resume()``, ``stop()``, ``join()``,
            ``status``, ``history``.

        Raises:
            ValueError: ``steps`` not an int >= 0, bad ``save`` arguments (as :meth:`run`'s), or a bad
                watch option.
            RuntimeError: a background run is training this experiment already.

        While it trains, leave the experiment to it: ``step()``, ``run()``, ``start()`` and
        ``watch()`` refuse (a RuntimeError), and so does ``evaluate()`` unless the run is paused
        (``run.pause()`` returns once the step in progress has ended; evaluate, then
        ``run.resume()``) or has ended (``run.join()``).

        Examples:
            >>> import workbench
            >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
            >>> run = exp.start(10, every=2)
            >>> run.join()
            'finished'
            >>> len(run.history), exp.step_count
            (10, 10)
        """
        steps = _checked_steps(steps)
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be True or False, got {progress!r}.")
        _check_save(save, save_every)
        self._check_not_in_background("start()")
        own = not (self.watcher is not None and not self.watcher.closed and store is None and not watch_options)
        w = self.watch(store=store, **watch_options) if own else self.watcher
        try:
            self.background = BackgroundRun(self, steps, w, own, progress, save, save_every)
        except BaseException as exc:  # (the thread could not start ...): the watch made for it closes
            if own:
                w.close("failed", "".join(traceback.format_exception(exc)))
            raise
        return self.background

    # --- the training state: save, load, resume ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything training goes on from: the model's ``state_dict``, the optimizer's (Adam's moments
        and step counts; None without one), the experiment's generator (its batches), the step count and
        :meth:`get_extra_state`. Each step draws its other random numbers (dropout ...) from a generator
        seeded by the seed and the step, so this is the whole of it: the next steps after
        :meth:`load_state_dict` are those the experiment would have taken, bit for bit.

        Returns:
            ``model``, ``optimizer``, ``generator``, ``step`` and ``extra``; the tensors are the live
            ones (``copy.deepcopy`` it to keep a snapshot).
        """
        return {"model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "generator": self.generator.get_state(), "step": self.step_count, "extra": self.get_extra_state()}

    def get_extra_state(self) -> dict[str, Any]:
        """What else training goes on from, beyond the model, the optimizer and the generator (such as a
        record of the keys seen); an experiment with such state overrides this and :meth:`set_extra_state`.

        Returns:
            A dict of tensors, numbers, strings and lists (what ``torch.load(weights_only=True)`` reads).
        """
        return {}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_extra_state` returned; checks it before changing anything.

        Args:
            state: what :meth:`get_extra_state` returned (``{}`` for an experiment without extra state).

        Raises:
            ValueError: a key or value the experiment does not keep (the message names it).
        """
        if state:
            raise ValueError(f"extra state {sorted(state)} that experiment {self.name!r} does not keep.")

    def load_state_dict(self, state: dict[str, Any], source: str = "the state") -> None:
        """Restore a :meth:`state_dict` of an experiment of this kind and config: all or nothing (checked
        first; anything that fails as it loads puts back what was there).

        Args:
            state: what :meth:`state_dict` returned (or a training checkpoint's dict).
            source: names where ``state`` came from in the messages (a file's path).

        Raises:
            workbench.checkpoints.CheckpointError: (a ValueError) a part missing, or one that does not fit
                this experiment's model, optimizer or generator: the message says which, and how.
            RuntimeError: the experiment is watched (close the watch first) or trains in the background.
        """
        self._load_state(state, source, f"It was saved from another model; resume it with "
                                        f"workbench.experiments.resume({source}), which builds the model it holds.")

    def _load_state(self, state: dict[str, Any], source: str, fix: str) -> None:
        """:meth:`load_state_dict`, ``fix`` saying what to do about a model or an optimizer that does not fit."""
        self._check_not_in_background("load_state_dict()")
        if self.watcher is not None and not self.watcher.closed:
            raise RuntimeError(f"Experiment {self.name!r} is watched; close its watch before loading a training "
                               "state (experiment.watcher.close()): a watch opened after it numbers its steps on "
                               "from the state's step.")
        parts = ("model", "optimizer", "generator", "step", "extra")
        if not isinstance(state, dict) or any(part not in state for part in parts):
            have = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise checkpoints.CheckpointError(f"{source} is not an experiment's training state: it needs {parts}, "
                                              f"has {have}. Pass what experiment.state_dict() returns.")
        step, generator = state["step"], state["generator"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise checkpoints.CheckpointError(f"{source}: step {step!r} is not an int >= 0.")
        own = self.generator.get_state()
        if not isinstance(generator, torch.Tensor) or generator.dtype != own.dtype or generator.shape != own.shape:
            raise checkpoints.CheckpointError(f"{source}: the generator state is not a {tuple(own.shape)} "
                                              f"{own.dtype} tensor (torch.Generator.get_state()).")
        if (state["optimizer"] is None) != (self.optimizer is None):
            raise checkpoints.CheckpointError(
                f"{source} {'has no' if state['optimizer'] is None else 'has an'} optimizer state; experiment "
                f"{self.name!r} {'has' if self.optimizer is not None else 'has none'}. {fix}")
        if not isinstance(state["model"], dict):
            raise checkpoints.CheckpointError(f"{source}: the model's state is a {type(state['model']).__name__}, "
                                              "not a state_dict.")
        checkpoints.check_fits(self.model, state["model"], f"{source}: its model", fix)
        if self.optimizer is not None:
            checkpoints.check_optimizer_state(self.optimizer, state["optimizer"], source, fix)
        before = copy.deepcopy(self.state_dict())
        try:
            self._set_state(state, source)
        except BaseException as exc:
            self._set_state(before, source)
            if isinstance(exc, (ValueError, TypeError, RuntimeError, KeyError)):
                raise checkpoints.CheckpointError(f"{source} does not fit experiment {self.name!r}: {exc} "
                                                  "Nothing was changed.") from None
            raise

    def _set_state(self, state: dict[str, Any], source: str) -> None:
        self.model.load_state_dict(state["model"], strict=True)  # (checked: it fits)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.set_extra_state(state["extra"])
        self.step_count = state["step"]

    def save(self, path: str | os.PathLike) -> Path:
        """Write a training checkpoint: the experiment's name, config and seed with its :meth:`state_dict`,
        whole or not at all (a crash while writing leaves the file as it was). :func:`resume` builds the
        experiment again from it and goes on as this one would; ``checkpoints.load_weights`` reads its
        model's weights alone.

        Args:
            path: the file (its directory is made if needed).

        Returns:
            The path written.

        Raises:
            OSError: the file cannot be written (the message names it).
            RuntimeError: a background run is training the experiment (pause it: ``run.pause()``).

        Examples:
            >>> import workbench
            >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
            >>> _ = exp.run(3, progress=False)
            >>> _ = exp.save("mlp.pt")
            >>> again = workbench.experiments.resume("mlp.pt")
            >>> again.step_count, again.step()["loss"] == exp.step()["loss"]
            (3, True)
        """
        self._check_not_in_background("save()", paused_ok=True)
        return checkpoints.write_checkpoint(
            {"format": checkpoints.TRAINING_FORMAT, "version": checkpoints.TRAINING_VERSION, "experiment": self.name,
             "config": dataclasses.asdict(self.config), "seed": self.seed, **self.state_dict()}, path)

    def load(self, path: str | os.PathLike, max_bytes: int = checkpoints.DEFAULT_MAX_BYTES) -> None:
        """Restore a training checkpoint (:meth:`save`) of this experiment, config and seed: the next step
        is the one after the checkpoint's, as it would have been. (:func:`resume` builds the experiment a
        checkpoint names.)

        Args:
            path: the file :meth:`save` wrote.
            max_bytes: the largest file read.

        Raises:
            workbench.checkpoints.CheckpointError: (a ValueError) naming the path, before anything changes:
                not a training checkpoint (weights only: the message says how to load those), damaged or
                truncated, of another experiment, config or seed, or a model that does not fit.
            RuntimeError: the experiment is watched or trains in the background.
        """
        where = repr(str(path))
        state = checkpoints.read_training_checkpoint(path, max_bytes)
        name, config, seed = state["experiment"], state["config"], state["seed"]
        mine = dataclasses.asdict(self.config)
        differ = [f"{k}={config.get(k, '(absent)')!r} (this experiment's: {mine.get(k, '(absent)')!r})"
                  for k in {**config, **mine} if config.get(k, ...) != mine.get(k, ...)]
        if name != self.name or seed != self.seed or differ:
            what = (f"experiment {name!r}, not {self.name!r}" if name != self.name else
                    f"seed {seed}, not {self.seed}" if seed != self.seed else f"another config: {', '.join(differ)}")
            raise checkpoints.CheckpointError(
                f"{where} is a training checkpoint of {what}; it goes on only as the run it was saved from. Resume "
                f"it with workbench.experiments.resume({where}), which builds that experiment, or create "
                f"{name!r} with seed={seed} and its config ({', '.join(f'{k}={v!r}' for k, v in config.items())}).")
        self.load_state_dict(state, where)
        self.resumed_from = {"path": str(path), "step": state["step"]}

    def _check_not_in_background(self, what: str, paused_ok: bool = False) -> None:
        """Refuse ``what`` while a background run trains this experiment (its own thread may: an
        evaluation inside its step); ``paused_ok``: allowed while the run waits, paused between steps."""
        running = self.background
        if running is None or running.done or running.on_its_thread():
            return
        if paused_ok:
            if running.held:
                return
            raise RuntimeError(f"Experiment {self.name!r} is training in the background (step {self.step_count}, "
                               f"{running.status}); {what} would run between the halves of its steps and change "
                               "them. Pause it first (run.pause(), which returns between two steps; evaluate; then "
                               "run.resume()), or wait for it (run.join()).")
        raise RuntimeError(f"Experiment {self.name!r} is training in the background (step "
                           f"{self.step_count}, {running.status}); {what} would interleave with its steps. "
                           "Stop it (experiment.background.stop()) or wait for it (.join()) first.")

    def __repr__(self) -> str:
        on = f", device='{self.device}'" if self.device.type != "cpu" else ""
        return f"{type(self).__name__}(seed={self.seed}{on}, step={self.step_count}, config={self.config})"


#: what an experiment sets on its watch itself
_SET_BY_THE_EXPERIMENT = ("model", "store", "start_step")


def _check_watch_options(options: dict[str, Any]) -> None:
    """Options of ``workbench.watch`` only, named as it names them (a typo was Python's "watch() got an
    unexpected keyword argument"); the model, the store and the first step are the experiment's."""
    accepted = [name for name in inspect.signature(watch).parameters if name not in _SET_BY_THE_EXPERIMENT]
    for name in options:
        if name == "start_step":
            raise TypeError("start_step is set by the experiment (its next step); leave it out.")
        if name not in accepted:
            close = close_names(name, accepted, n=1)
            raise TypeError(f"{name!r} is not an option of workbench.watch"
                            + (f"; did you mean {close[0]!r}?" if close else ".")
                            + f" Its options: {', '.join(accepted)}.")
    if "metadata" in options and not isinstance(options["metadata"], (dict, type(None))):
        raise TypeError(f"metadata must be a dict, got {type(options['metadata']).__name__}.")


def _check_save(save: Any, save_every: Any) -> None:
    """A ``save`` path and ``save_every`` that can be used, checked before the first step."""
    if save_every is not None and (isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1):
        raise ValueError(f"save_every must be an int >= 1 (steps between training checkpoints), got {save_every!r}.")
    if save is None:
        if save_every is not None:
            raise ValueError(f"save_every={save_every} needs save=PATH, the file the checkpoints are written to.")
        return
    if not isinstance(save, (str, os.PathLike)):
        raise TypeError(f"save must be a file path (str or Path), got {type(save).__name__}.")
    path = Path(save)
    if path.is_dir():
        raise ValueError(f"save={str(save)!r} is a directory; pass a file path such as {str(path / 'train.pt')!r}.")
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ValueError(f"save={str(save)!r} cannot be written: {str(above)!r} is a file, not a directory. "
                         "Pick a path under a directory.")


def _check_timeout(timeout: Any) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}.")


def _checked_steps(steps: Any) -> int:
    return whole_number("steps", steps, 0, "a non-negative int")


def _check_progress(progress: Any) -> None:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (shown where it can be seen), got {progress!r}.")


class _NoBar:
    """What a run without a progress bar updates."""

    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _progress_bar(progress: bool | None, steps: int, name: str) -> Any:
    """A ``tqdm.auto`` bar of ``steps`` (a widget in a notebook; text on stderr elsewhere)."""
    if progress is False:
        return _NoBar()
    from tqdm.auto import tqdm
    from tqdm.notebook import tqdm as notebook_tqdm

    # disable=None: tqdm's own rule, off where stderr is not a terminal (in a notebook, shown)
    options = dict(total=steps, desc=name, unit="step", disable=None if progress is None else False,
                   dynamic_ncols=True)
    return _notebook_bar_class()(**options) if issubclass(tqdm, notebook_tqdm) else tqdm(**options)


@functools.cache
def _notebook_bar_class() -> type:
    """tqdm's notebook bar, whose saved text is its end (made on first use: it imports IPython)."""
    from IPython.display import display
    from tqdm.notebook import tqdm as notebook_tqdm

    class NotebookBar(notebook_tqdm):
        """tqdm's widget bar, whose text a saved notebook keeps is its last state. A notebook keeps
        a widget's text beside it and shows that text where the widget is gone (the notebook
        reopened, on GitHub); tqdm displays its bar once, at 0%, so a finished run read "0%"."""

        def __init__(self, **options: Any) -> None:
            super().__init__(display=False, **options)
            self._display = None if self.disable else display(self._bundle(), raw=True, display_id=True)

        def _bundle(self) -> dict[str, Any]:
            """The widget, with the bar as tqdm writes it (ipywidgets' text is its repr, cut at 110
            characters)."""
            return {**self.container._repr_mimebundle_(), "text/plain": self.container.__repr__(pretty=True)}

        #: set before close() by a run the user stopped: its bar ends amber, not in the red of a failure
        stopped = False

        def close(self) -> None:
            stopped = self.stopped and not self.disable and self.total and self.n < self.total
            super().close()  # (which disables it)
            if stopped:
                self.disp(bar_style="warning", check_delay=False)
            if self._display is not None:  # (the same widget, with its text as it ends)
                self._display.update(self._bundle(), raw=True)
                self._display = None

    return NotebookBar


def _stepped(experiment: Experiment, bar: Any, last: bool = False) -> dict[str, float]:
    """One step of a run of several; its ``last`` step is recorded whatever the watch's ``every``
    says (a run of 200 steps recorded every 10th ends with its step 200, not 191)."""
    watcher = experiment.watcher
    if last and watcher is not None and not watcher.closed:
        watcher.record_next()
    metrics = experiment.step()
    if "loss" in metrics:
        bar.set_postfix_str(f"loss {metrics['loss']:.4g}", refresh=False)
    bar.update(1)
    return metrics


def _save_due(experiment: Experiment, save: str | os.PathLike | None, save_every: int | None, end: bool) -> None:
    """After a step of a run: write its training checkpoint at the run's ``end`` and at every ``save_every``-th
    step of the experiment (once when both)."""
    if save is not None and (end or (save_every and experiment.step_count % save_every == 0)):
        experiment.save(save)


#: background runs in progress, in the order they started: the process stops them (their stores say
#: ``stopped``) as it exits, rather than killing their threads in the middle of a step
_RUNNING: dict[BackgroundRun, None] = {}
_RUNNING_LOCK = threading.Lock()


def running() -> list[BackgroundRun]:
    """The background runs in progress in this process (:meth:`Experiment.start`), the first started
    first: also those no variable names any more, such as the run of a notebook cell run again.

    Returns:
        The runs not yet ended (``running``, ``paused`` or ``stopping``); ``run.stop()`` stops one.

    Examples:
        >>> import workbench
        >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
        >>> _ = exp.start(100_000)  # (the run kept in no name, as when a cell is run again)
        >>> [run.stop() for run in workbench.experiments.running() if run.experiment is exp]
        ['stopped']
    """
    with _RUNNING_LOCK:
        started = list(_RUNNING)  # (also those ended whose callbacks still run: the process waits for them)
    return [run for run in started if run.status in ("running", "paused", "stopping")]


@atexit.register
def _stop_background_runs() -> None:
    with _RUNNING_LOCK:
        started = list(_RUNNING)
    for run in started:
        run._stopped_by = "as the process exited"  # (not "by the user": the store says why it stopped)
        run.stop(wait=True, timeout=30.0)


class BackgroundRun:
    """A run of an experiment on a thread of its own (see :meth:`Experiment.start`).

    Attributes:
        experiment: what trains.
        watch: the watch recording the run (``Dashboard(run)`` draws from it).
        steps: the steps this run takes; ``first_step`` the experiment's step before it, so
            it ends at step ``total = first_step + steps``.
        history: the metrics of each step taken so far.
        error: the formatted traceback of a failed run; what stopped a stopped one ("stopped by the user after
            step N", as its watch's ``error`` and its store say); None while it runs and once it finished.

    ``status`` is ``running``, ``paused``, ``stopping`` (asked to stop, ending its step),
    then ``finished``, ``stopped`` or ``failed``. Pause and stop act between steps: a step
    is always taken whole or not at all.
    """

    def __init__(self, experiment: Experiment, steps: int, watch: Watch, own_watch: bool, progress: bool,
                 save: str | os.PathLike | None = None, save_every: int | None = None) -> None:
        self.experiment, self.watch, self.steps = experiment, watch, steps
        self._save, self._save_every = save, save_every
        self.first_step = experiment.step_count
        self.total = self.first_step + steps
        self.history: list[dict[str, float]] = []
        self.error: str | None = None
        self._own_watch = own_watch
        self._stopped_by = "by the user"  # what a stopped run's store says stopped it
        self._state = "running"
        self._held = False  # the thread waits, paused between two steps
        self._callbacks: list[Callable[[BackgroundRun], Any]] = []
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._bar = _progress_bar(True if progress else False, steps, experiment.name)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"workbench-{experiment.name}-background")
        with _RUNNING_LOCK:
            _RUNNING[self] = None
        try:
            self._thread.start()
        except BaseException:
            with _RUNNING_LOCK:
                _RUNNING.pop(self, None)
            raise

    @property
    def status(self) -> str:
        """``running``, ``paused``, ``stopping``, then ``finished``, ``stopped`` or ``failed``."""
        return self._state

    @property
    def done(self) -> bool:
        """The run has ended (finished, stopped or failed) and its watch is closed."""
        return self._done.is_set()

    @property
    def step(self) -> int:
        """The last step this run took (``first_step`` before its first; ``total`` at the end of a
        finished run), whatever the experiment did after it."""
        return self.first_step + len(self.history)

    @property
    def held(self) -> bool:
        """Paused and waiting between two steps (what ``pause()`` waits for): the experiment is free
        to evaluate until :meth:`resume`."""
        with self._cond:
            return self._held and self._state == "paused"

    def on_its_thread(self) -> bool:
        """Whether the caller is the run's own thread (its steps, and what they call).

        Returns:
            True on the run's thread.
        """
        return threading.current_thread() is self._thread

    def pause(self, wait: bool = True) -> str:
        """Pause after the current step (the thread waits; :meth:`resume` goes on).

        Args:
            wait: return once the step in progress has ended.

        Returns:
            The status (``paused``, or how the run ended if it had).
        """
        with self._cond:
            if self._state == "running":
                self._state = "paused"
                self._cond.notify_all()
            if wait and threading.current_thread() is not self._thread:
                self._cond.wait_for(lambda: self._held or self._state != "paused")
            return self._state

    def resume(self) -> str:
        """Go on after :meth:`pause`.

        Returns:
            The status (``running``, or how the run ended if it had: a run stopped is not started again, and a
            cell's ``run.resume()`` said nothing of it).
        """
        with self._cond:
            if self._state == "paused":
                self._state = "running"
                self._cond.notify_all()
            return self._state

    def stop(self, wait: bool = True, timeout: float | None = None) -> str:
        """Stop after the current step (also a paused run) and close the run's watch as
        ``stopped``.

        Args:
            wait: return when the run has ended.
            timeout: with ``wait``, the most seconds to wait (None: no limit).

        Returns:
            The status: ``stopped`` (or ``finished`` / ``failed`` if it had ended), ``stopping``
            while it ends.

        Raises:
            ValueError: a timeout that is not a number >= 0 or None.
        """
        _check_timeout(timeout)
        with self._cond:
            if self._state in ("running", "paused"):
                self._state = "stopping"
                self._cond.notify_all()
        return self.join(timeout) if wait else self._state

    def join(self, timeout: float | None = None) -> str:
        """Wait until the run ends.

        Args:
            timeout: the most seconds to wait (None: no limit).

        Returns:
            The status: ``finished``, ``stopped`` or ``failed`` once it has ended.

        Raises:
            ValueError: a timeout that is not a number >= 0 or None.
        """
        _check_timeout(timeout)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return self._state

    def on_done(self, callback: Callable[[BackgroundRun], Any]) -> None:
        """Call ``callback(run)`` once the run has ended and its watch is closed, on the run's
        thread, before :meth:`join` returns (at once if it has ended already). A callback that
        raises is reported with a ``RuntimeWarning``.

        Args:
            callback: called with this run.

        Raises:
            TypeError: ``callback`` is not callable.
        """
        if not callable(callback):
            raise TypeError(f"on_done() needs a callable, got {callback!r}.")
        with self._cond:
            if not self._done.is_set() and self._state not in ("finished", "stopped", "failed"):
                self._callbacks.append(callback)
                return
        self._call(callback)

    def _call(self, callback: Callable[[BackgroundRun], Any]) -> None:
        try:
            callback(self)
        except Exception as exc:
            try:
                warnings.warn(f"workbench: a callback of {self!r} raised: {exc!r}", RuntimeWarning, stacklevel=2)
            except Exception:
                pass

    def _next(self) -> bool:
        """Wait while paused; False when asked to stop."""
        with self._cond:
            self._held = self._state == "paused"
            self._cond.notify_all()
            while self._state == "paused":
                self._cond.wait()
            self._held = False
            return self._state != "stopping"

    def _loop(self) -> None:
        status, error = "finished", None
        try:
            for i in range(self.steps):
                if not self._next():
                    status = "stopped"
                    break
                self.history.append(_stepped(self.experiment, self._bar, last=i == self.steps - 1))
                _save_due(self.experiment, self._save, self._save_every, end=i == self.steps - 1)
            if status == "stopped" or not self.steps:  # (between two steps: a whole state to go on from)
                _save_due(self.experiment, self._save, self._save_every, end=True)
        except BaseException as exc:  # the run fails; the process goes on
            status, error = "failed", "".join(traceback.format_exception(exc))
        finally:
            self._bar.stopped = status == "stopped"
            self._bar.close()
            if status == "stopped":
                error = f"stopped {self._stopped_by} after step {self.experiment.step_count}"
            try:
                if self._own_watch:
                    try:
                        self.watch.close(status, error if status != "finished" else None)
                    except Exception:  # (a sink's close() raised: the run failed, its thread ends here as it does)
                        status, error = "failed", traceback.format_exc()
            finally:
                if self._own_watch and self.watch.status == "failed":  # (a store that lost steps, a sink whose
                    status, error = "failed", self.watch.error  # close() raised: the watch says it, as its store)
                with self._cond:
                    self.error = error if status != "finished" else None  # (the watch's error: one message)
                    self._state = status
                    self._cond.notify_all()
                    callbacks, self._callbacks = self._callbacks, []
                for callback in callbacks:
                    self._call(callback)
                self._done.set()
                with _RUNNING_LOCK:
                    _RUNNING.pop(self, None)

    def __repr__(self) -> str:
        return (f"BackgroundRun({self.experiment.name!r}, {self.status}, step {self.step} of {self.total})")


@dataclass(frozen=True)
class ExperimentSpec:
    """A registered experiment: its class and its parameter metadata.

    Attributes:
        name: the registry name.
        summary: one line (the first of the class's docstring).
        cls: the `Experiment` subclass.
        params: the parameters of its ``Config``, with types, defaults, ranges and help.
    """

    name: str
    summary: str
    cls: type[Experiment]
    params: tuple[ParamInfo, ...]

    def create(self, seed: int = 0, device: str | torch.device = "cpu", memory_limit: Any = None,
               **config: Any) -> Experiment:
        """Create the experiment; see :func:`workbench.experiments.create`, which calls this.

        Args:
            seed: fixes every random draw; an int in [0, 2**63 - 1].
            device: where the model trains.
            memory_limit: the most bytes the experiment may need (see `create`).
            **config: fields of the experiment's ``Config``.

        Returns:
            The experiment.

        Raises:
            ValueError: a value outside its choices or range, a bad seed or device.
            TypeError: an unknown field or a value of the wrong type.
            workbench.params.MemoryLimitError: the estimate exceeds the limit.
        """
        owner = f"Experiment {self.name!r}"
        checked = validate_overrides(self.params, config, owner)
        check_seed(seed, owner)
        resolved = resolve_device(device)
        configuration = self.cls.Config(**checked)
        shown = ", ".join(f"{k}={v!r}" for k, v in checked.items()) or "defaults"
        estimate = self.cls.estimate_memory(configuration)
        check_memory(estimate, f"{owner} ({shown})", memory_limit, resolved)
        if estimate is None:  # no estimate of its own: the models it builds check theirs
            return self.cls(configuration, seed=seed, device=device)
        with memory_accounted():  # the models it builds are in its estimate, checked against its limit
            return self.cls(configuration, seed=seed, device=device)


_EXPERIMENTS: dict[str, ExperimentSpec] = {}


def register_experiment(name: str) -> Callable[[type[Experiment]], type[Experiment]]:
    """Class decorator registering an :class:`Experiment` subclass under ``name``.

    Args:
        name: the experiment's registry name.

    Returns:
        The decorator, which returns the class unchanged (with ``name`` set).

    Raises:
        ValueError: the name is taken (`unregister_experiment` frees it).
        TypeError: the class has no ``Config`` dataclass.
    """

    def decorate(cls: type[Experiment]) -> type[Experiment]:
        if name in _EXPERIMENTS:
            raise ValueError(f"An experiment named {name!r} is already registered. Choose another name or call "
                             "workbench.experiments.unregister_experiment first.")
        if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
            raise TypeError(f"Experiment {name!r}: {cls.__name__}.Config must be a dataclass.")
        cls.name = name
        doc = (cls.__doc__ or name).strip().splitlines()[0]
        _EXPERIMENTS[name] = ExperimentSpec(name, doc, cls, params_of(cls.Config))
        return cls

    return decorate


def unregister_experiment(name: str) -> None:
    """Remove a registered experiment (for tests and a notebook cell that registers one again).

    Args:
        name: a registered name.

    Raises:
        ValueError: the name is unknown (the message suggests close names).
    """
    get_experiment_spec(name)
    del _EXPERIMENTS[name]


def list_experiments() -> list[str]:
    """Sorted names of the registered experiments.

    Returns:
        The names, sorted.

    Examples:
        >>> import workbench
        >>> workbench.experiments.list_experiments()
        ['activation_mlp', 'efficientzero_dynamics', 'ilql', 'query_stream']
    """
    return sorted(_EXPERIMENTS)


def get_experiment_spec(name: str) -> ExperimentSpec:
    """The spec of a registered experiment.

    Args:
        name: a name from `list_experiments`.

    Returns:
        Its `ExperimentSpec`: the class, a one-line summary and the parameters.

    Raises:
        ValueError: unknown name, with close matches suggested.

    Examples:
        >>> import workbench
        >>> [p.name for p in workbench.experiments.get_experiment_spec("activation_mlp").params][:3]
        ['activation', 'depth', 'width']
    """
    try:
        return _EXPERIMENTS[name]
    except (KeyError, TypeError):
        close = close_names(str(name), list(_EXPERIMENTS))
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"Unknown experiment {name!r}.{hint} See workbench.experiments.list_experiments()."
        ) from None


def resume(path: str | os.PathLike, device: str | torch.device = "cpu", memory_limit: Any = None,
           max_bytes: int = checkpoints.DEFAULT_MAX_BYTES) -> Experiment:
    """The experiment a training checkpoint (:meth:`Experiment.save`) holds, built again from its name,
    config and seed and restored to its step: its next steps are those the saved one would have taken,
    bit for bit (on the same device and torch).

    Args:
        path: the file :meth:`Experiment.save` (or the command line's ``--save``) wrote.
        device: where to train now ('cpu', 'cuda' ...).
        memory_limit: as :func:`create`'s.
        max_bytes: the largest file read.

    Returns:
        The experiment at the checkpoint's step, not watched: a watch opened now numbers its steps on
        from there, and its run's metadata says ``resumed_from``.

    Raises:
        workbench.checkpoints.CheckpointError: (a ValueError) naming the path: not a training checkpoint
            (weights only: the message says how to load those), damaged or truncated, of an experiment or
            config this workbench does not have, or a model that does not fit.
        ValueError: a device this process cannot use.

    Examples:
        >>> import workbench
        >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
        >>> _ = exp.run(5, progress=False, save="train.pt")
        >>> workbench.experiments.resume("train.pt").step_count
        5
    """
    resolve_device(device)  # (the caller's argument before the file's contents)
    where = repr(str(path))
    state = checkpoints.read_training_checkpoint(path, max_bytes)
    name = state["experiment"]
    if name not in _EXPERIMENTS:
        raise checkpoints.CheckpointError(f"{where} is a training checkpoint of experiment {name!r}, which is not "
                                          f"registered here (these are: {', '.join(list_experiments())}). Import the "
                                          "module that registers it, then resume.")
    spec = _EXPERIMENTS[name]
    try:
        validate_overrides(spec.params, state["config"], f"Experiment {name!r}")
        check_seed(state["seed"], f"Experiment {name!r}")
    except (TypeError, ValueError) as exc:
        raise checkpoints.CheckpointError(f"{where} holds a config this workbench's experiment {name!r} does not "
                                          f"take ({exc}); it was saved by another version.") from None
    experiment = spec.create(seed=state["seed"], device=device, memory_limit=memory_limit, **state["config"])
    experiment._load_state(state, where, "Its config builds another model here: the file was edited, or saved by "
                                         "another version of the model's code; resume from a checkpoint saved here.")
    experiment.resumed_from = {"path": str(path), "step": state["step"]}
    return experiment


def create(name: str, seed: int = 0, device: str | torch.device = "cpu", memory_limit: Any = None,
           **config: Any) -> Experiment:
    """Create a registered experiment.

    Before anything is built, the memory the experiment needs at its peak
    (parameters, gradients, optimizer state, data, activations) is estimated
    from the config, and a configuration that would not fit is refused.

    Args:
        name: a name from :func:`list_experiments`.
        seed: fixes data, initialisation and every random draw; an int in
            [0, 2**63 - 1].
        device: where the model trains ('cpu', 'cuda', 'cuda:1' ...); the data
            is drawn on the CPU, so a seed gives the same batches everywhere.
        memory_limit: the most bytes the experiment may need: an int, or a size
            such as ``'16GB'``; ``'off'`` skips the check. By default the
            environment variable ``WORKBENCH_MEMORY_LIMIT`` (same forms), else
            80 % of the memory available on the device now.
        **config: fields of the experiment's ``Config``.

    Returns:
        The experiment, ready to :meth:`~Experiment.step`.

    Raises:
        ValueError: unknown name, a value outside its choices or range, a seed outside
            [0, 2**63 - 1], or a device this process cannot use.
        TypeError: an unknown config field or a value of the wrong type.
        workbench.params.MemoryLimitError: (a ValueError) the estimate exceeds the limit.

    Examples:
        >>> import workbench
        >>> exp = workbench.experiments.create("activation_mlp", seed=0, activation="tanh", depth=2, width=8)
        >>> exp.model.layers[1]
        Tanh()
        >>> workbench.experiments.create("activation_mlp", depth=0)
        Traceback (most recent call last):
        ...
        ValueError: Experiment 'activation_mlp': parameter 'depth' must lie in [1, 16], got 0.
    """
    spec = get_experiment_spec(name)
    check_seed(seed, f"Experiment {spec.name!r}")
    return spec.create(seed=seed, device=device, memory_limit=memory_limit, **config)
