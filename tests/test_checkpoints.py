"""workbench.checkpoints: LightZero and AgileRL-layout checkpoints, read safely and checked strictly."""

import os
import pickle
import textwrap

import pytest
import torch

import workbench
from workbench import checkpoints as ck
from workbench.models.efficientzero import DynamicsNetwork
from tests.models.test_efficientzero import lightzero_keys, reference_forward

# the shapes of lightzero_keys' defaults: 4 latent channels + 2 action planes at 5x5, 2 blocks, LSTM 8
SMALL = dict(observation_shape=(4, 5, 5), action_encoding_dim=2, num_res_blocks=2, num_channels=6,
             reward_head_channels=3, fc_reward_layers=[7, 7], output_support_size=11,
             flatten_output_size_for_reward_head=75, lstm_hidden_size=8)


def lightzero_state(seed=0, norm_type="BN"):
    """A dynamics state made from LightZero's key layout alone (no workbench model, no lightzero)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in lightzero_keys(norm_type).items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(7)
        elif key.endswith("running_var"):
            state[key] = torch.rand(shape, generator=g) + 0.5
        else:
            state[key] = torch.randn(shape, generator=g) * 0.3
    return state


def whole_efficientzero(dynamics):
    """LightZero's saved dict of a whole EfficientZero model: the dynamics network's keys among the others."""
    model = {"representation_network.conv.weight": torch.randn(4, 3, 3, 3),
             "prediction_network.fc_value.0.weight": torch.randn(8, 4),
             **{f"dynamics_network.{k}": v for k, v in dynamics.items()},
             "projection.0.weight": torch.randn(8, 8)}
    return {"model": model, "target_model": model, "optimizer": {"state": {}, "param_groups": []}, "last_iter": 10}


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 6, 5, 5, generator=g), (torch.randn(1, 3, 8, generator=g), torch.randn(1, 3, 8, generator=g))


@pytest.mark.parametrize("layout", ["state_dict", "lightzero_saved", "whole_model", "data_parallel"])
def test_a_lightzero_layout_builds_the_network_that_computes_lightzeros_forward(tmp_path, layout):
    state = lightzero_state()
    payload = {"state_dict": state, "lightzero_saved": {"model": state, "optimizer": {}},
               "whole_model": whole_efficientzero(state),
               "data_parallel": {f"module.{k}": v for k, v in state.items()}}[layout]
    path = tmp_path / "ckpt.pth.tar"
    torch.save(payload, path)
    checkpoint = ck.load_checkpoint(path)
    assert checkpoint.kind == "lightzero_dynamics"
    assert set(checkpoint.state_dict) == set(lightzero_keys("BN"))
    config = ck.dynamics_config(checkpoint.state_dict)
    assert config["observation_shape"] == [4, 5, 5] and config["fc_reward_layers"] == [7, 7]
    model, name = ck.build_model(checkpoint)
    assert name == "efficientzero_dynamics" and not model.training
    x, hidden = inputs()
    latent, (h, c), value_prefix = model(x.clone(), hidden)
    want = reference_forward(state, x, hidden, "BN", training=False)  # LightZero's forward, restated
    for got, ref in [(latent, want[0]), (h, want[1][0]), (c, want[1][1]), (value_prefix, want[2])]:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_the_same_outputs_as_the_module_it_was_saved_from(tmp_path):
    source = workbench.create_model("efficientzero_dynamics_atari", last_linear_layer_init_zero=False).eval()
    torch.save({"model": {f"dynamics_network.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "a.pt")
    model, name = ck.build_model(ck.load_checkpoint(tmp_path / "a.pt"))
    (args, kwargs), outputs = ck.example_outputs(model, name, batch_size=2)
    with torch.no_grad():
        expected = source(*args, **kwargs)
    assert torch.equal(outputs[0], expected[0]) and torch.equal(outputs[2], expected[2])
    assert torch.equal(outputs[1][0], expected[1][0])


def test_layer_norm_checkpoint_reads_its_latent_size_from_the_norms(tmp_path):
    torch.save(lightzero_state(norm_type="LN"), tmp_path / "ln.pt")
    model, _ = ck.build_model(ck.load_checkpoint(tmp_path / "ln.pt"))
    assert model.norm_type == "LN" and model.latent_hw == (5, 5)


def test_weights_go_into_an_experiments_model_and_train_from_there(tmp_path):
    exp = workbench.experiments.create("efficientzero_dynamics", latent_channels=4, actions=2, spatial=5,
                                       num_res_blocks=2, lstm_hidden_size=8, support_size=11, fc_reward_layers=[7, 7])
    state = lightzero_state()
    # the experiment's reward head has 8 channels: give the checkpoint that shape
    exp_shapes = {k: tuple(v.shape) for k, v in exp.model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    state = {k: torch.randn(exp_shapes[k], generator=g) if v.is_floating_point() and tuple(v.shape) != exp_shapes[k]
             else v for k, v in state.items()}
    torch.save({"model": state}, tmp_path / "w.pt")
    ck.load_weights(exp.model, tmp_path / "w.pt")
    assert torch.equal(exp.model.conv.weight, state["conv.weight"])
    metrics = exp.step()
    assert torch.isfinite(torch.tensor(metrics["loss"]))


def test_another_architecture_is_refused_with_a_readable_diff(tmp_path):
    mlp = workbench.experiments.create("activation_mlp").model
    torch.save(mlp.state_dict(), tmp_path / "mlp.pt")
    target = workbench.create_model("efficientzero_dynamics")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(target, tmp_path / "mlp.pt")
    text = str(err.value)
    assert "missing (" in text and "conv.weight" in text
    assert "unexpected (" in text and "layers.0.weight" in text
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())  # nothing copied
    with pytest.raises(ck.CheckpointError, match="names no model to build"):
        ck.build_model(ck.load_checkpoint(tmp_path / "mlp.pt"))


def test_mis_shaped_keys_are_listed_with_both_shapes_and_the_settings_that_fit(tmp_path):
    torch.save(lightzero_state(), tmp_path / "small.pt")
    exp = workbench.experiments.create("efficientzero_dynamics")
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(exp.model, tmp_path / "small.pt")
    text = str(err.value)
    assert "conv.weight checkpoint (4, 6, 3, 3) vs model (8, 12, 3, 3)" in text
    assert "latent_channels=4, actions=2, spatial=5, num_res_blocks=2" in text


def test_ilql_checkpoint_in_agilerls_layout(tmp_path):
    agent = workbench.create_model("ilql", n_layer=1, n_embd=32, n_head=4)
    agent.save_checkpoint(tmp_path / "agent.pt")
    checkpoint = ck.load_checkpoint(tmp_path / "agent.pt")
    assert checkpoint.kind == "agilerl_ilql" and checkpoint.extra["net_config"]["n_embd"] == 32
    model, name = ck.build_model(checkpoint)
    for key, value in agent.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    exp = workbench.experiments.create("ilql", n_layer=1, n_embd=32, n_head=4, eval_every=0, dataset_size=64)
    ck.load_weights(exp.model, checkpoint)
    for key, value in agent.state_dict().items():
        assert torch.equal(exp.model.state_dict()[key], value), key
    wrong = workbench.experiments.create("ilql", n_layer=2, n_embd=64, eval_every=0, dataset_size=64)
    with pytest.raises(ck.CheckpointError, match="n_layer=1, n_embd=32"):
        ck.load_weights(wrong.model, checkpoint)


def test_weights_that_hold_nan_say_so(tmp_path):
    torch.save({"layers.0.weight": torch.tensor([[1.0, float("nan")]]), "layers.0.bias": torch.zeros(1),
                "steps": torch.tensor(3)}, tmp_path / "nan.pt")
    text = ck.load_checkpoint(tmp_path / "nan.pt").describe()
    assert text.endswith("; 1 of them hold NaN or Inf (layers.0.weight): a model started from these weights "
                         "computes NaN from its first step")
    torch.save({"w": torch.ones(2)}, tmp_path / "fine.pt")
    assert "NaN" not in ck.load_checkpoint(tmp_path / "fine.pt").describe()


def test_random_bytes_are_not_a_checkpoint(tmp_path):
    (tmp_path / "random.bin").write_bytes(os.urandom(10 * 2**20))
    with pytest.raises(ck.CheckpointError, match="not a torch checkpoint"):
        ck.load_checkpoint(tmp_path / "random.bin")


def test_size_is_checked_before_reading(tmp_path, monkeypatch):
    (tmp_path / "big.pt").write_bytes(b"PK\x03\x04" + bytes(5000))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("read a file over the limit"))
    with pytest.raises(ck.CheckpointError, match=r"over the limit of 1,000 bytes.*max_bytes=5004"):
        ck.load_checkpoint(tmp_path / "big.pt", max_bytes=1000)


class _Payload:
    """Unpickling this runs code: it would create the file named."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_a_pickle_with_code_is_refused_and_does_not_run(tmp_path, writer):
    marker = tmp_path / "ran"
    payload = {"conv.weight": torch.zeros(2), "evil": _Payload(marker)}
    if writer == "torch.save":
        torch.save(payload, tmp_path / "evil.pt")
    else:
        (tmp_path / "evil.pt").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(ck.CheckpointError, match="refused unread.*nothing in it ran"):
        ck.load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_whole_pickled_model_is_refused_naming_its_class_and_the_fix(tmp_path):
    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 4)), tmp_path / "whole.pt")
    with pytest.raises(ck.CheckpointError) as info:
        ck.load_checkpoint(tmp_path / "whole.pt")
    message = str(info.value)
    assert "of class torch.nn.modules.container.Sequential (e.g. a whole model saved with" in message
    assert message.endswith("Save the weights alone with torch.save(model.state_dict(), path).")


