"""Statistics of a step's tensors, reduced where the tensors live and gathered per step.

A hook hands each tensor to the step's :class:`StepSums`. A CPU tensor is
reduced by compiled one-pass kernels straight into a row of a host array
(:mod:`workbench.instrument._stats_kernels`). A tensor on another device is
staged and reduced with the other staged tensors of its device in one batch:
on a CUDA device by two Triton kernels that read the tensors where they are
(:mod:`workbench.instrument._triton_kernels`), elsewhere (or with histograms,
or without Triton) by torch's kernels (:func:`chunk_sums`). Each torch op is
a kernel launch, a few microseconds of host time however small the tensor,
so a few launches per batch replace a dozen per tensor. Nothing waits for
the device.
``rows()`` moves the device sums to the host in one transfer per device when
the step is recorded, and :func:`finish` turns raw sums into the columns of
a record row. Keeping raw sums (not means and stds) keeps the hook to plain
reductions; the divisions happen once, on the host, in numpy.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from workbench.instrument import _stats_kernels as kernels

__all__ = ["STAT_COLUMNS", "SUMS", "MIN", "MAX", "StepSums", "plain_values", "chunk_sums", "combine_chunks",
           "device_sums", "device_histogram", "finish"]

#: Reduce CPU tensors with the compiled kernels; False sends them through torch's kernels,
#: the path tensors on other devices take (the tests run both).
COMPILED = True
#: The device types whose tensors the Triton kernels reduce (the tests add "cpu", with Triton's
#: interpreter); an empty set sends them all through torch's kernels.
TRITON_DEVICES = frozenset({"cuda"})

#: The raw per-tensor sums, in this order. ``sum`` and ``sum_sq`` are of ``x - shift``, where
#: ``shift`` is the tensor's first value (0 when that is not finite): with sums around a value of
#: the tensor, the variance keeps its precision when the mean is large against the spread.
SUMS = ("sum", "sum_sq", "abs_sum", "min", "max", "nonzero", "nan", "inf", "shift")
SUM, SUM_SQ, ABS_SUM, MIN, MAX, NONZERO, NAN, INF, SHIFT = range(len(SUMS))
#: The statistics of a record row, derived from the sums and the numel.
STAT_COLUMNS = ("numel", "mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count")

#: Only tensors up to this size are deferred: for them the call costs as much as the reduction
#: (~1.5 us against ~0.15 ns per value); a larger one is reduced at once, while it is still in cache.
DEFER_MAX_BYTES = 256 << 10
#: The queue is reduced once it holds this many bytes, while they are still in cache; it also
#: bounds the memory the queued tensors keep alive.
DEFER_BYTES = 1 << 20

#: Staged device tensors are reduced once they hold this many bytes: it bounds the device memory
#: the staged copies take, and the reduction's temporaries (about six times this, for a moment).
STAGE_BYTES = 64 << 20
#: A batch lays its tensors out in rows of this many values (:func:`chunk_sums`): long enough
#: for efficient row reductions, short enough that filling each tensor's last row costs little.
CHUNK = 1024

_EMPTY = (0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0)
_STAGED_DTYPES = (torch.float32, torch.float64)  # staged as they are; others go through as_float
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # read as they are
_ROW = len(SUMS)
_ROW_BYTES = _ROW * 8
_compiled_kernels: dict[torch.dtype, tuple] = {}  # dtype -> (fast, exact, histogram, batch, check), loaded on first use
_triton = None  # the Triton kernels' module, imported on first use; False where that failed


def _load_kernels(dtype: torch.dtype) -> tuple:
    _compiled_kernels[dtype] = kernels.compile_kernels(str(dtype).removeprefix("torch."))
    return _compiled_kernels[dtype]


def _load_triton():
    """The module of Triton kernels, or False where Triton cannot be imported (it comes with
    PyTorch's CUDA builds) or a batch failed to compile or launch (torch's kernels take over)."""
    global _triton
    if _triton is None:
        try:
            from workbench.instrument import _triton_kernels as module
        except ImportError:
            module = False
        _triton = module
    return _triton


def _give_up_triton(exc: Exception) -> None:
    """Send every later tensor through torch's kernels, after a failed batch."""
    global _triton
    _triton = False
    warnings.warn(f"workbench.watch: the Triton kernels failed ({type(exc).__name__}: {exc}); statistics on "
                  "the GPU fall back to torch's kernels (slower, same results).", RuntimeWarning, stacklevel=3)


