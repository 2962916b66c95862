"""Benchmark: search and memory-context latency against the number of stored memories.

For each size N, a fresh service (``open_service`` on an embedded FalkorDB in a temporary
directory) gets one agent filled with N messages: synthetic text from a seeded
vocabulary (Zipf-distributed pseudo-words, a few topic words per session, English
fillers), 50 messages per session, sessions of one or two users, user and assistant
turns. The fill goes through the batch route's service call (``record_batch``: 4 clients,
each sending its own sessions' messages in order, 500 a batch; ``--route single`` records one
message at a time, 16 sessions at once), with formation gates that never open, so the N stored memories are the N messages (``--form`` also forms
every session afterwards, adding episodes and directives). Then, interleaved sample by
sample with a baseline run in the same process:

| case | service call | baseline |
|---|---|---|
| search, scope agent | ``service.search(agent, q, scope="agent", top_k=10)`` | BM25 top 10 over all N texts (bm25s); with an embedder also brute-force cosine (numpy) and RRF of both |
| search, scope session | ``service.search(..., scope="session", session_id=s)`` | BM25 with the other sessions masked out |
| context, with a query | ``assemble_memory_context(agent, u, s, query=q, budget=B)``, a new query each time | BM25 top 50 packed whole into B |
| context, no query, uncached | a (user, session) pair not asked before | the session's last messages packed into B |
| context, no query, cached | the same pair again | the same |
| ingest | messages/s while recording (the service indexes as it records) | bm25s indexing, docs/s (and embedding, with an embedder) |

Queries are 4 words of a random stored message, so each has a known target; hit@10 (the
target among the top 10) is reported beside the latency as a sanity figure.

Per case: median and p95 (nearest rank) in ms, and ratio = service median / baseline
median. Speed is reported, never asserted. Correctness is checked on every run (a
violation prints FAIL and exits 1): every message recorded once with the right sequence,
search results within top_k and inside the scope, every block within its budget and
parseable, the cached call served from the cache.

``--graph`` (issue 16, item 9) also writes a knowledge graph over the filled messages
through the store's own API (``add_graph``): per session, its first three topic words as
entities in its first speaker's namespace, each speaker a person entity, facts (the speaker
likes each, each relates to the next) and a MENTIONS edge from every message naming one;
so a query (four words of a message) names entities about as often as a topic word is
drawn, the speakers are hubs, and two hops reach other sessions' words. Then the graph
signal's own share is timed: every query runs search (scope agent and session) and the
context with a query with the signal on and off (``SEARCH_GRAPH_SIGNAL``), alternating
which goes first, blocks uncached, in the same process: median and p95 of each, and the
difference.

    .venv/bin/python bench/latency_bench.py [--sizes 1000,10000,100000] [--quick] [--repeat N] [--form] [--graph]
        [--route batch|single] [--store DIR] [--json PATH]

``--store DIR`` keeps each size's store in ``DIR/n<N>`` and measures a store filled by an
earlier run again without filling it (a million memories take most of an hour to fill).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import numpy as np  # noqa: E402
from baselines import BM25Index, DenseIndex, close_embedder, load_embedder, rrf  # noqa: E402
from common import (  # noqa: E402
    calls_per_sample,
    print_machine,
    sample,
    summarize_ms,  # noqa: E402
)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

log = logging.getLogger("latency_bench")

AGENT = "latency-agent"
SEED = 20261123
MESSAGES_PER_SESSION = 50
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NEVER = 10**9  # a gate threshold no session reaches: formation disabled while filling
MIN_BASELINE_SAMPLE_SECONDS = 0.001
TOP_K = 10
QUICK_REPEAT = 10


class BenchError(Exception):
    """The service cannot do what the bench needs."""


# --- synthetic conversations ----------------------------------------------------------------

FILLERS = ("the a and to of in I you it is that for on with we was my this be at so but not have "
           "are can will just about what there when your all").split()
ONSETS = "b d f g k l m n p r s t v z br dr fl gr kl pr st tr sk sp ch sh th".split()
VOWELS = "a e i o u ai ea io ou".split()
CODAS = ["", "", "", "n", "r", "s", "l", "m", "t", "nd", "st"]


def vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(rng.randint(1, 3))) + rng.choice(CODAS))
    ordered = sorted(w for w in words if len(w) > 2)
    rng.shuffle(ordered)
    return ordered


@dataclass(frozen=True)
class Message:
    index: int
    session_id: str
    user_id: str
    role: str
    text: str
    message_id: str
    created_at: datetime


def make_corpus(n: int, seed: int = SEED) -> list[Message]:
    """``n`` messages, deterministic in (n, seed), grouped by session in order."""
    rng = random.Random(seed)
    vocab = vocabulary(rng)
    cum, total = [], 0.0
    for rank in range(len(vocab)):
        total += 1.0 / (rank + 1) ** 1.07  # Zipf
        cum.append(total)
    sessions = math.ceil(n / MESSAGES_PER_SESSION)
    users = [f"user-{i:04d}" for i in range(max(5, min(500, sessions // 4)))]
    out: list[Message] = []
    for s in range(sessions):
        sid = f"sess-{s:05d}"
        speakers = rng.sample(users, rng.choice((1, 1, 2)))
        topic = rng.choices(vocab[:2000], k=8)
        start = T0 + timedelta(hours=6 * s)  # about 1.4 years of history at 2,000 sessions
        for i in range(min(MESSAGES_PER_SESSION, n - len(out))):
            length = rng.randint(6, 30)
            words = []
            for _ in range(length):
                r = rng.random()
                words.append(rng.choice(FILLERS) if r < 0.3 else rng.choice(topic) if r < 0.5
                             else rng.choices(vocab, cum_weights=cum)[0])
            text = " ".join(words).capitalize() + "."
            user = speakers[(i // 2) % len(speakers)]
            out.append(Message(len(out), sid, user, "user" if i % 2 == 0 else "assistant", text,
                               f"{sid}-m{i:03d}", start + timedelta(seconds=30 * i)))
    return out


@dataclass(frozen=True)
class Query:
    text: str
    target: Message


def speaker_pairs(corpus: list[Message], count: int, rng: random.Random) -> list[tuple[str, str]]:
    """``count`` distinct sessions, each with one of its speakers: (user, session) pairs whose
    first block is uncached. The session loop asks for its own speaker's block (the service
    caches only a block of a known session and one of its speakers, so a random user would
    never be served from the cache)."""
    speakers: dict[str, list[str]] = {}
    for m in corpus:
        if m.user_id not in speakers.setdefault(m.session_id, []):
            speakers[m.session_id].append(m.user_id)
    return [(rng.choice(speakers[sid]), sid) for sid in rng.sample(list(speakers), min(count, len(speakers)))]


def make_queries(corpus: list[Message], count: int, seed: int) -> list[Query]:
    rng = random.Random(seed)
    fillers = set(FILLERS)
    out = []
    while len(out) < count:
        target = rng.choice(corpus)
        words = list(dict.fromkeys(w.strip(".").lower() for w in target.text.split()))
        content = [w for w in words if w not in fillers]
        if len(content) >= 2:
            out.append(Query(" ".join(rng.sample(content, min(4, len(content)))), target))
    return out


# --- the service ----------------------------------------------------------------------------

def service_settings(**extra):
    from memory_service.config import Settings

    wanted = {"falkordb_url": None, "redis_url": None, "mongodb_uri": None,
              "memory_formation_msg_interval": NEVER, "memory_formation_token_interval": NEVER,
              "consider_cold_after_minutes": 10**7, **extra}
    return Settings(_env_file=None, **{k: v for k, v in wanted.items() if k in Settings.model_fields})


async def fill(service, corpus: list[Message], concurrency: int, console: Console, errors: list[str]) -> dict:
    from memory_service.domain.models import MessageIn

    by_session: dict[str, list[Message]] = {}
    for m in corpus:
        by_session.setdefault(m.session_id, []).append(m)
    gate = asyncio.Semaphore(concurrency)
    done = 0
    latencies: list[float] = []
    next_report = [0.1]
    started = time.perf_counter()

    async def one(sid: str, messages: list[Message]) -> None:
        nonlocal done
        async with gate:
            for i, m in enumerate(messages, start=1):
                t = time.perf_counter()
                result = await service.record_message(sid, MessageIn(
                    agent_id=AGENT, user_id=m.user_id, role=m.role, content=m.text, message_id=m.message_id,
                    created_at=m.created_at))
                latencies.append(time.perf_counter() - t)
                if result.duplicate or result.sequence != i:
                    errors.append(f"{sid}/{m.message_id}: sequence {result.sequence} (expected {i}), "
                                  f"duplicate {result.duplicate}")
                done += 1
                if done >= next_report[0] * len(corpus):
                    elapsed = time.perf_counter() - started
                    console.print(f"    {done:>7,} / {len(corpus):,} messages, {done / elapsed:,.0f} msgs/s")
                    next_report[0] += 0.1

    tasks = [asyncio.create_task(one(sid, msgs)) for sid, msgs in by_session.items()]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    wall = time.perf_counter() - started
    return {"messages": len(corpus), "sessions": len(by_session), "seconds": wall,
            "messages_per_s": len(corpus) / wall, "record": summarize_ms(latencies), "concurrency": concurrency}


async def fill_batches(service, corpus: list[Message], clients: int, batch_size: int, console: Console,
                       errors: list[str]) -> dict:
    """Fill through the batch route's service call (``MemoryService.record_batch``, what
    ``POST /v1/agents/{id}/messages/batch`` runs after reading the body): the sessions dealt
    to ``clients`` concurrent writers, each sending its sessions' messages in order, in
    batches of ``batch_size``; every item must be answered ``recorded`` with its session's
    next sequence number."""
    from memory_service.domain.models import BatchMessageIn

    by_session: dict[str, list[Message]] = {}
    for m in corpus:
        by_session.setdefault(m.session_id, []).append(m)
    lanes: list[list[Message]] = [[] for _ in range(clients)]
    for i, messages in enumerate(by_session.values()):
        lanes[i % clients].extend(messages)
    done = 0
    latencies: list[float] = []
    next_report = [0.05]
    started = time.perf_counter()

    async def one(lane: list[Message]) -> None:
        nonlocal done
        for at in range(0, len(lane), batch_size):
            chunk = lane[at:at + batch_size]
            t = time.perf_counter()
            out = await service.record_batch(AGENT, [BatchMessageIn(
                session_id=m.session_id, user_id=m.user_id, role=m.role, content=m.text, message_id=m.message_id,
                created_at=m.created_at) for m in chunk])
            latencies.append(time.perf_counter() - t)
            for m, item in zip(chunk, out.items, strict=True):
                expected = int(m.message_id.rsplit("-m", 1)[1]) + 1
                if item.status != "recorded" or item.sequence != expected:
                    errors.append(f"{m.session_id}/{m.message_id}: {item.status} sequence {item.sequence} "
                                  f"(expected recorded, {expected}) {item.detail or ''}")
            done += len(chunk)
            if done >= next_report[0] * len(corpus):
                elapsed = time.perf_counter() - started
                console.print(f"    {done:>9,} / {len(corpus):,} messages, {done / elapsed:,.0f} msgs/s, "
                              f"last batch {latencies[-1] * 1000:,.0f} ms")
                next_report[0] += 0.05

    await asyncio.gather(*(one(lane) for lane in lanes if lane))
    wall = time.perf_counter() - started
    return {"messages": len(corpus), "sessions": len(by_session), "seconds": wall, "route": "batch",
            "messages_per_s": len(corpus) / wall, "batch": summarize_ms(latencies), "clients": clients,
            "batch_size": batch_size}


async def form_all(service, sessions: list[str], concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    counts: dict[str, int] = {}

    async def one(sid: str) -> None:
        async with gate:
            summary = await service.form_memories(sid, wait=True)
            for kind, n in (getattr(summary, "memories", None) or {}).items():
                counts[str(kind)] = counts.get(str(kind), 0) + n

    started = time.perf_counter()
    await asyncio.gather(*(one(s) for s in sessions))
    return {"seconds": time.perf_counter() - started, "memories": counts}


class ServiceCalls:
    """The service's search and context calls, whatever shape their signatures have now."""

    def __init__(self, service):
        self.service = service
        search = getattr(service, "search", None)
        self.search_params = set(inspect.signature(search).parameters) if search else None
        self.context_params = set(inspect.signature(service.assemble_memory_context).parameters)

    def problems(self) -> list[str]:
        out = []
        if self.search_params is None:
            out.append("MemoryService has no search() yet: the search cases are skipped")
        if "query" not in self.context_params:
            out.append("assemble_memory_context() takes no query yet: the with-query case is skipped")
        if "budget" not in self.context_params:
            out.append("assemble_memory_context() takes no budget yet: blocks use the default budget")
        return out

    async def search(self, query: str, top_k: int = TOP_K, **scope):
        if self.search_params is None:
            raise BenchError("MemoryService has no search()")
        if "query" in self.search_params:
            return await self.service.search(AGENT, query, top_k=top_k, **scope)
        from memory_service.recall.search import SearchRequest  # a request-object signature

        return await self.service.search(AGENT, SearchRequest(query=query, top_k=top_k, **scope))

    async def context(self, user_id: str, session_id: str, query: str | None, budget: int):
        kwargs = {}
        if query is not None:
            kwargs["query"] = query
        if "budget" in self.context_params:
            kwargs["budget"] = budget
        return await self.service.assemble_memory_context(AGENT, user_id, session_id, **kwargs)


