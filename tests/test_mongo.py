"""MongoDB beside the graph: mirroring through the outbox, fallback reads, migration.

MongoDB is a real server when MONGODB_URI is set, else the in-process stand-in (the pytest
header says which); the service reaches it through a TCP proxy the tests cut to stop it.
The graph store is an embedded FalkorDB of the test's own, stopped and restarted for real.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from redis.exceptions import ConnectionError as RedisConnectionError

from memory_service.backends.breaker import CLOSED, HALF_OPEN, OPEN
from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.backends.loopback import LoopbackServer
from memory_service.curation.migration import agent_namespaces
from memory_service.domain.models import AgentSettings, MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app
from memory_service.runtime import open_service
from memory_service.state import keyspace

from .conftest import clean_env
from .helpers import msg, shows_episode, wait_embedded, watch_queries
from .test_overload import guard

CLI = str(Path(sys.executable).parent / "memory-service")
CHAT = [
    ("alice", "user", "I prefer window seats on every flight."),
    ("alice", "assistant", "Noted, window seats it is."),
    ("alice", "user", "The flight to Lisbon leaves on June 3rd at 9am."),
    ("bob", "user", "We should book the hotel near the station because it is cheaper."),
    ("alice", "user", "I agree, the hotel near the station is fine."),
    ("bob", "user", "Always answer me in French."),
]


@pytest.fixture
async def graph(tmp_path):
    """A graph store of the test's own, so that stopping it stops nothing else."""
    server = EmbeddedFalkorDB(tmp_path / "graph")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def mongo_settings(settings, graph, mongo_uri, mongo_database):
    """The graph on its own server, state on the shared one, MongoDB through the proxy."""
    return settings.model_copy(update={
        "falkordb_url": graph.url, "redis_url": settings.falkordb_url, "mongodb_uri": SecretStr(mongo_uri),
        "mongodb_database": mongo_database, "outbox_drain_seconds": 0.1,
        "worker_retry_backoff_seconds": 0.1, "memory_formation_msg_interval": 100,
    })


async def converse(service, session: str, agent: str = "a1", start: int = 0, lines=CHAT) -> list[str]:
    ids = []
    for i, (user, role, content) in enumerate(lines, start):
        mid = f"{session}-{i}"
        await service.record_message(session, msg(agent, user, content, role=role, mid=mid, minute=i))
        ids.append(mid)
    return ids


async def snapshot(backend, namespaces, agent: str = "a1") -> dict[str, dict[str, str]]:
    """namespace -> {memory id: content} of everything the backend holds for the agent."""
    return {str(ns): {m.id: m.content for m in await backend.export(agent, ns)} for ns in namespaces}


async def settle(service, agent: str = "a1", timeout: float = 30) -> None:
    """Until the outbox has delivered everything to both stores."""
    _, backend = await service.agents.backend_for(agent)
    for _ in range(int(timeout / 0.05)):
        if not any((await backend.outbox.depth()).values()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"outbox not drained: {await backend.outbox.depth()}")


async def both_stores(service, agent: str = "a1"):
    _, mirrored = await service.agents.backend_for(agent)
    namespaces = await agent_namespaces(service.agents, agent)
    return await snapshot(mirrored.primary, namespaces), await snapshot(mirrored.mirror, namespaces)


async def test_every_graph_write_reaches_mongo_once(mongo_settings):
    async with open_service(mongo_settings, run_worker=True) as service:
        await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="flights, hotels"))
        await converse(service, "s1")
        assert (await service.form_memories("s1")).formed
        await settle(service)
        in_graph, in_mongo = await both_stores(service)
        assert in_graph == in_mongo and sum(map(len, in_graph.values())) > len(CHAT)
        _, backend = await service.agents.backend_for("a1")
        travel = await backend.mirror.shards.find_one({"_id": "shard:a1:travel"})
        assert (travel["name"], travel["extraction_focus"], travel["active"]) == ("travel", "flights, hotels", True)
        alice = await backend.mirror.user_memory.find_one({"_id": "user:a1:alice"})
        assert any("window seats" in d["content"] for d in alice["recent_directives"])
        assert (await backend.health())["outbox"] == {"graph": 0, "mongo": 0}


