"""Phrasing what a conversation said as facts that stand on their own.

A memory is read later, out of its conversation, by a model that never saw the turn it
came from. So a fact or suggestion must say who or what it is about and must not lean on
another turn (issue 17, docs/extraction.md "Formation that keeps meaning"):

- **no speaker prefix, a subject**: "alice: I play the clarinet!" is a line of dialogue;
  "alice plays the clarinet." is a fact about alice. A user's first person becomes the
  user (their id names them everywhere else: the graph's person entity, provenance); in
  the assistant's words "you"/"your" is the user it answers, and its "I" is the assistant.
- **nothing that refers back**: a sentence whose subject is a pronoun or demonstrative
  ("They were an important part of my wedding decor", "That hotel fits the budget",
  "It closes at 6pm") means something only with the turn before it. Rules cannot resolve
  it reliably, so it is not stored (the episode and the message itself still hold it).
- **a proposal as a fact**: "bob suggested that the group take the night train (alice
  agreed)", not "bob suggests: we should…".

Standard library only; the rewrites are grammatical (pronouns, the verb after them), not
about particular sentences.
"""

from __future__ import annotations

import re

__all__ = ["addresses_listener", "is_pleasantry", "proposal_as_fact", "refers_back", "strip_filler", "third_person"]

_FILLER = re.compile(
    r"^(?:(?:and|but|so|also|then|plus|btw|oh|well|actually|ok|okay|hi|hey|hello|honestly|anyway|"
    r"yes|yeah|yep|sure|alright|wow|haha|lol|omg|aww|ah|um|hmm|no|nah|true|right)\b[,!.]?\s*)*",
    re.IGNORECASE,
)


