"""Agent-wide full text from the postings (memory_service/backends/postings.py), on the real
embedded store: the top k equals a brute-force BM25 over the same texts, every way a memory
leaves search takes its postings out, scoped searches keep their filters, bad input changes
nothing, and a graph written before the postings gets them built."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory_service.backends.base import Found
from memory_service.backends.graph import GraphBackend
from memory_service.backends.postings import LAYOUT, RECORD, Postings, best, entry, find_stems, rank_entries
from memory_service.domain import bm25
from memory_service.domain.models import Memory, MemoryKind, Provenance, StoreQuery
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import HashEmbedder
from memory_service.recall.search import query_terms
from memory_service.state import keyspace

A = "a1"
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture
def store(graph_backend):
    return graph_backend


def corpus(n: int, seed: int = 7) -> list[str]:
    """Texts over a small Zipf-like vocabulary: common words in long lists, ties, repeats."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    return [" ".join(rng.choices(WORDS, weights, k=rng.randint(1, 14)) + ["the", "and"]) for _ in range(n)]


def message(i: int, text: str, session: str = "s1", kind: MemoryKind = MemoryKind.MESSAGE) -> Memory:
    ns = Namespace.session(session) if kind is MemoryKind.MESSAGE else Namespace.user(A, "alice")
    return Memory(id=f"m{i:04d}", kind=kind, namespace=str(ns), content=text, valid_at=T0 + timedelta(minutes=i),
                  metadata=Provenance(agent_id=A, user_id="alice", session_id=session))


def brute_force(texts: dict[str, str], query: str, k: int, average: float | None = None) -> list[tuple[str, float]]:
    """BM25 of every text, as the postings define it (their words, their lengths), best k
    (``average``: the length the impacts were computed with, by default the texts')."""
    counts = {i: bm25.indexed(t) for i, t in texts.items()}
    n = len(counts)
    average = average or sum(length for length, _ in counts.values()) / n
    terms = list(dict.fromkeys(bm25.stem(w) for w in query_terms(query)))
    df = {t: sum(1 for _, c in counts.values() if t in c) for t in terms}
    out = []
    for i, (length, c) in counts.items():
        score = sum(bm25.idf(n, df[t]) * bm25.impact(c[t], length, average) for t in terms if t in c)
        if score > 0:
            out.append((i, score))
    return sorted(out, key=lambda p: (-p[1], p[0]))[:k]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    assert [round(s, 6) for _, s in got] == pytest.approx([round(s, 6) for _, s in want], abs=1e-6)
    # Ids in the same order, but equal scores may come in either order at the k-th place.
    assert {i for i, s in got if s > want[-1][1] + 1e-5} == {i for i, s in want if s > want[-1][1] + 1e-5}


QUERIES = ["w0 w1", "w0 w1 w2 w3", "w5 w40", "w59", "w0", "w3 w3 w7 w11 w13 w17 w19", "w1 w50 w58"]


@pytest.mark.parametrize("k", [1, 5, 20])
async def test_top_k_equals_brute_force_bm25(store, k):
    memories = [message(i, t) for i, t in enumerate(corpus(400))]
    await store.write(memories)  # one batch: one average length
    by_id = {m.id: m.search_text for m in memories}
    for query in QUERIES:
        ranked = await store.postings.top(A, query_terms(query), k, budget=10**6)
        assert ranked is not None and ranked.complete and ranked.docs == 400
        same(ranked.hits, brute_force(by_id, query, k))
    # Every posting of the query's words is read: exact whatever their frequencies.
    df = await postings_of(store, "w0")
    assert (await store.postings.top(A, ["w0"], 5, budget=10**6)).scored == df > 300


async def postings_of(store: GraphBackend, word: str) -> int:
    """How many postings the word's list holds (removed memories' zeroed ones included)."""
    return int(await store.client.connection.strlen(keyspace.postings_term(A, word))) // RECORD.itemsize


async def test_top_k_equals_brute_force_bm25_for_random_queries(store):
    """Random queries of common and rare words, repeats, every k from 1 to past the matches."""
    memories = [message(i, t) for i, t in enumerate(corpus(600, seed=11))]
    await store.write(memories)
    by_id = {m.id: m.search_text for m in memories}
    rng = random.Random(5)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    for _ in range(60):
        query = " ".join(rng.choices(WORDS, weights if rng.random() < 0.5 else None, k=rng.randint(1, 6)))
        k = rng.choice([1, 2, 3, 10, 50, 700])
        ranked = await store.postings.top(A, query_terms(query), k, budget=10**6)
        want = brute_force(by_id, query, k)
        assert ranked is not None and ranked.complete
        same(ranked.hits, want)


