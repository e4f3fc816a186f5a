"""Figures of the view layer (:mod:`workbench.ui.views`), drawn with Plotly.

Plotly because one figure renders natively and interactively in both front-ends: Gradio's
``gr.Plot`` and JupyterLab's own Plotly renderer show the same JSON with hover values, zoom,
pan and legend toggling, where Gradio's built-in plots exist only in Gradio and matplotlib
draws still images. A figure's data are the view's bounded histories, so its size does not
grow with the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.ui.views import PERCENTILES, RunView

__all__ = ["header_markdown", "metrics_figure", "sites_figure", "heatmap_figure", "distribution_figure",
           "empty_figure"]

_HEIGHT = 320
_LAYOUT = dict(margin=dict(l=50, r=20, t=40, b=40), hovermode="x unified", template="plotly_white")


def empty_figure(message: str) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#666"))
    fig.update_layout(height=_HEIGHT, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      margin=dict(l=20, r=20, t=20, b=20), template="plotly_white")
    return fig


def header_markdown(view: RunView) -> str:
    """The run header: label, status, step of total with a progress bar, steps/s, time left."""
    h = view.header()
    parts = [f"**{h['label']}**" if h["label"] else "", f"`{h['status']}`"]
    if h["total"]:
        fraction = min(h["step"] / h["total"], 1.0)
        parts.append(f"step {h['step']} of {h['total']} <progress value='{fraction:.3f}' max='1' "
                     f"style='width:12em;vertical-align:middle'></progress> {fraction:.0%}")
    else:
        parts.append(f"step {h['step']}")
    if h["steps_per_s"]:
        parts.append(f"{h['steps_per_s']:.1f} steps/s")
    if h["seconds_left"] is not None:
        parts.append(f"about {_duration(h['seconds_left'])} left")
    if h["dropped"]:
        parts.append(f"{h['dropped']} steps not shown (the page fell behind)")
    text = " · ".join(p for p in parts if p)
    if h["error"]:
        text += f"\n\n```\n{h['error'].strip().splitlines()[-1]}\n```"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def metrics_figure(view: RunView, names: Sequence[str] | None = None, smoothing: float = 0.0,
                   log_y: bool = False, columns: int = 3) -> go.Figure:
    """One small panel per metric: the values (faint where smoothed) and their smoothed line."""
    frame = view.metrics_frame(names, smoothing)
    chosen = list(dict.fromkeys(frame.metric))
    if not chosen:
        return empty_figure("No metrics yet.")
    columns = min(columns, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=chosen, vertical_spacing=0.5 / rows,
                        horizontal_spacing=0.08)
    for i, name in enumerate(chosen):
        data = frame[frame.metric == name]
        row, col = i // columns + 1, i % columns + 1
        raw = dict(width=1, color="#1f77b4")
        fig.add_trace(go.Scatter(x=data.step, y=data.value, name=name, mode="lines", line=raw,
                                 opacity=0.35 if smoothing else 1.0, showlegend=False,
                                 hovertemplate=f"{name}: %{{y:.4g}}<extra>step %{{x}}</extra>"), row=row, col=col)
        if smoothing:
            fig.add_trace(go.Scatter(x=data.step, y=data.smoothed, name=f"{name} (smoothed)", mode="lines",
                                     line=dict(width=2, color="#1f77b4"), showlegend=False,
                                     hovertemplate=f"{name}, smoothed: %{{y:.4g}}<extra>step %{{x}}</extra>"),
                          row=row, col=col)
    fig.update_xaxes(tickformat="d", rangemode="tozero")
    if log_y:
        fig.update_yaxes(type="log")
    fig.update_layout(height=max(_HEIGHT, 230 * rows), **_LAYOUT)
    return fig


def sites_figure(view: RunView, kind: str, statistic: str, sites: Sequence[str] | None = None,
                 log_y: bool = False) -> go.Figure:
    """One statistic per call site over steps; a thinned stretch shows its min-max as a band."""
    frame = view.site_series(kind, statistic, sites)
    if frame.empty:
        return empty_figure(f"No {kind} rows yet.")
    fig = go.Figure()
    for i, (site, data) in enumerate(frame.groupby("site", sort=False)):
        color = _color(i)
        if (data.hi > data.lo).any():  # merged points: their envelope
            fig.add_trace(go.Scatter(x=np.concatenate([data.step, data.step[::-1]]),
                                     y=np.concatenate([data.hi, data.lo[::-1]]), fill="toself", mode="none",
                                     fillcolor=color, opacity=0.15, hoverinfo="skip", showlegend=False,
                                     legendgroup=site))
        fig.add_trace(go.Scatter(x=data.step, y=data.value, name=site, mode="lines", line=dict(color=color),
                                 legendgroup=site, hovertemplate=f"{site}: %{{y:.4g}}<extra></extra>"))
    fig.update_xaxes(title="step", tickformat="d")
    fig.update_yaxes(title=statistic, type="log" if log_y else "linear")
    fig.update_layout(height=_HEIGHT + 60, title=f"{kind}: {statistic} per call site", legend=dict(font=dict(size=10)),
                      **_LAYOUT)
    return fig


def heatmap_figure(view: RunView, kind: str, statistic: str, log: bool = True) -> go.Figure:
    """A statistic of every call site (rows, in forward order) over steps (columns): vanishing or
    exploding gradients and dead units at a glance. ``log``: log10 of the magnitude."""
    names, steps, values = view.heatmap(kind, statistic)
    if not names or not len(steps):
        return empty_figure(f"No {kind} rows yet.")
    shown = values.astype(np.float64)
    label = statistic
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.log10(np.abs(shown))
        shown[~np.isfinite(shown)] = np.nan
        label = f"log10 |{statistic}|"
    fig = go.Figure(go.Heatmap(z=shown, x=steps, y=names, colorscale="Viridis", colorbar=dict(title=label),
                               customdata=values, hoverongaps=False,
                               hovertemplate="%{y}<br>step %{x}<br>" + statistic + " %{customdata:.4g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=9))  # the first site on top
    fig.update_xaxes(title="step", tickformat="d")
    fig.update_layout(height=max(_HEIGHT, min(14 * len(names) + 120, 1400)),
                      title=f"{kind}: {label}, every call site in forward order", **_LAYOUT)
    return fig


def distribution_figure(view: RunView, kind: str, site: str) -> go.Figure:
    """A site's distribution over time from its histograms: TensorBoard's percentile bands
    (left) and the step x value density (right)."""
    bands, steps, grid, density = view.distribution(kind, site)
    if bands.empty:
        return empty_figure(f"No histograms of {kind} at {site}: record with histograms on.")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("percentiles", "density"), horizontal_spacing=0.1)
    pairs = [(0, 100), (7, 93), (16, 84), (31, 69)]
    for lo, hi in pairs:
        fig.add_trace(go.Scatter(x=bands.step, y=bands[f"p{hi}"], mode="lines", line=dict(width=0),
                                 showlegend=False, hoverinfo="skip"), row=1, col=1)
        fig.add_trace(go.Scatter(x=bands.step, y=bands[f"p{lo}"], mode="lines", line=dict(width=0),
                                 fill="tonexty", fillcolor="rgba(31,119,180,0.18)", name=f"p{lo}-p{hi}",
                                 hoverinfo="skip", showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=bands.step, y=bands.p50, mode="lines", name="median", line=dict(color="#1f77b4"),
                             customdata=bands[[f"p{p}" for p in PERCENTILES]].to_numpy(),
                             hovertemplate="median %{y:.4g}<br>min %{customdata[0]:.4g}, max %{customdata[8]:.4g}"
                                           "<extra>step %{x}</extra>"), row=1, col=1)
    centers = (grid[:-1] + grid[1:]) / 2
    total = density.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, density / total, np.nan)
    fig.add_trace(go.Heatmap(x=steps, y=centers, z=share.T, colorscale="Blues", showscale=False,
                             hovertemplate="step %{x}<br>value %{y:.4g}<br>share %{z:.3f}<extra></extra>"),
                  row=1, col=2)
    fig.update_xaxes(title="step", tickformat="d")
    fig.update_layout(height=_HEIGHT + 40, title=f"{kind} at {site}: distribution over steps", **_LAYOUT)
    return fig


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")
    return palette[i % len(palette)]
