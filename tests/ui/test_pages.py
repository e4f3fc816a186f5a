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
