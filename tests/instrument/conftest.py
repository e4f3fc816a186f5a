"""Fixtures of the instrumentation tests."""

import os

import numpy as np
import pytest

from workbench.instrument import stats


def interpreted_triton_kernels():
    """The Triton kernels' module under Triton's interpreter, which runs them on the CPU (numpy
    standing in for the GPU): the kernels' arithmetic, tested without a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":  # (tests/conftest.py sets it where there is no GPU)
        pytest.skip("Triton's interpreter is off (a CUDA device is present: test_cuda.py runs the kernels on it)")
    pytest.importorskip("triton")
    from workbench.instrument import _triton_kernels
    return _triton_kernels


@pytest.fixture
def interpreted_triton(monkeypatch):
    """CPU tensors take the path of CUDA tensors (staged, reduced by the Triton kernels)."""
    monkeypatch.setattr(stats, "COMPILED", False)
    monkeypatch.setattr(stats, "TRITON_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(stats, "_triton", interpreted_triton_kernels())
    before = np.seterr(all="ignore")  # the interpreter's numpy arithmetic meets NaN and inf as a GPU would
    yield
    np.seterr(**before)
