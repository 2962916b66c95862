"""Benchmark: message ingest through the HTTP API, with many concurrent clients (issue 8).

Starts a real ``memory-service serve`` (embedded store, the in-process worker) on a
loopback port, in a temporary data directory, once per embedder asked for (``local``, the
default model, and ``hash``, no model, to separate the embedding cost). Then, per
repetition:

* **baseline**: the same clients against ``GET /health/live`` (a route that touches no
  dependency): what this HTTP stack (uvicorn, FastAPI, the httpx clients, all on this
  machine's cores) answers at most;
* **ingest**: C clients (default 64) post M messages (default 10,240) over S sessions
  (default 256) of A agents (default 4): each client takes the next session and posts its
  turns in order (short generated chat turns, user and assistant, one or two users per
  session), then the next session;
* **drain**: from the last acknowledgement, how long until every window the gates opened is
  formed (``GET /v1/sessions/{id}``: no pending job, gate closed) — *formation lag* — and
  until no message waits for its embedding (a read-only count on the store) —
  *embedding lag*.

Reported per embedder (medians over the repetitions, each repetition's own p50/p95/p99):
messages/s, request latency, errors by status, CPU busy of the API process (API + worker +
embedder), of the store (redis-server with FalkorDB) and of this client process (1.0 = one
core), formation and embedding lag, ratio = ingest messages/s ÷ baseline requests/s, and
*embedded per message*: the growth of the embedding counters (record-time runs, embedding
jobs, backfill) over the repetition, once they stop moving, ÷ messages sent (1.00: every
message embedded once). ``--align-cron S`` starts each ingest S seconds before an even
minute, when the worker's backfill cron runs, so that it meets the backlog; ``--turn-chars
N`` makes turns of about N characters.

Correctness, checked on every run (a violation prints FAIL and exits 1): every record
answers 200, not a duplicate, with its session's next sequence number; afterwards the
store holds exactly the messages sent, and every session's formed + pending messages equal
what it was sent. Speed never changes the exit status.

    .venv/bin/python bench/ingest_bench.py                          # local and hash, 3 repetitions
    .venv/bin/python bench/ingest_bench.py --embedders hash --repeat 1 --messages 2000 --sessions 64
    .venv/bin/python bench/ingest_bench.py --quick                  # smoke run
    .venv/bin/python bench/ingest_bench.py --route batch --clients 4 --batch-size 500 --embedders hash

With ``--route batch`` the same messages go through POST /v1/agents/{id}/messages/batch:
each client sends the batches of its own sessions (many sessions a batch, one agent's),
one after the other, so each session's messages arrive in order; messages/s counts
messages, latency is per request, and every item must come back ``recorded`` with its
session's next sequence number.
    .venv/bin/python bench/ingest_bench.py --code before=/tmp/old-checkout --code after=.   # two versions

With ``--code NAME=DIR`` (repeatable) each named checkout's server runs (the same venv,
``DIR`` first on the import path), all started at once and measured in turn within each
repetition, which one goes first alternating: drift on a shared machine hits all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
import psutil  # noqa: E402
from common import print_machine  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.graph import graph_name  # noqa: E402
from memory_service.backends.loopback import free_port  # noqa: E402
from memory_service.domain.namespaces import Namespace  # noqa: E402

CLI = HERE.parent / ".venv" / "bin" / "memory-service"
STORE_ENV = ("FALKORDB_URL", "REDIS_URL", "MONGODB_URI")

# --- generated conversations ----------------------------------------------------------------

CITIES = ["Lisbon", "Porto", "Kyoto", "Oslo", "Lima", "Quebec", "Seville", "Tallinn", "Hanoi", "Cusco"]
FOODS = ["ramen", "tapas", "ceviche", "dumplings", "pastel de nata", "falafel", "pho", "paella"]
THINGS = ["window seats", "late check-out", "quiet rooms", "early flights", "trains", "vegetarian menus",
          "museums", "long walks", "street food", "hotels near the station"]
USER_TURNS = [
    "I prefer {thing} whenever we travel.",
    "Can you find a hotel in {city} for the {day}th?",
    "My flight to {city} leaves at {hour} am, can we plan around it?",
    "I'd love to try {food} while we are in {city}.",
    "Please avoid {thing} this time, they were a pain last trip.",
    "What's the weather like in {city} around the {day}th?",
    "Book a table for {n} people, somewhere with {food}.",
    "Remind me to pack the charger before we go to {city}.",
    "My budget is about {n}00 euros for the whole week.",
    "Is there a train from {city} to {city2} in the morning?",
]
ASSISTANT_TURNS = [
    "Noted: {thing} it is. I will keep that in mind for {city}.",
    "I found three hotels in {city}; the second one is {n} minutes from the station.",
    "The flight at {hour} am works; I will plan the first day lightly.",
    "There is a well reviewed {food} place two streets from your hotel in {city}.",
    "Understood, no {thing}. I will look for alternatives.",
    "It should be mild in {city}, around {n}0 degrees, with some rain in the evening.",
    "I booked a table for {n} at a {food} restaurant at {hour} pm.",
    "I will remind you the evening before you leave for {city}.",
    "With {n}00 euros we can keep two nights in {city} and the rest in {city2}.",
    "Yes, a train leaves {city} at {hour}:15 and reaches {city2} before noon.",
]


def turn(rng: random.Random, role: str, chars: int = 0) -> str:
    """A generated chat turn; with ``chars``, turns joined up to about that many characters."""
    text = ""
    while not text or len(text) < chars:
        template = rng.choice(USER_TURNS if role == "user" else ASSISTANT_TURNS)
        city, city2 = rng.sample(CITIES, 2)
        text += (" " if text else "") + template.format(
            thing=rng.choice(THINGS), city=city, city2=city2, food=rng.choice(FOODS), day=rng.randint(1, 28),
            hour=rng.randint(5, 11), n=rng.randint(2, 9))
    return text


@dataclass
class Session:
    session_id: str
    agent_id: str
    messages: list[dict]


def conversations(tag: str, sessions: int, messages: int, agents: int, seed: int, chars: int = 0) -> list[Session]:
    rng = random.Random(seed)
    per, extra = divmod(messages, sessions)
    out = []
    for s in range(sessions):
        agent = f"bench-a{s % agents}"
        users = [f"u{rng.randint(0, 999)}" for _ in range(1 if s % 3 else 2)]
        rows = []
        for i in range(per + (1 if s < extra else 0)):
            role = "user" if i % 2 == 0 else "assistant"
            rows.append({"agent_id": agent, "user_id": users[(i // 2) % len(users)], "role": role,
                         "content": turn(rng, role, chars), "message_id": f"m{i}"})
        out.append(Session(f"{tag}-s{s}", agent, rows))
    return out


# --- the server ------------------------------------------------------------------------------


class Server:
    """``memory-service serve`` in a child process, on a loopback port and a temporary data dir."""

    def __init__(self, embedder: str, data_dir: Path, code: Path | None = None, worker_process: bool = False):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in STORE_ENV}
        env["EMBEDDER"] = embedder
        command, cwd = [str(CLI)], None
        if code is not None:  # another checkout, ahead of the installed one on the import path (and as the
            # working directory: `python -c` puts it first), checked in the log
            env["PYTHONPATH"] = cwd = str(code.resolve())
            # (the CLI's module moved in the layout of issue 15: a checkout from before it has memory_service/cli.py)
            command = [sys.executable, "-c", "import memory_service as m; print('code:', m.__file__, flush=True)\n"
                                             "try:\n    from memory_service.cli.main import app\n"
                                             "except ImportError:\n    from memory_service.cli import app\n"
                                             "app(prog_name='memory-service')"]
        self.log = open(data_dir / "server.log", "w")
        self.proc = subprocess.Popen([*command, "serve", "--port", str(self.port), "--data-dir", str(data_dir / "store"),
                                      "--log-level", "warning", *(["--no-worker"] if worker_process else [])],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)
        self.worker_proc: subprocess.Popen | None = None
        if worker_process:  # started once the store is up (it attaches to the serve's store)
            self._worker_command = [*command, "worker", "--data-dir", str(data_dir / "store"), "--log-level", "warning"]
            self._env, self._cwd = env, cwd

    async def ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.base_url, timeout=5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.tail()}")
                try:
                    if (await client.get("/health")).status_code == 200:
                        if hasattr(self, "_worker_command") and self.worker_proc is None:
                            self.worker_proc = subprocess.Popen(self._worker_command, env=self._env, stdout=self.log,
                                                                stderr=subprocess.STDOUT, cwd=self._cwd)
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.25)
        raise RuntimeError(f"the server did not answer in {timeout:.0f} s: {self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return (self.data_dir / "server.log").read_text()[-3000:]

    @property
    def api(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    @property
    def worker(self) -> psutil.Process | None:
        return psutil.Process(self.worker_proc.pid) if self.worker_proc else None

    @property
    def store(self) -> psutil.Process:
        return psutil.Process(int((self.data_dir / "store" / "falkordb.pid").read_text()))

    @property
    def store_url(self) -> str:
        return (self.data_dir / "store" / "falkordb.url").read_text().strip()

    def stop(self) -> None:
        if self.worker_proc is not None and self.worker_proc.poll() is None:
            self.worker_proc.send_signal(signal.SIGINT)
            try:
                self.worker_proc.wait(60)
            except subprocess.TimeoutExpired:
                self.worker_proc.kill()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class CpuMeter:
    """CPU seconds ÷ wall seconds of the API process, the store and this process."""

    def __init__(self, server: Server):
        self.processes = {"api": server.api, "store": server.store, "client": psutil.Process()}
        if server.worker is not None:
            self.processes["worker"] = server.worker

    def __enter__(self) -> CpuMeter:
        self.start = {name: cpu_seconds(p) for name, p in self.processes.items()}
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.wall
        self.busy = {name: (cpu_seconds(p) - self.start[name]) / wall for name, p in self.processes.items()}


# --- one repetition --------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


@dataclass
class Figures:
    rate: float  # per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int
    errors: dict[str, int]
    cpu: dict[str, float]


@dataclass
class Repetition:
    baseline: Figures
    ingest: Figures
    formation_lag_s: float | None = None  # None: not drained before the timeout
    embedding_lag_s: float | None = None
    embeddings: dict[str, float] = field(default_factory=dict)  # the embedding counters' growth in the repetition
    embedded_per_message: float | None = None  # their sum / messages sent (1.0: each embedded once)
    windows_formed: int = 0
    problems: list[str] = field(default_factory=list)


def client_pool(server: Server, clients: int) -> list[httpx.AsyncClient]:
    """One client (one connection) per simulated host. A single httpx client with a pool of
    64 connections spends most of its CPU choosing a connection (about 350 requests/s
    here against 1,600 with one client each, on a trivial route)."""
    return [httpx.AsyncClient(base_url=server.base_url, timeout=60) for _ in range(clients)]


async def close_all(clients: list[httpx.AsyncClient]) -> None:
    await asyncio.gather(*(c.aclose() for c in clients))


async def baseline(clients: list[httpx.AsyncClient], server: Server, requests: int) -> Figures:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    remaining = iter(range(requests))

    async def one_client(client: httpx.AsyncClient) -> None:
        for _ in remaining:
            start = time.perf_counter()
            try:
                status = (await client.get("/health/live")).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            latencies.append(time.perf_counter() - start)
            statuses[str(status)] += 1

    with CpuMeter(server) as cpu:
        started = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in clients))
        wall = time.perf_counter() - started
    return figures(latencies, statuses, wall, cpu)


def figures(latencies: list[float], statuses: Counter, wall: float, cpu: CpuMeter) -> Figures:
    ms = [x * 1000 for x in latencies]
    return Figures(rate=len(latencies) / wall, p50_ms=quantile(ms, 0.5), p95_ms=quantile(ms, 0.95),
                   p99_ms=quantile(ms, 0.99), requests=len(latencies),
                   errors={s: n for s, n in statuses.items() if s != "200"}, cpu=cpu.busy)


async def ingest(clients: list[httpx.AsyncClient], server: Server, sessions: list[Session],
                 problems: list[str]) -> tuple[Figures, float]:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    queue = iter(sessions)

    async def one_client(client: httpx.AsyncClient) -> None:
        for session in queue:
            for position, body in enumerate(session.messages, 1):
                start = time.perf_counter()
                try:
                    answer = await client.post(f"/v1/sessions/{session.session_id}/messages", json=body)
                    status = answer.status_code
                except httpx.HTTPError as exc:
                    answer, status = None, type(exc).__name__
                latencies.append(time.perf_counter() - start)
                statuses[str(status)] += 1
                if answer is not None and status == 200:
                    got = answer.json()
                    if got["duplicate"] or got["sequence"] != position:
                        problems.append(f"{session.session_id}/{body['message_id']}: duplicate={got['duplicate']} "
                                        f"sequence={got['sequence']}, expected {position}")
                elif len(problems) < 20:
                    problems.append(f"{session.session_id}/{body['message_id']}: {status} "
                                    f"{answer.text[:200] if answer is not None else ''}")

    with CpuMeter(server) as cpu:
        started = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in clients))
        last_ack = time.perf_counter()
    return figures(latencies, statuses, last_ack - started, cpu), last_ack


def batches_of(sessions: list[Session], batch_size: int) -> list[tuple[str, list[dict]]]:
    """``sessions``' messages as batches of one agent's messages (``batch_size`` at most),
    the sessions interleaved (each batch spans many sessions), each session's in order."""
    out: list[tuple[str, list[dict]]] = []
    for agent in sorted({s.agent_id for s in sessions}):
        mine = [s for s in sessions if s.agent_id == agent]
        rows = [(s, i) for i in range(max(len(s.messages) for s in mine)) for s in mine if i < len(s.messages)]
        items = [{k: v for k, v in s.messages[i].items() if k != "agent_id"} | {"session_id": s.session_id}
                 for s, i in rows]
        out += [(agent, items[k:k + batch_size]) for k in range(0, len(items), batch_size)]
    return out


