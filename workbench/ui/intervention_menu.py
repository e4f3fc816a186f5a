"""The run page's intervention menu: what a page may do to a call site's output, checked.

A page picks a call site the run recorded (:func:`intervention_sites`, :func:`parse_site`) and an
operation from a fixed menu (:data:`INTERVENTIONS`: zero units, scale, noise, clamp) with its
parameters; :func:`intervention_spec` checks them into an :class:`InterventionSpec`, whose function
the watch's ``patch`` applies (zero units goes through ``ablate``). No code comes from a page. A
live run keeps an :class:`InterventionRecord` of each (:class:`workbench.ui.live_run.LiveRun`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from workbench.instrument.interventions import MARKER, listed
from workbench.ui.runs import name_breaks, shown
from workbench.ui.views import RunView

__all__ = ["INTERVENTIONS", "INTERVENTION_METRIC", "INTERVENTION_COLUMNS", "INTERVENTION_WIDTHS",
           "INTERVENTION_DATATYPES", "InterventionRecord", "InterventionSpec",
           "intervention_spec", "interventions_table", "parse_site", "parse_units", "intervention_sites",
           "shown_interventions", "site_choices"]


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
    spec: InterventionSpec | None = None  # what it does, with its values in full (``what`` may shorten them)


INTERVENTION_COLUMNS = ["id", "site", "intervention", "from step", "to step", "status"]
#: The panel's table's column widths: every column in view in the panel's width (with the intervention named in
#: full, "zero units [0, 1, 2, 3, 4, ... 7] (8 of them)", the steps and the status went out of sight to the right).
INTERVENTION_WIDTHS = ["8%", "17%", "31%", "11%", "11%", "22%"]
#: Its cells' datatypes: the site is HTML (where its name may break between its parts).
INTERVENTION_DATATYPES = ["str", "html", "str", "str", "str", "str"]



def interventions_table(records: Sequence[InterventionRecord]) -> pd.DataFrame:
    rows = [{"id": r.id, "site": r.site, "intervention": r.what, "from step": r.start,
             "to step": "" if r.end is None else r.end,
             "status": r.status + (f": {r.error}" if r.error else "")} for r in records]
    return pd.DataFrame(rows, columns=INTERVENTION_COLUMNS)


def shown_interventions(table: pd.DataFrame) -> Any:
    """The interventions table (:func:`interventions_table`) as the panel shows it: a pandas ``Styler`` whose site
    names may break over two lines between their parts, in the columns of :data:`INTERVENTION_WIDTHS` (an empty
    table as it is). The cells' values are the table's own."""
    if table.empty:
        return table
    return table.style.format({"site": name_breaks})


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
        said = f"{value:g}" if float(f"{value:g}") == value else repr(value)  # (1000001 read "1e+06": in range)
        raise ValueError(f"{name} must lie in [{low:g}, {high:g}], got {said}.")
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
