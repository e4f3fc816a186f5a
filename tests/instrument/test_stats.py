"""On-device sums -> row statistics, against torch / numpy references."""

import sys

import numpy as np
import pytest
import torch

from tests.instrument.conftest import compiled_reducers, torch_reducers
from workbench.instrument.reduce import StepSums
from workbench.instrument.reduce_cpu import CompiledCpuReducer
from workbench.instrument.reduce_torch import CHUNK, TorchReducer
from workbench.instrument.schema import MAX, MIN, NONZERO, finish


DEFER = False
MANY = False
REDUCERS = compiled_reducers  # () -> the reducers of a new StepSums


@pytest.fixture(autouse=True, params=["compiled", "deferred", "many", "torch", "triton", "triton-many"])
def path(request, monkeypatch):
    """Every test runs on every reduction path: the compiled single pass, the same deferred and
    reduced in one batched call, all the tensors at once (``add_many``, as parameters are),
    torch's kernels (the path of tensors on other devices) and the Triton kernels (of CUDA
    tensors; here interpreted on the CPU), tensor by tensor and all at once (``add_many`` hands
    them to the batch as they are)."""
    module = sys.modules[__name__]
    if request.param.startswith("triton"):
        monkeypatch.setattr(module, "REDUCERS", request.getfixturevalue("interpreted_triton"))
    elif request.param == "torch":
        monkeypatch.setattr(module, "REDUCERS", torch_reducers)
    monkeypatch.setattr(module, "DEFER", request.param == "deferred")
    monkeypatch.setattr(module, "MANY", request.param in ("many", "triton-many"))
    if request.param == "many":  # add_many batches the dtypes whose kernels are loaded
        StepSums(reducers=compiled_reducers()).add_many([torch.ones(1), torch.ones(1).double()])
    return request.param


def reduce(*tensors, bins=None):
    """Sums (and histogram counts) of ``tensors``, one row each, as a hook step gathers them."""
    step = StepSums(bins, capacity=1, reducers=REDUCERS())  # capacity 1: adding grows the buffer
    rows = step.add_many(tensors) if MANY else [step.add(x, defer=DEFER) for x in tensors]
    assert rows == list(range(len(tensors)))
    return step.rows()


def stats_of(x):
    row = finish(np.array([x.numel()]), reduce(x)[0])
    return {k: v[0] for k, v in row.items()}


def reference(x):
    """The statistics computed the obvious way, in float64."""
    d = x.detach().double().reshape(-1)
    return {
        "numel": d.numel(), "mean": d.mean().item(), "std": d.std().item(), "min": d.min().item(),
        "max": d.max().item(), "abs_mean": d.abs().mean().item(), "norm": d.norm().item(),
        "zero_frac": (d == 0).double().mean().item(), "nan_count": int(torch.isnan(d).sum()),
        "inf_count": int(torch.isinf(d).sum()),
    }


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 5, 7),
    lambda: torch.relu(torch.randn(64, 33)),  # half zeros
    lambda: torch.randn(1000, dtype=torch.float64) * 1e-3 + 5.0,  # mean large against the spread
    lambda: torch.randn(20_000) * 1e-2 + 300.0,  # the same in float32, over several blocks
    lambda: torch.randn(3, 70_001),  # several blocks and a partial one
    lambda: torch.randn(17).half(),
    lambda: torch.randn(17).bfloat16(),
    lambda: torch.randint(-5, 6, (4, 9)),
    lambda: torch.rand(50) > 0.3,
    lambda: torch.full((10,), 2.5),
    lambda: torch.randn(8, 6).t(),  # not contiguous, dense in memory (read as it lies)
    lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),  # inductor's conv layout
    lambda: torch.randn(4, 1, 5, 6).permute(3, 1, 0, 2),  # dense, a size-1 dimension in the middle
    lambda: torch.randn(6, 10)[:, ::2],  # not dense: gaps between the values
    lambda: torch.randn(6, 10)[1:, 2:7].t(),  # not dense: a window of a larger tensor
    lambda: torch.randn(5, 1).expand(5, 4),  # not dense: a value repeated by a zero stride
])
def test_statistics_match_float64_reference(make):
    x = make()
    got, want = stats_of(x), reference(x)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_non_finite_values_are_counted_exactly():
    x = torch.randn(500)
    x[[3, 70, 71]] = float("nan")
    x[[5, 9]] = float("inf")
    x[11] = -float("inf")
    x[20:40] = 0.0
    x[41] = 1e-42  # subnormal: not zero
    got = stats_of(x)
    assert (got["nan_count"], got["inf_count"]) == (3, 3)
    assert got["zero_frac"] == pytest.approx(20 / 500)
    # a NaN makes every statistic of the values NaN, as torch's reductions do (docs/watch.md says so)
    assert all(np.isnan(got[key]) for key in ("mean", "std", "min", "max", "abs_mean", "norm"))


