"""The command line: `memory-service serve`, `worker`, `migrate`, `backfill-embeddings`,
`reembed` and `demo` here; `import`, `import-history`, `keys`, `outbox`, `mcp`, `memories`,
`sessions`, `forget` and `reform` in their own modules (imports.py, history.py, keys.py, outbox.py, mcp.py, browse.py,
lifecycle.py), registered here. What they share, the console and
the settings, is in common.py, so that none of them imports this module back."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import SecretStr
from rich.syntax import Syntax
from rich.table import Table

from memory_service.cli.browse import memories_app, sessions_app
from memory_service.cli.common import attached_settings, console, load_settings
from memory_service.cli.history import import_history_command
from memory_service.cli.imports import import_command
from memory_service.cli.keys import keys_app
from memory_service.cli.lifecycle import forget_command, reform_command
from memory_service.cli.mcp import mcp_command
from memory_service.cli.outbox import outbox_app
from memory_service.config import Settings
from memory_service.domain.errors import MemoryServiceError
from memory_service.state import metrics, tracing

if TYPE_CHECKING:
    import httpx

    from memory_service.curation.migration import MigrationReport
    from memory_service.embedding.reembed import ReembedReport

app = typer.Typer(help="Long-term memory for LLM agents.", no_args_is_help=True, add_completion=False)


def _setup_logging(level: str, settings: Settings | None = None) -> None:
    """One format for the service, uvicorn and arq (LOG_FORMAT: text or json; memory_service/state/logs.py)."""
    from memory_service.state import logs

    fmt = settings.log_format if settings is not None else os.environ.get("LOG_FORMAT", "text").lower()
    logs.configure(level, "json" if fmt == "json" else "text")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on", min=1, max=65535)] = 8080,
    data_dir: Annotated[Path | None, typer.Option(help="Data of the embedded store (ignored when FALKORDB_URL is set)")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
    worker: Annotated[bool | None, typer.Option("--worker/--no-worker", help="Run a formation worker in this process (default: only on the embedded store)")] = None,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs) on the embedded default or the configured URLs.

    On the embedded default a worker runs in the same process, so that one command gives a
    working service; with FALKORDB_URL/REDIS_URL set, run workers with `memory-service worker`.
    """
    import uvicorn

    from memory_service.http.app import create_app

    settings = load_settings()
    _setup_logging(log_level, settings)
    tracing.configure(settings)
    # log_config=None: uvicorn's lines (the access log too) go through the service's handler and format.
    uvicorn.run(create_app(settings, data_dir, run_worker=worker, host=host), host=host, port=port,
                log_level=log_level.lower(), log_config=None)


