"""Fixtures for driving the real app in headless Chromium."""

import shutil
import socket

import pytest

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def manager(tmp_path):
    """A run manager over a fresh runs root (``tmp_path / "runs"``, not created yet); its runs are
    stopped at the end of the test."""
    from workbench.ui.runs import RunManager

    manager = RunManager(tmp_path / "runs")
    try:
        yield manager
    finally:
        manager.close()


@pytest.fixture
def step_3_raises(monkeypatch):
    """The activation MLP's training step raises at its third step (a FloatingPointError, "the loss exploded at
    step 3"): a run that fails part-way, as its pages show it."""
    from workbench.experiments.activation_mlp import ActivationMLP

    train_step = ActivationMLP.train_step

    def exploding(self):
        if self.step_count == 2:
            raise FloatingPointError("the loss exploded at step 3")
        return train_step(self)

    monkeypatch.setattr(ActivationMLP, "train_step", exploding)


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("served") / "runs"


@pytest.fixture(scope="module")
def served_app(runs_root):
    """The workbench app served on a free loopback port over ``runs_root``; yields its URL."""
    from workbench.ui.app import build_app

    app = build_app(runs_root=runs_root)
    app.queue()
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               css=app.workbench_css, i18n=app.workbench_i18n)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.close()
        app.run_manager.close()


#: How long a page's assertions (``expect``), actions (click, fill) and waits (``wait_for``, ``wait_for_function``)
#: wait for what they need, unless a test says more: Playwright's own 5 s and 30 s are short on a loaded 2-core
#: machine, where a reply that waits on a training step (or a page's load reading the stored runs) and the
#: browser's own drawing are slow. A wait ends as soon as its condition holds: only a failure waits this long.
PATIENCE_MS = 60_000


@pytest.fixture(scope="session", autouse=True)
def _patient_expect():
    """A page's assertions wait up to :data:`PATIENCE_MS`, not Playwright's 5 s."""
    try:
        from playwright.sync_api import expect
    except ImportError:  # (the tests that need it say so)
        return
    expect.set_options(timeout=PATIENCE_MS)


@pytest.fixture(scope="session", autouse=True)
def _patient_gradio_launch():
    """An app launched in a test is served once its page answers within :data:`PATIENCE_MS`: Gradio's launch checks
    that its page answers (``gradio.networking.url_ok``) and gives up at the first request slower than 3 s, as
    on a loaded machine, calling localhost not accessible."""
    import time

    import httpx
    from gradio import networking

    # (the answers Gradio takes for a page served: an app with a login refuses or redirects)
    served = (200, 401, 301, 302, 303, 307, 308)

    def answers(url: str) -> bool:
        deadline = time.monotonic() + PATIENCE_MS / 1000
        while True:
            try:
                if httpx.head(url, timeout=PATIENCE_MS / 1000, verify=False).status_code in served:
                    return True
            except (ConnectionError, httpx.ConnectError, httpx.TimeoutException):
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    checked = networking.url_ok
    networking.url_ok = answers
    try:
        yield
    finally:
        networking.url_ok = checked


class PatientBrowser:
    """A Playwright browser whose new pages wait up to :data:`PATIENCE_MS` in their actions and waits (each
    ``new_page`` is a context of its own: no default reaches them all)."""

    def __init__(self, browser):
        self._browser = browser

    def new_page(self, **options):
        page = self._browser.new_page(**options)
        page.set_default_timeout(PATIENCE_MS)
        return page

    def __getattr__(self, name):
        return getattr(self._browser, name)


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright (no browser download), its pages patient
    (:class:`PatientBrowser`)."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: run `apt-get install -y chromium` (scripts/test.sh does).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield PatientBrowser(browser)
        finally:
            browser.close()


@pytest.fixture
def page(browser, served_app):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(served_app)
    page.wait_for_selector("#model-list")
    yield page
    page.close()


@pytest.fixture
def nan_at_step_3(monkeypatch):
    """activation_mlp's training puts a NaN into layers.2's weight before step 3 (its activation
    there is where a NaN first appears); the app runs its experiments in this process."""
    import torch

    from workbench.experiments.activation_mlp import ActivationMLP

    train_step = ActivationMLP.train_step

    def poisoned(self):
        if self.step_count == 2:
            with torch.no_grad():
                self.model.layers[2].weight[0, 0] = float("nan")
        return train_step(self)

    monkeypatch.setattr(ActivationMLP, "train_step", poisoned)
