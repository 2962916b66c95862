"""A key limited to some users sees what its users may see and nothing else, on every route
(memory_service/access/reach.py), and a hidden thing is answered exactly as a missing one.

The matrix: every route that takes a user or a session, with alice's key (admin of agent
``sec``, limited to alice), for her own session, bob's session, a session both spoke in,
a session nobody recorded in and a session of another agent. Bob's private data carries
``BOBLOCKER4411``: no answer to alice's key may hold it, hidden things get the answer
unknown ones get (with the id in it swapped for a placeholder), and a refusal changes
nothing stored. The MCP tools (`memory-service mcp`, a client of the API) are held to
the same. A real server requiring keys, real Redis and FalkorDB (no worker, so that
nothing writes on its own during a comparison).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app
from memory_service.state import keyspace

from .conftest import flush, suite_settings
from .store_state import snapshot
from .test_access import OPERATOR, OPERATOR_KEY, bearer
from .test_mcp import http_mcp, over_http, stdio
from .test_mcp import text as tool_text

AGENT, RIVAL = "sec", "rival"
SECRET = "BOBLOCKER4411"  # only bob's private data holds it
OWN, BOBS, SHARED, UNKNOWN, FOREIGN = "alice-only", "bob-only", "both", "nobody-here", "rival-s"
HIDDEN = (BOBS, UNKNOWN, FOREIGN)  # alice's key must not tell these apart


@pytest.fixture(scope="module")
async def server(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              memory_write_agents=[AGENT, RIVAL])
    app = create_app(settings, run_worker=False)
    async with LoopbackServer(app) as running:
        yield running, app


async def call(http: httpx.AsyncClient, method: str, url: str, auth: dict[str, str], ok: tuple[int, ...] = (200, 201),
               **kwargs: Any) -> dict[str, Any]:
    answer = await http.request(method, url, headers=auth, **kwargs)
    assert answer.status_code in ok, (method, url, answer.text)
    body: dict[str, Any] = answer.json()
    return body


@pytest.fixture
async def world(server, falkordb_url):
    """Agent sec with alice's and bob's data, agent rival with a session; alice's key."""
    running, app = server
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as http:
        admin = bearer((await call(http, "POST", "/v1/keys", OPERATOR,
                                   json={"name": "sec", "role": "admin", "agents": [AGENT]}))["key"])
        rival = bearer((await call(http, "POST", "/v1/keys", OPERATOR,
                                   json={"name": "rival", "role": "admin", "agents": [RIVAL]}))["key"])
        alice = bearer((await call(http, "POST", "/v1/keys", OPERATOR,
                                   json={"name": "alice", "role": "admin", "agents": [AGENT], "users": ["alice"]}))["key"])
        await call(http, "PUT", f"/v1/agents/{AGENT}", admin, json={})
        await call(http, "PUT", f"/v1/agents/{AGENT}/shards/travel", admin, json={"name": "Travel"})
        await call(http, "PUT", f"/v1/agents/{RIVAL}", rival, json={})
        for session, user, text, mid in [
            (OWN, "alice", "I like lockers painted teal.", "a1"),
            (BOBS, "bob", f"My locker code is {SECRET}.", "b1"),
            (SHARED, "alice", "Where are the lockers in Lisbon?", "s1"),
            (SHARED, "bob", "The lockers are by gate 4.", "s2"),
        ]:
            await call(http, "POST", f"/v1/sessions/{session}/messages", admin,
                       json={"agent_id": AGENT, "user_id": user, "role": "user", "content": text, "message_id": mid})
        await call(http, "POST", f"/v1/sessions/{FOREIGN}/messages", rival,
                   json={"agent_id": RIVAL, "user_id": "alice", "role": "user", "content": "Rival lockers.",
                         "message_id": "r1"})
        ids = {}
        for name, namespace, kind, text in [
            ("bob_directive", f"user:{AGENT}:bob", "directive", f"Bob's locker code is {SECRET}; never say it"),
            ("bob_episode", f"session:{BOBS}", "episode", f"Bob stored his locker code {SECRET}"),
            ("alice_directive", f"user:{AGENT}:alice", "directive", "Alice wants teal lockers"),
            ("shared_episode", f"session:{SHARED}", "episode", "Alice and Bob talked about lockers in Lisbon"),
            ("fact", f"shard:{AGENT}:travel", "fact", "Lisbon airport lockers are by gate 4"),
            ("rival_memory", f"user:{RIVAL}:alice", "observation", "Rival lockers hold RIVALNOTE"),
        ]:
            agent = RIVAL if name.startswith("rival") else AGENT
            ids[name] = (await call(http, "POST", f"/v1/agents/{agent}/memories", rival if agent == RIVAL else admin,
                                    json={"namespace": namespace, "kind": kind, "content": text}))["id"]
        # Bob's consolidated memory: made by consolidation, written here straight to the store.
        service = app.state.service
        _, backend = await service.agents.backend_for(AGENT)
        await backend.write([Memory(id="bob-consolidated", kind=MemoryKind.CONSOLIDATED,
                                    namespace=str(Namespace.user(AGENT, "bob")),
                                    content=f"Bob: keeps his locker code {SECRET}",
                                    metadata=Provenance(agent_id=AGENT, user_id="bob"))])
        await service.state.cache.bump(f"user:{AGENT}:bob")
        yield http, {"admin": admin, "alice": alice, "rival": rival}, ids


