"""The Experiments / Runs handlers, without a browser."""

import re
import time

import gradio as gr
import pandas as pd
import pytest
import torch

from workbench.ui import live_run, run_control, run_page, stored_runs, views


def finished_run(manager, store="run", **kwargs):
    options = dict(name="activation_mlp", values={"width": "8"}, seed=0, steps=6, every=2, histograms=False,
                   modules="layers.*", store=store)
    options.update(kwargs)
    run, message = live_run.start_run(manager, **options)
    assert run is not None, message
    run.join(60)
    assert not run.running
    return run


def test_the_device_choices_are_usable_and_a_device_this_process_lacks_is_refused_by_name(manager):
    choices = live_run.devices()
    assert choices[0] == "cpu"
    for device in choices:
        assert torch.empty(1, device=device).device.type == device.split(":")[0]
    run = finished_run(manager, device=choices[-1], steps=2)
    assert str(run.experiment.device) == choices[-1] and "finished: step 2 of 2" in run.status()
    missing = f"cuda:{torch.cuda.device_count()}"
    run, message = live_run.start_run(manager, "activation_mlp", {}, 0, 2, 1, False, "*", "", device=missing)
    assert run is None and "Could not start" in message and repr(missing) in message and "cpu" in message


def test_a_live_run_records_every_nth_step_and_its_metrics(manager):
    run = finished_run(manager, "r")
    assert "finished: step 6 of 6" in run.status() and "recording to" in run.status()
    assert run.watch.recorder.records() == []  # (a long run held GBs in the server: its store and views keep it)
    rows, metrics = run.frames()
    assert sorted(set(rows.step)) == [1, 3, 5, 6]  # (every 2nd step, and the run's last)
    assert list(metrics.step) == [1, 2, 3, 4, 5, 6]
    assert set(rows.module) == {"layers.0", "layers.1", "layers.2", "layers.3", "layers.4"}
    long = run.view.metrics_frame()
    assert list(long.metric.unique()) == ["accuracy", "loss"] and len(long) == 12  # in name order, as replayed
    series = run.view.site_series("grad_output", "norm", ["layers.0", "layers.1"])
    assert list(series.step.unique()) == [1, 3, 5, 6]
    want = rows[(rows.kind == "grad_output") & (rows.module == "layers.1")].norm
    assert series[series.site == "layers.1"].value.tolist() == pytest.approx(want.tolist(), rel=1e-6)
    latest = run.view.latest("activation")
    assert latest.step.unique().tolist() == [6]
    assert len(latest) == len(rows[(rows.step == 6) & (rows.kind == "activation")])
    # the stored run (under the manager's root) replays the same rows
    assert (manager.root.path / "r" / "run.sqlite").is_file()
    stored, message = stored_runs.replay(manager.root, "r")
    assert "6 steps stored" in message and "status: `finished`" in message
    pd.testing.assert_frame_equal(stored.to_pandas(), rows, check_exact=False, rtol=1e-12)
    assert list(views.RunView.from_run(stored).metrics_frame().metric.unique()) == ["accuracy", "loss"]
    table, names, _ = stored_runs.run_table(manager.root)
    assert list(table.run) == ["r"] and names == ["r"]
    # what tells runs apart first (a narrow window shows the first columns), the row's run first (a click opens it)
    assert list(table.columns) == ["run", "status", "steps", "start_time", "experiment", "model", "seed", "MB"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", table.start_time[0]), table.start_time[0]
    assert f"started: `{table.start_time[0]}`" in message  # (whole in the run's header; short in a page's table)


def test_the_runs_table_a_page_shows_has_a_short_start_time_and_names_that_break_between_their_parts():
    table = pd.DataFrame({"run": ["sweeps/tanh-lr_3e-3"], "status": ["finished"], "steps": [12000],
                          "start_time": ["2026-11-29 12:07:45 UTC"], "experiment": ["efficientzero_dynamics"],
                          "model": ["DynamicsNetwork"], "seed": [0], "MB": [12.345]})
    styled = stored_runs.shown_runs(table)
    shown = styled._compute()._translate(None, None)["body"][0]
    assert [cell["display_value"] for cell in shown if cell["type"] == "td"] == [
        "sweeps/<wbr>tanh-<wbr>lr_<wbr>3e-<wbr>3", "finished", "12000", "11-29 12:07",
        "efficientzero_<wbr>dynamics", "Dynamics<wbr>Network", "0", "12.3"]
    pd.testing.assert_frame_equal(styled.data, table)  # (what a click on a row reads)
    assert len(stored_runs.RUNS_TABLE_WIDTHS) == len(stored_runs.RUNS_TABLE_DATATYPES) == len(table.columns)
    assert isinstance(stored_runs.shown_runs(table.head(0)), pd.DataFrame)  # (nothing to style)


@pytest.mark.parametrize("model, shown", [
    ("efficientzero_dynamics_atari", "efficientzero_<wbr>dynamics_<wbr>atari"),  # (a registered model's name)
    ("EfficientZeroDynamicsNetwork", "Efficient<wbr>Zero<wbr>Dynamics<wbr>Network"),  # (a class name)
    ("my_ResNet-v2.1", "my_<wbr>Res<wbr>Net-<wbr>v2.<wbr>1"),
    ("MLP", "MLP"),
])
def test_a_model_name_in_the_runs_table_breaks_between_its_parts_snake_or_camel_case(model, shown):
    # (a model's name given in a watch's metadata, efficientzero_dynamics, broke mid-word in an 800 px window:
    # "efficien" "tzero_dy" "namics", only a class name's upper-case letters were places to break)
    table = pd.DataFrame({"run": ["r"], "status": ["finished"], "steps": [3], "start_time": ["2026-11-29 12:07:45 UTC"],
                          "experiment": [None], "model": [model], "seed": [None], "MB": [0.1]})
    body = stored_runs.shown_runs(table)._compute()._translate(None, None)["body"][0]
    assert [cell["display_value"] for cell in body if cell["type"] == "td"][5] == shown


@pytest.mark.parametrize("record, kinds", [
    (["parameters"], {"param"}),
    ("parameters", {"param"}),  # one kind by its name
    (["activations", "parameter gradients"], {"activation", "param_grad"}),
    (None, {"activation", "grad_output", "param", "param_grad"}),
])
def test_a_live_run_records_the_kinds_picked(manager, record, kinds):
    run = finished_run(manager, steps=2, every=1, record=record)
    rows, _ = run.frames()
    assert set(rows.kind) == kinds


def test_a_running_experiment_stops_and_closes_its_watch(manager):
    run, _ = live_run.start_run(manager, "activation_mlp", {}, 0, 100000, 1, False, "*", "")
    run.stop()
    assert not run.running and "stopped: step" in run.status() and run.watch.closed
    assert run.experiment.step_count < 100000


def test_a_paused_run_holds_its_step_takes_interventions_and_resumes_or_stops(manager):
    # the page's Pause, Resume, Stop, Apply, Remove and Continue: off before a run (and for an unknown one) ...
    idle = {"pause": False, "resume": False, "stop": False, "apply": False, "remove": False, "continue": False}
    assert run_control.run_controls(manager, None) == run_control.run_controls(manager, "r99") == idle
    run, _ = live_run.start_run(manager, "activation_mlp", {"width": "8"}, 0, 100000, 1, False, "*", "")
    assert run_control.run_controls(manager, run.id) == {"pause": True, "resume": False, "stop": True, "apply": True,
                                                         "remove": False, "continue": False}
    deadline = time.time() + 60
    while run.experiment.step_count < 3 and time.time() < deadline:  # (past the first steps' one-off work)
        time.sleep(0.05)
    assert "paused" in run_control.pause_run(manager, run.id) and run.state == "paused"
    # (a step in progress when the pause came ends first: a few ms, more on a loaded machine)
    held, deadline = run.experiment.step_count, time.time() + 30
    while True:
        time.sleep(0.5)
        if run.experiment.step_count == held:
            break
        assert time.time() < deadline, "the run never held its step"
        held = run.experiment.step_count
    time.sleep(0.5)
    assert run.experiment.step_count == held and run.running
    assert "paused already" in run_control.pause_run(manager, run.id)
    assert run_control.run_controls(manager, run.id) == {"pause": False, "resume": True, "stop": True, "apply": True,
                                                         "remove": False, "continue": False}
    assert run.view.header()["status"] == "paused" and run_control.runs_frame(manager).status.tolist() == ["paused"]
    record = run.intervene("layers.1", "zero units", units="0")  # (put in between steps while paused)
    assert record.status == "on" and record.start == held + 1
    assert run_control.run_controls(manager, run.id)["remove"]  # (an intervention on: Remove applies)
    assert "running" in run_control.pause_run(manager, run.id, pause=False) and run.state == "running"
    deadline = time.time() + 30
    while run.experiment.step_count <= held + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert run.experiment.step_count > held + 2
    run_control.pause_run(manager, run.id)
    run.stop()  # (a paused run stops at once)
    assert run.state == "stopped" and "had ended" in run_control.pause_run(manager, run.id, pause=False)
    # ... and once it ended, Continue alone
    assert run_control.run_controls(manager, run.id) == {**idle, "continue": True}
    assert "Not attached" in run_control.pause_run(manager, None)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(name=None), "Pick an experiment"),
    (dict(values={"width": "0"}), "'width' must lie in [1, 1024], got 0"),
    (dict(steps=0), "steps must lie in [1, 10000000], got 0"),
    (dict(every="x"), "record every Nth step must be a whole number in [1, 10000000], got 'x'"),
    (dict(modules="encoder.*"), "the glob 'encoder.*' matches no module"),
    (dict(modules="layers.*, [bad"), "modules: the glob '[bad' is malformed: the '[' at position 0 opens"),
    (dict(record=[]), "record: pick at least one of activations, output gradients"),
    (dict(record=["weights"]), "record: unknown kind 'weights'; choose from activations"),
])
def test_bad_input_is_a_message(manager, kwargs, expected):
    options = dict(name="activation_mlp", values={}, seed=0, steps=5, every=1, histograms=False, modules="*",
                   store="")
    options.update(kwargs)
    run, message = live_run.start_run(manager, **options)
    assert run is None and expected in message and manager.runs() == []


