"""The Recorder: recorded steps in a bounded buffer, streamed to subscribers.

Training publishes one :class:`StepRecord` per step; subscribers (the app, a
notebook dashboard, the run store) receive them on their own threads, so a
slow or failing subscriber never holds training up. A subscriber that falls
behind gets the pending records coalesced into one update; past its
``max_pending`` the oldest are dropped and the drop is counted in the update.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument.interventions import warn_user
from workbench.instrument.schema import (INT_COLUMNS, MAX, MIN, ROW_COLUMNS, SUMS, TEXT_COLUMNS, checked_long,
                                         finish, whole_number)

__all__ = ["ROW_COLUMNS", "StepRecord", "Update", "Subscription", "Recorder", "rows_frame",
           "histograms_frame", "histogram_edges", "bin_edges", "metrics_frame", "metric_columns"]



@dataclass(frozen=True)
class StepRecord:
    """What one step recorded: statistics rows (as raw sums), histograms and metrics.

    ``keys[i]`` is ``(module, call, kind, tensor, shape)`` of row ``i``; rows are
    in the order they were recorded, so the first row with a non-finite value
    is where one first appeared.
    """

    step: int
    keys: tuple[tuple[str, int, str, str, tuple[int, ...]], ...] = ()
    numel: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sums: np.ndarray = field(default_factory=lambda: np.zeros((0, len(SUMS))))
    histograms: np.ndarray | None = None  # (rows, bins) counts, or None when off
    metrics: dict[str, float] = field(default_factory=dict)
    errors: tuple[dict, ...] = ()  # instrumentation failures of this step
    #: which tensor each row is: rows with the same number are of one tensor, which several call
    #: sites returned (a container's output that is its last child's); None when not known
    tensors: np.ndarray | None = None
    #: the range each row's histogram bins divide equally, (rows, 2); None: the row's [min, max]
    #: (see :func:`histogram_edges`)
    histogram_edges: np.ndarray | None = None
    #: whether each row's histogram was counted from a sample of its tensor, (rows,) bool; None: none was
    histogram_sampled: np.ndarray | None = None
    #: when the step ended (``time.time()``); None where not known. The views' steps/s read it.
    time: float | None = None

    def __len__(self) -> int:
        return len(self.keys)


def rows_frame(records: Iterable[StepRecord]) -> pd.DataFrame:
    """One DataFrame of :data:`ROW_COLUMNS` for the rows of ``records``."""
    records = [r for r in records if len(r)]
    if not records:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in ROW_COLUMNS})
    keys = [k for r in records for k in r.keys]
    module, call, kind, tensor, shape = zip(*keys)
    numel = np.concatenate([r.numel for r in records])
    stats = finish(numel, np.concatenate([r.sums for r in records]))
    frame = pd.DataFrame({
        "step": np.repeat([r.step for r in records], [len(r) for r in records]).astype(np.int64),
        "module": module, "call": np.asarray(call, np.int64), "kind": kind, "tensor": tensor,
        "shape": [format_shape(s) for s in shape],
        **stats,
    })
    return frame


def format_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def histogram_edges(record: StepRecord) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per row of ``record``: the range its histogram's equal bins divide (a range
    kept for the site over steps, or the tensor's own [min, max])."""
    if record.histogram_edges is not None:
        return record.histogram_edges[:, 0], record.histogram_edges[:, 1]
    return record.sums[:, MIN], record.sums[:, MAX]


def bin_edges(lo: np.ndarray | float, hi: np.ndarray | float, bins: int) -> np.ndarray:
    """The edges of ``bins`` equal bins over each [lo, hi], shape ``(..., bins + 1)`` for ``lo``
    and ``hi`` of shape ``(...)``: every reader of the histograms (a watch's, a stored run's, the
    views') draws them with these.

    A constant tensor's range has no width (lo == hi): every reduction counts its values in bin 0
    (``v - lo`` is 0), so its bins get a width of ``max(1, |v|)`` in all (numpy's one around a
    lone value, scaled where 1 would vanish in ``v``'s rounding), placed so that bin 0 is centred
    on the value: the bar stands at the value, the edges increase (``np.histogram`` takes them)
    and the values counted fall in the bin that holds them; the width is less where ``|v|`` is so
    large that its edges would pass float64's largest value (they stay finite). A range that is not
    finite keeps the edges it gives (NaN, infinite), without numpy's warnings: a row with an
    infinity in its tensor is a row to read, not an error where warnings are errors.
    """
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        edges = np.linspace(lo, hi, bins + 1, axis=-1)
    flat = (lo == hi) & np.isfinite(lo)
    if flat.any():
        size = np.abs(lo[flat])
        width = np.minimum(np.maximum(1.0, size), np.finfo(np.float64).max - size)
        edges[flat] = lo[flat][..., None] + width[..., None] * ((np.arange(bins + 1) - 0.5) / bins)
    return edges


