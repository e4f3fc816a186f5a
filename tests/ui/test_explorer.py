"""The activation explorer: its functions against torch.nn.functional and autograd, without a browser."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from workbench.ui import explorer as ex
from workbench.ui.figures import values

# (name, params, the same function written with torch.nn.functional / torch)
REFERENCES = [
    ("gelu", {}, lambda x: F.gelu(x)),
    ("gelu", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    ("prelu", {"init": -0.3}, lambda x: F.prelu(x, torch.tensor([-0.3], dtype=x.dtype))),
    ("relu", {}, F.relu),
    ("sigmoid", {}, torch.sigmoid),
    ("tanh", {}, torch.tanh),
    ("threshold", {"threshold": 0.5, "value": -2.0}, lambda x: F.threshold(x, 0.5, -2.0)),
]


def reference(function, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f and f' in float64, f' by autograd on torch.nn.functional's function."""
    leaf = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = function(leaf)
    y.sum().backward()
    return y.detach().numpy(), leaf.grad.numpy()


@pytest.mark.parametrize("name, params, function", REFERENCES, ids=[f"{n}{p}" for n, p, _ in REFERENCES])
def test_curves_match_torch_functional_and_the_closed_form_agrees(name, params, function):
    c = ex.curves(name, params, x_range=(-5, 3), points=321)
    assert np.allclose(c.x, np.linspace(-5, 3, 321), atol=1e-6)
    f, df = reference(function, c.x.astype(np.float64))
    assert np.allclose(c.f, f, atol=1e-6)
    assert np.allclose(c.autograd, df, atol=1e-6)
    assert np.allclose(c.closed, df, atol=1e-5)
    assert c.max_difference == pytest.approx(np.abs(c.closed - c.autograd).max()) and c.max_difference < 1e-5


def test_figure_holds_f_and_both_derivatives_of_each_activation_overlaid():
    figure = ex.curves_figure(["relu", ("gelu", {"approximate": "tanh"}), "gelu"], x_range=(-2, 2), points=41)
    traces = {(t["meta"]["label"], t["meta"]["curve"]): t for t in figure["data"]}
    assert set(traces) == {(label, curve) for label in ("relu", "gelu(approximate='tanh')", "gelu")
                           for curve in ("f", "closed", "autograd")}
    x = values(traces["gelu(approximate='tanh')", "f"]["x"]).astype(np.float64)
    f, df = reference(lambda t: F.gelu(t, approximate="tanh"), x)
    assert np.allclose(values(traces["gelu(approximate='tanh')", "f"]["y"]), f, atol=1e-6)
    assert np.allclose(values(traces["gelu(approximate='tanh')", "autograd"]["y"]), df, atol=1e-6)
    assert traces["relu", "closed"]["xaxis"] == "x2"  # f' on the right-hand panel
    assert "max |closed − autograd| = 0" in traces["relu", "autograd"]["name"]
    table = ex.differences_markdown(["relu", "gelu"], x_range=(-2, 2), points=41)
    assert "| relu | 0 |" in table and "| gelu |" in table


def test_prelus_init_field_says_what_it_sets():
    # (the field's help read "the initial value of every a": a letter of the formula the page does not show)
    (init,) = [f for f in ex.explorer_fields("prelu") if f.label == "init"]
    assert init.info == "the initial value of every slope a, PReLU's slope for x < 0", init.info


def test_the_curves_figure_grows_with_its_legend():
    # (seven activations in a fixed 420 px: Plotly gives a legend half the height, and scrolled the rest out of view
    # in an 800 px window - in the browser, the legend's scroll bar had a height; with this one it has none)
    three = ex.curves_figure(["gelu", "relu", "tanh"], points=11)["layout"]["height"]
    everything = ex.curves_figure(ex.activation_names(), points=11)["layout"]["height"]
    assert three == ex.CURVES_HEIGHT
    assert everything == ex.CURVES_HEIGHT + ex.CURVES_HEIGHT_PER_ACTIVATION * (len(ex.activation_names()) - 3)
    # half of it holds a legend of an activation's two lines (each ~19 px, ~10 px between activations) per row,
    # two activations a row at 800 px
    rows = math.ceil(len(ex.activation_names()) / 2)
    assert everything / 2 >= rows * (2 * 19 + 10) + 40


def test_parameters_by_name_that_are_not_a_dict_are_named():
    # (a raw "TypeError: 'int' object is not iterable")
    with pytest.raises(TypeError, match=r"The parameters of 'relu' are a dict such as \{'init': 0.1\}, got 3"):
        ex.curves_figure("relu", params={"relu": 3})
    with pytest.raises(TypeError, match=r"The parameters of 'prelu' are a dict such as \{'init': 0.1\}, got 0.1"):
        ex.curves_figure([("prelu", 0.1)])


def test_each_panels_y_axis_is_titled_with_what_its_curves_are():
    figure = ex.curves_figure(["relu", "gelu"], x_range=(-2, 2), points=41)

    def title(trace):  # (the layout's key of a trace's y axis: "y" -> yaxis, "y2" -> yaxis2)
        return figure["layout"]["yaxis" + trace.get("yaxis", "y")[1:]]["title"]["text"]

    titles = {t["meta"]["curve"]: title(t) for t in figure["data"]}
    assert titles == {"f": "f(x)", "closed": "f′(x)", "autograd": "f′(x)"}
    assert {t["text"] for t in figure["layout"]["annotations"]} == {
        "f(x)", "f′(x): closed form (solid), autograd (dotted)"}


