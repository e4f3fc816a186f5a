"""workbench.watch on a torch.compile'd model (watch_compiled): the statistics inside the compiled graphs.

References: the eager watch on the same (uncompiled) model, trained from the same seed, for the
rows; the unwatched compiled model for the outputs, the gradients (bitwise) and the number of
compiled graphs (dynamo's own counter). Models are tiny: compiling on 2 cores is what costs.
"""

import contextlib
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import workbench
from workbench import CompiledWatch, watch_compiled
from workbench.instrument.compiled_graph import offset_in_base, view_elements
from workbench.instrument.reduce_torch import TorchReducer
from workbench.instrument.schema import SHIFT, SUMS
from workbench.instrument.torch_internals import compiled_entry, installed_hooks


KEY = ["step", "module", "call", "kind", "tensor", "shape"]
STATS = ["mean", "std", "min", "max", "abs_mean", "norm"]


def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def mlp_experiment():
    return workbench.experiments.create("activation_mlp", seed=0, activation="gelu", depth=2, width=8, batch_size=8)


def dynamics_experiment():
    return workbench.experiments.create("efficientzero_dynamics", seed=0, batch_size=4, latent_channels=4, actions=2,
                                        spatial=3, lstm_hidden_size=8, support_size=5, fc_reward_layers=[4],
                                        unroll_steps=2)


def ilql_experiment():
    return workbench.experiments.create("ilql", seed=0, batch_size=4, n_layer=1, n_embd=16, n_head=2, eval_every=0)


def train(exp, w, steps):
    metrics = []
    for _ in range(steps):
        metrics.append(exp.step())
        if w is not None:
            w.step()
    return metrics


def compile_in(exp, in_place):
    if in_place:
        exp.model.compile()
    else:
        exp.model = torch.compile(exp.model)
    return exp.model


def three_runs(make, steps=2, in_place=False, **options):
    """(eager watch rows, unwatched compiled: metrics, params, graphs, watched compiled: the same + watch)."""
    eager = make()
    with workbench.watch(eager.model, **options) as w:
        train(eager, w, steps)
    reference = w.to_pandas()
    fresh_dynamo()
    bare = make()
    compile_in(bare, in_place)
    bare_metrics = train(bare, None, steps)
    bare_graphs = graphs()
    fresh_dynamo()
    watched = make()
    wc = workbench.watch(compile_in(watched, in_place), **options)
    assert isinstance(wc, CompiledWatch) and wc.fallback is None
    watched_metrics = train(watched, wc, steps)
    watched_graphs = graphs()
    # outputs and gradients bitwise: the same losses, and parameters after the optimizer's steps
    assert watched_metrics == bare_metrics
    bare_model = getattr(bare.model, "_orig_mod", bare.model)
    watched_model = getattr(watched.model, "_orig_mod", watched.model)
    for (name, p), q in zip(bare_model.named_parameters(), watched_model.parameters()):
        assert torch.equal(p, q), name
    assert watched_graphs == bare_graphs
    assert wc.errors == []
    return reference, wc


