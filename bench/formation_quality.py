"""Benchmark: what offline formation keeps of a conversation window, and in what form.

Two sets of conversation windows written by hand for this purpose (no benchmark data
copied), in one format: tests/data/formation_labelled.json (invented group and
one-to-one chats, dense with things worth keeping) and
tests/data/formation_assistant_chats.json (a user and an assistant as in real assistant
use: mostly task requests and questions, some lasting facts about the user, few standing
preferences, some small talk). Each window is ``{"id", "split", "why", "shards", "messages",
"expect"}``, each message ``[user_id, role, text]`` and each expected memory
``{"kind": "directive"|"fact"|"suggestion", "owner": user_id | "shard": shard_id,
"has": [words]}``. docs/extraction.md ("Formation that keeps meaning") gives the
labelling rule: directives say how the assistant should act; statements about a user are
facts in the user's namespace phrased in the third person with the user as subject; a
request for this turn's task (however it asks for the reply to look) and the assistant's
advice are no directive; topic
knowledge and proposals are shard facts and suggestions phrased as facts; pleasantries,
questions and fragments whose meaning lies in another turn are nothing.

Each window goes through ``RuleBasedExtractor`` (episodes are not scored). A memory it
makes matches an expected one of the same kind and place (the user's namespace or the
shard) when it holds every ``has`` word (case-insensitive) and, for a fact or suggestion,
is **phrased as a fact**: no speaker prefix ("bob:", "bob suggests:") and no first-person
pronoun (I, me, my, we, our…). Per kind, precision is matched / made and recall matched /
expected. "nothing" is scored per window: a window expected to yield no memory that
yields none. ``form`` is the share of the facts and suggestions made that are phrased as
facts, matched or not.

Figures are printed for all windows, each split, and each set (whole and per split).

    .venv/bin/python bench/formation_quality.py [--rules OTHER_rule_extractor.py] [--split dev|holdout]
        [--set formation_labelled|formation_assistant_chats] [--json OUT] [-v]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memory_service.domain.models import MemoryKind, Role, Shard  # noqa: E402
from memory_service.formation.extractor import ExtractedItem, Window, WindowMessage  # noqa: E402

SETS = (ROOT / "tests" / "data" / "formation_labelled.json", ROOT / "tests" / "data" / "formation_assistant_chats.json")
AGENT = "bench"
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
SHARDS = {
    "travel": Shard(agent_id=AGENT, shard_id="travel", name="travel logistics",
                    extraction_focus="flights, trains, hotels, bookings, dates, budget"),
    "food": Shard(agent_id=AGENT, shard_id="food", name="food and restaurants",
                  extraction_focus="restaurants, dinner, lunch, cuisine, allergies"),
    "release": Shard(agent_id=AGENT, shard_id="release", name="release planning",
                     extraction_focus="deadlines, shipping, QA, launch"),
}
KINDS = ("directive", "fact", "suggestion")
SPEAKER_PREFIX = re.compile(r"^\s*[\w.@-]{1,64}(?:\s+suggests)?\s*:\s")
FIRST_PERSON = re.compile(r"\b(?:i|i'm|im|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|we'd|we'll|(?-i:us)|our|ours)\b",
                          re.IGNORECASE)


def load(paths: tuple[Path, ...] = SETS) -> list[dict[str, Any]]:
    """Every window of ``paths``, each marked with its set (the file's stem) as ``"set"``."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows += [{**row, "set": path.stem} for row in json.loads(path.read_text(encoding="utf-8"))]
    return rows


def window_of(row: dict[str, Any]) -> Window:
    messages = tuple(
        WindowMessage(message_id=f"m{i}", sequence=i, role=Role(role), user_id=user if role == "user" else None,
                      content=text, created_at=T0 + timedelta(minutes=i))
        for i, (user, role, text) in enumerate(row["messages"])
    )
    return Window(agent_id=AGENT, session_id=row["id"], messages=messages,
                  shards=tuple(SHARDS[s] for s in row["shards"]))


def phrased_as_fact(content: str) -> bool:
    """No speaker prefix, no first-person pronoun (typographic apostrophes read as plain)."""
    text = content.replace("’", "'")
    return not SPEAKER_PREFIX.match(text) and not FIRST_PERSON.search(text)


def _place(item: ExtractedItem) -> tuple[str, str]:
    return ("shard", item.shard_id) if item.shard_id else ("owner", item.user_id or "")


def _matches(item: ExtractedItem, want: dict[str, Any]) -> bool:
    if item.kind.value != want["kind"]:
        return False
    if _place(item) != (("shard", want["shard"]) if "shard" in want else ("owner", want["owner"])):
        return False
    if item.kind is not MemoryKind.DIRECTIVE and not phrased_as_fact(item.content):
        return False
    text = item.content.lower().replace("’", "'")
    return all(word.lower() in text for word in want["has"])


def score(rows: list[dict[str, Any]], extractor: Any) -> dict[str, Any]:
    counts = {k: {"made": 0, "expected": 0, "matched": 0} for k in (*KINDS, "nothing")}
    form = {"made": 0, "as_fact": 0}
    errors: list[str] = []
    for row in rows:
        extraction = asyncio.run(extractor.extract(window_of(row)))
        items = [i for i in extraction.items if i.kind.value in KINDS]
        expect = list(row["expect"])
        for want in expect:
            counts[want["kind"]]["expected"] += 1
        unmatched = list(expect)
        for item in items:
            counts[item.kind.value]["made"] += 1
            if item.kind is not MemoryKind.DIRECTIVE:
                form["made"] += 1
                form["as_fact"] += phrased_as_fact(item.content)
            hit = next((w for w in unmatched if _matches(item, w)), None)
            if hit is not None:
                unmatched.remove(hit)
                counts[item.kind.value]["matched"] += 1
            else:
                errors.append(f"[{row['id']}] extra {item.kind.value} {'/'.join(_place(item))}: {item.content!r}")
        for want in unmatched:
            errors.append(f"[{row['id']}] missed {want['kind']} "
                          f"{want.get('shard') or want.get('owner')} {want['has']}")
        counts["nothing"]["expected"] += not expect
        counts["nothing"]["made"] += not items
        counts["nothing"]["matched"] += not expect and not items
    table = {}
    for kind, c in counts.items():
        table[kind] = {**c, "precision": c["matched"] / c["made"] if c["made"] else 1.0,
                       "recall": c["matched"] / c["expected"] if c["expected"] else 1.0}
    return {"windows": len(rows), "kinds": table,
            "form": form["as_fact"] / form["made"] if form["made"] else 1.0, "errors": errors}


def _extractor_from(path: Path | None) -> Any:
    if path is None:
        from memory_service.formation.rule_extractor import RuleBasedExtractor
        return RuleBasedExtractor()
    spec = importlib.util.spec_from_file_location("memory_service._rules_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.RuleBasedExtractor()


def render(name: str, result: dict[str, Any]) -> str:
    lines = [f"{name}: {result['windows']} windows; facts and suggestions phrased as facts: {result['form']:.3f}",
             f"  {'kind':10} {'P':>6} {'R':>6}   made / expected / matched"]
    for kind, c in result["kinds"].items():
        lines.append(f"  {kind:10} {c['precision']:6.3f} {c['recall']:6.3f}   {c['made']} / {c['expected']} / {c['matched']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=Path, help="another rule_extractor.py to score (e.g. from git show)")
    parser.add_argument("--split", choices=("dev", "holdout"), help="one split only (default: all, then each)")
    parser.add_argument("--set", choices=[p.stem for p in SETS], help="one set only (default: both, then each)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every extra and missed memory")
    args = parser.parse_args()
    rows = [r for r in load() if args.set is None or r["set"] == args.set]
    extractor = _extractor_from(args.rules)
    splits = [args.split] if args.split else [None, "dev", "holdout"]
    sets = [None] if args.set else [None, *(p.stem for p in SETS)]
    out = {}
    for set_name in sets:
        for split in splits:
            part = [r for r in rows if (split is None or r["split"] == split) and (set_name is None or r["set"] == set_name)]
            name = "/".join(x for x in (set_name, split) if x) or "all"
            out[name] = result = score(part, extractor)
            print(render(name, result))
            if args.verbose and set_name is None and split == splits[0]:
                print("\n".join("    " + e for e in result["errors"]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
