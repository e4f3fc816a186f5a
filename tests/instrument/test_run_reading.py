"""Reading a stored run as a user of the Python API would: fresh metadata, numpy step numbers, empty
ranges refused, ``~`` paths, export's checks and its writing a part at a time."""

import re
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import workbench


def small_run(path, steps=4):
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    w = workbench.watch(model, store=path, metadata={"model": "tiny"})
    for _ in range(steps):
        model(torch.randn(8, 3)).square().mean().backward()
        model.zero_grad()
        w.step(loss=1.0)
    return w


def test_metadata_of_an_open_run_is_read_fresh(tmp_path):
    w = small_run(tmp_path / "run")
    r = workbench.load_run(tmp_path / "run")
    assert r.metadata["status"] == "running" and "status='running'" in repr(r)
    w.close()
    assert r.status == "finished"
    assert r.metadata["status"] == "finished" and "status='finished'" in repr(r)
    assert "end_time" in r.metadata


def test_numpy_step_numbers_are_taken(tmp_path):
    small_run(tmp_path / "run", steps=6).close()
    r = workbench.load_run(tmp_path / "run")
    steps = r.to_pandas().step
    first, last = steps[steps >= 2].min(), steps[steps <= 4].max()
    assert isinstance(first, np.integer)
    part = r.to_pandas(steps=(first, last))
    assert sorted(part.step.unique()) == [2, 3, 4]
    assert len(r.histograms(steps=(np.int64(2), np.int32(3))))
    assert r.step_ranges(np.int64(4)) == [(1, 4), (5, 6)]


def test_an_empty_step_range_is_refused(tmp_path):
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"steps=\(3, 1\)"):
        r.to_pandas(steps=(3, 1))
    with pytest.raises(ValueError, match=r"steps=\(3, 1\)"):
        r.histograms(steps=(3, 1))


def test_home_directory_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    small_run("~/wb_run").close()
    assert (tmp_path / "wb_run").is_dir() and not (tmp_path / "~").exists()
    r = workbench.load_run("~/wb_run")
    assert r.path == tmp_path / "wb_run"
    assert list(workbench.list_runs("~").run) == ["wb_run"]
    assert r.export("~/out/rows.csv") == tmp_path / "out" / "rows.csv"
    assert (tmp_path / "out" / "rows.csv").is_file()


def test_export_refuses_before_reading(tmp_path, monkeypatch):
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")

    def no_read(*args, **kwargs):
        raise AssertionError("the run was read before the export was refused")

    monkeypatch.setattr(type(r), "to_pandas", no_read)
    monkeypatch.setattr(type(r), "metrics", no_read)
    with pytest.raises(ValueError, match="rows.txt"):
        r.export(tmp_path / "rows.txt")
    with pytest.raises(ValueError, match="what must be"):
        r.export(tmp_path / "rows.csv", what="grads")


def test_an_export_whose_packages_are_missing_names_them_to_install(tmp_path, monkeypatch):
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "pyarrow", None)  # (as if not installed: importing it raises ImportError)
        with pytest.raises(ImportError, match="Parquet needs pyarrow: pip install pyarrow"):
            r.export(tmp_path / "rows.parquet")
    for module in ["tensorboard", *(name for name in sys.modules if name.startswith("tensorboard."))]:
        monkeypatch.setitem(sys.modules, module, None)  # (its submodules too, which an earlier test may have imported)
    # the packages by their names: pip install 'workbench[export]' would fetch a project of that name
    with pytest.raises(ImportError, match=r"TensorBoard needs tensorboard and google-crc32c: pip install tensorboard "
                                          r"google-crc32c, or pip install -e '\.\[export\]' in the checkout"):
        r.export(tmp_path / "tb")
    assert not (tmp_path / "tb").exists() and not (tmp_path / "rows.parquet").exists()


