"""Interventions: patches on a call site's output (``Watch.patch``, ``Watch.ablate``).

A watch logs each intervention in place at a step as a metric of that step (value 1), named
:func:`marker` (``intervention/i1: ablate[0, 1]@dim1 at fc1``): a stored run keeps when each was
on (:func:`log_from_metrics`, ``Run.interventions()``), and the views shade those steps.
"""

from __future__ import annotations

import numbers
import re
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from workbench.instrument.tree import map_tensors

__all__ = ["Intervention", "listed", "zero_units", "MARKER", "LOG_COLUMNS", "log_from_metrics"]

#: The start of the name of the metric a watch logs for each intervention in place at a step.
MARKER = "intervention/"
#: The columns of an intervention log: ``Watch.intervention_log()``, ``Run.interventions()``.
LOG_COLUMNS = ["id", "site", "intervention", "from step", "to step", "status"]


def listed(values: Iterable[int], most: int = 6) -> str:
    """Indices as a message or a label shows them: ``[0, 3, 7]``, or past ``most`` of them
    ``[0, 1, 2, 3, 4, ... 99] (68 of them)``."""
    values = list(values)
    if len(values) <= most:
        return str(values)
    return f"[{', '.join(map(str, values[:most - 1]))}, ... {values[-1]}] ({len(values)} of them)"


#: Where the frames of workbench, torch and Python's own library are: a warning meant for the user
#: points at the first frame outside them (their notebook cell, their script).
_INTERNAL = tuple(str(Path(p).resolve()) for p in (Path(__file__).parent.parent, Path(torch.__file__).parent,
                                                   sysconfig.get_paths()["stdlib"]))


def user_frame() -> tuple[str, int, dict] | None:
    """``(filename, line, globals)`` of the innermost caller outside workbench, torch and the
    standard library (None: there is none, as on a thread of workbench's own)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen") and not str(Path(name).resolve()).startswith(_INTERNAL):
            return name, frame.f_lineno, frame.f_globals
        frame = frame.f_back
    return None


def warn_user(message: str, origin: tuple[str, int, dict] | None = None, may_raise: bool = False) -> None:
    """A RuntimeWarning that points at ``origin`` (default: the user's code calling now, see
    :func:`user_frame`), not at workbench's internals; it never raises into training (where
    warnings are turned into errors, the caller keeps the failure elsewhere) unless ``may_raise``
    (a warning given before anything is attached, where an error refuses the call)."""
    try:
        origin = origin or user_frame()
        if origin is None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:
            filename, line, module_globals = origin
            registry = module_globals.setdefault("__warningregistry__", {})
            warnings.warn_explicit(message, RuntimeWarning, filename, line, module=module_globals.get("__name__"),
                                   registry=registry, module_globals=module_globals)
    except Exception:
        if may_raise:
            raise


def structure(value: Any, depth: int = 0) -> str:
    """A value's structure, as a message shows it: ``Tensor(128, 12, 64)``, ``tuple(Tensor(2, 3), NoneType)``,
    ``dict(logits: Tensor(2, 5), state: tuple(...))``."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}".replace(",)", ")")
    if isinstance(value, (tuple, list, dict)) and depth < 2:
        items = ([f"{key}: {structure(item, depth + 1)}" for key, item in value.items()] if isinstance(value, dict)
                 else [structure(item, depth + 1) for item in value])
        shown = ", ".join(items[:6]) + (f", ... ({len(items)} of them)" if len(items) > 6 else "")
        return f"{type(value).__name__}({shown})"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__}(...)"
    return type(value).__name__


def patch_hint(output: Any) -> str:
    """What to tell of an output a patch failed on: its structure when it is not one tensor, and
    how to patch one part of it."""
    if output is None or isinstance(output, torch.Tensor):  # (None: a failure that got no output)
        return ""
    hint = f" The patch received the module's whole output, a {structure(output)}"
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        example = "(out[0] * 0.0, *out[1:])" if isinstance(output, tuple) else "[out[0] * 0.0, *out[1:]]"
        return hint + f"; to patch one element, return the others as they are: lambda out: {example}."
    if isinstance(output, dict) and output:
        key = next(iter(output))
        return hint + f"; to patch one entry, return the others as they are: lambda out: {{**out, {key!r}: ...}}."
    return hint + "; return the same structure with the parts patched."