# --- the knowledge graph (--graph) ---------------------------------------------------------

GRAPH_TOPICS_PER_SESSION = 3


async def add_graph(service, corpus: list[Message], concurrency: int, console: Console) -> dict:
    """Entities, facts and mentions over ``corpus``, written with the store's API (module docstring)."""
    from memory_service.domain.graph import Entity, EntityType, Fact, entity_id, fact_id
    from memory_service.domain.namespaces import Namespace
    from memory_service.formation.steps import message_memory_id

    backend = (await service.agents.backend_for(AGENT))[1]
    started = time.perf_counter()
    entities: dict[str, Entity] = {}
    facts: dict[str, Fact] = {}
    mentions: dict[str, set[str]] = {}

    def entity(ns: str, name: str, type_: EntityType) -> Entity:
        made = Entity(id=entity_id(ns, name, type_), name=name, type=type_, namespace=ns)
        return entities.setdefault(made.id, made)

    def fact(ns: str, subject: Entity, predicate: str, obj: Entity, text: str) -> None:
        made = Fact(id=fact_id(ns, subject.id, predicate, obj.id), namespace=ns, subject_id=subject.id,
                    object_id=obj.id, predicate=predicate, text=text)
        facts.setdefault(made.id, made)

    by_session: dict[str, list[Message]] = {}
    for m in corpus:
        by_session.setdefault(m.session_id, []).append(m)
    fillers = set(FILLERS)
    for sid, messages in by_session.items():
        owner = messages[0].user_id
        ns = str(Namespace.user(AGENT, owner))
        person = entity(ns, owner, EntityType.PERSON)
        counts: dict[str, int] = {}
        for m in messages:
            for w in m.text.lower().strip(".").split():
                if w not in fillers:
                    counts[w] = counts.get(w, 0) + 1
        topics = [w for w, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:GRAPH_TOPICS_PER_SESSION]]
        named = [entity(ns, w.capitalize(), EntityType.OBJECT) for w in topics]
        for e in named:
            fact(ns, person, "likes", e, f"{owner} likes {e.name}.")
        for a, b in zip(named, named[1:], strict=False):
            fact(ns, a, "related_to", b, f"{a.name} goes with {b.name}.")
        for m in messages:
            words = set(m.text.lower().strip(".").split())
            if hit := [e.id for e, w in zip(named, topics, strict=True) if w in words]:
                mentions[message_memory_id(sid, m.message_id)] = set(hit)
    batch = list(entities.values())
    for i in range(0, len(batch), 500):
        await backend.upsert_entities(AGENT, batch[i:i + 500])
    fact_list = list(facts.values())
    for i in range(0, len(fact_list), 500):
        await backend.add_facts(AGENT, fact_list[i:i + 500])
    gate = asyncio.Semaphore(concurrency)

    async def one(memory_id: str, ids: set[str]) -> None:
        async with gate:
            await backend.mention(AGENT, memory_id, sorted(ids))

    await asyncio.gather(*(one(mid, ids) for mid, ids in mentions.items()))
    out = {"entities": len(entities), "facts": len(facts), "memories_mentioning": len(mentions),
           "mentions": sum(len(v) for v in mentions.values()), "seconds": time.perf_counter() - started}
    console.print(f"  graph: {out['entities']:,} entities, {out['facts']:,} facts, {out['mentions']:,} mentions "
                  f"from {out['memories_mentioning']:,} messages in {out['seconds']:.1f} s")
    return out


