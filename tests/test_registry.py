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
    with pytest.raises(ValueError, match=r"no family 'activations'; did you mean 'activation'\? The families are \["):
        workbench.list_models(family="activations")  # (a typo is an error, not an empty list)
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


# --- the memory estimate -------------------------------------------------------------

_SMALL_CONFIGS = {"mlp": dict(width=7, depth=3, activation="prelu", in_features=5),
                  "prelu": dict(num_parameters=9, dtype=torch.float64),
                  "efficientzero_dynamics": dict(norm_type="LN", num_res_blocks=2, fc_reward_layers=[8, 8]),
                  "ilql": dict(n_layer=1, n_embd=16, n_head=2, double_q=False, activation="prelu", dataset_size=8)}


@pytest.mark.parametrize("name", workbench.list_models())
def test_every_model_estimates_its_parameters_exactly(name):
    """The estimate create_model checks against the limit is the bytes of the model's parameters and
    buffers (plus the data a model holds: ILQL's offline dataset)."""
    from workbench.models.toy_language import ToyLanguageDataset
    from workbench.registry import parameter_bytes

    spec = workbench.get_spec(name)
    for overrides in ({}, _SMALL_CONFIGS.get(name)):
        if overrides is None:
            continue
        model = workbench.create_model(name, **overrides)
        data = ToyLanguageDataset.estimate_bytes(len(model.dataset)) if name == "ilql" else 0
        assert spec.estimate_memory(**overrides) == parameter_bytes(model) + data, overrides


def test_memory_limit_from_argument_environment_or_available_memory(monkeypatch, scratch_model):
    from workbench.params import MEMORY_FRACTION, MemoryLimitError, available_memory, memory_limit

    big = dict(width=512, depth=4)  # 3.2 MB of parameters
    assert workbench.get_spec("mlp").estimate_memory(**big) == 4 * (3 * 512 + 3 * 513 * 512 + 513 * 2)
    monkeypatch.delenv("WORKBENCH_MEMORY_LIMIT", raising=False)
    limit, source = memory_limit()
    assert limit == pytest.approx(MEMORY_FRACTION * available_memory(), rel=0.2) and "available on cpu" in source
    with pytest.raises(MemoryLimitError, match=r"would need about 3.16 MB.*memory_limit='1MB'.*memory_limit='4MB'"):
        workbench.create_model("mlp", memory_limit="1MB", **big)
    assert isinstance(MemoryLimitError("x"), MemoryError) and isinstance(MemoryLimitError("x"), ValueError)
    assert workbench.create_model("mlp", memory_limit=4 * 10**6, **big) is not None
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "1 MiB")
    with pytest.raises(MemoryLimitError, match=r"WORKBENCH_MEMORY_LIMIT='1 MiB'"):
        workbench.create_model("mlp", **big)
    assert workbench.create_model("mlp", memory_limit="off", **big) is not None  # the argument wins
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "off")
    assert workbench.create_model("mlp", **big) is not None

    # a model registered without an estimate is built on the meta device to count its parameters;
    # one whose builder cannot run there is not checked; memory=False opts out
    calls = []

    @scratch_model("user_wide", family="user", example_inputs=_inputs)
    def user_wide(width: int = 1000):
        calls.append(torch.empty(0).device.type)
        return nn.Linear(3, width)

    assert workbench.get_spec("user_wide").estimate_memory(width=10**9) == 4 * (4 * 10**9)
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "1GB")
    with pytest.raises(MemoryLimitError, match="Model 'user_wide' \\(width=1000000000\\) would need about 16 GB"):
        workbench.create_model("user_wide", width=10**9)
    assert calls == ["meta", "meta"]  # estimated twice, never built for real
    workbench.create_model("user_wide")
    assert calls[-2:] == ["meta", "cpu"]


def test_nested_builds_are_estimated_once():
    """An MLP's builder creates its activations through create_model: they are part of the MLP's
    estimate and not checked again (an experiment's models likewise, under its own limit)."""
    from workbench.registry import memory_accounted, memory_is_accounted

    assert not memory_is_accounted()
    with memory_accounted():
        assert memory_is_accounted()
        # inside, even a model over a tiny limit builds: its memory is accounted for by the caller
        assert workbench.create_model("mlp", width=64, memory_limit=1) is not None
    assert not memory_is_accounted()


