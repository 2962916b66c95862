"""Strict structured writes in model output: ``<memory_write>{...}</memory_write>`` blocks.

A model may end its answer with blocks such as::

    <memory_write>{"observations": [{"text": "Alice flies on June 3rd", "confidence": 0.8,
                                      "tags": ["travel"], "name": "Alice"}],
                   "entities": [{"name": "Alice", "type": "person"}],
                   "edges": [{"source": "Alice", "target": "Lyon", "rel_type": "lives_in"}]}</memory_write>

or, in the seed systems' unified shape, a list of items (``{"items": [...]}`` or the bare
list), each with a ``kind``::

    <shadow_write>[{"kind": "entity", "name": "Lyon", "type": "city", "text": "a city in France"},
                   {"kind": "observation", "name": "Alice", "text": "Alice flies on June 3rd", "tags": ["travel"]},
                   {"kind": "edge", "source": "Alice", "target": "Lyon", "rel_type": "lives in"}]</shadow_write>

``<shadow_write>`` (the seed systems' spelling) is the same block. Parsing is all or
nothing: a block that is not closed, a block inside a block, JSON that is not plain JSON,
a field that is missing, unknown, of the wrong type or out of bounds fails the whole text
with an error that says which block, where it starts (line and column) and which field;
nothing is returned, so nothing is stored. Text outside the blocks is ignored.

What a block writes (issue 16, docs/graph.md "Explicit writes"): observations are memories;
entities are entity nodes of the knowledge graph and edges are its ``RELATES_TO`` facts,
resolved in the block's namespace as formation resolves what it extracts
(memory_service/formation/graph_update.py: a name the namespace holds is that entity, a
single-valued relation such as lives_in closes the subject's current one, audited); an
observation naming an entity (``name``), or whose text names one of the block's entities,
``MENTIONS`` it. Why here and not through formation: the model said it explicitly, so it
is written when said, by the caller's key, under its rights.

Idempotent: every memory a block stores gets an idempotency key derived from the
namespace, the message it came in (session_id and message_id, when given), the block's
position in the text and the item's kind, position and content; entities and facts have
ids stable per namespace, and mentions are merged. Parsing the same text for the same
message again stores nothing new and answers the same ids, all in ``already_stored``.

Secrets: the text is redacted as the agent's redaction policy says before it is parsed
(backends/agents.py, ``Redactor``; docs/redaction.md), so no block stores one, in a memory, an
entity's name or a fact; no detector's value crosses a JSON string's quote, so a block
stays JSON. A repeated parse redacts the same way: its keys, and so its ids, are the same.

Order, so that a failure half-way (a store outage) is completed by a retry: everything is
checked and the names resolved (a read) before anything is written; then the memories,
the entities, the facts, the mentions, and last the facts the new ones supersede. Every
step is idempotent, so the retry writes what is missing and nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from memory_service.access.audit import AuditLog
from memory_service.curation.tools import MemoryTools, MemoryWrite, NamespaceGuard, Written
from memory_service.domain.errors import InvalidInput, preview
from memory_service.domain.expiry import sources_end
from memory_service.domain.graph import (
    Entity as GraphEntity,
)
from memory_service.domain.graph import (
    EntityType,
    ExtractedEntity,
    ExtractedFact,
    Fact,
    Mention,
    fact_id,
    normalise_name,
)
from memory_service.domain.limits import check_message_chars, json_problem, unique_keys
from memory_service.domain.models import MemoryKind, utcnow
from memory_service.domain.namespaces import NamespaceKind
from memory_service.events.log import Cause, EventLog
from memory_service.formation import graph_update
from memory_service.state.cache import agent_wide

TAGS = ("memory_write", "shadow_write")
MAX_BLOCKS = 20
MAX_ITEMS = 100  # observations, entities, edges or items in one block
MAX_TEXT_CHARS = 2_000  # of one observation, or an edge's sentence
MAX_SUMMARY_CHARS = 1_000  # of an entity's description (its summary in the graph)
MAX_NAME_CHARS = 200  # of an entity's name, an edge's ends
MAX_TAGS = 20
MAX_TAG_CHARS = 64
WRITE_BLOCKS_ACTOR = "write_blocks"  # the audit log's key_id for invalidations when no caller key is known

_TAG = re.compile(r"<(/?)(memory_write|shadow_write)>")
_PREDICATE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
ITEM_KINDS = ("entity", "observation", "edge")

# The words a model may type an entity with, for the graph's six types.
TYPE_WORDS: dict[str, EntityType] = {
    **{w: EntityType.PERSON for w in ("person", "people", "human", "individual", "user", "friend", "family",
                                      "relative", "contact")},
    **{w: EntityType.PLACE for w in ("place", "location", "city", "town", "village", "country", "region", "area",
                                     "address", "venue", "building")},
    **{w: EntityType.ORGANISATION for w in ("organisation", "organization", "org", "company", "business",
                                            "employer", "school", "university", "team", "institution", "club")},
    **{w: EntityType.OBJECT for w in ("object", "thing", "item", "product", "pet", "animal", "book", "device",
                                      "vehicle", "tool")},
    **{w: EntityType.EVENT for w in ("event", "meeting", "trip", "appointment", "party", "holiday")},
    **{w: EntityType.TOPIC for w in ("topic", "concept", "subject", "interest", "skill", "idea", "hobby")},
}
# The type of an entity no block item types and the namespace does not hold: the subject of
# an edge is a person (the relations people state are about people), its object what the
# relation says, anything else a named thing.
_OBJECT_TYPES = {"lives_in": EntityType.PLACE, "born_in": EntityType.PLACE, "visited": EntityType.PLACE,
                 "works_at": EntityType.ORGANISATION, "studies_at": EntityType.ORGANISATION,
                 "married_to": EntityType.PERSON, "partner_of": EntityType.PERSON, "sibling_of": EntityType.PERSON,
                 "friend_of": EntityType.PERSON, "has_child": EntityType.PERSON, "child_of": EntityType.PERSON,
                 "attended": EntityType.EVENT}


def _entity_type(value: object) -> object:
    if not isinstance(value, str):
        return value  # None, an EntityType, or what strict validation refuses
    key = " ".join(value.replace("_", " ").replace("-", " ").casefold().split())
    if key not in TYPE_WORDS:
        raise ValueError(f"unknown entity type {preview(value, 40)}: one of person, place, organisation, object, "
                         "event or topic (or a common word for one, such as city, company or pet)")
    return TYPE_WORDS[key]


def _entity_name(value: str) -> str:
    if not normalise_name(value):
        raise ValueError("a name needs a letter or a digit")
    return value


def _predicate(value: object) -> object:
    if not isinstance(value, str):
        return value
    predicate = "_".join(re.split(r"[\s-]+", value.strip().casefold()))
    if not _PREDICATE.match(predicate):
        raise ValueError("a relation is lower-case words of letters, digits and '_' starting with a letter "
                         "(e.g. lives_in, or 'lives in'), at most 64 characters")
    return predicate


Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS),
                 AfterValidator(_entity_name)]
Tag = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TAG_CHARS)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TEXT_CHARS)]
Summary = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_SUMMARY_CHARS)]
Kind = Annotated[EntityType | None, BeforeValidator(_entity_type)]
Relation = Annotated[str, BeforeValidator(_predicate)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Scored(_Strict):
    confidence: float = Field(default=1.0, ge=0, le=1)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)

    @field_validator("confidence", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        # JSON has one number type: 1 is as good a confidence as 1.0 (strict mode refuses ints).
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Observation(_Scored):
    text: Text
    name: Name | None = None  # the entity it is about: a MENTIONS edge to it


class Entity(_Strict):
    name: Name
    type: Kind = None
    description: Summary | None = None


class Edge(_Strict):
    source: Name
    target: Name
    rel_type: Relation
    text: Text | None = None  # the fact as a sentence; default "<source> <relation> <target>"

    @model_validator(mode="after")
    def _two_ends(self) -> Edge:
        if normalise_name(self.source) == normalise_name(self.target):
            raise ValueError("source and target name the same entity; an edge links two")
        return self


# The unified shape. Tags and confidence are accepted on every item (the seeds send them);
# the graph keeps neither on entities and facts, so only observations keep them.
class EntityItem(_Scored):
    kind: Literal["entity"]
    name: Name
    type: Kind = None
    text: Summary | None = None  # its description


class ObservationItem(Observation):
    kind: Literal["observation"]


class EdgeItem(Edge, _Scored):
    kind: Literal["edge"]


Item = Annotated[EntityItem | ObservationItem | EdgeItem, Field(discriminator="kind")]


class WriteBlock(_Strict):
    """What one block writes."""

    observations: list[Observation] = Field(default_factory=list, max_length=MAX_ITEMS)
    entities: list[Entity] = Field(default_factory=list, max_length=MAX_ITEMS)
    edges: list[Edge] = Field(default_factory=list, max_length=MAX_ITEMS)
    items: list[Item] = Field(default_factory=list, max_length=MAX_ITEMS)

    @field_validator("entities", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        # An entity may be just its name.
        return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @property
    def empty(self) -> bool:
        return not (self.observations or self.entities or self.edges or self.items)

    def all_entities(self) -> list[Entity]:
        return [*self.entities, *(Entity(name=i.name, type=i.type, description=i.text)
                                  for i in self.items if isinstance(i, EntityItem))]

    def all_edges(self) -> list[Edge]:
        return [*self.edges, *(Edge(source=i.source, target=i.target, rel_type=i.rel_type, text=i.text)
                               for i in self.items if isinstance(i, EdgeItem))]

    def all_observations(self) -> list[tuple[str, int, Observation]]:
        """(kind for the key, position, observation): the list's, then the items'."""
        return [*(("observation", n, o) for n, o in enumerate(self.observations)),
                *(("item", n, Observation(text=i.text, name=i.name, tags=i.tags, confidence=i.confidence))
                  for n, i in enumerate(self.items) if isinstance(i, ObservationItem))]


@dataclass(frozen=True)
class LocatedBlock:
    """A parsed block and where it starts in the text (1-based line and column)."""

    block: WriteBlock
    tag: str
    line: int
    column: int


class WriteBlockError(InvalidInput):
    """A malformed block: the whole text is refused."""


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse_write_blocks(text: str) -> list[LocatedBlock]:
    """Every write block of ``text``, in order; WriteBlockError at the first malformed one."""
    blocks: list[LocatedBlock] = []
    open_tag: tuple[str, int, int] | None = None  # name, offset of the tag, offset after it
    for match in _TAG.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        line, column = _position(text, match.start())
        if not closing:
            if open_tag is not None:
                first = _position(text, open_tag[1])
                raise WriteBlockError(f"line {line}, column {column}: <{name}> inside the <{open_tag[0]}> block opened "
                                      f"at line {first[0]}, column {first[1]}; blocks do not nest")
            open_tag = (name, match.start(), match.end())
            continue
        if open_tag is None:
            raise WriteBlockError(f"line {line}, column {column}: </{name}> closes no block")
        if name != open_tag[0]:
            first = _position(text, open_tag[1])
            raise WriteBlockError(f"line {line}, column {column}: </{name}> closes the <{open_tag[0]}> block opened at "
                                  f"line {first[0]}, column {first[1]}")
        if len(blocks) == MAX_BLOCKS:
            raise WriteBlockError(f"more than {MAX_BLOCKS} write blocks in one text")
        blocks.append(_block(text, open_tag, match.start(), len(blocks) + 1))
        open_tag = None
    if open_tag is not None:
        line, column = _position(text, open_tag[1])
        raise WriteBlockError(f"line {line}, column {column}: <{open_tag[0]}> is never closed")
    return blocks


def _block(text: str, opened: tuple[str, int, int], end: int, number: int) -> LocatedBlock:
    name, start, body_start = opened
    line, column = _position(text, start)
    where = f"block {number} (<{name}> at line {line}, column {column})"
    body = text[body_start:end]
    try:
        value = json.loads(body, object_pairs_hook=unique_keys)  # a key twice: DuplicateKey, a ValueError
    except json.JSONDecodeError as exc:
        at_line, at_column = _position(text, body_start + exc.pos)
        raise WriteBlockError(f"{where}: not JSON: {exc.msg} at line {at_line}, column {at_column}") from None
    except (RecursionError, ValueError) as exc:
        raise WriteBlockError(f"{where}: not usable JSON: {preview(str(exc), 120)}") from None
    if problem := json_problem(value):
        loc, reason = problem
        raise WriteBlockError(f"{where}: {_path(loc) or 'the block'}: {reason}")
    if isinstance(value, list):
        value = {"items": value}  # the unified shape's bare list of items
    if not isinstance(value, dict):
        raise WriteBlockError(f"{where}: a block holds a JSON object with observations, entities, edges and/or "
                              f"items, or a list of items, not {preview(value, 40)}")
    try:
        block = WriteBlock.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise WriteBlockError(f"{where}: {_path(first['loc']) or 'the block'}: {first['msg']}"
                              + (f" (got {preview(first['input'], 60)})" if 'input' in first else "")) from None
    if block.empty:
        raise WriteBlockError(f"{where}: the block writes nothing (no observations, entities, edges or items)")
    return LocatedBlock(block, name, line, column)


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for n, part in enumerate(loc):
        if part in ITEM_KINDS and n >= 2 and loc[n - 2] == "items":
            continue  # the union's tag (items[0].entity.name): the item's kind, said by the item itself
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def block_key(namespace: str, session_id: str | None, message_id: str | None, block: int, kind: str, item: int,
              content: str) -> str:
    """The idempotency key of one item of a block: where it was said and what it says."""
    parts = (namespace, session_id or "", message_id or "", str(block), kind, str(item), content)
    return "write-block:" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def memory_writes(block: WriteBlock, namespace: str, number: int = 1, session_id: str | None = None,
                  message_id: str | None = None) -> list[MemoryWrite]:
    """The memories a block stores, as the memory tools write them: one observation per
    observation (of the list, then of the items). ``number``: the block's position in its
    text (1-based), which with the message keys every write.

    A parsed block always makes valid MemoryWrites: the block's bounds are within theirs
    (non-blank stripped texts, confidence in [0, 1]). The service's own settings
    (MAX_TAG_CHARS, MAX_MESSAGE_CHARS) are checked when they are written, with the field named."""
    return [MemoryWrite(content=o.text, namespace=namespace, kind=MemoryKind.OBSERVATION, tags=o.tags,
                        confidence=o.confidence,
                        idempotency_key=block_key(namespace, session_id, message_id, number, kind, n, o.text))
            for kind, n, o in block.all_observations()]


@dataclass
class GraphPlan:
    """What the blocks write into the knowledge graph, before resolution: the entities (each
    name once, typed by the first item that types it), the facts, and per memory written
    (by its position among the blocks' memories) the entity names it mentions."""

    entities: list[ExtractedEntity]
    facts: list[ExtractedFact]
    about: dict[int, str]  # memory position -> the name its observation is about

    @property
    def empty(self) -> bool:
        return not self.entities


def graph_plan(blocks: Sequence[WriteBlock], namespace: str, message_id: str | None = None) -> GraphPlan:
    """The graph writes of ``blocks`` in ``namespace``. A name no item types gets the type
    ``_OBJECT_TYPES`` says for an edge's object, a person for an edge's subject, else object;
    a name the namespace holds keeps its stored type (resolution)."""
    declared: dict[str, tuple[str, EntityType | None, str]] = {}  # normalised name -> name, type, summary
    guessed: dict[str, EntityType] = {}
    facts: list[ExtractedFact] = []
    about: dict[int, str] = {}
    position = 0

    def name(value: str, guess: EntityType) -> None:
        key = normalise_name(value)
        declared.setdefault(key, (value, None, ""))
        guessed.setdefault(key, guess)

    for block in blocks:
        for entity in block.all_entities():
            key = normalise_name(entity.name)
            first_name, first_type, first_summary = declared.get(key, (entity.name, None, ""))
            declared[key] = (first_name, first_type or entity.type, first_summary or entity.description or "")
        for edge in block.all_edges():
            name(edge.source, EntityType.PERSON)
            name(edge.target, _OBJECT_TYPES.get(edge.rel_type, EntityType.OBJECT))
            facts.append(ExtractedFact(subject=edge.source, predicate=edge.rel_type, object=edge.target,
                                       text=edge.text or f"{edge.source} {edge.rel_type.replace('_', ' ')} {edge.target}",
                                       namespace=namespace, message_ids=[message_id] if message_id else []))
        for _, _, observation in block.all_observations():
            if observation.name is not None:
                name(observation.name, EntityType.OBJECT)
                about[position] = observation.name
            position += 1
    entities = [ExtractedEntity(name=value, type=type_ or guessed.get(key, EntityType.OBJECT), summary=summary,
                                namespace=namespace)
                for key, (value, type_, summary) in declared.items()]
    return GraphPlan(entities, facts, about)


@dataclass(frozen=True)
class BlockWrites:
    """What a parse stored: the memories (``Written``), the entities and facts as stored now
    (in the order the blocks name them), the facts it closed, and every id of the answer
    that was stored before this call (a repeat of the same message's blocks: all of them)."""

    blocks: int
    memories: Written
    entities: list[GraphEntity]
    facts: list[Fact]
    superseded: list[str]
    already_stored: list[str]
    redacted: dict[str, int]  # what the agent's redaction policy took out of the text, by kind

    @property
    def new_memories(self) -> list[str]:
        return [r.id for r in self.memories.records if r.id not in set(self.memories.already_stored)]

    def new(self, ids: Sequence[str]) -> list[str]:
        return [i for i in ids if i not in set(self.already_stored)]


async def store_write_blocks(tools: MemoryTools, agent_id: str, text: str, namespace: str,
                             session_id: str | None = None, message_id: str | None = None,
                             guard: NamespaceGuard = None, audit: AuditLog | None = None,
                             actor: str = WRITE_BLOCKS_ACTOR, events: EventLog | None = None,
                             cause: Cause = Cause()) -> BlockWrites:
    """Parse ``text`` and store what its blocks say, all or none (everything is checked, and
    the graph's names resolved, before anything is written). Each fact a block's fact closes
    is logged in ``audit`` under ``actor``. A backend without a graph (Mongo) refuses blocks
    with entities, edges or observations naming an entity (NotSupported, 409) before anything
    is written; their observations alone are stored as anywhere."""
    check_message_chars(text, tools.settings.max_message_chars)
    redacted = await tools.agents.redactor(agent_id).redacted(text, "text")
    text = redacted.text
    parsed = parse_write_blocks(text)
    blocks = [located.block for located in parsed]
    target = await tools.writable_target(agent_id, namespace, guard, session_id, message_id)
    writes = [write for number, block in enumerate(blocks, 1)
              for write in memory_writes(block, namespace, number, session_id, message_id)]
    plan = graph_plan(blocks, str(target), message_id)
    if plan.empty:
        written = await tools.write_many(agent_id, writes, guard, session_id, message_id)
        return BlockWrites(len(parsed), written, [], [], [], list(written.already_stored), redacted.counts)
    if target.kind is NamespaceKind.SESSION:
        raise InvalidInput("namespace: entities and edges live in a user's, a shard's or the agent's namespace, not "
                           "a session's; write the block's entities, edges and observations naming an entity there")

    _, backend = await tools.agents.backend_for(agent_id)
    resolution = await graph_update.resolve(  # 409 on Mongo
        backend, agent_id, plan.entities, embedder=tools.embedder, threshold=tools.settings.entity_name_similarity,
        max_candidates=tools.settings.entity_resolve_candidates)
    resolution.entities, described = _described(resolution.entities, plan.entities)
    resolved, stored_entities = resolution.entities, resolution.stored
    entity_ids = list(dict.fromkeys(resolved[(str(target), normalise_name(e.name))].id for e in plan.entities))
    statements = list(dict.fromkeys(
        fact_id(str(target), resolved[(str(target), normalise_name(f.subject))].id, f.predicate,
                resolved[(str(target), normalise_name(f.object))].id) for f in plan.facts))
    subjects = list(dict.fromkeys(resolved[(str(target), normalise_name(f.subject))].id for f in plan.facts))
    stored_facts = {f.id for f in await backend.current_facts(agent_id, target, subjects, include_superseded=True)
                    if f.id in statements} if set(subjects) & stored_entities else set()

    written = await tools.write_many(agent_id, writes, guard, session_id, message_id)
    memory_ids = [r.id for r in written.records]
    texts = {memory_ids[i]: w.content for i, w in enumerate(writes)}
    named = {m.memory_id: set(m.names) for m in graph_update.mentions(texts, plan.entities)}
    for i, about in plan.about.items():
        named.setdefault(memory_ids[i], set()).add(normalise_name(about))
    changes = await graph_update.apply(
        backend, agent_id, plan.entities, plan.facts, [Mention(m, tuple(sorted(n))) for m, n in named.items()],
        memory_ids=memory_ids, ends_at=sources_end(r.expires_at for r in written.records), observed_at=utcnow(),
        audit=audit, actor=actor, resolved=resolution,
        events=events, cause=cause)
    if changes.entities or changes.facts or changes.mentions or changes.superseded or described:
        await tools.state.cache.bump(str(target), agent_wide(agent_id))

    by_id = {e.id: e for e in await backend.find_entities(agent_id, target, [e.name for e in plan.entities])}
    facts = {f.id: f for f in await backend.current_facts(agent_id, target, subjects, include_superseded=True)}
    already = [*written.already_stored, *(i for i in entity_ids if i in stored_entities),
               *(i for i in statements if i in stored_facts)]
    # The facts as written: a statement true again after it was closed is a new stint (graph_update).
    stated = list(dict.fromkeys([*changes.stated, *(i for i in statements if i not in changes.stated)]))
    return BlockWrites(len(parsed), written, [by_id[i] for i in entity_ids if i in by_id],
                       [facts[i] for i in stated if i in facts and (i in changes.stated or facts[i].current_at())],
                       changes.superseded, already, redacted.counts)


def _described(resolved: graph_update.Resolved,
               entities: Sequence[ExtractedEntity]) -> tuple[graph_update.Resolved, bool]:
    """The resolved entities with the summaries the blocks give them (a stored entity's
    summary is replaced by a non-empty one, as the store's upsert does), and whether any
    summary changed."""
    summaries = {resolved[(e.namespace, normalise_name(e.name))].id: e.summary for e in entities if e.summary}
    changed = any(e.summary != summaries[e.id] for e in resolved.values() if e.id in summaries)
    return ({key: entity.model_copy(update={"summary": summaries[entity.id]}) if entity.id in summaries else entity
             for key, entity in resolved.items()}, changed)
