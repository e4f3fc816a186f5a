"""The Models tab's handlers, without a browser."""

import pytest
import torch

import workbench
from workbench.ui import model_browser as mb
from workbench.ui.forms import form_fields, parse_form


def test_filter_by_family_and_substring_or_glob():
    assert mb.filter_models("activation", "lu") == ["gelu", "prelu", "relu"]
    assert mb.filter_models("all", "*lu") == ["gelu", "prelu", "relu"]
    assert mb.filter_models("all", "") == workbench.list_models()
    assert mb.filter_models("mlp", "") == ["mlp"]
    assert mb.filter_models("activation", "zzz") == []
    assert mb.filter_models("all", "ILQL") == ["ilql"] and mb.filter_models("all", "*LU") == ["gelu", "prelu", "relu"]


def test_overview_shows_formula_and_summary():
    text = mb.model_overview("sigmoid")
    assert "### sigmoid" in text and "family **activation**" in text
    assert r"\frac{1}{1 + \exp(-x)}" in text
    assert mb.model_overview(None) == "No model matches the filter."


def test_param_table_lists_every_parameter():
    table = mb.param_table("threshold")
    assert list(table["parameter"]) == ["threshold", "value", "inplace"]
    assert list(table["default"]) == ["0.0", "0.5", "False"]
    assert mb.param_table(None).empty


def test_form_leaves_out_unformable_types_but_table_keeps_them():
    labels = [f.label for f in mb.model_form("prelu")]
    assert labels == ["num_parameters", "init"]
    assert {"device", "dtype"} <= set(mb.param_table("prelu")["parameter"])


def test_build_with_form_values_gives_tree_with_output_shapes():
    result = mb.build_model("mlp", {"width": 16.0, "depth": 3.0, "activation": "tanh"}, batch_size=5.0)
    assert result.ok and isinstance(result.model, torch.nn.Module)
    tree = result.tree
    assert list(tree.columns) == mb.TREE_COLUMNS
    assert tree["path"].iloc[0] == "" and tree["module"].iloc[0] == "(root)"
    assert tree["output"].iloc[0] == "(5, 2)"
    row = tree[tree["path"] == "layers.1"].iloc[0]
    assert row["type"] == "Tanh" and row["output"] == "(5, 16)"
    # params of the root: three hidden layers 2->16->16->16 and a read-out 16->2
    assert tree["params"].iloc[0] == (2 * 16 + 16) + 2 * (16 * 16 + 16) + (16 * 2 + 2)
    assert "width=16" in result.message and "depth=3" in result.message and "batch size 5" in result.message


#: Spaces after which a browser may break a line (Unicode's line-break classes SP and BA), and the characters
#: that forbid a break beside them (WJ, GL).
BREAKABLE_SPACES = set(" \u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2008\u2009\u200a\u205f\u3000")
NO_BREAK = set("\u2060\u00a0\u202f\u2007\ufeff")


def test_a_module_trees_indentation_cannot_wrap_away_from_the_name_it_indents():
    # (in the ILQL tree, 'resid_dropout' at depth 5 did not fit beside its indent: the cell broke after the
    # indent, the name stood alone at the cell's left edge, indented as the root's children are)
    tree = mb.build_model("ilql", {}, batch_size=2.0).tree
    deep = tree[tree["path"] == "model.h.0.attn.resid_dropout"]["module"].iloc[0]
    assert deep.endswith("resid_dropout") and len(deep) > len("resid_dropout")  # (indented)
    for cell in tree["module"]:
        breaks = [i for i, ch in enumerate(cell[:-1]) if ch in BREAKABLE_SPACES and cell[i + 1] not in NO_BREAK]
        assert not breaks, (cell, breaks)


@pytest.mark.parametrize("values, expected", [
    ({"depth": 0.0}, "'depth' must lie in [1, 32], got 0"),
    ({"depth": 2.5}, "depth expects int, could not read 2.5"),
    ({"width": None}, "width expects int: the field is empty, or holds a number beyond the floating-point range"),
    ({"width": ""}, "width expects int, could not read '': the field is empty; enter a whole number such as 2."),
    ({"width": "32", "depth": "  "}, "depth expects int, could not read '  ': the field is empty; enter a whole"),
    ({"activation": "swish"}, "'activation' must be one of"),
])
def test_invalid_form_values_become_messages(values, expected):
    result = mb.build_model("mlp", values)
    assert not result.ok
    assert result.message.startswith("**Could not build the model.**")
    assert expected in result.message
    assert result.tree.empty


def test_an_empty_number_box_is_said_to_be_empty_whatever_its_type():
    # (a float box left empty read "not a number"; an int box "empty, or holds a number beyond the floating-point
    # range (such as 1e400)", which only a number box's None can mean: the notebook's boxes are text)
    result = mb.build_model("prelu", {"init": ""})
    assert "init expects float, could not read '': the field is empty; enter a number such as 0.5." in result.message


