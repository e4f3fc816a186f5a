"""Jupyter widgets: the same handlers and views as the Gradio app, drawn with ipywidgets.

    from workbench.ui.notebook import ModelBrowser, Dashboard
    ModelBrowser()                     # the Models tab; .model is the last module built
    run = exp.start(500)               # train in the background; the cell is free
    Dashboard(run)                     # live views, with Pause / Resume / Stop
"""

from __future__ import annotations

import functools
import html
import re
import threading
import time
from typing import Any

from workbench.registry import list_families
from workbench.ui import model_browser as handlers
from workbench.ui.forms import FormField, field_text

__all__ = ["CallbackErrors", "Compare", "Dashboard", "ModelBrowser", "PLOTLY_MIMETYPE"]

#: The mimetype JupyterLab's Plotly renderer (shipped in the plotly package) draws.
PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
#: The Dashboard's figures, one tab each, in their order.
FIGURES = ("metrics", "sites", "heatmap", "distribution")
#: A Compare's figures, one tab each, in their order.
COMPARE_FIGURES = ("metrics", "site")

# $$...$$ first, then $...$ (not an escaped \$): the TeX a Markdown renderer must not touch
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.S)


def _html(markdown: str) -> str:
    """Markdown as HTML, its TeX (``$...$``, ``$$...$$``) left as written for MathJax
    (``ipywidgets.HTMLMath``): Markdown would read ``\\,`` and ``\\\\`` as escapes
    and drop the backslashes, and join a ``cases`` environment's lines."""
    import markdown_it  # ships with gradio, a dependency

    math: list[str] = []

    def keep(match: re.Match) -> str:
        display = match.group(1) is not None
        body = match.group(1) if display else match.group(2)
        math.append(f"$${body}$$" if display else f"${body}$")
        return f"WBMATH{len(math) - 1}X"

    rendered = markdown_it.MarkdownIt().render(_MATH.sub(keep, markdown))
    return re.sub(r"WBMATH(\d+)X", lambda m: html.escape(math[int(m.group(1))], quote=False), rendered)


def _line_html(markdown: str) -> str:
    """A line of Markdown (a header, a summary) as HTML without the paragraph around it: a paragraph's
    margins (a line's height above and below) left blank bands between the dashboard's header, its
    findings and its tabs."""
    rendered = _html(markdown).strip()
    inner = rendered.removeprefix("<p>").removesuffix("</p>")
    return inner if rendered.startswith("<p>") and "<p>" not in inner and "</p>" not in inner else rendered


def _display(widget: Any, text: str) -> None:
    """Display ``widget`` with ``text`` as its plain text: what a notebook shows where the widget
    is gone (the notebook reopened without the kernel that drew it, or read on GitHub). ipywidgets'
    own is the widget's repr cut at 110 characters (``VBox(children=(HBox(children=(HTML(...``)."""
    from IPython.display import display

    bundle = widget._repr_mimebundle_()
    bundle["text/plain"] = text
    display(bundle, raw=True)


class _CellsShowing:
    """Which notebook cells show each live widget (a Dashboard, a Compare), to stop its timer once none
    does: a cell run again replaces its output, and the widget it showed went on polling, unseen, for as
    long as its watch stayed open. A cell run again that shows the widget anew keeps it, and so does
    another cell that shows it too. Cells are told apart by the id the front end sends (JupyterLab's
    ``cellId``); where it sends none, nothing is stopped. A cell's output cleared, or the cell deleted, is not
    seen: the front end tells the kernel nothing of it."""

    def __init__(self, shell: Any) -> None:
        import weakref

        self.shell = shell
        self._cells: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # widget -> ids of cells showing it
        # (the id of the cell running: this one's, made while it runs, its pre_run_cell already gone by)
        running = getattr(getattr(shell.displayhook, "exec_result", None), "info", None)
        self._running: str | None = getattr(running, "cell_id", None)
        self._left: list = []  # (the widgets the running cell showed before it ran again)
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)

    def shown(self, widget: Any) -> None:
        """``widget`` was displayed by the cell running."""
        if self._running is not None:
            self._cells.setdefault(widget, set()).add(self._running)

    def _pre_run_cell(self, info: Any) -> None:
        self._running = getattr(info, "cell_id", None)
        self._left = [widget for widget, cells in list(self._cells.items()) if self._running in cells]
        for widget in self._left:
            self._cells[widget].discard(self._running)

    def _post_run_cell(self, _result: Any) -> None:
        self._running = None  # (a widget shown between cells, by a callback, is no cell's)
        left, self._left = self._left, []
        for widget in left:
            if not self._cells.get(widget):  # (no cell shows it any more)
                self._cells.pop(widget, None)
                widget.close()


_cells_showing: _CellsShowing | None = None


def _no_longer_follows(widget: str) -> str:
    """What a Dashboard or a Compare (``widget``) stopped while its runs go on says (closed, or its cell run again
    without showing it: :class:`_CellsShowing`): its figures stay as they were, not to be read as live."""
    one = widget == "Dashboard"
    return (f"<b>This {'dashboard' if one else 'comparison'} no longer follows its run{'' if one else 's'}</b> "
            "(closed, or its cell run again without showing it): the steps since are not drawn. "
            f"Make a new {widget} to follow {'it' if one else 'them'}.")


def _track_cells(widget: Any) -> None:
    """Note the cell that displays ``widget`` (:class:`_CellsShowing`), in an IPython kernel."""
    global _cells_showing
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    if _cells_showing is None or _cells_showing.shell is not shell:
        _cells_showing = _CellsShowing(shell)
    _cells_showing.shown(widget)


#: The width of a form's box beside its label, in em.
BOX_WIDTH = 14


def _label_style(labels: list[str]) -> dict[str, str]:
    """One label width for a form, its longest label's, so that its boxes line up."""
    return {"description_width": f"{0.6 * max(map(len, labels), default=8) + 1:.1f}em"}


def _field_layout(style: dict[str, str], box: float = BOX_WIDTH) -> Any:
    """A form field's width: its label's and a box ``box`` em wide beside it, no wider than the notebook
    (ipywidgets gives label and box 300 px together: a 35-letter label left the box a sliver)."""
    import ipywidgets as w

    # (the widget's margins come on top of its width: 100% ran past the output's edge)
    return w.Layout(width=f"calc({style['description_width']} + {box:.1f}em)", max_width="calc(100% - 8px)")


def _widget(field: FormField, style: dict[str, str]):
    import ipywidgets as w

    common = dict(description=field.label, tooltip=field.info, style=style, layout=_field_layout(style))
    if field.widget == "dropdown":
        return w.Dropdown(options=list(field.param.choices), value=field.value, **common)
    if field.widget == "checkbox":  # (indented: its box under the other boxes, its whole label beside it)
        common["layout"] = _field_layout(style, max(BOX_WIDTH, 0.6 * len(field.label) + 3))
        return w.Checkbox(value=field.value, indent=True, **common)
    # a number is a text box, read in Python as the form reads it (forms.parse_form: 1e3 is 1000, 2.5 refused in
    # a whole-number field, naming it). ipywidgets' number boxes read what is typed in the page: an IntText with
    # parseInt (1e3 was 1, 2.5 was 2, unsaid), a FloatText showed a whole number as 16.0, and both put back the
    # last number, without a word, over text they could not read. Sent when the box is left or Enter pressed
    # (not at each key: "1e" on the way to "1e3" is no number)
    return _number_box()(value=_start_value(field), continuous_update=False, **common)


@functools.cache  # (one class: made on first use, ipywidgets imported lazily)
def _number_box() -> type:
    """A text box for a number: what is typed is text, read in Python (:func:`_widget`); a number set from
    code is held as its text (``box.value = 16`` holds ``"16"``; a plain ``Text`` refused it with a TraitError)."""
    import numbers

    import ipywidgets as w
    import traitlets

    class NumberText(traitlets.Unicode):
        def validate(self, obj: Any, value: Any) -> str:
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                value = field_text(value)
            return super().validate(obj, value)

    class NumberBox(w.Text):
        value = NumberText(help="the number as text").tag(sync=True)

    return NumberBox


@functools.cache  # (one class: made on first use, ipywidgets imported lazily)
def _scale_box() -> type:
    """A figure's "log y" box, as the app's: ticked while the figure draws a log y of its own choosing
    (:meth:`show`, with :func:`workbench.ui.figures.drawn_log`), and a value the user sets, from the page or from
    code, is the scale from then on (``box.picked``), the value the box shows included: ipywidgets tells its
    observers of a change only, and ``box.value = True`` over a box ticked for one panel drawn log would have
    left the others as they chose.

    ``ScaleBox(on_pick, picked, **checkbox_options)``: ``on_pick()`` is called as the user sets the box;
    ``picked``, whether the scale is the user's at first (a ``log_y`` given). The owner sets ``box.picked = False``
    to give the choice back to the figure."""
    import ipywidgets as w
    import traitlets

    class ScaleBox(w.Checkbox):
        def __init__(self, on_pick: Any, picked: bool, **options: Any) -> None:
            self.picked = picked  # the user set the scale (else: the figure's choice, shown)
            self._on_pick = on_pick
            self._showing = True  # (a value set by show(): not the user's)
            super().__init__(**options)
            self._showing = False
            self.observe(self._changed, names="value")

        def show(self, log: bool | None) -> None:
            """Show the scale the figure chose, not as the user's (None: nothing drawn; the box keeps its value)."""
            if log is None:
                return
            self._showing = True
            try:
                self.value = bool(log)
            finally:
                self._showing = False

        @traitlets.validate("value")
        def _set(self, proposal: Any) -> bool:
            if not self._showing:
                self.picked = True
                # the value it shows, set again: no change is told, so the pick is told here (a change from the
                # page is checked here once it is set, under the lock of held notifications: told as a change)
                if proposal["value"] == self.value and not self._cross_validation_lock:
                    self._on_pick()
            return proposal["value"]

        def _changed(self, _change: Any) -> None:
            if not self._showing:
                self._on_pick()

    return ScaleBox


def _start_value(field: FormField) -> Any:
    """What ``field``'s box holds at first: a number as text (``16``, ``0.1``), else the field's value."""
    return field_text(field.value) if field.widget in ("int", "float") else field.value


