"""The run store: round trips, metadata, crash safety with a real SIGKILL, live reads, status, the writer's
lock, write failures, read-only runs, errors, export."""

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import warnings
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch

from torch import nn

import workbench
from workbench.instrument.torch_internals import installed_hooks
from workbench.instrument import StepRecord
from workbench.instrument.store import DB_NAME, SCHEMA_VERSION, RunError, RunStore


def small_run(path, steps=4, **options):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with workbench.watch(model, store=path, metadata={"model": "tiny"}, **options) as w:
        for i in range(steps):
            loss = model(torch.randn(8, 3)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss.item(), lr=0.1)
    return w


def test_a_stored_run_reads_back_as_it_was_recorded(tmp_path):
    w = small_run(tmp_path / "run", histograms=True, bins=8)
    run = workbench.load_run(tmp_path / "run")
    pd.testing.assert_frame_equal(run.to_pandas(), w.to_pandas(), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(run.metrics(), w.metrics())
    stored, live = run.histograms("0", "activation"), w.histograms("0", "activation")
    assert len(stored) == 4
    for a, b in zip(stored.itertuples(), live.itertuples()):
        np.testing.assert_array_equal(a.counts, b.counts)
        np.testing.assert_allclose(a.edges, b.edges)
    assert run.steps == [1, 2, 3, 4]


def test_metadata_names_the_run(tmp_path):
    exp = workbench.experiments.create("activation_mlp", seed=3, width=8)
    exp.run(2)
    exp.run(3, store=tmp_path / "exp")
    meta = workbench.load_run(tmp_path / "exp").metadata
    assert meta["experiment"] == "activation_mlp" and meta["seed"] == 3 and meta["model"] == "MLP"
    assert meta["config"]["width"] == 8
    assert meta["schema_version"] == SCHEMA_VERSION and meta["status"] == "finished"
    assert meta["versions"]["torch"] == torch.__version__ and meta["versions"]["workbench"] == workbench.__version__
    assert meta["start_time"] <= meta["end_time"] <= time.time()
    # the experiment's metrics belong to the experiment's own step numbers
    assert workbench.load_run(tmp_path / "exp").metrics().step.tolist() == [3, 4, 5]
    assert exp.watcher.closed


def test_metadata_that_repeats_how_the_watch_records_keeps_the_watchs_value(tmp_path):
    # a numpy number equal to the watch's every is no contradiction, and is not stored for it (as its str:
    # not a JSON value); an array for one is a contradiction, said as such
    model = nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="not a JSON value"):
        with workbench.watch(model, store=tmp_path / "a", metadata={"every": np.int64(1), "bins": 32.0}) as w:
            model(torch.ones(1, 2)).sum().backward()
            w.step()
    meta = workbench.load_run(tmp_path / "a").metadata
    assert (meta["every"], meta["bins"]) == (1, 32) and isinstance(meta["every"], int) and isinstance(meta["bins"], int)
    with pytest.warns(UserWarning, match="not a JSON value"), \
            pytest.raises(ValueError, match=r"metadata \{'bins': array\(\[1, 2\]\)\} contradicts"):
        workbench.watch(model, store=tmp_path / "b", metadata={"bins": np.array([1, 2])})


def test_list_and_compare_runs(tmp_path):
    small_run(tmp_path / "a", steps=2)
    small_run(tmp_path / "nested" / "b", steps=3)
    (tmp_path / "not-a-run").mkdir()
    runs = workbench.list_runs(tmp_path)
    assert sorted(runs.run) == ["a", "b"]
    assert dict(zip(runs.run, runs.steps)) == {"a": 2, "b": 3}
    on_disk = sum(f.stat().st_size for f in (tmp_path / "a").iterdir()) / 1e6  # (what the run takes)
    assert runs.set_index("run").size_mb["a"] == pytest.approx(on_disk) and on_disk > 0
    both = workbench.compare_runs(list(runs.path))
    assert both.columns[0] == "run" and set(both.run) == {"a", "b"}
    assert len(both) == len(workbench.load_run(tmp_path / "a").to_pandas()) + len(
        workbench.load_run(tmp_path / "nested" / "b").to_pandas())
    metrics = workbench.compare_runs([tmp_path / "a"], what="metrics")
    assert list(metrics.columns) == ["run", "step", "loss", "lr"]


def test_a_stored_runs_metrics_have_the_columns_of_the_watchs_in_the_same_order(tmp_path):
    # (the watch's were in the order first logged, the stored run's sorted by name: a frame built on one's
    # columns read the other's wrong)
    model = nn.Linear(3, 2)
    with workbench.watch(model, store=tmp_path / "run") as w:
        for step in range(1, 5):
            model(torch.randn(4, 3)).sum().backward()
            if step == 2:
                w.log(zeta=1.0)  # (first logged at step 2, with a name that sorts last)
            if step == 3:
                w.ablate("", [0], label="zero unit 0")  # (its marker, from step 4)
                w.log(aux=float("nan"))  # (first logged at step 3, with a name that sorts first; a NaN)
            w.step(loss=1.0 / step, accuracy=0.5)  # (the order given is not kept within a step: by name)
    live, stored = w.metrics(), workbench.load_run(tmp_path / "run").metrics()
    expected = ["step", "accuracy", "loss", "zeta", "aux", "intervention/i1: zero unit 0 at (model)"]
    assert list(live.columns) == expected
    pd.testing.assert_frame_equal(stored, live)
    assert list(workbench.compare_runs([tmp_path / "run"], what="metrics").columns) == ["run", *expected]


def test_a_watch_whose_memory_dropped_the_first_steps_orders_its_metrics_as_the_stored_run(tmp_path):
    # (the columns followed the steps kept in memory: "b", first logged at step 1, came after "a" once step 1
    # was evicted, while the stored run kept the order logged)
    model = nn.Linear(3, 2)
    recorder = workbench.Recorder(max_rows=12)  # (6 rows a step: two steps kept)
    with workbench.watch(model, recorder=recorder, store=tmp_path / "run", histograms=False) as w:
        for step in range(1, 5):
            model(torch.randn(4, 3)).sum().backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # (the memory is full: said once)
                w.step(b=1.0) if step == 1 else w.step(a=2.0, b=3.0)
    assert recorder.evicted > 0 and w.metrics().step.tolist() == [3, 4]
    stored = workbench.load_run(tmp_path / "run").metrics()
    assert list(w.metrics().columns) == list(stored.columns) == ["step", "b", "a"]
    pd.testing.assert_frame_equal(w.metrics(), stored.query("step >= 3").reset_index(drop=True))


