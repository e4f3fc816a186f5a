"""watch() on a CUDA device: the statistics, the one host transfer per step, the experiments.

These need a GPU and are skipped without one (CI has none); the same code
paths run on the CPU in test_stats.py and test_watch.py with the compiled
kernels switched off.
"""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument.reduce import StepSums
from workbench.instrument.reduce_torch import TorchReducer
from workbench.instrument.schema import finish

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

COLUMNS = ["mean", "std", "min", "max", "abs_mean", "norm", "zero_frac", "nan_count", "inf_count"]


@pytest.mark.parametrize("bins", [None, 16], ids=["triton", "histograms"])
def test_statistics_of_cuda_tensors_match_the_compiled_cpu_path(bins):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=g) * 3 + 1 for n in (1, 5, 1023, 1024, 1025, 70_001, 2_000_000)]
    tensors[2][0] = float("nan")
    tensors[3][[0, 9]] = float("inf")
    tensors[4][4:600] = 0.0
    tensors += [torch.randn(33, 7, generator=g).bfloat16(), torch.randint(-4, 5, (100,)),
                torch.randn(4000, generator=g, dtype=torch.float64) * 1e-3 + 300,
                torch.randn(300, 50, generator=g).half().t(), torch.empty(0)]
    tensors[-3][5] = float("nan")
    results = []
    # the histograms of CUDA tensors (the Triton kernels') are exact; the CPU's compiled kernels sample
    # large tensors: the GPU's are compared with torch's kernels on the CPU (the same float arithmetic)
    for device, reducers in (("cpu", None), ("cuda", None), ("cpu", [TorchReducer()])):
        step = StepSums(bins=bins, reducers=reducers, fixed_ranges=True)
        steps = []
        for scale in (1.0, 1.5):  # a second step over the ranges the first left (values past them clamped)
            for i, x in enumerate(tensors):
                step.add((x * scale if x.is_floating_point() else x).to(device), defer=i % 2 == 1)
            step.flush()
            sums, counts = step.rows()
            steps.append((finish(np.array([x.numel() for x in tensors]), sums), counts))
            step.reset()
        results.append(steps)
    for (cpu, _), (cuda, cuda_counts), (_, exact_counts) in zip(*results):
        for column in COLUMNS:
            np.testing.assert_allclose(cuda[column], cpu[column], rtol=1e-5, atol=1e-6, err_msg=column)
        if bins:
            np.testing.assert_array_equal(cuda_counts, exact_counts)  # the same float32 arithmetic bins alike
    # (a fallback from the Triton kernels to torch's warns, as do histograms that differ from torch's
    # kernels', and warnings are errors here)


@pytest.mark.parametrize("bins", [10, 7, 32])
def test_cuda_histograms_bin_values_on_edges_as_every_path_does(bins):
    """The Triton kernel's bins for values at, just above and just below every edge: the float32
    arithmetic written out in numpy, as on every CPU path (test_stats.py)."""
    from tests.instrument.test_stats import float32_histogram, values_on_bin_edges
    tensors = values_on_bin_edges(bins)
    step = StepSums(bins=bins)
    for x in tensors:
        step.add(x.cuda())
    counts = step.rows()[1]  # (a check against torch's kernels that failed would warn: an error here)
    for x, got in zip(tensors, counts):
        np.testing.assert_array_equal(got, float32_histogram(x, bins))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU(inplace=True)  # shared, in place
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)) for _ in range(2))
        self.head = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        x = self.act(self.conv(x))
        for block in self.blocks:
            x = x + self.act(block(x))
        return self.head(x.flatten(1))


