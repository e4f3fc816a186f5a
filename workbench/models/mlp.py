"""A plain MLP whose hidden activation is any registered activation."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import nn

from workbench.params import Choices, Range
from workbench.registry import create_model, get_spec, list_models, register_model

__all__ = ["MLP"]

ActivationName = Annotated[str, Choices(lambda: list_models(family="activation"))]


class MLP(nn.Module):
    """Linear -> activation, ``depth`` times, then a linear read-out.

    Each hidden layer gets its own activation instance (a PReLU's slope is
    per layer), so the tree reads ``layers.1``, ``layers.3`` ...

    Args:
        in_features: size of each input vector.
        num_classes: number of output logits.
        width: hidden units per layer.
        depth: number of hidden layers.
        activation: registry name of the hidden activation.

    Shape:
        Input (B, in_features); output (B, num_classes) logits.
    """

    def __init__(self, in_features: int, num_classes: int, width: int, depth: int, activation: str) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size = in_features
        for _ in range(depth):
            layers += [nn.Linear(size, width), create_model(activation)]
            size = width
        layers.append(nn.Linear(size, num_classes))
        self.layers = nn.Sequential(*layers)
        self.in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MLP expects a torch.Tensor of shape (B, {self.in_features}), got {type(x).__name__}.")
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"MLP expects input of shape (B, {self.in_features}), got {tuple(x.shape)}."
            )
        weight = self.layers._modules["0"].weight
        if x.dtype != weight.dtype:
            raise TypeError(f"MLP's weights are {weight.dtype}, the input {x.dtype}: they must match. Convert the "
                            f"input (x.to({weight.dtype})) or the model (model.to({x.dtype})).")
        if x.device != weight.device:
            raise ValueError(f"MLP's weights are on {weight.device}, the input on {x.device}. Move the input "
                             f"(x.to('{weight.device}')) or the model (model.to('{x.device}')).")
        return self.layers(x)  # (B, num_classes)


def _example_inputs(model: MLP, batch_size: int, generator: torch.Generator | None = None):
    return (torch.randn(batch_size, model.in_features, generator=generator),), {}


def _objective(model: MLP, inputs, logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class 0: any fixed target gives real gradients."""
    return nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


def _memory(in_features: int, num_classes: int, width: int, depth: int, activation: str) -> int | None:
    """Bytes of the parameters: the linear layers' weights and biases and each layer's activation."""
    linear = (in_features + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * num_classes
    per_activation = get_spec(activation).estimate_memory()
    if per_activation is None:
        return None
    return linear * torch.get_default_dtype().itemsize + depth * per_activation


@register_model("mlp", family="mlp", example_inputs=_example_inputs, objective=_objective, memory=_memory)
def mlp(
    in_features: Annotated[int, Range(1, 4096)] = 2,
    num_classes: Annotated[int, Range(1, 4096)] = 2,
    width: Annotated[int, Range(1, 4096)] = 32,
    depth: Annotated[int, Range(1, 32)] = 2,
    activation: ActivationName = "gelu",
) -> MLP:
    """MLP classifier with a registered hidden activation.

    Args:
        in_features: size of each input vector.
        num_classes: number of output logits.
        width: hidden units per layer.
        depth: number of hidden layers.
        activation: registry name of the hidden activation (family 'activation').
    """
    return MLP(in_features, num_classes, width, depth, activation)
