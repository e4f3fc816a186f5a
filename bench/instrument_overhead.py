"""Training-step overhead of ``workbench.watch``, measured side by side in one process.

The variants take turns training one copy of the workload, a block of 10
steps each per round in a shuffled order, each with its instrumentation in
and the others' out, so that every variant is timed in its steady state on
the same model, data and memory (separate copies of the model differ by up to
~1% in step time on this machine, from where their tensors lie). The figure
is the median over rounds of a variant's block time as a ratio to the bare
block of the same round: the machine's drifts (large on a shared VM) hit both
sides of each ratio alike. The quartiles show the spread.

- bare: no hooks;
- watch: the statistics of everything (activations, output gradients,
  parameters and their gradients) at every step, ``histograms=False``;
- watch+hist: the same with 32-bin histograms of every tensor (``watch``'s
  default);
- watch (torch reductions): "watch" with the compiled one-pass statistics
  (on a GPU: the Triton kernels) switched off, torch's kernels reducing
  every tensor instead, to measure what they save;
- watch every=10 (blocks of 10 steps hold one recorded step);
- floor: less than any hooks that record everything can do, as a reference
  for what is left to save - torch's hook calls (a global forward hook, a
  gradient pre-hook on the node of each output, a post-accumulate hook on each
  parameter) around one read of each tensor output (a tensor that several
  calls return, once), output gradient, parameter and parameter gradient by
  the compiled one-pass kernel, its sums thrown away; no names, no rows, no
  structured outputs. On the CPU only: on a GPU a read takes at least a
  kernel launch, and the floor is the next variant;
- torch's hooks alone: the floor's hooks reading nothing - what any
  recorder built on torch's hooks pays before it looks at a single value;
- naive: what a user writes by hand - a forward hook on every module that
  calls ``.item()`` for mean and std, and a tensor hook on its output that
  does the same for the gradient (register_full_backward_hook crashes on the
  dynamics network's in-place residual add).

Workloads: the EfficientZero dynamics network at LightZero's Atari sizes
(64 latent channels + 6 action planes at 6x6, LSTM 512, 601-atom support,
batch 256, 5-step unroll), the activation MLP and the ILQL agent (three
2-layer GPT trunks, n_embd 64, and its heads; batch 64 of the toy task).

With ``--device cuda`` the workloads train on the GPU (the data is drawn on
the CPU and moved, as the experiments do) and every block is timed between
two ``torch.cuda.synchronize()``.

With ``--breakdown``, also "watch" recording one kind alone (activations,
output gradients, parameters, parameter gradients), and each variant's added
time per step: where the cost of recording everything lies.

With ``--compile``, instead: each workload trained eagerly and ``torch.compile``'d side by side,
bare and watched (``workbench.watch`` / ``watch_compiled``, which computes the statistics inside
the compiled graphs); ratios within each pair, of the statistics alone (``histograms=False`` on
both sides; with ``--histograms``, 32-bin histograms on both, ``watch``'s default). On CUDA, also
``mode="reduce-overhead"``.

    python bench/instrument_overhead.py [--rounds 30] [--quick] [--only ilql] [--device cuda] [--breakdown]
                                        [--compile [--histograms]]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
import weakref

import torch

import workbench
from workbench.instrument._stats_kernels import compile_kernels
from workbench.instrument.reduce_torch import TorchReducer


def dynamics(batch: int, device: str):
    return workbench.experiments.create(
        "efficientzero_dynamics", seed=0, device=device, batch_size=batch, latent_channels=64, actions=6,
        spatial=6, lstm_hidden_size=512, support_size=601, fc_reward_layers=[32], unroll_steps=5)


def mlp(batch: int, device: str):
    return workbench.experiments.create("activation_mlp", seed=0, device=device, activation="gelu", depth=3,
                                        width=256, batch_size=batch)


def ilql(batch: int, device: str):
    return workbench.experiments.create("ilql", seed=0, device=device, batch_size=batch, eval_every=0)


def synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def naive_hooks(model):
    log = []

    def forward_hook(module, args, output):
        if isinstance(output, torch.Tensor):
            log.append((output.mean().item(), output.std().item()))
            if output.requires_grad:
                output.register_hook(lambda g: log.append((g.mean().item(), g.std().item())))

    return [m.register_forward_hook(forward_hook) for m in model.modules()]


def floor_hooks(model, reads: bool = True):
    """The floor variant's hooks (module doc), or with ``reads=False`` those of "torch's hooks
    alone"; returns their handles and a function for the end of a step, that reads the
    parameters once."""
    fast = compile_kernels("float32")[0]  # (numba's disk cache: built once)
    scratch = torch.empty(9, dtype=torch.float64)  # the sums land here and are never read

    def read(x, out=scratch.data_ptr(), keep=scratch):  # (keep: scratch lives as long as the hooks)
        if reads and x.is_cpu and x.dtype is torch.float32 and x.is_contiguous() and x.numel():
            fast(x.data_ptr(), x.numel(), out)

    def node_hook(grads):
        for grad in grads:
            if grad is not None:
                read(grad)

    # a container's output is often its last child's, the same tensor: read (and its gradient
    # hooked) once, as watch does, so that the floor stays below what a recorder must do.
    # id -> (weakref, version) of the outputs read in this step: the tensor itself, unchanged
    seen: dict[int, tuple[weakref.ref, int]] = {}

    def forward_hook(module, args, output):
        if isinstance(output, torch.Tensor):
            ref, version = seen.get(id(output), (None, None))
            if ref is not None and ref() is output and version == output._version:
                return
            seen[id(output)] = (weakref.ref(output), output._version)
            read(output.detach())
            if output.grad_fn is not None:
                output.grad_fn.register_prehook(node_hook)

    def end_of_step():
        for param in params:
            read(param.detach())
        seen.clear()

    params = list(model.parameters())
    handles = [torch.nn.modules.module.register_module_forward_hook(forward_hook)]
    handles += [p.register_post_accumulate_grad_hook(lambda p: read(p.grad)) for p in params if p.requires_grad]
    return handles, end_of_step


class Variant:
    """How the workload is instrumented; ``step()`` is a timed training step."""

    def __init__(self, exp, watch_options=None, naive=False, torch_reductions=False, floor=False,
                 floor_reads=True):
        self.exp, self.naive = exp, naive
        self.floor, self.floor_reads = floor, floor_reads
        if torch_reductions:
            watch_options = dict(watch_options, reducers=[TorchReducer()])
        self.watch = workbench.watch(exp.model, **watch_options) if watch_options is not None else None
        self.end_of_step = None

    def step(self) -> None:
        self.exp.step()
        if self.watch is not None:
            self.watch.step()
        if self.end_of_step is not None:
            self.end_of_step()

    def timed_block(self, steps: int) -> float:
        handles = naive_hooks(self.exp.model) if self.naive else []  # (in for this block only)
        if self.floor:
            handles, self.end_of_step = floor_hooks(self.exp.model, self.floor_reads)
        try:
            synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                self.step()
            synchronize()
            return (time.perf_counter() - start) / steps
        finally:
            for handle in handles:
                handle.remove()
            self.end_of_step = None


VARIANTS = {
    "bare": {},
    "watch": {"watch_options": {"histograms": False}},
    "watch (torch reductions)": {"watch_options": {"histograms": False}, "torch_reductions": True},
    "watch+hist": {"watch_options": {}},  # (watch's default)
    "watch every=10": {"watch_options": {"every": 10, "histograms": False}},
    "naive .item() hooks": {"naive": True},
    "floor (hooks, one read)": {"floor": True},
    "torch's hooks alone": {"floor": True, "floor_reads": False},
}

#: With --breakdown: watch recording one kind at a time, to see where the cost of "watch" lies
BREAKDOWN = {
    f"watch, {label} only": {"watch_options": {"histograms": False} | {
        switch: switch == on for switch in ("activations", "gradients", "parameters", "parameter_grads")}}
    for label, on in [("activations", "activations"), ("output grads", "gradients"), ("params", "parameters"),
                      ("param grads", "parameter_grads")]
}


def run_block(variants: dict[str, Variant], name: str, block: int) -> float:
    """``variants[name]``'s block, the other variants' watches paused (and out of torch's hooks)."""
    with contextlib.ExitStack() as others:
        for other, variant in variants.items():
            if other != name and variant.watch is not None:
                others.enter_context(variant.watch.paused())
        return variants[name].timed_block(block)


def measure(make, rounds: int, block: int, variants: dict[str, dict] = VARIANTS
            ) -> dict[str, tuple[float, float, float, float]]:
    """Per variant: the median step time and the median, lower and upper quartile over rounds of
    its block's time as a ratio to the bare block of the same round."""
    exp = make()
    instrumented = {}
    for name, options in variants.items():
        instrumented[name] = Variant(exp, **options)
        run_block(instrumented, name, block)  # warm-up: allocator, compiled kernels, hook caches
    order = list(instrumented)
    shuffle = random.Random(0).shuffle
    times: dict[str, list[float]] = {name: [] for name in instrumented}
    ratios: dict[str, list[float]] = {name: [] for name in instrumented}
    for _ in range(rounds):
        shuffle(order)  # no variant always runs right after another
        this_round = {name: run_block(instrumented, name, block) for name in order}
        for name, seconds in this_round.items():
            times[name].append(seconds)
            ratios[name].append(seconds / this_round["bare"])
    result = {}
    for name in instrumented:
        low, median, high = statistics.quantiles(ratios[name], n=4) if rounds > 1 else [ratios[name][0]] * 3
        result[name] = (statistics.median(times[name]), median, low, high)
    return result


def measure_compiled(make, rounds: int, block: int, in_place: bool = False, mode: str | None = None,
                     histograms: bool = False) -> dict[str, tuple[float, float, float, float]]:
    """``--compile``: eager+watch / eager-bare beside compiled+watch / compiled-bare, each ratio taken
    within its own pair (blocks shuffled as in :func:`measure`). The compiled model is compiled
    once (``torch.compile``, or ``model.compile()`` with ``in_place``, the way the ILQL agent calls
    itself); "compiled bare" runs it with the watch paused: the unrecorded variant of its graphs
    that ``every=N`` runs between recorded steps, in which nothing of the watch's is traced."""
    from workbench.instrument.compiled import watch_compiled

    eager, compiled = make(), make()
    if in_place:
        compiled.model.compile(mode=mode)
    else:
        compiled.model = torch.compile(compiled.model, mode=mode)
    pairs = {"eager bare": (eager, None), "eager+watch": (eager, workbench.watch(eager.model, histograms=histograms)),
             "compiled bare": (compiled, None),
             "compiled+watch": (compiled, watch_compiled(compiled.model, histograms=histograms))}
    watches = [w for _, w in pairs.values() if w is not None]

    def run(name: str) -> float:
        exp, own = pairs[name]
        with contextlib.ExitStack() as others:
            for w in watches:
                if w is not own:
                    others.enter_context(w.paused())
            synchronize()
            start = time.perf_counter()
            for _ in range(block):
                exp.step()
                if own is not None:
                    own.step()
            synchronize()
            return (time.perf_counter() - start) / block

    for name in pairs:  # warm-up: compiling both variants, allocator, hook caches
        run(name)
        run(name)
    order = list(pairs)
    shuffle = random.Random(0).shuffle
    times: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            times[name].append(run(name))
    result = {}
    for name, base in [("eager bare", "eager bare"), ("eager+watch", "eager bare"),
                       ("compiled bare", "compiled bare"), ("compiled+watch", "compiled bare")]:
        ratios = [t / b for t, b in zip(times[name], times[base])]
        low, median, high = statistics.quantiles(ratios, n=4) if rounds > 1 else [ratios[0]] * 3
        result[name] = (statistics.median(times[name]), median, low, high)
    for w in watches:
        w.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=0, help="rounds per workload (default: 10, 40, 40)")
    parser.add_argument("--quick", action="store_true", help="small batches, for a smoke run")
    parser.add_argument("--only", choices=["dynamics", "mlp", "ilql"], nargs="+", help="run just these workloads")
    parser.add_argument("--device", default="cpu", help="where the workloads train (cpu, cuda ...)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time watch recording each kind alone (activations, output gradients ...)")
    parser.add_argument("--compile", action="store_true",
                        help="eager+watch / eager-bare beside compiled+watch / compiled-bare (torch.compile, "
                             "watch_compiled); on CUDA also with mode='reduce-overhead' (CUDA graphs)")
    parser.add_argument("--histograms", action="store_true",
                        help="with --compile: both watches with 32-bin histograms (watch's default), not the "
                             "statistics alone")
    args = parser.parse_args()
    device = args.device
    # blocks of 10 steps: every=10 records one step in each
    batches = {"dynamics": 32, "mlp": 64, "ilql": 16} if args.quick else {"dynamics": 256, "mlp": 1024, "ilql": 64}
    workloads = [
        ("dynamics", f"dynamics network, Atari sizes, batch {batches['dynamics']}, K=5",
         lambda: dynamics(batches["dynamics"], device), 10),
        ("mlp", f"activation MLP 3x256 gelu, batch {batches['mlp']}", lambda: mlp(batches["mlp"], device), 40),
        ("ilql", f"ILQL agent, tiny GPTs, batch {batches['ilql']} of the toy task",
         lambda: ilql(batches["ilql"], device), 40),
    ]
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {device}: {where}")
    for key, title, make, rounds in workloads:
        if args.only and key not in args.only:
            continue
        if args.compile:
            modes = [None] + (["reduce-overhead"] if device.startswith("cuda") else [])
            for mode in modes:
                print(f"\n{title}, torch.compile{f'(mode={mode!r})' if mode else ''}:")
                try:
                    result = measure_compiled(make, args.rounds or (2 if args.quick else rounds), block=10,
                                              in_place=key == "ilql", mode=mode, histograms=args.histograms)
                except Exception as exc:  # (the other workloads and modes still run)
                    print(f"  failed: {type(exc).__name__}: {str(exc)[:2000]}")
                    continue
                print(f"  {'':16s} {'step':>8s}      ratio to its bare (quartiles)")
                for name, (seconds, ratio, low, high) in result.items():
                    print(f"  {name:16s} {seconds * 1e3:8.1f} ms   {ratio:5.2f}x  ({low:.2f}-{high:.2f})")
            continue
        variants = {**VARIANTS, **BREAKDOWN} if args.breakdown else dict(VARIANTS)
        if device != "cpu":  # the floor reads on the CPU only: elsewhere it is torch's hooks alone
            del variants["floor (hooks, one read)"]
        result = measure(make, args.rounds or (2 if args.quick else rounds), block=10, variants=variants)
        bare = result["bare"][0]
        print(f"\n{title}: bare step {bare * 1e3:.1f} ms")
        print(f"  {'':31s} {'step':>8s}      ratio to bare (quartiles)  added")
        for name, (seconds, ratio, low, high) in result.items():
            print(f"  {name:31s} {seconds * 1e3:8.1f} ms   {ratio:5.2f}x  ({low:.2f}-{high:.2f})"
                  f"  {(seconds - bare) * 1e3:+7.2f} ms")


if __name__ == "__main__":
    main()
