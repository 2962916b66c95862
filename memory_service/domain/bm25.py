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
from collections.abc import Mapping

from memory_service.domain.text import stem

K1 = 1.2
B = 0.75
_WORD = re.compile(r"\w+", re.UNICODE)


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
