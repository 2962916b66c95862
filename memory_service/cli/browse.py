"""`memory-service memories list|show` and `sessions list|show`: browse what a running
service holds, as tables (or JSON lines with --json).

A client of the HTTP API (the typed client, memory_service/client), like `memory-service
mcp`: the API key in use decides what is shown (a key limited to some users sees theirs),
exactly as for any other caller. `list` shows one page and the cursor of the next (pass it
back with --cursor), or every page with --all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any, TypeVar

import httpx
import typer
from pydantic import BaseModel
from rich.table import Table

from memory_service.cli.common import console
from memory_service.client import MemoryApiError, MemoryClient

T = TypeVar("T")

memories_app = typer.Typer(help="Browse an agent's memories (through the HTTP API).", no_args_is_help=True)
sessions_app = typer.Typer(help="Browse an agent's sessions (through the HTTP API).", no_args_is_help=True)

Api = Annotated[str, typer.Option("--api", help="The memory-service API, e.g. http://127.0.0.1:8080")]
Key = Annotated[str | None, typer.Option("--key", envvar="MEMORY_SERVICE_API_KEY", show_envvar=True,
                                        help="API key to call with (none: a keyless loopback server)")]
Agent = Annotated[str, typer.Option("--agent", help="The agent")]
Limit = Annotated[int, typer.Option("--limit", min=1, max=200, help="Items per page")]
Cursor = Annotated[str | None, typer.Option("--cursor", help="The `next` of the previous page")]
Every = Annotated[bool, typer.Option("--all", help="Every page, not only the first")]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table")]
DEFAULT_API = "http://127.0.0.1:8080"
CONTENT_CHARS = 80


@contextmanager
def _client(api: str, key: str | None) -> Iterator[MemoryClient]:
    """The client; an API error or an unreachable server ends the command with its reason."""
    if not api.startswith(("http://", "https://")):
        console.print(f"[red]--api must be an http:// or https:// URL, not {api!r}[/red]")
        raise typer.Exit(2)
    try:
        with MemoryClient(api, key or None) as client:
            yield client
    except MemoryApiError as exc:
        console.print(f"[red]{exc.status}:[/red] {exc.detail}")
        raise typer.Exit(1) from None
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach {api}:[/red] {exc}")
        raise typer.Exit(2) from None


def _pages(fetch: Callable[[str | None], tuple[list[T], str | None]], cursor: str | None,
           every: bool) -> tuple[list[T], str | None]:
    """The items of one page (or, with ``every``, of all the pages from ``cursor`` on) and the next cursor."""
    items: list[T] = []
    while True:
        page, cursor = fetch(cursor)
        items += page
        if not every or cursor is None:
            return items, cursor


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _short(text: str, chars: int = CONTENT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _print_json(items: list[BaseModel]) -> None:
    for item in items:
        print(item.model_dump_json())


def _footer(shown: int, cursor: str | None) -> None:
    if cursor is not None:
        console.print(f"{shown} shown; more with [bold]--cursor {cursor}[/bold] (or --all)")
    else:
        console.print(f"{shown} shown; no more")


@memories_app.command("list")
def list_memories(
    agent: Agent,
    user: Annotated[str | None, typer.Option("--user", help="Only this user's namespace")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only this session's namespace")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", help="Only this namespace")] = None,
    kind: Annotated[list[str] | None, typer.Option("--kind", help="Only this kind (repeat for several)")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Only memories with this tag (repeat: all of them)")] = None,
    since: Annotated[datetime | None, typer.Option("--since", help="valid_at at or after")] = None,
    until: Annotated[datetime | None, typer.Option("--until", help="valid_at at or before")] = None,
    state: Annotated[str, typer.Option("--state", help="live, deleted, evicted or all")] = "live",
    limit: Limit = 20, cursor: Cursor = None, every: Every = False, as_json: AsJson = False,
    api: Api = DEFAULT_API, key: Key = None,
) -> None:
    """The agent's memories, newest first, filtered."""
    with _client(api, key) as client:
        def fetch(at: str | None) -> tuple[list[Any], str | None]:
            page = client.list_memories(agent, namespace=namespace, user_id=user, session_id=session,
                                        kinds=kind or (), tags=tag or (), since=since, until=until, state=state,
                                        cursor=at, limit=limit)
            return list(page.memories), page.next

        memories, after = _pages(fetch, cursor, every)
    if as_json:
        _print_json(memories)
        return
    table = Table(title=f"memories of {agent}")
    for column in ("id", "kind", "namespace", "valid at", "content", "tags", "reads", "deleted"):
        table.add_column(column, overflow="fold" if column == "id" else "ellipsis")
    for m in memories:
        table.add_row(m.id, m.kind.value, m.namespace, _when(m.valid_at), _short(m.content), ", ".join(m.tags),
                      str(m.access_count), _when(m.deleted_at))
    console.print(table)
    _footer(len(memories), after)


