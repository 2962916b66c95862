"""Each stored message embedded exactly once, by whichever path claims it first: the record-time
run (a live session's user message), the agent's embedding job and the backfill, across worker
processes and crashes (memory_service/state/embed_claims.py, memory_service/embedding/once.py).

Real components: two `memory-service worker` processes on a store of this module's own, the
API side in process, and an OpenAI-compatible embeddings endpoint on loopback
(tests/fake_embeddings.py) that counts every text it embeds, whoever asked."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from redis.asyncio import Redis

from memory_service.domain.models import BatchMessageIn, Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import HashEmbedder
from memory_service.embedding.once import embed_once
from memory_service.formation.steps import message_memory_id
from memory_service.runtime import open_service
from memory_service.state import keyspace

from .fake_embeddings import EmbeddingsServer
from .helpers import T0, msg
from .test_slots import until
from .test_worker import WorkerProcess, make_settings, store, url  # noqa: F401 (the module's own store)

MODEL = "fake-embedding"
COUNTERS = ("embedded_at_record", "embedded_after_record", "embeddings_backfilled")
# No formation (its memories are embedded as it writes them, not counted here), no cold sweep.
QUIET = {"memory_formation_msg_interval": 100_000, "memory_formation_token_interval": 10_000_000,
         "consider_cold_after_minutes": 1000, "worker_job_timeout_seconds": 60}


def remote(embeddings: EmbeddingsServer, **more) -> dict[str, object]:
    return {"embedder": "openai", "embedding_base_url": embeddings.base_url, "embedding_model": MODEL,
            "embedding_dimension": 64, **QUIET, **more}


async def claims_of(url: str, agent_id: str) -> list[bytes]:
    redis = Redis.from_url(url)
    try:
        return [k async for k in redis.scan_iter(match=keyspace.embed_claim(agent_id, "*"), count=1000)]
    finally:
        await redis.aclose()


async def stored_vectors(service, agent_id: str) -> dict[str, tuple[str | None, bool]]:
    """Each stored message -> (its vector's model, whether it is still marked for embedding)."""
    _, backend = await service.agents.backend_for(agent_id)
    rows = await backend._read(agent_id, "MATCH (n) WHERE n.kind = 'message' RETURN n.uuid AS id, "
                                         "n.embedding_model AS model, n.needs_embedding AS needs, "
                                         "n.embedding IS NOT NULL AS has")
    return {r["id"]: (r["model"] if r["has"] else None, bool(r["needs"])) for r in rows}


# --- the claims themselves ------------------------------------------------------------------------


async def test_a_claim_is_one_callers_until_released_or_expired_and_only_its_own_renews(settings):
    async with open_service(settings.model_copy(update={"embedding_claim_seconds": 0.5}), run_worker=False) as service:
        claims = service.state.embed_claims
        first = await claims.claim("a1", ["m1", "m2"])
        second = await claims.claim("a1", ["m2", "m3"])
        assert first.ids == ("m1", "m2") and second.ids == ("m3",)  # m2 is the first's
        assert await claims.renew(second, ["m2", "m3"]) == {"m3"}  # renewing another's claim does nothing
        assert await claims.release(second) == 1
        assert (await claims.claim("a1", ["m3"])).ids == ("m3",)  # let go: claimable at once
        await asyncio.sleep(0.7)  # the first caller died: its claims expire with the lease
        third = await claims.claim("a1", ["m1", "m2"])
        assert third.ids == ("m1", "m2")
        assert await claims.renew(first) == set()  # the first is told: its vectors are not written
        assert await claims.release(first) == 0 and (await claims.claim("a1", ["m1"])).ids == ()


@pytest.mark.parametrize("store_name", ["graph", "mongo"])
async def test_two_callers_racing_over_one_backlog_store_each_vector_once(settings, mongo_uri, mongo_database,
                                                                          store_name):
    """Two readers of the same unembedded memories at once, on each backend: each memory is
    claimed, embedded and stored by one of them."""
    from pydantic import SecretStr

    config = settings.model_copy(update={"mongodb_uri": SecretStr(mongo_uri), "mongodb_database": mongo_database}) \
        if store_name == "mongo" else settings
    async with open_service(config, run_worker=False) as service:
        backend = await service.registry.get(store_name)
        session = Namespace.session("s1")
        await backend.write([Memory(id=f"m{i}", kind=MemoryKind.MESSAGE, namespace=str(session), content=f"note {i}",
                                    metadata=Provenance(agent_id="a1", session_id="s1"), valid_at=T0)
                             for i in range(40)])
        calls: Counter[str] = Counter()

        class Counted(HashEmbedder):
            async def embed(self, texts, *, query=False):
                calls.update(texts)
                await asyncio.sleep(0.01)  # both readers are in their model call at once
                return await super().embed(texts, query=query)

        embedder = Counted(64)
        read = [await backend.unembedded("a1", 100) for _ in range(3)]  # each reads the whole backlog
        claims = service.state.embed_claims
        outcomes = await asyncio.gather(*(embed_once(embedder, claims, backend, "a1", memories, 8)
                                          for memories in read[:2]))
        assert sum(o.stored for o in outcomes) == 40 and sorted(calls.values()) == [1] * 40
        assert all(o.claimed + len(o.busy) == 40 for o in outcomes)  # what one did not claim, the other held
        # A reader whose read came before those writes claims after them: it finds them claimed still.
        late = await embed_once(embedder, claims, backend, "a1", read[2], 8)
        assert late.stored == 0 and len(late.busy) == 40 and sorted(calls.values()) == [1] * 40
        assert await backend.unembedded("a1", 100) == [] and len(await claims_of_state(service)) == 40


async def test_a_turn_longer_than_the_lease_keeps_its_claims_and_stores_its_vectors(settings):
    """One model call that outlasts the claims' lease (a loaded machine, long turns, or a turn
    waiting behind callers at the model): the claims are renewed in the background while it
    runs, so its vectors are written, not dropped and embedded again over and over."""
    from memory_service.state.embed_claims import EmbedClaims

    async with open_service(settings, run_worker=False) as service:
        backend = await service.registry.get("graph")
        session = Namespace.session("s1")
        await backend.write([Memory(id=f"m{i}", kind=MemoryKind.MESSAGE, namespace=str(session), content=f"note {i}",
                                    metadata=Provenance(agent_id="a1", session_id="s1"), valid_at=T0)
                             for i in range(6)])

        class Slow(HashEmbedder):
            async def embed(self, texts, *, query=False):
                await asyncio.sleep(1.2)  # 2.4 leases
                return await super().embed(texts, query=query)

        claims = EmbedClaims(service.state.redis, lease_seconds=0.5)
        outcome = await embed_once(Slow(64), claims, backend, "a1", await backend.unembedded("a1", 100), 6)
        assert (outcome.stored, outcome.lost) == (6, 0)
        assert await backend.unembedded("a1", 100) == []


async def claims_of_state(service) -> list[str]:
    return [k async for k in service.state.redis.scan_iter(match=keyspace.embed_claim("a1", "*"))]


# --- across processes -----------------------------------------------------------------------------


async def test_two_workers_the_backfill_and_record_time_runs_embed_each_message_once(url, tmp_path, embeddings):
    """3,000 messages of four agents through the batch route, and live sessions' user messages
    through the single route (embedded as recorded), while two worker processes run the
    embedding jobs and the backfill runs again and again beside them: every message's text
    reaches the model once, the counters add up to the messages recorded, and every message
    holds one vector of the current model."""
    embeddings.delay = 0.02  # each call takes a moment: the paths overlap
    workers = [WorkerProcess(url, tmp_path / f"worker{i}.log", **remote(embeddings)).start() for i in range(2)]
    try:
        for worker in workers:
            await worker.ready()
        async with open_service(make_settings(url, **remote(embeddings)), run_worker=False) as service:
            agents = [f"agent{k}" for k in range(4)]
            texts: dict[str, str] = {}  # memory id -> the text embedded for it

            async def batches(agent_id: str) -> None:
                for b in range(5):
                    items = [BatchMessageIn(session_id=f"{agent_id}-s{i % 10}", user_id="ann", role="user",
                                            content=f"batch note {b}-{i} of {agent_id}", message_id=f"b{b}-{i}")
                             for i in range(150)]
                    out = await service.record_batch(agent_id, items)
                    assert all(item.status == "recorded" for item in out.items)
                    for item in items:
                        texts[message_memory_id(item.session_id, item.message_id)] = f"ann: {item.content}"

            async def live(session: str) -> None:
                for i in range(25):
                    result = await service.record_message(session, msg("agent0", "bob", f"live note {i} in {session}",
                                                                       mid=f"l{i}"))
                    texts[message_memory_id(session, result.message_id)] = f"bob: live note {i} in {session}"
                    await service.assemble_memory_context("agent0", "bob", session, budget=2000)  # the session is live

            async def backfills(done: asyncio.Event) -> None:
                while not done.is_set():
                    await service.backfill_embeddings()
                    await asyncio.sleep(0.05)

            done = asyncio.Event()
            backfilling = asyncio.create_task(backfills(done))
            await asyncio.gather(*(batches(a) for a in agents), *(live(f"live{k}") for k in range(4)))
            assert len(texts) == 3100

            async def all_embedded() -> bool:
                for agent_id in agents:
                    if any(needs for _, needs in (await stored_vectors(service, agent_id)).values()):
                        return False
                return True

            await until(all_embedded, "every message embedded", timeout=120)
            done.set()
            await backfilling
            await until(lambda: _idle(service, agents), "the embedding jobs to let go of their locks", timeout=120)

            counters = await service.state.metrics()
            assert sum(counters.get(c, 0) for c in COUNTERS) == len(texts), {c: counters.get(c) for c in COUNTERS}
            assert all(counters.get(c, 0) > 0 for c in COUNTERS), {c: counters.get(c) for c in COUNTERS}
            assert {t: n for t, n in embeddings.seen.items() if t in set(texts.values()) and n != 1} == {}
            assert set(texts.values()) <= set(embeddings.seen)
            stored = {mid: v for agent_id in agents for mid, v in (await stored_vectors(service, agent_id)).items()}
            assert set(stored) == set(texts) and set(stored.values()) == {(f"openai:{MODEL}", False)}
        logs = [w.log.read_text() for w in workers]
        assert all("embed_pending" in log for log in logs), "both workers should have embedded"
    finally:
        for worker in workers:
            worker.stop()


async def _idle(service, agents: list[str]) -> bool:
    return not await service.state.redis.exists(*(keyspace.embed_lock(a) for a in agents))


async def test_a_worker_killed_between_claim_and_write_leaves_its_messages_to_the_next_after_the_lease(
        url, tmp_path, embeddings):
    """SIGKILL the worker while it holds its claims and waits for the model: nothing is
    written, nothing is lost; its claims keep every other caller off for the lease, and then
    the backfill embeds every message once."""
    lease = 3.0
    worker = WorkerProcess(url, tmp_path / "worker.log", **remote(embeddings, embedding_claim_seconds=lease)).start()
    try:
        await worker.ready()  # its embedder's probe answered
        settings = make_settings(url, **remote(embeddings, embedding_claim_seconds=lease))
        async with open_service(settings, run_worker=False) as service:
            embeddings.hold = asyncio.Event()  # from now on the model's calls wait: the worker holds its claims
            calls = embeddings.calls
            items = [BatchMessageIn(session_id="s1", user_id="ann", role="user", content=f"note {i}", message_id=f"m{i}")
                     for i in range(20)]
            await service.record_batch("a1", items)

            async def claimed() -> bool:  # the job claimed them all, and its model call arrived
                return len(await claims_of(url, "a1")) == 20 and embeddings.calls > calls

            await until(claimed, "the worker's claims and its model call", timeout=60)
            worker.kill()
            embeddings.hold.set()
            assert set((await stored_vectors(service, "a1")).values()) == {(None, True)}  # nothing written
            seen = embeddings.texts
            report = await service.backfill_embeddings()  # within the lease: the dead worker's claims hold
            assert report["embedded"] == 0 and embeddings.texts == seen
            await asyncio.sleep(lease + 0.5)
            report = await service.backfill_embeddings()
            assert report["embedded"] == 20
            assert set((await stored_vectors(service, "a1")).values()) == {(f"openai:{MODEL}", False)}
            counters = await service.state.metrics()
            assert sum(counters.get(c, 0) for c in COUNTERS) == 20
            assert len(await claims_of(url, "a1")) == 20  # kept until the lease ends, against stale reads
    finally:
        worker.stop()
