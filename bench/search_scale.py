"""Benchmark: agent-wide search at scale on real text and on the worst case (issue 34, item 4).

Two corpora, each filled into ONE agent through the batch route's service call
(``MemoryService.record_batch``, what ``POST /v1/agents/{id}/messages/batch`` runs after reading
the body: 4 clients, each sending its sessions' messages in order, 500 a batch; formation
gates closed, so the memories are the messages):

* ``lme``: the real turns of the LongMemEval-S dev haystacks (``longmemeval_s_dev.json.gz``,
  the path an argument). Every haystack session once (some haystacks repeat a session id),
  every turn once: a turn whose (role, content) was sent already is left out (haystacks share
  sessions and turns); empty turns are left out; a turn longer than MAX_MESSAGE_CHARS (32,000)
  is cut to it. One user per haystack (the first haystack a session appears in), one service
  session per haystack session, each turn dated by its session. Queries: the questions that
  have evidence (not ``_abs``, at least one ``has_answer`` turn); a hit is any of the
  question's evidence turns among the top 10.
* ``vocab``: N chat turns drawn from about 100 everyday words (and stopwords), so every query
  word is common: the worst case for postings that stop early. Queries: 4 distinct content
  words of a random turn; a hit is that turn in the top 10.

The stored vectors come from ``EMBEDDER`` (the hash embedder: filling 100,000 memories through
the local model takes most of an hour on 2 cores); each query is ALSO embedded by the default
local model inside the timed search (``--query-embedder local``, latency_bench.QueryCost): its
cost is counted, the hash vector (the one comparable with the stored ones) is searched.

Per query, interleaved (the order alternating), in the same process:

| case | what |
|---|---|
| service | ``service.search(agent, q, scope="agent", top_k=10)``, the query's local embedding included |
| postings top 50 | the full-text signal alone (``Postings.top``: what fusion takes), its memories scored |
| exact BM25 | brute force over every text with the service's own analyzer and constants (numpy) |
| bm25s | brute-force BM25 (bm25s: its tokenizer, no stemming) over the same texts |

Prints and writes (``--json``) the machine, medians, p95, hit@10 of each, and the ratios.
``--postings-only`` skips the service: the texts are indexed straight into the postings of a
fresh embedded server (``Postings.index``, batches of 2,000), for a size the service cannot be
filled to here (1,000,000).

    EMBEDDER=hash EMBEDDING_DIMENSION=384 .venv/bin/python bench/search_scale.py lme \\
        --data ../shared/bench/longmemeval_s_dev.json.gz --store /tmp/ss-store --json out.json
    EMBEDDER=hash EMBEDDING_DIMENSION=384 .venv/bin/python bench/search_scale.py vocab --n 100000 ...
    .venv/bin/python bench/search_scale.py vocab --n 1000000 --postings-only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import math
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import numpy as np  # noqa: E402
from baselines import BM25Index  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from latency_bench import QueryCost, embedded_all, indexes_operational, service_settings  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

AGENT = "scale-agent"
SEED = 20261208
TOP_K = 10
CANDIDATES = 50  # SEARCH_CANDIDATES: what the full-text signal gives fusion
MAX_CHARS = 32_000  # MAX_MESSAGE_CHARS's default
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Message:
    index: int
    session_id: str
    user_id: str
    role: str
    content: str
    message_id: str
    created_at: datetime
    position: int  # 1-based place in its session: the sequence the service must answer

    @property
    def search_text(self) -> str:
        """What the service indexes (``Memory.search_text``): the content under its speaker."""
        return f"{self.user_id if self.role == 'user' else self.role}: {self.content}"


@dataclass(frozen=True)
class Query:
    text: str
    targets: frozenset[int]  # message indices; a hit is any of them in the top 10
    kind: str = ""


@dataclass
class Corpus:
    name: str
    messages: list[Message]
    queries: list[Query]
    notes: dict = field(default_factory=dict)


# --- the real text: LongMemEval-S dev haystacks ----------------------------------------------

def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:80]


def _lme_date(text: str) -> datetime:
    return datetime.strptime(text.split(" (")[0] + " " + text.rsplit(" ", 1)[1], "%Y/%m/%d %H:%M").replace(tzinfo=UTC)


def lme_corpus(path: Path, questions: int | None = None) -> Corpus:
    data = json.load(gzip.open(path))
    if questions:
        data = data[:questions]
    seen_sessions: set[str] = set()
    first: dict[tuple[str, str], int] = {}
    messages: list[Message] = []
    turns = empty = cut = repeated = 0
    queries = []
    for q_index, q in enumerate(data):
        user = f"u{q_index:03d}"
        evidence: set[int] = set()
        for sid, date, session in zip(q["haystack_session_ids"], q["haystack_dates"], q["haystack_sessions"],
                                      strict=True):
            new_session = sid not in seen_sessions
            seen_sessions.add(sid)
            service_sid = f"lme-{_safe(sid)}"
            start = _lme_date(date)
            for i, turn in enumerate(session):
                content = turn["content"]
                if new_session:
                    turns += 1
                if not content.strip():
                    empty += new_session
                    continue
                if len(content) > MAX_CHARS:
                    cut += new_session
                    content = content[:MAX_CHARS]
                key = (turn["role"], content)
                if key not in first and new_session:
                    position = 1 + sum(1 for m in messages[-len(session):] if m.session_id == service_sid)
                    first[key] = len(messages)
                    messages.append(Message(len(messages), service_sid, user, turn["role"], content,
                                            f"{service_sid}-t{i:03d}", start + timedelta(seconds=30 * i), position))
                elif new_session:
                    repeated += 1
                if turn.get("has_answer") and key in first:
                    evidence.add(first[key])
        if not q["question_id"].endswith("_abs") and evidence:
            queries.append(Query(q["question"], frozenset(evidence), q["question_type"]))
    return Corpus("lme", messages, queries, {
        "haystacks": len(data), "sessions": len(seen_sessions), "turns_in_distinct_sessions": turns,
        "empty_left_out": empty, "repeated_turns_left_out": repeated, "cut_to_32000_chars": cut,
        "questions_with_evidence": len(queries)})


# --- the worst case: a small everyday vocabulary ------------------------------------------------

EVERYDAY = """time day good work home think like want need know today tomorrow week friend family call lunch
dinner coffee morning night weekend plan meeting car house school kids dog weather rain sunny happy tired busy
great nice fun movie book music game play run walk eat cook buy shop store money pay help talk text phone email
late early soon later ready start finish long big small new old hot cold water food pizza bread tea park city trip
travel train bus office boss team project idea problem question answer check send read write watch sleep clean
room door love feel party birthday gift""".split()
FILLERS = ("the a and to of in I you it is that for on with we was my this be at so but not have are can will "
           "just about what there when your all").split()


def vocab_corpus(n: int, queries: int, seed: int = SEED) -> Corpus:
    """``n`` chat turns of 6-24 words: 30 % stopwords, the rest from EVERYDAY with weights
    1 / (rank + 10) (the commonest word 10 times as frequent as the rarest, every one common),
    50 turns a session, one or two of 500 users a session."""
    rng = random.Random(seed)
    vocab = list(dict.fromkeys(EVERYDAY))
    weights = [1.0 / (r + 10) for r in range(len(vocab))]
    users = [f"user-{i:03d}" for i in range(500)]
    messages: list[Message] = []
    per_session = 50
    for s in range(math.ceil(n / per_session)):
        sid = f"chat-{s:05d}"
        speakers = rng.sample(users, rng.choice((1, 1, 2)))
        start = T0 + timedelta(hours=6 * s)
        for i in range(min(per_session, n - len(messages))):
            words = [rng.choice(FILLERS) if rng.random() < 0.3 else rng.choices(vocab, weights)[0]
                     for _ in range(rng.randint(6, 24))]
            role = "user" if i % 2 == 0 else "assistant"
            messages.append(Message(len(messages), sid, speakers[(i // 2) % len(speakers)], role,
                                    " ".join(words).capitalize() + ".", f"{sid}-m{i:03d}",
                                    start + timedelta(seconds=30 * i), i + 1))
    fillers = {w.lower() for w in FILLERS}
    out: list[Query] = []
    qrng = random.Random(seed + n)
    while len(out) < queries:
        target = qrng.choice(messages)
        content = [w for w in dict.fromkeys(w.strip(".").lower() for w in target.content.split()) if w not in fillers]
        if len(content) >= 2:
            out.append(Query(" ".join(qrng.sample(content, min(4, len(content)))), frozenset([target.index])))
    return Corpus("vocab", messages, out, {"vocabulary": len(vocab), "fillers": len(FILLERS)})


# --- the brute-force baselines ------------------------------------------------------------------

class ExactBM25:
    """BM25 over every text with the service's analyzer and constants (``bm25.indexed``: stems,
    stopwords out; K1, B; idf from the live counts), scored by brute force over each query
    stem's whole list: the exact top k the postings' early termination must not lose."""

    def __init__(self, texts: list[str]):
        from memory_service.domain import bm25

        self.bm25 = bm25
        lists: dict[str, tuple[list[int], list[int]]] = {}
        lengths = np.zeros(len(texts), dtype=np.float64)
        for i, text in enumerate(texts):
            length, counts = bm25.indexed(text)
            lengths[i] = length
            for term, tf in counts.items():
                ids, tfs = lists.setdefault(term, ([], []))
                ids.append(i)
                tfs.append(tf)
        self.n = len(texts)
        average = max(float(lengths.mean()), 1e-9) if self.n else 1.0
        self.norm = bm25.K1 * (1 - bm25.B + bm25.B * lengths / average)
        self.lists = {t: (np.array(ids, dtype=np.int64), np.array(tfs, dtype=np.float64))
                      for t, (ids, tfs) in lists.items()}
        self.scores = np.zeros(self.n, dtype=np.float64)

    def rank(self, query: str, k: int) -> list[int]:
        from memory_service.domain.text import stem
        from memory_service.recall.search import query_terms

        stems = list(dict.fromkeys(stem(t) for t in query_terms(query)))[:32]
        scores = self.scores
        scores[:] = 0
        touched = []
        for s in stems:
            if s not in self.lists:
                continue
            ids, tfs = self.lists[s]
            weight = self.bm25.idf(self.n, len(ids))
            scores[ids] += weight * tfs * (self.bm25.K1 + 1) / (tfs + self.norm[ids])
            touched.append(ids)
        if not touched:
            return []
        candidates = np.unique(np.concatenate(touched))
        if len(candidates) > k:
            part = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
        else:
            part = candidates
        return [int(i) for i in sorted(part, key=lambda i: (-scores[i], i))]


BEFORE = "scale-agent-before"
BEFORE_BUDGET = 20_000  # the first layout's SEARCH_POSTINGS_BUDGET: memories scored


def before_postings(root: Path):
    """The postings module of another checkout (``--compare-before``: the first layout, sorted
    sets read best first), loaded beside this one; its keys are another agent's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("postings_before", root / "memory_service/backends/postings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class _Ids(dict):
    """Message id or memory id -> corpus index, a replicated copy's id ("<id>#r<copy>") too."""

    def __missing__(self, key: str) -> int:
        if "#r" not in key:
            raise KeyError(key)
        return self[key.split("#r", 1)[0]]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]


