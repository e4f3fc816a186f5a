"""End to end: the real page in headless Chromium.

The run page's figures are read from the page itself: Plotly's traces (``el.data`` of each
``.js-plotly-plot``), their typed arrays decoded in the browser, and compared with what the
run stored.
"""

import os
import re
import time
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout, expect

from tests.ui.conftest import PATIENCE_MS
from workbench.instrument import load_run

pytestmark = pytest.mark.browser


def _screenshot(page, name, full_page=True):
    # WORKBENCH_SCREENSHOTS=dir keeps pictures of the page for a person to look at.
    folder = os.environ.get("WORKBENCH_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, name), full_page=full_page)


def test_build_a_model_and_see_its_tree(page):
    page.locator("#name-filter textarea, #name-filter input").first.fill("prelu")
    page.get_by_label("prelu", exact=True).check()
    page.wait_for_selector("#model-overview:has-text('Parametric ReLU')")
    field = page.get_by_label("num_parameters")
    field.fill("4")
    page.locator("#build-button").click()
    message = page.locator("#build-message")
    message.get_by_text("Built prelu").wait_for()
    assert "num_parameters=4" in message.inner_text()
    tree = page.locator("#module-tree")
    expect(tree).to_contain_text("PReLU")
    expect(tree).to_contain_text("(2, 4, 5)")
    _screenshot(page, "models_prelu.png")


def test_invalid_value_is_a_message_not_a_traceback(page):
    page.get_by_label("mlp", exact=True).check()
    page.wait_for_selector("#model-overview:has-text('MLP classifier')")
    page.get_by_label("depth").fill("40")  # the range is [1, 32]
    page.locator("#build-button").click()
    message = page.locator("#build-message")
    message.get_by_text("Could not build the model").wait_for()
    assert "'depth' must lie in [1, 32], got 40" in message.inner_text()
    assert "Traceback" not in page.content()
    _screenshot(page, "models_error.png")


@pytest.mark.parametrize("width", [800, 1400])
def test_the_module_tree_of_a_model_with_long_outputs_keeps_every_column_readable(browser, served_app, width):
    # (QueryModule returns a dict of four tensors: its output squeezed the other columns to a letter a line and
    # ran past the table's edge; in an 800 px window the longest model name also stuck out of the list's box)
    page = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        page.goto(served_app)
        page.get_by_label("query_module", exact=True).check()
        page.wait_for_selector("#model-overview:has-text('QueryModule')")
        page.locator("#build-button").click()
        expect(page.locator("#module-tree")).to_contain_text("HashToInt")
        laid_out = page.evaluate("""() => {
            const box = el => el.getBoundingClientRect(), tree = document.querySelector('#module-tree');
            const list = document.querySelector('#model-list');
            const lines = el => { const range = document.createRange(); range.selectNodeContents(el);
                                  return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; };
            return {heads: [...tree.querySelectorAll('th')].map(th => [th.innerText.trim(), lines(th)]),
                    right: box(tree).right, list: box(list).right,
                    cells: Math.max(...[...tree.querySelectorAll('td')].map(td => box(td).right)),
                    options: Math.max(...[...list.querySelectorAll('label')].map(label => box(label).right))};
        }""")
        lines = {name: n for name, n in laid_out["heads"] if name}
        assert set(lines) == {"module", "path", "type", "params", "output"}, laid_out
        assert len(set(lines.values())) == 1, laid_out  # (each name as many lines as the others: one)
        assert laid_out["cells"] <= laid_out["right"] + 1 and laid_out["options"] <= laid_out["list"] + 1, laid_out
    finally:
        page.close()


def test_family_filter_narrows_the_list(page):
    page.locator("#family-filter input").click()
    page.get_by_role("option", name="activation").click()
    page.wait_for_function(
        "() => !document.querySelector('#model-list').innerText.includes('mlp')"
    )
    listed = page.locator("#model-list").inner_text()
    for name in ("gelu", "prelu", "relu", "sigmoid", "tanh", "threshold"):
        assert name in listed


LAYERS = ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"]
# Plotly's traces as the page holds them; typed arrays ({dtype, bdata}) decoded as Plotly does
TRACES = """el => el.data.map(t => {
    const dec = a => {
        if (a && typeof a === 'object' && a.bdata !== undefined) {
            const bin = atob(a.bdata), bytes = new Uint8Array(bin.length);
            for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
            const array = a.dtype === 'i4' ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer);
            return Array.from(array, v => Number.isNaN(v) ? null : v);
        }
        return ArrayBuffer.isView(a) ? Array.from(a) : a;
    };
    return {name: t.name, type: t.type, mode: t.mode, x: dec(t.x), y: dec(t.y), z: dec(t.z),
            title: el.layout.title ? el.layout.title.text : ''};
})"""


#: How long, in seconds, a test waits for a page to draw or take what it needs: as patient as the page's own
#: waits (tests/ui/conftest.py's PATIENCE_MS), a loaded machine's redraws and replies being slow
PATIENCE = PATIENCE_MS / 1000


def traces(page, elem_id, until=lambda t: bool(t), timeout=PATIENCE):
    """The traces of the figure in ``#elem_id``, once ``until(traces)`` holds (the page redraws
    every second)."""
    deadline = time.monotonic() + timeout
    while True:
        plot = page.locator(f"#{elem_id} .js-plotly-plot")
        found = plot.evaluate(TRACES) if plot.count() else []
        if until(found):
            return found
        assert time.monotonic() < deadline, f"#{elem_id} never drew what was expected: {found!r:.600}"
        time.sleep(0.25)


def lines(found):
    return {t["name"]: t for t in found if "lines" in t.get("mode", "") and t.get("name")}


def tokens(page, elem_id):
    return page.locator(f"#{elem_id} .token span").all_inner_texts()


def _listbox(page, elem_id, timeout=PATIENCE):
    """The list of options a dropdown opens (its own: another may still be open)."""
    box = page.locator(f"#{elem_id} input")
    deadline = time.monotonic() + timeout
    # (a click on a focused dropdown may not open it, and on a loaded machine the list may render late or
    # close again as a redraw lands, which may also mount the dropdown anew: leave the box and click again
    # until its list stays open; the list opened is open at least while the box has the focus)
    while True:
        box.click()
        listbox = page.locator(f"#{box.get_attribute('aria-controls')}")
        if _stays_visible(page, listbox):
            return listbox
        assert time.monotonic() < deadline, f"#{elem_id}'s list never opened"
        box.blur()


def _stays_visible(page, locator, settle_ms=5_000) -> bool:
    """Whether ``locator`` shows now, or within ``settle_ms`` (a list a click opened shows at once where the page
    keeps up; on a loaded machine a while later: clicked again before then, the box would close it)."""
    try:
        locator.wait_for(state="visible", timeout=settle_ms)
        return True
    except PlaywrightTimeout:
        return False


def options(page, elem_id):
    """The choices a dropdown lists (opened, read, closed)."""
    listed = [text.replace("✓", "").strip() for text in _listbox(page, elem_id).get_by_role("option")
              .all_inner_texts()]
    page.keyboard.press("Escape")
    return listed


#: A small table of text as the app styles it (the explorer's f' differences, a checkpoint's outputs): a rule
#: under each row, no frame (Gradio's prose framed each row: dark lines left and right of the table, and over it)
RULED = {("TABLE", ""), ("TR", ""), ("TH", "Bottom"), ("TD", "Bottom")}


def table_borders(table):
    """The sides with a border of the table (a locator) and of its rows and cells: {(tag, 'Top Right ...')}."""
    return set(map(tuple, table.evaluate("""table => [table, ...table.querySelectorAll('tr, th, td')].map(el => [
        el.tagName, ['Top', 'Right', 'Bottom', 'Left'].filter(side => getComputedStyle(el)[`border${side}Style`]
                                                               !== 'none').join(' ')])""")))


def choose(page, elem_id, *picks, timeout=2 * PATIENCE):
    """Pick options as a person does with the keyboard: type each into the dropdown, Enter; again
    where a redraw swallowed the pick (it shows as the box's value, or a multiselect's token)."""
    deadline = time.monotonic() + timeout
    for option in picks:
        while True:
            listbox = _listbox(page, elem_id)
            page.keyboard.press("Control+A")
            page.keyboard.type(option)
            # (Gradio's dropdown picks its active option on a keydown, from the text before that key: after
            # the last letter typed, a key that types nothing makes the typed option the active one)
            page.keyboard.press("Shift")
            expect(listbox.get_by_role("option", name=option, exact=True)).to_be_visible()
            page.keyboard.press("Enter")
            if _picked(page, elem_id, option):
                break
            assert time.monotonic() < deadline, f"#{elem_id} never kept the pick {option!r}"
    page.keyboard.press("Escape")


def _picked(page, elem_id, option, settle=10.0) -> bool:
    """Whether the dropdown took ``option``: a multiselect shows it as a token; a single dropdown leaves
    its box once it has taken a pick, showing it (a typed text it did not take stays in the focused box,
    and the blur that comes next puts its value back). Waited for up to ``settle`` s: picked again before a
    slow page showed the pick, a multiselect's option would be picked twice, which unpicks it."""
    box = page.locator(f"#{elem_id} input")
    deadline = time.monotonic() + settle
    while True:
        if option in tokens(page, elem_id) or (
                box.input_value() == option and not box.evaluate("el => el === document.activeElement")):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def start(page, experiment, steps, store="", histograms=False, seed=0, modules="*", **fields):
    page.get_by_role("tab", name="Experiments").click()
    if not page.locator("#experiment-list").is_visible():  # the form folds away once a run starts
        page.locator("#run-config").get_by_text("New run").click()
    page.locator("#experiment-list").get_by_label(experiment, exact=True).check()
    page.wait_for_selector(f"#experiment-overview:has-text('{experiment}')")
    page.locator("#run-seed input").fill(str(seed))
    page.locator("#run-steps input").fill(str(steps))
    box = page.locator("#run-histograms input")
    box.check() if histograms else box.uncheck()
    page.locator("#run-store textarea, #run-store input").first.fill(store)
    page.locator("#run-modules textarea, #run-modules input").first.fill(modules)
    for label, value in fields.items():
        page.locator("#run-config").get_by_label(label, exact=True).fill(value)
    page.locator("#run-start").click()


def stored_series(rows, kind, site, statistic):
    part = rows[(rows.kind == kind) & (rows.module == site) & (rows.tensor == "out")]
    return part.step.tolist(), part[statistic].to_numpy()


def test_a_failed_runs_header_says_its_error_in_short_the_traceback_a_click_away(page, step_3_raises):
    # (the header showed a traceback's last line, and the traceback was nowhere on the page)
    start(page, "activation_mlp", 10)
    header = page.locator("#run-status")
    expect(header).to_contain_text("failed", timeout=60_000)
    expect(header.locator("pre").first).to_have_text("FloatingPointError: the loss exploded at step 3")
    folded = header.locator("details")
    expect(folded.locator("summary")).to_have_text("traceback")
    expect(folded.locator("pre")).not_to_be_visible()
    folded.locator("summary").click()
    expect(folded.locator("pre")).to_contain_text("Traceback (most recent call last):")
    expect(folded.locator("pre")).to_contain_text("in exploding")
    _screenshot(page, "live_failed_traceback.png", full_page=False)


def test_the_forms_histogram_bins_reach_the_run_and_a_count_out_of_range_is_refused_saying_why(page, runs_root):
    from workbench.instrument import load_run
    from workbench.instrument.schema import MAX_BINS

    page.get_by_role("tab", name="Experiments").click()
    bins = page.locator("#run-bins input")
    bins.fill(str(MAX_BINS + 1))
    start(page, "activation_mlp", 2, store="bins/refused", histograms=True)
    expect(page.locator("#start-message")).to_contain_text(
        f"histogram bins must lie in [1, {MAX_BINS}], got {MAX_BINS + 1}: the sample a large tensor's histogram")
    page.locator("#run-histograms input").uncheck()
    expect(bins).to_be_disabled()  # (the box is the histograms': no input while none are recorded)
    page.locator("#run-histograms input").check()
    expect(bins).to_be_enabled()
    bins.fill("8")
    start(page, "activation_mlp", 2, store="bins/eight", histograms=True)
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=60_000)
    assert {len(counts) for counts in load_run(runs_root / "bins/eight").histograms().counts} == {8}


