"""Fixtures of the instrumentation tests: the reduction paths, each chosen per instance."""

import os

import numpy as np
import pytest

from workbench.instrument.reduce_cpu import CompiledCpuReducer
from workbench.instrument.reduce_torch import TorchReducer
from workbench.instrument.reduce_triton import TritonReducer


def interpreted_triton_kernels():
    """The Triton kernels' module under Triton's interpreter, which runs them on the CPU (numpy
    standing in for the GPU): the kernels' arithmetic, tested without a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":  # (tests/conftest.py sets it where there is no GPU)
        pytest.skip("Triton's interpreter is off (a CUDA device is present: test_cuda.py runs the kernels on it)")
    pytest.importorskip("triton")
    from workbench.instrument import _triton_kernels
    return _triton_kernels


def compiled_reducers():
    """CPU tensors by the compiled kernels (the default for CPU tensors)."""
    return [CompiledCpuReducer(), TorchReducer()]


def torch_reducers():
    """Every tensor by torch's kernels: the path of tensors on devices without Triton."""
    return [TorchReducer()]


@pytest.fixture
def interpreted_triton():
    """A maker of reducer lists in which CPU tensors take the path of CUDA tensors (batched, reduced
    by the Triton kernels, interpreted)."""
    kernels = interpreted_triton_kernels()

    def make(kernels=kernels):
        fallback = TorchReducer()
        return [TritonReducer(fallback, devices={"cpu"}, kernels=kernels), fallback]

    before = np.seterr(all="ignore")  # the interpreter's numpy arithmetic meets NaN and inf as a GPU would
    yield make
    np.seterr(**before)
