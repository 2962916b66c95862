"""How well personal statements are kept out of shared shards, offline and on the LLM path.

tests/data/personal_statements.jsonl holds sentences written by hand for this purpose and
labelled by principle (docs/extraction.md says how): ``{"text", "label", "shard",
"speaker", "why", "split"}``, label ``personal`` (about the speaker, their household or
another person), ``topic`` (knowledge of the shard's topic) or ``other`` (about the
assistant, small talk, questions on the topic). Split "dev" is what the rule
(memory_service.formation.personal) was written against; "holdout" was written and labelled after
it was frozen.

Each sentence is said in a window of its own (by user bob; an assistant's sentence
follows a question of bob's), with six active shards, and goes through two paths:

- **offline**: the RuleBasedExtractor, then formation's routing (``extraction_memories``);
- **LLM**: the sentence handed to formation as a shard fact, as an LLM that ignored its
  instructions would return it ("bob: <sentence>" for the row's shard): what formation's
  own check does with it.

A personal sentence *leaks* when any memory of a shard namespace comes of it. The floors:
no leak at all, on either path; topic sentences keep their shard at the measured rates.

    .venv/bin/python -m tests.test_personal_statements   # figures and every miss
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_service.domain.models import Memory, MemoryKind, Role, Shard
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.formation.extractor import ExtractedItem, Extraction, Window, WindowMessage
from memory_service.formation.personal import is_personal
from memory_service.formation.rule_extractor import RuleBasedExtractor
from memory_service.formation.steps import extraction_memories

DATA = Path(__file__).parent / "data" / "personal_statements.jsonl"
AGENT, SPEAKER = "concierge", "bob"
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)

SHARDS = tuple(Shard(agent_id=AGENT, shard_id=shard_id, name=name, extraction_focus=focus) for shard_id, name, focus in [
    ("travel", "travel logistics", "flights, trains, trams, metro, taxis, airports, airlines, hotels, passports, visas"),
    ("food", "restaurants and food", "restaurants, dinner, lunch, menu, chefs, bakeries, cuisine, allergies, seafood"),
    ("museums", "museums and culture", "museums, exhibitions, monuments, opening hours, tickets, tours"),
    ("health", "health and care", "clinics, pharmacies, doctors, medicines, vaccines, appointments"),
    ("money", "banking and finances", "banks, fees, cards, accounts, transfers, exchange rates, taxes"),
    ("tech", "devices and software", "laptops, phones, wifi, routers, passwords, apps, python, ubuntu"),
])

# Floors per split (None: all rows): the most a personal sentence may leak (a share), and
# the least share of topic sentences that must keep their shard, offline and on the LLM path.
MAX_LEAK = {None: 0.0, "dev": 0.0, "holdout": 0.0}
MIN_TOPIC_KEPT_OFFLINE = {None: 0.85, "dev": 0.85, "holdout": 0.85}  # measured 0.891, 0.889, 0.900
MIN_TOPIC_KEPT_LLM = {None: 0.97, "dev": 0.98, "holdout": 0.90}  # measured 0.989, 1.000, 0.950


def load() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]


def window_of(row: dict) -> Window:
    """The row's sentence in a window of its own: bob's, or the assistant's answer to bob."""
    lines = [(Role.USER, "Can you help me with something?")] if row["speaker"] == "assistant" else []
    lines.append((Role(row["speaker"]), row["text"]))
    messages = tuple(WindowMessage(message_id=f"m{i}", sequence=i, role=role, user_id=SPEAKER, content=text,
                                   created_at=T0) for i, (role, text) in enumerate(lines))
    return Window(agent_id=AGENT, session_id="s1", messages=messages, shards=SHARDS)


def where(memories: list[Memory]) -> set[NamespaceKind]:
    """The namespace kinds the row's memories (episodes aside) went to."""
    return {Namespace.parse(m.namespace).kind for m in memories if m.kind is not MemoryKind.EPISODE}


def offline(row: dict) -> set[NamespaceKind]:
    window = window_of(row)
    extraction = asyncio.run(RuleBasedExtractor().extract(window))
    return where(extraction_memories(window, "k", extraction))


