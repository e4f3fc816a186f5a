"""The Models tab: browse the registry, read a model's parameters, build it, see its tree.

The handlers at the top are plain functions over the core API, tested
without a browser; :func:`layout` places the components and :func:`wire`
connects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from workbench.registry import GLOBAL_RNG, get_spec, list_families, list_models
from workbench.summary import summarize
from workbench.ui.forms import FormField, form_fields, param_rows, parse_form, pop_up_text, read_whole, shown_whole

ALL_FAMILIES = "all"
MAX_EXAMPLE_BATCH = 4096
TREE_COLUMNS = ["module", "path", "type", "params", "output"]
#: Their widths: fixed, so that a model whose outputs are long (a dict of tensors) cannot squeeze the others
#: to a letter a line ("params" read p/a/r/a/m/s) and push its own column past the table's right edge.
TREE_WIDTHS = ["17%", "24%", "17%", "10%", "32%"]
FIELDS_PER_ROW = 3
#: What the message under the form says while the filters match no model (see wire()).
NO_MATCH_NOTE = "No model matches the filter; the form still shows **{}**."


# --- handlers ----------------------------------------------------------------

def filter_models(family: str | None, pattern: str | None) -> list[str]:
    """Registered names in a family whose name matches ``pattern``.

    A pattern without glob characters matches as a substring, so typing
    ``lu`` finds gelu, prelu and relu; ``*lu`` is an fnmatch pattern.
    """
    pattern = (pattern or "").strip()
    if pattern and not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    return list_models(pattern or "*", family=None if family in (None, "", ALL_FAMILIES) else family)


def model_overview(name: str | None) -> str:
    """Markdown: name, family, summary, and the formula where the family has one."""
    if not name:
        return "No model matches the filter."
    spec = get_spec(name)
    lines = [f"### {spec.name}", f"family **{spec.family}** · {spec.summary}"]
    if "formula" in spec.extras:
        lines.append(f"$$ {spec.formula} $$")
    if not spec.differentiable:
        lines.append("_No objective: this module is probed forward-only (no gradients)._")
    return "\n\n".join(lines)


def param_table(name: str | None) -> pd.DataFrame:
    """The parameter table of a model: name, type, default, allowed values, help."""
    rows = param_rows(get_spec(name).params) if name else []
    return pd.DataFrame(rows, columns=["parameter", "type", "default", "allowed", "help"])


def model_form(name: str | None) -> list[FormField]:
    """The editable fields of a model's build form."""
    return form_fields(get_spec(name).params) if name else []


@dataclass
class BuildResult:
    """What building a model from the form produced.

    Attributes:
        model: the built module, or ``None`` when the form was invalid.
        message: Markdown shown next to the form (an error or a summary).
        tree: the module tree (see :func:`tree_table`), empty on error.
        values: the parameter values the model was built with, by name, as the form read them
            (``"16"`` typed in a box is ``16``); empty on error.
    """

    model: nn.Module | None
    message: str
    tree: pd.DataFrame
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.model is not None


def tree_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Display form of :func:`workbench.summarize` (``per_call=True`` or not): indented names,
    full paths. A path called several times in the pass has a row per call, named as the run
    page names call sites: ``activation#0``, ``activation#1`` ..."""
    # An em space survives HTML whitespace collapsing; the word joiner after it forbids a line break there (a
    # deep name too wide for its cell would otherwise wrap away from its indent, to the cell's left edge).
    indent = "\u2003\u2060"
    calls = summary["calls"] if "call" in summary else pd.Series(0, index=summary.index)
    call = summary["call"] if "call" in summary else pd.Series(0, index=summary.index)
    suffix = [f"#{int(k)}" if n > 1 else "" for k, n in zip(call.fillna(0), calls)]
    module = [
        ("(root)" if path == "" else indent * (depth - 1) + path.rsplit(".", 1)[-1]) + tail
        for path, depth, tail in zip(summary["module"], summary["depth"], suffix)
    ]
    return pd.DataFrame({
        "module": module,
        "path": [path + tail for path, tail in zip(summary["module"], suffix)],
        "type": summary["type"],
        "params": summary["params"],
        "output": summary["output"],
    }, columns=TREE_COLUMNS)


def _error(message: str) -> BuildResult:
    return BuildResult(None, f"**Could not build the model.** {message}", pd.DataFrame(columns=TREE_COLUMNS))


