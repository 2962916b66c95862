"""Benchmark: LongMemEval-S retrieval and the memory block, through the service's public HTTP API.

The same protocol as bench/locomo.py (bench/evidence.py holds what both share). Loads a
LongMemEval-S-format file (a JSON list, gzip'd or not; the path is an argument, no data
ships with the project) into the service on a real loopback server (``create_app`` served
by ``LoopbackServer``, embedded FalkorDB in a temporary directory):

- one agent per question (``agent_id`` = its ``question_id``), one user (``user``); one
  service session per haystack session, in date order (``<agent>-s<N>``, N from 1; a
  session id the haystack repeats is recorded again, as its own session); each turn a
  message with its role, ``message_id`` ``s<N>:<turn index>``, ``created_at`` its session's
  date + 1 s per turn; each session sent in one ``POST /v1/agents/{agent}/messages/batch``,
  then formed with ``POST /v1/sessions/{id}/form?wait=true``;
- empty turns (blank content: the service refuses them) are not sent, nor indexed by the
  baselines; none holds evidence in the dev file. A turn longer than the service's
  MAX_MESSAGE_CHARS is sent in parts of at most that many characters, cut at white space,
  as messages ``<id>~2``, ``<id>~3``... after the first (a source ``<id>~k`` counts as the
  turn); the baselines index it whole;
- the bench waits until the worker has embedded every message of the agent, then asks as
  of the question's ``question_date`` from a new session of the same user
  (``<agent>-q``, never recorded): ``GET /v1/search`` (scope agent, top 20) and
  ``GET /v1/context`` with the question as ``query``, ``as_of`` its date, at each budget.

Questions whose id ends in ``_abs`` (abstention: no answer in the history) are skipped
whole. Metrics per question: turn recall@5/10/20 over the evidence turns (``has_answer``),
recall_all@k and recall_any@k (LongMemEval's turn-level metrics; also over message results
only), evidence-in-context at each budget (one element holding >= 70 % of the turn's
content words), answer-in-context (extractive answers only) and where the evidence is lost
(bench/evidence.py). Baselines in the same process: BM25 (bm25s: k1 1.5, b 0.75, Lucene's
33 stopwords, no stemming) over the haystack's non-empty turns as ``role: content``, its
best turns packed whole into each budget (stopping at the first that does not fit, and
skipping what does not fit). Every summary is given for the whole, both halves and each
question type.

    .venv/bin/python bench/longmemeval.py PATH [--half a|b|both] [--limit-questions N] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from baselines import BM25Index, Session, Turn, pack_turns  # noqa: E402
from block_replay import Capture  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from evidence import (  # noqa: E402
    SEARCH_DEPTH,
    answer_words,
    context_metrics,
    grouped,
    in_half,
    is_extractive,
    loss_columns,
    record,
    retrieval_metrics,
    spent_columns,
    split_halves,
    summary_table,
)
from locomo import BenchError, _jsonable, detail, owned_namespace  # noqa: E402
from rich.console import Console  # noqa: E402

from memory_service.recall.search import query_terms  # noqa: E402

KS = (5, 10, 20)
USER = "user"
TARGET_BUDGET = 4000
PART = "~"  # message id of a long turn's later parts: <turn id>~2, ...


@dataclass
class LmeQuestion:
    question_id: str
    question_type: str
    question: str
    date: datetime
    answer: str
    sessions: list[Session]  # in date order, empty turns left out
    half: str
    long_turns: int  # turns over the message limit (sent in parts)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]

    @property
    def evidence(self) -> list[Turn]:
        return [t for t in self.turns if t.dia_id in self.evidence_ids]

    evidence_ids: frozenset[str] = frozenset()


def parse_date(value: str) -> datetime:
    """``"2023/05/20 (Sat) 00:31"`` -> an aware datetime (UTC: the data gives no zone)."""
    return datetime.strptime(value, "%Y/%m/%d (%a) %H:%M").replace(tzinfo=UTC)


def load(path: Path, max_chars: int) -> tuple[list[LmeQuestion], dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    if not isinstance(raw, list) or not raw or "haystack_sessions" not in raw[0]:
        raise ValueError(f"{path}: not LongMemEval-format data (a list of questions with 'haystack_sessions')")
    kept = [q for q in raw if not q["question_id"].endswith("_abs")]
    halves = split_halves((q["question_id"], q["question_type"]) for q in kept)
    stats = Counter(abstention=len(raw) - len(kept))
    out = []
    for q in kept:
        order = sorted(range(len(q["haystack_sessions"])), key=lambda i: parse_date(q["haystack_dates"][i]))
        sessions, evidence, long_turns = [], set(), 0
        for number, i in enumerate(order, start=1):
            turns = []
            for index, t in enumerate(q["haystack_sessions"][i]):
                if not t["content"].strip():
                    stats["empty_turns"] += 1
                    continue
                turn = Turn(f"s{number}:{index}", t["role"], t["content"], None, number, index)
                long_turns += len(t["content"]) > max_chars
                turns.append(turn)
                if t.get("has_answer"):
                    evidence.add(turn.dia_id)
            sessions.append(Session(number, parse_date(q["haystack_dates"][i]), tuple(turns)))
        stats["repeated_sessions"] += len(order) - len(set(q["haystack_session_ids"]))
        stats["long_turns"] += long_turns
        if not evidence:
            stats["no_evidence"] += 1
            continue
        out.append(LmeQuestion(q["question_id"], q["question_type"], q["question"], parse_date(q["question_date"]),
                               str(q["answer"]), sessions, halves[q["question_id"]], long_turns, frozenset(evidence)))
    return out, dict(stats)


def parts(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at the last white space."""
    out = []
    while len(text) > limit:
        cut = text.rfind(" ", limit // 2, limit)
        cut = limit if cut <= 0 else cut
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text] if text.strip() else out


