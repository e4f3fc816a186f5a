"""The run store: one SQLite database (stdlib sqlite3, WAL mode) per run directory, written by
:class:`RunStore` and read by :class:`~workbench.instrument.runs.Run` (:mod:`workbench.instrument.runs`).

A :class:`RunStore` subscribes to a Recorder and writes each update in one
transaction, so a step is either wholly in the store or absent, and a process
killed mid-run leaves every committed step readable (WAL: the database file
is never rewritten in place by a half-finished transaction). Readers in other
processes open it read-only and see every committed step while it is written.

Tables (``pandas.read_sql`` works on them directly):

- ``meta(key, value)``: JSON values - schema_version, model, config,
  experiment, seed, versions, start_time, status (and end_time, error).
- ``steps(step, rows, time)``: one row per stored step (the commit marker), ``time`` when it ended.
- ``rows``: the statistics rows (``ROW_COLUMNS`` plus ``seq``, the row's
  position within its step).
- ``histograms(step, seq, lo, hi, counts, sampled)``: counts as float32 bytes, in equal bins over
  [lo, hi]; ``sampled`` 1 where they were counted from a sample (runs stored before the column
  existed have none: read as 0).
- ``metrics(step, name, value)``; ``errors(step, module, call, kind, error)``.
- view ``anomalies``: the rows with a NaN or an Inf, in recording order.

Status and the writer's lock: a run's ``status`` is ``running`` until its
writer closes it ``finished``, ``stopped`` (by the user) or ``failed`` (with
``error``). The writer holds an exclusive ``flock`` on ``run.lock`` in the run
directory for as long as it writes: a second writer on the same path cannot
start (the lock decides, not a check that two writers could both pass), and
the kernel lets go of the lock when the writing process dies, however it
dies. A reader that finds ``running`` and a free lock reads ``interrupted``:
the writer is gone without closing the run. A child forked from the writer (a
DataLoader's worker) lets go of its copies of the lock and the database at once
(:func:`_let_go_in_child`): the lock is the writer's alone, let go of when it closes the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import sqlite3
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update, format_shape, histogram_edges
from workbench.instrument.schema import INT_COLUMNS, ROW_COLUMNS, STAT_COLUMNS, STATUSES, finish

__all__ = ["SCHEMA_VERSION", "DB_NAME", "LOCK_NAME", "STATUSES", "RunStore", "RunError", "holds_a_run"]

SCHEMA_VERSION = 1
DB_NAME = "run.sqlite"
LOCK_NAME = "run.lock"  # held (flock, exclusive) by the writer while it writes
#: A store keeps this many error messages at most (``RunStore.errors``); ``lost`` counts every lost step
MAX_ERRORS = 1000
#: What a writer closes a run with; ``running`` while it writes, ``interrupted`` when read without one.
STAT_SQL = ", ".join(f"{c} {'INTEGER' if c in INT_COLUMNS else 'REAL'}" for c in STAT_COLUMNS)

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
    sampled INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (step, seq)) WITHOUT ROWID;
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

    from workbench._version import __version__

    return {"workbench": __version__, "torch": torch.__version__, "python": platform.python_version()}


class RunStore:
    """Writes a run directory. Attach it to a Recorder with :meth:`attach`.

    Args:
        path: the run directory (created; must not hold a run already: one that failed, was stopped or
            was interrupted before its first step is replaced, see :func:`holds_a_run`).
        metadata: JSON-serialisable facts of the run (model, config ...).
        on_error: called with a message when a step cannot be written, once a streak of
            such steps (see :meth:`write`; the store keeps going with the next steps, and
            closes as ``failed``).
        timeout: seconds a write waits for a lock that another connection holds
            on the database before that step fails.

    Raises:
        TypeError: ``path`` is not a str or a path.
        ValueError: an empty path.
        FileExistsError: the directory holds a run (:func:`holds_a_run`), or another writer is writing one there.
        PermissionError: the directory cannot be created or written (nothing is left behind).
        OSError: the run cannot be started there, e.g. no room on its disk (the directory and an empty
            ``run.lock`` may stay: a store started there again once there is room works).
    """

    def __init__(self, path: str | Path, metadata: dict[str, Any] | None = None,
                 on_error: Callable[[str], object] | None = None, timeout: float = 30.0) -> None:
        self.path = self.check_path(path)
        self.errors: list[str] = []  # what went wrong, the first MAX_ERRORS messages
        self.on_error = on_error
        self.lost = 0  # steps that could not be written
        self._failing: tuple[int, int, int] | None = None  # the current streak of failed writes: first, last, count
        self._subscription: Subscription | None = None
        self._db: sqlite3.Connection | None = None
        self._lock: int | None = None
        self._db_file: int | None = None  # a descriptor of the database file: tells when it is deleted
        self._replaced = False
        self._status_unwritten = False  # close() could not write the run's status: readers read 'interrupted'
        self._found_in: tuple | None = None  # the database's files (_files_state) when a read found this run there
        self._made_db = False  # the database file is this store's own (none was there): removed if the start fails
        created = self._make_directory()
        try:
            self._lock = self._take_lock()
            _OPEN_STORES.add(self)  # (from here: a child forked as the store starts lets go of its lock too)
            _check_no_run(self.path, locked=True)  # (again, under the lock: it decides)
            made = not (self.path / DB_NAME).exists()  # (else a run that holds nothing, replaced)
            # (a tool holding the database briefly makes a write wait, not fail)
            self._db = sqlite3.connect(self.path / DB_NAME, check_same_thread=False, isolation_level=None,
                                       timeout=timeout)
            self._made_db = made
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process; fsync per checkpoint
            self.start_time = time.time()  # (its metadata's: which of the runs recorded at its path in turn it is)
            meta = {"schema_version": SCHEMA_VERSION, "start_time": self.start_time, "status": "running",
                    "versions": versions(), **(metadata or {})}
            with self._transaction():
                _empty(self._db)
                self._db.executemany("INSERT INTO meta VALUES (?, ?)",
                                     [(k, json.dumps(v, default=str)) for k, v in meta.items()])
            self._db_file = os.open(self.path / DB_NAME, os.O_RDONLY)
            _LOCKS_HERE.add(_identity(self._lock))
        except BaseException as exc:
            self._abandon(created)
            if isinstance(exc, sqlite3.Error):
                error = OSError if os.access(self.path if self.path.exists() else self.path.parent, os.W_OK) \
                    else PermissionError
                raise error(f"Cannot write a run into {self.path}: {type(exc).__name__}: {exc}. Pick a directory "
                            "you can write to, with room on its disk.") from None
            raise

    @staticmethod
    def check_path(path: Any) -> Path:
        """``path`` as the run directory a store would write, checked without writing anything: what
        ``watch(store=...)`` checks before it attaches anything (a directory that cannot be created
        or written is found as the store starts).

        Args:
            path: the run directory (a str or a path; ``~`` is the home directory).

        Returns:
            The directory's path.

        Raises:
            TypeError: not a str or a path.
            ValueError: an empty path.
            FileExistsError: the directory holds a run (:func:`holds_a_run`), another writer writes a run there,
                or the path is a file.
            NotADirectoryError: a folder on the path is a file.
            FileNotFoundError: a folder on the path is a link to nowhere.
            PermissionError: the directory, or the folder it would be made in, is not writable.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"store must be a directory path (str or Path), got {path!r}.")
        if not str(path).strip():
            raise ValueError("store='' names no directory; pass a run directory such as store='runs/my-run' "
                             "(or store=None to record in memory only).")
        path = expanded(path, "store")  # (store="~/runs/a" is under the home directory, as in a shell)
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"store={str(path)!r} is a file, not a directory; pass a directory for the run.")
        _check_writable(path)
        if lock_held(path, unreadable=False):
            raise being_written(path)
        _check_no_run(path)
        return path

    def _make_directory(self) -> list[Path]:
        """Create the run directory; returns the directories made (removed again if the store fails)."""
        missing = []
        for folder in (self.path, *self.path.parents):
            if folder.exists():
                break
            missing.append(folder)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise FileExistsError(f"store={str(self.path)!r} is a file, not a directory; pass a directory "
                                  "for the run.") from None
        except OSError as exc:
            self._abandon(missing)
            raise type(exc)(f"Cannot create the run directory {self.path}: {exc.strerror or exc}. "
                            "Pick a directory you can write to.") from None
        if not self.path.is_dir():
            raise FileExistsError(f"store={str(self.path)!r} is a file, not a directory; pass a directory "
                                  "for the run.")
        return missing

    def _take_lock(self) -> int:
        try:
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise PermissionError(f"Cannot write a run into {self.path}: {exc.strerror or exc}. Pick a "
                                  "directory you can write to.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise being_written(self.path) from None
        return fd

    def _abandon(self, created: list[Path]) -> None:
        """Undo a store that failed to start: close what it opened, remove what it created."""
        _OPEN_STORES.discard(self)  # (before its descriptors close: a child forked then closes none of their numbers)
        if self._db is not None:
            self._db.close()
            self._db = None
            # (the database of a run it was to replace stays: its transaction rolled back, it holds that run; a
            # reader may have it open, and would take a new file's -wal and -shm, found by name, for its own)
            for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm") if self._made_db else ():
                (self.path / name).unlink(missing_ok=True)
        if self._lock is not None:
            # (the lock file stays: another writer may hold it open; unlinked, a third would lock a new one)
            os.close(self._lock)
            self._lock = None
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break

    def _transaction(self):
        db = self._db

        class Transaction:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *rest):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return Transaction()

    def attach(self, recorder: Recorder, max_pending: int = 10_000, interval: float = 0.1) -> Subscription:
        """Write every record the recorder publishes from now on (on the subscriber's thread, which
        gathers ``interval`` seconds of steps at a time; each step is still its own transaction).

        Args:
            recorder: the recorder to subscribe to.
            max_pending: steps kept while the writer is behind; beyond them steps are dropped,
                counted in ``lost`` and the run closes ``failed``.
            interval: seconds of steps gathered per write.
        """
        self._subscription = recorder.subscribe(self.write, max_pending=max_pending, interval=interval)
        recorder.kept_in = str(self.path)  # (what its warning when full points to)
        return self._subscription

    def write(self, update: Update | StepRecord) -> None:
        """Write records, each step in one transaction with its commit marker.

        A step that cannot be written (a full disk, a database locked past the timeout) is
        counted in ``lost`` and kept in ``errors``; the next steps are still tried. Through
        ``on_error`` go the first failure of a streak of failed steps and, where it held more
        than one, its end (a step written again, or :meth:`close`) with how many it lost.

        Args:
            update: a subscriber's :class:`~workbench.instrument.recorder.Update`, or one record.
        """
        records = update.records if isinstance(update, Update) else (update,)
        if isinstance(update, Update) and update.dropped:
            self.lost += update.dropped
            self._report(f"{update.dropped} steps were dropped before they could be written "
                         "(the store fell too far behind)")
        for record in records:
            try:
                self._write_step(record)
            except Exception as exc:
                self.lost += 1
                message = (f"step {record.step} could not be written to {self.path / DB_NAME}: "
                           f"{type(exc).__name__}: {exc}")
                # the first failure of a streak is reported, the others kept: a full disk fails
                # every step, and a warning a step would bury everything else the user is shown
                if self._failing is None:
                    self._failing = (record.step, record.step, 1)
                    self._report(message)
                else:
                    first, _, count = self._failing
                    self._failing = (first, record.step, count + 1)
                    self._keep(message)
                if self.lost == 1:  # the run is failed already: later steps wait a second for a lock, not the timeout
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("PRAGMA busy_timeout = 1000")
            else:
                self._end_streak(f"step {record.step} was written: writing works again")

    def _end_streak(self, how: str) -> None:
        """Report how many steps in a row could not be written, where more than the first
        (reported when it failed) did; ``how`` the streak ended."""
        failing, self._failing = self._failing, None
        if failing is not None and failing[2] > 1:
            first, last, count = failing
            self._report(f"{count} steps in a row, {first} to {last}, could not be written to {self.path / DB_NAME} "
                         f"(the first's error above; the store's errors keep the first {MAX_ERRORS}); {how}")

    def _keep(self, message: str) -> None:
        """Keep ``message`` in ``errors`` while they hold fewer than :data:`MAX_ERRORS` (a disk full
        for days must not fill the memory with the same message)."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def _report(self, message: str) -> None:
        self._keep(message)
        if self.on_error is not None:
            self.on_error(message)

    def _write_step(self, record: StepRecord) -> None:
        # a deleted database has no name left (sqlite would write on into the file it holds open, for no one);
        # a moved one is written on where it went
        if _deleted(self._db_file):
            raise FileNotFoundError("the run's database was deleted since the run started (its directory "
                                    "removed?); its steps from here on are lost. Keep the directory while the "
                                    "run is written")
        rows = []
        if len(record):
            stats = finish(record.numel, record.sums)
            columns = [stats[c] for c in STAT_COLUMNS]
            for seq, (module, call, kind, tensor, shape) in enumerate(record.keys):
                rows.append((record.step, seq, module, int(call), kind, tensor, format_shape(shape),
                             *(_sql_value(col[seq]) for col in columns)))
        with self._transaction():
            self._db.executemany(f"INSERT INTO rows VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 1))})", rows)
            if record.histograms is not None:
                lows, highs = histogram_edges(record)
                sampled = record.histogram_sampled
                self._db.executemany("INSERT INTO histograms VALUES (?, ?, ?, ?, ?, ?)", [
                    (record.step, seq, _sql_value(lows[seq]), _sql_value(highs[seq]),
                     record.histograms[seq].astype(np.float32).tobytes(),
                     int(sampled[seq]) if sampled is not None else 0)
                    for seq in range(len(record))])
            self._db.executemany("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)",
                                 [(record.step, k, v) for k, v in record.metrics.items()])
            self._db.executemany("INSERT INTO errors VALUES (?, ?, ?, ?, ?)",
                                 [(e["step"], e["module"], e["call"], e["kind"], e["error"]) for e in record.errors])
            ended = record.time if record.time is not None else time.time()  # (a record made by hand: now)
            self._db.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (record.step, len(rows), ended))

    def set_meta(self, **values: Any) -> None:
        """Store facts about the run (JSON-serializable; others as their ``str``), replacing those
        of the same name: ``Run.metadata`` reads them."""
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 [(k, json.dumps(v, default=str)) for k, v in values.items()])

    @property
    def failure_outcome(self) -> str:
        """What the failures this store reports (``on_error``) do to its run, in words: a step it could not
        write, or dropped, marks the run ``failed`` as it closes; a status it could not write leaves the run
        to read ``interrupted``."""
        if self._status_unwritten:
            return f"the run in {self.path} keeps no status: readers will read it as interrupted"
        return f"the run in {self.path} will be marked failed when the watch closes"

    @property
    def closed(self) -> bool:
        return self._db is None

    def replaced(self) -> bool:
        """Whether the run at :attr:`path` is another run's now: this one closed (a run that stored no step, replaced
        by a new run at its path, see :func:`holds_a_run`; or its directory deleted and a run written there again).
        False while it is open (its lock keeps its path), and where nothing can be read there (deleted).

        A page asks on every tick for each run it lists: the database is read again only where its files changed
        since a read found this run there."""
        if self._replaced or not self.closed:
            return self._replaced
        files = _files_state(self.path)
        if files is None or files == self._found_in:
            return False
        try:
            with contextlib.closing(sqlite3.connect(f"file:{(self.path / DB_NAME).resolve()}?mode=ro",
                                                    uri=True)) as db:
                started = db.execute("SELECT value FROM meta WHERE key = 'start_time'").fetchone()
        except sqlite3.Error:
            return False
        # (a path never holds this run again once another took it)
        self._replaced = started is None or json.loads(started[0]) != self.start_time
        if not self._replaced and _settled(files):
            self._found_in = files
        return self._replaced

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Write what is queued, set the run's status and close the database. Idempotent.

        Args:
            status: ``finished``, ``stopped`` or ``failed``. A store that lost steps closes
                as ``failed`` whatever is asked, its ``error`` saying how many.
            error: what went wrong (``failed``).
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}.")
        if self._subscription is not None:
            # every queued step is written (or counted lost) before the status: the writer thread ends first
            self._subscription.unsubscribe(timeout=None)
            if self._subscription.error is not None:
                self._report(f"the store's writer stopped: {self._subscription.error.strip().splitlines()[-1]}")
                self.lost += 1
            self._subscription = None
        self._end_streak("the run closed")
        if self._db is None:
            return
        if self.lost:
            lost = f"{self.lost} step(s) could not be stored; the first: {self.errors[0]}"
            status, error = "failed", (f"{error}\n{lost}" if error else lost)
        values: dict[str, Any] = {"status": status, "end_time": time.time()}
        if error:
            values["error"] = error
        try:
            self.set_meta(**values)
        except Exception as exc:  # the status cannot be written: readers will see 'interrupted'
            self._status_unwritten = True
            self._report(f"the run's status ({status}) could not be written: {type(exc).__name__}: {exc}")
        finally:
            self._db.close()
            self._db = None
            _OPEN_STORES.discard(self)
            _LOCKS_HERE.discard(_identity(self._lock))
            os.close(self._lock)  # readers now see the status written, or 'interrupted'
            self._lock = None
            os.close(self._db_file)
            self._db_file = None


def _check_writable(path: Path) -> None:
    """Refuse a run directory that cannot be made or written, found without writing: its nearest folder
    that exists is a file, a link to nowhere, or not writable (``os.access``; on a read-only file system too)."""
    # (a link to nowhere does not exist, yet the directory cannot be made through it)
    existing = next(folder for folder in (path, *path.parents) if folder.exists() or folder.is_symlink())
    if not existing.exists():
        raise FileNotFoundError(f"Cannot create the run directory {path}: {existing} is a link to "
                                f"{os.readlink(existing)}, which does not exist. Create that directory, or pick "
                                "another you can write to.")
    if not existing.is_dir():
        raise NotADirectoryError(f"Cannot create the run directory {path}: {existing} is a file, not a directory. "
                                 "Pick a directory you can write to.")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it is" if existing == path else f"{existing}, where it would be made, is"
        raise PermissionError(f"Cannot write a run into {path}: {where} not writable. Pick a directory you can "
                              "write to.")


def expanded(path: str | os.PathLike, what: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` put as the home directory, as a shell does.

    Raises:
        FileNotFoundError: ``~user`` names no user with a home directory (``what`` names the argument).
    """
    try:
        return Path(path).expanduser()
    except RuntimeError:  # (pathlib's word for it: "Could not determine home directory.")
        user = str(path).split("/", 1)[0]
        raise FileNotFoundError(f"{what}={str(path)!r}: {user} names no user of this machine with a home "
                                "directory; give the path without it (a path of its own, or ~/ for yours).") from None


