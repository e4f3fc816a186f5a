"""Experiments and runs: run a built-in experiment under ``watch`` and see it live; replay stored runs.

Each live run owns a :class:`~workbench.ui.views.RunView`, fed by its watch's stream from the
first step; a stored run is replayed into one (:class:`ViewCache`). A run page draws from the view
only (:func:`draw_page`: the header, metrics, a statistic per call site, distributions, the
layer x step heatmap, NaN/Inf), as :mod:`workbench.ui.figures`' Plotly specs, so a refresh costs
in proportion to the new steps and sends figures of bounded size however long the run.

Handlers are plain functions over the core API (tested without a browser);
:func:`layout` / :func:`wire` put them into the Gradio app. The Jupyter dashboard
(``workbench.ui.notebook.Dashboard``) draws the same views.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import re
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from workbench.checkpoints import STATE_DICT, CheckpointError, load_checkpoint, load_weights
from workbench.experiments import create, get_experiment_spec, list_experiments
from workbench.instrument import KINDS, STAT_COLUMNS, Recorder, Run, RunError
from workbench.instrument.interventions import MARKER, listed
from workbench.ui.forms import (FIELD_INT_LIMIT, FIELD_INT_MAX, FormField, form_fields, parse_form,
                                pop_up_text)
from workbench.ui import figures
from workbench.ui import findings as findings_view
from workbench.ui.runs import PathRefused, RunManager, RunsRoot, shown
from workbench.ui.views import FEED_INTERVAL, RunView, Site

logger = logging.getLogger(__name__)

__all__ = ["LiveRun", "experiment_fields", "experiment_overview", "start_run", "runs_frame", "run_choices", "attach",
           "detach", "stop_run", "pause_run", "run_controls", "run_views", "run_table", "replay", "Controls", "Page",
           "draw_page", "ViewCache", "compare_runs", "export_run", "STATISTICS", "CSS", "layout", "wire"]

STATISTICS = [c for c in STAT_COLUMNS if c != "numel"]
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


# ---------------------------------------------------------------- interventions (safe menu; no code from pages)
#: What a page may do to a call site's output: the watch's ablate, or one of these fixed functions through patch.
INTERVENTIONS = ("zero units", "scale", "noise", "clamp")
#: Metrics named so mark the steps an intervention was on (value 1): ``intervention/i1: scale x2 at layers.1``.
INTERVENTION_METRIC = MARKER  # (the watch logs a marker metric of each intervention in place at a step)
MAX_UNITS = 4096
_LIMIT = 1e6  # the largest |k|, sigma, a, b the menu takes


@dataclass
class InterventionRecord:
    """One intervention on a live run: where, what, the steps it applied to, and how it ended."""

    id: str
    site: str  # as picked (``path`` or ``path#call``)
    module: str
    call: int | None
    what: str
    start: int  # the first step it applied to
    end: int | None = None  # the last step it applied to (None: on)
    status: str = "on"  # on, removed, failed, ended with the run
    error: str = ""
    handle: Any = None  # the watch's Intervention


INTERVENTION_COLUMNS = ["id", "site", "intervention", "from step", "to step", "status"]
#: Seconds between two looks of a page at the list of the app's runs (its own run is drawn every second).
LIST_SECONDS = 3.0


def interventions_table(records: Sequence[InterventionRecord]) -> pd.DataFrame:
    rows = [{"id": r.id, "site": r.site, "intervention": r.what, "from step": r.start,
             "to step": "" if r.end is None else r.end,
             "status": r.status + (f": {r.error}" if r.error else "")} for r in records]
    return pd.DataFrame(rows, columns=INTERVENTION_COLUMNS)


def parse_site(site: Any, paths: Sequence[str]) -> tuple[str, int | None]:
    """``path`` or ``path#call`` (as the run page names call sites) -> the module path and call index."""
    if not isinstance(site, str) or not site.strip():
        picked = "none is picked" if site is None or isinstance(site, str) else f"got {shown(site)}"
        raise ValueError(f"Pick a call site to intervene on ({picked}).")
    site = site.strip()
    module, call = site, None
    match = re.fullmatch(r"(.*)#(\d+)", site)
    if match is not None:
        module, call = match[1], int(match[2])
    if module == "(model)":
        module = ""
    if module not in paths:
        raise ValueError(f"{shown(site)} is not a call site of this run's model; pick one from the list "
                         "(the sites the run has recorded).")
    return module, call


def _number(value: Any, name: str, low: float = -_LIMIT, high: float = _LIMIT) -> float:
    if isinstance(value, str) and value.strip():
        try:
            value = float(value)
        except ValueError:
            pass
    if value is None:  # (what a number box sends when empty, or holding a number past float's range: 1e400)
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}]; it is missing (an empty box, or one "
                         "holding a number beyond the floating-point range, such as 1e400).")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {shown(value)}.")
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low:g}, {high:g}], got {value:g}.")
    return float(value)


def parse_units(text: Any) -> list[int]:
    """``"3"``, ``"0, 2, 5-9"`` -> unit indices (ranges inclusive), at most :data:`MAX_UNITS`."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"units: give unit indices such as 3 or 0, 2, 5-9 (ranges inclusive), got {shown(text)}.")
    units: list[int] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if match is None:
            raise ValueError(f"units: {shown(part)} is not an index or a range a-b of indices >= 0; e.g. 0, 2, 5-9.")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise ValueError(f"units: the range {part} runs backwards; write it {last}-{first}.")
        if len(units) + last - first + 1 > MAX_UNITS:
            raise ValueError(f"units: at most {MAX_UNITS} units at once, {shown(text)} names more.")
        units.extend(range(first, last + 1))
    return list(dict.fromkeys(units))


def _map_floats(output: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``output`` with ``fn`` applied to every floating-point tensor in it (tuples, lists, dicts kept)."""
    if isinstance(output, torch.Tensor):
        return fn(output) if output.is_floating_point() else output
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return type(output)(*(_map_floats(v, fn) for v in output))
    if isinstance(output, (tuple, list)):
        return type(output)(_map_floats(v, fn) for v in output)
    if isinstance(output, dict):
        return {k: _map_floats(v, fn) for k, v in output.items()}
    return output


@dataclass(frozen=True)
class InterventionSpec:
    """A checked choice from the menu."""

    op: str
    label: str
    units: tuple[int, ...] = ()
    k: float = 1.0
    sigma: float = 0.0
    low: float = 0.0
    high: float = 0.0

    def function(self) -> Callable[[Any], Any]:
        """The output -> patched output function of scale, noise or clamp (zero units uses ``ablate``)."""
        if self.op == "scale":
            k = self.k
            return functools.partial(_map_floats, fn=lambda t: t * k)
        if self.op == "noise":
            sigma = self.sigma
            return functools.partial(_map_floats, fn=lambda t: t + sigma * torch.randn_like(t))
        if self.op == "clamp":
            low, high = self.low, self.high
            return functools.partial(_map_floats, fn=lambda t: t.clamp(low, high))
        raise ValueError(f"{self.op!r} has no patch function.")


def intervention_spec(op: Any, units: Any = "", k: Any = None, sigma: Any = None, low: Any = None,
                      high: Any = None) -> InterventionSpec:
    """Check a menu choice and its parameters (only those of the chosen operation are read)."""
    if op not in INTERVENTIONS:
        raise ValueError(f"intervention must be one of {', '.join(INTERVENTIONS)}, got {shown(op)}.")
    if op == "zero units":
        chosen = parse_units(units)
        return InterventionSpec(op, f"zero units {listed(chosen)}", units=tuple(chosen))
    if op == "scale":
        k = _number(k, "k (scale the output by k)")
        return InterventionSpec(op, f"scale x{k:g}", k=k)
    if op == "noise":
        sigma = _number(sigma, "sigma (Gaussian noise's standard deviation)", 0.0)
        return InterventionSpec(op, f"noise sigma={sigma:g}", sigma=sigma)
    low, high = _number(low, "a (clamp's lower bound)"), _number(high, "b (clamp's upper bound)")
    if low > high:
        raise ValueError(f"clamp to [a, b] needs a <= b, got a={low:g} > b={high:g}; swap them.")
    return InterventionSpec(op, f"clamp [{low:g}, {high:g}]", low=low, high=high)


def intervention_sites(view: RunView) -> list[str]:
    """The call sites a page may intervene on: the modules whose activations the run recorded, in forward
    order (a module called several times: itself, i.e. every call, then each call ``path#k``)."""
    table = view.site_table("activation")
    if table.empty:
        return []
    order = view.site_order("activation")
    by_name = {row.name: row for row in table.itertuples(index=False)}
    calls: dict[str, set[int]] = {}
    for row in table.itertuples(index=False):
        calls.setdefault(row.module, set()).add(int(row.call))
    sites: list[str] = []
    for name in order:
        row = by_name[name]
        label = row.module or "(model)"
        if label not in sites:
            sites.append(label)
        if len(calls[row.module]) > 1 and f"{label}#{row.call}" not in sites:
            sites.append(f"{label}#{row.call}")
    return sites


def site_choices(sites: Sequence[str]) -> list[tuple[str, str]]:
    """The intervention panel's ``(label, value)`` choices of :func:`intervention_sites`: a module called
    several times a step is listed as itself, labelled ``(every call)``, before each of its calls ``#k``."""
    return [(f"{site} (every call)" if any(other.startswith(f"{site}#") for other in sites) else site, site)
            for site in sites]


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
        **watch_options: options of ``workbench.watch``.

    Attributes:
        outcome: None while it runs, then how it ended: 'finished', 'stopped' or 'failed'
            (the status its watch was closed with).
        error: the traceback of the step that raised (a failed run), else None.
    """

    def __init__(self, name: str, config: dict[str, Any], seed: int, steps: int, store: str | None = None,
                 device: str = "cpu", run_id: str = "", weights: str | None = None, **watch_options: Any) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}.")
        self.id, self.name, self.seed, self.steps = run_id, name, seed, steps
        self.started = time.time()
        self.experiment = create(name, seed=seed, device=device, **config)
        self.weights: str | None = None  # the checkpoint the model started from (its file's name)
        if weights is not None:  # before the watch: the run records the model from those weights on
            checkpoint = load_checkpoint(weights)
            load_weights(self.experiment.model, checkpoint)
            self.weights = Path(weights).name
        # the watch keeps no step in memory (the server holds many runs, finished ones too, each as
        # long as its user let it go): what pages show is fed by its stream from the first step, into
        # the view layer and the findings, and the store keeps every step
        self.watch = self.experiment.watch(store=store, recorder=Recorder(max_rows=0), **watch_options)
        self.view = RunView(label=self.label, total=steps)
        if self.watch.store is not None:  # (a replay shows the step of total, as the page did)
            self.watch.store.set_meta(total_steps=steps)
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
            ValueError / TypeError: an unknown site or operation, or a bad parameter (named).
            TimeoutError: the run's step in progress outlasted ``timeout``.
        """
        module, call = parse_site(site, self.watch.paths)
        spec = intervention_spec(op, units, k, sigma, low, high)

        def put_in() -> InterventionRecord:
            watch = self.watch
            if spec.op == "zero units":
                handle = watch.ablate(module, spec.units, dim=1, call=call, label=spec.label)
            else:
                handle = watch.patch(module, spec.function(), call=call, label=spec.label)
            record = InterventionRecord(handle.id, site, module, call, spec.label, handle.start_step, handle=handle)
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

    def status(self) -> str:
        """The run's header (id, experiment, seed, start time), its state and step of total, for a page."""
        text = f"**{self.label}** - {self.state}: step {self.experiment.step_count} of {self.steps}"
        store = self.watch.store
        if store is not None:
            text += f" - recording to `{store.path}`"
        if self.error:
            text += f"\n\n```\n{self.error.strip().splitlines()[-1]}\n```"
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


