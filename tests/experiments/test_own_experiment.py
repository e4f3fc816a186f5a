"""An experiment of the user's own, registered with ``register_experiment``: it is created, validated,
watched, saved and resumed as the built-in ones are, and ``unregister_experiment`` takes it out again."""

import math
from dataclasses import dataclass
from typing import Annotated

import pytest
import torch

import workbench
from workbench import Range
from workbench.experiments import Experiment, evaluation, register_experiment, unregister_experiment


class SineFit(Experiment):
    """A small MLP fits sin(x) on [-pi, pi]."""

    @dataclass
    class Config:
        """Configuration of ``sine_fit``.

        Args:
            width: hidden units.
            lr: SGD learning rate.
        """

        width: Annotated[int, Range(1, 256)] = 16
        lr: Annotated[float, Range(1e-5, 1.0)] = 0.05

    def setup(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(1, self.config.width), torch.nn.Tanh(),
                                         torch.nn.Linear(self.config.width, 1)).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config.lr)

    def train_step(self):
        x = self.to_device((torch.rand(32, 1, generator=self.generator) * 2 - 1) * math.pi)
        loss = torch.nn.functional.mse_loss(self.model(x), torch.sin(x))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    @evaluation
    def evaluate(self):
        x = torch.linspace(-math.pi, math.pi, 64, device=self.device)[:, None]
        return {"loss": torch.nn.functional.mse_loss(self.model(x), torch.sin(x)).item()}


@pytest.fixture
def sine_fit():
    register_experiment("sine_fit")(SineFit)
    yield "sine_fit"
    if "sine_fit" in workbench.experiments.list_experiments():
        unregister_experiment("sine_fit")


def test_an_own_experiment_trains_records_and_resumes_as_a_built_in_one(sine_fit, tmp_path):
    assert sine_fit in workbench.experiments.list_experiments()
    spec = workbench.experiments.get_experiment_spec(sine_fit)
    assert spec.summary == "A small MLP fits sin(x) on [-pi, pi]."
    assert [(p.name, p.range, p.help) for p in spec.params] == [("width", Range(1, 256), "hidden units."),
                                                                ("lr", Range(1e-5, 1.0), "SGD learning rate.")]
    with pytest.raises(ValueError, match=r"'width' must lie in \[1, 256\], got 0"):
        workbench.experiments.create(sine_fit, width=0)

    exp = workbench.experiments.create(sine_fit, seed=0, width=8)
    exp.run(5, store=tmp_path / "sine", progress=False)
    run = workbench.load_run(tmp_path / "sine")
    assert run.status == "finished" and run.metadata["experiment"] == sine_fit and run.steps == [1, 2, 3, 4, 5]
    assert set(exp.evaluate()) == {"loss"}

    exp.save(tmp_path / "sine.pt")
    later = workbench.experiments.resume(tmp_path / "sine.pt")
    assert later.config == exp.config and [m["loss"] for m in later.run(2, progress=False)] == [
        m["loss"] for m in exp.run(2, progress=False)]


def test_a_taken_name_is_refused_and_unregistering_frees_it(sine_fit):
    with pytest.raises(ValueError, match="already registered.*unregister_experiment"):
        register_experiment(sine_fit)(SineFit)
    unregister_experiment(sine_fit)
    assert sine_fit not in workbench.experiments.list_experiments()
    with pytest.raises(ValueError, match="Unknown experiment 'sine_fit'"):
        unregister_experiment(sine_fit)
    register_experiment(sine_fit)(SineFit)  # (registered again, as a notebook cell run twice would)
    assert sine_fit in workbench.experiments.list_experiments()


def test_a_second_interrupt_as_a_step_is_recorded_names_that_step_in_its_warning(monkeypatch):
    """Ctrl-C twice as the watch recorded step 1: the warning named step 2 (the count read once it had gone up)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        exp = workbench.experiments.create("activation_mlp", seed=0, width=8)
        w = exp.watch(histograms=False)
        record = w.step

        def interrupted_twice_as_it_records(**metrics):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            return record(**metrics)

        monkeypatch.setattr(w, "step", interrupted_twice_as_it_records)
        with pytest.warns(RuntimeWarning, match="interrupted twice while step 1 was counted"):
            with pytest.raises(KeyboardInterrupt):
                exp.step()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    w.close()
