"""Benchmark: does a re-ranker over search's fused candidates pay, and at how many candidates?

The candidates are the service's own: the LoCoMo conversations are recorded and formed once
into ``--store DIR`` (the same store and code as ``bench/graph_rank.py``, which it reuses),
then every question of categories 1-4 is searched once through ``GET /v1/search`` (scope
agent, top 50, ``RERANKER=none``), and the 50 fused results (their text and source message
ids) are kept in the store's directory. Each candidate model then scores the (question,
result) pairs of the top 50, and the top N (``--ns``, default 20, 30, 50) are put in a new
order, two ways:

- ``order``: the model's order alone for the top N (the rest after, as fused);
- ``rrf w``: reciprocal rank fusion of the fused order (weight 1) and the model's order
  (weight w), k = SEARCH_RRF_K: what ``memory_service/recall/search.py`` does.

Reported per model, N and rule: turn recall@5 and @10 and recall@10 per category (c1
multi-hop), against the fused order; and the model's latency for one query at each N on
this machine (its threads as the service runs it), cold (no candidate's features cached)
and warm (every candidate seen before), median and p95.

Models: ``nanoranker`` (the service's ``LocalReranker``; the only one that ships in a PyPI
wheel: docs/ranking.md) and ``minilm-l6-pairs``, a latency yardstick only: the service's
all-MiniLM-L6-v2 int8 run on the (question, candidate) pairs as a cross-encoder would be
(ms-marco-MiniLM-L-6-v2 is the same network: 6 layers, 384 wide, the same vocabulary), so
its time is what a MiniLM-L6 cross-encoder would cost here; its scores are not a
cross-encoder's and are not reported.

    .venv/bin/python bench/rerank_models.py PATH --store DIR [--ns 20,30,50] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from baselines import load_locomo, ranked_sources, recall_at  # noqa: E402
from common import p95, print_machine  # noqa: E402
from graph_rank import FORMED  # noqa: E402
from locomo import BenchError, check_formed, ingest  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

CANDIDATES = "rerank-candidates.json"  # in the store's directory, next to graph_rank's marker
TOP = 50
LATENCY_QUESTIONS = 150
WEIGHTS = (0.5, 1.0, 2.0)


async def collect(path: Path, store: Path, console: Console) -> list[dict]:
    """Per question: its category, evidence and the service's top 50 (text, source ids)."""
    cached = store / CANDIDATES
    if cached.exists():
        return list(json.loads(cached.read_text()))
    import httpx

    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    samples = load_locomo(path)
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None, reranker="none")
    store.mkdir(parents=True, exist_ok=True)
    server = LoopbackServer(create_app(settings, data_dir=store, run_worker=True, host="127.0.0.1"))
    await server.start()
    out = []
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
            if not (store / FORMED).exists():
                console.print(f"store {store}: recording and forming {sum(len(s.turns) for s in samples)} turns ...")
                formed = await ingest(http, samples, 5, console)
                if errors := await check_formed(http, samples):
                    raise BenchError(f"not every session was formed: {errors[:5]}")
                (store / FORMED).write_text(json.dumps(formed))
            for sample in samples:
                for q in sample.questions:
                    r = await http.get("/v1/search", params={"agent_id": sample.sample_id, "query": q.question,
                                                             "scope": "agent", "top_k": TOP})
                    if r.status_code != 200:
                        raise BenchError(f"GET /v1/search answered {r.status_code}: {r.text[:300]}")
                    results = r.json()["results"]
                    out.append({"question": q.question, "category": q.category, "evidence": list(q.evidence),
                                "texts": [x["content"] for x in results],
                                "sources": [x["source_message_ids"] for x in results]})
    finally:
        await server.stop()
    cached.write_text(json.dumps(out))
    return out


def reorder(n: int, scores: list[float], rule: str, weight: float, k: int, size: int) -> list[int]:
    """Indices of the fused list (0 = fused best) in the new order."""
    n = min(n, size)
    by_model = sorted(range(n), key=lambda i: (-scores[i], i))
    if rule == "order":
        head = by_model
    else:
        model_rank = {i: place for place, i in enumerate(by_model, start=1)}
        head = sorted(range(n), key=lambda i: (-(1 / (k + i + 1) + weight / (k + model_rank[i])), i))
    return head + list(range(n, size))


def measure(questions: list[dict], order_of: Any) -> dict:
    """Recall@5/@10 and recall@10 per category of the orders ``order_of(question_index)`` gives."""
    per: dict[str, list[float]] = {"r@5": [], "r@10": [], **{f"c{c}": [] for c in (1, 2, 3, 4)}}
    for qi, q in enumerate(questions):
        order = order_of(qi)
        sources = [q["sources"][i] for i in order]
        r10 = recall_at(ranked_sources(sources, 10), q["evidence"])
        per["r@5"].append(recall_at(ranked_sources(sources, 5), q["evidence"]))
        per["r@10"].append(r10)
        per[f"c{q['category']}"].append(r10)
    return {key: statistics.fmean(v) if v else None for key, v in per.items()}


