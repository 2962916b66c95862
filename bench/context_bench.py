"""Benchmark: rendering the memory context (``memory_service.recall.render.render_context``).

Measures ``render_context`` on three input sizes at three budgets and compares each case
with a baseline run in the same process: ``naive_render``, below, which builds the same
element tree with ``xml.sax.saxutils`` escaping and no budget logic (the reference
system's unbounded behaviour). Reports median and p95 per call, the ratio of medians
(budgeted / naive), the output size against the budget and the items kept and dropped.

Speed is reported, never asserted. Correctness is checked on every run: every timed call
must fit its budget, the output must parse and account for every item, and with nothing
dropped it must equal the baseline's output byte for byte. Any violation exits 1.

    .venv/bin/python bench/context_bench.py [--repeat N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape, quoteattr

from common import calls_per_sample, print_machine, sample
from rich.console import Console
from rich.table import Table

from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.recall.render import (
    ContextInputs,
    RelevantItem,
    ShardContext,
    UserContext,
    age,
    memory_date,
    render_context,
)

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
BUDGETS = (2_000, 6_000, 1_000_000)
MIN_SAMPLE_SECONDS = 0.002  # a sample loops the call until it lasts at least this long
QUICK_REPEAT = 10


# --- inputs -------------------------------------------------------------------------------

_ids = iter(range(10**9))


def _mem(kind: str, content: str, namespace: str, ago: timedelta = timedelta()) -> Memory:
    return Memory(id=f"m{next(_ids)}", kind=MemoryKind(kind), namespace=namespace, content=content,
                  metadata=Provenance(agent_id="a"), valid_at=NOW - ago)


def make_inputs(shards: int, facts: int, suggestions: int, users: int, directives: int,
                episodes: int, relevant: int) -> ContextInputs:
    """Inputs shaped like the ones tests/test_context_render.py used for its old timing test."""
    return ContextInputs(
        shards=[ShardContext(f"s{k}", f"Shard {k}",
                             facts=[_mem("fact", f"fact {k} {i} " * 3, f"shard:a:s{k}") for i in range(facts)],
                             suggestions=[_mem("suggestion", f"suggestion {i} " * 3, f"shard:a:s{k}")
                                          for i in range(suggestions)],
                             consolidated="summary " * 50)
                for k in range(shards)],
        users=[UserContext(f"u{k}", directives=[_mem("directive", f"directive {i}", f"user:a:u{k}")
                                                for i in range(directives)])
               for k in range(users)],
        episodes=[_mem("episode", f"episode {i} " * 5, "session:s1") for i in range(episodes)],
        relevant=[RelevantItem.whole(m) for m in (_mem("fact", f"relevant {i}", "shard:a:t", timedelta(hours=i)) for i in range(relevant))],
    )


SIZES: dict[str, dict[str, int]] = {
    "small": dict(shards=1, facts=3, suggestions=2, users=1, directives=2, episodes=3, relevant=2),
    "medium": dict(shards=2, facts=20, suggestions=20, users=2, directives=10, episodes=20, relevant=10),
    "large": dict(shards=3, facts=100, suggestions=100, users=3, directives=50, episodes=100, relevant=50),
}


def item_count(inputs: ContextInputs) -> int:
    return (sum(len(s.facts) + len(s.suggestions) + bool(s.consolidated and s.consolidated.strip())
                for s in inputs.shards)
            + sum(len(u.directives) + bool(u.consolidated and u.consolidated.strip()) for u in inputs.users)
            + len(inputs.episodes) + len(inputs.relevant))


# --- baseline -----------------------------------------------------------------------------

def _a(value: str) -> str:
    return quoteattr(value, {'"': "&quot;"})


def _t(value: str) -> str:
    return escape(value, {"\r": "&#13;"})


def naive_render(inputs: ContextInputs, now: datetime) -> str:
    """The same element tree as render_context, everything in, no budget and no cleaning.

    Empty sections and containers are left out as render_context does, so that with
    nothing over the budget both have the same sections (render_context orders items by
    priority and shows each thing once, so its items and their order differ).
    """
    out: list[str] = []
    if inputs.shards and any(s.facts or s.suggestions or (s.consolidated or "").strip() for s in inputs.shards):
        out.append("  <CollectiveMemory>\n")
        for s in inputs.shards:
            consolidated = (s.consolidated or "").strip() and s.consolidated
            if not (s.facts or s.suggestions or consolidated):
                continue
            out.append(f"    <MemoryShard name={_a(s.name)}>\n")
            if consolidated:
                out.append(f"      <ConsolidatedMemory>{_t(consolidated)}</ConsolidatedMemory>\n")
            if s.facts:
                out.append("      <Facts>\n")
                out.extend(f"        <Fact>{_t(m.content)}</Fact>\n" for m in s.facts)
                out.append("      </Facts>\n")
            if s.suggestions:
                out.append("      <RecentSuggestions>\n")
                out.extend(f"        <Suggestion>{_t(m.content)}</Suggestion>\n" for m in s.suggestions)
                out.append("      </RecentSuggestions>\n")
            out.append("    </MemoryShard>\n")
        out.append("  </CollectiveMemory>\n")
    if any(u.directives or (u.consolidated or "").strip() for u in inputs.users):
        out.append("  <UserMemory>\n")
        for u in inputs.users:
            consolidated = (u.consolidated or "").strip() and u.consolidated
            if not (u.directives or consolidated):
                continue
            out.append(f"    <User id={_a(u.user_id)}>\n")
            if consolidated:
                out.append(f"      <ConsolidatedMemory>{_t(consolidated)}</ConsolidatedMemory>\n")
            if u.directives:
                out.append("      <Directives>\n")
                out.extend(f"        <Directive>{_t(m.content)}</Directive>\n" for m in u.directives)
                out.append("      </Directives>\n")
            out.append("    </User>\n")
        out.append("  </UserMemory>\n")
    if inputs.episodes:
        out.append("  <CurrentConversationContext>\n")
        out.extend(f"    <Episode>{_t(m.content)}</Episode>\n" for m in inputs.episodes)
        out.append("  </CurrentConversationContext>\n")
    if inputs.relevant:
        out.append("  <RelevantMemories>\n")
        out.extend(f"    <Memory kind={_a(r.kind.value)} date={_a(memory_date(r.valid_at))}"
                   f" age={_a(age(r.valid_at, now))}>{_t(r.text)}</Memory>\n"
                   for r in inputs.relevant)
        out.append("  </RelevantMemories>\n")
    if not out:
        return "<MemoryContext/>"
    return "<MemoryContext>\n" + "".join(out) + "</MemoryContext>"


# --- measuring ----------------------------------------------------------------------------

@dataclass
class Stats:
    median_ms: float
    p95_ms: float
    min_ms: float
    samples: int
    calls_per_sample: int

    @classmethod
    def of(cls, seconds: list[float], calls: int) -> Stats:
        ordered = sorted(seconds)
        p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank
        return cls(statistics.median(ordered) * 1e3, p95 * 1e3, ordered[0] * 1e3, len(ordered), calls)


def check(size: str, budget: int, inputs: ContextInputs, total: int, naive_xml: str) -> list[str]:
    """Correctness of one case; the list of what is wrong."""
    errors = []
    rendered = render_context(inputs, budget, NOW)
    where = f"{size} @ {budget}"
    if len(rendered.xml) != rendered.chars or rendered.chars > budget:
        errors.append(f"{where}: {len(rendered.xml)} chars (reported {rendered.chars}) for a budget of {budget}")
    try:
        ET.fromstring(rendered.xml)
    except ET.ParseError as exc:
        errors.append(f"{where}: output does not parse: {exc}")
    kept, duplicates = sum(rendered.sections.values()), rendered.left_out.get("duplicate", 0)
    if kept + rendered.dropped + duplicates != total:
        errors.append(f"{where}: kept {kept} + over budget {rendered.dropped} + duplicates {duplicates} != {total} items")
    # The block orders by priority and shows each thing once (an item another shows whole is
    # left out, its form named in ``also``), so it is not the naive tree; with nothing over
    # the budget it has the naive tree's sections.
    if rendered.dropped == 0 and sections_of(rendered.xml) != sections_of(naive_xml):
        errors.append(f"{where}: nothing over budget, yet sections {sections_of(rendered.xml)} are not the "
                      f"baseline's {sections_of(naive_xml)}")
    return errors


def sections_of(xml: str) -> list[str]:
    return sorted(child.tag for child in ET.fromstring(xml))


def run(repeat: int, min_sample_seconds: float, console: Console) -> tuple[list[dict], list[str]]:
    cases, errors = [], []
    for size, shape in SIZES.items():
        inputs = make_inputs(**shape)
        total = item_count(inputs)
        naive_xml = naive_render(inputs, NOW)
        try:
            ET.fromstring(naive_xml)
        except ET.ParseError as exc:
            errors.append(f"{size}: baseline output does not parse: {exc}")
        for budget in BUDGETS:
            if console.is_terminal:
                console.print(f"  {size:<6} budget {budget:>9,} ...", end="\r")
            errors += check(size, budget, inputs, total, naive_xml)
            over_budget = 0

            def budgeted() -> None:
                nonlocal over_budget
                if render_context(inputs, budget, NOW).chars > budget:
                    over_budget += 1

            def naive() -> None:
                naive_render(inputs, NOW)

            calls = {name: calls_per_sample(fn, min_sample_seconds)
                     for name, fn in (("budgeted", budgeted), ("naive", naive))}  # also warms up
            times: dict[str, list[float]] = {"budgeted": [], "naive": []}
            gc.collect()
            for i in range(repeat):
                # Interleaved, and alternating which goes first, so drift on a shared
                # machine hits both alike.
                order = (("budgeted", budgeted), ("naive", naive))
                for name, fn in order if i % 2 == 0 else order[::-1]:
                    times[name].append(sample(fn, calls[name]))
            if over_budget:
                errors.append(f"{size} @ {budget}: {over_budget} calls went over the budget while timed")
            rendered = render_context(inputs, budget, NOW)
            b, n = Stats.of(times["budgeted"], calls["budgeted"]), Stats.of(times["naive"], calls["naive"])
            cases.append({
                "size": size, "shape": shape, "items": total, "budget": budget,
                "chars": rendered.chars, "naive_chars": len(naive_xml),
                "kept": sum(rendered.sections.values()), "dropped": rendered.dropped,
                "sections": rendered.sections,
                "budgeted": vars(b), "naive": vars(n), "ratio": b.median_ms / n.median_ms,
            })
    return cases, errors


# --- reporting ----------------------------------------------------------------------------

def table(cases: list[dict], repeat: int) -> Table:
    t = Table(title=f"render_context vs naive baseline (ms per call, {repeat} samples each)")
    for column in ("size", "items", "budget", "chars", "kept", "dropped",
                   "render median", "render p95", "naive median", "naive p95", "ratio"):
        t.add_column(column, justify="left" if column == "size" else "right")
    for c in cases:
        b, n = c["budgeted"], c["naive"]
        t.add_row(c["size"], str(c["items"]), f"{c['budget']:,}", f"{c['chars']:,}", str(c["kept"]),
                  str(c["dropped"]), f"{b['median_ms']:.3f}", f"{b['p95_ms']:.3f}",
                  f"{n['median_ms']:.3f}", f"{n['p95_ms']:.3f}", f"{c['ratio']:.1f}x")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50, help="timed samples per case and renderer (default 50)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK_REPEAT} samples of single calls (figures are rough)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    repeat = min(args.repeat, QUICK_REPEAT) if args.quick else args.repeat
    min_sample = 0.0 if args.quick else MIN_SAMPLE_SECONDS

    # Piped (make bench | tee, CI logs): wide enough for the table not to be cut.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    header = print_machine(console, "context_bench")
    started = time.perf_counter()
    cases, errors = run(repeat, min_sample, console)
    header["load_avg_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    if console.is_terminal:
        console.print(" " * 40, end="\r")
    console.print(table(cases, repeat))
    console.print(f"load average at end: {header['load_avg_1_5_15_at_end']}; "
                  f"took {time.perf_counter() - started:.1f} s. ratio = budgeted median / naive median.")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "context_bench", "machine": header,
            "settings": {"repeat": repeat, "quick": args.quick, "min_sample_seconds": min_sample,
                         "budgets": list(BUDGETS), "now": NOW.isoformat()},
            "cases": cases, "errors": errors,
        }, indent=2) + "\n")
        console.print(f"results written to {args.json}")

    for error in errors:
        console.print(f"[red]FAIL[/red] {error}")
    if errors:
        return 1
    console.print("correctness: every call fit its budget; outputs parse and account for every item.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
