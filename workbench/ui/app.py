"""The Gradio workbench: one module per tab, assembled here."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.ui import explorer, model_browser, run_tabs
from workbench.ui.pages import PageHoldings
from workbench.ui.runs import DEFAULT_ROOT, RunManager

__all__ = ["build_app", "launch", "DELETE_CACHE"]

TITLE = "workbench"
#: Gradio's ``delete_cache`` of the app, ``(frequency, age)`` in seconds: every hour, the files of Gradio's cache
#: that the app's components hold (a checkpoint uploaded, an export offered for download) and that
#: are older than a day are deleted (all of them when the server stops). Without it they stayed until the machine's
#: temporary directory was cleaned. A day: an upload a page still shows can start runs for that long.
DELETE_CACHE = (3600, 86400)


def build_app(runs_root: str | Path = DEFAULT_ROOT, manager: RunManager | None = None,
              delete_cache: tuple[int, int] | None = DELETE_CACHE):
    """Assemble the Blocks app (not launched).

    Args:
        runs_root: the one directory runs are listed, opened and recorded under
            (default ``runs`` in the working directory; created when the first run is recorded).
        manager: the run manager owning the app's live runs; by default a new one over ``runs_root``.
            It is the app's ``run_manager`` attribute: ``app.run_manager.close()`` stops its runs.
        delete_cache: ``(frequency, age)`` in seconds, Gradio's ``gr.Blocks(delete_cache=...)``: every
            ``frequency`` seconds, the cached files (uploads, exports) older than ``age`` go (default
            :data:`DELETE_CACHE`; ``(1, 1)`` is the shortest Gradio runs; None: never deleted, not even when the
            server stops).

    What each open page holds that goes when it closes (:class:`~workbench.ui.pages.PageHoldings`) is the app's
    ``page_holdings`` attribute.
    """
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    manager = manager if manager is not None else RunManager(runs_root)
    # what each page holds (a comparison's runs, an export's files), let go of when the page closes: Gradio deletes
    # a closed tab's state an hour later, and never the files a handler wrote
    holdings = PageHoldings()
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=delete_cache) as app:
        gr.Markdown("# workbench\nPick a module, configure it, run it on a built-in task and watch "
                    "its activations and gradients.")
        with gr.Tabs():
            with gr.Tab("Models", id="models"):
                model_browser.wire(model_browser.layout())
            explorer.wire(explorer.layout(manager.root), app, holdings)
            run_tabs.wire(run_tabs.layout(manager.root), manager, app, holdings)

        def on_page_closed(request):
            holdings.end(request.session_hash)

        on_page_closed.__annotations__["request"] = gr.Request  # (Gradio passes the page's request by it)
        app.unload(on_page_closed)
        app.load(None, js=LET_GO_OF_DROPPED_PLOTS)
        app.load(None, js=run_tabs.PICK_TITLES)
    _one_render_at_a_time(app)
    app.run_manager = manager
    app.page_holdings = holdings
    app.workbench_css = run_tabs.CSS  # Gradio takes CSS at launch: launch(css=app.workbench_css)
    app.workbench_i18n = gr.I18n(**I18N)  # and translations: launch(i18n=app.workbench_i18n)
    return app


#: Texts Gradio's page lacks (Gradio 6.31), by locale. After each event the page tells screen readers that
#: it is complete by its text ``common.complete``, which Gradio's English has not: "common.complete" is read
#: out (and shows wherever the page's screen-reader-only text does: a copy of the page's text, a page
#: without Gradio's CSS).
I18N = {"en": {"common.complete": "Complete"}}

#: Gradio's Plot draws each new figure into a new element and drops the old one without
#: ``Plotly.purge``; the old plot's window resize listener (Plotly's, for ``responsive``) keeps it
#: alive: a page watching a live run grew by about 1,000 DOM nodes and 5 MB of heap a minute. The
#: page takes that listener off each plot as it leaves the document (Plotly's own ``purge`` there
#: would also break the redraw still under way on it). bench/dashboard.py part 4 measures it.
LET_GO_OF_DROPPED_PLOTS = """() => {
  if (window.workbenchPlotReleaser) return;
  const release = (plot) => {
    if (!plot.isConnected && plot._responsiveChartHandler) {
      window.removeEventListener("resize", plot._responsiveChartHandler);
      delete plot._responsiveChartHandler;
    }
  };
  window.workbenchPlotReleaser = new MutationObserver((mutations) => {
    for (const mutation of mutations) {
      for (const node of mutation.removedNodes) {
        if (node.nodeType !== Node.ELEMENT_NODE) continue;
        const plots = node.classList.contains("js-plotly-plot") ? [node] : node.querySelectorAll(".js-plotly-plot");
        // (again a while later: a plot dropped during its first draw gets its listener at that draw's end)
        plots.forEach((plot) => { release(plot); setTimeout(() => release(plot), 5000); });
      }
    }
  });
  window.workbenchPlotReleaser.observe(document.body, {childList: true, subtree: true});
}"""


def _one_render_at_a_time(app) -> None:
    """Run the tabs' ``gr.render`` functions one at a time. A page load fires every render (the
    Models and the Experiments forms); run at once, they share the session's blocks and one of them
    fails ("dictionary changed size during iteration", gradio-app/gradio#9991), leaving that tab
    without its form. Gradio's own workaround: one concurrency group of limit 1 for the renders."""
    for fn in app.fns.values():
        if getattr(fn, "renderable", None) is not None:
            fn.concurrency_id, fn.concurrency_limit = "workbench-render", 1


def launch(host: str = "127.0.0.1", port: int = 7860, share: bool = False, runs_root: str | Path = DEFAULT_ROOT,
           delete_cache: tuple[int, int] | None = DELETE_CACHE, **kwargs):
    """Build and serve the app (``delete_cache``: :func:`build_app`'s); blocks until interrupted unless
    ``prevent_thread_lock`` (then the runs still in progress are stopped, their stores marked stopped)."""
    app = build_app(runs_root, delete_cache=delete_cache)
    app.queue()
    kwargs.setdefault("css", app.workbench_css)
    kwargs.setdefault("i18n", app.workbench_i18n)
    app.launch(server_name=host, server_port=port, share=share, **kwargs)
    if not kwargs.get("prevent_thread_lock"):
        app.run_manager.close()
    return app
