"""Benchmark: is a session's first message slower than its tenth?

With one FalkorDB graph per namespace (the first layout), a new session's first message
created a graph and its indexes (about 13 statements behind a process-wide lock). With one
graph per agent, a new session is a new property value. This records 10 messages in each
of N new sessions of an agent that already exists, sessions interleaved, and reports the
median and p95 latency of the 1st, 2nd and 10th message of a session; ratio = 1st / 10th.

    .venv/bin/python bench/first_message_bench.py [--sessions 100]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_machine  # noqa: E402
from rich.console import Console  # noqa: E402

from memory_service.config import Settings  # noqa: E402
from memory_service.domain.models import MessageIn  # noqa: E402
from memory_service.runtime import open_service  # noqa: E402


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


async def run(sessions: int) -> dict[int, list[float]]:
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None,
                        memory_formation_msg_interval=10**6, memory_formation_token_interval=10**9)
    timings: dict[int, list[float]] = {1: [], 2: [], 10: []}
    with tempfile.TemporaryDirectory(prefix="first-message-") as tmp:
        async with open_service(settings, data_dir=Path(tmp), run_worker=False) as service:
            await service.record_message("warm-up", MessageIn(agent_id="a", user_id="u", role="user", content="hello"))
            for position in range(1, 11):
                for s in range(sessions):
                    message = MessageIn(agent_id="a", user_id=f"u{s % 7}", role="user",
                                        content=f"message {position} of session {s}: the ferry leaves at {s % 12} pm")
                    start = time.perf_counter()
                    await service.record_message(f"s{s}", message)
                    if position in timings:
                        timings[position].append((time.perf_counter() - start) * 1000)
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    console = Console()
    print_machine(console, "first_message_bench")
    timings = asyncio.run(run(args.sessions))
    tenth = statistics.median(timings[10])
    for position, values in timings.items():
        console.print(f"message {position:2d} of a session: median {statistics.median(values):6.2f} ms, "
                      f"p95 {p95(values):6.2f} ms, ratio to the 10th {statistics.median(values) / tenth:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
