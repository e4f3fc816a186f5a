"""The memory estimate experiments.create checks before it builds anything."""

import pytest
import torch

import workbench
from workbench.params import MemoryLimitError

create = workbench.experiments.create


@pytest.mark.parametrize("name", workbench.experiments.list_experiments())
def test_every_experiment_estimates_its_peak_and_the_defaults_are_small(name):
    spec = workbench.experiments.get_experiment_spec(name)
    parts = spec.cls.estimate_memory(spec.cls.Config())
    assert parts and all(isinstance(v, int) and v >= 0 for v in parts.values())
    # not so strict that a default configuration is refused anywhere: well under 1 GB
    assert 0 < sum(parts.values()) < 256 * 10**6, parts


@pytest.mark.parametrize("name, small, large", [
    ("activation_mlp", dict(width=8), dict(width=1024, depth=16)),
    ("efficientzero_dynamics", dict(batch_size=4), dict(batch_size=4096, unroll_steps=50)),
    ("ilql", dict(n_embd=16, n_head=2), dict(n_embd=1024, n_head=16, n_layer=12)),
    ("query_stream", dict(key_space=100), dict(key_space=50_000_000)),
])
def test_the_estimate_grows_with_the_config_and_the_limit_is_the_callers(name, small, large, monkeypatch):
    spec = workbench.experiments.get_experiment_spec(name)
    little = sum(spec.cls.estimate_memory(spec.cls.Config(**small)).values())
    big = sum(spec.cls.estimate_memory(spec.cls.Config(**large)).values())
    assert big > 20 * little
    with pytest.raises(MemoryLimitError, match=f"Experiment '{name}'.*memory limit of"):
        create(name, memory_limit=little // 2, **small)
    # a limit raised by the caller holds for the models the experiment builds as well: create_model
    # inside setup() does not check them again against the default limit
    monkeypatch.setenv("WORKBENCH_MEMORY_LIMIT", "1kB")
    exp = create(name, memory_limit=2 * little + 10**6, **small)
    assert exp.step()["step"] == 1


def test_a_refused_create_draws_nothing_and_builds_nothing(monkeypatch):
    built = []
    monkeypatch.setattr(workbench.experiments.get_experiment_spec("activation_mlp").cls, "setup",
                        lambda self: built.append(self))
    state = torch.get_rng_state()
    with pytest.raises(MemoryLimitError):
        create("activation_mlp", width=1024, depth=16, n_samples=1_000_000, memory_limit="1GB")
    assert built == [] and torch.equal(torch.get_rng_state(), state)
