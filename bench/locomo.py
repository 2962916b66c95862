"""Benchmark: LoCoMo retrieval quality through the service's public HTTP API.

Loads a LoCoMo-format file (the path is an argument; no data ships with the project)
into the service on a real loopback server (``create_app`` served by ``LoopbackServer``,
embedded FalkorDB in a temporary directory): one agent per sample, one service session
per ``session_N``, each turn a message whose id is its ``dia_id``, sent as a user named
after its speaker at its session's date (+1 s per turn); each session formed with
``POST /form`` at its end. Then, per question of categories 1-4 with usable evidence:

- ``GET /v1/search`` (scope agent, top 20): turn recall@5/10/20, recall_all@10, recall@10
  per category, and which kinds fill the top 10;
- ``GET /v1/context`` with the question as ``query`` at each budget: evidence-in-context
  (an element of the block holding >= 70 % of an evidence turn's content words; and, when
  the block's items carry ``sources="..."``, by id too).

Baselines in the same process, outside the service, on the same turns: BM25 (bm25s,
English stopwords, no stemming), dense (the service's own embedder, when
``memory_service.embedding.embedders.build_embedder`` exists) and their RRF (k = 60); BM25's best
turns, and the conversation's last turns, packed whole into each budget. Latency is the
HTTP client's (search, context) or the call's (baselines): median and p95.

Quality targets are reported met / not met; they do not change the exit status. The run
exits 1 when the service answers wrongly (a route missing, a refused request, a block
over its budget or unparseable, a result from another agent, a session not fully formed).

    .venv/bin/python bench/locomo.py PATH [--limit-samples N] [--json OUT] [--budgets 2000,4000,16000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import baselines  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402
from baselines import (  # noqa: E402
    REPEATED_EXAMPLES,
    BM25Index,
    DenseIndex,
    Question,
    Sample,
    block_composition,
    close_embedder,
    evidence_in_xml,
    load_embedder,
    load_locomo,
    pack_turns,
    ranked_sources,
    recall_at,
    rrf,
    speaker_of_question,
    turn_times,
)
from block_replay import Capture  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from evidence import (  # noqa: E402
    context_metrics,
    grouped,
    in_half,
    loss_columns,
    record,
    retrieval_metrics,
    spent_columns,
    split_halves,
    summary_table,
)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.recall.search import query_terms  # noqa: E402

TOP_K = 20
KS = (5, 10, 20)
TARGET_RECALL_10 = 0.75
TARGET_CONTEXT_4000 = 0.80
TARGET_BUDGET = 4000
RRF_K = 60


class BenchError(Exception):
    """The service cannot do what the bench needs: the message says what and why."""


# --- per-question records and summaries -------------------------------------------------

def retrieval_record(q: Question, top_sources: Sequence[Sequence[str]]) -> dict:
    rec = {"sample_id": q.sample_id, "qa_index": q.index, "category": q.category, "evidence": list(q.evidence)}
    for k in KS:
        found = ranked_sources(top_sources, k)
        rec[f"r@{k}"] = recall_at(found, q.evidence)
    rec["all@10"] = rec["r@10"] == 1.0
    rec["found@20"] = sorted(ranked_sources(top_sources, 20) & set(q.evidence))
    return rec


def retrieval_summary(records: list[dict], seconds: list[float]) -> dict:
    if not records:
        return {"questions": 0}
    out: dict[str, Any] = {"questions": len(records)}
    for k in KS:
        out[f"r@{k}"] = statistics.fmean(r[f"r@{k}"] for r in records)
    out["all@10"] = statistics.fmean(float(r["all@10"]) for r in records)
    for c in (1, 2, 3, 4):
        vals = [r["r@10"] for r in records if r["category"] == c]
        out[f"c{c}_r@10"] = statistics.fmean(vals) if vals else None
        out[f"c{c}_questions"] = len(vals)
    out["latency"] = summarize_ms(seconds)
    return out


def context_summary(records: list[dict], budgets: Sequence[int], key: str) -> dict:
    """Mean per-question share of evidence turns present, per budget, overall and for c1/c2."""
    out: dict[str, Any] = {}
    for b in budgets:
        vals = [r[key][str(b)] for r in records if r.get(key, {}).get(str(b)) is not None]
        row = {"share": statistics.fmean(vals) if vals else None, "questions": len(vals),
               "all_present": statistics.fmean(float(v == 1.0) for v in vals) if vals else None}
        for c in (1, 2, 3, 4):
            cv = [r[key][str(b)] for r in records if r["category"] == c and r.get(key, {}).get(str(b)) is not None]
            row[f"c{c}"] = statistics.fmean(cv) if cv else None
        out[str(b)] = row
    return out


# --- baselines --------------------------------------------------------------------------

async def run_baselines(samples: list[Sample], budgets: Sequence[int], console: Console) -> dict:
    embedder, note = await load_embedder()
    try:
        return await _run_baselines(samples, budgets, embedder, note)
    finally:
        await close_embedder(embedder)


async def _run_baselines(samples: list[Sample], budgets: Sequence[int], embedder, note: str) -> dict:
    methods = ["bm25"] + (["dense", "rrf"] if embedder else [])
    records: dict[str, list[dict]] = {m: [] for m in methods}
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    packed: list[dict] = []
    index_seconds = {"bm25": 0.0, "dense": 0.0}
    for sample in samples:
        turns = sample.turns
        ids = [t.dia_id for t in turns]
        by_id = {t.dia_id: t for t in turns}
        start = time.perf_counter()
        bm25 = BM25Index([t.doc for t in turns])
        index_seconds["bm25"] += time.perf_counter() - start
        dense = None
        if embedder:
            start = time.perf_counter()
            dense = DenseIndex(await embedder.embed([t.doc for t in turns]))
            index_seconds["dense"] += time.perf_counter() - start
        recency = [t for t in reversed(turns)]
        for q in sample.questions:
            start = time.perf_counter()
            bm_top = bm25.rank(q.question, TOP_K)
            t_bm = time.perf_counter() - start
            bm_all = bm25.rank(q.question)  # untimed: for packing and fusion
            records["bm25"].append(retrieval_record(q, [[ids[i]] for i in bm_top]))
            seconds["bm25"].append(t_bm)
            if dense is not None:
                start = time.perf_counter()
                qv = (await embedder.embed([q.question], query=True))[0]
                dense_top = dense.rank(qv, TOP_K)
                t_dense = time.perf_counter() - start
                records["dense"].append(retrieval_record(q, [[ids[i]] for i in dense_top]))
                seconds["dense"].append(t_dense)
                start = time.perf_counter()
                fused = rrf([bm_all, dense.rank(qv)], k=RRF_K, limit=TOP_K)
                t_fuse = time.perf_counter() - start
                records["rrf"].append(retrieval_record(q, [[ids[i]] for i in fused]))
                seconds["rrf"].append(t_bm + t_dense + t_fuse)
            ev_turns = [by_id[e] for e in q.evidence]
            bm_found = [ids[i] for i in bm_top]
            rec = {"sample_id": q.sample_id, "qa_index": q.index, "category": q.category,
                   "bm25_packed": {}, "bm25_packed_by_id": {}, "recency": {},
                   "protocol": retrieval_metrics([[i] for i in bm_found], q.evidence, KS)}
            for b in budgets:
                xml, packed_ids = pack_turns((turns[i] for i in bm_all), b)
                present = evidence_in_xml(xml, ev_turns)
                rec["protocol"].update(context_metrics(xml, ev_turns, bm_found, b))
                rec["bm25_packed"][str(b)] = len(present.by_text) / len(ev_turns)
                rec["bm25_packed_by_id"][str(b)] = recall_at(packed_ids, q.evidence)
                xml, _ = pack_turns(recency, b)
                rec["recency"][str(b)] = len(evidence_in_xml(xml, ev_turns).by_text) / len(ev_turns)
            packed.append(rec)
    summary = {m: retrieval_summary(records[m], seconds[m]) for m in methods}
    summary["bm25"]["index_seconds"] = index_seconds["bm25"]
    if embedder:
        summary["dense"]["index_seconds"] = index_seconds["dense"]
        summary["dense"]["embedder"] = embedder.name
    return {
        "methods": methods,
        "dense_note": None if embedder else note,
        "retrieval": summary,
        "context": {key: context_summary(packed, budgets, key) for key in ("bm25_packed", "bm25_packed_by_id", "recency")},
        "per_question": {"retrieval": records, "context": packed},
    }


# --- the service over HTTP --------------------------------------------------------------

def session_id(sample: Sample, number: int) -> str:
    return f"{sample.sample_id}-s{number}"


def owned_namespace(namespace: str, agent_id: str) -> bool:
    """Whether a result's namespace belongs to the agent (sessions are named <agent>-sN)."""
    kind, _, rest = namespace.partition(":")
    if kind == "session":
        return rest.startswith(f"{agent_id}-s")
    if kind == "agent":
        return rest == agent_id
    if kind in ("user", "shard"):
        return rest.split(":", 1)[0] == agent_id
    return False


def detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("detail", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        return response.text[:500]


@dataclass
class ApiShape:
    """What the running service's OpenAPI document offers."""

    has_search: bool = False
    search_params: set[str] = field(default_factory=set)
    context_params: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, spec: dict) -> ApiShape:
        def params(path: str) -> set[str] | None:
            op = spec.get("paths", {}).get(path, {}).get("get")
            return None if op is None else {p["name"] for p in op.get("parameters", [])}

        search = params("/v1/search")
        return cls(search is not None, search or set(), params("/v1/context") or set())

    def problems(self) -> list[str]:
        out = []
        if not self.has_search:
            out.append("the service has no GET /v1/search route yet")
        else:
            missing = {"agent_id", "query", "scope", "top_k"} - self.search_params
            if missing:
                out.append(f"GET /v1/search lacks the parameters {sorted(missing)}")
        missing = {"query", "budget"} - self.context_params
        if missing:
            out.append(f"GET /v1/context lacks the parameters {sorted(missing)} (it would silently ignore them)")
        return out


async def ingest(http: httpx.AsyncClient, samples: list[Sample], concurrency: int, console: Console) -> dict:
    """Every turn recorded, every session formed; samples concurrently, sessions in order."""
    record_s: list[float] = []
    form_s: list[float] = []
    forms: list[dict] = []
    gate = asyncio.Semaphore(concurrency)

    async def one_sample(sample: Sample) -> None:
        async with gate:
            for session in sample.sessions:
                sid = session_id(sample, session.number)
                for turn, at in zip(session.turns, turn_times(session), strict=True):
                    body = {"agent_id": sample.sample_id, "user_id": turn.speaker, "role": "user",
                            "content": turn.content, "message_id": turn.dia_id, "created_at": at.isoformat()}
                    # A 503 (the store busy on a loaded machine) is sent again, as docs/ingest.md says.
                    for attempt in range(1, 6):
                        start = time.perf_counter()
                        r = await http.post(f"/v1/sessions/{sid}/messages", json=body)
                        record_s.append(time.perf_counter() - start)
                        if r.status_code != 503:
                            break
                        await asyncio.sleep(2 * attempt)
                    if r.status_code == 422 and ":" in turn.dia_id and "message_id" in detail(r):
                        raise BenchError(
                            f"the service refuses LoCoMo's message ids: POST /v1/sessions/{sid}/messages with "
                            f"message_id {turn.dia_id!r} answered 422: {detail(r)}. The bench needs ':' to be "
                            "accepted in message ids (the change is under way).")
                    if r.status_code != 200:
                        raise BenchError(f"POST /v1/sessions/{sid}/messages ({turn.dia_id}) answered "
                                         f"{r.status_code}: {detail(r)}")
                    if r.json().get("duplicate") and attempt == 1:
                        raise BenchError(f"{sid}/{turn.dia_id} was recorded as a duplicate on a fresh store")
                for attempt in range(1, 6):
                    start = time.perf_counter()
                    r = await http.post(f"/v1/sessions/{sid}/form", params={"wait": "true"})
                    form_s.append(time.perf_counter() - start)
                    if r.status_code != 503:
                        break
                    console.print(f"  POST /v1/sessions/{sid}/form answered 503 ({detail(r)}); "
                                  f"{'retrying' if attempt < 5 else 'giving up'}")
                    await asyncio.sleep(2 * attempt)
                if r.status_code != 200:
                    raise BenchError(f"POST /v1/sessions/{sid}/form answered {r.status_code}: {detail(r)}")
                forms.append({"session_id": sid, **{k: r.json().get(k) for k in ("formed", "memories", "written")}})

    start = time.perf_counter()
    tasks = [asyncio.create_task(one_sample(s)) for s in samples]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    wall = time.perf_counter() - start
    messages = sum(len(s.turns) for s in samples)
    memories = Counter()
    for f in forms:
        memories.update(f.get("memories") or {})
    return {"messages": messages, "sessions": sum(len(s.sessions) for s in samples), "seconds": wall,
            "form_calls": len(form_s), "messages_per_s": messages / wall,
            "record": summarize_ms(record_s), "form": summarize_ms(form_s), "memories_formed_by_post_form": dict(memories),
            "concurrency": concurrency}