def same(answer: httpx.Response, placeholder_for: str) -> tuple[int, str]:
    """An answer with the id it names swapped for a placeholder, to compare hidden with unknown."""
    return answer.status_code, answer.text.replace(placeholder_for, "<id>")


def no_secret(answer: httpx.Response) -> None:
    assert SECRET not in answer.text and "RIVALNOTE" not in answer.text, answer.text


def context(session: str, user: str = "alice", **extra: Any) -> dict[str, Any]:
    return {"agent_id": AGENT, "user_id": user, "session_id": session, **extra}


async def test_the_memory_block_of_a_hidden_session_is_the_block_of_an_unknown_one(world, falkordb_url):
    http, keys, _ = world
    alice = keys["alice"]
    # A key for all users sees bob's memory in the shared session; that block is cached first.
    wide = await http.get("/v1/context", headers=keys["admin"], params=context(SHARED, query="lockers"))
    assert wide.status_code == 200 and SECRET in wide.text
    before = snapshot(falkordb_url)
    for query in ({}, {"query": "lockers"}, {"query": SECRET}):
        unknown = await http.get("/v1/context", headers=alice, params=context(UNKNOWN, **query))
        assert unknown.status_code == 200, unknown.text
        for session in HIDDEN:
            answer = await http.get("/v1/context", headers=alice, params=context(session, **query))
            no_secret(answer)
            assert answer.json() == unknown.json(), (session, query)
        assert "Rival lockers" not in unknown.text and "Can I" not in unknown.text
    assert snapshot(falkordb_url) == before  # hidden and unknown sessions are read without writing
    shared = await http.get("/v1/context", headers=alice, params=context(SHARED, query="lockers"))
    assert shared.status_code == 200
    no_secret(shared)  # bob's directives and consolidated memory stay out of <UserMemory>
    xml = shared.json()["xml"]
    assert "Alice wants teal lockers" in xml and "Alice and Bob talked about lockers" in xml
    assert '<User id="bob">' not in xml and "Lisbon airport lockers" in xml  # shared knowledge is shown
    again = await http.get("/v1/context", headers=alice, params=context(SHARED, query="lockers"))
    assert again.json()["xml"] == xml and again.json()["source"] == "cache"  # its own cached block
    own = await http.get("/v1/context", headers=alice, params=context(OWN, query="lockers"))
    assert own.status_code == 200 and "I like lockers painted teal" in own.text
    no_secret(own)
    refused = await http.get("/v1/context", headers=alice, params=context(SHARED, user="bob"))
    assert refused.status_code == 403 and SECRET not in refused.text


async def test_session_routes_answer_a_hidden_session_as_an_unknown_one(world, falkordb_url):
    http, keys, _ = world
    alice = keys["alice"]
    before = snapshot(falkordb_url)
    for method, path, params in [("GET", "/v1/sessions/{}", None), ("POST", "/v1/sessions/{}/form", {"wait": "false"})]:
        unknown = await http.request(method, path.format(UNKNOWN), headers=alice, params=params)
        assert unknown.status_code == 404
        for session in HIDDEN:
            answer = await http.request(method, path.format(session), headers=alice, params=params)
            assert same(answer, session) == same(unknown, UNKNOWN), (method, path, session)
    assert snapshot(falkordb_url) == before
    for session in (OWN, SHARED):
        assert (await http.get(f"/v1/sessions/{session}", headers=alice)).status_code == 200