async def graph_share(service, calls: ServiceCalls, queries: list[Query], budget: int, errors: list[str]) -> list[dict]:
    """Search (agent and session scope) and the context with a query, each with the graph
    signal on and off, interleaved (alternating which goes first), blocks uncached."""
    settings = service.settings
    saved = (settings.search_graph_signal, settings.context_cache_ttl_seconds)
    settings.context_cache_ttl_seconds = 0
    times: dict[str, dict[bool, list[float]]] = {c: {True: [], False: []} for c in ("agent", "session", "context")}
    graph_hits = 0
    try:
        for i, q in enumerate(queries):
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                settings.search_graph_signal = on
                res, t = await timed(calls.search(q.text, scope="agent"))
                times["agent"][on].append(t)
                graph_hits += on and "graph" in res.signals
                check_results(res, TOP_K, f"graph share, search agent {i}", errors)
                res, t = await timed(calls.search(q.text, scope="session", session_id=q.target.session_id))
                times["session"][on].append(t)
                res, t = await timed(calls.context(q.target.user_id, q.target.session_id, q.text, budget))
                times["context"][on].append(t)
                check_block(res, budget, f"graph share, context {i}", errors)
                if res.source == "cache" or not res.sections.get("relevant"):
                    errors.append(f"graph share, context {i}: served from {res.source} with sections {res.sections}")
    finally:
        settings.search_graph_signal, settings.context_cache_ttl_seconds = saved
    rows = []
    for case, by in times.items():
        on, off = summarize_ms(by[True]), summarize_ms(by[False])
        rows.append({"case": {"agent": "search, scope agent", "session": "search, scope session",
                              "context": "context, with a query"}[case], "on": on, "off": off,
                     "on_ms": [round(x * 1000, 2) for x in by[True]], "off_ms": [round(x * 1000, 2) for x in by[False]],
                     "share_of_median": (on["median_ms"] - off["median_ms"]) / on["median_ms"],
                     "graph_signal_ran": graph_hits / len(queries) if case == "agent" else None})
    return rows


