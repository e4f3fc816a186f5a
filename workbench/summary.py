"""The module tree of a model with parameter counts and output shapes.

``summarize(model, inputs)`` runs one forward pass with temporary forward
hooks (removed in ``finally``, also when the forward raises) and returns one
row per submodule: its path, type, parameter counts and the shape of what it
returned. Each call is credited to the path it was made through (the module
that was running when it was called owns it): a shared activation object that
sits at several paths lists, at each path, only the calls made there.
``summarize(model, inputs, per_call=True)`` gives one row per call.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

import pandas as pd
import torch
from torch import nn

__all__ = ["summarize", "describe_shape"]


def describe_shape(value: Any) -> str:
    """A compact shape string for a tensor or a structure of tensors.

    Args:
        value: a tensor, or tuples, lists and dicts of them.

    Returns:
        ``(2, 3)`` for a tensor, ``((2, 3), ((1, 2, 8), (1, 2, 8)))`` for nested
        tuples, ``{value: (2, 1)}`` for dicts, the type name for anything else.

    Examples:
        >>> import torch
        >>> from workbench.summary import describe_shape
        >>> describe_shape((torch.zeros(2, 3), {"h": torch.zeros(1, 2)}))
        '((2, 3), {h: (1, 2)})'
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


def _note_where(error: Exception, failed_in: dict[int, tuple[BaseException, str, Any]], model: nn.Module,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add a note to the error a forward pass raised: the module it failed in, with that module's input shapes,
    and the model's inputs (the error itself, a mis-shaped input's, seldom names either)."""
    given = _shapes(args) + (f" and keyword inputs {describe_shape(kwargs)}" if kwargs else "")
    seen, path, module_args = failed_in.get(id(error), (None, None, None))
    where = f"the forward pass of {type(model).__name__} failed"
    if seen is error and path:
        module = model.get_submodule(path)
        error.add_note(f"summarize: {where} in module {path!r} ({type(module).__name__}), whose inputs had shapes "
                       f"{_shapes(module_args)}; the model was given inputs of shapes {given}.")
    else:  # (in the model's own forward, outside its submodules)
        error.add_note(f"summarize: {where} in its own forward, given inputs of shapes {given}.")


def _shapes(args: tuple[Any, ...]) -> str:
    """The shapes of a call's positional inputs, one after the other: ``(3, 5), (2)``."""
    return ", ".join(describe_shape(arg) for arg in args) or "(none)"


def _resolve(candidates: list[str], parent: str | None, used: set[str]) -> str:
    """The path through which a module reachable at ``candidates`` was called from the module
    running at ``parent`` (None: no module is running).

    Its child there if it is one: the first such child not yet called in this call of the
    parent (a Sequential holding one object at two indices calls it once at each), else the
    first; failing that, the shortest path under ``parent``; else the first path.
    """
    if parent is None:
        return "" if "" in candidates else candidates[0]
    prefix = parent + "." if parent else ""
    children = [c for c in candidates if c.startswith(prefix) and "." not in c[len(prefix):]]
    if children:
        return next((c for c in children if c not in used), children[0])
    below = [c for c in candidates if c.startswith(prefix)]
    return min(below, key=len) if below else candidates[0]


