"""Live runs belong to the server: the run manager and the page handlers over it, without a browser.

A "page" here is what a browser tab holds: the id of the run it is attached to,
passed to the handlers the tab's buttons call.
"""

import os
import re
import sqlite3
import time

import pandas as pd
import pytest
import torch

from workbench.experiments.activation_mlp import ActivationMLP
from workbench.instrument import load_run
from workbench.instrument.store import DB_NAME
from workbench.ui import live_run, run_control, run_page, run_tabs, stored_runs
from workbench.ui.runs import RunManager

TINY = {"width": "4", "depth": "1", "batch_size": "8", "n_samples": "64"}


def start(manager, steps, store="", seed=0, **kwargs):
    run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), seed, steps, 1, False, "*", store,
                                      **kwargs)
    assert run is not None, message
    return run


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_two_runs_at_once_a_second_page_attaches_and_stops_one_the_other_finishes(manager):
    long = start(manager, 100_000, store="long", seed=1)
    short = start(manager, 60, store="short", seed=2)
    assert long.id != short.id and long.running
    # the list: both in progress, newest first, with id, experiment, seed and start time
    table = run_control.runs_frame(manager)
    assert list(table.id) == [short.id, long.id] and set(table.status) <= {"running"}
    assert list(table["recording to"]) == ["short", "long"] and list(table.of) == [60, 100_000]
    # as a page shows it: the names may break between their parts (a narrow window), the values are the table's
    styled = run_control.shown_runs_frame(table)
    shown = [[cell["display_value"] for cell in row if cell["type"] == "td"]
             for row in styled._compute()._translate(None, None)["body"]]
    assert [row[1] for row in shown] == ["activation_<wbr>mlp"] * 2 and [row[7] for row in shown] == ["short", "long"]
    pd.testing.assert_frame_equal(styled.data, table)
    assert len(run_control.RUN_WIDTHS) == len(run_control.RUN_DATATYPES) == len(run_control.RUN_COLUMNS)
    choices = run_control.run_choices(manager)
    assert [value for _, value in choices] == [short.id, long.id]
    assert choices[1][0].startswith(f"{long.id} activation_mlp, seed 1, ")

    # the first page started `long` and is closed (or reloaded): it held only the id; a second page
    # lists the runs, attaches to `long` and sees it live
    page, message = run_control.attach(manager, long.id)
    assert page == long.id and f"**{long.label}** - running: step" in message and "of 100000" in message
    wait_for(lambda: long.experiment.step_count >= 3)
    wait_for(lambda: long.view.steps_fed >= 3)
    status, metrics, series, note, latest, anomalies, going = run_control.run_views(manager, page, "activation",
                                                                                    "std", "*")
    text = re.sub(r"<[^>]+>", "", status)  # (the header's text, without the markup that keeps its parts whole)
    assert going and "`running` · step" in text and "of 100000" in text and "loss" in set(metrics.metric)
    assert not latest.empty and "call site" in note and len(series)
    assert long.view.status == "running"

    message = run_control.stop_run(manager, page)
    assert "stopped: step" in message and not long.running and long.outcome == "stopped"
    # the run's views hold every step it ran, and its end (what the page's header shows)
    assert long.view.status == "stopped" and long.view.steps_fed == long.experiment.step_count
    assert "`stopped`" in run_control.run_views(manager, page, "activation", "std", "*")[0]
    short.join(60)
    assert short.outcome == "finished" and "finished: step 60 of 60" in short.status()
    # the stores say the same
    assert load_run(manager.root.path / "long").status == "stopped"
    stored = load_run(manager.root.path / "short")
    assert stored.status == "finished" and stored.steps == list(range(1, 61))
    # both stay listed, finished, with the steps they ran
    table = run_control.runs_frame(manager)
    assert dict(zip(table.id, table.status)) == {long.id: "stopped", short.id: "finished"}
    assert dict(zip(table.id, table.step))[short.id] == 60
    # the note under the list counts them by how they ended (a stopped run is not "finished")
    assert run_control.runs_note(manager) == "0 in progress, 1 finished, 1 stopped."
    # a last refresh of the stopped run, then the page stops asking
    *_, going = run_control.run_views(manager, page, "activation", "std", "*")
    assert not going
    assert "had ended already" in run_control.stop_run(manager, page)