# --- baselines ------------------------------------------------------------------------------

def pack(texts: list[str], budget: int) -> str:
    head, tail = "<MemoryContext>\n", "</MemoryContext>"
    out, used = [], len(head) + len(tail)
    for text in texts:
        item = f"  <Memory>{escape(text)}</Memory>\n"
        if used + len(item) > budget:
            break
        out.append(item)
        used += len(item)
    return head + "".join(out) + tail


# --- measuring ------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    service: list[float]
    baseline: list[float]
    baseline_name: str
    extra: dict

    def row(self) -> dict:
        s, b = summarize_ms(self.service), summarize_ms(self.baseline)
        ratio = s["median_ms"] / b["median_ms"] if s.get("median_ms") and b.get("median_ms") else None
        return {"case": self.name, "service": s, "baseline": b, "baseline_name": self.baseline_name,
                "ratio": ratio, **self.extra}


def time_baseline(fn: Callable[[], object]) -> float:
    """One calibrated sample of a fast synchronous baseline call, seconds per call."""
    return sample(fn, calls_per_sample(fn, MIN_BASELINE_SAMPLE_SECONDS))


async def timed(coro: Awaitable) -> tuple[object, float]:
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


def check_block(rendered, budget: int | None, where: str, errors: list[str]) -> None:
    xml = rendered.xml
    if len(xml) != rendered.chars or (budget is not None and rendered.chars > budget):
        errors.append(f"{where}: {len(xml)} chars (reported {rendered.chars}) for a budget of {budget}")
    try:
        ET.fromstring(xml)
    except ET.ParseError as exc:
        errors.append(f"{where}: the block does not parse: {exc}")