def test_export_to_an_unwritable_path_names_it(tmp_path):
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    target = "/proc/no-such-dir/a.csv"
    with pytest.raises(OSError, match="Cannot write /proc/no-such-dir/a.csv.*Pick a path you can write to"):
        r.export(target)
    with pytest.raises(OSError, match="Cannot write /proc/no-such-dir/tb.*Pick a path you can write to"):
        r.export("/proc/no-such-dir/tb")  # (a TensorBoard directory)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_writes_a_long_run_a_part_at_a_time(tmp_path, monkeypatch, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    small_run(tmp_path / "run", steps=7).close()
    r = workbench.load_run(tmp_path / "run")
    monkeypatch.setattr(type(r), "EXPORT_STEPS", 3)
    reads = []
    to_pandas = type(r).to_pandas
    monkeypatch.setattr(type(r), "to_pandas", lambda self, steps=None: reads.append(steps) or to_pandas(self, steps))
    path = r.export(tmp_path / f"rows{suffix}")
    assert reads == [(1, 3), (4, 6), (7, 7)]
    written = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    whole = to_pandas(r)
    assert len(written) == len(whole) and list(written.columns) == list(whole.columns)
    np.testing.assert_allclose(written["mean"].to_numpy(), whole["mean"].to_numpy())


def test_tensorboard_export_written_in_several_batches_reads_back_every_stored_value(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from workbench.instrument.tensorboard import SCALARS, EventFile

    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    with workbench.watch(model, store=tmp_path / "run", histograms=True, bins=6) as w:
        for _ in range(5):
            model(torch.randn(8, 3)).square().mean().backward()
            model.zero_grad()
            w.step(loss=1.0)
    r = workbench.load_run(tmp_path / "run")
    monkeypatch.setattr(EventFile, "BATCH", 1000)  # (a few events a batch: the records of many writes in one file)
    log_dir = r.export(tmp_path / "tb")
    assert len(list(log_dir.iterdir())) == 1
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()  # (its reader checks every record's checksums)
    rows = r.to_pandas()
    tags = events.Tags()
    for row in rows.itertuples(index=False):
        site = f"{row.kind}/{row.module or '(model)'}/{row.tensor}"
        for stat in SCALARS:
            stored = getattr(row, stat)
            if np.isfinite(stored):
                logged = {e.step: e.value for e in events.Scalars(f"{site}/{stat}")}
                assert logged[row.step] == pytest.approx(stored, rel=1e-6), (site, stat, row.step)
    histograms = r.histograms()
    assert len(histograms) and len(tags["histograms"]) == len(set(zip(histograms.kind, histograms.module,
                                                                          histograms.tensor)))
    for h in histograms.itertuples(index=False):
        logged = {e.step: e.histogram_value for e in events.Histograms(f"{h.kind}/{h.module or '(model)'}/{h.tensor}")}
        assert list(logged[h.step].bucket) == h.counts.tolist()
        np.testing.assert_allclose(list(logged[h.step].bucket_limit), h.edges[1:])


def test_event_record_checksums_are_tensorboards():
    pytest.importorskip("tensorboard")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    from workbench.instrument.tensorboard import masked_crc32c

    rng = np.random.default_rng(0)
    messages = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (4, 5, 8, 63, 64, 65, 129, 1000, 4099)]
    messages += [bytes(20), b"\xff" * 9]
    messages += [b"", b"abc"]
    assert [masked_crc32c(m) for m in messages] == [reference(m) for m in messages]


def test_tensorboard_export_keeps_a_logged_nan_and_leaves_out_a_metric_not_logged(tmp_path):
    # (the export read the wide metrics frame, where NaN is both "logged NaN" and "not logged": a NaN loss,
    # the step a researcher looks for, was left out)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = nn.Linear(3, 1)
    with workbench.watch(model, store=tmp_path / "run") as w:
        for loss in [1.0, float("nan"), 0.5]:
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=loss, **({"lr": 0.1} if loss == 1.0 else {}))
    events = EventAccumulator(str(workbench.load_run(tmp_path / "run").export(tmp_path / "tb")),
                              size_guidance={"scalars": 0})
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("metrics/loss")]
    assert [step for step, _ in loss] == [1, 2, 3] and np.isnan(loss[1][1]) and loss[2][1] == 0.5
    assert [(e.step, e.value) for e in events.Scalars("metrics/lr")] == [(1, pytest.approx(0.1))]


