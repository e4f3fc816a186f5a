"""The Triton kernels that reduce batches of GPU tensors, run by Triton's interpreter on the CPU
(on a GPU machine, tests/instrument/test_cuda.py runs them on the device); every other statistics
test runs them too, as one of test_stats.py's paths."""

import ast
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.instrument.conftest import interpreted_triton_kernels
from tests.instrument.test_stats import reference
from workbench.instrument.reduce import StepSums
from workbench.instrument.reduce_torch import TorchReducer, as_float, chunk_sums, sample_shift
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
    sums = kernels.batch_sums(pieces)[0].numpy()
    got = finish(np.array([x.numel() for x in pieces]), sums)
    for i, x in enumerate(pieces):
        want = reference(x)
        for key in ("numel", "min", "max", "zero_frac", "nan_count", "inf_count"):
            assert got[key][i] == pytest.approx(want[key], nan_ok=True), (i, key)
        if torch.isfinite(x).all():
            for key in ("mean", "std", "abs_mean", "norm"):
                assert got[key][i] == pytest.approx(want[key], rel=1e-5), (i, key)
    assert sums[0, SHIFT] == sample_shift(pieces[0].reshape(-1)).item()  # around the median of a sample


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
        sums = kernels.batch_sums(batch)[0].numpy()
        means = finish(np.array([x.numel() for x in batch]), sums)["mean"]
        np.testing.assert_allclose(means, [x.double().mean().item() for x in batch], rtol=1e-6)


def test_a_failing_triton_batch_falls_back_to_torchs_kernels(interpreted_triton):
    class Broken:
        @staticmethod
        def batch_sums(tensors, bins=0, edges=None):
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


def _torch_counts(tensors, bins, edges):
    lengths = np.array([x.numel() for x in tensors])
    return chunk_sums(torch.cat([as_float(x).reshape(-1) for x in tensors]), lengths, bins, edges)[3].numpy()


