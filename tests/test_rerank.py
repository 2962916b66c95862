"""The re-ranker (memory_service/recall/rerank.py): the real model from its wheel, search with
and without it on the real service, and a model that cannot load or fails mid-search."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from memory_service.domain.models import MemoryKind
from memory_service.recall.rerank import LocalReranker, RerankerUnavailable, char_features, start_reranker
from memory_service.recall.search import Retriever, SearchRequest
from memory_service.runtime import open_service

from .conftest import suite_settings
from .helpers import record_all, wait_embedded

PETS = [
    ("melanie", "user", "We got another cat last month, she is named Bailey."),
    ("melanie", "user", "Melanie here: I painted a sunset by the lake with my kids."),
    ("caroline", "user", "Caroline went to the support group meeting on Tuesday."),
    ("melanie", "user", "Our dog Luna loves running on the beach."),
]


@pytest.fixture(scope="module")
async def model():
    reranker = LocalReranker(threads=1)
    await reranker.start()
    yield reranker
    await reranker.aclose()


async def test_a_paraphrase_ranks_above_distractors(model):
    query = "What are Melanie's pets' names?"
    texts = ["Melanie: we got another cat named Bailey",  # the answer, in other words
             "Melanie: I love painting sunsets",  # the same speaker, another topic
             "Caroline: Cool! What did it look like?",  # question-shaped, no answer
             "Caroline: I went to a LGBTQ support group yesterday"]
    scores = await model.score(query, texts)
    assert len(scores) == len(texts)
    assert scores[0] > max(scores[1:]) + 0.2
    assert await model.score(query, []) == []
    again = await model.score(query, list(reversed(texts)))  # pointwise: a text's score ignores its neighbours
    assert np.allclose(again[::-1], scores, atol=1e-4)
    with pytest.raises(TypeError):
        await model.score(query, "one string")  # type: ignore[arg-type]


def _nonzero(vector) -> dict[int, float]:
    return {int(i): round(float(vector[i]), 6) for i in np.flatnonzero(vector)}


def test_character_features_are_nanorankers():
    """The network was trained on scikit-learn's HashingVectorizer (char 1-6-grams, 64 signed
    buckets, L2-normalised); the expected values were printed by nanoranker 1.2's own
    ``textual_embed`` (a pure-Python loop), which ``char_features`` computes in numpy."""
    a, b = 0.169031, 0.338062
    assert _nonzero(char_features("Hi  there")) == {
        3: a, 9: -a, 10: a, 11: a, 14: -a, 17: -a, 18: a, 20: a, 24: a, 25: a, 27: -a, 35: -b, 36: -a, 37: -a,
        38: -b, 39: b, 45: -b, 47: a, 49: a, 50: -a, 51: -a, 52: -a, 55: -a}
    u, v, w, x = 0.117041, 0.234082, 0.351123, 0.468165  # multi-byte characters take the other path
    assert _nonzero(char_features("Héllo wörld 😀")) == {
        1: -u, 2: -u, 3: -u, 4: u, 7: u, 9: u, 11: -u, 15: -u, 18: u, 22: -u, 23: v, 24: u, 25: -u, 27: -u, 28: -u,
        31: v, 35: u, 37: -u, 38: v, 39: u, 40: -u, 41: -u, 42: u, 43: -u, 44: x, 45: -u, 47: -u, 48: u, 49: u,
        52: v, 54: u, 55: u, 58: -u, 60: -v, 61: -w}
    assert char_features("HI THERE").tolist() == char_features("hi there").tolist()  # lowercased
    assert not char_features("").any()


async def test_search_with_the_reranker_explains_it_and_none_changes_nothing(falkordb_url, model):
    from .conftest import flush

    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, reranker="none", rerank_candidates=4)
    async with open_service(settings, run_worker=True) as service:
        await record_all(service, "pets", "a1", PETS)
        await wait_embedded(service, "a1")
        query = "Which animals does Melanie have at home?"
        plain = await service.search("a1", query, top_k=4, kinds=[MemoryKind.MESSAGE])
        assert all(h.explanation.rerank is None for h in plain.results)

        # A reranker present but RERANKER=none, or a weight of 0: the same answer.
        retriever = Retriever(settings, service.state, service.embedder, model)
        _, backend = await service.agents.backend_for("a1")
        request = SearchRequest(query=query, top_k=4, kinds=[MemoryKind.MESSAGE])
        unchanged = await retriever.search("a1", backend, request)
        assert [(h.id, h.score) for h in unchanged.results] == [(h.id, h.score) for h in plain.results]

        on = Retriever(settings.model_copy(update={"reranker": "local"}), service.state, service.embedder, model)
        reranked = await on.search("a1", backend, request)
        assert sorted(h.id for h in reranked.results) == sorted(h.id for h in plain.results)
        scores = [h.score for h in reranked.results]
        assert scores == sorted(scores, reverse=True) == [h.score for h in plain.results]  # values kept, reassigned
        explained = [h.explanation.rerank for h in reranked.results]
        assert all(e is not None and e.model == "local:nanoranker-1.2" for e in explained)
        assert sorted(e.rank for e in explained if e) == [1, 2, 3, 4]
        assert sorted(e.fused_rank for e in explained if e) == [1, 2, 3, 4]
        combined = [e.combined for e in explained if e]
        assert combined == sorted(combined, reverse=True) and max(combined) <= 1.0
        by_model = max(reranked.results, key=lambda h: h.explanation.rerank.score if h.explanation.rerank else 0)
        assert by_model.content.startswith("melanie: We got another cat") or "dog Luna" in by_model.content

        weightless = Retriever(settings.model_copy(update={"reranker": "local", "rerank_weight": 0}),
                               service.state, service.embedder, model)
        assert [h.id for h in (await weightless.search("a1", backend, request)).results] == [h.id for h in plain.results]


async def test_a_model_that_cannot_load_leaves_search_working(falkordb_url, tmp_path, caplog):
    from .conftest import flush

    (tmp_path / "universal-sentence-encoder-multilingual.onnx").write_bytes(b"not a model")
    (tmp_path / "reranker_nn_v2.onnx").write_bytes(b"not a model either")
    with pytest.raises(RerankerUnavailable, match="cannot load .*set RERANKER=none"):
        await LocalReranker(model_dir=tmp_path).start()
    with pytest.raises(RerankerUnavailable, match="does not exist"):
        await LocalReranker(model_dir=tmp_path / "missing").start()

    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, reranker="local", reranker_model_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="memory_service.recall.rerank"):
        assert await start_reranker(settings) is None
    assert any("search runs without a re-ranker" in r.getMessage() for r in caplog.records)
    async with open_service(settings, run_worker=True) as service:
        assert service.reranker is None and service.retriever.reranker is None
        await record_all(service, "pets", "a1", PETS)
        result = await service.search("a1", "where does the dog Luna run?")
        assert result.results and "Luna" in result.results[0].content
        assert result.degraded == [] or all(not d.startswith("rerank") for d in result.degraded)


async def test_a_reranker_failing_mid_search_leaves_the_fused_order(falkordb_url):
    from .conftest import flush

    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, reranker="local", rerank_candidates=4)
    closed = LocalReranker(threads=1)
    await closed.start()
    await closed.aclose()  # its pool is gone: every score() raises RerankerUnavailable
    async with open_service(settings.model_copy(update={"reranker": "none"}), run_worker=True) as service:
        await record_all(service, "pets", "a1", PETS)
        await wait_embedded(service, "a1")
        _, backend = await service.agents.backend_for("a1")
        request = SearchRequest(query="Which animals does Melanie have?", top_k=4)
        plain = await service.retriever.search("a1", backend, request)
        failing = await Retriever(settings, service.state, service.embedder, closed).search("a1", backend, request)
        assert [h.id for h in failing.results] == [h.id for h in plain.results]
        assert any(d.startswith("rerank: RerankerUnavailable") for d in failing.degraded)
        assert all(h.explanation.rerank is None for h in failing.results)
