"""Experiments and runs: run a built-in experiment under ``watch`` and see it live; replay stored runs.

Handlers are plain functions over the core API (tested without a browser);
:func:`layout` / :func:`wire` put them into the Gradio app. The Jupyter
dashboard (``workbench.ui.notebook.Dashboard``) draws from the same frames.
"""

from __future__ import annotations

import fnmatch
import threading
import traceback
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from workbench.experiments import create, get_experiment_spec, list_experiments
from workbench.instrument import STAT_COLUMNS, Run, RunError, load_run
from workbench.instrument.recorder import KINDS
from workbench.ui.forms import FormField, form_fields, parse_form

__all__ = ["LiveRun", "experiment_fields", "experiment_overview", "start_run", "metrics_long", "stat_series",
           "latest_table", "anomaly_table", "run_table", "replay", "STATISTICS", "layout", "wire"]

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
    spec = get_experiment_spec(name)
    return f"### {name}\n{spec.summary}"


def experiment_fields(name: str | None) -> list[FormField]:
    return form_fields(get_experiment_spec(name).params) if name else []


class LiveRun:
    """An experiment running under ``watch`` on a background thread.

    Args:
        name: a registered experiment.
        config: its config overrides (validated).
        seed: the experiment's seed.
        steps: how many steps to run.
        store: a run directory to record into, or None (memory only).
        device: where the experiment trains ('cpu', 'cuda:0' ...).
        **watch_options: options of ``workbench.watch``.
    """

    def __init__(self, name: str, config: dict[str, Any], seed: int, steps: int, store: str | None = None,
                 device: str = "cpu", **watch_options: Any) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}.")
        self.name, self.steps = name, steps
        self.experiment = create(name, seed=seed, device=device, **config)
        self.watch = self.experiment.watch(store=store, **watch_options)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"workbench-run-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            for _ in range(self.steps):
                if self._stop.is_set():
                    break
                self.experiment.step()
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self.watch.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step and close the watch (and its store)."""
        self._stop.set()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def status(self) -> str:
        done = self.experiment.step_count
        state = "running" if self.running else ("failed" if self.error else
                                                 "stopped" if self._stop.is_set() else "finished")
        text = f"**{self.name}** - {state}: step {done} of {self.steps}"
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


def devices() -> list[str]:
    """The devices an experiment can train on in this process: the CPU, then each CUDA GPU."""
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def start_run(name: str | None, values: dict[str, Any], seed: Any, steps: Any, every: Any, histograms: bool,
              modules: str, store: str, device: str = "cpu",
              record: Sequence[str] | None = None) -> tuple[LiveRun | None, str]:
    """Validate the form and start a :class:`LiveRun`; returns it (or None) and a message.

    ``record`` names the kinds of tensor to record (keys of :data:`RECORD_CHOICES`); None: all.
    """
    if not name:
        return None, "Pick an experiment first."
    try:
        config = parse_form(get_experiment_spec(name).params, values, f"Experiment {name!r}")
        patterns = [p.strip() for p in (modules or "*").split(",") if p.strip()] or ["*"]
        live = LiveRun(name, config, _int(seed, "seed"), _int(steps, "steps"), store=(store or "").strip() or None,
                       device=device or "cpu", every=_int(every, "every"), histograms=bool(histograms),
                       modules=patterns, **_record_switches(record))
    except (ValueError, TypeError, FileExistsError) as exc:
        return None, f"**Could not start:** {exc}"
    return live, live.status()


def _record_switches(record: Sequence[str] | None) -> dict[str, bool]:
    """watch()'s four switches from the names of the kinds to record."""
    chosen = list(RECORD_CHOICES) if record is None else [record] if isinstance(record, str) else list(record)
    unknown = [kind for kind in chosen if kind not in RECORD_CHOICES]
    if unknown:
        raise ValueError(f"record: unknown kind {unknown[0]!r}; choose from {', '.join(RECORD_CHOICES)}.")
    if not chosen:
        raise ValueError(f"record: pick at least one of {', '.join(RECORD_CHOICES)}.")
    return {switch: label in chosen for label, switch in RECORD_CHOICES.items()}