async def check_formed(http: httpx.AsyncClient, samples: list[Sample]) -> list[str]:
    errors = []
    for sample in samples:
        for session in sample.sessions:
            sid = session_id(sample, session.number)
            r = await http.get(f"/v1/sessions/{sid}")
            if r.status_code != 200:
                errors.append(f"GET /v1/sessions/{sid} answered {r.status_code}: {detail(r)}")
                continue
            status = r.json()
            if status.get("formed_messages") != len(session.turns) or status.get("pending_job") is not None:
                errors.append(f"{sid}: {status.get('formed_messages')} of {len(session.turns)} messages formed, "
                              f"pending job {status.get('pending_job')}")
    return errors


# The texts of search's top results per (sample, question), for the block's top20_shown (not
# kept in the JSON: the texts are the benchmark's).
RANKED: dict[tuple[str, int], list[str]] = {}
CAPTURE = Capture()  # the renderer's inputs of every block (``--capture``)
HALF_OF: dict[str, str] = {}  # "<sample>#<qa index>" -> its half, for the capture


async def run_search(http: httpx.AsyncClient, samples: list[Sample], errors: list[str],
                     warnings: Counter) -> dict:
    records, seconds = [], []
    kinds_top10: Counter = Counter()
    activated_top10 = results_top10 = 0
    for sample in samples:
        known = {t.dia_id for t in sample.turns}
        for q in sample.questions:
            params = {"agent_id": sample.sample_id, "query": q.question, "scope": "agent", "top_k": TOP_K}
            start = time.perf_counter()
            r = await http.get("/v1/search", params=params)
            seconds.append(time.perf_counter() - start)
            if r.status_code != 200:
                raise BenchError(f"GET /v1/search ({sample.sample_id}, question {q.index}) answered "
                                 f"{r.status_code}: {detail(r)}")
            results = r.json().get("results")
            if not isinstance(results, list):
                raise BenchError(f"GET /v1/search answered without a 'results' list: {r.text[:300]}")
            if len(results) > TOP_K:
                errors.append(f"search {sample.sample_id}/{q.index}: {len(results)} results for top_k={TOP_K}")
            scores = [x.get("score") for x in results]
            if all(isinstance(s, int | float) for s in scores) and any(a < b for a, b in zip(scores, scores[1:])):
                warnings["search results not in descending score order"] += 1
            for x in results:
                ns = x.get("namespace", "")
                if not owned_namespace(ns, sample.sample_id):
                    errors.append(f"search {sample.sample_id}/{q.index}: result {x.get('id')} from namespace {ns!r}")
                unknown = set(x.get("source_message_ids") or []) - known
                if unknown:
                    errors.append(f"search {sample.sample_id}/{q.index}: result {x.get('id')} cites unknown "
                                  f"message ids {sorted(unknown)[:5]}")
            for x in results[:10]:
                kinds_top10[x.get("kind", "?")] += 1
                activated_top10 += bool(x.get("activated"))
                results_top10 += 1
            sources = [x.get("source_message_ids") or [] for x in results]
            rec = retrieval_record(q, sources)
            rec["kinds@10"] = [x.get("kind") for x in results[:10]]
            RANKED[(q.sample_id, q.index)] = [x.get("content", "") for x in results]
            rec["protocol"] = retrieval_metrics(sources, q.evidence, KS)
            rec["protocol"].update(retrieval_metrics([s for s, x in zip(sources, results, strict=True)
                                                      if x.get("kind") == "message"], q.evidence, (10,), "msg "))
            records.append(rec)
    summary = retrieval_summary(records, seconds)
    summary["kinds_top10"] = dict(kinds_top10.most_common())
    summary["results_top10"] = results_top10
    summary["activated_top10"] = activated_top10
    return {"summary": summary, "per_question": records}