async def nanoranker_scores(questions: list[dict], ns: list[int], console: Console) -> tuple[list[list[float]], dict]:
    from memory_service.recall.rerank import LocalReranker

    model = LocalReranker()
    started = time.perf_counter()
    await model.start()
    load = time.perf_counter() - started
    sample = questions[:: max(1, len(questions) // LATENCY_QUESTIONS)][:LATENCY_QUESTIONS]
    latency: dict[str, dict] = {}
    for n in ns:  # cold: nothing cached, as for candidates the service has not seen yet
        seconds = []
        for q in sample:
            model._cache.clear()
            start = time.perf_counter()
            await model.score(q["question"], q["texts"][:n])
            seconds.append(time.perf_counter() - start)
        latency[f"cold@{n}"] = seconds
    scores = []
    for q in questions:
        scores.append(await model.score(q["question"], q["texts"]))
    for n in ns:  # warm: every candidate's features cached by the pass above
        seconds = []
        for q in sample:
            start = time.perf_counter()
            await model.score(q["question"], q["texts"][:n])
            seconds.append(time.perf_counter() - start)
        latency[f"warm@{n}"] = seconds
    await model.aclose()
    return scores, {"load_s": load, "threads": model.threads, **{k: ms(v) for k, v in latency.items()}}


def minilm_pair_latency(questions: list[dict], ns: list[int]) -> dict:
    """A MiniLM-L6 cross-encoder's forward pass over N pairs: all-MiniLM-L6-v2 int8 (the
    service's embedder, the same network) on ``[CLS] question [SEP] candidate [SEP]``,
    truncated at 256 tokens, one batch per query, the embedder's own session options."""
    import numpy as np

    from memory_service.embedding.embedders import LocalEmbedder

    embedder = LocalEmbedder()
    session, tokenizer = embedder._load()
    sample = questions[:: max(1, len(questions) // LATENCY_QUESTIONS)][:LATENCY_QUESTIONS]
    out: dict[str, Any] = {"threads": embedder.threads}
    for n in ns:
        seconds = []
        for q in sample:
            start = time.perf_counter()
            encodings = tokenizer.encode_batch([(q["question"], t) for t in q["texts"][:n]])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            types = np.array([e.type_ids for e in encodings], dtype=np.int64)
            session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            seconds.append(time.perf_counter() - start)
        out[f"cold@{n}"] = ms(seconds)
    return out


def ms(seconds: list[float]) -> dict:
    return {"n": len(seconds), "median_ms": statistics.median(seconds) * 1e3, "p95_ms": p95(seconds) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file (e.g. locomo_dev.json)")
    parser.add_argument("--store", type=Path, required=True, help="the formed store's directory (made when new)")
    parser.add_argument("--ns", default="20,30,50", help="candidate counts the model reads, comma-separated")
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args(argv)
    ns = sorted({int(n) for n in args.ns.split(",") if n.strip()})
    console = Console() if sys.stdout.isatty() else Console(width=200)
    header = print_machine(console, "rerank_models")
    from memory_service.config import Settings

    k = Settings(_env_file=None).search_rrf_k
    try:
        questions = asyncio.run(collect(args.path, args.store, console))
    except BenchError as exc:
        console.print(f"[red]FAIL[/red] {exc}")
        return 1
    console.print(f"{len(questions)} questions, the service's top {TOP} fused results each; "
                  f"evidence within the top N (the ceiling of any re-order): " + ", ".join(
                      f"N={n}: {measure(questions, lambda qi, n=n: list(range(n)))['r@10']:.3f} at 10 / "
                      f"{statistics.fmean(recall_at(ranked_sources(q['sources'], n), q['evidence']) for q in questions):.3f} at N"
                      for n in ns))
    rows: dict[str, dict] = {"fused (no re-ranker)": measure(questions, lambda qi: list(range(len(questions[qi]["texts"]))))}
    scores, nano_latency = asyncio.run(nanoranker_scores(questions, ns, console))
    for n in ns:
        for rule, weight in [("order", 0.0), *(("rrf", w) for w in WEIGHTS)]:
            name = f"nanoranker N={n} {rule}" + (f" w={weight}" if rule == "rrf" else "")
            rows[name] = measure(questions, lambda qi, n=n, rule=rule, weight=weight: reorder(
                n, scores[qi], rule, weight, k, len(questions[qi]["texts"])))
    pair_latency = minilm_pair_latency(questions, ns)
    t = Table(title=f"Turn recall of the service's fused top {TOP}, re-ranked (RRF k={k})")
    for col in ("order", "R@5", "R@10", "c1 R@10", "c2 R@10", "c3 R@10", "c4 R@10"):
        t.add_column(col, justify="left" if col == "order" else "right")
    for name, m in rows.items():
        t.add_row(name, *(f"{m[key]:.3f}" for key in ("r@5", "r@10", "c1", "c2", "c3", "c4")))
    console.print(t)
    lt = Table(title=f"Latency of one query's re-ranking, ms (median / p95 of {LATENCY_QUESTIONS} questions), "
                     f"load average {os.getloadavg()[0]:.2f}")
    for col in ("model", *(f"N={n}" for n in ns)):
        lt.add_column(col, justify="left" if col == "model" else "right")
    for label, lat, key in (("nanoranker, cold", nano_latency, "cold"), ("nanoranker, warm", nano_latency, "warm"),
                            ("MiniLM-L6 cross-encoder (forward pass)", pair_latency, "cold")):
        lt.add_row(label, *(f"{lat[f'{key}@{n}']['median_ms']:.1f} / {lat[f'{key}@{n}']['p95_ms']:.1f}" for n in ns))
    console.print(lt)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "rerank_models", "machine": header, "k": k, "top": TOP,
                                         "questions": len(questions), "recall": rows,
                                         "latency": {"nanoranker": nano_latency, "minilm-l6-pairs": pair_latency},
                                         "load_average_end": os.getloadavg()}, indent=1) + "\n")
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