async def test_a_users_key_records_into_another_users_session_only_if_the_agent_allows_it(world, falkordb_url):
    http, keys, _ = world
    alice, admin = keys["alice"], keys["admin"]

    def line(mid: str) -> dict[str, Any]:
        return {"agent_id": AGENT, "user_id": "alice", "role": "user", "content": "Can I join?", "message_id": mid}

    before = snapshot(falkordb_url)
    refused = {session: await http.post(f"/v1/sessions/{session}/messages", headers=alice, json=line("j1"))
               for session in (BOBS, FOREIGN)}
    assert refused[BOBS].status_code == 409
    assert same(refused[BOBS], BOBS) == same(refused[FOREIGN], FOREIGN)  # one answer, naming no one
    assert snapshot(falkordb_url) == before
    assert (await http.get(f"/v1/sessions/{BOBS}", headers=alice)).status_code == 404
    # Her own sessions, the shared one and a new one take her messages.
    for session in (OWN, SHARED, "alice-new"):
        await call(http, "POST", f"/v1/sessions/{session}/messages", alice, json=line(f"j-{session}"))
    # A key for all users is not limited by the setting.
    await call(http, "POST", f"/v1/sessions/{BOBS}/messages", admin, json={**line("j2"), "content": "Hi bob"})
    await call(http, "DELETE", f"/v1/agents/{AGENT}/users/alice", admin)  # she took part in bob's session: undo it
    # The erasure revoked her key with the rest of her: she gets a new one.
    assert (await http.get(f"/v1/sessions/{OWN}", headers=alice)).status_code == 401
    alice = bearer((await call(http, "POST", "/v1/keys", admin,
                               json={"name": "alice2", "role": "admin", "agents": [AGENT], "users": ["alice"]}))["key"])
    assert (await http.get(f"/v1/sessions/{BOBS}", headers=alice)).status_code == 404
    # With users_join_sessions on, she may join, and from then on sees the session.
    agent = await call(http, "PUT", f"/v1/agents/{AGENT}", admin, json={"users_join_sessions": True})
    assert agent["users_join_sessions"] is True
    await call(http, "POST", f"/v1/sessions/{BOBS}/messages", alice, json=line("j3"))
    assert (await http.get(f"/v1/sessions/{BOBS}", headers=alice)).status_code == 200
    foreign = await http.post(f"/v1/sessions/{FOREIGN}/messages", headers=alice, json=line("j4"))
    assert same(foreign, FOREIGN) == same(refused[FOREIGN], FOREIGN)  # another agent's session stays refused
    bad = await http.put(f"/v1/agents/{AGENT}", headers=admin, json={"users_join_sessions": "maybe"})
    assert bad.status_code == 422 and "users_join_sessions" in bad.text


async def test_search_keeps_to_what_the_users_may_see(world, falkordb_url):
    http, keys, _ = world
    alice = keys["alice"]

    async def search(**body: Any) -> httpx.Response:
        answer = await http.post(f"/v1/agents/{AGENT}/search", headers=alice, json={"query": "locker code", **body})
        flat = {k: v for k, v in body.items() if k != "namespaces"}
        by_get = await http.get("/v1/search", headers=alice, params={"agent_id": AGENT, "query": "locker code",
                                                                     **flat, **({"namespaces": body["namespaces"]}
                                                                                if "namespaces" in body else {})})
        assert by_get.status_code == answer.status_code, (body, by_get.text, answer.text)
        no_secret(answer)
        no_secret(by_get)
        return answer

    before = snapshot(falkordb_url)
    for scope, spelled in (("session", lambda s: {"session_id": s}), ("namespaces", lambda s: {"namespaces": [f"session:{s}"]})):
        unknown = await search(scope=scope, **spelled(UNKNOWN))
        assert unknown.status_code == 404
        for session in HIDDEN:
            assert same(await search(scope=scope, **spelled(session)), session) == same(unknown, UNKNOWN)
    other_user = await search(scope="namespaces", namespaces=[f"user:{AGENT}:bob"])
    nobody = await search(scope="namespaces", namespaces=[f"user:{AGENT}:nobody"])
    assert other_user.status_code == 403 and same(other_user, "bob") == same(nobody, "nobody")
    assert (await search(scope="user", user_id="bob")).status_code == 403
    assert (await search(scope="agent")).status_code == 403
    assert snapshot(falkordb_url) == before
    for body in ({"scope": "user", "user_id": "alice"}, {"scope": "session", "session_id": SHARED},
                 {"scope": "shard", "shard_id": "travel"},
                 {"scope": "namespaces", "namespaces": [f"user:{AGENT}:alice", f"session:{OWN}", f"agent:{AGENT}"]}):
        answer = await search(**body)
        assert answer.status_code == 200 and answer.json()["results"], (body, answer.text)
    shared = (await search(scope="session", session_id=SHARED)).json()["results"]
    assert any("gate 4" in hit["content"] for hit in shared)  # the messages of a session she took part in