def test_a_dict_with_the_model_under_model_is_not_called_lightzeros(tmp_path):
    torch.save({"model": torch.nn.Linear(3, 4).state_dict(), "epoch": 3}, tmp_path / "mine.pt")
    checkpoint = ck.load_checkpoint(tmp_path / "mine.pt")
    assert checkpoint.kind == ck.STATE_DICT and set(checkpoint.state_dict) == {"weight", "bias"}
    assert "LightZero" not in checkpoint.describe() and "under 'model'" in checkpoint.describe()


def test_truncated_and_empty_files(tmp_path):
    torch.save(lightzero_state(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ck.CheckpointError, match="damaged or truncated"):
        ck.load_checkpoint(tmp_path / "cut.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ck.CheckpointError, match="empty"):
        ck.load_checkpoint(tmp_path / "empty.pt")
    with pytest.raises(ck.CheckpointError, match="No checkpoint file"):
        ck.load_checkpoint(tmp_path / "absent.pt")


def test_tensors_that_are_not_a_state_dict(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ck.CheckpointError, match="not model weights"):
        ck.load_checkpoint(tmp_path / "list.pt")
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        ck.load_checkpoint(tmp_path / "list.pt", max_bytes=0)


def test_contradicting_shapes_make_no_network(tmp_path):
    state = lightzero_state()
    state["lstm.weight_ih_l0"] = torch.zeros(32, 74)  # 74 is not 3 x H x W
    torch.save(state, tmp_path / "odd.pt")
    with pytest.raises(ck.CheckpointError, match="LSTM's input size 74"):
        ck.build_model(ck.load_checkpoint(tmp_path / "odd.pt"))


def test_the_workbench_model_has_lightzeros_layout():
    # (what makes the checkpoints above LightZero's: the keys the test writes out by hand)
    assert {k: tuple(v.shape) for k, v in DynamicsNetwork(**SMALL).state_dict().items()} == lightzero_keys("BN")


def test_a_query_modules_map_loads_into_a_fresh_one_at_any_size(tmp_path):
    # (load_weights refused it: "mis-shaped: hash_to_int.keys checkpoint (5,) vs model (0,)", though the
    # map is saved to be loaded into a fresh process)
    seen = workbench.create_model("query_module")
    rows = {"observation": torch.randn(5, 4), "action": torch.arange(5)}
    first = seen(dict(rows))["_index"]
    torch.save(seen.state_dict(), tmp_path / "map.pt")
    fresh = workbench.create_model("query_module")
    ck.load_weights(fresh, tmp_path / "map.pt")
    assert len(fresh.hash_to_int) == 5
    assert torch.equal(fresh(dict(rows), extend=False)["_index"], first)
    # a map whose contents are not one is refused, and the module keeps its own
    state = seen.state_dict()
    state["hash_to_int.values"] = torch.zeros(5, dtype=torch.int64)
    torch.save(state, tmp_path / "bad_map.pt")
    with pytest.raises(ck.CheckpointError, match=r"'values' must be the indices 0\.\.4, each once"):
        ck.load_weights(fresh, tmp_path / "bad_map.pt")
    assert len(fresh.hash_to_int) == 5 and torch.equal(fresh(dict(rows), extend=False)["_index"], first)
    # other keys keep their strict shapes
    state = seen.state_dict()
    key = next(k for k in state if k not in ("hash_to_int.keys", "hash_to_int.values"))
    state[key] = torch.zeros(99, dtype=state[key].dtype)
    torch.save(state, tmp_path / "odd.pt")
    with pytest.raises(ck.CheckpointError, match=f"mis-shaped \\(1\\): {key} checkpoint \\(99,\\)"):
        ck.load_weights(fresh, tmp_path / "odd.pt")


def test_values_that_a_cast_would_cut_are_refused_before_anything_is_copied(tmp_path):
    # (complex weights went into a float model with torch's UserWarning and their imaginary parts dropped)
    model = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"weight": torch.ones(2, 2, dtype=torch.complex64), "bias": torch.zeros(2)}, tmp_path / "c.pt")
    with pytest.raises(ck.CheckpointError, match=r"weight \(torch.complex64 into torch.float32\).*Nothing was copied"):
        ck.load_weights(model, tmp_path / "c.pt")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    counter = torch.nn.BatchNorm1d(2)
    state = {k: v.clone() for k, v in counter.state_dict().items()}
    state["num_batches_tracked"] = torch.tensor(2.5)
    torch.save(state, tmp_path / "f.pt")
    with pytest.raises(ck.CheckpointError, match=r"num_batches_tracked \(torch.float32 into torch.int64\)"):
        ck.load_weights(counter, tmp_path / "f.pt")
    # integers the model's integer or bool dtype cannot hold (300 into uint8 read 44, 2 into bool True, silently)
    flags = torch.nn.Module()
    flags.register_buffer("mask", torch.zeros(3, dtype=torch.bool))
    flags.register_buffer("count", torch.zeros((), dtype=torch.uint8))
    torch.save({"mask": torch.tensor([0, 2, 1]), "count": torch.tensor(300)}, tmp_path / "i.pt")
    with pytest.raises(ck.CheckpointError, match=r"mask \(torch.int64 into torch.bool: values 0 to 2, outside 0 to "
                       r"1\), count \(torch.int64 into torch.uint8: values 300 to 300, outside 0 to 255\)"):
        ck.load_weights(flags, tmp_path / "i.pt")
    assert not flags.mask.any() and flags.count == 0
    torch.save({"mask": torch.tensor([0, 1, 1]), "count": torch.tensor(255)}, tmp_path / "fits.pt")
    ck.load_weights(flags, tmp_path / "fits.pt")  # (integers the dtype holds: cast as load_state_dict does)
    assert flags.mask.tolist() == [False, True, True] and flags.count == 255
    # a float64 checkpoint into a float32 model is a cast that keeps the values: loaded
    torch.save({k: v.double() for k, v in model.state_dict().items()}, tmp_path / "d.pt")
    ck.load_weights(model, tmp_path / "d.pt")