def test_tensorboard_export_counts_the_nan_and_infinite_values_of_a_tensor_that_has_them(tmp_path):
    # (its statistics stop where it goes NaN - TensorBoard draws no NaN - and nothing said why)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x)  # (NaN below 0, -inf at 0)

    model = nn.Sequential(nn.Linear(3, 3), Log())
    inputs = [torch.ones(2, 3), -torch.ones(2, 3), torch.ones(2, 3)]
    with workbench.watch(model, store=tmp_path / "run", gradients=False) as w:
        with torch.no_grad():
            model[0].weight.fill_(1.0)
            model[0].bias.fill_(0.0)
            for x in inputs:
                model(x)
                w.step()
    rows = workbench.load_run(tmp_path / "run").to_pandas()
    events = EventAccumulator(str(workbench.load_run(tmp_path / "run").export(tmp_path / "tb")),
                              size_guidance={"scalars": 0})
    events.Reload()
    for module in ("1", "(model)"):  # (the Log's output, and the model's: the same tensor)
        nan = [(e.step, e.value) for e in events.Scalars(f"activation/{module}/out/nan_count")]
        assert nan == [(1, 0.0), (2, 6.0), (3, 0.0)]
        assert [e.step for e in events.Scalars(f"activation/{module}/out/mean")] == [1, 3]
    stored = rows[(rows.module == "1") & (rows.kind == "activation")].nan_count.tolist()
    assert stored == [0, 6, 0]
    assert not any(tag.endswith("_count") for tag in events.Tags()["scalars"] if tag.startswith("activation/0/"))


def test_a_run_with_no_steps_exports_to_every_format(tmp_path):
    # (its TensorBoard export raised IndexError)
    pytest.importorskip("tensorboard")
    pytest.importorskip("pyarrow")
    workbench.watch(nn.Linear(3, 1), store=tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    for name in ["rows.csv", "rows.parquet", "tb"]:
        assert r.export(tmp_path / name).exists()
    assert [path.name.startswith("events.out.tfevents.") for path in (tmp_path / "tb").iterdir()] == [True]


def test_a_tensorboard_export_into_a_directory_of_event_files_is_refused(tmp_path):
    # (a second export added a second event file: TensorBoard read both, each step's values twice)
    pytest.importorskip("tensorboard")
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    first = sorted(r.export(tmp_path / "tb").iterdir())
    with pytest.raises(FileExistsError, match=r"tb already holds TensorBoard event files \(events\.out\.tfevents\."
                                              r"[^)]*\): TensorBoard would show the values of both exports.*overwrite=True"):
        r.export(tmp_path / "tb")
    assert sorted((tmp_path / "tb").iterdir()) == first
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("mine")  # (a directory of other files takes an export)
    assert any(p.name.startswith("events.out.tfevents.") for p in r.export(tmp_path / "notes").iterdir())


def test_compare_runs_tells_apart_runs_of_the_same_name(tmp_path):
    # (runs/tanh/seed0 and runs/relu/seed0 were both "seed0" in the run column: one run as far as it said)
    for folder in ["tanh/seed0", "relu/seed0", "gelu"]:
        small_run(tmp_path / folder, steps=2).close()
    same = workbench.compare_runs([tmp_path / "tanh/seed0", tmp_path / "relu/seed0"], what="metrics")
    assert same.run.tolist() == [str(tmp_path / "tanh/seed0")] * 2 + [str(tmp_path / "relu/seed0")] * 2
    apart = workbench.compare_runs([tmp_path / "tanh/seed0", workbench.load_run(tmp_path / "gelu")])
    assert list(apart.columns[:2]) == ["run", "step"] and set(apart.run) == {"seed0", "gelu"}


def test_parts_of_a_run_without_rows_keep_the_rows_dtypes(tmp_path, monkeypatch):
    # (a part of steps without rows read as object columns: its Parquet export took the first part's schema,
    # all nulls, and failed at the first rows; a concat with other rows made their steps objects)
    pytest.importorskip("pyarrow")
    model = nn.Linear(3, 1)
    with workbench.watch(model, store=tmp_path / "run", every=3, start_step=2) as w:  # (rows at steps 4 and 7)
        for _ in range(7):
            model(torch.randn(4, 3)).sum().backward()
            w.step(loss=1.0)
    r = workbench.load_run(tmp_path / "run")
    whole = r.to_pandas()
    assert sorted(set(whole.step)) == [4, 7] and r.steps[0] == 2
    empty = r.to_pandas(steps=(2, 3))
    assert empty.empty and (empty.dtypes == whole.dtypes).all()
    assert (pd.concat([empty, whole]).dtypes == whole.dtypes).all()
    monkeypatch.setattr(type(r), "EXPORT_STEPS", 2)  # (parts (2, 3), (4, 5), (6, 7), (8, 8): the first has no rows)
    pd.testing.assert_frame_equal(pd.read_parquet(r.export(tmp_path / "rows.parquet")), whole)
    workbench.watch(nn.Linear(3, 1), store=tmp_path / "empty").close()
    nothing = workbench.load_run(tmp_path / "empty").to_pandas()
    assert nothing.empty and (nothing.dtypes == whole.dtypes).all()


def test_a_tensorboard_export_of_the_metrics_writes_them_alone(tmp_path):
    # (what="metrics" was ignored for TensorBoard: every statistic and histogram was written)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    events = EventAccumulator(str(r.export(tmp_path / "tb", what="metrics")), size_guidance={"scalars": 0})
    events.Reload()
    assert events.Tags()["scalars"] == ["metrics/loss"] and not events.Tags()["histograms"]
    assert [e.step for e in events.Scalars("metrics/loss")] == r.steps


def test_a_directory_with_a_dot_in_its_name_takes_a_tensorboard_export_once_made(tmp_path):
    # (tb/lr0.001 was refused as a file of an unknown type, even when it was a directory)
    pytest.importorskip("tensorboard")
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"Cannot export to 'lr0\.001'.*os\.makedirs\(.*lr0\.001'\) for a name "
                                         r"with a dot"):
        r.export(tmp_path / "tb" / "lr0.001")
    (tmp_path / "tb" / "lr0.001").mkdir(parents=True)
    assert any(p.name.startswith("events.out.tfevents.") for p in r.export(tmp_path / "tb" / "lr0.001").iterdir())