def llm_path(row: dict) -> set[NamespaceKind]:
    """The sentence returned as a fact of its shard ("other" rows: of the first shard)."""
    window = window_of(row)
    said = window.messages[-1]
    shard = row["shard"] if row["shard"] in {s.shard_id for s in SHARDS} else SHARDS[0].shard_id
    prefix = SPEAKER if row["speaker"] == "user" else "assistant"
    item = ExtractedItem(MemoryKind.FACT, f"{prefix}: {row['text']}", (said.message_id,),
                         SPEAKER if row["speaker"] == "user" else None, shard)
    return where(extraction_memories(window, "k", Extraction(items=[item])))


@dataclass
class Score:
    personal: int = 0
    leaked: list[str] = field(default_factory=list)
    topic: int = 0
    topic_kept: int = 0
    topic_lost: list[str] = field(default_factory=list)

    @property
    def leak_rate(self) -> float:
        return len(self.leaked) / self.personal if self.personal else 0.0

    @property
    def topic_recall(self) -> float:
        return self.topic_kept / self.topic if self.topic else 1.0

    def line(self, name: str) -> str:
        return (f"{name:18} personal n={self.personal:3} leaked={len(self.leaked)} ({self.leak_rate:.3f})   "
                f"topic n={self.topic:3} kept in shard={self.topic_kept} ({self.topic_recall:.3f})")


@dataclass
class Judged:
    """The classifier alone: precision and recall of "personal" over personal vs the rest."""

    tp: int = 0
    fp: list[str] = field(default_factory=list)
    fn: list[str] = field(default_factory=list)

    def line(self, name: str) -> str:
        said, labelled = self.tp + len(self.fp), self.tp + len(self.fn)
        return (f"{name:18} is_personal precision={self.tp / said if said else 1:.3f} "
                f"recall={self.tp / labelled if labelled else 1:.3f} (tp={self.tp}, fp={len(self.fp)}, fn={len(self.fn)})")


def score(rows: list[dict]) -> dict[tuple[str, str | None], Score | Judged]:
    """Per (path, split): path 'offline', 'llm' or 'classifier'; split None for all rows."""
    out: dict[tuple[str, str | None], Score | Judged] = {}
    for row in rows:
        personal = row["label"] == "personal"
        for path, run in (("offline", offline), ("llm", llm_path)):
            went = run(row)
            for split in (None, row["split"]):
                s = out.setdefault((path, split), Score())
                assert isinstance(s, Score)
                if personal:
                    s.personal += 1
                    if NamespaceKind.SHARD in went:
                        s.leaked.append(row["text"])
                elif row["label"] == "topic" and not row["text"].rstrip().endswith("?"):
                    s.topic += 1
                    if NamespaceKind.SHARD in went:
                        s.topic_kept += 1
                    else:
                        s.topic_lost.append(row["text"])
        judged = is_personal(row["text"], names=[SPEAKER], assistant=row["speaker"] == "assistant")
        for split in (None, row["split"]):
            j = out.setdefault(("classifier", split), Judged())
            assert isinstance(j, Judged)
            if judged and personal:
                j.tp += 1
            elif judged:
                j.fp.append(row["text"])
            elif personal:
                j.fn.append(row["text"])
    return out


