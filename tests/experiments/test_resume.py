"""A training checkpoint: save an experiment's whole training state, resume it in a fresh process's object, go on
bit for bit; and what is refused, naming the file, before anything changes."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import workbench
from workbench import checkpoints
from workbench.experiments import create, resume
from workbench.experiments.__main__ import main

SMALL = {
    "activation_mlp": dict(width=8, batch_size=16, n_samples=64),
    "efficientzero_dynamics": dict(batch_size=4, unroll_steps=2, lstm_hidden_size=8, fc_reward_layers=[8]),
    "ilql": dict(batch_size=4, n_layer=1, n_embd=16, n_head=2, dataset_size=32, eval_every=2, eval_prompts=4),
    "query_stream": dict(key_space=200, batch_size=32),
}


def metrics(history):
    """The metrics of each step, without the one that measures time."""
    return [{k: v for k, v in m.items() if k != "rows_per_s"} for m in history]


def same(a, b) -> bool:
    """Bitwise equality of nested dicts / lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", sorted(SMALL))
def test_n_steps_saved_and_resumed_then_m_more_equal_n_plus_m_straight(name, tmp_path):
    straight = create(name, seed=3, **SMALL[name])
    history = straight.run(5, progress=False)

    first = create(name, seed=3, **SMALL[name])
    before = first.run(3, progress=False)
    first.save(tmp_path / "train.pt")
    del first
    again = resume(tmp_path / "train.pt")  # a fresh object, built from the file alone
    assert again.step_count == 3 and again.resumed_from == {"path": str(tmp_path / "train.pt"), "step": 3}
    after = again.run(2, progress=False)

    assert [m["step"] for m in after] == [4, 5]
    assert metrics(before + after) == metrics(history)  # losses and every other metric, bit for bit
    a, b = straight.state_dict(), again.state_dict()
    assert same(a["model"], b["model"])  # parameters and buffers (BatchNorm's, the target networks', a key map)
    assert same(a["optimizer"], b["optimizer"])  # Adam's moments and step counts
    assert same(a["generator"], b["generator"]) and same(a["extra"], b["extra"]) and a["step"] == b["step"] == 5


def test_a_watched_resume_numbers_its_steps_on_from_the_checkpoint(tmp_path):
    exp = create("activation_mlp", seed=0, width=8)
    exp.run(4, progress=False, save=tmp_path / "train.pt")
    again = resume(tmp_path / "train.pt")
    again.run(3, store=tmp_path / "run", progress=False)
    run = workbench.load_run(tmp_path / "run")
    assert run.steps == [5, 6, 7] and run.status == "finished"
    assert run.metadata["resumed_from"] == {"path": str(tmp_path / "train.pt"), "step": 4}
    with again.watch() as w:
        again.run(2, progress=False)
    assert sorted(w.to_pandas().step.unique().tolist()) == [8, 9]


def test_save_every_writes_at_the_experiments_multiples_and_at_the_end(tmp_path, monkeypatch):
    exp = create("activation_mlp", seed=0, width=8)
    exp.run(1, progress=False)
    written = []
    save = type(exp).save
    monkeypatch.setattr(type(exp), "save", lambda self, path: (written.append(self.step_count), save(self, path))[1])
    exp.run(5, progress=False, save=tmp_path / "train.pt", save_every=2)
    assert written == [2, 4, 6]  # (the end, step 6, is a multiple: written once)
    exp.run(1, progress=False, save=tmp_path / "train.pt", save_every=2)
    assert written == [2, 4, 6, 7] and resume(tmp_path / "train.pt").step_count == 7


@pytest.mark.parametrize("save, save_every, error", [
    (None, 2, "save_every=2 needs save=PATH"),
    ("DIR", None, "is a directory; pass a file path"),
    ("FILE/train.pt", None, "is a file, not a directory"),
    ("x.pt", 0, "save_every must be an int >= 1"),
])
def test_bad_save_arguments_are_refused_before_a_step(tmp_path, save, save_every, error):
    (tmp_path / "FILE").write_text("a file")
    exp = create("activation_mlp", seed=0, width=8)
    path = None if save is None else tmp_path if save == "DIR" else tmp_path / save
    with pytest.raises(ValueError, match=error):
        exp.run(3, progress=False, save=path, save_every=save_every)
    assert exp.step_count == 0