async def run_context(http: httpx.AsyncClient, samples: list[Sample], budgets: Sequence[int],
                      errors: list[str], recall: dict[str, str] | None = None,
                      found: dict[tuple[str, int], Sequence[str]] | None = None) -> dict:
    """The block per question and budget. With ``found`` (search's top-20 evidence per
    (sample, question)), each record also gets the shared protocol's context metrics and
    where the evidence is lost (bench/evidence.py)."""
    records = []
    seconds: dict[str, list[float]] = {str(b): [] for b in budgets}
    chars: dict[str, list[int]] = {str(b): [] for b in budgets}
    sources_seen = False
    source_kinds: Counter = Counter()
    composition: dict[str, dict[str, dict[str, int]]] = {str(b): {} for b in budgets}
    for sample in samples:
        by_id = {t.dia_id: t for t in sample.turns}
        last = session_id(sample, sample.sessions[-1].number)
        for q in sample.questions:
            user = speaker_of_question(q.question, sample.speaker_a, sample.speaker_b)
            ev_turns = [by_id[e] for e in q.evidence]
            rec = {"sample_id": q.sample_id, "qa_index": q.index, "category": q.category, "user_id": user,
                   "service": {}, "service_by_id": {}, "chars": {}, "protocol": {}}
            for b in budgets:
                params = {"agent_id": sample.sample_id, "user_id": user, "session_id": last, "query": q.question,
                          "budget": b, **(recall or {})}
                start = time.perf_counter()
                r = await http.get("/v1/context", params=params)
                seconds[str(b)].append(time.perf_counter() - start)
                if r.status_code != 200:
                    raise BenchError(f"GET /v1/context ({sample.sample_id}, question {q.index}, budget {b}) "
                                     f"answered {r.status_code}: {detail(r)}")
                body = r.json()
                xml = body.get("xml", "")
                where = f"context {sample.sample_id}/{q.index} @ {b}"
                if body.get("budget") != b:
                    raise BenchError(f"GET /v1/context answered budget {body.get('budget')} when asked for {b}: "
                                     "the route ignores the budget parameter")
                if len(xml) != body.get("chars") or len(xml) > b:
                    errors.append(f"{where}: {len(xml)} chars (reported {body.get('chars')}) for a budget of {b}")
                source_kinds[str(body.get("source"))] += 1
                present = evidence_in_xml(xml, ev_turns)
                if present.parse_error:
                    errors.append(f"{where}: the block does not parse: {present.parse_error}")
                rec["service"][str(b)] = len(present.by_text) / len(ev_turns)
                if found is not None:
                    rec["protocol"].update(context_metrics(xml, ev_turns, found.get((q.sample_id, q.index), ()), b,
                                                           ranked=RANKED.get((q.sample_id, q.index))))
                    if recall is None:
                        CAPTURE.case(f"{q.sample_id}#{q.index}", HALF_OF.get(f"{q.sample_id}#{q.index}", "?"),
                                     CATEGORIES.get(q.category, q.category), b, tuple(query_terms(q.question)),
                                     ev_turns, list(found.get((q.sample_id, q.index), ())),
                                     RANKED.get((q.sample_id, q.index), []), None)
                for section, row in block_composition(xml, ev_turns).items():
                    total = composition[str(b)].setdefault(section, dict.fromkeys(row, 0) | {"blocks": 0})
                    total["blocks"] += 1
                    for name, n in row.items():
                        total[name] += n
                rec["chars"][str(b)] = len(xml)
                chars[str(b)].append(len(xml))
                if present.by_id is not None:
                    sources_seen = True
                    rec["service_by_id"][str(b)] = len(present.by_id) / len(ev_turns)
                else:
                    rec["service_by_id"][str(b)] = 0.0
            records.append(rec)
    summary = {"text_rule": context_summary(records, budgets, "service"),
               "by_id": context_summary(records, budgets, "service_by_id") if sources_seen else None,
               "sources_attribute_seen": sources_seen,
               "latency": {b: summarize_ms(s) for b, s in seconds.items()},
               "latency_all": summarize_ms([x for s in seconds.values() for x in s]),
               "chars_median": {b: statistics.median(c) if c else None for b, c in chars.items()},
               "source": dict(source_kinds),
               "composition": composition, "blocks": len(records), "repeated_examples": list(REPEATED_EXAMPLES)}
    return {"summary": summary, "per_question": records}


