"""The `shadowpoint` command line: a thin entry point over `Engine` and the sidecar."""

from __future__ import annotations

import argparse
import sys

from shadowpoint import __version__
from shadowpoint.config import load_settings
from shadowpoint.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowpoint", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the sidecar (JSON-RPC 2.0 on stdio)")
    serve.add_argument("--socket", help="serve on this Unix socket instead of stdio")
    args = parser.parse_args(argv)
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format, settings.log_file)
    if args.command == "serve":
        from shadowpoint.shadow_repo import isolate_libgit2
        from shadowpoint.sidecar import serve_socket, serve_stdio

        isolate_libgit2()
        if args.socket:
            return serve_socket(args.socket, settings)
        return serve_stdio(settings)
    return 2


if __name__ == "__main__":
    sys.exit(main())
