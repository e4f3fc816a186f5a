"""``activation_mlp``: an MLP with a chosen activation classifies a 2-D toy dataset."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from workbench.experiments.base import Experiment, evaluation, register_experiment
from workbench.models.mlp import ActivationName
from workbench.params import Range
from workbench.registry import create_model, get_spec

__all__ = ["ActivationMLP", "make_dataset"]


def make_dataset(kind: str, n: int, noise: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-class 2-D dataset.

    Args:
        kind: 'spirals' (two interleaved spirals), 'moons' or 'circles'.
        n: number of points (half per class).
        noise: standard deviation of Gaussian noise added to the points.
        generator: the random source.

    Returns:
        ``x`` (n, 2) float32 and ``y`` (n,) int64 labels in {0, 1}.
    """
    half = n // 2
    y = torch.cat([torch.zeros(half), torch.ones(n - half)]).long()
    u = torch.rand(n, generator=generator)
    if kind == "spirals":
        t = torch.sqrt(u) * 3 * math.pi  # 1.5 turns, points evenly spread along the arc
        angle = t + math.pi * y
        x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) / (3 * math.pi)
    elif kind == "moons":
        t = u * math.pi
        x = torch.where(
            (y == 0)[:, None],
            torch.stack([torch.cos(t), torch.sin(t)], 1),
            torch.stack([1 - torch.cos(t), 0.5 - torch.sin(t)], 1),
        ) - torch.tensor([0.5, 0.25])
    elif kind == "circles":
        t = u * 2 * math.pi
        radius = torch.where(y == 0, 1.0, 0.5)
        x = torch.stack([torch.cos(t), torch.sin(t)], 1) * radius[:, None]
    else:
        raise ValueError(f"Unknown dataset {kind!r}; choose 'spirals', 'moons' or 'circles'.")
    x = x + noise * torch.randn(n, 2, generator=generator)
    return x.float(), y


@register_experiment("activation_mlp")
class ActivationMLP(Experiment):
    """An MLP with a chosen hidden activation learns a 2-D two-class dataset."""

    @dataclass
    class Config:
        """Configuration of ``activation_mlp``.

        Args:
            activation: registry name of the hidden activation.
            depth: number of hidden layers.
            width: hidden units per layer.
            lr: Adam learning rate.
            batch_size: points per training step.
            dataset: 'spirals', 'moons' or 'circles'.
            n_samples: size of the fixed training set.
            noise: standard deviation of the noise on the points.
        """

        activation: ActivationName = "gelu"
        depth: Annotated[int, Range(1, 16)] = 2
        width: Annotated[int, Range(1, 1024)] = 32
        lr: Annotated[float, Range(1e-6, 1.0)] = 1e-2  # Adam; spirals need a brisk rate
        batch_size: Annotated[int, Range(1, 65536)] = 128
        dataset: Literal["spirals", "moons", "circles"] = "spirals"
        n_samples: Annotated[int, Range(2, 1_000_000)] = 1024
        noise: Annotated[float, Range(0.0, 10.0)] = 0.05

    @classmethod
    def estimate_memory(cls, c: Config) -> dict[str, int] | None:
        """Parameters with their gradients and Adam's two moments; the dataset and its temporaries;
        the activations of a training step (each hidden layer's linear and activation outputs,
        kept for the backward pass, and gradients) or of :meth:`evaluate` (the whole dataset, no
        gradients), whichever is larger."""
        params = get_spec("mlp").estimate_memory(**cls._model_kwargs(c))
        if params is None:
            return None
        value = torch.get_default_dtype().itemsize
        train = c.batch_size * (2 * c.depth + 4) * c.width * value
        evaluate = c.n_samples * 3 * c.width * value
        return {"parameters": params, "gradients": params, "optimizer": 2 * params, "data": 64 * c.n_samples,
                "activations": max(train, evaluate)}

    @staticmethod
    def _model_kwargs(c: Config) -> dict:
        return dict(in_features=2, num_classes=2, width=c.width, depth=c.depth, activation=c.activation)

    def setup(self) -> None:
        c = self.config
        self.model = create_model("mlp", **self._model_kwargs(c)).to(self.device)
        self.x, self.y = self.to_device(make_dataset(c.dataset, c.n_samples, c.noise, self.generator))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=c.lr)
        # the cross-entropy of predicting the class frequencies (log 2: the classes are balanced)
        frequencies = torch.bincount(self.y.cpu(), minlength=2).double() / len(self.y)
        self.chance = {"loss": float(-(frequencies * frequencies.log()).sum())}

    def train_step(self) -> dict[str, float]:
        idx = torch.randint(len(self.x), (self.config.batch_size,), generator=self.generator).to(self.device)
        x, y = self.x[idx], self.y[idx]
        logits = self.model(x)  # (B, 2)
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        accuracy = (logits.argmax(1) == y).float().mean()
        return {"loss": loss.item(), "accuracy": accuracy.item()}

    @evaluation
    def evaluate(self) -> dict[str, float]:
        """Loss and accuracy on the whole training set (no parameter update)."""
        logits = self.model(self.x)
        return {
            "loss": F.cross_entropy(logits, self.y).item(),
            "accuracy": (logits.argmax(1) == self.y).float().mean().item(),
        }
