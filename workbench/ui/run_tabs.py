"""The Experiments and Runs tabs of the Gradio app: their components (:func:`layout`) and events (:func:`wire`).

The handlers they call are plain functions, tested without a browser: :mod:`workbench.ui.live_run`
(the run form, starting a run), :mod:`workbench.ui.run_control` (attach, pause, stop, intervene),
:mod:`workbench.ui.run_page` (drawing a run's views), :mod:`workbench.ui.stored_runs` (replay,
compare, export), :mod:`workbench.ui.weights` (an uploaded checkpoint). The Jupyter dashboard
(``workbench.ui.notebook.Dashboard``) draws the same views.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pandas as pd

from workbench.experiments import list_experiments
from workbench.instrument import KINDS
from workbench.instrument.schema import MAX_BINS
from workbench.ui import figures
from workbench.ui import findings as findings_view
from workbench.ui.forms import FormField, pop_up_text
from workbench.ui.intervention_menu import (INTERVENTION_COLUMNS, INTERVENTION_DATATYPES, INTERVENTION_WIDTHS,
                                            INTERVENTIONS, shown_interventions, site_choices)
from workbench.ui.live_run import (DEFAULT_BINS, RECORD_CHOICES, continue_run, devices, experiment_fields,
                                   experiment_overview, start_run)
from workbench.ui.pages import PageHoldings, session_of
from workbench.ui.run_control import (RUN_COLUMNS, RUN_DATATYPES, RUN_WIDTHS, apply_intervention, attach, detach,
                                      find_run, intervention_panel, pause_run, remove_applied, run_choices,
                                      run_controls, runs_frame, runs_note, shown_runs_frame, stop_run)
from workbench.ui.run_page import (CONTROLS, IN_VIEW_ONLY, LATEST_COLUMNS, LATEST_DATATYPES, LATEST_WIDTHS, STATISTICS,
                                   PLOTS, VIEW_OUTPUTS, live_header, new_page_state, plot_data, redraw, skips,
                                   starting_plots)
from workbench.ui.runs import RUN_TABLE_COLUMNS, RunManager, RunsRoot
from workbench.ui.stored_runs import (EXPORT_FORMATS, NO_COMPARISON, RUNS_TABLE_DATATYPES, RUNS_TABLE_WIDTHS,
                                      ViewCache, compare_page, export_run, replay, run_table, shown_runs,
                                      stored_header, stored_interventions)
from workbench.ui.views import RunView
from workbench.ui.weights import TENSOR_COLUMNS, inspect_weights, outputs_html

logger = logging.getLogger(__name__)

__all__ = ["layout", "wire", "CSS", "PICK", "PICK_TITLES", "ALIGNED"]


#: The CSS class of every picker of a run or a call site (``elem_classes=[PICK]``): a name longer than its box
#: ends in an ellipsis before the arrow, a multiselect's chip too, and the whole name is the chip's or the box's
#: title (:data:`CSS`, :data:`PICK_TITLES`).
PICK = "wb-pick"
#: The CSS class of a row of fields whose labels (or notes under them) may take more lines in one field than in
#: another: its boxes still lie on one line, at the bottom of the fields (:data:`CSS`).
ALIGNED = "wb-aligned"
#: What a run page without a run says, in its header and its figures.
NO_RUN = "_No run on this page: start one (New run), or attach to one below._"
#: The least widths of the run page's picker of a run (a name of some 25 characters readable) and of its six buttons
#: (80 px each, with the gaps between them): the two side by side in the run page's column at 1400 px, the buttons
#: under the picker where the column is narrower than both (an 800 px window).
PICK_LEAST, BUTTONS_LEAST = 240, 6 * 80 + 5 * 16
#: The least width of the Runs tab's picker of the runs to compare: two runs' chips of some 20 characters side by side.
COMPARE_RUNS_LEAST = 360
#: Seconds between two looks of a page at the list of the app's runs (its own run is drawn every second).
LIST_SECONDS = 3.0


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
                                      allow_custom_value=True, elem_id=f"{p}-sites", elem_classes=[PICK])
        c[f"{p}_log_sites"] = gr.Checkbox(False, label="log y", scale=1, min_width=90, elem_id=f"{p}-log-sites")
    plot("series")
    c[f"{p}_site_note"] = gr.Markdown(elem_id=f"{p}-site-note")
    gr.Markdown("#### Distribution over time (the kind above)", elem_classes=["wb-section"])
    with gr.Row(equal_height=True):
        c[f"{p}_dist_site"] = gr.Dropdown([], value=None, label="call site with histograms", scale=2,
                                          allow_custom_value=True, elem_id=f"{p}-dist-site", elem_classes=[PICK])
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
    # (its columns as wide as fit the page, its numbers short: run_page.shown_latest, which each drawing sends;
    # its label names the section whose kind it follows: "above" it are the heatmap's kind and picker)
    c[f"{p}_latest"] = gr.Dataframe(pd.DataFrame(columns=LATEST_COLUMNS), column_widths=LATEST_WIDTHS,
                                    datatype=LATEST_DATATYPES, wrap=True, interactive=False,
                                    label="Last recorded step (the kind picked under Statistic per call site)",
                                    max_height=320, elem_id=f"{p}-latest", elem_classes=["wb-compact", "wb-latest"])
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
                                       elem_id="iv-site", elem_classes=[PICK])
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
                                         show_label=False, max_height=320, elem_id="iv-table", scale=4, wrap=True,
                                         column_widths=INTERVENTION_WIDTHS, datatype=INTERVENTION_DATATYPES)
            with gr.Column(scale=1, min_width=170):
                c["iv_on"] = gr.Dropdown([], value=None, label="on now", elem_id="iv-on", elem_classes=[PICK])
                c["iv_remove"] = gr.Button("Remove", variant="stop", elem_id="iv-remove", interactive=False)


def _hidden_while_empty(note: Any, table: Any) -> tuple:
    """A findings list for the page (``(note, table)``; either may be ``gr.skip()``): the table
    hidden while it has no row - the note above it says that nothing looks wrong."""
    return note, findings_view.page_table(table)  # (as the page shows it: findings.shown_findings)


#: The findings lists' height and column widths (finding, evidence: findings.SHOWN_COLUMNS): in an 800 px window
#: (a table ~700 px wide) the first holds each of its lines on a line - a severity with steps of three digits
#: (⚠ warning · steps 120–200), the longest finding's name (vanishing_gradients), a site up to 25 characters (a
#: longer one breaks after a dot or an underscore) - and the evidence, wrapped between words, takes the rest:
#: some 50 characters a line at 800 px, 90 at 1400 px.
FINDINGS_HEIGHT, FINDINGS_WIDTHS = 320, ["34%", "66%"]

#: The Runs table's height: the window's less RUNS_TABLE_ROOM px (its label above it, the run / export row under
#: it), so that scrolled to the table a user sees as many runs as the window holds and the row that exports one
#: with them (ten runs of two lines at 800 px high), never less than RUNS_TABLE_LEAST px (a short window). A table
#: of fewer runs is as tall as they are.
RUNS_TABLE_LEAST, RUNS_TABLE_ROOM = 260, 220

#: The plots of the live run page (run_page.IN_VIEW_ONLY) that the browser has in view, or within 200 px of
#: it (none in a hidden tab, or in another tab of the app): the last of a tick's inputs, replaced in the
#: browser before the tick is sent.
IN_VIEW = """(...values) => {
  const near = 200, bottom = window.innerHeight + near;
  const seen = document.hidden ? [] : %s.filter((name) => {
    const box = document.getElementById(`live-${name}`)?.getBoundingClientRect();
    return box !== undefined && box.height > 0 && box.bottom > -near && box.top < bottom;
  });
  return [...values.slice(0, -1), seen.join(",")];
}""" % json.dumps(list(IN_VIEW_ONLY))


def _in_view(value: Any) -> set[str] | None:
    """The views :data:`IN_VIEW` said are in view (None, all, where no browser said: a call from Python)."""
    return set(filter(None, value.split(","))) if isinstance(value, str) else None


#: The whole name of a run or a call site as the title (tooltip) of the picker's box or chip that shows it cut
#: short (:data:`PICK`), set as the pointer comes over it (Gradio's chips and boxes have no title of their own).
PICK_TITLES = """() => {
  if (window.workbenchPickTitles) return;
  window.workbenchPickTitles = true;
  document.addEventListener("mouseover", (event) => {
    const shown = event.target.closest?.(".%s .token > span, .%s input");
    const name = shown && (shown.tagName === "INPUT" ? shown.value : shown.textContent.trim());
    if (shown && shown.title !== name) shown.title = name;
  });
}""" % (PICK, PICK)

#: Scrolls the page to its run's header (run in the browser once a run starts).
SHOW_HEADER = "() => { document.getElementById('run-status')?.scrollIntoView({block: 'start'}); }"
CSS = f"""
/* a run's or call site's name longer than its picker's box (PICK) ends in an ellipsis, not under the box's
   arrow; a multiselect's chip too, on one line (it wrapped the name mid-word): PICK_TITLES titles it whole */
