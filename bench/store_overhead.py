"""The run store's cost, measured in one process.

1. Rows per second written into the SQLite store (synthetic records of 250 rows,
   like one dynamics-network step, with and without 32-bin histograms).
2. Training-step time of the dynamics network (Atari sizes, batch 256, K=5)
   with ``watch`` vs ``watch`` + ``store``, interleaved round by round.
3. Memory: RSS growth over 10 000 recorded steps of the activation MLP with a
   store attached (the in-memory buffer is bounded; the store holds the rest).

    python bench/store_overhead.py [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import workbench
from workbench.instrument import StepRecord
from workbench.instrument.schema import SUMS
from workbench.instrument.store import RunStore


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rows_per_second(root: Path, histograms: bool, steps: int = 200, rows: int = 250) -> float:
    keys = tuple((f"block.{i}", 0, "activation", "out", (256, 64, 6, 6)) for i in range(rows))
    sums = np.random.default_rng(0).random((rows, len(SUMS)))
    hist = np.ones((rows, 32), np.float32) if histograms else None
    store = RunStore(root / f"rate-{histograms}")
    start = time.perf_counter()
    for step in range(1, steps + 1):
        store.write(StepRecord(step, keys, np.full(rows, 589824), sums, hist, {"loss": 1.0}))
    seconds = time.perf_counter() - start
    store.close()
    return steps * rows / seconds


def step_ratio(root: Path, rounds: int, steps: int, batch: int) -> tuple[float, float]:
    exp = workbench.experiments.create(
        "efficientzero_dynamics", seed=0, batch_size=batch, latent_channels=64, actions=6, spatial=6,
        lstm_hidden_size=512, support_size=601, fc_reward_layers=[32], unroll_steps=5)
    exp.run(2)
    times: dict[str, list[float]] = {"watch": [], "watch+store": []}
    for r in range(rounds):
        for name in times:
            w = exp.watch(store=root / f"ratio-{r}" if name == "watch+store" else None)
            exp.step()  # untimed warm-up step of the variant
            start = time.perf_counter()
            for _ in range(steps):
                exp.step()
            times[name].append((time.perf_counter() - start) / steps)
            w.close()
    watch, stored = statistics.median(times["watch"]), statistics.median(times["watch+store"])
    return watch, stored


def memory_growth(root: Path, steps: int) -> tuple[float, float, int]:
    exp = workbench.experiments.create("activation_mlp", seed=0, width=16)
    w = exp.watch(store=root / "memory", recorder=workbench.Recorder(max_rows=20_000))
    exp.run(200)
    w.recorder.flush()
    before = rss_mb()
    exp.run(steps)
    w.recorder.flush()
    after = rss_mb()
    w.close()
    return before, after, len(workbench.load_run(root / "memory").steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="workbench-bench-"))
    print(f"store rows/s: {rows_per_second(root, False):,.0f} (no histograms), "
          f"{rows_per_second(root, True):,.0f} (32-bin histograms)")
    batch = 32 if args.quick else 256
    watch, stored = step_ratio(root, args.rounds, 3, batch)
    print(f"dynamics network step, batch {batch}: watch {watch * 1e3:.1f} ms, watch+store {stored * 1e3:.1f} ms, "
          f"ratio {stored / watch:.3f}x")
    steps = 1000 if args.quick else 10_000
    before, after, stored_steps = memory_growth(root, steps)
    print(f"RSS over {steps} recorded steps (activation MLP, store attached): {before:.0f} MB -> {after:.0f} MB "
          f"(+{after - before:.0f} MB); {stored_steps} steps in the store")


if __name__ == "__main__":
    main()
