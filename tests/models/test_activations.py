"""Activations against torch.nn.functional and closed-form math."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from workbench.models.activations import GELU, PReLU, ReLU, Sigmoid, Tanh, Threshold

DTYPES = [torch.float32, torch.float64]
SHAPES = [(), (7,), (3, 4), (2, 3, 4, 5)]


def _ref_gelu(v, approximate):
    if approximate == "tanh":
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    return v * 0.5 * (1 + math.erf(v / math.sqrt(2)))


# Closed-form scalar references written from the specification, computed in Python floats.
REFERENCES = {
    "gelu": (lambda: GELU(), lambda v: _ref_gelu(v, "none")),
    "gelu_tanh": (lambda: GELU("tanh"), lambda v: _ref_gelu(v, "tanh")),
    "relu": (lambda: ReLU(), lambda v: max(0.0, v)),
    "sigmoid": (lambda: Sigmoid(), lambda v: 1 / (1 + math.exp(-v))),
    "tanh": (lambda: Tanh(), lambda v: (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v))),
    "threshold": (lambda: Threshold(0.1, -2.0), lambda v: v if v > 0.1 else -2.0),
    "prelu": (lambda: PReLU(init=0.25), lambda v: max(0.0, v) + 0.25 * min(0.0, v)),
}

FUNCTIONAL = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "threshold": lambda x: F.threshold(x, 0.1, -2.0),
    "prelu": lambda x: F.prelu(x, torch.full((1,), 0.25, dtype=x.dtype)),
}


@pytest.mark.parametrize("key", sorted(REFERENCES))
def test_values_match_closed_form(key):
    make, ref = REFERENCES[key]
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    got = make().double()(x)
    expected = torch.tensor([ref(v) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("key", sorted(FUNCTIONAL))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_values_and_gradients_equal_functional(key, dtype, shape):
    module = REFERENCES[key][0]().to(dtype)
    x = torch.randn(shape, dtype=dtype)
    grad_out = torch.randn(shape, dtype=dtype)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    y = module(a)
    y_ref = FUNCTIONAL[key](b)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    y.backward(grad_out)
    y_ref.backward(grad_out)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.parametrize("module, functional", [
    (ReLU(inplace=True), F.relu),
    (Threshold(0.0, 0.5, inplace=True), lambda x: F.threshold(x, 0.0, 0.5)),
])
def test_inplace_variants_write_into_the_input(module, functional):
    leaf = torch.randn(4, 5, requires_grad=True)
    x = leaf * 1  # a non-leaf: in-place ops on it are legal
    expected = functional(x.detach().clone())
    y = module(x)
    assert y.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expected, rtol=0, atol=0)  # the input itself changed
    y.sum().backward()
    torch.testing.assert_close(leaf.grad, (leaf.detach() > 0).float())  # both pass x where x > 0


def test_not_inplace_leaves_input_alone():
    x = torch.randn(10)
    before = x.clone()
    ReLU()(x)
    Threshold(0.0, 1.0)(x)
    assert torch.equal(x, before)


# --- PReLU ------------------------------------------------------------------

def test_prelu_per_channel_weight_on_dim_1():
    m = PReLU(num_parameters=3, init=0.1)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x = -torch.ones(2, 3, 4)
    y = m(x)
    for c, a in enumerate([0.1, 0.2, 0.3]):
        assert torch.allclose(y[:, c], torch.full((2, 4), -a))
    assert m.weight.shape == (3,)


def test_prelu_weight_gradient_matches_torch():
    ours, theirs = PReLU(4, init=0.2), nn.PReLU(4, init=0.2)
    x = torch.randn(5, 4, 3)
    ours(x).pow(2).sum().backward()
    theirs(x).pow(2).sum().backward()
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=0, atol=0)


def test_prelu_low_rank_input_has_one_channel():
    m = PReLU()
    assert m(torch.tensor(-2.0)).item() == pytest.approx(-0.5)
    assert m(torch.tensor([-2.0, 3.0])).tolist() == pytest.approx([-0.5, 3.0])
    with pytest.raises(ValueError, match=r"1 channel\(s\) on dim 1"):
        PReLU(num_parameters=3)(torch.randn(3))


def test_prelu_state_dict_is_torch_compatible():
    theirs = nn.PReLU(6, init=0.1)
    with torch.no_grad():
        theirs.weight.uniform_()
    ours = PReLU(6)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 6, 3)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict(), strict=True)


def test_prelu_device_and_dtype():
    m = PReLU(2, dtype=torch.float64, device="cpu")
    assert m.weight.dtype == torch.float64 and m.weight.device.type == "cpu"
    assert workbench.create_model("prelu", dtype=torch.float64).weight.dtype == torch.float64


# --- errors -------------------------------------------------------------------

def test_invalid_arguments_get_clear_errors():
    with pytest.raises(ValueError, match=r"GELU: parameter 'approximate' must be one of \['none', 'tanh'\], got 'fast'"):
        GELU(approximate="fast")
    with pytest.raises(ValueError, match=r"PReLU\(num_parameters=3\) got an input of shape \(2, 5\).*"
                                         r"Use PReLU\(num_parameters=5\)"):
        PReLU(num_parameters=3)(torch.randn(2, 5))
    # a 1-D input has one channel: one way to fix it, said once (it read "Use PReLU(num_parameters=1) or
    # PReLU(num_parameters=1)")
    with pytest.raises(ValueError, match=r"with 1 channel\(s\) on dim 1 \(inputs of fewer than 2 dims have 1\)\. "
                                         r"Use PReLU\(num_parameters=1\)\.$"):
        PReLU(num_parameters=3)(torch.randn(7))
    with pytest.raises(ValueError, match=r"'num_parameters' must lie in \[1, inf\], got 0"):
        PReLU(num_parameters=0)
    with pytest.raises(TypeError, match="'threshold' expects float, got 'a'"):
        Threshold("a", 0.0)
    with pytest.raises(TypeError, match=r"'inplace' expects bool, got 1 \(int\)"):
        ReLU(inplace=1)
    with pytest.raises(TypeError, match=r"floating-point tensor, got dtype torch.int64.*x.float\(\)"):
        GELU()(torch.arange(3))
    with pytest.raises(TypeError, match="expects a torch.Tensor, got list"):
        Tanh()([1.0, 2.0])


# --- repr ---------------------------------------------------------------------

@pytest.mark.parametrize("ours, theirs", [
    (GELU(), nn.GELU()),
    (GELU("tanh"), nn.GELU("tanh")),
    (PReLU(3), nn.PReLU(3)),
    (ReLU(), nn.ReLU()),
    (ReLU(inplace=True), nn.ReLU(inplace=True)),
    (Sigmoid(), nn.Sigmoid()),
    (Tanh(), nn.Tanh()),
    (Threshold(0.1, 20.0), nn.Threshold(0.1, 20.0)),
    (Threshold(0, 0.5, inplace=True), nn.Threshold(0, 0.5, inplace=True)),
])
def test_extra_repr_like_torch(ours, theirs):
    assert repr(ours) == repr(theirs)


# --- spec extras: formula and closed-form derivative --------------------------

@pytest.mark.parametrize("name, overrides", [
    ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("prelu", {"num_parameters": 3, "init": 0.4}),
    ("relu", {}), ("sigmoid", {}), ("tanh", {}), ("threshold", {"threshold": 0.3, "value": -1.0}),
])
def test_derivative_matches_autograd(name, overrides):
    spec = workbench.get_spec(name)
    module = spec.build(**overrides).double()
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    x = x[(x - getattr(module, "threshold", 0.0)).abs() > 1e-6].reshape(-1)  # the kink is not differentiable
    x = x[: (len(x) // 3) * 3].reshape(-1, 3)
    leaf = x.clone().requires_grad_()
    module(leaf).sum().backward()
    torch.testing.assert_close(spec.derivative(module, x), leaf.grad, rtol=1e-10, atol=1e-12)
    assert spec.formula.startswith(("\\text", "y ="))


def test_formulas_come_from_the_specification():
    assert workbench.get_spec("sigmoid").formula == r"\text{Sigmoid}(x) = \sigma(x) = \frac{1}{1 + \exp(-x)}"
    assert r"\max(0, x) + a \cdot \min(0, x)" in workbench.get_spec("prelu").formula
