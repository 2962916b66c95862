"""Erasing a user, and exporting what is held on them (memory_service/curation/erasure.py).

Two users share a session and a shard; each also has a session alone. Memories are formed
by the real worker, consolidated and embedded; then one user is exported and erased, and
everything is looked for again: through every route, and directly in the stores (Cypher
over every graph and its full-text index, every Redis key, every MongoDB collection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from redis import asyncio as aioredis

from memory_service.backends.graph import GraphBackend
from memory_service.backends.loopback import LoopbackServer
from memory_service.backends.outbox import WriteOp
from memory_service.config import Settings
from memory_service.domain.models import AgentSettings, Memory, MemoryKind, Provenance, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.formation.jobs import CONSOLIDATE_JOB
from memory_service.http.app import create_app
from memory_service.runtime import open_service

from .conftest import server_urls
from .helpers import mirrored_service, msg, outbox_drained, queued_jobs, wait_embedded
from .store_state import snapshot

AGENT, ALICE, BOB = "trips", "ursula", "victor"
SHARED = [
    (ALICE, "user", "I prefer aisle seats whenever I fly to Zanzibar."),
    (BOB, "user", "Always answer me in Icelandic, I am learning it for Reykjavik."),
    (ALICE, "user", "The flight to Zanzibar leaves on June 3rd at 9am."),
    (BOB, "user", "We should book the Reykjavik pangolin hotel because it is cheaper."),
    (ALICE, "user", "We should book the Zanzibar quokka hotel near the station because it is quiet."),
    (BOB, "assistant", "Noted, both plans are saved."),
]
SOLO_A = [
    (ALICE, "user", "I prefer marmalade with breakfast on every trip."),
    (ALICE, "assistant", "Noted, marmalade at every quokka breakfast."),
    (ALICE, "user", "The ferry to Zanzibar departs on July 9th at 7am."),
    (ALICE, "user", "We should book the marmalade hotel because it is cheaper."),
]
SOLO_B = [
    (BOB, "user", "I prefer vegetarian meals on every Reykjavik flight."),
    (BOB, "user", "The ferry to Reykjavik leaves on August 2nd at 6am."),
    (BOB, "user", "We should book the pangolin museum hotel because it is cheaper."),
    (BOB, "user", "Remember that I always travel with a bicycle."),
]
SESSIONS = {"shared-1": SHARED, "solo-a": SOLO_A, "solo-b": SOLO_B}
ALICE_WORDS = ("zanzibar", "quokka", "marmalade", "aisle")
BOB_WORDS = ("reykjavik", "pangolin", "icelandic", "bicycle", "vegetarian")
ALICE_IDS = [f"{s}-{i}" for s, lines in SESSIONS.items() for i, (u, _, _) in enumerate(lines) if u == ALICE]
BOB_IDS = [f"{s}-{i}" for s, lines in SESSIONS.items() for i, (u, _, _) in enumerate(lines) if u == BOB]
# What must not be found anywhere once Alice is erased: her words, her id, her message ids
# and the session that was hers alone.
ALICE_NEEDLES = (*ALICE_WORDS, ALICE, *ALICE_IDS, "solo-a")

OVERRIDES = {"never_form_memories_less_than_n_messages": 2, "memory_formation_msg_interval": 100,
             "consolidate_directives_after": 1, "consolidate_suggestions_after": 2}


async def converse(service) -> None:
    await service.put_shard(AGENT, "travel", ShardIn(name="travel", extraction_focus="flights, ferries, hotels, dates"))
    for session, lines in SESSIONS.items():
        for i, (user, role, content) in enumerate(lines):
            await service.record_message(session, msg(AGENT, user, content, role=role, mid=f"{session}-{i}", minute=i))
    for session in ("shared-1", "solo-b", "solo-a"):
        assert (await service.form_memories(session)).formed
        await consolidated(service)
    await wait_embedded(service, AGENT)


async def consolidated(service, timeout: float = 60) -> None:
    """Until no consolidation job is queued or running (a bound, not a speed check)."""
    for _ in range(int(timeout / 0.05)):
        if not await queued_jobs(service, CONSOLIDATE_JOB):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("consolidation jobs still queued")


def found_in(text: str, needles=ALICE_NEEDLES) -> list[str]:
    text = text.lower()
    return [n for n in needles if n.lower() in text]


async def graph_findings(url: str, needles=ALICE_NEEDLES) -> list[str]:
    """Every node of every graph (of every server, each primary of a cluster's), by Cypher,
    and each word through the full-text index."""
    hits = []
    for server in server_urls(url):
        hits += await _graph_findings(server, needles)
    return hits


async def _graph_findings(url: str, needles) -> list[str]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    hits = []
    try:
        for graph in await client.execute_command("GRAPH.LIST"):
            rows = await client.execute_command("GRAPH.RO_QUERY", graph,
                                                "MATCH (n) RETURN n.uuid, n.name, n.group_id, n.content, n.text")
            for row in rows[1]:
                if found := found_in(json.dumps(row), needles):
                    hits.append(f"{graph}: {found} in {row}")
            # The knowledge graph's fact edges hold text too (RELATES_TO: the fact, its provenance).
            rows = await client.execute_command("GRAPH.RO_QUERY", graph,
                                                "MATCH ()-[e]->() RETURN e.uuid, e.group_id, e.fact, e.episodes, e.message_ids")
            for row in rows[1]:
                if found := found_in(json.dumps(row), needles):
                    hits.append(f"{graph}: {found} in edge {row}")
            for word in (n for n in needles if n.isalpha()):
                try:
                    rows = await client.execute_command("GRAPH.RO_QUERY", graph,
                                                        f"CALL db.idx.fulltext.queryNodes('Episodic', '{word}') "
                                                        "YIELD node RETURN node.uuid")
                except Exception:  # a graph without the index (not ours)
                    continue
                if rows[1]:
                    hits.append(f"{graph}: full-text index finds {word!r}: {rows[1]}")
    finally:
        await client.aclose()
    return hits


async def redis_findings(url: str, needles=ALICE_NEEDLES) -> list[str]:
    """Every key of the Redis at ``url`` and, when the suite runs on a Redis Cluster, of each
    of its primaries and the job queue's server (names and values), read by type."""
    hits = []
    for server in server_urls(url):
        hits += await _findings(aioredis.Redis.from_url(server), needles)
    return hits


async def _findings(client, needles) -> list[str]:
    hits = []
    try:
        async for key in client.scan_iter(count=1000):
            kind = (await client.type(key)).decode()
            if kind == "string":
                value = await client.get(key)
            elif kind == "hash":
                value = await client.hgetall(key)
            elif kind == "list":
                value = await client.lrange(key, 0, -1)
            elif kind == "set":
                value = await client.smembers(key)
            elif kind == "zset":
                value = await client.zrange(key, 0, -1)
            elif kind == "stream":
                value = await client.xrange(key)
            else:
                value = b""  # a graph: read by Cypher above
            text = key.decode(errors="replace") + " " + repr(value)
            if found := found_in(text, needles):
                hits.append(f"{key!r} ({kind}): {found}")
    finally:
        await client.aclose()
    return hits


async def mongo_findings(database, needles=ALICE_NEEDLES) -> list[str]:
    hits = []
    for name in await database.list_collection_names():
        async for doc in database[name].find({}, {"embedding": 0}):
            if found := found_in(repr(doc), needles):
                hits.append(f"{name} {doc['_id']}: {found}")
    return hits


async def bob_holdings(service) -> dict[str, str]:
    """Bob's memories that owe nothing to Alice: his messages, his session alone, his directives."""
    _, backend = await service.agents.backend_for(AGENT)
    held = {}
    for ns in (Namespace.session("solo-b"), Namespace.session("shared-1"), Namespace.user(AGENT, BOB)):
        for m in await backend.export(AGENT, ns):
            if m.kind is MemoryKind.MESSAGE and m.metadata.user_id != BOB:
                continue
            if m.kind is not MemoryKind.MESSAGE and (ns.kind == "session" and ns.fields[0] == "shared-1"):
                continue  # the shared session's episode holds Alice's words too
            if m.kind is MemoryKind.CONSOLIDATED or m.kind is MemoryKind.DIRECTIVE:
                if set(m.metadata.message_ids) & set(ALICE_IDS):
                    continue
            held[m.id] = m.content
    return held


@pytest.fixture
async def erase_service(settings):
    async with open_service(settings.model_copy(update={**OVERRIDES, "memory_write_agents": [AGENT]}),
                            run_worker=True) as service:
        yield service


@pytest.fixture
async def client(erase_service):
    async with LoopbackServer(create_app(service=erase_service)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            yield http


async def test_export_then_erase_leaves_nothing_of_the_user_anywhere_and_the_other_users_memories_intact(
        erase_service, client, settings):
    service = erase_service
    await converse(service)
    url = settings.falkordb_url
    # Caches and last good blocks, for both users, hold Alice's words before the erasure.
    for user, session in ((ALICE, "shared-1"), (BOB, "shared-1"), (ALICE, "solo-a"), (BOB, "solo-b")):
        assert (await client.get("/v1/context", params={"agent_id": AGENT, "user_id": user, "session_id": session,
                                                        "query": "zanzibar flight"})).status_code == 200
    # A fact of hers the agent wrote itself (a write block): her namespace's graph.
    await service.parse_writes(AGENT, '<memory_write>{"edges": [{"source": "%s", "target": "Zanzibar", '
                                      '"rel_type": "visited"}]}</memory_write>' % ALICE, f"user:{AGENT}:{ALICE}")
    assert await graph_findings(url) and await redis_findings(url)  # the checks find her before
    bob_before = await bob_holdings(service)
    assert any("Icelandic" in c for c in bob_before.values()) and len(bob_before) >= len(BOB_IDS) + 2

    answer = await client.get(f"/v1/agents/{AGENT}/users/{ALICE}/export")
    assert answer.status_code == 200
    export = answer.json()
    dumped = json.dumps(export).lower()
    assert sorted(m["message_ids"][0] for m in export["messages"]) == sorted(ALICE_IDS)
    assert all(w in dumped for w in ALICE_WORDS)
    assert not found_in(dumped, (*BOB_WORDS, BOB, *BOB_IDS)), "the export holds the other user's data"
    assert export["directives"] and export["consolidations"] and export["shard_contributions"] and export["shared"]
    assert {s["session_id"]: s["other_speakers"] for s in export["sessions"]} == {"shared-1": 1, "solo-a": 0}
    # Her knowledge graph: the entities of her namespace and their facts (docs/erasure.md).
    assert {e["namespace"] for e in export["entities"]} == {f"user:{AGENT}:{ALICE}"}
    assert export["facts"] and {f["namespace"] for f in export["facts"]} == {f"user:{AGENT}:{ALICE}"}
    assert {i for f in export["facts"] for i in (f["subject_id"], f["object_id"])} <= {e["id"] for e in export["entities"]}

    answer = await client.delete(f"/v1/agents/{AGENT}/users/{ALICE}")
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["sessions_removed"] == ["solo-a"] and report["sessions_touched"] == ["shared-1"]
    assert report["memories"]["message"] == len(ALICE_IDS) and report["memories"]["directive"] >= 2
    assert report["stores"]["graph"] == sum(report["memories"].values())
    kinds = {s["kind"] for s in report["shared_removed"]}
    assert "episode" in kinds and "consolidated" in kinds  # the shared window's episode, the shard's merge
    assert report["provenance_rewritten"] >= 1 and report["cached_blocks"] >= 4 and report["user_keys"] >= 3
    assert report["entities"] >= 2  # her knowledge graph: herself, Zanzibar... (docs/graph.md)

    # Nothing of hers through any route ...
    assert (await client.get("/v1/sessions/solo-a")).status_code == 404
    assert (await client.get("/v1/sessions/shared-1")).status_code == 200
    for user, session in ((ALICE, "shared-1"), (BOB, "shared-1"), (BOB, "solo-b")):
        for query in ("zanzibar flight", None):
            params = {"agent_id": AGENT, "user_id": user, "session_id": session, **({"query": query} if query else {})}
            context = (await client.get("/v1/context", params=params)).json()
            assert not found_in(context["xml"], ALICE_WORDS), context["xml"]
    for word in ALICE_WORDS:
        for scope in ({"scope": "agent"}, {"scope": "shard", "shard_id": "travel"}, {"scope": "user", "user_id": BOB}):
            hits = (await client.get("/v1/search", params={"agent_id": AGENT, "query": word, **scope})).json()
            assert not found_in(json.dumps(hits["results"] + hits["candidates"])), (word, scope, hits)
    export = (await client.get(f"/v1/agents/{AGENT}/users/{ALICE}/export")).json()
    assert not any(export[k] for k in ("sessions", "messages", "episodes", "directives", "consolidations",
                                       "shard_contributions", "other", "shared", "entities", "facts"))
    # ... nor in any store, read directly.
    assert await graph_findings(url) == []
    assert await redis_findings(url) == []

    # Bob keeps everything that owed nothing to her, and it is still found.
    assert await bob_holdings(service) == bob_before
    hits = (await client.get("/v1/search", params={"agent_id": AGENT, "query": "pangolin museum"})).json()["results"]
    assert any("pangolin museum" in h["content"] for h in hits)
    context = (await client.get("/v1/context", params={"agent_id": AGENT, "user_id": BOB, "session_id": "solo-b"})).json()
    assert "Icelandic" in context["xml"] and "vegetarian" in context["xml"]

    # Again: nothing left to remove.
    again = (await client.delete(f"/v1/agents/{AGENT}/users/{ALICE}")).json()
    assert again["memories"] == {} and again["sessions_touched"] == again["sessions_removed"] == []
    assert again["ledger_entries"] == again["provenance_rewritten"] == again["user_keys"] == 0


async def test_the_session_ledger_forgets_the_erased_users_pending_messages(erase_service):
    """Messages not formed yet: out of the pending window, its tokens and the session's speakers."""
    service = erase_service
    for i, (user, role, content) in enumerate(SHARED[:4]):
        await service.record_message("shared-1", msg(AGENT, user, content, role=role, mid=f"shared-1-{i}", minute=i))
    before = await service.state.counters("shared-1")
    report = await service.erase_user(AGENT, ALICE)
    after = await service.state.counters("shared-1")
    assert report.ledger_entries == 2 and report.sessions_touched == ["shared-1"]
    assert (before.pending_messages, after.pending_messages) == (4, 2)
    assert 0 < after.pending_tokens < before.pending_tokens
    assert await service.state.session_users("shared-1") == [BOB]
    summary = await service.form_memories("shared-1")
    assert sorted(summary.message_ids) == ["shared-1-1", "shared-1-3"]
    assert await redis_findings(service.settings.job_queue_url()) == []
    assert await graph_findings(service.settings.falkordb_url) == []


async def test_an_unknown_user_gets_an_empty_report_and_nothing_changes(erase_service, client, settings):
    await converse(erase_service)
    await wait_embedded(erase_service, AGENT)
    await asyncio.sleep(0.3)  # the embedding job lets go of its lock
    before = snapshot(settings.falkordb_url, worker_running=True)
    for agent, user in ((AGENT, "nobody"), ("no-such-agent", ALICE)):
        report = (await client.delete(f"/v1/agents/{agent}/users/{user}")).json()
        assert report["memories"] == {} and report["sessions_touched"] == report["sessions_removed"] == []
        assert (await client.get(f"/v1/agents/{agent}/users/{user}/export")).json()["messages"] == []
    after = snapshot(settings.falkordb_url, worker_running=True)
    changed = before.changes(after)
    # Only the generation counters an erasure bumps (cached blocks of the agent are dropped),
    # and the audit log, which records every erasure asked for.
    assert changed["removed"] == [], changed
    assert all(k.startswith(("ms:gen:", "ms:audit:")) for k in changed["added"] + changed["changed"]), changed


@pytest.mark.parametrize("agent,user", [("trips", "a:b"), ("trips", " padded"), ("tr:ps", ALICE), ("trips", "x" * 257)])
async def test_invalid_ids_are_refused_with_422_and_change_nothing(erase_service, client, settings, agent, user):
    await converse(erase_service)
    await asyncio.sleep(0.3)
    before = snapshot(settings.falkordb_url, worker_running=True)
    for method, path in (("DELETE", f"/v1/agents/{agent}/users/{user}"), ("GET", f"/v1/agents/{agent}/users/{user}/export")):
        answer = await client.request(method, path)
        assert answer.status_code == 422, answer.text
        assert "agent_id" in answer.text or "user_id" in answer.text
    assert before.changes(snapshot(settings.falkordb_url, worker_running=True))["changed"] == []
    assert snapshot(settings.falkordb_url, worker_running=True).contents == before.contents


class CrashingGraph(GraphBackend):
    """The real graph backend whose first delete fails, as a crash midway would leave it."""

    crashes = 1

    async def delete(self, agent_id, ids):
        if CrashingGraph.crashes:
            CrashingGraph.crashes -= 1
            raise ConnectionError("the process died here")
        return await super().delete(agent_id, ids)


async def test_an_erasure_that_crashed_midway_is_finished_by_a_retry(erase_service):
    service = erase_service
    service.register_backend("crashing", lambda s: CrashingGraph(s.falkordb_url, s, embedding_dimension=64))
    await service.put_agent(AGENT, AgentSettings(memory_backend="crashing"))
    await converse(service)
    with pytest.raises(ConnectionError):
        await service.erase_user(AGENT, ALICE)  # the ledgers are clean, the stores still hold her
    assert await graph_findings(service.settings.falkordb_url)
    report = await service.erase_user(AGENT, ALICE)
    assert report.memories["message"] == len(ALICE_IDS) and report.sessions_removed == ["solo-a"]
    assert await graph_findings(service.settings.falkordb_url) == []
    assert await redis_findings(service.settings.job_queue_url()) == []
    assert (await service.erase_user(AGENT, ALICE)).memories == {}


# MongoDB beside the graph: the erasure reaches it through the outbox.


@pytest.fixture
async def mongo_service(settings, mongo_uri, mongo_database, tmp_path):
    async with mirrored_service(settings, mongo_uri, mongo_database, tmp_path / "graph", **OVERRIDES,
                                worker_retry_backoff_seconds=0.1) as (service, _):
        yield service


async def test_an_erasure_while_mongo_is_cut_completes_when_it_returns_and_the_outbox_resurrects_nothing(
        mongo_service, mongo_proxy):
    service = mongo_service
    _, backend = await service.agents.backend_for(AGENT)
    await converse(service)
    await outbox_drained(backend)
    database = backend.mirror.db
    assert await mongo_findings(database)  # she is in MongoDB before
    bob_in_mongo = await database.memories.count_documents({"metadata.user_id": BOB, "kind": "message"})

    await service.registry.get("mongo")  # started while up: the erasure must not wait on it once it is cut
    await mongo_proxy.stop()
    # Written while MongoDB is away: queued for it in the outbox, then one of them refused
    # for good (a dead letter an operator could replay after the erasure).
    await service.record_message("shared-1", msg(AGENT, ALICE, "One more Zanzibar thought.", mid="late-a", minute=30))
    await service.record_message("shared-1", msg(AGENT, BOB, "One more Reykjavik thought.", mid="late-b", minute=31))
    letter = Memory(id="dead-a", kind=MemoryKind.FACT, namespace="shard:trips:travel", content="quokka facts",
                    metadata=Provenance(agent_id=AGENT, user_id=ALICE, user_ids=[ALICE]))
    entry = await backend.outbox.append(WriteOp(memories=[letter]), ["mongo"])
    await backend.outbox.failed("mongo", entry, "refused", hopeless=True)
    assert (await backend.outbox.depth())["mongo"] > 0

    report = await service.erase_user(AGENT, ALICE)
    assert report.outbox_entries >= 2 and report.memories["message"] == len(ALICE_IDS) + 1
    assert any(note.startswith("mongo: unreachable") for note in report.notes), report.notes
    assert report.stores["graph"] == sum(report.memories.values())
    assert await graph_findings(service.settings.falkordb_url) == []
    assert await redis_findings(service.settings.job_queue_url()) == []  # the queued writes were rewritten without her
    assert await backend.outbox.replay("mongo", [entry]) == 1  # an operator replays the dead letter

    await mongo_proxy.start()
    await outbox_drained(backend)
    assert await mongo_findings(database) == []
    assert await database.memories.count_documents({"metadata.user_id": BOB, "kind": "message"}) == bob_in_mongo + 1
    assert await database.user_memory.find_one({"_id": f"user:{AGENT}:{ALICE}"}) is None
    assert (await service.erase_user(AGENT, ALICE)).memories == {}


# Every trace: keys, the audit log, the server's logs and the store's files.

SEC, EVE, BOB2 = "sec", "eve-7f3k2", "bob-2q8w"
EVE_TEXTS = ("EVESECRET91", "EVEPASS44", "EVEQUERY73", "EVENOTE55")
# Her id as written, and as the graph's group ids encode it ("eve_2d_7f3k2").
EVE_NEEDLES = (EVE, Namespace.user(SEC, EVE).group_id.rpartition("__")[2], *EVE_TEXTS)
EVE_LINES = [
    ("user", "Always call me EVESECRET91 when we talk about trips."),
    ("assistant", "Noted, EVESECRET91."),
    ("user", "I prefer the locker with code EVEPASS44 at every station."),
    ("user", "We should book the EVESECRET91 hotel because it is quiet."),
]
BOB_LINES = [("user", "Always answer me in Danish."), ("user", "I prefer trains to planes on every trip.")]
OPERATOR_SECRET = "operator-" + "k" * 40
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR_SECRET}"}


@pytest.fixture
async def own_store(tmp_path):
    """A service on an embedded store of its own (its append-only file holds this test's
    writes only), requiring keys, behind a real server."""
    settings = Settings(_env_file=None, falkordb_url=None, redis_url=None, mongodb_uri=None, embedder="hash",
                        embedding_dimension=64, api_auth="keys", operator_api_key=OPERATOR_SECRET,
                        memory_write_agents=[SEC], **OVERRIDES)
    async with open_service(settings, data_dir=tmp_path / "store", run_worker=True) as service:
        async with LoopbackServer(create_app(service=service)) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                yield service, http, tmp_path / "store"


@pytest.fixture
def server_logs(caplog):
    """Every log line of the process, uvicorn's access lines included (its loggers do not
    propagate); the test client's own lines (httpx) are not the server's."""
    caplog.set_level(logging.DEBUG)
    access = logging.getLogger("uvicorn.access")
    uvicorn_logger, level = logging.getLogger("uvicorn"), access.level
    access.setLevel(logging.INFO)
    access.addHandler(caplog.handler)
    uvicorn_logger.addHandler(caplog.handler)
    yield lambda: [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    access.removeHandler(caplog.handler)
    uvicorn_logger.removeHandler(caplog.handler)
    access.setLevel(level)


async def every_graph_property(url: str, needles) -> list[str]:
    """Every property of every node and edge of every graph (of every server)."""
    hits = []
    for server in server_urls(url):
        client = aioredis.Redis.from_url(server, decode_responses=True)
        try:
            for graph in await client.execute_command("GRAPH.LIST"):
                for query in ("MATCH (n) RETURN labels(n), properties(n)", "MATCH ()-[r]->() RETURN type(r), properties(r)"):
                    rows = (await client.execute_command("GRAPH.RO_QUERY", graph, query))[1]
                    hits += [f"{graph}: {found} in {row}" for row in rows if (found := found_in(repr(row), needles))]
        finally:
            await client.aclose()
    return hits


def file_findings(directory, needles) -> list[str]:
    hits = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes().lower()
        hits += [f"{path.name}: {n}" for n in needles if n.lower().encode() in data]
    return hits


async def test_an_erasure_leaves_no_trace_in_keys_audit_logs_or_the_append_only_file(own_store, server_logs):
    service, http, data_dir = own_store
    made = {}
    for name, users in ((f"{EVE} phone", [EVE]), ("family", [EVE, BOB2])):
        answer = await http.post("/v1/keys", headers=AS_OPERATOR,
                                 json={"name": name, "role": "write", "agents": [SEC], "users": users})
        assert answer.status_code == 201, answer.text
        made[name] = answer.json()
    eve_key = {"Authorization": f"Bearer {made[f'{EVE} phone']['key']}"}
    family = {"Authorization": f"Bearer {made['family']['key']}"}

    # Everything she can do with her own key: messages, a memory write, context and search
    # with her words in the query string, formation; and Bob beside her.
    for i, (role, content) in enumerate(EVE_LINES):
        line = {"agent_id": SEC, "user_id": EVE, "role": role, "content": content, "message_id": f"e{i}"}
        assert (await http.post("/v1/sessions/trip-1/messages", headers=eve_key, json=line)).status_code == 200
    for i, (role, content) in enumerate(BOB_LINES):
        line = {"agent_id": SEC, "user_id": BOB2, "role": role, "content": content, "message_id": f"b{i}"}
        assert (await http.post("/v1/sessions/trip-2/messages", headers=family, json=line)).status_code == 200
    written = await http.post(f"/v1/agents/{SEC}/memories", headers=eve_key, json={
        "namespace": f"user:{SEC}:{EVE}", "kind": "observation", "content": "EVENOTE55 likes window seats."})
    assert written.status_code == 201, written.text
    for session in ("trip-1", "trip-2"):
        assert (await http.post(f"/v1/sessions/{session}/form", headers=AS_OPERATOR)).status_code == 200
    await consolidated(service)
    await wait_embedded(service, SEC)
    context = await http.get("/v1/context", headers=eve_key, params={
        "agent_id": SEC, "user_id": EVE, "session_id": "trip-1", "query": "EVEQUERY73 locker"})
    assert context.status_code == 200 and "EVEPASS44" in context.text
    assert (await http.get("/v1/search", headers=eve_key, params={
        "agent_id": SEC, "query": "EVEQUERY73 EVESECRET91", "scope": "user", "user_id": EVE})).status_code == 200
    assert (await http.get(f"/v1/agents/{SEC}/users/{EVE}/export", headers=AS_OPERATOR)).status_code == 200
    url = service.settings.redis_url
    assert await redis_findings(url, EVE_NEEDLES) and await every_graph_property(url, EVE_NEEDLES)  # found before
    assert file_findings(data_dir / "appendonlydir", EVE_NEEDLES)  # the append-only file too

    # The audit log named her by digest from the start, and finds her entries by her id.
    entries = (await http.get("/v1/audit", headers=AS_OPERATOR, params={"agent_id": SEC, "limit": 1000})).json()
    assert not found_in(json.dumps(entries), EVE_NEEDLES), entries
    mine = (await http.get("/v1/audit", headers=AS_OPERATOR, params={"agent_id": SEC, "user_id": EVE})).json()
    assert {e["action"] for e in mine["entries"]} == {"key.create", "memory.write"}
    assert (await http.get("/v1/audit", headers=AS_OPERATOR, params={"user_id": EVE})).status_code == 422

    erased = await http.delete(f"/v1/agents/{SEC}/users/{EVE}", headers=AS_OPERATOR)
    assert erased.status_code == 200, erased.text
    report = erased.json()
    assert report["keys_revoked"] == [made[f"{EVE} phone"]["key_id"]]
    assert report["keys_narrowed"] == [made["family"]["key_id"]]
    assert report["persistence"] == {"state+graph": "rewritten; snapshot scheduled"}, report["persistence"]
    # Entries naming her digest: two key.create, memory.write, key.revoke and key.update.
    assert report["audit_entries"] == 5 and report["query_log_entries"] > 0
    assert report["memories"]["message"] == 4 and report["memories"]["observation"] == 1

    # Her key is revoked; the family key still serves Bob, and no longer her.
    line = {"agent_id": SEC, "user_id": EVE, "role": "user", "content": "EVESECRET91 again", "message_id": "late"}
    assert (await http.post("/v1/sessions/trip-1/messages", headers=eve_key, json=line)).status_code == 401
    assert (await http.post("/v1/sessions/trip-3/messages", headers=family, json=line)).status_code == 403
    line = {**line, "user_id": BOB2, "content": "Trains again.", "message_id": "b9"}
    assert (await http.post("/v1/sessions/trip-2/messages", headers=family, json=line)).status_code == 200
    keys = {k["key_id"]: k for k in (await http.get("/v1/keys", headers=AS_OPERATOR)).json()}
    assert keys[made["family"]["key_id"]]["users"] == [BOB2] and keys[made["family"]["key_id"]]["revoked_at"] is None
    assert keys[made[f"{EVE} phone"]["key_id"]]["revoked_at"] is not None
    entries = (await http.get("/v1/audit", headers=AS_OPERATOR, params={"agent_id": SEC, "limit": 1000})).json()
    assert {"key.revoke", "key.update", "user.erase"} <= {e["action"] for e in entries["entries"]}

    # Nothing of her anywhere: Redis (every key, every type), the graph (every property), the
    # audit log, the append-only file as rewritten, and every log line the process wrote.
    assert await redis_findings(url, EVE_NEEDLES) == []
    assert await every_graph_property(url, EVE_NEEDLES) == []
    assert not found_in(json.dumps(entries), EVE_NEEDLES)
    aof = data_dir / "appendonlydir"
    assert any(aof.iterdir()) and file_findings(aof, EVE_NEEDLES) == []
    records = server_logs()
    access = [r.getMessage() for r in records if r.name == "uvicorn.access"]
    assert 'GET /v1/agents/{agent_id}/users/{user_id}/export HTTP/1.1" 200' in "\n".join(access), access
    assert any("/v1/context HTTP/1.1" in line for line in access) and not any("?" in line for line in access)
    assert any(r.name.startswith("arq") for r in records)  # the worker's job lines were captured too
    leaks = [f"{r.name}: {r.getMessage()}" for r in records if found_in(r.getMessage() + (r.exc_text or ""), EVE_NEEDLES)]
    assert leaks == []
    assert any(r.name == "memory_service.curation.erasure" and "hmac-sha256-" in r.getMessage() for r in records)


async def test_erasing_an_unknown_user_is_fast_and_quiet(erase_service, caplog):
    await converse(erase_service)
    caplog.set_level(logging.INFO)
    started = time.monotonic()
    report = await erase_service.erase_user(AGENT, "nobody-at-all")
    elapsed = time.monotonic() - started
    assert report.memories == {} and report.query_log_entries == 0 and report.persistence == {}
    assert report.keys_revoked == report.keys_narrowed == []
    assert elapsed < 1.0, elapsed  # no query-log trim (its marker alone takes FalkorDB 1-2 s to log), no rewrite
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not any("nobody-at-all" in r.getMessage() for r in caplog.records)