class Intervention:
    """A patch on a call site's output; ``remove()`` takes it away.

    Attributes:
        path: the module path it patches.
        fn: output -> replacement.
        call: the call index it applies to (None: every call).
        label: what it does, as shown in errors and the UI.
        id: its name in its watch (``i1``, ``i2`` ...: ``Watch.intervention_log()``).
        start_step: the first step it applies to: the step it was made in, or, made after that step's
            model calls, the next (the step it was made in where the model is called again in it). Made in
            a step whose calls the watch did not count (one not recorded), the next until its site is
            called with it in that step; one of a ``call``, the next (which call of that step is its call
            cannot be told: it does not apply in it).
        end_step: the last step it applied to (None while it is in place); for one that failed, the
            step it failed at.
        error: why it failed (``TypeError: ...``), None unless it failed; ``failed_step``: when.
        origin: where the user's code made it (file, line, globals), the place its warnings point at.
    """

    def __init__(self, path: str, fn: Callable[[Any], Any], call: int | None, label: str,
                 remove: Callable[[Intervention], None], id: str = "", start_step: int = 0) -> None:
        self.path, self.fn, self.call, self.label = path, fn, call, label
        self.id, self.start_step, self.end_step = id, start_step, None
        self.error: str | None = None
        self.failed_step: int | None = None
        self.origin = user_frame()
        self._remove = remove
        self._closed_with_watch = False
        #: made after the model's calls of the step it was made in (it applies from the next call on), and how
        #: many calls of its site that step had made then (a later one in the same step, of its ``call``, is one it
        #: acted on; a call of another module is not)
        self.after_forward = False
        self.calls_before = 0
        #: made with a ``call`` in a step whose calls the watch did not count (a step not recorded, with the hooks
        #: out): which call of that step is ``call`` cannot be told, so it applies from the next step on
        self.from_next_step = False
        #: warned of once that a step called the model but not its site (:meth:`Hooks._check_uncalled_patches`)
        self.warned_uncalled = False

    @property
    def status(self) -> str:
        """``on``, ``removed``, ``ended with the watch`` (either ``before step N (never applied)`` where it
        ended before the step it would first have acted on), or ``failed at step N: <error>``."""
        if self.error is not None:
            return f"failed at step {self.failed_step}: {self.error}"
        if self.end_step is None:
            return "on"
        ended = "ended with the watch" if self._closed_with_watch else "removed"
        if self.end_step < self.start_step:
            return f"{ended} before step {self.start_step} (never applied)"
        return ended

    def fail(self, error: dict[str, Any], output: Any = None) -> None:
        """It raised (or applied to nothing) at ``error['step']``: keep why, warn at the user's code
        that made it, and take it out (the model runs unpatched from here).

        Args:
            error: the failure as the watch's ``errors`` keep it (``step``, ``error`` ...).
            output: the output it failed on, if any (its structure is described).
        """
        if self.error is not None:
            return
        self.error, self.failed_step = error["error"], error["step"]
        # (made after its step's first calls and failing in a later one: it acted in that step)
        self.start_step = min(self.start_step, self.failed_step)
        warn_user(f"workbench: the intervention {self.label} at {self.path!r} failed and was removed at step "
                  f"{self.failed_step} ({self.id} in the watch's intervention_log()); the model runs unpatched "
                  f"from here ({self.error})." + patch_hint(output), self.origin)
        self.remove()

    @property
    def site(self) -> str:
        """Where it applies, as the app names call sites: ``path``, ``path#call`` for one call,
        ``(model)`` for the model itself."""
        return (self.path or "(model)") + ("" if self.call is None else f"#{self.call}")

    @property
    def marker(self) -> str:
        """The metric its watch logs at each step it is in place (see the module's docstring)."""
        return f"{MARKER}{self.id}: {self.label} at {self.site}"

    def applies(self, call: int | None) -> bool:
        """Whether it applies to ``call`` (None: a call of unknown index, a recomputed one)."""
        return self.call is None or self.call == call

    def remove(self) -> None:
        """Stop patching (idempotent)."""
        self._remove(self)

    def __repr__(self) -> str:
        at = "every call" if self.call is None else f"call {self.call}"
        return f"Intervention({self.label} at {self.path!r}, {at})"


def log_from_metrics(metrics: pd.DataFrame, errors: pd.DataFrame | None = None) -> pd.DataFrame:
    """The interventions a run's metrics record (their markers): :data:`LOG_COLUMNS`, one row each,
    the first and last step it was logged at; status ``recorded``, or ``failed at step N: <error>``
    where ``errors`` hold its failure at its last step.

    Args:
        metrics: ``metrics(long=True)`` of a watch or a stored run (``step, name, value``).
        errors: the run's errors (``step, module, kind, error``), or None.

    Returns:
        The log, one row per intervention.
    """
    rows = []
    for name, steps in metrics.groupby("name", sort=False).step:
        match = re.fullmatch(rf"{re.escape(MARKER)}(\w+): (.*) at (\S+)", str(name))
        if match is not None:
            rows.append({"id": match[1], "site": match[3], "intervention": match[2], "from step": int(steps.min()),
                         "to step": int(steps.max()), "status": "recorded"})
    if errors is not None and len(errors) and len(rows):
        for row in rows:
            path = "" if row["site"] == "(model)" else re.sub(r"#\d+$", "", row["site"])
            failed = errors[(errors.kind == f"patch:{row['intervention']}") & (errors.module == path)
                            & (errors.step == row["to step"])]
            if len(failed):
                row["status"] = f"failed at step {row['to step']}: {failed.error.iloc[-1]}"
    return pd.DataFrame(rows, columns=LOG_COLUMNS)


