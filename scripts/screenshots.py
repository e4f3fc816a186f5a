"""Retake the documentation's screenshots: ``python scripts/screenshots.py [--out DIR] [--only GROUP ...]``.

Serves the app over a fresh runs root on a free loopback port (and, for the ``jupyterlab``
group, JupyterLab on another), drives Debian's chromium (Playwright, as the browser tests do)
at 1400 x 1000 and saves what a person sees. The groups, in the order they are taken:

- ``models``: ``app_models.png``, PReLU built with 4 slopes; ``app_models_error.png``, 0 slopes refused;
- ``experiments``: ``app_experiments.png``, the run form and the intervention panel, opened;
- ``explorer``: ``explorer_curves.png`` (also ``app_explorer.png``), the activation explorer's f and f';
  ``explorer_compare.png``, its "Which trains best" of the four activations it starts with;
- ``live``: ``live_run.png``, an activation_mlp run of 3000 steps, live, most of the way through;
  ``live_distribution.png`` and ``live_heatmap.png``, the same run's distribution over time and heatmap;
- ``diagnose``: ``diagnose-run-page.png``, a sigmoid MLP eight layers deep, whose findings the page lists;
- ``runs``: ``app_runs.png``, the Runs tab with two stored runs (mlp/relu, mlp/tanh), one opened;
- ``jupyterlab``: ``jupyterlab_dashboard.png``, a live Dashboard in a notebook, past step 300 of
  2000; ``diagnose-dashboard.png``, a tanh MLP six layers deep whose Dashboard lists its findings,
  one picked.

Takes three to ten minutes on a 2-core machine. Not run by the tests (the browser tests take their
own screenshots with ``WORKBENCH_SCREENSHOTS=dir``); run it after a change to what these pages show.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(page, experiment: str, steps: int, fields: dict[str, str], picks: dict[str, str], store: str = "") -> None:
    """Start a run from the Experiments tab's form, as a person does: ``fields`` typed in,
    ``picks`` chosen from their dropdowns, recorded to the run ``store`` if given."""
    page.get_by_role("tab", name="Experiments").click()
    if not page.locator("#experiment-list").is_visible():
        page.get_by_text("New run").click()
    page.locator("#experiment-list").get_by_label(experiment, exact=True).check()
    page.wait_for_selector(f"#experiment-overview:has-text('{experiment}')")
    page.locator("#run-steps input").fill(str(steps))
    page.locator("#run-histograms input").check()
    page.locator("#run-store textarea, #run-store input").first.fill(store)
    for label, value in fields.items():
        page.locator("#run-config").get_by_label(label, exact=True).fill(value)
    for label, value in picks.items():
        page.locator("#run-config").get_by_label(label, exact=True).click()
        page.keyboard.press("Control+A")
        page.keyboard.type(value)
        page.get_by_role("option", name=value, exact=True).wait_for()
        page.keyboard.press("Enter")
    page.locator("#run-start").click()


def models(page, out: Path) -> None:
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Models").click()
    page.locator("#name-filter textarea, #name-filter input").first.fill("prelu")
    page.get_by_label("prelu", exact=True).check()
    page.wait_for_selector("#model-overview:has-text('Parametric ReLU')")
    for slopes, message, name in [("4", "Built prelu", "app_models.png"),
                                  ("0", "Could not build the model", "app_models_error.png")]:
        page.get_by_label("num_parameters").fill(slopes)
        page.locator("#build-button").click()
        expect(page.locator("#build-message")).to_contain_text(message)
        page.wait_for_timeout(500)  # (the module tree, updated with the message)
        page.screenshot(path=out / name)


def experiments(page, out: Path) -> None:
    page.get_by_role("tab", name="Experiments").click()
    page.locator("#experiment-list").wait_for()
    panel = page.locator("#intervene").get_by_text("Intervene on this run")
    panel.click()
    page.locator("#iv-site").wait_for()
    page.wait_for_timeout(500)
    page.screenshot(path=out / "app_experiments.png")
    panel.click()  # (folded again, as a run page starts)
    page.locator("#iv-site").wait_for(state="hidden")


def explorer(page, out: Path) -> None:
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Activation explorer").click()
    page.locator("#explorer-curves .js-plotly-plot").wait_for()
    page.screenshot(path=out / "explorer_curves.png")
    shutil.copyfile(out / "explorer_curves.png", out / "app_explorer.png")  # (the app's page shows the same)

    page.get_by_role("tab", name="Which trains best").click()  # (its four defaults, 200 steps each)
    page.locator("#explorer-train").click()
    expect(page.locator("#explorer-compare-status")).to_contain_text("trained best", timeout=600_000)
    page.wait_for_timeout(1500)  # (the tick's redraw)
    page.screenshot(path=out / "explorer_compare.png", full_page=True)


def live(page, out: Path) -> None:
    from playwright.sync_api import expect

    start(page, "activation_mlp", 3000, {}, {"activation": "relu"})
    header = page.locator("#run-status")
    expect(header).to_contain_text(re.compile(r"step (2[2-9]\d\d|30\d\d) of 3000"), timeout=300_000)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=out / "live_run.png")
    expect(header).to_contain_text("finished", timeout=300_000)
    page.locator("#live-distribution").scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # (the tick's redraw)
    page.screenshot(path=out / "live_distribution.png")
    heatmap = page.locator("#live-heatmap")
    heatmap.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)
    heatmap.screenshot(path=out / "live_heatmap.png")


def diagnose(page, out: Path) -> None:
    from playwright.sync_api import expect

    start(page, "activation_mlp", 300, {"depth": "8"}, {"activation": "sigmoid"})
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=300_000)
    expect(page.locator("#live-findings")).to_contain_text("saturated")
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(1500)
    page.screenshot(path=out / "diagnose-run-page.png")


def runs(page, out: Path) -> None:
    from playwright.sync_api import expect

    for activation in ("tanh", "relu"):
        start(page, "activation_mlp", 150, {}, {"activation": activation}, store=f"mlp/{activation}")
        expect(page.locator("#run-status")).to_contain_text("finished", timeout=300_000)
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()
    table = page.locator("#runs-table")
    table.get_by_text("mlp/tanh", exact=True).click()
    expect(page.locator("#replay-header")).to_contain_text("mlp/tanh")
    page.wait_for_timeout(1500)
    page.screenshot(path=out / "app_runs.png")


APP = {"models": models, "experiments": experiments, "explorer": explorer, "live": live, "diagnose": diagnose,
       "runs": runs}

# the jupyterlab group's notebook: a live run, then (stopping it) a deep tanh MLP whose Dashboard lists findings
LIVE_CELL = """\
import workbench
from workbench.ui.notebook import Dashboard