def compare(reference: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of both, merged on the key; asserts the statistics agree to float tolerance (the
    compiled model computes in another order than the eager one)."""
    merged = reference.merge(rows, on=KEY, how="outer", suffixes=("_e", "_c"), indicator=True)
    both = merged[merged._merge == "both"]
    assert len(both) > 0
    scale = both[["abs_mean_e", "abs_mean_c"]].max(axis=1).to_numpy() + 1e-6
    for column in STATS:
        e, c = both[column + "_e"].to_numpy(), both[column + "_c"].to_numpy()
        finite = np.isfinite(e)
        assert (np.isfinite(c) == finite).all(), column
        np.testing.assert_allclose(e[finite] / scale[finite], c[finite] / scale[finite], rtol=0, atol=2e-3,
                                   err_msg=column)
    assert (both.numel_e == both.numel_c).all()
    assert (both.nan_count_e == both.nan_count_c).all() and (both.inf_count_e == both.inf_count_c).all()
    return merged


def test_mlp_rows_equal_the_eager_watch_in_as_many_graphs():
    reference, wc = three_runs(mlp_experiment, steps=2, histograms=True, bins=8)
    rows = wc.to_pandas()
    merged = compare(reference, rows)
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    assert set(rows.kind) == {"activation", "grad_output", "param", "param_grad"}
    assert set(rows.step) == {1, 2}
    hist = wc.histograms()  # every value of every tensor in a bin
    assert len(hist) == len(rows) and all(np.sum(h) == n for h, n in zip(hist.counts, rows.numel))
    wc.close()


def same_histograms(eager: pd.DataFrame, compiled: pd.DataFrame) -> pd.DataFrame:
    """Asserts that the compiled watch's histograms are the eager watch's: the same rows, edges
    (to float tolerance) and counts (a value or two on an edge may change bin)."""
    key = ["step", "module", "call", "kind", "tensor"]
    merged = eager.merge(compiled, on=key, suffixes=("_e", "_c"))
    assert len(merged) == len(eager) == len(compiled)
    for e, c in zip(merged.edges_e, merged.edges_c):
        np.testing.assert_allclose(e, c, rtol=1e-5, atol=1e-7)
    for e, c in zip(merged.counts_e, merged.counts_c):
        assert np.abs(np.asarray(e) - np.asarray(c)).sum() <= 2
    return merged


def mlp_histograms(compiled: bool, steps: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The histograms and rows of ``steps`` steps of the MLP experiment, watched eager or compiled."""
    fresh_dynamo()
    exp = mlp_experiment()
    model = compile_in(exp, False) if compiled else exp.model
    with (watch_compiled if compiled else workbench.watch)(model, histograms=True, bins=8) as w:
        train(exp, w, steps)
    return w.histograms(), w.to_pandas()


def test_mlp_histograms_match_the_eager_watch_step_after_step():
    eager, _ = mlp_histograms(False)
    compiled, rows = mlp_histograms(True)
    merged = same_histograms(eager, compiled)
    # the bins are kept from step to step as the eager watch keeps them: after the first step
    # most rows bin over a range wider than their own (own-range bins would fail this)
    later = merged[merged.step > 1].merge(rows[["step", "module", "call", "kind", "tensor", "min", "max"]])
    wider = [e[0] < lo or e[-1] > hi for e, lo, hi in zip(later.edges_c, later["min"], later["max"])]
    assert np.mean(wider) > 0.5


def test_the_graphs_torch_ops_bin_as_the_cpu_op_bins(monkeypatch):
    """The rows a GPU computes in the graph (torch ops, inductor-fused), run on the CPU: the same
    histograms as the eager watch's, in one graph."""
    from workbench.instrument import compiled_graph
    eager, _ = mlp_histograms(False)
    monkeypatch.setattr(compiled_graph, "graph_row", lambda x, bins, edges=None: compiled_graph._torch_row(x, bins, edges))
    compiled, _ = mlp_histograms(True)
    assert graphs() == 1
    same_histograms(eager, compiled)


class Nested(nn.Module):
    """Sequentials in a Sequential (three sites return one tensor), a Sequential whose last child's
    output a hook of the child doubles in place after the watch's hook, and a model that doubles
    its head's output in place."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        self.hooked = nn.Sequential(nn.Tanh(), nn.Linear(8, 8))
        self.hooked[1].register_forward_hook(lambda module, args, out: out.mul_(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.hooked(self.body(x))).mul_(2)


def test_sites_that_return_one_tensor_or_one_changed_in_place_have_the_eager_watch_s_rows():
    histograms, rows = {}, {}
    for compiled, model, watched in eager_then_compiled(Nested):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        w = workbench.watch(watched, bins=8)
        for i in range(3):
            watched(torch.randn(16, 4) * (1 + i)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            w.step()
        histograms[compiled], rows[compiled] = w.histograms(), w.to_pandas()
        assert w.errors == []
        w.close()
    assert graphs() == 1
    assert len(same_histograms(histograms[False], histograms[True])) == 3 * (2 * 11 + 2 * 8)  # 11 sites, 8 params
    assert (compare(rows[False], rows[True])._merge == "both").all()


def eager_then_compiled(make):
    """``(compiled, model, what to call)``: a model from ``make`` as it is, then a new one (the same
    seed) compiled, with dynamo's caches and counters fresh."""
    for compiled in (False, True):
        fresh_dynamo()
        torch.manual_seed(0)
        model = make()
        yield compiled, model, torch.compile(model) if compiled else model


class Loop(nn.Module):
    """One Linear and one Tanh called eight times each: more activation rows in one compiled call
    than a probe has rows."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(4, 4), nn.Tanh()

    def forward(self, x):
        for _ in range(8):
            x = self.act(self.fc(x))
        return x


def test_a_call_with_more_activation_rows_than_its_probe_keeps_their_ranges_too():
    histograms = {}
    for compiled, model, watched in eager_then_compiled(Loop):
        w = CompiledWatch(watched, bins=8, capacity=2) if compiled else workbench.watch(model, bins=8)
        for i in range(3):
            with torch.no_grad():  # (no probe rows at all)
                watched(torch.randn(8, 4) * (1 + i))
            w.step()
        histograms[compiled] = w.histograms()
        w.close()
    assert (histograms[True].kind == "activation").sum() == 3 * 17  # 8 + 8 calls and the model, a step
    same_histograms(histograms[False], histograms[True])


def test_a_large_tensor_s_histogram_is_sampled_inside_the_graph_as_the_eager_watch_samples_it():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 4096), nn.Tanh(), nn.Linear(4096, 1))  # 64 x 4096 = 262,144 values
    x = torch.randn(64, 16)
    hist = {}
    for name, watched in (("eager", model), ("compiled", torch.compile(model))):
        with workbench.watch(watched, bins=16) as w:  # (histograms by default)
            watched(x).sum().backward()
            w.step()
        hist[name] = w.histograms()
        model.zero_grad()
    for kind in ("activation", "grad_output"):
        eager, compiled = (h[h.kind == kind].set_index("module") for h in (hist["eager"], hist["compiled"]))
        assert compiled.sampled.to_dict() == {"": False, "0": True, "1": True, "2": False}
        assert compiled.sampled.to_dict() == eager.sampled.to_dict()
        for site in ("0", "1"):  # the same distribution, from another sample: CDFs within 0.02
            (edges_e, counts_e), (edges_c, counts_c) = (h.loc[site, ["edges", "counts"]] for h in (eager, compiled))
            np.testing.assert_allclose(edges_e, edges_c, rtol=1e-5)
            assert np.sum(counts_c) == pytest.approx(64 * 4096)
            cdf = [np.cumsum(c) / np.sum(c) for c in (counts_e, counts_c)]
            assert np.abs(cdf[0] - cdf[1]).max() <= 0.02


def _numpy_sums(x: torch.Tensor, shift: float) -> np.ndarray:
    """The nine SUMS of a row, by their definition, in float64 numpy: sum and sum of squares about
    ``shift`` (the row's: a value of the tensor, or 0), |x| sum, min, max, non-zeros (NaNs counted),
    NaNs, infinities, the shift; a NaN makes the first five NaN."""
    v = (x.abs() if x.is_complex() else x).detach().to(torch.float64).reshape(-1).numpy()
    assert shift == 0 or shift in v  # (the median of a sample of the values, in the order they lie)
    nan = np.isnan(v).sum()
    with np.errstate(invalid="ignore"):
        first = [np.sum(v - shift), np.sum((v - shift) ** 2), np.abs(v).sum(), v.min(), v.max()]
    return np.array([*(first if not nan else [np.nan] * 5), np.count_nonzero(v), nan, np.isinf(v).sum(), shift])


@pytest.mark.parametrize("name, x", [
    ("contiguous", torch.randn(64, 33)),
    ("transposed", torch.randn(40, 64).t()),
    ("channels-last", torch.randn(3, 4, 5, 6).contiguous(memory_format=torch.channels_last)),
    ("a window", torch.randn(40, 64)[3:30, 5:60:2]),
    ("strided 1-d", torch.randn(1000)[::3]),
    ("float64, mean far from 0", torch.randn(300, dtype=torch.float64) + 1e4),
    ("float16", torch.randn(500).half()),
    ("bfloat16", torch.randn(500).bfloat16()),
    ("int64", torch.arange(-50, 250)),
    ("bool", torch.rand(300) > 0.5),
    ("NaN", torch.tensor([1.0, float("nan"), -2.0, 0.0])),
    ("Inf", torch.tensor([1.0, float("inf"), -2.0, 0.0])),
])
def test_the_cpu_row_op_reduces_any_tensor_by_the_definitions_of_the_sums(name, x):
    bins = 8
    row = torch.ops.workbench.cpu_row(x, bins).numpy()
    assert row.shape == (len(SUMS) + bins + 2,) and row[-1] == 1 and row[-2] == 0  # made; not sampled
    want = _numpy_sums(x, float(row[SHIFT]))
    scale = 1e-5 * (np.nan_to_num(want[2], posinf=0) + 1)
    np.testing.assert_allclose(row[:len(SUMS)], want, rtol=1e-5, atol=scale, err_msg=name)
    counts = row[len(SUMS):-2]
    if np.isfinite(want[3]) and np.isfinite(want[4]):  # (no finite range: nothing binned)
        assert counts.sum() == x.numel()
        edges = np.linspace(want[3], want[4], bins + 1)
        values = x.detach().to(torch.float64).reshape(-1).numpy()
        np.testing.assert_allclose(counts, np.histogram(values, edges)[0], atol=2)  # (a value on an edge may move)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # (the kernels; the torch ops)
def test_the_cpu_row_op_bins_over_a_fixed_range_with_the_values_outside_in_the_end_bins(dtype):
    x = (torch.randn(2000) * 2).to(dtype)
    row = torch.ops.workbench.cpu_row(x, 4, torch.tensor([-1.0, 1.0], dtype=torch.float64)).numpy()
    values = x.to(torch.float64).numpy().clip(-1, 1)
    np.testing.assert_allclose(row[len(SUMS):-2], np.histogram(values, 4, (-1, 1))[0], atol=2)
    assert row[len(SUMS)] > 200 and row[len(SUMS) + 3] > 200  # (a quarter of the values are below -1...)
    own = torch.ops.workbench.cpu_row(x, 4, torch.tensor([math.nan, math.nan], dtype=torch.float64)).numpy()
    np.testing.assert_array_equal(own, torch.ops.workbench.cpu_row(x, 4).numpy())  # NaN: its own range


def test_every_n_two_variants_and_no_recompile_after():
    fresh_dynamo()
    exp = mlp_experiment()
    model = compile_in(exp, False)
    wc = watch_compiled(model, every=2)
    train(exp, wc, 2)  # a recorded and an unrecorded step: the two variants
    after_two = graphs()
    calls = counters["stats"]["calls_captured"]
    train(exp, wc, 4)
    wc.record_next()  # step 7, recorded as every=2 would anyway; step 8 by record_next alone
    train(exp, wc, 1)
    wc.record_next()
    train(exp, wc, 1)
    assert graphs() == after_two == 2
    assert counters["stats"]["calls_captured"] == calls  # nothing traced again
    assert set(wc.to_pandas().step) == {1, 3, 5, 7, 8}
    wc.close()
    # closed: the model is as before (our hooks gone; its own graph again)
    assert installed_hooks()["_global_forward_hooks"] == 0
    assert "forward" in model.__dict__ and model.forward.__name__ != "call"


def test_a_compiled_model_that_ran_before_the_watch_compiles_again_with_its_hooks():
    """dynamo does not guard a graph on the process-wide module hooks: a graph compiled before the
    watch (the model trained unwatched, or under an earlier watch) would never call them. A watch
    has the model compile again: the eager watch's rows, in as many graphs as the model alone."""
    fresh_dynamo()
    eager = mlp_experiment()
    train(eager, None, 2)
    with workbench.watch(eager.model, histograms=True, bins=8) as w:
        train(eager, w, 2)
    fresh_dynamo()
    exp = mlp_experiment()
    compile_in(exp, False)
    train(exp, None, 2)  # compiled, unwatched
    alone = graphs()
    for later in (False, True):  # a watch, then another once it is closed
        before = graphs()
        with workbench.watch(exp.model, histograms=True, bins=8) as wc:
            train(exp, wc, 2)
        assert wc.fallback is None and wc.errors == [] and graphs() - before == alone
        if not later:
            merged = compare(w.to_pandas(), wc.to_pandas())
            assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
            same_histograms(w.histograms(), wc.histograms())
        else:
            assert len(wc.to_pandas()) == len(w.to_pandas())


def test_record_next_part_way_through_a_step_of_a_compiled_model_records_the_next_step_in_full():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    compiled = torch.compile(model)
    wc = watch_compiled(compiled, every=10)

    def step(record_next_after_forward=False):
        loss = compiled(torch.randn(3, 4)).sum()
        if record_next_after_forward:
            wc.record_next()
        loss.backward()
        model.zero_grad()
        wc.step()

    step()
    with pytest.warns(RuntimeWarning, match="part-way through step 2.*Step 3 is recorded in full"):
        step(record_next_after_forward=True)
    step()
    step()
    wc.close()
    rows = wc.to_pandas()
    assert sorted(set(rows.step)) == [1, 3] and len(rows[rows.step == 3]) == len(rows[rows.step == 1])


def test_record_next_part_way_through_a_step_keeps_counting_its_calls_for_the_patches_as_the_eager_watch():
    # (the compiled hooks started the step anew: a patch of call 0 applied to the step's first micro-batch and again
    # to its second, and one of call 1, its second micro-batch not yet run, failed "called '0' 1 time(s)")
    runs = {}
    for compiled, model, run in eager_then_compiled(lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh())):
        w = workbench.watch(run, every=2, histograms=False)
        w.patch("0", lambda y: y * torch.tensor([0.0, 1, 1, 1]), call=0, label="zero unit 0 at call 0")
        w.patch("0", lambda y: y * torch.tensor([1.0, 0, 1, 1]), call=1, label="zero unit 1 at call 1")
        zeroed = []
        for step in range(1, 4):  # (step 2 is not recorded but for record_next; the patches keep the hooks in)
            for micro in range(3):  # ("0" is called three times a step, calls 0, 1 and 2)
                out = run(torch.randn(2, 4))  # (tanh(0) = 0: a unit zeroed in "0" is zero in the output)
                out.sum().backward()
                zeroed.append([unit for unit in range(2) if (out[:, unit] == 0).all()])
                if step == 2 and micro == 0:
                    w.record_next()
            w.step()
        w.close()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        log = w.intervention_log()[["from step", "status"]].values.tolist()
        runs[compiled] = (zeroed, log, w.to_pandas())
    (zeroed, log, rows), (zeroed_c, log_c, rows_c) = runs[False], runs[True]
    assert zeroed == [[0], [1], []] * 3 and log == [[1, "ended with the watch"]] * 2
    assert (zeroed_c, log_c) == (zeroed, log)
    assert rows_c[(rows_c.step == 2) & (rows_c.module == "0") & (rows_c.kind == "activation")].call.tolist() == [0, 1]
    merged = compare(rows, rows_c)
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]


