"""The run store: one SQLite database (stdlib sqlite3, WAL mode) per run directory.

A :class:`RunStore` subscribes to a Recorder and writes each update in one
transaction, so a step is either wholly in the store or absent, and a process
killed mid-run leaves every committed step readable (WAL: the database file
is never rewritten in place by a half-finished transaction). Readers in other
processes open it read-only and see every committed step while it is written.

Tables (``pandas.read_sql`` works on them directly):

- ``meta(key, value)``: JSON values - schema_version, model, config,
  experiment, seed, versions, start_time, status.
- ``steps(step, rows, time)``: one row per stored step (the commit marker).
- ``rows``: the statistics rows (``ROW_COLUMNS`` plus ``seq``, the row's
  position within its step).
- ``histograms(step, seq, lo, hi, counts)``: counts as float32 bytes.
- ``metrics(step, name, value)``; ``errors(step, module, call, kind, error)``.
- view ``anomalies``: the rows with a NaN or an Inf, in recording order.
"""

from __future__ import annotations

import json
import platform
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument.recorder import ROW_COLUMNS, Recorder, StepRecord, Subscription, Update, format_shape
from workbench.instrument.stats import MAX, MIN, finish

__all__ = ["SCHEMA_VERSION", "DB_NAME", "RunStore", "Run", "load_run", "list_runs", "compare_runs", "RunError"]