def start_run(manager: RunManager, name: str | None, values: dict[str, Any], seed: Any, steps: Any, every: Any,
              histograms: Any, modules: Any, store: Any, device: Any = "cpu",
              record: Sequence[str] | None = None, weights: Any = None) -> tuple[LiveRun | None, str]:
    """Validate the form and start a :class:`LiveRun` in ``manager``; returns it (or None) and a message.

    ``store`` is a run name under the manager's root ('' for none); ``record`` names the kinds of
    tensor to record (keys of :data:`RECORD_CHOICES`); None: all; ``weights`` an uploaded checkpoint
    file the model starts from (None: the experiment's own initialisation). Never raises: bad input
    is a message.
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
        run = manager.start(name, config, seed, _int(steps, "steps", 1, STEPS_MAX),
                            store=store, device=device, weights=str(weights) if weights else None,
                            every=_int(every, "record every Nth step", 1, STEPS_MAX),
                            histograms=histograms, modules=patterns, **_record_switches(record))
    except CheckpointError as exc:
        return None, f"**Could not start from these weights:** {_md(str(exc))}".replace("\n", "\n\n")
    except (ValueError, TypeError, OSError) as exc:
        return None, f"**Could not start:** {exc}"
    except Exception as exc:  # e.g. out of memory building the model: a message, not a bare "Error"
        return None, f"**Could not start:** {type(exc).__name__}: {exc}"
    return run, run.status()


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
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is empty; give a whole number in [{low}, {high}].")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {shown(value)}.")
    if not low <= value <= high:
        why = f": {why}. Enter a value in that range." if why and value > high else "."
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}{why}")
    return value


# ---------------------------------------------------------------- pages and runs
# A page holds only the id of the run it is attached to; the runs are the manager's.
RUN_COLUMNS = ["id", "experiment", "seed", "started", "status", "step", "of", "recording to"]


def runs_frame(manager: RunManager) -> pd.DataFrame:
    """The runs in this app (in progress first, then finished, newest first), one row each."""
    rows = [{"id": r.id, "experiment": r.name, "seed": r.seed,
             "started": time.strftime("%H:%M:%S", time.localtime(r.started)), "status": r.state,
             "step": r.experiment.step_count, "of": r.steps,
             "recording to": manager.root.name_of(r.watch.store.path) if r.watch.store is not None else ""}
            for r in manager.runs()]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def runs_note(manager: RunManager) -> str:
    runs = manager.runs()
    if not runs:
        text = "No runs in this app yet: start one above."
    else:
        going = sum(r.running for r in runs)
        text = f"{going} in progress, {len(runs) - going} finished."
    if manager.dropped:
        text += (f" {manager.dropped} older finished run(s) were dropped from memory (the app keeps the last "
                 f"{manager.keep_finished}); those recorded to a run name are in the Runs tab.")
    return text


def run_choices(manager: RunManager) -> list[tuple[str, str]]:
    """``(label, id)`` for a dropdown of the runs in this app."""
    return [(f"{r.label} ({r.state})", r.id) for r in manager.runs()]


def _find(manager: RunManager, run_id: Any) -> tuple[LiveRun | None, str]:
    if run_id is None or run_id == "":
        return None, "Pick a run from the list first (Refresh to update it)."
    run = manager.get(run_id)
    if run is not None:
        return run, ""
    if manager.forgotten(run_id):
        return None, (f"Run {shown(run_id)} is no longer in memory: the app keeps the last {manager.keep_finished} "
                      "finished runs. If it was recorded to a run name, open it in the Runs tab.")
    return None, f"No run {shown(run_id)} in this app; pick one from the list (Refresh to update it)."


def attach(manager: RunManager, run_id: Any) -> tuple[str | None, str]:
    """A page attaches to a run: returns the id the page now holds (None: not found) and a message."""
    run, message = _find(manager, run_id)
    if run is None:
        return None, message
    return run.id, run.status()


def detach(manager: RunManager, attached: Any) -> tuple[None, str]:
    """A page lets go of its run; the run goes on."""
    run = manager.get(attached)
    if run is None:
        return None, "Not attached to a run."
    going = " It runs on: attach to it again from the list." if run.running else ""
    return None, f"Detached from {run.label}.{going}"


def stop_run(manager: RunManager, run_id: Any, timeout: float = 30.0) -> str:
    """Stop a run (after its current step); returns its status."""
    if run_id is None or run_id == "":
        return "Not attached to a run: pick one from the list and Attach, then Stop."
    run, message = _find(manager, run_id)
    if run is None:
        return message
    if not run.running:
        return run.status() + "\n\n_It had ended already._"
    run.stop(timeout)
    return run.status()


def pause_run(manager: RunManager, run_id: Any, pause: bool = True) -> str:
    """Pause a run after its current step (``pause=False``: resume it); returns its status."""
    verb = "Pause" if pause else "Resume"
    if run_id is None or run_id == "":
        return f"Not attached to a run: pick one from the list and Attach, then {verb}."
    run, message = _find(manager, run_id)
    if run is None:
        return message
    if not run.running:
        return run.status() + "\n\n_It had ended already._"
    if run.state == "stopping":
        return run.status() + "\n\n_It is stopping._"
    if (run.state == "paused") == pause:
        return run.status() + f"\n\n_It is {'paused' if pause else 'running'} already._"
    if pause:
        run.pause()
    else:
        run.resume()
    return run.status()


def run_controls(manager: RunManager, run_id: Any) -> dict[str, bool]:
    """Which of the run page's Pause, Resume, Stop and its intervention panel's Apply and Remove apply to
    its run now (a page enables those and greys out the others): none before a run is attached or after
    it ended; Pause and Stop while it runs, Resume and Stop while it is paused, Stop alone while it
    finishes the step it was stopped at; Apply while it runs or is paused, Remove then while an
    intervention is on."""
    run = manager.get(run_id) if run_id else None
    state = run.state if run is not None else None
    going = state in ("running", "paused")
    return {"pause": state == "running", "resume": state == "paused", "stop": going or state == "stopping",
            "apply": going, "remove": going and any(record.status == "on" for record in run.interventions)}


def run_views(manager: RunManager, run_id: Any, kind: str, stat: str, pattern: str = "*") -> tuple:
    """A page's run as frames, from its view layer (what scripts and tests read; the page draws
    :func:`draw_page`): header, metrics, one statistic of the sites matching ``pattern`` (a glob
    over site names; at most the :data:`DEFAULT_SITES` the view picks when all match), a note, the
    last step of ``kind``, the recent NaN/Inf rows, and whether the run goes on."""
    run, message = _find(manager, run_id) if run_id else (None, "")
    if run is None:
        view = RunView()
        header = message
    else:
        view, header = run.view, _live_header(run)
    try:
        _check_choice("kind", kind, KINDS)
        _check_choice("statistic", stat, STATISTICS)
        names = view.site_order(kind)
        pattern = pattern.strip() if isinstance(pattern, str) and pattern.strip() else "*"
        if pattern == "*":
            sites = None
        else:
            sites = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        series = view.site_series(kind, stat, sites, k=DEFAULT_SITES)
        note = f"{series.site.nunique()} of {len(names)} call sites"
        latest = view.latest(kind)
    except ValueError as exc:
        series, note, latest = pd.DataFrame(), str(exc), pd.DataFrame()
    return header, view.metrics_frame(), series, note, latest, view.anomaly_frame(), \
        run is not None and run.running


def run_table(root: RunsRoot, sub: Any = "") -> tuple[pd.DataFrame, list[str], str]:
    """The stored runs under the root (or a sub-directory of it): a table, their names and a message."""
    return root.list(sub)


def replay(root: RunsRoot, pick: Any) -> tuple[Run | None, str]:
    """Open a stored run under the root; returns it (or None) and a message with its metadata."""
    if pick is None or (isinstance(pick, str) and not pick.strip()):
        return None, "Pick a run."
    try:
        run = root.open(pick)
    except (RunError, PathRefused) as exc:
        return None, f"**Cannot open:** {exc}"
    except (OSError, ValueError) as exc:
        return None, f"**Cannot open** {shown(pick)}: {exc}"
    m = run.metadata
    facts = ", ".join(f"{k}: `{m[k]}`" for k in ("experiment", "model", "seed", "status") if k in m)
    try:
        steps = len(run.steps)
    except RunError as exc:
        return None, f"**Cannot open:** {exc}"
    return run, f"**{root.name_of(run.path)}** - {facts} - {steps} steps stored"


# ---------------------------------------------------------------- the run page's views
#: Lines the per-site plot draws by default: the sites whose statistic changed most.
DEFAULT_SITES = 6
NO_HISTOGRAMS = ("No histograms in this run: it was recorded with histograms off. Tick **histograms** in the "
                 "run form (or leave `watch(model)`'s `histograms` on, its default) to see distributions over time.")
EXPORT_FORMATS = ("CSV", "Parquet", "TensorBoard")


@dataclass
class Controls:
    """What a run page's controls ask of its views (the page builds one from its widgets)."""

    metrics: Sequence[str] | None = None  # None: every metric
    smoothing: float = 0.0  # TensorBoard's, in [0, 0.99]
    log_metrics: bool = False
    kind: str = "activation"  # of the per-site plot, the distributions and the last-step table
    statistic: str = "std"
    sites: Sequence[str] | None = None  # None: the view's default (the sites that changed most)
    log_sites: bool = False
    dist_site: str | None = None  # None: the first chosen site with histograms
    heat_kind: str = "grad_output"
    heat_statistic: str = "norm"
    heat_log: bool = True


@dataclass
class Page:
    """Everything a run page shows, drawn from a :class:`~workbench.ui.views.RunView`."""

    header: str
    anomaly: str  # the first NaN/Inf, for a banner ('' while there is none)
    first_anomaly: dict[str, Any] | None
    metric_choices: list[str]
    metrics: list[str]
    metrics_figure: dict[str, Any]
    site_choices: list[str]  # forward order
    sites: list[str]
    sites_figure: dict[str, Any]
    site_note: str
    dist_choices: list[str]
    dist_site: str | None
    distribution_figure: dict[str, Any]
    dist_note: str
    heatmap_figure: dict[str, Any]
    anomalies: pd.DataFrame
    latest: pd.DataFrame


