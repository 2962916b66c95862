"""The protocol the two retrieval benchmarks share (bench/locomo.py, bench/longmemeval.py).

- **Halves.** Each dev set is split in two by a fixed rule that never looks at a
  question's text, answer or difficulty: within each group (LoCoMo: conversation and
  category; LongMemEval: question type), the questions are ordered by the SHA-256 of their
  key (LoCoMo ``<sample_id>#<qa index>``, LongMemEval ``question_id``) and alternate: the
  first, third, ... are half ``a``, the others half ``b``. Both halves of every group are
  the same size, give or take one. Tune on one half, report both (issue 33, item 8).
- **Where the evidence is lost**, per evidence turn and budget: ``shown`` (one element of
  the block holds >= 70 % of the turn's content words: evidence-in-context), ``cut`` (not
  shown, but an element holds a piece of it verbatim: CUT_RUN consecutive words of the
  turn, or the whole turn when it is shorter), ``found, not shown`` (among the sources of
  search's top 20, no piece of it in the block) and ``not found`` (not in search's top 20,
  no piece of it in the block). A piece is told by a verbatim run, not by a share of
  words: neighbouring turns of one conversation share 30-60 % of their content words (a
  reply repeats the request's words), so a word share alone would call a turn "cut" that
  the block never showed. The four shares add up to 1
  per question; the first is evidence-in-context.
- **Answer-in-context**: every content word of the gold answer somewhere in the block's
  text, over questions whose answer is extractive (its content words all appear in the
  question's evidence turns, taken together).
- **User memory** (``um@B``): the characters of the block's ``<UserMemory>`` section at
  budget B (0 for a baseline or a block without one), the standing cost of what is kept
  about the user.
- **Summaries** of per-question records: the mean of each metric over the whole, each
  half and each group (category or question type), and tables of them.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from baselines import WORD, WORD_OR_NUMBER, Turn, content_words, own_texts, turn_words
from rich.table import Table

HALVES = ("a", "b")
THRESHOLD = 0.7  # share of a turn's content words one element must hold: the turn is shown
CUT_RUN = 8  # consecutive words of a turn that an element must hold verbatim: a piece of it
SEARCH_DEPTH = 20  # "found": among the sources of search's top 20
LOSS_KINDS = ("shown", "cut", "found_not_shown", "not_found")
LOSS_LABELS = {"shown": "shown", "cut": "shown but cut", "found_not_shown": "found, not shown",
               "not_found": "not found (top 20)"}


# --- halves ---------------------------------------------------------------------------------

def split_halves(items: Iterable[tuple[str, object]]) -> dict[str, str]:
    """``{key: "a" | "b"}`` for (key, group) pairs: within each group, keys in SHA-256 order
    alternate a, b, a, ... (the keys must be unique)."""
    groups: dict[object, list[str]] = {}
    for key, group in items:
        groups.setdefault(group, []).append(key)
    out: dict[str, str] = {}
    for keys in groups.values():
        for rank, key in enumerate(sorted(keys, key=lambda k: hashlib.sha256(k.encode()).hexdigest())):
            out[key] = HALVES[rank % 2]
    return out


def in_half(half: str, wanted: str) -> bool:
    return wanted == "both" or half == wanted


# --- where the evidence is lost -------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """A block's elements, as word sets and word sequences, and all its words."""

    sets: list[frozenset[str]]
    runs: set[tuple[str, ...]]  # every CUT_RUN consecutive words of an element (fewer: the element whole)
    words: frozenset[str]
    parses: bool = True

    @classmethod
    def of(cls, xml: str) -> Block:
        try:
            root = ET.fromstring(xml)
        except ET.ParseError:
            return cls([], set(), frozenset(), parses=False)
        texts = own_texts(root)
        runs: set[tuple[str, ...]] = set()
        for text in texts:
            runs |= ngrams(tokens(text))
        return cls([frozenset(WORD.findall(t.lower())) for t in texts], runs,
                   frozenset(WORD.findall(" ".join(root.itertext()).lower())))

    def share(self, turn: Turn) -> float:
        """The largest share of the turn's content words that one element holds."""
        words = turn_words(turn)
        if not words:
            return 0.0
        return max((len(words & el) / len(words) for el in self.sets), default=0.0)

    def holds_piece(self, turn: Turn) -> bool:
        """An element holds CUT_RUN consecutive words of the turn (all of them, if fewer)."""
        toks = tokens(turn.text)
        if len(toks) < CUT_RUN:
            return bool(toks) and any(_contains(r, toks) for r in self.runs)
        return not self.runs.isdisjoint(ngrams(toks))


