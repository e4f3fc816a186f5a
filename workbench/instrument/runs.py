"""Reading stored runs: :class:`Run` (one run directory, read-only, also while it is being
written), :func:`load_run`, :func:`list_runs` and :func:`compare_runs`. The tables they read are
described in :mod:`workbench.instrument.store`, which writes them.
"""

from __future__ import annotations

import itertools
import json
import numbers
import os
import sqlite3
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument.recorder import bin_edges, metric_columns
from workbench.instrument.schema import (INT_COLUMNS, ROW_COLUMNS, STAT_COLUMNS, TEXT_COLUMNS, check_filter,
                                         checked_long)
from workbench.instrument.sites import module_classes_from_tree
from workbench.instrument.store import DB_NAME, SCHEMA_VERSION, RunError, expanded, lock_held

__all__ = ["Run", "load_run", "list_runs", "compare_runs"]


def _not_a_run(given: str | os.PathLike, path: Path) -> str:
    """Why ``path`` (as ``given``) is not a run: missing, a folder of runs, or a folder with none."""
    how = "Runs are the directories given as store=...; workbench.list_runs(root) lists those under a folder."
    if not path.exists():
        if path.is_symlink():  # (a link to nothing exists, as ls shows it: where it leads does not)
            return (f"{given} is not a workbench run: it is a link to {os.readlink(path)}, which does not exist "
                    f"({path.resolve()}). {how}")
        return f"{given} is not a workbench run: there is no such file or folder ({path.absolute()}). {how}"
    if path.is_dir():
        # (two levels down, as runs/<name> and runs/<group>/<name> lie: a home folder is not searched whole)
        found = itertools.chain(path.glob(f"*/{DB_NAME}"), path.glob(f"*/*/{DB_NAME}"))
        inside = [db.parent.relative_to(path) for db in itertools.islice(found, 3)]
        if inside:
            return (f"{given} is not a workbench run: it is a folder of runs ({', '.join(map(str, inside))}"
                    f"{' ...' if len(inside) == 3 else ''}); open one of them, or list them with "
                    f"workbench.list_runs({str(given)!r}).")
    return f"{given} is not a workbench run: it has no {DB_NAME}. {how}"


def _unreadable(given: str | os.PathLike, db_path: Path) -> str:
    """Why the run at ``given`` (its database at ``db_path``) cannot be opened: this user may not enter a
    folder on the way to it (the first one is named), or may not read the database."""
    denied = next((folder for folder in reversed(db_path.absolute().parents) if not os.access(folder, os.X_OK)),
                  db_path.absolute())
    return (f"{given} cannot be read: permission denied on {denied}. Check the permissions (ls -ld {denied}): "
            f"reading a run takes read and execute permission (r-x) on its directory and the folders above it, "
            f"and read permission on its {DB_NAME}; have them granted (by the owner: chmod -R a+rX on the run "
            "directory), or load a copy made by someone who can read it.")