async def run_service(samples: list[Sample], budgets: Sequence[int], concurrency: int, console: Console,
                      out: dict, recall_grid: Sequence[str] = (), store: Path | None = None) -> None:
    """Fills ``out`` as it goes, so that a failure keeps what was measured before it."""
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    # The embedded store, whatever the environment says; other settings as configured.
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None)
    out["settings"] = {"extractor": settings.extractor, "embedder": getattr(settings, "embedder", None), "gate_messages": settings.memory_formation_msg_interval,
                       "gate_tokens": settings.memory_formation_token_interval,
                       "min_messages": settings.never_form_memories_less_than_n_messages,
                       # A block's reads stop at this deadline (CONTEXT_DEADLINE_SECONDS): on a loaded
                       # machine raise it, or blocks lose their relevant memories to the clock.
                       "context_deadline_seconds": settings.context_deadline_seconds}
    errors: list[str] = out.setdefault("errors", [])
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="locomo-bench-") if store is None else nullcontext(str(store)) as tmp:
        server = LoopbackServer(create_app(settings, data_dir=Path(tmp), run_worker=True, host="127.0.0.1"))
        try:
            await server.start()
        except Exception as exc:
            raise BenchError(f"the service did not start ({type(exc).__name__}: {exc}); "
                             "its start-up error is in the log above") from None
        try:
            await _run_on(server, settings, tmp, samples, budgets, concurrency, console, out, errors, recall_grid)
        finally:
            await server.stop()


async def _run_on(server, settings, tmp: str, samples: list[Sample], budgets: Sequence[int], concurrency: int,
                  console: Console, out: dict, errors: list[str], recall_grid: Sequence[str] = ()) -> None:
    warnings: Counter = Counter()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
        shape = ApiShape.of((await http.get("/openapi.json")).json())
        out["api_problems"] = shape.problems()
        for problem in out["api_problems"]:
            console.print(f"[yellow]note[/yellow]: {problem}; ingest runs, the queries will fail")
        console.print(f"service: API on {server.base_url}, embedded FalkorDB in {tmp}, "
                      f"extractor {settings.extractor}; ingesting "
                      f"{sum(len(s.turns) for s in samples)} turns ...")
        # --store: a store ingested by an earlier run is queried again (ranking settings
        # compared on the same memories, without the formation's minutes).
        marker = Path(tmp) / "locomo-ingested.json"
        names = [s.sample_id for s in samples]
        if marker.exists() and set(names) <= set(json.loads(marker.read_text())):
            console.print(f"  ingest: skipped, {tmp} holds these samples already")
        else:
            if marker.exists():
                raise BenchError(f"{tmp} holds other samples ({marker.read_text().strip()}): use another --store")
            out["ingest"] = await ingest(http, samples, concurrency, console)
            ing = out["ingest"]
            console.print(f"  ingest: {ing['messages']} messages, {ing['sessions']} sessions formed in "
                          f"{ing['seconds']:.1f} s ({ing['messages_per_s']:.1f} msgs/s); memories formed by POST "
                          f"/form: {ing['memories_formed_by_post_form']} (windows a gate opened not counted)")
            marker.write_text(json.dumps(names))
        errors += await check_formed(http, samples)
        if not shape.has_search:
            raise BenchError("GET /v1/search does not exist in this service yet (not in /openapi.json): "
                             "search recall cannot be measured")
        questions = sum(len(s.questions) for s in samples)
        console.print(f"  search: {questions} queries ...")
        out["search"] = await run_search(http, samples, errors, warnings)
        out["warnings"] = dict(warnings)
        missing = {"query", "budget"} - shape.context_params
        if missing:
            raise BenchError(f"GET /v1/context has no {' or '.join(sorted(missing))} parameter in this "
                             "service yet: evidence-in-context cannot be measured")
        console.print(f"  context: {questions} queries x {len(budgets)} budgets ...")
        found = {(r["sample_id"], r["qa_index"]): r["found@20"] for r in out["search"]["per_question"]}
        out["context"] = await run_context(http, samples, budgets, errors, found=found)
        for spec in recall_grid:
            console.print(f"  context with {spec}: {questions} queries x {len(budgets)} budgets ...")
            run = await run_context(http, samples, budgets, errors, recall_params(spec))
            out.setdefault("recall_grid", {})[spec] = run["summary"]