class CallbackErrors:
    """What went wrong in a widget's callbacks (a pick, a filter, a button), said in the widget itself:
    ipywidgets sends an exception raised in an observer or a click handler to JupyterLab's log console
    only, and the user saw nothing happen. Every callback of a ModelBrowser, a Dashboard and a Compare
    is wrapped by :meth:`guard`; the error shows in :attr:`html` (its message, the traceback folded
    under it) until a later callback succeeds in the kernel's main thread, where a person's clicks and picks
    are handled (one that a dashboard's timer sets off, a control set from code, leaves the message: a
    redraw wiped it within a second). (A figure that cannot be drawn says so in its tab: :class:`FigureTabs`.)

    Attributes:
        html: the ``ipywidgets.HTML`` that shows the last error, empty while there is none.
        error: the exception the last callback that failed raised, or None once one succeeded since.
    """

    def __init__(self) -> None:
        import ipywidgets as w

        self.html = w.HTML()
        self.error: BaseException | None = None
        # (per thread: the callbacks running, one set off by another, of which only the outermost clears the
        # message; and whether one failed during it, whose message then stays)
        self._calls = threading.local()

    def guard(self, callback: Any, what: str) -> Any:
        """``callback`` wrapped: an exception it raises is shown in :attr:`html` (``what`` names the action,
        e.g. ``"the kind picked"``) and not raised into ipywidgets."""

        @functools.wraps(callback)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            import traceback

            calls = self._calls
            outermost = getattr(calls, "depth", 0) == 0
            if outermost:
                calls.failed = False
            calls.depth = getattr(calls, "depth", 0) + 1
            try:
                return callback(*args, **kwargs)
            except Exception as exc:
                calls.failed, self.error = True, exc
                trace = html.escape("".join(traceback.format_exception(exc)))
                self.html.value = (
                    f"<div style='color:var(--jp-error-color1, #c62828)'><b>{html.escape(what)[:1].upper()}"
                    f"{html.escape(what)[1:]} failed:</b> {html.escape(type(exc).__name__)}: "
                    f"{html.escape(str(exc))}<details><summary>traceback</summary><pre>{trace}</pre></details></div>")
                return None
            finally:
                calls.depth -= 1
                if outermost and not calls.failed and threading.current_thread() is threading.main_thread():
                    self.error, self.html.value = None, ""

        return guarded


class ModelBrowser:
    """Pick a registered model, fill its form, build it and see its module tree.

    The app's Models tab as ipywidgets: a family and name filter, the model's summary and
    formula (typeset by MathJax), a form generated from its parameters, and a Build button
    that shows the module tree or, for an invalid value, the message saying how to fix it. Numbers
    are typed into text boxes, read as the app reads its boxes (``16`` shows as 16; ``1e3`` is 1000).

    Args:
        family: the family shown first (``"all"`` or None for every family).
        pattern: the name filter shown first (``"lu"``, ``"*lu"``; ``""`` or None: none).

    Attributes:
        model: the last module built successfully, or ``None``.
        result: the last :class:`~workbench.ui.model_browser.BuildResult`.
        form_message: the HTML under the form saying what its boxes hold that cannot be built, as each
            box is left (the value named, with what its field expects); empty while the form can be built.
    """

    def __init__(self, family: str | None = handlers.ALL_FAMILIES, pattern: str | None = "") -> None:
        import difflib

        import ipywidgets as w

        family = handlers.ALL_FAMILIES if family is None else family
        pattern = "" if pattern is None else pattern
        if not isinstance(pattern, str):  # (else ipywidgets' TraitError: "expected a unicode string")
            raise TypeError(f"ModelBrowser: pattern is the name filter, text such as 'lu' or '*lu' (or '' for "
                            f"every model), got {pattern!r} ({type(pattern).__name__}).")
        if family not in (handlers.ALL_FAMILIES, *list_families()):  # (else ipywidgets' "value not found")
            close = difflib.get_close_matches(str(family), list_families(), n=1)
            raise ValueError(f"ModelBrowser: no family {family!r}" + (f"; did you mean {close[0]!r}?" if close else ".")
                             + f" The families are {list_families()}, or {handlers.ALL_FAMILIES!r} for every one.")
        self.model = None
        self.result: handlers.BuildResult | None = None
        self.family = w.Dropdown(options=[handlers.ALL_FAMILIES, *list_families()], value=family,
                                 description="family")
        self.pattern = w.Text(value=pattern, description="filter", placeholder="e.g. lu or *lu")
        names = handlers.filter_models(family, pattern)
        self.models = w.Dropdown(options=names, value=names[0] if names else None, description="model")
        # (as the app labels it; a text box read in Python, as the form's number boxes: _widget)
        self.batch_size = _number_box()(value="2", description="example batch size", continuous_update=False)
        self.overview = w.HTMLMath()
        self.form = w.VBox()
        #: What the form's boxes hold that cannot be built, said as soon as a box is left: each value
        #: named, with what its field expects (a box never puts back its last value over what was typed).
        self.form_message = w.HTML()
        self.build_button = w.Button(description="Build", button_style="primary")
        self.message = w.HTML()
        self.output = w.Output()
        self._fields: list[tuple[str, Any]] = []
        #: Each model's form, made when the model is first shown and kept: what was typed into it stays
        #: while other models are shown (each field with the value it started from, to tell the edits).
        self._forms: dict[str, list[tuple[FormField, Any]]] = {}
        self._filtering = False  # (a filter changing the list, whose passing selections the form ignores)
        self._last_shown: str | None = None  # (the model shown before a filter that matches none)
        self._build_said = ""  # (the message of the last Build, while it failed and is shown: not said twice)

        #: What went wrong in a callback (the filter, a pick, Build), said under the form (:class:`CallbackErrors`).
        self.errors = CallbackErrors()
        guard = self.errors.guard
        self.family.observe(guard(self._on_filter, "the family filter"), names="value")
        self.pattern.observe(guard(self._on_filter, "the name filter"), names="value")
        self.models.observe(guard(self._on_pick, "the model picked"), names="value")
        self.build_button.on_click(guard(lambda _: self.build(), "Build"))
        self.batch_size.observe(guard(lambda _: self._check_form(), "reading the batch size"), names="value")
        self._show_model()
        wrap = dict(layout=w.Layout(flex_flow="row wrap"))  # (a narrow notebook: the row goes on two lines)
        self.widget = w.VBox([
            w.HBox([self.family, self.pattern, self.models], **wrap),
            self.overview, self.form, w.HBox([self.batch_size, self.build_button], **wrap), self.form_message,
            self.message, self.errors.html, self.output,
        ])

    def _ipython_display_(self) -> None:
        _display(self.widget, f"workbench ModelBrowser ({self.models.value or 'no model picked'}): ipywidgets, "
                              "shown while the kernel that made them runs; run the cell again to see them.")

    def _on_pick(self, _change: Any) -> None:
        if not self._filtering:
            self._show_model()

    def _on_filter(self, _change: Any = None) -> None:
        """The filter narrows the list; the model shown stays while it matches. One it hides gives way to
        the first match (a list shows one of its own), its form kept as typed, which the message says. A
        filter matching nothing shows none, and the model it hid comes back with the first filter it matches
        (a typo in the filter, undone, changes nothing)."""
        before = self.models.value
        shown = before if before is not None else self._last_shown
        names = handlers.filter_models(self.family.value, self.pattern.value)
        self._filtering = True  # (new options select the first for a moment, which the form does not follow)
        try:
            self.models.options = names
            self.models.value = shown if shown in names else (names[0] if names else None)
        finally:
            self._filtering = False
        if self.models.value != before:
            self._show_model(hidden=None if shown in names else shown)

    def _edits(self, name: str | None) -> list[str]:
        """What was typed into ``name``'s form: ``label=value`` of each field changed from its start."""
        def shown(field: FormField, value: Any) -> str:  # (a number as typed: width=16, not width='16')
            return value if field.widget in ("int", "float") else repr(value)

        return [f"{field.label}={shown(field, box.value)}" for field, box in self._forms.get(name, ())
                if box.value != _start_value(field)]

    def _check_form(self) -> list[str]:
        """Say what the shown form's boxes hold that cannot be built (``form_message``), each value named
        with what its field expects, but for what the message of a failed Build shown above it says already
        (said once); returns those messages, all of them (none: the form can be built as it stands)."""
        from workbench.ui.forms import parse_form

        name = self.models.value
        problems = []
        for field, box in self._forms.get(name, ()) if name is not None else ():
            if field.widget in ("dropdown", "checkbox"):
                continue
            try:
                parse_form([field.param], {field.label: box.value}, f"Model {name!r}")
            except (ValueError, TypeError) as err:
                problems.append(str(err))
        try:
            handlers.read_batch_size(self.batch_size.value)
        except ValueError as err:
            problems.append(str(err)[:1].upper() + str(err)[1:])
        unsaid = [problem for problem in problems if problem.lower() not in self._build_said.lower()]
        self.form_message.value = "" if not unsaid else (
            f"<div style='color:var(--jp-error-color1, #c62828)'>{'<br>'.join(map(html.escape, unsaid))}</div>")
        return problems

    def _show_model(self, hidden: str | None = None) -> None:
        """Show the model picked: its overview and its form (as it was left, if shown before).

        Args:
            hidden: the model shown before, which the filter hid; the message names the values typed into
                the forms of the models not shown, which are kept.
        """
        name = self.models.value
        self._last_shown = name if name is not None else self._last_shown
        self.overview.value = _html(handlers.model_overview(name))
        if name not in self._forms:
            form = handlers.model_form(name)
            style = _label_style([f.label for f in form] + [self.batch_size.description])
            self._forms[name] = [(f, _widget(f, style)) for f in form]
            for _, box in self._forms[name]:
                box.observe(self.errors.guard(lambda _: self._check_form(), "reading the form"), names="value")
        self._fields = [(field.label, box) for field, box in self._forms[name]]
        style = _label_style([label for label, _ in self._fields] + [self.batch_size.description])
        self.batch_size.style, self.batch_size.layout = style, _field_layout(style)
        self.form.children = [box for _, box in self._fields]
        # (every form left with values typed, not only the one hidden now: typing "tanh" hides one model a key;
        # said as what happened, which stays true while the model shown does, the filter changing on)
        kept = [f"**{model}** ({', '.join(edits)})" for model in self._forms
                if model != name and (edits := self._edits(model))]
        self.message.value = "" if hidden is None or not kept else _html(
            (f"The filter hid **{hidden}**; the form shows **{name}**." if name else
             f"The filter hid **{hidden}** and matches no model.")
            + f" Kept as you typed them: {'; '.join(kept)}. Pick a model again to get its values back.")
        self.output.outputs = ()  # (another model's tree; clear_output() printed escapes outside a kernel)
        self._build_said = ""  # (the message now says no build's failure)
        self._check_form()  # (a form shown again as it was left: what it holds that cannot be built, said again)

    def build(self, **values: Any) -> handlers.BuildResult:
        """Build from the form, as the Build button does.

        Args:
            **values: field values to type into the form first, by parameter name, as a
                person would type them (``width="16"`` or ``width=16``); the form shows them once
                built, as they were read (``width="16.0"`` is 16). A name that is no parameter
                (``dept=3``) or a value its field does not take (``width=2.5``) is the message, and the
                form keeps what it held.

        Returns:
            The `BuildResult`: ``ok``, the ``model``, the ``message`` shown, the ``tree`` and the
            ``values`` built with. An invalid value is a message, never an exception.

        Example:
            ```python
            browser = ModelBrowser(family="mlp")
            browser.build(depth=3, width=8).ok      # True; browser.model is the MLP
            browser.build(depth=0).message
            # "**Could not build the model.** Model 'mlp': parameter 'depth' must lie in [1, 32], got 0."
            ```
        """
        import ipywidgets as w

        # the values given are read as the form reads what is typed, not as its boxes would take them: an
        # int box turned 2.5 into 2 and dropped a misspelt name without a word; either is now the message
        raw = {**{label: widget.value for label, widget in self._fields}, **values}
        self.result = handlers.build_model(self.models.value, raw, self.batch_size.value)
        if self.result.ok:
            self.model = self.result.model
            # the form shows what was built: each value as read, given or typed ("16.0" or "1e1" is 16 or 10,
            # which a box holds as it writes a number), so a box never keeps another text than the model's value
            for label, box in self._fields:
                if label in self.result.values:
                    built = self.result.values[label]
                    box.value = field_text(built) if isinstance(box, w.Text) else built
            self.batch_size.value = field_text(handlers.read_batch_size(self.batch_size.value))
        self.message.value = _html(self.result.message)
        self._build_said = "" if self.result.ok else self.result.message
        self._check_form()  # (what the build's message says of the boxes, not said again under the form)
        tree = self.result.tree  # (a failed build: its message, not an empty table under it)
        shown = {"text/html": tree.to_html(index=False), "text/plain": tree.to_string(index=False)}
        self.output.outputs = (({"output_type": "display_data", "metadata": {}, "data": shown},) if self.result.ok
                               else ())
        return self.result


