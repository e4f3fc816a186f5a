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


def test_dashboard_redraws_from_a_watch_and_from_a_stored_run(tmp_path):
    import workbench
    from workbench.ui.notebook import Dashboard

    exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
    w = exp.watch(store=tmp_path / "run")
    dash = Dashboard(exp, auto=True, interval=0.0)
    exp.run(5)
    w.recorder.flush()
    dash.pattern.value = "layers.0"  # a control change redraws
    assert "1 call site<" in dash.note.value
    assert dash.plots.outputs and dash.table.outputs
    dash.close()
    w.close()
    stored = Dashboard(workbench.load_run(tmp_path / "run"))
    stored.kind.value = "param_grad"
    stored.pattern.value = "*"
    assert "call sites" in stored.note.value
    try:
        Dashboard(workbench.experiments.create("activation_mlp"))
    except ValueError as exc:
        assert "experiment.watch()" in str(exc)
    else:
        raise AssertionError("an unwatched experiment should be refused")
