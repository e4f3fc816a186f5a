import pytest
import torch

import workbench


def test_unroll_training_lowers_loss_and_value_prefix_error():
    exp = workbench.experiments.create("efficientzero_dynamics", seed=0, batch_size=32)
    before = exp.evaluate()
    metrics = exp.run(120)
    after = exp.evaluate()
    assert {"loss", "value_prefix_loss", "consistency_loss", "value_prefix_error", "dynamic_mean",
            "reward_mean"} <= metrics[-1].keys()
    assert after["loss"] < 0.6 * before["loss"]
    assert after["value_prefix_error"] < 0.7 * before["value_prefix_error"]
    assert after["consistency_loss"] < before["consistency_loss"]


def test_teacher_trajectories_and_value_prefix_targets():
    exp = workbench.experiments.create("efficientzero_dynamics", seed=1, unroll_steps=3, actions=3)
    z0, actions, latents, prefixes = exp.sample(5)
    assert z0.shape == (5, 8, 4, 4) and actions.shape == (5, 3) and len(latents) == len(prefixes) == 3
    # prefixes are cumulative sums of per-step rewards, each within +-reward_scale
    rewards = torch.stack([prefixes[0], prefixes[1] - prefixes[0], prefixes[2] - prefixes[1]])
    assert rewards.abs().max() <= exp.config.reward_scale + 1e-6
    z1, r1 = exp.teacher(z0, actions[:, 0])
    assert torch.equal(z1, latents[0]) and torch.allclose(r1, prefixes[0])


def test_deterministic_and_evaluate_does_not_shift_training():
    a = workbench.experiments.create("efficientzero_dynamics", seed=4, batch_size=8)
    b = workbench.experiments.create("efficientzero_dynamics", seed=4, batch_size=8)
    a.evaluate()
    assert a.run(3) == b.run(3)


def test_config_errors():
    with pytest.raises(ValueError, match="support_size must be odd"):
        workbench.experiments.create("efficientzero_dynamics", support_size=20)
    with pytest.raises(ValueError, match=r"'unroll_steps' must lie in \[1, 50\]"):
        workbench.experiments.create("efficientzero_dynamics", unroll_steps=0)
