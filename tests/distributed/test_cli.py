"""``python -m workbench.experiments``: one process, and data-parallel under torchrun (2 CPU ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import workbench
import workbench.experiments
from workbench.experiments.__main__ import main, parse_config
from workbench.instrument.distributed import destroy_process_group

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("WORLD_SIZE", None)
    return env


def test_torchrun_two_ranks_writes_one_run(tmp_path):
    store = tmp_path / "runs" / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "workbench.experiments", "run", "activation_mlp", "--steps", "4", "--store", str(store),
               "--config", "width=8", "--config", "batch_size=16", "--per-rank"]
    done = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 steps on 2 ranks" in done.stdout
    # one run, and (--per-rank) each rank's own rows beside it, all written by rank 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ddp", "ddp-rank0", "ddp-rank1"]
    run = workbench.load_run(store)
    assert run.status == "finished" and run.steps == [1, 2, 3, 4]
    assert run.metadata["experiment"] == "activation_mlp" and run.metadata["distributed"]["world_size"] == 2
    assert run.metadata["distributed"]["wrapper"] == "DistributedDataParallel"
    rows = run.to_pandas()
    # the global batch: 2 ranks x 16 points through the first hidden layer's 8 units
    first = rows[(rows.kind == "activation") & (rows.module == "layers.0")]
    assert len(first) == 4 and (first.numel == 2 * 16 * 8).all(), first[["module", "shape", "numel"]]
    assert set(rows.kind) == {"activation", "grad_output", "param", "param_grad"}
    assert not any(m.startswith("module") for m in rows.module)
    for rank in (0, 1):
        own = workbench.load_run(tmp_path / "runs" / f"ddp-rank{rank}")
        assert own.status == "finished" and own.metadata["rank"] == rank and own.steps == [1, 2, 3, 4]
        acts = own.to_pandas()
        acts = acts[(acts.kind == "activation") & (acts.module == "layers.0")]
        assert len(acts) == 4 and (acts.numel == 16 * 8).all()  # its own 16 points


def test_one_process_run(tmp_path, capsys):
    assert main(["run", "activation_mlp", "--steps", "2", "--store", str(tmp_path / "one"), "--config", "width=8"]) == 0
    assert "2 steps" in capsys.readouterr().out
    assert workbench.load_run(tmp_path / "one").steps == [1, 2]


@pytest.mark.parametrize("argv, message", [
    (["run", "activation_mlp", "--config", "width"], "--config takes NAME=VALUE (such as width=64), got 'width'"),
    (["run", "activation_mpl"], "unknown experiment 'activation_mpl'. Did you mean 'activation_mlp'? "
                                "`python -m workbench.experiments list` lists them."),
    (["run", "activation_mlp", "--steps", "-1"], "--steps must be >= 0, got -1"),
    (["run", "activation_mlp", "--every", "0"],
     "every must be a positive int (record every Nth step), got 0"),  # (a line, not a traceback)
    (["run", "activation_mlp", "--config", "depth=0"], "parameter 'depth' must lie in [1, 16], got 0"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_parse_config():
    assert parse_config(["width=64", "activation=relu", "lr=1e-3", "noise=0"]) == {
        "width": 64, "activation": "relu", "lr": 1e-3, "noise": 0}


def test_data_parallel_reaches_the_models_other_methods(tmp_path):
    import torch
    import torch.distributed as dist

    from workbench.experiments.__main__ import data_parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        exp = workbench.experiments.create("efficientzero_dynamics", seed=0, batch_size=4, latent_channels=4,
                                           lstm_hidden_size=8, support_size=5, unroll_steps=2)
        model = exp.model
        exp.model = data_parallel(model)
        assert isinstance(exp.model, torch.nn.parallel.DistributedDataParallel) and exp.model.module is model
        assert exp.model.initial_hidden_state == model.initial_hidden_state  # (DDP alone has no such attribute)
        with pytest.raises(AttributeError, match="no_such_thing"):
            exp.model.no_such_thing
        assert "loss" in exp.step()
    finally:
        exp = model = None  # DDP's reducer holds the group: see destroy_process_group
        destroy_process_group()
