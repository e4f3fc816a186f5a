"""The checks of an ILQL checkpoint's contents that :meth:`ILQL.load_checkpoint
<workbench.models.ilql.ILQL.load_checkpoint>` runs before it changes anything.

Each compares what a file holds with what the agent's net_config asks for (the layout of its
networks, built on the ``meta`` device) and raises :class:`CheckpointError`, naming the key, what
was found and what was expected.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.params import matches

__all__ = ["CheckpointError", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "check_state", "check_optimizer",
           "number_list"]

#: The marker of an ILQL checkpoint (workbench.checkpoints reads it too).
CHECKPOINT_FORMAT = "workbench.ILQL"
#: The newest checkpoint version this code writes and reads.
CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file that is not an ILQL checkpoint of a version this code reads, or is damaged."""


def number_list(value: Any, name: str, integer: bool) -> list:
    """``value``, checked to be a list of ints (``integer``) or of numbers; a bool is neither."""
    kind = "int" if integer else "number"
    if not isinstance(value, list) or not matches(value, list[int] if integer else list[float]):
        raise TypeError(f"{name} must be a list of {kind}s, got {str(value)[:100]}")
    return list(value)


def check_state(expected: dict[str, torch.Tensor], given: Any, what: str) -> None:
    """The keys, shapes and dtypes of ``given`` are those of ``expected`` (the meta layout)."""
    if not isinstance(given, dict):
        raise CheckpointError(f"{what} state must be a dict of tensors, got {type(given).__name__}.")
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{what} state does not match its net_config: "
            + (f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}" if unexpected else "")
            + ". It is damaged or was edited; save it again with ILQL.save_checkpoint().")
    for key, want in expected.items():
        got = given[key]
        if not isinstance(got, torch.Tensor):
            raise CheckpointError(f"{what} state: {key!r} must be a tensor, got {type(got).__name__}.")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise CheckpointError(f"{what} state: {key!r} has shape {tuple(got.shape)} and dtype {got.dtype}; the "
                                  f"net_config asks for shape {tuple(want.shape)} and dtype {want.dtype}.")


def check_optimizer(given: Any, params: list[nn.Parameter], what: str) -> None:
    """AdamW's state: one group over every trainable parameter, moments shaped like them."""
    if not isinstance(given, dict) or not isinstance(given.get("state"), dict) \
            or not isinstance(given.get("param_groups"), list):
        raise CheckpointError(f"{what} state must be a dict with 'state' and 'param_groups' (AdamW's "
                              "state_dict()); it is damaged.")
    groups = given["param_groups"]
    ids = [i for g in groups if isinstance(g, dict) for i in g.get("params", [])]
    if len(groups) != 1 or ids != list(range(len(params))):
        raise CheckpointError(f"{what} state has {len(groups)} parameter group(s) over {len(ids)} parameters; "
                              f"the net_config's networks have 1 group of {len(params)} trainable parameters.")
    for index, entry in given["state"].items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(entry, dict):
            raise CheckpointError(f"{what} state: entry {index!r} does not name one of the "
                                  f"{len(params)} trainable parameters.")
        for name, value in entry.items():
            if name == "step":
                continue
            if not isinstance(value, torch.Tensor) or value.shape != params[index].shape \
                    or not value.is_floating_point():
                got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise CheckpointError(f"{what} state: {name!r} of parameter {index} is {got}; its parameter has "
                                      f"shape {tuple(params[index].shape)}.")
