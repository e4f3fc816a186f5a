"""The activation explorer: what an activation function is, what it does to a distribution, and
which one trains a small network best.

Three parts, each a plain function (or class) returning Plotly figure specs (``{"data", "layout"}``,
as :mod:`workbench.ui.figures` does), used by the app's Explorer tab and callable from Python or
Jupyter, where the figures draw themselves::

    from workbench.ui import explorer
    explorer.curves_figure(["gelu", ("prelu", {"init": 0.1}), "tanh"], x_range=(-4, 4))
    explorer.distribution_figure(explorer.push_through("tanh", source=explorer.normal(0, 2)))
    comparison = explorer.Comparison(["relu", "tanh", "gelu"], steps=200).start()
    comparison.join(); comparison.metrics_figure()

- **Curves**: f(x) and f'(x) of any registered activation (``list_models(family="activation")``,
  the user's own included) over a range, with the spec's parameters; f' from the spec's closed
  form (its ``derivative``) drawn over autograd's, and their largest difference.
- **Distributions**: samples of an input distribution (normal, uniform, or the pre-activations a
  stored run recorded) pushed through the activation: input and output histograms, with the
  fractions dead (f'(x) = 0: no gradient passes), saturated (0 < |f'(x)| < a threshold) and
  negative (f(x) < 0).
- **Which trains best**: ``activation_mlp`` trained with each chosen activation on the same task
  and seed, in the background, one after another or side by side; their loss and accuracy, and per
  hidden layer the share of dead units and the gradient norm, over steps.

The handlers at the top are plain functions, tested without a browser; :func:`layout` places the
tab's components and :func:`wire` connects them.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from workbench.params import check_seed
from workbench.registry import get_spec, list_models
from workbench.ui.figures import (
    _PALETTE,
    _array,
    _axis,
    _layout,
    compare_metrics_figure,
    empty_figure,
    error_line,
)
from workbench.ui.forms import (FIELD_INT_LIMIT, FIELD_INT_MAX, FormField, form_fields, parse_form,
                                pop_up_text, read_whole, shown_whole)
from workbench.ui.pages import PageHoldings, session_of
from workbench.ui.views import FEED_INTERVAL, RunView

__all__ = [
    "Curves", "Pushed", "Comparison", "ExplorerFigure", "activation_names", "explorer_fields",
    "build_activation",
    "curves", "curves_figure", "normal", "uniform", "recorded", "recorded_sites", "push_through",
    "distribution_figure", "layout", "wire",
]

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
DEFAULT_RANGE = (-4.0, 4.0)
DEFAULT_POINTS = 401
MAX_POINTS = 20_001
#: A curve's step between two sample points this many times the steps beside it is a jump, drawn as a gap
JUMP_RATIO = 3
#: A candidate jump's interval is sampled this many times to tell a jump from a steep stretch
JUMP_SAMPLES = 1001
DEFAULT_SAMPLES = 100_000
MAX_SAMPLES = 2_000_000
DEFAULT_SATURATION = 0.05
BINS = 60
#: The least width of a tab's figures: in a narrower window the controls go above them, not beside them
#: (beside them, at 800 px, the f' panel's title ran out of the figure).
FIGURE_MIN_WIDTH = 560
#: The Curves figure's height with up to CURVES_LEGEND_ROOM activations, and what each one more adds: the
#: legend (two lines an activation, under the panels) may take half the figure's height before Plotly
#: scrolls it, and with seven activations in an 800 px window a fixed 420 px hid the last behind a scroll bar.
CURVES_HEIGHT = 420
CURVES_LEGEND_ROOM = 3
CURVES_HEIGHT_PER_ACTIVATION = 56
MAX_COMPARE_STEPS = 100_000
#: The per-layer figure's panels a row: a deeper network's layers wrap to more rows (side by side, depth 8 ran
#: the panels' titles into each other), each row of layers LAYERS_ROW_HEIGHT px high.
LAYERS_PER_ROW = 4
LAYERS_ROW_HEIGHT = 520
MODES = ("one after another", "side by side")
#: The "Which trains best" table's column widths (SUMMARY_COLUMNS): in an 800 px window (a table ~700 px wide) each
#: holds its longest word on a line - an activation's name (activation, threshold), a status (finished), steps of
#: six digits, "accuracy" of a header (which breaks between its words) - where 13%, 11% and 7% broke
#: "activati|on", "finishe|d" and "ste|p".
COMPARE_TABLE_WIDTHS = ["15%", "13%", "10%", "14%", "16%", "14%", "18%"]
SUMMARY_COLUMNS = ["activation", "status", "step", "loss (last step)", "accuracy (last step)", "loss (whole set)",
                   "accuracy (whole set)"]
#: Parameters the explorer leaves at their defaults: they do not change the curve (``inplace``),
#: or a curve has one of them (PReLU draws one slope; ``init`` sets it).
FIXED = ("inplace", "num_parameters")


class ExplorerFigure(dict):
    """A Plotly figure spec (a plain dict: ``{"data": [...], "layout": {...}}``) that Jupyter draws."""

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {PLOTLY_MIMETYPE: dict(self), "text/plain": "<a Plotly figure: run this notebook in JupyterLab>"}


def _zeroed(**more: Any) -> dict[str, Any]:
    """An axis with its zero line drawn (where f and f' cross zero matters here)."""
    return {**_axis(**more), "zeroline": True, "zerolinecolor": "#bbb"}


def _figure(data: list, layout: dict) -> ExplorerFigure:
    return ExplorerFigure(data=data, layout=layout)


# --- checks ----------------------------------------------------------------------

#: What a number field holds when it sends None (it is no number the page can send).
_NO_NUMBER = "the field is empty, or holds a number beyond the floating-point range (such as 1e400)"


def _number(value: Any, what: str, fix: str) -> float:
    if value is None:
        raise ValueError(f"{what} must be a finite number: {_NO_NUMBER}. {fix}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}. {fix}")
    return float(value)


def _whole_or_none(value: Any) -> int | None:
    """``value`` as a whole-number box holds it (forms.read_whole: 1e3 is 1000), or None where it holds none."""
    try:
        return read_whole(value)
    except ValueError:
        return None


def _count(value: Any, what: str, low: int, high: int) -> int:
    if value is None:
        raise ValueError(f"{what} must be a whole number in [{low}, {high:,}]: {_NO_NUMBER}.")
    whole = _whole_or_none(value)
    if whole is None or not low <= whole <= high:
        raise ValueError(f"{what} must be a whole number in [{low}, {high:,}], got "
                         f"{repr(value) if whole is None else shown_whole(value, whole)}.")
    return whole


def _field_seed(value: Any) -> int:
    """A seed from the page's seed field: a whole number in [0, FIELD_INT_MAX], which the field
    carries exactly (the Python API takes seeds up to 2**63 - 1)."""
    if value is None:
        raise ValueError(f"The seed must be a whole number in [0, {FIELD_INT_MAX}]: {_NO_NUMBER}. Enter e.g. 0.")
    whole = _whole_or_none(value)
    if whole is None or not 0 <= whole <= FIELD_INT_MAX:
        why = f": {FIELD_INT_LIMIT}" if whole is not None and whole > FIELD_INT_MAX else ""
        raise ValueError(f"The seed must be a whole number in [0, {FIELD_INT_MAX}], got "
                         f"{repr(value) if whole is None else shown_whole(value, whole)}{why}. "
                         "Enter e.g. 0.")
    return whole


def _check_range(x_range: Any, ends: tuple[str, str] = ("x from", "x to"),
                 example: tuple[int, int] = (-4, 4)) -> tuple[float, float]:
    """``x_range`` as (low, high) floats; ``ends``: what the messages call its ends (the curves' fields, or
    the uniform source's ``low`` and ``high``), ``example``: the range they suggest."""
    if not isinstance(x_range, (tuple, list)) or len(x_range) != 2:
        raise ValueError(f"x_range must be a pair (low, high), got {x_range!r}. Pass e.g. x_range=(-4, 4).")
    low = _number(x_range[0], f"The range's low end ({ends[0]})", f"Enter e.g. {example[0]}.")
    high = _number(x_range[1], f"The range's high end ({ends[1]})", f"Enter e.g. {example[1]}.")
    # The sample points are made in the default dtype (float32): an end beyond its largest value,
    # or a range wider than it (the step between points overflows), would give no curve to draw.
    dtype = torch.get_default_dtype()
    largest = torch.finfo(dtype).max
    for value, end, suggested in ((low, f"low end ({ends[0]})", example[0]), (high, f"high end ({ends[1]})",
                                                                              example[1])):
        if abs(value) > largest:
            raise ValueError(f"The range's {end} must be in [{-largest:.6g}, {largest:.6g}] (the sample points "
                             f"are {str(dtype).removeprefix('torch.')}), got {value:g}. Enter e.g. {suggested}.")
    if not low < high:
        raise ValueError(f"The range must run from low to high, got [{low:g}, {high:g}]. "
                         f"Make {ends[0]} smaller than {ends[1]}, e.g. [{example[0]}, {example[1]}].")
    if not math.isfinite(float(torch.tensor(high, dtype=dtype) - torch.tensor(low, dtype=dtype))):
        raise ValueError(f"The range [{low:g}, {high:g}] is wider than {str(dtype).removeprefix('torch.')} can "
                         f"hold (high - low must be at most {largest:.6g}). Narrow it, e.g. [-1e+38, 1e+38].")
    return low, high


def activation_names() -> list[str]:
    """The registered activations (the user's own included), sorted."""
    return list_models(family="activation")


def _activation_spec(name: Any):
    if not isinstance(name, str):
        raise TypeError(f"An activation is named by its registry name (a string), got {name!r}. "
                        f"The activations: {activation_names()}.")
    spec = get_spec(name)  # an unknown name: ValueError with close matches
    if spec.family != "activation":
        raise ValueError(f"{name!r} is a {spec.family!r} model, not an activation. The activations: "
                         f"{activation_names()} (register yours with family='activation').")
    return spec


def explorer_fields(name: str) -> list[FormField]:
    """The fields of an activation's parameters that change its curve (all but :data:`FIXED`)."""
    return [f for f in form_fields(_activation_spec(name).params) if f.label not in FIXED]


def build_activation(name: str, params: Mapping[str, Any] | None = None) -> nn.Module:
    """Build a registered activation from parameter values (Python values, or a form's raw ones).

    Raises:
        ValueError, TypeError: an unknown activation or parameter, or a bad value (the message
            names it, and what is allowed).
    """
    spec = _activation_spec(name)
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"The parameters of {name!r} are a dict such as {{'init': 0.1}}, got {params!r}.")
    return spec.build(**parse_form(spec.params, dict(params or {}), f"Activation {name!r}"))


