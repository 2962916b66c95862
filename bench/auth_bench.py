"""Benchmark: what checking an API key costs a request.

Two real servers on loopback share one embedded store: one keyless (API_AUTH=off, the
baseline) and one requiring keys (API_AUTH=keys). The same routes are called on both,
interleaved request by request so that the shared machine's noise falls on both alike:

| route | what the key check adds |
|---|---|
| ``GET /health/live`` | nothing (no key checked): the HTTP stack alone |
| ``GET /v1/agents/{id}`` | one Redis script (look up the key, compare, count the request) |
| ``POST /v1/sessions/{id}/messages`` | that, and the recorded-token charge (a second script) |

For each route and server: p50 and p95 (nearest rank) in ms over ``--repeat`` sequential
requests, and the ratio keyed / keyless. Speed is reported, never asserted; correctness is
checked (every answer 200, and an unkeyed request to the keyed server 401) and exits 1 on
a violation.

    .venv/bin/python bench/auth_bench.py [--repeat 500] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.backends.loopback import LoopbackServer  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.http.app import create_app  # noqa: E402

AGENT = "bench-agent"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))]


async def run(repeat: int) -> tuple[dict[str, dict[str, list[float]]], list[str]]:
    errors: list[str] = []
    operator = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="auth-bench-") as tmp:
        store = EmbeddedFalkorDB(Path(tmp))
        url = store.start()
        try:
            base = {"_env_file": None, "falkordb_url": url, "redis_url": None, "mongodb_uri": None, "embedder": "hash",
                    "embedding_dimension": 64, "rate_limit_requests_per_minute": 0, "rate_limit_tokens_per_minute": 0}
            keyless = Settings(**base, api_auth="off")  # type: ignore[arg-type]
            keyed = Settings(**base, api_auth="keys", operator_api_key=operator)  # type: ignore[arg-type]
            async with LoopbackServer(create_app(keyless, run_worker=False)) as open_server, \
                    LoopbackServer(create_app(keyed, run_worker=False)) as key_server:
                async with httpx.AsyncClient(base_url=open_server.base_url, timeout=30) as open_client, \
                        httpx.AsyncClient(base_url=key_server.base_url, timeout=30) as key_client:
                    made = await key_client.post("/v1/keys", headers={"Authorization": f"Bearer {operator}"},
                                                 json={"name": "bench", "role": "write", "agents": [AGENT]})
                    key_client.headers["Authorization"] = f"Bearer {made.json()['key']}"
                    await open_client.put(f"/v1/agents/{AGENT}", json={})
                    if (await httpx.AsyncClient(base_url=key_server.base_url).get(f"/v1/agents/{AGENT}")).status_code != 401:
                        errors.append("the keyed server answered a request without a key")
                    return await measure(open_client, key_client, repeat, errors), errors
        finally:
            store.stop()


async def measure(open_client: httpx.AsyncClient, key_client: httpx.AsyncClient, repeat: int,
                  errors: list[str]) -> dict[str, dict[str, list[float]]]:
    routes = {"GET /health/live": ("GET", "/health/live", None), "GET /v1/agents/{id}": ("GET", f"/v1/agents/{AGENT}", None),
              "POST /messages": ("POST", "/v1/sessions/{session}/messages", True)}
    timings: dict[str, dict[str, list[float]]] = {r: {"keyless": [], "keyed": []} for r in routes}
    for i in range(repeat + 20):  # the first 20 warm up
        for route, (method, path, is_record) in routes.items():
            for name, client in (("keyless", open_client), ("keyed", key_client)):
                body = None
                target = path
                if is_record:
                    target = path.format(session=f"{name}-s{i // 50}")
                    body = {"agent_id": AGENT, "user_id": "u", "role": "user", "message_id": f"{name}-{i}",
                            "content": "I prefer window seats on every flight, and an aisle on trains."}
                started = time.perf_counter()
                answer = await client.request(method, target, json=body)
                elapsed = (time.perf_counter() - started) * 1000
                if answer.status_code != 200:
                    errors.append(f"{name} {route}: {answer.status_code} {answer.text[:200]}")
                if i >= 20:
                    timings[route][name].append(elapsed)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    machine = print_machine(console, "auth_bench")
    timings, errors = asyncio.run(run(args.repeat))
    table = Table("route", "keyless p50", "keyless p95", "keyed p50", "keyed p95", "ratio p50", "ratio p95",
                  title=f"API key check, {args.repeat} sequential requests per route and server (ms)")
    rows = []
    for route, by_server in timings.items():
        stats = {name: (percentile(v, 0.5), percentile(v, 0.95)) for name, v in by_server.items()}
        ratio = (stats["keyed"][0] / stats["keyless"][0], stats["keyed"][1] / stats["keyless"][1])
        table.add_row(route, *(f"{x:.2f}" for x in (*stats["keyless"], *stats["keyed"])), f"{ratio[0]:.2f}", f"{ratio[1]:.2f}")
        rows.append({"route": route, "keyless_ms": stats["keyless"], "keyed_ms": stats["keyed"], "ratio": ratio})
    console.print(table)
    for error in errors[:20]:
        console.print(f"[red]error:[/red] {error}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "repeat": args.repeat, "routes": rows, "errors": errors}))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