def _figure_output(spec: dict) -> dict:
    """An output (nbformat's display_data) that JupyterLab draws with Plotly."""
    return {"output_type": "display_data", "metadata": {},
            "data": {PLOTLY_MIMETYPE: spec, "text/plain": "<a Plotly figure: run this notebook in JupyterLab>"}}


def _experiment_source(source: Any, example: str) -> tuple[str, Any]:
    """What an ``Experiment`` shows (its run in the background, else its open watch, else its
    ended background run) and its label; any other source as it is, with no label."""
    from workbench.experiments.base import Experiment

    if not isinstance(source, Experiment):
        return "", source
    label = f"{source.name} (seed {source.seed})"
    background = source.background
    if background is not None and not background.done:
        return label, background
    if source.watcher is not None and not source.watcher.closed:
        return label, source.watcher
    if background is not None:
        return label, background
    raise ValueError(f"Experiment {source.name!r} has nothing to show: start a run in the background "
                     f"(run = experiment.start(steps); {example}) or watch it first "
                     "(experiment.watch(), then experiment.run(steps)).")


def _load_stored(path: Any, call: str) -> Any:
    """The stored run at ``path`` (``workbench.load_run``). Where nothing lies at ``path`` and it is (or is
    close to) the name of an experiment or a model, the message says so and how to show one (``call``: the
    widget's call with ``{}`` for its source, ``"Dashboard({})"``): a name passed for a run
    (``Dashboard("activation_mlp")``) was read as a folder, and the message spoke of folders only."""
    import difflib
    import os

    from workbench.experiments import list_experiments
    from workbench.instrument import RunError, load_run
    from workbench.registry import list_models

    try:
        return load_run(path)
    except RunError as err:
        name = os.fspath(path)
        if os.path.lexists(name) or os.sep in name or "/" in name:
            raise
        experiments, models = list_experiments(), list_models()
        named = name if name in experiments + models else next(
            iter(difflib.get_close_matches(name, experiments + models, n=1, cutoff=0.75)), None)
        if named is None:
            raise
        said = f"{name!r} names" if named == name else f"Did you mean {named!r}? It names"
        if named in experiments:
            hint = (f"{said} an experiment, not a stored run: start a run of it and show that, "
                    f"run = workbench.experiments.create({named!r}).start(steps); {call.format('run')}.")
        else:
            hint = (f"{said} a model, not a stored run: watch one and show the watch, "
                    f"w = workbench.watch(workbench.create_model({named!r})); {call.format('w')}, "
                    "then train the model in later cells (w.step() after each step).")
        raise RunError(f"{hint} ({err})") from None


def _not_a_source(source: Any) -> str:
    """What to do with a ``source`` that is no run: a model is watched (``workbench.watch(model)``)."""
    import torch

    if isinstance(source, torch.nn.Module):
        return (f" To follow a model of your own ({type(source).__name__}), watch it and pass the watch: "
                "w = workbench.watch(model), then train it in later cells (w.step() after each step).")
    return ""


def _label(source: Any) -> str:
    """A run's name as the notebook shows it: ``experiment (seed n)``, a watched model's class or
    a stored run's folder name."""
    from workbench.experiments.base import BackgroundRun
    from workbench.instrument import Run, Watch

    if isinstance(source, BackgroundRun):
        return f"{source.experiment.name} (seed {source.experiment.seed})"
    if isinstance(source, Watch):
        return type(source.model).__name__
    return source.name if isinstance(source, Run) else ""


def _unrecorded(watch: Any) -> dict[str, str]:
    """The kinds ``watch`` does not record, by the option that is off (:func:`views.unrecorded_kinds`);
    none said for a watch whose recorder is not its own (``watch_distributed``'s records parameters that
    its rank's watch says it does not)."""
    from workbench.instrument import Recorder
    from workbench.ui.views import unrecorded_kinds

    return unrecorded_kinds(watch.options) if type(watch.recorder) is Recorder else {}


def _follow(watch: Any, take: Any) -> Any:
    """Give ``take`` what ``watch`` recorded so far and then what it records, each step once, as
    an ``Update``; returns the subscription (None for a closed watch)."""
    from workbench.instrument import Update
    from workbench.ui.views import FEED_INTERVAL

    seen = {"last": 0}
    lock = threading.Lock()

    def feed(update: Any) -> None:
        with lock:  # (waits until the steps recorded before are taken in)
            cut = seen["last"]
        records = tuple(r for r in update.records if r.step > cut)
        if records or update.dropped:
            take(Update(records, update.dropped))

    with lock:
        subscription = None if watch.closed else watch.subscribe(feed, interval=FEED_INTERVAL)
        earlier = watch.recorder.records()  # (what the stream delivered before we subscribed)
        if earlier:
            take(Update(tuple(earlier), 0))
            seen["last"] = earlier[-1].step
    return subscription


def _config(source: Any) -> dict | None:
    """The configuration and seed an experiment's run was made with (live or stored), else None."""
    import dataclasses

    from workbench.experiments.base import BackgroundRun, Experiment
    from workbench.instrument import Run

    experiment = source.experiment if isinstance(source, BackgroundRun) else source
    if isinstance(experiment, Experiment):
        return {**dataclasses.asdict(experiment.config), "seed": experiment.seed}
    if isinstance(source, Run) and isinstance(source.metadata.get("config"), dict):
        return {**source.metadata["config"], "seed": source.metadata.get("seed")}
    return None


def _distinct(labels: list[str], configs: list[dict | None]) -> list[str]:
    """A name per run: its label, and where runs share a label, the settings they differ in
    (``activation=gelu``; ``activation_mlp (seed 0): activation=gelu`` beside runs of other labels),
    else a number (``Linear (2)``): what tells a run apart from the others, and no more (a legend
    of long names squeezed the figures)."""
    names = list(labels)
    for label in set(labels):
        group = [i for i, each in enumerate(labels) if each == label]
        if len(group) < 2:
            continue
        known = [configs[i] for i in group if configs[i] is not None]
        keys = sorted({key for config in known for key in config})
        differ = [key for key in keys if len({repr(config.get(key)) for config in known}) > 1]
        prefix = f"{label}: " if len(group) < len(labels) else ""
        named = [prefix + ", ".join(f"{key}={configs[i].get(key)}" for key in differ)
                 if differ and configs[i] is not None else label for i in group]
        for n, (i, name) in enumerate(zip(group, named), 1):
            names[i] = f"{name} ({n})" if named.count(name) > 1 else name
    return names


_STOPPABLE = ("running", "paused")
_ENDED = ("finished", "stopped", "failed")


def check_view_options(interval: Any, kind: Any, statistic: Any, smoothing: Any, log_y: Any = None) -> None:
    """Refuse a Dashboard's or a Compare's first view that could not be drawn, naming the value."""
    import numpy as np

    from workbench.instrument import KINDS
    from workbench.ui.views import STATISTICS

    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}.")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}.")
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be a number in [0, 1), got {smoothing!r}.")
    if log_y is not None and not isinstance(log_y, (bool, np.bool_)):  # (log_y="no" drew a log scale)
        raise TypeError(f"log_y must be True (a log scale), False (a linear one) or None (the figure chooses), "
                        f"got {log_y!r}.")


def view_choices(kind: str, statistic: str) -> tuple[Any, Any]:
    """The kind and statistic dropdowns of a Dashboard's or a Compare's per-site figures, narrow
    enough (their longest choice, ``grad_output``) that a tab's controls share a row at a notebook's
    width."""
    import ipywidgets as w

    from workbench.instrument import KINDS
    from workbench.ui.views import STATISTICS

    style = {"description_width": "initial"}
    return (w.Dropdown(options=list(KINDS), value=kind, description="kind", style=style,
                       layout=w.Layout(width="13em")),
            w.Dropdown(options=list(STATISTICS), value=statistic, description="statistic", style=style,
                       layout=w.Layout(width="15em")))