def test_bad_paths_get_clear_errors(tmp_path):
    with pytest.raises(RunError, match="is not a workbench run: it has no run.sqlite"):
        workbench.load_run(tmp_path)
    small_run(tmp_path / "run", steps=1)
    with pytest.raises(FileExistsError, match="already holds a run"):
        small_run(tmp_path / "run", steps=1)
    # a newer schema
    db = sqlite3.connect(tmp_path / "run" / DB_NAME)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (json.dumps(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(RunError, match="schema 2; this workbench reads up to 1. Upgrade"):
        workbench.load_run(tmp_path / "run")
    # a damaged file
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RunError, match="damaged"):
        workbench.load_run(damaged)


WRITER = textwrap.dedent("""
    import sys, torch, workbench
    exp = workbench.experiments.create("activation_mlp", seed=0, width=16)
    exp.run(100000, store=sys.argv[1], histograms=True)
""")


def test_a_killed_process_leaves_every_committed_step_readable(tmp_path):
    path = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        deadline = time.time() + 120
        seen = []
        while time.time() < deadline:
            if (path / DB_NAME).exists():
                try:
                    run = workbench.load_run(path)
                    seen.append(len(run.steps))  # read live, from another process
                    assert run.status == "running"  # its writer holds the lock
                    if seen[-1] >= 40:
                        break
                except RunError:
                    pass  # the writer is still creating the schema
            time.sleep(0.05)
        assert seen and seen[-1] >= 40, "the writer did not get going"
        live = run.to_pandas()
        assert len(live) > 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    run = workbench.load_run(path)
    # it never closed the run, and its lock went with it: not 'running' for ever
    assert run.metadata["status"] == run.status == "interrupted"
    assert workbench.list_runs(tmp_path).status.tolist() == ["interrupted"]
    steps = run.steps
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= seen[-1]
    rows = run.to_pandas()
    per_step = rows.groupby("step").size()
    assert list(per_step.index) == steps  # no half-written step: every row count is the full one
    assert per_step.nunique() == 1
    assert run.metrics().step.tolist() == steps
    assert len(run.histograms()) == len(rows)
    db = sqlite3.connect(path / DB_NAME)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


def test_anomalies_and_errors_are_stored(tmp_path):
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    with workbench.watch(model, store=tmp_path / "r") as w:
        model(torch.randn(4, 2)).sum().backward()
        w.step()
        w.patch("0", lambda out: out * float("inf"), call=0)
        w.patch("1", lambda out: out.missing_attribute)  # fails: recorded, removed
        model(torch.randn(4, 2)).sum().backward()
        w.step()
    run = workbench.load_run(tmp_path / "r")
    first = run.anomalies().iloc[0]
    assert (first.step, first.module, first.kind) == (2, "0", "activation")
    errors = run.errors()
    assert list(errors.module) == ["1"] and "missing_attribute" in errors.error[0]


def test_export_csv_parquet_and_tensorboard(tmp_path):
    small_run(tmp_path / "run", histograms=True, bins=4)
    run = workbench.load_run(tmp_path / "run")
    rows = run.to_pandas()
    csv = pd.read_csv(run.export(tmp_path / "rows.csv"), dtype={"module": str}, keep_default_na=False,
                      na_values={c: [""] for c in rows.columns if c != "module"})  # "" is the model itself
    pd.testing.assert_frame_equal(csv, rows, check_exact=False, rtol=1e-12)
    parquet = pd.read_parquet(run.export(tmp_path / "new" / "metrics.parquet", what="metrics"))  # (folder made)
    pd.testing.assert_frame_equal(parquet, run.metrics())
    with pytest.raises(ValueError, match="use a .csv or .parquet file"):
        run.export(tmp_path / "rows.xlsx")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.export(tmp_path / "tb")), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("metrics/loss")]
    assert loss == [(s, pytest.approx(v, rel=1e-6)) for s, v in zip(run.metrics().step, run.metrics().loss)]
    first = rows[(rows.module == "0") & (rows.kind == "activation")].iloc[0]
    assert not any("#" in tag for tag in events.Tags()["scalars"])  # (each module called once a step)
    mean = events.Scalars("activation/0/out/mean")[0]
    assert mean.value == pytest.approx(first["mean"], rel=1e-6)
    hist = events.Histograms("activation/0/out")[0].histogram_value
    assert hist.num == first["numel"] and hist.min == pytest.approx(first["min"])


def test_tensorboard_tags_name_the_call_of_a_module_called_twice_a_step(tmp_path):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.lin = torch.nn.Tanh(), torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.act(self.lin(self.act(x)))

    model = Twice()
    with workbench.watch(model, store=tmp_path / "run", histograms=False) as w:
        model(torch.randn(2, 3)).sum().backward()
        w.step()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workbench.load_run(tmp_path / "run").export(tmp_path / "tb")))
    events.Reload()
    tags = {tag.rsplit("/", 1)[0] for tag in events.Tags()["scalars"] if tag.startswith("activation/")}
    assert {"activation/act#0/out", "activation/act#1/out", "activation/lin/out", "activation/(model)/out"} <= tags


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    small_run(tmp_path / "run", steps=1)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(ImportError, match="pip install pyarrow"):
        workbench.load_run(tmp_path / "run").export(tmp_path / "x.parquet")


# ------------------------------------------------------------------ status
def train(w, model, steps):
    for _ in range(steps):
        model(torch.randn(8, 3)).square().mean().backward()
        w.step()


def test_a_run_reads_how_it_ended(tmp_path):
    small_run(tmp_path / "done", steps=2)
    assert workbench.load_run(tmp_path / "done").status == "finished"

    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "live")
    train(w, model, 2)
    assert workbench.load_run(tmp_path / "live").status == "running"
    w.close("stopped")
    assert workbench.load_run(tmp_path / "live").status == "stopped"

    with pytest.raises(ZeroDivisionError):
        with workbench.watch(model, store=tmp_path / "crashed") as w:
            train(w, model, 1)
            1 / 0
    crashed = workbench.load_run(tmp_path / "crashed")
    assert crashed.status == "failed" and "ZeroDivisionError" in crashed.metadata["error"]
    assert crashed.steps == [1]

    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    exp.train_step = lambda: 1 / 0  # a step that raises
    with pytest.raises(ZeroDivisionError):
        exp.run(3, store=tmp_path / "experiment")
    assert workbench.load_run(tmp_path / "experiment").status == "failed"
    statuses = workbench.list_runs(tmp_path).set_index("run").status.to_dict()
    assert statuses == {"done": "finished", "live": "stopped", "crashed": "failed", "experiment": "failed"}
    w = workbench.watch(model)
    with pytest.raises(ValueError, match="status must be one of .*'finished', 'stopped', 'failed'.*got 'ok'"):
        w.close("ok")
    assert not w.closed  # refused before anything changed
    w.close()


