"""The registry, and smoke tests parametrized over every registered model."""

import inspect
from typing import Annotated, Literal

import pytest
import torch
from torch import nn

import workbench
from workbench import Range


def _inputs(model, batch_size, generator=None):
    return (torch.randn(batch_size, 3, generator=generator),), {}


def _objective(model, inputs, out):
    return out.sum()


# --- listing and lookup -----------------------------------------------------

def test_list_models_is_sorted_and_filters_with_fnmatch():
    names = workbench.list_models()
    assert names == sorted(names)
    assert workbench.list_models("*lu") == ["gelu", "prelu", "relu"]
    assert workbench.list_models(["sig*", "tan?"]) == ["sigmoid", "tanh"]
    assert workbench.list_models("*", family="activation") == ["gelu", "prelu", "relu", "sigmoid", "tanh", "threshold"]
    assert workbench.list_models("nothing*") == []
    assert workbench.list_models(family="no-such-family") == []
    assert "activation" in workbench.list_families()


def test_unknown_name_suggests_close_names():
    with pytest.raises(ValueError, match=r"Unknown model 'gelú'\. Did you mean 'gelu'.*list_models"):
        workbench.create_model("gelú")
    with pytest.raises(ValueError, match="Unknown model 'zzz'. See"):
        workbench.get_spec("zzz")


def test_unknown_override_lists_valid_parameters():
    with pytest.raises(TypeError) as info:
        workbench.create_model("gelu", aproximate="tanh")
    message = str(info.value)
    assert "'aproximate'" in message and "approximate" in message and "default 'none'" in message


@pytest.mark.parametrize(
    "name, overrides, error, pattern",
    [
        ("gelu", {"approximate": "fast"}, ValueError, r"one of \['none', 'tanh'\], got 'fast'"),
        ("relu", {"inplace": "yes"}, TypeError, r"'inplace' expects bool, got 'yes'"),
        ("prelu", {"num_parameters": 2.5}, TypeError, r"'num_parameters' expects int"),
        ("prelu", {"num_parameters": 0}, ValueError, r"must lie in \[1, inf\], got 0"),
        ("mlp", {"activation": "swish"}, ValueError, r"'activation' must be one of \['gelu'"),
        ("threshold", {"value": None}, TypeError, r"'value' expects float"),
    ],
)
def test_ill_typed_override_names_the_parameter(name, overrides, error, pattern):
    with pytest.raises(error, match=pattern):
        workbench.create_model(name, **overrides)


def test_spec_metadata_is_derived_from_signature_and_docstring():
    spec = workbench.get_spec("prelu")
    assert spec.name == "prelu" and spec.family == "activation"
    assert spec.summary.startswith("Parametric ReLU")
    names = [p.name for p in spec.params]
    assert names == list(inspect.signature(workbench.models.activations.PReLU).parameters)
    num = spec.params[0]
    assert (num.annotation, num.default, num.range.low, num.range.high) == (int, 1, 1, None)
    assert "number of slopes" in num.help
    assert spec.params[1].default == 0.25
    gelu = workbench.get_spec("gelu").params[0]
    assert gelu.choices == ("none", "tanh") and gelu.kind == "choice"


def test_register_own_model_and_duplicate_name(scratch_model):
    @scratch_model("tiny_linear", family="user", example_inputs=_inputs, objective=_objective)
    def tiny_linear(out_features: Annotated[int, Range(1, 8)] = 2, bias: bool = True,
                    mode: Literal["a", "b"] = "a"):
        """A tiny linear layer.

        Args:
            out_features: output size.
            bias: whether to add a bias.
            mode: unused switch.
        """
        return nn.Linear(3, out_features, bias=bias)

    assert workbench.list_models(family="user") == ["tiny_linear"]
    model = workbench.create_model("tiny_linear", out_features=5, bias=False)
    assert model.weight.shape == (5, 3) and model.bias is None
    spec = workbench.get_spec("tiny_linear")
    assert spec.summary == "A tiny linear layer."
    assert [(p.name, p.help) for p in spec.params][0] == ("out_features", "output size.")
    with pytest.raises(ValueError, match="'tiny_linear' is already registered"):
        workbench.register_model("tiny_linear", family="user", example_inputs=_inputs)(tiny_linear)
    with pytest.raises(ValueError, match=r"must lie in \[1, 8\], got 9"):
        workbench.create_model("tiny_linear", out_features=9)


def test_required_parameter_without_default_is_reported(scratch_model):
    @scratch_model("needs_size", family="user", example_inputs=_inputs)
    def needs_size(size: int):
        return nn.Linear(3, size)

    with pytest.raises(TypeError, match="needs a value for 'size'"):
        workbench.create_model("needs_size")
    assert workbench.create_model("needs_size", size=4).out_features == 4


def test_probe_without_objective_runs_forward_only(scratch_model):
    scratch_model("no_objective", family="user", example_inputs=_inputs)(lambda: nn.Linear(3, 2))
    result = workbench.probe("no_objective", batch_size=3)
    assert result.loss is None and result.outputs.shape == (3, 2)
    assert result.input_grads == [None]
    assert not workbench.get_spec("no_objective").differentiable


# --- every registered model, like timm's tests -------------------------------

@pytest.mark.parametrize("name", workbench.list_models())
def test_every_model_builds_runs_and_backpropagates(name):
    spec = workbench.get_spec(name)
    model = workbench.create_model(name)
    assert isinstance(model, nn.Module)
    generator = torch.Generator().manual_seed(1)
    args, kwargs = spec.example_inputs(model, 3, generator)
    assert isinstance(args, tuple) and isinstance(kwargs, dict)
    result = workbench.probe(spec, model, batch_size=3, seed=1)
    # the probe used the same example inputs as the spec produces for that seed
    for a, b in zip(result.inputs[0], args):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
    if spec.differentiable:
        assert result.loss.dim() == 0 and torch.isfinite(result.loss)
        params = [p for p in model.parameters() if p.requires_grad]
        grads_seen = any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
        inputs_seen = any(g is not None and g.abs().sum() > 0 for g in result.input_grads)
        assert grads_seen or inputs_seen, "the objective reached neither parameters nor inputs"
        for p in params:
            assert p.grad is not None, "a parameter received no gradient"


@pytest.mark.parametrize("name", workbench.list_models())
def test_every_model_builds_with_its_declared_defaults(name):
    spec = workbench.get_spec(name)
    # the defaults the UI shows are exactly the ones a default build uses
    explicit = workbench.create_model(name, **spec.defaults())
    implicit = workbench.create_model(name)
    assert type(explicit) is type(implicit)
    assert [p.shape for p in explicit.parameters()] == [p.shape for p in implicit.parameters()]
