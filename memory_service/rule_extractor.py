"""Offline, rule-based extraction: no model, no network, standard library only.

The default extractor for the demo, the tests and any deployment without an LLM. It reads
surface cues only, so it errs on the side of keeping less: a missed memory costs little,
a wrong one is shown to the model in every later prompt.

What it produces from one window (see DESIGN.md, "Memory kinds"):
- episode: the window's most informative sentences, each under its speaker, <= 50 words;
- directives: a user's own sentences stating a rule, preference or stable personal context;
- facts and suggestions: sentences on an active shard's topic, naming their source;
  suggestions also name who agreed or disagreed in the following messages.

Only user and assistant messages are read: system prompts are instructions, not
conversation, and tool output is raw data that would crowd out what people said.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from .extraction import ExtractedItem, Extraction, Window, WindowMessage
from .models import WORD_LIMITS, MemoryKind, Role, Shard

__all__ = ["RuleBasedExtractor", "content_words", "limit_words", "split_sentences", "stem"]


def limit_words(text: str, n: int) -> str:
    """``text`` with white space collapsed and at most ``n`` words; a cut is marked with '…'.

    Words are white-space separated runs, the same count the word limits are checked with.
    The ellipsis is glued to the last kept word, so it never adds a word.
    """
    words = text.split()
    if len(words) <= n:
        return " ".join(words)
    if n <= 0:
        return ""
    return " ".join(words[:n]).rstrip(" ,;:-–—") + "…"


def _word_count(text: str) -> int:
    return len(text.split())


# --- words ---------------------------------------------------------------------------

# Function words, chat filler and bare verdicts ("sounds good"): they say nothing about a
# topic, so they neither score episode sentences nor match shards. Checked against the raw
# word and its stem. The letter pairs are what "3rd" or "7pm" leave behind.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do
    does doesn't doing don't down during each few for from further had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how
    how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
    mustn't my myself no nor not of off on once only or other ought our ours ourselves out
    over own same shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up very was wasn't we we'd we'll
    we're we've were weren't what what's when when's where where's which while who who's
    whom why why's will with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves
    just also really maybe well okay ok yes yeah yep no nope hi hello hey thanks thank
    please sure oh like get got go going make made want need know think let lets shall may
    might must one thing stuff something anything everything lot bit now still even much
    many etc general misc topic info information related
    good great fine nice perfect lovely cool awesome sound sounds agree agreed idea noted
    understood right alright
    us am pm st nd rd th mr ms dr eg ie vs ah uh um hm
    """.split()
)

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def stem(word: str) -> str:
    """A deliberately small stemmer: enough that 'bookings', 'booked' and 'book' meet.

    Plural, then verb ending, then a final e/y/ic, each only when a stem of at least three
    letters remains, so short words are left alone.
    """
    w = word.lower()
    if w.endswith("'s"):
        w = w[:-2]
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "ches", "shes", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if w[-1] == w[-2] and w[-1] not in "aeioulsz":  # planned -> plann -> plan
                w = w[:-1]
            break
    if w.endswith("ic") and len(w) >= 6:  # allergic / allergy -> allerg
        w = w[:-2]
    elif w.endswith(("e", "y")) and len(w) >= 4:  # date / dated -> dat
        w = w[:-1]
    return w


def content_words(text: str) -> list[str]:
    """Stems of the words in ``text`` that carry meaning, in order, repeats kept."""
    out = []
    for word in _WORD.findall(_normalise(text).lower()):
        if len(word) < 2 or word in STOP_WORDS:  # two letters: keep "QA", "UI", "DB"
            continue
        stemmed = stem(word)
        if stemmed not in STOP_WORDS:
            out.append(stemmed)
    return out


def _normalise(text: str) -> str:
    """Typographic quotes to ASCII, so that one pattern matches "don't" and "don’t"."""
    return text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"')


# --- sentences -----------------------------------------------------------------------