def _watched_steps(model, inputs, steps, histograms, sync_check=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with workbench.watch(model, histograms=histograms, bins=8) as w:
        for x in inputs[:steps]:
            # hooks, staging and the end-of-backward reduction must never wait for the device
            if sync_check:
                torch.cuda.set_sync_debug_mode("error")
            try:
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode(0)
            w.step()  # the one transfer of the step
    return w


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
@pytest.mark.parametrize("histograms", [False, True], ids=["triton", "histograms"])
def test_a_watched_cuda_model_waits_for_the_device_once_per_step_and_matches_the_cpu(histograms):
    torch.manual_seed(0)
    model = Net()
    inputs = [torch.randn(16, 3, 6, 6) for _ in range(3)]
    gpu = _watched_steps(copy.deepcopy(model).cuda(), [x.cuda() for x in inputs], 3, histograms, sync_check=True)
    assert gpu.errors == []  # a synchronizing call in a hook would have raised there, and been recorded
    with torch.backends.cudnn.flags(allow_tf32=False):  # float32 convolutions, as on the CPU
        gpu_exact = _watched_steps(copy.deepcopy(model).cuda(), [x.cuda() for x in inputs], 3, histograms)
    cpu = _watched_steps(copy.deepcopy(model), inputs, 3, histograms)
    a, b = gpu_exact.to_pandas(), cpu.to_pandas()
    keys = ["step", "module", "call", "kind", "tensor"]
    assert a[keys].equals(b[keys]) and len(a) == len(gpu.to_pandas())
    # (a gradient that is zero in exact arithmetic - a bias before BatchNorm - comes out as exact
    # zeros on one device and as rounding noise on the other: its zero_frac is left out)
    exact = b["abs_mean"] > 1e-6
    for column in COLUMNS:
        keep = exact if column == "zero_frac" else slice(None)
        np.testing.assert_allclose(a[column][keep], b[column][keep], rtol=1e-3, atol=1e-5, err_msg=column)
    assert (a["kind"] == "grad_output").any() and (a["module"] == "act").sum() > 0


@pytest.mark.parametrize("name, config", [
    ("activation_mlp", {"depth": 2, "width": 32}),
    ("efficientzero_dynamics", {"batch_size": 8}),
    ("ilql", {"batch_size": 8, "eval_every": 2, "eval_prompts": 8}),
])
def test_experiments_train_on_cuda_and_are_watched_there(name, config):
    cpu = workbench.experiments.create(name, seed=3, **config)
    gpu = workbench.experiments.create(name, seed=3, device="cuda", **config)
    assert {p.device.type for p in gpu.model.parameters()} == {"cuda"}
    with torch.backends.cudnn.flags(allow_tf32=False):
        first_gpu = gpu.step()
    assert first_gpu["loss"] == pytest.approx(cpu.step()["loss"], rel=1e-3)  # the same batches
    metrics = gpu.run(2, every=1)
    assert all(np.isfinite(m["loss"]) for m in metrics)
    rows = gpu.watcher.to_pandas()
    assert gpu.watcher.errors == [] and set(rows["step"]) == {2, 3}
    assert {"activation", "grad_output", "param", "param_grad"} <= set(rows["kind"])


# (torch's own warnings, raised the same without the watch (an H100, torch 2.11): inductor's advice to
# use TF32, CUDA graphs' note that a replay waits for a pending backward, and "The CUDA Graph is
# empty" as the unwatched model's first graph is captured)
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores", "ignore:Unable to hit fast path of CUDAGraphs",
                            "ignore:The CUDA Graph is empty")
