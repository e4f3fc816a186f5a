"""On-device sums -> row statistics, against torch / numpy references."""

import numpy as np
import pytest
import torch

from workbench.instrument import stats
from workbench.instrument.stats import finish, histogram, tensor_sums


@pytest.fixture(autouse=True, params=["compiled", "torch"])
def path(request, monkeypatch):
    """Every test runs on both reduction paths: the compiled single pass and torch's kernels."""
    monkeypatch.setattr(stats, "COMPILED_MAX", 10**12 if request.param == "compiled" else -1)
    return request.param


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


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 5, 7),
    lambda: torch.relu(torch.randn(64, 33)),  # half zeros
    lambda: torch.randn(1000, dtype=torch.float64) * 1e-3 + 5.0,  # mean large against the spread
    lambda: torch.randn(17).half(),
    lambda: torch.randn(17).bfloat16(),
    lambda: torch.randint(-5, 6, (4, 9)),
    lambda: torch.rand(50) > 0.3,
    lambda: torch.full((10,), 2.5),
    lambda: torch.randn(8, 6).t(),  # not contiguous
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


def test_both_paths_agree_on_float32_model_tensors(monkeypatch):
    torch.manual_seed(3)
    for shape in [(7,), (64, 33), (16, 8, 8), (2048,)]:
        x = torch.randn(shape) * 3
        x[x.abs() < 0.1] = 0.0
        results = {}
        for name, limit in (("compiled", 10**12), ("torch", -1)):
            monkeypatch.setattr(stats, "COMPILED_MAX", limit)
            sums = tensor_sums(x)
            results[name] = (sums, histogram(x, sums, 16))
        (a, ha), (b, hb) = results["compiled"], results["torch"]
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), shape
        assert torch.equal(ha, hb), shape  # the same float32 arithmetic puts every value in the same bin