def test_the_plots_say_the_run_is_starting_from_the_moment_the_header_says_it_runs(page, monkeypatch):
    # (the header said "running · step 0" while the plots said "No run on this page" until the run's first
    # drawing came, some 6 s under load: here that drawing is held back until the plots were read)
    import threading

    from workbench.ui import run_page, run_tabs

    drawing = threading.Event()
    redraw = run_tabs.redraw

    def held(view, *args, **kwargs):
        if view is not None:
            drawing.wait(120)
        return redraw(view, *args, **kwargs)

    monkeypatch.setattr(run_tabs, "redraw", held)
    try:
        start(page, "activation_mlp", 100_000)
        expect(page.locator("#run-status")).to_contain_text("running")
        for name in run_page.PLOTS:
            expect(page.locator(f"#live-{name}")).to_contain_text(re.compile(r"activation_mlp, seed 0, .* is starting"))
            expect(page.locator(f"#live-{name}")).not_to_contain_text("No run on this page")
    finally:
        drawing.set()
    expect(page.locator("#live-metrics")).not_to_contain_text("is starting")  # (its first drawing replaced it)
    page.locator("#run-stop").click()
    expect(page.locator("#run-status")).to_contain_text("stopped", timeout=60_000)


def test_watch_an_activation_mlp_live_and_each_view_shows_its_data(page, runs_root):
    start(page, "activation_mlp", 30, store="browser/mlp", histograms=True, width="16")
    header = page.locator("#run-status")
    expect(header).to_contain_text("finished", timeout=120_000)
    expect(header).to_contain_text("step 30 of 30")
    expect(header.locator("progress")).to_have_attribute("value", "1.000")
    expect(page.locator("#live-message")).to_contain_text("this page is attached to it")  # (by its header)
    # a healthy run: the note says so, and the findings list, with no row, is not shown
    expect(page.locator("#live-findings-note")).to_contain_text("nothing looked wrong in this run")
    expect(page.locator("#live-findings")).to_be_hidden()
    # the form folded away: the header and the first plots are in view without scrolling past it
    expect(page.locator("#experiment-list")).to_be_hidden()
    page.evaluate("window.scrollTo(0, 0)")
    for elem in ("run-status", "live-metrics"):
        box = page.locator(f"#{elem}").bounding_box()
        assert 0 <= box["y"] < 1000 - 200, (elem, box)
    run = load_run(runs_root / "browser" / "mlp")
    rows, metrics = run.to_pandas(), run.metrics()

    # (2) metrics: a panel each, every step, the recorded values
    drawn = lines(traces(page, "live-metrics", lambda t: any(x["x"] and x["x"][-1] == 30 for x in t)))
    assert set(drawn) == {"loss", "accuracy"}
    assert drawn["loss"]["x"] == list(range(1, 31))
    # the page's Plotly took the typed arrays in (its own parsed data holds every point)
    assert page.locator("#live-metrics .js-plotly-plot").evaluate(
        "el => el._fullData.filter(t => t.name === 'loss').map(t => t.x.length)") == [30]
    np.testing.assert_allclose(drawn["loss"]["y"], metrics.loss, rtol=1e-5)
    # log y and smoothing
    page.locator("#live-log-metrics input").check()
    expect(page.locator("#live-metrics .js-plotly-plot .ytick").first).to_be_visible()
    page.wait_for_function("() => document.querySelector('#live-metrics .js-plotly-plot').layout.yaxis.type"
                           " === 'log'")

    # (3) a statistic per call site: the run's sites in forward order, the default the view's
    assert options(page, "live-sites") == LAYERS
    shown = tokens(page, "live-sites")
    assert shown and set(shown) <= set(LAYERS)
    drawn = lines(traces(page, "live-series"))
    assert set(drawn) == set(shown)
    for site in shown:
        steps, values = stored_series(rows, "activation", site, "std")
        assert drawn[site]["x"] == steps
        np.testing.assert_allclose(drawn[site]["y"], values, rtol=1e-5)
    # another kind: the plot and the last-step table follow it; one site picked alone
    choose(page, "live-kind", "grad_output")
    drawn = lines(traces(page, "live-series", lambda t: t and "grad_output" in t[0]["title"]))
    steps, values = stored_series(rows, "grad_output", "layers.1", "std")
    np.testing.assert_allclose(drawn["layers.1"]["y"], values, rtol=1e-5)
    last = rows[(rows.step == 30) & (rows.kind == "grad_output") & (rows.module == "layers.0")]
    expect(page.locator("#live-latest")).to_contain_text(f"{float(last['std'].iloc[0]):.4g}")  # (4 significant digits)
    page.locator("#live-sites .remove-all").click()
    choose(page, "live-sites", "layers.3")
    drawn = lines(traces(page, "live-series", lambda t: len(lines(t)) == 1))
    assert list(drawn) == ["layers.3"]
    choose(page, "live-sites", "layers.1")
    traces(page, "live-series", lambda t: set(lines(t)) == {"layers.1", "layers.3"})
    page.locator("#live-sites .token", has_text="layers.3").locator(".token-remove").click()
    traces(page, "live-series", lambda t: set(lines(t)) == {"layers.1"})
    page.keyboard.press("Escape")

    # (4) distributions over time for the chosen kind and site, from the histograms
    choose(page, "live-dist-site", "layers.2")
    drawn = traces(page, "live-distribution", lambda t: t and "layers.2" in t[0]["title"])
    [median] = [t for t in drawn if t["name"] == "median"]
    assert median["x"] == list(range(1, 31))
    hist = run.histograms("layers.2", "grad_output")
    middle = [np.interp(0.5, np.r_[0, np.cumsum(c)] / np.sum(c), e) for e, c in zip(hist.edges, hist.counts)]
    np.testing.assert_allclose(median["y"], middle, rtol=1e-4, atol=1e-7)
    assert any(t["type"] == "heatmap" for t in drawn)

    # (5) the layer x step heatmap: grad_output norm of every site, forward order, log10
    [heat] = traces(page, "live-heatmap")
    assert heat["y"] == LAYERS and heat["x"] == list(range(1, 31))
    z = np.array(heat["z"], dtype=float).reshape(len(LAYERS), 30)
    for i, site in enumerate(LAYERS):
        np.testing.assert_allclose(z[i], np.log10(stored_series(rows, "grad_output", site, "norm")[1]), rtol=1e-4)
    # (6) no NaN/Inf in this run: no banner, no jump
    expect(page.locator("#live-jump")).to_be_hidden()
    page.evaluate("window.scrollTo(0, 0)")
    _screenshot(page, "live_run.png", full_page=False)
    page.locator("#live-distribution").scroll_into_view_if_needed()
    _screenshot(page, "live_distribution.png", full_page=False)
    page.locator("#live-heatmap").scroll_into_view_if_needed()
    _screenshot(page, "live_heatmap.png", full_page=False)

    # a run name leading out of the runs root is refused, naming the value; the page keeps its run
    start(page, "activation_mlp", 5, store="../outside")
    expect(page.locator("#start-message")).to_contain_text("run name '../outside' contains '..'")
    # (and in a pop-up, in view wherever the page is scrolled to)
    expect(page.locator(".toast-body").filter(has_text="contains '..'")).to_be_visible()
    expect(header).to_contain_text("step 30 of 30")
    assert not (runs_root.parent / "outside").exists()
    # a fraction of a step is refused by name, not rounded by the page
    start(page, "activation_mlp", 2.5)
    expect(page.locator("#start-message")).to_contain_text("steps must be a whole number in [1, 10000000], got 2.5")


