"""python app.py  ->  the Gradio workbench on http://127.0.0.1:7860"""

import argparse
import errno
import os
import socket

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def unservable(host: str, port: int) -> str | None:
    """Why the app cannot serve on ``host:port``, or None when it can.

    Checked before the app is built, so that a port already taken (a second ``python app.py``) is one line
    naming the port and the flag to change, not Gradio's traceback, whose advice (``GRADIO_SERVER_PORT``)
    does not apply to a port given on the command line.
    """
    if not 1 <= port <= 65535:
        return f"--port must be a port number in [1, 65535], got {port}."
    # (an IPv6 address as a browser writes it, "[::1]": Gradio takes the brackets off and serves there)
    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
            # (as the server binds: a port a closed server left in TIME_WAIT is free, one listened on is not)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (f"port {port} on {host} is in use (another server, or the app already running there): "
                    f"pass a free one, e.g. --port {port + 1 if port < 65535 else 7861}.")
        if exc.errno == errno.EACCES:
            return f"cannot serve on port {port}: {exc.strerror}. Ports below 1024 need root; pass e.g. --port 7860."
        return (f"cannot serve on {host}:{port}: {exc.strerror or exc}. Pass --host 127.0.0.1 (this machine), "
                "0.0.0.0 (every interface) or another address of this machine.")
    return None


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
    problem = unservable(args.host, args.port)
    if problem is not None:
        parser.error(problem)
    launch(host=args.host, port=args.port, share=args.share, runs_root=args.runs_root)


if __name__ == "__main__":
    main()
