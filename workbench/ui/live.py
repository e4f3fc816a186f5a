"""Experiments and runs: run a built-in experiment under ``watch`` and see it live; replay stored runs.

Handlers are plain functions over the core API (tested without a browser);
:func:`layout` / :func:`wire` put them into the Gradio app. The Jupyter
dashboard (``workbench.ui.notebook.Dashboard``) draws from the same frames.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from workbench.experiments import create, get_experiment_spec, list_experiments
from workbench.instrument import STAT_COLUMNS, Run, RunError
from workbench.instrument.recorder import KINDS
from workbench.ui.forms import FormField, form_fields, parse_form
from workbench.ui.runs import PathRefused, RunManager, RunsRoot, shown

logger = logging.getLogger(__name__)

__all__ = ["LiveRun", "experiment_fields", "experiment_overview", "start_run", "metrics_long", "stat_series",
           "latest_table", "anomaly_table", "runs_frame", "run_choices", "attach", "detach", "stop_run",
           "run_views", "run_table", "replay", "STATISTICS", "layout", "wire"]

STATISTICS = [c for c in STAT_COLUMNS if c != "numel"]
LATEST_COLUMNS = ["module", "call", "kind", "tensor", "shape", "mean", "std", "abs_mean", "zero_frac", "nan_count",
                  "inf_count"]
SERIES_LIMIT = 24  # lines in one plot; more call sites than this are cut, with a note
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
        **watch_options: options of ``workbench.watch``.

    Attributes:
        outcome: None while it runs, then how it ended: 'finished', 'stopped' or 'failed'
            (the status its watch was closed with).
        error: the traceback of the step that raised (a failed run), else None.
    """

    def __init__(self, name: str, config: dict[str, Any], seed: int, steps: int, store: str | None = None,
                 device: str = "cpu", run_id: str = "", **watch_options: Any) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}.")
        self.id, self.name, self.seed, self.steps = run_id, name, seed, steps
        self.started = time.time()
        self.experiment = create(name, seed=seed, device=device, **config)
        self.watch = self.experiment.watch(store=store, **watch_options)
        self.error: str | None = None
        self.outcome: str | None = None
        self._stop = threading.Event()
        self._on_done: Callable[[LiveRun], Any] | None = None
        self._thread = threading.Thread(target=self._loop, name=f"workbench-run-{run_id or name}", daemon=True)

    def start(self, on_done: Callable[[LiveRun], Any] | None = None) -> LiveRun:
        """Start the run's thread; ``on_done(run)`` is called on it once the watch is closed."""
        self._on_done = on_done
        self.started = time.time()
        self._thread.start()
        return self

    @property
    def label(self) -> str:
        """``r3 activation_mlp, seed 0, 17:05:12``: what a page lists it by."""
        return f"{self.id} {self.name}, seed {self.seed}, {time.strftime('%H:%M:%S', time.localtime(self.started))}"

    def _loop(self) -> None:
        status, error = "finished", None
        try:
            for _ in range(self.steps):
                if self._stop.is_set():
                    status = "stopped"
                    break
                self.experiment.step()
        except BaseException:  # the run's thread ends here, whatever the step raised
            status, error = "failed", traceback.format_exc()
        try:
            close_watch(self.watch, status, error)
        except Exception:  # closing (writing the store's last steps) failed: the run did not finish well
            status = "failed"
            error = (error or "") + traceback.format_exc()
        lost = getattr(self.watch.store, "lost", 0)
        if lost and status != "failed":  # the store closed itself as failed: say so here too
            status, error = "failed", f"{lost} step(s) could not be stored in {self.watch.store.path}"
        self.error, self.outcome = error, status
        if self._on_done is not None:
            self._on_done(self)

    @property
    def running(self) -> bool:
        """Until its watch is closed (its store written and marked)."""
        return self.outcome is None

    @property
    def state(self) -> str:
        """'running', 'stopping' (asked to stop, finishing its step), 'finished', 'stopped' or 'failed'."""
        if self.outcome is not None:
            return self.outcome
        return "stopping" if self._stop.is_set() else "running"

    def request_stop(self) -> None:
        """Ask the run to stop after its current step; returns at once."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step and close the watch (and its store) as stopped."""
        self._stop.set()
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
        if self.watch.recorder.evicted:
            text += f" - {self.watch.recorder.evicted} old steps left the in-memory buffer"
        if self.error:
            text += f"\n\n```\n{self.error.strip().splitlines()[-1]}\n```"
        if self.watch.errors:
            text += f"\n\n{len(self.watch.errors)} instrumentation error(s); the first: `{self.watch.errors[0]['error']}`"
        return text

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The statistics rows and the metrics recorded so far."""
        return self.watch.to_pandas(), self.watch.metrics()


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


SEED_MAX = 2**32 - 1
STEPS_MAX = 10_000_000


def start_run(manager: RunManager, name: str | None, values: dict[str, Any], seed: Any, steps: Any, every: Any,
              histograms: Any, modules: Any, store: Any, device: Any = "cpu",
              record: Sequence[str] | None = None) -> tuple[LiveRun | None, str]:
    """Validate the form and start a :class:`LiveRun` in ``manager``; returns it (or None) and a message.

    ``store`` is a run name under the manager's root ('' for none); ``record`` names the kinds of
    tensor to record (keys of :data:`RECORD_CHOICES`); None: all. Never raises: bad input is a message.
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
        run = manager.start(name, config, _int(seed, "seed", 0, SEED_MAX), _int(steps, "steps", 1, STEPS_MAX),
                            store=store, device=device, every=_int(every, "every", 1, STEPS_MAX),
                            histograms=histograms, modules=patterns, **_record_switches(record))
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


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is empty; give a whole number in [{low}, {high}].")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {shown(value)}.")
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}.")
    return value


