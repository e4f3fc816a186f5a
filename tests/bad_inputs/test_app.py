"""Bad inputs to the app: the run form, run names, the runs root's sub-directories, run picks, pages.

Two layers. The functions under the handlers (``RunsRoot.resolve``, ``RunManager``) raise,
and are checked with the harness's :class:`Case`. The handlers the page calls never raise
(Gradio would show a bare "Error"): each returns a message, checked here the same way -
it names the value and the rule, nothing is written (inside the runs root or beside it),
no run is started, and the process stays usable.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.bad_inputs.harness import Case, check, params, still_usable
from workbench.instrument import RunStore, load_run
from workbench.ui import live_run, run_control, run_page, stored_runs
from workbench.ui.runs import PathRefused, RunManager, RunsRoot


@functools.cache
def sandbox() -> tuple[Path, RunManager]:
    """A directory holding the runs root and what lies beside it; the root holds one run ('taken'),
    a file ('a-file') and symbolic links out of the root: to an empty directory ('link-out'), to
    a run ('linked-run') and, in a directory of its own, to a run's database ('sneaky/run.sqlite')."""
    base = Path(tempfile.mkdtemp(prefix="workbench-bad-app-"))
    (base / "outside").mkdir()
    RunStore(base / "elsewhere", {"experiment": "activation_mlp"}).close()
    root = base / "root"
    RunStore(root / "taken", {"experiment": "activation_mlp"}).close()
    (root / "a-file").write_text("not a run")
    os.symlink(base / "outside", root / "link-out")
    os.symlink(base / "elsewhere", root / "linked-run")
    (root / "sneaky").mkdir()
    os.symlink(base / "elsewhere" / "run.sqlite", root / "sneaky" / "run.sqlite")
    # a reader of a WAL database makes its -wal and -shm files: read once here, they are no write
    load_run(root / "taken").to_pandas()
    # no run is started by a bad input, so the manager has nothing to stop
    return base, RunManager(root)


def tree() -> list[str]:
    base, _ = sandbox()
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


def form(**changes: Any) -> dict[str, Any]:
    values = dict(name="activation_mlp", values={"width": "4"}, seed=0, steps=3, every=1, histograms=False,
                  modules="*", store="", device="cpu", record=None)
    values.update(changes)
    return values


def start(**changes: Any) -> str:
    run, message = live_run.start_run(sandbox()[1], **form(**changes))
    assert run is None, f"started a run from bad input {changes}"
    return message


def runs(sub: Any) -> str:
    table, names, message = stored_runs.run_table(sandbox()[1].root, sub)
    assert table.empty and names == [], message
    return message


def pick(value: Any) -> str:
    run, message = stored_runs.replay(sandbox()[1].root, value)
    assert run is None, message
    return message


@dataclass
class Said:
    """One bad input to a handler: ``call`` returns the message the page shows."""

    id: str
    call: Callable[[], str]
    says: Sequence[str] = ()


def said(case: Said) -> None:
    before, runs_before = tree(), len(sandbox()[1].runs())
    message = case.call()
    assert isinstance(message, str) and message.strip(), f"{case.id}: no message"
    missing = [s for s in case.says if s.lower() not in message.lower()]
    assert not missing, f"{case.id}: the message {message!r} does not say {missing}"
    assert "Traceback" not in message and "Something went wrong" not in message, message
    assert tree() == before, f"{case.id}: files were written: {sorted(set(tree()) - set(before))}"
    assert len(sandbox()[1].runs()) == runs_before, f"{case.id}: a run was started"
    still_usable()


