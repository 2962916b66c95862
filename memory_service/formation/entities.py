"""Offline extraction of the knowledge graph's entities and facts from one window (issue 16).

Why rules: formation runs offline by default (no API key, no network), and a window must
cost milliseconds. No pipeline model fits the constraint that it ship inside a PyPI wheel
with no download at run time (docs/extraction.md, "Entities and facts"), so this module
reads surface cues with the standard library, and leans to precision: an entity or a fact
that is wrong is shown to the model in later prompts and links unrelated memories, while
one that is missed is only a lost link.

What it reads:

- **Names** are runs of capitalised words ("Royal Infirmary", "University of Bristol",
  "iPhone 15"). A capital at the start of a sentence proves nothing ("Great.", "Tuesday was
  rough"), so a sentence-initial word counts only when the window also names it elsewhere,
  or a cue types it. Pronouns, greetings, weekdays and months are never names.
- **Types** come from cues around the name (``my brother Tom``, ``lives in Leeds``, ``works
  at Deloitte``, ``a dog called Toby``, ``reading Dune``) and from head words ("... Hospital",
  "... Road", "... Summit"). A name no cue types is dropped.
- **Facts** are relations a cue states between the speaker (``I``/``we``/``my``), a person
  named just before the cue, or the person last named (``she``/``he``) and a typed name:
  lives_in, works_at, studies_at, born_in, visited, attended, married_to, partner_of,
  sibling_of, has_child, friend_of, has_pet, likes, is_named. Questions, negated
  sentences and conditions state no fact, nor do plans, intentions, wishes and what is
  still to come ("I'm planning a trip to Lisbon" is no visit; "we're moving to Porto next
  month" no home yet): a fact is what holds or happened. A date in the sentence ("in March 2023", "on 2 August", "last
  November") becomes the fact's ``valid_at``.
- **Namespaces**: the speakers are person entities, and whatever a user's message names or
  states goes to that user's namespace (``Namespace.user``); what the assistant says goes to
  the namespace of the user it answers. Nothing goes to a shard or the agent namespace:
  every statement here is somebody's personal context.

System and tool messages are ignored: instructions and raw data, not conversation.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from memory_service.domain.graph import EntityType, ExtractedEntity, ExtractedFact, normalise_name
from memory_service.domain.models import Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.extractor import Window, WindowMessage
from memory_service.formation.rule_extractor import STOP_WORDS, split_sentences

__all__ = ["extract_graph"]

MAX_SENTENCE_CHARS = 2000  # a pasted document is not conversation: longer sentences are skipped

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
           "october", "november", "december")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# Capitalised words that are not names: pronouns, greetings, chat words, time words.
_NOT_NAMES = frozenset(
    """i i'm i've i'd i'll im ok okay hi hello hey thanks thank yes yeah yep no nope sure please sorry
    great nice cool perfect lovely wow ha haha lol btw fyi omg congrats congratulations cheers
    today tomorrow yesterday tonight christmas easter mr mrs ms dr prof st""".split()
) | STOP_WORDS | frozenset(_MONTHS) | frozenset(_WEEKDAYS) | frozenset(m[:3] for m in _MONTHS)

_ORG_HEADS = frozenset(
    """university college school academy primary hospital infirmary clinic bank inc ltd llc plc corp
    corporation company group logistics labs institute council ministry""".split())
_PLACE_HEADS = frozenset(
    """road street avenue lane square gardens park lido glacier lake river bridge station airport beach
    mountains hill bay island islands district village county""".split())
_EVENT_HEADS = frozenset("fringe summit sessions festival marathon conference expo olympics cup fair con".split())

_CONNECTORS = frozenset("of de da del der van von la le du".split())
_TOKEN = re.compile(r"[^\W\d_][\w'’+.-]*[\w+]|[^\W\d_]|\d+")

_RELATIVES = {
    "wife": "married_to", "husband": "married_to", "spouse": "married_to",
    "girlfriend": "partner_of", "boyfriend": "partner_of", "partner": "partner_of",
    "fiance": "partner_of", "fiancee": "partner_of", "fiancé": "partner_of", "fiancée": "partner_of",
    "brother": "sibling_of", "sister": "sibling_of", "son": "has_child", "daughter": "has_child",
    "kids": "has_child", "children": "has_child", "sons": "has_child", "daughters": "has_child",
    "mum": "child_of", "mom": "child_of", "mother": "child_of", "dad": "child_of", "father": "child_of",
    "friend": "friend_of",
}
_PETS = ("dog|dogs|cat|cats|puppy|kitten|beagle|labrador|terrier|spaniel|poodle|hamster|rabbit|bunny|"
         "parrot|budgie|tortoise|turtle|horse|pony|goldfish|fish|snake|lizard|guinea\\s+pig")
_FIRST = r"(?:i|we|i'm|i've|i'd|we're|we've|i\s+am|we\s+are)"
_ADVERBS = r"(?:(?:still|also|now|just|currently|actually|both|finally|recently|already|then|originally)\s+)*"

# (cue at the end of the text before a name, what the name is, the predicate it states)
_CUES: list[tuple[re.Pattern[str], EntityType, str | None]] = [
    (re.compile(r"\b(?:my|our)\s+(?:\w+\s+)?(?:wife|husband|spouse|girlfriend|boyfriend|partner|fianc[eé]e?|brother|"
                r"sister|son|daughter|mum|mom|mother|dad|father|(?:best\s+)?friend)\s*,?\s*$"), EntityType.PERSON, "_relative"),
    (re.compile(r"\b(?:kids|children|sons|daughters)\s*,\s*$"), EntityType.PERSON, "_relative"),
    (re.compile(r"\b(?:" + _PETS + r")\s*,?\s*(?:(?:is\s+)?(?:named|called)\s+)?$"), EntityType.OBJECT, "has_pet"),
    (re.compile(r"\bmarried\s+to\s+(?:(?:a|an|the)\s+\w+\s+(?:called|named)\s+)?$"), EntityType.PERSON, "married_to"),
    (re.compile(r"\b(?:call\s+me|my\s+name\s+is|my\s+name's)\s+$"), EntityType.PERSON, "is_named"),
    (re.compile(r"\b(?:live|lives|living|lived|moved|moving|move|relocated|relocating|based|settled)\s+(?:\w+\s+)?"
                r"(?:in|to)\s+$"), EntityType.PLACE, "lives_in"),
    # Where someone makes a home, said as people say it ("home is Porto now", "we signed the
    # lease on a flat in Leeds", "renting a little place in Graz").
    (re.compile(r"\bhome(?:\s+for\s+(?:me|us))?(?:\s+is|'s)\s+(?:now\s+)?$|"
                r"\b(?:lease|mortgage)\s+(?:on|for)\s+(?:a|an|our|my|the)\s+(?:\w+\s+)?(?:place|flat|apartment|house|"
                r"home|room)\s+in\s+$|\b(?:renting|rented|rent|bought|buying)\s+(?:a|an|our|my)\s+(?:\w+\s+)?(?:place|"
                r"flat|apartment|house|home)\s+in\s+$"), EntityType.PLACE, "lives_in"),
    (re.compile(r"\bborn\s+in\s+$|\b(?:i'm|i\s+am|i\s+come)\s+from\s+$"), EntityType.PLACE, "born_in"),
    (re.compile(r"\b(?:stud(?:y|ies|ying|ied)\s+(?:\w+\s+)?at|student\s+at|(?:masters|phd|degree)\s+at)\s+(?:the\s+)?$"),
     EntityType.ORGANISATION, "studies_at"),
    (re.compile(r"\b(?:work(?:s|ing|ed)?\s+(?:at|for)|job\s+at|(?:start(?:ed|s|ing)?|began|begin)\s+(?:a\s+new\s+job\s+)?at|"
                r"joined|shift\s+at|payroll\s+at|(?:my|our)\s+(?:team|office|employer)\s+at|my\s+employer\s*,?|teach(?:es|ing)?\s+at|boss\s+at|(?:^|,\s*)still\s+at|(?:is|am|'m)\s+an?\s+[a-z]+\s+at|"
                r"(?:months?|years?|weeks?|days?)\s+at)\s+(?:the\s+)?$"), EntityType.ORGANISATION, "works_at"),
    (re.compile(r"\b(?:is|am|'m|are)\s+at\s+(?:the\s+)?$"), EntityType.ORGANISATION, "_is_at"),
    (re.compile(r"\b(?:left|quit|retired\s+from|resigned\s+from|(?:handed|handing|hand)\s+in\s+(?:my\s+)?notice\s+at|"
                r"transferred\s+(?:away\s+)?from)\s+(?:the\s+)?$"), EntityType.ORGANISATION, "left"),
    (re.compile(r"\bmoved\s+(?:away\s+from|out\s+of)\s+$"), EntityType.PLACE, "moved_out_of"),
    (re.compile(r"\btransferred\s+(?:from\s+[^,.;:]+?\s+)?to\s+(?:the\s+)?$"), EntityType.ORGANISATION, "_transferred"),
    (re.compile(r"\b(?:visited|visiting|went\s+to|been\s+to|trip\s+to|holiday\s+in|(?:i|we)\s+was\s+in)\s+(?:the\s+)?$"),
     EntityType.PLACE, "visited"),
    (re.compile(r"\b(?:going|go|went|coming|come|attend(?:ed|ing)?)\s+to\s+(?:the\s+)?$|\b(?:was|were)\s+at\s+(?:the\s+)?$"),
     EntityType.EVENT, "attended"),
    (re.compile(r"\b(?:support|supports)\s+$"), EntityType.ORGANISATION, "likes"),
    (re.compile(r"\b(?:love|loved|adore|adored|like|liked|enjoyed|recommend)\s+$"), EntityType.OBJECT, "likes"),
    (re.compile(r"\b(?:reading|read|finished|watched|watching|book\s+like|heard\s+of|tried|using|try)\s+(?:the\s+)?$"),
     EntityType.OBJECT, None),
    (re.compile(r"\b(?:my|our|his|her)\s+(?:\w+\s+)?(?:grandmother|grandfather|grandma|grandpa|granddad|nan|cousin|aunt|"
                r"uncle|niece|nephew|brother-in-law|sister-in-law|colleague|boss|neighbour|neighbor|flatmate|roommate|"
                r"landlord|landlady|doctor|teacher)\s*,?\s*$|\b(?:his|her)\s+name\s+is\s+$"), EntityType.PERSON, None),
    (re.compile(r"\b(?:my|our)\s+$"), EntityType.OBJECT, None),
    (re.compile(r"\b(?:offer|job|someone|people)\s+from\s+(?:the\s+)?$"), EntityType.ORGANISATION, None),
    (re.compile(r"\b(?:by|with|ask|told|tell)\s+$|\band\s+i\s*$"), EntityType.PERSON, None),
    (re.compile(r"\b(?:in|to|from|near|around)\s+(?:the\s+)?$"), EntityType.PLACE, None),
    (re.compile(r"\bat\s+(?:the\s+)?$"), EntityType.PLACE, None),
]
# A name followed by these is a person ("Tom works at", "Chidi cried").
_PERSON_AFTER = re.compile(
    r"^\s+" + _ADVERBS + r"(?:works|worked|lives|lived|said|says|cried|told|loves|runs|got\s+married|is\s+(?:visiting|picking|a\s+\w+\s+at)|"
    r"and\s+i\b)", re.IGNORECASE)
_NEGATED = re.compile(r"\b(?:not|never|no\s+longer|don't|doesn't|didn't|won't|can't|isn't|aren't|wasn't)\b|n't\b")
_SCHOOL_HEADS = frozenset({"university", "college", "school", "academy", "primary"})
_THERE = re.compile(r"\b(?:i|we)\s+" + _ADVERBS + r"(?:'m\s+|am\s+|are\s+|'re\s+)?(work|working|live|living)\s+there\b")
_SHE_HE = re.compile(r"\b(?:she|he)\s+" + _ADVERBS + r"$")


@dataclass(slots=True)
class _Name:
    text: str
    start: int
    end: int
    initial: bool  # the first word of its sentence


@dataclass(slots=True)
class _Mention:
    name: str
    type: EntityType | None
    owner: str
    sentence: int
    initial: bool


def extract_graph(window: Window, *, now: datetime | None = None) -> tuple[list[ExtractedEntity], list[ExtractedFact]]:
    """The entities and facts one window states, each in the namespace of the user it is about.

    ``now`` dates relative expressions when a message has no time of its own (tests).
    """
    speakers: dict[str, str] = {}  # normalised user id -> user id
    for m in window.messages:
        if m.role == Role.USER and m.user_id:
            speakers.setdefault(normalise_name(m.user_id), m.user_id)
    namespaces = {uid: str(Namespace.user(window.agent_id, uid)) for uid in speakers.values()}

    mentions: list[_Mention] = []
    facts: list[ExtractedFact] = []
    aliases: dict[str, list[str]] = {uid: [] for uid in speakers.values()}
    owner: str | None = None
    sentence_no = 0
    for message in window.messages:
        if message.role == Role.USER and message.user_id:
            owner = message.user_id
        elif message.role != Role.ASSISTANT or owner is None:
            continue  # system, tool, or an assistant that answers nobody yet
        lowercase = not any(ch.isupper() for ch in message.content)
        last_person: str | None = None
        for sentence in split_sentences(message.content):
            sentence_no += 1
            if len(sentence) > MAX_SENTENCE_CHARS:
                continue
            state = _Sentence(sentence, message, owner, speakers, sentence_no, lowercase)
            last_person = state.read(mentions, facts, aliases, last_person, namespaces[owner], now)

    return _entities(mentions, speakers, namespaces, aliases), _dedupe(facts)


class _Sentence:
    """One sentence's names, their types, and the facts its cues state."""

    def __init__(self, text: str, message: WindowMessage, owner: str, speakers: dict[str, str],
                 number: int, lowercase: bool) -> None:
        self.text = text.replace("’", "'")
        self.message = message
        self.owner = owner
        self.speakers = speakers
        self.number = number
        self.lowercase = lowercase

    def read(self, mentions: list[_Mention], facts: list[ExtractedFact], aliases: dict[str, list[str]],
             last_person: str | None, namespace: str, now: datetime | None) -> str | None:
        text = self.text
        lower = text.lower()
        question = text.rstrip("\"') ").endswith("?")
        by_user = self.message.role == Role.USER
        when = _date(lower, self.message.created_at or now)
        previous: tuple[str, str, int] | None = None  # (subject, predicate, end) of the last fact, for lists
        for name in _names(text, self.lowercase):
            speaker = self.speakers.get(normalise_name(name.text))
            prefix = lower[:name.start]
            type_, predicate = _type(prefix, name.text)
            if speaker is not None:
                mentions.append(_Mention(speaker, EntityType.PERSON, self.owner, self.number, False))
                last_person = speaker if speaker != self.owner else last_person
                continue
            if type_ is None and _PERSON_AFTER.match(text[name.end:]):
                type_ = EntityType.PERSON
            if previous is not None and re.fullmatch(r"\s*(?:,|and|,\s*and|&)\s*", lower[previous[2]:name.start]):
                listed_subject, listed, _ = previous  # "two cats, Pepper and Salt"
                facts.append(self._fact(listed_subject, listed, name.text, when, namespace))
                mentions.append(_Mention(name.text, _object_type(listed), self.owner, self.number, False))
                previous = (listed_subject, listed, name.end)
                continue
            mentions.append(_Mention(name.text, type_, self.owner, self.number, name.initial and type_ is None))
            if type_ == EntityType.PERSON:
                last_person = name.text
            # A relation is a state ("my mum Helen is visiting next week": she is the mum now);
            # the future and plans only undo events and whereabouts.
            after = "" if predicate in _STATES else lower[name.end:]
            if predicate is None or type_ is None or _no_claim(prefix, question, after, plans=predicate not in _STATES):
                continue
            subject = self._subject(prefix, predicate, last_person if type_ != EntityType.PERSON else None,
                                    mentions, by_user)
            if subject is None:
                continue
            if predicate == "is_named":
                if subject in aliases:
                    aliases[subject].append(name.text)
                mentions.pop()
            if predicate == "_is_at":
                if _head(name.text) not in _SCHOOL_HEADS:
                    continue
                predicate = "studies_at"
            if predicate == "_transferred":  # to a school, or to another employer
                predicate = "studies_at" if _head(name.text) in _SCHOOL_HEADS else "works_at"
            if predicate == "_relative":
                predicate = _relative_predicate(prefix)
            if predicate == "works_at" and _head(name.text) in {"school", "primary", "academy"} and \
                    re.search(r"\bstart", prefix[-20:]):
                predicate = "studies_at"
            partner = re.search(r"(?:^|\s)([a-zà-ÿ]+)\s+and\s+i\s+" + _ADVERBS + r"(?:am|are|'re|have|were|got|\w+ed|\w+ing)\b",
                                prefix)
            if partner and subject == self.owner and predicate in ("lives_in", "visited", "attended"):
                other = next((m.name for m in mentions if normalise_name(m.name) == partner.group(1)
                              and m.type == EntityType.PERSON), None)
                if other is not None:
                    facts.append(self._fact(other, predicate, name.text, when, namespace))
            if predicate == "child_of":
                facts.append(self._fact(name.text, "has_child", subject, when, namespace))
            else:
                facts.append(self._fact(subject, predicate, name.text, when, namespace))
            previous = (subject, predicate, name.end)
        if by_user and not question:
            self._there(lower, mentions, facts, when, namespace)
        return last_person

    def _there(self, lower: str, mentions: list[_Mention], facts: list[ExtractedFact], when: datetime | None,
               namespace: str) -> None:
        """"…the Northwind badge arrived: I work there now": "there" is the last thing this
        sentence named that is not a person (a stated fact, not a guess across sentences)."""
        said = _THERE.search(lower)
        if said is None or _NEGATED.search(lower[max(0, said.start() - 20):said.end()]):
            return
        named = [m for m in mentions if m.sentence == self.number and m.type != EntityType.PERSON
                 and lower.find(m.name.lower()) < said.start()]
        if not named:
            return
        predicate = "works_at" if said.group(1).startswith("work") else "lives_in"
        target = named[-1]
        if any(f.predicate == predicate and f.subject == self.owner and f.object == target.name for f in facts):
            return
        facts.append(self._fact(self.owner, predicate, target.name, when, namespace))

    def _subject(self, prefix: str, predicate: str, last_person: str | None, mentions: list[_Mention],
                 by_user: bool) -> str | None:
        """Who the cue is about: the speaker, a person named just before it, or she/he."""
        if predicate in ("_relative", "has_pet", "is_named"):
            if by_user and re.search(r"\b(?:my|our|we|i)\b", prefix):
                return self.owner
            if not by_user and re.search(r"\byour\b", prefix):
                return self.owner
            return None
        if predicate == "married_to" and not re.search(r"\b(?:i|we)\s+" + _ADVERBS + r"(?:'m|am|are|got|was|were)?\s*"
                                                          r"(?:just\s+)?married", prefix):
            named = _named_subject(prefix, mentions, self.number)
            return named
        # the clause that holds the cue: from the last clause break ("I live in Leeds, my sister Kate works at…")
        head = re.split(r"[,;:]|\b(?:and|but|so|then|because|while)\b", prefix)[-1].strip()
        if by_user and (re.match(_FIRST + r"\b", head) or re.search(r"(?:^|\s)" + _FIRST + r"\s+" + _ADVERBS + r"\w+", head)
                        or re.match(r"^\s*" + _ADVERBS + r"(?:moved|moving|started|joined|still|living|born|went|visited|studied|"
                                    r"worked|working|work|live|study|teach|grew|lived)\b", head)
                        or re.match(r"^\s*(?:my\s+)?(?:first|second|third|last)\s+(?:day|week|month|year)\s+at\b", head)
                        or re.search(r"\bmy\s+(?:new\s+)?(?:job|shift|boss|employer)\b", head)
                        or re.match(r"^\s*(?:(?:my|our)\s+(?:team|office)\b|(?:my\s+)?home\b)", head)):
            if not re.search(r"\b(?:she|he|they|you)\b", head):
                return self.owner
        if not by_user and re.search(r"\byou\b|\byour\b", head):
            return self.owner
        if _SHE_HE.search(prefix) or re.search(r"\b(?:she|he)\b[^,.;]*$", head):
            return last_person
        return _named_subject(prefix, mentions, self.number)

    def _fact(self, subject: str, predicate: str, obj: str, when: datetime | None, namespace: str) -> ExtractedFact:
        return ExtractedFact(subject=subject, predicate=predicate, object=obj, text=fact_text(subject, predicate, obj),
                             valid_at=when, namespace=namespace, message_ids=[self.message.message_id])


