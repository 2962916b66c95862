"""What the `memory-service` commands share: the console they print to and the settings
they run with (memory_service/cli/main.py and the subcommand modules imports.py, keys.py,
outbox.py, mcp.py).

It lives apart from main.py so that the imports run one way: main.py imports the subcommand
modules to register them, and they import this module, never main.py back.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from memory_service.config import Settings
from memory_service.domain.errors import MemoryServiceError

console = Console()


def load_settings() -> Settings:
    """The settings from the environment; a clear message and exit status 2 when they are invalid."""
    try:
        return Settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {exc}")
        raise typer.Exit(2) from None


def with_running_store(settings: Settings, data_dir: Path | None) -> Settings:
    """The configured stores, or the embedded store a running `serve` owns on the data
    directory; unchanged (no store) when neither is there."""
    from memory_service.backends.embedded import EmbeddedFalkorDB

    if settings.falkordb_url is None:
        url = EmbeddedFalkorDB.running_url(data_dir or settings.memory_data_dir)
        if url is not None:
            settings = settings.model_copy(update={"falkordb_url": url})
    return settings


def attached_settings(data_dir: Path | None) -> Settings:
    """Settings whose stores are the configured ones or the embedded store a `serve` runs."""
    from memory_service.backends.embedded import EmbeddedFalkorDB

    settings = load_settings()
    if not settings.falkordb_url:
        data_dir = data_dir or settings.memory_data_dir
        try:
            url = EmbeddedFalkorDB.running_url(data_dir)
        except MemoryServiceError as exc:
            console.print(f"[red]cannot attach:[/red] {exc}")
            raise typer.Exit(2) from None
        if url is None:
            console.print(f"[red]no store to work on:[/red] FALKORDB_URL is not set and no `memory-service serve` "
                          f"runs on {Path(data_dir).resolve()}; start one (with --no-worker to scale workers "
                          "separately) or set FALKORDB_URL and REDIS_URL")
            raise typer.Exit(2)
        settings.falkordb_url = url
    return settings
