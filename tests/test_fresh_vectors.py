"""A live session's user message embedded as it is recorded (memory_service/embedding/fresh.py):
the block that follows uses that vector instead of running the model, the vector is stored
as the worker would store it (its job then has nothing to do for the message), and nothing
changes for sessions no block asked for, for other roles, with the setting off, or when the
model fails. Real service on the suite's FalkorDB, no worker (so nothing else embeds), the
hash embedder counted."""

from __future__ import annotations

import asyncio

import pytest

from memory_service.domain.models import MessageIn
from memory_service.embedding import fresh as fresh_module
from memory_service.embedding.embedders import HashEmbedder
from memory_service.embedding.fresh import FreshVectors
from memory_service.formation.steps import message_memory_id
from memory_service.runtime import open_service

AGENT = "fresh-agent"


class CountedEmbedder:
    """The suite's hash embedder, counting its runs by kind (a query's, or a stored text's);
    ``fail`` makes it raise (a model that cannot run); ``gate`` holds each run until set."""

    def __init__(self, dimension: int) -> None:
        self.inner = HashEmbedder(dimension)
        self.dimension, self.name = dimension, self.inner.name
        self.queries, self.texts, self.fail = 0, 0, False
        self.gate: asyncio.Event | None = None

    async def embed(self, texts, *, query: bool = False):
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("the model is down")
        if query:
            self.queries += len(texts)
        else:
            self.texts += len(texts)
        return await self.inner.embed(texts, query=query)


@pytest.fixture
async def loop_service(settings):
    """A service without a worker, its embedder counted (the block's and the record's)."""
    async with open_service(settings, run_worker=False) as service:
        counted = CountedEmbedder(settings.embedding_dimension)
        service.retriever.embedder = service.fresh.embedder = counted
        service.counted = counted
        yield service


async def say(service, session: str, content: str, role: str = "user", user: str = "ann") -> str:
    result = await service.record_message(session, MessageIn(agent_id=AGENT, user_id=user, role=role, content=content))
    return message_memory_id(session, result.message_id)


async def settled(service) -> None:
    await asyncio.gather(*service.fresh._running)


async def stored_model(service, memory_id: str) -> str | None:
    _, backend = await service.agents.backend_for(AGENT)
    rows = await backend._read(AGENT, "MATCH (n {uuid: $id}) RETURN n.embedding_model AS model", id=memory_id)
    return rows[0]["model"] if rows else None


async def block(service, session: str, user: str = "ann") -> str:
    return (await service.assemble_memory_context(AGENT, user, session, budget=4000)).xml


async def test_a_live_sessions_user_message_is_embedded_as_recorded_and_its_block_reuses_it(loop_service):
    service, counted = loop_service, loop_service.counted
    await say(service, "s1", "We are planning the kayak trip on the fjord next June.")
    await block(service, "s1")  # the session is live from here
    assert counted.queries == 1  # the first block embedded its question itself (nothing was live)

    said = await say(service, "s1", "Which fjord did we pick for the kayak trip?")
    assert len(service.fresh._running) == 1  # started by the record, before any block
    await settled(service)
    assert counted.texts == 1 and await stored_model(service, said) == counted.name
    _, backend = await service.agents.backend_for(AGENT)
    assert said not in {m.id for m in await backend.unembedded(AGENT, 100)}  # the worker's job skips it

    xml = await block(service, "s1")
    assert counted.queries == 1  # the block searched with the stored vector: the model did not run again
    assert "kayak trip on the fjord" in xml  # the relevant memory was found


async def test_the_block_awaits_a_run_still_in_progress(loop_service):
    service, counted = loop_service, loop_service.counted
    await say(service, "s1", "The heron nests by the old mill.")
    await block(service, "s1")
    counted.gate = asyncio.Event()
    said = await say(service, "s1", "Where does the heron nest?")
    asked = asyncio.create_task(block(service, "s1"))
    await asyncio.sleep(0.2)
    assert not asked.done()  # waiting for the run the record started, not running its own
    counted.gate.set()
    xml = await asked
    assert counted.queries == 1 and counted.texts == 1
    assert "old mill" in xml and await stored_model(service, said) == counted.name