async def test_memory_tools_answer_a_hidden_memory_as_an_unknown_one(world, falkordb_url):
    http, keys, ids = world
    alice = keys["alice"]
    base = f"/v1/agents/{AGENT}/memories"
    before = snapshot(falkordb_url)
    for method, suffix, body in [("GET", "", None), ("PATCH", "", {"title": "mine"}), ("DELETE", "", None),
                                 ("POST", "/undelete", None), ("POST", "/correct", {"content": "mine"}),
                                 ("POST", "/uncorrect", None)]:
        unknown = await http.request(method, f"{base}/no-such-memory{suffix}", headers=alice, json=body)
        assert unknown.status_code == 404
        for name in ("bob_directive", "bob_episode", "rival_memory"):
            answer = await http.request(method, f"{base}/{ids[name]}{suffix}", headers=alice, json=body)
            assert same(answer, ids[name]) == same(unknown, "no-such-memory"), (method, name)
    write = {"kind": "observation", "content": "Alice sneaks a note in"}
    unknown_session = await http.post(base, headers=alice, json={**write, "namespace": f"session:{UNKNOWN}"})
    assert unknown_session.status_code == 404
    for session in HIDDEN:
        answer = await http.post(base, headers=alice, json={**write, "namespace": f"session:{session}"})
        assert same(answer, session) == same(unknown_session, UNKNOWN)
    to_bob = await http.post(base, headers=alice, json={**write, "namespace": f"user:{AGENT}:bob"})
    to_nobody = await http.post(base, headers=alice, json={**write, "namespace": f"user:{AGENT}:nobody"})
    assert to_bob.status_code == 403 and same(to_bob, "bob") == same(to_nobody, "nobody")
    for namespace, name in ((f"shard:{AGENT}:travel", "fact"), (f"agent:{AGENT}", None)):
        shared = await http.post(base, headers=alice, json={**write, "namespace": namespace})
        assert shared.status_code == 403 and "shared knowledge" in shared.text  # read it, never change it
        if name:
            assert (await http.patch(f"{base}/{ids[name]}", headers=alice, json={"title": "x"})).status_code == 403
    assert snapshot(falkordb_url) == before
    for name in ("alice_directive", "shared_episode", "fact"):  # her own, a session she took part in, shared knowledge
        assert (await http.get(f"{base}/{ids[name]}", headers=alice)).status_code == 200
    await call(http, "POST", base, alice, json={**write, "namespace": f"session:{SHARED}"})


async def test_provenance_cites_only_messages_the_users_may_see(world, falkordb_url):
    http, keys, _ = world
    alice = keys["alice"]
    url = f"/v1/agents/{AGENT}/writes/parse"
    text = '<memory_write>{"observations": [{"text": "Alice keeps a spare key"}]}</memory_write>'
    body = {"text": text, "namespace": f"user:{AGENT}:alice"}
    before = snapshot(falkordb_url)
    unknown = await http.post(url, headers=alice, json={**body, "session_id": UNKNOWN, "message_id": "b1"})
    assert unknown.status_code == 404
    for session in HIDDEN:
        answer = await http.post(url, headers=alice, json={**body, "session_id": session, "message_id": "b1"})
        assert same(answer, session) == same(unknown, UNKNOWN), session
    # A message of bob's session cited in a session of hers: not there, as an unknown message is not.
    cited = await http.post(url, headers=alice, json={**body, "session_id": OWN, "message_id": "b1"})
    missing = await http.post(url, headers=alice, json={**body, "session_id": OWN, "message_id": "zz"})
    assert cited.status_code == 404 and same(cited, "b1") == same(missing, "zz")
    alone = await http.post(url, headers=alice, json={**body, "message_id": "a1"})
    assert alone.status_code == 422 and "message_id" in alone.text
    direct = await http.post(f"/v1/agents/{AGENT}/memories", headers=alice,
                             json={"namespace": f"session:{BOBS}", "kind": "observation", "content": "x"})
    assert direct.status_code == 404
    assert snapshot(falkordb_url) == before
    # Bob's message in the session both spoke in is hers to see, and to cite.
    written = await call(http, "POST", url, alice, json={**body, "session_id": SHARED, "message_id": "s2"})
    assert written["written"][0]["provenance"]["message_ids"] == ["s2"]


