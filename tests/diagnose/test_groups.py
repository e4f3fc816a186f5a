"""How a run's findings are grouped under their causes (workbench.diagnose) and folded under them in the lists
(workbench.ui.findings), where a run holds two troubles: findings made up as the diagnosis gives them."""

from __future__ import annotations

from workbench.diagnose import _grouped


def row(finding, site, step, last_step, severity="warning", kind="activation"):
    return {"step": step, "last_step": last_step, "site": site, "finding": finding, "severity": severity,
            "evidence": "e.", "hint": "h", "kind": kind, "module": site, "call": 0, "tensor": "out", "cause": ""}


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

