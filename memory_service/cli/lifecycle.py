"""`memory-service forget` and `memory-service reform`: forgetting a memory with everything
formed from it (docs/forget.md) and re-forming formed windows with the extractor configured
now (docs/reform.md), in this process, on the configured stores or the embedded one a
`serve` runs. Both are resumable: the same command again finishes what a crash left.
Audited under the actor ``forget`` / ``reform`` (no API key asked)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from memory_service.cli.common import attached_settings, console
from memory_service.config import Settings
from memory_service.domain.errors import MemoryServiceError
from memory_service.schemas.lifecycle import ForgetMode, ForgetReport, ReformIn, ReformReport

DataDir = Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")]


def forget_command(
    agent: Annotated[str, typer.Option("--agent", help="The agent whose memory it is")],
    memory_id: Annotated[str | None, typer.Argument(help="The memory's id (a message's too: its memory id)")] = None,
    hard: Annotated[bool, typer.Option("--hard", help="Gone for good, as an erasure is (default: soft, undoable)")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Finish the agent's forgets a crash left, and nothing else")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
    data_dir: DataDir = None,
) -> None:
    """Forget a message or a memory with everything formed from it: its window re-formed from
    the other messages, consolidated versions that merged it, graph facts from it, cached blocks.

    Soft (the default) is undone by `POST .../memories/{id}/undelete`; `--hard` deletes it for
    good (the stores, the ledger, the events naming it, the store's query log and files).
    """
    if (memory_id is None) == (not resume):
        console.print("[red]give a memory id, or --resume[/red]")
        raise typer.Exit(2)
    settings = attached_settings(data_dir)
    try:
        reports = asyncio.run(_forget(settings, agent, memory_id, ForgetMode.HARD if hard else ForgetMode.SOFT))
    except MemoryServiceError as exc:
        console.print(f"[red]forget failed:[/red] {exc}")
        raise typer.Exit(2) from None
    for report in reports:
        if as_json:
            print(report.model_dump_json())
            continue
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(report.memories.items()))
        console.print(f"forgot {report.id} ({report.mode.value}): {kinds}; {len(report.reformed)} window(s) re-formed, "
                      f"{len(report.facts)} fact(s), {report.cached_blocks} cached block(s)"
                      + (" (undo: POST .../undelete)" if report.undoable else ""))
    if resume and not reports and not as_json:
        console.print("nothing to finish")


async def _forget(settings: Settings, agent: str, memory_id: str | None, mode: ForgetMode) -> list[ForgetReport]:
    from memory_service.runtime import open_service

    async with open_service(settings, run_worker=False) as service:
        if memory_id is None:
            return await service.resume_forgets(agent)
        return [await service.memory_forget(agent, memory_id, mode)]


def reform_command(
    agent: Annotated[str, typer.Option("--agent", help="The agent whose windows are re-formed")],
    user: Annotated[str | None, typer.Option("--user", help="Only the sessions this user took part in")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only this session")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only windows formed since this date or time "
                                                            "(2026-06-01, or 2026-06-01T12:00:00Z)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count the windows and extractor calls; change nothing")] = False,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Resume this run (its windows re-formed are skipped)")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many windows now", min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
    data_dir: DataDir = None,
) -> None:
    """Re-form already formed windows with the extractor configured now (EXTRACTOR, LLM_*).

    Each window's memories from its old extraction are replaced by the new ones in one step;
    memories written by hand or by tools are never touched. Resumable: run it again with the
    run id it prints, and it skips the windows it re-formed.
    """
    from memory_service.curation.reformation import parse_since

    try:
        ask = ReformIn(user_id=user, session_id=session, since=parse_since(since) if since else None,
                       dry_run=dry_run, run_id=run_id, limit=limit)
    except (ValidationError, MemoryServiceError) as exc:
        console.print(f"[red]bad arguments:[/red] {exc}")
        raise typer.Exit(2) from None
    settings = attached_settings(data_dir)
    try:
        report = asyncio.run(_reform(settings, agent, ask, quiet=as_json))
    except MemoryServiceError as exc:
        console.print(f"[red]reform failed:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(report.model_dump_json())
        return
    if report.dry_run:
        console.print(f"would re-form {report.windows - report.skipped} window(s) of {report.sessions} session(s) "
                      f"with the {report.extractor} extractor: {report.llm_calls} LLM call(s)")
        return
    console.print(f"run {report.run_id}: {report.reformed} window(s) re-formed with the {report.extractor} extractor "
                  f"({report.memories_removed} memories replaced by {report.memories_formed}, {report.llm_calls} "
                  f"LLM call(s)); {report.skipped} skipped")
    if not report.done:
        console.print(f"not done: run again with --run-id {report.run_id}")
        raise typer.Exit(1)


async def _reform(settings: Settings, agent: str, ask: ReformIn, quiet: bool) -> ReformReport:
    from rich.progress import Progress

    from memory_service.runtime import open_service

    async with open_service(settings, run_worker=False) as service:
        with Progress(console=console, transient=True, disable=quiet) as progress:
            task = progress.add_task("re-forming", total=None)

            def on_progress(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total, description=f"{done}/{total} windows")

            return await service.reform(agent, ask, on_progress)
