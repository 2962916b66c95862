"""Fair across agents: one agent's requests cannot take another's share of a process's
admission slots (memory_service/http/overload.py), a large batch is written to the store in
bounded statements (memory_service/ingest/group_commit.py), a batch works in steps that give
way to other agents' requests, one step at a time in a process (memory_service/ingest/pacing.py),
and a batch's 503 cut short says which of its items were recorded (memory_service/ingest/batch.py,
``BatchProgress``).

The servers are real, on loopback. A request holds its admission slot while its body is
still arriving, so the tests hold slots by sending a request's headers and keeping its body
back, with no store stalled and no timing claimed.
"""

from __future__ import annotations

import asyncio

import httpx

from memory_service.backends.loopback import LoopbackServer
from memory_service.http.app import create_app
from memory_service.runtime import open_service

from .conftest import flush, suite_settings
from .test_access import OPERATOR, OPERATOR_KEY, bearer, make_key
from .test_overload import HANG, guard, own_graph  # noqa: F401  (own_graph: a fixture)


def item(agent_user: str, session: str, i: int, content: str = "I prefer window seats.") -> dict:
    return {"session_id": session, "user_id": agent_user, "role": "user", "content": content, "message_id": f"m{i}"}


async def test_an_agent_holding_all_its_slots_does_not_keep_another_agent_out(falkordb_url):
    """A pool of 4, a share of 2 per agent. Agent A sends 4 batches whose bodies it keeps
    back: 2 are admitted and hold A's share, the other 2 wait. A's next request is refused
    for A's share (not for a full pool), also when its path names agent B; agent B is
    admitted at once. Once A's bodies arrive, its 2 admitted batches are recorded and the 2
    that waited past the queue timeout were refused with nothing recorded."""
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              api_max_concurrent_requests=4, api_max_concurrent_per_agent=2,
                              api_queue_timeout_seconds=0.3, store_stall_seconds=60)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG, limits=httpx.Limits(max_connections=20)) as http:
        for agent in ("A", "B"):
            assert (await http.put(f"/v1/agents/{agent}", json={}, headers=OPERATOR)).status_code == 200
        key_a = bearer((await make_key(http, OPERATOR, role="write", agents=["A"]))["key"])
        key_b = bearer((await make_key(http, OPERATOR, role="write", agents=["B"]))["key"])
        release = asyncio.Event()

        def held_body(i: int):
            async def body():
                await release.wait()
                yield httpx.Response(200, json={"messages": [item("alice", f"s{i}", i)]}).content
            return body()

        holders = [asyncio.create_task(http.post("/v1/agents/A/messages/batch", content=held_body(i),
                                                 headers={**key_a, "content-type": "application/json"}))
                   for i in range(4)]
        # Until A's share is taken: A's probe waits behind it, then is refused for its share.
        for _ in range(int(HANG / 0.3)):
            probe = await guard(http.get("/v1/agents/A", headers=key_a))
            if probe.status_code == 503:
                break
        assert probe.status_code == 503 and probe.headers["retry-after"], probe.text
        assert probe.json()["detail"].startswith("this agent's share of the service is in use (2 of its requests"), \
            probe.json()
        # A's key naming agent B is still A's: refused for A's share, not admitted as B.
        spoof = await guard(http.get("/v1/agents/B/sessions", headers=key_a))
        assert spoof.status_code == 503 and "this agent's share" in spoof.json()["detail"]
        # B is admitted while A holds its share: a read, and a batch recorded.
        assert (await guard(http.get("/v1/agents/B", headers=key_b))).status_code == 200
        recorded = await guard(http.post("/v1/agents/B/messages/batch", headers=key_b,
                                         json={"messages": [item("bob", "b1", 1)]}))
        assert recorded.status_code == 200 and recorded.json()["recorded"] == 1, recorded.text
        release.set()
        answers = [await guard(task) for task in holders]
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 200, 503, 503], [a.text for a in answers]
        for answer in answers:
            if answer.status_code == 503:
                assert "nothing of this request was done" in answer.json()["detail"]
                assert set(answer.json()) == {"detail", "retry_after"}  # refused at admission: no items
        sessions = (await http.get("/v1/agents/A/sessions", headers=key_a)).json()["sessions"]
        assert len(sessions) == 2  # the two admitted batches, nothing of the refused ones