def tokens(text: str) -> list[str]:
    return WORD_OR_NUMBER.findall(text.casefold())


def ngrams(toks: Sequence[str], n: int = CUT_RUN) -> set[tuple[str, ...]]:
    if len(toks) <= n:
        return {tuple(toks)} if toks else set()
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def _contains(run: tuple[str, ...], toks: Sequence[str]) -> bool:
    k = len(toks)
    return any(tuple(toks) == run[i:i + k] for i in range(len(run) - k + 1))


def loss_kind(share: float, piece: bool, found: bool) -> str:
    if share >= THRESHOLD:
        return "shown"
    if piece:
        return "cut"
    return "found_not_shown" if found else "not_found"


def evidence_losses(block: Block, evidence: Sequence[Turn], found: Iterable[str]) -> dict[str, str]:
    """Per evidence turn id, its loss kind in this block."""
    found = set(found)
    return {t.dia_id: loss_kind(block.share(t), block.holds_piece(t), t.dia_id in found) for t in evidence}


def loss_shares(kinds: Mapping[str, str]) -> dict[str, float]:
    """Per loss kind, the share of the evidence turns."""
    values = list(kinds.values())
    return {k: values.count(k) / len(values) for k in LOSS_KINDS}


def answer_words(answer: object) -> frozenset[str]:
    return content_words(str(answer))


def is_extractive(answer: frozenset[str], evidence: Iterable[Turn]) -> bool:
    """The answer has content words and all of them are in the evidence turns."""
    held = frozenset().union(*(content_words(t.text) for t in evidence))
    return bool(answer) and answer <= held


# --- per-question records and their summaries ---------------------------------------------

def record(key: str, half: str, group: object, **metrics: float | None) -> dict:
    return {"key": key, "half": half, "group": group, "m": metrics}


def context_metrics(xml: str, evidence: Sequence[Turn], found: Iterable[str], budget: int,
                    answer: frozenset[str] | None = None,
                    ranked: Sequence[str] | None = None) -> dict[str, float | None]:
    """One block's metrics at ``budget``: ``ctx`` (share of evidence shown), ``ctx_all``
    (all shown), the loss kinds, ``ans`` (the answer's words all in the block; None
    when ``answer`` is None, i.e. not extractive), where its characters go (``spent``), and
    with ``ranked`` (the texts of search's top 20) ``top20_shown``: the share of them
    one element of the block holds (>= THRESHOLD of their content words)."""
    block = Block.of(xml)
    loss = loss_shares(evidence_losses(block, evidence, found))
    out: dict[str, float | None] = {f"ctx@{budget}": loss["shown"], f"ctx_all@{budget}": float(loss["shown"] == 1.0)}
    out.update({f"{k}@{budget}": v for k, v in loss.items() if k != "shown"})
    out[f"ans@{budget}"] = None if answer is None else float(answer <= block.words)
    out.update({f"{k}@{budget}": v for k, v in spent(xml, evidence).items()})
    if ranked:
        held = [words for words in map(content_words, ranked) if words]
        out[f"top20_shown@{budget}"] = sum(
            max((len(w & el) / len(w) for el in block.sets), default=0.0) >= THRESHOLD for w in held) / len(held) \
            if held else None
    out[f"um@{budget}"] = float(user_memory_chars(xml))
    return out


def spent(xml: str, evidence: Sequence[Turn]) -> dict[str, float]:
    """Where a block's characters go, as shares of its length: ``evidence_chars`` (items
    holding >= THRESHOLD of an evidence turn's content words), ``user_chars`` (<UserMemory>),
    ``conversation_chars`` (<CurrentConversationContext>), ``relevant_chars``
    (<RelevantMemories>). Items are leaf elements, measured as serialised (markup included)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    wanted = [w for w in (turn_words(t) for t in evidence) if w]
    total = max(len(xml), 1)
    out = {"evidence_chars": 0.0, "user_chars": 0.0, "conversation_chars": 0.0, "relevant_chars": 0.0}
    for section in root:
        size = len(ET.tostring(section, encoding="unicode"))
        name = {"UserMemory": "user_chars", "CurrentConversationContext": "conversation_chars",
                "RelevantMemories": "relevant_chars"}.get(section.tag)
        if name:
            out[name] += size / total
        for el in section.iter():
            own = frozenset(WORD.findall((el.text or "").lower()))
            if not len(el) and own and any(len(w & own) >= THRESHOLD * len(w) for w in wanted):
                out["evidence_chars"] += len(ET.tostring(el, encoding="unicode").rstrip()) / total
    return out


_USER_MEMORY = re.compile(r"<UserMemory>.*?</UserMemory>", re.DOTALL)


def user_memory_chars(xml: str) -> int:
    """Characters of the block's ``<UserMemory>`` section, its tags included (0 without one):
    what the user's standing memory costs in every block of that user."""
    found = _USER_MEMORY.search(xml)
    return len(found.group(0)) if found else 0


