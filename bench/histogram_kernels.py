"""What a histogram costs next to a tensor's statistics, per tensor size, on the CPU kernels.

For float32 tensors of each size (normal values), the median time of one call of:

- statistics: the one-pass SUMS kernel (``fast_pass``), what ``watch(histograms=False)`` reads;
- full count: the 32-bin histogram of every value (``histogram_pass``), what tensors below
  ``SAMPLE_FROM`` values get;
- sample: the histogram from ``SAMPLE`` stratified draws (``sample_pass``), what larger tensors get.

The crossover of the last two says where sampling starts to pay; the figures per value say what
histograms of many mid-sized tensors (the ILQL agent's) cost at least.

    python bench/histogram_kernels.py [--quick] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np

from workbench.instrument import _stats_kernels as kernels

SIZES = (4096, 16384, 49152, 65536, 131072, 262144, 1048576)


def median_us(call, repeats: int) -> float:
    """The median over 5 timings of ``repeats`` calls of ``call``, in microseconds a call (after one
    call: compiled on first use)."""
    call()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        times.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=0, help="calls per timing (default: 2000, quick 20)")
    args = parser.parse_args()
    sizes = SIZES[:1] + SIZES[-2:-1] if args.quick else SIZES
    repeats = args.repeats or (20 if args.quick else 2000)
    rng = np.random.default_rng(0)
    print(f"SAMPLE={kernels.SAMPLE} draws, sampled from SAMPLE_FROM={kernels.SAMPLE_FROM} values; 32 bins")
    print(f"{'values':>9}  {'statistics':>16}  {'full count':>16}  {'sample':>9}")
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        sums = np.zeros(9)
        kernels.fast_pass(x, sums)
        edges, counts = np.full(2, np.nan), np.zeros(32, np.float32)
        stats = median_us(lambda: kernels.fast_pass(x, sums), repeats)
        full = median_us(lambda: kernels.histogram_pass(x, sums, edges, counts), repeats)
        seeds = itertools.count()  # new draws each call, as the watch makes them
        sample = (f"{median_us(lambda: kernels.sample_pass(x, sums, edges, counts, next(seeds)), repeats):6.1f} us"
                  if n >= kernels.SAMPLE else "       -")
        print(f"{n:>9}  {stats:6.1f} us {stats * 1e3 / n:4.2f} ns/v  {full:6.1f} us {full * 1e3 / n:4.2f} ns/v  {sample}")


if __name__ == "__main__":
    main()