def metrics_long(metrics: pd.DataFrame) -> pd.DataFrame:
    """``step, metric, value``: one line per metric, for a line plot."""
    if metrics.empty or len(metrics.columns) <= 1:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "metric": pd.Series(dtype=str),
                             "value": pd.Series(dtype="float64")})
    # metrics in name order: a live run holds them in the order they were logged, a stored one in
    # name order, and the plot's colours follow the order; sorted, a run replays in its live colours
    names = sorted(c for c in metrics.columns if c != "step")
    return metrics[["step", *names]].melt(id_vars="step", var_name="metric", value_name="value").dropna()


def _sites(rows: pd.DataFrame) -> pd.Series:
    return rows.module.replace("", "(model)") + "#" + rows.call.astype(str) + ":" + rows.tensor


def stat_series(rows: pd.DataFrame, kind: str, statistic: str, pattern: str = "*") -> tuple[pd.DataFrame, str]:
    """``step, site, value`` of one statistic for the call sites matching ``pattern``, and a note.

    A site is ``module#call:tensor``; at most :data:`SERIES_LIMIT` sites are kept
    (in the order the model runs them) and the note says how many were left out.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}.")
    empty = pd.DataFrame({"step": pd.Series(dtype="int64"), "site": pd.Series(dtype=str),
                          "value": pd.Series(dtype="float64")})
    if rows.empty:
        return empty, "Nothing recorded yet."
    pattern = (pattern or "*").strip() or "*"
    chosen = rows[(rows.kind == kind) & rows.module.map(lambda m: fnmatch.fnmatchcase(m, pattern))]
    if chosen.empty:
        return empty, f"No {kind} rows for modules matching `{pattern}`."
    series = pd.DataFrame({"step": chosen.step, "site": _sites(chosen), "value": chosen[statistic]})
    order = list(dict.fromkeys(series.site))
    note = f"{len(order)} call site" if len(order) == 1 else f"{len(order)} call sites"
    if len(order) > SERIES_LIMIT:
        note = f"showing the first {SERIES_LIMIT} of {len(order)} call sites; narrow the module filter"
        series = series[series.site.isin(order[:SERIES_LIMIT])]
    return series.reset_index(drop=True), note


def latest_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last recorded step, rounded for reading."""
    if rows.empty:
        return pd.DataFrame(columns=LATEST_COLUMNS)
    last = rows[rows.step == rows.step.max()][LATEST_COLUMNS].round(5).reset_index(drop=True)
    last["module"] = last.module.replace("", "(model)")
    return last


