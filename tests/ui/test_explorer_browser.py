"""The Activation explorer tab in headless Chromium: the figures are read from the page (Plotly's
traces) and compared with torch.nn.functional and with the experiment run by itself."""

import os
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from playwright.sync_api import expect

import workbench
from tests.ui.test_browser import BROKEN_WORDS, RULED, choose, table_borders

pytestmark = pytest.mark.browser

# Plotly's traces as the page holds them (typed arrays decoded as Plotly does), with what each is
TRACES = """el => el.data.map(t => {
    const dec = a => {
        if (a && typeof a === 'object' && a.bdata !== undefined) {
            const bin = atob(a.bdata), bytes = new Uint8Array(bin.length);
            for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
            const array = a.dtype === 'i4' ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer);
            return Array.from(array);
        }
        return ArrayBuffer.isView(a) ? Array.from(a) : a;
    };
    return {name: t.name, xaxis: t.xaxis || 'x', meta: t.meta || null, x: dec(t.x), y: dec(t.y)};
})"""


def _screenshot(page, name, full_page=True):
    # WORKBENCH_SCREENSHOTS=dir keeps pictures of the page for a person to look at.
    folder = os.environ.get("WORKBENCH_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, name), full_page=full_page)


def traces(page, elem_id, until, timeout=60.0):
    """The traces of the figure in ``#elem_id`` once ``until(traces)`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        plot = page.locator(f"#{elem_id} .js-plotly-plot")
        found = plot.evaluate(TRACES) if plot.count() else []
        if until(found):
            return found
        assert time.monotonic() < deadline, f"#{elem_id} never drew what was expected: {found!r:.800}"
        time.sleep(0.25)


def open_explorer(page, part):
    page.get_by_role("tab", name="Activation explorer").click()
    page.get_by_role("tab", name=part).click()


def by_curve(found):
    return {(t["meta"]["label"], t["meta"]["curve"]): t for t in found if t.get("meta")}


def test_curves_match_torch_functional_at_the_points_the_page_draws(page):
    open_explorer(page, "Curves")
    # the fields of the checked activations only (gelu's, not prelu's) once the page has drawn them
    expect(page.locator("#explorer-gelu-approximate input")).to_be_visible()
    expect(page.locator("#explorer-prelu-init input")).to_be_hidden()
    names = page.locator("#explorer-names")
    names.get_by_label("prelu", exact=True).check()
    names.get_by_label("tanh", exact=True).uncheck()
    traces(page, "explorer-curves", lambda t: {k[0] for k in by_curve(t)} == {"gelu", "relu", "prelu"})
    # (checking prelu shows the fields drawn for it when the page loaded)
    expect(page.locator("#explorer-prelu-init input")).to_be_visible()
    page.locator("#explorer-prelu-init input").fill("-0.3")
    choose(page, "explorer-gelu-approximate", "tanh")
    page.locator("#explorer-x-low input").fill("-6")
    page.locator("#explorer-x-high input").fill("3")
    page.locator("#explorer-x-high input").press("Tab")
    wanted = {"gelu(approximate='tanh')", "relu", "prelu(init=-0.3)"}
    found = by_curve(traces(page, "explorer-curves", lambda t: {k[0] for k in by_curve(t)} == wanted
                            and min(by_curve(t)["relu", "f"]["x"]) == -6 and max(by_curve(t)["relu", "f"]["x"]) == 3))
    references = {"gelu(approximate='tanh')": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
                  "prelu(init=-0.3)": lambda x: F.prelu(x, torch.tensor([-0.3], dtype=x.dtype))}
    for label, function in references.items():
        for curve in ("f", "autograd", "closed"):
            # each curve at its own points; a gap (NaN) half way where it jumps: f' of relu and prelu at 0
            x, y = (np.array(found[label, curve][axis], np.float64) for axis in ("x", "y"))
            drawn = ~np.isnan(y)
            assert drawn.sum() == 401 and len(x) - 401 == (curve != "f" and label != "gelu(approximate='tanh')")
            leaf = torch.tensor(x[drawn], requires_grad=True)
            f = function(leaf)
            f.sum().backward()
            expected = f.detach().numpy() if curve == "f" else leaf.grad.numpy()
            assert np.allclose(y[drawn], expected, atol=1e-5), (label, curve)
        assert found[label, "closed"]["xaxis"] == "x2"
    message = page.locator("#explorer-curves-message")
    expect(message).to_contain_text("prelu(init=-0.3)")
    expect(message).to_contain_text("max |f′ closed form − f′ autograd|")
    assert table_borders(message.locator("table")) == RULED  # (a rule under each row, no frame)
    _screenshot(page, "explorer_curves.png", full_page=False)
    # the Distributions part pushes samples through the activation as set under Curves
    page.get_by_role("tab", name="Distributions").click()
    choose(page, "explorer-dist-name", "prelu")
    expect(page.locator("#explorer-dist-message")).to_contain_text("prelu(init=-0.3) on 100,000 samples")


def test_an_activation_registered_after_the_app_started_is_drawn(page, scratch_model):
    class Hardish(torch.nn.Module):
        """A clipped identity."""

        def __init__(self, bound: float = 1.5):
            super().__init__()
            self.bound = bound

        def forward(self, x):
            return x.clamp(-self.bound, self.bound)

    scratch_model("hardish", family="activation", example_inputs=lambda m, b, g=None: ((torch.zeros(b, 2),), {}),
                  derivative=lambda m, x: ((x > -m.bound) & (x < m.bound)).to(x.dtype))(Hardish)
    open_explorer(page, "Curves")
    choose(page, "explorer-gelu-approximate", "tanh")  # (a value set before Reload is kept: it went back to 'none')
    traces(page, "explorer-curves", lambda t: ("gelu(approximate='tanh')", "f") in by_curve(t))
    page.locator("#explorer-reload").click()
    # (Reload draws the fields of what it found, hidden until checked: a check made before that render
    # has replaced the page's listeners would go to the ones it replaces)
    expect(page.locator("#explorer-hardish-fields").first).to_be_attached()
    page.locator("#explorer-names").get_by_label("hardish", exact=True).check()
    page.locator("#explorer-hardish-bound input").fill("0.5")
    page.locator("#explorer-hardish-bound input").press("Tab")
    found = by_curve(traces(page, "explorer-curves", lambda t: ("hardish(bound=0.5)", "f") in by_curve(t)))
    f = found["hardish(bound=0.5)", "f"]
    assert np.allclose(f["y"], np.clip(f["x"], -0.5, 0.5), atol=1e-6)
    expect(page.locator("#explorer-curves-message")).to_contain_text("hardish(bound=0.5)")
    assert ("gelu(approximate='tanh')", "f") in found
    expect(page.locator("#explorer-gelu-approximate input")).to_have_value("tanh")


def test_a_bad_range_is_a_message_not_a_traceback(page):
    open_explorer(page, "Curves")
    expect(page.locator("#explorer-gelu-approximate input")).to_be_visible()  # (the render that listens to the range)
    page.locator("#explorer-x-low input").fill("5")
    page.locator("#explorer-x-low input").press("Tab")
    expect(page.locator("#explorer-curves-message")).to_contain_text("The range must run from low to high, got [5, 4]")
    assert "Traceback" not in page.content()


def test_a_normal_pushed_through_relu(page):
    open_explorer(page, "Distributions")
    page.locator("#explorer-dist-name input").click()
    page.get_by_role("option", name="relu", exact=True).click()
    page.locator("#explorer-std input").fill("2")
    page.locator("#explorer-std input").press("Tab")
    message = page.locator("#explorer-dist-message")
    expect(message).to_contain_text("relu on 100,000 samples of normal with mean 0 and std 2")
    dead = float(re.search(r"no gradient passes\) ([\d.]+)%", message.inner_text()).group(1))
    assert 49 < dead < 51  # P(x <= 0) of a centred normal
    bars = {t["meta"]["side"]: t for t in traces(page, "explorer-dist", lambda t: len(t) == 2
                                                 and "relu" in (t[1]["name"] or ""))}
    output = bars["output"]
    assert np.isclose(sum(output["y"]), 1.0, atol=1e-3)
    # the first bar (from 0) holds every zero; no other bar has more than a few percent
    assert output["x"][0] > 0 and output["y"][0] >= dead / 100 - 1e-3 and max(output["y"][1:]) < 0.05


def test_which_activation_trains_best_runs_in_the_background_and_draws_each(page):
    open_explorer(page, "Which trains best")
    names = page.locator("#explorer-compare-names")
    for name in ("gelu", "sigmoid"):
        names.get_by_label(name, exact=True).uncheck()
    page.locator("#explorer-steps input").fill("40")
    stop = page.locator("#explorer-stop")
    expect(stop).to_be_disabled()  # (no comparison runs yet: nothing to stop)
    page.locator("#explorer-train").click()
    status = page.locator("#explorer-compare-status")
    expect(status).to_contain_text("relu finished 40/40", timeout=120_000)
    expect(status).to_contain_text("tanh finished 40/40", timeout=120_000)
    expect(status).to_contain_text(re.compile(r"(relu|tanh) trained best: accuracy \d\.\d{3}"))
    expect(stop).to_be_disabled()  # (the runs ended)
    found = traces(page, "explorer-compare-metrics", lambda t: {x["name"] for x in t if x["xaxis"] == "x"
                                                                and len(x["x"]) == 40} >= {"relu", "tanh"})
    for name in ("relu", "tanh"):
        loss = next(t for t in found if t["name"] == name and t["xaxis"] == "x" and len(t["x"]) == 40)
        # (the tab's depth, width, lr and dataset: the experiment's defaults, as the Experiments tab has them)
        alone = workbench.experiments.create("activation_mlp", seed=0, activation=name).run(40, progress=False)
        assert loss["x"] == list(range(1, 41))
        assert np.allclose(loss["y"], [m["loss"] for m in alone], atol=1e-5), name
    layers = traces(page, "explorer-compare-layers", lambda t: len(t) == 8)  # (2 activations x 2 layers x 2)
    dead = {(t["meta"]["activation"], t["meta"]["layer"]): t["y"] for t in layers
            if t["meta"]["statistic"] == "dead units"}
    assert set(dead) == {(a, f"layers.{k}") for a in ("relu", "tanh") for k in (0, 2)}
    assert all(v > 0 for v in dead["relu", "layers.2"]) and all(v == 0 for v in dead["tanh", "layers.2"])
    table = page.locator("#explorer-compare-table")
    expect(table).to_contain_text("finished")
    _screenshot(page, "explorer_compare.png")
    # no word of the table breaks mid-word, at 1400 px nor at 800 ("activati|on", "finishe|d", "ste|p" did)
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 1000})
        assert table.evaluate(BROKEN_WORDS) == [], width
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_the_curves_titles_stay_inside_the_figure_in_a_narrow_window(browser, served_app):
    # (beside the controls in an 800 px window, the f' panel's title ran out of the figure, cut at its edge)
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        page.goto(served_app)
        page.get_by_role("tab", name="Activation explorer").click()
        page.wait_for_selector("#explorer-curves .annotation-text")
        laid_out = page.evaluate("""() => {
            const figure = document.querySelector('#explorer-curves .js-plotly-plot').getBoundingClientRect();
            return {figure: [figure.left, figure.right], titles: [...document.querySelectorAll(
                '#explorer-curves .annotation-text')].map(t => [t.textContent, t.getBoundingClientRect().left,
                                                                t.getBoundingClientRect().right])};
        }""")
        (left, right), titles = laid_out["figure"], laid_out["titles"]
        assert any(text.startswith("f′(x)") for text, _, _ in titles), laid_out
        assert all(left <= start and end <= right for _, start, end in titles), laid_out
    finally:
        page.close()


@pytest.mark.parametrize("width", [800, 1100, 1280, 1400, 1920])
def test_the_samples_seed_and_saturation_of_the_distributions_lie_on_one_row(page, width):
    # (in the 300 px column of a 1100-1400 px window the saturation's label took two lines, its box lower than the
    # samples' and the seed's)
    page.set_viewport_size({"width": width, "height": 1000})
    open_explorer(page, "Distributions")
    fields = ["explorer-samples", "explorer-dist-seed", "explorer-saturation"]
    expect(page.locator("#explorer-saturation input")).to_be_visible()
    laid_out = page.evaluate("""ids => ids.map(id => {
        const box = document.querySelector(`#${id} input`).getBoundingClientRect();
        const label = document.querySelector(`#${id} [data-testid=block-info]`);
        return [id, Math.round(box.top), Math.round(label.getBoundingClientRect().height),
                Math.round(parseFloat(getComputedStyle(label).lineHeight))];
    })""", fields)
    assert len({top for _, top, _, _ in laid_out}) == 1, laid_out  # (the boxes on one row)
    assert all(height <= line for _, _, height, line in laid_out), laid_out  # (each label on a line)
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_which_trains_best_has_its_depth_and_width_boxes_on_one_line(page):
    # (depth's note took two lines in the 300 px column, width's one: depth's box lay lower than width's)
    open_explorer(page, "Which trains best")
    expect(page.locator("#explorer-depth input")).to_be_visible()
    tops = [round(page.locator(f"#explorer-{field} input").bounding_box()["y"]) for field in ("depth", "width")]
    assert len(set(tops)) == 1, tops