# How a fact reads: "alice lives in Lyon", not the sentence it came from ("We signed the lease
# on a place in Lyon, and…"), which may name other things (an old employer, a past city) and
# would read as current beside them. The sentence stays reachable through the fact's sources.
_PHRASES = {
    "lives_in": "lives in", "works_at": "works at", "studies_at": "studies at", "born_in": "was born in",
    "visited": "visited", "attended": "attended", "likes": "likes", "has_pet": "has a pet called",
    "married_to": "is married to", "partner_of": "is the partner of", "sibling_of": "is a sibling of",
    "has_child": "has a child called", "child_of": "is a child of", "friend_of": "is a friend of",
    "is_named": "is named", "job_title": "works as", "age": "is aged", "left": "left",
    "moved_out_of": "moved out of",
}


def fact_text(subject: str, predicate: str, obj: str) -> str:
    """The fact as a short sentence: subject, the predicate in words, object."""
    return f"{subject} {_PHRASES.get(predicate, predicate.replace('_', ' '))} {obj}"


def _named_subject(prefix: str, mentions: list[_Mention], sentence: int) -> str | None:
    """The person named right before the cue in this sentence, in the same clause ("my brother
    Tom lives in…", "Elena is a doctor at…")."""
    people = [m for m in mentions[:-1] if m.sentence == sentence and m.type == EntityType.PERSON]
    if not people:
        return None
    last = people[-1].name
    at = prefix.rfind(last.lower())
    if at < 0:
        return None
    tail = prefix[at + len(last):]
    if re.search(r"[,;:]|\b(?:and|but|so|who|that|which|i|we|you|she|he|they|my|your)\b", tail) or len(tail.split()) > 8:
        return None
    return last


