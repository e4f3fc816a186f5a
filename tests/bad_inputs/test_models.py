"""Bad inputs to the registry, every registered model's builder and forward pass, probe, the memory
estimate and ILQL's checkpoints: each a clear error from workbench, naming the value and the fix, with
nothing changed (a model's weights, a QueryModule's map, an ILQL agent after a failed load)."""

from __future__ import annotations

import copy
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import workbench
from tests.bad_inputs.harness import Case, check, kept, params, same, with_env
from workbench.models.ilql import TINY_CONFIG, CheckpointError, ILQL
from workbench.models.query import HashToInt
from workbench.models.toy_language import ToyLanguageDataset
from workbench.params import MemoryLimitError

NAN, INF = float("nan"), float("inf")


# --- helpers -----------------------------------------------------------------------------

def case(id, call, error, *says, keep=None):
    """A Case; with ``keep``, one that checks ``keep()`` is unchanged by the failed call."""
    return Case(id, call, error, says) if keep is None else kept(id, call, error, says, keep)


def registry_state():
    return [(s.name, s.builder) for s in map(workbench.get_spec, workbench.list_models())]


def weights(model):
    return lambda: {k: v.clone() for k, v in model().state_dict().items()}




@functools.cache
def built(name, **overrides):
    return workbench.create_model(name, **overrides)


def mlp():
    return built("mlp")


def dynamics():
    return built("efficientzero_dynamics")


def query():
    return built("query_module")


def query_state():
    return len(query().hash_to_int), query().hash_to_int.keys


def dyn_inputs(batch=2, **change):
    model = dynamics()
    x = torch.randn(batch, model.num_channels, *model.latent_hw)
    return change.get("x", x), change.get("hidden", model.initial_hidden_state(batch))


# --- ILQL agent and checkpoints -------------------------------------------------------------

_DIR = Path(tempfile.mkdtemp(prefix="workbench-bad-checkpoints-"))


@pytest.fixture(scope="module", autouse=True)
def _remove_checkpoints():
    yield
    shutil.rmtree(_DIR, ignore_errors=True)


@functools.cache
def dataset():
    return ToyLanguageDataset(size=32, seed=1)


@functools.cache
def agent() -> ILQL:
    """A trained agent (its optimizer holds moments) with a good checkpoint saved."""
    torch.manual_seed(0)
    model = ILQL(dataset(), {**TINY_CONFIG, "n_layer": 1, "n_embd": 16, "n_head": 2, "dim_feedfwd": 32},
                 lr=1e-3, gamma=0.9)
    model.learn(dataset().sample(4, torch.Generator().manual_seed(0)))
    model.save_checkpoint(_DIR / "good.pt")
    return model


def agent_state():
    a = agent()
    return {"network": {k: v.clone() for k, v in a.state_dict().items()},
            "optimizer": copy.deepcopy(a.optimizer.state_dict()), "hyperparameters": dict(a.hyperparameters),
            "net_config": dict(a.net_config), "fitness": list(a.fitness), "steps": list(a.steps),
            "device": a.device, "ids": [id(m) for m in (a.model, a.actor, a.v, a.q, a.q2, a.optimizer)]}


def bad_checkpoint(name, change):
    """Writes the good checkpoint changed by ``change(state)`` (in place) to ``<name>.pt``; returns its path."""
    agent()
    state = torch.load(_DIR / "good.pt", weights_only=True)
    change(state)
    path = _DIR / f"{name}.pt"
    torch.save(state, path)
    return path


def load(name, change, **kwargs):
    return lambda: agent().load_checkpoint(bad_checkpoint(name, change), **kwargs)


def ckpt(id, change, error, *says, **kwargs):
    return case(id, load(id, change, **kwargs), error, *says, keep=agent_state)


def hyper(**values):
    return lambda s: s["hyperparameters"].update(values)


def network(fn):
    return lambda s: fn(s["network"])


def ilql_batch(**change):
    b = dataset().sample(4, torch.Generator().manual_seed(1))
    return {**b, **change}


