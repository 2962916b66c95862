"""The browse API's lists, deep pages against the first: does listing the 100,000th memory
cost what listing the first does?

Fills an embedded FalkorDB with N memories of one agent (default 100,000, one every 10
seconds of valid_at, spread over 50 users' namespaces) through the graph backend's own
write, and the agent's session index in Redis with N sessions; then times one page (50)
of each list at several depths: the first page, and the pages after the 1,000th, the
N/2-th and the (N-100)-th item, from a cursor as the previous page left it. Beside them,
the query a naive list would run (ORDER BY valid_at DESC LIMIT 50 over the agent's
memories: FalkorDB sorts every row it matches before the limit) as the baseline.

Correctness (exit 1 when it fails): each timed page is exactly the 50 memories that follow
its cursor in (valid_at, id) order, newest first, by the fill's own numbering.

    .venv/bin/python bench/browse_bench.py                 # 100k memories, 20 samples per case
    .venv/bin/python bench/browse_bench.py --memories 20000 --repeat 10 --json /tmp/browse.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import print_machine, summarize_ms  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memory_service.backends.base import MemoryListing  # noqa: E402
from memory_service.backends.embedded import EmbeddedFalkorDB  # noqa: E402
from memory_service.backends.graph import LABEL, GraphBackend  # noqa: E402
from memory_service.config import Settings  # noqa: E402
from memory_service.domain.models import Memory, MemoryKind, Provenance  # noqa: E402
from memory_service.domain.namespaces import Namespace  # noqa: E402
from memory_service.state import keyspace  # noqa: E402
from memory_service.state.store import StateStore  # noqa: E402

AGENT = "bench"
USERS = 50
PAGE = 50
T0 = datetime(2025, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=10)


def memory(i: int) -> Memory:
    user = f"u{i % USERS:02d}"
    return Memory(id=f"m{i:08d}", kind=MemoryKind.FACT if i % 3 else MemoryKind.OBSERVATION,
                  namespace=str(Namespace.user(AGENT, user)), content=f"Memory number {i} of {user}.",
                  valid_at=T0 + i * STEP, metadata=Provenance(agent_id=AGENT, user_id=user, sequence=i))


async def fill(backend: GraphBackend, state: StateStore, n: int, console: Console) -> float:
    started = time.perf_counter()
    for start in range(0, n, 2000):
        await backend.write([memory(i) for i in range(start, min(n, start + 2000))])
    order = keyspace.agent_session_order(AGENT)
    for start in range(0, n, 10_000):
        await state.redis.zadd(order, {f"s{i:08d}": i + 1 for i in range(start, min(n, start + 10_000))})
    seconds = time.perf_counter() - started
    console.print(f"filled {n:,} memories and {n:,} sessions in {seconds:.1f} s")
    return seconds


async def timed(repeat: int, call: Any) -> tuple[dict[str, Any], Any]:
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await call()
        samples.append(time.perf_counter() - started)
    return summarize_ms(samples), result


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n = args.memories
    console = Console()
    header = print_machine(console, "browse_bench")
    errors: list[str] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedFalkorDB(Path(data))
        url = server.start()
        settings = Settings(_env_file=None, falkordb_url=url, redis_url=url, embedder="hash", embedding_dimension=64)
        backend = GraphBackend(url, settings, embedding_dimension=64)
        await backend.start()
        state = StateStore.from_url(url, settings)
        try:
            fill_seconds = await fill(backend, state, n, console)
            newest_first = list(range(n - 1, -1, -1))
            depths = [0, 1_000, n // 2, n - 100]
            for depth in depths:
                after = None if depth == 0 else ((T0 + newest_first[depth - 1] * STEP).timestamp(),
                                                 f"m{newest_first[depth - 1]:08d}")
                listing = MemoryListing(after=after, limit=PAGE)
                stats, page = await timed(args.repeat, lambda: backend.list_memories(AGENT, listing))
                expected = [f"m{i:08d}" for i in newest_first[depth : depth + PAGE]]
                if [m.id for m in page.memories] != expected:
                    errors.append(f"memories page at depth {depth}: not the {PAGE} that follow the cursor")
                rows.append({"list": "memories (agent)", "depth": depth, **stats})
            # One user's namespace: 1 in USERS memories, so a window holds fewer.
            user = Namespace.user(AGENT, "u07")
            theirs = [i for i in newest_first if i % USERS == 7]
            for depth in (0, len(theirs) // 2, len(theirs) - 60):
                after = None if depth == 0 else ((T0 + theirs[depth - 1] * STEP).timestamp(), f"m{theirs[depth - 1]:08d}")
                listing = MemoryListing(namespaces=[user], after=after, limit=PAGE)
                stats, page = await timed(args.repeat, lambda: backend.list_memories(AGENT, listing))
                if [m.id for m in page.memories] != [f"m{i:08d}" for i in theirs[depth : depth + PAGE]]:
                    errors.append(f"user page at depth {depth}: not the {PAGE} that follow the cursor")
                rows.append({"list": "memories (one user)", "depth": depth, **stats})
            for depth in depths:
                before = None if depth == 0 else n - depth + 1
                stats, sessions = await timed(args.repeat, lambda: state.sessions_before(AGENT, before, PAGE))
                if [s for s, _ in sessions] != [f"s{i:08d}" for i in newest_first[depth : depth + PAGE]]:
                    errors.append(f"sessions page at depth {depth}: wrong sessions")
                rows.append({"list": "sessions", "depth": depth, **stats})
            naive = (f"MATCH (n:{LABEL}) WHERE n.kind IS NOT NULL WITH n ORDER BY n.ts DESC, n.uuid DESC "
                     "LIMIT $limit RETURN n.uuid")
            stats, _ = await timed(args.repeat, lambda: backend._read(AGENT, naive, limit=PAGE))
            rows.append({"list": "baseline: ORDER BY ts LIMIT 50", "depth": 0, **stats})
        finally:
            await state.close()
            await backend.close()
            server.stop()
    table = Table(title=f"one page of {PAGE}, {n:,} memories and sessions, {args.repeat} samples each")
    for column in ("list", "depth", "median ms", "p95 ms"):
        table.add_column(column, justify="left" if column == "list" else "right")
    for row in rows:
        table.add_row(row["list"], f"{row['depth']:,}", f"{row['median_ms']:.2f}", f"{row['p95_ms']:.2f}")
    console.print(table)
    for error in errors:
        console.print(f"[red]{error}[/red]")
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "memories": n, "page": PAGE, "repeat": args.repeat,
                                         "fill_seconds": fill_seconds, "rows": rows, "errors": errors}, indent=2))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
