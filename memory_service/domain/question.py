"""What a question says about where its answer is: whose words, which time, how many places.

Search ranks by what a memory says (its words, its meaning, its entities). A question also
says *where* its answer was said, in words no signal matches on their own:

- **people**: "What did Caroline research?" asks for Caroline's turns; "What did you
  suggest for dinner?" asks for the assistant's. The names are matched against the
  candidates' speakers (their ``user_id``), not against a list of names here;
- **time**: "What did I buy last week?", "in May 2023", "two months ago" name a period,
  read relative to when the question is asked (``as_of``, LongMemEval's ``question_date``;
  else now); "first", "originally", "initially" ask for the earliest of several;
- **aggregation**: "How many ... in total?", "which of these", "all the ..." ask for
  evidence gathered from several sessions, not one session's five turns.

And, for pseudo-relevance feedback, the words the best first results share
(``feedback_terms``): searched again with the question's, they find what the question
calls by another name.

This module reads those cues from the question's text (English, lexical, no I/O);
memory_service/recall/question_rank.py turns them into factors on the ranked candidates.
A cue that is wrong costs a factor on a ranking, never a result: every factor is bounded
and only re-orders what the signals found.
"""

from __future__ import annotations

import calendar
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from memory_service.domain.bm25 import query_words
from memory_service.domain.text import stem

__all__ = ["Cues", "cues", "feedback_terms", "period"]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

# "you" asked about as a speaker: what the assistant said, suggested, told.
_ASSISTANT = re.compile(
    r"\b(?:you|u)\s+(?:\w+\s+)?(?:said|say|told|tell|suggest(?:ed)?|recommend(?:ed)?|mention(?:ed)?|"
    r"gave|give|provided?|list(?:ed)?|shared?|explain(?:ed)?|wrote|write|came\s+up\s+with|propos(?:ed|e)|"
    r"advis(?:ed|e)|answer(?:ed)?|describ(?:ed|e)|call(?:ed)?|name[ds]?|offer(?:ed)?|remind(?:ed)?)\b"
    r"|\byour\s+(?:suggestion|recommendation|advice|answer|response|list|reply|explanation)s?\b"
    r"|\b(?:our|the)\s+(?:previous|last|earlier)\s+(?:conversation|chat|discussion)\b")

_AGGREGATE = re.compile(
    r"\bhow\s+(?:many|much)\b|\bin\s+total\b|\btotal\b|\baltogether\b|\bcombined\b|\bso\s+far\b|"
    r"\ball\s+(?:the|of|my)\b|\bwhich\s+of\b|\beach\s+of\b|\bboth\b|\bevery\b|\blist\b|\bhow\s+often\b|"
    r"\bdifferent\b|\bvarious\b")

_FIRST = re.compile(r"\b(?:first|earliest|initially|originally|at\s+first|to\s+begin\s+with)\b")

_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "couple": 2, "few": 3}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): n for n, name in enumerate(calendar.month_abbr) if name and name != "May"}
_MONTHS.pop("sept", None)
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))

_AGO = re.compile(r"\b(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|couple|few)"
                  r"(?:\s+of)?\s+(day|week|month|year)s?\s+ago\b")
_LAST = re.compile(r"\b(?:last|past|previous)\s+(\d+|two|three|four|five|six|seven|eight|nine|ten|few|couple\s+of)?"
                   r"\s*(day|week|weekend|month|year)s?\b")
_THIS = re.compile(r"\bthis\s+(week|weekend|month|year)\b")
_DAY_WORD = re.compile(r"\b(yesterday|today|tonight|this\s+morning|earlier\s+today)\b")
_MONTH_DAY = re.compile(rf"\b(?:({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?|(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?"
                        rf"({_MONTH})\.?)(?:,?\s+(\d{{4}}))?\b")
_MONTH_YEAR = re.compile(rf"\b(?:in\s+|during\s+|of\s+)?({_MONTH})\.?(?:,?\s+(\d{{4}}))?\b")
_YEAR = re.compile(r"\b(?:in|during|of)\s+((?:19|20)\d{2})\b")
_ISO = re.compile(r"\b((?:19|20)\d{2})[-/](\d{1,2})[-/](\d{1,2})\b")


@dataclass(frozen=True, slots=True)
class Cues:
    """What a question says about where its answer is (``cues`` reads them)."""

    words: frozenset[str]  # its words, lowercase: a candidate's speaker named here is asked about
    names: bool = False  # it has a capitalised word past its first (other than "I"): it may name someone
    assistant: bool = False  # it asks what the assistant (``you``) said
    period: tuple[datetime, datetime] | None = None  # the time it names, [start, end)
    first: bool = False  # it asks for the earliest ("first", "originally")
    aggregate: bool = False  # it gathers from several places ("how many", "in total")


