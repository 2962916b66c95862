"""Benchmark: the agent-wide full-text postings alone at a size the service cannot be filled
to here (issue 18: 1,000,000 memories).

latency_bench.py's corpus (N messages, its queries: 4 words of a random message) is indexed
into a fresh embedded server with ``Postings.index`` (batches of 2,000, texts as the graph
stores them: ``speaker: text``), then per query the top 50 (what fusion takes) and the top 10
are timed (the Lua script, one round trip), and hit@10 of the query's message is compared with
bm25s over the same texts in the same process. Prints JSON: latencies (p50, p95), memories
scored, hit@10, the server's memory per document.

    .venv/bin/python bench/postings_scale.py 1000000
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import redis.asyncio as aredis  # noqa: E402
from baselines import BM25Index  # noqa: E402
from latency_bench import SEED, make_corpus, make_queries  # noqa: E402

from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.backends.postings import Postings  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.recall.search import query_terms  # noqa: E402

QUERIES = 60
BUDGET = Settings.model_fields["search_postings_budget"].default


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * len(ordered) + 0.5)) - 1)]


async def timed(coro):
    start = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - start


async def run(n: int) -> dict:
    corpus = make_corpus(n)
    texts = [f"{m.user_id}: {m.text}" for m in corpus]
    store = EmbeddedFalkorDB(Path(tempfile.mkdtemp(prefix="postings-scale-")))
    redis = aredis.from_url(store.start(), decode_responses=True)
    try:
        postings = Postings(redis)
        start = time.perf_counter()
        for i in range(0, n, 2000):
            await postings.index("a", [(m.message_id, t) for m, t in zip(corpus[i:i + 2000], texts[i:i + 2000],
                                                                          strict=True)], fresh=i == 0)
        index_seconds = time.perf_counter() - start
        used = int((await redis.info("memory"))["used_memory"])
        bm25 = BM25Index(texts)
        times: dict[str, list[float]] = {"top50": [], "top10": [], "bm25s": []}
        hits = {"postings": 0, "bm25s": 0}
        scored = []
        for q in make_queries(corpus, QUERIES, SEED + n):
            terms = query_terms(q.text)
            ranked, seconds = await timed(postings.top("a", terms, 50, BUDGET))
            times["top50"].append(seconds)
            scored.append(ranked.scored)
            ranked, seconds = await timed(postings.top("a", terms, 10, BUDGET))
            times["top10"].append(seconds)
            hits["postings"] += q.target.message_id in {i for i, _ in ranked.hits}
            start = time.perf_counter()
            found = bm25.rank(q.text, 10)
            times["bm25s"].append(time.perf_counter() - start)
            hits["bm25s"] += q.target.index in found
    finally:
        await redis.aclose()
        store.stop()
    return {"n": n, "index_seconds": index_seconds, "used_memory_per_doc": used / n,
            "scored_p50": statistics.median(scored), "scored_max": max(scored),
            **{k: {"p50_ms": statistics.median(v) * 1000, "p95_ms": p95(v) * 1000} for k, v in times.items()},
            "hit@10": {k: v / QUERIES for k, v in hits.items()}, "load": os.getloadavg()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)), indent=1))
