"""Opening a long stored run into a view, and exporting it to TensorBoard, measured in one process.

The run is made with a built-in experiment (small model, many steps, histograms on), or given with
``--run``. Each line sets the way the reading or writing was done before beside the way it is done now,
on the same run, in the same process:

1. the run's rows and histograms, and the whole of ``RunView.from_run``, with every query read by
   ``pandas.read_sql_query`` and the view reading the histograms' whole frame (before), and with
   sqlite3's rows made into a frame directly and the view reading the histograms' ranges and counts
   alone (now);
2. the export's serialized events written with tensorboard's ``EventFileWriter`` (its CRC-32C a Python
   loop over every byte: before) and with ``workbench.instrument.tensorboard.EventFile`` (now);
3. the whole of ``Run.export(<dir>)`` as it is now.

    python bench/replay.py [--experiment efficientzero_dynamics] [--steps 400] [--run PATH] [--rounds 3]
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

    def _histogram_ranges(self, steps: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """As ``RunView.from_run`` read them before: the whole ``histograms`` frame (names, edges)."""
        frame = self.histograms(steps=steps)
        return np.array([e[0] for e in frame.edges]), np.array([e[-1] for e in frame.edges]), frame.counts.to_list()


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
    t = interleaved({"before": lambda: RunView.from_run(old), "now": lambda: RunView.from_run(run)}, args.rounds)
    print(f"RunView.from_run: read_sql {t['before']:.2f} s | now {t['now']:.2f} s ({t['before'] / t['now']:.1f}x)")

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
