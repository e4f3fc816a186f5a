"""What a user may call on an experiment while a background run (``exp.start``) trains it."""

import pytest

import workbench


def small(seed=0):
    return workbench.experiments.create("efficientzero_dynamics", seed=seed, batch_size=8)


def test_evaluate_refuses_while_a_background_run_trains_and_is_safe_once_it_is_paused(tmp_path):
    alone = [m["loss"] for m in small().run(6, progress=False)]
    exp = small()
    run = exp.start(6, store=tmp_path / "run")
    run.pause()
    try:
        assert exp.evaluate(batch_size=4)["loss"] > 0  # paused between two steps: allowed
        run.resume()
        refused = 0
        while not run.done:  # what the user's loop did: never an evaluation in the middle of a step
            try:
                exp.evaluate(batch_size=4)
            except RuntimeError as err:
                assert "run.pause()" in str(err) and "run.join()" in str(err)
                refused += 1
        assert refused
    finally:
        run.stop()
    assert run.status == "finished"
    assert [m["loss"] for m in run.history] == alone  # the training is that of its seed alone
    stored = workbench.load_run(tmp_path / "run")
    assert sorted(stored.metrics().step.tolist()) == list(range(1, 7)) and not len(stored.errors())
    assert exp.evaluate(batch_size=4)["loss"] > 0  # ended: free again


def test_step_and_watch_refuse_while_a_background_run_trains():
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(10_000)
    try:
        with pytest.raises(RuntimeError, match=r"training in the background .*step\(\) would interleave"):
            exp.step()
        run.pause()
        with pytest.raises(RuntimeError, match=r"step\(\) would interleave"):  # paused too: its count
            exp.step()
        with pytest.raises(RuntimeError, match=r"watch\(\) would interleave"):
            exp.watch()
    finally:
        run.stop()
    assert run.step == exp.step_count == len(run.history)


def test_a_background_run_reports_its_own_last_step_not_those_of_later_runs():
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(40)
    assert run.join() == "finished" and run.step == 40
    exp.run(5, progress=False)
    assert exp.step_count == 45
    assert run.step == run.total == 40
    assert "step 40 of 40" in repr(run)


def test_a_run_stopped_by_the_process_exiting_says_so_in_its_store(tmp_path):
    # (its store said "stopped by the user after step N": nobody had pressed Stop)
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = ("import time, workbench\n"
              "exp = workbench.experiments.create('activation_mlp', width=4, n_samples=32, batch_size=8)\n"
              f"run = exp.start(10**9, store={str(tmp_path / 'run')!r}, histograms=False)\n"
              "while run.step < 2:\n    time.sleep(0.01)\n")
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stored = workbench.load_run(tmp_path / "run")
    assert stored.status == "stopped" and "stopped as the process exited after step" in stored.metadata["error"]


def test_running_lists_the_runs_in_progress_also_one_no_name_holds_any_more(tmp_path):
    # a notebook cell "exp = create(...); run = exp.start(...)" run twice: the first run goes on, named by nothing
    first = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64, seed=1)
    first.start(100_000, store=tmp_path / "first")
    second = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64, seed=2)
    run = second.start(100_000)
    try:
        mine = [r for r in workbench.experiments.running() if r.experiment in (first, second)]
        assert [r.experiment for r in mine] == [first, second]  # the first started first
        orphan = mine[0]
        assert orphan.stop() == "stopped"
        assert orphan not in workbench.experiments.running() and run in workbench.experiments.running()
    finally:
        run.stop()
    assert run not in workbench.experiments.running()
    assert workbench.load_run(tmp_path / "first").status == "stopped"  # its store says so


def test_running_leaves_out_a_run_that_has_ended_while_its_callbacks_still_run():
    import threading

    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(100_000)
    in_callback, leave = threading.Event(), threading.Event()
    run.on_done(lambda r: (in_callback.set(), leave.wait(30)))
    run.stop(wait=False)
    try:
        assert in_callback.wait(60)
        assert run.status == "stopped" and not run.done  # (its callbacks run: not done yet)
        assert run not in workbench.experiments.running()
    finally:
        leave.set()
    run.join()


def test_resume_returns_the_status_as_pause_and_stop_do():
    """``run.resume()`` returned None: a cell's ``run.resume()`` of a run stopped said nothing, though the run
    did not go on (``run.pause()`` and ``run.stop()`` return the status)."""
    run = small().start(100_000)
    try:
        assert run.pause() == "paused"
        assert run.resume() == "running"
    finally:
        assert run.stop() == "stopped"
    assert run.resume() == "stopped" and run.status == "stopped"