@pytest.mark.parametrize("ended", [ZeroDivisionError, KeyboardInterrupt, "killed"])
def test_a_run_that_ended_before_its_first_step_is_replaced_by_a_retry(tmp_path, ended):
    # (a run that failed, was stopped or was killed before its first step held nothing, yet its directory refused
    # the retry made once the cause was fixed: "already holds a run")
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    if ended == "killed":  # (a process that ends without closing its watch: its run reads interrupted)
        code = ("import os, sys, torch, workbench\n"
                "w = workbench.watch(torch.nn.Linear(3, 5), store=sys.argv[1], metadata={'attempt': 1, 'first': 1})\n"
                "os._exit(0)")
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], check=True, timeout=120)
    else:
        with pytest.raises(ended):
            with workbench.watch(model, store=tmp_path / "run", metadata={"attempt": 1, "first": 1}):
                raise ended()
    assert workbench.load_run(tmp_path / "run").status == {ZeroDivisionError: "failed", KeyboardInterrupt: "stopped",
                                                           "killed": "interrupted"}[ended]
    with workbench.watch(model, store=tmp_path / "run", metadata={"attempt": 2}) as w:
        train(w, model, 2)
    run = workbench.load_run(tmp_path / "run")
    assert run.status == "finished" and run.steps == [1, 2] and "error" not in run.metadata
    assert run.metadata["attempt"] == 2 and "first" not in run.metadata  # (replaced: none of its facts is left)


def test_a_reader_that_opened_the_replaced_run_reads_the_new_one_whole(tmp_path, monkeypatch):
    """A reader (load_run's) that opened the database of a run that failed before its first step just before a new
    run replaced it: the old file was deleted, the new run's written under its name, and the reader's first read
    took the new run's write-ahead log over the old file ("database disk image is malformed"). The old run's tables
    are emptied in place now, in the transaction that starts the new one: the reader sees one run or the other."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)])
    path = tmp_path / "run"
    with pytest.raises(ZeroDivisionError):
        with workbench.watch(model, store=path):
            1 / 0
    reader = workbench.load_run(path)
    assert reader.status == "failed" and reader.steps == []
    connect = type(reader)._connect
    replacing = []

    def opened_then_replaced(run):
        db = connect(run)
        db.execute("SELECT 1").fetchall()  # (the file is open, its log not yet read)
        if not replacing:
            replacing.append(workbench.watch(model, store=path, histograms=False))
            # past SQLite's automatic checkpoint (1000 pages written to the log): the log starts again, holding the
            # last steps' pages alone, the rest of the new run in its file
            for _ in range(80):
                model(torch.randn(8, 4)).square().mean().backward()
                replacing[0].step()
            replacing[0].recorder.flush(None)  # (every step written)
            assert os.path.getsize(path / DB_NAME) > 100 * 4096  # (checkpointed: the new run's file holds steps)
        return db

    monkeypatch.setattr(type(reader), "_connect", opened_then_replaced)
    rows = reader.to_pandas()
    monkeypatch.undo()
    w = replacing[0]
    pd.testing.assert_frame_equal(rows, workbench.load_run(path).to_pandas())
    assert sorted(set(rows.step)) == list(range(1, 81))
    w.close()
    assert reader.status == "finished" and reader.steps == list(range(1, 81))


def test_a_replacing_start_that_fails_leaves_the_run_it_was_to_replace(tmp_path, monkeypatch):
    """Replaced in place, in the new run's first transaction: a start that fails before it commits leaves the old
    run's database as it was (a reader may have it open), not deleted as a database the start made would be."""
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with pytest.raises(ZeroDivisionError):
        with workbench.watch(model, store=tmp_path / "run", metadata={"attempt": 1}):
            1 / 0

    def broken():
        raise RuntimeError("no versions")

    monkeypatch.setattr("workbench.instrument.store.versions", broken)
    with pytest.raises(RuntimeError, match="no versions"):
        RunStore(tmp_path / "run", metadata={"attempt": 2})
    with pytest.raises(RuntimeError, match="no versions"):
        RunStore(tmp_path / "new")
    monkeypatch.undo()
    run = workbench.load_run(tmp_path / "run")
    assert run.status == "failed" and run.metadata["attempt"] == 1 and not (tmp_path / "new" / DB_NAME).exists()


def test_a_run_with_a_step_or_one_that_finished_is_kept_and_the_refusal_says_what_to_do(tmp_path):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    with pytest.raises(ZeroDivisionError):
        with workbench.watch(model, store=tmp_path / "crashed") as w:
            train(w, model, 1)
            1 / 0
    with workbench.watch(model, store=tmp_path / "empty"):  # (finished: a run of no step, as asked)
        pass
    for name, held in (("crashed", "failed, 1 step"), ("empty", "finished, 0 step")):
        path = tmp_path / name
        with pytest.raises(FileExistsError, match=rf"{path} already holds a run \({held}\(s\) stored\); pick a new "
                                                  rf"directory, load it with workbench.load_run\('{path}'\), or delete "
                                                  "that directory to write a new run there"):
            workbench.watch(model, store=path)
    assert workbench.load_run(tmp_path / "crashed").steps == [1]
    assert workbench.load_run(tmp_path / "empty").status == "finished"


def set_written(path, when_ns):
    """Give the run database at ``path`` and its write-ahead log (if any) the modification time ``when_ns``."""
    for name in (DB_NAME, f"{DB_NAME}-wal"):
        if (path / name).exists():
            os.utime(path / name, ns=(when_ns, when_ns))


def databases_opened(monkeypatch, path):
    """The connections opened to the run database at ``path`` from now on (a list that grows)."""
    opened = []
    connect = sqlite3.connect

    def counting(database, *args, **kwargs):
        if str((path / DB_NAME).resolve()) in str(database):
            opened.append(database)
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    return opened