async def test_mongo_stopped_mid_run_gets_every_write_when_it_returns(mongo_settings, mongo_proxy):
    async with open_service(mongo_settings, run_worker=True) as service:
        await converse(service, "s1", lines=CHAT[:3])
        await settle(service)
        await mongo_proxy.stop()
        await converse(service, "s1", start=3, lines=CHAT[3:])
        assert (await service.form_memories("s1")).formed  # the graph carries on alone
        _, backend = await service.agents.backend_for("a1")
        await asyncio.sleep(0.3)
        health = await backend.health()
        assert health["outbox"]["mongo"] > 0 and health["outbox"]["graph"] == 0 and "mongo" in health["undelivered"]
        context = await service.assemble_memory_context("a1", "alice", "s1")
        assert shows_episode(context.xml) and context.source == "graph"
        await mongo_proxy.start()
        await settle(service)
        in_graph, in_mongo = await both_stores(service)
        assert in_graph == in_mongo
        assert (await backend.health())["dead_letters"] == {"graph": 0, "mongo": 0}
        count = await backend.mirror.memories.count_documents({})
        assert count == sum(map(len, in_mongo.values()))  # nothing written twice


async def test_mongo_stopped_mid_run_gets_shard_settings_and_fact_trims_when_it_returns(mongo_settings, mongo_proxy):
    settings = mongo_settings.model_copy(update={"facts_per_shard": 1})
    async with open_service(settings, run_worker=True) as service:
        _, backend = await service.agents.backend_for("a1")
        await mongo_proxy.stop()
        await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="flights, hotels, dates"))
        await converse(service, "s1")
        assert (await service.form_memories("s1")).formed
        shard = Namespace.shard("a1", "travel")
        facts = await backend.primary.export("a1", shard)
        assert len([f for f in facts if f.kind is MemoryKind.FACT]) > 1  # so that the cap of 1 evicted some
        assert await backend.primary.count("a1", shard, [MemoryKind.FACT]) == 1
        assert (await backend.outbox.depth())["mongo"] > 0
        await mongo_proxy.start()
        await settle(service)
        travel = await backend.mirror.shards.find_one({"_id": "shard:a1:travel"})
        assert (travel["name"], travel["extraction_focus"], travel["active"]) == ("travel", "flights, hotels, dates", True)
        assert await backend.mirror.count("a1", shard, [MemoryKind.FACT]) == 1
        [kept_in_graph] = await backend.primary.recent("a1", shard, [MemoryKind.FACT], 10)
        [kept_in_mongo] = await backend.mirror.recent("a1", shard, [MemoryKind.FACT], 10)
        assert kept_in_mongo.id == kept_in_graph.id


async def test_an_outbox_entry_in_the_format_before_operations_is_still_delivered(mongo_settings):
    """Entries queued by a version whose outbox held bare memory lists survive the upgrade."""
    async with open_service(mongo_settings, run_worker=False) as service:
        await converse(service, "s1", lines=CHAT[:1])
        await settle(service)
        _, backend = await service.agents.backend_for("a1")
        [message] = await backend.primary.export("a1", Namespace.session("s1"))
        legacy = message.model_copy(update={"id": "legacy-1", "content": "queued before the upgrade"})
        await service.state.redis.hset(keyspace.OUTBOX_ENTRIES, "old", json.dumps([legacy.model_dump(mode="json")]))
        await service.state.redis.rpush(keyspace.outbox_legacy_queue("mongo"), "old")
        await settle(service)
        [delivered] = await backend.mirror.get("a1", Namespace.session("s1"), ["legacy-1"])
        assert delivered.content == "queued before the upgrade"