def test_a_complex_tensor_gets_the_statistics_of_its_magnitude():
    x = torch.complex(torch.randn(40), torch.randn(40))
    x[3] = 0
    got, want = stats_of(x), reference(x.abs())
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_empty_and_single_element_tensors():
    empty = stats_of(torch.empty(0, 3))
    assert empty["numel"] == 0 and np.isnan(empty["mean"]) and empty["nan_count"] == 0
    one = stats_of(torch.tensor([3.0]))
    assert one["mean"] == 3.0 and np.isnan(one["std"]) and one["norm"] == 3.0  # torch.std of one value is NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogram_matches_numpy_with_the_same_edges(dtype):
    x = torch.randn(10_003, dtype=torch.float64).to(dtype)  # several blocks of 4096, a remainder of 4
    counts = reduce(x, bins=16)[1][0]
    edges = np.linspace(x.min().item(), x.max().item(), 17)
    want, _ = np.histogram(x.numpy(), edges)
    np.testing.assert_array_equal(counts, want)


def values_on_bin_edges(bins):
    """float32 tensors of the values at, just above and just below each edge of ``bins`` equal bins
    over ranges of many widths."""
    g = torch.Generator().manual_seed(4)
    tensors = []
    for hi in (torch.rand(20, generator=g, dtype=torch.float64) * 10 + 0.1).tolist():
        edges = torch.linspace(0, hi, bins + 1, dtype=torch.float64).float()
        tensors.append(torch.cat([edges, torch.nextafter(edges, edges + 1), torch.nextafter(edges, edges - 1)])
                       .clamp(0, edges[-1].item()))
    return tensors


def float32_histogram(x, bins):
    """The counts of float32 ``x`` over its own range, by the documented arithmetic written out in
    numpy: bin trunc((v - lo) * (bins / width)), each operation rounded in float32."""
    v = x.numpy()
    lo, hi = v.min(), v.max()
    scale = np.float32(bins) / (hi - lo)  # (all float32)
    return np.bincount(np.clip((v - lo) * scale, 0, bins - 1).astype(np.int64), minlength=bins)


@pytest.mark.parametrize("bins", [10, 7])
def test_values_on_bin_edges_are_binned_by_the_documented_float32_arithmetic(bins):
    """Every path puts a value in bin trunc((v - lo) * (bins / width)), each operation rounded in
    float32, ``bins / width`` one division (where a second rounding, ``width.reciprocal() * bins``,
    moves some values near an edge)."""
    tensors = values_on_bin_edges(bins)
    counts = reduce(*tensors, bins=bins)[1]
    for x, got in zip(tensors, counts):
        np.testing.assert_array_equal(got, float32_histogram(x, bins))


def test_histogram_leaves_out_non_finite_values_and_handles_constant_tensors():
    x = torch.tensor([1.0, 2.0, float("inf"), 3.0])  # the range is infinite: nothing can be binned sensibly
    nan = torch.tensor([1.0, float("nan"), 3.0])
    constant = torch.full((7,), 2.0)
    counts = reduce(x, nan, constant, torch.empty(0), bins=5)[1]
    assert counts.tolist() == [[0] * 5, [0] * 5, [7, 0, 0, 0, 0], [0] * 5]