def summarize(model: nn.Module, inputs: torch.Tensor | tuple[tuple[Any, ...], dict[str, Any]] | None = None,
              per_call: bool = False) -> pd.DataFrame:
    """One row per submodule (the root first), in registration order.

    Args:
        model: any module.
        inputs: one forward pass's input: a tensor (``model(x)``), a tuple of tensors
            (``model(*inputs)``), or ``(args, kwargs)`` (``model(*args, **kwargs)``, as
            ``spec.example_inputs`` gives); without them the ``output`` column is empty.
        per_call: one row per call instead: a path called ``k > 1`` times in
            the pass gets ``k`` rows (``call`` 0 to k-1), each with its own
            output shape.

    Returns:
        A DataFrame with columns ``module`` (dotted path, ``""`` for the
        root), ``depth``, ``type``, ``params`` (all parameters below, each
        counted once), ``trainable``, ``calls`` (through this path, in the
        forward pass) and ``output`` (shape, or shapes with call counts); with
        ``per_call``, a ``call`` column after ``module`` and one shape each.

    Raises:
        TypeError: ``model`` is not a module, ``per_call`` is not a bool, or ``inputs`` is neither a tensor
            nor ``(args, kwargs)``.
        Exception: what the forward pass raised (a mis-shaped input's ``RuntimeError``), as it was, with a
            note naming the module it failed in, the input shapes that module got and the model's inputs.

    Examples:
        >>> import workbench
        >>> model = workbench.create_model("mlp", depth=1, width=4)
        >>> print(workbench.summarize(model, workbench.get_spec("mlp").example_inputs(model, 2)).to_string())
             module  depth        type  params  trainable  calls  output
        0                0         MLP      22         22      1  (2, 2)
        1    layers      1  Sequential      22         22      1  (2, 2)
        2  layers.0      2      Linear      12         12      1  (2, 4)
        3  layers.1      2        GELU       0          0      1  (2, 4)
        4  layers.2      2      Linear      10         10      1  (2, 2)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"summarize: model must be a torch.nn.Module, got {type(model).__name__} {model!r:.80}.")
    if not isinstance(per_call, bool):
        raise TypeError(f"summarize: per_call must be True or False, got {per_call!r}.")
    if isinstance(inputs, torch.Tensor):
        inputs = ((inputs,), {})
    elif isinstance(inputs, (tuple, list)) and inputs and all(isinstance(x, torch.Tensor) for x in inputs):
        inputs = (tuple(inputs), {})  # (a tuple of tensors: the positional inputs, model(*inputs))
    elif inputs is not None and not (isinstance(inputs, (tuple, list)) and len(inputs) == 2
                                     and isinstance(inputs[0], (tuple, list)) and isinstance(inputs[1], dict)):
        got = f"a {type(inputs).__name__}" + (f" of {len(inputs)}" if isinstance(inputs, (tuple, list)) else "")
        raise TypeError(f"summarize: inputs must be a tensor (summarize(model, x)), a tuple of tensors "
                        f"(summarize(model, (x, y))) or (args, kwargs) (summarize(model, ((x, y), {{'mask': m}}))), "
                        f"got {got}.")
    outputs: dict[str, list[str]] = defaultdict(list)  # path -> the shape of each call made through it
    handles = []
    names: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)
    # the calls in progress, innermost last: (path, the paths of the children it has called)
    running: list[tuple[str, set[str]]] = []
    # the error a forward raised -> (the error, the innermost module it passed through and that module's inputs);
    # the first always-called hook to see an error in flight is the innermost module's, as torch unwinds the calls
    failed_in: dict[int, tuple[BaseException, str, Any]] = {}

    def pre_hook(module, args):
        parent, used = running[-1] if running else (None, set())
        path = _resolve(names[id(module)], parent, used)
        used.add(path)
        running.append((path, set()))

    def hook(module, args, output):
        path = running.pop()[0] if running else _resolve(names[id(module)], None, set())
        error = sys.exc_info()[1]
        if error is not None:
            failed_in.setdefault(id(error), (error, path, args))
        outputs[path].append(describe_shape(output))

    try:
        for module in model.modules():  # each object once, however many paths reach it
            handles.append(module.register_forward_pre_hook(pre_hook))
            handles.append(module.register_forward_hook(hook, always_call=True))
        if inputs is not None:
            args, kwargs = inputs
            with torch.no_grad():
                try:
                    model(*args, **kwargs)
                except Exception as error:
                    _note_where(error, failed_in, model, args, kwargs)
                    raise
    finally:
        for handle in handles:
            handle.remove()

    rows = []
    for name, module in model.named_modules(remove_duplicate=False):
        seen = outputs.get(name, [])
        row = {
            "module": name,
            "depth": 0 if name == "" else name.count(".") + 1,
            "type": type(module).__name__,
            "params": _count(module.parameters()),
            "trainable": _count(p for p in module.parameters() if p.requires_grad),
            "calls": len(seen),
        }
        if per_call and len(seen) > 1:
            rows.extend({**row, "call": i, "output": shape} for i, shape in enumerate(seen))
            continue
        if inputs is None:
            output = ""
        elif not seen:
            output = "not called"
        else:
            counted: dict[str, int] = {}
            for shape in seen:
                counted[shape] = counted.get(shape, 0) + 1
            output = "; ".join(s if n == 1 else f"{s} ×{n}" for s, n in counted.items())
        rows.append({**row, "call": 0 if seen else None, "output": output})
    columns = ["module", "depth", "type", "params", "trainable", "calls", "output"]
    if per_call:
        columns.insert(1, "call")
        return pd.DataFrame(rows, columns=columns).astype({"call": "Int64"})
    return pd.DataFrame(rows, columns=columns)
