"""Where a watched training step's time goes: ``torch.profiler`` over a few steps of one of
``instrument_overhead.py``'s workloads, eager or compiled, watched or bare, and the ops that take
the most time (on a GPU also the most device time). For the cases the overhead bench shows slow
and no profile explains yet (on a GPU, the compiled watch: docs/compile.md, "Speed").

The model is warmed up first (compiling, the allocator, the hooks' caches) over as many steps as
are profiled, then those steps run under the profiler, each a recorded step of the watch.

With ``--phases``, no profiler: the step's wall time by phase - the model's calls (its forwards),
the backward passes, the optimizer step, the rest of the experiment's step, and ``w.step()`` - for
the watched step beside the bare one (the same model, the watch paused: blocks of ten steps in
turn, medians over ``--steps`` blocks), and what the watch adds to each phase.

    python bench/profile_watch.py [--only mlp] [--device cuda] [--compile] [--mode reduce-overhead]
                                  [--bare] [--histograms] [--steps 5] [--rows 20] [--phases]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

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
    parser.add_argument("--phases", action="store_true", help="time the step's phases, watched and bare")
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
    if args.phases:
        if watch is None:
            parser.error("--phases times the watched step beside the bare one: leave out --bare")
        if args.compile and args.only == "ilql":  # (compiled in place: its own hooks are traced, and break its graph)
            parser.error("--phases times the model's forward with hooks on it, which the ILQL agent compiled in place "
                         "traces (time.perf_counter breaks its graph): leave out --compile, or use --only mlp/dynamics")
        time_phases(exp, watch, args.steps)
        return

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


PHASES = ("forward", "backward", "optimizer", "rest of the step", "w.step()")


def time_phases(exp, watch, blocks: int, steps: int = 10) -> None:
    """Print the median time a step spends in each of :data:`PHASES`, recorded and bare (the watch
    paused), in blocks of ``steps`` taken in turn, ``blocks`` of each after one of each to warm up."""
    spent: dict[str, float] = collections.defaultdict(float)  # phase -> seconds in the current step
    started: dict[str, float] = {}

    def timer(phase: str):  # (synchronized on a GPU: the device's work in the phase that launched it)
        def begin(*_) -> None:
            synchronize()
            started[phase] = time.perf_counter()

        def end(*_) -> None:
            synchronize()
            spent[phase] += time.perf_counter() - started[phase]

        return begin, end

    begin, end = timer("forward")
    handles = [exp.model.register_forward_pre_hook(begin), exp.model.register_forward_hook(end)]
    begin, end = timer("optimizer")
    handles += [exp.optimizer.register_step_pre_hook(begin), exp.optimizer.register_step_post_hook(end)]
    backward = torch.autograd.backward

    def timed_backward(*args, **kwargs):
        synchronize()
        start = time.perf_counter()
        try:
            return backward(*args, **kwargs)
        finally:
            synchronize()
            spent["backward"] += time.perf_counter() - start

    torch.autograd.backward = timed_backward  # (Tensor.backward calls it)
    medians: dict[str, dict[str, list[float]]] = {"bare": collections.defaultdict(list),
                                                   "watched": collections.defaultdict(list)}
    try:
        for block in range(blocks + 1):
            for variant in ("bare", "watched"):
                per_step = collections.defaultdict(list)
                for _ in range(steps):
                    spent.clear()
                    synchronize()
                    start = time.perf_counter()
                    if variant == "bare":
                        with watch.paused():
                            exp.step()
                    else:
                        exp.step()
                    synchronize()
                    middle = time.perf_counter()
                    if variant == "watched":
                        watch.step()
                    synchronize()
                    spent["w.step()"] = time.perf_counter() - middle
                    spent["rest of the step"] = middle - start - sum(spent[p] for p in PHASES[:3])
                    for phase in PHASES:
                        per_step[phase].append(spent[phase])
                if block:  # (the first block of each warms up)
                    for phase in PHASES:
                        medians[variant][phase].append(statistics.median(per_step[phase]))
    finally:
        torch.autograd.backward = backward
        for handle in handles:
            handle.remove()
    print(f"{'phase':<18}{'bare':>10}{'watched':>10}{'added':>10}   (ms a step, medians of {blocks} blocks)")
    totals = [0.0, 0.0]
    for phase in PHASES:
        bare, watched = (statistics.median(medians[v][phase]) * 1e3 for v in ("bare", "watched"))
        totals = [totals[0] + bare, totals[1] + watched]
        print(f"{phase:<18}{bare:>10.3f}{watched:>10.3f}{watched - bare:>+10.3f}")
    print(f"{'sum':<18}{totals[0]:>10.3f}{totals[1]:>10.3f}{totals[1] - totals[0]:>+10.3f}"
          f"   ratio {totals[1] / totals[0]:.2f}x")
    if watch.errors:
        print(f"watch errors: {watch.errors}")
    watch.close()


if __name__ == "__main__":
    main()