def turn_of(source_id: str) -> str:
    return source_id.split(PART, 1)[0]


def answer_if_extractive(q: LmeQuestion) -> frozenset[str] | None:
    words = answer_words(q.answer)
    return words if is_extractive(words, q.evidence) else None


# --- baselines --------------------------------------------------------------------------

def run_baselines(questions: Sequence[LmeQuestion], budgets: Sequence[int]) -> dict[str, list[dict]]:
    """BM25 over each haystack's turns; its best turns packed whole (stop / skip)."""
    out: dict[str, list[dict]] = {"bm25": [], "bm25 skip": []}
    seconds = []
    for q in questions:
        turns = q.turns
        ids = [t.dia_id for t in turns]
        index = BM25Index([t.doc for t in turns])
        start = time.perf_counter()
        top = [ids[i] for i in index.rank(q.question, SEARCH_DEPTH)]
        seconds.append(time.perf_counter() - start)
        ranking = index.rank(q.question)  # untimed: for packing
        ev = [t.dia_id for t in q.evidence]
        answer = answer_if_extractive(q)
        for name, skip in (("bm25", False), ("bm25 skip", True)):
            m = retrieval_metrics([[i] for i in top], ev, KS) if not skip else {}
            for b in budgets:
                xml, _ = pack_turns((turns[i] for i in ranking), b, skip=skip)
                m.update(context_metrics(xml, q.evidence, top, b, answer))
            out[name].append(record(q.question_id, q.half, q.question_type, **m))
    out["_latency"] = [summarize_ms(seconds)]  # type: ignore[list-item]
    return out


# --- the service over HTTP --------------------------------------------------------------

def session_id(q: LmeQuestion, number: int) -> str:
    return f"{q.question_id}-s{number}"


