"""One-pass statistics of CPU tensors, compiled with numba (cached on disk after the first build).

The statistics pass reads a tensor once and writes every value of
:data:`~workbench.instrument.schema.SUMS` straight into a row of the step's host
array; torch's kernels would take ~10 passes and allocate temporaries (fresh
pages, the main cost of instrumenting a step that way: the bench's "watch (torch
reductions)" variant). The kernels are C callbacks (``cfunc``), called with raw
addresses through ctypes without releasing the GIL: a fraction of what a numba
dispatch with array arguments plus ``Tensor.numpy()`` costs, or releasing and
retaking the GIL - it matters for models with hundreds of small tensors per step.

Two passes, so that the common case runs at memory speed:

- ``fast``: compiled with fast-math flags that let LLVM vectorize every
  accumulator (``nnan`` is the one that unlocks the min/max reductions). Sums
  are kept in the tensor's dtype within blocks of 4096 values and in float64
  across blocks; sums are of ``x - shift``, the shift being the median of a strided sample of the
  tensor (:func:`sample_shift`), so the variance keeps its precision when the mean is large against
  the spread, wherever the tensor's outliers lie (``bench/histogram_kernels.py`` times it).
- ``exact``: a scalar float64 loop with IEEE semantics that also counts NaNs
  and infinities. It runs only when the fast pass says the tensor holds a
  non-finite value or its float32 sums overflowed (sum of squares or absolute
  sum not finite). That check is made outside the fast-math code, where the
  optimizer could assume NaN away: by the Python caller, or by ``check``, a
  kernel compiled on its own without fast-math flags.

Histograms (:func:`binned`) are counted right after a tensor's statistics, in the same compiled
call, over the row's fixed range (or, without one yet, the range the statistics just found): a
tensor below :data:`SAMPLE_FROM` values from all its values, while they are still in cache; a
larger one from a sample of :data:`SAMPLE` values (:func:`sample_pass`), whose draws touch a few
thousand cache lines where a full count would read the whole tensor again.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from workbench.instrument.schema import SHIFT_SAMPLE

BLOCK = 4096
#: Values a sampled histogram is counted from, and the size from which a tensor's histogram is
#: sampled (see :mod:`workbench.instrument.reduce`: the error this leaves is bounded there).
SAMPLE = 16384  # a power of two, and a multiple of BLOCK
SAMPLE_FROM = 8 * SAMPLE  # (the sample reads at most an eighth of the values)
_SAMPLE_BITS = SAMPLE.bit_length() - 1
# no "ninf": infinities keep IEEE semantics, so they reach the sums and trigger the exact pass
_FAST = {"nnan", "reassoc", "contract", "nsz", "arcp"}


def _binary_intrinsic(name: str):
    """An LLVM floating-point intrinsic of two arguments of one type: the loop vectorizer knows
    ``llvm.minnum``/``llvm.maxnum`` reductions, where numba's ``min``/``max`` are branches."""

    @intrinsic
    def call(typingctx, a, b):
        if a != b:
            return None

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(args[0].type, [args[0].type, args[1].type])
            return builder.call(builder.module.declare_intrinsic(name, [args[0].type], fnty), args)

        return a(a, b), codegen

    return call


@intrinsic
def _like(typingctx, sample, value):
    """``value`` converted to the type of ``sample`` (numba's literals are float64; a float32 kernel
    must not mix them in, or every operation widens)."""

    def codegen(context, builder, signature, args):
        return context.cast(builder, args[1], signature.args[1], signature.return_type)

    return sample(sample, value), codegen


_minnum, _maxnum = _binary_intrinsic("llvm.minnum"), _binary_intrinsic("llvm.maxnum")