async def ingest_batches(clients: list[httpx.AsyncClient], server: Server, sessions: list[Session], batch_size: int,
                         problems: list[str]) -> tuple[Figures, float]:
    """The same messages through POST /v1/agents/{id}/messages/batch: client k sends the
    batches of the sessions k, k + C, ... one after the other (so each session's messages
    arrive in order); rate in messages/s, latency per request."""
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    positions = {(s.session_id, m["message_id"]): i for s in sessions for i, m in enumerate(s.messages, 1)}
    sent = [0]

    async def one_client(k: int, client: httpx.AsyncClient) -> None:
        for agent, items in batches_of(sessions[k::len(clients)], batch_size):
            start = time.perf_counter()
            try:
                answer = await client.post(f"/v1/agents/{agent}/messages/batch", json={"messages": items})
                status = answer.status_code
            except httpx.HTTPError as exc:
                answer, status = None, type(exc).__name__
            latencies.append(time.perf_counter() - start)
            statuses[str(status)] += 1
            if answer is None or status != 200:
                problems.append(f"batch of {agent}: {status} {answer.text[:200] if answer is not None else ''}")
                continue
            sent[0] += len(items)
            for got in answer.json()["items"]:
                expected = positions[(got["session_id"], got["message_id"])]
                if got["status"] != "recorded" or got["sequence"] != expected:
                    problems.append(f"{got['session_id']}/{got['message_id']}: {got['status']} sequence "
                                    f"{got['sequence']}, expected recorded {expected} ({got.get('detail')})")

    with CpuMeter(server) as cpu:
        started = time.perf_counter()
        await asyncio.gather(*(one_client(k, c) for k, c in enumerate(clients)))
        last_ack = time.perf_counter()
    result = figures(latencies, statuses, last_ack - started, cpu)
    result.rate = sent[0] / (last_ack - started)  # messages, not requests
    return result, last_ack


