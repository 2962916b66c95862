"""How the memory block picks its relevant memories (issue 17): a relevance threshold, top_k
and scope per agent, per context type and per call; what was left out and why; each thing
shown once. Real HTTP on loopback, embedded FalkorDB, the hash embedder."""

from __future__ import annotations

from xml.etree import ElementTree as ET

import pytest

from .helpers import wait_embedding_idle

AGENT = "recall-agent"
SEAT = [
    ("alice", "Hi there! How are you today?"),
    ("alice", "I prefer aisle seats on long flights."),
    ("alice", "My favourite aisle seat is 14C on the night flight."),
    ("alice", "Sounds good. Ok thanks, bye!"),
]


async def record(http, session: str, lines, prefix: str = "m") -> None:
    for i, (user, text) in enumerate(lines):
        r = await http.post(f"/v1/sessions/{session}/messages", json={
            "agent_id": AGENT, "user_id": user, "role": "user", "content": text, "message_id": f"{prefix}{i}"})
        assert r.status_code in (200, 201, 202), r.text


async def context(http, **params):
    r = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1",
                                              "query": "which seat do I prefer on flights", **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return body, [m.text or "" for m in ET.fromstring(body["xml"]).iter("Memory")]


@pytest.fixture
async def seats(http, falkordb_url):
    await record(http, "s1", SEAT)
    await record(http, "s2", [("alice", "On the train I always want a window seat facing forward.")], prefix="t")
    await wait_embedding_idle(falkordb_url, AGENT)
    return http


async def test_the_server_defaults_and_a_threshold_turned_off(seats):
    body, memories = await context(seats, scope="user", budget=4000)
    assert body["recall"] == {"min_score": None, "min_similarity": 0.3, "top_k": 40, "scope": "user", "host_window": 0}
    assert any("aisle" in m for m in memories)
    assert not any("Sounds good" in m for m in memories)  # no word of the query, dissimilar: left out
    everything, shown = await context(seats, scope="user", budget=4000, min_similarity=-1)
    assert everything["left_out"]["below_threshold"] == 0
    assert len(shown) > len(memories)


async def test_min_similarity_leaves_out_what_only_the_vector_signal_found(seats):
    everything, shown = await context(seats, min_similarity=-1)
    only_vector = [m for m in shown if "seat" not in m]  # pleasantries: no word of the query
    assert only_vector, "the vector signal makes every memory a candidate"
    body, memories = await context(seats, min_similarity=0.99)
    assert not any(m in memories for m in only_vector)
    assert any("aisle seats" in m for m in memories)  # full-text matches stay
    assert body["left_out"]["below_threshold"] >= len(only_vector)
    assert body["recall"]["min_similarity"] == 0.99


async def test_min_score_is_a_ceiling_not_a_target(seats):
    full, everything = await context(seats, min_similarity=-1)
    body, memories = await context(seats, min_score=1.0, min_similarity=-1)
    assert len(memories) < len(everything)
    assert body["chars"] < full["chars"]
    assert body["left_out"]["below_threshold"] > 0


async def test_top_k_and_scope_per_call(seats):
    _, one = await context(seats, top_k=1)
    assert len(one) == 1
    _, session_only = await context(seats, scope="session")
    _, users = await context(seats, scope="user")
    assert not any("train" in m for m in session_only)
    assert any("train" in m for m in users)


async def test_agent_settings_and_context_types_and_the_call_override_in_that_order(seats):
    r = await seats.put(f"/v1/agents/{AGENT}", json={"context": {"top_k": 2, "scope": "user",
                                                                 "types": {"task": {"top_k": 1}}}})
    assert r.status_code == 200, r.text
    assert r.json()["context"]["types"]["task"]["top_k"] == 1
    body, memories = await context(seats)
    assert len(memories) == 2 and body["recall"]["top_k"] == 2 and body["recall"]["scope"] == "user"
    body, memories = await context(seats, context_type="task")
    assert len(memories) == 1 and body["context_type"] == "task"
    body, memories = await context(seats, context_type="task", top_k=3)
    assert len(memories) == 3 and body["recall"]["scope"] == "user"
    body, memories = await context(seats, context_type="document")  # no settings of its own: the agent's
    assert len(memories) == 2


@pytest.mark.parametrize("params, word", [
    ({"min_score": 2}, "min_score"), ({"min_score": -0.1}, "min_score"), ({"min_similarity": 1.5}, "min_similarity"),
    ({"top_k": -1}, "top_k"), ({"top_k": 100_000}, "top_k"), ({"scope": "everyone"}, "scope"),
    ({"context_type": "poem"}, "context_type"), ({"min_score": "nan"}, "min_score"),
    ({"host_window": -1}, "host_window"), ({"host_window": 1001}, "host_window"), ({"host_window": 10**30}, "host_window"),
    ({"host_window": 1.5}, "host_window"), ({"host_window": "all"}, "host_window"),
])
async def test_bad_recall_parameters_are_refused(seats, params, word):
    r = await seats.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1", **params})
    assert r.status_code == 422 and word in r.text


