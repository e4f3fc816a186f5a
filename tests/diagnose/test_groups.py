"""How a run's findings are grouped under their causes (workbench.diagnose) and folded under them in the lists
(workbench.ui.findings), where a run holds two troubles: findings made up as the diagnosis gives them."""

from __future__ import annotations

import pandas as pd

from workbench.diagnose import COLUMNS, _grouped
from workbench.ui import findings as view


def row(finding, site, step, last_step, severity="warning", kind="activation"):
    return {"step": step, "last_step": last_step, "site": site, "finding": finding, "severity": severity,
            "evidence": "e.", "hint": "h", "kind": kind, "module": site, "call": 0, "tensor": "out", "cause": "",
            "consequences": 0}


def listed(rows):
    return [(r["finding"], r["site"], r["cause"]) for r in rows]


def test_a_trouble_sorted_among_another_s_group_goes_before_or_after_it_never_inside_it():
    # exploding gradients at a (steps 1-5) throw the loss out; update ratios at b from step 300 make it diverge
    # again and kill units at c, a warning: the first group, an error newer than c's dead units, went between the
    # second's diverging loss and those dead units, which no longer followed their cause, until 2026-11-29
    rows = [row("diverging", "loss", 301, 400, "error", "metric"), row("diverging", "loss2", 3, 6, "error", "metric"),
            row("update_ratio_high", "b", 300, 400), row("dead_units", "c", 302, 302),
            row("exploding_gradients", "a", 1, 5), row("loss_spike", "loss", 2, 3, kind="metric")]
    assert listed(_grouped(rows)) == [
        ("update_ratio_high", "b", ""), ("diverging", "loss", "update_ratio_high at b"),
        ("dead_units", "c", "update_ratio_high at b"),
        ("exploding_gradients", "a", ""), ("loss_spike", "loss", "exploding_gradients at a"),
        ("diverging", "loss2", "exploding_gradients at a")]


def test_two_troubles_of_one_cause_at_one_site_each_fold_their_own_consequences():
    # update ratios at b too high at steps 1-3 (a loss spike, dead units at c), and again from step 300 (a diverging
    # loss): both groups' cause reads "update_ratio_high at b", and the lists folded the three consequences under
    # the newer row, "3 findings began at step 300 or later", the older one claiming its own that were not there,
    # until 2026-11-29
    rows = [row("diverging", "loss", 301, 400, "error", "metric"), row("update_ratio_high", "b", 300, 400),
            row("dead_units", "c", 2, 3), row("update_ratio_high", "b", 1, 3),
            row("loss_spike", "loss", 2, 3, kind="metric")]
    frame = pd.DataFrame([{c: r[c] for c in COLUMNS} for r in _grouped(rows)])
    shown = view.merge_calls(frame)
    assert shown[["step", "folded"]].values.tolist() == [[300, 1], [1, 2]]
    assert "1 finding began at step 300 or later, its consequences: diverging at loss, step 301–400." in \
        shown.evidence[0]
    assert "2 findings began at step 1 or later, its consequences: dead_units at c, step 2–3; loss_spike at loss, " \
        "step 2–3." in shown.evidence[1]
    # (picking the older lists its own two under it, the newer's one stays folded)
    older = view.merge_calls(frame, view.toggled((), shown.iloc[1]))
    assert older[["step", "site", "listed"]].values.tolist() == [[300, "b", False], [1, "b", True], [2, "c", False],
                                                                 [2, "loss", False]]


def test_a_blow_up_with_no_consequences_leaves_a_later_trouble_grouped():
    # activations thrown up at steps 10-12 and nothing else then; from step 300 update ratios too high make the loss
    # diverge and kill units: the first candidate, a group of one, ended the grouping, the later trouble's three
    # findings left as unrelated rows, until 2026-11-29
    rows = [row("diverging", "loss", 301, 400, "error", "metric"), row("update_ratio_high", "b", 300, 400),
            row("dead_units", "c", 302, 400), row("exploding_activations", "x", 10, 12)]
    assert listed(_grouped(rows)) == [
        ("update_ratio_high", "b", ""), ("diverging", "loss", "update_ratio_high at b"),
        ("dead_units", "c", "update_ratio_high at b"), ("exploding_activations", "x", "")]
