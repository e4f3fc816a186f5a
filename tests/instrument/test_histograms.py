"""Histograms: counted from a sample for large tensors (the error bounded), over a range fixed
per row so that a site's histograms share their edges from step to step."""

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from tests.instrument.conftest import compiled_reducers, torch_reducers
from workbench.instrument._stats_kernels import SAMPLE_FROM
from workbench.instrument.reduce import StepSums, next_ranges
from workbench.instrument.schema import MAX, MIN, finish

N = 3 * SAMPLE_FROM + 17  # sampled (and not a multiple of the sample)
BINS = 32


def make_normal(g):
    return torch.randn(N, generator=g)


def make_heavy_tailed(g):  # Student's t with 1.5 degrees of freedom: a few huge values
    return torch.distributions.StudentT(1.5).sample((N,)).float()


def make_sparse(g):  # ReLU-like: most values exactly zero
    x = torch.randn(N, generator=g)
    return torch.where(torch.rand(N, generator=g) < 0.9, torch.zeros(()), x.abs())


def make_bimodal(g):
    x = torch.randn(N, generator=g)
    return torch.where(torch.rand(N, generator=g) < 0.3, x * 0.5 - 3, x + 2)


def make_structured(g):  # (batch, channel, position): a period that lines up with any regular stride
    return (torch.randn(64, 16, 256, generator=g) + torch.arange(16.0)[:, None] * 3).reshape(-1)


DISTRIBUTIONS = [make_normal, make_heavy_tailed, make_sparse, make_bimodal, make_structured]


def exact_counts(x: torch.Tensor, lo: float, hi: float, bins: int = BINS) -> np.ndarray:
    """Every finite value of ``x`` counted in equal bins over [lo, hi], one outside in the end bin on its side."""
    values = x.double().numpy().reshape(-1)
    values = np.clip(values[np.isfinite(values)], lo, hi)
    return np.histogram(values, np.linspace(lo, hi, bins + 1))[0]


