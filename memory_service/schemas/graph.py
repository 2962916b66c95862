"""The knowledge graph's answers (issue 16; docs/graph.md, "The API"): entities and facts as
the HTTP API shows them and the typed client parses them.

The store's models (memory_service.domain.graph) carry embeddings, which no reader needs;
these carry the rest, and each fact says whether it is current, so a reader of history
(``include_superseded``) tells the two apart without comparing dates.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from memory_service.domain.graph import Entity, EntitySplit, EntityType, Fact

MAX_ENTITY_PAGE = 200  # entities one listing answers at most (the `limit` parameter's ceiling)
DEFAULT_FACT_PAGE = 50  # facts one read of an entity answers unless `limit` says otherwise
MAX_FACT_PAGE = 200  # facts one read of an entity answers at most (so at most as many neighbours)
ENTITY_ID_PATTERN = r"^ent_[0-9a-f]{24}$"
FACT_ID_PATTERN = r"^fact_[0-9a-f]{24}$"


class EntityOut(BaseModel):
    id: str
    name: str
    type: EntityType
    namespace: str = Field(description="where it lives: a user's, a shard's or the agent's namespace")
    aliases: list[str] = Field(default_factory=list)
    summary: str = ""
    created_at: datetime

    @classmethod
    def of(cls, entity: Entity) -> EntityOut:
        return cls(id=entity.id, name=entity.name, type=entity.type, namespace=entity.namespace,
                   aliases=list(entity.aliases), summary=entity.summary, created_at=entity.created_at)


class FactOut(BaseModel):
    id: str
    namespace: str
    subject_id: str
    predicate: str = Field(description="lives_in, works_at, ...")
    object_id: str
    text: str = Field(description="the fact as a sentence")
    valid_at: datetime | None = Field(description="when it became true (None: not known)")
    invalid_at: datetime | None = Field(description="when it stopped being true (None: it still is)")
    superseded_by: str | None = Field(description="the fact that replaced it")
    corrected_by: str | None = Field(default=None, description="closed as wrong, not outdated: the memory that "
                                     "corrected the one it came from (docs/corrections.md)")
    created_at: datetime = Field(description="when the service learnt it")
    expired_at: datetime | None = Field(description="when the service stopped holding it as current")
    current: bool = Field(description="neither invalidated nor expired, and its memories not all expired")
    expires_at: datetime | None = Field(default=None, description="when the memories it came from all expire: from "
                                        "then on it is no longer current (docs/expiry.md); None: one never does")
    memory_ids: list[str] = Field(default_factory=list, description="the memories it came from")
    message_ids: list[str] = Field(default_factory=list, description="the messages it came from")

    @classmethod
    def of(cls, fact: Fact) -> FactOut:
        return cls(id=fact.id, namespace=fact.namespace, subject_id=fact.subject_id, predicate=fact.predicate,
                   object_id=fact.object_id, text=fact.text, valid_at=fact.valid_at, invalid_at=fact.invalid_at,
                   superseded_by=fact.superseded_by, corrected_by=fact.corrected_by, created_at=fact.created_at, expired_at=fact.expired_at,
                   current=fact.shown_current(), expires_at=fact.expires_at, memory_ids=list(fact.memory_ids), message_ids=list(fact.message_ids))


class EntityPage(BaseModel):
    entities: list[EntityOut]
    next: str | None = Field(description="the cursor of the next page (None: this is the last)")


class EntityDetailOut(BaseModel):
    entity: EntityOut
    facts: list[FactOut] = Field(description="one page of its facts, as `as_of`/`include_superseded` chose them, "
                                             "oldest first")
    neighbours: list[EntityOut] = Field(description="the entities this page's facts link it to (each once per page)")
    facts_total: int = Field(0, description="how many facts `as_of`/`include_superseded` choose, on every page")
    neighbours_total: int = Field(0, description="how many entities all those facts link it to")
    next: str | None = Field(None, description="the cursor of the next page of facts (None: this is the last)")


class EntitySplitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alias: str = Field(min_length=1, max_length=200,
                       description="the alias to make an entity of its own again (as listed in the entity's aliases)")


class EntitySplitOut(BaseModel):
    entity: EntityOut = Field(description="the entity, without the alias")
    split_off: EntityOut = Field(description="the alias's own entity (same type and namespace)")
    facts: dict[str, str] = Field(description="the facts moved to it: their old id -> their new id")
    mentions: int = Field(description="how many memories' mentions it took (those that named the entity by the alias)")

    @classmethod
    def of(cls, split: EntitySplit) -> EntitySplitOut:
        return cls(entity=EntityOut.of(split.entity), split_off=EntityOut.of(split.split_off), facts=dict(split.facts),
                   mentions=split.mentions)
