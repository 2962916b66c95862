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
    ALLOWANCE_SHARE,
    FACTS_SHARE,
    MIN_BUDGET_CHARS,
    WHOLE_CHARS,
    ContextInputs,
    FactItem,
    RelevantItem,
    ShardContext,
    StartupItem,
    UserContext,
    age,
    budget_for_model,
    clean,
    passage,
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


def test_a_short_relevant_memory_is_whole_or_left_out_and_a_long_one_shows_its_passage():
    # Short ones (up to WHOLE_CHARS) are never cut: one that does not fit leaves the room to
    # a shorter one after it.
    first, second, third = ("The seat is 14C, by the window. " * 6).strip(), "The seat costs 40 euros extra. " * 9, "Seat 14C."
    inputs = ContextInputs(relevant=[relevant(first, 1.0), relevant(second, 0.9), relevant(third, 0.8)], asked=True)
    shown = texts(parse(render_context(inputs, 600, NOW).xml), "Memory")
    assert shown == [first, third]
    # A long one shows the sentences around the query's word, whole, with its neighbours,
    # and says where it goes on.
    filler = [f"We also talked about topic number {i} for a while." for i in range(60)]
    said = "The seat I want on every flight is 14C."
    long = " ".join([*filler[:30], said, *filler[30:]])
    assert len(long) > WHOLE_CHARS
    others = [relevant(f"A seat note number {i}.", 1.0) for i in range(9)]
    cut = texts(parse(render_context(ContextInputs(relevant=[relevant(long, 1.0), *others], asked=True), 4000,
                                     NOW).xml), "Memory")[0]
    assert said in cut and cut.startswith("…We also talked") and cut.endswith("while.…")
    assert len(cut) <= 500 and "topic number 29 " in cut and "topic number 30 " in cut  # its share
    # Its passage grows with its share of a larger budget, never past the text.
    wide = texts(parse(render_context(ContextInputs(relevant=[relevant(long, 1.0), *others], asked=True), 60_000,
                                      NOW).xml), "Memory")[0]
    assert wide == long


def test_passage_keeps_whole_sentences_around_the_best_match():
    text = ("We met in May. The weather was bad. I bought a ceramic vase in Lisbon for my mother. "
            "It cost 40 euros. Then we went home.")
    assert passage(text, ("vase", "lisbon"), 60) == "…I bought a ceramic vase in Lisbon for my mother.…"
    assert passage(text, ("vase", "lisbon"), 90) == ("…The weather was bad. I bought a ceramic vase in Lisbon for "
                                                     "my mother. It cost 40 euros.…")
    assert passage(text, ("vase",), 1000) == text
    # A sentence longer than the room is cut around the word.
    assert "vase" in passage(text, ("vase",), 30) and len(passage(text, ("vase",), 30)) <= 30


def test_with_a_query_the_background_is_kept_within_its_allowance_and_the_rest_competes_after():
    directives = [directive(f"Always mention the rule number {i} when it applies.") for i in range(12)]
    inputs = ContextInputs(
        shards=[ShardContext("t", "Topic", facts=[fact("a shard fact about nothing asked")], consolidated="summary " * 20)],
        users=[UserContext("u", directives=directives, consolidated="Use metric units.")],
        episodes=[episode("We talked about the trip to Lisbon and the seats.")],
        relevant=[relevant(f"The window seat number {i} is by the wing.", 1.0 - i / 100) for i in range(40)],
        asked=True,
    )
    budget = 4000
    root = parse(render_context(inputs, budget, NOW).xml)
    # The conversation's episode is there, and how to act, but only within the allowance:
    # the relevant memories get the rest.
    assert texts(root, "Episode") == ["We talked about the trip to Lisbon and the seats."]
    assert texts(root, "ConsolidatedMemory") == ["Use metric units."]
    user = ET.tostring(root.find("UserMemory"), encoding="unicode")
    conversation = ET.tostring(root.find("CurrentConversationContext"), encoding="unicode")
    assert len(user) + len(conversation) <= budget * ALLOWANCE_SHARE + 40  # + indentation
    assert 0 < len(texts(root, "Directive")) < len(directives)
    assert len(texts(root, "Memory")) >= 8 and root.find("CollectiveMemory") is None
    # With few relevant memories, the background left out of the allowance comes back.
    few = parse(render_context(replace(inputs, relevant=inputs.relevant[:2]), budget, NOW).xml)
    assert len(texts(few, "Directive")) == len(directives) and len(texts(few, "Memory")) == 2
    # Without a query the same inputs keep the recency order: the latest episode first.
    recent = parse(render_context(replace(inputs, asked=False), budget, NOW).xml)
    assert texts(recent, "Episode")


def test_the_latest_episode_is_there_when_the_relevant_memories_repeat_it():
    said = ["Alice booked the flight to Lisbon for May.", "She wants the window seat 14C.", "Bob comes along too."]
    inputs = ContextInputs(episodes=[episode(" ".join(said))], asked=True,
                           relevant=[relevant(f"alice: {s}", 1.0) for s in said])
    root = parse(render_context(inputs, 2000, NOW).xml)
    assert texts(root, "Episode") == [" ".join(said)]
    # A message the episode shows whole is left out, its form named on the episode.
    assert texts(root, "Memory") == []
    (kept,) = root.iter("Episode")
    assert kept.get("also") == "message"
    # Shortened, never dropped, when the allowance is smaller than the episode.
    long = episode(" ".join(f"Then we talked about the {n} part of the plan." for n in ("first", "second", "third",
                                                                                         "fourth", "fifth", "sixth")))
    tight = parse(render_context(ContextInputs(episodes=[long], asked=True,
                                               relevant=[relevant("other words " * 30, 1.0)]), 1000, NOW).xml)
    (short,) = texts(tight, "Episode")
    assert short.endswith("…") and short.startswith("Then we talked about the first part")


def test_a_message_is_never_split_across_elements():
    """The episode shows the message's first sentence: the message is still shown whole."""
    first, rest = "I've got tickets to see the Jonas Brothers on July 17th.", "Then The Lumineers in Rhode Island."
    inputs = ContextInputs(episodes=[episode(f"u: {first} We talked about music.")], asked=True,
                           relevant=[relevant(f"u: {first} {rest}", 1.0)])
    root = parse(render_context(inputs, 2000, NOW).xml)
    assert texts(root, "Memory") == [f"u: {first} {rest}"]


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


def test_the_best_relevant_memory_is_whole_up_to_half_the_room():
    """A long answer ranked first (an assistant's reply asked about) is shown whole when it
    takes at most half the room; the same text ranked second shows its passage."""
    answer = " ".join(f"Step {i}: set the seat heater to level {i} and wait a minute." for i in range(25))
    assert WHOLE_CHARS < len(answer) < 1900
    others = [relevant(f"A seat note number {i}.", 0.9) for i in range(9)]
    first = texts(parse(render_context(ContextInputs(relevant=[relevant(answer, 1.0), *others], asked=True), 4000,
                                       NOW).xml), "Memory")
    assert first[0] == answer
    second = texts(parse(render_context(ContextInputs(relevant=[others[0], relevant(answer, 0.95), *others[1:]],
                                                      asked=True), 4000, NOW).xml), "Memory")
    assert second[1] != answer and second[1].endswith("…") and len(second[1]) <= 500
    # Longer than half the room: the best shows its passage too.
    assert texts(parse(render_context(ContextInputs(relevant=[relevant(answer, 1.0), *others], asked=True), 2500,
                                      NOW).xml), "Memory")[0] != answer
