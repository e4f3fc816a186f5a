"""The Gradio workbench: one module per tab, assembled here."""

from __future__ import annotations

import os

from workbench.ui import live, model_browser

__all__ = ["build_app", "launch"]

TITLE = "workbench"


def build_app():
    """Assemble the Blocks app (not launched)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    with gr.Blocks(title=TITLE, analytics_enabled=False) as app:
        gr.Markdown("# workbench\nPick a module, configure it, run it on a built-in task and watch "
                    "its activations and gradients.")
        with gr.Tabs():
            with gr.Tab("Models", id="models"):
                model_browser.wire(model_browser.layout())
            live.wire(live.layout())
    return app


def launch(host: str = "127.0.0.1", port: int = 7860, share: bool = False, **kwargs):
    """Build and serve the app; blocks until interrupted unless ``prevent_thread_lock``."""
    app = build_app()
    app.queue()
    app.launch(server_name=host, server_port=port, share=share, **kwargs)
    return app
