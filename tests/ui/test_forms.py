"""Reading what a person typed into a form: a value that cannot be read says how to write it."""

import re

import numpy as np
import pytest

from workbench.experiments import get_experiment_spec
from workbench.params import params_of
from workbench.ui.forms import parse_form, read_whole


def _builder(layers: list[int] = [32], rates: list[float] = [0.5], size: int | None = None,
             scale: float | None = None):
    """B.

    Args:
        layers: sizes.
        rates: rates.
        size: optional size.
        scale: optional scale.
    """


@pytest.mark.parametrize("values, expected", [
    ({"layers": "32, x"}, "layers expects list[int], could not read '32, x': 'x' is not one of the whole numbers "
                          "it lists; write whole numbers separated by commas, such as 32, 16."),
    ({"layers": "[16, 2.5]"}, "could not read '[16, 2.5]': '2.5' is not one of the whole numbers it lists"),
    ({"rates": "0.5; 1"}, "could not read '0.5; 1': '0.5; 1' is not one of the numbers it lists; write numbers "
                          "separated by commas, such as 0.5, 1."),
    ({"size": "ten"}, "size expects int | None, could not read 'ten': not a number; enter a whole number such as "
                      "2, or leave the field empty for None."),
    ({"size": "2.5"}, "could not read '2.5': not a whole number; enter an integer such as 2."),
    ({"scale": "half"}, "scale expects float | None, could not read 'half': not a number; enter a number such as "
                        "0.5, or leave the field empty for None."),
])
def test_a_text_field_that_cannot_be_read_says_how_to_write_it(values, expected):
    with pytest.raises(ValueError) as caught:
        parse_form(params_of(_builder), values, "B")
    assert expected in str(caught.value)


def test_the_efficientzero_forms_reward_layers_typed_wrong_say_how_to_write_them():
    params = get_experiment_spec("efficientzero_dynamics").params
    with pytest.raises(ValueError, match="'x' is not one of the whole numbers it lists; write whole numbers "
                                         "separated by commas, such as 32, 16"):
        parse_form(params, {"fc_reward_layers": "32, x"}, "Experiment 'efficientzero_dynamics'")
    assert parse_form(params, {"fc_reward_layers": "32, 16"}, "E") == {"fc_reward_layers": [32, 16]}


def test_a_pop_up_takes_off_markdowns_bold_and_keeps_a_power():
    from workbench.ui.forms import pop_up_text

    assert pop_up_text("**Could not build:** seed must lie in [0, 2**53 - 1]") == \
        "Could not build: seed must lie in [0, 2**53 - 1]"


@pytest.mark.parametrize("typed, whole", [("1e3", 1000), ("1E3", 1000), (" 2.0 ", 2), ("1_000", 1000), ("-4", -4),
                                          (1e3, 1000), (7, 7), ("1e23", 10**23), (np.int64(5), 5)])
def test_a_whole_number_written_any_way_is_read_exactly(typed, whole):
    # (a person who types 1e3 for steps means 1000; text is read as a decimal: 1e23 is 10**23, not the float
    # nearest it, 99999999999999991611392)
    assert read_whole(typed) == whole and type(read_whole(typed)) is int


@pytest.mark.parametrize("typed, reason", [
    ("2.5", "not a whole number; enter an integer such as 2"), (2.5, "not a whole number"),
    ("1e400", "beyond the floating-point range; enter a finite number"), ("nan", "not a finite number"),
    (float("inf"), "not a finite number"), ("ten", "not a number; enter a whole number such as 2"),
    (True, "not a number"), (None, "the field is empty"),
    # (an empty text box is empty: "or holds a number beyond the floating-point range" is of a number box's None)
    ("", "the field is empty; enter a whole number such as 2"), (" ", "the field is empty; enter a whole number"),
    # (underscores as Python writes numbers, as a float field reads them: Decimal alone took "_1" and "1__0")
    ("_1", "not a number"), ("1_", "not a number"), ("1__0", "not a number"), ("1e_3", "not a number")])
def test_what_is_no_whole_number_says_why(typed, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        read_whole(typed)


def test_every_whole_number_field_reads_1e3_as_1000_and_refuses_2_5_and_1e400_saying_why(manager):
    from workbench.ui import explorer, live_run, model_browser

    assert parse_form(params_of(_builder), {"size": "1e3"}, "B") == {"size": 1000}
    with pytest.raises(ValueError, match=re.escape("size expects int | None, could not read '1e400': beyond the "
                                                   "floating-point range; enter a finite number.")):
        parse_form(params_of(_builder), {"size": "1e400"}, "B")  # (it said "not a whole number")
    # the run form's steps, every and seed (they refused '1e3' and '2.0' as text)
    run, message = live_run.start_run(manager, "activation_mlp", {}, "0e0", "1e1", "2.0", False, "*", "")
    assert run is not None, message
    run.join(60)
    assert run.outcome == "finished" and run.experiment.step_count == 10
    run, message = live_run.start_run(manager, "activation_mlp", {}, 0, "2.5", 1, False, "*", "")
    assert run is None and "steps must be a whole number in [1, 10000000], got '2.5': not a whole number" in message
    # the explorer's boxes and the model browser's batch size
    _, drawn = explorer.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed="0e0", samples="1e2")
    assert "**relu** on 100 samples" in drawn, drawn
    assert model_browser.build_model("relu", {}, batch_size="1e1").ok
    assert "got '2.5': not a whole number" in model_browser.build_model("relu", {}, batch_size="2.5").message


def test_a_whole_number_beyond_a_fields_reach_is_named_as_typed_not_in_its_hundreds_of_digits(manager):
    # (read exactly, 1e300 is a number of 301 digits: each message that named it after reading it printed them all)
    from workbench.ui import explorer, live_run, model_browser

    digits = re.compile(r"\d{30}")
    _, message = live_run.start_run(manager, "activation_mlp", {}, 0, "1e300", 1, False, "*", "")
    assert "got '1e300'" in message and not digits.search(message), message
    _, message = live_run.start_run(manager, "activation_mlp", {}, 1e300, 10, 1, False, "*", "")  # (a number box)
    assert "got 1e+300" in message and not digits.search(message), message
    for message in [model_browser.build_model("relu", {}, batch_size=1e300).message,
                    model_browser.build_model("mlp", {"width": 1e300}).message,
                    explorer.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed=0, samples="1e300")[1],
                    explorer.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed=1e300, samples=10)[1]]:
        assert ("1e+300" in message or "'1e300'" in message) and not digits.search(message), message
    _, message = live_run.start_run(manager, "activation_mlp", {}, 0, 2e7, 1, False, "*", "")
    assert "got 20000000" in message, message  # (within a field's reach: its digits, as before)
