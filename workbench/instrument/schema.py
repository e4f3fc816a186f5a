"""The record schema, written once: the kinds of tensor recorded, the raw sums a reducer
produces for a tensor, and the columns of a row.

One row per tensor per call site per recorded step (DESIGN.md, "Record schema"):
:data:`KEY_COLUMNS` name the tensor, :data:`STAT_COLUMNS` are its statistics, derived by
:func:`finish` from the raw :data:`SUMS` that the reducers (:mod:`workbench.instrument.reduce`)
leave in a step's rows. The recorder's frames, the run store's tables and the UI all read these.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ACTIVATION", "GRAD_OUTPUT", "PARAM", "PARAM_GRAD", "UPDATE", "KINDS", "KIND_OPTIONS", "SUMS",
           "SHIFT_SAMPLE", "KEY_COLUMNS", "STAT_COLUMNS", "ROW_COLUMNS", "INT_COLUMNS", "TEXT_COLUMNS", "STATUSES",
           "MAX_BINS", "anomalous", "finish", "site_name", "check_filter", "checked_long", "whole_number",
           "checked_bins"]

ACTIVATION = "activation"  #: a module's output (every tensor leaf of a structured output)
GRAD_OUTPUT = "grad_output"  #: the gradient w.r.t. a module's output
PARAM = "param"  #: a parameter's value, once per recorded step
PARAM_GRAD = "param_grad"  #: a parameter's gradient, as accumulated by the step's backward
#: a parameter's update over a recorded step (its value at ``step()`` less its value when the step
#: started): the optimizer's step, whose norm over the parameter's is the update ratio
UPDATE = "update"
KINDS = (ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, UPDATE)
#: The option of ``workbench.watch`` that records each kind
KIND_OPTIONS = {ACTIVATION: "activations", GRAD_OUTPUT: "gradients", PARAM: "parameters", PARAM_GRAD: "parameter_grads",
                UPDATE: "updates"}

#: The sample a tensor's shift is taken from: the values at ``(i * n) // SHIFT_SAMPLE`` of the flat
#: tensor of ``n`` values, ``i`` in ``range(SHIFT_SAMPLE)``; the shift is its middle value by rank,
#: NaN ranking last and ties by position (every reducer picks the same element).
SHIFT_SAMPLE = 15
#: The most histogram bins a row may have: the size of the sample a large tensor is binned from on
#: the CPU (:data:`~workbench.instrument._stats_kernels.SAMPLE`). More bins than sampled values leave
#: most bins empty by chance, and a row's counts are kept per recorded step (4 bytes a bin), so a
#: larger ``bins`` only costs memory; checked before anything is allocated.
MAX_BINS = 16384
#: The raw per-tensor sums a reducer writes, in this order. ``sum`` and ``sum_sq`` are of
#: ``x - shift``, where ``shift`` is the median of a sample of :data:`SHIFT_SAMPLE` of the tensor's
#: values (0 when that is not finite): with sums around a typical value of the tensor, the variance
#: keeps its precision when the mean is large against the spread, and an outlier (the first value
#: of a tensor, a CLS token's) shifts nothing, wherever it lies. Raw sums (not means and stds) keep
#: the hooks to plain reductions, and sums of several tensors (or ranks) combine; the divisions
#: happen once, on the host, in :func:`finish`.
SUMS = ("sum", "sum_sq", "abs_sum", "min", "max", "nonzero", "nan", "inf", "shift")
SUM, SUM_SQ, ABS_SUM, MIN, MAX, NONZERO, NAN, INF, SHIFT = range(len(SUMS))

#: What names a row: the step, the call site (module path and call index), the kind, the tensor
#: leaf inside a structured output (``out``, ``out.0``, ``out.1.h``) and its shape.
KEY_COLUMNS = ("step", "module", "call", "kind", "tensor", "shape")
#: The statistics of a row, derived from its sums and its numel.
STAT_COLUMNS = ("numel", "mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count")
#: Columns of ``to_pandas()``.
ROW_COLUMNS = KEY_COLUMNS + STAT_COLUMNS
INT_COLUMNS = ("step", "call", "numel", "nan_count", "inf_count")
TEXT_COLUMNS = ("module", "kind", "tensor", "shape")

#: How a run ends: ``Watch.close(status)`` and the run store's status (a run still being written
#: is ``running``; one whose writer died is read ``interrupted``).
STATUSES = ("finished", "stopped", "failed")


def site_name(module: str, call: int, tensor: str, called_again: bool, kind: str = ACTIVATION) -> str:
    """How the views and the findings name a row's call site: the module path (``(model)`` for the
    model itself), ``#call`` where the module is called more than once a step, and the tensor
    where it is not the output itself (``out``). A parameter's rows (``param``, ``param_grad``,
    ``update``) are named as ``named_parameters()`` names it: ``layers.0.weight``."""
    if kind in (PARAM, PARAM_GRAD, UPDATE):
        return f"{module}.{tensor}" if module else tensor
    name = module or "(model)"
    if called_again:
        name += f"#{call}"
    if tensor != "out":
        name += " " + tensor
    return name


def whole_number(name: str, value: Any, low: int, what: str, high: int | None = None) -> int:
    """``value`` as a Python int: any integer (``int``, a numpy integer, any ``numbers.Integral``)
    but a bool, of at least ``low`` (and at most ``high``, where given). A plain int keeps the stored
    facts JSON (a numpy one is not).

    Args:
        name: the parameter, as the error names it (``every``, ``bins`` ...).
        value: what was passed.
        low: the least value allowed.
        what: what is expected, as the error says it (``a positive int (record every Nth step)``).
        high: the largest value allowed, or None for no limit.

    Raises:
        ValueError: naming ``name``, ``value`` and ``what``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return int(value)


