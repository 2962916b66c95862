"""Benchmark: facts that change over sessions (issue 16's knowledge-update target).

Loads ``bench/data/knowledge_updates.json`` (synthetic users, three sessions each; see
``bench/data/README.md``) into the service on a real loopback server (``create_app`` served
by ``LoopbackServer``, embedded FalkorDB in a temporary directory, settings from defaults
only, as ``bench/locomo.py``): one agent, every user a user of it, every message recorded
with ``POST /v1/sessions/{id}/messages`` at its session's date, every session formed with
``POST /v1/sessions/{id}/form?wait=true``. Then, per case:

- ``GET /v1/context`` (the user, their last session, the question as ``query``, budget
  4,000): **current**: the current value is in the block's text as the model reads it
  (entities unescaped: "Marlowe &amp; Finch" is "Marlowe & Finch"; a case-insensitive
  whole-word match); **superseded as current**: (a) a superseded value is in the block and the current
  value is not, or (b) a superseded value is in an element whose tag contains ``Fact``
  (``Fact``, a graph fact element, ...) and holds no element itself (a container such as
  ``<KnownFacts>`` states nothing of its own), carries no ``invalid_at``/``superseded``/
  ``expired_at`` attribute and does not name the current value too; a case counts once.
- ``GET /v1/search`` (scope user, top 10): the current value is in one of the results' text.

Targets (issue 16): current ≥ 95 %, superseded as current = 0. They are reported met / not
met; the exit status is 1 only when the service answers wrongly (a refused request, a block
over its budget or unparseable, a session not fully formed).

    .venv/bin/python bench/knowledge_updates.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

DATA = HERE / "data" / "knowledge_updates.json"
AGENT = "ku-bench"
BUDGET = 4000
TOP_K = 10
TARGET_CURRENT = 0.95
CLOSED_ATTRS = ("invalid_at", "superseded", "superseded_by", "expired_at")


class BenchError(Exception):
    """The service cannot do what the bench needs: the message says what and why."""


def mentions(text: str, value: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", text, re.IGNORECASE) is not None


def fact_elements(xml: str) -> list[str]:
    """The text of every element whose tag names a fact and that is not marked closed (its
    tag prefixed, ``<Fact>text``, for the record of a failing case)."""
    root = ET.fromstring(xml)
    # Leaves only: a container (<KnownFacts>, <Facts>) states nothing itself, its children do.
    return [f"<{e.tag}>" + "".join(e.itertext()) for e in root.iter()
            if "Fact" in e.tag and len(e) == 0 and not any(a in e.attrib for a in CLOSED_ATTRS)]


def score_block(xml: str, current: str, superseded: list[str]) -> dict:
    # The block's text as the model reads it: entities unescaped ("Marlowe &amp; Finch" is
    # "Marlowe & Finch"), every element's text and its attributes.
    text = (" ".join([*ET.fromstring(xml).itertext(), *(v for e in ET.fromstring(xml).iter() for v in e.attrib.values())])
            if xml.strip() else "")
    has_current = mentions(text, current)
    old_in_block = [v for v in superseded if mentions(text, v)]
    facts = fact_elements(xml) if xml.strip() else []
    offending = [(v, f) for v in superseded for f in facts if mentions(f, v) and not mentions(f, current)]
    old_in_fact = [v for v, _ in offending]
    rule_a = bool(old_in_block) and not has_current
    return {"current": has_current, "old_in_block": old_in_block, "old_in_fact": sorted(set(old_in_fact)),
            "offending_elements": sorted({f[:300] for _, f in offending}),
            "superseded_as_current": rule_a or bool(old_in_fact), "rule_a": rule_a, "rule_b": bool(old_in_fact)}


def detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("detail", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        return response.text[:500]


def sid(user: dict, number: int) -> str:
    return f"{user['user_id']}-s{number}"


async def ingest(http: httpx.AsyncClient, users: list[dict], concurrency: int) -> dict:
    record_s: list[float] = []
    form_s: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one_user(user: dict) -> None:
        async with gate:
            for session in user["sessions"]:
                s = sid(user, session["number"])
                base = datetime.fromisoformat(session["date"])
                for i, m in enumerate(session["messages"]):
                    at = (base + timedelta(seconds=30 * i)).isoformat()
                    body = {"agent_id": AGENT, "user_id": user["user_id"], "role": m["role"],
                            "content": m["content"], "message_id": f"{s}-m{i}", "created_at": at}
                    start = time.perf_counter()
                    r = await http.post(f"/v1/sessions/{s}/messages", json=body)
                    record_s.append(time.perf_counter() - start)
                    if r.status_code != 200:
                        raise BenchError(f"POST /v1/sessions/{s}/messages answered {r.status_code}: {detail(r)}")
                start = time.perf_counter()
                r = await http.post(f"/v1/sessions/{s}/form", params={"wait": "true"})
                form_s.append(time.perf_counter() - start)
                if r.status_code != 200:
                    raise BenchError(f"POST /v1/sessions/{s}/form answered {r.status_code}: {detail(r)}")

    start = time.perf_counter()
    await asyncio.gather(*(one_user(u) for u in users))
    wall = time.perf_counter() - start
    return {"messages": len(record_s), "sessions": len(form_s), "seconds": wall,
            "messages_per_s": len(record_s) / wall, "record": summarize_ms(record_s), "form": summarize_ms(form_s)}


async def check_formed(http: httpx.AsyncClient, users: list[dict]) -> list[str]:
    errors = []
    for user in users:
        for session in user["sessions"]:
            r = await http.get(f"/v1/sessions/{sid(user, session['number'])}")
            status = r.json() if r.status_code == 200 else {}
            if status.get("formed_messages") != len(session["messages"]) or status.get("pending_job") is not None:
                errors.append(f"{sid(user, session['number'])}: {status.get('formed_messages')} of "
                              f"{len(session['messages'])} messages formed ({r.status_code})")
    return errors


async def ask(http: httpx.AsyncClient, users: list[dict], cases: list[dict], errors: list[str]) -> dict:
    last = {u["user_id"]: sid(u, u["sessions"][-1]["number"]) for u in users}
    records, ctx_s, search_s = [], [], []
    for case in cases:
        params = {"agent_id": AGENT, "user_id": case["user_id"], "session_id": last[case["user_id"]],
                  "query": case["question"], "budget": BUDGET}
        start = time.perf_counter()
        r = await http.get("/v1/context", params=params)
        ctx_s.append(time.perf_counter() - start)
        if r.status_code != 200:
            raise BenchError(f"GET /v1/context ({case['id']}) answered {r.status_code}: {detail(r)}")
        xml = r.json().get("xml", "")
        if len(xml) > BUDGET:
            errors.append(f"{case['id']}: a block of {len(xml)} chars for a budget of {BUDGET}")
        try:
            rec = score_block(xml, case["current"], case["superseded"])
        except ET.ParseError as exc:
            errors.append(f"{case['id']}: the block does not parse: {exc}")
            continue
        start = time.perf_counter()
        r = await http.get("/v1/search", params={"agent_id": AGENT, "query": case["question"], "scope": "user",
                                                 "user_id": case["user_id"], "top_k": TOP_K})
        search_s.append(time.perf_counter() - start)
        if r.status_code != 200:
            raise BenchError(f"GET /v1/search ({case['id']}) answered {r.status_code}: {detail(r)}")
        texts = [str(x.get("text") or x.get("content") or "") for x in r.json().get("results", [])[:TOP_K]]
        hit = next((i + 1 for i, t in enumerate(texts) if mentions(t, case["current"])), None)
        old_first = next((i + 1 for i, t in enumerate(texts) if any(mentions(t, v) for v in case["superseded"])
                          and not mentions(t, case["current"])), None)
        records.append({"id": case["id"], "kind": case["kind"], "category": case["category"],
                        "chain": len(case["superseded"]) + 1, **rec, "chars": len(xml),
                        "search_rank": hit, "search_old_only_rank": old_first})
    return {"records": records, "context_latency": summarize_ms(ctx_s), "search_latency": summarize_ms(search_s)}


def summarize(records: list[dict]) -> dict:
    def share(rs: list[dict], key: str) -> float | None:
        return statistics.fmean(float(bool(r[key])) for r in rs) if rs else None

    out: dict[str, Any] = {"cases": len(records), "current": share(records, "current"),
                           "superseded_as_current": sum(r["superseded_as_current"] for r in records),
                           "superseded_rule_a": sum(r["rule_a"] for r in records),
                           "superseded_rule_b": sum(r["rule_b"] for r in records),
                           "old_in_block": sum(bool(r["old_in_block"]) for r in records),
                           "search_current@10": share(records, "search_rank"),
                           "search_old_ranked_above_current": sum(
                               1 for r in records if r["search_old_only_rank"] and
                               (r["search_rank"] is None or r["search_old_only_rank"] < r["search_rank"]))}
    out["by_category"] = {c: {"cases": len(rs), "current": share(rs, "current"),
                              "superseded_as_current": sum(r["superseded_as_current"] for r in rs),
                              "search_current@10": share(rs, "search_rank")}
                          for c in sorted({r["category"] for r in records})
                          for rs in [[r for r in records if r["category"] == c]]}
    out["two_changes"] = {"cases": sum(r["chain"] == 3 for r in records),
                          "current": share([r for r in records if r["chain"] == 3], "current")}
    return out


async def run(users: list[dict], cases: list[dict], concurrency: int, console: Console, out: dict) -> None:
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None)
    out["settings"] = {"extractor": settings.extractor, "embedder": getattr(settings, "embedder", None)}
    errors: list[str] = out.setdefault("errors", [])
    with tempfile.TemporaryDirectory(prefix="ku-bench-") as tmp:
        server = LoopbackServer(create_app(settings, data_dir=Path(tmp), run_worker=True, host="127.0.0.1"))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
                console.print(f"service on {server.base_url}, extractor {settings.extractor}, embedder "
                              f"{out['settings']['embedder']}; recording {sum(len(s['messages']) for u in users for s in u['sessions'])} messages ...")
                out["ingest"] = await ingest(http, users, concurrency)
                errors += await check_formed(http, users)
                console.print(f"  {out['ingest']['messages']} messages, {out['ingest']['sessions']} sessions formed "
                              f"in {out['ingest']['seconds']:.1f} s; asking {len(cases)} questions ...")
                asked = await ask(http, users, cases, errors)
        finally:
            await server.stop()
    out["summary"] = summarize(asked["records"])
    out["context_latency"], out["search_latency"] = asked["context_latency"], asked["search_latency"]
    out["per_case"] = asked["records"]


def f3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def report(console: Console, out: dict) -> dict:
    s = out["summary"]
    t = Table(title=f"Knowledge updates: the block at {BUDGET:,} chars and search top {TOP_K}")
    for col in ("category", "cases", "current in block", "superseded as current", "current in search@10"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for c, row in s["by_category"].items():
        t.add_row(c, str(row["cases"]), f3(row["current"]), str(row["superseded_as_current"]),
                  f3(row["search_current@10"]))
    t.add_row("all", str(s["cases"]), f3(s["current"]), str(s["superseded_as_current"]), f3(s["search_current@10"]))
    console.print(t)
    console.print(f"superseded as current: rule (a) {s['superseded_rule_a']}, rule (b) {s['superseded_rule_b']}; "
                  f"an old value anywhere in the block: {s['old_in_block']}; two changes: {s['two_changes']}")
    c, q = out["context_latency"], out["search_latency"]
    console.print(f"context latency p50 {c['median_ms']:.1f} ms, p95 {c['p95_ms']:.1f} ms; search p50 "
                  f"{q['median_ms']:.1f} ms, p95 {q['p95_ms']:.1f} ms")
    targets = {
        f"current in block >= {TARGET_CURRENT}": {"value": s["current"], "met": s["current"] >= TARGET_CURRENT},
        "superseded as current == 0": {"value": s["superseded_as_current"], "met": s["superseded_as_current"] == 0},
    }
    for label, v in targets.items():
        console.print(f"target {label}: {v['value']}: {'met' if v['met'] else 'not met'}")
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the set (default bench/data/knowledge_updates.json)")
    parser.add_argument("--quick", action="store_true", help="the first 8 users only (32 cases): a smoke run")
    parser.add_argument("--users", type=int, metavar="N", help="the first N users")
    parser.add_argument("--concurrency", type=int, default=4, help="users recorded at once (default 4)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write everything as JSON to OUT")
    args = parser.parse_args(argv)
    data = json.loads(args.data.read_text())
    limit = 8 if args.quick else args.users
    users = data["users"][:limit] if limit else data["users"]
    names = {u["user_id"] for u in users}
    cases = [c for c in data["cases"] if c["user_id"] in names]

    console = Console() if sys.stdout.isatty() else Console(width=160)
    header = print_machine(console, "knowledge_updates")
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["knowledge_updates.py", *argv])
    out: dict[str, Any] = {"errors": []}
    failure = None
    try:
        asyncio.run(run(users, cases, args.concurrency, console, out))
    except BenchError as exc:
        failure = str(exc)
    targets = report(console, out) if "summary" in out else {}
    result = {"benchmark": "knowledge_updates", "machine": header, "command": command, "quick": args.quick,
              "data": {"path": str(args.data), "users": len(users), "cases": len(cases)},
              "budget": BUDGET, "top_k": TOP_K, "targets": targets, "failure": failure, **out}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        console.print(f"results written to {args.json}")
    for error in out["errors"][:30]:
        console.print(f"[red]FAIL[/red] {error}")
    if failure:
        console.print(f"[red]FAIL[/red] {failure}")
    return 1 if failure or out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