def retrieval_metrics(found_lists: Sequence[Iterable[str]], evidence: Sequence[str], ks: Sequence[int],
                      prefix: str = "") -> dict[str, float]:
    """Turn recall@k (share of the evidence among the sources of the top k), recall_all@k
    and recall_any@k, for each k."""
    ev = set(evidence)
    out: dict[str, float] = {}
    for k in ks:
        got = set().union(*(set(x) for x in found_lists[:k])) & ev
        out[f"{prefix}R@{k}"] = len(got) / len(ev)
        out[f"{prefix}all@{k}"] = float(got == ev)
        out[f"{prefix}any@{k}"] = float(bool(got))
    return out


def mean_of(records: Sequence[dict], metric: str) -> tuple[float | None, int]:
    vals = [r["m"][metric] for r in records if r["m"].get(metric) is not None]
    return (statistics.fmean(vals) if vals else None), len(vals)


def summarize(records: Sequence[dict]) -> dict:
    metrics = sorted({m for r in records for m in r["m"]})
    out: dict = {"questions": len(records)}
    for m in metrics:
        value, n = mean_of(records, m)
        out[m] = value
        if n != len(records):
            out[f"{m}:n"] = n
    return out


def grouped(records: Sequence[dict], group_name: Callable[[object], str] = str) -> dict[str, dict]:
    """Summaries: ``all``, ``half a``, ``half b``, then each group (whole, and per half)."""
    out = {"all": summarize(records)}
    for h in HALVES:
        out[f"half {h}"] = summarize([r for r in records if r["half"] == h])
    for g in sorted({r["group"] for r in records}, key=str):
        rows = [r for r in records if r["group"] == g]
        out[group_name(g)] = summarize(rows)
        for h in HALVES:
            out[f"{group_name(g)} / {h}"] = summarize([r for r in rows if r["half"] == h])
    return out


# --- tables ---------------------------------------------------------------------------------

def f3(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_table(title: str, methods: Mapping[str, Mapping[str, dict]], columns: Sequence[tuple[str, str]],
                  rows: Sequence[str] | None = None) -> Table:
    """One row per (summary row, method): ``methods`` maps a method's name to its ``grouped``
    summaries; ``columns`` are (header, metric) pairs; a metric counted over fewer questions
    than the row has (answer-in-context) shows its count."""
    t = Table(title=title)
    t.add_column("questions")
    t.add_column("n", justify="right")
    t.add_column("method")
    for header, _ in columns:
        t.add_column(header, justify="right")
    first = next(iter(methods.values()), {})
    for row in rows if rows is not None else [r for r in first if " / " not in r]:
        for name, summaries in methods.items():
            s = summaries.get(row)
            if not s or not s.get("questions"):
                continue
            cells = []
            for _, metric in columns:
                cell = f3(s.get(metric))
                if f"{metric}:n" in s and s.get(metric) is not None:
                    cell += f" ({s[f'{metric}:n']})"
                cells.append(cell)
            t.add_row(row, str(s["questions"]), name, *cells)
    return t


def spent_columns(budget: int) -> list[tuple[str, str]]:
    """Where the block's characters go, and how much of search's top 20 it shows."""
    return [(f"{label} @{budget:,}", f"{key}@{budget}") for label, key in (
        ("evidence", "evidence_chars"), ("relevant", "relevant_chars"), ("user", "user_chars"),
        ("conversation", "conversation_chars"), ("top-20 shown", "top20_shown"))]


def loss_columns(budget: int) -> list[tuple[str, str]]:
    return [(f"{LOSS_LABELS[k]} @{budget:,}", f"ctx@{budget}" if k == "shown" else f"{k}@{budget}")
            for k in LOSS_KINDS]
