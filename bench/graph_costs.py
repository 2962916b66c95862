"""Benchmark: what the knowledge graph costs (issue 16, item 9).

For each checkout (``--code NAME=DIR``, repeatable, as ``bench/ingest_bench.py``; default:
this one), a ``memory-service serve`` child process on a loopback port with its embedded
FalkorDB in a temporary directory records two conversations through the HTTP API and forms
every session with ``POST /v1/sessions/{id}/form?wait=true`` (the message gates are set out
of reach, so every window is formed by that call and timed by it):

- the demo conversation (``memory_service/data/demo_conversation.json``: its agent, shards,
  users and sessions);
- the knowledge-update set (``bench/data/knowledge_updates.json``), one agent.

Then, per agent graph, through the store's own URL: ``:Entity`` nodes, ``RELATES_TO`` and
``MENTIONS`` edges (per 1,000 messages), and memory: ``GRAPH.MEMORY USAGE`` (FalkorDB's
per-graph accounting, kept raw in the JSON; it answers whole megabytes, too coarse here) and
the store's ``INFO memory`` ``used_memory`` (the whole store). Memory per added node or
edge comes from comparing two checkouts on the same conversation (the first, without the
graph write, is the baseline): the store's extra ``used_memory`` over the extra nodes and
edges; it includes the graph's new indexes, so on small graphs it overstates an item's cost.

Offline formation (``EXTRACTOR=rules``) makes no LLM call: LLM calls per window are 0 with
or without the graph; with an LLM extractor the graph rides on the one extraction call
(``docs/graph.md``), which this bench does not run (no key).

    .venv/bin/python bench/graph_costs.py --code before=/tmp/ms-1040cc2 --code after=. --json OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from ingest_bench import Server  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.graph import graph_name  # noqa: E402

DEMO = HERE.parent / "memory_service" / "data" / "demo_conversation.json"
SET = HERE / "data" / "knowledge_updates.json"
KU_AGENT = "ku-costs"


def ok(r: httpx.Response) -> dict:
    if r.status_code >= 400:
        raise RuntimeError(f"{r.request.method} {r.request.url.path} answered {r.status_code}: {r.text[:300]}")
    return r.json()


def windows_of(summary: dict) -> int:
    reason = str(summary.get("reason", ""))
    if reason.startswith("formed ") and reason.endswith(" windows"):
        return int(reason.split()[1])
    return 1 if summary.get("formed") else 0


async def form(http: httpx.AsyncClient, sid: str, timing: dict) -> None:
    start = time.perf_counter()
    summary = ok(await http.post(f"/v1/sessions/{sid}/form", params={"wait": "true"}))
    took = time.perf_counter() - start
    n = windows_of(summary)
    if n:
        timing["per_window_s"] += [took / n] * n
        timing["windows"] += n
    usage = summary.get("usage") or {}
    timing["llm_calls"] += int(usage.get("calls", 0) or 0)


async def replay_demo(http: httpx.AsyncClient, timing: dict) -> tuple[str, int]:
    script = json.loads(DEMO.read_text())
    agent = script["agent_id"]
    ok(await http.put(f"/v1/agents/{agent}", json=script["agent"]))
    for shard_id, shard in script["shards"].items():
        ok(await http.put(f"/v1/agents/{agent}/shards/{shard_id}", json=shard))
    n = 0
    for session in script["sessions"]:
        sid, start = session["session_id"], datetime.fromisoformat(session["date"].replace("Z", "+00:00"))
        for i, (user, role, content) in enumerate(session["messages"]):
            ok(await http.post(f"/v1/sessions/{sid}/messages", json={
                "agent_id": agent, "user_id": user, "role": role, "content": content,
                "created_at": (start + timedelta(minutes=i)).isoformat()}))
            n += 1
        await form(http, sid, timing)
    return agent, n


async def replay_set(http: httpx.AsyncClient, users: list[dict], timing: dict) -> tuple[str, int]:
    n = 0
    for user in users:
        for session in user["sessions"]:
            sid = f"{user['user_id']}-s{session['number']}"
            base = datetime.fromisoformat(session["date"])
            for i, m in enumerate(session["messages"]):
                ok(await http.post(f"/v1/sessions/{sid}/messages", json={
                    "agent_id": KU_AGENT, "user_id": user["user_id"], "role": m["role"], "content": m["content"],
                    "message_id": f"{sid}-m{i}", "created_at": (base + timedelta(seconds=30 * i)).isoformat()}))
                n += 1
            await form(http, sid, timing)
    return KU_AGENT, n


async def graph_figures(store_url: str, agent: str, messages: int) -> dict:
    r = aioredis.from_url(store_url, decode_responses=True)
    g = graph_name(agent)
    out: dict[str, Any] = {"agent": agent, "graph": g, "messages": messages}
    try:
        async def count(q: str) -> int:
            res = await r.execute_command("GRAPH.RO_QUERY", g, q)
            return int(res[1][0][0])

        out["entities"] = await count("MATCH (e:Entity) RETURN count(e)")
        out["relates_to"] = await count("MATCH ()-[f:RELATES_TO]->() RETURN count(f)")
        out["relates_to_current"] = await count(
            "MATCH ()-[f:RELATES_TO]->() WHERE f.invalid_at IS NULL AND f.expired_at IS NULL RETURN count(f)")
        out["mentions"] = await count("MATCH ()-[m:MENTIONS]->() RETURN count(m)")
        out["nodes"] = await count("MATCH (n) RETURN count(n)")
        out["edges"] = await count("MATCH ()-[e]->() RETURN count(e)")
        for key in ("entities", "relates_to", "mentions"):
            out[f"{key}_per_1000_messages"] = 1000 * out[key] / messages if messages else None
        try:
            raw = await r.execute_command("GRAPH.MEMORY", "USAGE", g)
            pairs = dict(zip(raw[::2], raw[1::2], strict=False)) if isinstance(raw, list) else raw
            out["memory_source"] = "GRAPH.MEMORY USAGE"
            out["graph_memory"] = {str(k): float(v) for k, v in pairs.items() if isinstance(v, int | float | str)
                                   and str(v).replace(".", "", 1).isdigit()}
            out["graph_memory_raw"] = {str(k): v for k, v in pairs.items()}
        except Exception as exc:  # an older FalkorDB has no GRAPH.MEMORY
            out["memory_source"] = f"INFO memory used_memory (GRAPH.MEMORY USAGE failed: {exc})"
            out["graph_memory"] = {}
        # GRAPH.MEMORY USAGE answers whole megabytes: too coarse for a few hundred items, so the
        # store's used_memory (the whole store: both checkouts hold the same memories) is kept too
        info = await r.info("memory")
        out["graph_memory"]["used_memory_mb"] = info["used_memory"] / 2**20
    finally:
        await r.aclose()
    return out


async def run_code(name: str, code: Path | None, tmp: Path, users: list[dict], embedder: str, console: Console) -> dict:
    server = Server(embedder, tmp / name, code)
    try:
        await server.ready()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as http:
            result: dict[str, Any] = {}
            for label, replay in (("demo", lambda t: replay_demo(http, t)),
                                  ("knowledge_updates", lambda t: replay_set(http, users, t))):
                timing: dict[str, Any] = {"per_window_s": [], "windows": 0, "llm_calls": 0}
                start = time.perf_counter()
                agent, n = await replay(timing)
                wall = time.perf_counter() - start
                figures = await graph_figures(server.store_url, agent, n)
                figures.update({"seconds": wall, "windows": timing["windows"], "llm_calls": timing["llm_calls"],
                                "form_per_window": summarize_ms(timing["per_window_s"])})
                result[label] = figures
                console.print(f"  {name} {label}: {n} messages, {timing['windows']} windows, "
                              f"{figures['entities']} entities, {figures['relates_to']} RELATES_TO, "
                              f"{figures['mentions']} MENTIONS; form per window p50 "
                              f"{figures['form_per_window'].get('median_ms', 0):.1f} ms")
            return result
    finally:
        server.stop()


def table(results: dict[str, dict]) -> Table:
    t = Table(title="Graph costs per checkout and conversation")
    cols = ("code", "conversation", "messages", "windows", "entities /1k msgs", "RELATES_TO /1k", "MENTIONS /1k",
            "store used MB", "form/window p50 ms", "p95 ms", "LLM calls")
    for c in cols:
        t.add_column(c, justify="left" if c in ("code", "conversation") else "right")
    for code, by_conv in results.items():
        for conv, f in by_conv.items():
            mem = f["graph_memory"]
            total = mem.get("used_memory_mb")
            t.add_row(code, conv, str(f["messages"]), str(f["windows"]),
                      f"{f['entities_per_1000_messages']:.0f}", f"{f['relates_to_per_1000_messages']:.0f}",
                      f"{f['mentions_per_1000_messages']:.0f}", "-" if total is None else f"{total:.2f}",
                      f"{f['form_per_window'].get('median_ms', 0):.1f}", f"{f['form_per_window'].get('p95_ms', 0):.1f}",
                      str(f["llm_calls"]))
    return t


def per_item(results: dict[str, dict], base: str, new: str) -> dict:
    """The graph's extra bytes (new over base) per extra node and per extra edge."""
    out = {}
    for conv in results[new]:
        a, b = results[base][conv], results[new][conv]
        ma, mb = a["graph_memory"], b["graph_memory"]
        delta = {k: (mb[k] - ma.get(k, 0.0)) * 2**20 for k in mb if k.endswith("_mb")}
        nodes, edges = b["nodes"] - a["nodes"], b["edges"] - a["edges"]
        row: dict[str, Any] = {"extra_nodes": nodes, "extra_edges": edges, "delta_bytes": delta}
        total = delta.get("used_memory_mb")
        if total is not None and nodes + edges:
            row["bytes_per_node_or_edge"] = total / (nodes + edges)
        for key, count in (("node_block_storage_sz_mb", nodes), ("relation_block_storage_sz_mb", edges)):
            if key in delta and count:
                row[f"{key}_bytes_per_item"] = delta[key] / count
        out[conv] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="a checkout to run (repeatable); the first is the baseline of the comparison")
    parser.add_argument("--users", type=int, metavar="N", help="the first N users of the set (default all)")
    parser.add_argument("--quick", action="store_true", help="8 users of the set: a smoke run")
    parser.add_argument("--embedder", default="hash", help="EMBEDDER for the servers (default hash: the graph's "
                        "costs, not the embedding model's)")
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args(argv)
    codes: dict[str, Path | None] = {}
    for item in args.code:
        name, _, directory = item.partition("=")
        codes[name] = Path(directory) if directory else None
    codes = codes or {"this": None}
    data = json.loads(SET.read_text())
    limit = 8 if args.quick else args.users
    users = data["users"][:limit] if limit else data["users"]
    # every window formed by POST /form, and timed by it: the gates out of reach
    os.environ["MEMORY_FORMATION_MSG_INTERVAL"] = "100000"
    os.environ["MEMORY_FORMATION_TOKEN_INTERVAL"] = "100000000"
    os.environ["EXTRACTOR"] = "rules"

    console = Console() if sys.stdout.isatty() else Console(width=170)
    header = print_machine(console, "graph_costs")
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["graph_costs.py", *argv])
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="graph-costs-") as tmp:
        for name, code in codes.items():
            results[name] = asyncio.run(run_code(name, code, Path(tmp), users, args.embedder, console))
    console.print(table(results))
    names = list(codes)
    comparison = per_item(results, names[0], names[-1]) if len(names) > 1 else None
    if comparison:
        for conv, row in comparison.items():
            console.print(f"{conv}: {names[-1]} over {names[0]}: +{row['extra_nodes']} nodes, +{row['extra_edges']} "
                          f"edges, {row.get('bytes_per_node_or_edge', float('nan')):.0f} bytes per added node or edge; "
                          + ", ".join(f"{k} {v:.0f}" for k, v in row.items() if k.endswith("_per_item")))
        for conv in results[names[0]]:
            a = results[names[0]][conv]["form_per_window"].get("median_ms")
            b = results[names[-1]][conv]["form_per_window"].get("median_ms")
            if a and b:
                console.print(f"{conv}: formation per window p50 {a:.1f} -> {b:.1f} ms ({b / a:.2f}x)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "graph_costs", "machine": header, "command": command,
                                         "embedder": args.embedder, "users": len(users), "results": results,
                                         "comparison": comparison}, indent=1, default=str) + "\n")
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
