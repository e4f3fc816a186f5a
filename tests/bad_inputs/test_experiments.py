"""Bad inputs to the experiments: names, seeds, devices, configs, the memory estimate, step counts and
evaluation arguments. Each is a clear error from workbench naming the value and the fix; a refused
create() leaves torch's global generator as it was, a refused run() or evaluate() the experiment."""

from __future__ import annotations

import functools

import pytest
import torch

import workbench
from tests.bad_inputs.harness import check, kept, params, with_env
from workbench.params import MemoryLimitError

create = workbench.experiments.create
NAN, INF = float("nan"), float("inf")


def case(id, call, error, *says, keep=None):
    """A Case that checks ``keep()`` is unchanged by the failed call; by default the global RNG's
    state (a create() that fails must not have drawn from it)."""
    return kept(id, call, error, says, keep or torch.get_rng_state)


@functools.cache
def experiment(name):
    small = {"activation_mlp": dict(width=8, n_samples=64, batch_size=16),
             "efficientzero_dynamics": dict(batch_size=4, unroll_steps=2, lstm_hidden_size=16),
             "ilql": dict(batch_size=4, dataset_size=16, n_embd=16, n_head=2, n_layer=1, eval_prompts=4),
             "query_stream": dict(key_space=100, batch_size=16)}[name]
    return create(name, **small)


def experiment_state(name):
    def take():
        exp = experiment(name)
        return {"step": exp.step_count, "generator": exp.generator.get_state(),
                "model": {k: v.clone() for k, v in exp.model.state_dict().items()}}
    return take


NAMES_SEEDS_DEVICES = [
    case("unknown-experiment", lambda: create("activation_mpl"), ValueError, "'activation_mpl'",
         "did you mean 'activation_mlp'", "list_experiments()"),
    case("experiment-name-int", lambda: create(5), ValueError, "5", "list_experiments()"),
    case("seed-2**70", lambda: create("activation_mlp", seed=2**70), ValueError, "seed", str(2**70),
         "[0, 2**63 - 1]", "9223372036854775807"),
    case("seed-1e20", lambda: create("activation_mlp", seed=1e20), TypeError, "seed", "1e+20", "int",
         "[0, 2**63 - 1]"),
    case("seed-negative", lambda: create("activation_mlp", seed=-1), ValueError, "seed", "got -1", "[0, 2**63 - 1]"),
    case("seed-2**64", lambda: create("query_stream", seed=2**64), ValueError, "seed", str(2**64)),
    case("seed-bool", lambda: create("activation_mlp", seed=True), TypeError, "seed", "True", "int"),
    case("seed-text", lambda: create("activation_mlp", seed="0"), TypeError, "seed", "'0'"),
    case("spec-create-seed", lambda: workbench.experiments.get_experiment_spec("ilql").create(seed=2**63),
         ValueError, "seed", str(2**63)),
    case("class-seed", lambda: workbench.experiments.get_experiment_spec("activation_mlp").cls(
        workbench.experiments.get_experiment_spec("activation_mlp").cls.Config(), seed=-5), ValueError, "seed",
        "-5"),
    case("device-meta", lambda: create("activation_mlp", device="meta"), ValueError, "'meta'", "no values",
         "'cpu'"),
    case("device-absent-gpu", lambda: create("activation_mlp", device="cuda:7"), ValueError, "'cuda:7'",
         "cannot be used here", "'cpu'"),
    case("device-not-a-name", lambda: create("ilql", device="gpu"), ValueError, "'gpu'", "'cpu'"),
    case("query-stream-off-cpu", lambda: create("query_stream", device="cuda"), ValueError, "'cuda'", "'cpu'"),
    # (was torch's "device() received an invalid combination of arguments - got (NoneType) ..." over 5 lines)
    case("device-none", lambda: create("activation_mlp", device=None), ValueError, "got none (nonetype)",
         "'cpu'", "the default is 'cpu'"),
    case("device-float", lambda: create("efficientzero_dynamics", device=1.5), ValueError, "1.5 (float)", "'cuda:0'"),
]

