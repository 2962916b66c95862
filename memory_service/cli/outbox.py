"""`memory-service outbox ...`: inspect the outbox's dead letters, replay or drop them.

Only Redis is needed (the outbox lives there): no store is contacted, so these work while
MongoDB or the graph is down. Replayed entries are delivered by the running service's
drain loop, at the end of their target's queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from memory_service.backends.outbox import TARGETS, Outbox
from memory_service.cli.common import attached_settings, console

T = TypeVar("T")

outbox_app = typer.Typer(help="Inspect, replay or drop the outbox's dead letters.", no_args_is_help=True)

Target = Annotated[str, typer.Option("--target", help="The store the entries were for: graph or mongo")]
DataDir = Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")]
Ids = Annotated[list[str] | None, typer.Option("--id", help="A dead letter's id (repeat for several)")]


def _run(data_dir: Path | None, target: str, work: Callable[[Outbox], Awaitable[T]]) -> T:
    from memory_service.state.pools import redis_client

    if target not in TARGETS:
        console.print(f"[red]unknown target {target!r}[/red]; targets: {', '.join(TARGETS)}")
        raise typer.Exit(2)
    settings = attached_settings(data_dir)

    url = settings.redis_url or settings.falkordb_url
    assert url is not None  # attached_settings exits when there is no store

    async def main() -> T:
        redis = redis_client(url, settings)
        try:
            return await work(Outbox(redis, TARGETS, max_attempts=settings.outbox_max_attempts,
                                     alarm_pending=settings.outbox_alarm_pending, max_pending=settings.outbox_max_pending))
        finally:
            await redis.aclose()

    return asyncio.run(main())


async def _all_ids(outbox: Outbox, target: str) -> list[str]:
    return [d.entry_id for d in await outbox.dead_letters(target, limit=1_000_000)]


@outbox_app.command("dead")
def dead(target: Target = "mongo", limit: Annotated[int, typer.Option(min=1)] = 100, data_dir: DataDir = None,
         as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, with the operation")] = False,
         ) -> None:
    """List the oldest dead letters of a target: id, when, attempts, the last error."""
    letters = _run(data_dir, target, lambda outbox: outbox.dead_letters(target, limit))
    if as_json:
        for d in letters:
            print(json.dumps({"id": d.entry_id, "target": d.target, "dead_at": d.dead_at, "attempts": d.attempts,
                              "error": d.error, "op": json.loads(d.op) if d.op else None}))
        return
    table = Table("id", "dead since (UTC)", "attempts", "operation", "last error", title=f"dead letters for {target}")
    for d in letters:
        op = json.loads(d.op).get("op", "write") if d.op.startswith("{") else ("write" if d.op else "(missing)")
        when = datetime.fromtimestamp(d.dead_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(d.entry_id, when, str(d.attempts), op, d.error[:200])
    console.print(table)
    console.print(f"{len(letters)} shown. Replay: memory-service outbox replay --target {target} --id ID (or --all)")


@outbox_app.command("replay")
def replay(target: Target = "mongo", ids: Ids = None, all_: Annotated[bool, typer.Option("--all")] = False,
           data_dir: DataDir = None) -> None:
    """Queue dead letters for their target again (at the end of its queue, attempts reset)."""
    if not ids and not all_:
        console.print("[red]name dead letters with --id, or give --all[/red]")
        raise typer.Exit(2)

    async def work(outbox: Outbox) -> int:
        return await outbox.replay(target, ids or await _all_ids(outbox, target))

    console.print(f"{_run(data_dir, target, work)} dead letter(s) queued again for {target}.")


@outbox_app.command("drop")
def drop(target: Target = "mongo", ids: Ids = None, all_: Annotated[bool, typer.Option("--all")] = False,
         data_dir: DataDir = None) -> None:
    """Give dead letters up for good: the target never gets them."""
    if not ids and not all_:
        console.print("[red]name dead letters with --id, or give --all[/red]")
        raise typer.Exit(2)

    async def work(outbox: Outbox) -> int:
        return await outbox.drop(target, ids or await _all_ids(outbox, target))

    console.print(f"{_run(data_dir, target, work)} dead letter(s) dropped for {target}.")
