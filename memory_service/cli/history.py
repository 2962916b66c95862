"""`memory-service import-history FILE.jsonl`: a conversation history into the service,
through the batch route (POST /v1/agents/{agent_id}/messages/batch), as any client would.

A new customer's first step is importing what their agents already said. The file holds
one message a line, in each session's order:

    {"agent_id": "travel", "user_id": "alice", "session_id": "s1", "role": "user",
     "content": "I prefer aisle seats.", "created_at": "2025-03-01T09:00:00Z", "message_id": "m1"}

Lines are sent in batches (``--batch-size`` messages, at most ``--batch-bytes`` of JSON,
one agent per batch), one batch at a time, so each session's messages are recorded in the
file's order. Resumable: a message is recognised by its ``message_id``, so running the
command again answers what was recorded as duplicates and records the rest. A line
without ``message_id`` gets one derived from its session, role, user, time and content
(and how often that same line came before in the file), the same on every run.

Exit status: 0 when every line is recorded or was before; 1 when some were refused (each
printed with its line number and why: fix them and run again) or failed (an outage: run
again); 2 when the file cannot be read or the API refuses the call itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from memory_service.cli.common import console
from memory_service.domain.errors import InvalidInput
from memory_service.domain.namespaces import validate_id

SHOWN_PROBLEMS = 20
# A batch answered with one of these is refused whole (its lines counted so), and the import
# goes on: 403 (the key may write none of its messages), 413 (a line too large for a batch),
# 422 (the agent id of its lines). Any other error stops it (a key refused, a server gone).
REFUSED_WHOLE = (403, 413, 422)


@dataclass
class _Batch:
    agent_id: str
    items: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    size: int = 0


@dataclass
class ImportCounts:
    recorded: int = 0
    duplicate: int = 0
    refused: int = 0
    failed: int = 0
    problems: list[str] = field(default_factory=list)

    def refuse(self, line: int, why: str, status: str = "refused") -> None:
        setattr(self, status, getattr(self, status) + 1)
        if len(self.problems) < SHOWN_PROBLEMS:
            self.problems.append(f"line {line}: {status}: {why}")

    def describe(self) -> str:
        return (f"{self.recorded} recorded, {self.duplicate} duplicate (recorded before), "
                f"{self.refused} refused, {self.failed} failed")


def derived_message_id(item: dict[str, Any], seen: Counter[str]) -> str:
    """A line's message id when it names none: the same line gets the same id on every run
    (its n-th repetition in the file the n-th id)."""
    key = json.dumps([item.get(k) for k in ("session_id", "role", "user_id", "created_at", "content")],
                     ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    seen[digest] += 1
    return f"h{digest}-{seen[digest]}"


def import_history_command(
    file: Annotated[Path, typer.Argument(help="A JSON Lines file: one message a line (agent_id, user_id, session_id, "
                                              "role, content, created_at, message_id)", exists=True, dir_okay=False)],
    api: Annotated[str, typer.Option("--api", help="The memory-service API")] = "http://127.0.0.1:8080",
    key: Annotated[str | None, typer.Option("--key", envvar="MEMORY_SERVICE_API_KEY", show_envvar=True,
                                            help="API key (write on the agents of the file)")] = None,
    batch_size: Annotated[int, typer.Option(help="Messages per request (at most the server's MAX_BATCH_MESSAGES)",
                                            min=1)] = 500,
    batch_bytes: Annotated[int, typer.Option(help="Bytes of JSON per request, about (below the server's "
                                                  "MAX_BATCH_BYTES)", min=1024)] = 4_000_000,
) -> None:
    """Import a conversation history (JSON Lines, one message a line) through the batch
    route, with progress. Resumable: run it again and what was recorded is skipped as
    duplicates."""
    from memory_service.client.errors import MemoryApiError

    try:
        counts = asyncio.run(import_history(file, api, key, batch_size, batch_bytes))
    except MemoryApiError as exc:
        console.print(f"[red]import stopped:[/red] {exc}; run the command again to go on (what was recorded is skipped)")
        raise typer.Exit(2) from None
    except OSError as exc:
        console.print(f"[red]cannot read {file}:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"{file}: {counts.describe()}")
    for problem in counts.problems:
        console.print(f"  {problem}")
    shown = len(counts.problems)
    if counts.refused + counts.failed > shown:
        console.print(f"  and {counts.refused + counts.failed - shown} more")
    if counts.failed:
        console.print("failed messages met an outage: run the command again to record them")
    if counts.refused or counts.failed:
        raise typer.Exit(1)


async def import_history(file: Path, api: str, key: str | None, batch_size: int, batch_bytes: int,
                         show_progress: bool = True) -> ImportCounts:
    """Send ``file``'s lines in batches; the counts of what became of them."""
    from memory_service.client import AsyncMemoryClient
    from memory_service.client.errors import MemoryApiError

    counts = ImportCounts()
    seen: Counter[str] = Counter()
    async with AsyncMemoryClient(api, key, timeout=300) as client:
        with file.open("rb") as handle, Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                console=console, transient=True, disable=not show_progress) as progress:
            task = progress.add_task("importing", total=file.stat().st_size)

            async def send(batch: _Batch) -> None:
                try:
                    answer = await client.record_batch(batch.agent_id, batch.items)
                except MemoryApiError as exc:
                    if exc.status not in REFUSED_WHOLE:
                        raise
                    for line in batch.lines:  # e.g. a key that may write none of them: the next batch may do
                        counts.refuse(line, f"{exc.status}: {exc.detail}")
                    return
                for item in answer.items:
                    line = batch.lines[item.index]
                    if item.status in ("recorded", "duplicate"):
                        setattr(counts, item.status, getattr(counts, item.status) + 1)
                    else:
                        counts.refuse(line, f"{item.code}: {item.detail}", item.status)
                progress.update(task, completed=handle.tell(), description=counts.describe())

            batch: _Batch | None = None
            for number, item, agent_id in _lines(handle, counts, seen):
                size = len(json.dumps(item, ensure_ascii=False)) + 2
                if batch is not None and (batch.agent_id != agent_id or len(batch.items) >= batch_size
                                          or batch.size + size > batch_bytes):
                    await send(batch)
                    batch = None
                batch = batch or _Batch(agent_id)
                batch.items.append(item)
                batch.lines.append(number)
                batch.size += size
            if batch is not None:
                await send(batch)
    return counts


def _lines(handle: BinaryIO, counts: ImportCounts, seen: Counter[str]) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(line number, item without its agent, agent id) for each line that is a message
    object naming its agent; the others are counted refused here."""
    for number, raw in enumerate(handle, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            counts.refuse(number, f"not a JSON line ({exc})")
            continue
        if not isinstance(line, dict):
            counts.refuse(number, "not a JSON object")
            continue
        agent_id = line.pop("agent_id", None)
        if not isinstance(agent_id, str):
            counts.refuse(number, "no agent_id")
            continue
        try:
            validate_id(agent_id, "agent_id")
        except InvalidInput as exc:
            counts.refuse(number, str(exc))
            continue
        if line.get("message_id") is None:
            line["message_id"] = derived_message_id(line, seen)
        yield number, line, agent_id
