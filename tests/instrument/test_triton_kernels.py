"""The Triton kernels that reduce batches of GPU tensors, run by Triton's interpreter on the CPU
(on a GPU machine, tests/instrument/test_cuda.py runs them on the device); every other statistics
test runs them too, as one of test_stats.py's paths."""

import numpy as np
import pytest
import torch

from tests.instrument.conftest import interpreted_triton_kernels
from tests.instrument.test_stats import reference
from workbench.instrument.reduce import StepSums
from workbench.instrument.schema import SHIFT, finish


@pytest.mark.parametrize("programs", [128, 2], ids=["a-program-a-row", "programs-take-rows-in-turn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_triton_kernels_read_tensors_anywhere_in_memory_over_many_rows(dtype, programs, interpreted_triton,
                                                                           monkeypatch):
    from workbench.instrument._triton_kernels import ROW
    kernels = interpreted_triton_kernels()
    monkeypatch.setattr(kernels, "PROGRAMS", programs)  # (2: the first piece's 3 rows take 2 programs)
    g = torch.Generator().manual_seed(1)
    storage = (torch.randn(3 * ROW + 5000, generator=g, dtype=torch.float64) * 2 + 7).to(dtype)
    # views of one storage, given out of address order (offsets from the first are negative too),
    # sized across the row boundary; non-finite values in later rows
    pieces = [storage[ROW + 10:3 * ROW + 20], storage[:2], storage[3:ROW + 3], storage[3 * ROW + 100:3 * ROW + 107]]
    pieces[0][ROW + 5] = float("nan")
    pieces[0][ROW + 9] = float("inf")
    pieces[2][ROW - 1] = -float("inf")
    pieces[3][2:5] = 0.0
    pieces.append(torch.full((3,), float("nan"), dtype=dtype))
    sums = kernels.batch_sums(pieces).numpy()
    got = finish(np.array([x.numel() for x in pieces]), sums)
    for i, x in enumerate(pieces):
        want = reference(x)
        for key in ("numel", "min", "max", "zero_frac", "nan_count", "inf_count"):
            assert got[key][i] == pytest.approx(want[key], nan_ok=True), (i, key)
        if torch.isfinite(x).all():
            for key in ("mean", "std", "abs_mean", "norm"):
                assert got[key][i] == pytest.approx(want[key], rel=1e-5), (i, key)
    assert sums[0, SHIFT] == pieces[0][0].item()  # sums are taken around the tensor's first value


def test_a_batch_at_the_addresses_of_an_earlier_one_is_read_at_its_own_offsets(interpreted_triton):
    """The layout table is kept between batches by addresses, lengths and value size (a training
    loop's steps reuse memory): a batch at the same addresses with other lengths or another dtype
    gets a table of its own."""
    kernels = interpreted_triton_kernels()
    storage = torch.arange(1.0, 41.0, dtype=torch.float64)
    wide = [storage[:5], storage[5:10]]  # at a and a + 40 bytes
    as_float32 = storage.view(torch.float32)
    narrow = [as_float32[:5], as_float32[10:15]]  # also at a and a + 40 bytes, 5 values each
    shorter = [storage[:5], storage[5:8]]
    for batch in (wide, narrow, shorter, wide, narrow):
        sums = kernels.batch_sums(batch).numpy()
        means = finish(np.array([x.numel() for x in batch]), sums)["mean"]
        np.testing.assert_allclose(means, [x.double().mean().item() for x in batch], rtol=1e-6)


def test_a_failing_triton_batch_falls_back_to_torchs_kernels(interpreted_triton):
    class Broken:
        @staticmethod
        def batch_sums(tensors):
            raise RuntimeError("no kernel image is available for this GPU")

    step = StepSums(reducers=interpreted_triton(kernels=Broken))
    xs = [torch.randn(50) + 1, torch.randn(70).half()]
    for x in xs:
        step.add(x)
    with pytest.warns(RuntimeWarning, match="no kernel image .* fall back to torch's kernels"):
        sums, _ = step.rows()
    later = torch.randn(30) - 2
    step.add(later)  # straight to torch's kernels: no second warning (warnings are errors here)
    means = finish(np.array([50, 70, 30]), step.rows()[0])["mean"]
    np.testing.assert_allclose(means, [x.double().mean().item() for x in xs + [later]], rtol=1e-5)
