"""Stored runs in the app: list, open (replay), compare and export the runs under the runs root.

A stored run is read once into a :class:`~workbench.ui.views.RunView` (:class:`ViewCache`, shared
by the app's pages) and drawn as a live one is (:mod:`workbench.ui.run_page`).
"""

from __future__ import annotations

import numbers
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.instrument import KINDS, Run, RunError
from workbench.ui import figures
from workbench.ui.intervention_menu import INTERVENTION_COLUMNS, INTERVENTION_METRIC
from workbench.ui.run_page import DEFAULT_SITES, STATISTICS, check_choice, parse_smoothing, picked_names
from workbench.ui.runs import NAME_JOINT, PathRefused, RunsRoot, breakable, name_breaks, shown
from workbench.ui.views import RunView

__all__ = ["EXPORT_FORMATS", "NO_COMPARISON", "RUNS_TABLE_WIDTHS", "RUNS_TABLE_DATATYPES", "run_table", "shown_runs",
           "replay", "run_facts", "stored_header", "ViewCache",
           "compare_runs", "compare_page", "COMPARED_FIGURES", "export_run", "stored_interventions"]


EXPORT_FORMATS = ("CSV", "Parquet", "TensorBoard")


def run_table(root: RunsRoot, sub: Any = "") -> tuple[pd.DataFrame, list[str], str]:
    """The stored runs under the root (or a sub-directory of it): a table, their names and a message."""
    return root.list(sub)


#: The Runs table's column widths (run, status, steps, start_time, experiment, model, seed, MB): in an 800 px
#: window (a table ~700 px wide, its text 12 px there: run_tabs.CSS) every column fits with no sideways scroll, each
#: holding its longest word on a line - a status (interrupted), steps and seeds up to six digits, the short start
#: time (11-29 12:07, on one line), an experiment's or a registered model's name broken after an underscore
#: (efficientzero_ / dynamics), a model's class name also before an upper-case letter (Dynamics / Network) - and a
#: run's name, broken after a '/', '-', '_' or '.', takes the rest.
RUNS_TABLE_WIDTHS = ["17.5%", "13.5%", "8%", "13%", "16.5%", "16.5%", "8%", "7%"]
#: The Runs table's cells a page shows as HTML (names that may break, :func:`shown_runs`).
RUNS_TABLE_DATATYPES = ["html", "str", "number", "str", "html", "html", "number", "number"]
#: Where a model's name may break over two lines: where a run's or an experiment's name may (runs.name_breaks: a
#: registered model's name, efficientzero_ / dynamics, or one given in a watch's metadata), and before an upper-case
#: letter that follows a lower-case one (a class name, Dynamics / Network).
_MODEL_JOINT = re.compile(f"{NAME_JOINT.pattern}|(?<=[a-z])(?=[A-Z])")
#: The start time as the table shows it ('11-29 12:07', UTC): the whole one is in the run's header.
_SHORT_TIME = re.compile(r"\d{4}-(\d\d-\d\d \d\d:\d\d):\d\d UTC")


def shown_runs(table: pd.DataFrame) -> Any:
    """The Runs table (:func:`run_table`) as a page shows it: a pandas ``Styler`` whose start times are short
    ('11-29 12:07', UTC) and whose run, experiment and model names may break over two lines between their parts,
    in the narrow columns of :data:`RUNS_TABLE_WIDTHS`. Only how it is shown changes: the cells' values (what a
    click on a row reads, what a copy of the table takes) are as they were. An empty table is returned as it is."""
    if table.empty:
        return table

    def model(name: Any) -> str:
        return breakable(name, _MODEL_JOINT)

    def short(text: Any) -> str:
        match = _SHORT_TIME.fullmatch(str(text))
        return match[1] if match else str(text)

    def seed(value: Any) -> str:  # (a whole number as one: '3', not '3.000000'; 2.5 stays 2.5)
        whole = isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())
        return str(int(value)) if whole else str(value)

    # a run recorded by workbench.watch() has no experiment, nor seed: an empty cell, not "nan"
    return table.style.format({"run": name_breaks, "experiment": name_breaks, "model": model, "start_time": short,
                               "seed": seed, "MB": "{:.1f}"}, na_rep="")


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
    try:
        steps = len(run.steps)
    except RunError as exc:
        return None, f"**Cannot open:** {exc}"
    status = run.metadata.get("status")
    facts = ", ".join(filter(None, [run_facts(run), f"status: `{status}`" if status is not None else ""]))
    return run, f"**{root.name_of(run.path)}** - {facts} - {steps} steps stored"


