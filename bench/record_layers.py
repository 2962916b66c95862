"""Benchmark: what one record through the single-message route costs, layer by layer, and
how many Redis round trips it makes, on the plain keyspace (one server) and on a Redis
Cluster (three masters loading FalkorDB, started here from the shipped redis-server).

In one process, sequential records in sessions that already exist (no gate opens: the
formation gates are set out of reach), the FastAPI app called as ASGI in process by a driver
that costs almost nothing (bench/route_cpu.py's: no socket, no uvicorn, no HTTP client), with
API keys on. Timed per record, as medians of N, in CPU of this process (``time.process_time``;
the store's own CPU is in its process) and in wall time (the store's included):

* **route**: ``POST /v1/sessions/{id}/messages`` with a write key, whole;
* **route without the middleware**: the same request to the app's router alone (the
  difference is what the middleware stack costs a record: request telemetry, access-log
  scope, browser guard, unexpected errors, admission with its key check, stall guard);
* **floor**: ``GET /health/live`` through the same app, and through the router alone;
* **auth**: the key check alone (``KeyStore.authenticate``, its Redis round trip included);
* **record**: ``MemoryService.record_message`` called directly (no HTTP);
* inside it, wrapped where they are called: **redaction** (the secrets' detectors, and the
  agent's redaction policy read when they find something: docs/redaction.md), **reserve**
  (the settings read and the reserve script), **store write** (the group commit's write: the graph statement, the postings
  included), **postings** (the postings' script alone), **commit** (the commit script and the
  writes around it), **hand-off** (the record-time embedding's start and the job's enqueue).

Round trips: every command or pipeline the process sends to Redis or FalkorDB during one
record, counted at the connection (a pipeline is one), by kind (graph statement, script,
other).

    .venv/bin/python bench/record_layers.py                 # plain and cluster, 300 records each
    .venv/bin/python bench/record_layers.py --records 1000 --no-cluster
    .venv/bin/python bench/record_layers.py --no-cluster --secret   # every message holds a card number
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from redis.asyncio.connection import AbstractConnection  # noqa: E402
from route_cpu import Driver  # noqa: E402

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
    """Wall and CPU time (``time.process_time``: this process's user + system) of each
    wrapped layer, per record. The records run one after the other, so the CPU this process
    spends while a layer is awaited is that layer's (the store's own CPU is in its process)."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.current: dict[str, float] = defaultdict(float)
        self.current_cpu: dict[str, float] = defaultdict(float)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Awaitable[Any]] = getattr(owner, name)
        current, current_cpu = self.current, self.current_cpu

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return await inner(*args, **kwargs)
            finally:
                current[label] += time.perf_counter() - started
                current_cpu[label] += time.process_time() - cpu

        setattr(owner, name, timed)

    def wrap_sync(self, owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)
        current, current_cpu = self.current, self.current_cpu

        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                current[label] += time.perf_counter() - started
                current_cpu[label] += time.process_time() - cpu

        setattr(owner, name, timed)

    def next_record(self) -> None:
        for label, value in self.current.items():
            self.spent[label].append(value)
            self.cpu[label].append(self.current_cpu[label])
        self.current.clear()
        self.current_cpu.clear()

    def clear(self) -> None:
        self.current.clear()
        self.current_cpu.clear()


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.3f}" if values else "-"


class Clock:
    """Wall and CPU time of one call, appended to ``wall`` and ``cpu``."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    async def time(self, call: Awaitable[Any]) -> Any:
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return await call
        finally:
            self.cpu.append(time.process_time() - cpu)
            self.wall.append(time.perf_counter() - started)


# A realistic message: two sentences, a date and a time, a number (the detectors' cues are
# looked for, none finds anything); with --secret, a card number the card detector takes.
MESSAGE = ("Thanks! I booked the flight to Lisbon for March 14th, the 10:40 one, and the hotel near Alfama for 3 "
           "nights at 129 EUR a night. Could I get a window seat on flight {i}, please?")
SECRET = " You can charge my card 4539 1488 0343 6467."


async def measure(settings: Settings, records: int, label: str, secret: bool = False) -> None:
    async with open_service(settings, run_worker=False) as service:
        app = create_app(settings, service=service, host="0.0.0.0")
        key = await service.keys.create(KeyIn(name="bench", role="write", agents=["bench-a"]), "bench")
        driver = Driver(app, key.key)
        async with app.router.lifespan_context(app):
            sessions = [f"bench-s{i}" for i in range(8)]
            for i, s in enumerate(sessions):  # the sessions exist, the agent's graph and indexes too
                status = await driver.call("POST", f"/v1/sessions/{s}/messages", body(s, i, f"w{i}", f"warm-up {i}"))
                assert status == 200, status
            await driver.call("GET", "/health/live")
            await driver.call("GET", "/health/live", bare=True)
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
            route, bare, floor, floor_bare, auth, direct = Clock(), Clock(), Clock(), Clock(), Clock(), Clock()
            sends: list[Counter[str]] = []
            for i in range(records):
                session = sessions[i % len(sessions)]
                content = MESSAGE.format(i=i) + (SECRET if secret else "")
                SENDS.clear()
                COUNTING[0] = True
                status = await route.time(driver.call("POST", f"/v1/sessions/{session}/messages",
                                                      body(session, i, f"r{i}", content)))
                COUNTING[0] = False
                sends.append(Counter(SENDS))
                assert status == 200, status
                timers.clear()  # the record's layers are timed on the direct records below
                status = await bare.time(driver.call("POST", f"/v1/sessions/{session}/messages",
                                                     body(session, i, f"b{i}", content), bare=True))
                assert status == 200, status
                timers.clear()
                await floor.time(driver.call("GET", "/health/live"))
                await floor_bare.time(driver.call("GET", "/health/live", bare=True))
                await auth.time(service.keys.authenticate(key.key))
                await direct.time(service.record_message(session, MessageIn(
                    agent_id="bench-a", user_id="ann", role="user", content=content, message_id=f"d{i}")))
                timers.next_record()
        print(f"\n{label}: {records} records, medians per record, ms: CPU of this process (wall)")

        def line(name: str, clock: Clock) -> None:
            print(f"  {name:<58} {ms(clock.cpu):>7} ({ms(clock.wall)})")

        line("route: POST /v1/sessions/{id}/messages, whole", route)
        line("route without the middleware (the router called alone)", bare)
        line("floor: GET /health/live, the whole stack", floor)
        line("floor without the middleware", floor_bare)
        line("auth: the key check alone (KeyStore.authenticate)", auth)
        line("record: MemoryService.record_message, no HTTP", direct)
        for layer in ("redaction", "reserve", "store write", "postings", "commit", "hand-off"):
            print(f"    {'of which ' + layer:<56} {ms(timers.cpu.get(layer, [])):>7} ({ms(timers.spent.get(layer, []))})")
        total = Counter[str]()
        for one in sends:
            total.update(one)
        print(f"  round trips per record through the route (mean): {sum(total.values()) / records:.2f}")
        for kind, n in sorted(total.items()):
            print(f"    {kind:<60} {n / records:.2f}")


def body(session: str, i: int, message_id: str, content: str) -> bytes:
    return json.dumps({"agent_id": "bench-a", "user_id": "ann", "role": "user", "content": content,
                       "message_id": message_id}).encode()


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