async def test_graph_stopped_mid_run_keeps_writes_reads_mongo_and_catches_up(mongo_settings, graph):
    async with open_service(mongo_settings, run_worker=True) as service:
        await converse(service, "s1", lines=CHAT[:4])
        assert (await service.form_memories("s1")).formed
        await settle(service)
        port = graph.port
        graph.stop()
        # Recording goes on: the messages wait in the outbox for the graph.
        await converse(service, "s1", start=4, lines=CHAT[4:])
        context = await service.assemble_memory_context("a1", "alice", "s1", model="gpt-4o-mini")
        assert context.source == "mongo" and shows_episode(context.xml)
        health = await service.health()
        assert health["backends"]["graph"]["fallback_reads"] > 0 and health["backends"]["graph"]["outbox"]["graph"] > 0
        queued = await service.form_memories("s1", wait=False)
        await asyncio.sleep(0.5)  # the job fails its first tries against the stopped graph
        graph.start()  # on the same port and data: the graph is back
        assert graph.port == port
        summary = await service.queue.wait(queued.job_id, timeout=60)
        assert summary["formed"] and summary["message_ids"] == ["s1-4", "s1-5"]
        await settle(service)
        in_graph, in_mongo = await both_stores(service)
        assert in_graph == in_mongo
        episodes = await (await service.agents.backend_for("a1"))[1].primary.recent("a1", Namespace.session("s1"), [MemoryKind.EPISODE], 10)
        assert [e.metadata.message_ids for e in episodes] == [[f"s1-{i}" for i in range(4)], ["s1-4", "s1-5"]]


async def test_an_agent_that_just_opted_in_reads_its_memories_from_mongo(mongo_settings):
    async with open_service(mongo_settings, run_worker=True) as service:
        await service.put_agent("a1", AgentSettings(memory_backend="mongo"))
        await converse(service, "s1")
        assert (await service.form_memories("s1")).formed
        asked = "which window seats does alice prefer on the flight"  # words of the chat: full text finds them
        on_mongo = await service.assemble_memory_context("a1", "alice", "s1", query=asked)
        assert on_mongo.source == "mongo" and "window seats" in on_mongo.xml
        await service.put_agent("a1", AgentSettings(memory_backend="graph"))  # opted in, nothing migrated
        on_graph = await service.assemble_memory_context("a1", "alice", "s1", query=asked)
        # Namespaces empty in both stores count as served by the graph.
        # Search falls back too (the graph found nothing), so the relevant memories match.
        assert "mongo" in on_graph.source.split("+") and on_graph.xml == on_mongo.xml
        assert "<RelevantMemories>" in on_mongo.xml


async def test_a_mongo_agents_block_reuses_its_latest_messages_stored_vector(mongo_settings):
    """Without a query the block searches like the session's latest user message: once the
    message is embedded, its stored vector is the query's and the model does not run (Mongo's
    recent reads say which model a stored vector is of, as the graph's do)."""
    async with open_service(mongo_settings, run_worker=True) as service:
        await service.put_agent("a1", AgentSettings(memory_backend="mongo"))
        await converse(service, "s1")
        await wait_embedded(service, "a1")
        embedded, searches = await watch_queries(service, "a1")
        block = await service.assemble_memory_context("a1", "alice", "s1")
        assert block.source == "mongo" and embedded == [] and len(searches) == 1, (embedded, searches)
        [(asked, signals)] = searches
        assert asked.like is not None and asked.vector is None and signals == ["fulltext", "vector"]


