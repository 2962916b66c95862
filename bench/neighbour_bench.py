"""Benchmark: a noisy neighbour. One agent saturates the API with batches; another agent,
at a light steady rate, should not notice.

A server is started as its own process per code variant (``memory-service serve
--no-worker`` on an embedded store in a temporary directory, keys required, the hash
embedder), with two agents and a write key each (the heavy one's without rate limits: this
measures admission and the store, not the per-key limits). Phases, in one run per variant:

| phase | heavy agent | what it shows |
|---|---|---|
| alone | nothing | the light agent's own latency: the baseline |
| batches | ``--clients`` (50) clients, each sending batches of ``--batch`` (100) messages back to back | one agent at saturation |
| large | ``--large-clients`` (4) batches of ``--large-mb`` (8) MB at once | one body holding the store |

The light agent runs in a process of its own (so the heavy clients' event loop does not
delay its requests), open loop: a request every 1/``--light-rate`` s, alternating recording
a message and asking for its memory block. Per phase: the light agent's p50 and p95
(nearest rank) in ms, overall and per route, and its statuses; the heavy agent's statuses
and messages recorded per second; the seconds per second the server process (with the
embedded store) ran on a core and waited on a run queue for one (Linux schedstat: on a
shared machine, how starved of CPU the server was); then the ratio of the light agent's p95
in each loaded phase to its p95 alone, measured in the same run. ``--code NAME=DIR`` (repeatable) runs
other checkouts' servers in turn within each repetition (``before=`` a checkout of main,
``after=.``), each with settings of its own if given (``--variant-env NAME:KEY=VALUE``);
``--repeat`` repetitions, and the medians over them.

Correctness, checked on every run (exit 1): the light agent gets no 5xx in any phase and
every one of its records is recorded; the heavy agent gets no 500 (503 with Retry-After
and 429 are answers), and every 503 the batch route gave either carries no items (nothing
was recorded) or lists every item.

    .venv/bin/python bench/neighbour_bench.py [--code before=/tmp/main --code after=.] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402

from memory_service.backends.loopback import free_port  # noqa: E402

CLI = str(Path(sys.executable).parent / "memory-service")
STORE_ENV = ("FALKORDB_URL", "REDIS_URL", "MONGODB_URI")
HEAVY, LIGHT = "heavy-agent", "light-agent"
WORDS = ("window seat flight Lisbon gate hotel station budget passport trip renew remind French answer always "
         "prefer aisle train cheaper book leaves June morning").split()


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


def text(seed: int, chars: int) -> str:
    words, n = [], 0
    while n < chars:
        word = f"{WORDS[(seed * 7 + len(words)) % len(WORDS)]}{(seed + len(words)) % 101}"
        words.append(word)
        n += len(word) + 1
    return " ".join(words)[:chars]


# --- the light agent, in a process of its own --------------------------------------------


async def light_loop(base_url: str, key: str, rate: float, seconds: float, tag: str) -> list[tuple[str, str, float]]:
    """Open loop: a request every 1/rate s, each in its own task; (route, status, seconds)."""
    headers = {"Authorization": f"Bearer {key}"}
    samples: list[tuple[str, str, float]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=httpx.Limits(max_connections=50)) as http:
        async def one(n: int) -> None:
            session, user = f"light-{tag}", "lena"
            started = time.perf_counter()
            try:
                if n % 2 == 0:
                    route = "record"
                    answer = await http.post(f"/v1/sessions/{session}/messages", headers=headers, json={
                        "agent_id": LIGHT, "user_id": user, "role": "user", "content": text(n, 120),
                        "message_id": f"{tag}-{n}"})
                    ok = answer.status_code == 200 and not answer.json()["duplicate"]
                    status = str(answer.status_code) if answer.status_code != 200 or ok else "200-not-recorded"
                else:
                    route = "context"
                    answer = await http.get("/v1/context", headers=headers, params={
                        "agent_id": LIGHT, "user_id": user, "session_id": session, "query": text(n, 60)})
                    status = str(answer.status_code)
            except httpx.HTTPError as exc:
                route, status = ("record" if n % 2 == 0 else "context"), type(exc).__name__
            samples.append((route, status, time.perf_counter() - started))

        tasks, start = [], time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(one(n)))
            n += 1
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    return samples


def run_light(base_url: str, key: str, rate: float, seconds: float, tag: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--light", base_url, key, str(rate), str(seconds), tag],
                            stdout=subprocess.PIPE, text=True)


def light_result(proc: subprocess.Popen) -> list[tuple[str, str, float]]:
    out, _ = proc.communicate(timeout=600)
    return [tuple(s) for s in json.loads(out)]


# --- the heavy agent ------------------------------------------------------------------------


class Heavy:
    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.recorded = 0
        self.violations: list[str] = []
        self.seconds: list[float] = []

    def check(self, answer: httpx.Response, size: int) -> None:
        self.statuses[str(answer.status_code)] += 1
        if answer.status_code == 200:
            self.recorded += answer.json()["recorded"]
        elif answer.status_code == 503:
            body = answer.json()
            if "retry-after" not in answer.headers:
                self.violations.append("heavy: 503 without Retry-After")
            if "items" in body:
                if len(body["items"]) != size:
                    self.violations.append(f"heavy: a 503 lists {len(body['items'])} items of {size}")
                self.recorded += body["recorded"]
        elif answer.status_code != 429:
            self.violations.append(f"heavy: HTTP {answer.status_code}: {answer.text[:200]}")


def batch_body(tag: str, index: int, n: int, batch: int, chars: int) -> bytes:
    return json.dumps({"messages": [
        {"session_id": f"heavy-{tag}-{index}-{(n * batch + j) // 50}", "user_id": f"user-{index % 10}",
         "role": "user", "content": text(n * batch + j, chars), "message_id": f"{tag}-{index}-{n}-{j}"}
        for j in range(batch)]}).encode()


async def heavy_client(base_url: str, key: str, index: int, batch: int, chars: int, stop_at: float,
                       heavy: Heavy, tag: str, prebuilt: bytes | None = None) -> None:
    """Batches back to back until ``stop_at`` (503s and 429s sent again at once, as a
    careless client would), or the one ``prebuilt`` batch."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        n = 0
        while (prebuilt is not None and n == 0) or (prebuilt is None and time.monotonic() < stop_at):
            body = prebuilt if prebuilt is not None else batch_body(tag, index, n, batch, chars)
            n += 1
            started = time.perf_counter()
            try:
                answer = await http.post(f"/v1/agents/{HEAVY}/messages/batch", content=body, headers=headers)
            except httpx.HTTPError as exc:
                heavy.statuses[type(exc).__name__] += 1
                heavy.violations.append(f"heavy: {type(exc).__name__}: {exc}")
                continue
            heavy.seconds.append(time.perf_counter() - started)
            heavy.check(answer, batch)