def _stored(path: Path) -> tuple[str, int] | None:
    """The status the run at ``path`` stored and how many steps it stored; None where its database cannot
    be read as a run's (damaged, not a workbench run, or of a schema this workbench does not know: a newer
    one's, whose data its steps alone may not tell)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{(path / DB_NAME).resolve()}?mode=ro", uri=True)) as db:
            version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            status = db.execute("SELECT value FROM meta WHERE key = 'status'").fetchone()
            steps = db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
        version = json.loads(version[0]) if version is not None else None
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
            return None
        return json.loads(status[0]) if status is not None else "running", steps
    except (sqlite3.Error, json.JSONDecodeError):
        return None


def holds_a_run(path: Path, locked: bool = False) -> bool:
    """Whether ``path`` holds a run that a new run may not replace. A run that did not finish and stored no
    step - ``failed``, ``stopped`` or ``interrupted`` before its first step ended, as a start that failed
    leaves it (under ``watch_distributed`` too: rank 0's run, closed as failed when another rank could not
    start) - holds nothing: a new run at its path replaces it, so that a start retried once its cause is
    fixed writes where it was asked to. Any other run holds something: one that stored a step, one that
    finished (empty or not), one being written, and a database that cannot be read as a run's of a schema
    this workbench knows (a newer workbench's run may keep what its steps do not tell).

    Args:
        path: a run directory.
        locked: the caller holds the run's lock (:data:`LOCK_NAME`): no other writer writes there.
    """
    if not (path / DB_NAME).exists():
        return False
    stored = _stored(path)
    if stored is None:
        return True
    status, steps = stored
    writer_gone = status == "running" and (locked or not lock_held(path, unreadable=False))
    return steps > 0 or not (status in ("failed", "stopped") or writer_gone)


def _check_no_run(path: Path, locked: bool = False) -> None:
    if holds_a_run(path, locked):
        stored = _stored(path)
        held = (f"{stored[0]}, {stored[1]} step(s) stored" if stored is not None
                else f"a {DB_NAME} that this workbench cannot read as a run's: damaged, or a newer workbench's")
        raise FileExistsError(f"{path} already holds a run ({held}); pick a new directory, load it with "
                              f"workbench.load_run({str(path)!r}), or delete that directory to write a new run "
                              "there.")


def _empty(db: sqlite3.Connection) -> None:
    """Make the tables of :data:`SCHEMA` in ``db``, in the caller's transaction, dropping those of a run that held
    nothing (:func:`holds_a_run`) first: a run a new one replaces is emptied in the transaction that writes the new
    one's metadata, its file kept. A reader sees the old run whole or the new one; deleting the old files let a
    reader that had just opened the old one read the new run's write-ahead log over it ("database disk image is
    malformed", or a mix of the two runs)."""
    # (views first: they name the tables; an index goes with its table)
    for kind, name in db.execute("SELECT type, name FROM sqlite_master WHERE type IN ('view', 'table') "
                                 "AND name NOT LIKE 'sqlite_%' ORDER BY type = 'table'").fetchall():
        quoted = name.replace('"', '""')
        db.execute(f'DROP {kind.upper()} "{quoted}"')
    for statement in SCHEMA.split(";"):  # (one at a time: executescript would commit the caller's transaction)
        if statement.strip():
            db.execute(statement)


#: The lock files (device, inode) the stores open in this process hold: a refusal says when the writer is one of them
_LOCKS_HERE: set[tuple[int, int]] = set()


def _identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


#: The stores open in this process: a child forked from it (a DataLoader's worker) lets go of what they hold
_OPEN_STORES: weakref.WeakSet[RunStore] = weakref.WeakSet()
#: The database connections of the stores open in the parent, in a forked child: kept, never used nor closed there
_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []


def _let_go_in_child() -> None:
    """In a child forked from a process that writes runs (``DataLoader(num_workers>0)`` with the fork start method),
    each open store is made inert: the run is written by the process that opened it. The child closes its copies
    of the lock's descriptor (the lock stays the parent's: a flock belongs to the open file, which the parent
    still holds, and is never unlocked here) and of the database file's, so that the lock is let go of when the
    parent closes the run, not when its last worker ends. Its copy of the database connection is kept, never
    used nor closed (SQLite forbids using a connection across a fork; closing it could checkpoint the parent's
    WAL): the child writes nothing, closes nothing, and holds no writer's lock."""
    stores = list(_OPEN_STORES)
    _OPEN_STORES.clear()
    _LOCKS_HERE.clear()
    for store in stores:
        for fd in (store._lock, store._db_file):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if store._db is not None:
            _INHERITED_CONNECTIONS.append(store._db)
        # (closed as the child sees it: write() and close() do nothing; its writer thread was not forked)
        store._lock = store._db_file = store._db = store._subscription = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_let_go_in_child)