async def test_an_empty_graph_answer_never_waits_for_a_stalled_mongo(mongo_settings, mongo_proxy):
    async with open_service(mongo_settings, run_worker=False) as service:
        await converse(service, "s1", lines=CHAT[:2])
        await settle(service)
        _, backend = await service.agents.backend_for("a1")
        await mongo_proxy.stall()  # MongoDB accepts and never answers
        # s9 holds nothing and alice has no directives: every namespace read of the block is
        # empty in the graph; the search over what alice may see finds her turn in s1.
        block = await guard(service.assemble_memory_context("a1", "alice", "s9", query="window seats"))
        assert block.source == "graph" and "window seats" in block.xml and not shows_episode(block.xml)
        assert backend.mongo_reads == 0 and backend.breaker.state == CLOSED
        await mongo_proxy.resume()


async def test_only_an_agent_that_named_mongo_reads_it_on_an_empty_graph_answer_until_it_is_migrated(
        mongo_settings, mongo_proxy):
    async with open_service(mongo_settings, run_worker=True) as service:
        _, backend = await service.agents.backend_for("a1")
        await service.put_agent("a1", AgentSettings(memory_backend="mongo"))
        await converse(service, "s1")
        await service.form_memories("s1")
        await service.put_agent("a1", AgentSettings(memory_backend="graph"))  # opted in, nothing migrated
        block = await service.assemble_memory_context("a1", "alice", "s1")
        assert "mongo" in block.source.split("+") and "window seats" in block.xml and backend.mongo_reads > 0
        # Settings an older version stored (before the named-backends set) count too.
        await service.state.redis.set(keyspace.agent_settings("a2"), AgentSettings(memory_backend="mongo").model_dump_json())
        await service.put_agent("a2", AgentSettings(memory_backend="graph"))
        assert await service.state.named_backend("a2", "mongo")
        # Back on mongo, then migrated: the graph holds everything, its empty answers stand.
        await service.put_agent("a1", AgentSettings(memory_backend="mongo"))
        report = await service.migrate_agent("a1", "graph")
        assert report.switched and not await service.state.named_backend("a1", "mongo")
        reads = backend.mongo_reads
        await mongo_proxy.stall()
        block = await guard(service.assemble_memory_context("a1", "carol", "s9", query="window seats"))
        assert block.source == "graph" and backend.mongo_reads == reads
        await mongo_proxy.resume()


async def test_the_mongo_breaker_opens_while_mongo_is_down_and_closes_once_it_answers(mongo_settings, mongo_proxy, graph):
    settings = mongo_settings.model_copy(update={
        "mongo_fallback_timeout_seconds": 0.5, "mongo_breaker_failures": 2, "mongo_breaker_window_seconds": 600,
        "mongo_breaker_cooloff_seconds": 0.3})
    async with open_service(settings, run_worker=False) as service:
        await converse(service, "s1")
        await settle(service)
        _, backend = await service.agents.backend_for("a1")
        session = Namespace.session("s1")

        async def read():
            return await guard(backend.recent("a1", session, [MemoryKind.MESSAGE], 10))

        graph.stop()  # every graph read fails: reads fall back to MongoDB
        assert len(await read()) == len(CHAT) and backend.fallback_reads == 1
        await mongo_proxy.stop()
        for _ in range(2):  # MongoDB fails too: the graph's error is the answer
            with pytest.raises(RedisConnectionError):
                await read()
        assert backend.breaker.state == OPEN
        reads = backend.mongo_reads
        with pytest.raises(RedisConnectionError):
            await read()
        assert backend.mongo_reads == reads and backend.skipped_reads >= 1  # not even tried
        health = await guard(service.health())
        assert health["backends"]["graph"]["mongo_breaker"]["state"] == OPEN
        assert health["backends"]["graph"]["mongo"]["ok"] is False
        await mongo_proxy.start()
        # After each cool-off one trial read goes to MongoDB (while the driver finds the
        # server again a trial may still fail, and the breaker opens for another cool-off).
        served = None
        for _ in range(600):
            if backend.breaker.state == HALF_OPEN:
                try:
                    served = await read()
                    break
                except RedisConnectionError:
                    pass
            await asyncio.sleep(0.05)
        assert served is not None and len(served) == len(CHAT)
        assert backend.breaker.state == CLOSED and backend.breaker.opened >= 1
        graph.start()


