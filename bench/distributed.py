"""What watching a data-parallel run costs: 2-process DDP on the CPU (gloo), with and without
``watch_distributed``, and the part of it that is the collective.

Each rank trains the same experiment (its own batches, ``batch_size`` per rank) with one intra-op
thread (two ranks on a machine of two cores), wrapped in ``DistributedDataParallel``. Variants
run interleaved round by round on the same model:

Every watch records the statistics alone (``histograms=False``).

- ``ddp bare``: no watch;
- ``ddp + local watch``: a plain ``watch`` on each rank, nothing exchanged (what each rank's
  hooks cost);
- ``ddp + watch``: ``watch_distributed`` (every step recorded, merged on rank 0);
- ``ddp + watch + store``: the same, rank 0 writing the run store.

A step's time is the slower rank's (the ranks wait for each other in DDP's all-reduce anyway).
Inside ``publish`` the recorder's work is timed by parts: the payload (the parameter sums, on
rank 0 under DDP), the exchange (one ``all_gather`` of a tensor per recorded step: the transfer and the wait
for the other rank) and the merge on rank 0.

    python bench/distributed.py [--rounds 5] [--steps 100] [--experiment activation_mlp] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("ddp bare", "ddp + local watch", "ddp + watch", "ddp + watch + store")
PARTS = ("_payload", "_exchange", "_merge")
CONFIGS = {  # small built-in workloads: the MLP (a few tensors, fast steps) and the dynamics network
    "activation_mlp": {},
    "efficientzero_dynamics": dict(batch_size=32, latent_channels=16, spatial=6, actions=6, lstm_hidden_size=64,
                                   support_size=21, fc_reward_layers=[16], unroll_steps=3),
}


def _timed(recorder, name: str, totals: dict[str, float]) -> None:
    """Time ``recorder.<name>`` (a method), adding its seconds to ``totals[name]``."""
    method = getattr(recorder, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start

    setattr(recorder, name, timed)


def worker(rank: int, world: int, init: str, out: str, experiment: str, rounds: int, steps: int) -> None:
    import workbench
    import workbench.experiments
    from workbench.experiments.__main__ import data_parallel
    from workbench.instrument.distributed import destroy_process_group, watch_distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    exp = workbench.experiments.create(experiment, seed=0, **CONFIGS.get(experiment, {}))
    if rank:
        exp.generator.manual_seed(1_000_033 * rank)  # its own batches
    exp.model = data_parallel(exp.model)  # (DDP, the model's other methods reachable)
    exp.run(3)  # warm: allocator, DDP's buckets
    times = {v: [] for v in VARIANTS}
    parts = {p: [] for p in PARTS}
    store_root = Path(out) / "stores"
    for r in range(rounds):
        for variant in VARIANTS:
            w = None
            totals: dict[str, float] = {}
            if variant == "ddp + local watch":
                w = exp.watcher = workbench.watch(exp.model.module, histograms=False, start_step=exp.step_count + 1)
                exp.step()
            elif variant != "ddp bare":
                store = store_root / f"{r}" if variant.endswith("store") else None
                w = watch_distributed(exp.model, store=store, histograms=False, start_step=exp.step_count + 1)
                exp.watcher = w
                exp.step()  # untimed first step of the variant (its first merge, the store's first write)
                for name in PARTS:
                    _timed(w.recorder, name, totals)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                exp.step()
            elapsed = torch.tensor([(time.perf_counter() - start) / steps])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank's
            times[variant].append(elapsed.item())
            if w is not None:
                w.close()
                exp.watcher = None
                if variant == "ddp + watch":
                    for name in PARTS:
                        parts[name].append(totals.get(name, 0.0) / steps)
    # the collective alone: the same all_gather, the ranks in step (a barrier before each)
    size = 3 + w.recorder._capacity
    buffers = [torch.empty(size, dtype=torch.float64) for _ in range(world)]
    alone = []
    for _ in range(rounds * 20):
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather(buffers, torch.zeros(size, dtype=torch.float64))
        alone.append(time.perf_counter() - start)
    if rank == 0:
        (Path(out) / "result.json").write_text(json.dumps({"times": times, "parts": parts, "alone": alone,
                                                           "size": size}))
    destroy_process_group()


def run(experiment: str, rounds: int, steps: int, world: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(world, f"{tmp}/init", tmp, experiment, rounds, steps), nprocs=world,
                           join=True, start_method="spawn")
        return json.loads((Path(tmp) / "result.json").read_text())


def report(experiment: str, result: dict, rounds: int, steps: int, world: int = 2) -> str:
    times = {v: statistics.median(t) for v, t in result["times"].items()}
    bare = times["ddp bare"]
    lines = [f"{experiment}: {world} ranks, gloo, 1 thread per rank; median of {rounds} rounds x {steps} steps "
             "(a step's time is the slower rank's)"]
    for variant in VARIANTS:
        lines.append(f"  {variant:22s} {times[variant] * 1e3:8.3f} ms/step  {times[variant] / bare:5.2f}x")
    parts = {p: statistics.median(v) * 1e3 for p, v in result["parts"].items()}
    added = times["ddp + watch"] - times["ddp + local watch"]
    alone = statistics.median(result["alone"]) * 1e3
    lines.append(f"  the distributed layer adds {added * 1e3:.3f} ms/step over local watches; per recorded step on "
                 f"rank 0: payload (parameter sums) {parts['_payload']:.3f} ms, exchange {parts['_exchange']:.3f} ms "
                 f"(waits included), merge {parts['_merge']:.3f} ms")
    lines.append(f"  the all_gather alone ({result['size']} float64 per rank, ranks in step): {alone:.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--experiment", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--quick", action="store_true", help="1 round of 5 steps of the MLP (keeps the script working)")
    args = parser.parse_args(argv)
    experiments = args.experiment or sorted(CONFIGS)
    if args.quick:
        args.rounds, args.steps, experiments = 1, 5, ["activation_mlp"]
    for experiment in experiments:
        print(report(experiment, run(experiment, args.rounds, args.steps), args.rounds, args.steps), flush=True)


if __name__ == "__main__":
    sys.exit(main())
