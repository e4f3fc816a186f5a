"""Jupyter widgets: the same handlers as the Gradio app, drawn with ipywidgets.

    from workbench.ui.notebook import ModelBrowser
    browser = ModelBrowser()
    browser            # shows the widget in a notebook
    browser.model      # the last module built
"""

from __future__ import annotations

from typing import Any

from workbench.registry import list_families
from workbench.ui import model_browser as handlers
from workbench.ui.forms import FormField

__all__ = ["Dashboard", "ModelBrowser"]


def _html(markdown: str) -> str:
    import markdown_it  # ships with gradio, a dependency

    return markdown_it.MarkdownIt().render(markdown)


def _widget(field: FormField):
    import ipywidgets as w

    style = {"description_width": "initial"}
    common = dict(description=field.label, tooltip=field.info, style=style)
    if field.widget == "dropdown":
        return w.Dropdown(options=list(field.param.choices), value=field.value, **common)
    if field.widget == "checkbox":
        return w.Checkbox(value=field.value, indent=False, **common)
    if field.widget == "int":
        return w.IntText(value=field.value, **common)
    if field.widget == "float":
        return w.FloatText(value=field.value, **common)
    return w.Text(value=field.value, **common)


class ModelBrowser:
    """Pick a registered model, fill its form, build it and see its module tree.

    Attributes:
        model: the last module built successfully, or ``None``.
        result: the last :class:`~workbench.ui.model_browser.BuildResult`.
    """

    def __init__(self, family: str = handlers.ALL_FAMILIES, pattern: str = "") -> None:
        import ipywidgets as w

        self.model = None
        self.result: handlers.BuildResult | None = None
        self.family = w.Dropdown(options=[handlers.ALL_FAMILIES, *list_families()], value=family,
                                 description="family")
        self.pattern = w.Text(value=pattern, description="filter", placeholder="e.g. lu or *lu")
        names = handlers.filter_models(family, pattern)
        self.models = w.Dropdown(options=names, value=names[0] if names else None, description="model")
        self.batch_size = w.IntText(value=2, description="batch size")
        self.overview = w.HTMLMath()
        self.form = w.VBox()
        self.build_button = w.Button(description="Build", button_style="primary")
        self.message = w.HTML()
        self.output = w.Output()
        self._fields: list[tuple[str, Any]] = []

        self.family.observe(self._on_filter, names="value")
        self.pattern.observe(self._on_filter, names="value")
        self.models.observe(lambda _: self._show_model(), names="value")
        self.build_button.on_click(lambda _: self.build())
        self._show_model()
        self.widget = w.VBox([
            w.HBox([self.family, self.pattern, self.models]),
            self.overview, self.form, w.HBox([self.batch_size, self.build_button]), self.message, self.output,
        ])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _on_filter(self, _change=None) -> None:
        names = handlers.filter_models(self.family.value, self.pattern.value)
        self.models.options = names
        self.models.value = names[0] if names else None

    def _show_model(self) -> None:
        name = self.models.value
        self.overview.value = _html(handlers.model_overview(name))
        self._fields = [(f.label, _widget(f)) for f in handlers.model_form(name)]
        self.form.children = [widget for _, widget in self._fields]
        self.message.value = ""
        self.output.clear_output()

    def build(self, **values: Any) -> handlers.BuildResult:
        """Build from the form (``values`` override fields, as a script would type them)."""
        for label, widget in self._fields:
            if label in values:
                widget.value = values[label]
        raw = {label: widget.value for label, widget in self._fields}
        self.result = handlers.build_model(self.models.value, raw, self.batch_size.value)
        if self.result.ok:
            self.model = self.result.model
        self.message.value = _html(self.result.message)
        self.output.clear_output()
        with self.output:
            from IPython.display import display

            display(self.result.tree)
        return self.result


class Dashboard:
    """A live dashboard of a watch, an experiment or a stored run, in ipywidgets + matplotlib.

    ::

        exp = workbench.experiments.create("activation_mlp")
        w = exp.watch()
        dash = Dashboard(w)            # or Dashboard(workbench.load_run("runs/a"))
        dash                           # shows it
        exp.run(200)                   # with auto=True it redraws as steps arrive (at most every `interval` s)
        dash.refresh()                 # or redraw now

    Args:
        source: a ``Watch``, an ``Experiment`` (its watcher) or a ``Run``.
        auto: subscribe to the watch's stream and redraw from the subscriber
            thread, at most once per ``interval`` seconds (never from training).
        interval: seconds between automatic redraws.
    """

    def __init__(self, source: Any, auto: bool = True, interval: float = 1.0) -> None:
        import ipywidgets as w

        from workbench.instrument import Run, Watch
        from workbench.ui import live

        if hasattr(source, "watcher") and not isinstance(source, Watch):
            if source.watcher is None:
                raise ValueError("This experiment is not watched: call experiment.watch() first.")
            source = source.watcher
        if not isinstance(source, (Watch, Run)):
            raise TypeError(f"Dashboard needs a Watch, a watched Experiment or a Run, got {type(source).__name__}.")
        self.source, self.interval = source, interval
        self._live = live
        self.kind = w.Dropdown(options=list(live.KINDS), value="activation", description="kind")
        self.statistic = w.Dropdown(options=live.STATISTICS, value="std", description="statistic")
        self.pattern = w.Text(value="*", description="modules")
        self.note = w.HTML()
        self.plots = w.Output()
        self.table = w.Output()
        for control in (self.kind, self.statistic, self.pattern):
            control.observe(lambda change: self.refresh(), names="value")
        self.widget = w.VBox([w.HBox([self.kind, self.statistic, self.pattern]), self.plots, self.note, self.table])
        self._last_draw = 0.0
        self._subscription = None
        if auto and isinstance(source, Watch):
            self._subscription = source.subscribe(self._on_update)
        self.refresh()

    def frames(self):
        """The statistics rows and the metrics to draw."""
        return self.source.to_pandas(), self.source.metrics()

    def _on_update(self, update) -> None:
        import time

        if time.monotonic() - self._last_draw >= self.interval:
            self.refresh()

    def refresh(self) -> None:
        """Redraw the plots and the table from what is recorded now."""
        import time

        import io

        from IPython.display import Image
        from matplotlib.figure import Figure

        self._last_draw = time.monotonic()
        rows, metrics = self.frames()
        series, note = self._live.stat_series(rows, self.kind.value, self.statistic.value, self.pattern.value)
        long = self._live.metrics_long(metrics)
        # a bare Figure, no pyplot: redraws may come from the subscriber thread
        fig = Figure(figsize=(12, 3.5))
        left, right = fig.subplots(1, 2)
        for name, group in long.groupby("metric", sort=False):
            left.plot(group.step, group.value, label=name)
        left.set_title("metrics")
        left.set_xlabel("step")
        for site, group in series.groupby("site", sort=False):
            right.plot(group.step, group.value, label=site)
        right.set_title(f"{self.kind.value} {self.statistic.value} per call site")
        right.set_xlabel("step")
        for ax in (left, right):
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        # set the outputs directly (not `with output:`), so redraws from the subscriber thread
        # land in this widget and not in whichever cell runs at that moment
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80)
        self.plots.outputs = ()
        self.plots.append_display_data(Image(data=png.getvalue(), format="png"))
        self.note.value = _html(note)
        self.table.outputs = ()
        self.table.append_display_data(self._live.latest_table(rows))

    def close(self) -> None:
        """Stop the automatic redraws."""
        if self._subscription is not None:
            self._subscription.unsubscribe()
            self._subscription = None

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