@pytest.fixture
def saved(tmp_path):
    exp = create("activation_mlp", seed=0, width=8)
    exp.run(3, progress=False, save=tmp_path / "train.pt")
    return tmp_path / "train.pt"


def test_files_that_are_not_training_checkpoints_are_refused_naming_the_path(saved, tmp_path):
    data = saved.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.pt").write_text("hello")
    exp = create("activation_mlp", seed=0, width=8)
    torch.save(exp.model.state_dict(), tmp_path / "weights.pt")
    torch.save({"format": "workbench.training", "version": 1, "experiment": "activation_mlp"}, tmp_path / "part.pt")
    torch.save({**torch.load(saved), "version": 99}, tmp_path / "new.pt")
    cases = {"cut.pt": "damaged or truncated", "text.pt": "is not a torch checkpoint",
             "weights.pt": "holds model weights only, not a training checkpoint",
             "part.pt": "damaged training checkpoint: its 'config' is missing",
             "new.pt": "version 99; this workbench reads up to version 1", "missing.pt": "No checkpoint file"}
    for name, error in cases.items():
        with pytest.raises(checkpoints.CheckpointError, match=error) as raised:
            resume(tmp_path / name)
        assert str(tmp_path / name) in str(raised.value)
    with pytest.raises(checkpoints.CheckpointError, match=r"checkpoints.load_weights\(experiment.model, path\)"):
        exp.load(tmp_path / "weights.pt")
    assert exp.step_count == 0


def test_a_training_checkpoint_with_meta_or_sparse_tensors_is_refused_as_the_weights_readers_refuse_them(
        saved, tmp_path):
    # (it was read, then loading the model raised torch's "While copying the parameter named ...", and a meta
    # optimizer state or generator went further still)
    state = torch.load(saved)
    key = next(iter(state["model"]))
    index, moments = next(iter(state["optimizer"]["state"].items()))
    moment = next(name for name, value in moments.items() if isinstance(value, torch.Tensor) and value.dim())
    meta = copy.deepcopy(state)
    meta["model"] = {k: torch.empty_like(v, device="meta") for k, v in state["model"].items()}
    torch.save(meta, tmp_path / "meta.pt")
    sparse = copy.deepcopy(state)
    sparse["model"][key] = state["model"][key].to_sparse()  # (the optimizer's may be: see the test below)
    torch.save(sparse, tmp_path / "sparse.pt")
    meta_moment = copy.deepcopy(state)
    meta_moment["optimizer"]["state"][index][moment] = torch.empty_like(moments[moment], device="meta")
    torch.save(meta_moment, tmp_path / "meta_moment.pt")
    generator = {**state, "generator": torch.empty_like(state["generator"], device="meta")}
    torch.save(generator, tmp_path / "generator.pt")
    cases = {"meta.pt": rf"holds {len(state['model'])} tensors without values \(model\.{key}, .*meta tensors",
             "sparse.pt": rf"holds 1 sparse tensors \(model\.{key} \(torch\.sparse_coo\)\)",
             "meta_moment.pt": rf"holds 1 tensors without values \(optimizer\.state\.{index}\.{moment}\)",
             "generator.pt": r"holds 1 tensors without values \(generator\)"}
    for name, error in cases.items():
        with pytest.raises(checkpoints.CheckpointError, match=rf"Cannot resume from '.*{name}': it {error}"):
            checkpoints.read_training_checkpoint(tmp_path / name)
        with pytest.raises(checkpoints.CheckpointError, match=error):
            resume(tmp_path / name)
    exp = create("activation_mlp", seed=0, width=8)
    with pytest.raises(checkpoints.CheckpointError, match="sparse tensors"):
        exp.load(tmp_path / "sparse.pt")
    assert exp.step_count == 0