async def test_a_word_held_by_thousands_of_one_batch_is_indexed(store):
    """Lua's unpack takes at most about 8,000 values: 5,000 memories of one write (10,000
    values for the number hashes) are added in pieces, not refused."""
    texts = [(f"m{i:05d}", f"common w{i % 7}") for i in range(5_000)]
    assert await store.postings.index(A, texts, fresh=True) == 5_000
    assert await postings_of(store, "common") == 5_000
    ranked = await store.postings.top(A, ["common", "w3"], 5, budget=10**6)
    assert ranked is not None and len(ranked.hits) == 5
    assert all(int(i[1:]) % 7 == 3 for i, _ in ranked.hits)  # both words beat one


async def test_agent_wide_search_ranks_by_the_postings_and_answers_ids_and_times(settings):
    """Both signals of an agent-wide search answer ``Found`` (id and time, what fusion and
    recency need): the search reads whole only the memories it returns."""
    embedder = HashEmbedder(8)
    store = GraphBackend(settings.falkordb_url, settings, embedding_dimension=8)
    await store.start()
    try:
        texts = corpus(200)
        memories = [message(i, t, session=f"s{i % 3}") for i, t in enumerate(texts)]
        for m in memories:
            [m.embedding] = await embedder.embed([m.search_text])
        await store.write(memories)
        [vector] = await embedder.embed(["w4 w9"])
        hits = await store.search(A, StoreQuery(terms=query_terms("w4 w9"), vector=vector, limit=10))
        same([(m.id, s) for m, s in hits["fulltext"]], brute_force({m.id: m.search_text for m in memories}, "w4 w9", 10))
        by_id = {m.id: m for m in memories}
        for signal in ("fulltext", "vector"):
            assert len(hits[signal]) == 10
            assert all(isinstance(f, Found) and f.valid_at == by_id[f.id].valid_at for f, _ in hits[signal])
        similarity = {m.id: sum(a * b for a, b in zip(m.embedding, vector)) for m in memories}
        assert [s for _, s in hits["vector"]] == pytest.approx(sorted(similarity.values(), reverse=True)[:10], abs=1e-4)
        assert all(s == pytest.approx(similarity[f.id], abs=1e-4) for f, s in hits["vector"])
    finally:
        await store.close()


async def test_a_retried_write_indexes_nothing_twice(store):
    texts = corpus(30)
    memories = [message(i, t) for i, t in enumerate(texts)]
    await store.write(memories)
    stats = await store.client.connection.hgetall(keyspace.postings_stats(A))
    await store.write(memories[:10])
    await store.write(memories)
    assert await store.client.connection.hgetall(keyspace.postings_stats(A)) == stats
    assert stats["docs"] == "30" and stats["built"] == LAYOUT and stats["seq"] == "30"


async def indexed(store: GraphBackend) -> set[str]:
    return {i async for i in store.postings.indexed_ids(A)}


async def found(store: GraphBackend, query: str) -> list[str]:
    ranked = await store.postings.top(A, query_terms(query), 50, budget=10**6)
    assert ranked is not None
    return [i for i, _ in ranked.hits]