@pytest.mark.parametrize("how", ["open", "closed, its database's size and time restored"])
def test_a_closed_run_reads_its_database_again_only_once_it_changed_and_still_notices_a_new_run_there(
        tmp_path, monkeypatch, how):
    """A page asks each tick whether each run it lists was replaced at its path (a run that stored no step, by a new
    run at its name): a closed run opened its database every time. It is read again once its files changed - a new
    run writing there, or one that closed and left the database's size and modification time as they were."""
    path = tmp_path / "run"
    old = RunStore(path)
    old.close("failed", "the first step failed")
    set_written(path, time.time_ns() - 3600 * 10**9)  # (written an hour ago)
    opened = databases_opened(monkeypatch, path)
    assert [old.replaced() for _ in range(5)] == [False] * 5
    assert len(opened) == 1
    new = RunStore(path, metadata={"attempt": 2})
    if how != "open":
        before = os.stat(path / DB_NAME)
        new.close("failed", "its first step failed too")
        assert not (path / f"{DB_NAME}-wal").exists() or not os.stat(path / f"{DB_NAME}-wal").st_size
        os.utime(path / DB_NAME, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(path / DB_NAME).st_size == before.st_size
    assert old.replaced() and not new.replaced()
    new.close()
    assert old.replaced()  # (a path never holds the old run again)


def test_a_closed_run_written_within_a_file_clock_tick_reads_its_database_each_time(tmp_path, monkeypatch):
    """A database written as late as now (within the tick of the file system's clock) may be written again with the
    same modification time: the answer is not kept, and a new run there is noticed."""
    path = tmp_path / "run"
    old = RunStore(path)
    old.close("stopped")
    set_written(path, time.time_ns() + 3600 * 10**9)  # (as if written now, whatever the test's pace)
    opened = databases_opened(monkeypatch, path)
    assert not old.replaced() and not old.replaced() and len(opened) == 2
    written = os.stat(path / DB_NAME)
    new = RunStore(path)
    new.close("stopped")
    set_written(path, written.st_mtime_ns)
    assert old.replaced()


def test_a_run_of_a_newer_schema_or_of_none_is_never_replaced(tmp_path):
    # (a run that failed before its first step was replaced whatever wrote it: one of a newer workbench, whose
    # data this one cannot tell - a table of its own, a status of its own - was deleted by an older one)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    for name, version in (("newer", SCHEMA_VERSION + 1), ("unversioned", None)):
        path = tmp_path / name
        with pytest.raises(ZeroDivisionError):
            with workbench.watch(model, store=path):
                1 / 0
        with contextlib.closing(sqlite3.connect(path / DB_NAME)) as db, db:
            db.execute("CREATE TABLE notes (text TEXT)")  # (what the newer one keeps, beside its steps)
            db.execute("INSERT INTO notes VALUES ('kept')")
            if version is None:
                db.execute("DELETE FROM meta WHERE key = 'schema_version'")
            else:
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (json.dumps(version),))
        with pytest.raises(FileExistsError, match=rf"{path} already holds a run"):
            workbench.watch(model, store=path)
        with contextlib.closing(sqlite3.connect(path / DB_NAME)) as db:
            assert db.execute("SELECT text FROM notes").fetchall() == [("kept",)]


def test_two_writers_cannot_both_start_on_one_path(tmp_path):
    path = tmp_path / "contested"
    results = []
    barrier = threading.Barrier(4)

    def start():
        barrier.wait()
        try:
            results.append(RunStore(path))
        except FileExistsError as exc:
            results.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stores = [r for r in results if isinstance(r, RunStore)]
    assert len(stores) == 1, results  # exactly one writer won the lock; the others were told why
    assert all("already holds a run" in str(r) or "another writer" in str(r) for r in results if r not in stores)
    stores[0].close()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunStore(path)
    assert workbench.load_run(path).status == "finished"


def test_a_second_process_cannot_write_a_run_being_written(tmp_path):
    path = tmp_path / "held"
    store = RunStore(path)
    try:
        code = ("import sys; from workbench.instrument.store import RunStore\n"
                "try:\n    RunStore(sys.argv[1])\nexcept FileExistsError as e:\n    print(e); sys.exit(3)")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3 and "being written by another writer" in proc.stdout, proc.stderr
    finally:
        store.close()


def test_a_run_left_open_by_a_watch_of_this_process_is_named_with_how_to_close_it(tmp_path):
    # (a loop that raised outside a with block left its watch open; the cell run again was told only of
    # "another writer", as if another program wrote there)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "run")
    train(w, model, 1)
    with pytest.raises(FileExistsError, match=r"being written by another writer \(it holds run.lock\): a watch of "
                                              r"this process, still open .*Close that watch first - w.close\(\)"):
        workbench.watch(model, store=tmp_path / "run")
    w.close()
    assert workbench.load_run(tmp_path / "run").steps == [1]


def test_a_store_that_cannot_write_says_so_at_once_and_the_run_reads_failed(tmp_path):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    train(w, model, 2)
    assert w.recorder.flush()
    other = sqlite3.connect(tmp_path / "r" / DB_NAME)
    other.execute("DROP TABLE steps")  # a damaged database: the next writes fail
    other.close()
    with pytest.warns(RuntimeWarning, match="step 3 could not be written") as warned:
        train(w, model, 1)
        assert w.recorder.flush()
    said = str(next(m.message for m in warned if "step 3" in str(m.message)))
    assert f"the run in {tmp_path / 'r'} will be marked failed when the watch closes. Training goes on." in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same failure again: kept, not warned of step by step
        train(w, model, 3)  # training goes on
        assert w.recorder.flush()
    with pytest.warns(RuntimeWarning, match="4 steps in a row, 3 to 6, could not be written"):
        w.close()  # asks for 'finished': the store knows better
    store_errors = [e["error"] for e in w.errors if e["kind"] == "store"]
    assert len(store_errors) == 2 and store_errors[0].startswith("step 3 could not be written")
    assert [e.split(" could")[0] for e in w.store.errors[:4]] == ["step 3", "step 4", "step 5", "step 6"]
    assert w.store.errors[4] == store_errors[1]
    run = workbench.load_run(tmp_path / "r")
    assert sorted(set(run.to_pandas().step)) == [1, 2]  # each failed step was rolled back whole
    assert run.status == "failed" and "4 step(s) could not be stored" in run.metadata["error"]
    assert w.status == "failed" and "4 step(s) could not be stored" in w.error  # the watch says so too
    # and why, as the stored run does (a live page said only how many, its replay why: a full disk)
    assert w.error == run.metadata["error"] and "; the first: step 3 could not be written" in w.error


