"""The runs the app owns: live runs in a :class:`RunManager`, stored runs under one :class:`RunsRoot`.

A live run belongs to the server, not to a page: the manager starts each run on
a thread of its own, lists the runs in progress and the finished ones, and any
page (a reloaded one, a second tab) attaches to a run by its id, watches it,
stops it and detaches; closing a page never stops a run. The manager is made by
``build_app`` and handed to the tabs; nothing here is module-level state.

Stored runs live under one root directory (``python app.py --runs-root DIR``):
a run name typed into the app is a relative path under that root, checked by
:meth:`RunsRoot.resolve` before anything is listed, opened or written.
"""

from __future__ import annotations

import html
import re
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.instrument.store import DB_NAME, expanded, holds_a_run

if TYPE_CHECKING:
    from workbench.instrument import Run
    from workbench.ui.live_run import LiveRun

__all__ = ["RunsRoot", "RunManager", "PathRefused", "NAME_LIMIT", "DEFAULT_ROOT", "RUN_TABLE_COLUMNS", "breakable",
           "name_breaks", "NAME_JOINT"]

DEFAULT_ROOT = "runs"
NAME_LIMIT = 200  # characters in a run name (a relative path under the root)
DEPTH_LIMIT = 8  # directories in a run name
#: The columns of the table of stored runs (:meth:`RunsRoot.list`): what tells the runs apart first, the run first
RUN_TABLE_COLUMNS = ["run", "status", "steps", "start_time", "experiment", "model", "seed", "MB"]
# one path component: letters, digits, '_', '-', '.', not starting with '.' or '-'
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_RULE = ("letters, digits, '_', '-' and '.' (not first), parts separated by '/', "
         f"at most {NAME_LIMIT} characters")


def breakable(text: Any, joints: re.Pattern) -> str:
    """``text`` as HTML for a table's cell, a ``<wbr>`` (a place to break a line, no character) at each
    place ``joints`` matches (empty matches between a name's parts): in a narrow column it goes on over the
    next line there, not in the middle of a word. Every table that breaks names does it so."""
    return joints.sub("<wbr>", html.escape(str(text), quote=False))


#: Where a run's or an experiment's name may break over two lines in a narrow table column: after a '/', '-', '_'
#: or '.' followed by a letter or a digit.
NAME_JOINT = re.compile(r"(?<=[/\-_.])(?=[A-Za-z0-9])")


def name_breaks(name: Any) -> str:
    """``name`` as HTML for a table's cell (:func:`breakable`), breaking between its parts (``sweeps/``
    ``tanh-`` ``lr_`` ``3e-`` ``3``)."""
    return breakable(name, NAME_JOINT)


class PathRefused(ValueError):
    """A run name or sub-directory that is not a path under the runs root."""


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened for a message when long."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 20 else text[:limit + 20] + "..."


