"""The worst a read key can ask of the graph store: a hub entity's pages, a search naming the
hub, the longest list pages.

Builds, over the real HTTP API (a server on loopback, embedded FalkorDB and Redis, the hash
embedder), one hub entity per size in ``--hubs`` with write-block requests as an attacker
with a write key would (4 blocks of 99 edges per request: 396 facts), then times with a
read key: the first page of the hub's facts at the default (50) and the largest (200) page,
the first 200-fact page after a cursor half-way through, a walk of every page, a search
whose query names the hub (top_k 100), and the longest pages of the entity and memory
lists (200). Prints the answers' sizes and median/p95 times; ``--json`` writes them.

Correctness (exit 1 when it fails): the walk returns every fact exactly once and the totals
count them.

    .venv/bin/python bench/entity_pages.py                      # hubs of 3,960 and 7,920 facts
    .venv/bin/python bench/entity_pages.py --hubs 3960 --repeat 10 --json /tmp/pages.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.backends.loopback import LoopbackServer  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.http.app import create_app  # noqa: E402

AGENT = "bench"
BLOCKS, EDGES = 4, 99


def request_text(hub: str, request: int) -> str:
    blocks = []
    for b in range(BLOCKS):
        edges = [{"source": hub, "target": f"S{request}x{b}x{i}", "rel_type": "knows"} for i in range(EDGES)]
        blocks.append(f"<memory_write>{json.dumps({'edges': edges}, separators=(',', ':'))}</memory_write>")
    return "\n".join(blocks)


async def timed(repeat: int, call: Any) -> tuple[dict[str, Any], httpx.Response]:
    """Times of the 200s (a loaded machine's store answers a 503 now and then: counted)."""
    seconds, answer, refused = [], None, 0
    for _ in range(repeat):
        start = time.perf_counter()
        reply = await call()
        if reply.status_code == 503:
            refused += 1
            continue
        seconds.append(time.perf_counter() - start)
        assert reply.status_code == 200, reply.text[:300]
        answer = reply
    assert answer is not None, "every call answered 503"
    return {**summarize_ms(seconds), "answered_503": refused}, answer


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hubs", type=int, nargs="+", default=[3960, 7920], help="facts of each hub built")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    header = print_machine(console, "entity_pages")
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    operator = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as data:
        store = EmbeddedFalkorDB(Path(data))
        url = store.start()
        try:
            settings = Settings(_env_file=None, falkordb_url=url, redis_url=url, embedder="hash", embedding_dimension=64,
                                api_auth="keys", operator_api_key=operator, memory_write_agents=["*"],
                                rate_limit_requests_per_minute=0, rate_limit_tokens_per_minute=0)
            async with LoopbackServer(create_app(settings)) as server, \
                    httpx.AsyncClient(base_url=server.base_url, timeout=600,
                                      headers={"Authorization": f"Bearer {operator}"}) as http:
                assert (await http.put(f"/v1/agents/{AGENT}", json={})).status_code == 200
                made = await http.post("/v1/keys", json={"name": "reader", "role": "read", "agents": [AGENT]})
                reader = {"Authorization": f"Bearer {made.json()['key']}"}
                for size in args.hubs:
                    hub = f"Hub{size}"
                    start = time.perf_counter()
                    for request in range(-(-size // (BLOCKS * EDGES))):
                        for _ in range(10):  # a loaded store answers 503 now and then; each write is idempotent
                            answer = await http.post(f"/v1/agents/{AGENT}/writes/parse", json={
                                "text": request_text(hub, request), "namespace": f"agent:{AGENT}"})
                            if answer.status_code != 503:
                                break
                            await asyncio.sleep(2)
                        assert answer.status_code == 200, answer.text[:300]
                    built = time.perf_counter() - start
                    listed = await http.get(f"/v1/agents/{AGENT}/entities", params={"name": hub})
                    entity = next(e["id"] for e in listed.json()["entities"] if e["name"] == hub)
                    path = f"/v1/agents/{AGENT}/entities/{entity}"
                    console.print(f"hub of {size} facts built in {built:.1f} s")

                    def get(params: dict[str, Any], where: str = path) -> Any:
                        return lambda: http.get(where, params=params, headers=reader)

                    cases: list[tuple[str, Any]] = [("facts, default page (50)", get({})),
                                                    ("facts, page of 200", get({"limit": 200}))]
                    walked: list[str] = []
                    cursor, pages, walk_start, middle = None, 0, time.perf_counter(), None
                    while True:
                        page = (await http.get(path, headers=reader,
                                               params={"limit": 200, **({"cursor": cursor} if cursor else {})})).json()
                        walked += [f["id"] for f in page["facts"]]
                        pages += 1
                        if pages == max(1, size // 400):
                            middle = page["next"]
                        if (cursor := page["next"]) is None:
                            break
                    walk_seconds = time.perf_counter() - walk_start
                    if len(walked) != len(set(walked)) or len(walked) != page["facts_total"]:
                        errors.append(f"hub {size}: walked {len(walked)} facts ({len(set(walked))} distinct), "
                                      f"total {page['facts_total']}")
                    console.print(f"walked {len(walked)} facts, each once; facts_total {page['facts_total']}")
                    if middle:
                        cases.append(("facts, page of 200 half-way (cursor)", get({"limit": 200, "cursor": middle})))
                    cases += [("search naming the hub, top_k 100", get({"query": f"what about {hub}?", "top_k": 100,
                                                                       "agent_id": AGENT, "scope": "agent"},
                                                                      "/v1/search")),
                              ("entities list, page of 200", get({"limit": 200}, f"/v1/agents/{AGENT}/entities")),
                              ("memories list, page of 200", get({"limit": 200}, f"/v1/agents/{AGENT}/memories"))]
                    for name, call in cases:
                        stats, answer = await timed(args.repeat, call)
                        rows.append({"hub_facts": size, "case": name, "bytes": len(answer.content), **stats})
                        console.print(rows[-1])
                    rows.append({"hub_facts": size, "case": f"walk of every page ({pages} pages of 200)",
                                 "bytes": None, "n": 1, "median_ms": walk_seconds * 1e3,
                                 "p95_ms": walk_seconds * 1e3})
        finally:
            store.stop()
    table = Table("hub facts", "request", "answer bytes", "median ms", "p95 ms")
    for row in rows:
        table.add_row(f"{row['hub_facts']:,}", row["case"], f"{row['bytes']:,}" if row["bytes"] else "",
                      f"{row['median_ms']:.1f}", f"{row['p95_ms']:.1f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "rows": rows, "errors": errors}, indent=2))
    for error in errors:
        console.print(f"[red]{error}[/red]")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
