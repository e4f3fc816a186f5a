"""Initial weights: an uploaded checkpoint inspected before a run starts from it.

:func:`inspect_weights` reads the checkpoint (:mod:`workbench.checkpoints`), builds the model it
names, shows its module tree and its outputs on example inputs, and finds the built-in experiment
(and settings) it fits, which the run form is then set to.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from workbench.checkpoints import STATE_DICT, CheckpointError, load_checkpoint

__all__ = ["inspect_weights", "outputs_html", "OUTPUT_COLUMNS"]


OUTPUT_COLUMNS = ["output", "shape", "mean", "std", "min", "max"]


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
                                                              dict[str, Any]]:
    """An uploaded checkpoint, inspected: a message (what it is, how it was read, the settings that fit),
    the module tree of the model built from it (``workbench.summarize`` on its example inputs), its
    outputs on them, the experiment it fits and that experiment's settings. Never raises."""
    from workbench.checkpoints import build_model, example_outputs, experiment_settings
    from workbench.summary import summarize

    empty_tree, empty_out = pd.DataFrame(), pd.DataFrame(columns=OUTPUT_COLUMNS)
    if not path:
        return "", empty_tree, empty_out, None, {}
    try:
        checkpoint = load_checkpoint(path)
    except (CheckpointError, ValueError, TypeError) as exc:
        return f"**Refused:** {md_literal(str(exc))}", empty_tree, empty_out, None, {}
    experiment, settings = experiment_settings(checkpoint)
    text = f"**{md_literal(checkpoint.describe())}.**"
    try:
        model, spec = build_model(checkpoint)
    except CheckpointError as exc:
        if checkpoint.kind == STATE_DICT:  # (what names no model to build here can still start a run)
            return (f"{text}\n\nA plain state_dict names no model to build and show here. **Start** loads it "
                    "into the experiment picked in the form; its keys and shapes are checked then, and a "
                    "mismatch is listed.", empty_tree, empty_out, experiment, settings)
        return f"{text}\n\n{md_literal(str(exc))}", empty_tree, empty_out, experiment, settings
    except Exception as exc:  # (a model that cannot be built from it, e.g. out of memory): a message
        return (f"{text}\n\n**Cannot build a model from it:** {type(exc).__name__}: {exc}", empty_tree, empty_out,
                experiment, settings)
    try:
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
    return text, tree, table, experiment, settings