async def unembedded_messages(store_url: str, agents: list[str]) -> int:
    from falkordb.asyncio import FalkorDB

    db = FalkorDB.from_url(store_url)
    try:
        total = 0
        for agent in agents:
            graph = db.select_graph(graph_name(agent))
            result = await graph.ro_query("MATCH (n:Episodic) WHERE n.needs_embedding = true AND n.kind = 'message' "
                                          "RETURN count(n)")
            total += int(result.result_set[0][0])
        return total
    finally:
        await db.aclose()


EMBEDDING_COUNTERS = ("embedded_at_record", "embedded_after_record", "embeddings_backfilled")


async def embedding_counters(store_url: str) -> dict[str, float]:
    """The deployment's embedding counters (the metrics' shards in Redis, summed)."""
    from redis.asyncio import Redis

    from memory_service.state import keyspace

    redis = Redis.from_url(store_url, decode_responses=True)
    try:
        totals = dict.fromkeys(EMBEDDING_COUNTERS, 0.0)
        for tag in keyspace.metric_tags():
            shard = await redis.hmget(keyspace.metrics(tag), list(EMBEDDING_COUNTERS))
            for name, value in zip(EMBEDDING_COUNTERS, shard):
                totals[name] += float(value or 0)
        return totals
    finally:
        await redis.aclose()