@pytest.mark.parametrize("settings, says", [
    ({"block_size": 32}, "block_size=32 (the experiment's: 64)"),
    ({"activation": "relu"}, "activation='relu' (the experiment's: 'gelu')"),  # same keys: it would have loaded
    ({"double_q": False}, "double_q=False (the experiment's: True)"),
])
def test_an_ilql_checkpoint_the_experiment_cannot_build_names_no_experiment(tmp_path, settings, says):
    # (experiment_settings named 'ilql' with n_layer, n_embd and n_head: the experiment's model then
    # refused it as mis-shaped, or - another activation - took it and computed another function)
    workbench.create_model("ilql", n_layer=1, n_embd=16, n_head=2, **settings).save_checkpoint(tmp_path / "a.pt")
    checkpoint = ck.load_checkpoint(tmp_path / "a.pt")
    assert ck.experiment_settings(checkpoint) == (None, {})
    assert says in ck.hint(checkpoint) and "checkpoints.build_model(checkpoint)" in ck.hint(checkpoint)
    workbench.create_model("ilql", n_layer=1, n_embd=16, n_head=2, dropout=0.1).save_checkpoint(tmp_path / "b.pt")
    fits = ck.load_checkpoint(tmp_path / "b.pt")  # (dropout shapes nothing: the experiment trains it)
    name, config = ck.experiment_settings(fits)
    assert (name, config) == ("ilql", {"n_layer": 1, "n_embd": 16, "n_head": 2})
    ck.load_weights(workbench.experiments.create(name, **config, dataset_size=16).model, fits)