async def ingest_one(http: httpx.AsyncClient, q: LmeQuestion, max_chars: int, timing: dict[str, list[float]]) -> None:
    for session in q.sessions:
        sid = session_id(q, session.number)
        items = []
        for i, turn in enumerate(session.turns):
            at = (session.date + timedelta(seconds=i)).isoformat()
            for n, piece in enumerate(parts(turn.text, max_chars), start=1):
                items.append({"session_id": sid, "user_id": USER, "role": turn.speaker, "content": piece,
                              "message_id": turn.dia_id if n == 1 else f"{turn.dia_id}{PART}{n}", "created_at": at})
        for start_at in range(0, len(items), 500):
            # A 503 (the store busy on a loaded machine) is sent again, as docs/ingest.md says;
            # what the first try recorded comes back as duplicates then.
            for attempt in range(1, 6):
                start = time.perf_counter()
                r = await http.post(f"/v1/agents/{q.question_id}/messages/batch",
                                    json={"messages": items[start_at:start_at + 500]})
                timing["batch"].append(time.perf_counter() - start)
                if r.status_code != 503:
                    break
                await asyncio.sleep(2 * attempt)
            if r.status_code != 200:
                raise BenchError(f"POST /v1/agents/{q.question_id}/messages/batch ({sid}) answered "
                                 f"{r.status_code}: {detail(r)}")
            fine = {"recorded"} if attempt == 1 else {"recorded", "duplicate"}
            bad = [x for x in r.json()["items"] if x["status"] not in fine]
            if bad:
                raise BenchError(f"{sid}: {len(bad)} batch items not recorded, the first: {bad[0]}")
        if not items:
            continue
        for attempt in range(1, 6):
            start = time.perf_counter()
            r = await http.post(f"/v1/sessions/{sid}/form", params={"wait": "true"})
            timing["form"].append(time.perf_counter() - start)
            if r.status_code != 503 or attempt == 5:
                break
            await asyncio.sleep(2 * attempt)
        if r.status_code != 200:
            raise BenchError(f"POST /v1/sessions/{sid}/form answered {r.status_code}: {detail(r)}")


async def wait_embedded(service, agent_id: str, timeout: float = 1800.0) -> float:
    """Until the worker has embedded every memory of the agent (records are acknowledged
    before their embedding); seconds waited. Harness only: read in process."""
    _, backend = await service.agents.backend_for(agent_id)
    started = time.perf_counter()
    while await backend.unembedded(agent_id, 1):
        if time.perf_counter() - started > timeout:
            raise BenchError(f"{agent_id}: memories still unembedded after {timeout:.0f} s")
        await asyncio.sleep(0.25)
    return time.perf_counter() - started


async def check_formed(http: httpx.AsyncClient, q: LmeQuestion, max_chars: int) -> list[str]:
    errors = []
    for session in q.sessions:
        if not session.turns:
            continue
        sid = session_id(q, session.number)
        r = await http.get(f"/v1/sessions/{sid}")
        expected = sum(len(parts(t.text, max_chars)) for t in session.turns)
        status = r.json() if r.status_code == 200 else {}
        if status.get("formed_messages") != expected or status.get("pending_job") is not None:
            errors.append(f"{sid}: {status.get('formed_messages')} of {expected} messages formed, "
                          f"pending job {status.get('pending_job')} ({r.status_code})")
    return errors