def _label(name: str, params: Mapping[str, Any] | None, module: nn.Module) -> str:
    spec, given = get_spec(name), dict(params or {})
    defaults = spec.defaults()
    shown = {p.name: given[p.name] for p in spec.params  # (in the signature's order)
             if p.name in given and defaults.get(p.name, object()) != given[p.name]}
    return name + (f"({', '.join(f'{k}={v!r}' for k, v in shown.items())})" if shown else "")


# --- curves ---------------------------------------------------------------------------

@dataclass
class Curves:
    """f, f' of one activation at sample points.

    Attributes:
        name: the registry name; ``label`` with the parameters that differ from the defaults.
        x: the sample points, shape (N,).
        f: f(x), as the module computes it.
        autograd: f'(x) from autograd (the gradient of sum f(x) w.r.t. x).
        closed: f'(x) from the spec's closed form, or None where the spec has none.
        max_difference: max |closed - autograd| over x (None without a closed form).
        jumps: per curve (``f``, ``autograd``, ``closed``), the indices ``i`` where it jumps
            between ``x[i]`` and ``x[i + 1]`` (:func:`jumps`): drawn as a gap, not a vertical line.
    """

    name: str
    label: str
    x: np.ndarray
    f: np.ndarray
    autograd: np.ndarray
    closed: np.ndarray | None
    max_difference: float | None
    jumps: dict[str, np.ndarray]


def curves(name: str, params: Mapping[str, Any] | None = None, x_range: Sequence[float] = DEFAULT_RANGE,
           points: int = DEFAULT_POINTS) -> Curves:
    """Evaluate an activation, its autograd derivative and its closed-form one on ``points``
    evenly spaced values of ``x_range`` (float32, the default dtype of its inputs).

    Raises:
        ValueError, TypeError: a bad name, parameter, range or number of points; a module whose
            output is not elementwise (shape of x) or not differentiable.
    """
    low, high = _check_range(x_range)
    points = _count(points, "The number of points", 2, MAX_POINTS)
    module = build_activation(name, params)
    x = torch.linspace(low, high, points)
    evaluated = _evaluate(name, module, x)
    f, autograd, closed = (evaluated[curve] for curve in ("f", "autograd", "closed"))
    difference = None
    if closed is not None:
        gap = np.abs(closed - autograd)
        # NaN where either is NaN (an activation undefined there): those points are left out; none left is NaN
        difference = float(np.nanmax(gap)) if np.isfinite(gap).any() or np.isinf(gap).any() else float("nan")
    x = x.numpy()
    found = {curve: jumps(x, y, lambda fine, curve=curve: _evaluate(name, module, torch.from_numpy(fine))[curve])
             for curve, y in evaluated.items() if y is not None}
    return Curves(name, _label(name, params, module), x, f, autograd, closed, difference, found)


def _evaluate(name: str, module: nn.Module, x: torch.Tensor) -> dict[str, np.ndarray | None]:
    """``f``, ``autograd`` and ``closed`` (None without a closed form) of ``module`` at ``x``."""
    leaf = x.clone().requires_grad_(True)
    y = module(leaf.clone())  # (a copy: an in-place activation writes into it, not into the leaf)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise ValueError(f"{name!r} returned {type(y).__name__} {tuple(getattr(y, 'shape', ()))} for an input of "
                         f"shape {tuple(x.shape)}: the explorer draws elementwise activations only.")
    if not y.requires_grad:
        raise ValueError(f"{name!r}'s output does not depend differentiably on its input: no f'(x) to draw.")
    y.sum().backward()
    autograd = leaf.grad.detach().numpy().copy()
    derivative = get_spec(name).extras.get("derivative")
    closed = None
    if callable(derivative):
        with torch.no_grad():
            closed = np.asarray(derivative(module, x.clone()).detach().float().numpy(), np.float32)
        if closed.shape != autograd.shape:
            raise ValueError(f"{name!r}'s closed-form derivative returned shape {closed.shape} for "
                             f"{x.numel()} points.")
    return {"f": y.detach().numpy().copy(), "autograd": autograd, "closed": closed}


def jumps(x: np.ndarray, y: np.ndarray, evaluate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The indices ``i`` where the curve ``y`` of ``x`` jumps between ``x[i]`` and ``x[i + 1]``: a
    step at least :data:`JUMP_RATIO` times the steps beside it (a smooth curve's steps change
    little from one to the next, a kink's by at most one step's worth) and above a thousandth of
    the curve's range, that stays above half its size when the interval is sampled
    :data:`JUMP_SAMPLES` times more finely (``evaluate``: the curve at such points), where a
    steep but continuous stretch spreads out."""
    y = np.asarray(y, np.float64)
    steps = np.abs(np.diff(y))
    finite = y[np.isfinite(y)]
    if len(steps) < 2 or not len(finite):
        return np.zeros(0, np.int64)
    # (the first and last steps have a neighbour on one side)
    neighbours = np.fmax(np.concatenate([[np.nan], steps[:-1]]), np.concatenate([steps[1:], [np.nan]]))
    candidates = np.flatnonzero((steps > JUMP_RATIO * neighbours) & (steps > 1e-3 * np.ptp(finite)))
    found = []
    for i in candidates:
        fine = np.asarray(evaluate(np.linspace(x[i], x[i + 1], JUMP_SAMPLES, dtype=np.float32)), np.float64)
        if np.nanmax(np.abs(np.diff(fine)), initial=0.0) > 0.5 * steps[i]:
            found.append(i)
    return np.asarray(found, np.int64)


def _selections(activations: Any, params: Mapping[str, Mapping[str, Any]] | None) -> list[tuple[str, dict]]:
    if isinstance(activations, str):
        activations = [activations]
    if not isinstance(activations, (list, tuple)) or not activations:
        raise ValueError(f"Pick at least one activation, e.g. ['gelu', 'relu'] (got {activations!r}). "
                         f"The activations: {activation_names()}.")
    chosen = []
    for item in activations:
        if isinstance(item, (tuple, list)) and len(item) == 2:
            name, given = item
        else:
            name, given = item, (params or {}).get(item) if isinstance(item, str) else None
        if given is not None and not isinstance(given, Mapping):
            raise TypeError(f"The parameters of {name!r} are a dict such as {{'init': 0.1}}, got {given!r}.")
        chosen.append((name, dict(given or {})))
    return chosen


def curves_figure(activations: str | Sequence[str | tuple[str, Mapping[str, Any]]],
                  params: Mapping[str, Mapping[str, Any]] | None = None, x_range: Sequence[float] = DEFAULT_RANGE,
                  points: int = DEFAULT_POINTS) -> ExplorerFigure:
    """f(x) (left) and f'(x) (right) of several activations overlaid; f' of each from the spec's
    closed form (solid) and from autograd (dotted, on top); the legend gives their largest
    difference.

    Args:
        activations: registry names, or ``(name, params)`` pairs (one activation twice with
            different parameters).
        params: parameters by name, for the names given alone.
        x_range: ``(low, high)``.
        points: sample points.

    Each trace's ``meta`` says what it is: ``{"activation", "label", "curve"}`` with ``curve`` one
    of ``f``, ``closed``, ``autograd``.
    """
    results = [curves(name, p, x_range, points) for name, p in _selections(activations, params)]
    data = []
    for i, c in enumerate(results):
        color = _PALETTE[i % len(_PALETTE)]
        meta = dict(activation=c.name, label=c.label)
        data.append(dict(type="scatter", mode="lines", name=f"{c.label}", **_broken_at_jumps(c.x, c.f, c.jumps["f"]),
                         legendgroup=c.label, line=dict(color=color, width=2), meta=dict(meta, curve="f"),
                         hovertemplate=f"{c.label}: f(%{{x:.3g}}) = %{{y:.4g}}<extra></extra>"))
        if c.closed is not None:
            data.append(dict(type="scatter", mode="lines", name=f"{c.label}: f' closed form",
                             **_broken_at_jumps(c.x, c.closed, c.jumps["closed"]), xaxis="x2", yaxis="y2",
                             legendgroup=c.label, showlegend=False,
                             line=dict(color=color, width=2), meta=dict(meta, curve="closed"),
                             hovertemplate=f"{c.label}: f'(%{{x:.3g}}) = %{{y:.4g}} (closed form)<extra></extra>"))
        difference = ("no closed form in its spec" if c.max_difference is None
                      else f"max |closed − autograd| = {c.max_difference:.2g}")
        data.append(dict(type="scatter", mode="lines", name=f"{c.label}: f' autograd ({difference})",
                         **_broken_at_jumps(c.x, c.autograd, c.jumps["autograd"]), xaxis="x2", yaxis="y2",
                         legendgroup=c.label,
                         line=dict(color="#111111", width=1.5, dash="dot"), meta=dict(meta, curve="autograd"),
                         showlegend=True,
                         hovertemplate=f"{c.label}: f'(%{{x:.3g}}) = %{{y:.4g}} (autograd)<extra></extra>"))
    height = CURVES_HEIGHT + CURVES_HEIGHT_PER_ACTIVATION * max(0, len(results) - CURVES_LEGEND_ROOM)
    layout = _layout(height, None, hovermode="closest", legend=dict(orientation="h", y=-0.2, font=dict(size=11)),
                     xaxis=_zeroed(domain=[0, 0.47], title=dict(text="x")),
                     yaxis=_zeroed(title=dict(text="f(x)")),
                     xaxis2=_zeroed(domain=[0.53, 1], anchor="y2", title=dict(text="x")),
                     yaxis2=_zeroed(anchor="x2", title=dict(text="f′(x)")),
                     annotations=[dict(text=t, x=x, y=1.02, xref="paper", yref="paper", showarrow=False,
                                       xanchor="center", yanchor="bottom", font=dict(size=13))
                                  for t, x in (("f(x)", 0.235), ("f′(x): closed form (solid), autograd (dotted)",
                                                                 0.765))])
    layout["margin"]["b"] = 60
    return _figure(data, layout)


def _broken_at_jumps(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> dict[str, dict[str, str]]:
    """A curve's ``x`` and ``y`` for Plotly, with a gap (a NaN half way) at each jump (``at``:
    :func:`jumps`): Threshold's f and ReLU's f' step between two sample points, and a line joining
    them would draw a vertical segment that the function does not have."""
    if len(at):
        x = np.insert(x, at + 1, (x[at] + x[at + 1]) / 2)
        y = np.insert(np.asarray(y, np.float32), at + 1, np.nan)
    return dict(x=_array(x), y=_array(y))


def differences_markdown(activations: Any, params: Mapping[str, Mapping[str, Any]] | None = None,
                         x_range: Sequence[float] = DEFAULT_RANGE, points: int = DEFAULT_POINTS) -> str:
    """A Markdown table: each activation's largest |closed form - autograd| over the range."""
    rows = ["| activation | max \\|f′ closed form − f′ autograd\\| |", "|---|---|"]
    for name, p in _selections(activations, params):
        c = curves(name, p, x_range, points)
        rows.append(f"| {c.label} | " + ("no closed form in its spec" if c.max_difference is None
                                         else f"{c.max_difference:.3g}") + " |")
    return "\n".join(rows)