# A sentence ends at . ! ? or … followed by white space (optionally after a closing quote
# or bracket), or at a line break. Abbreviations split wrongly; that costs little here.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…][\"')\]])\s+|(?<=[.!?…])\s+|\s*\n\s*")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, white space collapsed; pieces without a letter or digit dropped."""
    pieces = (" ".join(p.split()) for p in _SENTENCE_BREAK.split(text))
    return [p for p in pieces if any(ch.isalnum() for ch in p)]


@dataclass(frozen=True, slots=True)
class _Sentence:
    message: WindowMessage
    order: tuple[int, int]  # (message position in the window, sentence position in it)
    speaker: str  # user_id for users, "assistant" for the assistant
    text: str  # as written, white space collapsed
    norm: str  # typographic quotes normalised, for the patterns
    stems: tuple[str, ...]

    @property
    def is_user(self) -> bool:
        return self.message.role == Role.USER

    @property
    def is_question(self) -> bool:
        return self.norm.rstrip("\"')] ").endswith("?")


def _speaker(message: WindowMessage) -> str:
    if message.role == Role.USER:
        return message.user_id or "user"
    return "assistant"


def _lower_first(text: str) -> str:
    """'We should…' -> 'we should…' after a 'name:' prefix; names and 'I' keep their capital."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    bare = re.sub(r"[^a-z']", "", _normalise(first).lower())
    if bare in STOP_WORDS and not bare.startswith("i'") and bare != "i" and first[:1].isupper() and not first.isupper():
        return text[0].lower() + text[1:]
    return text


def _key(text: str) -> str:
    """What two sentences must share to count as the same (case, punctuation and spacing ignored)."""
    return " ".join(re.findall(r"[a-z0-9]+", _normalise(text).lower()))


# --- cues ----------------------------------------------------------------------------

# Directives are recognised only at the start of a clause, so that "I've never been there"
# or "the museum is never open" do not become rules. A clause starts the sentence, follows
# , ; : ( or a dash, or follows a joining word.
_CLAUSE_START = (
    r"(?:^|[,;:(]\s*|\s[-–—]\s*|"
    r"\b(?:and|but|so|also|then|plus|btw|oh|well|actually|ok|okay|hi|hey|because|since)\s+)"
)
# "I like it." / "I love that idea!" react to what was just said; they are not preferences.
_NOT_A_REACTION = (
    r"(?!\s+(?:it|that|this|these|those|them|the|your)\s*(?:idea|plan|one|suggestion|option)?\s*(?:[,.!;]|$))"
)
_DIRECTIVE_PATTERNS = (
    r"i\s+(?:(?:really|also|usually|generally|always|just|much|strongly|definitely|do|truly)\s+)*"
    r"(?:prefer|like|love|hate|dislike|enjoy|can't\s+stand|cannot\s+stand)\b" + _NOT_A_REACTION,
    r"i\s+(?:don't|do\s+not|can't|cannot)\s+(?:like|eat|drink|stand|fly|drive)\b",
    r"i(?:'d|\s+would)\s+(?:prefer|rather)\b",
    r"i\s+(?:want|need|'d\s+like|would\s+like)\s+you\s+to\s+(?:always|never)\b",
    r"(?:please\s+)?(?:always|never)\b(?!\s+mind\b)",
    r"(?:please\s+)?(?:don't|do\s+not)\s+ever\b",
    r"call\s+me\s+\"?(?-i:[A-Z])",  # "call me Bobby", not "call me tomorrow"
    r"my\s+name(?:\s+is|'s)\b",
    r"i(?:'m|\s+am)\s+an?\s+(?!(?:bit|little|lot|moment|sec|second|minute)\b)\w",
    r"i(?:'m|\s+am)\s+(?:(?:also|very|severely|mildly)\s+)*"
    r"(?:allergic|vegetarian|vegan|pescatarian|lactose|gluten|diabetic|coeliac|celiac|intolerant)\b",
    r"i\s+(?:work|teach|study)\s+(?:at|as|for|in)\b",
    r"i\s+live\s+in\b",
    r"i(?:'m|\s+am)\s+(?:based|located)\s+in\b",
    r"i(?:'m|\s+am)\s+from\b",
    r"(?:please\s+)?(?:remember|keep\s+in\s+mind|don't\s+forget|do\s+not\s+forget)"
    r"(?:\s+that\b|(?=\s+(?:i|i'm|my)\b))",
    r"from\s+now\s+on\b",
    r"going\s+forward\b",
    r"in\s+(?:the\s+)?future\b",
)
_DIRECTIVE = re.compile(_CLAUSE_START + "(?:" + "|".join(_DIRECTIVE_PATTERNS) + ")", re.IGNORECASE)

# A proposal, question-shaped or not. "I don't think we should…" rejects a proposal and is
# a reaction, not a new one.
_SUGGESTION = re.compile(
    r"(?<!n't think )(?<!not think )(?<!not sure )"
    r"\b(?:we\s+should|let's|i\s+suggest|i'd\s+suggest|i\s+would\s+suggest|i\s+propose|"
    r"i\s+recommend|i'd\s+recommend|how\s+about|why\s+don't\s+we|we\s+could(?!\s+not)|"
    r"maybe\s+we|shall\s+we)\b",
    re.IGNORECASE,
)
_AGREE = re.compile(
    r"\bagreed?\b|\b(?:yes|yeah|yep|sounds\s+good|sounds\s+great|good\s+idea|great\s+idea|"
    r"let's\s+do\s+(?:it|that)|works\s+for\s+me|fine\s+by\s+me|deal)\b|(?<!\w)\+1(?!\d)",
    re.IGNORECASE,
)
_DISAGREE = re.compile(
    r"\b(?:disagree|don't\s+agree|do\s+not\s+agree|i\s+don't\s+think|i\s+do\s+not\s+think|"
    r"bad\s+idea|not\s+a\s+good\s+idea|i'd\s+rather\s+not)\b|(?:^|[.!?]\s+)(?:no|nope|nah)\b",
    re.IGNORECASE,
)
# The assistant's acknowledgements and promises ("Noted: …", "I will …") echo or serve the
# user; they are not knowledge about the topic.
_ASSISTANT_SMALL_TALK = re.compile(
    r"^\W*(?:(?:noted|understood|got\s+it|sure|ok|okay|of\s+course|certainly)\b|i\b|i'(?:ll|m|ve|d)\b)",
    re.IGNORECASE,
)

# How many following messages may hold reactions to a suggestion.
REACTION_LOOKAHEAD = 4
# Episode sentences from users count this much more than the assistant's, which often
# only restate what the user said.
USER_WEIGHT = 1.5


# Both are asked about the same few messages once per suggestion that precedes them.
@lru_cache(maxsize=512)
def _proposes(text: str) -> bool:
    return bool(_SUGGESTION.search(_normalise(text)))


@lru_cache(maxsize=512)
def _reaction(text: str) -> str | None:
    """'agreed', 'disagreed' or None for a reply; the earliest cue wins ("Good idea, but…")."""
    text = _normalise(text)
    found = [(m.start(), verdict) for pattern, verdict in ((_DISAGREE, "disagreed"), (_AGREE, "agreed"))
             if (m := pattern.search(text))]
    return min(found)[1] if found else None


# --- the extractor -------------------------------------------------------------------


class RuleBasedExtractor:
    """Extracts an episode, directives, facts and suggestions from a window by rule. Deterministic."""

    name = "rules"

    async def extract(self, window: Window) -> Extraction:
        sentences = self._sentences(window)
        return Extraction(episode=self._episode(sentences), items=self._items(window, sentences))

    @staticmethod
    def _sentences(window: Window) -> list[_Sentence]:
        out = []
        for position, message in enumerate(window.messages):
            if message.role not in (Role.USER, Role.ASSISTANT):
                continue
            for index, text in enumerate(split_sentences(message.content)):
                out.append(
                    _Sentence(
                        message=message,
                        order=(position, index),
                        speaker=_speaker(message),
                        text=text,
                        norm=_normalise(text),
                        stems=tuple(content_words(text)),
                    )
                )
        return out

    # episode

    @staticmethod
    def _episode(sentences: list[_Sentence]) -> str | None:
        """SumBasic-style extractive summary within the episode word limit.

        A sentence scores the summed window frequency of its distinct content words over
        the square root of its length (user sentences weighted up). After a pick, the
        frequencies of its words are squared, so the next pick favours what is not yet
        said. Chosen sentences keep window order.
        """
        limit = WORD_LIMITS[MemoryKind.EPISODE]
        candidates, seen = [], set()
        for sentence in sentences:
            if sentence.stems and _key(sentence.text) not in seen:
                seen.add(_key(sentence.text))
                candidates.append(sentence)
        if not candidates:
            return None
        # "Perfect." or "Sounds good, I agree." mean nothing out of context: prefer
        # sentences with at least two content words whenever there are any.
        substantial = [s for s in candidates if len(set(s.stems)) >= 2]
        candidates = substantial or candidates
        counts = Counter(w for s in candidates for w in s.stems)
        total = sum(counts.values())
        weight = {w: c / total for w, c in counts.items()}

        def score(s: _Sentence) -> float:
            # Total weight of what the sentence says, damped by its length: long sentences
            # say more but spend more of the word budget.
            value = sum(weight[w] for w in set(s.stems)) / math.sqrt(_word_count(s.text))
            return value * (USER_WEIGHT if s.is_user else 1.0)

        def cost(s: _Sentence) -> int:  # an upper bound: the prefix is dropped between same-speaker sentences
            return _word_count(s.text) + _word_count(s.speaker + ":")

        def rank(s: _Sentence) -> tuple[float, tuple[int, int]]:
            # Ties go to the earlier sentence, so the same window always gives the same text.
            return -score(s), s.order

        chosen: list[_Sentence] = []
        used = 0
        remaining = [s for s in candidates if cost(s) <= limit]
        while remaining:
            best = min(remaining, key=rank)
            chosen.append(best)
            used += cost(best)
            for w in set(best.stems):
                weight[w] **= 2
            remaining = [s for s in remaining if s is not best and cost(s) <= limit - used]
        if not chosen:  # every sentence is longer than the limit: keep the best one, cut
            chosen = [min(candidates, key=rank)]
        return limit_words(_render(sorted(chosen, key=lambda s: s.order)), limit)

    # directives, facts, suggestions

    @staticmethod
    def _items(window: Window, sentences: list[_Sentence]) -> list[ExtractedItem]:
        shards = [s for s in window.shards if s.active]
        topics = {s.shard_id: _shard_words(s) for s in shards}
        items: list[ExtractedItem] = []
        directive_index: dict[tuple[str, str], int] = {}
        seen_on_shard: set[tuple[str, str]] = set()

        for sentence in sentences:
            suggestion = bool(_SUGGESTION.search(sentence.norm))
            directive = (
                sentence.is_user
                and bool(sentence.message.user_id)
                and not sentence.is_question
                and bool(_DIRECTIVE.search(sentence.norm))
            )
            if directive:
                said = (sentence.message.user_id, _key(sentence.text))
                if said in directive_index:  # said twice: one directive, both messages as its source
                    i = directive_index[said]
                    items[i] = _with_source(items[i], sentence.message.message_id)
                else:
                    directive_index[said] = len(items)
                    items.append(
                        ExtractedItem(
                            kind=MemoryKind.DIRECTIVE,
                            content=limit_words(sentence.text, WORD_LIMITS[MemoryKind.DIRECTIVE]),
                            message_ids=(sentence.message.message_id,),
                            user_id=sentence.message.user_id,
                        )
                    )

            # A user's rules and personal context belong in the user's namespace only: a
            # shard is shared by everyone who talks to the agent.
            fact = not (suggestion or directive or sentence.is_question) and (
                sentence.is_user or not _ASSISTANT_SMALL_TALK.match(sentence.norm)
            )
            if not (suggestion or fact):
                continue
            stems = set(sentence.stems)
            key = _key(sentence.text)
            matching = [
                shard.shard_id
                for shard in shards
                if stems & topics[shard.shard_id] and (shard.shard_id, key) not in seen_on_shard
            ]
            if not matching:
                continue
            if suggestion:
                kind = MemoryKind.SUGGESTION
                content, message_ids = _suggestion(window, sentence)
            else:
                kind = MemoryKind.FACT
                content = limit_words(f"{sentence.speaker}: {_lower_first(sentence.text)}", WORD_LIMITS[kind])
                message_ids = (sentence.message.message_id,)
            for shard_id in matching:
                seen_on_shard.add((shard_id, key))
                items.append(
                    ExtractedItem(
                        kind=kind,
                        content=content,
                        message_ids=message_ids,
                        user_id=sentence.message.user_id if sentence.is_user else None,
                        shard_id=shard_id,
                    )
                )
        return items


def _suggestion(window: Window, sentence: _Sentence) -> tuple[str, tuple[str, ...]]:
    """'bob suggests: <the sentence> (agreed: …; disagreed: …)' and its source message ids."""
    agreed, disagreed, reaction_ids = _reactions(window, sentence)
    notes = []
    if agreed:
        notes.append("agreed: " + ", ".join(agreed))
    if disagreed:
        notes.append("disagreed: " + ", ".join(disagreed))
    note = f" ({'; '.join(notes)})" if notes else ""
    head = f"{sentence.speaker} suggests:"
    limit = WORD_LIMITS[MemoryKind.SUGGESTION]
    # Cut the rationale, not the verdicts: who agreed is what makes a suggestion useful.
    room = max(limit - _word_count(head) - _word_count(note), 8)
    body = limit_words(_lower_first(sentence.text.rstrip(".! ")), room)
    return limit_words(f"{head} {body}{note}", limit), (sentence.message.message_id, *reaction_ids)


def _render(chosen: list[_Sentence]) -> str:
    """'alice: A. B. assistant: C.' — one prefix per run of sentences by the same speaker."""
    parts, last = [], None
    for sentence in chosen:
        parts.append(sentence.text if sentence.speaker == last else f"{sentence.speaker}: {sentence.text}")
        last = sentence.speaker
    return " ".join(parts)


def _shard_words(shard: Shard) -> set[str]:
    return set(content_words(f"{shard.name} {shard.extraction_focus}"))


def _with_source(item: ExtractedItem, message_id: str) -> ExtractedItem:
    if message_id in item.message_ids:
        return item
    return ExtractedItem(item.kind, item.content, (*item.message_ids, message_id), item.user_id, item.shard_id)


def _reactions(window: Window, sentence: _Sentence) -> tuple[list[str], list[str], list[str]]:
    """Who agreed and who disagreed with a suggestion, and the ids of their replies.

    Only other users count (the assistant's assent is not a vote), each once, with their
    first reply. The scan stops after a message that makes a new proposal, because later
    replies answer that one.
    """
    agreed: list[str] = []
    disagreed: list[str] = []
    ids: list[str] = []
    voted = {sentence.speaker}
    start = sentence.order[0] + 1
    for message in window.messages[start : start + REACTION_LOOKAHEAD]:
        if message.role == Role.USER and _speaker(message) not in voted:
            verdict = _reaction(message.content)
            if verdict:
                voted.add(_speaker(message))
                (agreed if verdict == "agreed" else disagreed).append(_speaker(message))
                ids.append(message.message_id)
        if _proposes(message.content):
            break
    return agreed, disagreed, ids
