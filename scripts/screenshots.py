"""Retake the documentation's screenshots of the app: ``python scripts/screenshots.py [--out docs/screenshots]``.

Serves the app over a fresh runs root on a free loopback port, drives Debian's chromium
(Playwright, as the browser tests do) at 1400 x 1000 and saves what a person sees:

- ``live_run.png``: an activation_mlp run of 3000 steps, live, most of the way through;
- ``live_heatmap.png``: the same run's layer x step heatmap;
- ``diagnose-run-page.png``: a sigmoid MLP eight layers deep, whose findings the page lists;
- ``explorer_curves.png``: the activation explorer's f and f';
- ``explorer_compare.png``: its "Which trains best", the four activations it starts with.

Takes about three minutes on a 2-core machine. Not run by the tests (the browser tests take their
own screenshots with ``WORKBENCH_SCREENSHOTS=dir``); run it after a change to what these pages show.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(page, experiment: str, steps: int, fields: dict[str, str], picks: dict[str, str]) -> None:
    """Start a run from the Experiments tab's form, as a person does: ``fields`` typed in,
    ``picks`` chosen from their dropdowns."""
    page.get_by_role("tab", name="Experiments").click()
    if not page.locator("#experiment-list").is_visible():
        page.get_by_text("New run").click()
    page.locator("#experiment-list").get_by_label(experiment, exact=True).check()
    page.wait_for_selector(f"#experiment-overview:has-text('{experiment}')")
    page.locator("#run-steps input").fill(str(steps))
    page.locator("#run-histograms input").check()
    for label, value in fields.items():
        page.locator("#run-config").get_by_label(label, exact=True).fill(value)
    for label, value in picks.items():
        page.locator("#run-config").get_by_label(label, exact=True).click()
        page.keyboard.press("Control+A")
        page.keyboard.type(value)
        page.get_by_role("option", name=value, exact=True).wait_for()
        page.keyboard.press("Enter")
    page.locator("#run-start").click()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"), help="where the pictures go")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed: apt-get install -y chromium (scripts/test.sh does)")
    from playwright.sync_api import expect, sync_playwright

    from workbench.ui.app import build_app

    expect.set_options(timeout=60_000)
    with tempfile.TemporaryDirectory() as runs:
        app = build_app(runs_root=Path(runs) / "runs")
        app.queue()
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                   css=app.workbench_css)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")

                page.get_by_role("tab", name="Activation explorer").click()
                page.locator("#explorer-curves .js-plotly-plot").wait_for()
                page.screenshot(path=out / "explorer_curves.png")

                page.get_by_role("tab", name="Which trains best").click()  # (its four defaults, 200 steps each)
                page.locator("#explorer-train").click()
                expect(page.locator("#explorer-compare-status")).to_contain_text("trained best", timeout=600_000)
                page.wait_for_timeout(1500)  # (the tick's redraw)
                page.screenshot(path=out / "explorer_compare.png", full_page=True)

                start(page, "activation_mlp", 3000, {}, {"activation": "relu"})
                header = page.locator("#run-status")
                expect(header).to_contain_text(re.compile(r"step (2[2-9]\d\d|30\d\d) of 3000"), timeout=300_000)
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=out / "live_run.png")
                expect(header).to_contain_text("finished", timeout=300_000)
                heatmap = page.locator("#live-heatmap")
                heatmap.scroll_into_view_if_needed()
                page.wait_for_timeout(1500)  # (the tick's redraw)
                heatmap.screenshot(path=out / "live_heatmap.png")

                start(page, "activation_mlp", 300, {"depth": "8"}, {"activation": "sigmoid"})
                expect(header).to_contain_text("finished", timeout=300_000)
                expect(page.locator("#live-findings")).to_contain_text("saturated")
                page.evaluate("window.scrollTo(0, 0)")
                page.wait_for_timeout(1500)
                page.screenshot(path=out / "diagnose-run-page.png")
                browser.close()
        finally:
            app.close()
            app.run_manager.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
