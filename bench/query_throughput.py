"""Rows per second of QueryModule: ours next to torchrl's, in one process.

Two in_keys per row (an observation vector and an action), as an MCTS node
lookup has; keys drawn Zipf-like from a fixed key space, so batches mix
known and new rows. Each library gets the same stream; the indices are
checked equal before timing.

    python bench/query_throughput.py [--rows 10000 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench.experiments.query_stream import KeyStream
from workbench.models.query import QueryModule


def _batches(stream: KeyStream, rows: int, count: int) -> list[dict[str, torch.Tensor]]:
    return [stream.sample(rows)[0] for _ in range(count)]


def _time(module_factory, batches, to_input) -> tuple[float, torch.Tensor]:
    module = module_factory()
    inputs = [to_input(b) for b in batches]
    start = time.perf_counter()
    last = None
    for data in inputs:
        last = module(data)["_index"]
    elapsed = time.perf_counter() - start
    return sum(len(b["action"]) for b in batches) / elapsed, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--batches", type=int, default=20, help="batches per timed stream")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        from tensordict import TensorDict
        from torchrl.data import QueryModule as TorchRLQueryModule
    except ImportError as err:
        raise SystemExit(f"This benchmark compares with torchrl: pip install torchrl ({err}).")

    def as_td(batch):
        return TensorDict(dict(batch), batch_size=[len(batch["action"])])

    print(f"{'rows/batch':>10} {'ours rows/s':>14} {'torchrl rows/s':>15} {'ratio':>7}")
    for rows in args.rows:
        stream = KeyStream(key_space=max(10 * rows, 100_000), zipf_exponent=1.1, observation_dim=4, actions=8,
                           generator=torch.Generator().manual_seed(0))
        batches = _batches(stream, rows, args.batches)
        ours, theirs = [], []
        for make in (QueryModule, TorchRLQueryModule):  # warm-up: numba loads its compiled code on first use
            make(["observation", "action"])(as_td(batches[0]))
        for _ in range(args.repeats):  # interleaved, so drift hits both alike
            rate, ours_index = _time(lambda: QueryModule(["observation", "action"]), batches, as_td)
            ours.append(rate)
            rate, their_index = _time(lambda: TorchRLQueryModule(["observation", "action"]), batches, as_td)
            theirs.append(rate)
            assert torch.equal(ours_index, their_index), "indices differ from torchrl's"
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{rows:>10} {a:>14,.0f} {b:>15,.0f} {a / b:>6.1f}x")


if __name__ == "__main__":
    main()