def written_here(path: Path) -> bool:
    """Whether the writer of the run at ``path`` is a store open in this process."""
    try:
        stat = os.stat(path / LOCK_NAME)
    except OSError:
        return False
    return (stat.st_dev, stat.st_ino) in _LOCKS_HERE


def being_written(path: Path) -> FileExistsError:
    """The error of a store started where another writer writes a run; one of this process (a watch left open
    by a loop that raised outside a ``with`` block, the cell then run again) is named, with how to close it."""
    if written_here(path):
        return FileExistsError(f"{path} is being written by another writer (it holds {LOCK_NAME}): a watch of this "
                               "process, still open (a loop that raised outside a with block leaves it open). Close "
                               "that watch first - w.close(), or w.close('failed', error) - or pick a new directory.")
    return FileExistsError(f"{path} is being written by another writer (it holds {LOCK_NAME}); pick a new directory.")


def lock_held(path: Path, unreadable: bool) -> bool:
    """Whether a writer holds the lock of the run at ``path``: tried with a shared lock, let go at once
    (the writer holds it exclusively). ``unreadable``: what a run whose lock file is missing or cannot be
    opened says (a store about to start: no writer; a reader of a run written before the lock existed,
    or by hand: nothing tells, so a writer may be there)."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return unreadable
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (also lets go of the shared lock, if taken)
    return False


def _deleted(fd: int) -> bool:
    """Whether the file open at ``fd`` was deleted: no link left to it, or (Linux) a name other than the
    database's, as NFS renames a file deleted while open (``.nfsXXXX``) and Linux marks it ``(deleted)``."""
    if os.fstat(fd).st_nlink == 0:
        return True
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # (no /proc: the link count alone)
        return False
    return os.path.basename(name) != DB_NAME


