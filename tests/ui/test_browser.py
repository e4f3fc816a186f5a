"""End to end: the real page in headless Chromium."""

import os

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def _screenshot(page, name):
    # WORKBENCH_SCREENSHOTS=dir keeps pictures of the page for a person to look at.
    folder = os.environ.get("WORKBENCH_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, name), full_page=True)


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


def test_family_filter_narrows_the_list(page):
    page.locator("#family-filter input").click()
    page.get_by_role("option", name="activation").click()
    page.wait_for_function(
        "() => !document.querySelector('#model-list').innerText.includes('mlp')"
    )
    listed = page.locator("#model-list").inner_text()
    for name in ("gelu", "prelu", "relu", "sigmoid", "tanh", "threshold"):
        assert name in listed