.{PICK} input {{ text-overflow: ellipsis; padding-right: 26px; }}  /* (the arrow begins 24 px in) */
.{PICK} .token {{ min-width: 0; max-width: 100%; }}
.{PICK} .token > span {{ overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }}
/* a row of fields (ALIGNED) puts each field's box at its bottom, its label and note at its top: a label that took two
   lines (record every Nth step, a note under depth) put its box lower than the others' */
.{ALIGNED} .block > .container {{ display: flex; flex-direction: column; height: 100%; }}
.{ALIGNED} .block > .container > input, .{ALIGNED} .block > .container > .wrap {{ margin-top: auto; }}
""" + """
.wb-anomaly h3 { color: #b91c1c; margin: 0; }
.wb-section h4 { margin: 6px 0 0 0; }
#run-status, #replay-header { min-height: 2em; }
/* the list of runs to attach to, opened, is wide enough for a run's name on a line (as narrow as the box, in an 800 px
   window it put each name over six lines, on top of the run's header) */
#live-pick .options { min-width: min(30em, 90vw); }
#live-pick .options li { min-width: 100%; }  /* (each option is as wide as the box too, by its own style) */
.wb-outputs p { margin: 4px 0; color: var(--block-label-text-color); font-size: var(--block-label-text-size); }
/* small tables of text (an uploaded checkpoint's outputs, the explorer's f' differences): rules between rows, no grid
   (Gradio's prose draws a box round each row too: a dark frame left and right of the table, and over it) */
.wb-outputs table, #explorer-curves-message table { border-collapse: collapse; font-family: var(--font-mono);
  font-size: 13px; }
.wb-outputs table, .wb-outputs tr, .wb-outputs th, .wb-outputs td, #explorer-curves-message table,
#explorer-curves-message tr, #explorer-curves-message th, #explorer-curves-message td { border: none; }
.wb-outputs th, .wb-outputs td, #explorer-curves-message th, #explorer-curves-message td { padding: 4px 14px 4px 0;
  text-align: left; border-bottom: 1px solid var(--border-color-primary); }
/* the app's tables are read-only (interactive=False), so none looks like a spreadsheet: no text cursor, and
   the cell clicked gets no editor's ring, white box or row/column/menu buttons (Gradio's, for editing) */
[role=grid][aria-readonly=true] .body-cell, [role=grid][aria-readonly=true] .body-cell * { cursor: default; }
[role=grid][aria-readonly=true] .body-cell.cell-selected { outline: none !important; box-shadow: none !important; }
[role=grid][aria-readonly=true] .body-cell.cell-selected .cell-wrap > span { box-shadow: none !important;
  background: transparent !important; }  /* (a text cell's span.text, an HTML cell's span: findings' sites) */
/* and the text of the cell clicked stays where it was (Gradio's editor stretched it, its text to the cell's top) */
[role=grid][aria-readonly=true] .body-cell.cell-solo .cell-wrap > span { position: static !important;
  min-height: 0 !important; padding: 0 !important; }
[role=grid][aria-readonly=true] .body-cell .cell-menu-button,
[role=grid][aria-readonly=true] .body-cell .selection-button { display: none !important; }
/* a click on a row of these opens it (a stored run, a finding): a hand, and the row under it lit */
#runs-table .body-cell, #runs-table .body-cell *, #live-findings .body-cell, #live-findings .body-cell *,
#replay-findings .body-cell, #replay-findings .body-cell * { cursor: pointer !important; }
#runs-table [role=row]:hover .body-cell, #live-findings [role=row]:hover .body-cell,
#replay-findings [role=row]:hover .body-cell { background: var(--table-row-focus); }
/* the cells of the Runs table, of a run page's last-step table and of the runs in this app a little closer (6 px
   each side, not 8): the Runs table's eight columns fit an 800 px window (stored_runs.RUNS_TABLE_WIDTHS), the
   last-step table's nine a run page at 1400 px (run_page.LATEST_WIDTHS), the runs' eight an 800 px window
   (run_control.RUN_WIDTHS) */