async def settled_counters(store_url: str, quiet: float = 3.0, timeout: float = 60.0) -> dict[str, float]:
    """The embedding counters once they stopped moving for ``quiet`` seconds: a path still
    embedding what it read before the backlog drained (the backfill's last batch) is counted."""
    last, since, deadline = await embedding_counters(store_url), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        await asyncio.sleep(0.5)
        now = await embedding_counters(store_url)
        if now != last:
            last, since = now, time.monotonic()
    return last


async def before_the_cron(lead: float, console: Console) -> None:
    """Wait until the worker's backfill cron (every even minute) is ``lead`` seconds away, so
    that it runs while the repetition's backlog is being embedded."""
    wait = (120 - lead - time.time() % 120) % 120
    console.print(f"waiting {wait:.0f} s: the backfill cron then fires {lead:.0f} s into the ingest")
    await asyncio.sleep(wait)


async def stored_messages(store_url: str, agents: list[str], session_ids: set[str]) -> int:
    from falkordb.asyncio import FalkorDB

    db = FalkorDB.from_url(store_url)
    try:
        total = 0
        for agent in agents:
            graph = db.select_graph(graph_name(agent))
            result = await graph.ro_query("MATCH (n:Episodic) WHERE n.kind = 'message' RETURN n.group_id, count(n)")
            groups = {Namespace.session(s).group_id for s in session_ids}
            total += sum(int(c) for g, c in result.result_set if g in groups)
        return total
    finally:
        await db.aclose()


