import numpy as np
import pytest
import torch

import workbench
from workbench.experiments.activation_mlp import make_dataset


def test_training_lowers_the_loss():
    exp = workbench.experiments.create("activation_mlp", seed=0, activation="tanh")
    before = exp.evaluate()
    metrics = exp.run(300)
    after = exp.evaluate()
    assert [m["step"] for m in metrics] == list(range(1, 301))
    assert all({"loss", "accuracy"} <= m.keys() for m in metrics)
    # chance on two balanced classes is ln 2 = 0.693 and accuracy 0.5
    assert before["loss"] > 0.6
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] > 0.85


@pytest.mark.parametrize("activation", workbench.list_models(family="activation"))
def test_every_activation_trains(activation):
    exp = workbench.experiments.create("activation_mlp", seed=1, activation=activation, dataset="moons")
    first = exp.evaluate()["loss"]
    exp.run(60)
    assert exp.evaluate()["loss"] < first
    hidden = [m for m in exp.model.modules() if type(m).__name__.lower() == activation.replace("_", "")]
    assert len(hidden) == exp.config.depth


def test_same_seed_same_results_and_global_rng_untouched():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = workbench.experiments.create("activation_mlp", seed=7, activation="prelu").run(5)
    b = workbench.experiments.create("activation_mlp", seed=7, activation="prelu").run(5)
    c = workbench.experiments.create("activation_mlp", seed=8, activation="prelu").run(5)
    assert a == b
    assert a != c
    assert torch.equal(torch.get_rng_state(), state)


def test_config_is_validated():
    with pytest.raises(ValueError, match=r"'activation' must be one of \[.*'gelu'.*\], got 'swish'"):
        workbench.experiments.create("activation_mlp", activation="swish")
    with pytest.raises(TypeError, match="has no parameter 'widht'"):
        workbench.experiments.create("activation_mlp", widht=3)
    with pytest.raises(ValueError, match=r"'depth' must lie in \[1, 16\], got 0"):
        workbench.experiments.create("activation_mlp", depth=0)
    with pytest.raises(ValueError, match="Did you mean 'activation_mlp'"):
        workbench.experiments.create("activation_mpl")
    with pytest.raises(ValueError, match="non-negative int"):
        workbench.experiments.create("activation_mlp").run(-1)


@pytest.mark.parametrize("kind", ["spirals", "moons", "circles"])
def test_datasets_are_balanced_and_two_dimensional(kind):
    x, y = make_dataset(kind, 101, 0.0, torch.Generator().manual_seed(0))
    assert x.shape == (101, 2) and x.dtype == torch.float32
    assert y.tolist().count(0) == 50 and y.tolist().count(1) == 51


def test_spirals_are_point_symmetric():
    # without noise, class 1 is class 0 rotated by pi: the same radii
    x, y = make_dataset("spirals", 2000, 0.0, torch.Generator().manual_seed(0))
    r0 = x[y == 0].norm(dim=1).sort().values
    r1 = x[y == 1].norm(dim=1).sort().values
    assert abs(r0.mean() - r1.mean()) < 0.05 and r0.max() <= 1.0 + 1e-6


def test_a_watched_run_records_its_last_step_whatever_every_says():
    exp = workbench.experiments.create("activation_mlp", seed=0, width=8, depth=1, n_samples=64, batch_size=16)
    exp.run(25, every=10, progress=False)
    assert sorted(set(exp.watcher.to_pandas().step)) == [1, 11, 21, 25]
    background = exp.start(8, every=3)  # (a run on a thread of its own: steps 26 to 33, every 3rd from step 1)
    background.join()
    assert sorted(set(background.watch.to_pandas().step)) == [28, 31, 33]


def test_steps_may_be_a_numpy_integer():
    runs = [workbench.experiments.create("activation_mlp", seed=0, width=8) for _ in range(3)]
    history = runs[0].run(2, progress=False)
    assert runs[1].run(np.int64(2), progress=False) == history
    started = runs[2].start(np.int32(2))
    started.join(60)
    assert started.status == "finished" and started.history == history
    with pytest.raises(ValueError, match=r"steps must be a non-negative int, got np.float64\(2.0\)"):
        runs[0].run(np.float64(2.0), progress=False)