def check_results(result, top_k: int, where: str, errors: list[str], session_id: str | None = None) -> None:
    results = result.results
    if len(results) > top_k:
        errors.append(f"{where}: {len(results)} results for top_k={top_k}")
    for r in results:
        ns = str(getattr(r, "namespace", ""))
        if session_id is not None and ns != f"session:{session_id}":
            errors.append(f"{where}: result {r.id} from {ns}, outside session {session_id}")
        elif session_id is None and ns.startswith(("user:", "shard:", "agent:")) and ns.split(":")[1] != AGENT:
            errors.append(f"{where}: result {r.id} from another agent's namespace {ns}")


class QueryCost:
    """The service's own embedder for everything, and for each query the default local model
    too, its time counted (``--query-embedder local``).

    Filling 100,000 memories through the local model would take most of an hour on 2 cores,
    so a large store is filled with the hash embedder; yet the target counts the query's
    embedding by the local model. Each query is embedded by both: the local model's cost is
    paid inside the timed search, and the hash vector (the one comparable with the stored
    vectors) is what the search uses."""

    def __init__(self, stored, local):
        self.stored, self.local = stored, local
        self.dimension, self.name = stored.dimension, stored.name

    def __getattr__(self, name):
        return getattr(self.stored, name)

    async def embed(self, texts, *, query: bool = False):
        if query:
            await self.local.embed(texts, query=True)
        return await self.stored.embed(texts, query=query)


async def embedded_all(service, timeout: float = 900.0) -> float:
    """Wait until the worker has embedded every stored message (the vector signal needs them);
    seconds waited."""
    _, backend = await service.agents.backend_for(AGENT)
    started = time.perf_counter()
    while await backend.unembedded(AGENT, 1) and time.perf_counter() - started < timeout:
        await asyncio.sleep(0.5)
    return time.perf_counter() - started


async def indexes_operational(service, timeout: float = 900.0) -> float:
    """Wait until FalkorDB has rebuilt the agent's indexes (a kept store reopened: it loads
    them in the background, and until then every read by id or group scans the whole graph;
    measured: a reopened 5,000 store's block p95 ~ 100 ms for its first seconds); seconds waited."""
    _, backend = await service.agents.backend_for(AGENT)
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        rows = await backend._read(AGENT, "CALL db.indexes() YIELD status RETURN status")
        if all(row["status"] == "OPERATIONAL" for row in rows):
            break
        await asyncio.sleep(0.5)
    return time.perf_counter() - started


async def store_memory(service) -> dict:
    """The store's memory (``INFO memory``) and the postings' share of it (``MEMORY USAGE``
    of every postings key of the agent)."""
    from memory_service.state import keyspace

    _, backend = await service.agents.backend_for(AGENT)
    redis = backend.client.connection
    used = int((await redis.info("memory"))["used_memory"])
    postings, keys = 0, 0
    if (prefix := getattr(keyspace, "postings_prefix", None)) is not None:  # an older checkout has none
        pattern = prefix(AGENT).replace("{", "\\{").replace("}", "\\}") + "*"
        async for key in redis.scan_iter(match=pattern, count=1000):
            postings += int(await redis.memory_usage(key, samples=0) or 0)
            keys += 1
    return {"used_memory": used, "postings_bytes": postings, "postings_keys": keys}