def test_a_write_lock_held_elsewhere_fails_the_step_not_the_training(tmp_path):
    store = RunStore(tmp_path / "r", timeout=0.05)
    reported = []
    store.on_error = reported.append
    holder = sqlite3.connect(tmp_path / "r" / DB_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another tool holds the write lock
    store.write(StepRecord(1, metrics={"loss": 1.0}))
    holder.execute("ROLLBACK")
    holder.close()
    store.write(StepRecord(2, metrics={"loss": 0.5}))
    store.close()
    assert len(reported) == 1 and "step 1 could not be written" in reported[0] and "locked" in reported[0]
    run = workbench.load_run(tmp_path / "r")
    assert run.steps == [2] and run.status == "failed"


def test_a_streak_of_failed_writes_is_reported_when_it_starts_and_when_it_ends(tmp_path):
    store = RunStore(tmp_path / "r", timeout=0.05)
    reported = []
    store.on_error = reported.append
    holder = sqlite3.connect(tmp_path / "r" / DB_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    for step in (1, 2, 3):
        store.write(StepRecord(step, metrics={"loss": 1.0}))
    holder.execute("ROLLBACK")
    holder.close()
    store.write(StepRecord(4, metrics={"loss": 0.5}))
    store.close()
    assert len(reported) == 2 and reported[0].startswith("step 1 could not be written")
    assert "3 steps in a row, 1 to 3, could not be written" in reported[1]
    assert reported[1].endswith("step 4 was written: writing works again")
    assert store.lost == 3 and len(store.errors) == 4  # each failed step, and the streak's end
    assert workbench.load_run(tmp_path / "r").steps == [4]


def test_a_long_streak_keeps_a_bounded_list_of_errors(tmp_path, monkeypatch):
    import workbench.instrument.store as store_module

    monkeypatch.setattr(store_module, "MAX_ERRORS", 3)
    store = RunStore(tmp_path / "r", timeout=0.05)
    reported = []
    store.on_error = reported.append
    holder = sqlite3.connect(tmp_path / "r" / DB_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    for step in range(1, 7):
        store.write(StepRecord(step, metrics={"loss": 1.0}))
    holder.execute("ROLLBACK")
    holder.close()
    store.close()
    assert store.lost == 6 and [e.split(" could")[0] for e in store.errors] == ["step 1", "step 2", "step 3"]
    assert len(reported) == 2 and "6 steps in a row, 1 to 6, could not be written" in reported[1]
    run = workbench.load_run(tmp_path / "r")
    assert run.status == "failed" and "6 step(s) could not be stored; the first: step 1" in run.metadata["error"]


def test_bad_store_paths_are_refused_and_leave_nothing_behind(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="store='' names no directory"):
        workbench.watch(model, store="")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=f"Cannot create the run directory {tmp_path}/file/a/b"):
        workbench.watch(model, store=tmp_path / "file" / "a" / "b")
    with pytest.raises(FileExistsError, match="is a file, not a directory"):
        workbench.watch(model, store=tmp_path / "file")
    with pytest.raises(TypeError, match="store must be a directory path"):
        workbench.watch(model, store=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    assert installed_hooks()["_global_forward_hooks"] == 0  # the refused watches took their hooks out


WRITER_AS_NOBODY = textwrap.dedent("""
    import os, sys, torch, workbench
    if os.geteuid() == 0:  # root writes anywhere: as nobody, who cannot write the directory
        os.setgid(65534); os.setuid(65534)
    try:
        workbench.watch(torch.nn.Linear(2, 2), store=sys.argv[1])
    except OSError as e:
        print(type(e).__name__, e)
    print("hooks", len(torch.nn.modules.module._global_forward_hooks))
""")


@pytest.mark.parametrize("where", ["in", "under"])
def test_a_store_in_a_directory_that_cannot_be_written_is_refused_before_anything_is_hooked(where):
    root = tempfile.mkdtemp()
    try:
        os.chmod(root, 0o755)
        locked = os.path.join(root, "locked")
        os.mkdir(locked, 0o555)  # (readable, not writable, by others than its owner, root)
        os.chmod(locked, 0o555)
        store = locked if where == "in" else os.path.join(locked, "runs", "a")
        proc = subprocess.run([sys.executable, "-c", WRITER_AS_NOBODY, store], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        expected = "it is" if where == "in" else f"{locked}, where it would be made, is"
        assert proc.stdout.splitlines() == [
            f"PermissionError Cannot write a run into {store}: {expected} not writable. Pick a directory you can "
            "write to.", "hooks 0"]
        assert os.listdir(locked) == []
    finally:
        os.chmod(os.path.join(root, "locked"), 0o755)
        shutil.rmtree(root)


READER = textwrap.dedent("""
    import os, sys, workbench
    if os.geteuid() == 0:  # root writes anywhere: read as nobody, who cannot write the run's directory
        os.setgid(65534); os.setuid(65534)
    try:
        run = workbench.load_run(sys.argv[1])
        print(run.status, len(run.steps), len(run.to_pandas()))
    except workbench.RunError as e:
        print(e)
""")


@contextlib.contextmanager
def read_only_run(steps, leftover_wal=False):
    """A stored run in a directory its readers cannot write (mode 555, files 444); yields
    ``(path, what a reader in another process prints)``."""
    root = tempfile.mkdtemp()
    path = os.path.join(root, "run")
    try:
        os.chmod(root, 0o755)
        small_run(path, steps=steps)
        if leftover_wal:
            with open(os.path.join(path, DB_NAME + "-wal"), "wb") as wal:
                wal.write(b"\0" * 64)  # steps a killed writer left in its WAL
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)
        proc = subprocess.run([sys.executable, "-c", READER, path], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        yield path, proc.stdout
    finally:
        if os.path.isdir(path):
            os.chmod(path, 0o755)
        shutil.rmtree(root)


def test_a_finished_run_in_a_read_only_directory_opens():
    with read_only_run(3) as (path, printed):
        os.chmod(path, 0o755)
        expected = len(workbench.load_run(path).to_pandas())
        assert printed.split() == ["finished", "3", str(expected)]


def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path, monkeypatch):
    # (load_run("") opened the current directory when it held a run, and list_runs("") and export("") took
    # it as the working directory too)
    small_run(tmp_path, steps=1)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunError, match=r"The path of a run is empty \(''\): give the directory of a run"):
        workbench.load_run("")
    with pytest.raises(RunError, match="The path of a run is empty"):
        workbench.compare_runs(["", "."])
    with pytest.raises(ValueError, match=r"list_runs\(\) got an empty path \(''\).*pass '\.'"):
        workbench.list_runs("")
    run = workbench.load_run(".")  # (the current directory, asked for)
    with pytest.raises(ValueError, match=r"export\(\) got an empty path \(''\)"):
        run.export("")
    assert not list(tmp_path.glob("*tfevents*"))


READER_AS_NOBODY = textwrap.dedent("""
    import os, sys, workbench
    if os.geteuid() == 0:  # root reads anything: as nobody, whom the permissions keep out
        os.setgid(65534); os.setuid(65534)
    for path in sys.argv[1:]:
        try:
            workbench.load_run(path)
            print("opened")
        except workbench.RunError as e:
            print("RunError", e)
    try:
        workbench.list_runs(sys.argv[1])
    except PermissionError as e:
        print("PermissionError", e)
""")


def test_a_run_this_user_cannot_read_says_which_folder_or_file_and_to_check_its_permissions():
    # (a bare PermissionError, or, for an unreadable run.sqlite, "damaged or not a workbench run database")
    root = tempfile.mkdtemp()
    closed, unreadable, inside = (os.path.join(root, name) for name in ("closed", "unreadable", "shut"))
    try:
        os.chmod(root, 0o755)
        for path in (closed, unreadable, os.path.join(inside, "run")):
            small_run(path, steps=1)
        # (no permission for anyone, the owner included: the reader may be the owner, when not run as root)
        os.chmod(closed, 0o000)
        os.chmod(os.path.join(unreadable, DB_NAME), 0o000)
        os.chmod(inside, 0o600)  # (a folder above the run that cannot be entered: read, not execute)
        proc = subprocess.run([sys.executable, "-c", READER_AS_NOBODY, closed, unreadable,
                               os.path.join(inside, "run")], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        said = proc.stdout.splitlines()
        for line, given, denied in zip(said, (closed, unreadable, os.path.join(inside, "run")),
                                       (closed, os.path.join(unreadable, DB_NAME), inside)):
            assert line.startswith(f"RunError {given} cannot be read: permission denied on {denied}. Check the "
                                   f"permissions (ls -ld {denied})"), line
            assert "r-x" in line and "chmod -R a+rX" in line
        assert said[3] == (f"PermissionError {closed} cannot be searched for runs: permission denied (ls -ld "
                           f"{closed}). Listing it takes read and execute permission (r-x) on it; have them "
                           "granted, or list a folder you can read.")  # (not an empty table of runs)
        assert len(said) == 4
    finally:
        for path in (root, closed, inside):
            if os.path.isdir(path):
                os.chmod(path, 0o755)
        shutil.rmtree(root)


LISTER_AS_NOBODY = textwrap.dedent("""
    import os, sys, workbench
    if os.geteuid() == 0:  # root reads anything: as nobody, whom the permissions keep out
        os.setgid(65534); os.setuid(65534)
    try:
        workbench.list_runs(sys.argv[1])
    except OSError as e:
        print(type(e).__name__, e)
""")


def test_list_runs_of_a_folder_under_one_this_user_cannot_enter_names_that_folder():
    # (a bare "[Errno 13] Permission denied: '.../shut/runs'", from looking whether it is a directory)
    root = tempfile.mkdtemp()
    inside = os.path.join(root, "shut")
    try:
        os.chmod(root, 0o755)
        small_run(os.path.join(inside, "runs", "a"), steps=1)
        os.chmod(inside, 0o600)  # (read, not execute: what is in it cannot be looked at)
        runs = os.path.join(inside, "runs")
        proc = subprocess.run([sys.executable, "-c", LISTER_AS_NOBODY, runs], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            f"PermissionError {runs} cannot be searched for runs: permission denied on {inside} (ls -ld {inside}). "
            "Listing it takes execute permission (x) on the folders above it and read and execute permission (r-x) "
            "on it; have them granted, or list a folder you can read."]
    finally:
        os.chmod(inside, 0o755)
        shutil.rmtree(root)


def test_compare_runs_wants_a_list(tmp_path):
    small_run(tmp_path / "good", steps=1)
    with pytest.raises(TypeError, match="takes a list of runs, got the single run '.*good'"):
        workbench.compare_runs(str(tmp_path / "good"))


def test_close_waits_for_the_writer_and_reads_failed_when_a_step_was_lost(tmp_path):
    recorder = workbench.Recorder()
    store = RunStore(tmp_path / "r", timeout=0.3)
    store.attach(recorder)
    holder = sqlite3.connect(tmp_path / "r" / DB_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another tool holds the write lock past the store's timeout
    recorder.publish(StepRecord(1, metrics={"loss": 1.0}))
    time.sleep(0.6)
    holder.execute("ROLLBACK")
    holder.close()
    recorder.publish(StepRecord(2, metrics={"loss": 0.5}))
    store.close()  # waits for step 2 to be written, then writes the status
    run = workbench.load_run(tmp_path / "r")
    assert run.steps == [2]
    assert run.status == "failed" and "1 step(s) could not be stored" in run.metadata["error"]


def test_a_killed_run_on_read_only_media_says_to_copy_it():
    with read_only_run(2, leftover_wal=True) as (_, printed):
        assert "Copy the run directory somewhere writable" in printed


def test_stored_histograms_keep_their_ranges_and_sampled_flags_and_older_runs_still_load(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 512), nn.ReLU())  # layers.0's output: 300 x 512 values, sampled
    x = torch.randn(300, 4)
    with workbench.watch(model, histograms=True, bins=16, store=tmp_path / "run", gradients=False) as w:
        for _ in range(3):
            model(x)
            w.step()
    live = w.histograms()
    stored = workbench.load_run(tmp_path / "run").histograms()
    assert len(stored) == len(live) > 0
    for (_, a), (_, b) in zip(live.iterrows(), stored.iterrows()):
        np.testing.assert_allclose(a.edges, b.edges, rtol=1e-12)
        np.testing.assert_array_equal(a.counts, b.counts)
        assert a.sampled == b.sampled
    big = stored[(stored.module == "0") & (stored.kind == "activation")]
    assert big.sampled.all() and not stored[stored.kind == "param"].sampled.any()
    assert big.counts.map(np.sum).tolist() == pytest.approx([300 * 512] * 3, rel=1e-6)
    # a run stored before the flag existed: its histograms table has no 'sampled' column
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "run", old)
    with sqlite3.connect(old / DB_NAME) as db:
        db.executescript("CREATE TABLE h AS SELECT step, seq, lo, hi, counts FROM histograms; "
                         "DROP TABLE histograms; ALTER TABLE h RENAME TO histograms;")
    before = workbench.load_run(old).histograms()
    assert not before.sampled.any() and before.counts.map(np.sum).tolist() == stored.counts.map(np.sum).tolist()


def test_a_run_directory_removed_while_written_is_reported_not_written_on_silently(tmp_path):
    # (sqlite wrote on into the database it held open, no longer in any directory: every later step
    # was lost without a word)
    model = nn.Linear(3, 2)
    w = workbench.watch(model, store=tmp_path / "run")
    for _ in range(2):
        model(torch.randn(4, 3)).sum().backward()
        w.step(loss=1.0)
    assert w.recorder.flush()  # (the two steps written)
    shutil.rmtree(tmp_path / "run")
    with pytest.warns(RuntimeWarning, match="step 3 could not be written.*database was deleted"):
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=1.0)
        assert w.recorder.flush()
    with pytest.warns(RuntimeWarning, match="3 steps in a row, 3 to 5, could not be written"):
        w.close()
    assert [e["kind"] for e in w.errors] == ["store", "store"] and "3 to 5" in w.errors[1]["error"]


def test_a_run_directory_moved_while_written_is_written_on_where_it_went(tmp_path, monkeypatch):
    model = nn.Linear(3, 2)
    monkeypatch.chdir(tmp_path)
    w = workbench.watch(model, store="run")  # (a relative path; the working directory changes on the way)
    model(torch.randn(4, 3)).sum().backward()
    w.step(loss=1.0)
    assert w.recorder.flush()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    shutil.move(tmp_path / "run", tmp_path / "moved")
    for _ in range(2):
        model(torch.randn(4, 3)).sum().backward()
        w.step(loss=1.0)
    w.close()
    assert not w.errors
    run = workbench.load_run(tmp_path / "moved")
    assert run.steps == [1, 2, 3] and run.status == "finished"


def test_a_status_that_cannot_be_written_is_warned_of_as_an_interrupted_run_not_a_failed_one(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    train(w, model, 1)

    def unwritable(**values):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(w.store, "set_meta", unwritable)
    with pytest.warns(RuntimeWarning, match="could not be written") as warned:
        w.close()
    said = str(next(m.message for m in warned if "status" in str(m.message)))
    assert "readers will read it as interrupted" in said and "marked failed" not in said
    assert workbench.load_run(tmp_path / "r").status == "interrupted"


class LockDescriptors(torch.utils.data.Dataset):
    """Each item: an input, and how many of the DataLoader worker's descriptors are open on a run's lock file."""

    def __len__(self):
        return 16

    def __getitem__(self, index):
        from workbench.instrument.store import LOCK_NAME

        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{fd}").endswith(LOCK_NAME)
        return torch.randn(3), count


def forked_loader():
    return torch.utils.data.DataLoader(LockDescriptors(), batch_size=4, num_workers=2, persistent_workers=True,
                                       multiprocessing_context="fork")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="the workers' descriptors are read in /proc")
def test_forked_dataloader_workers_neither_hold_nor_let_go_of_the_run_s_lock(tmp_path):
    # (a forked worker held the parent's lock: a run closed while its workers lived stayed locked, refusing a
    # new run at its directory with "being written by another writer", until the last worker ended)
    from workbench.instrument.store import lock_held

    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    loader, held = forked_loader(), []
    for epoch in range(2):  # (the workers, forked as the first epoch starts, live on: persistent_workers)
        for x, count in loader:
            model(x).sum().backward()
            w.step(loss=1.0)
            held += count.tolist()
            assert lock_held(tmp_path / "r", unreadable=False)  # (the parent's, whatever its workers did)
    assert held == [0] * 32  # no worker holds the lock (16 items an epoch)
    w.close()
    assert not lock_held(tmp_path / "r", unreadable=False)  # let go of with the run, its workers alive
    assert not any(e["kind"] == "store" for e in w.errors)
    run = workbench.load_run(tmp_path / "r")
    assert run.status == "finished" and run.steps == list(range(1, 9))

    closed_early = workbench.watch(model, store=tmp_path / "s")
    loader = forked_loader()
    next(iter(loader))  # (workers forked while that run is open)
    closed_early.close("failed", "the data could not be read")  # before its first step: a retry replaces it
    again = workbench.watch(model, store=tmp_path / "s")
    train(again, model, 2)
    again.close()
    del loader
    assert workbench.load_run(tmp_path / "s").status == "finished"
    assert workbench.load_run(tmp_path / "r").status == "finished"  # (no worker closed it as it ended)
    assert workbench.load_run(tmp_path / "r").steps == list(range(1, 9))


def lock_descriptors() -> int:
    """How many of this process's descriptors are open on a run's lock file."""
    from workbench.instrument.store import LOCK_NAME

    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").endswith(LOCK_NAME)
    return count


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/fd"),
                    reason="the child's descriptors are read in /proc")