async def test_an_entry_mongo_refuses_is_dead_lettered_and_the_entries_behind_it_are_delivered(mongo_settings):
    settings = mongo_settings.model_copy(update={"outbox_max_attempts": 3})
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        _, backend = await service.agents.backend_for("a1")
        await converse(service, "s1", lines=CHAT[:2])
        await settle(service)
        first = (await backend.primary.export("a1", Namespace.session("s1")))[0]
        # Vectors of another dimension from the backfill: the graph refuses them at once, and
        # the copy queued for MongoDB can never be delivered.
        with pytest.raises(ValueError, match="3 dimensions"):
            await backend.set_embeddings("a1", {first.id: [1.0, 0.0, 0.0]})
        await converse(service, "s1", start=2, lines=CHAT[2:])
        await settle(service)  # the refused entry is out of the way, the later writes delivered
        in_graph, in_mongo = await both_stores(service)
        assert in_graph == in_mongo and len(in_mongo[str(Namespace.session("s1"))]) == len(CHAT)
        [dead] = await backend.outbox.dead_letters("mongo")
        assert dead.attempts == 3 and "3 dimensions" in dead.error and json.loads(dead.op)["op"] == "embeddings"

        health = (await http.get("/health?detail=true")).json()["backends"]["graph"]
        assert health["dead_letters"] == {"graph": 0, "mongo": 1}
        assert any("1 dead letter(s) for mongo" in alarm for alarm in health["alarms"])
        metrics = (await http.get("/metrics")).text
        assert 'memory_service_outbox_dead_letters{target="mongo"} 1.0\n' in metrics
        assert 'memory_service_outbox_alarm{target="mongo"} 1.0\n' in metrics
        assert 'memory_service_deployment_counter{name="outbox_dead_lettered_mongo"} 1.0\n' in metrics

        # Replayed: queued again at the end, refused again, dead again.
        assert await backend.outbox.replay("mongo", [dead.entry_id, "no-such-entry"]) == 1
        assert (await backend.outbox.depth())["mongo"] == 1
        await settle(service)
        [again] = await backend.outbox.dead_letters("mongo")
        assert again.entry_id == dead.entry_id and again.attempts == 3
        # Dropped: gone, with its operation.
        assert await backend.outbox.drop("mongo", [dead.entry_id]) == 1
        assert await service.state.redis.hget(keyspace.OUTBOX_ENTRIES, dead.entry_id) is None
        assert await backend.outbox.dead_letter_counts() == {"graph": 0, "mongo": 0}
        assert 'memory_service_outbox_alarm{target="mongo"} 0.0\n' in (await http.get("/metrics")).text


async def test_an_outage_of_mongo_never_counts_as_a_failed_delivery(mongo_settings, mongo_proxy):
    settings = mongo_settings.model_copy(update={"outbox_max_attempts": 1})  # one counted failure would dead-letter
    async with open_service(settings, run_worker=False) as service:
        _, backend = await service.agents.backend_for("a1")
        await mongo_proxy.stop()
        await converse(service, "s1", lines=CHAT[:2])
        for _ in range(600):
            if "mongo" in backend._down:  # a delivery found MongoDB down
                break
            await asyncio.sleep(0.05)
        assert "mongo" in (await backend.health())["undelivered"]
        assert await backend.outbox.dead_letter_counts() == {"graph": 0, "mongo": 0}
        assert await service.state.redis.hlen(keyspace.outbox_attempts("mongo")) == 0
        await mongo_proxy.start()
        await settle(service)
        in_graph, in_mongo = await both_stores(service)
        assert in_graph == in_mongo


