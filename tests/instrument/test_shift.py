"""The statistics do not depend on where a tensor's outliers lie: its sums are taken around the median
of a sample of its values (schema.SHIFT_SAMPLE), the same element on every reduction path."""

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from tests.instrument.conftest import compiled_reducers, torch_reducers


class Emit(nn.Module):
    def forward(self, t):
        return t * 1


def watched(tensors, reducers):
    model = Emit()
    with workbench.watch(model, gradients=False, histograms=False, reducers=reducers) as w:
        for t in tensors:
            model(t)
            w.step()
    return w.to_pandas()


def outlier_moved(first, shape=(1, 200, 300)):
    torch.manual_seed(0)
    h = torch.randn(shape)
    h.view(-1)[0] = first
    moved = h.clone().view(-1)
    moved[0], moved[1234] = moved[1234].clone(), first
    return h, moved.view(shape)


@pytest.mark.parametrize("first", [1e3, 1e5, 3e7])
@pytest.mark.parametrize("path", ["compiled", "torch", "triton"])
def test_an_outlier_first_value_changes_no_statistic(first, path, request):
    if path == "triton":
        reducers = request.getfixturevalue("interpreted_triton")()
    else:
        reducers = compiled_reducers() if path == "compiled" else torch_reducers()
    h, moved = outlier_moved(first)
    rows = watched([h, moved], reducers)
    d = h.double()
    want = {"mean": d.mean().item(), "std": d.std().item(), "norm": d.norm().item(),
            "abs_mean": d.abs().mean().item()}
    # float32 sums within blocks of 4096 values (the compiled path): summed in order on a CPU with narrow
    # vectors (NUMBA_CPU_NAME=generic), their rounding reaches ~6e-6 of the absolute sum. Sums around the
    # outlier (a shift at the first value) would be off by orders of magnitude more
    tolerance = 3e-5 * want["abs_mean"]
    for _, row in rows.iterrows():
        for key, value in want.items():
            assert row[key] == pytest.approx(value, rel=3e-5, abs=tolerance), (row.step, key)


def test_the_shift_sample_handles_nan_inf_and_short_tensors():
    values = [torch.tensor([float("nan")] * 9 + [1.0] * 6), torch.tensor([float("inf"), 2.0, 3.0]),
              torch.tensor([5.0]), torch.tensor([3e7, 1.0, 1.0, 1.0])]
    for reducers in (compiled_reducers(), torch_reducers()):
        rows = watched(values, reducers)
        assert np.isnan(rows["mean"][0]) and rows["nan_count"][0] == 9
        assert rows["mean"][1] == np.inf and rows["inf_count"][1] == 1
        assert rows["mean"][2] == 5.0 and np.isnan(rows["std"][2])
        assert rows["std"][3] == pytest.approx(torch.tensor([3e7, 1.0, 1.0, 1.0]).double().std().item(), rel=1e-7)