def test_a_child_forked_as_a_store_starts_holds_no_lock(tmp_path, monkeypatch):
    # (a fork from another thread while a store started - its lock taken, its database being made, which waits up
    # to the timeout for a busy database - left the child holding the lock: the run stayed locked until it ended)
    import workbench.instrument.store as store_module

    real, told = store_module._check_no_run, []

    def fork_here(path, locked=False):  # (the moment after the lock is taken)
        if locked and not told:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(write, str(lock_descriptors()).encode())
                os._exit(0)
            os.close(write)
            told.append(int(os.read(read, 16)))
            os.close(read)
            os.waitpid(pid, 0)
        return real(path, locked=locked)

    monkeypatch.setattr(store_module, "_check_no_run", fork_here)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    train(w, model, 1)
    w.close()
    assert told == [0]
    assert workbench.load_run(tmp_path / "r").status == "finished"


def in_forked_child(work):
    """Run ``work()`` in a child forked from here: {"returned": what it returned (JSON values), "warnings": the
    messages of the warnings it gave}, or {"raised": the error it raised}."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = {"returned": work(), "warnings": [str(c.message) for c in caught]}
        except BaseException as exc:
            result = {"raised": repr(exc)}
        with os.fdopen(write, "w") as out:
            json.dump(result, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        answer = got.read()
    os.waitpid(pid, 0)
    return json.loads(answer) if answer else {"raised": "the child ended without an answer (killed: it hung)"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a child is forked")
@pytest.mark.parametrize("every", [1, 2])  # (2: forked as a step not recorded runs, its module hooks out)
def test_a_watch_used_in_a_forked_child_records_nothing_there_and_says_so_once(tmp_path, every):
    # (it recorded into the child's memory alone, silently, its steps lost with the child; closing it there waited
    # 10 s for the store's writer thread, which a fork does not copy)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    unwatched = installed_hooks(model)
    w = workbench.watch(model, store=tmp_path / "r", every=every)
    train(w, model, 2)  # (the child is forked as step 3 starts: recorded with every=1, not with every=2)
    rows = len(w.to_pandas())

    def child():
        ended = []
        for _ in range(3):
            model(torch.randn(8, 3)).square().mean().backward()
            ended.append(w.step(loss=2.0))
        w.log(accuracy=0.5)
        w.close()
        return {"ended": [record is None for record in ended], "rows": len(w.to_pandas()), "closed": w.closed,
                "hooks as unwatched": installed_hooks(model) == unwatched}

    got = in_forked_child(child)
    assert got["returned"] == {"ended": [True] * 3, "rows": rows, "closed": True, "hooks as unwatched": True}
    [message] = got["warnings"]
    assert f"forked from the process (pid {os.getpid()}) that made the watch" in message
    assert str(tmp_path / "r") in message and "workbench.watch(model, store=" in message
    assert "watch_distributed" in message
    train(w, model, 2)  # the parent records on, its steps numbered on
    w.close()
    run = workbench.load_run(tmp_path / "r")
    assert run.status == "finished" and run.metrics(long=True).empty
    assert run.steps == ([1, 2, 3, 4] if every == 1 else [1, 3])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a child is forked")
def test_a_child_forked_while_the_store_s_writer_holds_its_queue_s_lock_does_not_hang(tmp_path):
    # (the hazard of Python 3.12's "multi-threaded, use of fork() may lead to deadlocks" warning: a lock another
    # thread held as the process forked stays held in the child for ever. The child's w.step() queued its step
    # for the store under that lock, and hung)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    train(w, model, 1)
    [writer] = w.recorder.subscriptions  # the store's

    def child():
        signal.alarm(30)  # (a hang ends the child, unanswered)
        train(w, model, 2)
        w.close()
        return "done"

    with writer._work:  # (as its thread holds it, gathering the steps queued)
        got = in_forked_child(child)
    assert got["returned"] == "done"
    train(w, model, 1)
    w.close()
    assert workbench.load_run(tmp_path / "r").steps == [1, 2]


class RunsTheModel(torch.utils.data.Dataset):
    """Each item: the watched model's output for an input, and the warnings the DataLoader worker gave making it."""

    def __init__(self, model):
        self.model = model

    def __len__(self):
        return 8

    def __getitem__(self, index):
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            out = self.model(torch.randn(3))
        return out, " | ".join(str(c.message) for c in caught)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the workers are forked")