def test_a_users_activation_is_listed_and_drawn_and_a_wrong_derivative_shows(scratch_model):
    class Softplus2(torch.nn.Module):
        """Softplus with a sharpness."""

        def __init__(self, beta: float = 2.0):
            super().__init__()
            self.beta = beta

        def forward(self, x):
            return F.softplus(x, beta=self.beta)

    inputs = lambda m, b, g=None: ((torch.randn(b, 3, generator=g),), {})  # noqa: E731
    scratch_model("softplus2", family="activation", example_inputs=inputs,
                  derivative=lambda m, x: torch.sigmoid(m.beta * x))(Softplus2)
    scratch_model("softplus_wrong", family="activation", example_inputs=inputs,
                  derivative=lambda m, x: torch.sigmoid(x))(Softplus2)
    scratch_model("softplus_bare", family="activation", example_inputs=inputs)(Softplus2)
    assert {"softplus2", "softplus_wrong", "softplus_bare"} <= set(ex.activation_names())
    assert [f.label for f in ex.explorer_fields("softplus2")] == ["beta"]
    c = ex.curves("softplus2", {"beta": 3.0}, points=101)
    f, _ = reference(lambda t: F.softplus(t, beta=3.0), c.x.astype(np.float64))
    assert np.allclose(c.f, f, atol=1e-6) and c.max_difference < 1e-6 and c.label == "softplus2(beta=3.0)"
    wrong = ex.curves("softplus_wrong", points=101)
    assert wrong.max_difference == pytest.approx(np.abs(torch.sigmoid(torch.tensor(wrong.x)).numpy()
                                                        - df_of(wrong.x, 2.0)).max(), abs=1e-6)
    assert wrong.max_difference > 0.1  # the disagreement is shown, not hidden
    bare = ex.curves("softplus_bare", points=11)
    assert bare.closed is None and bare.max_difference is None
    figure, message = ex.draw_curves(["softplus_bare"], -1, 1, 11, {})
    assert "no closed form in its spec" in message
    assert [t["meta"]["curve"] for t in figure["data"]] == ["f", "autograd"]


def df_of(x, beta):
    return reference(lambda t: F.softplus(t, beta=beta), x.astype(np.float64))[1]


def test_form_values_change_the_curve_and_the_fixed_parameters_are_left_out():
    assert [f.label for f in ex.explorer_fields("prelu")] == ["init"]
    assert [f.label for f in ex.explorer_fields("threshold")] == ["threshold", "value"]
    state = ex.set_param({}, "threshold", "value", -1.0)
    state = ex.set_param(state, "threshold", "threshold", 1.0)
    figure, message = ex.draw_curves(["threshold"], -3.0, 3.0, 61.0, state)
    f = next(t for t in figure["data"] if t["meta"]["curve"] == "f")
    drawn = ~np.isnan(values(f["y"]))  # (a gap where it jumps, after x = 1)
    x = values(f["x"]).astype(np.float64)
    assert list(x[~drawn]) == pytest.approx([1.05])
    assert np.allclose(values(f["y"])[drawn], F.threshold(torch.tensor(x[drawn]), 1.0, -1.0).numpy(), atol=1e-6)
    assert "threshold(threshold=1.0, value=-1.0)" in message


@pytest.mark.parametrize("call, expected", [
    (dict(names=["relu"], low=2.0, high=-2.0), "The range must run from low to high, got [2, -2]"),
    # (an empty number field sends None: the message says what that means, not "got None")
    (dict(names=["relu"], low=None), "The range's low end (x from) must be a finite number: the field is "
                                     "empty, or holds a number beyond the floating-point range (such as 1e400). "
                                     "Enter e.g. -4."),
    (dict(names=["relu"], points=None), "The number of points must be a whole number in [2, 20,001]: the field is "
                                        "empty"),
    # (beyond float32's largest value: torch refused to make the sample points, a raw RuntimeError)
    (dict(names=["relu"], high=1e308), "The range's high end (x to) must be in [-3.40282e+38, 3.40282e+38] (the sample "
                                       "points are float32), got 1e+308. Enter e.g. 4."),
    (dict(names=["relu"], high=1e39), "The range's high end (x to) must be in [-3.40282e+38, 3.40282e+38]"),
    (dict(names=["relu"], low=-1e39), "The range's low end (x from) must be in [-3.40282e+38, 3.40282e+38]"),
    # (each end fits, the step between points overflows: the points were NaN)
    (dict(names=["relu"], low=-3e38, high=3e38), "The range [-3e+38, 3e+38] is wider than float32 can hold "
                                                 "(high - low must be at most 3.40282e+38). Narrow it"),
    (dict(names=["relu"], points=1.0), "The number of points must be a whole number in [2, 20,001], got 1"),
    (dict(names=["relu"], points=2.5), "got 2.5"),
    (dict(names=[]), "Pick at least one activation"),
    (dict(names=["relux"]), "Unknown model 'relux'. Did you mean 'relu'"),
    (dict(names=["mlp"]), "'mlp' is a 'mlp' model, not an activation"),
    (dict(names=["gelu"], state={"gelu": {"approximate": "fast"}}), "'approximate' must be one of ['none', 'tanh']"),
    (dict(names=["prelu"], state={"prelu": {"init": "x"}}), "init expects float, could not read 'x'"),
])
def test_bad_curve_settings_are_messages(call, expected):
    arguments = dict(names=None, low=-4.0, high=4.0, points=401, state={}) | call
    figure, message = ex.draw_curves(arguments["names"], arguments["low"], arguments["high"], arguments["points"],
                                     arguments["state"])
    assert expected in message, message
    assert figure["data"] == []


@pytest.mark.parametrize("low, high", [(-1.7e38, 1.7e38), (0, float(np.finfo(np.float32).max)),
                                       (-float(np.finfo(np.float32).max), 4)])
