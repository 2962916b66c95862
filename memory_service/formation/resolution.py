"""When two names of one namespace name the same entity although they are not the same name:
the lexical guard, the nickname table, and the name-embedding test (issue 16 item 3;
docs/extraction.md, "Resolution").

Exact names and aliases are resolved by the store's index (graph_update.resolve). A name
found that way is the same entity. A name that is not found may still be one stored under
another form: "Bob" for "Robert", "Tom Baker" for "Tom", "J Smith" for "John Smith",
"Deloite" for "Deloitte", "BBC" for "British Broadcasting Corporation". Name embeddings
alone cannot tell those from different entities with similar names: on the local model
(all-MiniLM-L6-v2) "Anna"/"Anne" (two people) are closer (0.68) than "Tom"/"Tom Hanks"
(0.65), "Bob"/"Robert" only 0.59 and "Peggy"/"Margaret" 0.45, while "Paris"/"Lyon" reach
0.49. So a candidate must first pass a cheap lexical guard that says HOW the two names can
be one (``name_match``), and then:

* a **strong** form (every word equal or a nickname of the other's in the committed table,
  same number of words; or an acronym of an organisation's words) is accepted as it is:
  the table is curated, and such pairs are as safe as the exact name the store already
  merges on;
* a **weak** form (a name extended by more words, an initial, a truncated first name, a
  one-letter typo in a long word) needs the names' embeddings at least ``threshold``
  apart in cosine (a setting, ``ENTITY_NAME_SIMILARITY``, chosen by measurement on
  tests/data/resolution_labelled.json).

Only one candidate may pass the guard: a name that fits two stored entities ("Tom" beside
"Tom Baker" and "Tom Hanks", "Chris" beside "Christopher" and "Christine") is merged with
neither. Candidates are always of the same type
and the same namespace: nothing here ever sees another namespace's or agent's entities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from memory_service.domain.graph import EntityType

# Cosine similarity of the local model's name embeddings that a weak form needs (measured,
# docs/extraction.md "Resolution"); a setting, ENTITY_NAME_SIMILARITY.
DEFAULT_THRESHOLD = 0.55
# At most this many entities of one type in one namespace are read as candidates per window
# (ENTITY_RESOLVE_CANDIDATES): the read stays bounded however large a namespace grows.
DEFAULT_MAX_CANDIDATES = 1000

STRONG = frozenset({"nickname", "acronym"})

# Given names and their usual short forms (English): each line is one name's group. A small
# table, committed on purpose: it is what an embedding does not know ("Peggy" is "Margaret").
_NICKNAME_GROUPS = """
abigail abby abbie gail
albert al bert bertie
alexander alex alec sandy xander
alexandra alex lexi sandra sasha
andrew andy drew
anthony tony ant
barbara barb babs
benjamin ben benny benji
catherine cathy cat kate katie kathy
christopher chris kit topher
christine chris chrissy tina
daniel dan danny
david dave davey
deborah debbie deb debs
dorothy dot dottie
edward ed eddie ted ned
eleanor ellie nora nell
elizabeth liz lizzie beth betty eliza libby bess
frances fran fanny
francis frank frankie
frederick fred freddie
gabriel gabe
gregory greg
harold harry hal
henry harry hank hal
isabel isabelle izzy bella
jacob jake
james jim jimmy jamie
jennifer jen jenny
jessica jess jessie
john jack johnny
jonathan jon jonny
joseph joe joey
joshua josh
katherine kate katie kathy kat kay
kathleen kate kathy
lawrence larry laurie
leonard leo len lenny
margaret maggie meg peggy marge greta
matthew matt
michael mike mick mickey
nathaniel nat nate
nicholas nick nicky
olivia liv livvy
patricia pat patty trish
patrick pat paddy
penelope penny
peter pete
philip phil pip
rebecca becky becca
richard rick ricky dick rich
robert rob robbie bob bobby bert
ronald ron ronnie
samantha sam sammy
samuel sam sammy
stephen steve stevie
steven steve stevie
susan sue susie
theodore theo ted teddy
thomas tom tommy
timothy tim timmy
victoria vicky tori
william will bill billy liam
zachary zach zack
"""


def _nickname_index(text: str) -> dict[str, frozenset[int]]:
    index: dict[str, set[int]] = {}
    for number, line in enumerate(text.strip().splitlines()):
        for name in line.split():
            index.setdefault(name, set()).add(number)
    return {name: frozenset(groups) for name, groups in index.items()}


NICKNAMES = _nickname_index(_NICKNAME_GROUPS)

# Words that add nothing to an organisation's name: "Acme" is "Acme Ltd". Any other extra
# word may name another thing ("Manchester" and "Manchester Airport"; "Mexico" and "Mexico
# City", which is why "city" is not one), so only a person's name may grow by other words.
_DESIGNATORS = frozenset({"inc", "ltd", "plc", "llc", "co", "corp", "corporation", "company", "group", "the",
                          "gmbh", "sa", "ag"})
_ACRONYM_SKIP = frozenset({"of", "the", "and", "for", "de", "la", "&"})


def nicknames(a: str, b: str) -> bool:
    """Whether two (normalised, one-word) given names are one name's forms in the table."""
    return bool(NICKNAMES.get(a, frozenset()) & NICKNAMES.get(b, frozenset()))