def test_replay_needs_a_run_under_the_root(manager):
    assert stored_runs.replay(manager.root, None)[0] is None
    assert "not a workbench run" in stored_runs.replay(manager.root, "nonexistent")[1]


def test_query_stream_runs_live_without_gradients(manager):
    run = finished_run(manager, name="query_stream", values={"key_space": "2000", "batch_size": "500"}, steps=4, every=1,
                       modules="*")
    assert "finished: step 4 of 4" in run.status() and "instrumentation error" not in run.status()
    rows, metrics = run.frames()
    assert set(rows.kind) == {"activation"}
    long = run.view.metrics_frame()
    assert {"map_size", "hit_rate", "new_keys", "rows_per_s", "index_errors"} <= set(long.metric)
    series = run.view.site_series("activation", "max", ["hash_to_int"])
    # the largest index handed out so far is the map size minus one, step by step
    assert list(series.value) == list(metrics.map_size - 1)
    # its heatmap, asked for output gradients (the page's default) it has none of, draws the activations
    # and says so; the picker keeps what was asked
    page = run_page.draw_page(run.view, run_page.Controls(heat_kind="grad_output"))
    assert page.heatmap_figure["layout"]["title"]["text"].startswith("No grad_output rows in this run; activation:")
    assert run_page.page_outputs(page, run_page.new_page_state())[run_page.VIEW_OUTPUTS.index("heat_kind")] == gr.skip()
    asked = run_page.draw_page(run.view, run_page.Controls(heat_kind="activation")).heatmap_figure
    assert asked["layout"]["title"]["text"].startswith("activation:")


