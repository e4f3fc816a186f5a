"""A plain MLP whose hidden activation is any registered activation."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import nn

from workbench.params import Choices, Range
from workbench.registry import create_model, list_models, register_model

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
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"MLP expects input of shape (B, {self.in_features}), got {tuple(x.shape)}."
            )
        return self.layers(x)  # (B, num_classes)


def _example_inputs(model: MLP, batch_size: int, generator: torch.Generator | None = None):
    return (torch.randn(batch_size, model.in_features, generator=generator),), {}


def _objective(model: MLP, inputs, logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class 0: any fixed target gives real gradients."""
    return nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


@register_model("mlp", family="mlp", example_inputs=_example_inputs, objective=_objective)
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
