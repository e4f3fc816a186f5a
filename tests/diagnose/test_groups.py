"""How a run's findings are grouped under their causes (workbench.diagnose) and folded under them in the lists
(workbench.ui.findings), where a run holds two troubles: the registry's ReLU MLP trained by SGD at a learning rate
set step by step (tests.diagnose.runs.mlp_on_halves), hot at some steps and usual at the others."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from tests.diagnose.runs import fit_steps, mlp_on_halves
from workbench.ui import findings as view


def hot_at(*spans: tuple[int, int], hot: float = 10.0, usual: float = 0.05):
    """A learning rate per step: ``hot`` at the steps of ``spans`` (first, last), ``usual`` at the others."""
    return lambda step: hot if any(first <= step <= last for first, last in spans) else usual


@pytest.fixture(scope="module")
def thrown_out_twice() -> pd.DataFrame:
    """The findings of a run thrown out at steps 1-2 and again at steps 30-31 (a learning rate of 10), 50 steps:
    the update ratios of layers.0.weight lead each trouble, the second killing the ReLUs of layers.1 and layers.3."""
    return mlp_on_halves(hot_at((1, 2), (30, 31)), steps=50, updates=True).diagnose()


def groups(f: pd.DataFrame) -> list[list[int]]:
    """The positions of ``f`` as the groups it lists: a row of its own, or a cause and the consequences after it."""
    out: list[list[int]] = []
    for i, cause in enumerate(f.cause):
        if cause:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def test_each_trouble_of_a_run_is_its_own_group_its_consequences_right_after_their_cause(thrown_out_twice):
    # a group sorted among another's went inside it, between its cause and its consequences, which no longer followed
    # their cause, until 2026-11-29
    f = thrown_out_twice
    causes = f[f.consequences > 0]
    assert causes[["finding", "site"]].values.tolist() == [["update_ratio_high", "layers.0.weight"]] * 2
    assert causes.step.tolist() == [30, 1]  # (the newer trouble first: the newest by their last step lead)
    for members in groups(f):
        head, rest = members[0], members[1:]
        assert f.consequences[head] == len(rest)
        assert all(f.cause[i] == f"{f.finding[head]} at {f.site[head]}" for i in rest)
        # (a consequence begins at its cause's step or later)
        assert all(f.step[i] >= f.step[head] for i in rest)
    older, newer = f[(f.cause != "") & (f.step < 30)], f[(f.cause != "") & (f.step >= 30)]
    assert {"loss_spike", "diverging"} <= set(older.finding) and "dead_units" not in set(older.finding)
    assert {"loss_spike", "diverging", "dead_units"} <= set(newer.finding)
    # (the ReLUs the second trouble killed stay dead to the end, its consequences, not the first's)
    assert newer[newer.finding == "dead_units"].last_step.tolist() == [50, 50]


def test_two_troubles_of_one_cause_at_one_site_each_fold_their_own_consequences(thrown_out_twice):
    # both groups' cause reads "update_ratio_high at layers.0.weight"; the lists folded every consequence under the
    # newer row, the older one claiming its own that were not there, until 2026-11-29
    f = thrown_out_twice
    shown = view.merge_calls(f)
    assert shown[["step", "site", "finding"]].values.tolist() == [[30, "layers.0.weight", "update_ratio_high"],
                                                                  [1, "layers.0.weight", "update_ratio_high"]]
    newer = f[(f.cause != "") & (f.step >= 30)]
    older = f[(f.cause != "") & (f.step < 30)]
    assert shown.folded.tolist() == [len(newer), len(older)] == f[f.consequences > 0].consequences.tolist()
    for row, own in zip(shown.itertuples(), (newer, older)):
        assert f"{len(own)} findings began at step {row.step} or later, its consequences: " in row.evidence
        for r in own.itertuples():
            steps = f"{r.step}" if r.step == r.last_step else f"{r.step}–{r.last_step}"
            assert f"{r.finding} at {r.site}, step {steps}" in row.evidence
    # picking the older lists its own under it, the newer's stay folded
    listed = view.merge_calls(f, view.toggled((), shown.iloc[1]))
    assert listed.listed.tolist() == [False, True] + [False] * len(older)
    assert listed.step[2:].tolist() == older.step.tolist() and (listed.cause[2:] != "").all()


def test_a_root_with_no_blow_up_after_it_is_a_finding_of_its_own_and_a_later_trouble_still_grouped():
    # update ratios past 0.1 at steps 1-3 (a learning rate of 1.5) throw nothing out; at 10 over steps 40-42 they
    # spike the loss: the first candidate, a group without a blow-up, ended the grouping, the later trouble's
    # findings left as unrelated rows, until 2026-11-29
    f = mlp_on_halves(lambda step: 1.5 if step <= 3 else hot_at((40, 42))(step), steps=60, updates=True).diagnose()
    early = f[f.step <= 3]
    assert set(early.finding) == {"update_ratio_high"} and (early.cause == "").all() and \
        (early.consequences == 0).all()
    causes = f[f.consequences > 0]
    assert causes[["step", "finding"]].values.tolist() == [[40, "update_ratio_high"]]
    spike = f[f.finding == "loss_spike"]
    assert len(spike) == 1 and spike.cause.iloc[0] == f"update_ratio_high at {causes.site.iloc[0]}"


class Unrolled(nn.Module):
    """A ReLU cell applied 4 times a step (an unrolled network): ``act`` is called 5 times a step."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.inp, self.cell, self.out = nn.Linear(2, width), nn.Linear(width, width), nn.Linear(width, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2) -> (B, 2)
        h = self.act(self.inp(x))
        for _ in range(4):
            h = self.act(self.cell(h))
        return self.out(h)