def test_the_eager_watch_of_a_compiled_model_that_ran_before_it_records_every_call():
    """The eager watch on a compiled model (for an option the compiled graphs cannot record) breaks
    its graphs at every module call, once dynamo compiles them again with its hooks."""
    fresh_dynamo()
    eager = mlp_experiment()
    train(eager, None, 2)
    with workbench.watch(eager.model, histograms=False) as w:
        train(eager, w, 2)
    fresh_dynamo()
    exp = mlp_experiment()
    compile_in(exp, False)
    train(exp, None, 2)
    alone = graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (dynamo's notes on the graph breaks)
        with workbench.watch(exp.model, updates=True, histograms=False) as we:
            train(exp, we, 2)
    rows = we.to_pandas()
    merged = compare(w.to_pandas(), rows[rows.kind != "update"])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    # closed, the model compiles its own graphs again (those compiled with the hooks broke at every module)
    before = graphs()
    train(exp, None, 2)
    assert graphs() - before == alone


class CompiledBody(nn.Module):
    """A model whose body alone is compiled."""

    def __init__(self):
        super().__init__()
        self.body = torch.compile(nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8)))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("start_step", [1, 2], ids=["recorded-first", "unrecorded-first"])
def test_the_eager_watch_of_a_model_with_a_compiled_part_that_ran_before_it_records_the_part_s_calls(start_step):
    """Also where the first step after the watch starts is not recorded: the part compiles then,
    and its graphs must call the hooks at the recorded steps after."""
    modules = []
    for ran_before in (False, True):
        fresh_dynamo()
        torch.manual_seed(0)
        model, x = CompiledBody(), torch.randn(3, 4)
        if ran_before:
            model(x).sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (dynamo's notes on the graph breaks)
            with workbench.watch(model, histograms=False, every=2, start_step=start_step) as w:
                for _ in range(2):
                    model(x).sum().backward()
                    w.step()
        rows = w.to_pandas()
        assert len(set(rows.step)) == 1
        modules.append(sorted(set(rows[rows.kind == "activation"].module)))
    assert modules[1] == modules[0] and len(modules[0]) == 7  # the root, body (and its inner module), 3 layers, head


def test_dynamics_network_rows_and_graphs():
    with warnings.catch_warnings():
        # its LSTM is a graph break of dynamo's (compiled or not, watched or not): said once
        warnings.filterwarnings("ignore", message=".*ran outside dynamo's graphs", category=RuntimeWarning)
        reference, wc = three_runs(dynamics_experiment, steps=2)
    rows = wc.to_pandas()
    merged = compare(reference, rows)
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    # the LSTM, where dynamo breaks the graph, is recorded in the break, the rest inside the graphs
    assert len(rows[rows.module == "lstm"]) and len(rows[rows.module == "resblocks.0.conv1.0"])
    wc.close()


def test_ilql_compiled_in_place_rows_and_graphs():
    reference, wc = three_runs(ilql_experiment, steps=1, in_place=True)
    rows = wc.to_pandas()
    merged = compare(reference, rows)
    missing = merged[merged._merge == "left_only"]
    # The one difference: the model's own output "hidden_states", which the agent uses before returning
    # it and the loss does not read. The model's output is recorded around the compiled call, where the
    # uses inside the graph are out of reach: its gradient is that of the uses after the return, none.
    # (The actor's hidden states, used inside the actor and dropped by the agent, have their row.)
    assert set(zip(missing.module, missing.tensor, missing.kind)) == {("", "out.hidden_states", "grad_output")}
    assert (merged._merge != "right_only").all()
    wc.close()


class UsesItsOutput(nn.Module):
    """A block that uses a child's output before returning it (``h`` feeds ``head`` and is returned)."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.body(x))  # (not a module's output: the block's own out.0 alone is h)
        return h, self.head(h)


class ReadsItTwice(nn.Module):
    def __init__(self, caller_uses_h: bool):
        super().__init__()
        self.block, self.caller_uses_h = UsesItsOutput(), caller_uses_h

    def forward(self, x):
        h, y = self.block(x)
        return y.square().mean() + (h.square().mean() if self.caller_uses_h else 0)


@pytest.mark.parametrize("caller_uses_h", [True, False], ids=["caller-uses-it", "caller-drops-it"])
def test_an_output_the_module_also_uses_itself_has_the_gradient_of_all_its_uses_as_in_the_eager_watch(caller_uses_h):
    # the eager watch hooks the tensor and records its total gradient (the head's use and the caller's);
    # the compiled watch hooks the same tensor inside the graph (until 2026-11-29 it recorded the uses
    # after the return alone: a wrong row where the caller used it, none where it dropped it)
    x = torch.randn(8, 4)
    results = {}
    for compiled, model, run in eager_then_compiled(lambda: ReadsItTwice(caller_uses_h)):
        if compiled:  # the unwatched compiled model first: its graphs and gradients
            run = torch.compile(model, backend="aot_eager")
            run(x).backward()
            bare_graphs, bare_grads = graphs(), [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            fresh_dynamo()
            run = torch.compile(model, backend="aot_eager")
        with workbench.watch(run, histograms=False) as w:
            loss = run(x)
            loss.backward()
            w.step()
        assert w.errors == []
        results[compiled] = w.to_pandas()
    assert graphs() == bare_graphs == 1
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), bare_grads))
    merged = compare(results[False], results[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    grads = results[True][results[True].kind == "grad_output"].set_index(["module", "tensor"])
    # the block's out.0 is h: its gradient row is the total, not the caller's share alone
    h = torch.tanh(model.block.body(x)).detach().requires_grad_()
    (model.block.head(h).square().mean() + (h.square().mean() if caller_uses_h else 0)).backward()
    assert grads.loc[("block", "out.0"), "norm"] == pytest.approx(h.grad.norm().item(), rel=1e-5)


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.act = nn.Tanh()

    @torch.compiler.disable
    def forward(self, x):
        return self.act(self.fc(x))


def test_a_model_dynamo_does_not_compile_falls_back_to_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    model = Untraceable()
    x = torch.randn(5, 4)
    eager = workbench.watch(model)
    model(x).sum().backward()
    eager.step()
    eager.close()
    model.zero_grad()
    compiled = torch.compile(model)
    wc = watch_compiled(compiled)
    with pytest.warns(RuntimeWarning, match="no module call of the model ran inside a compiled graph"):
        compiled(x).sum().backward()
        wc.step()
    assert "inside a compiled graph" in wc.fallback and "eager fallback" in repr(wc)
    compiled(x).sum().backward()
    wc.step()
    rows = wc.to_pandas()
    assert set(rows.step) == {1, 2}
    first = rows[rows.step == 1].drop(columns="step").reset_index(drop=True)
    second = rows[rows.step == 2].drop(columns="step").reset_index(drop=True)
    assert sorted(map(tuple, first[KEY[1:]].values)) == sorted(map(tuple, second[KEY[1:]].values))
    compare(eager.to_pandas(), rows[rows.step == 1])
    wc.close()


def test_a_torch_nn_class_compiled_in_place_falls_back_saying_torch_does_not_compile_it():
    # nn.Sequential(...).compile() runs uncompiled in torch, watched or not: dynamo skips torch.nn's
    # frames. The fallback said "dynamo skipped or broke every frame", as if the watch had broken it
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    model.compile()
    model(torch.randn(3, 4)).sum().backward()
    assert graphs() == 0  # (what the message says: unwatched, torch compiled nothing)
    with workbench.watch(model) as w:
        with pytest.warns(RuntimeWarning, match=r"Sequential is a class of torch.nn compiled in place "
                                                r"\(model.compile\(\)\).*runs uncompiled unwatched too.*"
                                                r"torch.compile\(model\)"):
            model(torch.randn(3, 4)).sum().backward()
            w.step()
    assert set(w.to_pandas().module) == {"", "0", "1", "2"}  # (recorded by the eager watch)


REFUSED_STORES = {  # how the store is made bad, what is raised
    "holds-a-run": (FileExistsError, "already holds a run"), "being-written": (FileExistsError, "another writer"),
    "a-file": (FileExistsError, "is a file, not a directory"),
    "under-a-file": (NotADirectoryError, "Cannot create the run directory .*under-a-file/run.* is a file"),
    "under-a-dangling-link": (FileNotFoundError, "Cannot create the run directory .*under-a-dangling-link/run.* is a "
                                                 "link to .*nowhere, which does not exist"),
    "contradicted": (ValueError, r"metadata \{'every': 99\} contradicts"),
}


@pytest.mark.parametrize("store", REFUSED_STORES)
def test_a_store_refused_at_the_start_leaves_a_compiled_model_as_it_was(tmp_path, store):
    # (the watch had hooked the model and had dynamo compile every model of the process again before
    # the store said no: a cell run twice with the same store recompiled them all)
    writing, path, metadata = None, tmp_path / store, None
    if store == "holds-a-run":
        with workbench.watch(nn.Linear(2, 2), store=path):
            pass
    elif store == "being-written":  # (the first run of the cell, still open)
        writing = workbench.instrument.RunStore(path)
    elif store == "a-file":
        path.write_text("not a run")
    elif store == "under-a-file":
        path.write_text("not a directory")
        path = path / "run"
    elif store == "under-a-dangling-link":  # (a link to a disk not mounted, a folder removed)
        path.symlink_to(tmp_path / "nowhere")
        path = path / "run"
    else:
        metadata = {"every": 99}
    error, message = REFUSED_STORES[store]
    fresh_dynamo()
    compiled = torch.compile(nn.Sequential(nn.Linear(4, 6), nn.ReLU()), backend="aot_eager")
    x = torch.randn(3, 4)
    try:
        compiled(x)
        assert graphs() == 1
        for make in (workbench.watch, watch_compiled):
            with pytest.raises(error, match=message):
                make(compiled, store=path, metadata=metadata)
        assert installed_hooks()["_global_forward_hooks"] == 0
        compiled(x)
        assert graphs() == 1  # its graphs ran on, not compiled again
    finally:
        if writing is not None:
            writing.close()


def test_patch_and_ablate_run_inside_the_graph():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    expected = model[2](torch.relu(model[0](x)).index_fill(1, torch.tensor([1, 4]), 0))
    compiled = torch.compile(model)
    wc = watch_compiled(compiled)
    compiled(x)
    wc.step()
    intervention = wc.ablate("1", [1, 4])
    torch.testing.assert_close(compiled(x), expected, rtol=1e-6, atol=1e-6)
    wc.step()
    rows = wc.to_pandas()
    ablated = rows[(rows.step == 2) & (rows.module == "1") & (rows.kind == "activation")]
    assert ablated.zero_frac.iloc[0] >= 2 / 6
    intervention.remove()
    torch.testing.assert_close(compiled(x), model(x))
    late = wc.ablate("1", [0], label="made after step 3's forward")  # (it first acts at step 4)
    wc.step()
    compiled(x)
    wc.step()
    assert wc.intervention_log()[["from step", "to step"]].values.tolist() == [[2, 2], [4, ""]]
    assert late.start_step == 4
    with pytest.raises(ValueError, match="No module at path 'nope'"):
        wc.patch("nope", lambda out: out)
    with pytest.raises(ValueError, match="units \\[9\\] are out of range"):
        wc.ablate("1", 9)
    wc.close()


def test_an_intervention_made_or_removed_after_the_forward_of_a_step_not_recorded_has_its_steps_told():
    # (the compiled watch counted a step's recorded calls only: with every=2, one made after step 2's forward read
    # "from step 2", and one removed after step 4's forward, which it patched, "to step 3"; the docs said the watch
    # tells where another intervention is in place, which it did not either)
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    compiled = torch.compile(model)
    wc = watch_compiled(compiled, every=2)
    made = {}
    for step in range(1, 6):
        out = compiled(x)
        if step == 2:
            made["late"] = wc.ablate("2", [0], label="made after step 2's forward")
        if step == 4:
            assert (out[:, 0] == 0).all()  # (it patched step 4's forward)
            made["late"].remove()
            made["never"] = wc.ablate("1", [0], label="made and removed after step 4's forward")
            made["never"].remove()
        wc.step()
    wc.close()
    assert wc.intervention_log()[["intervention", "from step", "to step", "status"]].values.tolist() == [
        ["made after step 2's forward", 3, 4, "removed"],
        ["made and removed after step 4's forward", 5, 4, "removed before step 5 (never applied)"]]


def test_a_patch_that_returns_none_edits_the_output_in_place_inside_the_graph_as_in_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    hidden = model[0](x).detach()
    hidden[:, 0] = 0.0
    expected = model[1](hidden)

    def zero_first_unit(out):
        out[:, 0] = 0.0  # returns None: the output was edited in place

    compiled = torch.compile(model)
    wc = watch_compiled(compiled)
    wc.patch("0", zero_first_unit)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-6, atol=1e-6)
    wc.step()
    wc.close()
    rows = wc.to_pandas()
    patched = rows[(rows.module == "0") & (rows.kind == "activation")]
    assert not wc.errors and len(patched) == 1 and patched.zero_frac.iloc[0] == pytest.approx(3 / 18)


class SharedTanh(nn.Module):
    """One Tanh called twice in a forward: calls 0 and 1 of the site "act"."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(4, 4), nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(self.act(x)))


def test_a_patch_of_one_call_applies_to_that_call_alone_as_in_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    model = SharedTanh()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    eager = workbench.watch(model)
    eager.ablate("act", [0, 2], call=1)
    # the model called twice a step: the second call's index goes on from the first's
    expected = [model(x), model(y)]
    eager.step()
    eager.close()
    by_hand = model.act(model.fc(model.act(x))).index_fill(1, torch.tensor([0, 2]), 0)
    torch.testing.assert_close(expected[0], by_hand)
    torch.testing.assert_close(expected[1], model.act(model.fc(model.act(y))))  # (calls 2 and 3: unpatched)

    compiled = torch.compile(model)
    wc = watch_compiled(compiled)
    intervention = wc.ablate("act", [0, 2], call=1)
    for step in range(3):  # the count starts again each step
        out = [compiled(x), compiled(y)]
        for got, want in zip(out, expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        wc.step()
    assert graphs() == 2  # a variant per count the two calls start from (0 and 2), then no recompile
    rows = wc.to_pandas()
    acts = rows[(rows.step == 3) & (rows.module == "act") & (rows.kind == "activation")].set_index("call")
    assert list(acts.index) == [0, 1, 2, 3]
    assert acts.zero_frac[1] == 0.5 and (acts.zero_frac.drop(1) == 0).all()
    intervention.remove()
    torch.testing.assert_close(compiled(x), model(x))
    wc.step()
    wc.close()


def test_a_patch_of_one_call_compiles_a_bounded_number_of_graphs_however_often_the_model_is_called():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    compiled = torch.compile(model)
    wc = watch_compiled(compiled, histograms=False)
    wc.ablate("1", [0], call=1)
    xs = [torch.randn(2, 4) for _ in range(12)]  # 12 calls a step, more than dynamo's recompile limit
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (no call falls out of the graphs)
        for _ in range(2):
            ablated = [bool((compiled(x)[:, 0] == 0).all()) for x in xs]
            assert ablated == [False, True] + [False] * 10
            wc.step()
    assert graphs() == 3  # counts 0, 1, and 2 for every later call
    wc.close()


class CheckpointedTwice(nn.Module):
    """A checkpointed segment that calls one Tanh twice (calls 0 and 1 of "act")."""

    def __init__(self, checkpointed: bool = True):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)
        self.checkpointed = checkpointed

    def forward(self, x):
        segment = lambda z: self.act(self.fc(self.act(z)))  # noqa: E731
        hidden = torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=False) if self.checkpointed else segment(x)
        return self.out(hidden)


