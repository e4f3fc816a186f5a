"""The README's self-contained examples run as written (with fewer training steps).

The other blocks show calls on names the reader brings (``data``, ``objective``, ``obs``);
they are exercised by the tests of what they call.
"""

import re
from pathlib import Path

import pytest

import workbench

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def runnable(marker: str) -> str:
    """The one README block containing ``marker``, its training runs shortened."""
    found = [block for block in BLOCKS if marker in block]
    assert len(found) == 1, f"{len(found)} README blocks contain {marker!r}"
    return re.sub(r"\.run\((\d+)", lambda m: f".run({min(int(m.group(1)), 20)}", found[0])


@pytest.mark.parametrize("marker", [
    'workbench.list_models("*lu"',                     # the registry
    '@register_model("my_net"',                       # registering a model of your own
    'experiments.create("activation_mlp", seed=0',     # experiments
    'workbench.load_run("runs/tanh")',                 # recording runs
])
def test_readme_example_runs(marker, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write runs/ and exports into the working directory
    # each block goes on from the README's first, which imports torch and workbench
    code = "import torch\nimport workbench\n" + runnable(marker)
    if "register_model" in code:  # the block defines a model; building it proves the registration
        code += "\nworkbench.create_model('my_net', width=8)\n"
    namespace: dict = {}
    try:
        exec(compile(code, f"README block with {marker}", "exec"), namespace)
    finally:
        if "my_net" in workbench.list_models():  # the registry is process-wide: leave it as found
            workbench.unregister_model("my_net")
