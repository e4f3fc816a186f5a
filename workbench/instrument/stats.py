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

from workbench.instrument._stats_kernels import histogram_kernel, sums_kernel

__all__ = ["STAT_COLUMNS", "SUMS", "COMPILED_MAX", "tensor_sums", "histogram", "finish"]

#: CPU tensors of at most this many elements are reduced in one compiled pass
#: (:mod:`workbench.instrument._stats_kernels`); above it torch's vectorized kernels win.
COMPILED_MAX = 65_536

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
    if flat.device.type == "cpu" and flat.numel() <= COMPILED_MAX:
        return torch.from_numpy(sums_kernel(flat.numpy()))
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
    if x.device.type == "cpu" and x.numel() <= COMPILED_MAX:
        values = x.numpy()
        real = values.dtype.type
        with np.errstate(all="ignore"):  # the same float arithmetic as below, in numpy scalars of x's dtype
            lo, hi = real(sums.numpy()[3]), real(sums.numpy()[4])
            width = hi - lo if hi > lo else real(1)
            scale = real(bins) / width if np.isfinite(width) else real(np.nan)
        return torch.from_numpy(histogram_kernel(values, np.asarray(lo), np.asarray(scale), bins))
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