def _number(text: str | None) -> int:
    if not text:
        return 1
    text = text.split()[0]
    return int(text) if text.isdigit() else _NUMBERS.get(text, 1)


def _day(at: datetime) -> datetime:
    return at.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_span(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _latest_year(month: int, day: int, now: datetime) -> int:
    """The year of the latest ``month``/``day`` at or before ``now`` (a question asks about the past)."""
    try:
        return now.year if datetime(now.year, month, day, tzinfo=UTC) <= now + timedelta(days=1) else now.year - 1
    except ValueError:  # 29 February
        return now.year - 1


def period(text: str, now: datetime) -> tuple[datetime, datetime] | None:
    """The period ``text`` names, relative to ``now`` (when the question is asked), with a
    margin: a turn that tells of last Tuesday may have been said on Wednesday, and "a week
    ago" is rarely exactly seven days. None when it names none (or several: the first wins)."""
    lowered = text.lower()
    today = _day(now)
    if m := _ISO.search(lowered):
        try:
            start = datetime(int(m[1]), int(m[2]), int(m[3]), tzinfo=UTC)
        except ValueError:
            return None
        return start - timedelta(days=1), start + timedelta(days=2)
    if m := _DAY_WORD.search(lowered):
        start = today - timedelta(days=1) if m[1] == "yesterday" else today
        return start - timedelta(days=1), start + timedelta(days=2)
    if m := _AGO.search(lowered):
        days = _number(m[1]) * _UNIT_DAYS[m[2]]
        margin = max(1, days // 4)
        return today - timedelta(days=days + margin), today - timedelta(days=days - margin - 1)
    if m := _LAST.search(lowered):
        n, unit = _number(m[1]), m[2]
        days = 3 if unit == "weekend" else n * _UNIT_DAYS[unit]
        return today - timedelta(days=days + max(1, days // 4)), today + timedelta(days=1)
    if m := _THIS.search(lowered):
        days = {"week": 7, "weekend": 3, "month": 31, "year": 366}[m[1]]
        return today - timedelta(days=days), today + timedelta(days=1)
    if m := _MONTH_DAY.search(lowered):
        month = _MONTHS[(m[1] or m[4])]
        day = int(m[2] or m[3])
        year = int(m[5]) if m[5] else _latest_year(month, min(day, 28), now)
        try:
            start = datetime(year, month, day, tzinfo=UTC)
        except ValueError:
            return None
        return start - timedelta(days=1), start + timedelta(days=2)
    for m in _MONTH_YEAR.finditer(lowered):
        word = m[1]
        # "may" is a verb far more often than a month: only with a year or "in May".
        if word == "may" and not (m[2] or m.group(0).startswith(("in ", "during ", "of "))):
            continue
        month = _MONTHS[word]
        year = int(m[2]) if m[2] else _latest_year(month, 1, now)
        start, end = _month_span(year, month)
        return start - timedelta(days=2), end + timedelta(days=2)
    if m := _YEAR.search(lowered):
        year = int(m[1])
        return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    return None


def cues(question: str, now: datetime) -> Cues:
    """The cues of ``question`` asked at ``now`` (aware; the question's date, else the present)."""
    lowered = question.lower()
    capitalised = [w for w in re.findall(r"[A-Za-z][\w']*", question)[1:] if w[0].isupper() and w != "I"]
    return Cues(
        words=frozenset(_WORD.findall(lowered)),
        names=bool(capitalised),
        assistant=bool(_ASSISTANT.search(lowered)),
        period=period(question, now),
        first=bool(_FIRST.search(lowered)),
        aggregate=bool(_AGGREGATE.search(lowered)),
    )


def feedback_terms(texts: Sequence[str], query: Sequence[str], limit: int) -> list[str]:
    """Pseudo-relevance feedback's words: those the best results (``texts``) share, that the
    query (its search words, ``query``) does not hold, best first (held by more of the texts,
    then more often, then alphabetically), at most ``limit``. With two texts or more, a word
    of one text only is not shared: it is that text's, not the topic's."""
    asked = {stem(w) for w in query}
    held: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    spelled: dict[str, str] = {}
    for text in texts:
        words = [w for w in query_words(text) if not w.isdigit()]
        stems = {stem(w): w for w in words}
        for s, w in stems.items():
            if s not in asked:
                held[s] += 1
                spelled.setdefault(s, w)
        seen.update(stem(w) for w in words)
    least = 2 if len(texts) > 1 else 1
    best = sorted((s for s, n in held.items() if n >= least), key=lambda s: (-held[s], -seen[s], s))
    return [spelled[s] for s in best[:limit]]
