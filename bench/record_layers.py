"""Benchmark: what one record through the single-message route costs, layer by layer, and
how many Redis round trips it makes, on the plain keyspace (one server) and on a Redis
Cluster (three masters loading FalkorDB, started here from the shipped redis-server).

In one process, sequential records in sessions that already exist (no gate opens: the
formation gates are set out of reach), through the FastAPI app in process (httpx's ASGI
transport: no socket, no uvicorn), with API keys on. Timed per record, as medians of N:

* **route**: ``POST /v1/sessions/{id}/messages`` with a write key, whole;
* **floor**: ``GET /health/live`` through the same app and transport: the middleware
  stack and the framework on a route that touches nothing;
* **auth**: the key check alone (``KeyStore.authenticate``, its Redis read included);
* **record**: ``MemoryService.record_message`` called directly (no HTTP);
* inside it, wrapped where they are called: **redaction** (the secrets' detectors, and the
  agent's redaction policy read when they find something: docs/redaction.md), **reserve**
  (the settings read and the reserve script), **store write** (the group commit's write: the graph statement, the postings
  included), **postings** (the postings' script alone), **commit** (the commit script and the
  writes after it), **hand-off** (the record-time embedding's start and the job's enqueue).

Round trips: every command or pipeline the process sends to Redis or FalkorDB during one
record, counted at the connection (a pipeline is one), by kind (graph statement, script,
other). Wall times include the store's own time (its process runs on the same cores).

    .venv/bin/python bench/record_layers.py                 # plain and cluster, 300 records each
    .venv/bin/python bench/record_layers.py --records 1000 --no-cluster
    .venv/bin/python bench/record_layers.py --no-cluster --secret   # every message holds a card number
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from redis.asyncio.connection import AbstractConnection  # noqa: E402

from memory_service.backends.agents import Redactor  # noqa: E402
from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.domain.models import MessageIn  # noqa: E402
from memory_service.http.app import create_app  # noqa: E402
from memory_service.runtime import open_service  # noqa: E402
from memory_service.schemas.keys import KeyIn  # noqa: E402

SENDS: Counter[str] = Counter()
COUNTING = [False]


SCRIPTS: dict[str, str] = {}  # sha -> the attribute that holds the script


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _kind(args: tuple[Any, ...]) -> str:
    name = _text(args[0]).upper() if args else "?"
    if name.startswith("GRAPH."):
        return "graph statement"
    if name in ("EVALSHA", "EVAL") and len(args) > 1:
        return f"script {SCRIPTS.get(_text(args[1]), '?')}"
    return name


def name_scripts(**owners: Any) -> None:
    from redis.commands.core import AsyncScript

    for owner_name, owner in owners.items():
        for attr, value in vars(owner).items():
            if isinstance(value, AsyncScript):
                SCRIPTS[value.sha] = f"{owner_name}.{attr}"


def install_counter() -> None:
    """Count what the process sends: each send is one round trip (a command, or a pipeline's
    commands to one server at once), named by what was packed into it last."""
    pack_command, pack_commands = AbstractConnection.pack_command, AbstractConnection.pack_commands
    send_packed = AbstractConnection.send_packed_command
    last: dict[int, str] = {}

    def packed_command(self, *args):  # type: ignore[no-untyped-def]
        last[id(self)] = _kind(args)
        return pack_command(self, *args)

    def packed_commands(self, commands):  # type: ignore[no-untyped-def]
        commands = list(commands)
        kinds = {_kind(tuple(c)) for c in commands}
        last[id(self)] = f"pipeline of {'/'.join(sorted(kinds))}" if len(commands) > 1 else next(iter(kinds))
        return pack_commands(self, commands)

    async def counted_packed(self, command, check_health=True):  # type: ignore[no-untyped-def]
        if COUNTING[0]:
            SENDS[last.get(id(self), "other command")] += 1
        return await send_packed(self, command, check_health)

    AbstractConnection.pack_command = packed_command  # type: ignore[method-assign]
    AbstractConnection.pack_commands = packed_commands  # type: ignore[method-assign]
    AbstractConnection.send_packed_command = counted_packed  # type: ignore[method-assign]


class Timers:
    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = defaultdict(list)
        self.current: dict[str, float] = defaultdict(float)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Awaitable[Any]] = getattr(owner, name)
        current = self.current

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                current[label] += time.perf_counter() - started

        setattr(owner, name, timed)

    def wrap_sync(self, owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)
        current = self.current

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                current[label] += time.perf_counter() - started

        setattr(owner, name, timed)

    def next_record(self) -> None:
        for label, value in self.current.items():
            self.spent[label].append(value)
        self.current.clear()


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.3f}" if values else "-"


# A realistic message: two sentences, a date and a time, a number (the detectors' cues are
# looked for, none finds anything); with --secret, a card number the card detector takes.
MESSAGE = ("Thanks! I booked the flight to Lisbon for March 14th, the 10:40 one, and the hotel near Alfama for 3 "
           "nights at 129 EUR a night. Could I get a window seat on flight {i}, please?")
SECRET = " You can charge my card 4539 1488 0343 6467."


async def measure(settings: Settings, records: int, label: str, secret: bool = False) -> None:
    async with open_service(settings, run_worker=False) as service:
        app = create_app(settings, service=service, host="0.0.0.0")
        key = await service.keys.create(KeyIn(name="bench", role="write", agents=["bench-a"]), "bench")
        headers = {"Authorization": f"Bearer {key.key}"}
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), \
                httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            sessions = [f"bench-s{i}" for i in range(8)]
            for i, s in enumerate(sessions):  # the sessions exist, the agent's graph and indexes too
                reply = await client.post(f"/v1/sessions/{s}/messages", headers=headers,
                                          json={"agent_id": "bench-a", "user_id": "ann", "role": "user",
                                                "content": f"warm-up {i}", "message_id": f"w{i}"})
                assert reply.status_code == 200, reply.text
            timers = Timers()
            ledger, graph = service.sessions, await service.registry.get("graph")
            name_scripts(state=service.state, claims=service.state.embed_claims, cache=service.state.cache,
                         postings=graph.postings, keys=service.keys)  # type: ignore[attr-defined]
            timers.wrap(Redactor, "redacted", "redaction")
            timers.wrap(service.state, "reserve_message", "reserve")
            timers.wrap(ledger.writes, "write", "store write")
            timers.wrap(graph.postings, "index_entries", "postings")  # type: ignore[attr-defined]
            timers.wrap(service.state, "commit_message", "commit")
            timers.wrap(ledger, "enqueue_embedding", "hand-off")
            timers.wrap_sync(ledger.fresh, "recorded", "hand-off")
            route, floor, auth, direct = [], [], [], []
            sends: list[Counter[str]] = []
            for i in range(records):
                session = sessions[i % len(sessions)]
                body = {"agent_id": "bench-a", "user_id": "ann", "role": "user",
                        "content": MESSAGE.format(i=i) + (SECRET if secret else ""), "message_id": f"r{i}"}
                SENDS.clear()
                COUNTING[0] = True
                started = time.perf_counter()
                reply = await client.post(f"/v1/sessions/{session}/messages", headers=headers, json=body)
                route.append(time.perf_counter() - started)
                COUNTING[0] = False
                sends.append(Counter(SENDS))
                assert reply.status_code == 200, reply.text
                timers.current.clear()  # the layers are timed on the direct records below
                started = time.perf_counter()
                await client.get("/health/live")
                floor.append(time.perf_counter() - started)
                started = time.perf_counter()
                await service.keys.authenticate(key.key)
                auth.append(time.perf_counter() - started)
                started = time.perf_counter()
                await service.record_message(session, MessageIn(agent_id="bench-a", user_id="ann", role="user",
                                                                content=body["content"], message_id=f"d{i}"))
                direct.append(time.perf_counter() - started)
                timers.next_record()
        print(f"\n{label}: {records} records, medians per record (ms, wall)")
        print(f"  route (HTTP in process, key check, record)  {ms(route)}")
        print(f"  floor (GET /health/live, same stack)        {ms(floor)}")
        print(f"  auth (key check alone)                      {ms(auth)}")
        print(f"  record (MemoryService.record_message)       {ms(direct)}")
        for layer in ("redaction", "reserve", "store write", "postings", "commit", "hand-off"):
            print(f"    {layer:<40} {ms(timers.spent.get(layer, []))}")
        total = Counter[str]()
        for one in sends:
            total.update(one)
        print(f"  round trips per record through the route (mean): {sum(total.values()) / records:.2f}")
        for kind, n in sorted(total.items()):
            print(f"    {kind:<60} {n / records:.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--secret", action="store_true", help="every message holds a card number (redacted)")
    args = parser.parse_args()
    install_counter()
    quiet = {"embedder": "hash", "embedding_dimension": 64, "memory_formation_msg_interval": 1_000_000,
             "memory_formation_token_interval": 100_000_000, "api_auth": "keys", "mongodb_uri": None}
    with tempfile.TemporaryDirectory(prefix="record-layers-") as tmp:
        server = EmbeddedFalkorDB(Path(tmp) / "plain")
        url = server.start()
        try:
            await measure(Settings(_env_file=None, falkordb_url=url, redis_url=None, **quiet), args.records,
                          "plain keyspace (one embedded server)", args.secret)
            if not args.no_cluster:
                from tests.redis_cluster import RedisCluster

                cluster = RedisCluster(data_dir=Path(tmp) / "cluster")
                cluster_url = cluster.start()
                try:
                    await measure(Settings(_env_file=None, falkordb_url=cluster_url, redis_url=cluster_url,
                                           queue_redis_url=url, **quiet), args.records,
                                  "cluster keyspace (three masters; the job queue on the plain server)", args.secret)
                finally:
                    cluster.stop()
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
