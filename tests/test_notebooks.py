"""Every notebook runs top to bottom and shows its figures; each is written for a learner."""

import re
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from workbench.ui.notebook import PLOTLY_MIMETYPE

#: Seconds a kernel may take to start, at most (nbclient's 60 s is short on a loaded 2-core machine)
KERNEL_STARTUP = 300
NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
FIGURES = ("image/png", PLOTLY_MIMETYPE)
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def test_there_is_a_notebook_per_family_and_one_on_watching():
    names = " ".join(p.name for p in NOTEBOOKS)
    for topic in ("activations", "efficientzero", "ilql", "query_module", "watch"):
        assert topic in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_a_notebook_reads_as_a_lesson_and_uses_the_public_api(path):
    nb = nbformat.read(path, as_version=4)
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not re.search(r"\btest", text, re.I), "a notebook is for a learner, not about the test suite"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r'matplotlib\.use\(\s*"Agg"', code), "figures must show inline"
    private = re.findall(r"\._[a-z]\w*", code)
    assert not private, f"private internals: {private}"
    assert ".refresh()" not in code and ".flush()" not in code, "the dashboard redraws by itself"
    assert "Dashboard(" in code, "each notebook shows the live dashboard on its model"


def _figures(outputs) -> list[dict]:
    return [o["data"] for o in outputs if o.get("output_type") in ("display_data", "execute_result")
            and any(m in o.get("data", {}) for m in FIGURES)]


@pytest.mark.notebook
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_figures(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # IPC sockets in tmp_path instead of TCP ports: nothing else on the machine can take or
    # answer on them. A per-cell timeout below pytest's names the cell that hangs.
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    client = NotebookClient(
        nb,
        km=km,
        timeout=600,  # (04_ilql took 349 s in all on a loaded 2-core machine)
        startup_timeout=KERNEL_STARTUP,
        extra_arguments=["--HistoryManager.enabled=False"],
        resources={"metadata": {"path": str(tmp_path)}},
        store_widget_state=True,
    )
    started = time.perf_counter()
    client.execute()
    print(f"{path.name}: {time.perf_counter() - started:.1f} s")
    cells = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors[0]
    # a table shows its text whole: pandas cuts a cell past 50 characters to "..." (03's evidence was)
    cut = [c.source for c in cells for o in c.get("outputs", [])
           if "...</td>" in o.get("data", {}).get("text/html", "")]
    assert not cut, f"a table cut its text short in:\n{cut[0]}"
    # every cell that draws with matplotlib shows its figure inline
    for cell in cells:
        if "plt.subplots" in cell.source or ".plot(" in cell.source:
            assert _figures(cell.outputs), f"no figure shown by:\n{cell.source}"
    # the dashboards and comparisons drew their Plotly figures, with data, into their widgets
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    drawn = [data[PLOTLY_MIMETYPE] for model in state.values() if model.get("model_name") == "OutputModel"
             for data in _figures(model["state"].get("outputs", []))]

    def calls(name):
        return sum(line.split("#")[0].count(f"{name}(") for c in cells for line in c.source.splitlines())

    dashboards, comparisons = calls("Dashboard"), calls("Compare")
    # metrics, sites, heatmap, distribution of each dashboard; metrics and a call site of each comparison
    assert len(drawn) >= 4 * dashboards + 2 * comparisons
    assert sum(bool(figure["data"]) for figure in drawn) >= 2 * dashboards + 2 * comparisons
    # a comparison draws a line per run in each figure
    compared = [figure for figure in drawn if figure["layout"].get("title", {}).get("text", "").endswith(", by run")]
    assert len(compared) >= comparisons and all(len(figure["data"]) >= 2 for figure in compared)


SAVED = [
    'import workbench\nexp = workbench.experiments.create("activation_mlp", seed=0, width=8)\n_ = exp.run(5)',
    "from workbench.ui.notebook import Dashboard, ModelBrowser\nrun = exp.start(3, progress=True)\nDashboard(run)",
    "run.join()\nModelBrowser(family='activation')",
]


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_a_saved_notebook_reads_how_its_runs_ended_where_the_widgets_are_gone(tmp_path):
    """A notebook keeps a widget's plain text beside it, and shows that text where the widget is
    gone (reopened without its kernel, read on GitHub): a progress bar's is its end, not the 0% it
    started at, and a dashboard's names it rather than cutting off the repr of its boxes."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in SAVED])
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    NotebookClient(nb, km=km, timeout=300, startup_timeout=KERNEL_STARTUP, extra_arguments=[
        "--HistoryManager.enabled=False"], resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = [[o["data"]["text/plain"] for o in cell.outputs if "application/vnd.jupyter.widget-view+json"
              in o.get("data", {})] for cell in nb.cells]
    assert len(texts[0]) == 1 and "100%" in texts[0][0] and "5/5" in texts[0][0], texts[0]
    bar, dashboard = texts[1]
    assert "100%" in bar and "3/3" in bar, bar
    assert dashboard.startswith("workbench Dashboard of activation_mlp (seed 0)"), dashboard
    assert texts[2] == [("workbench ModelBrowser (gelu): ipywidgets, shown while the kernel that made them runs; "
                         "run the cell again to see them.")]
