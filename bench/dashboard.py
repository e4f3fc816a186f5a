"""What a live run page costs, measured in one process.

1. One refresh of a run page (the header and every figure of the view layer: metrics, a
   statistic per call site, the layer x step heatmap, a distribution, the anomalies) and the
   bytes it sends (the figures' JSON), at 100, 1,000 and 10,000 recorded steps of the
   activation MLP and of the dynamics network, each refresh taking in the steps of one tick
   (10) first, as a live page does. The records are those of a real recorded step of each
   model, replayed with their step numbers (and jittered values): the views' cost depends on
   the rows, not on their values. Goal: 10,000 steps within 1.5x of 100.
2. The training step of the activation MLP with a live page (a RunView fed by the watch's
   stream and a page thread refreshing every second) against the watch alone, the variants
   taking turns round by round; the page's subscription gathers FEED_INTERVAL of steps per
   delivery, and a variant delivered every step shows what that saves (waking the
   subscriber's thread each step interrupts the training thread). Goal: <= 1.03x.
3. Opening a stored run in the Runs tab: the seconds and the memory (peak RSS over the process's
   after its imports) of its views (``RunView.from_run``) and its findings, read
   ``RunView.READ_STEPS`` steps at a time against all at once, each in a fresh process, for a
   stored run of 20,000 steps of the activation MLP (width 16; 300 with --quick).
4. A browser page following a live run (headless chromium, the real app): the DOM nodes and the JS
   heap it keeps (after a garbage collection) over a minute of the run, from its 10th second
   (6 s from its 5th with --quick), with the
   app's release of the plots Gradio drops (``LET_GO_OF_DROPPED_PLOTS``) and without it; with it,
   also over the minute after (whether the page levels off).
5. A browser page following a live ILQL run (headless chromium, the real app; about 100 call sites and
   a dozen metric panels, histograms on), its top in view: the share of a window of seconds the
   browser's main thread spends in long tasks (PerformanceObserver, "longtask") and in script, style
   and layout (the DevTools protocol's Performance metrics), and the seconds
   from a click on Pause (and on Apply, of an intervention) to its handler starting on the server;
   with the page's paced redraws (``run_page.PACED``: the plots in view only, all but the metrics every
   ``HEAVY_TICKS`` ticks) and with every view sent each tick, as before them.

    python bench/dashboard.py [--quick] [--rounds 5] [--parts 1,2,3,4,5]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import workbench
from workbench.ui import figures
from workbench.ui.views import FEED_INTERVAL, RunView

STEPS = (100, 1_000, 10_000)
WORKLOADS = {
    "activation_mlp": dict(activation="relu", depth=3, width=64),
    "efficientzero_dynamics": dict(),
}


def recorded_step(name: str) -> workbench.instrument.StepRecord:
    """One real recorded step of the experiment (with histograms)."""
    exp = workbench.experiments.create(name, seed=0, **WORKLOADS[name])
    with exp.watch(histograms=True) as w:
        exp.step()
        return w.recorder.records()[-1]


def refresh(view: RunView) -> int:
    """Draw a page's views once; returns the bytes a page would receive."""
    site = (view.histogram_sites("activation") or [None])[0]
    drawn = [figures.metrics_figure(view, smoothing=0.6), figures.sites_figure(view, "activation", "std"),
             figures.heatmap_figure(view, "grad_output", "norm")]
    if site is not None:
        drawn.append(figures.distribution_figure(view, "activation", site))
    header = figures.header_markdown(view)
    table = view.anomaly_frame().to_json()
    return sum(len(figures.to_json(f)) for f in drawn) + len(header) + len(table)


