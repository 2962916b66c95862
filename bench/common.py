"""What every benchmark here shares: the machine header each report starts with, timed
samples of a call, and the summaries of latencies (median, p95 by nearest rank).

Standard library and rich only, so that any script can import it without the retrieval
benchmarks' dependencies (bm25s, numpy: bench/baselines.py) or the rendering benchmark's
inputs (bench/context_bench.py), where these helpers lived before.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The machine and its load now: every report's header (and its JSON's)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "load_avg_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def print_machine(console: Console, bench: str) -> dict:
    """Print which machine this runs on, and its load; the header for the results."""
    header = machine()
    console.print(f"[bold]{bench}[/bold]  {header['date']}  {header['cpu']}, "
                  f"{header['cores']} cores ({header['usable_cores']} usable)  {header['python']}  "
                  f"{header['platform']}")
    console.print(f"load average at start: {header['load_avg_1_5_15']}  (shared machine: expect noise)")
    return header


def calls_per_sample(fn: Callable[[], object], min_seconds: float) -> int:
    """How many back-to-back calls make one sample last at least ``min_seconds``."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= min_seconds or calls >= 10_000:
            return calls
        calls *= 2


def sample(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


def summarize_ms(seconds: Sequence[float]) -> dict:
    """median, p95 (nearest rank), min, max in ms; empty -> counts only."""
    if not seconds:
        return {"n": 0}
    return {"n": len(seconds), "median_ms": statistics.median(seconds) * 1e3, "p95_ms": p95(seconds) * 1e3,
            "min_ms": min(seconds) * 1e3, "max_ms": max(seconds) * 1e3}
