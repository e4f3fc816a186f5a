"""What diagnosing a run costs (workbench.diagnose), measured in one process.

1. The cost of the diagnosis per recorded step: a live ``Diagnoser`` taking in records (a real
   recorded step of the activation MLP and of the dynamics network, replayed with their step
   numbers and jittered values, in blocks of 10 as a page's tick brings them) and drawing its
   findings once per block: their losses falling (a healthy run, no finding), and flat (a
   ``loss_plateau`` from step 50, open and growing every step, its frame's cells set each block);
   and ``diagnose()`` of a stored run's frame (every step at once).
2. The training step of the activation MLP with findings live (a Diagnoser attached to the
   watch, fed on its subscriber's thread every FEED_INTERVAL, and a page thread reading its
   findings every second) against the watch alone, the variants taking turns round by round.
   Goal: <= 1.01x.
3. Per-sample gradient statistics (``gradient_noise``, torch.func) of one batch of the activation
   MLP against the step's own forward and backward.

4. ``--healthy``: not a cost: the findings of healthy runs of every built-in experiment (several
   activations for the MLP), with Adam (their own) and with SGD (momentum 0.9, 10x Adam's learning
   rate; the dynamics network's at 1x, where 10x kills its ReLUs, rightly found), 120 steps each,
   the MLP's with its chance level (log 2): every one should have none. And the margins the
   thresholds keep: the largest zero fraction of a ReLU-like site and saturation index of a
   bounded one after the first 5 steps (``dead_zero_frac`` 0.8, ``saturation_index`` 0.75).

    python bench/diagnose.py [--quick] [--rounds 5] [--healthy]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time

import numpy as np

import workbench
from workbench.diagnose import Diagnoser, diagnose
from workbench.ui.views import FEED_INTERVAL

WORKLOADS = {
    "activation_mlp": dict(activation="relu", depth=3, width=64),
    "efficientzero_dynamics": dict(),
}


def recorded(name: str, steps: int, falling: bool = True) -> tuple[list, object]:
    """``steps`` records replayed from one real recorded step of the experiment (its 5th: a first
    step's zero-initialized layers output zeros), their losses falling or flat, and that record."""
    exp = workbench.experiments.create(name, seed=0, **WORKLOADS[name])
    with exp.watch() as w:
        for _ in range(5):
            exp.step()
    record = w.recorder.records()[-1]
    rng = np.random.default_rng(0)
    out = []
    for n in range(1, steps + 1):
        jitter = 1 + 0.01 * rng.standard_normal(record.sums.shape)
        learning = 0.2 + 0.8 * np.exp(-n / 300) if falling else 1.0  # (falling as a healthy run's does)
        out.append(dataclasses.replace(record, step=n, sums=record.sums * jitter,
                                       metrics={k: v * (1 + 0.01 * rng.standard_normal()) * (learning if "loss" in k
                                                                                               else 1.0)
                                                for k, v in record.metrics.items()}))
    return out, record


def diagnosis_cost(name: str, steps: int) -> tuple[int, float, float, float]:
    """(rows per step, seconds per step live: the loss falling, the loss flat (a finding open), seconds
    per step of diagnose() over the frame)."""
    from workbench.instrument.recorder import metrics_frame, rows_frame

    records, record = recorded(name, steps)
    flat, _ = recorded(name, steps, falling=False)
    rows, metrics = rows_frame(records), metrics_frame(records)
    per_live = {"falling": float("inf"), "flat": float("inf")}
    per_frame = float("inf")
    for _ in range(3):  # (the best of 3: the first warms the code paths up)
        for loss, replay in (("falling", records), ("flat", flat)):
            live = Diagnoser()
            start = time.perf_counter()
            for i in range(0, steps, 10):
                live.feed(replay[i:i + 10])
                live.findings()
            per_live[loss] = min(per_live[loss], (time.perf_counter() - start) / steps)
        start = time.perf_counter()
        diagnose(rows, metrics)
        per_frame = min(per_frame, (time.perf_counter() - start) / steps)
    return len(record), per_live["falling"], per_live["flat"], per_frame


def live_ratio(rounds: int, steps: int) -> float:
    """Median step time with findings live over the watch alone's."""
    exp = workbench.experiments.create("activation_mlp", seed=0, **WORKLOADS["activation_mlp"])
    exp.run(20)
    times: dict[str, list[float]] = {"watch": [], "findings": []}
    for round_ in range(rounds):
        for variant in (list(times) if round_ % 2 == 0 else list(times)[::-1]):  # (each goes first in turn)
            w = exp.watch()
            stop = threading.Event()
            page = None
            if variant == "findings":
                diagnoser = Diagnoser()
                diagnoser.attach(w, interval=FEED_INTERVAL)

                def tick():
                    while not stop.wait(1.0):
                        diagnoser.findings()

                page = threading.Thread(target=tick, daemon=True)
                page.start()
            exp.step()  # warm-up step of the variant
            start = time.perf_counter()
            for _ in range(steps):
                exp.step()
            times[variant].append((time.perf_counter() - start) / steps)
            stop.set()
            if page is not None:
                page.join()
            w.close()
    return statistics.median(times["findings"]) / statistics.median(times["watch"])


def noise_cost(repeats: int) -> tuple[float, float]:
    """(seconds of gradient_noise on a batch, seconds of a forward and backward of the same batch)."""
    import torch.nn.functional as F

    from workbench.diagnose import gradient_noise

    exp = workbench.experiments.create("activation_mlp", seed=0, **WORKLOADS["activation_mlp"])
    model, batch = exp.model, exp.config.batch_size
    x, y = exp.x[:batch], exp.y[:batch]

    def loss_fn(forward, xb, yb):
        return F.cross_entropy(forward(xb), yb)

    def backward():
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()

    def best(fn):
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    return best(lambda: gradient_noise(model, loss_fn, x, y)), best(backward)


HEALTHY = [
    ("activation_mlp", dict(activation=a, **extra)) for a, extra in (
        ("gelu", {}), ("relu", dict(depth=4)), ("relu", dict(dataset="moons")), ("sigmoid", {}),
        ("tanh", dict(depth=3)), ("prelu", {}), ("threshold", {}))
] + [("efficientzero_dynamics", {}), ("ilql", dict(n_layer=1, n_embd=32, eval_prompts=8)), ("query_stream", {})]


def healthy(steps: int) -> None:
    """Print the findings of each healthy run (Adam, SGD) and the largest ReLU-like zero fraction and
    saturation index any of them read."""
    import math

    import torch

    most = {"zero_frac": 0.0, "saturation": 0.0}
    for name, config in HEALTHY:
        for optimizer in ("adam", "sgd"):
            exp = workbench.experiments.create(name, seed=0, **config)
            owner = exp.model if name == "ilql" else exp  # (ILQL's agent holds its optimizer)
            if optimizer == "sgd":
                if getattr(owner, "optimizer", None) is None:
                    continue  # (query_stream trains nothing)
                lr = owner.optimizer.param_groups[0]["lr"] * (1 if name == "efficientzero_dynamics" else 10)
                params = [p for group in owner.optimizer.param_groups for p in group["params"]]
                owner.optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
            with exp.watch() as w:
                for _ in range(steps):
                    exp.step()
            rows = w.to_pandas()
            found = w.diagnose(chance=math.log(2) if name == "activation_mlp" else ())
            later = rows[(rows.kind == "activation") & (rows.step > 5)]
            relu = later[later["min"] >= 0]
            bounded = later[(later["min"] >= -1) & (later["max"] <= 1) & (later.zero_frac < 0.5) &
                            (later["max"] > later["min"])]
            tanh = bounded["min"] < 0
            mu = (bounded["mean"] + tanh) / (1 + tanh)
            index = (bounded["std"] / (1 + tanh)) ** 2 / (mu * (1 - mu))
            most["zero_frac"] = max(most["zero_frac"], float(relu.zero_frac.max()) if len(relu) else 0.0)
            most["saturation"] = max(most["saturation"], float(index.max()) if len(index) else 0.0)
            print(f"  {name:22s} {config!s:36s} {optimizer:4s}: {len(found)} findings "
                  f"{found[['site', 'finding']].values.tolist()}")
    print(f"  largest ReLU-like zero fraction {most['zero_frac']:.3f} (dead_zero_frac 0.8), saturation index "
          f"{most['saturation']:.3f} (saturation_index 0.75)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 steps; one short round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--healthy", action="store_true", help="the findings of healthy runs (none expected)")
    args = parser.parse_args()
    if args.healthy:
        print("findings of healthy runs (120 steps; none expected):")
        healthy(120)
        return
    steps = 100 if args.quick else 2_000
    print(f"diagnosis per recorded step ({steps} steps):")
    for name in WORKLOADS:
        rows, live, open_, frame = diagnosis_cost(name, steps)
        print(f"  {name:24s} {rows:>5d} rows/step: live {live * 1e6:8.1f} us/step, "
              f"diagnose() of the frame {frame * 1e6:8.1f} us/step; live with a finding open "
              f"{open_ * 1e6:8.1f} us/step")
    rounds, n = (1, 50) if args.quick else (args.rounds, 300)
    print(f"activation_mlp training step over the watch alone's ({rounds} rounds of {n} steps):")
    print(f"  watch + findings live: {live_ratio(rounds, n):.3f}x")
    noise, step = noise_cost(3 if args.quick else 20)
    print(f"per-sample gradient statistics of a batch (activation_mlp, {WORKLOADS['activation_mlp']}): "
          f"{noise * 1e3:.2f} ms, {noise / step:.1f}x its forward and backward ({step * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
