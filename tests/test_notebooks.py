"""Every notebook runs top to bottom."""

from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # IPC sockets in tmp_path instead of TCP ports: nothing else on the machine can take or
    # answer on them. A per-cell timeout below pytest's names the cell that hangs.
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    client = NotebookClient(
        nb,
        km=km,
        timeout=240,
        extra_arguments=["--HistoryManager.enabled=False"],
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
