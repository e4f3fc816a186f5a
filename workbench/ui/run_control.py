"""What a page does to the app's live runs: list them, attach and detach, pause, resume, stop, intervene.

A page holds only the id of the run it is attached to; the runs are the
:class:`~workbench.ui.runs.RunManager`'s. Each handler is a plain function of the manager and that
id, returning what the page shows (a message, a table, which buttons apply); none raises for bad
input.
"""

from __future__ import annotations

import fnmatch
import time
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.instrument import KINDS
from workbench.ui.intervention_menu import INTERVENTION_COLUMNS, intervention_sites
from workbench.ui.run_page import DEFAULT_SITES, STATISTICS, check_choice, live_header
from workbench.ui.runs import RunManager, name_breaks, shown
from workbench.ui.views import RunView

if TYPE_CHECKING:
    from workbench.ui.live_run import LiveRun

__all__ = ["RUN_COLUMNS", "RUN_WIDTHS", "RUN_DATATYPES", "runs_frame", "shown_runs_frame", "runs_note", "run_choices",
           "find_run", "attach", "detach", "stop_run", "pause_run", "run_controls", "run_views", "apply_intervention",
           "remove_applied", "intervention_panel"]


# A page holds only the id of the run it is attached to; the runs are the manager's.
#: How a run of the app ends (:attr:`~workbench.ui.live_run.LiveRun.outcome`), in the runs' note's order.
OUTCOMES = ("finished", "stopped", "failed")
RUN_COLUMNS = ["id", "experiment", "seed", "started", "status", "step", "of", "recording to"]
#: The table's column widths: in an 800 px window (a table ~700 px wide) each column holds its longest word on a
#: line - an id, an experiment broken after its underscore (efficientzero_ / dynamics), a seed of five digits, the
#: time started, a status (stopping), steps of six digits - and the run name it records to, broken between its
#: parts (:func:`~workbench.ui.runs.name_breaks`), takes the rest.
RUN_WIDTHS = ["8%", "18.5%", "8%", "11.5%", "11.5%", "9%", "9%", "24.5%"]
#: Its cells' datatypes: the names are HTML (where they may break).
RUN_DATATYPES = ["str", "html", "number", "str", "str", "number", "number", "html"]


def runs_frame(manager: RunManager) -> pd.DataFrame:
    """The runs in this app (in progress first, then finished, newest first), one row each."""
    rows = [{"id": r.id, "experiment": r.name, "seed": r.seed,
             "started": time.strftime("%H:%M:%S", time.localtime(r.started)), "status": r.state,
             "step": r.experiment.step_count, "of": r.total,
             "recording to": _recording_to(manager, r)} for r in manager.runs()]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def _recording_to(manager: RunManager, run: Any) -> str:
    """The run name ``run`` records to ("" for none), ``(replaced)`` after it where another run replaced it there
    (:attr:`~workbench.ui.live_run.LiveRun.replaced`)."""
    if run.watch.store is None:
        return ""
    return manager.root.name_of(run.watch.store.path) + (" (replaced)" if run.replaced else "")


def shown_runs_frame(table: pd.DataFrame) -> Any:
    """The runs table (:func:`runs_frame`) as a page shows it: a pandas ``Styler`` whose experiment and run names
    may break over two lines between their parts, in the columns of :data:`RUN_WIDTHS` (an empty table as it
    is). The cells' values are the table's own."""
    if table.empty:
        return table
    return table.style.format({"experiment": name_breaks, "recording to": name_breaks})


def runs_note(manager: RunManager) -> str:
    runs = manager.runs()
    if not runs:
        text = "No runs in this app yet: start one above."
    else:
        going = sum(r.running for r in runs)
        ended = [sum(r.outcome == outcome for r in runs) for outcome in OUTCOMES]
        text = f"{going} in progress" + "".join(f", {n} {outcome}" for n, outcome in zip(ended, OUTCOMES) if n) + "."
    if manager.dropped:
        text += (f" {manager.dropped} older finished run(s) were dropped from memory (the app keeps the last "
                 f"{manager.keep_finished}); those recorded to a run name are in the Runs tab.")
    return text


def run_choices(manager: RunManager) -> list[tuple[str, str]]:
    """``(label, id)`` for a dropdown of the runs in this app."""
    return [(f"{r.label} ({r.state})", r.id) for r in manager.runs()]


def find_run(manager: RunManager, run_id: Any) -> tuple[LiveRun | None, str]:
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
    run, message = find_run(manager, run_id)
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
    run, message = find_run(manager, run_id)
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
    run, message = find_run(manager, run_id)
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
    """Which of the run page's Pause, Resume, Stop, its intervention panel's Apply and Remove, and
    Continue apply to its run now (a page enables those and greys out or hides the others): none before
    a run is attached; Pause and Stop while it runs, Resume and Stop while it is paused, Stop alone while
    it finishes the step it was stopped at; Apply while it runs or is paused, Remove then while an
    intervention is on; Continue once it finished or was stopped (:func:`~workbench.ui.live_run.continue_run`)."""
    run = manager.get(run_id) if run_id else None
    state = run.state if run is not None else None
    going = state in ("running", "paused")
    return {"pause": state == "running", "resume": state == "paused", "stop": going or state == "stopping",
            "apply": going, "remove": going and any(record.status == "on" for record in run.interventions),
            "continue": state in ("finished", "stopped")}


def run_views(manager: RunManager, run_id: Any, kind: str, stat: str, pattern: str = "*") -> tuple:
    """A page's run as frames, from its view layer (what scripts and tests read; the page draws
    :func:`draw_page`): header (Markdown, with inline HTML that keeps its parts whole), metrics, one
    statistic of the sites matching ``pattern`` (a glob over site names; at most the
    :data:`DEFAULT_SITES` the view picks when all match), a note, the
    last step of ``kind``, the recent NaN/Inf rows, and whether the run goes on."""
    run, message = find_run(manager, run_id) if run_id else (None, "")
    if run is None:
        view = RunView()
        header = message
    else:
        view, header = run.view, live_header(run)
    try:
        check_choice("kind", kind, KINDS)
        check_choice("statistic", stat, STATISTICS)
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



def apply_intervention(manager: RunManager, run_id: Any, site: Any, op: Any, units: Any = "", k: Any = None,
                       sigma: Any = None, low: Any = None, high: Any = None, timeout: float = 30.0) -> str:
    """A page's "Apply": the intervention goes into the run between two steps; returns a message. Never raises."""
    run, message = find_run(manager, run_id) if run_id else (None, "Not attached to a run: start one or attach "
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
    run, message = find_run(manager, run_id) if run_id else (None, "Not attached to a run.")
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