def _compiled_kernels_take(x: torch.Tensor) -> bool:
    """Whether the loaded compiled kernels read ``x`` (a CPU tensor) as it is: contiguous, strided,
    not nested or negated, of a dtype whose kernels are loaded."""
    return (x.dtype in _compiled_kernels and x.layout is torch.strided and not x.is_nested and not x.is_neg()
            and x.is_contiguous())


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def plain_values(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The values of ``x`` as a plain (strided) tensor, and how many zeros ``x`` holds besides them.

    Module outputs and gradients come in every layout. A sparse tensor gives its
    stored values (coalesced: duplicate entries summed) and the count of its
    implicit zeros, which the sums take in arithmetically (a sparse output can
    be far too large to densify); a nested tensor the elements of its
    components; a quantized one its dequantized values; an MKL-DNN one a dense
    copy; a view with the negative bit (``z.conj().imag``) its values with the
    sign applied (its memory holds them unnegated).

    Raises:
        ValueError: ``x`` is on the meta device: it has a shape but no values.
    """
    x = x.detach()
    if x.is_meta:
        raise ValueError(f"a tensor on the meta device ({x.dtype}, {x.numel()} elements) holds no values to "
                         "summarize; statistics need the model to run on a real device (cpu, cuda ...)")
    layout = x.layout
    if layout is torch.sparse_coo:
        values = x.coalesce().values()
    elif layout in _COMPRESSED:
        values = x.values()
    elif x.is_nested:
        parts = [part.reshape(-1) for part in x.unbind()]
        values = torch.cat(parts) if parts else torch.empty(0, dtype=x.dtype, device=x.device)
    elif layout is not torch.strided:
        values = x.to_dense()
    else:
        values = x
    if values.is_quantized:
        values = values.dequantize()
    return values.resolve_neg(), x.numel() - values.numel()


def _add_implicit_zeros(sums: torch.Tensor, zeros: int, stored: int) -> None:
    """Make ``sums`` (the SUMS of ``stored`` values, a float64 tensor) those of the same values and
    ``zeros`` zeros besides, in place: with shift s, each zero adds -s to ``sum`` and s**2 to
    ``sum_sq``, and 0 joins the range; NaN stays NaN."""
    if stored == 0:
        sums.zero_()  # zeros only (shift 0)
        return
    shift = sums[SHIFT].clone()
    sums[SUM] -= zeros * shift
    sums[SUM_SQ] += zeros * shift * shift
    sums[MIN].clamp_(max=0.0)
    sums[MAX].clamp_(min=0.0)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """The detached tensor as float32 or float64, the dtypes the reductions below are exact for."""
    x = x.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype in (torch.float32, torch.float64):
        return x
    # float16/bfloat16 widen; integers up to 2**53 are exact in float64; bool becomes 0/1
    return x.to(torch.float32 if x.is_floating_point() or x.dtype == torch.bool else torch.float64)


class StepSums:
    """The sums (and histograms) of one step's tensors, a row per :meth:`add`.

    A CPU tensor is reduced at once, or, with ``add(x, defer=True)`` and when
    it is small (:data:`DEFER_MAX_BYTES`), queued and reduced with the others
    in one compiled call at :meth:`flush` (or when the queue holds
    :data:`DEFER_BYTES`). Deferring suits tensors that nothing modifies before
    the flush - gradients, parameters - and saves the per-tensor call
    overhead; the queue keeps them alive until then.

    A tensor on another device (or any tensor, with :data:`COMPILED` off) is
    staged: kept as it is with ``defer``, else copied (a later in-place op
    must not change what is reduced), and reduced with its device's other
    staged tensors in one batch when the rows are read (:meth:`rows`), or
    once the stage holds :data:`STAGE_BYTES`. :meth:`flush` lets go of what
    is kept by reference: the Triton kernels reduce it then, from where it
    is; for torch's kernels it is copied, in one copy per device.

    Thread-safe: a backward may run hooks on other threads.

    Args:
        bins: histogram bins per tensor, or None for no histograms.
        capacity: rows to allocate up front (grows as needed).
    """

    def __init__(self, bins: int | None = None, capacity: int = 64) -> None:
        self.bins = bins
        self._n = 0
        self._host = np.empty((max(capacity, 1), len(SUMS)))
        self._counts = np.zeros((len(self._host), bins), np.float32) if bins else None
        self._addresses()
        # the (data address, n, sums address, counts address) rows of a batch (_reduce_batch)
        self._table = np.empty((64, 4), np.int64)
        self._table_address = self._table.ctypes.data
        # staged: per (device, dtype), (1-D values, their rows, the length of each row's tensor)
        # batches reduced on a device: their record rows, then chunk_sums' four results (or, for
        # a Triton batch or a tensor reduced on its own, None, None, their sums (n, 9) and counts)
        self._device_rows: list[tuple[list[int], np.ndarray | None, np.ndarray | None, torch.Tensor,
                                      torch.Tensor | None]] = []
        self._queued: dict[torch.dtype, list[tuple[torch.Tensor, int]]] = {}
        self._queued_bytes = 0
        self._staged: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, list[int], list[int]]]] = {}
        # staged for the Triton kernels: per (device, dtype), contiguous tensors and their rows
        self._batched: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, int]]] = {}
        self._batched_bytes = 0
        self._staged_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def reset(self) -> None:
        """Empty, for another step's tensors: the rows start again at 0, the arrays are kept.

        Call it once :meth:`rows` has read the step (what is still staged or queued is dropped).
        """
        if self._counts is None and not (self._n or self._device_rows or self._queued or self._staged
                                         or self._batched):
            return  # nothing was added (an idle step)
        with self._lock:
            if self._counts is not None:
                # the histogram kernels add to their row (a failed add's row too, not counted in _n)
                self._counts.fill(0)
            self._n = 0
            self._device_rows.clear()
            self._queued.clear()
            self._staged.clear()
            self._batched.clear()
            self._queued_bytes = self._staged_bytes = self._batched_bytes = 0

    def add(self, x: torch.Tensor, defer: bool = False) -> int:
        """Reduce ``x`` (any dtype, device and layout of a strided tensor), now or, with ``defer``,
        at the next :meth:`flush`; returns its row."""
        with self._lock:
            return self._add(x, defer)

    def _add(self, x: torch.Tensor, defer: bool) -> int:
        row = self._n
        if row == len(self._host):
            self._grow()
        if COMPILED and x.is_cpu:
            self._reduce_on_host(x, row, defer)
        elif self._triton_takes(x):  # the usual tensor on a GPU (here, not in _stage: this runs for every one)
            if not x.is_contiguous():
                x = x.detach().contiguous()  # (a copy)
            elif not defer:
                x = x.detach().clone()  # what later in-place ops do to x must not reach the sums
            self._batch(x, row)
        else:
            self._stage(x, row, defer)
        self._n = row + 1  # only once the row is filled or queued: a failed reduction leaves no row
        return row

    def add_many(self, tensors: Sequence[torch.Tensor]) -> list[int]:
        """``[add(x, defer=True) for x in tensors]`` in fewer calls: the plain CPU tensors (contiguous,
        of a dtype whose kernels are loaded) are reduced now, in one compiled call per dtype; the
        others as by :meth:`add`. For a step's parameters and their gradients, which come by the
        hundred and which nothing changes in between. Returns their rows.

        If it raises, some of the tensors may have rows (filled with NaN) that it did not return.
        """
        with self._lock:
            # rows in order, one per tensor (as add's): grown once, here
            rows = list(range(self._n, self._n + len(tensors)))
            while rows and rows[-1] >= len(self._host):
                self._grow()
            batches: dict[torch.dtype, list[tuple[torch.Tensor, int]]] = {}
            try:
                for x, row in zip(tensors, rows):  # (the order of _add's tests)
                    if COMPILED and x.is_cpu:
                        if _compiled_kernels_take(x) and x.numel():
                            batches.setdefault(x.dtype, []).append((x, row))
                            self._n = row + 1
                            continue
                    elif self._triton_takes(x) and x.is_contiguous():
                        self._batch(x, row)  # by reference, as add(x, defer=True) keeps it
                        self._n = row + 1
                        continue
                    self._add(x, defer=True)  # (takes the row self._n, which is ``row``)
                for dtype, entries in batches.items():
                    self._reduce_batch(_compiled_kernels[dtype], entries)
            except BaseException:
                self._host[[row for entries in batches.values() for _, row in entries]] = np.nan
                raise
            return rows

    def _reduce_on_host(self, x: torch.Tensor, row: int, defer: bool) -> None:
        # the hot path of instrumentation: a few attribute reads and one call into compiled code
        zeros = 0
        if not _compiled_kernels_take(x):
            x, zeros = plain_values(x)
            x = as_float(x).contiguous()
        kernels_of_dtype = _compiled_kernels.get(x.dtype) or _load_kernels(x.dtype)
        n = x.numel()
        if n == 0:
            self._host[row] = _EMPTY
        elif defer and not zeros and (size := n * x.element_size()) <= DEFER_MAX_BYTES:
            self._queued.setdefault(x.dtype, []).append((x, row))
            self._queued_bytes += size
            if self._queued_bytes >= DEFER_BYTES:
                self._flush_queue()
            return
        else:
            fast, exact, histogram, _, _ = kernels_of_dtype
            data, out = x.data_ptr(), self._sums_address + row * _ROW_BYTES
            fast(data, n, out)
            # a NaN, an infinity, an overflow (read through a memoryview: numpy's indexing costs
            # microseconds in a hook, where its code has gone cold)
            view = self._sums_view
            if not (math.isfinite(view[row * _ROW + SUM_SQ]) and math.isfinite(view[row * _ROW + ABS_SUM])):
                exact(data, n, out)
        if zeros:  # a sparse tensor's: in the sums first, so that the histogram spans them
            sums = torch.from_numpy(self._host[row])  # (a view: changed in place)
            _add_implicit_zeros(sums, zeros, n)
        if self.bins:
            if n:
                histogram(data, n, out, self.bins, self._counts_address + row * self.bins * 4)
            if zeros:
                self._counts[row] += _zeros_histogram(sums, zeros, x.dtype, self.bins).numpy()

    def _triton_takes(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (not on the CPU, or with :data:`COMPILED` off) goes to the Triton kernels as
        it is, or once contiguous: a plain tensor of a dtype they read, on a device they run on,
        with no histograms. The usual tensor on a GPU: this runs for every one, in the fewest calls
        (``x.device.type`` alone takes ~0.4 us)."""
        return (not self.bins and x.dtype in _TRITON_DTYPES and x.layout is torch.strided and not x.is_nested
                and not x.is_neg() and ("cuda" if x.is_cuda else x.device.type) in TRITON_DEVICES
                and bool(_triton if _triton is not None else _load_triton()))

    def _stage(self, x: torch.Tensor, row: int, defer: bool) -> None:
        """Stage ``x`` for torch's kernels (a tensor the Triton kernels do not take)."""
        plain = x.layout is torch.strided and not x.is_nested and not x.is_neg() and not x.is_meta
        if plain and x.dtype in _STAGED_DTYPES:
            flat = x.detach().reshape(-1)
            if not defer and x.is_contiguous():
                flat = flat.clone()  # a view of x: what later in-place ops do to x must not reach the sums
        else:
            values, zeros = plain_values(x)
            flat = as_float(values).reshape(-1)
            if zeros or not flat.numel():  # (rare layouts: a sparse tensor's implicit zeros) on its own
                sums = device_sums(flat, zeros)
                counts = device_histogram(flat, sums, self.bins, zeros) if self.bins else None
                self._device_rows.append(([row], None, None, sums[None], counts[None] if counts is not None else None))
                return
            if not defer and flat.untyped_storage().data_ptr() == values.untyped_storage().data_ptr():
                flat = flat.clone()
        if not flat.numel():
            self._host[row] = _EMPTY
            return
        self._staged.setdefault((flat.device, flat.dtype), []).append((flat, [row], [flat.numel()]))
        self._staged_bytes += flat.numel() * flat.element_size()
        if self._staged_bytes >= STAGE_BYTES:
            self._reduce_staged()

    def _batch(self, x: torch.Tensor, row: int) -> None:
        n = x.numel()
        if not n:
            self._host[row] = _EMPTY
            return
        self._batched.setdefault((x.device, x.dtype), []).append((x, row))
        self._batched_bytes += n * x.element_size()
        if self._batched_bytes >= STAGE_BYTES:
            self._reduce_batched()

    def _reduce_batched(self) -> None:
        batched, self._batched, self._batched_bytes = self._batched, {}, 0
        for (device, _), entries in batched.items():
            if _triton:
                try:
                    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                        sums = _triton.batch_sums([x for x, _ in entries])
                    self._device_rows.append(([row for _, row in entries], None, None, sums, None))
                    continue
                except Exception as exc:  # (a GPU or Triton build the kernels do not compile for)
                    _give_up_triton(exc)
            for x, row in entries:  # to torch's kernels (x is a copy, or kept by reference, as before)
                self._stage(x, row, defer=True)

    def _reduce_staged(self) -> None:
        self._reduce_batched()
        staged, self._staged, self._staged_bytes = self._staged, {}, 0
        for entries in staged.values():
            data = torch.cat([flat for flat, _, _ in entries]) if len(entries) > 1 else entries[0][0]
            rows = [row for _, rows, _ in entries for row in rows]
            lengths = np.array([n for _, _, lengths in entries for n in lengths], np.int64)
            self._device_rows.append((rows, *chunk_sums(data, lengths, self.bins)))

    def _snapshot_staged(self) -> None:
        # the staged tensors of each device in one copy: the reduction waits for the step's end,
        # what was kept by reference (gradients, parameters) is safe from zero_grad and the optimizer
        for key, entries in self._staged.items():
            if entries:
                self._staged[key] = [(torch.cat([flat for flat, _, _ in entries]),
                                      [row for _, rows, _ in entries for row in rows],
                                      [n for _, _, lengths in entries for n in lengths])]

    def flush(self) -> None:
        """Reduce the queued CPU tensors (``add(x, defer=True)``) and let them go; reduce the
        tensors staged for the Triton kernels; copy the other staged ones that are kept by
        reference (one copy per device), to be reduced at :meth:`rows`."""
        with self._lock:
            self._flush_queue()
            self._reduce_batched()
            self._snapshot_staged()

    def _flush_queue(self) -> None:
        queued, self._queued, self._queued_bytes = self._queued, {}, 0
        try:
            for dtype, entries in queued.items():
                self._reduce_batch(_compiled_kernels[dtype], entries)
        except BaseException:
            self._host[[row for entries in queued.values() for _, row in entries]] = np.nan  # not np.empty's garbage
            raise

    def _reduce_batch(self, kernels_of_dtype: tuple, entries: list[tuple[torch.Tensor, int]]) -> None:
        _, exact, histogram, batch, check = kernels_of_dtype
        bins = self.bins or 0
        # (data address, n, sums address, counts address) per tensor, into the table in one numpy
        # call: this runs at the end of a backward or a step, where numpy's code has gone cold and
        # each call costs ~10 us (the table is kept, its address cached as in _addresses)
        if len(entries) > len(self._table):
            self._table = np.empty((max(len(entries), 2 * len(self._table)), 4), np.int64)
            self._table_address = self._table.ctypes.data
        table = self._table[:len(entries)]
        sums_at, counts_at, count_bytes = self._sums_address, self._counts_address, bins * 4
        table[:] = [(x.data_ptr(), x.numel(), sums_at + row * _ROW_BYTES, counts_at + row * count_bytes)
                    for x, row in entries]
        batch(self._table_address, len(table), bins, None)
        # a NaN, an infinity, an overflow: the exact pass, as in _reduce_on_host (checked outside
        # the fast-math code)
        if not check(self._table_address, len(table)):
            return
        rows = [row for _, row in entries]
        for i in np.flatnonzero(~np.isfinite(self._host[np.ix_(rows, [SUM_SQ, ABS_SUM])]).all(axis=1)):
            data, n, out, counts = (int(v) for v in table[i])
            exact(data, n, out)
            if bins:
                self._counts[rows[i]] = 0
                histogram(data, n, out, bins, counts)

    def _grow(self) -> None:
        self._host = np.concatenate([self._host, np.empty_like(self._host)])
        if self._counts is not None:
            self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
        self._addresses()

    def _addresses(self) -> None:
        # cached: reading ``ndarray.ctypes`` builds an object (~1 us warm; ~25 us at the end of a
        # backward or a step, its Python code gone cold)
        self._sums_address = self._host.ctypes.data
        self._sums_view = memoryview(self._host.reshape(-1))
        self._counts_address = self._counts.ctypes.data if self._counts is not None else 0

    def rows(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Host copies of the sums ``(rows, 9)`` and histogram counts ``(rows, bins)`` (or None),
        after a :meth:`flush`: the sums of tensors on other devices come over in one transfer per
        device."""
        with self._lock:
            self._flush_queue()
            self._reduce_staged()
            sums = self._host[:self._n].copy()
            counts = self._counts[:self._n].copy() if self._counts is not None else None
            by_device: dict[torch.device, list] = {}
            for entry in self._device_rows:
                by_device.setdefault(entry[3].device, []).append(entry)
        for entries in by_device.values():
            # one transfer per device: every batch's chunk sums and counts, flattened into one tensor
            parts = [part.reshape(-1).double() for *_, grid, hist in entries for part in (grid, hist)
                     if part is not None]
            host, offset = torch.cat(parts).cpu().numpy(), 0
            for batch_rows, grid_rows, filler, grid, hist in entries:
                grid_sums = host[offset:offset + grid.numel()].reshape(grid.shape)
                sums[batch_rows] = grid_sums if grid_rows is None else combine_chunks(grid_sums, grid_rows, filler)
                offset += grid.numel()
                if hist is not None:
                    counts[batch_rows] = host[offset:offset + hist.numel()].reshape(hist.shape)
                    offset += hist.numel()
        return sums, counts


def chunk_sums(data: torch.Tensor, lengths: np.ndarray, bins: int | None = None
               ) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor | None]:
    """The sums of many tensors of one device and dtype, with a few dozen kernel launches in all.

    The tensors are laid out in a grid of rows of :data:`CHUNK` values, each
    tensor starting a new row and the rest of its last row filled with its
    first value, by one gather from their concatenation. Plain reductions
    along the rows then give every row's sums at once, as accurately as
    torch's reductions (pairwise sums) and with ops every backend has. A
    row's sums (of ``x - shift`` and of ``|x| - |shift|``) are taken around
    its tensor's first value (the shift of :data:`SUMS`, 0 when that is not
    finite): the filler adds exactly zero to them and changes no minimum or
    maximum, :func:`combine_chunks` takes it out of the counts, and the host
    adds up the rows of a tensor. The grid's layout is worked out on the host
    and goes over in one copy that does not wait for the device.

    Args:
        data: the tensors' values, one after another (1-D, float32 or float64).
        lengths: how many values each tensor has (int64, none 0).
        bins: histogram bins per tensor, or None.

    Returns:
        ``(grid_rows, filler, sums, counts)``: the grid rows of each tensor
        and the filler values in its last row (host int64 arrays, (n,));
        each row's sums and its tensor's first value, (rows, 10) in the
        tensors' dtype on their device; and the histogram counts of each
        tensor, (n, bins) float32 on the device, or None.
    """
    rows = -(-lengths // CHUNK)
    n, grid_rows, device = len(lengths), int(rows.sum()), data.device
    tensor_of_row = np.repeat(np.arange(n), rows)
    first_row = np.cumsum(rows) - rows  # each tensor's first grid row
    start = (np.cumsum(lengths) - lengths)[tensor_of_row]  # where the row's tensor starts in the concatenation
    row_start = start + (np.arange(grid_rows) - first_row[tensor_of_row]) * CHUNK
    filled = np.minimum(lengths[tensor_of_row] - (row_start - start), CHUNK)  # values of its tensor in the row
    table = torch.from_numpy(np.concatenate([tensor_of_row, start, row_start, filled]))
    if device.type == "cuda":  # a copy from pageable memory can wait for the device's queue to drain
        table = table.pin_memory()
    tensor_of_row, start, row_start, filled = table.to(device, non_blocking=True).view(4, grid_rows)
    column = torch.arange(CHUNK, device=device)
    in_tensor = column < filled[:, None]
    # (repeat_interleave would lay this out too, but its CUDA kernel fills each repeat with one thread)
    grid = data[torch.where(in_tensor, row_start[:, None] + column, start[:, None])]  # (grid_rows, CHUNK)
    first = data[start]  # each row's tensor's first value
    shift = torch.where(torch.isfinite(first), first, torch.zeros_like(first))
    centred = grid - shift[:, None]
    dtype = grid.dtype
    sums = torch.stack([
        centred.sum(1), centred.square_().sum(1), (grid.abs() - shift.abs()[:, None]).sum(1), grid.amin(1),
        grid.amax(1), (grid != 0).sum(1, dtype=dtype), torch.isnan(grid).sum(1, dtype=dtype),
        torch.isinf(grid).sum(1, dtype=dtype), shift, first], 1)
    del centred
    counts = None
    if bins:
        # each tensor's range from its rows'; NaN set explicitly (scatter_reduce's own NaN rule is not documented)
        lo = torch.empty(n, dtype=dtype, device=device).scatter_reduce_(0, tensor_of_row, sums[:, MIN], "amin",
                                                                        include_self=False)
        hi = torch.empty(n, dtype=dtype, device=device).scatter_reduce_(0, tensor_of_row, sums[:, MAX], "amax",
                                                                        include_self=False)
        nan = torch.zeros(n, dtype=dtype, device=device).index_add_(0, tensor_of_row, sums[:, NAN])
        lo, hi = (torch.where(nan > 0, torch.full_like(bound, math.nan), bound)[tensor_of_row] for bound in (lo, hi))
        counts = _binned(grid, lo, hi, tensor_of_row, in_tensor, n, bins)
    return rows, rows * CHUNK - lengths, sums, counts


def _binned(grid: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, tensor_of_row: torch.Tensor,
            in_tensor: torch.Tensor, n: int, bins: int) -> torch.Tensor:
    """Counts (n, bins) of the values of each grid row (where ``in_tensor``) in ``bins`` equal bins
    spanning its tensor's [lo, hi] (given per row): the arithmetic of :func:`device_histogram`."""
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    scale = torch.where(torch.isfinite(width), bins / width, torch.full_like(width, float("nan")))
    scaled = torch.nan_to_num((grid - lo[:, None]) * scale[:, None], nan=-1.0, posinf=-1.0, neginf=-1.0)
    weight = ((scaled >= 0) & in_tensor).to(torch.float32)  # non-finite values (and ranges) land at -1
    index = scaled.clamp_(0, bins - 1).long().add_(tensor_of_row[:, None] * bins)
    counts = torch.zeros(n * bins, dtype=torch.float32, device=grid.device)
    return counts.scatter_add_(0, index.view(-1), weight.view(-1)).view(n, bins)


def combine_chunks(grid_sums: np.ndarray, grid_rows: np.ndarray, filler: np.ndarray) -> np.ndarray:
    """The :data:`SUMS` rows of tensors from the sums of their grid rows (:func:`chunk_sums`:
    ``grid_rows`` rows per tensor, in order, ``filler`` copies of its first value in the last):
    sums and counts add up, less what the filler added; the range is the widest (NaN wins, as in
    torch.aminmax); the shift is the tensor's. (A non-finite first value makes the sums non-finite,
    as it would anyway; its counts are right.)"""
    grid_sums = grid_sums.astype(np.float64, copy=False)
    starts = np.cumsum(grid_rows) - grid_rows
    sums = np.add.reduceat(grid_sums[:, :len(SUMS)], starts, axis=0)
    sums[:, MIN] = np.minimum.reduceat(grid_sums[:, MIN], starts)
    sums[:, MAX] = np.maximum.reduceat(grid_sums[:, MAX], starts)
    sums[:, SHIFT] = grid_sums[starts, SHIFT]
    first, shift = grid_sums[starts, len(SUMS)], sums[:, SHIFT]
    with np.errstate(invalid="ignore"):
        sums[:, ABS_SUM] += (grid_rows * CHUNK - filler) * np.abs(shift)
        sums[:, NONZERO] -= filler * (first != 0)
        sums[:, NAN] -= filler * np.isnan(first)
        sums[:, INF] -= filler * np.isinf(first)
    return sums


def device_sums(x: torch.Tensor, zeros: int = 0) -> torch.Tensor:
    """The sums of :data:`SUMS` for ``x`` (and ``zeros`` zeros besides, see :func:`plain_values`)
    with torch's kernels: a float64 tensor on ``x``'s device.

    Only branch-free elementwise ops and plain sums: comparisons, ``isnan`` and
    ``count_nonzero`` are several times slower on CPU (bool temporaries,
    data-dependent branches), so the counts use IEEE arithmetic instead:
    ``ceil(min(|x|, 1))`` is 1 for every non-zero, ``x * 0 + 1`` is NaN
    exactly where x is not finite, ``clamp(|x| - max, 0, 1)`` is 1 exactly at
    infinities, and ``nansum`` skips the NaNs.
    """
    flat = as_float(x).reshape(-1)
    n = flat.numel()
    if n == 0:
        sums = torch.tensor(_EMPTY, dtype=torch.float64, device=flat.device)
        if zeros:
            _add_implicit_zeros(sums, zeros, 0)
        return sums
    shift = torch.where(torch.isfinite(flat[0]), flat[0], torch.zeros_like(flat[0]))
    centred = flat - shift
    lo, hi = torch.aminmax(flat)
    total = centred.sum()
    sum_sq = torch.dot(centred, centred)
    magnitude = flat.abs()
    abs_sum = magnitude.sum()
    finite = torch.mul(flat, 0).add_(1).nansum()
    nonzero = torch.clamp(magnitude, max=1).ceil_().nansum()  # non-zero and not NaN (inf included)
    inf = magnitude.sub_(torch.finfo(flat.dtype).max).clamp_(0, 1).nansum()
    nan = n - finite - inf
    sums = torch.stack([total, sum_sq, abs_sum, lo, hi, nonzero + nan, nan, inf, shift]).double()
    if zeros:
        _add_implicit_zeros(sums, zeros, n)
    return sums


def device_histogram(x: torch.Tensor, sums: torch.Tensor, bins: int, zeros: int = 0) -> torch.Tensor:
    """Counts of ``x`` (and ``zeros`` zeros besides) in ``bins`` equal bins spanning [min, max] (from
    ``sums``), on ``x``'s device.

    ``torch.histc`` needs its range as Python numbers (a device sync), so the
    bin index is computed arithmetically and counted with ``scatter_add_``.
    Non-finite values are left out (they are counted in nan/inf; with one in
    the tensor its range is not finite and no bin is filled); a tensor whose
    values are all equal puts everything in the first bin.
    """
    x = as_float(x).reshape(-1)
    counts = torch.zeros(bins, dtype=torch.float32, device=x.device)
    if zeros:
        counts += _zeros_histogram(sums, zeros, x.dtype, bins)
    if x.numel() == 0:
        return counts
    lo, hi = sums[MIN].to(x.dtype), sums[MAX].to(x.dtype)
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    # an infinite range (the tensor holds an infinity) bins nothing: its edges would be meaningless
    scale = torch.where(torch.isfinite(width), bins / width, torch.full_like(width, float("nan")))
    scaled = torch.nan_to_num((x - lo) * scale, nan=-1.0, posinf=-1.0, neginf=-1.0)
    finite = (scaled >= 0).to(torch.float32)  # non-finite inputs (and a non-finite range) land at -1
    index = scaled.clamp_(0, bins - 1).long()
    return counts.scatter_add_(0, index, finite)


def _zeros_histogram(sums: torch.Tensor, zeros: int, dtype: torch.dtype, bins: int) -> torch.Tensor:
    """The counts of ``zeros`` zeros of ``dtype``: one zero binned with the arithmetic of the other
    values (the compiled kernel's and :func:`device_histogram`'s agree bin for bin), times ``zeros``."""
    return device_histogram(torch.zeros(1, dtype=dtype, device=sums.device), sums, bins) * zeros


def finish(numel: np.ndarray, sums: np.ndarray) -> dict[str, np.ndarray]:
    """The :data:`STAT_COLUMNS` from host copies of the sums, vectorized over rows.

    Args:
        numel: (n,) element counts.
        sums: (n, 9) rows of :data:`SUMS`.
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