def test_a_dataloader_worker_running_the_watched_model_says_once_that_it_records_nothing(tmp_path):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    loader = torch.utils.data.DataLoader(RunsTheModel(model), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")
    said = [message for _, messages in loader for message in messages if message]
    assert len(said) == 2  # one a worker, at its first call of the model
    assert all("A watch records in the process that made it" in message for message in said)
    model(torch.randn(4, 3)).sum().backward()
    w.step()
    w.close()
    assert workbench.load_run(tmp_path / "r").steps == [1]


class WatchedInItsWorker(torch.utils.data.Dataset):
    """Each item: the warnings a DataLoader worker gave running the model, which its worker_init_fn watches."""

    def __init__(self, model):
        self.model = model

    def __len__(self):
        return 4

    def __getitem__(self, index):
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            self.model(torch.randn(3))
            WorkerWatch.watch.step()
        return " | ".join(str(c.message) for c in caught)


class WorkerWatch:
    watch = None

    @staticmethod
    def start(worker_id, root):
        import multiprocessing.util

        WorkerWatch.watch = workbench.watch(torch.utils.data.get_worker_info().dataset.model,
                                            store=root / f"worker{worker_id}")
        multiprocessing.util.Finalize(None, WorkerWatch.watch.close, exitpriority=0)  # (closed as the worker ends)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the workers are forked")
def test_a_worker_that_watches_the_model_itself_as_advised_is_not_told_it_runs_unwatched(tmp_path):
    # (the warning advised a watch in the worker_init_fn, then warned the worker that followed it that its model
    # "runs unwatched here", at the first call, in each worker)
    import functools

    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "main")
    loader = torch.utils.data.DataLoader(WatchedInItsWorker(model), batch_size=2, num_workers=1,
                                         multiprocessing_context="fork",
                                         worker_init_fn=functools.partial(WorkerWatch.start, root=tmp_path))
    assert [said for said in loader] == [["", ""], ["", ""]]
    w.close()
    worker_run = workbench.load_run(tmp_path / "worker0")
    assert worker_run.steps == [1, 2, 3, 4] and worker_run.status == "finished"  # (a step an item)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="children are forked")