def test_detaching_or_leaving_a_page_never_stops_the_run(manager):
    run = start(manager, 100_000)
    page, _ = run_control.attach(manager, run.id)
    page, message = run_control.detach(manager, page)
    assert page is None and "runs on" in message
    time.sleep(0.3)
    assert run.running and run.state == "running"
    # reattached from another page, it is the same run, further along
    before = run.experiment.step_count
    wait_for(lambda: run.experiment.step_count > before)
    assert run_control.attach(manager, run.id)[0] == run.id
    assert run_control.detach(manager, None) == (None, "Not attached to a run.")
    assert run_control.runs_note(manager) == "1 in progress."
    manager.stop(run.id)
    assert run.outcome == "stopped"


def test_a_page_says_whether_its_run_is_recorded_and_where(manager):
    kept, memory_only = start(manager, 100_000, store="kept"), start(manager, 100_000)
    assert f"recording to `{kept.watch.store.path}`" in run_page.live_header(kept)
    assert "not recorded" not in run_page.live_header(kept)
    # a run started without a run name is in no store: its page says so (the Runs tab will not list it)
    header = run_page.live_header(memory_only)
    assert "not recorded: started without a run name" in header and "Runs tab cannot replay" in header
    assert "recording to" not in header


def test_a_run_whose_step_raises_reads_failed_with_its_error(manager, step_3_raises):
    run = start(manager, 10, store="boom")
    run.join(60)
    assert run.outcome == "failed" and "FloatingPointError" in run.error
    status = run.status()
    assert "failed: step 2 of 10" in status and "FloatingPointError: the loss exploded at step 3" in status
    header = run_page.draw_page(run.view).header  # the page's header: failed, with its error
    assert "`failed`" in header and "```\nFloatingPointError: the loss exploded at step 3\n```" in header
    # (the short message; the traceback folded under it, one click away, as the notebook's Dashboard has it)
    assert "<summary>traceback</summary>" in header and "Traceback (most recent call last):" in header
    assert "Traceback" not in status and "FloatingPointError: the loss exploded at step 3" in status
    assert run_control.runs_frame(manager).status.tolist() == ["failed"]
    stored = load_run(manager.root.path / "boom")
    assert stored.status == "failed" and "the loss exploded at step 3" in stored.metadata["error"]
    assert stored.steps == [1, 2]
    # replayed, its header says the same; compared, the comparison's message says why it failed, in short
    cache = stored_runs.ViewCache(manager.root)
    assert "<summary>traceback</summary>" in stored_runs.stored_header(cache.get("boom")[0], stored, pd.DataFrame())
    start(manager, 2, store="fine").join(60)
    message = stored_runs.compare_runs(cache, ["boom", "fine"], "activation", "norm", None)[4]
    assert "`boom` failed: `FloatingPointError: the loss exploded at step 3`." in message and "Traceback" not in message
    # its training state is that of a step that did not finish: it is not continued
    refused, message = live_run.continue_run(manager, run.id, 5)
    assert refused is None and "failed at step 2" in message and "Start a new run" in message
    assert run_control.run_controls(manager, run.id)["continue"] is False