def histograms_frame(records: Iterable[StepRecord], module: str | None = None,
                     kind: str | None = None) -> pd.DataFrame:
    """Histograms beside the rows: ``step, module, call, kind, tensor, edges, counts`` (numpy
    arrays) and ``sampled``.

    ``edges`` has ``bins + 1`` values: equal bins over the range of :func:`histogram_edges` (a
    value outside it counts in the end bin on its side; the row's min and max say how far it
    lies), by :func:`bin_edges` (a constant tensor's bin 0 centred on its value). ``sampled``: the
    counts are estimated from a sample of the tensor's values, scaled to its size (NaN, infinity
    and zero counts are in the row's statistics, exact).
    """
    out = []
    for r in records:
        if r.histograms is None:
            continue
        edges = bin_edges(*histogram_edges(r), r.histograms.shape[1])
        for i, (mod, call, knd, tensor, _shape) in enumerate(r.keys):
            if (module is None or mod == module) and (kind is None or knd == kind):
                sampled = bool(r.histogram_sampled[i]) if r.histogram_sampled is not None else False
                out.append((r.step, mod, call, knd, tensor, edges[i], r.histograms[i], sampled))
    return pd.DataFrame(out, columns=["step", "module", "call", "kind", "tensor", "edges", "counts", "sampled"])


def metric_columns(names: Iterable[str]) -> list[str]:
    """The columns of a wide metrics frame, a watch's and a stored run's alike: ``step``, then the metrics
    in the order they were first logged, those first logged at one step by name. ``names``: the logged
    names in step order, each step's by name (the long frame's ``name`` column)."""
    return ["step", *dict.fromkeys(names)]


