"""Export a stored run to TensorBoard event files, for people who keep using TensorBoard.

Needs the ``tensorboard`` and ``google-crc32c`` packages (``pip install tensorboard google-crc32c``);
nothing else in workbench does. Tags: ``metrics/<name>``, ``<kind>/<module>/<tensor>/<statistic>`` and, for runs
recorded with histograms, ``<kind>/<module>/<tensor>`` histograms; a module called more than once a step
is ``<module>#<call>``, as the app names its call sites (``(model)`` is the model itself).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from workbench.instrument.runs import Run

__all__ = ["export_tensorboard", "SCALARS", "COUNTS", "EventFile", "masked_crc32c"]

SCALARS = ("mean", "std", "norm", "abs_mean", "min", "max", "zero_frac")
#: Written too for the sites with a NaN or infinite value at some step, at each of their steps.
COUNTS = ("nan_count", "inf_count")


def _tagger(rows: pd.DataFrame) -> Callable[[str, int, str, str], str]:
    """The tag of a row's tensor, ``#call`` where its module is called more than once a step (``rows``:
    the run's)."""
    again = set(rows.loc[rows.call > 0, ["kind", "module"]].itertuples(index=False, name=None))

    def tag(module: str, call: int, kind: str, tensor: str) -> str:
        return f"{kind}/{module or '(model)'}{f'#{call}' if (kind, module) in again else ''}/{tensor}"

    return tag


def export_tensorboard(run: Run, log_dir: str | Path, metrics_only: bool = False) -> Path:
    """Write ``run``'s metrics, statistics (:data:`SCALARS`, and :data:`COUNTS` where a tensor went NaN or
    infinite) and histograms (its metrics alone with ``metrics_only``) as TensorBoard event files in
    ``log_dir``; returns it. A step's values go in one event of each sort (scalars, histograms), not one
    event a value: an export's cost follows the events it writes."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        if importlib.util.find_spec("google_crc32c") is None:  # (the records' checksums: before any file)
            raise ImportError("google-crc32c")
    except ImportError:
        # (the packages by name: 'workbench[export]' would ask the package index for a project of that name)
        raise ImportError("Exporting to TensorBoard needs tensorboard and google-crc32c: pip install tensorboard "
                          "google-crc32c, or pip install -e '.[export]' in the checkout (or export to .csv / "
                          ".parquet).") from None
    log_dir = Path(log_dir)
    now = time.time()
    writer = EventFile(log_dir, now)

    def write(step: int, values: list) -> None:
        if values:
            writer.add(Event(wall_time=now, step=step, summary=Summary(value=values)).SerializeToString())

    try:
        # (the logged values, a NaN logged as NaN, which TensorBoard marks: the wide frame's NaN is also "not logged")
        metrics = run.metrics(long=True)
        for step, group in metrics.groupby("step", sort=True):
            write(int(step), [Summary.Value(tag=f"metrics/{name}", simple_value=float(value))
                              for name, value in zip(group["name"].tolist(), group["value"].tolist())])
        if metrics_only:
            return log_dir
        rows = run.to_pandas().sort_values("step", kind="stable")  # (TensorBoard drops a tag's later steps
        # when an earlier one comes after them)
        _tag = _tagger(rows)
        # (the columns as Python lists and a tag per site, not per row: no pandas or numpy item a value)
        keys = list(zip(*(rows[c].tolist() for c in ("module", "call", "kind", "tensor"))))
        site_tags = {key: _tag(*key) for key in set(keys)}
        scalar_tags = {key: [f"{tag}/{stat}" for stat in SCALARS] for key, tag in site_tags.items()}
        stats = rows[list(SCALARS)].to_numpy(np.float64)
        finite, values = np.isfinite(stats).tolist(), stats.tolist()
        # a tensor that goes NaN or infinite: its statistics stop there (TensorBoard draws no NaN), and its
        # counts of those values (COUNTS) say why, at every step of each site that has any
        counts = rows[list(COUNTS)].to_numpy(np.float64)
        count_tags = {keys[i]: [f"{site_tags[keys[i]]}/{name}" for name in COUNTS]
                      for i in np.flatnonzero(counts.sum(axis=1) > 0).tolist()}
        counts = counts.tolist()
        steps = rows.step.to_numpy()
        for start, end in _runs_of(steps):
            write(int(steps[start]), [Summary.Value(tag=tag, simple_value=value)
                                      for i in range(start, end)
                                      for tag, value, keep in zip(scalar_tags[keys[i]], values[i], finite[i]) if keep]
                  + [Summary.Value(tag=tag, simple_value=value)
                     for i in range(start, end) if keys[i] in count_tags
                     for tag, value in zip(count_tags[keys[i]], counts[i])])
        on = ["step", "module", "call", "kind", "tensor"]
        histograms = run.histograms().merge(rows[on + ["numel", "mean", "norm"]], on=on).sort_values(
            "step", kind="stable")
        columns = on + ["edges", "counts", "numel", "mean", "norm"]
        step, values = None, []
        for at, module, call, kind, tensor, edges, counts, numel, mean, norm in zip(
                *(histograms[c].tolist() for c in columns)):
            if at != step:
                write(step, values)
                step, values = at, []
            lo, hi = float(edges[0]), float(edges[-1])
            if np.isfinite(lo) and np.isfinite(hi):
                histogram = HistogramProto(min=lo, max=hi, num=float(numel), sum=float(mean * numel),
                                           sum_squares=float(norm) ** 2, bucket_limit=edges[1:].tolist(),
                                           bucket=counts.tolist())
                values.append(Summary.Value(tag=site_tags[(module, call, kind, tensor)], histo=histogram))
        write(step, values)
    finally:
        writer.close()
    return log_dir


def _runs_of(steps: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values in ``steps`` (rows come step by step)."""
    if len(steps) == 0:  # (a run with no rows: no runs of steps)
        return []
    cuts = np.flatnonzero(np.diff(steps)) + 1
    bounds = np.r_[0, cuts, len(steps)]
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


# ---------------------------------------------------------------- event files
# TensorBoard's own writer checksums every byte in a Python loop (without TensorFlow its CRC-32C is pure
# Python): that loop was most of an export. The records here are the same (TFRecord framing: length,
# its masked CRC-32C, the event, its masked CRC-32C), their checksums computed in C by google-crc32c.


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C of ``data``, as TFRecord files keep it."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventFile:
    """A TensorBoard event file in ``log_dir``, written a batch of events at a time (:meth:`add`
    keeps them until :data:`BATCH` bytes, or :meth:`close`)."""

    BATCH = 16 << 20

    def __init__(self, log_dir: Path, wall_time: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        log_dir.mkdir(parents=True, exist_ok=True)
        stem = f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}.{os.getpid()}"
        for n in itertools.count():  # (a name of its own: another export into the same directory keeps its file)
            try:
                self._file = open(log_dir / f"{stem}.{n}", "xb")
                break
            except FileExistsError:
                continue
        self._events: list[bytes] = []
        self._size = 0
        self.add(Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())

    def add(self, event: bytes) -> None:
        self._events.append(event)
        self._size += len(event)
        if self._size >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._events:
            return
        records = []
        for event in self._events:
            header = struct.pack("<Q", len(event))
            records += [header, struct.pack("<I", masked_crc32c(header)), event,
                        struct.pack("<I", masked_crc32c(event))]
        self._file.write(b"".join(records))
        self._events, self._size = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._file.close()