SCHEMA_VERSION = 1
DB_NAME = "run.sqlite"
STAT_SQL = ", ".join(f"{c} {'INTEGER' if c in ('numel', 'nan_count', 'inf_count') else 'REAL'}"
                     for c in ROW_COLUMNS[6:])

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, rows INTEGER NOT NULL, time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
    step INTEGER NOT NULL, seq INTEGER NOT NULL, module TEXT NOT NULL, call INTEGER NOT NULL,
    kind TEXT NOT NULL, tensor TEXT NOT NULL, shape TEXT NOT NULL, {STAT_SQL},
    PRIMARY KEY (step, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rows_by_site ON rows (module, kind, step);
CREATE TABLE IF NOT EXISTS histograms (
    step INTEGER NOT NULL, seq INTEGER NOT NULL, lo REAL, hi REAL, counts BLOB NOT NULL,
    PRIMARY KEY (step, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metrics (step INTEGER NOT NULL, name TEXT NOT NULL, value REAL,
    PRIMARY KEY (step, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS errors (step INTEGER, module TEXT, call INTEGER, kind TEXT, error TEXT);
CREATE VIEW IF NOT EXISTS anomalies AS
    SELECT * FROM rows WHERE nan_count > 0 OR inf_count > 0 ORDER BY step, seq;
"""


class RunError(ValueError):
    """A path that is not a readable run: not a run, a newer schema, a damaged file."""


def versions() -> dict[str, str]:
    import torch

    import workbench

    return {"workbench": workbench.__version__, "torch": torch.__version__, "python": platform.python_version()}


class RunStore:
    """Writes a run directory. Attach it to a Recorder with :meth:`attach`.

    Args:
        path: the run directory (created; must not hold a run already).
        metadata: JSON-serialisable facts of the run (model, config ...).
    """

    def __init__(self, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        if (self.path / DB_NAME).exists():
            raise FileExistsError(f"{self.path} already holds a run; pick a new directory or "
                                  "load it with workbench.load_run().")
        self.path.mkdir(parents=True, exist_ok=True)
        self.errors: list[str] = []
        self._subscription: Subscription | None = None
        self._db = sqlite3.connect(self.path / DB_NAME, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process; fsync per checkpoint
        self._db.executescript(SCHEMA)
        meta = {"schema_version": SCHEMA_VERSION, "start_time": time.time(), "status": "running",
                "versions": versions(), **(metadata or {})}
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 [(k, json.dumps(v, default=str)) for k, v in meta.items()])

    def _transaction(self):
        db = self._db

        class Transaction:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *rest):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return Transaction()

    def attach(self, recorder: Recorder, max_pending: int = 10_000) -> Subscription:
        """Write every record the recorder publishes from now on (on the subscriber's thread)."""
        self._subscription = recorder.subscribe(self.write, max_pending=max_pending)
        return self._subscription

    def write(self, update: Update | StepRecord) -> None:
        """Write records, each step in one transaction with its commit marker."""
        records = update.records if isinstance(update, Update) else (update,)
        if isinstance(update, Update) and update.dropped:
            self.errors.append(f"{update.dropped} steps were dropped before they could be written")
        for record in records:
            self._write_step(record)

    def _write_step(self, record: StepRecord) -> None:
        rows = []
        if len(record):
            stats = finish(record.numel, record.sums)
            columns = [stats[c] for c in ROW_COLUMNS[6:]]
            for seq, (module, call, kind, tensor, shape) in enumerate(record.keys):
                rows.append((record.step, seq, module, int(call), kind, tensor, format_shape(shape),
                             *(_sql_value(col[seq]) for col in columns)))
        with self._transaction():
            self._db.executemany(f"INSERT INTO rows VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 1))})", rows)
            if record.histograms is not None:
                self._db.executemany("INSERT INTO histograms VALUES (?, ?, ?, ?, ?)", [
                    (record.step, seq, _sql_value(record.sums[seq, MIN]), _sql_value(record.sums[seq, MAX]),
                     record.histograms[seq].astype(np.float32).tobytes())
                    for seq in range(len(record))])
            self._db.executemany("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)",
                                 [(record.step, k, v) for k, v in record.metrics.items()])
            self._db.executemany("INSERT INTO errors VALUES (?, ?, ?, ?, ?)",
                                 [(e["step"], e["module"], e["call"], e["kind"], e["error"]) for e in record.errors])
            self._db.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (record.step, len(rows), time.time()))

    def set_meta(self, **values: Any) -> None:
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 [(k, json.dumps(v, default=str)) for k, v in values.items()])

    def close(self, status: str = "finished") -> None:
        """Write what is queued, mark the run finished and close the database."""
        if self._subscription is not None:
            self._subscription.unsubscribe()
            self._subscription = None
        if self._db is not None:
            self.set_meta(status=status, end_time=time.time())
            self._db.close()
            self._db = None


def _sql_value(value: Any) -> Any:
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and np.isnan(value) else value


class Run:
    """A stored run, read-only. Get one with :func:`load_run`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        db_path = self.path / DB_NAME if self.path.is_dir() else self.path
        if not db_path.is_file():
            raise RunError(f"{path} is not a workbench run: it has no {DB_NAME}. "
                           f"Runs are the directories given as store=...; see workbench.list_runs(root).")
        self.db_path = db_path
        if db_path.name == DB_NAME:
            self.path = db_path.parent
        try:
            meta = dict(self._query("SELECT key, value FROM meta").itertuples(index=False))
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise RunError(f"{db_path} is damaged or not a workbench run database ({exc}).") from None
        try:
            self.metadata = {k: json.loads(v) for k, v in meta.items()}
        except json.JSONDecodeError as exc:
            raise RunError(f"{db_path} has damaged metadata ({exc}).") from None
        version = self.metadata.get("schema_version")
        if not isinstance(version, int):
            raise RunError(f"{db_path} is not a workbench run database (no schema_version).")
        if version > SCHEMA_VERSION:
            raise RunError(f"{db_path} was written with run-store schema {version}; this workbench "
                           f"reads up to {SCHEMA_VERSION}. Upgrade workbench to read it.")

    @property
    def name(self) -> str:
        return self.path.name

    def _connect(self) -> sqlite3.Connection:
        # read-only: a reader never takes a write lock, so it cannot stall the writer
        return sqlite3.connect(f"file:{self.db_path.resolve()}?mode=ro", uri=True)

    def _query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        db = self._connect()
        try:
            return pd.read_sql_query(sql, db, params=params)
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise RunError(f"{self.db_path} is damaged or not a workbench run database ({exc}).") from None
        finally:
            db.close()

    @property
    def steps(self) -> list[int]:
        """The steps stored (committed) so far."""
        return self._query("SELECT step FROM steps ORDER BY step").step.tolist()

    def to_pandas(self) -> pd.DataFrame:
        """The statistics rows, with the columns of ``watch().to_pandas()``."""
        frame = self._query(f"SELECT {', '.join(ROW_COLUMNS)} FROM rows ORDER BY step, seq")
        return _typed(frame)

    def metrics(self) -> pd.DataFrame:
        """One row per step: ``step`` and a column per metric."""
        long = self._query("SELECT step, name, value FROM metrics ORDER BY step")
        if long.empty:
            return pd.DataFrame({"step": pd.Series(dtype="int64")})
        wide = long.pivot(index="step", columns="name", values="value").reset_index()
        wide.columns.name = None
        return wide

    def histograms(self, module: str | None = None, kind: str | None = None) -> pd.DataFrame:
        """``step, module, call, kind, tensor, edges, counts`` for the stored histograms."""
        where, params = [], []
        for column, value in (("r.module", module), ("r.kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = ("SELECT r.step, r.module, r.call, r.kind, r.tensor, h.lo, h.hi, h.counts FROM histograms h "
               "JOIN rows r ON r.step = h.step AND r.seq = h.seq"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY h.step, h.seq")
        frame = self._query(sql, tuple(params))
        counts = [np.frombuffer(b, dtype=np.float32) for b in frame.pop("counts")]
        lo, hi = frame.pop("lo"), frame.pop("hi")
        frame["edges"] = [np.linspace(a, b, len(c) + 1) for a, b, c in zip(lo, hi, counts)]
        frame["counts"] = counts
        return frame

    def errors(self) -> pd.DataFrame:
        return self._query("SELECT * FROM errors")

    def anomalies(self) -> pd.DataFrame:
        """Rows with NaN or Inf, first appearance first."""
        return _typed(self._query(f"SELECT {', '.join(ROW_COLUMNS)} FROM anomalies"))

    def export(self, path: str | Path, what: str = "rows") -> Path:
        """Write ``what`` (``"rows"`` or ``"metrics"``) to CSV or Parquet (by the suffix), or a
        TensorBoard log directory (a path without a suffix: scalars and histograms per call site).

        Raises:
            ValueError: an unknown suffix or ``what``.
            ImportError: Parquet without pyarrow, TensorBoard without tensorboard, with the pip command.
        """
        path = Path(path)
        if what not in ("rows", "metrics"):
            raise ValueError(f"what must be 'rows' or 'metrics', got {what!r}.")
        frame = self.to_pandas() if what == "rows" else self.metrics()
        suffix = path.suffix.lower()
        if suffix == ".csv":
            frame.to_csv(path, index=False)
        elif suffix == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ImportError("Exporting to Parquet needs pyarrow: pip install pyarrow "
                                  "(or export to .csv, which needs nothing).") from None
            frame.to_parquet(path, index=False)
        elif suffix == "":
            from workbench.instrument.tensorboard import export_tensorboard

            export_tensorboard(self, path)
        else:
            raise ValueError(f"Cannot export to {path.name!r}: use a .csv or .parquet file, or a directory "
                             "(no suffix) for TensorBoard event files.")
        return path

    def __repr__(self) -> str:
        m = self.metadata
        return (f"Run({self.name!r}, model={m.get('model')!r}, experiment={m.get('experiment')!r}, "
                f"status={m.get('status')!r})")


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    for column in ROW_COLUMNS[6:]:
        if column not in ("numel", "nan_count", "inf_count"):
            frame[column] = frame[column].astype("float64")  # NULL (NaN statistics) reads as None
    return frame


def load_run(path: str | Path) -> Run:
    """Open a stored run (also while it is being written).

    Raises:
        RunError: ``path`` is not a run, was written by a newer workbench, or is damaged.
    """
    return Run(path)


def list_runs(root: str | Path = "runs") -> pd.DataFrame:
    """The runs under ``root`` (searched recursively), newest first.

    Columns: ``path, run, model, experiment, seed, status, steps, start_time``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory of runs.")
    entries = []
    for db in sorted(root.rglob(DB_NAME)):
        try:
            run = Run(db.parent)
            steps = len(run.steps)
        except RunError:
            continue
        m = run.metadata
        entries.append({"path": str(run.path), "run": run.name, "model": m.get("model"),
                        "experiment": m.get("experiment"), "seed": m.get("seed"), "status": m.get("status"),
                        "steps": steps, "start_time": pd.to_datetime(m.get("start_time"), unit="s")})
    columns = ["path", "run", "model", "experiment", "seed", "status", "steps", "start_time"]
    frame = pd.DataFrame(entries, columns=columns)
    return frame.sort_values("start_time", ascending=False, ignore_index=True)


def compare_runs(runs: list[str | Path | Run], what: str = "rows") -> pd.DataFrame:
    """The rows (or ``what="metrics"``) of several runs in one DataFrame, with a ``run`` column first."""
    if what not in ("rows", "metrics"):
        raise ValueError(f"what must be 'rows' or 'metrics', got {what!r}.")
    frames = []
    for item in runs:
        run = item if isinstance(item, Run) else Run(item)
        frame = run.to_pandas() if what == "rows" else run.metrics()
        frame.insert(0, "run", run.name)
        frames.append(frame)
    if not frames:
        raise ValueError("compare_runs() needs at least one run.")
    return pd.concat(frames, ignore_index=True)
