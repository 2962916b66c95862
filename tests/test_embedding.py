"""The embedders: the hash embedder's determinism and ranking, the local model loaded
offline from its installed wheels, and the OpenAI-compatible client against a real HTTP
server on loopback (good path, batching, transient errors, an endpoint that is down, a
dimension that differs from EMBEDDING_DIMENSION, a timeout)."""

from __future__ import annotations

import asyncio
import math
import socket

import pytest

from memory_service.backends.loopback import free_port
from memory_service.config import Settings
from memory_service.embedding.embedders import (
    Embedder,
    EmbedderUnavailable,
    HashEmbedder,
    LocalEmbedder,
    OpenAIEmbedder,
    build_embedder,
)

from .fake_embeddings import EmbeddingsServer


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def same(a: list[list[float]], b: list[list[float]]) -> bool:
    return len(a) == len(b) and all(cosine(x, y) > 1 - 1e-9 for x, y in zip(a, b, strict=True))


def ranked(query_vector, docs: dict[str, list[float]]) -> list[str]:
    return sorted(docs, key=lambda name: -cosine(query_vector, docs[name]))


# --- hash ---------------------------------------------------------------------------------


async def test_hash_embedder_is_deterministic_and_unit_normalised():
    texts = ["The flight leaves on June 3rd at 9am.", "", "!!!", "hotel"]
    a = await HashEmbedder(64).embed(texts)
    b = await HashEmbedder(64).embed(texts)  # another instance: the same vectors (no per-process hash seed)
    assert a == b
    assert [len(v) for v in a] == [64] * 4
    assert all(abs(norm(v) - 1) < 1e-9 for v in a)  # even a text without words
    assert a[0] == (await HashEmbedder(64).embed(["the FLIGHT leaves on june 3rd at 9AM"]))[0]  # case-blind
    assert (await HashEmbedder(32).embed(["hotel"]))[0] != a[3][:32]
    e = HashEmbedder(384)
    assert e.name == "hash:384" and e.dimension == 384 and isinstance(e, Embedder)
    assert await e.embed([]) == []
    with pytest.raises(TypeError):
        await e.embed("one string")  # type: ignore[arg-type]


async def test_hash_embedder_ranks_shared_words_first():
    e = HashEmbedder(256)
    docs = dict(zip(["flight", "hotel", "cat"], await e.embed([
        "Alice booked a window seat on the morning flight to Lisbon.",
        "The hotel near the station has a rooftop pool.",
        "My cat sleeps all afternoon on the sofa.",
    ]), strict=True))
    [query] = await e.embed(["which flight did Alice book?"])
    assert ranked(query, docs)[0] == "flight"
    [query] = await e.embed(["a hotel by the station"])
    assert ranked(query, docs)[0] == "hotel"
    [plural] = await e.embed(["hotels"])  # shares trigrams with "hotel"
    assert ranked(plural, docs)[0] == "hotel"
    assert cosine(docs["cat"], docs["hotel"]) < 0.3


# --- local --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def local():
    embedder = LocalEmbedder(batch_size=4)
    yield embedder
    await embedder.aclose()


