"""The record path (docs/ingest.md): embedding after the acknowledgement, group commit of
the graph writes, the agent's embedding lock, duplicates under concurrency. Real stores,
a real worker, a real embeddings server on loopback; no speed is asserted."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from redis.exceptions import ResponseError

from memory_service._vendor.arq.constants import in_progress_key_prefix
from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.backends.graph import GraphBackend, graph_name
from memory_service.backends.outages import is_unavailable
from memory_service.domain.errors import BackendUnavailable, Conflict, InvalidInput
from memory_service.domain.models import BatchMessageIn, Memory, MemoryKind, MessageIn, Provenance, StoreQuery
from memory_service.domain.namespaces import Namespace
from memory_service.formation.jobs import EMBED_JOB
from memory_service.formation.steps import message_memory_id
from memory_service.ingest.group_commit import GroupCommit, RowRefused
from memory_service.runtime import open_service
from memory_service.state.keyspace import embed_due, embed_lock

from .conftest import one_server
from .helpers import T0, msg, wait_embedded
from .tcp_proxy import ThreadedTcpProxy


async def unembedded(service, agent_id: str) -> list[str]:
    _, backend = await service.agents.backend_for(agent_id)
    return sorted(m.id for m in await backend.unembedded(agent_id, 1000))


# --- embedding after the acknowledgement ------------------------------------------------------


async def test_a_record_is_acknowledged_while_the_embedder_hangs_and_the_worker_embeds_it_after(
        remote_service, embeddings):
    service = remote_service
    embeddings.hold = asyncio.Event()  # every embedding call waits
    result = await asyncio.wait_for(
        service.record_message("s1", msg("a1", "alice", "The spare key is under the blue flower pot.", mid="m1")),
        timeout=30)  # inline embedding would never return
    assert result.sequence == 1 and not result.duplicate
    assert await unembedded(service, "a1") == [message_memory_id("s1", "m1")]
    # Full text finds it at once (asked of the store: a search would embed its query, and wait).
    _, backend = await service.agents.backend_for("a1")
    hits = await backend.search("a1", StoreQuery(terms=["spare", "flower"], limit=5))
    assert [m.id for m, _ in hits["fulltext"]] == [message_memory_id("s1", "m1")]

    embeddings.hold.set()
    await wait_embedded(service, "a1")  # the embedding job, enqueued by the record, did it
    found = await service.search("a1", "spare key flower pot", kinds=[MemoryKind.MESSAGE])
    assert "vector" in found.results[0].explanation.signals


async def test_a_down_embedder_fails_no_record_and_is_left_alone_until_its_lock_expires(remote_service, embeddings):
    service = remote_service
    embeddings.down = True
    for i in range(3):
        result = await service.record_message("s1", msg("a1", "alice", f"note {i} about the ferry", mid=f"m{i}"))
        assert result.sequence == i + 1
    await wait_for_embedding_jobs(service)
    calls = embeddings.calls
    assert calls > 0  # the job tried, and gave up
    await service.record_message("s1", msg("a1", "alice", "one more note", mid="m3"))
    # The failed job kept the agent's lock: this record enqueued nothing.
    assert not await embedding_jobs(service)
    assert embeddings.calls == calls
    assert 0 < await service.state.redis.pttl(embed_lock("a1")) <= 30_000
    assert len(await unembedded(service, "a1")) == 4

    embeddings.down = False  # back: the job (the backfill cron, or the next record after the lock) embeds
    report = await service.embed_pending("a1")
    assert report["embedded"] == 4 and await unembedded(service, "a1") == []
    assert await service.state.redis.exists(embed_lock("a1")) == 0  # let go: the next record enqueues again


async def embedding_jobs(service) -> list[str]:
    """Embedding jobs queued or running. (arq's ``queued_jobs`` raises when a listed job,
    e.g. a cron's, finishes before it is read: the list is read again.)"""
    for _ in range(20):
        try:
            queued = [j.job_id for j in await service.queue.pool.queued_jobs() if j.function == EMBED_JOB]
            break
        except RuntimeError:  # 'job ... not found': it completed meanwhile
            await asyncio.sleep(0.01)
    else:
        raise AssertionError("the queue kept changing under every read")
    running = await service.queue.pool.keys(f"{in_progress_key_prefix}embed:*")
    return queued + list(running)


async def wait_for_embedding_jobs(service, timeout: float = 60) -> None:
    for _ in range(int(timeout / 0.05)):
        if not await embedding_jobs(service):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"embedding jobs still queued or running after {timeout}s")