#runs-table .cell-wrap, .wb-compact .cell-wrap { padding-left: 6px !important; padding-right: 6px !important; }
/* in a window narrower than 1100 px the last-step table's text is a little smaller (12 px): its numbers (8 characters
   at most) and headers hold on a line in the narrower columns (run_page.LATEST_WIDTHS) */
@media (max-width: 1100px) { .wb-latest .cell-wrap { font-size: 12px; } }
/* and in a window narrower than 1000 px the Runs table's is too: its status (interrupted), experiment and model
   (efficientzero_) hold on a line in their columns, and a run's name has the rest (stored_runs.RUNS_TABLE_WIDTHS) */
@media (max-width: 1000px) { #runs-table .cell-wrap { font-size: 12px; } }
.wb-latest small { color: var(--body-text-color-subdued); }
/* a log y box keeps room for its label in a narrow window (squeezed by the pickers beside it, it clipped) */
#compare-log { min-width: 90px !important; flex-shrink: 0; }
#compare-log-metrics { min-width: 130px !important; flex-shrink: 0; }
/* a field's label that is one long name (flatten_output_size_for_reward_head, a checkbox's
   last_linear_layer_init_zero) goes on over the next line where it reaches the field's edge: it was cut off there,
   the parameter's name unreadable (a label with spaces still breaks between its words) */
[data-testid=block-info], .checkbox-container .label-text { overflow-wrap: anywhere; }
/* a red button greyed out (Stop with no run, Remove with no intervention) looks as the greyed-out others do */
button.stop:disabled { background: var(--button-secondary-background-fill) !important;
  border-color: var(--button-secondary-border-color) !important; color: var(--button-secondary-text-color) !important; }
""" + f"""
/* a heatmap of many call sites scrolls in a box of its own (figures.HEAT_BOX), its rows as tall as ever */
#live-heatmap, #replay-heatmap {{ max-height: {figures.HEAT_BOX}px; overflow-y: auto; }}
/* the Runs table grows with the window (RUNS_TABLE_ROOM); Gradio's max_height sets the least */
#runs-table .virtual-table-viewport {{
  max-height: max({RUNS_TABLE_LEAST}px, calc(100vh - {RUNS_TABLE_ROOM}px)) !important; }}
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
                    with gr.Row(elem_classes=[ALIGNED]):  # (a label on two lines beside one on a line)
                        c["every"] = gr.Number(1, label="record every Nth step", elem_id="run-every",
                                               interactive=True, min_width=80)
                        c["device"] = gr.Dropdown(devices(), value="cpu", label="device", elem_id="run-device",
                                                  interactive=True, min_width=80)
                    c["modules"] = gr.Textbox("*", label="watch modules (globs, comma separated)",
                                              placeholder="layers.*, head", info="* or empty: every module",
                                              elem_id="run-modules", interactive=True)
                    c["record"] = gr.CheckboxGroup(list(RECORD_CHOICES), value=list(RECORD_CHOICES), label="record",
                                                   elem_id="run-record", interactive=True)
                    # (the bin count beside the box that records them, taken only while it is ticked)
                    with gr.Row(equal_height=True):
                        c["histograms"] = gr.Checkbox(True, label="histograms (distributions over time)",
                                                      elem_id="run-histograms", interactive=True, scale=2,
                                                      min_width=160)
                        # (no minimum or maximum: Gradio's own refusal would say less than start_run's message)
                        c["bins"] = gr.Number(DEFAULT_BINS, label="bins", elem_id="run-bins", interactive=True,
                                              scale=1, min_width=80, info=f"1 to {MAX_BINS}")
                    c["store"] = gr.Textbox("", label="record to run (optional)", placeholder="my-run or mlp/tanh",
                                            info=f"a run name under {root.path}", elem_id="run-store",
                                            interactive=True)
                    # a label that fits one line and room for "Drop File Here - or - Click to Upload" under it
                    c["weights"] = gr.File(label="initial weights: a checkpoint (optional)", type="filepath",
                                           elem_id="run-weights", height=150)
                    c["weights_info"] = gr.Markdown(elem_id="weights-info")
                    c["form"] = gr.Column()
                c["start_message"] = gr.Markdown(elem_id="start-message")
            # (at least 560 px wide: in a narrower window it goes under the form, not squeezed beside it)
            with gr.Column(scale=4, min_width=560):
                with gr.Accordion("The uploaded weights", open=True, visible=False,
                                  elem_id="weights-inspect") as c["weights_inspect"]:
                    c["weights_summary"] = gr.Markdown(elem_id="weights-summary")
                    c["weights_outputs"] = gr.HTML(elem_id="weights-outputs")
                    # (each table shown where the file fills it: a model built from it has a module tree, a
                    # plain state_dict its tensors, a file refused neither)
                    c["weights_tree"] = gr.Dataframe(interactive=False, label="module tree (workbench.summarize)",
                                                     max_height=300, elem_id="weights-tree", visible=False)
                    c["weights_tensors"] = gr.Dataframe(pd.DataFrame(columns=TENSOR_COLUMNS), interactive=False,
                                                        label="tensors in the file", max_height=300,
                                                        elem_id="weights-tensors", visible=False)
                c["prefill"] = gr.State({})
                c["status"] = gr.Markdown(NO_RUN,
                                          elem_id="run-status")
                c["live_header"] = c["status"]
                with gr.Row(equal_height=False):
                    # (the picker beside the six buttons where both fit, a run's name readable in it; in a narrower
                    # column, as in an 800 px window, the buttons go under it and it takes the whole width: squeezed
                    # beside them, it was some 70 px wide)
                    c["pick"] = gr.Dropdown([], value=None, label="run (in progress first)", elem_id="live-pick",
                                            scale=2, interactive=True, min_width=PICK_LEAST, elem_classes=[PICK])
                    with gr.Column(scale=3, min_width=BUTTONS_LEAST, elem_id="live-buttons"):
                        with gr.Row(equal_height=True):
                            c["attach"] = gr.Button("Attach", size="md", elem_id="live-attach", scale=1, min_width=80)
                            # (greyed out until the page's run is there to pause, resume or stop: run_controls)
                            c["pause"] = gr.Button("Pause", size="md", elem_id="run-pause", scale=1, min_width=80,
                                                   interactive=False)
                            c["resume"] = gr.Button("Resume", size="md", elem_id="run-resume", scale=1, min_width=80,
                                                    interactive=False)
                            c["stop"] = gr.Button("Stop", variant="stop", size="md", elem_id="run-stop", scale=1,
                                                  min_width=80, interactive=False)
                            c["detach"] = gr.Button("Detach", size="md", elem_id="live-detach", scale=1, min_width=80)
                            c["list"] = gr.Button("Refresh", size="md", elem_id="live-refresh", scale=1, min_width=80)
                c["live_message"] = gr.Markdown(elem_id="live-message")
                # (shown once the page's run finished or was stopped: run_controls' "continue")
                with gr.Row(equal_height=True, visible=False, elem_id="continue-row") as c["continue_row"]:
                    c["more_steps"] = gr.Number(200, label="continue for more steps", elem_id="continue-steps",
                                                interactive=True, min_width=80, scale=1)
                    c["continue_store"] = gr.Textbox("", label="record to run", elem_id="continue-store",
                                                     placeholder="empty: <its run name>-from-<next step>",
                                                     interactive=True, scale=3)
                    c["continue"] = gr.Button("Continue", variant="primary", size="md", elem_id="run-continue",
                                              scale=1, min_width=100)
                # what looks wrong with the run (workbench.ui.findings): click a row to show it in the views
                c["findings_note"] = gr.Markdown(elem_id="live-findings-note")
                # (the whole evidence, wrapped beside what was found where: a row takes three lines or more)
                c["findings"] = gr.Dataframe(pd.DataFrame(columns=findings_view.SHOWN_COLUMNS), interactive=False,
                                             max_height=FINDINGS_HEIGHT, show_label=False, wrap=True,
                                             elem_id="live-findings", column_widths=FINDINGS_WIDTHS,
                                             datatype=findings_view.SHOWN_DATATYPES, visible=False)
                _intervention_components(c)
                # the views, shown once the page holds a run (before, they would be empty plots and pickers)
                with gr.Column(visible=False, elem_id="live-body") as c["live_body"]:
                    _view_components(c, "live")
                gr.Markdown("#### Runs in this app\nThey run on the server: attach to one from any page "
                            "(after a reload too), watch it, pause, resume or stop it; detaching or closing the "
                            "page leaves it running.", elem_id="live-runs-help")
                c["runs"] = gr.Dataframe(pd.DataFrame(columns=RUN_COLUMNS), interactive=False, max_height=220,
                                         show_label=False, elem_id="live-runs", wrap=True, column_widths=RUN_WIDTHS,
                                         datatype=RUN_DATATYPES, elem_classes=["wb-compact"])
                c["runs_note"] = gr.Markdown(elem_id="live-runs-note")
        c["timer"] = gr.Timer(1.0, active=False)
        # the live views in the page's view, as IN_VIEW reads them at each tick (comma separated)
        c["in_view"] = gr.Textbox(visible=False)
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
        # (narrow columns, names that break between their parts, a short start time: no sideways scroll at 800 px)
        c["runs_table"] = gr.Dataframe(pd.DataFrame(columns=RUN_TABLE_COLUMNS), interactive=False, label="Runs",
                                       max_height=RUNS_TABLE_LEAST, elem_id="runs-table", wrap=True,
                                       column_widths=RUNS_TABLE_WIDTHS, datatype=RUNS_TABLE_DATATYPES)
        with gr.Row(equal_height=True):
            c["run_path"] = gr.Dropdown([], value=None, label="run", elem_id="run-path", scale=3,
                                        elem_classes=[PICK])
            c["export_format"] = gr.Radio(list(EXPORT_FORMATS), value="CSV", label="export to", scale=2,
                                          elem_id="export-format")
            c["export"] = gr.Button("Export", elem_id="export-button", scale=1, min_width=100)
        c["export_message"] = gr.Markdown(elem_id="export-message")
        c["export_files"] = gr.File(label="exported", file_count="multiple", interactive=False, visible=False,
                                    elem_id="export-files")
        with gr.Accordion("Compare runs", open=True, elem_id="compare"):
            # (each figure under its own controls, a log y box each, as the notebook's Compare has them in its tabs:
            # one box for both was ticked over a linear call-site figure while a metrics panel drew log)
            with gr.Row(equal_height=True):
                c["compare_runs"] = gr.Dropdown([], value=[], multiselect=True, label="runs (two or more)",
                                                scale=4, min_width=COMPARE_RUNS_LEAST, elem_id="compare-runs",
                                                elem_classes=[PICK])
                c["compare_log_metrics"] = gr.Checkbox(False, label="metrics log y", scale=1, min_width=130,
                                                       elem_id="compare-log-metrics")
            c["compare_colors"] = gr.State({})  # (run -> its colour in the comparison drawn)
            # (per figure, the metrics' and the call site's: True until the user sets its log y, the figure choosing
            # its scale, and its box saying whether it is log)
            c["compare_auto_log"] = gr.State((True, True))
            # (the scales they chose, kept once settled: stored_runs.compare_page)
            c["compare_kept_log"] = gr.State(None)
            c["compare_message"] = gr.Markdown(NO_COMPARISON, elem_id="compare-message")
            # shown once two runs are compared (an empty Plot is a tall blank placeholder)
            c["compare_metrics"] = gr.Plot(show_label=False, container=False, visible=False,
                                           elem_id="compare-metrics")
            # (at least COMPARE_RUNS_LEAST wide above: in an 800 px window the call site's pickers have a row of
            # their own, not beside a picker of runs of some 170 px that put each run's chip on a line of its own)
            with gr.Row(equal_height=True):
                c["compare_kind"] = gr.Dropdown(list(KINDS), value="grad_output", label="kind", scale=1,
                                                elem_id="compare-kind")
                c["compare_stat"] = gr.Dropdown(STATISTICS, value="norm", label="statistic", scale=1,
                                                elem_id="compare-stat")
                c["compare_site"] = gr.Dropdown([], value=None, label="call site", scale=2,
                                                allow_custom_value=True, elem_id="compare-site", elem_classes=[PICK])
                c["compare_log"] = gr.Checkbox(False, label="log y", scale=1, min_width=90, elem_id="compare-log")
            c["compare_site_plot"] = gr.Plot(show_label=False, container=False, visible=False,
                                             elem_id="compare-site-plot")
        gr.Markdown("### The run", elem_classes=["wb-section"])
        c["run_message"] = gr.Markdown(elem_id="run-message")
        # the views, once a run is opened (before, they would be empty plots and pickers)
        with gr.Column(visible=False, elem_id="replay-body") as c["replay_body"]:
            c["replay_header"] = gr.Markdown(elem_id="replay-header")
            # what looked wrong with the stored run (workbench.ui.findings): click a row to show it in the views
            c["replay_findings_note"] = gr.Markdown(elem_id="replay-findings-note")
            c["replay_findings"] = gr.Dataframe(pd.DataFrame(columns=findings_view.SHOWN_COLUMNS), interactive=False,
                                                max_height=FINDINGS_HEIGHT, show_label=False, wrap=True,
                                                elem_id="replay-findings", column_widths=FINDINGS_WIDTHS,
                                                datatype=findings_view.SHOWN_DATATYPES, visible=False)
            _view_components(c, "replay")
    # the page's run: only its id; the run itself is the manager's, and outlives the page
    c["live_state"] = gr.State(None)
    # the run the page holds, kept in the browser (localStorage, by a key of this app's own): a reloaded
    # page, or a new tab, attaches to it again while the app has it. ({"run": id or None}: Gradio stores
    # no value that is false in JavaScript, so a None would leave the last run remembered)
    c["remembered"] = gr.BrowserState({"run": None})
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


