"""Initial weights: an uploaded checkpoint inspected before a run starts from it.

:func:`inspect_weights` reads the checkpoint (:mod:`workbench.checkpoints`), builds the model it
names, shows its module tree and its outputs on example inputs, and finds the built-in experiment
(and settings) it fits, which the run form is then set to. A checkpoint that names no model to build
(a plain state_dict) is shown by its tensors: each one's name, shape, dtype and number of elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from workbench.checkpoints import STATE_DICT, CheckpointError, load_checkpoint
from workbench.registry import GLOBAL_RNG

__all__ = ["inspect_weights", "outputs_html", "tensors_table", "OUTPUT_COLUMNS", "TENSOR_COLUMNS"]


OUTPUT_COLUMNS = ["output", "shape", "mean", "std", "min", "max"]
TENSOR_COLUMNS = ["tensor", "shape", "dtype", "numel"]


def tensors_table(state: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    """The tensors of a state_dict, in its order: name, shape (``(64, 3)``), dtype (``float32``) and numel."""
    return pd.DataFrame([(name, str(tuple(t.shape)), str(t.dtype).removeprefix("torch."), t.numel())
                         for name, t in state.items()], columns=TENSOR_COLUMNS)


def outputs_html(outputs: pd.DataFrame) -> str:
    """The outputs table of :func:`inspect_weights` as a small HTML table ('' when there are none)."""
    if outputs.empty:
        return ""
    return ("<div class='wb-outputs'><p>outputs on the example inputs</p>"
            + outputs.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.6g}", border=0) + "</div>")


def md_literal(text: str) -> str:
    """``text`` shown as is in Markdown (``dynamics_network.*`` is no emphasis)."""
    return text.replace("*", "\\*")


def _leaves(value: Any, name: str = "out") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{name}.{i}")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{name}.{k}")]
    return []


def inspect_weights(path: Any, batch_size: int = 2) -> tuple[str, pd.DataFrame, pd.DataFrame, str | None,
                                                              dict[str, Any], pd.DataFrame]:
    """An uploaded checkpoint, inspected. Never raises.

    Args:
        path: the checkpoint file (falsy: none uploaded; everything is empty).
        batch_size: how many example inputs the model built from it is run on.

    Returns:
        A message (what it is, how it was read, the settings that fit; for a file refused, why), the module
        tree of the model built from it (``workbench.summarize`` on its example inputs), its outputs on them
        (:data:`OUTPUT_COLUMNS`), the experiment it fits and that experiment's settings, and the file's
        tensors (:func:`tensors_table`) where no model was built from it (a plain state_dict). The tables a
        checkpoint does not fill are empty; all of them are for a file refused.
    """
    from workbench.checkpoints import build_model, example_outputs, experiment_settings
    from workbench.summary import summarize

    empty_tree, empty_out = pd.DataFrame(), pd.DataFrame(columns=OUTPUT_COLUMNS)
    no_tensors = pd.DataFrame(columns=TENSOR_COLUMNS)
    if not path:
        return "", empty_tree, empty_out, None, {}, no_tensors
    try:
        checkpoint = load_checkpoint(path)
    except (CheckpointError, ValueError, TypeError) as exc:
        return f"**Refused:** {md_literal(str(exc))}", empty_tree, empty_out, None, {}, no_tensors
    experiment, settings = experiment_settings(checkpoint)
    text = f"**{md_literal(checkpoint.describe())}.**"
    tensors = tensors_table(checkpoint.state_dict)  # (shown where no model is: the file's contents, at least)
    try:
        model, spec = build_model(checkpoint)
    except CheckpointError as exc:
        if checkpoint.kind == STATE_DICT:  # (what names no model to build here can still start a run)
            return (f"{text}\n\nA plain state_dict names no model to build and show here: below, its tensors. "
                    "**Start** loads it into the experiment picked in the form; its keys and shapes are checked "
                    "then, and a mismatch is listed.", empty_tree, empty_out, experiment, settings, tensors)
        return (f"{text}\n\n{md_literal(str(exc))}\n\nBelow, its tensors.", empty_tree, empty_out, experiment,
                settings, tensors)
    except Exception as exc:  # (a model that cannot be built from it, e.g. out of memory): a message
        return (f"{text}\n\n**Cannot build a model from it:** {type(exc).__name__}: {exc}\n\nBelow, its tensors.",
                empty_tree, empty_out, experiment, settings, tensors)
    try:
        with GLOBAL_RNG:  # (a forward in training mode: dropout draws from the global generator)
            inputs, outputs = example_outputs(model, spec, batch_size)
            tree = summarize(model, inputs)
        rows = [{"output": n, "shape": str(tuple(t.shape)), **({k: round(float(getattr(t.float(), k)()), 6)
                                                                for k in ("mean", "std", "min", "max")}
                                                               if t.is_floating_point() and t.numel() > 1 else {})}
                for n, t in _leaves(outputs)]
        table = pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
    except Exception as exc:
        tree, table = summarize(model), empty_out
        text += f"\n\nIts forward on the example inputs failed: {type(exc).__name__}: {exc}"
    text += (f"\n\nBuilt `{type(model).__name__}` ({sum(p.numel() for p in model.parameters()):,} parameters) "
             f"from it; below: its module tree and outputs on {batch_size} example inputs of `{spec}`.")
    if experiment is not None:
        shown_settings = ", ".join(f"{k}={v}" for k, v in settings.items())
        text += (f"\n\nIt fits the **{experiment}** experiment with {shown_settings}: the form is set so. "
                 "Start trains from these weights.")
    else:
        text += "\n\nNo built-in experiment builds this network (its settings differ): it can be inspected here only."
    return text, tree, table, experiment, settings, no_tensors
