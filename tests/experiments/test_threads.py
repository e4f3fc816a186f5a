"""Experiments on several threads at once (the app runs each session's run on a thread of its own)."""

import threading

import pytest
import torch


import workbench
from workbench.instrument.torch_internals import installed_hooks
from tests.threads import at_once


def train(seed, barrier=None):
    if barrier is not None:
        barrier.wait()
    exp = workbench.experiments.create("activation_mlp", seed=seed, width=16, depth=2, n_samples=256)
    initial = [p.detach().clone() for p in exp.model.parameters()]
    return initial, exp.run(6, every=2)


def test_experiments_on_several_threads_give_what_they_give_alone():
    """Initialisation and dropout draw from torch's global generator, which every thread shares:
    each experiment's numbers must still be those of its seed alone."""
    alone = {seed: train(seed) for seed in range(4)}
    together = at_once(train, range(4))
    for seed, (initial, metrics) in together.items():
        assert all(torch.equal(a, b) for a, b in zip(initial, alone[seed][0]))
        assert metrics == alone[seed][1]
    assert alone[0][1] != alone[1][1]  # (the seeds do differ)


def test_a_background_run_refuses_a_bad_timeout_before_it_stops(monkeypatch):
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(10_000)
    try:
        with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0, got 'x'"):
            run.stop(timeout="x")
        assert run.status == "running"  # refused before anything changed
    finally:
        assert run.stop() == "stopped"


def test_a_background_run_that_cannot_start_closes_the_watch_it_made(monkeypatch, tmp_path):
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        exp.start(5, store=tmp_path / "run")  # (the store's writer thread is refused first)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        exp.start(5, every=2)  # (the run's thread is)
    monkeypatch.undo()
    assert workbench.load_run(tmp_path / "run").status == "failed"
    assert exp.watcher.closed and installed_hooks()["_global_forward_hooks"] == 0
    assert exp.run(2, every=1)  # the experiment is not left watched


def test_background_runs_of_one_seed_started_together_give_what_one_gives_alone():
    """Two runs of one seed trained side by side (``exp.start`` twice, then both followed in a
    notebook) are the run of that seed: the same metrics and the same recorded rows as one alone."""
    def make():
        return workbench.experiments.create("activation_mlp", seed=0, width=16, depth=2, n_samples=256)

    alone = make().start(30)
    alone.join()
    together = [make().start(30) for _ in range(2)]
    for run in together:
        assert run.join() == "finished"
    expected = alone.watch.to_pandas()
    for run in together:
        assert run.history == alone.history
        assert run.watch.to_pandas().equals(expected)  # (the curves of the views: every statistic)


def test_an_experiment_made_while_another_thread_builds_models_has_the_weights_of_its_seed():
    """Parameter initialisation draws from torch's global generator, and so does building any
    registered model: the app's Models tab of another session builds on a thread of its own while a
    session's experiment is made. Every build takes turns there with the experiments."""
    def weights():
        exp = workbench.experiments.create("activation_mlp", seed=0, width=64, depth=4, n_samples=64)
        return [p.detach().clone() for p in exp.model.parameters()]

    alone = weights()
    stop = threading.Event()

    def build():
        while not stop.is_set():
            workbench.create_model("mlp", width=64, depth=4)

    builder = threading.Thread(target=build)
    builder.start()
    try:
        made = [weights() for _ in range(20)]
    finally:
        stop.set()
        builder.join()
    differ = [i for i, each in enumerate(made) if not all(torch.equal(a, b) for a, b in zip(alone, each))]
    assert differ == []


def test_a_stopped_background_run_says_what_stopped_it_as_its_watch_and_store_do(tmp_path):
    """run.error was None while its watch's error (and its store's) said "stopped by the user after step N"."""
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(10_000, store=tmp_path / "run")
    run.pause()  # (between two steps: the step it stops after is known)
    step = run.step
    assert run.stop() == "stopped"
    said = f"stopped by the user after step {step}"
    assert run.error == run.watch.error == workbench.load_run(tmp_path / "run").metadata["error"] == said
    finished = exp.start(1)
    assert finished.join() == "finished" and finished.error is None and finished.watch.error is None


def test_a_background_run_whose_sink_cannot_close_fails_as_its_watch_and_store_say(tmp_path):
    """The sink's error escaped the run's thread (an unhandled thread exception) and run.status read 'stopped'
    while the store said failed: now all three say failed, naming the sink's error."""

    class BrokenSink:
        def close(self, status, error=None):
            raise OSError("disk gone")

    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    run = exp.start(10_000, store=tmp_path / "run")
    run.pause()
    run.watch.add_sink(BrokenSink())
    assert run.stop() == "failed"
    said = f"stopped by the user after step {run.step}\nclosing the sink BrokenSink failed: OSError: disk gone"
    assert run.error == run.watch.error == workbench.load_run(tmp_path / "run").metadata["error"] == said
