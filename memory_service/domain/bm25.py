"""BM25 over candidates a full-text index found: the scoring the index's own lacks.

FalkorDB's full-text index (RediSearch inside FalkorDB) scores an OR query by TF-IDF
divided by the distance between the matched terms, so a memory that holds two query
words far apart ranks below one that holds one of them (measured: "seat alice" put
"alice: ... flight ..." at 2.0 above "alice: I prefer window seats" at 0.75). The backend
therefore asks the index which memories hold each term (the index does the matching,
stemming and scoping), and ranks them here by Okapi BM25 with the index's own counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from memory_service.domain.text import stem

K1 = 1.2
# Length normalisation: 0.5, not the textbook 0.75. On the LoCoMo dev split (chat turns,
# lengths counted in searchable words), 0.75 let short generic turns ("Cool! What did it
# look like?") outrank the evidence: service R@10 0.696 at 0.75, 0.712 at 0.5, and evidence
# in the 4,000-character block 0.694 and 0.691 (docs/benchmarks/locomo.md, "What was tried").
B = 0.5
_WORD = re.compile(r"\w+", re.UNICODE)
# Words that carry no topic: the query drops them (memory_service/recall/search.py), and the
# store's postings (memory_service/backends/postings.py) do not index them. The full-text index
# drops English stopwords too; these are the question words and fillers a query adds on top.
QUERY_STOPWORDS = frozenset(
    """a about after again all also am an and any are as at be been before being both but by can could
    did do does doing done for from had has have having he her here hers him his how i if in into is it
    its just me more most my no nor not now of off on once only or other our out over own same she should
    so some such than that the their them then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your yours did ever
    something anything thing things get got""".split()
)


def query_words(text: str) -> list[str]:
    """The words of ``text`` that search looks for, lowercase, in order, repeats kept: neither
    stopwords nor one letter long (a digit counts)."""
    words = (w.lower() for w in _WORD.findall(text))
    return [w for w in words if w not in QUERY_STOPWORDS and len(w) > 1 or w.isdigit()]


def term_counts(text: str) -> dict[str, int]:
    """How often each stem of ``text``'s searchable words (``query_words``) occurs: what the
    postings index, and what a query's words are matched against once stemmed."""
    counts: dict[str, int] = {}
    for word in query_words(text):
        term = stem(word)
        counts[term] = counts.get(term, 0) + 1
    return counts


def indexed(text: str) -> tuple[int, dict[str, int]]:
    """What the postings keep of a text: its length (its searchable words, stopwords left
    out, as the index sees it; counting every word measured worse on the LoCoMo dev split:
    evidence in the block 0.686 against 0.694) and ``term_counts``."""
    counts = term_counts(text)
    return sum(counts.values()), counts


def impact(tf: int, length: int, average_length: float) -> float:
    """A term's BM25 weight in one text without its idf: ``tf`` occurrences in a text of
    ``length`` indexed words, where the texts average ``average_length``."""
    norm = K1 * (1 - B + B * length / max(average_length, 1e-9))
    return tf * (K1 + 1) / (tf + norm)


def idf(n_docs: int, df: int) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def stems(text: str) -> list[str]:
    return [stem(w) for w in _WORD.findall(text.lower())]


def scores(matches: Mapping[str, set[str]], texts: Mapping[str, str], df: Mapping[str, int],
           n_docs: int) -> dict[str, float]:
    """BM25 of each text for every term in ``df``.

    ``df`` counts the memories of the whole scope holding each term, ``n_docs`` the scope's
    size; ``matches`` are the terms the index found in each text, which count at least
    once even where this module's stemmer does not see them (the index's may differ).
    """
    weights = {t: idf(max(n_docs, d), d) for t, d in df.items()}
    term_stems = {t: stem(t) for t in df}
    tokenised = {key: stems(text) for key, text in texts.items()}
    average = sum(map(len, tokenised.values())) / max(len(tokenised), 1) or 1.0
    out = {}
    for key, tokens in tokenised.items():
        norm = K1 * (1 - B + B * len(tokens) / average)
        found = matches.get(key, set())
        total = 0.0
        for term, term_stem in term_stems.items():
            tf = sum(1 for token in tokens if token == term_stem) or (1 if term in found else 0)
            if tf:
                total += weights[term] * tf * (K1 + 1) / (tf + norm)
        out[key] = total
    return out


def rank(texts: Mapping[str, str], words: Sequence[str]) -> dict[str, float]:
    """Okapi BM25 of each text holding one of ``words`` (query words, stemmed here), over
    ``texts`` as the whole collection: their words and lengths as ``term_counts`` gives them,
    as the postings index them."""
    return rank_counts({key: indexed(text) for key, text in texts.items()}, words)


def rank_counts(counts: Mapping[str, tuple[int, Mapping[str, int]]], words: Sequence[str]) -> dict[str, float]:
    """``rank`` of texts given by their indexed length and stem counts (the counts of the
    query's stems suffice)."""
    keys = list(counts)
    terms = list(dict.fromkeys(stem(w) for w in words))
    matches = {t: {i: c[t] for i, key in enumerate(keys) if t in (c := counts[key][1])} for t in terms}
    return {keys[i]: score for i, score in rank_matches([counts[key][0] for key in keys], matches).items()}


def rank_matches(lengths: Sequence[int], matches: Mapping[str, Mapping[int, int]]) -> dict[int, float]:
    """Okapi BM25 of each text holding one of the query's stems, by index in ``lengths`` (the
    indexed length of every text of the collection), given where each stem occurs and how
    often (``matches``: stem -> {text index: tf}), the stems in the query's order."""
    n = len(lengths)
    average = sum(lengths) / max(n, 1)
    norms: dict[int, float] = {}  # by length: ``impact``'s denominator, without tf
    out: dict[int, float] = {}
    for where in matches.values():
        if not where:
            continue
        weight = idf(n, len(where))
        for at, tf in where.items():
            length = lengths[at]
            if (norm := norms.get(length)) is None:
                norm = norms[length] = K1 * (1 - B + B * length / max(average, 1e-9))
            out[at] = out.get(at, 0.0) + weight * (tf * (K1 + 1) / (tf + norm))  # = weight * impact(tf, ...)
    return {at: score for at, score in out.items() if score > 0}
