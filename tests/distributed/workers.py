"""What the 2-process tests run on each rank (spawned; importable by the children), and the
single-process reference they are compared with (run in the test's own process)."""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

GLOBAL_BATCH = 8
STEPS = 3
BINS = 8


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 3))


def batches(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches: inputs away from 0 (a mean large against the spread tests the shifted sums)."""
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(GLOBAL_BATCH, 4, generator=g) + 3, torch.randint(3, (GLOBAL_BATCH,), generator=g))
            for _ in range(steps)]


def train(model: nn.Module, w, data, rows: slice) -> None:
    """SGD on the mean cross-entropy of ``rows`` of each batch; ``w.step()`` before the next zero_grad."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        w.step(loss=loss.item())


def hook_state(model: nn.Module) -> tuple:
    """Every hook torch holds for the model: process-wide module hooks, the modules' own, the parameters'."""
    m = torch.nn.modules.module
    return (len(m._global_forward_hooks), len(m._global_forward_pre_hooks), len(m._global_backward_hooks),
            tuple((len(mod._forward_hooks), len(mod._forward_pre_hooks), len(mod._backward_hooks))
                  for mod in model.modules()),
            tuple(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()))


def _dump(out: Path, name: str, rank: int, value) -> None:
    with open(out / f"{name}.{rank}.pkl", "wb") as f:
        pickle.dump(value, f)


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def worker(rank: int, world: int, init_file: str, out: str) -> None:
    from workbench.instrument.distributed import destroy_process_group

    out = Path(out)
    torch.set_num_threads(1)  # two ranks on a machine of two cores
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        ddp_scenario(rank, world, out)
        failing_scenario(rank, world, out)
        refused_store_scenario(rank, world, out)
        interrupted_start_scenario(rank, world, out, interrupted=0)
        interrupted_start_scenario(rank, world, out, interrupted=1)
        retried_start_scenario(rank, world, out)
        interrupted_exchange_scenario(rank, world, out)
        fsdp_scenario(rank, world, out)
        destroy_process_group()
    except BaseException:
        (out / f"error.{rank}.txt").write_text(traceback.format_exc())
        raise


def ddp_scenario(rank: int, world: int, out: Path) -> None:
    from workbench.instrument.distributed import watch_distributed

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    before = hook_state(model)
    share = GLOBAL_BATCH // world
    w = watch_distributed(ddp, store=out / "ddp_run", per_rank=True, histograms=True, bins=BINS)
    train(ddp, w, batches(), slice(rank * share, (rank + 1) * share))
    if rank == 0:  # the test opens the store while the run is still open
        w.recorder.flush()
        (out / "ready").touch()
        _wait_for(out / "go", 60)
    dist.barrier()
    w.close()
    result = {"hooks": (before, hook_state(model)), "paths": sorted(w.paths), "records": len(w.recorder.records()),
              "exchanges": (w.recorder.exchanges, w.recorder.object_exchanges), "errors": list(w.errors)}
    if rank == 0:
        result.update(rows=w.to_pandas(), histograms=w.histograms(), metrics=w.metrics(),
                      rank_rows=w.recorder.rank_frame(),
                      rank_histograms=[r.histograms() for r in w.recorder.ranks])
    _dump(out, "ddp", rank, result)


def failing_scenario(rank: int, world: int, out: Path) -> None:
    """Rank 1's hooks raise (a patch that fails) and its own payload fails at step 3; 4 steps, every 2nd recorded."""
    from workbench.instrument.distributed import watch_distributed

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    before = hook_state(model)
    w = watch_distributed(ddp, every=2)
    if rank == 1:
        def broken(tensor):
            raise RuntimeError("rank 1's hook fails")

        w.patch("0", broken)
        payload = w.recorder._payload

        def failing_payload(record):
            if record.step == 3:
                raise RuntimeError("rank 1's payload fails")
            return payload(record)

        w.recorder._payload = failing_payload
    share = GLOBAL_BATCH // world
    train(ddp, w, batches(4), slice(rank * share, (rank + 1) * share))
    w.close()
    result = {"hooks": (before, hook_state(model)), "finished": True,
              "exchanges": (w.recorder.exchanges, w.recorder.object_exchanges)}
    if rank == 0:
        result.update(rows=w.to_pandas(), records=[(r.step, len(r), r.errors) for r in w.recorder.records()])
    _dump(out, "failing", rank, result)


def refused_store_scenario(rank: int, world: int, out: Path) -> None:
    """Rank 0's store lies under a file: every rank's watch_distributed raises, none is left watching."""
    from workbench.instrument.distributed import watch_distributed

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    before = hook_state(model)
    if rank == 0:
        (out / "a_file").write_text("not a folder")
    try:
        watch_distributed(ddp, store=out / "a_file" / "run")
        raised = None
    except Exception as exc:
        raised = (type(exc).__name__, str(exc))
    _dump(out, "refused", rank, {"raised": raised, "hooks": (before, hook_state(model))})


def interrupted_start_scenario(rank: int, world: int, out: Path, interrupted: int) -> None:
    """Rank ``interrupted``'s watch is interrupted as it starts (a KeyboardInterrupt, in its modules
    predicate) while the other ranks' start well: every rank's watch_distributed raises, none is left
    watching, nor waiting for that rank at its first recorded step; rank 0's run is closed as failed."""
    from workbench import load_run
    from workbench.instrument.distributed import watch_distributed

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    before = hook_state(model)

    def selected(path: str) -> bool:
        if rank == interrupted:
            raise KeyboardInterrupt
        return True

    store = out / "starts" / f"interrupted_{interrupted}"  # (apart from the ddp scenario's one store)
    try:
        watch_distributed(ddp, store=store, modules=selected, parameters=False, parameter_grads=False)
        raised = None
    except BaseException as exc:
        raised = (type(exc).__name__, str(exc))
    # (how rank 0's run ended, read before retried_start_scenario writes a run there)
    run = load_run(store) if rank == 0 and (store / "run.sqlite").exists() else None
    _dump(out, f"interrupted_{interrupted}", rank, {"raised": raised, "hooks": (before, hook_state(model)),
                                                      "run": run and (run.status, run.metadata.get("error"))})


def retried_start_scenario(rank: int, world: int, out: Path) -> None:
    """The start interrupted on rank 1 (:func:`interrupted_start_scenario`) retried with the same store, its cause
    gone: rank 0's run, closed as failed before its first step, held nothing, and the retry writes there."""
    from workbench.instrument.distributed import watch_distributed

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    store = out / "starts" / "interrupted_1"
    try:
        w = watch_distributed(ddp, store=store, parameters=False, parameter_grads=False)
    except Exception as exc:  # (every rank raises then: the scenarios after this one run on)
        _dump(out, "retried", rank, {"raised": (type(exc).__name__, str(exc)), "store": str(store)})
        return
    share = GLOBAL_BATCH // world
    train(ddp, w, batches(2), slice(rank * share, (rank + 1) * share))
    w.close()
    _dump(out, "retried", rank, {"raised": None, "store": str(store)})


@contextlib.contextmanager
def interrupted_in_all_gather(steps: set[int]):
    """A SIGINT to this process inside the all_gather of each step in ``steps`` (as a Ctrl-C while the
    rank waits there: Python raises it as the collective returns, before the collectives that follow it).
    Python's own handler is put in place for it: a process started in the background (CI) inherits SIGINT
    ignored, where a Ctrl-C would do nothing."""
    real = dist.all_gather

    def all_gather(tensors, tensor, *args, **kwargs):
        work = real(tensors, tensor, *args, **kwargs)
        step = int(tensor[2].item())  # (the exchange's header: size, objects, step)
        if step in steps:
            steps.discard(step)
            signal.raise_signal(signal.SIGINT)
        return work

    dist.all_gather = all_gather
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        dist.all_gather = real
        signal.signal(signal.SIGINT, handler)


def interrupted_exchange_scenario(rank: int, world: int, out: Path) -> None:
    """A KeyboardInterrupt inside the exchange of step 1 (between its all_gather and its gather_object: the
    first step's rows go whole). ``retried``: on rank 0 alone, whose loop calls w.step() again and trains
    on. ``stopped``: on rank 1, which leaves its watch's with block; rank 0 is interrupted at the start of
    step 2 and leaves its own."""
    from workbench import load_run
    from workbench.instrument.distributed import watch_distributed

    share = GLOBAL_BATCH // world
    rows = slice(rank * share, (rank + 1) * share)
    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    retried = 0
    w = watch_distributed(ddp, store=out / "interrupted_exchange" / "retried", parameters=False)
    with interrupted_in_all_gather({1} if rank == 0 else set()):
        for x, y in batches():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x[rows]), y[rows])
            loss.backward()
            opt.step()
            while True:
                try:
                    w.step(loss=loss.item())
                    break
                except KeyboardInterrupt:  # (a notebook's user interrupting, then running the step again)
                    retried += 1
    w.close()
    result = {"retried": retried, "exchanges": (w.recorder.exchanges, w.recorder.object_exchanges)}
    if rank == 0:
        run = load_run(out / "interrupted_exchange" / "retried")
        result.update(run=(run.status, run.steps), rows=run.to_pandas(), records=[r.step for r in w.recorder.records()])
    _dump(out, "interrupted_exchange_retried", rank, result)

    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    store = out / "interrupted_exchange" / "stopped"
    raised, w = None, None
    try:
        with interrupted_in_all_gather({1} if rank == 1 else set()):
            with watch_distributed(ddp, store=store, parameters=False) as w:
                for x, y in batches():
                    if rank == 0 and w.step_index == 2:  # (the Ctrl-C reaches rank 0 as it trains)
                        signal.raise_signal(signal.SIGINT)
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(ddp(x[rows]), y[rows])
                    loss.backward()
                    opt.step()
                    w.step(loss=loss.item())
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    result = {"raised": raised, "step_index": w.step_index, "exchanges": (w.recorder.exchanges,
                                                                           w.recorder.object_exchanges)}
    if rank == 0:
        run = load_run(store)
        result.update(run=(run.status, run.steps, run.metadata.get("error")), rows=run.to_pandas())
    _dump(out, "interrupted_exchange_stopped", rank, result)


def fsdp_scenario(rank: int, world: int, out: Path) -> None:
    """FSDP2's fully_shard on the CPU: parameters are DTensor shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from workbench.instrument.distributed import watch_distributed

    mesh = init_device_mesh("cpu", (world,))
    model = make_model()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    w = watch_distributed(model, histograms=True, bins=BINS)
    share = GLOBAL_BATCH // world
    train(model, w, batches(), slice(rank * share, (rank + 1) * share))
    w.close()
    result = {"errors": list(w.errors)}
    if rank == 0:
        result.update(rows=w.to_pandas())
    _dump(out, "fsdp", rank, result)


def load(out: Path, name: str, rank: int):
    with open(out / f"{name}.{rank}.pkl", "rb") as f:
        return pickle.load(f)
