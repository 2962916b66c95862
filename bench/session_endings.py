"""Benchmark: the block a session loop gets at the end of each LoCoMo session (no query).

Without a query the block's query is the session's latest user message, and LoCoMo's
sessions often end in small talk ("That's the spirit! Bye!"): searching on it shows the
speakers' other goodbyes as relevant memories. This bench records and forms every session
of a LoCoMo-format file through the public HTTP API, as ``bench/locomo.py`` does (its
``ingest``, embedded FalkorDB, a real loopback server), then asks for each session's block
as its last speaker, without a query, at 4,000 characters, and counts:

- the sessions whose last turn is small talk (memory_service/domain/smalltalk.py);
- the blocks that show relevant memories, and how many of those memories are farewells
  (a plain pattern of farewell words, independent of the detector: "bye", "see you",
  "take care", "talk soon", ...);
- the same of the sessions that end in content, which must keep their search.

Run it on the code before a change and after (e.g. ``PYTHONPATH=<old tree>``) to compare.
No data is written to the repository.

    .venv/bin/python bench/session_endings.py ../shared/bench/locomo_dev.json [--limit-samples N] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree as ET

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from baselines import load_locomo  # noqa: E402
from locomo import ingest, session_id  # noqa: E402
from rich.console import Console  # noqa: E402

BUDGET = 4000
FAREWELL = re.compile(r"\b(?:bye|goodbye|see\s+(?:you|ya)|take\s+care|talk\s+(?:to\s+you\s+)?(?:soon|later)|"
                      r"catch\s+you|good\s*night)\b", re.IGNORECASE)


async def run(path: Path, limit: int | None, console: Console) -> dict:
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.config import Settings
    from memory_service.domain.smalltalk import is_small_talk
    from memory_service.http.app import create_app

    samples = load_locomo(path, limit)
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="endings-bench-") as tmp:
        server = LoopbackServer(create_app(settings, data_dir=Path(tmp), run_worker=True, host="127.0.0.1"))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=settings.form_wait_seconds + 60) as http:
                console.print(f"ingesting {sum(len(s.turns) for s in samples)} turns ...")
                await ingest(http, samples, 5, console)
                for sample in samples:
                    for session in sample.sessions:
                        last = session.turns[-1]
                        r = await http.get("/v1/context", params={
                            "agent_id": sample.sample_id, "user_id": last.speaker,
                            "session_id": session_id(sample, session.number), "budget": BUDGET})
                        r.raise_for_status()
                        shown = [m.text or "" for m in ET.fromstring(r.json()["xml"]).iter("Memory")]
                        rows.append({"sample": sample.sample_id, "session": session.number, "last": last.content,
                                     "small_talk": is_small_talk(last.content), "relevant": shown,
                                     "farewells": [m for m in shown if FAREWELL.search(m)]})
        finally:
            await server.stop()

    def tally(group: list[dict]) -> dict:
        return {"sessions": len(group), "blocks_with_relevant": sum(1 for r in group if r["relevant"]),
                "relevant": sum(len(r["relevant"]) for r in group),
                "farewells_shown": sum(len(r["farewells"]) for r in group),
                "blocks_with_farewells": sum(1 for r in group if r["farewells"])}

    return {"budget": BUDGET, "ending_in_small_talk": tally([r for r in rows if r["small_talk"]]),
            "ending_in_content": tally([r for r in rows if not r["small_talk"]]), "sessions": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file")
    parser.add_argument("--limit-samples", type=int, metavar="N")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write every session's block summary to OUT")
    parser.add_argument("--show", default="conv-30:19", help="print this sample:session's relevant memories")
    args = parser.parse_args(argv)
    console = Console()
    out = asyncio.run(run(args.path, args.limit_samples, console))
    for group in ("ending_in_small_talk", "ending_in_content"):
        console.print(group, out[group])
    sample, _, number = args.show.partition(":")
    for row in out["sessions"]:
        if row["sample"] == sample and str(row["session"]) == number:
            console.print(f"{args.show} ends with {row['last']!r}; relevant memories: {row['relevant'][:6]}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