@pytest.mark.parametrize("case", ["no block asked", "assistant", "setting off"])
async def test_nothing_is_embedded_on_record_outside_a_live_sessions_user_messages(settings, case):
    async with open_service(settings.model_copy(update={"context_embed_on_record": case != "setting off"}),
                            run_worker=False) as service:
        counted = CountedEmbedder(settings.embedding_dimension)
        service.retriever.embedder = counted
        if case != "setting off":
            service.fresh.embedder = counted
        await say(service, "s1", "The heron nests by the old mill.")
        if case != "no block asked":
            await block(service, "s1")
        said = await say(service, "s1", "Noted, by the old mill.", role="assistant" if case == "assistant" else "user")
        assert service.fresh._running == set()
        assert counted.texts == 0 and await stored_model(service, said) is None  # left to the worker, as before


async def test_a_failing_model_leaves_the_message_to_the_worker_and_the_block_answers(loop_service, caplog):
    service, counted = loop_service, loop_service.counted
    await say(service, "s1", "The heron nests by the old mill.")
    await block(service, "s1")
    counted.fail = True
    said = await say(service, "s1", "Where does the heron nest?")
    await settled(service)
    assert await stored_model(service, said) is None
    _, backend = await service.agents.backend_for(AGENT)
    assert said in {m.id for m in await backend.unembedded(AGENT, 100)}  # still the worker's to embed
    rendered = await service.assemble_memory_context(AGENT, "ann", "s1", budget=4000)
    assert "old mill" in rendered.xml  # full text alone found it; the block did not fail
    assert "could not embed" in caplog.text


async def test_runs_are_bounded_and_close_stops_them(loop_service, monkeypatch):
    service, counted = loop_service, loop_service.counted
    sessions = [f"s{i}" for i in range(fresh_module.MAX_IN_FLIGHT + 2)]
    for s in sessions:
        await say(service, s, "The heron nests by the old mill.")
        await block(service, s)
    counted.gate = asyncio.Event()  # every run waits
    for s in sessions:
        await say(service, s, "Where does the heron nest?")
    assert len(service.fresh._running) == fresh_module.MAX_IN_FLIGHT  # the others wait for the worker
    waiting = [service.fresh.vector(memory_id) for memory_id in list(service.fresh._kept)]
    await service.fresh.close()
    assert service.fresh._running == set() and counted.texts == 0
    assert [await w for w in waiting] == [None] * fresh_module.MAX_IN_FLIGHT  # nobody is left waiting


async def test_kept_vectors_are_bounded_and_a_dropped_one_is_answered_none():
    fresh = FreshVectors(HashEmbedder(8))
    futures = []
    for i in range(fresh_module.MAX_KEPT + 1):
        future = asyncio.get_running_loop().create_future()
        fresh._keep(f"m{i}", future)
        futures.append(future)
    assert fresh.vector("m0") is None and len(fresh._kept) == fresh_module.MAX_KEPT
    assert futures[0].result() is None  # a block awaiting it embeds the message itself
    assert fresh.vector(f"m{fresh_module.MAX_KEPT}") is not None
    assert FreshVectors(None).vector("m1") is None


async def test_kept_vectors_expire_in_an_idle_process(monkeypatch):
    monkeypatch.setattr(fresh_module, "KEEP_SECONDS", 0.2)
    fresh = FreshVectors(HashEmbedder(8))
    waiting = asyncio.get_running_loop().create_future()
    fresh._keep("m0", waiting)
    await asyncio.sleep(0.1)
    done = asyncio.get_running_loop().create_future()
    done.set_result([0.5] * 8)
    fresh._keep("m1", done)
    assert list(fresh._kept) == ["m0", "m1"]
    await asyncio.sleep(0.15)  # m0 is past its time, m1 not yet; nothing is recorded meanwhile
    assert list(fresh._kept) == ["m1"] and waiting.result() is None
    await asyncio.sleep(0.15)
    assert not fresh._kept and fresh._sweep is None  # nothing kept, no timer left
    await fresh.close()


async def test_a_run_stopped_before_it_began_answers_none(loop_service):
    service = loop_service
    await say(service, "s1", "The heron nests by the old mill.")
    await block(service, "s1")
    _, backend = await service.agents.backend_for(AGENT)
    memory = (await backend.find(AGENT, [await say(service, "s1", "first")]))[0]
    memory.id = "not-yet-run"
    assert service.fresh.recorded(AGENT, backend, memory)  # its task has not run a step yet
    waiting = service.fresh.vector("not-yet-run")
    await service.fresh.close()
    assert await asyncio.wait_for(waiting, 5) is None  # not left waiting for ever