async def test_export_and_user_routes_hold_nothing_of_another_user(world):
    http, keys, _ = world
    alice = keys["alice"]
    export = await http.get(f"/v1/agents/{AGENT}/users/alice/export", headers=alice)
    assert export.status_code == 200 and "teal" in export.text
    no_secret(export)
    for method, url in (("GET", f"/v1/agents/{AGENT}/users/bob/export"), ("DELETE", f"/v1/agents/{AGENT}/users/bob"),
                        ("GET", f"/v1/agents/{AGENT}/startup/block"), ("GET", f"/v1/agents/{AGENT}/startup")):
        answer = await http.request(method, url, headers=alice, params={"session_id": BOBS} if "block" in url else None)
        assert answer.status_code == 403, (url, answer.text)
        no_secret(answer)


async def test_the_mcp_tools_hold_nothing_of_another_user_and_hide_as_unknown(server, world, falkordb_url):
    """`memory-service mcp` is a client of the API: with alice's key, over stdio and over HTTP
    (her key passed through), its tools return nothing of bob's private data, and a hidden
    session or memory gets the error result an unknown one gets."""
    running, _ = server
    http, keys, ids = world
    alice_key = keys["alice"]["Authorization"].removeprefix("Bearer ")

    def same_result(result: Any, placeholder_for: str) -> tuple[bool, str]:
        return result.is_error, tool_text(result).replace(placeholder_for, "<id>")

    async def check(client: Any) -> None:
        async def tool(name: str, arguments: dict[str, Any]) -> Any:
            result = await client.call_tool(name, arguments)
            assert SECRET not in tool_text(result) and SECRET not in str(result.structured_content), (name, arguments)
            assert "RIVALNOTE" not in tool_text(result), (name, arguments)
            return result

        before = snapshot(falkordb_url)
        query = {"query": "locker code"}  # what would find bob's code, were it in reach
        for scope in ({}, {"scope": "namespaces", "namespaces": [f"user:{AGENT}:bob"]}):
            assert (await tool("memory_search", {**query, **scope})).is_error, scope  # not hers to search
        bob = await tool("memory_search", {**query, "scope": "user", "user_id": "bob"})
        nobody = await tool("memory_search", {**query, "scope": "user", "user_id": "nobody"})
        assert "403" in tool_text(bob) and same_result(bob, "bob") == same_result(nobody, "nobody")
        unknown = await tool("memory_search", {**query, "scope": "session", "session_id": UNKNOWN})
        assert unknown.is_error and "404" in tool_text(unknown)
        for session in HIDDEN:
            hidden = await tool("memory_search", {**query, "scope": "session", "session_id": session})
            assert same_result(hidden, session) == same_result(unknown, UNKNOWN), session
        for name, extra in (("memory_get", {}), ("memory_update", {"title": "mine"}), ("memory_delete", {}),
                            ("memory_undelete", {})):
            missing = await tool(name, {"memory_id": "no-such-memory", **extra})
            assert missing.is_error and "404" in tool_text(missing), name
            for memory in ("bob_directive", "bob_episode", "rival_memory"):
                hidden = await tool(name, {"memory_id": ids[memory], **extra})
                assert same_result(hidden, ids[memory]) == same_result(missing, "no-such-memory"), (name, memory)
        write = {"kind": "observation", "content": "Alice sneaks a note in"}
        nowhere = await tool("memory_write", {**write, "namespace": f"session:{UNKNOWN}"})
        assert nowhere.is_error
        for session in HIDDEN:
            hidden = await tool("memory_write", {**write, "namespace": f"session:{session}"})
            assert same_result(hidden, session) == same_result(nowhere, UNKNOWN), session
        line = {"user_id": "alice", "role": "user", "content": "Can I join?", "message_id": "mcp-j1"}
        joined = {session: await tool("memory_record", {**line, "session_id": session}) for session in (BOBS, FOREIGN)}
        assert joined[BOBS].is_error and "409" in tool_text(joined[BOBS])  # as the route: bob's session is not hers
        assert same_result(joined[BOBS], BOBS) == same_result(joined[FOREIGN], FOREIGN)
        as_bob = await tool("memory_record", {**line, "user_id": "bob", "session_id": OWN})
        assert as_bob.is_error and "403" in tool_text(as_bob)
        after = snapshot(falkordb_url)
        assert after == before, before.changes(after)  # nothing refused changed anything

        # What is hers to see, she sees (a search that finds something notes the access: after the check).
        shared = await tool("memory_search", {**query, "scope": "session", "session_id": SHARED})
        assert not shared.is_error and any("gate 4" in hit["content"] for hit in shared.structured_content["results"])
        own = await tool("memory_search", {"query": "teal lockers", "scope": "user", "user_id": "alice"})
        assert not own.is_error and own.structured_content["results"]

        got = await tool("memory_get", {"memory_id": ids["alice_directive"]})
        assert not got.is_error and got.structured_content["content"] == "Alice wants teal lockers"
        for session in HIDDEN:  # the block of an unknown session: nothing of bob's (tool() checks)
            block = await tool("memory_context", {"user_id": "alice", "session_id": session, **query})
            assert not block.is_error and "<" in block.structured_content["xml"], tool_text(block)
        bobs_block = await tool("memory_context", {"user_id": "bob", "session_id": SHARED, **query})
        assert bobs_block.is_error and "403" in tool_text(bobs_block)

    async with stdio(running.base_url, alice_key, agent=AGENT) as client:
        await check(client)
    async with http_mcp(running.base_url, agent=AGENT) as url, over_http(url, alice_key) as client:
        await check(client)