class RunsRoot:
    """The one directory under which the app lists, opens and writes runs.

    Args:
        root: the directory (need not exist yet; it is created when the first run is recorded).

    Raises:
        ValueError: ``root`` exists and is not a directory, or starts with ``~user`` for no user.
    """

    def __init__(self, root: str | Path = DEFAULT_ROOT) -> None:
        if not isinstance(root, (str, Path)) or not str(root).strip():
            raise ValueError(f"runs root must be a directory path, got {shown(root)}; e.g. --runs-root runs.")
        try:
            self.path = expanded(root, "runs root").resolve()
        except FileNotFoundError as exc:  # (~user for no user: a bad root, as the others)
            raise ValueError(f"{exc} E.g. --runs-root runs.") from None
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"runs root {str(root)!r} is a file, not a directory; give a directory "
                             "(it is created if missing), e.g. --runs-root runs.")

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunsRoot({str(self.path)!r})"

    def resolve(self, name: Any, what: str = "run name") -> Path:
        """The directory ``name`` (a relative path) names under the root.

        Raises:
            PathRefused: not text, empty, too long, absolute, with an empty, '.' or '..'
                component or an odd character, or leading out of the root through a symbolic link.
        """
        where = f"under the runs root {self.path}"
        if not isinstance(name, str):
            raise PathRefused(f"{what} must be text, got {shown(name)}; give a name {where}, e.g. 'my-run'.")
        text = name.strip()
        if not text:
            raise PathRefused(f"{what} is empty; give a name {where}, e.g. 'my-run' or 'mlp/tanh'.")
        if len(text) > NAME_LIMIT:
            raise PathRefused(f"{what} {shown(text)} is too long: at most {NAME_LIMIT} characters; "
                              "pick a shorter name.")
        if text.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", text):
            raise PathRefused(f"{what} {shown(text)} is an absolute path; give a name relative to "
                              f"the runs root {self.path}, e.g. 'my-run' or 'mlp/tanh'.")
        parts = text.split("/")
        dots = next((part for part in parts if part in (".", "..")), None)  # (before the empty part of '../')
        if dots is not None:
            raise PathRefused(f"{what} {shown(text)} contains {dots!r}: a {what} stays {where}; "
                              "name a directory inside it, without '.' or '..'.")
        if "" in parts:
            raise PathRefused(f"{what} {shown(text)} has an empty path component ('//', or a leading or "
                              f"trailing '/'); write it as 'a/b' ({_RULE}).")
        for part in parts:
            if part[0] in ".-":
                raise PathRefused(f"{what} {shown(text)} has a part starting with {part[0]!r} ({shown(part, 30)}); "
                                  f"use {_RULE}.")
            if not _COMPONENT.fullmatch(part):
                odd = next((c for c in part if not (c.isascii() and (c.isalnum() or c in "_.-"))), part[0])
                raise PathRefused(f"{what} {shown(text)} has the character {odd!r} in {shown(part, 30)}; "
                                  f"use {_RULE}.")
        if len(parts) > DEPTH_LIMIT:
            raise PathRefused(f"{what} {shown(text)} is {len(parts)} directories deep; at most {DEPTH_LIMIT}.")
        try:
            target = (self.path / text).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise PathRefused(f"{what} {shown(text)} cannot be resolved {where} ({exc}); pick another name.") from None
        if not target.is_relative_to(self.path) or target == self.path:
            raise PathRefused(f"{what} {shown(text)} leads out of the runs root {self.path} (to {target}, "
                              "through a symbolic link); pick a name whose directories lie inside the root.")
        return target

    def name_of(self, path: str | Path) -> str:
        """A path under the root as the app shows it: relative, with '/'."""
        return Path(path).resolve().relative_to(self.path).as_posix()

    def list(self, sub: Any = "") -> tuple[pd.DataFrame, list[str], str]:
        """The stored runs under the root (or a sub-directory of it): a table, their names, a message.

        Never raises: a bad ``sub`` is a message.
        """
        from workbench.instrument import list_runs

        empty = pd.DataFrame(columns=RUN_TABLE_COLUMNS)
        if sub is None or (isinstance(sub, str) and not sub.strip()):
            where = self.path
        else:
            try:
                where = self.resolve(sub, "sub-directory")
            except PathRefused as exc:
                return empty, [], f"**Cannot list:** {exc}"
        if where.exists() and not where.is_dir():
            return empty, [], (f"**Cannot list:** sub-directory {self.name_of(where)!r} is a file under the runs "
                               "root, not a directory; give a sub-directory, or leave it empty for the whole root.")
        if not where.is_dir():
            if where == self.path:
                return empty, [], f"No runs yet under `{where}`."
            return empty, [], (f"No sub-directory {self.name_of(where)!r} under the runs root `{self.path}` (yet); "
                               "check its name, or leave it empty for the whole root.")
        try:
            runs = list_runs(where)
        except (OSError, ValueError) as exc:
            return empty, [], f"**Cannot list** `{where}`: {exc}"
        # a run (or its run.sqlite) reached through a symbolic link out of the root is not listed
        inside = [(Path(p) / DB_NAME).resolve().is_relative_to(self.path) for p in runs.path]
        runs = runs[inside].reset_index(drop=True)
        if runs.empty:
            return empty, [], f"No runs yet under `{where}`."
        names = [self.name_of(p) for p in runs.path]
        table = pd.DataFrame({"run": names, "status": runs.status, "steps": runs.steps,
                              "start_time": runs.start_time.dt.strftime("%Y-%m-%d %H:%M:%S UTC"),
                              "experiment": runs.experiment, "model": runs.model, "seed": runs.seed,
                              "MB": runs.size_mb.round(1)})  # (a long run recorded every step takes hundreds)
        return table, names, f"{len(runs)} run(s) under `{where}`."

    def open(self, pick: Any) -> Run:
        """Open the stored run ``pick`` names (a run name under the root).

        Raises:
            PathRefused: a name that is not under the root.
            RunError: not a run, or one that cannot be read.
        """
        from workbench.instrument import load_run

        path = self.resolve(pick, "run")
        database = (path / DB_NAME if path.is_dir() else path).resolve()
        if not database.is_relative_to(self.path):
            raise PathRefused(f"run {shown(pick)} leads out of the runs root {self.path} (its database is "
                              f"{database}, through a symbolic link); open runs that lie inside the root.")
        return load_run(path)


