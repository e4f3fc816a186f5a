"""Holding a kernel interrupt (SIGINT) until a block that must not be left part-way has run: a data-parallel
watch publishing a step (:mod:`workbench.instrument.distributed`), an experiment counting and recording the step
it took (:meth:`workbench.experiments.base.Experiment.step`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_held(interrupted_twice: Callable[[], None]) -> Iterator[None]:
    """Hold a SIGINT that comes inside the block (in the main thread, where Python runs signal handlers): the
    handler in place runs as the block ends (the default one raises ``KeyboardInterrupt`` there). A second SIGINT
    while one is held gives the handler back and runs it at once for both, in turn (the second goes to the handler
    the first call left in place: a handler may set the default one for a second Ctrl-C); where one raises (the
    block left part-way), ``interrupted_twice`` is called as the error goes. A handler of the user's own that
    returns (one that sets a flag) gets every SIGINT and leaves the block whole. Elsewhere (another thread, a
    SIGINT ignored or left to the system) the block runs as it is."""
    try:
        handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    except (ValueError, OSError):  # (signals cannot be set here)
        handler = None
    if not callable(handler):
        yield
        return
    held: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        if held:  # (the user insists)
            signal.signal(signal.SIGINT, handler)
            try:
                handler(*held.pop())
                signal.raise_signal(signum)  # (to the handler in place now: the first call may have set another)
            except BaseException:
                interrupted_twice()
                raise
            return
        held.append((signum, frame))

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is hold:
            signal.signal(signal.SIGINT, handler)
        if held:
            handler(*held.pop())