async def test_the_reference_profile_holds_nothing_of_another_user(server, world, falkordb_url):
    """`memory-service mcp --profile reference` over bob's namespace with alice's key, over
    stdio and HTTP: his graph reads as an empty one and a write is refused, changing nothing;
    over her own namespace her writes go through."""
    running, _ = server
    _, keys, _ = world
    alice_key = keys["alice"]["Authorization"].removeprefix("Bearer ")
    entity = {"name": "Locker", "entityType": "object", "observations": [f"Code {SECRET}"]}
    async with stdio(running.base_url, keys["admin"]["Authorization"].removeprefix("Bearer "), agent=AGENT,
                     extra=["--profile", "reference", "--namespace", f"user:{AGENT}:bob"]) as client:
        bobs_graph = await client.call_tool("create_entities", {"entities": [entity]})  # a key for all users may
        assert not bobs_graph.is_error and SECRET in str(bobs_graph.structured_content)

    async def check(client: Any) -> None:
        before = snapshot(falkordb_url)
        graph = await client.call_tool("read_graph", {})
        assert not graph.is_error and graph.structured_content == {"entities": [], "relations": []}
        for name, arguments in (("search_nodes", {"query": "Locker"}), ("open_nodes", {"names": ["Locker"]})):
            found = await client.call_tool(name, arguments)
            assert found.structured_content == {"entities": [], "relations": []}, name
        refused = await client.call_tool("create_entities", {"entities": [entity]})
        assert refused.is_error and "403" in tool_text(refused)
        assert snapshot(falkordb_url) == before

    bobs = ["--profile", "reference", "--namespace", f"user:{AGENT}:bob"]
    async with stdio(running.base_url, alice_key, agent=AGENT, extra=bobs) as client:
        await check(client)
    async with http_mcp(running.base_url, *bobs, agent=AGENT) as url, over_http(url, alice_key) as client:
        await check(client)
    hers = ["--profile", "reference", "--namespace", f"user:{AGENT}:alice"]
    async with stdio(running.base_url, alice_key, agent=AGENT, extra=hers) as client:
        made = await client.call_tool("create_entities", {"entities": [{**entity, "observations": ["Teal"]}]})
        assert not made.is_error and made.structured_content["entities"][0]["observations"] == ["Teal"]


RACE_TRIES = 100  # per pair of routes: 300 races of a fresh session per setting


async def _record_first(http: httpx.AsyncClient, route: str, session: str, user: str, key: dict[str, str]) -> bool:
    """Record the first message of ``session`` for ``user`` by ``route``; True if it was
    recorded, False if refused as another user's session (409), anything else fails."""
    message = {"user_id": user, "role": "user", "content": f"{user}: my PIN is 4321", "message_id": f"{user}-1"}
    if route == "single":
        answer = await http.post(f"/v1/sessions/{session}/messages", headers=key, json={"agent_id": AGENT, **message})
        assert answer.status_code in (200, 409), answer.text
        return answer.status_code == 200
    answer = await http.post(f"/v1/agents/{AGENT}/messages/batch", headers=key,
                             json={"messages": [{"session_id": session, **message}]})
    assert answer.status_code == 200, answer.text
    (item,) = answer.json()["items"]
    assert item["status"] == "recorded" or (item["status"] == "refused" and item["code"] == 409), item
    return bool(item["status"] == "recorded")