async def test_the_outbox_alarms_at_its_bound_and_refuses_writes_past_it_until_mongo_is_back(
        mongo_settings, mongo_proxy, caplog):
    settings = mongo_settings.model_copy(update={"outbox_alarm_pending": 2, "outbox_max_pending": 3,
                                                 "metrics_stored_refresh_seconds": 0})
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        await mongo_proxy.stop()

        def post(i: int):
            return http.post("/v1/sessions/s1/messages", json={
                "agent_id": "a1", "user_id": "alice", "role": "user", "content": f"note {i}", "message_id": f"m{i}"})

        for i in range(3):
            assert (await post(i)).status_code == 200
        refused = await post(3)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "3 writes wait undelivered for the mongo store" in refused.json()["detail"]
        assert (await service.session_gate("s1")).pending_messages == 3  # the refused one changed nothing
        health = (await http.get("/health?detail=true")).json()["backends"]["graph"]
        assert health["outbox"] == {"graph": 0, "mongo": 3}
        assert any("refuses new writes" in alarm for alarm in health["alarms"])
        metrics = (await http.get("/metrics")).text
        assert 'memory_service_outbox_alarm{target="mongo"} 1.0\n' in metrics
        assert 'memory_service_outbox_pending{target="mongo"} 3.0\n' in metrics
        for _ in range(600):
            if any("outbox alarm" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        # Logged once, by the drain loop, at the depth it found: 2 (the alarm) or 3, as it
        # ran between the posts or after them.
        alarms = [r.getMessage() for r in caplog.records if "outbox alarm" in r.getMessage()]
        assert len(alarms) == 1 and re.match(r"outbox alarm: [23] writes wait undelivered for mongo", alarms[0])
        await mongo_proxy.start()
        await settle(service)
        assert (await post(3)).status_code == 200
        await settle(service)
        metrics = (await http.get("/metrics")).text
        assert 'memory_service_outbox_alarm{target="mongo"} 0.0\n' in metrics
        # What each store holds, counted by the store: the mirror holds the same four messages.
        assert 'memory_service_memories_stored{store="graph"} 4.0\n' in metrics
        assert 'memory_service_memories_stored{store="mongo"} 4.0\n' in metrics


async def test_with_both_stores_down_the_last_good_block_is_served(mongo_settings, graph, mongo_proxy):
    async with open_service(mongo_settings, run_worker=True) as service:
        await converse(service, "s1")
        await service.form_memories("s1")
        good = await service.assemble_memory_context("a1", "alice", "s1")
        graph.stop()
        await mongo_proxy.stop()
        await service.record_message("s1", msg("a1", "alice", "one more", mid="late", minute=30))  # kept in the outbox
        await service.put_shard("a1", "food", ShardIn(name="food"))  # invalidates the cached block
        served = await service.assemble_memory_context("a1", "alice", "s1")
        assert served.source == "last-good" and served.xml == good.xml
        fresh_user = await service.assemble_memory_context("a1", "carol", "s1")  # never assembled: no memories
        assert fresh_user.source in ("graph", "mongo", "graph+mongo") and not shows_episode(fresh_user.xml)


async def test_an_agent_moves_to_the_graph_and_back_with_every_memory(mongo_settings):
    async with open_service(mongo_settings, run_worker=True) as service:
        await service.put_agent("a1", AgentSettings(memory_backend="mongo", agent_extras={"tone": "warm"}))
        await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="flights, hotels"))
        await converse(service, "s1")
        await service.form_memories("s1")
        await converse(service, "s2", lines=CHAT[::-1])
        await service.form_memories("s2")
        mongo = await service.registry.get("mongo")
        namespaces = await agent_namespaces(service.agents, "a1")
        before = await snapshot(mongo, namespaces)
        assert sum(map(len, before.values())) > 2 * len(CHAT)

        dry = await service.migrate_agent("a1", "graph", dry_run=True)
        assert dry.total == sum(map(len, before.values())) and dry.missing == dry.total and not dry.switched
        assert (await service.get_agent("a1")).memory_backend == "mongo"

        # Interrupted after the first batch of one namespace, then run again: it resumes.
        class Interrupted(Exception):
            pass

        def interrupt(n: int) -> None:
            raise Interrupted

        with pytest.raises(Interrupted):
            await service.migrate_agent("a1", "graph", on_copied=interrupt)
        assert (await service.get_agent("a1")).memory_backend == "mongo"
        report = await service.migrate_agent("a1", "graph")
        assert report.switched and report.missing == 0 and 0 < report.copied < report.total
        agent = await service.get_agent("a1")
        assert (agent.memory_backend, agent.effective_backend, agent.agent_extras) == ("graph", "graph", {"tone": "warm"})
        graph_backend = (await service.agents.backend_for("a1"))[1]
        assert await snapshot(graph_backend.primary, namespaces) == before

        # On the graph, the conversation goes on; then back to mongo with nothing lost.
        await converse(service, "s3", lines=CHAT[:4])
        await service.form_memories("s3")
        namespaces = await agent_namespaces(service.agents, "a1")
        on_graph = await snapshot(graph_backend.primary, namespaces)
        await settle(service)
        await mongo.shards.delete_many({})  # as if the graph had run without mirroring
        back = await service.migrate_agent("a1", "mongo")
        assert back.switched and back.missing == 0
        assert await snapshot(mongo, namespaces) == on_graph
        travel = await mongo.shards.find_one({"_id": "shard:a1:travel"})
        assert (travel["name"], travel["extraction_focus"]) == ("travel", "flights, hotels")
        assert (await service.get_agent("a1")).effective_backend == "mongo"
        context = await service.assemble_memory_context("a1", "alice", "s3")
        assert context.source == "mongo" and shows_episode(context.xml)


