"""Benchmark: search's graph settings compared on ONE formed copy of a LoCoMo-format file.

``bench/locomo.py`` forms a fresh store every run (about ten minutes on 2 cores), so
comparing settings with it costs a run per setting and mixes the machine's noise into the
comparison. Here the conversations are recorded and formed once, into ``--store DIR``
(kept: a later run on the same directory reuses it), then every variant (a set of
``Settings`` overrides, e.g. the graph signal's hops or the re-rank weights) runs the same
760 searches and memory blocks through the same HTTP routes as ``bench/locomo.py``, on the
same server, one after the other. Blocks are not cached (``CONTEXT_CACHE_TTL_SECONDS=0``),
so each variant assembles its own.

Reported per variant and per category: search recall@10 and evidence-in-context at each
budget (the same measures and code as ``bench/locomo.py``), and search latency.

    .venv/bin/python bench/graph_rank.py PATH --store DIR \\
        --variant 'one_hop={"search_graph_hops": 1}' --variant 'default={}' [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from baselines import load_locomo  # noqa: E402
from common import print_machine  # noqa: E402
from locomo import BenchError, check_formed, ingest, run_context, run_search  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

FORMED = "graph-rank-formed.json"  # written in the store's directory once every session is formed


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=JSON")
    try:
        overrides = json.loads(body or "{}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--variant {name}: not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise argparse.ArgumentTypeError(f"--variant {name}: expected a JSON object of Settings fields")
    return name, overrides


async def run(path: Path, store: Path, variants: list[tuple[str, dict[str, Any]]], budgets: list[int],
              limit_samples: int | None, console: Console) -> dict:
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.http.app import create_app

    samples = load_locomo(path, limit_samples)
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None,
                        context_cache_ttl_seconds=0)
    defaults = settings.model_dump()
    for name, overrides in variants:
        if unknown := set(overrides) - set(defaults):
            raise BenchError(f"variant {name}: no such settings {sorted(unknown)}")
    store.mkdir(parents=True, exist_ok=True)
    marker = store / FORMED
    out: dict[str, Any] = {"variants": {}}
    app = create_app(settings, data_dir=store, run_worker=True, host="127.0.0.1")
    server = LoopbackServer(app)
    await server.start()
    # The service runs on its own copy of the settings (open_service copies them): the
    # variants change that copy, which its retriever and block assembler read at each call.
    live = app.state.service.settings
    if live is not app.state.service.retriever.settings:
        raise BenchError("the retriever does not read the service's settings: variants would not apply")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
            if marker.exists():
                out["ingest"] = json.loads(marker.read_text())
                console.print(f"store {store}: formed already ({out['ingest'].get('messages')} messages)")
            else:
                console.print(f"store {store}: recording and forming {sum(len(s.turns) for s in samples)} turns ...")
                out["ingest"] = await ingest(http, samples, 5, console)
                if errors := await check_formed(http, samples):
                    raise BenchError(f"not every session was formed: {errors[:5]}")
                marker.write_text(json.dumps(out["ingest"]))
            for q in samples[0].questions[:20]:  # warm-up: the store's first reads after a restart
                await http.get("/v1/search", params={"agent_id": samples[0].sample_id, "query": q.question})
            for name, overrides in variants:
                for key, value in {**{k: defaults[k] for k, _ in _all_overrides(variants)}, **overrides}.items():
                    setattr(live, key, value)
                console.print(f"variant {name}: {overrides}")
                errors: list[str] = []
                started = time.perf_counter()
                search = await run_search(http, samples, errors, Counter())
                context = await run_context(http, samples, budgets, errors)
                out["variants"][name] = {"overrides": overrides, "search": search["summary"],
                                         "context": context["summary"], "errors": errors[:20],
                                         "seconds": time.perf_counter() - started,
                                         "per_question": {"search": search["per_question"],
                                                          "context": context["per_question"]}}
                console.print(table({name: out["variants"][name]}, budgets))
    finally:
        await server.stop()
    return out


def _all_overrides(variants: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    """Every setting some variant changes: each variant starts from the defaults of all of them."""
    return [(k, v) for _, overrides in variants for k, v in overrides.items()]


def table(variants: dict[str, dict], budgets: list[int]) -> Table:
    t = Table(title="Search recall@10 and evidence in context, per category (c1 multi-hop, c2 temporal, "
                    "c3 open-domain, c4 single-hop)")
    cols = ["variant", "R@10", *(f"c{c} R@10" for c in (1, 2, 3, 4))]
    for b in budgets:
        cols += [f"ev@{b}", *(f"c{c} ev@{b}" for c in (1, 2, 3, 4))]
    cols += ["search p50 ms", "search p95 ms", "context p95 ms"]
    for col in cols:
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name, v in variants.items():
        s, c = v["search"], v["context"]["text_rule"]
        row = [name, f"{s['r@10']:.3f}", *(f"{s[f'c{k}_r@10']:.3f}" for k in (1, 2, 3, 4))]
        for b in budgets:
            row += [f"{c[str(b)]['share']:.3f}", *(f"{c[str(b)][f'c{k}']:.3f}" for k in (1, 2, 3, 4))]
        ctx = v["context"]["latency_all"]
        row += [f"{s['latency']['median_ms']:.1f}", f"{s['latency']['p95_ms']:.1f}", f"{ctx['p95_ms']:.1f}"]
        t.add_row(*row)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file (e.g. locomo_dev.json)")
    parser.add_argument("--store", type=Path, required=True, help="the formed store's directory (made when new)")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        help="NAME=JSON of Settings overrides (repeatable; default: one variant, the defaults)")
    parser.add_argument("--budgets", default="4000", help="context budgets, comma-separated (chars)")
    parser.add_argument("--limit-samples", type=int, metavar="N")
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()})
    console = Console() if sys.stdout.isatty() else Console(width=200)
    header = print_machine(console, "graph_rank")
    try:
        out = asyncio.run(run(args.path, args.store, args.variant or [("defaults", {})], budgets,
                              args.limit_samples, console))
    except BenchError as exc:
        console.print(f"[red]FAIL[/red] {exc}")
        return 1
    console.print(table(out["variants"], budgets))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "graph_rank", "machine": header, "budgets": budgets, **out},
                                        indent=1, default=str) + "\n")
        console.print(f"results written to {args.json}")
    return 1 if any(v["errors"] for v in out["variants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