async def timed(coro):
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


def clocked(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


# --- filling ------------------------------------------------------------------------------------

async def fill(service, messages: list[Message], clients: int, batch_size: int, console: Console,
               errors: list[str]) -> dict:
    """The batch route's service call, as latency_bench.fill_batches, for these messages."""
    from memory_service.domain.models import BatchMessageIn

    by_session: dict[str, list[Message]] = {}
    for m in messages:
        by_session.setdefault(m.session_id, []).append(m)
    lanes: list[list[Message]] = [[] for _ in range(clients)]
    for i, msgs in enumerate(by_session.values()):
        lanes[i % clients].extend(msgs)
    done, latencies, started = 0, [], time.perf_counter()
    report = [0.05]

    async def lane(items: list[Message]) -> None:
        nonlocal done
        for at in range(0, len(items), batch_size):
            chunk = items[at:at + batch_size]
            t = time.perf_counter()
            out = await service.record_batch(AGENT, [BatchMessageIn(
                session_id=m.session_id, user_id=m.user_id, role=m.role, content=m.content, message_id=m.message_id,
                created_at=m.created_at) for m in chunk])
            latencies.append(time.perf_counter() - t)
            for m, item in zip(chunk, out.items, strict=True):
                if item.status != "recorded" or item.sequence != m.position:
                    errors.append(f"{m.session_id}/{m.message_id}: {item.status} sequence {item.sequence} "
                                  f"(expected recorded, {m.position}) {item.detail or ''}")
            done += len(chunk)
            if done >= report[0] * len(messages):
                console.print(f"    {done:>9,} / {len(messages):,} messages, "
                              f"{done / (time.perf_counter() - started):,.0f} msgs/s")
                report[0] += 0.05

    await asyncio.gather(*(lane(items) for items in lanes if items))
    wall = time.perf_counter() - started
    return {"messages": len(messages), "sessions": len(by_session), "seconds": wall,
            "messages_per_s": len(messages) / wall, "batch": summarize_ms(latencies), "clients": clients,
            "batch_size": batch_size}


def fingerprint(corpus: Corpus) -> str:
    digest = hashlib.sha256()
    for m in corpus.messages:
        digest.update(f"{m.message_id}\x00{m.content}\x01".encode())
    return digest.hexdigest()[:16]


# --- measuring ----------------------------------------------------------------------------------

async def measure(corpus: Corpus, args, console: Console, errors: list[str]) -> dict:
    from memory_service.backends.postings import Postings
    from memory_service.recall.search import query_terms
    from memory_service.runtime import open_service

    texts = [m.search_text for m in corpus.messages]
    n = len(texts)
    out: dict = {"corpus": corpus.name, "n": n, "queries": len(corpus.queries), "notes": dict(corpus.notes)}
    console.rule(f"{corpus.name}: {n:,} memories, {len(corpus.queries)} queries")
    copies = args.replicate if args.postings_only else 1
    exact = bm25s = None
    if copies == 1:
        started = time.perf_counter()
        exact = ExactBM25(texts)
        out["exact_bm25_index_s"] = time.perf_counter() - started
        started = time.perf_counter()
        bm25s = None if args.no_bm25s else BM25Index(texts)
        out["bm25s_index_s"] = time.perf_counter() - started
        console.print(f"  baselines indexed: exact BM25 {out['exact_bm25_index_s']:.1f} s, "
                      f"bm25s {out['bm25s_index_s']:.1f} s")
    else:
        out["notes"]["replicate"] = (f"every text indexed {copies} times under ids of its own (lists {copies} times "
                                     "as long, the vocabulary unchanged: the postings' worst growth); no baselines")
    budget = args.budget

    older = None
    async with contextlib.AsyncExitStack() as stack:
        if args.postings_only:
            import redis.asyncio as aredis

            from memory_service.backends.embedded import EmbeddedFalkorDB

            store = EmbeddedFalkorDB(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ss-postings-"))))
            redis = aredis.from_url(store.start(), decode_responses=True, socket_timeout=600)
            stack.callback(store.stop)
            postings = Postings(redis)
            started = time.perf_counter()
            for copy in range(copies):
                suffix = f"#r{copy}" if copy else ""
                for i in range(0, n, 500):  # the batch route's size
                    await postings.index(AGENT, [(m.message_id + suffix, t) for m, t in
                                                 zip(corpus.messages[i:i + 500], texts[i:i + 500], strict=True)],
                                         fresh=i == 0 and copy == 0)
            out["ingest"] = {"postings_index_s": time.perf_counter() - started}
            if args.compare_before:
                older = before_postings(args.compare_before).Postings(redis)
                started = time.perf_counter()
                for i in range(0, n, 500):
                    await older.index(BEFORE, [(m.message_id, t) for m, t in
                                               zip(corpus.messages[i:i + 500], texts[i:i + 500], strict=True)],
                                      fresh=i == 0)
                out["ingest"]["before_postings_index_s"] = time.perf_counter() - started
            service = None
            out["memory"] = {"used_memory": int((await redis.info("memory"))["used_memory"])}
        else:
            if args.store is None:
                data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="search-scale-")))
            else:
                data_dir = args.store / f"{corpus.name}-{n}-{fingerprint(corpus)}"
                data_dir.mkdir(parents=True, exist_ok=True)
            filled = data_dir / "filled.json"
            extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.setting)}
            if budget:
                extra["search_postings_budget"] = budget
            service = await stack.enter_async_context(open_service(
                service_settings(**extra), data_dir=data_dir, run_worker=True))
            out["settings"] = extra
            if filled.exists():
                out["ingest"] = json.loads(filled.read_text())
                await indexes_operational(service)
                backend = (await service.agents.backend_for(AGENT))[1]
                started = time.perf_counter()
                await backend.startup_build()  # postings of an older layout are built again first
                out["postings_build_s"] = time.perf_counter() - started
                console.print(f"  store kept in {data_dir}, filled earlier (postings ready after "
                              f"{out['postings_build_s']:.1f} s)")
            else:
                console.print(f"  filling {n:,} messages through the batch route ...")
                out["ingest"] = await fill(service, corpus.messages, 4, 500, console, errors)
                out["ingest"]["embedding_lag_s"] = await embedded_all(service, timeout=max(900.0, n / 50))
                console.print(f"  ingest {out['ingest']['messages_per_s']:,.0f} msgs/s, embedding lag "
                              f"{out['ingest']['embedding_lag_s']:.1f} s")
                if args.store is not None and not errors:
                    filled.write_text(json.dumps(out["ingest"]))
            backend = (await service.agents.backend_for(AGENT))[1]
            postings = backend.postings
            redis = backend.client.connection
            out["memory"] = {"used_memory": int((await redis.info("memory"))["used_memory"])}
            if args.query_embedder:
                from memory_service.config import Settings
                from memory_service.embedding.embedders import build_embedder

                local = build_embedder(Settings(_env_file=None, embedder=args.query_embedder))
                if callable(begin := getattr(local, "start", None)):
                    await begin()
                service.retriever.embedder = QueryCost(service.retriever.embedder, local)
                out["notes"]["query_embedder"] = (f"each query also embedded by {args.query_embedder} inside the timed "
                                                  "search; the stored vectors and the searched one are the hash "
                                                  "embedder's")
        out["memory"]["per_memory_bytes"] = out["memory"]["used_memory"] / (n * copies)
        from memory_service.config import Settings

        postings_budget = budget or Settings.model_fields["search_postings_budget"].default
        from memory_service.formation.steps import message_memory_id

        ids = _Ids({m.message_id: m.index for m in corpus.messages})
        ids.update({message_memory_id(m.session_id, m.message_id): m.index for m in corpus.messages})

        # Warm-up: the first calls' costs (the model's first run, index loads).
        for q in corpus.queries[:3]:
            if service is not None:
                await service.search(AGENT, q.text, scope="agent", top_k=TOP_K)
            await postings.top(AGENT, query_terms(q.text), CANDIDATES, postings_budget)
            if exact is not None:
                exact.rank(q.text, TOP_K)
            if bm25s is not None:
                bm25s.rank(q.text, TOP_K)

        times: dict[str, list[float]] = {"service": [], "postings_top50": [], "postings_top10": [],
                                         "before_top50": [], "before_top10": [], "exact_bm25": [], "bm25s": []}
        hits = {k: 0 for k in ("service", "postings_top10", "before_top10", "exact_bm25", "bm25s",
                               "postings_top50_has_exact_top10")}
        before_scored: list[int] = []
        before_incomplete = 0
        scored, incomplete = [], 0
        by_kind: dict[str, dict[str, int]] = {}
        queries = corpus.queries[:args.queries] if args.queries else corpus.queries
        for i, q in enumerate(queries):
            terms = query_terms(q.text)
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    if service is not None:
                        res, t = await timed(service.search(AGENT, q.text, scope="agent", top_k=TOP_K))
                        times["service"].append(t)
                        found = {ids.get(x) for r in res.results[:TOP_K] for x in r.source_message_ids}
                        got = bool(found & q.targets)
                        hits["service"] += got
                        by_kind.setdefault(q.kind or corpus.name, {}).setdefault("service", 0)
                        by_kind[q.kind or corpus.name]["service"] += got
                    if older is not None:
                        old, t = await timed(older.top(BEFORE, terms, CANDIDATES, BEFORE_BUDGET))
                        times["before_top50"].append(t)
                        before_scored.append(old.scored)
                        before_incomplete += not old.complete
                        old, t = await timed(older.top(BEFORE, terms, TOP_K, BEFORE_BUDGET))
                        times["before_top10"].append(t)
                        hits["before_top10"] += bool({ids[x] for x, _ in old.hits} & q.targets)
                    ranked, t = await timed(postings.top(AGENT, terms, CANDIDATES, postings_budget))
                    times["postings_top50"].append(t)
                    scored.append(ranked.scored)
                    incomplete += not ranked.complete
                    top50 = {ids[x] for x, _ in ranked.hits}
                    ranked, t = await timed(postings.top(AGENT, terms, TOP_K, postings_budget))
                    times["postings_top10"].append(t)
                    hits["postings_top10"] += bool({ids[x] for x, _ in ranked.hits} & q.targets)
                elif exact is not None:
                    best, t = clocked(lambda q=q: exact.rank(q.text, TOP_K))
                    times["exact_bm25"].append(t)
                    got = bool(set(best) & q.targets)
                    hits["exact_bm25"] += got
                    by_kind.setdefault(q.kind or corpus.name, {}).setdefault("exact_bm25", 0)
                    by_kind[q.kind or corpus.name]["exact_bm25"] += got
                    if bm25s is not None:
                        found, t = clocked(lambda q=q: bm25s.rank(q.text, TOP_K))
                        times["bm25s"].append(t)
                        hits["bm25s"] += bool(set(found) & q.targets)
            if exact is not None:
                hits["postings_top50_has_exact_top10"] += set(best) <= top50
        count = len(queries)
        out["latency"] = {k: {"median_ms": float(np.median(v)) * 1000, "p95_ms": p95(v) * 1000} if v else None
                          for k, v in times.items()}
        out["hit@10"] = {k: v / count for k, v in hits.items()}
        out["hit@10_by_kind"] = {kind: {k: v / sum(1 for q in queries if (q.kind or corpus.name) == kind)
                                        for k, v in d.items()} for kind, d in by_kind.items()}
        out["postings"] = {"scored_median": float(np.median(scored)), "scored_max": max(scored),
                           "incomplete": incomplete, "budget": postings_budget}
        out["postings"]["copies"] = copies
        if before_scored:
            out["before_postings"] = {"scored_median": float(np.median(before_scored)), "scored_max": max(before_scored),
                                      "incomplete": before_incomplete, "budget": BEFORE_BUDGET,
                                      "code": str(args.compare_before)}
        if service is not None and times["service"]:
            out["ratio_service_to_exact_bm25"] = out["latency"]["service"]["median_ms"] / \
                out["latency"]["exact_bm25"]["median_ms"]
        out["load_avg_at_end"] = list(os.getloadavg())
    return out