def metrics_frame(records: Iterable[StepRecord], long: bool = False,
                  logged: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per step that published metrics: ``step`` and a column per metric (:func:`metric_columns`);
    ``long``: one row per logged value, ``step, name, value``. ``logged``: the metric names in the order
    first logged over steps before ``records`` too (a recorder's, whose oldest steps were evicted), which
    orders the columns; None: the order ``records`` log them in."""
    records = list(records)
    if long:
        values = [(r.step, name, float(value)) for r in records for name, value in sorted(r.metrics.items())]
        return pd.DataFrame(values, columns=["step", "name", "value"]).astype({"step": "int64", "value": "float64"})
    rows = [{"step": r.step, **r.metrics} for r in records if r.metrics]
    if not rows:
        return pd.DataFrame({"step": pd.Series(dtype=np.int64)})
    columns = metric_columns(name for r in records for name in sorted(r.metrics))
    if logged is not None:
        present = set(columns)
        columns = [name for name in metric_columns(logged) if name in present]
    return pd.DataFrame(rows)[columns]


def _dtype(column: str) -> str:
    if column in INT_COLUMNS:
        return "int64"
    return "object" if column in TEXT_COLUMNS else "float64"


@dataclass(frozen=True)
class Update:
    """What a subscriber receives: the records since its last update, in step order.

    Attributes:
        records: the recorded steps, oldest first.
        dropped: records this subscriber missed because it fell more than
            ``max_pending`` records behind (0 when it keeps up).
    """

    records: tuple[StepRecord, ...]
    dropped: int = 0

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    def to_pandas(self) -> pd.DataFrame:
        return rows_frame(self.records)

    def metrics(self) -> pd.DataFrame:
        return metrics_frame(self.records)


class Subscription:
    """A subscriber's queue and delivery thread. ``unsubscribe()`` (or ``remove()``) detaches it.

    With an ``interval``, the thread gathers what arrives for that long before it delivers: a
    training loop then wakes it once per interval, not once per step (each wake-up takes the
    interpreter from the training thread for a moment, a cost that weighs on small, fast steps).
    """

    def __init__(self, recorder: Recorder, callback: Callable[[Update], object], max_pending: int,
                 interval: float = 0.0) -> None:
        self.callback = callback
        self.max_pending = max_pending
        self.interval = interval
        self.delivered = 0  # records handed to the callback
        self.dropped = 0  # records this subscriber missed, in total
        self.error: str | None = None
        self._recorder = recorder
        self._pending: deque[StepRecord] = deque()
        self._dropped_since = 0
        self._offered: StepRecord | None = None  # the last record offered (offered again: queued once)
        self._busy = False
        self._closed = False
        self._idle = False  # the thread waits for a first record
        self._flushing = 0  # callers of flush() waiting: deliver without waiting out the interval
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # what the delivery thread waits on
        self._done = threading.Condition(lock)  # what flush() waits on
        self._thread = threading.Thread(target=self._loop, name=f"workbench-subscriber-{id(self):x}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self._closed

    def offer(self, record: StepRecord) -> None:
        """Queue a record; never blocks beyond a short lock."""
        with self._work:
            if self._closed or record is self._offered:
                return
            self._offered = record
            self._pending.append(record)
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self._dropped_since += 1
                self.dropped += 1
            if self._idle:
                self._work.notify()

    def _loop(self) -> None:
        while True:
            with self._work:
                while not self._pending and not self._closed:
                    self._idle = True
                    self._work.wait()
                self._idle = False
                if self.interval:
                    deadline = time.monotonic() + self.interval
                    while not (self._closed or self._flushing) and (left := deadline - time.monotonic()) > 0:
                        self._work.wait(left)
                if self._closed and not self._pending:
                    self._done.notify_all()
                    return
                update = Update(tuple(self._pending), self._dropped_since)
                self._pending.clear()
                self._dropped_since = 0
                self._busy = True
            try:
                self.callback(update)
                self.delivered += len(update.records)
            except Exception:
                self.error = traceback.format_exc()
                self._recorder._subscriber_failed(self, self.error)
                with self._work:
                    self._closed = True
                    self._pending.clear()
                    self._busy = False
                    self._done.notify_all()
                return
            with self._work:
                self._busy = False
                self._done.notify_all()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every queued record was delivered; False on timeout."""
        with self._work:
            self._flushing += 1
            self._work.notify()
            try:
                return self._done.wait_for(lambda: self._closed or (not self._pending and not self._busy), timeout)
            finally:
                self._flushing -= 1

    def unsubscribe(self, timeout: float | None = 10.0) -> None:
        """Stop receiving updates; records already queued are delivered first (waiting up to
        ``timeout`` seconds for them; None: until they are)."""
        with self._work:
            self._closed = True
            self._work.notify_all()
        self._recorder._detach(self)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)

    remove = unsubscribe

    def __repr__(self) -> str:
        state = "active" if self.active else "detached"
        return f"Subscription({state}, delivered={self.delivered}, dropped={self.dropped})"


class Recorder:
    """A bounded in-memory buffer of recorded steps, and its subscribers.

    Thread-safe: training publishes from one thread while dashboards read
    (``records()``, ``to_pandas()``) or subscribe from others.

    Args:
        max_rows: statistics rows kept in memory; the oldest steps are evicted
            beyond it (``evicted`` counts them; a warning says so at the first). A run
            store, when attached, keeps every step on disk. 0 keeps none: the steps go to
            the subscribers alone (a store, a dashboard), as in the app, whose server
            would otherwise hold the steps of every run it keeps.

    One recorder serves one open watch at a time (``watch(recorder=...)`` refuses one that another
    open watch publishes into: their steps would mix); once that watch is closed it may serve another.
    """

    # the watch publishing into this recorder (weakly held; None before any): a second open watch may not. Private:
    # the watch sets it and reads it (watch._check_unshared), no user does
    _held_by: Any = None

    def __init__(self, max_rows: int = 500_000) -> None:
        self.max_rows = whole_number("max_rows", max_rows, 0, "an int >= 0 (0: keep no step, stream them only)")
        self.evicted = 0  # steps evicted from the buffer
        #: where every step is kept beyond this buffer (a run store's path, set by its ``attach``)
        self.kept_in: str | None = None
        self.errors: list[dict] = []  # subscriber failures
        self._records: deque[StepRecord] = deque()
        self._rows = 0
        # every metric name published, in the order first logged (each step's by name): the columns of metrics()
        # keep it when the steps that first logged them are evicted, as a stored run's keep it
        self._logged: dict[str, None] = {}
        self._subscriptions: list[Subscription] = []
        self._published: StepRecord | None = None  # the last record published
        self._lock = threading.Lock()

    def publish(self, record: StepRecord) -> None:
        """Keep ``record`` (the oldest are evicted past ``max_rows``) and offer it to every subscriber.
        The record published last, published again (a ``w.step()`` interrupted as it published, called
        again), is kept once and offered once to each subscriber (those it had not reached get it now)."""
        with self._lock:
            first_eviction = False
            again, self._published = record is self._published, record
            if self.max_rows and not again:  # (0: kept by none but the subscribers)
                self._logged.update(dict.fromkeys(sorted(record.metrics)))
                self._records.append(record)
                self._rows += len(record)
                first_eviction = self.evicted == 0
                while self._rows > self.max_rows and len(self._records) > 1:
                    self._rows -= len(self._records.popleft())
                    self.evicted += 1
                first_eviction = first_eviction and self.evicted > 0
                kept_from = self._records[0].step
            subscriptions = list(self._subscriptions)
        if first_eviction:
            # (pointing at the user's w.step(), not at workbench's call of publish; never raised into the publisher,
            # as a subscriber's failure is not)
            fix = (f"Every step is in the run store: workbench.load_run({self.kept_in!r}) reads them all"
                   if self.kept_in is not None else
                   "Pass store='runs/<name>' to keep every step on disk (workbench.load_run reads it)")
            warn_user(f"workbench: the watch's memory holds {self.max_rows:,} rows (max_rows) and is full: "
                      f"its oldest steps are dropped from it from now on (to_pandas(), metrics(), "
                      f"histograms() and diagnose() of the watch start at step {kept_from}). {fix}, or "
                      f"raise the budget: watch(..., recorder=workbench.Recorder(max_rows=...)).")
        for subscription in subscriptions:
            subscription.offer(record)

    def subscribe(self, callback: Callable[[Update], object], max_pending: int = 1000,
                  interval: float = 0.0) -> Subscription:
        """Call ``callback(update)`` on a thread of its own for every published step.

        Args:
            callback: receives an :class:`Update` with one or more records,
                in step order. If it raises, the error is kept in
                ``recorder.errors``, a RuntimeWarning says so, and the
                subscriber is detached.
            max_pending: records kept for a subscriber that falls behind;
                older ones are dropped and counted in ``Update.dropped``.
            interval: seconds to gather records before each delivery (0: deliver
                as they come). A display that redraws every second needs no
                more than a few deliveries a second, and training then pays for
                a few wake-ups of the subscriber's thread, not one per step.

        Returns:
            A :class:`Subscription`; call ``unsubscribe()`` to detach.
        """
        if not callable(callback):
            raise TypeError(f"subscribe() needs a callable, got {callback!r}.")
        max_pending = whole_number("max_pending", max_pending, 1, "a positive int")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
                math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be a number of seconds >= 0, got {interval!r}.")
        subscription = Subscription(self, callback, max_pending, float(interval))
        with self._lock:
            self._subscriptions.append(subscription)
        return subscription

    def _detach(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def _subscriber_failed(self, subscription: Subscription, error: str) -> None:
        with self._lock:
            self.errors.append({"subscriber": repr(subscription.callback), "error": error})
        self._detach(subscription)
        try:  # never silent; never raised into the publisher (where warnings are errors, it is in errors)
            warnings.warn(f"workbench: the subscriber {subscription.callback!r} raised and was detached: "
                          f"{error.strip().splitlines()[-1]}. It gets no more steps, from the update "
                          "it raised on (recorder.errors keeps its traceback). Training goes on.", RuntimeWarning,
                          stacklevel=2)
        except Exception:
            pass

    @property
    def subscriptions(self) -> list[Subscription]:
        """The subscriptions still attached, in the order made (a copy: unsubscribing one leaves it out of the
        next call's list, not of this one). A subscriber that raised is detached, and so not among them."""
        with self._lock:
            return list(self._subscriptions)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every subscriber has received everything published so far.

        Args:
            timeout: seconds to wait per subscriber (None: as long as it takes).

        Returns:
            Whether every subscriber caught up in time.
        """
        return all(s.flush(timeout) for s in self.subscriptions)

    def close(self) -> None:
        """Deliver what is queued, then detach every subscriber."""
        for subscription in self.subscriptions:
            subscription.unsubscribe()

    def records(self) -> list[StepRecord]:
        """The records kept (the newest ``max_rows`` rows' steps), oldest first."""
        with self._lock:
            return list(self._records)

    def to_pandas(self) -> pd.DataFrame:
        """The kept records' rows (``ROW_COLUMNS``), one per tensor per call site per step."""
        return rows_frame(self.records())

    def metrics(self, long: bool = False) -> pd.DataFrame:
        """The kept records' metrics, one row per step (``long``: per logged value); the columns in the order
        the metrics were first logged, in steps evicted since too (as a stored run's ``Run.metrics()``)."""
        long = checked_long(long)
        with self._lock:
            records, logged = list(self._records), list(self._logged)
        return metrics_frame(records, long, logged)

    def histograms(self, module: str | None = None, kind: str | None = None) -> pd.DataFrame:
        """The kept records' histograms, one row per tensor (:func:`histograms_frame`'s columns); an empty frame
        where none were recorded (``watch(histograms=False)``'s ``w.histograms()`` raises instead).

        Args:
            module: only this module path (None: every path).
            kind: only this kind (``activation``, ``grad_output``, ``param``, ``param_grad``, ``update``).
        """
        return histograms_frame(self.records(), module, kind)
