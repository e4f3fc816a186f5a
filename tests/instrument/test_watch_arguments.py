"""watch()'s arguments as a user gives them: flags that record nothing, metadata that is not JSON,
integers from numpy."""

import re
import warnings

import numpy as np
import pytest
import torch
from pandas.testing import assert_frame_equal
from torch import nn

import workbench


def test_a_watch_that_records_nothing_is_refused():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="activations=False, gradients=False, parameters=False, "
                                         "parameter_grads=False, updates=False"):
        workbench.watch(model, activations=False, gradients=False, parameters=False, parameter_grads=False)
    assert not model._forward_hooks  # nothing left attached
    with workbench.watch(model, activations=False, gradients=False, parameters=False, parameter_grads=False,
                         updates=True) as w:  # (one kind is enough)
        model(torch.randn(4, 3)).sum().backward()
        w.step()
    assert set(w.to_pandas().kind) == {"update"}


def test_metadata_that_is_not_json_is_stored_as_text_with_a_warning(tmp_path):
    model = nn.Linear(3, 2)
    with pytest.warns(UserWarning, match=r"metadata 'lr', 'opt': not a JSON value.*stores its str"):
        w = workbench.watch(model, store=tmp_path / "run",
                            metadata={"lr": torch.tensor(0.1), "name": "base", "opt": object(), "cfg": {"a": [1]}})
    w.close()
    meta = workbench.load_run(tmp_path / "run").metadata
    assert meta["lr"] == str(torch.tensor(0.1)) and meta["cfg"] == {"a": [1]} and meta["name"] == "base"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        workbench.watch(model, metadata={"lr": 0.1, "tags": ["a"], "n": None}).close()