@memories_app.command("show")
def show_memory(
    memory_id: Annotated[str, typer.Argument(help="The memory's id")],
    agent: Agent, as_json: AsJson = False, api: Api = DEFAULT_API, key: Key = None,
) -> None:
    """One memory: its fields, the messages it was formed from, the window and extractor that
    formed it, its access count and its history (audit entries). Counts no access."""
    with _client(api, key) as client:
        detail = client.memory_detail(agent, memory_id)
    if as_json:
        print(detail.model_dump_json(indent=2))
        return
    m = detail.memory
    fields = Table(title=f"memory {m.id}", show_header=False)
    fields.add_column("field", style="bold")
    fields.add_column("value", overflow="fold")
    window = detail.window
    for name, value in (
        ("kind", m.kind.value), ("namespace", m.namespace), ("content", m.content), ("title", m.title or ""),
        ("tags", ", ".join(m.tags)), ("confidence", "" if m.confidence is None else str(m.confidence)),
        ("valid at", _when(m.valid_at)), ("updated at", _when(m.updated_at)), ("deleted at", _when(m.deleted_at)),
        ("purge at", _when(m.purge_at)), ("session", m.provenance.session_id or ""),
        ("message ids", ", ".join(m.provenance.message_ids)),
        ("window", f"{window.window} (messages {window.first_sequence}-{window.last_sequence}, formed "
                   f"{_when(window.formed_at)})" if window else ""),
        ("extractor", window.extractor if window else ""),
        ("reads", f"{m.access_count} (last {_when(m.last_accessed_at) or 'never'})"),
    ):
        fields.add_row(name, value)
    console.print(fields)
    if detail.messages:
        messages = Table(title="formed from")
        for column in ("seq", "role", "user", "said at", "content"):
            messages.add_column(column)
        for msg in detail.messages:
            messages.add_row(str(msg.provenance.sequence), msg.provenance.role.value if msg.provenance.role else "",
                             msg.provenance.user_id or "", _when(msg.valid_at), _short(msg.content, 100))
        console.print(messages)
    history = Table(title="history" + ("" if detail.history_complete else " (older entries may be missing)"))
    for column in ("at", "action", "key", "after"):
        history.add_column(column, overflow="fold")
    for entry in detail.history:
        history.add_row(_when(entry.at), entry.action, entry.key_id, _short(json.dumps(entry.after), 100))
    console.print(history if detail.history else "history: no audit entries (formation is not audited)")


@sessions_app.command("list")
def list_sessions(
    agent: Agent,
    user: Annotated[str | None, typer.Option("--user", help="Only the sessions this user took part in")] = None,
    limit: Limit = 20, cursor: Cursor = None, every: Every = False, as_json: AsJson = False,
    api: Api = DEFAULT_API, key: Key = None,
) -> None:
    """The agent's sessions, newest first, with their formation gate, cursor and pending window."""
    with _client(api, key) as client:
        def fetch(at: str | None) -> tuple[list[Any], str | None]:
            page = client.list_sessions(agent, user_id=user, cursor=at, limit=limit)
            return list(page.sessions), page.next

        sessions, after = _pages(fetch, cursor, every)
    if as_json:
        _print_json(sessions)
        return
    table = Table(title=f"sessions of {agent}")
    for column in ("session", "created", "last activity", "messages", "cursor", "pending", "gate", "window"):
        table.add_column(column)
    for s in sessions:
        gate = ("open: " if s.gate.open else "") + s.gate.reason
        window = f"{s.pending_window.window} ({s.pending_window.state})" if s.pending_window else ""
        table.add_row(s.session_id, _when(s.created_at), _when(s.last_activity), str(s.messages), str(s.cursor),
                      f"{s.gate.pending_messages} ({s.gate.pending_tokens:.0f} tok)", _short(gate, 50), window)
    console.print(table)
    _footer(len(sessions), after)


@sessions_app.command("show")
def show_session(
    session_id: Annotated[str, typer.Argument(help="The session's id")],
    as_json: AsJson = False, api: Api = DEFAULT_API, key: Key = None,
) -> None:
    """One session: its gate, formation cursor and the job of its pending window (GET /v1/sessions/{id})."""
    with _client(api, key) as client:
        status = client.session(session_id)
    if as_json:
        print(json.dumps(status, indent=2))
        return
    table = Table(title=f"session {session_id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in status.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif name == "last_activity" and isinstance(value, (int, float)):
            value = _when(datetime.fromtimestamp(value).astimezone())
        table.add_row(name, "" if value is None else str(value))
    console.print(table)