def test_a_run_failed_before_its_first_step_and_replaced_at_its_name_says_so_not_the_new_runs_data(manager,
                                                                                                 monkeypatch):
    """A run that failed before its first step stored nothing: a new run at its name replaces its directory. The old
    one, kept in memory, read the new run's rows as its own and its page said it records there."""
    train_step = ActivationMLP.train_step

    def broken(self):
        raise FloatingPointError("the first step exploded")

    monkeypatch.setattr(ActivationMLP, "train_step", broken)
    old = start(manager, 5, store="retried")
    old.join(60)
    assert old.outcome == "failed" and not old.replaced
    assert "recording to `" in run_page.live_header(old) and "replaced" not in old.status()
    # each tick lists it and draws its header: its database, unchanged since (written an hour ago), is not opened
    for name in (DB_NAME, f"{DB_NAME}-wal"):
        if (old.watch.store.path / name).exists():
            hour_ago = time.time_ns() - 3600 * 10**9
            os.utime(old.watch.store.path / name, ns=(hour_ago, hour_ago))
    opened = []
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda database, *args, **kwargs: (
        opened.append(database), connect(database, *args, **kwargs))[1])
    for _ in range(5):
        assert run_control.runs_frame(manager)["recording to"].tolist() == ["retried"]
        assert "recording to `" in run_page.live_header(old)
    assert len(opened) <= 1
    monkeypatch.setattr(sqlite3, "connect", connect)
    monkeypatch.setattr(ActivationMLP, "train_step", train_step)
    new = start(manager, 3, store="retried")
    new.join(60)
    assert new.outcome == "finished" and not new.replaced and old.replaced
    assert len(new.frames()[0]) and load_run(manager.root.path / "retried").status == "finished"
    with pytest.raises(ValueError, match=f"run {re.escape(old.label)} recorded to .*retried, which holds another "
                                         "run now"):
        old.frames()
    said = "replaced since by another run"
    assert said in run_page.live_header(old) and said in old.status() and said not in run_page.live_header(new)
    table = run_control.runs_frame(manager).set_index("id")["recording to"]
    assert table[new.id] == "retried" and table[old.id] == "retried (replaced)"


def test_finished_runs_stay_listed_without_a_run_directory_and_the_oldest_are_dropped_past_the_bound(tmp_path):
    manager = RunManager(tmp_path / "runs", keep_finished=2)
    runs = []
    for seed in range(4):
        runs.append(start(manager, 3, seed=seed))
        runs[-1].join(60)
    listed = manager.runs()
    assert [r.id for r in listed] == [runs[3].id, runs[2].id] and manager.dropped == 2
    assert "2 older finished run(s) were dropped from memory" in run_control.runs_note(manager)
    # a page still attached to a dropped run is told so, by name
    status, *_, going = run_control.run_views(manager, runs[0].id, "activation", "std", "*")
    assert "'r1' is no longer in memory" in status and "keeps the last 2" in status and not going
    assert run_control.attach(manager, runs[0].id)[0] is None
    # an id the app never had
    assert "No run 'r99' in this app" in run_control.attach(manager, "r99")[1]
    assert "Pick a run from the list" in run_control.attach(manager, None)[1]
    assert not (tmp_path / "runs").exists()  # no run was recorded: nothing written


def test_a_run_in_progress_keeps_its_place_however_many_finish(tmp_path):
    manager = RunManager(tmp_path / "runs", keep_finished=1)
    try:
        going = start(manager, 100_000)
        for seed in range(3):
            start(manager, 2, seed=seed).join(60)
        assert [r.id for r in manager.runs()] == [going.id, "r4"] and going.running
    finally:
        manager.close()
    assert going.outcome == "stopped"


def test_too_many_runs_at_once_is_a_message_naming_the_limit(tmp_path):
    manager = RunManager(tmp_path / "runs", max_running=2)
    try:
        start(manager, 100_000)
        start(manager, 100_000, seed=1)
        run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), 2, 5, 1, False, "*", "")
        assert run is None and "2 runs are in progress, the most this app runs at once (2)" in message
        assert len(manager.runs()) == 2
    finally:
        manager.close()
    assert all(r.outcome == "stopped" for r in manager.runs())


def test_a_taken_run_name_is_refused_before_anything_starts(manager):
    start(manager, 2, store="taken").join(60)
    run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), 0, 2, 1, False, "*", "taken")
    assert run is None and "run name 'taken' is taken" in message and "pick a new name" in message
    assert len(manager.runs()) == 1 and load_run(manager.root.path / "taken").steps == [1, 2]


def test_a_run_refused_takes_no_id(manager):
    first = start(manager, 2)
    run, message = live_run.start_run(manager, "activation_mlp", dict(TINY), 0, 2, 1, False, "nothing.*", "")
    assert run is None and "nothing.*" in message  # (a module glob that matches no module)
    second = start(manager, 2)
    assert (first.id, second.id) == ("r1", "r2")  # (the refused start did not take r2)


