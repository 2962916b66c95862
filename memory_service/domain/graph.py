"""The knowledge graph's vocabulary: entities, the facts between them, and what a window's
extraction says about both before they are resolved against the graph (issue 16).

The shapes follow Graphiti's data model so that the graph we write is Graphiti's graph:
an ``Entity`` is an ``EntityNode`` (name, labels, summary, name embedding, group_id,
created_at), a ``Fact`` an ``EntityEdge`` named ``RELATES_TO`` (the fact's text, a
predicate name, a fact embedding, ``valid_at``/``invalid_at`` for when it was true,
``created_at``/``expired_at`` for when we knew it, the episodes it came from), and a
memory that names an entity has a ``MENTIONS`` edge to it (an ``EpisodicEdge``).

Every entity and fact lives in one namespace (its group_id): a user's private entities
in the user's namespace, topic entities in a shard's, agent-wide ones in the agent's. An
entity is resolved only inside its namespace, never across namespaces or agents, so two
users' "Bob" are two entities.

Bi-temporal: ``valid_at``/``invalid_at`` say when the fact held in the world;
``created_at``/``expired_at`` when the service held it as current. A fact replaced by a
newer one keeps its row, gains ``invalid_at`` and ``superseded_by``, and is shown only
when a reader asks for history (``include_superseded``) or for a time it held (``as_of``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from memory_service.domain.models import utcnow


class EntityType(StrEnum):
    PERSON = "person"
    PLACE = "place"
    ORGANISATION = "organisation"
    OBJECT = "object"  # named things: pets, books, products
    EVENT = "event"
    TOPIC = "topic"


# Predicates that hold one value at a time for a subject: a new value replaces the old one
# (someone lives in one city, works at one employer, is married to one person, is named one
# name). Any other predicate accumulates (likes, visited, has_child...).
SINGLE_VALUED = frozenset({"lives_in", "works_at", "studies_at", "is_named", "married_to", "partner_of", "job_title",
                           "age"})
# Predicates that end a fact without a new value: "alice left Globex" closes "alice works at
# Globex" (or studies at it); "alice moved out of Leeds" closes "alice lives in Leeds".
ENDS: dict[str, frozenset[str]] = {"left": frozenset({"works_at", "studies_at"}), "moved_out_of": frozenset({"lives_in"})}


class ExtractedEntity(BaseModel):
    """An entity as a window's extraction names it, before resolution."""

    name: str = Field(min_length=1, max_length=200)
    type: EntityType
    aliases: list[str] = Field(default_factory=list, max_length=20)
    summary: str = Field(default="", max_length=1000)
    # The namespace it belongs in (a user's, a shard's, the agent's); the extractor says.
    namespace: str


class ExtractedFact(BaseModel):
    """A relation as a window's extraction states it: subject and object by name."""

    subject: str = Field(min_length=1, max_length=200)
    predicate: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    object: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=2000)  # the fact as a sentence
    valid_at: datetime | None = None  # when it became true, if the window says
    namespace: str
    message_ids: list[str] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Closing:
    """A fact to close as new facts are written: when it stopped being true, and the fact
    that replaced it (None for an ending: "alice left Globex")."""

    fact_id: str
    invalid_at: datetime
    superseded_by: str | None = None


@dataclass(frozen=True, slots=True)
class Mention:
    """A memory and the extracted entity names (normalised) its text contains: a MENTIONS
    edge from the memory to each entity they resolve to."""

    memory_id: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EntityMentions:
    """The memories that mention one entity (at most a reader's limit of them), and the
    entity's degree: how many mentions and facts it has in all, the input of retrieval's hub
    penalty (an entity linked to everything says little about any one memory)."""

    entity_id: str
    name: str
    degree: int
    memory_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MentionedEntity:
    """An entity one memory mentions, with its degree (as in ``EntityMentions``): what the
    structural re-rank of search reads of each candidate (memory_service/recall/graph_signal.py)."""

    entity_id: str
    name: str
    degree: int


class Entity(BaseModel):
    """A resolved entity: one node of the agent's graph."""

    id: str
    name: str
    type: EntityType
    namespace: str
    aliases: list[str] = Field(default_factory=list)
    summary: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    name_embedding: list[float] | None = Field(default=None, repr=False)


