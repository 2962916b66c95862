"""Re-render captured memory blocks with other packing constants, and score them.

The renderer (memory_service/recall/render.py) is pure: what it packs depends only on its
inputs, the budget and its module constants. ``Capture`` records the inputs of every block a
benchmark run asks for (bench/locomo.py and bench/longmemeval.py take ``--capture PATH``;
the service runs in the benchmark's process), keyed by budget and the query's words, and
each question's evidence beside them. This script then renders every captured block again
under each setting given and prints the shared protocol's context metrics per half, so a
packing constant can be tuned in seconds on one half and checked on the other, instead of
re-ingesting a benchmark per try. Search and formation are not re-run: only what the
renderer decides changes.

    .venv/bin/python bench/block_replay.py /tmp/lme.capture WHOLE_CHARS=400,800 BEST_WHOLE_SHARE=0,0.5
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evidence import context_metrics, grouped  # noqa: E402

from memory_service.recall import assembler, render  # noqa: E402

Key = tuple[int, tuple[str, ...]]


class Capture:
    """The inputs of every block rendered while it is active, by (budget, query words)."""

    def __init__(self) -> None:
        self.blocks: dict[Key, render.ContextInputs] = {}
        self.cases: list[dict[str, Any]] = []

    @contextmanager
    def active(self) -> Iterator[Capture]:
        original = assembler.render_context

        def recording(inputs: render.ContextInputs, budget: int, now: Any = None) -> render.RenderedContext:
            terms = inputs.relevant[0].terms if inputs.relevant else ()
            self.blocks[(budget, tuple(terms))] = inputs
            return original(inputs, budget, now)

        assembler.render_context = recording  # type: ignore[assignment]
        try:
            yield self
        finally:
            assembler.render_context = original  # type: ignore[assignment]

    def case(self, key: str, half: str, group: object, budget: int, terms: tuple[str, ...], evidence: list,
             found: list[str], ranked: list[str], answer: frozenset[str] | None) -> None:
        """A question's block at ``budget``, with what its metrics need."""
        inputs = self.blocks.get((budget, terms))
        if inputs is not None:
            self.cases.append({"key": key, "half": half, "group": group, "budget": budget, "inputs": inputs,
                               "evidence": evidence, "found": found, "ranked": ranked, "answer": answer})

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self.cases))


def replay(cases: list[dict[str, Any]], constants: dict[str, float]) -> dict[str, dict]:
    """Every case rendered under ``constants`` (render.py's), summarised per half and group."""
    saved = {name: getattr(render, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(render, name, type(saved[name])(value))
        by_key: dict[str, dict] = {}
        for c in cases:
            xml = render.render_context(c["inputs"], c["budget"]).xml
            rec = by_key.setdefault(c["key"], {"key": c["key"], "half": c["half"], "group": c["group"], "m": {}})
            rec["m"].update(context_metrics(xml, c["evidence"], c["found"], c["budget"], c["answer"], c["ranked"]))
        return grouped(list(by_key.values()))
    finally:
        for name, value in saved.items():
            setattr(render, name, value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", type=Path)
    parser.add_argument("settings", nargs="*", help="NAME=v1,v2 (render.py constants); every combination is run")
    parser.add_argument("--metrics", default="ctx@4000,ctx@16000,ans@4000,cut@4000,found_not_shown@4000,top20_shown@4000")
    args = parser.parse_args(argv)
    cases = pickle.loads(args.capture.read_bytes())
    grid = [(name, [float(v) for v in values.split(",")]) for name, values in (s.split("=") for s in args.settings)]
    metrics = args.metrics.split(",")
    print(f"{len(cases)} blocks of {len({c['key'] for c in cases})} questions")
    for combo in itertools.product(*(values for _, values in grid)):
        constants = {name: value for (name, _), value in zip(grid, combo, strict=True)}
        summary = replay(cases, constants)
        label = " ".join(f"{k}={v:g}" for k, v in constants.items()) or "as is"
        for row in ("half a", "half b"):
            m = summary.get(row, {})
            print(f"{label:50} {row}: " + " ".join(
                f"{k}={m[k]:.3f}" for k in metrics if isinstance(m.get(k), float)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