NAME_RULE = "letters, digits"
MESSAGES = [
    # ---------------------------------------------------------------- the run form
    Said("form-no-experiment", lambda: start(name=None), ["Pick an experiment"]),
    Said("form-unknown-experiment", lambda: start(name="nope"), ["Unknown experiment 'nope'", "list_experiments"]),
    Said("overview-unknown-experiment", lambda: live_run.experiment_overview("nope"), ["Unknown experiment 'nope'"]),
    Said("form-fields-unknown-experiment", lambda: str(live_run.experiment_fields("nope")), ["[]"]),
    Said("form-width-zero", lambda: start(values={"width": "0"}), ["'width' must lie in [1, 1024], got 0"]),
    Said("form-width-text", lambda: start(values={"width": "abc"}), ["width", "'abc'"]),
    Said("form-activation-unknown", lambda: start(values={"activation": "swish"}), ["'swish'", "gelu"]),
    # (the seed field is a browser number field: a JavaScript double, exact up to 2**53 - 1)
    Said("form-seed-negative", lambda: start(seed=-1), ["seed must lie in [0, 9007199254740991], got -1."]),
    Said("form-seed-huge", lambda: start(seed=2**70), ["seed must lie in [0, 9007199254740991]", str(2**70)]),
    Said("form-seed-1e20", lambda: start(seed=1e20), ["seed must lie in [0, 9007199254740991]"]),
    Said("form-seed-2**63-1-as-typed", lambda: start(seed=9223372036854775807.0),  # (it arrives as 2**63)
         ["seed must lie in [0, 9007199254740991], got 9223372036854775808: 2**53 - 1 = 9007199254740991 is the "
          "largest whole number a browser number field carries exactly (larger ones arrive rounded). Enter a value"]),
    Said("form-seed-2**53+1-as-typed", lambda: start(seed=9007199254740992),  # (9007199254740993 arrives so)
         ["seed must lie in [0, 9007199254740991], got 9007199254740992"]),
    Said("form-seed-fraction", lambda: start(seed=2.5), ["seed must be a whole number", "2.5"]),
    Said("form-seed-nan", lambda: start(seed=float("nan")), ["seed must be a whole number", "nan"]),
    Said("form-seed-empty", lambda: start(seed=None), ["seed is empty", "whole number"]),
    Said("form-steps-zero", lambda: start(steps=0), ["steps must lie in [1, 10000000], got 0"]),
    Said("form-steps-huge", lambda: start(steps=10**9), ["steps must lie in [1, 10000000]", str(10**9)]),
    Said("form-steps-text", lambda: start(steps="ten"), ["steps must be a whole number", "'ten'"]),
    Said("form-every-zero", lambda: start(every=0), ["record every Nth step must lie in [1, 10000000], got 0"]),
    Said("form-every-bool", lambda: start(every=True), ["record every Nth step must be a whole number", "True"]),
    Said("form-histograms-text", lambda: start(histograms="yes"), ["histograms", "True or False", "'yes'"]),
    Said("form-device-missing", lambda: start(device="cuda:99"), ["device 'cuda:99'", "cpu"]),
    Said("form-device-meta", lambda: start(device="meta"), ["device 'meta'", "cpu"]),
    # ---------------------------------------------------------------- module globs
    Said("glob-matches-nothing", lambda: start(modules="encoder.*"), ["matches no module", "encoder.*"]),
    Said("glob-malformed", lambda: start(modules="[bad"), ["the glob '[bad' is malformed", "no ']' closes"]),
    Said("glob-not-text", lambda: start(modules=5), ["watch modules must be text", "5"]),
    Said("glob-list", lambda: start(modules=["layers.*"]), ["watch modules must be text", "['layers.*']"]),
    # ---------------------------------------------------------------- record kinds
    Said("record-none-picked", lambda: start(record=[]), ["record: pick at least one of", "activations"]),
    Said("record-unknown", lambda: start(record=["weights"]), ["unknown kind 'weights'", "parameter gradients"]),
    Said("record-not-text", lambda: start(record=[3]), ["unknown kind 3", "activations"]),
    Said("record-watch-switch-name", lambda: start(record="gradients"), ["unknown kind 'gradients'",
                                                                         "output gradients"]),
    Said("record-int", lambda: start(record=5), ["record: expected a list", "5"]),
    # ---------------------------------------------------------------- run names (record to run)
    Said("name-absolute", lambda: start(store="/tmp/evil"), ["run name '/tmp/evil'", "absolute path",
                                                             "relative to the runs root"]),
    Said("name-home", lambda: start(store="~/evil"), ["'~/evil'", "absolute path"]),
    Said("name-drive", lambda: start(store="C:/evil"), ["'C:/evil'", "absolute path"]),
    Said("name-dotdot", lambda: start(store="../evil"), ["'../evil'", "contains '..'", "under the runs root"]),
    Said("name-dotdot-inside", lambda: start(store="a/../../evil"), ["'a/../../evil'", "contains '..'"]),
    Said("name-dot", lambda: start(store="./evil"), ["'./evil'", "contains '.'"]),
    Said("name-empty-part", lambda: start(store="a//b"), ["'a//b'", "empty path component"]),
    Said("name-trailing-slash", lambda: start(store="a/"), ["'a/'", "empty path component"]),
    Said("name-too-long", lambda: start(store="a" * 300), ["300 characters", "too long", "at most 200"]),
    Said("name-5000", lambda: start(store="x/" * 2500), ["5000 characters", "too long"]),
    Said("name-space", lambda: start(store="my run"), ["'my run'", "character ' '", NAME_RULE]),
    Said("name-semicolon", lambda: start(store="run;rm"), ["'run;rm'", "character ';'", NAME_RULE]),
    Said("name-non-ascii", lambda: start(store="läuft"), ["'läuft'", "character 'ä'"]),
    Said("name-backslash", lambda: start(store="a\\b"), ["character '\\\\'", NAME_RULE]),
    Said("name-nul", lambda: start(store="nul\x00"), ["character '\\x00'"]),
    Said("name-hidden", lambda: start(store=".hidden"), ["'.hidden'", "starting with '.'"]),
    Said("name-dash", lambda: start(store="-rf"), ["'-rf'", "starting with '-'"]),
    Said("name-too-deep", lambda: start(store="/".join("a" * 9)), ["9 directories deep", "at most 8"]),
    Said("name-not-text", lambda: start(store=5), ["run name must be text", "5"]),
    Said("name-through-symlink", lambda: start(store="link-out/evil"), ["'link-out/evil'",
                                                                        "leads out of the runs root"]),
    Said("name-symlink-itself", lambda: start(store="link-out"), ["'link-out'", "leads out of the runs root"]),
    Said("name-taken", lambda: start(store="taken"), ["run name 'taken' is taken", "pick a new name"]),
    Said("name-under-a-file", lambda: start(store="a-file/run"), ["'a-file/run'", "'a-file' is a file",
                                                                  "pick another name"]),
    Said("name-is-a-file", lambda: start(store="a-file"), ["'a-file' is a file"]),
    # ---------------------------------------------------------------- runs-root sub-directories (Runs tab)
    Said("sub-root-of-filesystem", lambda: runs("/"), ["sub-directory '/'", "absolute path"]),
    Said("sub-etc", lambda: runs("/etc"), ["sub-directory '/etc'", "absolute path"]),
    Said("sub-proc", lambda: runs("/proc/self/fd"), ["'/proc/self/fd'", "absolute path"]),
    Said("sub-parent", lambda: runs(".."), ["sub-directory '..'", "contains '..'"]),
    Said("sub-parents", lambda: runs("../../.."), ["contains '..'"]),
    Said("sub-parent-slash", lambda: runs("../"), ["sub-directory '../'", "contains '..'"]),  # (not "an empty part")
    Said("sub-5000", lambda: runs("d" * 5000), ["5000 characters", "too long"]),
    Said("sub-symlink-out", lambda: runs("link-out"), ["'link-out'", "leads out of the runs root"]),
    Said("sub-a-file", lambda: runs("a-file"), ["'a-file' is a file under the runs root", "sub-directory"]),
    Said("sub-nothing-yet", lambda: runs("nothing-yet"), ["No sub-directory 'nothing-yet' under the runs root",
                                                          "leave it empty"]),
    Said("sub-not-text", lambda: runs(5), ["sub-directory must be text", "5"]),
    Said("root-not-made-yet", lambda: stored_runs.run_table(RunsRoot(sandbox()[0] / "not-yet"))[2],
         ["No runs yet under", "not-yet"]),
    Said("root-without-runs", lambda: stored_runs.run_table(RunsRoot(sandbox()[0] / "outside"))[2],
         ["No runs yet under", "outside"]),
    # ---------------------------------------------------------------- run picks (Runs tab)
    Said("pick-absolute", lambda: pick("/etc/passwd"), ["run '/etc/passwd'", "absolute path"]),
    Said("pick-parent", lambda: pick("../outside"), ["'../outside'", "contains '..'"]),
    Said("pick-symlink-out", lambda: pick("link-out"), ["'link-out'", "leads out of the runs root"]),
    Said("pick-linked-run", lambda: pick("linked-run"), ["'linked-run'", "leads out of the runs root"]),
    Said("pick-linked-database", lambda: pick("sneaky"), ["'sneaky'", "leads out of the runs root",
                                                          "its database is"]),
    Said("pick-not-a-run", lambda: pick("nothing"), ["not a workbench run"]),
    Said("pick-a-file", lambda: pick("a-file"), ["a-file", "not a workbench run"]),
    Said("pick-not-text", lambda: pick(["taken"]), ["run must be text", "['taken']"]),
    # ---------------------------------------------------------------- a page's run
    Said("attach-unknown", lambda: run_control.attach(sandbox()[1], "r999")[1], ["No run 'r999' in this app"]),
    Said("attach-not-text", lambda: run_control.attach(sandbox()[1], 5)[1], ["No run 5 in this app"]),
    Said("attach-nothing", lambda: run_control.attach(sandbox()[1], None)[1], ["Pick a run from the list"]),
    Said("stop-unattached", lambda: run_control.stop_run(sandbox()[1], None), ["Not attached to a run"]),
    Said("stop-unknown", lambda: run_control.stop_run(sandbox()[1], "x"), ["No run 'x' in this app"]),
    Said("views-unknown-kind", lambda: run_control.run_views(sandbox()[1], None, "weights", "std", "*")[3],
         ["kind must be one of", "'weights'"]),
    Said("views-unknown-statistic", lambda: run_control.run_views(sandbox()[1], None, "activation", "median", "*")[3],
         ["statistic must be one of", "'median'"]),
    # ---------------------------------------------------------------- a run page's controls
    Said("page-unknown-kind", lambda: drawn(kind="weights", at="sites_figure"), ["kind must be one of",
                                                                               "'weights'", "Pick one"]),
    Said("page-kind-not-text", lambda: drawn(kind=3, at="sites_figure"), ["kind must be one of", "got 3"]),
    Said("page-unknown-statistic", lambda: drawn(statistic="median", at="sites_figure"),
         ["statistic must be one of", "'median'"]),
    Said("page-smoothing-one", lambda: drawn(smoothing=1.0, at="metrics_figure"),
         ["smoothing must be a number in [0, 0.99]", "got 1.0"]),
    Said("page-smoothing-negative", lambda: drawn(smoothing=-0.1, at="metrics_figure"), ["got -0.1"]),
    Said("page-smoothing-nan", lambda: drawn(smoothing=float("nan"), at="metrics_figure"), ["got nan"]),
    Said("page-smoothing-text", lambda: drawn(smoothing="0.5", at="metrics_figure"), ["got '0.5'"]),
    Said("page-sites-not-a-list", lambda: drawn(sites=7, at="sites_figure"), ["sites must be a list of names",
                                                                            "got 7"]),
    Said("page-metrics-not-names", lambda: drawn(metrics=[1], at="metrics_figure"), ["metrics must be a list",
                                                                                   "[1]"]),
    Said("page-heatmap-kind", lambda: drawn(heat_kind="weights", at="heatmap_figure"),
         ["heatmap kind must be one of", "'weights'"]),
    Said("page-heatmap-statistic", lambda: drawn(heat_statistic="p99", at="heatmap_figure"),
         ["heatmap statistic must be one of", "'p99'"]),
    # ---------------------------------------------------------------- comparing and exporting stored runs
    Said("compare-one-run", lambda: compared(["taken"]), ["Pick two or more runs"]),
    Said("compare-not-a-list", lambda: compared(5), ["runs to compare must be a list of names", "5"]),
    Said("compare-out-of-root", lambda: compared(["taken", "../outside"]), ["'../outside'", "contains '..'",
                                                                            "two or more runs that open"]),
    Said("compare-linked-run", lambda: compared(["taken", "linked-run"]), ["leads out of the runs root"]),
    Said("compare-unknown-kind", lambda: compared(["taken", "taken"], kind="weights"),
         ["kind must be one of", "'weights'"]),
    Said("compare-unknown-statistic", lambda: compared(["taken", "taken"], statistic="median"),
         ["statistic must be one of", "'median'"]),
    Said("export-unknown-format", lambda: exported("taken", "XLSX"),
         ["format must be one of CSV, Parquet, TensorBoard", "'XLSX'"]),
    Said("export-out-of-root", lambda: exported("../outside", "CSV"), ["Cannot export", "'../outside'",
                                                                       "contains '..'"]),
    Said("export-absolute", lambda: exported("/etc/passwd", "CSV"), ["'/etc/passwd'", "absolute path"]),
    Said("export-linked-database", lambda: exported("sneaky", "CSV"), ["leads out of the runs root"]),
    Said("export-not-a-run", lambda: exported("nothing", "CSV"), ["not a workbench run"]),
    Said("export-nothing-picked", lambda: exported(None, "CSV"), ["Pick a run"]),
]