def test_ilql_runs_live_and_reports_rewards_every_n_steps(manager):
    run = finished_run(manager, name="ilql", values={"eval_every": "3", "eval_prompts": "8", "dataset_size": "64",
                                            "batch_size": "8"}, steps=3, every=1, modules="v.*")
    assert "finished: step 3 of 3" in run.status(), run.status()
    rows, metrics = run.frames()
    long = run.view.metrics_frame()
    assert {"q_loss", "v_loss", "mean_advantage"} <= set(long.metric)
    rewards = long[long.metric.isin(["policy_reward", "bc_reward", "behaviour_reward"])]
    assert list(rewards.step) == [3, 3, 3]  # evaluated once, at step 3; NaN steps are not plotted
    assert {"v.0", "v.6"} <= set(rows.module)


def test_a_run_recorded_by_watch_shows_empty_experiment_and_seed_and_the_others_whole_seeds(tmp_path):
    # (a run recorded by workbench.watch() has no experiment nor seed: the Runs table showed "nan" for both, and,
    # its seed column made float by them, every other run's seed as "3.000000", over two lines at 800 px)
    import torch

    import workbench
    from workbench.ui.runs import RunsRoot

    net = torch.nn.Linear(2, 2)
    with workbench.watch(net, store=tmp_path / "watched") as w:
        net(torch.ones(1, 2)).sum().backward()
        w.step()
    workbench.experiments.create("activation_mlp", seed=3, width=8).run(1, store=tmp_path / "experiment",
                                                                        progress=False)
    table, names, _ = stored_runs.run_table(RunsRoot(tmp_path))
    shown = stored_runs.shown_runs(table)._compute()._translate(None, None)["body"]
    cells = {row[1]["display_value"]: [cell["display_value"] for cell in row if cell["type"] == "td"]
             for row in shown}
    assert cells["watched"][4:7] == ["", "Linear", ""]
    assert cells["experiment"][4:7] == ["activation_<wbr>mlp", "MLP", "3"]


