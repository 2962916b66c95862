"""Shared helpers of the retrieval benchmarks (bench/locomo.py, bench/latency_bench.py).

- Loading LoCoMo-format data (the path is always an argument; no data ships with the
  project), with the evidence normalisation of the shared data's README (see bench/README.md).
- The metrics: turn recall@k, recall_all@k, evidence-in-context (a single XML element
  holding >= 70 % of an evidence turn's content words, or, by id, a ``sources`` attribute).
- Baselines outside the service: BM25 (bm25s, English stopwords, no stemming), dense
  (the service's own embedder, when ``memory_service.embedding.embedders`` exists), RRF of both, and
  packing the best turns, whole, into a character budget.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

import numpy as np

# --- data -----------------------------------------------------------------------------------

DIA_ID = re.compile(r"D:?(\d+):(\d+)")  # also matches the malformed "D:11:26"; "D30:05" -> D30:5


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str | None
    session: int  # N of session_N
    index: int  # position in its session, from 0

    @property
    def content(self) -> str:
        """The message content sent to the service: the text, plus the image caption."""
        return self.text + (f" [image: {self.caption}]" if self.caption else "")

    @property
    def doc(self) -> str:
        """The baselines' document: ``speaker: text [image: caption]``."""
        return f"{self.speaker}: {self.content}"


@dataclass(frozen=True)
class Session:
    number: int
    date: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    sample_id: str
    index: int  # position in the sample's qa list
    question: str
    category: int
    evidence: tuple[str, ...]  # normalised dia_ids that exist in the conversation, in order
    raw_evidence: tuple[str, ...]


@dataclass
class Sample:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    questions: list[Question]  # categories 1-4 with usable evidence
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def parse_locomo_date(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> an aware datetime (UTC: the data gives no zone)."""
    cleaned = " ".join(value.replace(",", " ").split())
    for fmt in ("%I:%M %p on %d %B %Y", "%I:%M %p on %d %b %Y", "%H:%M on %d %B %Y"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=UTC)
        except ValueError:
            pass
    raise ValueError(f"unrecognised session date {value!r}")


def normalize_evidence(raw: Iterable[str], known: set[str] | None = None) -> list[str]:
    """Every ``D<s>:<t>`` found in the strings, zero-padding and stray colons removed,
    duplicates dropped, order kept; with ``known``, only ids of existing turns."""
    out: list[str] = []
    for item in raw:
        for m in DIA_ID.finditer(str(item)):
            dia = f"D{int(m[1])}:{int(m[2])}"
            if dia not in out and (known is None or dia in known):
                out.append(dia)
    return out


def load_locomo(path: str | Path, limit_samples: int | None = None) -> list[Sample]:
    import json

    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not data or "conversation" not in data[0]:
        raise ValueError(f"{path}: not LoCoMo-format data (a list of samples with 'conversation')")
    samples = []
    for raw in data[:limit_samples] if limit_samples else data:
        conv = raw["conversation"]
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        sessions = []
        for n in numbers:
            turns = tuple(
                Turn(dia_id=t["dia_id"], speaker=t["speaker"], text=t["text"],
                     caption=(t.get("blip_caption") or None), session=n, index=i)
                for i, t in enumerate(conv[f"session_{n}"]))
            if turns:
                sessions.append(Session(n, parse_locomo_date(conv[f"session_{n}_date_time"]), turns))
        known = {t.dia_id for s in sessions for t in s.turns}
        questions, skipped = [], {"adversarial": 0, "no_usable_evidence": 0}
        for i, qa in enumerate(raw.get("qa", [])):
            if qa.get("category") not in (1, 2, 3, 4):
                skipped["adversarial"] += 1
                continue
            raw_ev = tuple(str(e) for e in qa.get("evidence", []))
            evidence = normalize_evidence(raw_ev, known)
            if not evidence:
                skipped["no_usable_evidence"] += 1
                continue
            questions.append(Question(raw["sample_id"], i, qa["question"], qa["category"], tuple(evidence), raw_ev))
        samples.append(Sample(raw["sample_id"], conv["speaker_a"], conv["speaker_b"], sessions, questions, skipped))
    return samples


def turn_times(session: Session) -> list[datetime]:
    """The session's date, +1 s per turn, so that the order of the turns is kept."""
    return [session.date + timedelta(seconds=i) for i in range(len(session.turns))]


def speaker_of_question(question: str, speaker_a: str, speaker_b: str) -> str:
    """The speaker the question names (the first one named), else speaker_a."""
    best: tuple[int, str] | None = None
    for name in (speaker_a, speaker_b):
        m = re.search(rf"\b{re.escape(name)}\b", question, re.IGNORECASE)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), name)
    return best[1] if best else speaker_a


