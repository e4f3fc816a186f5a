"""``python -m workbench.experiments run`` in one process: what it refuses, in a line and before training."""

from __future__ import annotations

import workbench
from workbench.experiments.__main__ import main, parse_config

import pytest


def test_a_store_that_cannot_be_made_is_a_line_not_a_traceback(tmp_path, capsys):
    # (was a FileNotFoundError traceback out of the run store)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["run", "activation_mlp", "--steps", "2", "--config", "width=8", "--store", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot create the run directory") and "Traceback" not in err


def test_memory_limit_flag_is_taken_and_the_refusal_names_it(tmp_path, capsys):
    # (the command line had no way to pass memory_limit, yet its refusal said "pass memory_limit='...'")
    argv = ["run", "activation_mlp", "--steps", "1", "--config", "width=1024", "--config", "depth=16"]
    assert main([*argv, "--memory-limit", "1MB"]) == 2
    err = capsys.readouterr().err
    assert "more than the memory limit of 1 MB (--memory-limit 1MB)" in err and "pass --memory-limit " in err
    assert "memory_limit=" not in err
    assert main(["run", "activation_mlp", "--steps", "1", "--memory-limit", "lots"]) == 2
    assert "--memory-limit 'lots' is not a size" in capsys.readouterr().err
    store = tmp_path / "run"
    assert main(["run", "activation_mlp", "--steps", "2", "--config", "width=8", "--memory-limit", "off",
                 "--store", str(store)]) == 0
    run = workbench.load_run(store)
    assert run.status == "finished" and run.steps == [1, 2]


def test_a_config_field_given_twice_is_refused():
    # (the last one won without a word)
    with pytest.raises(ValueError, match=r"--config width is given twice \('width=8' and 'width=16'\)"):
        parse_config(["width=8", "depth=2", "width=16"])
    assert parse_config(["width=8", " depth =2"]) == {"width": 8, "depth": 2}
