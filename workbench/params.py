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
import functools
import inspect
import math
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import torch

__all__ = ["Range", "Choices", "ParamInfo", "params_of", "param_info", "validate_overrides", "check_arguments",
           "type_name", "check_value", "matches", "check_seed", "SEED_MAX", "MemoryLimitError", "MEMORY_LIMIT_ENV",
           "MEMORY_FRACTION", "available_memory", "memory_limit", "check_memory", "format_bytes"]

_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Range:
    """Inclusive numeric bounds for a parameter, used inside ``Annotated``.

    A float parameter never accepts NaN, and accepts an infinity only where its
    range names it as a bound: ``Range(0, math.inf)`` takes ``inf``,
    ``Range(0, None)`` (unbounded) takes every finite value >= 0.

    Args:
        low: smallest allowed value, or ``None`` for unbounded.
        high: largest allowed value, or ``None`` for unbounded.

    Examples:
        >>> from typing import Annotated
        >>> from workbench import Range
        >>> def mlp(width: Annotated[int, Range(1, 4096)] = 32): ...
        >>> 0 in Range(1, 4096), str(Range(0, None))
        (False, '[0, inf]')
    """

    low: float | None = None
    high: float | None = None

    def __contains__(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        low = "-inf" if self.low is None else _bound(self.low)
        high = "inf" if self.high is None else _bound(self.high)
        return f"[{low}, {high}]"


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # an int bound exactly, e.g. a seed's 2**63 - 1


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
        inferred: the parameter has no annotation and its type was read from its default
            (``width=16`` takes ints, ``scale=1.0`` numbers, ``name="a"`` strings).

    Examples:
        >>> import workbench
        >>> width = next(p for p in workbench.get_spec("mlp").params if p.name == "width")
        >>> width.default, str(width.range), width.kind, width.help
        (32, '[1, 4096]', 'int', 'hidden units per layer.')
        >>> width.describe()
        'width (int, default 32, range [1, 4096])'
    """

    name: str
    annotation: Any
    default: Any = _EMPTY
    choices: Sequence[Any] | None = None
    range: Range | None = None
    help: str = ""
    inferred: bool = False

    @property
    def required(self) -> bool:
        """Whether the parameter has no default (a value must be given)."""
        return self.default is _EMPTY

    @property
    def type_name(self) -> str:
        """The annotation as shown in tables and messages (``int``, ``float | None`` ...)."""
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
        """Whether None is allowed (an ``Optional`` annotation)."""
        return _is_optional(self.annotation)

    def describe(self) -> str:
        """The parameter as error messages show it.

        Returns:
            ``name (type, default ..., one of [...], range [...])``.
        """
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
        return annotation.__qualname__ if annotation.__module__ == "builtins" else _public_path(annotation)
    return str(annotation)


def _public_path(cls: type) -> str:
    """The shortest importable dotted path of a class: ``torch.nn.Module`` (defined in
    ``torch.nn.modules.module``), ``torch.device``; its defining module's when no shorter one has it."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, cls.__qualname__.split(".")[0], None) is not None:
            found = module
            for name in cls.__qualname__.split("."):
                found = getattr(found, name, None)
            if found is cls:
                return f"{'.'.join(parts[:end])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


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
    return tuple(param_info(name, hint, defaults.get(name, default), helps.get(name, ""))
                 for name, hint, default in fields)


def param_info(name: str, hint: Any, default: Any = _EMPTY, help: str = "") -> ParamInfo:
    """One parameter's metadata from its annotation, as :func:`params_of` reads each of a signature's.

    ``Annotated`` metadata gives the range and choices, a ``Literal`` its choices.

    Args:
        name: the parameter's name, as messages show it.
        hint: its type annotation, e.g. ``Annotated[int, Range(1, None)]`` or ``float | None``.
        default: its default (``inspect.Parameter.empty``: required).
        help: its help text.

    Returns:
        The metadata, ready for :func:`check_value`.

    Examples:
        >>> from typing import Annotated
        >>> from workbench.params import Range, param_info
        >>> info = param_info("n_layer", Annotated[int, Range(1, None)])
        >>> info.type_name, str(info.range), info.required
        ('int', '[1, inf]', True)
    """
    annotation, meta = hint, []
    if typing.get_origin(hint) is typing.Annotated:
        annotation, *meta = typing.get_args(hint)
    rng = next((m for m in meta if isinstance(m, Range)), None)
    choices = next((m for m in meta if isinstance(m, Choices)), None)
    base = _strip_optional(annotation)
    if typing.get_origin(base) is Literal:
        choices = tuple(typing.get_args(base))
    inferred = annotation is _EMPTY and type(default) in (bool, int, float, str)
    if inferred:  # no annotation: the default's type (else any value would reach the builder unchecked)
        annotation = type(default)
    return ParamInfo(name, annotation, default, choices, rng, help, inferred)


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
    if not matches(value, info.annotation):
        raise TypeError(
            f"{owner}: parameter {info.name!r} expects {info.type_name}, got {value!r} "
            f"({type(value).__name__}). Pass a value of type {info.type_name}"
            + (f" (the type of its default {info.default!r}: it has no annotation; annotate it, e.g. "
               f"{info.name}: {type(value).__name__}, to take other values)." if info.inferred else ".")
        )
    if info.choices is not None and value is not None and value not in info.choices:
        raise ValueError(f"{owner}: parameter {info.name!r} must be one of {list(info.choices)}, got {value!r}.")
    if info.range is not None and matches(value, float):
        if value not in info.range:
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"{owner}: parameter {info.name!r} must be a finite number in {info.range}, "
                                 f"got nan. Pass a finite value{_default_hint(info)}.")
            raise ValueError(f"{owner}: parameter {info.name!r} must lie in {info.range}, got {value!r}.")
    for item in (value if isinstance(value, (list, tuple)) else [value]):
        if isinstance(item, float) and not math.isfinite(item) and not _allows(info.range, item):
            where = "every item of " if item is not value else ""
            raise ValueError(
                f"{owner}: parameter {info.name!r} must be a finite number, got {value!r}"
                + (f" ({where}{info.name} must be finite)" if where else "")
                + f". Pass a finite value{_default_hint(info)}."
            )
    if isinstance(value, tuple) and typing.get_origin(_strip_optional(info.annotation)) is list:
        value = list(value)
    return value