def test_non_reentrant_checkpointing_inside_the_graph_records_the_eager_watch_s_rows():
    rows = {}
    for compiled, _, watched in eager_then_compiled(CheckpointedTwice):
        with workbench.watch(watched, bins=8) as w:  # (histograms on: their ranges ride on the probe)
            for _ in range(2):
                watched(torch.randn(5, 4)).sum().backward()
                w.step()
        rows[compiled] = w.to_pandas()
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    assert {"fc", "act"} <= set(rows[True][rows[True].kind == "grad_output"].module)


def test_a_patch_applies_to_the_recomputation_of_a_checkpointed_segment_of_a_compiled_model():
    torch.manual_seed(0)
    model, x = CheckpointedTwice(checkpointed=False), torch.randn(3, 4)
    with workbench.watch(model) as w:  # the truth: no checkpointing, the eager watch's patch
        w.ablate("act", [0])
        model(x).sum().backward()
    truth = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    fresh_dynamo()
    model.checkpointed = True
    compiled = torch.compile(model)
    with watch_compiled(compiled) as wc:
        wc.ablate("act", [0])
        compiled(x).sum().backward()
        wc.step()
        assert wc.errors == []
    for got, want in zip([p.grad for p in model.parameters()], truth):
        torch.testing.assert_close(got, want)


