"""Small talk: a message with nothing in it to search for.

Without a query, the memory block searches on the session's latest user message. When that
message is "That's the spirit! Bye!", the search finds what matches it best: the other
goodbyes of the user's history, shown as relevant memories in the place of what the model
needs. So the block does not search on small talk (memory_service/recall/assembler.py).

The rule is lexical and English, by principle rather than by list of messages: a message is
small talk when nothing content-bearing remains once these are taken out:

- the formulas of greeting, farewell, thanks, wishes, encouragement and acknowledgement
  ("see you tomorrow", "have a great weekend", "that's the spirit", "makes sense"), each
  with the name it addresses ("Bye Jon!", "Good night, Gina!");
- the words of phatic talk: greetings, thanks, assent, reactions, laughter, intensifiers,
  the conversation's own verbs ("hi", "thanks", "yep", "wow", "lol", "really", "chatting")
  and the light verbs that name no topic by themselves ("let me know", "keep going");
- the words search never looks for (``QUERY_STOPWORDS``, one-letter words), the pieces of
  contractions ("you're" -> "re") and the pronouns ("yourself").

Anything else is content: a name ("Lisbon?"), a number ("2pm"), a noun or a verb of a request
("thanks, can you also book Lisbon?", "Bye! Remember my flight is at 6am"). The rule errs
towards content: a message taken for small talk loses its search, one taken for content only
searches as before. tests/data/small_talk_labelled.jsonl measures it (tests/test_small_talk.py).
"""

from __future__ import annotations

import re

from memory_service.domain.bm25 import query_words
from memory_service.domain.text import stem

__all__ = ["content_words", "is_small_talk"]

# Formulas whose words would count as content taken one by one ("tomorrow", "spirit", "work").
_FORMULAS = (
    r"(?:see|catch|talk\s+to|speak\s+to|chat\s+with)\s+(?:you|ya|u)(?:\s+(?:all|guys))?"
    r"(?:\s+(?:later|soon|tomorrow|tonight|around|again|then|next\s+time|next\s+week|in\s+a\s+bit|"
    r"on\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)))?",
    r"talk\s+(?:soon|later|tomorrow)", r"take\s+care", r"(?:bye|goodbye)\s+for\s+now", r"for\s+now",
    r"(?:have|enjoy)\s+(?:a|an|the)?\s*(?:(?:very|really|so)\s+)?(?:nice|good|great|lovely|wonderful|fantastic|"
    r"fun|safe|relaxing|awesome|amazing|happy|blessed)?\s*(?:day|night|evening|morning|afternoon|weekend|week|one|"
    r"time|rest\s+of\s+(?:your|the)\s+(?:day|week|evening))",
    r"good\s+(?:morning|night|evening|afternoon|day|luck)", r"^(?:morning|night(?:\s+night)?|evening)\b",
    r"(?:that's|that\s+is|thats)\s+the\s+spirit", r"you\s+(?:got|can\s+do)\s+this", r"keep\s+(?:it\s+)?up"
    r"(?:\s+the\s+(?:good|great|amazing)\s+work)?", r"well\s+done", r"fingers\s+crossed",
    r"(?:it\s+)?makes\s+sense", r"fair\s+enough", r"will\s+do", r"sure\s+thing", r"no\s+(?:problem|worries)",
    r"my\s+pleasure", r"same\s+here", r"me\s+too", r"you\s+too", r"of\s+course",
    r"thanks\s+for\s+(?:asking|everything|the\s+chat|chatting|listening)", r"how\s+about\s+you",
    r"how\s+(?:are|r)\s+(?:you|u|things)(?:\s+doing)?(?:\s+today)?", r"what's\s+up", r"nice\s+to\s+(?:meet|see|hear)",
    r"(?:i\s+)?should\s+get\s+going", r"gotta\s+go", r"means\s+a\s+lot",
    r"that's\s+all(?:\s+for\s+(?:now|today))?", r"stay\s+(?:safe|in\s+touch|tuned)", r"take\s+it\s+easy",
    r"catching\s+up", r"owe\s+you\s+one",
    r"(?:your|the)\s+(?:support|help|kindness|encouragement|kind\s+words)\s+means?",
    r"thanks\s+for\s+(?:the|your|all\s+(?:the|your))?\s*(?:support|help|kind\s+words|encouragement|offer)",
)
# The words that address someone, after (or before) which a name is a vocative, not content.
_ADDRESS = (r"hi|hello|hey|hiya|howdy|bye|goodbye|thanks|thank\s+you|cheers|congrats|congratulations|"
            r"good\s+(?:morning|night|evening|afternoon|luck)|see\s+(?:you|ya)|take\s+care|night|morning|"
            r"welcome(?:\s+back)?|love\s+you|miss\s+you|awesome|amazing|great|nice")
