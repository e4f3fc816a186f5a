"""The Recorder: bounded buffer, subscribers that never hold training up."""

import threading
import time
import warnings

import numpy as np
import pytest

from workbench.instrument import Recorder, StepRecord


def record(step, rows=2):
    keys = tuple((f"m{i}", 0, "activation", "out", (3,)) for i in range(rows))
    sums = np.tile([0.0, 0.0, 3.0, 1.0, 1.0, 3.0, 0.0, 0.0, 1.0], (rows, 1))  # three ones (sums of x - 1)
    return StepRecord(step, keys, np.full(rows, 3), sums, metrics={"loss": float(step)})


def test_the_buffer_is_bounded_by_rows_and_counts_evictions():
    recorder = Recorder(max_rows=10)
    for step in range(1, 6):
        recorder.publish(record(step, rows=2))
    expected = r"holds 10 rows \(max_rows\).*start at step 2.*store=.*max_rows="
    with pytest.warns(RuntimeWarning, match=expected) as caught:
        for step in range(6, 21):
            recorder.publish(record(step, rows=2))
    assert len(caught) == 1  # once, at the first eviction
    assert [r.step for r in recorder.records()] == list(range(16, 21))
    assert recorder.evicted == 15
    frame = recorder.to_pandas()
    assert len(frame) == 10 and frame["mean"].eq(1.0).all() and frame["std"].eq(0.0).all()
    with pytest.raises(ValueError, match="max_rows"):
        Recorder(max_rows=-1)


def test_a_recorder_of_no_rows_keeps_nothing_and_streams_every_step_without_a_warning():
    recorder = Recorder(max_rows=0)
    got = []
    recorder.subscribe(lambda update: got.extend(update.steps))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(1, 6):
            recorder.publish(record(step))
        recorder.flush()
    assert got == [1, 2, 3, 4, 5]
    assert recorder.records() == [] and recorder.to_pandas().empty and recorder.evicted == 0


def test_a_slow_subscriber_gets_coalesced_updates_and_never_blocks_publishing():
    recorder = Recorder()
    release = threading.Event()
    updates = []

    def slow(update):
        release.wait(10)
        updates.append(update)

    sub = recorder.subscribe(slow, max_pending=5)
    start = time.perf_counter()
    for step in range(1, 51):
        recorder.publish(record(step))
    publishing = time.perf_counter() - start
    release.set()
    assert sub.flush(10)
    delivered = [s for u in updates for s in u.steps]
    assert delivered == sorted(delivered) and delivered[-1] == 50  # in order, up to the newest
    assert sum(u.dropped for u in updates) == 50 - len(delivered) == sub.dropped > 0
    assert len(updates) < 50  # coalesced
    assert publishing < 5  # a blocked subscriber did not block the 50 publishes (10 s wait)
    sub.unsubscribe()


def test_a_failing_subscriber_is_detached_and_its_error_kept():
    recorder = Recorder()
    good = []
    bad = recorder.subscribe(lambda update: 1 / 0)
    recorder.subscribe(lambda update: good.extend(update.steps))
    # (said what becomes of it: a sink whose writes fail, a full disk, gets no more steps, the run going on)
    with pytest.warns(RuntimeWarning, match="raised and was detached: ZeroDivisionError: division by zero. It gets "
                      r"no more steps, from the update it raised on \(recorder.errors keeps its traceback\). "
                      "Training goes on."):
        for step in range(1, 4):
            recorder.publish(record(step))
        recorder.flush()
    assert good == [1, 2, 3]
    assert not bad.active and bad not in recorder.subscriptions
    assert "ZeroDivisionError" in recorder.errors[0]["error"]
    recorder.close()
    assert recorder.subscriptions == []


def test_readers_in_other_threads_while_training_publishes():
    recorder = Recorder(max_rows=1000)
    errors, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                frame = recorder.to_pandas()
                assert frame.step.is_monotonic_increasing
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for step in range(1, 2001):
        recorder.publish(record(step))
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert recorder.records()[-1].step == 2000


def test_a_subscriber_with_an_interval_gets_the_steps_gathered_and_flush_does_not_wait():
    recorder = Recorder()
    updates = []
    sub = recorder.subscribe(lambda update: updates.append(update.steps), interval=30.0)
    for step in range(1, 51):
        recorder.publish(record(step))
    assert sub.flush(timeout=10)  # delivers now: waiting out the 30 s interval, it would time out
    assert [s for steps in updates for s in steps] == list(range(1, 51)) and len(updates) <= 2
    recorder.publish(record(51))
    sub.unsubscribe()  # what is queued is delivered first
    assert updates[-1] == [51]
    with pytest.raises(ValueError, match="interval must be a number of seconds >= 0, got -1"):
        recorder.subscribe(print, interval=-1)
