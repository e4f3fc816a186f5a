"""The statistics of a batch of GPU tensors in two Triton kernel launches.

On a GPU, a small training step is bound by the host: every torch op costs
a few microseconds of Python and launch overhead, however little data it
touches. The batch reduction with torch's ops (``stats.chunk_sums``) takes
~30 of them, a copy of the batch into one tensor and a combination of the
rows' sums on the host (~1.5 ms of host time a batch on an H100 machine).
These kernels read the tensors where they are (the batch is described by
offsets from the first tensor's address, so nothing is copied) and leave
the finished :data:`~workbench.instrument.stats.SUMS` rows on the device:

- ``row_partials``: one program per row of up to ``ROW`` values of one
  tensor; it reads them once, in blocks of ``BLOCK``, and writes the row's
  partial sums (of ``x - shift``, the shift being the tensor's first value or
  0 when that is not finite), absolute sum, range and counts. Each lane
  accumulates in float32 (float64 for float64 tensors) across the row's
  blocks, the lanes are summed as a tree.
- ``tensor_sums``: one program per tensor adds up its rows' partials in
  float64 and writes its SUMS row (float64).

float16 and bfloat16 values are read as they are and widened in registers.
NaN and infinities follow torch: NaN wins the range, counts are exact.
Imported only when a tensor on a CUDA device is summarized (``triton``
comes with PyTorch's CUDA builds); with ``TRITON_INTERPRET=1`` the same
kernels run on the CPU, which is how the tests without a GPU check them.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

#: Values a lane block reads at once, and per row (one program) at most.
BLOCK = 1024
ROW = 16 * BLOCK
#: Rows a tensor's program combines at once.
ROWS_AT_ONCE = 64
#: Partial sums per row: sum, sum_sq, abs_sum, min, max, nonzero, nan, inf.
PARTIALS = 8
#: The dtypes the kernels read as they are.
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _shift_of(first):
    # the tensor's first value where it is finite (x - x is 0 exactly for finite x), else 0
    return tl.where(first - first == 0, first, 0.0)


@triton.jit
def row_partials(base, row_offset, row_filled, row_first, partials, BLOCK: tl.constexpr, ACC: tl.constexpr):
    r = tl.program_id(0)
    offset = tl.load(row_offset + r)  # of the row's first value from ``base``, in values
    filled = tl.load(row_filled + r)
    shift = _shift_of(tl.load(base + tl.load(row_first + r)).to(ACC))
    lane = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], ACC)
    sum_sq = tl.zeros([BLOCK], ACC)
    abs_sum = tl.zeros([BLOCK], ACC)
    lo = tl.full([BLOCK], float("inf"), ACC)
    hi = tl.full([BLOCK], float("-inf"), ACC)
    nonzero = tl.zeros([BLOCK], tl.int32)
    nan = tl.zeros([BLOCK], tl.int32)
    inf = tl.zeros([BLOCK], tl.int32)
    for start in range(0, filled, BLOCK):
        inside = start + lane < filled
        x = tl.load(base + offset + start + lane, mask=inside, other=0.0).to(ACC)
        is_nan = x != x
        centred = tl.where(inside, x - shift, 0.0)
        total += centred
        sum_sq += centred * centred
        abs_sum += tl.abs(x)  # (0 where outside)
        lo = tl.minimum(lo, tl.where(inside & ~is_nan, x, float("inf")))
        hi = tl.maximum(hi, tl.where(inside & ~is_nan, x, float("-inf")))
        nonzero += (x != 0).to(tl.int32)  # (NaN counts: it is not zero)
        nan += is_nan.to(tl.int32)
        inf += ((x - x != x - x) & ~is_nan).to(tl.int32)  # inf - inf is NaN
    out = partials + r * 8
    tl.store(out + 0, tl.sum(total, 0))
    tl.store(out + 1, tl.sum(sum_sq, 0))
    tl.store(out + 2, tl.sum(abs_sum, 0))
    tl.store(out + 3, tl.min(lo, 0))
    tl.store(out + 4, tl.max(hi, 0))
    tl.store(out + 5, tl.sum(nonzero, 0).to(ACC))
    tl.store(out + 6, tl.sum(nan, 0).to(ACC))
    tl.store(out + 7, tl.sum(inf, 0).to(ACC))


@triton.jit
def tensor_sums(base, tensor_first, tensor_row, tensor_rows, partials, sums, ROWS: tl.constexpr,
                ACC: tl.constexpr):
    t = tl.program_id(0)
    first_row = tl.load(tensor_row + t)
    rows = tl.load(tensor_rows + t)
    lane = tl.arange(0, ROWS)
    total = tl.zeros([ROWS], tl.float64)
    sum_sq = tl.zeros([ROWS], tl.float64)
    abs_sum = tl.zeros([ROWS], tl.float64)
    lo = tl.full([ROWS], float("inf"), tl.float64)
    hi = tl.full([ROWS], float("-inf"), tl.float64)
    nonzero = tl.zeros([ROWS], tl.float64)
    nan = tl.zeros([ROWS], tl.float64)
    inf = tl.zeros([ROWS], tl.float64)
    for start in range(0, rows, ROWS):
        inside = start + lane < rows
        row = partials + (first_row + start + lane) * 8
        total += tl.load(row + 0, mask=inside, other=0.0).to(tl.float64)
        sum_sq += tl.load(row + 1, mask=inside, other=0.0).to(tl.float64)
        abs_sum += tl.load(row + 2, mask=inside, other=0.0).to(tl.float64)
        lo = tl.minimum(lo, tl.load(row + 3, mask=inside, other=float("inf")).to(tl.float64))
        hi = tl.maximum(hi, tl.load(row + 4, mask=inside, other=float("-inf")).to(tl.float64))
        nonzero += tl.load(row + 5, mask=inside, other=0.0).to(tl.float64)
        nan += tl.load(row + 6, mask=inside, other=0.0).to(tl.float64)
        inf += tl.load(row + 7, mask=inside, other=0.0).to(tl.float64)
    nans = tl.sum(nan, 0)
    out = sums + t * 9
    tl.store(out + 0, tl.sum(total, 0))
    tl.store(out + 1, tl.sum(sum_sq, 0))
    tl.store(out + 2, tl.sum(abs_sum, 0))
    tl.store(out + 3, tl.where(nans > 0, float("nan"), tl.min(lo, 0)))  # NaN wins, as in torch.aminmax
    tl.store(out + 4, tl.where(nans > 0, float("nan"), tl.max(hi, 0)))
    tl.store(out + 5, tl.sum(nonzero, 0))
    tl.store(out + 6, nans)
    tl.store(out + 7, tl.sum(inf, 0))
    tl.store(out + 8, _shift_of(tl.load(base + tl.load(tensor_first + t)).to(ACC)).to(tl.float64))


def batch_sums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The SUMS rows ``(len(tensors), 9)`` float64 of contiguous, non-empty tensors of one CUDA
    device (the current one) and one of :data:`DTYPES`, computed on it without waiting for it.

    The tensors must stay alive until the kernels have been queued (they are, by the time this
    returns); their memory is read in stream order, as a torch op would read it.
    """
    base = tensors[0]
    size = base.element_size()
    lengths = np.fromiter((x.numel() for x in tensors), np.int64, len(tensors))
    # each tensor's offset from the first's address, in values (addresses of one dtype are aligned)
    offsets = (np.fromiter((x.data_ptr() for x in tensors), np.int64, len(tensors)) - base.data_ptr()) // size
    rows = -(-lengths // ROW)
    tensor_row = np.cumsum(rows) - rows  # each tensor's first row
    tensor_of_row = np.repeat(np.arange(len(tensors)), rows)
    within = np.arange(int(rows.sum())) - tensor_row[tensor_of_row]  # the row's index in its tensor
    row_offset = offsets[tensor_of_row] + within * ROW
    row_filled = np.minimum(lengths[tensor_of_row] - within * ROW, ROW)
    n, n_rows = len(tensors), len(row_offset)
    table = torch.from_numpy(np.concatenate([row_offset, row_filled, offsets[tensor_of_row], offsets, tensor_row,
                                             rows]))
    device = base.device
    if device.type == "cuda":  # a copy from pageable memory can wait for the device's queue to drain
        table = table.pin_memory()
    table = table.to(device, non_blocking=True)
    row_offset, row_filled, row_first = table[:3 * n_rows].view(3, n_rows)
    tensor_first, tensor_row, tensor_rows = table[3 * n_rows:].view(3, n)
    acc = tl.float64 if base.dtype == torch.float64 else tl.float32
    partials = torch.empty((n_rows, PARTIALS), dtype=torch.float64 if acc == tl.float64 else torch.float32,
                           device=device)
    sums = torch.empty((n, 9), dtype=torch.float64, device=device)
    row_partials[(n_rows,)](base, row_offset, row_filled, row_first, partials, BLOCK=BLOCK, ACC=acc)
    tensor_sums[(n,)](base, tensor_first, tensor_row, tensor_rows, partials, sums, ROWS=ROWS_AT_ONCE, ACC=acc)
    return sums
