"""The `memory-service` command line. The entry point is ``main`` here, not the typer app of
memory_service/cli/main.py, because `pip install memory-service` installs the client alone:
without the server's dependencies the command says in one line what to install, where
importing the app would end in a traceback about some missing module."""

from __future__ import annotations

import sys

SERVER_EXTRA = "memory-service[server]"


def main() -> None:
    try:
        from memory_service.cli.main import app
    except ModuleNotFoundError as missing:
        package = (missing.name or "").partition(".")[0]
        if package in ("", "memory_service"):  # a module of our own missing is a bug: show it
            raise
        sys.exit(f"memory-service: the command needs the server, which is not installed (no module {package!r}): "
                 f"pip install '{SERVER_EXTRA}'")
    app()
