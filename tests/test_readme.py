"""The README's tour runs as written (with fewer training steps), and what it shows is there.

Its runnable blocks are marked as the docs' pages are (``<!-- run -->`` on the line before the
fence; see tests/test_docs.py) and run in order in one namespace, as a reader's session would.
The unmarked block needs a notebook (the live Dashboard); tests/ui/test_notebook_widgets.py and
tests/ui/test_jupyterlab.py exercise it.
"""

import re
from pathlib import Path

import workbench
from tests.test_docs import RUNNABLE, shortened

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_two_commands_come_first():
    lines = README.splitlines()
    assert lines[2:6] == [
        "```bash",
        "bash scripts/app.sh     # installs into .venv and serves the app on http://127.0.0.1:7860",
        "bash scripts/test.sh    # installs into .venv (and Debian's chromium if missing) and runs the whole test suite",
        "```",
    ]
    assert all((ROOT / "scripts" / name).is_file() for name in ("app.sh", "test.sh"))


def test_the_readme_stays_short_and_its_links_and_pictures_exist():
    assert len(README.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert "docs/screenshots/live_run.png" in local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_tables_name_every_built_in_model_and_experiment():
    tables = "\n".join(line for line in README.splitlines() if line.startswith("|"))
    named = set(re.findall(r"`([a-z_0-9]+)`", tables))
    assert set(workbench.list_models()) <= named
    assert set(workbench.experiments.list_experiments()) <= named


def test_the_tour_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tour writes runs/ into the working directory
    blocks = RUNNABLE.findall(README)
    assert len(blocks) == 3  # the registry, an experiment, a watch
    namespace: dict = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(shortened(block), f"README runnable block {number}", "exec"), namespace)
    # what the tour says it leaves behind
    assert workbench.load_run("runs/gelu").status == "finished"
    more = workbench.load_run("runs/gelu-more")  # (the resumed training numbers on: shortened to 2 steps)
    assert more.status == "finished" and more.steps[0] == workbench.load_run("runs/gelu").steps[-1] + 1
    assert namespace["w"].diagnose().empty  # as the tour says: that net trains fine
    mine = workbench.load_run("runs/my_net")
    assert mine.status == "finished" and mine.metrics().step.tolist() == list(range(1, 51))