async def query_one(http: httpx.AsyncClient, q: LmeQuestion, budgets: Sequence[int], errors: list[str],
                    timing: dict[str, list[float]]) -> dict:
    known = {t.dia_id for t in q.turns}
    # Asked as of the question's date, as the block is: search reads "last week" from it.
    params = {"agent_id": q.question_id, "query": q.question, "scope": "agent", "top_k": SEARCH_DEPTH,
              "as_of": q.date.isoformat()}
    start = time.perf_counter()
    r = await http.get("/v1/search", params=params)
    timing["search"].append(time.perf_counter() - start)
    if r.status_code != 200:
        raise BenchError(f"GET /v1/search ({q.question_id}) answered {r.status_code}: {detail(r)}")
    results = r.json()["results"]
    sources, kinds = [], []
    for x in results:
        if not owned_namespace(x.get("namespace", ""), q.question_id):
            errors.append(f"search {q.question_id}: result {x.get('id')} from namespace {x.get('namespace')!r}")
        ids = {turn_of(s) for s in x.get("source_message_ids") or []}
        if ids - known:
            errors.append(f"search {q.question_id}: result {x.get('id')} cites unknown ids {sorted(ids - known)[:5]}")
        sources.append(ids)
        kinds.append(x.get("kind"))
    ev = [t.dia_id for t in q.evidence]
    found = set().union(*sources) if sources else set()
    m = retrieval_metrics(sources, ev, KS)
    m.update(retrieval_metrics([s for s, k in zip(sources, kinds, strict=True) if k == "message"], ev, (10,), "msg "))
    answer = answer_if_extractive(q)
    for b in budgets:
        params = {"agent_id": q.question_id, "user_id": USER, "session_id": f"{q.question_id}-q", "query": q.question,
                  "budget": b, "as_of": q.date.isoformat()}
        start = time.perf_counter()
        r = await http.get("/v1/context", params=params)
        timing[f"context@{b}"].append(time.perf_counter() - start)
        if r.status_code != 200:
            raise BenchError(f"GET /v1/context ({q.question_id}, budget {b}) answered {r.status_code}: {detail(r)}")
        xml = r.json().get("xml", "")
        if len(xml) > b:
            errors.append(f"context {q.question_id} @ {b}: {len(xml)} chars")
        ranked = [x.get("content", "") for x in results]
        m.update(context_metrics(xml, q.evidence, found, b, answer, ranked=ranked))
        CAPTURE.case(q.question_id, q.half, q.question_type, b, tuple(query_terms(q.question)), list(q.evidence),
                     sorted(found), ranked, answer)
        m[f"chars@{b}"] = float(len(xml))
    rec = record(q.question_id, q.half, q.question_type, **m)
    rec["kinds@10"] = kinds[:10]
    return rec


async def run_service(questions: Sequence[LmeQuestion], budgets: Sequence[int], concurrency: int, console: Console,
                      out: dict, time_limit: float | None = None, store: Path | None = None) -> None:
    """Fills ``out`` as it goes: a failure keeps what was measured before it."""
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None)
    out["settings"] = {"extractor": settings.extractor, "max_message_chars": settings.max_message_chars,
                       "gate_messages": settings.memory_formation_msg_interval,
                       # A block's reads stop at this deadline (CONTEXT_DEADLINE_SECONDS): on a loaded
                       # machine raise it, or blocks lose their relevant memories to the clock.
                       "context_deadline_seconds": settings.context_deadline_seconds}
    errors: list[str] = out.setdefault("errors", [])
    records: list[dict] = out.setdefault("records", [])
    timing: dict[str, list[float]] = {k: [] for k in ("batch", "form", "embed_wait", "search",
                                                      *(f"context@{b}" for b in budgets))}
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lme-bench-") if store is None else nullcontext(str(store)) as tmp:
        # --store: the questions an earlier run ingested into it are queried again, not ingested
        marker = Path(tmp) / "lme-ingested.txt"
        ingested = set(marker.read_text().split()) if marker.exists() else set()
        app = create_app(settings, data_dir=Path(tmp), run_worker=True, host="127.0.0.1")
        server = LoopbackServer(app)
        await server.start()
        started = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 120) as http:
                gate = asyncio.Semaphore(concurrency)

                async def one(q: LmeQuestion) -> None:
                    async with gate:
                        t0 = time.perf_counter()
                        if time_limit is not None and t0 - started > time_limit:
                            out["not_started"] = out.get("not_started", 0) + 1
                            return
                        if q.question_id not in ingested:
                            await ingest_one(http, q, settings.max_message_chars, timing)
                            timing["embed_wait"].append(await wait_embedded(app.state.service, q.question_id))
                            errors.extend(await check_formed(http, q, settings.max_message_chars))
                            with marker.open("a") as f:
                                f.write(q.question_id + "\n")
                        records.append(await query_one(http, q, budgets, errors, timing))
                        console.print(f"  {len(records)}/{len(questions)} {q.question_id} ({q.question_type}, half "
                                      f"{q.half}, {len(q.turns)} turns) in {time.perf_counter() - t0:.0f} s")

                tasks = [asyncio.create_task(one(q)) for q in questions]
                try:
                    await asyncio.gather(*tasks)
                finally:
                    for t in tasks:
                        t.cancel()
        finally:
            out["seconds"] = time.perf_counter() - started
            out["timing"] = {k: summarize_ms(v) for k, v in timing.items()}
            out["messages"] = sum(len(q.turns) for q in questions if any(r["key"] == q.question_id for r in records))
            await server.stop()