# --- one variant's server -------------------------------------------------------------------


class Server:
    """``memory-service serve --no-worker`` of a checkout, keys required, in a child process."""

    def __init__(self, code: Path | None, data_dir: Path, env_overrides: dict[str, str]):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.operator = secrets.token_urlsafe(32)
        env = {k: v for k, v in os.environ.items() if k not in STORE_ENV}
        env.update({"EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64", "API_AUTH": "keys",
                    "OPERATOR_API_KEY": self.operator, **env_overrides})
        command, cwd = [CLI], None
        if code is not None:  # another checkout, ahead of the installed one on the import path
            env["PYTHONPATH"] = cwd = str(code.resolve())
            command = [sys.executable, "-c", "import memory_service as m; print('code:', m.__file__, flush=True)\n"
                                             "from memory_service.cli.main import app\napp(prog_name='memory-service')"]
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "server.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([*command, "serve", "--port", str(self.port), "--data-dir", str(data_dir / "store"),
                                      "--log-level", "warning", "--no-worker"],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)

    async def ready(self) -> tuple[str, str]:
        """Waits for /health, makes the two agents and a write key each: (heavy key, light key)."""
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as http:
            for _ in range(1200):
                if self.proc.poll() is not None:
                    raise SystemExit(f"the server exited ({self.proc.returncode}): {self.tail()}")
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            operator = {"Authorization": f"Bearer {self.operator}"}
            keys = []
            for agent in (HEAVY, LIGHT):
                assert (await http.put(f"/v1/agents/{agent}", json={}, headers=operator)).status_code == 200
                made = await http.post("/v1/keys", headers=operator, json={
                    "name": agent, "role": "write", "agents": [agent], "requests_per_minute": 0, "tokens_per_minute": 0})
                assert made.status_code in (200, 201), made.text
                keys.append(made.json()["key"])
            return keys[0], keys[1]

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def cpu_of(pid: int) -> tuple[float, float]:
    """Seconds a process (and its children: the embedded store) ran, and waited on a run queue
    for a core (Linux schedstat; zeros elsewhere)."""
    ran = waited = 0.0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return 0.0, 0.0
    for one in pids:
        for task in Path(f"/proc/{one}/task").glob("*"):
            try:
                run, wait, _ = (task / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            ran, waited = ran + int(run) / 1e9, waited + int(wait) / 1e9
    return ran, waited


def cpu_per_second(before: tuple[float, float], after: tuple[float, float], seconds: float) -> dict:
    return {"server_ran_per_s": (after[0] - before[0]) / seconds, "server_waited_per_s": (after[1] - before[1]) / seconds}


def light_summary(samples: list[tuple[str, str, float]]) -> dict:
    def stats(values: list[float]) -> dict:
        return {"n": len(values), "p50_ms": statistics.median(values) * 1e3 if values else None,
                "p95_ms": p95(values) * 1e3 if values else None}
    return {"all": stats([s for _, _, s in samples]),
            **{route: stats([s for r, _, s in samples if r == route]) for route in ("record", "context")},
            "statuses": dict(Counter(status for _, status, _ in samples))}


async def one_variant(name: str, code: Path | None, args: argparse.Namespace, tmp: Path, rep: int) -> dict:
    own = [e.split(":", 1)[1] for e in args.variant_env if e.split(":", 1)[0] == name]
    server = Server(code, tmp / f"{name}-{rep}", dict(e.split("=", 1) for e in [*args.env, *own]))
    try:
        heavy_key, light_key = await server.ready()
        code_line = [line for line in server.tail().splitlines() if line.startswith("code:")]
        result: dict = {"variant": name, "code": code_line[0] if code_line else "this checkout", "phases": {}}
        light_result(run_light(server.base_url, light_key, args.light_rate, 2, f"warm{rep}"))  # warm-up
        cpu0, t0 = cpu_of(server.proc.pid), time.monotonic()
        result["phases"]["alone"] = {"light": light_summary(light_result(
            run_light(server.base_url, light_key, args.light_rate, args.alone_seconds, f"alone{rep}"))),
            **cpu_per_second(cpu0, cpu_of(server.proc.pid), time.monotonic() - t0)}
        for phase in ("batches", "large"):
            if phase == "large" and not args.large_mb:
                continue
            heavy = Heavy()
            if phase == "large":  # built before the clock starts: 32 MB of JSON is seconds of the client's CPU
                size = 1000
                chars = int(args.large_mb * 1_000_000 / size) - 130  # the item's JSON around its content
                bodies = [batch_body(f"l{rep}", 100 + i, 0, size, chars) for i in range(args.large_clients)]
            started = time.monotonic()
            if phase == "batches":
                stop_at = started + args.seconds + 2
                tasks = [asyncio.create_task(heavy_client(server.base_url, heavy_key, i, args.batch, args.chars,
                                                          stop_at, heavy, f"b{rep}")) for i in range(args.clients)]
                window = args.seconds
            else:
                tasks = [asyncio.create_task(heavy_client(server.base_url, heavy_key, 100 + i, size, chars,
                                                          started, heavy, f"l{rep}", bodies[i]))
                         for i in range(args.large_clients)]
                window = args.large_seconds
            await asyncio.sleep(2)  # the heavy load builds up
            cpu0, t0 = cpu_of(server.proc.pid), time.monotonic()
            light = run_light(server.base_url, light_key, args.light_rate, window, f"{phase}{rep}")
            samples = await asyncio.to_thread(light_result, light)
            cpu = cpu_per_second(cpu0, cpu_of(server.proc.pid), time.monotonic() - t0)
            try:
                await asyncio.wait_for(asyncio.gather(*tasks), args.drain_timeout)
            except TimeoutError:
                heavy.violations.append(f"{phase}: heavy batches still running {args.drain_timeout:.0f} s after "
                                        "the light agent's window")
                for task in tasks:
                    task.cancel()
            elapsed = time.monotonic() - started
            result["phases"][phase] = {
                "light": light_summary(samples), "heavy_statuses": dict(heavy.statuses),
                "heavy_recorded_per_s": heavy.recorded / elapsed, "heavy_recorded": heavy.recorded,
                "heavy_p50_s": statistics.median(heavy.seconds) if heavy.seconds else None,
                "heavy_max_s": max(heavy.seconds) if heavy.seconds else None, "violations": heavy.violations, **cpu}
        alone = result["phases"]["alone"]["light"]["all"]["p95_ms"]
        for phase in ("batches", "large"):
            if phase in result["phases"]:
                during = result["phases"][phase]["light"]["all"]["p95_ms"]
                result["phases"][phase]["light_p95_ratio"] = during / alone if alone and during else None
        if violations_of(result):
            result["server_log_tail"] = server.tail()
        return result
    finally:
        server.stop()


def violations_of(result: dict) -> list[str]:
    found = []
    for phase, data in result["phases"].items():
        for status, count in data["light"]["statuses"].items():
            if status != "200":
                found.append(f"{result['variant']} {phase}: the light agent got {count} x {status}")
        found += [f"{result['variant']} {phase}: {v}" for v in data.get("violations", [])]
    return found


async def main(args: argparse.Namespace) -> int:
    from common import print_machine
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    header = print_machine(console, "neighbour_bench")
    codes: dict[str, Path | None] = {}
    for item in args.code or ["after=."]:
        name, _, where = item.partition("=")
        codes[name] = None if where in ("", ".") else Path(where)
    console.print(f"variants: {codes}; server env overrides: {args.env}; {vars(args)}")
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="neighbour-bench-") as tmp:
        for rep in range(args.repeat):
            for name, code in codes.items():
                result = await one_variant(name, code, args, Path(tmp), rep)
                result["repetition"] = rep
                results.append(result)
                b = result["phases"]["batches"]["light"]["all"]
                console.print(f"rep {rep + 1} {name}: light p95 alone {result['phases']['alone']['light']['all']['p95_ms']:.0f} ms, "
                              f"during batches {b['p95_ms']:.0f} ms"
                              + (f", during large {result['phases']['large']['light']['all']['p95_ms']:.0f} ms"
                                 if "large" in result["phases"] else ""))
    table = Table(title="the light agent (ms) while the heavy agent saturates; heavy: its answers")
    for column in ("variant", "rep", "phase", "light n", "light p50", "light p95", "p95 ratio", "record p95",
                   "context p95", "light statuses", "heavy statuses", "heavy msg/s", "heavy batch p50 / max s",
                   "server ran / waited s/s"):
        table.add_column(column, justify="left" if column in ("variant", "phase", "light statuses", "heavy statuses")
                         else "right")
    for r in results:
        for phase, d in r["phases"].items():
            light = d["light"]
            table.add_row(r["variant"], str(r["repetition"] + 1), phase, str(light["all"]["n"]),
                          f"{light['all']['p50_ms']:.0f}", f"{light['all']['p95_ms']:.0f}",
                          f"{d['light_p95_ratio']:.1f}x" if d.get("light_p95_ratio") else "-",
                          f"{light['record']['p95_ms']:.0f}", f"{light['context']['p95_ms']:.0f}",
                          ", ".join(f"{k}: {v}" for k, v in light["statuses"].items()),
                          ", ".join(f"{k}: {v}" for k, v in d.get("heavy_statuses", {}).items()) or "-",
                          f"{d['heavy_recorded_per_s']:.0f}" if "heavy_recorded_per_s" in d else "-",
                          f"{d['heavy_p50_s']:.1f} / {d['heavy_max_s']:.1f}" if d.get("heavy_p50_s") else "-",
                          f"{d['server_ran_per_s']:.2f} / {d['server_waited_per_s']:.2f}")
    console.print(table)
    medians: dict = {}
    for name in codes:
        mine = [r for r in results if r["variant"] == name]
        for phase in ("alone", "batches", "large"):
            rows = [r["phases"][phase] for r in mine if phase in r["phases"]]
            if not rows:
                continue
            med = {"light_p50_ms": statistics.median(d["light"]["all"]["p50_ms"] for d in rows),
                   "light_p95_ms": statistics.median(d["light"]["all"]["p95_ms"] for d in rows),
                   "light_p95_range_ms": [min(d["light"]["all"]["p95_ms"] for d in rows),
                                          max(d["light"]["all"]["p95_ms"] for d in rows)]}
            if phase != "alone":
                med["light_p95_ratio"] = statistics.median(d["light_p95_ratio"] for d in rows)
                med["light_p95_ratio_range"] = [min(d["light_p95_ratio"] for d in rows),
                                                max(d["light_p95_ratio"] for d in rows)]
                med["heavy_recorded_per_s"] = statistics.median(d["heavy_recorded_per_s"] for d in rows)
            medians.setdefault(name, {})[phase] = med
            console.print(f"{name} {phase}: light p50 {med['light_p50_ms']:.0f} ms, p95 {med['light_p95_ms']:.0f} ms "
                          f"(range {med['light_p95_range_ms'][0]:.0f}-{med['light_p95_range_ms'][1]:.0f})"
                          + (f", p95 ratio to alone {med['light_p95_ratio']:.1f}x (range "
                             f"{med['light_p95_ratio_range'][0]:.1f}-{med['light_p95_ratio_range'][1]:.1f}), heavy "
                             f"{med['heavy_recorded_per_s']:.0f} msg/s" if phase != "alone" else ""))
    console.print(f"load average at the end: {list(os.getloadavg())}")
    violations = [v for r in results for v in violations_of(r)]
    for line in violations[:30]:
        console.print(f"[red]FAIL[/red] {line}")
    for r in results:
        if "server_log_tail" in r:
            console.print(f"server log of {r['variant']} repetition {r['repetition'] + 1}:\n{r['server_log_tail']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header, "args": vars(args), "results": results,
                                               "medians": medians, "violations": violations,
                                               "load_avg_end": list(os.getloadavg())}, indent=2))
    return 1 if violations else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--light":  # the light agent's process
        base_url, key, rate, seconds, tag = sys.argv[2:7]
        print(json.dumps(asyncio.run(light_loop(base_url, key, float(rate), float(seconds), tag))))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="a checkout to run (repeatable; default: after=. , this checkout)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of every variant's server, e.g. API_MAX_CONCURRENT_PER_AGENT=0")
    parser.add_argument("--variant-env", action="append", default=[], metavar="NAME:KEY=VALUE",
                        help="a setting of one variant's server (repeatable), e.g. share1:API_BULK_SHARE=1 with "
                             "--code share1=.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", type=int, default=50, help="the heavy agent's clients in the batches phase")
    parser.add_argument("--batch", type=int, default=100, help="messages per batch in the batches phase")
    parser.add_argument("--chars", type=int, default=300, help="characters per message in the batches phase")
    parser.add_argument("--seconds", type=float, default=30, help="the light agent's window in the batches phase")
    parser.add_argument("--alone-seconds", type=float, default=15, help="the light agent's window alone")
    parser.add_argument("--light-rate", type=float, default=5, help="the light agent's requests per second")
    parser.add_argument("--large-clients", type=int, default=4)
    parser.add_argument("--large-mb", type=float, default=8, help="size of each large batch (0: no large phase)")
    parser.add_argument("--large-seconds", type=float, default=20, help="the light agent's window in the large phase")
    parser.add_argument("--drain-timeout", type=float, default=300, help="longest wait for the heavy batches to end")
    parser.add_argument("--json", help="also write the results here")
    sys.exit(asyncio.run(main(parser.parse_args())))