def test_efficientzero_dynamics_with_histograms_shows_every_call_site(page):
    start(page, "efficientzero_dynamics", 4, histograms=True, batch_size="8", lstm_hidden_size="16",
          unroll_steps="2", support_size="5")
    expect(page.locator("#run-status")).to_contain_text("step 4 of 4", timeout=120_000)
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)  # (a tick after the last step)
    # many call sites: the default is the few whose statistic changed most, never "the first 24"
    shown = tokens(page, "live-sites")
    assert len(shown) == 6
    sites = options(page, "live-sites")
    assert len(sites) > 24 and set(shown) < set(sites)
    assert sites[0].startswith("conv")  # forward order: the first layer first
    assert set(lines(traces(page, "live-series"))) == set(shown)
    # the heatmap: every site of the kind, in forward order
    heat, *zeros = [t for t in traces(page, "live-heatmap", lambda t: t and t[0]["x"] == [1, 2, 3, 4])
                    if t["type"] == "heatmap"]  # (a figure of many rows has its steps on top too: a trace's axis)
    assert len(heat["y"]) > 24 and len(heat["z"]) == len(heat["y"]) * 4
    # (exact zeros, grey on top: the output gradients behind the reward head, whose last layer starts at 0)
    assert len(zeros) <= 1 and all(z["y"] == heat["y"] and z["name"] == "norm = 0" for z in zeros)
    # distributions: the sites with histograms (all of them here), one drawn
    choose(page, "live-dist-site", sites[0])
    drawn = traces(page, "live-distribution", lambda t: t and sites[0] in t[0]["title"])
    [median] = [t for t in drawn if t["name"] == "median"]
    assert median["x"] == [1, 2, 3, 4] and all(v is not None for v in median["y"])
    # the site names are readable: the module path, #k for a module called more than once
    assert any(re.fullmatch(r"dynamics_lstm#\d.*|.*#1", s) for s in sites)
    _screenshot(page, "dynamics_live.png", full_page=False)


def test_the_first_nan_is_shown_and_the_views_jump_to_its_site(page, nan_at_step_3):
    start(page, "activation_mlp", 6, histograms=True, width="8")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    banner = page.locator("#live-anomaly")
    expect(banner).to_contain_text("First NaN/Inf at step 3: layers.2 (activation")
    expect(page.locator("#live-anomalies")).to_contain_text("layers.2")
    # (each redraw waited for: the controls' handlers run side by side, and a late one would draw over Jump's)
    choose(page, "live-kind", "grad_output")
    traces(page, "live-series", lambda t: t and t[0]["title"].startswith("grad_output"))
    choose(page, "live-heat-kind", "param")
    traces(page, "live-heatmap", lambda t: t and t[0]["title"].startswith("param"))
    page.locator("#live-jump").click()
    expect(page.locator("#live-kind input")).to_have_value("activation")
    expect(page.locator("#live-heat-kind input")).to_have_value("activation")
    expect(page.locator("#live-dist-site input")).to_have_value("layers.2")
    page.wait_for_function("() => document.querySelectorAll('#live-sites .token').length === 1")
    assert tokens(page, "live-sites") == ["layers.2"]
    assert list(lines(traces(page, "live-series", lambda t: list(lines(t)) == ["layers.2"]))) == ["layers.2"]
    _screenshot(page, "live_nan.png", full_page=False)


def test_a_page_that_attaches_to_a_run_that_ended_lists_its_findings(page, browser, served_app, nan_at_step_3):
    # (no run goes on once it ended: no tick comes to the page that attaches to it later)
    start(page, "activation_mlp", 6, width="8")
    status = page.locator("#run-status")
    expect(status).to_contain_text("finished", timeout=120_000)
    expect(page.locator("#live-findings")).to_contain_text("nan")
    run_id = re.search(r"\b(r\d+) activation_mlp", status.inner_text())[1]  # (not a progress timer before it)
    other = browser.new_page(viewport={"width": 1400, "height": 1000})  # (a browser of its own: it holds no run)
    try:
        other.goto(served_app)
        other.wait_for_selector("#model-list")
        other.get_by_role("tab", name="Experiments").click()
        expect(other.locator("#run-status")).to_contain_text("No run on this page")
        other.locator("#live-pick input").click()
        other.get_by_role("option", name=re.compile(rf"^{run_id} activation_mlp, .* \(finished\)$")).click()
        other.locator("#live-attach").click()
        expect(other.locator("#run-status")).to_contain_text(f"{run_id} activation_mlp")
        expect(other.locator("#live-findings-note")).to_contain_text("Diagnoses:")
        expect(other.locator("#live-findings")).to_contain_text("nan")
    finally:
        other.close()


def test_replay_compare_and_export_stored_runs(page, runs_root, tmp_path):
    start(page, "activation_mlp", 12, store="browser/first", width="8")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    start(page, "activation_mlp", 20, store="browser/second", seed=1, width="8")
    expect(page.locator("#run-status")).to_contain_text("step 20 of 20", timeout=120_000)
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)  # (a tick after the last step)
    page.get_by_role("tab", name="Runs").click()
    expect(page.locator("#runs-root-note")).to_contain_text(str(runs_root.resolve()))
    table = page.locator("#runs-table")
    expect(table).to_contain_text("browser/second")  # (stored after the page loaded: listed when the tab shows)
    page.locator("#runs-refresh").click()
    expect(table).to_contain_text("browser/first")
    # click a row: that run opens, replayed into the same views
    expect(page.locator("#replay-body")).to_be_visible()  # (the refresh opened the newest)
    table.get_by_text("browser/first", exact=True).click()
    # its status and steps said once, by its header (the line saying that it is being read goes once it is drawn)
    expect(page.locator("#replay-header")).to_contain_text("browser/first")
    expect(page.locator("#run-message")).to_have_text("")
    # read-only, and it looks it: a hand over a row (a click opens it), no text cursor or edit ring on a cell
    clicked = table.locator(".body-cell.cell-selected")  # (Gradio's editor look: an outline, a ring on its text)
    assert clicked.evaluate("e => getComputedStyle(e).outlineStyle") == "none"
    assert clicked.locator(".cell-wrap > span").evaluate("e => getComputedStyle(e).boxShadow") == "none"
    assert not clicked.locator(".selection-button, .cell-menu-button").filter(visible=True).count()
    assert table.get_by_text("browser/first", exact=True).evaluate("e => getComputedStyle(e).cursor") == "pointer"
    page.keyboard.type("x")
    expect(table).not_to_contain_text("browser/firstx")
    expect(page.locator("#replay-header")).to_contain_text("browser/first")
    expect(page.locator("#replay-header")).to_contain_text("step 12 of 12")
    metrics = load_run(runs_root / "browser" / "first").metrics()
    drawn = lines(traces(page, "replay-metrics", lambda t: any(x["x"] and len(x["x"]) == 12 for x in t)))
    np.testing.assert_allclose(drawn["loss"]["y"], metrics.loss, rtol=1e-5)
    [heat] = traces(page, "replay-heatmap")
    assert heat["y"] == LAYERS and heat["x"] == list(range(1, 13))
    expect(page.locator("#replay-dist-note")).to_contain_text("Tick histograms")
    _screenshot(page, "runs_replay.png")

    # compare two runs: a line per run in each metric's panel, and at one call site
    choose(page, "compare-runs", "browser/first", "browser/second")
    expect(page.locator("#compare-message")).to_contain_text("Comparing `browser/first`, `browser/second`"
                                                             .replace("`", ""))
    drawn = traces(page, "compare-metrics", lambda t: len(t) >= 4)
    runs = {t["name"] for t in drawn}
    assert runs == {"browser/first", "browser/second"}
    assert sorted(len(t["x"]) for t in drawn) == [12, 12, 20, 20]  # two metrics, two runs
    choose(page, "compare-site", "layers.1")
    drawn = lines(traces(page, "compare-site-plot", lambda t: t and "layers.1" in t[0]["title"]))
    second = load_run(runs_root / "browser" / "second").to_pandas()
    np.testing.assert_allclose(drawn["browser/second"]["y"],
                               stored_series(second, "grad_output", "layers.1", "norm")[1], rtol=1e-5)
    page.locator("#compare").scroll_into_view_if_needed()
    _screenshot(page, "runs_compare.png", full_page=False)
    # listing again (here a sub-directory) keeps the open run open, not the newest, and the comparison drawn
    page.locator("#runs-sub textarea, #runs-sub input").first.fill("browser")
    page.locator("#runs-refresh").click()
    # (other tests of the module store runs under the same root: no count)
    expect(page.locator("#runs-message")).to_contain_text(f" run(s) under {runs_root.resolve() / 'browser'}.")
    expect(page.locator("#replay-header")).to_contain_text("browser/first")
    expect(page.locator("#run-message")).to_have_text("")
    expect(page.locator("#compare-message")).to_contain_text("Comparing browser/first, browser/second")

    # export the open run to CSV and download it
    page.locator("#export-format").get_by_label("CSV").check()
    page.locator("#export-button").click()
    expect(page.locator("#export-message")).to_contain_text("Exported `browser/first` to CSV".replace("`", ""))
    link = page.locator("#export-files a[download='browser__first-rows.csv']")
    with page.expect_download() as download:
        link.click()
    saved = tmp_path / "rows.csv"
    download.value.save_as(saved)
    assert len(pd.read_csv(saved)) == len(load_run(runs_root / "browser" / "first").to_pandas())
    # only sub-directories of the root are listed, and a bad one is a message, not "Error"
    page.locator("#runs-sub textarea, #runs-sub input").first.fill("/etc")
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-message")).to_contain_text("sub-directory '/etc' is an absolute path")
    assert "Error" not in page.locator(".toast-body").all_inner_texts()
    # a listing without the compared runs unpicks them, and the comparison asks for runs
    page.locator("#runs-sub textarea, #runs-sub input").first.fill("nosuch")
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-message")).to_contain_text("No sub-directory 'nosuch' under the runs root")
    expect(page.locator("#compare-message")).to_contain_text("Pick two or more runs to compare.")
    expect(page.locator("#compare-metrics")).to_be_hidden()
    assert "Error" not in page.locator(".toast-body").all_inner_texts()


