"""The six activation modules of the user's specification (tensorplay_activations).

GELU, PReLU, ReLU, Sigmoid, Tanh and Threshold with the specification's
signatures, formulas and shape rules. The forward passes call torch's fused
kernels (values and gradients equal ``torch.nn.functional``'s, in-place
variants write into their input); what the modules add is argument and input
checking with readable errors. Each is registered with its LaTeX formula and
its closed-form derivative, which the activation explorer plots.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from workbench.params import Range, check_arguments
from workbench.registry import register_model

__all__ = ["GELU", "PReLU", "ReLU", "Sigmoid", "Tanh", "Threshold"]


def _check_tensor(module: nn.Module, x: object, floating: bool, real: bool = False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{type(module).__name__} expects a torch.Tensor, got {type(x).__name__}.")
    if floating and not x.is_floating_point():
        raise TypeError(
            f"{type(module).__name__} expects a floating-point tensor, got dtype {x.dtype}. "
            "Convert the input first, e.g. x.float()."
        )
    if real and (x.dtype == torch.bool or x.is_complex()):  # comparisons with 0: real numbers only
        raise TypeError(
            f"{type(module).__name__} expects a real-valued (integer or floating-point) tensor, got dtype {x.dtype}. "
            "Convert the input first, e.g. x.float()."
        )
    return x


def _check_device(device: torch.device | str) -> None:
    """``device`` names a device this process can allocate on (``meta`` included: shapes alone)."""
    try:
        torch.empty(0, device=torch.device(device))  # the cheapest proof that the device exists here
    except Exception as err:  # RuntimeError (no such name), AssertionError (torch built without CUDA) ...
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"PReLU: device {str(device)!r} cannot be used here ({first}); pass 'cpu', None (the "
                         "default device) or an accelerator this process has, such as 'cuda:0'.") from None


# --- shared registry hooks -------------------------------------------------

def _example_inputs(model: nn.Module, batch_size: int, generator: torch.Generator | None = None):
    """(B, C, 5) standard-normal inputs; C matches PReLU's channel count."""
    channels = getattr(model, "num_parameters", 4)
    channels = channels if channels > 1 else 4
    x = torch.randn(batch_size, channels, 5, generator=generator)
    return (x,), {}


def _objective(model: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    """Mean square of the output: its gradient is 2y/N, never identically zero."""
    return output.pow(2).mean()


def _no_parameters(**kwargs) -> int:
    return 0


def _register(name: str, formula: str, derivative, **kwargs):
    kwargs.setdefault("memory", _no_parameters)
    return register_model(
        name, family="activation", example_inputs=_example_inputs, objective=_objective,
        formula=formula, derivative=derivative, **kwargs,
    )


def _prelu_memory(num_parameters: int, dtype: torch.dtype | None = None, **kwargs) -> int:
    """Bytes of PReLU's weight: num_parameters values of its dtype."""
    return num_parameters * (dtype or torch.get_default_dtype()).itemsize


# --- the derivatives, written out from the formulas -------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_derivative(module: "GELU", x: torch.Tensor) -> torch.Tensor:
    if module.approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))
        t = torch.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return cdf + x * pdf


def _prelu_derivative(module: "PReLU", x: torch.Tensor) -> torch.Tensor:
    a = module._broadcast_weight(x).detach()
    return torch.where(x > 0, torch.ones_like(x), a.expand_as(x))


def _relu_derivative(module: "ReLU", x: torch.Tensor) -> torch.Tensor:
    return (x > 0).to(x.dtype)


def _sigmoid_derivative(module: "Sigmoid", x: torch.Tensor) -> torch.Tensor:
    s = 1 / (1 + torch.exp(-x))
    return s * (1 - s)