def test_each_app_has_its_own_manager_over_its_root(tmp_path):
    from workbench.ui.app import build_app

    first, second = build_app(runs_root=tmp_path / "a"), build_app(runs_root=tmp_path / "b")
    assert first.run_manager is not second.run_manager
    assert first.run_manager.root.path == (tmp_path / "a").resolve()
    assert second.run_manager.root.path == (tmp_path / "b").resolve()
    assert not (tmp_path / "a").exists()  # made when a run is first recorded


def test_the_command_line_takes_the_runs_root_and_refuses_a_file(tmp_path, monkeypatch, capsys):
    import app as app_script
    import workbench.ui.app

    seen = {}
    monkeypatch.setattr(workbench.ui.app, "launch", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(app_script, "unservable", lambda host, port: None)  # (7860 may be served on this machine)
    app_script.main(["--runs-root", str(tmp_path / "mine"), "--port", "7999"])
    assert seen == {"host": "127.0.0.1", "port": 7999, "share": False, "runs_root": str(tmp_path / "mine")}
    app_script.main([])
    assert seen["runs_root"] == "runs"
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        app_script.main(["--runs-root", str(tmp_path / "file")])
    assert f"runs root {str(tmp_path / 'file')!r} is a file, not a directory" in capsys.readouterr().err


def test_the_command_line_refuses_a_port_in_use_or_out_of_range_in_one_line(tmp_path, monkeypatch, capsys):
    import socket

    import app as app_script
    import workbench.ui.app

    launched = []
    monkeypatch.setattr(workbench.ui.app, "launch", lambda **kwargs: launched.append(kwargs))
    with socket.socket() as server:  # another server listening on a port
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(SystemExit):
            app_script.main(["--port", str(port), "--runs-root", str(tmp_path)])
        assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        app_script.main(["--port", "70000", "--runs-root", str(tmp_path)])
    assert "--port must be a port number in [1, 65535], got 70000" in capsys.readouterr().err
    assert launched == []  # nothing was built or served
    app_script.main(["--port", str(port), "--runs-root", str(tmp_path)])  # closed: the port is free again
    assert launched[0]["port"] == port


def test_the_command_line_takes_an_ipv6_host_in_brackets_as_gradio_serves_it(tmp_path, monkeypatch):
    # (Gradio takes the brackets off "[::1]", as a browser's address writes it, and serves there; the port
    # check bound the bracketed text and refused it: "cannot serve on [::1]:...: Name or service not known")
    import socket

    import app as app_script
    import workbench.ui.app

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    launched = []
    monkeypatch.setattr(workbench.ui.app, "launch", lambda **kwargs: launched.append(kwargs))
    app_script.main(["--host", "[::1]", "--port", str(port), "--runs-root", str(tmp_path)])
    assert launched[0]["host"] == "[::1]" and launched[0]["port"] == port
    with socket.socket(socket.AF_INET6) as server:  # a port in use there is refused, named as given
        server.bind(("::1", 0))
        server.listen()
        taken = server.getsockname()[1]
        assert app_script.unservable("[::1]", taken).startswith(f"port {taken} on [::1] is in use")


def test_a_handler_that_fails_unexpectedly_answers_with_a_message_not_a_bare_error(caplog):
    def broken(value):
        raise KeyError(value)

    guarded = run_tabs._guarded(broken, lambda text: ("kept", text))
    kept, message = guarded("lost")
    assert kept == "kept" and "Something went wrong" in message and "KeyError: 'lost'" in message
    assert "handler broken failed" in caplog.text  # the traceback goes to the server's log


def test_a_run_whose_thread_cannot_start_is_a_message_and_leaves_nothing_open(manager, monkeypatch):
    def refuse(self, on_done=None):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(live_run.LiveRun, "start", refuse)
    run, message = live_run.start_run(manager, "activation_mlp", {}, 0, 5, 1, False, "*", "refused")
    assert run is None and "can't start new thread" in message
    monkeypatch.undo()
    assert manager.runs() == []
    stored = load_run(manager.root.path / "refused")
    assert stored.status == "failed" and "could not start" in stored.metadata["error"]


def test_an_ended_run_continues_as_a_new_run_bit_for_bit_numbered_on(manager):
    """Continue: the steps a 5-step run would have taken after its 3rd, recorded as a run of their own."""
    straight = start(manager, 5, store="straight")
    first = start(manager, 3, store="first")
    long = start(manager, 100_000)
    refused, message = live_run.continue_run(manager, long.id, 2)
    assert refused is None and "is still running; continue it once it has ended" in message
    long.stop()
    for run in (straight, first):
        run.join(60)
    assert first.outcome == "finished"
    assert live_run.continued_name(first, manager.root) == "first-from-4"

    then, message = live_run.continue_run(manager, first.id, 2)
    assert then is not None, message
    assert then.id != first.id and "step" in message and "of 5" in message
    then.join(60)
    assert then.outcome == "finished"
    # the ended run is as it was; the new one took steps 4 and 5, those the straight run took
    assert first.experiment.step_count == 3 and "step 3 of 3" in first.status()
    assert "step 5 of 5" in then.status()
    continued, whole = load_run(manager.root.path / "first-from-4"), load_run(manager.root.path / "straight")
    assert continued.steps == [4, 5] and load_run(manager.root.path / "first").steps == [1, 2, 3]
    assert continued.metadata["continues"].startswith(f"{first.label} (first)")
    # its replay says what it continues (its steps start at 4)
    assert f"continues: `{first.label} (first)`" in stored_runs.replay(manager.root, "first-from-4")[1]
    assert continued.metrics().equals(whole.metrics().query("step > 3").reset_index(drop=True))
    ours = continued.to_pandas().drop(columns=["wall_time"], errors="ignore").reset_index(drop=True)
    theirs = whole.to_pandas().query("step > 3").drop(columns=["wall_time"], errors="ignore").reset_index(drop=True)
    assert ours.equals(theirs)
    for a, b in zip(then.experiment.model.parameters(), straight.experiment.model.parameters()):
        assert torch.equal(a, b)
    assert [row["of"] for row in run_control.runs_frame(manager).to_dict("records") if row["id"] == then.id] == [5]

    # what cannot be continued is told, and nothing starts
    count = len(manager.runs())
    for run_id, steps, store, expected in ((first.id, 0, "", "steps must lie in [1,"),
                                           (first.id, 2, "first", "is taken"),
                                           ("r99", 2, "", "No run 'r99'"),
                                           (first.id, 2, 7, "must be text")):
        none, message = live_run.continue_run(manager, run_id, steps, store)
        assert none is None and message.startswith("**Could not continue:**") or "No run" in message
        assert expected in message, message
    assert len(manager.runs()) == count


def test_the_forms_histogram_bins_reach_the_watch_and_a_bad_count_is_refused_as_the_api_refuses_it(manager):
    # (bins was settable from the Python API only: the app's runs recorded 32 bins, whatever was wanted)
    from workbench.instrument.schema import MAX_BINS

    def started(bins, histograms=True, store=""):
        return live_run.start_run(manager, "activation_mlp", dict(TINY), 0, 2, 1, histograms, "*", store, bins=bins)

    run, message = started("1e2", store="binned")
    assert run is not None, message
    run.join(60)
    assert run.watch.options["bins"] == 100
    assert {len(counts) for counts in load_run(manager.root.path / "binned").histograms().counts} == {100}
    # continued, the run keeps its bin count
    assert run.watch_options["bins"] == 100
    for bins, said in ((MAX_BINS + 1, f"histogram bins must lie in [1, {MAX_BINS}], got {MAX_BINS + 1}: the sample a "
                                      "large tensor's histogram is counted from"),
                       (0, f"histogram bins must lie in [1, {MAX_BINS}], got 0."),
                       ("2.5", "histogram bins must be a whole number in [1, 16384], got '2.5': not a whole number"),
                       ("", "histogram bins is empty; give a whole number in [1, 16384].")):
        run, message = started(bins)
        assert run is None and said in message, (bins, message)
    # the API says the same of a count out of range
    import workbench

    with pytest.raises(ValueError, match=f"at most {MAX_BINS} .the sample a large tensor's histogram is counted"):
        workbench.watch(torch.nn.Linear(2, 2), bins=MAX_BINS + 1)
    # without histograms the box is not read: a run starts whatever it holds, with no histograms
    run, message = started("", histograms=False)
    assert run is not None and run.watch.options["histograms"] is False, message
    run.join(60)