def _check_choice(label: str, value: Any, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{label} must be one of {', '.join(choices)}; got {shown(value)}. Pick one from the list.")


def _smoothing(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 0.99:
        raise ValueError(f"smoothing must be a number in [0, 0.99] (0: none), got {shown(value)}; "
                         "move the slider back into range.")
    return float(value)


def _names(value: Any, label: str) -> list[str] | None:
    """A multiselect's value: None (the page's default), else the names picked (maybe none)."""
    if value is None:
        return None
    if value == "":
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{label} must be a list of names, got {shown(value)}.")
    return list(value)


def _anomaly_text(first: dict[str, Any] | None) -> str:
    if first is None:
        return ""
    counts = " and ".join(f"{first[k]} {label}" for k, label in (("nan_count", "NaN"), ("inf_count", "Inf"))
                          if first[k])
    return (f"### ⚠ First NaN/Inf at step {first['step']}: `{first['site']}` ({first['kind']}, {counts})\n"
            "Show this site jumps the views below to it; the table under them lists the most recent ones.")


def draw_page(view: RunView, controls: Controls | None = None, header: str | None = None,
              interventions: pd.DataFrame | None = None, site_colors: dict[str, str] | None = None) -> Page:
    """Draw every view of a run page from ``view`` as ``controls`` ask. Never raises: a control
    value the page cannot draw is a message in that view's place. ``interventions`` (a table of
    :data:`INTERVENTION_COLUMNS`) are shaded over the steps they were on, and named in the
    last-step table beside the sites they are on. ``site_colors``: the call sites' colours in the
    page's earlier drawings, which each site drawn again keeps (updated with this drawing's)."""
    c = controls or Controls()
    first = view.first_anomaly
    # metrics (the interventions' markers not by default: they are the bands over the figures)
    metric_choices = view.metric_names()
    try:
        picked = _names(c.metrics, "metrics")
        chosen = ([m for m in metric_choices if not m.startswith(INTERVENTION_METRIC)] if picked is None
                  else [m for m in picked if m in metric_choices])
        smoothing = _smoothing(c.smoothing)
        metrics_fig = (figures.metrics_figure(view, chosen, smoothing, bool(c.log_metrics)) if chosen
                       else figures.empty_figure("Pick metrics above." if metric_choices else "No metrics yet."))
    except ValueError as exc:
        chosen, metrics_fig = metric_choices, figures.empty_figure(str(exc))
    # a statistic per call site; the distributions and the last-step table follow the same kind
    site_choices, sites, dist_choices, dist_site = [], [], [], None
    latest = pd.DataFrame(columns=["site", "step", *STATISTICS])
    try:
        _check_choice("kind", c.kind, KINDS)
        site_choices = view.site_order(c.kind)
        try:
            _check_choice("statistic", c.statistic, STATISTICS)
            picked = _names(c.sites, "sites")
            unknown = [s for s in picked or [] if s not in site_choices]
            sites = (view.default_sites(c.kind, c.statistic, DEFAULT_SITES) if picked is None
                     else [s for s in picked if s in site_choices])
            sites = sorted(sites, key=site_choices.index)  # (drawn and listed in forward order)
            sites_fig = (figures.sites_figure(view, c.kind, c.statistic, sites, bool(c.log_sites), site_colors) if sites
                         else figures.empty_figure("Pick call sites above." if site_choices
                                                   else f"No {c.kind} rows yet."))
            site_note = figures.site_note(view, c.kind, site_choices, sites, unknown, default=picked is None)
        except ValueError as exc:
            sites_fig, site_note = figures.empty_figure(str(exc)), str(exc)
        dist_choices = [s for s in site_choices if s in set(view.histogram_sites(c.kind))]
        if isinstance(c.dist_site, str) and c.dist_site in dist_choices:
            dist_site = c.dist_site
        else:
            dist_site = next((s for s in sites if s in dist_choices), dist_choices[0] if dist_choices else None)
        if dist_site is not None:
            dist_fig = figures.distribution_figure(view, c.kind, dist_site)
            dist_note = f"{len(dist_choices)} {c.kind} site(s) with histograms."
        elif site_choices:
            dist_fig, dist_note = figures.empty_figure("No histograms recorded."), NO_HISTOGRAMS
        else:
            dist_fig, dist_note = figures.empty_figure(f"No {c.kind} rows yet."), ""
        latest = view.latest(c.kind)
    except ValueError as exc:
        sites_fig = dist_fig = figures.empty_figure(str(exc))
        site_note = dist_note = str(exc)
    heat_kind = c.heat_kind
    try:
        _check_choice("heatmap kind", heat_kind, KINDS)
        _check_choice("heatmap statistic", c.heat_statistic, STATISTICS)
        if not view.site_order(heat_kind):  # (a run that records none of it: no gradients, a forward-only model)
            heat_kind = next((k for k in KINDS if view.site_order(k)), heat_kind)
        heat_fig = figures.heatmap_figure(view, heat_kind, c.heat_statistic, bool(c.heat_log))
        if heat_kind != c.heat_kind:  # (the picker keeps the kind asked: the next run may have it)
            title = heat_fig["layout"]["title"]
            title["text"] = f"No {c.heat_kind} rows in this run; {title['text']}"
    except ValueError as exc:
        heat_fig = figures.empty_figure(str(exc))
    latest = latest.round(6)
    if interventions is not None and len(interventions):
        metrics_fig = figures.shade_interventions(metrics_fig, interventions, view.last_step)
        sites_fig = figures.shade_interventions(sites_fig, interventions, view.last_step)
        latest = _mark_interventions(latest, interventions, view.sites.get(c.kind, []))
    return Page(header if header is not None else figures.header_markdown(view), _anomaly_text(first), first,
                metric_choices, chosen, metrics_fig, site_choices, sites, sites_fig, site_note, dist_choices,
                dist_site, dist_fig, dist_note, heat_fig, view.anomaly_frame(), latest)


def _mark_interventions(latest: pd.DataFrame, interventions: pd.DataFrame, sites: Sequence[Site]) -> pd.DataFrame:
    """The last-step table with an ``intervention`` column: the interventions on at each site's module
    (any call of it, or this call: ``path#k``) then; ``sites``: the views' sites of the table's kind."""
    if latest.empty or "step" not in latest:
        return latest
    step = latest.step.max()
    targets = {}
    for site in sites:  # (an intervention names its site as picked: path, path#call or (model))
        path = site.module or "(model)"
        targets[site.name] = (path, f"{path}#{site.call}")
    marks = []
    for name in latest.site:
        on = [f"{row.id} {row.intervention}" for _, row in interventions.iterrows()
              if int(row["from step"]) <= step and (row["to step"] == "" or step <= int(row["to step"]))
              and row.site in targets.get(name, ())]
        marks.append("; ".join(on))
    return latest.assign(intervention=marks)


def _live_header(run: LiveRun) -> str:
    text = figures.header_markdown(run.view)
    store = run.watch.store
    if store is not None:
        text += f"\n\nrecording to `{store.path}`"
    if run.watch.errors:
        text += (f"\n\n{len(run.watch.errors)} instrumentation error(s); the first: "
                 f"`{run.watch.errors[0]['error']}`")
    return text


class ViewCache:
    """The views of stored runs a page opened, by run name (bounded; a run that grew since is read
    again). Owned by the app (:func:`wire`), shared by its pages: a stored run is read once."""

    def __init__(self, root: RunsRoot, size: int = 8) -> None:
        self.root, self.size = root, size
        self._views: dict[str, tuple[tuple, RunView]] = {}
        self._lock = threading.Lock()

    def get(self, pick: Any) -> tuple[RunView | None, Run | None, str]:
        """The view of the stored run ``pick`` names, the run and a message (None and a message when
        it cannot be opened)."""
        run, message = replay(self.root, pick)
        if run is None:
            return None, None, message
        try:
            key = (len(run.steps), run.status)
            with self._lock:
                cached = self._views.get(pick)
            if cached is not None and cached[0] == key:
                return cached[1], run, message
            view = RunView.from_run(run)
        except RunError as exc:
            return None, None, f"**Cannot read:** {exc}"
        view.label = self.root.name_of(run.path)
        # the steps it was to take (a run started in the app says so), else, ended well, the steps it took
        total = run.metadata.get("total_steps")
        view.total = total if isinstance(total, int) else view.last_step if run.status == "finished" else None
        with self._lock:
            self._views.pop(pick, None)
            self._views[pick] = (key, view)
            while len(self._views) > self.size:
                self._views.pop(next(iter(self._views)))
        return view, run, message


NO_COMPARISON = "Pick two or more runs to compare."


def compare_runs(cache: ViewCache, picks: Any, kind: str, statistic: str, site: Any,
                 smoothing: Any = 0.0, log_y: bool = False, colors: dict[str, str] | None = None
                 ) -> tuple[dict | None, dict | None, list[str], str | None, str]:
    """Overlay two or more stored runs: their metrics (a panel per metric, a line per run) and one
    call site's statistic. Returns the two figures (``None`` when there is nothing to compare: fewer
    than two runs that open, or a bad choice), the sites to choose from (those of every run's
    ``kind``, in the first run's forward order), the site drawn and a message. ``colors``: the runs'
    colours in the last drawing (:func:`figures.steady_colors`), which the runs still compared keep."""
    try:
        chosen = _names(picks, "runs to compare") or []
        _check_choice("kind", kind, KINDS)
        _check_choice("statistic", statistic, STATISTICS)
        smoothing = _smoothing(smoothing)
    except ValueError as exc:
        return None, None, [], None, f"**Cannot compare:** {exc}"
    if len(chosen) < 2:
        return None, None, [], None, NO_COMPARISON
    views, problems = {}, []
    for pick in dict.fromkeys(chosen):
        view, _, message = cache.get(pick)
        if view is None:
            problems.append(message)
        else:
            views[pick] = view
    note = " ".join(problems)
    if len(views) < 2:
        return None, None, [], None, (note + " Pick two or more runs that open.").strip()
    having = [name for name, view in views.items() if view.site_order(kind)]  # (runs with rows of the kind)
    order = [views[name].site_order(kind) for name in having]
    common = set(order[0]).intersection(*order[1:]) if order else set()
    choices = ([s for s in order[0] if s in common] or order[0]) if order else []
    if not (isinstance(site, str) and site in choices):
        first = views[having[0]] if having else None
        site = next((s for s in first.default_sites(kind, statistic, DEFAULT_SITES) if s in choices),
                    choices[0]) if first is not None else None
    # (the intervention markers are the shading, not panels of their own; their metrics stay in the export)
    names = sorted({m for view in views.values() for m in view.metric_names() if not m.startswith(INTERVENTION_METRIC)})
    colors = figures.steady_colors(list(views), colors)
    metrics = figures.compare_metrics_figure(views, names, smoothing, bool(log_y), colors=colors)
    site_fig = (figures.compare_site_figure(views, kind, statistic, site, bool(log_y), colors) if site is not None
                else figures.empty_figure(f"None of these runs recorded {kind} rows."))
    text = f"Comparing {', '.join(f'`{n}`' for n in views)}."
    lacking = [name for name in views if name not in having]
    if lacking and having:
        text += (f" {', '.join(f'`{n}`' for n in lacking)} recorded no {kind} rows: the sites of "
                 f"`{having[0]}` are listed.")
    elif not common and len(having) > 1:
        text += f" They share no {kind} call site (different models?): the sites of `{having[0]}` are listed."
    return metrics, site_fig, choices, site, (text + (" " + note if note else "")).strip()


def export_run(root: RunsRoot, pick: Any, fmt: Any, folder: str | Path | None = None) -> tuple[list[str], str]:
    """Export a stored run: CSV or Parquet (its rows and its metrics, a file each) or TensorBoard
    (event files, zipped). Files go to ``folder`` (default: a new temporary directory) and are
    offered for download. Returns their paths and a message; never raises."""
    if fmt not in EXPORT_FORMATS:
        return [], f"**Cannot export:** format must be one of {', '.join(EXPORT_FORMATS)}, got {shown(fmt)}."
    run, message = replay(root, pick)
    if run is None:
        return [], message.replace("Cannot open", "Cannot export")
    base = root.name_of(run.path).replace("/", "__")
    out = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="workbench-export-"))
    try:
        out.mkdir(parents=True, exist_ok=True)
        if fmt == "TensorBoard":
            logdir = out / f"{base}-tensorboard"
            run.export(logdir)
            archive = shutil.make_archive(str(logdir), "zip", root_dir=logdir)
            shutil.rmtree(logdir, ignore_errors=True)
            paths = [archive]
        else:
            suffix = ".csv" if fmt == "CSV" else ".parquet"
            paths = [str(run.export(out / f"{base}-{what}{suffix}", what)) for what in ("rows", "metrics")]
    except (ImportError, OSError, ValueError, RunError) as exc:
        return [], f"**Cannot export** `{root.name_of(run.path)}` to {fmt}: {exc}"
    names = ", ".join(f"`{Path(p).name}`" for p in paths)
    return paths, f"Exported `{root.name_of(run.path)}` to {fmt}: {names} (download below)."


# ---------------------------------------------------------------- interventions and initial weights: handlers
def stored_interventions(run: Run | None) -> pd.DataFrame:
    """The interventions a stored run records (empty when it has none, or cannot be read)."""
    if run is None:
        return pd.DataFrame(columns=INTERVENTION_COLUMNS)
    try:
        return run.interventions()[INTERVENTION_COLUMNS]  # (status: recorded, or failed at step N: ...)
    except (RunError, OSError, ValueError):
        return pd.DataFrame(columns=INTERVENTION_COLUMNS)