class SparseBag(workbench.experiments.Experiment):
    """Embeddings with sparse gradients, trained by SGD with momentum, whose momentum of them is sparse."""
    name = "sparse_bag (not registered)"

    @dataclasses.dataclass
    class Config:
        vocab: int = 20

    def setup(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Embedding(self.config.vocab, 4, sparse=True), torch.nn.Flatten(),
                                         torch.nn.Linear(8, 2))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)

    def train_step(self) -> dict[str, float]:
        x = torch.randint(self.config.vocab, (5, 2), generator=self.generator)
        y = torch.randint(2, (5,), generator=self.generator)
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}


def test_an_optimizer_state_with_sparse_tensors_resumes_as_saved(tmp_path):
    # (SGD's momentum of an nn.Embedding(sparse=True) is sparse: such a checkpoint, which resumed, was refused as
    # holding "sparse tensors ... weights are read dense", as a model's sparse weights are)
    exp = SparseBag(SparseBag.Config(), seed=0)
    exp.run(3, progress=False)
    path = exp.save(tmp_path / "sparse_momentum.pt")
    assert checkpoints.read_training_checkpoint(path)["optimizer"]["state"][0]["momentum_buffer"].is_sparse
    again = SparseBag(SparseBag.Config(), seed=0)
    again.load(path)
    exp.run(2, progress=False)
    again.run(2, progress=False)
    assert again.step_count == 5
    assert same(again.model.state_dict(), exp.model.state_dict())


def test_weights_only_checkpoints_and_loading_keep_working(saved):
    # a training checkpoint's weights load as any checkpoint's, into a model alone
    ckpt = checkpoints.load_checkpoint(saved)
    assert "a training checkpoint of experiment 'activation_mlp' at step 3" in ckpt.describe()
    assert ckpt.extra["training"]["step"] == 3
    fresh = create("activation_mlp", seed=5, width=8)
    checkpoints.load_weights(fresh.model, saved)
    assert same(fresh.model.state_dict(), resume(saved).model.state_dict()) and fresh.step_count == 0


@pytest.mark.parametrize("name, seed, config, error", [
    ("efficientzero_dynamics", 0, {}, "of experiment 'activation_mlp', not 'efficientzero_dynamics'"),
    ("activation_mlp", 0, {"width": 16}, r"another config: width=8 \(this experiment's: 16\)"),
    ("activation_mlp", 1, {"width": 8}, "seed 0, not 1"),
])
def test_a_checkpoint_of_another_experiment_config_or_seed_is_refused_and_nothing_changes(saved, name, seed, config,
                                                                                           error):
    exp = create(name, seed=seed, **config)
    exp.step()
    before = exp.state_dict()
    before = {**before, "model": {k: v.clone() for k, v in before["model"].items()}}
    with pytest.raises(checkpoints.CheckpointError, match=error) as raised:
        exp.load(saved)
    assert str(saved) in str(raised.value) and "workbench.experiments.resume" in str(raised.value)
    assert exp.step_count == 1 and same(before["model"], exp.state_dict()["model"])


def test_a_model_that_does_not_fit_is_refused_and_nothing_changes(saved, tmp_path):
    state = torch.load(saved)
    key = next(iter(state["model"]))
    state["model"][key] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "edited.pt")
    with pytest.raises(checkpoints.CheckpointError, match=rf"(?s)edited.pt.*does not fit.*{key}.*\(3, 3\)"):
        resume(tmp_path / "edited.pt")
    exp = create("activation_mlp", seed=0, width=8)
    exp.step()
    model = {k: v.clone() for k, v in exp.model.state_dict().items()}
    optimizer = str(exp.optimizer.state_dict())
    with pytest.raises(checkpoints.CheckpointError, match="does not fit"):
        exp.load(tmp_path / "edited.pt")
    assert exp.step_count == 1 and same(model, exp.model.state_dict()) and optimizer == str(exp.optimizer.state_dict())