# --- metrics --------------------------------------------------------------------------------

WORD = re.compile(r"\b\w\w+\b")


def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN  # the list bm25s's "english" uses

    return frozenset(STOPWORDS_EN)


STOPWORDS = _stopwords()
logging.getLogger("bm25s").setLevel(logging.WARNING)  # importing bm25s set its logger to DEBUG


def content_words(text: str) -> frozenset[str]:
    """Lowercase ``\\b\\w\\w+\\b`` tokens, English stopwords removed (bm25s's list)."""
    return frozenset(w for w in WORD.findall(text.lower()) if w not in STOPWORDS)


def turn_words(turn: Turn) -> frozenset[str]:
    """A turn's content words: its text alone (no speaker name, no image caption).

    A turn with no content word at all ("Ok!") falls back to all its tokens."""
    return content_words(turn.text) or frozenset(WORD.findall(turn.text.lower()))


def recall_at(found: Iterable[str], evidence: Sequence[str]) -> float:
    ev = set(evidence)
    return len(ev & set(found)) / len(ev)


def ranked_sources(source_lists: Sequence[Iterable[str]], k: int) -> set[str]:
    """The union of the source ids of the top ``k`` results."""
    out: set[str] = set()
    for sources in source_lists[:k]:
        out.update(sources)
    return out


@dataclass
class XmlEvidence:
    by_text: set[str]  # evidence turns found by the 70 % content-word rule
    by_id: set[str] | None  # evidence turns named in a ``sources`` attribute; None: no element has one
    parse_error: str | None = None


def own_texts(root: ET.Element) -> list[str]:
    """Each element's own text (its text and its children's tails, not the children's
    text), for the elements that have any."""
    out = []
    for el in root.iter():
        own = (el.text or "") + "".join(child.tail or "" for child in el)
        if own.strip():
            out.append(own)
    return out