async def test_freed_slots_go_to_the_waiting_agent_holding_fewest_in_turn():
    """The fair queue's order: within an agent first come, first served; across agents the
    one holding the fewest first, in turn among equals; an agent at its share waits while
    the pool has room."""
    from memory_service.http.overload import FairSlots

    slots = FairSlots(limit=3, per_lane=2)
    order: list[str] = []

    async def one(lane: str, name: str) -> None:
        await slots.acquire(lane)
        order.append(name)

    for lane in ("A", "A"):
        await slots.acquire(lane)  # A holds its share of 2; one slot of the pool is free
    tasks = [asyncio.create_task(one(lane, name)) for lane, name in
             (("A", "a1"), ("A", "a2"), ("B", "b1"), ("C", "c1"), ("B", "b2"), ("C", "c2"))]
    await asyncio.sleep(0)
    assert order == ["b1"]  # A waits at its share though the pool had room; B takes the free slot
    assert slots.waiting("A") == 2 and slots.waiting("C") == 2
    slots.release("A")  # A holds 1, B 1, C 0: C first
    await asyncio.sleep(0)
    assert order == ["b1", "c1"]
    slots.release("B")  # A 1, B 0, C 1: B next
    await asyncio.sleep(0)
    assert order == ["b1", "c1", "b2"]
    slots.release("C")  # A 1, B 1, C 0: C
    await asyncio.sleep(0)
    slots.release("B")  # A 1, B 0 (none waiting), C 1: A, its first
    await asyncio.sleep(0)
    assert order == ["b1", "c1", "b2", "c2", "a1"]
    assert slots.held == 3 and slots.holding("A") == 2
    slots.release("C")  # A at its share again: a2 waits, the slot stays free
    await asyncio.sleep(0)
    assert order[-1] == "a1" and slots.held == 2
    slots.release("A")
    await asyncio.sleep(0)
    assert order[-1] == "a2"
    await asyncio.gather(*tasks)
    # A waiter that gives up leaves the queue and takes nothing.
    waiting = asyncio.create_task(slots.acquire("A"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert slots.waiting("A") == 0 and slots.holding("A") == 2
    # One that gave up (its wait cancelled) as a slot was handed on, before it ran again, is
    # skipped: the slot stays free.
    full = FairSlots(limit=1)
    await full.acquire("A")
    late = asyncio.create_task(full.acquire("B"))
    await asyncio.sleep(0)
    late.cancel()
    full.release("A")
    await asyncio.gather(late, return_exceptions=True)
    assert full.held == 0 and full.waiting("B") == 0


async def test_a_large_batch_is_written_in_bounded_statements(settings):
    """STORE_WRITE_MAX_CHARS of 10,000: a batch of 20 messages of 2,000 characters is 4 or
    more statements of at most 10,000 characters each, one at a time, and all recorded."""
    settings = settings.model_copy(update={"store_write_max_chars": 10_000, "store_write_max_rows": 256})
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.put("/v1/agents/a1", json={})).status_code == 200
        _, backend = await service.agents.backend_for("a1")
        statements: list[tuple[int, int]] = []
        in_flight = 0
        write = backend.write

        async def watched(memories):
            nonlocal in_flight
            in_flight += 1
            statements.append((len(memories), sum(len(m.content) for m in memories)))
            assert in_flight == 1, "two statements of one agent at once"
            try:
                return await write(memories)
            finally:
                in_flight -= 1

        backend.write = watched
        body = {"messages": [item("alice", f"s{i % 3}", i, f"{i:04d} " + "window seat " * 166) for i in range(20)]}
        answer = await http.post("/v1/agents/a1/messages/batch", json=body)
        assert answer.status_code == 200 and answer.json()["recorded"] == 20, answer.text
        assert sum(rows for rows, _ in statements) == 20
        assert len(statements) >= 4 and all(chars <= 10_000 for _, chars in statements), statements


async def test_a_batch_cut_short_by_a_frozen_store_says_what_was_recorded(settings, own_graph):  # noqa: F811
    """The graph freezes while a batch is written: the stall guard answers 503, and the
    answer lists every item: the one recorded before (duplicate, with its sequence), the
    refused one, and the rest failed, saying they may have reached the store. Sent again
    once the store answers, the batch records them."""
    settings = settings.model_copy(update={"falkordb_url": own_graph.url, "redis_url": settings.falkordb_url,
                                           "store_read_timeout_seconds": 30})
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        first = await http.post("/v1/agents/a1/messages/batch", json={"messages": [item("alice", "s1", 0)]})
        assert first.status_code == 200 and first.json()["recorded"] == 1
        batch = {"messages": [item("alice", "s1", 0), {"session_id": "s1", "message_id": "bad"},
                              item("alice", "s1", 2), item("alice", "s2", 3, "Aisle seats on short flights.")]}
        own_graph.stall()
        try:
            cut = await guard(http.post("/v1/agents/a1/messages/batch", json=batch))
        finally:
            own_graph.resume()
        assert cut.status_code == 503 and cut.headers["retry-after"], cut.text
        body = cut.json()
        assert body["detail"] == "the graph store does not answer; try again shortly"
        assert (body["recorded"], body["duplicate"], body["refused"], body["failed"]) == (0, 1, 1, 2), body
        items = body["items"]
        assert [i["status"] for i in items] == ["duplicate", "refused", "failed", "failed"]
        assert items[0]["sequence"] == 1 and items[1]["code"] == 422
        for failed in items[2:]:
            assert failed["code"] == 503 and "it may have been stored" in failed["detail"]
            assert "send it again with the same message_id" in failed["detail"]
        again = await guard(http.post("/v1/agents/a1/messages/batch", json=batch))
        assert again.status_code == 200, again.text
        assert [i["status"] for i in again.json()["items"]][2:] in (["recorded", "recorded"],
                                                                    ["duplicate", "duplicate"],
                                                                    ["recorded", "duplicate"],
                                                                    ["duplicate", "recorded"])


async def test_a_batch_gives_way_while_another_agents_request_is_in_flight(falkordb_url):
    """Pacing (memory_service/ingest/pacing.py): agent B's record is admitted and in flight
    (its body kept back), and agent A's batch waits between its steps meanwhile
    (API_BULK_PAUSE_SECONDS of 60: far longer than the test looks), though A's own requests
    that are not batches are answered; once B's record is answered, A's batch goes on and
    records all its items. A's own request in flight does not hold A's batch back, and with a
    short pause a batch goes on, a step at a time, even while B's request stays."""
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              api_max_concurrent_requests=8, api_max_concurrent_per_agent=2,
                              api_queue_timeout_seconds=0.3, store_stall_seconds=60, api_bulk_pause_seconds=60,
                              batch_step_messages=4)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG, limits=httpx.Limits(max_connections=20)) as http:
        for agent in ("A", "B"):
            assert (await http.put(f"/v1/agents/{agent}", json={}, headers=OPERATOR)).status_code == 200
        keys = {agent: bearer((await make_key(http, OPERATOR, role="write", agents=[agent]))["key"])
                for agent in ("A", "B")}

        async def hold(agent: str, session: str) -> list[tuple[asyncio.Event, asyncio.Task]]:
            """Two records of ``agent`` admitted (its share), their bodies kept back: in flight
            until their events are set."""
            held = []
            for n in range(2):
                release = asyncio.Event()

                async def content(release=release, n=n):
                    await release.wait()
                    yield httpx.Response(200, json={"agent_id": agent, "user_id": "bob", "role": "user",
                                                    "content": "I like tea.", "message_id": f"{session}-{n}"}).content

                held.append((release, asyncio.create_task(http.post(
                    f"/v1/sessions/{session}/messages", content=content(),
                    headers={**keys[agent], "content-type": "application/json"}))))
            for _ in range(int(HANG / 0.3)):  # until both hold a slot: the agent's next request waits, refused
                probe = await guard(http.get(f"/v1/agents/{agent}", headers=keys[agent]))
                if probe.status_code == 503:
                    return held
            raise AssertionError("the held records were not admitted")

        async def answered(held: tuple[asyncio.Event, asyncio.Task]) -> None:
            held[0].set()
            assert (await guard(held[1])).status_code == 200

        def batch(session: str) -> dict:
            return {"messages": [item("alice", session, i) for i in range(20)]}

        # B's record in flight: A's batch does not finish; A's reads are answered meanwhile.
        first, second = await hold("B", "sb")
        await answered(first)
        paced = asyncio.create_task(http.post("/v1/agents/A/messages/batch", headers=keys["A"], json=batch("sa")))
        done, _ = await asyncio.wait({paced}, timeout=3)
        assert not done, "A's batch went on while B's request was in flight"
        assert (await guard(http.get("/v1/agents/A", headers=keys["A"]))).status_code == 200
        await answered(second)
        answer = await guard(paced)
        assert answer.status_code == 200 and answer.json()["recorded"] == 20, answer.text

        # A's own record in flight does not hold A's batch back.
        first, second = await hold("A", "sa2")
        await answered(first)
        answer = await guard(http.post("/v1/agents/A/messages/batch", headers=keys["A"], json=batch("sa3")))
        assert answer.status_code == 200 and answer.json()["recorded"] == 20, answer.text
        await answered(second)

    # A pause of 50 ms a step: the batch goes on, a step at a time, while B's request stays.
    settings = settings.model_copy(update={"api_bulk_pause_seconds": 0.05})
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG, limits=httpx.Limits(max_connections=20)) as http:
        first, second = await hold("B", "sb2")
        await answered(first)
        answer = await guard(http.post("/v1/agents/A/messages/batch", headers=keys["A"], json=batch("sa4")))
        assert answer.status_code == 200 and answer.json()["recorded"] == 20, answer.text
        await answered(second)


