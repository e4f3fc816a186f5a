"""Training-step overhead of ``workbench.watch``, measured side by side in one process.

Variants per workload, interleaved round by round so that drifts of the
machine hit all of them alike; the figure is the median step time over rounds,
as a ratio to the bare step:

- bare: no hooks;
- watch: everything on (activations, output gradients, parameters and their
  gradients) at every step;
- watch+hist: the same with 32-bin histograms of every tensor;
- watch (torch reductions): "watch" with the compiled one-pass statistics
  switched off (torch's kernels, as for tensors on an accelerator), to
  measure what they save;
- watch every=10;
- naive: what a user writes by hand - a forward hook on every module that
  calls ``.item()`` for mean and std, and a tensor hook on its output that
  does the same for the gradient (register_full_backward_hook crashes on the
  dynamics network's in-place residual add).

Workloads: the EfficientZero dynamics network at LightZero's Atari sizes
(64 latent channels + 6 action planes at 6x6, LSTM 512, 601-atom support,
batch 256, 5-step unroll), the activation MLP and the ILQL agent (three
2-layer GPT trunks, n_embd 64, and its heads; batch 64 of the toy task).

    python bench/instrument_overhead.py [--rounds 5] [--steps 3] [--quick] [--only ilql]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import workbench
from workbench.instrument import stats


def dynamics(batch: int):
    return workbench.experiments.create(
        "efficientzero_dynamics", seed=0, batch_size=batch, latent_channels=64, actions=6, spatial=6,
        lstm_hidden_size=512, support_size=601, fc_reward_layers=[32], unroll_steps=5)


def mlp(batch: int):
    return workbench.experiments.create("activation_mlp", seed=0, activation="gelu", depth=3, width=256,
                                        batch_size=batch)


def ilql(batch: int):
    return workbench.experiments.create("ilql", seed=0, batch_size=batch, eval_every=0)


def naive_hooks(model):
    log = []

    def forward_hook(module, args, output):
        if isinstance(output, torch.Tensor):
            log.append((output.mean().item(), output.std().item()))
            if output.requires_grad:
                output.register_hook(lambda g: log.append((g.mean().item(), g.std().item())))

    return [m.register_forward_hook(forward_hook) for m in model.modules()]


def variants(exp):
    """name -> (attach, detach); attach returns the per-step callback."""
    state = {}

    def with_watch(**kw):
        def attach():
            state["w"] = workbench.watch(exp.model, **kw)
            return state["w"].step

        def detach():
            state.pop("w").close()

        return attach, detach

    def torch_path():
        attach, detach = with_watch()

        def attach_torch():
            stats.COMPILED = False
            return attach()

        def detach_torch():
            detach()
            stats.COMPILED = True

        return attach_torch, detach_torch

    def naive_attach():
        state["handles"] = naive_hooks(exp.model)
        return lambda: None

    def naive_detach():
        for h in state.pop("handles"):
            h.remove()

    return {
        "bare": (lambda: (lambda: None), lambda: None),
        "watch": with_watch(),
        "watch (torch reductions)": torch_path(),
        "watch+hist": with_watch(histograms=True),
        "watch every=10": with_watch(every=10),
        "naive .item() hooks": (naive_attach, naive_detach),
    }


def measure(exp, rounds: int, steps: int) -> dict[str, float]:
    options = variants(exp)
    times: dict[str, list[float]] = {k: [] for k in options}
    exp.run(2)  # warm up
    for _ in range(rounds):
        for name, (attach, detach) in options.items():
            end_step = attach()
            exp.step()
            end_step()  # the first step of a variant pays allocator warm-up; not timed
            start = time.perf_counter()
            for _ in range(steps):
                exp.step()
                end_step()
            times[name].append((time.perf_counter() - start) / steps)
            detach()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant per round (dynamics)")
    parser.add_argument("--quick", action="store_true", help="small batches, for a smoke run")
    parser.add_argument("--only", choices=["dynamics", "mlp", "ilql"], nargs="+", help="run just these workloads")
    args = parser.parse_args()
    # every=10 needs 10 steps per round to include its recorded step proportionally
    workloads = [
        ("dynamics", "dynamics network, Atari sizes, batch 256, K=5", lambda: dynamics(32 if args.quick else 256),
         max(args.steps, 10)),
        ("mlp", "activation MLP 3x256 gelu, batch 1024", lambda: mlp(64 if args.quick else 1024), 20),
        ("ilql", "ILQL agent, tiny GPTs, batch 64 of the toy task", lambda: ilql(16 if args.quick else 64), 10),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for key, title, make, steps in workloads:
        if args.only and key not in args.only:
            continue
        result = measure(make(), args.rounds, steps)
        bare = result["bare"]
        print(f"\n{title}: bare step {bare * 1e3:.1f} ms")
        for name, seconds in result.items():
            print(f"  {name:26s} {seconds * 1e3:8.1f} ms   {seconds / bare:5.2f}x")


if __name__ == "__main__":
    main()
