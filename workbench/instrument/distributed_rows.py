"""The rows of a data-parallel step, rank by rank and merged: what each rank sends
(:func:`watch_rows`, :func:`tensor_sums`, :func:`flatten`/:func:`unflatten`, the numbers of one
``all_gather``) and how rank 0 merges them into the rows of the global batch (:func:`merge_rows`,
:func:`scale`). :mod:`workbench.instrument.distributed` runs the exchange; the merge rules are in
its docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from workbench.instrument.recorder import StepRecord
from workbench.instrument.reduce import EMPTY, StepSums
from workbench.instrument.schema import SUMS

__all__ = ["merge_rows", "scale", "tensor_sums", "watch_rows", "flatten", "unflatten"]

SUM, SUM_SQ, ABS_SUM, MIN, MAX, NONZERO, NAN, INF, SHIFT = (SUMS.index(name) for name in (
    "sum", "sum_sq", "abs_sum", "min", "max", "nonzero", "nan", "inf", "shift"))
_EMPTY = np.array(EMPTY)
def tensor_sums(tensors: Sequence[torch.Tensor], bins: int | None = None, step_sums: StepSums | None = None,
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """The raw SUMS rows ``(n, 9)`` of ``tensors`` and their histograms ``(n, bins)`` (or None), in
    float64, by the watch's own reducers (``step_sums``, reset and reused; default: a new one)."""
    if step_sums is None:
        step_sums = StepSums(bins, capacity=len(tensors))
    step_sums.reset()
    step_sums.add_many([t.detach() for t in tensors])
    return step_sums.rows()


def scale(sums: np.ndarray, factor: float) -> np.ndarray:
    """The sums of ``factor * x`` (factor > 0) from those of ``x``."""
    out = sums.copy()
    out[:, [SUM, ABS_SUM, MIN, MAX, SHIFT]] *= factor
    out[:, SUM_SQ] *= factor * factor
    return out


def _rebin(counts: np.ndarray, lo: float, hi: float, edges: np.ndarray) -> np.ndarray:
    """``counts`` of equal bins over [lo, hi] spread over the bins of ``edges`` in proportion to
    the overlap; a zero-width range puts its counts in the bin holding ``lo``."""
    bins = len(edges) - 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return np.zeros(bins)
    if hi <= lo:
        out = np.zeros(bins)
        width = edges[-1] - edges[0]
        at = 0 if width <= 0 else min(int((lo - edges[0]) / width * bins), bins - 1)
        out[max(at, 0)] = counts.sum()
        return out
    source = np.linspace(lo, hi, len(counts) + 1)
    below = np.interp(edges, source, np.r_[0.0, np.cumsum(counts, dtype=np.float64)])
    return np.diff(below)


