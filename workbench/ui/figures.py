"""Figures of the view layer (:mod:`workbench.ui.views`), as Plotly figure specs.

Plotly because one figure renders natively and interactively in both front-ends: Gradio's
``gr.Plot`` and JupyterLab's own Plotly renderer show the same JSON with hover values, zoom,
pan and legend toggling, where Gradio's built-in plots exist only in Gradio and matplotlib
draws still images.

A figure is the plain spec Plotly's JavaScript draws (``{"data": [...], "layout": {...}}``),
built here directly, not as ``plotly.graph_objects``, which validate every property on every
refresh, on the thread that serves the page beside the training (bench/dashboard.py measures a
refresh; ``go.Figure(spec)`` gives the validated object when one is wanted). Arrays go as
Plotly's typed arrays (base64 of float32, steps as int32): a figure's size is that of the view's
bounded histories, which does not grow with the run.

Examples:
    >>> import workbench
    >>> from workbench.ui import figures
    >>> from workbench.ui.views import RunView
    >>> exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    >>> _ = exp.run(5, store="runs/fig", progress=False)
    >>> view = RunView.from_run(workbench.load_run("runs/fig"))
    >>> spec = figures.metrics_figure(view)
    >>> sorted(spec), [trace["name"] for trace in spec["data"]]
    (['data', 'layout'], ['accuracy', 'loss'])
    >>> figures.values(spec["data"][0]["x"])
    array([1, 2, 3, 4, 5], dtype=int32)
    >>> figures.heatmap_figure(view, "grad_output", "norm")["data"][0]["y"]
    ['layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4']
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument.interventions import MARKER
from workbench.ui.views import ENDED, PERCENTILES, RunView

__all__ = ["header_markdown", "error_parts", "error_line", "error_markdown", "code_block",
           "site_note", "metrics_figure", "sites_figure", "heatmap_figure", "distribution_figure",
           "compare_metrics_figure", "compare_site_figure", "steady_colors", "drawn_log", "shade_interventions",
           "empty_figure",
           "to_json", "values"]

Figure = dict[str, Any]
_HEIGHT = 320
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf")
_FONT = dict(family="sans-serif", size=12)


def _layout(height: int, title: str | None = None, **more: Any) -> dict[str, Any]:
    layout = {"height": height, "margin": dict(l=55, r=20, t=45 if title else 25, b=40), "hovermode": "x unified",
              "font": _FONT, "plot_bgcolor": "white", "paper_bgcolor": "white", **more}
    if title:
        layout["title"] = dict(text=title, font=dict(size=14), x=0.01)
    return layout


def _axis(**more: Any) -> dict[str, Any]:
    return dict(gridcolor="#e5e5e5", zeroline=False, linecolor="#999", **more)


def _value_axis(log: bool, values: Any, **more: Any) -> dict[str, Any]:
    """An axis of ``values``, on a log scale or a linear one. A log axis that reaches past 10⁴ or below 10⁻³
    labels its ticks as powers of ten (10³, 10⁶, 10¹⁸): Plotly's default wrote 1000, 1M, 1B, 1T and then 10¹⁵,
    two notations on one axis, and 100µ, 1n for small values. Within them it keeps plain numbers (0.1, 1, 10)."""
    if not log:
        return _axis(type="linear", **more)
    shown = np.abs(np.asarray(values, dtype=float))
    shown = shown[np.isfinite(shown) & (shown > 0)]
    if len(shown) and (shown.max() >= 1e4 or shown.min() < 1e-3):
        more["exponentformat"] = "power"
    return _axis(type="log", **more)


def _steps_axis(steps: Any, **more: Any) -> dict[str, Any]:
    """An axis of steps: whole numbers; over a few steps one tick each (Plotly would put ticks
    between them, each labelled with the step it rounds to: 1 2 2 3 3)."""
    steps = np.asarray(steps)
    if len(steps) and steps.max() - steps.min() <= 10:
        more.update(tick0=int(steps.min()), dtick=1)
    return _axis(tickformat="d", **more)


#: A line of fewer points than this draws each point too: a metric logged every 50 steps, in a short
#: run, is one point, which a line alone does not show.
FEW_POINTS = 20


def _line(steps: Any, values: Any, color: str, width: float, **more: Any) -> dict[str, Any]:
    """A scatter trace of ``values`` over ``steps`` as a line, with a marker at each point where there
    are fewer than :data:`FEW_POINTS`."""
    few = len(steps) < FEW_POINTS
    return dict(type="scatter", mode="lines+markers" if few else "lines", x=_array(steps), y=_array(values),
                line=dict(color=color, width=width), **({"marker": dict(color=color, size=5)} if few else {}),
                **more)


def _array(values: Any) -> dict[str, str]:
    """Plotly's typed array: float32 (NaN draws a gap; a value beyond float32's range is +-inf, with no
    overflow warning) or int64 steps, base64-encoded."""
    array = np.asarray(values)
    with np.errstate(over="ignore"):
        array = np.ascontiguousarray(array, dtype=np.int32 if array.dtype.kind in "iu" else np.float32)
    return {"dtype": "i4" if array.dtype == np.int32 else "f4", "bdata": base64.b64encode(array).decode(),
            **({"shape": ", ".join(map(str, array.shape))} if array.ndim > 1 else {})}


def values(data: Any) -> np.ndarray:
    """A figure's array (a typed array or a list) as numpy: what the page draws.

    Args:
        data: a trace's ``x``, ``y`` or ``z``: Plotly's typed array (``bdata``, ``dtype``,
            ``shape``) or a plain list.

    Returns:
        The values, shaped as the page reads them.
    """
    if isinstance(data, dict) and "bdata" in data:
        array = np.frombuffer(base64.b64decode(data["bdata"]), dtype={"f4": np.float32, "i4": np.int32}[data["dtype"]])
        return array.reshape([int(n) for n in data["shape"].split(",")]) if "shape" in data else array
    return np.asarray(data)


def to_json(figure: Figure) -> str:
    """The figure as the JSON a page receives.

    Args:
        figure: a figure spec of this module.

    Returns:
        Compact JSON (no NaN: the arrays carry them as typed arrays).
    """
    return json.dumps(figure, separators=(",", ":"), allow_nan=False)


def empty_figure(message: str) -> Figure:
    """A blank figure that says why it is blank.

    Args:
        message: the text shown in its middle.

    Returns:
        The figure spec.
    """
    return {"data": [], "layout": _layout(_HEIGHT // 2, xaxis=dict(visible=False), yaxis=dict(visible=False),
                                          annotations=[dict(text=message, showarrow=False, x=0.5, y=0.5,
                                                            xref="paper", yref="paper",
                                                            font=dict(size=14, color="#666"))])}


#: A running run whose steps stopped arriving this many seconds ago says so in its header.
IDLE_SECONDS = 10.0


def header_markdown(view: RunView) -> str:
    """The run header: label, status, step of total with a progress bar, steps/s, time left.

    Args:
        view: the run's views.

    Returns:
        Markdown (with an HTML ``<progress>`` bar); a failed run's last error line below it.
    """
    h = view.header()
    parts = [f"**{h['label']}**" if h["label"] else "", f"`{h['status']}`"]
    asked = h["total"] - h["first_step"] if h["total"] is not None else None  # (the steps this run takes)
    if asked is not None and asked <= 0:  # (exp.start(0): no step of its own, whatever the experiment took before)
        parts.append(f"no steps taken ({max(asked, 0)} asked)")
    elif asked is not None:  # (the progress of this run's steps: a run continuing an experiment starts at 0%)
        fraction = min(max(h["step"] - h["first_step"], 0) / asked, 1.0)
        parts.append(f"step {h['step']} of {h['total']} <progress value='{fraction:.3f}' max='1' "
                     f"style='width:12em;vertical-align:middle'></progress> {fraction:.0%}")
    else:
        parts.append(f"step {h['step']}")
    if h["steps_per_s"]:  # (the pace it trains at; once paused or ended, the pace it trained at)
        ran = "" if h["status"] in ("running", "stopping") else "ran at "
        parts.append(f"{ran}{h['steps_per_s']:.1f} steps/s")
    if h["seconds_left"] is not None:
        parts.append(f"about {_duration(h['seconds_left'])} left")
    if h["status"] == "running" and h["idle_s"] is not None and h["idle_s"] >= IDLE_SECONDS:
        parts.append(f"no new step for {_duration(h['idle_s'])}")  # (a watch open after its training cell)
    if h["dropped"]:
        parts.append(f"{h['dropped']} steps not shown (the page fell behind)")
    # each part after the label kept on one line: a narrow header breaks between them, not inside
    # ("step 12" | "of 300", a bar apart from its percentage)
    label, rest = parts[0], [f"<span style='white-space:nowrap'>{part}</span>" for part in parts[1:]]
    text = " · ".join([label, *rest] if label else rest)
    return text + error_markdown(h["error"])


def code_block(text: str) -> str:
    """``text`` as a Markdown code block, shown as it is: its fence longer than any run of backticks in it (a line of
    three backticks in an error's message closed a fence of three, the lines after it read as Markdown and HTML).

    Args:
        text: what the block shows.

    Returns:
        The block's Markdown, from its opening fence to its closing one.
    """
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


#: The line a formatted traceback starts with (``traceback.format_exception``); the last one starts the exception
#: raised last (one raised while handling another is chained after it).
TRACEBACK_START = "Traceback (most recent call last):"
# (a line of its own: an exception's message may hold another's, "Original Traceback (most recent call last):" of a
# DataLoader worker's error)
_TRACEBACK_LINE = re.compile(rf"^{re.escape(TRACEBACK_START)}$", re.MULTILINE)
# (an exception group's own exception: the first line under its margin that is not a frame, "  | ExceptionGroup: ...")
_GROUP_EXCEPTION = re.compile(r"^[ |+-]*\| ([A-Za-z_][\w.]*(?:: .*)?)$", re.MULTILINE)


def error_parts(error: str | None) -> tuple[str, str | None]:
    """A run's error (``w.error``, ``run.error``: a message, or a formatted traceback with what the watch added
    after it) as its pages show it: a short message, and the traceback where there is one.

    Args:
        error: the error, or None.

    Returns:
        ``(message, traceback)``: the message is the exception raised last (``ZeroDivisionError: division by
        zero``, its message's lines and its notes), then each line the watch added (``3 step(s) could not be
        stored``), without the frames; a message that is no traceback is itself. ``traceback`` is the whole
        error where it holds one, else None. ``("", None)`` for no error.
    """
    text = (error or "").strip()
    if TRACEBACK_START not in text:
        return text, None
    starts = list(_TRACEBACK_LINE.finditer(text))
    if not starts:  # (an exception group's traceback, each line under its margin: the group's own exception)
        group = _GROUP_EXCEPTION.search(text)
        return group.group(1) if group else text.splitlines()[-1], text
    # (the frames are indented under the header line: the first line after them that is not starts the exception;
    # the rest of its message, indented or not, its notes and what the watch added follow it)
    lines = [line for line in text[starts[-1].end():].splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if not line[:1].isspace()), None)
    return ("\n".join(lines[first:]) if first is not None else text.splitlines()[-1]), text


def error_line(error: str | None) -> str:
    """A run's short error message (:func:`error_parts`) on one line, its lines joined by "; ": said in a sentence
    (the explorer's line under its buttons, a comparison's message).

    Args:
        error: the run's error (``w.error``, ``run.error``), or None.

    Returns:
        The message on one line; "" for no error.
    """
    return "; ".join(line.strip() for line in error_parts(error)[0].splitlines())


def error_markdown(error: str | None) -> str:
    """A run's error as a header shows it (Markdown, a paragraph of its own; "" for none): its short message
    (:func:`error_parts`) in a code block, and, where the error holds a traceback, the whole of it folded under
    it ("traceback", opened by a click). One rule for the app's pages and the notebook's.

    Args:
        error: the run's error (``w.error``, ``run.error``), or None.

    Returns:
        The Markdown, starting with a blank line; "" for no error.
    """
    message, trace = error_parts(error)
    if not message:
        return ""
    text = f"\n\n{code_block(message)}"
    if trace is not None:
        # (one line of HTML: a blank line inside, as a chained exception's traceback has, would end the HTML block
        # in Markdown and leave the rest read as Markdown; a newline in a <pre> is an entity as well as a character)
        folded = html.escape(trace, quote=False).replace("\n", "&#10;")
        text += (f"\n\n<details class='wb-traceback'><summary>traceback</summary>"
                 f"<pre style='white-space:pre-wrap;font-size:12px'>{folded}</pre></details>")
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _no_metrics(views: Mapping[str, RunView]) -> str:
    """What an empty metrics figure says: a run's :meth:`~RunView.no_metrics`; of runs compared, that none
    recorded any once all have ended. (Runs that have metrics, none of them those asked for: not yet.)"""
    if any(not m.startswith(MARKER) for view in views.values() for m in view.metric_names()):
        return "No metrics yet."
    if len(views) == 1:
        return next(iter(views.values())).no_metrics()
    if views and all(view.status in ENDED for view in views.values()):
        return "None of these runs recorded metrics."
    return "No metrics yet."


def metrics_figure(view: RunView, names: Sequence[str] | None = None, smoothing: float = 0.0,
                   log_y: bool | None = False, columns: int = 3,
                   kept_log: Mapping[str, bool | None] | None = None) -> Figure:
    """One small panel per metric: its values (faint when smoothed) and their smoothed line.

    Args:
        view: the run's views.
        names: the metrics to draw (default: all but the interventions' markers).
        smoothing: TensorBoard's exponential smoothing, in [0, 1).
        log_y: log-scaled y axes; None: each panel chooses, as a per-site figure does (:func:`chosen_scale`):
            log where its values are all positive and an early spike would flatten the rest (:func:`dwarfed`).
        columns: panels per row.
        kept_log: with ``log_y`` None, metric -> the scale kept for its panel (:func:`kept_scales`).

    Returns:
        The figure spec; ``layout.meta.metrics`` names the panels' metrics in order (:func:`keep_scales`).
    """
    return compare_metrics_figure({"": view}, names, smoothing, log_y, columns, kept_log=kept_log)


def steady_colors(names: Sequence[str], kept: Mapping[str, str] | None = None,
                  order: Sequence[str] | None = None) -> dict[str, str]:
    """A colour per line drawn (a run compared, a call site) that stays put from drawing to drawing.

    A name in ``kept`` (the colours of earlier drawings) keeps its colour, unless a name drawn beside
    it has it; a new one takes its own colour, which its place in ``order`` picks (default: in
    ``names``), or when that is taken, the next one neither drawn nor kept by a name not drawn now
    (ten colours: with more names, the next one not drawn). By their places in the drawing alone,
    taking the first run out of a comparison repainted every other, and a site changed colour as
    the sites drawn beside it changed.

    Args:
        names: what is drawn, a colour each.
        kept: name -> its colour in earlier drawings (None: a first drawing).
        order: the names' places that pick their own colours (a model's sites in forward order).

    Returns:
        name -> colour, for each of ``names``.
    """
    place = {name: i for i, name in enumerate(order if order is not None else names)}
    ranked = sorted(names, key=lambda name: place.get(name, len(place)))
    kept = kept or {}
    colors: dict[str, str] = {}
    for name in ranked:
        if kept.get(name) in _PALETTE and kept[name] not in colors.values():
            colors[name] = kept[name]
    reserved = {color for name, color in kept.items() if name not in colors and name not in names}
    for name in (name for name in ranked if name not in colors):
        own = place.get(name, 0) % len(_PALETTE)
        for avoid in (set(colors.values()) | reserved, set(colors.values()), set()):
            free = [i for i in range(len(_PALETTE)) if _PALETTE[i] not in avoid]
            if free:
                colors[name] = _PALETTE[own if own in free else min(free, key=lambda i: (i - own) % len(_PALETTE))]
                break
    return {name: colors[name] for name in names}


def compare_metrics_figure(views: Mapping[str, RunView], names: Sequence[str] | None = None,
                           smoothing: float = 0.0, log_y: bool | None = False, columns: int = 3,
                           colors: Mapping[str, str] | None = None,
                           kept_log: Mapping[str, bool | None] | None = None) -> Figure:
    """One small panel per metric, a line per run; one run's panels are :func:`metrics_figure`'s.

    Args:
        views: run name -> its views.
        names: the metrics to draw (default: every metric of any run but the interventions' markers).
        smoothing: TensorBoard's exponential smoothing, in [0, 1).
        log_y: log-scaled y axes; None: each panel chooses (:func:`metrics_figure`).
        columns: panels per row.
        colors: run name -> its colour (:func:`steady_colors`; default: the runs' order picks them).
        kept_log: with ``log_y`` None, metric -> the scale kept for its panel (:func:`kept_scales`).

    Returns:
        The figure spec.
    """
    colors = steady_colors(list(views), colors)
    if names is None:  # (an intervention's marker is a band over the steps: shade_interventions)
        names = sorted({m for view in views.values() for m in view.metric_names() if not m.startswith(MARKER)})
    strides = _common_strides(views, {run: view.metric_stride() for run, view in views.items()})
    frames = {run: view.metrics_frame(names, smoothing, strides[run]) for run, view in views.items()}
    chosen = sorted({m for frame in frames.values() for m in frame.metric}, key=lambda m: (
        names.index(m) if names is not None and m in names else 0, m))
    if not chosen:
        return empty_figure(_no_metrics(views))
    columns = min(columns, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    gap_x, gap_y = 0.07, 0.5 / rows
    width, height = (1 - gap_x * (columns - 1)) / columns, (1 - gap_y * (rows - 1)) / rows
    several = len(views) > 1
    steps = np.concatenate([f.step[f.metric.isin(chosen)] for f in frames.values()])
    in_legend: set[str] = set()  # (each run once in the legend, in the first panel it has a line in)
    # (the top margin keeps the first row's titles below Plotly's toolbar, which shows over the top right)
    data, layout = [], _layout(max(_HEIGHT, 220 * rows), hovermode="x", showlegend=several, annotations=[],
                               margin=dict(l=55, r=20, t=45, b=50), meta=dict(metrics=list(chosen)))
    for i, name in enumerate(chosen):
        row, col = divmod(i, columns)
        n = "" if i == 0 else str(i + 1)
        x0, y1 = col * (width + gap_x), 1 - row * (height + gap_y)
        bottom = i + columns >= len(chosen)  # (the lowest panel of its column: its x axis is titled)
        # (one range of steps for every panel, zoomed together: a metric evaluated every 50 steps had
        # its own, a lone dot at 49-51 beside the others' 1-200)
        layout[f"xaxis{n}"] = _steps_axis(steps, domain=[x0, x0 + width], anchor=f"y{n}",
                                          **(dict(matches="x") if i else {}),
                                          **(dict(title=dict(text="step", standoff=4)) if bottom else {}))
        panel = pd.concat([f[f.metric == name].assign(site=run)[["site", "value"]] for run, f in frames.items()],
                          ignore_index=True)
        log = bool(log_y) if log_y is not None else chosen_scale(panel, (kept_log or {}).get(name))
        layout[f"yaxis{n}"] = _value_axis(log, panel.value, domain=[y1 - height, y1], anchor=f"x{n}",
                                          **_flat_range(panel.value.to_numpy(), log))
        layout["annotations"].append(dict(text=name, x=x0 + width / 2, y=y1, xref="paper", yref="paper",
                                          xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=13)))
        if not any(np.isfinite(frame.value[frame.metric == name]).any() for frame in frames.values()):
            layout["annotations"].append(_no_finite_value(name, x0 + width / 2, y1 - height / 2))
        for r, (run, frame) in enumerate(frames.items()):
            part = frame[frame.metric == name]
            label = f"{run}: {name}" if several else name
            merged = part[part.hi > part.lo]  # points standing for several steps: their min-max envelope
            if len(merged):  # (else a long run's merged means read smoother than its recent steps)
                data.append(dict(type="scatter", mode="none", fill="toself", xaxis=f"x{n}", yaxis=f"y{n}",
                                 x=_array(np.concatenate([merged.step, merged.step[::-1]])),
                                 y=_array(np.concatenate([merged.hi, merged.lo[::-1]])),
                                 fillcolor=colors[run], opacity=0.15, hoverinfo="skip",
                                 showlegend=False, legendgroup=run))
            color = colors[run]
            common = dict(xaxis=f"x{n}", yaxis=f"y{n}", legendgroup=run)
            legend = several and len(part) > 0 and run not in in_legend
            if legend:
                in_legend.add(run)
            data.append(_line(part.step, part.value, color, 1, **common, name=run if several else name,
                              opacity=0.35 if smoothing else 1.0, showlegend=legend and not smoothing,
                              hovertemplate=f"{label}: %{{y:.4g}}<extra>step %{{x}}</extra>"))
            if smoothing:
                data.append(_line(part.step, part.smoothed, color, 2, **common,
                                  name=run if several else f"{name} (smoothed)", showlegend=legend,
                                  hovertemplate=f"{label}, smoothed: %{{y:.4g}}<extra>step %{{x}}</extra>"))
    return {"data": data, "layout": layout}


#: A run compared with longer ones is drawn in their (wider) buckets if that leaves it this many.
COMPARE_MIN_BUCKETS = 5


def _common_strides(views: Mapping[str, RunView], own: Mapping[str, int]) -> dict[str, int]:
    """The stride each run is drawn at beside the others: runs of different lengths are thinned to
    different strides, so each is drawn in the widest one's buckets, and equal values draw equal
    lines (a short run step by step beside a long one's bucket means differ); but a run too short to
    have :data:`COMPARE_MIN_BUCKETS` such buckets is drawn at its own (beside a 24,000-step run, a
    30-step one was a single point)."""
    widest = max(own.values(), default=1)
    return {run: widest if views[run].last_step >= COMPARE_MIN_BUCKETS * widest else own[run] for run in own}


def _flat_range(values: Any, log: bool) -> dict[str, Any]:
    """A y range around a metric that never changes (a constant learning rate): Plotly's own is
    value +- 1, which draws 3e-4 on the 0 line, and 1e6 with ticks of seven digits."""
    finite = np.asarray(values, np.float64)
    finite = finite[np.isfinite(finite) & ((finite > 0) if log else True)]
    if not len(finite) or finite.max() != finite.min():
        return {}
    value = finite[0]
    if log:
        return {"range": [math.log10(value) - 1, math.log10(value) + 1]}
    pad = abs(value) / 2 or 1.0
    return {"range": [value - pad, value + pad]}


def compare_site_figure(views: Mapping[str, RunView], kind: str, statistic: str, site: str,
                        log_y: bool | None = False, colors: Mapping[str, str] | None = None,
                        kept_log: bool | None = None) -> Figure:
    """One call site's statistic in several runs, a line per run (a run without the site is left out).

    Args:
        views: run name -> its views.
        kind: ``activation``, ``grad_output``, ``param`` or ``param_grad``.
        statistic: a column of ``workbench.ui.views.STATISTICS``.
        site: the call site's name, as `RunView.site_order` lists it.
        log_y: a log-scaled y axis; None: the figure chooses, as :func:`sites_figure` does: log where one
            run's line dwarfs the others (:func:`dwarfed`); its ``layout.yaxis.type`` says which.
        colors: run name -> its colour (:func:`steady_colors`; default: the runs' order picks them).
        kept_log: with ``log_y`` None, the scale kept for what it shows (:func:`chosen_scale`).

    Returns:
        The figure spec; a blank one that says so when no run has the site.
    """
    colors = steady_colors(list(views), colors)
    having = [run for run, view in views.items() if site in view.site_order(kind)]  # (checks the kind)
    strides = _common_strides(views, {run: views[run].site_stride(kind) for run in having})
    parts = {run: views[run].site_series(kind, statistic, [site], stride=strides[run]) for run in having}
    data = []
    for run in views:
        if run not in parts:
            continue
        part = parts[run]
        data.append(_line(part.step, part.value, colors[run], 1.5, name=run,
                          hovertemplate=f"{run}: %{{y:.4g}}<extra></extra>"))
    if not data:
        return empty_figure(f"No run has {kind} rows at {site}.")
    if log_y is None:  # (a line per run: dwarfed reads its lines by their "site")
        log_y = chosen_scale(pd.concat([part.assign(site=run) for run, part in parts.items()], ignore_index=True),
                             kept_log)
    # (the legend names each run's line, one alone too: Plotly hides a legend of one entry, and a comparison whose other
    # runs lack the site drew a line that said nowhere whose it was)
    return {"data": data, "layout": _layout(
        _HEIGHT + 40, f"{kind}: {statistic} at {site}, by run", showlegend=True,
        xaxis=_steps_axis(np.concatenate([values(t["x"]) for t in data]), title=dict(text="step")),
        yaxis=_value_axis(bool(log_y), np.concatenate([part.value for part in parts.values()]),
                          title=dict(text=statistic)))}


#: How many times the typical value of a per-site figure's largest line may be its smallest's before the
#: figure, left to choose its scale, draws a log y: on a linear one the small lines lie flat at zero (a
#: module returning hashes, std about 5e18, beside indices and activations of std about 1).
DWARFS = 1e3
#: How many times its typical value a line's largest may be before a figure left to choose draws a log y: on a
#: linear one the line's usual values lie flat at the bottom, under 1% of its height (a loss spiking to 300 at a
#: learning rate of 1 beside its usual 0.5; a loss falling over orders of magnitude).
SPIKES = 100


def dwarfed(frame: pd.DataFrame) -> bool:
    """Whether a linear y would flatten lines of ``frame`` (``site, value``, as :meth:`RunView.site_series`; a
    metrics panel's, a line per run): one line's median more than :data:`DWARFS` times another's, or a line's
    largest value more than :data:`SPIKES` times its median, and every value positive (a log y shows each of
    them; a zero or a negative value would vanish from it)."""
    finite = frame[np.isfinite(frame.value)]
    if finite.empty or not (finite.value > 0).all():
        return False
    lines = finite.groupby("site", sort=False).value
    typical = lines.median()
    return bool(typical.max() > DWARFS * typical.min() or (lines.max() > SPIKES * typical).any())


def chosen_scale(frame: pd.DataFrame, kept_log: bool | None = None) -> bool:
    """The scale (True: log) a per-site figure left to choose draws ``frame`` at: the one kept for what it shows
    (:func:`keep_scale`), a log one only while every finite value is positive (a zero or a negative value, a
    site's std once its output is constant, would vanish from it: the figure goes linear, as a fresh one does);
    none kept, log where a line dwarfs the others (:func:`dwarfed`)."""
    if kept_log is None:
        return dwarfed(frame)
    return bool(kept_log) and bool((frame.value[np.isfinite(frame.value)] > 0).all())


#: Points (steps) each line of a per-site figure needs before the scale the figure chose (left to choose: log where a
#: line dwarfs the others, :func:`dwarfed`) is kept for what it shows (:func:`keep_scale`): from then on the steps
#: that stream in do not switch it between linear and log (a comparison with a run being recorded jumped so at a
#: List runs, a run page at a tick), until the user's box, or another selection, has it chosen again.
SCALE_SETTLES_AT = 5


def settled_scale(figure: Mapping[str, Any] | None, lines: int = 1, axis: str = "y") -> bool | None:
    """The scale a per-site figure left to choose it chose (True: log; :func:`sites_figure`,
    :func:`compare_site_figure` with ``log_y=None``; ``axis``: a panel of a metrics figure, ``y2``...), once it has
    ``lines`` lines at least of :data:`SCALE_SETTLES_AT` points each (a NaN among them too: a scalar's std is one at
    every step); a line shorter than that, a site whose rows began later than the others', does not hold it back
    (the settling waited for it: a site that came late, or rarely, had the scale switch at each tick until then).
    None before (the steps to come may change it: a comparison's run that has no rows yet brings its line later),
    or for a figure without lines."""
    drawn = [trace for trace in (figure or {}).get("data", ())
             if "lines" in trace.get("mode", "") and trace.get("yaxis", "y") == axis]
    if sum(len(values(trace["y"])) >= SCALE_SETTLES_AT for trace in drawn) < max(lines, 1):
        return None
    return figure["layout"].get("yaxis" + axis[1:], {}).get("type") == "log"


def drawn_log(figure: Mapping[str, Any] | None) -> bool | None:
    """Whether a figure draws a log y, on any of its y axes (a metrics figure's panels each choose their own). A
    page's log y box says so while the figure chooses its scale.

    Args:
        figure: a figure spec of this module, or None.

    Returns:
        True where a y axis is log, False where none is, None for a figure without data (nothing drawn: a page's
        box keeps what it says).
    """
    if not figure or not figure.get("data"):
        return None
    layout = figure.get("layout", {})
    return any(re.fullmatch(r"yaxis\d*", key) and axis.get("type") == "log" for key, axis in layout.items())


def kept_scale(kept: Sequence[Any] | None, selection: Sequence[Any]) -> bool | None:
    """The scale kept for ``selection`` (True: log; what :func:`keep_scale` returned), or None: the figure chooses.

    Args:
        kept: ``[selection, log]`` as :func:`keep_scale` keeps it, or None.
        selection: what the figure shows, as a list (a run page: its run, kind and statistic; a comparison: its
            runs, kind, statistic and site): a scale kept for another is not this one's.
    """
    return bool(kept[1]) if kept is not None and list(kept[0]) == list(selection) else None


def keep_scale(kept: Sequence[Any] | None, selection: Sequence[Any], figure: Mapping[str, Any] | None,
               lines: int = 1) -> list | None:
    """What a page keeps of its per-site figure's scale after drawing ``figure`` for ``selection``: the scale
    kept for it already, else the one the figure chose once settled with ``lines`` lines at least (a comparison:
    one per run; :func:`settled_scale`), else ``kept``.
    Drawn next with :func:`kept_scale`'s answer as its ``kept_log`` (:func:`sites_figure`,
    :func:`compare_site_figure`), the figure of a run that streams in switches its scale at most while its lines are
    shorter than :data:`SCALE_SETTLES_AT` points, and from a kept log to linear once a value is not positive."""
    if kept_scale(kept, selection) is not None:
        return list(kept)
    log = settled_scale(figure, lines)
    return kept if log is None else [list(selection), log]


def kept_scales(kept: Mapping[str, Sequence[Any]] | None, selection: Sequence[Any]) -> dict[str, bool]:
    """The scales kept for a metrics figure's panels (metric -> True: log; :func:`kept_scale` of each)."""
    found = {name: kept_scale(each, selection) for name, each in (kept or {}).items()}
    return {name: log for name, log in found.items() if log is not None}


def keep_scales(kept: Mapping[str, Sequence[Any]] | None, selection: Sequence[Any],
                figure: Mapping[str, Any] | None, lines: int = 1) -> dict[str, Any]:
    """What a page keeps of its metrics figure's scales (:func:`metrics_figure` with ``log_y`` None) after drawing
    ``figure`` for ``selection`` (a run page: its run): :func:`keep_scale` of each panel, metric -> ``[selection,
    log]``, each settled on its own (a metric logged every 50 steps later than the loss)."""
    kept = dict(kept or {})
    for i, name in enumerate(((figure or {}).get("layout", {}).get("meta") or {}).get("metrics", ())):
        axis = "y" if i == 0 else f"y{i + 1}"
        if kept_scale(kept.get(name), selection) is None:
            log = settled_scale(figure, lines, axis)
            if log is not None:
                kept[name] = [list(selection), log]
    return kept


def sites_figure(view: RunView, kind: str, statistic: str, sites: Sequence[str] | None = None,
                 log_y: bool | None = False, colors: dict[str, str] | None = None,
                 kept_log: bool | None = None) -> Figure:
    """One statistic per call site over steps; where steps were merged, a band shows their min
    and max. Click a legend entry to hide a site.

    Args:
        view: the run's views.
        kind: ``activation``, ``grad_output``, ``param`` or ``param_grad``.
        statistic: a column of ``workbench.ui.views.STATISTICS``.
        sites: the call sites to draw (default: the six whose statistic changed most).
        log_y: a log-scaled y axis; None: the figure chooses, log where a line dwarfs the others
            (:func:`dwarfed`); its ``layout.yaxis.type`` says which.
        colors: call site -> its colour in earlier drawings of the same page, which a site drawn again
            keeps; updated with this drawing's (None: colours by forward order alone).
        kept_log: with ``log_y`` None, the scale kept for what it shows (:func:`chosen_scale`).

    Returns:
        The figure spec; a blank one that says so before the first row of that kind.
    """
    frame = view.site_series(kind, statistic, sites)
    if frame.empty:
        return empty_figure(view.no_rows(kind))
    if log_y is None:
        log_y = chosen_scale(frame, kept_log)
    drawn = steady_colors(list(dict.fromkeys(frame.site)), colors, order=view.site_order(kind))
    if colors is not None:
        colors.update(drawn)
    colors = drawn
    data = []
    for site, part in frame.groupby("site", sort=False):
        color = colors[site]
        merged = part[part.hi > part.lo]  # points that stand for several steps: their min-max envelope
        if len(merged):
            data.append(dict(type="scatter", x=_array(np.concatenate([merged.step, merged.step[::-1]])),
                             y=_array(np.concatenate([merged.hi, merged.lo[::-1]])), fill="toself", mode="none",
                             fillcolor=color, opacity=0.15, hoverinfo="skip", showlegend=False, legendgroup=site))
        data.append(_line(part.step, part.value, color, 1.5, name=site, legendgroup=site,
                          hovertemplate=f"{site}: %{{y:.4g}}<extra></extra>"))
    layout = _layout(
        _HEIGHT + 40, f"{kind}: {statistic} per call site", xaxis=_steps_axis(frame.step, title=dict(text="step")),
        yaxis=_value_axis(bool(log_y), frame.value, title=dict(text=statistic)), legend=dict(font=dict(size=10)))
    blank = [site for site, part in frame.groupby("site", sort=False) if not np.isfinite(part.value).any()]
    if blank:  # (a line of NaN or Inf draws nothing: an empty plot would not say why)
        layout["annotations"] = [_no_finite_value(", ".join(blank), 0.5, 0.5)]
    return {"data": data, "layout": layout}


def site_note(view: RunView, kind: str, names: Sequence[str], sites: Sequence[str], unknown: Sequence[str] = (),
              default: bool = True) -> str:
    """The line under a sites figure (Markdown): how many of the call sites it draws and why those,
    the other names of a tensor several call sites return (a ``Dropout(p=0)``, a container returning
    its last child's output: one site, listed once), and picked names that are no such site.

    Args:
        view: the run's views.
        kind: the kind drawn.
        names: every call site of that kind (``view.site_order(kind)``).
        sites: the sites drawn.
        unknown: picked names that are not call sites of this kind.
        default: the sites are the default pick (not the user's).

    Returns:
        One line of Markdown (call sites in backticks).
    """
    if not names:
        return view.no_rows(kind)
    text = f"{len(sites)} of {len(names)} {kind} call sites"
    if len(names) > len(sites) and sites:
        text += (" (by default the ones whose statistic changed most; pick others above)" if default
                 else " (as picked)" + (f": {', '.join(f'`{site}`' for site in sites)}" if len(sites) <= 3 else ""))
    aliases = []
    for site in view.sites[kind]:  # (a tensor several call sites return: one site, its other names)
        if site.aliases and site.name in sites:
            others = " and ".join(f"`{alias}`" for alias in site.aliases)
            aliases.append(f"`{site.name}` is the tensor {others} return{'s' if len(site.aliases) == 1 else ''} too")
    if aliases:
        text += ". " + "; ".join(aliases)
    if unknown:
        text += f". Not {kind} sites, left out: {', '.join(map(repr, unknown[:5]))}"
    return text + "."


def _no_finite_value(what: str, x: float, y: float) -> dict[str, Any]:
    """A note in a plot where ``what`` has no finite value to draw (every point NaN or Inf)."""
    return dict(text=f"{what}: no finite value<br>(NaN or Inf) to draw", x=x, y=y, xref="paper", yref="paper",
                xanchor="center", showarrow=False, font=dict(size=12, color="#b42318"))


#: The colour of the cells of a log heatmap whose value is exactly 0 (no log; blank is a step not recorded).
ZERO_COLOR = "#c8c8c8"
#: A heatmap row's height in pixels and its label's font size: the figure grows with its rows, a
#: label to a row, up to ``HEAT_LABELLED`` rows (an unrolled network has a hundred and more call sites).
HEAT_ROW, HEAT_FONT = 14, 10
#: More rows than this share the height of this many: every k-th row is labelled (the first always),
#: each cell's hover naming its site.
HEAT_LABELLED = 150
#: The height in pixels of a heatmap's box on a page (run_tabs.CSS): a taller heatmap (more than some 40 call sites,
#: an ILQL agent's 117) scrolls inside it, its rows as tall as ever, where it ran some 1,800 px down the page with its
#: steps under the last row. Such a figure has its steps along its top too, and its colour bar in the box's height
#: at its top: read with the first rows, without a scroll.
HEAT_BOX = 720
#: Steps a heatmap draws at most: a longer run's in buckets of as many steps as that takes, each cell
#: their mean. (It sends a cell per site and step, every site: fewer steps than a line of a few sites.)
HEAT_STEPS = 100


#: The statistics a heatmap draws as log10 of their magnitude unless told otherwise: magnitudes that
#: span orders of magnitude over layers (vanishing or exploding gradients); fractions, counts and signed
#: values read as they are (the log of a zero fraction is no value).
LOG_STATISTICS = ("std", "abs_mean", "norm")


def heatmap_figure(view: RunView, kind: str, statistic: str, log: bool | None = None) -> Figure:
    """A statistic of every call site (rows, in forward order) over steps (columns): vanishing or
    exploding gradients and dead units at a glance.

    Args:
        view: the run's views.
        kind: ``activation``, ``grad_output``, ``param`` or ``param_grad``.
        statistic: a column of ``workbench.ui.views.STATISTICS``.
        log: draw log10 of the magnitude (exact zeros, which have none, in grey: :data:`ZERO_COLOR`);
            by default for the statistics of :data:`LOG_STATISTICS`.

    Returns:
        The figure spec; a blank one that says so before the first row of that kind.
    """
    names, steps, matrix, stride = view.heatmap(kind, statistic, HEAT_STEPS)
    if not names or not len(steps):
        return empty_figure(view.no_rows(kind))
    shown, label = matrix.astype(np.float64), statistic
    data = []
    if log is None:
        log = statistic in LOG_STATISTICS
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.log10(np.abs(shown))
        shown[~np.isfinite(shown)] = np.nan
        label = f"log10 |{statistic}|"
    at = "step %{x}" if stride == 1 else f"the {stride} steps to %{{x}}"  # (a cell: a bucket's mean)
    trace = dict(type="heatmap", z=_array(shown), x=_array(steps), y=names, colorscale="Viridis",
                 colorbar=dict(title=dict(text=label)), hoverongaps=False,
                 hovertemplate="%{y}<br>" + at + "<br>" + label + " %{z:.3g}<extra></extra>")
    data.append(trace)
    zeros = matrix == 0
    if log and zeros.any():  # (no log: blank like a step not recorded; grey cells over the blank ones)
        data.append(dict(type="heatmap", z=_array(np.where(zeros, 1.0, np.nan)), x=_array(steps), y=names,
                         colorscale=[[0, ZERO_COLOR], [1, ZERO_COLOR]], showscale=False, hoverongaps=False,
                         name=f"{statistic} = 0",
                         hovertemplate="%{y}<br>" + at + "<br>" + statistic + " exactly 0<extra></extra>"))
    yaxis = _axis(autorange="reversed", tickfont=dict(size=HEAT_FONT), type="category", automargin=True)
    every = -(-len(names) // HEAT_LABELLED)  # (ceil: labelled rows at least HEAT_ROW apart)
    if every > 1:
        yaxis.update(tickmode="array", tickvals=names[::every], ticktext=names[::every])
    title = f"{kind}: {label}, every call site in forward order"
    if stride > 1:
        title += f", a cell the mean of {stride} steps"
    if log and zeros.any():
        title += f"; grey: {statistic} exactly 0"
    if every > 1:
        title += f" (a label every {every} rows: hover a row for its site)"
    height = max(_HEIGHT, HEAT_ROW * min(len(names), HEAT_LABELLED) + 120)
    scrolled = height > HEAT_BOX
    if scrolled:
        title += f"; scroll for all {len(names)} rows"
    layout = _layout(height, title, hovermode="closest", xaxis=_steps_axis(steps, title=dict(text="step")),
                     yaxis=yaxis)
    if scrolled:  # (the steps along the top too, the colour bar in the box's first screen: HEAT_BOX)
        layout["margin"]["t"] = 70
        layout["xaxis2"] = _steps_axis(steps, overlaying="x", matches="x", side="top", showgrid=False)
        # (Plotly draws an axis only under a trace: an invisible one over the first row's cells, the rows' range
        # set, as a marker would widen it by a margin of its own, and no tools to select markers)
        data.append(dict(type="scatter", mode="markers", x=_array(steps[[0, -1]]), y=[names[0], names[0]],
                         xaxis="x2", marker=dict(opacity=0), hoverinfo="skip", showlegend=False,
                         name="steps along the top"))
        yaxis.update(autorange=False, range=[len(names) - 0.5, -0.5])
        layout["modebar"] = dict(remove=["select2d", "lasso2d"])
        trace["colorbar"].update(lenmode="pixels", len=HEAT_BOX - 140, y=1, yanchor="top")
    if not np.isfinite(matrix).any():  # (Plotly draws no cell, no row and a made-up x range: say why, keep both)
        layout["xaxis"]["range"] = _cell_bounds(steps)[[0, -1]].tolist()
        yaxis.update(categoryorder="array", categoryarray=names, range=[len(names) - 0.5, -0.5])
        layout["annotations"] = [_no_finite_value(f"every {kind} cell", 0.5, 0.5)]
    return {"data": data, "layout": layout}


#: A distribution figure draws a site's histograms as recorded when they come in at most this
#: many runs of steps with the same bins; more (a run whose every step has its own range) are
#: re-binned onto one grid.
MAX_SEGMENTS = 16


def _cell_bounds(steps: np.ndarray) -> np.ndarray:
    """The edges along x of one heatmap cell per step: halfway to the steps beside it (the first
    and last as wide as their neighbour's half), so that every step's cell reaches the next."""
    s = steps.astype(np.float64)
    if len(s) == 1:
        return np.array([s[0] - 0.5, s[0] + 0.5])
    middles = (s[:-1] + s[1:]) / 2
    return np.concatenate([[2 * s[0] - middles[0]], middles, [2 * s[-1] - middles[-1]]])


#: The density's colours, by a bin's count relative to its step's peak: about a colour a decade (a
#: thousandth of the peak is a pale blue, a tenth a mid blue), white for none. A linear scale let one bin
#: hold it: a ReLU's exact zeros (half its values, in the first bin) left the rest under a tenth of the
#: peak, drawn all but white, and past the first steps the density panel looked empty while the
#: percentiles beside it spread out.
DENSITY_COLORSCALE = [[0, "#ffffff"], [1e-6, "#eef5fc"], [0.001, "#deebf7"], [0.01, "#c6dbef"], [0.1, "#6baed6"],
                      [0.3, "#2171b5"], [1, "#08306b"]]


def _density_trace(steps: np.ndarray, cells: np.ndarray, edges: np.ndarray, counts: np.ndarray) -> dict:
    """A heatmap of ``counts`` (steps, bins) over ``edges``, a cell a step between ``cells``
    (``len(steps) + 1`` edges along x; without them plotly gives a lone step's cell a width of 1,
    and the columns up to the next segment look blank): each step's density relative to its own
    peak, white (none) to blue (a narrow early distribution would otherwise hold the whole colour
    scale and the later steps look empty), on :data:`DENSITY_COLORSCALE`."""
    peak = counts.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(peak > 0, counts / peak, np.nan)
    return dict(type="heatmap", x=_array(cells), y=_array((edges[:-1] + edges[1:]) / 2), z=_array(relative.T),
                customdata=_array(np.broadcast_to(steps, relative.T.shape)),
                colorscale=DENSITY_COLORSCALE,
                zmin=0, zmax=1, showscale=False, xaxis="x2", yaxis="y2",
                hovertemplate="step %{customdata}<br>value %{y:.4g}<br>density %{z:.2f} of the step's peak"
                              "<extra></extra>")


def distribution_figure(view: RunView, kind: str, site: str) -> Figure:
    """A site's distribution over time from its histograms: TensorBoard's percentile bands
    (left) and the step x value density (right).

    Args:
        view: the run's views.
        kind: ``activation``, ``grad_output``, ``param`` or ``param_grad``.
        site: a call site with histograms (`RunView.histogram_sites`).

    Returns:
        The figure spec; a blank one that says how to record histograms when there are none.
    """
    bands, steps, grid, density = view.distribution(kind, site)
    if bands.empty:
        return empty_figure(f"No histograms of {kind} at {site}: record with histograms on (the default).")
    x = _array(bands.step)
    data = []
    for lo, hi in [(0, 100), (7, 93), (16, 84), (31, 69)]:
        data.append(dict(type="scatter", mode="lines", x=x, y=_array(bands[f"p{hi}"]), line=dict(width=0),
                         showlegend=False, hoverinfo="skip"))
        data.append(dict(type="scatter", mode="lines", x=x, y=_array(bands[f"p{lo}"]), line=dict(width=0),
                         fill="tonexty", fillcolor="rgba(31,119,180,0.18)", showlegend=False, hoverinfo="skip"))
    data.append(dict(type="scatter", mode="lines", x=x, y=_array(bands.p50), name="median",
                     line=dict(color=_PALETTE[0]), customdata=_array(bands[[f"p{p}" for p in PERCENTILES]]),
                     hovertemplate="median %{y:.4g}<br>min %{customdata[0]:.4g}, max %{customdata[8]:.4g}"
                                   "<extra>step %{x}</extra>"))
    # the histograms as recorded: one heatmap per run of steps that kept the site's range (bins
    # of the same edges); a run recorded without kept ranges (every step its own [min, max])
    # is re-binned onto one grid
    segments = view.distribution_segments(kind, site)
    if not segments or len(segments) > MAX_SEGMENTS:
        segments = [(steps, grid, density)]
    # the values' axes open on the steps a few wide ones would squeeze into a few pixels (double-click: all)
    shown, wide = _focus_range(bands)
    cells, at = _cell_bounds(np.concatenate([seg_steps for seg_steps, _, _ in segments])), 0
    for seg_steps, edges, counts in segments:
        seg_cells = cells[at:at + len(seg_steps) + 1].copy()
        at += len(seg_steps)
        if at < len(cells) - 1:  # into half the next cell, which the next segment draws over (two images
            seg_cells[-1] += (cells[at + 1] - cells[at]) / 2  # that only touch can leave a white seam)
        edges, counts = _one_value_visible(bands, seg_steps, edges, counts, shown)
        data.append(_density_trace(seg_steps, seg_cells, edges, counts))
    focus = {} if shown is None else dict(range=shown)
    layout = _layout(_HEIGHT + 40, f"{kind} at {site}: distribution over steps (percentiles, density)",
                     hovermode="closest", showlegend=False,
                     xaxis=_steps_axis(steps, domain=[0, 0.46], title=dict(text="step")),
                     yaxis=_axis(title=dict(text="value"), **focus),
                     xaxis2=_steps_axis(steps, domain=[0.54, 1], anchor="y2", title=dict(text="step"), matches="x"),
                     yaxis2=_axis(anchor="x2", **focus))
    if wide:
        reach = bands[bands.step.isin(wide)]
        named = ", ".join(str(step) for step in wide[:3]) + (f" and {len(wide) - 3} more" if len(wide) > 3 else "")
        layout["annotations"] = [dict(
            text=f"step{'s' if len(wide) > 1 else ''} {named} reach{'es' if len(wide) == 1 else ''} "
                 f"[{reach.p0.min():.3g}, {reach.p100.max():.3g}], out of view: double-click to see every step",
            xref="paper", yref="paper", x=1, y=1.01, xanchor="right", yanchor="bottom", showarrow=False,
            font=dict(size=11, color="#666"))]
    if not np.isfinite(bands[[f"p{p}" for p in PERCENTILES]].to_numpy(np.float64)).any():
        layout["annotations"] = [_no_finite_value(site, 0.5, 0.5)]  # (no bin has a finite edge to draw)
    return {"data": data, "layout": layout}


def _one_value_visible(bands: pd.DataFrame, steps: np.ndarray, edges: np.ndarray, counts: np.ndarray,
                       shown: list[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """A segment whose steps hold one value each (a dead ReLU's zeros), the same one, as one band around
    it 2 % of the figure's range wide: binned over [value, value + 1] (the width a tensor of one value is
    binned over), its first bin would be a line no thicker than a pixel under a wide range."""
    at = bands[bands.step.isin(steps)]
    lows, highs = at.p0.to_numpy(np.float64), at.p100.to_numpy(np.float64)
    if len(at) != len(steps) or not (lows == highs).all() or len(set(lows.tolist())) != 1:
        return edges, counts
    low, high = shown if shown is not None else (np.nanmin(bands.p0), np.nanmax(bands.p100))
    half = 0.01 * (high - low) if high > low else 0.5
    total = counts.sum(axis=1, keepdims=True)  # (two bins: a heatmap infers its rows' height from their spacing)
    return np.array([lows[0] - half, lows[0], lows[0] + half]), np.hstack([total / 2, total / 2])


#: A step whose values span more than this many times what the median step's span (of those that span
#: some) is left out of the value range a distribution figure opens on, where it reaches outside the
#: others' and such steps are few (:data:`WIDE_SHARE` of the steps drawn at most, or one; the newest step
#: never is): one wide step (an initialization, a spike) would squeeze every other step into a few pixels.
WIDE_STEP = 4.0
WIDE_SHARE = 0.1


def _focus_range(bands: pd.DataFrame) -> tuple[list[float] | None, list[int]]:
    """The value range a distribution figure opens on, from its percentile ``bands`` (``step``, ``p0``,
    ``p100`` ...), and the steps left out of it (see :data:`WIDE_STEP`); ``(None, [])`` where every step
    is in view as the axis fits itself. The range is rounded out to a coarse grid (a twentieth of a
    power of ten of its width), so that a live page redraws it rarely: a figure whose range changes
    loses the zoom a person set on it."""
    low, high = bands.p0.to_numpy(np.float64), bands.p100.to_numpy(np.float64)
    span = high - low
    finite = np.isfinite(span)
    spread = span[finite & (span > 0)]  # (steps of one value, a dead unit's zeros, span nothing)
    if finite.sum() < 3 or not len(spread):
        return None, []
    wide = finite & (span > WIDE_STEP * np.median(spread))
    wide[-1] = False
    if not wide.any():
        return None, []
    kept = finite & ~wide
    lo, hi = low[kept].min(), high[kept].max()
    out = wide & ((low < lo) | (high > hi))
    if not out.any() or out.sum() > max(1.0, WIDE_SHARE * finite.sum()):
        return None, []
    grid = 10.0 ** math.floor(math.log10(hi - lo)) / 20 if hi > lo else 0.5
    return [math.floor(lo / grid - 1) * grid, math.ceil(hi / grid + 1) * grid], bands.step[out].astype(int).tolist()


def shade_interventions(figure: Figure, log: pd.DataFrame, last_step: int | None) -> Figure:
    """``figure`` with a band over the steps each intervention of ``log`` was on, on every steps axis,
    labelled with its id on the first.

    Args:
        figure: a figure over steps (:func:`metrics_figure`, :func:`sites_figure`).
        log: an intervention log (``Watch.intervention_log()``, ``Run.interventions()``): ``id``,
            ``from step`` and ``to step``, empty while it is on.
        last_step: the run's last step (where one still on ends).

    Returns:
        The figure with the bands (``figure`` itself when there is nothing to shade).
    """
    layout = figure.get("layout", {})
    axes = [key for key in layout if re.fullmatch(r"xaxis\d*", key)]
    if not len(log) or not axes or not figure.get("data"):
        return figure
    spans = [(row.id, int(row["from step"]), int(row["to step"]) if row["to step"] != "" else
              max(int(last_step or row["from step"]), int(row["from step"]))) for _, row in log.iterrows()]
    spans = [span for span in spans if span[2] >= span[1]]  # (one removed before its first step was never on)
    shapes = list(layout.get("shapes", []))
    for key in axes:
        n = key[5:]
        for label, first, last in spans:
            shape = dict(type="rect", xref=f"x{n}", yref=f"y{n} domain", x0=first - 0.5, x1=last + 0.5, y0=0, y1=1,
                         fillcolor="#f59e0b", opacity=0.14, line=dict(width=0), layer="below")
            if key == axes[0]:
                shape["label"] = dict(text=label, textposition="top left", font=dict(size=10, color="#b45309"))
            shapes.append(shape)
    return {**figure, "layout": {**layout, "shapes": shapes}}