def test_a_range_can_admit_an_infinity_but_never_nan():
    import math

    from workbench.params import check_value, params_of

    def builder(gain: Annotated[float, Range(0, math.inf)] = 1.0, scale: Annotated[float, Range(0, None)] = 1.0,
                free: float = 0.0):
        """B."""

    gain, scale, free = params_of(builder)
    assert check_value(gain, math.inf, "B") == math.inf
    for info, value in ((scale, math.inf), (free, -math.inf), (gain, math.nan), (free, math.nan)):
        with pytest.raises(ValueError, match=f"'{info.name}' must be a finite number"):
            check_value(info, value, "B")
    assert str(Range(0, 2**63 - 1)) == "[0, 9223372036854775807]" and str(Range(1e-7, 1.0)) == "[1e-07, 1]"


# --- registering: what is refused, and what an unannotated builder takes ----------------------

def test_a_default_outside_its_own_range_choices_or_type_is_refused_at_registration(scratch_model):
    def wide(width: Annotated[int, Range(1, 8)] = 16):
        return nn.Linear(3, width)

    def odd(mode: Literal["a", "b"] = "c"):
        return nn.Linear(3, 2)

    def typed(scale: float = "1.0"):
        return nn.Linear(3, 2)

    for builder, says in ((wide, r"'width' must lie in \[1, 8\], got 16\. It is the parameter's default"),
                          (odd, r"'mode' must be one of \['a', 'b'\], got 'c'\. It is the parameter's default"),
                          (typed, r"'scale' expects float, got '1.0'")):
        with pytest.raises((ValueError, TypeError), match=says):
            scratch_model(builder.__name__, family="user", example_inputs=_inputs)(builder)
        assert builder.__name__ not in workbench.list_models()  # nothing half-registered
    with pytest.raises(ValueError, match=r"'width' must lie in \[1, 8\], got 0"):  # (defaults= is checked too)
        scratch_model("narrow", family="user", example_inputs=_inputs, defaults={"width": 0})(wide)
    with pytest.raises(TypeError, match=r"defaults names \['depth'\], which the builder does not take"):
        scratch_model("deep", family="user", example_inputs=_inputs, defaults={"depth": 2})(wide)


@pytest.mark.parametrize("arguments, error, says", [
    ({"name": "", "family": "user", "example_inputs": _inputs}, ValueError, "non-empty string without spaces"),
    ({"name": "my net", "family": "user", "example_inputs": _inputs}, ValueError, "got 'my net'"),
    ({"name": "n", "family": None, "example_inputs": _inputs}, TypeError, "family must be a non-empty string"),
    ({"name": "n", "family": "user", "example_inputs": None}, TypeError, "example_inputs must be a function"),
    ({"name": "n", "family": "user", "example_inputs": _inputs, "objective": "mean"}, TypeError,
     "objective must be a function, got 'mean'"),
    ({"name": "n", "family": "user", "example_inputs": _inputs, "memory": 100}, TypeError, "memory must be"),
])
def test_a_registration_that_could_not_work_is_refused_with_its_reason(arguments, error, says):
    families = workbench.list_families()
    with pytest.raises(error, match=says):
        workbench.register_model(**arguments)(lambda: nn.Linear(3, 2))
    assert workbench.list_families() == families and "n" not in workbench.list_models()
    with pytest.raises(TypeError, match="decorates a builder function or an nn.Module class, got 42"):
        workbench.register_model("n", family="user", example_inputs=_inputs)(42)


def test_a_builder_that_returns_no_module_is_told_at_build(scratch_model):
    scratch_model("not_a_module", family="user", example_inputs=_inputs)(lambda: "a string")
    with pytest.raises(TypeError, match=r"returned str \('a string'\), not a torch.nn.Module"):
        workbench.create_model("not_a_module")


def test_an_unannotated_parameter_takes_the_type_of_its_default(scratch_model):
    @scratch_model("plain", family="user", example_inputs=_inputs, objective=_objective)
    def plain(width=16, scale=1.0, bias=True, name="a"):
        return nn.Linear(3, width, bias=bias)

    width, scale, bias, name = workbench.get_spec("plain").params
    assert [p.kind for p in (width, scale, bias, name)] == ["int", "float", "bool", "str"]
    # before: 'abc' reached the builder and torch said "empty(): argument 'size' ... must be tuple of ints"
    with pytest.raises(TypeError, match=r"'width' expects int, got 'abc' \(str\).*the type of its default 16"):
        workbench.create_model("plain", width="abc")
    with pytest.raises(TypeError, match="'bias' expects bool"):
        workbench.create_model("plain", bias=1)
    assert workbench.create_model("plain", width=4, scale=2).out_features == 4  # an int is a float