async def drain(client: httpx.AsyncClient, server: Server, sessions: list[Session], last_ack: float, timeout: float,
                rep: Repetition) -> None:
    """Formation and embedding lag after the last acknowledgement; then the stored counts."""
    agents = sorted({s.agent_id for s in sessions})
    unsettled = {s.session_id for s in sessions}
    status: dict[str, dict] = {}
    deadline = last_ack + timeout
    limiter = asyncio.Semaphore(16)

    async def poll(session_id: str) -> None:
        async with limiter:
            reply = await client.get(f"/v1/sessions/{session_id}")
        if reply.status_code != 200:  # shed under load (503 with Retry-After): asked again next round
            return
        body = reply.json()
        status[session_id] = body
        if body["pending_job"] is None and not body["gate"]["open"]:
            unsettled.discard(session_id)

    async def formed() -> None:
        while time.perf_counter() < deadline:
            await asyncio.gather(*(poll(sid) for sid in list(unsettled)))
            if not unsettled:
                rep.formation_lag_s = time.perf_counter() - last_ack
                return
            await asyncio.sleep(0.1)

    async def embedded() -> None:
        while time.perf_counter() < deadline:
            if await unembedded_messages(server.store_url, agents) == 0:
                rep.embedding_lag_s = time.perf_counter() - last_ack
                return
            await asyncio.sleep(0.1)

    await asyncio.gather(formed(), embedded())
    if rep.formation_lag_s is None:
        rep.problems.append(f"{len(unsettled)} session(s) still forming {timeout:.0f} s after the last record")
    if rep.embedding_lag_s is None:
        rep.problems.append(f"messages still waiting for their embedding {timeout:.0f} s after the last record")
    status.clear()
    for _ in range(60):  # every session read afresh (one shed under load is asked again)
        await asyncio.gather(*(poll(s.session_id) for s in sessions if s.session_id not in status))
        if len(status) == len(sessions):
            break
        await asyncio.sleep(0.5)
    for s in sessions:
        body = status[s.session_id]
        accounted = body["formed_messages"] + body["gate"]["pending_messages"]
        if accounted != len(s.messages):
            rep.problems.append(f"{s.session_id}: formed {body['formed_messages']} + pending "
                                f"{body['gate']['pending_messages']} != {len(s.messages)} sent")
    rep.windows_formed = sum(status[s.session_id]["formed_windows"] for s in sessions)
    sent = sum(len(s.messages) for s in sessions)
    stored = await stored_messages(server.store_url, agents, {s.session_id for s in sessions})
    if stored != sent:
        rep.problems.append(f"the store holds {stored} of the {sent} messages sent")