class Run:
    """A stored run, read-only. Get one with :func:`load_run`."""

    def __init__(self, path: str | Path) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"a run is opened by its directory path (str or Path), got {path!r}.")
        if isinstance(path, str) and not path:  # (Path("") is ".": the working directory, opened unasked)
            raise RunError(f"The path of a run is empty ({path!r}): give the directory of a run, what "
                           "watch(store=...) was given, e.g. load_run('runs/baseline') (workbench.list_runs('runs') "
                           "lists those under a folder); pass '.' for a run in the current directory.")
        self.path = expanded(path, "path")
        try:
            db_path = self.path / DB_NAME if self.path.is_dir() else self.path
            if not db_path.is_file():
                raise RunError(_not_a_run(path, self.path))
        except PermissionError:
            raise RunError(_unreadable(path, self.path / DB_NAME)) from None
        if not os.access(db_path, os.R_OK):  # (sqlite3 would say "unable to open database file": read as damage)
            raise RunError(_unreadable(path, db_path))
        self.db_path = db_path
        if db_path.name == DB_NAME:
            self.path = db_path.parent
        version = self.metadata.get("schema_version")
        if not isinstance(version, int):
            raise RunError(f"{db_path} is not a workbench run database (no schema_version).")
        if version > SCHEMA_VERSION:
            raise RunError(f"{db_path} was written with run-store schema {version}; this workbench "
                           f"reads up to {SCHEMA_VERSION}. Upgrade workbench to read it.")

    @property
    def metadata(self) -> dict[str, Any]:
        """The run's metadata, read at each access: a run still being written gets its ``status``
        and ``end_time`` once its writer closes it (``status`` as :attr:`status` tells it)."""
        try:
            meta = dict(self._query("SELECT key, value FROM meta").itertuples(index=False))
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise RunError(f"{self.db_path} is damaged or not a workbench run database ({exc}).") from None
        try:
            metadata = {k: json.loads(v) for k, v in meta.items()}
        except json.JSONDecodeError as exc:
            raise RunError(f"{self.db_path} has damaged metadata ({exc}).") from None
        status = metadata.get("status", "running")
        if status == "running" and not _writer_alive(self.path):
            status = "interrupted"
        metadata["status"] = status
        return metadata

    def module_classes(self) -> dict[str, str] | None:
        """The qualified class name of each module of the model by path (``''``: the model itself; every alias
        path of a shared module), as the run stored them (``module_class_tree`` in its metadata; a run stored
        before 2026-11-30 kept ``module_classes``, ``{path: class}``, read as it is).

        Returns:
            ``{path: class name}``, or None for a run that did not store them (recorded before runs did).

        Raises:
            RunError: the stored tree is damaged.
        """
        metadata = self.metadata
        if "module_class_tree" in metadata:
            try:
                return module_classes_from_tree(metadata["module_class_tree"])
            except ValueError as exc:
                raise RunError(f"{self.db_path} has damaged metadata: {exc}") from None
        stored = metadata.get("module_classes")
        return dict(stored) if isinstance(stored, dict) else None

    @property
    def status(self) -> str:
        """``running``, ``finished``, ``stopped``, ``failed`` (see ``metadata["error"]``), or
        ``interrupted``: stored as running, but its writer is gone (killed, or crashed)."""
        return self.metadata["status"]

    @property
    def name(self) -> str:
        """The run directory's name (``runs/tanh``: ``tanh``)."""
        return self.path.name

    def _connect(self) -> sqlite3.Connection:
        # read-only: a reader never takes a write lock, so it cannot stall the writer. A run in a
        # directory this process cannot write (a finished run on read-only media, another user's)
        # cannot take WAL's shared-memory index either: it is opened immutable, as the file it is
        uri = f"file:{self.db_path.resolve()}?mode=ro"
        if not os.access(self.db_path.parent, os.W_OK):
            wal = self.db_path.with_name(self.db_path.name + "-wal")
            if wal.exists() and wal.stat().st_size > 0:  # an immutable read would not see the steps still in it
                raise RunError(f"{self.db_path.parent} cannot be read here: its last steps are still in "
                               f"{wal.name} (its writer did not close it), and the directory is not writable. "
                               "Copy the run directory somewhere writable and load the copy.")
            uri += "&immutable=1"
        return sqlite3.connect(uri, uri=True)

    def _fetch(self, sql: str, params: tuple = ()) -> tuple[list[str], list[tuple]]:
        """The column names and the rows of a query."""
        db = self._connect()
        try:
            cursor = db.execute(sql, params)
            return [d[0] for d in cursor.description], cursor.fetchall()
        except sqlite3.DatabaseError as exc:
            raise RunError(f"{self.db_path} is damaged or not a workbench run database ({exc}).") from None
        finally:
            db.close()

    def _query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        # (sqlite3's rows into a frame directly: the same frame as pandas.read_sql_query, without its per-column pass)
        columns, rows = self._fetch(sql, params)
        return pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)

    @property
    def steps(self) -> list[int]:
        """The steps stored (committed) so far."""
        return self._query("SELECT step FROM steps ORDER BY step").step.tolist()

    def step_times(self) -> pd.DataFrame:
        """When each stored step ended: ``step, time`` (seconds since the epoch), in step order: the
        run's pace (``steps / time``) on replay as when it ran."""
        return self._query("SELECT step, time FROM steps ORDER BY step")

    def step_ranges(self, size: int) -> list[tuple[int, int]]:
        """The stored steps in parts of at most ``size`` steps, as ``(first, last)`` (both included):
        read a long run a part at a time (``to_pandas(steps=part)``), its memory that of a part.

        Raises:
            ValueError: ``size`` is not a positive whole number.
        """
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"size must be a positive whole number of steps, got {size!r}.")
        steps = self.steps
        size = int(size)
        return [(steps[i], steps[min(i + size, len(steps)) - 1]) for i in range(0, len(steps), size)]

    def to_pandas(self, steps: tuple[int, int] | None = None) -> pd.DataFrame:
        """The statistics rows, with the columns of ``watch().to_pandas()``.

        Args:
            steps: only those of the steps ``(first, last)`` (both included): a long run read a part
                at a time.
        """
        where, params = _step_range(steps, "step")
        frame = self._query(f"SELECT {', '.join(ROW_COLUMNS)} FROM rows"
                            f"{' WHERE ' + where if where else ''} ORDER BY step, seq", params)
        return _typed(frame)

    def metrics(self, long: bool = False) -> pd.DataFrame:
        """One row per step: ``step`` and a column per metric (NaN: not logged that step, or logged NaN), in the
        columns and order of the watch's ``w.metrics()``: the metrics in the order first logged, those first
        logged at one step by name.

        Args:
            long: one row per logged value instead, ``step, name, value``: a value logged as NaN is a
                row with NaN, a metric not logged that step no row.

        Raises:
            TypeError: ``long`` is not True or False (a metric name: ``run.metrics()['loss']`` takes one).
        """
        long = checked_long(long)
        long_form = self._query("SELECT step, name, value FROM metrics ORDER BY step, name")
        long_form["value"] = long_form["value"].astype("float64")  # (SQLite keeps a NaN as NULL)
        if long:
            return long_form
        if long_form.empty:
            return pd.DataFrame({"step": pd.Series(dtype="int64")})
        wide = long_form.pivot(index="step", columns="name", values="value").reset_index()
        wide.columns.name = None
        return wide[metric_columns(long_form["name"])]  # (pivot sorts them by name: the watch's order instead)

    def interventions(self) -> pd.DataFrame:
        """The interventions the run had (``w.patch``, ``w.ablate``, the app's): ``id, site, intervention,
        from step, to step, status``, as ``Watch.intervention_log()`` gave them, read from their marker metrics
        (the steps each was on) and the run's errors: ``status`` is ``failed at step N: <error>`` for one
        that failed, else ``recorded`` (the markers do not say whether one was removed or ended with the run)."""
        from workbench.instrument.interventions import log_from_metrics

        return log_from_metrics(self.metrics(long=True), self.errors())

    def diagnose(self, thresholds: Any = None, **overrides: Any) -> pd.DataFrame:
        """What looks wrong with the stored run, where and since when: :func:`workbench.diagnose.diagnose`
        of :meth:`to_pandas` and :meth:`metrics`.

        Args:
            thresholds: a :class:`workbench.diagnose.Thresholds`, a dict of its fields, or None.
            **overrides: single thresholds (``persist=5``, ``dead_zero_frac=0.7``); the chance level of
                the loss is the run's metadata's ``chance`` unless given here.
        """
        from workbench.diagnose import diagnose, with_run_facts  # (a reader of the rows, not a part of the pipeline)
        return diagnose(self.to_pandas(), self.metrics(long=True), thresholds,
                        **with_run_facts(self.metadata, thresholds, overrides))

    def histograms(self, module: str | None = None, kind: str | None = None,
                   steps: tuple[int, int] | None = None) -> pd.DataFrame:
        """``step, module, call, kind, tensor, edges, counts`` for the stored histograms.

        Args:
            module: only this module path (None: every path).
            kind: only this kind (``activation``, ``grad_output``, ``param``, ``param_grad``, ``update``).
            steps: only those of the steps ``(first, last)`` (both included).
        """
        if module is not None or kind is not None:  # (the paths and kinds the run recorded rows of)
            recorded = self._query("SELECT DISTINCT module, kind FROM rows")
            check_filter("histograms", module, kind, recorded.module.unique().tolist(), recorded.kind.unique().tolist())
        where, params = [], []
        for column, value in (("r.module", module), ("r.kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        in_range, range_params = _step_range(steps, "h.step")
        if in_range:
            where.append(in_range)
            params.extend(range_params)
        has_flag = "sampled" in self._query("PRAGMA table_info(histograms)").name.tolist()  # (not in older runs)
        sampled = "h.sampled" if has_flag else "0 AS sampled"
        sql = (f"SELECT r.step, r.module, r.call, r.kind, r.tensor, h.lo, h.hi, h.counts, {sampled} FROM histograms h "
               "JOIN rows r ON r.step = h.step AND r.seq = h.seq"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY h.step, h.seq")
        frame = self._query(sql, tuple(params))
        counts = _counts(frame.pop("counts").tolist())
        bins = np.array([len(c) for c in counts], dtype=np.int64)
        lo, hi = (frame.pop(c).astype("float64").to_numpy() for c in ("lo", "hi"))  # (SQLite keeps NaN as NULL)
        sampled = frame.pop("sampled").astype(bool)
        edges: list[np.ndarray | None] = [None] * len(counts)
        for n in np.unique(bins):  # (the edges per count of bins, not per row: a run has one or two)
            at = np.flatnonzero(bins == n)
            for i, row in zip(at, bin_edges(lo[at], hi[at], n)):
                edges[i] = row
        frame["edges"] = edges
        frame["counts"] = counts
        frame["sampled"] = sampled
        return frame

    #: What separates a row's key columns (``seq, module, call, kind, tensor, shape``), and its rows' keys, in the
    #: layout :meth:`_view_part` reads of a step: characters no module path, tensor leaf or shape holds.
    KEY_SEPARATOR, ROW_SEPARATOR = "\x1f", "\x1e"

    def _view_part(self, steps: tuple[int, int]) -> dict[str, Any]:
        """What a view reads of the steps ``(first, last)``, in one read of one snapshot of the run (a run
        still written gains no step between its queries), as arrays, not a Python object per value:

        - ``steps`` (k,): the steps with rows; ``layouts``: the keys of their rows, ``(module, call, kind,
          tensor, shape)`` per row in recording order, one tuple of them per distinct layout; ``layout`` (k,):
          each step's index in ``layouts`` (SQLite joins a step's keys into one string: one object a step);
        - ``numel`` (rows,) and ``stats`` (rows, STAT_COLUMNS) float64 (NULL: NaN), in the rows' order;
        - ``lo``, ``hi`` (histograms,) and ``counts``: the histograms' bins' ranges and counts, in the rows'
          order (``counts`` one (histograms, bins) array where they all have as many bins, else a list).
        """
        where, params = _step_range(steps, "step")
        # (each key led by its seq: SQLite does not promise group_concat the subquery's order, the sort below does)
        key = " || char(31) || ".join(("seq", "module", "call", "kind", "tensor", "shape"))
        db = self._connect()
        try:
            db.execute("BEGIN")  # (one read transaction: every query below sees the same committed steps)
            layouts_sql = (f"SELECT step, group_concat(key, char(30)) FROM (SELECT step, {key} AS key FROM rows "
                           f"WHERE {where} ORDER BY step, seq) GROUP BY step ORDER BY step")
            per_step = db.execute(layouts_sql, params).fetchall()
            numbers = db.execute(f"SELECT {', '.join(STAT_COLUMNS)} FROM rows WHERE {where} "
                                 "ORDER BY step, seq", params).fetchall()
            ranges = db.execute(f"SELECT lo, hi FROM histograms WHERE {where} ORDER BY step, seq", params).fetchall()
            blobs = db.execute(f"SELECT counts FROM histograms WHERE {where} ORDER BY step, seq", params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise RunError(f"{self.db_path} is damaged or not a workbench run database ({exc}).") from None
        finally:
            db.close()
        index: dict[str, int] = {}
        layout = np.array([index.setdefault(keys, len(index)) for _, keys in per_step], np.int64)
        layouts = [tuple((m, int(c), k, t, sh) for _, m, c, k, t, sh in
                         sorted((row.split(self.KEY_SEPARATOR) for row in keys.split(self.ROW_SEPARATOR)),
                                key=lambda fields: int(fields[0])))
                   for keys in index]
        numbers = np.array(numbers, np.float64).reshape(-1, len(STAT_COLUMNS))  # (None: NaN)
        ranges = np.array(ranges, np.float64).reshape(-1, 2)
        blobs = [blob for (blob,) in blobs]
        sizes = {len(blob) for blob in blobs}
        counts = (np.frombuffer(b"".join(blobs), np.float32).reshape(len(blobs), -1) if len(sizes) == 1
                  else _counts(blobs))
        return {"steps": np.array([step for step, _ in per_step], np.int64), "layout": layout, "layouts": layouts,
                "numel": numbers[:, STAT_COLUMNS.index("numel")].astype(np.int64), "stats": numbers,
                "lo": ranges[:, 0], "hi": ranges[:, 1], "counts": counts}

    def errors(self) -> pd.DataFrame:
        """The failures recorded with the run (a hook's, a sink's): ``step, module, call, kind, error``."""
        return self._query("SELECT * FROM errors")

    def anomalies(self) -> pd.DataFrame:
        """Rows with NaN or Inf, first appearance first."""
        return _typed(self._query(f"SELECT {', '.join(ROW_COLUMNS)} FROM anomalies"))

    def export(self, path: str | Path, what: str = "rows", overwrite: bool = False) -> Path:
        """Write ``what`` (``"rows"`` or ``"metrics"``) to CSV or Parquet (by the suffix), or a
        TensorBoard log directory (a path without a suffix, or a directory that exists: scalars and histograms
        per call site, and the metrics; the metrics alone with ``what="metrics"``).

        Args:
            path: the file (``.csv``, ``.parquet``) or directory (TensorBoard) to write.
            what: ``"rows"`` (the statistics) or ``"metrics"``.
            overwrite: replace a file that exists at ``path``, or the event files a TensorBoard directory
                already holds (removed once the new ones are written; its other files are kept). False: both
                are refused, nothing written.

        Returns:
            ``path``.

        Raises:
            FileExistsError: without ``overwrite``, a file exists at ``path`` or the TensorBoard directory
                already holds event files; with or without, a file is where a TensorBoard directory (a path
                without a suffix) would go.
            ValueError: an empty path, an unknown suffix or ``what``.
            ImportError: Parquet without pyarrow, TensorBoard without tensorboard, with the pip command.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"export() takes a file or directory path (str or Path), got {path!r}.")
        if isinstance(path, str) and not path:  # (Path("") is ".": event files written into the working directory)
            raise ValueError(f"export() got an empty path ({path!r}); give a .csv or .parquet file, or a directory "
                             "for TensorBoard event files, e.g. export('rows.csv').")
        path = expanded(path, "path")
        if what not in ("rows", "metrics"):
            raise ValueError(f"what must be 'rows' or 'metrics', got {what!r}.")
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {overwrite!r}.")
        # (everything that can be refused is, before the run is read)
        suffix = "" if path.is_dir() else path.suffix.lower()  # (a directory takes event files, whatever its name)
        if suffix not in (".csv", ".parquet", ""):
            raise ValueError(f"Cannot export to {path.name!r}: use a .csv or .parquet file, or a directory "
                             f"for TensorBoard event files: a path without a suffix, or one made first "
                             f"(os.makedirs({str(path)!r}) for a name with a dot, such as lr0.001).")
        if suffix == "" and not path.is_dir() and (path.exists() or path.is_symlink()):  # (a file, a dangling link)
            # a path without a suffix is a TensorBoard directory: a file there is never replaced by one, overwrite=True
            # or not (it may be anything: a script, a note)
            there = "a link to nothing" if not path.exists() else "a file"
            raise FileExistsError(f"Cannot export to {str(path)!r}: a path without a suffix is a TensorBoard log "
                                  f"directory, and {there} is there (overwrite=True replaces a .csv or .parquet "
                                  "file, or the event files of a directory, never a file with a directory). Remove "
                                  "it first, export into another directory, or name a .csv or .parquet file.")
        # (an export replaces nothing unless asked, a file or a directory's event files alike)
        earlier = sorted(path.glob("*tfevents*")) if suffix == "" and path.is_dir() else []
        if earlier and not overwrite:  # (TensorBoard reads every event file of a directory: the exports would overlap)
            raise FileExistsError(f"{path} already holds TensorBoard event files ({earlier[0].name}"
                                  f"{f' and {len(earlier) - 1} more' if len(earlier) > 1 else ''}): TensorBoard would "
                                  "show the values of both exports at once. Export into a new directory, or pass "
                                  "overwrite=True to replace those event files.")
        if suffix and (path.exists() or path.is_symlink()) and not overwrite:
            raise FileExistsError(f"{path} already exists: export() replaces no file unless asked. Export to a new "
                                  "path, or pass overwrite=True to replace it.")
        if suffix == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ImportError("Exporting to Parquet needs pyarrow: pip install pyarrow "
                                  "(or export to .csv, which needs nothing).") from None
        try:
            if suffix == "":
                from workbench.instrument.tensorboard import export_tensorboard

                export_tensorboard(self, path, metrics_only=what == "metrics")
                for replaced in earlier:  # (overwrite=True; the new files have names of their own)
                    replaced.unlink(missing_ok=True)
                return path
            path.parent.mkdir(parents=True, exist_ok=True)  # (as the TensorBoard export makes its directory)
            if what == "metrics":
                frame = self.metrics()
                frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
            else:
                self._export_rows(path, suffix)
        except OSError as exc:
            raise type(exc)(f"Cannot write {path}: {exc.strerror or exc}. Pick a path you can write to, "
                            "with room on its disk.") from None
        return path

    #: Steps of a run's rows read and written at once by :meth:`export`.
    EXPORT_STEPS = 500

    def _export_rows(self, path: Path, suffix: str) -> None:
        """Write the rows a part of :data:`EXPORT_STEPS` steps at a time: the memory of a part, not of the run."""
        parts = self.step_ranges(self.EXPORT_STEPS) or [None]
        if suffix == ".csv":
            with open(path, "w", newline="") as out:
                for i, part in enumerate(parts):
                    self.to_pandas(steps=part).to_csv(out, index=False, header=i == 0)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer = None
        try:
            for part in parts:
                rows = self.to_pandas(steps=part)
                if rows.empty and (writer is not None or part != parts[-1]):
                    continue  # (steps without rows: the file's schema is taken from rows, not from an empty part)
                table = pa.Table.from_pandas(rows, preserve_index=False)
                if writer is None:
                    writer = pq.ParquetWriter(path, table.schema)
                writer.write_table(table.cast(writer.schema))
        finally:
            if writer is not None:
                writer.close()

    def __repr__(self) -> str:
        m = self.metadata
        return (f"Run({self.name!r}, model={m.get('model')!r}, experiment={m.get('experiment')!r}, "
                f"status={m.get('status')!r})")


def _writer_alive(path: Path) -> bool:
    """Whether a process holds the run directory's writer lock (see the module docstring); a run written
    before the lock existed, or by hand, may be written still: nothing tells."""
    return lock_held(path, unreadable=True)


def _step_range(steps: tuple[int, int] | None, column: str) -> tuple[str, tuple]:
    """A condition (and its parameters) keeping the steps ``(first, last)``; none ("") for None.
    Step numbers may be any whole numbers (Python's, numpy's: ``df.step`` values)."""
    if steps is None:
        return "", ()
    if (not isinstance(steps, (tuple, list)) or len(steps) != 2
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) for s in steps)):
        raise TypeError(f"steps must be (first, last), two whole step numbers, or None for every step; got {steps!r}.")
    first, last = (int(s) for s in steps)
    if first > last:
        raise ValueError(f"steps=({first}, {last}) is empty: its first step comes after its last; "
                         f"give (first, last) with first <= last, e.g. ({last}, {first}).")
    return f"{column} BETWEEN ? AND ?", (first, last)


def _counts(blobs: list[bytes]) -> list[np.ndarray]:
    """Histograms' counts (float32 bytes) as arrays: one buffer read, sliced per histogram."""
    flat = np.frombuffer(b"".join(blobs), dtype=np.float32)
    ends = np.cumsum([len(b) // 4 for b in blobs], dtype=np.int64).tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows' columns in the dtypes of a watch's rows, also when there are none (SQLite's empty result
    has no types: its columns read as objects, which a concat with other rows keeps)."""
    for column in STAT_COLUMNS:
        if column not in INT_COLUMNS:
            frame[column] = frame[column].astype("float64")  # NULL (NaN statistics) reads as None
    if frame.empty:
        for column in frame.columns:
            if column in INT_COLUMNS:
                frame[column] = frame[column].astype("int64")
            elif column in TEXT_COLUMNS:
                frame[column] = frame[column].astype(str)  # (the dtype pandas gives the text of a non-empty frame)
    return frame


def load_run(path: str | Path) -> Run:
    """Open a stored run (also while it is being written).

    Args:
        path: the run's directory (what ``watch(store=...)`` or an experiment's ``store=`` was given).

    Raises:
        TypeError: ``path`` is not a path.
        RunError: ``path`` is empty (``""``; ``"."`` is the current directory), is not a run, cannot be read by
            this user (the message names the folder or file denied), was written by a newer workbench, or is
            damaged.
        FileNotFoundError: ``path`` starts with ``~user`` for no user of this machine.
    """
    return Run(path)


def list_runs(root: str | Path = "runs") -> pd.DataFrame:
    """The runs under ``root`` (searched recursively), newest first.

    Args:
        root: the directory to search (``~`` is the home directory).

    Returns:
        Columns ``path, run, model, experiment, seed, status, steps, start_time, size_mb`` (the
        run's files on disk, in MB: a long run recorded every step takes hundreds); directories
        that are not readable runs are left out. Seeds are exact: where a run has none (one recorded by
        ``workbench.watch``), the column holds the seeds as recorded and None, not floats.

    Raises:
        TypeError: ``root`` is not a path.
        ValueError: ``root`` is empty (``""``; ``"."`` is the current directory).
        FileNotFoundError: ``root`` is not a directory (or starts with ``~user`` for no user of this machine).
        PermissionError: ``root`` cannot be read by this user, or a folder above it entered (a run below it that
            cannot be read is left out, as folders that are not runs are).
    """
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"list_runs() takes a directory path (str or Path), got {root!r}.")
    if isinstance(root, str) and not root:  # (Path("") is ".": the working directory, searched unasked)
        raise ValueError(f"list_runs() got an empty path ({root!r}); it takes the folder to search for runs, "
                         "'runs' if left out; pass '.' for the current directory.")
    root = expanded(root, "root")
    try:
        is_dir = stat.S_ISDIR(root.stat().st_mode)
    except PermissionError:  # (a folder above it this user may not enter: whether it is one cannot be seen)
        denied = next((folder for folder in reversed(root.absolute().parents) if not os.access(folder, os.X_OK)),
                      root)
        raise PermissionError(f"{root} cannot be searched for runs: permission denied on {denied} (ls -ld "
                              f"{denied}). Listing it takes execute permission (x) on the folders above it and "
                              "read and execute permission (r-x) on it; have them granted, or list a folder you "
                              "can read.") from None
    except OSError:
        is_dir = False
    if not is_dir:
        what = ("it is a file (a run is a folder: workbench.load_run opens one)" if root.exists()
                else f"there is no such folder ({root.absolute()})")
        raise FileNotFoundError(f"{root} is not a directory of runs: {what}. Pass the folder the runs were stored "
                                "under: list_runs('runs') for runs written with store='runs/<name>'.")
    if not os.access(root, os.R_OK | os.X_OK):  # (its search would find nothing: an empty table, said of no run)
        raise PermissionError(f"{root} cannot be searched for runs: permission denied (ls -ld {root}). Listing it "
                              "takes read and execute permission (r-x) on it; have them granted, or list a folder "
                              "you can read.")
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
                        "steps": steps, "start_time": pd.to_datetime(m.get("start_time"), unit="s"),
                        "size_mb": _disk_bytes(run.path) / 1e6})
    columns = ["path", "run", "model", "experiment", "seed", "status", "steps", "start_time", "size_mb"]
    frame = pd.DataFrame(entries, columns=columns)
    seeds = [entry["seed"] for entry in entries]
    if None in seeds:  # (seeds as recorded: a float column would round those beyond 2**53, as 2**60 + 1)
        frame["seed"] = pd.Series(seeds, dtype=object)
    frame["start_time"] = pd.to_datetime(frame.start_time)  # (typed also when there are no runs)
    return frame.sort_values("start_time", ascending=False, ignore_index=True)


def _disk_bytes(path: Path) -> int:
    """The bytes of the files of a run directory (its database, and its write-ahead log while written)."""
    total = 0
    for file in path.iterdir():
        try:
            total += file.stat().st_size if file.is_file() else 0
        except OSError:  # (a log removed as its writer closed)
            pass
    return total


def compare_runs(runs: list[str | Path | Run], what: str = "rows") -> pd.DataFrame:
    """The rows (or ``what="metrics"``) of several runs in one DataFrame, with a ``run`` column first: each
    run's directory name, or, where two of the runs share a name (``tanh/seed0``, ``relu/seed0``), each one's path.

    Args:
        runs: run directories or :class:`Run` objects.
        what: ``"rows"`` or ``"metrics"``.

    Raises:
        TypeError: a single run instead of a list.
        ValueError: an unknown ``what``, no run, or one run given twice.
        RunError: a path that is not a readable run.
    """
    if isinstance(runs, (str, os.PathLike, Run)):
        raise TypeError(f"compare_runs() takes a list of runs, got the single run {str(runs)!r}; "
                        f"pass a list such as [{str(runs)!r}, 'runs/other'].")
    if what not in ("rows", "metrics"):
        raise ValueError(f"what must be 'rows' or 'metrics', got {what!r}.")
    opened = [item if isinstance(item, Run) else Run(item) for item in runs]
    if not opened:
        raise ValueError("compare_runs() needs at least one run.")
    seen: dict[Path, Run] = {}
    for run in opened:  # (the same run twice: two equal blocks under one name, or two names, read as two runs)
        where = Path(run.path).resolve()
        if where in seen:
            raise ValueError(f"compare_runs(): the run {str(run.path)!r} is given twice (as {str(seen[where].path)!r} "
                             f"too); give each run once.")
        seen[where] = run
    names = [run.name for run in opened]
    if len(set(names)) < len(names):  # (runs/tanh/seed0 and runs/relu/seed0: a name each would tell them apart)
        names = [str(run.path) for run in opened]
    frames = []
    for run, name in zip(opened, names):
        frame = run.to_pandas() if what == "rows" else run.metrics()
        if "run" in frame.columns:  # (a metric named "run": the column that names each run keeps its name)
            warnings.warn(f"compare_runs(): run {name!r} has a metric named 'run', the column that names each run "
                          f"here; its values are in the column 'run (metric)'.", RuntimeWarning, stacklevel=2)
            frame = frame.rename(columns={"run": "run (metric)"})
        frame.insert(0, "run", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