def test_both_paths_agree_on_float32_model_tensors(monkeypatch):
    torch.manual_seed(3)
    tensors = []
    for shape in [(7,), (64, 33), (16, 8, 8), (2048,), (5000,)]:
        x = torch.randn(shape) * 3
        x[x.abs() < 0.1] = 0.0
        tensors.append(x)
    results = {}
    for compiled, reducers in ((True, compiled_reducers), (False, torch_reducers)):
        monkeypatch.setattr(sys.modules[__name__], "REDUCERS", reducers)
        sums, counts = reduce(*tensors, bins=16)
        results[compiled] = finish(np.array([x.numel() for x in tensors]), sums), counts
    (a, ha), (b, hb) = results[True], results[False]
    for column in a:
        np.testing.assert_allclose(a[column], b[column], rtol=1e-5, atol=1e-6, err_msg=column)
    np.testing.assert_array_equal(ha, hb)  # the same float32 arithmetic puts every value in the same bin


def test_a_row_reduced_on_another_device_keeps_its_place(monkeypatch):
    """Rows of device tensors are filled in at rows(); here a CPU tensor stands in for one."""
    xs = [torch.randn(5), torch.randn(6) + 1, torch.randn(7) - 1]

    class SecondToTorch(TorchReducer):  # the second tensor only
        def takes(self, x):
            return x is xs[1]

    step = StepSums(bins=4, reducers=[SecondToTorch(), CompiledCpuReducer()])
    for x in xs:
        step.add(x)
    sums, counts = step.rows()
    means = finish(np.array([5, 6, 7]), sums)["mean"]
    np.testing.assert_allclose(means, [x.double().mean().item() for x in xs], rtol=1e-6)
    assert counts.sum(axis=1).tolist() == [5, 6, 7]


def test_float32_sums_that_overflow_are_redone_exactly(monkeypatch):
    """The compiled fast pass sums in float32 blocks; when they overflow the exact pass redoes it."""
    monkeypatch.setattr(sys.modules[__name__], "REDUCERS", compiled_reducers)  # deferred or not
    x = torch.full((10,), 3e38)  # x**2 and the float32 sums overflow; the values are finite
    x[0] = -3e38
    got = stats_of(x)
    assert got["inf_count"] == 0 and got["nan_count"] == 0
    assert got["mean"] == pytest.approx(0.8 * 3e38) and got["norm"] == pytest.approx(3e38 * 10**0.5)


def test_deferred_tensors_are_reduced_at_flush_or_when_the_queue_is_full():
    """What a deferred tensor's row holds tells when it was reduced: a change made in place after
    its reduction does not show, one made while it is queued does."""
    step = StepSums(bins=8, reducers=[CompiledCpuReducer(defer_max_bytes=2400, defer_bytes=5000)])
    big = torch.randn(601)  # 2404 bytes: not deferred, reduced at once
    step.add(big, defer=True)
    want_big = big.double().mean().item()
    big.add_(100)
    first, second = torch.randn(600), torch.randn(300).double()  # two dtypes: a batch each
    step.add(first, defer=True)
    step.add(second, defer=True)  # 4800 bytes queued: not reduced yet
    first.add_(100)  # shows
    third = torch.randn(100)
    step.add(third, defer=True)  # 5200 bytes queued: reduced now
    want = [want_big] + [x.double().mean().item() for x in (first, second, third)]
    for x in (first, second, third):
        x.add_(100)  # does not show
    kept = torch.randn(50) + 7
    step.add(kept, defer=True)
    kept.add_(100)  # queued until the rows are read: shows
    sums, counts = step.rows()
    means = finish(np.array([601, 600, 300, 100, 50]), sums)["mean"]
    np.testing.assert_allclose(means[:4], want, rtol=1e-5, atol=1e-6)
    assert means[4] == pytest.approx(kept.double().mean().item(), rel=1e-6)
    assert counts.sum(axis=1).tolist() == [601, 600, 300, 100, 50]