class Fact(BaseModel):
    """A fact edge between two entities (``RELATES_TO``)."""

    id: str
    namespace: str
    subject_id: str
    object_id: str
    predicate: str
    text: str
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    expired_at: datetime | None = None
    superseded_by: str | None = None
    memory_ids: list[str] = Field(default_factory=list)
    message_ids: list[str] = Field(default_factory=list)
    fact_embedding: list[float] | None = Field(default=None, repr=False)
    # The normalised names the statement gave its subject and object: which facts came
    # through an alias, so that splitting the alias off (a merge undone) takes them along.
    subject_via: list[str] = Field(default_factory=list)
    object_via: list[str] = Field(default_factory=list)
    # Closed as wrong, not as outdated: the memory (a correction) that replaced the one it came
    # from (docs/corrections.md); its ``invalid_at`` is its ``valid_at``: it never held.
    corrected_by: str | None = None
    # When its source memories all expire (docs/expiry.md): from then on reads hold it closed,
    # before the daily purge closes it in the store. None: one of them never expires.
    expires_at: datetime | None = None

    def shown_current(self, now: datetime | None = None) -> bool:
        """Current as reads show it: not closed, and its source memories not all expired."""
        return self.current_at() and (self.expires_at is None or self.expires_at > (now or utcnow()))

    def current_at(self, when: datetime | None = None) -> bool:
        """Whether the fact held at ``when`` (now, if None): not yet invalidated then."""
        if when is None:
            return self.invalid_at is None and self.expired_at is None
        started = self.valid_at is None or self.valid_at <= when
        return started and (self.invalid_at is None or when < self.invalid_at)


class EntityDetail(BaseModel):
    """One entity as a reader sees it: its facts (current ones, or all of them when history is
    asked for) and the entities those facts link it to."""

    entity: Entity
    facts: list[Fact] = Field(default_factory=list)
    neighbours: list[Entity] = Field(default_factory=list)
    # One page of the facts: how many there are in all, how many entities they link it to,
    # and the last fact's position (created_ts in whole microseconds, id) when more follow.
    facts_total: int = 0
    neighbours_total: int = 0
    after: tuple[int, str] | None = None


class EntitySplit(BaseModel):
    """What splitting an alias off an entity did: the entity without the alias, the alias's own
    entity, the facts moved to it (old id -> new id) and how many mentions it took along."""

    entity: Entity
    split_off: Entity
    facts: dict[str, str] = Field(default_factory=dict)
    mentions: int = 0


_NORMAL = re.compile(r"[a-z0-9_]+(?: [a-z0-9_]+)*")  # plain ASCII words, one space apart


@functools.lru_cache(maxsize=4096)  # a block normalises its n-grams twice (query_names, then the lookup)
def normalise_name(name: str) -> str:
    """The form names are compared in: case-folded, accents and punctuation dropped,
    whitespace collapsed ("  Zoë O'Brien " -> "zoe obrien")."""
    if _NORMAL.fullmatch(name):  # already in that form (the n-grams of query_names are)
        return name
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^\w\s]", "", plain.casefold()).split())


MAX_NGRAM = 3  # entity names and aliases longer than three words are not found from a text's n-grams
MAX_QUERY_NAMES = 400  # n-grams looked up per query (a 2,000-character query has about 1,000)


def query_names(text: str, stopwords: frozenset[str] = frozenset(), limit: int = MAX_QUERY_NAMES) -> list[str]:
    """The candidate entity names in a text (a search query, a message): its normalised words
    and n-grams of up to ``MAX_NGRAM`` words, in text order, leaving out those made of
    stopwords only ("my brother" stays), at most ``limit``. Words are taken twice: as
    ``normalise_name`` joins them ("O'Brien" is "obrien") and split at punctuation ("Tom's"
    is "tom" and "s"). Lookups by these names are exact (``name_keys``), so no name longer
    than ``MAX_NGRAM`` words is found this way."""
    names: dict[str, None] = {}
    for words in (normalise_name(text).split(), normalise_name(" ".join(re.findall(r"\w+", text))).split()):
        for n in range(1, MAX_NGRAM + 1):
            for start in range(len(words) - n + 1):
                gram = words[start:start + n]
                if not all(w in stopwords for w in gram):
                    names.setdefault(" ".join(gram))
    return list(names)[:limit]


def entity_id(namespace: str, name: str, type_: EntityType) -> str:
    """The id an entity is created with: stable for one name and type in one namespace, so
    writing the same extraction twice makes no second node."""
    key = f"{namespace}\x1f{type_.value}\x1f{normalise_name(name)}"
    return "ent_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def fact_id(namespace: str, subject_id: str, predicate: str, object_id: str, stint: str = "") -> str:
    """The id of one (subject, predicate, object) in one namespace: the same statement made
    again is the same fact (its provenance grows), not a second edge. ``stint`` tells apart a
    fact that became true again after it was closed (moving back to Paris): a new edge, the
    old one kept as history."""
    key = f"{namespace}\x1f{subject_id}\x1f{predicate}\x1f{object_id}" + (f"\x1f{stint}" if stint else "")
    return "fact_" + hashlib.sha256(key.encode()).hexdigest()[:24]