class Variant:
    """One checkout's server, its clients and its repetitions."""

    def __init__(self, name: str, code: Path | None, embedder: str, tmp: Path, args: argparse.Namespace):
        self.name, self.embedder, self.args = name, embedder, args
        self.server = Server(embedder, tmp / name, code, worker_process=args.worker_process)
        self.reps: list[Repetition] = []

    async def start(self, console: Console) -> None:
        started = time.perf_counter()
        await self.server.ready()
        code = [line for line in self.server.tail().splitlines() if line.startswith("code:")]
        console.print(f"{self.label} server up in {time.perf_counter() - started:.1f} s (pid {self.server.proc.pid})"
                      + (f", {code[0]}" if code else ""))
        self.clients = client_pool(self.server, self.args.clients)
        self.client = httpx.AsyncClient(base_url=self.server.base_url, timeout=60)
        # Warm-up, not timed: the agents' graphs and indexes exist, connections are open.
        a = self.args
        warm = conversations("warm", a.agents * 4, a.agents * 16, a.agents, seed=1)
        await ingest(self.clients[:len(warm)], self.server, warm, [])
        await baseline(self.clients, self.server, min(a.baseline_requests, 500))

    @property
    def label(self) -> str:
        return escape(f"[{self.name}, {self.embedder}]")

    async def repetition(self, r: int, console: Console) -> None:
        a = self.args
        base = await baseline(self.clients, self.server, a.baseline_requests)
        sessions = conversations(f"r{r}", a.sessions, a.messages, a.agents, seed=100 + r, chars=a.turn_chars)
        problems: list[str] = []
        counted = await embedding_counters(self.server.store_url)
        if a.align_cron is not None:
            await before_the_cron(a.align_cron, console)
        if a.route == "batch":
            figures_, last_ack = await ingest_batches(self.clients, self.server, sessions, a.batch_size, problems)
        else:
            figures_, last_ack = await ingest(self.clients, self.server, sessions, problems)
        rep = Repetition(base, figures_, problems=problems)
        await drain(self.client, self.server, sessions, last_ack, a.drain_timeout, rep)
        after = await settled_counters(self.server.store_url)
        rep.embeddings = {name: after[name] - counted[name] for name in EMBEDDING_COUNTERS}
        rep.embedded_per_message = sum(rep.embeddings.values()) / sum(len(s.messages) for s in sessions)
        self.reps.append(rep)
        console.print(f"{self.label} repetition {r + 1}: ingest {figures_.rate:.0f} msg/s "
                      f"(p95 {figures_.p95_ms:.0f} ms), baseline {base.rate:.0f} req/s, "
                      f"formation lag {fmt_lag(rep.formation_lag_s)}, embedding lag "
                      f"{fmt_lag(rep.embedding_lag_s)}, cpu api {figures_.cpu['api']:.2f} "
                      f"store {figures_.cpu['store']:.2f} client {figures_.cpu['client']:.2f}, embedded per message "
                      f"{rep.embedded_per_message:.2f} ({', '.join(f'{k} {v:.0f}' for k, v in rep.embeddings.items())})"
                      + (f", [red]{len(rep.problems)} problem(s)[/red]" if rep.problems else ""))

    async def stop(self) -> None:
        if hasattr(self, "clients"):
            await close_all(self.clients)
            await self.client.aclose()
        self.server.stop()


async def run_embedder(embedder: str, codes: dict[str, Path | None], args: argparse.Namespace,
                       console: Console) -> dict[str, list[Repetition]]:
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        variants = [Variant(name, code, embedder, Path(tmp), args) for name, code in codes.items()]
        try:
            for v in variants:
                await v.start(console)
            for r in range(args.repeat):
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    await v.repetition(r, console)
            return {v.name: v.reps for v in variants}
        finally:
            for v in variants:
                await v.stop()


def fmt_lag(value: float | None) -> str:
    return "not drained" if value is None else f"{value:.1f} s"


