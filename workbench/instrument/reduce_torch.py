"""The torch reducer, and the value helpers every reducer shares.

:class:`TorchReducer` reduces tensors of any device, dtype and layout with
torch's own kernels: a device's tensors are staged and reduced together by
:func:`chunk_sums`, a few dozen kernel launches per batch however many
tensors it holds (each torch op costs a launch, a few microseconds of host
time however small the tensor). The sums stay on the device until
:meth:`~workbench.instrument.reduce.StepSums.rows` fetches them.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch

from workbench.instrument.reduce import EMPTY, DeviceSums, Reducer
from workbench.instrument.schema import ABS_SUM, INF, MAX, MIN, NAN, NONZERO, SHIFT, SHIFT_SAMPLE, SUM, SUM_SQ, SUMS

__all__ = ["TorchReducer", "plain_values", "as_float", "chunk_sums", "combine_chunks", "device_sums",
           "device_histogram", "sample_shift", "STAGE_BYTES", "CHUNK"]

#: Staged tensors are reduced once they hold this many bytes: it bounds the device memory the
#: staged copies take, and the reduction's temporaries (about six times this, for a moment).
STAGE_BYTES = 64 << 20
#: A batch lays its tensors out in rows of this many values (:func:`chunk_sums`): long enough
#: for efficient row reductions, short enough that filling each tensor's last row costs little.
CHUNK = 1024

_STAGED_DTYPES = (torch.float32, torch.float64)  # staged as they are; others go through as_float
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # a subclass goes through plain_values


class TorchReducer(Reducer):
    """Stages each tensor (kept as it is with ``defer``, else copied: a later in-place op must not
    change what is reduced) and reduces each device's staged tensors in one batch when the rows are
    read, or once the stage holds ``stage_bytes``. :meth:`flush` copies what is kept by reference,
    one copy per device."""

    def __init__(self, stage_bytes: int = STAGE_BYTES) -> None:
        self.stage_bytes = stage_bytes
        # per (device, dtype): (1-D values, their rows, the length of each row's tensor)
        self._staged: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, list[int], list[int]]]] = {}
        self._staged_bytes = 0
        self._reduced: list[DeviceSums] = []

    def takes(self, x: torch.Tensor) -> bool:
        return True

    def add(self, x: torch.Tensor, row: int, defer: bool) -> None:
        plain = (type(x) in _PLAIN_TYPES and x.layout is torch.strided and not x.is_nested and not x.is_neg()
                 and not x.is_meta)
        if plain and x.dtype in _STAGED_DTYPES:
            flat = x.detach().reshape(-1)
            if not defer and x.is_contiguous():
                flat = flat.clone()  # a view of x: what later in-place ops do to x must not reach the sums
        else:
            values, zeros = plain_values(x)
            flat = as_float(values).reshape(-1)
            if zeros or not flat.numel():  # (rare layouts: a sparse tensor's implicit zeros) on its own
                bins = self.host.bins
                sums = device_sums(flat, zeros)
                counts = device_histogram(flat, sums, bins, zeros) if bins else None
                self.host.edges[row] = math.nan  # (binned over its own range)
                self._reduced.append(DeviceSums([row], sums[None], counts[None] if counts is not None else None))
                return
            if not defer and flat.untyped_storage().data_ptr() == values.untyped_storage().data_ptr():
                flat = flat.clone()
        if not flat.numel():
            self.host.sums[row] = EMPTY
            return
        self._staged.setdefault((flat.device, flat.dtype), []).append((flat, [row], [flat.numel()]))
        self._staged_bytes += flat.numel() * flat.element_size()
        if self._staged_bytes >= self.stage_bytes:
            self._reduce_staged()

    def flush(self) -> None:
        # the staged tensors of each device in one copy: the reduction waits for the step's end,
        # and what was kept by reference (gradients, parameters) is safe from zero_grad and the optimizer
        for key, entries in self._staged.items():
            if entries:
                self._staged[key] = [(torch.cat([flat for flat, _, _ in entries]),
                                      [row for _, rows, _ in entries for row in rows],
                                      [n for _, _, lengths in entries for n in lengths])]

    def collect(self) -> list[DeviceSums]:
        self._reduce_staged()
        reduced, self._reduced = self._reduced, []
        return reduced

    def reset(self) -> None:
        self._staged.clear()
        self._reduced.clear()
        self._staged_bytes = 0

    def _reduce_staged(self) -> None:
        staged, self._staged, self._staged_bytes = self._staged, {}, 0
        for entries in staged.values():
            data = torch.cat([flat for flat, _, _ in entries]) if len(entries) > 1 else entries[0][0]
            rows = [row for _, rows, _ in entries for row in rows]
            lengths = np.array([n for _, _, lengths in entries for n in lengths], np.int64)
            bins = self.host.bins
            edges = self.host.edges[rows] if bins else None
            grid_rows, filler, sums, counts = chunk_sums(data, lengths, bins, edges)
            self._reduced.append(DeviceSums(rows, sums, counts, grid_rows, filler))


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

    A DTensor (FSDP2's parameters and their gradients) gives its local tensor where that holds
    all its values (a mesh of one rank, or replicated).

    Raises:
        ValueError: ``x`` is on the meta device: it has a shape but no values; or ``x`` is a
            DTensor whose values are spread over several ranks (its shards, or partial sums).
    """
    x = x.detach()
    if _is_dtensor(x):
        x = _local_values(x)
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


