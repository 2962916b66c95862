"""No query, no small talk: a memory block never searches on a message with nothing to search for.

Without a query the block's query is the session's latest user message; when a session
ends in "That's the spirit! Bye!", searching on it finds the user's other goodbyes and shows
them as relevant memories. The detector (memory_service/domain/smalltalk.py) is measured on
tests/data/small_talk_labelled.jsonl: realistic chat messages written by hand, ``{"text",
"label", "why", "split"}``, label ``small_talk`` (greeting, thanks, farewell, assent,
reaction: nothing content-bearing) or ``content`` (anything to search for, including the
tricky ones: a farewell or thanks carrying a request or a fact, a one-word question). Split
"dev" is what the rule was written against; "holdout" was written and committed before it.

Taking content for small talk loses its search; taking small talk for content only searches
as before. So precision (of the small talk label) is held at 1.0, recall at what was measured.

    .venv/bin/python -m tests.test_small_talk   # figures and every miss

Then the block, on a real server (loopback HTTP, embedded FalkorDB, the hash embedder): a
LoCoMo-like pair of speakers whose earlier session ends in goodbyes, and a session that
ends in one.
"""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from memory_service.domain.smalltalk import content_words, is_small_talk

from .helpers import shows_episode, wait_embedding_idle

DATA = Path(__file__).parent / "data" / "small_talk_labelled.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
# Measured when the rule was frozen: dev 39/40 small talk found ("Congrats!! That's huge news!"
# keeps "huge news"), holdout 25/25; no content message taken for small talk in either.
FLOORS = {"dev": {"precision": 1.0, "recall": 0.95}, "holdout": {"precision": 1.0, "recall": 0.95}}


def figures(split: str) -> dict[str, float | list[str]]:
    rows = [r for r in ROWS if r["split"] == split]
    said = [(r, is_small_talk(r["text"])) for r in rows]
    true_pos = sum(1 for r, small in said if small and r["label"] == "small_talk")
    false_pos = [r["text"] for r, small in said if small and r["label"] == "content"]
    missed = [r["text"] for r, small in said if not small and r["label"] == "small_talk"]
    return {"precision": true_pos / max(1, true_pos + len(false_pos)),
            "recall": true_pos / max(1, sum(1 for r in rows if r["label"] == "small_talk")),
            "content taken for small talk": false_pos, "small talk missed": missed}


def test_the_labelled_set_is_balanced_and_has_the_tricky_cases():
    for split in FLOORS:
        labels = [r["label"] for r in ROWS if r["split"] == split]
        assert labels.count("small_talk") >= 20 and labels.count("content") >= 20
    texts = {r["text"]: r["label"] for r in ROWS}
    for tricky in ("Bye! Remember my flight is at 6am", "thanks, can you also book Lisbon?", "Lisbon?"):
        assert texts[tricky] == "content"


@pytest.mark.parametrize("split", list(FLOORS))
def test_precision_and_recall_of_the_detector(split):
    got = figures(split)
    assert got["precision"] >= FLOORS[split]["precision"], got
    assert got["recall"] >= FLOORS[split]["recall"], got


def test_what_remains_of_a_message_is_its_content():
    assert content_words("Bye! Remember my flight is at 6am") == ["remember", "flight", "6am"]
    assert content_words("thanks, can you also book Lisbon?") == ["book", "lisbon"]
    assert content_words("Bye Jon! You got this!") == []  # the name a farewell addresses is no content
    assert content_words("Hi Gina, how was the dance competition?") == ["dance", "competition"]
    assert is_small_talk("") and is_small_talk("👍 😂")


AGENT = "chat-agent"
EARLIER = [  # an earlier session of the two speakers, ending in goodbyes
    ("jon", "Gina, my dance studio finally opened downtown last week!"),
    ("gina", "That's amazing Jon! I booked a flight to Lisbon for my sister's wedding."),
    ("jon", "My flight to Rome leaves at 6am on Friday."),
    ("jon", "Please always keep your answers short."),
    ("gina", "Sure, see ya. Bye!"),
    ("jon", "See you tomorrow. Bye!"),
    ("gina", "Bye Jon! You got this!"),
    ("jon", "Bye!"),
]
NOW = [  # the session the block is asked for, ending in a goodbye
    ("jon", "I have been practising the new choreography every evening."),
    ("gina", "You will do great at the showcase, I am sure of it."),
    ("jon", "That's the spirit! Bye!"),
]


async def record(http, session: str, lines, prefix: str) -> None:
    for i, (user, text) in enumerate(lines):
        r = await http.post(f"/v1/sessions/{session}/messages", json={
            "agent_id": AGENT, "user_id": user, "role": "user", "content": text, "message_id": f"{prefix}{i}"})
        assert r.status_code in (200, 201, 202), r.text


async def block(http, **params) -> tuple[dict, list[str]]:
    r = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "jon", "session_id": "now",
                                              "budget": 4000, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return body, [m.text or "" for m in ET.fromstring(body["xml"]).iter("Memory")]


@pytest.fixture
async def goodbyes(http, falkordb_url):
    await record(http, "earlier", EARLIER, "e")
    formed = await http.post("/v1/sessions/earlier/form", params={"wait": "true"})
    assert formed.status_code in (200, 202), formed.text
    await record(http, "now", NOW, "n")
    formed = await http.post("/v1/sessions/now/form", params={"wait": "true"})
    assert formed.status_code in (200, 202), formed.text
    await wait_embedding_idle(falkordb_url, AGENT)
    return http


async def test_a_session_ending_in_a_goodbye_shows_no_other_goodbyes(goodbyes):
    body, memories = await block(goodbyes)
    assert not any("Bye" in m or "see ya" in m for m in memories), memories
    assert body["sections"]["relevant"] == 0
    # What else applies is still there: the session's episode, the user's standing memory.
    assert shows_episode(body["xml"]), body["xml"]
    assert "keep your answers short" in body["xml"] and body["sections"]["user"] >= 1
    # A goodbye that carries content is searched.
    await record(goodbyes, "now", [("jon", "Bye! Remember my flight is at 6am")], "late")
    _, memories = await block(goodbyes)
    assert any("Rome" in m for m in memories), memories  # the flight it names, found


async def test_an_explicit_small_talk_query_is_no_query_either(goodbyes):
    body, memories = await block(goodbyes, query="Thanks, bye!")
    assert memories == [] and body["sections"]["relevant"] == 0
    assert shows_episode(body["xml"])


if __name__ == "__main__":
    for split in FLOORS:
        print(split, json.dumps(figures(split), indent=1, ensure_ascii=False))