@pytest.mark.cluster
@pytest.mark.parametrize("join", [False, True], ids=["users-kept-apart", "users-join"])
async def test_two_users_keys_racing_into_a_new_session_one_gets_in(server, falkordb_url, join):
    """Two keys limited to different users record the first message of a new session at the
    same moment, by either route: exactly one user gets in and the other is refused as from
    another user's session and cannot read it, unless the agent lets users join (then both)."""
    running, _ = server
    await flush(falkordb_url)
    async with (httpx.AsyncClient(base_url=running.base_url, timeout=30) as http,
                httpx.AsyncClient(base_url=running.base_url, timeout=30) as other):
        admin = bearer((await call(http, "POST", "/v1/keys", OPERATOR,
                                   json={"name": "race", "role": "admin", "agents": [AGENT]}))["key"])
        keys = {user: bearer((await call(http, "POST", "/v1/keys", OPERATOR,
                                         json={"name": user, "role": "write", "agents": [AGENT], "users": [user]}))["key"])
                for user in ("u1", "u2")}
        await call(http, "PUT", f"/v1/agents/{AGENT}", admin, json={"users_join_sessions": join})
        tally: dict[tuple[str, str], list[int]] = {}
        for routes in (("batch", "batch"), ("batch", "single"), ("single", "single")):
            for attempt in range(RACE_TRIES):
                session = f"race-{'-'.join(routes)}-{attempt}"
                first = ("u1", "u2") if attempt % 2 == 0 else ("u2", "u1")  # who sends first, in turns
                got_in = await asyncio.gather(*(_record_first(client, route, session, user, keys[user])
                                                for client, route, user in zip((http, other), routes, first)))
                tally.setdefault(routes, []).append(sum(got_in))
                for user, entered in zip(first, got_in):
                    seen = await http.get(f"/v1/sessions/{session}", headers=keys[user])
                    assert seen.status_code == (200 if entered else 404), (routes, session, user, seen.text)
        expected = 2 if join else 1  # users who got in, each race
        assert {routes: dict(Counter(counts)) for routes, counts in tally.items()} == {
            routes: {expected: RACE_TRIES} for routes in tally}


async def test_a_users_key_sees_counts_and_provenance_of_what_it_reaches(world, server):
    """A key limited to alice: the agents' list counts her users and sessions, not the
    agent's; a shard memory formed in bob's session is shown to her (list, memory_get,
    detail, search) without bob's id, session or messages, while one formed in the session
    both spoke in keeps its provenance; a key for all users sees every provenance whole."""
    http, keys, _ = world
    _, app = server
    alice, admin = keys["alice"], keys["admin"]
    _, backend = await app.state.service.agents.backend_for(AGENT)
    travel = str(Namespace.shard(AGENT, "travel"))
    await backend.write([
        Memory(id="from-bobs", kind=MemoryKind.FACT, namespace=travel, content="Zephyr lockers take coins",
               metadata=Provenance(agent_id=AGENT, user_id="bob", user_ids=["bob"], session_id=BOBS,
                                   message_ids=["b1"], sequence=1)),
        Memory(id="from-shared", kind=MemoryKind.FACT, namespace=travel, content="Zephyr lockers are by gate 4",
               metadata=Provenance(agent_id=AGENT, user_id="bob", user_ids=["alice", "bob"], session_id=SHARED,
                                   message_ids=["s1", "s2"], sequence=2)),
    ])
    hidden = {"agent_id": AGENT, "user_id": None, "user_ids": [], "session_id": None, "message_ids": [],
              "memory_ids": [], "sequence": 0, "role": None}
    whole = {"from-bobs": {**hidden, "user_id": "bob", "user_ids": ["bob"], "session_id": BOBS,
                           "message_ids": ["b1"], "sequence": 1},
             "from-shared": {**hidden, "user_id": "bob", "user_ids": ["alice", "bob"], "session_id": SHARED,
                             "message_ids": ["s1", "s2"], "sequence": 2}}
    expected = {"alice": {"from-bobs": hidden, "from-shared": whole["from-shared"]}, "admin": whole}
    for name, key in (("alice", alice), ("admin", admin)):
        listed = await call(http, "GET", f"/v1/agents/{AGENT}/memories", key, params={"namespace": travel})
        got = {m["id"]: m["provenance"] for m in listed["memories"] if m["id"] in whole}
        assert got == expected[name], (name, "list")
        for memory_id in whole:
            record = await call(http, "GET", f"/v1/agents/{AGENT}/memories/{memory_id}", key)
            assert record["provenance"] == expected[name][memory_id], (name, "memory_get", memory_id)
            detail = await call(http, "GET", f"/v1/agents/{AGENT}/memories/{memory_id}/detail", key)
            assert detail["memory"]["provenance"] == expected[name][memory_id], (name, "detail", memory_id)
        found = await call(http, "POST", f"/v1/agents/{AGENT}/search", key,
                           json={"query": "Zephyr lockers", "scope": "shard", "shard_id": "travel"})
        hits = {h["id"]: h for h in found["results"] + found["candidates"] if h["id"] in whole}
        assert set(hits) == set(whole), (name, found)
        for memory_id, hit in hits.items():
            provenance = expected[name][memory_id]
            assert (hit["session_id"], hit["user_id"], hit["source_message_ids"]) == (
                provenance["session_id"], provenance["user_id"], provenance["message_ids"]), (name, "search", hit)
        if name == "alice":
            for answer in (listed, found):
                assert BOBS not in str(answer) and "b1" not in str(answer["memories" if "memories" in answer
                                                                             else "results"])
    # The agents' list: alice's key counts her (one user) and the sessions she took part in.
    mine = (await call(http, "GET", "/v1/agents", alice))["agents"]
    assert [(a["agent_id"], a["users"], a["sessions"]) for a in mine] == [(AGENT, 1, 2)]
    everyone = {a["agent_id"]: a for a in (await call(http, "GET", "/v1/agents", admin))["agents"]}
    assert (everyone[AGENT]["users"], everyone[AGENT]["sessions"]) == (2, 3)