class FigureTabs:
    """Plotly figures in tabs, the page sent only the open one's when they change: each figure sent
    replaces a plot that the browser builds anew, so a redraw costs the page one figure however many
    there are (a browser slowed by load that was sent all of them at every redraw fell ever further
    behind, a click waiting behind the queue). A figure whose tab is closed goes stale, and is drawn
    when its tab is opened, when :meth:`figure` asks for it, or by :meth:`draw_stale` (a run's end:
    every tab shows it, and a saved notebook keeps it). The Dashboard and Compare both draw through it.

    Args:
        pages: name -> (tab title, the tab's content, the ``Output`` its figure goes to), in tab order.
        make: ``make(name)`` draws the figure ``name`` from what has arrived: a Plotly spec, or None
            for no figure (an empty output).
        lock: held while a figure is drawn and sent (the owner's drawing lock).
        open: the figure whose tab is open first.
    """

    def __init__(self, pages: dict[str, tuple[str, Any, Any]], make: Any, lock: Any, open: str) -> None:
        import ipywidgets as w

        self.names = tuple(pages)
        self._outputs = {name: output for name, (_, _, output) in pages.items()}
        self._make, self._lock = make, lock
        self._figures: dict[str, dict | None] = dict.fromkeys(self.names)
        self._stale: set[str] = set()  # (figures not sent since what they show changed: their tab is closed)
        self._errors: dict[str, Exception] = {}  # (what stopped a figure's last draw, shown in its tab)
        self._selecting = False  # (select(): the caller draws the tab it opens)
        self.widget = w.Tab(children=[page for _, page, _ in pages.values()],
                            titles=[title for title, _, _ in pages.values()], selected_index=self.names.index(open))
        self.widget.observe(self._on_tab, names="selected_index")

    @staticmethod
    def page(controls: list, output: Any, *below: Any) -> Any:
        """A tab's content, read top-down: the controls of its figure on a row, the figure, then
        what is said under it. The row wraps: a notebook too narrow for it puts the last controls
        on a line of their own (a row that did not wrap squeezed a list of call sites to a sliver)."""
        import ipywidgets as w

        return w.VBox([w.HBox(controls, layout=w.Layout(flex_flow="row wrap")), output, *below])

    @property
    def open(self) -> str:
        """The figure whose tab is open."""
        return self.names[self.widget.selected_index or 0]

    def draw(self, names: tuple[str, ...], every: bool = False) -> None:
        """Draw and send the figure open among ``names`` (``every``: all of them); the others go stale."""
        with self._lock:
            for name in names:
                if every or name == self.open:
                    self.redraw(name)
                else:
                    self._stale.add(name)

    def draw_stale(self) -> None:
        """Draw and send every figure not sent since what it shows changed."""
        self.draw(tuple(name for name in self.names if name in self._stale), every=True)

    def redraw(self, name: str) -> None:
        """Draw the figure ``name`` and send it, whichever tab is open. A figure that cannot be drawn
        shows why in its place, with the traceback (:meth:`figure` raises it): drawn from a tab's click
        or the timer, the error went to no cell, and the tab stayed blank without a word."""
        import traceback

        with self._lock:
            self._stale.discard(name)
            self._errors.pop(name, None)
            try:
                spec = self._make(name)
            except Exception as exc:
                self._figures[name], self._errors[name] = None, exc
                said = (f"The {name} figure could not be drawn (the run and the other figures go on; it is drawn "
                        "again with the next steps or when its tab is opened):")
                self._outputs[name].outputs = ({"output_type": "error", "ename": type(exc).__name__,
                                                "evalue": str(exc),
                                                "traceback": [said, *traceback.format_exception(exc)]},)
                return
            self._figures[name] = spec
            # set the outputs (not `with out:`): a redraw from a timer thread lands in this
            # widget, not in whichever cell runs at that moment
            self._outputs[name].outputs = (_figure_output(spec),) if spec is not None else ()

    def figure(self, name: str) -> dict | None:
        """The figure ``name`` as last drawn, drawn now if it is stale.

        Raises:
            Exception: what stopped its last draw (which its tab shows).
        """
        with self._lock:
            if name in self._stale:
                self.redraw(name)
            if name in self._errors:
                raise self._errors[name]
            return self._figures[name]

    def select(self, name: str) -> None:
        """Open the tab of ``name`` without drawing it: the caller draws it (after its other changes)."""
        self._selecting = True
        try:
            self.widget.selected_index = self.names.index(name)
        finally:
            self._selecting = False

    def _on_tab(self, change: Any) -> None:
        if not self._selecting and change["new"] is not None:
            # (sent again even when up to date: a plot drawn while its tab was hidden has no size)
            self.redraw(self.names[change["new"]])