def test_bad_batch_size_and_missing_model_are_messages():
    assert "batch size must be a positive whole number" in mb.build_model("relu", {}, batch_size=0).message
    # an empty box (or one holding text, which the browser sends as empty) is said to be empty, not "got None"
    empty = mb.build_model("relu", {}, batch_size=None).message
    assert f"example batch size is empty; give a whole number in [1, {mb.MAX_EXAMPLE_BATCH}]" in empty, empty
    assert "None" not in empty
    assert "Pick a model first" in mb.build_model(None, {}).message


def test_builder_crash_is_reported_not_raised(scratch_model):
    def boom():
        raise RuntimeError("kaboom")

    scratch_model("boom", family="user", example_inputs=lambda m, b, g=None: ((), {}))(boom)
    result = mb.build_model("boom", {})
    assert not result.ok and "RuntimeError: kaboom" in result.message


def test_failing_forward_keeps_model_and_reports(scratch_model):
    scratch_model("bad_inputs", family="user",
                  example_inputs=lambda m, b, g=None: ((torch.zeros(b, 7),), {}))(lambda: torch.nn.Linear(3, 2))
    result = mb.build_model("bad_inputs", {})
    assert result.ok and "forward pass on the example inputs failed" in result.message
    assert list(result.tree["type"]) == ["Linear"]


def test_parse_form_reads_text_lists_and_nullable_fields():
    from typing import Annotated

    from workbench.params import Range, params_of

    def builder(layers: list[int] = [32], scale: float | None = None,
                rate: Annotated[float, Range(0, 1)] = 0.5):
        """B.

        Args:
            layers: sizes.
            scale: optional scale.
            rate: a rate.
        """

    params = params_of(builder)
    fields = {f.label: f for f in form_fields(params)}
    assert fields["layers"].widget == "text" and fields["layers"].value == "32"
    assert fields["scale"].widget == "text" and fields["scale"].value == ""
    assert fields["rate"].widget == "float"
    assert parse_form(params, {"layers": "16, 8", "scale": "", "rate": 0.25}, "B") == \
        {"layers": [16, 8], "scale": None, "rate": 0.25}
    assert parse_form(params, {"scale": "2.5"}, "B") == {"scale": 2.5}
    # as Python writes a list, which the messages' examples do ("e.g. [32]")
    assert parse_form(params, {"layers": " [16, 8] "}, "B") == {"layers": [16, 8]}
    assert parse_form(params, {"layers": "[32]"}, "B") == {"layers": [32]}
    with pytest.raises(ValueError, match="layers expects list\\[int\\], could not read '16, x'"):
        parse_form(params, {"layers": "16, x"}, "B")
    with pytest.raises(ValueError, match="must be a finite number"):
        parse_form(params, {"scale": "nan"}, "B")


def test_app_builds_without_serving():
    from workbench.ui.app import build_app

    app = build_app()
    assert app.title == "workbench"


def test_dynamics_network_builds_from_its_form():
    labels = {f.label: f for f in mb.model_form("efficientzero_dynamics")}
    assert labels["norm_type"].widget == "dropdown" and labels["fc_reward_layers"].widget == "text"
    assert labels["observation_shape"].value == "16, 6, 6"
    result = mb.build_model("efficientzero_dynamics", {"norm_type": "LN", "fc_reward_layers": "16, 16"}, 3)
    assert result.ok, result.message
    rows = result.tree.set_index("path")
    assert rows.loc["", "output"] == "((3, 16, 6, 6), ((1, 3, 64), (1, 3, 64)), (3, 21))"
    assert rows.loc["norm_common", "type"] == "LayerNorm"
    # the shared activation object runs at many call sites in one pass: a row per call, each with
    # the shape of what that call returned (not every shape the object returned, at every path)
    assert [rows.loc[f"activation#{k}", "output"] for k in range(3)] == ["(3, 16, 6, 6)", "(3, 8, 6, 6)", "(3, 64)"]
    assert rows.loc["resblocks.0.act", "output"] == "(3, 16, 6, 6)"
    # the reward head (Linear, LN, act, Linear, LN, act, Linear) holds the one object at .2 and .5
    assert rows.loc["fc_reward_head.2", "output"] == rows.loc["fc_reward_head.5", "output"] == "(3, 16)"
    assert "activation" not in rows.index and not rows["output"].str.contains("×").any()
    assert result.tree["path"].is_unique
    bad = mb.build_model("efficientzero_dynamics", {"observation_shape": "16, six, 6"})
    assert not bad.ok and "observation_shape expects" in bad.message