def _normalise(text: str) -> str:
    return " ".join(text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"').split())


def strip_filler(text: str) -> str:
    """``text`` without the chat fillers opening it ("Oh, yeah, the museum…" -> "the museum…")."""
    text = _normalise(text)
    return text[_FILLER.match(text).end():]  # type: ignore[union-attr]  # matches the empty string too


# --- what refers back ------------------------------------------------------------------

# A subject that names nothing by itself: its meaning is in another turn. "there" only as
# a place ("there is…" states existence). A demonstrative refers back with or without a
# noun after it ("That hotel…", "Those were…").
_REFERS_BACK = re.compile(
    r"^(?:it|it's|its|they|they're|they've|they'd|they'll|them|he|he's|she|she's|him|"
    r"this|that|that's|these|those|same|both|neither|either|"
    r"there(?!\s+(?:is|are|was|were|'s|will|has|have|had|used)\b))\b",
    re.IGNORECASE,
)
# An answer cut short: "Me too!", "I do.", "Yeah, I love to." — its verb's object is in the
# question it answers (a short sentence only: "We should book lunch there too" is whole).
_ELLIPSIS = re.compile(r"(?:\b(?:to|too|do|does|did|so|either|neither|not)|\bme\s+too)\W*$", re.IGNORECASE)


# Formulas of greeting, thanks, farewell, wishes and acknowledgement: whatever follows them
# in the same sentence is small talk too ("Thanks, that means a lot!", "Have a lovely trip!").
_PLEASANTRY = re.compile(
    r"^(?:thanks|thank\s+you|thx|ty|cheers|you're\s+welcome|you\s+are\s+welcome|welcome|no\s+problem|no\s+worries|"
    r"my\s+pleasure|anytime|of\s+course|sounds\s+(?:good|great|fun|lovely|amazing)|that\s+sounds|good\s+(?:morning|night|"
    r"evening|afternoon|luck|to\s+hear|to\s+know)|have\s+(?:a|an|fun)|enjoy|take\s+care|bye|goodbye|see\s+you|"
    r"talk\s+(?:soon|later)|congrat\w*|happy\s+to\s+help|glad|i'm\s+glad|so\s+glad|nice\s+to|great\s+to|"
    r"good\s+to|me\s+too|same\s+here|hi|hello|hey|how\s+are\s+you|wow|aww|haha|lol|omg)\b",
    re.IGNORECASE,
)


def is_pleasantry(text: str) -> bool:
    """Whether a sentence is a formula of greeting, thanks, farewell, wish or acknowledgement."""
    return bool(_PLEASANTRY.match(_normalise(text)) or _PLEASANTRY.match(strip_filler(text)))


def refers_back(text: str) -> bool:
    """Whether the sentence's subject is a pronoun or demonstrative, or it ends cut short."""
    body = strip_filler(text)
    return bool(_REFERS_BACK.match(body) or (len(body.split()) <= 4 and _ELLIPSIS.search(body)))


_YOU = re.compile(r"\b(?:you|your|yours|yourself|you're|you've|you'd|you'll|ya|u)\b", re.IGNORECASE)


def addresses_listener(text: str) -> bool:
    return bool(_YOU.search(_normalise(text)))


# --- the third person ------------------------------------------------------------------

# After a subject, the verb: modals and past forms stay as they are, present forms take -s.
_KEEP = frozenset(
    "can could will would should must might may shall can't couldn't won't wouldn't shouldn't mustn't "
    "was wasn't did didn't had hadn't used never always also really just still usually often only "
    "sometimes even already recently finally actually".split()
)
_ADVERBS = frozenset(
    "really also just still usually often only sometimes always never even already recently finally "
    "actually mostly generally absolutely totally truly definitely".split()
)
_IRREGULAR = {"am": "is", "are": "is", "have": "has", "do": "does", "go": "goes", "don't": "doesn't",
              "'m": "is", "'ve": "has", "aren't": "isn't", "haven't": "hasn't", "were": "was", "weren't": "wasn't"}
_PAST = frozenset(
    "went got made took came saw knew thought told said found gave left felt kept began brought bought "
    "taught caught ran met paid sent spent built became wrote read heard held lost won sat stood slept "
    "grew drew flew drove rode ate drank swam sang fell forgot".split()
)


def _third_singular(verb: str) -> str:
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low in _KEEP or low in _PAST or low.endswith("ed") or not low.isalpha():
        return verb
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def third_person(text: str, name: str, *, assistant: bool = False) -> str | None:
    """A statement about ``name`` in the third person; None if it cannot be said so.

    ``assistant=False``: the user ``name`` said it, so I/me/my/we/our are ``name`` (a "we"
    is ``name`` and others) and the verb after "I" takes the third person. A clause
    addressed to the listener ("…, just so you know") is dropped; a "you" left in what
    remains cannot be resolved, so None. ``assistant=True``: the assistant said it to
    ``name``, so you/your are ``name``; a sentence where it speaks of itself is None.
    Everything but the pronouns and that verb is kept as written.
    """
    body = strip_filler(text).rstrip()
    if not assistant:
        body = " ".join(c for c in re.split(r"(?<=[,;])\s+", body) if not _YOU.search(c)).rstrip(",; ")
        if not body or _YOU.search(body):
            return None
    elif re.search(r"\b(?:i|i'm|i've|i'll|i'd|me|my|mine|myself)\b", body, re.IGNORECASE):
        return None
    if not body:
        return None
    subject = ({"you": "", "you're": " is", "you've": " has", "you'd": " would", "you'll": " will"} if assistant else
               {"i": "", "i'm": " is", "im": " is", "i've": " has", "i'd": " would", "i'll": " will",
                "we": " and others", "we're": " and others are", "we've": " and others have",
                "we'd": " and others would", "we'll": " and others will"})
    possessive = {"your", "yours", "yourself"} if assistant else {"my", "mine", "myself", "our", "ours", "ourselves", "me", "us"}
    state = {"named": False, "conjugate": False}

    def swap(m: re.Match[str]) -> str:
        word = m.group(0)
        low = word.lower()
        if low in subject:
            state["conjugate"] = subject[low] == ""  and low != "we"
            state["named"] = True
            return name + subject[low]
        if state["conjugate"]:
            if low in _ADVERBS:
                return word
            state["conjugate"] = False
            return _third_singular(word)
        if low in possessive:
            named = state["named"]
            state["named"] = True
            if low in ("mine", "yours", "ours"):
                return "theirs" if named else f"{name}'s"
            if low.endswith(("self", "selves")):
                return "themself"
            if low in ("me", "us"):
                return "them" if named else name
            return "their" if named else f"{name}'s"
        return word

    sentence = _WORD.sub(swap, body)
    if not state["named"]:
        return None
    sentence = re.sub(r"!+$", ".", sentence)
    if not sentence.endswith((".", "?", "…")):
        sentence += "."
    return sentence[0].upper() + sentence[1:] if sentence[0].islower() and not sentence.startswith(name) else sentence


# --- proposals ---------------------------------------------------------------------------

_OPENING = re.compile(
    r"\b(?P<open>(?:i|we)(?:\s+would|'d)?\s+(?:suggest|propose)(?:\s+that)?(?:\s+we)?|"
    r"(?:i|we)(?:\s+would|'d)?\s+recommend|"
    r"why\s+don't\s+we|shall\s+we|let's|let\s+us|how\s+about(?:\s+we)?|"
    r"(?:maybe|perhaps)\s+we(?:\s+(?:should|could|might|can))?|we\s+(?:should|could|might|ought\s+to))\b\s*",
    re.IGNORECASE,
)
_EMPTY = frozenset("do it that this them so go be get the a an some one there here".split())
_GROUP = [(re.compile(r"\bwe\b", re.IGNORECASE), "the group"), (re.compile(r"\bus\b"), "the group"),
          (re.compile(r"\bour\b", re.IGNORECASE), "the group's")]


def proposal_as_fact(text: str, speaker: str) -> str | None:
    """'bob suggested that the group take the night train' for bob's "We should take the night
    train."; None when the sentence holds no proposal, or only one with nothing proposed."""
    body = strip_filler(text)
    m = _OPENING.search(body)
    if not m:
        return None
    opening = " ".join(m.group("open").lower().split())
    rest = body[m.end():].strip().rstrip("?!.… ").strip()
    said = [w for w in re.findall(r"[a-z']+", rest.lower()) if w not in _EMPTY]
    if len(said) < 2 or refers_back(rest):
        return None  # "Let's do it!", "How about that?": an answer, not a proposal
    for pattern, replacement in _GROUP:
        rest = pattern.sub(replacement, rest)
    who = "The assistant" if speaker.lower() == "assistant" else speaker
    if opening.endswith("recommend"):
        return f"{who} recommended {rest}"
    if not opening.endswith("we") and (opening.startswith("how about") or opening.endswith(("suggest", "propose", "that"))):
        return f"{who} suggested {rest}"
    modal = re.search(r"\b(should|could|might|can|ought to)$", opening)
    verb = f"{modal.group(1)} " if modal else ("should " if opening in ("let's", "let us", "why don't we", "shall we")
                                                else "")
    return f"{who} suggested that the group {verb}{rest}"