# --- distributions -------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """An input distribution: ``kind`` ('normal', 'uniform', 'recorded') and its arguments."""

    kind: str
    args: dict = field(default_factory=dict)


def normal(mean: float = 0.0, std: float = 1.0) -> Source:
    """Normal inputs with this mean and standard deviation (> 0)."""
    mean = _number(mean, "The normal's mean", "Enter e.g. 0.")
    std = _number(std, "The normal's std", "Enter e.g. 1.")
    if std <= 0:
        raise ValueError(f"The normal's std must be > 0, got {std:g}. Enter e.g. 1.")
    return Source("normal", dict(mean=mean, std=std))


def uniform(low: float = -3.0, high: float = 3.0) -> Source:
    """Uniform inputs on [low, high)."""
    low, high = _check_range((low, high), ends=("low", "high"), example=(-3, 3))  # (its own fields', not x's)
    return Source("uniform", dict(low=low, high=high))


def _stored_run(run: Any) -> Any:
    """The stored run ``run`` names: a ``Run``, its path, or the live run writing it (a background run or a
    watch made with ``store=``), read as stored so far. A live run is what a notebook's ``run`` holds
    (``run = exp.start(...)``): it was refused as "not a directory path"."""
    from workbench.experiments.base import BackgroundRun
    from workbench.instrument import Run, Watch, load_run

    if isinstance(run, Run):
        return run
    watch = run.watch if isinstance(run, BackgroundRun) else run if isinstance(run, Watch) else None
    if watch is None:
        return load_run(run)  # (a path; anything else is refused there, by its type)
    if watch.store is None:
        raise TypeError(f"{run!r} stores no run to draw from: the explorer reads what a run stored. Start it "
                        "with store=... (exp.start(steps, store='runs/name'), workbench.watch(model, "
                        "store='runs/name')) and pass it or that path.")
    return load_run(watch.store.path)


def recorded(run: Any, site: str, step: int | None = None) -> Source:
    """The pre-activations a stored run recorded at a call site (an ``activation`` row, e.g. the
    output of the Linear layer before an activation, ``layers.0``), at ``step`` (default: the last
    step that recorded it).

    A run stores statistics, not values: where it recorded a histogram of the site at that step,
    the samples are drawn from the histogram (uniformly within each bin); otherwise from a normal
    with the recorded mean and std, clipped to the recorded min and max. The source's
    description says which.

    Args:
        run: a stored run (``workbench.load_run(path)``) or its path; or the live run that writes one
            (``exp.start(steps, store=...)``, ``workbench.watch(model, store=...)``), read as stored so far.
        site: an activation call site it recorded (:func:`recorded_sites`).
        step: the step whose values are drawn (default: the last that recorded the site).

    Raises:
        TypeError: a live run that stores nothing (started without ``store=``), or another object.
        ValueError: a site or step it did not record.
    """
    run = _stored_run(run)
    sites = recorded_sites(run)
    if not sites:
        raise ValueError(_NO_ACTIVATIONS.format(run=run.name) + "pass another run, or call this again once it has "
                         "recorded a step.")
    if site not in sites:
        raise ValueError(f"Run {run.name!r} recorded no activation at {site!r}; its sites are {list(sites)[:20]}.")
    if step is not None:  # (whether the run recorded it is said when it is drawn from, with the steps it did)
        whole = _whole_or_none(step)
        if whole is None or whole < 1:
            raise ValueError(f"step must be a whole number >= 1, a step the run recorded (None: the last), got "
                             f"{step!r}.")
        step = whole
    return Source("recorded", dict(run=run, site=site, step=step))


#: A stored run with no activation rows (no step recorded yet, or its watch recorded none), for messages: what to do
#: then follows, said as the page (its Refresh button) or the Python API (a call again) is used
_NO_ACTIVATIONS = "Run {run!r} has recorded no activations (no step yet): "


def recorded_sites(run: Any) -> dict[str, tuple[str, int, str]]:
    """The activation call sites a stored run recorded, as the run page names them (``layers.0``;
    ``activation#1`` for a module's 2nd call in a step), each with its ``(module, call, tensor)``."""
    run = _stored_run(run)
    table = RunView.from_run(run).site_table("activation")
    return {row.name: (row.module, int(row.call), row.tensor) for row in table.itertuples(index=False)}


#: torch's activation modules that act on each value alone (torch.nn.modules.activation less the softmaxes,
#: GLU and attention, which mix values)
TORCH_ACTIVATIONS = ("CELU", "ELU", "GELU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "LeakyReLU",
                     "LogSigmoid", "Mish", "PReLU", "RReLU", "ReLU", "ReLU6", "SELU", "SiLU", "Sigmoid", "Softplus",
                     "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold")


def activation_classes() -> set[str]:
    """The qualified class names of the modules counted as activations: torch's element-wise ones
    (:data:`TORCH_ACTIVATIONS`) and each registered activation's (those the explorer lists)."""
    names = {f"torch.nn.modules.activation.{name}" for name in TORCH_ACTIVATIONS}
    for name in activation_names():
        try:
            made = type(build_activation(name))
        except Exception:  # (one that cannot be built is left out here; the Curves tab says why)
            continue
        names.add(f"{made.__module__}.{made.__qualname__}")
    return names


def activation_inputs(run: Any) -> list[str] | None:
    """The recorded call sites of a stored run whose output an activation module takes: each one
    recorded just before a call of an activation module (:func:`activation_classes`), in the order
    recorded. None: the run does not say its modules' classes (recorded before runs stored them)."""
    run = _stored_run(run)
    classes = run.module_classes()
    if classes is None:
        return None
    activations = activation_classes()
    sites = [(name, module) for name, (module, _, _) in recorded_sites(run).items()]
    return [name for (name, module), (_, following) in zip(sites, sites[1:])
            if following != module and classes.get(following) in activations]


def _recorded_samples(source: Source, n: int, generator: torch.Generator) -> tuple[torch.Tensor, str]:
    run, site = source.args["run"], source.args["site"]
    module, call, tensor = recorded_sites(run)[site]
    rows = run.to_pandas()
    rows = rows[(rows.kind == "activation") & (rows.module == module) & (rows.call == call) & (rows.tensor == tensor)]
    step = source.args["step"]
    if step is None:
        step = int(rows.step.max())
    row = rows[rows.step == step]
    if row.empty:
        raise ValueError(f"Run {run.name!r} has no {site!r} row at step {step}; it recorded the site at steps "
                         f"{int(rows.step.min())} to {int(rows.step.max())}.")
    row = row.iloc[0]
    where = f"{site} at step {step} of run {run.name}"
    hists = run.histograms(module=module, kind="activation")
    hists = hists[(hists.step == step) & (hists.call == call) & (hists.tensor == tensor)]
    if len(hists):
        edges = torch.tensor(np.array(hists.edges.iloc[0], np.float64))  # (copies: the stored arrays are read-only)
        counts = torch.tensor(np.array(hists.counts.iloc[0], np.float64))
        if counts.sum() > 0 and torch.isfinite(edges).all():
            bins = torch.multinomial(counts / counts.sum(), n, replacement=True, generator=generator)
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            x = edges[bins] + u * (edges[bins + 1] - edges[bins])
            return x.float(), (f"the histogram recorded at {where} ({len(counts)} bins; values drawn uniformly "
                               "within each bin)")
    mean, std, low, high = (float(row[k]) for k in ("mean", "std", "min", "max"))
    if not all(map(math.isfinite, (mean, std, low, high))):
        raise ValueError(f"The statistics recorded at {where} are not finite (mean {mean}, std {std}): "
                         "no distribution to draw from. Pick another step or site.")
    x = (mean + std * torch.randn(n, generator=generator, dtype=torch.float64)).clamp(low, high)
    return x.float(), (f"a normal with the mean ({mean:.3g}) and std ({std:.3g}) recorded at {where}, clipped "
                       f"to its recorded min and max [{low:.3g}, {high:.3g}]: the run stored statistics, not "
                       "values (record it with histograms on to push its recorded distribution through)")