def forward(**change):
    b = ilql_batch()
    args = {"tokens": b["tokens"], "state_idxs": b["state_idxs"], "action_idxs": b["action_idxs"],
            "attn_mask": b["attn_mask"], **change}
    return lambda: agent()(**args)


def ilql_config(**change):
    return {**TINY_CONFIG, "n_layer": 1, "n_embd": 16, "n_head": 2, "dim_feedfwd": 32, **change}


# --- the cases -----------------------------------------------------------------------------

REGISTRY = [
    case("unknown-name", lambda: workbench.create_model("gelú"), ValueError, "'gelú'", "did you mean 'gelu'",
         "list_models()", keep=registry_state),
    case("name-not-a-string", lambda: workbench.create_model(5), TypeError, "5", "string"),
    case("unknown-parameter", lambda: workbench.create_model("gelu", aproximate="tanh"), TypeError, "'aproximate'",
         "approximate ('none' | 'tanh', default 'none'"),
    case("bool-for-int", lambda: workbench.create_model("mlp", depth=True), TypeError, "'depth'", "True", "int"),
    case("float-for-int", lambda: workbench.create_model("mlp", width=32.0), TypeError, "'width'", "32.0", "int"),
    case("str-for-float", lambda: workbench.create_model("prelu", init="0.25"), TypeError, "'init'", "'0.25'",
         "float"),
    case("below-range", lambda: workbench.create_model("mlp", depth=0), ValueError, "'depth'", "[1, 32]", "got 0"),
    case("above-range", lambda: workbench.create_model("mlp", width=5000), ValueError, "'width'", "[1, 4096]",
         "5000"),
    case("not-a-choice", lambda: workbench.create_model("gelu", approximate="fast"), ValueError, "'approximate'",
         "'fast'", "['none', 'tanh']"),
    case("unknown-activation", lambda: workbench.create_model("mlp", activation="swish"), ValueError, "'swish'",
         "'gelu'"),
    case("prelu-init-nan", lambda: workbench.create_model("prelu", init=NAN), ValueError, "'init'", "nan",
         "finite", "0.25"),
    case("prelu-init-inf", lambda: workbench.create_model("prelu", init=float("1e400")), ValueError, "'init'",
         "inf", "finite"),
    case("prelu-init-beyond-float32", lambda: workbench.create_model("prelu", init=1e308), ValueError, "init=1e+308",
         "float32", "3.403e+38"),
    # (were torch's "Only Tensors of floating point and complex dtype can require gradients", an
    # AssertionError "Torch not compiled with CUDA enabled" and a RuntimeError listing device types)
    case("prelu-integer-dtype", lambda: workbench.create_model("prelu", dtype=torch.int64), TypeError,
         "dtype=torch.int64", "floating-point", "torch.float32"),
    case("prelu-class-bool-dtype", lambda: workbench.models.activations.PReLU(dtype=torch.bool), TypeError,
         "dtype=torch.bool", "floating-point"),
    case("prelu-unknown-device", lambda: workbench.create_model("prelu", device="gpu"), ValueError, "'gpu'",
         "cannot be used here", "'cpu'"),
    case("prelu-device-not-here", lambda: workbench.models.activations.PReLU(device="cuda:99"), ValueError,
         "'cuda:99'", "cannot be used here", "'cpu'"),
    case("prelu-class-init-nan", lambda: workbench.models.activations.PReLU(init=NAN), ValueError, "init", "nan",
         "finite"),
    case("threshold-nan", lambda: workbench.create_model("threshold", threshold=NAN), ValueError, "'threshold'",
         "nan", "finite"),
    case("threshold-value-nan", lambda: workbench.create_model("threshold", value=NAN), ValueError, "'value'",
         "nan", "finite"),
    case("threshold-value-minus-inf", lambda: workbench.create_model("threshold", value=-INF), ValueError, "'value'",
         "-inf", "finite"),
    case("ilql-lr-nan", lambda: workbench.create_model("ilql", lr=NAN), ValueError, "'lr'", "nan", "finite",
         "[1e-07, 1]"),
    case("ilql-alpha-inf", lambda: workbench.create_model("ilql", alpha=INF), ValueError, "'alpha'", "[0, 1]", "inf"),
    case("ilql-seed-too-big", lambda: workbench.create_model("ilql", seed=2**70), ValueError, "'seed'",
         str(2**70), "[0, 9223372036854775807]"),
    case("ilql-seed-negative", lambda: workbench.create_model("ilql", seed=-1), ValueError, "'seed'", "-1",
         "[0, 9223372036854775807]"),
    case("ilql-seed-float", lambda: workbench.create_model("ilql", seed=1e20), TypeError, "'seed'", "1e+20", "int"),
    case("ilql-heads-do-not-divide", lambda: workbench.create_model("ilql", n_embd=30, n_head=4), ValueError,
         "n_embd (30)", "n_head (4)", "divisible", "n_head=2"),
    case("dynamics-4d-observation", lambda: workbench.create_model("efficientzero_dynamics",
                                                                   observation_shape=[16, 6, 6, 2]),
         ValueError, "observation_shape", "[16, 6, 6, 2]", "(C, H, W)"),
    case("dynamics-zero-observation", lambda: workbench.create_model("efficientzero_dynamics",
                                                                     observation_shape=[16, 0, 6]),
         ValueError, "observation_shape", "[16, 0, 6]", "positive"),
    case("dynamics-observation-text", lambda: workbench.create_model("efficientzero_dynamics",
                                                                     observation_shape="16, 6, 6"),
         TypeError, "'observation_shape'", "'16, 6, 6'"),
    case("dynamics-channels", lambda: workbench.create_model("efficientzero_dynamics", num_channels=2,
                                                             action_encoding_dim=2),
         ValueError, "num_channels (2)", "action_encoding_dim (2)"),
    case("dynamics-norm", lambda: workbench.create_model("efficientzero_dynamics", norm_type="GN"), ValueError,
         "'norm_type'", "'GN'", "'BN'"),
    case("dynamics-no-reward-layers", lambda: workbench.create_model("efficientzero_dynamics", fc_reward_layers=[]),
         ValueError, "fc_reward_layers", "[]", "non-empty"),
    case("dynamics-bool-layer", lambda: workbench.create_model("efficientzero_dynamics", fc_reward_layers=[True]),
         TypeError, "'fc_reward_layers'", "[True]", "Sequence[int]"),
    case("atari-support", lambda: workbench.create_model("efficientzero_dynamics_atari", output_support_size=0),
         ValueError, "'output_support_size'", "got 0"),
    case("query-no-keys", lambda: workbench.create_model("query_module", in_keys=[]), ValueError, "in_keys",
         "cannot be empty"),
    case("query-keys-a-string", lambda: workbench.create_model("query_module", in_keys="observation"), TypeError,
         "'in_keys'", "'observation'", "list[str]"),
    case("query-index-key-int", lambda: workbench.create_model("query_module", index_key=5), TypeError,
         "'index_key'", "5"),
    case("get-spec-unknown", lambda: workbench.get_spec("zzz"), ValueError, "'zzz'", "list_models()"),
    case("list-models-int-pattern", lambda: workbench.list_models(5), TypeError, "pattern", "5", "'*lu'"),
    case("register-duplicate", lambda: workbench.register_model("gelu", family="user",
                                                                example_inputs=lambda m, b, g=None: ((), {}))(
        lambda: torch.nn.Identity()), ValueError, "'gelu'", "already registered", "unregister_model",
        keep=registry_state),
    case("unregister-unknown", lambda: workbench.unregister_model("zzz"), ValueError, "'zzz'", keep=registry_state),
    case("estimate-out-of-range", lambda: workbench.get_spec("mlp").estimate_memory(depth=0), ValueError,
         "'depth'", "got 0"),
]