@pytest.mark.parametrize("context", [
    {"min_score": 5}, {"top_k": -2}, {"scope": "galaxy"}, {"types": {"poem": {"top_k": 1}}},
    {"types": {"task": {"top_k": 1, "colour": "red"}}}, {"threshold": 0.5},
    {"host_window": -3}, {"host_window": 5000}, {"host_window": 2.5}, {"host_window": "last ten"},
    {"types": {"chat": {"host_window": -1}}},
])
async def test_bad_agent_recall_settings_are_refused_and_change_nothing(seats, context):
    good = await seats.put(f"/v1/agents/{AGENT}", json={"context": {"top_k": 3}})
    assert good.status_code == 200
    r = await seats.put(f"/v1/agents/{AGENT}", json={"context": context})
    assert r.status_code == 422, r.text
    assert (await seats.get(f"/v1/agents/{AGENT}")).json()["context"]["top_k"] == 3


async def test_the_hosts_window_is_left_out_of_the_relevant_memories(seats):
    """The session's latest messages that the host sends the model itself (per call, the
    agent's setting, its context type's) are not shown again; older ones and other sessions'
    are; and nothing else of the block changes."""
    def aisle(memories):
        return [m for m in memories if "aisle" in m]

    base, memories = await context(seats, scope="user", budget=4000)
    assert len(aisle(memories)) == 2 and any("train" in m for m in memories)
    # The last three of s1's four messages are in the host's prompt: both aisle ones left out.
    body, windowed = await context(seats, scope="user", budget=4000, host_window=3)
    assert aisle(windowed) == [] and any("train" in m for m in windowed), windowed
    assert body["recall"]["host_window"] == 3
    assert {k: v for k, v in body["sections"].items() if k != "relevant"} == \
        {k: v for k, v in base["sections"].items() if k != "relevant"}
    # A window of the last message only: the older aisle messages come back.
    _, last_only = await context(seats, scope="user", budget=4000, host_window=1)
    assert len(aisle(last_only)) == 2
    # The agent's setting, its context type's, and the call's over them.
    r = await seats.put(f"/v1/agents/{AGENT}", json={"context": {"host_window": 3, "types": {"task": {"host_window": 0}}}})
    assert r.status_code == 200 and r.json()["context"]["host_window"] == 3, r.text
    body, memories = await context(seats, scope="user", budget=4000)
    assert aisle(memories) == [] and body["recall"]["host_window"] == 3
    _, memories = await context(seats, scope="user", budget=4000, context_type="task")
    assert len(aisle(memories)) == 2
    _, memories = await context(seats, scope="user", budget=4000, host_window=0)
    assert len(aisle(memories)) == 2


async def test_a_question_from_a_new_session_is_unaffected_by_the_window(seats):
    """The harness's case: the question is asked from a session with no messages of its own."""
    params = {"session_id": "fresh", "scope": "user", "budget": 4000}
    plain, memories = await context(seats, **params)
    windowed, same = await context(seats, **params, host_window=50)
    assert same == memories and len([m for m in same if "aisle" in m]) == 2
    assert windowed["xml"] == plain["xml"]


async def test_a_sentence_said_in_several_forms_is_shown_once(http, falkordb_url):
    lines = [("alice", "Please always book me an aisle seat near the front."),
             ("alice", "The aisle seat matters because of my knee."), ("alice", "Thanks!")]
    await record(http, "s1", lines)
    formed = await http.post("/v1/sessions/s1/form")
    assert formed.status_code in (200, 202), formed.text
    await wait_embedding_idle(falkordb_url, AGENT)
    body, _ = await context(http, query="book an aisle seat")
    xml = body["xml"]
    assert xml.count("always book me an aisle seat near the front") == 1
    # It was a message, a directive and part of the episode: the other forms left out, named.
    assert body["left_out"]["duplicate"] >= 1
    assert 'also="' in xml


async def test_a_formed_session_keeps_its_conversation_section_beside_the_memories_that_repeat_it(http, falkordb_url):
    """A 9-message session formed with POST /form: its block, with a query its messages
    answer, shows <CurrentConversationContext> (the relevant memories repeat the episode's
    sentences; the episode is kept, and a message it shows whole is folded into it)."""
    lines = [("alice", "We are planning the trip to Lisbon for the first week of May."),
             ("alice", "I want the aisle seat 14C on the night flight to Lisbon."),
             ("alice", "Bob is coming with me and he prefers the window."),
             ("alice", "We booked the hotel near the river in Lisbon."),
             ("alice", "The hotel has a rooftop pool and a late breakfast."),
             ("alice", "Can you check the train from the airport to the hotel?"),
             ("alice", "We land at seven in the morning on the night flight."),
             ("alice", "Bob wants to visit the tile museum on the second day."),
             ("alice", "Thanks, that is all for the flight and the hotel.")]
    await record(http, "s1", lines)
    formed = await http.post("/v1/sessions/s1/form")
    assert formed.status_code in (200, 202), formed.text
    await wait_embedding_idle(falkordb_url, AGENT)
    for budget in (1000, 4000):
        body, memories = await context(http, query="the night flight and the hotel in Lisbon", budget=budget)
        root = ET.fromstring(body["xml"])
        assert [e.tag for e in root if e.tag == "CurrentConversationContext"], body["xml"]
        assert root.find("CurrentConversationContext/Episode").text
    assert memories  # and the memories that match the query beside it
