"""Benchmark: memory formation end to end (record -> gate -> arq job -> memories stored).

Two parts, both on a real embedded FalkorDB/Redis started in a temporary directory:

1. Rule-based formation throughput. M sessions x K messages are recorded concurrently
   (one task per session, each conversation in order) through ``MemoryService.record_message``
   with the in-process arq worker forming each window of N messages as its gate opens.
   Timed from the first record to the last formation job finishing (arq's finish time).
   Baseline, in the same process and interleaved repetition by repetition: the same
   messages recorded with formation disabled (gates that never open, no jobs).
   ``--http`` does the same through the real API (uvicorn on loopback, httpx client).
2. LLM extraction cost per window, against tests/fake_llm.py's EchoLLM (an
   OpenAI-compatible server on loopback that answers from the request): the service's
   LLMExtractor (one call per window) against ``ReferenceStyleExtractor`` below (the
   reference system's pattern: one call plus one per shard), with 1, 3 and 8 shards.

Speed is reported, never asserted. Correctness is checked on every run: every message
must end up in exactly one formed window (the episodes' ``message_ids``), every job must
succeed, and the LLM counters must agree with each other. Any violation exits 1.

    .venv/bin/python bench/formation_bench.py [--quick] [--repeat N] [--sessions M] [--messages K]
                                              [--http] [--llm-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# bench/ for the machine header of context_bench.py; the repository root for tests/fake_llm.py.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.backends.loopback import LoopbackServer  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.domain.models import MemoryKind, MessageIn, ShardIn  # noqa: E402
from memory_service.domain.namespaces import Namespace  # noqa: E402
from memory_service.formation.extractor import Extraction, ExtractionUsage, Window  # noqa: E402
from memory_service.formation.jobs import QUEUE_NAME, formation_job_id  # noqa: E402
from memory_service.formation.llm_extractor import LLMExtractor  # noqa: E402
from memory_service.http.app import create_app  # noqa: E402
from memory_service.runtime import open_service  # noqa: E402
from memory_service.service import MemoryService  # noqa: E402
from tests.fake_llm import EchoLLM  # noqa: E402

log = logging.getLogger("formation_bench")

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
NEVER = 10**9  # a gate threshold no session reaches: formation disabled
POLL_SECONDS = 0.2  # how often the tail is polled; timings come from arq, not from polling
MIN_MESSAGES = Settings.model_fields["never_form_memories_less_than_n_messages"].default  # the gate's minimum
STORE_PID: int | None = None  # the embedded redis-server's pid (set by run_all), for its CPU time


@dataclass(frozen=True)
class Sizes:
    sessions: int  # M, recorded concurrently
    messages: int  # K per session
    interval: int  # N: the message gate, and the most messages one window holds
    repeat: int  # R timed repetitions of the rule-based part
    llm_sessions: int
    llm_messages: int
    llm_shards: tuple[int, ...]


FULL = Sizes(sessions=8, messages=40, interval=10, repeat=10, llm_sessions=4, llm_messages=40, llm_shards=(1, 3, 8))
QUICK = Sizes(sessions=4, messages=20, interval=10, repeat=2, llm_sessions=2, llm_messages=20, llm_shards=(1, 3))


# --- conversations -----------------------------------------------------------------------

CITIES = ["Lisbon", "Porto", "Seville", "Valencia", "Naples", "Bologna", "Lyon", "Bordeaux"]
ORIGINS = ["Berlin", "Hamburg", "Munich", "Vienna", "Zurich", "Prague"]
HOTELS = ["Casa do Rio", "Hotel Alfama", "Pension Azul", "Hotel Miramar", "Residencia Sol"]
RESTAURANTS = ["Ao 26", "Tasca do Chico", "Cervejaria Ramiro", "Prado", "Taberna da Rua"]
TRIPS = ["Sintra", "Cascais", "Evora", "Obidos", "Belem"]
DAYS = ["June 3rd", "June 4th", "June 5th", "June 6th", "June 7th"]
NICKS = ["Bobby", "Sam", "Alex", "Jo", "Kit"]

# Shaped like the demo conversation (memory_service/data/demo_conversation.json): stated
# preferences and rules (directives), facts on travel and food (shard facts), proposals
# with replies (suggestions, with who agreed), questions and small talk (episode only).
# The words flight, hotel, train, dinner, budget, museum, weather and restaurant recur:
# they are the LLM part's shard ids, and EchoLLM makes a fact of a message naming one.
USER_LINES = [
    "I prefer {seat} seats on flights, and please keep the total budget under {budget} euros.",
    "Please always answer in short bullet points, I read them on my phone.",
    "Call me {nick}. I hate early mornings, so never book anything before 10am for me.",
    "I'm vegetarian, so dinner places need good vegetarian dishes.",
    "The flight from {origin} leaves on {day} at {hour}am and we land in {city} at noon.",
    "The hotel {hotel} costs {price} euros per night and has free cancellation.",
    "The train to {trip} takes forty minutes and a return ticket costs {small} euros.",
    "The {city} museum pass costs {small} euros and covers the palace and the old tram.",
    "We should take the train to {trip} on {day} because the museum is less crowded on weekdays.",
    "How about dinner at {restaurant} on the first evening, since the restaurant is close to the hotel?",
    "Let's book the hotel {hotel} because it is ten minutes from the train station.",
    "Sounds good, I agree. {restaurant} has a great vegetarian menu.",
    "I don't think we should go to {trip} before 10, the weather is better in the afternoon.",
    "What is the weather usually like in {city} in early June?",
    "Thanks, that helps a lot.",
]
ASSISTANT_LINES = [
    "Noted: {seat} seats and a budget under {budget} euros. Do you have dates yet?",
    "Great, that leaves the whole afternoon free. Shall I look at hotels near the river?",
    "{restaurant} opens at 7pm; I suggest booking a table for 8pm on {day}.",
    "The {hour}:41 train from Rossio station gets you to {trip} before lunch.",
    "That hotel fits the budget well. I can hold a room for the nights of {day} to June 9th.",
    "In early June the weather in {city} is warm and dry, around 25 degrees in the afternoon.",
    "Understood, I will only suggest restaurants with strong vegetarian menus.",
    "The museum is closed on Mondays, so {day} works if it is not a Monday.",
]


def conversation(seed: str, session: int, count: int, user_prefix: str) -> list[tuple[str, str, str]]:
    """``count`` (user_id, role, content) turns, deterministic in (seed, session).

    Every third session is a group conversation of two users; the others have one. Users
    and the assistant take turns. The same seed gives the same text, so the baseline and
    the formation run (and both LLM extractors) see identical conversations.
    """
    rng = random.Random(f"{seed}:{session}")
    users = [f"{user_prefix}u{session}"] + ([f"{user_prefix}u{session}b"] if session % 3 == 2 else [])
    slots = {"seat": lambda: rng.choice(["window", "aisle"]), "budget": lambda: str(rng.randrange(12, 40) * 100),
             "nick": lambda: rng.choice(NICKS), "origin": lambda: rng.choice(ORIGINS),
             "day": lambda: rng.choice(DAYS), "hour": lambda: str(rng.randrange(6, 11)),
             "city": lambda: rng.choice(CITIES), "hotel": lambda: rng.choice(HOTELS),
             "price": lambda: str(rng.randrange(80, 220)), "small": lambda: str(rng.randrange(5, 40)),
             "trip": lambda: rng.choice(TRIPS), "restaurant": lambda: rng.choice(RESTAURANTS)}

    def fill(template: str) -> str:
        return template.format(**{k: f() for k, f in slots.items() if "{" + k + "}" in template})

    turns = []
    for i in range(count):
        if i % 2:
            turns.append((users[0], "assistant", fill(rng.choice(ASSISTANT_LINES))))
        else:
            turns.append((users[(i // 2) % len(users)], "user", fill(rng.choice(USER_LINES))))
    return turns


def message_bodies(agent: str, seed: str, session: int, count: int, user_prefix: str, day: int) -> list[dict]:
    """The request bodies of one session, as POST /v1/sessions/{id}/messages takes them."""
    start = T0 + timedelta(days=day)
    return [{"agent_id": agent, "user_id": user, "role": role, "content": content, "message_id": f"m{i}",
             "created_at": (start + timedelta(seconds=30 * i)).isoformat()}
            for i, (user, role, content) in enumerate(conversation(seed, session, count, user_prefix))]


# The rule-based part's shards: the demo's two and a third; the rule extractor files a
# sentence under a shard when it shares a content word with the shard's name or focus.
RULE_SHARDS = {
    "travel": ShardIn(name="travel logistics", extraction_focus="flights, trains, hotels, bookings, dates, budget"),
    "food": ShardIn(name="food and restaurants", extraction_focus="restaurants, dinner, lunch, cuisine, dishes"),
    "sights": ShardIn(name="sightseeing", extraction_focus="museums, palaces, day trips, weather"),
}
LLM_SHARD_IDS = ["flight", "hotel", "train", "dinner", "budget", "museum", "weather", "restaurant"]


# --- statistics --------------------------------------------------------------------------

def summary(values: list[float]) -> dict[str, float]:
    """median, p95 (nearest rank), min and max; with few values p95 is simply the largest."""
    if not values:
        return {"n": 0, "median": math.nan, "p95": math.nan, "min": math.nan, "max": math.nan}
    ordered = sorted(values)
    return {"n": len(ordered), "median": statistics.median(ordered),
            "p95": ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)], "min": ordered[0], "max": ordered[-1]}


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process (service, worker, client, EchoLLM: one event
    loop) and by the embedded store (redis-server + FalkorDB); nan where /proc is missing."""
    store = math.nan
    if STORE_PID:
        try:
            fields = Path(f"/proc/{STORE_PID}/stat").read_text().rsplit(")", 1)[1].split()
            store = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, ValueError, IndexError):
            pass
    return time.process_time(), store