def evidence_in_xml(xml: str, turns: Sequence[Turn], threshold: float = 0.7) -> XmlEvidence:
    """Which of ``turns`` the block holds: an element whose own text (not its children's)
    contains at least ``threshold`` of the turn's content words; and, by id, which turns
    an element's ``sources="D3:7 D3:8"`` attribute names."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return XmlEvidence(set(), None, str(exc))
    element_words = [frozenset(WORD.findall(text.lower())) for text in own_texts(root)]
    ids: set[str] | None = None
    for el in root.iter():
        if (sources := el.get("sources")) is not None:
            ids = (ids or set()) | set(sources.split())
    by_text = set()
    for turn in turns:
        words = turn_words(turn)
        if words and any(len(words & ew) >= threshold * len(words) for ew in element_words):
            by_text.add(turn.dia_id)
    by_id = None if ids is None else {t.dia_id for t in turns if t.dia_id in ids}
    return XmlEvidence(by_text, by_id)


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
SPEAKER = re.compile(r"^\s*[^\s:<>]{1,40}:\s")  # "caroline: " before a message's text
WORD_OR_NUMBER = re.compile(r"\w+")
REPEATED_EXAMPLES: list[str] = []  # the first few repeated sentences seen, for a look


def block_composition(xml: str, turns: Sequence[Turn], threshold: float = 0.7) -> dict[str, dict[str, int]]:
    """What a block spends its characters on, per section (the root's children:
    StartupRecords, CollectiveMemory, ...): the items (leaf elements with text), their
    characters (the item's serialised element, tags and attributes included; ``markup``: those
    characters that are not the item's text), the items
    holding at least ``threshold`` of some evidence turn's content words, and the repeated
    items (an item sharing a sentence of three words or more, a message's "speaker: " aside,
    with an item before it, in any section: a message shown again inside an episode counts). Empty for a block that does not parse."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    words = [w for w in (turn_words(t) for t in turns) if w]
    out: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    for section in root:
        row = out.setdefault(section.tag, {"items": 0, "chars": 0, "markup": 0, "evidence_items": 0, "repeated": 0})
        for el in section.iter():
            if len(el) or not (el.text or "").strip():
                continue
            text = el.text or ""
            row["items"] += 1
            serialised = len(ET.tostring(el, encoding="unicode").rstrip())
            row["chars"] += serialised
            row["markup"] += serialised - len(escape(text))
            own = frozenset(WORD.findall(text.lower()))
            row["evidence_items"] += any(len(w & own) >= threshold * len(w) for w in words)
            sentences = {" ".join(w) for x in SENTENCE_END.split(text)
                         if len(w := WORD_OR_NUMBER.findall(SPEAKER.sub("", x, count=1).casefold())) >= 3}
            row["repeated"] += bool(sentences & seen)
            if sentences & seen and len(REPEATED_EXAMPLES) < 20:
                REPEATED_EXAMPLES.append(f"{section.tag}/{el.tag}: {sorted(sentences & seen)[0]!r} in {text[:200]!r}")
            seen |= sentences
    return out


def pack_turns(turns: Iterable[Turn], budget: int, skip: bool = False) -> tuple[str, list[str]]:
    """The baselines' memory block: the given turns (best first), whole, as
    ``<Turn>speaker: text [image: caption]</Turn>`` items, until the next one would not
    fit (with ``skip``: a turn that does not fit is passed over and the next ones tried);
    and the ids of the turns packed."""
    head, tail = "<MemoryContext>\n", "</MemoryContext>"
    out, ids, used = [], [], len(head) + len(tail)
    for turn in turns:
        item = f"  <Turn>{escape(turn.doc)}</Turn>\n"
        if used + len(item) > budget:
            if skip:
                continue
            break
        out.append(item)
        ids.append(turn.dia_id)
        used += len(item)
    return head + "".join(out) + tail, ids


# --- timing ---------------------------------------------------------------------------------

# --- baselines ------------------------------------------------------------------------------

class BM25Index:
    """bm25s over documents: lowercase ``\\b\\w\\w+\\b`` tokens, English stopwords, no stemming."""

    def __init__(self, docs: Sequence[str]):
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG
        self._bm25s = bm25s
        self.size = len(docs)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(list(docs), stopwords="english", show_progress=False),
                             show_progress=False)

    def rank(self, query: str, k: int | None = None, weight_mask: np.ndarray | None = None) -> list[int]:
        """Document indices, best first (ties in index order); at most ``k`` (all by default)."""
        k = min(k or self.size, self.size)
        tokens = self._bm25s.tokenize([query], stopwords="english", show_progress=False)
        if not tokens.vocab:  # nothing but stopwords: every document scores 0
            return list(range(k))
        docs, _ = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=0, weight_mask=weight_mask)
        return [int(i) for i in docs[0]]


