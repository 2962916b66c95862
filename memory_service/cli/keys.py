"""`memory-service keys create|list|revoke`: API keys from the command line.

Only Redis is needed. On the embedded default the command attaches to the store a running
`serve` owns, or, when none runs, starts the store on the data directory for the time of
the command: the first key is made before the first `serve` that needs one.
Changes are written to the audit log under the key id ``cli``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from pydantic import ValidationError
from redis.asyncio import Redis
from rich.table import Table

from memory_service.access.audit import AuditLog
from memory_service.access.keys import OPERATOR, KeyStore
from memory_service.access.pseudonyms import Pseudonyms
from memory_service.cli.common import console, load_settings, with_running_store
from memory_service.config import Settings
from memory_service.domain.errors import MemoryServiceError
from memory_service.schemas.keys import ApiKey, KeyIn, Role

T = TypeVar("T")
CLI_KEY_ID = "cli"

keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
DataDir = Annotated[Path | None, typer.Option(help="The embedded store's data directory (when FALKORDB_URL is unset)")]


@asynccontextmanager
async def _redis(settings: Settings, data_dir: Path | None) -> AsyncIterator[Redis]:
    from memory_service.backends.embedded import EmbeddedFalkorDB
    from memory_service.state.pools import redis_client

    settings = with_running_store(settings, data_dir)
    embedded, url = None, settings.redis_url or settings.falkordb_url
    if url is None:  # no `serve` owns the data directory: run the store for this command
        embedded = EmbeddedFalkorDB(data_dir or settings.memory_data_dir)
        url = embedded.start()
    redis = redis_client(url, settings)
    try:
        yield redis
    finally:
        await redis.aclose()
        if embedded:
            embedded.stop()


def _run(data_dir: Path | None, work: Callable[[KeyStore, AuditLog], Awaitable[T]]) -> T:
    settings = load_settings()

    async def main() -> T:
        async with _redis(settings, data_dir) as redis:
            digest_key = settings.user_digest_key.get_secret_value() if settings.user_digest_key else None
            return await work(KeyStore(redis), AuditLog(redis, Pseudonyms(redis, digest_key)))

    try:
        return asyncio.run(main())
    except MemoryServiceError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option(help="What the key is for")],
    role: Annotated[Role, typer.Option(help="read, write or admin")],
    agent: Annotated[list[str] | None, typer.Option("--agent", help="An agent the key reaches (repeat); none: every agent")] = None,
    user: Annotated[list[str] | None, typer.Option("--user", help="Only this user of its one agent (repeat)")] = None,
    requests_per_minute: Annotated[int | None, typer.Option(min=0, help="Its own request limit (0: none)")] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(min=0, help="Its own recorded-token limit (0: none)")] = None,
    data_dir: DataDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the key as JSON")] = False,
) -> None:
    """Create a key and print it: it is shown this once and stored only as a hash."""
    try:
        spec = KeyIn(name=name, role=role, agents=agent, users=user, requests_per_minute=requests_per_minute,
                     tokens_per_minute=tokens_per_minute)
    except ValidationError as exc:
        console.print(f"[red]invalid key:[/red] {'; '.join(e['msg'] for e in exc.errors())}")
        raise typer.Exit(2) from None

    async def work(keys: KeyStore, audit: AuditLog) -> dict[str, object]:
        created = await keys.create(spec, created_by=CLI_KEY_ID)
        record = created.model_dump(mode="json", exclude={"key"})
        await audit.append_each(CLI_KEY_ID, "key.create", spec.agents, created.key_id, after=record)
        return created.model_dump(mode="json")

    created = _run(data_dir, work)
    if as_json:
        print(json.dumps(created))
        return
    scope = ", ".join(spec.agents) if spec.agents else "every agent (operator key)" if role is Role.ADMIN else "every agent"
    console.print(f"key {created['key_id']} ({role.value} on {scope}{'; users ' + ', '.join(spec.users) if spec.users else ''})")
    console.print("Send it as 'Authorization: Bearer <key>'. It is shown only now:")
    print(created["key"])


@keys_app.command("list")
def list_keys(data_dir: DataDir = None,
              as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False) -> None:
    """Every key: id, name, role, scope, when made, whether revoked (never the secrets)."""
    async def work(keys: KeyStore, audit: AuditLog) -> list[ApiKey]:
        return await keys.list(OPERATOR)

    found = _run(data_dir, work)
    if as_json:
        for key in found:
            print(key.model_dump_json())
        return
    table = Table("key id", "name", "role", "agents", "users", "created", "revoked", title=f"{len(found)} API keys")
    for key in found:
        table.add_row(key.key_id, key.name, key.role.value, ", ".join(key.agents) if key.agents else "every agent",
                      ", ".join(key.users) if key.users else "all", key.created_at.isoformat(timespec="seconds"),
                      key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "")
    console.print(table)


@keys_app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id (from `keys list`)")], data_dir: DataDir = None) -> None:
    """Revoke a key: every replica refuses it from the next request on."""
    async def work(keys: KeyStore, audit: AuditLog) -> bool:
        before = await keys.get(key_id)
        after, changed = await keys.revoke(key_id)
        if changed:
            await audit.append_each(CLI_KEY_ID, "key.revoke", before.agents, key_id, before=before.model_dump(mode="json"),
                                    after=after.model_dump(mode="json"))
        return changed

    changed = _run(data_dir, work)
    console.print(f"key {key_id} {'revoked' if changed else 'was already revoked'}")