def test_a_deferred_batch_with_non_finite_values_redoes_just_those_rows_exactly():
    clean, dirty = torch.randn(5000), torch.randn(5000)
    dirty[[7, 4100]] = float("nan")
    dirty[9] = float("inf")
    step = StepSums(bins=4, reducers=compiled_reducers())
    for x in (clean, dirty, clean * 2):
        step.add(x, defer=True)
    sums, counts = step.rows()
    got = finish(np.array([5000] * 3), sums)
    assert got["nan_count"].tolist() == [0, 2, 0] and got["inf_count"].tolist() == [0, 1, 0]
    assert np.isnan(got["mean"][1]) and np.isfinite(got["mean"][[0, 2]]).all()
    assert counts.sum(axis=1).tolist() == [5000, 0, 5000]  # a non-finite range bins nothing


def _with_zeros(x, density=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(x.shape, generator=g) < density, x, torch.zeros(()))


def _uncoalesced():
    # entries (0, 1) twice (they sum to 3) and (2, 3); the dense tensor has 13 zeros
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2], [1, 1, 3]]), torch.tensor([1.0, 2.0, -4.0]), (3, 5))
    dense = torch.zeros(3, 5)
    dense[0, 1], dense[2, 3] = 3.0, -4.0
    return coo, dense


def _nested(layout):
    parts = [torch.randn(2, 3), torch.randn(5, 3) + 2]
    return torch.nested.nested_tensor(parts, layout=layout), torch.cat(parts)


LAYOUTS = {  # name: () -> (tensor of that layout, the dense tensor it stands for, independently made)
    "coo": lambda: (lambda d: (d.to_sparse(), d))(_with_zeros(torch.randn(6, 40))),
    "coo, far from zero": lambda: (lambda d: (d.to_sparse(), d))(_with_zeros(torch.randn(50, 40) * 1e-2 + 300)),
    "coo, uncoalesced": _uncoalesced,
    "coo, dense dimensions": lambda: (lambda d: (d.to_sparse(sparse_dim=1), d))(
        torch.randn(8, 4) * (torch.arange(8) % 3 == 0).float()[:, None]),
    "coo, nothing stored": lambda: (torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long), torch.empty(0),
                                                           (3, 4)), torch.zeros(3, 4)),
    "csr": lambda: (lambda d: (d.to_sparse_csr(), d))(_with_zeros(torch.randn(7, 9))),
    "csc": lambda: (lambda d: (d.to_sparse_csc(), d))(_with_zeros(torch.randn(7, 9))),
    "bsr": lambda: (lambda d: (d.to_sparse_bsr((2, 3)), d))(
        torch.randn(6, 9) * torch.tensor([1.0, 0.0, 1.0]).repeat_interleave(2)[:, None]),
    "nested": lambda: _nested(torch.strided),
    "jagged": lambda: _nested(torch.jagged),
    "quantized": lambda: (lambda q: (q, q.dequantize()))(torch.quantize_per_tensor(torch.randn(30), 0.05, 10,
                                                                                  torch.quint8)),
    "mkldnn": lambda: (lambda d: (d.to_mkldnn(), d))(torch.randn(4, 5)),
    "negative bit": lambda: (lambda d: (d._neg_view(), -d))(torch.randn(11)),  # memory holds -values
    "negative bit, public": lambda: (torch.tensor([1.5 + 2.0j]).conj().imag, torch.tensor([-2.0])),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested and sparse CSR/BSR are "in beta"
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_gets_the_statistics_of_its_dense_tensor(layout):
    x, dense = LAYOUTS[layout]()
    assert x.numel() == dense.numel()
    got, want = stats_of(x), reference(dense)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key


def test_a_sparse_tensor_bins_its_implicit_zeros_with_its_values():
    dense = _with_zeros(torch.randn(40, 50), density=0.2)
    dense[0, 0] = -1.5  # the range surely holds zero inside a bin
    counts = reduce(dense.to_sparse(), bins=16)[1][0]
    want, _ = np.histogram(dense.numpy(), np.linspace(dense.min().item(), dense.max().item(), 17))
    np.testing.assert_array_equal(counts, want)
    only_zeros = reduce(torch.zeros(5, 5).to_sparse(), bins=4)[1][0]
    assert only_zeros.tolist() == [25, 0, 0, 0]  # a constant tensor fills the first bin


