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
SINGLE_VALUED = frozenset({"lives_in", "works_at", "is_named", "married_to", "partner_of", "job_title", "age"})


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


def normalise_name(name: str) -> str:
    """The form names are compared in: case-folded, accents and punctuation dropped,
    whitespace collapsed ("  Zoë O'Brien " -> "zoe obrien")."""
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^\w\s]", "", plain.casefold()).split())


def entity_id(namespace: str, name: str, type_: EntityType) -> str:
    """The id an entity is created with: stable for one name and type in one namespace, so
    writing the same extraction twice makes no second node."""
    key = f"{namespace}\x1f{type_.value}\x1f{normalise_name(name)}"
    return "ent_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def fact_id(namespace: str, subject_id: str, predicate: str, object_id: str) -> str:
    """The id of one (subject, predicate, object) in one namespace: the same statement made
    again is the same fact (its provenance grows), not a second edge."""
    key = f"{namespace}\x1f{subject_id}\x1f{predicate}\x1f{object_id}"
    return "fact_" + hashlib.sha256(key.encode()).hexdigest()[:24]