def test_a_run_outlives_a_reload_and_the_reloaded_page_attaches_to_it_and_stops_it(page, runs_root, browser,
                                                                                      served_app):
    other = browser.new_page(viewport={"width": 1400, "height": 1000})  # (open before the run, attached to none)
    other.goto(served_app)
    other.wait_for_selector("#model-list")
    other.get_by_role("tab", name="Experiments").click()
    start(page, "activation_mlp", 100000, store="reloaded")
    status = page.locator("#run-status")
    status.get_by_text(re.compile(r"running.*step")).wait_for(timeout=120_000)
    run_id = re.search(r"(r\d+) activation_mlp", status.inner_text())[1]
    # the other page lists it by itself (no Refresh), and follows its steps
    expect(other.locator("#live-runs")).to_contain_text("running")
    expect(other.locator("#live-runs")).to_contain_text("reloaded")
    other.close()

    page.reload()
    page.wait_for_selector("#model-list")
    page.get_by_role("tab", name="Experiments").click()
    # the new page lists the run in progress, with its id, and is attached to it again by itself (the
    # browser remembers the run its page held), its form folded away: the page is for the run
    runs = page.locator("#live-runs")
    # (the page's load reads every stored run while a run keeps the server busy)
    expect(runs).to_contain_text("running")
    expect(runs).to_contain_text("reloaded")
    expect(status).to_contain_text(re.compile(rf"{run_id} activation_mlp, seed 0, .*running.*step \d+ of 100000"))
    expect(page.locator("#experiment-list")).to_be_hidden()
    expect(page.locator("#run-stop")).to_be_enabled()
    page.locator("#live-detach").click()  # let go: the page holds no run, the run goes on
    expect(status).to_contain_text("No run on this page")
    page.reload()  # (and a reload after that attaches to none)
    page.wait_for_selector("#model-list")
    page.get_by_role("tab", name="Experiments").click()
    expect(runs).to_contain_text("running")
    expect(status).to_contain_text("No run on this page")
    # (nothing to pause, resume, stop or intervene on: greyed out)
    page.locator("#intervene").get_by_text("Intervene on this run").click()  # (folded at first)
    for button in ("run-pause", "run-resume", "run-stop", "iv-apply", "iv-remove"):
        expect(page.locator(f"#{button}")).to_be_disabled()
    expect(page.locator("#continue-row")).to_be_hidden()
    page.locator("#live-pick input").click()
    page.get_by_role("option", name=re.compile(rf"^{run_id} activation_mlp, seed 0, .* \(running\)$")).click()
    page.locator("#live-attach").click()
    expect(status).to_contain_text(re.compile(rf"{run_id} activation_mlp, seed 0, .*running.*step \d+ of 100000"))
    traces(page, "live-heatmap", lambda t: t and t[0].get("y") == LAYERS)  # its live views, drawn
    # following the run, the page keeps its size: Gradio drops each redraw's old plots with Plotly's resize
    # listener on them, and a page kept them all (about 1,000 DOM nodes a redraw of its four) until it let
    # go of them (what the last redraws dropped may be held a while: a few thousand nodes on a loaded machine)
    nodes = _dom_nodes(page)
    before = nodes()
    # (the views are redrawn as each delivery of steps comes in: 16 redraws, and 6 more, as a plot dropped while
    # it was first drawn is let go 5 s later, at a redraw a second; then counted until the count is down, while
    # the run goes on and the page keeps redrawing: a page that kept its plots grows by about 1,000 a redraw)
    _wait_for_steps_shown(status, 16 + 6)
    after = _wait_for_nodes(nodes, lambda count: count - before < 5000)
    assert after - before < 5000, (before, after)
    expect(page.locator("#run-resume")).to_be_disabled()
    expect(page.locator("#iv-apply")).to_be_enabled()
    expect(page.locator("#iv-remove")).to_be_disabled()  # (no intervention on)
    page.locator("#run-pause").click()  # held between steps, then on again
    expect(status).to_contain_text(re.compile(r"paused.*step \d+ of 100000"))
    expect(runs).to_contain_text("paused")
    expect(page.locator("#run-pause")).to_be_disabled()
    page.locator("#run-resume").click()
    expect(status).to_contain_text(re.compile(r"running.*step \d+ of 100000"))
    page.locator("#run-stop").click()
    expect(status).to_contain_text(re.compile(r"stopped.*step \d+ of 100000"))
    expect(runs).to_contain_text("stopped")
    for button in ("run-pause", "run-resume", "run-stop", "iv-apply"):  # (it ended: nothing to do ...)
        expect(page.locator(f"#{button}")).to_be_disabled()
    assert load_run(runs_root / "reloaded").status == "stopped"
    expect(page.locator("#live-findings-note")).to_contain_text("Diagnoses")
    # ... but to continue it: a new run, numbered on from the stopped one's last step, attached to the page
    last = int(re.search(r"step (\d+) of", status.inner_text())[1])
    expect(page.locator("#continue-row")).to_be_visible()
    page.locator("#continue-steps input").fill("3")
    page.locator("#run-continue").click()
    expect(status).to_contain_text(re.compile(rf"finished.*step {last + 3} of {last + 3}"), timeout=120_000)
    expect(page.locator("#live-message")).to_contain_text(f"continuing {run_id} activation_mlp")
    assert load_run(runs_root / f"reloaded-from-{last + 1}").steps == [last + 1, last + 2, last + 3]
    continued = re.search(r"(r\d+) activation_mlp", status.inner_text())[1]
    page.reload()  # (the page is the continued run's now: a reload attaches to it)
    page.wait_for_selector("#model-list")
    page.get_by_role("tab", name="Experiments").click()
    expect(status).to_contain_text(re.compile(rf"{continued} activation_mlp.*finished"))
    page.locator("#live-detach").click()  # the page holds no run: the run's findings go with it
    expect(status).to_contain_text("No run on this page")
    expect(page.locator("#live-findings-note")).not_to_contain_text("Diagnoses")


def _wait_for_steps_shown(status, count, timeout=2 * PATIENCE):
    """Wait until the run header ``status`` (a locator) has shown ``count`` different steps."""
    deadline = time.monotonic() + timeout
    seen = set()
    while len(seen) < count:
        seen.add(re.search(r"step (\d+) of", status.inner_text())[1])
        assert time.monotonic() < deadline, f"the header showed steps {sorted(seen, key=int)}, not {count} of them"
        time.sleep(0.25)


def _wait_for_nodes(nodes, until, timeout=PATIENCE) -> int:
    """The page's count of DOM nodes (``nodes``, of :func:`_dom_nodes`) once ``until(count)`` holds, or the
    last count when ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        count = nodes()
        if until(count) or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


def _dom_nodes(page):
    """A function counting the page's DOM nodes, in the document or not, after a garbage collection."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def count() -> int:
        cdp.send("HeapProfiler.collectGarbage")
        return int({m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}["Nodes"])
    return count


def test_train_ilql_live_and_see_rewards_next_to_the_behaviour_policy(page):
    start(page, "ilql", 10, modules="v.*, q.*", eval_every="5", eval_prompts="16", dataset_size="64", batch_size="8")
    page.locator("#run-status").get_by_text("finished").wait_for(timeout=120_000)
    drawn = lines(traces(page, "live-metrics", lambda t: "policy_reward" in lines(t)))
    assert {"policy_reward", "behaviour_reward", "q_loss"} <= set(drawn)
    assert drawn["policy_reward"]["x"] == [5, 10]
    _screenshot(page, "experiments_ilql.png")


