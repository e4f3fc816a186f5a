"""Interventions that fail: what the log and the warning tell the user."""

import inspect
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import workbench


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)  # returns (output, weights or None)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.attn(x, x, x, need_weights=False)[0])


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(x), x.sum(-1)  # (B, 4) and (B,): unit 5 fits neither


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = TwoOutputs()

    def forward(self, x):
        out, total = self.head(x)
        return out.sum() + total.sum()


def test_a_failed_patch_is_logged_as_failed_at_its_step_never_with_an_inverted_range():
    model = Attention()
    w = workbench.watch(model)
    for _ in range(2):
        model(torch.randn(2, 3, 8)).sum().backward()
        w.step()
    w.patch("attn", lambda out: out * 0.0)
    with pytest.warns(RuntimeWarning, match="failed and was removed at step 3"):
        model(torch.randn(2, 3, 8))
    w.step()
    row = w.intervention_log().iloc[0]
    assert (row["from step"], row["to step"]) == (3, 3)
    assert row.status.startswith("failed at step 3: TypeError: can't multiply sequence")
    w.close()


def test_an_ablation_that_fails_before_any_step_is_logged_as_failed_at_step_1():
    model = Model()
    w = workbench.watch(model)
    w.ablate("head", [5])
    with pytest.warns(RuntimeWarning, match="ablate.5.@dim1 at 'head' failed and was removed at step 1"):
        model(torch.randn(2, 8))
    w.step()
    log = w.intervention_log()
    assert log[["from step", "to step"]].values.tolist() == [[1, 1]]
    assert log.status[0].startswith("failed at step 1: ValueError: ablate('head'): units [5] are out of range")
    assert all(int(r["to step"]) >= int(r["from step"]) for _, r in log.iterrows())
    w.close()


def test_the_log_says_which_interventions_are_on_removed_or_ended():
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    w = workbench.watch(model)
    kept = w.ablate("0", [0])
    removed = w.patch("2", lambda y: 0.5 * y)
    model(torch.randn(3, 4)).sum().backward()
    w.step()
    removed.remove()
    assert w.intervention_log().status.tolist() == ["on", "removed"]
    w.close()
    assert w.intervention_log().status.tolist() == ["ended with the watch", "removed"]
    assert kept.end_step == 1


def test_an_ablation_removed_after_the_forward_that_it_zeroed_is_logged_for_that_step(tmp_path):
    # (it read "removed before step 2 (never applied)", to step 1, and the stored run had no marker of it,
    # though its zeros were in step 2's rows)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model, store=tmp_path / "run")
    for step in range(1, 4):
        ablation = w.ablate("0", [0, 1]) if step == 2 else None
        out = model(torch.randn(16, 4))
        late = w.patch("2", lambda y: 2 * y, label="after the forward") if step == 2 else None
        if ablation is not None:
            ablation.remove()
            late.remove()  # (made after the step's forward, removed before the next: never on)
        out.sum().backward()
        w.step()
    w.close()
    log = w.intervention_log()
    assert log[["from step", "to step", "status"]].values.tolist() == [
        [2, 2, "removed"], [3, 2, "removed before step 3 (never applied)"]]
    stored = workbench.load_run(tmp_path / "run")
    assert stored.interventions()[["id", "from step", "to step"]].values.tolist() == [["i1", 2, 2]]
    rows = stored.to_pandas()
    zeros = rows[(rows.module == "0") & (rows.kind == "activation")].set_index("step").zero_frac
    assert zeros[2] >= 2 / 8 and zeros[3] < 2 / 8


