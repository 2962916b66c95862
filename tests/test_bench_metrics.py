"""The benchmarks' shared protocol (bench/evidence.py) on tiny hand-written samples: the
split rule, the retrieval metrics, where the evidence is lost, answer-in-context, and the
LongMemEval loader's mapping (date order, empty turns, long turns in parts)."""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from baselines import Turn  # noqa: E402
from evidence import (  # noqa: E402
    Block,
    answer_words,
    context_metrics,
    grouped,
    is_extractive,
    record,
    retrieval_metrics,
    split_halves,
    user_memory_chars,
)


def turn(dia_id: str, text: str, speaker: str = "user") -> Turn:
    return Turn(dia_id, speaker, text, None, 1, 0)


def test_halves_are_fixed_balanced_per_group_and_blind_to_content():
    items = [(f"q{i}", "temporal" if i % 3 else "multi") for i in range(31)]
    halves = split_halves(items)
    assert halves == split_halves(reversed(items))  # the order of the file does not matter
    for group in ("temporal", "multi"):
        counts = Counter(halves[k] for k, g in items if g == group)
        assert abs(counts["a"] - counts["b"]) <= 1
    # a key's half depends on the keys of its own group only
    two = split_halves([("x", 1), ("y", 1)])
    assert set(two.values()) == {"a", "b"}
    assert {k: v for k, v in split_halves([("x", 1), ("y", 1), ("z", 2)]).items() if k != "z"} == two


def test_retrieval_metrics_over_sources_of_the_top_k():
    top = [["s1:0"], ["s2:3", "s2:4"], [], ["s3:1"]]
    m = retrieval_metrics(top, ["s2:4", "s3:1", "s9:9"], (1, 2, 4))
    assert m["R@1"] == 0 and m["any@1"] == 0 and m["all@1"] == 0
    assert m["R@2"] == pytest.approx(1 / 3) and m["any@2"] == 1 and m["all@2"] == 0
    assert m["R@4"] == pytest.approx(2 / 3) and m["all@4"] == 0
    assert retrieval_metrics(top, ["s1:0", "s3:1"], (4,), "msg ")["msg all@4"] == 1


LONG = ("I booked the tickets for the Jonas Brothers concert at the TD Garden on July 17th and then "
        "The Lumineers in Rhode Island later this summer with my sister")


def test_where_the_evidence_is_lost():
    shown = turn("s1:0", LONG)
    cut = turn("s2:0", " ".join(LONG.split()[:10]) + " and then a long walk home along the river at night")
    found = turn("s1:2", "We adopted a grey kitten called Pixel last week.")
    lost = turn("s1:3", "The marathon in Lisbon starts at seven in the morning.")
    xml = f"<B><I>user: {LONG}</I><I>I {' '.join(cut.text.split()[:10])}</I></B>"
    block = Block.of(xml)
    assert block.share(shown) == 1.0
    assert block.holds_piece(cut) and block.share(cut) < 0.7  # ten words of it, verbatim, in one element
    m = context_metrics(xml, [shown, cut, found, lost], found=["s1:2"], budget=4000)
    assert m["ctx@4000"] == 0.25 and m["cut@4000"] == 0.25
    assert m["found_not_shown@4000"] == 0.25 and m["not_found@4000"] == 0.25
    assert m["ctx_all@4000"] == 0.0 and m["ans@4000"] is None
    assert context_metrics("<B>", [shown], [], 100)["not_found@100"] == 1.0  # a block that does not parse


def test_a_similar_turn_is_not_a_cut():
    """Neighbouring turns share words, not runs of words: not called a piece of the turn."""
    evidence = turn("s1:0", "Can you recommend a good hiking trail near Denver for a beginner like me?")
    reply = "<B><I>assistant: For a beginner near Denver, a good hiking trail is the Red Rocks loop.</I></B>"
    assert not Block.of(reply).holds_piece(evidence)
    assert context_metrics(reply, [evidence], found=[], budget=100)["not_found@100"] == 1.0


def test_answer_in_context_counts_extractive_answers_only():
    ev = [turn("s1:0", "I moved to Porto in March, the rent is 900 euros.")]
    words = answer_words("900 euros")
    assert is_extractive(words, ev)
    assert not is_extractive(answer_words("five"), ev)
    assert not is_extractive(answer_words("5"), ev)  # no content word: not counted
    m = context_metrics("<B><I>rent: 900 euros a month</I></B>", ev, found=[], budget=100, answer=words)
    assert m["ans@100"] == 1.0
    assert context_metrics("<B><I>the rent</I></B>", ev, [], 100, answer=words)["ans@100"] == 0.0


def test_the_user_memory_section_is_measured_in_characters_per_block():
    section = '<UserMemory><User id="u"><Directives><Directive>Keep answers short.</Directive></Directives></User></UserMemory>'
    xml = f"<MemoryContext>{section}<RelevantMemories><Memory>x</Memory></RelevantMemories></MemoryContext>"
    assert user_memory_chars(xml) == len(section)
    assert user_memory_chars("<MemoryContext/>") == 0
    assert context_metrics(xml, [turn("D1:1", "x")], (), 4000)["um@4000"] == len(section)