async def test_without_an_embedder_nothing_is_enqueued_and_messages_wait_for_the_backfill(settings):
    async with open_service(settings, run_worker=False) as service:
        service.sessions.embedder = None  # as if none were configured
        await service.record_message("s1", msg("a1", "alice", "hello", mid="m1"))
        assert await service.queue.pool.queued_jobs() == []
        assert await service.state.redis.exists(embed_due("a1"), embed_lock("a1")) == 0
        assert len(await unembedded(service, "a1")) == 1


async def test_records_and_a_batch_go_on_after_the_server_forgot_its_scripts(settings):
    """One server takes a record's scripts by EVALSHA in a pipeline (memory_service/state/store.py,
    ``_with_scripts``); a server that lost them (restarted, SCRIPT FLUSH) answers NOSCRIPT, and
    the calls run again, in order, loading them."""
    async with open_service(settings, run_worker=False) as service:
        await service.record_message("nos", msg("a1", "alice", "first", mid="m1"))
        await service.state.redis.script_flush()
        second = await service.record_message("nos", msg("a1", "alice", "second", mid="m2"))
        again = await service.record_message("nos", msg("a1", "alice", "second", mid="m2"))
        assert (second.sequence, second.duplicate, again.sequence, again.duplicate) == (2, False, 2, True)
        await service.state.redis.script_flush()
        batch = [BatchMessageIn(session_id="nos", user_id="alice", role="user", content=f"batch {i}",
                                message_id=f"b{i}") for i in range(3)]
        answer = await service.record_batch("a1", batch)
        assert [(item.status, item.sequence) for item in answer.items] == [("recorded", 3), ("recorded", 4),
                                                                          ("recorded", 5)]
        counters = await service.state.counters("nos")
        assert (counters.pending_messages, counters.messages) == (5, 5)


# --- the agent's embedding lock ------------------------------------------------------------------


async def commit(service, session_id: str, message_id: str, lock_ms: int = 30_000):
    return await service.state.commit_message(session_id, message_id, 1, 1.0, "alice", False, "a1",
                                              embed_lock_ms=lock_ms)


async def test_one_embedding_job_per_agent_and_no_message_left_behind(service):
    state = service.state
    first = await commit(service, "s1", "m1")
    assert first.first and first.enqueue_embedding  # took the lock: its caller enqueues the job
    assert first.counters.pending_messages == 1 and first.counters.agent_id is None  # (no reserve in this test)
    second = await commit(service, "s1", "m2")
    assert second.first and not second.enqueue_embedding  # a job is queued: nothing more to enqueue
    retry = await commit(service, "s1", "m2")
    assert not retry.first and not retry.enqueue_embedding

    # The job's pass begins (clears the mark); a message arrives during it; the job must not stop.
    await state.start_embedding("a1")
    during = await commit(service, "s2", "m3")
    assert not during.enqueue_embedding
    assert await state.finish_embedding("a1", 30_000) is True  # marked due meanwhile: another pass
    await state.start_embedding("a1")
    assert await state.finish_embedding("a1", 30_000) is False  # nothing new: the lock is let go
    assert (await commit(service, "s3", "m4")).enqueue_embedding  # and the next message enqueues again


async def test_a_record_without_an_embedder_takes_no_lock(service):
    plain = await commit(service, "s1", "m1", lock_ms=0)
    assert plain.first and not plain.enqueue_embedding
    assert await service.state.redis.exists(embed_due("a1"), embed_lock("a1")) == 0