def read_batch_size(value: Any) -> int:
    """The example batch size a box holds, as a whole number in [1, ``MAX_EXAMPLE_BATCH``].

    Args:
        value: what the box holds: a number, or text as typed (``"4"``, ``"1e3"``).

    Raises:
        ValueError: empty, not a whole number, or outside [1, ``MAX_EXAMPLE_BATCH``], naming the value.
    """
    if value is None or (isinstance(value, str) and not value.strip()):  # (a number box sends None when empty)
        raise ValueError(f"example batch size is empty; give a whole number in [1, {MAX_EXAMPLE_BATCH}].")
    try:
        whole = read_whole(value)  # (1e3 is 1000; 2.5 none)
    except ValueError as err:
        raise ValueError(f"example batch size must be a positive whole number, got {value!r}: {err}.") from None
    if whole < 1:
        raise ValueError(f"example batch size must be a positive whole number, got {shown_whole(value, whole)}.")
    if whole > MAX_EXAMPLE_BATCH:
        raise ValueError(f"example batch size must be at most {MAX_EXAMPLE_BATCH} (the inputs of one forward "
                         f"pass), got {shown_whole(value, whole)}.")
    return whole


def build_model(name: str | None, values: Mapping[str, Any], batch_size: Any = 2, seed: int = 0) -> BuildResult:
    """Build a model from raw form values and run one forward pass on its example inputs.

    Never raises for bad input: invalid values, a model whose estimated memory
    exceeds the limit (see :func:`workbench.create_model`; nothing is
    allocated), a failing build or a failing forward pass come back as a
    readable message.

    Args:
        name: registry name.
        values: field name -> raw widget value.
        batch_size: batch size of the example inputs, 1 to ``MAX_EXAMPLE_BATCH``.
        seed: seed of the example inputs.

    Returns:
        A :class:`BuildResult`.
    """
    if not name:
        return _error("Pick a model first.")
    try:
        spec = get_spec(name)
        overrides = parse_form(spec.params, values, f"Model {name!r}")
        batch_size = read_batch_size(batch_size)
        model = spec.build(**overrides)  # refuses, before allocating, a model that would not fit in memory
    except (ValueError, TypeError) as exc:
        return _error(str(exc))
    except Exception as exc:  # a builder bug must not reach the page as a traceback
        return _error(f"{type(exc).__name__}: {exc}")
    try:
        inputs = spec.example_inputs(model, batch_size, torch.Generator().manual_seed(seed))
        with GLOBAL_RNG:  # (a forward in training mode: dropout draws from the global generator)
            summary = summarize(model, inputs, per_call=True)
    except Exception as exc:
        return BuildResult(model, f"Built **{name}**, but the forward pass on the example inputs failed: "
                                  f"{type(exc).__name__}: {exc}", tree_table(summarize(model)), overrides)
    total = int(summary["params"].iloc[0])
    root_output = summary["output"].iloc[0]
    defaults = spec.defaults()
    shown = {k: v for k, v in overrides.items() if defaults.get(k, object()) != v}
    config = ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "defaults"
    message = (f"Built **{name}** ({config}): {summary['module'].nunique() - 1} submodules, {total:,} parameters; "
               f"output {root_output} for batch size {batch_size}.")
    return BuildResult(model, message, tree_table(summary), overrides)


# --- layout and wiring ---------------------------------------------------------

def layout():
    """Place the tab's components; returns them by name. Call inside ``gr.Blocks``."""
    import gradio as gr

    names = filter_models(ALL_FAMILIES, "")
    first = names[0] if names else None
    c = {}
    with gr.Row():
        with gr.Column(scale=1, min_width=220):
            c["family"] = gr.Dropdown([ALL_FAMILIES, *list_families()], value=ALL_FAMILIES, label="Family",
                                      elem_id="family-filter")
            c["pattern"] = gr.Textbox(label="Filter by name", placeholder="e.g. lu or *lu", elem_id="name-filter")
            c["models"] = gr.Radio(names, value=first, label="Models", elem_id="model-list")
            # The model shown, which the overview, the table and the form follow (see wire()).
            c["selected"] = gr.State(first)
        # (at least 560 px: in a narrower window the list of models goes above it, not beside it, which
        # squeezed the module tree to a few letters a column and the longest model name out of its box)
        with gr.Column(scale=4, min_width=560):
            c["overview"] = gr.Markdown(model_overview(first), elem_id="model-overview")
            with gr.Accordion("Parameters (types, defaults, ranges)", open=False, elem_id="param-accordion"):
                c["params"] = gr.Dataframe(param_table(first), show_label=False, interactive=False,
                                           wrap=True, elem_id="param-table")
            # One wrapping row: the batch size, then (from the render in wire()) the Build button
            # and the model's fields side by side, so the button sits above a long form, not under it.
            with gr.Row(equal_height=False, elem_id="build-form") as c["form"]:
                # interactive: Gradio would render it read-only, its only listener being made in a render
                c["batch_size"] = gr.Number(2, label="example batch size", elem_id="batch-size", interactive=True,
                                            min_width=150, scale=0)
            c["message"] = gr.Markdown(elem_id="build-message")
            c["tree"] = gr.Dataframe(pd.DataFrame(columns=TREE_COLUMNS), label="Module tree (a row per call site)",
                                     interactive=False, wrap=True, elem_id="module-tree", max_height=600,
                                     column_widths=TREE_WIDTHS)
    # (the module built is not kept in the page's state: nothing reads it after the build, and Gradio would
    # hold it an hour after the page closed)
    return c


