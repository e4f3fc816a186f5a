"""Shared fixtures."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch

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
