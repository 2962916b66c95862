"""The knowledge-update set (bench/data/knowledge_updates.json) is well-formed: the bench
(bench/knowledge_updates.py) scores against it, so a broken case would silently score wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path

SET = Path(__file__).resolve().parent.parent / "bench" / "data" / "knowledge_updates.json"


def said(text: str, value: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", text, re.IGNORECASE) is not None


def test_the_set_is_well_formed() -> None:
    data = json.loads(SET.read_text())
    users = {u["user_id"]: u for u in data["users"]}
    assert len(users) == len(data["users"])
    cases = data["cases"]
    assert len(cases) >= 200
    assert len({c["id"] for c in cases}) == len(cases)
    for case in cases:
        for key in ("id", "user_id", "kind", "category", "question", "current", "superseded"):
            assert case[key], (case["id"], key)
        user = users[case["user_id"]]
        sessions = user["sessions"]
        assert [s["number"] for s in sessions] == list(range(1, len(sessions) + 1))
        for s in sessions:
            assert s["messages"] and all(m["role"] in ("user", "assistant") and m["content"] for m in s["messages"])
        current, old = case["current"], case["superseded"]
        assert current not in old and all(not said(current, v) and not said(v, current) for v in old), case["id"]
        # the first superseded value is said before the current one, which comes in the last session
        first = next(i for i, s in enumerate(sessions) if any(said(m["content"], old[0]) for m in s["messages"]))
        assert any(said(m["content"], current) for m in sessions[-1]["messages"]), case["id"]
        assert first < len(sessions) - 1, case["id"]