async def run_size(n: int, repeat: int, budget: int, concurrency: int, form: bool, use_dense: bool,
                   console: Console, errors: list[str], graph: bool = False, query_embedder: str | None = None,
                   route: str = "batch", batch_size: int = 500, store: Path | None = None) -> dict:
    from memory_service.runtime import open_service

    console.rule(f"N = {n:,} messages")
    corpus = make_corpus(n)
    texts = [m.text for m in corpus]
    sessions = list(dict.fromkeys(m.session_id for m in corpus))
    span = {sid: [] for sid in sessions}
    for m in corpus:
        span[m.session_id].append(m.index)
    out: dict = {"n": n, "sessions": len(sessions), "users": len({m.user_id for m in corpus}), "notes": []}

    # Baselines' indexes (their ingest figures).
    start = time.perf_counter()
    bm25 = BM25Index(texts)
    bm25_seconds = time.perf_counter() - start
    embedder, note = await load_embedder() if use_dense else (None, "dense baseline off (--no-dense)")
    dense = None
    dense_seconds = None
    if embedder:
        start = time.perf_counter()
        dense = DenseIndex(await embedder.embed(texts))
        dense_seconds = time.perf_counter() - start
    else:
        out["notes"].append(note)
    out["baseline_ingest"] = {"bm25_docs_per_s": n / bm25_seconds,
                              "dense_docs_per_s": n / dense_seconds if dense_seconds else None}

    with contextlib.ExitStack() as stack:
        if store is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="latency-bench-")))
        else:
            data_dir = store / f"n{n}"
            data_dir.mkdir(parents=True, exist_ok=True)
        filled = data_dir / "filled.json"  # a kept store's fill: its figures, written once it completed
        async with open_service(service_settings(), data_dir=data_dir, run_worker=True) as service:
            calls = ServiceCalls(service)
            for problem in calls.problems():
                console.print(f"  [yellow]note[/yellow]: {problem}")
                out["notes"].append(problem)
            if filled.exists():
                out["ingest"] = json.loads(filled.read_text())
                out["notes"].append(f"store kept in {data_dir}: filled by an earlier run (its ingest figures)")
                await service.state.cache.purge_agent(AGENT)  # the earlier run's blocks: every first call uncached
                waited = await indexes_operational(service)
                console.print(f"  store kept in {data_dir}, filled earlier (indexes operational after {waited:.1f} s)")
            else:
                console.print(f"  filling through the {route} route: {n:,} messages in {len(sessions):,} sessions, "
                              f"{out['users']} users, "
                              + (f"{concurrency} sessions at once ..." if route == "single"
                                 else f"{concurrency} clients, batches of {batch_size} ..."))
                if route == "single":
                    out["ingest"] = await fill(service, corpus, concurrency, console, errors)
                else:
                    out["ingest"] = await fill_batches(service, corpus, concurrency, batch_size, console, errors)
                console.print(f"  ingest: {out['ingest']['messages_per_s']:.1f} msgs/s "
                              f"({out['ingest']['seconds']:.1f} s)")
                out["embedding_lag_s"] = await embedded_all(service, timeout=max(900.0, n / 100))
                out["ingest"]["embedding_lag_s"] = out["embedding_lag_s"]
                if store is not None and not errors:
                    filled.write_text(json.dumps(out["ingest"]))
            out["memory"] = await store_memory(service)
            out["memory"]["per_memory_bytes"] = out["memory"]["used_memory"] / n
            out["memory"]["postings_per_memory_bytes"] = out["memory"]["postings_bytes"] / n
            console.print(f"  store memory: {out['memory']['per_memory_bytes']:,.0f} bytes per memory, of which "
                          f"postings {out['memory']['postings_per_memory_bytes']:,.0f} "
                          f"({out['memory']['postings_keys']:,} keys)")
            if query_embedder:
                from memory_service.config import Settings
                from memory_service.embedding.embedders import build_embedder

                local = build_embedder(Settings(_env_file=None, embedder=query_embedder))
                if callable(start := getattr(local, "start", None)):
                    await start()
                service.retriever.embedder = QueryCost(service.retriever.embedder, local)
                out["notes"].append(f"each query is also embedded by the {query_embedder} model, inside the timing; "
                                    "the search uses the store's own embedder's vector")
            if form:
                out["formation"] = await form_all(service, sessions, concurrency)
                console.print(f"  formed every session in {out['formation']['seconds']:.1f} s: "
                              f"{out['formation']['memories']}")
            if graph:
                out["graph"] = await add_graph(service, corpus, concurrency, console)

            queries = make_queries(corpus, repeat, SEED + n)
            pairs = speaker_pairs(corpus, repeat, random.Random(SEED + 1))
            cases: list[Case] = []

            # Warm-up (first-call costs: index loads, the embedder's first run).
            if calls.search_params is not None:
                await calls.search(queries[0].text, scope="agent")
            bm25.rank(queries[0].text, TOP_K)

            if calls.search_params is not None:
                svc_a, svc_s, base_a, base_s, hyb = [], [], [], [], []
                hits = {"service_agent": 0, "service_session": 0, "bm25_agent": 0, "bm25_session": 0, "hybrid": 0}
                for i, q in enumerate(queries):
                    sid = q.target.session_id
                    mask = np.zeros(n, dtype=np.float32)

                    def bm25_session(q=q, sid=sid, mask=mask) -> list[int]:
                        mask[:] = 0
                        mask[span[sid][0]:span[sid][-1] + 1] = 1
                        return [d for d in bm25.rank(q.text, TOP_K, weight_mask=mask) if mask[d]]

                    order = (0, 1) if i % 2 == 0 else (1, 0)
                    for which in order:
                        if which == 0:
                            res, t = await timed(calls.search(q.text, scope="agent"))
                            svc_a.append(t)
                            check_results(res, TOP_K, f"search agent {i}", errors)
                            hits["service_agent"] += q.target.message_id in {x for r in res.results[:10]
                                                                             for x in r.source_message_ids}
                            res, t = await timed(calls.search(q.text, scope="session", session_id=sid))
                            svc_s.append(t)
                            check_results(res, TOP_K, f"search session {i}", errors, session_id=sid)
                            hits["service_session"] += q.target.message_id in {x for r in res.results[:10]
                                                                               for x in r.source_message_ids}
                        else:
                            base_a.append(time_baseline(lambda q=q: bm25.rank(q.text, TOP_K)))
                            hits["bm25_agent"] += q.target.index in bm25.rank(q.text, TOP_K)
                            base_s.append(time_baseline(bm25_session))
                            hits["bm25_session"] += q.target.index in bm25_session()
                            if dense is not None:
                                start = time.perf_counter()
                                qv = (await embedder.embed([q.text], query=True))[0]
                                fused = rrf([bm25.rank(q.text, 50), dense.rank(qv, 50)], limit=TOP_K)
                                hyb.append(time.perf_counter() - start)
                                hits["hybrid"] += q.target.index in fused
                cases.append(Case("search, scope agent", svc_a, base_a, "BM25 top 10 (bm25s)",
                                  {"hit@10": {"service": hits["service_agent"] / len(queries),
                                              "baseline": hits["bm25_agent"] / len(queries)}}))
                if hyb:
                    cases.append(Case("search, scope agent (vs hybrid)", svc_a, hyb,
                                      "cosine + BM25 top 50 each, RRF",
                                      {"hit@10": {"service": hits["service_agent"] / len(queries),
                                                  "baseline": hits["hybrid"] / len(queries)}}))
                cases.append(Case("search, scope session", svc_s, base_s, "BM25, other sessions masked",
                                  {"hit@10": {"service": hits["service_session"] / len(queries),
                                              "baseline": hits["bm25_session"] / len(queries)}}))

            asked_budget = budget if "budget" in calls.context_params else None
            if "query" in calls.context_params:
                svc, base = [], []
                for i, q in enumerate(queries):
                    order = (0, 1) if i % 2 == 0 else (1, 0)
                    for which in order:
                        if which == 0:
                            res, t = await timed(calls.context(q.target.user_id, q.target.session_id, q.text, budget))
                            svc.append(t)
                            check_block(res, asked_budget, f"context with query {i}", errors)
                        else:
                            base.append(time_baseline(
                                lambda q=q: pack([texts[d] for d in bm25.rank(q.text, 50)], budget)))
                cases.append(Case("context, with a query", svc, base, "BM25 top 50 packed", {}))

            svc_u, svc_c, base = [], [], []
            not_cached = 0
            cached_first = 0
            for i, (user, sid) in enumerate(pairs):
                def recency(sid=sid) -> str:
                    return pack([texts[d] for d in reversed(span[sid])], budget)

                order = (0, 1) if i % 2 == 0 else (1, 0)
                for which in order:
                    if which == 0:
                        res, t = await timed(calls.context(user, sid, None, budget))
                        svc_u.append(t)
                        cached_first += getattr(res, "source", "") == "cache"
                        check_block(res, asked_budget, f"context {user}/{sid}", errors)
                        res, t = await timed(calls.context(user, sid, None, budget))
                        svc_c.append(t)
                        not_cached += getattr(res, "source", "cache") != "cache"
                        check_block(res, asked_budget, f"context {user}/{sid} (cached)", errors)
                    else:
                        base.append(time_baseline(recency))
            if cached_first:
                errors.append(f"{cached_first} of {len(pairs)} first context calls were served from the cache")
            if not_cached:
                errors.append(f"{not_cached} of {len(pairs)} repeated context calls were not served from the cache")
            cases.append(Case("context, no query, uncached", svc_u, base, "session's last messages packed",
                              {"served_from_cache": cached_first}))
            cases.append(Case("context, no query, cached", svc_c, base, "session's last messages packed", {}))
            if graph:
                # Queries of their own: the blocks of ``queries`` are cached already.
                out["graph_share"] = await graph_share(service, calls, make_queries(corpus, repeat, SEED + n + 1),
                                                       budget, errors)

    await close_embedder(embedder)
    out["cases"] = [c.row() for c in cases]
    out["budget"] = budget
    out["budget_applied"] = "budget" in calls.context_params
    return out