def table(result: dict) -> Table:
    t = Table(title=f"{result['corpus']}: {result['n']:,} memories, {result['queries']} queries "
                    f"(ms; hit@10 = a target in the top 10)")
    for col in ("case", "median ms", "p95 ms", "hit@10"):
        t.add_column(col, justify="left" if col == "case" else "right")
    hits = result["hit@10"]
    for case, lat in result["latency"].items():
        if lat is None:
            continue
        hit = hits.get(case, hits.get(case.replace("_top50", "_top10")) if case == "postings_top10" else None)
        t.add_row(case, f"{lat['median_ms']:.1f}", f"{lat['p95_ms']:.1f}", "" if hit is None else f"{hit:.3f}")
    p = result["postings"]
    t.caption = (f"postings: memories scored median {p['scored_median']:,.0f}, max {p['scored_max']:,}, stopped by "
                 f"the budget ({p['budget']:,}) in {p['incomplete']}; exact top 10 inside the postings' top 50: "
                 f"{hits['postings_top50_has_exact_top10']:.3f}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", choices=("lme", "vocab"))
    parser.add_argument("--data", type=Path, default=HERE.parent.parent / "shared/bench/longmemeval_s_dev.json.gz",
                        help="lme: the LongMemEval-S dev file")
    parser.add_argument("--questions", type=int, help="lme: only the first N haystacks")
    parser.add_argument("--n", type=int, default=100_000, help="vocab: turns")
    parser.add_argument("--queries", type=int, default=None, help="queries measured (lme: all with evidence; "
                                                                  "vocab: 200)")
    parser.add_argument("--query-embedder", default="local", help="also embed each query with this embedder inside "
                                                                  "the timed search ('' for none)")
    parser.add_argument("--budget", type=int, default=None, help="SEARCH_POSTINGS_BUDGET (default: the setting's)")
    parser.add_argument("--postings-only", action="store_true", help="the postings alone, no service")
    parser.add_argument("--replicate", type=int, default=1,
                        help="--postings-only: index every text this many times (lists that many times as long)")
    parser.add_argument("--compare-before", type=Path, metavar="CHECKOUT",
                        help="--postings-only: also index into CHECKOUT's postings module (another agent's keys) "
                             "and time it beside, same queries, same baselines")
    parser.add_argument("--no-bm25s", action="store_true", help="no bm25s baseline (its index takes minutes "
                                                                   "on the real text): the exact BM25 only")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=JSON",
                        help="a Settings field for the service, e.g. search_recency_weight=0 (repeatable)")
    parser.add_argument("--store", type=Path, help="keep the filled store in DIR and reuse it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    console = Console(width=150)
    header = print_machine(console, "search_scale")
    console.print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if args.corpus == "lme":
        corpus = lme_corpus(args.data, args.questions)
    else:
        corpus = vocab_corpus(args.n, args.queries or 200)
    console.print(f"corpus: {corpus.notes}")
    errors: list[str] = []

    result = asyncio.run(measure(corpus, args, console, errors))
    console.print(table(result))
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "search_scale", "machine": header, "command": sys.argv,
                                         "result": result, "errors": errors[:100]}, indent=1, default=str) + "\n")
    for error in errors[:20]:
        console.print(f"[red]FAIL[/red] {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
