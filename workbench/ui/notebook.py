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

__all__ = ["ModelBrowser"]


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
