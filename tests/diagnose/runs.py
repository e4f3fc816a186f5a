"""Trainings the diagnosis tests share: a plain training loop, and the runs several tests read."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import workbench


def one_step(w: workbench.Watch, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """The rest of a training step once its loss is computed: ``opt.zero_grad()``, the loss's backward,
    ``opt.step()`` and ``w.step(loss=...)``."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    w.step(loss=loss.item())


def fit_steps(model: nn.Module, opt: torch.optim.Optimizer, batch: Callable[[int], tuple], steps: int,
              loss_fn: Callable = F.cross_entropy, before_step: Callable[[int], Any] | None = None,
              zero_grad: bool = True, **watch_options: Any) -> workbench.Watch:
    """``steps`` steps of the usual loop under a watch: the loss of ``batch(step)`` (inputs, targets; steps count
    from 1), ``opt.zero_grad()`` (``zero_grad=False``: forgotten, the gradients summed over the steps), its
    backward, ``opt.step()``, ``w.step(loss=...)``; ``before_step(step)`` first where given (a learning rate
    changed, a layer broken)."""
    with workbench.watch(model, **watch_options) as w:
        for step in range(1, steps + 1):
            if before_step is not None:
                before_step(step)
            inputs, targets = batch(step)
            loss = loss_fn(model(inputs), targets)
            if zero_grad:
                one_step(w, opt, loss)
            else:  # (the gradients summed over the steps)
                loss.backward()
                opt.step()
                w.step(loss=loss.item())
    return w


def mlp_on_halves(lr: float | Callable[[int], float], steps: int = 40, batch: int = 256,
                  **options: Any) -> workbench.Watch:
    """The registry's ReLU ``mlp`` (2 inputs, 2 classes, 32 wide, 2 deep) under SGD at ``lr`` (or ``lr(step)``, set
    before each step) on batches of ``batch`` of 1024 points labelled by the sign of their first coordinate;
    ``options``: :func:`fit_steps`' (``zero_grad``, ``loss_fn``) and the watch's."""
    torch.manual_seed(0)
    model = workbench.create_model("mlp", in_features=2, num_classes=2, width=32, depth=2, activation="relu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)
    y = (x[:, 0] > 0).long()

    def batch_of(_step: int) -> tuple:
        i = torch.randint(1024, (batch,), generator=g)
        return x[i], y[i]

    opt = torch.optim.SGD(model.parameters(), lr=lr(1) if callable(lr) else lr)

    def schedule(step: int) -> None:
        for group in opt.param_groups:
            group["lr"] = lr(step)

    return fit_steps(model, opt, batch_of, steps, before_step=schedule if callable(lr) else None, **options)


def diverging_mlp(**watch_options: Any) -> workbench.Watch:
    """:func:`mlp_on_halves` at a learning rate of 10 for 40 steps, recorded with its updates: thrown out at step 1
    (its update ratios), its ReLUs killed, its loss spiking. ``watch_options``: more of the watch's (``store=``)."""
    return mlp_on_halves(10.0, updates=True, **watch_options)


def shifted_mlp(activation: type[nn.Module], shift: float, steps: int = 30, **watch_options: Any) -> workbench.Watch:
    """``Linear(2, 32)``, ``activation()``, ``Linear(32, 2)`` with the first bias lowered by ``shift`` (every unit's
    input below ~-``shift`` + 2 for the data), under SGD at 0.1 for ``steps`` steps of batches of 256 of 1024 points
    labelled by the sign of their first coordinate; ``watch_options``: the watch's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), activation(), nn.Linear(32, 2))
    with torch.no_grad():
        model[0].bias.sub_(shift)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)
    y = (x[:, 0] > 0).long()

    def batch_of(_step: int) -> tuple:
        i = torch.randint(1024, (256,), generator=g)
        return x[i], y[i]

    return fit_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_of, steps, **watch_options)
