"""Opening a long stored run into a view, and exporting it to TensorBoard, measured in one process.

The run is made with a built-in experiment (small model, many steps, histograms on), or given with
``--run``. Each line sets the way the reading or writing was done before beside the way it is done now,
on the same run, in the same process:

1. the run's rows and histograms (``to_pandas``, ``histograms``), with every query read by
   ``pandas.read_sql_query`` (before) and with sqlite3's rows made into a frame directly (now);
2. the whole of ``RunView.from_run`` (opening a run in the app, ``Dashboard(run)``, ``Compare``): a part's
   rows read as a frame (a Python object per value) and each site's histograms taken a step at a time
   (before: ``RowsFrameView``, kept here), and ``Run._view_part``'s arrays with the histograms stacked per
   site (now); the two views are checked equal first;
3. the export's serialized events written with tensorboard's ``EventFileWriter`` (its CRC-32C a Python
   loop over every byte: before) and with ``workbench.instrument.tensorboard.EventFile`` (now);
4. the whole of ``Run.export(<dir>)`` as it is now (left out with ``--no-export``).

    python bench/replay.py [--experiment efficientzero_dynamics] [--steps 400] [--run PATH] [--rounds 3]
        [--no-export]

Measured 2026-11-28 on the 2-core workstation under load 10 to 16 (other jobs: the ratios count): opening the
1,000-step ``ilql`` run (146 MB), ``RunView.from_run`` took 27.7 s before and 15.0 s now (1.9x, medians of 3);
one after the other in two processes, less loaded, 10.4 s and 3.3 s (3.1x). The 2,000-step
``efficientzero_dynamics`` run (231 MB): 23.9 s and 11.3 s (2.1x).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import workbench
from workbench.instrument.runs import _counts
from workbench.instrument.tensorboard import EventFile
from workbench.ui.views import RunView


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def make_run(root: Path, experiment: str, steps: int) -> Path:
    exp = workbench.experiments.create(experiment, seed=0, batch_size=8)
    exp.run(steps, store=root / "run", progress=False)
    return root / "run"


class ReadSqlRun(workbench.Run):
    """A run read as ``Run`` read it before: every query through ``pandas.read_sql_query``."""

    def _query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        with contextlib.closing(self._connect()) as db:
            return pd.read_sql_query(sql, db, params=params)


class RowsFrameView(RunView):
    """``RunView.from_run`` as it read a stored run before ``Run._view_part``: the rows of a part as a frame
    (``Run.to_pandas``: a Python object per value), their layouts told by a ``groupby`` of their keys, the
    histograms' ranges and counts as a list, and each site's histograms taken a step at a time."""

    def _read_steps(self, run, part, by_step, logged) -> None:
        from workbench.ui.views import STATISTICS, _Block

        rows = run.to_pandas(steps=part)
        where, params = "step BETWEEN ? AND ?", tuple(part)
        _, records = run._fetch(f"SELECT lo, hi, counts FROM histograms WHERE {where} ORDER BY step, seq", params)
        lows, highs, blobs = zip(*records) if records else ((), (), ())
        lows, highs = np.array(lows, dtype=np.float64), np.array(highs, dtype=np.float64)
        counts = _counts(blobs) if len(blobs) == len(rows) and len(rows) else None
        codes = rows.groupby(["module", "call", "kind", "tensor", "shape"], sort=False).ngroup().to_numpy()
        starts = np.flatnonzero(np.r_[True, rows.step.to_numpy()[1:] != rows.step.to_numpy()[:-1]])[:len(rows)]
        ends = np.r_[starts[1:], len(rows)]
        table = rows[list(STATISTICS)].to_numpy(np.float32)
        numel = rows.numel.to_numpy()
        row_steps = {int(rows.step.iat[a]): (a, b) for a, b in zip(starts, ends)}
        block: list[int] = []

        def flush() -> None:
            if not block:
                return
            a, b = row_steps.get(block[0], (0, 0))
            keys = tuple((m, int(c), k, t, sh) for m, c, k, t, sh in
                         rows.iloc[a:b][["module", "call", "kind", "tensor", "shape"]].itertuples(index=False))
            spans = [row_steps[step] for step in block] if b > a else []
            hist = [None] * len(block)
            if counts is not None and spans:
                hist = [(lows[x:y], highs[x:y], np.stack(counts[x:y])) for x, y in spans]
            self._take(_Block(list(block), keys, numel[a:b], np.stack([table[x:y] for x, y in spans]) if spans
                              else None, None, [by_step.get(step, {}) for step in block], hist))
            block.clear()

        layout = None
        for step in sorted(row_steps.keys() | set(logged)):
            self.last_step, self.steps_fed = max(self.last_step, step), self.steps_fed + 1
            a, b = row_steps.get(step, (0, 0))
            this = tuple(codes[a:b])
            if block and this != layout:
                flush()
            layout = this
            block.append(step)
        flush()

    def _take_histograms(self, block, targets) -> None:
        from workbench.instrument import KINDS
        from workbench.ui.views import _STAT_INDEX, History

        recorded = [(r, step, h) for r, (step, h) in enumerate(zip(block.steps, block.histograms)) if h is not None]
        if not recorded:
            return
        steps = [step for _, step, _ in recorded]
        low, high = block.table[:, :, _STAT_INDEX["min"]], block.table[:, :, _STAT_INDEX["max"]]
        for i, (kind_index, site) in enumerate(targets):
            if site < 0:
                continue
            kept = self._histograms.get((KINDS[kind_index], int(site)))
            if kept is None:
                kept = self._histograms[(KINDS[kind_index], int(site))] = History(
                    self.histogram_capacity, self.histogram_capacity // 4, merge="last")
            kept.extend(steps, [(step, float(lows[i]), float(highs[i]), np.asarray(counts[i], np.float32),
                                 float(low[r, i]), float(high[r, i])) for r, step, (lows, highs, counts) in recorded])


def same_views(a: RunView, b: RunView) -> None:
    """Raises AssertionError unless the two views of one run draw the same."""
    from workbench.instrument import KINDS

    pd.testing.assert_frame_equal(a.metrics_frame(), b.metrics_frame())
    assert a.header()["step"] == b.header()["step"] and a.steps_fed == b.steps_fed
    for kind in KINDS:
        assert a.site_order(kind) == b.site_order(kind) and a.histogram_sites(kind) == b.histogram_sites(kind)
        for statistic in ("mean", "norm", "nan_count"):
            pd.testing.assert_frame_equal(a.site_series(kind, statistic, a.site_order(kind)),
                                          b.site_series(kind, statistic, b.site_order(kind)))
        for site in a.histogram_sites(kind):
            for x, y in zip(a.distribution_segments(kind, site), b.distribution_segments(kind, site)):
                for p, q in zip(x, y):
                    np.testing.assert_array_equal(p, q)


def interleaved(ways: dict, rounds: int) -> dict[str, float]:
    """The median seconds of each way, the ways taking turns round by round (a busy machine slows both)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            times[name].append(timed(fn)[0])
    return {name: statistics.median(t) for name, t in times.items()}