class CheckpointedAfter(nn.Module):
    """One Tanh called before a checkpointed segment (call 0) and inside it (call 1)."""

    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)

    def forward(self, x):
        segment = lambda z: self.fc(self.act(z)) * 1.5  # noqa: E731
        return self.out(torch.utils.checkpoint.checkpoint(segment, self.act(x), use_reentrant=False))


@pytest.mark.xfail(strict=True, reason="the traced hook's side effects (a call's rows, its call counts) inside "
                                       "the checkpointed region: dynamo's checkpoint refuses them (HOP: Unsafe side "
                                       "effect) and breaks the graph there, in a recorded step (docs/compile.md)")
def test_non_reentrant_checkpointing_compiles_as_many_graphs_watched_as_unwatched():
    counts = []
    for watched in (False, True):
        fresh_dynamo()
        torch.manual_seed(0)
        compiled = torch.compile(CheckpointedAfter())
        with workbench.watch(compiled, histograms=False) if watched else contextlib.nullcontext() as w:
            for _ in range(2):
                compiled(torch.randn(5, 4)).sum().backward()
                if watched:
                    w.step()
        counts.append(graphs())
    assert counts[0] == 1  # (unwatched: one graph; watched, measured on torch 2.13: two, around the segment)
    assert counts[1] == counts[0]


@pytest.mark.parametrize("make, call", [(CheckpointedTwice, 1), (CheckpointedAfter, 0)],
                         ids=["both calls in the segment", "call 0 before it, call 1 in it"])
def test_a_patch_of_one_call_a_checkpointed_recomputation_cannot_place_is_reported_and_removed(make, call):
    fresh_dynamo()
    torch.manual_seed(0)
    model = make()
    compiled = torch.compile(model)
    wc = watch_compiled(compiled)
    # (the patch saves no tensor, so the recomputation runs without it and torch's checkpoint does not
    # raise; the recomputed call's index is unknown, and a patch of call 0 is not applied to call 1)
    wc.patch("act", lambda out: out * 2.0, call=call)
    with warnings.catch_warnings(record=True) as caught:  # (also: the checkpoint breaks the graph)
        warnings.simplefilter("always")
        compiled(torch.randn(3, 4)).sum().backward()
        wc.step()
    assert any("cannot tell which call is recomputed" in str(w.message) for w in caught)
    assert [e["kind"] for e in wc.errors] == ["patch:<lambda>"]
    assert wc.intervention_log().status[0].startswith("failed at step 1: RuntimeError: activation checkpointing")
    torch.testing.assert_close(compiled(torch.ones(1, 4)), model(torch.ones(1, 4)))  # taken out
    wc.close()


def test_direct_calls_of_the_uncompiled_model_count_as_calls_as_in_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    compiled, x = torch.compile(model), torch.randn(2, 4)
    wc = watch_compiled(compiled, histograms=False)
    wc.ablate("1", [0], call=1)
    for _ in range(2):
        calls = [compiled(x), compiled(x), model(x), model(x)]  # calls 0 and 1 compiled, 2 and 3 direct
        assert [bool((out[:, 0] == 0).all()) for out in calls] == [False, True, False, False]
        wc.step()
    assert wc.errors == []
    wc.ablate("1", [1], call=2)
    assert bool((compiled(x)[:, 1] != 0).all()) and bool((model(x)[:, 1] != 0).all())
    assert bool((model(x)[:, 1] == 0).all())  # call 2 of the step: a direct one, patched
    wc.close()


def test_bad_input_is_refused_with_how_to_fix():
    with pytest.raises(TypeError, match="uncompiled Linear.*workbench.watch"):
        watch_compiled(nn.Linear(2, 2))
    compiled = torch.compile(nn.Linear(2, 2))
    call = compiled_entry(compiled).call
    with pytest.raises(ValueError, match="every must be a positive int.*got 0"):
        watch_compiled(compiled, every=0)
    with pytest.raises(ValueError, match="matches no module"):
        watch_compiled(compiled, modules="nothing*")
    with pytest.raises(ValueError, match="capacity must be a positive int.*got 0"):
        CompiledWatch(compiled, capacity=0)
    assert installed_hooks()["_global_forward_hooks"] == 0  # nothing left in after a refusal
    assert compiled_entry(compiled).call is call  # nor a wrapper of its calls


class NonFinite(nn.Module):
    """Outputs with NaNs (log of negatives), infinities (1/0) and exact zeros."""

    def forward(self, x):
        return torch.log(x), 1.0 / torch.relu(x)


def test_nan_inf_and_zero_counts_equal_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), NonFinite())
    x = torch.randn(5, 4)
    with workbench.watch(model, gradients=False) as eager:
        model(x)
        eager.step()
    compiled = torch.compile(model)
    with watch_compiled(compiled, gradients=False) as wc:
        compiled(x)
        wc.step()
    reference, rows = eager.to_pandas(), wc.to_pandas()
    merged = reference.merge(rows, on=KEY, suffixes=("_e", "_c"))
    assert len(merged) == len(reference) == len(rows)
    leaves = merged[merged.module == "1"].set_index("tensor")
    assert leaves.loc["out.0", "nan_count_c"] > 0 and leaves.loc["out.1", "inf_count_c"] > 0
    for column in ["nan_count", "inf_count", "zero_frac", "min", "max"]:
        np.testing.assert_array_equal(merged[column + "_e"], merged[column + "_c"], err_msg=column)


def test_workbench_watch_picks_the_compiled_watch_unless_an_option_needs_the_eager_one(tmp_path):
    fresh_dynamo()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    compiled = torch.compile(model, backend="aot_eager")  # dynamo and AOTAutograd, no C++ build
    for options in ({"updates": True}, {"reducers": [TorchReducer()]}):
        with workbench.watch(compiled, **options) as w:
            assert type(w) is workbench.Watch
    x = torch.randn(3, 4)
    with workbench.watch(compiled, store=tmp_path / "run", metadata={"note": "compiled"}) as w:
        assert isinstance(w, CompiledWatch)
        compiled(x).sum().backward()
        w.step()
        with w.paused():  # no rows, no call counted: the unrecorded variant (compiled once)
            compiled(x)
            calls = counters["stats"]["calls_captured"]
            compiled(x)
            assert counters["stats"]["calls_captured"] == calls
        compiled(x).sum().backward()
        w.step()
    run = workbench.load_run(tmp_path / "run")
    assert run.metadata["compiled"] is True and run.metadata["note"] == "compiled"
    rows = run.to_pandas()
    assert len(rows[rows.step == 1]) == len(rows[rows.step == 2]) > 0
    assert (rows[(rows.module == "0") & (rows.kind == "activation")].call == 0).all()


def _assign_checkpoint(net: nn.Module) -> None:
    net.load_state_dict({k: torch.full_like(v, 0.5) for k, v in net.state_dict().items()}, assign=True)