class Dashboard:
    """Every view of a run, live: header with progress, what looks wrong (the run's findings,
    :mod:`workbench.diagnose`), metrics, a statistic per call site, the layer x step heatmap,
    distributions over time and where NaN/Inf first appeared.

    ::

        exp = workbench.experiments.create("activation_mlp")
        run = exp.start(500)                    # trains in the background; the cell is free
        Dashboard(run)                          # updates live; Pause / Resume / Stop
        Dashboard(exp.watch())                  # or a watch (exp.run(...) in a later cell)
        Dashboard("runs/a")                     # or a stored run (or workbench.load_run("runs/a")): replayed,
                                                # and followed while it is written

    The dashboard draws the view layer (:class:`~workbench.ui.views.RunView`), fed by the
    watch's stream: training only queues each step for it. A timer thread redraws every
    ``interval`` seconds, and only when steps arrived, taking in the new ones (a redraw costs
    in proportion to them; the figures are bounded however long the run). The figures are
    Plotly figures, drawn by JupyterLab's own Plotly renderer: hover, zoom, legend clicks. They
    are in tabs, and a redraw sends the open one (the browser builds each figure it is sent anew:
    four a second fell ever further behind in a browser slowed by load); every figure is drawn when
    the dashboard is made (what a saved notebook keeps), a tab opened is drawn then, and every
    figure again at the run's end.

    A stored run whose writer is still at work (status ``running``, in this process or another)
    is followed until it ends: each tick that finds new steps or another status reads the run
    again (the views and findings of a stored run are built from the whole of it, as the app's
    Runs tab builds them), and no more than a quarter of the time goes to reading.

    The findings list (most severe, then newest by last step; of those, the first begun) updates
    with the views; picking one (or :meth:`focus_finding`) moves the kind, statistic and call site to it and shades the
    steps it held.

    Args:
        source: a :class:`~workbench.experiments.base.BackgroundRun` (``exp.start(...)``), an
            ``Experiment`` (its run in the background, else its open watch), a ``Watch``, or a
            stored ``Run`` or its path (followed while its status is ``running``).
        interval: seconds between checks for new steps (> 0).
        kind: the kind (``activation``, ``grad_output``, ``param``, ``param_grad``) the per-site
            figure and the heatmap show first.
        statistic: the statistic they show first (a column of ``workbench.ui.views.STATISTICS``).
        smoothing: the metrics' smoothing, in [0, 1).
        log_y: metrics on a log scale (True) or a linear one (False); None: each panel chooses, log where its
            values are positive and an early spike would flatten the rest (:func:`workbench.ui.figures.dwarfed`),
            kept once settled, until the box is set.
        tab: the figure open first (``metrics``, ``sites``, ``heatmap``, ``distribution``).
    """

    def __init__(self, source: Any, interval: float = 1.0, kind: str = "activation", statistic: str = "std",
                 smoothing: float = 0.0, log_y: bool | None = None, tab: str = "metrics") -> None:
        import os

        import ipywidgets as w

        from workbench.experiments.base import BackgroundRun
        from workbench.instrument import Run, Watch
        from workbench.ui.findings import RunFindings
        from workbench.ui.views import RunView

        check_view_options(interval, kind, statistic, smoothing, log_y)
        if tab not in FIGURES:
            raise ValueError(f"tab must be the figure shown first, one of {FIGURES}, got {tab!r}.")
        self.run: BackgroundRun | None = None  # the background run the buttons act on
        self.watch: Watch | None = None
        self.stored: Run | None = None  # a stored run, read again while it is written (see _read_store)
        self._draw_lock = threading.RLock()
        label, source = _experiment_source(source, "Dashboard(run)")
        if isinstance(source, (str, os.PathLike)):  # (as Compare takes it)
            source = _load_stored(source, "Dashboard({})")  # (a RunError that names the path)
        if isinstance(source, BackgroundRun):
            self.run, self.watch = source, source.watch
            label = label or _label(source)
            self.view = RunView(label=label, total=source.total)
            self.view.first_step = source.first_step  # (the experiment's steps before: the header counts from it)
        elif isinstance(source, Watch):
            self.watch = source
            self.view = RunView(label=label or type(source.model).__name__)
        elif isinstance(source, Run):
            self.stored = source
            self._stored_as: tuple = ()  # (steps, status) of the store when it was last read
            self._next_read = 0.0  # time.monotonic() before which the store is not read again
            self._read_store()
        else:
            raise TypeError("Dashboard needs a run started with experiment.start(steps), an Experiment, a Watch, "
                            f"a stored Run (workbench.load_run(path)) or its path, got {type(source).__name__}."
                            + _not_a_source(source))
        if self.watch is not None:  # (fed with the view, by its subscription: see _follow)
            self.view.unrecorded = _unrecorded(self.watch)  # (a stored run's view reads it from its metadata)
            self.view.schedule = (self.watch.every, self.watch.start_step)
            self.diagnoses = RunFindings(metadata=getattr(self.watch, "metadata", None))  # (its chance level)
        self.source, self.interval = source, float(interval)
        self._focus = None  # the picked finding's Focus
        self._picked_finding = None  # the pick's findings.pick_key
        self._findings = None  # the findings frame the list shows
        self._listed: tuple = ()  # the causes whose consequences the list shows (findings.fold_consequences)
        self._log = None  # the run's interventions, as last drawn
        self.draws = 0  # how many times the figures were drawn
        self.ticks = 0  # how many times the timer looked for new steps
        self._site_colours: dict[str, str] = {}  # (each site's colour in the per-site figure, kept)
        self._drawn: tuple | None = None
        self._closed = threading.Event()
        self._subscription = None
        self._picked_sites = False  # the user picked sites (else: the view's default ones, as they change)
        self._kept_log_sites = None  # the scale the per-site figure chose, once settled (figures.keep_scale)
        self._kept_log_metrics: dict = {}  # the scales the metrics' panels chose, once settled (figures.keep_scales)
        self._quiet = False  # (setting the controls from code)

        style = {"description_width": "initial"}
        # (30em at least beside the buttons: a narrower notebook puts them under it, rather than the
        # header in a column of a few words a line; at 20em a running run's header took four lines)
        self.header = w.HTML(layout=w.Layout(flex="1 1 30em"))
        button = dict(layout=w.Layout(width="auto", min_width="6.5em", flex="0 0 auto"))
        self.pause_button = w.Button(description="Pause", icon="pause", **button)
        self.resume_button = w.Button(description="Resume", icon="play", **button)
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger", **button)
        self.smoothing = w.FloatSlider(value=float(smoothing), min=0.0, max=0.99, step=0.01, description="smoothing",
                                       style=style, continuous_update=False)
        self.kind, self.statistic = view_choices(kind, statistic)
        self.sites = w.SelectMultiple(options=[], description="call sites", rows=6, style=style,
                                      layout=w.Layout(width="22em"))
        self.distribution_site = w.Dropdown(options=[], description="distribution of", style=style,
                                            layout=w.Layout(width="28em"))
        self.metrics_plot, self.sites_plot, self.heatmap_plot, self.distribution_plot = (w.Output() for _ in range(4))
        self.site_note = w.HTML()  # (how many sites, and a tensor's other names: a Dropout(p=0) is its input)
        self.anomalies = w.HTML()
        self.findings_summary = w.HTML()
        # (the widget's margins come on top of its width: 100% would run past the output's edge)
        self.findings_list = w.Select(options=[], rows=4, layout=w.Layout(width="calc(100% - 8px)"))
        self.findings_detail = w.HTML()

        #: What went wrong in a callback (a button, a control, a finding picked), said under the header
        #: (:class:`CallbackErrors`; a figure that cannot be drawn says so in its tab).
        self.errors = CallbackErrors()
        guard = self.errors.guard
        # the metrics' log y: ticked while a panel chose log; set, every panel's scale (each chooses until then).
        # (a checkbox's width is 300px unless told: a row of controls wrapped before its "log y")
        self.log_y = _scale_box()(guard(self._on_log_metrics, "the metrics' log y"), picked=log_y is not None,
                                  value=bool(log_y), description="log y", indent=False, layout=w.Layout(width="auto"))
        # the per-site figure's: its choice shown until set (another kind or statistic: the figure's choice again)
        self.log_sites = _scale_box()(guard(self._on_log_sites, "the call sites' log y"), picked=False,
                                      value=False, description="log y", indent=False, layout=w.Layout(width="auto"))
        self.pause_button.on_click(guard(lambda _: self._act("pause"), "Pause"))
        self.resume_button.on_click(guard(lambda _: self._act("resume"), "Resume"))
        self.stop_button.on_click(guard(lambda _: self._act("stop"), "Stop"))
        self.smoothing.observe(guard(lambda _: self._draw(("metrics",)), "the metrics' smoothing"), names="value")
        for control in (self.kind, self.statistic):
            control.observe(guard(self._on_kind, f"the {control.description} picked"), names="value")
        self.sites.observe(guard(self._on_sites, "the call sites picked"), names="value")
        self.distribution_site.observe(guard(lambda _: self._quiet or self._draw(("distribution",)),
                                             "the distribution's site picked"), names="value")
        self.findings_list.observe(guard(self._on_finding, "the finding picked"), names="index")

        buttons = [self.pause_button, self.resume_button, self.stop_button] if self.run is not None else []
        sites_page = FigureTabs.page([self.kind, self.statistic, self.sites, self.log_sites], self.sites_plot,
                                     self.site_note)
        self._site_controls = sites_page.children[0]
        # one figure open at a time: the browser redraws only it, however slow (see FigureTabs). The kind
        # and statistic are the heatmap's too: the same controls, shown in its tab as well
        self._tabs = FigureTabs({
            "metrics": ("metrics", FigureTabs.page([self.smoothing, self.log_y], self.metrics_plot), self.metrics_plot),
            "sites": ("call sites", sites_page, self.sites_plot),
            "heatmap": ("heatmap", FigureTabs.page([self.kind, self.statistic], self.heatmap_plot), self.heatmap_plot),
            "distribution": ("distribution", FigureTabs.page([self.kind, self.distribution_site],
                                                             self.distribution_plot), self.distribution_plot),
        }, self._make_figure, self._draw_lock, open=tab)
        self.tabs = self._tabs.widget
        # the call sites' tab opened: its list scrolled to the sites drawn (picked while the tab was hidden, by
        # default or by a finding, they were out of sight below the list's first rows)
        self.tabs.observe(guard(lambda change: change["new"] == FIGURES.index("sites") and self._reveal_sites(),
                                "opening the call sites' tab"),
                          names="selected_index")
        self.widget = w.VBox([
            # (the buttons wrap together, under the header, in a notebook too narrow for both)
            w.HBox([self.header, w.HBox(buttons)],
                   layout=w.Layout(flex_flow="row wrap", align_items="center", justify_content="space-between")),
            self.errors.html,
            self.findings_summary, self.findings_list, self.findings_detail,
            self.tabs,
            self.anomalies,
        ])
        if self.watch is not None:
            self._follow(self.watch)
        # every figure, once: a saved notebook keeps what a cell's run sent (nbclient drops what the timer
        # sends between cells), and each tab has its figure
        self.refresh()
        self._timer: threading.Thread | None = None
        if (self.watch is not None or self.stored is not None) and not self._ended():
            self._timer = threading.Thread(target=self._tick, name="workbench-dashboard", daemon=True)
            self._timer.start()
        elif self.run is None:  # (a watch closed while this was made: the steps it delivered since the draw)
            self._last_draw()
        if self.run is not None:  # the end drawn at once (before run.join() returns), not at the next tick
            self.run.on_done(lambda _run: self._last_draw())

    @property
    def following(self) -> bool:
        """Whether the dashboard still redraws on its own: its run (live, or stored and still being
        written) has not ended, and it was not closed (false from ``close()`` on, its timer's last draw may still
        be ending)."""
        return not self._closed.is_set() and self._timer is not None and self._timer.is_alive()

    # ------------------------------------------------------------------ feeding
    def _follow(self, watch: Any) -> None:
        """Take in what the watch recorded so far and subscribe to what comes: every step once."""

        def take(update: Any) -> None:
            self.view.feed(update)
            self.diagnoses.diagnoser.feed(update.records)  # (only queued: taken in by the next draw)

        self._subscription = _follow(watch, take)

    def _read_store(self) -> None:
        """Read the stored run again if it grew or its status changed since the last read. A read
        costs in proportion to the whole run, so the next waits three times as long as this one
        took: reading takes at most a quarter of the time, however long the run."""
        from workbench.instrument import load_run
        from workbench.ui.findings import RunFindings
        from workbench.ui.views import RunView

        if time.monotonic() < self._next_read:
            return
        began = time.monotonic()
        run = load_run(self.stored.path)  # (anew: its metadata, the error of a failed run included)
        now = (len(run.steps), run.status)
        if now != self._stored_as:
            view, diagnoses = RunView.from_run(run), RunFindings(run)
            with self._draw_lock:
                self.view, self.diagnoses, self.stored, self._stored_as = view, diagnoses, run, now
        self._next_read = time.monotonic() + 3 * (time.monotonic() - began)

    def _ended(self) -> bool:
        if self.run is not None:
            return self.run.done
        if self.stored is not None:
            return self.stored.status != "running"  # (read from the store: interrupted once its writer is gone)
        return self.watch is None or self.watch.status != "running"  # (final once the watch's close is done)

    def _over(self) -> bool:
        """Whether the run has ended, as its figures say it: a background run's last draw comes once its
        status says so, before it is done (:meth:`_ended`)."""
        return self._ended() or (self.run is not None and self.run.status in _ENDED)

    def _status(self) -> None:
        if self.run is not None:
            self.view.set_status(self.run.status, self.run.error)
        elif self.watch is not None:
            self.view.set_status(self.watch.status, self.watch.error)

    def _tick(self) -> None:
        """The timer: redraw when steps arrived or the status changed, until the run ended and
        its last steps are drawn."""
        while not self._closed.wait(self.interval):
            if self.widget.comm is None:  # (its widget closed: no page shows it, nothing to draw)
                self._stop_following()
                return
            try:
                if self._ended():
                    self._last_draw()
                    return
                if self.run is not None and self.run.status in _ENDED:
                    continue  # (its last steps are on their way: the run's end draws them, then the status)
                self._refresh_if_new()
            except Exception as exc:  # a dashboard never takes the training down; it says why it stopped
                self.header.value += f"<br><b>The dashboard stopped updating:</b> {html.escape(repr(exc))}"
                return
            self.ticks += 1

    def _last_draw(self) -> None:
        """The run ended: its last steps, its status, and no more ticks."""
        with self._draw_lock:
            if self._closed.is_set():
                return
            if self._subscription is not None:
                self._subscription.flush(timeout=5.0)
            if self.stored is not None:
                self._next_read = 0.0  # (what was written last, read now however recent the last read)
            self._refresh_if_new()
            self._tabs.draw_stale()  # (each tab shows the end, and a saved notebook keeps it)
            self._stop_following()

    def _state(self) -> tuple:
        header = self.view.header()
        return self.view.steps_fed, self.view.dropped, header["status"]

    def _refresh_if_new(self) -> None:
        if self.stored is not None:
            self._read_store()
        self._status()
        if self._state() != self._drawn:
            self._refresh()
        else:
            self._draw_header()  # (steps/s and the time left change by the clock)

    # ------------------------------------------------------------------ drawing
    def refresh(self) -> None:
        """Draw everything from what has arrived, every figure included (the timer does this by itself,
        drawing the open figure and the others when they are opened)."""
        self._refresh(every=True)

    @property
    def open_figure(self) -> str:
        """The figure whose tab is open: ``metrics``, ``sites``, ``heatmap`` or ``distribution``."""
        return self._tabs.open

    def _refresh(self, every: bool = False) -> None:
        """Draw what arrived: the header, findings and NaN / Inf, and the open figure (``every``: every
        figure). The others are drawn when their tab is opened, or at the run's end."""
        with self._draw_lock:
            self._status()
            self._drawn = self._state()
            self._log = self._intervention_log()  # (read once a draw: a stored run's is a query)
            self._sync_controls()
            self._draw(FIGURES, every=every)
            self._draw_anomalies()
            self._draw_findings()
            self._draw_header()  # last: a header that says "finished" has its figures drawn
            self.draws += 1

    def figure(self, name: str) -> dict:
        """The Plotly figure last drawn.

        Args:
            name: ``metrics``, ``sites``, ``heatmap`` or ``distribution``.

        Returns:
            Its Plotly spec (``data`` and ``layout``), as JupyterLab receives it.

        Raises:
            ValueError: another name.
        """
        if name not in FIGURES:
            raise ValueError(f"figure must be 'metrics', 'sites', 'heatmap' or 'distribution', got {name!r}.")
        return self._tabs.figure(name)  # (its tab closed: drawn now, from what has arrived)

    def _draw_header(self) -> None:
        from workbench.ui import figures

        header = _line_html(figures.header_markdown(self.view))
        if self._closed.is_set() and not self._ended():
            header += "<br>" + _no_longer_follows("Dashboard")
        if self.run is not None:
            status = self.run.status
            header += self._others_training() if status in _STOPPABLE else ""
            self.pause_button.disabled = status != "running"
            self.resume_button.disabled = status != "paused"
            self.stop_button.disabled = status not in _STOPPABLE
            self.stop_button.button_style = "" if self.stop_button.disabled else "danger"  # (grey when greyed out)
        self.header.value = header

    def _others_training(self) -> str:
        """The other background runs in progress in this kernel, said under the header while this run trains:
        a cell that starts a run, run again, left its first run training unseen (its Dashboard gone), each run
        then taking its share of the CPU; the user is told which, and how to stop them."""
        from workbench.experiments import running

        others = [run for run in running() if run is not self.run]
        if not others:
            return ""
        # (a paused one said so: it takes no share of the CPU while paused)
        named = ", ".join(f"{html.escape(_label(run))} at step {run.step}" + (" (paused)" if run.status == "paused"
                                                                                else "") for run in others[:3])
        named += f" and {len(others) - 3} more" if len(others) > 3 else ""
        return (f"<br><span style='color:var(--jp-warn-color0, #b26a00)'>Also training in this kernel: {named} "
                "(a cell run again leaves its run training: <code>workbench.experiments.running()</code> lists "
                "them, <code>run.stop()</code> stops one).</span>")

    def _sync_controls(self) -> None:
        """Site choices as the run shows them; the default sites until the user picks."""
        kind, statistic = self.kind.value, self.statistic.value
        order = self.view.site_order(kind)
        chosen = (list(self.sites.value) if self._picked_sites
                  else self.view.default_sites(kind, statistic))
        with_histograms = self.view.histogram_sites(kind)
        self._quiet = True
        try:
            if tuple(order) != tuple(self.sites.options):
                self.sites.options = order
                self.sites.rows = min(max(len(order), 2), 8)  # (up to 8 without scrolling)
            chosen = tuple(s for s in chosen if s in order)
            if chosen != tuple(self.sites.value):
                self.sites.value = chosen
            if tuple(with_histograms) != tuple(self.distribution_site.options):
                keep = self.distribution_site.value
                self.distribution_site.options = with_histograms
                self.distribution_site.value = (keep if keep in with_histograms
                                                else (with_histograms[-1] if with_histograms else None))
        finally:
            self._quiet = False

    def _draw(self, names: tuple[str, ...], every: bool = False) -> None:
        """Draw the figure open among ``names`` (``every``: all of them); the others are drawn when
        their tab is opened (:class:`FigureTabs`)."""
        self._tabs.draw(names, every=every)

    def _make_figure(self, name: str) -> dict:
        """The figure ``name`` drawn from what has arrived (:class:`FigureTabs` sends it)."""
        from workbench.ui import figures

        with self._draw_lock:
            kind, statistic = self.kind.value, self.statistic.value
            if name == "metrics":
                # (until the user sets the box, each panel chooses its scale, kept once settled: figures.keep_scales;
                # the box ticked while one chose log, as the app's)
                picked = self.log_y.picked
                spec = figures.metrics_figure(self.view, smoothing=self.smoothing.value,
                                              log_y=self.log_y.value if picked else None,
                                              kept_log=figures.kept_scales(self._kept_log_metrics, []))
                if not picked:
                    self._kept_log_metrics = figures.keep_scales(self._kept_log_metrics, [], spec)
                    self.log_y.show(figures.drawn_log(spec))
            elif name in ("sites", "heatmap") and not self.view.site_order(kind):
                message = self.view.no_rows(kind)  # (never "yet" of rows that cannot come)
                spec = figures.empty_figure(message)
                if name == "sites":
                    self.site_note.value = _html(message)
            elif name == "sites":
                sites = list(self.sites.value) or None
                # (until the user sets it, the figure chooses its scale, log where a line dwarfs the others,
                # and the box says which)
                # (and keeps it for the kind, statistic and sites picked once settled: new steps do not switch it)
                scale_for = [kind, statistic, sites if self._picked_sites else None]  # (defaults change with steps)
                kept = figures.kept_scale(self._kept_log_sites, scale_for)
                log = self.log_sites.value if self.log_sites.picked else None
                spec = figures.sites_figure(self.view, kind, statistic, sites, log, colors=self._site_colours,
                                            kept_log=kept)  # (a site keeps its colour)
                if not self.log_sites.picked:
                    self.log_sites.show(figures.drawn_log(spec))
                    self._kept_log_sites = figures.keep_scale(self._kept_log_sites, scale_for, spec)
                drawn = sites or self.view.default_sites(kind, statistic)
                self.site_note.value = _html(figures.site_note(self.view, kind, self.view.site_order(kind), drawn,
                                                               default=not self._picked_sites))
            elif name == "heatmap":
                spec = figures.heatmap_figure(self.view, kind, statistic)
            else:
                if not self.distribution_site.value and self.view.histogram_sites(kind):
                    self._sync_controls()  # (histograms arrived since the last tick: the tab opened in between)
                site = self.distribution_site.value
                records = self._records_histograms()
                rows = self.view.site_order(kind)
                if site:
                    spec = figures.distribution_figure(self.view, kind, site)
                elif records is False or (records is None and rows and self._over()):
                    spec = figures.empty_figure(f"No histograms of {kind} rows: this run "
                                                f"{'was' if self._over() else 'is'} recorded with histograms=False; "
                                                "leave them on (the default) to see distributions over time.")
                else:
                    spec = figures.empty_figure(f"No histograms of {kind} rows yet." if rows
                                                else self.view.no_rows(kind))
            log = self._log
            if log is not None and name in ("sites", "metrics"):  # (the steps each intervention was on)
                spec = figures.shade_interventions(spec, log, self.view.last_step)
            focused = self._focus
            if focused is not None and name in ("sites", "metrics"):
                from workbench.ui.findings import mark_steps

                spec = mark_steps(spec, focused.step, focused.last_step)
            return spec

    def _records_histograms(self) -> bool | None:
        """Whether the run records histograms, as it was set up: its watch's ``histograms`` option, a
        stored run's metadata; None for a stored run that does not say (then its rows tell, once it ended)."""
        if self.watch is not None:
            return bool(self.watch.options["histograms"])
        said = self.stored.metadata.get("histograms") if self.stored is not None else None
        return said if isinstance(said, bool) else None

    def _draw_anomalies(self) -> None:
        first = self.view.first_anomaly
        if first is None:
            going = self.view.header()["status"] in ("running", "paused")
            self.anomalies.value = f"<b>NaN / Inf:</b> none{' so far' if going else ' in this run'}."
            return
        frame = self.view.anomaly_frame().tail(8)
        self.anomalies.value = (
            f"<b>NaN / Inf first at step {first['step']}</b>, {html.escape(first['kind'])} of "
            f"<code>{html.escape(first['site'])}</code> ({first['nan_count']} NaN, {first['inf_count']} Inf). "
            f"Most recent:" + frame.to_html(index=False, border=0))

    def findings(self) -> Any:
        """The run's findings now, as the list shows them: a frame of :data:`workbench.diagnose.COLUMNS`
        and ``calls``, ``call_sites`` (a module's calls merged: :func:`workbench.ui.findings.merge_calls`),
        ``folded``, ``listed``, ``trouble_steps`` (the consequences folded under a cause, listed under it once it
        was picked, the steps they span: :func:`workbench.ui.findings.fold_consequences`)."""
        return self.diagnoses.frame(self._listed)

    def _intervention_log(self) -> Any:
        """The interventions of the run (``Watch.intervention_log()``, ``Run.interventions()``), or None."""
        return (self.watch.intervention_log() if self.watch is not None
                else self.stored.interventions() if self.stored is not None else None)

    def _draw_findings(self) -> None:
        from workbench.ui import findings as view

        frame = self.diagnoses.frame(self._listed)
        # a finding that held while a patch was in names it: it may be the patch's doing
        frame = view.during_interventions(frame, self._log)
        # (live or stored while its writer is at work; a run whose status says it ended: its last draw comes
        # before it is done)
        running = not self._over()
        summary = view.findings_summary(frame, running=running, steps=self.diagnoses.fed)
        if self.diagnoses.error:
            summary += f" <b>Diagnosing failed:</b> {html.escape(self.diagnoses.error)}"
        self.findings_summary.value = _line_html(summary)
        self._findings = frame
        labels = [view.option_label(row) for row in frame.itertuples()]
        # the pick is a finding (what, where, since when), kept while its label changes (its last step grows)
        picked = view.picked_row(frame, self._picked_finding)
        self._quiet = True
        try:
            if tuple(labels) != tuple(self.findings_list.options):
                self.findings_list.options = labels
                self.findings_list.rows = min(max(len(labels), 2), 6)  # (one row would read as a dropdown)
            if self.findings_list.index != picked:
                self.findings_list.index = picked
        finally:
            self._quiet = False
        self.findings_list.layout.display = "" if labels else "none"
        self.findings_detail.value = view.finding_html(frame.iloc[picked]) if picked is not None else (
            f"<span style='color:{view.MUTED}'>Pick a finding for its evidence and what to try.</span>" if labels
            else "")

    def focus_finding(self, index: int) -> Any:
        """Show the ``index``-th finding of the list (0: the first): its kind, statistic and call
        site in the per-site figure and the heatmap (its metric in the metrics panel), the steps
        it held shaded. A cause's consequences folded under it are listed under it, listed ones folded
        again (:func:`workbench.ui.findings.toggled`). Returns its :class:`~workbench.ui.findings.Focus`.

        Raises:
            IndexError: no such finding in the list.
        """
        from workbench.ui import findings as view

        with self._draw_lock:
            frame = self._findings if self._findings is not None else self.diagnoses.frame(self._listed)
            target = view.focus(frame, index, self.view)
            listed = view.toggled(self._listed, frame.iloc[index])
            self._focus = target
            self._picked_finding = view.pick_key(frame.iloc[index])
            if listed != self._listed:  # (the cause's row stays where it was: its consequences after it)
                self._listed = listed
                self._draw_findings()
                frame = self._findings
            self._quiet = True
            try:
                if self.findings_list.index != index and index < len(self.findings_list.options):
                    self.findings_list.index = index
                # (the figure that shows it opened, drawn below: a call site's, or the metrics for a finding
                # of the loss)
                self._tabs.select("sites" if target.kind is not None else "metrics")
                if target.kind is not None:
                    self.kind.value = target.kind
                    self.statistic.value = target.statistic
                    self._sync_controls()
                    shown = tuple(site for site in target.sites if site in self.sites.options)
                    if shown:
                        self.sites.value = shown
                        self._picked_sites = True
                        self._reveal_sites()
                    if target.site in self.distribution_site.options:
                        self.distribution_site.value = target.site
            finally:
                self._quiet = False
            self._draw(FIGURES)
            self.findings_detail.value = view.finding_html(frame.iloc[index])
        return target

    def _reveal_sites(self) -> None:
        """Scroll the site list to its picked sites. A browser scrolls a list to what is picked when
        it draws it, but ipywidgets picks in a list already drawn without scrolling it (a site
        focused far down a list of a hundred stayed out of sight), so the list is drawn anew: taken
        out of its row and put back."""
        row = self._site_controls.children
        self._site_controls.children = tuple(child for child in row if child is not self.sites)
        self._site_controls.children = row

    def _on_finding(self, change: Any) -> None:
        if self._quiet or change["new"] is None:
            return
        self.focus_finding(int(change["new"]))

    # ------------------------------------------------------------------ controls
    def _on_kind(self, _change: Any) -> None:
        if self._quiet:
            return
        self._picked_sites = False  # another kind or statistic: its own default sites, and scale
        self.log_sites.picked = False
        with self._draw_lock:
            self._sync_controls()
            self._draw(("sites", "heatmap", "distribution"))

    def _on_log_metrics(self) -> None:
        self._draw(("metrics",))  # (the user's scale, every panel's, from here: self.log_y.picked)

    def _on_log_sites(self) -> None:
        self._draw(("sites",))  # (the user's scale from here, until another kind or statistic)

    def _on_sites(self, _change: Any) -> None:
        if self._quiet:
            return
        self._picked_sites = bool(self.sites.value)
        self._draw(("sites",))

    def _act(self, action: str) -> None:
        if self.run is None:
            return
        if action == "pause":
            self.run.pause(wait=False)
        elif action == "resume":
            self.run.resume()
        else:
            self.run.stop(wait=False)
        # (under the draw lock: a status read here before the run ended, drawn after the run's last
        # draw, would leave the header at "stopping" for good)
        with self._draw_lock:
            if not self._closed.is_set():
                self._status()
                self._draw_header()

    def close(self) -> None:
        """Stop following the run (the figures stay as they are). A run that has ended, its end not drawn yet (the
        timer between two looks), has its last steps and how it ended drawn first: a dashboard closed just after
        its watch read ``running`` for good, shown again or not."""
        try:
            if not self._closed.is_set() and self._ended():
                self._last_draw()  # (which stops following)
        except Exception as exc:  # (a store deleted since): it stops following all the same, saying why
            self.header.value += f"<br><b>The dashboard stopped updating:</b> {html.escape(repr(exc))}"
        self._stop_following()

    def _stop_following(self) -> None:
        self._closed.set()
        diagnoses = getattr(self, "diagnoses", None)
        if diagnoses is not None:
            diagnoses.close()
        if self._subscription is not None:
            self._subscription.unsubscribe()
            self._subscription = None

    def _ipython_display_(self) -> None:
        _track_cells(self)  # (its timer stopped once no cell shows it)
        if self._closed.is_set():  # (shown again once stopped: its header says so)
            with self._draw_lock:
                self._draw_header()
        _display(self.widget, f"workbench Dashboard of {self.view.label}: live ipywidgets, shown while the kernel "
                              "that drew them runs; run the cell again to see them.")