CAPTURE = Capture()  # the renderer's inputs of every block (``--capture``)


# --- reporting --------------------------------------------------------------------------

def report(console: Console, methods: dict[str, dict[str, dict]], budgets: Sequence[int]) -> None:
    rows = ["all", "half a", "half b", *sorted({k for s in methods.values() for k in s
                                                 if k not in ("all", "half a", "half b") and " / " not in k})]
    search = {k: v for k, v in methods.items() if k in ("service", "bm25")}
    console.print(summary_table("Turn-level retrieval (search top k; BM25 over raw turns)", search,
                                [(f"{n}@{k}", f"{n}@{k}") for k in (5, 10) for n in ("any", "all")]
                                + [("R@10", "R@10"), ("R@20", "R@20"), ("msg all@10", "msg all@10")], rows))
    ctx_cols = [(f"ctx @{b:,}", f"ctx@{b}") for b in budgets] + [(f"answer @{b:,}", f"ans@{b}") for b in budgets]
    console.print(summary_table("Evidence in context (share of evidence turns shown, 70 % rule) and answer in "
                                "context (extractive answers; their count in brackets)", methods, ctx_cols, rows))
    for b in budgets:
        console.print(summary_table(f"Where the evidence is lost at {b:,} characters (shares of evidence turns)",
                                    methods, loss_columns(b), rows))
        console.print(summary_table(f"Where the block's characters go at {b:,} (shares of its length), and the share "
                                    "of search's top 20 it shows", methods, spent_columns(b), rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a LongMemEval-S-format file (e.g. longmemeval_s_dev.json.gz)")
    parser.add_argument("--half", choices=("a", "b", "both"), default="both", help="which half (default both)")
    parser.add_argument("--limit-questions", type=int, metavar="N", help="only the first N questions (of the half)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write everything as JSON to OUT")
    parser.add_argument("--types", metavar="T1,T2", help="only questions of these types (e.g. single-session-assistant)")
    parser.add_argument("--capture", type=Path, metavar="PATH",
                        help="also keep every block's renderer inputs in PATH, for bench/block_replay.py")
    parser.add_argument("--store", type=Path, metavar="DIR",
                        help="keep the service's store in DIR; a later run with the same DIR queries the questions "
                             "it holds again without ingesting them (compare ranking settings on the same memories)")
    parser.add_argument("--stored-only", action="store_true",
                        help="with --store: only the questions the store holds already (nothing is ingested)")
    parser.add_argument("--budgets", default="4000,16000", help="context budgets, comma-separated (chars)")
    parser.add_argument("--concurrency", type=int, default=2, help="questions ingested at once (default 2)")
    parser.add_argument("--baselines-only", action="store_true", help="skip the service (baselines only)")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="start no question after S seconds of the service's run; report those done "
                             "(the baselines are reported on the same questions)")
    args = parser.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()})
    if not args.path.is_file():
        parser.error(f"{args.path}: no such file")
    from memory_service.config import Settings

    max_chars = Settings(_env_file=None).max_message_chars
    console = Console() if sys.stdout.isatty() else Console(width=180)
    header = print_machine(console, "longmemeval")
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["longmemeval.py", *argv])
    console.print(f"command: {command}")
    started = time.perf_counter()
    questions, stats = load(args.path, max_chars)
    total = Counter(q.half for q in questions)
    if args.stored_only:
        if args.store is None:
            parser.error("--stored-only needs --store")
        held = (args.store / "lme-ingested.txt").read_text().split() if (args.store / "lme-ingested.txt").exists() else []
        questions = [q for q in questions if q.question_id in held]
    questions = [q for q in questions if in_half(q.half, args.half)
                 and (not args.types or q.question_type in args.types.split(","))][:args.limit_questions]
    data = {"path": str(args.path), "questions": len(questions), "halves_in_file": dict(total),
            "by_half": dict(Counter(q.half for q in questions)), "by_type": dict(Counter(q.question_type for q in questions)),
            "turns": sum(len(q.turns) for q in questions), "file": stats,
            "extractive": sum(answer_if_extractive(q) is not None for q in questions)}
    console.print(f"data: {len(questions)} questions ({data['by_half']}; halves in the file {dict(total)}), "
                  f"{data['turns']} non-empty turns, {data['extractive']} extractive answers; file: {stats} "
                  f"(abstention questions skipped; empty turns not sent; long turns sent in parts of {max_chars:,})")
    base = run_baselines(questions, budgets)
    latency = base.pop("_latency")[0]
    records: dict[str, list[dict]] = dict(base)
    service: dict = {"errors": []}
    failure = None
    if not args.baselines_only:
        try:
            with CAPTURE.active() if args.capture else nullcontext():
                asyncio.run(run_service(questions, budgets, args.concurrency, console, service, args.time_limit,
                                            args.store))
        except BenchError as exc:
            failure = str(exc)
        except httpx.HTTPError as exc:
            failure = f"HTTP error talking to the service: {type(exc).__name__}: {exc}"
        done = {r["key"] for r in service.get("records", [])}
        if args.capture:
            CAPTURE.save(args.capture)
        records = {"service": service.get("records", []), **{k: [r for r in v if r["key"] in done] for k, v in base.items()}}
    summaries = {name: grouped(recs) for name, recs in records.items()}
    report(console, summaries, budgets)
    if "timing" in service:
        t = service["timing"]
        if service.get("not_started"):
            console.print(f"[yellow]time limit[/yellow]: {service['not_started']} questions not started")
        console.print(f"service: {len(service.get('records', []))} questions, {service['messages']} messages in "
                      f"{service['seconds']:.0f} s; p50/p95 ms: batch {t['batch'].get('median_ms', 0):.0f}/"
                      f"{t['batch'].get('p95_ms', 0):.0f}, form {t['form'].get('median_ms', 0):.0f}/"
                      f"{t['form'].get('p95_ms', 0):.0f}, search {t['search'].get('median_ms', 0):.0f}/"
                      f"{t['search'].get('p95_ms', 0):.0f}, embedding wait after ingest "
                      f"{t['embed_wait'].get('median_ms', 0) / 1e3:.1f}/{t['embed_wait'].get('p95_ms', 0) / 1e3:.1f} s")
    console.print(f"BM25 query p50/p95: {latency.get('median_ms', 0):.2f}/{latency.get('p95_ms', 0):.2f} ms")
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg())
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; took {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "longmemeval_s", "machine": header, "command": command, "data": data,
            "settings": {"budgets": budgets, "ks": KS, "concurrency": args.concurrency, "half": args.half,
                         "service": service.get("settings")},
            "summaries": summaries, "records": records, "bm25_latency": latency,
            "service": {k: v for k, v in service.items() if k != "records"}, "failure": failure,
        }, indent=1, default=_jsonable) + "\n")
        console.print(f"results written to {args.json}")
    errors = service.get("errors", [])
    for error in errors[:50]:
        console.print(f"[red]FAIL[/red] {error}")
    if failure:
        console.print(f"[red]FAIL[/red] {failure}")
    return 1 if failure or errors else 0


if __name__ == "__main__":
    sys.exit(main())