def widget(field: FormField, key: str):
    import gradio as gr

    common = dict(label=field.label, info=field.info or None, key=key, interactive=True, min_width=160, scale=1)
    if field.widget == "dropdown":
        return gr.Dropdown(list(field.param.choices), value=field.value, **common)
    if field.widget == "checkbox":
        return gr.Checkbox(value=field.value, **common)
    if field.widget in ("int", "float"):
        # No minimum/maximum here: Gradio would reject out-of-range values with a bare
        # toast; build_model reports them next to the form, naming the range. No precision
        # either, for whole numbers too: Gradio would round 2.5 to 2 before the handler
        # sees it; parse_form refuses it, naming the field.
        return gr.Number(field.value, **common)
    return gr.Textbox(value=field.value, **common)


def wire(c) -> None:
    """Connect the components placed by :func:`layout`."""
    import gradio as gr

    # The model shown is c["selected"], a State set by the user's pick and by the filter; the
    # overview, the table and the form follow it. They do not follow the Radio: each keystroke in
    # the filter sends new choices, and a Radio change event queued before them would carry a
    # value Gradio then refuses against the new choices (an error toast, the overview left on a
    # model the list no longer shows).
    def on_filter(family, pattern, selected, message):
        # The filter narrows the list; the model shown stays while it matches (the form under it as the
        # user left it). One it hides gives way to the first match, which the message says (the form is
        # made anew when the model is picked again). A filter matching nothing leaves the form as it is:
        # a typo in the filter, undone, loses nothing.
        names = filter_models(family, pattern)
        if selected in names or (not names and selected is None):  # (that note, no longer so, goes)
            stale = bool(names) and message == NO_MATCH_NOTE.format(selected)
            return gr.Radio(choices=names, value=selected), gr.skip(), "" if stale else gr.skip()
        if not names:
            return gr.Radio(choices=[], value=None), gr.skip(), NO_MATCH_NOTE.format(selected)
        shown = names[0]
        note = (f"The filter hid **{selected}**; the form shows **{shown}**. Picked again, {selected}'s form "
                "starts from its defaults." if selected else "")
        return gr.Radio(choices=names, value=shown), shown, note

    def on_pick(name, family, pattern):
        # Raw values (preprocess=False), so a click on a choice that a filter sent meanwhile
        # replaced is skipped rather than refused with a toast.
        return (name, "") if name in filter_models(family, pattern) else (gr.skip(), gr.skip())

    def on_select(name):
        return model_overview(name), param_table(name), pd.DataFrame(columns=TREE_COLUMNS)

    for trigger in (c["family"].change, c["pattern"].change):
        trigger(on_filter, [c["family"], c["pattern"], c["selected"], c["message"]],
                [c["models"], c["selected"], c["message"]])
    c["models"].input(on_pick, [c["models"], c["family"], c["pattern"]], [c["selected"], c["message"]],
                      preprocess=False)
    c["selected"].change(on_select, c["selected"], [c["overview"], c["params"], c["tree"]])

    with c["form"]:
        @gr.render(inputs=c["selected"])
        def render_form(name):
            fields = model_form(name)
            button = gr.Button("Build", variant="primary", elem_id="build-button", interactive=bool(name),
                               scale=0, min_width=110)
            if name and not fields:
                gr.Markdown("_No parameters to set: builds with its defaults._")
            widgets = []
            if fields:
                with gr.Column(scale=1, min_width=420, elem_id="model-fields"):
                    for start in range(0, len(fields), FIELDS_PER_ROW):  # the form in rows of three
                        with gr.Row(equal_height=False):
                            widgets += [widget(f, key=f"{name}:{f.label}")
                                        for f in fields[start:start + FIELDS_PER_ROW]]
            labels = [f.label for f in fields]

            def on_build(model_name, batch_size, *values):
                result = build_model(model_name, dict(zip(labels, values)), batch_size)
                if result.model is None:  # (also as a pop-up: the message sits under a form that may be tall)
                    gr.Warning(pop_up_text(result.message))
                return result.message, result.tree

            button.click(on_build, [c["selected"], c["batch_size"], *widgets],
                         [c["message"], c["tree"]])