CONFIGS = [
    case("config-unknown-field", lambda: create("activation_mlp", layers=3), TypeError, "'layers'",
         "depth (int, default 2"),
    case("config-wrong-type", lambda: create("activation_mlp", depth="2"), TypeError, "'depth'", "'2'", "int"),
    case("config-bool-for-int", lambda: create("activation_mlp", width=True), TypeError, "'width'", "True"),
    case("config-below-range", lambda: create("activation_mlp", depth=0), ValueError, "'depth'", "[1, 16]",
         "got 0"),
    case("config-above-range", lambda: create("query_stream", batch_size=10**8), ValueError, "'batch_size'",
         "[1, 10000000]"),
    case("config-lr-nan", lambda: create("activation_mlp", lr=NAN), ValueError, "'lr'", "nan", "finite"),
    case("config-noise-inf", lambda: create("activation_mlp", noise=INF), ValueError, "'noise'", "[0, 10]", "inf"),
    case("config-zipf-nan", lambda: create("query_stream", zipf_exponent=NAN), ValueError, "'zipf_exponent'",
         "nan", "finite"),
    case("config-dataset-choice", lambda: create("activation_mlp", dataset="spiral"), ValueError, "'dataset'",
         "'spiral'", "'spirals'"),
    case("config-activation-choice", lambda: create("activation_mlp", activation="swish"), ValueError,
         "'activation'", "'swish'", "'gelu'"),
    case("dynamics-even-support", lambda: create("efficientzero_dynamics", support_size=20), ValueError,
         "support_size", "odd", "20", "21"),
    case("dynamics-no-reward-layers", lambda: create("efficientzero_dynamics", fc_reward_layers=[]), ValueError,
         "fc_reward_layers", "[]", "[32]"),
    case("dynamics-zero-width-layer", lambda: create("efficientzero_dynamics", fc_reward_layers=[0]), ValueError,
         "fc_reward_layers", "[0]", "positive"),
    case("dynamics-reward-layers-text", lambda: create("efficientzero_dynamics", fc_reward_layers="32"),
         TypeError, "'fc_reward_layers'", "'32'", "list[int]"),
    case("ilql-heads-do-not-divide", lambda: create("ilql", n_embd=30, n_head=4), ValueError, "n_embd (30)",
         "n_head (4)", "divisible"),
    case("ilql-temperature-zero", lambda: create("ilql", temperature=0.0), ValueError, "'temperature'",
         "[0.01, 10]"),
]

MEMORY = [
    case("memory-ilql", lambda: create("ilql", n_layer=12, n_embd=1024, n_head=16, batch_size=4096,
                                       eval_prompts=100_000, dataset_size=1_000_000, memory_limit="32GB"),
         MemoryLimitError, "experiment 'ilql' (n_layer=12, n_embd=1024", "126 GB", "activations 120 GB",
         "memory limit of 32 GB", "memory_limit='158GB'", "WORKBENCH_MEMORY_LIMIT"),
    case("memory-activation-mlp", lambda: create("activation_mlp", width=1024, depth=16, n_samples=1_000_000,
                                                 memory_limit="4GB"),
         MemoryLimitError, "width=1024, depth=16, n_samples=1000000", "12.6 GB", "activations 12.3 GB",
         "memory limit of 4 GB"),
    case("memory-dynamics", lambda: create("efficientzero_dynamics", unroll_steps=50, batch_size=4096,
                                           latent_channels=256, spatial=32, num_res_blocks=16),
         MemoryLimitError, "unroll_steps=50", "35.9 TB", "memory limit of", "available on cpu"),
    case("memory-query-stream", lambda: create("query_stream", key_space=50_000_000, actions=1,
                                               observation_dim=1024, memory_limit="16GB"),
         MemoryLimitError, "key_space=50000000", "212 GB", "data 212 GB", "16 GB"),
    case("memory-env-limit", with_env(lambda: create("activation_mlp"), WORKBENCH_MEMORY_LIMIT="100kB"),
         MemoryLimitError, "experiment 'activation_mlp' (defaults)", "478 kB", "WORKBENCH_MEMORY_LIMIT='100kB'"),
    case("memory-limit-not-a-size", lambda: create("activation_mlp", memory_limit="lots"), ValueError,
         "memory_limit", "'lots'", "16GB"),
    case("memory-limit-zero", lambda: create("activation_mlp", memory_limit=0), ValueError, "memory_limit",
         "got 0", "positive"),
    case("memory-limit-nan", lambda: create("activation_mlp", memory_limit=NAN), ValueError, "memory_limit",
         "nan"),
]