# --- reporting ------------------------------------------------------------------------------

def ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.3f}" if value < 10 else f"{value:.1f}")


def size_table(result: dict, repeat: int) -> Table:
    t = Table(title=f"N = {result['n']:,} memories ({result['sessions']:,} sessions, {result['users']} users); "
                    f"ms per call, {repeat} samples")
    for col in ("case", "service median", "service p95", "baseline median", "baseline p95", "ratio", "hit@10 svc/base",
                "baseline"):
        t.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for c in result["cases"]:
        s, b = c["service"], c["baseline"]
        hit = c.get("hit@10")
        t.add_row(c["case"], ms(s.get("median_ms")), ms(s.get("p95_ms")), ms(b.get("median_ms")), ms(b.get("p95_ms")),
                  "-" if c["ratio"] is None else f"{c['ratio']:.1f}x",
                  f"{hit['service']:.2f}/{hit['baseline']:.2f}" if hit else "", c["baseline_name"])
    if mem := result.get("memory"):
        t.caption = (f"store: {mem['per_memory_bytes']:,.0f} bytes per memory (INFO used_memory / N), "
                     f"postings {mem['postings_per_memory_bytes']:,.0f}")
    ing, base = result.get("ingest"), result.get("baseline_ingest", {})
    if ing:
        t.add_row("ingest (msgs/s)", f"{ing['messages_per_s']:,.1f}", "", f"{base['bm25_docs_per_s']:,.0f}", "",
                  f"{ing['messages_per_s'] / base['bm25_docs_per_s']:.4f}x", "", "bm25s indexing, docs/s")
        if base.get("dense_docs_per_s"):
            t.add_row("ingest (msgs/s)", f"{ing['messages_per_s']:,.1f}", "", f"{base['dense_docs_per_s']:,.0f}", "",
                      f"{ing['messages_per_s'] / base['dense_docs_per_s']:.3f}x", "", "embedding, docs/s")
    return t


