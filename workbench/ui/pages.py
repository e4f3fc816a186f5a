"""What each open page of the Gradio app holds that must be let go of when the page closes, by session.

Gradio deletes a closed tab's state (and calls a ``gr.State``'s delete callback) an hour after the tab closed, and
leaves files a handler wrote where they are: a page's comparison in the explorer trained on that hour, and every
export wrote a folder of files that stayed until the machine's temporary directory was emptied. The app's one
``unload`` (:func:`workbench.ui.app.build_app`) ends a closed page's :class:`PageHoldings`, whatever tab made them.

Live runs are not among them: they belong to the app's run manager, and outlive the page that started them
(a reloaded page attaches to them again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["PageHoldings", "session_of"]


class PageHoldings:
    """Per session, what its page holds, each under a key with the function that lets go of it (stops a
    comparison's runs, removes an export's folder). A page's new holding under a key lets go of the one it
    replaces; :meth:`end` lets go of all of the page's. Thread-safe: Gradio runs handlers in threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, dict[str, Callable[[], Any]]] = {}

    def hold(self, session: str, key: str, release: Callable[[], Any] | None) -> None:
        """The page of ``session`` holds something new under ``key``, let go of by ``release()`` (None: nothing
        any more); what it held there before is let go of now."""
        with self._lock:
            held = self._by_session.setdefault(session, {})
            replaced = held.pop(key, None)
            if release is not None:
                held[key] = release
            elif not held:
                self._by_session.pop(session, None)
        if replaced is not None and replaced is not release:
            _let_go(replaced, session, key)

    def held(self, session: str) -> list[str]:
        """The keys the page of ``session`` holds something under."""
        with self._lock:
            return list(self._by_session.get(session, ()))

    def end(self, session: str) -> None:
        """The page of ``session`` has closed: let go of everything it held (again, or never held: nothing)."""
        with self._lock:
            held = self._by_session.pop(session, {})
        for key, release in held.items():
            _let_go(release, session, key)


def _let_go(release: Callable[[], Any], session: str, key: str) -> None:
    """``release()``; a failure is logged, not raised: the page's other holdings are let go of still."""
    try:
        release()
    except Exception:  # (a closed page has nobody to tell: the server's log says it)
        logger.exception("letting go of the %s of page %s failed", key, session)


def session_of(request: Any) -> str | None:
    """The session of a Gradio request (a ``gr.Request``), None where there is none (a call from Python)."""
    return getattr(request, "session_hash", None) if request is not None else None
