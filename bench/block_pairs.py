"""Benchmark: the memory block without a query, uncached, on a kept store; two checkouts compared.

The latency bench (``latency_bench.py``) times 60 blocks in one run, on a host whose speed
moves by half within the hour: two runs of the same code differ more than most changes to
the block. This bench compares checkouts the way that noise allows. It starts the embedded
FalkorDB of a store the latency bench kept (``--store DIR``, its ``n<N>`` directory) once,
and runs one process per checkout against it (``--code NAME=DIR``; each imports that
checkout's ``memory_service``, and this file's corpus and checks), one after the other, ``--repeat`` times, the order reversed every other repetition
(the second process of a pair ran faster in this host's runs, whichever code it ran).

Each process asks for blocks without a query for ``--pairs`` distinct (speaker, session)
pairs of the corpus, each once (the block cache is purged first, so every block is
uncached), and times each block's wall time and its process CPU time. Every block is also
asked, right after, without its search (``Recall(top_k=0)``: every other read runs),
uncached too: the baseline, in the same process, on the same data.

Per checkout: the medians over its repetitions of the block's p50 and p95 (ms) and its CPU
p50, the same without the search, and the ratio of each checkout's medians to the first
one's. Speed is reported, never asserted. Every block is checked (within its budget and
parseable; never served from the cache): a violation prints FAIL and exits 1.

    .venv/bin/python bench/latency_bench.py --sizes 100000 --store /tmp/lb-store ...  # fills it once
    .venv/bin/python bench/block_pairs.py --store /tmp/lb-store/n100000 --size 100000 \\
        [--code before=/path/to/other/checkout] [--code after=.] [--pairs 100] [--repeat 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET = 4000


async def child(args: argparse.Namespace) -> dict:
    """One process's blocks, by the code of the checkout ``--root`` (on PYTHONPATH; this
    file's corpus and checks)."""
    import memory_service  # first: latency_bench puts this checkout's root ahead on sys.path
    from memory_service.domain.models import Recall
    from memory_service.runtime import open_service

    if not Path(memory_service.__file__).resolve().is_relative_to(Path(args.root).resolve()):
        raise SystemExit(f"memory_service imported from {memory_service.__file__}, not from {args.root}")
    import latency_bench as lb

    pairs = lb.speaker_pairs(lb.make_corpus(args.size), args.pairs, random.Random(args.seed))
    settings = lb.service_settings(falkordb_url=args.url)
    errors: list[str] = []
    timed: dict[str, dict[str, list[float]]] = {"block": {"wall": [], "cpu": []}, "no_search": {"wall": [], "cpu": []}}
    async with open_service(settings, run_worker=False) as service:
        await service.state.cache.purge_agent(lb.AGENT)
        for user, sid in pairs[:5]:  # warm-up: first-call costs, on pairs asked again later
            await service.assemble_memory_context(lb.AGENT, user, sid, budget=BUDGET)
        await service.state.cache.purge_agent(lb.AGENT)
        for user, sid in pairs:
            for case, extra in (("block", {}), ("no_search", {"recall": Recall(top_k=0)})):
                cpu, wall = time.process_time(), time.perf_counter()
                res = await service.assemble_memory_context(lb.AGENT, user, sid, budget=BUDGET, **extra)
                timed[case]["wall"].append(time.perf_counter() - wall)
                timed[case]["cpu"].append(time.process_time() - cpu)
                lb.check_block(res, BUDGET, f"{case} {user}/{sid}", errors)
                if res.source == "cache":
                    errors.append(f"{case} {user}/{sid} was served from the cache")
                await asyncio.sleep(0.005)  # the block's writes after its answer, off the next one's timing
    return {"timed": timed, "errors": errors}


def summary(times: dict[str, list[float]]) -> dict:
    from common import p95

    return {"p50_ms": statistics.median(times["wall"]) * 1e3, "p95_ms": p95(times["wall"]) * 1e3,
            "cpu_p50_ms": statistics.median(times["cpu"]) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, help="a store the latency bench kept (its n<N> directory)")
    parser.add_argument("--size", type=int, default=100_000, help="the store's size (regenerates its corpus' pairs)")
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="a checkout to time (repeatable; default: this one)")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=4, help="processes per checkout")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return 0
    if args.store is None or not (args.store / "filled.json").exists():
        parser.error("--store must be a store the latency bench filled (a directory holding filled.json)")

    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from common import print_machine
    from rich.console import Console
    from rich.table import Table

    from memory_service.backends.embedded import EmbeddedFalkorDB

    console = Console()
    header = print_machine(console, "block_pairs")
    codes = dict(c.split("=", 1) for c in args.code) if args.code else {"this": str(HERE.parent)}
    names = list(codes)
    console.print(f"  starting the store in {args.store} (a large one takes minutes to load its indexes) ...")
    server = EmbeddedFalkorDB(args.store)
    url = server.start(timeout=900)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    errors: list[str] = []
    try:
        for rep in range(args.repeat):
            for name in names if rep % 2 == 0 else reversed(names):
                root = Path(codes[name]).resolve()
                env = {**os.environ, "PYTHONPATH": str(root)}
                done = subprocess.run([sys.executable, __file__, "--child", "--root", str(root), "--url", url,
                                       "--size", str(args.size), "--pairs", str(args.pairs), "--seed", str(rep + 1)],
                                      cwd=root, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    console.print(done.stderr[-3000:])
                    errors.append(f"{name}, repetition {rep + 1}: the process failed")
                    continue
                out = json.loads(done.stdout.strip().splitlines()[-1])
                errors += [f"{name}: {e}" for e in out["errors"]]
                run = {case: summary(times) for case, times in out["timed"].items()}
                runs[name].append(run)
                console.print(f"  {name} #{rep + 1}: block {run['block']['p50_ms']:.1f} / {run['block']['p95_ms']:.1f} ms "
                              f"(CPU {run['block']['cpu_p50_ms']:.1f}), without its search "
                              f"{run['no_search']['p50_ms']:.1f} / {run['no_search']['p95_ms']:.1f} ms "
                              f"(CPU {run['no_search']['cpu_p50_ms']:.1f})")
    finally:
        server.stop()

    def med(name: str, case: str, figure: str) -> float:
        return statistics.median(r[case][figure] for r in runs[name]) if runs[name] else float("nan")

    table = Table(title=f"{args.pairs} uncached blocks without a query per process, {args.repeat} processes per "
                        "checkout; medians over the processes (ms)")
    for column in ("checkout", "block p50", "block p95", "block CPU p50", "no search p50", "no search CPU p50",
                   f"p50 / {names[0]}'s"):
        table.add_column(column, justify="left" if column == "checkout" else "right")
    for name in names:
        table.add_row(name, *(f"{med(name, c, f):.1f}" for c, f in (("block", "p50_ms"), ("block", "p95_ms"),
                      ("block", "cpu_p50_ms"), ("no_search", "p50_ms"), ("no_search", "cpu_p50_ms"))),
                      f"{med(name, 'block', 'p50_ms') / med(names[0], 'block', 'p50_ms'):.2f}")
    console.print(table)
    console.print(f"load average at end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "store": str(args.store), "size": args.size,
                                         "pairs": args.pairs, "codes": codes, "runs": runs, "errors": errors}, indent=1))
    for e in errors:
        console.print(f"[red]FAIL[/red] {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