async def test_batches_of_several_agents_run_one_step_at_a_time(settings):
    """API_BULK_STEPS_AT_ONCE of 1: two agents' batches sent at once both record every item,
    and their store writes (one agent's lane each, which could overlap) never overlap: the
    process runs one step of bulk work at a time, whoever's."""
    settings = settings.model_copy(update={"batch_step_messages": 4, "api_bulk_steps_at_once": 1})
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        for agent in ("a1", "a2"):
            assert (await http.put(f"/v1/agents/{agent}", json={})).status_code == 200
        _, backend = await service.agents.backend_for("a1")
        assert (await service.agents.backend_for("a2"))[1] is backend
        in_flight, most = 0, 0
        write = backend.write

        async def watched(memories):
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                await asyncio.sleep(0.01)  # a slow store: a second write would start meanwhile
                return await write(memories)
            finally:
                in_flight -= 1

        backend.write = watched
        answers = await asyncio.gather(*(http.post(f"/v1/agents/{agent}/messages/batch", json={
            "messages": [item("alice", f"{agent}-s", i) for i in range(40)]}) for agent in ("a1", "a2")))
        for answer in answers:
            assert answer.status_code == 200 and answer.json()["recorded"] == 40, answer.text
        assert most == 1, f"{most} store writes of batches at once"