def test_the_step_an_intervention_ends_with_follows_the_model_calls_it_was_on_in():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model)
    model(torch.randn(2, 4))
    later = w.patch("2", lambda y: y, label="made after step 1's forward")  # (on from step 2)
    retried = w.ablate("0", [0], label="removed in a discarded step")
    w.step()
    for _ in range(2):  # (step 2, its first attempt discarded after the forward that ablated)
        model(torch.randn(2, 4))
        if retried.end_step is None:
            retried.remove()
            w.discard_step()
    w.step()
    model(torch.randn(2, 4))
    later.remove()  # (after step 3's forward, which it patched)
    w.step()
    log = w.intervention_log().set_index("intervention")
    assert log.loc["made after step 1's forward", ["from step", "to step"]].tolist() == [2, 3]
    # (made after step 1's calls, it was on only in step 2's discarded ones: it never acted)
    assert log.loc["removed in a discarded step", ["from step", "to step", "status"]].tolist() == [
        2, 1, "removed before step 2 (never applied)"]
    w.close()


def test_an_intervention_made_after_a_steps_forward_is_from_the_step_it_first_acts_on(tmp_path):
    # (made after step 2's forward and backward, it read "from step 2", and the stored run had its marker at
    # step 2, though step 2 ran without it: it first zeroed step 3's rows)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model, store=tmp_path / "run")
    made = {}
    for step in range(1, 5):
        model(torch.randn(16, 4)).sum().backward()
        if step == 2:
            made["again"] = w.ablate("0", [0, 1], label="before a second forward of step 2")
            model(torch.randn(16, 4))  # (the model called again in step 2: that one acted on it)
            made["late"] = w.ablate("2", [0], label="after step 2's forwards")
            made["never"] = w.patch("2", lambda y: 2 * y, label="removed before it acted")
            made["never"].remove()
        w.step()
    w.close()
    log = w.intervention_log()[["intervention", "from step", "to step", "status"]]
    assert log.values.tolist() == [["before a second forward of step 2", 2, 4, "ended with the watch"],
                                   ["after step 2's forwards", 3, 4, "ended with the watch"],
                                   ["removed before it acted", 3, 2, "removed before step 3 (never applied)"]]
    assert made["again"].start_step == 2 and made["late"].start_step == 3
    stored = workbench.load_run(tmp_path / "run")
    assert stored.interventions()[["intervention", "from step", "to step"]].values.tolist() == [
        ["before a second forward of step 2", 2, 4], ["after step 2's forwards", 3, 4]]
    rows = stored.to_pandas().set_index(["module", "kind", "step", "call"]).sort_index()
    zeros = rows.zero_frac
    assert zeros["0", "activation", 2, 0] < 2 / 8 <= zeros["0", "activation", 2, 1]  # (its second forward's)
    assert (zeros["2", "activation", 2] < 1 / 2).all() and zeros["2", "activation", 3, 0] >= 1 / 2


def test_one_made_after_the_last_steps_forward_never_acted_and_one_that_fails_later_in_its_step_is_from_it():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model)
    model(torch.randn(2, 4))

    def fails(out):
        raise RuntimeError("no good")

    w.patch("0", fails)  # (made after the forward; fails in the next call)
    with pytest.warns(RuntimeWarning, match="failed and was removed at step 1"):
        model(torch.randn(2, 4))
    w.step()
    model(torch.randn(2, 4))
    w.ablate("2", [0], label="made after the last forward")
    w.step()
    w.close()
    log = w.intervention_log()[["from step", "to step", "status"]].values.tolist()
    assert log[0] == [1, 1, "failed at step 1: RuntimeError: no good"]
    assert log[1] == [3, 2, "ended with the watch before step 3 (never applied)"]