def page_cost(name: str, quick: bool) -> list[tuple[int, float, int]]:
    record = recorded_step(name)
    rng = np.random.default_rng(0)
    out = []
    def step(n: int) -> workbench.instrument.StepRecord:
        jitter = 1 + 0.01 * rng.standard_normal(record.sums.shape)
        metrics = {k: v * (1 + 0.01 * rng.standard_normal()) for k, v in record.metrics.items()}
        return dataclasses.replace(record, step=n, sums=record.sums * jitter, metrics=metrics)

    for steps in (STEPS[:2] if quick else STEPS):
        view = RunView(label=name, total=steps + 40)
        for n in range(1, steps + 1):
            view.feed(step(n))
        refresh(view)  # warm: the history taken in
        times, size = [], 0
        for tick in range(3):  # a tick: the steps since the last refresh arrive, then the page draws
            for n in range(steps + 10 * tick + 1, steps + 10 * tick + 11):
                view.feed(step(n))
            start = time.perf_counter()
            size = refresh(view)
            times.append(time.perf_counter() - start)
        out.append((steps, min(times), size))
    return out


#: The page variants: how often the view's subscription delivers (seconds gathered; 0: every step).
PAGES = {"watch + live page": FEED_INTERVAL, "watch + live page, delivered every step": 0.0}


def live_ratios(rounds: int, steps: int) -> dict[str, float]:
    """Median step time of each page variant over the watch alone's."""
    exp = workbench.experiments.create("activation_mlp", seed=0, **WORKLOADS["activation_mlp"])
    exp.run(20)
    times: dict[str, list[float]] = {"watch": [], **{name: [] for name in PAGES}}
    for round_ in range(rounds):
        for variant in (list(times) if round_ % 2 == 0 else list(times)[::-1]):  # (each goes first in turn)
            w = exp.watch()
            stop = threading.Event()
            page = None
            if variant != "watch":
                view = RunView(total=steps)
                w.subscribe(view.feed, interval=PAGES[variant])

                def tick():
                    while not stop.wait(1.0):
                        refresh(view)

                page = threading.Thread(target=tick, daemon=True)
                page.start()
            exp.step()  # warm-up step of the variant
            start = time.perf_counter()
            for _ in range(steps):
                exp.step()
            times[variant].append((time.perf_counter() - start) / steps)
            stop.set()
            if page is not None:
                page.join()
            w.close()
    base = statistics.median(times["watch"])
    return {name: statistics.median(times[name]) / base for name in PAGES}