@app.command("worker")
def worker_command(
    data_dir: Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Run a formation worker (arq): gated formation, consolidation, cold-session sweeps.

    Start as many as you like on one REDIS_URL; each window is formed by exactly one.
    """
    settings = attached_settings(data_dir)
    _setup_logging(log_level, settings)
    tracing.configure(settings)
    if settings.metrics_port:  # the worker's only /metrics: its own registry, on its own port
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, registry=metrics.REGISTRY)
    try:
        asyncio.run(_run_worker(settings))
    except KeyboardInterrupt:
        pass


@app.command()
def migrate(
    agent: Annotated[str, typer.Option("--agent", help="The agent whose memories move")],
    to: Annotated[str, typer.Option("--to", help="The backend to move them to: graph or mongo")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be copied; change nothing")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")] = None,
) -> None:
    """Copy an agent's memories to the other backend, verify, then switch the agent to it.

    Idempotent and resumable: run it again after an interruption and it copies only what
    is missing. Switching back (--to the other backend) copies back what was written since.
    """
    _setup_logging("warning")
    settings = attached_settings(data_dir)
    try:
        report = asyncio.run(_migrate(settings, agent, to, dry_run))
    except MemoryServiceError as exc:
        console.print(f"[red]migration failed:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("namespace", "memories", "copied", "missing", title=(
        f"{'Dry run: ' if dry_run else ''}agent {agent}: {report.source} → {report.target}"))
    for entry in report.namespaces:
        table.add_row(entry.namespace, str(entry.source), str(entry.copied), str(entry.missing))
    console.print(table)
    if dry_run:
        console.print(f"{report.total} memories, {report.missing} not yet in {to}; nothing was changed.")
    else:
        console.print(f"{report.total} memories verified in {to} ({report.copied} copied by this run); "
                      f"agent {agent} now uses the {to} backend.")


@app.command("upgrade-keyspace")
def upgrade_keyspace(
    data_dir: Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")] = None,
) -> None:
    """Rename the state's Redis keys of an older release to this release's layout.

    Run it with the service stopped (every API replica and worker), on the Redis holding the
    state (REDIS_URL, a plain Redis: before moving the data into a cluster). Idempotent: a
    second run finds nothing to move (memory_service/state/upgrade.py).
    """
    from memory_service.state import upgrade
    from memory_service.state.keyspace import KEYSPACE_VERSION
    from memory_service.state.pools import redis_client

    _setup_logging("warning")
    settings = attached_settings(data_dir)
    url = settings.redis_url or settings.falkordb_url
    assert url is not None  # attached_settings exits when there is no store

    async def main() -> dict[str, int]:
        redis = redis_client(url, settings)
        try:
            return await upgrade.upgrade(redis, lambda n: console.print(f"{n} keys looked at"))
        finally:
            await redis.aclose()

    report = asyncio.run(main())
    console.print(f"keyspace at version {KEYSPACE_VERSION}: {report['renamed']} keys renamed, "
                  f"{report['merged']} merged, {report['split']} entries of single keys spread out")


@app.command("backfill-embeddings")
def backfill_embeddings(
    batch: Annotated[int, typer.Option(help="Memories embedded per call to the embedder", min=1, max=2048)] = 64,
    data_dir: Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")] = None,
) -> None:
    """Embed every memory stored without an embedding (written while the embedder was down).

    Resumable: what is embedded is no longer missing, so an interrupted run picks up where
    it stopped. The worker also does this every few minutes on its own.
    """
    _setup_logging("warning")
    settings = attached_settings(data_dir)
    try:
        report = asyncio.run(_backfill(settings, batch))
    except RuntimeError as exc:
        console.print(f"[red]backfill failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if report["failed_batches"]:
        console.print(f"[red]the embedder failed[/red] after {report['embedded']} memories; run again once it is back")
        raise typer.Exit(1)
    console.print(f"{report['embedded']} memories embedded; none is missing an embedding now.")


async def _backfill(settings: Settings, batch: int) -> dict[str, int]:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from memory_service.runtime import open_service

    async with open_service(settings, run_worker=False) as service:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True) as progress:
            task = progress.add_task("embedding", total=None)
            done = 0

            def on_progress(agent_id: str, count: int) -> None:
                nonlocal done
                done += count
                progress.update(task, description=f"embedded {done} (agent {agent_id})")

            return await service.backfill_embeddings(batch=batch, on_progress=on_progress)


@app.command()
def reembed(
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent (default: every agent)")] = None,
    batch: Annotated[int, typer.Option(help="Memories embedded per call to the embedder", min=1, max=2048)] = 64,
    limit: Annotated[int | None, typer.Option(help="Stop after this many vectors (run again to continue)", min=1)] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Attach to the embedded store a `serve` runs on this data directory")] = None,
) -> None:
    """Give every memory a vector of the configured embedder (EMBEDDER, EMBEDDING_MODEL), then
    switch each agent to it.

    Online: the service keeps serving, and keeps searching with the vectors of the model it
    runs, while the new ones are staged beside them; an agent switches once all of its
    memories have one. Resumable: run it again after an interruption and it continues where
    it stopped. Afterwards, restart the service and workers with the new model.
    """
    _setup_logging("warning")
    settings = attached_settings(data_dir)
    try:
        report = asyncio.run(_reembed(settings, agent, batch, limit))
    except MemoryServiceError as exc:
        console.print(f"[red]re-embed failed:[/red] {exc}")
        raise typer.Exit(2) from None
    except RuntimeError as exc:  # the embedder cannot load, another dimension, no store
        console.print(f"[red]re-embed failed:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("agent", "staged", "promoted", "switched", "left", title=f"Re-embed with {report.model}")
    for done in report.agents:
        table.add_row(done.agent_id, str(done.staged), str(done.promoted), "yes" if done.switched else "no",
                      str(done.left))
    console.print(table)
    stopped = [done for done in report.agents if done.stopped]
    if stopped:
        console.print(f"[yellow]stopped[/yellow] at agent {stopped[0].agent_id}: {stopped[0].stopped}. "
                      "Run the same command again to continue; search keeps using the vectors it used.")
        raise typer.Exit(1)
    if any(done.left for done in report.agents):
        console.print("[yellow]some memories were written with another model during the run[/yellow] (a process "
                      "still runs it): they are found by full text until a later run converts them.")
    switched = "every agent now searches" if report.deployment_switched else "the agents above now search"
    console.print(f"Done: {switched} with {report.model}. Restart the service and the workers with this model "
                  "(EMBEDDER, EMBEDDING_MODEL) if they run another.")


async def _reembed(settings: Settings, agent: str | None, batch: int, limit: int | None) -> ReembedReport:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from memory_service.runtime import open_service

    async with open_service(settings, run_worker=False) as service:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task("starting", total=None)
            counts = {"stage": 0, "promote": 0}

            def on_progress(agent_id: str, phase: str, count: int) -> None:
                counts[phase] += count
                progress.update(task, description=f"agent {agent_id}: {counts['stage']} vectors staged, "
                                                  f"{counts['promote']} promoted")

            return await service.reembed(agent, batch=batch, budget=limit, on_progress=on_progress)


async def _migrate(settings: Settings, agent: str, to: str, dry_run: bool) -> MigrationReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from memory_service.domain.namespaces import validate_id
    from memory_service.runtime import open_service

    validate_id(agent, "agent_id")
    async with open_service(settings, run_worker=False) as service:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("copying", total=None)
            report = await service.migrate_agent(
                agent, to, dry_run=dry_run,
                on_namespace=lambda ns, n: progress.update(task, description=str(ns)[:60],
                                                           total=(progress.tasks[0].total or 0) + n),
                on_copied=lambda n: progress.advance(task, n), actor="cli",
            )
        return report


async def _run_worker(settings: Settings) -> None:
    from memory_service.runtime import open_service
    from memory_service.workers.worker import build_worker

    async with open_service(settings, run_worker=False) as service:
        worker = build_worker(service, handle_signals=True)
        try:
            await worker.async_run()
        except asyncio.CancelledError:
            pass  # SIGINT or SIGTERM: arq cancelled its main task; jobs in flight are re-queued
        finally:
            await worker.close()


@app.command()
def demo(
    data_dir: Annotated[Path | None, typer.Option(help="Keep the demo's data here (default: a temporary directory)")] = None,
    model: Annotated[str | None, typer.Option(help="Model name whose budget the shown memory block must fit")] = None,
) -> None:
    """Replay a bundled sample conversation through the HTTP API and show what was formed."""
    _setup_logging("warning")
    try:
        if data_dir is None:
            with tempfile.TemporaryDirectory(prefix="memory-service-demo-") as tmp:
                asyncio.run(_demo(Path(tmp), model))
        else:
            asyncio.run(_demo(data_dir, model))
    except MemoryServiceError as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        raise typer.Exit(1) from None


async def _demo(data_dir: Path, model: str | None) -> None:
    import httpx

    from memory_service.backends.loopback import LoopbackServer
    from memory_service.http.app import create_app

    script = json.loads(resources.files("memory_service").joinpath("data/demo_conversation.json").read_text())
    # A short gate interval, so that the short sample sessions open it and formation is
    # seen happening in the background while the conversation goes on.
    # Keys as in production: an operator key (OPERATOR_API_KEY) makes the agent's own key,
    # and the demo's calls use that. pydantic's synthesised __init__ lists the fields only,
    # not BaseSettings' own _env_file.
    operator_key = secrets.token_urlsafe(32)
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None,  # type: ignore[call-arg]
                        memory_formation_msg_interval=5, api_auth="keys", operator_api_key=SecretStr(operator_key))
    async with LoopbackServer(create_app(settings, data_dir, run_worker=True)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            console.rule(f"memory-service demo — API on {server.base_url}, embedded FalkorDB in {data_dir}")
            created = _ok(await http.post("/v1/keys", headers={"Authorization": f"Bearer {operator_key}"},
                                          json={"name": "demo", "role": "admin", "agents": [script["agent_id"]]}))
            http.headers["Authorization"] = f"Bearer {created['key']}"
            console.print(f"API key {created['key_id']} ({created['role']} on agent {script['agent_id']}) made with the "
                          "operator key; every call below sends it as 'Authorization: Bearer msk_…'")
            console.print(f"gates: form after {settings.memory_formation_msg_interval} new messages (or "
                          f"{settings.memory_formation_token_interval} weighted tokens); a worker in this process forms them")
            await _replay(http, script)
            show = script["show"]
            params = {"agent_id": script["agent_id"], **show, **({"model": model} if model else {})}
            ctx = _ok(await http.get("/v1/context", params=params))
            console.rule(f"GET /v1/context for {show['user_id']} in {show['session_id']}: {ctx['chars']} of {ctx['budget']} chars")
            console.print(Syntax(ctx["xml"], "xml", word_wrap=True))
            console.print(f"sections: {ctx['sections']}  dropped to fit: {ctx['dropped']}")
            await _show_search(http, script["agent_id"], show["user_id"], script["search"])
            await _show_graph(http, script["agent_id"], show["user_id"])


async def _show_graph(http: httpx.AsyncClient, agent_id: str, user_id: str) -> None:
    """The user's part of the knowledge graph formation built: entities and their current facts."""
    page = _ok(await http.get(f"/v1/agents/{agent_id}/entities", params={"user_id": user_id, "limit": 20}))
    console.rule(f"the knowledge graph, {len(page['entities'])} entities of {user_id} (GET /v1/agents/{agent_id}/entities)")
    for entity in page["entities"]:
        detail = _ok(await http.get(f"/v1/agents/{agent_id}/entities/{entity['id']}"))
        facts = "; ".join(dict.fromkeys(f["text"] for f in detail["facts"] if f["current"])) or "no current fact"
        console.print(f"[bold]{entity['name']}[/bold] ({entity['type']}): {facts}", highlight=False)


async def _show_search(http: httpx.AsyncClient, agent_id: str, user_id: str, query: str) -> None:
    """One search over the user's memories, each result with its explanation."""
    found = _ok(await http.get("/v1/search", params={"agent_id": agent_id, "query": query, "scope": "user",
                                                     "user_id": user_id, "top_k": 3}))
    console.rule(f"GET /v1/search {query!r}, scope user {user_id}: {found['took_ms']:.0f} ms")
    for hit in found["results"]:
        explanation = hit["explanation"]
        signals = " · ".join(f"{name} {s['score']:.2f} (rank {s['rank']})" for name, s in explanation["signals"].items())
        console.print(f"[bold]{hit['score']:.2f}[/bold] {hit['kind']}, {hit['age']}: {hit['content']}", markup=True,
                      highlight=False)
        console.print(f"      {signals} · recency {explanation['recency']:.2f} · from {hit['source_message_ids']}",
                      highlight=False)


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise MemoryServiceError(f"{response.request.method} {response.request.url.path} answered {response.status_code}: {response.text}")
    body: dict[str, Any] = response.json()  # every route used here answers an object
    return body


async def _replay(http: httpx.AsyncClient, script: dict[str, Any]) -> None:
    agent_id = script["agent_id"]
    _ok(await http.put(f"/v1/agents/{agent_id}", json=script["agent"]))
    for shard_id, shard in script["shards"].items():
        _ok(await http.put(f"/v1/agents/{agent_id}/shards/{shard_id}", json=shard))
    table = Table("session", "messages", "gate opened (job queued)", "formed in the background",
                  "formed at session end (POST /form)", title="What was formed")
    for session in script["sessions"]:
        sid, start = session["session_id"], datetime.fromisoformat(session["date"])
        jobs: list[str] = []
        for i, (user_id, role, content) in enumerate(session["messages"]):
            body = {"agent_id": agent_id, "user_id": user_id, "role": role, "content": content,
                    "message_id": f"{sid}-{i}", "created_at": (start + timedelta(minutes=i)).isoformat()}
            job = _ok(await http.post(f"/v1/sessions/{sid}/messages", json=body))["formation_job"]
            if job and job not in jobs:
                jobs.append(job)
        background = "-"
        if jobs:  # the worker forms these while the conversation goes on; wait to show them
            status = await _wait_formed(http, sid)
            background = f"{status['formed_windows']} window(s), {status['formed_messages']} messages"
        # A host (or the cold-session sweep) forms what is left when a session ends.
        at_end = _ok(await http.post(f"/v1/sessions/{sid}/form"))["memories"]
        table.add_row(sid, str(len(session["messages"])), ", ".join(jobs) or "-", background, _counts(at_end))
    console.print(table)


async def _wait_formed(http: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    for _ in range(600):
        status = _ok(await http.get(f"/v1/sessions/{session_id}"))
        if status["pending_job"] is None:
            return status
        await asyncio.sleep(0.05)
    raise MemoryServiceError(f"the worker did not form session {session_id} within 30 s")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "-"


# `memory-service outbox dead|replay|drop`: the outbox's dead letters (memory_service/cli/outbox.py).
app.add_typer(outbox_app, name="outbox")
# `memory-service memories list|show`, `sessions list|show`: browsing, over HTTP (memory_service/cli/browse.py).
app.add_typer(memories_app, name="memories")
app.add_typer(sessions_app, name="sessions")
# `memory-service keys create|list|revoke`: API keys (memory_service/cli/keys.py).
app.add_typer(keys_app, name="keys")
# `memory-service import PATH --agent A`: legacy markdown memory files (memory_service/cli/imports.py).
app.command("import")(import_command)
# `memory-service import-history FILE.jsonl`: a conversation history through the batch route (cli/history.py).
app.command("import-history")(import_history_command)
# `memory-service forget` and `reform`: forgetting with what was formed, re-forming windows (cli/lifecycle.py).
app.command("forget")(forget_command)
app.command("reform")(reform_command)
# `memory-service mcp`: the memory tools over MCP (memory_service/cli/mcp.py, memory_service/mcp/server.py).
app.command("mcp")(mcp_command)


if __name__ == "__main__":
    app()