def checked_bins(bins: Any, what: str = "a positive int") -> int:
    """``bins`` as a plain int from 1 to :data:`MAX_BINS`.

    Raises:
        ValueError: naming the value, the limit and why there is one.
    """
    return whole_number("bins", bins, 1, f"{what} of at most {MAX_BINS} ({BINS_LIMIT_REASON})", high=MAX_BINS)


#: Why ``bins`` is at most :data:`MAX_BINS`, as the errors that refuse more say it (the API's, the app's form's).
BINS_LIMIT_REASON = ("the sample a large tensor's histogram is counted from: more bins stay empty and only cost "
                     "memory")


def checked_long(long: Any) -> bool:
    """``metrics(long=...)``'s flag, refused unless a bool (numpy's too): a metric name passed as ``metrics('loss')``
    would otherwise be read as true and give the long frame of every metric.

    Raises:
        TypeError: naming the value, what is accepted and, for a name, how to take one metric.
    """
    if isinstance(long, (bool, np.bool_)):
        return bool(long)
    fix = (f" metrics() takes no metric name: it has a column per metric, so take one with metrics()[{long!r}]"
           f" (or metrics(long=True) and its rows with name == {long!r})." if isinstance(long, str) else "")
    raise TypeError(f"metrics(long=...) must be True (one row per logged value) or False (a column per metric), "
                    f"got {long!r}.{fix}")


def check_filter(what: str, module: Any, kind: Any, paths: Sequence[str], kinds: Sequence[str] = ()) -> None:
    """Refuse a ``module`` / ``kind`` filter (None: any) that can match no row: a kind that is not one
    of :data:`KINDS`, or not one of ``kinds`` (those recorded: an empty frame would read as sites without
    values; none known yet: any kind), a module that is not one of ``paths`` (``''``: the model itself; none
    known yet: any module).

    Raises:
        ValueError: naming the value, close matches and what is accepted.
    """
    def hint(value: Any, choices: Sequence[str]) -> str:
        # a choice the value begins ('act': 'activation') or a path it is the last part of ('fc': 'block.fc'),
        # then the ones spelled alike ('activatoin')
        text = str(value)
        named = [c for c in choices if text and c and (c.startswith(text) or c.rsplit(".", 1)[-1] == text)]
        alike = difflib.get_close_matches(text, list(choices), n=3, cutoff=0.5)
        close = list(dict.fromkeys(named + alike))[:3]
        return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""

    if kind is not None and kind not in KINDS:
        raise ValueError(f"{what}: kind {kind!r} is not one of {', '.join(KINDS)}{hint(kind, KINDS)}.")
    if kind is not None and kinds and kind not in kinds:
        raise ValueError(f"{what}: no {kind} rows were recorded; the kinds recorded are {', '.join(sorted(kinds))}. "
                         f"A watch records them with {KIND_OPTIONS[kind]}=True"
                         f"{' in steps with a backward pass' if kind in (GRAD_OUTPUT, PARAM_GRAD) else ''}.")
    if module is not None and paths and module not in paths:
        listed = ", ".join(repr(p) for p in list(paths)[:20]) + (" ..." if len(paths) > 20 else "")
        raise ValueError(f"{what}: no module at path {module!r}{hint(module, paths)}; the paths are {listed} "
                         "('' is the model itself), or None for every one.")


def anomalous(rows: pd.DataFrame) -> pd.Series:
    """Which rows hold a NaN or an Inf."""
    return (rows.nan_count > 0) | (rows.inf_count > 0)


def finish(numel: np.ndarray, sums: np.ndarray) -> dict[str, np.ndarray]:
    """The :data:`STAT_COLUMNS` from host copies of the sums, vectorized over rows.

    Args:
        numel: (n,) element counts.
        sums: (n, 9) rows of :data:`SUMS`.

    Returns:
        A dict of (n,) arrays, one per statistic column.
    """
    n = numel.astype(np.float64)
    s, sq, a, lo, hi, nonzero, nan, inf, shift = sums.T
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mean = shift + s / n
        # unbiased, as torch.std; sums around the shift keep the difference accurate
        var = np.maximum(sq - s * (s / n), 0.0) / (n - 1)
        std = np.where(n > 1, np.sqrt(var), np.nan)
        std = np.where(np.isfinite(mean), std, np.nan)
        return {
            "numel": numel.astype(np.int64),
            "mean": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "abs_mean": a / n,
            # sqrt of the sum of x**2; torch.linalg.norm's answer where a value is not finite
            "norm": np.where(nan > 0, np.nan, np.where(inf > 0, np.inf,
                                                       np.sqrt(np.maximum(sq + shift * (2 * s + n * shift), 0.0)))),
            "zero_frac": np.where(n > 0, (n - nonzero) / n, np.nan),
            "nan_count": nan.astype(np.int64),
            "inf_count": inf.astype(np.int64),
        }