def sample(source: Source, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> tuple[torch.Tensor, str]:
    """``samples`` inputs drawn from ``source`` (float32, shape (samples,)) and what they are, in words."""
    if not isinstance(source, Source):
        raise TypeError(f"An input distribution is made by explorer.normal(), uniform() or recorded(), got "
                        f"{source!r}.")
    samples = _count(samples, "The number of samples", 1, MAX_SAMPLES)
    generator = torch.Generator().manual_seed(check_seed(seed, "The distribution"))
    a = source.args
    if source.kind == "normal":
        x = a["mean"] + a["std"] * torch.randn(samples, generator=generator)
        if not torch.isfinite(x).all():  # (float32 overflowed to inf: those would not be samples of this normal)
            largest = torch.finfo(x.dtype).max
            raise ValueError(f"The normal with mean {a['mean']:g} and std {a['std']:g} gives samples beyond "
                             f"{str(x.dtype).removeprefix('torch.')}'s range (±{largest:.6g}), which the samples "
                             f"are: {int((~torch.isfinite(x)).sum()):,} of {samples:,} overflowed. Make the mean or "
                             "the std smaller, e.g. mean 0 and std 1e+37.")
        return x, f"normal with mean {a['mean']:g} and std {a['std']:g}"
    if source.kind == "uniform":
        x = a["low"] + (a["high"] - a["low"]) * torch.rand(samples, generator=generator)
        return x, f"uniform on [{a['low']:g}, {a['high']:g})"
    return _recorded_samples(source, samples, generator)


@dataclass
class Pushed:
    """Samples pushed through an activation.

    Attributes:
        label: the activation with its parameters; ``source`` the input distribution in words.
        x, y, gradient: inputs, f(x) and autograd's f'(x), shape (samples,).
        fractions: ``dead`` (f'(x) = 0), ``saturated`` (0 < |f'(x)| < ``saturation``), ``negative``
            (f(x) < 0), each a share of the samples.
    """

    label: str
    source: str
    x: np.ndarray
    y: np.ndarray
    gradient: np.ndarray
    saturation: float
    fractions: dict[str, float]


def push_through(name: str, params: Mapping[str, Any] | None = None, source: Source | None = None,
                 samples: int = DEFAULT_SAMPLES, seed: int = 0, saturation: float = DEFAULT_SATURATION) -> Pushed:
    """Push samples of ``source`` (default: standard normal) through an activation.

    Args:
        name, params: the activation and its parameters.
        source: :func:`normal`, :func:`uniform` or :func:`recorded`.
        samples: how many; seed: their generator's seed.
        saturation: |f'(x)| below this (and above 0) counts as saturated.
    """
    saturation = _number(saturation, "The saturation threshold", "Enter e.g. 0.05.")
    if saturation <= 0:
        raise ValueError(f"The saturation threshold must be > 0, got {saturation:g}. Enter e.g. 0.05.")
    module = build_activation(name, params)
    x, description = sample(source if source is not None else normal(), samples, seed)
    leaf = x.clone().requires_grad_(True)
    y = module(leaf.clone())
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise ValueError(f"{name!r} is not elementwise: it returned {tuple(getattr(y, 'shape', ()))} for "
                         f"{tuple(x.shape)}.")
    if y.requires_grad:
        y.sum().backward()
        gradient = leaf.grad.detach().numpy().copy()
    else:
        gradient = np.zeros(x.shape, np.float32)
    y = y.detach().numpy().copy()
    magnitude = np.abs(gradient)
    fractions = {"dead": float(np.mean(magnitude == 0)),
                 "saturated": float(np.mean((magnitude > 0) & (magnitude < saturation))),
                 "negative": float(np.mean(y < 0))}
    return Pushed(_label(name, params, module), description, x.numpy(), y, gradient, saturation, fractions)


def _histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # (binned in float64: float32 values spread wider than float32's range overflow its bins' arithmetic)
    finite = values[np.isfinite(values)].astype(np.float64)
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    if high - low < 1e-6:  # all (nearly) one value: one bar around it
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(finite, bins=BINS, range=(low, high))
    return (edges[:-1] + edges[1:]) / 2, edges[1:] - edges[:-1], counts / max(len(values), 1)


def fractions_markdown(pushed: Pushed) -> str:
    """The fractions of a push, in words."""
    f = pushed.fractions
    return (f"**{pushed.label}** on {len(pushed.x):,} samples of {pushed.source}:  \n"
            f"dead (f′(x) = 0, no gradient passes) **{f['dead']:.1%}** · "
            f"saturated (0 < |f′(x)| < {pushed.saturation:g}) **{f['saturated']:.1%}** · "
            f"negative (f(x) < 0) **{f['negative']:.1%}**")


def distribution_figure(pushed: Pushed) -> ExplorerFigure:
    """Input (left) and output (right) histograms of a push (shares of the samples per bin); the
    title gives the fractions dead, saturated and negative."""
    data = []
    for i, (values, what) in enumerate(((pushed.x, "input x"), (pushed.y, f"output {pushed.label}(x)"))):
        centers, widths, shares = _histogram(values)
        n = "" if i == 0 else "2"
        data.append(dict(type="bar", name=what, x=_array(centers), y=_array(shares), width=_array(widths),
                         xaxis=f"x{n}", yaxis=f"y{n}", marker=dict(color=_PALETTE[i], line=dict(width=0)),
                         meta=dict(side="input" if i == 0 else "output"),
                         hovertemplate=what + ": %{x:.3g}<br>share %{y:.2%}<extra></extra>"))
    f = pushed.fractions
    title = (f"{pushed.label}: dead {f['dead']:.1%} · saturated (|f′| < {pushed.saturation:g}) "
             f"{f['saturated']:.1%} · negative {f['negative']:.1%}")
    layout = _layout(380, title, hovermode="closest", showlegend=False, bargap=0,
                     xaxis=_axis(domain=[0, 0.47], title=dict(text="input x")),
                     yaxis=_axis(title=dict(text="share of samples"), tickformat=".1%"),
                     xaxis2=_axis(domain=[0.53, 1], anchor="y2", title=dict(text=f"output {pushed.label}(x)")),
                     yaxis2=_axis(anchor="x2", tickformat=".1%"))
    return _figure(data, layout)


# --- which activation trains best ------------------------------------------------------------

class _Entry:
    """One activation's run in a comparison."""

    def __init__(self, name: str, experiment: Any, steps: int) -> None:
        self.name, self.experiment = name, experiment
        self.view = RunView(label=name, total=steps)
        self.view.set_status("waiting")
        self.run = None  # the BackgroundRun, once started
        self.watch = self.subscription = None
        self.final: dict[str, float] | None = None  # loss and accuracy on the whole training set, at the end
        self.evaluation_error: str | None = None  # why ``final`` could not be computed


class Comparison:
    """``activation_mlp`` trained with each of several activations on the same task and seed.

    Every run is built (its configuration checked, its memory estimated) before any starts. Each
    trains in the background (``exp.start``) under a watch feeding a :class:`RunView`;
    ``mode`` runs them one after another (each starts when the previous ends) or side by side.

    Args:
        activations: registry names, at least one, no repeats.
        steps: training steps of each run.
        seed: the seed of every run (the same data, initial weights and batches up to the activation).
        mode: ``"one after another"`` or ``"side by side"``.
        **config: ``activation_mlp``'s other settings (``depth``, ``width``, ``lr``, ``dataset`` ...).

    Raises:
        ValueError, TypeError: before anything starts, for a bad activation, setting, mode or step count.
    """

    def __init__(self, activations: Sequence[str], steps: int = 200, seed: int = 0, mode: str = MODES[0],
                 **config: Any) -> None:
        from workbench.experiments import create

        if isinstance(activations, (list, tuple)) and not activations:
            raise ValueError(f"Pick at least one activation to compare (none is picked). The activations: "
                             f"{activation_names()}.")
        if isinstance(activations, str) or not isinstance(activations, (list, tuple)):
            raise ValueError(f"Pick at least one activation to compare, as a list (got {activations!r}). "
                             f"The activations: {activation_names()}.")
        if len(set(activations)) != len(activations):
            raise ValueError(f"Each activation once, please: {list(activations)} repeats one.")
        for name in activations:
            _activation_spec(name)
        if "activation" in config:
            raise TypeError("The activations are the comparison's first argument, not activation=.")
        self.steps = _count(steps, "The number of steps", 1, MAX_COMPARE_STEPS)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
        self.mode, self.seed, self.config = mode, check_seed(seed, "The comparison"), dict(config)
        self.entries = {name: _Entry(name, create("activation_mlp", seed=seed, activation=name, **config), self.steps)
                        for name in activations}
        self._lock = threading.Lock()
        self._stopping = False
        self._started = False

    @property
    def views(self) -> dict[str, RunView]:
        """Each activation's :class:`RunView` (metrics and statistics over steps)."""
        return {name: e.view for name, e in self.entries.items()}

    def start(self) -> Comparison:
        """Start the runs (the first only, one after another); returns at once."""
        with self._lock:
            if self._started:
                raise RuntimeError("This comparison has started already; make a new one to run again.")
            self._started = True
        names = list(self.entries)
        for name in (names if self.mode == "side by side" else names[:1]):
            self._start(name)
        return self

    def _start(self, name: str) -> None:
        e = self.entries[name]
        with self._lock:
            if self._stopping:
                e.view.set_status("not started")
                return
            e.watch = e.experiment.watch()
            e.subscription = e.watch.subscribe(e.view.feed, interval=FEED_INTERVAL)
            e.view.set_status("running")
            try:
                e.run = e.experiment.start(self.steps)
            except BaseException as exc:
                e.subscription.unsubscribe()
                e.watch.close("failed", repr(exc))
                e.view.set_status("failed", repr(exc))
                if self.mode == "one after another":
                    # (the runs after it were to start as it ended; it never will: they are not started, not
                    # waiting for ever, and join() ends)
                    names = list(self.entries)
                    for later in names[names.index(name) + 1:]:
                        self.entries[later].view.set_status("not started")
                raise
        e.run.on_done(lambda run, name=name: self._finished(name, run))

    def _finished(self, name: str, run: Any) -> None:
        """On the run's thread, when it has ended: close its watch, evaluate, start the next."""
        e = self.entries[name]
        e.subscription.unsubscribe()  # (delivers what was queued first: the view has every step)
        e.watch.close(run.status, run.error)  # (a stopped run's error says what stopped it, after which step)
        if run.status != "failed":
            try:
                e.final = e.experiment.evaluate()
            except Exception as exc:  # (not ranked, and the status says why)
                e.final, e.evaluation_error = None, f"{type(exc).__name__}: {exc}"
        e.view.set_status(run.status, run.error)
        if self.mode == "one after another":
            names = list(self.entries)
            following = names.index(name) + 1
            if following < len(names):
                self._start(names[following])

    def status(self) -> dict[str, str]:
        """Each run's status: waiting, running, finished, stopped, failed or not started."""
        return {name: e.view.header()["status"] for name, e in self.entries.items()}

    @property
    def done(self) -> bool:
        """Every run has ended (or will not start)."""
        return all(s in ("finished", "stopped", "failed", "not started") for s in self.status().values())

    def stop(self, wait: bool = True, timeout: float | None = 30.0) -> dict[str, str]:
        """Stop the runs in progress (after their current step) and start no more."""
        with self._lock:
            self._stopping = True
            waiting = [e for e in self.entries.values() if e.run is None]
        for e in waiting:
            e.view.set_status("not started")
        for e in list(self.entries.values()):
            if e.run is not None:
                e.run.stop(wait=wait, timeout=timeout)
        if wait:
            self.join(timeout)
        return self.status()

    def join(self, timeout: float | None = None) -> dict[str, str]:
        """Wait for every run to end (in turn, one after another); returns the statuses.

        Raises:
            RuntimeError: the comparison has not started (its runs would never end: the wait had no end).
        """
        import time

        with self._lock:
            waits_forever = not self._started and not self._stopping  # (stopped before it started: not started)
        if waits_forever:
            raise RuntimeError("This comparison has not started, so there is nothing to wait for: call "
                               "comparison.start() first, then comparison.join().")
        deadline = None if timeout is None else time.monotonic() + timeout
        for name in list(self.entries):
            while True:
                e = self.entries[name]
                with self._lock:
                    run, stopping = e.run, self._stopping
                if run is not None:
                    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                    run.join(left)
                    if run.done or (deadline is not None and time.monotonic() >= deadline):
                        # (on_done has run: the next one, if any, is started before done is set)
                        break
                elif stopping or self.status()[name] in ("not started", "failed"):
                    break
                elif deadline is not None and time.monotonic() >= deadline:
                    break
                else:
                    time.sleep(0.02)  # the previous run starts this one as it ends
        return self.status()

    # ---------------------------------------------------------------- figures
    def metrics_figure(self, smoothing: float = 0.0) -> ExplorerFigure:
        """Training loss and accuracy of each run over steps (a line per activation)."""
        return ExplorerFigure(compare_metrics_figure(self.views, ["loss", "accuracy"], smoothing, columns=2))

    def hidden_layers(self) -> list[str]:
        """The hidden Linear layers (``layers.0``, ``layers.2`` ...): each feeds an activation."""
        depth = next(iter(self.entries.values())).experiment.config.depth
        return [f"layers.{2 * i}" for i in range(depth)]

    def layers_figure(self) -> ExplorerFigure:
        """Per hidden layer (columns, :data:`LAYERS_PER_ROW` a row), a line per activation: top, the
        share of dead units - of the layer's pre-activation gradient entries (units x samples of the
        batch) that are exactly 0, where f'(x) = 0 lets no gradient through; bottom, the norm of the
        layer's weight gradient."""
        layers = self.hidden_layers()
        rows = [("grad_output", "zero_frac", "dead units", lambda l: l, ".0%"),
                ("param_grad", "norm", "gradient norm", lambda l: f"{l}.weight", None)]
        columns = min(len(layers), LAYERS_PER_ROW)
        chunks = [layers[i:i + LAYERS_PER_ROW] for i in range(0, len(layers), LAYERS_PER_ROW)]
        panel_rows = len(rows) * len(chunks)
        # (the gaps in paper fractions, which shrink as the figure grows: the same pixels between the rows)
        gap_x, gap_y = 0.06, 0.16 / len(chunks)
        width, height = (1 - gap_x * (columns - 1)) / columns, (1 - gap_y * (panel_rows - 1)) / panel_rows
        data, layout = [], _layout(LAYERS_ROW_HEIGHT * len(chunks), None, hovermode="x", annotations=[],
                                   showlegend=True, legend=dict(orientation="h", y=-0.12 / len(chunks)))
        steps_seen = []
        panels = [(c * len(rows) + r, j, row, layer) for c, chunk in enumerate(chunks)
                  for r, row in enumerate(rows) for j, layer in enumerate(chunk)]
        for index, (panel_row, j, (kind, statistic, what, site_of, fmt), layer) in enumerate(panels):
            r = panel_row % len(rows)
            n = str(index + 1) if index else ""
            x0, y1 = j * (width + gap_x), 1 - panel_row * (height + gap_y)
            for k, (name, view) in enumerate(self.views.items()):
                site = site_of(layer)
                if site not in view.site_order(kind):
                    continue
                part = view.site_series(kind, statistic, [site])
                steps_seen.append(part.step.to_numpy())
                data.append(dict(type="scatter", mode="lines", name=name, x=_array(part.step),
                                 y=_array(part.value), xaxis=f"x{n}", yaxis=f"y{n}", legendgroup=name,
                                 showlegend=index == 0, line=dict(color=_PALETTE[k % len(_PALETTE)], width=1.5),
                                 meta=dict(activation=name, layer=layer, statistic=what),
                                 hovertemplate=f"{name}: %{{y:.3g}}<extra>{what}, {layer}</extra>"))
            layout[f"xaxis{n}"] = _axis(domain=[x0, x0 + width], anchor=f"y{n}", tickformat="d",
                                        **({"title": dict(text="step")} if r == 1 else {}))
            # (the bottom row's low end clamped: rounding made it -1e-17, out of Plotly's [0, 1])
            layout[f"yaxis{n}"] = _axis(domain=[max(y1 - height, 0.0), y1], anchor=f"x{n}",
                                        **({"tickformat": fmt} if fmt else {}),
                                        **({"title": dict(text=what)} if j == 0 else {}))
            layout["annotations"].append(dict(text=f"{what}: {layer}", x=x0 + width / 2, y=y1, xref="paper",
                                              yref="paper", xanchor="center", yanchor="bottom",
                                              showarrow=False, font=dict(size=12)))
        if not data:
            return ExplorerFigure(empty_figure("No steps recorded yet."))
        return _figure(data, layout)

    def ranking(self) -> list[tuple[str, float, float]]:
        """The activations whose runs finished (all their steps), best first: ``(name, accuracy,
        loss)`` on the whole training set (ties on accuracy go to the lower loss); empty until every
        run has ended."""
        status = self.status()
        if not self.done:
            return []
        finished = [(name, float(e.final["accuracy"]), float(e.final["loss"]))
                    for name, e in self.entries.items() if e.final and status[name] == "finished"]
        return sorted(finished, key=lambda r: (-r[1], r[2]))

    def summary(self) -> pd.DataFrame:
        """One row per activation: status, step, last training loss and accuracy, and (at the end)
        loss and accuracy on the whole training set; once every run has ended, best first (see
        :meth:`ranking`; those that did not finish last)."""
        rows = []
        for name, e in self.entries.items():
            h = e.view.header()
            metrics = e.view.metrics_frame(["loss", "accuracy"])
            last = {m: float(metrics[metrics.metric == m].value.iloc[-1]) if (metrics.metric == m).any() else None
                    for m in ("loss", "accuracy")}
            rows.append({"activation": name, "status": h["status"], "step": h["step"],
                         "loss (last step)": last["loss"], "accuracy (last step)": last["accuracy"],
                         "loss (whole set)": e.final["loss"] if e.final else None,
                         "accuracy (whole set)": e.final["accuracy"] if e.final else None})
        ranked = {name: i for i, (name, _, _) in enumerate(self.ranking())}
        rows.sort(key=lambda r: ranked.get(r["activation"], len(ranked)))  # (stable: run order until then)
        return pd.DataFrame(rows, columns=SUMMARY_COLUMNS).round(4)

    def status_markdown(self) -> str:
        """Each run's status and step; once every run has ended, which trained best."""
        parts = []
        for name, e in self.entries.items():
            h = e.view.header()
            parts.append(f"**{name}** `{h['status']}` {h['step']}/{self.steps}")
        text = " · ".join(parts)
        # (why a run failed, or was not ranked: the table shows only its status, or no loss on the whole set)
        for name, e in self.entries.items():
            h = e.view.header()
            # (a message in a code span: shown as it is, its <...> no HTML tag, its * no emphasis)
            if h["status"] == "failed" and h["error"]:  # (the short message a header shows, figures.error_parts)
                message = error_line(h["error"]).replace("`", "'")
                text += f"\n\n**{name}** failed: `{message}`"
            elif e.evaluation_error is not None:
                message = " ".join(e.evaluation_error.split()).replace("`", "'")
                text += (f"\n\n**{name}** is not ranked: its loss and accuracy on the whole training set could not "
                         f"be computed: `{message}`")
        ranking = self.ranking()
        if ranking:
            (best, accuracy, loss), rest = ranking[0], ranking[1:]
            text += (f"\n\n**{best} trained best**: accuracy {accuracy:.3f} (loss {loss:.4g}) on the whole "
                     "training set" + ("; then " + ", ".join(f"{n} {a:.3f}" for n, a, _ in rest) if rest else "") + ".")
        return text


# --- the app's handlers (plain functions) ------------------------------------------------------

SOURCES = ("normal", "uniform", "recorded run")
DEFAULT_CURVES = ("gelu", "relu", "tanh")
DEFAULT_COMPARE = ("relu", "tanh", "gelu", "sigmoid")


def _message(exc: Exception) -> str:
    return f"**{type(exc).__name__}:** {exc}" if not isinstance(exc, (ValueError, TypeError)) else f"**{exc}**"


def set_param(state: Mapping[str, Mapping[str, Any]] | None, name: str, label: str, value: Any) -> dict:
    """The page's parameter values (``{activation: {parameter: raw value}}``) with one changed."""
    state = {k: dict(v) for k, v in (state or {}).items()}
    state.setdefault(name, {})[label] = value
    return state


def _params_of(state: Mapping[str, Mapping[str, Any]] | None, name: str) -> dict:
    """The values set on the page for ``name``'s fields (those still fields of its spec)."""
    fields = {f.label for f in explorer_fields(name)}
    return {k: v for k, v in (state or {}).get(name, {}).items() if k in fields}


def draw_curves(names: Sequence[str] | None, low: Any, high: Any, points: Any,
                state: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict, str]:
    """The Curves figure and its message (the max differences), or an empty figure and what is wrong."""
    try:
        if not names:
            raise ValueError("Pick at least one activation to draw.")
        params = {name: _params_of(state, name) for name in names}
        x_range = (low, high)
        return (curves_figure(list(names), params, x_range, points),
                differences_markdown(list(names), params, x_range, points))
    except Exception as exc:  # a message in the figure's place, never a traceback
        return empty_figure("Nothing to draw: see the message below."), _message(exc)


def stored_runs(root: Any) -> list[str]:
    """The runs under the app's runs root (a :class:`~workbench.ui.runs.RunsRoot`), by their names
    relative to it, newest first."""
    from pathlib import Path

    from workbench.instrument import list_runs

    path = Path(getattr(root, "path", root))
    if not path.is_dir():
        return []
    return [str(Path(p).relative_to(path)) for p in list_runs(path).path]


def _open_run(root: Any, name: Any):
    from workbench.instrument import load_run

    if not name:
        raise ValueError("Pick a stored run (record one in the Experiments tab, or press Refresh).")
    resolved = root.resolve(name) if hasattr(root, "resolve") else __import__("pathlib").Path(root) / name
    return load_run(resolved)


def run_sites(root: Any, name: Any) -> list[str]:
    """The activation call sites a stored run recorded (empty for no run)."""
    if not name:
        return []
    return list(recorded_sites(_open_run(root, name)))


def default_site(root: Any, name: Any) -> str | None:
    """The call site the Distributions tab picks for stored run ``name``: the first that feeds an
    activation (:func:`activation_inputs`); None where none does (the message then says so); the
    first site where the run does not say which modules are activations."""
    if not name:
        return None
    opened = _open_run(root, name)
    feeding = activation_inputs(opened)
    if feeding is None:
        return next(iter(recorded_sites(opened)), None)
    return feeding[0] if feeding else None


def _site_note(run: Any, site: str) -> str:
    """A line for the message where ``site`` feeds no activation in ``run`` (its values need not look
    like pre-activations at all: a hash's pushed through tanh are all saturated)."""
    feeding = activation_inputs(run)
    if feeding is None or site in feeding:
        return ""
    where = f"the sites that do: {', '.join(feeding)}" if feeding else "none of its sites does"
    return (f"\n\nNote: in run {run.name!r}, {site!r} does not feed an activation module ({where}): its values "
            "are pushed through the activation all the same.")


def draw_distribution(name: str | None, state: Mapping[str, Mapping[str, Any]] | None, source: str,
                      mean: Any, std: Any, low: Any, high: Any, root: Any = None, run: Any = None,
                      site: Any = None, samples: Any = DEFAULT_SAMPLES, seed: Any = 0,
                      saturation: Any = DEFAULT_SATURATION) -> tuple[dict, str]:
    """The Distributions figure and its Markdown (the source in words and the fractions)."""
    try:
        note = ""
        if not name:
            raise ValueError("Pick an activation.")
        if source == "normal":
            chosen = normal(mean, std)
        elif source == "uniform":
            chosen = uniform(low, high)
        elif source == "recorded run":
            if not run:
                where = getattr(root, "path", root)
                raise ValueError("Pick a stored run (Refresh the runs lists them)." if stored_runs(root) else
                                 f"No stored runs under {str(where)!r} yet: record one (the Experiments tab's "
                                 "'record to run', or workbench.watch(..., store=...)), then Refresh the runs.")
            opened = _open_run(root, run)
            if not recorded_sites(opened):  # (site or none: a site kept from before, of a run since replaced)
                raise ValueError(_NO_ACTIVATIONS.format(run=run) + "pick another run, or press Refresh the runs "
                                 "once it has recorded a step.")
            if not site and activation_inputs(opened) == []:
                raise ValueError(f"No call site of run {run!r} feeds an activation module (its sites: "
                                 f"{', '.join(list(recorded_sites(opened))[:20])}): it has no pre-activations. "
                                 "Pick one of its sites to push that site's values through the activation anyway.")
            if not site:
                raise ValueError("Pick a call site of the run (the pre-activations are the outputs of the "
                                 "layer before an activation, e.g. layers.0).")
            chosen = recorded(opened, site)
            note = _site_note(opened, site)
        else:
            raise ValueError(f"The input distribution must be one of {list(SOURCES)}, got {source!r}.")
        pushed = push_through(name, _params_of(state, name), chosen, samples, _field_seed(seed), saturation)
        return distribution_figure(pushed), fractions_markdown(pushed) + note
    except Exception as exc:
        return empty_figure("Nothing to draw: see the message below."), _message(exc)


def start_comparison(current: Comparison | None, names: Sequence[str] | None, steps: Any, seed: Any, depth: Any,
                     width: Any, lr: Any, dataset: Any, mode: Any) -> tuple[Comparison | None, str]:
    """Start a comparison (stopping the page's previous one); returns it and a message. Bad
    settings leave the previous one as it was and say what is wrong."""
    from workbench.experiments import get_experiment_spec

    try:
        seed = _field_seed(seed)
        steps = int(steps) if isinstance(steps, float) and steps.is_integer() else steps
        # (read as the Experiments tab's form reads them: an empty field says so, 2.0 is a whole number, 2.5 not)
        config = parse_form(get_experiment_spec("activation_mlp").params,
                            {"depth": depth, "width": width, "lr": lr, "dataset": dataset},
                            "Experiment 'activation_mlp'")
        names = names if isinstance(names, str) else list(names or [])
        if not isinstance(names, str):  # trained and listed in the order the boxes show them, not ticked in
            shown = activation_names()
            names.sort(key=lambda n: shown.index(n) if n in shown else len(shown))
        comparison = Comparison(names, steps, seed, mode, **config)
    except Exception as exc:
        return current, _message(exc)
    stopped = ""
    if current is not None and not current.done:  # (its runs stop, and the page shows the new one: said so)
        current.stop(wait=True)
        stopped = f"Stopped the comparison that was running ({', '.join(current.entries)}), and training"
    comparison.start()
    return comparison, (f"{stopped or 'Training'} `activation_mlp` with {', '.join(comparison.entries)}: "
                        f"{comparison.steps} steps each, seed {comparison.seed}, {comparison.mode}.")


def ended_message(comparison: Comparison) -> str:
    """The form's message once every run of ``comparison`` has ended (it said "Training ..." until then): how
    each run ended and where to see them."""
    by_status: dict[str, list[str]] = {}
    for name, status in comparison.status().items():
        by_status.setdefault(status, []).append(name)
    how = "; ".join(f"{', '.join(names)} {status}" for status, names in by_status.items())
    return (f"The runs have ended ({comparison.steps} steps each, seed {comparison.seed}): {how}. Their curves "
            "and the table on the right show each run, the table ranked by accuracy on the whole training set; "
            "press Train to run them again.")


def _stop_unless_done(comparison: Comparison) -> None:
    """Stop a comparison's runs (without waiting for the step in progress) unless they have ended."""
    if not comparison.done:
        comparison.stop(wait=False)


def comparison_outputs(comparison: Comparison | None) -> tuple[str, dict, dict, pd.DataFrame]:
    """Status line, metrics figure, layers figure and summary table of a comparison."""
    if comparison is None:
        empty = empty_figure("Pick activations and press Train.")
        return "_No comparison on this page yet._", empty, empty, pd.DataFrame(columns=SUMMARY_COLUMNS)
    return (comparison.status_markdown(), comparison.metrics_figure(), comparison.layers_figure(),
            comparison.summary())


# --- layout and wiring -------------------------------------------------------------------------

def _shown(name: str, chosen: Sequence[str] | None) -> bool | str:
    """The visibility of an activation's Curves fields: in the page (keeping its values) but hidden when unchecked."""
    return True if name in (chosen or []) else "hidden"


def _has_fields(names: Sequence[str] | None) -> bool:
    """Whether any of these activations has parameter controls (a render draws their curves then)."""
    try:
        return any(explorer_fields(name) for name in names or [])
    except (ValueError, TypeError):
        return False


def _control(field: FormField, key: str, elem_id: str, value: Any):
    """The page's control of an activation's parameter, holding ``value``."""
    import gradio as gr

    common = dict(label=field.label, info=field.info or None, key=key, interactive=True, elem_id=elem_id)
    rng = field.param.range
    if field.widget == "dropdown":
        return gr.Dropdown(list(field.param.choices), value=value, **common)
    if field.widget == "checkbox":
        return gr.Checkbox(value=value, **common)
    if (field.widget == "float" and rng is not None and rng.low is not None and rng.high is not None
            and math.isfinite(rng.low) and math.isfinite(rng.high)):
        return gr.Slider(rng.low, rng.high, value=value, **common)
    if field.widget in ("int", "float"):
        return gr.Number(value, **common)
    return gr.Textbox(value=value, **common)


def layout(root: Any = None) -> dict[str, Any]:
    """Place the Explorer tab's components; call inside ``gr.Tabs``. ``root``: the app's runs root
    (:class:`~workbench.ui.runs.RunsRoot`), whose stored runs the Distributions part can draw from."""
    import gradio as gr

    from workbench.experiments import get_experiment_spec
    from workbench.ui.run_page import plot_data
    from workbench.ui.run_tabs import ALIGNED, PICK

    names = activation_names()
    c: dict[str, Any] = {"root": root}
    with gr.Tab("Activation explorer", id="explorer"):
        with gr.Tabs():
            with gr.Tab("Curves", id="explorer-curves-tab"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=300):
                        c["names"] = gr.CheckboxGroup(names, value=[n for n in DEFAULT_CURVES if n in names],
                                                      label="activations (overlaid)", elem_id="explorer-names")
                        c["reload"] = gr.Button("Reload the registry", size="sm", elem_id="explorer-reload")
                        with gr.Row():
                            c["x_low"] = gr.Number(DEFAULT_RANGE[0], label="x from", elem_id="explorer-x-low",
                                                   interactive=True, min_width=80)
                            c["x_high"] = gr.Number(DEFAULT_RANGE[1], label="x to", elem_id="explorer-x-high",
                                                    interactive=True, min_width=80)
                            c["points"] = gr.Number(DEFAULT_POINTS, label="points", elem_id="explorer-points",
                                                    interactive=True, min_width=80)
                        c["params_box"] = gr.Column(elem_id="explorer-params")
                    with gr.Column(scale=3, min_width=FIGURE_MIN_WIDTH):
                        figure, message = draw_curves(c["names"].value, *DEFAULT_RANGE, DEFAULT_POINTS)
                        c["curves"] = gr.Plot(plot_data(figure), show_label=False, elem_id="explorer-curves")
                        c["curves_message"] = gr.Markdown(message, elem_id="explorer-curves-message")
            with gr.Tab("Distributions", id="explorer-dist-tab"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=300):
                        c["dist_name"] = gr.Dropdown(names, value="tanh" if "tanh" in names else names[0],
                                                     label="activation (its parameters as set under Curves)",
                                                     elem_id="explorer-dist-name", interactive=True)
                        c["source"] = gr.Radio(list(SOURCES), value="normal", label="input distribution",
                                               elem_id="explorer-source")
                        with gr.Row(visible=True) as c["normal_box"]:
                            c["mean"] = gr.Number(0.0, label="mean", elem_id="explorer-mean", interactive=True)
                            c["std"] = gr.Number(2.0, label="std", elem_id="explorer-std", interactive=True)
                        with gr.Row(visible=False) as c["uniform_box"]:
                            c["low"] = gr.Number(-3.0, label="low", elem_id="explorer-low", interactive=True)
                            c["high"] = gr.Number(3.0, label="high", elem_id="explorer-high", interactive=True)
                        with gr.Column(visible=False) as c["recorded_box"]:
                            gr.Markdown("A stored run keeps statistics (and histograms, if recorded with them), "
                                        "not values: the samples come from the site's histogram at its last "
                                        "recorded step, or else from a normal with its recorded mean and std. "
                                        "The message below says which.", elem_id="explorer-recorded-note")
                            c["run"] = gr.Dropdown([], value=None, label="stored run", elem_id="explorer-run",
                                                   interactive=True, elem_classes=[PICK])
                            c["site"] = gr.Dropdown([], value=None, label="call site (pre-activations: the layer "
                                                    "before an activation)", elem_id="explorer-site",
                                                    interactive=True, elem_classes=[PICK])
                            c["runs_refresh"] = gr.Button("Refresh the runs", size="sm",
                                                          elem_id="explorer-runs-refresh")
                        # (one row, each label on a line, in the 300 px column of a 1100-1920 px window and at full
                        # width under 1000 px: a two-line label put its box lower than the others')
                        with gr.Row(elem_id="explorer-sampling"):
                            c["samples"] = gr.Number(DEFAULT_SAMPLES, label="samples", elem_id="explorer-samples",
                                                     interactive=True, min_width=80, scale=3)
                            c["dist_seed"] = gr.Number(0, label="seed", elem_id="explorer-dist-seed",
                                                       interactive=True, min_width=50, scale=2)
                            c["saturation"] = gr.Number(DEFAULT_SATURATION, label="saturated |f′| <",
                                                        elem_id="explorer-saturation", interactive=True,
                                                        min_width=100, scale=3)
                    with gr.Column(scale=3, min_width=FIGURE_MIN_WIDTH):
                        figure, message = draw_distribution(c["dist_name"].value, {}, "normal", 0.0, 2.0, -3, 3)
                        c["dist_plot"] = gr.Plot(plot_data(figure), show_label=False, elem_id="explorer-dist")
                        c["dist_message"] = gr.Markdown(message, elem_id="explorer-dist-message")
            with gr.Tab("Which trains best", id="explorer-compare-tab"):
                config = {p.name: p for p in get_experiment_spec("activation_mlp").params}
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=300):
                        c["compare_names"] = gr.CheckboxGroup(
                            names, value=[n for n in DEFAULT_COMPARE if n in names], label="activations",
                            elem_id="explorer-compare-names")
                        gr.Markdown("`activation_mlp` on the same task and seed with each activation, at its "
                                    "defaults (not the parameters set under Curves).")
                        with gr.Row():
                            c["steps"] = gr.Number(200, label="steps", elem_id="explorer-steps", interactive=True,
                                                   min_width=80)
                            c["seed"] = gr.Number(0, label="seed", elem_id="explorer-seed", interactive=True,
                                                  min_width=80)
                        with gr.Row(elem_classes=[ALIGNED]):  # (depth's note on two lines, width's on one)
                            # (the experiment's defaults, as the Experiments tab's form has them)
                            c["depth"] = gr.Number(config["depth"].default, label="depth", elem_id="explorer-depth",
                                                   interactive=True, min_width=80, info=config["depth"].help)
                            c["width"] = gr.Number(config["width"].default, label="width", elem_id="explorer-width",
                                                   interactive=True, min_width=80, info=config["width"].help)
                        with gr.Row():
                            c["lr"] = gr.Number(config["lr"].default, label="lr", elem_id="explorer-lr",
                                                interactive=True, min_width=80)
                            c["dataset"] = gr.Dropdown(list(config["dataset"].choices), value=config["dataset"].default,
                                                       label="dataset", elem_id="explorer-dataset", interactive=True,
                                                       min_width=80)
                        c["mode"] = gr.Radio(list(MODES), value=MODES[0], label="runs", elem_id="explorer-mode")
                        with gr.Row():
                            c["train"] = gr.Button("Train", variant="primary", elem_id="explorer-train")
                            # (greyed out while no comparison runs: nothing to stop)
                            c["stop"] = gr.Button("Stop", variant="stop", elem_id="explorer-stop", interactive=False)
                        c["compare_message"] = gr.Markdown(elem_id="explorer-compare-message")
                    with gr.Column(scale=3, min_width=FIGURE_MIN_WIDTH):
                        status, metrics, layers, table = comparison_outputs(None)
                        c["compare_status"] = gr.Markdown(status, elem_id="explorer-compare-status")
                        c["compare_metrics"] = gr.Plot(plot_data(metrics), show_label=False,
                                                       elem_id="explorer-compare-metrics")
                        gr.Markdown("**Per hidden layer.** Dead units: the share of the layer's pre-activation "
                                    "gradient (units × samples of the batch) that is exactly 0, where f′(x) = 0 "
                                    "lets no gradient through. Gradient norm: of the layer's weight.")
                        c["compare_layers"] = gr.Plot(plot_data(layers), show_label=False,
                                                      elem_id="explorer-compare-layers")
                        c["compare_table"] = gr.Dataframe(table, interactive=False, elem_id="explorer-compare-table",
                                                          show_label=False, wrap=True,  # (every column in view)
                                                          column_widths=COMPARE_TABLE_WIDTHS)
        c["params_state"] = gr.State({})
        c["registry"] = gr.State(names)  # the activations whose fields are drawn (Reload reads them again)
        c["comparison"] = gr.State(None, delete_callback=lambda comparison: comparison is not None
                                   and comparison.stop(wait=False))
        c["timer"] = gr.Timer(1.0, active=False)
    return c