def test_the_initial_weights_box_reads_whole_at_1400_by_1000(page):
    # its label on one line above the upload prompt, and the prompt inside the box (it clips)
    page.get_by_role("tab", name="Experiments").click()
    box = page.locator("#run-weights")
    box.scroll_into_view_if_needed()
    expect(box).to_contain_text("Click to Upload")
    label = box.locator("[data-testid=block-label]").bounding_box()
    # (the prompt's element is taller than the box and centred in it: measure its content)
    prompt = box.locator("[data-testid=upload-text]").evaluate(
        "el => { const range = document.createRange(); range.selectNodeContents(el);"
        " const r = range.getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; }")
    outer = box.bounding_box()
    line = box.locator("[data-testid=block-label]").evaluate("el => parseFloat(getComputedStyle(el).lineHeight)")
    assert label["height"] < 2 * line, label  # one line
    assert label["y"] + label["height"] <= prompt["y"], (label, prompt)
    assert prompt["y"] + prompt["height"] <= outer["y"] + outer["height"], (prompt, outer)
    _screenshot(page, "experiments_weights_box.png", full_page=False)


def test_in_an_800_px_window_the_run_page_goes_under_the_form_at_full_width(page):
    page.get_by_role("tab", name="Experiments").click()
    form, header = page.locator("#run-config"), page.locator("#run-status")
    expect(form).to_be_visible()
    wide_form, wide_header = form.bounding_box(), header.bounding_box()
    assert wide_header["x"] >= wide_form["x"] + wide_form["width"], (wide_form, wide_header)  # (side by side)
    # at 1400 px the picker of a run and its buttons side by side, the picker wide enough for a run's name
    from workbench.ui.run_tabs import PICK_LEAST

    picker, attach = page.locator("#live-pick").bounding_box(), page.locator("#live-attach").bounding_box()
    assert attach["x"] >= picker["x"] + picker["width"] and attach["y"] < picker["y"] + picker["height"]
    assert picker["width"] >= PICK_LEAST, picker
    # and the form's "record every Nth step" (its label on two lines) has its box on a line with the device's
    every = page.locator("#run-every input").bounding_box()
    device = page.locator("#run-device .container > .wrap").bounding_box()
    assert abs((every["y"] + every["height"]) - (device["y"] + device["height"])) <= 2, (every, device)
    page.set_viewport_size({"width": 800, "height": 900})
    page.wait_for_function("() => document.querySelector('#run-status').getBoundingClientRect().width > 600")
    narrow_form, narrow_header = form.bounding_box(), header.bounding_box()
    # (the form, folded or open, above; the run page under it as wide as the window allows, not ~390 px
    # beside a 300 px form, its metric names and plots squeezed)
    assert narrow_header["y"] >= narrow_form["y"] + narrow_form["height"], (narrow_form, narrow_header)
    assert abs(narrow_header["width"] - narrow_form["width"]) < 2, (narrow_form, narrow_header)
    # the run's buttons on one row (Refresh had wrapped alone, a full-width bar under the others), under the picker
    # of a run, which has the page's width (beside them it was some 70 px wide, a run's name unreadable)
    buttons = [page.locator(f"#{b}").bounding_box() for b in ("live-attach", "live-detach", "live-refresh")]
    assert len({round(box["y"]) for box in buttons}) == 1, buttons
    picker = page.locator("#live-pick").bounding_box()
    assert buttons[0]["y"] >= picker["y"] + picker["height"], (picker, buttons)
    assert abs(picker["width"] - narrow_header["width"]) <= 2, (picker, narrow_header)  # (less its border)
    # the Runs tab's comparison: each log y box's label whole (squeezed by the pickers, it was clipped)
    page.get_by_role("tab", name="Runs").click()
    for box in ("compare-log", "compare-log-metrics"):
        label = page.locator(f"#{box} label")
        expect(label).to_be_visible()
        assert label.evaluate("el => el.scrollWidth <= el.clientWidth && el.getBoundingClientRect().width >= 60"), box
    # and its picker of runs room for two runs' chips side by side (at some 170 px each chip took a line of its own)
    from workbench.ui.run_tabs import COMPARE_RUNS_LEAST

    assert page.locator("#compare-runs").bounding_box()["width"] >= COMPARE_RUNS_LEAST


def test_compare_runs_draws_no_empty_plots_before_runs_are_picked(page):
    page.get_by_role("tab", name="Runs").click()
    expect(page.locator("#compare-message")).to_contain_text("Pick two or more runs to compare")
    expect(page.locator("#compare-metrics")).to_be_hidden()
    expect(page.locator("#compare-site-plot")).to_be_hidden()
    expect(page.locator("#replay-body")).to_be_hidden()  # nor the views of a run before one is opened


def _smoothed_second_point(page, elem_id, weight):
    """Whether the smoothed loss of the run page's metrics is drawn with ``weight``: its second point is
    TensorBoard's debiased average (weight * raw[0] + raw[1]) / (1 + weight)."""
    def drawn_so(found):
        raw, smoothed = lines(found).get("loss"), lines(found).get("loss (smoothed)")
        return (raw is not None and smoothed is not None and len(raw["y"]) > 1
                and np.isclose(smoothed["y"][1], (weight * raw["y"][0] + raw["y"][1]) / (1 + weight), rtol=1e-4))
    return traces(page, elem_id, drawn_so)


def test_a_smoothing_typed_into_its_box_is_drawn_and_one_out_of_range_is_drawn_as_put_back(page):
    start(page, "activation_mlp", 12, width="8")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    box = page.locator("#live-smoothing input[type=number]")
    # typed and entered (no slider moved, no click elsewhere): the page draws it
    box.fill("0.5")
    box.press("Enter")
    _smoothed_second_point(page, "live-metrics", 0.5)
    # beyond the slider's range: put back to its end as the box is left, and drawn as the box then reads
    box.fill("5")
    box.press("Tab")
    expect(box).to_have_value("0.99")
    _smoothed_second_point(page, "live-metrics", 0.99)
    # and off again
    box.fill("0")
    box.press("Enter")
    traces(page, "live-metrics", lambda t: "loss" in lines(t) and "loss (smoothed)" not in lines(t))


def test_a_refused_start_pops_up_its_message_whole(page):
    # (the pop-up shows the message without Markdown's bold: 2**53 in it is no bold, and stays)
    start(page, "activation_mlp", 5, seed=9007199254740992)
    expect(page.locator("#start-message")).to_contain_text("seed must lie in [0, 9007199254740991]")
    expect(page.locator(".toast-body").filter(has_text="seed must lie in")).to_contain_text(
        "Could not start: seed must lie in [0, 9007199254740991], got 9007199254740992: "
        "2**53 - 1 = 9007199254740991 is the largest whole number a browser number field carries exactly")