def run_facts(run: Run) -> str:
    """What a stored run ran, as its metadata says: experiment, model and seed (those it records), when it
    started, whole (the Runs table shows it short), and, for a run started in the app from a checkpoint or as
    the continuation of another run, the checkpoint's file or the run it continues (a replay of a run whose
    steps start at 201 says why)."""
    m = run.metadata
    facts = [f"{k}: `{m[k]}`" for k in ("experiment", "model", "seed") if k in m]
    if isinstance(m.get("start_time"), (int, float)):
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(m["start_time"]))
        facts.append(f"started: `{started}`")
    for key, said in (("initial_weights", "from the weights"), ("continues", "continues")):
        if isinstance(m.get(key), str) and m[key]:
            value = m[key].replace("`", "'")  # (inside a code span)
            facts.append(f"{said}: `{value}`")
    return ", ".join(facts)


def stored_header(view: RunView, run: Run, interventions: pd.DataFrame) -> str:
    """A stored run's page header: the views' (its name, status, step of total), then what it ran
    (:func:`run_facts`), the interventions shaded over its figures, and, read while it is still being
    recorded, when it was read. (The line :func:`replay` gives, which says most of it too, is for the
    page while the views are read.)"""
    header = figures.header_markdown(view)
    facts = run_facts(run)
    if facts:
        header += f"\n\n{facts}"
    if len(interventions):  # (their bands are over the figures)
        header += "\n\nInterventions: " + "; ".join(
            f"{row.id} **{row.intervention}** at `{row.site}`, steps {row['from step']}-{row['to step']}"
            for _, row in interventions.iterrows())
    if run.status == "running":  # (the page draws what was stored when it read it: nothing redraws it)
        header += (f"\n\n_Read at {time.strftime('%H:%M:%S')} while still being recorded: the views show the "
                   "steps stored by then; **List runs** reads it again._")
    return header



class ViewCache:
    """The views of stored runs a page opened, by run name (bounded; a run that grew since, or was recorded
    again at its path, is read again). Owned by the app (:func:`wire`), shared by its pages: a stored run is
    read once."""

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
            # (a run recorded again at its path, as many steps and ended alike, is another run: its start time tells)
            key = (len(run.steps), run.status, run.metadata.get("start_time"))
            with self._lock:
                cached = self._views.get(pick)
            if cached is not None and cached[0] == key:
                return cached[1], run, message
            view = RunView.from_run(run)
        except RunError as exc:
            return None, None, f"**Cannot read:** {exc}"
        view.label = self.root.name_of(run.path)
        # the steps it was to take (a run started in the app says so), else, ended well, the steps it took (none
        # taken: no total, where none was asked)
        total = run.metadata.get("total_steps")
        view.total = (total if isinstance(total, int) else view.last_step if run.status == "finished" and view.steps_fed
                      else None)
        with self._lock:
            self._views.pop(pick, None)
            self._views[pick] = (key, view)
            while len(self._views) > self.size:
                self._views.pop(next(iter(self._views)))
        return view, run, message


NO_COMPARISON = "Pick two or more runs to compare."
#: The statuses of a run still going (a live run's, or a stored run's while its writer is at work).
LIVE_STATUSES = ("running", "paused", "stopping")


