"""A run page's views, drawn from a run's :class:`~workbench.ui.views.RunView` (live or stored).

:func:`draw_page` draws every view of a page as its :class:`Controls` ask (the header, metrics, a
statistic per call site, distributions, the layer x step heatmap, NaN/Inf) as
:mod:`workbench.ui.figures`' Plotly specs, so a refresh costs in proportion to the new steps and
sends figures of bounded size however long the run. :func:`redraw` is one drawing of a Gradio page:
what it remembers (:func:`new_page_state`), its controls' values in (:data:`CONTROLS`), the
updates of its components out (:data:`VIEW_OUTPUTS`), only what changed.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.instrument import KINDS, STAT_COLUMNS
from workbench.ui import figures
from workbench.ui.intervention_menu import INTERVENTION_METRIC
from workbench.ui.runs import breakable, shown
from workbench.ui.views import RunView, Site

if TYPE_CHECKING:
    from workbench.ui.live_run import LiveRun

__all__ = ["STATISTICS", "DEFAULT_SITES", "Controls", "Page", "draw_page", "live_header", "VIEW_OUTPUTS",
           "CONTROLS", "PACED", "IN_VIEW_ONLY", "HEAVY_TICKS", "new_page_state", "page_controls", "plot_data",
           "page_outputs", "jump_controls", "redraw", "with_kept_scales", "LATEST_COLUMNS", "LATEST_WIDTHS",
           "LATEST_DATATYPES", "short_number", "shown_latest", "recording_of"]


STATISTICS = [c for c in STAT_COLUMNS if c != "numel"]
#: The last-step table a page shows (:func:`shown_latest`): each site, the step and its statistics but the NaN/Inf
#: counts (the "NaN / Inf" table above it lists those), then, where the run has any, the interventions on then.
LATEST_COLUMNS = ["site", "step", *[s for s in STATISTICS if s not in ("nan_count", "inf_count")]]
#: Its column widths: in a 1400 px window (a run page ~900 px wide) a site breaks after a dot or an underscore and each
#: statistic (:func:`short_number`, 8 characters at most) holds on a line; in an 800 px window too, its text a little
#: smaller there (run_tabs.CSS).
LATEST_WIDTHS = ["14%", "7.5%", *["11.2%"] * 7]
#: Its cells' datatypes: a site is HTML (where it may break, and the interventions on it then).
LATEST_DATATYPES = ["html", *["number"] * (len(LATEST_COLUMNS) - 1)]
#: Where a site's name may break over two lines: after a dot or an underscore followed by a letter or a digit, and
#: before the '#' of a call's index (``resblocks.`` ``0.`` ``conv1.`` ``0`` ``#0``).
_SITE_JOINT = re.compile(r"(?<=[._])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=#)")
#: Lines the per-site plot draws by default: the sites whose statistic changed most.
DEFAULT_SITES = 6
NO_HISTOGRAMS = ("No histograms in this run: it was recorded with histograms off. Tick **histograms** in the "
                 "run form (or leave `watch(model)`'s `histograms` on, its default) to see distributions over time.")


@dataclass
class Controls:
    """What a run page's controls ask of its views (the page builds one from its widgets)."""

    metrics: Sequence[str] | None = None  # None: every metric
    smoothing: float = 0.0  # TensorBoard's, in [0, 0.99]
    log_metrics: bool | None = False  # None: each panel chooses (log where an early spike flattens the rest)
    kept_log_metrics: dict[str, bool] | None = None  # with log_metrics None, the scales kept (figures.kept_scales)
    kind: str = "activation"  # of the per-site plot, the distributions and the last-step table
    statistic: str = "std"
    sites: Sequence[str] | None = None  # None: the view's default (the sites that changed most)
    log_sites: bool | None = False  # None: the figure chooses (log where a line dwarfs the others)
    kept_log_sites: bool | None = None  # with log_sites None, the scale kept for it (figures.chosen_scale)
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
    log_metrics: bool | None  # a metrics panel drawn log, where the panels chose (None: as asked, or not drawn)
    site_choices: list[str]  # forward order
    sites: list[str]
    sites_figure: dict[str, Any]
    site_note: str
    log_sites: bool | None  # the per-site figure's scale as drawn where it chose it (None: as asked, or not drawn)
    dist_choices: list[str]
    dist_site: str | None
    distribution_figure: dict[str, Any]
    dist_note: str
    heatmap_figure: dict[str, Any]
    anomalies: pd.DataFrame
    latest: pd.DataFrame