def apply_intervention(manager: RunManager, run_id: Any, site: Any, op: Any, units: Any = "", k: Any = None,
                       sigma: Any = None, low: Any = None, high: Any = None, timeout: float = 30.0) -> str:
    """A page's "Apply": the intervention goes into the run between two steps; returns a message. Never raises."""
    run, message = _find(manager, run_id) if run_id else (None, "Not attached to a run: start one or attach "
                                                          "to one, then intervene on it.")
    if run is None:
        return f"**Cannot intervene:** {message}"
    try:
        record = run.intervene(site, op, units, k, sigma, low, high, timeout=timeout)
    except (ValueError, TypeError, TimeoutError) as exc:
        return f"**Cannot intervene:** {exc}"
    return (f"{record.id}: **{record.what}** at `{record.site}` from step {record.start} on. The band over the "
            "figures marks its steps; Remove takes it out.")


def remove_applied(manager: RunManager, run_id: Any, intervention_id: Any, timeout: float = 30.0) -> str:
    """A page's "Remove"; returns a message. Never raises."""
    run, message = _find(manager, run_id) if run_id else (None, "Not attached to a run.")
    if run is None:
        return f"**Cannot remove:** {message}"
    if not intervention_id:
        return "**Cannot remove:** pick an intervention that is on."
    try:
        record = run.remove_intervention(intervention_id, timeout=timeout)
    except (ValueError, TypeError, TimeoutError) as exc:
        return f"**Cannot remove:** {exc}"
    return f"{record.id} ({record.what} at `{record.site}`) removed: it applied to steps {record.start}-{record.end}."


def intervention_panel(manager: RunManager, run_id: Any) -> tuple[list[str], pd.DataFrame, list[str]]:
    """What a page's intervention panel lists: the sites to pick from, the run's interventions, those on."""
    run = manager.get(run_id) if run_id else None
    if run is None:
        return [], pd.DataFrame(columns=INTERVENTION_COLUMNS), []
    table = run.intervention_frame()
    return intervention_sites(run.view), table, [r.id for r in run.interventions if r.status == "on"]


OUTPUT_COLUMNS = ["output", "shape", "mean", "std", "min", "max"]


def outputs_html(outputs: pd.DataFrame) -> str:
    """The outputs table of :func:`inspect_weights` as a small HTML table ('' when there are none)."""
    if outputs.empty:
        return ""
    return ("<div class='wb-outputs'><p>outputs on the example inputs</p>"
            + outputs.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.6g}", border=0) + "</div>")


def _md(text: str) -> str:
    """``text`` shown as is in Markdown (``dynamics_network.*`` is no emphasis)."""
    return text.replace("*", "\\*")


def _leaves(value: Any, name: str = "out") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{name}.{i}")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{name}.{k}")]
    return []


def inspect_weights(path: Any, batch_size: int = 2) -> tuple[str, pd.DataFrame, pd.DataFrame, str | None,
                                                              dict[str, Any]]:
    """An uploaded checkpoint, inspected: a message (what it is, how it was read, the settings that fit),
    the module tree of the model built from it (``workbench.summarize`` on its example inputs), its
    outputs on them, the experiment it fits and that experiment's settings. Never raises."""
    from workbench.checkpoints import build_model, example_outputs, experiment_settings
    from workbench.summary import summarize

    empty_tree, empty_out = pd.DataFrame(), pd.DataFrame(columns=OUTPUT_COLUMNS)
    if not path:
        return "", empty_tree, empty_out, None, {}
    try:
        checkpoint = load_checkpoint(path)
    except (CheckpointError, ValueError, TypeError) as exc:
        return f"**Refused:** {_md(str(exc))}", empty_tree, empty_out, None, {}
    experiment, settings = experiment_settings(checkpoint)
    text = f"**{_md(checkpoint.describe())}.**"
    try:
        model, spec = build_model(checkpoint)
    except CheckpointError as exc:
        if checkpoint.kind == STATE_DICT:  # (what names no model to build here can still start a run)
            return (f"{text}\n\nA plain state_dict names no model to build and show here. **Start** loads it "
                    "into the experiment picked in the form; its keys and shapes are checked then, and a "
                    "mismatch is listed.", empty_tree, empty_out, experiment, settings)
        return f"{text}\n\n{_md(str(exc))}", empty_tree, empty_out, experiment, settings
    except Exception as exc:  # (a model that cannot be built from it, e.g. out of memory): a message
        return (f"{text}\n\n**Cannot build a model from it:** {type(exc).__name__}: {exc}", empty_tree, empty_out,
                experiment, settings)
    try:
        inputs, outputs = example_outputs(model, spec, batch_size)
        tree = summarize(model, inputs)
        rows = [{"output": n, "shape": str(tuple(t.shape)), **({k: round(float(getattr(t.float(), k)()), 6)
                                                                for k in ("mean", "std", "min", "max")}
                                                               if t.is_floating_point() and t.numel() > 1 else {})}
                for n, t in _leaves(outputs)]
        table = pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
    except Exception as exc:
        tree, table = summarize(model), empty_out
        text += f"\n\nIts forward on the example inputs failed: {type(exc).__name__}: {exc}"
    text += (f"\n\nBuilt `{type(model).__name__}` ({sum(p.numel() for p in model.parameters()):,} parameters) "
             f"from it; below: its module tree and outputs on {batch_size} example inputs of `{spec}`.")
    if experiment is not None:
        shown_settings = ", ".join(f"{k}={v}" for k, v in settings.items())
        text += (f"\n\nIt fits the **{experiment}** experiment with {shown_settings}: the form is set so. "
                 "Start trains from these weights.")
    else:
        text += "\n\nNo built-in experiment builds this network (its settings differ): it can be inspected here only."
    return text, tree, table, experiment, settings


# ---------------------------------------------------------------- Gradio
#: The components a drawing of a run page updates, in the order the handlers return them.
VIEW_OUTPUTS = ("header", "anomaly", "jump", "metric_names", "metrics", "kind", "sites", "series", "site_note",
                "dist_site", "distribution", "dist_note", "heat_kind", "heatmap", "anomalies", "latest")
#: The controls a drawing reads, in order.
CONTROLS = ("metric_names", "smoothing", "log_metrics", "kind", "stat", "sites", "log_sites", "dist_site",
            "heat_kind", "heat_stat", "heat_log")


def new_page_state() -> dict[str, Any]:
    """What a page remembers of its views: whether the metric and site pickers follow the view's
    defaults (until the user picks), the run and steps it last drew, and what its pickers were sent."""
    return {"auto_metrics": True, "auto_sites": True, "version": None, "sent": {}}


def page_controls(state: dict | None, values: Sequence[Any]) -> Controls:
    """The :class:`Controls` of a page's widget values (in :data:`CONTROLS` order)."""
    state = state or new_page_state()
    v = dict(zip(CONTROLS, values))
    return Controls(metrics=None if state.get("auto_metrics", True) else v["metric_names"],
                    smoothing=v["smoothing"], log_metrics=v["log_metrics"], kind=v["kind"], statistic=v["stat"],
                    sites=None if state.get("auto_sites", True) else v["sites"], log_sites=v["log_sites"],
                    dist_site=v["dist_site"], heat_kind=v["heat_kind"], heat_statistic=v["heat_stat"],
                    heat_log=v["heat_log"])


def plot_data(figure: dict[str, Any], revision: Any = None):
    """A figure spec as ``gr.Plot``'s value (its JSON as is: no plotly object is built).

    ``revision`` names what the figure shows (the run; with the figure's title, its kind,
    statistic or site): while it stays the same, Plotly keeps what the user did to the figure
    (zoom, pan, legend entries hidden) across the page's refreshes (``layout.uirevision``)."""
    from gradio.components.plot import PlotData

    if revision is not None:
        layout = figure["layout"]
        shows = (layout.get("title", {}).get("text", ""), layout.get("yaxis", {}).get("type", ""))
        figure = {**figure, "layout": {**layout, "uirevision": f"{revision} {shows}"}}
    return PlotData(type="plotly", plot=figures.to_json(figure))


def page_outputs(page: Page, state: dict, jumped: Controls | None = None, revision: Any = None) -> tuple:
    """The update of each of :data:`VIEW_OUTPUTS`; a picker is sent only when its choices or value
    changed (so one the user has open is left alone), the kinds only when a jump sets them."""
    import gradio as gr

    sent = state.setdefault("sent", {})

    def picker(key: str, choices: list[str], value: Any):
        if sent.get(key) == (choices, value):
            return gr.skip()
        sent[key] = (list(choices), value)
        return gr.Dropdown(choices=choices, value=value, allow_custom_value=True)

    def plot(figure: dict[str, Any], name: str):
        return plot_data(figure, None if revision is None else f"{revision} {name}")


    return (page.header, page.anomaly, gr.Button(visible=page.first_anomaly is not None),
            picker("metric_names", page.metric_choices, page.metrics), plot(page.metrics_figure, "metrics"),
            jumped.kind if jumped else gr.skip(), picker("sites", page.site_choices, page.sites),
            plot(page.sites_figure, "sites"), page.site_note,
            picker("dist_site", page.dist_choices, page.dist_site), plot(page.distribution_figure, "distribution"),
            page.dist_note, jumped.heat_kind if jumped else gr.skip(), plot(page.heatmap_figure, "heatmap"),
            page.anomalies, page.latest)


def jump_controls(view: RunView | None, controls: Controls) -> Controls | None:
    """``controls`` moved to the first NaN/Inf's site: its kind, that site alone, its distribution,
    the heatmap of its kind; None while the run has none."""
    first = view.first_anomaly if view is not None else None
    if first is None:
        return None
    return dataclasses.replace(controls, kind=first["kind"], sites=[first["site"]], dist_site=first["site"],
                               heat_kind=first["kind"])


def redraw(view: RunView | None, header: str, run: Any, state: dict | None, values: Sequence[Any],
           force: bool = True, jump: bool = False, change: dict | None = None,
           interventions: pd.DataFrame | None = None) -> tuple:
    """One drawing of a run page: ``(new page state, *updates of VIEW_OUTPUTS)``.

    ``view`` is the page's run's views (None: no run; ``header`` says why), ``run`` what names it,
    ``values`` the controls' values (:data:`CONTROLS`). Unless ``force``d (a control changed), a
    page that drew this run at these steps already is sent nothing. ``jump`` moves the views to the
    first NaN/Inf; ``change`` updates the page state first (a picker the user took over).
    """
    state = dict(state or new_page_state())
    state.update(change or {})
    if view is None:
        state["version"] = None
        page = draw_page(RunView(), page_controls(state, values), header=header)
        return state, *page_outputs(page, state)
    version = (run, view.steps_fed, view.status, view.dropped)
    if not force and version == state.get("version"):
        return state, *_skips(len(VIEW_OUTPUTS))  # nothing new: nothing sent
    state["version"] = version
    controls = page_controls(state, values)
    jumped = jump_controls(view, controls) if jump else None
    if jumped is not None:
        state["auto_sites"] = False
        controls = jumped
    state["site_colors"] = colors = dict(state.get("site_colors") or {})  # (a site keeps its colour)
    page = draw_page(view, controls, header=header, interventions=interventions, site_colors=colors)
    return state, *page_outputs(page, state, jumped, revision=run)