@pytest.mark.parametrize("settings, says", [
    ({"num_res_blocks": 17}, "parameter 'num_res_blocks' must lie in [0, 16], got 17"),
    ({"output_support_size": 20}, "support_size must be odd, got 20"),
])
def test_a_dynamics_checkpoint_beyond_the_experiments_ranges_names_no_experiment(tmp_path, settings, says):
    # (experiment_settings named efficientzero_dynamics with settings its create() then refused)
    net = workbench.create_model("efficientzero_dynamics", reward_head_channels=8, lstm_hidden_size=8, **settings)
    torch.save(net.state_dict(), tmp_path / "net.pt")
    checkpoint = ck.load_checkpoint(tmp_path / "net.pt")
    assert ck.experiment_settings(checkpoint) == (None, {})
    assert says in ck.hint(checkpoint) and "inspected but not trained there" in ck.hint(checkpoint)


def test_a_checkpoint_of_meta_tensors_is_refused_as_one_without_values(tmp_path):
    # (it read, then describe() and load_weights raised torch's "Tensor.item() cannot be called on meta tensors")
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.device("meta"):
        torch.save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "meta.pt")
    with pytest.raises(ck.CheckpointError, match=r"'meta.pt' holds 2 tensors without values \(weight, bias\)"):
        ck.load_checkpoint(tmp_path / "meta.pt")
    with pytest.raises(ck.CheckpointError, match="without values"):
        ck.load_weights(model, tmp_path / "meta.pt")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_checkpoint_of_sparse_tensors_is_refused_saying_to_save_them_dense(tmp_path):
    # (describe() and load_weights raised torch's NotImplementedError for 'aten::ne.Scalar' on SparseCPU)
    torch.save({"weight": torch.eye(2, 3).to_sparse(), "bias": torch.zeros(2)}, tmp_path / "sparse.pt")
    with pytest.raises(ck.CheckpointError, match=r"holds 1 sparse tensors \(weight \(torch.sparse_coo\)\).*to_dense"):
        ck.load_weights(torch.nn.Linear(3, 2), tmp_path / "sparse.pt")


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."])
def test_the_prefixes_of_wrapped_models_are_taken_off_in_any_order(tmp_path, prefix):
    # (_orig_mod.module., torch.compile of a DDP model, kept its module. prefix: no key fitted)
    source = torch.nn.Linear(3, 2)
    torch.save({prefix + k: v for k, v in source.state_dict().items()}, tmp_path / "wrapped.pt")
    model = torch.nn.Linear(3, 2)
    ck.load_weights(model, tmp_path / "wrapped.pt")
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items())


