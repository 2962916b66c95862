"""`memory-service import PATH --agent A [--prune]`: legacy markdown memory into startup records and
memories, kept in step with the files on every import (memory_service/curation/legacy_import.py).

The files are read and checked first (memory_service/curation/legacy_import.py); only then is the
store opened: the configured one, the embedded store a running `serve` owns on the data
directory, or, when none runs, the embedded store started for the time of the command.
The import is audited under the key id ``cli``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from memory_service.cli.common import console, load_settings, with_running_store
from memory_service.config import Settings
from memory_service.curation.legacy_import import ImportPlan, ImportReport, describe, plan_import
from memory_service.domain.errors import MemoryServiceError
from memory_service.domain.secrets import describe as describe_secrets

CLI_KEY_ID = "cli"


def import_command(
    path: Annotated[Path, typer.Argument(help="A markdown file, or a folder: SOUL.md, IDENTITY.md, MEMORY.md and notes (*.md)")],
    agent: Annotated[str, typer.Option("--agent", help="The agent the records and memories are for")],
    user: Annotated[str | None, typer.Option("--user", help="The memories go to this user's namespace "
                                                            "(default: the agent's)")] = None,
    prune: Annotated[bool, typer.Option("--prune", help="A file imported before that is empty now, or missing from "
                                                        "the folder, loses what it gave (default: kept, and said)")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="The embedded store's data directory (when FALKORDB_URL is unset)")] = None,
) -> None:
    """Import legacy markdown memory files, and keep the agent in step with them: SOUL.md and
    IDENTITY.md become P0 startup records, MEMORY.md's rule and behaviour sections P1 and P2
    records, its other items and every note's items searchable memories (docs/startup-records.md).
    Importing again adds what the files gained, replaces what changed and removes what they lost."""
    settings = load_settings()
    try:
        plan = plan_import(path, agent, user, settings, prune=prune)
    except MemoryServiceError as exc:
        console.print(f"[red]cannot import:[/red] {exc}")
        raise typer.Exit(2) from None
    priorities = ", ".join(f"{n} {p}" for p, n in describe(plan.records).items()) or "none"
    skipped = [*plan.skipped, *(f"{s} (empty)" for s in plan.empty)]
    console.print(f"{len(plan.files)} files: {len(plan.records)} startup records ({priorities}), "
                  f"{len(plan.memories)} memories" + (f"; skipped {', '.join(skipped)}" if skipped else ""))
    try:
        report = asyncio.run(_import(with_running_store(settings, data_dir), data_dir, plan))
    except MemoryServiceError as exc:
        console.print(f"[red]import failed:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("what", "added", "replaced", "unchanged", "removed", title=f"Imported {path} for agent {agent}")
    for what, changes in (("startup records", report.records), ("memories", report.memories)):
        table.add_row(what, str(changes.added), str(changes.replaced), str(changes.unchanged), str(changes.removed))
    console.print(table)
    if report.redacted:
        console.print(f"redacted before anything was stored (docs/redaction.md): {describe_secrets(report.redacted)}")
    if report.pruned:
        console.print(f"pruned (empty or missing now, what they gave removed): {', '.join(report.pruned)}")
    if report.kept:
        console.print(f"kept what these files gave before (empty or missing now; --prune removes it): "
                      f"{', '.join(report.kept)}")


async def _import(settings: Settings, data_dir: Path | None, plan: ImportPlan) -> ImportReport:
    from memory_service.runtime import open_service

    async with open_service(settings, data_dir, run_worker=False) as service:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task("importing", total=len(plan.records) + len(plan.memories))

            def on_progress(what: str, done: int) -> None:
                progress.update(task, description=what, advance=done)

            return await service.import_legacy(plan, CLI_KEY_ID, on_progress)