def test_a_watch_and_its_stored_run_hint_alike_at_an_abbreviated_kind_or_a_modules_last_name(tmp_path):
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 4)), nn.ReLU())
    model[0].add_module("fc", nn.Linear(4, 4))
    with workbench.watch(model, store=tmp_path / "run") as w:
        model(torch.randn(2, 3)).sum().backward()
        w.step()
    run = workbench.load_run(tmp_path / "run")
    for arguments, hint in [(("0.fc", "act"), "did you mean 'activation'?"),
                            (("0.fc", "grad"), "did you mean 'grad_output', 'param_grad'?"),
                            (("fc", "activation"), "did you mean '0.fc'?")]:
        said = []
        for histograms in (w.histograms, run.histograms):
            with pytest.raises(ValueError, match="did you mean") as raised:
                histograms(*arguments)
            said.append(str(raised.value))
        assert hint in said[0] and said[0] == said[1]


@pytest.mark.parametrize("name", ["rows.csv", "rows.parquet", "metrics.csv"])
def test_an_export_over_a_file_is_refused_unless_overwrite_names_it(tmp_path, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    what = "metrics" if name.startswith("metrics") else "rows"
    target = tmp_path / name
    target.write_text("mine")
    with pytest.raises(FileExistsError, match=rf"{re.escape(str(target))} already exists.*overwrite=True"):
        r.export(target, what)
    assert target.read_text() == "mine"
    written = r.export(target, what, overwrite=True)
    frame = pd.read_csv(written) if name.endswith(".csv") else pd.read_parquet(written)
    assert len(frame) == len(r.metrics() if what == "metrics" else r.to_pandas())
    with pytest.raises(TypeError, match="overwrite must be True or False, got 'yes'"):
        r.export(target, what, overwrite="yes")


def test_a_tensorboard_export_with_overwrite_replaces_the_event_files_and_keeps_the_rest(tmp_path):
    pytest.importorskip("tensorboard")
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    first = [p.name for p in r.export(tmp_path / "tb").iterdir()]
    (tmp_path / "tb" / "notes.txt").write_text("mine")
    r.export(tmp_path / "tb", overwrite=True)
    events = sorted(p.name for p in (tmp_path / "tb").glob("*tfevents*"))
    assert len(events) == 1 and events != first
    assert (tmp_path / "tb" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_tensorboard_export_onto_a_file_names_it_and_how_to_go_on(tmp_path, overwrite):
    # (a file without a suffix where the directory would go was refused as "Cannot write ...: File exists")
    small_run(tmp_path / "run").close()
    r = workbench.load_run(tmp_path / "run")
    (tmp_path / "tb").write_text("mine")
    with pytest.raises(FileExistsError, match=rf"Cannot export to '{re.escape(str(tmp_path / 'tb'))}': a path without "
                                              r"a suffix is a TensorBoard log directory, and a file is there .*Remove "
                                              r"it first, export into another directory, or name a \.csv"):
        r.export(tmp_path / "tb", overwrite=overwrite)
    assert (tmp_path / "tb").read_text() == "mine"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4), nn.Dropout(0.1))