STEPS = [
    case("run-negative", lambda: experiment("activation_mlp").run(-1), ValueError, "steps", "-1", "non-negative",
         keep=experiment_state("activation_mlp")),
    case("run-float", lambda: experiment("activation_mlp").run(2.5), ValueError, "steps", "2.5",
         keep=experiment_state("activation_mlp")),
    case("run-bool", lambda: experiment("query_stream").run(True), ValueError, "steps", "True",
         keep=experiment_state("query_stream")),
    case("run-text", lambda: experiment("efficientzero_dynamics").run("10"), ValueError, "steps", "'10'",
         keep=experiment_state("efficientzero_dynamics")),
    case("dynamics-evaluate-0", lambda: experiment("efficientzero_dynamics").evaluate(batch_size=0), ValueError,
         "batch_size", "got 0", ">= 1", keep=experiment_state("efficientzero_dynamics")),
    case("dynamics-evaluate-negative", lambda: experiment("efficientzero_dynamics").evaluate(batch_size=-3),
         ValueError, "batch_size", "-3", keep=experiment_state("efficientzero_dynamics")),
    case("ilql-evaluate-0-prompts", lambda: experiment("ilql").evaluate(prompts=0), ValueError, "prompts", "got 0",
         ">= 1", keep=experiment_state("ilql")),
    case("ilql-evaluate-negative", lambda: experiment("ilql").evaluate(prompts=-5), ValueError, "prompts", "-5",
         keep=experiment_state("ilql")),
    case("ilql-evaluate-seed", lambda: experiment("ilql").evaluate(seed=2**70), ValueError, "seed", str(2**70),
         "2**63 - 1", keep=experiment_state("ilql")),
    case("query-evaluate-0-rows", lambda: experiment("query_stream").evaluate(rows=0), ValueError, "rows",
         "got 0", ">= 1", keep=experiment_state("query_stream")),
    case("query-evaluate-seed", lambda: experiment("query_stream").evaluate(seed=-1), ValueError, "seed", "-1",
         keep=experiment_state("query_stream")),
    # (a misspelt watch option was Python's "watch() got an unexpected keyword argument 'evry'", and
    # metadata= clashed with the experiment's own: "got multiple values for keyword argument")
    case("run-watch-option-typo", lambda: experiment("activation_mlp").run(2, evry=2), TypeError, "'evry'",
         "did you mean 'every'", "histograms", keep=experiment_state("activation_mlp")),
    case("start-watch-option-typo", lambda: experiment("query_stream").start(2, histogram=False), TypeError,
         "'histogram'", "did you mean 'histograms'", keep=experiment_state("query_stream")),
    case("watch-start-step", lambda: experiment("activation_mlp").watch(start_step=5), TypeError, "start_step",
         "set by the experiment", keep=experiment_state("activation_mlp")),
]

CASES = NAMES_SEEDS_DEVICES + CONFIGS + MEMORY + STEPS


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case):
    check(case)


def test_metadata_given_to_a_run_is_recorded_beside_the_experiments_own(tmp_path):
    exp = create("activation_mlp", width=8, n_samples=64, batch_size=16)
    exp.run(1, store=tmp_path / "run", metadata={"note": "baseline"}, progress=False)
    metadata = workbench.load_run(tmp_path / "run").metadata
    assert metadata["note"] == "baseline" and metadata["experiment"] == "activation_mlp" and metadata["seed"] == 0