async def test_every_way_out_of_search_takes_the_postings_out(store):
    await store.write([message(0, "zebra lunch plans"), message(1, "zebra parade tomorrow"),
                       message(2, "quokka zebra"), message(3, "zebra at noon"), message(4, "unique kangaroo")])
    assert sorted(await found(store, "zebra")) == ["m0000", "m0001", "m0002", "m0003"]
    # Soft delete (the memory tools), then restore.
    [m1] = await store.find(A, ["m0001"])
    m1.deleted_at = T0
    await store.replace(A, [m1])
    assert "m0001" not in await found(store, "zebra")
    m1.deleted_at = None
    await store.replace(A, [m1])
    assert "m0001" in await found(store, "zebra")
    # A changed text: the old words go, the new ones come.
    [m2] = await store.find(A, ["m0002"])
    m2.content = "wombat only"
    await store.replace(A, [m2])
    assert "m0002" not in await found(store, "zebra") and await found(store, "wombat") == ["m0002"]
    assert await found(store, "quokka") == []
    # Eviction (trim keeps the newest of a kind in a namespace).
    assert await store.trim(A, Namespace.session("s1"), MemoryKind.MESSAGE, keep=4) == 1
    assert "m0000" not in await indexed(store)
    # Purge and erasure (retention and erasure both delete through ``delete``): the erased
    # words leave no key behind.
    assert await store.delete(A, ["m0004", "m0003"]) == 2
    assert await found(store, "kangaroo") == [] and "m0003" not in await found(store, "zebra")
    keys = {k async for k in store.client.connection.scan_iter(match="ms:ft:*")}
    assert keyspace.postings_term(A, bm25.stem("kangaroo")) not in keys
    assert await indexed(store) == {"m0001", "m0002"}
    stats = await store.client.connection.hgetall(keyspace.postings_stats(A))
    assert stats["docs"] == "2"
    assert int(stats["len"]) == sum(bm25.indexed(m.search_text)[0] for m in await store.find(A, ["m0001", "m0002"]))


async def test_namespace_and_kind_filters_are_honoured(store):
    await store.write([message(0, "ferry timetable", session="s1"), message(1, "ferry tickets", session="s2"),
                       message(2, "ferry seat preference", kind=MemoryKind.DIRECTIVE)])
    agent_wide = await store.search(A, StoreQuery(terms=["ferry"], limit=10))
    assert {m.id for m, _ in agent_wide["fulltext"]} == {"m0000", "m0001", "m0002"}
    scoped = await store.search(A, StoreQuery(terms=["ferry"], namespaces=[Namespace.session("s2")], limit=10))
    assert [m.id for m, _ in scoped["fulltext"]] == ["m0001"]
    kinds = await store.search(A, StoreQuery(terms=["ferry"], kinds=[MemoryKind.DIRECTIVE], limit=10))
    assert [m.id for m, _ in kinds["fulltext"]] == ["m0002"]
    # Another agent's postings are its own.
    assert (await store.search("a2", StoreQuery(terms=["ferry"], limit=10))).get("fulltext", []) == []


async def test_bad_queries_answer_empty_and_change_nothing(store):
    await store.write([message(0, "harbour view"), message(1, "harbour lights")])
    before = {k: await store.client.connection.type(k) async for k in store.client.connection.scan_iter(match="ms:ft:*")}
    for terms in ([], ["*"], ["t:harbour"], ["{a1}"], ["harbour\x00"], ["ναυτικός"], ["x" * 5000]):
        ranked = await store.postings.top(A, terms, 10, budget=10**6)
        assert ranked is not None and ranked.hits == []
    assert (await store.postings.top(A, ["harbour"], 0, budget=10**6)).hits == []
    assert await store.postings.remove(A, []) == 0 and await store.postings.remove(A, ["unknown"]) == 0
    assert await store.postings.index(A, []) == 0
    after = {k: await store.client.connection.type(k) async for k in store.client.connection.scan_iter(match="ms:ft:*")}
    assert after == before
    # A query of stopwords only has no full-text signal.
    assert "fulltext" not in await store.search(A, StoreQuery(terms=query_terms("what is the"), limit=5))


async def test_the_budget_leaves_out_the_commonest_words(store):
    """A query whose lists hold more postings than the budget reads the rarest words' lists
    that fit and leaves the others out (flagged)."""
    memories = [message(i, t) for i, t in enumerate(corpus(1500))]
    await store.write(memories)
    rare = await postings_of(store, "w50")
    assert 0 < rare < await postings_of(store, "w1") < await postings_of(store, "w0")
    ranked = await store.postings.top(A, ["w0", "w1", "w50"], 50, budget=rare)
    assert ranked is not None and not ranked.complete and ranked.scored == rare
    assert ranked.hits == (await store.postings.top(A, ["w50"], 50, budget=10**6)).hits
    assert (await store.postings.top(A, ["w0", "w1", "w50"], 50, budget=10**6)).complete


