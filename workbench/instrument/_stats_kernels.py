"""Single-pass statistics of a CPU tensor, compiled with numba (cached on disk after the first call).

One call reads the tensor once and returns every sum of :data:`~workbench.instrument.stats.SUMS`;
the torch path launches ~15 kernels per tensor, which dominates for the many small
tensors of a model such as the ILQL agent's GPTs.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def sums_kernel(x):  # pragma: no cover (compiled)
    """(8,) float64: sum, sum of squares, abs sum, min, max, non-zero (NaNs included), NaN and inf counts
    of a 1-D float array, with torch's NaN semantics: a NaN makes the sums, min and max NaN."""
    total = 0.0
    sum_sq = 0.0
    abs_sum = 0.0
    nonzero = 0.0
    nan = 0.0
    inf = 0.0
    lo = np.inf
    hi = -np.inf
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        if v != v:
            nan += 1.0
            continue
        magnitude = abs(v)
        total += v
        sum_sq += v * v
        abs_sum += magnitude
        if v != 0.0:
            nonzero += 1.0
        if magnitude == np.inf:
            inf += 1.0
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    out = np.empty(8, dtype=np.float64)
    if nan > 0 or x.shape[0] == 0:
        lo = hi = np.nan
    if nan > 0:
        total = sum_sq = abs_sum = np.nan
    out[0], out[1], out[2], out[3], out[4] = total, sum_sq, abs_sum, lo, hi
    out[5], out[6], out[7] = nonzero + nan, nan, inf
    return out


@njit(cache=True, nogil=True)
def histogram_kernel(x, lo, scale, bins):  # pragma: no cover (compiled)
    """Counts of ``x`` in ``bins`` bins: bin = trunc(clamp((v - lo) * scale, 0, bins - 1)) for the
    values where (v - lo) * scale is finite and >= 0; ``lo`` and ``scale`` are 0-d arrays of x's
    dtype, so the arithmetic rounds as torch's does."""
    counts = np.zeros(bins, dtype=np.float32)
    low, factor = lo[()], scale[()]
    for i in range(x.shape[0]):
        scaled = (x[i] - low) * factor
        if scaled >= 0 and scaled != np.inf:  # False for NaN
            counts[min(int(scaled), bins - 1)] += 1.0
    return counts