PROBE = [
    case("probe-batch-0", lambda: workbench.probe("mlp", batch_size=0), ValueError, "batch_size", "got 0", ">= 1"),
    case("probe-batch-negative", lambda: workbench.probe("mlp", batch_size=-1), ValueError, "batch_size", "-1"),
    case("probe-batch-float", lambda: workbench.probe("mlp", batch_size=2.5), ValueError, "batch_size", "2.5"),
    case("probe-batch-bool", lambda: workbench.probe("relu", batch_size=True), ValueError, "batch_size", "True"),
    case("probe-seed-too-big", lambda: workbench.probe("mlp", seed=2**70), ValueError, "seed", str(2**70),
         "2**63 - 1"),
    case("probe-seed-1e20", lambda: workbench.probe("mlp", seed=1e20), TypeError, "seed", "1e+20", "int"),
    case("probe-unknown-name", lambda: workbench.probe("zzz"), ValueError, "'zzz'"),
    case("probe-not-a-spec", lambda: workbench.probe(5), TypeError, "5", "list_models"),
    case("probe-model-not-a-module", lambda: workbench.probe("mlp", model="mlp"), TypeError, "nn.Module", "str"),
]

MEMORY = [
    case("memory-mlp-over-limit", lambda: workbench.create_model("mlp", width=4096, depth=32, in_features=4096,
                                                                 num_classes=4096, memory_limit="1GB"),
         MemoryLimitError, "model 'mlp' (width=4096, depth=32", "2.22 GB", "memory limit of 1 GB",
         "memory_limit='3GB'", "WORKBENCH_MEMORY_LIMIT"),
    case("memory-ilql-48-layers", lambda: workbench.create_model("ilql", n_layer=48, n_embd=4096, block_size=4096,
                                                                 n_head=32, memory_limit="64GB"),
         MemoryLimitError, "n_layer=48", "n_embd=4096", "118 GB", "memory limit of 64 GB"),
    case("memory-prelu-env", with_env(lambda: workbench.create_model("prelu", num_parameters=10**9),
                                      WORKBENCH_MEMORY_LIMIT="100MB"),
         MemoryLimitError, "num_parameters=1000000000", "4 GB", "WORKBENCH_MEMORY_LIMIT='100MB'"),
    case("memory-dynamics-meta-estimate", lambda: workbench.create_model(
        "efficientzero_dynamics", norm_type="LN", observation_shape=[16, 4000, 4000], memory_limit="1GB"),
        MemoryLimitError, "observation_shape=[16, 4000, 4000]", "GB", "memory limit of 1 GB"),
    # (a size beyond 2**63 bytes: torch's meta tensors cannot count it - refused, not allocated)
    case("memory-dynamics-uncountable", lambda: workbench.create_model("efficientzero_dynamics",
                                                                       lstm_hidden_size=10**9),
         MemoryLimitError, "lstm_hidden_size=1000000000", "more bytes than a 64-bit size can count"),
    case("memory-limit-not-a-size", lambda: workbench.create_model("mlp", memory_limit="lots"), ValueError,
         "memory_limit", "'lots'", "16GB"),
    case("memory-limit-negative", lambda: workbench.create_model("mlp", memory_limit=-5), ValueError,
         "memory_limit", "-5", "positive"),
    case("memory-limit-list", lambda: workbench.create_model("mlp", memory_limit=[1]), TypeError, "memory_limit",
         "[1]"),
    case("memory-env-not-a-size", with_env(lambda: workbench.create_model("mlp"),
                                           WORKBENCH_MEMORY_LIMIT="12 parsecs"),
         ValueError, "WORKBENCH_MEMORY_LIMIT", "'12 parsecs'", "16GB"),
]

