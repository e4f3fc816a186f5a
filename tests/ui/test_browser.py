"""End to end: the real page in headless Chromium."""

import os
import re

import pytest
from playwright.sync_api import expect

from workbench.instrument import load_run

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


def test_run_an_experiment_and_watch_it_live_then_replay_it(page, runs_root):
    page.get_by_role("tab", name="Experiments").click()
    page.get_by_label("activation_mlp", exact=True).check()
    page.locator("#run-steps input").fill("40")
    page.locator("#run-histograms input").check()
    page.locator("#run-record").get_by_label("parameter gradients").uncheck()
    page.locator("#run-store textarea, #run-store input").first.fill("browser/run")
    page.get_by_label("width").fill("16")
    page.locator("#run-start").click()
    status = page.locator("#run-status")
    status.get_by_text("finished: step 40 of 40").wait_for(timeout=60_000)
    expect(page.locator("#start-message")).to_contain_text("this page is attached to it")
    # the plots and the table were refreshed by the timer while it ran
    expect(page.locator("#live-metrics")).to_contain_text("loss")
    expect(page.locator("#live-latest")).to_contain_text("layers.0")
    expect(page.locator("#live-latest")).to_contain_text("grad_output")
    expect(page.locator("#live-latest")).not_to_contain_text("param_grad")  # unticked in "record"
    expect(page.locator("#live-note")).to_contain_text("call sites")
    page.locator("#live-pattern textarea, #live-pattern input").first.fill("nothing.*")
    expect(page.locator("#live-note")).to_contain_text("No activation rows")
    expect(page.locator("#live-series")).not_to_contain_text("layers.0")  # no lines, no legend left over
    page.locator("#live-pattern textarea, #live-pattern input").first.fill("layers.1")
    expect(page.locator("#live-series")).to_contain_text("layers.1#0:out")  # drawn again
    expect(page.locator("#live-note")).to_have_text("1 call site")
    expect(page.locator("#live-series")).not_to_contain_text("layers.0")
    # a line more: drawn too (Gradio's plot keeps the lines it first drew unless it is cleared)
    page.locator("#live-pattern textarea, #live-pattern input").first.fill("layers.[01]")
    expect(page.locator("#live-note")).to_have_text("2 call sites")
    expect(page.locator("#live-series")).to_contain_text("layers.0#0:out")
    expect(page.locator("#live-series")).to_contain_text("layers.1#0:out")
    expect(page.locator("#live-runs")).to_contain_text("browser/run")
    _screenshot(page, "experiments_live.png")

    # a run name leading out of the runs root is refused, naming the value; the page keeps its run
    page.locator("#run-store textarea, #run-store input").first.fill("../outside")
    page.locator("#run-start").click()
    expect(page.locator("#start-message")).to_contain_text("run name '../outside' contains '..'")
    expect(status).to_contain_text("finished: step 40 of 40")
    assert not (runs_root.parent / "outside").exists()
    # a fraction of a step is refused by name, not rounded by the page
    page.locator("#run-store textarea, #run-store input").first.fill("")
    page.locator("#run-steps input").fill("2.5")
    page.locator("#run-start").click()
    expect(page.locator("#start-message")).to_contain_text("steps must be a whole number in [1, 10000000], got 2.5")

    page.get_by_role("tab", name="Runs").click()
    expect(page.locator("#runs-root-note")).to_contain_text(str(runs_root.resolve()))
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-table")).to_contain_text("browser/run")
    page.locator("#run-path input").click()
    page.get_by_role("option", name="browser/run", exact=True).click()
    expect(page.locator("#run-message")).to_contain_text("40 steps stored")
    expect(page.locator("#run-message")).to_contain_text("status: finished")
    expect(page.locator("#replay-latest")).to_contain_text("layers.0")
    _screenshot(page, "runs_replay.png")
    # only sub-directories of the root are listed, and a bad one is a message, not "Error"
    page.locator("#runs-sub textarea, #runs-sub input").first.fill("/etc")
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-message")).to_contain_text("sub-directory '/etc' is an absolute path")
    page.locator("#runs-sub textarea, #runs-sub input").first.fill("nothing-here")
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-message")).to_contain_text("No runs yet under")
    assert "Error" not in page.locator(".toast-body").all_inner_texts()


def test_a_run_outlives_a_reload_and_the_reloaded_page_attaches_to_it_and_stops_it(page, runs_root):
    page.get_by_role("tab", name="Experiments").click()
    page.get_by_label("activation_mlp", exact=True).check()
    page.locator("#run-steps input").fill("100000")
    page.locator("#run-store textarea, #run-store input").first.fill("reloaded")
    page.locator("#run-start").click()
    status = page.locator("#run-status")
    status.get_by_text("running: step").wait_for(timeout=60_000)
    run_id = re.match(r"(r\d+) activation_mlp", status.inner_text())[1]

    page.reload()
    page.wait_for_selector("#model-list")
    page.get_by_role("tab", name="Experiments").click()
    # the new page lists the run in progress, with its id, and attaches to it
    runs = page.locator("#live-runs")
    expect(runs).to_contain_text("running")
    expect(runs).to_contain_text("reloaded")
    expect(status).not_to_contain_text("running")  # not attached yet: a new page holds no run
    page.locator("#live-pick input").click()
    page.get_by_role("option", name=re.compile(rf"^{run_id} activation_mlp, seed 0, .* \(running\)$")).click()
    page.locator("#live-attach").click()
    expect(status).to_contain_text(re.compile(rf"{run_id} activation_mlp, seed 0, .* - running: step \d+ of 100000"))
    expect(page.locator("#live-latest")).to_contain_text("layers.0")  # its live views, refreshed
    _screenshot(page, "experiments_reattached.png")
    page.locator("#run-stop").click()
    expect(status).to_contain_text(re.compile(r"stopped: step \d+ of 100000"), timeout=30_000)
    expect(runs).to_contain_text("stopped")
    assert load_run(runs_root / "reloaded").status == "stopped"


def test_train_ilql_live_and_see_rewards_next_to_the_behaviour_policy(page):
    page.get_by_role("tab", name="Experiments").click()
    page.locator("#experiment-list").get_by_label("ilql", exact=True).check()
    page.wait_for_selector("#experiment-overview:has-text('ILQL')")
    for label, value in {"eval_every": "5", "eval_prompts": "16", "dataset_size": "64", "batch_size": "8"}.items():
        page.get_by_label(label, exact=True).fill(value)
    page.locator("#run-steps input").fill("10")
    page.locator("#run-modules textarea, #run-modules input").first.fill("v.*, q.*")
    page.locator("#run-start").click()
    page.locator("#run-status").get_by_text("finished: step 10 of 10").wait_for(timeout=120_000)
    expect(page.locator("#live-metrics")).to_contain_text("policy_reward")
    expect(page.locator("#live-metrics")).to_contain_text("behaviour_reward")
    expect(page.locator("#live-latest")).to_contain_text("v.0")
    _screenshot(page, "experiments_ilql.png")