#: A file's modification time is trusted to tell a later write only once it is this much older than the clock: a
#: write within the same tick of the file system's clock (coarse: up to seconds on some file systems) leaves it alike
FILE_TIME_TICK_NS = 2_000_000_000


def _files_state(path: Path) -> tuple | None:
    """What any write to the run database at ``path`` changes: the database file's identity, size, modification
    and change times, and the write-ahead log's identity, size and modification time while it holds anything (a
    reader's connection makes an empty log and changes its change time; a writer's transaction grows or rewrites
    it, a checkpoint writes the database). None: no database there."""
    try:
        db = os.stat(path / DB_NAME)
    except OSError:
        return None
    try:
        wal = os.stat(path / f"{DB_NAME}-wal")
    except OSError:
        wal = None
    logged = (wal.st_ino, wal.st_size, wal.st_mtime_ns) if wal is not None and wal.st_size else None
    return (db.st_ino, db.st_size, db.st_mtime_ns, db.st_ctime_ns), logged


def _settled(files: tuple) -> bool:
    """Whether the files of :func:`_files_state` were last written a file-clock tick before now: a write after
    it shows in their state (one within the tick may not, the tick's modification time the same)."""
    (_, _, db_written, _), logged = files
    written = max(db_written, logged[2] if logged is not None else db_written)
    return written < time.time_ns() - FILE_TIME_TICK_NS


def _sql_value(value: Any) -> Any:
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and np.isnan(value) else value