def test_one_made_in_a_forward_hook_acts_from_this_step_only_where_its_site_runs_after_it(tmp_path):
    # (the step's calls of any module counted: one made in the last layer's forward hook for the first layer,
    # which had run, read "from step 2", as the model's own call ended after it, and its marker was stored at
    # step 2, which it never touched)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model, store=tmp_path / "run")
    made = {}

    def make_them(module, inputs, output):
        if "ran" not in made:
            made["ran"] = w.ablate("0", [0, 1], label="for a layer that ran")
            made["its call"] = w.ablate("2", [0], call=0, label="for its own call, which ran")

    def make_one(module, inputs, output):
        if "to run" not in made:
            made["to run"] = w.ablate("2", [0], label="for a layer yet to run")

    for step in range(1, 4):
        hooks = ([model[2].register_forward_hook(make_them), model[0].register_forward_hook(make_one)]
                 if step == 2 else [])
        model(torch.randn(16, 4)).sum().backward()
        for hook in hooks:
            hook.remove()
        w.step()
    w.close()
    assert [made[key].start_step for key in ("ran", "its call", "to run")] == [3, 3, 2]
    stored = workbench.load_run(tmp_path / "run")
    assert stored.interventions()[["intervention", "from step"]].values.tolist() == [
        ["for a layer yet to run", 2], ["for a layer that ran", 3], ["for its own call, which ran", 3]]
    zeros = stored.to_pandas().set_index(["module", "kind", "step", "call"]).zero_frac
    assert zeros["0", "activation", 2, 0] < 2 / 8 <= zeros["0", "activation", 3, 0]


def test_one_made_after_a_forward_then_recorded_by_record_next_is_from_the_step_it_zeroed():
    # (record_next counts the step's calls from 0 again: one made after the step's first forward, the counts then
    # lower than when it was made, read "from step 3" though it zeroed step 2's recorded forward)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model, every=2)
    w.patch("1", lambda y: y, label="in place: the hooks are in at step 2")
    model(torch.randn(16, 4)).sum().backward()
    w.step()
    model(torch.randn(16, 4))  # (step 2, not recorded)
    late = w.ablate("0", [0, 1], label="made after step 2's first forward")
    w.record_next()
    model(torch.randn(16, 4)).sum().backward()
    w.step()
    w.close()
    assert late.start_step == 2
    rows = w.to_pandas()
    assert rows[(rows.step == 2) & (rows.module == "0") & (rows.kind == "activation")].zero_frac.iloc[0] >= 2 / 8


def test_one_made_in_a_step_not_recorded_is_from_the_first_step_whose_forward_ran_with_it(tmp_path):
    # (a step not recorded runs with the hooks out, so its calls went uncounted: one made after such a step's
    # forward read "from step 2", and the stored run had its marker at step 2, which ran without it)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    w = workbench.watch(model, every=2, store=tmp_path / "run")
    made, zeroed = {}, {}
    for step in range(1, 7):
        if step == 4:  # (between two steps, before step 4's forward: on in it)
            made["before"] = w.ablate("2", [1], label="made before step 4's forward")
        out = model(torch.randn(16, 4))
        zeroed[step] = bool((out[:, 0] == 0).all())
        out.sum().backward()
        if step == 2:
            made["after"] = w.ablate("2", [0], label="made after step 2's forward")
        if step == 4:
            made["again"] = w.ablate("0", [0], label="made after a forward, before another of step 4")
            model(torch.randn(16, 4))
            made["late"] = w.ablate("0", [1], label="made after step 4's forwards")
        w.step()
    w.close()
    assert [zeroed[step] for step in range(1, 7)] == [False, False, True, True, True, True]
    log = w.intervention_log()[["intervention", "from step"]].values.tolist()
    assert log == [["made after step 2's forward", 3], ["made before step 4's forward", 4],
                   ["made after a forward, before another of step 4", 4], ["made after step 4's forwards", 5]]
    stored = workbench.load_run(tmp_path / "run")
    assert stored.interventions()[["intervention", "from step"]].values.tolist() == sorted(log, key=lambda r: r[1])