def _view_components(c: dict, p: str, empty: str | None = None) -> None:
    """The views of a run page (live or replayed), under keys ``{p}_<name>``; ``empty``: what its
    plots say until a run is drawn (None: nothing, the page hides them)."""
    import gradio as gr

    def plot(name: str):
        value = None
        if empty is not None:
            import plotly.graph_objects as go
            value = go.Figure(figures.empty_figure(empty))
        c[f"{p}_{name}"] = gr.Plot(value, show_label=False, elem_id=f"{p}-{name}", container=False)

    with gr.Row(equal_height=True):
        c[f"{p}_anomaly"] = gr.Markdown(elem_id=f"{p}-anomaly", elem_classes=["wb-anomaly"])
        c[f"{p}_jump"] = gr.Button("Show this site", variant="stop", visible=False, elem_id=f"{p}-jump", scale=0,
                                   min_width=160)
    with gr.Row(equal_height=True):
        c[f"{p}_metric_names"] = gr.Dropdown([], value=[], multiselect=True, label="metrics", scale=4,
                                             allow_custom_value=True, elem_id=f"{p}-metric-names")
        c[f"{p}_smoothing"] = clamping(gr.Slider(0.0, 0.99, value=0.0, step=0.01, label="smoothing", scale=2,
                                                 elem_id=f"{p}-smoothing"))
        c[f"{p}_log_metrics"] = gr.Checkbox(False, label="log y", scale=1, min_width=90, elem_id=f"{p}-log-metrics")
    plot("metrics")
    gr.Markdown("#### Statistic per call site", elem_classes=["wb-section"])
    with gr.Row(equal_height=True):
        c[f"{p}_kind"] = gr.Dropdown(list(KINDS), value="activation", label="kind", scale=1, elem_id=f"{p}-kind")
        c[f"{p}_stat"] = gr.Dropdown(STATISTICS, value="std", label="statistic", scale=1, elem_id=f"{p}-stat")
        c[f"{p}_sites"] = gr.Dropdown([], value=[], multiselect=True, label="call sites (forward order)", scale=5,
                                      allow_custom_value=True, elem_id=f"{p}-sites")
        c[f"{p}_log_sites"] = gr.Checkbox(False, label="log y", scale=1, min_width=90, elem_id=f"{p}-log-sites")
    plot("series")
    c[f"{p}_site_note"] = gr.Markdown(elem_id=f"{p}-site-note")
    gr.Markdown("#### Distribution over time (the kind above)", elem_classes=["wb-section"])
    with gr.Row(equal_height=True):
        c[f"{p}_dist_site"] = gr.Dropdown([], value=None, label="call site with histograms", scale=2,
                                          allow_custom_value=True, elem_id=f"{p}-dist-site")
        c[f"{p}_dist_note"] = gr.Markdown(elem_id=f"{p}-dist-note")
    plot("distribution")
    gr.Markdown("#### Every call site over steps", elem_classes=["wb-section"])
    with gr.Row(equal_height=True):
        c[f"{p}_heat_kind"] = gr.Dropdown(list(KINDS), value="grad_output", label="kind", scale=1,
                                          elem_id=f"{p}-heat-kind")
        c[f"{p}_heat_stat"] = gr.Dropdown(STATISTICS, value="norm", label="statistic", scale=1,
                                          elem_id=f"{p}-heat-stat")
        c[f"{p}_heat_log"] = gr.Checkbox(True, label="log10 |value|", scale=1, elem_id=f"{p}-heat-log")
    plot("heatmap")
    c[f"{p}_anomalies"] = gr.Dataframe(pd.DataFrame(columns=["step", "site", "kind", "nan_count", "inf_count"]),
                                       label="NaN / Inf, most recent", interactive=False, max_height=220,
                                       elem_id=f"{p}-anomalies")
    c[f"{p}_latest"] = gr.Dataframe(pd.DataFrame(columns=["site", "step", *STATISTICS]),
                                    label="Last recorded step (the kind above)", interactive=False,
                                    max_height=320, elem_id=f"{p}-latest")
    c[f"{p}_page"] = gr.State(new_page_state())


#: Which parameter fields each intervention shows.
_INTERVENTION_FIELDS = {"zero units": ("iv_units",), "scale": ("iv_k",), "noise": ("iv_sigma",),
                        "clamp": ("iv_low", "iv_high")}


def _form_value(field: FormField, value: Any) -> Any:
    """A setting as its form widget shows it (a list in a text field as comma-separated text)."""
    if field.widget == "text" and isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return value


def clamping(slider: Any) -> Any:
    """``slider`` (a ``gr.Slider``), its box taking a number beyond the range as the range's end, as the
    box itself shows it once left (a 5 typed into smoothing's box reads 0.99), where Gradio refuses it in
    a pop-up ("Value 5 is greater than maximum value 0.99.") and draws nothing, the box then saying 0.99.
    (On the instance: a subclass of a Gradio component writes a ``.pyi`` stub beside this module.)"""
    preprocess = slider.preprocess

    def clamped(payload: Any) -> Any:
        if isinstance(payload, (int, float)) and not isinstance(payload, bool) and payload == payload:
            payload = min(max(payload, slider.minimum), slider.maximum)
        return preprocess(payload)

    slider.preprocess = clamped
    return slider


def _intervention_components(c: dict) -> None:
    """The run page's intervention panel: a call site, an operation from the menu and its parameters."""
    import gradio as gr

    # (folded: the run's figures come first on the page; a click opens it)
    with gr.Accordion("Intervene on this run: zero units, scale, noise or clamp a call site's output", open=False,
                      elem_id="intervene"):
        gr.Markdown("Change what a call site passes on, from the next step, and watch the metrics and the sites "
                    "downstream; remove it to see them recover. Applied between training steps.",
                    elem_classes=["wb-help"])
        with gr.Row(equal_height=True):
            c["iv_site"] = gr.Dropdown([], value=None, label="call site (recorded by the run)", scale=3,
                                       elem_id="iv-site")
            c["iv_op"] = gr.Dropdown(list(INTERVENTIONS), value="scale", label="intervention", scale=2,
                                     elem_id="iv-op")
            c["iv_units"] = gr.Textbox("0", label="units (dim 1), e.g. 0, 2, 5-9", scale=2, visible=False,
                                       elem_id="iv-units")
            c["iv_k"] = gr.Number(2.0, label="k (output x k)", scale=1, min_width=90, elem_id="iv-k")
            c["iv_sigma"] = gr.Number(0.1, label="sigma (+ N(0, sigma^2))", scale=1, min_width=90, visible=False,
                                      elem_id="iv-sigma")
            c["iv_low"] = gr.Number(-1.0, label="a (clamp to [a, b])", scale=1, min_width=90, visible=False,
                                    elem_id="iv-low")
            c["iv_high"] = gr.Number(1.0, label="b", scale=1, min_width=90, visible=False, elem_id="iv-high")
            c["iv_apply"] = gr.Button("Apply", variant="primary", scale=1, min_width=90, elem_id="iv-apply",
                                      interactive=False)  # (greyed out until the page has a run: run_controls)
        c["iv_message"] = gr.Markdown(elem_id="iv-message")
        with gr.Row(equal_height=True):
            c["iv_table"] = gr.Dataframe(pd.DataFrame(columns=INTERVENTION_COLUMNS), interactive=False,
                                         show_label=False, max_height=180, elem_id="iv-table", scale=4)
            with gr.Column(scale=1, min_width=170):
                c["iv_on"] = gr.Dropdown([], value=None, label="on now", elem_id="iv-on")
                c["iv_remove"] = gr.Button("Remove", variant="stop", elem_id="iv-remove", interactive=False)


def _hidden_while_empty(note: Any, table: Any) -> tuple:
    """A findings list for the page (``(note, table)``; either may be ``gr.skip()``): the table
    hidden while it has no row - the note above it says that nothing looks wrong."""
    import gradio as gr

    if isinstance(table, pd.DataFrame):
        table = gr.Dataframe(value=table, visible=not table.empty)
    return note, table


#: The findings lists' height and column widths (severity, steps, site, finding on one line, evidence).
FINDINGS_HEIGHT, FINDINGS_WIDTHS = 320, ["11%", "8%", "12%", "21%", "48%"]

#: Scrolls the page to its run's header (run in the browser once a run starts).
SHOW_HEADER = "() => { document.getElementById('run-status')?.scrollIntoView({block: 'start'}); }"
CSS = """
.wb-anomaly h3 { color: #b91c1c; margin: 0; }
.wb-section h4 { margin: 6px 0 0 0; }
#run-status, #replay-header { min-height: 2em; }
/* a run's name longer than the picker's box ends in an ellipsis, not under the box's arrow */
#live-pick input { text-overflow: ellipsis; padding-right: 22px; }
.wb-outputs p { margin: 4px 0; color: var(--block-label-text-color); font-size: var(--block-label-text-size); }
/* tables written as Markdown (a run's last step, the explorer's f' differences): rules between rows, no grid */
.wb-outputs table, #explorer-curves-message table { border-collapse: collapse; font-family: var(--font-mono);
  font-size: 13px; }
.wb-outputs table, .wb-outputs th, .wb-outputs td, #explorer-curves-message table, #explorer-curves-message th,
#explorer-curves-message td { border: none; }
.wb-outputs th, .wb-outputs td, #explorer-curves-message th, #explorer-curves-message td { padding: 4px 14px 4px 0;
  text-align: left; border-bottom: 1px solid var(--border-color-primary); }
/* the app's tables are read-only (interactive=False), so none looks like a spreadsheet: no text cursor, and
   the cell clicked gets no editor's ring, white box or row/column/menu buttons (Gradio's, for editing) */
[role=grid][aria-readonly=true] .body-cell, [role=grid][aria-readonly=true] .body-cell * { cursor: default; }
[role=grid][aria-readonly=true] .body-cell.cell-selected { outline: none !important; box-shadow: none !important; }
[role=grid][aria-readonly=true] .body-cell.cell-selected span.text { box-shadow: none !important;
  background: transparent !important; }
[role=grid][aria-readonly=true] .body-cell .cell-menu-button,
[role=grid][aria-readonly=true] .body-cell .selection-button { display: none !important; }
/* a click on a row of these opens it (a stored run, a finding): a hand, and the row under it lit */
#runs-table .body-cell, #runs-table .body-cell *, #live-findings .body-cell, #live-findings .body-cell *,
#replay-findings .body-cell, #replay-findings .body-cell * { cursor: pointer !important; }
#runs-table [role=row]:hover .body-cell, #live-findings [role=row]:hover .body-cell,
#replay-findings [role=row]:hover .body-cell { background: var(--table-row-focus); }
/* a red button greyed out (Stop with no run, Remove with no intervention) looks as the greyed-out others do */
button.stop:disabled { background: var(--button-secondary-background-fill) !important;
  border-color: var(--button-secondary-border-color) !important; color: var(--button-secondary-text-color) !important; }
"""