_INTERROGATIVE = re.compile(
    r"^\W*(?:\w+,\s+)?(?:what|who|whom|where|when|why|how|which|do|does|did|are|is|was|were|can|could|would|will|"
    r"should|have|has|had|shall|may|might)\b")


# A plan, an intention, a wish or the future: what the clause speaks of has not happened
# ("I'm planning a trip to Lisbon" is no visit, "we're moving to Porto next month" no home yet).
_UNREALISED = re.compile(
    r"\b(?:will|shall|gonna|going\s+to\s+[a-z]+|plan(?:s|ning|ned)?|intend(?:s|ing)?|want(?:s|ed)?\s+to|wanna|"
    r"hop(?:e|es|ing)\s+to|(?:thinking|dreaming)\s+(?:of|about)|consider(?:s|ing)?|about\s+to|wish(?:es)?|"
    r"looking\s+forward|(?:'d|would)\s+(?:like|love))\b|'ll\b"
)
_LATER = re.compile(
    r"\b(?:next|upcoming|coming|this\s+coming)\s+(?:week|weekend|month|year|summer|winter|spring|autumn|fall|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b|\b(?:tomorrow|tonight|soon|someday|one\s+day|"
    r"in\s+the\s+future)\b"
)
_CLAUSE = re.compile(r"[,;:]|\b(?:and|but|so|because|while)\b")