async def test_removed_postings_are_zeroed_then_their_lists_rewritten(store):
    """A removal zeroes the memory's postings in place; a list half dead is rewritten without
    them; the answers stay those of a brute force over what is left, and a memory indexed
    again (a changed text) gets a number of its own, so every list stays in number order."""
    memories = [message(i, t) for i, t in enumerate(corpus(300, seed=3))]
    await store.write(memories)
    by_id = {m.id: m.search_text for m in memories}
    async def all_postings() -> int:
        return sum([await postings_of(store, w) for w in WORDS])

    before = await all_postings()
    gone = [m.id for m in memories[::2]]
    assert await store.delete(A, gone[:5]) == 5
    assert await all_postings() == before  # zeroed in place, not rewritten yet
    assert await store.delete(A, gone[5:]) == len(gone) - 5
    assert await all_postings() < before * 0.8  # lists half dead: rewritten without them
    average = sum(bm25.indexed(t)[0] for t in by_id.values()) / len(by_id)  # the impacts' (one batch)
    for i in gone:
        del by_id[i]
    for query in QUERIES:
        ranked = await store.postings.top(A, query_terms(query), 20, budget=10**6)
        assert ranked is not None and ranked.docs == len(by_id)
        same(ranked.hits, brute_force(by_id, query, 20, average))
    changed = memories[1]
    changed.content = "w0 w0 w59 fresh words"
    await store.replace(A, [changed])
    assert [i for i, _ in (await store.postings.top(A, ["fresh"], 5, budget=10**6)).hits] == [changed.id]
    raw = await store.client.connection.execute_command("GET", keyspace.postings_term(A, "w0"), NEVER_DECODE=True)
    nums = [int(x) for x in np.frombuffer(raw, dtype=RECORD)["num"]]
    assert nums == sorted(nums) and len(set(nums)) == len(nums)


async def test_postings_of_the_first_layout_are_rebuilt(store):
    """A store whose postings are sorted sets (the first layout, ``built`` 1) is searched
    through the index until its postings are built again in this layout."""
    await store.write([message(0, "lighthouse keeper"), message(1, "lighthouse lamp")])
    await store.client.connection.hset(keyspace.postings_stats(A), "built", "1")
    assert not await store.postings.built(A)
    assert await store.postings.top(A, ["lighthouse"], 5, budget=1000) is None
    assert await store.postings.entries(A, ["m0000"]) is None
    assert await store.build_postings(A) == 2
    assert [i for i, _ in (await store.postings.top(A, ["keeper"], 5, budget=1000)).hits] == ["m0000"]


async def test_a_graph_written_before_the_postings_gets_them_built(store, settings):
    texts = corpus(120)
    await store.write([message(i, t) for i, t in enumerate(texts)])
    want = await store.postings.top(A, ["w2", "w7"], 10, budget=10**6)
    # As an older release left it: the graph, no postings.
    assert await store.postings.clear(A) > 0
    assert await store.postings.top(A, ["w2"], 10, budget=10**6) is None  # not built: search reads the index
    hits = await store.search(A, StoreQuery(terms=["w2"], limit=5))
    assert len(hits["fulltext"]) == 5
    # A memory deleted meanwhile is not indexed by the build.
    await store.delete(A, ["m0003"])
    other = GraphBackend(settings.falkordb_url, settings)
    await other.start()  # builds, in the background, what is missing
    try:
        await other.startup_build()
    finally:
        await other.close()
    got = await store.postings.top(A, ["w2", "w7"], 10, budget=10**6)
    assert got is not None and "m0003" not in {i for i, _ in got.hits}
    assert "m0003" not in await indexed(store) and len(await indexed(store)) == 119
    assert [i for i, _ in got.hits if i != "m0003"][:5] == [i for i, _ in want.hits if i != "m0003"][:5]
    # A second build waits for nobody: the lock says another process builds.
    await store.client.connection.set(keyspace.postings_build_lock(A), "1")
    assert await store.build_postings(A) is None


async def test_postings_of_two_handles_agree(store):
    """Postings are state in the store, not in the process: a second handle reads the first's."""
    await store.write([message(0, "lighthouse keeper")])
    assert [i for i, _ in (await Postings(store.client.connection).top(A, ["lighthouse"], 5, 1000)).hits] == ["m0000"]