def _new_parameter(net: nn.Module) -> None:
    net[0].weight = nn.Parameter(torch.zeros(8, 4))


def _swap_head(net: nn.Module) -> None:
    torch.manual_seed(1)
    net[2] = nn.Linear(8, 3)


def _unfreeze(net: nn.Module) -> None:
    net[0].requires_grad_(True)


@pytest.mark.parametrize("change, warned", [(_assign_checkpoint, "2.weight"), (_new_parameter, "0.weight"),
                                            (_swap_head, "module '2'"), (_unfreeze, None)],
                         ids=["load_state_dict-assign", "new-parameter", "swapped-module", "unfrozen"])
def test_a_model_changed_under_the_compiled_watch_is_re_attached_as_the_eager_watch_does(change, warned):
    def run(compiled: bool):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        net[0].requires_grad_(change is not _unfreeze)
        x = torch.randn(16, 4)
        model = torch.compile(net) if compiled else net
        fresh_dynamo()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with workbench.watch(model, histograms=False) as w:
                for step in range(4):
                    if step == 2:
                        change(net)
                    model(x).sum().backward()
                    net.zero_grad()
                    w.step()
        said = [str(c.message) for c in caught if "replaced, added or removed" in str(c.message)]
        return w, said

    eager, eager_said = run(False)
    compiled, compiled_said = run(True)
    assert isinstance(compiled, CompiledWatch) and compiled.errors == [] == eager.errors
    assert len(compiled_said) == len(eager_said) == (warned is not None)
    if warned:
        assert warned in compiled_said[0]
    rows = compare(eager.to_pandas(), compiled.to_pandas())
    assert (rows._merge == "both").all(), rows[rows._merge != "both"][KEY + ["_merge"]]


class BreaksInside(nn.Module):
    """A block whose forward reads a value on the host (``.item()``): dynamo breaks the graph there."""

    def __init__(self):
        super().__init__()
        self.fc1, self.block, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = self.block(self.fc1(x))
        scale = 2.0 if h.mean().item() > 10 else 1.0
        return self.fc2(torch.relu(h * scale))


def test_the_warning_of_calls_outside_the_graphs_names_their_sites():
    fresh_dynamo()
    torch.manual_seed(0)
    net = nn.Sequential(BreaksInside())
    compiled = torch.compile(net)
    with pytest.warns(RuntimeWarning, match=r"1 of 4 module calls .* outside dynamo's graphs \(graph breaks in the "
                                            r"model, at '0'\)"):
        with workbench.watch(compiled, histograms=False) as w:
            compiled(torch.randn(8, 4)).sum().backward()
            w.step()
    assert w.fallback is None and set(w.to_pandas().module) == {"", "0", "0.fc1", "0.block", "0.fc2"}


def test_a_patch_that_raises_or_of_a_call_never_made_is_removed_with_a_warning_as_in_the_eager_watch():
    def run(compiled: bool):
        fresh_dynamo()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
        model = torch.compile(net) if compiled else net
        x, outs = torch.randn(3, 4), []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with workbench.watch(model, histograms=False) as w:
                w.patch("0", lambda out: out.no_such_method())  # raises in the forward
                w.patch("2", lambda out: out * 0, call=3)  # the model calls "2" once a step
                for _ in range(2):
                    outs.append(model(x))
                    outs[-1].sum().backward()
                    w.step()
        said = [str(c.message) for c in caught if "failed and was removed" in str(c.message)]
        return w, outs, said

    eager, eager_outs, eager_said = run(False)
    compiled, compiled_outs, compiled_said = run(True)
    assert isinstance(compiled, CompiledWatch)
    for out, expected in zip(compiled_outs, eager_outs):  # unpatched
        torch.testing.assert_close(out, expected)
    log = compiled.intervention_log()
    assert log.equals(eager.intervention_log()), (log, eager.intervention_log())
    assert log.status.tolist() == ["failed at step 1: AttributeError: 'Tensor' object has no attribute "
                                   "'no_such_method'",
                                   "failed at step 1: ValueError: the step called '2' 1 time(s): it has no call 3, and "
                                   "the patch applied to nothing. Patch a call from 0 to 0, or every call (call=None)"]
    assert compiled_said == eager_said and len(compiled_said) == 2
    assert "received the module's whole output" not in compiled_said[1]  # (an output it never got)
    assert [e["error"] for e in compiled.errors] == [e["error"] for e in eager.errors]
    compare(eager.to_pandas(), compiled.to_pandas())


def test_an_evaluation_call_left_unpaused_before_the_training_call_is_warned_of_as_in_the_eager_watch():
    fresh_dynamo()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    compiled, x = torch.compile(net), torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match=r"the step 1 began with a call of the model \(Sequential\) in eval mode "
                                            r"or under torch\.no_grad\(\), recorded as its call 0.*w\.paused\(\)"):
        with workbench.watch(compiled, histograms=False) as w:
            with torch.no_grad():
                compiled(x)  # an evaluation, not in w.paused()
            compiled(x).sum().backward()
            w.step()
    assert sorted(set(w.to_pandas().call)) == [0, 1]


def test_a_step_never_ended_stops_growing_past_the_calls_a_step_can_make_with_a_warning():
    from workbench.instrument.compiled_hooks import MAX_CALLS_PER_STEP
    fresh_dynamo()
    torch.manual_seed(0)
    compiled, x = torch.compile(nn.Sequential(nn.Linear(2, 2))), torch.randn(1, 2)
    with pytest.warns(RuntimeWarning, match=rf"the model was called {MAX_CALLS_PER_STEP + 1} times within step 1: is "
                                            r"w\.step\(\) called after each training step\?"):
        with workbench.watch(compiled, histograms=False, parameters=False) as w, torch.no_grad():
            for _ in range(MAX_CALLS_PER_STEP + 5):  # no w.step()
                compiled(x)
            assert len(w._hooks._calls) == MAX_CALLS_PER_STEP  # (what the step keeps stops growing)
            w.step()
    rows = w.to_pandas()
    assert rows.call.max() == MAX_CALLS_PER_STEP - 1 and len(w.errors) == 1


def test_a_fullgraph_model_the_eager_fallback_cannot_take_over_says_why():
    fresh_dynamo()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    compiled = torch.compile(net, fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the hand-over's own warning)
        with workbench.watch(compiled, histograms=False) as w:
            w.patch("0", lambda out: out.no_such_method())  # dynamo cannot trace it: with fullgraph, no graph
            with pytest.raises(RuntimeError, match=r"compiling the model with the watch's hooks failed .*, and so did "
                                                   r"the eager watch that took over .*fullgraph=True.*Compile it "
                                                   r"without fullgraph=True to watch it, and look at the patches"):
                compiled(torch.randn(3, 4))


def _same_loss_twice(model, x):
    loss = model(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()


def _two_losses(model, x):
    out = model(x)
    out[:, 0].pow(2).mean().backward(retain_graph=True)
    out[:, 1].abs().mean().backward()


def _every_pass_keeps_the_graph(model, x):
    out = model(x)
    out[:, 0].pow(2).mean().backward(retain_graph=True)
    out[:, 1].abs().mean().backward(retain_graph=True)


def _grad_of_the_output_then_backward(model, x):
    # (the first pass stops at the model's output, an input of torch.autograd.grad: it runs none of the nodes behind
    # it, the eager watch's hooks included, and is no pass through the output's node either)
    out = model(x)
    loss = out.square().mean()
    torch.autograd.grad(loss, out, retain_graph=True)
    loss.backward()


@pytest.mark.parametrize("passes", [_same_loss_twice, _two_losses, _every_pass_keeps_the_graph,
                                    _grad_of_the_output_then_backward],
                         ids=["same-loss-twice", "two-losses", "every-pass-keeps", "grad-of-the-output"])
def test_several_backward_passes_through_one_forward_record_the_total_gradient_as_in_the_eager_watch(passes):
    # two backward passes through one forward (retain_graph=True): the eager watch records one row of the passes'
    # total gradient (tests/instrument/test_watch.py), the row back-propagating their sum once records. Until
    # 2026-11-30 the compiled watch's probe added the passes' rows up (which describe no tensor), and it left every
    # such row out, the model's own output's too, with a warning: no grad_output row at all
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    rows, histograms, graph_counts = {}, {}, {}
    for compiled, model, _ in eager_then_compiled(lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no warning: nothing left out)
            with workbench.watch(run, histograms=True, bins=8) as w:
                for _ in range(2):
                    passes(run, x)
                    w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled], histograms[compiled], graph_counts[compiled] = w.to_pandas(), w.histograms(), graphs()
    grads = rows[False][rows[False].kind == "grad_output"]
    assert len(grads) == 2 * 4 and (grads.groupby(KEY).size() == 1).all()  # 2 steps, 4 sites (the model's too)
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    same_histograms(histograms[False], histograms[True])  # (the total's, binned over the site's range at step 2)
    fresh_dynamo()
    torch.manual_seed(0)
    bare = torch.compile(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), backend="aot_eager")
    for _ in range(2):
        passes(bare, x)
    assert graph_counts[True] == graphs()