async def test_an_embedding_job_out_of_time_enqueues_its_sequel_and_keeps_the_lock(settings):
    async with open_service(settings, run_worker=False) as service:
        for i in range(5):
            await service.record_message("s1", msg("a1", "alice", f"note {i} on the train times", mid=f"m{i}"))
        [job] = await service.queue.pool.queued_jobs()  # the first record's
        assert job.function == EMBED_JOB and job.args == ("a1",)
        report = await service.pipeline.embed_pending("a1", batch=2, seconds=0)
        assert report == {"embedded": 2, "passes": 1}
        assert len(await unembedded(service, "a1")) == 3
        assert {j.job_id for j in await service.queue.pool.queued_jobs()} - {job.job_id}  # the sequel
        assert await service.state.redis.exists(embed_lock("a1")) == 1
        await service.pipeline.embed_pending("a1", batch=2)
        assert await unembedded(service, "a1") == []
        assert await service.state.redis.exists(embed_lock("a1")) == 0
        assert (await service.state.metrics())["embedded_after_record"] == 5


async def test_the_job_embeds_in_calls_of_the_batch_size_and_keeps_what_was_embedded_before_a_failure(
        settings, embeddings):
    config = settings.model_copy(update={"embedder": "openai", "embedding_base_url": embeddings.base_url,
                                         "embedding_model": "fake-embedding", "embedding_dimension": 64,
                                         "embedding_batch_size": 2})
    async with open_service(config, run_worker=False) as service:
        for i in range(5):
            await service.record_message("s1", msg("a1", "alice", f"note {i} on the ferry times", mid=f"m{i}"))
        embeddings.batches.clear()
        embeddings.failures = [None, 400]  # the second call is refused (not retried: a 400 is not transient)
        report = await service.embed_pending("a1")
        assert embeddings.batches == [2] and report["embedded"] == 2  # a formation job waits behind one call
        assert len(await unembedded(service, "a1")) == 3  # the first call's vectors were kept
        await service.state.redis.delete(embed_lock("a1"))  # (as when it expires)
        report = await service.embed_pending("a1")
        assert embeddings.batches == [2, 2, 1] and report["embedded"] == 3
        assert await unembedded(service, "a1") == []


async def test_many_records_of_many_sessions_are_all_embedded_by_the_worker(service):
    await asyncio.gather(*(
        service.record_message(f"s{s}", msg("a1", f"u{s}", f"session {s} turn {i}: the museum opens at {i} am",
                                            mid=f"m{i}", minute=i))
        for s in range(8) for i in range(6)))
    await wait_embedded(service, "a1")
    found = await service.search("a1", "museum opens", scope="session", session_id="s3", top_k=10)
    assert {r.source_message_ids[0] for r in found.results} == {f"m{i}" for i in range(6)}
    assert all("vector" in r.explanation.signals for r in found.results)


# --- group commit ------------------------------------------------------------------------------


def memory(memory_id: str, content: str, agent: str = "a1", embedding: list[float] | None = None,
           minutes: int = 0) -> Memory:
    return Memory(id=memory_id, kind=MemoryKind.MESSAGE, namespace=str(Namespace.session("gc")), content=content,
                  metadata=Provenance(agent_id=agent, session_id="gc", message_ids=[memory_id], sequence=1),
                  valid_at=T0 + timedelta(minutes=minutes), embedding=embedding)