def events_of(log_dir: Path) -> list[bytes]:
    """The serialized events of an exported run (its file's records)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    return [record for path in sorted(log_dir.iterdir()) for record in RawEventFileLoader(str(path)).Load()]


def tensorboard_writer(log_dir: Path, events: list[bytes]) -> None:
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(log_dir))
    for event in events:
        writer._async_writer.write(event)  # (what EventFileWriter.add_event does with an Event's bytes)
    writer.close()


def event_file(log_dir: Path, events: list[bytes]) -> None:
    writer = EventFile(log_dir, time.time())
    for event in events:
        writer.add(event)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="efficientzero_dynamics")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--run", help="a stored run to measure instead of a new one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-export", action="store_true", help="measure the reading alone")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="workbench-replay-"))
    path = Path(args.run) if args.run else make_run(root, args.experiment, args.steps)
    run = workbench.load_run(path)
    size = sum(f.stat().st_size for f in run.path.iterdir() if f.is_file()) / 1e6
    print(f"run {path}: {len(run.steps)} steps, {size:.0f} MB")

    old = ReadSqlRun(path)
    pd.testing.assert_frame_equal(old.to_pandas(), run.to_pandas())
    t = interleaved({"before": lambda: (old.to_pandas(), old.histograms()),
                     "now": lambda: (run.to_pandas(), run.histograms())}, args.rounds)
    print(f"rows + histograms read: read_sql {t['before']:.2f} s | now {t['now']:.2f} s "
          f"({t['before'] / t['now']:.1f}x)")
    same_views(RowsFrameView.from_run(run), RunView.from_run(run))
    t = interleaved({"before": lambda: RowsFrameView.from_run(run), "now": lambda: RunView.from_run(run)}, args.rounds)
    print(f"RunView.from_run: rows frame {t['before']:.2f} s | arrays now {t['now']:.2f} s "
          f"({t['before'] / t['now']:.1f}x)")

    if args.no_export:
        return
    export, log_dir = timed(lambda: run.export(root / "tb"))
    events = events_of(log_dir)
    megabytes = sum(map(len, events)) / 1e6
    before, _ = timed(lambda: tensorboard_writer(root / "tb-before", events))
    after, _ = timed(lambda: event_file(root / "tb-after", events))
    assert events_of(root / "tb-before")[1:] == events_of(root / "tb-after")[1:]  # (after each file's version event)
    print(f"{len(events)} events ({megabytes:.0f} MB) written: EventFileWriter {before:.2f} s | "
          f"EventFile {after:.2f} s ({before / after:.1f}x)")

    print(f"Run.export(TensorBoard) now: {export:.2f} s")


if __name__ == "__main__":
    main()
