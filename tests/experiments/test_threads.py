"""Experiments on several threads at once (the app runs each session's run on a thread of its own)."""

import torch

import workbench
from tests.threads import at_once


def train(seed, barrier=None):
    if barrier is not None:
        barrier.wait()
    exp = workbench.experiments.create("activation_mlp", seed=seed, width=16, depth=2, n_samples=256)
    initial = [p.detach().clone() for p in exp.model.parameters()]
    return initial, exp.run(6, every=2)


def test_experiments_on_several_threads_give_what_they_give_alone():
    """Initialisation and dropout draw from torch's global generator, which every thread shares:
    each experiment's numbers must still be those of its seed alone."""
    alone = {seed: train(seed) for seed in range(4)}
    together = at_once(train, range(4))
    for seed, (initial, metrics) in together.items():
        assert all(torch.equal(a, b) for a, b in zip(initial, alone[seed][0]))
        assert metrics == alone[seed][1]
    assert alone[0][1] != alone[1][1]  # (the seeds do differ)