def test_a_part_that_fails_as_it_loads_puts_back_what_was_there(tmp_path):
    # the model and the optimizer fit, the extra state does not: the model loaded first is put back
    exp = create("query_stream", seed=0, key_space=50, batch_size=8)
    exp.run(2, progress=False)
    state = exp.state_dict()
    state = {**state, "model": dict(state["model"]), "extra": {"index_of_key": torch.zeros(7, dtype=torch.int64)}}
    other = create("query_stream", seed=0, key_space=50, batch_size=8)
    with pytest.raises(checkpoints.CheckpointError, match=r"int64 tensor of shape \(50,\).*Nothing was changed"):
        other.load_state_dict(state, "edited")
    assert len(other.model.hash_to_int) == 0 and other.step_count == 0


def test_loading_into_a_watched_experiment_is_refused(saved):
    exp = create("activation_mlp", seed=0, width=8)
    with exp.watch(), pytest.raises(RuntimeError, match="close its watch before loading"):
        exp.load(saved)


def test_the_command_line_saves_and_resumes_as_a_straight_run(tmp_path, capsys):
    flags = ["--config", "width=8", "--config", "n_samples=64"]
    assert main(["run", "activation_mlp", "--steps", "5", *flags, "--save", str(tmp_path / "straight.pt")]) == 0
    assert main(["run", "activation_mlp", "--steps", "3", *flags, "--save", str(tmp_path / "a.pt"),
                 "--save-every", "2"]) == 0
    assert main(["run", "activation_mlp", "--steps", "2", "--resume", str(tmp_path / "a.pt"), "--save",
                 str(tmp_path / "b.pt"), "--store", str(tmp_path / "run")]) == 0
    assert "2 steps (steps 4-5)" in capsys.readouterr().out
    assert same(torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "b.pt"))
    assert workbench.load_run(tmp_path / "run").steps == [4, 5]
    # the flags may repeat the checkpoint's settings, not change them; refused in a line, before training
    for argv, error in [(["run", "ilql", "--resume", str(tmp_path / "a.pt")], "of 'activation_mlp', not 'ilql'"),
                        (["run", "activation_mlp", "--resume", str(tmp_path / "a.pt"), "--config", "width=9"],
                         r"--config width=9 (the checkpoint's: 8)"),
                        (["run", "activation_mlp", "--save-every", "2"], "--save-every 2 needs --save PATH"),
                        (["run", "activation_mlp", "--resume", str(tmp_path)], "is not a file")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and error in err and "Traceback" not in err
    assert main(["run", "activation_mlp", "--steps", "1", "--resume", str(tmp_path / "a.pt"), *flags,
                 "--seed", "0"]) == 0


def test_state_dict_round_trips_in_memory():
    exp = create("efficientzero_dynamics", seed=1, **SMALL["efficientzero_dynamics"])
    exp.run(2, progress=False)
    snapshot = copy.deepcopy(exp.state_dict())  # (state_dict's tensors are the live ones)
    ahead = exp.run(2, progress=False)
    exp.load_state_dict(snapshot)
    assert exp.step_count == 2 and metrics(exp.run(2, progress=False)) == metrics(ahead)


def test_a_background_run_saves_as_it_goes_and_when_stopped(tmp_path):
    exp = create("activation_mlp", seed=0, width=8)
    assert exp.start(3, save=tmp_path / "train.pt", save_every=2).join() == "finished"
    assert resume(tmp_path / "train.pt").step_count == 3
    run = exp.start(10_000, save=tmp_path / "train.pt")
    run.pause()
    assert run.stop() == "stopped"  # (between two steps: a whole state, saved)
    again = resume(tmp_path / "train.pt")
    assert 3 < again.step_count == exp.step_count < 10_003 and same(again.state_dict(), exp.state_dict())
    with pytest.raises(ValueError, match="save_every=2 needs save=PATH"):
        exp.start(3, save_every=2)


def test_save_and_resume_are_refused_under_torchrun_before_anything_starts(monkeypatch, capsys):
    # (each rank draws its own batches, which a training checkpoint does not hold)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["run", "activation_mlp", "--steps", "2", "--save", "x.pt"]) == 2
    assert "Run without torchrun to save or resume" in capsys.readouterr().err