# --- reporting --------------------------------------------------------------------------

def f3(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def ms(lat: dict | None, key: str) -> str:
    return "-" if not lat or key not in lat else (f"{lat[key]:.2f}" if lat[key] < 100 else f"{lat[key]:.0f}")


def retrieval_table(rows: list[tuple[str, dict]], questions: int) -> Table:
    t = Table(title=f"Turn recall, {questions} questions (categories 1-4 with usable evidence); latency per query")
    for col in ("method", "R@5", "R@10", "R@20", "All@10", "c1 R@10", "c2 R@10", "c3 R@10", "c4 R@10",
                "p50 ms", "p95 ms"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for name, s in rows:
        lat = s.get("latency")
        t.add_row(name, *(f3(s.get(k)) for k in ("r@5", "r@10", "r@20", "all@10", "c1_r@10", "c2_r@10",
                                                 "c3_r@10", "c4_r@10")), ms(lat, "median_ms"), ms(lat, "p95_ms"))
    return t


def context_table(rows: list[tuple[str, dict | None, dict | None]], budgets: Sequence[int]) -> Table:
    t = Table(title="Evidence in context: mean share of a question's evidence turns present in the block")
    t.add_column("method")
    for b in budgets:
        t.add_column(f"{b:,} chars", justify="right")
    c_budget = str(TARGET_BUDGET) if TARGET_BUDGET in budgets else str(budgets[0])
    t.add_column(f"c1 @{int(c_budget):,}", justify="right")
    t.add_column(f"c2 @{int(c_budget):,}", justify="right")
    t.add_column("p50 ms", justify="right")
    t.add_column("p95 ms", justify="right")
    for name, summary, lat in rows:
        if summary is None:
            continue
        t.add_row(name, *(f3(summary[str(b)]["share"]) for b in budgets), f3(summary[c_budget]["c1"]),
                  f3(summary[c_budget]["c2"]), ms(lat, "median_ms"), ms(lat, "p95_ms"))
    return t


def composition_table(summary: dict, budgets: Sequence[int]) -> Table:
    """Per budget and section: the mean characters and items per block, the share of the
    section's items that hold an evidence turn, and repeated items (the same text twice)."""
    t = Table(title="Block composition: per block, mean characters and items of each section; share of its items "
                    "holding evidence; items repeating another")
    for col in ("budget", "section", "chars", "items", "markup / item", "evidence share", "repeated"):
        t.add_column(col, justify="left" if col == "section" else "right")
    blocks = summary.get("blocks") or 1
    for b in budgets:
        for section, row in summary["composition"].get(str(b), {}).items():
            t.add_row(f"{b:,}", section, f"{row['chars'] / blocks:.0f}", f"{row['items'] / blocks:.1f}",
                      f"{row['markup'] / row['items']:.0f}" if row["items"] else "-",
                      f3(row["evidence_items"] / row["items"] if row["items"] else None), str(row["repeated"]))
    return t


def recall_params(spec: str) -> dict[str, str]:
    """'min_similarity=0.3;top_k=20' -> {"min_similarity": "0.3", "top_k": "20"}."""
    pairs = [p.split("=", 1) for p in spec.split(";") if p.strip()]
    if any(len(p) != 2 for p in pairs):
        raise BenchError(f"--recall {spec!r}: not name=value;name=value")
    return {k.strip(): v.strip() for k, v in pairs}


def recall_table(grid: dict[str, dict], budgets: Sequence[int]) -> Table:
    t = Table(title="Evidence in context per recall setting (same ingest; the default first)")
    t.add_column("recall")
    for b in budgets:
        t.add_column(f"{b:,} chars", justify="right")
        t.add_column(f"median chars @{b:,}", justify="right")
    for spec, summary in grid.items():
        t.add_row(spec, *(x for b in budgets for x in (f3(summary["text_rule"][str(b)]["share"]),
                                                       f"{summary['chars_median'][str(b)]:.0f}")))
    return t


def target_lines(service: dict, budgets: Sequence[int]) -> list[tuple[str, str, dict]]:
    out = []
    r10 = service.get("search", {}).get("summary", {}).get("r@10")
    out.append((f"service R@10 >= {TARGET_RECALL_10}", "not measured" if r10 is None else
                f"{r10:.3f}: {'met' if r10 >= TARGET_RECALL_10 else 'not met'}",
                {"target": TARGET_RECALL_10, "value": r10, "met": None if r10 is None else r10 >= TARGET_RECALL_10}))
    ctx = service.get("context", {}).get("summary", {}).get("text_rule", {}).get(str(TARGET_BUDGET), {}).get("share")
    out.append((f"evidence-in-context@{TARGET_BUDGET} >= {TARGET_CONTEXT_4000}",
                "not measured" if ctx is None else f"{ctx:.3f}: {'met' if ctx >= TARGET_CONTEXT_4000 else 'not met'}",
                {"target": TARGET_CONTEXT_4000, "value": ctx, "met": None if ctx is None else ctx >= TARGET_CONTEXT_4000}))
    return out


def report(console: Console, base: dict, service: dict, budgets: Sequence[int], questions: int) -> dict:
    rows = []
    if "search" in service:
        rows.append(("service /v1/search", service["search"]["summary"]))
    names = {"bm25": "BM25 (bm25s, no stemming)", "dense": f"dense {base['retrieval'].get('dense', {}).get('embedder', '')}",
             "rrf": f"RRF of both (k={RRF_K})"}
    rows += [(names[m], base["retrieval"][m]) for m in base["methods"]]
    console.print(retrieval_table(rows, questions))
    if base["dense_note"]:
        console.print(f"  dense: {base['dense_note']}")
    if "search" in service:
        s = service["search"]["summary"]
        total = s["results_top10"] or 1
        mix = ", ".join(f"{k} {n / total:.1%}" for k, n in s["kinds_top10"].items())
        console.print(f"  service top-10 results: {s['results_top10']} ({mix}); activated {s['activated_top10'] / total:.1%}")
    crows: list[tuple[str, dict | None, dict | None]] = []
    if "context" in service:
        c = service["context"]["summary"]
        crows.append(("service /v1/context (70% words)", c["text_rule"], c["latency_all"]))
        crows.append(("service /v1/context (by sources id)", c["by_id"], None))
    crows.append(("BM25 best turns, packed", base["context"]["bm25_packed"], None))
    crows.append(("last turns (recency), packed", base["context"]["recency"], None))
    console.print(context_table(crows, budgets))
    if "context" in service:
        console.print(composition_table(service["context"]["summary"], budgets))
    if service.get("recall_grid"):
        console.print(recall_table({"(default)": service["context"]["summary"], **service["recall_grid"]}, budgets))
    if "context" in service and not service["context"]["summary"]["sources_attribute_seen"]:
        console.print("  by id: the blocks carry no sources=\"...\" attribute; that column is skipped")
    if "ingest" in service:
        i = service["ingest"]
        console.print(f"ingest: {i['messages_per_s']:.1f} msgs/s ({i['messages']} messages, {i['sessions']} sessions "
                      f"incl. POST /form, concurrency {i['concurrency']}); record p50/p95 "
                      f"{ms(i['record'], 'median_ms')}/{ms(i['record'], 'p95_ms')} ms, form p50/p95 "
                      f"{ms(i['form'], 'median_ms')}/{ms(i['form'], 'p95_ms')} ms")
    targets = {}
    for label, text, data in target_lines(service, budgets):
        console.print(f"target {label}: {text}")
        targets[label] = data
    return targets


CATEGORIES = {1: "c1 multi-hop", 2: "c2 temporal", 3: "c3 open-domain", 4: "c4 single-hop"}


def protocol(base: dict, service: dict, halves: dict[str, str]) -> dict[str, dict]:
    """The shared protocol's summaries (bench/evidence.py): per method, the whole, both halves
    and each category; the service's search and context records joined per question."""
    def key(r: dict) -> str:
        return f"{r['sample_id']}#{r['qa_index']}"

    bm25 = [record(key(r), halves[key(r)], r["category"], **r["protocol"]) for r in base["per_question"]["context"]]
    out = {"bm25": grouped(bm25, CATEGORIES.get)}
    if "search" in service:
        ctx = {key(r): r["protocol"] for r in service.get("context", {}).get("per_question", [])}
        recs = [record(key(r), halves[key(r)], r["category"], **r["protocol"], **ctx.get(key(r), {}))
                for r in service["search"]["per_question"]]
        out = {"service": grouped(recs, CATEGORIES.get), **out}
    return out


def protocol_report(console: Console, summaries: dict[str, dict], budgets: Sequence[int]) -> None:
    rows = ["all", "half a", "half b", *CATEGORIES.values()]
    console.print(summary_table("The shared protocol: turn recall over evidence turns, whole, halves, categories",
                                summaries, [("R@5", "R@5"), ("R@10", "R@10"), ("R@20", "R@20"), ("all@10", "all@10"),
                                            ("any@10", "any@10"), ("msg R@10", "msg R@10")], rows))
    console.print(summary_table("Evidence in context (70 % rule): share of evidence turns shown, and questions with all",
                                summaries, [(f"ctx @{b:,}", f"ctx@{b}") for b in budgets]
                                + [(f"all @{b:,}", f"ctx_all@{b}") for b in budgets], rows))
    for b in budgets:
        console.print(summary_table(f"Where the evidence is lost at {b:,} characters (shares of evidence turns)",
                                    summaries, loss_columns(b), rows))
        console.print(summary_table(f"Where the block's characters go at {b:,} (shares of its length), and the share "
                                    "of search's top 20 it shows", summaries, spent_columns(b), rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file (e.g. locomo_dev.json)")
    parser.add_argument("--limit-samples", type=int, metavar="N", help="only the first N samples")
    parser.add_argument("--half", choices=("a", "b", "both"), default="both",
                        help="the questions of one half (bench/evidence.py: per conversation and category, "
                             "SHA-256 order of '<sample_id>#<qa index>', alternating); every conversation is ingested")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write everything as JSON to OUT")
    parser.add_argument("--capture", type=Path, metavar="PATH",
                        help="also keep every block's renderer inputs in PATH, for bench/block_replay.py")
    parser.add_argument("--store", type=Path, metavar="DIR",
                        help="keep the service's store in DIR; a later run with the same DIR and samples skips "
                             "the ingest and queries it again (compare ranking settings on the same memories)")
    parser.add_argument("--budgets", default="2000,4000,16000", help="context budgets, comma-separated (chars)")
    parser.add_argument("--concurrency", type=int, default=5, help="samples ingested at once (default 5)")
    parser.add_argument("--baselines-only", action="store_true", help="skip the service (baselines only)")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense and RRF baselines (BM25 stays)")
    parser.add_argument("--recall", action="append", default=[], metavar="SPEC",
                        help="also measure the block with these /v1/context recall parameters, e.g. "
                             "'min_similarity=0.3;top_k=20' (repeatable: one run each, same ingest)")
    args = parser.parse_args(argv)
    try:
        budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()})
    except ValueError:
        parser.error(f"--budgets: not a comma-separated list of integers: {args.budgets!r}")
    if not budgets or min(budgets) < 64:
        parser.error("--budgets: each budget must be at least 64 characters")
    if args.limit_samples is not None and args.limit_samples < 1:
        parser.error("--limit-samples must be at least 1")
    if not args.path.is_file():
        parser.error(f"{args.path}: no such file")

    console = Console() if sys.stdout.isatty() else Console(width=160)
    header = print_machine(console, "locomo")
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["locomo.py", *argv])
    console.print(f"command: {command}")
    started = time.perf_counter()
    samples = load_locomo(args.path, args.limit_samples)
    halves = split_halves((f"{q.sample_id}#{q.index}", (q.sample_id, q.category)) for s in samples for q in s.questions)
    HALF_OF.update(halves)
    for s in samples:
        s.questions = [q for q in s.questions if in_half(halves[f"{q.sample_id}#{q.index}"], args.half)]
    questions = sum(len(s.questions) for s in samples)
    data = {"path": str(args.path), "samples": [s.sample_id for s in samples],
            "sessions": sum(len(s.sessions) for s in samples), "turns": sum(len(s.turns) for s in samples),
            "questions": questions, "skipped": dict(sum((Counter(s.skipped) for s in samples), Counter()))}
    console.print(f"data: {len(samples)} samples, {data['sessions']} sessions, {data['turns']} turns, {questions} "
                  f"questions of categories 1-4 with usable evidence (skipped: {data['skipped']})")

    console.print("baselines ...")
    baselines.DENSE = not args.no_dense
    base = asyncio.run(run_baselines(samples, budgets, console))
    service: dict = {"errors": []}
    failure = None
    if not args.baselines_only:
        try:
            with CAPTURE.active() if args.capture else nullcontext():
                asyncio.run(run_service(samples, budgets, args.concurrency, console, service, args.recall,
                                            args.store))
            if args.capture:
                CAPTURE.save(args.capture)
        except BenchError as exc:
            failure = str(exc)
        except httpx.HTTPError as exc:
            failure = f"HTTP error talking to the service: {type(exc).__name__}: {exc}"
        except SystemExit as exc:  # uvicorn exits the loop when the app's start-up fails
            failure = f"the service did not start (uvicorn exit status {exc.code}); its start-up error is in the log above"
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    targets = report(console, base, service, budgets, questions)
    summaries = protocol(base, service, halves)
    protocol_report(console, summaries, budgets)
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; took {time.perf_counter() - started:.1f} s")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "locomo", "machine": header, "command": command,
            "settings": {"budgets": budgets, "top_k": TOP_K, "rrf_k": RRF_K, "concurrency": args.concurrency,
                         "service": service.get("settings")},
            "data": data, "baselines": base, "service": service, "targets": targets, "protocol": summaries,
            "halves": {"rule": "bench/evidence.py split_halves, per (sample_id, category)", "half": args.half},
            "failure": failure,
        }, indent=1, default=_jsonable) + "\n")
        console.print(f"results written to {args.json}")

    for warning, n in service.get("warnings", {}).items():
        console.print(f"[yellow]warning[/yellow] {warning}: {n} queries")
    errors = service.get("errors", [])
    for error in errors[:50]:
        console.print(f"[red]FAIL[/red] {error}")
    if len(errors) > 50:
        console.print(f"[red]FAIL[/red] ... and {len(errors) - 50} more")
    if failure:
        console.print(f"[red]FAIL[/red] {failure}")
    return 1 if failure or errors else 0


def _jsonable(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, set | frozenset):
        return sorted(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