def _is_dtensor(x: torch.Tensor) -> bool:
    dtensor = sys.modules.get("torch.distributed.tensor")  # (not imported: there is no DTensor)
    return dtensor is not None and isinstance(x, dtensor.DTensor)


def _local_values(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor, where it holds every value of ``x``; reading the others would be
    a collective, which a hook on one rank cannot start."""
    if x.device_mesh.size() > 1 and not all(p.is_replicate() for p in x.placements):
        raise ValueError(
            f"a DTensor of shape {tuple(x.shape)} spread over {x.device_mesh.size()} ranks ({x.placements}): "
            "this rank holds only part of its values. Record a sharded model (FSDP2's fully_shard) with "
            "workbench.instrument.distributed.watch_distributed, which merges the ranks' shards.")
    return x.to_local()


def add_implicit_zeros(sums: torch.Tensor, zeros: int, stored: int) -> None:
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


def chunk_sums(data: torch.Tensor, lengths: np.ndarray, bins: int | None = None, edges: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor | None]:
    """The sums of many tensors of one device and dtype, with a few dozen kernel launches in all.

    The tensors are laid out in a grid of rows of :data:`CHUNK` values, each
    tensor starting a new row and the rest of its last row filled with the
    value its shift is (:func:`sample_shift`), by one gather from their concatenation. Plain reductions
    along the rows then give every row's sums at once, as accurately as
    torch's reductions (pairwise sums) and with ops every backend has. A
    row's sums (of ``x - shift`` and of ``|x| - |shift|``) are taken around
    its tensor's shift (of :data:`SUMS`: the median of a sample of its values, 0 when that is not
    finite): the filler adds exactly zero to them and changes no minimum or
    maximum, :func:`combine_chunks` takes it out of the counts, and the host
    adds up the rows of a tensor. The grid's layout is worked out on the host
    and goes over in one copy that does not wait for the device.

    Args:
        data: the tensors' values, one after another (1-D, float32 or float64).
        lengths: how many values each tensor has (int64, none 0).
        bins: histogram bins per tensor, or None.
        edges: (n, 2) float64, each tensor's fixed histogram range; NaN (or None): its own
            [min, max]. A value outside a fixed range counts in the end bin on its side.

    Returns:
        ``(grid_rows, filler, sums, counts)``: the grid rows of each tensor
        and the filler values in its last row (host int64 arrays, (n,));
        each row's sums and its filler value (its shift, see above), (rows, 10) in the
        tensors' dtype on their device; and the histogram counts of each
        tensor, (n, bins) int64 on the device, or None.
    """
    rows = -(-lengths // CHUNK)
    n, grid_rows, device = len(lengths), int(rows.sum()), data.device
    tensor_of_row = np.repeat(np.arange(n), rows)
    first_row = np.cumsum(rows) - rows  # each tensor's first grid row
    start = (np.cumsum(lengths) - lengths)[tensor_of_row]  # where the row's tensor starts in the concatenation
    row_start = start + (np.arange(grid_rows) - first_row[tensor_of_row]) * CHUNK
    filled = np.minimum(lengths[tensor_of_row] - (row_start - start), CHUNK)  # values of its tensor in the row
    # each tensor's shift sample (sample_shift's), by position in the concatenation
    sampled = ((np.cumsum(lengths) - lengths)[:, None] + np.arange(SHIFT_SAMPLE) * lengths[:, None] // SHIFT_SAMPLE)
    table = torch.from_numpy(np.concatenate([tensor_of_row, start, row_start, filled, sampled.reshape(-1)]))
    if device.type == "cuda":  # a copy from pageable memory can wait for the device's queue to drain
        table = table.pin_memory()
    table = table.to(device, non_blocking=True)
    tensor_of_row, start, row_start, filled = table[:4 * grid_rows].view(4, grid_rows)
    sampled = table[4 * grid_rows:].view(n, SHIFT_SAMPLE)
    sample = data[sampled]
    middle = _middle(sample, 1)
    chosen = sampled.gather(1, middle[:, None])[:, 0][tensor_of_row]  # where each row's tensor's shift lies
    column = torch.arange(CHUNK, device=device)
    in_tensor = column < filled[:, None]
    # (repeat_interleave would lay this out too, but its CUDA kernel fills each repeat with one thread)
    grid = data[torch.where(in_tensor, row_start[:, None] + column, chosen[:, None])]  # (grid_rows, CHUNK)
    first = data[chosen]  # the filler: each row's tensor's shift value
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
        lo, hi = (torch.where(nan > 0, torch.full_like(bound, math.nan), bound) for bound in (lo, hi))
        if edges is not None and np.isfinite(edges).all(axis=1).any():
            fixed = torch.from_numpy(np.ascontiguousarray(edges, np.float64))
            if device.type == "cuda":
                fixed = fixed.pin_memory()
            fixed = fixed.to(device, non_blocking=True).to(dtype)
            given = torch.isfinite(fixed).all(1)
            lo, hi = torch.where(given, fixed[:, 0], lo), torch.where(given, fixed[:, 1], hi)
        counts = _binned(grid, lo[tensor_of_row], hi[tensor_of_row], tensor_of_row, in_tensor, n, bins)
    return rows, rows * CHUNK - lengths, sums, counts


def _binned(grid: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, tensor_of_row: torch.Tensor,
            in_tensor: torch.Tensor, n: int, bins: int) -> torch.Tensor:
    """Counts (n, bins) of the values of each grid row (where ``in_tensor``) in ``bins`` equal bins
    spanning its tensor's [lo, hi] (given per row): the arithmetic of :func:`device_histogram`."""
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    scale = torch.where(torch.isfinite(width), _bins_over(width, bins), torch.full_like(width, float("nan")))
    scaled = (grid - lo[:, None]) * scale[:, None]
    weight = (torch.isfinite(scaled) & in_tensor).long()  # non-finite values (and ranges) left out
    index = torch.nan_to_num(scaled, nan=0.0, posinf=0.0, neginf=0.0).clamp_(0, bins - 1).long()
    index.add_(tensor_of_row[:, None] * bins)
    # whole numbers: a float32 count stops at 2**24 (adding 1 to it changes nothing), an int32 one
    # wraps at 2**31 (a bin of a large attention tensor's zeros can hold more)
    counts = torch.zeros(n * bins, dtype=torch.int64, device=grid.device)
    return counts.scatter_add_(0, index.view(-1), weight.view(-1)).view(n, bins)


