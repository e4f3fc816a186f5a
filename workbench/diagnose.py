"""Diagnoses: what looks wrong with a training run, at which site, and since which step.

:func:`diagnose` reads a run's rows (``w.to_pandas()``, ``load_run(path).to_pandas()``) and
metrics and returns its findings, one row per finding::

    from workbench.diagnose import diagnose
    findings = diagnose(w.to_pandas(), w.metrics())

A :class:`Diagnoser` does the same incrementally, fed the recorder's stream on a subscriber's
thread (``Diagnoser.attach(w)``): it reads only the statistics each recorded step already
carries (its one host transfer), never a tensor, so it costs training no sync. Each step
costs in proportion to its rows; what a diagnoser keeps is bounded by the sites and metrics
of the run, not by its length.

The findings (see :data:`FINDINGS`) and the thresholds they use (:class:`Thresholds`) are
documented in ``docs/diagnose.md``.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from workbench.instrument.schema import finish, site_name, whole_number

__all__ = ["COLUMNS", "FINDINGS", "SEVERITIES", "Diagnoser", "Findings", "Thresholds", "diagnose", "gradient_noise",
           "update_ratios"]

#: The columns of a findings frame. ``step`` is the first recorded step the finding held (of its
#: latest episode), ``last_step`` the last; ``site`` names the call site or parameter as the run's
#: views do (``module``, ``#call`` for a module called more than once a step, the tensor leaf of a
#: structured output, a parameter's name); ``kind``, ``module``, ``call`` and ``tensor`` are the
#: rows it was read from, to focus a view on it (empty for a metric's finding).
#: ``cause`` is empty for a finding of its own; for one that followed from another (a diverging run's dead units,
#: after the learning rate threw the weights out), that one's ``finding at site``: it is listed right after it.
#: ``consequences`` is how many findings name this one their cause (0 but for the cause of a run gone wrong, and a
#: GELU-like layer dead on its tail, whose vanished gradients are its): its evidence ends naming each of them, with
#: their steps.
COLUMNS = ("step", "last_step", "site", "finding", "severity", "evidence", "hint", "kind", "module", "call", "tensor",
           "cause", "consequences")
SEVERITIES = ("info", "warning", "error")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: finding -> (severity, hint)
FINDINGS: dict[str, tuple[str, str]] = {
    "nan_origin": ("error", "The first non-finite value of the run. Usual causes: log/sqrt/division of 0 or a "
                            "negative number, exp overflow, a learning rate so large the weights overflow. Guard "
                            "the op (clamp, an eps), lower the learning rate, or clip gradients; the sites after "
                            "it only inherited it."),
    "loss_not_finite": ("error", "The loss is NaN or Inf. Where a nan_origin names a site of the model, the loss "
                                 "inherited it from there; where the model's recorded values are finite, the loss "
                                 "computation made it: guard log/sqrt/division in the loss (clamp, an eps), use "
                                 "stable forms (F.cross_entropy on logits, binary_cross_entropy_with_logits, "
                                 "logsumexp). A loss that grew until it overflowed diverged: lower the learning "
                                 "rate, clip gradients."),
    "dead_units": ("warning", "Many units of this activation output 0 for every input of the batch (a GELU, SiLU "
                              "or ELU: sit on its flat negative tail, near its floor) and get no gradient, or almost "
                              "none, so they stop learning. Usual causes: a large negative bias, a learning rate "
                              "that pushed pre-activations below 0. Try a leaky activation (LeakyReLU, GELU for a "
                              "ReLU), a smaller learning rate, a norm layer before it, or re-initialize the layer "
                              "before it."),
    "constant_output": ("warning", "Every output of this site is the same value, whatever the input: it passes "
                                   "nothing of its input on; a sigmoid or tanh pinned at a bound, or a softmax over a "
                                   "dimension of size 1, passes no gradient back either. Usual causes: a large bias or "
                                   "large weights before a sigmoid/tanh (in float32 a sigmoid of more than ~17 is "
                                   "exactly 1, a tanh of more than ~9), a softmax or normalization over the wrong dim "
                                   "(one of size 1), weights set to 0. Check the dim=, initialize smaller, normalize "
                                   "the inputs."),
    "saturated": ("warning", "A sigmoid/tanh-like output stuck at its bounds, where its gradient is ~0. Usual "
                             "causes: large weights or inputs before it. Normalize the inputs, initialize smaller "
                             "(Xavier/Glorot), add a normalization layer before it."),
    "vanishing_gradients": ("warning", "The gradient reaching the early layers is orders of magnitude smaller "
                                       "than at the later ones: they barely learn. Usual causes: saturating "
                                       "activations, too small initial weights, a deep net without residual "
                                       "connections or normalization. Try ReLU/GELU, He/Xavier initialization, "
                                       "normalization layers or skip connections. Where one site passes almost "
                                       "none of its output's gradient back (the evidence says so), that site is "
                                       "why: a normalization before a loss that reads only what it normalizes away "
                                       "(the mean of a LayerNorm's output), an output pinned at a bound, dead units. "
                                       "A last layer initialized at 0 "
                                       "does this for its first steps, until its weights grew: not a finding while "
                                       "they are seen to grow (its parameters recorded), harmless if it ends."),
    "exploding_gradients": ("warning", "Gradients grow by orders of magnitude toward the early layers or over "
                                       "the steps. Usual causes: too large initial weights or learning rate. Clip "
                                       "gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, "
                                       "initialize smaller, add normalization."),
    "exploding_activations": ("warning", "The outputs grow by orders of magnitude through the layers (or over the "
                                         "steps): each layer multiplies its input's scale. Usual causes: weights "
                                         "initialized too large for the width (a std of 1 instead of ~1/sqrt(fan_in): "
                                         "use the default, Kaiming or Xavier init), weights grown by a learning rate "
                                         "too large, a residual stream summed without normalization. Initialize "
                                         "smaller from the site it starts at, add normalization layers, lower the "
                                         "learning rate."),
    "gradients_accumulate": ("error", "A parameter's gradient (its .grad) is larger than this step's backward pass "
                                      "can make it: it still holds the gradients of the steps before, added up. Usual "
                                      "cause: optimizer.zero_grad() (or model.zero_grad()) is not called before "
                                      "loss.backward() each step, or called on an optimizer that does not hold these "
                                      "parameters (one built on a copy of the model: see not_updated), so every step "
                                      "adds its gradient to the sum of all before, and the optimizer steps by a sum "
                                      "that grows with the step. Call optimizer.zero_grad() once per step, on the "
                                      "optimizer of the model's parameters. (Accumulating over micro-batches on "
                                      "purpose: zero it after each optimizer step, and call w.step() once per "
                                      "optimizer step.)"),
    "update_ratio_high": ("warning", "Each optimizer step changes this parameter by a large fraction of itself "
                                     "(a healthy ratio ||update|| / ||param|| is around 1e-3): training is "
                                     "unstable. Lower the learning rate (or add warm-up / clipping); check the one in "
                                     "use now (optimizer.param_groups[0]['lr']): a scheduler that raises it."),
    "update_ratio_low": ("warning", "Each optimizer step changes this parameter by a tiny fraction of itself "
                                    "(a healthy ratio is around 1e-3): it barely learns. Raise the learning rate "
                                    "(and check the one in use now: a scheduler's factor, a warm-up), check a "
                                    "gradient clipping's max_norm, or check the parameter gets a gradient: where "
                                    "its evidence says the gradient vanished before it (see vanishing_gradients), "
                                    "the learning rate is not why."),
    "not_updated": ("warning", "This parameter gets a gradient but does not change at all: the optimizer does not "
                               "step it. Usual causes: it is not in the optimizer's parameter groups (the optimizer "
                               "was built before the layer was added or replaced, a param group left out), its "
                               "group's learning rate is 0, or a learning rate so small each step rounds away in "
                               "float32, or a gradient clipped to a tiny max_norm before the step, or an optimizer "
                               "built on a copy of the model (its .grad then never zeroed: the evidence says where it "
                               "grew as such a sum). Gradient accumulation with w.step() per micro-batch is told from "
                               "this by the steps that change the weight every k-th."),
    "frozen": ("info", "This parameter has no gradient (its .grad is None) and does not change: requires_grad is "
                       "False, or it takes no part in the loss (its output unused by the loss, or cut off from it by "
                       "a .detach() or torch.no_grad()). Frozen on purpose (a pretrained backbone): as intended. If "
                       "not: set requires_grad=True, check the loss uses its output, and remove the .detach()."),
    "loss_spike": ("warning", "The loss jumped far above its recent level at this step. Usual causes: an "
                              "outlier batch, a learning rate too high for this region, numerical trouble. "
                              "Check the batch; try gradient clipping or a lower learning rate."),
    "loss_plateau": ("warning", "The loss has not fallen from where it started: the model is not learning. Check "
                                "the learning rate (too small, or still ~0 in a warm-up), that the optimizer has the "
                                "model's parameters (see not_updated, frozen), that the loss's gradient reaches the "
                                "model (no .detach() or .item() on the way), that the targets match the inputs (not "
                                "shuffled apart), and that there is something to learn."),
    "loss_at_chance": ("warning", "The loss is no better than chance: what predicting the classes' frequencies, "
                                  "blind to the inputs, scores (log C of cross-entropy over C balanced classes). The "
                                  "model learned nothing of the inputs, even where the loss fell at first (from "
                                  "confident initial outputs to the class frequencies). Check that the targets match "
                                  "the inputs (not shuffled apart, the right labels for the batch), that the inputs "
                                  "carry the signal (not all zeros, not normalized away), and the learning rate."),
    "diverging": ("error", "The loss keeps growing (or was thrown up orders of magnitude): training diverges. "
                           "Lower the learning rate, clip gradients, check the data and the loss for NaN sources."),
}


#: What may be the cause of a run's trouble, read in the model, most telling first: a finding of these that began
#: first is the root of those that began at its step or later (its consequences), where the run went wrong as a whole
#: (one of :data:`BLOWN_UP` holds). A learning rate too large shows first in its update ratios, a forgotten
#: zero_grad() in its gradients; the NaN and the loss's rise come after (the loss's findings are never a root: they say
#: that it went wrong, not why).
ROOT_FINDINGS = ("gradients_accumulate", "update_ratio_high", "exploding_activations", "exploding_gradients",
                 "nan_origin")
#: Findings that say a run went wrong as a whole: where one holds, findings that began at the root's step or later
#: are grouped under it.
BLOWN_UP = ("exploding_activations", "exploding_gradients", "nan_origin", "loss_not_finite",
            "diverging", "loss_spike")
#: Findings never a consequence of another: how the run was set up (a parameter left out of the optimizer, frozen).
NOT_CONSEQUENCES = ("not_updated", "frozen")

#: The values of a loss metric whose median is its level at its start and now, for ``loss_plateau``.
PLATEAU_WINDOW = 20


#: The style of a findings table in a notebook: its text left-aligned and wrapped at the width of the output, each
#: row read from its top (pandas' own table right-aligns its cells, for numbers; the selector outranks JupyterLab's
#: ``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td``, which does the same).
_FINDINGS_STYLE = ("<style>table.dataframe.workbench-findings td, table.dataframe.workbench-findings thead th "
                   "{text-align: left; vertical-align: top; white-space: normal; overflow-wrap: break-word;}</style>")
#: The least width of a column of sentences in a notebook's findings table: a line of a few words, not a word a line.
_SENTENCE_WIDTH = "22em"
#: The columns of a finding's sentences: the text repr of a findings frame writes them under its table, a line each.
_LONG_TEXT = ("evidence", "hint")


class Findings(pd.DataFrame):
    """A findings frame (:data:`COLUMNS`): a pandas DataFrame in all but its display. Filter, index and export it as
    any frame (what is taken from it is a ``Findings`` too, of the columns and rows taken).

    pandas shows a cell's text cut at ``display.max_colwidth`` (50 characters) and, in a console, leaves out the
    columns that do not fit its width; a finding's evidence and hint are read whole. So a ``Findings`` displays all
    of each cell: in a notebook (its HTML) the text wrapped at the width of the output, left-aligned; in its text
    (``print``, a console) the table of every other column, then, per finding, its evidence and hint whole, a line
    each. The rows shown are those pandas shows (``display.max_rows``, ``display.min_rows``).
    """

    @property
    def _constructor(self) -> type:
        return Findings

    def __repr__(self) -> str:
        long = [c for c in _LONG_TEXT if c in self.columns]
        with pd.option_context("display.max_colwidth", None, "display.max_columns", None):
            if not long or not len(self):
                return super().__repr__()
            others = self.drop(columns=long)
            table = repr(pd.DataFrame(others)) if len(others.columns) else ""
        # (the rows pandas shows of a long frame: its first and last display.min_rows / 2)
        most, shown = pd.get_option("display.max_rows"), range(len(self))
        if most and len(self) > most:
            half = max(1, (pd.get_option("display.min_rows") or most) // 2)
            shown = [*range(half), *range(len(self) - half, len(self))]
        lines = []
        for at, position in enumerate(shown):
            if at and position != shown[at - 1] + 1:
                lines.append("...")
            row = self.iloc[position]
            named = f" {row['finding']} at {row['site']}" if {"finding", "site"} <= set(self.columns) else ""
            lines.append(f"{self.index[position]}{named}")
            lines.extend(f"    {column}: {row[column]}" for column in long)
        return "\n\n".join(part for part in (table, "\n".join(lines)) if part)

    def _repr_html_(self) -> str | None:
        if not pd.get_option("display.notebook_repr_html"):
            return None  # (as pandas: the notebook shows the text)
        # (the rows pandas' own table shows: all up to display.max_rows, else display.min_rows of them)
        most, least = pd.get_option("display.max_rows"), pd.get_option("display.min_rows")
        rows = most if not most or len(self) <= most else min(least or most, most)
        with pd.option_context("display.max_colwidth", None):
            table = self.to_html(max_rows=rows, max_cols=None, show_dimensions=pd.get_option("display.show_dimensions"),
                                 notebook=True, classes="workbench-findings",
                                 col_space={c: _SENTENCE_WIDTH for c in _LONG_TEXT if c in self.columns})
        return _FINDINGS_STYLE + table


@dataclass(frozen=True)
class Thresholds:
    """When a finding holds. Pass an instance, or keyword overrides, to :func:`diagnose`.

    Attributes:
        persist: recorded steps in a row a persistent condition (dead units, saturation, vanishing
            or exploding gradients, update ratios) must hold before it is a finding; and, once one,
            must be missing before the finding ends.
        dead_zero_frac: an activation site whose outputs are exactly 0 for at least this fraction
            (and never negative: a ReLU-like output) has dead units; unless the bias of the layer
            before it, where its gradient is recorded, says none is (no entry of that gradient exactly
            0: every unit fires for some input, a sparse layer). Healthy ReLU layers of the built-in
            experiments read up to ~0.72; a layer with 75% of its units dead ~0.87.
        dead_unit_share: an activation site whose outputs are never negative also has dead units, below
            ``dead_zero_frac``, where at least this fraction of its units output 0 for every input of the
            batch: counted exactly where the bias of the layer before it records its gradient (an entry
            exactly 0 per such unit), and where its zeros can hold them (a unit dead for the batch is all
            zeros). Healthy deep narrow ReLU nets have some truly dead from their init: the 4-deep ReLU
            MLP of the built-in experiments up to 15 of 32 (0.47).
        dead_slope: an activation site without parameters whose outputs are all at or below 0, some below
            (the tail of a GELU, SiLU, Mish or ELU, whose dead units output no exact 0), has dead units where
            its output's std is at most this fraction of its input's (the site just before it, of its shape)
            and, where output gradients are recorded, its input's gradient norm at most this fraction of its
            own: every unit on a flat tail. A GELU MLP whose first bias is shifted by -4 reads ~0.01 (both),
            a SiLU one ~0.06; healthy GELU / SiLU layers have some output above 0 and read ~0.5-0.8.
        saturation_index: a site whose outputs stay in [0, 1] (sigmoid-like) or [-1, 1] with
            negatives (tanh-like), rarely exactly 0, is ``saturated`` when its variance is at least
            this fraction of the largest one an output with its mean can have (``mu (1 - mu)`` on
            [0, 1]): 1 when every output sits at a bound, ~0.2 for a sigmoid of a unit Gaussian.
        gradient_orders: orders of magnitude between the output-gradient RMS at the first site
            (forward order) and the largest, or the last: ``vanishing_gradients`` below,
            ``exploding_gradients`` above.
        gradient_growth_orders: orders of magnitude an output gradient grows over its first
            recorded steps before it is ``exploding_gradients`` (over steps).
        activation_orders: orders of magnitude the output RMS (norm / sqrt(numel)) of an activation site is above
            that of the first site in forward order before it is ``exploding_activations`` (through depth).
        activation_growth_orders: orders of magnitude the largest output RMS of a step grows over that of the run's
            first recorded steps before it is ``exploding_activations`` (over steps).
        update_ratio_high: ``||update|| / ||param||`` above this for ``persist`` steps:
            ``update_ratio_high``.
        update_ratio_low: below this for ``persist`` steps: ``update_ratio_low``.
        update_min_dims: parameters with fewer dimensions (biases, norms' scales, which start at
            0 or 1 and move fast at first) are not judged by their update ratio.
        loss_metrics: the metrics judged for spikes and divergence, by name (case-insensitive):
            the training objective, ``loss``, by default. Not every metric named ``*_loss``: the
            parts of an objective may rise while it falls (a value loss as a critic learns).
        spike_window: the recent values whose step-to-step noise a spike is measured in.
        spike_factor: a spike exceeds the level of the last 5 steps (their median) by this many
            times the noise (the median absolute difference of consecutive values in the window),
            and by at least ``spike_min_rise`` times the level's magnitude. In a metric's first
            ``spike_window // 2`` steps (at least 5), too few for their noise, by this many times the
            level (the median of the steps so far) itself.
        spike_min_rise: see ``spike_factor``.
        spike_regain: a spike also gives back at least this fraction of what the metric fell from
            its first value to its lowest median (of ``diverge_window`` values): a loss that fell
            from 0.7 to 0.002 and jumps to 0.03 amid batch-to-batch noise has not spiked.
        diverge_factor: ``diverging`` when the median of the last ``diverge_window`` values
            exceeds the lowest such median so far by this factor (of its magnitude) while still
            rising, having given back at least ``diverge_regain`` of what it fell from its first
            such median (a metric no longer finite is ``loss_not_finite``); one finding from then
            on while it stays that high, rising or not.
        diverge_window: see ``diverge_factor``.
        diverge_regain: see ``diverge_factor`` (a loss that fell from 0.7 to 0.003 and is noisy
            around 0.03 has risen 10x without diverging).
        diverge_blowup: also ``diverging`` when the median of the last ``diverge_window`` values is
            this many times the metric's first value (a positive one), rising or not: a learning rate
            far too large throws the loss up orders of magnitude in a step, where it swings or stays.
        plateau_steps: ``loss_plateau`` from this many finite values of a loss metric on, while the median of
            its last 20 values is not below that of its first 20 by ``plateau_drop`` (a fraction of its
            magnitude); it ends once the loss fell by that and by 3 times the noise of the two medians'
            difference (from the batch-to-batch noise).
        plateau_drop: see ``plateau_steps``.
        chance: the chance level of loss metrics: ``{name: level}`` (a dict), or one number for every metric
            of ``loss_metrics``; what a model blind to its inputs scores (log C of a cross-entropy over C
            balanced classes, the entropy of the class frequencies otherwise). From ``plateau_steps`` values
            of such a metric on, a median of its last 20 not ``plateau_drop`` below it (once a finding, nor
            3 times the noise of that median) is ``loss_at_chance``, said instead of ``loss_plateau``. Empty
            (the default): not known, not judged.
    """

    persist: int = 3
    dead_zero_frac: float = 0.8
    dead_unit_share: float = 0.5
    dead_slope: float = 0.1
    saturation_index: float = 0.75
    gradient_orders: float = 3.0
    gradient_growth_orders: float = 3.0
    activation_orders: float = 3.0
    activation_growth_orders: float = 3.0
    update_ratio_high: float = 0.1
    update_ratio_low: float = 1e-6
    update_min_dims: int = 2
    loss_metrics: tuple[str, ...] = ("loss",)
    spike_window: int = 20
    spike_factor: float = 10.0
    spike_min_rise: float = 1.0
    spike_regain: float = 0.15
    diverge_factor: float = 10.0
    diverge_window: int = 5
    diverge_regain: float = 0.5
    diverge_blowup: float = 100.0
    plateau_steps: int = 50
    plateau_drop: float = 0.01
    chance: Any = ()

    def __post_init__(self) -> None:
        def need(name: str, ok: bool, expected: str) -> None:
            if not ok:
                raise ValueError(f"Thresholds.{name} must be {expected}, got {getattr(self, name)!r}.")

        def number(name: str) -> bool:
            value = getattr(self, name)
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        def whole(name: str, least: int) -> bool:
            value = getattr(self, name)
            return isinstance(value, int) and not isinstance(value, bool) and value >= least

        need("persist", whole("persist", 1), "a whole number >= 1 (recorded steps)")
        need("spike_window", whole("spike_window", 3), "a whole number >= 3 (steps)")
        need("diverge_window", whole("diverge_window", 2), "a whole number >= 2 (steps)")
        need("update_min_dims", whole("update_min_dims", 0), "a whole number >= 0")
        need("plateau_steps", whole("plateau_steps", 2 * PLATEAU_WINDOW),
             f"a whole number >= {2 * PLATEAU_WINDOW} (its first and its last {PLATEAU_WINDOW} values)")
        need("plateau_drop", number("plateau_drop") and 0 < self.plateau_drop < 1, "a fraction in (0, 1)")
        for name in ("dead_zero_frac", "dead_unit_share", "dead_slope", "saturation_index"):
            need(name, number(name) and 0 < getattr(self, name) <= 1, "a fraction in (0, 1]")
        for name in ("gradient_orders", "gradient_growth_orders", "activation_orders", "activation_growth_orders",
                     "spike_factor", "spike_min_rise"):
            need(name, number(name) and getattr(self, name) > 0, "a positive number")
        need("diverge_factor", number("diverge_factor") and self.diverge_factor > 1, "a number > 1")
        need("diverge_blowup", number("diverge_blowup") and self.diverge_blowup > 1, "a number > 1")
        for name in ("diverge_regain", "spike_regain"):
            need(name, number(name) and 0 <= getattr(self, name) <= 1, "a fraction in [0, 1]")
        for name in ("update_ratio_high", "update_ratio_low"):
            need(name, number(name) and getattr(self, name) > 0, "a positive number")
        need("update_ratio_low", self.update_ratio_low < self.update_ratio_high, "below update_ratio_high")
        names = self.loss_metrics
        need("loss_metrics", isinstance(names, tuple) and all(isinstance(n, str) and n for n in names),
             "a tuple of non-empty strings (metric names), e.g. ('loss', 'val_loss')")
        chance = self.chance
        if isinstance(chance, (int, float)) and not isinstance(chance, bool):
            chance = {n: chance for n in names}
        if isinstance(chance, dict):
            chance = tuple(sorted(chance.items(), key=lambda kv: str(kv[0])))
        need("chance", isinstance(chance, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and p[0]
            and isinstance(p[1], (int, float)) and not isinstance(p[1], bool) and math.isfinite(p[1])
            for p in chance), "a finite number or a dict {loss metric: chance level} of finite numbers, e.g. "
            "{'loss': math.log(2)} (a cross-entropy over 2 balanced classes)")
        object.__setattr__(self, "chance", tuple((n, float(v)) for n, v in chance))  # (a number for each metric)
        judged = {n.lower() for n in names}
        need("chance", all(n.lower() in judged for n, _ in self.chance),
             f"levels of metrics in loss_metrics {names} (add the metric to loss_metrics to judge it)")


def with_run_facts(metadata: Any, thresholds: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with what a run says of itself: its metadata's ``chance`` (the chance level of
    its loss metrics, which a built-in classification experiment records, and ``watch(metadata=)``
    takes), where the caller set no chance level."""
    chance = metadata.get("chance") if isinstance(metadata, dict) else None
    given = {**thresholds, **overrides} if isinstance(thresholds, dict) else overrides
    if chance in (None, {}, ()) or "chance" in given or (isinstance(thresholds, Thresholds) and thresholds.chance):
        return overrides
    if isinstance(chance, dict):  # (the levels of the metrics judged: the caller may judge others)
        judged = given.get("loss_metrics", thresholds.loss_metrics if isinstance(thresholds, Thresholds)
                           else Thresholds.loss_metrics)
        judged = {judged.lower()} if isinstance(judged, str) else {str(n).lower() for n in judged}
        chance = {name: level for name, level in chance.items() if str(name).lower() in judged}
    return {**overrides, "chance": chance} if chance else overrides