def test_a_child_of_a_forked_child_is_told_too(tmp_path):
    # (the child's warning was copied as given into its own child, which said nothing)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")

    def grandchild():
        model(torch.randn(2, 3))
        w.step()
        return os.getpid()

    def child():
        model(torch.randn(2, 3))
        return in_forked_child(grandchild)

    got = in_forked_child(child)
    [told_child] = got["warnings"]
    told_grandchild = got["returned"]["warnings"]
    assert len(told_grandchild) == 1 and f"this process (pid {got['returned']['returned']})" in told_grandchild[0]
    assert "A watch records in the process that made it" in told_child

    def child_watching():  # (its own watch of the model, as advised, is forked off in its child in turn)
        own = workbench.watch(model, store=tmp_path / "child")
        model(torch.randn(2, 3))
        told = in_forked_child(lambda: model(torch.randn(2, 3)) is not None)
        own.close()
        return told

    got = in_forked_child(child_watching)
    assert got["warnings"] == []
    told = got["returned"]["warnings"]
    assert len(told) == 2 and str(tmp_path / "r") in told[0] + told[1] and str(tmp_path / "child") in told[0] + told[1]
    w.close()


def test_a_closing_watch_says_running_until_its_status_is_final(tmp_path):
    # a dashboard ends on the watch's status: one read while the store's last writes fail would be 'finished'
    # for a watch that ends 'failed' (the store lost steps), and the dashboard would keep the wrong one
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(model, store=tmp_path / "r")
    seen = []

    class Observer:  # closed after the store: its steps written (or lost) by then
        def close(self, status, error):
            seen.append((w.closed, w.status))

    w.add_sink(Observer())
    train(w, model, 1)
    assert w.recorder.flush()
    other = sqlite3.connect(tmp_path / "r" / DB_NAME)
    other.execute("DROP TABLE steps")  # a damaged database: the next writes fail
    other.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (each failed write is warned of, as tested above)
        train(w, model, 1)
        w.close()
    assert seen == [(True, "running")]
    assert w.status == "failed" and "could not be stored" in w.error
