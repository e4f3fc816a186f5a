"""The findings on the real run page, in headless Chromium: a run that goes wrong shows its
findings under its header while it trains, and a click on one moves the views to it."""

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import (  # noqa: F401  (the app's fixtures, and its pages' patience)
    _patient_expect, _patient_gradio_launch, browser, page, runs_root, served_app)
from tests.ui.test_browser import lines, start, tokens, traces

pytestmark = pytest.mark.browser


def pick(page, label, option):  # noqa: F811
    box = page.locator("#run-config").get_by_label(label, exact=True)
    box.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(option)
    page.get_by_role("option", name=option, exact=True).first.click()
    page.keyboard.press("Escape")


def test_a_run_whose_relus_die_lists_them_and_a_click_shows_one(page):  # noqa: F811
    page.get_by_role("tab", name="Experiments").click()
    page.locator("#experiment-list").get_by_label("activation_mlp", exact=True).check()
    page.wait_for_selector("#experiment-overview:has-text('activation_mlp')")
    pick(page, "activation", "relu")
    # Adam at lr 1.0 pushes the ReLUs' inputs below 0 within a few steps: they die
    start(page, "activation_mlp", 60, store="diagnose/dead", depth="4", lr="1.0", width="16")
    findings = page.locator("#live-findings")
    expect(findings).to_contain_text("dead_units", timeout=120_000)
    expect(findings).to_contain_text("(threshold 80%)")  # the whole evidence, wrapped (it was cut at "…")
    expect(page.locator("#live-findings-note")).to_contain_text("Diagnoses:")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    # a ReLU's row: the views go to that site, in the statistic it is seen in, its steps shaded
    site = next(s for s in ("layers.3", "layers.5", "layers.7", "layers.1")
                if findings.get_by_text(s, exact=True).count())
    findings.get_by_text(site, exact=True).first.click()
    note = page.locator("#live-findings-note")
    expect(note).to_contain_text(f"dead_units at {site}")
    expect(note).to_contain_text("What to try:")
    expect(page.locator("#live-stat input")).to_have_value("zero_frac")
    assert tokens(page, "live-sites") == [site]
    drawn = lines(traces(page, "live-series",
                         lambda t: [x["name"] for x in t if "lines" in x.get("mode", "")] == [site]))
    assert max(v for v in drawn[site]["y"] if v is not None) >= 0.9  # (dead: nearly all its outputs 0)
    shaded = page.locator("#live-series .js-plotly-plot").evaluate("el => el.layout.shapes.length")
    assert shaded >= 1

    # the stored run keeps them: the Runs tab lists the same findings, and a click focuses its replay
    listed = findings.locator("tbody").inner_text()
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()  # (lists the stored runs and opens the newest: this one)
    expect(page.locator("#replay-header")).to_contain_text("diagnose/dead")
    stored = page.locator("#replay-findings")
    expect(stored).to_contain_text("dead_units")
    assert stored.locator("tbody").inner_text() == listed
    stored.get_by_text(site, exact=True).first.click()
    expect(page.locator("#replay-findings-note")).to_contain_text(f"dead_units at {site}")
    expect(page.locator("#replay-stat input")).to_have_value("zero_frac")
    assert tokens(page, "replay-sites") == [site]