def _thresholds(thresholds: Thresholds | dict | None, overrides: dict[str, Any]) -> Thresholds:
    if thresholds is None:
        thresholds = Thresholds()
    elif isinstance(thresholds, dict):
        overrides = {**thresholds, **overrides}
        thresholds = Thresholds()
    elif not isinstance(thresholds, Thresholds):
        raise TypeError(f"thresholds must be a workbench.diagnose.Thresholds, a dict of its fields or None, "
                        f"got {thresholds!r}.")
    known = {f.name for f in fields(Thresholds)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"Unknown threshold(s) {unknown}; the thresholds are: {sorted(known)}.")
    if "loss_metrics" in overrides and isinstance(overrides["loss_metrics"], (list, str)):
        value = overrides["loss_metrics"]
        overrides["loss_metrics"] = (value,) if isinstance(value, str) else tuple(value)
    return replace(thresholds, **overrides) if overrides else thresholds


# ---------------------------------------------------------------------------------------- rows
_STATS = ("mean", "std", "min", "max", "norm", "zero_frac", "nan_count", "inf_count", "numel")


def _parse_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, tuple):
        return shape
    text = str(shape).strip("()[] ")
    return tuple(int(p) for p in text.replace(" ", "").split(",") if p)


@dataclass
class _Layout:
    """What the diagnoser knows of one step's row keys (consecutive steps share it)."""

    keys: tuple
    kind: np.ndarray  # per row: the kind's name
    alias: np.ndarray  # per row: another site of the step returned this tensor (a container's output)
    order: np.ndarray  # per row: its site's position in the forward order
    ndim: np.ndarray
    per_unit: np.ndarray  # entries per unit (all but dim 1), for the dead units' bound
    units: np.ndarray
    names: list[str]
    param_pair: dict[int, int]  # update row -> param row of the same parameter
    grad_columns: np.ndarray  # output-gradient rows (not aliases) in forward order
    act_columns: np.ndarray  # activation rows (not aliases) in forward order
    pair_columns: tuple[np.ndarray, np.ndarray]  # (update rows, param rows) of param_pair
    params: np.ndarray  # param rows
    grad_of: dict[int, int]  # param row -> the param_grad row of the same parameter
    param_grads: bool  # the step recorded parameter gradients (of some parameter)
    feed_bias: np.ndarray  # per activation row: the param_grad row of the bias that feeds its units, or -1
    feed_weight: np.ndarray  # per activation row with a feed_bias: the param_grad row of that layer's weight, or -1
    #: per activation row: the activation row just before it in forward order, of the same shape, or -1
    previous: np.ndarray
    #: per activation row: the activation row just before it in forward order, of any shape, or -1
    upstream: np.ndarray
    own_params: dict[str, list[int]]  # module -> its param rows (its own parameters' values)
    out_grad: dict[str, int]  # module -> the grad_output row of its first output at its first call
    #: (param_grad row of a bias of shape (F,), the grad_output rows of its module's calls, their entries per unit,
    #: -1 per call): the bias's gradient sums its module's output gradient over those entries, at most
    #: sqrt(m) ||grad_output||; or (param_grad row of the weight of a Linear or a convolution without bias in a
    #: Sequential, its grad_output row, k, the activation row of its input): at most sqrt(k) ||grad_output|| ||input||,
    #: k 1 for a Linear, a convolution's kernel offsets times 2 per spatial dim (:meth:`Diagnoser._weight_bounds`)
    bias_bounds: list[tuple[int, list[int], list[int], list[int]]]


#: A parameter whose gradient is at least this fraction of it (in norm) and does not change at all is
#: ``not_updated``: a learning rate of 1e-4 moves it by ~1e-7 of itself, past float32's resolution (6e-8).
MOVING_GRADIENT = 1e-3

#: How a step that left a parameter's value as it was reads beside its gradient (:meth:`Diagnoser._still_codes`):
#: its ``.grad`` grew as a sum over steps does, and the parameter changed at a recorded step before: gradient
#: accumulation over micro-batches with ``w.step()`` per micro-batch, the optimizer stepping every k-th (no
#: ``not_updated``);
STILL_ACCUMULATING = 1
#: the same, but it never changed yet: a ``.grad`` never zeroed of a parameter no optimizer steps (one built on a copy
#: of the model), or accumulation whose first optimizer step has not come (``not_updated``, its evidence saying so);
STILL_GROWING = 2
#: it changed at this step, ending a streak of unchanged steps whose gradient at its last is larger than at its first:
#: a sum's, gradient accumulation whose optimizer step came (a ``not_updated`` held only at that streak's steps is
#: taken back: the watch began inside an accumulation, or the streak was longer than those before).
STILL_SUM_ENDED = 3

#: Without ``update`` rows, a parameter whose norm, mean, std, min and max each moved by at most this many float32
#: roundings of its scale (``np.finfo(np.float32).eps`` of it) since the recorded step before did not change, as
#: far as float32 shows: a step that rounds away on most entries (a gradient clipped to nothing, a learning rate far
#: too small) moves an entry here and there by one rounding, which is still no update; a step of
#: ``update_ratio_low`` (1e-6, some 8 roundings) moves its largest entries by more.
UNCHANGED_ROUNDINGS = 2

#: The most recorded steps in a row a bias's ``.grad`` is taken to sum while its value stays as it was (gradient
#: accumulation on purpose: ``w.step()`` per micro-batch, the optimizer stepped every k-th). A bias unchanged for
#: longer is stepped by no optimizer (one built on a copy of the model, whose ``zero_grad()`` leaves these
#: gradients as they are), and its ``.grad`` is judged by each step's own bound again (``gradients_accumulate``).
MAX_ACCUMULATED_STEPS = 32

#: Gradient accumulation's streaks of unchanged steps come one optimizer step apart: a second streak as long as the
#: first, begun within this many times its length after it ended (a sum that now and then falls short of its first
#: gradient skips one), bears the first out as accumulation (:meth:`Diagnoser._sum_ended`).
RHYTHM_GAPS = 4

#: The zero fraction of the sparsest live unit a ``dead_units`` finding must not be taken for by chance: healthy ReLU
#: layers of the built-in experiments read up to ~0.72 zeros. A unit 0 for this share of its inputs is 0 for all ``M``
#: of them with chance ``LIVE_ZERO_FRAC^M``: a site with ``u`` units is found dead only once the steps it held saw
#: ``M`` entries per unit with ``u LIVE_ZERO_FRAC^M < 1`` (a batch of 256: one step; a batch of 1 and 32 units: 16).
LIVE_ZERO_FRAC = 0.8

#: A finding that holds again at most this many steps after it ended is the same finding, taken up again;
#: later in a run, at most ``REJOIN_FRACTION`` of the steps so far (a gap a chart of the whole run hardly shows:
#: a layer that saturates at step 847, lets go for 7 steps and saturates for good is one finding, not three).
REJOIN_STEPS = 3
REJOIN_FRACTION = 0.02


