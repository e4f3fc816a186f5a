"""python app.py  ->  the Gradio workbench on http://127.0.0.1:7860"""

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Serve the workbench Gradio app.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1; 0.0.0.0 exposes it to your network)")
    parser.add_argument("--port", type=int, default=7860, help="port to serve on (default 7860)")
    parser.add_argument("--share", action="store_true", help="also create a public Gradio share link")
    parser.add_argument("--runs-root", default="runs", metavar="DIR",
                        help="the one directory the app lists, opens and records runs under "
                             "(default: runs in the working directory; created when needed)")
    args = parser.parse_args(argv)

    from workbench.ui.app import launch
    from workbench.ui.runs import RunsRoot

    try:
        RunsRoot(args.runs_root)
    except ValueError as exc:
        parser.error(str(exc))
    launch(host=args.host, port=args.port, share=args.share, runs_root=args.runs_root)


if __name__ == "__main__":
    main()
