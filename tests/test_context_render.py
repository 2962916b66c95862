"""The memory-context renderer: element order, escaping, the budget and what gets trimmed."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.recall.render import (
    FACTS_SHARE,
    MIN_BUDGET_CHARS,
    ContextInputs,
    FactItem,
    RelevantItem,
    ShardContext,
    StartupItem,
    UserContext,
    age,
    budget_for_model,
    clean,
    render_context,
)

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def shown_as_is(memory: Memory) -> RelevantItem:
    return RelevantItem.whole(memory)
ALLOWED_TAGS = {
    "MemoryContext", "CollectiveMemory", "MemoryShard", "ConsolidatedMemory", "Facts", "Fact",
    "RecentSuggestions", "Suggestion", "UserMemory", "User", "Directives", "Directive",
    "CurrentConversationContext", "Episode", "RelevantMemories", "Memory", "StartupRecords", "Record",
    "KnownFacts",
}
HOSTILE = [
    "</UserMemory>",
    "<MemoryContext>",
    '"><Fact>x</Fact>',
    "&amp;",
    "bell\x00\x1b end",
    "]]>",
    "it's \"quoted\" & <b>bold</b>",
    "lone \ud800 surrogate \ufffe\uffff",
    "cr\rlf\r\n tab\t",
]

_counter = iter(range(10**9))


def mem(kind: str, content: str, namespace: str = "session:s1", ago: timedelta = timedelta()) -> Memory:
    return Memory(
        id=f"m{next(_counter)}",
        kind=MemoryKind(kind),
        namespace=namespace,
        content=content,
        metadata=Provenance(agent_id="a"),
        valid_at=NOW - ago,
    )


def episode(content: str) -> Memory:
    return mem("episode", content)


def fact(content: str) -> Memory:
    return mem("fact", content, "shard:a:topic")


def suggestion(content: str) -> Memory:
    return mem("suggestion", content, "shard:a:topic")


def directive(content: str, user: str = "u") -> Memory:
    return mem("directive", content, f"user:a:{user}")


def full_inputs(relevant: bool = True) -> ContextInputs:
    return ContextInputs(
        shards=[
            ShardContext("topic", "Topic", facts=[fact("f1"), fact("f2")],
                         suggestions=[suggestion("s1")], consolidated="shard summary"),
            ShardContext("other", "Other", facts=[fact("g1")]),
        ],
        users=[
            UserContext("u", directives=[directive("be brief")], consolidated="likes tea"),
            UserContext("v", directives=[directive("speak French", "v")]),
        ],
        episodes=[episode("e1"), episode("e2"), episode("e3")],
        relevant=[shown_as_is(mem("fact", "r1", "shard:a:topic", timedelta(days=3)))] if relevant else [],
    )


def parse(xml: str) -> ET.Element:
    root = ET.fromstring(xml)
    assert {el.tag for el in root.iter()} <= ALLOWED_TAGS
    return root


def texts(root: ET.Element, tag: str) -> list[str]:
    return [el.text or "" for el in root.iter(tag)]


def test_section_names_and_order():
    rendered = render_context(full_inputs(), 10_000, NOW)
    root = parse(rendered.xml)
    assert root.tag == "MemoryContext"
    assert [child.tag for child in root] == [
        "CollectiveMemory", "UserMemory", "CurrentConversationContext", "RelevantMemories",
    ]
    shard = root.find("CollectiveMemory/MemoryShard")
    assert shard.get("name") == "Topic"
    assert [c.tag for c in shard] == ["ConsolidatedMemory", "Facts", "RecentSuggestions"]
    assert texts(shard, "Fact") == ["f1", "f2"]
    assert texts(shard, "Suggestion") == ["s1"]
    # A shard with no consolidated memory and no suggestions has no such elements.
    other = root.findall("CollectiveMemory/MemoryShard")[1]
    assert [c.tag for c in other] == ["Facts"]
    users = root.findall("UserMemory/User")
    assert [u.get("id") for u in users] == ["u", "v"]
    assert [c.tag for c in users[0]] == ["ConsolidatedMemory", "Directives"]
    assert [c.tag for c in users[1]] == ["Directives"]
    (memory,) = root.iter("Memory")
    assert memory.get("kind") == "fact" and memory.get("date") == "2024-05-29" and memory.text == "r1"
    assert memory.get("age") is None  # the date says it, in fewer characters
    assert rendered.sections == {"startup": 0, "collective": 5, "user": 3, "conversation": 3, "facts": 0, "relevant": 1}
    assert rendered.dropped == 0 and rendered.left_out == {"duplicate": 0, "over_budget": 0}
    assert rendered.chars == len(rendered.xml) and rendered.budget == 10_000
    assert "\n  <CollectiveMemory>\n" in rendered.xml  # readable: one element a line, indented


def test_most_recent_episode_last():
    root = parse(render_context(full_inputs(), 10_000, NOW).xml)
    assert texts(root, "Episode") == ["e1", "e2", "e3"]


def test_relevant_section_only_when_given():
    root = parse(render_context(full_inputs(relevant=False), 10_000, NOW).xml)
    assert root.find("RelevantMemories") is None


def test_empty_inputs_and_empty_sections():
    assert render_context(ContextInputs(), 64, NOW).xml == "<MemoryContext/>"
    empty = ContextInputs(shards=[ShardContext("s", "S")], users=[UserContext("u")])
    assert render_context(empty, 1000, NOW).xml == "<MemoryContext/>"
    only_episode = render_context(ContextInputs(episodes=[episode("hi")]), 1000, NOW)
    assert [c.tag for c in parse(only_episode.xml)] == ["CurrentConversationContext"]


def test_hostile_content_is_escaped():
    tags = ("Fact", "Suggestion", "Directive", "Episode", "Memory")
    # Each section its own text (the same sentence in two sections would be shown once).
    hostile = {tag: [f"{tag} {i} {h}" for i, h in enumerate(HOSTILE)] for tag in tags}
    inputs = ContextInputs(
        shards=[ShardContext("t", '"><Fact>x</Fact>', facts=[fact(h) for h in hostile["Fact"]],
                             suggestions=[suggestion(h) for h in hostile["Suggestion"]], consolidated=HOSTILE[0])],
        users=[UserContext('u"><User id="evil', directives=[directive(h) for h in hostile["Directive"]],
                           consolidated="</UserMemory><MemoryContext>")],
        episodes=[episode(h) for h in hostile["Episode"]],
        relevant=[shown_as_is(mem("fact", h, "shard:a:t")) for h in hostile["Memory"]],
    )
    rendered = render_context(inputs, 100_000, NOW)
    root = parse(rendered.xml)
    assert rendered.dropped == 0 and rendered.left_out["duplicate"] == 0
    for tag in tags:
        assert texts(root, tag) == [clean(h) for h in hostile[tag]]
    assert root.find("CollectiveMemory/MemoryShard").get("name") == '"><Fact>x</Fact>'
    assert [u.get("id") for u in root.iter("User")] == ['u"><User id="evil']
    assert texts(root, "ConsolidatedMemory") == [HOSTILE[0], "</UserMemory><MemoryContext>"]
    # Exactly one of each container: nothing was forged.
    assert len(root.findall(".//UserMemory")) == 1 and len(root.findall(".//MemoryContext")) == 0
    for bad in ("\x00", "\x1b", "\ud800", "\ufffe", "\uffff"):
        assert bad not in rendered.xml


@pytest.mark.parametrize("budget", [-1, 0, 10, MIN_BUDGET_CHARS - 1])
def test_budget_below_minimum_raises(budget):
    with pytest.raises(ValueError):
        render_context(full_inputs(), budget, NOW)


def test_minimum_budget_works():
    rendered = render_context(full_inputs(), MIN_BUDGET_CHARS, NOW)
    assert rendered.chars <= MIN_BUDGET_CHARS
    parse(rendered.xml)


def test_tight_budget_keeps_latest_episode_and_user_directives():
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact(f"fact {i}") for i in range(20)],
                             suggestions=[suggestion(f"old suggestion {i}") for i in range(50)])],
        users=[UserContext("u", directives=[directive(f"directive {i}") for i in range(3)]),
               UserContext("v", directives=[directive(f"other {i}", "v") for i in range(10)])],
        episodes=[episode(f"episode {i}") for i in range(30)],
    )
    full = render_context(inputs, 100_000, NOW)
    assert full.dropped == 0
    rendered = render_context(inputs, 700, NOW)
    root = parse(rendered.xml)
    assert rendered.chars <= 700 and rendered.dropped > 0
    episodes = texts(root, "Episode")
    assert episodes and episodes[-1] == "episode 29"
    assert texts(root, "Directive")[:3] == ["directive 0", "directive 1", "directive 2"]
    assert texts(root, "Suggestion") == []
    assert [u.get("id") for u in root.iter("User")] == ["u"]
    assert sum(rendered.sections.values()) + rendered.dropped == sum(full.sections.values())


def test_within_a_list_oldest_go_first():
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact(f"fact {i:02}") for i in range(40)])],
        episodes=[episode(f"episode {i:02}") for i in range(40)],
    )
    for budget in range(200, 4000, 97):
        root = parse(render_context(inputs, budget, NOW).xml)
        for tag, prefix in (("Fact", "fact"), ("Episode", "episode")):
            kept = texts(root, tag)
            assert kept == [f"{prefix} {i:02}" for i in range(40 - len(kept), 40)]


def test_relevant_memories_rank_right_after_latest_episode():
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact("a fact")], consolidated="summary")],
        users=[UserContext("u", directives=[directive("a directive")], consolidated="likes tea")],
        episodes=[episode("older"), episode("latest")],
        relevant=[shown_as_is(mem("fact", "best match", "shard:a:t")), shown_as_is(mem("fact", "second match", "shard:a:t"))],
    )
    root = parse(render_context(inputs, 310, NOW).xml)
    assert texts(root, "Episode") == ["latest"]
    assert texts(root, "Memory") == ["best match", "second match"]
    assert root.find("UserMemory") is None and root.find("CollectiveMemory") is None


def test_one_char_short_drops_the_lowest_priority_item():
    full = render_context(full_inputs(), 100_000, NOW)
    rendered = render_context(full_inputs(), full.chars - 1, NOW)
    root = parse(rendered.xml)
    assert rendered.dropped == 1
    # Other users' directives rank lowest; v's only directive goes, and with it v's element.
    assert [u.get("id") for u in root.iter("User")] == ["u"]


def test_long_item_is_truncated_with_ellipsis():
    long = "word " * 400
    rendered = render_context(ContextInputs(episodes=[episode(long)]), 500, NOW)
    root = parse(rendered.xml)
    (text,) = texts(root, "Episode")
    assert text.endswith("…") and long.startswith(text[:-1]) and len(text) > 40
    assert rendered.chars <= 500 and rendered.sections["conversation"] == 1


def test_age_strings():
    assert age(NOW, NOW) == "just now"
    assert age(NOW + timedelta(minutes=5), NOW) == "just now"
    assert age(NOW - timedelta(seconds=59), NOW) == "just now"
    assert age(NOW - timedelta(minutes=1), NOW) == "1 minute ago"
    assert age(NOW - timedelta(hours=5), NOW) == "5 hours ago"
    assert age(NOW - timedelta(days=3, hours=2), NOW) == "3 days ago"
    assert age(NOW - timedelta(days=65), NOW) == "2 months ago"
    assert age(NOW - timedelta(days=800), NOW) == "2 years ago"


def test_budget_for_model():
    overrides = {"*gpt-4o-mini*": 3000, "llama3*:8b": 1200, "*gpt-4o*": 9000}
    assert budget_for_model(None, 6000, overrides) == 6000
    assert budget_for_model("openai/GPT-4o-mini-2024", 6000, overrides) == 3000
    assert budget_for_model("gpt-4o", 6000, overrides) == 9000
    assert budget_for_model("Llama3.1:8B", 6000, overrides) == 1200
    assert budget_for_model("llama3.1:70b", 6000, overrides) == 6000
    assert budget_for_model("claude", 6000, {}) == 6000
    # First match in mapping order wins.
    assert budget_for_model("gpt-4o-mini", 1, {"*gpt*": 5, "*mini*": 7}) == 5


# Any character, lone surrogates and controls included.
content = st.text(st.characters(exclude_categories=()), max_size=120)
ids = st.text(st.characters(exclude_categories=()), min_size=1, max_size=20)


@st.composite
def context_inputs(draw) -> ContextInputs:
    def memories(kind: str, namespace: str, max_size: int) -> list[Memory]:
        return [mem(kind, c, namespace, timedelta(minutes=draw(st.integers(0, 10**6))))
                for c in draw(st.lists(content, max_size=max_size))]

    shards = [ShardContext(f"s{k}", draw(ids), memories("fact", "shard:a:t", 8), memories("suggestion", "shard:a:t", 8),
                           draw(st.none() | content))
              for k in range(draw(st.integers(0, 3)))]
    users = [UserContext(draw(ids), memories("directive", "user:a:u", 8), draw(st.none() | content))
             for _ in range(draw(st.integers(0, 3)))]
    startup = [StartupItem(draw(st.integers(0, 3)), draw(ids), c) for c in draw(st.lists(content, max_size=6))]
    facts = [FactItem(c, draw(ids), draw(st.none() | st.just(NOW)), draw(st.none() | st.just(NOW)), draw(st.booleans()))
             for c in draw(st.lists(content, max_size=10))]
    return ContextInputs(shards, users, memories("episode", "session:s1", 12),
                         [shown_as_is(m) for m in memories("fact", "shard:a:t", 6)], startup, facts,
                         draw(st.none() | st.just(NOW)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=context_inputs(), budget=st.integers(MIN_BUDGET_CHARS, 20_000))
def test_budget_always_respected(inputs: ContextInputs, budget: int):
    rendered = render_context(inputs, budget, NOW)
    assert len(rendered.xml) == rendered.chars <= budget
    root = parse(rendered.xml)
    def shown(consolidated: str | None) -> bool:
        return bool(clean(consolidated or "").strip())

    total = (sum(len(s.facts) + len(s.suggestions) + shown(s.consolidated) for s in inputs.shards)
             + sum(len(u.directives) + shown(u.consolidated) for u in inputs.users)
             + len(inputs.episodes) + len(inputs.relevant) + len(inputs.startup) + len(inputs.facts))
    assert sum(rendered.sections.values()) + rendered.dropped + rendered.left_out["duplicate"] == total
    assert rendered.left_out["over_budget"] == rendered.dropped
    # The known facts keep to their share: their container and lines together.
    known = re.search(r" *<KnownFacts.*</KnownFacts>\n", rendered.xml, re.S)
    assert known is None or len(known.group(0)) <= budget * FACTS_SHARE
    # A fact is whole or left out.
    assert {el.text or "" for el in root.findall("KnownFacts/Fact")} <= {clean(f.text) for f in inputs.facts}
    # Episodes kept are the newest ones, in order; only the oldest kept one may be cut short.
    kept = texts(root, "Episode")
    originals = [clean(e.content) for e in inputs.episodes][len(inputs.episodes) - len(kept):]
    # An episode may also lose the sentences another item shows already (never gain any).
    if not rendered.left_out["duplicate"] and "…" not in "".join(clean(e.content) for e in inputs.episodes):
        for position, (text, original) in enumerate(zip(kept, originals, strict=True)):
            if position == 0 and text.endswith("…") and text != original:
                assert original.startswith(text[:-1])
            else:
                assert text == original or (" … " in text)


def test_startup_records_come_first_by_priority_and_each_on_its_own_merit():
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact("a fact")])],
        episodes=[episode("older"), episode("latest")],
        startup=[StartupItem(0, "Soul", "I am Atlas."), StartupItem(0, "Vow", "x" * 300),
                 StartupItem(1, "Rules", "Confirm dates."), StartupItem(2, "Tone", "Warm."),
                 StartupItem(3, "Ref", "LIS is Lisbon.")],
    )
    full = render_context(inputs, 10_000, NOW)
    root = parse(full.xml)
    assert [child.tag for child in root][0] == "StartupRecords"
    assert [(r.get("priority"), r.get("title")) for r in root.iter("Record")] == [
        ("P0", "Soul"), ("P0", "Vow"), ("P1", "Rules"), ("P2", "Tone"), ("P3", "Ref")]
    assert full.sections["startup"] == 5 and full.dropped == 0
    # Too little room for the long P0: it is left out whole (never cut), and the records
    # after it still get theirs; P0 and P1 rank above the latest episode, P2 below it.
    small = render_context(inputs, 300, NOW)
    root = parse(small.xml)
    assert [r.get("title") for r in root.iter("Record")] == ["Soul", "Rules"]
    assert texts(root, "Episode") == ["latest"] and texts(root, "Fact") == []
    assert small.chars <= 300 and small.dropped == 5


def test_known_facts_rank_above_the_users_memory_and_own_facts_below_its_directives():
    inputs = ContextInputs(
        users=[UserContext("alice", [directive("Call me Al.", "alice")], "Alice, a nurse.")],
        facts=[FactItem("alice lives in Lyon", "Lyon", NOW - timedelta(days=3)),
               FactItem("alice works at Deloitte", "alice", None, own=True)],
        facts_as_of=NOW,
    )
    full = parse(render_context(inputs, 10_000, NOW).xml)
    [known] = full.iter("KnownFacts")
    assert known.get("as_of") == "2024-06-01 12:00"
    assert [(f.text, f.get("about"), f.get("valid_at")) for f in known] == [
        ("alice lives in Lyon", "Lyon", "2024-05-29 12:00"), ("alice works at Deloitte", "alice", None)]
    # The share (a fifth of 800) holds the container and the query's fact, not the user's own.
    tight = render_context(inputs, 800, NOW)
    assert "alice lives in Lyon" in tight.xml and "Alice, a nurse." in tight.xml
    assert "Deloitte" not in tight.xml and tight.sections["facts"] == 1
    # A fact longer than its share is left out whole, never cut.
    long = ContextInputs(facts=[FactItem("x" * 500, "X")])
    assert "xxx" not in render_context(long, 2_000, NOW).xml


def relevant(text: str, score: float, kind: str = "message") -> RelevantItem:
    return RelevantItem(MemoryKind(kind), NOW, text, score=score, terms=("seat",))


def test_relevant_memories_share_the_budget_by_score_and_short_ones_leave_room_to_the_next():
    long = "I asked about the seat again and " + "then talked about other things " * 20
    inputs = ContextInputs(relevant=[relevant(f"{i} {long}", score) for i, score in enumerate((1.0, 0.8, 0.5, 0.2))],
                           asked=True)
    shown = texts(parse(render_context(inputs, 1200, NOW).xml), "Memory")
    lengths = [len(t) for t in shown]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert all("seat" in t for t in shown)  # each cut keeps the query's word
    # A short item takes only what it needs: the next gets the rest of its share.
    short = ContextInputs(relevant=[relevant("The seat is 14C.", 1.0), relevant(f"x {long}", 0.2)], asked=True)
    alone = ContextInputs(relevant=[relevant("other words", 1.0), relevant(f"x {long}", 0.2)], asked=True)
    assert len(texts(parse(render_context(short, 900, NOW).xml), "Memory")[1]) > \
        len(texts(parse(render_context(ContextInputs(relevant=[relevant("The seat is 14C. " * 8, 1.0),
                                                                relevant(f"x {long}", 0.2)], asked=True),
                                          900, NOW).xml), "Memory")[1])
    assert texts(parse(render_context(alone, 900, NOW).xml), "Memory")[0] == "other words"


def test_with_a_query_relevant_memories_come_before_the_background():
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact("a shard fact about nothing asked")], consolidated="summary " * 20)],
        users=[UserContext("u", directives=[directive("Always answer briefly.")], consolidated="Use metric units.")],
        episodes=[episode("the latest episode " * 5)],
        relevant=[relevant("The window seat is 14C.", 1.0), relevant("Aisle seats are for long flights.", 0.9)],
        asked=True,
    )
    root = parse(render_context(inputs, 480, NOW).xml)
    assert texts(root, "Memory") == ["The window seat is 14C.", "Aisle seats are for long flights."]
    # How to act (the user's directives, and their consolidation) comes before everything.
    assert texts(root, "Directive") == ["Always answer briefly."]
    assert texts(root, "ConsolidatedMemory") == ["Use metric units."]
    assert root.find("CollectiveMemory") is None and root.find(".//Episode") is None
    # Without a query the same inputs keep the recency order: the latest episode first.
    recent = parse(render_context(replace(inputs, asked=False), 480, NOW).xml)
    assert texts(recent, "Episode")


def test_each_sentence_is_shown_once_and_the_other_forms_are_named():
    said = "I prefer aisle seats on long flights."
    inputs = ContextInputs(
        users=[UserContext("u", directives=[directive(said)])],
        episodes=[episode(f"We talked about trains. {said} Then we said goodbye to everyone.")],
        relevant=[relevant(f"alice: {said}", 1.0), relevant(f"alice: {said}", 0.5, "fact")],
        asked=True,
    )
    rendered = render_context(inputs, 10_000, NOW)
    assert rendered.xml.count("aisle seats on long flights") == 1
    root = parse(rendered.xml)
    (kept,) = root.iter("Directive")
    assert set(kept.get("also").split()) == {"message", "fact"}
    # The episode keeps what it says beyond the repeated sentence.
    (episode_text,) = texts(root, "Episode")
    assert "We talked about trains." in episode_text and "goodbye" in episode_text and "…" in episode_text
    assert rendered.left_out["duplicate"] == 2
    # Short sentences are never duplicates ("Thanks!" said twice).
    thanks = render_context(ContextInputs(relevant=[relevant("Thanks!", 1.0), relevant("Thanks!", 0.9)], asked=True),
                            1000, NOW)
    assert texts(parse(thanks.xml), "Memory") == ["Thanks!", "Thanks!"]


def test_a_duplicate_folded_into_a_fact_keeps_the_facts_within_their_share():
    """The ``also`` a duplicate adds to the fact showing it counts against the facts' share
    (found by hypothesis: a directive repeating a fact grew <KnownFacts> past a fifth)."""
    said = "Alice sits in seat 14C on every flight."
    for budget in range(300, 1400, 7):
        facts = [FactItem(said, "alice")] + [FactItem(f"fact number {i} says little", "alice") for i in range(4)]
        inputs = ContextInputs(facts=facts, users=[UserContext("u", directives=[directive(said)])])
        rendered = render_context(inputs, budget, NOW)
        known = re.search(r" *<KnownFacts.*</KnownFacts>\n", rendered.xml, re.S)
        assert known is None or len(known.group(0)) <= budget * FACTS_SHARE, budget
        assert rendered.xml.count(said) <= 1
