"""Where a watched training step's time goes: ``torch.profiler`` over a few steps of one of
``instrument_overhead.py``'s workloads, eager or compiled, watched or bare, and the ops that take
the most time (on a GPU also the most device time). For the cases the overhead bench shows slow
and no profile explains yet (on a GPU, the compiled watch: docs/compile.md, "Speed").

The model is warmed up first (compiling, the allocator, the hooks' caches) over as many steps as
are profiled, then those steps run under the profiler, each a recorded step of the watch.

    python bench/profile_watch.py [--only mlp] [--device cuda] [--compile] [--mode reduce-overhead]
                                  [--bare] [--histograms] [--steps 5] [--rows 20]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import workbench
from instrument_overhead import dynamics, ilql, mlp, synchronize  # (bench/, beside this script)

WORKLOADS = {"dynamics": (dynamics, 256), "mlp": (mlp, 1024), "ilql": (ilql, 64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(WORKLOADS), default="mlp", help="the workload")
    parser.add_argument("--device", default="cpu", help="where it trains (cpu, cuda ...)")
    parser.add_argument("--batch", type=int, default=0, help="batch size (default: the overhead bench's)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (the ILQL agent in place)")
    parser.add_argument("--mode", default=None, help="torch.compile's mode (e.g. reduce-overhead)")
    parser.add_argument("--bare", action="store_true", help="no watch: the step the ratios divide by")
    parser.add_argument("--histograms", action="store_true", help="watch with histograms (watch's default)")
    parser.add_argument("--steps", type=int, default=5, help="steps profiled (and as many to warm up)")
    parser.add_argument("--rows", type=int, default=20, help="ops listed")
    args = parser.parse_args()
    if args.steps < 1 or args.rows < 1:
        parser.error(f"--steps and --rows must be positive, got {args.steps} and {args.rows}")
    make, batch = WORKLOADS[args.only]
    exp = make(args.batch or batch, args.device)
    if args.compile:
        if args.only == "ilql":
            exp.model.compile(mode=args.mode)
        else:
            exp.model = torch.compile(exp.model, mode=args.mode)
    watch = None if args.bare else workbench.watch(exp.model, histograms=args.histograms)

    def step() -> None:
        exp.step()
        if watch is not None:
            watch.step()

    for _ in range(args.steps):
        step()
    synchronize()
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        synchronize()
    what = f"{args.only}, {args.device}, {'compiled' + (f' ({args.mode})' if args.mode else '') if args.compile else 'eager'}"
    print(f"torch {torch.__version__}: {what}, {'bare' if args.bare else type(watch).__name__}, "
          f"{args.steps} steps")
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if cuda:
        print(table.table(sort_by="self_device_time_total", row_limit=args.rows))
    if watch is not None:
        print(f"watch errors: {watch.errors or 'none'}")
        watch.close()


if __name__ == "__main__":
    main()
