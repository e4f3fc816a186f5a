"""What one call of the compiled watch's CPU row op costs, by how the op is registered.

A compiled model's graph calls ``workbench::cpu_row`` once per recorded tensor (the ILQL agent:
a few hundred a step, most of them small). For float32 tensors of each size, the median time of
one call of:

- kernel: the op's Python kernel called directly (the reading, and the row it makes);
- library op: ``torch.ops.workbench.cpu_row``, registered with ``torch.library.Library``'s
  ``define``/``impl``, as the watch registers it;
- custom_op: the same kernel behind ``torch.library.custom_op`` (as it was registered before),
  whose autograd and aliasing checks run around each call.

The differences to the kernel are each registration's cost per call.

    python bench/compiled_op.py [--quick] [--repeats 2000]
"""

from __future__ import annotations

import argparse

import torch

from histogram_kernels import median_us  # (bench/, beside this script)
from workbench.instrument.compiled_graph import _cpu_row, cpu_row, row_width

SIZES = (256, 4096, 65536, 262144)


@torch.library.custom_op("workbench_bench::cpu_row", mutates_args=())
def custom_op_row(x: torch.Tensor, bins: int) -> torch.Tensor:
    return _cpu_row(x, bins)


@custom_op_row.register_fake
def _(x: torch.Tensor, bins: int) -> torch.Tensor:
    return x.new_empty(row_width(bins), dtype=torch.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one size, few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=0, help="calls per timing (default: 2000, quick 20)")
    args = parser.parse_args()
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
