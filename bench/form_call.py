"""Benchmark: one `POST /v1/sessions/{id}/form?wait=true` on LongMemEval-sized windows, and
where a window's time goes.

A host that forms a session as it ends waits for this call. The bench records windows of
real LongMemEval-S dev turns (about 1,000 characters a user turn, several thousand an
assistant's) through the batch route of a real loopback server (embedded FalkorDB, the
default local embedder and the offline extractor, the worker in the process), then times
the form call, one window at a time:

- ``after_embedding``: the form call once the worker has embedded the window's messages
  (the call's own work: extraction, phrasing, resolution, graph writes, the embedding of
  what it forms);
- ``right_after_record``: the form call right after the batch is acknowledged, as a host
  that records a session's end and forms it at once does (the messages' own embedding
  runs beside it).

It also reports how long a window's messages take to be embedded after the batch's answer
(the embedding job's lag, in the ``after_embedding`` case).

With ``--profile`` the ``after_embedding`` calls run under cProfile (the whole process: the
API, the worker and the client share one event loop here) and the report groups the
cumulative time of the formation's steps by function (``--profile-top`` rows).

    .venv/bin/python bench/form_call.py ../shared/bench/longmemeval_s_dev.json.gz --windows 20 --turns 20
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from common import print_machine  # noqa: E402
from longmemeval import USER, LmeQuestion, load, parts, wait_embedded  # noqa: E402
from rich.console import Console  # noqa: E402


def windows_of(questions: list[LmeQuestion], count: int, turns: int) -> list[list]:
    """``count`` windows of ``turns`` consecutive turns each, from distinct haystack sessions
    that have that many (in the file's order: the same windows every run)."""
    out: list[list] = []
    for q in questions:
        for session in q.sessions:
            if len(session.turns) >= turns:
                out.append([session, q])
                if len(out) == count:
                    return out
    return out


def items_of(session, sid: str, turns: int, max_chars: int) -> list[dict]:
    items = []
    for i, turn in enumerate(session.turns[:turns]):
        at = (session.date + timedelta(seconds=i)).isoformat()
        for n, piece in enumerate(parts(turn.text, max_chars), start=1):
            items.append({"session_id": sid, "user_id": USER, "role": turn.speaker, "content": piece,
                          "message_id": f"{turn.dia_id}~{n}", "created_at": at})
    return items


def ms_summary(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(values) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, n {len(values)}"


async def run(path: Path, count: int, turns: int, profile: bool, top: int, console: Console) -> int:
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None,
                        # Only the form call forms: no gate opens while a window is recorded.
                        memory_formation_msg_interval=1_000_000, memory_formation_token_interval=1_000_000_000)
    questions, _ = load(path, settings.max_message_chars)
    chosen = windows_of(questions, 2 * count, turns)
    if len(chosen) < 2 * count:
        console.print(f"only {len(chosen)} sessions have {turns} turns; asked for {2 * count}")
        return 1
    chars = [sum(len(t.text) for t in s.turns[:turns]) for s, _ in chosen]
    console.print(f"windows: {2 * count} of {turns} turns, {statistics.median(chars):.0f} characters at the median "
                  f"(extractor {settings.extractor}, embedder {settings.embedder})")
    timings: dict[str, list[float]] = {"after_embedding": [], "right_after_record": []}
    embedding: list[float] = []  # from the batch's answer until its messages are embedded (after_embedding)
    profiler = cProfile.Profile() if profile else None
    with tempfile.TemporaryDirectory(prefix="form-call-") as tmp:
        app = create_app(settings, data_dir=Path(tmp), run_worker=True, host="127.0.0.1")
        server = LoopbackServer(app)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
                for n, (session, q) in enumerate(chosen):
                    case = "after_embedding" if n % 2 == 0 else "right_after_record"
                    agent, sid = f"fc{n}", f"fc{n}-s"
                    r = await http.post(f"/v1/agents/{agent}/messages/batch",
                                        json={"messages": items_of(session, sid, turns, settings.max_message_chars)})
                    r.raise_for_status()
                    if case == "after_embedding":
                        embedding.append(await wait_embedded(app.state.service, agent))
                        if profiler is not None:
                            profiler.enable()
                    start = time.perf_counter()
                    r = await http.post(f"/v1/sessions/{sid}/form", params={"wait": "true"})
                    timings[case].append(time.perf_counter() - start)
                    if profiler is not None:
                        profiler.disable()
                    if r.status_code != 200:
                        console.print(f"{sid}: form answered {r.status_code}: {r.text[:300]}")
                        return 1
                    await wait_embedded(app.state.service, agent)  # the next window starts on a quiet worker
        finally:
            await server.stop()
    for case, values in timings.items():
        console.print(f"form?wait=true, {case}: {ms_summary(values)}")
    console.print(f"a window's messages embedded after the batch's answer: {ms_summary(embedding)}")
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(r"memory_service", top)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
        print(out.getvalue())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="LongMemEval-S-format file (the dev half in ../shared/bench/)")
    parser.add_argument("--windows", type=int, default=10, help="windows timed in each case (default 10)")
    parser.add_argument("--turns", type=int, default=20, help="turns in a window (default 20)")
    parser.add_argument("--profile", action="store_true", help="cProfile the after_embedding calls")
    parser.add_argument("--profile-top", type=int, default=40, help="rows of each profile table")
    args = parser.parse_args(argv)
    console = Console()
    print_machine(console, "form_call.py")
    return asyncio.run(run(args.path, args.windows, args.turns, args.profile, args.profile_top, console))


if __name__ == "__main__":
    raise SystemExit(main())
