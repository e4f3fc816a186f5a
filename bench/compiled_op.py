"""What one call of the compiled watch's CPU row op costs, by how the op is registered; and, with
``--step``, what those calls and the reading of each tensor add up to in a workload's recorded step.

A compiled model's graph calls ``workbench::cpu_row`` once per recorded tensor (the ILQL agent:
a few hundred a step, most of them small). For float32 tensors of each size, the median time of
one call of:

- kernel: the op's Python kernel called directly (the reading, and the row it makes);
- library op: ``torch.ops.workbench.cpu_row``, registered with ``torch.library.Library``'s
  ``define``/``impl``, as the watch registers it;
- custom_op: the same kernel behind ``torch.library.custom_op`` (as it was registered before),
  whose autograd and aliasing checks run around each call.

The differences to the kernel are each registration's cost per call.

``--step mlp|dynamics|ilql``: one of ``instrument_overhead.py``'s workloads, compiled and watched
(``histograms=False``): the op calls of its recorded step (one per activation and output-gradient
row), what they cost beyond reading their values (the library op's time less the bare one-pass
kernel's, on 256 values, per call) and the bare kernel's reading of as many values in tensors of
the rows' sizes, out of cache - the floor of any watch that reads each of them once - each against
the compiled step with the watch paused, timed in the same process.

    python bench/compiled_op.py [--quick] [--repeats 2000] [--step mlp] [--batch 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from histogram_kernels import median_us  # (bench/, beside this script)
from workbench.instrument.compiled_graph import _cpu_row, cpu_row, row_width
from workbench.instrument.reduce_cpu import callbacks

SIZES = (256, 4096, 65536, 262144)


@torch.library.custom_op("workbench_bench::cpu_row", mutates_args=())
def custom_op_row(x: torch.Tensor, bins: int) -> torch.Tensor:
    return _cpu_row(x, bins)


@custom_op_row.register_fake
def _(x: torch.Tensor, bins: int) -> torch.Tensor:
    return x.new_empty(row_width(bins), dtype=torch.float64)


def step_costs(workload: str, batch: int, steps: int) -> None:
    """``--step``: the op calls of a recorded step and the reading of their values, against the step."""
    import workbench
    from instrument_overhead import dynamics, ilql, mlp  # (bench/, beside this script)

    make, default_batch = {"dynamics": (dynamics, 256), "mlp": (mlp, 1024), "ilql": (ilql, 64)}[workload]
    exp = make(batch or default_batch, "cpu")
    if workload == "ilql":
        exp.model.compile()
    else:
        exp.model = torch.compile(exp.model)
    w = workbench.watch_compiled(exp.model, histograms=False)
    for _ in range(2):  # compiling both variants
        exp.step()
        w.step()
        with w.paused():
            exp.step()
    rows = w.to_pandas()
    made = rows[rows.kind.isin(["activation", "grad_output"]) & (rows.step == rows.step.max())]
    sizes = made.numel.astype(int).tolist()
    bare = []
    with w.paused():
        for _ in range(steps):
            start = time.perf_counter()
            exp.step()
            bare.append(time.perf_counter() - start)
    w.close()
    step_ms = statistics.median(bare) * 1e3
    fast = callbacks(torch.float32)[0]
    out = np.zeros(9)
    small = torch.randn(256)
    per_call_us = (median_us(lambda: cpu_row(small, 0), 2000)
                   - median_us(lambda: fast(small.data_ptr(), 256, out.ctypes.data), 2000))
    tensors = [torch.randn(n) for n in sizes]
    flush = torch.empty(64 << 20, dtype=torch.uint8)  # (a pass over 64 MB between rounds: out of cache)
    reads = []
    for _ in range(5):
        flush.fill_(1)
        start = time.perf_counter()
        for x in tensors:
            fast(x.data_ptr(), x.numel(), out.ctypes.data)
        reads.append(time.perf_counter() - start)
    read_ms = statistics.median(reads) * 1e3
    calls_ms = len(sizes) * per_call_us / 1e3
    print(f"{workload}, batch {batch or default_batch}: compiled step (watch paused) {step_ms:.1f} ms, "
          f"median of {steps}")
    print(f"  op calls a recorded step: {len(sizes)} ({sum(sizes) / 1e6:.1f}M values)")
    print(f"  beyond the reading: {per_call_us:.1f} us a call, {calls_ms:.2f} ms a step "
          f"({calls_ms / step_ms:.1%} of the step)")
    print(f"  the kernel's reading of the values (floor): {read_ms:.2f} ms ({read_ms / step_ms:.1%} of the step)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one size, few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=0, help="calls per timing (default: 2000, quick 20)")
    parser.add_argument("--step", choices=["mlp", "dynamics", "ilql"], help="a workload's recorded step instead")
    parser.add_argument("--batch", type=int, default=0, help="with --step: its batch (default: the overhead bench's)")
    parser.add_argument("--steps", type=int, default=10, help="with --step: bare steps timed")
    args = parser.parse_args()
    if args.step:
        step_costs(args.step, args.batch, args.steps)
        return
    sizes = SIZES[:1] if args.quick else SIZES
    repeats = args.repeats or (20 if args.quick else 2000)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32, median of 5 x {repeats} calls")
    print(f"{'values':>8} {'bins':>5}  {'kernel':>9}  {'library op':>10}  {'custom_op':>9}")
    for n in sizes:
        x = torch.randn(n)
        for bins in (0, 32):
            times = [median_us(lambda f=f: f(x, bins), repeats) for f in (_cpu_row, cpu_row, custom_op_row)]
            print(f"{n:8d} {bins:5d}  {times[0]:6.1f} us  {times[1]:7.1f} us  {times[2]:6.1f} us")


if __name__ == "__main__":
    main()