def drawn(at: str, **controls: Any) -> str:
    """The message a run page shows in a view's place for a control value it cannot draw."""
    from workbench.ui.views import RunView

    page = run_page.draw_page(RunView(), run_page.Controls(**controls))
    return getattr(page, at)["layout"]["annotations"][0]["text"]


def compared(picks: Any, kind: str = "activation", statistic: str = "std") -> str:
    *_, message = stored_runs.compare_runs(stored_runs.ViewCache(sandbox()[1].root), picks, kind, statistic, None)
    return message


def exported(pick: Any, fmt: Any) -> str:
    folder = Path(tempfile.mkdtemp(prefix="workbench-bad-export-"))
    paths, message = stored_runs.export_run(sandbox()[1].root, pick, fmt, folder / "out")
    assert paths == [] and not (folder / "out").exists(), message
    return message


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in MESSAGES])
def test_a_handler_answers_bad_input_with_a_message(case):
    said(case)


def _resolve(name: Any) -> Callable[[], Any]:
    return lambda: sandbox()[1].root.resolve(name)


CASES = [
    Case("resolve-absolute", _resolve("/etc"), PathRefused, ["run name '/etc'", "absolute path"]),
    Case("resolve-dotdot", _resolve("a/../.."), PathRefused, ["'a/../..'", "contains '..'"]),
    Case("resolve-empty", _resolve(""), PathRefused, ["run name is empty"]),
    Case("resolve-blank", _resolve("   "), PathRefused, ["run name is empty"]),
    Case("resolve-long", _resolve("n" * 201), PathRefused, ["201 characters", "at most 200"]),
    Case("resolve-odd", _resolve("a*b"), PathRefused, ["'a*b'", "character '*'"]),
    Case("resolve-symlink-out", _resolve("link-out/x"), PathRefused, ["leads out of the runs root"]),
    Case("resolve-bytes", _resolve(b"run"), PathRefused, ["must be text", "b'run'"]),
    Case("manager-start-out-of-root", lambda: sandbox()[1].start("activation_mlp", {}, 0, 2, store="../x"),
         PathRefused, ["'../x'", "contains '..'"]),
    Case("manager-keep-zero", lambda: RunManager(sandbox()[0] / "r", keep_finished=0), ValueError,
         ["keep_finished must be a positive int, got 0"]),
    Case("manager-max-running-bool", lambda: RunManager(sandbox()[0] / "r", max_running=True), ValueError,
         ["max_running must be a positive int, got True"]),
    Case("root-is-a-file", lambda: RunsRoot(sandbox()[0] / "root" / "a-file"), ValueError,
         ["is a file, not a directory", "--runs-root"]),
    Case("root-empty", lambda: RunsRoot(""), ValueError, ["runs root must be a directory path", "''"]),
    Case("root-of-no-user", lambda: RunsRoot("~nosuchuser-wb/runs"), ValueError,
         ["runs root='~nosuchuser-wb/runs'", "names no user", "--runs-root runs"]),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case):
    before = tree()
    check(case)
    assert tree() == before


def test_the_runs_tab_lists_only_the_runs_inside_the_root():
    base, manager = sandbox()
    table, names, message = stored_runs.run_table(manager.root)
    # not 'linked-run' nor 'sneaky', whose databases lie outside the root
    assert names == ["taken"] and list(table.run) == ["taken"], (names, message)
    assert stored_runs.replay(manager.root, "taken")[0] is not None
