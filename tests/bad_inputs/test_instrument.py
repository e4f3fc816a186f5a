"""Bad inputs to watch, its interventions and stream, the run store and stored runs."""

from __future__ import annotations

import atexit
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument import Recorder, RunError, RunStore
from workbench.instrument.reduce_torch import TorchReducer
from workbench.instrument.store import DB_NAME
from tests.bad_inputs.harness import Case, check, params

ROOT = Path(tempfile.mkdtemp(prefix="workbench-bad-inputs-"))
atexit.register(shutil.rmtree, ROOT, ignore_errors=True)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def no_hooks_left() -> None:
    assert not torch.nn.modules.module._global_forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def watch_with(**options):
    """A bad watch() that must leave no hook and write nothing under ROOT."""
    before = {}

    def call():
        before["tree"] = tree(ROOT)
        workbench.watch(model(), **options)

    def after():
        no_hooks_left()
        assert tree(ROOT) == before["tree"]

    return call, after


def recorded_watch(action, unchanged=True):
    """``action(w, model)`` on a watch that has recorded one step; nothing of the watch changes."""
    state = {}

    def call():
        m = model()
        w = state["w"] = workbench.watch(m)
        m(torch.randn(2, 3)).sum().backward()
        w.step()
        state["rows"] = len(w.to_pandas())
        action(w, m)

    def after():
        w = state["w"]
        if unchanged:
            assert w.interventions == [] and len(w.to_pandas()) == state["rows"] and not w.errors
        w.close()
        no_hooks_left()

    def cleanup():
        if "w" in state:
            state.pop("w").close()

    return call, after, cleanup


def closed_watch(action):
    def call():
        w = workbench.watch(model())
        w.close()
        action(w)

    return call


def enter(w) -> None:
    """A with block on ``w`` (a closed watch's block would run unwatched: refused at the with)."""
    with w:
        raise AssertionError("the block of a closed watch ran")


def dangling_link() -> Path:
    """A link to a run folder that is gone."""
    link = ROOT / "dangling"
    if not link.is_symlink():
        link.symlink_to(ROOT / "gone-run")
    return link


def stored_run(name: str, steps: int = 2) -> Path:
    path = ROOT / "runs" / name
    if not (path / DB_NAME).exists():
        m = model()
        with workbench.watch(m, store=path) as w:
            for _ in range(steps):
                m(torch.randn(2, 3)).sum().backward()
                w.step(loss=1.0)
    return path


def damaged(kind: str) -> Path:
    path = ROOT / "damaged" / kind
    path.mkdir(parents=True, exist_ok=True)
    db = path / DB_NAME
    if kind == "bytes":
        db.write_bytes(b"not sqlite at all" * 64)
    elif kind == "no-meta":
        sqlite3.connect(db).close()
    else:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        value = {"newer": "99", "no-version": json.dumps("x"), "bad-json": "{not json"}[kind]
        key = "schema_version" if kind != "bad-json" else "model"
        con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        if kind == "bad-json":
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', '1')")
        con.commit()
        con.close()
    return path


def held_store():
    """A run directory another writer holds: a second writer is refused, the first writes on."""
    state = {}

    def call():
        state["store"] = RunStore(ROOT / "held")
        RunStore(ROOT / "held")

    def after():
        store = state.pop("store")
        assert workbench.load_run(ROOT / "held").status == "running"
        store.close()
        assert workbench.load_run(ROOT / "held").status == "finished"

    return call, after


def file_at(name: str) -> Path:
    path = ROOT / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a file")
    return path


def unchanged_file(name: str):
    def after():
        assert (ROOT / name).read_text() == "a file"
    return after


def watch_case(id, error, says, **options):
    call, after = watch_with(**options)
    return Case(id, call, error, says, after)


def watch_action_case(id, action, error, says, unchanged=True):
    call, after, cleanup = recorded_watch(action, unchanged)
    return Case(id, call, error, says, after, cleanup)


EXPERIMENT = []
STORES = []


def histograms_of(w):
    """``w.histograms()`` of ``w`` once closed (nothing of it is left in)."""
    w.close()
    return w.histograms()


def histograms_of_unwatched_module():
    """``w.histograms("2")`` of a watch that records module "0" alone: a path of the model with no row."""
    m = model()
    with workbench.watch(m, modules="0") as w:
        m(torch.randn(2, 3)).sum().backward()
        w.step()
    return w.histograms("2")