def layout(root: RunsRoot):
    """Place the Experiments and Runs tabs' components; call inside ``gr.Tabs``."""
    import gradio as gr

    names = list_experiments()
    c: dict[str, Any] = {}
    with gr.Tab("Experiments", id="experiments"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300):
                with gr.Accordion("New run", open=True, elem_id="run-config") as c["config"]:
                    c["experiment"] = gr.Radio(names, value=names[0], label="Experiment", elem_id="experiment-list")
                    c["overview"] = gr.Markdown(experiment_overview(names[0]), elem_id="experiment-overview")
                    # no precision=0: Gradio would round 2.5 to 2 unseen; _int refuses it by name
                    with gr.Row():
                        c["seed"] = gr.Number(0, label="seed", elem_id="run-seed", interactive=True, min_width=80)
                        c["steps"] = gr.Number(200, label="steps", elem_id="run-steps", interactive=True,
                                               min_width=80)
                    with gr.Row():
                        c["every"] = gr.Number(1, label="record every Nth step", elem_id="run-every",
                                               interactive=True, min_width=80)
                        c["device"] = gr.Dropdown(devices(), value="cpu", label="device", elem_id="run-device",
                                                  interactive=True, min_width=80)
                    c["modules"] = gr.Textbox("*", label="watch modules (globs, comma separated)",
                                              placeholder="layers.*, head", info="* or empty: every module",
                                              elem_id="run-modules", interactive=True)
                    c["record"] = gr.CheckboxGroup(list(RECORD_CHOICES), value=list(RECORD_CHOICES), label="record",
                                                   elem_id="run-record", interactive=True)
                    c["histograms"] = gr.Checkbox(True, label="histograms (distributions over time)",
                                                  elem_id="run-histograms", interactive=True)
                    c["store"] = gr.Textbox("", label="record to run (optional)", placeholder="my-run or mlp/tanh",
                                            info=f"a run name under {root.path}", elem_id="run-store",
                                            interactive=True)
                    # a label that fits one line and room for "Drop File Here - or - Click to Upload" under it
                    c["weights"] = gr.File(label="initial weights: a checkpoint (optional)", type="filepath",
                                           elem_id="run-weights", height=150)
                    c["weights_info"] = gr.Markdown(elem_id="weights-info")
                    c["form"] = gr.Column()
                c["start_message"] = gr.Markdown(elem_id="start-message")
            with gr.Column(scale=4):
                with gr.Accordion("The uploaded weights", open=True, visible=False,
                                  elem_id="weights-inspect") as c["weights_inspect"]:
                    c["weights_summary"] = gr.Markdown(elem_id="weights-summary")
                    c["weights_outputs"] = gr.HTML(elem_id="weights-outputs")
                    c["weights_tree"] = gr.Dataframe(interactive=False, label="module tree (workbench.summarize)",
                                                     max_height=300, elem_id="weights-tree")
                c["prefill"] = gr.State({})
                c["status"] = gr.Markdown("_No run on this page: start one (New run), or attach to one below._",
                                          elem_id="run-status")
                c["live_header"] = c["status"]
                with gr.Row(equal_height=False):
                    c["pick"] = gr.Dropdown([], value=None, label="run (in progress first)", elem_id="live-pick",
                                            scale=5, interactive=True)
                    c["attach"] = gr.Button("Attach", size="md", elem_id="live-attach", scale=1, min_width=80)
                    # (greyed out until the page's run is there to pause, resume or stop: run_controls)
                    c["pause"] = gr.Button("Pause", size="md", elem_id="run-pause", scale=1, min_width=80,
                                           interactive=False)
                    c["resume"] = gr.Button("Resume", size="md", elem_id="run-resume", scale=1, min_width=80,
                                            interactive=False)
                    c["stop"] = gr.Button("Stop", variant="stop", size="md", elem_id="run-stop", scale=1, min_width=80,
                                          interactive=False)
                    c["detach"] = gr.Button("Detach", size="md", elem_id="live-detach", scale=1, min_width=80)
                    c["list"] = gr.Button("Refresh", size="md", elem_id="live-refresh", scale=1, min_width=80)
                c["live_message"] = gr.Markdown(elem_id="live-message")
                # what looks wrong with the run (workbench.ui.findings): click a row to show it in the views
                c["findings_note"] = gr.Markdown(elem_id="live-findings-note")
                # (the whole evidence, wrapped: a row takes two or three lines)
                c["findings"] = gr.Dataframe(pd.DataFrame(columns=findings_view.TABLE_COLUMNS), interactive=False,
                                             max_height=FINDINGS_HEIGHT, show_label=False, wrap=True,
                                             elem_id="live-findings", column_widths=FINDINGS_WIDTHS, visible=False)
                _intervention_components(c)
                _view_components(c, "live",
                                 empty="No run on this page yet: start one (New run), or attach to one above.")
                gr.Markdown("#### Runs in this app\nThey run on the server: attach to one from any page "
                            "(after a reload too), watch it, pause, resume or stop it; detaching or closing the "
                            "page leaves it running.", elem_id="live-runs-help")
                c["runs"] = gr.Dataframe(pd.DataFrame(columns=RUN_COLUMNS), interactive=False, max_height=220,
                                         show_label=False, elem_id="live-runs")
                c["runs_note"] = gr.Markdown(elem_id="live-runs-note")
        c["timer"] = gr.Timer(1.0, active=False)
        # the list of the app's runs, looked at every few seconds on every page (one idle on another's run
        # too): a run another page starts is listed, and the page's timer goes on while it runs
        c["list_timer"], c["list_state"] = gr.Timer(LIST_SECONDS), gr.State({})
    with gr.Tab("Runs", id="runs") as c["runs_tab"]:
        gr.Markdown(f"Stored runs under `{root.path}` (the app's runs root: `python app.py --runs-root DIR`). "
                    "Click a row to open a run.", elem_id="runs-root-note")
        with gr.Row(equal_height=True):
            c["root"] = gr.Textbox("", label="sub-directory (optional)", placeholder="empty: the whole root",
                                   elem_id="runs-sub", scale=3)
            c["refresh"] = gr.Button("List runs", elem_id="runs-refresh", scale=1)
        c["runs_message"] = gr.Markdown(elem_id="runs-message")
        c["runs_table"] = gr.Dataframe(interactive=False, label="Runs", max_height=260, elem_id="runs-table")
        with gr.Row(equal_height=True):
            c["run_path"] = gr.Dropdown([], value=None, label="run", elem_id="run-path", scale=3)
            c["export_format"] = gr.Radio(list(EXPORT_FORMATS), value="CSV", label="export to", scale=2,
                                          elem_id="export-format")
            c["export"] = gr.Button("Export", elem_id="export-button", scale=1, min_width=100)
        c["export_message"] = gr.Markdown(elem_id="export-message")
        c["export_files"] = gr.File(label="exported", file_count="multiple", interactive=False, visible=False,
                                    elem_id="export-files")
        with gr.Accordion("Compare runs", open=True, elem_id="compare"):
            with gr.Row(equal_height=True):
                c["compare_runs"] = gr.Dropdown([], value=[], multiselect=True, label="runs (two or more)",
                                                scale=4, elem_id="compare-runs")
                c["compare_kind"] = gr.Dropdown(list(KINDS), value="grad_output", label="kind", scale=1,
                                                elem_id="compare-kind")
                c["compare_stat"] = gr.Dropdown(STATISTICS, value="norm", label="statistic", scale=1,
                                                elem_id="compare-stat")
                c["compare_site"] = gr.Dropdown([], value=None, label="call site", scale=2,
                                                allow_custom_value=True, elem_id="compare-site")
                c["compare_log"] = gr.Checkbox(False, label="log y", scale=1, min_width=90, elem_id="compare-log")
            c["compare_colors"] = gr.State({})  # (run -> its colour in the comparison drawn)
            c["compare_message"] = gr.Markdown(NO_COMPARISON, elem_id="compare-message")
            # shown once two runs are compared (an empty Plot is a tall blank placeholder)
            c["compare_metrics"] = gr.Plot(show_label=False, container=False, visible=False,
                                           elem_id="compare-metrics")
            c["compare_site_plot"] = gr.Plot(show_label=False, container=False, visible=False,
                                             elem_id="compare-site-plot")
        gr.Markdown("### The run", elem_classes=["wb-section"])
        c["run_message"] = gr.Markdown(elem_id="run-message")
        # the views, once a run is opened (before, they would be empty plots and pickers)
        with gr.Column(visible=False, elem_id="replay-body") as c["replay_body"]:
            c["replay_header"] = gr.Markdown(elem_id="replay-header")
            # what looked wrong with the stored run (workbench.ui.findings): click a row to show it in the views
            c["replay_findings_note"] = gr.Markdown(elem_id="replay-findings-note")
            c["replay_findings"] = gr.Dataframe(pd.DataFrame(columns=findings_view.TABLE_COLUMNS), interactive=False,
                                                max_height=FINDINGS_HEIGHT, show_label=False, wrap=True,
                                                elem_id="replay-findings", column_widths=FINDINGS_WIDTHS, visible=False)
            _view_components(c, "replay")
    # the page's run: only its id; the run itself is the manager's, and outlives the page
    c["live_state"] = gr.State(None)
    c["run_state"] = gr.State(None)  # the stored run the Runs tab shows (its name)
    return c


def _guarded(handler: Callable, fallback: Callable[[str], tuple]) -> Callable:
    """``handler``, with an unexpected exception turned into a message (``fallback(text)``) instead of
    the bare "Error" Gradio shows for a handler that raises."""

    @functools.wraps(handler)
    def call(*args):
        try:
            return handler(*args)
        except Exception as exc:
            logger.exception("handler %s failed", handler.__name__)
            return fallback(f"**Something went wrong** ({type(exc).__name__}: {exc}). The server log has "
                            "the traceback; please report it.")

    return call


def _nothing() -> None:
    """A step on the server between an event and its .then (which then reads the values after it)."""


def _skips(n: int) -> tuple:
    import gradio as gr

    return tuple(gr.skip() for _ in range(n))


def _wire_views(c: dict, p: str, target: Any, find: Callable[[Any], tuple[RunView | None, str]]) -> tuple:
    """Connect a run page's controls to a redraw. ``target`` is the State naming the page's run,
    ``find(value)`` gives its view (or None) and header. Returns the redraw's inputs and outputs
    and the function drawing it: ``draw(target, page_state, *controls, force=...)``."""
    import gradio as gr

    inputs = [target, c[f"{p}_page"], *[c[f"{p}_{k}"] for k in CONTROLS]]
    outputs = [c[f"{p}_page"], *[c[f"{p}_{k}"] for k in VIEW_OUTPUTS]]

    def draw(value, state, *values, force=True, jump=False, change=None):
        view, header, *more = find(value)  # (a third: the run's interventions)
        return redraw(view, header, value, state, values, force=force, jump=jump, change=change,
                      interventions=more[0] if more else None)

    def handler(**options):
        def on_event(*args):
            return draw(*args, **options)
        on_event.__name__ = f"draw_{p}"
        return _guarded(on_event, lambda text: (*_skips(1), text, *_skips(len(VIEW_OUTPUTS) - 1)))

    # the user's own changes (not the page's updates of its pickers, which would redraw again)
    # a multiselect the user picks in or removes from is theirs from then on. Gradio's multiselect
    # tells a pick by keyboard by .select only (not .input), and "clear all" by .change only, which
    # the page's own updates fire too, at times with an empty value on the way (new choices): so a
    # clear is drawn at the next pick, and .change is not listened to
    # (.select reaches the server before the picker's new value is set: the drawing follows it)
    for key, auto in (("metric_names", "auto_metrics"), ("sites", "auto_sites")):
        def theirs(state, auto=auto):
            return {**(state or new_page_state()), auto: False}

        # ("always_last": a pick made while the last one is drawn is drawn after it; the default,
        # "once", drops it - two quick picks showed one)
        c[f"{p}_{key}"].select(theirs, c[f"{p}_page"], c[f"{p}_page"], show_progress="hidden",
                               trigger_mode="always_last").then(
            handler(), inputs, outputs, show_progress="hidden", trigger_mode="always_last")
    c[f"{p}_kind"].input(handler(change={"auto_sites": True}), inputs, outputs, show_progress="hidden")
    # (.change, not .release: a value typed into the slider's box fires change and input at once, and
    # release only at the next blur; one typed out of range is put back into it at the blur, which fires
    # change alone. The page never sets the slider itself, so each change is the user's; "always_last"
    # draws a drag's last value after the one being drawn, not every value on the way)
    c[f"{p}_smoothing"].change(handler(), inputs, outputs, show_progress="hidden", trigger_mode="always_last")
    for key in ("log_metrics", "stat", "log_sites", "dist_site", "heat_kind", "heat_log"):
        c[f"{p}_{key}"].input(handler(), inputs, outputs, show_progress="hidden")
    # a new heatmap statistic comes with its own log scale (figures.LOG_STATISTICS), which the box can change
    c[f"{p}_heat_stat"].input(lambda stat: gr.Checkbox(value=stat in figures.LOG_STATISTICS), c[f"{p}_heat_stat"],
                              c[f"{p}_heat_log"], show_progress="hidden").then(
        handler(), inputs, outputs, show_progress="hidden")
    c[f"{p}_jump"].click(handler(jump=True), inputs, outputs, show_progress="hidden")
    return inputs, outputs, draw


