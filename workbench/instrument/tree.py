"""Walking structured module outputs: tuples, lists, dicts, namedtuples, dataclasses, TensorDicts.

Each tensor leaf gets a dotted name under a prefix: ``out`` for a plain
tensor, ``out.0`` / ``out.1.0`` for LSTM's ``(out, (h, c))``, ``out.value``
for a dict or a namedtuple field, ``out.a.b`` for a nested TensorDict key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["tensor_leaves", "map_tensors", "shape_of", "MAX_DEPTH"]

MAX_DEPTH = 32  # levels of nesting walked into an output


def _is_tensordict(obj: Any) -> bool:
    # duck-typed so that tensordict stays an optional dependency
    return hasattr(obj, "batch_size") and hasattr(obj, "items") and hasattr(obj, "set")


def _children(obj: Any) -> Iterator[tuple[str, Any]] | None:
    if isinstance(obj, Mapping) or _is_tensordict(obj):
        return ((str(k), v) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return zip(obj._fields, obj)
    if isinstance(obj, (tuple, list)):
        return ((str(i), v) for i, v in enumerate(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return None


def tensor_leaves(obj: Any, prefix: str = "out", _depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor inside ``obj``, depth first, in order.

    Raises:
        ValueError: ``obj`` is nested deeper than :data:`MAX_DEPTH` (the watch keeps it in
            ``errors``: never silently not recorded).
    """
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    if _depth > MAX_DEPTH:  # (a self-referencing structure never ends)
        raise ValueError(f"the output is nested deeper than {MAX_DEPTH} levels at {prefix!r} (a structure that "
                         "contains itself?); its tensors are not recorded. Exclude this module with "
                         "watch(..., exclude=...) or return a flatter structure.")
    children = _children(obj)
    if children is not None:
        for key, value in children:
            yield from tensor_leaves(value, f"{prefix}.{key}", _depth + 1)


def shape_of(tensor: torch.Tensor) -> tuple[int | str, ...]:
    """The shape as a plain tuple (not ``torch.Size``, which the garbage collector tracks); a
    nested tensor's ragged dimensions, which have no single size, are ``"*"``."""
    if not tensor.is_nested:
        return tuple(tensor.shape)
    shape: list[int | str] = []
    for dim in range(tensor.dim()):
        try:
            size = tensor.size(dim)
        except RuntimeError:  # a strided nested tensor's ragged dimension
            size = "*"
        shape.append(size if type(size) is int else "*")  # a jagged one's is a symbolic int
    return tuple(shape)


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor leaf, the structure rebuilt around the results."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if _is_tensordict(obj):
        return obj.apply(fn)
    if isinstance(obj, Mapping):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj
