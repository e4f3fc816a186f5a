"""Export a stored run to TensorBoard event files, for people who keep using TensorBoard.

Needs the ``tensorboard`` package (``pip install tensorboard``); nothing else
in workbench does. Tags: ``metrics/<name>``, ``<kind>/<module>/<tensor>/<statistic>`` and, for runs
recorded with histograms, ``<kind>/<module>/<tensor>`` histograms; a module called more than once a step
is ``<module>#<call>``, as the app names its call sites (``(model)`` is the model itself).
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from workbench.instrument.runs import Run

__all__ = ["export_tensorboard", "SCALARS"]

SCALARS = ("mean", "std", "norm", "abs_mean", "min", "max", "zero_frac")


def _tagger(rows: pd.DataFrame) -> Callable[[str, int, str, str], str]:
    """The tag of a row's tensor, ``#call`` where its module is called more than once a step (``rows``:
    the run's)."""
    again = set(rows.loc[rows.call > 0, ["kind", "module"]].itertuples(index=False, name=None))

    def tag(module: str, call: int, kind: str, tensor: str) -> str:
        return f"{kind}/{module or '(model)'}{f'#{call}' if (kind, module) in again else ''}/{tensor}"

    return tag


def export_tensorboard(run: Run, log_dir: str | Path) -> Path:
    """Write ``run``'s metrics, statistics (:data:`SCALARS`) and histograms as TensorBoard event files
    in ``log_dir``; returns it. A step's values go in one event of each sort (scalars, histograms), not
    one event a value: an export's cost follows the events it writes."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ImportError("Exporting to TensorBoard needs tensorboard: pip install tensorboard "
                          "(or export to .csv / .parquet).") from None
    log_dir = Path(log_dir)
    writer = EventFileWriter(str(log_dir))
    now = time.time()

    def write(step: int, values: list) -> None:
        if values:
            writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=values)))

    try:
        metrics = run.metrics()
        names = [c for c in metrics.columns if c != "step"]
        for step, group in metrics.groupby("step", sort=True):
            write(int(step), [Summary.Value(tag=f"metrics/{name}", simple_value=float(value))
                              for name in names for value in group[name] if value == value])  # (NaN: not logged)
        rows = run.to_pandas().sort_values("step", kind="stable")  # (TensorBoard drops a tag's later steps
        # when an earlier one comes after them)
        _tag = _tagger(rows)
        tags = [_tag(*key) for key in zip(rows.module, rows.call, rows.kind, rows.tensor)]
        stats = rows[list(SCALARS)].to_numpy(np.float64)
        finite = np.isfinite(stats)
        steps = rows.step.to_numpy()
        for start, end in _runs_of(steps):
            write(int(steps[start]), [Summary.Value(tag=f"{tags[i]}/{stat}", simple_value=stats[i, j])
                                      for i in range(start, end) for j, stat in enumerate(SCALARS) if finite[i, j]])
        keys = ["step", "module", "call", "kind", "tensor"]
        histograms = run.histograms().merge(rows[keys + ["numel", "mean", "norm"]], on=keys).sort_values(
            "step", kind="stable")
        for step, group in histograms.groupby("step", sort=True):
            values = []
            for row in group.itertuples(index=False):
                lo, hi = row.edges[0], row.edges[-1]
                if np.isfinite(lo) and np.isfinite(hi):
                    histogram = HistogramProto(min=float(lo), max=float(hi), num=float(row.numel),
                                               sum=float(row.mean * row.numel), sum_squares=float(row.norm) ** 2,
                                               bucket_limit=row.edges[1:].tolist(), bucket=row.counts.tolist())
                    values.append(Summary.Value(tag=_tag(row.module, row.call, row.kind, row.tensor), histo=histogram))
            write(int(step), values)
    finally:
        writer.close()
    return log_dir


def _runs_of(steps: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values in ``steps`` (rows come step by step)."""
    cuts = np.flatnonzero(np.diff(steps)) + 1
    bounds = np.r_[0, cuts, len(steps)]
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