def _int(value: Any, name: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}.")
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


def run_table(root: str) -> tuple[pd.DataFrame, list[str], str]:
    """The runs under ``root``: a table, the paths for a dropdown and a message."""
    from workbench.instrument import list_runs

    try:
        runs = list_runs(root or "runs")
    except FileNotFoundError as exc:
        return pd.DataFrame(), [], str(exc)
    shown = runs.drop(columns=["path"])
    shown["start_time"] = runs.start_time.dt.strftime("%Y-%m-%d %H:%M:%S UTC")  # (not to the nanosecond)
    return shown, list(runs.path), f"{len(runs)} run(s) under `{root}`."


def replay(path: str | None) -> tuple[Run | None, str]:
    """Open a stored run; returns it (or None) and a message with its metadata."""
    if not path:
        return None, "Pick a run."
    try:
        run = load_run(path)
    except RunError as exc:
        return None, f"**Cannot open:** {exc}"
    m = run.metadata
    facts = ", ".join(f"{k}: `{m[k]}`" for k in ("experiment", "model", "seed", "status") if k in m)
    return run, f"**{run.name}** - {facts} - {len(run.steps)} steps stored"


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
    series, note = stat_series(rows, kind, stat, pattern)
    # no rows: no plot (None), not an empty frame, which the page draws with the last legend it had
    return metrics_long(metrics), None if series.empty else series, note, latest_table(rows), anomaly_table(rows)


def layout():
    """Place the Experiments and Runs tabs' components; call inside ``gr.Tabs``."""
    import gradio as gr

    names = list_experiments()
    c: dict[str, Any] = {}
    with gr.Tab("Experiments", id="experiments"):
        with gr.Row():
            with gr.Column(scale=1, min_width=260):
                c["experiment"] = gr.Radio(names, value=names[0], label="Experiment", elem_id="experiment-list")
                c["seed"] = gr.Number(0, label="seed", precision=0, elem_id="run-seed", interactive=True)
                c["device"] = gr.Dropdown(devices(), value="cpu", label="device", elem_id="run-device",
                                          interactive=True)
                c["steps"] = gr.Number(200, label="steps", precision=0, elem_id="run-steps", interactive=True)
                c["every"] = gr.Number(1, label="record every Nth step", precision=0, elem_id="run-every", interactive=True)
                c["modules"] = gr.Textbox("*", label="watch modules (globs, comma separated)", elem_id="run-modules", interactive=True)
                c["record"] = gr.CheckboxGroup(list(RECORD_CHOICES), value=list(RECORD_CHOICES), label="record",
                                               elem_id="run-record", interactive=True)
                c["histograms"] = gr.Checkbox(False, label="histograms", elem_id="run-histograms", interactive=True)
                c["store"] = gr.Textbox("", label="record to run directory (optional)", placeholder="runs/my-run",
                                        elem_id="run-store", interactive=True)
            with gr.Column(scale=3):
                c["overview"] = gr.Markdown(experiment_overview(names[0]), elem_id="experiment-overview")
                c["form"] = gr.Column()
                c["status"] = gr.Markdown(elem_id="run-status")
                _plots(c, "live")
        c["timer"] = gr.Timer(1.0, active=False)
    with gr.Tab("Runs", id="runs"):
        with gr.Row():
            c["root"] = gr.Textbox("runs", label="runs directory", elem_id="runs-root", scale=3)
            c["refresh"] = gr.Button("List runs", elem_id="runs-refresh", scale=1)
        c["runs_message"] = gr.Markdown(elem_id="runs-message")
        c["runs_table"] = gr.Dataframe(interactive=False, label="Runs", elem_id="runs-table")
        c["run_path"] = gr.Dropdown([], label="run", elem_id="run-path", allow_custom_value=True)
        c["run_message"] = gr.Markdown(elem_id="run-message")
        _plots(c, "replay")
    c["live_state"] = gr.State(None, delete_callback=lambda live: live.stop() if live is not None else None)
    c["run_state"] = gr.State(None)
    return c