# --- targets: the service called directly, or through HTTP -------------------------------

@dataclass
class Target:
    """Where messages go. ``service`` is the process's MemoryService either way: arq's job
    records and the stored episodes are read from it, outside the timing."""

    service: MemoryService
    record: Callable[[str, dict], Awaitable[str | None]]  # -> the formation job id, if a gate opened
    status: Callable[[str], Awaitable[dict]]
    form: Callable[[str], Awaitable[Any]]


def direct_target(service: MemoryService) -> Target:
    async def record(session_id: str, body: dict) -> str | None:
        return (await service.record_message(session_id, MessageIn(**body))).formation_job

    return Target(service, record, service.session_status, service.form_memories)


def http_target(service: MemoryService, http: httpx.AsyncClient) -> Target:
    async def call(method: str, path: str, **kwargs) -> dict:
        response = await http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    async def record(session_id: str, body: dict) -> str | None:
        return (await call("POST", f"/v1/sessions/{session_id}/messages", json=body))["formation_job"]

    async def status(session_id: str) -> dict:
        return await call("GET", f"/v1/sessions/{session_id}")

    async def form(session_id: str) -> dict:
        return await call("POST", f"/v1/sessions/{session_id}/form")

    return Target(service, record, status, form)


class LiveServer(LoopbackServer):
    """The API under uvicorn on a loopback port, in this process."""

    def __init__(self, settings: Settings, run_worker: bool):
        self.app = create_app(settings, run_worker=run_worker, host="127.0.0.1")  # loopback: no keys
        super().__init__(self.app)

    @property
    def service(self) -> MemoryService:
        return self.app.state.service