def _bins_over(width: torch.Tensor, bins: int) -> torch.Tensor:
    """``bins / width`` in ``width``'s float type, one division rounded once, as the compiled and
    Triton kernels divide: in float64, then rounded to the type (for float32 the same as one
    float32 division, float64 holding more than twice its digits). Not ``bins / width`` (a Python
    number over a tensor is ``width.reciprocal() * bins`` in torch, rounded twice: a value near a
    bin edge can land in the next bin), nor a float32 division, which inductor compiles to Triton's
    approximate one in a compiled graph on a GPU."""
    return (torch.full_like(width, bins, dtype=torch.float64) / width.double()).to(width.dtype)


def _middle(sample: torch.Tensor, dim: int) -> torch.Tensor:
    """The index along ``dim`` of the middle value by rank of ``sample`` (NaN ranking last, ties by
    position: a stable sort, NaN as +inf), as the compiled and Triton kernels pick it."""
    key = torch.where(torch.isnan(sample), torch.full_like(sample, math.inf), sample)
    return torch.sort(key, dim=dim, stable=True).indices.select(dim, SHIFT_SAMPLE // 2)


def sample_shift(flat: torch.Tensor) -> torch.Tensor:
    """The shift of a non-empty flat tensor's sums (:data:`~workbench.instrument.schema.SHIFT_SAMPLE`):
    the middle value by rank of ``flat[(i * n) // SHIFT_SAMPLE]``, or 0 where it is not finite; a
    0-d tensor of ``flat``'s dtype, on its device (no sync)."""
    index = torch.arange(SHIFT_SAMPLE, device=flat.device) * flat.numel() // SHIFT_SAMPLE
    sample = flat[index]
    chosen = sample.gather(0, _middle(sample, 0).reshape(1))[0]  # (no tensor index: a graph break)
    return torch.where(torch.isfinite(chosen), chosen, torch.zeros_like(chosen))


def combine_chunks(grid_sums: np.ndarray, grid_rows: np.ndarray, filler: np.ndarray) -> np.ndarray:
    """The :data:`SUMS` rows of tensors from the sums of their grid rows (:func:`chunk_sums`:
    ``grid_rows`` rows per tensor, in order, ``filler`` copies of its shift's value in the last):
    sums and counts add up, less what the filler added; the range is the widest (NaN wins, as in
    torch.aminmax); the shift is the tensor's. (A non-finite filler value makes the sums non-finite,
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
        sums = torch.tensor(EMPTY, dtype=torch.float64, device=flat.device)
        if zeros:
            add_implicit_zeros(sums, zeros, 0)
        return sums
    shift = sample_shift(flat)
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
        add_implicit_zeros(sums, zeros, n)
    return sums


def device_histogram(x: torch.Tensor, sums: torch.Tensor, bins: int, zeros: int = 0,
                     edges: torch.Tensor | None = None) -> torch.Tensor:
    """Counts of ``x`` (and ``zeros`` zeros besides) in ``bins`` equal bins spanning [min, max] (from
    ``sums``), or ``edges`` (2 float64, a fixed range: values outside it count in the end bins)
    where they are finite, on ``x``'s device.

    ``torch.histc`` needs its range as Python numbers (a device sync), so the
    bin index is computed arithmetically and counted with ``scatter_add_``.
    Non-finite values are left out (they are counted in nan/inf; with one in
    the tensor its range is not finite and no bin is filled); a tensor whose
    values are all equal puts everything in the first bin.
    """
    x = as_float(x).reshape(-1)
    counts = torch.zeros(bins, dtype=torch.float32, device=x.device)
    if zeros:
        counts += zeros_histogram(sums, zeros, x.dtype, bins)
    if x.numel() == 0:
        return counts
    lo, hi = sums[MIN].to(x.dtype), sums[MAX].to(x.dtype)
    if edges is not None:  # (finite in x's dtype, as the other paths take them)
        edges = edges.to(x.dtype)
        given = torch.isfinite(edges).all()
        lo, hi = torch.where(given, edges[0], lo), torch.where(given, edges[1], hi)
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    # an infinite range (the tensor holds an infinity) bins nothing: its edges would be meaningless
    scale = torch.where(torch.isfinite(width), _bins_over(width, bins), torch.full_like(width, float("nan")))
    scaled = (x - lo) * scale
    finite = torch.isfinite(scaled).long()  # non-finite inputs (and a non-finite range) left out
    index = torch.nan_to_num(scaled, nan=0.0, posinf=0.0, neginf=0.0).clamp_(0, bins - 1).long()
    # counted in integers (a float32 count stops at 2**24), then float32 as the rows keep them
    return counts + torch.zeros(bins, dtype=torch.int64, device=x.device).scatter_add_(0, index, finite)


def zeros_histogram(sums: torch.Tensor, zeros: int, dtype: torch.dtype, bins: int) -> torch.Tensor:
    """The counts of ``zeros`` zeros of ``dtype``: one zero binned with the arithmetic of the other
    values (the compiled kernel's and :func:`device_histogram`'s agree bin for bin), times ``zeros``."""
    return device_histogram(torch.zeros(1, dtype=dtype, device=sums.device), sums, bins) * zeros