@pytest.mark.parametrize("ran_before", [0, 2], ids=["fresh", "trained-before-the-watch"])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "cuda-graphs"])
def test_a_compiled_cuda_model_records_the_rows_of_its_eager_watch_in_as_many_graphs(mode, ran_before):
    """watch_compiled on the GPU (the statistics inside inductor's kernels; with mode="reduce-overhead",
    replayed as CUDA graphs): the eager watch's rows and histograms, the unwatched compiled model's
    outputs (bitwise) and graph count - also for a model that trained compiled before the watch
    (which then compiles again: CUDA graphs' trees are reset with dynamo's caches)."""
    from tests.instrument.test_compiled import KEY, compare, fresh_dynamo, graphs, same_histograms, train

    def on_gpu():
        return workbench.experiments.create("activation_mlp", seed=0, device="cuda", activation="gelu", depth=2,
                                            width=8, batch_size=8)

    with torch.backends.cudnn.flags(allow_tf32=False):
        eager = on_gpu()
        train(eager, None, ran_before)
        with workbench.watch(eager.model, histograms=True, bins=8) as w:
            train(eager, w, 3)
        fresh_dynamo()
        bare = on_gpu()
        bare.model = torch.compile(bare.model, mode=mode)
        bare_metrics = train(bare, None, ran_before + 3)[ran_before:]
        bare_graphs = graphs()
        fresh_dynamo()
        watched = on_gpu()
        watched.model = torch.compile(watched.model, mode=mode)
        train(watched, None, ran_before)
        before = graphs()
        with workbench.watch(watched.model, histograms=True, bins=8) as wc:
            assert isinstance(wc, workbench.CompiledWatch) and wc.fallback is None
            metrics = train(watched, wc, 3)
    assert metrics == bare_metrics and graphs() - before == bare_graphs and wc.errors == []
    merged = compare(w.to_pandas(), wc.to_pandas())
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    same_histograms(w.histograms(), wc.histograms())


@pytest.mark.parametrize("bins", [0, 8])
def test_rows_made_outside_the_graphs_by_the_triton_kernels_equal_the_graphs_torch_ops(bins):
    """A compiled model's calls outside its graphs (graph breaks, its own output and gradient) are
    reduced by the Triton kernels, inside the graphs by torch's ops: the same rows."""
    from workbench.instrument.compiled_graph import _torch_row, graph_row
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(1, generator=g), torch.randn(70_001, generator=g) * 3 + 1,
               torch.randn(33, 7, generator=g).bfloat16(), torch.randn(300, 50, generator=g).half().t(),
               torch.randn(4000, generator=g, dtype=torch.float64) * 1e-3 + 300]
    tensors[1][:500] = 0.0
    tensors[1][7] = float("nan")
    for x in tensors:
        x = x.cuda()
        for edges in (None, torch.tensor([-1.0, 2.0], dtype=torch.float64, device="cuda")):
            got, want = graph_row(x, bins, edges).cpu(), _torch_row(x, bins, edges).cpu()
            np.testing.assert_allclose(got[:9], want[:9], rtol=1e-5, atol=1e-6)
            assert torch.equal(got[9:], want[9:])  # the counts, "every value", "a row was made"


@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores", "ignore:.*ran outside dynamo's graphs")
def test_a_compiled_cuda_model_with_graph_breaks_records_the_eager_watch_s_rows():
    """The dynamics network's LSTM breaks dynamo's graph: its calls are recorded outside the graphs
    (the Triton kernels), the rest inside them: the eager watch's rows, the unwatched compiled
    model's outputs (bitwise) and graph count, the eager watch's histograms."""
    from tests.instrument.test_compiled import KEY, compare, same_histograms, three_runs, train

    def on_gpu():
        return workbench.experiments.create("efficientzero_dynamics", seed=0, device="cuda", batch_size=4,
                                            latent_channels=4, actions=2, spatial=3, lstm_hidden_size=8,
                                            support_size=5, fc_reward_layers=[4], unroll_steps=2)

    # bitwise comparisons need cuDNN's deterministic algorithms (its default ones may add weight gradients
    # by atomics). Without this flag an H100 run (torch 2.11) differed in the last bits of the reward
    # head's parameters after step 2; not yet run with it
    with torch.backends.cudnn.flags(enabled=True, deterministic=True, allow_tf32=False):
        reference, wc = three_runs(on_gpu, steps=3, histograms=True, bins=8)
        eager = on_gpu()  # (the reference's run again, for its histograms)
        with workbench.watch(eager.model, histograms=True, bins=8) as w:
            train(eager, w, 3)
    rows = wc.to_pandas()
    merged = compare(reference, rows)
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    assert len(rows[(rows.module == "lstm") & (rows.kind == "grad_output")])
    same_histograms(w.histograms(), wc.histograms())
    wc.close()