async def test_the_migrate_command(mongo_settings):
    async with open_service(mongo_settings, run_worker=True) as service:
        await service.put_agent("a1", AgentSettings(memory_backend="mongo"))
        await converse(service, "s1")
        await service.form_memories("s1")
    env = {**clean_env(), "FALKORDB_URL": mongo_settings.falkordb_url, "REDIS_URL": mongo_settings.redis_url,
           "MONGODB_URI": mongo_settings.mongodb_uri.get_secret_value(), "MONGODB_DATABASE": mongo_settings.mongodb_database,
           "COLUMNS": "200", "EMBEDDER": mongo_settings.embedder,
           "EMBEDDING_DIMENSION": str(mongo_settings.embedding_dimension)}

    async def run(*args: str) -> tuple[int, str]:
        # Not subprocess.run: the proxy to MongoDB runs on this test's event loop.
        proc = await asyncio.create_subprocess_exec(CLI, "migrate", *args, env=env, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
        return proc.returncode, out.decode()

    code, out = await run("--agent", "a1", "--to", "graph", "--dry-run")
    assert code == 0 and "nothing was changed" in out, out
    code, out = await run("--agent", "nobody", "--to", "graph")
    assert code == 1 and "no settings and no sessions" in out, out
    code, out = await run("--agent", "a1", "--to", "cassandra")
    assert code == 1 and "unknown memory backend 'cassandra'" in out, out
    code, out = await run("--agent", "a1", "--to", "graph")
    assert code == 0 and "now uses the graph backend" in out, out
    code, out = await run("--agent", "a1", "--to", "graph")
    assert code == 1 and "already uses the 'graph' backend" in out, out


# The Mongo backend's own search machinery (the contract suite checks what it answers) ---------


@pytest.fixture
async def mongo(mongo_uri, mongo_database):
    from memory_service.backends.mongo import MongoBackend

    backend = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000, embedding_dimension=4)
    await backend.start()
    yield backend
    await backend.close()


def _fact(mid: str, content: str, embedding=None, agent: str = "a1"):
    from memory_service.domain.models import Memory, Provenance

    return Memory(id=mid, kind=MemoryKind.FACT, namespace=str(Namespace.shard(agent, "travel")), content=content,
                  metadata=Provenance(agent_id=agent), embedding=embedding)


