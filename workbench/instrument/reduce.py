"""Reduction: each tensor a hook hands over becomes a row of raw :data:`~workbench.instrument.schema.SUMS`.

:class:`StepSums` holds one step's rows. It hands each tensor to the first of
its reducers that takes it:

- :class:`~workbench.instrument.reduce_cpu.CompiledCpuReducer`: CPU tensors,
  by compiled one-pass kernels straight into the step's host rows;
- :class:`~workbench.instrument.reduce_triton.TritonReducer`: CUDA tensors,
  batched and read where they lie by two Triton kernels;
- :class:`~workbench.instrument.reduce_torch.TorchReducer`: anything, with
  torch's kernels, batched per device.

Which reducers a step uses is chosen per instance (``StepSums(reducers=...)``,
``watch(model, reducers=...)``): the default list is :func:`default_reducers`,
and the tests pass others to run every path on the CPU. Nothing waits for a
device until :meth:`StepSums.rows`, which moves what the device reducers left
there to the host in one transfer per device.

Histograms (``StepSums(bins=...)``) are made comparable over steps by a fixed range per row: a
row's first recorded step bins its tensor over the tensor's own [min, max]; that range, widened
by :data:`MARGIN` of its width on each side (not past 0 for a tensor of one sign), is then kept
for the row's later steps, whose values outside it count in the end bin on their side (their
exact min and max are in the row's statistics). Once its values of a step leave the range or come
to span less than :data:`SHRINK` of it, that step is still binned over the range (its outliers in
the end bins), and the row's next step gets a new range, from that step's values. So a site's
histograms share their edges over long stretches of steps, and a view draws them side by side
as they are, without re-binning (equal-width bins of a range fitted to the site keep the
resolution where its values are, which TensorBoard's exponentially spaced buckets spend on
magnitudes the site never takes). Rows are matched from step to step by their index, which
follows the model's call order: where a row holds another tensor than at the step before, its
histogram is still right (the edges go with it), only re-ranged. The ranges are decided on the
host from the sums the step fetched anyway: no device sync.

The compiled CPU kernels count the histogram of a tensor of at least
:data:`~workbench.instrument._stats_kernels.SAMPLE_FROM` values from a sample of
:data:`~workbench.instrument._stats_kernels.SAMPLE` values (one drawn in each of as many equal
strata), scaled to the tensor's size; the row says so (``sampled``). By the
Dvoretzky-Kiefer-Wolfowitz inequality the sample's CDF is within 0.02 of the tensor's
everywhere with probability at least 1 - 2 exp(-2 * 16384 * 0.02**2) > 0.99999 (stratified
draws do no worse than independent ones), and the test distributions are checked against that
bound. NaN, infinity and zero counts come from the statistics, exact whatever the method.
"""

from __future__ import annotations

import difflib
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.instrument.schema import MAX, MIN, SUMS, checked_bins

__all__ = ["StepSums", "HostRows", "DeviceSums", "Reducer", "default_reducers", "resolve_reducers", "REDUCER_NAMES",
           "next_ranges", "EMPTY", "MARGIN", "SHRINK"]

#: The sums of an empty tensor.
EMPTY = (0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0)
#: A row's fixed histogram range is its values' range widened by this share of its width on each side.
MARGIN = 0.125
#: A row whose values span less than this share of its range gets a new range.
SHRINK = 0.25
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class HostRows:
    """The rows of a step on the host: ``sums`` (rows, 9) float64 and histogram ``counts``
    (rows, bins) float32 (None without histograms), grown as needed. With histograms, also each
    row's fixed range ``edges`` (rows, 2) float64 (NaN: none, the tensor's own range is used),
    kept from step to step, and ``sampled`` (rows,) bool: its histogram was counted from a
    sample (drawn anew each step: ``draws`` counts the steps). The compiled kernels write into them by address: ``sums_address``,
    ``counts_address`` and ``edges_address`` are kept up to date."""

    def __init__(self, bins: int | None, capacity: int) -> None:
        self.bins = bins
        self.sums = np.empty((max(capacity, 1), len(SUMS)))
        self.counts = np.zeros((len(self.sums), bins), np.float32) if bins else None
        self.edges = np.full((len(self.sums), 2), np.nan)
        self.sampled = np.zeros(len(self.sums), bool)
        self.draws = 0  # steps so far: each step's histogram samples are drawn anew
        self._addresses()

    def __len__(self) -> int:
        return len(self.sums)

    def grow(self) -> None:
        self.sums = np.concatenate([self.sums, np.empty_like(self.sums)])
        if self.counts is not None:
            self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
        self.edges = np.concatenate([self.edges, np.full_like(self.edges, np.nan)])
        self.sampled = np.concatenate([self.sampled, np.zeros_like(self.sampled)])
        self._addresses()

    def _addresses(self) -> None:
        # kept, not read from ``ndarray.ctypes`` at each use: that builds an object per read
        self.sums_address = self.sums.ctypes.data
        self.sums_view = memoryview(self.sums.reshape(-1))  # element reads without numpy's indexing
        self.counts_address = self.counts.ctypes.data if self.counts is not None else 0
        self.edges_address = self.edges.ctypes.data