class Diagnoser:
    """Findings of a run, computed incrementally from its recorded steps.

    Feed it :class:`~workbench.instrument.Update`\\ s (``w.subscribe(d.feed)``, or ``d.attach(w)``
    which also takes the steps recorded before), :class:`~workbench.instrument.StepRecord`\\ s, or
    a stored run's rows (:meth:`feed_frame`); :meth:`findings` returns the frame. Feeding only
    queues; the work is done by the next :meth:`findings` (or when the queue is long), on the
    caller's thread, never the training's. Thread-safe.

    Args:
        thresholds: a :class:`Thresholds` (default: the documented ones) or a dict of overrides.
        **overrides: single thresholds to change (``persist=5``).
    """

    def __init__(self, thresholds: Thresholds | dict | None = None, **overrides: Any) -> None:
        self.thresholds = t = _thresholds(thresholds, overrides)
        self._lock = threading.RLock()
        self._pending: list[Any] = []
        self.last_step = 0
        self.first_step: int | None = None  # (a run that continues another starts far from step 1)
        self.steps_seen = 0
        self.dropped = 0
        self._layout: _Layout | None = None
        self._order: dict[tuple, int] = {}  # (module, call, tensor) -> forward position
        self._calls: dict[tuple[str, str], int] = {}  # (kind, module) -> calls in a step
        # findings: (finding, site key) -> episode state
        self._open: dict[tuple, dict] = {}
        self._closed: list[dict] = []
        self._nan: dict | None = None
        self._nan_sites: set = set()
        self._nan_last = 0
        self._row_step: int | None = None  # the last step that recorded rows
        self._loss_nan: dict[str, tuple[int, float]] = {}  # loss metric -> (step, value) it was first not finite
        self._grad_start: dict[int, float] = {}  # step -> the largest output-gradient RMS, first steps
        self._act_start: dict[int, float] = {}  # step -> the largest activation RMS, first steps
        #: bias key -> (step, ||grad||, ||grad|| over its bound) first recorded
        self._bias_start: dict[tuple, tuple[int, float, float]] = {}
        #: bias key -> (step, its value's norm, mean, std, min, max, the bound its .grad may reach, whether that step
        #: left its value as it was, how many steps in a row before it did) at the last recorded step (_bias_windows)
        self._bias_window: dict[tuple, tuple] = {}
        #: param key -> (||grad|| at the first step of its streak of unchanged steps, ||grad||, whether it changed at a
        #: recorded step, its unchanged steps since it last changed, the longest streak of a sum that ended in a
        #: change) at the last recorded step (_still_codes)
        self._still: dict[tuple, tuple] = {}
        #: param key -> (the step the first of its streaks of a sum one after another began, the step the last of
        #: them began, the step a change ended it), while no streak as long after it has borne them out as gradient
        #: accumulation's rhythm (:meth:`_sum_ended`)
        self._first_sum: dict[tuple, tuple[int, int, int]] = {}
        #: param keys whose streaks of a sum came in a rhythm: gradient accumulation (:meth:`_sum_ended`)
        self._in_rhythm: set[tuple] = set()
        # the last site in forward order, where no gradient passed it at the first step judged (its weights all 0: a
        # last layer initialized at 0), while its parameters' norm grows: {"site", "module", "norm"}, else None
        self._zero_start: dict | None = None
        self._prev_params: dict[tuple, tuple] = {}  # layout keys -> (step, norms, means, stats) of its params
        self._loss_names: dict[str, bool] = {}
        self._from_zero: dict[tuple, bool] = {}  # param key -> it started at 0 and still grows from there
        self._metrics: dict[str, dict] = {}
        self._spike_window = t.spike_window
        self._chance = {n.lower(): v for n, v in t.chance}  # loss metric -> its chance level (loss_at_chance)
        self._subscription = None
        self._cache: tuple[int, pd.DataFrame] | None = None  # (version, the findings then)
        self._rows: list[tuple] = []  # the rows of that frame
        self._version = 0  # changes with every change of the findings

    # ------------------------------------------------------------------ feeding
    def feed(self, update: Any) -> None:
        """Queue what arrived: an ``Update``, a ``StepRecord`` or an iterable of them (step order)."""
        records = getattr(update, "records", None)
        if records is None:
            single = all(hasattr(update, a) for a in ("step", "keys", "sums"))
            iterable = hasattr(update, "__iter__") and not isinstance(update, (str, bytes, pd.DataFrame))
            records = (update,) if single else tuple(update) if iterable else None
        if records is None or not all(all(hasattr(r, a) for a in ("step", "keys", "sums")) for r in records):
            raise TypeError(f"Diagnoser.feed() takes a recorder's Update, a StepRecord or a list of them (in step "
                            f"order), got {type(update).__name__}; for a frame of rows, use feed_frame(rows, metrics).")
        with self._lock:
            self.dropped += int(getattr(update, "dropped", 0) or 0)
            self._pending.extend(records)
            if len(self._pending) >= 256:
                self._absorb()

    def attach(self, watch: Any, interval: float = 0.1) -> Any:
        """Follow a :class:`~workbench.Watch`: the steps it has recorded so far, then every new one
        (a subscription of its recorder, on a thread of its own). Returns the subscription."""
        recorder = getattr(watch, "recorder", None)
        if recorder is None or not hasattr(recorder, "subscribe"):
            raise TypeError(f"attach() needs a workbench Watch (or anything with a recorder), got "
                            f"{type(watch).__name__}.")
        with self._lock:
            self._subscription = recorder.subscribe(self.feed, interval=interval)
            self.feed(recorder.records())
        return self._subscription

    @property
    def received(self) -> int:
        """Steps received so far, taken in or still queued."""
        with self._lock:
            return self.steps_seen + len(self._pending)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until what the attached watch recorded so far was delivered here (False on timeout)."""
        subscription = self._subscription
        return subscription.flush(timeout) if subscription is not None else True

    def detach(self) -> None:
        """Stop following the watch (what arrived stays)."""
        if self._subscription is not None:
            self._subscription.unsubscribe()
            self._subscription = None

    def feed_frame(self, rows: pd.DataFrame, metrics: pd.DataFrame | None = None) -> None:
        """Take a stored run's rows (``ROW_COLUMNS``, recorded order) and metrics frame (wide, or
        long: ``step, name, value``). A long run may come in parts, consecutive steps each."""
        _check_frame(rows, metrics)
        with self._lock:
            self._absorb()
            by_step: dict[int, dict[str, float]] = {}
            if metrics is not None and len(metrics) and _is_long(metrics):
                for step, name, value in metrics.itertuples(index=False):  # (as logged: a NaN is a NaN)
                    by_step.setdefault(int(step), {})[name] = float(value)
            elif metrics is not None and len(metrics):
                names = [c for c in metrics.columns if c != "step"]
                values = metrics[names].to_numpy(np.float64) if names else np.zeros((len(metrics), 0))
                logged = _logged(metrics[names].notna().to_numpy()) if names else np.zeros((len(metrics), 0), bool)
                for step, row, mask in zip(metrics.step.to_numpy(), values, logged):
                    by_step[int(step)] = {n: float(v) for n, v, m in zip(names, row, mask) if m}
            steps = rows.step.to_numpy() if len(rows) else np.zeros(0, np.int64)
            starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if len(steps) else np.zeros(0, np.intp)
            ends = np.r_[starts[1:], len(steps)]
            keys_all = (list(zip(rows.module.tolist(), rows.call.to_numpy(np.int64).tolist(), rows.kind.tolist(),
                                 rows.tensor.tolist(), rows["shape"].tolist())) if len(rows) else [])
            table = {c: rows[c].to_numpy(np.float64) for c in _STATS} if len(rows) else {}
            spans = {int(steps[a]): (a, b) for a, b in zip(starts, ends)}
            block: list[tuple[int, int, int]] = []  # (step, first row, end row), of the same keys

            def flush() -> None:
                if block:
                    a, b = block[0][1], block[0][2]
                    keys = tuple(keys_all[a:b])
                    stats = {c: np.stack([v[x:y] for _, x, y in block]) for c, v in table.items()} if b > a else {}
                    self._take_block([s for s, _, _ in block], keys, stats, None,
                                     [by_step.get(s, {}) for s, _, _ in block])
                    block.clear()

            layout = None
            for step in sorted(spans.keys() | by_step.keys()):
                if step <= self.last_step and self.steps_seen:
                    continue
                a, b = spans.get(step, (0, 0))
                this = keys_all[a:b]
                if block and this != layout:
                    flush()
                layout = this
                block.append((step, a, b))
            flush()

    # ------------------------------------------------------------------ results
    def findings(self) -> Findings:
        """The findings so far: most severe first, then the newest by last step, of those the one that began first."""
        with self._lock:
            self._absorb()
            if self._cache is not None and self._cache[0] == self._version:
                return self._cache[1].copy()
            items = [*self._closed, *(e for e in self._open.values() if e["count"] >= e["need"])]
            if self._nan is not None:
                items.append(self._nan_finding())
            # (of those that held last, the one that began first: a cause shows before its effects, as a layer that
            # died at step 1 before the weights it stills, whose unchanged values tell from step 2 without update rows;
            # ties: the order of FINDINGS, the cause before its effects: a NaN's origin before a NaN loss)
            order = {name: i for i, name in enumerate(FINDINGS)}
            items.sort(key=lambda e: (-_RANK[e.get("severity", FINDINGS[e["finding"]][0])], -e["last"], e["start"],
                                      order[e["finding"]]))
            rows = _one_per_site([self._row(e) for e in items])
            # (again: a finding made one of two holds to the later one's last step, and may lead others now)
            rows.sort(key=lambda r: (-_RANK[r["severity"]], -r["last_step"], r["step"], order[r["finding"]]))
            grouped = _behind_floor_dead(_grouped(rows, self.first_step or 1))
            frame = self._frame([tuple(r[c] for c in COLUMNS) for r in grouped])
            self._cache = (self._version, frame)
            return frame.copy()

    def _frame(self, rows: list[tuple]) -> Findings:
        """The findings frame of ``rows`` (tuples of :data:`COLUMNS`' values). Drawn anew only where the
        rows differ in more than a few cells from the last frame's: a finding that grows each step changes its
        last step and evidence, two cells set in the frame drawn before, not a frame drawn again."""
        before, self._rows = self._rows, rows
        if self._cache is not None and len(before) == len(rows):
            changed = [(i, j, value) for i, (old, new) in enumerate(zip(before, rows)) if old != new
                       for j, value in enumerate(new) if value != old[j]]
            if len(changed) <= 2 * len(COLUMNS):
                frame = self._cache[1]
                for i, j, value in changed:
                    frame.iat[i, j] = value
                return frame
        columns = list(zip(*rows)) if rows else [()] * len(COLUMNS)
        return Findings({c: np.asarray(v, np.int64) if c in ("step", "last_step", "call", "consequences") else
                         pd.Series(v, dtype=object) for c, v in zip(COLUMNS, columns)}, columns=list(COLUMNS))

    def _row(self, e: dict) -> dict:
        severity, hint = FINDINGS[e["finding"]]
        evidence = e["evidence"]
        text = evidence(e) if callable(evidence) else evidence
        module, call, tensor, kind = e.get("module", ""), e.get("call", -1), e.get("tensor", ""), e.get("kind", "")
        return {"step": e["start"], "last_step": e["last"], "site": e["site"], "finding": e["finding"],
                "severity": e.get("severity", severity), "evidence": text, "hint": hint, "kind": kind,
                "module": module, "call": call, "tensor": tensor, "cause": "", "consequences": 0,
                "order": e.get("order", -1), "floor": bool(e.get("floor"))}

    # ------------------------------------------------------------------ the work
    def _absorb(self) -> None:
        pending, self._pending = self._pending, []
        last = self.last_step if self.steps_seen else -math.inf
        records = []
        for record in pending:  # (a step seen from both the recorder's buffer and the subscription: once)
            if record.step > last:
                records.append(record)
                last = record.step
        start = 0
        while start < len(records):  # consecutive steps that recorded the same rows, together
            end, keys = start + 1, records[start].keys
            while end < len(records) and records[end].keys == keys:
                end += 1
            block = records[start:end]
            stats = {}
            if len(keys):
                n, rows = len(block), len(keys)
                flat = finish(np.tile(block[0].numel, n), np.concatenate([r.sums for r in block]))
                stats = {c: flat[c].reshape(n, rows) for c in _STATS}
            self._take_block([r.step for r in block], keys, stats, block[0].tensors, [r.metrics for r in block])
            start = end

    def _weight_bounds(self, keys: tuple, alias_of: np.ndarray, param_grads: dict[tuple, int],
                       outputs: dict[str, list[int]]) -> list[tuple[int, list[int], list[int], list[int]]]:
        """The weights without a bias beside them whose gradient the rows bound (:attr:`_Layout.bias_bounds`): of a
        Linear (a 2-d weight ``(out, in)``) or a convolution (a weight ``(out, in / groups, *kernel)`` of 3 to 5 dims,
        its output and its input of as many, ``(B, C, *spatial)``), of a module called once a step, without
        submodules or a bias, whose input the rows hold (:meth:`_input_row`): a Sequential's child. A model without
        any bias (LLaMA-style, convolutions before a norm layer) has a forgotten ``zero_grad()`` found so too, where
        its layers are chained in a Sequential; anywhere else the input is not known from the rows (a residual adds
        to it), and no bound is taken.

        A convolution's weight gradient at each of its ``K`` kernel offsets is ``grad_output^T`` times the input's
        entries that offset reads, each entry of the input at most once with zero padding, at most twice per spatial
        dim with reflect or circular padding (or replicate padding of 1): at most ``2^(d/2) ||grad_output||
        ||input||`` an offset, ``sqrt(K) 2^(d/2)`` times it in all (entries: ``K 2^d``)."""
        rows_of: dict[tuple[str, str], list[int]] = {}
        for i, (module, _call, knd, _tensor, _shape) in enumerate(keys):
            rows_of.setdefault((knd, module), []).append(i)
        bounds = []
        for (module, tensor), w in param_grads.items():
            shape = _parse_shape(keys[w][4])
            if tensor != "weight" or not 2 <= len(shape) <= 5 or (module, "bias") in param_grads or \
                    any(k[0].startswith(module + ".") for k in keys):
                continue
            out_rows = outputs.get(module, [])
            if len(out_rows) != 1 or len(rows_of.get(("activation", module), [])) != 1 or \
                    any(self._calls.get((kind, module), 1) != 1 for kind in ("activation", "grad_output")):
                continue
            source = self._input_row(keys, alias_of, rows_of, module)
            if source < 0:
                continue
            out_shape, in_shape = _parse_shape(keys[out_rows[0]][4]), _parse_shape(keys[source][4])
            if len(shape) == 2 and len(out_shape) >= 2 and out_shape[-1] == shape[0] and \
                    in_shape == (*out_shape[:-1], shape[1]):
                bounds.append((w, out_rows, [1], [source]))
            elif len(shape) >= 3 and len(out_shape) == len(in_shape) == len(shape) and out_shape[0] == in_shape[0] \
                    and shape[0] == out_shape[1] and shape[1] and in_shape[1] % shape[1] == 0:
                kernel = int(np.prod(shape[2:]))
                bounds.append((w, out_rows, [kernel * 2 ** (len(shape) - 2)], [source]))
        return bounds

    def _input_row(self, keys: tuple, alias_of: np.ndarray, rows_of: dict[tuple[str, str], list[int]],
                   module: str) -> int:
        """The activation row that holds the input of ``module`` (a row its own, not another's alias), or -1: where
        ``module`` is the child ``P.k`` of a container ``P`` that returns its last child's output (its own output row
        an alias of that child's: an ``nn.Sequential``), child ``P.(k-1)``'s output, called once (a Sequential
        itself: its last child's output, the row it aliases); where it is ``P.0``, the input of ``P``, found so in
        turn (a Sequential nested in another at ``Q.k``, ``k`` > 0). The model's own input has no row: the first
        child of the model's own Sequential has none."""
        parent, _, index = module.rpartition(".")
        own = rows_of.get(("activation", parent), [])
        if not index.isdigit() or len(own) != 1 or alias_of[own[0]] < 0 or \
                self._calls.get(("activation", parent), 1) != 1:
            return -1
        if int(index) == 0:
            return self._input_row(keys, alias_of, rows_of, parent) if parent else -1
        before = f"{parent}.{int(index) - 1}" if parent else str(int(index) - 1)
        acts = rows_of.get(("activation", before), [])
        if len(acts) != 1 or self._calls.get(("activation", before), 1) != 1 or \
                self._calls.get(("grad_output", before), 1) != 1:
            return -1
        return int(alias_of[acts[0]]) if alias_of[acts[0]] >= 0 else acts[0]

    def _learn(self, keys: tuple, stats: dict, tensors: np.ndarray | None) -> _Layout:
        n = len(keys)
        kind = np.array([k[2] for k in keys], dtype=object) if n else np.zeros(0, object)
        calls: dict[tuple[str, str], int] = {}
        for module, call, knd, _tensor, _shape in keys:
            calls[(knd, module)] = max(calls.get((knd, module), 0), call + 1)
        for key, count in calls.items():
            self._calls[key] = max(self._calls.get(key, 0), count)
        alias = np.zeros(n, bool)
        alias_of = np.full(n, -1, np.int64)  # per row: the earlier row whose tensor it is (a container's output)
        seen: dict[tuple, list[int]] = {}
        last_of: dict[str, int] = {}  # kind -> its row recorded last
        for i, (module, call, knd, tensor, shape) in enumerate(keys):
            if knd not in ("activation", "grad_output"):
                continue
            if tensors is not None:
                fingerprint = (knd, int(tensors[i]))
                alias_of[i] = seen[fingerprint][0] if fingerprint in seen else -1
            else:  # (a stored run) the same kind, shape and statistics in a container of an earlier site
                fingerprint = (knd, str(shape), *(float(stats[c][i]) for c in ("mean", "std", "min", "max", "norm")))
                telling = stats["zero_frac"][i] < 1 and stats["numel"][i] > 1
                # (an output all 0 tells little by its statistics: a container's only where its row follows the
                # earlier site's, the container returning what its last child just did, as a live run's tensors say)
                alias_of[i] = next((j for j in seen.get(fingerprint, []) if (telling or j == last_of.get(knd))
                                    and (module == "" or keys[j][0].startswith(module + "."))), -1)
            alias[i] = alias_of[i] >= 0
            seen.setdefault(fingerprint, []).append(i)
            last_of[knd] = i
        for module, call, knd, tensor, _shape in keys:
            if knd == "activation":
                self._order.setdefault((module, call, tensor), len(self._order))
        order = np.array([self._order.get((k[0], k[1], k[3]), -1) for k in keys], np.int64)
        shapes = [_parse_shape(k[4]) for k in keys]
        ndim = np.array([len(s) for s in shapes], np.int64)
        units = np.array([s[1] if len(s) >= 2 else 0 for s in shapes], np.int64)
        per_unit = np.array([int(np.prod(s)) // s[1] if len(s) >= 2 and s[1] else 0 for s in shapes], np.int64)
        names = [site_name(k[0], k[1], k[3], self._calls.get((k[2], k[0]), 1) > 1, k[2]) for k in keys]
        params = {(k[0], k[3]): i for i, k in enumerate(keys) if k[2] == "param"}
        pair = {i: params[(k[0], k[3])] for i, k in enumerate(keys) if k[2] == "update" and (k[0], k[3]) in params}
        grads = np.flatnonzero((kind == "grad_output") & ~alias & (order >= 0))
        grads = grads[np.argsort(order[grads], kind="stable")]
        acts_in_order = np.flatnonzero((kind == "activation") & ~alias & (order >= 0))
        acts_in_order = acts_in_order[np.argsort(order[acts_in_order], kind="stable")]
        pair_columns = (np.fromiter(pair.keys(), np.int64, len(pair)), np.fromiter(pair.values(), np.int64, len(pair)))
        param_grads = {(k[0], k[3]): i for i, k in enumerate(keys) if k[2] == "param_grad"}
        grad_of = {i: param_grads[key] for key, i in params.items() if key in param_grads}
        # the bias gradient of the layer whose output an activation site takes (the site just before it in forward
        # order, called once a step; its bias one entry per unit, along dim 1 of a (B, F) or (B, C, H, W) output, along
        # the last of a (B, T, F) sequence, whose units are then its features, not its positions): a unit that outputs
        # 0 for the whole batch passes no gradient back, so its entry of the bias's gradient is exactly 0; their zeros
        # count the dead units
        feed_bias = np.full(n, -1, np.int64)
        feed_weight = np.full(n, -1, np.int64)
        acts = sorted((int(order[i]), i) for i in np.flatnonzero((kind == "activation") & ~alias & (order >= 0)))
        for (_, before), (_, i) in zip(acts[:-1], acts[1:]):
            module = keys[before][0]
            b = param_grads.get((module, "bias"))
            if b is None or self._calls.get(("activation", module), 1) != 1:
                continue
            bias_shape = _parse_shape(keys[b][4])
            if ndim[i] == 3 and bias_shape == (shapes[i][-1],) and shapes[i][-1]:
                units[i], per_unit[i] = shapes[i][-1], int(np.prod(shapes[i])) // shapes[i][-1]
            elif not (ndim[i] in (2, 4) and bias_shape == (int(units[i]),)):
                continue
            feed_bias[i] = b
            feed_weight[i] = param_grads.get((module, "weight"), -1)
        previous = np.full(n, -1, np.int64)
        upstream = np.full(n, -1, np.int64)
        for (_, i), (_, after) in zip(acts[:-1], acts[1:]):
            upstream[after] = i
            if keys[i][4] == keys[after][4]:
                previous[after] = i
        own_params: dict[str, list[int]] = {}
        for i, (module, _call, knd, _tensor, _shape) in enumerate(keys):
            if knd == "param":
                own_params.setdefault(module, []).append(i)
        out_grad: dict[str, int] = {}
        for i, (module, call, knd, _tensor, _shape) in enumerate(keys):
            if knd == "grad_output" and call == 0:
                out_grad.setdefault(module, i)
        # a bias added to its module's output (a Linear's, a convolution's, a norm layer's): its gradient is that
        # output's gradient summed over the m entries of each unit, so at most sqrt(m) times its norm (Cauchy-Schwarz),
        # summed over the module's calls of the step; a module with a structured output or other submodules is left out
        # (a bias used inside it, not added to its output: an attention's in_proj_bias)
        outputs: dict[str, list[int]] = {}
        for i, (module, _call, knd, _tensor, _shape) in enumerate(keys):
            if knd == "grad_output":
                outputs.setdefault(module, []).append(i)
        bias_bounds = []
        for (module, tensor), b in param_grads.items():
            shape = _parse_shape(keys[b][4])
            rows = outputs.get(module, [])
            if tensor != "bias" or len(shape) != 1 or not shape[0] or not rows or \
                    len({keys[r][3] for r in rows}) != 1 or any(k[0].startswith(module + ".") for k in keys):
                continue
            sizes = [_parse_shape(keys[r][4]) for r in rows]
            if all(shape[0] in size[1:] for size in sizes):
                bias_bounds.append((b, rows, [int(np.prod(size)) // shape[0] for size in sizes], [-1] * len(rows)))
        bias_bounds += self._weight_bounds(keys, alias_of, param_grads, outputs)
        return _Layout(keys, kind, alias, order, ndim, per_unit, units, names, pair, grads, acts_in_order,
                       pair_columns, np.flatnonzero(kind == "param"), grad_of, bool(param_grads), feed_bias,
                       feed_weight, previous, upstream, own_params, out_grad, bias_bounds)

    def _take_block(self, steps: list[int], keys: tuple, stats: dict, tensors: np.ndarray | None,
                    metrics: list[dict]) -> None:
        """Consecutive steps that recorded the same rows: ``stats`` holds (steps, rows) arrays. What
        no check can find is screened out for the whole block at once; the steps left are judged
        one by one, in order (the episodes of a finding are kept step by step)."""
        layout = None
        screened = np.zeros(len(steps), bool)
        bounds = bias_most = still = still_from = None
        if keys:
            layout = self._layout
            if layout is None or layout.keys != keys:
                layout = self._layout = self._learn(keys, {c: v[0] for c, v in stats.items()}, tensors)
            screened, bounds, bias_most, still, still_from = self._screen(steps, layout, stats)
        losses = [[(n, float(v)) for n, v in m.items() if self._is_loss(n)] if m else () for m in metrics]
        for i, step in enumerate(steps):
            self.last_step = max(self.last_step, step)
            if self.first_step is None:
                self.first_step = step
            self.steps_seen += 1
            if screened[i]:
                row = {c: v[i] for c, v in stats.items()}
                self._nan_check(step, layout, row)
                self._units_check(step, layout, row)
                self._gradient_check(step, layout, row)
                self._activation_check(step, layout, row)
                self._accumulation_check(step, layout, row, bias_most[i])
                self._update_check(step, layout, row, None if bounds is None else (bounds[i, 0], bounds[i, 1] > 0),
                                   (still[i], still_from[i]) if still.shape[1] else None)
            for name, value in losses[i]:
                self._metric_check(step, name, value, recorded=bool(keys))
            if keys:
                self._row_step = step
            if self._open:
                self._close_stale(rows=bool(keys), metrics=bool(losses[i]))

    def _is_loss(self, name: str) -> bool:
        known = self._loss_names.get(name)
        if known is None:
            known = self._loss_names[name] = name.lower() in {p.lower() for p in self.thresholds.loss_metrics}
        return known

    def _screen(self, steps: list[int], layout: _Layout, stats: dict) -> tuple[np.ndarray, np.ndarray | None,
                                                                               np.ndarray, np.ndarray, np.ndarray]:
        """Which steps of a block a check may find something at (the rest need no look), the
        bounds on the update ratios read from consecutive parameter values (runs without updates), the
        most each bias's ``.grad`` may hold per step (:meth:`_bias_windows`, which ``gradients_accumulate`` reads),
        and how each parameter's value reads beside its gradient, with the step its streak of unchanged steps began
        (:meth:`_still_codes`, which ``not_updated`` reads; (steps, 0) where no parameter is judged)."""
        t = self.thresholds
        n = len(steps)
        zero, lo, hi, mean, std, norm, numel = (stats[c] for c in ("zero_frac", "min", "max", "mean", "std", "norm",
                                                                   "numel"))
        still, still_from = np.zeros((n, 0), np.int8), np.zeros((n, 0), np.int64)
        with np.errstate(all="ignore"):
            look = ((stats["nan_count"] > 0) | (stats["inf_count"] > 0)).any(1)
            act = (layout.kind == "activation") & ~layout.alias
            if act.any():
                finite = np.isfinite(mean[:, act]) & np.isfinite(std[:, act])
                a_lo, a_hi, a_zero = lo[:, act], hi[:, act], zero[:, act]
                look |= (finite & (a_lo >= 0) & (a_zero >= t.dead_zero_frac)).any(1)
                fed = act & (layout.feed_bias >= 0)
                if fed.any():  # (a share of the units dead, counted by the bias gradient that feeds them)
                    bias_zero = zero[:, layout.feed_bias[fed]]
                    look |= ((lo[:, fed] >= 0) & (bias_zero >= t.dead_unit_share)).any(1)
                look |= (finite & (a_lo == a_hi) & (a_hi != 0) & (numel[:, act] > 1)).any(1)
                look |= (finite & (a_lo < 0) & (a_hi <= 0)).any(1)  # (dead at a floor below 0: _floor_dead)
                bounded = finite & (a_hi <= 1) & (a_lo >= -1) & (a_zero < 0.5) & (a_hi > a_lo)
                if bounded.any():
                    tanh = a_lo < 0
                    width = np.where(tanh, 2.0, 1.0)
                    mu = (mean[:, act] - np.where(tanh, -1.0, 0.0)) / width
                    var = (std[:, act] / width) ** 2
                    look |= (bounded & (var >= t.saturation_index * mu * (1 - mu) * 0.99)).any(1)
            g = layout.grad_columns
            if len(g):
                rms = norm[:, g] / np.sqrt(np.maximum(numel[:, g], 1))
                ok = np.isfinite(rms) & (rms > 0)
                logs = np.where(ok, np.log10(np.where(ok, rms, 1.0)), np.nan)
                count = ok.sum(1)
                first = np.argmax(ok, 1)
                last = len(g) - 1 - np.argmax(ok[:, ::-1], 1)
                rows = np.arange(n)
                spread = logs[rows, first] - logs[rows, last]
                look |= (count >= 2) & (np.abs(spread) > t.gradient_orders)
                # (an output gradient exactly 0 before a site that gets one: none reaches it)
                zero = np.isfinite(rms) & (rms == 0)
                look |= (count >= 1) & (zero & (np.arange(len(g)) < last[:, None])).any(1)
                # over steps: the largest RMS of each step against that of the run's first steps
                top = np.max(np.where(ok, logs, -np.inf), 1)
                need = max(t.persist - len(self._grad_start), 0)
                look[:need] = True  # (the gradients' scale is taken there, step by step)
                known = [math.log10(v) for v in self._grad_start.values()] + [v for v in top[:need] if np.isfinite(v)]
                if known:
                    look[need:] |= top[need:] - max(known) > t.gradient_growth_orders
            a = layout.act_columns
            if len(a):  # (activations: through depth, against the first site; over steps, against the first steps)
                rms = norm[:, a] / np.sqrt(np.maximum(numel[:, a], 1))
                ok = np.isfinite(rms) & (rms > 0)
                logs = np.where(ok, np.log10(np.where(ok, rms, 1.0)), np.nan)
                first = logs[np.arange(n), np.argmax(ok, 1)]
                top = np.max(np.where(ok, logs, -np.inf), 1)
                look |= ok.any(1) & (top - first > t.activation_orders)
                need = max(t.persist - len(self._act_start), 0)
                look[:need] = True  # (the activations' scale is taken there, step by step)
                known = [math.log10(v) for v in self._act_start.values()] + [v for v in top[:need] if np.isfinite(v)]
                if known:
                    look[need:] |= top[need:] - max(known) > t.activation_growth_orders
            bias_most = self._bias_windows(steps, layout, stats)
            for j, (b, *_) in enumerate(layout.bias_bounds):  # (larger than its backward passes make)
                look |= norm[:, b] > bias_most[:, j] * (1 + 1e-4)
            bounds = None
            if layout.param_pair:
                u, p = layout.pair_columns
                judged = layout.ndim[p] >= t.update_min_dims
                ratio = norm[:, u] / norm[:, p]
                look |= ((judged & ((ratio > t.update_ratio_high) | (ratio < t.update_ratio_low))).any(1))
                column = np.searchsorted(layout.params, p)  # (layout.params is sorted: rows in recorded order)
                unchanged, changed = np.zeros((n, len(layout.params)), bool), np.zeros((n, len(layout.params)), bool)
                unchanged[:, column], changed[:, column] = norm[:, u] == 0, np.isfinite(ratio) & (norm[:, u] > 0)
                still, still_from = self._still_codes(steps, layout, stats, unchanged, changed)
                if any(layout.keys[q][:4] not in self._from_zero or self._from_zero[layout.keys[q][:4]] for q in p):
                    look[:] = True  # (parameters that started at 0 are followed step by step until they grew)
            elif layout.params.size:
                bound, same, changed = self._param_bounds(steps, layout, stats)
                look |= (bound > max(1.0, t.update_ratio_high)).any(1) | same.any(1)
                still, still_from = self._still_codes(steps, layout, stats, same, changed)
                bounds = np.stack([bound, same.astype(np.float64)], 1)  # (steps, 2, params)
            look |= (still == STILL_SUM_ENDED).any(1)  # (the end of a sum may take back a finding)
        return look, bounds, bias_most, still, still_from

    def _bias_windows(self, steps: list[int], layout: _Layout, stats: dict) -> np.ndarray:
        """Per step and bias of ``layout.bias_bounds``, the most the backward passes its ``.grad`` may hold can give
        it: this step's bound (``sqrt(m) ||grad_output||`` summed over its module's calls), plus those of the steps
        before back to the last that changed the bias's value. A step that leaves the parameter as it was (its norm,
        mean, std, min and max within :data:`UNCHANGED_ROUNDINGS` of those of the recorded step before) ran no
        optimizer step, and so most likely no ``zero_grad()`` either: gradient accumulation on purpose, ``w.step()``
        per micro-batch and the optimizer stepped every k-th, sums the k micro-batches' gradients in ``.grad``. A bias
        the optimizer has not changed since the run's first recorded step sums them from there. A bias left as it was
        for more than :data:`MAX_ACCUMULATED_STEPS` steps in a row is stepped by no optimizer: each step after those
        has its own bound alone. Without the bias's value recorded, this step's bound alone."""
        norm = stats["norm"]
        value_of = {g: p for p, g in layout.grad_of.items()}
        most = np.zeros((len(steps), len(layout.bias_bounds)))
        eps = np.finfo(np.float32).eps
        for j, (b, outputs, entries, inputs) in enumerate(layout.bias_bounds):
            bound = _grad_bounds(norm, outputs, entries, inputs)
            p = value_of.get(b)
            if p is None:
                most[:, j] = bound
                continue
            key = layout.keys[b][:4]
            # (the .grad of this step's backward pass holds the step before's too where that step did not change the
            # value: the values are recorded at w.step(), after the optimizer's step; before the first, none ran)
            last_step, last_value, window, kept, held = self._bias_window.get(key, (None, None, 0.0, True, 0))
            value = np.stack([stats[c][:, p] for c in ("norm", "mean", "std", "min", "max")], 1).astype(np.float64)
            before = np.vstack([last_value if last_value is not None else np.full(5, np.nan), value[:-1]])
            before_step = np.r_[last_step if last_step is not None else -10, np.asarray(steps[:-1])]
            rms = value[:, 0] / np.sqrt(np.maximum(stats["numel"][:, p].astype(np.float64), 1.0))
            scale = np.stack([value[:, 0], rms, rms, np.maximum(np.abs(value[:, 3]), rms),
                              np.maximum(np.abs(value[:, 4]), rms)], 1)
            with np.errstate(all="ignore"):
                same = np.all(np.abs(value - before) <= UNCHANGED_ROUNDINGS * eps * scale, 1)
            kept_now = np.isfinite(value).all(1) & (same & (np.asarray(steps) - before_step == 1))
            if last_step is None:
                kept_now[0] = bool(np.isfinite(value[0]).all())
            # each step's bound plus the steps' before it back to one that changed the value (a sum restarted there)
            carry = np.r_[kept, kept_now[:-1]]
            # (how many steps in a row each carried the step before's, ``held`` of them before this block: past
            # MAX_ACCUMULATED_STEPS no sum, the .grad judged by this step's bound)
            at = np.arange(len(steps))
            last_restart = np.maximum.accumulate(np.where(carry, -1, at))
            in_a_row = np.where(carry, np.where(last_restart >= 0, at - last_restart, at + 1 + held), 0)
            carry &= in_a_row <= MAX_ACCUMULATED_STEPS
            total = np.cumsum(bound.astype(np.float64))
            restart = np.flatnonzero(~carry)
            base = np.zeros(len(steps))
            if restart.size:
                segment = np.searchsorted(restart, np.arange(len(steps)), side="right") - 1
                inside = segment >= 0
                offsets = total[restart] - bound[restart]
                base[inside] = offsets[segment[inside]]
                base[~inside] = -window
            else:
                base[:] = -window
            most[:, j] = total - base
            self._bias_window[key] = (int(steps[-1]), value[-1], float(most[-1, j]), bool(kept_now[-1]),
                                      int(in_a_row[-1]))
        return most

    def _still_codes(self, steps: list[int], layout: _Layout, stats: dict, unchanged: np.ndarray,
                     changed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per step and parameter (``layout.params``), how its value beside its gradient reads (``unchanged``: the
        step left its value as it was; ``changed``: it moved it), for ``not_updated``: :data:`STILL_ACCUMULATING`,
        :data:`STILL_GROWING`, :data:`STILL_SUM_ENDED`, else 0; and the step the streak of unchanged steps it is in
        (or a change ends) began at (-1: none yet).

        Gradient accumulation on purpose with ``w.step()`` per micro-batch leaves the value as it was for k-1 steps
        in a row, its ``.grad`` a sum that grows over them, then the optimizer changes it (and ``zero_grad()``
        restarts the sum): a streak of ``n`` unchanged steps is a sum's where the gradient at its last step is larger
        than at its first, and by more than half of ``sqrt(n)``. A step that left the value as it was is accumulating
        while its streak is no longer than the longest such streak that ended in a change before (the rhythm of the
        micro-batches): a weight stuck for good after it (an optimizer that lost it) is judged again past it. Before
        the first change, a step whose gradient is larger than at the streak's first (or is that first) is growing.
        A change that ends a sum's streak is :data:`STILL_SUM_ENDED` whatever came before it: a watch begun inside an
        accumulation sees a shorter streak first, or a change at once, and the rhythm is known only from the streaks
        after."""
        codes = np.zeros(unchanged.shape, np.int8)
        began = np.full(unchanged.shape, -1, np.int64)
        judged = [j for j, q in enumerate(layout.params) if int(q) in layout.grad_of]
        if not judged:
            return codes, began
        rows = np.asarray([layout.grad_of[int(layout.params[j])] for j in judged])
        keys = [layout.keys[layout.params[j]][:4] for j in judged]
        carried = [self._still.get(key, (math.nan, math.nan, False, 0, 0, -1)) for key in keys]
        start_grad, last_grad, seen, since, rhythm, start_step = (np.asarray(c) for c in zip(*carried))
        grad = stats["norm"][:, rows].astype(np.float64)
        still, moved = unchanged[:, judged], changed[:, judged]
        index = np.arange(len(steps))[:, None]
        # (unchanged steps since the last change, per parameter: a cumulative sum restarted at each step that changed
        # the value, or carried on from the block before)
        total = np.cumsum(still, 0)
        last_change = np.maximum.accumulate(np.where(moved, index, -1), 0)
        count = total - np.where(last_change >= 0, np.take_along_axis(total, np.maximum(last_change, 0), 0), -since)
        first = still & (count == 1)
        # (the gradient at the first step of each step's streak: this block's, or the one carried over)
        latest = np.maximum.accumulate(np.where(first, index, -1), 0)
        at_start = np.where(latest >= 0, np.take_along_axis(grad, np.maximum(latest, 0), 0), start_grad)
        streak_from = np.where(latest >= 0, np.asarray(steps, np.int64)[np.maximum(latest, 0)], start_step)
        with np.errstate(invalid="ignore", divide="ignore"):
            summing = grad > at_start
            grown = np.vstack([last_grad / start_grad, (grad / at_start)[:-1]])  # (at the step before)
        before = np.vstack([since, count[:-1]])
        # (a sum of n gradients of one scale is some sqrt(n) times one of them where they are noise, n times where they
        # agree; one gradient a step, zeroed each step (a learning rate 0 for a while), is as large at a streak's last
        # step as at its first, larger at half of them: grown past half of sqrt(n), and at all)
        ended = moved & (before >= 2) & (grown > np.maximum(1.0, np.sqrt(np.maximum(before, 1)) / 2))
        longest = np.maximum.accumulate(np.vstack([rhythm, np.where(ended, before, 0)]), 0)[1:]
        seen_before = np.vstack([seen, np.logical_or.accumulate(moved, 0)[:-1] | seen]).astype(bool)
        out = np.zeros(still.shape, np.int8)
        out[still & seen_before & (count <= longest)] = STILL_ACCUMULATING
        out[still & ~seen_before & (summing | first)] = STILL_GROWING
        out[ended] = STILL_SUM_ENDED
        codes[:, judged], began[:, judged] = out, streak_from
        for k, key in enumerate(keys):
            self._still[key] = (float(at_start[-1, k]), float(grad[-1, k]), bool(seen_before[-1, k] or moved[-1, k]),
                                int(count[-1, k]), int(longest[-1, k]), int(streak_from[-1, k]))
        return codes, began

    def _param_bounds(self, steps: list[int], layout: _Layout, stats: dict) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
        """Per step and parameter (``layout.params``), a lower bound on ``||update|| / ||param||`` from
        its values at consecutive recorded steps: ``||a - b|| >= | ||a|| - ||b|| |`` and
        ``>= sqrt(n) |mean(a) - mean(b)|`` (NaN where the step before was not recorded); whether
        it did not change since the recorded step before, as far as float32 shows (its norm, mean, std,
        min and max within :data:`UNCHANGED_ROUNDINGS` of those before: judged like a parameter's, of at
        least ``update_min_dims`` dimensions); and whether it did change since a step before that was recorded."""
        p = layout.params
        norm, mean, numel = stats["norm"][:, p], stats["mean"][:, p], stats["numel"][:, p]
        shape = np.stack([stats[c][:, p] for c in ("norm", "mean", "std", "min", "max")], 1)  # (steps, 5, params)
        before = self._prev_params.get(layout.keys)
        prev_shape = np.concatenate([before[3][None] if before is not None else np.full((1, 5, len(p)), np.nan),
                                     shape[:-1]])
        with np.errstate(all="ignore"):
            # each statistic's scale: the norm's its own, the others' an entry's (the RMS; min's and max's at
            # least their own magnitude)
            rms = norm / np.sqrt(np.maximum(numel, 1))
            scale = np.stack([norm, rms, rms, np.maximum(np.abs(shape[:, 3]), rms),
                              np.maximum(np.abs(shape[:, 4]), rms)], 1)
            moved = np.abs(shape - prev_shape) <= UNCHANGED_ROUNDINGS * np.finfo(np.float32).eps * scale
        same = moved.all(1) & np.isfinite(shape).all(1) & (norm > 0)
        same[:, layout.ndim[p] < self.thresholds.update_min_dims] = False
        changed = ~moved.all(1) & np.isfinite(shape).all(1) & np.isfinite(prev_shape).all(1)
        changed[:, layout.ndim[p] < self.thresholds.update_min_dims] = False
        step_array = np.asarray(steps)
        prev_norm = np.vstack([before[1] if before is not None else np.full(len(p), np.nan), norm[:-1]])
        prev_mean = np.vstack([before[2] if before is not None else np.full(len(p), np.nan), mean[:-1]])
        prev_step = np.r_[before[0] if before is not None else -10, step_array[:-1]]
        with np.errstate(all="ignore"):
            bound = np.maximum(np.abs(norm - prev_norm), np.sqrt(numel) * np.abs(mean - prev_mean)) / prev_norm
            bound[(step_array - prev_step) != 1] = np.nan
            bound[:, layout.ndim[p] < self.thresholds.update_min_dims] = np.nan
            bound[~(prev_norm > 0)] = np.nan
        self._prev_params = {layout.keys: (steps[-1], norm[-1], mean[-1], shape[-1])}
        return bound, same, changed

    # -------------------------------------------------------------- episodes
    def _hold(self, step: int, finding: str, layout: _Layout | None, i: int | None, evidence: Any,
              worst: float = 0.0, need: int | None = None, site: str | None = None, key: Any = None,
              strongest: bool = False) -> None:
        """The condition of ``finding`` holds at row ``i`` (or ``site``) this step. The episode's evidence
        becomes this step's (``strongest``: only where ``worst`` is the largest of the episode so far)."""
        self._version += 1
        if layout is not None and i is not None:
            module, call, kind, tensor, _shape = layout.keys[i]
            key = (finding, key) if key is not None else (finding, kind, module, call, tensor)
            where = {"site": layout.names[i], "module": module, "call": int(call), "kind": kind, "tensor": tensor}
        else:
            key = (finding, key)
            where = {"site": site, "module": "", "call": -1, "kind": "metric", "tensor": ""}
        e = self._open.get(key)
        if e is None:
            e = self._reopened(key, step)
        if e is None:
            e = self._open[key] = {"finding": finding, "start": step, "count": 0, "need": need or 1, "key": key}
        e.update(where)  # (a finding keyed by what it is, not where: where it holds now)
        e["order"] = int(layout.order[i]) if layout is not None and i is not None else -1
        if e.get("seen") == self.steps_seen:
            e["evidence"] = evidence
            return
        e["count"] += 1
        e["last"] = step
        e["seen"] = self.steps_seen
        e["missed"] = 0
        if not strongest or worst >= e.get("worst", -math.inf):
            e["evidence"] = evidence
            e["worst"] = worst

    def _reopened(self, key: Any, step: int) -> dict | None:
        """The finding of ``key`` that ended at most :data:`REJOIN_STEPS` steps (or :data:`REJOIN_FRACTION`
        of the run so far: its steps since the first this took in, which a run continuing another does not
        start at 1) before ``step``, taken up again (a loss NaN every other step is one finding, not one a
        step), or None."""
        gap = _rejoin_gap(step, self.first_step or 1)
        for i in range(len(self._closed) - 1, max(-1, len(self._closed) - 50), -1):  # (the newest few)
            e = self._closed[i]
            if e.get("key") == key and step - e["last"] <= gap:
                del self._closed[i]
                self._open[key] = e
                return e
        return None

    def _close_stale(self, rows: bool, metrics: bool) -> None:
        """Episodes whose condition did not hold this step: one not yet a finding ends; a finding
        ends once its condition has been missing for as many judged steps in a row as it had to
        hold to become one (a condition that hovers at its threshold, holding three steps, missing
        one, holding again, is one finding, not a new row every few steps). Judged: those on rows
        at a step that recorded rows, on a metric at a step that logged one (a run recorded every
        10th step logs its loss at every step: the steps between leave the rows' episodes open)."""
        for key in [k for k, e in self._open.items()
                    if e["seen"] != self.steps_seen and (metrics if e["kind"] == "metric" else rows)]:
            e = self._open[key]
            if e["count"] >= e["need"]:
                e["missed"] += 1
                if e["missed"] < e["need"]:
                    continue
            del self._open[key]
            self._version += 1
            if e["count"] >= e["need"]:
                self._closed.append(e)
                if len(self._closed) > 1000:  # bounded: the oldest, least severe go first
                    self._closed.sort(key=lambda x: (_RANK[FINDINGS[x["finding"]][0]], x["last"]))
                    del self._closed[:100]

    # ---------------------------------------------------------------- checks
    def _nan_check(self, step: int, layout: _Layout, stats: dict) -> None:
        bad = np.flatnonzero((stats["nan_count"] > 0) | (stats["inf_count"] > 0))
        if not len(bad):
            return
        self._nan_last = step
        self._version += 1
        if self._nan is None:
            i = int(bad[0])
            module, call, kind, tensor, _shape = layout.keys[i]
            before = [j for j in range(i) if layout.kind[j] == "activation"]  # (all finite: i is the first)
            self._nan = {"finding": "nan_origin", "start": step, "site": layout.names[i], "module": module,
                         "call": int(call), "kind": kind, "tensor": tensor, "evidence": None,
                         "nan": int(stats["nan_count"][i]), "inf": int(stats["inf_count"][i]),
                         "numel": int(stats["numel"][i]), "previous_step": self._row_step,
                         "previous_site": layout.names[before[-1]] if before else None}
        origin = self._nan["site"]
        self._nan_sites.update(layout.names[j] for j in bad if layout.names[j] != origin)

    def _nan_finding(self) -> dict:
        e = dict(self._nan)
        e["last"] = max(self._nan_last, e["start"])
        kind = {"activation": "the output of", "grad_output": "the gradient of the output of",
                "param": "the parameter", "param_grad": "the gradient of the parameter",
                "update": "the update of the parameter"}.get(e["kind"], e["kind"] + " of")
        values = " and ".join(p for p in (f"{e['nan']} NaN" if e["nan"] else "",
                                          f"{e['inf']} Inf" if e["inf"] else "") if p)
        others = sorted(self._nan_sites)
        direction = "in the backward pass" if e["kind"] in ("grad_output", "param_grad") else (
            "in the optimizer's update" if e["kind"] in ("param", "update") else "in the forward pass")
        shown = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
        start, previous = e["start"], e["previous_step"]
        losses = sorted((at, name, value) for name, (at, value) in self._loss_nan.items() if at < start)
        earlier = f"; {losses[0][1]} was already {losses[0][2]} at step {losses[0][0]}" if losses else ""
        if previous is not None and previous < start - 1:
            # (with every=N, or a gap: it may have appeared at a step between, anywhere; this site may be an heir)
            text = (f"{values} of {e['numel']} values in {kind} {e['site']} at step {start}, the first recorded "
                    f"step with one; steps {previous + 1} to {start - 1} were not recorded{earlier}: it may have "
                    f"appeared at one of them, at another site, and {e['site']} only inherited it. "
                    + (f"{len(others)} other site(s) have one too: {shown}." if others else "No other site has one."))
        else:
            text = (f"{values} of {e['numel']} values in {kind} {e['site']} at step {start} ({direction}), "
                    f"the first in the run's recorded order{earlier}; ")
            if e["kind"] == "activation" and e["previous_site"] is not None:
                text += (f"{e['previous_site']}, whose output was recorded just before, is finite: it arose in "
                         f"{e['site']} or in code that ran between the two (a function in a forward(), not a "
                         f"module, is not recorded); ")
            elif e["kind"] == "activation":
                text += (f"no output was recorded before it at this step: it arose in {e['site']}, or its input "
                         f"(the batch?) already had it; ")
            text += f"{len(others)} other site(s) only inherited it: {shown}." if others else "no other site has one."
        e["evidence"] = text
        return e

    def _nan_source(self, step: int, recorded: bool) -> str:
        """Where a loss that is not finite at ``step`` got it, as far as the rows tell (the end of its evidence)."""
        nan = self._nan
        if nan is not None and (nan["start"] < step or (nan["start"] == step and nan["kind"] == "activation")):
            return (f": the model's recorded values have NaN or Inf from step {nan['start']} on (the first at "
                    f"{nan['site']}: nan_origin), which the loss inherited.")
        if recorded:
            return (f": the model's forward pass recorded no NaN or Inf at step {step}"
                    + (f" (the one in the backward pass, at {nan['site']}, came from the loss)" if nan else "")
                    + ": the loss computation made it, after the model's output.")
        if self._row_step is None:  # (a run of metrics alone)
            return "."
        return f": step {step} was not recorded, so where it came from is not known."

    def _units_check(self, step: int, layout: _Layout, stats: dict) -> None:
        t = self.thresholds
        act = (layout.kind == "activation") & ~layout.alias
        if not act.any():
            return
        zero, lo, hi, mean, std = (stats[c] for c in ("zero_frac", "min", "max", "mean", "std"))
        finite = np.isfinite(mean) & np.isfinite(std)
        # dead units: outputs never negative, nearly all exactly 0
        dead = act & finite & (lo >= 0) & (zero >= t.dead_zero_frac) & (stats["numel"] > 1)
        # an output all 0 of a layer whose own parameters are all 0 (weights and bias: a layer initialized at 0 that
        # does not move) is no dead units, which need not all be zero: it is the same value whatever the input
        zero_layer = np.zeros(len(zero), bool)
        for i in np.flatnonzero(act & (zero >= 1.0)):
            rows = layout.own_params.get(layout.keys[i][0], [])
            zero_layer[i] = bool(rows) and all(float(stats["norm"][r]) == 0 for r in rows)
        dead &= ~zero_layer
        for i in np.flatnonzero(dead):
            z, m, u = float(zero[i]), int(layout.per_unit[i]), int(layout.units[i])
            bound = 1.0 - m * (1.0 - z) if m else 0.0
            dead_units = math.ceil(bound * u - 1e-9) if u else 0  # (decided on the count: float32 fractions)
            # units are along dim 1 (features of (B, F), channels of (B, C, H, W)); of a (B, T, F) sequence
            # they would be its positions: there the dimension is named, and an all-zero output said as such
            along = _along(layout, int(i))
            b = int(layout.feed_bias[i])
            counted = round(float(stats["zero_frac"][b]) * u) if b >= 0 else None  # (exact: the bias's zeros)
            if counted == 0:
                continue  # (every unit outputs something for some input: a sparse layer, not a dead one)
            before = int(layout.previous[i])
            if counted is None and before >= 0 and lo[before] >= 0:
                # (the site before it, of its shape and never negative, is judged itself (dead_units there, if any): the
                # zeros this one adds are its module's, a dropout's, entries zeroed at random, not units for good: a
                # ReLU at ~52% zeros and a dropout of 0.6 after it read 81%, its units counted by the bias before it or
                # not: a Linear without bias before it, a run without parameter gradients)
                continue
            before = int(layout.upstream[i])
            if counted is None and before >= 0 and lo[before] >= 0 and not layout.own_params.get(layout.keys[i][0]):
                # (a module without parameters of its own after a site never negative, of another shape: a pooling, a
                # flatten, a reshape; its zeros are those it took in, the site before's, judged there: one finding per
                # dead layer, not one more per module it passes through (a dead ReLU before an AdaptiveAvgPool2d and a
                # Flatten is one finding, at the ReLU))
                continue
            silent = ""
            if counted is not None and z * float(stats["numel"][i]) < counted * m - 0.5:
                # (more units counted than its zeros can hold, a unit dead for the batch being all zeros: the bias's
                # gradient is 0 for another reason, no gradient reaching it (a dead layer after it passes none back);
                # its count says nothing, and the zeros bound the units instead)
                silent = (f" (the gradient of {layout.names[b]}, which feeds them, is 0 at {counted} of its {u} "
                          f"entries, more than its zeros can hold: no gradient reaches them)")
                counted = None
            if counted is not None and counted < t.dead_unit_share * u:
                # (most units fire for some input: a layer sparse by design (top-k, a trained transformer's ReLU FFN
                # at 90%+ zeros) with a few units dead, judged as below dead_zero_frac: a top-k of 8 of 256 units
                # is no finding)
                continue
            if counted is not None and counted < u:
                detail = (f"{counted} of its {u} units{along} output 0 for every input (their entries of the "
                          f"gradient of {layout.names[b]}, which feeds them, are exactly 0)")
            elif u and dead_units >= u and along and z >= 1.0:
                detail = f"its whole {layout.keys[i][4]} output is 0 for every input"
            elif u and (dead_units >= u or counted == u):
                detail = ("its only unit outputs" if u == 1 else f"all {u} of its units{along} output") + \
                    " 0 for every input"
            elif u and bound > 0:
                detail = (f"at least {bound:.0%} of its {u} units{along} (at least {dead_units}) output 0 for every "
                          f"input")
            else:
                detail = "most of its units output 0 (too few zeros to bound the dead units per unit)"
            detail += silent
            # enough entries per unit over the steps it held that live units as sparse as LIVE_ZERO_FRAC would be 0
            # for all of them in fewer than one of the u units by chance: u f^M < 1 (at a batch of 1, one input a
            # step, a healthy layer reads more than 80% zeros for some inputs: 32 units need 16 steps)
            per_step = max(m, 1)
            entries = _chance_entries(u, LIVE_ZERO_FRAC)
            text = (f"{z:.1%} of its outputs are exactly 0 at step {step} (threshold {t.dead_zero_frac:.0%}); "
                    f"{detail}; max {_signless_zero(hi[i]):.3g}.")
            self._hold(step, "dead_units", layout, int(i),
                       lambda e, text=text, per_step=per_step, u=u: text + _dead_evidence(e, per_step, u),
                       need=max(t.persist, math.ceil(entries / per_step)))
        # a share of the units dead, below dead_zero_frac: counted by the bias gradient that feeds them
        partial = act & finite & (lo >= 0) & (zero < t.dead_zero_frac) & (stats["numel"] > 1) & \
            (layout.feed_bias >= 0)
        for i in np.flatnonzero(partial):
            self._dead_share(step, layout, stats, int(i))
        # dead at a floor below 0 (GELU, SiLU, ELU ...: outputs never exactly 0): every output at or below 0, nearly
        # constant, and no gradient through it (one value for every input, lo = hi, is constant_output's)
        floor = act & finite & (lo < 0) & (hi <= 0) & (lo < hi) & (stats["numel"] > 1) & (layout.previous >= 0)
        for i in np.flatnonzero(floor):
            self._floor_dead(step, layout, stats, int(i))
        # constant: every output the same value, not 0 (a ReLU-like output all 0 is dead_units); a sigmoid or tanh
        # pinned exactly at a bound has no variance left for the saturation index to read
        constant = act & finite & (lo == hi) & ((hi != 0) | zero_layer) & (stats["numel"] > 1)
        for i in np.flatnonzero(constant):
            if layout.out_grad and layout.keys[i][0] not in layout.out_grad:
                # the step records output gradients, and none of this site: an output no gradient can flow through
                # (a bool mask all True, an integer tensor), which a sigmoid or tanh pinned at 1 is not
                continue
            value = float(hi[i])
            bound = (f"; {value:g} is a bound of a sigmoid or tanh (and what a softmax over a dimension of size 1 "
                     f"gives), where their derivative is 0: if it is one, no gradient passes it") \
                if value in (1.0, -1.0) else ""
            if zero_layer[i]:
                names = ", ".join(layout.names[r] for r in layout.own_params[layout.keys[i][0]])
                bound = (f"; its parameters are all 0 ({names}): it outputs 0 whatever its input, and passes no "
                         f"gradient back to the layers before it (a layer initialized at 0 that does not move: "
                         f"requires_grad=False, or not in the optimizer)")
            self._hold(step, "constant_output", layout, int(i),
                       f"all {int(stats['numel'][i])} of its outputs are {value:.6g} at step {step} (min = max): it "
                       f"gives the same output for every input{bound}.", need=t.persist)
        # saturation: outputs inside [0, 1] (sigmoid-like) or [-1, 1] with negatives (tanh-like)
        bounded = act & finite & (hi <= 1) & (lo >= -1) & (zero < 0.5) & (stats["numel"] > 1) & (hi > lo)
        if not bounded.any():
            return
        idx = np.flatnonzero(bounded)
        tanh = lo[idx] < 0
        low = np.where(tanh, -1.0, 0.0)
        width = np.where(tanh, 2.0, 1.0)
        mu = (mean[idx] - low) / width  # on [0, 1]
        n = stats["numel"][idx].astype(np.float64)
        var = (std[idx] / width) ** 2 * (n - 1) / n  # population variance
        # a variable on [0, 1] with mean mu has a variance of at most mu (1 - mu), reached when every
        # value sits at 0 or 1: the fraction of that maximum it has tells how stuck at the bounds it is
        with np.errstate(divide="ignore", invalid="ignore"):
            index = np.where(mu * (1 - mu) > 0, var / (mu * (1 - mu)), 0.0)
        last_order = int(layout.order[act].max())
        for j in np.flatnonzero(index >= t.saturation_index):
            i = int(idx[j])
            name = "tanh-like, in [-1, 1]" if tanh[j] else "sigmoid-like, in [0, 1]"
            module, call, kind, tensor, _shape = layout.keys[i]
            key = ("saturated", kind, module, call, tensor)
            # a layer that saturated only once the loss had fallen to a tenth of where it started: it grew confident
            # as the model fit its data (tanh and sigmoid nets trained to a low loss do), not a net that cannot learn;
            # the model's output (the last site in forward order: a sigmoid's probabilities) once the loss halved: its
            # predictions grew confident, which is what the loss asks of them
            output = layout.order[i] == last_order
            text = (f"saturation index {index[j]:.2f} at step {step} (threshold {t.saturation_index:g}): its outputs "
                    f"({name}; mean {float(mean[i]):.3g}, std {float(std[i]):.3g}) have {index[j]:.0%} of the largest "
                    f"variance an output with this mean can have, which it has when every output sits at a bound.")
            self._hold(step, "saturated", layout, i, lambda e, text=text, output=output: text + _fitted(e, output),
                       worst=float(index[j]), need=t.persist)
            e = self._open[key]
            factor = 2.0 if output else 10.0
            if "fitted" not in e:  # (decided when the episode began: one taken up again keeps it)
                e["fitted"] = self._loss_fell(factor)
                e["window"] = t.diverge_window
            if e["fitted"]:
                # info while the loss stays low; one that rose back (a learning rate that threw the fitted model out,
                # its layers pinned at their bounds) makes it a warning again, saying so: back above its start over
                # the square root of the factor it had fallen by (a margin: a loss noisy about the factor's level
                # would make it info and warning by turns)
                name, top, _ = e["fitted"]
                now = self._loss_now(name)
                e["risen"] = now if now > top / math.sqrt(factor) else None
                e["severity"] = "warning" if e["risen"] else "info"

    def _loss_fell(self, factor: float) -> tuple[str, float, float] | None:
        """``(name, from, to)`` of a loss metric whose median over its last ``diverge_window`` values is ``factor``
        times below where it started (its first value, or its chance level where known and higher), or None."""
        for name, state in self._metrics.items():
            tail = state["tail"]
            if "start" not in state or len(tail) < tail.maxlen:
                continue
            top = max(state["start"], self._chance.get(name.lower(), -math.inf))
            now = _median(list(tail))
            if top > 0 and now <= top / factor:
                return name, top, now
        return None

    def _loss_now(self, name: str) -> float:
        """The median of loss metric ``name``'s last ``diverge_window`` values (NaN before it has them)."""
        tail = self._metrics[name]["tail"] if name in self._metrics else ()
        return _median(list(tail)) if tail else math.nan

    def _dead_share(self, step: int, layout: _Layout, stats: dict, i: int) -> None:
        """``dead_units`` at activation row ``i`` (never negative, fewer zeros than ``dead_zero_frac``) where at least
        ``dead_unit_share`` of its units output 0 for every input of the batch. Counted from the gradient of the bias
        that feeds them: its entry of a unit is the sum of the unit's output gradient where it fires, exactly 0 for a
        unit that fires for no input; and for a live unit only where its output gradient is 0 at every input it fires
        for, which the zeros of the site's output gradient (where recorded) bound. A per-input sparsity, each unit
        firing for some inputs (half of them, a ReLU at init), leaves no entry 0."""
        t = self.thresholds
        u, per_unit, b = int(layout.units[i]), int(layout.per_unit[i]), int(layout.feed_bias[i])
        if not u or not per_unit:
            return
        counted = round(float(stats["zero_frac"][b]) * u)
        o = layout.out_grad.get(layout.keys[i][0])
        # (a live unit with a 0 entry has its output gradient 0 at one input at least)
        unsure = round(float(stats["zero_frac"][o]) * float(stats["numel"][o])) if o is not None else 0
        counted -= unsure
        z, numel = float(stats["zero_frac"][i]), float(stats["numel"][i])
        # a unit dead for the batch is all zeros: a count its zeros cannot hold is not dead units (a gradient of 0 for
        # another reason: a derivative 0 where the output is not, as a Threshold's)
        if counted < t.dead_unit_share * u or z * numel < counted * per_unit - 0.5:
            return
        inputs = _parse_shape(layout.keys[i][4])[0]
        if u * z ** inputs >= 1:
            # a batch too small to tell a dead unit from one that fired for none of its few inputs: were every unit
            # 0 at the site's rate z, u z^B of them would be 0 for all B inputs (a healthy ReLU of a batch of 1 has
            # half its units 0 for it, and a batch of 2 read 22 of 32 units where 13 fire for none of the data)
            return
        w = int(layout.feed_weight[i])
        if w >= 0 and float(stats["zero_frac"][w]) >= 1.0:
            # the layer that feeds it has a weight gradient all 0: its input is all 0 (the layer before is dead, and
            # found there), and each unit outputs its bias, 0 where that is not positive: not its own dead units
            return
        along = _along(layout, i)
        self._hold(step, "dead_units", layout, i,
                   f"{'at least ' if unsure else ''}{counted} of its {u} units{along} ({counted / u:.0%}; threshold "
                   f"{t.dead_unit_share:.0%}) output 0 for every input at step {step} (their entries of the gradient "
                   f"of {layout.names[b]}, which feeds them, are exactly 0); the others fire for some inputs: "
                   f"{z:.1%} of its outputs are exactly 0 in all (below dead_zero_frac {t.dead_zero_frac:.0%}); "
                   f"max {_signless_zero(stats['max'][i]):.3g}.",
                   need=t.persist)

    def _floor_dead(self, step: int, layout: _Layout, stats: dict, i: int) -> None:
        """``dead_units`` at activation row ``i``, an output never positive and sometimes below 0, where every unit
        sits on the flat tail of an activation whose floor is not 0 (GELU, SiLU, Mish tend to 0 from below, ELU to
        -alpha): its input, the site just before it of its shape, was negative for every input of the batch, so its
        outputs are nearly the same value (their std at most ``dead_slope`` of its input's) and the gradient through
        it vanishes (the norm of its input's output gradient at most ``dead_slope`` of its own, where recorded and
        not 0). These units output no exact 0 for the zero counts of ReLU-like sites to read; a healthy GELU or
        SiLU layer has some input above 0 (a max above 0), and a site with parameters of its own (a Linear, a norm)
        is no activation."""
        t = self.thresholds
        module = layout.keys[i][0]
        if layout.own_params.get(module):
            return
        p = int(layout.previous[i])
        std_out, std_in = float(stats["std"][i]), float(stats["std"][p])
        if not (math.isfinite(std_in) and std_in > 0) or std_out > t.dead_slope * std_in:
            return  # (an output as spread as its input, a log-softmax's, passes it on)
        out, into = layout.out_grad.get(module), layout.out_grad.get(layout.keys[p][0])
        gradient = ""
        if out is not None and into is not None and float(stats["norm"][out]) > 0:
            g_out, g_in = float(stats["norm"][out]), float(stats["norm"][into])
            if not math.isfinite(g_in) or g_in > t.dead_slope * g_out:
                return
            gradient = (f"; the gradient it passes back to {layout.names[p]} has norm {g_in:.3g}, {g_in / g_out:.2g} "
                        f"of the {g_out:.3g} that reaches it")
        u = int(layout.units[i])
        units = ("its only unit sits" if u == 1 else f"all {u} of its units{_along(layout, i)} sit") if u else \
            "its units sit"
        self._hold(step, "dead_units", layout, i,
                   f"{units} at the floor of the activation for every input at step {step}: all "
                   f"{int(stats['numel'][i])} of its outputs are at or below 0 (max {float(stats['max'][i]):.3g}, min "
                   f"{float(stats['min'][i]):.3g}; {float(stats['zero_frac'][i]):.1%} exactly 0), with std "
                   f"{std_out:.3g}, {std_out / std_in:.2g} of the "
                   f"{std_in:.3g} of {layout.names[p]}, its input{gradient} (threshold dead_slope {t.dead_slope:g}): "
                   f"every unit's input lies where the activation is flat (the negative tail of a GELU, SiLU, Mish or "
                   f"ELU; a tanh near -1), which passes almost no gradient back: its units learn next to nothing.",
                   need=t.persist)
        module, call, kind, tensor, _shape = layout.keys[i]
        self._open[("dead_units", kind, module, call, tensor)]["floor"] = True  # (its vanished gradients its own)

    def _gradient_check(self, step: int, layout: _Layout, stats: dict) -> None:
        t = self.thresholds
        grad = (layout.kind == "grad_output") & ~layout.alias & (layout.order >= 0)
        if not grad.any():
            return
        idx = np.flatnonzero(grad)
        numel = stats["numel"][idx].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            rms = stats["norm"][idx] / np.sqrt(np.maximum(numel, 1))
        order = np.argsort(layout.order[idx], kind="stable")
        idx, rms, numel = idx[order], rms[order], numel[order]
        ok = np.isfinite(rms) & (rms > 0)
        # one finding whether the first sites get a gradient orders of magnitude smaller or none at all (from batch to
        # batch a nearly dead layer passes one or not: two findings taking turns, each cut short); where both hold,
        # the evidence says none reaches them
        no_gradient = None
        if ok.any():  # gradients exactly 0 before (in forward order) a site that gets one: none reaches them
            last = int(np.flatnonzero(ok)[-1])
            none = np.flatnonzero(np.isfinite(rms[:last]) & (rms[:last] == 0))
            if len(none):
                shown = ", ".join(layout.names[idx[j]] for j in _sample(list(none), 6))
                # where it stops: the latest site without one, and the next in forward order, which gets one
                stop, gets = layout.names[idx[none[-1]]], layout.names[idx[none[-1] + 1]]
                no_gradient = (int(idx[none[0]]),
                           f"no gradient reaches {len(none)} of {len(idx)} sites: their output gradient is exactly 0 "
                           f"at step {step} ({shown}), while {layout.names[idx[last]]}, later in forward order, gets "
                           f"an RMS of {rms[last]:.2g}. It stops between {stop} and {gets}: the output of {gets} "
                           f"gets an RMS of {rms[none[-1] + 1]:.2g}, and {gets} (or code run between the two) passes "
                           f"none back (dead units, an output pinned at a bound, a factor of 0: weights all 0, as a "
                           f"layer initialized at 0 has at its first step).")
        first = not self._grad_start  # (the first step whose gradients are judged)
        grown_from_zero = self._grown_from_zero(layout, stats, idx, ok, first, no_gradient is not None)
        if grown_from_zero and first:
            no_gradient = None  # (its weights all 0 at the start: the init's doing, not a vanishing)
        idx, rms, numel = idx[ok], rms[ok], numel[ok]
        if not len(idx):  # (and no_gradient is None: it needs a site that gets one)
            return
        logs = np.log10(rms)
        if len(idx) >= 2:
            spread = logs[0] - logs[-1]
            if abs(spread) > t.gradient_orders:
                chain = ", ".join(f"{layout.names[i]} {r:.2g}" for i, r in _sample(list(zip(idx, rms)), 6))
                finding = "vanishing_gradients" if spread < 0 else "exploding_gradients"
                # most of a vanishing across the last layer alone: its weights are small (one initialized at 0 scales
                # every gradient before it by its weights, until they grew)
                j = max(_last_layer(layout, idx), 1)
                across_last = logs[j] - logs[j - 1]
                what = "site" if j == len(idx) - 1 else "layer"
                tail = (f" Most of it, {across_last:.1f} orders, is across the last {what}, from "
                        f"{layout.names[idx[j - 1]]} to {layout.names[idx[j]]}: the weights there are small"
                        f" (a last layer initialized at 0, or small, scales every gradient before it so until they "
                        f"grew)." if spread < 0 and across_last > -spread / 2 else "")
                # (from each site's output gradient to the next's, in forward order, by their norms: a pooling or a
                # mean over N entries spreads its output's gradient over them, its RMS N times smaller, its norm
                # sqrt(N): a global average pool over 32x32 drops the RMS by 3 orders and passes the gradient back)
                drops = np.diff(logs + 0.5 * np.log10(np.maximum(numel, 1)))
                k = int(np.argmax(drops)) + 1 if len(drops) else 0
                if spread < 0 and not tail and k and drops[k - 1] > t.gradient_orders:
                    # (one site that passes almost none of its output's gradient back: its backward, not depth)
                    tail = (f" Most of it, {logs[k] - logs[k - 1]:.1f} orders, is across {layout.names[idx[k]]} "
                            f"alone: its output gets an RMS of {rms[k]:.2g}, {layout.names[idx[k - 1]]} before it "
                            f"{rms[k - 1]:.2g}. {layout.names[idx[k]]} passes almost none of its output's gradient "
                            f"back: a normalization whose output the loss reads only through what it normalizes "
                            f"away (the mean of a LayerNorm's output over its features is 0, whatever its input: a "
                            f"loss on it is constant, with no gradient for the layers before it), an output pinned "
                            f"at a bound, dead units; not small weights nor depth.")
                # a last layer that started at 0 and still grows: the drop across it is its init's, expected, as long
                # as the sites before it are within gradient_orders of each other
                before_last = logs[0] - logs[j - 1] if j >= 2 else 0.0
                if tail and grown_from_zero and layout.names[idx[j]] == self._zero_start["site"] and \
                        before_last >= -t.gradient_orders:
                    finding = None
            if abs(spread) > t.gradient_orders and finding is not None:
                self._hold(step, finding, layout, int(idx[0]),
                           f"output-gradient RMS {rms[0]:.2g} at {layout.names[idx[0]]}, the first site in forward "
                           f"order, {abs(spread):.1f} orders of magnitude {'below' if spread < 0 else 'above'} "
                           f"{rms[-1]:.2g} at the last, {layout.names[idx[-1]]}, at step {step} (threshold "
                           f"{t.gradient_orders:g}); in forward order: {chain}.{tail}", key="across sites",
                           need=t.persist)
        if no_gradient is not None:
            self._hold(step, "vanishing_gradients", layout, *no_gradient, key="across sites", need=t.persist)
        # over steps: against the largest RMS of the run's first recorded steps (its gradients' scale)
        if len(self._grad_start) < t.persist:
            self._grad_start[step] = float(rms.max())
            return
        base = max(self._grad_start.values())
        top = int(np.argmax(logs))
        if logs[top] - math.log10(base) > t.gradient_growth_orders:
            self._hold(step, "exploding_gradients", layout, int(idx[top]),
                       f"output-gradient RMS {rms[top]:.3g} at {layout.names[idx[top]]} at step {step}, "
                       f"{logs[top] - math.log10(base):.1f} orders of magnitude above the largest of the first "
                       f"recorded steps ({base:.3g}; threshold {t.gradient_growth_orders:g}).", key="over steps",
                       need=t.persist)

    def _activation_check(self, step: int, layout: _Layout, stats: dict) -> None:
        """``exploding_activations``: through depth, the output RMS of a site ``activation_orders`` above that of the
        first site in forward order (or 1, where that is less); over steps, the largest RMS of a step
        ``activation_growth_orders`` above the largest of the run's first ``persist`` recorded steps (or 1). Named at
        the site where it starts: the first, on the way to the largest, whose RMS is more than half an order (3.16x)
        above the site's before it, else the first an order above the first site's."""
        t = self.thresholds
        idx = layout.act_columns
        if not len(idx):
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            rms = stats["norm"][idx] / np.sqrt(np.maximum(stats["numel"][idx].astype(np.float64), 1))
        ok = np.isfinite(rms) & (rms > 0)
        idx, rms = idx[ok], rms[ok]
        if not len(idx):
            return
        logs = np.log10(rms)
        top = int(np.argmax(logs))
        # (from RMS 1 where the first site reads less: outputs that grow to the unit scale are rescaled, not blown up,
        # as by a normalization layer after inputs of 1e-3 or an embedding initialized at 1e-4)
        floor = max(float(logs[0]), 0.0)
        if top > 0 and logs[top] - floor > t.activation_orders:
            gains = np.diff(logs[:top + 1])
            jumps = np.flatnonzero(gains > 0.5)
            start = int(jumps[0]) + 1 if len(jumps) else int(np.flatnonzero(logs[:top + 1] - logs[0] > 1)[0])
            shown = sorted({*_sample(list(range(top + 1)), 8), start})  # (the site it starts at among them)
            chain = ", ".join(f"{layout.names[idx[k]]} {rms[k]:.3g}" for k in shown)
            first = f"{rms[0]:.3g} at {layout.names[idx[0]]}, the first site in forward order" if floor == logs[0] \
                else f"1, the unit scale (the first site in forward order, {layout.names[idx[0]]}, reads {rms[0]:.3g})"
            self._hold(step, "exploding_activations", layout, int(idx[start]),
                       f"output RMS {rms[top]:.3g} at {layout.names[idx[top]]}, {logs[top] - floor:.1f} orders of "
                       f"magnitude above {first}, at step {step} (threshold {t.activation_orders:g}); it starts at "
                       f"{layout.names[idx[start]]}, {rms[start]:.3g} from {rms[start - 1]:.3g} at the site before "
                       f"it; in forward order: {chain}.",
                       key="across sites", need=t.persist)
        if len(self._act_start) < t.persist:
            self._act_start[step] = float(rms.max())
            return
        base = max(*self._act_start.values(), 1.0)  # (from RMS 1 where the run began below it, as through depth)
        if logs[top] - math.log10(base) > t.activation_growth_orders:
            grown = np.flatnonzero(logs - math.log10(base) > 1)  # (the first site past an order above the start's)
            start = int(grown[0]) if len(grown) else top
            self._hold(step, "exploding_activations", layout, int(idx[start]),
                       f"output RMS {rms[top]:.3g} at {layout.names[idx[top]]} at step {step}, "
                       f"{logs[top] - math.log10(base):.1f} orders of magnitude above the largest of the first "
                       f"recorded steps ({base:.3g}; threshold {t.activation_growth_orders:g}); the first site past "
                       f"an order above it, in forward order: {layout.names[idx[start]]} ({rms[start]:.3g}).",
                       key="over steps", need=t.persist)

    def _accumulation_check(self, step: int, layout: _Layout, stats: dict, windows: np.ndarray) -> None:
        """``gradients_accumulate``: a bias's gradient larger than its module's output gradients of the step can make
        it (at most ``sqrt(m) ||grad_output||`` a call, ``m`` the entries summed per unit): its ``.grad`` holds the
        gradients of earlier steps too, where ``zero_grad()`` is not called. Named at the bias most over its bound.
        A bias already past half its bound at its first recorded step must pass twice that share: summed over the
        steps, its gradient grows past it, where a module that scales its own output (``8 * F.linear(x, W, b)``, an
        output multiplier) has its bias's gradient over the bound by its factor from the start, and no more.
        ``windows``: per bias, its bound summed over the steps its ``.grad`` may hold (:meth:`_bias_windows`: those
        since the optimizer last changed it, gradient accumulation over micro-batches)."""
        norm = stats["norm"]
        worst = None
        for j, (b, rows, entries, inputs) in enumerate(layout.bias_bounds):
            most = float(windows[j])
            grad = float(norm[b])
            if not (math.isfinite(grad) and math.isfinite(most)):
                continue
            start = self._bias_start.setdefault(layout.keys[b][:4], (step, grad, grad / max(most, 1e-30)))
            allowed = max(1.0, 2.0 * start[2])
            if grad > most * allowed * (1 + 1e-4) and (worst is None or grad / max(most, 1e-30) > worst[0]):
                worst = (grad / max(most, 1e-30), b, rows, entries, inputs, most, start)
        if worst is None:
            return
        ratio, b, rows, entries, inputs, most, (first_step, first, first_ratio) = worst
        module = layout.keys[b][0]
        outs = " + ".join(("" if i >= 0 and m == 1 else f"sqrt({m}) x ") + f"{float(norm[r]):.3g}" +
                          ("" if i < 0 else f" x {float(norm[i]):.3g}") for r, m, i in zip(rows, entries, inputs))
        this_step = float(_grad_bounds(norm, rows, entries, inputs))
        source = "" if inputs[0] < 0 else \
            f"its input the output of {layout.names[inputs[0]]}, which its Sequential feeds it"
        how = (f"a bias's gradient sums the gradient of its module's output over {entries[0]} entries per unit"
               if inputs[0] < 0 else
               f"a weight's gradient is its module's output gradient times its input, summed over the batch: at most "
               f"||grad_output|| x ||input||, {source}" if entries[0] == 1 else
               f"a convolution's weight gradient is, at each of its kernel's offsets, its output gradient times the "
               f"input entries that offset reads, each at most twice per spatial dim (padding): at most "
               f"sqrt({entries[0]}) x ||grad_output|| x ||input|| in all, {source}")
        if most > this_step * (1 + 1e-6):  # (steps before that left the bias as it was: no optimizer step since)
            outs += f" this step, {most - this_step:.3g} the steps before since its value last changed"
        grown = (f"; it was {first:.3g} at step {first_step} ({_times(float(norm[b]) / first)} since), while the "
                 f"output gradient of {module} is {float(norm[rows[0]]):.3g} now" if first > 0 and step > first_step
                 else "")
        past = (f" (at step {first_step}, its first recorded, it was already {first_ratio:.3g} of its bound: found "
                f"past twice that)" if first_ratio > 0.5 else "")
        self._hold(step, "gradients_accumulate", layout, b,
                   f"||grad|| of {layout.names[b]} is {float(norm[b]):.3g} at step {step}, {_times(ratio)} the most "
                   f"this step's backward pass can give it ({most:.3g} = {outs}: {how}){past}{grown}. Its .grad "
                   f"holds the "
                   f"gradients of earlier steps too: zero_grad() is likely not called each step (or on an optimizer "
                   f"that does not hold it).",
                   key="accumulate", worst=ratio, need=self.thresholds.persist)

    def _grown_from_zero(self, layout: _Layout, stats: dict, idx: np.ndarray, ok: np.ndarray, first: bool,
                         none_before: bool) -> bool:
        """Whether the last site (forward order) is a layer that started at 0 and whose parameters still grow: at the
        first step judged, no gradient passed it to any site before it (a factor of 0: its weights all 0), and its
        parameters' norm grew at every step since. Once it stops growing (or no parameter of it is recorded) it is
        judged as any layer, for good."""
        if not ok.any():
            return False
        getting = np.flatnonzero(ok)
        last = int(getting[_last_layer(layout, idx[getting])])
        site, module = layout.names[idx[last]], layout.keys[idx[last]][0]
        rows = [k for k in layout.params if layout.keys[k][0] == module]
        norm = float(np.sqrt(np.sum(stats["norm"][rows] ** 2))) if rows else math.nan
        if first:
            before = idx[:last]
            started = none_before and last > 0 and bool(np.all(np.isfinite(stats["norm"][before]) &
                                                                (stats["norm"][before] == 0)))
            self._zero_start = {"site": site, "module": module, "norm": norm} if started and norm > 0 else None
            return self._zero_start is not None
        start = self._zero_start
        if start is None or start["site"] != site:
            return False
        if not norm > start["norm"]:
            self._zero_start = None
            return False
        start["norm"] = norm
        return True

    def _update_check(self, step: int, layout: _Layout, stats: dict, bounds: np.ndarray | None,
                      still: np.ndarray | None) -> None:
        """The update ratios and the parameters left as they were at ``step``; ``still``: per parameter
        (``layout.params``), :meth:`_still_codes` of the step (its codes, and the steps their streaks began)."""
        t = self.thresholds
        norm = stats["norm"]
        codes = {} if still is None else {int(q): int(c) for q, c in zip(layout.params, still[0]) if c}
        for j, q in enumerate(layout.params):
            if codes.get(int(q)) == STILL_SUM_ENDED:
                self._sum_ended(step, layout, int(q), int(still[1][j]))
            elif codes.get(int(q)) == STILL_ACCUMULATING and layout.keys[int(q)][:4] not in self._in_rhythm:
                codes[int(q)] = 0  # (no rhythm borne out yet: a streak as long as a stall's is judged as one)
        if layout.param_pair:
            for u, p in layout.param_pair.items():
                if layout.ndim[p] < t.update_min_dims or not (norm[p] > 0 and np.isfinite(norm[p])):
                    continue
                ratio = float(norm[u] / norm[p])
                key = layout.keys[p][:4]
                if key not in self._from_zero:
                    # a parameter that started at 0 (a last layer initialized at zero) is its first update:
                    # a ratio of 1, falling as ~1/t while it grows; judged once it fell below the threshold
                    self._from_zero[key] = abs(ratio - 1.0) < 1e-3
                if self._from_zero[key]:
                    if ratio >= t.update_ratio_high:
                        continue
                    self._from_zero[key] = False
                if ratio == 0:
                    self._judge_unchanged(step, layout, p, stats, "its update is exactly 0", still=codes.get(p, 0))
                else:
                    g = layout.grad_of.get(p)
                    self._judge_ratio(step, layout, p, ratio, exact=True,
                                      grad=float(norm[g] / norm[p]) if g is not None else None,
                                      vanished=_vanished_before(layout, stats, layout.keys[p][0], t.gradient_orders))
            return
        # no update rows: a lower bound from consecutive recorded steps of the parameter's values
        # (_param_bounds); it can tell a high ratio only, and judges it above max(1, update_ratio_high):
        # a parameter grown from 0 doubles its norm at its second step (a bound of 1), and less after
        if bounds is None:
            return
        bound, same = bounds
        high = max(1.0, t.update_ratio_high)
        for j in np.flatnonzero(bound > high):
            self._judge_ratio(step, layout, int(layout.params[j]), float(bound[j]), exact=False, high=high)
        for j in np.flatnonzero(same):
            self._judge_unchanged(step, layout, int(layout.params[j]), stats,
                                  "its norm, mean, std, min and max are those of the recorded step before, within "
                                  "float32's rounding",
                                  exact=False, still=codes.get(int(layout.params[j]), 0))

    def _sum_ended(self, step: int, layout: _Layout, p: int, began: int) -> None:
        """Parameter row ``p`` changed at ``step``, ending a streak of unchanged steps begun at step ``began`` whose
        gradient grew as a sum's (:data:`STILL_SUM_ENDED`). Gradient accumulation repeats such streaks, one
        optimizer step apart: a second streak as long, begun within :data:`RHYTHM_GAPS` of its length after the
        first ended, bears it out (as does a longer one after a first streak begun at the watch's first steps: a
        watch begun inside an accumulation, or before a first step it cannot judge, sees a shorter streak first), and
        the ``not_updated`` episodes held from the first of those streaks (one after another, each begun so soon after
        the one before) are taken back; after that, each such streak's at once. A
        streak alone is no rhythm: a learning rate of 0 for 3 or 4 steps, whose gradient at the last step is larger
        than at the first about every other time, stays ``not_updated``."""
        key = layout.keys[p][:4]
        if key in self._in_rhythm:
            self._take_back_accumulation(layout, p, began)
            return
        before = self._first_sum.get(key)
        soon = before is not None and began - before[2] <= RHYTHM_GAPS * (before[2] - before[1])
        # (a first streak begun at the watch's first steps may be cut short: by the step before it, whose value no
        # step before tells unchanged, or a watch begun inside an accumulation; the one after it, as long or longer,
        # bears it out at the second optimizer step, not the third)
        cut = soon and before[0] == before[1] <= (self.first_step if self.first_step is not None else step) + 1
        if soon and (step - began == before[2] - before[1] or cut and step - began > before[2] - before[1]):
            self._in_rhythm.add(key)
            del self._first_sum[key]
            self._take_back_accumulation(layout, p, before[0])
        else:
            self._first_sum[key] = (before[0] if soon else began, began, step)

    def _take_back_accumulation(self, layout: _Layout, p: int, began: int) -> None:
        """The ``not_updated`` episode of parameter row ``p`` begun at step ``began`` or later, open or ended, was
        gradient accumulation whose optimizer step came (:meth:`_sum_ended`): taken back."""
        module, call, kind, tensor, _shape = layout.keys[p]
        key = ("not_updated", kind, module, call, tensor)
        e = self._open.get(key)
        if e is not None and 0 <= began <= e["start"]:
            del self._open[key]
            self._version += 1
        for i in range(len(self._closed) - 1, max(-1, len(self._closed) - 50), -1):  # (the newest few)
            e = self._closed[i]
            if e.get("key") == key and 0 <= began <= e["start"]:
                del self._closed[i]
                self._version += 1

    def _judge_unchanged(self, step: int, layout: _Layout, p: int, stats: dict, how: str, exact: bool = True,
                         still: int = 0) -> None:
        """Parameter row ``p`` did not change at ``step`` (``how``: what shows it; ``exact``: its update row is 0,
        not its statistics the same): by its gradient, it is ``frozen`` (none), ``not_updated`` (one of at least
        :data:`MOVING_GRADIENT` of its norm, which any learning rate in use moves a float32 value by), or
        ``update_ratio_low`` (a gradient exactly 0; or smaller, or none recorded, judged by its update row only:
        a layer deep in a net whose gradients vanish keeps its statistics bit for bit on some steps, not all).
        ``still``: its :meth:`_still_codes` at ``step``: a gradient summed over micro-batches is no ``not_updated``
        (:data:`STILL_ACCUMULATING`), and one summed since the run's start without a change says so
        (:data:`STILL_GROWING`)."""
        t = self.thresholds
        g = layout.grad_of.get(p)
        grad = float(stats["norm"][g]) if g is not None else math.nan
        scale = grad / float(stats["norm"][p])
        said = f"it did not change {'at all' if exact else '(or by less than float32 shows)'} at step {step} ({how})"
        if g is None and layout.param_grads:
            # (whether a gradient reaches its module's output tells a parameter frozen by itself from one behind a cut
            # graph or an output the loss does not use, where the step records output gradients)
            module = layout.keys[p][0]
            o = layout.out_grad.get(module)
            where = module or "the model"
            if o is not None and float(stats["norm"][o]) > 0:
                # (the rows do not say which of the two: a parameter's requires_grad is not recorded)
                why = (f" The output of {where} gets a gradient (||grad|| {float(stats['norm'][o]):.3g}): this "
                       f"parameter takes none itself: requires_grad=False on it, or the forward of {where} does not "
                       f"use it (a parameter left out of its computation).")
            elif o is None and layout.out_grad:
                why = (f" No gradient reaches the output of {where} either (it has no output-gradient row): the loss "
                       f"does not use that output, or the graph is cut after it (a .detach(), torch.no_grad(), "
                       f".item() on the way), or it and every layer before it are frozen (requires_grad=False: a "
                       f"frozen backbone).")
            else:
                why = ""
            self._hold(step, "frozen", layout, p, f"{said}, and it has no gradient (no param_grad row: its .grad is "
                       f"None) while the other parameters have one.{why}", need=t.persist)
        elif g is None and exact:
            self._hold(step, "update_ratio_low", layout, p, f"{said} (the watch records no parameter gradients to "
                       f"tell why).", need=t.persist)
        elif grad == 0:
            # (a weight's gradient is its output's gradient times its input: one of the two is 0, the rows tell which)
            o = layout.out_grad.get(layout.keys[p][0])
            out = float(stats["norm"][o]) if o is not None else math.nan
            module = layout.keys[p][0] or "the model"
            if out > 0 and math.isfinite(out):
                why = (f"the output of {module} gets a gradient (||grad|| {out:.3g}), so its input is all 0 (dead "
                       f"units before it)")
            elif out == 0:
                why = (f"no gradient reaches the output of {module} (dead units, or an output pinned at a bound, "
                       f"after it: see vanishing_gradients)")
            else:
                why = ("no gradient reaches it (dead units, or an output pinned at a bound, after it), or its input is "
                       "0 (dead units before it)")
            self._hold(step, "update_ratio_low", layout, p, f"{said}: its gradient is exactly 0: {why}.",
                       need=t.persist)
        elif math.isfinite(scale) and scale < MOVING_GRADIENT and exact:
            vanished = _vanished_before(layout, stats, layout.keys[p][0], t.gradient_orders)
            self._hold(step, "update_ratio_low", layout, p, f"{said}: its gradient is small (||grad|| / ||param|| "
                       f"{scale:.2g}), " + (f"{vanished}." if vanished else
                                            "each step too small to change a float32 value at this learning rate."),
                       need=t.persist)
        elif math.isfinite(scale) and scale >= MOVING_GRADIENT and still != STILL_ACCUMULATING:
            self._hold(step, "not_updated", layout, p, f"{said}, though its gradient is not (||grad|| {grad:.3g}, "
                       f"||grad|| / ||param|| {scale:.2g}): the optimizer does not move it (it is not given this "
                       f"parameter, or its learning rate is 0 or far too small, or its gradient is clipped far down "
                       f"before the step).", need=t.persist)
            module, call, kind, tensor, _shape = layout.keys[p]
            e = self._open[("not_updated", kind, module, call, tensor)]
            # (its evidence says where its gradient grew as a sum over steps at every step it held, from its first; an
            # episode held only at one streak of unchanged steps is taken back where a change ends it as a sum's,
            # :meth:`_take_back_accumulation`)
            growing = still == STILL_GROWING and (e["count"] == 1 or e.get("grew_from") is not None)
            e["grew_from"] = (e.get("grew_from") or (step, grad)) if growing else None
            if growing:  # (what was checked, the gradient's growth, and why it cannot tell the two apart)
                first, then = e["grew_from"]
                e["evidence"] += (f" Its gradient grew from {then:.3g} at step {first} to {grad:.3g}, the "
                                  f"parameter never changing: its .grad is summed over the steps, never zeroed "
                                  f"(zero_grad() called on an optimizer that does not hold it, one built on a copy of "
                                  f"the model, or not called at all), or summed over micro-batches with w.step() per "
                                  f"micro-batch whose first optimizer step has not come (then this finding goes once "
                                  f"it changes). gradients_accumulate (read from a bias) waits {MAX_ACCUMULATED_STEPS} "
                                  f"unchanged steps in a row: a gradient summed since the first step is what "
                                  f"accumulation holds before its first optimizer step.")


    def _judge_ratio(self, step: int, layout: _Layout, p: int, ratio: float, exact: bool,
                     high: float | None = None, grad: float | None = None, vanished: str = "") -> None:
        """``ratio``: ``||update|| / ||param||`` of parameter row ``p`` (``exact``: from its update row, else a lower
        bound); ``grad``: ``||grad|| / ||param||`` where its gradient is recorded (a low ratio with a gradient that
        is not small is a step far smaller than the gradient: the learning rate, or a clipping, not the gradient);
        ``vanished``: where its module's output gets a gradient orders below the step's largest, that said
        (:func:`_vanished_before`), the low ratio's cause."""
        t = self.thresholds
        high = t.update_ratio_high if high is None else high
        if not math.isfinite(ratio):
            return
        if ratio > high:
            finding, bound = "update_ratio_high", high
        elif exact and ratio < t.update_ratio_low:
            finding, bound = "update_ratio_low", t.update_ratio_low
        else:
            return
        what = "||update|| / ||param||" if exact else (
            "||update|| / ||param|| is at least (from the parameter's norm and mean on consecutive steps)")
        text = f"(threshold: {'above' if finding.endswith('high') else 'below'} {bound:g}; healthy ~1e-3)."
        if finding == "update_ratio_low" and grad is not None and math.isfinite(grad) and grad >= MOVING_GRADIENT:
            text += (f" Its gradient is not small (||grad|| / ||param|| {grad:.2g}): the step is {ratio / grad:.2g} of "
                     f"the gradient, a learning rate far too small, or the gradient clipped far down before the step "
                     f"(clip_grad_norm_ with a tiny max_norm).")
        elif finding == "update_ratio_low" and vanished:
            text += f" Its gradient is small: {vanished}."
        self._hold(step, finding, layout, p, f"{what} {ratio:.3g} at step {step} {text}", need=t.persist)
        module, call, kind, tensor, _shape = layout.keys[p]
        e = self._open[(finding, kind, module, call, tensor)]
        peak = e.get("peak")  # (the farthest from usual of the episode, and its step)
        if peak is None or (ratio > peak[0] if finding == "update_ratio_high" else ratio < peak[0]):
            peak = e["peak"] = (ratio, step)
        if f"{peak[0]:.3g}" != f"{ratio:.3g}":
            e["evidence"] = (f"{what} {ratio:.3g} at step {step}; {'up' if finding == 'update_ratio_high' else 'down'} "
                             f"to {peak[0]:.3g} at step {peak[1]} {text}")

    def _metric_check(self, step: int, name: str, value: float, recorded: bool = False) -> None:
        """Judge a loss metric's value at ``step`` (``recorded``: the step recorded rows, judged before it)."""
        t = self.thresholds
        state = self._metrics.get(name)
        if state is None:
            state = self._metrics[name] = {"recent": deque(maxlen=t.spike_window),
                                           "tail": deque(maxlen=t.diverge_window), "best": math.inf, "nonfinite": None}
        if not math.isfinite(value):
            self._loss_nan.setdefault(name, (step, value))
            last = f" (last finite: {state['recent'][-1]:.4g})" if state["recent"] else ""
            self._hold(step, "loss_not_finite", None, None,
                       f"{name} is {value} at step {step}{last}{self._nan_source(step, recorded)}", site=name,
                       key=name, worst=-step, strongest=True)  # (the evidence of its first NaN)
            return
        recent, tail = state["recent"], state["tail"]
        state.setdefault("start", value)  # (its first finite value: the scale of what it can fall)
        # what the loss fell from: its first value, or its chance level where known and higher (a run that
        # continues a trained model starts far below chance: its batch noise is no spike, nor divergence)
        chance = self._chance.get(name.lower(), -math.inf)
        top = max(state["start"], chance)
        if len(recent) >= max(5, t.spike_window // 2):
            # against the level of the last few steps, in units of the step-to-step noise (the median
            # absolute difference of consecutive values, which a trend hardly moves); the noise is
            # only worked out for a value well above the level
            level = _median([recent[-5], recent[-4], recent[-3], recent[-2], recent[-1]])
            rise = value - level
            noise = 0.0
            if rise > t.spike_min_rise * max(abs(level), 1e-12):
                values = list(recent)
                noise = 1.4826 * _median([abs(b - a) for a, b in zip(values[:-1], values[1:])])
            fell = top - state["best"] if math.isfinite(state["best"]) else 0.0
            # (a level of exactly 0 without step-to-step noise is no scale to measure a rise by: the largest magnitude
            # of the recent values is. A loss made constant, 0 but for float32's rounding now and then (the mean of a
            # LayerNorm's output), read 1.5e-08 after 0 as a spike of 1.5e+04x; a classification fitted exactly, its
            # loss 0 for many steps, that jumps to 300 has spiked)
            spread = noise if level != 0 or noise > 0 else max(abs(v) for v in recent)
            if (rise > t.spike_factor * spread and rise > t.spike_min_rise * max(abs(level), 1e-12)
                    and rise >= t.spike_regain * max(fell, 0.0)):
                self._hold(step, "loss_spike", None, None,
                           f"{name} = {value:.4g} at step {step}: {_times(rise / max(abs(level), 1e-12))} its level "
                           f"(median of the last 5 steps: {level:.4g}) above it, "
                           f"{_times(rise / max(spread, 1e-12))} its step-to-step noise ({noise:.2g}; threshold "
                           f"{t.spike_factor:g})" + ("." if spread == noise else
                                                     f" and the largest magnitude of its last {len(recent)} values "
                                                     f"({spread:.2g})."),
                           site=name, key=("spike", name), worst=rise / max(abs(level), 1e-12),
                           strongest=True)  # (spikes on consecutive steps: one finding, the largest's evidence)
        elif recent:
            # too few steps for their noise (a learning rate far too large throws the loss up in its
            # first steps, from the second on: Adam at 1 on a ReLU MLP, 0.74 to 48): a spike is spike_factor times the
            # level of the steps so far above it
            level = _median(list(recent))
            rise = value - level
            # (a level of exactly 0, a hinge or margin loss whose first batch is all within the margin, is no scale
            # to measure a rise by: 0.05 after 0 read as a spike of 5e+10x)
            if level != 0 and rise > t.spike_factor * abs(level) and rise >= t.spike_regain * max(top - level, 0.0):
                before = f"median of the {len(recent)} steps before" if len(recent) > 1 else "its first value"
                self._hold(step, "loss_spike", None, None,
                           f"{name} = {value:.4g} at step {step}: {_times(rise / max(abs(level), 1e-12))} its level "
                           f"({before}: {level:.4g}) above it (threshold "
                           f"{t.spike_factor:g}x in a run's first {max(5, t.spike_window // 2)} steps).",
                           site=name, key=("spike", name), worst=rise / max(abs(level), 1e-12), strongest=True)
        recent.append(value)
        tail.append(value)
        self._plateau_check(step, name, value, state)
        if len(tail) == tail.maxlen:
            last = list(tail)
            now = _median(last)
            best = state["best"] = min(state["best"], now)
            rising = sum(b > a for a, b in zip(last[:-1], last[1:])) >= len(last) - 2
            first = state.setdefault("first", now)
            from_chance = chance > first
            first = max(first, chance)
            # (and has given back at least diverge_regain of what it fell from its first median, or its
            # chance level where higher: a converged loss near 0, noisy from batch to batch, is many times
            # its lowest without diverging)
            start = state["start"]
            risen = (now - best > (t.diverge_factor - 1) * max(abs(best), 1e-12)
                     and now - best >= t.diverge_regain * (first - best))
            # rising to begin with; then the same finding while the loss stays up (noise at its new level
            # would make it rise and fall: hundreds of findings of one divergence)
            state["diverged"] = risen and (rising or state.get("diverged", False))
            if state["diverged"]:
                # (a loss that fell to about 0: a ratio to its lowest says nothing, the way back up does)
                times = f"{now / best:.3g}x its lowest" if 0 < best and now < 1e4 * best else "up from its lowest"
                way = (now - best) / (first - best) if first > best else 0.0
                what = f"{'chance level' if from_chance else 'first median'} ({first:.4g})"
                # (past 10 times the way back, a percentage is a number nobody reads: its first median is far below)
                back = "" if first <= best else (f", back {way:.0%} of the way to its {what}" if way <= 10 else
                                                 f", {now / first:.3g}x its {what}" if first > 0 else
                                                 f", far above its {what}")
                self._hold(step, "diverging", None, None,
                           f"{name}: median {now:.4g} over its last {len(tail)} steps and "
                           f"{'rising' if rising else 'still up'}, {times} ({best:.4g}){back} (thresholds "
                           f"{t.diverge_factor:g}x, {t.diverge_regain:.0%} back).", site=name, key=name)
            elif start > 0 and now > t.diverge_blowup * start:  # (blown up early: no lower median to rise from)
                self._hold(step, "diverging", None, None,
                           f"{name}: median {now:.4g} over its last {len(tail)} steps, {now / start:.3g}x its "
                           f"first value ({start:.4g}; threshold {t.diverge_blowup:g}x).", site=name, key=name)


    def _plateau_check(self, step: int, name: str, value: float, state: dict) -> None:
        """``loss_plateau``: ``plateau_steps`` finite values of a loss metric on, the median of its last
        :data:`PLATEAU_WINDOW` not below that of its first by ``plateau_drop`` of its magnitude (once a plateau,
        nor by 3 times the standard deviation their difference has from the batch-to-batch noise: a noisy loss
        that has not fallen reads so, and one still falling through its noise does not); never where such a
        median was once below the first by that and by 5 times the noise (a loss set back by a bad batch)."""
        t = self.thresholds
        head = state.setdefault("head", [])
        if len(head) < PLATEAU_WINDOW:
            head.append(value)
        last = state.setdefault("last", deque(maxlen=PLATEAU_WINDOW))
        last.append(value)
        state["count"] = count = state.get("count", 0) + 1
        if count < PLATEAU_WINDOW:
            return
        values = list(last)
        now = _median(values)
        start = _median(head)
        chance = self._chance.get(name.lower())
        top = start if chance is None else max(start, chance)  # (a run continuing a trained model fell from chance)
        if not state.get("fell") and now < state.get("lowest", math.inf):  # (the lowest median of 20 so far)
            state["lowest"] = now
            # a loss that fell, well beyond its noise then, and came back up (set back by a bad batch, or thrown up
            # as it diverges, its noise now many times what it was) is no plateau: judged with the noise it had
            if now < top - t.plateau_drop * abs(top) and now < top - 5 * _medians_noise(values):
                state["fell"] = True
        if count < t.plateau_steps:
            return
        noise = _medians_noise(values)
        # (a plateau starts where the loss is not plateau_drop below its start, and holds until it fell beyond
        # its noise too: a flat noisy loss stays one finding, a noisy one that falls, slowly, never is one)
        if chance is not None:
            # (no better than chance: the finding that says why the loss does not fall, said instead of a plateau;
            # and one a loss that fell from confident initial outputs to the class frequencies has too)
            held = ("loss_at_chance", name) in self._open  # (the noise of one median: that of two over sqrt 2)
            margin = max(t.plateau_drop * abs(chance), 3 * noise / math.sqrt(2) if held else 0.0)
            if now > chance - margin:
                # (far above chance is worse than blind: outputs confidently wrong, not a model that learned nothing)
                worse = (" That far above it, it is worse than a model blind to its inputs: its outputs are "
                         "confidently wrong, too large (logits, predictions: weights, or activations grown layer by "
                         "layer, too large from the init or by the learning rate; see the scale of the outputs)."
                         if chance > 0 and now >= 2 * chance else "")
                self._hold(step, "loss_at_chance", None, None,
                           f"{name}: median {now:.4g} over its last {PLATEAU_WINDOW} values after {count} steps, "
                           f"{_change(now, chance)} its chance level {chance:.4g} (from {start:.4g} over its first "
                           f"{PLATEAU_WINDOW}); threshold: {t.plateau_drop:.0%} below it after {t.plateau_steps} "
                           f"steps (and, to end, 3x the noise of the median if larger).{worse}", site=name, key=name,
                           need=t.persist)
                return
        if start == 0:  # (a loss at 0 over its first values, fitted in its first steps: nothing left to fall)
            return
        held = ("loss_plateau", ("plateau", name)) in self._open
        margin = max(t.plateau_drop * abs(start), 3 * noise if held else 0.0)
        if now > start - margin and not state.get("fell"):
            fell = start - now
            if fell <= 0:
                what = f"has not fallen in its {count} steps: median {now:.4g} over its last {PLATEAU_WINDOW}, " \
                       f"{_change(now, start)} its first {PLATEAU_WINDOW} ({start:.4g})"
            else:
                what = f"has fallen only {_change(now, start).split()[0]} in its {count} steps (median {now:.4g} " \
                       f"over its last {PLATEAU_WINDOW}, {start:.4g} over its first)" + \
                       (f", within 3x the noise of the two medians ({noise:.2g})" if fell > t.plateau_drop * abs(start)
                        else "")
            self._hold(step, "loss_plateau", None, None,
                       f"{name} {what}; threshold: {t.plateau_drop:.0%} lower after {t.plateau_steps} steps (and, "
                       f"to end, 3x the noise of the two medians if larger).", site=name, key=("plateau", name),
                       need=t.persist)


def _one_per_site(rows: list[dict]) -> list[dict]:
    """``rows`` (findings as :meth:`Diagnoser._row` gives them, in the frame's order) with the findings of one kind at
    one site whose steps overlap or touch made one: a finding told by two checks (``exploding_activations`` through
    depth and over steps, both at the site it starts at) is one trouble, listed once, at the place of the one listed
    first, over the steps of both, its evidence that of each (the first listed first) and its severity the worse."""
    out: list[dict] = []
    for row in rows:
        same = next((r for r in out if (r["finding"], r["site"], r["kind"], r["module"], r["call"], r["tensor"]) ==
                     (row["finding"], row["site"], row["kind"], row["module"], row["call"], row["tensor"])
                     and row["step"] <= r["last_step"] + 1 and r["step"] <= row["last_step"] + 1), None)
        if same is None:
            out.append(row)
            continue
        same.update(step=min(same["step"], row["step"]), last_step=max(same["last_step"], row["last_step"]),
                    severity=max(same["severity"], row["severity"], key=_RANK.__getitem__))
        if row["evidence"] != same["evidence"]:
            same["evidence"] = f"{same['evidence']} Also: {row['evidence']}"
    return out


def _grouped(rows: list[dict], first_step: int = 1) -> list[dict]:
    """``rows`` (findings as :meth:`Diagnoser._row` gives them, in the frame's order) with a run's consequences grouped
    under their cause: the finding of :data:`ROOT_FINDINGS` that began first (of those that began at once, the first of
    that tuple) is the root, and every finding that began while it or one of its consequences held (at most
    :func:`_rejoin_gap` steps after the last of them held; but :data:`NOT_CONSEQUENCES`) follows right after it, its
    ``cause`` naming the root, where it has one at least and the group holds one of :data:`BLOWN_UP`; else the root
    that began next is tried.
    The root's severity is the worst of its group's, so that it leads as its consequences would. A learning rate of 10
    on a ReLU MLP: its update ratios at step 1 first, then its loss spike, dead units, vanished gradients and stilled
    weights. A finding that began after the root's trouble had ended is not its consequence: a learning rate too hot
    for the first 4 steps does not cause the NaN loss of step 50."""
    priority = {name: i for i, name in enumerate(ROOT_FINDINGS)}
    candidates = sorted((i for i, r in enumerate(rows) if r["finding"] in priority),
                        key=lambda i: (rows[i]["step"], priority[rows[i]["finding"]], i))
    if not candidates or not any(r["finding"] in BLOWN_UP for r in rows):
        return rows
    for root in candidates:  # (a root without consequences is a finding of its own: the next is tried)
        members = _consequences(rows, root, first_step)
        if members and any(rows[i]["finding"] in BLOWN_UP for i in [root, *members]):
            break
    else:
        return rows
    start = rows[root]["step"]
    # (in the order they began: what happened, step by step; the root's kind first, the same cause at other sites)
    order = {name: i for i, name in enumerate(FINDINGS)}
    members.sort(key=lambda i: ((rows[i]["finding"], rows[i]["step"]) != (rows[root]["finding"], start),
                                rows[i]["step"], order[rows[i]["finding"]], i))
    cause = f"{rows[root]['finding']} at {rows[root]['site']}"
    head = dict(rows[root], severity=max((rows[i]["severity"] for i in [root, *members]), key=_RANK.__getitem__),
                evidence=_consequences_evidence(rows[root]["evidence"], start, [rows[i] for i in members]),
                consequences=len(members))
    group = [head, *(dict(rows[i], cause=cause) for i in members)]
    taken = {root, *members}
    # (the rest may hold a trouble of its own, begun after this one had ended: grouped the same way)
    rest = _grouped([r for i, r in enumerate(rows) if i not in taken], first_step)
    # (the group where its root, at its worst severity, sorts among the others: most severe, then newest by last step;
    # before or after a group of the rest, never inside it, whose consequences follow right after their root)
    key = (-_RANK[head["severity"]], -max(r["last_step"] for r in group))
    starts = [k for k, r in enumerate(rest) if not r["cause"]]
    ends = [*starts[1:], len(rest)]
    at = next((k for k, end in zip(starts, ends)
               if (-_RANK[rest[k]["severity"]], -max(r["last_step"] for r in rest[k:end])) > key), len(rest))
    return rest[:at] + group + rest[at:]


def _behind_floor_dead(rows: list[dict]) -> list[dict]:
    """``rows`` (findings as :meth:`Diagnoser._row` gives them, grouped by :func:`_grouped`) with the vanished gradients
    of a layer dead on its flat tail (``dead_units`` of :meth:`Diagnoser._floor_dead`: a GELU, SiLU, Mish or ELU whose
    every input lies on its negative tail) under it: a ``vanishing_gradients`` at a site before it in forward order,
    begun while it held, is what its tail does (it passes almost no gradient back), not a cause of its own. Listed
    right after it, its ``cause`` naming it; the dead layer counts it in ``consequences`` and its evidence names it,
    with its steps. Rows already grouped under a run's cause stay there."""
    dead = [k for k, r in enumerate(rows) if r["finding"] == "dead_units" and r["floor"] and not r["cause"]]
    if not dead:
        return rows
    taken: dict[int, list[int]] = {}
    for k, r in enumerate(rows):
        if r["finding"] != "vanishing_gradients" or r["cause"] or r["consequences"]:
            continue
        layer = next((d for d in dead if 0 <= r["order"] < rows[d]["order"]
                      and rows[d]["step"] <= r["step"] <= rows[d]["last_step"]), None)
        if layer is not None:
            taken.setdefault(layer, []).append(k)
    if not taken:
        return rows
    out = []
    moved = {k for members in taken.values() for k in members}
    for k, r in enumerate(rows):
        if k in moved:
            continue
        members = [rows[m] for m in taken.get(k, [])]
        if not members:
            out.append(r)
            continue
        named = "; ".join(f"{m['finding']} at {m['site']}, step {m['step']}" + (
            f"–{m['last_step']}" if m["last_step"] != m["step"] else "") for m in members)
        out.append(dict(r, consequences=r["consequences"] + len(members),
                        evidence=f"{r['evidence']} Its consequence{'s' if len(members) > 1 else ''}, the gradient "
                                 f"its tail does not pass back: {named}."))
        out.extend(dict(m, cause=f"{r['finding']} at {r['site']}") for m in members)
    return out


def _consequences_evidence(evidence: str, step: int, consequences: list[dict]) -> str:
    """The evidence of a cause (``evidence``, its own; ``step``, where it began) that ends naming its
    ``consequences`` (rows as :meth:`Diagnoser._row` gives them), each with its steps: ``... The run went wrong from
    here: 13 findings began at step 1 or later, its consequences: loss_spike at loss, step 3–4; ...``."""
    named = "; ".join(f"{r['finding']} at {r['site']}, step {r['step']}" + (
        f"–{r['last_step']}" if r["last_step"] != r["step"] else "") for r in consequences)
    count = f"{len(consequences)} finding{'s' if len(consequences) > 1 else ''}"
    return f"{evidence} The run went wrong from here: {count} began at step {step} or later, its consequences: {named}."


def _consequences(rows: list[dict], root: int, first_step: int) -> list[int]:
    """The findings of ``rows`` (indices) that began while ``root`` or one of those before them held, in the order
    they began: at its step or later, at most :func:`_rejoin_gap` steps after the last of them held (but
    :data:`NOT_CONSEQUENCES`). A consequence that is no blow-up (not of :data:`ROOT_FINDINGS` nor :data:`BLOWN_UP`)
    holds the trouble open at the step it began only, not for as long as it lasts, but to the root's own finding
    beginning again (the same cause, back while its consequences hold)."""
    held = lingering = rows[root]["last_step"]
    later = sorted((i for i, r in enumerate(rows) if i != root and r["step"] >= rows[root]["step"]
                    and r["finding"] not in NOT_CONSEQUENCES), key=lambda i: (rows[i]["step"], i))
    members = []
    for i in later:
        gap = _rejoin_gap(rows[i]["step"], first_step)
        # (a blow-up holds the trouble open while it lasts; a state it left behind (dead units, stilled weights) only
        # where it began, but for the root's own finding back (a learning rate still too hot): dead units to the end
        # of a run do not make a NaN of an input 250 steps after a learning rate too hot for 3 steps its consequence)
        back = rows[i]["finding"] == rows[root]["finding"] and rows[i]["step"] <= lingering + gap
        if rows[i]["step"] > held + gap and not back:
            break  # (the trouble had ended before it began: its own finding, and so are those after it)
        members.append(i)
        lasting = rows[i]["finding"] in ROOT_FINDINGS or rows[i]["finding"] in BLOWN_UP
        held = max(held, rows[i]["last_step"] if lasting else rows[i]["step"])
        lingering = max(lingering, rows[i]["last_step"])
    return members


def _rejoin_gap(step: int, first_step: int) -> float:
    """The steps a finding may end before another begins and still be one trouble with it: :data:`REJOIN_STEPS`, or
    later in a run :data:`REJOIN_FRACTION` of the steps so far (as an episode is taken up again)."""
    return max(REJOIN_STEPS, REJOIN_FRACTION * (step - first_step + 1))


def _grad_bounds(norm: np.ndarray, outputs: list[int], entries: list[int], inputs: list[int]) -> np.ndarray | float:
    """The most one backward pass can make a parameter's gradient (an entry of :attr:`_Layout.bias_bounds`), from the
    norms ``norm`` (rows, or (steps, rows)): a bias's ``sqrt(m) ||grad_output||`` per call (``inputs`` -1), a weight's
    ``sqrt(m) ||grad_output|| ||input||`` (``inputs``: the input's activation row; ``m`` 1 for a Linear, a
    convolution's kernel offsets times 2 per spatial dim). Cauchy-Schwarz: a bias's gradient sums ``m`` entries of
    its output's gradient per unit; a Linear's weight gradient is ``grad_output^T input``, whose Frobenius norm is at
    most the product of theirs (a convolution's, that at each kernel offset: :meth:`Diagnoser._weight_bounds`)."""
    return sum(np.sqrt(m) * (1.0 if i < 0 else norm[..., i]) * norm[..., r]
               for r, m, i in zip(outputs, entries, inputs))


def _along(layout: _Layout, i: int) -> str:
    """Where the units of activation row ``i`` lie, where not plain: dim 1 of a (B, C, H, W) output (its channels),
    of a (B, T, ...) sequence without a bias that feeds it (its positions), the last of a (B, T, F) one with one."""
    if layout.ndim[i] <= 2:
        return ""
    if layout.ndim[i] == 3 and layout.feed_bias[i] >= 0:
        return f" along the last dim of {layout.keys[i][4]}"
    return f" along dim 1 of {layout.keys[i][4]}"


def _signless_zero(value: Any) -> float:
    """``value`` as a float, a -0.0 as 0.0: a dead GELU's outputs are all -0.0 (GELU of a large negative input),
    and its evidence said "max -0" of outputs it calls exactly 0."""
    return float(value) + 0.0


def _chance_entries(units: int, zero_frac: float) -> int:
    """The entries per unit (inputs x positions, over steps) past which ``units`` units each 0 at rate ``zero_frac``,
    live but that sparse, would all be 0 for every one of them in fewer than one unit by chance: the least ``M`` with
    ``units zero_frac^M < 1`` (1 where ``zero_frac`` is 1, no live rate to compare with)."""
    if units <= 1:
        return 1
    return math.floor(math.log(units) / -math.log(zero_frac)) + 1


def _dead_evidence(e: dict, per_step: int, units: int) -> str:
    """What a ``dead_units`` episode rests on: its recorded steps and the entries per unit they saw."""
    steps = e["count"]
    entries = steps * per_step
    held = (f" It held on {steps} recorded step{'s' if steps > 1 else ''} of this episode, {entries} entr"
            f"{'ies' if entries > 1 else 'y'} per unit in all (inputs x positions)")
    if units <= 1:
        return held + "."
    chance = units * LIVE_ZERO_FRAC ** entries
    value = f"{chance:.2g}" if chance >= 1e-3 else "< 0.001"
    return (f"{held}: were its {units} units live, each 0 for {LIVE_ZERO_FRAC:.0%} of its inputs, {units} x "
            f"{LIVE_ZERO_FRAC:g}^{entries} ({value}) of them would be 0 for all of those by chance.")


def _vanished_before(layout: _Layout, stats: dict, module: str, orders: float) -> str:
    """Where the output gradient of ``module`` is more than ``orders`` orders of magnitude (RMS) below the largest of
    the step, that said (the cause of its parameters' small steps: ``vanishing_gradients``, not the learning rate);
    else ""."""
    o = layout.out_grad.get(module)
    g = layout.grad_columns
    if o is None or not len(g):
        return ""
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = stats["norm"][g] / np.sqrt(np.maximum(stats["numel"][g].astype(np.float64), 1))
        own = float(stats["norm"][o]) / math.sqrt(max(float(stats["numel"][o]), 1.0))
    rms = np.where(np.isfinite(rms), rms, 0.0)
    top = int(np.argmax(rms))
    if not (own > 0 and rms[top] > 0) or math.log10(rms[top] / own) <= orders:
        return ""
    return (f"the gradient reaching the output of {module or 'the model'} is {math.log10(rms[top] / own):.1f} orders "
            f"of magnitude below the step's largest (RMS {own:.2g} against {rms[top]:.2g} at "
            f"{layout.names[g[top]]}: see vanishing_gradients), not a learning rate too small")


def _last_layer(layout: _Layout, sites: np.ndarray) -> int:
    """The position in ``sites`` (output-gradient rows, forward order) of the last layer: the last site whose module
    records parameters, those after it parameter-free (a softmax or log-softmax after the last Linear); the last
    site where no module records any (``parameters=False``)."""
    for k in range(len(sites) - 1, -1, -1):
        if layout.own_params.get(layout.keys[sites[k]][0]):
            return k
    return len(sites) - 1


def _medians_noise(values: list[float]) -> float:
    """The noise of the difference of two medians of ``len(values)`` values each: of one value from the median
    absolute difference of consecutive values (which a trend hardly moves), of a median of n ~1.2533 sigma /
    sqrt(n), of a difference of two sqrt(2) times that."""
    sigma = 1.4826 * _median([abs(b - a) for a, b in zip(values[:-1], values[1:])]) / math.sqrt(2)
    return math.sqrt(2) * 1.2533 * sigma / math.sqrt(len(values))


def _fitted(e: dict, output: bool) -> str:
    """The end of a ``saturated`` episode's evidence where it began once the loss had fallen (``e["fitted"]``)."""
    fitted = e.get("fitted")
    if not fitted:
        return ""
    what = ("the model's output (the last site in forward order): its predictions grew confident as the model fit "
            "its data, as the loss asks of them" if output else
            "a layer saturated as the model fit its data, as tanh and sigmoid nets trained to a low loss do")
    cost = "" if output else " (its units have little gradient left to learn anything new)"
    began = (f" It began once {fitted[0]} had fallen from {fitted[1]:.3g} to {fitted[2]:.3g} (the median of its last "
             f"{e['window']} values)")
    if e.get("risen"):
        return (f"{began}, as the model fit its data; {fitted[0]} has since risen back to {e['risen']:.3g}: the "
                f"model no longer fits, and the saturation is a warning again.")
    return f"{began}: {what}; harmless while the loss stays low{cost}."


def _times(ratio: float) -> str:
    """``ratio`` as a factor a person reads: ``8.9x``, ``1.2e+04x`` (not ``15506440251784755200x``)."""
    return f"{ratio:.1f}x" if abs(ratio) < 1e4 else f"{ratio:.2g}x"


def _change(now: float, start: float) -> str:
    """How ``now`` compares with ``start``: ``0.3% below``, ``2% above``, ``the same as``; ``49.7x`` at twice a
    positive ``start`` or more (not ``4873.0% above``)."""
    if now == start:
        return "the same as"
    if start == 0:
        return "above" if now > start else "below"
    if start > 0 and now >= 2 * start:
        return _times(now / start)
    return f"{abs(now - start) / abs(start):.1%} {'above' if now > start else 'below'}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])




def _logged(present: np.ndarray) -> np.ndarray:
    """Which cells of a metrics frame were logged. A frame has a NaN where a metric was not logged
    that step, and where it was logged as NaN (a NaN loss): a metric logged on at least 2 steps in a
    row from its first, that has only NaNs after its first gap, counts those as logged (it went NaN
    and stayed); a sparse one (an evaluation's every few steps) does not. (The live form, fed the
    records, sees a NaN as logged; a frame cannot tell a metric first logged NaN at its 2nd step.)"""
    logged = present.copy()
    for j in range(present.shape[1]):
        column = present[:, j]
        seen = np.flatnonzero(column)
        if not len(seen):
            continue
        gaps = np.flatnonzero(~column[seen[0]:])
        if len(gaps) and gaps[0] >= 2 and not column[seen[0] + gaps[0]:].any():
            logged[seen[0] + gaps[0]:, j] = True
    return logged


#: The columns of a long metrics frame (``w.metrics(long=True)``): one row per logged value.
LONG_METRICS = ["step", "name", "value"]


def _is_long(metrics: pd.DataFrame) -> bool:
    """A long metrics frame: :data:`LONG_METRICS`, its names strings (a wide frame of two metrics
    logged as ``name`` and ``value`` has the same columns, all numbers)."""
    return list(metrics.columns) == LONG_METRICS and not pd.api.types.is_numeric_dtype(metrics["name"])


def _sample(items: list, k: int) -> list:
    if len(items) <= k:
        return items
    picks = np.linspace(0, len(items) - 1, k).round().astype(int)
    return [items[i] for i in dict.fromkeys(picks)]


def _check_frame(rows: Any, metrics: Any, ordered: bool = True) -> None:
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"diagnose() needs the run's rows as a pandas DataFrame (w.to_pandas(), "
                        f"load_run(path).to_pandas()), got {type(rows).__name__}.")
    need = {"step", "module", "call", "kind", "tensor", "shape", *_STATS}
    missing = sorted(need - set(rows.columns))
    if missing and len(rows.columns):
        raise ValueError(f"diagnose(): the rows lack the columns {missing}; pass the frame of w.to_pandas() or "
                         f"load_run(path).to_pandas() (columns: workbench.instrument.ROW_COLUMNS).")
    if ordered and len(rows):
        steps = pd.to_numeric(rows["step"], errors="coerce").to_numpy(np.float64)
        back = np.flatnonzero(~(steps[1:] >= steps[:-1]))
        if len(back):
            i = int(back[0])
            raise ValueError(f"diagnose(): the rows must be in recorded order, as w.to_pandas() and "
                             f"load_run(path).to_pandas() give them (steps in order; within a step, the order the "
                             f"sites ran, which the findings read); the row at position {i + 1} (step "
                             f"{rows['step'].iloc[i + 1]}) comes after step {rows['step'].iloc[i]}. Pass the frame "
                             f"in the order it came (a filter keeps it).")
    if metrics is not None:
        if not isinstance(metrics, pd.DataFrame):
            raise TypeError(f"diagnose(): metrics must be a pandas DataFrame (w.metrics()) or None, "
                            f"got {type(metrics).__name__}.")
        if len(metrics.columns) and "step" not in metrics.columns:
            raise ValueError(f"diagnose(): the metrics frame needs a 'step' column (as w.metrics() has); its "
                             f"columns are {list(metrics.columns)}.")
        if len(metrics) and not _is_long(metrics):
            for name in metrics.columns:
                column = metrics[name]
                if not (pd.api.types.is_numeric_dtype(column) or pd.to_numeric(column, errors="coerce").notna()
                        .eq(column.notna()).all()):
                    raise ValueError(f"diagnose(): the metrics frame's column {name!r} is not numbers; pass "
                                     f"w.metrics() (a column per metric) or w.metrics(long=True) (the columns "
                                     f"{LONG_METRICS}).")


def diagnose(rows: pd.DataFrame, metrics: pd.DataFrame | None = None, thresholds: Thresholds | dict | None = None,
             **overrides: Any) -> Findings:
    """The findings of a recorded run: what looks wrong, where and since when.

    Args:
        rows: the run's rows in recorded order (``w.to_pandas()``, ``load_run(path).to_pandas()``).
        metrics: its metrics: ``w.metrics()`` (one row per step), or ``w.metrics(long=True)`` (one row
            per logged value, exact about a metric logged NaN); None: no metric findings.
        thresholds: a :class:`Thresholds`, a dict of its fields, or None for the defaults.
        **overrides: single thresholds (``persist=5``, ``update_ratio_high=0.05``).

    Returns:
        One row per finding (:data:`COLUMNS`), the most severe first, then the newest by last step (of those, the one
        that began first): a :class:`Findings`, a DataFrame that displays its text whole.

    Raises:
        TypeError: ``rows``/``metrics`` not DataFrames, an unknown threshold.
        ValueError: a frame without the run's columns or out of recorded order, a metrics column not
            numbers, a threshold out of range, ``loss_metrics`` naming no metric of the run.
    """
    diagnoser = Diagnoser(thresholds, **overrides)
    _check_frame(rows, metrics)
    named = diagnoser.thresholds.loss_metrics
    if metrics is not None and len(metrics) and named != Thresholds.loss_metrics:
        logged = set(metrics["name"]) if _is_long(metrics) else {c for c in metrics.columns if c != "step"}
        if logged and not {n.lower() for n in named} & {str(n).lower() for n in logged}:
            raise ValueError(f"diagnose(): loss_metrics={named} names no metric of the run, which logged "
                             f"{sorted(map(str, logged))}: the loss findings would judge nothing.")
    diagnoser.feed_frame(rows, metrics)
    return diagnoser.findings()


def update_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """``||update|| / ||param||`` per parameter and step: ``step, module, tensor, ratio`` from the rows of
    kind ``update`` and ``param`` of the same parameter and step (a run recorded with updates)."""
    _check_frame(rows, None, ordered=False)
    keys = ["step", "module", "call", "tensor"]
    update = rows[rows.kind == "update"][keys + ["norm"]]
    param = rows[rows.kind == "param"][keys + ["norm"]]
    both = update.merge(param, on=keys, suffixes=("_update", "_param"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = both.norm_update.to_numpy(np.float64) / both.norm_param.to_numpy(np.float64)
    return pd.DataFrame({"step": both.step.to_numpy(), "module": both.module.to_numpy(),
                         "tensor": both.tensor.to_numpy(), "ratio": ratio})


# ------------------------------------------------------------------ per-sample gradient statistics
def gradient_noise(model: Any, loss_fn: Any, *batch: Any, chunk_size: int | None = None) -> pd.DataFrame:
    """Per-sample gradient statistics of one batch, per parameter (optional: not part of a watch).

    The gradient of each sample's loss is taken with ``torch.func`` (``vmap`` of ``grad`` over a
    functional call of the model), then, per parameter, with ``g_i`` the sample gradients and
    ``g`` their mean over the ``B`` samples:

    - ``grad_norm``: ``||g||``, the batch gradient's norm;
    - ``sample_norm``: the mean of ``||g_i||``;
    - ``variance``: ``sum over elements of var_i(g_i)`` (unbiased), the gradient noise;
    - ``snr``: ``||g||^2 / (variance / B)``, the batch gradient's signal over its noise (above 1:
      the direction is clear from this batch; well below: mostly noise, as Cockpit reads it);
    - ``noise_scale``: ``variance / ||g||^2``, the simple noise scale of McCandlish et al. (the
      batch size beyond which a larger batch helps little).

    Args:
        model: the module (its parameters that require gradients are measured).
        loss_fn: ``loss_fn(forward, *sample)``: the loss of a batch of one sample, where
            ``forward(*inputs)`` runs the model (``lambda f, x, y: F.cross_entropy(f(x), y)``).
        *batch: tensors whose first dimension is the batch (inputs and targets).
        chunk_size: samples per vectorized chunk (None: the whole batch at once; less memory with
            a smaller one).

    Returns:
        One row per parameter: ``parameter, numel, batch, grad_norm, sample_norm, variance, snr,
        noise_scale``.

    Raises:
        TypeError: ``model`` is not a module, ``loss_fn`` not callable, a batch entry not a tensor.
        ValueError: no batch, batches of different sizes or of fewer than 2 samples, no
            parameter that requires a gradient, a bad ``chunk_size``.
    """
    import torch
    from torch.func import functional_call, grad, vmap

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gradient_noise() needs a torch.nn.Module, got {type(model).__name__}.")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(forward, *sample), got {loss_fn!r}.")
    if not batch or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in batch):
        raise TypeError("gradient_noise() needs the batch as tensors with a batch dimension first, e.g. "
                        "gradient_noise(model, loss_fn, x, y); got "
                        f"{[type(t).__name__ for t in batch] or 'none'}.")
    sizes = {len(t) for t in batch}
    if len(sizes) != 1 or min(sizes) < 2:
        raise ValueError(f"the batch's tensors must share a batch size of at least 2 (a variance needs two "
                         f"samples); got sizes {[len(t) for t in batch]}.")
    if chunk_size is not None:
        chunk_size = whole_number("chunk_size", chunk_size, 1, "None or a positive int")
    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameter that requires a gradient.")
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def sample_loss(p: dict, *sample: Any) -> Any:
        def forward(*inputs: Any) -> Any:
            return functional_call(model, (p, buffers), inputs)

        return loss_fn(forward, *(t.unsqueeze(0) for t in sample))

    per_sample = vmap(grad(sample_loss), in_dims=(None, *([0] * len(batch))), chunk_size=chunk_size)(params, *batch)
    rows = []
    size = sizes.pop()
    with torch.no_grad():
        for name, g in per_sample.items():
            flat = g.reshape(size, -1).double()
            mean = flat.mean(0)
            signal = float(mean.pow(2).sum())
            variance = float(flat.var(0, unbiased=True).sum())
            rows.append({"parameter": name, "numel": int(flat.shape[1]), "batch": size,
                         "grad_norm": signal ** 0.5, "sample_norm": float(flat.norm(dim=1).mean()),
                         "variance": variance, "snr": signal / (variance / size) if variance > 0 else math.inf,
                         "noise_scale": variance / signal if signal > 0 else math.inf})
    return pd.DataFrame(rows, columns=["parameter", "numel", "batch", "grad_norm", "sample_norm", "variance", "snr",
                                       "noise_scale"])