def _allows(rng: Range | None, value: float) -> bool:
    """Whether ``rng`` names this infinity as a bound (NaN is never allowed)."""
    if rng is None or math.isnan(value):
        return False
    return value == rng.low if value < 0 else value == rng.high


def _default_hint(info: ParamInfo) -> str:
    parts = []
    if info.range is not None:
        parts.append(f"in {info.range}")
    if not info.required and info.default is not None:
        parts.append(f"e.g. the default {info.default!r}")
    elif info.default is None and info.nullable:
        parts.append("or None, the default")
    return f" ({', '.join(parts)})" if parts else ""


def matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` has the type ``annotation`` names: the runtime type check of every workbench parameter.

    It covers the annotations the specs use (``int``, ``float``, ``bool``, ``str``, ``X | None``,
    ``Literal``, ``list[int]``, ``Sequence[float]``, ``torch.dtype``, classes ...). A bool is not an
    int, and not a float; an int is a float. ``Annotated`` metadata is not checked here (see
    :func:`check_value`).

    Args:
        value: any value.
        annotation: a type annotation.

    Returns:
        True when ``value`` is of that type.

    Examples:
        >>> from workbench.params import matches
        >>> matches(3, int), matches(True, int), matches(3, float), matches([1, 2], list[int])
        (True, False, True, True)
    """
    if annotation is _EMPTY or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return matches(value, typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in typing.get_args(annotation))
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
        return all(matches(v, args[0]) for v in value) if len(args) == 1 or (args and origin is not tuple) else True
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


def check_arguments(target: Callable[..., Any] | type, owner: str, **arguments: Any) -> dict[str, Any]:
    """Check arguments against the annotated signature of the function or class that takes them.

    A constructor checks its own arguments with this, by the same rules (and messages) as
    :func:`workbench.create_model` checks a registered model's overrides: the type, an ``Annotated``
    range or choices, a ``Literal``'s choices, finiteness.

    Args:
        target: the function, method or class (its ``__init__``) whose signature describes the arguments.
        owner: how to name the callee in messages, e.g. ``"PReLU"``.
        **arguments: the values to check, by parameter name.

    Returns:
        The arguments, checked (tuples given for lists become lists).

    Raises:
        TypeError: an argument of the wrong type (or a name the signature lacks).
        ValueError: an argument outside its choices or range, or not finite.

    Examples:
        >>> from typing import Annotated
        >>> from workbench.params import Range, check_arguments
        >>> def scale(factor: Annotated[float, Range(0, 10)] = 1.0): ...
        >>> check_arguments(scale, "scale", factor=11)
        Traceback (most recent call last):
        ...
        ValueError: scale: parameter 'factor' must lie in [0, 10], got 11.
    """
    return validate_overrides(_signature_params(target), arguments, owner)


@functools.cache
def _signature_params(target: Callable[..., Any] | type) -> tuple[ParamInfo, ...]:
    return params_of(target)  # a signature does not change: read once per target



# --- seeds -----------------------------------------------------------------------

#: The largest seed workbench takes. ``torch.Generator.manual_seed`` takes [-2**63, 2**64 - 1] and
#: folds negatives onto the top half (``-1`` seeds like ``2**64 - 1``); [0, 2**63 - 1] has one
#: spelling per seed and leaves room for the seeds an experiment derives per step (seed + k * step).
SEED_MAX = 2**63 - 1


def check_seed(seed: Any, owner: str = "seed") -> int:
    """``seed``, checked to be an int in [0, 2**63 - 1].

    Raises:
        TypeError: not an int (a float such as ``1e20``, a bool, a string).
        ValueError: an int outside [0, 2**63 - 1].
    """
    expected = f"an int in [0, 2**63 - 1] = [0, {SEED_MAX}]"
    if not matches(seed, int):
        fix = f" Pass int({seed!r}) % 2**63." if isinstance(seed, float) and math.isfinite(seed) else ""
        raise TypeError(f"{owner}: seed must be {expected}, got {seed!r} ({type(seed).__name__}).{fix}")
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"{owner}: seed must be {expected}, got {seed}. Pass a seed in that range, "
                         f"e.g. seed % 2**63 = {seed % 2**63}.")
    return seed


# --- memory --------------------------------------------------------------------------

#: The environment variable that sets the memory limit (bytes, or a size such as ``16GB``; ``off``: no check).
MEMORY_LIMIT_ENV = "WORKBENCH_MEMORY_LIMIT"
#: Without a limit given, a build may take this fraction of the memory available when it starts.
MEMORY_FRACTION = 0.8

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


class MemoryLimitError(ValueError, MemoryError):
    """A configuration whose estimated memory exceeds the memory limit, refused before anything is allocated.

    Both a ``ValueError`` (the configuration is what is wrong) and a ``MemoryError``.
    """


def format_bytes(n: float, digits: int = 3) -> str:
    """``n`` bytes in a readable unit, e.g. ``'1.5 GB'``, to ``digits`` significant digits."""
    for unit, size in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if abs(n) >= size:
            return f"{n / size:.{digits}g} {unit}"
    return f"{int(n)} bytes"


def _parse_size(value: Any, what: str) -> int | None:
    """Bytes from an int, a finite float or a string such as ``'16GB'``, ``'512 MiB'``; ``'off'``/``inf``: None."""
    fix = ("Give bytes (an int) or a size such as '16GB' or '512MiB' ('off' or math.inf turns the check off).")
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "").replace("_", "")
        if text in ("off", "none", "inf", "unlimited"):
            return None
        match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)([a-z]*)", text)
        if not match or match.group(2) not in _UNITS:
            raise ValueError(f"{what} {value!r} is not a size. {fix}")
        value = float(match.group(1)) * _UNITS[match.group(2)]
    elif not matches(value, float):
        raise TypeError(f"{what} must be a number of bytes or a size string, got {value!r} "
                        f"({type(value).__name__}). {fix}")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return None
    if not (isinstance(value, int) or math.isfinite(value)) or value <= 0:
        raise ValueError(f"{what} must be a positive number of bytes, got {value!r}. {fix}")
    return int(value)


def available_memory(device: Any = "cpu") -> int | None:
    """Bytes available for new allocations on ``device`` now, or None where that cannot be read.

    The CPU's is ``MemAvailable`` of ``/proc/meminfo`` (psutil's reading elsewhere, when installed);
    a CUDA device's is its free memory (``torch.cuda.mem_get_info``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # no CUDA here: nothing to read
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # optional: not a dependency
        return int(psutil.virtual_memory().available)
    except Exception:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit(limit: Any = None, device: Any = "cpu") -> tuple[int | None, str]:
    """The memory limit in bytes (None: no check) and where it comes from, in words.

    Args:
        limit: bytes or a size string (``'16GB'``, ``'off'``); when None, the environment variable
            ``WORKBENCH_MEMORY_LIMIT`` (same forms), else ``MEMORY_FRACTION`` of the memory
            available on ``device`` now.
        device: the device whose memory is meant.

    Raises:
        ValueError, TypeError: a limit that is not a size.
    """
    if limit is not None:
        return _parse_size(limit, "memory_limit"), f"memory_limit={limit!r}"
    env = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if env:
        return _parse_size(env, f"The environment variable {MEMORY_LIMIT_ENV}"), f"{MEMORY_LIMIT_ENV}={env!r}"
    available = available_memory(device)
    if available is None:
        return None, "unknown available memory"
    return int(MEMORY_FRACTION * available), (f"{MEMORY_FRACTION:.0%} of the {format_bytes(available)} available "
                                              f"on {torch.device(device)}")


#: An estimate of this many bytes or more: a tensor whose size overflows torch's 64-bit byte count.
UNCOUNTABLE = 2**63


def check_memory(estimate: int | Mapping[str, int] | None, owner: str, limit: Any = None,
                 device: Any = "cpu") -> None:
    """Refuse, before anything is allocated, what would not fit.

    Args:
        estimate: the bytes needed, or a dict of them by part (parameters, optimizer, data ...);
            None when unknown (nothing is checked).
        owner: the configuration, as the message names it.
        limit: see :func:`memory_limit`.
        device: where the memory is needed.

    Raises:
        MemoryLimitError: the estimate exceeds the limit; the message names the configuration,
            the estimate, the limit and how to raise it.
    """
    bound, source = memory_limit(limit, device)  # a bad limit is an error even when nothing is estimated
    if estimate is None or bound is None:
        return
    parts = dict(estimate) if isinstance(estimate, Mapping) else {}
    total = sum(parts.values()) if parts else int(estimate)
    if total <= bound:
        return
    detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items() if v) if len(parts) > 1 else ""
    if total >= UNCOUNTABLE:
        raise MemoryLimitError(f"{owner} would need more bytes than a 64-bit size can count (one of its tensors "
                               f"alone): no machine holds it. Choose a smaller configuration.")
    need, limit = format_bytes(total), format_bytes(bound)
    digits = 3
    while need == limit and digits < 12:  # (12.3 GB "more than" 12.3 GB: as many digits as tell them apart)
        digits += 1
        need, limit = format_bytes(total, digits), format_bytes(bound, digits)
    raise MemoryLimitError(
        f"{owner} would need about {need}" + (f" ({detail})" if detail else "")
        + f", more than the memory limit of {limit} ({source}). Choose a smaller configuration, "
        f"or raise the limit: pass memory_limit='{_suggest(total)}' or set the environment variable "
        f"{MEMORY_LIMIT_ENV}={_suggest(total)} ('off' turns the check off)."
    )


def _suggest(total: int) -> str:
    """A round limit a quarter above ``total``."""
    wanted = total * 1.25
    return f"{math.ceil(wanted / 1000**3)}GB" if wanted >= 1000**3 else f"{math.ceil(wanted / 1000**2)}MB"
