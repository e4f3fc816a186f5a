"""The benchmarks in bench/ still run: each script's smallest run, and the floor variant's hooks.

They are not timed here (speed is measured by running them, not asserted); these tests only keep
them from rotting as the code they measure changes.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import torch

from workbench.instrument import _stats_kernels
from workbench.instrument.torch_internals import installed_hooks

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_instrument_overhead_reports_every_variant():
    out = run_script("instrument_overhead.py", "--quick", "--only", "mlp", "--rounds", "1", "--breakdown")
    bench = load("instrument_overhead")
    assert len(bench.BREAKDOWN) == 4
    for options in bench.BREAKDOWN.values():  # each records one kind
        assert sum(options["watch_options"].values()) == 1
    for variant in [*bench.VARIANTS, *bench.BREAKDOWN]:
        line = next((line for line in out.splitlines() if line.strip().startswith(variant)), None)
        assert line is not None, f"no line for {variant!r} in\n{out}"
        found = re.search(r"([\d.]+) ms +([\d.]+)x +\(([\d.]+)-([\d.]+)\) +([+-][\d.]+) ms", line)
        assert found is not None, line
        step, ratio, low, high = (float(found.group(i)) for i in range(1, 5))
        assert step > 0 and low <= ratio <= high, line  # the median ratio within its quartiles
    assert re.search(r"^  bare .* 1\.00x", out, re.M)


def test_floor_hooks_read_every_tensor_once_and_leave_no_hook_behind(monkeypatch):
    bench = load("instrument_overhead")
    exp = bench.mlp(8, "cpu")
    model = exp.model
    kernels = _stats_kernels.compile_kernels("float32")
    read = []  # numel of each tensor the floor's kernel is given

    def fast(pointer, numel, out):
        read.append(numel)
        kernels[0](pointer, numel, out)

    monkeypatch.setattr(bench, "compile_kernels", lambda dtype: (fast, *kernels[1:]))
    outputs = []  # each module call's output, seen by a hook of the test's own
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: outputs.append(out))
    variant = bench.Variant(exp, floor=True)
    try:
        variant.timed_block(2)  # (the second step reads as much as the first)
    finally:
        handle.remove()
    assert len(outputs) == 2 * sum(1 for _ in model.modules())  # a step calls every module once
    # the Sequential returns its last layer's output: the same tensor, read once
    distinct = list({id(out): out for out in outputs}.values())
    assert len(distinct) < len(outputs)
    # each distinct output and its gradient, each parameter and its gradient, in each step
    sizes = [out.numel() for out in distinct] * 2 + [p.numel() for p in model.parameters()] * 4
    assert sorted(read) == sorted(sizes)
    assert installed_hooks()["_global_forward_hooks"] == 0 and not any(installed_hooks(model)["parameters"])
    assert variant.end_of_step is None


def test_store_overhead_runs():
    out = run_script("store_overhead.py", "--quick", "--rounds", "1")
    assert re.search(r"store rows/s: [\d,]+ \(no histograms\), [\d,]+ \(32-bin histograms\)", out), out
    assert re.search(r"ratio [\d.]+x", out), out
    assert re.search(r"\d+ steps in the store", out), out


def test_model_changes_runs():
    out = run_script("model_changes.py", "--quick", "--block", "1")
    assert re.search(r"^101 modules, 80 parameters", out, re.M), out
    assert re.search(r"watch step +[\d.]+ ms +[\d.]+x bare", out), out
    assert re.search(r"the comparison +[\d.]+ ms +[\d.]+% of the watched step", out), out
    assert re.search(r"step after a swap +[\d.]+ ms", out), out


def test_replay_reports_reading_and_exporting_side_by_side():
    out = run_script("replay.py", "--experiment", "activation_mlp", "--steps", "20", "--rounds", "1")
    assert re.search(r"rows \+ histograms read: read_sql [\d.]+ s \| now [\d.]+ s", out), out
    assert re.search(r"RunView.from_run: rows frame [\d.]+ s \| arrays now [\d.]+ s", out), out
    assert re.search(r"events \(\d+ MB\) written: EventFileWriter [\d.]+ s \| EventFile [\d.]+ s", out), out


def test_query_throughput_runs():
    out = run_script("query_throughput.py", "--rows", "16", "--batches", "2", "--repeats", "1")
    assert re.search(r"^\s+16\s+[\d,]+\s+[\d,]+\s+[\d.]+x", out, re.M), out


def test_hooks_alone_put_the_floors_hooks_in_and_read_nothing(monkeypatch):
    bench = load("instrument_overhead")
    assert bench.VARIANTS["torch's hooks alone"] == {"floor": True, "floor_reads": False}
    exp = bench.mlp(8, "cpu")
    kernels = _stats_kernels.compile_kernels("float32")
    read = []
    monkeypatch.setattr(bench, "compile_kernels", lambda dtype: (lambda pointer, numel, out: read.append(numel),
                                                                 *kernels[1:]))
    hooked = []  # during each step: torch's process-wide forward hooks, and each parameter's hooks
    train_step = exp.step

    def step():
        hooks = installed_hooks(exp.model)
        hooked.append((hooks["_global_forward_hooks"], {len(p or {}) for p in hooks["parameters"]}))
        train_step()

    monkeypatch.setattr(exp, "step", step)
    variant = bench.Variant(exp, **bench.VARIANTS["torch's hooks alone"])
    variant.timed_block(2)
    assert hooked == [(1, {1})] * 2
    assert read == []
    assert installed_hooks()["_global_forward_hooks"] == 0 and not any(installed_hooks(exp.model)["parameters"])


def test_dashboard_reports_refreshes_and_the_live_ratio():
    out = run_script("dashboard.py", "--quick")
    for name in ("activation_mlp", "efficientzero_dynamics"):
        assert re.search(rf"{name}\s+1000 steps: .* ms \(.*x\), .* KiB \(.*x\)", out), out
    assert re.search(r"watch \+ live page: \d+\.\d+x", out), out
    assert re.search(r"watch \+ live page, delivered every step: \d+\.\d+x", out), out
    assert re.search(r"read 2000 steps at a time: \d+\.\d+ s, \d+ MiB", out), out
    assert re.search(r"read at once: \d+\.\d+ s, \d+ MiB", out), out
    span = r"[+-]\d+ DOM nodes, [+-]\d+\.\d MiB of JS heap"
    assert re.search(rf"plots Gradio drops let go: {span}; then {span}", out), out
    assert re.search(r"plots Gradio drops kept: [+-]\d+ DOM nodes", out), out
    page = (r"long tasks \d+% of the window \(\d+ of them\), script, style and layout \d+%; "
            r"a click reaches the server in ")
    for label in ("paced redraws", "every view every tick"):
        assert re.search(rf"{label}: {page}\d+\.\d+ s \(Pause\), \d+\.\d+ s \(Apply\)", out), out


def test_diagnose_reports_its_cost_and_the_live_ratio():
    out = run_script("diagnose.py", "--quick")
    for name in ("activation_mlp", "efficientzero_dynamics"):
        assert re.search(rf"{name}\s+\d+ rows/step: live\s+[\d.]+ us/step, diagnose\(\) of the frame\s+[\d.]+ us/step",
                         out), out
    assert re.search(r"watch \+ findings live: \d+\.\d+x", out), out


def test_histogram_kernels_reports_each_size():
    out = run_script("histogram_kernels.py", "--quick")
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [4096, 262144]
    assert rows[0][-1] == "-" and rows[1][-1] == "us"  # (a tensor below SAMPLE values is not sampled)


def test_compiled_op_reports_each_registration():
    out = run_script("compiled_op.py", "--quick")
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(256, 0), (256, 32)]
    assert all(len(r) == 8 and r[3] == r[5] == r[7] == "us" for r in rows), out


def test_compiled_op_counts_the_op_calls_of_a_workload_s_recorded_step():
    out = run_script("compiled_op.py", "--step", "mlp", "--batch", "8", "--steps", "1")
    # the MLP's 9 module calls: an activation row and an output gradient's each (the batch does not count)
    assert "op calls a recorded step: 18 " in out, out
    assert re.search(r"beyond the reading: -?[\d.]+ us a call", out) and "(floor)" in out, out


def test_profile_watch_lists_the_ops_of_a_watched_step():
    # (rows enough for every op of the step: which ones make a top five is timing, on a busy machine)
    out = run_script("profile_watch.py", "--only", "mlp", "--batch", "8", "--steps", "1", "--rows", "500")
    assert "mlp, cpu, eager, Watch, 1 steps" in out and "Self CPU time total" in out
    assert "aten::addmm" in out and "watch errors: none" in out


def test_profile_watch_times_each_phase_watched_and_bare():
    out = run_script("profile_watch.py", "--only", "mlp", "--batch", "8", "--steps", "1", "--phases")
    number = r" +(-?[\d.]+)"
    phases = re.findall(rf"^(forward|backward|optimizer|rest of the step|w\.step\(\)|sum){number}{number} +[+-][\d.]+",
                        out, re.MULTILINE)
    assert [p[0] for p in phases] == ["forward", "backward", "optimizer", "rest of the step", "w.step()", "sum"], out
    bare, watched = (sum(float(p[i]) for p in phases[:-1]) for i in (1, 2))
    assert abs(float(phases[-1][1]) - bare) < 0.01 and abs(float(phases[-1][2]) - watched) < 0.01, out  # the sums
    assert float(phases[4][1]) < float(phases[4][2]) and re.search(r"ratio [\d.]+x", out), out
    assert "watch errors" not in out, out