@pytest.mark.parametrize("every", [1, 2])
def test_a_patch_of_one_call_made_in_a_step_not_recorded_never_patches_another_call_nor_fails(every):
    # (a step not recorded runs with the hooks out, its calls uncounted: a patch of call 0 made after its first
    # micro-batch patched the second, call 1, and one of call 1 failed, "the step called '0' 1 time(s)")
    model = nn.Sequential(nn.Linear(4, 4))
    w = workbench.watch(model, every=every)
    zeroed = {0: [], 1: []}
    for step in range(1, 5):
        for micro in range(2):  # (two micro-batches a step: "0" is called twice in each, calls 0 and 1)
            out = model(torch.randn(2, 4))
            for unit, zeroed_at in zeroed.items():  # (patch "call k" zeroes unit k)
                if (out[:, unit] == 0).all():
                    zeroed_at.append((step, micro))
            if step == 2 and micro == 0:
                w.patch("0", lambda y: y * torch.tensor([0.0, 1, 1, 1]), call=0, label="zero unit 0 at call 0")
                w.patch("0", lambda y: y * torch.tensor([1.0, 0, 1, 1]), call=1, label="zero unit 1 at call 1")
        w.step()
    w.close()
    assert w.errors == []  # (no patch failed)
    # (every=1 counts every call: call 1 of step 2 is patched; every=2 cannot tell which call of step 2 is which)
    first = 2 if every == 1 else 3
    assert zeroed == {0: [(3, 0), (4, 0)], 1: [(step, 1) for step in range(first, 5)]}
    assert w.intervention_log()[["from step", "status"]].values.tolist() == [[3, "ended with the watch"],
                                                                               [first, "ended with the watch"]]