async def test_local_embedder_loads_offline_from_installed_wheels(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    attempts: list[object] = []
    real_connect = socket.socket.connect

    def guarded_connect(sock, address):  # any connection attempt off loopback is recorded and refused
        if not (isinstance(address, tuple) and str(address[0]) in ("127.0.0.1", "::1", "localhost")):
            attempts.append(address)
            raise OSError("network disabled by the test")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    embedder = LocalEmbedder()
    assert embedder.name == "local:all-MiniLM-L6-v2-int8" and embedder.dimension == 384
    await embedder.start()
    [v] = await embedder.embed(["Caroline went to the LGBTQ support group on 7 May."])
    await embedder.aclose()
    assert len(v) == 384 and abs(norm(v) - 1) < 1e-5
    assert attempts == []


async def test_local_embedder_ranks_a_paraphrase_above_an_unrelated_sentence(local):
    query, paraphrase, unrelated, lexical_decoy = await local.embed([
        "I'm scared of flying, so I always take the train.",
        "Air travel makes me anxious; I prefer going by rail.",
        "The quarterly revenue grew by four percent.",
        "I always take the dog for a walk, so I'm scared of nothing.",
    ])
    assert cosine(query, paraphrase) > cosine(query, unrelated) + 0.3
    assert cosine(query, paraphrase) > cosine(query, lexical_decoy)
    assert all(len(v) == 384 and abs(norm(v) - 1) < 1e-5 for v in (query, paraphrase, unrelated))


async def test_local_embedder_batches_keep_order_and_match_single_texts(local):
    texts = [f"Note {i}: " + "the spare key is under the blue flower pot " * (i % 4) for i in range(11)]
    batched = await local.embed(texts)  # batches of 4, sorted by length inside
    assert len(batched) == 11
    for i in (0, 5, 10):
        [alone] = await local.embed([texts[i]])
        assert cosine(alone, batched[i]) > 0.9999
    assert await local.embed([]) == []
    long = await local.embed(["word " * 5000])  # truncated at 256 tokens, not an error
    assert abs(norm(long[0]) - 1) < 1e-5


async def test_local_embedder_does_not_block_the_event_loop(local):
    ticks = 0
    stop = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.002)

    task = asyncio.create_task(ticker())
    # Concurrent callers queue on the model's own thread; each gets its own texts back.
    results = await asyncio.gather(*(local.embed([f"sentence number {n} about trains"] * 16) for n in range(4)))
    stop.set()
    await task
    assert ticks >= 5
    assert [len(r) for r in results] == [16] * 4
    assert cosine(results[0][0], results[1][0]) < 0.9999  # different texts, different vectors


async def test_local_embedder_reports_a_missing_model_clearly(tmp_path):
    embedder = LocalEmbedder(model_path=tmp_path / "missing.onnx")
    with pytest.raises(EmbedderUnavailable, match="cannot load"):
        await embedder.start()
    await embedder.aclose()


async def test_local_embedder_closed_while_a_batch_waits_says_so():
    # A batch queued on the model's thread behind another, when aclose() runs: it finds the
    # model gone and says the embedder was closed (it used to fail on the missing session).
    import threading

    embedder = LocalEmbedder()
    await embedder.start()
    assert embedder._pool is not None
    gate = threading.Event()
    embedder._pool.submit(gate.wait)  # keeps the model's one thread busy
    waiting = asyncio.create_task(embedder.embed(["queued behind the gate"]))
    await asyncio.sleep(0)  # the batch is handed to the thread pool and waits there
    closing = asyncio.create_task(embedder.aclose())
    await asyncio.sleep(0)  # aclose() dropped the model and waits for the pool to drain
    gate.set()
    await closing
    with pytest.raises(EmbedderUnavailable, match="the local embedder was closed"):
        await waiting


# --- openai-compatible, against a real server on loopback ---------------------------------


@pytest.fixture
async def endpoint():
    server = EmbeddingsServer()
    await server.server.start()
    yield server
    await server.server.stop()


def client(server: EmbeddingsServer, **options) -> OpenAIEmbedder:
    return OpenAIEmbedder(server.base_url, "test-embedding", api_key="sk-test", **options)


async def test_openai_embedder_good_path_learns_the_dimension_and_normalises(endpoint):
    embedder = client(endpoint)
    assert embedder.name == "openai:test-embedding" and embedder.dimension == 0
    await embedder.start()
    assert embedder.dimension == 48 and endpoint.calls == 1  # one probe call
    texts = ["Alice booked the morning flight.", "The hotel has a pool.", "Alice booked the morning flight."]
    vectors = await embedder.embed(texts)
    await embedder.aclose()
    assert len(vectors) == 3 and all(abs(norm(v) - 1) < 1e-9 for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]  # in order, although the server answered reversed
    assert same(vectors, await HashEmbedder(48).embed(texts))