def wire(c: dict) -> None:
    import gradio as gr

    from workbench.ui.model_browser import widget

    c["experiment"].change(experiment_overview, c["experiment"], c["overview"])

    with c["form"]:
        @gr.render(inputs=c["experiment"])
        def render_form(name):
            fields = experiment_fields(name)
            widgets = [widget(f, key=f"exp:{name}:{f.label}") for f in fields]
            labels = [f.label for f in fields]
            with gr.Row():
                start = gr.Button("Start", variant="primary", elem_id="run-start")
                stop = gr.Button("Stop", elem_id="run-stop")

            def on_start(live, exp_name, seed, device, steps, every, histograms, modules, record, store, *values):
                if live is not None and live.running:
                    return live, live.status() + "\n\n_Stop the running experiment first._", gr.Timer(active=True)
                new, message = start_run(exp_name, dict(zip(labels, values)), seed, steps, every, histograms,
                                         modules, store, device, record)
                return (new or live), message, gr.Timer(active=new is not None)

            start.click(on_start, [c["live_state"], c["experiment"], c["seed"], c["device"], c["steps"], c["every"],
                                   c["histograms"], c["modules"], c["record"], c["store"], *widgets],
                        [c["live_state"], c["status"], c["timer"]])

            def on_stop(live):
                if live is None:
                    return "Nothing is running."
                live.stop()
                return live.status()

            stop.click(on_stop, c["live_state"], c["status"])

    live_inputs = [c["live_state"], c["live_kind"], c["live_stat"], c["live_pattern"]]
    live_outputs = [c["status"], c["live_metrics"], c["live_series"], c["live_note"], c["live_latest"],
                    c["live_anomalies"], c["timer"]]

    def on_tick(live, kind, stat, pattern):
        if live is None:
            return "", *_views(pd.DataFrame(), pd.DataFrame(), kind, stat, pattern), gr.Timer(active=False)
        rows, metrics = live.frames()
        # one last refresh after the run ends, then the timer stops
        return live.status(), *_views(rows, metrics, kind, stat, pattern), gr.Timer(active=live.running)

    c["timer"].tick(on_tick, live_inputs, live_outputs)
    for control in ("live_kind", "live_stat", "live_pattern"):
        c[control].change(on_tick, live_inputs, live_outputs)

    def on_list(root):
        table, paths, message = run_table(root)
        return table, gr.Dropdown(choices=paths, value=paths[0] if paths else None), message

    c["refresh"].click(on_list, c["root"], [c["runs_table"], c["run_path"], c["runs_message"]])

    replay_inputs = [c["run_state"], c["replay_kind"], c["replay_stat"], c["replay_pattern"]]
    replay_outputs = [c["replay_metrics"], c["replay_series"], c["replay_note"], c["replay_latest"],
                      c["replay_anomalies"]]

    def draw(run, kind, stat, pattern):
        if run is None:
            return _views(pd.DataFrame(), pd.DataFrame(), kind, stat, pattern)
        return _views(run.to_pandas(), run.metrics(), kind, stat, pattern)

    def on_pick(path, kind, stat, pattern):
        run, message = replay(path)
        return run, message, *draw(run, kind, stat, pattern)

    c["run_path"].change(on_pick, [c["run_path"], c["replay_kind"], c["replay_stat"], c["replay_pattern"]],
                         [c["run_state"], c["run_message"], *replay_outputs])
    for control in ("replay_kind", "replay_stat", "replay_pattern"):
        c[control].change(draw, replay_inputs, replay_outputs)
