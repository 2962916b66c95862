"""Benchmark: the HTTP API under overload. Many concurrent clients against a real server.

A server is started as its own process (``memory-service serve`` on an embedded store in
a temporary directory, with its in-process worker, the configured embedder: the local
model unless ``--embedder hash``). Each client runs the session loop for its own
session: record a message (``POST /v1/sessions/{id}/messages``), then ask for the memory
block with that message as the query (``GET /v1/context``), again and again. Phases, in
one run:

| phase | clients | what it shows |
|---|---|---|
| low | ``--low`` (4) | latency when nothing waits |
| overload | ``--clients`` (200) | what 200 concurrent sessions get: statuses, latency |
| recovery | ``--low`` (4) | that the service answers normally again afterwards |

Per phase and route: requests, statuses (and client errors such as connection resets),
p50 and p95 (nearest rank) in ms, requests/s; then the ratio of the overload p95 to the
low-load p95, per route. Speed is reported, never asserted. Correctness is checked and
exits 1 on a violation: no 500 (and no other 5xx but a 503 with Retry-After), no
connection error, and every request of the recovery phase answered 200.

    .venv/bin/python bench/overload_bench.py [--clients 200] [--low 4] [--seconds 20] [--embedder local|hash] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.loopback import free_port  # noqa: E402

CLI = str(Path(sys.executable).parent / "memory-service")
AGENT = "overload-agent"
LINES = [
    "I prefer window seats on every flight, and an aisle on trains.",
    "The flight to Lisbon leaves on June 3rd at 9am from gate 12.",
    "Please book the hotel near the station because it is cheaper.",
    "Always answer me in French when we talk about the budget.",
    "Remind me to renew my passport before the trip in May.",
]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


class Phase:
    def __init__(self, name: str, clients: int):
        self.name, self.clients = name, clients
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.by_status: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.statuses: dict[str, Counter] = defaultdict(Counter)
        self.violations: list[str] = []
        self.seconds = 0.0

    def record(self, route: str, started: float, outcome: str | int) -> None:
        took = time.perf_counter() - started
        self.latency[route].append(took)
        self.by_status[(route, str(outcome))].append(took)
        self.statuses[route][str(outcome)] += 1


def clients(base_url: str, count: int) -> list[httpx.AsyncClient]:
    """A client of its own per session, as separate applications would have: one shared pool
    of 200 connections costs httpx more CPU than the server spends (it scans the pool). Made
    before the clock starts, with one TLS context (httpx builds one per client otherwise, some
    20 ms of CPU each, which at 200 clients delayed every first request by seconds)."""
    tls = ssl.create_default_context()
    return [httpx.AsyncClient(base_url=base_url, timeout=120, verify=tls) for _ in range(count)]


async def session_loop(http: httpx.AsyncClient, phase: Phase, index: int, stop_at: float) -> None:
    session = f"{phase.name}-{index}"
    n = 0
    while time.monotonic() < stop_at:
        content = f"{LINES[n % len(LINES)]} (note {n} of client {index})"
        body = {"agent_id": AGENT, "user_id": f"user-{index % 10}", "role": "user", "content": content,
                "message_id": f"{session}-{n}"}
        for route, call in (
            ("record", lambda: http.post(f"/v1/sessions/{session}/messages", json=body)),
            ("context", lambda: http.get("/v1/context", params={"agent_id": AGENT, "user_id": body["user_id"],
                                                                 "session_id": session, "query": content})),
        ):
            started = time.perf_counter()
            try:
                response = await call()
            except httpx.HTTPError as exc:
                phase.record(route, started, type(exc).__name__)
                phase.violations.append(f"{phase.name} {route}: {type(exc).__name__}: {exc}")
                continue
            phase.record(route, started, response.status_code)
            if response.status_code >= 500 and not (response.status_code == 503 and "retry-after" in response.headers):
                phase.violations.append(f"{phase.name} {route}: HTTP {response.status_code}: {response.text[:200]}")
            if phase.name == "recovery" and response.status_code != 200:
                phase.violations.append(f"recovery {route}: HTTP {response.status_code} after the overload")
        n += 1


async def run_phase(base_url: str, name: str, count: int, seconds: float) -> Phase:
    phase = Phase(name, count)
    https = clients(base_url, count)
    try:
        started = time.monotonic()
        stop_at = started + seconds
        await asyncio.gather(*(session_loop(http, phase, i, stop_at) for i, http in enumerate(https)))
        phase.seconds = time.monotonic() - started
    finally:
        await asyncio.gather(*(http.aclose() for http in https))
    return phase


def summary(phase: Phase) -> list[dict]:
    rows = []
    for route in ("record", "context"):
        samples = phase.latency.get(route, [])
        rows.append({
            "phase": phase.name, "clients": phase.clients, "route": route, "requests": len(samples),
            "statuses": dict(sorted(phase.statuses[route].items())),
            "error_rate": (sum(v for k, v in phase.statuses[route].items() if k != "200") / len(samples)) if samples else 0,
            "p50_ms": sorted(samples)[len(samples) // 2] * 1e3 if samples else None,
            "p95_ms": p95(samples) * 1e3 if samples else None,
            "p95_ms_by_status": {status: round(p95(v) * 1e3, 1) for (r, status), v in sorted(phase.by_status.items())
                                 if r == route},
            "per_second": len(samples) / phase.seconds if phase.seconds else 0,
        })
    return rows


async def wait_healthy(base_url: str, server: subprocess.Popen) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        for _ in range(1200):
            if server.poll() is not None:
                raise SystemExit(f"the server exited during start-up ({server.returncode})")
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("the server did not become healthy")


async def main(args: argparse.Namespace) -> int:
    console = Console(width=150)
    header = print_machine(console, "overload_bench")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("FALKORDB_URL", "REDIS_URL", "MONGODB_URI")}
    env["EMBEDDER"] = args.embedder
    if args.embedder == "hash":
        env["EMBEDDING_DIMENSION"] = "64"
    settings_shown = {k: env.get(k) for k in ("EMBEDDER", "REDIS_MAX_CONNECTIONS", "REDIS_POOL_TIMEOUT_SECONDS",
                                              "STORE_READ_TIMEOUT_SECONDS")}
    console.print(f"server: memory-service serve (embedded store, in-process worker), {settings_shown}")
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as data_dir:
        server = subprocess.Popen([CLI, "serve", "--port", str(port), "--data-dir", data_dir, "--log-level", "warning"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            await wait_healthy(base_url, server)
            await run_phase(base_url, "warmup", 2, 2)
            phases = [await run_phase(base_url, "low", args.low, args.seconds / 2),
                      await run_phase(base_url, "overload", args.clients, args.seconds),
                      await run_phase(base_url, "recovery", args.low, args.seconds / 4)]
        finally:
            server.terminate()
            try:
                _, stderr = server.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                _, stderr = server.communicate()
    rows = [row for phase in phases for row in summary(phase)]
    table = Table(title="the session loop under load (ms)")
    for column in ("phase", "clients", "route", "requests", "statuses", "errors", "p50", "p95", "p95 by status",
                   "req/s"):
        table.add_column(column, justify="left" if column in ("phase", "route", "statuses") else "right")
    for r in rows:
        table.add_row(r["phase"], str(r["clients"]), r["route"], str(r["requests"]),
                      ", ".join(f"{k}: {v}" for k, v in r["statuses"].items()), f"{r['error_rate']:.1%}",
                      f"{r['p50_ms']:.0f}" if r["p50_ms"] is not None else "-",
                      f"{r['p95_ms']:.0f}" if r["p95_ms"] is not None else "-",
                      ", ".join(f"{k}: {v:.0f}" for k, v in r["p95_ms_by_status"].items()), f"{r['per_second']:.1f}")
    console.print(table)
    by = {(r["phase"], r["route"]): r for r in rows}
    ratios = {}
    for route in ("record", "context"):
        low, over = by[("low", route)]["p95_ms"], by[("overload", route)]["p95_ms"]
        if low and over:
            ratios[route] = over / low
            console.print(f"{route}: p95 under overload / p95 at low load = {over:.0f} / {low:.0f} ms = {ratios[route]:.1f}x")
    violations = [v for phase in phases for v in phase.violations]
    for line in sorted(set(violations))[:20]:
        console.print(f"[red]FAIL[/red] {line}")
    if violations:
        console.print(f"[red]FAIL[/red] {len(violations)} violation(s); server log tail:\n{stderr[-3000:]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "args": vars(args), "phases": rows,
                                               "p95_ratio_overload_to_low": ratios, "violations": violations[:100]},
                                              indent=2))
    return 1 if violations else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients in the overload phase")
    parser.add_argument("--low", type=int, default=4, help="concurrent clients at low load (and in recovery)")
    parser.add_argument("--seconds", type=float, default=20, help="length of the overload phase (low: half, recovery: a quarter)")
    parser.add_argument("--embedder", choices=["local", "hash"], default="local")
    parser.add_argument("--json", help="also write the results here")
    sys.exit(asyncio.run(main(parser.parse_args())))
