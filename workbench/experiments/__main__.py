"""Run a built-in experiment from the command line, in one process or data-parallel under torchrun.

::

    python -m workbench.experiments list
    python -m workbench.experiments run activation_mlp --steps 200 --store runs/mlp
    python -m workbench.experiments run activation_mlp --steps 200 --save mlp.pt --save-every 50
    python -m workbench.experiments run activation_mlp --steps 200 --resume mlp.pt --save mlp.pt   # 200 more
    torchrun --nproc-per-node 2 -m workbench.experiments run activation_mlp --steps 200 --store runs/ddp

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) every rank builds the experiment with
the same seed (the same initial model, which DDP also broadcasts from rank 0), wraps its model in
``DistributedDataParallel`` and draws its own batches (``batch_size`` is per rank: the global batch
is ``world_size`` times it). One :func:`~workbench.instrument.distributed.watch_distributed`
records the global batch; rank 0 writes the store, which ``python app.py`` (the Runs tab) and
``workbench.load_run`` open while it is written.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import sys
import traceback
from typing import Any

__all__ = ["main", "parse_config", "data_parallel"]


def parse_config(items: list[str]) -> dict[str, Any]:
    """``["width=64", "activation=relu"]`` as ``{"width": 64, "activation": "relu"}`` (Python literals
    where they parse, else strings).

    Raises:
        ValueError: an item without ``=``, or a name given twice.
    """
    config, given = {}, {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--config takes NAME=VALUE (such as width=64), got {item!r}.")
        key = key.strip()
        if key in given:  # (one of the two would be dropped without a word)
            raise ValueError(f"--config {key} is given twice ({given[key]!r} and {item!r}); keep the one you mean.")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        config[key], given[key] = value, item
    return config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench.experiments",
                                     description="Run a built-in workbench experiment (data-parallel under torchrun).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the registered experiments")
    run = commands.add_parser("run", help="train an experiment for some steps, watched")
    run.add_argument("name", help="a registered experiment (see `list`)")
    run.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    run.add_argument("--store", default=None, help="run directory to record into (rank 0 writes it)")
    run.add_argument("--seed", type=int, default=None, help="the experiment's seed (default 0; with --resume, the "
                                                             "checkpoint's)")
    run.add_argument("--device", default=None,
                     help="cpu, cuda ... (default: cpu; under torchrun with CUDA, cuda:LOCAL_RANK)")
    run.add_argument("--every", type=int, default=1, help="record every Nth step (default 1)")
    run.add_argument("--histograms", action=argparse.BooleanOptionalAction, default=True,
                     help="record histograms (default; --no-histograms: statistics alone)")
    run.add_argument("--per-rank", action="store_true",
                     help="under torchrun, rank 0 also writes each rank's own rows into STORE-rank<r>")
    run.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                     help="a config field of the experiment (repeat for several), e.g. --config width=64")
    run.add_argument("--backend", default=None, help="torch.distributed backend (default gloo on CPU, nccl on CUDA)")
    run.add_argument("--save", default=None, metavar="PATH",
                     help="write a training checkpoint into PATH at the end (and every --save-every steps)")
    run.add_argument("--save-every", type=int, default=None, metavar="K",
                     help="with --save, also write it every K steps of the experiment")
    run.add_argument("--resume", default=None, metavar="PATH",
                     help="go on from a training checkpoint (--save's): --steps more steps, with its config and seed")
    run.add_argument("--memory-limit", default=None, metavar="SIZE",
                     help="the most memory the experiment may need, e.g. 16GB, or off (default: the environment "
                          "variable WORKBENCH_MEMORY_LIMIT, else 80%% of the memory available)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import workbench.experiments as experiments
    from workbench.registry import close_names

    if args.command == "list":
        for name in experiments.list_experiments():
            print(f"{name:24s} {experiments.get_experiment_spec(name).summary}")
        return 0
    try:
        config = parse_config(args.config)
        if args.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {args.steps}.")
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.name not in experiments.list_experiments():  # (the API's message points to the API)
        close = close_names(args.name, experiments.list_experiments())
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        print(f"error: unknown experiment {args.name!r}.{hint} `python -m workbench.experiments list` lists them.",
              file=sys.stderr)
        return 2
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if args.save or args.resume or args.save_every:
            print("error: --save, --save-every and --resume train in one process; under torchrun each rank draws "
                  "its own batches, which a training checkpoint does not hold. Run without torchrun to save or "
                  "resume.", file=sys.stderr)
            return 2
        return _run_distributed(args, config, experiments)
    # (a bad config value, --every, a --store that holds a run or cannot be made, a checkpoint that cannot be
    # resumed: refused before training, a line each; an error while training is a traceback)
    try:
        experiments.base._check_save(args.save, args.save_every)
        exp = _experiment(args, config, experiments)
        w = exp.watch(store=args.store, every=args.every, histograms=args.histograms)
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {_for_the_command_line(exc)}", file=sys.stderr)
        return 2
    first = exp.step_count
    with w:  # (closed stopped on an interrupt, failed with the error on an exception, as exp.run(store=...))
        history = exp.run(args.steps, save=args.save, save_every=args.save_every)
    last = history[-1] if history else {}
    print(f"{args.name}: {len(history)} steps" + (f" (steps {first + 1}-{exp.step_count})" if first else "")
          + (f", loss {last['loss']:.4g}" if "loss" in last else "")
          + (f"; stored in {args.store}" if args.store else "") + (f"; saved to {args.save}" if args.save else ""))
    return 0


def _experiment(args: argparse.Namespace, config: dict[str, Any], experiments: Any) -> Any:
    """The experiment to run: made from the flags, or with ``--resume``, restored from the checkpoint, whose
    experiment, seed and config the flags may repeat but not change (the checkpoint goes on only as it was)."""
    if args.resume is None:
        seed = 0 if args.seed is None else args.seed
        return experiments.create(args.name, seed=seed, device=args.device or "cpu",
                                  memory_limit=args.memory_limit, **config)
    from workbench.checkpoints import CheckpointError, read_training_checkpoint

    saved = read_training_checkpoint(args.resume)
    where = repr(args.resume)
    if saved["experiment"] != args.name:
        raise CheckpointError(f"--resume {where} is a checkpoint of {saved['experiment']!r}, not {args.name!r}; run "
                              f"`run {saved['experiment']} --resume {args.resume}`.")
    changed = [f"--config {k}={v!r} (the checkpoint's: {saved['config'].get(k, '(absent)')!r})"
               for k, v in config.items() if saved["config"].get(k, ...) != v]
    if args.seed is not None and args.seed != saved["seed"]:
        changed.append(f"--seed {args.seed} (the checkpoint's: {saved['seed']})")
    if changed:
        raise CheckpointError(f"--resume {where} goes on with the config and seed it was saved with; these flags "
                              f"change them: {', '.join(changed)}. Leave them out, or start a new run without "
                              "--resume.")
    return experiments.resume(args.resume, device=args.device or "cpu", memory_limit=args.memory_limit)


def _for_the_command_line(exc: BaseException) -> str:
    """An API error as the command line says it: ``memory_limit='16GB'`` is ``--memory-limit 16GB`` here."""
    text = re.sub(r"memory_limit='([^']*)'", r"--memory-limit \1", str(exc))
    text = re.sub(r"(?<![\w-])save_every=", "--save-every ", text)
    text = re.sub(r"(?<![\w-])save=", "--save ", text)
    return re.sub(r"(?<!-)memory_limit ", "--memory-limit ", text)


def data_parallel(model, **options: Any):
    """``model`` in ``DistributedDataParallel``, whose other attributes (methods an experiment
    calls on its model besides its forward, such as the dynamics network's
    ``initial_hidden_state``) are the model's."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    class DistributedDataParallel(DDP):  # (a run's metadata records the wrapper by this name)
        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.module, name)

    return DistributedDataParallel(model, **options)