class _Compared:
    """One run of a comparison: its views, kept up to date. A live run (a background run or a
    watch) feeds a view of its own through the watch's stream; a stored run is read again when it
    grew or its status changed (``workbench.load_run``), while its writer is at work."""

    def __init__(self, name: str, source: Any) -> None:
        from workbench.experiments.base import BackgroundRun
        from workbench.instrument import Run, Watch
        from workbench.ui.views import RunView

        self.name, self.run, self.watch, self.stored = name, None, None, None
        self._subscription = None
        self._next_read = 0.0  # time.monotonic() before which a stored run is not read again
        if isinstance(source, BackgroundRun):
            self.run, self.watch = source, source.watch
            self.view = RunView(label=name, total=source.total)
            self.view.first_step = source.first_step
        elif isinstance(source, Watch):
            self.watch = source
            self.view = RunView(label=name)
        elif isinstance(source, Run):
            self.stored, self._stored_as = source, ()
            self.read()
        if self.watch is not None:
            self.view.unrecorded = _unrecorded(self.watch)
            self.view.schedule = (self.watch.every, self.watch.start_step)
            self._subscription = _follow(self.watch, self.view.feed)

    def read(self, last: bool = False) -> None:
        """Read a stored run again if it grew or its status changed (as the dashboard does: the
        next read waits three times as long as this one took; ``last``: now); a live run's status."""
        from workbench.instrument import load_run
        from workbench.ui.views import RunView

        if self.stored is not None:
            if not last and time.monotonic() < self._next_read:
                return
            began = time.monotonic()
            run = load_run(self.stored.path) if self._stored_as else self.stored
            now = (len(run.steps), run.status)
            if now != self._stored_as:
                view = RunView.from_run(run)
                view.label = self.name
                self.view, self.stored, self._stored_as = view, run, now
            self._next_read = time.monotonic() + 3 * (time.monotonic() - began)
        elif self.run is not None:
            self.view.set_status(self.run.status, self.run.error)
        else:
            self.view.set_status(self.watch.status, self.watch.error)

    def ended(self) -> bool:
        if self.run is not None:
            return self.run.done
        if self.stored is not None:
            return self.stored.status != "running"
        return self.watch.status != "running"  # (final once the watch's close is done)

    def state(self) -> tuple:
        return self.view.steps_fed, self.view.dropped, self.view.status

    def close(self, flush: bool = False) -> None:
        if self._subscription is not None:
            if flush:
                self._subscription.flush(timeout=5.0)
            self._subscription.unsubscribe()
            self._subscription = None