def test_backward_passes_that_keep_the_graph_in_a_step_never_ended_hold_the_gradients_of_a_bounded_number_of_calls():
    # a loop that keeps the graph on every backward (retain_graph=True) and calls w.step() late: the compiled watch
    # held one gradient per hooked output of every call for a pass that never came, up to MAX_CALLS_PER_STEP calls
    # (until 2026-11-30); as the eager watch past MAX_HELD_PASSES, the oldest are let go, their rows kept, with a
    # warning once
    from workbench.instrument import compiled_graph
    from workbench.instrument.hooks import MAX_HELD_PASSES
    x = torch.randn(5, 4)
    rows = {}
    for compiled, model, _ in eager_then_compiled(lambda: nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with pytest.warns(RuntimeWarning, match="retain_graph=True"):
            with workbench.watch(run, histograms=False) as w:
                for _ in range(MAX_HELD_PASSES + 4):
                    run(x).square().mean().backward(retain_graph=True)
                if compiled:
                    assert sum(map(bool, compiled_graph._held.values())) <= MAX_HELD_PASSES
                w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled] = w.to_pandas()
    assert rows[True].call.max() == MAX_HELD_PASSES + 3
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]


def test_torch_autograd_grad_through_a_compiled_model_records_the_eager_watch_s_output_gradients():
    # the gradient hooks run in the backward whatever started it: torch.autograd.grad writes the rows as
    # .backward() does (the probe's autograd Function before 2026-11-29 left its gradient, and so every
    # output gradient row, out of a step taken by torch.autograd.grad, silently)
    x = torch.randn(5, 4)
    rows = {}
    for compiled, model, _ in eager_then_compiled(lambda: nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with workbench.watch(run, histograms=False) as w:
            torch.autograd.grad(run(x).square().mean(), list(model.parameters()))
            w.step()
        assert w.errors == []
        rows[compiled] = w.to_pandas()
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    assert set(rows[True][rows[True].kind == "grad_output"].module) == {"", "0", "1", "2"}


class Half(nn.Module):
    def forward(self, x):
        return x[:, :3]  # a view of its input


class SecondHalf(nn.Module):
    def forward(self, x):
        return x[:, 3:]  # a view further into its input (3 elements in)


class LaterRows(nn.Module):
    def forward(self, x):
        return x[2:]  # a view further into its input (two rows in)


@pytest.mark.parametrize("view", [
    lambda h: h[:, 3:], lambda h: h[2:], lambda h: h[1:, 1::2], lambda h: h.t()[2:], lambda h: h[1],
    lambda h: h[:, 1:2].expand(5, 4), lambda h: h[5:], lambda h: h.t()],
    ids=["columns-in", "rows-in", "strided", "transposed", "selected", "expanded", "empty", "whole"])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_view_elements_reads_the_elements_a_view_reads_of_its_base_s_gradient(view, layout):
    # what the compiled watch's row from a view's base reads (compiled_graph.view_elements), against the view's own
    # elements of the gradient, on a base laid out by rows and one by columns (channels-last-like)
    base = torch.randn(5, 6) if layout == "rows" else torch.randn(6, 5).t()
    grad = torch.randn(5, 6)
    seen = view(base)
    offset = offset_in_base(seen, base)
    assert offset.item() == seen.storage_offset() - base.storage_offset()
    read = view_elements(grad, base.size(), base.stride(), seen.size(), seen.stride(), offset)
    laid_out = torch.empty_strided(base.size(), base.stride())
    laid_out.copy_(grad)
    assert torch.equal(read, view(laid_out))
    assert offset_in_base(base.clone(), base).item() == -1  # (another storage: no row)


class ViewChangedInPlace(nn.Module):
    """A module output that is a view (``part``: its first half by default), then changed in place (a tensor hook
    on it never fires)."""

    def __init__(self, part: type[nn.Module] = Half):
        super().__init__()
        self.fc, self.part, self.out = nn.Linear(4, 6), part(), nn.Linear(6, 2)

    def forward(self, x):
        h = self.fc(x)
        self.part(h).mul_(3)  # (writes h)
        return self.out(h)


class ViewsBaseChangedInPlace(nn.Module):
    """A module output that is a view (``part``), then its base changed in place (the view's hook never fires
    either)."""

    def __init__(self, part: type[nn.Module] = Half):
        super().__init__()
        self.fc, self.part, self.out = nn.Linear(4, 6), part(), nn.Linear(3 if part is not LaterRows else 6, 2)

    def forward(self, x):
        h = self.fc(x)
        view = self.part(h)
        h.mul_(3)  # (writes the view)
        return self.out(view)


class WholeViewChangedInPlace(nn.Module):
    """A module output that is a view of all its base (reduced from the base's gradient as it is), then changed
    in place."""

    def __init__(self):
        super().__init__()
        self.fc, self.whole, self.out = nn.Linear(4, 6), nn.Unflatten(1, (2, 3)), nn.Linear(6, 2)

    def forward(self, x):
        h = self.fc(x)
        self.whole(h).mul_(3)  # (writes h)
        return self.out(h)


@pytest.mark.parametrize("make", [
    ViewChangedInPlace, ViewsBaseChangedInPlace, WholeViewChangedInPlace,
    lambda: ViewChangedInPlace(SecondHalf), lambda: ViewsBaseChangedInPlace(SecondHalf),
    lambda: ViewChangedInPlace(LaterRows), lambda: ViewsBaseChangedInPlace(LaterRows)],
    ids=["view", "base", "whole", "view-further-in", "base-further-in", "view-rows-in", "base-rows-in"])
def test_a_view_output_changed_in_place_has_its_gradient_row_as_in_the_eager_watch(make):
    # (the hook on the view itself, which the in-place op leaves unfired, was the compiled watch's only one: no
    # row; a second row, of the view's elements of its base's gradient, stands in, as the eager watch's does.
    # Until 2026-11-30 a view further into its base, h[:, 3:] or h[2:], had no second row, and so no row)
    x = torch.randn(5, 4)
    rows, graph_counts = {}, {}
    for compiled, model, _ in eager_then_compiled(make):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with workbench.watch(run, histograms=False) as w:
            for _ in range(2):
                run(x).square().mean().backward()
                w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled], graph_counts[compiled] = w.to_pandas(), graphs()
    assert {("part", "grad_output"), ("whole", "grad_output")} & set(zip(rows[False].module, rows[False].kind))
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    fresh_dynamo()
    torch.manual_seed(0)
    bare = torch.compile(make(), backend="aot_eager")
    for _ in range(2):
        bare(x).square().mean().backward()
    assert graph_counts[True] == graphs()  # (the base's hook is traced into the same graphs)


@pytest.mark.parametrize("part", [Half, SecondHalf], ids=["at-start", "further-in"])
def test_a_view_output_changed_in_place_has_the_total_gradient_of_several_backward_passes_in_both_watches(part):
    # two backward passes through one forward (retain_graph=True) record the row that back-propagating the sum of
    # the losses once records. The view's own node is out of the graph (changed in place), so its row is read from
    # its base's gradient; until 2026-11-30 the eager watch read it in the first pass alone (the view's "fired"
    # flag, set there, was never taken back), and recorded that pass's gradient as the total, silently
    x = torch.randn(5, 4)

    def two_passes(run):
        out = run(x)
        out[:, 0].pow(2).mean().backward(retain_graph=True)
        out[:, 1].abs().mean().backward()

    def their_sum_once(run):
        out = run(x)
        (out[:, 0].pow(2).mean() + out[:, 1].abs().mean()).backward()

    for compiled in (False, True):
        rows = []
        for passes in (two_passes, their_sum_once):
            fresh_dynamo()
            torch.manual_seed(0)
            model = ViewChangedInPlace(part)
            run = torch.compile(model, backend="aot_eager") if compiled else model
            with workbench.watch(run, histograms=False) as w:
                passes(run)
                w.step()
            assert w.errors == [] and getattr(w, "fallback", None) is None
            rows.append(w.to_pandas())
        assert ("part", "grad_output") in set(zip(rows[1].module, rows[1].kind))
        merged = compare(rows[1], rows[0])
        assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]


