"""Statistics of a tensor, reduced on its device and kept as a tensor.

A hook calls :func:`tensor_sums` and keeps the result: a handful of device
kernels, no host transfer. When a step is recorded, all sums of the step go to
the host in one transfer and :func:`finish` turns them into the columns of a
record row. Keeping raw sums on the device (not means and stds) keeps the hook
to plain reductions; the divisions happen once, on the host, in numpy.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["STAT_COLUMNS", "SUMS", "SMALL", "tensor_sums", "histogram", "SmallTensorBatch", "finish"]

#: Tensors of at most this many elements are summarized together at the end of a step
#: (:class:`SmallTensorBatch`): for them the ~15 kernel launches of :func:`tensor_sums`
#: cost far more than the arithmetic.
SMALL = 2_048

#: The raw per-tensor sums kept on the device, in this order.
SUMS = ("sum", "sum_sq", "abs_sum", "min", "max", "nonzero", "nan", "inf")
#: The statistics of a record row, derived from the sums and the numel.
STAT_COLUMNS = ("numel", "mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count")


def as_float(x: torch.Tensor) -> torch.Tensor:
    """The detached tensor as float32 or float64, the dtypes the reductions below are exact for."""
    x = x.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype in (torch.float32, torch.float64):
        return x
    # float16/bfloat16 widen; integers up to 2**53 are exact in float64; bool becomes 0/1
    return x.to(torch.float32 if x.is_floating_point() or x.dtype == torch.bool else torch.float64)


def tensor_sums(x: torch.Tensor) -> torch.Tensor:
    """The sums of :data:`SUMS` for ``x``: a float64 tensor of 8 values on ``x``'s device.

    Only branch-free elementwise ops and plain sums: comparisons, ``isnan`` and
    ``count_nonzero`` are several times slower on CPU (bool temporaries,
    data-dependent branches), so the counts use IEEE arithmetic instead:
    ``ceil(min(|x|, 1))`` is 1 for every non-zero, ``x * 0 + 1`` is NaN
    exactly where x is not finite, ``clamp(|x| - max, 0, 1)`` is 1 exactly at
    infinities, and ``nansum`` skips the NaNs.
    """
    flat = as_float(x).reshape(-1)
    if flat.numel() == 0:
        nan = float("nan")
        return torch.tensor([0.0, 0.0, 0.0, nan, nan, 0.0, 0.0, 0.0], dtype=torch.float64, device=flat.device)
    n = flat.numel()
    lo, hi = torch.aminmax(flat)
    total = flat.sum()
    sum_sq = torch.dot(flat, flat)
    magnitude = flat.abs()
    abs_sum = magnitude.sum()
    finite = torch.mul(flat, 0).add_(1).nansum()
    nonzero = torch.clamp(magnitude, max=1).ceil_().nansum()  # non-zero and not NaN (inf included)
    inf = magnitude.sub_(torch.finfo(flat.dtype).max).clamp_(0, 1).nansum()
    nan = n - finite - inf
    return torch.stack([total, sum_sq, abs_sum, lo, hi, nonzero + nan, nan, inf]).double()


def histogram(x: torch.Tensor, sums: torch.Tensor, bins: int) -> torch.Tensor:
    """Counts of ``x`` in ``bins`` equal bins spanning [min, max] (from ``sums``), on ``x``'s device.

    ``torch.histc`` needs its range as Python numbers (a device sync), so the
    bin index is computed arithmetically and counted with ``scatter_add_``.
    Non-finite values are left out (they are counted in nan/inf; with one in
    the tensor its range is not finite and no bin is filled); a tensor whose
    values are all equal puts everything in the first bin.
    """
    x = as_float(x).reshape(-1)
    counts = torch.zeros(bins, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return counts
    lo, hi = sums[3].to(x.dtype), sums[4].to(x.dtype)
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    # an infinite range (the tensor holds an infinity) bins nothing: its edges would be meaningless
    scale = torch.where(torch.isfinite(width), bins / width, torch.full_like(width, float("nan")))
    scaled = torch.nan_to_num((x - lo) * scale, nan=-1.0, posinf=-1.0, neginf=-1.0)
    finite = (scaled >= 0).to(torch.float32)  # non-finite inputs (and a non-finite range) land at -1
    index = scaled.clamp_(0, bins - 1).long()
    return counts.scatter_add_(0, index, finite)


class SmallTensorBatch:
    """Statistics of many small tensors, computed together in a few kernels.

    :meth:`add` keeps a flat copy of a tensor (one copy kernel) and returns
    its slot; :meth:`reduce` concatenates the copies and computes the sums of
    :data:`SUMS` (and histograms) of every slot with segment reductions, in
    float64. The copies are reduced early once they hold ``max_elements``, so
    a step without ``watch.step()`` cannot grow them without bound.

    Args:
        bins: histogram bins per slot, or None for no histograms.
        max_elements: elements held before an early reduction.
    """

    def __init__(self, bins: int | None, max_elements: int = 1 << 22) -> None:
        self.bins, self.max_elements = bins, max_elements
        self._flats: list[torch.Tensor] = []
        self._held = 0
        self._done: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.size = 0

    def add(self, x: torch.Tensor) -> int:
        """Keep a copy of ``x``; returns its slot (rows of :meth:`reduce` are in slot order)."""
        flat = as_float(x.reshape(-1))
        self._flats.append(flat.clone() if flat.data_ptr() == x.data_ptr() else flat)  # as_float may have copied
        self._held += flat.numel()
        self.size += 1
        if self._held >= self.max_elements:
            self._done.append(self._reduce(self._flats))
            self._flats, self._held = [], 0
        return self.size - 1

    def reduce(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(size, 8) float64 sums and (size, bins) float32 histograms (or None), in slot order."""
        parts = self._done + ([self._reduce(self._flats)] if self._flats else [])
        if not parts:
            return torch.zeros(0, 8, dtype=torch.float64), torch.zeros(0, self.bins) if self.bins else None
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if self.bins else None

    def _reduce(self, flats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = flats[0].device
        k = len(flats)
        lengths = torch.tensor([f.numel() for f in flats], device=device)
        data = torch.cat([f.double() for f in flats])
        seg = torch.repeat_interleave(torch.arange(k, device=device), lengths)

        def per_slot(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(k, dtype=torch.float64, device=device).index_add_(0, seg, values)

        magnitude = data.abs()
        total, sum_sq, abs_sum = per_slot(data), per_slot(data * data), per_slot(magnitude)
        # the same IEEE arithmetic as tensor_sums, NaNs zeroed before summing per slot
        finite = per_slot(torch.nan_to_num(data * 0 + 1, nan=0.0))
        nonzero = per_slot(torch.nan_to_num(torch.clamp(magnitude, max=1).ceil(), nan=0.0))
        # an infinity of the tensor's own dtype: float64 data from float32 tensors still reaches inf only at inf
        inf = per_slot(torch.nan_to_num((magnitude - torch.finfo(torch.float64).max).clamp(0, 1), nan=0.0))
        nan = lengths.double() - finite - inf
        lo = torch.full((k,), float("inf"), dtype=torch.float64, device=device).scatter_reduce_(
            0, seg, data, "amin", include_self=True)
        hi = torch.full((k,), -float("inf"), dtype=torch.float64, device=device).scatter_reduce_(
            0, seg, data, "amax", include_self=True)
        missing = (nan > 0) | (lengths == 0)  # aminmax gives NaN for a tensor holding a NaN, and for an empty one
        lo, hi = lo.masked_fill(missing, float("nan")), hi.masked_fill(missing, float("nan"))
        sums = torch.stack([total, sum_sq, abs_sum, lo, hi, nonzero + nan, nan, inf], 1)
        if not self.bins:
            return sums, None
        bins = self.bins
        width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
        scale = torch.where(torch.isfinite(width), bins / width, torch.full_like(width, float("nan")))
        scaled = torch.nan_to_num((data - lo[seg]) * scale[seg], nan=-1.0, posinf=-1.0, neginf=-1.0)
        counted = (scaled >= 0).to(torch.float32)
        index = scaled.clamp_(0, bins - 1).long() + seg * bins
        hist = torch.zeros(k * bins, dtype=torch.float32, device=device).index_add_(0, index, counted)
        return sums, hist.view(k, bins)


def finish(numel: np.ndarray, sums: np.ndarray) -> dict[str, np.ndarray]:
    """The :data:`STAT_COLUMNS` from host copies of the sums, vectorized over rows.

    Args:
        numel: (n,) element counts.
        sums: (n, 8) rows of :func:`tensor_sums`.
    """
    n = numel.astype(np.float64)
    s, sq, a, lo, hi, nonzero, nan, inf = sums.T
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = s / n
        # unbiased, as torch.std; the float64 sums make the difference accurate
        var = np.maximum(sq - s * mean, 0.0) / (n - 1)
        std = np.where(n > 1, np.sqrt(var), np.nan)
        std = np.where(np.isfinite(mean), std, np.nan)
        return {
            "numel": numel.astype(np.int64),
            "mean": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "abs_mean": a / n,
            "norm": np.sqrt(sq),
            "zero_frac": np.where(n > 0, (n - nonzero) / n, np.nan),
            "nan_count": nan.astype(np.int64),
            "inf_count": inf.astype(np.int64),
        }