def compare_runs(cache: ViewCache, picks: Any, kind: str, statistic: str, site: Any,
                 smoothing: Any = 0.0, log_y: bool | None | tuple[bool | None, bool | None] = False,
                 colors: dict[str, str] | None = None,
                 kept_site_log: bool | None | Callable[[str], bool | None] = None,
                 kept_metrics_log: Mapping[str, bool] | None = None
                 ) -> tuple[dict | None, dict | None, list[str], str | None, str]:
    """Overlay two or more stored runs: their metrics (a panel per metric, a line per run) and one
    call site's statistic. Returns the two figures (``None`` when there is nothing to compare: fewer
    than two runs that open, or a bad choice), the sites to choose from (those of every run's
    ``kind``, in the first run's forward order), the site drawn and a message, which names the runs
    without rows of ``kind``: an ended run "recorded no" rows, one still going (:data:`LIVE_STATUSES`) has
    "no ... rows yet", or "in its steps so far" once it has steps. ``colors``: the runs' colours in the last
    drawing (:func:`figures.steady_colors`), which the runs still compared keep. ``log_y``: both figures' scale,
    or a pair ``(the metrics', the call site's)`` (a box per figure: :func:`compare_page`); None: each figure
    chooses, as a run page's do: the call site's figure log where one run's line dwarfs the others
    (:func:`figures.dwarfed`), each metrics panel log where a line's spike flattens the rest, unless
    ``kept_site_log`` and ``kept_metrics_log`` (metric -> log) say the scales they chose before and keep
    (:func:`figures.keep_scale`, :func:`figures.keep_scales`; a log one while every value is positive,
    :func:`figures.chosen_scale`). :func:`compare_page` keeps them. ``kept_site_log`` may be a function of the
    site drawn (which is not the site asked where that is None or not among the choices): a scale is kept for the
    site it was chosen on."""
    metrics_log, site_log = log_y if isinstance(log_y, tuple) else (log_y, log_y)
    try:
        chosen = picked_names(picks, "runs to compare") or []
        check_choice("kind", kind, KINDS)
        check_choice("statistic", statistic, STATISTICS)
        smoothing = parse_smoothing(smoothing)
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
    metrics = figures.compare_metrics_figure(views, names, smoothing,
                                             None if metrics_log is None else bool(metrics_log), colors=colors,
                                             kept_log=kept_metrics_log)
    # (a run still going may have its rows yet to come: said so, not that it recorded none)
    live = {name for name, view in views.items() if view.status in LIVE_STATUSES}
    # (a run recorded without the kind will have none: said so, with the option that is off)
    without = {name: view.unrecorded[kind] for name, view in views.items() if kind in view.unrecorded}
    if callable(kept_site_log):
        kept_site_log = kept_site_log(site) if site is not None else None
    if site is not None:
        site_fig = figures.compare_site_figure(views, kind, statistic, site,
                                               None if site_log is None else bool(site_log), colors, kept_site_log)
    elif len(without) == len(views):
        options = sorted(set(without.values()))
        site_fig = figures.empty_figure(f"None of these runs records {kind} rows ({', '.join(options)}=False).")
    else:
        going = live.difference(without)
        site_fig = figures.empty_figure(
            f"None of these runs recorded {kind} rows." if not going else
            f"None of these runs has {kind} rows in the steps recorded so far." if any(
                views[n].steps_fed for n in going) else f"None of these runs has {kind} rows yet.")
    text = f"Comparing {', '.join(f'`{n}`' for n in views)}."
    # (why a run failed, as its header says it: the short message, not the traceback; a run page folds that)
    failures = {n: figures.error_line(view.error).replace("`", "'") for n, view in views.items()
                if view.status == "failed" and view.error}  # (inside a code span)
    text += "".join(f" `{n}` failed: `{message}`." for n, message in failures.items())
    text += _without_metrics(views, live)
    lacking = [name for name in views if name not in having]
    if lacking and (having or len(without) < len(views)):  # (each run without rows, unless none records them)
        unrecorded = [n for n in lacking if n in without]
        ended = [n for n in lacking if n not in live and n not in without]
        waiting = [n for n in lacking if n in live and n not in without]
        said = []
        if unrecorded:
            one, going = len(unrecorded) == 1, set(unrecorded) <= live
            verb = ("is" if one else "are") if going else ("was" if one else "were")
            said.append(f"{', '.join(f'`{n}`' for n in unrecorded)} {verb} recorded without {kind} rows "
                        f"({without[unrecorded[0]]}=False)")
        # (one that stopped before its first recorded step: which step that was, not that it recorded none)
        early = {n: views[n].first_recorded_step() for n in ended}
        if [n for n in ended if early[n] is None]:
            said.append(f"{', '.join(f'`{n}`' for n in ended if early[n] is None)} recorded no {kind} rows")
        said.extend(f"`{n}` stopped before its first recorded step (step {early[n]} with "
                    f"every={views[n].schedule[0]})" for n in ended if early[n] is not None)
        # (a run going on whose steps so far had none, a model run forward only: not "yet", RunView.no_rows)
        for group, when in (([n for n in waiting if views[n].steps_fed], "in their steps so far"),
                            ([n for n in waiting if not views[n].steps_fed], "yet")):
            if group:
                said.append(f"{', '.join(f'`{n}`' for n in group)} {'has' if len(group) == 1 else 'have'} "
                            f"no {kind} rows {when.replace('their', 'its') if len(group) == 1 else when}")
        text += f" {'; '.join(said)}" + (f": the sites of `{having[0]}` are listed." if having else ".")
    elif not common and len(having) > 1:
        text += f" They share no {kind} call site (different models?): the sites of `{having[0]}` are listed."
    text += _coinciding(views, names, kind, statistic, site)
    return metrics, site_fig, choices, site, (text + (" " + note if note else "")).strip()