_STATES = frozenset({"_relative", "child_of", "has_pet", "is_named"})


def _no_claim(prefix: str, question: bool, after: str = "", plans: bool = True) -> bool:
    """Whether the clause holding a cue states nothing: a question, a negation, a condition, a
    mere possibility ("If you liked…", "You might like…", "I don't live in…"), or a plan,
    intention or wish, or something still to come (``after``: the sentence after the name;
    "I'm planning a trip to Lisbon", "moving to Porto next month"), unless ``plans`` is
    False (a relation: a state, which a plan does not undo)."""
    clause = _CLAUSE.split(prefix)[-1]
    rest = _CLAUSE.split(after, maxsplit=1)[0]
    if question and (_INTERROGATIVE.match(prefix) or _INTERROGATIVE.match(clause.strip())):
        return True
    return bool(_NEGATED.search(clause) or re.search(r"\b(?:if|unless|might|could|should|would)\b", clause)
                or (plans and bool(_UNREALISED.search(clause) or _LATER.search(clause) or _LATER.search(rest))))


def _relative_predicate(prefix: str) -> str:
    words = re.findall(r"[a-zé]+", prefix)
    for word in reversed(words):
        if word in _RELATIVES:
            return _RELATIVES[word]
    return "friend_of"


def _object_type(predicate: str) -> EntityType | None:
    return {"has_pet": EntityType.OBJECT, "has_child": EntityType.PERSON, "sibling_of": EntityType.PERSON,
            "friend_of": EntityType.PERSON, "lives_in": EntityType.PLACE, "visited": EntityType.PLACE,
            "works_at": EntityType.ORGANISATION}.get(predicate)


