"""Benchmark: the memory block in a session loop, with and without the message embedded as recorded.

The latency bench (``latency_bench.py``) asks for blocks of messages embedded long before.
A session loop does not: the client records the user's message and asks for the block at
once, before the worker has embedded it, so the block embeds the message with the model
on its own path (and the worker embeds it again). ``CONTEXT_EMBED_ON_RECORD``
(memory_service/embedding/fresh.py) embeds a live session's user message as it is
recorded; this bench measures the block of such a loop both ways, in one process.

A fresh store (``open_service`` on an embedded FalkorDB, the default local model as the
embedder, the worker in process) is filled through the batch route with the latency
bench's synthetic corpus (``--size`` messages, 50 a session), and the worker embeds them
all. Then ``--sessions`` existing sessions each run ``--turns`` turns of the loop, the
sessions interleaved, every other session with the embedding on record off (the baseline,
in the same process, on the same store):

1. record a new user message (a sentence of the corpus' words, in the session's user's
   name) through ``record_message``;
2. ask for the block without a query (``assemble_memory_context``, budget 4,000): timed;
3. wait ``--think`` seconds (the model's turn), record the assistant's reply.

A session counts as live once a block was asked for it, so each session's first turn is
the same both ways and is left out of the figures. Per mode: median and p95 of the block
(ms), how many of its user messages the API embedded as recorded, and the ratio of the
medians. Speed is reported, never asserted. Correctness is checked on every block (a
violation prints FAIL and exits 1): within its budget, parseable, never showing the
message it searched with as a relevant memory.

``--http`` runs the loop through the HTTP API on loopback (httpx to uvicorn, as a client
runs it); ``--worker-apart`` leaves the worker out of the timed process (as when workers run
as their own processes).

    .venv/bin/python bench/session_loop_bench.py [--size 5000] [--sessions 30] [--turns 6]
        [--think 0.05] [--http] [--worker-apart] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from xml.etree import ElementTree as ET

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
import latency_bench as lb  # noqa: E402
from common import print_machine, summarize_ms  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

BUDGET = 4000


async def run(args: argparse.Namespace, console: Console) -> dict:
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.domain.models import MessageIn
    from memory_service.http.app import create_app
    from memory_service.runtime import open_service

    corpus = lb.make_corpus(args.size)
    words = sorted({w for m in corpus[:2000] for w in m.text.split() if w.isalpha() and len(w) > 3})
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="session-loop-") as data_dir:
        settings = lb.service_settings(embedder="local")
        async with open_service(settings, data_dir=Path(data_dir), run_worker=True) as service:
            console.print(f"  filling {args.size:,} messages through the batch route (the local model embeds them) ...")
            filled = await lb.fill_batches(service, corpus, 4, 500, console, errors)
            waited = await lb.embedded_all(service)
            console.print(f"  filled in {filled['seconds']:.1f} s; embedded {waited:.1f} s later")
        async with open_service(settings, data_dir=Path(data_dir), run_worker=not args.worker_apart) as service:
            await lb.indexes_operational(service)
            fresh, embedder = service.fresh, service.fresh.embedder
            started_runs = {"on": 0, "off": 0}
            recorded = fresh.recorded

            def counting(mode: str):
                def recorded_and_counted(*a, **kw) -> bool:
                    began = recorded(*a, **kw)
                    started_runs[mode] += began
                    return began
                return recorded_and_counted

            counted = {mode: counting(mode) for mode in started_runs}

            speakers: dict[str, str] = {}
            for m in corpus:
                speakers.setdefault(m.session_id, m.user_id)
            rng = random.Random(11)
            sessions = rng.sample(sorted(speakers), args.sessions)
            modes = {s: ("on" if i % 2 == 0 else "off") for i, s in enumerate(sessions)}
            blocks: dict[str, list[float]] = {"on": [], "off": []}
            first: dict[str, list[float]] = {"on": [], "off": []}
            async with contextlib.AsyncExitStack() as stack:
                http = None
                if args.http:  # the service behind its HTTP API on loopback, called as a client would
                    server = await stack.enter_async_context(LoopbackServer(create_app(service=service, host="127.0.0.1")))
                    http = await stack.enter_async_context(httpx.AsyncClient(base_url=server.base_url, timeout=30))

                async def record(session_id: str, user: str, role: str, text: str) -> str:
                    message_id = f"loop-{uuid.uuid4().hex}"
                    if http is None:
                        await service.record_message(session_id, MessageIn(
                            agent_id=lb.AGENT, user_id=user, role=role, content=text, message_id=message_id))
                    else:
                        (await http.post(f"/v1/sessions/{session_id}/messages", json={
                            "agent_id": lb.AGENT, "user_id": user, "role": role, "content": text,
                            "message_id": message_id})).raise_for_status()
                    return message_id

                async def block_of(session_id: str, user: str) -> str:
                    if http is None:
                        return (await service.assemble_memory_context(lb.AGENT, user, session_id, budget=BUDGET)).xml
                    got = await http.get("/v1/context", params={"agent_id": lb.AGENT, "user_id": user,
                                                                 "session_id": session_id, "budget": BUDGET})
                    got.raise_for_status()
                    return got.json()["xml"]

                for turn in range(args.turns):
                    for session_id in sessions:
                        mode, user = modes[session_id], speakers[session_id]
                        fresh.embedder = embedder if mode == "on" else None  # off: as CONTEXT_EMBED_ON_RECORD=false
                        fresh.recorded = counted[mode]
                        text = " ".join(rng.sample(words, 8)) + "?"
                        message_id = await record(session_id, user, "user", text)
                        t = time.perf_counter()
                        xml = await block_of(session_id, user)
                        (first if turn == 0 else blocks)[mode].append(time.perf_counter() - t)
                        check(xml, text, message_id, errors)
                        await asyncio.sleep(args.think)
                        await record(session_id, user, "assistant", "Noted: " + text)
            fresh.embedder, fresh.recorded = embedder, recorded
    results = {
        "size": args.size, "sessions": args.sessions, "turns": args.turns, "think_s": args.think,
        "fill": {k: filled[k] for k in ("messages", "seconds", "messages_per_s")},
        "modes": {mode: {"block": summarize_ms(blocks[mode]), "first_turn": summarize_ms(first[mode]),
                         "embedded_as_recorded": started_runs[mode],
                         "user_messages": len(first[mode]) + len(blocks[mode])} for mode in ("on", "off")},
        "errors": errors,
    }
    on, off = results["modes"]["on"]["block"], results["modes"]["off"]["block"]
    results["ratio_on_over_off"] = on["median_ms"] / off["median_ms"] if off.get("median_ms") else None
    return results


def check(xml: str, text: str, message_id: str, errors: list[str]) -> None:
    """Every block within its budget, parseable, and never showing its own question as relevant."""
    if len(xml) > BUDGET:
        errors.append(f"block of {len(xml)} characters over its budget {BUDGET}")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        errors.append(f"block does not parse: {exc}")
        return
    shown = ["".join(e.itertext()) for e in root.iter("RelevantMemories")]
    if any(text in s for s in shown):
        errors.append(f"block shows its own question {message_id} as a relevant memory")


def report(results: dict, console: Console) -> None:
    table = Table(title=f"the block without a query in a session loop: {results['size']:,} memories, "
                        f"{results['sessions']} sessions x {results['turns']} turns, think {results['think_s']} s")
    for column in ("embedding on record", "block median", "block p95", "first turn median",
                   "user messages embedded as recorded"):
        table.add_column(column, justify="right")
    for mode in ("on", "off"):
        m = results["modes"][mode]
        table.add_row(mode + (" (default)" if mode == "on" else " (baseline)"), f"{m['block']['median_ms']:.1f}",
                      f"{m['block']['p95_ms']:.1f}", f"{m['first_turn']['median_ms']:.1f}",
                      f"{m['embedded_as_recorded']} of {m['user_messages']}")
    console.print(table)
    console.print(f"  ratio of the medians, on / off: {results['ratio_on_over_off']:.2f} (ms per block; the first "
                  "turn of each session, before any block was asked, is left out of the median and p95)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=5000, help="messages in the store (default 5,000)")
    parser.add_argument("--sessions", type=int, default=30, help="sessions running the loop (default 30)")
    parser.add_argument("--turns", type=int, default=6, help="turns per session (default 6)")
    parser.add_argument("--think", type=float, default=0.05, help="seconds of the model's turn (default 0.05)")
    parser.add_argument("--http", action="store_true",
                        help="the loop through the HTTP API on loopback (httpx to uvicorn), as a client runs it")
    parser.add_argument("--worker-apart", action="store_true",
                        help="no worker in the timed process (as when workers run as their own processes; then "
                             "nothing embeds the loop's messages but the block and the embedding on record)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console = Console(width=140)
    header = print_machine(console, "session_loop_bench")
    started = time.perf_counter()
    results = asyncio.run(run(args, console))
    report(results, console)
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; took {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"header": header, **results}, indent=2))
        console.print(f"results written to {args.json}")
    for error in results["errors"]:
        console.print(f"[red]FAIL[/red] {error}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
