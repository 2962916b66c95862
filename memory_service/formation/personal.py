"""Personal statements: what is about a person stays in that person's namespace.

A shard is shared by every user of an agent, so a shard may hold only topic knowledge
("the restaurant is in Chiado", "the museum closes at 6pm"). Anything a user says about
themself (identity numbers, health, whereabouts, contacts, family, finances, what they
did or own) is routed to the speaker's namespace instead (``user:<agent>:<user>``), where
only that user's blocks and searches read it.

Both extractors ask ``is_personal`` of what they would store in a shard, and formation
asks ``personal_item`` again of every shard item whatever extractor made it (an LLM may
ignore its instructions, or restate "my passport" as "Bob's passport"). The rule reads
grammar and categories of personal data, not particular sentences:

1. **Framing words are set aside first**: a hedge or a report that only frames a claim
   ("I think…", "I heard that…", "I was told…", "a friend told me…", "as far as I know,")
   and a proposal's opening ("I suggest we…", "we should…", "let's…"). What they frame is
   judged: "I think the museum closes at 6" is about the museum, "I think my flight is at
   9" is about the speaker. A report verb that can take an object ("I heard", "I read",
   "I saw") frames a claim only when a clause follows (a "that", or a verb of its own):
   "I saw the museum is closed" frames one, "I saw the Mona Lisa" is an experience.
2. **Personal** when what is left
   - speaks in the **first person** (I, me, my, mine; we, us, our): the speaker or their
     household is the subject, so it is about them (a proposal's own "we" excepted);
   - **names a user** of the conversation ("Bob's passport…", "carol is allergic…");
   - in the assistant's words, addresses the user: **your** ("your flight lands at
     10:05") or *you* with a state ("since you're allergic…"); a *you* with a modal is
     generic advice ("you can buy tickets online") and stays topic knowledge;
   - holds an **identity number or secret** (passport, ID, licence, card or account
     number, IBAN, PIN, social security, booking or locker code): no topic fact needs one;
   - puts **a person** (he, she, his, her; a relative: wife, son, mother…) together with a
     **category of personal data** (health, contact, home, money, birth, documents);
   - holds a person's **e-mail address** (not a role's: info@, bookings@…);
   - **elides its subject** with a predicate only a person takes ("Allergic to shellfish,
     by the way.", "Born in 1988, in Coimbra.").
3. Everything else is topic knowledge, including places' phone numbers and addresses
   ("the museum's phone number is…") and public roles ("the director is Ana Costa").

The cost is asymmetric: a topic sentence judged personal is still kept, for its speaker
only; a personal one judged topic reaches every user. So the rule leans to personal (a
team's "our deadline is May 1st" stays with its speaker). docs/extraction.md gives the
labelled set and the measured figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["identifiers", "is_personal", "personal_item", "split_speaker"]


def _normalise(text: str) -> str:
    return " ".join(text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"').split())


# --- 1. framing words ------------------------------------------------------------------

_FILLERS = r"(?:(?:and|but|so|also|oh|well|actually|ok|okay|btw|fyi|yes|yeah|hmm|honestly|anyway|though)[,!]?\s+)*"
_ADVERBS = r"(?:(?:really|honestly|also|actually|still|just|do|kind\s+of|sort\s+of|somehow)\s+)*"
_HEDGE_BARE = r"(?:'m|\s+am)\s+(?:(?:pretty|fairly|quite|almost|not|reasonably|100%)\s+)?(?:sure|certain|positive|convinced)"
# Verbs that only ever take a clause: what follows them is the claim.
_CLAUSE_VERBS = re.compile(
    r"^" + _FILLERS + r"(?:i|we)\s+" + _ADVERBS
    + r"(?:think|thought|believe|believed|guess|reckon|suppose|bet|doubt|assume|suspect|gather|agree|disagree|"
      r"don't\s+think|do\s+not\s+think|understand|would\s+say|can\s+confirm|"
      r"(?:was|were|'ve\s+been|have\s+been|'m|am|are|'re)\s+told)\b|"
    + r"^" + _FILLERS + r"(?:i|we)'d\s+say\b|"
    + r"^" + _FILLERS + r"(?:i|we)" + _HEDGE_BARE + r"\b|"
    + r"^" + _FILLERS + r"(?:in\s+my\s+(?:experience|opinion|view)|as\s+far\s+as\s+(?:i|we)\s+(?:know|can\s+tell)|"
      r"if\s+i\s+(?:remember|recall)\s+(?:correctly|right)|to\s+my\s+knowledge|apparently|afaik|iirc|imo|imho|"
      r"from\s+what\s+(?:i|we)(?:'ve|\s+have)?\s+(?:read|heard|seen))\b",
    re.IGNORECASE,
)
# Verbs that also take an object ("I heard a concert"): a claim only if a clause follows.
_OBJECT_VERBS = re.compile(
    r"^" + _FILLERS
    + r"(?:(?:i|we)\s+" + _ADVERBS
    + r"(?:heard|hear|read|saw|see|know|knew|noticed|notice|found\s+out|learned|learnt|remember|recall|"
      r"realised|realized|(?:'ve|have)\s+(?:heard|read|seen|noticed|learned|learnt))"
      r"|(?:you|someone|somebody|people|they|everyone|a\s+[\w-]+|the\s+[\w-]+|my\s+[\w-]+|our\s+[\w-]+)\s+"
      r"(?:told|tell|tells|said|says|mentioned)(?:\s+(?:me|us))?)\b",
    re.IGNORECASE,
)
# A finite verb: what makes the words after a report verb a claim of their own.
_FINITE = re.compile(
    r"\b(?:is|are|was|were|isn't|aren't|wasn't|weren't|has|have|had|hasn't|haven't|will|won't|would|can|"
    r"can't|cannot|could|should|must|may|might|does|do|doesn't|don't|did|didn't|closes|opens|costs|serves|"
    r"runs|leaves|departs|arrives|takes|accepts|offers|charges|includes|needs|requires|sells|gets)\b|'s\b|'re\b",
    re.IGNORECASE,
)
# A proposal's opening: its "we" is the group's plan, not a statement about the speaker.
_PROPOSAL = re.compile(
    r"^" + _FILLERS
    + r"(?:(?:i|we)(?:\s+would|'d)?\s+(?:suggest|recommend|propose)(?:\s+that)?(?:\s+we)?|"
      r"(?:maybe|perhaps)\s+we(?:\s+(?:should|could|might|can))?|we\s+(?:should|could|might|can|ought\s+to|must)|"
      r"let's|let\s+us|"
      r"how\s+about(?:\s+we)?|why\s+don't\s+we|shall\s+we)\b",
    re.IGNORECASE,
)


def _strip_frames(text: str) -> str:
    """``text`` without the hedges, reports and proposal openings that frame its claim."""
    for _ in range(3):  # "I think I heard that…": frames nest, a little
        if m := _CLAUSE_VERBS.match(text) or _PROPOSAL.match(text):
            rest = text[m.end():]
        elif (m := _OBJECT_VERBS.match(text)) and (
            re.match(r"\s*,?\s*that\b", text[m.end():], re.IGNORECASE) or _FINITE.search(text, m.end())
        ):
            rest = text[m.end():]
        else:
            return text
        text = re.sub(r"^\s*,?\s*(?:that\s+)?", "", rest, flags=re.IGNORECASE)
    return text


# --- 2. what makes a statement personal ------------------------------------------------

_FIRST_PERSON = re.compile(
    r"\b(?:i|me|my|mine|myself|i'm|im|i've|i'd|i'll|we|(?-i:us)|our|ours|ourselves|we're|we've|we'd|we'll)\b",
    re.IGNORECASE,
)
_YOUR = re.compile(r"\b(?:your|yours|yourself|yourselves)\b", re.IGNORECASE)
# "you" with a state or an experience: about the user. With a modal it is generic advice.
_YOU_STATE = re.compile(
    r"\byou(?:'re|'ve|\s+are|\s+were|\s+have|\s+had|\s+live|\s+work|\s+own|\s+take|\s+use|\s+went|"
    r"\s+booked|\s+bought|\s+paid|\s+told|\s+said|\s+mentioned)\b",
    re.IGNORECASE,
)
_IDENTIFIER = re.compile(
    r"\b(?:(?:passport|id|identity|licen[cs]e|licen[cs]e|card|account|membership|member|loyalty|"
    r"frequent\s+flyer|booking|reservation|confirmation|locker|door|alarm|tax|social\s+security|"
    r"national\s+insurance|insurance|policy|patient|customer)\s+(?:number|no\.?|num|code|reference|ref|id|#)|"
    r"iban|ssn|pin(?:\s+code)?\s+is|sort\s+code|date\s+of\s+birth|social\s+security|national\s+insurance\s+number)\b",
    re.IGNORECASE,
)
_PERSON = re.compile(
    r"\b(?:he|she|him|her|his|hers|himself|herself|he's|she's|wife|husband|partner|spouse|son|sons|"
    r"daughter|daughters|kids?|children|child|baby|mother|mom|mum|father|dad|parents?|brother|sister|"
    r"siblings?|grandma|grandmother|grandpa|grandfather|grandparents|aunt|uncle|cousin|niece|nephew|"
    r"boyfriend|girlfriend|fianc[eé]e?|in-laws|twins)\b",
    re.IGNORECASE,
)
_PERSONAL_DATA = re.compile(
    r"\b(?:allerg\w*|asthma\w*|diabet\w*|insulin|pregnan\w*|cancer|stroke|surgery|operation|diagnos\w*|"
    r"medication|medicine|prescri\w*|antibiotics|ill|illness|sick|disease|depress\w*|anxiety|therap\w*|"
    r"blood|injur\w*|disabilit\w*|disabled|wheelchair|epilep\w*|migraines?|hospital|doctor|gp|dentist|"
    r"phone|mobile|email|e-mail|address|lives|live|living|home|flat|apartment|postcode|zip|"
    r"salary|income|earns?|debt|loan|mortgage|owes?|rent|bank|account|savings|paid|pays|"
    r"born|birthday|age|aged|years\s+old|passport|visa|licen[cs]e|expired|expires|married|divorced)\b",
    re.IGNORECASE,
)
# An e-mail address is a person's unless it names a role (info@, bookings@…): personal
# data by the usual reading of data-protection law.
_EMAIL = re.compile(r"\b([\w.+-]+)@[\w-]+(?:\.[\w-]+)+\b")
_ROLE_MAILBOX = frozenset(
    "info contact contacts hello hi office admin support help sales press media reception bookings booking "
    "reservations reservas reserve events tickets geral mail enquiries inquiries noreply no-reply team hr jobs "
    "careers billing accounts finance service customerservice webmaster marketing".split()
)
_ELIDED_SUBJECT = re.compile(
    r"^" + _FILLERS + r"(?:allergic|intolerant|diabetic|asthmatic|pregnant|born|married|divorced|engaged|"
    r"based\s+in|off\s+to|back\s+from)\b",
    re.IGNORECASE,
)


def is_personal(text: str, *, names: Iterable[str] = (), assistant: bool = False) -> bool:
    """Whether one sentence is about a person rather than a topic (the rule is the module's).

    ``names`` are the user ids of the conversation: a sentence naming one is about that
    user. ``assistant``: the assistant said it, so "your" and "you are" mean the user.
    """
    text = _strip_frames(_normalise(text))
    if not text:
        return False
    if _FIRST_PERSON.search(text) or _ELIDED_SUBJECT.match(text) or _IDENTIFIER.search(text):
        return True
    if assistant and (_YOUR.search(text) or _YOU_STATE.search(text)):
        return True
    if _PERSON.search(text) and _PERSONAL_DATA.search(text):
        return True
    if any(m.group(1).lower() not in _ROLE_MAILBOX for m in _EMAIL.finditer(text)):
        return True
    lowered = text.lower()
    return any(re.search(r"(?<![\w-])" + re.escape(name.lower()) + r"(?![\w-])", lowered)
               for name in names if len(name) >= 2 and name.lower() not in ("user", "assistant"))


_PREFIX = re.compile(r"^\s*(?P<speaker>[^:\s][^:]{0,255}?)(?:\s+suggests)?\s*:\s+")
# A suggestion phrased as a fact names its proposer first: "bob suggested that the group…",
# "The assistant recommended…" (memory_service.formation.phrasing).
_PROPOSER = re.compile(r"^\s*(?P<speaker>the\s+assistant|[^\s:]{1,255}?)\s+(?:suggested|recommended)(?:\s+that)?\s+",
                       re.IGNORECASE)
# A suggestion's verdicts name who agreed: they say nothing about its content. Both forms:
# "(agreed: alice; disagreed: carol)" and "(alice agreed; carol disagreed)."
_VERDICTS = re.compile(r"\s*\((?:(?:agreed|disagreed):[^()]*|[^()]*\b(?:agreed|disagreed))\)\s*\.?\s*$")


def split_speaker(content: str, speakers: Iterable[str]) -> tuple[str | None, str]:
    """``("bob", "my passport…")`` for ``"bob: my passport…"``, ``"bob suggests: …"`` or ``"bob
    suggested that …"`` when bob is one of ``speakers`` (or "assistant"), a suggestion's closing
    verdicts ("(agreed: …)", "(alice agreed)") dropped;
    ``(None, content)`` otherwise. Facts and suggestions name their source this way."""
    content = _VERDICTS.sub("", content)
    known = set(speakers)
    for pattern in (_PREFIX, _PROPOSER):
        m = pattern.match(content)
        if m and (m.group("speaker") in known or m.group("speaker").lower() in ("assistant", "the assistant")):
            speaker = "assistant" if m.group("speaker").lower() == "the assistant" else m.group("speaker")
            return speaker, content[m.end():]
    return None, content


# Numbers and codes worth tracing: four characters or more with a digit in them ("BOBPASS77",
# "4421", "+351"), and e-mail addresses.
_TOKEN = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|(?=[\w+./-]*\d)[\w+./-]{4,}")


def identifiers(text: str) -> set[str]:
    """The numbers, codes and e-mail addresses in ``text``, lower-cased, edge punctuation dropped."""
    return {t.strip(".,;:/-").lower() for t in _TOKEN.findall(text) if len(t.strip(".,;:/-")) >= 4}


def personal_item(content: str, *, sources: Sequence[tuple[str, bool, str]], names: Iterable[str],
                  personal_sentences: Iterable[str] = ()) -> bool:
    """Whether an item an extractor made for a shard is about a person (formation's check).

    ``content`` is the item's text ("bob: …" or "assistant: …"); ``sources`` the sentences of
    the messages it cites, as (speaker, said by the assistant, sentence); ``names`` the
    conversation's user ids; ``personal_sentences`` every sentence of the window judged
    personal. It is personal when its own words are (see ``is_personal``), when the cited
    sentence it restates is (an LLM may turn "my passport" into "Bob's passport" or "the
    passport"), or when it carries a number, code or address a personal sentence of the
    window holds.
    """
    names = list(names)
    speaker, body = split_speaker(content, names)
    if is_personal(body, names=names, assistant=speaker is not None and speaker.lower() == "assistant"):
        return True
    restated = _restated(body, sources)
    if any(is_personal(sentence, names=names, assistant=by_assistant) for _, by_assistant, sentence in restated):
        return True
    traced = identifiers(body)
    return bool(traced) and any(traced & identifiers(sentence) for sentence in personal_sentences)


_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_GLUE = frozenset("a an the is are was were be to of in on at for and or but it its this that with by as".split())


def _restated(body: str, sources: Sequence[tuple[str, bool, str]]) -> list[tuple[str, bool, str]]:
    """The cited sentences sharing the most words with ``body`` (all of them on a tie)."""
    words = set(_WORD.findall(body.lower())) - _GLUE
    scored = [(len(words & (set(_WORD.findall(s.lower())) - _GLUE)), source) for source in sources
              for s in (source[2],)]
    best = max((n for n, _ in scored), default=0)
    return [source for n, source in scored if n == best and n > 0]