def _head(name: str) -> str:
    return name.split()[-1].lower().strip(".'")


def _type(prefix: str, name: str) -> tuple[EntityType | None, str | None]:
    """What a name is and the relation its cue states, from the words before it and its head word."""
    head = _head(name)
    by_head = (EntityType.ORGANISATION if head in _ORG_HEADS or name.split()[0].lower() in ("university", "bank")
               else EntityType.PLACE if head in _PLACE_HEADS
               else EntityType.EVENT if head in _EVENT_HEADS else None)
    for pattern, type_, predicate in _CUES:
        if pattern.search(prefix):
            if by_head is not None:
                type_ = by_head
            if predicate == "attended" and by_head != EntityType.EVENT:
                return by_head or EntityType.PLACE, None  # "going to Paris": a place, no claim of a visit yet
            if predicate in ("lives_in", "born_in", "visited") and type_ != EntityType.PLACE:
                return type_, None
            return type_, predicate
    return by_head, None


def _names(text: str, lowercase: bool) -> list[_Name]:
    """Runs of capitalised words; in an all-lower-case message, the word after a strong cue."""
    tokens = list(_TOKEN.finditer(text))
    out: list[_Name] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i].group()
        saint = tok.rstrip(".") == "St" and i + 1 < len(tokens) and _capitalised(tokens[i + 1].group())
        if not _capitalised(tok) or (tok.lower().rstrip(".") in _NOT_NAMES and not saint):
            i += 1
            continue
        j = i + 1
        while j < len(tokens):
            nxt = tokens[j].group()
            gap = text[tokens[j - 1].end():tokens[j].start()]
            if gap.strip() not in ("", "'", ".") and not (gap.strip() == "&" and _capitalised(nxt)):  # Marlowe & Finch
                break
            if _capitalised(nxt) and nxt.lower().rstrip(".") not in _NOT_NAMES - {"st"}:
                j += 1
            elif nxt.isdigit() and j == i + 1 and len(nxt) <= 3:
                j += 1
            elif nxt.lower() in _CONNECTORS and j + 1 < len(tokens) and _capitalised(tokens[j + 1].group()):
                j += 1
            else:
                break
        start, end = tokens[i].start(), tokens[j - 1].end()
        name = text[start:end]
        if name.endswith("'s"):
            name, end = name[:-2], end - 2
        initial = not re.search(r"\w", text[:start])
        out.append(_Name(name, start, end, initial))
        i = j
    if lowercase:
        for m in re.finditer(r"\b(?:live|lives|living|moved|moving)\s+(?:\w+\s+)?(?:in|to|from)\s+([a-z]{3,})\b|"
                             r"\bborn\s+in\s+([a-z]{3,})\b", text):
            word = m.group(1) or m.group(2)
            if word not in _NOT_NAMES and word not in ("the", "a", "my", "our", "town", "city"):
                s = m.start(1) if m.group(1) else m.start(2)
                out.append(_Name(word.capitalize(), s, s + len(word), False))
        out.sort(key=lambda n: n.start)
    return out