def wire(c: dict[str, Any], app: Any, holdings: PageHoldings | None = None) -> None:
    """Connect the components placed by :func:`layout`; ``app``: the ``gr.Blocks`` they are in; ``holdings``: what
    each page holds, let go of when it closes (:class:`~workbench.ui.pages.PageHoldings`, ended by the app's
    unload): a page's comparison, whose runs stop then."""
    import gradio as gr

    from workbench.ui.run_page import plot_data

    root = c["root"]
    curve_inputs = [c["names"], c["x_low"], c["x_high"], c["points"], c["params_state"]]

    def on_curves(names, low, high, points, state):
        figure, message = draw_curves(names, low, high, points, state)
        return plot_data(figure, "explorer-curves"), message

    # (the range's changes are drawn by the render's listener when there are parameter controls)
    c["names"].change(on_curves, curve_inputs, [c["curves"], c["curves_message"]], show_progress="hidden")
    gr.on([c[k].change for k in ("x_low", "x_high", "points")],
          lambda registry, *rest: on_curves(*rest) if not _has_fields(registry) else (gr.skip(), gr.skip()),
          [c["registry"], *curve_inputs], [c["curves"], c["curves_message"]], show_progress="hidden")

    def on_reload(chosen, compare_chosen, dist_name):
        names = activation_names()
        return (names, gr.CheckboxGroup(choices=names, value=[n for n in chosen or [] if n in names]),
                gr.CheckboxGroup(choices=names, value=[n for n in compare_chosen or [] if n in names]),
                gr.Dropdown(choices=names, value=dist_name if dist_name in names else (names[0] if names else None)))

    c["reload"].click(on_reload, [c["names"], c["compare_names"], c["dist_name"]],
                      [c["registry"], c["names"], c["compare_names"], c["dist_name"]])

    dist_inputs = [c["dist_name"], c["params_state"], c["source"], c["mean"], c["std"], c["low"], c["high"],
                   c["run"], c["site"], c["samples"], c["dist_seed"], c["saturation"]]

    def on_distribution(name, state, source, mean, std, low, high, run, site, samples, seed, saturation):
        figure, message = draw_distribution(name, state, source, mean, std, low, high, root, run, site, samples,
                                            seed, saturation)
        return plot_data(figure, "explorer-dist"), message

    # The fields of every registered activation are drawn once, each activation's shown while it is
    # checked; they are drawn again only when Reload finds the registry changed. A render replaces
    # its listeners, and an edit sent to one it removed is lost: checking an activation must not.
    with c["params_box"]:
        @gr.render(inputs=[c["registry"], c["names"], c["params_state"]], triggers=[c["registry"].change, app.load])
        def render_params(registry, chosen, state):
            controls: list[tuple[str, str, Any]] = []  # (activation, parameter, its control)
            boxes: list[tuple[str, Any]] = []  # (activation, the group of its fields)
            for name in registry or []:
                try:
                    fields = explorer_fields(name)
                except ValueError:  # (unregistered meanwhile: the curves' message says so)
                    continue
                if not fields:
                    continue
                with gr.Group(visible=_shown(name, chosen), key=f"explorer:{name}",
                               elem_id=f"explorer-{name}-fields") as box:
                    gr.Markdown(f"**{name}**")
                    for f in fields:  # (holding the values set on the page: drawn again by Reload, they are kept)
                        value = (state or {}).get(name, {}).get(f.label, f.value)
                        controls.append((name, f.label, _control(f, key=f"explorer:{name}:{f.label}",
                                                                 elem_id=f"explorer-{name}-{f.label}", value=value)))
                boxes.append((name, box))
            if not controls:
                return

            # (the page runs this listener in place of the one outside the render on the same event,
            # as observed with Gradio 6.31: it draws the curves too)
            def on_names(names, *rest):
                return [*on_curves(names, *rest), *[gr.Group(visible=_shown(name, names)) for name, _ in boxes]]

            c["names"].change(on_names, curve_inputs, [c["curves"], c["curves_message"], *[box for _, box in boxes]],
                              show_progress="hidden")

            # Every draw reads all the controls: an edit whose event was lost (made while this
            # render was being replaced) shows on the next one; the state keeps them for the
            # Distributions part and for the draw that follows a change of the activations.
            def on_edit(names, low, high, points, previous, dist_name, *rest):
                state = {}
                for (name, label, _), value in zip(controls, rest[len(dist_inputs) - 2:]):
                    state = set_param(state, name, label, value)
                figure, message = draw_curves(names, low, high, points, state)
                out = [state, plot_data(figure, "explorer-curves"), message]
                if (previous or {}).get(dist_name) != state.get(dist_name):  # the Distributions part's
                    out += list(on_distribution(dist_name, state, *rest[:len(dist_inputs) - 2]))
                else:
                    out += [gr.skip(), gr.skip()]
                return out

            gr.on([control.change for _, _, control in controls] + [c[k].change for k in ("x_low", "x_high",
                                                                                          "points")],
                  on_edit, [c["names"], c["x_low"], c["x_high"], c["points"], c["params_state"], c["dist_name"],
                            *dist_inputs[2:], *[control for _, _, control in controls]],
                  [c["params_state"], c["curves"], c["curves_message"], c["dist_plot"], c["dist_message"]],
                  show_progress="hidden")

    def on_source(source):
        return (gr.Row(visible=source == "normal"), gr.Row(visible=source == "uniform"),
                gr.Column(visible=source == "recorded run"))

    c["source"].change(on_source, c["source"], [c["normal_box"], c["uniform_box"], c["recorded_box"]])

    def on_runs(current):
        try:
            runs = stored_runs(root)
        except Exception:
            runs = []
        return gr.Dropdown(choices=runs, value=current if current in runs else (runs[0] if runs else None))

    def on_run(run, current):
        try:
            sites, chosen = run_sites(root, run), default_site(root, run)
        except Exception:
            sites, chosen = [], None
        return gr.Dropdown(choices=sites, value=current if current in sites else chosen)

    for trigger in (c["runs_refresh"].click, c["source"].change):
        trigger(on_runs, c["run"], c["run"])
    # (then drawn: a run whose default site is None, as the last one's was, changes no site, yet its message differs)
    c["run"].change(on_run, [c["run"], c["site"]], c["site"]).then(
        on_distribution, dist_inputs, [c["dist_plot"], c["dist_message"]], show_progress="hidden")
    gr.on([c[k].change for k in ("dist_name", "source", "mean", "std", "low", "high", "site", "samples",
                                 "dist_seed", "saturation")],
          on_distribution, dist_inputs, [c["dist_plot"], c["dist_message"]], show_progress="hidden")

    compare_outputs = [c["compare_status"], c["compare_metrics"], c["compare_layers"], c["compare_table"]]

    def drawn(comparison):
        status, metrics, layers, table = comparison_outputs(comparison)
        return status, plot_data(metrics, "explorer-metrics"), plot_data(layers, "explorer-layers"), table

    holdings = holdings if holdings is not None else PageHoldings()

    def on_train(current, names, steps, seed, depth, width, lr, dataset, mode, request):
        comparison, message = start_comparison(current, names, steps, seed, depth, width, lr, dataset, mode)
        session = session_of(request)
        # (a closed page stops its runs: Gradio deletes its state only an hour later; a start refused leaves the
        # page its comparison, held as it was)
        if session is not None and comparison is not current:
            holdings.hold(session, "comparison", None if comparison is None else functools.partial(
                _stop_unless_done, comparison))
        if comparison is None:  # (also as a pop-up: the message sits under the form, out of view)
            gr.Warning(pop_up_text(message))
        running = comparison is not None and not comparison.done
        return (comparison, message, gr.Timer(active=running), gr.Button(interactive=running), *drawn(comparison))

    # Gradio passes the page's request to a parameter annotated gr.Request; written in the signature, the
    # annotation is a string (this module's annotations are postponed) naming a gr it cannot resolve: None came
    on_train.__annotations__["request"] = gr.Request
    c["train"].click(on_train, [c["comparison"], c["compare_names"], c["steps"], c["seed"], c["depth"], c["width"],
                                c["lr"], c["dataset"], c["mode"]],
                     [c["comparison"], c["compare_message"], c["timer"], c["stop"], *compare_outputs],
                     show_progress="minimal")

    def on_stop(comparison):
        if comparison is None:
            return "_Nothing to stop._", gr.Timer(active=False), gr.Button(interactive=False), *drawn(comparison)
        ended = comparison.done
        comparison.stop(wait=True)
        return (("_It had ended already._" if ended else "Stopped."), gr.Timer(active=False),
                gr.Button(interactive=False), *drawn(comparison))

    c["stop"].click(on_stop, c["comparison"], [c["compare_message"], c["timer"], c["stop"], *compare_outputs],
                    show_progress="minimal")

    def on_tick(comparison):
        done = comparison is None or comparison.done
        # (the tick that finds the runs ended, the last one, greys Stop out and replaces "Training ..." under it;
        # while they run both are left as they are)
        message = ended_message(comparison) if done and comparison is not None else gr.skip()
        return (gr.Timer(active=not done), gr.Button(interactive=False) if done else gr.skip(), message,
                *drawn(comparison))

    c["timer"].tick(on_tick, c["comparison"], [c["timer"], c["stop"], c["compare_message"], *compare_outputs],
                    show_progress="hidden")