async def test_start_creates_the_search_indexes(mongo):
    indexes = {ix["name"]: ix async for ix in await mongo.memories.list_indexes()}
    assert {"namespace_kind_recent", "agent_scope", "agent_text", "agent_unembedded"} <= set(indexes)
    assert list(indexes["agent_scope"]["key"])[:2] == ["agent_id", "namespace"]
    assert indexes["agent_text"]["default_language"] == "english"
    assert indexes["agent_unembedded"]["partialFilterExpression"] == {"needs_embedding": True}
    await mongo.start()  # again: nothing changes, nothing fails


async def test_vectors_are_float32_bson_vectors_scored_alike_with_and_without_numpy(mongo, monkeypatch):
    from bson.binary import VECTOR_SUBTYPE

    from memory_service.backends import mongo as module
    from memory_service.domain.models import StoreQuery

    vectors = {"x": [1.0, 0.0, 0.0, 0.0], "xy": [0.8, 0.6, 0.0, 0.0], "long": [3.0, 0.0, 4.0, 0.0],
               "zero": [0.0, 0.0, 0.0, 0.0]}
    await mongo.write([_fact(mid, mid, v) for mid, v in vectors.items()] + [_fact("bare", "no vector")])
    raw = await mongo.memories.find_one({"_id": "xy"})
    assert raw["embedding"].subtype == VECTOR_SUBTYPE and "needs_embedding" not in raw
    assert (await mongo.memories.find_one({"_id": "bare"}))["needs_embedding"] is True
    query = StoreQuery(terms=[], vector=[2.0, 0.0, 0.0, 0.0])  # not unit length: cosine all the same
    with_numpy = (await mongo.search("a1", query))["vector"]
    monkeypatch.setattr(module, "numpy", None)
    without = (await mongo.search("a1", query))["vector"]
    assert [m.id for m, _ in with_numpy] == [m.id for m, _ in without] == ["x", "xy", "long", "zero"]
    assert [s for _, s in with_numpy] == pytest.approx([s for _, s in without], abs=1e-6)
    assert [s for _, s in without] == pytest.approx([1.0, 0.8, 0.6, 0.0], abs=1e-6)
    assert (await mongo.search("a1", StoreQuery(terms=[], vector=[0.0] * 4)))["vector"] == []
    with pytest.raises(ValueError, match="3 dimensions"):
        await mongo.write([_fact("short", "three numbers", [1.0, 0.0, 0.0])])


async def test_memories_stored_before_search_get_their_search_fields_at_start(mongo_uri, mongo_database):
    """Documents of the first layout (no search_text, no embedding mark) become searchable."""
    from memory_service.backends.mongo import MongoBackend, _document
    from memory_service.domain.models import StoreQuery

    old = _document(_fact("old", "The hotel near the station"))
    del old["search_text"]
    first = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000)
    await first.memories.insert_one(old)
    await first.memories.create_index([("agent_id", 1), ("namespace", 1)], name="agent_namespace")
    await first.start()
    try:
        assert [m.id for m in await first.unembedded("a1", 10)] == ["old"]
        hits = await first.search("a1", StoreQuery(terms=["hotel"]))
        assert [m.id for m, _ in hits["fulltext"]] == ["old"]
        names = {ix["name"] async for ix in await first.memories.list_indexes()}
        assert "agent_namespace" not in names  # agent_scope covers it
        assert (await first.meta.find_one({"_id": "memories_layout"}))["version"] == 2
    finally:
        await first.close()


def test_the_mongo_backend_without_a_uri_names_the_missing_setting():
    """Registered only with MONGODB_URI set; built without one it said
    "'NoneType' object has no attribute 'get_secret_value'"."""
    from memory_service.config import Settings
    from memory_service.runtime import _mongo_backend

    with pytest.raises(RuntimeError, match="MONGODB_URI is not set"):
        _mongo_backend(Settings(_env_file=None, mongodb_uri=None))