class RunManager:
    """The live runs of one app: started, listed, stopped here; pages attach to them by id.

    Args:
        root: where recorded runs go (a :class:`RunsRoot` or a directory).
        keep_finished: finished runs kept in memory (the oldest are dropped beyond it, and counted).
        max_running: runs in progress at once; one more is refused with a message.
    """

    def __init__(self, root: RunsRoot | str | Path = DEFAULT_ROOT, keep_finished: int = 20,
                 max_running: int = 8) -> None:
        for label, value in (("keep_finished", keep_finished), ("max_running", max_running)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}.")
        self.root = root if isinstance(root, RunsRoot) else RunsRoot(root)
        self.keep_finished, self.max_running = keep_finished, max_running
        self.dropped = 0  # finished runs dropped from memory
        self._runs: dict[str, LiveRun] = {}  # in start order
        self._count = 0
        self._starting = 0
        self._lock = threading.Lock()
        # at the latest when the process exits, the runs in progress stop and close their stores
        # as stopped (a run thread killed at exit would leave its store to read as interrupted)
        weakref.finalize(self, _stop_all, self._runs, self._lock)

    def start(self, name: str, config: dict[str, Any], seed: int, steps: int, store: str | None = None,
              device: str = "cpu", weights: str | None = None, experiment: Any = None, continues: str | None = None,
              **watch_options: Any) -> LiveRun:
        """Start ``name`` on a thread of its own; ``store`` is a run name under the root (or None);
        ``weights`` a checkpoint file the model starts from (see :mod:`workbench.checkpoints`);
        ``experiment`` and ``continues`` as :class:`~workbench.ui.live_run.LiveRun`'s (a run continued).

        Raises:
            ValueError: too many runs in progress, a bad run name, a name already taken, a bad config,
                a checkpoint that does not fit the experiment's model (``CheckpointError``, with the diff).
        """
        from workbench.ui.live_run import LiveRun

        path = None
        if store is not None:
            path = self.root.resolve(store, "run name")
            blocking = next((p for p in (path, *path.parents) if p.is_relative_to(self.root.path)
                             and p.exists() and not p.is_dir()), None)
            if blocking is not None:
                raise ValueError(f"run name {shown(store)}: {self.root.name_of(blocking)!r} is a file under the "
                                 "runs root, not a directory; pick another name.")
            if holds_a_run(path):  # (one that failed or was stopped before its first step is replaced)
                raise ValueError(f"run name {shown(store)} is taken: {path} already holds a run; pick a new "
                                 "name (the Runs tab lists the runs stored under the root).")
        with self._lock:
            busy = sum(run.running for run in self._runs.values()) + self._starting
            if busy >= self.max_running:
                raise ValueError(f"{busy} runs are in progress, the most this app runs at once "
                                 f"({self.max_running}); stop one first (Runs in this app, then Stop).")
            self._starting += 1
            self._count += 1
            number = self._count
            run_id = f"r{number}"
        try:
            run = LiveRun(name, config, seed, steps, store=None if path is None else str(path), device=device,
                          run_id=run_id, weights=weights, experiment=experiment, continues=continues,
                          **watch_options)
            with self._lock:
                self._runs[run_id] = run
        except BaseException:
            with self._lock:  # a run refused (a bad config, a glob matching nothing) takes no id: r3 is not skipped
                if self._count == number:  # (unless a start beside it took the next one)
                    self._count -= 1
            raise
        finally:
            with self._lock:
                self._starting -= 1
        try:
            run.start(on_done=self._finished)
        except BaseException as exc:  # (its thread could not start): its watch and store close, failed
            with self._lock:
                self._runs.pop(run_id, None)
            run.watch.close("failed", f"the run's thread could not start: {exc!r}")
            raise
        return run

    def _finished(self, run: LiveRun) -> None:
        with self._lock:
            self._prune()

    def _prune(self) -> None:
        finished = [key for key, run in self._runs.items() if not run.running]
        for key in finished[:max(0, len(finished) - self.keep_finished)]:
            del self._runs[key]
            self.dropped += 1

    def runs(self) -> list[LiveRun]:
        """The runs in memory: those in progress first, then the finished ones, newest first."""
        with self._lock:
            self._prune()
            runs = list(self._runs.values())[::-1]
        return [r for r in runs if r.running] + [r for r in runs if not r.running]

    def get(self, run_id: Any) -> LiveRun | None:
        """The run with this id, or None (an unknown id, or a finished run dropped from memory)."""
        if not isinstance(run_id, str):
            return None
        with self._lock:
            return self._runs.get(run_id)

    def forgotten(self, run_id: Any) -> bool:
        """Whether ``run_id`` was a run of this manager that is no longer in memory."""
        match = re.fullmatch(r"r(\d+)", run_id) if isinstance(run_id, str) else None
        return match is not None and 0 < int(match[1]) <= self._count and self.get(run_id) is None

    def stop(self, run_id: str, timeout: float = 30.0) -> LiveRun | None:
        run = self.get(run_id)
        if run is not None:
            run.stop(timeout)
        return run

    def close(self, timeout: float = 30.0) -> None:
        """Stop every run in progress (each closes its watch as stopped) and wait for them."""
        _stop_all(self._runs, self._lock, timeout)

    def __repr__(self) -> str:
        runs = self.runs()
        return (f"RunManager({str(self.root.path)!r}, {sum(r.running for r in runs)} running, "
                f"{sum(not r.running for r in runs)} finished)")



def _stop_all(runs: dict[str, LiveRun], lock: threading.Lock, timeout: float = 30.0) -> None:
    with lock:
        going = [run for run in runs.values() if run.running]
    for run in going:
        run.request_stop()
    for run in going:
        run.join(timeout)