exp = workbench.experiments.create("activation_mlp", seed=0, activation="tanh", depth=3, width=32)
run = exp.start(2000, every=2)   # trains on a thread of its own; the cell returns at once
Dashboard(run)"""
DIAGNOSE_CELL = """\
run.stop()
deep = workbench.experiments.create("activation_mlp", seed=0, activation="tanh", depth=6, lr=0.1)
dash = Dashboard(deep.start(400))
dash"""


def serve_jupyterlab(base: Path, notebook: Path):
    """JupyterLab on a free loopback port over ``notebook``'s folder, with a token and no settings,
    news or workspaces outside ``base`` (as tests/ui/test_jupyterlab.py serves it); returns the
    server process and the notebook's URL once it answers."""
    home = base / "home"
    (home / "config" / "labconfig").mkdir(parents=True)
    (home / "config" / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "IPYTHONDIR": str(home / "ipython"), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebook.parent}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
         "--LabApp.extension_manager=readonly", "--allow-root"],
        env=env, cwd=notebook.parent, stdout=subprocess.DEVNULL, stderr=(base / "server.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                return server, f"{url}/lab/tree/{notebook.name}?token={token}"
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                sys.exit("JupyterLab did not start:\n" + (base / "server.log").read_text()[-3000:])
            time.sleep(0.3)


def run_cell(page, index: int) -> None:
    """Select a cell and press Shift+Enter; again if the kernel did not take it (a keypress while
    the page still connects to the kernel can be lost)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    for _ in range(5):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            cell.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[(\*|\d+)\]")).wait_for(timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    sys.exit(f"cell {index} of the notebook was not run")


def jupyterlab(page, out: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    with tempfile.TemporaryDirectory() as base:
        notebook = Path(base) / "root" / "dashboard.ipynb"
        notebook.parent.mkdir()
        nbformat.write(new_notebook(cells=[new_code_cell(LIVE_CELL), new_code_cell(DIAGNOSE_CELL)], metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}), notebook)
        server, url = serve_jupyterlab(Path(base), notebook)
        try:
            page.goto(url)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
            page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()  # (the file browser folds)
            run_cell(page, 0)
            first = page.locator(".jp-Notebook .jp-Cell").nth(0)
            # the metrics, in the tab open (the other figures are in the closed tabs: drawn, and hidden)
            first.locator(".widget-tab-contents > :visible .js-plotly-plot").first.wait_for(timeout=120_000)
            page.wait_for_function(
                "() => { const el = document.querySelector('.jp-OutputArea-output .widget-html-content');"
                " const m = el && /step (\\d+) of/.exec(el.textContent); return !!m && Number(m[1]) >= 300; }",
                timeout=600_000)  # (before a layer saturates, by step 900 or so: a finding would push the views down)
            page.locator(".jp-Notebook").evaluate("el => el.scrollTo(0, 0)")
            page.mouse.move(5, 500)  # (off the figures: no Plotly toolbar over them)
            page.wait_for_timeout(500)
            page.screenshot(path=out / "jupyterlab_dashboard.png")

            run_cell(page, 1)  # the first run stops; a deep tanh MLP trains
            second = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            second.locator(".widget-html-content:has-text('finished')").first.wait_for(timeout=600_000)
            findings = second.locator(".widget-select select:not([multiple])")  # (not the call sites)
            findings.wait_for(timeout=60_000)
            labels = findings.locator("option").all_inner_texts()
            findings.select_option(label=next(label for label in labels if "saturated" in label))
            page.wait_for_timeout(2000)  # (the views move to the finding)
            second.first.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.mouse.move(5, 500)
            page.wait_for_timeout(500)
            page.screenshot(path=out / "diagnose-dashboard.png")
        except Exception:
            page.screenshot(path=out / "jupyterlab_failed.png")  # (what the page showed)
            raise
        finally:
            server.terminate()  # shuts its kernel down
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


def main() -> None:
    groups = [*APP, "jupyterlab"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"), help="where the pictures go")
    parser.add_argument("--only", nargs="+", choices=groups, default=groups, metavar="GROUP",
                        help=f"retake these groups only: {', '.join(groups)} (default: all)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed: apt-get install -y chromium (scripts/test.sh does)")
    from playwright.sync_api import expect, sync_playwright

    from workbench.ui.app import build_app

    expect.set_options(timeout=60_000)
    with tempfile.TemporaryDirectory(prefix="workbench-") as runs:
        app = build_app(runs_root=Path(runs) / "runs")
        app.queue()
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                   css=app.workbench_css, i18n=app.workbench_i18n)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                for name in (g for g in groups if g in args.only):
                    (APP.get(name) or jupyterlab)(page, out)
                    print(f"{name}: done", flush=True)
                browser.close()
        finally:
            app.close()
            app.run_manager.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