def _rank_stores(w: Any, store: str, metadata: dict[str, Any]) -> list:
    """On rank 0 with ``--per-rank``: each rank's own rows written by rank 0 into ``<store>-rank<r>``
    (run directories beside the run, which the app lists and opens like any other)."""
    from workbench.instrument import RunStore

    stores = []
    for r, recorder in enumerate(w.recorder.ranks):
        rank_store = RunStore(f"{store}-rank{r}", {**metadata, "rank": r, "run": str(store),
                                                   "rows": f"rank {r}'s own rows (its shard, unscaled)"},
                              on_error=lambda message: print(f"warning: {message}", file=sys.stderr))
        rank_store.attach(recorder)
        stores.append(rank_store)
    return stores


def _run_distributed(args: argparse.Namespace, config: dict[str, Any], experiments: Any) -> int:
    import torch
    import torch.distributed as dist
    from workbench.instrument.distributed import destroy_process_group, watch_distributed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    backend = args.backend or ("nccl" if str(device).startswith("cuda") else "gloo")
    dist.init_process_group(backend)
    try:
        rank = dist.get_rank()
        seed = 0 if args.seed is None else args.seed
        exp = experiments.create(args.name, seed=seed, device=device, memory_limit=args.memory_limit, **config)
        # each rank draws its own batches: rank 0 the stream one process would, the others their own
        if rank:
            exp.generator.manual_seed(seed + 1_000_033 * rank)
        model = exp.model
        exp.model = data_parallel(model, device_ids=[exp.device.index] if exp.device.type == "cuda" else None)
        metadata = {"experiment": exp.name, "model": type(model).__name__,
                    "config": dataclasses.asdict(exp.config), "seed": seed,
                    "launch": f"torchrun --nproc-per-node {dist.get_world_size()}"}
        w = watch_distributed(exp.model, store=args.store, per_rank=args.per_rank, every=args.every,
                              histograms=args.histograms, metadata=metadata, start_step=exp.step_count + 1)
        exp.watcher = w  # exp.step() ends the watch's step with the step's metrics
        if getattr(w, "store", None) is not None:  # (rank 0) the app shows progress and time left from it
            w.store.set_meta(total_steps=exp.step_count + args.steps)
        rank_stores = _rank_stores(w, args.store, metadata) if args.per_rank and args.store and rank == 0 else []
        status, error = "failed", None
        try:
            with w:
                history = exp.run(args.steps, progress=None if rank == 0 else False)
            status = "finished"
        except BaseException as exc:
            error = "".join(traceback.format_exception(exc))
            raise
        finally:
            for store in rank_stores:
                store.close(status, error)
        if rank == 0:
            last = history[-1] if history else {}
            print(f"{args.name}: {len(history)} steps on {dist.get_world_size()} ranks"
                  + (f", loss {last['loss']:.4g} (rank 0's batch)" if "loss" in last else "")
                  + (f"; stored in {args.store}" if args.store else ""))
    finally:
        exp = model = w = None  # noqa: F841 (DDP's reducer holds the group: see destroy_process_group)
        destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
