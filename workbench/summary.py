"""The module tree of a model with parameter counts and output shapes.

``summarize(model, inputs)`` runs one forward pass with temporary forward
hooks (removed in ``finally``, also when the forward raises) and returns one
row per submodule: its path, type, parameter counts and the shape of what it
returned. A module called several times in the pass (a shared activation)
lists each distinct shape with its call count.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pandas as pd
import torch
from torch import nn

__all__ = ["summarize", "describe_shape"]


def describe_shape(value: Any) -> str:
    """A compact shape string for a tensor or a structure of tensors.

    ``(2, 3)`` for a tensor, ``((2, 3), ((1, 2, 8), (1, 2, 8)))`` for nested
    tuples, ``{value: (2, 1)}`` for dicts, the type name for anything else.
    """
    if isinstance(value, torch.Tensor):
        return "(" + ", ".join(str(s) for s in value.shape) + ")"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(describe_shape(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe_shape(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "batch_size") and hasattr(value, "keys"):  # a TensorDict
        return f"TensorDict{describe_shape(torch.empty(tuple(value.batch_size)))}"
    return type(value).__name__


def _count(params) -> int:
    return sum(p.numel() for p in params)


def summarize(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per submodule (the root first), in registration order.

    Args:
        model: any module.
        inputs: ``(args, kwargs)`` for one forward pass; without them the
            ``output`` column is empty.

    Returns:
        A DataFrame with columns ``module`` (dotted path, ``""`` for the
        root), ``depth``, ``type``, ``params`` (all parameters below, each
        counted once), ``trainable``, ``calls`` (in the forward pass) and
        ``output`` (shape, or shapes with call counts).
    """
    shapes: dict[str, dict[str, int]] = defaultdict(dict)
    calls: dict[str, int] = defaultdict(int)
    handles = []
    names = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)

    def make_hook(module_id: int):
        def hook(module, args, output):
            # One object may sit at several paths; the pass cannot tell which was used.
            for name in names[module_id]:
                calls[name] += 1
                desc = describe_shape(output)
                shapes[name][desc] = shapes[name].get(desc, 0) + 1
        return hook

    try:
        for module in model.modules():  # each object once, however many paths reach it
            handles.append(module.register_forward_hook(make_hook(id(module))))
        if inputs is not None:
            args, kwargs = inputs
            with torch.no_grad():
                model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()

    rows = []
    for name, module in model.named_modules(remove_duplicate=False):
        seen = shapes.get(name, {})
        if inputs is None:
            output = ""
        elif not seen:
            output = "not called"
        else:
            output = "; ".join(s if n == 1 else f"{s} ×{n}" for s, n in seen.items())
        rows.append({
            "module": name,
            "depth": 0 if name == "" else name.count(".") + 1,
            "type": type(module).__name__,
            "params": _count(module.parameters()),
            "trainable": _count(p for p in module.parameters() if p.requires_grad),
            "calls": calls.get(name, 0),
            "output": output,
        })
    return pd.DataFrame(rows, columns=["module", "depth", "type", "params", "trainable", "calls", "output"])
