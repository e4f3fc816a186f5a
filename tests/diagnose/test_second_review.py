"""What a second review of the diagnoses found open: a NaN loss grouped under a learning rate too hot for a few
steps that had ended long before, a forward pass read as exploding where a normalization layer rescales tiny inputs,
dead units counted past what the zeros of their site can hold, and a module that scales its own output read as a
forgotten zero_grad(). Each through a real training run and the public API."""

from __future__ import annotations

import itertools
import re

import torch
import torch.nn.functional as F
from torch import nn

import workbench
from tests.diagnose.runs import diverging_mlp, fit_steps, mlp_on_halves, one_step
from workbench.ui.findings import merge_calls


def test_a_nan_loss_long_after_a_hot_start_ended_is_not_grouped_under_it():
    # update ratios past 0.1 for the first 4 steps (a learning rate of 1, then 0.05), then at step 50 a log(0) in the
    # loss: the NaN was listed as a consequence of the update ratios of steps 1-4, and left out of the app's list,
    # until 2026-11-29
    step = itertools.count(1)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (called once a step)
        p = F.softmax(logits, 1)
        if next(step) >= 50:
            p = p * 0  # (a loss computation gone wrong: log(0))
        return F.nll_loss(torch.log(p), y)

    w = mlp_on_halves(lambda step: 1.0 if step <= 4 else 0.05, steps=60, loss_fn=loss_fn, updates=True)
    f = w.diagnose()
    hot = f[f.finding == "update_ratio_high"]
    assert len(hot) and hot.last_step.max() <= 4 and (hot.cause == "").all() and (hot.severity == "warning").all()
    nan = f[f.finding == "nan_origin"]
    assert nan.cause.tolist() == [""] and nan.step.tolist() == [50]
    assert f.finding[0] == "nan_origin"  # (the run's trouble leads, with its consequence, the NaN loss, under it)
    assert f[f.finding == "loss_not_finite"].cause.tolist() == [f"nan_origin at {nan.site.iloc[0]}"]
    assert {"nan_origin", "update_ratio_high"} <= set(merge_calls(f).finding)  # (both in the app's list)