def _typo(a: str, b: str) -> bool:
    """One edit apart (an insertion, a deletion, a substitution or two letters swapped), both
    at least 5 letters and starting alike: "Deloite"/"Deloitte", never "Anna"/"Anne" or
    "Dan"/"Don", whose short names are often other people's."""
    if min(len(a), len(b)) < 5 or a[0] != b[0] or abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diffs = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diffs) == 1 or (len(diffs) == 2 and diffs[1] == diffs[0] + 1
                                   and a[diffs[0]] == b[diffs[1]] and a[diffs[1]] == b[diffs[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _word(a: str, b: str, person: bool) -> str | None:
    """How two words can be one: 'equal', 'nickname', 'initial' (a letter and a word it
    starts), 'truncation' (a given name cut short: "Alex"/"Alexandra"), 'typo', or None."""
    if a == b:
        return "equal"
    if person and nicknames(a, b):
        return "nickname"
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    if len(short) == 1 and long.startswith(short):
        return "initial"
    if person and len(short) >= 3 and len(long) - len(short) >= 2 and long.startswith(short):
        return "truncation"  # a one-letter ending is often another name: Ivan/Ivana, Paul/Paula, Alex/Alexa
    if _typo(a, b):
        return "typo"
    return None


def name_match(new: str, old: str, entity_type: EntityType) -> str | None:
    """How two normalised names of one type can name one entity, or None when they cannot.

    The kinds: 'nickname' (every word equal or in the nickname table, as many words),
    'acronym' (an organisation's initials), both strong; 'extension' (one name is the
    other's words and more: "Tom"/"Tom Baker"; for an organisation only designators such as
    "ltd"; for other things only "the"), 'initial' ("J Smith"/"John Smith"), 'truncation'
    (a given name cut by two letters or more), 'typo', weak.
    The first words must match each other (a surname alone is not read as a person)."""
    a, b = new.split(), old.split()
    if not a or not b or a == b:
        return None
    person = entity_type is EntityType.PERSON
    if entity_type is EntityType.ORGANISATION and (kind := _acronym(a, b) or _acronym(b, a)):
        return kind
    if not person:  # "The Guardian" is "Guardian"
        a, b = [w for w in a if w != "the"] or a, [w for w in b if w != "the"] or b
        if a == b:
            return "extension"
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    kinds = []
    j = 0
    for position, word in enumerate(short):
        while j < len(long) and (kind := _word(word, long[j], person)) is None:
            if position == 0 or not person:
                return None  # the first words must match; a place's or an organisation's words in order
            j += 1
        if j == len(long):
            return None
        kinds.append(kind)
        j += 1
    extra = [w for w in long if w not in short]
    if len(short) < len(long):
        if not person and any(w not in _DESIGNATORS for w in extra):
            return None
        kinds.append("extension")
    if "initial" in kinds and (len(short) < 2 or short[-1] != long[-1]):
        return None  # "J" alone is anyone; "J Smith" and "John Smith" share the surname
    for kind in ("typo", "truncation", "initial", "extension", "nickname"):
        if kind in kinds:
            return kind
    return None


def _acronym(short: list[str], long: list[str]) -> str | None:
    words = [w for w in long if w not in _ACRONYM_SKIP]
    if len(short) == 1 and len(short[0]) >= 2 and len(words) >= 2 and short[0] == "".join(w[0] for w in words):
        return "acronym"
    return None


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=False))
    na, nb = math.sqrt(math.fsum(x * x for x in a)), math.sqrt(math.fsum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """An entity a name may resolve to: its id, its normalised names (name first, then aliases)."""

    entity_id: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Match:
    entity_id: str
    how: str  # a kind of name_match
    similarity: float | None  # the names' cosine, when a weak form needed it


def guarded(names: Sequence[str], entity_type: EntityType, candidates: Sequence[Candidate]) -> dict[str, str]:
    """The candidates ``names`` (normalised: a name and its aliases) pass the lexical guard
    with, by entity id: a strong form if any pair of their names shows one, else a weak one."""
    passed: dict[str, str] = {}
    for candidate in candidates:
        kinds = {k for n in names for c in candidate.names if (k := name_match(n, c, entity_type))}
        if kinds:
            passed[candidate.entity_id] = next((k for k in ("nickname", "acronym") if k in kinds), sorted(kinds)[0])
    return passed


def choose(passed: dict[str, str], similarity: dict[str, float | None], threshold: float) -> Match | None:
    """The one candidate a name resolves to: the only one that passes the guard, when its form
    is strong or its names' embeddings are ``threshold`` close; None otherwise. Two candidates
    passing the guard are two entities the name may mean, and it means neither for sure."""
    if len(passed) != 1:
        return None
    [(chosen, how)] = passed.items()
    close = similarity.get(chosen)
    if how in STRONG or (close is not None and close >= threshold):
        return Match(chosen, how, close)
    return None
