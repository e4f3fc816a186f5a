"""A constant tensor (a LayerNorm's weight of ones, a bias of zeros) has a range of no width: its
histogram's bin 0, where every value is counted, is centred on the value, and a watch's histograms,
a stored run's and the views' drawing agree on it."""

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument.recorder import bin_edges
from workbench.ui.views import RunView


def constant_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    with torch.no_grad():
        model[0].bias.fill_(-2.5)
    return model


@pytest.fixture
def recorded(tmp_path):
    model = constant_model()
    with workbench.watch(model, bins=8, store=tmp_path / "run") as w:
        model(torch.randn(5, 3)).sum().backward()
        w.step()
    return w, workbench.load_run(tmp_path / "run")


@pytest.mark.parametrize("module, value", [("1", 1.0), ("1", 0.0), ("0", -2.5)])
def test_a_constant_tensors_bar_stands_at_its_value_and_numpy_takes_its_edges(recorded, module, value):
    w, run = recorded
    for frame in (w.histograms(module, "param"), run.histograms(module, "param")):
        rows = [row for row in frame.itertuples() if row.counts.sum() and np.isclose(row.edges[0], value, atol=1)]
        constant = [row for row in rows if row.counts[0] == row.counts.sum()
                    and row.edges[0] < value < row.edges[1]]
        assert constant, f"no bar at {value} in {frame[['tensor', 'edges', 'counts']]}"
        for row in constant:
            assert np.all(np.diff(row.edges) > 0)
            assert (row.edges[0] + row.edges[1]) / 2 == pytest.approx(value)  # (bin 0 centred on the value)
            assert row.edges[-1] - row.edges[0] == pytest.approx(max(1.0, abs(value)))
            values = np.full(int(row.counts.sum()), value)
            np.testing.assert_array_equal(np.histogram(values, row.edges)[0], row.counts)


def test_a_watch_and_its_stored_run_give_the_same_edges(recorded):
    w, run = recorded
    live, stored = w.histograms(), run.histograms()
    assert len(live) == len(stored)
    for a, b in zip(live.edges, stored.edges):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_the_views_draw_a_constant_site_at_its_value_without_losing_its_count(recorded):
    _, run = recorded
    view = RunView.from_run(run)
    site = next(s.name for s in view.sites["param"] if s.name.startswith("1.weight") or s.name == "1.weight")
    [(steps, edges, counts)] = view.distribution_segments("param", site)
    np.testing.assert_array_equal(edges, run.histograms("1", "param").query("tensor == 'weight'").edges.iloc[0])
    bands, _, grid, density = view.distribution("param", site)
    assert grid[0] < 1.0 < grid[-1] and np.all(np.diff(grid) > 0)
    assert density.sum() == pytest.approx(counts.sum())  # (the whole count on the grid, none lost off its ends)
    assert bands.p0.iloc[0] == bands.p100.iloc[0] == pytest.approx(1.0)


def test_bin_edges_of_ranges_with_width_are_numpys_linspace():
    lo, hi = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 3.0, 2.0])
    edges = bin_edges(lo, hi, 4)
    np.testing.assert_array_equal(edges[:2], np.linspace(lo[:2], hi[:2], 5, axis=-1))
    np.testing.assert_allclose(edges[2], [1.75, 2.25, 2.75, 3.25, 3.75])  # (width 2 = |2|, bin 0 about 2)
    assert np.isnan(bin_edges(np.nan, np.nan, 3)).all()


class Identity(nn.Module):
    def forward(self, x):
        return x


def test_rows_with_an_infinity_or_a_huge_constant_are_read_quietly_and_the_huge_one_exported(tmp_path):
    # (the tests make warnings errors: numpy's overflow and invalid-value warnings would raise here)
    model = nn.Sequential(Identity())
    with workbench.watch(model, bins=4, parameters=False, gradients=False, store=tmp_path / "run") as w:
        model(torch.tensor([1.0, float("inf"), 2.0]))
        w.step()
        model(torch.full((3,), 1e308, dtype=torch.float64))
        w.step()
    run = workbench.load_run(tmp_path / "run")
    for frame in (w.histograms("0"), run.histograms("0")):
        infinite, huge = frame.sort_values("step").edges
        assert not np.isfinite(infinite).all()
        assert np.isfinite(huge).all() and np.all(np.diff(huge) > 0) and huge[0] < 1e308 < huge[1]
        np.testing.assert_array_equal(np.histogram(np.full(3, 1e308), huge)[0], [3, 0, 0, 0])
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run.export(tmp_path / "tb")))
    events.Reload()
    assert [e.step for e in events.Histograms("activation/0/out")] == [2]  # (the huge constant's step: edges finite)


def test_a_site_constant_at_its_first_step_keeps_the_heatmaps_grid_fitted_to_its_values(tmp_path):
    # a LayerNorm's bias: zeros at the first step, then values within 0.001 of them; the constant step's bar is
    # a 64th of a unit wide (bins=32), which spanned by the grid would leave the later steps two of its 32 bins
    model = nn.Sequential(nn.LayerNorm(4))
    with workbench.watch(model, store=tmp_path / "run", activations=False, gradients=False,
                         parameter_grads=False) as w:
        for step in range(4):
            model(torch.randn(2, 4))
            w.step()
            with torch.no_grad():
                model[0].bias.copy_(torch.tensor([-1e-3, -5e-4, 5e-4, 1e-3]) * (step + 1) / 4)
    view = RunView.from_run(workbench.load_run(tmp_path / "run"))
    site = next(s.name for s in view.sites["param"] if s.name.startswith("0.bias"))
    _, steps, grid, density = view.distribution("param", site)
    assert steps.tolist() == [1, 2, 3, 4]
    assert grid[0] >= -1.5e-3 and grid[-1] <= 1.5e-3  # (the values' range, with the kept ranges' margins)
    assert np.count_nonzero(density[-1]) == 4  # the last step's four values, a bin each
    np.testing.assert_allclose(density.sum(axis=1), 4)  # every count on the grid, the constant step's too
    assert density[0][np.searchsorted(grid, 0.0, "right") - 1] == 4  # (the zeros in the bin holding 0)