def _refuse_a_run_twice(sources: list[Any]) -> None:
    """A run given twice to a comparison (the same object, a live run and its store's path, a path written two
    ways) is refused, naming both places: it drew two lines, one over the other, as two runs."""
    from pathlib import Path

    from workbench.instrument import Run

    first: dict[Any, int] = {}
    for i, source in enumerate(sources):
        watch = None if isinstance(source, Run) else getattr(source, "watch", source)  # (a background run's)
        store = source if isinstance(source, Run) else getattr(watch, "store", None)
        key = Path(store.path).resolve() if store is not None else id(watch)
        if key in first:
            where = f" (stored in {store.path})" if store is not None else ""
            raise ValueError(f"Compare: runs {first[key] + 1} and {i + 1} are the same run{where}; compare two or "
                             "more different runs.")
        first[key] = i


class Compare:
    """Two or more runs side by side, live or stored: the Runs tab's comparison of the app in a
    cell. Their metrics (a panel per metric, a line per run) and one call site's statistic (a line
    per run), each run in a colour it keeps while runs are picked and unpicked.

    ::

        gelu = workbench.experiments.create("activation_mlp", activation="gelu").start(300)
        relu = workbench.experiments.create("activation_mlp", activation="relu").start(300)
        Compare(gelu, relu)                               # live: redraws as they train
        Compare("runs/gelu", "runs/relu")                 # stored runs (paths or workbench.load_run(path))
        Compare({"seed 0": run_a, "seed 1": run_b})       # named as you like

    The figures are the app's (:func:`workbench.ui.stored_runs.compare_runs`): the same handler draws
    both. A timer thread looks every ``interval`` seconds and redraws when a run took steps or
    changed its status, until every run has ended. The figures are in tabs, and a redraw sends the
    page the open one, as the Dashboard's (:class:`FigureTabs`): both are drawn when the comparison
    is made (what a saved notebook keeps), a tab when it is opened, and both at the runs' end.

    Args:
        *sources: two or more runs, or one dict of name -> run. A run is a background run
            (``exp.start(...)``), an ``Experiment`` (its run in the background, else its open
            watch), a ``Watch``, a stored ``Run`` or the path of one.
        names: a name per source, in the legend and beside its box (default: the experiment and
            its seed, the watched model's class, the stored run's folder name).
        kind: the kind the per-site figure shows first (``activation``, ``grad_output``, ``param``,
            ``param_grad``).
        statistic: the statistic it shows first (a column of ``workbench.ui.views.STATISTICS``).
        site: the call site it shows first (default: the first run's that changed most). Runs with no
            rows of ``kind`` yet (a comparison made before their first step) keep it and draw it once
            their rows arrive (if they turn out to lack it, the message says so and another is drawn);
            runs that have sites and lack it refuse it.
        smoothing: the metrics' smoothing, in [0, 1).
        log_y: log-scaled y axes, both figures' (both their boxes ticked); None: each figure chooses, as the
            app's comparison and a Dashboard's figures: each metrics panel log where a line's spike flattens the
            rest, the call site's figure log where one run's line dwarfs the others (``figures.dwarfed``), its
            box saying which, until it is set (the call site's: until another kind, statistic or site, where the
            figure chooses again).
        interval: seconds between checks for new steps (> 0).
        tab: the figure open first (``metrics``, ``site``).

    Attributes:
        run_checkboxes: name -> the run's box, ticked while it is compared (untick one to take it out).
        log_y: the metrics tab's "log y" box: ticked while a panel draws log; set, every panel's scale.
        log_site: the call site tab's "log y" box: ticked while its figure draws log; set, its scale (until
            another kind, statistic or site).
        message: what the comparison says (the runs compared, a run that lacks the kind).
        sites: the call sites to choose from (those every run has, in the first run's order).
    """

    def __init__(self, *sources: Any, names: list[str] | None = None, kind: str = "activation",
                 statistic: str = "std", site: str | None = None, smoothing: float = 0.0,
                 log_y: bool | None = None, interval: float = 1.0, tab: str = "metrics") -> None:
        import os

        import ipywidgets as w

        from workbench.experiments.base import BackgroundRun
        from workbench.instrument import Run, Watch

        if len(sources) == 1 and isinstance(sources[0], dict):
            if names is not None:
                raise ValueError("Compare: give the names either as the dict's keys or as names=, not both.")
            names, sources = [str(name) for name in sources[0]], tuple(sources[0].values())
        if len(sources) < 2:
            raise ValueError(f"Compare needs two or more runs, got {len(sources)}: Compare(run_a, run_b), "
                             "Compare('runs/a', 'runs/b') or Compare({'a': run_a, 'b': run_b}).")
        if names is not None and (isinstance(names, str) or len(names) != len(sources)):
            raise ValueError(f"Compare: names must be a list of one name per run ({len(sources)}), got {names!r}.")
        if names is not None and len(set(map(str, names))) != len(names):
            raise ValueError(f"Compare: the names must differ (each names a line and a pick), got {list(names)!r}.")
        check_view_options(interval, kind, statistic, smoothing, log_y)
        if tab not in COMPARE_FIGURES:
            raise ValueError(f"tab must be the figure shown first, one of {COMPARE_FIGURES}, got {tab!r}.")
        resolved, configs = [], []
        for i, source in enumerate(sources):
            configs.append(_config(source))
            label, source = _experiment_source(source, "Compare(run, other)")
            if isinstance(source, (str, os.PathLike)):
                source = _load_stored(source, "Compare({}, other)")  # (a RunError that names the path)
            if not isinstance(source, (BackgroundRun, Watch, Run)):
                raise TypeError(f"Compare: run {i + 1} must be a run started with experiment.start(steps), an "
                                "Experiment, a Watch, a stored Run or its path (workbench.load_run(path)), got "
                                f"{type(source).__name__}." + _not_a_source(source))
            resolved.append((label or _label(source), source))
        _refuse_a_run_twice([source for _, source in resolved])
        if names is None:
            names = _distinct([label for label, _ in resolved], configs)
        self.runs = {str(name): _Compared(str(name), source) for name, (_, source) in zip(names, resolved)}
        self.interval = float(interval)
        self.message = ""
        self.sites: list[str] = []
        self.draws = 0  # how many times the figures were drawn
        self._colors: dict[str, str] = {}  # (run -> its colour in the comparison drawn)
        self._specs: dict[str, dict | None] = dict.fromkeys(COMPARE_FIGURES)  # (drawn by the last refresh)
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._drawn: tuple | None = None
        self._quiet = False
        self._kept_log: dict | None = None  # the scales the figures chose, once settled (stored_runs.compare_page)

        style = {"description_width": "initial"}
        # a box a run: a click takes one run out or puts it back (in a multiple-choice list, a click
        # picked that one run alone, and the comparison went)
        self.run_checkboxes = {name: w.Checkbox(value=True, description=name, indent=False,
                                                layout=w.Layout(width="auto", margin="0 1.5em 0 0"))
                               for name in self.runs}
        self.kind, self.statistic = view_choices(kind, statistic)
        self.site = w.Dropdown(options=[], description="call site", style=style, layout=w.Layout(width="20em"))
        self.smoothing = w.FloatSlider(value=float(smoothing), min=0.0, max=0.99, step=0.01, description="smoothing",
                                       style=style, continuous_update=False)
        self.message_html = w.HTML()
        self.metrics_plot, self.site_plot = w.Output(), w.Output()
        #: What went wrong in a callback (a run ticked, a pick), said under the message (:class:`CallbackErrors`).
        self.errors = CallbackErrors()
        guard = self.errors.guard
        # a "log y" box a figure, in its tab: what it shows is that figure's scale (one box in both tabs was ticked
        # over a linear site figure while a metrics panel drew log). Ticked while its figure chose log; set, the
        # user's scale of that figure (the call site's: until another kind, statistic or site)
        self.log_y = _scale_box()(guard(self._refresh, "the metrics' log y"), picked=log_y is not None,
                                  value=bool(log_y), description="log y", indent=False, layout=w.Layout(width="auto"))
        self.log_site = _scale_box()(guard(self._refresh, "the call site's log y"), picked=log_y is not None,
                                     value=bool(log_y), description="log y", indent=False,
                                     layout=w.Layout(width="auto"))
        for control in (*self.run_checkboxes.values(), self.smoothing):
            # (not gated by _quiet, which is the site list's while _refresh sets it: a box clicked then counts)
            control.observe(guard(lambda _: self._refresh(), f"the {control.description} box"), names="value")
        for control in (self.kind, self.statistic):  # (another kind or statistic: the figure chooses its scale)
            control.observe(guard(lambda _: self._refresh(choose_log=True), f"the {control.description} picked"),
                            names="value")
        self.site.observe(guard(self._on_site, "the call site picked"), names="value")
        # read top-down, as the Dashboard: the runs compared, then a tab a figure, each with the
        # controls of its figure (its own log y). One figure open at a time: the browser redraws only it,
        # however slow
        self._tabs = FigureTabs({
            "metrics": ("metrics", FigureTabs.page([self.smoothing, self.log_y], self.metrics_plot),
                        self.metrics_plot),
            "site": ("call site", FigureTabs.page([self.kind, self.statistic, self.site, self.log_site],
                                                  self.site_plot), self.site_plot),
        }, self._specs.get, self._lock, open=tab)
        self.tabs = self._tabs.widget
        self.widget = w.VBox([
            w.HBox([w.Label("runs", layout=w.Layout(margin="0 1em 0 0")), *self.run_checkboxes.values()],
                   layout=w.Layout(flex_flow="row wrap", align_items="center")),
            self.message_html, self.errors.html, self.tabs,
        ])
        self._wanted_site = site  # the site picked (or given): drawn whenever the runs compared have it
        ended = self._catch_up(first=True)
        # a site is refused where the runs' sites are known; runs with no rows of the kind yet (made
        # before their first step) keep it, drawn once their rows arrive
        if site is not None and self.site.value != site and (self.sites or ended):
            self.close()
            raise ValueError(f"Compare: no call site {site!r} of kind {kind!r} in these runs; " + (
                f"the sites are {self.sites}." if self.sites else
                f"they recorded no {kind} rows: pick a kind they have, or leave site= out."))
        self._timer: threading.Thread | None = None
        if not ended:
            self._timer = threading.Thread(target=self._tick, name="workbench-compare", daemon=True)
            self._timer.start()

    @property
    def following(self) -> bool:
        """Whether the comparison still redraws on its own: a run in it has not ended, and it was not closed
        (false from ``close()`` on)."""
        return not self._closed.is_set() and self._timer is not None and self._timer.is_alive()

    def _view(self, name: str) -> tuple[Any, None, str]:
        """The view of the run ``name``, as :func:`workbench.ui.stored_runs.compare_runs` reads a cache's."""
        compared = self.runs.get(name)
        if compared is None:
            return None, None, f"**No run** `{name}` in this comparison."
        return compared.view, None, ""

    def _ended(self) -> bool:
        return all(compared.ended() for compared in self.runs.values())

    def _state(self) -> tuple:
        return tuple(compared.state() for compared in self.runs.values())

    def _catch_up(self, first: bool = False) -> bool:
        """Redraw if a run took steps or changed its status; once every run has ended, with their
        last steps. Returns whether every run has ended (a run may end while this draws: its last
        steps are then drawn by the next). ``first``: the first draw, of both figures: a saved
        notebook keeps what a cell's run sent (nbclient drops what the timer sends between cells),
        and each tab has its figure."""
        ended = self._ended()
        with self._lock:
            for compared in self.runs.values():
                if ended:
                    compared.close(flush=True)  # (its last steps, before the last draw)
                compared.read(last=ended)
            if first or self._state() != self._drawn:
                self._refresh(every=first)
            if ended:
                self._tabs.draw_stale()  # (each tab shows the end, and a saved notebook keeps it)
        return ended

    def _tick(self) -> None:
        """The timer: redraw when a run took steps or changed its status, until every run ended."""
        while not self._closed.wait(self.interval):
            if self.widget.comm is None:  # (its widget closed: no page shows it)
                self.close()
                return
            try:
                if self._catch_up():
                    return
            except Exception as exc:  # a comparison never takes the training down; it says why it stopped
                self.message_html.value += f"<br><b>The comparison stopped updating:</b> {html.escape(repr(exc))}"
                return

    @property
    def picked(self) -> tuple[str, ...]:
        """The runs compared: those whose box is ticked (``compare.run_checkboxes[name]``), in order."""
        return tuple(name for name, box in self.run_checkboxes.items() if box.value)

    @property
    def open_figure(self) -> str:
        """The figure whose tab is open: ``metrics`` or ``site``."""
        return self._tabs.open

    def refresh(self) -> None:
        """Draw the comparison from what has arrived, both figures included (the timer does this by
        itself, drawing the open figure and the other when it is opened)."""
        self._refresh(every=True)

    def _refresh(self, every: bool = False, choose_log: bool = False) -> None:
        """Draw what arrived: the site choices, the message and the open figure (``every``: both);
        ``choose_log``: the call site's figure chooses its scale again (another kind, statistic or site)."""
        from types import SimpleNamespace

        from workbench.ui.stored_runs import compare_page

        with self._lock:
            self._drawn = self._state()
            site = self._wanted_site if self._wanted_site is not None else self.site.value
            # (one drawing as the app's comparison draws it: the runs' steady colours, each figure's scale chosen
            # until its box is set and kept once settled, for the site drawn, not the one asked)
            metrics, site_fig, choices, site, message, self._colors, boxes, _, self._kept_log = compare_page(
                SimpleNamespace(get=self._view), list(self.picked), self.kind.value, self.statistic.value, site,
                (self.log_y.value, self.log_site.value), self._colors,
                (not self.log_y.picked, not self.log_site.picked), self._kept_log,
                {"site": True} if choose_log else None, self.smoothing.value)
            if choose_log:
                self.log_site.picked = False
            self._specs.update(metrics=metrics, site=site_fig)
            # (each box says whether its figure chose log: a figure not drawn, None, leaves its box as it is)
            for box, log in zip((self.log_y, self.log_site), boxes):
                box.show(log)
            wanted = self._wanted_site
            if wanted is not None and choices and wanted not in choices:  # (a site given before the rows came)
                message += (f"\n\nNo call site {wanted!r} of kind {self.kind.value!r} in these runs: "
                            f"showing {site!r}.")
            self.message, self.sites = message, list(choices)
            self._quiet = True
            try:
                if tuple(choices) != tuple(self.site.options):
                    self.site.options = choices
                if self.site.value != site:
                    self.site.value = site
            finally:
                self._quiet = False
            self._draw_message()
            self._tabs.draw(COMPARE_FIGURES, every=every)
            self.draws += 1

    def _draw_message(self) -> None:
        """The message over the tabs; once stopped while a run goes on, that the figures are no longer live."""
        stopped = self._closed.is_set() and not self._ended()
        self.message_html.value = _html(self.message) + (_no_longer_follows("Compare") if stopped else "")

    def _on_site(self, change: Any) -> None:
        if self._quiet or change["new"] is None:
            return
        self._wanted_site = change["new"]  # (kept through a kind without it, or fewer than two runs picked)
        self._refresh(choose_log=True)

    def figure(self, name: str) -> dict | None:
        """The Plotly figure last drawn (up to date whichever tab is open).

        Args:
            name: ``metrics`` or ``site``.

        Returns:
            Its Plotly spec, as JupyterLab receives it; None while fewer than two runs are picked.

        Raises:
            ValueError: another name.
        """
        if name not in COMPARE_FIGURES:
            raise ValueError(f"figure must be 'metrics' or 'site', got {name!r}.")
        return self._tabs.figure(name)

    def close(self) -> None:
        """Stop following the runs (the figures stay as they are). Runs that have all ended, their end not drawn
        yet (the timer between two looks), have their last steps drawn first, as the dashboard's ``close()``."""
        try:
            if not self._closed.is_set() and self._ended():
                self._catch_up()
        except Exception as exc:  # (a store deleted since): it stops following all the same, saying why
            self.message_html.value += f"<br><b>The comparison stopped updating:</b> {html.escape(repr(exc))}"
        self._closed.set()
        for compared in self.runs.values():
            compared.close()

    def _ipython_display_(self) -> None:
        _track_cells(self)  # (its timer stopped once no cell shows it)
        if self._closed.is_set():  # (shown again once stopped: its message says so)
            with self._lock:
                self._draw_message()
        _display(self.widget, f"workbench Compare of {', '.join(self.runs)}: live ipywidgets, shown while the "
                              "kernel that drew them runs; run the cell again to see them.")