def kolmogorov(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between the CDFs of two histograms on the same edges."""
    return float(np.abs(np.cumsum(a) / a.sum() - np.cumsum(b) / b.sum()).max())


def one_step(step: StepSums, tensors, batch: bool):
    step.reset()
    rows = step.add_many(tensors) if batch else [step.add(x) for x in tensors]
    sums, counts = step.rows()
    edges, sampled = step.binning()
    return rows, sums, counts, edges, sampled


@pytest.mark.parametrize("batch", [False, True], ids=["one by one", "batched"])
@pytest.mark.parametrize("make", DISTRIBUTIONS)
def test_a_sampled_histogram_is_within_0_02_of_the_exact_one(make, batch):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    step = StepSums(BINS, reducers=compiled_reducers(), fixed_ranges=True)
    for drift in (1.0, 1.3, 0.9):  # the row's own range first, then the fixed one (values beyond it clamped)
        x = make(g) * drift
        _, sums, counts, edges, sampled = one_step(step, [x], batch)
        assert sampled.tolist() == [True]
        exact = exact_counts(x, *edges[0])
        assert kolmogorov(counts[0], exact) <= 0.02
        assert counts[0].sum() == pytest.approx(x.numel(), rel=1e-6)  # scaled to the tensor's size
        stats = finish(np.array([x.numel()]), sums)  # the counts beside the histogram stay exact
        assert stats["zero_frac"][0] == (x == 0).double().mean().item()


def test_a_tensor_below_the_sample_size_is_counted_whole_and_not_marked():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(SAMPLE_FROM - 1, generator=g)
    _, _, counts, edges, sampled = one_step(StepSums(BINS, reducers=compiled_reducers(), fixed_ranges=True), [x], False)
    assert not sampled.any()
    np.testing.assert_array_equal(counts[0], exact_counts(x, *edges[0]))


def test_the_samples_change_from_step_to_step():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, generator=g)
    step = StepSums(BINS, reducers=compiled_reducers(), fixed_ranges=True)
    seen = set()
    for _ in range(3):
        _, _, counts, _, _ = one_step(step, [x], False)
        seen.add(counts[0].tobytes())
    assert len(seen) > 1


@pytest.mark.parametrize("reducers", [compiled_reducers, torch_reducers], ids=["compiled", "torch"])
def test_a_rows_range_is_kept_while_its_values_fit_and_renewed_when_they_leave_it(reducers):
    g = torch.Generator().manual_seed(4)
    base = torch.randn(5000, generator=g)
    step = StepSums(BINS, reducers=reducers(), fixed_ranges=True)
    history = []
    for scale in (1.0, 1.05, 0.95, 1.0, 3.0, 3.0, 0.3, 0.3):
        x = base * scale
        _, sums, counts, edges, _ = one_step(step, [x], False)
        history.append(tuple(edges[0]))
        np.testing.assert_array_equal(counts[0], exact_counts(x, *edges[0]))
    lo, hi = base.min().item(), base.max().item()
    margin = (hi - lo) / 8
    assert history[0] == (lo, hi)  # the first step: the tensor's own range
    assert history[1] == history[2] == history[3] == history[4] == pytest.approx((lo - margin, hi + margin))
    # x3 left the range at step 5: step 6 has a range of its own values, kept at step 7
    assert history[5] == pytest.approx((3 * lo - 3 * margin, 3 * hi + 3 * margin), rel=1e-6)
    # x0.3 spans less than a quarter of it: step 8 gets a new range
    assert history[6] == history[5] and history[7] == pytest.approx((0.3 * (lo - margin), 0.3 * (hi + margin)),
                                                                     rel=1e-5)


def test_a_fixed_range_bins_the_finite_values_of_a_tensor_with_nan_and_inf():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1000, generator=g)
    step = StepSums(8, reducers=compiled_reducers(), fixed_ranges=True)
    one_step(step, [x], False)
    y = x.clone()
    y[:3] = float("nan")
    y[3:5] = float("inf")
    _, sums, counts, edges, _ = one_step(step, [y], False)
    stats = finish(np.array([1000]), sums)
    assert (stats["nan_count"][0], stats["inf_count"][0]) == (3, 2)
    np.testing.assert_array_equal(counts[0], exact_counts(y, *edges[0], bins=8))
    assert counts[0].sum() == 995


def test_without_fixed_ranges_every_histogram_spans_its_tensors_own_range():
    g = torch.Generator().manual_seed(6)
    step = StepSums(8, reducers=compiled_reducers())
    for scale in (1.0, 2.0, 0.5):
        x = torch.randn(1000, generator=g) * scale
        _, _, counts, edges, _ = one_step(step, [x], False)
        assert tuple(edges[0]) == (x.min().item(), x.max().item())
        np.testing.assert_array_equal(counts[0], exact_counts(x, *edges[0], bins=8))


def test_next_ranges_widen_within_the_sign_and_leave_constant_and_non_finite_rows_without_one():
    sums = np.zeros((4, 9))
    sums[:, MIN] = [0.0, -2.0, 1.0, np.nan]
    sums[:, MAX] = [8.0, -1.0, 1.0, np.nan]
    ranges = next_ranges(sums, np.full((4, 2), np.nan))
    np.testing.assert_array_equal(ranges[:2], [[0.0, 9.0], [-2.125, -0.875]])  # ReLU-like: not below 0
    assert np.isnan(ranges[2:]).all()  # a constant tensor, a NaN one: their own range next step too


def test_a_watch_without_histograms_says_so_when_asked_for_them():
    model = nn.Linear(3, 2)
    with workbench.watch(model, histograms=False) as w:
        model(torch.randn(4, 3)).sum().backward()
        w.step()
    assert len(w.to_pandas()) and w.options["histograms"] is False
    with pytest.raises(RuntimeError, match=r"records no histograms: it was made with histograms=False.*"
                                           r"w\.to_pandas\(\).*histograms=True"):
        w.histograms()
    with pytest.raises(RuntimeError, match="records no histograms"):
        w.histograms("", "activation")
