"""The CPU reducer: compiled one-pass kernels (:mod:`workbench.instrument._stats_kernels`) write a
tensor's :data:`~workbench.instrument.schema.SUMS` (and histogram) straight into its row of the
step's host arrays, reading the tensor once where torch's kernels would take about ten passes."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from workbench.instrument import _stats_kernels as kernels
from workbench.instrument.reduce import EMPTY, Reducer
from workbench.instrument.reduce_torch import add_implicit_zeros, as_float, plain_values, zeros_histogram
from workbench.instrument.schema import ABS_SUM, SUM_SQ, SUMS

__all__ = ["CompiledCpuReducer", "DEFER_MAX_BYTES", "DEFER_BYTES", "callbacks", "dense"]

#: Only tensors up to this size are deferred: for them the call costs as much as the reduction; a
#: larger one is reduced at once, while it is still in cache.
DEFER_MAX_BYTES = 256 << 10
#: The queue is reduced once it holds this many bytes, while they are still in cache; it also
#: bounds the memory the queued tensors keep alive.
DEFER_BYTES = 1 << 20

_ROW = len(SUMS)
_ROW_BYTES = _ROW * 8
_EDGES_BYTES = 2 * 8
_loaded: dict[torch.dtype, tuple] = {}  # dtype -> (fast, exact, histogram, batch, check): built once a process


def callbacks(dtype: torch.dtype) -> tuple:
    """The compiled kernels of ``dtype`` (float32 or float64) as C callbacks on raw addresses:
    ``(fast, exact, histogram, batch, check)`` (see :func:`~workbench.instrument._stats_kernels.compile_kernels`),
    built once a process."""
    found = _loaded.get(dtype)
    if found is None:
        found = _loaded[dtype] = kernels.compile_kernels(str(dtype).removeprefix("torch."))
    return found


def dense(x: torch.Tensor) -> bool:
    """Whether the values of the strided tensor ``x`` fill ``x.numel()`` elements of memory from
    ``x.data_ptr()`` on, in any order of its dimensions: contiguous, channels-last (the layout
    inductor gives convolutions' outputs) or any other permutation. The kernels read such a tensor
    as it lies, without a contiguous copy: every statistic and histogram is blind to the order, up
    to the rounding of the sums (and which values a sampled histogram draws, and the shift's sample,
    taken in memory order: a median of the tensor's values in any order)."""
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(x.shape, x.stride()) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _read_as_is(x: torch.Tensor) -> bool:
    """Whether the kernels read ``x`` as it is: dense in memory (:func:`dense`), strided, not nested
    or negated, of a dtype whose kernels are loaded (float32/float64 once used)."""
    return (x.dtype in _loaded and x.layout is torch.strided and not x.is_nested and not x.is_neg()
            and dense(x))


class CompiledCpuReducer(Reducer):
    """Reduces CPU tensors with the compiled kernels, at once or, deferred, together.

    A deferred tensor (``add(x, row, defer=True)``) that is small (:data:`DEFER_MAX_BYTES`) is
    queued and reduced with the others in one compiled call at :meth:`flush` (or once the queue
    holds :data:`DEFER_BYTES`): for small tensors the call costs as much as the reduction. Any other
    layout or dtype is made a plain float tensor first (:func:`plain_values`, :func:`as_float`)."""

    def __init__(self, defer_max_bytes: int = DEFER_MAX_BYTES, defer_bytes: int = DEFER_BYTES) -> None:
        self.defer_max_bytes, self.defer_bytes = defer_max_bytes, defer_bytes
        self._queued: dict[torch.dtype, list[tuple[torch.Tensor, int]]] = {}
        self._queued_bytes = 0
        self._table = np.empty((64, kernels.TABLE), np.int64)  # (data, n, sums, counts, edges, seed) of a batch
        self._table_address = self._table.ctypes.data  # (kept, as HostRows keeps its addresses)

    def takes(self, x: torch.Tensor) -> bool:
        # plain tensors and parameters only: a tensor subclass (FSDP2's DTensor shards, a wrapper
        # subclass) may hold no memory of its own at data_ptr(), which the kernels read raw;
        # torch's kernels take it through its own dispatch
        return x.is_cpu and (type(x) is torch.Tensor or type(x) is nn.Parameter)

    def add(self, x: torch.Tensor, row: int, defer: bool) -> None:
        # the hot path of instrumentation: a few attribute reads and one call into compiled code
        zeros = 0
        if not _read_as_is(x):
            x, zeros = plain_values(x)
            x = as_float(x).contiguous()
        fast, exact, histogram, _, _ = callbacks(x.dtype)
        host, n = self.host, x.numel()
        if n == 0:
            host.sums[row] = EMPTY
        elif defer and not zeros and (size := n * x.element_size()) <= self.defer_max_bytes:
            self._queued.setdefault(x.dtype, []).append((x, row))
            self._queued_bytes += size
            if self._queued_bytes >= self.defer_bytes:
                self.flush()
            return
        else:
            data, out = x.data_ptr(), host.sums_address + row * _ROW_BYTES
            fast(data, n, out)
            # a NaN, an infinity, an overflow: the exact pass (checked here, outside the fast-math code)
            view = host.sums_view
            if not (math.isfinite(view[row * _ROW + SUM_SQ]) and math.isfinite(view[row * _ROW + ABS_SUM])):
                exact(data, n, out)
        if zeros:  # a sparse tensor's: in the sums first, so that the histogram spans them
            sums = torch.from_numpy(host.sums[row])  # (a view: changed in place)
            add_implicit_zeros(sums, zeros, n)
        if host.bins:
            if zeros:
                host.edges[row] = math.nan  # binned over its own range, as zeros_histogram bins its zeros
            if n:
                histogram(data, n, out, host.bins, host.counts_address + row * host.bins * 4,
                          host.edges_address + row * _EDGES_BYTES, self.seed(row))
                if n >= kernels.SAMPLE_FROM:
                    host.sampled[row] = True
            if zeros:
                host.counts[row] += zeros_histogram(sums, zeros, x.dtype, host.bins).numpy()

    def seed(self, row: int) -> int:
        """The seed of a row's histogram sample: new each step, the same in every run."""
        return (self.host.draws << 32) + row

    def add_many(self, entries: list[tuple[torch.Tensor, int]]) -> None:
        """The plain tensors of each dtype in one compiled call now; the others one by one."""
        batches: dict[torch.dtype, list[tuple[torch.Tensor, int]]] = {}
        for x, row in entries:
            if x.numel() and _read_as_is(x):
                batches.setdefault(x.dtype, []).append((x, row))
            else:
                self.add(x, row, defer=True)
        for dtype, batch in batches.items():
            self._reduce_batch(dtype, batch)

    def flush(self) -> None:
        queued, self._queued, self._queued_bytes = self._queued, {}, 0
        try:
            for dtype, entries in queued.items():
                self._reduce_batch(dtype, entries)
        except BaseException:
            self.host.sums[[row for entries in queued.values() for _, row in entries]] = np.nan
            raise

    def collect(self) -> list:
        self.flush()
        return []

    def reset(self) -> None:
        self._queued.clear()
        self._queued_bytes = 0

    def _reduce_batch(self, dtype: torch.dtype, entries: list[tuple[torch.Tensor, int]]) -> None:
        _, exact, histogram, batch, check = callbacks(dtype)
        host = self.host
        bins = host.bins or 0
        if len(entries) > len(self._table):
            self._table = np.empty((max(len(entries), 2 * len(self._table)), kernels.TABLE), np.int64)
            self._table_address = self._table.ctypes.data
        table = self._table[:len(entries)]
        sums_at, counts_at, count_bytes = host.sums_address, host.counts_address, bins * 4
        edges_at, seed = host.edges_address, host.draws << 32
        table[:] = [(x.data_ptr(), x.numel(), sums_at + row * _ROW_BYTES, counts_at + row * count_bytes,
                     edges_at + row * _EDGES_BYTES, seed + row) for x, row in entries]
        batch(self._table_address, len(table), bins, None)
        if bins:
            sampled = table[:, 1] >= kernels.SAMPLE_FROM
            if sampled.any():
                host.sampled[[row for (_, row), s in zip(entries, sampled) if s]] = True
        # a NaN, an infinity, an overflow: the exact pass, as in add (checked outside the fast-math code)
        if not check(self._table_address, len(table)):
            return
        rows = [row for _, row in entries]
        for i in np.flatnonzero(~np.isfinite(host.sums[np.ix_(rows, [SUM_SQ, ABS_SUM])]).all(axis=1)):
            data, n, out, counts, edges, seed = (int(v) for v in table[i])
            exact(data, n, out)
            if bins:
                host.counts[rows[i]] = 0
                histogram(data, n, out, bins, counts, edges, seed)
