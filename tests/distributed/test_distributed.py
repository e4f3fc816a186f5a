"""watch under torch.distributed (#31): two CPU processes with gloo against one process over the
concatenated batch.

One spawn runs every 2-process scenario (tests/distributed/workers.py) once for the module; a
deadline kills the children so a bug cannot hang the suite.
"""

from __future__ import annotations

import fcntl
import os
import time
import traceback
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import workbench
from workbench.instrument.recorder import StepRecord, rows_frame
from tests.distributed import workers
from workbench.instrument.distributed import DistributedRecorder, watch_distributed
from workbench.instrument.distributed_rows import merge_rows, tensor_sums
from workbench.instrument.store import LOCK_NAME
from workbench.ui.views import RunView

KEY = ["step", "module", "call", "kind", "tensor"]
STATS = ["mean", "std", "min", "max", "abs_mean", "norm", "zero_frac"]
DEADLINE = 150  # seconds for the whole spawn (it takes ~15 s on two busy cores)


def _kill(context) -> None:
    for process in context.processes:
        if process.is_alive():
            process.kill()
    for process in context.processes:
        process.join(5)


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    context = mp.start_processes(workers.worker, args=(2, str(out / "init"), str(out)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + DEADLINE
    live = None
    try:
        while not (out / "ready").exists() and time.monotonic() < deadline:
            if any(p.exitcode is not None for p in context.processes):
                break
            time.sleep(0.05)
        if (out / "ready").exists():  # rank 0 waits, its run open, until "go"
            try:
                run = workbench.load_run(out / "ddp_run")
                view = RunView.from_run(run)
                live = {"status": run.status, "steps": run.steps, "last_step": view.last_step,
                        "sites": view.site_order("activation"), "metrics": view.metric_names(),
                        "rows": run.to_pandas()}
            except Exception:  # (told by the live test; the children are still let go and joined)
                live = {"error": traceback.format_exc()}
    finally:
        (out / "go").touch()
        try:
            while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
                if time.monotonic() >= deadline:
                    _kill(context)
                    errors = "\n".join(p.read_text() for p in out.glob("error.*.txt"))
                    pytest.fail(f"the 2-process run did not end within {DEADLINE} s\n{errors}")
        except mp.ProcessRaisedException:
            _kill(context)
            raise
    return out, live


def reference(rows: slice = slice(None), steps: int = workers.STEPS) -> workbench.Watch:
    """One process: the same model, the same batches (or ``rows`` of them), a plain watch."""
    model = workers.make_model()
    w = workbench.watch(model, histograms=True, bins=workers.BINS)
    workers.train(model, w, workers.batches(steps), rows)
    w.close()
    return w


def assert_rows_equal(got: pd.DataFrame, ref: pd.DataFrame) -> None:
    joined = ref.merge(got, on=KEY, suffixes=("_ref", "_got"), how="outer", indicator=True)
    missing = joined[joined._merge != "both"]
    assert missing.empty, f"rows on one side only:\n{missing[KEY + ['_merge']]}"
    assert (joined.shape_ref == joined.shape_got).all(), joined[joined.shape_ref != joined.shape_got][KEY]
    assert (joined.numel_ref == joined.numel_got).all()
    for column in STATS:
        np.testing.assert_allclose(joined[column + "_got"], joined[column + "_ref"], rtol=1e-5, atol=1e-6,
                                   err_msg=column)


# ------------------------------------------------------------------ 2 processes
def test_global_rows_equal_one_process_over_the_concatenated_batch(spawned):
    out, _ = spawned
    rank0 = workers.load(out, "ddp", 0)
    ref = reference()
    assert_rows_equal(rank0["rows"], ref.to_pandas())
    assert set(rank0["rows"].kind) == {"activation", "grad_output", "param", "param_grad"}
    # the loss logged is the mean of the ranks' losses: the global batch's (equal shards)
    np.testing.assert_allclose(rank0["metrics"].loss, ref.metrics().loss, rtol=1e-6)
    # one all_gather per recorded step; whole payloads gathered once, at the first (the layouts)
    assert rank0["exchanges"] == (workers.STEPS, 1) and not rank0["errors"]


def test_histograms_of_the_global_batch(spawned):
    out, _ = spawned
    rank0 = workers.load(out, "ddp", 0)
    got = rank0["histograms"].set_index(KEY)
    ref = reference().histograms().set_index(KEY)
    assert sorted(got.index) == sorted(ref.index)
    assert len(ref.index) > 20

    def cdf(row, at):  # the fraction of values below each point, values spread evenly within a bin
        return np.interp(at, row.edges, np.r_[0.0, np.cumsum(row.counts)]) / row.counts.sum()

    for key in ref.index:
        g, r = got.loc[key], ref.loc[key]
        assert g.counts.sum() == pytest.approx(r.counts.sum())  # every value counted, once
        # the same distribution: each process keeps its own range per row (and the merge re-bins the
        # ranks' onto their union), so a value is placed within one bin of either histogram
        at = np.linspace(min(g.edges[0], r.edges[0]), max(g.edges[-1], r.edges[-1]), 501)
        distance = np.abs(cdf(g, at) - cdf(r, at)).max()
        assert distance <= (g.counts.max() + r.counts.max()) / r.counts.sum(), key


def test_per_rank_rows_are_each_ranks_own(spawned):
    out, _ = spawned
    rank0 = workers.load(out, "ddp", 0)
    frame = rank0["rank_rows"]
    assert set(frame["rank"]) == {0, 1}
    share = workers.GLOBAL_BATCH // 2
    for rank in (0, 1):
        # step 1: the same parameters everywhere; rank r's rows are one process's over its half
        ref = reference(slice(rank * share, (rank + 1) * share), steps=1).to_pandas()
        ref = ref[ref.kind.isin(["activation", "grad_output"])]
        mine = frame[(frame["rank"] == rank) & (frame.step == 1) & frame.kind.isin(["activation", "grad_output"])]
        assert_rows_equal(mine.drop(columns="rank"), ref)
    merged = rank0["rows"]
    acts = merged[merged.kind == "activation"].set_index(KEY).numel
    by_rank = frame[frame.kind == "activation"].groupby(KEY).numel.sum()
    assert (acts.sort_index() == by_rank.sort_index()).all()


def test_one_store_written_by_rank_0(spawned):
    out, _ = spawned
    # (the scenarios other than the first write their stores in folders of their own)
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name not in ("starts", "interrupted_exchange")
                  ) == ["ddp_run"]
    assert sorted(p.name for p in (out / "interrupted_exchange").iterdir()) == ["retried", "stopped"]
    run = workbench.load_run(out / "ddp_run")
    assert run.status == "finished"
    assert run.metadata["distributed"]["world_size"] == 2
    assert run.metadata["distributed"]["wrapper"] == "DistributedDataParallel"
    rank0 = workers.load(out, "ddp", 0)
    assert_rows_equal(run.to_pandas(), rank0["rows"])
    rank1 = workers.load(out, "ddp", 1)
    assert rank1["records"] == 0 and rank1["exchanges"] == (workers.STEPS, 1)  # it sent its sums, kept nothing


def test_the_store_opens_live_in_a_run_view(spawned):
    _, live = spawned
    assert live is not None, "rank 0 never reported its run open"
    assert "error" not in live, live.get("error")
    assert live["status"] == "running"
    assert live["steps"] == [1, 2, 3] and live["last_step"] == 3
    assert live["sites"][:3] == ["0", "1", "2"] and "loss" in live["metrics"]
    assert (live["rows"].groupby("step").size() > 0).all()


def test_hooks_removed_on_every_rank_and_paths_unprefixed(spawned):
    out, _ = spawned
    for rank in (0, 1):
        for scenario in ("ddp", "failing"):
            before, after = workers.load(out, scenario, rank)["hooks"]
            assert before == after, (scenario, rank)
        paths = workers.load(out, "ddp", rank)["paths"]
        assert "0" in paths and not any(p.startswith("module") for p in paths)


def test_a_rank_whose_watch_fails_hangs_no_one(spawned):
    out, _ = spawned
    rank0, rank1 = workers.load(out, "failing", 0), workers.load(out, "failing", 1)
    assert rank0["finished"] and rank1["finished"]
    # steps 1 and 3 (every=2), each with errors to tell: whole payloads too
    assert rank0["exchanges"] == rank1["exchanges"] == (2, 2)
    records = {step: (rows, errors) for step, rows, errors in rank0["records"]}
    assert sorted(records) == [1, 2, 3, 4]  # 2 and 4: rank 0's metrics alone
    step1 = " ".join(e["error"] for e in records[1][1])
    assert "[rank 1]" in step1 and "rank 1's hook fails" in step1
    step3 = [e for e in records[3][1] if e["rank"] == 1]
    assert any("rank 1's payload fails" in e["error"] for e in step3)
    assert records[3][0] > 0  # rank 0's rows still recorded
    rows = rank0["rows"]
    # at step 3 rank 1 sent nothing: the activations are rank 0's half alone
    assert (rows[(rows.step == 3) & (rows.kind == "activation") & (rows.module == "0")].numel == 4 * 16).all()
    assert (rows[(rows.step == 1) & (rows.kind == "activation") & (rows.module == "0")].numel == 8 * 16).all()


def test_a_store_rank_0_cannot_open_stops_every_rank_saying_why(spawned):
    out, _ = spawned
    rank0, rank1 = workers.load(out, "refused", 0), workers.load(out, "refused", 1)
    kind, said = rank0["raised"]
    assert kind == "NotADirectoryError" and "a_file" in said
    kind, said = rank1["raised"]  # (it waited for nothing: the scenarios after this one ran on)
    assert kind == "RuntimeError" and "rank 0 could not start its watch" in said and "a_file" in said
    for rank in (rank0, rank1):
        before, after = rank["hooks"]
        assert before == after


@pytest.mark.parametrize("interrupted", [0, 1])
def test_a_rank_interrupted_as_its_watch_starts_leaves_no_rank_watching_or_waiting(spawned, interrupted):
    # (rank 1 failing after rank 0's watch had started left rank 0 waiting for it at its first
    # recorded step, until the group's timeout)
    out, _ = spawned
    ranks = [workers.load(out, f"interrupted_{interrupted}", rank) for rank in (0, 1)]
    for rank, result in enumerate(ranks):
        kind, said = result["raised"]
        if rank == interrupted:
            assert kind == "KeyboardInterrupt"
        else:  # (not the group's timeout, 60 s later)
            assert kind == "RuntimeError" and "KeyboardInterrupt" in said
            assert f"rank {interrupted} could not start its watch" in said
        before, after = result["hooks"]
        assert before == after
    if interrupted == 1:  # (rank 0's run had opened: it is closed as failed, saying why)
        status, error = ranks[0]["run"]
        assert status == "failed" and "rank 1 could not start its watch" in error


def test_a_start_retried_where_a_failed_start_left_rank_0_s_run_writes_there(spawned):
    # (rank 0's run, closed as failed before its first step when rank 1 could not start, refused the retry with
    # the same store: "already holds a run")
    out, _ = spawned
    ranks = [workers.load(out, "retried", rank) for rank in (0, 1)]
    assert [result["raised"] for result in ranks] == [None, None]
    run = workbench.load_run(ranks[0]["store"])
    assert run.status == "finished" and run.steps == [1, 2] and "error" not in run.metadata


def test_a_step_interrupted_inside_its_exchange_and_run_again_is_exchanged_and_stored_once(spawned):
    # (rank 0's step() run again gathered again: its all_gather met rank 1's gather_object)
    out, _ = spawned
    rank0, rank1 = (workers.load(out, "interrupted_exchange_retried", rank) for rank in (0, 1))
    assert (rank0["retried"], rank1["retried"]) == (1, 0)
    assert rank0["exchanges"] == rank1["exchanges"] == (workers.STEPS, 1)
    assert rank0["records"] == [1, 2, 3] and rank0["run"] == ("finished", [1, 2, 3])
    rows = rank0["rows"]
    assert not rows.duplicated(KEY).any()
    first = rows[(rows.kind == "activation") & (rows.module == "0")]
    assert (first.numel == workers.GLOBAL_BATCH * 16).all() and sorted(first.step) == [1, 2, 3]  # both ranks' rows


def test_ranks_interrupted_inside_an_exchange_or_after_it_all_stop_with_the_step_stored_once(spawned):
    # (rank 1, interrupted between the all_gather and the gather_object, left rank 0 waiting in the gather_object)
    out, _ = spawned
    rank0, rank1 = (workers.load(out, "interrupted_exchange_stopped", rank) for rank in (0, 1))
    assert rank0["raised"] == rank1["raised"] == "KeyboardInterrupt"
    assert rank0["exchanges"] == rank1["exchanges"] == (1, 1)  # step 1 exchanged whole, on both
    assert rank0["step_index"] == 2 and rank1["step_index"] == 1  # (rank 1's step() raised as it ended step 1)
    status, steps, error = rank0["run"]
    assert status == "stopped" and steps == [1] and "KeyboardInterrupt" in error
    rows = rank0["rows"]
    assert not rows.duplicated(KEY).any()
    assert (rows[(rows.kind == "activation") & (rows.module == "0")].numel == workers.GLOBAL_BATCH * 16).all()


def test_fsdp2_fully_shard_on_the_cpu(spawned):
    out, _ = spawned
    rank0 = workers.load(out, "fsdp", 0)
    assert not rank0["errors"] and not workers.load(out, "fsdp", 1)["errors"]
    assert_rows_equal(rank0["rows"], reference().to_pandas())


# ------------------------------------------------------------------ one process
def test_merge_rows_recentres_shifted_sums():
    torch.manual_seed(1)
    parts_values = [torch.randn(50, dtype=torch.float64) * 0.01 + 1e4, torch.randn(30, dtype=torch.float64) + 5,
                    torch.tensor([], dtype=torch.float64), torch.tensor([0.0, float("inf"), -2.0], dtype=torch.float64)]
    key = ("m", 0, "activation", "out")
    parts = []
    for values in parts_values:
        sums, hist = tensor_sums([values], bins=4)
        parts.append(((key + ((len(values),),),), np.array([len(values)]), sums, hist))
    keys, numel, sums, hist, _, _ = merge_rows(parts)
    whole, whole_hist = tensor_sums([torch.cat(parts_values)], bins=4)
    assert keys == (key + ((83,),),) and numel.tolist() == [83]
    finite = torch.cat(parts_values[:2])
    got = rows_frame([StepRecord(1, keys, numel, sums)]).iloc[0]
    ref = rows_frame([StepRecord(1, keys, numel, whole)]).iloc[0]
    for column in ["min", "max", "abs_mean", "zero_frac", "nan_count", "inf_count"]:
        assert got[column] == pytest.approx(ref[column], rel=1e-12), column
    # the finite parts alone: mean and std as torch computes them
    # an infinity makes the range infinite: no bin is filled, as in one process
    assert hist.sum() == whole_hist.sum() == 0
    # the finite parts alone: mean and std as torch computes them, every value binned
    keys, numel, sums, hist, _, _ = merge_rows(parts[:3])
    got = rows_frame([StepRecord(1, keys, numel, sums)]).iloc[0]
    assert got["mean"] == pytest.approx(finite.mean().item(), rel=1e-12)
    assert got["std"] == pytest.approx(finite.std().item(), rel=1e-9)
    assert hist.sum() == pytest.approx(80)


def test_one_rank_equals_a_plain_watch(one_rank, tmp_path):
    model = workers.make_model()
    w = watch_distributed(model, histograms=True, bins=workers.BINS, store=tmp_path / "run")
    workers.train(model, w, workers.batches(), slice(None))
    w.close()
    assert_rows_equal(w.to_pandas(), reference().to_pandas())
    assert workbench.load_run(tmp_path / "run").status == "finished"


@pytest.mark.parametrize("wrap", [
    lambda model: torch.compile(nn.parallel.DistributedDataParallel(model)),
    lambda model: nn.parallel.DistributedDataParallel(torch.compile(model)),
], ids=["compile(ddp)", "ddp(compile)"])
def test_a_compiled_ddp_model_is_named_by_the_model_s_paths_in_either_order(one_rank, tmp_path, wrap):
    torch._dynamo.reset()
    model = workers.make_model()
    wrapped = wrap(model)
    with warnings.catch_warnings():  # (compile(ddp): dynamo compiles no frame of DDP's forward on gloo; said)
        warnings.simplefilter("ignore")
        w = watch_distributed(wrapped, histograms=True, bins=workers.BINS, store=tmp_path / "run")
        workers.train(wrapped, w, workers.batches(), slice(None))
        w.close()
    rows = w.to_pandas()
    assert set(rows.module) == {"", "0", "1", "2"}  # no "module." nor "_orig_mod." prefix
    assert_rows_equal(rows, reference().to_pandas())
    assert workbench.load_run(tmp_path / "run").metadata["distributed"]["wrapper"] == "DistributedDataParallel"


def test_metadata_is_held_to_what_the_distributed_run_records_of_the_parameters(one_rank, tmp_path):
    # (the rank's watch records no parameters itself, its recorder does: metadata saying they are
    # recorded was refused as contradicting the watch's parameters=False)
    model = workers.make_model()
    with watch_distributed(model, store=tmp_path / "run", metadata={"parameters": True}) as w:
        model(torch.randn(2, 4)).sum().backward()
        w.step()
    meta = workbench.load_run(tmp_path / "run").metadata
    assert meta["parameters"] is True and meta["parameter_grads"] is True
    with pytest.raises(ValueError, match=r"metadata \{'parameters': True\} contradicts .*parameters=False"):
        watch_distributed(model, store=tmp_path / "other", parameters=False, metadata={"parameters": True})


def test_metadata_that_is_not_json_is_warned_of_once_where_it_is_given(one_rank, tmp_path):
    # (the rank's watch warned of it again, from a line of watch_distributed)
    model = workers.make_model()
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        w = watch_distributed(model, store=tmp_path / "run", metadata={"scale": torch.ones(1), "tags": [torch.ones(1)]})
    w.close()
    said = [w for w in told if "not a JSON value" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    meta = workbench.load_run(tmp_path / "run").metadata
    assert meta["scale"] == str(torch.ones(1)) and meta["tags"] == [str(torch.ones(1))]


def test_a_plain_watch_on_each_rank_writing_one_store_is_told_to_use_watch_distributed(one_rank, tmp_path):
    model = nn.parallel.DistributedDataParallel(workers.make_model())
    (tmp_path / "run").mkdir()
    held = os.open(tmp_path / "run" / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # (as another rank's watch holds it, in its process)
    try:
        with pytest.raises(FileExistsError, match=r"being written by another writer.*Under torch\.distributed "
                                                  r"every rank's watch writes its own store: use .*watch_distributed"):
            workbench.watch(model, store=tmp_path / "run")
    finally:
        os.close(held)
    with workbench.watch(model, store=tmp_path / "run"):  # (a watch of this process, left open: no other rank's)
        with pytest.raises(FileExistsError, match=r"being written by another writer \(it holds run.lock\): a watch "
                                                  r"of this process, still open .*Close that watch first") as refused:
            workbench.watch(model, store=tmp_path / "run")
    assert "torch.distributed" not in str(refused.value)


def test_a_rank_s_watch_is_closed_when_its_gather_of_outcomes_fails(one_rank, tmp_path, monkeypatch):
    # (a peer gone before watch_distributed: rank 0's watch, started, was left with its hooks in and
    # its store held open)
    def peer_gone(*args, **kwargs):
        raise RuntimeError("a peer is gone")

    model = workers.make_model()
    before = workers.hook_state(model)
    monkeypatch.setattr(dist, "all_gather_object", peer_gone)
    with pytest.raises(RuntimeError, match="a peer is gone"):
        watch_distributed(model, store=tmp_path / "run")
    monkeypatch.undo()
    assert workers.hook_state(model) == before
    run = workbench.load_run(tmp_path / "run")
    assert run.status == "failed" and "a peer is gone" in run.metadata["error"]


def test_a_rank_s_error_is_told_whatever_its_message(one_rank, monkeypatch):
    # (its message was made before the gather, outside any try: an error whose message cannot be made had
    # the rank raise that error and the other ranks wait; one of a million characters went whole)
    class Unsayable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    told = []
    gather = dist.all_gather_object

    def spy(objects, obj, *args, **kwargs):
        gather(objects, obj, *args, **kwargs)
        told.extend(objects)

    class FailingPath:  # (a store path that raises as the watch opens its store)
        def __init__(self, error: Exception) -> None:
            self.error = error

        def __fspath__(self) -> str:
            raise self.error

    monkeypatch.setattr(dist, "all_gather_object", spy)
    with pytest.raises(Unsayable):
        watch_distributed(workers.make_model(), store=FailingPath(Unsayable()))
    with pytest.raises(ValueError, match="x" * 100):
        watch_distributed(workers.make_model(), store=FailingPath(ValueError("x" * 10**6)))
    assert told[0] == "Unsayable (its message could not be made)"
    assert len(told[1]) < 3000 and told[1].startswith("ValueError: xxx") and told[1].endswith("more characters)")


def test_a_rank_that_could_not_start_is_named_by_its_global_rank_in_a_subgroup(one_rank, tmp_path, monkeypatch):
    # (the ranks were named by their rank in group=: a subgroup of the world's ranks 1 and 2 told the world's rank
    # 1, started fine, that "rank 1 could not start its watch", of the world's rank 2. Here the group of one is
    # taken for rank 2 of the world, and the gather tells that it could not start.)
    group = dist.new_group([0])
    world_rank_of = dist.get_global_rank
    monkeypatch.setattr(dist, "get_global_rank", lambda g, rank: 2 if g is group else world_rank_of(g, rank))

    def told_failed(objects, obj, *args, **kwargs):
        objects[0] = "ValueError: its model has lazy modules"

    monkeypatch.setattr(dist, "all_gather_object", told_failed)
    model = workers.make_model()
    before = workers.hook_state(model)
    with pytest.raises(RuntimeError, match=r"watch_distributed: rank 2 \(rank 0 of the group\) could not start its "
                                           r"watch \(ValueError: its model has lazy modules\), so no rank watches"):
        watch_distributed(model, store=tmp_path / "run", group=group)
    assert workers.hook_state(model) == before


def test_bad_options_are_named(one_rank):
    model = workers.make_model()
    with pytest.raises(ValueError, match=r"grad_scale must be a finite number > 0.*got -1"):
        DistributedRecorder(model, grad_scale=-1)
    with pytest.raises(ValueError, match=r"metrics must be one of \('mean', 'rank0'\), got 'sum'"):
        DistributedRecorder(model, metrics="sum")
    with pytest.raises(TypeError, match="model must be the torch.nn.Module being watched"):
        DistributedRecorder("model")
    with pytest.raises(TypeError, match="pass no recorder="):
        watch_distributed(model, recorder=workbench.Recorder())
    recorder = DistributedRecorder(model)
    with pytest.raises(ValueError, match=r"rank_frame\(\) needs DistributedRecorder\(per_rank=True\)"):
        recorder.rank_frame()


def test_a_bad_group_or_an_unknown_option_is_named_before_anything_is_watched(one_rank):
    # (group=5 raised AttributeError: 'int' object has no attribute 'size' out of torch; a misspelt option was
    # refused as "watch() got an unexpected keyword argument", naming another function, with no hint)
    model = workers.make_model()
    before = workers.hook_state(model)
    with pytest.raises(TypeError, match=r"group must be a torch.distributed process group \(dist.new_group\(ranks\)\) "
                                        r"or None for the world, got 5"):
        watch_distributed(model, group=5)
    with pytest.raises(TypeError, match=r"watch_distributed\(\) got an unexpected keyword argument 'evry' \(did you "
                                        r"mean 'every'\?\); its options are .*per_rank"):
        watch_distributed(model, evry=2)
    assert workers.hook_state(model) == before


def test_needs_an_initialized_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        watch_distributed(workers.make_model())


def test_a_watch_recording_parameters_itself_is_told_and_not_counted_twice(one_rank):
    model = workers.make_model()
    w = workbench.watch(model, histograms=True, bins=workers.BINS,
                        recorder=DistributedRecorder(model, bins=workers.BINS))
    workers.train(model, w, workers.batches(), slice(None))
    w.close()
    assert_rows_equal(w.to_pandas(), reference().to_pandas())
    told = [e for r in w.recorder.records() for e in r.errors if "start the watch with parameters=False" in e["error"]]
    assert len(told) == 1 and told[0]["step"] == 1


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, as in a terminal, for the test (a process started in the background, as CI
    may be, inherits SIGINT ignored: a SIGINT then does nothing)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupt_inside_the_exchange_is_held_until_the_step_is_published_a_second_raised_at_once(
        one_rank, monkeypatch, interrupts, ctrl_c_raises):
    import signal

    real = dist.all_gather
    exchanged = []

    def interrupted(tensors, tensor, *args, **kwargs):  # (Ctrl-C pressed `interrupts` times as the rank waits here)
        work = real(tensors, tensor, *args, **kwargs)
        exchanged.append(int(tensor[2].item()))
        if exchanged == [1]:
            for _ in range(interrupts):
                signal.raise_signal(signal.SIGINT)
            exchanged.append("interrupted")
        return work

    model = workers.make_model()
    w = watch_distributed(model, parameters=False)
    monkeypatch.setattr(dist, "all_gather", interrupted)
    model(torch.randn(4, 4)).sum().backward()
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            w.step()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (the handler given back)
    if interrupts == 1:  # held to the end of the step's publishing: the code after the collective ran
        assert exchanged == [1, "interrupted"] and [r.step for r in w.recorder.records()] == [1]
        assert not told
    else:  # raised at once: the step is not published, and the rank records its own rows from here
        assert exchanged == [1] and w.recorder.records() == []
        assert any("interrupted twice (KeyboardInterrupt) inside the exchange" in str(m.message) for m in told)
    w.step()  # run again: the step is published once, not exchanged again
    model(torch.randn(4, 4)).sum().backward()
    w.step()
    w.close()
    assert [r.step for r in w.recorder.records()] == [1, 2]
    assert exchanged == ([1, "interrupted", 2] if interrupts == 1 else [1])
    assert w.recorder.exchanges == (2 if interrupts == 1 else 0)


def sigints_twice_in_step_1_s_exchange(calls: list):
    """An ``all_gather`` that raises two SIGINTs right after step 1's exchange, then notes "exchanged" in
    ``calls``."""
    import signal

    real = dist.all_gather

    def interrupted_twice(tensors, tensor, *args, **kwargs):
        work = real(tensors, tensor, *args, **kwargs)
        if int(tensor[2].item()) == 1:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            calls.append("exchanged")
        return work

    return interrupted_twice


def test_a_sigint_handler_of_the_user_s_own_gets_every_sigint_and_one_that_returns_leaves_the_exchange_whole(
        one_rank, monkeypatch):
    # (a handler that does not raise - "stop after this epoch" - called for the second of two SIGINTs alone, and
    # the rank then taken to have walked out of its collectives: it recorded its own rows from there, its peers left
    # waiting in the next exchange)
    import signal

    calls = []
    interrupted_twice = sigints_twice_in_step_1_s_exchange(calls)

    model = workers.make_model()
    w = watch_distributed(model, parameters=False)
    monkeypatch.setattr(dist, "all_gather", interrupted_twice)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append("stop after this epoch"))
    try:
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            for _ in range(2):
                model(torch.randn(4, 4)).sum().backward()
                w.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    w.close()
    assert not [str(m.message) for m in told]  # (nothing said: the exchange ran whole)
    assert w.recorder.exchanges == 2 and [r.step for r in w.recorder.records()] == [1, 2]
    assert calls == ["stop after this epoch", "stop after this epoch", "exchanged"]


def test_a_handler_that_sets_the_default_one_for_a_second_sigint_has_the_second_raise(one_rank, monkeypatch):
    # ("first Ctrl-C: stop after this epoch; a second: stop now" - the second SIGINT went to the first handler again)
    import signal

    calls = []
    interrupted_twice = sigints_twice_in_step_1_s_exchange(calls)

    def stop_after_this_epoch(signum, frame):
        calls.append("stop after this epoch")
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (a second Ctrl-C stops at once)

    model = workers.make_model()
    w = watch_distributed(model, parameters=False)
    monkeypatch.setattr(dist, "all_gather", interrupted_twice)
    previous = signal.signal(signal.SIGINT, stop_after_this_epoch)
    try:
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            model(torch.randn(4, 4)).sum().backward()
            with pytest.raises(KeyboardInterrupt):
                w.step()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == ["stop after this epoch"]  # (raised inside the exchange: the rank records its own rows)
    assert any("interrupted twice (KeyboardInterrupt) inside the exchange" in str(m.message) for m in told)
    w.close()
