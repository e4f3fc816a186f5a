"""The ipywidgets model browser, driven as a user would (set values, click)."""

from workbench.ui.notebook import ModelBrowser


def test_filter_select_fill_and_build():
    browser = ModelBrowser()
    browser.family.value = "activation"
    assert "mlp" not in browser.models.options and "prelu" in browser.models.options
    browser.pattern.value = "prelu"
    assert browser.models.options == ("prelu",) and browser.models.value == "prelu"
    assert "Parametric ReLU" in browser.overview.value
    labels = [w.description for w in browser.form.children]
    assert labels == ["num_parameters", "init"]
    browser.form.children[0].value = 3
    browser.batch_size.value = 4
    browser.build_button.click()
    assert browser.result.ok and browser.model.weight.shape == (3,)
    assert browser.result.tree["output"].iloc[0] == "(4, 3, 5)"
    assert "Built <strong>prelu</strong>" in browser.message.value


def test_invalid_value_shows_message_and_keeps_previous_model():
    browser = ModelBrowser(pattern="mlp")
    good = browser.build()
    assert good.ok
    bad = browser.build(depth=0)
    assert not bad.ok and "must lie in [1, 32], got 0" in browser.message.value
    assert browser.model is good.model
