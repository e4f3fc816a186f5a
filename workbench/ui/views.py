"""The view layer: what a run page and a notebook dashboard show, kept up to date incrementally.

A :class:`RunView` is fed the recorder's stream (:class:`~workbench.instrument.Update`\\ s,
or the records of a stored run) and keeps, per view, only what the views draw:

- the metrics, one :class:`History` each;
- every statistic of every call site, per kind, one :class:`History` per kind whose rows hold
  all sites' statistics of a step (one append per kind and step);
- the histograms of each site (when recorded), thinned the same way;
- the first NaN/Inf, where and when, and the most recent anomalous rows;
- the run's progress (step of total, steps/s, time left).

Feeding costs in proportion to the steps that arrived, and every history is bounded: past
``capacity`` points, the older ones are merged in pairs (their mean, with the min and max kept
as an envelope, as TensorBoard keeps a bounded sample of a long run), while the most recent
``recent`` points stay whole (drawn in buckets of the same width, so that a line reads alike
over its whole length). What a refresh draws, and so what is sent to a page per tick, is
bounded however long the run. The Gradio app and the Jupyter dashboard render the same data
(:mod:`workbench.ui.figures`).

Call sites get readable names: the module path (``(model)`` for the model itself), ``#k``
only for a module called more than once in a step, the tensor's leaf where an output is
structured (``lstm out.1.0``). A tensor that several call sites return (a container's output
that is its last child's) is one site, named by the first module that returned it (the
innermost), its other names listed as aliases.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument import KINDS, Run, StepRecord, Update
from workbench.instrument.recorder import bin_edges, histogram_edges
from workbench.instrument.schema import KIND_OPTIONS, STAT_COLUMNS, finish, site_name, whole_number

__all__ = ["STATISTICS", "History", "Site", "RunView", "PERCENTILES", "FEED_INTERVAL", "ENDED", "unrecorded_kinds"]

#: Seconds a view's subscription gathers steps before it delivers them (``watch.subscribe(view.feed,
#: interval=FEED_INTERVAL)``): pages redraw every second, and the training thread is then
#: interrupted a few times a second, not once per step.
FEED_INTERVAL = 0.1

#: The statistics a view can plot, in the order of a history's row.
STATISTICS = ("mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count")
#: The percentiles of TensorBoard's distributions view, drawn as bands from the histograms.
PERCENTILES = (0, 7, 16, 31, 50, 69, 84, 93, 100)
_STAT_INDEX = {name: i for i, name in enumerate(STATISTICS)}
#: The statuses of a run that takes no more steps (a stored run's, a closed watch's)
ENDED = ("finished", "stopped", "failed", "interrupted", "closed")


def unrecorded_kinds(options: dict[str, Any]) -> dict[str, str]:
    """The kinds a run's watch does not record, by the option of ``workbench.watch`` that is off in
    ``options`` (its ``Watch.options``, or a stored run's metadata): ``{"update": "updates"}`` for the
    default ``updates=False``. An option ``options`` does not hold says nothing."""
    return {kind: option for kind, option in KIND_OPTIONS.items() if options.get(option) is False}


class History:
    """A bounded history of points over steps, thinned uniformly as it grows.

    Points come in step order. Past ``capacity`` points, all but the ``recent`` last are
    regrouped into buckets of ``stride`` steps (the stride doubling until they fit in half of
    what is left), each bucket one point at its last step: for rows of numbers, the mean of
    each column over the bucket (NaNs left out), with its min and max kept (``lo``, ``hi``:
    the envelope of what was merged); for other values (``merge="last"``), the bucket's last
    one. So a long run keeps an even sample of its whole length and every recent point, in at
    most ``capacity`` points; :meth:`arrays` draws the recent ones in buckets of the stride too.
    Rows are kept in arrays and merged by whole buckets at once, so taking in a block of steps
    costs a few array operations, not some per step.

    Rows may grow wider over time (new call sites): narrower rows read as NaN past their end.
    """

    def __init__(self, capacity: int = 512, recent: int = 128, merge: str = "mean") -> None:
        self.check(capacity, recent)
        if merge not in ("mean", "last"):
            raise ValueError(f"merge must be 'mean' or 'last', got {merge!r}.")
        self.capacity, self.recent, self.merge = capacity, recent, merge
        self.stride = 1  # steps per bucket in the thinned part
        self._steps = np.zeros(0, np.int64)
        # "mean": per cell, the sum and count of the finite values merged, their min and max
        self._sum = self._count = self._lo = self._hi = np.zeros((0, 0), np.float32)
        self._values: list[Any] = []  # "last"

    @staticmethod
    def check(capacity: int, recent: int) -> None:
        """Raises ValueError unless ``2 <= recent < capacity / 2`` (whole numbers)."""
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (capacity, recent)) \
                or not 2 <= recent < capacity / 2:
            raise ValueError(f"a view's history needs whole numbers with 2 <= recent < capacity / 2, got "
                             f"capacity={capacity!r}, recent={recent!r} (a RunView: histogram_capacity >= 8).")

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def steps(self) -> list[int]:
        return self._steps.tolist()

    def append(self, step: int, value: Any) -> None:
        """One point (a row of numbers, or any value with ``merge="last"``)."""
        if self.merge == "mean":
            self.extend([step], as_float32(value).reshape(1, -1))
        else:
            self.extend([step], [value])

    def extend(self, steps: Sequence[int], values: Any) -> None:
        """Points in step order: ``values`` a (points, width) array, or a list with ``merge="last"``."""
        self._steps = np.concatenate([self._steps, np.asarray(steps, np.int64)])
        if self.merge == "last":
            self._values.extend(values)
        else:
            rows = as_float32(values)
            width = max(self._sum.shape[1], rows.shape[1])
            finite = np.isfinite(rows)
            parts = (np.where(finite, rows, 0), finite.astype(np.float32), rows, rows)
            self._sum, self._count, self._lo, self._hi = (
                np.concatenate([_widen(old, width), _widen(new, width, fill)])
                for old, new, fill in zip((self._sum, self._count, self._lo, self._hi), parts, (0, 0, np.nan, np.nan)))
        if len(self._steps) > self.capacity:
            self._thin()

    def _thin(self) -> None:
        cut = len(self._steps) - self.recent
        old = self._steps[:cut]
        while True:  # the stride whose buckets fit
            bucket = (old - 1) // self.stride
            starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
            if len(starts) <= (self.capacity - self.recent) // 2:
                break
            self.stride *= 2
        ends = np.r_[starts[1:], cut] - 1
        self._steps = np.concatenate([old[ends], self._steps[cut:]])
        if self.merge == "last":
            self._values = [self._values[i] for i in ends] + self._values[cut:]
            return
        for name, reduce in (("_sum", np.add), ("_count", np.add), ("_lo", np.fmin), ("_hi", np.fmax)):
            array = getattr(self, name)
            setattr(self, name, np.concatenate([reduce.reduceat(array[:cut], starts, axis=0), array[cut:]]))

    def last(self) -> Any:
        """The last step's value (the row of numbers as recorded)."""
        if self.merge == "last":
            return self._values[-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._count[-1] > 0, self._sum[-1] / self._count[-1], np.nan).astype(np.float32)

    def values(self) -> list[Any]:
        """The points' values, oldest first (``merge="last"``)."""
        return list(self._values)

    def arrays(self, stride: int | None = None, columns: slice | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``steps (n,), mean (n, width), lo, hi`` as the views draw them; NaN where a point has no
        finite value. Once thinned, the recent points are drawn in buckets of the current stride
        too (the newest up to the last step): a long run's line is alike over its whole length,
        where its recent steps drawn whole would read as a burst of noise at its end.

        ``stride``: buckets of that many steps instead (a power of two; one finer than the history's
        own :attr:`stride` draws at its own: the history may have been thinned since it was asked), to
        draw this history beside a longer one's, or in fewer points; their means are those of every
        value merged in them, as if the history had been thinned that far. ``columns``: only these
        columns of each row."""
        stride = self._checked_stride(stride)
        steps, total, count, lo, hi = self._steps, self._sum, self._count, self._lo, self._hi
        if columns is not None:
            total, count, lo, hi = total[:, columns], count[:, columns], lo[:, columns], hi[:, columns]
        if stride > 1:
            bucket = (steps - 1) // stride
            starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
            ends = np.r_[starts[1:], len(steps)] - 1
            steps = steps[ends]
            total, count = np.add.reduceat(total, starts, axis=0), np.add.reduceat(count, starts, axis=0)
            lo, hi = np.fmin.reduceat(lo, starts, axis=0), np.fmax.reduceat(hi, starts, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / count, np.nan).astype(np.float32)
        lo = np.where(count > 0, lo, np.nan)
        hi = np.where(count > 0, hi, np.nan)
        return steps.copy(), mean, lo, hi

    def _checked_stride(self, stride: int | None) -> int:
        """The stride :meth:`arrays` draws in for ``stride`` (None: the history's own)."""
        if stride is None:
            return self.stride
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1 or stride & (stride - 1):
            raise ValueError(f"stride must be a power of two (steps a point stands for), got {stride!r}.")
        return max(stride, self.stride)  # (strides double from 1: the coarser is a multiple of the finer)

    def stride_within(self, points: int) -> int:
        """The narrowest stride (the history's own, doubled) whose buckets :meth:`arrays` draws in at most
        ``points`` points."""
        if not isinstance(points, int) or isinstance(points, bool) or points < 1:
            raise ValueError(f"points must be a whole number >= 1, got {points!r}.")
        stride = self.stride
        while len(np.unique((self._steps - 1) // stride)) > points:
            stride *= 2
        return stride

    def column(self, index: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``steps, mean, lo, hi`` of one column (NaN where a row is shorter), in buckets of ``stride``
        as :meth:`arrays` draws them."""
        steps, mean, lo, hi = self.arrays(stride)
        if index >= mean.shape[1]:
            empty = np.full(len(steps), np.nan, np.float32)
            return steps, empty, empty, empty
        return steps, mean[:, index], lo[:, index], hi[:, index]


def as_float32(values: Any) -> np.ndarray:
    """``values`` as the views keep them, float32: a value beyond float32's range (a float64 statistic or metric
    above 3.4e38) becomes +-inf there, as it would in a float32 model, with no overflow warning."""
    with np.errstate(over="ignore"):
        return np.asarray(values, np.float64).astype(np.float32)


def _widen(array: np.ndarray, width: int, fill: float = 0.0) -> np.ndarray:
    """``array`` (points, w) padded with ``fill`` to ``width`` columns."""
    if array.shape[1] == width:
        return array
    return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=fill)


@dataclass
class _Block:
    """Consecutive steps that recorded the same rows, as the views take them in."""

    steps: list[int]
    keys: tuple  # (module, call, kind, tensor, shape) per row
    numel: np.ndarray  # per row
    table: np.ndarray | None  # (steps, rows, STATISTICS); None: no rows
    tensors: np.ndarray | None  # which rows are one tensor, when known
    metrics: list[dict[str, float]]  # per step
    histograms: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]  # per step: (lo, hi, counts) per row


@dataclass
class Site:
    """A call site as the views show it."""

    name: str  # the readable name
    module: str
    call: int
    tensor: str
    aliases: list[str] = field(default_factory=list)  # other names of the same tensor


def _contains(container: str, module: str) -> bool:
    """Whether the module path ``container`` holds ``module`` (the model, ``""``, holds every one)."""
    return container == "" or module.startswith(container + ".")


#: What a view of a run that ended before its first recorded step says (no rows, no metrics: not how a
#: watch is given them, which a run of an experiment stopped at once would not be helped by).
NOTHING_RECORDED = "This run ended before its first recorded step: it holds no rows and no metrics."


class RunView:
    """The views of one run, fed incrementally.

    Args:
        capacity: points kept per metric, and per history of statistics (every site's, per kind).
        recent: of those, the most recent points kept whole.
        histogram_capacity: histograms kept per site (thinned the same way).
        label: what the run is (shown in the header).
        total: the steps the run will take, if known (progress, time left).
        max_pending: records queued at most before they are taken in without a draw.

    Thread-safe: one thread feeds (a recorder subscription) while others draw. Feeding only
    queues the records; the first view drawn after takes them in, all at once.
    """

    def __init__(self, capacity: int = 400, recent: int = 100, histogram_capacity: int = 96, label: str = "",
                 total: int | None = None, max_pending: int = 1024) -> None:
        History.check(capacity, recent)
        History.check(histogram_capacity, histogram_capacity // 4)
        self.capacity, self.recent, self.histogram_capacity = capacity, recent, histogram_capacity
        self.label, self.total = label, total
        self.status, self.error = "running", None
        #: the kinds the run does not record, by the watch option that is off (:func:`unrecorded_kinds`):
        #: set by what made the view, for :meth:`no_rows`
        self.unrecorded: dict[str, str] = {}
        #: ``(every, start_step)`` of the run's watch where known (a stored run's metadata): a run that ended
        #: with no rows before its first recorded step says so (:meth:`no_rows`), not that it recorded none
        self.schedule: tuple[int, int] | None = None
        #: a stored run's start time (its metadata's ``start_time``): which of the runs recorded at one path in turn
        #: the view is of (a run recorded again where an old one was removed); None for a view fed live
        self.started: float | None = None
        #: the step the run began after (an experiment's steps before this run: ``run.first_step``), 0 unless set;
        #: the header's step until the run's first step arrives, and where its progress is counted from
        self.first_step = 0
        self.last_step = 0
        self.steps_fed = 0
        self.dropped = 0  # steps the feeding subscription missed (it fell behind)
        self.metrics: dict[str, History] = {}
        self.sites: dict[str, list[Site]] = {kind: [] for kind in KINDS}
        self.stats: dict[str, History] = {kind: History(capacity, recent) for kind in KINDS}
        self._first_anomaly: dict[str, Any] | None = None
        self.anomalies: deque[dict[str, Any]] = deque(maxlen=200)
        self.max_pending = max_pending
        self._pending: list[StepRecord] = []
        self._target: dict[tuple, tuple[int, int]] = {}  # row key -> (kind index, site index or -1: an alias)
        self._site_targets: dict[tuple, tuple[int, int]] = {}  # the same by (kind, module, call, tensor): any shape
        self._names: dict[tuple, Site] = {}
        self._calls: dict[tuple[str, str], int] = {}  # (kind, module) -> calls seen in one step
        self._histograms: dict[tuple[str, int], History] = {}
        self._times: deque[tuple[float, int]] = deque(maxlen=64)  # (time, step) of deliveries, for steps/s
        self._pace = WholeRunPace()  # the pace over the whole run: steps/s once it ended ("ran at")
        self._arrived: float | None = None  # time.monotonic() of the last delivery of steps
        self._resumed: float | None = None  # time.monotonic() it last went on running after another status
        self._lock = threading.RLock()

    #: Steps of a stored run :meth:`from_run` reads at a time: its memory is that of this many
    #: steps' rows, however long the run (a 100,000-step run read at once took gigabytes).
    READ_STEPS = 2000

    @classmethod
    def from_run(cls, run: Run, **options: Any) -> RunView:
        """The views of a stored run (``workbench.load_run``), as they were when it was recorded,
        read :data:`READ_STEPS` steps at a time."""
        view = cls(label=run.name, **options)
        by_step: dict[int, dict[str, float]] = {}
        for step, name, value in run.metrics(long=True).itertuples(index=False):
            by_step.setdefault(int(step), {})[name] = float(value)
        logged = np.fromiter(by_step, np.int64, len(by_step))  # (in step order: the metrics' order)
        for part in run.step_ranges(cls.READ_STEPS):
            first, end = np.searchsorted(logged, part[0]), np.searchsorted(logged, part[1], side="right")
            view._read_steps(run, part, by_step, logged[first:end].tolist())
        times = run.step_times()  # its pace, as the header read it live: from steps spread over the run
        picks = np.unique(np.linspace(0, len(times) - 1, view._times.maxlen).round().astype(int)) if len(times) else []
        view._times.extend(zip(times.time.to_numpy()[picks].tolist(), times.step.to_numpy()[picks].tolist()))
        view._pace = WholeRunPace()  # (as the live view read its steps: these, in step order)
        for ended, step in zip(times.time.to_numpy().tolist(), times.step.to_numpy().tolist()):
            view._pace.add(ended, step)
        metadata = run.metadata
        view.set_status(metadata["status"], metadata.get("error"))
        started = metadata.get("start_time")
        view.started = float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None
        view.unrecorded = unrecorded_kinds(metadata)
        every, start = metadata.get("every"), metadata.get("start_step")
        if isinstance(start, int) and not isinstance(start, bool) and start > 0:  # (a watch's steps from start_step)
            view.first_step = start - 1
        if start is None and len(times):  # (a run stored before its start_step was: its first step tells)
            start = int(times.step.iloc[0])
        if isinstance(every, int) and isinstance(start, int):
            view.schedule = (every, start)
        return view

    def _read_steps(self, run: Run, part: tuple[int, int], by_step: dict[int, dict[str, float]],
                    logged: list[int]) -> None:
        """Take in the stored steps ``part`` (``(first, last)``) and their metrics (``by_step``; ``logged``:
        the steps of ``part`` with metrics), consecutive steps of one layout (the same rows) as one block."""
        read = run._view_part(part)
        row_steps, layout = read["steps"], read["layout"]
        table = as_float32(read["stats"][:, [STAT_COLUMNS.index(name) for name in STATISTICS]])
        ends = np.cumsum([len(read["layouts"][i]) for i in layout], dtype=np.int64)
        spans = {int(step): (int(end - len(read["layouts"][i])), int(end), int(i))
                 for step, end, i in zip(row_steps, ends, layout)}
        # (the bins' ranges and counts in the rows' order, as the recorder gives them a live view; steps that
        # recorded histograms on some rows only show none)
        counts = read["counts"]
        histograms = len(counts) == len(table) and len(table) > 0
        block: list[int] = []

        def flush() -> None:
            if not block:
                return
            a, b, i = spans.get(block[0], (0, 0, -1))
            first, last = spans[block[0]][0] if b > a else 0, spans[block[-1]][1] if b > a else 0
            width = b - a
            hist = [None] * len(block)
            if histograms and width:
                lows, highs = (read[c][first:last].reshape(len(block), width) for c in ("lo", "hi"))
                rows = (counts[first:last].reshape(len(block), width, -1) if isinstance(counts, np.ndarray)
                        else [np.stack(counts[x:x + width]) for x in range(first, last, width)])
                hist = list(zip(lows, highs, rows))
            self._take(_Block(list(block), read["layouts"][i] if width else (), read["numel"][a:b],
                              table[first:last].reshape(len(block), width, -1) if width else None, None,
                              [by_step.get(step, {}) for step in block], hist))
            block.clear()

        current = None
        for step in sorted(spans.keys() | set(logged)):  # (steps that stored no rows: metrics alone)
            self.last_step, self.steps_fed = max(self.last_step, step), self.steps_fed + 1
            this = spans[step][2] if step in spans else -1
            if block and this != current:
                flush()
            current = this
            block.append(step)
        flush()

    # ------------------------------------------------------------------ feeding
    def feed(self, update: Update | StepRecord | Iterable[StepRecord]) -> None:
        """Take the records that arrived (an ``Update``, one record or several, in step order).

        Cheap, as it runs beside the training (a recorder subscription): the records are queued,
        and taken into the views by the next view that is drawn, many steps at once.
        """
        if isinstance(update, Update):
            records, dropped = update.records, update.dropped
        elif isinstance(update, StepRecord):
            records, dropped = (update,), 0
        else:
            records, dropped = tuple(update), 0
        if not records and not dropped:
            return
        with self._lock:
            self.dropped += dropped
            self._pending.extend(records)
            self.steps_fed += len(records)
            if records:
                self._arrived = time.monotonic()
                self.last_step = max(self.last_step, max(r.step for r in records))
                stamped = [r for r in records if r.time is not None]
                for record in stamped:
                    self._pace.add(record.time, record.step)
                if stamped:  # when the steps ended: a first delivery of many steps has a pace too
                    if not self._times:
                        self._times.append((stamped[0].time, stamped[0].step))
                    self._times.append((stamped[-1].time, stamped[-1].step))
                else:  # (records made by hand: their arrival)
                    self._times.append((time.monotonic(), self.last_step))
            if len(self._pending) >= self.max_pending:  # nobody draws: keep the queue bounded
                self._absorb()

    def _absorb(self) -> None:
        """Take the queued records into the views; records of the same layout (the same row
        keys, as consecutive steps of one model have) together."""
        pending, self._pending = self._pending, []
        start = 0
        while start < len(pending):
            end, keys = start + 1, pending[start].keys
            while end < len(pending) and pending[end].keys == keys:
                end += 1
            self._absorb_layout(pending[start:end])
            start = end

    def _absorb_layout(self, records: list[StepRecord]) -> None:
        first, n = records[0], len(records)
        table = None
        if len(first):
            stats = finish(np.tile(first.numel, n), np.concatenate([r.sums for r in records]))
            table = as_float32(np.column_stack([stats[name] for name in STATISTICS])).reshape(n, len(first), -1)
        histograms = [None if r.histograms is None else (*histogram_edges(r), r.histograms) for r in records]
        self._take(_Block([r.step for r in records], first.keys, first.numel, table, first.tensors,
                          [r.metrics for r in records], histograms))

    def _take(self, block: _Block) -> None:
        """Take in consecutive steps that recorded the same rows."""
        for name in dict.fromkeys(name for metrics in block.metrics for name in metrics):
            logged = [(step, metrics[name]) for step, metrics in zip(block.steps, block.metrics) if name in metrics]
            history = self.metrics.get(name)
            if history is None:
                history = self.metrics[name] = History(self.capacity, self.recent)
            history.extend([step for step, _ in logged], as_float32([[value] for _, value in logged]))
        if block.table is None:
            return
        n, table = len(block.steps), block.table
        if any(key not in self._target for key in block.keys):
            self._learn_sites(block.keys, block.numel, table[0], block.tensors)
        targets = np.array([self._target[key] for key in block.keys], np.int64)
        for k, kind in enumerate(KINDS):
            mine = (targets[:, 0] == k) & (targets[:, 1] >= 0)
            if not mine.any():
                continue
            rows = np.full((n, len(self.sites[kind]), len(STATISTICS)), np.nan, np.float32)
            rows[:, targets[mine, 1]] = table[:, mine]
            self.stats[kind].extend(block.steps, rows.reshape(n, -1))
        bad = np.argwhere((table[:, :, _STAT_INDEX["nan_count"]] > 0) | (table[:, :, _STAT_INDEX["inf_count"]] > 0))
        if len(bad):
            # the first ever, and the most recent the list keeps
            for r, i in ([bad[0]] if self._first_anomaly is None else []) + list(bad[-self.anomalies.maxlen:]):
                self._note_anomaly(block.steps[r], block.keys[i], table[r, i])
        self._take_histograms(block, targets)

    def _take_histograms(self, block: _Block, targets: np.ndarray) -> None:
        """Keep each site's histograms of the block: ``(step, lo, hi, counts, min, max)`` a step, the bins'
        range, the counts, the tensor's own min and max. The steps' ranges and counts are stacked into one
        array each, and each site's points made from its column of them at once (a run's histograms are
        its sites times its steps: taking them one by one was most of opening a stored run)."""
        recorded = [r for r, h in enumerate(block.histograms) if h is not None]
        # (steps stacked together while their counts have as many bins: a run written part way with other bins
        # has two, as Run.histograms reads them)
        bins = [len(block.histograms[r][2][0]) if len(block.histograms[r][2]) else 0 for r in recorded]
        cuts = [0] + [j for j in range(1, len(recorded)) if bins[j] != bins[j - 1]] + [len(recorded)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            self._take_histogram_steps(block, targets, recorded[a:b])

    def _take_histogram_steps(self, block: _Block, targets: np.ndarray, recorded: list[int]) -> None:
        """:meth:`_take_histograms` of the block's steps ``recorded`` (their indices), whose counts have as
        many bins."""
        if not recorded:
            return
        steps = [block.steps[r] for r in recorded]
        lows = np.stack([block.histograms[r][0] for r in recorded])  # (steps, rows)
        highs = np.stack([block.histograms[r][1] for r in recorded])
        counts = np.stack([block.histograms[r][2] for r in recorded]).astype(np.float32, copy=False)  # (.., bins)
        low = block.table[recorded, :, _STAT_INDEX["min"]]
        high = block.table[recorded, :, _STAT_INDEX["max"]]
        for i, (kind_index, site) in enumerate(targets):
            if site < 0:
                continue
            kept = self._histograms.get((KINDS[kind_index], int(site)))
            if kept is None:
                kept = self._histograms[(KINDS[kind_index], int(site))] = History(
                    self.histogram_capacity, self.histogram_capacity // 4, merge="last")
            kept.extend(steps, list(zip(steps, lows[:, i].tolist(), highs[:, i].tolist(), counts[:, i],
                                        low[:, i].tolist(), high[:, i].tolist())))

    def _learn_sites(self, keys: tuple, numel: np.ndarray, table: np.ndarray, tensors: np.ndarray | None) -> None:
        """Name the call sites first seen in these rows (one step's). A site is its module, call,
        kind and tensor leaf: a new shape (a smaller last batch) is the same site. A row whose
        tensor another site of the step returned is an alias of that site: known from the watch
        (``tensors``), or, for rows without it (a stored run), told by the same kind, shape and
        statistics in a container of that site (a container whose output is its last child's;
        a copy of a network elsewhere in the model, equal at first, stays a site of its own)."""
        calls: dict[tuple[str, str], int] = {}
        for module, call, kind, _tensor, _shape in keys:
            calls[(kind, module)] = max(calls.get((kind, module), 0), call + 1)
        for key, count in calls.items():
            self._calls[key] = max(self._calls.get(key, 0), count)
        seen: dict[tuple, list[tuple[int, int]]] = {}  # fingerprint -> the sites of this step with it
        for i, key in enumerate(keys):
            module, call, kind, tensor, shape = key
            if tensors is not None:
                fingerprint = (kind, int(tensors[i]))
            else:
                fingerprint = (kind, shape, table[i].tobytes())
            target = self._target.get(key)
            if target is None:
                target = self._site_targets.get((kind, module, call, tensor))
            if target is None:
                k = KINDS.index(kind)
                candidates = seen.get(fingerprint, [])
                if tensors is None:
                    # (by statistics, a tensor of one value or all zeros tells no identity: such twins stay apart)
                    telling = table[i, _STAT_INDEX["zero_frac"]] < 1 and numel[i] > 1
                    candidates = [c for c in candidates if telling and _contains(module, self.sites[kind][c[1]].module)]
                original = candidates[0] if candidates else None
                name = site_name(module, call, tensor, self._calls.get((kind, module), 1) > 1, kind)
                if original is not None:
                    self.sites[kind][original[1]].aliases.append(name)
                    target = (k, -1)
                else:
                    self.sites[kind].append(Site(name, module, call, tensor))
                    target = (k, len(self.sites[kind]) - 1)
                self._site_targets[(kind, module, call, tensor)] = target
            self._target[key] = target
            if target[1] >= 0:
                seen.setdefault(fingerprint, []).append(target)

    def _note_anomaly(self, step: int, key: tuple, stats: np.ndarray) -> None:
        module, call, kind, tensor, _shape = key
        site = self._target[key][1]
        name = self.sites[kind][site].name if site >= 0 else site_name(module, call, tensor, False, kind)
        row = {"step": step, "site": name, "kind": kind, "nan_count": int(stats[_STAT_INDEX["nan_count"]]),
               "inf_count": int(stats[_STAT_INDEX["inf_count"]])}
        if self._first_anomaly is None:
            self._first_anomaly = row
        elif self.anomalies and self.anomalies[-1] == row:
            return
        self.anomalies.append(row)

    @property
    def first_anomaly(self) -> dict[str, Any] | None:
        """Where and when a NaN or an Inf first appeared: step, site, kind, counts; None so far."""
        with self._lock:
            self._absorb()
            return self._first_anomaly

    @contextlib.contextmanager
    def _synced(self) -> Iterator[None]:
        """Hold the lock, with every queued record taken in."""
        with self._lock:
            self._absorb()
            yield

    def set_status(self, status: str, error: str | None = None) -> None:
        with self._lock:
            if status == "running" and self.status != "running":  # (a pause is not a wait for steps)
                self._resumed = time.monotonic()
            self.status, self.error = status, error

    def no_rows(self, kind: str) -> str:
        """What a view of ``kind`` says while it has no rows of it: that the run is not recorded with
        them (:attr:`unrecorded`: a message that names the option), that it recorded none (it ended),
        that its steps so far had none (a model run forward only never gives gradients: not "yet"), or,
        before its first step, that none have arrived yet. (The text stays the same from step to step: a
        page sends an empty figure again only when what it says changes.)"""
        option = self.unrecorded.get(kind)
        ended = self.status in ENDED
        if option is not None:
            return f"No {kind} rows: this run {'was' if ended else 'is'} recorded without them ({option}=False)."
        if ended:
            early = self.before_first_record()
            if early is not None:
                return early
            return f"This run recorded no {kind} rows." if self.steps_fed else NOTHING_RECORDED
        return f"No {kind} rows in the steps recorded so far." if self.steps_fed else f"No {kind} rows yet."

    def first_recorded_step(self) -> int | None:
        """The step a run that ended before its first recorded step would have recorded first (a watch with
        ``every=N`` stopped before step N + 1, or a resumed one before its next multiple), for :meth:`no_rows`;
        None for any other run, one with rows, one whose first step was to be recorded (it ran none: no
        ``every`` would have recorded more), or where its ``schedule`` is not known."""
        with self._synced():
            if self.status not in ENDED or self.schedule is None or any(self.sites.values()):
                return None
            every, start = self.schedule
            first = start + (1 - start) % every  # (a watch records the steps s with (s - 1) % every == 0)
            return None if first == start or self.last_step >= first else first

    def before_first_record(self) -> str | None:
        """What a run that ended before its first recorded step says (:meth:`first_recorded_step`): which
        step that was, and how to record; None for any other run."""
        with self._synced():
            first, last, fed = self.first_recorded_step(), self.last_step, self.steps_fed
        if first is None:
            return None
        ran = f"it ended at step {last}, with metrics but no rows" if fed else "it holds no rows and no metrics"
        return (f"This run stopped before its first recorded step (step {first} with every={self.schedule[0]}): "
                f"{ran}. To record steps, record more often (a smaller every=, or w.record_next() before a step) "
                f"or run more steps (to step {first} at least).")

    def no_metrics(self) -> str:
        """What a metrics view says while the run has none: that it recorded none (it ended), that its steps
        so far had none, or, before its first step, that none have arrived yet; the two first say how a
        watch is given them (a watch of a training loop of one's own records only what ``w.step`` is given:
        "yet" was said of a closed one forever)."""
        how = "a watch records the metrics given to w.step(), e.g. w.step(loss=loss.item())"
        if self.status in ENDED:
            if self.steps_fed:
                return f"This run recorded no metrics ({how})."
            return self.before_first_record() or NOTHING_RECORDED
        return f"No metrics in the steps recorded so far ({how})." if self.steps_fed else "No metrics yet."

    # ------------------------------------------------------------------ views
    def header(self) -> dict[str, Any]:
        """Run header: label, status (and error), step of total (the step the run began after, ``first_step``,
        until its first arrives), steps/s, seconds left, and the seconds since steps last arrived or the run was
        last resumed, whichever is later (``idle_s``; None before the first: a pause is not a wait for steps).
        steps/s: while the run is running (or stopping), its recent pace, over the last deliveries of steps;
        otherwise the pace it ran at over all its steps (:class:`WholeRunPace`), the same live and on replay."""
        with self._lock:
            moving = self.status in ("running", "stopping")
            whole = None if moving else self._pace.rate()  # (None too for steps fed without their times)
            rate = whole if whole is not None else _rate(self._times)
            step = max(self.last_step, self.first_step)
            left = None
            if rate and self.total is not None and self.status == "running":
                left = max(self.total - step, 0) / rate
            # (waited for steps since the last came, or since it was resumed where that was later)
            idle = None
            if self._arrived is not None:
                idle = time.monotonic() - max(self._arrived, self._resumed or self._arrived)
            return {"label": self.label, "status": self.status, "error": self.error, "step": step,
                    "first_step": self.first_step, "total": self.total, "steps_per_s": rate, "seconds_left": left,
                    "dropped": self.dropped, "idle_s": idle}

    def metric_names(self) -> list[str]:
        with self._synced():
            return sorted(self.metrics)

    def metrics_frame(self, names: Sequence[str] | None = None, smoothing: float = 0.0,
                      stride: int | None = None) -> pd.DataFrame:
        """``metric, step, value, smoothed, lo, hi`` of each metric (all, or ``names``).

        ``smoothing`` in [0, 1) is TensorBoard's: an exponential moving average with that weight
        on the past, debiased at the start. ``stride``: in buckets of that many steps (a power of two;
        see :meth:`History.arrays`), to draw a run beside one thinned further (:meth:`metric_stride`).
        """
        if not isinstance(smoothing, (int, float)) or isinstance(smoothing, bool) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing!r}.")
        if isinstance(names, str):
            raise TypeError(f"names takes a list of metric names, got the string {names!r}; pass [{names!r}].")
        with self._synced():
            chosen = self.metric_names() if names is None else [n for n in names if n in self.metrics]
            frames = []
            for name in chosen:
                steps, mean, lo, hi = self.metrics[name].column(0, stride)
                frames.append(pd.DataFrame({"metric": name, "step": steps, "value": mean,
                                            "smoothed": _ema(mean, smoothing), "lo": lo, "hi": hi}))
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                                 [("metric", object), ("step", "int64"), ("value", "float32"),
                                  ("smoothed", "float64"), ("lo", "float32"), ("hi", "float32")]})
        return pd.concat(frames, ignore_index=True)

    def site_table(self, kind: str) -> pd.DataFrame:
        """The call sites of ``kind`` in the order they were first recorded: name, module, call,
        tensor, aliases."""
        _check_kind(kind)
        with self._synced():
            return pd.DataFrame([{"name": s.name, "module": s.module, "call": s.call, "tensor": s.tensor,
                                  "aliases": ", ".join(s.aliases)} for s in self.sites[kind]],
                                columns=["name", "module", "call", "tensor", "aliases"])

    def site_order(self, kind: str) -> list[str]:
        """Site names of ``kind`` in forward order: activations as the forward returned them
        (innermost first); gradients and parameters in the order of the activation of the same
        module (the backward runs the other way)."""
        _check_kind(kind)
        with self._synced():
            return [self.sites[kind][i].name for i in self._forward_order(kind)]

    def _forward_order(self, kind: str) -> list[int]:
        sites = self.sites[kind]
        if kind == "activation":
            return list(range(len(sites)))
        activations = list(enumerate(self.sites["activation"]))
        by_call = {(s.module, s.call): i for i, s in reversed(activations)}
        by_module = {s.module: i for i, s in reversed(activations)}
        rank = [(by_call.get((s.module, s.call), by_module.get(s.module, len(activations) + j)), j)
                for j, s in enumerate(sites)]
        return sorted(range(len(sites)), key=rank.__getitem__)

    def metric_stride(self) -> int:
        """The widest stride of the metrics' histories: steps per point of the coarsest line."""
        with self._synced():
            return max((history.stride for history in self.metrics.values()), default=1)

    def site_stride(self, kind: str) -> int:
        """Steps per point of the sites' lines of ``kind``."""
        _check_kind(kind)
        with self._synced():
            return self.stats[kind].stride

    def _columns(self, kind: str, statistic: str, stride: int | None = None
                 ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``names, steps, mean, lo, hi`` of one statistic, a column per site (under the lock)."""
        _check_kind(kind)
        if statistic not in _STAT_INDEX:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}.")
        s, width = _STAT_INDEX[statistic], len(STATISTICS)
        steps, mean, lo, hi = self.stats[kind].arrays(stride, slice(s, None, width))
        names = [site.name for site in self.sites[kind]]
        mean, lo, hi = (np.pad(a, ((0, 0), (0, len(names) - a.shape[1])), constant_values=np.nan)
                        for a in (mean, lo, hi))
        return names, steps, mean, lo, hi

    def default_sites(self, kind: str, statistic: str, k: int = 6) -> list[str]:
        """The ``k`` sites whose ``statistic`` changed most over the run (relative to its scale),
        then the largest, one call of each module first: a sensible default when there are too
        many sites to draw."""
        with self._synced():
            names, steps, mean, _, _ = self._columns(kind, statistic)
            module_of = {site.name: site.module for site in self.sites[kind]}
        if not len(steps) or not names:
            return names[:k]
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (a site with no finite value: all-NaN column)
            first = _first_finite(mean)
            last = _first_finite(mean[::-1])
            scale = np.nanmax(np.abs(mean), axis=0)
            change = np.nan_to_num(np.abs(last - first) / np.where(scale > 0, scale, 1.0), nan=-1.0)
            size = np.nan_to_num(scale, nan=-1.0)
        order = [names[i] for i in np.lexsort((-size, -change))]  # most change first, then largest
        # one call of a module called several times a step (``path#k``), then the others if too few
        # modules: the calls of one module trace near-identical lines over each other
        chosen, modules = [], set()
        for name in order:
            module = module_of[name]
            if module not in modules:
                chosen.append(name)
                modules.add(module)
        return (chosen + [name for name in order if name not in chosen])[:k]

    def site_series(self, kind: str, statistic: str, sites: Sequence[str] | None = None,
                    k: int = 6, stride: int | None = None) -> pd.DataFrame:
        """``site, step, value, lo, hi`` of one statistic for ``sites`` (default:
        :meth:`default_sites`), in buckets of ``stride`` steps (a power of two; default and at the least:
        :meth:`site_stride`)."""
        if isinstance(sites, str):
            raise TypeError(f"sites takes a list of site names, got the string {sites!r}; pass [{sites!r}].")
        chosen = list(sites) if sites is not None else self.default_sites(kind, statistic, k)
        with self._synced():
            names, steps, mean, lo, hi = self._columns(kind, statistic, stride)
        column = {name: j for j, name in enumerate(names)}
        unknown = [s for s in chosen if s not in column]
        if unknown:
            raise ValueError(f"no {kind} call site named {unknown[0]!r}; the sites are {names[:20]}"
                             + (" ..." if len(names) > 20 else "") + ".")
        frames = [pd.DataFrame({"site": name, "step": steps, "value": mean[:, column[name]],
                                "lo": lo[:, column[name]], "hi": hi[:, column[name]]}) for name in chosen]
        if not frames:
            return pd.DataFrame({"site": pd.Series(dtype=object), "step": pd.Series(dtype="int64"),
                                 "value": pd.Series(dtype="float32"), "lo": pd.Series(dtype="float32"),
                                 "hi": pd.Series(dtype="float32")})
        return pd.concat(frames, ignore_index=True)

    def heatmap(self, kind: str, statistic: str, max_steps: int | None = None
                ) -> tuple[list[str], np.ndarray, np.ndarray, int]:
        """``(sites in forward order, steps, values (sites, steps), stride)``: one statistic of every site,
        in at most ``max_steps`` steps where given, each the mean over a bucket of ``stride`` steps ending
        at it (the narrowest that fits; 1: every step as recorded)."""
        _check_kind(kind)
        if max_steps is not None:
            max_steps = whole_number("max_steps", max_steps, 1, "a whole number >= 1 (or None: every step kept)")
        with self._synced():
            history = self.stats[kind]
            stride = history.stride_within(max_steps) if max_steps is not None else history.stride
            names, steps, mean, _, _ = self._columns(kind, statistic, stride)
            order = self._forward_order(kind)
        return [names[i] for i in order], steps, mean[:, order].T, stride

    def latest(self, kind: str) -> pd.DataFrame:
        """``site, step`` and every statistic at the last step that recorded ``kind``, one row per
        site in forward order (a site not recorded that step is left out)."""
        _check_kind(kind)
        with self._synced():
            history = self.stats[kind]
            names = [s.name for s in self.sites[kind]]
            if not len(history) or not names:
                return pd.DataFrame(columns=["site", "step", *STATISTICS])
            step, row = history.steps[-1], history.last()
            order = self._forward_order(kind)
        table = row.reshape(-1, len(STATISTICS))
        rows = [{"site": names[i], "step": step, **dict(zip(STATISTICS, table[i].tolist()))}
                for i in order if i < len(table)]
        frame = pd.DataFrame(rows, columns=["site", "step", *STATISTICS])
        return frame[frame[list(STATISTICS)].notna().any(axis=1)].reset_index(drop=True)

    def histogram_sites(self, kind: str) -> list[str]:
        """The sites of ``kind`` that have histograms."""
        _check_kind(kind)
        with self._synced():
            return [self.sites[kind][i].name for (knd, i) in self._histograms if knd == kind]

    def _kept_histograms(self, kind: str, site: str) -> list[tuple[int, float, float, np.ndarray, float, float]]:
        """``(step, lo, hi, counts, min, max)`` of the site's kept histograms, oldest first: the
        range of the bins, the counts, the tensor's own min and max."""
        _check_kind(kind)
        with self._synced():
            names = [s.name for s in self.sites[kind]]
            if site not in names:
                raise ValueError(f"no {kind} call site named {site!r}; the sites are {names[:20]}.")
            history = self._histograms.get((kind, names.index(site)))  # (known to be there)
            return history.values() if history is not None else []

    def distribution_segments(self, kind: str, site: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """A site's histograms as they were recorded, without re-binning: runs of consecutive
        kept steps whose bins are the same (a range kept for the site over steps), each
        ``(steps (k,), edges (bins + 1,), counts (k, bins))``, oldest first. A step whose range is
        not finite (a NaN or an infinity in its tensor's own range) is left out."""
        segments: list[tuple[list[int], tuple[float, float], list[np.ndarray]]] = []
        for step, lo, hi, counts, _, _ in self._kept_histograms(kind, site):
            if not (np.isfinite(lo) and np.isfinite(hi)):
                continue
            if segments and segments[-1][1] == (lo, hi) and len(segments[-1][2][0]) == len(counts):
                segments[-1][0].append(step)
                segments[-1][2].append(counts)
            else:
                segments.append(([step], (lo, hi), [counts]))
        return [(np.array(steps, np.int64), bin_edges(lo, hi, len(counts[0])), np.stack(counts))
                for steps, (lo, hi), counts in segments]

    def distribution(self, kind: str, site: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
        """A site's distribution over time, from its histograms.

        Returns:
            ``bands``: ``step`` and one column per :data:`PERCENTILES` (``p0`` ... ``p100``);
            and a step x value heatmap on one grid: ``steps``, ``edges`` (the shared value
            bins) and ``density`` (steps, bins), each step's counts re-binned onto it (see
            :meth:`distribution_segments` for the counts as recorded).
        """
        kept = self._kept_histograms(kind, site)
        columns = ["step"] + [f"p{p}" for p in PERCENTILES]
        if not kept:
            return pd.DataFrame(columns=columns), np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 0))
        bands = []
        for step, lo, hi, counts, least, most in kept:
            edges = _value_edges(lo, hi, counts, least, most) if np.isfinite(lo) and np.isfinite(hi) else None
            bands.append([step] + ([_percentile(edges, counts, p) for p in PERCENTILES] if edges is not None
                                   else [np.nan] * len(PERCENTILES)))
        bins = len(kept[0][3])
        # the grid spans the steps' ranges (a constant step's is its value: the bar bin_edges gives it, max(1, |v|)
        # / bins wide, would squeeze the other steps' values into a few of its bins), a site constant throughout
        # the bar of its value; a constant step's count goes in the grid's bin holding its value
        spans = [(lo, hi) for _, lo, hi, _, _, _ in kept if np.isfinite(lo) and np.isfinite(hi)]
        low, high = (min(lo for lo, _ in spans), max(hi for _, hi in spans)) if spans else (0.0, 1.0)
        grid = bin_edges(low, high, bins)
        density = np.zeros((len(kept), bins), np.float32)
        for row, (_, lo, hi, counts, _, _) in enumerate(kept):
            if np.isfinite(lo) and np.isfinite(hi) and hi > lo:
                density[row] = _rebin(bin_edges(lo, hi, len(counts)), counts, grid)
            elif np.isfinite(lo) and lo == hi:
                density[row, min(max(int(np.searchsorted(grid, lo, "right")) - 1, 0), bins - 1)] = counts.sum()
        return (pd.DataFrame(bands, columns=columns), np.array([k[0] for k in kept], np.int64), grid, density)

    def anomaly_frame(self) -> pd.DataFrame:
        """The most recent rows with a NaN or an Inf, newest first (first appearance in :attr:`first_anomaly`)."""
        with self._synced():
            return pd.DataFrame(list(reversed(self.anomalies)), columns=["step", "site", "kind", "nan_count",
                                                                        "inf_count"])


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")


#: A gap between two deliveries of steps this many times their median gap is a pause (or a stall), not
#: the pace of training: left out of the steps/s a header shows.
PAUSE_GAP = 5.0


class WholeRunPace:
    """The pace a run trained at over all its steps, live and on replay alike: fed each recorded step's
    ``(time it ended, step)`` in step order, it keeps at most :attr:`KEEP` of them spread evenly over the
    run (every ``stride``-th, the stride doubling as they fill) and the last; :meth:`rate` is
    :func:`_rate` over those (pauses left out). The same steps fed give the same pace: the live
    header's "ran at" once a run ended and its replay's read the run's steps alike."""

    KEEP = 64

    def __init__(self) -> None:
        self.stride, self.seen = 1, 0
        self.kept: list[tuple[int, float, int]] = []  # (index among the steps fed, time, step)
        self.last: tuple[float, int] | None = None

    def add(self, ended: float, step: int) -> None:
        """Count one recorded step, which ended at ``ended`` (``time.time()``)."""
        if self.seen % self.stride == 0:
            self.kept.append((self.seen, ended, step))
            if len(self.kept) > self.KEEP:
                self.stride *= 2
                self.kept = [k for k in self.kept if k[0] % self.stride == 0]
        self.seen += 1
        self.last = (ended, step)

    def rate(self) -> float | None:
        """Steps per second over the run so far; None before two steps."""
        points = [(t, s) for _, t, s in self.kept]
        if self.last is not None and (not points or points[-1] != self.last):
            points.append(self.last)
        return _rate(points)


def _rate(times: Sequence[tuple[float, int]]) -> float | None:
    """Steps per second over ``(time, last step)`` of the recent deliveries, the pauses left out
    (:data:`PAUSE_GAP`): a run resumed after a pause reads at its pace, not slowed by the pause."""
    if len(times) < 2:
        return None
    spans = np.diff(np.asarray(times, np.float64), axis=0)  # (seconds, steps) between deliveries
    kept = spans[spans[:, 0] <= PAUSE_GAP * np.median(spans[:, 0])]
    seconds, steps = kept.sum(axis=0) if len(kept) else (0.0, 0.0)
    return float(steps / seconds) if seconds > 0 and steps > 0 else None


def _ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased, skipping NaNs."""
    out = values.astype(np.float64)
    last = debias = 0.0
    for i, v in enumerate(out):
        if np.isfinite(v):
            last = last * weight + (1 - weight) * v
            debias = debias * weight + (1 - weight)
            out[i] = last / debias
    return out


def _first_finite(matrix: np.ndarray) -> np.ndarray:
    """Per column, the first finite value (NaN where none)."""
    finite = np.isfinite(matrix)
    index = np.argmax(finite, axis=0)
    values = matrix[index, np.arange(matrix.shape[1])]
    return np.where(finite.any(axis=0), values, np.nan)


def _value_edges(lo: float, hi: float, counts: np.ndarray, least: float, most: float) -> np.ndarray:
    """The edges of the bins over [lo, hi], the outer edges of the first and last non-empty bins
    moved to the tensor's min and max (``least``, ``most``) where those are finite: the values of
    those bins reach no further (a value outside a kept range counts in the end bin on its side,
    and a sampled histogram may miss the extremes), so the 0th and 100th percentiles are the
    exact min and max."""
    edges = bin_edges(lo, hi, len(counts))
    filled = np.flatnonzero(counts > 0)
    if len(filled) and np.isfinite(least) and np.isfinite(most):
        first, last = filled[0], filled[-1]
        edges[:first + 1] = min(least, edges[first + 1])  # (the empty bins before it: no width, no mass)
        edges[last + 1:] = max(most, edges[last])
    return edges


def _percentile(edges: np.ndarray, counts: np.ndarray, p: float) -> float:
    total = counts.sum()
    if total <= 0:
        return float("nan")
    cdf = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)]) / total
    return float(np.interp(p / 100.0, cdf, edges)) if cdf[-1] > 0 else float("nan")


def _rebin(edges: np.ndarray, counts: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``counts`` over ``edges`` redistributed onto ``grid`` (values spread evenly within a bin)."""
    cdf = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    at = np.interp(grid, edges, cdf, left=0.0, right=cdf[-1])
    return np.diff(at).astype(np.float32)