def test_a_seed_beyond_2_53_shows_as_recorded_beside_a_run_without_one(tmp_path):
    # (the Python API takes seeds up to 2**63 - 1; a run without a seed made the column float, which rounds
    # 2**60 + 1 to 2**60: the table showed 1152921504606846976 for a run of seed 1152921504606846977)
    import torch

    import workbench
    from workbench.ui.runs import RunsRoot

    net = torch.nn.Linear(2, 2)
    with workbench.watch(net, store=tmp_path / "watched") as w:
        net(torch.ones(1, 2)).sum().backward()
        w.step()
    seed = 2**60 + 1
    workbench.experiments.create("activation_mlp", seed=seed, width=8).run(1, store=tmp_path / "experiment",
                                                                           progress=False)
    listed = workbench.list_runs(tmp_path).set_index("run").seed
    assert listed["experiment"] == seed and listed["watched"] is None
    table, _, _ = stored_runs.run_table(RunsRoot(tmp_path))
    shown = stored_runs.shown_runs(table)._compute()._translate(None, None)["body"]
    cells = {row[1]["display_value"]: [cell["display_value"] for cell in row if cell["type"] == "td"]
             for row in shown}
    assert cells["experiment"][6] == str(seed) and cells["watched"][6] == ""


@pytest.mark.parametrize("sub", ["..", "a/../b", "./a"])
def test_a_sub_directory_with_dots_is_refused_as_a_sub_directory_not_as_a_run_name(tmp_path, sub):
    # (the Runs tab's "List runs" of '../..' said "sub-directory '../..' contains '..': a run name stays ...")
    from workbench.ui.runs import RunsRoot

    table, names, message = RunsRoot(tmp_path).list(sub)
    assert table.empty and names == []
    assert f"sub-directory {sub!r} contains" in message and "a sub-directory stays under the runs root" in message
    assert "run name" not in message