def anomaly_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with NaN or Inf, first appearance first."""
    columns = ["step", "module", "call", "kind", "tensor", "nan_count", "inf_count"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    found = rows[(rows.nan_count > 0) | (rows.inf_count > 0)][columns].reset_index(drop=True)
    found["module"] = found.module.replace("", "(model)")
    return found


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


def run_views(manager: RunManager, run_id: Any, kind: str, stat: str, pattern: str) -> tuple:
    """What a page shows of its run: status, the five views, and whether to keep refreshing."""
    run, message = _find(manager, run_id) if run_id else (None, "")
    if run is None:
        return (message, *_views(pd.DataFrame(), pd.DataFrame(), kind, stat, pattern), False)
    rows, metrics = run.frames()
    # one last refresh after the run ends, then the page stops asking
    return (run.status(), *_views(rows, metrics, kind, stat, pattern), run.running)


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


# ---------------------------------------------------------------- Gradio
def _plots(c: dict, prefix: str):
    import gradio as gr

    with gr.Row():
        c[f"{prefix}_kind"] = gr.Dropdown(list(KINDS), value="activation", label="kind", elem_id=f"{prefix}-kind")
        c[f"{prefix}_stat"] = gr.Dropdown(STATISTICS, value="std", label="statistic", elem_id=f"{prefix}-stat")
        c[f"{prefix}_pattern"] = gr.Textbox("*", label="modules (glob)", elem_id=f"{prefix}-pattern")
    with gr.Row():
        c[f"{prefix}_metrics"] = gr.LinePlot(x="step", y="value", color="metric", title="Metrics", height=300,
                                             elem_id=f"{prefix}-metrics")
        c[f"{prefix}_series"] = gr.LinePlot(x="step", y="value", color="site", title="Per call site", height=300,
                                            elem_id=f"{prefix}-series")
    c[f"{prefix}_note"] = gr.Markdown(elem_id=f"{prefix}-note")
    c[f"{prefix}_latest"] = gr.Dataframe(pd.DataFrame(columns=LATEST_COLUMNS), label="Last recorded step",
                                         interactive=False, max_height=400, elem_id=f"{prefix}-latest")
    c[f"{prefix}_anomalies"] = gr.Dataframe(anomaly_table(pd.DataFrame()), label="NaN / Inf (first appearance first)",
                                            interactive=False, max_height=200, elem_id=f"{prefix}-anomalies")


def _views(rows: pd.DataFrame, metrics: pd.DataFrame, kind: str, stat: str, pattern: str):
    try:
        series, note = stat_series(rows, kind, stat, pattern if isinstance(pattern, str) else "*")
    except ValueError as exc:  # a kind or statistic the dropdowns do not offer
        series, note = pd.DataFrame(), str(exc)
    # no rows: no plot (None), not an empty frame, which the page draws with the last legend it had
    long = metrics_long(metrics)
    return (None if long.empty else long, None if series.empty else series, note, latest_table(rows),
            anomaly_table(rows))


def plot_updates(shown: dict | None, long: pd.DataFrame | None,
                 series: pd.DataFrame | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None, dict, bool]:
    """What a page's two live plots are sent this refresh, given what they show (``shown``: the
    lines of each, as this function last returned it).

    Gradio's line plot keeps the colours (lines and legend) of the first data it drew: a metric
    or call site that appears later is not drawn, and one that went stays in the legend. A plot
    whose lines change is therefore sent None (cleared) and drawn afresh on the next refresh.

    Returns:
        The metrics plot's value, the per-call-site plot's value, the new ``shown``, and whether
        a plot waits to be drawn (the page must refresh once more).
    """
    shown = dict(shown or {})
    values, again = [], False
    for key, frame, column in (("metrics", long, "metric"), ("series", series, "site")):
        lines = None if frame is None else tuple(sorted(set(frame[column])))
        if lines is not None and shown.get(key) not in (None, lines):
            shown[key], frame, again = None, None, True
        else:
            shown[key] = lines
        values.append(frame)
    return values[0], values[1], shown, again


def layout(root: RunsRoot):
    """Place the Experiments and Runs tabs' components; call inside ``gr.Tabs``."""
    import gradio as gr

    names = list_experiments()
    c: dict[str, Any] = {}
    with gr.Tab("Experiments", id="experiments"):
        with gr.Row():
            with gr.Column(scale=1, min_width=260):
                c["experiment"] = gr.Radio(names, value=names[0], label="Experiment", elem_id="experiment-list")
                # no precision=0: Gradio would round 2.5 to 2 unseen; _int refuses it by name
                c["seed"] = gr.Number(0, label="seed", elem_id="run-seed", interactive=True)
                c["device"] = gr.Dropdown(devices(), value="cpu", label="device", elem_id="run-device",
                                          interactive=True)
                c["steps"] = gr.Number(200, label="steps", elem_id="run-steps", interactive=True)
                c["every"] = gr.Number(1, label="record every Nth step", elem_id="run-every", interactive=True)
                c["modules"] = gr.Textbox("*", label="watch modules (globs, comma separated)", elem_id="run-modules", interactive=True)
                c["record"] = gr.CheckboxGroup(list(RECORD_CHOICES), value=list(RECORD_CHOICES), label="record",
                                               elem_id="run-record", interactive=True)
                c["histograms"] = gr.Checkbox(False, label="histograms", elem_id="run-histograms", interactive=True)
                c["store"] = gr.Textbox("", label="record to run (optional)", placeholder="my-run or mlp/tanh",
                                        info=f"a run name under {root.path}", elem_id="run-store",
                                        interactive=True)
            with gr.Column(scale=3):
                c["overview"] = gr.Markdown(experiment_overview(names[0]), elem_id="experiment-overview")
                c["form"] = gr.Column()
                c["start_message"] = gr.Markdown(elem_id="start-message")
                gr.Markdown("#### Runs in this app\nThey run on the server: attach to one from any page "
                            "(after a reload too), watch it, stop it; detaching or closing the page leaves it "
                            "running.", elem_id="live-runs-help")
                with gr.Row(equal_height=False):
                    c["pick"] = gr.Dropdown([], value=None, label="run (in progress first)", elem_id="live-pick",
                                            scale=4, interactive=True)
                    c["attach"] = gr.Button("Attach", elem_id="live-attach", scale=1, min_width=90, size="lg")
                    c["stop"] = gr.Button("Stop", variant="stop", elem_id="run-stop", scale=1, min_width=90, size="lg")
                    c["detach"] = gr.Button("Detach", elem_id="live-detach", scale=1, min_width=90, size="lg")
                    c["list"] = gr.Button("Refresh", elem_id="live-refresh", scale=1, min_width=90, size="lg")
                c["runs"] = gr.Dataframe(pd.DataFrame(columns=RUN_COLUMNS), interactive=False, max_height=220,
                                         show_label=False, elem_id="live-runs")
                c["runs_note"] = gr.Markdown(elem_id="live-runs-note")
                c["status"] = gr.Markdown(elem_id="run-status")
                _plots(c, "live")
        c["timer"] = gr.Timer(1.0, active=False)
    with gr.Tab("Runs", id="runs"):
        gr.Markdown(f"Stored runs under `{root.path}` (the app's runs root: `python app.py --runs-root DIR`).",
                    elem_id="runs-root-note")
        with gr.Row(equal_height=False):
            c["root"] = gr.Textbox("", label="sub-directory (optional)", placeholder="empty: the whole root",
                                   elem_id="runs-sub", scale=3)
            c["refresh"] = gr.Button("List runs", elem_id="runs-refresh", scale=1)
        c["runs_message"] = gr.Markdown(elem_id="runs-message")
        c["runs_table"] = gr.Dataframe(interactive=False, label="Runs", elem_id="runs-table")
        c["run_path"] = gr.Dropdown([], value=None, label="run", elem_id="run-path")
        c["run_message"] = gr.Markdown(elem_id="run-message")
        _plots(c, "replay")
    # the page's run: only its id; the run itself is the manager's, and outlives the page
    c["live_state"] = gr.State(None)
    c["live_shown"] = gr.State(None)  # the lines the page's live plots show (see plot_updates)
    c["run_state"] = gr.State(None)
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


