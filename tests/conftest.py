"""Shared fixtures."""

import os
from datetime import timedelta

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's interpreter runs the GPU statistics kernels on the CPU (tests/instrument/test_stats.py);
    # Triton reads this as it is first imported. With a GPU, the kernels are tested on it (test_cuda.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import workbench


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from the same global RNG state and default dtype."""
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.fixture
def scratch_model():
    """Registers a throw-away model and removes it afterwards."""
    names = []

    def register(name, **kwargs):
        names.append(name)
        return workbench.register_model(name, **kwargs)

    yield register
    for name in names:
        if name in workbench.list_models():
            workbench.unregister_model(name)


@pytest.fixture
def one_rank(tmp_path):
    """torch.distributed initialized as a group of one (gloo, this process), destroyed after."""
    import torch.distributed as dist

    from workbench.instrument.distributed import destroy_process_group

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    yield
    destroy_process_group()
