"""The bad-input suite's one mechanism: a table of :class:`Case`\\ s, each checked the same way.

A case is a call that a user could make with a bad value. It passes when the call

- raises the expected exception type (``ValueError``, ``TypeError`` ... or a subclass),
- from workbench's own code (the raising frame lies under ``workbench/``): a raw
  traceback out of torch, sqlite3, numpy or pandas is a failure, whatever its type,
- with a message that contains every fragment of ``says`` (the value named, what was
  expected, how to fix it), case-insensitively,
- and leaves things as they were: ``after`` (when given) checks that nothing was
  written, changed or lost, and the process stays usable (a small model still builds,
  trains a step and is watched).

The cases live beside this file, one test module per area; ``CASES`` counts them all.
"""

from __future__ import annotations

import contextlib
import math
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench

WORKBENCH_ROOT = Path(workbench.__file__).resolve().parent


@dataclass
class Case:
    """One bad input.

    Args:
        id: a short name for the test id.
        call: makes the bad call (raises).
        error: the exception type it must raise.
        says: fragments its message must contain.
        after: called after the call raised: asserts nothing was written, changed or lost.
        cleanup: called last, pass or fail (closes what the case opened).
    """

    id: str
    call: Callable[[], Any]
    error: type[BaseException] | tuple[type[BaseException], ...]
    says: Sequence[str] = ()
    after: Callable[[], Any] | None = None
    cleanup: Callable[[], Any] | None = None
    marks: Sequence[Any] = field(default_factory=tuple)


def kept(id: str, call: Callable[[], Any], error: type[BaseException] | tuple, says: Sequence[str],
         keep: Callable[[], Any]) -> Case:
    """A Case whose ``after`` checks that ``keep()`` - a snapshot of what must not change - is the
    same after the failed call as it was just before it."""
    before = {}

    def snapshot_then_call():
        before["value"] = keep()
        return call()

    def unchanged():
        assert same(keep(), before["value"]), f"{id}: the failed call changed something"

    return Case(id, snapshot_then_call, error, says, after=unchanged)


def same(a: Any, b: Any) -> bool:
    """Deep equality over tensors (bitwise, NaN equal to NaN), dicts, lists and plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device \
            and torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b.detach()))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    """These environment variables set, and restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_env(call: Callable[[], Any], **values: str) -> Callable[[], Any]:
    """``call``, run with these environment variables set."""
    def run():
        with env(**values):
            return call()
    return run


def params(cases: Sequence[Case]) -> list:
    """``pytest.mark.parametrize`` arguments for ``cases``, with their ids."""
    ids = [c.id for c in cases]
    duplicated = {i for i in ids if ids.count(i) > 1}
    assert not duplicated, f"duplicate case ids: {duplicated}"
    return [pytest.param(c, id=c.id, marks=list(c.marks)) for c in cases]


def raised_by_workbench(exc: BaseException) -> bool:
    """Whether the exception was raised by workbench's code (its innermost frame, or the frame
    that raised it ``from None`` / ``from err``, lies under the ``workbench`` package)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(WORKBENCH_ROOT)


def still_usable() -> None:
    """The process still works: a model builds, is watched, trains a step."""
    model = workbench.create_model("mlp", depth=1, width=4)
    spec = workbench.get_spec("mlp")
    with workbench.watch(model) as w:
        workbench.probe(spec, model, batch_size=2)
        record = w.step()
    assert record is not None and len(record) > 0


def check(case: Case) -> None:
    try:
        _check(case)
    finally:
        if case.cleanup is not None:
            case.cleanup()


def _check(case: Case) -> None:
    with pytest.raises(BaseException) as info:
        case.call()
    exc = info.value
    assert isinstance(exc, case.error), (
        f"{case.id}: expected {case.error}, got {type(exc).__name__}: {exc}")
    assert raised_by_workbench(exc), (
        f"{case.id}: a raw library error, not workbench's own:\n"
        + "".join(traceback.format_exception(exc)))
    message = str(exc).lower()
    missing = [s for s in case.says if s.lower() not in message]
    assert not missing, f"{case.id}: the message {str(exc)!r} does not say {missing}"
    if case.after is not None:
        case.after()
    still_usable()