@pytest.fixture(scope="module")
def scores() -> dict[tuple[str, str | None], Score | Judged]:
    result = score(load())
    print()
    for (path, split), s in sorted(result.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        print(s.line(f"{path}/{split or 'all'}"))
    return result


def test_the_labelled_set_is_large_varied_and_well_formed():
    rows = load()
    assert len(rows) >= 150
    assert all(set(row) == {"text", "label", "shard", "speaker", "why", "split"} for row in rows)
    assert all(row["label"] in ("personal", "topic", "other") and row["speaker"] in ("user", "assistant")
               and row["split"] in ("dev", "holdout") and row["text"].strip() and row["why"].strip() for row in rows)
    texts = [" ".join(row["text"].lower().split()) for row in rows]
    assert len(set(texts)) == len(texts), "a sentence is labelled twice"
    labels = {label: sum(row["label"] == label for row in rows) for label in ("personal", "topic", "other")}
    assert labels["personal"] >= 80 and labels["topic"] >= 60, labels
    # The hard cases are there: topic claims in the first person, other people's data,
    # the assistant's words, questions.
    hard = [r for r in rows if r["label"] == "topic" and r["text"].lower().startswith(("i ", "i'", "we ", "in my"))]
    assert len(hard) >= 10
    assert sum(r["speaker"] == "assistant" for r in rows) >= 6
    assert sum(r["text"].rstrip().endswith("?") for r in rows) >= 5


@pytest.mark.parametrize("path", ["offline", "llm"])
@pytest.mark.parametrize("split", list(MAX_LEAK), ids=lambda s: s or "all")
def test_no_personal_statement_reaches_a_shard(scores, path, split):
    s = scores[(path, split)]
    assert isinstance(s, Score)
    assert s.leak_rate <= MAX_LEAK[split], f"{s.line(path)}; leaked: {s.leaked}"


@pytest.mark.parametrize("path", ["offline", "llm"])
@pytest.mark.parametrize("split", list(MAX_LEAK), ids=lambda s: s or "all")
def test_topic_knowledge_keeps_its_shard(scores, path, split):
    s = scores[(path, split)]
    assert isinstance(s, Score)
    floor = (MIN_TOPIC_KEPT_OFFLINE if path == "offline" else MIN_TOPIC_KEPT_LLM)[split]
    assert s.topic_recall >= floor, f"{s.line(path)}; lost: {s.topic_lost}"


def test_personal_statements_are_kept_for_their_speaker_not_lost():
    """A personal sentence handed over as a shard fact is not dropped: it lands in bob's
    namespace. (Offline, as before, a sentence is kept only if it has a shard's words.)"""
    rows = [r for r in load() if r["label"] == "personal"]
    lost = [r["text"] for r in rows if llm_path(r) != {NamespaceKind.USER}]
    assert not lost
    passport = {"text": "My passport number is BOBPASS77 and it expires in May.", "speaker": "user"}
    assert offline(passport) == {NamespaceKind.USER}


def main() -> None:
    result = score(load())
    for (path, split), s in sorted(result.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        print(s.line(f"{path}/{split or 'all'}"))
    for (path, split), s in sorted(result.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if split is None:
            continue
        if isinstance(s, Score):
            for text in s.leaked:
                print(f"  LEAKED [{path}/{split}]: {text}")
            for text in s.topic_lost:
                print(f"  topic not in its shard [{path}/{split}]: {text}")
        else:
            for text in s.fp:
                print(f"  judged personal, labelled otherwise [{split}]: {text}")
            for text in s.fn:
                print(f"  personal, judged not [{split}]: {text}")


if __name__ == "__main__":
    main()


@pytest.mark.parametrize("content, cites", [
    ("bob: Bob's passport number is BOBPASS77.", "m0"),  # restated in the third person
    ("bob: the passport expires in May.", "m0"),  # the person dropped: the cited sentence is his
    ("bob: passport BOBPASS77 is valid until May.", "m1"),  # cites the wrong message: the code is traced
    ("assistant: your passport expires in May.", "m2"),  # the assistant's words: about whom? dropped
    ("bob suggests: we use my passport BOBPASS77 for the booking (agreed: carol)", "m0"),
])
def test_formation_routes_an_llms_restated_personal_item_to_its_owner(content, cites):
    lines = [(Role.USER, "bob", "My passport number is BOBPASS77 and it expires in May."),
             (Role.USER, "carol", "The passport office opens at 8:30."),
             (Role.ASSISTANT, "bob", "Noted.")]
    messages = tuple(WindowMessage(message_id=f"m{i}", sequence=i, role=role, user_id=user, content=text,
                                   created_at=T0) for i, (role, user, text) in enumerate(lines))
    window = Window(agent_id=AGENT, session_id="s1", messages=messages, shards=SHARDS)
    said_by = {"m0": "bob", "m1": "carol", "m2": None}[cites]
    kind = MemoryKind.SUGGESTION if "suggests" in content else MemoryKind.FACT
    topic = ExtractedItem(MemoryKind.FACT, "carol: the passport office opens at 8:30.", ("m1",), "carol", "travel")
    item = ExtractedItem(kind, content, (cites,), said_by, "travel")
    memories = extraction_memories(window, "k", Extraction(items=[item, topic]))
    placed = {(m.namespace, m.content) for m in memories}
    assert ("shard:concierge:travel", topic.content) in placed  # topic knowledge keeps its shard
    assert not [c for ns, c in placed if ns.startswith("shard:") and c == content]
    if said_by:
        assert (f"user:concierge:{said_by}", content) in placed
    else:  # "your" in a window of two users: whose is a guess, so it is kept for no one
        assert [c for _, c in placed] == [topic.content]