def test_query_module_builds_and_shows_its_map_without_parameters():
    assert mb.filter_models("storage", "") == ["query_module"]
    result = mb.build_model("query_module", {"index_key": "idx"}, 5)
    assert result.ok, result.message
    assert "0 parameters" in result.message and "idx: (5)" in result.message
    rows = result.tree.set_index("path")
    assert rows.loc["aggregator", "output"] == "(5)"  # the joint row hash ran
    assert rows.loc["hash_to_int", "output"] == "(5)"


@pytest.mark.parametrize("values, expected", [
    ({"index_key": ""}, "index_key '' is an empty name. Name the key, e.g. index_key='_index'."),
    ({"index_key": "_hash"}, "index_key '_hash' and hash_key '_hash' are the same key"),
    ({"index_key": "observation"}, "index_key 'observation' is also an in_key: writing the index would overwrite"),
])
def test_query_module_keys_that_would_lose_data_are_refused_with_the_constructors_message(values, expected):
    result = mb.build_model("query_module", values, 5)
    assert not result.ok and result.message.startswith("**Could not build the model.**")
    assert expected in result.message and result.tree.empty


def test_a_seed_field_takes_what_a_browser_number_field_carries_exactly():
    """A number field holds a JavaScript double: 2**63 - 1 typed arrives as 2**63, 2**53 + 1 as 2**53."""
    field = next(f for f in mb.model_form("ilql") if f.label == "seed")
    assert field.info.endswith("range [0, 9007199254740991]") and "2**63" not in field.info
    table = mb.param_table("ilql").set_index("parameter")
    assert table.loc["seed", "allowed"] == "[0, 9223372036854775807] (in the form: [0, 9007199254740991])"
    for typed in (9223372036854775807.0, 9223372036854776000, 9007199254740992):
        result = mb.build_model("ilql", {"seed": typed, "n_layer": 1, "dataset_size": 8})
        assert not result.ok
        assert (f"seed must lie in [0, 9007199254740991] in this form, got {int(typed)}: 2**53 - 1 = 9007199254740991 "
                "is the largest whole number a browser number field carries exactly") in result.message
        assert "from Python, seed takes [0, 9223372036854775807]" in result.message
    built = mb.build_model("ilql", {"seed": 9007199254740991.0, "n_layer": 1, "dataset_size": 8})
    assert built.ok and "seed=9007199254740991" in built.message, built.message
    assert workbench.create_model("ilql", seed=2**63 - 1, n_layer=1, dataset_size=8)  # (the Python API: as before)


def test_whole_number_fields_reach_the_handler_unrounded():
    """Gradio's precision=0 would round 2.5 to 2 (and report 'defaults'); the widget passes 2.5 on and
    build_model refuses it, naming the field and the value."""
    field = {f.label: f for f in mb.model_form("mlp")}["depth"]
    number = mb.widget(field, key="mlp:depth")
    assert number.preprocess(2.5) == 2.5 and number.preprocess(3) == 3
    result = mb.build_model("mlp", {"depth": number.preprocess(2.5)})
    assert not result.ok and "depth" in result.message and "2.5" in result.message
    assert "whole number" in result.message and "defaults" not in result.message


def test_a_number_beyond_float_range_is_explained():
    # the browser sends 1e400 as null
    result = mb.build_model("prelu", {"init": None})
    assert not result.ok and "init" in result.message and "1e400" in result.message


def test_build_refuses_a_model_over_the_memory_limit_before_allocating(monkeypatch):
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "1MB")
    result = mb.build_model("mlp", {"width": 1024.0, "depth": 4.0})
    assert not result.ok and result.tree.empty
    for fragment in ("width=1024", "would need about 12.6 MB", "memory limit of 1 MB", "WORKBENCH_MEMORY_LIMIT"):
        assert fragment in result.message, fragment
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "off")
    assert mb.build_model("mlp", {"width": 1024.0, "depth": 4.0}).ok


def test_example_batch_size_is_bounded():
    result = mb.build_model("relu", {}, batch_size=10**9)
    assert not result.ok and f"at most {mb.MAX_EXAMPLE_BATCH}" in result.message


# --- in the browser -------------------------------------------------------------------------

@pytest.mark.browser
def test_the_example_batch_size_field_is_editable_and_used(page):
    from playwright.sync_api import expect

    page.get_by_label("relu", exact=True).check()
    page.wait_for_selector("#model-overview:has-text('Rectified Linear Unit')")
    field = page.locator("#batch-size input")
    expect(field).to_be_editable()
    field.fill("5")
    expect(page.locator("#build-form")).to_contain_text("inplace")  # (relu's form, rendered: its Build button)
    page.locator("#build-button").click()
    expect(page.locator("#build-message")).to_contain_text("for batch size 5")
    expect(page.locator("#module-tree")).to_contain_text("(5, 4, 5)")