def test_a_normalization_layer_after_inputs_of_a_small_scale_is_not_an_explosion():
    # inputs of scale 1e-3 (returns, a waveform) into a Linear without bias and a BatchNorm: the first site reads RMS
    # ~6e-4, the BatchNorm ~1, the logits ~5, 3.9 orders above the first site: exploding_activations until
    # 2026-11-29, at the BatchNorm, though nothing grows there but the scale the normalization sets
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64, bias=False), nn.BatchNorm1d(64), nn.ReLU(),
                          nn.Linear(64, 64, bias=False), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))
    g = torch.Generator().manual_seed(0)
    x = 1e-3 * torch.randn(256, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with workbench.watch(model) as w:
        for _ in range(40):
            loss = F.cross_entropy(model(x), y)
            one_step(w, opt, loss)
    rows = w.to_pandas()
    rms = rows[(rows.kind == "activation") & (rows.step == 40)].set_index("module").eval("norm / numel ** 0.5")
    assert rms["0"] < 1e-3 and rms["6"] / rms["0"] > 1e3  # (3 orders above the first site)
    assert "exploding_activations" not in set(w.diagnose().finding)


def test_dead_units_count_no_more_units_than_the_zeros_of_the_site_can_hold():
    # a ReLU MLP 3 deep and 16 wide at a learning rate of 0.1 on batches of 8: its last ReLU dies (all 0), and no
    # gradient reaches the layers before it, whose bias gradients are then 0 at every entry: "81.2% of its outputs are
    # exactly 0 ...; all 16 of its units output 0 for every input; max 2.65" until 2026-11-29 (a unit dead for the
    # batch is all zeros: 16 dead units are 100% zeros)
    exp = workbench.experiments.create("activation_mlp", seed=0, activation="relu", depth=3, width=16, lr=0.1,
                                       batch_size=8)
    with exp.watch() as w:
        exp.run(400, progress=False)
    dead = w.diagnose().query("finding == 'dead_units'").set_index("site").evidence
    assert set(dead.index) == {"layers.1", "layers.3", "layers.5"}
    for site, evidence in dead.items():
        share = float(re.match(r"([\d.]+)% of its outputs are exactly 0", evidence).group(1)) / 100
        counted = re.search(r"; (all (\d+)|(\d+) of its (\d+)) units", evidence)
        if counted:  # (a count of the units dead for every input: their outputs are among the zeros)
            units = int(counted.group(2) or counted.group(3))
            assert units / 16 <= share + 1e-9, (site, evidence)
    assert dead["layers.5"].startswith("100.0% of its outputs are exactly 0") and "all 16 of its units" in \
        dead["layers.5"]
    assert "no gradient reaches them" in dead["layers.3"]


class ScaledLinear(nn.Linear):
    """A Linear that scales its own output by 8 (an output multiplier): its bias's gradient is 8x the sum of the
    output gradient over the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 8.0 * F.linear(x, self.weight, self.bias)


def scaled_head_run(zero_grad: bool) -> workbench.Watch:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), ScaledLinear(64, 2))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    with workbench.watch(model) as w:
        for _ in range(60):
            loss = F.cross_entropy(model(x), y)
            if zero_grad:
                opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss.item())
    return w


def test_a_module_that_scales_its_own_output_is_no_forgotten_zero_grad():
    # its bias's gradient is over sqrt(m) ||grad_output|| by its factor from the first step, and does not grow: a
    # gradients_accumulate error until 2026-11-29 ("it was 4.47 at step 1 (0.2x since)": it shrank)
    w = scaled_head_run(zero_grad=True)
    rows = w.to_pandas()
    bias = rows[(rows.kind == "param_grad") & (rows.module == "2") & (rows.tensor == "bias")].set_index("step").norm
    out = rows[(rows.kind == "grad_output") & (rows.module == "2")].set_index("step").norm
    assert (bias > 16 * out).iloc[:3].all()  # (over sqrt(256) ||grad_output||, the bound, at its first steps)
    assert "gradients_accumulate" not in set(w.diagnose().finding)
    # the same model without zero_grad(): its gradients summed over the steps grow past twice that share
    f = scaled_head_run(zero_grad=False).diagnose()
    found = f[f.finding == "gradients_accumulate"]
    assert found.site.tolist() == ["2.bias"] and "its first recorded, it was already" in found.evidence.iloc[0]


def test_a_list_that_folds_the_consequences_names_every_one_of_them_with_its_steps():
    # SGD at a learning rate of 10: 13 consequences under the update ratios of step 1; the app's and the notebook's
    # lists show that row alone, whose evidence named six and "7 more", said to be "listed after this one" (they are
    # not, there): exploding_activations, vanishing_gradients ... were nowhere in the list until 2026-11-29
    f = diverging_mlp().diagnose()
    consequences = f[f.cause != ""]
    assert len(consequences) > 6
    shown = merge_calls(f)
    assert len(shown) == len(f) - len(consequences)
    evidence = shown.evidence[0]
    for r in consequences.itertuples():
        steps = f"{r.step}" if r.step == r.last_step else f"{r.step}–{r.last_step}"
        assert f"{r.finding} at {r.site}, step {steps}" in evidence
    assert f"{len(consequences)} findings began at step 1 or later" in evidence and "listed after" not in evidence


def test_a_cause_is_told_by_its_consequences_column_and_its_evidence_written_once():
    # the lists took a row for a cause where its evidence held "The run went wrong from here:" and rebuilt that
    # evidence by splitting it there, until 2026-11-29: a cause whose evidence read otherwise (edited, or said in
    # other words) had its consequences spilled into the list as findings of their own
    from workbench.ui import findings as view

    f = diverging_mlp().diagnose()
    count = int((f.cause != "").sum())
    assert f.consequences.tolist() == [count] + [0] * count  # (the cause counts them; the rest are none's cause)
    # diagnose() writes the evidence the lists show, naming every consequence with its steps
    for r in f[f.cause != ""].itertuples():
        steps = f"{r.step}" if r.step == r.last_step else f"{r.step}–{r.last_step}"
        assert f"{r.finding} at {r.site}, step {steps}" in f.evidence[0]
    assert merge_calls(f).evidence[0] == f.evidence[0]
    # the lists read the column, not the words: an evidence said otherwise folds all the same, shown as it is
    edited = f.assign(evidence=["the update ratios blew up", *f.evidence[1:]])
    shown = merge_calls(edited)
    assert len(shown) == 1 and shown.folded[0] == count and shown.evidence[0] == "the update ratios blew up"
    # and a row that names no consequences is no cause, whatever its evidence says
    assert len(merge_calls(f.assign(consequences=0))) == len(f)
    assert view.findings_summary(merge_calls(f.assign(consequences=0))).count("consequence") == 0


def test_a_causes_row_says_the_steps_its_consequences_span_not_its_own_alone():
    # the update ratios of steps 1-4 threw the run out: its ReLUs dead to step 40, its gradients vanished from 30 to
    # 40; the cause's row said "step 1–4 · +13 consequences", the trouble's end nowhere on it, until 2026-11-29
    from workbench.ui import findings as view

    f = diverging_mlp().diagnose()
    count, last = int((f.cause != "").sum()), int(f.last_step.max())
    assert (f.step[0], f.last_step[0], last) == (1, 4, 40)
    shown = merge_calls(f)
    assert shown.trouble_steps[0] == "1–40"
    assert view.findings_table(shown).steps[0] == "1–4"  # (the finding's own steps, as its focus shades them)
    assert view.findings_table(shown).consequences[0] == f"+{count} consequences over steps 1–40 (pick to list)"
    assert view.option_label(shown.iloc[0]).endswith(f"step 1–4 · +{count} consequences over steps 1–40")
    listed = merge_calls(f, view.toggled((), shown.iloc[0]))
    assert view.findings_table(listed).consequences[0] == f"{count} consequences over steps 1–40 below (pick to fold)"
    assert (listed.trouble_steps[1:] == "").all()


def test_a_causes_consequences_are_counted_listed_under_it_when_it_is_picked_and_each_focuses_the_views(tmp_path):
    # SGD at a learning rate of 10: the list held the cause's row alone, "1 warning"; its 13 consequences could be
    # read in its evidence only, not picked or focused, in the app or the notebook, until 2026-11-29
    from workbench.ui import findings as view
    from workbench.ui import run_page, stored_runs
    from workbench.ui.notebook import Dashboard
    from workbench.ui.runs import RunsRoot

    f = diverging_mlp(store=tmp_path / "runs" / "hot").diagnose()
    folded = int((f.cause != "").sum())
    shown = merge_calls(f)
    assert len(shown) == 1 and shown.folded[0] == folded
    assert f"⚠ 1 warning, and {folded} consequences of it folded under its row (pick it to list them)" in \
        view.findings_summary(shown)
    assert view.findings_table(shown).consequences[0] == f"+{folded} consequences over steps 1–40 (pick to list)"
    listed = merge_calls(f, view.toggled((), shown.iloc[0]))
    assert len(listed) == len(f) and listed.cause[1:].tolist() == f.cause[1:].tolist()
    assert view.findings_table(listed).consequences[1].startswith("↳ consequence of update_ratio_high at ")
    assert f"and {folded} consequences of it listed under its row" in view.findings_summary(listed)
    assert view.toggled(view.toggled((), shown.iloc[0]), listed.iloc[0]) == ()  # (picked again: folded again)
    assert view.toggled((), listed.iloc[5]) == ()  # (a consequence lists nothing)

    # the notebook: picking the cause lists them, a consequence focuses the views as any finding
    dash = Dashboard(workbench.load_run(tmp_path / "runs" / "hot"))
    assert len(dash.findings_list.options) == 1 and f"+{folded} consequences" in dash.findings_list.options[0]
    dash.focus_finding(0)
    assert len(dash.findings_list.options) == 1 + folded and dash.findings_list.options[1].startswith("↳ ")
    dead = next(i for i, o in enumerate(dash.findings_list.options) if "dead_units at layers.1," in o)
    target = dash.focus_finding(dead)
    assert (target.kind, target.site, dash.statistic.value) == ("activation", "layers.1", "zero_frac")
    assert len(dash.findings_list.options) == 1 + folded  # (still listed)
    dash.focus_finding(0)
    assert len(dash.findings_list.options) == 1

    # the app's Runs tab: a click on the cause lists them (the list sent with the focus), another on one focuses it
    cache = stored_runs.ViewCache(RunsRoot(tmp_path / "runs"))
    note, table = view.stored_findings(cache, "hot")
    assert len(table) == 1 and f"{folded} consequences of it folded" in note

    def find(pick):
        replayed, _run, _message = cache.get(pick)
        return replayed, "header", None

    def click(state, index):
        event = type("Event", (), {"index": (index, 0)})()
        values = [None, 0.0, False, "grad_output", "norm", None, False, None, "grad_output", "norm", True]
        return view.stored_select_handler(cache, find)("hot", state, *values, event)

    state, *updates, note, statistic, shown_list = click(None, 0)
    assert len(shown_list.value["data"]) == 1 + folded and state["findings_listed"]
    assert "listed under its row" in note
    assert len(view.stored_findings(cache, "hot", state["findings_listed"])[1]) == 1 + folded  # (the next redraw)
    state, *updates, note, statistic, _list = click(state, dead)
    out = dict(zip(run_page.VIEW_OUTPUTS, updates))
    assert statistic == "zero_frac" and out["sites"].value == ["layers.1"] and "**dead_units** at `layers.1`" in note


def test_an_optimizer_built_on_a_copy_of_the_model_is_found_as_gradients_that_accumulate():
    # the model's .grad is never zeroed (zero_grad() zeroes the copy's) and its biases never change: summed over every
    # step since the run's first, as micro-batches accumulated on purpose before their optimizer step are, the bound
    # grew with the gradient and only not_updated was found, from 2026-11-29 until the same day's review; now from
    # the 33rd step (MAX_ACCUMULATED_STEPS), as the docs' table says
    import copy

    torch.manual_seed(0)
    model = workbench.create_model("mlp", in_features=2, num_classes=2, width=32, depth=2, activation="relu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 2, generator=g)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.01)

    def batch(_step):
        i = torch.randint(1024, (64,), generator=g)
        return x[i], y[i]

    f = fit_steps(model, opt, batch, 60).diagnose()
    assert "not_updated" in set(f.finding)
    found = f[f.finding == "gradients_accumulate"]
    assert len(found) and found.site.iloc[0].endswith(".bias") and found.severity.iloc[0] == "error"