def next_ranges(sums: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each row's histogram range for its next step (see the module doc), from its ``sums``
    (rows, 9) and its fixed range ``edges`` (rows, 2) of this step (NaN: none): kept while the
    values lie in it and span at least :data:`SHRINK` of it; else their own range widened by
    :data:`MARGIN` (NaN where that is not a finite range of some width: the next step bins over
    its own range). The widening stops at float32's largest value where the values lie within
    it: the reductions bin in the tensor's float type (float32 for float16 and bfloat16), and take
    a range that is not finite there for none."""
    lo, hi = sums[:, MIN], sums[:, MAX]
    kept_lo, kept_hi = edges[:, 0], edges[:, 1]
    with np.errstate(invalid="ignore"):
        keep = (lo >= kept_lo) & (hi <= kept_hi) & (hi - lo >= SHRINK * (kept_hi - kept_lo))
        margin = MARGIN * (hi - lo)
        new_lo = np.where(lo >= 0, np.maximum(lo - margin, 0.0), lo - margin)
        new_hi = np.where(hi <= 0, np.minimum(hi + margin, 0.0), hi + margin)
        new_lo = np.where(lo >= -_FLOAT32_MAX, np.maximum(new_lo, -_FLOAT32_MAX), new_lo)
        new_hi = np.where(hi <= _FLOAT32_MAX, np.minimum(new_hi, _FLOAT32_MAX), new_hi)
        usable = np.isfinite(new_lo) & np.isfinite(new_hi) & (hi > lo)
    fresh = np.where(usable[:, None], np.column_stack([new_lo, new_hi]), np.nan)
    return np.where(keep[:, None], edges, fresh)


@dataclass
class DeviceSums:
    """Sums a reducer left on a device, for :meth:`StepSums.rows` to fetch: the record ``rows``
    they belong to and ``sums``, either one row per record row or (with ``grid_rows`` and
    ``filler``, see :func:`~workbench.instrument.reduce_torch.chunk_sums`) per grid row, to be
    combined on the host; ``counts`` are their histograms, or None."""

    rows: list[int]
    sums: torch.Tensor
    counts: torch.Tensor | None = None
    grid_rows: np.ndarray | None = None
    filler: np.ndarray | None = None


class Reducer:
    """One way of reducing tensors to rows of SUMS (and histograms). A step's reducers are tried
    in order; the first whose :meth:`takes` says yes reduces the tensor. Called under the step's
    lock, one call at a time. One object serves one open watch at a time (which it holds
    weakly; ``watch(reducers=...)`` refuses one that another open watch holds)."""

    # the watch this reducer serves (weakly held; None before any): a second open watch may not share it. Private:
    # the watch sets it and reads it (watch._check_unshared)
    _held_by: Any = None

    def bind(self, host: HostRows) -> None:
        """Write into ``host`` (called by the StepSums that uses this reducer: one watch's at a time)."""
        self.host = host

    def parts(self) -> tuple[Reducer, ...]:
        """This reducer and those it hands tensors to (a fallback): each serves one open watch."""
        return (self,)

    def takes(self, x: torch.Tensor) -> bool:
        raise NotImplementedError

    def add(self, x: torch.Tensor, row: int, defer: bool) -> None:
        """Reduce ``x`` into ``row``; with ``defer``, nothing changes ``x`` before :meth:`flush`, so it
        may be kept by reference and reduced with others then."""
        raise NotImplementedError

    def add_many(self, entries: list[tuple[torch.Tensor, int]]) -> None:
        """``add(x, row, defer=True)`` for each entry (a reducer may batch them)."""
        for x, row in entries:
            self.add(x, row, defer=True)

    def flush(self) -> None:
        """Let go of the tensors kept by reference (reduced, or copied to be reduced later)."""

    def collect(self) -> list[DeviceSums]:
        """Reduce what is left, and give the sums that are still on a device (taken: a second call
        gives only what was added since)."""
        return []

    def reset(self) -> None:
        """Drop everything of this step."""


def default_reducers(bins: int | None = None) -> list[Reducer]:
    """Compiled kernels for CPU tensors, the Triton kernels for CUDA tensors, torch's kernels for
    the rest."""
    from workbench.instrument.reduce_cpu import CompiledCpuReducer
    from workbench.instrument.reduce_torch import TorchReducer
    from workbench.instrument.reduce_triton import TritonReducer
    torch_reducer = TorchReducer()
    return [CompiledCpuReducer(), TritonReducer(fallback=torch_reducer), torch_reducer]


#: The reducers ``watch(reducers=...)`` takes by name: the compiled CPU kernels, the Triton kernels
#: (CUDA tensors; torch's kernels take over after a failure) and torch's kernels (any tensor).
REDUCER_NAMES = ("cpu", "triton", "torch")


def resolve_reducers(reducers: Any) -> list[Reducer] | None:
    """``watch(reducers=...)`` checked, its names made reducers (None: the default ones).

    Args:
        reducers: None, or a non-empty list (or tuple) of :class:`Reducer` objects and names of
            :data:`REDUCER_NAMES`, in order of preference; a single one is taken as a list of one.
            A ``"triton"`` falls back to the list's torch reducer; a list without one gets one at its
            end, which records any tensor the others do not take.

    Raises:
        TypeError: not a list of reducers and names (a reducer class where an object is wanted included).
        ValueError: an empty list, or an unknown name.
    """
    if reducers is None:
        return None
    expected = (f"a list of reducers in order of preference: Reducer objects (TorchReducer() ...) or the names "
                f"{', '.join(map(repr, REDUCER_NAMES))}, e.g. reducers=['torch']; or None for the default ones")
    items = [reducers] if isinstance(reducers, (str, Reducer)) else reducers
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"reducers must be {expected}; got {reducers!r}.")
    if not items:
        raise ValueError(f"reducers is empty: pass {expected}.")
    for item in items:
        if isinstance(item, type) and issubclass(item, Reducer):
            raise TypeError(f"reducers holds the class {item.__name__}, not a reducer: pass an instance, "
                            f"{item.__name__}(), or its name if it has one ({', '.join(map(repr, REDUCER_NAMES))}).")
        if isinstance(item, str) and item not in REDUCER_NAMES:
            close = difflib.get_close_matches(item, REDUCER_NAMES, n=1, cutoff=0.5)
            raise ValueError(f"reducers: unknown reducer name {item!r}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; the names are "
                             f"{', '.join(map(repr, REDUCER_NAMES))}.")
        if not isinstance(item, (str, Reducer)):
            raise TypeError(f"reducers must be {expected}; got {reducers!r}, whose {item!r} is neither.")
    from workbench.instrument.reduce_cpu import CompiledCpuReducer
    from workbench.instrument.reduce_torch import TorchReducer
    from workbench.instrument.reduce_triton import TritonReducer
    # one torch reducer: the list's own, else a new one for both "torch" and triton's fallback. The list
    # ends with it: it takes any tensor, so a tensor the others do not take (or fail on) is still recorded
    fallback = next((r for r in items if isinstance(r, TorchReducer)), None)
    if fallback is None:
        fallback = TorchReducer()
        if "torch" not in items:
            items = [*items, fallback]
    made = {"cpu": CompiledCpuReducer, "torch": lambda: fallback, "triton": lambda: TritonReducer(fallback=fallback)}
    return [made[item]() if isinstance(item, str) else item for item in items]


class StepSums:
    """The sums (and histograms) of one step's tensors, a row per :meth:`add`.

    Thread-safe: a backward may run hooks on other threads.

    Args:
        bins: histogram bins per tensor, or None for no histograms.
        capacity: rows to allocate up front (grows as needed).
        reducers: the reducers to try, in order (default: :func:`default_reducers`); the last
            should take every tensor (a :class:`~workbench.instrument.reduce_torch.TorchReducer`).
        fixed_ranges: keep each row's histogram range from step to step (see the module doc);
            False: every histogram spans its tensor's own [min, max]. Either way
            :meth:`binning` tells the edges.

    Raises:
        ValueError: ``bins`` is not an int from 1 to :data:`~workbench.instrument.schema.MAX_BINS`.
    """

    def __init__(self, bins: int | None = None, capacity: int = 64,
                 reducers: Sequence[Reducer] | None = None, fixed_ranges: bool = False) -> None:
        self.bins, self.fixed_ranges = (checked_bins(bins) if bins else bins), fixed_ranges
        self.host = HostRows(self.bins, capacity)
        self.reducers = list(reducers) if reducers is not None else default_reducers(self.bins)
        if not self.reducers:
            raise ValueError("StepSums needs at least one reducer; pass None for the default ones.")
        for reducer in self.reducers:
            reducer.bind(self.host)
            reducer.reset()  # (a reducer used before, by a watch closed mid-step, holds nothing of that step)
        self._n = 0
        self._used = False  # something was added since the last reset
        self._read = False  # rows() fetched this step's sums
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def reset(self) -> None:
        """Empty, for another step's tensors: the rows start again at 0, the arrays are kept.

        Call it once :meth:`rows` has read the step (what is still staged or queued is dropped).
        """
        if not self._used:
            return  # an idle step
        with self._lock:
            host, n = self.host, self._n
            if host.counts is not None:
                host.counts.fill(0)  # the histogram kernels add to their row
                if self._read and self.fixed_ranges:  # the ranges of the step's rows for the next step
                    host.edges[:n] = next_ranges(host.sums[:n], host.edges[:n])
                host.sampled[:n] = False
            self._n = 0
            self._used = False
            self._read = False
            host.draws += 1
            for reducer in self.reducers:
                reducer.reset()

    def _reducer(self, x: torch.Tensor) -> Reducer:
        for reducer in self.reducers:
            if reducer.takes(x):
                return reducer
        raise TypeError(f"no reducer of this step takes a {x.dtype} tensor on {x.device} "
                        f"(reducers: {[type(r).__name__ for r in self.reducers]}).")

    def add(self, x: torch.Tensor, defer: bool = False) -> int:
        """Reduce ``x`` (any dtype, device and layout), now or, with ``defer``, at the next
        :meth:`flush`; returns its row."""
        with self._lock:
            row = self._n
            if row == len(self.host):
                self.host.grow()
            self._used = True
            self._reducer(x).add(x, row, defer)
            self._n = row + 1  # only once the row is filled or queued: a failed reduction leaves no row
            return row

    def add_many(self, tensors: Sequence[torch.Tensor]) -> list[int]:
        """``[add(x, defer=True) for x in tensors]``, each reducer taking its tensors together: for a
        step's parameters and their gradients, which come by the hundred and which nothing changes
        in between. Returns their rows.

        If it raises, some of the tensors may have rows (filled with NaN) that it did not return.
        """
        with self._lock:
            rows = list(range(self._n, self._n + len(tensors)))
            while rows and rows[-1] >= len(self.host):
                self.host.grow()
            self._used = True
            groups: dict[int, tuple[Reducer, list]] = {}
            for x, row in zip(tensors, rows):
                reducer = self._reducer(x)
                groups.setdefault(id(reducer), (reducer, []))[1].append((x, row))
            self._n += len(rows)  # (taken even if a reducer raises: it may have staged some of them)
            try:
                for reducer, entries in groups.values():
                    reducer.add_many(entries)
            except BaseException:
                self.host.sums[rows] = np.nan  # not np.empty's garbage
                raise
            return rows

    def flush(self) -> None:
        """Reduce what was deferred, or copy what is kept by reference: the tensors may change after."""
        with self._lock:
            for reducer in self.reducers:
                reducer.flush()

    def rows(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Host copies of the sums ``(rows, 9)`` and histogram counts ``(rows, bins)`` (or None):
        the sums of tensors on other devices come over in one transfer per device."""
        with self._lock:
            device_sums = [entry for reducer in self.reducers for entry in reducer.collect()]
            by_device: dict[torch.device, list[DeviceSums]] = {}
            for entry in device_sums:
                by_device.setdefault(entry.sums.device, []).append(entry)
            for entries in by_device.values():
                self._fetch(entries)
            sums = self.host.sums[:self._n].copy()
            counts = self.host.counts[:self._n].copy() if self.host.counts is not None else None
            self._read = True
        return sums, counts

    def binning(self) -> tuple[np.ndarray, np.ndarray] | None:
        """How the histograms that :meth:`rows` read were binned: ``edges`` (rows, 2), the range
        their bins divide equally (the row's fixed range, or the tensor's own [min, max]), and
        ``sampled`` (rows,) bool, counted from a sample; None without histograms. Call it after
        :meth:`rows`."""
        if self.host.counts is None:
            return None
        with self._lock:
            n = self._n
            fixed = self.host.edges[:n]
            own = self.host.sums[:n][:, [MIN, MAX]]
            edges = np.where(np.isfinite(fixed).all(axis=1)[:, None], fixed, own)
            return edges, self.host.sampled[:n].copy()

    def _fetch(self, entries: list[DeviceSums]) -> None:
        """Bring the sums of one device over into the host rows, in one transfer: every entry's sums
        and counts flattened into one tensor."""
        parts = [part.reshape(-1).double() for entry in entries for part in (entry.sums, entry.counts)
                 if part is not None]
        fetched, offset = torch.cat(parts).cpu().numpy(), 0
        for entry in entries:
            sums = fetched[offset:offset + entry.sums.numel()].reshape(entry.sums.shape)
            offset += entry.sums.numel()
            if entry.grid_rows is not None:
                from workbench.instrument.reduce_torch import combine_chunks
                sums = combine_chunks(sums, entry.grid_rows, entry.filler)
            self.host.sums[entry.rows] = sums
            if entry.counts is not None:
                self.host.counts[entry.rows] = fetched[offset:offset + entry.counts.numel()].reshape(entry.counts.shape)
                offset += entry.counts.numel()
