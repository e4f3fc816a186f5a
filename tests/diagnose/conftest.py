"""Deliberately broken trainings of registered models on small synthetic data (see test_broken.py)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from tests.diagnose.runs import one_step


def mlp(activation: str = "relu", depth: int = 2, width: int = 32, weight_scale: float = 1.0,
        seed: int = 0) -> nn.Module:
    """The registry's ``mlp`` (2 inputs, 2 classes), its linear weights scaled by ``weight_scale``."""
    torch.manual_seed(seed)
    model = workbench.create_model("mlp", in_features=2, num_classes=2, width=width, depth=depth, activation=activation)
    with torch.no_grad():
        for layer in model.layers:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(weight_scale)
    return model


def train(model: nn.Module, steps: int = 8, lr: float = 1e-2, optimizer: str = "adam", patch=None,
          spike_at: int | None = None, seed: int = 0, **watch_options) -> workbench.Watch:
    """Train ``model`` on a two-class problem (x ~ N(0, 1) in 2-D, label x0 > 0) under a watch;
    ``patch``: (path, fn) applied through ``w.patch``; ``spike_at``: that step's batch scaled by 100."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 2, generator=g)
    y = (x[:, 0] > 0).long()
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=lr)
    with workbench.watch(model, **watch_options) as w:
        if patch is not None:
            w.patch(*patch)
        for step in range(1, steps + 1):
            idx = torch.randint(256, (64,), generator=g)
            xb = x[idx] * (100.0 if step == spike_at else 1.0)
            loss = F.cross_entropy(model(xb), y[idx])
            one_step(w, opt, loss)
    return w


def has_updates() -> bool:
    """Whether watch() records parameter updates (the ``update`` kind)."""
    return "updates" in inspect.signature(workbench.watch).parameters


needs_updates = pytest.mark.skipif(not has_updates(), reason="watch(..., updates=True) is not in this tree yet")