def _drawn(view: RunView, names: list[str], kind: str, statistic: str, site: str | None) -> tuple | None:
    """What a comparison draws of ``view``: its metrics' and the site's values by step (None: nothing)."""
    metrics = view.metrics_frame(names)[["metric", "step", "value"]]
    series = (view.site_series(kind, statistic, [site])[["step", "value"]]
              if site is not None and site in view.site_order(kind) else None)
    if metrics.empty and (series is None or series.empty):
        return None
    # (as text: NaN equals NaN there, as two runs that diverged alike draw alike)
    return metrics.to_csv(index=False), "" if series is None else series.to_csv(index=False)


def _coinciding(views: dict[str, RunView], names: list[str], kind: str, statistic: str, site: str | None) -> str:
    """A note naming the runs whose lines coincide (the same values at the same steps, in every metric and at the
    site): the last one drawn hides the others, which read as missing (runs of the same settings and seed)."""
    groups: dict[tuple, list[str]] = {}
    for name, view in views.items():
        drawn = _drawn(view, names, kind, statistic, site)
        if drawn is not None:
            groups.setdefault(drawn, []).append(name)
    same = [group for group in groups.values() if len(group) > 1]
    return "".join(f" {', '.join(f'`{n}`' for n in group[:-1])} and `{group[-1]}` draw identical lines (the same "
                   f"settings and seed?): `{group[-1]}`'s line hides theirs." for group in same)


#: The figures of a comparison, each with a log y box of its own: its metrics (a panel per metric) and a call site's.
COMPARED_FIGURES = ("metrics", "site")