@intrinsic
def _as_pointer(typingctx, address, like):
    """The integer ``address`` as a pointer: of ``like``'s type when that is a pointer, else to
    values of ``like``'s type."""
    pointer = like if isinstance(like, types.CPointer) else types.CPointer(like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(address, like), codegen


@njit(nogil=True, cache=True)
def sample_shift(x):  # pragma: no cover (compiled)
    """The shift of the sums (:data:`~workbench.instrument.schema.SHIFT_SAMPLE`): of the values
    ``x[(i * n) // SHIFT_SAMPLE]``, the middle one by rank (NaN ranking last, ties by position),
    or 0 where that is not finite; in x's dtype. IEEE comparisons (not fast-math): NaN counts."""
    n = x.shape[0]
    middle = SHIFT_SAMPLE // 2
    chosen = x[0]
    for i in range(SHIFT_SAMPLE):
        v = x[(i * n) // SHIFT_SAMPLE]
        key = np.inf if v != v else np.float64(v)
        below = 0
        for j in range(SHIFT_SAMPLE):
            w = x[(j * n) // SHIFT_SAMPLE]
            other = np.inf if w != w else np.float64(w)
            if other < key or (other == key and j < i):
                below += 1
        if below == middle:
            chosen = v
            break
    return chosen if np.isfinite(chosen) else _like(chosen, 0.0)


@njit(fastmath=_FAST, nogil=True, cache=True)
def fast_pass(x, out):  # pragma: no cover (compiled)
    """SUMS of a non-empty 1-D float array into ``out`` (9 float64), assuming no NaN; the caller
    checks that ``out[1]`` and ``out[2]`` are finite, else runs :func:`exact_pass`."""
    n = x.shape[0]
    shift = sample_shift(x)
    zero, one = _like(shift, 0.0), _like(shift, 1.0)
    lo = hi = x[0]
    total = sum_sq = abs_sum = zeros = 0.0
    for b in range((n + BLOCK - 1) // BLOCK):
        chunk = x[b * BLOCK:(b + 1) * BLOCK]
        s = q = a = z = zero
        for i in range(chunk.shape[0]):
            v = chunk[i]
            d = v - shift
            s += d
            q += d * d
            a += abs(v)
            z += one if v == 0 else zero
            lo = _minnum(lo, v)
            hi = _maxnum(hi, v)
        total += s
        sum_sq += q
        abs_sum += a
        zeros += z
    out[0], out[1], out[2], out[3], out[4] = total, sum_sq, abs_sum, lo, hi
    out[5], out[6], out[7], out[8] = n - zeros, 0.0, 0.0, shift


@njit(nogil=True, cache=True)
def exact_pass(x, out):  # pragma: no cover (compiled)
    """SUMS of a non-empty 1-D float array into ``out``, in float64 with torch's NaN semantics:
    a NaN makes the sums, min and max NaN; NaNs count as non-zero."""
    shift = np.float64(sample_shift(x))
    total = sum_sq = abs_sum = nonzero = nan = inf = 0.0
    lo, hi = np.inf, -np.inf
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        if v != v:
            nan += 1.0
            continue
        d = v - shift
        total += d
        sum_sq += d * d
        abs_sum += abs(v)
        if v != 0.0:
            nonzero += 1.0
        if abs(v) == np.inf:
            inf += 1.0
        lo = min(lo, v)
        hi = max(hi, v)
    if nan > 0:
        total = sum_sq = abs_sum = lo = hi = np.nan
    out[0], out[1], out[2], out[3], out[4] = total, sum_sq, abs_sum, lo, hi
    out[5], out[6], out[7], out[8] = nonzero + nan, nan, inf, shift


@njit(nogil=True, cache=True)
def _bin_range(x0, sums, edges):  # pragma: no cover (compiled)
    """``(low, width, ok)`` of the bins: over ``edges`` (2 float64) where they are finite in x's
    dtype (the row's fixed range), else over the tensor's [min, max] from ``sums`` (a width of 1
    where that is one value); in x's dtype (``x0``). ``ok`` is False when the range is not finite
    (nothing is binned)."""
    low, high = _like(x0, edges[0]), _like(x0, edges[1])
    if not (np.isfinite(low) and np.isfinite(high)):
        low, high = _like(x0, sums[3]), _like(x0, sums[4])
    width = high - low if high > low else _like(low, 1.0)
    return low, width, np.isfinite(width)


@njit(nogil=True, cache=True)
def histogram_pass(x, sums, edges, out):  # pragma: no cover (compiled)
    """Add the counts of ``x`` in ``bins`` equal bins (``out``, bins float32) over its range (see
    :func:`_bin_range`), with the arithmetic of the torch path, in x's dtype: bin =
    trunc(clamp((v - low) * scale, 0, bins - 1)) for a finite v (a value outside a fixed range
    goes to the end bin on its side); non-finite values are left out, and every value when the
    range is not finite.

    Per block: the bin indices in one vectorizable loop (a left-out value gets the spare index
    ``bins``), then the counting into four interleaved histograms, so that consecutive values
    in one bin do not wait on each other's increment.
    """
    bins = out.shape[0]
    last = bins - 1
    low, width, ok = _bin_range(x[0], sums, edges)
    if not ok:
        return
    factor = _like(low, bins) / width
    top, zero = _like(low, last), _like(low, 0.0)
    spare = np.uint32(bins)
    # unsigned indices into flat arrays: numba checks signed ones for negative wrap-around
    index = np.empty(BLOCK, np.uint32)
    stride = np.uint32(bins + 1)
    counts = np.zeros(4 * (bins + 1), np.int64)
    n = x.shape[0]
    for start in range(0, n, BLOCK):
        chunk = x[start:start + BLOCK]
        size = chunk.shape[0]
        for i in range(size):
            scaled = (chunk[i] - low) * factor
            capped = min(max(scaled, zero), top)
            index[i] = np.uint32(capped) if scaled - scaled == zero else spare  # NaN, +-inf: spare
        body = size - size % 4
        for i in range(0, body, 4):
            counts[index[i]] += 1
            counts[stride + index[i + 1]] += 1
            counts[2 * stride + index[i + 2]] += 1
            counts[3 * stride + index[i + 3]] += 1
        for i in range(body, size):
            counts[index[i]] += 1
    for b in range(bins):
        out[b] += counts[b] + counts[stride + b] + counts[2 * stride + b] + counts[3 * stride + b]


@njit(nogil=True, cache=True)
def sample_pass(x, sums, edges, out, seed):  # pragma: no cover (compiled)
    """:func:`histogram_pass` estimated from :data:`SAMPLE` values of ``x``: one drawn uniformly
    from each of SAMPLE equal strata of the tensor (jittered systematic sampling: every part of
    the tensor is represented, and a layout's period cannot line up with the draws), each
    counting for ``n / SAMPLE`` values. ``seed`` picks the draws.

    In blocks: the draws' positions (a counter-based hash of the seed and the draw's number, so
    that the loop has no carried state and vectorizes) and their bins in vectorizable loops,
    then the counting into four interleaved histograms, as in :func:`histogram_pass`.
    """
    bins = out.shape[0]
    last = bins - 1
    low, width, ok = _bin_range(x[0], sums, edges)
    if not ok:
        return
    factor = _like(low, bins) / width
    top, zero = _like(low, last), _like(low, 0.0)
    n = np.uint64(x.shape[0])
    spare = np.uint32(bins)
    stride = np.uint32(bins + 1)
    mask = np.uint64(0xFFFFFFFF)
    key = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    at = np.empty(BLOCK, np.int64)
    index = np.empty(BLOCK, np.uint32)
    counts = np.zeros(4 * (bins + 1), np.int64)
    for first in range(0, SAMPLE, BLOCK):
        for k in range(BLOCK):
            i = np.uint64(first + k)
            # lowbias32 of the draw's number and the seed: 32 random bits per draw
            h = ((i ^ key ^ (key >> np.uint64(32))) & mask)
            h ^= h >> np.uint64(16)
            h = (h * np.uint64(0x7FEB352D)) & mask
            h ^= h >> np.uint64(15)
            h = (h * np.uint64(0x846CA68B)) & mask
            h ^= h >> np.uint64(16)
            # stratum i is [i n / SAMPLE, (i + 1) n / SAMPLE) (SAMPLE a power of two: shifts)
            begin = (i * n) >> np.uint64(_SAMPLE_BITS)
            size = (((i + np.uint64(1)) * n) >> np.uint64(_SAMPLE_BITS)) - begin
            at[k] = np.int64(begin + ((h * size) >> np.uint64(32)))
        for k in range(BLOCK):
            scaled = (x[at[k]] - low) * factor
            capped = min(max(scaled, zero), top)
            index[k] = np.uint32(capped) if scaled - scaled == zero else spare  # NaN, +-inf: spare
        for k in range(0, BLOCK, 4):
            counts[index[k]] += 1
            counts[stride + index[k + 1]] += 1
            counts[2 * stride + index[k + 2]] += 1
            counts[3 * stride + index[k + 3]] += 1
    weight = np.float64(n) / SAMPLE
    for b in range(bins):
        out[b] += (counts[b] + counts[stride + b] + counts[2 * stride + b] + counts[3 * stride + b]) * weight


@njit(nogil=True, cache=True)
def binned(x, sums, edges, out, seed):  # pragma: no cover (compiled)
    """The histogram of ``x`` into ``out``: counted from a sample when ``x`` holds at least
    :data:`SAMPLE_FROM` values, else from every value."""
    if x.shape[0] >= SAMPLE_FROM:
        sample_pass(x, sums, edges, out, seed)
    else:
        histogram_pass(x, sums, edges, out)


# ------------------------------------------------------------------ C callbacks
_POINTER = {"float32": types.CPointer(types.float32), "float64": types.CPointer(types.float64)}
_OUT = types.CPointer(types.float64)
_COUNTS = types.CPointer(types.float32)
#: Columns of a batch's table: data, n, sums, counts, edges (addresses), seed.
TABLE = 6


# plain functions, not closures: numba's cache does not recognise a closure's cells in a new
# process and would compile (and store) it again each time
def _fast_body(data, n, out):  # pragma: no cover (compiled)
    fast_pass(carray(data, (n,)), carray(out, (9,)))


def _exact_body(data, n, out):  # pragma: no cover (compiled)
    exact_pass(carray(data, (n,)), carray(out, (9,)))


def _histogram_body(data, n, sums, bins, out, edges, seed):  # pragma: no cover (compiled)
    binned(carray(data, (n,)), carray(sums, (9,)), carray(edges, (2,)), carray(out, (bins,)), seed)


def _batch_body(table, count, bins, sample):  # pragma: no cover (compiled)
    entries = carray(table, (count, TABLE))
    for i in range(count):
        x = carray(_as_pointer(entries[i, 0], sample), (entries[i, 1],))
        out = carray(_as_pointer(entries[i, 2], 0.0), (9,))
        fast_pass(x, out)
        if bins > 0:
            binned(x, out, carray(_as_pointer(entries[i, 4], 0.0), (2,)),
                   carray(_as_pointer(entries[i, 3], np.float32(0.0)), (bins,)), entries[i, 5])


def _check_body(table, count):  # pragma: no cover (compiled)
    entries = carray(table, (count, TABLE))
    redo = 0
    for i in range(count):
        out = carray(_as_pointer(entries[i, 2], 0.0), (9,))
        if not (np.isfinite(out[1]) and np.isfinite(out[2])):
            redo += 1
    return redo


def compile_kernels(dtype: str) -> tuple:
    """``(fast, exact, histogram, batch, check)`` for arrays of ``dtype`` ("float32"/"float64"), as ctypes
    callables that keep the GIL (cheaper than releasing it around such short calls):

    - ``fast(data_address, n, out_address)`` / ``exact(...)``: the 9 SUMS as float64 at ``out_address``;
    - ``histogram(data_address, n, sums_address, bins, counts_address, edges_address, seed)``: adds
      the counts (float32) of a non-empty array at ``counts_address`` (:func:`binned`: over the
      2 float64 at ``edges_address`` where finite, else the sums' range; sampled from a large array);
    - ``batch(table_address, count, bins, None)``: ``fast`` (and ``histogram`` when ``bins`` > 0)
      for each row ``(data_address, n, out_address, counts_address, edges_address, seed)`` of an
      int64 table ``(count, TABLE)``, in one call. The caller checks each row's sums and redoes the non-finite ones with
      ``exact`` (and their histogram), as after ``fast``. The last argument only types the data.
    - ``check(table_address, count)``: how many rows of such a table have sums that ``fast`` could
      not get right (a sum of squares or an absolute sum that is not finite: a NaN, an infinity,
      an overflow), to be redone with ``exact``. Compiled on its own, without fast-math flags, and
      called from Python: the optimizer cannot carry the fast pass's no-NaN assumption into it.
      One call in place of a few numpy calls, which cost tens of microseconds each in the middle
      of a backward, their code gone cold.

    Loaded from numba's disk cache after the first build; the caller keeps the result.
    """
    sums_signature = types.void(_POINTER[dtype], types.intp, _OUT)
    sums_prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p)
    histogram_signature = types.void(_POINTER[dtype], types.intp, _OUT, types.intp, _COUNTS, _OUT, types.int64)
    histogram_prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p,
                                            ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    batch_signature = types.void(types.CPointer(types.int64), types.intp, types.intp, _POINTER[dtype])
    batch_prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p)
    check_signature = types.intp(types.CPointer(types.int64), types.intp)
    check_prototype = ctypes.PYFUNCTYPE(ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_ssize_t)
    return (
        sums_prototype(cfunc(sums_signature, nogil=True, cache=True)(_fast_body).address),
        sums_prototype(cfunc(sums_signature, nogil=True, cache=True)(_exact_body).address),
        histogram_prototype(cfunc(histogram_signature, nogil=True, cache=True)(_histogram_body).address),
        batch_prototype(cfunc(batch_signature, nogil=True, cache=True)(_batch_body).address),
        check_prototype(cfunc(check_signature, nogil=True, cache=True)(_check_body).address),
    )