#: Opens a run in a fresh process: prints the seconds and the peak RSS growth (MiB) of its views and findings.
OPEN = """
import resource, sys, time
import workbench
from workbench.ui.findings import RunFindings
from workbench.ui.views import RunView
RunView.READ_STEPS = int(sys.argv[2])
run = workbench.load_run(sys.argv[1])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
RunView.from_run(run), RunFindings(run).frame()
print(time.perf_counter() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


def open_cost(steps: int) -> dict[str, tuple[float, float]]:
    """Seconds and MiB of opening a stored run of ``steps`` steps, in parts and at once."""
    from workbench.ui.views import RunView

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run"
        workbench.experiments.create("activation_mlp", seed=0, width=16).run(steps, store=path, progress=False)
        out = {}
        for label, size in ((f"{RunView.READ_STEPS} steps at a time", RunView.READ_STEPS), ("at once", 10**9)):
            done = subprocess.run([sys.executable, "-c", OPEN, str(path), str(size)], capture_output=True, text=True,
                                  check=True)
            seconds, mib = map(float, done.stdout.split())
            out[label] = (seconds, mib)
    return out


@contextlib.contextmanager
def served_run_page(app: Any, experiment: str):
    """``app`` served on a free loopback port and a headless chromium page (1400 x 1000) that started a
    run of ``experiment`` for a million steps from its Experiments tab; both closed after."""
    import shutil
    import socket

    from playwright.sync_api import sync_playwright

    from workbench.ui.live_run import experiment_fields

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app.queue()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        args=["--headless", "--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                page.get_by_role("tab", name="Experiments").click()
                page.locator("#experiment-list").get_by_label(experiment, exact=True).check()
                page.wait_for_selector(f"#experiment-overview:has-text('{experiment}')")
                field = experiment_fields(experiment)[-1].label  # (its form drawn, not the last one's)
                page.locator("#run-config").get_by_label(field, exact=True).first.wait_for()
                page.locator("#run-steps input").fill("1000000")
                page.locator("#run-start").click()
                yield page
            finally:
                browser.close()
    finally:
        app.close()
        app.run_manager.close()


def page_growth(seconds: float, release: bool, settle: float = 10.0,
                periods: int = 1) -> list[tuple[float, float]]:
    """DOM nodes and MiB of JS heap a page following a live activation MLP run gains over each of
    ``periods`` spans of ``seconds``."""
    from workbench.ui import app as app_module

    script = app_module.LET_GO_OF_DROPPED_PLOTS
    app_module.LET_GO_OF_DROPPED_PLOTS = script if release else "() => {}"
    with tempfile.TemporaryDirectory() as folder:
        try:
            app = app_module.build_app(runs_root=Path(folder) / "runs")
        finally:
            app_module.LET_GO_OF_DROPPED_PLOTS = script
        with served_run_page(app, "activation_mlp") as page:
            page.locator("#live-heatmap .js-plotly-plot").wait_for(timeout=60_000)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")

            def measure() -> tuple[float, float]:
                cdp.send("HeapProfiler.collectGarbage")
                metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                return metrics["Nodes"], metrics["JSHeapUsedSize"] / 2**20

            page.wait_for_timeout(settle * 1000)  # (the page's first draws and findings settle)
            marks = [measure()]
            for _ in range(periods):
                page.wait_for_timeout(seconds * 1000)
                marks.append(measure())
    return [(after[0] - before[0], after[1] - before[1]) for before, after in zip(marks, marks[1:])]


#: Sums the page's long tasks from when it is installed: ``window.busy()`` gives [ms in long tasks, count].
LONG_TASKS = """() => {
  window.longTasks = [];
  new PerformanceObserver((list) => { window.longTasks.push(...list.getEntries().map(e => e.duration)); })
    .observe({type: "longtask"});
  window.busy = () => [window.longTasks.reduce((a, b) => a + b, 0), window.longTasks.length];
}"""


def page_busy(seconds: float, paced: bool, clicks: int = 3, settle: float = 10.0) -> dict[str, float]:
    """A page following a live ILQL run: the share of ``seconds`` its main thread spent in long tasks,
    and the median seconds from a click on Pause, and on Apply, to its handler starting on the server."""
    from workbench.ui import app as app_module
    from workbench.ui import run_page, run_tabs

    reached: list[float] = []

    def timed(handler):
        def call(*args, **kwargs):
            reached.append(time.monotonic())
            return handler(*args, **kwargs)
        return call

    saved = {name: getattr(run_tabs, name) for name in ("pause_run", "apply_intervention", "IN_VIEW")}
    heavy_ticks = run_page.HEAVY_TICKS
    run_tabs.pause_run, run_tabs.apply_intervention = timed(saved["pause_run"]), timed(saved["apply_intervention"])
    if not paced:  # (every view in view, each drawn every tick: the page before the pacing)
        run_tabs.IN_VIEW = "(...values) => [...values.slice(0, -1), %r]" % ",".join(run_page.IN_VIEW_ONLY)
        run_page.HEAVY_TICKS = 1
    try:
        with tempfile.TemporaryDirectory() as folder:
            try:
                app = app_module.build_app(runs_root=Path(folder) / "runs")
            finally:
                run_tabs.IN_VIEW = saved["IN_VIEW"]  # (read as the app is built)
            with served_run_page(app, "ilql") as page:
                page.locator("#run-status").get_by_text("running").wait_for(timeout=120_000)
                page.wait_for_function("() => document.querySelector('#live-metrics .js-plotly-plot')?.data?.length",
                                       timeout=120_000)
                page.wait_for_timeout(settle * 1000)
                page.evaluate("window.scrollTo(0, 0)")
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")

                def work() -> float:  # (seconds of script, style and layout on the page's main thread so far)
                    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                    return sum(metrics[k] for k in ("ScriptDuration", "RecalcStyleDuration", "LayoutDuration"))

                page.evaluate(LONG_TASKS)
                before = work()
                page.wait_for_timeout(seconds * 1000)
                busy_ms, count = page.evaluate("window.busy()")
                worked = work() - before

                def latency(button: str) -> float:
                    box = page.locator(f"#{button}").bounding_box()
                    before = len(reached)
                    start = time.monotonic()
                    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                    while len(reached) == before:
                        time.sleep(0.02)
                    return reached[-1] - start

                pauses, applies = [], []
                for _ in range(clicks):
                    page.locator("#run-pause").scroll_into_view_if_needed()
                    pauses.append(latency("run-pause"))
                    page.locator("#run-resume:not([disabled])").wait_for(timeout=60_000)
                    page.locator("#run-resume").click()
                    page.locator("#run-pause:not([disabled])").wait_for(timeout=60_000)
                    page.wait_for_timeout(3000)
                page.locator("#intervene").get_by_text("Intervene on this run").click()
                page.locator("#iv-apply:not([disabled])").wait_for(timeout=60_000)
                for _ in range(clicks):
                    page.wait_for_timeout(3000)
                    applies.append(latency("iv-apply"))
    finally:
        run_page.HEAVY_TICKS = heavy_ticks
        run_tabs.pause_run, run_tabs.apply_intervention = saved["pause_run"], saved["apply_intervention"]
    return {"busy": busy_ms / 1000 / seconds, "tasks": count, "work": worked / seconds,
            "pause": statistics.median(pauses), "apply": statistics.median(applies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 steps; one short round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parts", default="1,2,3,4,5", help="the parts to run, e.g. 5 (default: all)")
    args = parser.parse_args()
    parts = {int(part) for part in args.parts.split(",")}
    if 1 in parts:
        print("one refresh of a run page (every view), by recorded steps")
        for name in WORKLOADS:
            rows = page_cost(name, args.quick)
            base_time, base_size = rows[0][1], rows[0][2]
            for steps, seconds, size in rows:
                print(f"  {name:24s} {steps:>6d} steps: {seconds * 1e3:7.1f} ms ({seconds / base_time:4.2f}x), "
                      f"{size / 1024:7.1f} KiB ({size / base_size:4.2f}x)")
    if 2 in parts:
        rounds, steps = (1, 50) if args.quick else (args.rounds, 300)
        print(f"activation_mlp training step over the watch alone's ({rounds} rounds of {steps} steps):")
        for name, ratio in live_ratios(rounds, steps).items():
            print(f"  {name}: {ratio:.3f}x")
    if 3 in parts:
        steps = 300 if args.quick else 20_000
        print(f"opening a stored run of {steps} activation_mlp steps (its views and findings):")
        for label, (seconds, mib) in open_cost(steps).items():
            print(f"  read {label}: {seconds:.2f} s, {mib:.0f} MiB more memory at the peak")
    if 4 in parts:
        seconds, settle = (6, 5) if args.quick else (60, 10)
        print(f"a browser page following a live activation_mlp run for {seconds} s (what it keeps after a GC):")
        for label, release in (("plots Gradio drops let go", True), ("plots Gradio drops kept", False)):
            # (let go, a second span: whether the page levels off once its code is compiled and its caches full)
            spans = page_growth(seconds, release, settle, periods=2 if release else 1)
            print(f"  {label}: " + "; then ".join(f"{nodes:+.0f} DOM nodes, {mib:+.1f} MiB of JS heap"
                                                  for nodes, mib in spans))
    if 5 in parts:
        seconds = 10 if args.quick else 20
        print(f"a browser page following a live ilql run, its top in view ({seconds} s of long tasks; clicks):")
        for label, paced in (("paced redraws", True), ("every view every tick", False)):
            got = page_busy(seconds, paced, clicks=1 if args.quick else 3)
            print(f"  {label}: long tasks {got['busy']:.0%} of the window ({got['tasks']} of them), script, style "
                  f"and layout {got['work']:.0%}; "
                  f"a click reaches the server in {got['pause']:.2f} s (Pause), {got['apply']:.2f} s (Apply)")


if __name__ == "__main__":
    main()