async def test_a_scoped_search_ranks_its_scope_by_bm25_from_one_read(store):
    texts = corpus(240, seed=11)
    memories = [message(i, t, session=f"s{i % 4}") for i, t in enumerate(texts)]
    await store.write(memories)
    scope = [Namespace.session("s0"), Namespace.session("s2")]
    inside = {m.id: m.search_text for m in memories if m.metadata.session_id in ("s0", "s2")}
    for query in ("w3 w8", "w0 w1 w2", "w44"):
        hits = await store.search(A, StoreQuery(terms=query_terms(query), namespaces=scope, limit=10))
        same([(m.id, s) for m, s in hits["fulltext"]], brute_force(inside, query, 10))
    # Memories stored before they carried their terms: the postings' entries stand in.
    await store._writable(A)
    await store.client.select_graph("ms_agent__a1").query("MATCH (n:Episodic) SET n.terms = NULL")
    hits = await store.search(A, StoreQuery(terms=query_terms("w3 w8"), namespaces=scope, limit=10))
    same([(m.id, s) for m, s in hits["fulltext"]], brute_force(inside, "w3 w8", 10))


async def test_a_scope_past_the_scan_limit_is_searched_through_the_index(settings):
    small = settings.model_copy(update={"search_scope_scan_max": 3})
    backend = GraphBackend(settings.falkordb_url, small)
    await backend.start()
    try:
        await backend.write([message(i, f"pelican {i}", session=f"s{i % 2}") for i in range(10)])
        hits = await backend.search(A, StoreQuery(terms=["pelican"], namespaces=[Namespace.session("s1")], limit=10))
        assert sorted(m.id for m, _ in hits["fulltext"]) == [f"m{i:04d}" for i in range(1, 10, 2)]
    finally:
        await backend.close()


async def test_a_stored_embedding_is_given_for_its_model_only(settings):
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=4)
    await backend.start()
    try:
        m = message(0, "osprey")
        m.embedding, m.embedding_model = [0.5, 0.25, 0.0, 1.0], "hash:4"
        await backend.write([m, message(1, "no vector yet")])
        assert await backend.stored_embedding(A, "m0000", "hash:4") == [0.5, 0.25, 0.0, 1.0]
        assert await backend.stored_embedding(A, "m0000", "other") is None
        assert await backend.stored_embedding(A, "m0001", "hash:4") is None
        assert await backend.stored_embedding(A, "unknown", "hash:4") is None
        assert await backend.stored_embedding("nobody", "m0000", "hash:4") is None
    finally:
        await backend.close()


class CountingEmbedder:
    """The hash embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        from memory_service.embedding.embedders import HashEmbedder

        self.inner = HashEmbedder(8)
        self.dimension, self.name, self.calls = 8, self.inner.name, 0

    async def embed(self, texts, *, query: bool = False):
        self.calls += len(texts)
        return await self.inner.embed(texts, query=query)


async def test_a_search_like_a_stored_message_reuses_its_embedding(settings):
    from memory_service.recall.search import Retriever, SearchRequest

    embedder = CountingEmbedder()
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=8)
    await backend.start()
    try:
        m = message(0, "the heron lands")
        [m.embedding] = await embedder.inner.embed([m.search_text])
        m.embedding_model = embedder.name
        await backend.write([m, message(1, "heron again")])
        retriever = Retriever(settings, state=None, embedder=embedder)  # type: ignore[arg-type]
        scope = [Namespace.session("s1")]
        result = await retriever.search(A, backend, SearchRequest(query="the heron lands"), namespaces=scope,
                                        resolve_scope=False, like="m0000")
        assert embedder.calls == 0 and "vector" in result.signals and not result.degraded
        # Without a stored vector of its model, the query is embedded as any other.
        await retriever.search(A, backend, SearchRequest(query="heron again"), namespaces=scope, resolve_scope=False,
                               like="m0001")
        assert embedder.calls == 1
    finally:
        await backend.close()


def _split_entries(lines: list[str], wanted: set[str]) -> dict[str, dict[int, int]]:
    """find_stems' answer by splitting every entry into its tokens (the slow, plain way)."""
    out: dict[str, dict[int, int]] = {}
    for at, line in enumerate(lines):
        _, *tokens = line.split(" ")
        for token in tokens:
            term, _, tf = token.partition("*")
            if term in wanted:
                out.setdefault(term, {})[at] = int(tf) if tf else 1
    return out