def test_a_sparse_tensor_with_a_nan_value_counts_it():
    dense = torch.zeros(4, 4)
    dense[1, 2], dense[3, 0] = float("nan"), 2.0
    got = stats_of(dense.to_sparse())
    assert (got["nan_count"], got["zero_frac"]) == (1, 14 / 16) and np.isnan(got["mean"]) and np.isnan(got["min"])


def test_a_meta_tensor_is_refused_with_a_clear_error_and_leaves_no_row():
    step = StepSums(reducers=REDUCERS())
    with pytest.raises(ValueError, match="meta device.*real device"):
        step.add(torch.empty(3, 4, device="meta"))
    assert len(step) == 0 and step.add(torch.ones(2)) == 0


def test_add_many_refuses_a_meta_tensor_and_leaves_no_garbage_in_the_rows_it_took():
    step = StepSums(reducers=REDUCERS())
    with pytest.raises(ValueError, match="meta device"):
        step.add_many([torch.ones(3), torch.empty(2, device="meta")])
    sums, _ = step.rows()
    for row in sums:  # a row taken for the first tensor holds NaN or its sums, not np.empty's bytes
        assert np.isnan(row).all() or (row[MIN], row[MAX], row[NONZERO]) == (1.0, 1.0, 3.0)
    assert step.add_many([torch.full((2,), 4.0)]) == [len(sums)]


def test_a_batch_of_tensors_across_row_boundaries_gets_each_tensors_statistics():
    """Tensors reduced together in one grid (the path of tensors on an accelerator): sizes around the
    grid's row length, first values that are zero, NaN or infinite (the filler copies them)."""
    c = CHUNK
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=g) * 2 + 1 for n in (2, 7, c - 1, c, c + 1, 3 * c + 5)]
    tensors[1][0] = 0.0
    tensors[2][0] = float("nan")
    tensors[3][0] = float("inf")
    tensors[4][0] = -float("inf")
    tensors.append(torch.randn(c + 3, generator=g, dtype=torch.float64) * 1e-3 + 50)  # another dtype, far from 0
    sums, counts = reduce(*tensors, bins=8)
    got = finish(np.array([x.numel() for x in tensors]), sums)
    for i, x in enumerate(tensors):
        want = reference(x)
        for key, value in want.items():
            assert got[key][i] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), (i, key)
        finite = x[torch.isfinite(x)].numpy()
        if len(finite) == len(x):
            edges = np.linspace(x.min().item(), x.max().item(), 9)
            np.testing.assert_array_equal(counts[i], np.histogram(x.numpy(), edges)[0])
        else:  # a range that is not finite bins nothing
            assert counts[i].sum() == 0


def test_a_staged_tensor_is_reduced_as_it_was_when_added_unless_deferred():
    step = StepSums(reducers=REDUCERS() if REDUCERS is not compiled_reducers else torch_reducers())
    copied, kept = torch.randn(300) + 3, torch.randn(300) + 3
    copied_mean, kept_mean = copied.double().mean().item(), kept.double().mean().item()
    step.add(copied)  # an activation: a later in-place op (ReLU(inplace=True), x += ...) must not show
    step.add(kept, defer=True)  # a gradient: nothing changes it, it is kept as it is
    copied.add_(100)
    kept.add_(100)
    step.flush()  # (the end of a backward) what is kept by reference is copied: zero_grad may come next
    kept.zero_()
    means = finish(np.array([300, 300]), step.rows()[0])["mean"]
    assert means[0] == pytest.approx(copied_mean, rel=1e-6)
    assert means[1] == pytest.approx(kept_mean + 100, rel=1e-6)