def median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(results: dict[str, dict[str, list[Repetition]]], args: argparse.Namespace) -> Table:
    route = f"batches of {args.batch_size}" if args.route == "batch" else "one message a request"
    t = Table(title=f"{route}, {args.clients} clients, {args.messages} messages over {args.sessions} sessions of "
                    f"{args.agents} agents; medians over {args.repeat} repetition(s); CPU ms = CPU time per "
                    "message (per request for the baseline)")
    for column in ("embedder", "code", "ingest msg/s", "p50 ms", "p95 ms", "p99 ms", "errors", "baseline req/s",
                   "ratio", "api cores", "api CPU ms", "worker CPU ms", "store CPU ms", "client CPU ms",
                   "baseline api CPU ms", "formation lag s", "embedding lag s", "embedded per message", "windows"):
        t.add_column(column, justify="left" if column in ("embedder", "code") else "right")
    for embedder, code, reps in ((e, c, reps) for e, by_code in results.items() for c, reps in by_code.items()):
        def m(get) -> float | None:
            return median([get(r) for r in reps])

        def f(value: float | None, digits: int = 1) -> str:
            return "-" if value is None else f"{value:,.{digits}f}"

        def per(r: Repetition, name: str, figures: str = "ingest") -> float | None:
            fig = getattr(r, figures)
            return fig.cpu[name] / fig.rate * 1000 if name in fig.cpu else None

        errors = Counter()
        for r in reps:
            errors.update(r.ingest.errors)
        t.add_row(embedder, code, f(m(lambda r: r.ingest.rate), 0), f(m(lambda r: r.ingest.p50_ms)),
                  f(m(lambda r: r.ingest.p95_ms)), f(m(lambda r: r.ingest.p99_ms)),
                  ", ".join(f"{s}: {n}" for s, n in sorted(errors.items())) or "0",
                  f(m(lambda r: r.baseline.rate), 0), f(m(lambda r: r.ingest.rate / r.baseline.rate), 2),
                  f(m(lambda r: r.ingest.cpu["api"]), 2), f(m(lambda r: per(r, "api")), 2),
                  f(m(lambda r: per(r, "worker")), 2), f(m(lambda r: per(r, "store")), 2),
                  f(m(lambda r: per(r, "client")), 2), f(m(lambda r: per(r, "api", "baseline")), 2),
                  f(m(lambda r: r.formation_lag_s)), f(m(lambda r: r.embedding_lag_s)),
                  f(m(lambda r: r.embedded_per_message), 2), f(m(lambda r: r.windows_formed), 0))
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--messages", type=int, default=10_240, help="messages per repetition")
    parser.add_argument("--sessions", type=int, default=256, help="sessions per repetition")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--embedders", default="local,hash", help="comma-separated: local, hash")
    parser.add_argument("--baseline-requests", type=int, default=5000)
    parser.add_argument("--drain-timeout", type=float, default=600, help="seconds to wait for formation and embedding")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 1,280 messages, hash only")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON")
    parser.add_argument("--route", choices=("single", "batch"), default="single",
                        help="single: POST /v1/sessions/{id}/messages a message at a time; batch: POST "
                             "/v1/agents/{id}/messages/batch, --batch-size messages a request (use fewer --clients)")
    parser.add_argument("--batch-size", type=int, default=500, help="--route batch: messages per request")
    parser.add_argument("--turn-chars", type=int, default=0,
                        help="turns of about this many characters (generated turns joined); default: one short turn")
    parser.add_argument("--align-cron", type=float, metavar="SECONDS",
                        help="start each repetition's ingest this long before an even minute, when the worker's "
                             "backfill cron runs: the cron then meets the embedding backlog")
    parser.add_argument("--worker-process", action="store_true",
                        help="serve --no-worker and a `memory-service worker` process beside it (default: in-process)")
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="measure this checkout too (repeatable); default: the installed one, as 'this'")
    args = parser.parse_args()
    codes: dict[str, Path | None] = {}
    for item in args.code:
        name, _, directory = item.partition("=")
        codes[name] = Path(directory) if directory else None
    codes = codes or {"this": None}
    if args.quick:
        args.messages, args.sessions, args.repeat, args.embedders, args.baseline_requests = 1280, 64, 1, "hash", 1000
    console = Console(width=240)
    header = print_machine(console, "ingest_bench")
    started = time.perf_counter()
    results = {e: asyncio.run(run_embedder(e, codes, args, console)) for e in args.embedders.split(",")}
    console.print(table(results, args))
    console.print(f"load average at end: {list(os.getloadavg())}; took {time.perf_counter() - started:.0f} s")
    problems = [f"{e}/{c} repetition {i + 1}: {p}" for e, by_code in results.items() for c, reps in by_code.items()
                for i, r in enumerate(reps) for p in r.problems]
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": {e: {c: [asdict(r) for r in reps] for c, reps in by_code.items()}
                                                     for e, by_code in results.items()}},
                                        indent=2))
        console.print(f"results written to {args.json}")
    if problems:
        for p in problems[:30]:
            console.print(f"[red]FAIL[/red] {p}")
        return 1
    console.print("correctness: every record acknowledged in sequence; every message stored, and formed or pending.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