def _capitalised(token: str) -> bool:
    return token[0].isupper() or (token[0].islower() and len(token) > 1 and any(c.isupper() for c in token[1:])
                                  and token[1:].lower() != token[1:])


def _entities(mentions: list[_Mention], speakers: dict[str, str], namespaces: dict[str, str],
              aliases: dict[str, list[str]]) -> list[ExtractedEntity]:
    """One entity per name and owner: the speakers, and every name a cue typed somewhere in the window."""
    votes: dict[tuple[str, str], Counter[EntityType]] = {}
    spelling: dict[tuple[str, str], str] = {}
    for m in mentions:
        key = (m.owner, normalise_name(m.name))
        if not key[1]:
            continue
        spelling.setdefault(key, m.name)
        counter = votes.setdefault(key, Counter())
        if m.type is not None:
            counter[m.type] += 1
    out = [ExtractedEntity(name=uid, type=EntityType.PERSON, aliases=_unique(aliases.get(uid, [])),
                           namespace=namespaces[uid]) for uid in speakers.values()]
    for (owner, norm), counter in votes.items():
        if norm in speakers or not counter:
            continue
        type_ = counter.most_common(1)[0][0]
        out.append(ExtractedEntity(name=spelling[(owner, norm)][:200], type=type_, namespace=namespaces[owner]))
    return out


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))[:20]