def test_a_prefix_is_taken_off_once_leaving_a_child_named_module(tmp_path):
    wrapper = torch.nn.Module()
    wrapper.module = torch.nn.Linear(3, 2)  # (its keys: module.weight, module.bias)
    torch.save({"module." + k: v for k, v in wrapper.state_dict().items()}, tmp_path / "ddp.pt")
    ck.load_weights(wrapper, tmp_path / "ddp.pt")


def test_the_module_docstring_example_runs_as_written(tmp_path, monkeypatch):
    # the module's docstring is the API reference's first example: it runs on a LightZero file of that name
    block = ck.__doc__.split("Read safely, check strictly, then build::\n", 1)[1].split("\n\n", 1)[0]
    monkeypatch.chdir(tmp_path)
    source = workbench.experiments.create("efficientzero_dynamics", seed=1).model  # (its network, other weights)
    torch.save({"model": source.state_dict()}, "efficientzero.pth.tar")
    namespace = {"experiment": workbench.experiments.create("efficientzero_dynamics")}
    exec(compile(textwrap.dedent(block), "checkpoints docstring", "exec"), namespace)
    assert isinstance(namespace["model"], DynamicsNetwork) and namespace["name"] == "efficientzero_dynamics"
    assert all(torch.equal(namespace["experiment"].model.state_dict()[key], value)
               for key, value in source.state_dict().items())


def test_a_state_dict_in_memory_is_refused_saying_how_to_load_it():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"file path \(str or Path\), or given as the Checkpoint .* got OrderedDict "
                                        r"\(a checkpoint held in memory, such as a state_dict: save it with "
                                        r"torch.save\(state_dict, path\) and pass the path\)\."):
        ck.load_weights(model, model.state_dict())
    with pytest.raises(TypeError, match=r"got int\.$"):
        ck.load_checkpoint(3)