def graph_table(result: dict) -> Table:
    g = result["graph"]
    t = Table(title=f"N = {result['n']:,}: the graph signal's share ({g['entities']:,} entities, {g['facts']:,} facts, "
                    f"{g['mentions']:,} mentions); on / off interleaved, same queries")
    for col in ("case", "on median ms", "on p95 ms", "off median ms", "off p95 ms", "graph's share of the median"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for row in result["graph_share"]:
        t.add_row(row["case"], ms(row["on"]["median_ms"]), ms(row["on"]["p95_ms"]), ms(row["off"]["median_ms"]),
                  ms(row["off"]["p95_ms"]), f"{row['share_of_median']:.0%}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="memories per run, comma-separated")
    parser.add_argument("--quick", action="store_true", help=f"N = 1,000 only, {QUICK_REPEAT} samples per case")
    parser.add_argument("--repeat", type=int, default=50, help="samples per case (default 50)")
    parser.add_argument("--budget", type=int, default=4000, help="context budget in chars (default 4000)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="sessions recorded at once (--route single, default 16) or clients each sending "
                             "its sessions' batches (--route batch, default 4)")
    parser.add_argument("--form", action="store_true", help="form every session after the fill")
    parser.add_argument("--no-dense", action="store_true", help="no dense baseline even if an embedder exists")
    parser.add_argument("--graph", action="store_true",
                        help="write a knowledge graph over the messages and time the graph signal's share")
    parser.add_argument("--query-embedder", metavar="NAME",
                        help="also embed each query with this embedder (e.g. local) inside the timing, the store "
                             "filled with EMBEDDER's vectors (see QueryCost)")
    parser.add_argument("--route", choices=("batch", "single"), default="batch",
                        help="fill through the batch route's call (default) or one message at a time")
    parser.add_argument("--batch-size", type=int, default=500, help="messages per batch (--route batch)")
    parser.add_argument("--store", type=Path, metavar="DIR",
                        help="keep each size's store in DIR/n<N> and reuse it when a run filled it before")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: not a comma-separated list of integers: {args.sizes!r}")
    if args.quick:
        sizes, repeat = [1000], min(args.repeat, QUICK_REPEAT)
    else:
        repeat = args.repeat
    if not sizes or min(sizes) < MESSAGES_PER_SESSION or repeat < 1:
        parser.error(f"sizes must be at least {MESSAGES_PER_SESSION}, --repeat at least 1")
    logging.basicConfig(level=logging.WARNING)

    console = Console() if sys.stdout.isatty() else Console(width=160)
    header = print_machine(console, "latency_bench")
    console.print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if args.concurrency is None:
        args.concurrency = 16 if args.route == "single" else 4
    started = time.perf_counter()
    errors: list[str] = []
    results, failure = [], None
    for n in sizes:
        try:
            results.append(asyncio.run(run_size(n, repeat, args.budget, args.concurrency, args.form,
                                                not args.no_dense, console, errors, args.graph,
                                                args.query_embedder, args.route, args.batch_size, args.store)))
        except BenchError as exc:
            failure = str(exc)
            break
        console.print(size_table(results[-1], repeat))
        if "graph_share" in results[-1]:
            console.print(graph_table(results[-1]))
        for note in results[-1]["notes"]:
            console.print(f"  note: {note}")
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; took {time.perf_counter() - started:.1f} s. "
                  "ratio = service median / baseline median (ingest: service msgs/s / baseline docs/s).")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "latency_bench", "machine": header,
            "settings": {"sizes": sizes, "repeat": repeat, "budget": args.budget, "concurrency": args.concurrency,
                         "form": args.form, "graph": args.graph, "messages_per_session": MESSAGES_PER_SESSION, "seed": SEED, "top_k": TOP_K},
            "results": results, "errors": errors, "failure": failure,
        }, indent=1, default=str) + "\n")
        console.print(f"results written to {args.json}")
    for error in errors[:50]:
        console.print(f"[red]FAIL[/red] {error}")
    if failure:
        console.print(f"[red]FAIL[/red] {failure}")
    if errors or failure:
        return 1
    console.print("correctness: every message recorded once; results within top_k and scope; blocks within budget "
                  "and parseable; repeated calls served from the cache.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