class BenchSettings(Settings):
    """Settings from the bench's own arguments only. No environment variable or .env file
    reaches a measurement: a REDIS_URL, EXTRACTOR or MONGODB_URI there would change what
    is measured (another store, another extractor, mirrored writes)."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **other_sources):
        return (init_settings,)


def bench_settings(url: str, interval: int, *, formation: bool, **overrides) -> Settings:
    """Settings on the bench's store.

    With formation, the message gate is N and a window holds at most N messages, however
    far the worker lags (with the default cap of 200 a lagging worker would form fewer,
    larger windows, and windows/s would say little). Windows may still hold fewer than N
    messages: see the README. Without formation no gate ever opens. The cold-session sweep is pushed out of the way: it is
    not what is measured, and must not pick up the baseline's never-formed sessions.
    """
    gates = ({"memory_formation_msg_interval": interval, "max_window_messages": interval} if formation else
             {"never_form_memories_less_than_n_messages": NEVER, "memory_formation_msg_interval": NEVER,
              "memory_formation_token_interval": NEVER})
    return BenchSettings(falkordb_url=url, consider_cold_after_minutes=10**6, **gates, **overrides)


# --- one repetition ----------------------------------------------------------------------

@dataclass
class Run:
    """One repetition: M sessions recorded, and (with formation) all their windows formed."""

    messages: int
    record_seconds: float  # first record sent -> last record answered
    total_seconds: float  # first record sent -> last formation job finished (= record_seconds without formation)
    windows: int = 0
    jobs: list[dict] = field(default_factory=list)  # per window: timings (s) and the job's result
    errors: list[str] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # busy fraction of one core: this process, the store

    @property
    def messages_per_second(self) -> float:
        return self.messages / self.total_seconds

    @property
    def windows_per_second(self) -> float:
        return self.windows / self.total_seconds


async def record_sessions(target: Target, sessions: dict[str, list[dict]], pace: bool = False
                          ) -> tuple[float, float, dict]:
    """Record every session concurrently, each in order; (start, end, job id -> first record's (start, end)).

    With ``pace``, a session waits for each window it opened to be formed before its next
    message. Then no message arrives while its session's window is forming, and every
    window holds exactly N messages (see the README on the smaller windows otherwise).
    """
    first_seen: dict[str, tuple[float, float]] = {}

    async def converse(session_id: str, bodies: list[dict]) -> None:
        for body in bodies:
            sent = time.time()
            job = await target.record(session_id, body)
            if job and job not in first_seen:
                first_seen[job] = (sent, time.time())
                if pace:
                    await target.service.queue.wait(job, timeout=300)

    start = time.time()
    await asyncio.gather(*(converse(sid, bodies) for sid, bodies in sessions.items()))
    return start, time.time(), first_seen


async def wait_until_formed(target: Target, session_ids: list[str], timeout: float = 300) -> None:
    """Until no session has a window claimed or a gate open; then form each remainder.

    Polled only once recording is over, and slowly: the polls share the event loop with
    the worker, and the timings are arq's own, so polling faster would only add load.
    """
    deadline = time.monotonic() + timeout
    while True:
        statuses = await asyncio.gather(*(target.status(s) for s in session_ids))
        if all(s["pending_job"] is None and not s["gate"]["open"] for s in statuses):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"windows not formed within {timeout:.0f}s: "
                               f"{[s['session_id'] for s in statuses if s['pending_job']]}")
        await asyncio.sleep(POLL_SECONDS)
    # Fewer pending messages than a gate needs (K not a multiple of N): a host would force
    # them at the session's end, so that is part of the run.
    await asyncio.gather(*(target.form(s["session_id"]) for s in statuses if s["gate"]["pending_messages"]))


async def wait_for_idle_queue(service: MemoryService, timeout: float = 120) -> None:
    """Until the worker has nothing queued or running (consolidation jobs follow formations),
    so that one repetition's leftovers do not load the next."""
    pool, deadline = service.queue.pool, time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Only formation and consolidation jobs: arq keeps a cron job's in-progress key
        # until long after it ran.
        running = [key for pattern in ("arq:in-progress:form:*", "arq:in-progress:consolidate:*")
                   for key in [k async for k in pool.scan_iter(pattern)]]
        if not running and await pool.zcard(QUEUE_NAME) == 0:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the job queue did not drain within {timeout:.0f}s")


async def job_records(service: MemoryService, session_ids: list[str], first_seen: dict) -> tuple[list[dict], list[str]]:
    """arq's record of every formation job of these sessions: timings in seconds, and its result.

    Windows are numbered 1, 2, ... per session, and the job id names the window. A job was
    enqueued by a record call when its enqueue time falls within that call (arq keeps
    milliseconds, hence the tolerance); otherwise the worker enqueued it, right after the
    session's previous window, for messages that had arrived meanwhile.
    """
    jobs, errors = [], []
    for session_id in session_ids:
        status = await service.session_status(session_id)
        for window in range(1, status["formed_windows"] + 1):
            job_id = formation_job_id(session_id, window)
            info = await service.queue.job(job_id).result_info()
            if info is None:
                errors.append(f"{job_id}: no job result kept")
                continue
            if not info.success:
                errors.append(f"{job_id}: failed: {info.result}")
                continue
            enqueued, started, finished = (t.timestamp() for t in (info.enqueue_time, info.start_time, info.finish_time))
            sent, answered = first_seen.get(job_id, (math.nan, math.nan))
            by_record = sent - 0.002 <= enqueued <= answered + 0.002
            jobs.append({"job_id": job_id, "enqueued": enqueued, "started": started, "finished": finished,
                         "queue_wait": started - enqueued, "run": finished - started,
                         "enqueue_to_stored": finished - enqueued,
                         "record_to_stored": finished - sent if by_record else None,
                         "messages": len(info.result.get("message_ids", [])), "tries": info.job_try,
                         "result": info.result})
    return jobs, errors


async def check_formed(service: MemoryService, agent: str, sessions: dict[str, list[dict]]) -> list[str]:
    """Every message in exactly one formed window: the episodes' message ids, counted."""
    errors = []
    _, backend = await service.agents.backend_for(agent)
    for session_id, bodies in sessions.items():
        expected = sorted(b["message_id"] for b in bodies)
        episodes = await backend.recent(agent, Namespace.session(session_id), [MemoryKind.EPISODE], 10_000)
        covered = sorted(mid for episode in episodes for mid in episode.metadata.message_ids)
        if covered != expected:
            missing, unknown = set(expected) - set(covered), set(covered) - set(expected)
            repeated = len(covered) - len(set(covered))
            errors.append(f"{session_id}: {len(missing)} message(s) in no window, {repeated} in more than one, "
                          f"{len(unknown)} formed but never recorded")
        status = await service.session_status(session_id)
        if status["formed_messages"] != len(expected) or status["formed_windows"] != len(episodes):
            errors.append(f"{session_id}: {status['formed_windows']} windows / {status['formed_messages']} messages "
                          f"formed, {len(episodes)} episodes stored for {len(expected)} messages")
    return errors


async def check_recorded_only(service: MemoryService, agent: str, sessions: dict[str, list[dict]]) -> list[str]:
    """The baseline stored every message and formed nothing."""
    errors = []
    _, backend = await service.agents.backend_for(agent)
    for session_id, bodies in sessions.items():
        stored = await backend.recent(agent, Namespace.session(session_id), [MemoryKind.MESSAGE], 10_000)
        status = await service.session_status(session_id)
        if len(stored) != len(bodies) or status["gate"]["pending_messages"] != len(bodies) or status["formed_windows"]:
            errors.append(f"baseline {session_id}: {len(stored)} stored, {status['gate']['pending_messages']} pending, "
                          f"{status['formed_windows']} windows formed, for {len(bodies)} messages")
    return errors


async def run_once(target: Target, sessions: dict[str, list[dict]], agent: str, formation: bool,
                   pace: bool = False) -> Run:
    """Record ``sessions``; with formation, wait for every window and read the jobs' timings."""
    wall0, (mine0, store0) = time.perf_counter(), cpu_seconds()
    start, recorded, first_seen = await record_sessions(target, sessions, pace)
    messages = sum(map(len, sessions.values()))
    if formation:
        await wait_until_formed(target, list(sessions))
    wall, (mine, store) = time.perf_counter() - wall0, cpu_seconds()
    cpu = {"process": (mine - mine0) / wall, "store": (store - store0) / wall}
    if not formation:
        run = Run(messages, recorded - start, recorded - start, cpu=cpu)
        run.errors = await check_recorded_only(target.service, agent, sessions)
        return run
    jobs, errors = await job_records(target.service, list(sessions), first_seen)
    last = max((j["finished"] for j in jobs), default=recorded)
    run = Run(messages, recorded - start, max(last, recorded) - start, windows=len(jobs), jobs=jobs, cpu=cpu)
    run.errors = errors + await check_formed(target.service, agent, sessions)
    await wait_for_idle_queue(target.service)
    return run


def make_sessions(label: str, agent: str, seed: str, count: int, messages: int, user_prefix: str,
                  day: int) -> dict[str, list[dict]]:
    """``count`` sessions named ``<label>-s<k>`` with their message bodies."""
    return {f"{label}-s{k}": message_bodies(agent, seed, k, messages, user_prefix, day) for k in range(count)}


# --- part 1: rule-based formation against recording only ---------------------------------

RULES_AGENT = "bench-rules"


async def rules_part(formed: Target, baseline: Target, sizes: Sizes, label: str, console: Console) -> dict:
    """Interleaved repetitions: recording only, and recording with formation, on the same text.

    Which goes first alternates, so drift on a shared machine hits both. Each repetition
    uses new session ids and new users (and new text: the rule extractor caches a few
    regex verdicts per message text, which repeated text would hit).
    """
    for shard_id, shard in RULE_SHARDS.items():
        await formed.service.put_shard(RULES_AGENT, shard_id, shard)

    def sessions(kind: str, rep: int | str, count: int, messages: int) -> dict[str, list[dict]]:
        return make_sessions(f"{label}-{kind}-r{rep}", RULES_AGENT, f"{label}-{rep}", count, messages,
                             f"{label}-r{rep}-", day=0 if rep == "warm" else rep)

    # Warm-up, not timed: first graph drivers, imports, connection pools.
    warm = 2 * sizes.interval
    await run_once(baseline, sessions("base", "warm", 2, warm), RULES_AGENT, formation=False)
    await run_once(formed, sessions("form", "warm", 2, warm), RULES_AGENT, formation=True)

    runs: dict[str, list[Run]] = {"baseline": [], "formation": []}
    for rep in range(sizes.repeat):
        order = [("baseline", baseline, False), ("formation", formed, True)]
        for name, target, formation in order if rep % 2 == 0 else order[::-1]:
            if console.is_terminal:
                console.print(f"  {label}: repetition {rep + 1}/{sizes.repeat}, {name} ...", end="\r")
            kind = "form" if formation else "base"
            runs[name].append(await run_once(target, sessions(kind, rep, sizes.sessions, sizes.messages),
                                             RULES_AGENT, formation))
    return summarise_rules(runs, sizes)


def summarise_rules(runs: dict[str, list[Run]], sizes: Sizes) -> dict:
    base, form = runs["baseline"], runs["formation"]
    jobs = [j for run in form for j in run.jobs]
    kinds: dict[str, int] = {}
    for job in jobs:
        for kind, n in job["result"].get("memories", {}).items():
            kinds[kind] = kinds.get(kind, 0) + n
    errors = [e for run in base + form for e in run.errors]
    for kind in ("episode", "directive", "fact", "suggestion"):
        if not kinds.get(kind):  # the workload must exercise what it claims to
            errors.append(f"the formation runs formed no {kind}")
    base_rate = summary([r.messages_per_second for r in base])
    form_rate = summary([r.messages_per_second for r in form])
    return {
        "sizes": {"sessions": sizes.sessions, "messages_per_session": sizes.messages, "interval": sizes.interval,
                  "repeat": sizes.repeat},
        "baseline": {"messages_per_second": base_rate, "seconds": summary([r.total_seconds for r in base])},
        "formation": {
            "messages_per_second": form_rate,
            "windows_per_second": summary([r.windows_per_second for r in form]),
            "seconds": summary([r.total_seconds for r in form]),
            "record_phase_messages_per_second": summary([r.messages / r.record_seconds for r in form]),
            "tail_seconds": summary([r.total_seconds - r.record_seconds for r in form]),
            "windows_per_run": [r.windows for r in form],
        },
        "ratio": form_rate["median"] / base_rate["median"],
        "cpu_busy": {name: {part: statistics.median(r.cpu[part] for r in rs) for part in ("process", "store")}
                     for name, rs in runs.items()},
        "runs": [{"run": name, "repetition": i, "messages_per_second": r.messages_per_second, "windows": r.windows,
                  "seconds": r.total_seconds, "record_seconds": r.record_seconds, "cpu_busy": r.cpu}
                 for name, rs in runs.items() for i, r in enumerate(rs)],
        "pair_ratios": [f.messages_per_second / b.messages_per_second for b, f in zip(base, form)],
        "latency": {
            "queue_wait": summary([j["queue_wait"] for j in jobs]),
            "run": summary([j["run"] for j in jobs]),
            "enqueue_to_stored": summary([j["enqueue_to_stored"] for j in jobs]),
            "record_to_stored": summary([j["record_to_stored"] for j in jobs if j["record_to_stored"] is not None]),
        },
        "windows_enqueued_by_worker": sum(j["record_to_stored"] is None for j in jobs),
        "window_messages": summary([j["messages"] for j in jobs]),
        "windows_below_interval": sum(j["messages"] < sizes.interval for j in jobs),
        # A record's gate needs MIN_MESSAGES new messages; a smaller window it enqueued was
        # claimed after its gate check saw the previous, still-forming window's messages.
        "record_windows_below_minimum": sum(j["messages"] < MIN_MESSAGES and j["record_to_stored"] is not None
                                            for j in jobs),
        "memories_formed": kinds,
        "errors": errors,
    }


async def rules_direct(url: str, sizes: Sizes, console: Console) -> dict:
    async with (open_service(bench_settings(url, sizes.interval, formation=True), run_worker=True) as formed,
                open_service(bench_settings(url, sizes.interval, formation=False), run_worker=False) as baseline):
        return await rules_part(direct_target(formed), direct_target(baseline), sizes, "direct", console)


async def rules_http(url: str, sizes: Sizes, console: Console) -> dict:
    async with (LiveServer(bench_settings(url, sizes.interval, formation=True), run_worker=True) as formed,
                LiveServer(bench_settings(url, sizes.interval, formation=False), run_worker=False) as baseline,
                httpx.AsyncClient(base_url=formed.base_url, timeout=60) as formed_http,
                httpx.AsyncClient(base_url=baseline.base_url, timeout=60) as baseline_http):
        return await rules_part(http_target(formed.service, formed_http), http_target(baseline.service, baseline_http),
                                sizes, "http", console)


# --- part 2: LLM calls and tokens per window ---------------------------------------------

class ReferenceStyleExtractor:
    """The reference system's call pattern, reproduced with the service's own LLMExtractor.

    One call for the episode and the directives (the window with no shard), then one call
    per active shard (the window with only that shard), in turn, keeping only that call's
    facts and suggestions. Calls are exact. Tokens are an approximation of the reference:
    every call here carries the service's full system prompt and schema, and EchoLLM also
    answers the episode and directives in each per-shard call (then dropped); the
    reference's own prompts differed.
    """

    name = "llm-reference-style"

    def __init__(self, inner: LLMExtractor):
        self.inner = inner

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def extract(self, window: Window) -> Extraction:
        base = await self.inner.extract(replace(window, shards=()))
        usage = replace(base.usage or ExtractionUsage())
        items = list(base.items)
        for shard in (s for s in window.shards if s.active):
            part = await self.inner.extract(replace(window, shards=(shard,)))
            items += [i for i in part.items if i.kind in (MemoryKind.FACT, MemoryKind.SUGGESTION)]
            if part.usage:
                usage.calls += part.usage.calls
                usage.attempts += part.usage.attempts
                usage.prompt_tokens += part.usage.prompt_tokens
                usage.completion_tokens += part.usage.completion_tokens
                usage.latency_seconds += part.usage.latency_seconds
        return Extraction(episode=base.episode, items=items, usage=usage)


LLM_METRICS = ("formations", "llm_calls", "llm_prompt_tokens", "llm_completion_tokens")


async def llm_flow(url: str, echo: EchoLLM, sizes: Sizes, shards: int, style: str) -> dict:
    """One run of M sessions with an LLM extractor; calls and tokens counted three ways:
    by EchoLLM, by the service's metrics, and per job (the form_window result's usage)."""
    agent = f"bench-llm-{shards}"
    # Extraction is what is compared: merges stay rule-based, so every call EchoLLM counts is
    # an extraction call (an LLM merge adds one call per CONSOLIDATE_*_AFTER items).
    settings = bench_settings(url, sizes.interval, formation=True, extractor="llm", llm_base_url=echo.base_url,
                              llm_model="echo", consolidator="rules")
    async with open_service(settings, run_worker=True) as service:
        if style == "reference":
            service.pipeline.extractor = ReferenceStyleExtractor(service.pipeline.extractor)
        for shard_id in LLM_SHARD_IDS[:shards]:
            await service.put_shard(agent, shard_id, ShardIn(name=shard_id, extraction_focus=f"anything about {shard_id}s"))
        # The same seed and users for both styles and every shard count: the windows, and so
        # the prompts' conversation lines, are identical; only the shards and the call
        # pattern differ.
        sessions = make_sessions(f"llm{shards}-{style}", agent, "llm", sizes.llm_sessions,
                                 sizes.llm_messages, "llm-", day=0)
        echo_before = (echo.calls, echo.prompt_tokens, echo.completion_tokens)
        metrics_before = await service.state.metrics()
        # Paced, so that both styles form exactly the same windows (K/N per session, N messages each).
        run = await run_once(direct_target(service), sessions, agent, formation=True, pace=True)
        metrics_after = await service.state.metrics()
    echo_delta = dict(zip(("calls", "prompt_tokens", "completion_tokens"),
                          (after - before for before, after in
                           zip(echo_before, (echo.calls, echo.prompt_tokens, echo.completion_tokens)))))
    metrics = {k: metrics_after.get(k, 0) - metrics_before.get(k, 0) for k in LLM_METRICS}
    usages = [j["result"]["usage"] or {} for j in run.jobs]
    windows = run.windows
    errors = list(run.errors)
    expected_calls = 1 if style == "ours" else 1 + shards
    if any(u.get("calls") != expected_calls for u in usages):
        errors.append(f"{style}, {shards} shard(s): calls per window {sorted({u.get('calls') for u in usages})}, "
                      f"expected {expected_calls}")
    per_job = {k: sum(u.get(k, 0) for u in usages) for k in ("calls", "prompt_tokens", "completion_tokens")}
    if not (per_job["calls"] == echo_delta["calls"] == metrics["llm_calls"]
            and per_job["prompt_tokens"] == echo_delta["prompt_tokens"] == metrics["llm_prompt_tokens"]
            and per_job["completion_tokens"] == echo_delta["completion_tokens"] == metrics["llm_completion_tokens"]
            and metrics["formations"] == windows):
        errors.append(f"{style}, {shards} shard(s): counters disagree: jobs {per_job}, EchoLLM {echo_delta}, "
                      f"metrics {metrics}, windows {windows}")
    return {
        "style": style, "shards": shards, "windows": windows, "messages": run.messages,
        "messages_per_window": run.messages / windows if windows else math.nan,
        "per_window": {k: v / windows for k, v in echo_delta.items()} if windows else {},
        "metrics_per_window": {k: v / windows for k, v in metrics.items()} if windows else {},
        "prompt_tokens": summary([u.get("prompt_tokens", 0) for u in usages]),
        "completion_tokens": summary([u.get("completion_tokens", 0) for u in usages]),
        "job_run_seconds": summary([j["run"] for j in run.jobs]),
        "echo": echo_delta, "metrics": metrics, "errors": errors,
        "sample_prompt": getattr(echo, "last_prompt", ""),  # the flow's last extraction prompt
    }


async def llm_part(url: str, sizes: Sizes, console: Console) -> dict:
    echo = await EchoLLM().start()
    try:
        flows = []
        for shards in sizes.llm_shards:
            for style in ("ours", "reference"):  # one service (and worker) at a time: they share the queue
                if console.is_terminal:
                    console.print(f"  llm: {shards} shard(s), {style} ...", end="\r")
                flows.append(await llm_flow(url, echo, sizes, shards, style))
    finally:
        await echo.stop()
    ratios, errors = [], [e for f in flows for e in f["errors"]]
    for ours, ref in zip(flows[::2], flows[1::2]):
        # Per-window ratios compare like with like only if both formed the same windows.
        if not ours["windows"] or ours["windows"] != ref["windows"] or ours["messages"] != ref["messages"]:
            errors.append(f"{ours['shards']} shard(s): the two styles formed different windows "
                          f"({ours['windows']} and {ref['windows']})")
            continue
        ratios.append({"shards": ours["shards"],
                       **{k: ref["per_window"][k] / ours["per_window"][k]
                          for k in ("calls", "prompt_tokens", "completion_tokens")}})
    return {"flows": flows, "ratios": ratios, "errors": errors}


# --- reporting ---------------------------------------------------------------------------

def _rate(s: dict, digits: int = 1) -> tuple[str, str, str]:
    return f"{s['median']:.{digits}f}", f"{s['p95']:.{digits}f}", f"{s['min']:.{digits}f}"


def _ms(s: dict) -> tuple[str, str, str, str]:
    if not s["n"]:
        return "-", "-", "-", "0"
    return f"{s['median'] * 1e3:.0f}", f"{s['p95'] * 1e3:.0f}", f"{s['max'] * 1e3:.0f}", str(s["n"])


def rules_tables(result: dict, label: str) -> list[Table]:
    s = result["sizes"]
    title = (f"{label}: {s['sessions']} sessions x {s['messages_per_session']} messages, window {s['interval']} "
             f"messages, rule-based extractor ({s['repeat']} repetitions; rates per repetition)")
    t = Table(title=title)
    for column in ("run", "msgs/s median", "msgs/s p95", "msgs/s min", "windows/s median", "windows/s p95",
                   "seconds median"):
        t.add_column(column, justify="left" if column == "run" else "right")
    b, f = result["baseline"], result["formation"]
    t.add_row("recording only (baseline)", *_rate(b["messages_per_second"]), "-", "-", f"{b['seconds']['median']:.2f}")
    t.add_row("recording + formation", *_rate(f["messages_per_second"]), *_rate(f["windows_per_second"], 2)[:2],
              f"{f['seconds']['median']:.2f}")
    t.add_row("  of which recording phase", *_rate(f["record_phase_messages_per_second"]), "-", "-", "-")
    pairs = ", ".join(f"{r:.2f}" for r in result["pair_ratios"])
    cpu = result["cpu_busy"]
    t.caption = (f"ratio = formation msgs/s median / baseline msgs/s median = {result['ratio']:.2f}  "
                 f"(per repetition: {pairs}); tail after the last record: "
                 f"{result['formation']['tail_seconds']['median']:.2f} s median. CPU busy, in cores (median): "
                 f"this process {cpu['baseline']['process']:.2f} / store {cpu['baseline']['store']:.2f} recording only, "
                 f"{cpu['formation']['process']:.2f} / {cpu['formation']['store']:.2f} with formation")

    lat = Table(title=f"{label}: per-window latency (ms, all windows of all repetitions)")
    for column in ("interval", "median", "p95", "max", "windows"):
        lat.add_column(column, justify="left" if column == "interval" else "right")
    names = {"record_to_stored": "record that opened the gate -> job finished",
             "enqueue_to_stored": "job enqueued -> job finished",
             "queue_wait": "  queued (enqueued -> worker starts it)",
             "run": "  running (form_window job)"}
    for key, name in names.items():
        lat.add_row(name, *_ms(result["latency"][key]))
    size = result["window_messages"]
    lat.caption = (f"windows: {size['n']}, of {size['min']:.0f} to {size['max']:.0f} messages (median "
                   f"{size['median']:.0f}); {result['windows_below_interval']} below the gate's {s['interval']}; "
                   f"{result['windows_enqueued_by_worker']} enqueued by the worker or by POST /form, not by a record; "
                   f"{result['record_windows_below_minimum']} enqueued by a record with fewer than the gate's minimum "
                   f"of {MIN_MESSAGES}. "
                   f"Memories formed: {result['memories_formed']}")
    return [t, lat]


def llm_table(result: dict) -> Table:
    t = Table(title="LLM extraction per window against EchoLLM: ours (1 call) vs reference style (1 + S calls)")
    for column in ("shards", "extractor", "windows", "msgs/window", "calls/window", "prompt tok/window",
                   "prompt p95", "completion tok/window", "completion p95", "job run ms median", "job run ms p95"):
        t.add_column(column, justify="right")
    for f in result["flows"]:
        w, p, c, r = f["per_window"], f["prompt_tokens"], f["completion_tokens"], f["job_run_seconds"]
        t.add_row(str(f["shards"]), f["style"], str(f["windows"]), f"{f['messages_per_window']:.0f}",
                  f"{w['calls']:.2f}", f"{w['prompt_tokens']:.0f}", f"{p['p95']:.0f}",
                  f"{w['completion_tokens']:.0f}", f"{c['p95']:.0f}", f"{r['median'] * 1e3:.0f}", f"{r['p95'] * 1e3:.0f}")
    for ratio in result["ratios"]:
        t.add_row(str(ratio["shards"]), "[bold]reference / ours[/bold]", "", "", f"{ratio['calls']:.2f}x",
                  f"{ratio['prompt_tokens']:.2f}x", "", f"{ratio['completion_tokens']:.2f}x", "", "", "")
    t.caption = ("Tokens are EchoLLM's estimates, len/4 of the JSON request and reply bodies, not a real tokenizer. "
                 "tok/window = EchoLLM's totals / windows (equal to the service's metrics and the jobs' usage: checked); "
                 "p95 = per window, from each form_window job's usage. Both extractors form the same windows of the "
                 "same text. Job run = the whole form_window job, the LLM calls made one after another.")
    return t


# --- main --------------------------------------------------------------------------------

async def run_all(sizes: Sizes, http: bool, console: Console, llm_only: bool = False) -> dict:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="formation-bench-") as tmp:
        global STORE_PID
        store = EmbeddedFalkorDB(Path(tmp))
        url = store.start()
        STORE_PID = int((Path(tmp) / "falkordb.pid").read_text())
        try:
            started = time.perf_counter()
            if not llm_only:
                results["rules_direct"] = await rules_direct(url, sizes, console)
                results["rules_direct"]["wall_seconds"] = time.perf_counter() - started
            if http and not llm_only:
                started = time.perf_counter()
                results["rules_http"] = await rules_http(url, sizes, console)
                results["rules_http"]["wall_seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            results["llm"] = await llm_part(url, sizes, console)
            results["llm"]["wall_seconds"] = time.perf_counter() - started
        finally:
            store.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK.sessions} sessions x {QUICK.messages} messages, {QUICK.repeat} "
                             f"repetitions, shards {QUICK.llm_shards} (figures are rough)")
    parser.add_argument("--repeat", type=int, help=f"timed repetitions of the rule-based part (default {FULL.repeat})")
    parser.add_argument("--sessions", type=int, help=f"M, sessions recorded concurrently (default {FULL.sessions})")
    parser.add_argument("--messages", type=int, help=f"K, messages per session (default {FULL.messages})")
    parser.add_argument("--http", action="store_true", help="also run the rule-based part through the HTTP API")
    parser.add_argument("--llm-only", action="store_true", help="run the LLM part only (calls and tokens per window)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for option, name in (("repeat", "repeat"), ("sessions", "sessions"), ("messages", "messages")):
        value = getattr(args, option)
        if value is not None:
            if value < 1:
                parser.error(f"--{option} must be at least 1")
            sizes = replace(sizes, **{name: value})

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console() if sys.stdout.isatty() else Console(width=180)
    header = print_machine(console, "formation_bench")
    started = time.perf_counter()
    errors: list[str] = []
    try:
        results = asyncio.run(run_all(sizes, args.http, console, args.llm_only))
    except Exception as exc:  # a run that cannot finish is a failed check, reported like one
        log.exception("the benchmark did not finish")
        results, errors = {}, [f"the benchmark did not finish: {type(exc).__name__}: {exc}"]
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    if console.is_terminal:
        console.print(" " * 60, end="\r")
    for key, label in (("rules_direct", "direct (MemoryService)"), ("rules_http", "HTTP API")):
        if key in results:
            for table in rules_tables(results[key], label):
                console.print(table)
            errors += results[key]["errors"]
    if "llm" in results:
        console.print(llm_table(results["llm"]))
        errors += results["llm"]["errors"]
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; "
                  f"took {time.perf_counter() - started:.1f} s.")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "formation_bench", "machine": header,
            "settings": {**vars(sizes), "llm_shards": list(sizes.llm_shards), "quick": args.quick, "http": args.http,
                         "llm_only": args.llm_only},
            "results": results, "errors": errors,
        }, indent=2, default=str) + "\n")
        console.print(f"results written to {args.json}")

    for error in errors:
        console.print(f"[red]FAIL[/red] {error}")
    if errors:
        return 1
    console.print("correctness: every message was formed in exactly one window; every job succeeded; "
                  "LLM calls and tokens agree between EchoLLM, the metrics and the jobs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