async def test_sessions_recorded_before_the_participants_set_keep_their_users(world, server, falkordb_url):
    """A session recorded before its participants were kept (no participants set, no mark)
    goes on taking its own users' messages, read from the older indexes, and refuses other
    users' as before; each user who records again is added to its participants."""
    http, keys, _ = world
    _, app = server
    redis = app.state.service.state.redis
    for session in (OWN, BOBS, SHARED):  # as a release before the participants set left them
        k = keyspace.session_keys(session)
        await redis.delete(k["participants"])
        await redis.hdel(k["meta"], "participants")
    alice = keys["alice"]

    def line(session: str, mid: str) -> dict[str, Any]:
        return {"session_id": session, "user_id": "alice", "role": "user", "content": "Still here", "message_id": mid}

    before = snapshot(falkordb_url)
    refused = await http.post(f"/v1/agents/{AGENT}/messages/batch", headers=alice, json={"messages": [line(BOBS, "l0")]})
    assert refused.json()["items"][0]["code"] == 409 and snapshot(falkordb_url) == before
    single = {k: v for k, v in line(BOBS, "l1").items() if k != "session_id"}
    assert (await http.post(f"/v1/sessions/{BOBS}/messages", headers=alice,
                            json={"agent_id": AGENT, **single})).status_code == 409
    for session in (OWN, SHARED):
        await call(http, "POST", f"/v1/sessions/{session}/messages", alice,
                   json={"agent_id": AGENT, **{k: v for k, v in line(session, "l2").items() if k != "session_id"}})
        answer = await call(http, "POST", f"/v1/agents/{AGENT}/messages/batch", alice,
                            json={"messages": [line(session, "l3")]})
        assert answer["items"][0]["status"] == "recorded", answer
        assert await redis.smembers(keyspace.session_keys(session)["participants"]) == {"alice"}
        assert (await http.get(f"/v1/sessions/{session}", headers=alice)).status_code == 200
    assert await redis.exists(keyspace.session_keys(BOBS)["participants"]) == 0


async def test_an_erasure_takes_the_user_out_of_every_sessions_participants(world, server):
    """Erasing a user removes them from the participants of the sessions they shared, and
    of a session where only a reservation of theirs was (released: no message of theirs)."""
    http, keys, _ = world
    _, app = server
    state = app.state.service.state
    reservation = await state.reserve_message("bob-tried", AGENT, "t1", "digest", user_id="bob")
    await state.release_message("bob-tried", "t1", reservation.sequence, "refused")
    assert await state.redis.smembers(keyspace.session_keys("bob-tried")["participants"]) == {"bob"}
    assert await state.redis.smembers(keyspace.session_keys(SHARED)["participants"]) == {"alice", "bob"}
    await call(http, "DELETE", f"/v1/agents/{AGENT}/users/bob", keys["admin"])
    for session in (SHARED, BOBS, "bob-tried"):
        assert "bob" not in await state.redis.smembers(keyspace.session_keys(session)["participants"]), session
    assert await state.redis.exists(keyspace.user_joined(AGENT, "bob")) == 0
    assert await state.redis.smembers(keyspace.session_keys(SHARED)["participants"]) == {"alice"}