def test_the_widest_ranges_float32_holds_are_drawn(low, high):
    figure, message = ex.draw_curves(["relu"], low, high, ex.MAX_POINTS)
    f = next(t for t in figure["data"] if t["meta"]["curve"] == "f")
    x = values(f["x"])
    assert np.isfinite(x).all() and x[0] == np.float32(low) and x[-1] == np.float32(high), message
    drawn = ~np.isnan(values(f["y"]))  # (a gap where a step looks like a jump at this scale)
    assert drawn.sum() >= ex.MAX_POINTS and np.array_equal(values(f["y"])[drawn], np.maximum(x, 0)[drawn])


def test_push_through_counts_dead_saturated_and_negative_as_numpy_does():
    pushed = ex.push_through("tanh", source=ex.normal(0.5, 3.0), samples=20_000, seed=3, saturation=0.1)
    x = pushed.x.astype(np.float64)
    assert abs(x.mean() - 0.5) < 0.1 and abs(x.std() - 3.0) < 0.1
    assert np.allclose(pushed.y, np.tanh(x), atol=1e-6)
    slope = 1 - np.tanh(x) ** 2
    # in float32, tanh(x) rounds to ±1 past |x| ≈ 9: no gradient passes there (dead), as in training
    assert pushed.fractions["dead"] == pytest.approx(np.mean(np.abs(x) > 9.0), abs=2e-4)
    assert pushed.fractions["dead"] > 0
    assert pushed.fractions["saturated"] == pytest.approx(np.mean((slope < 0.1) & (np.abs(x) <= 9.0)), abs=2e-4)
    assert pushed.fractions["negative"] == np.mean(x < 0)

    relu = ex.push_through("relu", source=ex.uniform(-1, 3), samples=10_000, seed=0)
    x = relu.x
    assert x.min() >= -1 and x.max() < 3
    assert relu.fractions == {"dead": np.mean(x <= 0), "saturated": 0.0, "negative": 0.0}

    shifted = ex.push_through("threshold", {"threshold": 1.0, "value": -0.5}, ex.normal(0, 1), samples=10_000)
    assert shifted.fractions["dead"] == np.mean(shifted.x <= 1.0)
    assert shifted.fractions["negative"] == np.mean((shifted.x <= 1.0) | (shifted.x < 0))
    figure = ex.distribution_figure(shifted)
    bars = {t["meta"]["side"]: t for t in figure["data"]}
    assert values(bars["input"]["y"]).sum() == pytest.approx(1.0, abs=1e-4)
    assert values(bars["output"]["y"]).sum() == pytest.approx(1.0, abs=1e-4)
    assert "dead" in figure["layout"]["title"]["text"]


@pytest.mark.parametrize("make, expected", [
    (lambda: ex.normal(0, 0), "The normal's std must be > 0, got 0"),
    (lambda: ex.normal(float("nan"), 1), "The normal's mean must be a finite number, got nan"),
    # (the uniform's ends named as its own fields, low and high: the messages named the curves' x from and x to)
    (lambda: ex.uniform(1, 1), "The range must run from low to high, got [1, 1]. Make low smaller than high, "
                               "e.g. [-3, 3]."),
    (lambda: ex.uniform(-1e39, 4), "The range's low end (low) must be in [-3.40282e+38, 3.40282e+38]"),
    (lambda: ex.uniform(0, float("nan")), "The range's high end (high) must be a finite number, got nan. Enter e.g. 3"),
    (lambda: ex.uniform(-3e38, 3e38), "The range [-3e+38, 3e+38] is wider than float32 can hold"),
    (lambda: ex.push_through("relu", samples=0), "The number of samples must be a whole number in [1, 2,000,000]"),
    (lambda: ex.push_through("relu", saturation=-1), "The saturation threshold must be > 0, got -1"),
    (lambda: ex.push_through("relu", seed=-1), "seed must be an int in [0, 2**63 - 1]"),
])
def test_bad_distribution_settings_raise_naming_the_value(make, expected):
    with pytest.raises(ValueError) as info:
        make()
    assert expected in str(info.value)


