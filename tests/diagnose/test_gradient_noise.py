"""Per-sample gradient statistics (torch.func) against a loop of one backward per sample."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workbench.diagnose import gradient_noise

from tests.diagnose.conftest import mlp


def loss_fn(forward, x, y):
    return F.cross_entropy(forward(x), y)


def reference(model, x, y):
    """Each sample's gradient by its own backward pass."""
    grads = {name: [] for name, _ in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for name, p in model.named_parameters():
            grads[name].append(p.grad.detach().reshape(-1).double().numpy().copy())
    return {name: np.stack(g) for name, g in grads.items()}


@pytest.mark.parametrize("chunk_size", [None, 3, np.int64(3)])
def test_statistics_equal_those_of_one_backward_per_sample(chunk_size):
    torch.manual_seed(0)
    model = mlp("tanh", width=8)
    x = torch.randn(10, 2)
    y = (x[:, 0] > 0).long()
    frame = gradient_noise(model, loss_fn, x, y, chunk_size=chunk_size).set_index("parameter")
    assert all(p.grad is None for p in model.parameters())  # (the model's own gradients are left alone)
    ref = reference(model, x, y)
    assert list(frame.index) == [name for name, _ in model.named_parameters()]
    for name, g in ref.items():
        mean = g.mean(0)
        variance = g.var(0, ddof=1).sum()
        row = frame.loc[name]
        assert row.batch == 10 and row.numel == g.shape[1]
        np.testing.assert_allclose(row.grad_norm, np.linalg.norm(mean), rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(row.sample_norm, np.linalg.norm(g, axis=1).mean(), rtol=1e-4)
        np.testing.assert_allclose(row.variance, variance, rtol=1e-4, atol=1e-12)
        np.testing.assert_allclose(row.snr, (mean @ mean) / (variance / 10), rtol=1e-3)
        np.testing.assert_allclose(row.noise_scale, variance / (mean @ mean), rtol=1e-3)


def test_identical_samples_have_no_noise():
    model = mlp("relu", width=8)
    x = torch.randn(1, 2).repeat(6, 1)
    y = torch.zeros(6, dtype=torch.long)
    frame = gradient_noise(model, loss_fn, x, y)
    np.testing.assert_allclose(frame.variance, 0.0, atol=1e-10)


def test_bad_input_says_what_was_expected():
    model = mlp("relu", width=8)
    x, y = torch.randn(4, 2), torch.zeros(4, dtype=torch.long)
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        gradient_noise(object(), loss_fn, x, y)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        gradient_noise(model, 3, x, y)
    with pytest.raises(TypeError, match="needs the batch as tensors"):
        gradient_noise(model, loss_fn, [1, 2], y)
    with pytest.raises(ValueError, match=r"share a batch size of at least 2.*\[4, 3\]"):
        gradient_noise(model, loss_fn, x, y[:3])
    with pytest.raises(ValueError, match="chunk_size must be None or a positive int, got 0"):
        gradient_noise(model, loss_fn, x, y, chunk_size=0)
    frozen = mlp("relu", width=8).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires a gradient"):
        gradient_noise(frozen, loss_fn, x, y)