def compare_page(cache: ViewCache, picks: Any, kind: str, statistic: str, site: Any, log_y: Any,
                 colors: dict[str, str] | None, auto_log: Any, kept: Any, change: Mapping[str, bool] | None = None,
                 smoothing: Any = 0.0) -> tuple:
    """One drawing of a comparison (:func:`compare_runs`), with what its page keeps between drawings: the Runs tab's
    comparison and the notebook's ``Compare`` draw by it alike.

    Each figure has a log y box of its own (:data:`COMPARED_FIGURES`: the metrics', the call site's). Until the user
    sets a figure's box (its ``auto_log``), the figure chooses its scale as a run page's do (the call site's figure,
    and each metrics panel) and keeps it once settled (each run's line 5 steps long, or more:
    :func:`figures.keep_scale`), for these runs as recorded (a run recorded again at its path chooses anew) and, the
    call site's, kind, statistic and site drawn (not the site asked, which is None until the dropdown is set); its
    box is ticked while it draws a log y (:func:`figures.drawn_log`: a metrics panel's is enough). Once set, the box
    is that figure's scale (every metrics panel's), the other figure's untouched.

    Args:
        cache: the stored runs' views (anything whose ``get(name)`` gives ``(view, run, message)``).
        picks: the runs to compare; kind, statistic, site: the call site's figure's.
        log_y: the boxes' values, ``(the metrics', the call site's)``.
        colors: run -> its colour in the last drawing (a run still compared keeps it).
        auto_log: whether each figure chooses its scale, ``(the metrics', the call site's)`` (False once the user
            set its box; True at first).
        kept: the scales kept (what this returned last; None at first).
        change: figure (``metrics``, ``site``) -> whether it chooses its scale from here (True: another kind,
            statistic or site for the call site's; False: the user set its box); a figure not named: as before.
        smoothing: the metrics' smoothing, in [0, 1).

    Returns:
        ``(metrics figure, site figure, site choices, site, message, colors, boxes, auto_log, kept)``: the figures
        None where nothing is compared; ``boxes`` the values to show in the boxes, ``(the metrics', the call
        site's)`` (None: leave that box as it is); ``auto_log`` as given, changed by ``change``.
    """
    runs = (list(dict.fromkeys(p for p in picks or () if isinstance(p, str))) if isinstance(picks, (list, tuple))
            else [])
    colors = figures.steady_colors(runs, colors)
    auto = dict(zip(COMPARED_FIGURES, _per_figure(auto_log, "auto_log")))
    auto = {name: choosing is not False for name, choosing in auto.items()}
    auto.update({name: bool(choosing) for name, choosing in (change or {}).items() if name in auto})
    metrics_box, site_box = _per_figure(log_y, "log_y")
    kept = dict(kept) if isinstance(kept, dict) else {}
    # (which recording of each path: a run recorded again there is another one)
    recordings = [[name, getattr(cache.get(name)[0], "started", None)] for name in runs] if any(auto.values()) else []

    # the site figure's scale is kept for the site drawn, looked up and stored alike: the site asked is another
    # where it is None (the dropdown not yet set) or not among the choices
    def kept_for(drawn: str) -> bool | None:
        return figures.kept_scale(kept.get("site"), [recordings, kind, statistic, drawn])

    metrics, site_fig, choices, site, message = compare_runs(
        cache, picks, kind, statistic, site, smoothing,
        (None if auto["metrics"] else metrics_box, None if auto["site"] else site_box), colors,
        kept_for if auto["site"] else None,
        figures.kept_scales(kept.get("metrics"), [recordings]) if auto["metrics"] else None)
    boxes: list[bool | None] = [None, None]
    if metrics is not None:
        # (settled once each run has its line: a run yet to record its first rows may dwarf the others)
        if auto["metrics"]:
            boxes[0] = figures.drawn_log(metrics)
            kept["metrics"] = figures.keep_scales(kept.get("metrics"), [recordings], metrics, lines=len(runs))
        if auto["site"]:
            boxes[1] = figures.drawn_log(site_fig)
            kept["site"] = figures.keep_scale(kept.get("site"), [recordings, kind, statistic, site], site_fig,
                                              lines=len(runs))
    return (metrics, site_fig, choices, site, message, colors, tuple(boxes),
            tuple(auto[name] for name in COMPARED_FIGURES), kept)


def _per_figure(value: Any, what: str) -> tuple[Any, Any]:
    """A comparison's pair ``(the metrics', the call site's)``; one value (not a pair): both figures'."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(COMPARED_FIGURES):
            raise ValueError(f"{what} must be one value or a pair (the metrics', the call site's), got {value!r}.")
        return value[0], value[1]
    return value, value


def _without_metrics(views: dict[str, RunView], live: set[str]) -> str:
    """A sentence naming the runs compared that have no metrics beside runs that have some (the legend
    left them out without a word): those that ended recorded none, those going on have none in their steps
    so far; one before its first step is not named (its metrics may yet come)."""
    def has_metrics(view: RunView) -> bool:
        return any(not m.startswith(INTERVENTION_METRIC) for m in view.metric_names())

    none = [name for name, view in views.items() if not has_metrics(view)]
    if not none or len(none) == len(views):  # (none of them: the figure says so)
        return ""
    ended = [n for n in none if n not in live]
    going = [n for n in none if n in live and views[n].steps_fed]
    said = ([f"{', '.join(f'`{n}`' for n in ended)} recorded no metrics"] if ended else []) + (
        [f"{', '.join(f'`{n}`' for n in going)} {'has' if len(going) == 1 else 'have'} no metrics in "
         f"{'its' if len(going) == 1 else 'their'} steps so far"] if going else [])
    return f" {'; '.join(said)} (a watch records the metrics given to w.step())." if said else ""


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
            logdir.mkdir(exist_ok=True)  # (made first: a run named with a dot, lr0.001, names a directory still)
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


def stored_interventions(run: Run | None) -> pd.DataFrame:
    """The interventions a stored run records (empty when it has none, or cannot be read)."""
    if run is None:
        return pd.DataFrame(columns=INTERVENTION_COLUMNS)
    try:
        return run.interventions()[INTERVENTION_COLUMNS]  # (status: recorded, or failed at step N: ...)
    except (RunError, OSError, ValueError):
        return pd.DataFrame(columns=INTERVENTION_COLUMNS)
