"""Export a stored run to TensorBoard event files, for people who keep using TensorBoard.

Needs the ``tensorboard`` package (``pip install tensorboard``); nothing else
in workbench does. Tags: ``metrics/<name>``, ``<kind>/<module>#<call>/<tensor>/<statistic>``
and, for runs recorded with histograms, ``<kind>/<module>#<call>/<tensor>`` histograms.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workbench.instrument.runs import Run

__all__ = ["export_tensorboard", "SCALARS"]

SCALARS = ("mean", "std", "norm", "abs_mean", "min", "max", "zero_frac")


def _tag(module: str, call: int, kind: str, tensor: str) -> str:
    return f"{kind}/{module or '(model)'}#{call}/{tensor}"


def export_tensorboard(run: Run, log_dir: str | Path) -> Path:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError("Exporting to TensorBoard needs tensorboard: pip install tensorboard "
                          "(or export to .csv / .parquet).") from None
    log_dir = Path(log_dir)
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for row in run.metrics().itertuples(index=False):
            values = row._asdict()
            step = int(values.pop("step"))
            for name, value in values.items():
                if value == value:  # not NaN: metrics a step did not log
                    writer.add_scalar(f"metrics/{name}", value, step)
        rows = run.to_pandas()
        for row in rows.itertuples(index=False):
            tag = _tag(row.module, row.call, row.kind, row.tensor)
            for stat in SCALARS:
                value = getattr(row, stat)
                if np.isfinite(value):
                    writer.add_scalar(f"{tag}/{stat}", value, int(row.step))
        keys = ["step", "module", "call", "kind", "tensor"]
        histograms = run.histograms().merge(rows[keys + ["numel", "mean", "norm"]], on=keys)
        for row in histograms.itertuples(index=False):
            lo, hi = row.edges[0], row.edges[-1]
            if not (np.isfinite(lo) and np.isfinite(hi)):
                continue
            writer.add_histogram_raw(
                _tag(row.module, row.call, row.kind, row.tensor), min=float(lo), max=float(hi),
                num=float(row.numel), sum=float(row.mean * row.numel), sum_squares=float(row.norm) ** 2,
                bucket_limits=row.edges[1:].tolist(), bucket_counts=row.counts.tolist(), global_step=int(row.step))
    finally:
        writer.close()
    return log_dir
