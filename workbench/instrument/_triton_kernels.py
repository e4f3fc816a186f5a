"""The statistics of a batch of GPU tensors in two Triton kernel launches.

On a GPU, a small training step is bound by the host: every torch op costs
a few microseconds of Python and launch overhead, however little data it
touches. The batch reduction with torch's ops (``stats.chunk_sums``) takes
~30 of them, a copy of the batch into one tensor and a combination of the
rows' sums on the host (~1.5 ms of host time a batch on an H100 machine).
These kernels read the tensors where they are (the batch is described by
offsets from the first tensor's address, so nothing is copied) and leave
the finished :data:`~workbench.instrument.schema.SUMS` rows on the device:

- ``tensor_partials``: a grid of (tensor, program); a tensor is cut in rows
  of ``ROW`` values, its programs take its rows in turn (a tensor of one row
  gets one; the others of its grid row return at once), read them once, in
  blocks of ``BLOCK``, and write partial sums (of ``x - shift``, the shift
  being the middle by rank of a sample of its values, as
  :func:`~workbench.instrument.reduce_torch.sample_shift` picks it, or 0 when that is not finite), absolute
  sum, range and counts. Each lane sums a row in float32 (float64 for
  float64 tensors), rows add up in float64, the lanes as a tree.
- ``tensor_sums``: one program per tensor adds up its programs' partials and
  writes its SUMS row (float64).
- ``tensor_histograms`` (with histograms): the grid of ``tensor_partials``
  reads the tensors again and counts their values in ``BINS`` equal bins
  over each tensor's fixed range, or its [min, max] from its SUMS row, with
  the arithmetic of torch's path
  (:func:`~workbench.instrument.reduce_torch.device_histogram`): the same
  float operations in the same precision, so that every value lands in the
  same bin. Each program counts its rows with ``tl.histogram`` and adds its
  counts to its tensor's with int64 atomic adds (exact, in any order).

The host sends only each tensor's offset and length: the layout is worked
out on the device.

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

from workbench.instrument.schema import SHIFT_SAMPLE

#: Values a program reads at once (a lane each), and per row: a tensor is cut in rows of ROW values.
BLOCK = 1024
ROW = 16 * BLOCK
#: Programs per tensor at most: a tensor of more rows has each program take several.
PROGRAMS = 128
#: Partial sums per program: sum, sum_sq, abs_sum, min, max, nonzero, nan, inf.
PARTIALS = 8
#: Values of a SUMS row (workbench.instrument.schema.SUMS).
SUMS = 9


assert SHIFT_SAMPLE == 15  # (the kernels take a sample of 15 values in 16 lanes)


@triton.jit
def _shift_of(base, offset, length, ACC: tl.constexpr):
    # the middle by rank of the values at offset + (i * length) // 15 (NaN ranking last, ties by
    # position), where it is finite (x - x is 0 exactly for finite x), else 0
    i = tl.arange(0, 16)
    valid = i < 15
    v = tl.load(base + offset + (i.to(tl.int64) * length) // 15, mask=valid, other=0.0).to(ACC)
    key = tl.where(v != v, float("inf"), v)
    before = ((key[None, :] < key[:, None]) | ((key[None, :] == key[:, None]) & (i[None, :] < i[:, None]))
              ) & valid[None, :]
    pick = (tl.sum(before.to(tl.int32), 1) == 7) & valid
    chosen = tl.sum(tl.where(pick, v, 0.0), 0)  # (NaN or infinite when the one picked is)
    return tl.where(chosen - chosen == 0, chosen, 0.0)


@triton.jit
def tensor_partials(base, table, n, programs, partials, ROW: tl.constexpr, BLOCK: tl.constexpr,
                    PARTIALS: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0)
    p = tl.program_id(1)
    offset = tl.load(table + t)  # of the tensor's first value from ``base``, in values
    length = tl.load(table + n + t)
    rows = tl.cdiv(length, ROW)
    if p < rows:
        shift = _shift_of(base, offset, length, ACC)
        lane = tl.arange(0, BLOCK)
        # sums: lanes in ACC within a row, in float64 across rows
        total = tl.zeros([BLOCK], tl.float64)
        sum_sq = tl.zeros([BLOCK], tl.float64)
        abs_sum = tl.zeros([BLOCK], tl.float64)
        lo = tl.full([BLOCK], float("inf"), ACC)
        hi = tl.full([BLOCK], float("-inf"), ACC)
        nonzero = tl.zeros([BLOCK], tl.int64)
        nan = tl.zeros([BLOCK], tl.int64)
        inf = tl.zeros([BLOCK], tl.int64)
        for row in range(p, rows, programs):
            start = offset + row * ROW
            filled = tl.minimum(length - row * ROW, ROW)
            row_total = tl.zeros([BLOCK], ACC)
            row_sum_sq = tl.zeros([BLOCK], ACC)
            row_abs_sum = tl.zeros([BLOCK], ACC)
            for at in range(0, filled, BLOCK):
                inside = at + lane < filled
                x = tl.load(base + start + at + lane, mask=inside, other=0.0).to(ACC)
                is_nan = x != x
                centred = tl.where(inside, x - shift, 0.0)
                row_total += centred
                row_sum_sq += centred * centred
                row_abs_sum += tl.abs(x)  # (0 where outside)
                lo = tl.minimum(lo, tl.where(inside & ~is_nan, x, float("inf")))
                hi = tl.maximum(hi, tl.where(inside & ~is_nan, x, float("-inf")))
                nonzero += (x != 0).to(tl.int64)  # (NaN counts: it is not zero)
                nan += is_nan.to(tl.int64)
                inf += ((x - x != x - x) & ~is_nan).to(tl.int64)  # inf - inf is NaN
            total += row_total.to(tl.float64)
            sum_sq += row_sum_sq.to(tl.float64)
            abs_sum += row_abs_sum.to(tl.float64)
        out = partials + (t * programs + p) * PARTIALS
        tl.store(out + 0, tl.sum(total, 0))
        tl.store(out + 1, tl.sum(sum_sq, 0))
        tl.store(out + 2, tl.sum(abs_sum, 0))
        tl.store(out + 3, tl.min(lo, 0).to(tl.float64))
        tl.store(out + 4, tl.max(hi, 0).to(tl.float64))
        tl.store(out + 5, tl.sum(nonzero, 0).to(tl.float64))
        tl.store(out + 6, tl.sum(nan, 0).to(tl.float64))
        tl.store(out + 7, tl.sum(inf, 0).to(tl.float64))


@triton.jit
def tensor_sums(base, table, n, programs, partials, sums, counts, ROW: tl.constexpr, LANES: tl.constexpr,
                PARTIALS: tl.constexpr, SUMS: tl.constexpr, ACC: tl.constexpr, BINS: tl.constexpr,
                COUNTED: tl.constexpr):
    t = tl.program_id(0)
    used = tl.minimum(tl.cdiv(tl.load(table + n + t), ROW), programs)  # the programs that ran for it
    lane = tl.arange(0, LANES)
    total = tl.zeros([LANES], tl.float64)
    sum_sq = tl.zeros([LANES], tl.float64)
    abs_sum = tl.zeros([LANES], tl.float64)
    lo = tl.full([LANES], float("inf"), tl.float64)
    hi = tl.full([LANES], float("-inf"), tl.float64)
    nonzero = tl.zeros([LANES], tl.float64)
    nan = tl.zeros([LANES], tl.float64)
    inf = tl.zeros([LANES], tl.float64)
    for start in range(0, used, LANES):
        inside = start + lane < used
        part = partials + (t * programs + start + lane) * PARTIALS
        total += tl.load(part + 0, mask=inside, other=0.0)
        sum_sq += tl.load(part + 1, mask=inside, other=0.0)
        abs_sum += tl.load(part + 2, mask=inside, other=0.0)
        lo = tl.minimum(lo, tl.load(part + 3, mask=inside, other=float("inf")))
        hi = tl.maximum(hi, tl.load(part + 4, mask=inside, other=float("-inf")))
        nonzero += tl.load(part + 5, mask=inside, other=0.0)
        nan += tl.load(part + 6, mask=inside, other=0.0)
        inf += tl.load(part + 7, mask=inside, other=0.0)
    nans = tl.sum(nan, 0)
    out = sums + t * SUMS
    tl.store(out + 0, tl.sum(total, 0))
    tl.store(out + 1, tl.sum(sum_sq, 0))
    tl.store(out + 2, tl.sum(abs_sum, 0))
    tl.store(out + 3, tl.where(nans > 0, float("nan"), tl.min(lo, 0)))  # NaN wins, as in torch.aminmax
    tl.store(out + 4, tl.where(nans > 0, float("nan"), tl.max(hi, 0)))
    tl.store(out + 5, tl.sum(nonzero, 0))
    tl.store(out + 6, nans)
    tl.store(out + 7, tl.sum(inf, 0))
    tl.store(out + 8, _shift_of(base, tl.load(table + t), tl.load(table + n + t), ACC).to(tl.float64))
    if BINS > 0:  # the tensor's histogram counts start at zero (tensor_histograms adds to them)
        bin_ids = tl.arange(0, COUNTED)
        tl.store(counts + t * BINS + bin_ids, tl.zeros([COUNTED], tl.int64), mask=bin_ids < BINS)


@triton.jit
def tensor_histograms(base, table, n, programs, sums, edges, counts, ROW: tl.constexpr, BLOCK: tl.constexpr,
                      SUMS: tl.constexpr, BINS: tl.constexpr, COUNTED: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0)
    p = tl.program_id(1)
    offset = tl.load(table + t)
    length = tl.load(table + n + t)
    rows = tl.cdiv(length, ROW)
    if p < rows:
        # the range: the row's fixed one where both its edges are finite in ACC, else the tensor's [min, max]
        fixed_lo = tl.load(edges + 2 * t).to(ACC)
        fixed_hi = tl.load(edges + 2 * t + 1).to(ACC)
        given = (tl.abs(fixed_lo) < float("inf")) & (tl.abs(fixed_hi) < float("inf"))
        lo = tl.where(given, fixed_lo, tl.load(sums + t * SUMS + 3).to(ACC))
        hi = tl.where(given, fixed_hi, tl.load(sums + t * SUMS + 4).to(ACC))
        width = tl.where(hi > lo, hi - lo, 1.0)
        # bins / width rounded once in ACC, as torch divides: in float64 (Triton's float32 ``/`` is
        # div.full.f32, not rounded to nearest), then rounded to ACC - for float32 the same as one
        # float32 division (float64 holds more than twice its digits). An infinite range bins
        # nothing (a NaN scale).
        scale = (BINS / width.to(tl.float64)).to(ACC)
        scale = tl.where(tl.abs(width) < float("inf"), scale, float("nan"))
        lane = tl.arange(0, BLOCK)
        total = tl.zeros([COUNTED], tl.int32)
        for row in range(p, rows, programs):
            start = offset + row * ROW
            filled = tl.minimum(length - row * ROW, ROW)
            for at in range(0, filled, BLOCK):
                inside = at + lane < filled
                x = tl.load(base + start + at + lane, mask=inside, other=0.0).to(ACC)
                scaled = (x - lo) * scale
                # finite: |scaled| < inf, false for NaN (not ``scaled - scaled == 0``: FP fusion makes
                # that an fma, the product's rounding error, 0 only where the product is exact)
                counted = inside & (tl.abs(scaled) < float("inf"))
                index = tl.minimum(tl.maximum(tl.where(counted, scaled, 0.0), 0.0), BINS - 1).to(tl.int32)
                # the values left out go to bin BINS, past the counted ones (COUNTED > BINS)
                total += tl.histogram(tl.where(counted, index, BINS), COUNTED)
        bin_ids = tl.arange(0, COUNTED)
        tl.atomic_add(counts + t * BINS + bin_ids, total.to(tl.int64), mask=bin_ids < BINS)


#: The device tables of the last batches (see batch_sums), by their tensors' addresses, lengths
#: and value size: a training loop's steps mostly get the same memory from torch's caching
#: allocator, and its parameters keep theirs, so most batches find theirs here.
_tables: dict[tuple, torch.Tensor] = {}
_TABLES = 64


def batch_sums(tensors: list[torch.Tensor], bins: int = 0, edges: np.ndarray | torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The SUMS rows ``(len(tensors), 9)`` float64 of contiguous, non-empty tensors of one CUDA
    device (the current one) and one dtype (float16, bfloat16, float32 or float64), computed on
    it without waiting for it; with ``bins``, also their histogram counts ``(len(tensors), bins)``
    int64, over ``edges`` ((n, 2) float64, each tensor's fixed range; NaN: its own [min, max]), an
    array, or a tensor already on the device.

    The tensors must stay alive until the kernels have been queued (they are, by the time this
    returns); their memory is read in stream order, as a torch op would read it.
    """
    base = tensors[0]
    n = len(tensors)
    device = base.device
    addresses = tuple([x.data_ptr() for x in tensors])
    lengths = tuple([x.numel() for x in tensors])
    # (a tensor alone is its table's only entry, at offset 0: its table does not depend on its address)
    key = (device, base.element_size(), addresses if n > 1 else None, lengths)
    table = _tables.get(key)
    if table is None:
        # each tensor's offset from the first's address, in values (addresses of one dtype are aligned)
        offsets = (np.array(addresses, np.int64) - addresses[0]) // base.element_size()
        if len(_tables) >= _TABLES:
            _tables.clear()
        table = _tables[key] = _upload(np.concatenate([offsets, np.array(lengths, np.int64)]), device)
    programs = min(-(-max(lengths) // ROW), PROGRAMS)
    out = torch.empty(n * SUMS + n * programs * PARTIALS, dtype=torch.float64, device=device)
    sums, partials = out[:n * SUMS], out[n * SUMS:]
    counts = torch.empty(n * bins, dtype=torch.int64, device=device) if bins else out  # (none: not written)
    # the counts' length rounded up to a power of two, past the last bin: where left-out values go
    counted = triton.next_power_of_2(bins + 1)
    acc = tl.float64 if base.dtype == torch.float64 else tl.float32
    tensor_partials[(n, programs)](base, table, n, programs, partials, ROW=ROW, BLOCK=BLOCK, PARTIALS=PARTIALS,
                                   ACC=acc)
    tensor_sums[(n,)](base, table, n, programs, partials, sums, counts, ROW=ROW, LANES=64, PARTIALS=PARTIALS,
                      SUMS=SUMS, ACC=acc, BINS=bins, COUNTED=counted)
    if not bins:
        return sums.view(n, SUMS), None
    if isinstance(edges, torch.Tensor):
        ranges = edges.to(device, torch.float64).contiguous()
    else:
        ranges = _upload(np.ascontiguousarray(edges if edges is not None else np.full((n, 2), np.nan), np.float64),
                         device)
    tensor_histograms[(n, programs)](base, table, n, programs, sums, ranges, counts, ROW=ROW, BLOCK=BLOCK,
                                     SUMS=SUMS, BINS=bins, COUNTED=counted, ACC=acc)
    return sums.view(n, SUMS), counts.view(n, bins)


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` on ``device``, by a copy that does not wait for the device."""
    host = torch.from_numpy(array)
    if device.type == "cuda":  # a copy from pageable memory can wait for the device's queue to drain
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