def test_staged_tensors_are_reduced_once_the_stage_is_full():
    """Kept by reference (deferred), a staged tensor's row shows in-place changes made before its
    batch is reduced, and not those made after."""
    step = StepSums(reducers=[TorchReducer(stage_bytes=5000)])
    xs = [torch.randn(600), torch.randn(300).double(), torch.randn(200)]
    step.add(xs[0], defer=True)
    step.add(xs[1], defer=True)  # 4800 bytes staged: not reduced yet
    xs[0].add_(100)  # shows
    step.add(xs[2], defer=True)  # 5600 bytes: reduced now, a batch per dtype
    want = [x.double().mean().item() for x in xs]
    for x in xs:
        x.add_(100)  # does not show
    means = finish(np.array([600, 300, 200]), step.rows()[0])["mean"]
    np.testing.assert_allclose(means, want, rtol=1e-5, atol=1e-7)


def clamped_histogram(x, lo, hi, bins):
    """numpy's counts of the finite values of ``x`` in ``bins`` equal bins over [lo, hi], a value
    outside counted in the end bin on its side."""
    values = x.double().numpy().reshape(-1)
    values = np.clip(values[np.isfinite(values)], lo, hi)
    return np.histogram(values, np.linspace(lo, hi, bins + 1))[0]


def test_a_reset_step_reduces_the_next_tensors_as_a_new_one_would_over_the_rows_ranges():
    first = [torch.randn(5000), torch.randn(40, 30).double(), torch.randn(9)]
    second = [torch.randn(7) * 5, torch.randn(3000) + 2]
    step = StepSums(bins=8, capacity=1, reducers=REDUCERS(), fixed_ranges=True)
    step.add_many(first) if MANY else [step.add(x, defer=DEFER) for x in first]
    step.rows()
    ranges = step.binning()[0]
    for x, (lo, hi) in zip(first, ranges):  # a row's first step: over the tensor's own range
        assert (lo, hi) == (x.min().item(), x.max().item())
    step.reset()  # a new step: rows start at 0 again, the histogram counts at zero
    assert len(step) == 0
    rows = step.add_many(second) if MANY else [step.add(x, defer=DEFER) for x in second]
    assert rows == [0, 1]
    sums, counts = step.rows()
    want_sums, _ = reduce(*second, bins=8)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-6)
    edges, sampled = step.binning()
    assert not sampled.any()
    for x, row, (lo, hi), (old_lo, old_hi) in zip(second, counts, edges, ranges):
        # then over the range the row got at the step before: its values' widened by an eighth
        margin = (old_hi - old_lo) / 8
        assert (lo, hi) == pytest.approx((old_lo - margin, old_hi + margin))
        np.testing.assert_array_equal(row, clamped_histogram(x, lo, hi, 8))


def test_a_range_widened_past_float32s_largest_value_stops_there():
    """The values fit float32, their range widened by a margin would not: the kept range stops at
    float32's largest value, so that every path bins over the edges the row reports."""
    x = torch.tensor([0.0, 1e38, 2e38, 3.3e38])
    step = StepSums(bins=4, capacity=1, reducers=REDUCERS(), fixed_ranges=True)
    for _ in range(2):
        step.add_many([x]) if MANY else step.add(x, defer=DEFER)
        counts = step.rows()[1]
        edges = step.binning()[0][0]
        step.reset()
    assert edges.tolist() == [0.0, float(np.finfo(np.float32).max)]
    np.testing.assert_array_equal(counts[0], clamped_histogram(x, *edges, 4))


def test_more_tensors_than_the_kept_batch_table_holds_are_each_reduced():
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(5 + i, generator=g) + i / 10 for i in range(150)]  # the table starts at 64 rows
    tensors[100][3] = float("nan")  # one row redone exactly
    step = StepSums(capacity=1, reducers=REDUCERS())
    step.add_many(tensors) if MANY else [step.add(x, defer=True) for x in tensors]
    got = finish(np.array([x.numel() for x in tensors]), step.rows()[0])
    for key in ("mean", "max", "nan_count"):
        want = [reference(x)[key] for x in tensors]
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6)