@pytest.mark.parametrize("metadata, error, message", [
    ("baseline", TypeError, "metadata must be a dict of facts with str keys"),
    ({1: 2}, TypeError, "got a key 1"),
    ({"chance": "high"}, ValueError, r"metadata\['chance'\] is the chance level"),
])
def test_watch_compiled_checks_its_metadata_as_watch_does(tmp_path, metadata, error, message):
    # (watch_compiled took them unchecked: an AttributeError of a str, a run stored with a key 1 or a chance 'high')
    compiled = torch.compile(nn.Linear(2, 2))
    for watch in (workbench.watch_compiled, workbench.watch):
        with pytest.raises(error, match=message):
            watch(compiled, metadata=metadata, store=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_watch_compiled_refuses_to_record_nothing_as_watch_does():
    compiled = torch.compile(nn.Linear(2, 2))
    for watch in (workbench.watch_compiled, workbench.watch):
        with pytest.raises(ValueError, match="this watch would record nothing"):
            watch(compiled, activations=False, gradients=False, parameters=False, parameter_grads=False)


def test_metadata_that_is_not_json_is_warned_of_once_for_a_compiled_model(tmp_path):
    compiled = torch.compile(nn.Linear(2, 2))
    for watch in (workbench.watch_compiled, workbench.watch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            watch(compiled, metadata={"lr": np.float32(0.1)}, store=tmp_path / watch.__name__).close()
        assert [str(w.message)[:34] for w in caught if "JSON" in str(w.message)] == [
            "metadata 'lr': not a JSON value (a"]
        assert workbench.load_run(tmp_path / watch.__name__).metadata["lr"] == "0.1"


def test_an_in_memory_watch_warns_once_when_it_drops_its_oldest_steps():
    model = nn.Linear(3, 2)  # 5 rows a step: activation, grad_output, weight, bias (param and param_grad)
    with pytest.warns(RuntimeWarning, match=r"max_rows.*start at step \d+.*store=.*Recorder\(max_rows=") as caught:
        with workbench.watch(model, histograms=False, recorder=workbench.Recorder(max_rows=30)) as w:
            for _ in range(20):
                model(torch.randn(4, 3)).sum().backward()
                w.step(loss=1.0)
    said = [c for c in caught if "max_rows" in str(c.message)]
    assert len(said) == 1 and said[0].filename == __file__  # (it points at the w.step() that filled it)
    assert w.to_pandas().step.min() > 1 and w.metrics().step.min() > 1


def test_a_watch_with_a_store_that_drops_its_oldest_steps_points_to_the_store_that_keeps_them(tmp_path):
    model = nn.Linear(3, 2)
    with pytest.warns(RuntimeWarning, match="max_rows") as caught:
        with workbench.watch(model, histograms=False, recorder=workbench.Recorder(max_rows=30),
                             store=tmp_path / "run") as w:
            for _ in range(20):
                model(torch.randn(4, 3)).sum().backward()
                w.step(loss=1.0)
    said = [str(c.message) for c in caught if "max_rows" in str(c.message)]
    assert len(said) == 1 and f"workbench.load_run({str(tmp_path / 'run')!r}) reads them all" in said[0]
    assert "Pass store=" not in said[0]
    assert workbench.load_run(tmp_path / "run").steps == list(range(1, 21))  # (as it says: every step)


def test_integer_options_take_numpy_integers_and_store_plain_ints(tmp_path):
    model = nn.Linear(3, 2)
    every, bins, start_step = np.int64(2), np.int32(8), np.uint8(5)
    with workbench.watch(model, every=every, bins=bins, start_step=start_step, store=tmp_path / "run",
                         recorder=workbench.Recorder(max_rows=np.int64(1000))) as w:
        subscription = w.subscribe(lambda update: None, max_pending=np.int16(3))
        w.patch("", lambda out: out, call=np.int64(0))
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
            w.step()
        subscription.unsubscribe()
    assert sorted(set(w.to_pandas().step)) == [5, 7]
    assert {len(edges) for edges in w.histograms().edges} == {9}
    assert type(w.every) is int and type(w.options["bins"]) is int and type(w.recorder.max_rows) is int
    assert workbench.load_run(tmp_path / "run").metadata["every"] == 2  # (a numpy int is no JSON value)


@pytest.mark.parametrize("option, value", [("every", np.float64(2.0)), ("bins", np.bool_(True)),
                                           ("start_step", np.int64(-1)), ("every", torch.tensor(2))])
def test_integer_options_refuse_what_is_not_an_integer_naming_it(option, value):
    with pytest.raises(ValueError, match=rf"{option} must be a .*int.*got {re.escape(repr(value))}"):
        workbench.watch(nn.Linear(3, 2), **{option: value})
    assert not torch.nn.modules.module._global_forward_hooks  # nothing left attached


def test_reducers_are_taken_by_name_in_order_of_preference():
    from workbench.instrument.reduce import resolve_reducers
    from workbench.instrument.reduce_cpu import CompiledCpuReducer
    from workbench.instrument.reduce_torch import TorchReducer
    from workbench.instrument.reduce_triton import TritonReducer

    triton, cpu, torch_reducer = resolve_reducers(("triton", "cpu", "torch"))
    assert isinstance(cpu, CompiledCpuReducer) and isinstance(triton, TritonReducer)
    assert triton.fallback is torch_reducer and isinstance(torch_reducer, TorchReducer)  # (one torch reducer)
    mine = TorchReducer()
    assert resolve_reducers(mine) == [mine] and resolve_reducers(["triton", mine])[0].fallback is mine
    torch.manual_seed(0)
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    frames = []
    # a list without a torch reducer ends with one: it records what the others do not take (["triton"]
    # recorded no row of CPU tensors, and a Triton failure's rows were left unwritten)
    cpu_alone = resolve_reducers(["cpu"])
    assert [type(r) for r in cpu_alone] == [CompiledCpuReducer, TorchReducer]
    triton_alone = resolve_reducers(["triton"])
    assert triton_alone[0].fallback is triton_alone[1] and isinstance(triton_alone[1], TorchReducer)
    for reducers in (None, ["torch"], "cpu", ["triton"]):
        model.zero_grad()
        with workbench.watch(model, reducers=reducers, histograms=False) as w:
            model(x).sum().backward()
            w.step()
        assert not w.errors, (reducers, w.errors)
        frames.append(w.to_pandas())
    for frame in frames[1:]:
        assert frame[["module", "kind", "tensor"]].equals(frames[0][["module", "kind", "tensor"]])
        assert np.allclose(frame["mean"], frames[0]["mean"], rtol=1e-5, atol=1e-7)


def test_a_reducer_serves_one_open_watch_and_another_once_that_one_is_closed():
    # (a reducer keeps a watch's step: shared by two open watches, the second rebound it, and the first
    # recorded into the second's rows)
    from workbench.instrument.reduce_torch import TorchReducer

    def steps(model, reducers, n=2):
        torch.manual_seed(1)
        model.zero_grad()
        with workbench.watch(model, reducers=reducers, histograms=False) as w:
            for _ in range(n):
                model(torch.randn(4, 3)).sum().backward()
                w.step()
        return w.to_pandas()

    torch.manual_seed(0)
    first, second = nn.Linear(3, 2), nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    shared = TorchReducer()
    hooks_before = dict(torch.nn.modules.module._global_forward_hooks)
    w = workbench.watch(first, reducers=[shared], histograms=False)
    with pytest.raises(ValueError, match=r"this TorchReducer object is in use by Watch\(Linear.*still open.*"
                                         r"a new TorchReducer, or the names 'cpu', 'triton', 'torch'"):
        workbench.watch(second, reducers=[shared])
    assert len(torch.nn.modules.module._global_forward_hooks) == len(hooks_before) + 1  # (the first's alone)
    first(torch.randn(4, 3)).sum().backward()
    record = w.step()
    assert {key[0] for key in record.keys} == {""}  # the first watch's rows, not the second's
    first(torch.randn(4, 3)).sum().backward()  # a step left part-way: its sums wait in the reducer
    w.close()
    # closed, its reducer serves another watch, with nothing of the step it left behind (whose sums
    # would be written over the rows the CPU kernels reduced)
    assert_frame_equal(steps(second, ["cpu", shared]), steps(second, ["cpu", TorchReducer()]))


def test_a_reducer_that_another_hands_tensors_to_is_held_with_it():
    # (a TritonReducer's fallback, shared with an open watch through the Triton reducer, escaped the check)
    from workbench.instrument.reduce_torch import TorchReducer
    from workbench.instrument.reduce_triton import TritonReducer

    fallback = TorchReducer()
    with workbench.watch(nn.Linear(3, 2), reducers=[TritonReducer(fallback=fallback), TorchReducer()]):
        with pytest.raises(ValueError, match=r"this TorchReducer object is in use by Watch\(Linear"):
            workbench.watch(nn.Linear(3, 2), reducers=[fallback])
        with pytest.raises(ValueError, match=r"this TorchReducer object is in use by Watch\(Linear"):
            workbench.watch(nn.Linear(3, 2), reducers=[TritonReducer(fallback=fallback), TorchReducer()])
    workbench.watch(nn.Linear(3, 2), reducers=[fallback]).close()  # free once that watch is closed


def test_a_bad_metric_logs_none_of_the_metrics_given_with_it():
    # (step(loss=0.5, acc="high") raised naming 'acc', and still had logged loss into the step)
    model = nn.Linear(3, 2)
    with workbench.watch(model) as w:
        model(torch.randn(4, 3)).sum().backward()
        with pytest.raises(TypeError, match="metric 'acc' must be a number, got 'high'"):
            w.step(loss=0.5, acc="high")
        with pytest.raises(TypeError, match="metric 'grad_norm' must be a number"):
            w.log(lr=0.1, grad_norm=None)
        record = w.step(accuracy=0.75)  # the step goes on, with what was logged without an error
    assert record.step == 1 and record.metrics == {"accuracy": 0.75}
    assert w.metrics().to_dict("records") == [{"step": 1, "accuracy": 0.75}]


def test_a_metric_of_one_value_is_taken_from_a_numpy_array_as_from_a_tensor_and_others_are_refused_saying_why():
    # (a 0-d array, loss.detach().numpy(), was refused while a one-element tensor was taken; an int past float's
    # range raised OverflowError out of float(); a numpy complex lost its imaginary part)
    model = nn.Linear(3, 2)
    with workbench.watch(model) as w:
        w.step(loss=np.array(0.5), acc=np.array([0.75], dtype=np.float32), lr=torch.tensor([0.1]))
        with pytest.raises(TypeError, match=r"metric 'loss' must be a number, got array\(\[1\., 2\.\]\), a ndarray "
                                            r"of 2 values: reduce it to one first \(\.mean\(\)\)"):
            w.step(loss=np.array([1.0, 2.0]))
        with pytest.raises(TypeError, match=r"metric 'loss' must be a number, got tensor.*a Tensor of 3 values"):
            w.step(loss=torch.ones(3))
        with pytest.raises(TypeError, match=r"metric 'z' must be a number, got np\.complex128.*not a bool nor a "
                                            r"complex"):
            w.step(z=np.complex128(1 + 2j))
        with pytest.raises(ValueError, match=r"metric 'count' is too large for a float64 metric, got an int of 401 "
                                             r"digits"):
            w.step(count=10 ** 400)
        # (past 4300 digits, str() of the int raised Python's own ValueError in place of this message)
        with pytest.raises(ValueError, match=r"metric 'count' is too large for a float64 metric, got an int of "
                                             r"16,610 bits"):
            w.step(count=10 ** 5000)
        w.step()
    assert w.metrics().to_dict("records") == [{"step": 1, "loss": 0.5, "acc": 0.75, "lr": pytest.approx(0.1)}]


def test_a_metric_named_step_is_refused_and_none_logged(tmp_path):
    # (w.step(step=5.0) took the place of the step numbers in w.metrics(), and the stored run's metrics() raised
    # "cannot insert step, already exists", as its CSV export did)
    model = nn.Linear(3, 2)
    with workbench.watch(model, store=tmp_path / "run") as w:
        model(torch.randn(4, 3)).sum().backward()
        with pytest.raises(ValueError, match=r"a metric cannot be named 'step' \(got step=5\.0\).*e\.g\. global_step"):
            w.step(step=5.0, loss=1.0)
        w.step(global_step=5.0, loss=1.0)
    assert w.metrics().to_dict("records") == [{"step": 1, "global_step": 5.0, "loss": 1.0}]
    assert workbench.load_run(tmp_path / "run").metrics().to_dict("records") == [
        {"step": 1, "global_step": 5.0, "loss": 1.0}]


def test_a_recorder_serves_one_open_watch_and_another_once_that_one_is_closed(tmp_path):
    # (two open watches given one recorder mixed their steps: each watch's rows held the other model's, and
    # each store wrote both, failing the two runs on their duplicate step numbers)
    recorder = workbench.Recorder()
    first, second = nn.Linear(3, 2), nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    w = workbench.watch(first, recorder=recorder, store=tmp_path / "first")
    hooks_before = dict(torch.nn.modules.module._global_forward_hooks)
    with pytest.raises(ValueError, match=r"recorder: this Recorder is in use by Watch\(Linear.*still open.*"
                                         r"workbench.Recorder\(max_rows=...\), or None for a new one"):
        workbench.watch(second, recorder=recorder, store=tmp_path / "second")
    assert dict(torch.nn.modules.module._global_forward_hooks) == hooks_before  # nothing of the second left in
    assert not (tmp_path / "second").exists()
    first(torch.randn(4, 3)).sum().backward()
    w.step(loss=1.0)
    w.close()
    # closed, its recorder serves another watch, which goes on from where the first ended
    with workbench.watch(second, recorder=recorder, store=tmp_path / "second", start_step=2) as w2:
        second(torch.randn(4, 3)).sum().backward()
        w2.step(loss=2.0)
    assert [record.step for record in recorder.records()] == [1, 2]
    runs = workbench.load_run(tmp_path / "first"), workbench.load_run(tmp_path / "second")
    assert [run.status for run in runs] == ["finished", "finished"]
    assert set(runs[0].to_pandas().module) == {""} and set(runs[1].to_pandas().module) == {"", "0", "1"}


def test_a_watch_that_keeps_no_step_in_memory_says_where_to_read_them_not_an_empty_frame(tmp_path):
    # (with Recorder(max_rows=0), to_pandas() was empty and diagnose() found nothing wrong: a run that
    # could not be read looked like a healthy one)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with workbench.watch(model, recorder=workbench.Recorder(max_rows=0), store=tmp_path / "run") as w:
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=1.0)
    for method in ("to_pandas", "metrics", "histograms", "diagnose", "anomalies"):
        with pytest.raises(RuntimeError, match=rf"keeps no step in memory.*max_rows=0.*workbench.load_run\("
                                               rf"'{re.escape(str(tmp_path / 'run'))}'\).{method}\(\)"):
            getattr(w, method)()
    run = workbench.load_run(tmp_path / "run")  # (where the message points)
    assert run.steps == [1, 2] and len(run.to_pandas()) and run.metrics().loss.tolist() == [1.0, 1.0]
    with workbench.watch(model, recorder=workbench.Recorder(max_rows=0)) as w:
        with pytest.raises(RuntimeError, match=r"subscribe to it \(w.subscribe\(callback\)\) or give it a store"):
            w.diagnose()


def test_bins_are_limited_to_the_cpu_sample_size_checked_before_anything_is_allocated(tmp_path, monkeypatch):
    from workbench.instrument import _stats_kernels, reduce
    from workbench.instrument.schema import MAX_BINS
    assert MAX_BINS == _stats_kernels.SAMPLE  # (the limit's reason: a large tensor is binned from that sample)
    allocated = []
    monkeypatch.setattr(reduce, "HostRows", lambda *args: allocated.append(args))
    for bins in (MAX_BINS + 1, 10**8):
        with pytest.raises(ValueError, match=rf"bins must be .*at most {MAX_BINS} .*sample.*got {bins}"):
            workbench.watch(nn.Linear(3, 2), bins=bins, store=tmp_path / "run")
        with pytest.raises(ValueError, match=rf"at most {MAX_BINS}.*got {bins}"):
            reduce.StepSums(bins)
    assert not allocated and not (tmp_path / "run").exists()
    assert not torch.nn.modules.module._global_forward_hooks


def test_bins_at_the_limit_record(tmp_path):
    from workbench.instrument.schema import MAX_BINS
    model = nn.Linear(3, 2)
    with workbench.watch(model, bins=MAX_BINS) as w:
        model(torch.randn(4, 3)).sum().backward()
        w.step()
    assert {len(counts) for counts in w.histograms().counts} == {MAX_BINS}


def test_a_second_open_watch_of_the_same_model_warns_naming_the_first_and_both_record(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    first = workbench.watch(model, store=tmp_path / "first")
    with pytest.warns(RuntimeWarning, match=r"Sequential is watched twice: an open watch, Watch\(Sequential.*"
                                            rf"recording into {re.escape(repr(str(tmp_path / 'first')))}, already "
                                            r"watches it\..*close it \(w\.close\(\)\).*filterwarnings"):
        second = workbench.watch(model, modules="0")
    with pytest.warns(RuntimeWarning, match=r"Linear is watched twice: .*already watches the model it is part of"):
        workbench.watch(model[0]).close()
    model(torch.randn(2, 3)).sum().backward()
    first.step()
    second.step()
    assert set(first.to_pandas().module) == {"", "0", "1"} and set(second.to_pandas().module) == {"0"}
    first.close()
    second.close()
    with workbench.watch(model):  # (both closed: no warning, which the tests' filter would make an error)
        pass
    with workbench.watch(nn.Linear(3, 4)), workbench.watch(nn.Linear(3, 4)):  # (other models: none either)
        pass


def test_where_warnings_are_errors_a_second_watch_is_refused_with_nothing_attached(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4))
    with workbench.watch(model) as w:
        hooks = dict(torch.nn.modules.module._global_forward_hooks)
        with pytest.raises(RuntimeWarning, match=r"watched twice: an open watch, Watch\(.*already watches a module "
                                                 r"inside it"):
            workbench.watch(nn.Sequential(model), store=tmp_path / "second")
        assert dict(torch.nn.modules.module._global_forward_hooks) == hooks and not (tmp_path / "second").exists()
        assert not w.closed