@pytest.mark.browser
def test_the_dynamics_network_tree_has_a_row_per_call_site_and_build_stays_in_view(page):
    import os

    from playwright.sync_api import expect

    page.get_by_label("efficientzero_dynamics", exact=True).check()
    page.wait_for_selector("#model-overview:has-text('EfficientZero dynamics network')")
    button = page.locator("#build-button")
    expect(button).to_be_visible()
    fields = page.locator("#model-fields")
    expect(fields).to_contain_text("lstm_hidden_size")
    # the button heads the form, in the first screenful, above the first of its fields
    top = button.bounding_box()
    first_field = page.get_by_label("observation_shape").bounding_box()
    assert top["y"] + top["height"] <= 1000 and top["y"] <= first_field["y"]
    # the form is laid out in columns: fields share rows
    boxes = [page.get_by_label(name).bounding_box() for name in
             ("observation_shape", "action_encoding_dim", "num_res_blocks")]
    assert boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"]  # side by side (their help texts differ in length)
    assert max(b["y"] for b in boxes) - min(b["y"] for b in boxes) < boxes[0]["height"] * 2
    page.locator("#batch-size input").fill("3")
    button.click()
    expect(page.locator("#build-message")).to_contain_text("for batch size 3")
    tree = page.locator("#module-tree")
    expect(tree).to_contain_text("activation#2")
    cells = tree.evaluate("el => Array.from(el.querySelectorAll('[role=row]')).map(r => Array.from("
                          "r.querySelectorAll('[role=gridcell]')).map(cell => cell.innerText.trim()))")
    rows = {row[1]: row for row in cells if len(row) == 5}  # (the rows drawn: the tree's first ones)
    for path, kind, shape in (("activation#0", "ReLU", "(3, 16, 6, 6)"), ("activation#1", "ReLU", "(3, 8, 6, 6)"),
                              ("activation#2", "ReLU", "(3, 64)"), ("resblocks.0.act", "ReLU", "(3, 16, 6, 6)")):
        assert rows[path][2:] == [kind, "0", shape], rows.get(path)
    assert "activation" not in rows and not any("×" in row[4] for row in rows.values())
    folder = os.environ.get("WORKBENCH_SCREENSHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, "models_tab.png"), full_page=True)


@pytest.mark.browser
def test_typing_a_name_filter_keeps_the_model_shown_while_it_matches_and_says_when_it_moves_the_form(page):
    """Each keystroke in the filter moved the list, the overview and the form to the first match: the form
    turned into another model's while the user typed, what they had typed into it gone without a word."""
    from playwright.sync_api import expect

    box = page.locator("#name-filter textarea, #name-filter input").first
    overview, message = page.locator("#model-overview"), page.locator("#build-message")
    listed = page.locator("#model-list label")

    def shown(name, title):
        expect(page.locator("#model-list").get_by_role("radio", name=name, exact=True)).to_be_checked()
        expect(overview).to_contain_text(title)

    page.get_by_label("relu", exact=True).check()
    shown("relu", "Rectified Linear Unit")
    inplace = page.get_by_label("inplace")
    inplace.check()
    # a change event per keystroke, each sent before the server has answered the one before
    box.press_sequentially("elu")  # (relu matches e, el and elu: it stays, its form as the user left it)
    expect(listed).to_have_text(["gelu", "prelu", "relu"])
    shown("relu", "Rectified Linear Unit")
    expect(inplace).to_be_checked()
    box.press_sequentially("x")  # (a typo: no model matches; the form stays, and the message says so)
    expect(listed).to_have_count(0)
    expect(message).to_contain_text("No model matches the filter; the form still shows relu.")
    box.press("Backspace")  # (undone: nothing lost)
    shown("relu", "Rectified Linear Unit")
    expect(inplace).to_be_checked()
    expect(message).not_to_contain_text("No model matches")
    box.fill("")
    box.press_sequentially("sig")  # (relu hidden: the first match shown, and the message says the form moved)
    expect(listed).to_have_text(["sigmoid"])
    shown("sigmoid", "Logistic sigmoid")
    expect(page.locator("#build-form")).to_contain_text("No parameters to set")
    expect(message).to_contain_text("; the form shows sigmoid. Picked again, ")
    page.locator("#build-button").click()
    expect(message).to_contain_text("Built sigmoid")
    # every event of the typing answered: no status tracker on the tab's outputs is pending or busy
    page.wait_for_function("""() => Array.from(document.querySelectorAll(
        ['#model-list', '#model-overview', '#param-table', '#build-form', '#build-message', '#module-tree']
            .map(id => id + ' [data-testid=status-tracker]').join(', ')))
        .every(tracker => tracker.classList.contains('hide'))""")
    assert page.locator(".toast-body").all_inner_texts() == []
