"""Running a function on several threads at once, for the tests of concurrent use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def at_once(target: Callable[[Any, threading.Barrier], Any], keys: Iterable[Any]) -> dict[Any, Any]:
    """``{key: target(key, barrier)}``, each call on a thread of its own; the calls wait at
    ``barrier`` to go on together. A call that raises fails the test with its error."""
    keys = list(keys)
    barrier = threading.Barrier(len(keys))
    results, failures = {}, []

    def run(key: Any) -> None:
        try:
            results[key] = target(key, barrier)
        except BaseException as exc:  # noqa: BLE001 (raised below, on the test's thread)
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results