def check_choice(label: str, value: Any, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{label} must be one of {', '.join(choices)}; got {shown(value)}. Pick one from the list.")


def parse_smoothing(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 0.99:
        raise ValueError(f"smoothing must be a number in [0, 0.99] (0: none), got {shown(value)}; "
                         "move the slider back into range.")
    return float(value)


def picked_names(value: Any, label: str) -> list[str] | None:
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
              interventions: pd.DataFrame | None = None, site_colors: dict[str, str] | None = None,
              plots: Collection[str] | None = None) -> Page:
    """Draw every view of a run page from ``view`` as ``controls`` ask. Never raises: a control
    value the page cannot draw is a message in that view's place. ``interventions`` (a table of
    :data:`INTERVENTION_COLUMNS`) are shaded over the steps they were on, and named in the
    last-step table beside the sites they are on. ``site_colors``: the call sites' colours in the
    page's earlier drawings, which each site drawn again keeps (updated with this drawing's).
    ``plots``: the figures to draw, by their components' names in :data:`VIEW_OUTPUTS` ("metrics",
    "series", "distribution", "heatmap"; None: all); the others are None in the page."""
    c = controls or Controls()

    def drawn(name: str, draw: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        return draw() if plots is None or name in plots else None

    first = view.first_anomaly
    # metrics (the interventions' markers not by default: they are the bands over the figures)
    metric_choices = view.metric_names()
    try:
        picked = picked_names(c.metrics, "metrics")
        chosen = ([m for m in metric_choices if not m.startswith(INTERVENTION_METRIC)] if picked is None
                  else [m for m in picked if m in metric_choices])
        smoothing = parse_smoothing(c.smoothing)
        log_metrics = None if c.log_metrics is None else bool(c.log_metrics)
        metrics_fig = drawn("metrics", lambda: figures.metrics_figure(view, chosen, smoothing, log_metrics,
                                                                      kept_log=c.kept_log_metrics)
                            if chosen else
                            figures.empty_figure("Pick metrics above." if metric_choices else view.no_metrics()))
    except ValueError as exc:
        chosen, metrics_fig = metric_choices, figures.empty_figure(str(exc))
    chosen_log_metrics = figures.drawn_log(metrics_fig) if c.log_metrics is None else None
    # a statistic per call site; the distributions and the last-step table follow the same kind
    site_choices, sites, dist_choices, dist_site, chosen_log = [], [], [], None, None
    latest = pd.DataFrame(columns=["site", "step", *STATISTICS])
    try:
        check_choice("kind", c.kind, KINDS)
        site_choices = view.site_order(c.kind)
        try:
            check_choice("statistic", c.statistic, STATISTICS)
            picked = picked_names(c.sites, "sites")
            unknown = [s for s in picked or [] if s not in site_choices]
            sites = (view.default_sites(c.kind, c.statistic, DEFAULT_SITES) if picked is None
                     else [s for s in picked if s in site_choices])
            sites = sorted(sites, key=site_choices.index)  # (drawn and listed in forward order)
            log_sites = None if c.log_sites is None else bool(c.log_sites)
            sites_fig = drawn("series", lambda: figures.sites_figure(view, c.kind, c.statistic, sites,
                                                                     log_sites, site_colors, c.kept_log_sites)
                              if sites
                              else figures.empty_figure("Pick call sites above." if site_choices
                                                        else view.no_rows(c.kind)))
            if log_sites is None and sites_fig is not None and sites_fig["data"]:  # (the scale it chose)
                chosen_log = sites_fig["layout"]["yaxis"]["type"] == "log"
            site_note = figures.site_note(view, c.kind, site_choices, sites, unknown, default=picked is None)
        except ValueError as exc:
            sites_fig, site_note = figures.empty_figure(str(exc)), str(exc)
        dist_choices = [s for s in site_choices if s in set(view.histogram_sites(c.kind))]
        if isinstance(c.dist_site, str) and c.dist_site in dist_choices:
            dist_site = c.dist_site
        else:
            dist_site = next((s for s in sites if s in dist_choices), dist_choices[0] if dist_choices else None)
        if dist_site is not None:
            dist_fig = drawn("distribution", lambda: figures.distribution_figure(view, c.kind, dist_site))
            dist_note = f"{len(dist_choices)} {c.kind} site(s) with histograms."
        elif site_choices:
            dist_fig, dist_note = figures.empty_figure("No histograms recorded."), NO_HISTOGRAMS
        else:
            dist_fig, dist_note = figures.empty_figure(view.no_rows(c.kind)), ""
        latest = view.latest(c.kind)
    except ValueError as exc:
        sites_fig = dist_fig = figures.empty_figure(str(exc))
        site_note = dist_note = str(exc)
    heat_kind = c.heat_kind
    try:
        check_choice("heatmap kind", heat_kind, KINDS)
        check_choice("heatmap statistic", c.heat_statistic, STATISTICS)
        if not view.site_order(heat_kind):  # (a run that records none of it: no gradients, a forward-only model)
            heat_kind = next((k for k in KINDS if view.site_order(k)), heat_kind)
        heat_fig = drawn("heatmap", lambda: figures.heatmap_figure(view, heat_kind, c.heat_statistic,
                                                                   bool(c.heat_log)))
        # (the picker keeps the kind asked: the next run may have it)
        if heat_fig is not None and heat_kind != c.heat_kind:
            title = heat_fig["layout"]["title"]
            title["text"] = f"No {c.heat_kind} rows in this run; {title['text']}"
    except ValueError as exc:
        heat_fig = figures.empty_figure(str(exc))
    # (6 significant digits, not decimals: a gradient of 3e-8 is not a 0)
    floats = [column for column in LATEST_COLUMNS[2:] if column in latest]
    latest[floats] = latest[floats].astype(float).map(lambda value: float(f"{value:.6g}"))
    if interventions is not None and len(interventions):
        metrics_fig, sites_fig = (None if fig is None else
                                  figures.shade_interventions(fig, interventions, view.last_step)
                                  for fig in (metrics_fig, sites_fig))
        latest = _mark_interventions(latest, interventions, view.sites.get(c.kind, []))
    return Page(header if header is not None else figures.header_markdown(view), _anomaly_text(first), first,
                metric_choices, chosen, metrics_fig, chosen_log_metrics, site_choices, sites, sites_fig, site_note,
                chosen_log, dist_choices, dist_site, dist_fig, dist_note, heat_fig, view.anomaly_frame(), latest)


def short_number(value: Any) -> str:
    """``value`` to 4 significant digits, or to fewer where that takes more than 8 characters (``-0.00053``, not
    ``-0.000533``; ``-1.2e-05``): a column of the last-step table holds it on a line."""
    for digits in (4, 3, 2, 1):
        text = f"{value:.{digits}g}"
        if len(text) <= 8:
            return text
    return text


def shown_latest(latest: pd.DataFrame) -> Any:
    """The last-step table (:attr:`Page.latest`) as a page shows it, in the columns of :data:`LATEST_COLUMNS`: a
    pandas ``Styler`` whose statistics read to 4 significant digits (:func:`short_number`) and whose sites may
    break over two lines after a dot or an underscore, each with the interventions on it then (the table's
    ``intervention`` column, where it has one) on a line of its own under it. An empty table is returned as it
    is. The cells' values (what a copy takes) are the table's own."""
    shown = latest.reindex(columns=LATEST_COLUMNS)
    if shown.empty:
        return shown

    def site(name: Any) -> str:
        return breakable(name, _SITE_JOINT)

    styled = shown.style.format({"site": site, **{c: short_number for c in LATEST_COLUMNS[2:]}})
    marks = latest["intervention"] if "intervention" in latest else pd.Series("", index=latest.index)
    for index, mark in marks.items():
        if mark:  # (each row's own: a formatter is given the cell's value alone)
            styled.format(lambda name, mark=mark: f"{site(name)}<br><small>{html.escape(mark, quote=False)}</small>",
                          subset=pd.IndexSlice[[index], ["site"]])
    return styled


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


#: The plots of a run page, in VIEW_OUTPUTS' order: those :func:`starting_plots` fills.
PLOTS = ("metrics", "series", "distribution", "heatmap")


def starting_plots(label: str) -> tuple:
    """The page's plots (:data:`PLOTS`) as Start sends them with the header that says the run is running:
    each says the run is starting, until the run's first drawing replaces it (not "No run on this page"
    beside a header that names one)."""
    empty = figures.empty_figure(f"{label} is starting: its views are drawn here as its steps are recorded.")
    return tuple(plot_data(empty) for _ in PLOTS)


def live_header(run: LiveRun) -> str:
    """A live run's page header: the view's (state, step of total, pace), where the run records, and
    its instrumentation errors."""
    text = figures.header_markdown(run.view)
    if run.watch.store is not None:
        text += f"\n\n{run.recorded_to()}"
    else:  # (said, not left out: a new user looks for it in the Runs tab, where it is not)
        text += ("\n\n_not recorded: started without a run name, it is kept in this app's memory only (the Runs "
                 "tab cannot replay, compare or export it)_")
    if run.watch.errors:
        text += (f"\n\n{len(run.watch.errors)} instrumentation error(s); the first: "
                 f"`{run.watch.errors[0]['error']}`")
    return text


#: The components a drawing of a run page updates, in the order the handlers return them.
VIEW_OUTPUTS = ("header", "anomaly", "jump", "metric_names", "metrics", "kind", "sites", "series", "site_note",
                "dist_site", "distribution", "dist_note", "heat_kind", "heatmap", "anomalies", "latest", "log_sites",
                "log_metrics")
#: The controls a drawing reads, in order.
CONTROLS = ("metric_names", "smoothing", "log_metrics", "kind", "stat", "sites", "log_sites", "dist_site",
            "heat_kind", "heat_stat", "heat_log")


#: The views a timer's tick paces: the plots sent only while in the page's view (the browser says which:
#: the tick's ``in_view``; :data:`IN_VIEW_ONLY`), and all but the metrics every :data:`HEAVY_TICKS`
#: ticks: the browser redraws a plot whole each time one is sent (an ILQL page's four plots and
#: last-step table each second had kept it busy; docs/performance.md, "The run page"). A plot the page
#: shows empty ("No grad_output rows yet.") is not paced: it is drawn at the first tick that has data
#: for it, in view or not (held back, it said so until scrolled to and a tick came, of a run that had rows).
PACED = ("metrics", "series", "distribution", "heatmap", "latest")
#: Of those, the ones held back while out of view (the plots, each redrawn whole; the table, lighter, is read
#: where it is, without a scroll).
IN_VIEW_ONLY = PACED[:4]
#: Ticks between two drawings of a paced view other than the metrics (a tick is a second).
HEAVY_TICKS = 5


def new_page_state() -> dict[str, Any]:
    """What a page remembers of its views: whether the metric and site pickers follow the view's
    defaults (until the user picks), the per-site log y the figure's choice and the metrics' each panel's, each box
    saying what was drawn (until the user sets it),
    the run and steps it last drew, what its pickers and tables were sent, the ticks it drew, the
    version and tick each paced view was last sent at (``paced``), and the plots it shows empty, with
    the figure each was sent (``empty``)."""
    return {"auto_metrics": True, "auto_sites": True, "auto_log_sites": True, "auto_log_metrics": True,
            "version": None, "sent": {}, "tick": 0, "paced": {}, "empty": {}}


def page_controls(state: dict | None, values: Sequence[Any]) -> Controls:
    """The :class:`Controls` of a page's widget values (in :data:`CONTROLS` order)."""
    state = state or new_page_state()
    v = dict(zip(CONTROLS, values))
    return Controls(metrics=None if state.get("auto_metrics", True) else v["metric_names"],
                    smoothing=v["smoothing"], kind=v["kind"], statistic=v["stat"],
                    log_metrics=None if state.get("auto_log_metrics", True) else v["log_metrics"],
                    sites=None if state.get("auto_sites", True) else v["sites"],
                    log_sites=None if state.get("auto_log_sites", True) else v["log_sites"],
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


def page_outputs(page: Page, state: dict, jumped: Controls | None = None, revision: Any = None,
                 held: Collection[str] = ()) -> tuple:
    """The update of each of :data:`VIEW_OUTPUTS`; a picker is sent only when its choices or value
    changed (so one the user has open is left alone), the kinds only when a jump sets them, the
    notes, the banner and the tables only when they changed, an empty plot only when it says something
    else than the page shows, and nothing of the views named in ``held`` (:data:`PACED`), nor of the pickers and
    notes that say what a held plot draws (its chips name its lines: sent apart, they would name another pick's)."""
    import gradio as gr

    sent = state.setdefault("sent", {})
    # (the paced views sent are up to date at the page's version from here: redraw's ticks read it)
    paced = state["paced"] = dict(state.get("paced") or {})
    empty = state["empty"] = dict(state.get("empty") or {})  # output -> the empty figure it shows, as JSON

    def picker(key: str, choices: list[str], value: Any, plot_output: str):
        if plot_output in held or sent.get(key) == (choices, value):
            return gr.skip()
        sent[key] = (list(choices), value)
        return gr.Dropdown(choices=choices, value=value, allow_custom_value=True)

    def plot(figure: dict[str, Any] | None, name: str, output: str):
        if output in held or figure is None:
            return gr.skip()
        paced[output] = (state.get("version"), state.get("tick", 0))
        shown_empty = None if figure["data"] else figures.to_json(figure)
        if shown_empty is not None and empty.get(output) == shown_empty:
            return gr.skip()  # (a tick that has no data for it yet: the page says so already)
        if shown_empty is None:
            empty.pop(output, None)
        else:
            empty[output] = shown_empty
        return plot_data(figure, None if revision is None else f"{revision} {name}")

    def table(frame: pd.DataFrame, key: str):
        if key in held:
            return gr.skip()
        if key in PACED:
            paced[key] = (state.get("version"), state.get("tick", 0))
        shown_now = frame.to_json()
        if sent.get(key) == shown_now:
            return gr.skip()
        sent[key] = shown_now
        return frame

    def shown_table(frame: pd.DataFrame, key: str):
        if table(frame, key) is not frame:  # (a skip: it is as sent, or held)
            return gr.skip()
        return shown_latest(frame)

    def changed(key: str, value: Any, update: Any = None, plot_output: str | None = None):
        if plot_output in held or sent.get(key, ()) == value:  # (the page keeps what it has: each one sent costs)
            return gr.skip()
        sent[key] = value
        return value if update is None else update

    jump = page.first_anomaly is not None
    if not state.get("auto_log_sites", True):  # (the user's box: what the figure chooses once it is again is sent)
        sent.pop("log_sites", None)
    if not state.get("auto_log_metrics", True):
        sent.pop("log_metrics", None)
    return (page.header, changed("anomaly", page.anomaly), changed("jump", jump, gr.Button(visible=jump)),
            picker("metric_names", page.metric_choices, page.metrics, "metrics"),
            plot(page.metrics_figure, "metrics", "metrics"), jumped.kind if jumped else gr.skip(),
            picker("sites", page.site_choices, page.sites, "series"), plot(page.sites_figure, "sites", "series"),
            changed("site_note", page.site_note, plot_output="series"),
            picker("dist_site", page.dist_choices, page.dist_site, "distribution"),
            plot(page.distribution_figure, "distribution", "distribution"),
            changed("dist_note", page.dist_note, plot_output="distribution"),
            jumped.heat_kind if jumped else gr.skip(), plot(page.heatmap_figure, "heatmap", "heatmap"),
            table(page.anomalies, "anomalies"), shown_table(page.latest, "latest"),
            # (the box says the scale the figure chose, while it is the figure's to choose)
            gr.skip() if page.log_sites is None else changed("log_sites", page.log_sites),
            # (and the metrics' box, ticked where a panel chose log; unticked, every panel linear, ticked every one log)
            gr.skip() if page.log_metrics is None else changed("log_metrics", page.log_metrics))


def jump_controls(view: RunView | None, controls: Controls) -> Controls | None:
    """``controls`` moved to the first NaN/Inf's site: its kind, that site alone, its distribution,
    the heatmap of its kind; None while the run has none."""
    first = view.first_anomaly if view is not None else None
    if first is None:
        return None
    return dataclasses.replace(controls, kind=first["kind"], sites=[first["site"]], dist_site=first["site"],
                               heat_kind=first["kind"])


def recording_of(run: Any, view: RunView) -> str:
    """What a page draws, as its kept scales, its version and its plots' zoom are keyed: the run it names
    (``run``), and of a stored run, which recording of its path (:attr:`RunView.started`): a run recorded again
    where an old one was removed is another run, whose scales and zoom are its own."""
    return str(run) if view.started is None else f"{run} (started {view.started!r})"


def redraw(view: RunView | None, header: str, run: Any, state: dict | None, values: Sequence[Any],
           force: bool = True, jump: bool = False, change: dict | None = None,
           interventions: pd.DataFrame | None = None, in_view: Collection[str] | None = None) -> tuple:
    """One drawing of a run page: ``(new page state, *updates of VIEW_OUTPUTS)``.

    ``view`` is the page's run's views (None: no run; ``header`` says why), ``run`` what names it,
    ``values`` the controls' values (:data:`CONTROLS`). Unless ``force``d (a control changed), the
    drawing is a tick: of the :data:`PACED` views, only those in ``in_view`` (None: all) whose steps
    changed since they were sent are sent, the metrics each tick, the others every
    :data:`HEAVY_TICKS` ticks; a plot the page shows empty is sent at the first tick with data for it,
    in view or not, and a run no longer running gets every view sent that is behind, in view or not.
    A page that drew this run at these steps already, with no view behind, is sent nothing.
    ``jump`` moves the views to the first NaN/Inf; ``change`` updates the page state first (a picker
    the user took over).
    """
    state = dict(state or new_page_state())
    state.update(change or {})
    if view is None:
        state["version"] = None
        page = draw_page(RunView(), page_controls(state, values), header=header)
        # (its figures say why nothing is drawn, as the header does: not "No metrics yet.", as if a run had none)
        empty = figures.empty_figure(header.replace("**", "").strip("_"))
        page = dataclasses.replace(page, metrics_figure=empty, sites_figure=empty, distribution_figure=empty,
                                   heatmap_figure=empty)
        return state, *page_outputs(page, state)
    recording = recording_of(run, view)
    version = (recording, view.steps_fed, view.status, view.dropped)
    paced = state.get("paced") or {}  # view -> (version, tick) it was last sent at (page_outputs keeps it)
    empty = state.get("empty") or {}  # the plots the page shows empty (page_outputs keeps it)
    tick = state["tick"] = state.get("tick", 0) + 1
    if force:
        due = set(PACED)
    else:
        settled = view.status != "running"  # (no tick may follow: every view is brought up to date)

        def is_due(name: str) -> bool:
            sent_version, sent_tick = paced.get(name, (None, -HEAVY_TICKS))
            return sent_version != version and (settled or name in empty or (
                (in_view is None or name in in_view or name not in IN_VIEW_ONLY)
                and (name == "metrics" or tick - sent_tick >= HEAVY_TICKS)))

        due = {name for name in PACED if is_due(name)}
        if version == state.get("version") and not due:
            return state, *skips(len(VIEW_OUTPUTS))  # nothing new: nothing sent
    state["version"] = version
    controls = page_controls(state, values)
    jumped = jump_controls(view, controls) if jump else None
    if jumped is not None:
        state["auto_sites"] = False
        controls = jumped
    controls = with_kept_scales(controls, state, recording)
    state["site_colors"] = colors = dict(state.get("site_colors") or {})  # (a site keeps its colour)
    page = draw_page(view, controls, header=header, interventions=interventions, site_colors=colors, plots=due)
    if state.get("auto_log_sites", True) and page.sites_figure is not None:
        state["kept_log_sites"] = figures.keep_scale(state.get("kept_log_sites"),
                                                     _site_scale_for(recording, controls), page.sites_figure)
    if state.get("auto_log_metrics", True) and page.metrics_figure is not None:
        state["kept_log_metrics"] = figures.keep_scales(state.get("kept_log_metrics"), [recording],
                                                        page.metrics_figure)
    return state, *page_outputs(page, state, jumped, revision=recording, held=set(PACED) - due)


def _site_scale_for(recording: str, controls: Controls) -> list:
    """What the per-site figure's scale is kept for (:func:`with_kept_scales`)."""
    return [recording, controls.kind, controls.statistic, None if controls.sites is None else list(controls.sites)]


def with_kept_scales(controls: Controls, state: dict, recording: str) -> Controls:
    """``controls`` with the scales the page (``state``) kept for ``recording`` (:func:`recording_of`) where it
    leaves them to the figures, for every drawing of the page (a tick, a control changed, a finding picked). The
    per-site figure's is kept for the recording, kind, statistic and the sites the user picked once its lines are
    long enough to settle it: ticks that bring more steps do not switch it between linear and log; another pick of
    sites is the figure's to choose again. The metrics' panels the same, each kept for the recording once settled."""
    if controls.log_sites is None:
        kept = figures.kept_scale(state.get("kept_log_sites"), _site_scale_for(recording, controls))
        controls = dataclasses.replace(controls, kept_log_sites=kept)
    if controls.log_metrics is None:
        controls = dataclasses.replace(controls, kept_log_metrics=figures.kept_scales(state.get("kept_log_metrics"),
                                                                                      [recording]))
    return controls


def skips(n: int) -> tuple:
    """``n`` updates that leave their components as they are."""
    import gradio as gr

    return tuple(gr.skip() for _ in range(n))