def as_integer(value: Any) -> int | None:
    """``value`` as a Python int when it is one integer: an int, a numpy integer (any
    ``numbers.Integral``), or a 0-d integer numpy array or torch tensor; None for anything else,
    bools included (``True`` is no index)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        return int(value.item())
    if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
        return int(value)
    return None


def unit_index(units: Any, dim: Any) -> tuple[list[int], int]:
    """``units`` as a list of Python ints and ``dim`` as a Python int, checked. Units are one
    integer (an int, a numpy integer, a 0-d integer tensor) or a non-empty list, tuple, range, 1-d
    integer array or tensor of them.

    Raises:
        TypeError: units or dim that are not integers (floats, bools, strings), naming the value.
    """
    expected = ("an int or a non-empty list of ints (Python or numpy integers, or a 1-d integer array or "
                "tensor)")
    one = as_integer(units)
    if one is not None:
        index = [one]
    elif isinstance(units, (list, tuple, range)) or (isinstance(units, (np.ndarray, torch.Tensor))
                                                      and units.ndim == 1):
        items = units.tolist() if isinstance(units, (np.ndarray, torch.Tensor)) else list(units)
        converted = [as_integer(u) for u in items]
        bad = [u for u, c in zip(items, converted) if c is None]
        if not items or bad:  # (an array's or tensor's items are Python floats or bools unless it holds integers)
            shown = f"; not integers: {listed(bad)}" if bad else ""
            raise TypeError(f"units must be {expected}, got {units!r}{shown}.")
        index = converted
    else:
        raise TypeError(f"units must be {expected}, got {units!r}.")
    at = as_integer(dim)
    if at is None:
        raise TypeError(f"dim must be an int (the dimension that indexes the units), got {dim!r}.")
    return index, at


def check_units(path: str, index: list[int], dim: int, shape: tuple) -> None:
    """Raise a ValueError when ``dim`` or ``index`` do not fit an output of ``shape``."""
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"ablate({path!r}): dim={dim} is out of range for its output of shape "
                         f"{shape}; pass a dim in [{-len(shape)}, {len(shape) - 1}].")
    size = shape[dim]
    bad = [u for u in index if isinstance(size, int) and not -size <= u < size]
    if bad:
        raise ValueError(f"ablate({path!r}): units {listed(bad)} are out of range for dim {dim} of its output "
                         f"of shape {shape}; pass units in [0, {size - 1}] (or counted from the end, as "
                         f"Python indexes, in [{-size}, -1]).")


def default_dim_message(path: str, shape: tuple, dim: int) -> str:
    """The warning of an ablation that left ``dim`` to its default on an output of 3 or more dims."""
    return (f"workbench: ablate({path!r}, ...) zeroes along dim={dim}, the default, of its output of shape {shape}: "
            f"the channels of a (batch, channels, ...) output such as a convolution's, but the sequence axis "
            f"(its {shape[dim]} positions) of a (batch, sequence, features) output, not the features. To zero "
            f"features there, pass dim=-1 (the last dim, of size {shape[-1]}); to zero along dim {dim}, pass "
            f"dim={dim} and this warning goes.")


def zero_units(path: str, index: list[int], dim: int, warn_default_dim: bool = False) -> Callable[[Any], Any]:
    """output -> the output with ``index`` zeroed along ``dim`` in every floating-point tensor.

    ``warn_default_dim``: the user left ``dim`` out: warn once, at their code, on the first output
    of 3 or more dims (``dim`` may not index what they think: see ``Watch.ablate``)."""
    origin, warned = user_frame(), [not warn_default_dim]

    def zero(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            return tensor
        check_units(path, index, dim, tuple(tensor.shape))
        if not warned[0] and tensor.dim() >= 3:
            warned[0] = True
            warn_user(default_dim_message(path, tuple(tensor.shape), dim), origin)
        return tensor.index_fill(dim, torch.tensor(index, device=tensor.device), 0)

    return lambda output: map_tensors(output, zero)