def test_find_stems_counts_exactly_the_wanted_stems_of_each_entry():
    # Stems that are prefixes of others, numeric stems (never the length), counts above 9,
    # a stem at an entry's end, empty entries and queries.
    rng = random.Random(7)
    vocab = ["a", "ab", "abc", "b", "12", "1", "x", "xy", "café", "b2"]
    for _ in range(2000):
        lines = []
        for _ in range(rng.randint(0, 6)):
            words = rng.sample(vocab, rng.randint(0, 5))
            tokens = [w if rng.random() < 0.7 else f"{w}*{rng.randint(2, 12)}" for w in words]
            lines.append(" ".join([str(rng.randint(0, 30)), *tokens]))
        wanted = set(rng.sample(vocab, rng.randint(0, 4)))
        assert find_stems(lines, wanted) == _split_entries(lines, wanted), (lines, wanted)
    texts = ["The cat sat on the cat's mat, the cat!", "Dogs and cats: 12 dogs, 1 cat.", ""]
    lines = [entry(t)[2] for t in texts]
    wanted = {bm25.stem("cat"), bm25.stem("dogs"), "12"}
    assert find_stems(lines, wanted) == _split_entries(lines, wanted)
    assert find_stems(lines, wanted)[bm25.stem("cat")] == {0: 3, 1: 2}  # "cats" and "cat"


def _textbook_bm25(texts: list[str], words: list[str]) -> dict[int, float]:
    """Okapi BM25 as written in the textbook, over ``texts`` as the whole collection (the
    reference the fast scope ranking must equal)."""
    indexed = [bm25.indexed(t) for t in texts]
    terms = list(dict.fromkeys(bm25.stem(w) for w in words))
    average = sum(length for length, _ in indexed) / max(len(indexed), 1)
    df = {t: sum(1 for _, c in indexed if t in c) for t in terms}
    out = {}
    for i, (length, counts) in enumerate(indexed):
        score = sum(bm25.idf(len(indexed), df[t]) * bm25.impact(counts[t], length, average)
                    for t in terms if df[t] and t in counts)
        if score > 0:
            out[i] = score
    return out


def test_a_scopes_bm25_from_its_entries_is_the_textbook_bm25_of_its_texts():
    rng = random.Random(11)
    vocab = ["cat", "cats", "dog", "heron", "bridge", "river", "12", "café", "a", "seat", "seats", "window"]
    for _ in range(500):
        texts = [" ".join(rng.choices(vocab, k=rng.randint(0, 9))) for _ in range(rng.randint(0, 12))]
        words = rng.sample(vocab, rng.randint(0, 4))
        expected = _textbook_bm25(texts, words)
        got = rank_entries([entry(t)[2] for t in texts], words)
        assert got.keys() == expected.keys() and all(math.isclose(got[i], expected[i], rel_tol=1e-12) for i in got)
        by_text = bm25.rank(dict(enumerate(texts)), words)  # the same, from the texts' counts
        assert by_text.keys() == expected.keys() and all(math.isclose(by_text[i], expected[i], rel_tol=1e-12) for i in by_text)


def test_best_scores_every_posting_whether_the_numbers_are_dense_or_sparse():
    """``best`` equals a plain sum over the lists, with dense numbers (an array by number) and
    sparse ones (past 4 x the postings + 65,536: the numbers made dense first); zeroed
    records (removed memories) count neither in the score nor in the idf."""
    rng = random.Random(3)
    for spread in (500, 10_000_000):
        for _ in range(30):
            lists, plain = [], {}
            docs = rng.randint(50, 400)
            for _ in range(rng.randint(1, 5)):
                nums = sorted(rng.sample(range(1, spread), rng.randint(1, 40)))
                impacts = [rng.choice([0.0, rng.uniform(0.1, 2.2)]) for _ in nums]
                records = np.array(list(zip(nums, impacts, strict=True)), dtype=RECORD)
                lists.append(records.tobytes())
                live = [(n, w) for n, w in zip(nums, impacts, strict=True) if w > 0]
                for n, w in live:
                    plain[n] = plain.get(n, 0.0) + bm25.idf(max(docs, len(live)), len(live)) * w
            lists.append(b"")  # a word no memory holds
            k = rng.choice([1, 3, 10, 1000])
            ranked, read = best(docs, lists, k)
            want = sorted(plain.items(), key=lambda p: (-p[1], p[0]))[:k]
            assert read == sum(len(b) for b in lists) // RECORD.itemsize
            if not want:
                assert ranked == []
                continue
            assert [s for _, s in ranked] == pytest.approx([s for _, s in want], abs=1e-9)
            assert {n for n, s in ranked if s > want[-1][1] + 1e-9} == {n for n, s in want if s > want[-1][1] + 1e-9}
    assert best(10, [b"", b""], 5) == ([], 0)
