"""Parameter metadata derived from signatures and config dataclasses.

The registry and the experiments describe their parameters once, in the
signature of a builder (or a config dataclass) with type annotations and a
Google-style docstring. Everything else - the UI forms, the parameter tables,
validation of overrides - is derived from that here, so nothing is written
twice.

Ranges and other constraints ride along in ``typing.Annotated``::

    def mlp(width: Annotated[int, Range(1, 4096)] = 32): ...
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import torch

__all__ = ["Range", "Choices", "ParamInfo", "params_of", "validate_overrides", "type_name", "check_value"]

_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Range:
    """Inclusive numeric bounds for a parameter, used inside ``Annotated``.

    Args:
        low: smallest allowed value, or ``None`` for unbounded.
        high: largest allowed value, or ``None`` for unbounded.
    """

    low: float | None = None
    high: float | None = None

    def __contains__(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"[{low}, {high}]"


class Choices(Sequence):
    """Allowed values computed when asked, used inside ``Annotated``.

    For choices that can grow after import, e.g. every registered activation:
    ``Annotated[str, Choices(lambda: list_models(family="activation"))]``.
    """

    def __init__(self, source: Callable[[], Sequence[Any]]) -> None:
        self.source = source

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(self.source())[index]

    def __len__(self) -> int:
        return len(tuple(self.source()))

    def __repr__(self) -> str:
        return f"Choices({list(self)!r})"


@dataclass(frozen=True)
class ParamInfo:
    """What a user can set on a model or experiment.

    Attributes:
        name: keyword argument name.
        annotation: the type annotation with ``Annotated`` metadata stripped.
        default: the default value, or ``inspect.Parameter.empty`` if required.
        choices: the allowed values (``Literal`` annotations or a ``Choices``
            marker), else ``None``.
        range: numeric bounds, else ``None``.
        help: one-paragraph help text taken from the docstring's ``Args:``.
    """

    name: str
    annotation: Any
    default: Any = _EMPTY
    choices: Sequence[Any] | None = None
    range: Range | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _EMPTY

    @property
    def type_name(self) -> str:
        return type_name(self.annotation)

    @property
    def kind(self) -> str:
        """A coarse widget kind for UIs: bool, int, float, str, choice, list, other."""
        if self.choices is not None:
            return "choice"
        base = _strip_optional(self.annotation)
        if base is bool:
            return "bool"
        if base is int:
            return "int"
        if base is float:
            return "float"
        if base is str:
            return "str"
        origin = typing.get_origin(base)
        if origin in (list, tuple, Sequence, typing.Sequence) or base in (list, tuple):
            args = [a for a in typing.get_args(base) if a is not Ellipsis]
            if all(a in (int, float) for a in args):
                return "list"
        return "other"

    @property
    def item_type(self) -> Any:
        """The element type of a list parameter (``float`` when unannotated)."""
        args = [a for a in typing.get_args(_strip_optional(self.annotation)) if a is not Ellipsis]
        return args[0] if args else float

    @property
    def nullable(self) -> bool:
        return _is_optional(self.annotation)

    def describe(self) -> str:
        """``name: type = default`` as shown in error messages."""
        default = "required" if self.required else f"default {self.default!r}"
        extra = f", one of {list(self.choices)}" if self.choices else ""
        extra += f", range {self.range}" if self.range else ""
        return f"{self.name} ({self.type_name}, {default}{extra})"


def type_name(annotation: Any) -> str:
    """Readable name of a type annotation, e.g. ``list[int] | None``."""
    if annotation is _EMPTY or annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__qualname__ if annotation.__module__ == "builtins" else (
            f"{annotation.__module__.split('.')[0]}.{annotation.__qualname__}"
        )
    return str(annotation)


def _is_optional(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)


def _strip_optional(annotation: Any) -> Any:
    if _is_optional(annotation):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _docstring_args(obj: Any) -> dict[str, str]:
    """Parse the ``Args:`` section of a Google-style docstring."""
    doc = inspect.getdoc(obj) or ""
    match = re.search(r"^(Args|Attributes):\s*$(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    if not match:
        return {}
    out: dict[str, str] = {}
    name = None
    for line in match.group(2).splitlines():
        item = re.match(r"^\s{2,4}(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if item:
            name = item.group(1).lstrip("*")
            out[name] = item.group(2).strip()
        elif name and line.strip():
            out[name] += " " + line.strip()
    return out


def params_of(obj: Callable[..., Any] | type, defaults: Mapping[str, Any] | None = None) -> tuple[ParamInfo, ...]:
    """Derive parameter metadata from a function, a class or a dataclass.

    Args:
        obj: a builder function, an ``nn.Module`` class (its ``__init__``) or a
            config dataclass.
        defaults: defaults that replace the signature's (or supply one where
            it has none), so that one class can be registered under several
            configurations and "build with defaults" is always possible.

    Returns:
        One ``ParamInfo`` per keyword parameter, in signature order.
    """
    defaults = dict(defaults or {})
    if dataclasses.is_dataclass(obj):
        hints = typing.get_type_hints(obj, include_extras=True)
        fields = [(f.name, hints[f.name], _field_default(f)) for f in dataclasses.fields(obj) if f.init]
        helps = _docstring_args(obj)
    else:
        target = obj.__init__ if isinstance(obj, type) else obj
        sig = inspect.signature(target)
        hints = typing.get_type_hints(target, include_extras=True)
        fields = [
            (p.name, hints.get(p.name, _EMPTY), p.default)
            for p in sig.parameters.values()
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        helps = {**_docstring_args(target), **_docstring_args(obj)} if isinstance(obj, type) else _docstring_args(obj)
    infos = []
    for name, hint, default in fields:
        annotation, meta = hint, []
        if typing.get_origin(hint) is typing.Annotated:
            annotation, *meta = typing.get_args(hint)
        rng = next((m for m in meta if isinstance(m, Range)), None)
        choices = next((m for m in meta if isinstance(m, Choices)), None)
        base = _strip_optional(annotation)
        if typing.get_origin(base) is Literal:
            choices = tuple(typing.get_args(base))
        if name in defaults:
            default = defaults[name]
        infos.append(ParamInfo(name, annotation, default, choices, rng, helps.get(name, "")))
    return tuple(infos)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _EMPTY


def check_value(info: ParamInfo, value: Any, owner: str) -> Any:
    """Check one value against its metadata and return it (lists normalized).

    Raises:
        TypeError: the value has the wrong type.
        ValueError: the value is outside its choices or range.
    """
    if not _matches(value, info.annotation):
        raise TypeError(
            f"{owner}: parameter {info.name!r} expects {info.type_name}, got {value!r} "
            f"({type(value).__name__}). Pass a value of type {info.type_name}."
        )
    if info.choices is not None and value is not None and value not in info.choices:
        raise ValueError(f"{owner}: parameter {info.name!r} must be one of {list(info.choices)}, got {value!r}.")
    if info.range is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if value not in info.range:
            raise ValueError(f"{owner}: parameter {info.name!r} must lie in {info.range}, got {value!r}.")
    if isinstance(value, tuple) and typing.get_origin(_strip_optional(info.annotation)) is list:
        value = list(value)
    return value


def _matches(value: Any, annotation: Any) -> bool:
    """A small runtime type check covering the annotations our specs use."""
    if annotation is _EMPTY or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _matches(value, typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(annotation))
    if origin is Literal:  # the type here; membership is checked as a choice (ValueError)
        return any(type(value) is type(a) for a in typing.get_args(annotation))
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple, Sequence, typing.Sequence) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return all(_matches(v, args[0]) for v in value) if len(args) == 1 or (args and origin is not tuple) else True
    if annotation is torch.dtype:
        return isinstance(value, torch.dtype)
    if annotation is torch.device:
        return isinstance(value, (torch.device, str))
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def validate_overrides(params: Sequence[ParamInfo], overrides: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Check keyword overrides against metadata; unknown names are an error.

    Args:
        params: the metadata of every accepted parameter.
        overrides: what the user passed.
        owner: how to name the model or experiment in messages.

    Returns:
        The overrides, checked (tuples given for lists become lists).

    Raises:
        TypeError: an unknown parameter, or a value of the wrong type.
        ValueError: a value outside its choices or range.
    """
    by_name = {p.name: p for p in params}
    checked = {}
    for key, value in overrides.items():
        if key not in by_name:
            valid = "\n  ".join(p.describe() for p in params) or "(none)"
            raise TypeError(f"{owner} has no parameter {key!r}. Valid parameters:\n  {valid}")
        checked[key] = check_value(by_name[key], value, owner)
    return checked

