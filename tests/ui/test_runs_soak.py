"""Soak: four runs with stores at once, stopped at random, while several pages attach, watch and detach.

Every run must end with an honest status (finished exactly when it ran all its steps, else
stopped), its store must hold the steps it ran, contiguous from 1, with the status it ended
with, and no page or run may raise.
"""

import random
import threading
import time

import pytest

from workbench.instrument import load_run
from workbench.ui import live_run, run_control
from workbench.ui.runs import RunManager

pytestmark = pytest.mark.slow

TINY = {"width": "4", "depth": "1", "batch_size": "8", "n_samples": "64"}
RUNS, STEPS, PAGES = 4, 400, 3


def test_concurrent_runs_with_random_stops_and_pages_coming_and_going(tmp_path):
    manager = RunManager(tmp_path / "runs")
    rng = random.Random(25)
    failures: list[str] = []
    started: list[live_run.LiveRun] = []
    barrier = threading.Barrier(RUNS)

    def start(i):  # four pages press Start at once
        barrier.wait()
        run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), i, STEPS, 1, False, "*", f"soak/{i}")
        if run is None:
            failures.append(f"run {i} did not start: {message}")
        else:
            started.append(run)

    starters = [threading.Thread(target=start, args=(i,)) for i in range(RUNS)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(60)
    assert not failures, failures
    assert len(started) == RUNS

    done = threading.Event()
    views = [0] * PAGES

    def page(n):  # a page that reloads now and then: attach to a random run, watch it, detach
        local = random.Random(n)
        try:
            while not done.is_set():
                choices = run_control.run_choices(manager)
                attached, _ = run_control.attach(manager, local.choice(choices)[1])
                for _ in range(local.randint(1, 4)):
                    status, metrics, series, note, latest, anomalies, going = run_control.run_views(
                        manager, attached, "grad_output", "norm", "*")
                    assert "step" in status and isinstance(going, bool)
                    views[n] += 1
                    time.sleep(0.05)
                run_control.runs_frame(manager)
                run_control.detach(manager, attached)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"page {n}: {type(exc).__name__}: {exc}")

    pages = [threading.Thread(target=page, args=(n,)) for n in range(PAGES)]
    for t in pages:
        t.start()
    # two runs are stopped at random moments, from a page (by id), the others run to the end
    to_stop = rng.sample(started, 2)
    for run in to_stop:
        time.sleep(rng.uniform(0.05, 1.0))
        run_control.stop_run(manager, run.id)
    deadline = time.monotonic() + 120
    for run in started:
        run.join(max(0.0, deadline - time.monotonic()))
    done.set()
    for t in pages:
        t.join(30)
    manager.close()

    assert not failures, failures
    assert all(views), views  # every page saw its runs
    for i, run in enumerate(sorted(started, key=lambda r: r.seed)):
        ran = run.experiment.step_count
        assert run.outcome == ("finished" if ran == STEPS else "stopped"), (run.label, run.outcome, ran)
        if run not in to_stop:
            assert run.outcome == "finished" and ran == STEPS
        assert run.error is None and run.watch.errors == [], (run.label, run.error, run.watch.errors)
        stored = load_run(tmp_path / "runs" / "soak" / str(i))
        assert stored.status == run.outcome
        assert stored.steps == list(range(1, ran + 1)), (run.label, ran, stored.steps[-3:])
        assert list(stored.metrics().step) == list(range(1, ran + 1))
        rows = stored.to_pandas().groupby("step").size()
        assert rows.nunique() == 1, f"{run.label}: steps with different numbers of rows: {rows.value_counts()}"
    assert sum(r.outcome == "stopped" for r in started) >= 1