async def test_openai_embedder_batches(endpoint):
    embedder = client(endpoint, batch_size=4)
    await embedder.start()
    texts = [f"text number {i}" for i in range(10)]
    vectors = await embedder.embed(texts)
    await embedder.aclose()
    assert endpoint.batches == [1, 4, 4, 2]  # the probe, then batches of 4
    assert same(vectors, await HashEmbedder(48).embed(texts))


async def test_openai_embedder_retries_a_transient_error_then_recovers(endpoint):
    embedder = client(endpoint, backoff=0.01)
    await embedder.start()
    endpoint.failures = [500, 503]
    vectors = await embedder.embed(["the spare key is under the pot"])
    assert same(vectors, await HashEmbedder(48).embed(["the spare key is under the pot"]))
    assert endpoint.calls == 1 + 3

    endpoint.failures = [500, 500, 500]  # more than the attempts: unavailable, with the reason
    with pytest.raises(EmbedderUnavailable, match=r"HTTP 500: scripted 500, after 3 attempt"):
        await embedder.embed(["x"])
    await embedder.aclose()


async def test_openai_embedder_fails_at_once_on_a_rejected_key(endpoint):
    embedder = OpenAIEmbedder(endpoint.base_url, "test-embedding", api_key="wrong", backoff=0.01)
    with pytest.raises(EmbedderUnavailable, match=r"HTTP 401: Incorrect API key provided \(check EMBEDDING_API_KEY\)"):
        await embedder.start()
    await embedder.aclose()
    assert endpoint.calls == 1  # not retried


async def test_openai_embedder_reports_an_endpoint_that_is_down():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    embedder = OpenAIEmbedder(url, "test-embedding", backoff=0.01)
    with pytest.raises(EmbedderUnavailable) as caught:
        await embedder.start()
    await embedder.aclose()
    message = str(caught.value)
    assert f"{url}/embeddings" in message and "cannot be reached" in message and "after 3 attempt(s)" in message


async def test_openai_embedder_refuses_a_dimension_that_differs_from_the_setting(endpoint):
    settings = Settings(_env_file=None, embedder="openai", embedding_base_url=endpoint.base_url,
                        embedding_model="test-embedding", embedding_api_key="sk-test", embedding_dimension=384)
    embedder = build_embedder(settings)
    assert embedder.dimension == 384
    with pytest.raises(EmbedderUnavailable, match=r"returns 48-dimensional vectors .* EMBEDDING_DIMENSION is 384"):
        await embedder.start()
    await embedder.aclose()

    # A server that changes its model under a started embedder is refused on every later call too.
    matching = build_embedder(settings.model_copy(update={"embedding_dimension": 48}))
    await matching.start()
    endpoint.hash = HashEmbedder(64)
    with pytest.raises(EmbedderUnavailable, match=r"returns 64-dimensional vectors .* EMBEDDING_DIMENSION is 48"):
        await matching.embed(["hello"])
    await matching.aclose()


async def test_openai_embedder_times_out_and_says_so(endpoint):
    endpoint.delay = 0.6
    embedder = client(endpoint, timeout=0.2, max_attempts=2, backoff=0.01)
    with pytest.raises(EmbedderUnavailable, match=r"no answer within the timeout \(ReadTimeout\), after 2 attempt"):
        await embedder.start()
    await embedder.aclose()


# --- settings -----------------------------------------------------------------------------


def test_build_embedder_follows_the_settings():
    default = build_embedder(Settings(_env_file=None))
    assert isinstance(default, LocalEmbedder) and default.dimension == 384
    hashed = build_embedder(Settings(_env_file=None, embedder="hash", embedding_dimension=64))
    assert isinstance(hashed, HashEmbedder) and hashed.dimension == 64
    assert build_embedder(Settings(_env_file=None, embedder="hash")).dimension == 384
    with pytest.raises(EmbedderUnavailable, match="EMBEDDING_BASE_URL and EMBEDDING_MODEL"):
        build_embedder(Settings(_env_file=None, embedder="openai"))
    with pytest.raises(EmbedderUnavailable, match="384-dimensional vectors, but EMBEDDING_DIMENSION is 64"):
        build_embedder(Settings(_env_file=None, embedder="local", embedding_dimension=64))