def watched_twice():
    exp = workbench.experiments.create("activation_mlp", width=4, depth=1, n_samples=64)
    EXPERIMENT.append(exp)
    exp.watch()
    exp.watch()


ablate = lambda *a, **k: lambda w, m: w.ablate(*a, **k)  # noqa: E731
patch = lambda *a, **k: lambda w, m: w.patch(*a, **k)  # noqa: E731
double = lambda out: out * 2  # noqa: E731

CASES = [
    # ---------------------------------------------------------------- watch()
    Case("watch-not-a-module", lambda: workbench.watch("model"), TypeError, ["torch.nn.Module", "str"], no_hooks_left),
    Case("watch-a-function", lambda: workbench.watch(torch.relu), TypeError, ["torch.nn.Module"], no_hooks_left),
    watch_case("every-zero", ValueError, ["every", "positive int", "0"], every=0),
    watch_case("every-negative", ValueError, ["every", "-3"], every=-3),
    watch_case("every-float", ValueError, ["every", "1.5"], every=1.5),
    watch_case("every-bool", ValueError, ["every", "True"], every=True),
    watch_case("every-str", ValueError, ["every", "'10'"], every="10"),
    watch_case("every-numpy-float", ValueError, ["every", "positive int", "np.float64(2.0)"], every=np.float64(2.0)),
    watch_case("bins-numpy-bool", ValueError, ["bins", "positive int", "np.true_"], bins=np.bool_(True)),
    watch_case("bins-zero", ValueError, ["bins", "positive int", "0"], bins=0),
    watch_case("bins-str", ValueError, ["bins", "'32'"], bins="32"),
    watch_case("bins-too-many", ValueError, ["bins", "at most 16384", "1000000", "sample"], bins=10**6),
    watch_case("activations-str", TypeError, ["activations", "True or False", "'yes'"], activations="yes"),
    watch_case("gradients-int", TypeError, ["gradients", "True or False", "1"], gradients=1),
    watch_case("parameters-none", TypeError, ["parameters", "None"], parameters=None),
    watch_case("parameter-grads-str", TypeError, ["parameter_grads", "'no'"], parameter_grads="no"),
    watch_case("histograms-int", TypeError, ["histograms", "1"], histograms=1),
    watch_case("modules-int", TypeError, ["modules", "glob", "5"], modules=5),
    watch_case("modules-list-with-int", TypeError, ["modules", "glob", "3"], modules=["0", 3]),
    watch_case("modules-dict", TypeError, ["modules", "glob"], modules={"0": True}),
    watch_case("modules-match-nothing", ValueError, ["matches no module", "'nomatch*'", "module paths are"],
               modules="nomatch*"),
    watch_case("modules-malformed", ValueError, ["modules", "the glob '[bad' is malformed", "no ']' closes"],
               modules="[bad"),
    watch_case("exclude-everything", ValueError, ["selects no module", "exclude='*'"], exclude="*"),
    watch_case("exclude-int", TypeError, ["exclude", "glob", "7"], exclude=7),
    watch_case("modules-predicate-raises", TypeError, ["modules=<function", "raised TypeError", "module path ''",
                                                       "a predicate takes one path"],
               modules=lambda path: path.startswith(1)),
    watch_case("exclude-predicate-of-two-args", TypeError, ["exclude=<function", "raised TypeError",
                                                            "a predicate takes one path"],
               exclude=lambda path, other: True),
    watch_case("metadata-list", TypeError, ["metadata must be a dict of facts with str keys", "got list"],
               metadata=[1, 2]),
    watch_case("metadata-contradicts", ValueError, ["metadata {'every': 99} contradicts", "(every=1)", "other names"],
               metadata={"every": 99}, store=ROOT / "contradicted"),
    watch_case("every-zero-with-metadata", ValueError, ["every must be a positive int", "0"], every=0,
               metadata={"every": 1}, store=ROOT / "every-zero"),  # (the argument's own error, not a contradiction)
    watch_case("start-step-negative", ValueError, ["start_step", "-1"], start_step=-1),
    watch_case("start-step-float", ValueError, ["start_step", "1.0"], start_step=1.0),
    watch_case("reducers-int", TypeError, ["reducers must be a list of reducers", "'cpu', 'triton', 'torch'", "5"],
               reducers=5),
    watch_case("reducers-list-with-int", TypeError, ["reducers must be", "[5]", "5 is neither"], reducers=[5]),
    watch_case("reducers-unknown-name", ValueError, ["unknown reducer name 'torhc'", "did you mean 'torch'",
                                                     "'cpu', 'triton', 'torch'"], reducers=["torhc"]),
    watch_case("reducers-a-class", TypeError, ["the class TorchReducer", "TorchReducer()"], reducers=[TorchReducer]),
    watch_case("reducers-empty", ValueError, ["reducers is empty", "None for the default"], reducers=[]),
    watch_case("recorder-wrong-type", TypeError, ["recorder", "Recorder", "'mine'"], recorder="mine"),
    watch_case("store-empty", ValueError, ["store=''", "names no directory", "store=None"], store=""),
    watch_case("store-blank", ValueError, ["names no directory"], store="   "),
    watch_case("store-int", TypeError, ["store", "directory path", "5"], store=5),
    watch_case("store-no-such-user", FileNotFoundError, ["store='~nosuchuser-wb/run'", "names no user"],
               store="~nosuchuser-wb/run"),
    Case("store-is-a-file", lambda: workbench.watch(model(), store=file_at("a-file")), FileExistsError,
         ["a-file", "is a file, not a directory"], unchanged_file("a-file")),
    Case("store-under-a-file", lambda: workbench.watch(model(), store=file_at("b-file") / "run"), NotADirectoryError,
         ["cannot create the run directory", "b-file/run", "pick a directory"], unchanged_file("b-file")),
    Case("store-holds-a-run", lambda: workbench.watch(model(), store=stored_run("existing")), FileExistsError,
         ["already holds a run", "load it with workbench.load_run"],
         lambda: workbench.load_run(stored_run("existing")).steps == [1, 2] or pytest.fail("the run changed")),
    # ------------------------------------------------------ a watch's methods
    watch_action_case("patch-unknown-path", patch("O", double), ValueError, ["no module at path 'O'",
                                                                              "module paths: '' (the model itself), 0"]),
    watch_action_case("patch-path-int", patch(0, double), ValueError, ["no module at path 0", "module paths"]),
    watch_action_case("patch-not-callable", patch("0", "double"), TypeError, ["callable", "'double'"]),
    watch_action_case("patch-call-negative", patch("0", double, call=-1), ValueError, ["call", ">= 0", "-1"]),
    watch_action_case("patch-call-str", patch("0", double, call="1"), ValueError, ["call", "'1'"]),
    watch_action_case("patch-call-bool", patch("0", double, call=True), ValueError, ["call", "True"]),
    watch_action_case("patch-call-numpy-negative", patch("0", double, call=np.int64(-1)), ValueError,
                      ["call", ">= 0", "np.int64(-1)"]),
    watch_action_case("ablate-no-units", ablate("0", []), TypeError, ["units", "non-empty list of ints", "[]"]),
    watch_action_case("ablate-float-unit", ablate("0", 1.5), TypeError, ["units", "1.5"]),
    watch_action_case("ablate-bool-unit", ablate("0", [True]), TypeError, ["units", "[true]"]),
    watch_action_case("ablate-str-dim", ablate("0", [1], dim="1"), TypeError, ["dim", "int", "'1'"]),
    watch_action_case("ablate-unit-out-of-range", ablate("0", [9]), ValueError,
                      ["units [9] are out of range", "shape (2, 4)", "[0, 3]"]),
    watch_action_case("ablate-negative-unit-out-of-range", ablate("0", [-5]), ValueError,
                      ["units [-5] are out of range"]),
    watch_action_case("ablate-dim-out-of-range", ablate("0", 0, dim=5), ValueError,
                      ["dim=5 is out of range", "shape (2, 4)", "[-2, 1]"]),
    watch_action_case("ablate-unknown-path", ablate("9", 0), ValueError, ["no module at path '9'"]),
    watch_action_case("log-str", lambda w, m: w.log(loss="low"), TypeError, ["metric 'loss'", "number", "'low'"]),
    watch_action_case("log-bool", lambda w, m: w.log(ok=True), TypeError, ["metric 'ok'", "number", "true"]),
    watch_action_case("log-vector", lambda w, m: w.log(loss=torch.ones(3)), TypeError, ["metric 'loss'", "number"]),
    watch_action_case("log-none", lambda w, m: w.log(loss=None), TypeError, ["metric 'loss'", "none"]),
    watch_action_case("step-metric-list", lambda w, m: w.step(loss=[1.0]), TypeError, ["metric 'loss'", "[1.0]"]),
    watch_action_case("subscribe-not-callable", lambda w, m: w.subscribe("print"), TypeError,
                      ["subscribe() needs a callable", "'print'"]),
    watch_action_case("subscribe-max-pending-zero", lambda w, m: w.subscribe(print, max_pending=0), ValueError,
                      ["max_pending", "positive int", "0"]),
    watch_action_case("close-unknown-status", lambda w, m: w.close("done"), ValueError,
                      ["status must be one of", "'finished'", "'done'"]),
    watch_action_case("ablate-label-two-lines", lambda w, m: w.ablate("0", [0], label="zero\nunits"), TypeError,
                      ["label must be one line of text", "'zero\\nunits'"]),
    watch_action_case("histograms-unknown-kind", lambda w, m: w.histograms("0", "activations"), ValueError,
                      ["histograms: kind 'activations' is not one of", "did you mean 'activation'"]),
    watch_action_case("histograms-kind-abbreviated", lambda w, m: w.histograms("0", "act"), ValueError,
                      ["histograms: kind 'act' is not one of", "did you mean 'activation'"]),
    watch_action_case("histograms-unknown-module", lambda w, m: w.histograms("O"), ValueError,
                      ["histograms: no module at path 'O'", "'0', '1'", "None for every one"]),
    Case("histograms-not-recorded", lambda: histograms_of(workbench.watch(model(), histograms=False)), RuntimeError,
         ["records no histograms", "histograms=False", "w.to_pandas()", "histograms=True"], no_hooks_left),
    Case("run-histograms-unknown-module", lambda: workbench.load_run(stored_run("looked-up")).histograms("nope"),
         ValueError, ["histograms: no module at path 'nope'", "the paths are"]),
    Case("run-histograms-kind-abbreviated", lambda: workbench.load_run(stored_run("looked-up")).histograms("0", "act"),
         ValueError, ["histograms: kind 'act' is not one of", "did you mean 'activation'"]),
    watch_action_case("watch-histograms-kind-not-recorded", lambda w, m: w.histograms("0", "update"), ValueError,
                      ["no update rows were recorded", "activation, grad_output, param, param_grad", "updates=True"]),
    Case("watch-histograms-module-not-watched", histograms_of_unwatched_module, ValueError,
         ["module '2' has no rows", "modules=", "'0'"]),
    Case("run-histograms-kind-not-recorded", lambda: workbench.load_run(stored_run("looked-up")).histograms(
        kind="update"), ValueError, ["no update rows were recorded", "updates=True"]),
    watch_action_case("watch-metrics-named", lambda w, m: w.metrics("loss"), TypeError,
                      ["long", "'loss'", "metrics()['loss']"]),
    watch_action_case("watch-metrics-long-int", lambda w, m: w.metrics(1), TypeError, ["must be True", "got 1"]),
    Case("run-metrics-named", lambda: workbench.load_run(stored_run("looked-up")).metrics("loss"), TypeError,
         ["long", "'loss'", "metrics()['loss']"]),
    Case("step-after-close", closed_watch(lambda w: w.step()), RuntimeError, ["closed", "workbench.watch(model)"]),
    Case("patch-after-close", closed_watch(lambda w: w.patch("0", double)), RuntimeError, ["closed"]),
    Case("paused-after-close", closed_watch(lambda w: w.paused().__enter__()), RuntimeError, ["closed"]),
    Case("with-block-after-close", closed_watch(enter), RuntimeError, ["closed", "workbench.watch(model)"]),
    Case("subscribe-after-close", closed_watch(lambda w: w.subscribe(print)), RuntimeError,
         ["closed", "records nothing more", "w.to_pandas()"]),
    Case("recorder-max-rows-negative", lambda: Recorder(max_rows=-1), ValueError, ["max_rows", "int >= 0", "-1"]),
    Case("recorder-max-rows-float", lambda: Recorder(max_rows=1e6), ValueError, ["max_rows", "1000000.0"]),
    # ------------------------------------------------------- runs and stores
    Case("load-run-missing", lambda: workbench.load_run(ROOT / "nothing-here"), RunError,
         ["nothing-here", "is not a workbench run", "no such file or folder", "list_runs"]),
    Case("load-run-dangling-link", lambda: workbench.load_run(dangling_link()), RunError,
         ["dangling", "is a link to", "gone-run", "which does not exist", "list_runs"]),
    Case("load-run-empty-path", lambda: workbench.load_run(""), RunError, ["path of a run is empty", "list_runs"]),
    Case("load-run-folder-of-runs", lambda: stored_run("a") and workbench.load_run(ROOT), RunError,
         ["is a folder of runs", "open one of them", "list_runs("]),
    Case("load-run-empty-dir", lambda: workbench.load_run((ROOT / "empty").mkdir(exist_ok=True) or ROOT / "empty"),
         RunError, ["empty", "has no run.sqlite"]),
    Case("load-run-no-such-user", lambda: workbench.load_run("~nosuchuser-wb/runs/a"), FileNotFoundError,
         ["path='~nosuchuser-wb/runs/a'", "~nosuchuser-wb names no user", "without it"]),
    Case("list-runs-no-such-user", lambda: workbench.list_runs("~nosuchuser-wb"), FileNotFoundError,
         ["root='~nosuchuser-wb'", "names no user"]),
    Case("load-run-int", lambda: workbench.load_run(42), TypeError, ["directory path", "42"]),
    Case("load-run-none", lambda: workbench.load_run(None), TypeError, ["directory path", "none"]),
    Case("load-run-damaged", lambda: workbench.load_run(damaged("bytes")), RunError, ["damaged or not a workbench run"]),
    Case("load-run-empty-database", lambda: workbench.load_run(damaged("no-meta")), RunError,
         ["damaged or not a workbench run"]),
    Case("load-run-newer-schema", lambda: workbench.load_run(damaged("newer")), RunError,
         ["schema 99", "upgrade workbench"]),
    Case("load-run-no-schema-version", lambda: workbench.load_run(damaged("no-version")), RunError,
         ["not a workbench run database"]),
    Case("load-run-damaged-metadata", lambda: workbench.load_run(damaged("bad-json")), RunError,
         ["damaged metadata"]),
    Case("list-runs-missing", lambda: workbench.list_runs(ROOT / "no-such-root"), FileNotFoundError,
         ["no-such-root", "is not a directory of runs", "no such folder", "list_runs('runs')"]),
    Case("list-runs-file", lambda: workbench.list_runs(file_at("c-file")), FileNotFoundError,
         ["c-file", "not a directory", "it is a file", "load_run"], unchanged_file("c-file")),
    Case("list-runs-int", lambda: workbench.list_runs(3), TypeError, ["list_runs()", "directory path", "3"]),
    Case("compare-runs-string", lambda: workbench.compare_runs(str(stored_run("a"))), TypeError,
         ["takes a list of runs", "single run"]),
    Case("compare-runs-empty", lambda: workbench.compare_runs([]), ValueError, ["at least one run"]),
    Case("compare-runs-what", lambda: workbench.compare_runs([stored_run("a")], what="everything"), ValueError,
         ["what must be 'rows' or 'metrics'", "'everything'"]),
    Case("compare-runs-twice", lambda: workbench.compare_runs([stored_run("a"), stored_run("b"), stored_run("b") / ".."
                                                              / "b"]), ValueError, ["given twice", "/b", "once"]),
    Case("compare-runs-same-path-twice", lambda: workbench.compare_runs([stored_run("a"), stored_run("a")]),
         ValueError, ["given twice", "/a", "once"]),
    Case("compare-runs-missing-run", lambda: workbench.compare_runs([stored_run("a"), ROOT / "gone"]), RunError,
         ["gone", "is not a workbench run"]),
    Case("export-unknown-suffix", lambda: workbench.load_run(stored_run("a")).export(ROOT / "rows.xlsx"), ValueError,
         ["rows.xlsx", ".csv or .parquet"], lambda: (ROOT / "rows.xlsx").exists() and pytest.fail("written")),
    Case("export-unknown-what", lambda: workbench.load_run(stored_run("a")).export(ROOT / "x.csv", what="all"),
         ValueError, ["what must be 'rows' or 'metrics'", "'all'"],
         lambda: (ROOT / "x.csv").exists() and pytest.fail("written")),
    Case("store-close-unknown-status", lambda: STORES.append(RunStore(ROOT / "closing")) or STORES[-1].close("done"),
         ValueError, ["status must be one of", "'done'"], cleanup=lambda: STORES.pop().close()),
    Case("experiment-watched-twice", lambda: watched_twice(), RuntimeError,
         ["already watched", "close that watch first"], cleanup=lambda: EXPERIMENT.pop().watcher.close()),
]
_held_call, _held_after = held_store()
CASES.append(Case("store-held-by-another-writer", _held_call, FileExistsError,
                  ["being written by another writer", "pick a new directory"], _held_after))


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case):
    check(case)