@pytest.mark.parametrize("bins", [8, 5], ids=["power-of-two", "other"])
@pytest.mark.parametrize("programs", [128, 2], ids=["a-program-a-row", "programs-take-rows-in-turn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_triton_histograms_count_every_value_where_torchs_kernels_do(dtype, programs, bins, interpreted_triton,
                                                                         monkeypatch):
    """Each tensor over its own range or a fixed one (values outside it in the end bins), over
    many rows; non-finite values left out, a non-finite range binning nothing: bin for bin what
    torch's kernels count (the same float arithmetic), and numpy's counts where the values are
    float32 or float64."""
    from workbench.instrument._triton_kernels import ROW
    kernels = interpreted_triton_kernels()
    monkeypatch.setattr(kernels, "PROGRAMS", programs)
    g = torch.Generator().manual_seed(2)
    tensors = [(torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)
               for n in (1, 7, 2 * ROW + 3, 3 * ROW, 900)]
    tensors[1][2] = float("nan")  # its range is NaN: nothing binned
    tensors[2][ROW + 1] = float("inf")  # over a fixed range: the infinity alone is left out
    tensors.append(torch.full((9,), 2.0, dtype=dtype))  # all in the first bin
    edges = np.full((len(tensors), 2), np.nan)
    edges[2] = (-1.0, 2.5)
    edges[4] = (0.0, 0.5)  # most values outside, in the end bins
    sums, counts = kernels.batch_sums(tensors, bins, edges)
    counts = counts.numpy()
    np.testing.assert_array_equal(counts, _torch_counts(tensors, bins, edges))
    assert counts[1].sum() == 0  # a NaN range bins nothing
    for i, n in ((0, 1), (5, 9)):  # values all equal: in the first bin
        assert counts[i].tolist() == [n] + [0] * (bins - 1)
    assert counts[2].sum() == tensors[2].numel() - 1
    if dtype in (torch.float32, torch.float64):
        x = tensors[3].numpy()  # over its own range
        np.testing.assert_array_equal(counts[3], np.histogram(x, np.linspace(x.min(), x.max(), bins + 1))[0])
        for i in (2, 4):  # over the fixed range, clamped into it
            finite = tensors[i][torch.isfinite(tensors[i])].numpy().clip(*edges[i])
            np.testing.assert_array_equal(counts[i], np.histogram(finite, np.linspace(*edges[i], bins + 1))[0])


def test_histograms_that_differ_from_torchs_are_replaced_by_torchs_with_a_warning(interpreted_triton):
    """Until checked, each histogram batch is also binned by torch's kernels: counts that differ (a
    GPU that compiles the kernel's arithmetic otherwise; here a kernel that drops a value) are
    replaced by torch's in every batch of the step, and torch's kernels bin from then on, with a
    warning; the statistics stay the kernels'."""
    kernels = interpreted_triton_kernels()

    class Miscounting:
        calls = 0

        @classmethod
        def batch_sums(cls, tensors, bins=0, edges=None):
            cls.calls += 1
            sums, counts = kernels.batch_sums(tensors, bins, edges)
            if counts is not None:
                counts[0, 0] -= 1
            return sums, counts

    reducers = interpreted_triton(kernels=Miscounting)
    step = StepSums(bins=4, reducers=reducers)
    first = [torch.randn(300) + 1, torch.randn(50) * 2, torch.randn(70).double(), torch.randn(20)]
    for i, x in enumerate(first):
        step.add(x, defer=True)
        if i == 1:
            step.flush()  # (a second float32 batch in the step: the end of a backward)
    with pytest.warns(RuntimeWarning, match=r"histogram kernel's counts differ from torch's .*\(cpu float32: 1 of 8 "
                                            r"bins, cpu float64: 1 of 4 bins, cpu float32: 1 of 4 bins\)"):
        _, counts = step.rows()
    np.testing.assert_array_equal(counts, np.concatenate([_torch_counts([x], 4, None) for x in first]))
    assert Miscounting.calls == 3
    step.reset()
    later = torch.randn(80) - 2
    step.add(later)  # to torch's kernels: no second warning (warnings are errors here)
    sums, counts = step.rows()
    assert Miscounting.calls == 3
    np.testing.assert_array_equal(counts, _torch_counts([later], 4, None))
    assert finish(np.array([80]), sums)["mean"][0] == pytest.approx(later.double().mean().item(), rel=1e-5)
    # without histograms the kernels still take the tensors (their statistics were never in question)
    plain = StepSums(reducers=reducers)
    plain.add(later)
    plain.rows()
    assert Miscounting.calls == 4


def test_histograms_that_match_torchs_are_the_kernels_own(interpreted_triton):
    """The check compares once per device and dtype: the kernel's counts are the step's, and later batches
    go to the kernels too."""
    kernels = interpreted_triton_kernels()
    batches = []

    class Counting:
        @staticmethod
        def batch_sums(tensors, bins=0, edges=None):
            batches.append(len(tensors))
            return kernels.batch_sums(tensors, bins, edges)

    torch_path = TorchReducer()
    step = StepSums(bins=4, reducers=interpreted_triton(kernels=Counting))
    for _ in range(2):
        xs = [torch.randn(200), torch.randn(30) + 3]
        for x in xs:
            step.add(x)
        _, counts = step.rows()
        want = StepSums(bins=4, reducers=[torch_path])
        for x in xs:
            want.add(x)
        np.testing.assert_array_equal(counts, want.rows()[1])
        step.reset()
    assert batches == [2, 2]


def test_histograms_of_more_bins_than_the_kernel_holds_go_to_torchs_kernels(interpreted_triton):
    from workbench.instrument.reduce_triton import KERNEL_BINS
    kernels = interpreted_triton_kernels()
    launched = []

    class Counting:
        @staticmethod
        def batch_sums(tensors, bins=0, edges=None):
            launched.append(bins)
            return kernels.batch_sums(tensors, bins, edges)

    x = torch.randn(5000)
    for bins in (KERNEL_BINS, KERNEL_BINS + 1):
        step = StepSums(bins=bins, reducers=interpreted_triton(kernels=Counting))
        step.add(x)
        counts = step.rows()[1][0]
        want = StepSums(bins=bins, reducers=[TorchReducer()])
        want.add(x)
        np.testing.assert_array_equal(counts, want.rows()[1][0])
    assert launched == [KERNEL_BINS]


def test_torchs_kernels_count_past_float32s_whole_numbers():
    """What the kernel's counts are compared with: torch's path counts in integers (a float32
    count would stop at 2**24, where adding one changes nothing)."""
    n = 2**24 + 5
    x = torch.zeros(n)
    x[-1] = 1.0
    step = StepSums(bins=2, reducers=[TorchReducer()])
    step.add(x, defer=True)
    assert step.rows()[1].tolist() == [[n - 1, 1]]


# Compiles the histogram kernel for an H100 (sm_90) without one: Triton's compiler and ptxas run on
# the CPU. Prints the PTX instructions of its float arithmetic.
_COMPILE_FOR_AN_H100 = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from workbench.instrument import _triton_kernels as k
for dtype in ("fp32", "fp16"):
    signature = {"base": "*" + dtype, "table": "*i64", "n": "i32", "programs": "i32", "sums": "*fp64",
                 "edges": "*fp64", "counts": "*i64", "ROW": "constexpr", "BLOCK": "constexpr", "SUMS": "constexpr",
                 "BINS": "constexpr", "COUNTED": "constexpr", "ACC": "constexpr"}
    constants = {"ROW": k.ROW, "BLOCK": k.BLOCK, "SUMS": 9, "BINS": 32, "COUNTED": 64, "ACC": tl.float32}
    source = ASTSource(k.tensor_histograms, signature, constants)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    print(sorted({line.split()[0] for line in ptx.splitlines()
                  if line.strip().startswith(("fma", "div", "mul.f", "sub.f", "add.f", "cvt.rzi"))}))
"""


def test_the_histogram_kernel_compiles_for_a_gpu_to_torchs_float_operations():
    """What the interpreter cannot show: the kernel's arithmetic as a GPU runs it. Compiled for an
    H100, the binning is a subtraction, a product, a truncation and one exactly rounded division,
    with no fused multiply-add (FP fusion turned an earlier kernel's ``scaled - scaled == 0`` into
    one, and it binned wrongly on the GPU alone) and no approximate division: torch's operations,
    rounded as torch rounds them."""
    pytest.importorskip("triton")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # (Triton's default up to 3.9; a kernel must hold with fusion on)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_AN_H100], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in done.stdout.splitlines():
        assert ast.literal_eval(line) == ["cvt.rzi.s32.f32", "div.rn.f64", "mul.f32", "sub.f32"], done.stdout
