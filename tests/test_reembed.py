"""A new embedding model of the same dimension is never mixed with the old one: every vector
records its model, search compares like with like, and the re-embed converts an agent
online, resumably, and switches it when every memory has a vector of the new model.

Two "models": the hash embedder (``hash:64``) and its variant ``EMBEDDING_MODEL=v2``
(``hash:v2:64``), of the same dimension and with different vectors. Real service, real
FalkorDB, the real CLI."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from redis.asyncio import Redis

from memory_service.backends.graph import GraphBackend
from memory_service.curation.tools import MemoryUpdate, MemoryWrite
from memory_service.domain.errors import InvalidInput, NotFound
from memory_service.domain.models import StoreQuery
from memory_service.embedding.embedders import HashEmbedder
from memory_service.embedding.reembed import MAX_SWEEPS
from memory_service.runtime import open_service
from memory_service.state import keyspace

from .conftest import clean_env, flush, free_port, suite_settings
from .helpers import msg, record_all, wait_embedded
from .test_cli import CLI
from .test_mongo import graph, mongo_settings  # noqa: F401 (fixtures)

OLD, NEW = "hash:64", "hash:v2:64"
TOPICS = ["garden shed key", "violin lesson tuesday", "passport renewal office", "sourdough starter feeding",
          "bicycle tyre pressure", "dentist appointment friday", "tomato seedlings greenhouse", "chess club rating",
          "kayak rental lake", "piano tuner visit", "marathon training plan", "library book overdue"]


async def fill(service, agent: str = "a1", session: str = "s1") -> None:
    await record_all(service, session, agent, [("alice", "user", f"Note {i}: the {topic} matters to me.")
                                               for i, topic in enumerate(TOPICS)])
    await service.form_memories(session)
    await wait_embedded(service, agent)


async def tags(settings, agent: str = "a1") -> dict[str, tuple[str | None, str | None]]:
    """memory id -> (the searched vector's model, the staged vector's model)."""
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=64)
    try:
        rows = await backend._read(agent, "MATCH (n:Episodic) WHERE n.kind IS NOT NULL RETURN n.uuid AS id, "
                                          "n.embedding_model AS model, n.embedding_next_model AS next")
    finally:
        await backend.close()
    return {r["id"]: (r["model"], r["next"]) for r in rows}


def vector_hits(result) -> list[str]:
    return [r.id for r in result.results if "vector" in r.explanation.signals]


@pytest.fixture
async def settings(falkordb_url):
    """The suite's settings on a flushed store, the memory tools' writes allowed (they embed
    as they write: a memory of a chosen model in one call)."""
    await flush(falkordb_url)
    return suite_settings(falkordb_url, memory_write_agents=["*"])


@pytest.fixture
async def new_model(settings):
    """A second service on the same store, running the new model, without a worker: where
    the operator runs `memory-service reembed` while the service runs the old one."""
    async with open_service(settings.model_copy(update={"embedding_model": "v2"}), run_worker=False) as opened:
        yield opened


async def test_every_vector_records_its_model(service, settings):
    await fill(service)
    stored = await tags(settings)
    assert len(stored) > len(TOPICS)  # the messages and what formation made of them
    assert set(stored.values()) == {(OLD, None)}


async def test_a_query_is_never_compared_with_vectors_of_another_model(service, new_model, settings):
    await fill(service)
    assert vector_hits(await service.search("a1", "violin lesson tuesday"))  # the old model finds by vector

    found = await new_model.search("a1", "violin lesson tuesday")
    assert vector_hits(found) == []  # no vector of the new model yet: nothing is compared ...
    assert found.results and "violin" in found.results[0].content  # ... and full text still finds it

    # The store would have compared them: the same query vector without its model reaches
    # the old model's vectors. With its model, only vectors of that model.
    _, backend = await new_model.agents.backend_for("a1")
    vector = (await new_model.embedder.embed(["violin lesson tuesday"], query=True))[0]
    assert (await backend.search("a1", StoreQuery(terms=[], vector=vector)))["vector"]
    assert (await backend.search("a1", StoreQuery(terms=[], vector=vector, vector_model=NEW)))["vector"] == []

    # A memory the new model embeds (the memory tools embed as they write) is found by its
    # vector, and it alone.
    await new_model.memory_write("a1", MemoryWrite(content="The kayak rental by the lake closes early.",
                                                   namespace="agent:a1", kind="fact"))
    assert {m for m, _ in (await tags(settings)).values()} == {OLD, NEW}
    hits = vector_hits(await new_model.search("a1", "kayak rental lake"))
    assert len(hits) == 1
    assert (await tags(settings))[hits[0]] == (NEW, None)
    # ... and the old model never compares with it either.
    old_vector = (await service.embedder.embed(["kayak rental lake"], query=True))[0]
    old_hits = (await backend.search("a1", StoreQuery(terms=[], vector=old_vector, vector_model=OLD)))["vector"]
    assert hits[0] not in {m.id for m, _ in old_hits}


async def test_reembed_converts_online_resumes_and_switches(service, new_model, settings):
    await fill(service)
    await fill(service, agent="a2", session="s9")
    total = len(await tags(settings)) + len(await tags(settings, "a2"))

    # Interrupted after a few pages: staged beside the searched vectors, nothing switched.
    first = await new_model.reembed(batch=4, budget=6)
    assert [a.agent_id for a in first.agents] == ["a1"] and first.agents[0].stopped
    staged_first = first.agents[0].staged
    assert 6 <= staged_first < len(await tags(settings))
    stored = await tags(settings)
    assert {m for m, _ in stored.values()} == {OLD}  # the searched vectors are still the old model's
    assert sum(1 for _, nxt in stored.values() if nxt == NEW) == staged_first
    record = await new_model.state.reembed_state("a1")
    assert record["target"] == NEW and record["cursor"] and "model" not in record
    # The running service still finds by vector; the new model still compares with nothing.
    assert vector_hits(await service.search("a1", "passport renewal office"))
    assert vector_hits(await new_model.search("a1", "passport renewal office")) == []

    # The old service keeps writing meanwhile (with the old model).
    await service.record_message("s1", msg("a1", "alice", "The chess club moved to Thursdays.", mid="late"))
    await wait_embedded(service, "a1")

    # Run again: it continues (no vector embedded twice), converts what was written meanwhile,
    # promotes, and switches each agent, then the store.
    second = await new_model.reembed(batch=4)
    assert second.complete and second.deployment_switched and not any(a.stopped for a in second.agents)
    assert staged_first + sum(a.staged for a in second.agents) == total + 1
    assert sum(a.promoted for a in second.agents) == total + 1
    for agent in ("a1", "a2"):
        assert set((await tags(settings, agent)).values()) == {(NEW, None)}
        record = await new_model.state.reembed_state(agent)
        assert record["model"] == NEW and "target" not in record and "cursor" not in record
    redis = Redis.from_url(settings.falkordb_url, decode_responses=True)
    try:
        assert await redis.hget(keyspace.EMBEDDER, "name") == NEW
        assert await redis.hget(keyspace.EMBEDDER, "untagged") == OLD
    finally:
        await redis.aclose()

    # The new model finds by vector now, the late memory too; the old one compares with nothing.
    found = await new_model.search("a1", "passport renewal office")
    assert vector_hits(found) and "passport" in found.results[0].content
    assert "Thursdays" in (await new_model.search("a1", "chess club Thursdays")).results[0].content
    assert vector_hits(await service.search("a1", "passport renewal office")) == []

    # A third run has nothing to do.
    third = await new_model.reembed(batch=4)
    assert third.complete and sum(a.staged + a.promoted for a in third.agents) == 0


async def test_a_memory_written_behind_the_cursor_is_found_by_the_sweep(service, new_model, settings):
    await fill(service)
    # As if the scan had passed every node already: the sweeps from the start find them all.
    await new_model.state.set_reembed_state("a1", target=NEW, cursor="1000000", sweeps=0, staged=0, **{"pass": "scan"})
    report = await new_model.reembed("a1", batch=5)
    assert report.agents[0].switched and report.agents[0].staged == len(await tags(settings))
    assert set((await tags(settings)).values()) == {(NEW, None)}
    assert MAX_SWEEPS >= 1


async def test_an_edited_memory_drops_its_staged_vector(service, new_model, settings):
    written = await service.memory_write("a1", MemoryWrite(content="The spare key is under the blue pot.",
                                                           namespace="agent:a1", kind="fact"))
    await new_model.reembed(batch=50, budget=1)
    assert (await tags(settings))[written.id] == (OLD, NEW)
    await service.memory_update("a1", written.id, MemoryUpdate(content="The spare key is with the neighbour now."))
    assert (await tags(settings))[written.id][1] is None  # the staged vector was of the old text
    await new_model.reembed()
    assert (await tags(settings))[written.id] == (NEW, None)
    assert "neighbour" in (await new_model.search("a1", "spare key neighbour")).results[0].content


async def test_bad_inputs_change_nothing(service, new_model, settings):
    await fill(service)
    before = await tags(settings)
    with pytest.raises(NotFound, match="unknown agent nobody"):
        await new_model.reembed("nobody")
    with pytest.raises(InvalidInput):
        await new_model.reembed("no:colons")
    assert await new_model.state.reembed_state("nobody") == {}
    assert await tags(settings) == before


async def test_a_failing_embedder_stops_the_run_and_the_next_run_continues(service, settings, embeddings):
    await fill(service)
    remote = suite_settings(settings.falkordb_url, embedder="openai", embedding_base_url=embeddings.base_url,
                            embedding_model="fake-embedding", embedding_dimension=64)
    async with open_service(remote, run_worker=False) as other:
        embeddings.down = True
        report = await other.reembed(batch=4)
        assert report.agents[0].stopped.startswith("the embedder failed") and not report.complete
        assert set((await tags(settings)).values()) == {(OLD, None)}  # nothing staged, nothing switched
        assert vector_hits(await service.search("a1", "garden shed key"))
        embeddings.down = False
        report = await other.reembed(batch=4)
        assert report.complete
        assert set((await tags(settings)).values()) == {("openai:fake-embedding", None)}


def test_the_hash_variant_is_another_model_of_the_same_dimension():
    old, new = HashEmbedder(64), HashEmbedder(64, variant="v2")
    assert (old.name, new.name, old.dimension) == (OLD, NEW, new.dimension)
    assert old.vector("garden shed key") != new.vector("garden shed key")
    assert HashEmbedder(64, variant="v2").vector("x y") == new.vector("x y")  # deterministic


async def run_cli(settings, *args: str, **env: str) -> tuple[int, str]:
    environment = {**clean_env(), "FALKORDB_URL": settings.falkordb_url, "EMBEDDER": "hash",
                   "EMBEDDING_DIMENSION": "64", "EMBEDDING_MODEL": "v2", "COLUMNS": "200", **env}
    proc = await asyncio.create_subprocess_exec(CLI, "reembed", *args, env=environment, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_the_command(service, settings):
    await fill(service)
    before = await tags(settings)
    code, out = await run_cli(settings, "--agent", "nobody")
    assert code == 2 and "unknown agent nobody" in out, out
    code, out = await run_cli(settings, EMBEDDER="openai", EMBEDDING_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
                              EMBEDDING_MODEL="m")
    assert code == 1 and "re-embed failed" in out, out
    code, out = await run_cli(settings, EMBEDDING_DIMENSION="32")
    assert code == 1 and "32-dimensional" in out, out
    assert await tags(settings) == before  # none of these changed anything

    code, out = await run_cli(settings, "--limit", "3", "--batch", "2")
    assert code == 1 and "Run the same command again to continue" in out, out
    code, out = await run_cli(settings, "--batch", "2")
    assert code == 0 and f"every agent now searches with {NEW}" in out, out
    assert set((await tags(settings)).values()) == {(NEW, None)}


async def test_a_mirrored_mongodb_copy_takes_the_new_models_vectors(mongo_settings):
    """With MIRROR_TO_MONGO, the MongoDB copy (read while the graph fails) gets the new
    model's vectors through the outbox, tagged with their model: like with like there too."""
    from .test_mongo import settle

    async with open_service(mongo_settings, run_worker=True) as old:
        await fill(old)
        await settle(old)
        async with open_service(mongo_settings.model_copy(update={"embedding_model": "v2"}), run_worker=False) as new:
            report = await new.reembed(batch=8)
            assert report.complete and report.deployment_switched
            await settle(new)
            _, mirrored = await new.agents.backend_for("a1")
            mongo = mirrored.mirror.memories
            assert await mongo.distinct("embedding_model", {"agent_id": "a1"}) == [NEW]
            assert await mongo.count_documents({"agent_id": "a1", "embedding": {"$exists": False}}) == 0
            assert vector_hits(await new.search("a1", "violin lesson tuesday"))
