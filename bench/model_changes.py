"""What the watch pays to notice a model that changes under it, on a deep model, in one process.

A watch compares the model with what it hooked at each recorded step (the ids of every module's
parameters and children, and each parameter's ``requires_grad``), so that a checkpoint loaded with
``assign=True``, a swapped submodule or a parameter unfrozen mid-run is recorded as it is now
(docs/watch.md, "A model that changes"). This measures, on a stack of ``--blocks`` blocks of
Linear, LayerNorm, GELU and Dropout in a Sequential (5 modules a block;
300 blocks are 1,501 modules):

- bare: a training step without a watch;
- watch: the same step watched (``histograms=False``), every step recorded;
- the comparison: the two looks a recorded step takes (``requires_grad`` of every parameter at the
  step's first module call, the ids at its end), timed alone, as a share of the watched step;
- re-attach: the step after a module was swapped (the tree indexed again, new hooks), once.

Steps are timed in blocks that take turns (bare, watch) and the ratio is the median over rounds.

    python bench/model_changes.py [--blocks 300] [--rounds 10] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
import warnings

import torch
from torch import nn

import workbench


def deep_model(blocks: int, width: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(0.0))
                           for _ in range(blocks)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=300, help="blocks of 5 modules")
    parser.add_argument("--width", type=int, default=32, help="features of each Linear")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of one block a variant")
    parser.add_argument("--block", type=int, default=5, help="steps in a block")
    parser.add_argument("--quick", action="store_true", help="20 blocks, 2 rounds: checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.rounds = 20, 2
    if min(args.blocks, args.width, args.batch, args.rounds, args.block) < 1:
        parser.error("--blocks, --width, --batch, --rounds and --block must be positive")
    torch.manual_seed(0)
    model = deep_model(args.blocks, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)

    def train_step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    w = workbench.watch(model, histograms=False)

    def block(watched: bool) -> float:
        start = time.perf_counter()
        for _ in range(args.block):
            train_step()
            if watched:
                w.step()
        return (time.perf_counter() - start) / args.block

    block(True)
    with w.paused():
        block(False)  # (warm-up, both ways)
    bare, watched = [], []
    for _ in range(args.rounds):
        with w.paused():
            bare.append(block(False))
        watched.append(block(True))
    sites = w._hooks.sites  # (the comparison alone, as the recorded step makes it)
    looks = 50
    compare = min(timeit.repeat(lambda: (sites.requires_grad(), sites.structure()), number=looks, repeat=5)) / looks
    model[len(model) // 2][0] = nn.Linear(args.width, args.width)  # a swapped module: the next step re-attaches
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        start = time.perf_counter()
        train_step()
        w.step()
        reattached = time.perf_counter() - start
    assert any("replaced" in str(warning.message) for warning in said), "the swap went unnoticed"
    w.close()
    modules = sum(1 for _ in model.modules())
    bare_ms, watched_ms = statistics.median(bare) * 1e3, statistics.median(watched) * 1e3
    ratio = statistics.median(b / a for a, b in zip(bare, watched))
    print(f"{modules} modules, {sum(1 for _ in model.parameters())} parameters, batch {args.batch}, "
          f"{args.rounds} rounds of {args.block} steps")
    print(f"  bare step              {bare_ms:8.2f} ms")
    print(f"  watch step             {watched_ms:8.2f} ms   {ratio:.2f}x bare")
    print(f"  the comparison         {compare * 1e3:8.3f} ms   {compare * 1e3 / watched_ms:.2%} of the watched step")
    print(f"  step after a swap      {reattached * 1e3:8.2f} ms   (re-attached once, with the warning)")


if __name__ == "__main__":
    main()
