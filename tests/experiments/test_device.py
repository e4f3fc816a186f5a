"""The ``device`` an experiment trains on: checked up front, data drawn on the CPU and moved."""

import pytest
import torch

import workbench
from workbench.experiments import base, resolve_device


@pytest.mark.parametrize("device, message", [
    ("gpu", "device 'gpu' cannot be used here"),
    ("cuda:99" if torch.cuda.is_available() else "cuda", "device 'cuda(:99)?' cannot be used here"),
    ("meta", "holds shapes but no values"),
])
def test_a_device_this_process_cannot_use_is_refused_up_front(device, message):
    with pytest.raises(ValueError, match=message):
        workbench.experiments.create("activation_mlp", device=device)


def test_the_refusal_lists_the_devices_this_process_has(monkeypatch):
    # (it named 'cuda' as one this process has, on a machine without a GPU)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError,
                       match=r"device 'gpu' cannot be used here \(.*\); pass one this process has: 'cpu'\.$"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"pass one this process has: 'cpu', 'cuda:0', 'cuda:1'\.$"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)  # (a Mac's GPU)
    with pytest.raises(ValueError, match=r"pass one this process has: 'cpu', 'cuda:0', 'cuda:1', 'mps'\.$"):
        resolve_device("gpu")


def test_an_experiment_that_runs_on_the_cpu_only_says_so(monkeypatch):
    monkeypatch.setattr(base, "resolve_device", torch.device)  # as if this process had a GPU
    with pytest.raises(ValueError, match="'query_stream' runs on the CPU only, got device 'cuda'.*device='cpu'"):
        workbench.experiments.create("query_stream", device="cuda")


def test_batches_are_moved_to_the_device_whatever_their_nesting():
    exp = workbench.experiments.create("efficientzero_dynamics", device="cpu")
    assert exp.device == torch.device("cpu") == resolve_device("cpu")
    target = torch.device("meta")  # a device every torch has; to_device does not care what it is
    exp.device = target
    moved = exp.to_device((torch.ones(2), [torch.zeros(1), {"a": torch.ones(3)}], 7))
    assert moved[0].device == moved[1][0].device == moved[1][1]["a"].device == target
    assert isinstance(moved[1], list) and moved[2] == 7


def test_an_ilql_agent_moved_with_to_sends_its_batches_after_it():
    agent = workbench.create_model("ilql")
    assert agent.device == "cpu"
    agent.to("meta")
    assert agent.device == "meta" and next(agent.parameters()).is_meta


class _Draws(base.Experiment):
    """Its steps draw from the global RNG, as dropout does."""

    name = "draws"

    def setup(self):
        self.model = torch.nn.Linear(1, 1)

    def train_step(self):
        return {"loss": torch.rand(()).item()}


def test_a_step_draws_from_the_global_rng_seeded_by_the_experiment_and_leaves_the_callers_alone():
    torch.manual_seed(123)
    first = _Draws(None, seed=5).run(3)
    caller = torch.rand(())
    torch.manual_seed(456)
    assert _Draws(None, seed=5).run(3) == first  # whatever the caller's RNG state
    assert len({m["loss"] for m in first}) == 3  # each step its own draw
    assert _Draws(None, seed=6).run(3) != first
    torch.manual_seed(123)
    assert torch.rand(()) == caller  # two experiments of 3 steps drew nothing from the caller's RNG
