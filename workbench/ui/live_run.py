"""A live run: a built-in experiment training under ``watch`` on a thread of its own.

:func:`start_run` checks the run form (:func:`experiment_fields`, the seed, steps, what to record,
a checkpoint to start from) and starts a :class:`LiveRun` in the app's
:class:`~workbench.ui.runs.RunManager`, which owns it. The run feeds its
:class:`~workbench.ui.views.RunView` and findings from its first step; it pauses, resumes and stops
between steps, and puts interventions (:mod:`workbench.ui.intervention_menu`) in and out there.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from workbench.checkpoints import CheckpointError, load_checkpoint, load_weights
from workbench.experiments import create, get_experiment_spec
from workbench.instrument import Recorder, Run, Watch
from workbench.instrument.schema import BINS_LIMIT_REASON, MAX_BINS, checked_bins, whole_number
from workbench.ui import figures
from workbench.ui import findings as findings_view
from workbench.ui.forms import (FIELD_INT_LIMIT, FIELD_INT_MAX, FormField, form_fields, parse_form, read_whole,
                                shown_whole)
from workbench.ui.intervention_menu import (InterventionRecord, intervention_spec, interventions_table,
                                            parse_site)
from workbench.ui.run_control import find_run
from workbench.ui.runs import RunManager, shown
from workbench.ui.views import FEED_INTERVAL, RunView, unrecorded_kinds
from workbench.ui.weights import md_literal

__all__ = ["LiveRun", "start_run", "continue_run", "continued_name", "experiment_fields", "experiment_overview",
           "devices", "RECORD_CHOICES", "STEPS_MAX"]


#: The run form's "record" choices and the watch() switch each one sets.
RECORD_CHOICES = {"activations": "activations", "output gradients": "gradients", "parameters": "parameters",
                  "parameter gradients": "parameter_grads"}


def experiment_overview(name: str | None) -> str:
    if not name:
        return "_Pick an experiment._"
    try:
        spec = get_experiment_spec(name)
    except ValueError as exc:
        return f"**{exc}**"
    return f"### {name}\n{spec.summary}"


def experiment_fields(name: str | None) -> list[FormField]:
    """The config form of an experiment (none for an unknown name: the overview says why)."""
    try:
        return form_fields(get_experiment_spec(name).params) if name else []
    except ValueError:
        return []



class LiveRun:
    """An experiment running under ``watch`` on a background thread of its own.

    Made by :meth:`workbench.ui.runs.RunManager.start`, which owns it; :meth:`start` starts it.

    Args:
        name: a registered experiment.
        config: its config overrides (validated).
        seed: the experiment's seed.
        steps: how many steps to run.
        store: a run directory to record into, or None (memory only).
        device: where the experiment trains ('cpu', 'cuda:0' ...).
        run_id: the id pages attach to it by.
        weights: a checkpoint file the model starts from (its weights), or None.
        experiment: an experiment already made (``name``, ``config`` and ``seed`` its own) to train on
            from its step: a run continued (:meth:`~workbench.ui.runs.RunManager.continue_run`). None:
            a new one.
        continues: what this run continues (a run's label and store), recorded in its store's metadata.
        **watch_options: options of ``workbench.watch``.

    Attributes:
        outcome: None while it runs, then how it ended: 'finished', 'stopped' or 'failed'
            (the status its watch was closed with).
        error: the traceback of the step that raised (a failed run), else None.
    """

    def __init__(self, name: str, config: dict[str, Any], seed: int, steps: int, store: str | None = None,
                 device: str = "cpu", run_id: str = "", weights: str | None = None, experiment: Any = None,
                 continues: str | None = None, **watch_options: Any) -> None:
        steps = whole_number("steps", steps, 1, "a positive int")
        self.id, self.name, self.seed, self.steps = run_id, name, seed, steps
        self.config, self.device, self.watch_options = dict(config), device, dict(watch_options)
        self.started = time.time()
        self.experiment = experiment if experiment is not None else create(name, seed=seed, device=device, **config)
        #: the steps a page shows it at: the experiment's count when it started, and the last it will take
        self.first_step = self.experiment.step_count
        self.total = self.first_step + steps
        self.continues = continues
        self.weights: str | None = None  # the checkpoint the model started from (its file's name)
        if weights is not None:  # before the watch: the run records the model from those weights on
            checkpoint = load_checkpoint(weights)
            load_weights(self.experiment.model, checkpoint)
            self.weights = Path(weights).name
        # the watch keeps no step in memory (the server holds many runs, finished ones too, each as
        # long as its user let it go): what pages show is fed by its stream from the first step, into
        # the view layer and the findings, and the store keeps every step
        self.watch = self.experiment.watch(store=store, recorder=Recorder(max_rows=0), **watch_options)
        self.view = RunView(label=self.label, total=self.total)
        self.view.first_step = self.first_step  # (the header counts this run's steps from the experiment's)
        self.view.unrecorded = unrecorded_kinds(self.watch.options)
        if self.watch.store is not None:  # (a replay shows the step of total, as the page did)
            self.watch.store.set_meta(total_steps=self.total)
            if continues is not None:
                self.watch.store.set_meta(continues=continues)
        self._subscription = self.watch.subscribe(self.view.feed, interval=FEED_INTERVAL)
        self.findings = findings_view.RunFindings(self.watch)
        self.error: str | None = None
        self.outcome: str | None = None
        self._stop = threading.Event()
        self._going = threading.Event()  # cleared while paused
        self._going.set()
        self._status_lock = threading.Lock()
        self._on_done: Callable[[LiveRun], Any] | None = None
        # interventions: asked for by pages, applied and removed by the run's thread between steps
        self.interventions: list[InterventionRecord] = []
        self._requests: list[tuple[Callable[[], Any], dict[str, Any]]] = []
        self._accepting = True
        self._requests_lock = threading.Lock()
        if self.weights is not None and self.watch.store is not None:
            self.watch.store.set_meta(initial_weights=self.weights)
        self._thread = threading.Thread(target=self._loop, name=f"workbench-run-{run_id or name}", daemon=True)

    def start(self, on_done: Callable[[LiveRun], Any] | None = None) -> LiveRun:
        """Start the run's thread; ``on_done(run)`` is called on it once the watch is closed."""
        self._on_done = on_done
        self.started = time.time()
        self.view.label = self.label
        self._thread.start()
        return self

    @property
    def label(self) -> str:
        """``r3 activation_mlp, seed 0, 17:05:12``: what a page lists it by."""
        return f"{self.id} {self.name}, seed {self.seed}, {time.strftime('%H:%M:%S', time.localtime(self.started))}"

    def _loop(self) -> None:
        status, error = "finished", None
        try:
            for i in range(self.steps):
                self._serve_requests()  # (between steps: never while the model runs)
                while not self._going.wait(0.1):  # paused: interventions still go in and out
                    self._serve_requests()
                if self._stop.is_set():
                    status = "stopped"
                    break
                if i == self.steps - 1:  # (the run's last step is recorded, whatever every says)
                    self.watch.record_next()
                self.experiment.step()
                self._check_interventions()
        except BaseException:  # the run's thread ends here, whatever the step raised
            status, error = "failed", traceback.format_exc()
        self._end_interventions()
        try:
            close_watch(self.watch, status, error)
        except Exception:  # closing (writing the store's last steps) failed: the run did not finish well
            status = "failed"
            error = (error or "") + traceback.format_exc()
        lost = getattr(self.watch.store, "lost", 0)
        if lost and status != "failed":  # the store closed itself as failed: say so here too
            status, error = "failed", f"{lost} step(s) could not be stored in {self.watch.store.path}"
        self._subscription.unsubscribe()  # (what was queued is delivered first: the view has every step)
        with self._status_lock:
            self.view.set_status(status, error)
            self.error, self.outcome = error, status
        if self._on_done is not None:
            self._on_done(self)

    # ------------------------------------------------------------ interventions
    def _submit(self, action: Callable[[], Any], timeout: float) -> Any:
        """Run ``action`` on the run's thread before its next step; wait for it up to ``timeout`` s.
        Returns what it returned; raises what it raised (ValueError / TypeError: bad input)."""
        slot: dict[str, Any] = {"done": threading.Event()}
        with self._requests_lock:
            if not self._accepting:
                raise ValueError(f"{self.label} has ended ({self.state}); interventions apply to a run in progress. "
                                 "Start a new run to intervene.")
            self._requests.append((action, slot))
        if not slot["done"].wait(timeout):
            raise TimeoutError(f"{self.label} did not reach the end of its step within {timeout:g} s; the "
                               "request is still queued and applies after the step in progress.")
        if "error" in slot:
            raise slot["error"]
        return slot.get("result")

    def _serve_requests(self) -> None:
        with self._requests_lock:
            requests, self._requests = self._requests, []
        for action, slot in requests:
            try:
                slot["result"] = action()
            except Exception as exc:  # (told to the page that asked; the run goes on)
                slot["error"] = exc
            slot["done"].set()

    def intervene(self, site: str, op: str, units: Any = "", k: Any = None, sigma: Any = None,
                  low: Any = None, high: Any = None, timeout: float = 30.0) -> InterventionRecord:
        """Apply an intervention from :data:`INTERVENTIONS` at ``site`` (a call site the run recorded: a
        module path, or ``path#call`` for one call of a module called several times) from the next
        step on; returns its record once the run's thread has put it in.

        Raises:
            ValueError / TypeError: an unknown site or operation, a bad parameter (named), or the same
                intervention already on at that site.
            TimeoutError: the run's step in progress outlasted ``timeout``.
        """
        module, call = parse_site(site, self.watch.paths)
        spec = intervention_spec(op, units, k, sigma, low, high)

        def put_in() -> InterventionRecord:
            # (the same intervention on twice would compound, scale x10 into x100: a second Apply of it, or one
            # queued again after a timeout, is refused; checked here, on the run's thread, where requests queue.
            # The same is the same values, not the same label: "zero units [0, 1, 2, 3, 4, ... 7] (8 of them)"
            # or "scale x1e+06" names several)
            same = next((r for r in self.interventions if r.status == "on" and (r.module, r.call, r.spec)
                         == (module, call, spec)), None)
            if same is not None:
                raise ValueError(f"{same.id} already applies {spec.label} at {same.site} (on since step {same.start}); "
                                 f"applied again it would act twice. Remove {same.id} first, or pick other values.")
            watch = self.watch
            if spec.op == "zero units":
                handle = watch.ablate(module, spec.units, dim=1, call=call, label=spec.label)
            else:
                handle = watch.patch(module, spec.function(), call=call, label=spec.label)
            # (put in between two steps: on from the step about to run; in a step not recorded, the watch's own
            # log tells so only once that step's forward ran with it)
            record = InterventionRecord(handle.id, site, module, call, spec.label, watch.step_index, handle=handle,
                                         spec=spec)
            self.interventions.append(record)
            return record

        return self._submit(put_in, timeout)

    def remove_intervention(self, intervention_id: Any, timeout: float = 30.0) -> InterventionRecord:
        """Take an intervention out after the step in progress; returns its record (status 'removed')."""
        active = [r for r in self.interventions if r.status == "on"]
        record = next((r for r in active if r.id == intervention_id), None)
        if record is None:
            ids = ", ".join(r.id for r in active) or "none"
            raise ValueError(f"No intervention {shown(intervention_id)} is on in {self.label}; on now: {ids}.")

        def take_out() -> InterventionRecord:
            if record.status == "on":
                record.handle.remove()
                record.end, record.status = self.experiment.step_count, "removed"
            return record

        return self._submit(take_out, timeout)

    def _check_interventions(self) -> None:
        """An intervention whose function failed was taken out by the watch: say so in its record."""
        if not any(r.status == "on" for r in self.interventions):
            return
        live = self.watch.interventions
        for record in self.interventions:
            if record.status == "on" and record.handle not in live:
                error = next((e["error"] for e in reversed(self.watch.errors)
                              if e.get("kind") == f"patch:{record.handle.label}" and e.get("module") == record.module),
                             "removed by the watch")
                record.status, record.end, record.error = "failed", self.experiment.step_count, error

    def _end_interventions(self) -> None:
        """The run ends: no more requests (those queued are refused), the interventions end with it."""
        with self._requests_lock:
            self._accepting = False
            requests, self._requests = self._requests, []
        for _, slot in requests:
            slot["error"] = ValueError(f"{self.label} ended before the request could apply.")
            slot["done"].set()
        for record in self.interventions:
            if record.status == "on":
                record.end, record.status = self.experiment.step_count, "ended with the run"

    def intervention_frame(self) -> pd.DataFrame:
        """The run's interventions: id, site, what, from step, to step (the last step it applied to), status."""
        return interventions_table(self.interventions)

    @property
    def running(self) -> bool:
        """Until its watch is closed (its store written and marked)."""
        return self.outcome is None

    @property
    def state(self) -> str:
        """'running', 'paused', 'stopping' (asked to stop, finishing its step), 'finished', 'stopped' or
        'failed'."""
        if self.outcome is not None:
            return self.outcome
        if self._stop.is_set():
            return "stopping"
        return "running" if self._going.is_set() else "paused"

    def pause(self) -> None:
        """Hold the run after its current step (until :meth:`resume` or a stop); returns at once. Its
        watch stays open, and interventions can still be put in or taken out."""
        with self._status_lock:
            if self.outcome is None and not self._stop.is_set():
                self._going.clear()
                self.view.set_status("paused")

    def resume(self) -> None:
        """Go on from a pause; returns at once."""
        with self._status_lock:
            if self.outcome is None and not self._stop.is_set():
                self._going.set()
                self.view.set_status("running")

    def request_stop(self) -> None:
        """Ask the run to stop after its current step (a paused run at once); returns at once."""
        self._stop.set()
        self._going.set()
        with self._status_lock:
            if self.outcome is None:
                self.view.set_status("stopping")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step and close the watch (and its store) as stopped."""
        self.request_stop()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout)

    @property
    def replaced(self) -> bool:
        """Whether the run directory this run recorded to holds another run now: one that stored no step (it
        failed or was stopped before its first) is replaced by a new run at its name
        (:meth:`~workbench.instrument.store.RunStore.replaced`). Its pages then show what it kept in memory, and
        say so."""
        return self.watch.store is not None and self.watch.store.replaced()

    def recorded_to(self) -> str:
        """Where the run records, as its page says it: ``recording to `path```, or that another run replaced it
        there; "" for a run that records to no store."""
        store = self.watch.store
        if store is None:
            return ""
        if self.replaced:
            return f"recorded to `{store.path}`, replaced since by another run there (this one stored no step)"
        return f"recording to `{store.path}`"

    def status(self) -> str:
        """The run's header (id, experiment, seed, start time), its state and step of total, for a page."""
        text = f"**{self.label}** - {self.state}: step {self.experiment.step_count} of {self.total}"
        store = self.watch.store
        if store is not None:
            text += f" - {self.recorded_to()}"
        if self.error:  # (its short message, as the header says it; the header folds the traceback under it)
            text += f"\n\n{figures.code_block(figures.error_parts(self.error)[0])}"
        if self.watch.errors:
            text += (f"\n\n{len(self.watch.errors)} instrumentation error(s); the first: "
                     f"`{self.watch.errors[0]['error']}`")
        return text


    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The statistics rows and the metrics recorded so far, read from the run's store (the
        watch keeps no step in memory).

        Raises:
            ValueError: the run records to no store.
        """
        if self.watch.store is None:
            raise ValueError(f"run {self.label} records to no store: its rows are in its pages' views alone "
                             "(start it with a run name to keep them).")
        if self.replaced:
            raise ValueError(f"run {self.label} recorded to {self.watch.store.path}, which holds another run now (it "
                             "stored no step and a new run at its name replaced it): its rows are in its pages' "
                             "views alone.")
        stored = Run(self.watch.store.path)
        return stored.to_pandas(), stored.metrics()

def close_watch(watch: Any, status: str, error: str | None) -> None:
    """Close ``watch`` with the run's status: ``close()`` (finished), ``close(status="stopped")``,
    ``close(status="failed", error=traceback)``."""
    if status == "finished":
        watch.close()
    elif error is None:
        watch.close(status=status)
    else:
        watch.close(status=status, error=error)


def devices() -> list[str]:
    """The devices an experiment can train on in this process: the CPU, then each CUDA GPU."""
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


STEPS_MAX = 10_000_000
#: The histograms' bin count the app's form shows at first: ``workbench.watch``'s default.
DEFAULT_BINS = inspect.signature(Watch).parameters["bins"].default


def start_run(manager: RunManager, name: str | None, values: dict[str, Any], seed: Any, steps: Any, every: Any,
              histograms: Any, modules: Any, store: Any, device: Any = "cpu",
              record: Sequence[str] | None = None, weights: Any = None, bins: Any = DEFAULT_BINS
              ) -> tuple[LiveRun | None, str]:
    """Validate the form and start a :class:`LiveRun` in ``manager``; returns it (or None) and a message.

    ``store`` is a run name under the manager's root ('' for none); ``record`` names the kinds of
    tensor to record (keys of :data:`RECORD_CHOICES`); None: all; ``weights`` an uploaded checkpoint
    file the model starts from (None: the experiment's own initialisation); ``bins`` the histograms' bin count
    (``workbench.watch``'s ``bins``: a whole number from 1 to ``schema.MAX_BINS``; read only with ``histograms``
    ticked). Never raises: bad input is a message.
    """
    if not name:
        return None, "Pick an experiment first."
    try:
        spec = get_experiment_spec(name)
        config = parse_form(spec.params, values, f"Experiment {name!r}")
        if modules is None:
            modules = "*"
        if not isinstance(modules, str):
            raise TypeError(f"watch modules must be text (globs, comma separated), got {shown(modules)}.")
        patterns = [p.strip() for p in modules.split(",") if p.strip()] or ["*"]
        if not isinstance(histograms, bool):
            raise TypeError(f"histograms must be ticked or not (True or False), got {shown(histograms)}.")
        choices = devices()
        device = device or "cpu"
        if device not in choices:
            raise ValueError(f"device {shown(device)} is not one of this machine's: {', '.join(choices)}.")
        if store is not None and not isinstance(store, str):
            raise TypeError(f"record to run: a run name must be text, got {shown(store)}.")
        store = (store or "").strip() or None
        if weights is not None and not isinstance(weights, (str, Path)):
            raise TypeError(f"initial weights: expected an uploaded file, got {shown(weights)}.")
        seed = _int(seed, "seed", 0, FIELD_INT_MAX, FIELD_INT_LIMIT)  # (the Python API takes up to SEED_MAX)
        # (the watch's own check after the box's reading, as the API refuses it; a box left as it is while
        # histograms are off is not read: it records none)
        bins = checked_bins(_int(bins, "histogram bins", 1, MAX_BINS, BINS_LIMIT_REASON)) if histograms else None
        run = manager.start(name, config, seed, _int(steps, "steps", 1, STEPS_MAX),
                            store=store, device=device, weights=str(weights) if weights else None,
                            every=_int(every, "record every Nth step", 1, STEPS_MAX),
                            histograms=histograms, modules=patterns, **({} if bins is None else {"bins": bins}),
                            **_record_switches(record))
    except CheckpointError as exc:
        return None, f"**Could not start from these weights:** {md_literal(str(exc))}".replace("\n", "\n\n")
    except (ValueError, TypeError, OSError) as exc:
        return None, f"**Could not start:** {exc}"
    except Exception as exc:  # e.g. out of memory building the model: a message, not a bare "Error"
        return None, f"**Could not start:** {type(exc).__name__}: {exc}"
    return run, run.status()


def continued_name(run: LiveRun, root: Any) -> str:
    """The run name a continuation of ``run`` records to by default: its own, ``-from-`` the step it
    starts at ('' where ``run`` records to no store)."""
    if run.watch.store is None:
        return ""
    return f"{root.name_of(run.watch.store.path)}-from-{run.experiment.step_count + 1}"


def continue_run(manager: RunManager, run_id: Any, steps: Any, store: Any = None) -> tuple[LiveRun | None, str]:
    """Train the experiment of the ended run ``run_id`` for ``steps`` more steps, as a new run; returns
    it (or None) and a message. Never raises: bad input is a message.

    The new run starts from a copy of the ended one's training state (model, optimizer, generators,
    step count: :meth:`~workbench.experiments.Experiment.state_dict`), so its steps are those the
    ended run would have taken next, bit for bit, numbered on from its last; the ended run stays as
    it was. It records what the ended one recorded, to ``store`` (a new run name; empty: the ended
    run's name with ``-from-`` its first step, or none where the ended run recorded to none).
    """
    run, message = find_run(manager, run_id)
    if run is None:
        return None, message
    if run.running:
        return None, f"**Could not continue:** {run.label} is still {run.state}; continue it once it has ended."
    if run.outcome == "failed":
        return None, (f"**Could not continue:** {run.label} failed at step {run.experiment.step_count}: its "
                      "training state is that of a step that did not finish. Start a new run.")
    try:
        steps = _int(steps, "steps", 1, STEPS_MAX)
        if store is not None and not isinstance(store, str):
            raise TypeError(f"record to run: a run name must be text, got {shown(store)}.")
        store = (store or "").strip() or continued_name(run, manager.root) or None
        experiment = create(run.name, seed=run.seed, device=run.device, **run.config)
        # (a copy: the optimizer's state loaded as it is would be the ended run's tensors)
        experiment.load_state_dict(copy.deepcopy(run.experiment.state_dict()), source=run.label)
        continues = run.label + (f" ({manager.root.name_of(run.watch.store.path)})" if run.watch.store else "")
        new = manager.start(run.name, run.config, run.seed, steps, store=store, device=run.device,
                            experiment=experiment, continues=continues, **run.watch_options)
    except (ValueError, TypeError, OSError) as exc:
        return None, f"**Could not continue:** {exc}"
    except Exception as exc:  # e.g. out of memory copying the model: a message, not a bare "Error"
        return None, f"**Could not continue:** {type(exc).__name__}: {exc}"
    return new, new.status()


def _record_switches(record: Sequence[str] | None) -> dict[str, bool]:
    """watch()'s four switches from the names of the kinds to record."""
    if record is not None and not isinstance(record, (str, list, tuple)):
        raise TypeError(f"record: expected a list of kinds from {', '.join(RECORD_CHOICES)}, got {shown(record)}.")
    chosen = list(RECORD_CHOICES) if record is None else [record] if isinstance(record, str) else list(record)
    unknown = [kind for kind in chosen if not isinstance(kind, str) or kind not in RECORD_CHOICES]
    if unknown:
        raise ValueError(f"record: unknown kind {shown(unknown[0])}; choose from {', '.join(RECORD_CHOICES)}.")
    if not chosen:
        raise ValueError(f"record: pick at least one of {', '.join(RECORD_CHOICES)}.")
    return {switch: label in chosen for label, switch in RECORD_CHOICES.items()}


def _int(value: Any, name: str, low: int, high: int, why: str = "") -> int:
    """A whole-number box's value (forms.read_whole: 1e3 is 1000, 2.5 none) in ``[low, high]``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is empty; give a whole number in [{low}, {high}].")
    try:
        whole = read_whole(value)
    except ValueError as err:
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {shown(value)}: {err}.") from None
    if not low <= whole <= high:
        why = f": {why}. Enter a value in that range." if why and whole > high else "."
        raise ValueError(f"{name} must lie in [{low}, {high}], got {shown_whole(value, whole)}{why}")
    return whole
