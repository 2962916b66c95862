"""Benchmark: the API's own CPU per message on the single-message route
(``POST /v1/sessions/{id}/messages``), against ``GET /health/live`` in the same process.

Why a second way to measure it: ``bench/ingest_bench.py`` measures the API process under
uvicorn with 64 HTTP clients on the same two cores, where the clients take as much CPU as
the server and a shared machine's load moves every figure. Here the app is called as ASGI
in process by a driver that costs almost nothing (no socket, no HTTP parser, no httpx):
the CPU this process spends is the app's (its middleware, FastAPI, the route, the record,
redis-py and the FalkorDB client), and the store runs in its own process. What uvicorn
adds per request (its HTTP parsing and writing) is the same for both routes, so the
difference route - live is what a message costs beyond a request that does nothing.

C clients (default 64, over 4 agents, as ingest_bench's default) record at once, each in
its own sessions, keys on (``API_AUTH=keys``, one write key for the agents), hash
embedder, formation gates out of reach (no window forms: the record alone). The two
routes are measured in alternating blocks (default 6 of each), each block's CPU
(``time.process_time``: user + system of this process) ÷ its requests; medians and the
spread of the blocks are reported, and the ratio route ÷ live of the medians.

    .venv/bin/python bench/route_cpu.py                         # this checkout
    .venv/bin/python bench/route_cpu.py --code /tmp/old-checkout   # another checkout's memory_service
    .venv/bin/python bench/route_cpu.py --cluster               # the keyspace on a Redis Cluster of three masters
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_code = sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv else str(HERE.parent)
sys.path[:0] = [str(Path(_code).resolve()), str(HERE.parent)]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import AsyncExitStack  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

import memory_service  # noqa: E402
from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.http.app import create_app  # noqa: E402
from memory_service.runtime import open_service  # noqa: E402
from memory_service.schemas.keys import KeyIn  # noqa: E402

# The message of bench/record_layers.py: two sentences, a date, a time, a number.
MESSAGE = ("Thanks! I booked the flight to Lisbon for March 14th, the 10:40 one, and the hotel near Alfama for 3 "
           "nights at 129 EUR a night. Could I get a window seat on flight {i}, please?")


class Driver:
    """Calls the ASGI app as a server would, with nothing around it."""

    def __init__(self, app: Any, key: str):
        self.app = app
        self.auth = f"Bearer {key}".encode()

    async def call(self, method: str, path: str, body: bytes = b"", bare: bool = False) -> int:
        """The answer's status. ``bare``: the app's router alone, without its middleware (and
        without FastAPI's exception handlers: for requests that succeed)."""
        headers = [(b"host", b"bench"), (b"authorization", self.auth)]
        if body:
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000), "server": ("bench", 80),
                 "state": {}, "app": self.app}
        sent = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # a client that stays: only a disconnect would come
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        if bare:  # what FastAPI's innermost middleware gives every request
            async with AsyncExitStack() as stack:
                scope["fastapi_middleware_astack"] = stack
                await self.app.router(scope, receive, send)
        else:
            await self.app(scope, receive, send)
        return status


async def block(driver: Driver, kind: str, clients: int, per_client: int, sessions: list[str], tag: str) -> float:
    """One block of ``clients`` x ``per_client`` requests of ``kind``: CPU seconds per request."""

    async def client(c: int) -> None:
        for j in range(per_client):
            if kind == "live":
                status = await driver.call("GET", "/health/live")
            else:
                body = json.dumps({"agent_id": f"bench-a{c % 4}", "user_id": f"u{c}", "role": "user",
                                   "content": MESSAGE.format(i=j), "message_id": f"{tag}-{c}-{j}"}).encode()
                status = await driver.call("POST", f"/v1/sessions/{sessions[c]}/messages", body)
            if status != 200:
                raise SystemExit(f"FAIL: {kind} answered {status}")

    started = time.process_time()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return (time.process_time() - started) / (clients * per_client)


async def measure(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    async with open_service(settings, run_worker=False) as service:
        app = create_app(settings, service=service, host="0.0.0.0")
        key = await service.keys.create(KeyIn(name="bench", role="write", agents=[f"bench-a{i}" for i in range(4)]),
                                        "bench")
        driver = Driver(app, key.key)
        sessions = [f"bench-s{c}" for c in range(args.clients)]
        async with app.router.lifespan_context(app):
            await block(driver, "route", args.clients, 2, sessions, "warm")  # sessions, graphs, indexes exist
            await block(driver, "live", args.clients, 2, sessions, "warm")
            live, route = [], []
            for b in range(args.blocks):
                live.append(await block(driver, "live", args.clients, args.per_client, sessions, f"b{b}"))
                route.append(await block(driver, "route", args.clients, args.per_client, sessions, f"b{b}"))
    ms = {name: [v * 1000 for v in values] for name, values in (("live", live), ("route", route))}
    return {
        "live_ms": ms["live"], "route_ms": ms["route"],
        "live_median_ms": statistics.median(ms["live"]), "route_median_ms": statistics.median(ms["route"]),
        "ratio": statistics.median(ms["route"]) / statistics.median(ms["live"]),
        "route_less_live_ms": statistics.median(ms["route"]) - statistics.median(ms["live"]),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", help="a checkout whose memory_service to measure (default: this one)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=10, help="requests of each client in a block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each route, alternating")
    parser.add_argument("--cluster", action="store_true", help="the keyspace and graphs on a 3-master Redis Cluster")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    quiet: dict[str, Any] = {
        "embedder": "hash", "embedding_dimension": 64, "memory_formation_msg_interval": 1_000_000,
        "memory_formation_token_interval": 100_000_000, "api_auth": "keys", "mongodb_uri": None,
        "api_queue_timeout_seconds": 600, "store_read_timeout_seconds": 60}
    with tempfile.TemporaryDirectory(prefix="route-cpu-") as tmp:
        server = EmbeddedFalkorDB(Path(tmp) / "plain")
        url = server.start()
        try:
            if args.cluster:
                from tests.redis_cluster import RedisCluster

                cluster = RedisCluster(data_dir=Path(tmp) / "cluster")
                cluster_url = cluster.start()
                try:
                    result = await measure(Settings(_env_file=None, falkordb_url=cluster_url, redis_url=cluster_url,
                                                    queue_redis_url=url, **quiet), args)
                finally:
                    cluster.stop()
            else:
                result = await measure(Settings(_env_file=None, falkordb_url=url, redis_url=None, **quiet), args)
        finally:
            server.stop()
    load = os.getloadavg()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, CPython {platform.python_version()}, load average {load[0]:.1f}; "
          f"code {Path(memory_service.__file__).parent.parent}; {'cluster' if args.cluster else 'plain'} keyspace")
    print(f"{args.clients} clients, {args.blocks} blocks of {args.clients * args.per_client} requests each, "
          "CPU ms per request of this process (the app; the store runs apart):")
    print("  GET /health/live   median {live_median_ms:.3f}  blocks {live}".format(
        live=" ".join(f"{v:.3f}" for v in result["live_ms"]), **result))
    print("  POST .../messages  median {route_median_ms:.3f}  blocks {route}".format(
        route=" ".join(f"{v:.3f}" for v in result["route_ms"]), **result))
    print("  route / live {ratio:.2f}; route - live {route_less_live_ms:.3f} ms".format(**result))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                         "load": load, **result}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
