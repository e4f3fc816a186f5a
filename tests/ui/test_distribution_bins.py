"""The distribution views draw a site's histograms as recorded: the steps that kept the site's
range share one heatmap, without re-binning; a run without kept ranges is re-binned as before."""

import numpy as np
import pytest

from workbench.instrument import StepRecord
from workbench.instrument.schema import MAX, MIN
from workbench.ui import figures
from workbench.ui.views import RunView

KEY = ("layer", 0, "activation", "out", (100,))


def record(step, counts, lo, hi, edges=None, sampled=False):
    sums = np.zeros((1, 9))
    sums[0, MIN], sums[0, MAX] = lo, hi
    sums[0, 5] = 100  # nonzero
    return StepRecord(step, (KEY,), np.array([100]), sums, np.asarray([counts], np.float32),
                      histogram_edges=None if edges is None else np.array([edges], float),
                      histogram_sampled=np.array([sampled]))


def heatmaps(figure):
    return [t for t in figure["data"] if t["type"] == "heatmap"]


def test_steps_that_kept_a_range_are_drawn_with_its_bins_as_recorded():
    view = RunView()
    counts = [[10, 20, 40, 30], [5, 25, 50, 20], [0, 40, 40, 20], [60, 20, 10, 10]]
    # steps 1-3 kept the range [-2, 2] (their values within it); step 4 has a new one
    view.feed([record(1, counts[0], -1.5, 1.9, (-2.0, 2.0)), record(2, counts[1], -1.0, 1.5, (-2.0, 2.0)),
               record(3, counts[2], -0.5, 2.0, (-2.0, 2.0)), record(4, counts[3], 0.0, 8.0, (0.0, 8.0))])
    segments = view.distribution_segments("activation", "layer")
    assert [s.tolist() for s, _, _ in segments] == [[1, 2, 3], [4]]
    np.testing.assert_array_equal(segments[0][1], [-2, -1, 0, 1, 2])
    np.testing.assert_array_equal(segments[0][2], counts[:3])  # the counts themselves
    drawn = heatmaps(figures.distribution_figure(view, "activation", "layer"))
    assert len(drawn) == 2
    assert figures.values(drawn[0]["y"]).tolist() == [-1.5, -0.5, 0.5, 1.5]  # the recorded bins' centres
    z = figures.values(drawn[0]["z"])  # (bins, steps), each step relative to its peak
    np.testing.assert_allclose(z[:, 0], np.array(counts[0]) / 40)
    # the percentiles come from each step's own bins
    bands, _, _, _ = view.distribution("activation", "layer")
    assert bands.p50.iloc[0] == pytest.approx(0.5)  # 30 below 0, 40 in [0, 1): the 50th half way in


def test_a_run_recorded_without_kept_ranges_is_re_binned_onto_one_grid():
    view = RunView()
    rng = np.random.default_rng(0)
    # each step's histogram over its own [min, max] (no histogram_edges: a run stored before)
    view.feed([record(step, rng.integers(0, 30, 8), -step, step) for step in range(1, 21)])
    assert len(view.distribution_segments("activation", "layer")) == 20
    [drawn] = heatmaps(figures.distribution_figure(view, "activation", "layer"))
    _, steps, grid, density = view.distribution("activation", "layer")
    assert figures.values(drawn["customdata"])[0].tolist() == steps.tolist()  # (what a cell's hover names)
    assert figures.values(drawn["x"]).tolist() == [0.5 + k for k in range(21)]  # a cell a step, edge to edge
    np.testing.assert_allclose(figures.values(drawn["y"]), (grid[:-1] + grid[1:]) / 2)


def test_every_segment_s_cells_reach_the_next_so_no_recorded_step_draws_blank():
    """A range kept for one recorded step only (renewed at the next) is a lone column: plotly
    would draw it 1 step wide, and a run recorded every 10th step would show 9 blank steps after
    it. Each step's cells reach half way to the steps beside it, across segments."""
    view = RunView()
    ranges = {10: (-2.0, 2.0), 20: (-2.0, 2.0), 30: (-4.0, 4.0), 40: (-8.0, 8.0), 50: (-8.0, 8.0)}
    view.feed([record(step, [1, 2, 3, 4], lo / 2, hi / 2, (lo, hi)) for step, (lo, hi) in ranges.items()])
    drawn = heatmaps(figures.distribution_figure(view, "activation", "layer"))
    # (each reaching half way into the next segment's first cell, which that segment draws over)
    assert [figures.values(t["x"]).tolist() for t in drawn] == [[5, 15, 30], [25, 40], [35, 45, 55]]
    assert [figures.values(t["customdata"])[0].tolist() for t in drawn] == [[10, 20], [30], [40, 50]]


def test_a_log_heatmap_draws_exact_zeros_apart_from_steps_not_recorded():
    view = RunView()
    view.feed([record(1, [1, 2, 3, 4], -1.0, 0.0), record(2, [1, 2, 3, 4], -1.0, 2.0)])  # max: 0, then 2
    figure = figures.heatmap_figure(view, "activation", "max", log=True)
    values, zeros = heatmaps(figure)
    assert "grey: max exactly 0" in figure["layout"]["title"]["text"]  # (the title says what grey is)
    z = figures.values(values["z"])[0]
    assert np.isnan(z[0]) and z[1] == pytest.approx(np.log10(2.0))  # (log10 |0|: no value)
    assert figures.values(zeros["z"])[0].tolist()[0] == 1 and np.isnan(figures.values(zeros["z"])[0][1])
    assert zeros["colorscale"][0][1] == figures.ZERO_COLOR and "exactly 0" in zeros["hovertemplate"]
    [plain] = heatmaps(figures.heatmap_figure(view, "activation", "max", log=False))  # (0 has a colour there)
    assert figures.values(plain["z"])[0].tolist() == [0.0, 2.0]
    # by default, log10 for magnitudes that span orders (a norm); a fraction (the zero fraction) as it is
    [fraction] = heatmaps(figures.heatmap_figure(view, "activation", "zero_frac"))
    assert fraction["colorbar"]["title"]["text"] == "zero_frac"
    assert heatmaps(figures.heatmap_figure(view, "activation", "norm"))[0]["colorbar"]["title"]["text"] == \
        "log10 |norm|"