FORWARD = [
    case("gelu-list", lambda: built("gelu")([1.0, 2.0]), TypeError, "GELU", "list", "torch.Tensor"),
    case("gelu-int", lambda: built("gelu")(torch.tensor([1, 2])), TypeError, "GELU", "torch.int64", "x.float()"),
    case("relu-bool", lambda: built("relu")(torch.tensor([True])), TypeError, "ReLU", "torch.bool", "x.float()"),
    case("relu-complex", lambda: built("relu")(torch.tensor([1j])), TypeError, "ReLU", "complex64"),
    case("threshold-bool", lambda: built("threshold")(torch.tensor([True])), TypeError, "Threshold", "torch.bool"),
    case("sigmoid-list", lambda: built("sigmoid")([0.5]), TypeError, "Sigmoid", "list"),
    case("tanh-none", lambda: built("tanh")(None), TypeError, "Tanh", "NoneType"),
    case("prelu-channels", lambda: built("prelu", num_parameters=4)(torch.randn(2, 3, 5)), ValueError,
         "num_parameters=4", "(2, 3, 5)", "3 channel", "PReLU(num_parameters=3)",
         keep=weights(lambda: built("prelu", num_parameters=4))),
    case("prelu-float64", lambda: built("prelu", num_parameters=4)(torch.randn(2, 4, dtype=torch.float64)),
         TypeError, "torch.float32", "torch.float64", "x.to(torch.float32)"),
    case("mlp-shape", lambda: mlp()(torch.randn(2, 3)), ValueError, "(B, 2)", "(2, 3)", keep=weights(mlp)),
    case("mlp-int", lambda: mlp()(torch.ones(2, 2, dtype=torch.long)), TypeError, "torch.int64", "torch.float32",
         "x.to(torch.float32)"),
    case("mlp-float64", lambda: mlp()(torch.randn(2, 2, dtype=torch.float64)), TypeError, "torch.float64",
         "model.to(torch.float64)"),
    case("mlp-list", lambda: mlp()([[1.0, 2.0]]), TypeError, "MLP", "list", "(B, 2)"),
    case("mlp-device", lambda: mlp()(torch.randn(2, 2, device="meta")), ValueError, "meta", "cpu",
         "x.to('cpu')"),
    case("dynamics-channels-input", lambda: dynamics()(*dyn_inputs(x=torch.randn(2, 5, 6, 6))), ValueError,
         "18 input channels", "got 5", keep=weights(dynamics)),
    case("dynamics-3d-input", lambda: dynamics()(*dyn_inputs(x=torch.randn(18, 6, 6))), ValueError,
         "(B, 18, H, W)", "(18, 6, 6)"),
    case("dynamics-float64", lambda: dynamics()(*dyn_inputs(x=torch.randn(2, 18, 6, 6, dtype=torch.float64))),
         TypeError, "torch.float32", "torch.float64", "model.to"),
    case("dynamics-int", lambda: dynamics()(*dyn_inputs(x=torch.ones(2, 18, 6, 6, dtype=torch.long))),
         TypeError, "floating-point", "torch.int64"),
    case("dynamics-hidden-shape", lambda: dynamics()(*dyn_inputs(hidden=(torch.zeros(1, 3, 64),
                                                                         torch.zeros(1, 3, 64)))),
         ValueError, "(1, 2, 64)", "(1, 3, 64)", "torch.zeros"),
    case("dynamics-hidden-float64", lambda: dynamics()(*dyn_inputs(hidden=dynamics().initial_hidden_state(
        2, dtype=torch.float64))), TypeError, "reward_hidden_state", "torch.float64", "initial_hidden_state"),
    case("dynamics-batch-1-training", lambda: dynamics()(*dyn_inputs(batch=1)), ValueError, "batch of 1",
         "model.eval()", keep=weights(dynamics)),
    case("dynamics-spatial", lambda: dynamics()(*dyn_inputs(x=torch.randn(2, 18, 5, 5))), ValueError,
         "flatten_output_size_for_reward_head", "200"),
    case("encode-actions-range", lambda: dynamics().encode_actions(torch.randn(2, 16, 6, 6), torch.tensor([0, 5])),
         ValueError, "[0, 2)", "[0, 5]"),
    case("encode-actions-float", lambda: dynamics().encode_actions(torch.randn(2, 16, 6, 6), torch.zeros(2)),
         ValueError, "int64", "torch.float32"),
    case("encode-actions-latent", lambda: dynamics().encode_actions([1.0], torch.tensor([0])), ValueError,
         "latent", "(B, 16, H, W)", "list"),
    case("ilql-tokens-float", forward(tokens=ilql_batch()["tokens"].float()), ValueError, "tokens", "int64",
         "torch.float32", keep=agent_state),
    case("ilql-token-ids", forward(tokens=ilql_batch()["tokens"] + 100), ValueError, "[0, 16)", "vocab_size"),
    case("ilql-batch-sizes", forward(state_idxs=ilql_batch()["state_idxs"][:2]), ValueError, "batch sizes",
         "tokens 4", "state_idxs 2"),
    case("ilql-attn-mask-list", forward(attn_mask=[1, 1]), ValueError, "attn_mask", "list", "(4, 8)"),
    case("ilql-too-long", forward(tokens=torch.zeros(4, 100, dtype=torch.long), attn_mask=None), ValueError,
         "100 positions", "block_size 64"),
    case("ilql-index-range", forward(action_idxs=ilql_batch()["action_idxs"] + 50), ValueError, "action_idxs",
         "0..7"),
    case("ilql-learn-missing", lambda: agent().learn({"tokens": ilql_batch()["tokens"]}), KeyError, "attn_mask",
         "collate", keep=agent_state),
    case("ilql-learn-rewards-shape", lambda: agent().learn(ilql_batch(rewards=ilql_batch()["rewards"][:, :1])),
         ValueError, "rewards must be (4, 5)", "(4, 1)", keep=agent_state),
    case("ilql-learn-not-a-dict", lambda: agent().learn([1, 2]), TypeError, "dict", "list", keep=agent_state),
    case("ilql-generate-temperature", lambda: agent().generate(dataset().prompts(2), 3, temperature=NAN),
         ValueError, "temperature", "nan", "finite", keep=agent_state),
    case("ilql-generate-temperature-0", lambda: agent().generate(dataset().prompts(2), 3, temperature=0.0),
         ValueError, "temperature", "> 0", "0.0"),
    case("ilql-generate-eos-text", lambda: agent().generate(dataset().prompts(2), 3, eos_token_id="<eos>"),
         TypeError, "eos_token_id", "'<eos>'", "int | None"),
    case("ilql-generate-beta", lambda: agent().generate(dataset().prompts(2), 3, beta=INF), ValueError, "beta",
         "inf", "finite"),
    case("ilql-generate-prompts-float", lambda: agent().generate(dataset().prompts(2).float(), 3), ValueError,
         "prompts", "int64", "torch.float32"),
    case("ilql-generate-max-length", lambda: agent().generate(dataset().prompts(2), -1), ValueError, "max_length",
         "-1", "[0, inf]"),
    case("query-missing-key", lambda: query()({"observation": torch.zeros(2, 2)}), KeyError, "'action'",
         "['observation']", "in_keys", keep=query_state),
    case("query-complex", lambda: query()({"observation": torch.zeros(2, 2, dtype=torch.complex64),
                                           "action": torch.zeros(2, 2)}), TypeError, "complex64", "x.to(torch.int64)",
         keep=query_state),
    case("query-0d", lambda: query()({"observation": torch.tensor(1.0), "action": torch.zeros(2, 2)}), ValueError,
         "0-dimensional", "reshape(1)", keep=query_state),
    case("query-rows-differ", lambda: query()({"observation": torch.zeros(3, 2), "action": torch.zeros(2, 2)}),
         ValueError, "'observation': 3", "'action': 2", keep=query_state),
    case("query-not-a-dict", lambda: query()([torch.zeros(2, 2)]), TypeError, "TensorDict", "list",
         keep=query_state),
    case("query-extend-string", lambda: query()({"observation": torch.zeros(2, 2), "action": torch.zeros(2, 2)},
                                                extend="yes"), TypeError, "extend", "'yes'", keep=query_state),
    case("hash-to-int-float", lambda: HashToInt()(torch.zeros(3)), TypeError, "integer", "torch.float32",
         "SipHash"),
]

