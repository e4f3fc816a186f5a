"""What a page of the app holds, let go of when it closes (workbench.ui.pages)."""

import logging

from workbench.ui.pages import PageHoldings, session_of


def test_a_closed_page_lets_go_of_what_it_held_and_another_page_keeps_its_own():
    let_go = []
    holdings = PageHoldings()
    holdings.hold("closed", "comparison", lambda: let_go.append("closed comparison"))
    holdings.hold("closed", "export", lambda: let_go.append("closed export"))
    holdings.hold("open", "export", lambda: let_go.append("open export"))
    holdings.end("closed")
    assert sorted(let_go) == ["closed comparison", "closed export"]
    assert holdings.held("closed") == [] and holdings.held("open") == ["export"]
    holdings.end("closed")  # (twice, or a page that held nothing: nothing to let go of)
    holdings.end("never held anything")
    assert sorted(let_go) == ["closed comparison", "closed export"]


def test_a_new_holding_under_a_key_lets_go_of_the_one_it_replaces():
    let_go = []
    holdings = PageHoldings()
    holdings.hold("page", "export", lambda: let_go.append("first"))
    holdings.hold("page", "export", lambda: let_go.append("second"))
    assert let_go == ["first"]
    holdings.hold("page", "export", None)  # (nothing held there any more)
    assert let_go == ["first", "second"] and holdings.held("page") == []


def test_a_failure_to_let_go_is_logged_and_the_pages_other_holdings_go_still(caplog):
    let_go = []

    def fails():
        raise OSError("read-only file system")

    holdings = PageHoldings()
    holdings.hold("page", "export", fails)
    holdings.hold("page", "comparison", lambda: let_go.append("comparison"))
    with caplog.at_level(logging.ERROR, logger="workbench.ui.pages"):
        holdings.end("page")
    assert let_go == ["comparison"]
    assert "letting go of the export of page page failed" in caplog.text and "read-only" in caplog.text


def test_the_session_of_a_request_and_of_none():
    class Request:
        session_hash = "abc"

    assert session_of(Request()) == "abc" and session_of(None) is None


def test_an_uploaded_files_cached_copy_is_deleted_on_the_apps_schedule(tmp_path):
    """Gradio kept every uploaded checkpoint or stored run in its cache until the machine's temporary directory was
    cleaned: the app deletes them on a schedule (here Gradio's shortest: every second, those over a second old)."""
    import time
    from pathlib import Path

    import httpx

    from tests.ui.conftest import _free_port
    from workbench.ui.app import DELETE_CACHE, build_app

    assert DELETE_CACHE is not None and build_app(tmp_path / "default").delete_cache == DELETE_CACHE
    app = build_app(tmp_path / "runs", delete_cache=(1, 1))
    app.queue()
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload",
                           files={"files": ("weights.pt", b"not really a checkpoint")})
        reply.raise_for_status()
        cached = Path(reply.json()[0])
        assert cached.read_bytes() == b"not really a checkpoint"
        deadline = time.monotonic() + 60  # (a bound on a stuck sweep, not a measure: it is gone in about 2 s)
        while cached.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not cached.exists()
    finally:
        app.close()
        app.run_manager.close()