def _dedupe(facts: list[ExtractedFact]) -> list[ExtractedFact]:
    seen: dict[tuple[str, str, str, str], ExtractedFact] = {}
    for fact in facts:
        key = (fact.namespace, normalise_name(fact.subject), fact.predicate, normalise_name(fact.object))
        if key in seen:
            seen[key].message_ids.extend(i for i in fact.message_ids if i not in seen[key].message_ids)
            if seen[key].valid_at is None:
                seen[key].valid_at = fact.valid_at
        else:
            seen[key] = fact
    return list(seen.values())


# --- dates -----------------------------------------------------------------------------

_MONTH_RE = r"(" + "|".join(_MONTHS) + r")"
_DAY_MONTH = re.compile(r"\b(?:the\s+)?(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH_RE + r"(?:,?\s+(\d{4}))?\b")
_MONTH_DAY = re.compile(r"\b" + _MONTH_RE + r"\s+(\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(\d{4}))?\b")
_IN_MONTH = re.compile(r"\b(in|last|since|this)\s+" + _MONTH_RE + r"(?:\s+(\d{4}))?\b")
_YEAR = re.compile(r"\b(?:in|since|back\s+in)\s+((?:19|20)\d\d)\b")


def _date(lower: str, reference: datetime | None) -> datetime | None:
    """The date a sentence states, if any; a month or day without a year takes the message's year
    ("last November" the latest November before it)."""
    year = reference.year if reference else None

    def make(y: int | None, month: int, day: int = 1) -> datetime | None:
        if y is None:
            return None
        try:
            return datetime(y, month, day, tzinfo=UTC)
        except ValueError:
            return None

    if m := _DAY_MONTH.search(lower):
        return make(int(m.group(3)) if m.group(3) else year, _MONTHS.index(m.group(2)) + 1, int(m.group(1)))
    if m := _MONTH_DAY.search(lower):
        if m.group(1) != "may" or m.group(3) or re.search(r"\b(?:on|in|by)\s+may\s+\d", lower):
            return make(int(m.group(3)) if m.group(3) else year, _MONTHS.index(m.group(1)) + 1, int(m.group(2)))
    if m := _IN_MONTH.search(lower):
        month = _MONTHS.index(m.group(2)) + 1
        y = int(m.group(3)) if m.group(3) else year
        if m.group(1) == "last" and reference is not None and y is not None and month >= reference.month:
            y -= 1
        return make(y, month)
    if m := _YEAR.search(lower):
        return make(int(m.group(1)), 1)
    return None