def _wire_views(c: dict, p: str, target: Any, find: Callable[[Any], tuple[RunView | None, str]]) -> tuple:
    """Connect a run page's controls to a redraw. ``target`` is the State naming the page's run,
    ``find(value)`` gives its view (or None) and header. Returns the redraw's inputs and outputs
    and the function drawing it: ``draw(target, page_state, *controls, force=...)``."""
    import gradio as gr

    inputs = [target, c[f"{p}_page"], *[c[f"{p}_{k}"] for k in CONTROLS]]
    outputs = [c[f"{p}_page"], *[c[f"{p}_{k}"] for k in VIEW_OUTPUTS]]

    def draw(value, state, *values, force=True, jump=False, change=None, in_view=None):
        view, header, *more = find(value)  # (a third: the run's interventions)
        return redraw(view, header, value, state, values, force=force, jump=jump, change=change,
                      interventions=more[0] if more else None, in_view=in_view)

    def handler(**options):
        def on_event(*args):
            return draw(*args, **options)
        on_event.__name__ = f"draw_{p}"
        return _guarded(on_event, lambda text: (*skips(1), text, *skips(len(VIEW_OUTPUTS) - 1)))

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
    # another kind or statistic: the figure chooses its scale again (log where a line dwarfs the others), and
    # the box says which; a click on the box makes the scale the user's
    c[f"{p}_kind"].input(handler(change={"auto_sites": True, "auto_log_sites": True}), inputs, outputs,
                         show_progress="hidden")
    c[f"{p}_stat"].input(handler(change={"auto_log_sites": True}), inputs, outputs, show_progress="hidden")
    c[f"{p}_log_sites"].input(handler(change={"auto_log_sites": False}), inputs, outputs, show_progress="hidden")
    # (.change, not .release: a value typed into the slider's box fires change and input at once, and
    # release only at the next blur; one typed out of range is put back into it at the blur, which fires
    # change alone. The page never sets the slider itself, so each change is the user's; "always_last"
    # draws a drag's last value after the one being drawn, not every value on the way)
    c[f"{p}_smoothing"].change(handler(), inputs, outputs, show_progress="hidden", trigger_mode="always_last")
    # (the metrics' box: the user's scale from here, every panel's; until then each panel chooses its own)
    c[f"{p}_log_metrics"].input(handler(change={"auto_log_metrics": False}), inputs, outputs, show_progress="hidden")
    for key in ("dist_site", "heat_kind", "heat_log"):
        c[f"{p}_{key}"].input(handler(), inputs, outputs, show_progress="hidden")
    # a new heatmap statistic comes with its own log scale (figures.LOG_STATISTICS), which the box can change
    c[f"{p}_heat_stat"].input(lambda stat: gr.Checkbox(value=stat in figures.LOG_STATISTICS), c[f"{p}_heat_stat"],
                              c[f"{p}_heat_log"], show_progress="hidden").then(
        handler(), inputs, outputs, show_progress="hidden")
    c[f"{p}_jump"].click(handler(jump=True), inputs, outputs, show_progress="hidden")
    return inputs, outputs, draw