def test_bulk_steps_hold_a_bounded_count_and_size():
    """``pacing.steps``: at most n items and c characters a step, in order; an item larger
    than c is a step alone."""
    from memory_service.ingest.pacing import steps

    sizes = [3, 3, 3, 10, 1, 1, 1, 1, 1, 4]
    parts = steps(sizes, 3, 6, lambda n: n)
    assert [sizes[p] for p in parts] == [[3, 3], [3], [10], [1, 1, 1], [1, 1, 4]]
    assert steps([], 3, 6, lambda n: n) == []


async def test_bulk_steps_rest_for_their_share_while_another_agent_is_active(monkeypatch):
    """The bulk share (API_BULK_SHARE, memory_service/ingest/pacing.py): after a step, while
    another agent is active (a request in flight, or ended within ACTIVE_SECONDS), the step
    rests (1 - share) / share times what it took, at most the pause bound, holding its
    place: the next step starts after the rest. The agent's own requests, or none, never
    make it rest, nor a share of 1."""
    from memory_service.ingest import pacing
    from memory_service.state import metrics

    half = pacing.Pacing(max_pause=5, steps_at_once=1, share=0.5)
    assert half.rest_for("A", 0.2) == 0  # nobody else about
    with half.interactive("B"):
        assert half.rest_for("A", 0.2) == 0.2  # half the time: as long as it took
        assert half.rest_for("B", 0.2) == 0  # its own requests do not count
        assert half.rest_for("A", 60) == 5  # at most the pause bound
    for share, rest in ((1.0, 0.0), (0.25, 0.6)):
        other = pacing.Pacing(max_pause=5, steps_at_once=1, share=share)
        with other.interactive("B"):
            assert abs(other.rest_for("A", 0.2) - rest) < 1e-9, share
    assert half.rest_for("A", 0.2) == 0.2  # B's request just ended: still active
    monkeypatch.setattr(pacing, "ACTIVE_SECONDS", 0.0)
    await asyncio.sleep(0.001)
    assert half.rest_for("A", 0.2) == 0  # B's last request is past the window

    # Two steps of A's batches while B is active: the second starts after the first's rest.
    monkeypatch.setattr(pacing, "ACTIVE_SECONDS", 60.0)
    paced = pacing.Pacing(max_pause=5, steps_at_once=1, share=0.5)
    with paced.interactive("B"):
        pass  # B was seen just now
    seen: list[tuple[str, float]] = []

    async def batch(name: str) -> None:
        with paced.bulk("A"):
            async with pacing.step():
                seen.append((name, metrics.BULK_PAUSE_SECONDS._value.get()))
                await asyncio.sleep(0.02)

    before = metrics.BULK_PAUSE_SECONDS._value.get()
    await asyncio.gather(batch("first"), batch("second"))
    (_, at_first), (_, at_second) = seen
    assert at_first == before
    assert at_second - at_first >= 0.02 * 0.9  # the first step's rest was over before the second began