_NAME = r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)?"
_MARK = "§"  # where a formula was: a name right after it is addressed too ("Have a lovely day, Gina!")
_ADDRESSING = r"(?:(?i:\b(?:" + _ADDRESS + r")\b)|" + _MARK + ")"
_FORMULA = re.compile(r"\b(?:" + "|".join(_FORMULAS) + r")\b", re.IGNORECASE)
_VOCATIVE_AFTER = re.compile(_ADDRESSING + r"(?:\s*,)?\s+" + _NAME + r"(?=\s*(?:[!.,?…:;)\]]|$))")
_VOCATIVE_BEFORE = re.compile(r"(?:^|(?<=[.!?]\s))" + _NAME + r"\s*,\s*(?=" + _ADDRESSING + ")")

# Phatic words, compared by their stems (so "thanks", "thanked", "chatting" meet theirs).
_PHATIC = frozenset(stem(w) for w in """
    hi hello hey hiya howdy yo heya greetings welcome bye goodbye byebye cya ciao farewell later
    thanks thank thx ty tysm cheers appreciate appreciated grateful please pls sorry pardon
    ok okay okey k kk alright yes yeah yep yup yea ya aye no nope nah sure right true indeed exactly
    absolutely definitely totally certainly course agreed fine
    cool nice great good awesome amazing wonderful fantastic lovely perfect excellent brilliant sweet neat
    super fun funny hilarious cute beautiful incredible impressive glad happy proud lucky
    wow whoa oh ooh ah aah aw aww yay hooray woohoo phew huh hmm hm um uh er oops meh
    ha haha hahaha hehe lol lmao rofl omg
    congrats congratulations bravo luck hope wish love miss care
    really so much lot lots bit little well quite pretty truly kinda sorta
    think guess suppose mean know see hear sound sounds seem seems feel agree bet wait
    say tell chat chatting talk talking speak catch going go gonna wanna gotta get
    helpful help kind
    let lets need like keep make take give want come stay try
    again anyway anyways meantime
    there guys everyone mate buddy dude friend pal man bro sis dear hon babe
    """.split())
# The pieces a contraction leaves ("you're" -> "you", "re"; the stopwords hold the words before
# them), and the pronouns the stopwords leave out.
_CONTRACTIONS = frozenset("re ve ll nt don didn doesn isn wasn aren weren won wouldn couldn shouldn haven hasn hadn "
                          "ain im ive id youre thats whats us myself yourself ourselves yourselves himself herself "
                          "themselves itself".split())


def content_words(text: str) -> list[str]:
    """The words of ``text`` that carry content: what search would look for, less the formulas
    and words of small talk and the names they address."""
    text = _FORMULA.sub(f" {_MARK} ", text.replace("’", "'").replace("‘", "'"))
    text = _VOCATIVE_AFTER.sub(f" {_MARK} ", _VOCATIVE_BEFORE.sub(" ", text))
    return [w for w in query_words(text) if w not in _CONTRACTIONS and stem(w) not in _PHATIC]


def is_small_talk(text: str) -> bool:
    """Whether ``text`` has nothing to search for: only greetings, thanks, farewells, assent,
    reactions and the like (also an empty message, or one of emoji alone)."""
    return not content_words(text)