def test_the_served_app_tells_screen_readers_complete_not_a_missing_text(browser, tmp_path):
    # (the app as `python app.py` serves it: workbench.ui.app.launch)
    from tests.ui.conftest import _free_port
    from workbench.ui.app import launch

    port = _free_port()
    app = launch(port=port, runs_root=tmp_path / "runs", prevent_thread_lock=True, quiet=True)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#model-list")
        # what the page announces after each event (its screen-reader-only text), as it comes
        page.evaluate("""() => { window.announced = [];
            new MutationObserver(() => document.querySelectorAll('.wrap > .sr-only').forEach(
                el => el.textContent.trim() && window.announced.push(el.textContent.trim())))
            .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
        page.locator("#build-button").click()
        page.wait_for_function("() => window.announced.some(text => text !== 'Loading')")
        announced = page.evaluate("window.announced")
        assert "Complete" in announced and not any(text.startswith("common.") for text in announced), announced
    finally:
        page.close()
        app.close()
        app.run_manager.close()


def test_enter_in_the_sub_directory_box_lists_its_runs(page, runs_root):
    start(page, "activation_mlp", 3, store="entered/one", width="4")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    page.get_by_role("tab", name="Runs").click()
    box = page.locator("#runs-sub textarea, #runs-sub input").first
    box.fill("entered")
    box.press("Enter")
    expect(page.locator("#runs-message")).to_contain_text(f"1 run(s) under {(runs_root / 'entered').resolve()}")
    box.fill("nowhere")
    box.press("Enter")
    expect(page.locator("#runs-message")).to_contain_text("No sub-directory 'nowhere'")


def test_a_stored_run_still_being_recorded_says_when_it_was_read(page):
    # (a slow one: the few steps it has stored when the page opens it read at once)
    start(page, "efficientzero_dynamics", 100_000, store="recording/now", batch_size="8", lstm_hidden_size="16",
          unroll_steps="2", support_size="5")
    expect(page.locator("#run-status")).to_contain_text("running", timeout=120_000)
    # (each reading of the run reads every step it stored by then, in the process that trains it: on a loaded
    # machine one can take longer than a page's assertion waits, so those wait up to two minutes; and one
    # reading at a time: List runs, clicked before the row, opened the newest run, this one, alongside the
    # row's and on a larger store, while showing the tab lists it already)
    reading = 2 * PATIENCE_MS
    header = page.locator("#replay-header")
    try:
        page.get_by_role("tab", name="Runs").click()
        expect(page.locator("#runs-table")).to_contain_text("recording/now", timeout=reading)
        page.locator("#runs-table").get_by_text("recording/now", exact=True).filter(visible=True).first.click()
        expect(header).to_contain_text("recording/now", timeout=reading)
        expect(header).to_contain_text(re.compile(r"Read at \d\d:\d\d:\d\d while still being recorded"),
                                       timeout=reading)
    finally:
        page.get_by_role("tab", name="Experiments").click()
        page.locator("#run-stop").click()
        expect(page.locator("#run-status")).to_contain_text("stopped", timeout=reading)
    # stopped: read again, it says so, and no note of a reading under way
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()
    expect(header).to_contain_text("stopped", timeout=reading)
    expect(header).not_to_contain_text("still being recorded")


def _last_step(page, elem_id):
    """The last step the figure in ``#elem_id`` draws (its first trace's last x; None: none yet)."""
    found = traces(page, elem_id, lambda t: True)
    return found[0]["x"][-1] if found and found[0]["x"] else None


def test_a_page_shows_views_once_it_holds_a_run_and_a_tick_redraws_only_those_in_view(page):
    page.get_by_role("tab", name="Experiments").click()
    # no run yet: no empty plots, pickers and tables, the header says what to do
    expect(page.locator("#run-status")).to_contain_text("No run on this page")
    expect(page.locator("#live-body")).to_be_hidden()
    start(page, "activation_mlp", 100000, width="8")
    expect(page.locator("#live-body")).to_be_visible()
    page.locator("#run-status").get_by_text(re.compile(r"running.*step")).wait_for(timeout=120_000)
    page.evaluate("window.scrollTo(0, 0)")
    # the heatmap, far below, is left as it was drawn while the metrics in view follow the run
    # (the last step a figure draws: of its line, not of the envelope of a long run's thinned part before it)
    def last(found):
        return max((trace["x"][-1] for trace in found if trace.get("x")), default=None)

    metrics = last(traces(page, "live-metrics", last))
    heat = _last_step(page, "live-heatmap")  # (drawn when the run started: at its first step, or none yet)
    for _ in range(2):  # (two ticks drawing new steps)
        metrics = last(traces(page, "live-metrics", lambda t, seen=metrics: (last(t) or 0) > seen))
    assert _last_step(page, "live-heatmap") == heat
    # scrolled to, it is drawn at the run's steps by the next ticks
    page.locator("#live-heatmap").scroll_into_view_if_needed()
    traces(page, "live-heatmap", lambda t: t and t[0]["x"] and (heat is None or t[0]["x"][-1] > heat))
    page.locator("#run-pause").scroll_into_view_if_needed()
    page.locator("#run-stop").click()
    expect(page.locator("#run-status")).to_contain_text("stopped")
    page.locator("#live-detach").click()  # (a page holding no run hides its views again)
    expect(page.locator("#live-body")).to_be_hidden()


def test_the_list_of_runs_to_attach_to_names_each_run_on_a_line_in_a_narrow_window(browser, served_app):
    # (the picker's box is narrow beside the six buttons at 800 px: its list, opened, was as narrow, each run's
    # name over six lines, on top of the page's header)
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        page.goto(served_app)
        page.wait_for_selector("#model-list")
        start(page, "activation_mlp", 2, width="4")
        expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
        listbox = _listbox(page, "live-pick")
        # (the lines of each option's name: its text's, the tick of the one picked left out)
        laid_out = listbox.evaluate("""list => [...list.querySelectorAll('li')].map(li => {
            const walk = document.createTreeWalker(li, NodeFilter.SHOW_TEXT), tops = new Set();
            for (let node = walk.nextNode(); node; node = walk.nextNode()) {
                if (!node.textContent.trim() || node.textContent.trim() === '✓') continue;
                const range = document.createRange(); range.selectNodeContents(node);
                [...range.getClientRects()].forEach(r => tops.add(Math.round(r.top)));
            }
            return [li.innerText.trim(), tops.size, li.getBoundingClientRect().right]; })""")
        assert laid_out and all(lines == 1 and right <= 800 for _, lines, right in laid_out), laid_out
    finally:
        page.close()


def _store_runs(runs_root, *names, steps=2, experiment="activation_mlp"):
    """Runs of ``experiment`` recorded under the served app's root (as a run of the app records them)."""
    from workbench.ui import live_run
    from workbench.ui.runs import RunManager

    manager = RunManager(runs_root)
    try:
        for name in names:
            run, message = live_run.start_run(manager, experiment, {}, 0, steps, 1, False, "*", name)
            assert run is not None, message
            run.join(60)
            assert run.outcome == "finished", run.error
    finally:
        manager.close()


def _show_stored_run(page, served_app, run):
    """The served app's Runs tab, listing the runs of its root again, showing ``run``."""
    page.goto(served_app)
    page.wait_for_selector("#model-list")
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()
    choose(page, "run-path", run)


LONG_RUNS = ["narrow/a-long-run-name-that-a-narrow-picker-cuts-short-even-where-it-has-a-line-of-its-own-0001",
             "narrow/a-long-run-name-that-a-narrow-picker-cuts-short-even-where-it-has-a-line-of-its-own-0002"]


def test_long_run_names_end_in_an_ellipsis_in_the_pickers_and_the_compare_chips_at_800_px(browser, served_app,
                                                                                          runs_root):
    # (a long name ran under the picker's arrow, and each chip of the Compare multiselect wrapped its run's name
    # mid-word over six lines)
    _store_runs(runs_root, *LONG_RUNS)
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        _show_stored_run(page, served_app, LONG_RUNS[0])
        box = page.locator("#run-path input").evaluate("""box => {
            const style = getComputedStyle(box), arrow = box.parentElement.querySelector('.icon-wrap');
            return {overflow: style.textOverflow, cut: box.scrollWidth > box.clientWidth,
                    text_right: box.getBoundingClientRect().right - parseFloat(style.paddingRight),
                    arrow_left: arrow.getBoundingClientRect().left};
        }""")
        assert box["overflow"] == "ellipsis" and box["cut"], box
        assert box["text_right"] <= box["arrow_left"] + 1, box  # (the text ends before the arrow)
        choose(page, "compare-runs", *LONG_RUNS)
        chips = page.locator("#compare-runs .token > span")
        expect(chips).to_have_count(2)
        laid_out = chips.evaluate_all("""spans => spans.map(span => {
            const style = getComputedStyle(span), box = span.closest('.wrap').getBoundingClientRect();
            return {lines: Math.round(span.getBoundingClientRect().height / parseFloat(style.lineHeight)),
                    overflow: style.textOverflow, cut: span.scrollWidth > span.clientWidth,
                    inside: span.closest('.token').getBoundingClientRect().right <= box.right + 1};
        })""")
        assert laid_out == [{"lines": 1, "overflow": "ellipsis", "cut": True, "inside": True}] * 2, laid_out
        # the whole name is each chip's title (tooltip), and the box's
        for chip, name in zip(chips.all(), LONG_RUNS):
            chip.hover()
            expect(chip).to_have_attribute("title", name)
        page.locator("#run-path input").hover()
        expect(page.locator("#run-path input")).to_have_attribute("title", LONG_RUNS[0])
        page.locator("#compare").scroll_into_view_if_needed()
        _screenshot(page, "runs_long_names_800.png", full_page=False)
    finally:
        page.close()


def test_the_last_step_table_fits_the_run_page_at_1400_and_800_px(page):
    # (its eleven columns, numbers of six decimals, scrolled sideways on the run page of a 1400 px window)
    start(page, "efficientzero_dynamics", 3)
    table = page.locator("#live-latest")
    expect(table).to_contain_text("resblocks.0.conv1.0#0", timeout=120_000)
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    header = [h.replace("⋮", "").strip() for h in table.locator("th").all_inner_texts()]
    assert header == ["site", "step", "mean", "std", "min", "max", "abs_mean", "norm", "zero_frac"]
    # no sideways scroll, and no header, site or number breaks mid-word (a site breaks after a dot or before its '#')
    assert_whole_at_widths(page, table, (1400, 800),
                           look=lambda width: _screenshot(page, f"live_latest_{width}.png", full_page=False))
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_the_runs_in_this_app_fit_an_800_px_window_without_a_sideways_scroll(browser, served_app):
    # (the table of the app's runs scrolled sideways at 800 px, the run name each records to out of sight)
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        page.goto(served_app)
        page.wait_for_selector("#model-list")
        start(page, "activation_mlp", 2, store="narrow/recorded-by-the-app-under-a-long-name")
        table = page.locator("#live-runs")
        expect(table).to_contain_text("narrow/recorded-by-the-app-under-a-long-name")
        table.scroll_into_view_if_needed()
        assert table.locator(".virtual-table-viewport").evaluate("el => el.scrollWidth <= el.clientWidth")
        assert table.evaluate(BROKEN_WORDS) == []
        _screenshot(page, "live_runs_800.png", full_page=False)
    finally:
        page.close()


def test_the_runs_table_fits_an_800_px_window_without_a_sideways_scroll(browser, served_app, runs_root):
    # (its eight columns, the start time written whole, scrolled sideways in an 800 px window: the experiment,
    # model, seed and size out of sight)
    # (and a model named in a watch's metadata by its registry name: it broke mid-word, "efficien" "tzero_dy" ...)
    import torch

    import workbench

    _store_runs(runs_root, "narrow/dynamics", experiment="efficientzero_dynamics")
    _store_runs(runs_root, "narrow/a-run-name-long-enough-to-take-lines")
    net = torch.nn.Linear(2, 2)
    atari = {"model": "efficientzero_dynamics_atari"}
    with workbench.watch(net, store=runs_root / "narrow/watched", metadata=atari) as w:
        net(torch.ones(1, 2)).sum().backward()
        w.step()
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        _show_stored_run(page, served_app, "narrow/dynamics")
        table = page.locator("#runs-table")
        expect(table).to_contain_text("efficientzero_dynamics")
        expect(table).to_contain_text("efficientzero_dynamics_atari")
        assert table.locator(".virtual-table-viewport").evaluate("el => el.scrollWidth <= el.clientWidth")
        # every header and cell holds its text (a name breaks between its parts, no word mid-word)
        overflowing = table.evaluate("""table => [
            ...table.querySelectorAll('th .cell-wrap, [role=gridcell] .cell-wrap')]
            .filter(cell => cell.scrollWidth > cell.clientWidth).map(cell => cell.textContent.trim())""")
        assert overflowing == []
        assert table.evaluate(BROKEN_WORDS) == []
        # the start time is short there ('11-29 12:07', UTC), and whole in the run's header
        cells = table.locator("[role=row]").filter(has_text="narrow/dynamics").locator("[role=gridcell]")
        assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", cells.nth(3).inner_text().strip()), cells.nth(3).inner_text()
        expect(page.locator("#replay-header")).to_contain_text(
            re.compile(r"started: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"))
        table.scroll_into_view_if_needed()
        _screenshot(page, "runs_table_800.png", full_page=False)
    finally:
        page.close()


#: The words of each cell of a table (its header's too) that the page broke over two lines: [(text, word)].
#: (A word: what lies between spaces; a range of steps may break after its dash, "120–" "200".)
BROKEN_WORDS = """table => {
    const broken = [];
    for (const cell of table.querySelectorAll('th span.header, [role=gridcell] .cell-wrap > span')) {
        const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walk.nextNode(); node; node = walk.nextNode()) {
            for (const word of node.textContent.matchAll(/[^\\s–]+–?/g)) {
                const range = document.createRange();
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
                if (tops.size > 1) broken.push([cell.textContent.trim().slice(0, 40), word[0]]);
            }
        }
    }
    return broken;
}"""


def assert_whole_at_widths(page, table, widths, look=None):
    """For each window width in turn: wait until ``table`` has no sideways scroll, assert that no word in it breaks
    mid-word (:data:`BROKEN_WORDS`), then ``look(width)`` where given (a screenshot)."""
    viewport = table.locator(".virtual-table-viewport")
    for width in widths:
        page.set_viewport_size({"width": width, "height": 1000})
        table.scroll_into_view_if_needed()
        page.wait_for_function("el => el.scrollWidth <= el.clientWidth", arg=viewport.element_handle())
        assert table.evaluate(BROKEN_WORDS) == [], width
        if look is not None:
            look(width)


def test_the_findings_table_breaks_no_word_and_gives_the_evidence_room_at_800_px(browser, served_app, runs_root,
                                                                                 nan_at_step_3):
    # (its columns at 11% and 8% broke their headers "severit|y" and "step|s" in an 800 px window; and with four
    # columns of a word each the evidence had 28% of the width: a nan_origin's evidence ran some twenty words of
    # one or two a line, its row taller than the list)
    from workbench.diagnose import FINDINGS
    from workbench.ui.run_tabs import FINDINGS_HEIGHT

    _store_runs(runs_root, "narrow/nan-findings", steps=6)
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        _show_stored_run(page, served_app, "narrow/nan-findings")
        table = page.locator("#replay-findings")
        expect(table).to_contain_text("nan_origin")
        assert table.evaluate(BROKEN_WORDS) == []
        # the first column holds on a line each of its lines at their longest - a severity with steps of three
        # digits, each finding's name (workbench.diagnose.FINDINGS), a parameter's site - and the evidence some
        # 50 characters
        longest = {0: ["⚠ warning · steps 120–200", "layers.0.weight", *FINDINGS], 1: ["x" * 50]}
        too_narrow = table.evaluate("""(table, longest) => {
            const cells = [...table.querySelectorAll('[role=row]')].at(-1).querySelectorAll('[role=gridcell]');
            return Object.entries(longest).flatMap(([column, words]) => {
                const text = cells[column].querySelector('.cell-wrap > span'), style = getComputedStyle(text);
                const room = text.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
                return words.filter(word => {
                    const probe = document.createElement('b');
                    probe.style.whiteSpace = 'nowrap';
                    probe.textContent = word;
                    text.appendChild(probe);
                    const wide = probe.getBoundingClientRect().width;
                    probe.remove();
                    return wide > room;
                });
            });
        }""", {str(k): v for k, v in longest.items()})
        assert too_narrow == [], too_narrow
        # and the nan_origin's row, its evidence the longest, stays well within the list's height
        row = table.locator("[role=row]").filter(has_text="nan_origin").first
        assert row.evaluate("row => row.getBoundingClientRect().height") < FINDINGS_HEIGHT * 0.8
        table.scroll_into_view_if_needed()
        _screenshot(page, "runs_findings_800.png", full_page=False)
    finally:
        page.close()


def test_a_long_site_name_in_the_findings_table_breaks_after_a_dot_not_mid_word_at_800_px(browser, served_app,
                                                                                          runs_root):
    # (at 800 px "model.wte.weight" broke as "model.wte.weigh" "t", a longer name wherever it reached the edge)
    import torch

    import workbench

    site = "encoder_block.attention_projection"
    net = torch.nn.Module()
    net.encoder_block = torch.nn.Module()
    net.encoder_block.attention_projection = torch.nn.Linear(4, 4)
    with workbench.watch(net, store=runs_root / "narrow/long-sites") as w:
        for step in range(4):
            if step == 2:
                with torch.no_grad():
                    net.encoder_block.attention_projection.weight[0, 0] = float("nan")
            net.encoder_block.attention_projection(torch.ones(2, 4)).sum().backward()
            w.step()
    page = browser.new_page(viewport={"width": 800, "height": 1000})
    try:
        _show_stored_run(page, served_app, "narrow/long-sites")
        table = page.locator("#replay-findings")
        expect(table).to_contain_text("nan_origin")
        assert table.evaluate(BROKEN_WORDS) == []
        # the name reads whole (the breaks are no characters): a click on it moves the views to that site, and the
        # name stays where it was in its cell (Gradio's editor put the cell clicked at its top, further in)
        name = table.locator("[role=gridcell]").get_by_text(site, exact=True).first
        place = """el => { const cell = el.closest('[role=gridcell]').getBoundingClientRect();
                            const box = el.getBoundingClientRect();
                            return [Math.round(box.left - cell.left), Math.round(box.top - cell.top)]; }"""
        before = name.evaluate(place)
        name.click()
        expect(page.locator("#replay-sites")).to_contain_text(site)
        expect(table.locator(".cell-selected")).to_have_count(1)
        assert name.evaluate(place) == before
        table.scroll_into_view_if_needed()
        _screenshot(page, "runs_findings_long_site_800.png", full_page=False)
    finally:
        page.close()


def test_a_line_that_dwarfs_the_others_ticks_the_per_site_log_y_until_the_user_sets_it(page):
    """A query stream's hashes (std about 5e18) flattened its other call sites at zero unless log y was ticked."""
    start(page, "query_stream", 3, key_space="2000", batch_size="64")
    expect(page.locator("#run-status")).to_contain_text("finished", timeout=120_000)
    y_type = "(type) => document.querySelector('#live-series .js-plotly-plot')?.layout?.yaxis?.type === type"
    page.wait_for_function(y_type, arg="log")
    box = page.locator("#live-log-sites input")
    expect(box).to_be_checked()
    box.uncheck()  # the user's scale from here
    page.wait_for_function(y_type, arg="linear")
    expect(box).not_to_be_checked()
    choose(page, "live-stat", "norm")  # another statistic: the figure chooses again, and the box says so
    page.wait_for_function(y_type, arg="log")
    expect(box).to_be_checked()


def test_the_runs_table_grows_with_the_window_and_keeps_the_export_row_in_reach_at_800_px(browser, served_app,
                                                                                         runs_root):
    # (at max_height=260 an 800 px window showed two and a half runs at a time, however many were stored)
    from workbench.ui.run_tabs import RUNS_TABLE_LEAST

    _store_runs(runs_root, *(f"many/run-{i:02d}" for i in range(20)))
    page = browser.new_page(viewport={"width": 800, "height": 800})
    try:
        _show_stored_run(page, served_app, "many/run-00")
        table = page.locator("#runs-table")
        expect(table).to_contain_text("many/run-19")
        viewport = table.locator(".virtual-table-viewport")
        height = viewport.evaluate("el => el.clientHeight")
        assert height > RUNS_TABLE_LEAST + 200, height
        assert viewport.evaluate("el => el.scrollHeight > el.clientHeight")  # (more runs than fit: it scrolls)
        # scrolled to the table's label, the run picker and the Export button under it are in the window too
        page.locator("#runs-table").evaluate("el => el.scrollIntoView({block: 'start'})")
        bottom = page.locator("#export-button").evaluate("el => el.getBoundingClientRect().bottom")
        assert bottom <= 800, bottom
        # a window too short for that keeps the least height
        page.set_viewport_size({"width": 800, "height": 400})
        expect(viewport).to_have_js_property("clientHeight", RUNS_TABLE_LEAST)
        page.set_viewport_size({"width": 800, "height": 800})
        _screenshot(page, "runs_table_tall_800.png", full_page=False)
    finally:
        page.close()


def test_compare_draws_a_run_whose_line_dwarfs_the_others_on_a_log_y_until_the_user_sets_it(browser, served_app,
                                                                                             runs_root):
    """The run page's per-site figure chose a log y where a line dwarfs the others; Compare's drew the runs on a
    linear one, the smaller run's line flat at zero."""
    import torch

    import workbench

    for name, scale in (("dwarf/small", 1.0), ("dwarf/large", 1e5)):  # (the same net, inputs 1e5 times larger)
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        with workbench.watch(net, store=runs_root / name) as w:
            for _ in range(3):
                net(torch.ones(2, 4) * scale).sum().backward()
                w.step()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _show_stored_run(page, served_app, "dwarf/small")
        choose(page, "compare-runs", "dwarf/small", "dwarf/large")
        choose(page, "compare-kind", "activation")
        choose(page, "compare-site", "0")
        y_type = "(type) => document.querySelector('#compare-site-plot .js-plotly-plot')?.layout?.yaxis?.type === type"
        page.wait_for_function(y_type, arg="log")
        box = page.locator("#compare-log input")
        expect(box).to_be_checked()
        box.uncheck()  # the user's scale from here
        page.wait_for_function(y_type, arg="linear")
        expect(box).not_to_be_checked()
        choose(page, "compare-stat", "abs_mean")  # another statistic: the figure chooses again, the box says so
        page.wait_for_function(y_type, arg="log")
        expect(box).to_be_checked()
    finally:
        page.close()


def test_compare_has_a_log_y_box_a_figure_each_its_own_figures_scale(browser, served_app, runs_root):
    """The Runs tab's comparison had one log y box for its two figures, ticked while either drew log (over a linear
    call-site figure) and setting both; the notebook's Compare has one a tab. Now a box a figure, above it."""
    import torch

    import workbench

    for name in ("boxes/a", "boxes/b"):  # (a loss spike at the second step: the loss panel chooses log)
        torch.manual_seed(0)
        net = torch.nn.Linear(2, 2)
        with workbench.watch(net, store=runs_root / name) as w:
            for loss in [2.3, 300.0] + [0.5 * 0.97 ** i for i in range(10)]:
                net(torch.ones(4, 2)).sum().backward()
                w.step(loss=loss)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _show_stored_run(page, served_app, "boxes/a")
        choose(page, "compare-runs", "boxes/a", "boxes/b")
        choose(page, "compare-kind", "activation")
        y_type = ("([plot, type]) => document.querySelector(`#${plot} .js-plotly-plot`)?.layout?.yaxis?.type "
                  "=== type")
        page.wait_for_function(y_type, arg=["compare-metrics", "log"])
        page.wait_for_function(y_type, arg=["compare-site-plot", "linear"])
        metrics_box, site_box = page.locator("#compare-log-metrics input"), page.locator("#compare-log input")
        expect(metrics_box).to_be_checked()  # (the metrics' figure drew log; the call site's, linear: unticked)
        expect(site_box).not_to_be_checked()
        # each box above its figure: the metrics' over the metrics, the call site's between them
        top = {key: page.locator(f"#{key}").bounding_box()["y"]
               for key in ("compare-log-metrics", "compare-metrics", "compare-log", "compare-site-plot")}
        assert sorted(top, key=top.get) == list(top), top
        _screenshot(page, "runs_compare_boxes.png")
        site_box.check()  # the call site's figure log, the metrics as they were
        page.wait_for_function(y_type, arg=["compare-site-plot", "log"])
        expect(metrics_box).to_be_checked()
        metrics_box.uncheck()  # every metrics panel linear, the call site's figure as the user set it
        page.wait_for_function(y_type, arg=["compare-metrics", "linear"])
        expect(site_box).to_be_checked()
        assert page.evaluate(y_type, ["compare-site-plot", "log"])
    finally:
        page.close()


@pytest.mark.parametrize("width", [800, 1400])
def test_every_field_label_of_the_dynamics_networks_form_reads_whole(browser, served_app, width):
    # (a label that is one long name ran past its field's edge and was cut there: flatten_output_size_for_rew at
    # 800 px, flatten_output_size_for_reward_hea at 1400, a checkbox's last_linear_layer_init_ze)
    page = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        page.goto(served_app)
        page.wait_for_selector("#model-list")
        page.get_by_label("efficientzero_dynamics", exact=True).check()
        expect(page.locator("#model-fields")).to_contain_text("flatten_output_size_for_reward_head")
        cut = page.locator("#model-fields").evaluate("""fields => [
            ...fields.querySelectorAll('[data-testid=block-info], .checkbox-container .label-text')]
            .filter(label => {
                const box = label.closest('div.block').getBoundingClientRect(), text = document.createRange();
                text.selectNodeContents(label);
                return [...text.getClientRects()].some(line => line.right > box.right + 0.5);
            }).map(label => label.textContent.trim())""")
        assert cut == [], cut
    finally:
        page.close()


def _new_export_folders(known):
    """The folders of exports made since ``known`` (a set of them, updated)."""
    import glob

    from gradio.utils import get_upload_folder

    found = set(glob.glob(os.path.join(get_upload_folder(), "workbench-export-*")))
    new = found - known
    known |= new
    return new


def _export(page, known):
    """Export the run the page's Runs tab shows to CSV; the folder its files were written to."""
    page.locator("#export-button").click()
    expect(page.locator("#export-files a").first).to_be_visible()
    # (a page that exported before shows its last export's links until the new ones arrive: wait for the new folder,
    # then for its links)
    deadline = time.monotonic() + PATIENCE
    new = _new_export_folders(known)
    while not new and time.monotonic() < deadline:
        time.sleep(0.2)
        new = _new_export_folders(known)
    [folder] = new
    assert any(name.endswith("-rows.csv") for name in os.listdir(folder)), os.listdir(folder)
    # (the files the page offers are those in the folder, not copies Gradio made of them in its cache, which
    # outlived the folder let go of)
    while True:
        served = [unquote(link.get_attribute("href").split("file=", 1)[1])
                  for link in page.locator("#export-files a").all()]
        if (served and all(os.path.dirname(path) == folder for path in served)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert served and all(os.path.dirname(path) == folder for path in served), (served, folder)
    return folder


def _gone(path, timeout=PATIENCE):
    """Whether ``path`` is removed within ``timeout`` s (a closed page's unload reaches the server a while after)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_closed_page_takes_its_exports_files_with_it_and_another_page_keeps_its_own(browser, served_app, runs_root):
    # (each export wrote a temporary folder that stayed until the machine's temporary directory was emptied)
    _store_runs(runs_root, "holdings/exported")
    known = set()
    _new_export_folders(known)
    closing = browser.new_page(viewport={"width": 1400, "height": 1000})
    staying = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _show_stored_run(closing, served_app, "holdings/exported")
        _show_stored_run(staying, served_app, "holdings/exported")
        first = _export(closing, known)
        second = _export(closing, known)  # (the page offers the last export alone: the one before goes)
        assert _gone(first) and os.path.isdir(second)
        kept = _export(staying, known)
        closing.close()
        assert _gone(second), f"{second} outlived its page"
        assert os.path.isdir(kept)  # (the page still open keeps its files, which it offers)
    finally:
        for page in (closing, staying):
            if not page.is_closed():
                page.close()


def test_a_causes_consequences_are_listed_under_it_by_a_click_and_each_focuses_the_views(browser, served_app,
                                                                                        runs_root):
    # SGD at a learning rate of 10: the list showed the cause's row alone, "1 warning", its 13 consequences
    # nowhere to click (2026-11-29)
    from tests.diagnose.runs import diverging_mlp

    found = diverging_mlp(store=runs_root / "hot/lr10").diagnose()
    folded = int((found.cause != "").sum())
    dead_at_1 = found[(found.finding == "dead_units") & (found.site == "layers.1")].iloc[0]
    assert dead_at_1.cause == "update_ratio_high at layers.0.weight"
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    try:
        _show_stored_run(page, served_app, "hot/lr10")
        note, table = page.locator("#replay-findings-note"), page.locator("#replay-findings")
        expect(note).to_contain_text(f"1 warning, and {folded} consequences of it folded under its row")
        expect(table).to_contain_text(f"+{folded} consequences over steps 1–40 (pick to list)")
        rows = table.locator("[role=row]").filter(has_text="update_ratio_high")
        rows.first.locator("[role=gridcell]").first.click()
        expect(note).to_contain_text(f"{folded} consequences of it listed under its row")
        expect(table).to_contain_text("↳ consequence of update_ratio_high at layers.0.weight")
        expect(table).to_contain_text(f"{folded} consequences over steps 1–40 below (pick to fold)")
        # a consequence, clicked, moves the views to it as any finding (the list scrolled to it first)
        # (its finding's cell: the cause's evidence names it too)
        dead = (table.locator("[role=gridcell]").filter(has_text="↳ consequence of").filter(has_text="dead_units")
                .filter(has_text="layers.1"))
        # (scrolled a step at a time, each drawn before the next: a frame painted after the scroll, and the rows
        # of a virtual table's new place in it drawn, whatever the time a loaded machine takes)
        scroller = table.locator(".table-wrap, [role=grid]").first
        while not dead.count():
            scrolled = scroller.evaluate("""async el => {
                const top = el.scrollTop;
                el.scrollTop += 200;
                for (let i = 0; i < 2; i++) await new Promise(done => requestAnimationFrame(done));
                return el.scrollTop !== top; }""")
            if not scrolled:  # (at the end of the list: its last rows are drawn, or will be)
                break
        dead.first.click()
        expect(note).to_contain_text(f"⚠ dead_units at layers.1, step {dead_at_1.step}–{dead_at_1.last_step}")
        expect(page.locator("#replay-sites")).to_contain_text("layers.1")
        expect(table).to_contain_text("↳ consequence of")  # (still listed)
        _screenshot(page, "runs_consequences_listed.png", full_page=False)
    finally:
        page.close()