CHECKPOINTS = [
    case("checkpoint-missing-file", lambda: agent().load_checkpoint(_DIR / "nowhere.pt"), FileNotFoundError,
         "nowhere.pt", keep=agent_state),
    case("checkpoint-truncated", lambda: agent().load_checkpoint(
        (_DIR / "truncated.pt").write_bytes((_DIR / "good.pt").read_bytes()[:500]) and _DIR / "truncated.pt"),
        CheckpointError, "truncated.pt", "not a readable torch checkpoint", "damaged or truncated",
        "ILQL.save_checkpoint()", keep=agent_state),
    case("checkpoint-is-a-folder", lambda: agent().load_checkpoint(_DIR), CheckpointError, "is not a file",
         "pass a checkpoint file", keep=agent_state),
    case("checkpoint-whole-pickled-model", lambda: agent().load_checkpoint(
        torch.save(torch.nn.Linear(1, 1), _DIR / "pickled.pt") or _DIR / "pickled.pt"), CheckpointError,
        "pickled.pt", "torch.nn.modules.linear.Linear", "refused unread", keep=agent_state),
    # (the message named the temporary file '.agent.pt.xxxx.tmp' it could not create)
    case("checkpoint-save-where-no-folder-can-be", lambda: agent().save_checkpoint(
        (_DIR / "a-file").write_text("x") and _DIR / "a-file" / "agent.pt"), OSError,
        "cannot write the checkpoint", "a-file/agent.pt'", "nothing was written"),
    ckpt("checkpoint-foreign", lambda s: s.pop("format"), CheckpointError, "not an ILQL checkpoint",
         "save_checkpoint()"),
    ckpt("checkpoint-newer", lambda s: s.update(version=99), CheckpointError, "version 99", "upgrade workbench"),
    ckpt("checkpoint-no-optimizer", lambda s: s.pop("optimizer"), CheckpointError, "lacks ['optimizer']"),
    ckpt("checkpoint-missing-key", network(lambda n: n.pop("v.0.weight")), CheckpointError, "missing keys",
         "'v.0.weight'"),
    ckpt("checkpoint-unexpected-key", network(lambda n: n.update(extra=torch.zeros(1))), CheckpointError,
         "unexpected keys", "'extra'"),
    ckpt("checkpoint-wrong-shape", network(lambda n: n.update({"v.0.weight": torch.zeros(3, 3)})), CheckpointError,
         "'v.0.weight'", "(3, 3)", "(32, 16)"),
    ckpt("checkpoint-wrong-dtype", network(lambda n: n.update({"q.0.bias": n["q.0.bias"].double()})),
         CheckpointError, "'q.0.bias'", "torch.float64", "torch.float32"),
    ckpt("checkpoint-not-a-tensor", network(lambda n: n.update({"q.0.bias": [0.0] * 32})), CheckpointError,
         "'q.0.bias'", "must be a tensor", "list"),
    ckpt("checkpoint-net-config", lambda s: s["net_config"].update(n_head=3), CheckpointError, "n_embd (16)",
         "n_head (3)", "divisible"),
    ckpt("checkpoint-asks-for-118-GB", lambda s: s["net_config"].update(
        n_layer=48, n_embd=4096, block_size=4096, n_head=32, dim_feedfwd=4 * 4096, max_layers=48), MemoryLimitError,
        "n_layer=48", "n_embd=4096", "GB", "memory_limit=", "WORKBENCH_MEMORY_LIMIT", memory_limit="32GB"),
    ckpt("checkpoint-net-config-type", lambda s: s["net_config"].update(bias="yes"), CheckpointError,
         "net_config", "'bias'", "'yes'", "bool"),
    ckpt("checkpoint-tau", hyper(tau=5), CheckpointError, "tau=5", "0 < tau < 1"),
    ckpt("checkpoint-gamma", hyper(gamma=7), CheckpointError, "gamma=7", "0 <= gamma <= 1"),
    ckpt("checkpoint-batch-size", hyper(batch_size=-3), CheckpointError, "batch_size=-3", "batch_size >= 1"),
    ckpt("checkpoint-lr-text", hyper(lr="fast"), CheckpointError, "'lr'", "'fast'", "expects float"),
    ckpt("checkpoint-beta-nan", hyper(beta=NAN), CheckpointError, "beta", "nan", "finite"),
    ckpt("checkpoint-meta-device", hyper(device="meta"), CheckpointError, "'meta'", "no values", "'cpu'"),
    ckpt("checkpoint-absent-device", hyper(device="cuda:7"), CheckpointError, "'cuda:7'", "device='cpu'"),
    ckpt("checkpoint-device-argument-meta", lambda s: None, ValueError, "load_checkpoint: device 'meta'", "no values",
         device="meta"),
    ckpt("checkpoint-unknown-hyperparameter", hyper(temperature=1.0), CheckpointError, "unknown ['temperature']"),
    ckpt("checkpoint-missing-hyperparameter", lambda s: s["hyperparameters"].pop("alpha"), CheckpointError,
         "missing ['alpha']"),
    ckpt("checkpoint-single-q-network", hyper(double_q=False), CheckpointError, "unexpected keys", "'q2."),
    ckpt("checkpoint-optimizer-shape", lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(2)),
         CheckpointError, "'exp_avg' of parameter 0", "(2,)"),
    ckpt("checkpoint-optimizer-groups", lambda s: s["optimizer"]["param_groups"].append(
        dict(s["optimizer"]["param_groups"][0])), CheckpointError, "2 parameter group(s)", "1 group"),
    ckpt("checkpoint-fitness", lambda s: s.update(fitness="high"), CheckpointError, "fitness", "list of numbers"),
    ckpt("checkpoint-small-vocabulary", lambda s: s["net_config"].update(vocab_size=8), CheckpointError,
         "vocab_size", "(8)", "(16)"),
    case("ilql-constructor-tau", lambda: ILQL(dataset(), ilql_config(), tau=5), ValueError, "tau=5", "0 < tau < 1"),
    case("ilql-constructor-meta", lambda: ILQL(dataset(), ilql_config(), device="meta"), ValueError, "'meta'",
         "no values"),
    case("ilql-constructor-lr-nan", lambda: ILQL(dataset(), ilql_config(), lr=NAN), ValueError, "lr", "nan",
         "finite"),
    case("ilql-constructor-value-max-inf", lambda: ILQL(dataset(), ilql_config(), value_max=INF), ValueError,
         "value_max", "inf", "finite", "or None"),
    case("ilql-constructor-batch-size-bool", lambda: ILQL(dataset(), ilql_config(), batch_size=True), TypeError,
         "batch_size", "True", "int"),
    case("ilql-constructor-huge", with_env(lambda: ILQL(dataset(), ilql_config(
        n_layer=48, max_layers=48, n_embd=4096, n_head=32, dim_feedfwd=16384)), WORKBENCH_MEMORY_LIMIT="32GB"),
        MemoryLimitError, "n_layer=48", "n_embd=4096", "WORKBENCH_MEMORY_LIMIT='32GB'"),
]

CASES = REGISTRY + PROBE + MEMORY + FORWARD + CHECKPOINTS


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case):
    check(case)


def test_a_good_load_after_the_failed_ones_still_works():
    """The failed loads left the agent usable: the good checkpoint loads and gives the saved weights."""
    model = agent()
    saved = torch.load(_DIR / "good.pt", weights_only=True)
    model.load_checkpoint(_DIR / "good.pt")
    assert same(dict(model.state_dict()), saved["network"])
    model.learn(ilql_batch())