def _tanh_derivative(module: "Tanh", x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(x)
    return 1 - t * t


def _threshold_derivative(module: "Threshold", x: torch.Tensor) -> torch.Tensor:
    return (x > module.threshold).to(x.dtype)


# --- the modules -------------------------------------------------------------

@_register(
    "gelu",
    formula=r"\text{GELU}(x) = x \cdot \Phi(x)"
            r"\quad\text{or, approximate='tanh':}\quad"
            r"0.5\,x\,\left(1 + \tanh\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)",
    derivative=_gelu_derivative,
)
class GELU(nn.Module):
    """Gaussian Error Linear Unit: x·Φ(x), Φ the standard normal CDF.

    Args:
        approximate: the GELU approximation: 'none' (exact, with erf) or
            'tanh' (0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))).

    Shape:
        Input (*), any number of dimensions; output (*), same shape.
    """

    def __init__(self, approximate: Literal["none", "tanh"] = "none") -> None:
        super().__init__()
        check_arguments(GELU, "GELU", approximate=approximate)
        self.approximate = approximate

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(_check_tensor(self, input, floating=True), approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


@_register(
    "prelu",
    formula=r"\text{PReLU}(x) = \max(0, x) + a \cdot \min(0, x)",
    derivative=_prelu_derivative,
    memory=_prelu_memory,
)
class PReLU(nn.Module):
    """Parametric ReLU: max(0, x) + a·min(0, x) with a learnable slope a.

    Args:
        num_parameters: number of slopes a to learn: 1 (shared by all
            channels) or the number of channels of the input (dim 1).
        init: the initial value of every slope a, PReLU's slope for x < 0.
        device: device of the weight.
        dtype: dtype of the weight.

    Shape:
        Input (*), channels on dim 1; an input of fewer than 2 dims has one
        channel. Output (*), same shape.

    Attributes:
        weight: the learnable slopes, shape (num_parameters,).
    """

    def __init__(self, num_parameters: Annotated[int, Range(1, None)] = 1, init: float = 0.25,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_arguments(PReLU, "PReLU", num_parameters=num_parameters, init=init, device=device, dtype=dtype)
        weight_dtype = dtype if dtype is not None else torch.get_default_dtype()
        if not weight_dtype.is_floating_point:  # (torch: "Only Tensors of floating point ... can require gradients")
            raise TypeError(f"PReLU: dtype={weight_dtype} cannot hold its learnable slopes: the weight needs a "
                            "floating-point dtype, such as torch.float32 (the default) or torch.float64.")
        if device is not None:
            _check_device(device)
        if weight_dtype.is_floating_point and not abs(init) <= torch.finfo(weight_dtype).max:
            raise ValueError(f"PReLU: init={init!r} does not fit the {weight_dtype} weight it fills: it must lie "
                             f"within ±{torch.finfo(weight_dtype).max:.4g} (or pass a wider dtype).")
        self.num_parameters = num_parameters
        self.init = init
        self.weight = nn.Parameter(torch.empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.init)

    def _broadcast_weight(self, x: torch.Tensor) -> torch.Tensor:
        """The weight shaped to broadcast against x along its channel dim."""
        if self.num_parameters == 1 or x.dim() < 2:
            return self.weight
        return self.weight.view(1, -1, *([1] * (x.dim() - 2)))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = _check_tensor(self, input, floating=True)
        if x.dtype != self.weight.dtype:
            raise TypeError(
                f"PReLU's weight is {self.weight.dtype}, the input {x.dtype}: they must match. Convert the input "
                f"(x.to({self.weight.dtype})) or the module (.to({x.dtype}), or build it with dtype={x.dtype})."
            )
        channels = x.shape[1] if x.dim() >= 2 else 1
        if self.num_parameters != 1 and channels != self.num_parameters:
            raise ValueError(
                f"PReLU(num_parameters={self.num_parameters}) got an input of shape {tuple(x.shape)} "
                f"with {channels} channel(s) on dim 1 (inputs of fewer than 2 dims have 1). "
                + (f"Use PReLU(num_parameters={channels}) or PReLU(num_parameters=1)." if channels != 1
                   else "Use PReLU(num_parameters=1).")
            )
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


@_register("relu", formula=r"\text{ReLU}(x) = (x)^+ = \max(0, x)", derivative=_relu_derivative)
class ReLU(nn.Module):
    """Rectified Linear Unit: max(0, x).

    Args:
        inplace: write the result into the input tensor.

    Shape:
        Input (*), any number of dimensions; output (*), same shape.
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        check_arguments(ReLU, "ReLU", inplace=inplace)
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(_check_tensor(self, input, floating=False, real=True), inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


@_register(
    "sigmoid",
    formula=r"\text{Sigmoid}(x) = \sigma(x) = \frac{1}{1 + \exp(-x)}",
    derivative=_sigmoid_derivative,
)
class Sigmoid(nn.Module):
    """Logistic sigmoid: 1 / (1 + exp(-x)).

    Shape:
        Input (*), any number of dimensions; output (*), same shape.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(_check_tensor(self, input, floating=False))


@_register(
    "tanh",
    formula=r"\text{Tanh}(x) = \tanh(x) = \frac{\exp(x) - \exp(-x)}{\exp(x) + \exp(-x)}",
    derivative=_tanh_derivative,
)
class Tanh(nn.Module):
    """Hyperbolic tangent: (exp(x) - exp(-x)) / (exp(x) + exp(-x)).

    Shape:
        Input (*), any number of dimensions; output (*), same shape.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.tanh(_check_tensor(self, input, floating=False))


@_register(
    "threshold",
    formula=r"y = \begin{cases} x, & \text{if } x > \text{threshold} \\ \text{value}, & \text{otherwise} \end{cases}",
    derivative=_threshold_derivative,
    # The specification's example, Threshold(0, 0.5), so the model builds with defaults.
    defaults={"threshold": 0.0, "value": 0.5},
)
class Threshold(nn.Module):
    """Thresholds each element: x where x > threshold, else value.

    Args:
        threshold: the value to threshold at.
        value: the value to replace with.
        inplace: write the result into the input tensor.

    Shape:
        Input (*), any number of dimensions; output (*), same shape.
    """

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        check_arguments(Threshold, "Threshold", threshold=threshold, value=value, inplace=inplace)
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.threshold(_check_tensor(self, input, floating=False, real=True), self.threshold, self.value,
                           self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"threshold={self.threshold}, value={self.value}{inplace}"