def test_a_normal_whose_samples_float32_cannot_hold_is_refused_by_name_and_wide_outputs_are_drawn(scratch_model):
    # mean 1e38 and std 1e38: most samples overflowed float32 to inf, and the output histogram raised a raw IndexError
    with pytest.raises(ValueError, match=r"The normal with mean 1e\+38 and std 1e\+38 gives samples beyond float32's "
                                         r"range .* Make the mean or the std smaller"):
        ex.push_through("relu", source=ex.normal(1e38, 1e38), samples=1000)
    figure, message = ex.draw_distribution("relu", {}, "normal", 1e38, 1e38, -3, 3)
    assert "The normal with mean 1e+38 and std 1e+38" in message and "IndexError" not in message
    # outputs spread wider than float32's range (x from -1e38 to 1e38, times 3) are binned, not an IndexError

    class Triple(torch.nn.Module):
        def forward(self, x):
            return 3 * x

    scratch_model("triple", family="activation", example_inputs=lambda m, b, g=None: ((torch.ones(b),), {}))(Triple)
    figure, message = ex.draw_distribution("triple", {}, "uniform", 0, 1, -1e38, 1e38, samples=1000)
    output = next(t for t in figure["data"] if t["meta"]["side"] == "output")
    assert "triple" in message and values(output["y"]).sum() > 0.5, message


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Two short activation_mlp runs: one with histograms, one without."""
    root = tmp_path_factory.mktemp("explorer") / "runs"
    for name, histograms in (("with-histograms", True), ("statistics-only", False)):
        exp = workbench.experiments.create("activation_mlp", seed=0, activation="tanh", depth=2, width=8)
        exp.run(5, store=root / name, histograms=histograms, progress=False)
    return root


def test_the_pages_seed_fields_take_what_a_browser_number_field_carries_exactly():
    """A number field holds a JavaScript double: 2**63 - 1 typed arrives as 2**63, 2**53 + 1 as 2**53."""
    limit = "2**53 - 1 = 9007199254740991 is the largest whole number a browser number field carries exactly"
    for typed in (9223372036854775807.0, 9007199254740992):
        figure, message = ex.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed=typed, samples=100)
        assert f"The seed must be a whole number in [0, 9007199254740991], got {int(typed)}: {limit}" in message
        assert figure["data"] == []
        comparison, message = ex.start_comparison(None, ["relu"], 5, typed, 1, 4, 0.01, "moons", ex.MODES[0])
        assert comparison is None and f"got {int(typed)}: {limit}" in message
    _, message = ex.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed=-1.0, samples=100)
    assert "The seed must be a whole number in [0, 9007199254740991], got -1. Enter e.g. 0." in message
    _, message = ex.draw_distribution("relu", {}, "normal", 0.0, 1.0, -3, 3, seed=9007199254740991.0, samples=100)
    assert "**relu** on 100 samples" in message
    assert ex.push_through("relu", samples=10, seed=2**63 - 1).x.shape == (10,)  # (the Python API: as before)


def test_recorded_pre_activations_come_from_the_histogram_when_there_is_one(stored):
    run = workbench.load_run(stored / "with-histograms")
    assert ex.stored_runs(stored) == ["statistics-only", "with-histograms"] or \
        sorted(ex.stored_runs(stored)) == ["statistics-only", "with-histograms"]
    assert list(ex.recorded_sites(run)) == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"]
    pushed = ex.push_through("relu", source=ex.recorded(run, "layers.2"), samples=50_000)
    assert "the histogram recorded at layers.2 at step 5 of run with-histograms" in pushed.source
    hist = run.histograms(module="layers.2", kind="activation")
    hist = hist[hist.step == 5].iloc[0]
    edges, counts = hist.edges, hist.counts
    assert edges[0] <= pushed.x.min() and pushed.x.max() <= edges[-1] + 1e-6
    drawn, _ = np.histogram(pushed.x, bins=edges)
    assert np.allclose(drawn / drawn.sum(), counts / counts.sum(), atol=0.01)
    rows = run.to_pandas()
    row = rows[(rows.step == 5) & (rows.module == "layers.2") & (rows.kind == "activation")].iloc[0]
    assert abs(pushed.x.mean() - row["mean"]) < 0.1 * row["std"] + 0.02


def test_recorded_statistics_only_give_a_clipped_normal_said_so(stored):
    run = workbench.load_run(stored / "statistics-only")
    pushed = ex.push_through("tanh", source=ex.recorded(run, "layers.0", step=3), samples=50_000)
    rows = run.to_pandas()
    row = rows[(rows.step == 3) & (rows.module == "layers.0") & (rows.kind == "activation")].iloc[0]
    assert "a normal with the mean" in pushed.source and "the run stored statistics, not values" in pushed.source
    assert row["min"] - 1e-6 <= pushed.x.min() and pushed.x.max() <= row["max"] + 1e-6
    assert abs(pushed.x.mean() - row["mean"]) < 0.1 * row["std"]
    with pytest.raises(ValueError, match="recorded no activation at 'layers.9'; its sites are"):
        ex.recorded(run, "layers.9")
    # (a bad step named with what a step is: the bound said was 2**62, "[0, 4,611,686,018,427,387,904]")
    for bad in (-5, 0, 2.5, "three"):
        with pytest.raises(ValueError, match=r"^step must be a whole number >= 1, a step the run recorded \(None: "
                                             rf"the last\), got {re.escape(repr(bad))}\.$"):
            ex.recorded(run, "layers.0", step=bad)
    with pytest.raises(ValueError, match=r"has no 'layers.0' row at step 9999; it recorded the site at steps 1 to 5"):
        ex.push_through("tanh", source=ex.recorded(run, "layers.0", step=9999), samples=10)


def test_recorded_takes_the_live_run_that_stores_one_and_says_how_of_one_that_stores_nothing(tmp_path):
    """A notebook's ``run`` is a background run (``run = exp.start(...)``): given to the explorer it was refused as
    "a run is opened by its directory path", though it wrote one."""
    exp = workbench.experiments.create("activation_mlp", seed=0, depth=2, width=8)
    run = exp.start(3, store=tmp_path / "live")
    run.join()
    from_run = ex.push_through("relu", source=ex.recorded(run, "layers.0"), samples=1000)
    from_path = ex.push_through("relu", source=ex.recorded(tmp_path / "live", "layers.0"), samples=1000)
    assert np.array_equal(from_run.x, from_path.x) and "at step 3 of run live" in from_run.source
    assert ex.recorded_sites(run.watch) == ex.recorded_sites(tmp_path / "live")
    assert ex.activation_inputs(run) == ["layers.0", "layers.2"]
    unstored = workbench.experiments.create("activation_mlp", seed=0, depth=2, width=8).start(1)
    unstored.join()
    with pytest.raises(TypeError, match=r"BackgroundRun\('activation_mlp', finished.*stores no run to draw from.*"
                                        r"exp\.start\(steps, store='runs/name'\)"):
        ex.recorded(unstored, "layers.0")
    with pytest.raises(TypeError, match="a run is opened by its directory path .*got 42"):
        ex.recorded(42, "layers.0")


def test_the_app_handler_reads_a_recorded_run_and_refuses_bad_names(stored):
    from workbench.ui.runs import RunsRoot

    root = RunsRoot(stored)
    assert ex.run_sites(root, "with-histograms")[0] == "layers.0"
    figure, message = ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, root, "with-histograms",
                                           "layers.0", 1000, 0, 0.05)
    assert "histogram recorded at layers.0" in message and len(figure["data"]) == 2
    figure, message = ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, root, "../../etc", "x")
    assert figure["data"] == [] and "etc" in message
    figure, message = ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, root, "with-histograms", None)
    assert "Pick a call site" in message
    # no run picked: which to pick, or where none is stored yet and how to record one
    assert "Pick a stored run" in ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, root, None, None)[1]
    empty = RunsRoot(stored / "nothing-here")
    message = ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, empty, None, None)[1]
    assert "No stored runs under" in message and "nothing-here" in message and "record to run" in message
    figure, message = ex.draw_distribution("relu", {}, "normal", 0, -1, -1, 1)
    assert "The normal's std must be > 0, got -1" in message


def test_a_recorded_run_without_activations_says_so_rather_than_to_pick_a_site(tmp_path):
    # (the newest run, picked first, had recorded no step: the page asked to pick a call site from an empty list)
    from workbench.ui.runs import RunsRoot

    exp = workbench.experiments.create("activation_mlp", seed=0, activation="relu", depth=1, width=4)
    exp.run(0, store=tmp_path / "no-steps", progress=False)
    root = RunsRoot(tmp_path)
    assert ex.run_sites(root, "no-steps") == []
    expected = "Run 'no-steps' has recorded no activations (no step yet): pick another run"
    for site in (None, "layers.0"):
        figure, message = ex.draw_distribution("relu", {}, "recorded run", 0, 1, -1, 1, root, "no-steps", site)
        assert figure["data"] == [] and expected in message and "Pick a call site" not in message, message
    # (from Python, as a notebook calls it: no page's button to press)
    with pytest.raises(ValueError, match=r"no step yet\): pass another run, or call this again once it has"):
        ex.recorded(tmp_path / "no-steps", "layers.0")


def _stored(path, model):
    """``model`` watched into a run at ``path`` for two steps."""
    with workbench.watch(model, store=path) as w:
        for _ in range(2):
            model(torch.randn(8, 2)).sum().backward()
            w.step()


def test_the_default_recorded_site_feeds_an_activation_or_the_message_says_none_does(tmp_path):
    # (the first site was picked: e.g. query_stream's hash `aggregator`, ~1e18, "dead 100%" through tanh)
    from workbench.ui.runs import RunsRoot

    torch.manual_seed(0)
    _stored(tmp_path / "mlp", nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4),
                                            workbench.create_model("relu"), nn.Linear(4, 1)))
    _stored(tmp_path / "linear", nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1)))
    root = RunsRoot(tmp_path)
    assert ex.run_sites(root, "mlp")[0] == "0"
    assert ex.activation_inputs(workbench.load_run(tmp_path / "mlp")) == ["1", "3"]  # (torch's and ours)
    assert ex.default_site(root, "mlp") == "1"
    _, message = ex.draw_distribution("tanh", {}, "recorded run", 0, 1, -1, 1, root, "mlp", "1", 1000, 0, 0.05)
    assert "recorded at 1 " in message and "Note" not in message, message
    _, message = ex.draw_distribution("tanh", {}, "recorded run", 0, 1, -1, 1, root, "mlp", "0", 1000, 0, 0.05)
    assert "Note: in run 'mlp', '0' does not feed an activation module (the sites that do: 1, 3)" in message
    assert ex.default_site(root, "linear") is None
    figure, message = ex.draw_distribution("tanh", {}, "recorded run", 0, 1, -1, 1, root, "linear", None)
    assert figure["data"] == [] and "Pick one of its sites" in message, message
    assert "No call site of run 'linear' feeds an activation module (its sites: 0, 1)" in message, message
    _, message = ex.draw_distribution("tanh", {}, "recorded run", 0, 1, -1, 1, root, "linear", "0", 1000, 0, 0.05)
    assert "none of its sites does" in message


# --- which activation trains best --------------------------------------------------------

SMALL = dict(depth=2, width=8, batch_size=32, n_samples=256)


def test_comparison_trains_each_activation_as_the_experiment_alone_would():
    comparison = ex.Comparison(["relu", "tanh", "gelu"], steps=12, seed=4, **SMALL).start()
    assert comparison.join(120) == {"relu": "finished", "tanh": "finished", "gelu": "finished"}
    assert comparison.done
    for name, view in comparison.views.items():
        # the same task and seed: each run's losses are those of the experiment run by itself
        alone = workbench.experiments.create("activation_mlp", seed=4, activation=name, **SMALL).run(12, progress=False)
        losses = view.metrics_frame(["loss"])
        assert list(losses.step) == list(range(1, 13))
        assert np.allclose(losses.value, [m["loss"] for m in alone], atol=1e-6)
    table = comparison.summary()
    ranking = comparison.ranking()  # best first: the highest accuracy on the whole set, then the lowest loss
    assert table.activation.tolist() == [name for name, _, _ in ranking] and sorted(table.activation) == [
        "gelu", "relu", "tanh"]
    assert [(-a, loss) for _, a, loss in ranking] == sorted((-a, loss) for _, a, loss in ranking)
    assert table["accuracy (whole set)"].tolist() == [round(a, 4) for _, a, _ in ranking]
    assert f"**{ranking[0][0]} trained best**: accuracy {ranking[0][1]:.3f}" in comparison.status_markdown()
    summary = table.set_index("activation")
    assert list(summary.status) == ["finished"] * 3 and list(summary.step) == [12] * 3
    figure = comparison.metrics_figure()
    assert {t["name"] for t in figure["data"] if "lines" in t.get("mode", "")} == {"relu", "tanh", "gelu"}
    layers = comparison.layers_figure()
    dead = {(t["meta"]["activation"], t["meta"]["layer"]): values(t["y"]) for t in layers["data"]
            if t["meta"]["statistic"] == "dead units"}
    assert set(dead) == {(a, l) for a in ("relu", "tanh", "gelu") for l in ("layers.0", "layers.2")}
    assert (dead["relu", "layers.0"] > 0).all() and (dead["relu", "layers.0"] < 1).all()
    assert (dead["tanh", "layers.0"] == 0).all() and (dead["gelu", "layers.2"] == 0).all()
    norms = [t for t in layers["data"] if t["meta"]["statistic"] == "gradient norm"]
    assert len(norms) == 6 and all((values(t["y"]) > 0).all() for t in norms)


def test_a_deep_networks_layers_wrap_four_to_a_row():
    # (depth 8 drew 16 panels side by side in one row: their titles ran into each other, and depth 16 was unreadable)
    comparison = ex.Comparison(["relu"], steps=2, depth=9, width=4, batch_size=16, n_samples=64).start()
    comparison.join(120)
    layout = comparison.layers_figure()["layout"]
    axes = {key: axis for key, axis in layout.items() if key.startswith("xaxis")}
    assert len(axes) == 2 * 9  # (a dead-units and a gradient-norm panel a layer)
    columns = {tuple(axis["domain"]) for axis in axes.values()}
    assert len(columns) == ex.LAYERS_PER_ROW
    widths = {round(high - low, 6) for low, high in columns}
    assert len(widths) == 1 and widths.pop() > 0.2  # (a title such as 'gradient norm: layers.16' fits)
    rows = {tuple(layout["yaxis" + key[5:]]["domain"]) for key in axes}
    assert len(rows) == 2 * 3  # (9 layers: three rows of layers, each a dead-units and a gradient-norm row)
    assert all(0 <= low < high <= 1 for low, high in rows)
    titles = [a["text"] for a in layout["annotations"]]
    assert titles[:4] == [f"dead units: layers.{2 * i}" for i in range(4)]
    assert layout["height"] > 3 * 400


def test_side_by_side_and_stopping():
    together = ex.Comparison(["relu", "sigmoid"], steps=6, mode="side by side", **SMALL).start()
    assert together.join(120) == {"relu": "finished", "sigmoid": "finished"}
    queued = ex.Comparison(["relu", "tanh", "gelu"], steps=100_000, **SMALL).start()
    statuses = queued.stop(timeout=60)
    assert statuses["relu"] == "stopped" and statuses["gelu"] == "not started"
    assert statuses["tanh"] in ("stopped", "not started")
    relu = queued.entries["relu"]  # (what stopped it, said alike by its run, its watch and its header)
    assert relu.run.error == relu.watch.error == relu.view.header()["error"]
    assert relu.watch.error.startswith("stopped by the user after step ")
    assert queued.done
    with pytest.raises(RuntimeError, match="started already"):
        queued.start()


@pytest.mark.parametrize("arguments, expected", [
    (dict(activations=[]), "Pick at least one activation"),
    (dict(activations="relu"), "Pick at least one activation to compare, as a list"),
    (dict(activations=["relu", "relu"]), "repeats one"),
    (dict(activations=["relu", "swish"]), "Unknown model 'swish'"),
    (dict(activations=["relu"], steps=0), "The number of steps must be a whole number in [1, 100,000], got 0"),
    (dict(activations=["relu"], mode="parallel"), "mode must be one of ['one after another', 'side by side']"),
    (dict(activations=["relu"], depth=0), "'depth' must lie in [1, 16], got 0"),
])
def test_bad_comparison_settings_are_refused_before_anything_starts(arguments, expected):
    with pytest.raises((ValueError, TypeError)) as info:
        ex.Comparison(**arguments)
    assert expected in str(info.value)
    kept = object()
    current, message = ex.start_comparison(kept, arguments["activations"], arguments.get("steps", 10), 0,
                                           arguments.get("depth", 2), 8, 0.01, "spirals",
                                           arguments.get("mode", "one after another"))
    assert current is kept and expected.split("'")[0] in message


@pytest.mark.parametrize("field, expected", [
    ("depth", "depth expects int: the field is empty"),
    ("width", "width expects int: the field is empty"),
    ("lr", "lr expects float: the field is empty"),
    ("seed", "The seed must be a whole number in [0, 9007199254740991]: the field is empty"),
])
def test_an_empty_which_trains_best_field_says_it_is_empty(field, expected):
    # (they said "expects int, got None (NoneType)" and "got None", which a new user cannot act on)
    settings = dict(steps=10, seed=0, depth=2, width=8, lr=0.01, dataset="spirals", mode="one after another")
    kept = object()
    current, message = ex.start_comparison(kept, ["relu"], **{**settings, field: None})
    assert current is kept and expected in message and "None" not in message, message
    # as the Experiments tab's form reads them: 2.0 and 1e1 are whole numbers, 2.5 is not
    current, message = ex.start_comparison(kept, ["relu"], **{**settings, "depth": 2.5})
    assert current is kept and "depth expects int, could not read 2.5: not a whole number" in message, message


def test_joining_a_comparison_not_started_says_to_start_it_rather_than_waiting_for_ever():
    comparison = ex.Comparison(["relu", "tanh"], steps=3, **SMALL)
    with pytest.raises(RuntimeError, match=r"This comparison has not started, so there is nothing to wait for: "
                                           r"call comparison.start\(\) first, then comparison.join\(\)"):
        comparison.join(5)  # (the wait ran for ever without a timeout: a notebook cell hung)
    assert comparison.stop() == {"relu": "not started", "tanh": "not started"}  # (stopped first: nothing to wait for)
    assert comparison.join() == {"relu": "not started", "tanh": "not started"}


def test_a_run_that_fails_to_start_one_after_another_leaves_those_after_it_not_started_and_join_ends():
    # the run before it ended and started it, which raised: the run after it stayed 'waiting' for ever, done was never
    # True, and join() without a timeout never returned
    comparison = ex.Comparison(["relu", "tanh", "gelu"], steps=3, **SMALL)

    def no_memory(steps):
        raise RuntimeError("not enough memory")

    comparison.entries["tanh"].experiment.start = no_memory
    with pytest.warns(RuntimeWarning, match="not enough memory"):  # (raised in the first run's callback)
        comparison.start()
        statuses = comparison.join(60)
    assert statuses == {"relu": "finished", "tanh": "failed", "gelu": "not started"}
    assert comparison.done
    # the first failing to start: start() says why, and the others are not started
    comparison = ex.Comparison(["relu", "tanh"], steps=3, **SMALL)
    comparison.entries["relu"].experiment.start = no_memory
    with pytest.raises(RuntimeError, match="not enough memory"):
        comparison.start()
    assert comparison.join() == {"relu": "failed", "tanh": "not started"}


def test_a_run_that_failed_or_could_not_be_evaluated_says_why_in_the_status(scratch_model):
    # (the status said only `failed`, and a run whose evaluation on the whole set failed read `finished`, was left
    # out of the ranking with NaN in the table, and the status named another as best without a word about it)
    class Fragile(torch.nn.Module):
        """ReLU that raises on more than ``most`` rows (the whole training set, 256, and not a batch of 32)."""

        def __init__(self, most: int = 100):
            super().__init__()
            self.most = most

        def forward(self, x):
            if x.shape[0] > self.most:
                raise RuntimeError(f"{x.shape[0]} rows are too many for a <Fragile>")
            return torch.relu(x)

    inputs = lambda m, b, g=None: ((torch.randn(b, 3, generator=g),), {})  # noqa: E731
    scratch_model("fragile", family="activation", example_inputs=inputs)(Fragile)
    scratch_model("broken", family="activation", example_inputs=inputs, defaults={"most": 0})(Fragile)
    comparison = ex.Comparison(["fragile", "broken", "relu"], steps=3, mode="side by side", **SMALL)
    comparison.start()
    assert comparison.join(120) == {"fragile": "finished", "broken": "failed", "relu": "finished"}
    status = comparison.status_markdown()
    # (the message as it is, in a code span: a <Fragile> read as an HTML tag was dropped from the page)
    assert "**broken** failed: `RuntimeError: 32 rows are too many for a <Fragile>`" in status, status
    assert ("**fragile** is not ranked: its loss and accuracy on the whole training set could not be computed: "
            "`RuntimeError: 256 rows are too many for a <Fragile>`") in status, status
    assert "**relu trained best**" in status


def test_page_handlers_start_and_draw_a_comparison():
    comparison, message = ex.start_comparison(None, ["tanh", "relu"], 5.0, 0.0, 2.0, 8.0, 0.01, "moons",
                                              "one after another")
    # (in the order the page's boxes list them, whichever was ticked first)
    assert "Training `activation_mlp` with relu, tanh: 5 steps each, seed 0" in message
    comparison.join(120)
    status, metrics, layers, table = ex.comparison_outputs(comparison)
    assert "**relu** `finished` 5/5" in status and "**tanh** `finished` 5/5" in status
    assert list(table.columns) == ex.SUMMARY_COLUMNS and table["accuracy (whole set)"].between(0, 1).all()
    assert metrics["data"] and layers["data"]
    _, empty_metrics, _, empty_table = ex.comparison_outputs(None)
    assert empty_metrics["data"] == [] and list(empty_table.columns) == ex.SUMMARY_COLUMNS and empty_table.empty
    with pytest.raises(TypeError, match="first argument, not activation="):
        ex.Comparison(["relu"], activation="tanh")


def test_train_while_a_comparison_runs_says_it_stopped_that_one():
    # (the runs in progress were stopped, their results gone from the page, without a word)
    running, _ = ex.start_comparison(None, ["relu"], 100_000, 0, 1, 4, 0.01, "moons", "one after another")
    following, message = ex.start_comparison(running, ["tanh"], 3, 0, 1, 4, 0.01, "moons", "one after another")
    assert running.status() == {"relu": "stopped"}
    assert message.startswith("Stopped the comparison that was running (relu), and training `activation_mlp` with "
                              "tanh: 3 steps each"), message
    following.join(60)
    _, message = ex.start_comparison(following, ["tanh"], 3, 0, 1, 4, 0.01, "moons", "one after another")
    assert message.startswith("Training `activation_mlp` with tanh"), message  # (that one had ended: nothing stopped)


def test_a_page_that_closes_stops_its_comparison():
    # (Gradio deletes a closed tab's state an hour later: its runs trained on that long, a reload's alongside)
    import functools

    from workbench.ui.pages import PageHoldings

    holdings = PageHoldings()
    running, _ = ex.start_comparison(None, ["relu"], 100_000, 0, 1, 4, 0.01, "moons", "one after another")
    other, _ = ex.start_comparison(None, ["tanh"], 100_000, 0, 1, 4, 0.01, "moons", "one after another")
    holdings.hold("closed", "comparison", functools.partial(ex._stop_unless_done, running))
    holdings.hold("open", "comparison", functools.partial(ex._stop_unless_done, other))
    holdings.end("closed")
    running.join(60)
    assert running.status() == {"relu": "stopped"}
    assert other.status() == {"tanh": "running"}  # (another page's goes on)
    other.stop()


def test_which_trains_best_starts_from_the_settings_the_experiments_form_starts_from():
    import gradio as gr

    from workbench.ui import live_run

    with gr.Blocks():
        c = ex.layout()
    form = {f.label: f.value for f in live_run.experiment_fields("activation_mlp")}  # (the registry's defaults)
    shown = {key: c[key].value for key in ("depth", "width", "lr", "dataset")}
    assert shown == {key: form[key] for key in shown}


def test_figures_draw_themselves_in_jupyter():
    figure = ex.curves_figure("sigmoid", points=11)
    bundle = figure._repr_mimebundle_()
    assert bundle[ex.PLOTLY_MIMETYPE]["data"][0]["meta"]["activation"] == "sigmoid"
    assert math.isfinite(ex.curves("sigmoid", points=11).max_difference)


def test_an_activation_undefined_somewhere_is_drawn_where_it_is_defined(scratch_model):
    class Root(torch.nn.Module):
        """sqrt, NaN below 0."""

        def forward(self, x):
            return torch.sqrt(x)

    scratch_model("root", family="activation", example_inputs=lambda m, b, g=None: ((torch.ones(b),), {}),
                  derivative=lambda m, x: 0.5 / torch.sqrt(x))(Root)
    c = ex.curves("root", x_range=(-1, 4), points=51)
    positive = c.x > 0
    assert np.isnan(c.f[c.x < 0]).all() and np.allclose(c.f[positive], np.sqrt(c.x[positive]), atol=1e-6)
    assert c.max_difference < 1e-5  # over the points where both are defined
    nowhere = ex.curves("root", x_range=(-2, -1), points=5)
    assert math.isnan(nowhere.max_difference)


def _gaps(trace) -> list[float]:
    """The x where a drawn curve has a gap (a NaN point)."""
    y = values(trace["y"])
    return [float(x) for x in values(trace["x"])[np.isnan(y)]]


def test_jumps_draw_as_gaps_and_smooth_curves_and_kinks_stay_joined():
    # relu' steps from 0 to 1 and Threshold(0, 0.5) from 0.5 to x between x = 0 and the next
    # point: a line joining them would draw a vertical segment the function does not have
    figure = ex.curves_figure(["relu", "threshold", "gelu", "sigmoid", "tanh"], x_range=(-2, 2), points=41)
    traces = {(t["meta"]["activation"], t["meta"]["curve"]): t for t in figure["data"]}
    assert _gaps(traces["relu", "f"]) == []  # a kink, no jump
    for curve in ("closed", "autograd"):
        assert _gaps(traces["relu", curve]) == pytest.approx([0.05])
    assert _gaps(traces["threshold", "f"]) == pytest.approx([0.05])
    for name in ("gelu", "sigmoid", "tanh"):
        for curve in ("f", "closed", "autograd"):
            assert _gaps(traces[name, curve]) == []
    # the points themselves are drawn as computed
    c = ex.curves("relu", x_range=(-2, 2), points=41)
    drawn = traces["relu", "autograd"]
    keep = ~np.isnan(values(drawn["y"]))
    assert np.array_equal(values(drawn["x"])[keep], c.x) and np.array_equal(values(drawn["y"])[keep], c.autograd)


@pytest.mark.parametrize("points", [5, 7, 11, 41])
def test_coarsely_sampled_smooth_curves_have_no_jumps(points):
    figure = ex.curves_figure(["gelu", "sigmoid", "tanh", ("gelu", {"approximate": "tanh"})], x_range=(-5, 5),
                              points=points)
    assert all(_gaps(trace) == [] for trace in figure["data"])


def test_a_steep_continuous_stretch_is_not_a_jump_but_a_step_is():
    x = np.linspace(-1, 1, 9, dtype=np.float32)
    steep = lambda t: 1 / (1 + np.exp(-40 * t))  # noqa: E731  (all of its rise between two points)
    step = lambda t: (t > 0.1).astype(np.float64)  # noqa: E731
    assert list(ex.jumps(x, steep(x), steep)) == []
    assert list(ex.jumps(x, step(x), step)) == [4]


def _page_handler(c, trigger, event):
    """The function the page runs on ``event`` of component ``trigger`` (as Gradio calls it), with its outputs."""
    import gradio as gr

    blocks = next(b for b in gr.context.Context.root_block.fns.values() if (trigger._id, event) in b.targets)
    return blocks.fn, blocks.outputs


def test_the_message_under_stop_says_the_runs_ended_once_they_have():
    # (it kept "Training `activation_mlp` with ..." after every run had finished)
    import gradio as gr

    with gr.Blocks() as app:
        c = ex.layout()
        ex.wire(c, app)
        on_tick, outputs = _page_handler(c, c["timer"], "tick")
    comparison, message = ex.start_comparison(None, ["tanh", "relu"], 3, 0, 1, 4, 0.01, "moons", "one after another")
    assert message.startswith("Training `activation_mlp`")
    comparison.join(120)
    shown = dict(zip([o._id for o in outputs], on_tick(comparison)))
    said = shown[c["compare_message"]._id]
    assert said.startswith("The runs have ended (3 steps each, seed 0): relu, tanh finished."), said
    assert "press Train to run them again" in said
    stopped, _ = ex.start_comparison(None, ["relu", "tanh"], 100_000, 0, 1, 4, 0.01, "moons", "one after another")
    stopped.stop(wait=True)
    assert "relu stopped; tanh not started" in ex.ended_message(stopped)
