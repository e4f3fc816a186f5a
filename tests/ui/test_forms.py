"""Reading what a person typed into a form: a value that cannot be read says how to write it."""

import pytest

from workbench.experiments import get_experiment_spec
from workbench.params import params_of
from workbench.ui.forms import parse_form


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