def test_a_patch_of_a_tuple_output_warns_at_the_users_line_and_describes_the_output():
    model = Attention()
    w = workbench.watch(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        w.patch("attn", lambda out: out * 0.0)
        model(torch.randn(2, 3, 8))
    [warning] = [c for c in caught if issubclass(c.category, RuntimeWarning)]
    assert warning.filename == __file__ and warning.lineno == line  # not workbench's hooks
    message = str(warning.message)
    assert "whole output, a tuple(Tensor(2, 3, 8), NoneType)" in message
    assert "lambda out: (out[0] * 0.0, *out[1:])" in message
    w.close()
    # the hint is right: patching the first element works
    w = workbench.watch(model)
    w.patch("attn", lambda out: (out[0] * 0.0, *out[1:]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(torch.randn(2, 3, 8))
    assert torch.allclose(out, model.head.bias.expand_as(out))
    w.close()


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.act = nn.GELU()

    def forward(self, x):  # (B, S, 16) -> (B, S, 32)
        return self.act(self.fc(x))


def test_ablate_without_dim_on_a_sequence_output_warns_once_naming_site_shape_and_dim():
    model = Sequence()
    x = torch.randn(4, 12, 16)
    w = workbench.watch(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        w.ablate("act", list(range(8)))  # meant: 8 hidden units; the default dim=1 is the sequence axis
        for _ in range(3):
            out = model(x)
            w.step()
    [warning] = [c for c in caught if issubclass(c.category, RuntimeWarning)]
    message = str(warning.message)
    assert "ablate('act', ...)" in message and "dim=1" in message and "(4, 12, 32)" in message
    assert "pass dim=-1" in message
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert (out[:, :8] == 0).all() and (out[:, 8:] != 0).any()  # the default is kept: positions
    w.close()
    w = workbench.watch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dim given: no warning, and features are zeroed
        w.ablate("act", list(range(8)), dim=-1)
        w.ablate("fc", [0], dim=1)
        out = model(x)
    assert (out[..., :8] == 0).all() and (out[..., 8:] != 0).any()
    w.close()
    w = workbench.watch(nn.Sequential(nn.Linear(4, 6)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a (B, F) output: dim 1 is features, nothing to warn of
        w.ablate("0", [0])
        w.model(torch.randn(3, 4))
    w.close()


def test_the_warning_of_ablate_without_dim_says_dim_1_is_a_convolutions_channels():
    # (it spoke of sequences alone: on a CNN it said to pass dim=-1, which zeroes a column of pixels)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1))
    w = workbench.watch(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.ablate("0", range(12))
        model(torch.randn(4, 1, 8, 8))
    w.close()
    [warning] = [c for c in caught if issubclass(c.category, RuntimeWarning)]
    assert "(4, 16, 8, 8): the channels of a (batch, channels, ...) output such as a convolution's" in str(
        warning.message)


def test_a_stored_run_keeps_the_failure_of_an_intervention(tmp_path):
    model = Attention()
    w = workbench.watch(model, store=tmp_path / "run")
    for step in range(1, 5):
        if step == 3:
            w.patch("attn", lambda out: out * 0.0)
            w.ablate("head", [0], dim=-1, label="zero unit 0")
            with pytest.warns(RuntimeWarning, match="failed and was removed at step 3"):
                model(torch.randn(2, 3, 8)).sum().backward()
        else:
            model(torch.randn(2, 3, 8)).sum().backward()
        w.step()
    w.close()
    stored = workbench.load_run(tmp_path / "run").interventions()
    assert stored[["id", "from step", "to step"]].values.tolist() == [["i1", 3, 3], ["i2", 3, 4]]
    assert stored.status[0].startswith("failed at step 3: TypeError: can't multiply sequence")
    assert stored.status[1] == "recorded"
    assert w.intervention_log()[["from step", "to step"]].values.tolist() == [[3, 3], [3, 4]]


def test_a_patch_that_returns_none_has_edited_the_output_in_place_which_stays_the_output():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no failure, no warning)
        with workbench.watch(model) as w:

            def zero_first_unit(out):
                out[:, 0] = 0.0  # in place, returns None: as a PyTorch forward hook may

            w.patch("0", zero_first_unit)
            y = model(x)
            y.sum().backward()
            w.step()
    hidden = model[0](x).detach()
    hidden[:, 0] = 0.0
    assert torch.equal(y.detach(), model[1](hidden).detach())  # the rest of the model saw the edited output
    assert not w.errors and w.intervention_log().status.tolist() == ["ended with the watch"]
    rows = w.to_pandas()
    first = rows[(rows.module == "0") & (rows.kind == "activation")]
    assert len(first) == 1 and first.zero_frac.iloc[0] == pytest.approx(5 / 20)  # recorded, as edited
    grads = rows[(rows.module == "0") & (rows.kind == "grad_output")]
    assert len(grads) == 1


def test_a_patch_that_returns_none_leaves_the_next_patch_the_edited_output():
    model = nn.Sequential(nn.Linear(3, 4))
    seen = []

    def zero(out):
        out.mul_(0.0)

    with workbench.watch(model) as w:
        w.patch("0", zero)
        w.patch("0", lambda out: seen.append(out) or out + 1.0)
        y = model(torch.randn(2, 3))
        w.step()
    assert not w.errors and w.intervention_log().status.tolist() == ["ended with the watch"] * 2
    assert len(seen) == 1 and isinstance(seen[0], torch.Tensor) and torch.equal(seen[0], torch.zeros(2, 4))
    assert torch.equal(y, torch.ones(2, 4))


@pytest.mark.parametrize("units", [np.int64(1), torch.tensor(1), [np.int64(0), np.int32(2)], np.array([0, 2]),
                                   torch.tensor([0, 2]), (torch.tensor(0), 2), range(0, 3, 2)],
                         ids=["np.int64", "0-d tensor", "list of numpy ints", "array", "tensor", "tuple of a 0-d "
                              "tensor and an int", "range"])
def test_ablate_takes_numpy_and_torch_integer_units_and_dim(units):
    model = nn.Sequential(nn.Linear(3, 4))
    with workbench.watch(model) as w:
        ablation = w.ablate("0", units, dim=np.int64(1))
        y = model(torch.randn(2, 3))
        w.step()
    want = [int(u) for u in (np.atleast_1d(np.asarray(units)) if not isinstance(units, (list, tuple, range))
                             else units)]
    assert ablation.label == f"ablate{want}@dim1"  # plain ints in the label, the log and the metrics
    assert (y[:, want] == 0).all() and (y[:, [u for u in range(4) if u not in want]] != 0).all()
    with workbench.watch(model) as w:
        w.ablate("0", 1, dim=torch.tensor(-1))
        assert (model(torch.randn(2, 3))[:, 1] == 0).all()


@pytest.mark.parametrize("units, says", [
    (np.float64(1.0), "got np.float64(1.0)"), (torch.tensor(1.0), "got tensor(1.)"),
    (np.array([0.0, 1.0]), "not integers: [0.0, 1.0]"), (torch.tensor([True, False]), "not integers: [True, False]"),
    ([np.bool_(True)], "not integers"), (np.array([[0, 1]]), "got array([[0, 1]])"),
    (torch.tensor([]), "got tensor([])"),
])
def test_ablate_refuses_units_that_are_not_integers_naming_them(units, says):
    model = nn.Sequential(nn.Linear(3, 4))
    with workbench.watch(model) as w:
        with pytest.raises(TypeError, match="units must be an int or a non-empty list of ints") as caught:
            w.ablate("0", units)
        assert says in str(caught.value)
        with pytest.raises(TypeError, match=r"dim must be an int.*got np.float64\(1.0\)"):
            w.ablate("0", 0, dim=np.float64(1.0))
        assert w.interventions == []


def test_ablate_refuses_numpy_units_out_of_range_of_the_recorded_output():
    model = nn.Sequential(nn.Linear(3, 4))
    with workbench.watch(model) as w:
        model(torch.randn(2, 3))
        w.step()
        with pytest.raises(ValueError, match=r"units \[4\] are out of range.*\[0, 3\]"):
            w.ablate("0", np.array([1, 4]))
        with pytest.raises(ValueError, match=r"dim=2 is out of range"):
            w.ablate("0", 0, dim=np.int64(2))
        # units count from the end as Python indexes: -1 is the last unit, and the message says they may
        with pytest.raises(ValueError, match=r"units \[-5\] are out of range.*\[0, 3\] \(or counted from the end, "
                                             r"as Python indexes, in \[-4, -1\]\)\."):
            w.ablate("0", [-5])
        w.ablate("0", [-1])
        out = model(torch.randn(2, 3))
        w.step()
    assert (out[:, 3] == 0).all() and (out[:, :3] != 0).all()


class Router(nn.Module):
    """Returns its scores and the index of the best (an integer tensor, of one dim fewer)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)

    def forward(self, x):
        scores = self.fc(x)
        return scores, scores.argmax(-1)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ablate_checks_its_units_against_the_floating_point_tensors_it_zeroes(compiled):
    # (after a recorded step, the integer index's shape (3,) had ablate refuse dim 1 of the scores)
    torch.manual_seed(0)
    model = nn.Sequential(Router())
    run = torch.compile(model, backend="aot_eager") if compiled else model
    x = torch.randn(3, 4)
    with workbench.watch(run) as w:
        run(x)
        w.step()
        with pytest.raises(ValueError, match=r"units \[8\] are out of range for dim 1 of its output of shape "
                                             r"\(3, 8\)"):
            w.ablate("0", [8])  # (the scores' shape, the tensor it zeroes, still decides)
        w.ablate("0", [2, 5])
        scores, best = run(x)
        w.step()
    assert not w.errors and (scores[:, [2, 5]] == 0).all() and (scores[:, [0, 1, 3, 4, 6, 7]] != 0).all()
    assert best.dtype == torch.int64
    assert isinstance(w, workbench.CompiledWatch) is compiled and getattr(w, "fallback", None) is None


def test_ablate_that_does_not_fit_one_of_several_tensors_names_them_and_how_to_patch_one():
    # (an attention module's (output, weights): dim=-1 units of the output's 16 features were refused
    # "for its output of shape (2, 5, 5); pass units in [0, 4]", the weights' shape, not the output's)
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)  # (output (2, 5, 16), weights (2, 5, 5))

    torch.manual_seed(0)
    model, x = SelfAttention(), torch.randn(2, 5, 16)
    with workbench.watch(model) as w:
        model(x)
        w.step()
        with pytest.raises(ValueError) as caught:
            w.ablate("attn", [10, 11], dim=-1)
        message = str(caught.value)
        assert "out.0 (2, 5, 16), out.1 (2, 5, 5)" in message and "do not fit out.1 of shape (2, 5, 5)" in message
        assert w.interventions == []
        fix = message[message.index("w.patch("):message.rindex(")") + 1]
        eval(fix, {"w": w, "torch": torch})  # the patch it suggests zeroes those features of the output alone
        out, weights = model(x)
        w.step()
    assert (out[..., [10, 11]] == 0).all() and (out[..., :10] != 0).all() and (weights != 0).all()
    assert not w.errors


def test_the_patch_ablate_suggests_zeroes_the_tensor_the_units_fit_or_it_says_how_in_words():
    # (the suggestion patched out[0] whatever the units fitted: here an IndexError, for a dict a KeyError)
    class TwoHeads(nn.Module):
        def __init__(self, as_dict=False):
            super().__init__()
            self.small, self.big, self.as_dict = nn.Linear(4, 4), nn.Linear(4, 16), as_dict

        def forward(self, x):
            small, big = self.small(x), self.big(x)
            return {"small": small, "big": big} if self.as_dict else (small, big)

    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = nn.Sequential(TwoHeads())
    with workbench.watch(model) as w:
        model(x)
        w.step()
        with pytest.raises(ValueError) as caught:
            w.ablate("0", [10], dim=1)
        message = str(caught.value)
        assert "do not fit out.0 of shape (3, 4)" in message and "for out.1 of a tuple:" in message
        eval(message[message.index("w.patch("):message.rindex(")") + 1], {"w": w, "torch": torch})
        small, big = model(x)
        w.step()
    assert (big[:, 10] == 0).all() and (big[:, :10] != 0).all() and (small != 0).all() and not w.errors
    model = nn.Sequential(TwoHeads(as_dict=True))
    with workbench.watch(model) as w:
        model(x)
        w.step()
        with pytest.raises(ValueError, match=r"do not fit out.small of shape \(3, 4\)\. To zero units of one "
                                             r"tensor alone, patch it: w.patch\(path, fn\)"):
            w.ablate("0", [10], dim=1)


def test_a_patch_of_one_call_made_after_a_paused_block_of_a_recorded_step_applies_in_that_step():
    # (a paused block's calls are never counted, in any step: one of a recorded step set the flag of a step whose
    # calls went uncounted, and a patch of call 0 made after it waited for the next step, "from step 3")
    model = nn.Sequential(nn.Linear(4, 4))
    w = workbench.watch(model)
    model(torch.randn(2, 4)).sum().backward()
    w.step()
    with w.paused():  # (step 2: an evaluation pass before the training forward)
        model(torch.randn(2, 4))
    w.patch("0", lambda y: y * torch.tensor([0.0, 1, 1, 1]), call=0, label="zero unit 0 at call 0")
    out = model(torch.randn(2, 4))
    w.step()
    w.close()
    assert (out[:, 0] == 0).all()
    assert w.intervention_log()[["from step", "status"]].values.tolist() == [[2, "ended with the watch"]]


def test_record_next_part_way_through_a_step_keeps_counting_its_calls_for_the_patches_in_place():
    # (record_next counted the step's calls from 0 again: a patch of call 0 applied to the step's first micro-batch
    # and again to its second, and one of call 1, its second micro-batch not yet run, failed "called '0' 1 time(s)")
    model = nn.Sequential(nn.Linear(4, 4))
    w = workbench.watch(model, every=2)
    w.patch("0", lambda y: y * torch.tensor([0.0, 1, 1, 1]), call=0, label="zero unit 0 at call 0")
    w.patch("0", lambda y: y * torch.tensor([1.0, 0, 1, 1]), call=1, label="zero unit 1 at call 1")
    zeroed = []
    for step in range(1, 3):  # (step 2 is not recorded but for record_next; the patches keep the hooks in)
        for micro in range(2):  # ("0" is called twice a step, calls 0 and 1)
            out = model(torch.randn(2, 4))
            zeroed.append([unit for unit in range(2) if (out[:, unit] == 0).all()])
            out.sum().backward()
            if step == 2 and micro == 0:
                w.record_next()
        w.step()
    w.close()
    assert w.errors == []
    assert zeroed == [[0], [1], [0], [1]]
    assert w.intervention_log()[["from step", "status"]].values.tolist() == [[1, "ended with the watch"]] * 2
    rows = w.to_pandas()
    assert rows[(rows.step == 2) & (rows.module == "0") & (rows.kind == "activation")].call.tolist() == [0]


class HeldTwice(nn.Module):
    """One caller holds one module under two names: its calls are named by the first, ``enc``."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.dec = self.enc

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def uncalled_patch_warnings(model, path, inputs, steps=3):
    """The warnings of a patch at ``path`` over ``steps`` steps, and its log."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(model) as w:
            w.patch(path, lambda out: out, label="identity")
            for _ in range(steps):
                model(inputs).sum().backward()
                w.step()
    said = [str(warning.message) for warning in caught if "applied to nothing" in str(warning.message)]
    return said, caught, w.intervention_log()


def test_a_patch_of_a_module_the_step_never_calls_is_warned_of_once_with_why():
    # (an attention's out_proj is used by weight, never called: such a patch stayed "on" and did nothing, unsaid)
    torch.manual_seed(0)
    said, caught, log = uncalled_patch_warnings(Attention(), "attn.out_proj", torch.randn(2, 5, 8))
    assert len(said) == 1
    assert "at 'attn.out_proj' applied to nothing at step 1" in said[0] and "out_proj" in said[0]
    assert "patch the module that uses it" in said[0]
    warned = next(w for w in caught if "applied to nothing" in str(w.message))
    assert warned.filename == __file__  # (at the line that made it)
    assert log.status.tolist() == ["ended with the watch"]


def test_a_patch_at_the_second_name_of_a_module_held_twice_names_the_path_its_calls_are_recorded_by():
    torch.manual_seed(0)
    said, _, _ = uncalled_patch_warnings(HeldTwice(), "dec", torch.randn(2, 4))
    assert len(said) == 1 and "its module is also at 'enc'" in said[0] and "patch 'enc'" in said[0]
    said, _, _ = uncalled_patch_warnings(HeldTwice(), "enc", torch.randn(2, 4))
    assert said == []


def test_a_patch_of_a_site_called_in_some_steps_only_is_warned_of_once_and_applies_when_it_is_called():
    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.main, self.extra = nn.Linear(4, 4), nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.extra(self.main(x)) if self.calls % 2 == 0 else self.main(x)

    model = Branch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(model) as w:
            w.ablate("extra", [0])
            outputs = []
            for _ in range(4):
                outputs.append(model(torch.randn(2, 4)))
                outputs[-1].sum().backward()
                w.step()
    said = [str(warning.message) for warning in caught if "applied to nothing" in str(warning.message)]
    assert len(said) == 1 and "at step 1" in said[0]
    # (the why it gave was the attention's alone: "a module whose parent uses its weights without calling it")
    assert "a branch of the forward that this step did not take" in said[0]
    assert (outputs[1][:, 0] == 0).all() and (outputs[3][:, 0] == 0).all()