def test_grouped_summaries_give_the_whole_both_halves_and_each_group():
    recs = [record("q1", "a", "temporal", x=1.0, ans=None), record("q2", "b", "temporal", x=0.0, ans=1.0),
            record("q3", "a", "multi", x=0.5, ans=0.0)]
    g = grouped(recs)
    assert g["all"]["questions"] == 3 and g["all"]["x"] == pytest.approx(0.5)
    assert g["all"]["ans"] == 0.5 and g["all"]["ans:n"] == 2
    assert g["half a"]["x"] == 0.75 and g["half b"]["x"] == 0.0
    assert g["temporal"]["x"] == 0.5 and g["temporal / a"]["x"] == 1.0


def test_the_longmemeval_mapping(tmp_path):
    import longmemeval

    sessions = [[{"role": "user", "content": "later"}],
                [{"role": "user", "content": "   "}, {"role": "assistant", "content": "word " * 30, "has_answer": True}]]
    data = [{"question_id": "q1", "question_type": "multi-session", "question": "what?",
             "question_date": "2023/06/01 (Thu) 10:00", "answer": "word", "answer_session_ids": ["b"],
             "haystack_session_ids": ["a", "b"], "haystack_dates": ["2023/05/20 (Sat) 00:31", "2023/05/01 (Mon) 09:00"],
             "haystack_sessions": sessions},
            {**{"question_id": "q2_abs", "question_type": "multi-session", "question": "?",
                "question_date": "2023/06/01 (Thu) 10:00", "answer": "", "answer_session_ids": [],
                "haystack_session_ids": [], "haystack_dates": [], "haystack_sessions": []}}]
    path = tmp_path / "lme.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    questions, stats = longmemeval.load(path, max_chars=50)
    assert stats["abstention"] == 1 and stats["empty_turns"] == 1 and stats["long_turns"] == 1
    (q,) = questions
    assert [s.date.day for s in q.sessions] == [1, 20]  # date order
    assert [t.dia_id for t in q.turns] == ["s1:1", "s2:0"]  # the empty turn left out, its index kept
    assert q.evidence_ids == {"s1:1"} and q.turns[0].doc.startswith("assistant: word")
    pieces = longmemeval.parts(q.turns[0].text, 50)
    assert all(len(p) <= 50 for p in pieces) and "".join(pieces) == q.turns[0].text
    assert longmemeval.turn_of("s1:1~2") == "s1:1"


def test_where_the_characters_go_and_how_much_of_search_the_block_shows():
    evidence = turn("s1:0", "We adopted a grey kitten called Pixel last week.")
    xml = ("<MemoryContext><UserMemory><User id=\"u\"><Directives><Directive>Always answer in French please."
           "</Directive></Directives></User></UserMemory><RelevantMemories><Memory>user: We adopted a grey kitten "
           "called Pixel last week.</Memory><Memory>Something else entirely about trains.</Memory>"
           "</RelevantMemories></MemoryContext>")
    m = context_metrics(xml, [evidence], found=["s1:0"], budget=4000,
                        ranked=["We adopted a grey kitten called Pixel last week.", "Trains run late on Sundays here.",
                                "Something else entirely about trains.", "A thing the block never shows at all."])
    assert m["top20_shown@4000"] == 0.5
    item = len("<Memory>user: We adopted a grey kitten called Pixel last week.</Memory>")
    assert m["evidence_chars@4000"] == pytest.approx(item / len(xml))
    assert 0 < m["user_chars@4000"] < m["relevant_chars@4000"] < 1
    assert m["conversation_chars@4000"] == 0.0
    assert "top20_shown@4000" not in context_metrics(xml, [evidence], [], 4000)  # no ranking given


def test_a_captured_block_is_rendered_again_under_other_constants(tmp_path):
    from block_replay import Capture, replay

    from memory_service.domain.models import MemoryKind
    from memory_service.recall import assembler
    from memory_service.recall.render import ContextInputs, RelevantItem

    evidence = turn("s1:0", "We adopted a grey kitten called Pixel last week and she sleeps all day long.")
    long = " ".join(["We talked about the weather for a while and then about other things."] * 27)
    now = datetime(2024, 6, 1, tzinfo=UTC)
    inputs = ContextInputs(asked=True, relevant=[
        RelevantItem(MemoryKind.MESSAGE, now, long, 1.0, ("kitten",)),
        RelevantItem(MemoryKind.MESSAGE, now, f"user: {evidence.text}", 0.9, ("kitten",))])
    capture = Capture()
    with capture.active():
        assembler.render_context(inputs, 2000)
    capture.case("q1", "a", "g", 2000, ("kitten",), [evidence], ["s1:0"], [evidence.text], None)
    capture.save(tmp_path / "c.pickle")
    cases = __import__("pickle").loads((tmp_path / "c.pickle").read_bytes())
    assert len(cases) == 1 and assembler.render_context.__name__ == "render_context"  # unpatched after
    # The best (long) one whole up to all of the room leaves none to the evidence; a passage does.
    assert replay(cases, {"BEST_WHOLE_SHARE": 1.0, "WHOLE_CHARS": 2000})["half a"]["ctx@2000"] == 0.0
    assert replay(cases, {"BEST_WHOLE_SHARE": 0.0})["half a"]["ctx@2000"] == 1.0