def wire(c: dict, manager: RunManager, app: Any = None) -> None:
    """Connect the components; ``manager`` owns the live runs, ``app`` (the Blocks) lists them on load."""
    import gradio as gr

    from workbench.ui.model_browser import widget

    root = manager.root
    c["experiment"].change(experiment_overview, c["experiment"], c["overview"])

    live_views = [c["live_metrics"], c["live_series"], c["live_note"], c["live_latest"], c["live_anomalies"]]
    listing = [c["pick"], c["runs"], c["runs_note"]]

    def listed(value=None, first_running=False):
        """The dropdown (keeping ``value`` picked when it is still listed; else, with ``first_running``,
        the newest run in progress), the table and the note."""
        choices = run_choices(manager)
        keep = value if any(v == value for _, v in choices) else None
        if keep is None and first_running:
            keep = next((r.id for r in manager.runs() if r.running), None)
        return gr.Dropdown(choices=choices, value=keep), runs_frame(manager), runs_note(manager)

    with c["form"]:
        @gr.render(inputs=c["experiment"])
        def render_form(name):
            fields = experiment_fields(name)
            widgets = [widget(f, key=f"exp:{name}:{f.label}") for f in fields]
            labels = [f.label for f in fields]
            start = gr.Button("Start", variant="primary", elem_id="run-start")

            def on_start(attached, exp_name, seed, device, steps, every, histograms, modules, record, store,
                         *values):
                new, message = start_run(manager, exp_name, dict(zip(labels, values)), seed, steps, every,
                                         histograms, modules, store, device, record)
                if new is None:  # the page stays with the run it watches, if any
                    return gr.skip(), message, gr.skip(), gr.skip(), *listed(attached)
                started = f"Started {new.label}; this page is attached to it."
                previous = manager.get(attached)
                if previous is not None and previous.running:
                    started += f" {previous.label} runs on: pick it in the list to attach to it again."
                return new.id, started, new.status(), gr.Timer(active=True), *listed(new.id)

            start.click(_guarded(on_start, lambda text: (gr.skip(), text, *[gr.skip()] * 5)),
                        [c["live_state"], c["experiment"], c["seed"], c["device"], c["steps"], c["every"],
                         c["histograms"], c["modules"], c["record"], c["store"], *widgets],
                        [c["live_state"], c["start_message"], c["status"], c["timer"], *listing])

    live_inputs = [c["live_state"], c["live_kind"], c["live_stat"], c["live_pattern"]]

    def on_tick(attached, kind, stat, pattern, shown):
        status, long, series, *views, going = run_views(manager, attached, kind, stat, pattern)
        long, series, shown, again = plot_updates(shown, long, series)
        return (status, long, series, *views, gr.Timer(active=going or again), runs_frame(manager),
                runs_note(manager), shown)

    live_inputs.append(c["live_shown"])
    tick_outputs = [c["status"], *live_views, c["timer"], c["runs"], c["runs_note"], c["live_shown"]]
    tick = _guarded(on_tick, lambda text: (text, *[gr.skip()] * 5, gr.Timer(active=False), *[gr.skip()] * 3))
    c["timer"].tick(tick, live_inputs, tick_outputs)
    for control in ("live_kind", "live_stat", "live_pattern"):
        c[control].change(tick, live_inputs, tick_outputs)

    def on_attach(picked, kind, stat, pattern, shown):
        attached, message = attach(manager, picked)
        if attached is None:
            return gr.skip(), message, *[gr.skip()] * 5, gr.skip(), *listed(picked), gr.skip()
        status, long, series, *views, going = run_views(manager, attached, kind, stat, pattern)
        long, series, shown, again = plot_updates(shown, long, series)
        return attached, status, long, series, *views, gr.Timer(active=going or again), *listed(attached), shown

    c["attach"].click(_guarded(on_attach, lambda text: (gr.skip(), text, *[gr.skip()] * 10)),
                      [c["pick"], c["live_kind"], c["live_stat"], c["live_pattern"], c["live_shown"]],
                      [c["live_state"], c["status"], *live_views, c["timer"], *listing, c["live_shown"]])

    def on_stop(attached):
        return stop_run(manager, attached), *listed(attached)

    c["stop"].click(_guarded(on_stop, lambda text: (text, *[gr.skip()] * 3)), c["live_state"],
                    [c["status"], *listing])

    def on_detach(attached, picked):
        _, message = detach(manager, attached)
        return None, message, gr.Timer(active=False), *listed(picked)

    c["detach"].click(_guarded(on_detach, lambda text: (gr.skip(), text, *[gr.skip()] * 4)),
                      [c["live_state"], c["pick"]], [c["live_state"], c["status"], c["timer"], *listing])
    c["list"].click(_guarded(listed, lambda text: (gr.skip(), gr.skip(), text)), c["pick"], listing)

    replay_inputs = [c["run_state"], c["replay_kind"], c["replay_stat"], c["replay_pattern"]]
    replay_outputs = [c["replay_metrics"], c["replay_series"], c["replay_note"], c["replay_latest"],
                      c["replay_anomalies"]]

    def draw(run, kind, stat, pattern):
        if run is None:
            return _views(pd.DataFrame(), pd.DataFrame(), kind, stat, pattern)
        try:
            return _views(run.to_pandas(), run.metrics(), kind, stat, pattern)
        except RunError as exc:  # deleted or damaged since it was opened
            metrics, series, _, latest, anomalies = _views(pd.DataFrame(), pd.DataFrame(), kind, stat, pattern)
            return metrics, series, f"**Cannot read:** {exc}", latest, anomalies

    def on_pick(pick, kind, stat, pattern):
        run, message = replay(root, pick)
        return run, message, *draw(run, kind, stat, pattern)

    # the replay's plots are cleared before each drawing: Gradio's line plot keeps the lines of the
    # first data it drew (see plot_updates), and another run or filter has other lines
    replay_plots = [c["replay_metrics"], c["replay_series"]]

    def clear():
        return None, None

    picked = [c["run_state"], c["run_message"], *replay_outputs]
    c["run_path"].input(clear, None, replay_plots).then(
        _guarded(on_pick, lambda text: (None, text, *[gr.skip()] * 5)),
        [c["run_path"], c["replay_kind"], c["replay_stat"], c["replay_pattern"]], picked)

    def on_list(sub, kind="activation", stat="std", pattern="*", open_first=True):
        """List the stored runs and open the newest (again: it may have grown since)."""
        table, names, message = run_table(root, sub)
        first = names[0] if names and open_first else None
        return table, gr.Dropdown(choices=names, value=first), message, *on_pick(first, kind, stat, pattern)

    listed_runs = [c["runs_table"], c["run_path"], c["runs_message"], *picked]
    c["refresh"].click(clear, None, replay_plots).then(
        _guarded(on_list, lambda text: (gr.skip(), gr.skip(), text, *[gr.skip()] * 7)),
        [c["root"], c["replay_kind"], c["replay_stat"], c["replay_pattern"]], listed_runs)
    if app is not None:  # a new or reloaded page lists the runs in this app and the stored ones
        def on_load():
            return *listed(first_running=True), *on_list("", open_first=False)  # (opened when picked)

        app.load(_guarded(on_load, lambda text: (gr.skip(), gr.skip(), text, gr.skip(), gr.skip(), text,
                                                 *[gr.skip()] * 7)), None, [*listing, *listed_runs])
    for control in ("replay_kind", "replay_stat", "replay_pattern"):
        c[control].change(clear, None, replay_plots).then(
            _guarded(draw, lambda text: (gr.skip(), gr.skip(), text, gr.skip(), gr.skip())),
            replay_inputs, replay_outputs)