def test_a_cause_counts_its_consequences_at_a_module_s_merged_calls_as_its_evidence_does():
    # SGD at 3 throws the unrolled net out from step 5; its ReLU dies at calls 1 and 3 over the same steps, one row in
    # the lists: the cause's row said "+10 consequences" where its evidence and its consequences column counted and
    # named 11, until 2026-11-30
    torch.manual_seed(0)
    model = Unrolled()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 2, generator=g)
    y = (x[:, 0] > 0).long()

    def batch(_step: int) -> tuple:
        i = torch.randint(512, (64,), generator=g)
        return x[i], y[i]

    f = fit_steps(model, torch.optim.SGD(model.parameters(), lr=3.0), batch, 30, updates=True).diagnose()
    count = int((f.cause != "").sum())
    assert f.consequences[0] == count and f"{count} findings began at step {f.step[0]} or later" in f.evidence[0]
    shown = view.merge_calls(f)
    assert len(shown) == 1 and shown.folded[0] == count and shown.evidence[0] == f.evidence[0]
    assert view.findings_table(shown).consequences[0].startswith(f"+{count} consequences over steps")
    assert f"and {count} consequences of it folded under its row" in view.findings_summary(shown)
    listed = view.merge_calls(f, view.toggled((), shown.iloc[0]))
    merged = listed[listed.calls.map(len) > 1]
    assert len(merged) >= 1 and (merged.cause != "").all()  # (the run holds consequences merged over calls)
    assert len(listed) - 1 < count == sum(len(c) for c in listed.calls[1:])  # (each call's finding counted once)


def test_a_blow_up_two_checks_tell_at_one_site_is_one_finding_with_the_evidence_of_both():
    # thrown out at steps 1-3 and again at 60-62 over 90 steps: exploding_activations through depth and over steps
    # both start at layers.2 over steps 65-90, listed as two rows of the same finding, site and steps until 2026-11-30
    f = mlp_on_halves(hot_at((1, 3), (60, 62)), steps=90, updates=True).diagnose()
    exploding = f[f.finding == "exploding_activations"]
    assert exploding[["site", "step", "last_step"]].values.tolist() == [["layers.2", 65, 90]]
    evidence = exploding.evidence.iloc[0]
    assert "the first site in forward order" in evidence and " Also: " in evidence
    assert "above the largest of the first recorded steps" in evidence
    # (no finding listed twice at a site over steps that overlap)
    for (_finding, _site), rows in f.groupby(["finding", "site"]):
        spans = sorted(zip(rows.step, rows.last_step))
        assert all(later[0] > earlier[1] + 1 for earlier, later in zip(spans, spans[1:])), rows