def wire(c: dict, manager: RunManager, app: Any = None) -> None:
    """Connect the components; ``manager`` owns the live runs, ``app`` (the Blocks) lists them on load."""
    import gradio as gr

    from workbench.ui.model_browser import widget

    root = manager.root
    cache = ViewCache(root)
    c["experiment"].change(experiment_overview, c["experiment"], c["overview"])
    listing = [c["pick"], c["runs"], c["runs_note"]]

    def ticking():
        """The page's timer, on while any run of the app goes: it draws the page's run, and the list of runs."""
        return gr.Timer(active=any(r.running for r in manager.runs()))

    def listed(value=None, first_running=False):
        """The dropdown (keeping ``value`` picked when it is still listed; else, with ``first_running``,
        the newest run in progress), the table and the note."""
        choices = run_choices(manager)
        keep = value if any(v == value for _, v in choices) else None
        if keep is None and first_running:
            keep = next((r.id for r in manager.runs() if r.running), None)
        return gr.Dropdown(choices=choices, value=keep), runs_frame(manager), runs_note(manager)

    def find_live(attached):
        if not attached:
            return None, "_No run on this page: start one (New run), or attach to one below._"
        run, message = _find(manager, attached)
        return (None, message) if run is None else (run.view, _live_header(run), run.intervention_frame())

    live_inputs, live_outputs, draw_live = _wire_views(c, "live", c["live_state"], find_live)
    n_views = len(VIEW_OUTPUTS)

    with c["form"]:
        @gr.render(inputs=[c["experiment"], c["prefill"]])
        def render_form(name, prefill):
            # an uploaded checkpoint's settings fill the form of the experiment it fits (a new key: a
            # keyed widget would keep the value it had)
            given = (prefill or {}).get("values", {}) if (prefill or {}).get("experiment") == name else {}
            version = (prefill or {}).get("version", 0) if given else 0
            fields = [dataclasses.replace(f, value=_form_value(f, given[f.label])) if f.label in given else f
                      for f in experiment_fields(name)]
            widgets = [widget(f, key=f"exp:{name}:{version}:{f.label}") for f in fields]
            labels = [f.label for f in fields]
            start = gr.Button("Start", variant="primary", elem_id="run-start")

            def on_start(attached, exp_name, seed, device, steps, every, histograms, modules, record, store,
                         weights, *values):
                new, message = start_run(manager, exp_name, dict(zip(labels, values)), seed, steps, every,
                                         histograms, modules, store, device, record, weights or None)
                if new is None:  # the page stays with the run it watches, if any
                    # (also as a pop-up: the page scrolls to the run's header, far from the message under Start)
                    gr.Warning(pop_up_text(message))
                    return (gr.skip(), gr.skip(), message, gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                            *listed(attached), *_skips(len(buttons)))
                started = f"Started {new.label}; this page is attached to it."
                previous = manager.get(attached)
                if previous is not None and previous.running:
                    started += f" {previous.label} runs on: pick it in the list to attach to it again."
                # the form folds away: the page is for the run now (open it again for the next one)
                state = new_page_state()
                return (_live_header(new), new.id, "", state, gr.Timer(active=True),
                        gr.Accordion(open=False), started, *listed(new.id), *button_updates(new.id, state, fresh=True))

            # (the page scrolls to the run's header: Start lies at the foot of a long form)
            start.click(_guarded(on_start, lambda text: (gr.skip(), gr.skip(), text, *_skips(7 + len(buttons)))),
                        [c["live_state"], c["experiment"], c["seed"], c["device"], c["steps"], c["every"],
                         c["histograms"], c["modules"], c["record"], c["store"], c["weights"], *widgets],
                        [c["status"], c["live_state"], c["start_message"], c["live_page"], c["timer"], c["config"],
                         c["live_message"], *listing, *buttons]).then(None, js=SHOW_HEADER).then(
                _guarded(draw_live, lambda text: (gr.skip(), text, *_skips(n_views - 1))),
                live_inputs, live_outputs, show_progress="hidden").then(
                refresh_panel, [c["live_state"], c["live_page"]], [c["live_page"], *panel, *buttons],
                show_progress="hidden")

    panel = [c["iv_site"], c["iv_table"], c["iv_on"]]

    def panel_updates(attached, state: dict, site: Any = None, keep_pick: bool = False) -> tuple:
        """The intervention panel's updates, each sent only when it changed (``state`` remembers); the
        site picked (``site``) stays picked while the run has it, and with ``keep_pick`` whatever the page
        has picked is left as it is (a tick: sites recorded later join the list under the person's pick)."""
        sites, table, on = intervention_panel(manager, attached)
        sent = state.setdefault("iv", {})
        rows = table.astype(str).values.tolist()
        out = (gr.skip() if sent.get("sites") == sites else
               gr.Dropdown(choices=site_choices(sites)) if keep_pick else
               gr.Dropdown(choices=site_choices(sites), value=site if site in sites else None),
               gr.skip() if sent.get("table") == rows else table,
               gr.skip() if sent.get("on") == on else gr.Dropdown(choices=on, value=on[-1] if on else None))
        sent.update(sites=sites, table=rows, on=on)
        return out

    buttons = [c["pause"], c["resume"], c["stop"], c["iv_apply"], c["iv_remove"]]  # (run_controls' order)

    def button_updates(attached, state: dict, fresh: bool = False) -> tuple:
        """Pause, Resume, Stop, Apply and Remove, enabled where they apply to the page's run
        (:func:`run_controls`), greyed out where not; each sent only when it changed (``state``
        remembers; ``fresh``: whatever the page had)."""
        able = run_controls(manager, attached)
        sent = {} if fresh else state.get("buttons", {})
        state["buttons"] = able
        return tuple(gr.skip() if sent.get(k) == v else gr.Button(interactive=v) for k, v in able.items())

    def list_updates(state: dict) -> tuple:
        """The runs table, its note and the picker's choices, each sent only when it changed (``state``
        remembers what the page has)."""
        choices, table, note = run_choices(manager), runs_frame(manager), runs_note(manager)
        rows = table.to_dict("records")
        pick = gr.skip() if state.get("runs") == choices else gr.Dropdown(choices=choices)
        table, note = (gr.skip(), gr.skip()) if state.get("run_rows") == (rows, note) else (table, note)
        state.update(runs=choices, run_rows=(rows, note))
        return table, note, pick

    def on_tick(attached, state, *values):
        run = manager.get(attached) if attached else None
        # ticking while any run of the app goes (another page's too: the list of runs follows it), and once
        # after (before drawing: a run ending now is drawn next tick)
        going = any(r.running for r in manager.runs())
        drawn = draw_live(attached, state, *values, force=False)
        # the run list's labels and table say each run's state and step (the pick is kept)
        return (*drawn, gr.Timer(active=going), *list_updates(drawn[0]),
                *panel_updates(attached, drawn[0], keep_pick=True), *button_updates(attached, drawn[0]),
                *_hidden_while_empty(*findings_view.page_findings(run, drawn[0])))

    def on_list_tick(state):
        state = dict(state or {})
        going = any(r.running for r in manager.runs())
        timer = gr.Timer(active=True) if going and not state.get("going") else gr.skip()  # (a run was started)
        state["going"] = going
        return state, *list_updates(state), timer

    c["list_timer"].tick(_guarded(on_list_tick, lambda text: _skips(5)), c["list_state"],
                         [c["list_state"], c["runs"], c["runs_note"], c["pick"], c["timer"]], show_progress="hidden")
    c["timer"].tick(_guarded(on_tick, lambda text: (gr.skip(), text, *_skips(n_views - 1),
                                                    gr.Timer(active=False), *_skips(8 + len(buttons)))),
                    live_inputs, [*live_outputs, c["timer"], c["runs"], c["runs_note"], c["pick"], *panel, *buttons,
                                  c["findings_note"], c["findings"]],
                    show_progress="hidden")  # (a tick every second: no flicker of its outputs)

    c["findings"].select(_guarded(findings_view.select_handler(manager), lambda text: (gr.skip(), text,
                                                                                      *_skips(n_views + 1))),
                         live_inputs, [*live_outputs, c["findings_note"], c["live_stat"]], show_progress="hidden")

    def on_panel(attached, state):
        state = dict(state or new_page_state())
        state["iv"] = {}  # (another run, or none: everything is sent)
        return state, *panel_updates(attached, state), *button_updates(attached, state, fresh=True)

    refresh_panel = _guarded(on_panel, lambda text: _skips(4 + len(buttons)))

    def on_op(op):  # (the fields of the intervention picked; a message about the last one's goes)
        shown_fields = _INTERVENTION_FIELDS.get(op, ())
        return (*(gr.update(visible=key in shown_fields) for key in ("iv_units", "iv_k", "iv_sigma", "iv_low",
                                                                      "iv_high")), "")

    c["iv_op"].change(on_op, c["iv_op"], [c["iv_units"], c["iv_k"], c["iv_sigma"], c["iv_low"], c["iv_high"],
                                         c["iv_message"]], show_progress="hidden")

    def on_apply(attached, state, site, op, units, k, sigma, low, high):
        message = apply_intervention(manager, attached, site, op, units, k, sigma, low, high)
        state = {**(state or new_page_state()), "iv": {}}  # (everything sent, the site picked kept)
        return message, state, *panel_updates(attached, state, site), *button_updates(attached, state)

    def on_remove(attached, state, chosen, site):
        message = remove_applied(manager, attached, chosen)
        state = {**(state or new_page_state()), "iv": {}}
        return message, state, *panel_updates(attached, state, site), *button_updates(attached, state)

    panel_outputs = [c["iv_message"], c["live_page"], *panel, *buttons]
    c["iv_apply"].click(_guarded(on_apply, lambda text: (text, *_skips(4 + len(buttons)))),
                        [c["live_state"], c["live_page"], c["iv_site"], c["iv_op"], c["iv_units"], c["iv_k"],
                         c["iv_sigma"], c["iv_low"], c["iv_high"]], panel_outputs).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *_skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden")
    c["iv_remove"].click(_guarded(on_remove, lambda text: (text, *_skips(4 + len(buttons)))),
                         [c["live_state"], c["live_page"], c["iv_on"], c["iv_site"]], panel_outputs).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *_skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden")

    # ------------------------------------------------------------ initial weights
    def on_weights(path, prefill):
        text, tree, outputs, experiment, settings = inspect_weights(path)
        outputs = outputs_html(outputs)
        if not path:
            return "", gr.Accordion(visible=False), "", tree, outputs, gr.skip(), gr.skip()
        note = text.split("\n\n")[0] if not text.startswith("**Refused") else text
        if experiment is None:
            return note, gr.Accordion(visible=True, open=True), text, tree, outputs, gr.skip(), gr.skip()
        version = int((prefill or {}).get("version", 0)) + 1
        return (note, gr.Accordion(visible=True, open=True), text, tree, outputs, gr.Radio(value=experiment),
                {"experiment": experiment, "values": settings, "version": version})

    c["weights"].change(_guarded(on_weights, lambda text: (text, *_skips(6))), [c["weights"], c["prefill"]],
                        [c["weights_info"], c["weights_inspect"], c["weights_summary"], c["weights_tree"],
                         c["weights_outputs"], c["experiment"], c["prefill"]])

    def on_attach(picked):
        attached, message = attach(manager, picked)
        if attached is None:
            return gr.skip(), message, gr.skip(), gr.skip(), *listed(picked), *_skips(len(buttons) + 1)
        state = new_page_state()
        return (attached, "", state, ticking(), *listed(attached), *button_updates(attached, state, fresh=True),
                "")  # (the last run's intervention message goes with it)

    c["attach"].click(_guarded(on_attach, lambda text: (gr.skip(), text, *_skips(6 + len(buttons)))), [c["pick"]],
                      [c["live_state"], c["live_message"], c["live_page"], c["timer"], *listing, *buttons,
                       c["iv_message"]]).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *_skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden").then(
        refresh_panel, [c["live_state"], c["live_page"]], [c["live_page"], *panel, *buttons], show_progress="hidden")

    def on_stop(attached, state):
        message = stop_run(manager, attached)
        run = manager.get(attached) if attached else None
        header = _live_header(run) if run is not None else gr.skip()
        state = dict(state or new_page_state())
        return (header, "" if run is not None and "had ended" not in message else message, *listed(attached), state,
                *button_updates(attached, state, fresh=True))

    c["stop"].click(_guarded(on_stop, lambda text: (gr.skip(), text, *_skips(4 + len(buttons)))),
                    [c["live_state"], c["live_page"]],
                    [c["status"], c["live_message"], *listing, c["live_page"], *buttons])

    for button, pause in ((c["pause"], True), (c["resume"], False)):
        def on_pause(attached, state, pause=pause):
            message = pause_run(manager, attached, pause)
            run = manager.get(attached) if attached else None
            state = dict(state or new_page_state())
            controls = (state, *button_updates(attached, state, fresh=True))
            if run is None:  # (not attached, or no such run: the message says which)
                return gr.skip(), message, *listed(attached), *controls
            note = message.rsplit("\n\n", 1)[1] if "\n\n_It" in message else ""  # (had ended, already paused ...)
            return _live_header(run), note, *listed(attached), *controls

        button.click(_guarded(on_pause, lambda text: (gr.skip(), text, *_skips(4 + len(buttons)))),
                     [c["live_state"], c["live_page"]],
                     [c["status"], c["live_message"], *listing, c["live_page"], *buttons])

    def on_detach(attached, picked):
        _, message = detach(manager, attached)
        # (the last run's intervention message and findings go with it)
        return (None, message, ticking(), *listed(picked), "",
                *_hidden_while_empty("", pd.DataFrame(columns=findings_view.TABLE_COLUMNS)))

    c["detach"].click(_guarded(on_detach, lambda text: (gr.skip(), text, *_skips(7))),
                      [c["live_state"], c["pick"]],
                      [c["live_state"], c["live_message"], c["timer"], *listing, c["iv_message"], c["findings_note"],
                       c["findings"]]
                      ).then(_guarded(draw_live, lambda text: (gr.skip(), text, *_skips(n_views - 1))),
                             live_inputs, live_outputs, show_progress="hidden").then(
        refresh_panel, [c["live_state"], c["live_page"]], [c["live_page"], *panel, *buttons], show_progress="hidden")
    c["list"].click(_guarded(listed, lambda text: (gr.skip(), gr.skip(), text)), c["pick"], listing)

    # ------------------------------------------------------------ the Runs tab
    def find_stored(name):
        if not name:
            return None, "_Pick a run above (or click its row)._"
        view, run, message = cache.get(name)
        if view is None:
            return None, message
        interventions = stored_interventions(run)
        header = figures.header_markdown(view)
        if len(interventions):  # (their bands are over the figures)
            header += "\n\nInterventions: " + "; ".join(
                f"{row.id} **{row.intervention}** at `{row.site}`, steps {row['from step']}-{row['to step']}"
                for _, row in interventions.iterrows())
        if run.status == "running":  # (the page draws what was stored when it read it: nothing redraws it)
            header += (f"\n\n_Read at {time.strftime('%H:%M:%S')} while still being recorded: the views show the "
                       "steps stored by then; **List runs** reads it again._")
        return view, header, interventions

    replay_inputs, replay_outputs, draw_replay = _wire_views(c, "replay", c["run_state"], find_stored)
    _redraw_replay = _guarded(draw_replay, lambda text: (gr.skip(), text, *_skips(n_views - 1)))
    stored_findings = _guarded(lambda pick: findings_view.stored_findings(cache, pick), lambda text: (text, gr.skip()))

    def redraw_replay(*args):  # the views, and the run's findings
        return (*_redraw_replay(*args), *_hidden_while_empty(*stored_findings(args[0])))

    replay_outputs = [*replay_outputs, c["replay_findings_note"], c["replay_findings"]]
    c["replay_findings"].select(
        _guarded(findings_view.stored_select_handler(cache, find_stored),
                 lambda text: (gr.skip(), text, *_skips(n_views + 1))),
        replay_inputs, [*replay_outputs[:-2], c["replay_findings_note"], c["replay_stat"]], show_progress="hidden")

    def on_pick(pick):
        """Open a run: its line at once; its views (hidden until drawn: a long run takes a while to read,
        and the run open before must not show under this one's name) by :func:`shown_body` after."""
        run, message = replay(root, pick)
        if run is not None:
            message += " · _reading its steps…_"
        return (pick if run is not None else None), message, new_page_state(), gr.skip(), gr.Column(visible=False)

    def shown_body(pick, page):
        """The views once drawn (a draw that failed left its ``version`` unset: the last run's views
        would show under this one's name, so they stay hidden and the line says so)."""
        run, message = replay(root, pick) if pick else (None, gr.skip())
        drawn = run is not None and (page or {}).get("version") is not None
        if run is not None and not drawn:
            message += " · **its views could not be drawn** (the server's log has why; please report it)"
        return message, gr.Column(visible=drawn)

    def on_row(table, evt: gr.SelectData):
        row = evt.row_value or None
        if row is None and isinstance(table, pd.DataFrame) and evt.index is not None:
            row = table.iloc[evt.index[0]].tolist()
        pick = row[0] if row else None
        opened = on_pick(pick)
        return (*opened[:3], gr.Dropdown(value=pick), opened[4])

    on_row.__annotations__["evt"] = gr.SelectData  # (a real class: Gradio passes the event by it)
    picked = [c["run_state"], c["run_message"], c["replay_page"], c["run_path"], c["replay_body"]]
    pick_fallback = lambda text: (None, text, gr.skip(), gr.skip(), gr.Column(visible=False))  # noqa: E731
    shown = _guarded(shown_body, lambda text: (text, gr.skip()))
    c["run_path"].input(_guarded(on_pick, pick_fallback), c["run_path"], picked).then(
        redraw_replay, replay_inputs, replay_outputs, show_progress="hidden").then(
        shown, [c["run_state"], c["replay_page"]], [c["run_message"], c["replay_body"]], show_progress="hidden")
    c["runs_table"].select(_guarded(on_row, pick_fallback), c["runs_table"], picked).then(
        redraw_replay, replay_inputs, replay_outputs, show_progress="hidden").then(
        shown, [c["run_state"], c["replay_page"]], [c["run_message"], c["replay_body"]], show_progress="hidden")

    def on_list(sub, compared=(), open_first=True, current=None):
        """List the stored runs and open again the one open (``current``: it may have grown since), or the
        newest where it is not listed; the runs picked for comparison stay picked where they are still
        listed (a pick not among the choices is an error), and the comparison is drawn again after."""
        table, names, message = run_table(root, sub)
        first = current if current in names else names[0] if names and open_first else None
        opened = on_pick(first) if first else (None, "Pick a run above (or click its row).", new_page_state(),
                                               gr.skip(), gr.Column(visible=False))
        page = gr.skip() if first is not None and first == current else opened[2]  # (the open run keeps its picks)
        return (table, gr.Dropdown(choices=names, value=first), message,
                gr.Dropdown(choices=names, value=[n for n in compared or () if n in names]), *opened[:2], page,
                opened[4])

    listed_runs = [c["runs_table"], c["run_path"], c["runs_message"], c["compare_runs"], c["run_state"],
                   c["run_message"], c["replay_page"], c["replay_body"]]

    def on_refresh(sub, compared, current):
        return on_list(sub, compared, current=current)

    # (List runs, or Enter in the sub-directory box)
    listing_runs = gr.on([c["refresh"].click, c["root"].submit],
                         _guarded(on_refresh, lambda text: (gr.skip(), gr.skip(), text, *_skips(5))),
                         [c["root"], c["compare_runs"], c["run_state"]], listed_runs)
    listing_runs.then(redraw_replay, replay_inputs, replay_outputs, show_progress="hidden").then(
        shown, [c["run_state"], c["replay_page"]], [c["run_message"], c["replay_body"]], show_progress="hidden")

    def on_runs_tab(sub):
        """The list brought up to date when the tab is shown (runs stored since the page loaded); the run
        open and the runs compared stay as they are (the pickers get the new choices, not a value: a
        List runs clicked meanwhile opens a run, which this reply must not take back)."""
        table, names, message = run_table(root, sub)
        return table, gr.Dropdown(choices=names), message, gr.Dropdown(choices=names)

    c["runs_tab"].select(_guarded(on_runs_tab, lambda text: (gr.skip(), gr.skip(), text, gr.skip())),
                         c["root"], listed_runs[:4], show_progress="hidden")
    if app is not None:  # a new or reloaded page lists the runs in this app and the stored ones
        def on_load():
            return (*listed(first_running=True), *on_list("", (), open_first=False),  # (opened when picked)
                    ticking())

        app.load(_guarded(on_load, lambda text: (gr.skip(), gr.skip(), text, gr.skip(), gr.skip(), text,
                                                 *_skips(6))), None, [*listing, *listed_runs, c["timer"]])

    def on_export(name, pick, fmt):
        paths, message = export_run(root, name or pick, fmt)
        return message, gr.File(value=paths or None, visible=bool(paths))

    c["export"].click(_guarded(on_export, lambda text: (text, gr.skip())),
                      [c["run_state"], c["run_path"], c["export_format"]], [c["export_message"], c["export_files"]])

    def on_compare(picks, kind, stat, site, log_y, colors):
        # (the runs' colours, kept in the page's state: a run still compared keeps its colour)
        colors = figures.steady_colors(list(dict.fromkeys(p for p in picks or () if isinstance(p, str)))
                                    if isinstance(picks, (list, tuple)) else [], colors)
        metrics, site_fig, choices, site, message = compare_runs(cache, picks, kind, stat, site, 0.0, log_y,
                                                                 colors)
        drawn = metrics is not None  # else the plots are hidden, and the message says what to pick
        return (gr.Plot(plot_data(metrics) if drawn else None, visible=drawn),
                gr.Plot(plot_data(site_fig) if drawn else None, visible=drawn),
                gr.Dropdown(choices=choices, value=site), message, colors)

    compare_inputs = [c["compare_runs"], c["compare_kind"], c["compare_stat"], c["compare_site"], c["compare_log"],
                      c["compare_colors"]]
    compare_outputs = [c["compare_metrics"], c["compare_site_plot"], c["compare_site"], c["compare_message"],
                       c["compare_colors"]]
    compare = _guarded(on_compare, lambda text: (gr.skip(), gr.skip(), gr.skip(), text, gr.skip()))
    listing_runs.then(compare, compare_inputs, compare_outputs, show_progress="hidden")  # (the runs may have changed)
    # (a pick in the runs multiselect by .select, whose value arrives after it: drawn in a .then)
    # ("always_last": a second pick made while the first is drawn is drawn after it, not dropped)
    c["compare_runs"].select(_nothing, None, None, show_progress="hidden", trigger_mode="always_last").then(
        compare, compare_inputs, compare_outputs, trigger_mode="always_last")
    for key in ("compare_kind", "compare_stat", "compare_site", "compare_log"):
        c[key].input(compare, compare_inputs, compare_outputs, trigger_mode="always_last")
