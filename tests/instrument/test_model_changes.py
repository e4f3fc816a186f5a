"""A model that changes under its watch (parameters replaced, modules swapped, parameters
unfrozen), a lazy model, a watch let go of with a store, and training loops that misuse the watch
(no w.step(), an evaluation forward left unpaused): through the public API."""

import gc
import sys
import warnings

import pytest
import torch
from torch import nn

import workbench
from workbench.instrument import hooks
from workbench.instrument.hooks import MAX_BACKWARDS_PER_STEP


def net3(out=1):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, out))


def train_step(net, w, x=None, **metrics):
    x = torch.randn(16, 4) if x is None else x
    net(x).sum().backward()
    net.zero_grad()
    return w.step(**metrics)


def rows_of(w, module, kind, tensor=None):
    d = w.to_pandas()
    d = d[(d.module == module) & (d.kind == kind)]
    return d if tensor is None else d[d.tensor == tensor]


def test_a_checkpoint_loaded_with_assign_is_recorded_from_then_on_with_a_warning():
    net = net3()
    ckpt = {k: torch.full_like(v, 0.5) for k, v in net.state_dict().items()}
    with pytest.warns(RuntimeWarning, match=r"replaced.*2\.weight"):
        with workbench.watch(net) as w:
            train_step(net, w)
            net.load_state_dict(ckpt, assign=True)  # new Parameter objects
            train_step(net, w)
            train_step(net, w)
    params = rows_of(w, "2", "param", "weight").set_index("step")["mean"]
    assert params[2] == params[3] == 0.5  # read from the step of the change
    assert rows_of(w, "2", "param_grad", "weight").step.tolist() == [1, 3]  # hooked from the next
    assert not w.errors


def test_a_new_parameter_and_a_swapped_module_are_recorded():
    net = net3()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(net) as w:
            train_step(net, w)
            net[2] = nn.Linear(8, 3)  # a new head
            train_step(net, w)
            net[0].weight = nn.Parameter(torch.zeros(8, 4))
            train_step(net, w)
    said = [str(c.message) for c in caught if "replaced" in str(c.message)]
    assert len(said) == 1 and "module '2'" in said[0]  # once per watch
    assert rows_of(w, "2", "param", "weight")["shape"].tolist() == ["(1, 8)", "(3, 8)", "(3, 8)"]
    assert rows_of(w, "2", "activation").set_index("step")["shape"].to_dict() == {1: "(16, 1)", 3: "(16, 3)"}
    assert rows_of(w, "2", "param_grad", "weight").step.tolist() == [1, 3]
    zeros = rows_of(w, "0", "param", "weight").set_index("step")["abs_mean"]
    assert zeros[3] == 0 and zeros[2] > 0
    assert rows_of(w, "0", "param_grad", "weight").step.tolist() == [1, 2]  # (its new one: from step 4)


def test_a_module_appended_is_recorded_from_its_first_forward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    with pytest.warns(RuntimeWarning, match="module '2'"):
        with workbench.watch(net) as w:
            train_step(net, w)
            net.append(nn.Linear(8, 1))
            train_step(net, w)
            train_step(net, w)
    for kind in ("activation", "grad_output", "param_grad"):
        assert sorted(set(rows_of(w, "2", kind).step)) == [3], kind
    assert sorted(set(rows_of(w, "2", "param").step)) == [2, 3]


def test_parameters_unfrozen_mid_run_get_gradient_rows_from_that_step_without_a_warning():
    net = net3()
    net[0].requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    true = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unfreezing is the usual fine-tuning: nothing to warn of
        with workbench.watch(net) as w:
            for step in range(1, 6):
                if step == 3:
                    net[0].requires_grad_(True)
                nn.functional.mse_loss(net(x), y).backward()
                if net[0].weight.grad is not None:
                    true[step] = net[0].weight.grad.norm().item()
                opt.step(); opt.zero_grad(); w.step()
    recorded = rows_of(w, "0", "param_grad", "weight").set_index("step")["norm"].to_dict()
    assert recorded == pytest.approx(true) and sorted(recorded) == [3, 4, 5]


def test_parameters_swapped_in_during_the_forward_are_not_taken_for_the_models():
    net = net3()
    params = {k: v.detach().clone().requires_grad_() for k, v in net.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workbench.watch(net) as w:
            for _ in range(2):
                torch.func.functional_call(net, params, (torch.randn(4, 4),)).sum().backward()
                w.step()
    assert not w.errors and set(rows_of(w, "2", "param").step) == {1, 2}


def test_refreezing_takes_the_gradient_hook_out():
    net = net3()
    with workbench.watch(net) as w:
        train_step(net, w)
        net[2].requires_grad_(False)
        train_step(net, w)
    assert rows_of(w, "2", "param_grad", "weight").step.tolist() == [1]
    assert not w.errors


def test_a_lazy_model_is_refused_before_anything_is_installed():
    net = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 1))
    before = len(torch.nn.modules.module._global_forward_hooks)
    with pytest.raises(ValueError, match=r"lazy module\(s\) 0 .*run one forward pass first"):
        workbench.watch(net)
    assert len(torch.nn.modules.module._global_forward_hooks) == before
    net(torch.randn(2, 4))  # materialized: watched as any model
    with workbench.watch(net) as w:
        train_step(net, w)
    assert len(rows_of(w, "0", "param")) == 2