def test_a_view_output_left_as_it_is_has_its_own_gradient_row_not_its_base_s():
    # a view not changed in place gets its own hook's row, once: its base's row is not a second one
    x = torch.randn(5, 4)
    rows = {}
    for compiled, model, _ in eager_then_compiled(lambda: nn.Sequential(nn.Linear(4, 6), Half(), nn.Tanh())):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with workbench.watch(run, histograms=False) as w:
            run(x).square().mean().backward()
            w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled] = w.to_pandas()
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    assert len(rows[True][(rows[True].module == "1") & (rows[True].kind == "grad_output")]) == 1


class FirstRows(nn.Module):
    def forward(self, x):
        return x[:2]  # a view at its input's start: all of it where the batch has 2 rows


class FirstRowsChangedInPlace(nn.Module):
    """A module output that is a view of the batch's first two rows, changed in place where ``in_place``."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.in_place = in_place
        self.fc, self.part, self.out = nn.Linear(4, 6), FirstRows(), nn.Linear(6, 2)

    def forward(self, x):
        h = self.fc(x)
        view = self.part(h)
        if self.in_place:
            view.mul_(3)  # (writes h)
        return self.out(h) + view.sum()


@pytest.mark.parametrize("in_place", [False, True])
def test_a_view_output_of_a_dynamic_batch_has_its_rows_as_in_the_eager_watch_without_a_shape_guard(in_place):
    # (the compiled watch asked whether the view had as many elements as its base, guarding the batch size: with
    # the batch marked dynamic and first 2 rows long, dynamo refused the compile, ConstraintViolationError)
    batches = [torch.randn(rows, 4) for rows in (2, 5, 7)]
    torch._dynamo.mark_dynamic(batches[0], 0)
    rows, graph_counts = {}, {}
    for compiled, model, _ in eager_then_compiled(lambda: FirstRowsChangedInPlace(in_place)):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with workbench.watch(run, histograms=False) as w:
            for x in batches:
                run(x).square().mean().backward()
                w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled], graph_counts[compiled] = w.to_pandas(), graphs()
    assert ("part", "grad_output") in set(zip(rows[False].module, rows[False].kind))
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    fresh_dynamo()
    torch.manual_seed(0)
    bare = torch.compile(FirstRowsChangedInPlace(in_place), backend="aot_eager")
    for x in batches:
        bare(x).square().mean().backward()
    assert graph_counts[True] == graphs() == 1


class LastRows(nn.Module):
    def forward(self, x):
        return x[-2:]  # a view at its input's start where the batch has 2 rows, further in where it has more


class EndOfBatchChangedInPlace(nn.Module):
    """A module output that is a view of the batch (``part``), changed in place."""

    def __init__(self, part: type[nn.Module]):
        super().__init__()
        self.fc, self.part, self.out = nn.Linear(4, 6), part(), nn.Linear(6, 2)

    def forward(self, x):
        h = self.fc(x)
        self.part(h).mul_(3)  # (writes h)
        return self.out(h)


@pytest.mark.parametrize("part, sizes, backend", [
    (LastRows, (2, 5, 7), "aot_eager"), (LaterRows, (4, 5, 7), "aot_eager"), (LaterRows, (4, 5, 7), "inductor")],
    ids=["last", "later", "later-inductor"])  # (not h[-2:] with inductor: the unwatched model specializes the 2 rows)
def test_a_view_into_a_dynamic_batch_changed_in_place_has_the_eager_rows_at_every_size_in_one_graph(part, sizes,
                                                                                                    backend):
    # h[-2:] starts h where the batch has 2 rows (the size traced, marked dynamic) and further in at 5 and 7; h[2:]
    # starts 2 rows in, 2 * 6 elements at every size. Dynamo traces no storage offset: the view's start is taken
    # when the graph runs (workbench::offset_in_base) and its elements gathered from the base's gradient there
    # (under inductor too, which hands the op the view as a view of its base's buffer).
    # (Until 2026-11-30 h[-2:] had no grad_output row at 5 and 7 rows, nor h[2:] at any size; before that h[-2:]
    # had a row of the base's first 2 rows at every size, silently wrong)
    batches = [torch.randn(rows, 4) for rows in sizes]
    torch._dynamo.mark_dynamic(batches[0], 0)
    rows, graph_counts = {}, {}
    for compiled, model, _ in eager_then_compiled(lambda: EndOfBatchChangedInPlace(part)):
        run = torch.compile(model, backend=backend) if compiled else model
        with workbench.watch(run, histograms=False) as w:
            for x in batches:
                run(x).square().mean().backward()
                w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled], graph_counts[compiled] = w.to_pandas(), graphs()
    grads = rows[False][(rows[False].module == "part") & (rows[False].kind == "grad_output")]
    assert list(grads.step) == [1, 2, 3]
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    fresh_dynamo()
    torch.manual_seed(0)
    bare = torch.compile(EndOfBatchChangedInPlace(part), backend=backend)
    for x in batches:
        bare(x).square().mean().backward()
    assert graph_counts[True] == graphs() == 1


class Spectrum(nn.Module):
    def forward(self, x):
        return torch.view_as_real(torch.fft.rfft(x))  # a float view of a complex base


class SpectrumOut(nn.Module):
    """A module output that is a view of another dtype than its base's (changed in place where ``in_place``)."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.in_place = in_place
        self.fc, self.spectrum, self.out = nn.Linear(4, 6), Spectrum(), nn.Linear(8, 2)

    def forward(self, x):
        spectrum = self.spectrum(self.fc(x))
        if self.in_place:
            spectrum.mul_(3)
        return self.out(spectrum.flatten(1))


@pytest.mark.parametrize("in_place", [False, True])
def test_a_view_of_another_dtype_than_its_base_s_has_the_rows_of_the_eager_watch_and_no_error(in_place):
    # (its base's gradient, complex, was read with the view's float sizes and strides: "setStorage: ... out of
    # bounds" raised in the backward, under the compiled watch from any such output, under the eager watch from one
    # changed in place; such a view has no row from its base)
    rows = {}
    for compiled, model, _ in eager_then_compiled(lambda: SpectrumOut(in_place)):
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with workbench.watch(run, histograms=False) as w:
            for _ in range(2):
                run(torch.randn(5, 4)).square().mean().backward()
                w.step()
        assert w.errors == [] and getattr(w, "fallback", None) is None
        rows[compiled] = w.to_pandas()
    kinds = set(zip(rows[False].module, rows[False].kind))
    assert (("spectrum", "grad_output") in kinds) == (not in_place)
    merged = compare(rows[False], rows[True])
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]


def test_a_view_output_changed_in_place_changes_its_base_under_the_compiled_watch_as_unwatched():
    # the output is hooked as it is, not replaced: an in-place op on a module's view output writes its base
    # (until 2026-11-29 the output was a clone, and the write stopped there: other losses and gradients)
    x = torch.randn(5, 4)
    results = []
    for watched in (False, True):
        fresh_dynamo()
        torch.manual_seed(0)
        model = ViewChangedInPlace()
        run = torch.compile(model, backend="aot_eager")
        with workbench.watch(run, histograms=False) if watched else contextlib.nullcontext() as w:
            loss = run(x).square().mean()
            loss.backward()
            if watched:
                w.step()
        results.append((loss.detach(), [p.grad for p in model.parameters()], graphs()))
    (bare_loss, bare_grads, bare_graphs), (loss, grads, watched_graphs) = results
    assert torch.equal(loss, bare_loss) and all(torch.equal(g, b) for g, b in zip(grads, bare_grads))
    assert watched_graphs == bare_graphs


def test_a_compiled_model_run_in_a_forked_child_records_nothing_there_and_says_so_once(tmp_path):
    # (as the eager watch: tests/instrument/test_store.py; every call of the compiled model goes through the watch)
    import os

    from tests.instrument.test_store import in_forked_child

    if not hasattr(os, "fork"):
        pytest.skip("a child is forked")
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    compiled = torch.compile(model, backend="eager")
    w = workbench.watch(compiled, store=tmp_path / "r")
    assert isinstance(w, CompiledWatch)
    compiled(torch.randn(4, 3)).sum().backward()
    w.step()

    def child():
        for _ in range(2):
            compiled(torch.randn(4, 3)).sum().backward()
        return w.step() is None

    got = in_forked_child(child)
    assert got["returned"] is True
    [message] = [m for m in got["warnings"] if m.startswith("workbench:")]  # (torch warns of global hooks too)
    assert "A watch records in the process that made it" in message and str(tmp_path / "r") in message
    compiled(torch.randn(4, 3)).sum().backward()
    w.step()
    w.close()
    assert workbench.load_run(tmp_path / "r").steps == [1, 2]