class CountingBackend(GraphBackend):
    """The real graph backend, counting its write calls and the rows of each."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    async def write(self, memories):
        self.batches.append(len(memories))
        return await super().write(memories)


@pytest.fixture
async def graph(settings):
    backend = CountingBackend(settings.falkordb_url, settings, embedding_dimension=64)
    await backend.start()
    yield backend
    await backend.close()


async def test_concurrent_writes_of_one_agent_are_stored_together(graph):
    writes = GroupCommit()
    await asyncio.gather(*(writes.write(graph, "a1", memory(f"m{i}", f"note {i}")) for i in range(20)))
    assert graph.batches == [20]  # one statement, not 20
    assert await graph.count("a1", Namespace.session("gc")) == 20
    await asyncio.gather(writes.write(graph, "a1", memory("x", "x")), writes.write(graph, "a2", memory("y", "y", "a2")))
    assert sorted(graph.batches[1:]) == [1, 1]  # agents apart: one agent's failure is not another's
    assert await graph.count("a2", Namespace.session("gc")) == 1


async def test_a_row_that_cannot_be_written_fails_alone_and_its_batch_mates_are_stored(graph):
    writes = GroupCommit()
    bad = memory("bad", "a vector of the wrong size", embedding=[1.0] * 3)
    outcomes = await asyncio.gather(writes.write(graph, "a1", memory("good-1", "one")), writes.write(graph, "a1", bad),
                                    writes.write(graph, "a1", memory("good-2", "two")), return_exceptions=True)
    assert graph.batches == [3, 1, 2, 1, 1]  # the batch, then halves until the bad row is alone
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], RowRefused) and "3 dimensions" in str(outcomes[1].__cause__)
    assert sorted(m.id for m in await graph.export("a1", Namespace.session("gc"))) == ["good-1", "good-2"]
    assert writes._lanes == {}  # nothing left behind once idle


async def test_a_row_the_store_refuses_fails_alone_in_a_few_statements(graph):
    """U+0000 makes FalkorDB refuse the whole statement ("Failed to parse query parameter"):
    the batch is bisected, the row is refused alone, the seven others are stored."""
    writes = GroupCommit()
    rows = [memory(f"m{i}", "bad \x00 text" if i == 5 else f"note {i}") for i in range(8)]
    outcomes = await asyncio.gather(*(writes.write(graph, "a1", row) for row in rows), return_exceptions=True)
    assert graph.batches == [8, 4, 4, 2, 1, 1, 2]  # 1 + 2·log2(8) statements
    assert [type(o).__name__ for o in outcomes] == ["NoneType"] * 5 + ["RowRefused"] + ["NoneType"] * 2
    assert isinstance(outcomes[5].__cause__, ResponseError)
    stored = sorted(m.id for m in await graph.export("a1", Namespace.session("gc")))
    assert stored == [f"m{i}" for i in range(8) if i != 5]


async def test_an_outage_fails_every_row_of_the_batch_at_once(settings):
    """An outage is no row's fault: one statement, every row gets the connection error
    (no bisection against a dead store), nothing stored; the rows go through once it is back."""
    parts = urlsplit(one_server(settings))
    proxy = ThreadedTcpProxy(parts.hostname, parts.port).start()
    proxy.proxy.password = parts.password
    backend = CountingBackend(proxy.url, settings, embedding_dimension=64)
    await backend.start()
    try:
        writes = GroupCommit()
        proxy.stop()
        rows = [memory(f"m{i}", f"note {i}") for i in range(6)]
        outcomes = await asyncio.gather(*(writes.write(backend, "a1", row) for row in rows), return_exceptions=True)
        assert backend.batches == [6]
        assert all(is_unavailable(o) and not isinstance(o, RowRefused) for o in outcomes), outcomes
        proxy.start()
        await asyncio.gather(*(writes.write(backend, "a1", row) for row in rows))
        assert await backend.count("a1", Namespace.session("gc")) == 6
    finally:
        await backend.close()
        proxy.close()


async def test_the_same_id_twice_in_one_batch_is_stored_once_as_first_written(graph):
    writes = GroupCommit()
    await asyncio.gather(writes.write(graph, "a1", memory("m1", "same", minutes=1)),
                         writes.write(graph, "a1", memory("m1", "same", minutes=9)))
    [stored] = await graph.export("a1", Namespace.session("gc"))
    assert stored.valid_at == T0 + timedelta(minutes=1)


async def test_a_graph_deleted_under_the_process_gets_its_indexes_again(graph):
    await graph.write([memory("m1", "the ferry to the island")])
    await graph.client.select_graph(graph_name("a1")).delete()
    await graph.write([memory("m2", "the lighthouse tour")])
    hits = await graph.search("a1", StoreQuery(terms=["lighthouse"], namespaces=None, limit=5))
    assert [m.id for m, _ in hits["fulltext"]] == ["m2"]  # found through the full-text index


async def test_a_store_outage_fails_every_concurrent_record_and_leaves_nothing_pending(settings, tmp_path):
    graph_store = EmbeddedFalkorDB(tmp_path / "graph-only")
    config = settings.model_copy(update={"falkordb_url": graph_store.start(), "redis_url": settings.falkordb_url})
    try:  # memories on their own server, state on the shared one
        async with open_service(config, run_worker=False) as service:
            await service.record_message("s0", msg("a1", "alice", "before the outage", mid="m0"))
            graph_store.stop()
            outcomes = await asyncio.gather(*(
                service.record_message(f"s{i % 3}", msg("a1", "alice", f"during {i}", mid=f"d{i}")) for i in range(9)),
                return_exceptions=True)
            assert all(isinstance(o, BackendUnavailable) and "send it again" in str(o) for o in outcomes), outcomes
            assert [(await service.session_gate(f"s{i}")).pending_messages for i in range(3)] == [1, 0, 0]
            # The write may have landed (a timeout): each id stays reserved, held by no call,
            # for the client's retry or the recovery.
            held = [e for i in range(3) for e in await service.state.in_flight(f"s{i}")]
            assert sorted(e.message_id for e in held) == sorted(f"d{i}" for i in range(9))
            assert {e.holders for e in held} == {0}
            graph_store.start()  # back, on the same port and data
            again = await asyncio.gather(*(
                service.record_message(f"s{i % 3}", msg("a1", "alice", f"during {i}", mid=f"d{i}")) for i in range(9)))
            assert not any(r.duplicate for r in again)
            assert [(await service.session_gate(f"s{i}")).pending_messages for i in range(3)] == [4, 3, 3]
            assert {r.message_id: r.sequence for r in again} == {e.message_id: e.sequence for e in held}  # kept
            assert await service.state.in_flight_count() == 0
            _, backend = await service.agents.backend_for("a1")
            assert sum([await backend.count("a1", Namespace.session(f"s{i}")) for i in range(3)]) == 10
    finally:
        graph_store.stop()


# --- duplicates under concurrency --------------------------------------------------------------


async def test_the_same_message_sent_concurrently_is_recorded_once(service):
    results = await asyncio.gather(*(service.record_message("s1", msg("a1", "alice", "hello there", mid="m1"))
                                     for _ in range(10)))
    assert sorted(r.duplicate for r in results) == [False] + [True] * 9
    assert {r.sequence for r in results} == {1}
    assert (await service.session_gate("s1")).pending_messages == 1
    _, backend = await service.agents.backend_for("a1")
    assert await backend.count("a1", Namespace.session("s1")) == 1


async def test_one_id_with_two_contents_concurrently_keeps_the_first_and_refuses_the_other(service):
    outcomes = await asyncio.gather(*(
        service.record_message("s1", msg("a1", "alice", "original" if i % 2 else "tampered", mid="m1"))
        for i in range(10)), return_exceptions=True)
    kept = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(kept) == 5 and len(refused) == 5 and all(isinstance(o, Conflict) for o in refused)
    _, backend = await service.agents.backend_for("a1")
    [stored] = await backend.recent("a1", Namespace.session("s1"), [MemoryKind.MESSAGE], 10)
    winner = "tampered" if isinstance(outcomes[1], Exception) else "original"
    assert stored.content == winner
    assert (await service.session_gate("s1")).pending_messages == 1


# --- a message the store refuses, and its id -----------------------------------------------------


def unstorable(agent: str, user: str, content: str, *, mid: str) -> MessageIn:
    """A message whose content the graph store refuses (U+0000 fails FalkorDB's query),
    built past MessageIn's own check (which refuses it before any store sees it), so that
    it reaches the group commit as a row the store refuses, as any other such row would."""
    valid = msg(agent, user, content.replace("\x00", " "), mid=mid)
    return MessageIn.model_construct(**{**dict(valid), "content": content})


async def test_one_bad_message_fails_alone_among_other_sessions_and_its_id_is_released(service, caplog):
    """Issue 21: one message with U+0000 (which the edge refuses; built past it here) beside 29 good ones of other sessions of the agent. It alone is refused,
    as its input (422), without the store's words; the 29 are stored and pending; the same
    message_id with corrected content is then recorded as a new message."""
    bad = unstorable("a1", "alice", "bad \x00 text", mid="m-bad")
    outcomes = await asyncio.gather(*(
        service.record_message(f"s{i}", bad if i == 7 else msg("a1", f"user{i}", f"good message {i}", mid=f"m{i}"))
        for i in range(30)), return_exceptions=True)
    refused = outcomes.pop(7)
    assert isinstance(refused, InvalidInput) and refused.status_code == 422
    assert "content" in str(refused) and "free again" in str(refused)
    assert "parse" not in str(refused).lower() and "rows" not in str(refused)  # the store's words stay in the log
    assert any("Failed to parse query parameter" in r.getMessage() for r in caplog.records)
    assert all(not isinstance(o, Exception) and not o.duplicate for o in outcomes), outcomes
    assert [(await service.session_gate(f"s{i}")).pending_messages for i in range(30)] == [int(i != 7) for i in range(30)]
    assert await service.state.in_flight("s7") == []

    fixed = await service.record_message("s7", msg("a1", "alice", "bad text, corrected", mid="m-bad"))
    assert not fixed.duplicate and fixed.sequence == 2  # 1 was handed out and released: a gap formation skips
    assert (await service.session_gate("s7")).pending_messages == 1
    _, backend = await service.agents.backend_for("a1")
    [stored] = await backend.recent("a1", Namespace.session("s7"), [MemoryKind.MESSAGE], 10)
    assert stored.content == "bad text, corrected"
    assert sum([await backend.count("a1", Namespace.session(f"s{i}")) for i in range(30)]) == 30
    assert await service.state.in_flight_count() == 0  # nothing left in flight


async def test_a_refused_id_is_released_only_when_no_concurrent_call_holds_it(service):
    """Two calls hold one reservation (a client retrying while its first try is in flight):
    the first refusal only counts itself out, the second releases the id; a committed
    message is never released, nor a reservation of another sequence."""
    state = service.state
    first = await state.reserve_message("s1", "a1", "m1", "d1")
    again = await state.reserve_message("s1", "a1", "m1", "d1")
    assert first.is_new and not again.is_new and again.sequence == first.sequence
    [entry] = await state.in_flight("s1")
    assert entry.holders == 2
    assert not await state.release_message("s1", "m1", first.sequence + 1, "refused")  # not its sequence
    assert not await state.release_message("s1", "m1", first.sequence, "refused")
    assert (await state.reserve_message("s1", "a1", "m1", "other")).digest == "d1"  # still reserved: a 409
    assert await state.release_message("s1", "m1", first.sequence, "refused")
    assert await state.in_flight("s1") == []
    assert (await state.reserve_message("s1", "a1", "m1", "other")).digest == "other"  # free again

    await state.reserve_message("s1", "a1", "m2", "d2")
    await state.commit_message("s1", "m2", 3, 1.0, "alice", False, "a1")
    assert [e.message_id for e in await state.in_flight("s1")] == ["m1"]  # the commit took m2 out
    assert not await state.release_message("s1", "m2", 3, "refused")
    assert (await state.reserve_message("s1", "a1", "m2", "changed")).digest == "d2"


async def test_a_refused_message_sent_twice_at_once_is_refused_twice_and_released(service):
    outcomes = await asyncio.gather(*(service.record_message("s1", unstorable("a1", "alice", "nul \x00 here", mid="m1"))
                                      for _ in range(2)), return_exceptions=True)
    assert all(isinstance(o, InvalidInput) for o in outcomes), outcomes
    assert await service.state.in_flight("s1") == []
    result = await service.record_message("s1", msg("a1", "alice", "no nul here", mid="m1"))
    assert not result.duplicate and (await service.session_gate("s1")).pending_messages == 1


async def test_the_recovery_waits_for_its_grace_period_then_releases_what_was_never_stored(service):
    """A reservation younger than RECORD_RECOVERY_AFTER_SECONDS may belong to a record still
    at work: left alone. Older and not stored (the process died before its write): released."""
    reservation = await service.state.reserve_message("s1", "a1", "m1", "d1")
    assert await service.recover_in_flight() == {"sessions": 0, "committed": 0, "released": 0}
    assert [e.message_id for e in await service.state.in_flight("s1")] == ["m1"]
    grace = service.settings.record_recovery_after_seconds
    service.settings.record_recovery_after_seconds = 0
    assert await service.recover_in_flight() == {"sessions": 1, "committed": 0, "released": 1}
    assert await service.state.in_flight("s1") == [] and await service.state.in_flight_count() == 0
    # The grace back before recording again: the worker's own recovery (at its start, then
    # every minute) would otherwise take the new record's reservation for an abandoned one,
    # commit it, and the record would answer "duplicate" (met on a cluster, where the
    # worker starts slower).
    service.settings.record_recovery_after_seconds = grace
    result = await service.record_message("s1", msg("a1", "alice", "other content, same id", mid="m1"))
    assert not result.duplicate and result.sequence == reservation.sequence + 1