def test_a_watch_with_a_store_let_go_of_takes_its_hooks_out_and_closes_the_run_stopped(tmp_path):
    net = net3()
    before = len(torch.nn.modules.module._global_forward_hooks)

    def train_a_bit():
        w = workbench.watch(net, store=tmp_path / "run")  # no close()
        for _ in range(3):
            train_step(net, w, loss=1.0)

    train_a_bit()
    gc.collect()
    assert len(torch.nn.modules.module._global_forward_hooks) == before
    run = workbench.load_run(tmp_path / "run")
    assert run.status == "stopped"
    assert run.metrics().step.tolist() == [1, 2, 3]  # every step written first


def test_a_loop_that_never_steps_is_warned_of_once_and_stops_growing():
    net = net3()
    x = torch.randn(16, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(net) as w:
            for _ in range(MAX_BACKWARDS_PER_STEP + 50):
                net(x).sum().backward()
                net.zero_grad()
            w.step()
    said = [str(c.message) for c in caught if "w.step()" in str(c.message)]
    assert len(said) == 1 and "1000 backward passes within step 1" in said[0]
    assert [e["kind"] for e in w.errors] == ["step"]
    calls = rows_of(w, "0", "activation").call  # bounded: the first 1,000 calls, nothing after
    assert calls.tolist() == list(range(MAX_BACKWARDS_PER_STEP))
    assert rows_of(w, "0", "param_grad").shape[0] == 2  # the gradient accumulated over the 1,000


def test_an_evaluation_loop_that_never_steps_stops_growing_at_the_row_limit(monkeypatch):
    monkeypatch.setattr(hooks, "MAX_ROWS_PER_STEP", 400)  # (200,000 rows take a while to make)
    net = net3()  # 4 call sites: 4 activation rows a forward under no_grad
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(net) as w, torch.no_grad():
            for _ in range(150):
                net(torch.randn(2, 4))
            w.step()
    said = [str(c.message) for c in caught if "w.step()" in str(c.message)]
    assert len(said) == 1 and "400 rows" in said[0] and "within step 1" in said[0] and "w.paused()" in said[0]
    frame = w.to_pandas()
    assert len(frame[frame.kind == "activation"]) == 400 and frame.call.max() == 99


def test_a_site_called_often_in_a_step_that_ends_is_not_warned_of():
    cell = nn.RNNCell(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workbench.watch(cell) as w:
            for _ in range(3):
                h = torch.zeros(2, 4)
                for _ in range(2000):  # (more calls than backward passes could ever be)
                    h = cell(torch.randn(2, 4), h)
                h.sum().backward()
                w.step()
    frame = w.to_pandas()
    assert not w.errors and frame.call.max() == 1999
    assert len(frame[frame.kind == "grad_output"]) == 3 * 2000


def test_an_unpaused_evaluation_forward_is_warned_of_once_and_paused_one_is_not():
    net = net3()
    x, x_val = torch.randn(32, 4), torch.randn(100, 4)

    def run(pause):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with workbench.watch(net) as w:
                for _ in range(3):
                    train_step(net, w, x)
                    with (w.paused() if pause else torch.no_grad()), torch.no_grad():
                        net.eval(); net(x_val); net.train()
        return w, [str(c.message) for c in caught if "paused" in str(c.message)]

    w, said = run(pause=False)
    assert len(said) == 1 and "Sequential" in said[0] and "with w.paused():" in said[0]
    assert rows_of(w, "0", "activation").call.max() == 1  # (what it warns of)
    w, said = run(pause=True)
    assert not said and rows_of(w, "0", "activation").call.max() == 0


def test_a_no_grad_forward_inside_a_training_step_after_its_training_forward_is_not_warned_of():
    net = net3()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with workbench.watch(net) as w:
            for _ in range(3):
                net(torch.randn(8, 4)).sum().backward()
                with torch.no_grad():
                    net(torch.randn(8, 4))  # a target computed with the same network
                w.step()
    assert rows_of(w, "0", "activation").call.max() == 1


def test_the_watchs_warnings_point_at_the_users_line_that_made_the_step():
    net = net3()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with workbench.watch(net) as w:
            train_step(net, w)
            net[2] = nn.Linear(8, 1)
            net(torch.randn(16, 4)).sum().backward()
            w.step(); line = sys._getframe().f_lineno  # noqa: E702 (the line that ends the step warns)
    [said] = [c for c in caught if "replaced" in str(c.message)]
    assert (said.filename, said.lineno) == (__file__, line)  # not a line of workbench's hooks