class DenseIndex:
    """Brute-force cosine similarity (numpy) over the embedder's normalised vectors."""

    def __init__(self, vectors: np.ndarray):
        self.vectors = vectors

    def rank(self, query_vector: np.ndarray, k: int | None = None, mask: np.ndarray | None = None) -> list[int]:
        scores = self.vectors @ query_vector
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        k = min(k or len(scores), len(scores))
        if k < len(scores):
            top = np.argpartition(-scores, k - 1)[:k]
            top = top[np.argsort(-scores[top], kind="stable")]
        else:
            top = np.argsort(-scores, kind="stable")
        return [int(i) for i in top if np.isfinite(scores[i])]


def rrf(rankings: Sequence[Sequence[int]], k: int = 60, limit: int | None = None) -> list[int]:
    """Reciprocal rank fusion: score(d) = sum over rankings of 1 / (k + rank), rank from 1."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    fused = sorted(scores, key=lambda d: (-scores[d], d))
    return fused[:limit] if limit else fused


@dataclass
class Embedder:
    """An adapter over ``memory_service.embedding.embedders.build_embedder(Settings())``, whatever
    its method names turn out to be (sync or async; one text or a list)."""

    impl: object
    name: str

    async def embed(self, texts: Sequence[str], query: bool = False, batch: int = 256) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch):
            out.append(await self._embed(list(texts[start:start + batch]), query))
        vectors = np.concatenate(out, axis=0).astype(np.float32) if out else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1, norms)

    async def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        impl = self.impl
        many = (("embed_queries",) if query else ()) + ("embed_documents", "embed_texts", "embed_batch", "embed_many",
                                                        "create_batch", "embed", "encode")
        for name in many:
            fn = getattr(impl, name, None)
            if callable(fn):
                result = fn(texts)
                if inspect.isawaitable(result):
                    result = await result
                arr = np.asarray(result, dtype=np.float32)
                if arr.ndim == 2 and len(arr) == len(texts):
                    return arr
        for name in (("embed_query",) if query else ()) + ("embed_one", "create"):
            fn = getattr(impl, name, None)
            if callable(fn):
                rows = []
                for text in texts:
                    result = fn(text)
                    if inspect.isawaitable(result):
                        result = await result
                    rows.append(np.asarray(result, dtype=np.float32).reshape(-1))
                return np.stack(rows)
        raise TypeError(f"{type(impl).__name__}: no embedding method this bench knows "
                        "(embed_documents, embed, encode, create_batch, create, ...)")


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


# ``--no-dense`` (bench/locomo.py): the dense and RRF baselines are skipped (re-running a kept
# store under other ranking settings: the baselines do not change, and embedding every turn again
# is most of their time on a loaded machine).
DENSE = True


async def load_embedder() -> tuple[Embedder | None, str]:
    """The service's embedder (``build_embedder(Settings())``, started), or None and why not."""
    if not DENSE:
        return None, "--no-dense: dense and RRF baselines skipped"
    try:
        from memory_service.embedding import embedders as embedding
    except ImportError as exc:
        return None, f"memory_service.embedding.embedders is not importable ({exc}): dense and RRF baselines skipped"
    build = getattr(embedding, "build_embedder", None)
    if build is None:
        return None, "memory_service.embedding.embedders has no build_embedder: dense and RRF baselines skipped"
    try:
        from memory_service.config import Settings

        impl = await _maybe_await(build(Settings()))
        if callable(start := getattr(impl, "start", None)):
            await _maybe_await(start())
    except Exception as exc:  # noqa: BLE001 - reported, the bench goes on without it
        return None, f"build_embedder(Settings()) failed: {type(exc).__name__}: {exc}: dense and RRF baselines skipped"
    name = getattr(impl, "name", None) or getattr(impl, "model", None) or getattr(impl, "model_name", None)
    return Embedder(impl, name if isinstance(name, str) else type(impl).__name__), "ok"


async def close_embedder(embedder: Embedder | None) -> None:
    if embedder is not None:
        for name in ("aclose", "close"):
            if callable(fn := getattr(embedder.impl, name, None)):
                await _maybe_await(fn())
                return