def test_a_run_keeps_each_module_path_s_class_compactly_and_reads_runs_that_kept_them_as_before(tmp_path):
    """module_classes, {path: class} in the metadata, took 88 KB of a 1,500-module model's run, read whole with each
    read of the run's status. Now each class is kept once and each path by its parts (module_class_tree); runs
    stored before still read."""
    import json
    import sqlite3

    from workbench.instrument.sites import module_classes

    shared = nn.ReLU()
    model = nn.Sequential(nn.Linear(3, 3), shared, nn.Sequential(nn.Linear(3, 3), shared),
                          nn.ModuleList(Block() for _ in range(250)))
    expected = module_classes(model)  # (every alias path of the shared ReLU: "1", "2.1")
    assert len(expected) == 7 + 7 * 250 and expected["2.1"] == "torch.nn.modules.activation.ReLU"
    w = workbench.watch(model, modules=["0", "1"], store=tmp_path / "run")
    model[1](model[0](torch.randn(2, 3)))
    w.step()
    w.close()
    run = workbench.load_run(tmp_path / "run")
    assert run.module_classes() == expected
    assert list(run.module_classes()) == list(expected)  # (in the model's order)
    assert "module_classes" not in run.metadata
    assert len(json.dumps(run.metadata["module_class_tree"])) < len(json.dumps(expected)) / 4

    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:  # a run stored as before 2026-11-30
        db.execute("DELETE FROM meta WHERE key = 'module_class_tree'")
        db.execute("INSERT INTO meta VALUES ('module_classes', ?)", (json.dumps(expected),))
    db.close()
    assert workbench.load_run(tmp_path / "run").module_classes() == expected
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:  # and before runs kept them
        db.execute("DELETE FROM meta WHERE key = 'module_classes'")
    db.close()
    assert workbench.load_run(tmp_path / "run").module_classes() is None
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
        damaged = {"classes": ["A"], "tree": [0, {"x": 3}]}
        db.execute("INSERT INTO meta VALUES ('module_class_tree', ?)", (json.dumps(damaged),))
    db.close()
    with pytest.raises(workbench.instrument.RunError, match="node at 'x' is 3: expected a class index below 1"):
        workbench.load_run(tmp_path / "run").module_classes()


def test_compare_runs_keeps_a_metric_named_run_beside_the_column_that_names_the_runs(tmp_path):
    # (pandas' "cannot insert run, already exists" came out of compare_runs(what="metrics"))
    model = nn.Linear(2, 1)
    with workbench.watch(model, store=tmp_path / "a") as w:
        model(torch.randn(3, 2)).sum().backward()
        w.step(run=7.0, loss=2.0)
    with pytest.warns(RuntimeWarning, match=r"run 'a' has a metric named 'run'.*'run \(metric\)'"):
        frame = workbench.compare_runs([tmp_path / "a"], what="metrics")
    assert frame.to_dict("records") == [{"run": "a", "step": 1, "run (metric)": 7.0, "loss": 2.0}]

