"""On-device sums -> row statistics, against torch / numpy references."""

import numpy as np
import pytest
import torch

from workbench.instrument.stats import SmallTensorBatch, finish, histogram, tensor_sums


def stats_of(x):
    row = finish(np.array([x.numel()]), tensor_sums(x).cpu().numpy()[None])
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


MAKERS = [
    lambda: torch.randn(3, 5, 7),
    lambda: torch.relu(torch.randn(64, 33)),  # half zeros
    lambda: torch.randn(1000, dtype=torch.float64) * 1e-3 + 5.0,  # mean large against the spread
    lambda: torch.randn(17).half(),
    lambda: torch.randn(17).bfloat16(),
    lambda: torch.randint(-5, 6, (4, 9)),
    lambda: torch.rand(50) > 0.3,
    lambda: torch.full((10,), 2.5),
    lambda: torch.randn(8, 6).t(),  # not contiguous
]


@pytest.mark.parametrize("make", MAKERS)
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
    assert np.isnan(got["mean"]) and np.isnan(got["std"])


def test_empty_and_single_element_tensors():
    empty = stats_of(torch.empty(0, 3))
    assert empty["numel"] == 0 and np.isnan(empty["mean"]) and empty["nan_count"] == 0
    one = stats_of(torch.tensor([3.0]))
    assert one["mean"] == 3.0 and np.isnan(one["std"]) and one["norm"] == 3.0  # torch.std of one value is NaN


def test_histogram_matches_numpy_with_the_same_edges():
    x = torch.randn(4000, dtype=torch.float64)
    sums = tensor_sums(x)
    counts = histogram(x, sums, 16).numpy()
    edges = np.linspace(x.min().item(), x.max().item(), 17)
    want, _ = np.histogram(x.numpy(), edges)
    np.testing.assert_array_equal(counts, want)


def test_histogram_leaves_out_non_finite_values_and_handles_constant_tensors():
    x = torch.tensor([1.0, 2.0, float("inf"), 3.0])
    sums = tensor_sums(x)  # the range is infinite: nothing can be binned sensibly
    assert histogram(x, sums, 4).sum() == 0
    constant = torch.full((7,), 2.0)
    counts = histogram(constant, tensor_sums(constant), 5)
    assert counts.tolist() == [7, 0, 0, 0, 0]


def batch_stats(tensors, bins=None, max_elements=1 << 22):
    batch = SmallTensorBatch(bins, max_elements)
    slots = [batch.add(t) for t in tensors]
    sums, hists = batch.reduce()
    numel = np.array([t.numel() for t in tensors])
    rows = finish(numel, sums.numpy())
    return slots, [{k: v[i] for k, v in rows.items()} for i in range(len(tensors))], hists


@pytest.mark.parametrize("max_elements", [1 << 22, 40])  # all at once, or reduced early in several chunks
def test_small_tensor_batch_matches_the_float64_reference_slot_by_slot(max_elements):
    torch.manual_seed(0)
    tensors = [make() for make in MAKERS] + [torch.empty(0, 3), torch.tensor([3.0])]
    odd = torch.randn(300)
    odd[[3, 70, 71]] = float("nan")
    odd[[5, 9]] = float("inf")
    odd[11] = -float("inf")
    odd[20:40] = 0.0
    odd[41] = 1e-42
    tensors.append(odd)
    slots, got, _ = batch_stats(tensors, max_elements=max_elements)
    assert slots == list(range(len(tensors)))
    for x, row in zip(tensors[:len(MAKERS)], got):
        for key, value in reference(x).items():
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    empty, one, nonfinite = got[-3:]
    assert empty["numel"] == 0 and np.isnan(empty["mean"]) and np.isnan(empty["min"]) and empty["nan_count"] == 0
    assert one["mean"] == 3.0 and one["min"] == one["max"] == 3.0 and np.isnan(one["std"])
    assert (nonfinite["nan_count"], nonfinite["inf_count"]) == (3, 3)
    assert nonfinite["zero_frac"] == pytest.approx(20 / 300) and np.isnan(nonfinite["min"])


def test_small_tensor_batch_histograms_equal_the_per_tensor_ones():
    tensors = [torch.randn(500, dtype=torch.float64), torch.full((7,), 2.0), torch.tensor([1.0, 2.0, float("inf")]),
               torch.rand(64) * 10]
    _, _, hists = batch_stats(tensors, bins=8)
    for x, counts in zip(tensors, hists):
        assert torch.equal(counts, histogram(x, tensor_sums(x), 8)), x[:3]


def test_small_tensor_batch_keeps_a_snapshot():
    x = torch.ones(5)
    batch = SmallTensorBatch(None)
    batch.add(x)
    x.mul_(3)  # modified in place after the hook saw it
    assert batch.reduce()[0][0, 0].item() == 5.0


def test_an_empty_small_tensor_batch_reduces_to_no_rows():
    sums, hists = SmallTensorBatch(bins=4).reduce()
    assert sums.shape == (0, 8) and hists.shape == (0, 4)
    assert SmallTensorBatch(bins=None).reduce()[1] is None