def test_a_few_wide_steps_are_out_of_the_first_view_and_the_figure_says_where_they_reach():
    """One wide step (an initialization, a spike) would squeeze every other step into a few pixels:
    the value axes open on the others, the figure names the steps left out, and a double-click (Plotly's
    autorange) shows every step; the newest step is always in view."""
    def feed(spans):
        view = RunView()
        view.feed([record(step, [10, 20, 40, 30], -span, span, (-span, span)) for step, span in spans.items()])
        return figures.distribution_figure(view, "activation", "layer")["layout"]

    spans = {step: 1.0 + 0.01 * step for step in range(1, 21)}
    wide = feed({**spans, 1: 50.0, 7: 30.0})
    low, high = wide["yaxis2"]["range"]
    assert wide["yaxis"]["range"] == [low, high]
    assert -1.4 < low < -1.2 and 1.2 < high < 1.4  # steps 2-20 span [-1.2, 1.2]: steps 1 and 7 are out
    assert wide["xaxis2"]["matches"] == "x"  # (the two panels on one steps axis: aligned, zoomed together)
    [note] = wide["annotations"]
    assert note["text"].startswith("steps 1, 7 reach [-50, 50], out of view")
    # a range on a coarse grid: values that move a little leave it as it was (a live page keeps its zoom)
    assert feed({**spans, 1: 50.0, 7: 30.0, 19: 1.21})["yaxis2"]["range"] == [low, high]
    # nothing wide: the axes fit every step themselves; nor where many steps are (a distribution that narrows)
    narrowing = {step: 20.0 * 0.97 ** step for step in range(1, 101)}
    for layout in (feed(spans), feed({**spans, 20: 50.0}), feed(narrowing)):  # (a wide newest step: the run now)
        assert "range" not in layout["yaxis2"] and "annotations" not in layout


def test_steps_of_one_value_are_a_band_that_shows_under_a_wide_range():
    """A dead ReLU outputs zeros only: binned over [0, 1] (a tensor of one value has no range of its own),
    its first bin would be a line thinner than a pixel beside steps spanning [-100, 100]."""
    view = RunView()
    view.feed([record(1, [10, 20, 40, 30], -100.0, 100.0), record(2, [10, 20, 40, 30], -90.0, 90.0),
               record(3, [100, 0, 0, 0], 0.0, 0.0), record(4, [100, 0, 0, 0], 0.0, 0.0)])
    *_, zeros = heatmaps(figures.distribution_figure(view, "activation", "layer"))
    assert figures.values(zeros["customdata"])[0].tolist() == [3, 4]
    low, high = figures.values(zeros["y"]).tolist()  # one band around 0, 2 % of the range wide (rows of
    assert low == -high and 1.5 < high - low < 2.5  # that height, centred at +-1: [-2, 2] of [-100, 100])
    assert figures.values(zeros["z"]).tolist() == [[1.0, 1.0], [1.0, 1.0]]  # (each step's whole mass in it)


def colour_at(colorscale, z):
    """The RGB a heatmap draws ``z`` in (its colour scale's stops interpolated, as Plotly does)."""
    stops = [(at, tuple(int(hex_[i:i + 2], 16) for i in (1, 3, 5))) for at, hex_ in colorscale]
    for (a, ca), (b, cb) in zip(stops, stops[1:]):
        if a <= z <= b:
            t = 0.0 if b == a else (z - a) / (b - a)
            return tuple(x + t * (y - x) for x, y in zip(ca, cb))
    raise AssertionError(f"{z} is outside the colour scale")


def test_a_relus_zeros_in_one_bin_do_not_leave_the_rest_of_its_distribution_white():
    """The density of an EfficientZero dynamics network's ReLU looked empty past its first steps while its
    percentiles spread out: its exact zeros (55 % of the values, in the first bin) held the linear colour
    scale, and every other bin (at most 13 % of that peak) was drawn all but white."""
    view = RunView()
    counts = [5500, 1300, 1200, 1000, 700, 400, 200, 50, 10, 1, 0, 0]
    view.feed([record(1, counts, 0.0, 6.0, (0.0, 6.0))])
    drawn = heatmaps(figures.distribution_figure(view, "activation", "layer"))
    z = figures.values(drawn[0]["z"])[:, 0]
    colours = [colour_at(drawn[0]["colorscale"], value) for value in z]
    darkness = [255 * 3 - sum(colour) for colour in colours]  # (0: white)
    assert all(d > 30 for d, n in zip(darkness, counts) if n), darkness  # (even one value of ten thousand shows)
    assert all(d == 0 for d, n in zip(darkness, counts) if not n)  # (no values: white)
    assert darkness[1] > 300 and darkness == sorted(darkness, reverse=True)  # (a tenth of the peak: a mid blue)
    assert drawn[0]["hovertemplate"].count("of the step's peak")  # (the hover still says the share of the peak)