def wire(c: dict, manager: RunManager, app: Any = None, holdings: PageHoldings | None = None) -> None:
    """Connect the components; ``manager`` owns the live runs, ``app`` (the Blocks) lists them on load;
    ``holdings``: what each page holds, let go of when it closes (:class:`~workbench.ui.pages.PageHoldings`, ended
    by the app's unload): the folder of a page's last export, removed then (and at its next export)."""
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
        return gr.Dropdown(choices=choices, value=keep), shown_runs_frame(runs_frame(manager)), runs_note(manager)

    def find_live(attached):
        if not attached:
            return None, NO_RUN
        run, message = find_run(manager, attached)
        return (None, message) if run is None else (run.view, live_header(run), run.intervention_frame())

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

            def on_start(attached, exp_name, seed, device, steps, every, histograms, bins, modules, record, store,
                         weights, *values):
                new, message = start_run(manager, exp_name, dict(zip(labels, values)), seed, steps, every,
                                         histograms, modules, store, device, record, weights or None, bins)
                if new is None:  # the page stays with the run it watches, if any
                    # (also as a pop-up: the page scrolls to the run's header, far from the message under Start)
                    gr.Warning(pop_up_text(message))
                    return (gr.skip(), gr.skip(), message, gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                            *listed(attached), *skips(len(buttons) + 2 + len(PLOTS)))
                started = f"Started {new.label}; this page is attached to it."
                previous = manager.get(attached)
                if previous is not None and previous.running:
                    started += f" {previous.label} runs on: pick it in the list to attach to it again."
                # the form folds away: the page is for the run now (open it again for the next one)
                state = new_page_state()
                return (live_header(new), new.id, "", state, gr.Timer(active=True),
                        gr.Accordion(open=False), started, *listed(new.id), *button_updates(new.id, state, fresh=True),
                        {"run": new.id},  # (remembered by the browser: a reload attaches to it again)
                        "",  # (the intervention message was about the run the page held before)
                        *starting_plots(new.label))  # (with the header that says it runs, until its first drawing)

            # (the page scrolls to the run's header: Start lies at the foot of a long form)
            start.click(_guarded(on_start, lambda text: (gr.skip(), gr.skip(), text,
                                                         *skips(9 + len(buttons) + len(PLOTS)))),
                        [c["live_state"], c["experiment"], c["seed"], c["device"], c["steps"], c["every"],
                         c["histograms"], c["bins"], c["modules"], c["record"], c["store"], c["weights"], *widgets],
                        [c["status"], c["live_state"], c["start_message"], c["live_page"], c["timer"], c["config"],
                         c["live_message"], *listing, *buttons, c["remembered"], c["iv_message"],
                         *[c[f"live_{name}"] for name in PLOTS]]).then(
                None, js=SHOW_HEADER).then(
                _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))),
                live_inputs, live_outputs, show_progress="hidden").then(
                refresh_panel, [c["live_state"], c["live_page"]], refreshed_outputs,
                show_progress="hidden")

    # the bin count is the histograms': it takes input while they are recorded
    c["histograms"].change(lambda on: gr.Number(interactive=bool(on)), c["histograms"], c["bins"],
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
               gr.skip() if sent.get("table") == rows else shown_interventions(table),
               gr.skip() if sent.get("on") == on else gr.Dropdown(choices=on, value=on[-1] if on else None))
        sent.update(sites=sites, table=rows, on=on)
        return out

    # (run_controls' order; Continue's row shows only when it applies: its fields mean nothing before;
    # the views show while the page holds a run)
    buttons = [c["pause"], c["resume"], c["stop"], c["iv_apply"], c["iv_remove"], c["continue_row"], c["live_body"]]
    # (what refresh_panel redraws once a page holds another run, or none)
    refreshed_outputs = [c["live_page"], *panel, *buttons, c["findings_note"], c["findings"]]

    def control(key: str, on: bool):
        if key == "views":
            return gr.Column(visible=on)
        return gr.Row(visible=on) if key == "continue" else gr.Button(interactive=on)

    def button_updates(attached, state: dict, fresh: bool = False) -> tuple:
        """Pause, Resume, Stop, Apply and Remove, enabled where they apply to the page's run
        (:func:`run_controls`), greyed out where not, and Continue's row shown or hidden; each sent only
        when it changed (``state`` remembers; ``fresh``: whatever the page had)."""
        able = {**run_controls(manager, attached), "views": bool(attached) and manager.get(attached) is not None}
        sent = {} if fresh else state.get("buttons", {})
        state["buttons"] = able
        return tuple(gr.skip() if sent.get(k) == v else control(k, v) for k, v in able.items())

    def list_updates(state: dict) -> tuple:
        """The runs table, its note and the picker's choices, each sent only when it changed (``state``
        remembers what the page has)."""
        choices, table, note = run_choices(manager), runs_frame(manager), runs_note(manager)
        rows = table.to_dict("records")
        pick = gr.skip() if state.get("runs") == choices else gr.Dropdown(choices=choices)
        table, note = ((gr.skip(), gr.skip()) if state.get("run_rows") == (rows, note)
                       else (shown_runs_frame(table), note))
        state.update(runs=choices, run_rows=(rows, note))
        return table, note, pick

    def on_tick(attached, state, *values):
        *values, in_view = values  # (the views the page has in view: IN_VIEW, run in the browser)
        run = manager.get(attached) if attached else None
        # ticking while any run of the app goes (another page's too: the list of runs follows it), and once
        # after (before drawing: a run ending now is drawn next tick)
        going = any(r.running for r in manager.runs())
        drawn = draw_live(attached, state, *values, force=False, in_view=_in_view(in_view))
        # (a tick comes from an active timer: it is sent only to stop it; the list of runs, whose labels and
        # table say each run's step, is the list timer's, every LIST_SECONDS: redrawn every second, as the
        # page's views, it kept the browser busy)
        return (*drawn, gr.skip() if going else gr.Timer(active=False),
                *panel_updates(attached, drawn[0], keep_pick=True), *button_updates(attached, drawn[0]),
                *_hidden_while_empty(*findings_view.page_findings(run, drawn[0])))

    def on_list_tick(state):
        state = dict(state or {})
        going = any(r.running for r in manager.runs())
        timer = gr.Timer(active=True) if going and not state.get("going") else gr.skip()  # (a run was started)
        state["going"] = going
        return state, *list_updates(state), timer

    c["list_timer"].tick(_guarded(on_list_tick, lambda text: skips(5)), c["list_state"],
                         [c["list_state"], c["runs"], c["runs_note"], c["pick"], c["timer"]], show_progress="hidden")
    c["timer"].tick(_guarded(on_tick, lambda text: (gr.skip(), text, *skips(n_views - 1),
                                                    gr.Timer(active=False), *skips(5 + len(buttons)))),
                    [*live_inputs, c["in_view"]], [*live_outputs, c["timer"], *panel, *buttons,
                                  c["findings_note"], c["findings"]],
                    show_progress="hidden", js=IN_VIEW)  # (a tick every second: no flicker of its outputs)

    # (the list too: picking a cause lists its consequences under it, or folds them again)
    c["findings"].select(_guarded(findings_view.select_handler(manager), lambda text: (gr.skip(), text,
                                                                                      *skips(n_views + 2))),
                         live_inputs, [*live_outputs, c["findings_note"], c["live_stat"], c["findings"]],
                         show_progress="hidden")

    def on_panel(attached, state):
        state = dict(state or new_page_state())
        state["iv"], state["findings"] = {}, {}  # (another run, or none: everything is sent)
        state["findings_listed"] = ()  # (its causes' consequences folded, as at first)
        # (the findings too: a page that attaches to a run that has ended gets no tick to list them)
        run = manager.get(attached) if attached else None
        return (state, *panel_updates(attached, state), *button_updates(attached, state, fresh=True),
                *_hidden_while_empty(*findings_view.page_findings(run, state)))

    refresh_panel = _guarded(on_panel, lambda text: skips(6 + len(buttons)))

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
    c["iv_apply"].click(_guarded(on_apply, lambda text: (text, *skips(4 + len(buttons)))),
                        [c["live_state"], c["live_page"], c["iv_site"], c["iv_op"], c["iv_units"], c["iv_k"],
                         c["iv_sigma"], c["iv_low"], c["iv_high"]], panel_outputs).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden")
    c["iv_remove"].click(_guarded(on_remove, lambda text: (text, *skips(4 + len(buttons)))),
                         [c["live_state"], c["live_page"], c["iv_on"], c["iv_site"]], panel_outputs).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden")

    # ------------------------------------------------------------ initial weights
    def on_weights(path, prefill):
        text, tree, outputs, experiment, settings, tensors = inspect_weights(path)
        shown = (gr.Dataframe(value=tree, visible=not tree.empty), outputs_html(outputs),
                 gr.Dataframe(value=tensors, visible=not tensors.empty))
        if not path:
            return "", gr.Accordion(visible=False), "", *shown, gr.skip(), gr.skip()
        note = text.split("\n\n")[0] if not text.startswith("**Refused") else text
        if experiment is None:
            return note, gr.Accordion(visible=True, open=True), text, *shown, gr.skip(), gr.skip()
        version = int((prefill or {}).get("version", 0)) + 1
        return (note, gr.Accordion(visible=True, open=True), text, *shown, gr.Radio(value=experiment),
                {"experiment": experiment, "values": settings, "version": version})

    c["weights"].change(_guarded(on_weights, lambda text: (text, *skips(7))), [c["weights"], c["prefill"]],
                        [c["weights_info"], c["weights_inspect"], c["weights_summary"], c["weights_tree"],
                         c["weights_outputs"], c["weights_tensors"], c["experiment"], c["prefill"]])

    def on_attach(picked):
        attached, message = attach(manager, picked)
        if attached is None:
            return gr.skip(), message, gr.skip(), gr.skip(), *listed(picked), *skips(len(buttons) + 3)
        state = new_page_state()
        # (the form folds away, as at a start: the page is for the run now)
        return (attached, "", state, ticking(), *listed(attached), *button_updates(attached, state, fresh=True),
                "", gr.Accordion(open=False), {"run": attached})  # (the last run's intervention message goes)

    attached_outputs = [c["live_state"], c["live_message"], c["live_page"], c["timer"], *listing, *buttons,
                        c["iv_message"], c["config"], c["remembered"]]
    c["attach"].click(_guarded(on_attach, lambda text: (gr.skip(), text, *skips(8 + len(buttons)))), [c["pick"]],
                      attached_outputs).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden").then(
        refresh_panel, [c["live_state"], c["live_page"]], refreshed_outputs, show_progress="hidden")

    def on_stop(attached, state):
        message = stop_run(manager, attached)
        run = manager.get(attached) if attached else None
        header = live_header(run) if run is not None else gr.skip()
        state = dict(state or new_page_state())
        return (header, "" if run is not None and "had ended" not in message else message, *listed(attached), state,
                *button_updates(attached, state, fresh=True))

    c["stop"].click(_guarded(on_stop, lambda text: (gr.skip(), text, *skips(4 + len(buttons)))),
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
            return live_header(run), note, *listed(attached), *controls

        button.click(_guarded(on_pause, lambda text: (gr.skip(), text, *skips(4 + len(buttons)))),
                     [c["live_state"], c["live_page"]],
                     [c["status"], c["live_message"], *listing, c["live_page"], *buttons])

    def on_continue(attached, state, steps, store):
        new, message = continue_run(manager, attached, steps, store)
        if new is None:  # (the page stays with the ended run)
            return (gr.skip(), gr.skip(), message, gr.skip(), gr.skip(), *listed(attached), *skips(len(buttons)),
                    gr.skip(), gr.skip())
        ended = manager.get(attached)
        state = new_page_state()
        note = f"Started {new.label}, continuing {ended.label if ended else attached}; this page is attached to it."
        return (live_header(new), new.id, note, state, gr.Timer(active=True), *listed(new.id),
                *button_updates(new.id, state, fresh=True), {"run": new.id},  # (a reload attaches to it)
                "")  # (the intervention message was about the ended run)

    c["continue"].click(_guarded(on_continue, lambda text: (gr.skip(), gr.skip(), text, *skips(7 + len(buttons)))),
                        [c["live_state"], c["live_page"], c["more_steps"], c["continue_store"]],
                        [c["status"], c["live_state"], c["live_message"], c["live_page"], c["timer"], *listing,
                         *buttons, c["remembered"], c["iv_message"]]).then(
        _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))), live_inputs, live_outputs,
        show_progress="hidden").then(
        refresh_panel, [c["live_state"], c["live_page"]], refreshed_outputs, show_progress="hidden")

    def on_detach(attached, picked):
        _, message = detach(manager, attached)
        # (the last run's intervention message and findings go with it)
        return (None, message, ticking(), *listed(picked), "",
                *_hidden_while_empty("", pd.DataFrame(columns=findings_view.TABLE_COLUMNS)), {"run": None})

    c["detach"].click(_guarded(on_detach, lambda text: (gr.skip(), text, *skips(8))),
                      [c["live_state"], c["pick"]],
                      [c["live_state"], c["live_message"], c["timer"], *listing, c["iv_message"], c["findings_note"],
                       c["findings"], c["remembered"]]
                      ).then(_guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))),
                             live_inputs, live_outputs, show_progress="hidden").then(
        refresh_panel, [c["live_state"], c["live_page"]], refreshed_outputs, show_progress="hidden")
    c["list"].click(_guarded(listed, lambda text: (gr.skip(), gr.skip(), text)), c["pick"], listing)

    # ------------------------------------------------------------ the Runs tab
    def find_stored(name):
        if not name:
            return None, "_Pick a run above (or click its row)._"
        view, run, message = cache.get(name)
        if view is None:
            return None, message
        interventions = stored_interventions(run)
        return view, stored_header(view, run, interventions), interventions

    replay_inputs, replay_outputs, draw_replay = _wire_views(c, "replay", c["run_state"], find_stored)
    _redraw_replay = _guarded(draw_replay, lambda text: (gr.skip(), text, *skips(n_views - 1)))
    stored_findings = _guarded(lambda pick, listed: findings_view.stored_findings(cache, pick, listed),
                               lambda text: (text, gr.skip()))

    def redraw_replay(*args):  # the views, and the run's findings (the causes listed as the page's state says)
        return (*_redraw_replay(*args),
                *_hidden_while_empty(*stored_findings(args[0], (args[1] or {}).get("findings_listed", ()))))

    replay_outputs = [*replay_outputs, c["replay_findings_note"], c["replay_findings"]]
    c["replay_findings"].select(
        _guarded(findings_view.stored_select_handler(cache, find_stored),
                 lambda text: (gr.skip(), text, *skips(n_views + 2))),
        replay_inputs, [*replay_outputs[:-2], c["replay_findings_note"], c["replay_stat"], c["replay_findings"]],
        show_progress="hidden")

    def on_pick(pick):
        """Open a run: its line at once; its views (hidden until drawn: a long run takes a while to read,
        and the run open before must not show under this one's name) by :func:`shown_body` after."""
        run, message = replay(root, pick)
        if run is not None:
            message += " · _reading its steps…_"
        return (pick if run is not None else None), message, new_page_state(), gr.skip(), gr.Column(visible=False)

    def shown_body(pick, page):
        """The views once drawn, and the line that said the run is being read gone (their header says what
        it said: the run's status and steps once, not on two lines); a draw that failed left its ``version``
        unset: the last run's views would show under this one's name, so they stay hidden and the line says so."""
        if pick and (page or {}).get("version") is not None:
            return "", gr.Column(visible=True)
        run, message = replay(root, pick) if pick else (None, gr.skip())
        if run is not None:
            message += " · **its views could not be drawn** (the server's log has why; please report it)"
        return message, gr.Column(visible=False)

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
        table = shown_runs(table)
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
                         _guarded(on_refresh, lambda text: (gr.skip(), gr.skip(), text, *skips(5))),
                         [c["root"], c["compare_runs"], c["run_state"]], listed_runs)
    listing_runs.then(redraw_replay, replay_inputs, replay_outputs, show_progress="hidden").then(
        shown, [c["run_state"], c["replay_page"]], [c["run_message"], c["replay_body"]], show_progress="hidden")

    def on_runs_tab(sub):
        """The list brought up to date when the tab is shown (runs stored since the page loaded); the run
        open and the runs compared stay as they are (the pickers get the new choices, not a value: a
        List runs clicked meanwhile opens a run, which this reply must not take back)."""
        table, names, message = run_table(root, sub)
        return shown_runs(table), gr.Dropdown(choices=names), message, gr.Dropdown(choices=names)

    c["runs_tab"].select(_guarded(on_runs_tab, lambda text: (gr.skip(), gr.skip(), text, gr.skip())),
                         c["root"], listed_runs[:4], show_progress="hidden")
    if app is not None:  # a new or reloaded page lists the runs in this app and the stored ones
        def on_load():
            return (*listed(first_running=True), *on_list("", (), open_first=False),  # (opened when picked)
                    ticking())

        def on_reattach(remembered):
            """The run this page held before a reload (or another tab of this browser last held), attached
            again while the app has it (one dropped from memory: the page holds none, as a new one)."""
            run_id = remembered.get("run") if isinstance(remembered, dict) else None
            if not run_id or manager.get(run_id) is None:
                return skips(len(attached_outputs))
            return on_attach(run_id)

        app.load(_guarded(on_load, lambda text: (gr.skip(), gr.skip(), text, gr.skip(), gr.skip(), text,
                                                 *skips(6))), None, [*listing, *listed_runs, c["timer"]]).then(
            _guarded(on_reattach, lambda text: (gr.skip(), text, *skips(len(attached_outputs) - 2))),
            c["remembered"], attached_outputs, show_progress="hidden").then(
            _guarded(draw_live, lambda text: (gr.skip(), text, *skips(n_views - 1))), live_inputs, live_outputs,
            show_progress="hidden").then(
            refresh_panel, [c["live_state"], c["live_page"]], refreshed_outputs,
            show_progress="hidden")

    holdings = holdings if holdings is not None else PageHoldings()

    def on_export(name, pick, fmt, request):
        # (written into Gradio's cache, from which the page's file component serves them as they are: written
        # elsewhere, each file was copied there, and the copies stayed once the page let go of its folder)
        cache = getattr(app, "GRADIO_CACHE", None) or gr.utils.get_upload_folder()
        os.makedirs(cache, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="workbench-export-", dir=cache)
        paths, message = export_run(root, name or pick, fmt, folder)
        if not paths:
            shutil.rmtree(folder, ignore_errors=True)
        session = session_of(request)
        if paths and session is not None:  # (the page offers the last export's files alone: the others go)
            holdings.hold(session, "export", functools.partial(shutil.rmtree, folder, ignore_errors=True))
        return message, gr.File(value=paths or None, visible=bool(paths))

    # Gradio passes the page's request to a parameter annotated gr.Request; written in the signature, the
    # annotation is a string (this module's annotations are postponed) naming a gr it cannot resolve
    on_export.__annotations__["request"] = gr.Request

    c["export"].click(_guarded(on_export, lambda text: (text, gr.skip())),
                      [c["run_state"], c["run_path"], c["export_format"]], [c["export_message"], c["export_files"]])

    def on_compare(picks, kind, stat, site, log_metrics, log_site, colors, auto_log, kept, change=None):
        # (the runs' colours and the scales the figures chose are kept in the page's state: stored_runs.compare_page)
        metrics, site_fig, choices, site, message, colors, boxes, auto_log, kept = compare_page(
            cache, picks, kind, stat, site, (log_metrics, log_site), colors, auto_log, kept, change)
        drawn = metrics is not None  # else the plots are hidden, and the message says what to pick
        return (gr.Plot(plot_data(metrics) if drawn else None, visible=drawn),
                gr.Plot(plot_data(site_fig) if drawn else None, visible=drawn),
                gr.Dropdown(choices=choices, value=site), message, colors,
                *(gr.skip() if box is None else box for box in boxes), auto_log, kept)

    compare_inputs = [c["compare_runs"], c["compare_kind"], c["compare_stat"], c["compare_site"],
                      c["compare_log_metrics"], c["compare_log"], c["compare_colors"], c["compare_auto_log"],
                      c["compare_kept_log"]]
    compare_outputs = [c["compare_metrics"], c["compare_site_plot"], c["compare_site"], c["compare_message"],
                       c["compare_colors"], c["compare_log_metrics"], c["compare_log"], c["compare_auto_log"],
                       c["compare_kept_log"]]

    def comparing(change=None):
        """on_compare, guarded; ``change``: figure -> whether it chooses its scale from here (None: as before)."""
        return _guarded(lambda *args: on_compare(*args, change=change),
                        lambda text: (gr.skip(), gr.skip(), gr.skip(), text, *skips(5)))

    compare = comparing()
    listing_runs.then(compare, compare_inputs, compare_outputs, show_progress="hidden")  # (the runs may have changed)
    # (a pick in the runs multiselect by .select, whose value arrives after it: drawn in a .then)
    # ("always_last": a second pick made while the first is drawn is drawn after it, not dropped)
    c["compare_runs"].select(_nothing, None, None, show_progress="hidden", trigger_mode="always_last").then(
        compare, compare_inputs, compare_outputs, trigger_mode="always_last")
    # another kind, statistic or site: the call site's figure chooses its scale again (log where one run's line
    # dwarfs the others, as a run page's per-site figure); a log y box set by the user: the user's scale, of its figure
    for key, change in (("compare_kind", {"site": True}), ("compare_stat", {"site": True}),
                        ("compare_site", {"site": True}), ("compare_log", {"site": False}),
                        ("compare_log_metrics", {"metrics": False})):
        c[key].input(comparing(change), compare_inputs, compare_outputs, trigger_mode="always_last")