def test_a_torch_class_is_named_by_its_public_path_in_messages():
    # (was 'torch.Module', a name that does not exist)
    with pytest.raises(TypeError, match=r"'activation' expects torch\.nn\.Module \| None, got 'relu'"):
        workbench.create_model("efficientzero_dynamics", activation="relu")
    from workbench.params import type_name
    assert type_name(torch.device) == "torch.device" and type_name(nn.Linear) == "torch.nn.Linear"


def test_a_refusal_just_over_the_limit_does_not_read_as_equal_to_it():
    need = workbench.get_spec("mlp").estimate_memory(width=512, depth=4)
    with pytest.raises(workbench.params.MemoryLimitError) as info:
        workbench.create_model("mlp", width=512, depth=4, memory_limit=need - 1)
    message = str(info.value)
    # (was "would need about 3.18 MB, more than the memory limit of 3.18 MB")
    said = message.split("would need about ")[1].split(",")[0], message.split("memory limit of ")[1].split(" (")[0]
    assert said[0] != said[1], message


def test_a_name_in_the_wrong_case_is_suggested():
    # (was "Unknown model 'MLP'. See workbench.list_models()." with no suggestion)
    with pytest.raises(ValueError, match=r"Unknown model 'MLP'\. Did you mean 'mlp'\?"):
        workbench.create_model("MLP")
    with pytest.raises(ValueError, match=r"Unknown model 'PReLu'\. Did you mean 'prelu'( or '\w+')*\?"):
        workbench.get_spec("PReLu")
    with pytest.raises(ValueError, match=r"Unknown experiment 'ILQL'\. Did you mean 'ilql'\?"):
        workbench.experiments.create("ILQL")


def test_a_positional_only_parameter_without_default_is_refused_at_registration(scratch_model):
    # (it registered, and every build failed with "missing 1 required positional argument: 'size'")
    def sized(size, /, bias: bool = True):
        return nn.Linear(3, size, bias=bias)

    with pytest.raises(TypeError, match=r"\['size'\] are positional-only and have no default"):
        scratch_model("sized", family="user", example_inputs=_inputs)(sized)
    assert "sized" not in workbench.list_models()

    def defaulted(size=2, /, bias: bool = True):
        return nn.Linear(3, size, bias=bias)

    scratch_model("defaulted", family="user", example_inputs=_inputs)(defaulted)
    assert workbench.create_model("defaulted", bias=False).out_features == 2


def test_probe_explains_example_inputs_objective_and_forward_that_do_not_fit(scratch_model):
    # example_inputs returning the tensor itself, not (args, kwargs): refused naming what it returned
    scratch_model("bare_tensor", family="user",
                  example_inputs=lambda model, batch_size, generator=None: torch.randn(batch_size, 3))(
        lambda: nn.Linear(3, 2))
    with pytest.raises(TypeError, match=r"'bare_tensor': example_inputs must return \(args, kwargs\).*"
                                        r"got Tensor\(4, 3\)\."):
        workbench.probe("bare_tensor")
    # an objective that does not reduce to a scalar
    scratch_model("unreduced", family="user", example_inputs=_inputs,
                  objective=lambda model, inputs, out: out)(lambda: nn.Linear(3, 2))
    with pytest.raises(TypeError, match=r"objective of model 'unreduced' must return a scalar tensor.*"
                                        r"got a tensor of shape \(3, 2\)"):
        workbench.probe("unreduced", batch_size=3)
    # inputs the model cannot take: the model's own error, with a note naming the model and the shapes
    scratch_model("misfit", family="user", example_inputs=_inputs)(lambda: nn.Linear(5, 2))
    with pytest.raises(RuntimeError, match="cannot be multiplied") as raised:
        workbench.probe("misfit", batch_size=3)
    assert ("probe: the forward pass of model 'misfit' (Linear) failed on its example_inputs, of shapes "
            "Tensor(3, 3)") in "".join(raised.value.__notes__)