def merge_rows(parts: Sequence[tuple | None], concat_kinds: Sequence[str] = ("activation", "grad_output"),
               ) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray | None, list[np.ndarray], np.ndarray | None]:
    """Rows of several ranks merged into the rows of their tensors taken together.

    Args:
        parts: per rank, ``(keys, numel, sums, histograms or None[, edges])`` (None: the rank sent
            nothing); ``edges`` (rows, 2) is the range each histogram's bins divide (default: the
            row's [min, max]). Rows of ranks with the same ``(module, call, kind, tensor)`` are one row.
        concat_kinds: the kinds whose shapes concatenate along dim 0 (the batch); other kinds keep
            the first rank's shape (a parameter's shards carry the whole parameter's shape).

    Returns:
        ``(keys, numel, sums, histograms, where, edges)``: merged rows in the order they first
        appear (rank 0's first), for each rank the merged row of each of its rows (None for a rank
        that sent nothing), and the merged histograms' ranges (None without histograms): where the
        ranks' ranges agree their counts add, else each rank's are re-binned onto the ranges' union.
    """
    index: dict[tuple, int] = {}
    keys: list[tuple] = []
    shapes: list[list] = []
    where: list[np.ndarray | None] = []
    for part in parts:
        if part is None:
            where.append(None)
            continue
        rows = np.empty(len(part[0]), np.int64)
        for i, key in enumerate(part[0]):
            m = index.setdefault(key[:4], len(keys))
            if m == len(keys):
                keys.append(key)
                shapes.append([key[4]])
            else:
                shapes[m].append(key[4])
            rows[i] = m
        where.append(rows)
    n = len(keys)
    present = [p for p in parts if p is not None]
    bins = next((p[3].shape[1] for p in present if p[3] is not None), None)
    if not present:
        return (), np.zeros(0, np.int64), np.zeros((0, len(SUMS))), None, where, None
    m_all = np.concatenate([w for w in where if w is not None])
    numel_all = np.concatenate([np.asarray(p[1], np.int64) for p in present])
    sums_all = np.concatenate([np.asarray(p[2], np.float64).reshape(-1, len(SUMS)) for p in present])
    filled = numel_all > 0
    # each merged row's shift: that of its first source with values; the others re-centred on it
    first = np.full(n, len(m_all), np.int64)
    np.minimum.at(first, m_all[filled], np.flatnonzero(filled))
    has = first < len(m_all)
    shift = np.zeros(n)
    shift[has] = sums_all[first[has], SHIFT]
    n_r = numel_all.astype(np.float64)
    d = np.where(filled, sums_all[:, SHIFT] - shift[m_all], 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        s_r = np.where(filled, sums_all[:, SUM], 0.0)
        q_r = np.where(filled, sums_all[:, SUM_SQ], 0.0)
        sums = np.empty((n, len(SUMS)))
        sums[:, SUM] = np.bincount(m_all, s_r + n_r * d, minlength=n)
        sums[:, SUM_SQ] = np.bincount(m_all, q_r + 2 * d * s_r + n_r * d * d, minlength=n)
    for column in (ABS_SUM, NONZERO, NAN, INF):
        sums[:, column] = np.bincount(m_all, np.where(filled, sums_all[:, column], 0.0), minlength=n)
    sums[:, MIN], sums[:, MAX] = np.inf, -np.inf
    np.minimum.at(sums[:, MIN], m_all[filled], sums_all[filled, MIN])  # (NaN wins, as in torch.aminmax)
    np.maximum.at(sums[:, MAX], m_all[filled], sums_all[filled, MAX])
    sums[:, SHIFT] = shift
    sums[~has] = _EMPTY
    numel = np.bincount(m_all, numel_all, minlength=n).astype(np.int64)
    for m, key in enumerate(keys):
        if len(shapes[m]) > 1 and key[2] in concat_kinds:
            s = shapes[m]
            if all(len(x) >= 1 and len(x) == len(s[0]) and isinstance(x[0], int) and tuple(x[1:]) == tuple(s[0][1:])
                   for x in s):
                keys[m] = key[:4] + ((sum(x[0] for x in s), *s[0][1:]),)
    hist = ranges = None
    if bins:
        hist = np.zeros((n, bins), np.float32)
        hist_all = np.concatenate([p[3] if p[3] is not None else np.zeros((len(p[0]), bins), np.float32)
                                   for p in present]).astype(np.float64)
        # each source's range, and each merged row's: the union of its sources' (NaN ones left out)
        lo_hi = np.concatenate([np.asarray(p[4], np.float64) if len(p) > 4 and p[4] is not None
                                else np.asarray(p[2], np.float64).reshape(-1, len(SUMS))[:, [MIN, MAX]]
                                for p in present])
        ranges = np.column_stack([np.full(n, np.inf), np.full(n, -np.inf)])
        finite = filled & np.isfinite(lo_hi).all(axis=1)
        np.minimum.at(ranges[:, 0], m_all[finite], lo_hi[finite, 0])
        np.maximum.at(ranges[:, 1], m_all[finite], lo_hi[finite, 1])
        ranges[~np.isfinite(ranges).all(axis=1)] = np.nan
        # a source with an infinite range (an infinity in its values) leaves its row unbinned, as one process does
        ranges[np.unique(m_all[filled & ~np.isfinite(lo_hi).all(axis=1)])] = np.nan
        binned = np.isfinite(ranges).all(axis=1)
        same = finite & (lo_hi[:, 0] == ranges[m_all, 0]) & (lo_hi[:, 1] == ranges[m_all, 1])
        rebin = (np.bincount(m_all, finite & ~same, minlength=n) > 0) & binned
        plain = finite & binned[m_all] & ~rebin[m_all]
        totals = np.zeros((n, bins))
        np.add.at(totals, m_all[plain], hist_all[plain])
        for m in np.flatnonzero(rebin):
            edges = np.linspace(ranges[m, 0], ranges[m, 1], bins + 1)
            for j in np.flatnonzero((m_all == m) & finite):
                totals[m] += _rebin(hist_all[j], lo_hi[j, 0], lo_hi[j, 1], edges)
        hist[:] = totals
    return tuple(keys), numel, sums, hist, where, ranges


#: kinds whose rows differ by rank by nature (each rank's shard of the batch): merged across ranks
_PER_SHARD = ("activation", "grad_output")


def watch_rows(record: StepRecord, rank: int) -> tuple[StepRecord, bool]:
    """The rows of a watch's record that this rank sends: activations and output gradients; other
    kinds (parameter updates ...: equal on every replica) on rank 0 only; never the watch's own
    parameters and gradients (the recorder takes those; the watch's gradient hooks run before DDP's
    all-reduce ends). Returns the record and whether parameter rows were left out."""
    kinds = [key[2] for key in record.keys]
    keep = [i for i, kind in enumerate(kinds)
            if kind in _PER_SHARD or (rank == 0 and kind not in ("param", "param_grad"))]
    if len(keep) == len(kinds):
        return record, False
    index = np.asarray(keep, np.intp)
    return dataclasses.replace(
        record, keys=tuple(record.keys[i] for i in keep), numel=np.asarray(record.numel)[index],
        sums=np.asarray(record.sums)[index],
        histograms=record.histograms[index] if record.histograms is not None else None,
        histogram_edges=record.histogram_edges[index] if record.histogram_edges is not None else None,
        histogram_sampled=record.histogram_sampled[index] if record.histogram_sampled is not None else None,
        tensors=record.tensors[index] if record.tensors is not None else None), bool(
        {"param", "param_grad"} & set(kinds))


def flatten(payload: dict) -> tuple[np.ndarray, tuple | None]:
    """A payload's numbers in one float64 array (numel, sums, histogram range and counts of each
    row, then the metric values) and its layout (keys, number of the watch's rows, metric names, row width);
    (empty, None) for a failed payload."""
    if "keys" not in payload:
        return np.zeros(0), None
    hist = payload["histograms"]
    width = 1 + len(SUMS) + (2 + hist.shape[1] if hist is not None else 0)
    names = tuple(payload["metrics"])
    columns = [np.asarray(payload["numel"], np.float64)[:, None], payload["sums"]]
    if hist is not None:
        columns += [np.asarray(payload["edges"], np.float64).reshape(-1, 2), np.asarray(hist, np.float64)]
    rows = np.concatenate(columns, 1) if len(payload["keys"]) else np.zeros((0, width))
    values = np.array([float(payload["metrics"][k]) for k in names], np.float64)
    return np.concatenate([rows.reshape(-1), values]), (payload["keys"], payload["n_watch"], names, width)


def unflatten(buffer: np.ndarray, layout: tuple | None) -> dict | None:
    """The payload a rank sent as numbers (see :func:`flatten`) with the layout it sent before."""
    if layout is None:
        return None
    keys, n_watch, names, width = layout
    size, _, step = buffer[:3]
    data = buffer[3:3 + int(size)]
    rows = data[:len(keys) * width].reshape(len(keys), width)
    return {"step": int(step), "keys": keys, "n_watch": n_watch, "numel": rows[:, 0].astype(np.int64),
            "sums": rows[:, 1:1 + len(SUMS)].copy(),
            "edges": rows[:, 1 + len(SUMS):3 + len(SUMS)].copy() if width > 1 + len(SUMS) else None,
            "histograms": rows[:, 3 + len(SUMS):].astype(np.float32) if width > 1 + len(SUMS) else None,
            "metrics": dict(zip(names, data[len(keys) * width:].tolist())), "errors": ()}
