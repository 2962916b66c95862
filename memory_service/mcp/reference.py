"""The reference profile of `memory-service mcp` (``--profile reference``): the nine tools of
the official reference memory server (``@modelcontextprotocol/server-memory``:
create_entities, create_relations, add_observations, delete_entities, delete_observations,
delete_relations, read_graph, search_nodes, open_nodes), with its names, parameters and
answers, over one namespace of the agent's knowledge graph. A host already configured for
that server (its prompts, its users' habits) works unchanged against memory-service, and
what it writes is then the service's memory: found by search, shown in the memory block.

The reference keeps a JSON file of entities ``{name, entityType, observations}`` and
relations ``{from, to, relationType}``. Here (docs/mcp.md, "The reference profile", says
what cannot be kept and why):

* an entity is a graph entity of the namespace, found by its name as the graph compares
  names (case, accents and punctuation aside); its entityType is the graph's type (a common
  word for one maps onto it, any other word makes an object);
* an observation is a memory of kind observation in the namespace, tagged with the entity's
  id and mentioning it; its content is ``<name>: <observation>``, so that search and the
  memory block show whom it is about, and the prefix is taken off again when read here;
* a relation is a current fact of the namespace, its predicate the relationType.

Writes are write blocks (``POST .../writes/parse``, docs/graph.md "Explicit writes"): names
resolved, typed and audited as any explicit write, under the caller's key. Reads are the
entity listing and reads and the memory listing. Nothing here reaches the stores directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated, Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field

from memory_service.client import AsyncMemoryClient, MemoryRecord, WriteBlocksOut
from memory_service.curation.write_blocks import MAX_BLOCKS, MAX_ITEMS, MAX_NAME_CHARS, MAX_TEXT_CHARS, TYPE_WORDS
from memory_service.domain.errors import InvalidInput
from memory_service.domain.graph import EntityType, normalise_name
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.mcp.calls import Api
from memory_service.mcp.hints import reads, writes
from memory_service.schemas.graph import MAX_ENTITY_PAGE, MAX_FACT_PAGE, EntityOut, FactOut

A = TypeVar("A")
T = TypeVar("T")

INSTRUCTIONS = (
    "The knowledge graph of agent {agent} in memory-service, with the tools of the reference memory server: "
    "entities (people, places, organisations, things, events, topics) with observations about them, and "
    "relations between them in active voice. Entities are found by name. Relations and entities are kept as "
    "history and cannot be deleted; observations can."
)
# An observation is stored as "<name>: <observation>", within the write block's text limit.
MAX_OBSERVATION_CHARS = MAX_TEXT_CHARS - MAX_NAME_CHARS - 2
MAX_OBSERVATIONS = 20  # per entity and call: with MAX_ITEMS entities, what one request's blocks hold
LOOKUP_PAGE = 10  # entities of a name prefix read to find the one of that exact name (sorted first)
CONCURRENT_READS = 8  # entity reads in flight at once when a tool reads many
RELATION_PATTERN = r"^[A-Za-z][A-Za-z0-9_ -]{0,63}$"  # what the write blocks make a predicate of
UNDELETABLE = (
    "memory-service keeps entities and relations as history: the knowledge graph has no deletion of either "
    "(a relation stops being current when a new one replaces it, e.g. a new lives_in; erasing a user removes "
    "theirs). Nothing was changed. Observations can be deleted with delete_observations."
)

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
ObservationText = Annotated[str, Field(min_length=1, max_length=MAX_OBSERVATION_CHARS)]


# The reference server's shapes, field for field (its zod schemas); the inputs bounded.

class Entity(BaseModel):
    name: str = Field(description="The name of the entity")
    entityType: str = Field(description="The type of the entity: person, place, organisation, object, event or topic")
    observations: list[str] = Field(description="An array of observation contents associated with the entity")


class EntityIn(Entity):
    name: Name = Field(description="The name of the entity")
    entityType: str = Field(min_length=1, max_length=100, description=(
        "The type of the entity: person, place, organisation, object, event or topic, or a common word for one "
        "(city, company, pet, ...); any other word is stored as object"))
    observations: list[ObservationText] = Field(max_length=MAX_OBSERVATIONS, description=(
        "An array of observation contents associated with the entity"))


class Relation(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    source: str = Field(alias="from", description="The name of the entity where the relation starts")
    to: str = Field(description="The name of the entity where the relation ends")
    relationType: str = Field(description="The type of the relation")


class RelationIn(Relation):
    source: Name = Field(alias="from", description="The name of the entity where the relation starts")
    to: Name = Field(description="The name of the entity where the relation ends")
    relationType: str = Field(pattern=RELATION_PATTERN, description=(
        "The type of the relation, in active voice: words of letters, digits and '_' (works_at, or 'works at', "
        "stored as works_at)"))


class ObservationsIn(BaseModel):
    entityName: Name = Field(description="The name of the entity to add the observations to")
    contents: list[ObservationText] = Field(max_length=MAX_OBSERVATIONS,
                                            description="An array of observation contents to add")


class DeletionIn(BaseModel):
    entityName: Name = Field(description="The name of the entity containing the observations")
    observations: list[ObservationText] = Field(max_length=MAX_ITEMS, description="An array of observations to delete")


class KnowledgeGraph(BaseModel):
    entities: list[Entity]
    relations: list[Relation]


class CreatedEntities(BaseModel):
    entities: list[Entity]


class CreatedRelations(BaseModel):
    relations: list[Relation]


class AddedObservations(BaseModel):
    entityName: str
    addedObservations: list[str]


class ObservationResults(BaseModel):
    results: list[AddedObservations]


class Outcome(BaseModel):
    success: bool
    message: str


def check_namespace(namespace: str, agent_id: str) -> str:
    """``namespace`` as the API writes it, if the profile's graph may live there (a user's,
    a shard's or the agent's namespace of ``agent_id``); else ValueError saying why."""
    try:
        parsed = Namespace.parse(namespace)
    except InvalidInput as exc:
        raise ValueError(f"--namespace: {exc}") from None
    if parsed.kind is NamespaceKind.SESSION:
        raise ValueError("--namespace: a session holds no entities; give 'user:<agent>:<user>', "
                         "'shard:<agent>:<shard>' or 'agent:<agent>'")
    if parsed.fields[0] != agent_id:
        raise ValueError(f"--namespace {namespace!r} is not a namespace of agent {agent_id!r}")
    return str(parsed)


def graph_type(word: str) -> str:
    """The graph's type for an entityType: a type or a common word for one, else object."""
    return TYPE_WORDS.get(" ".join(word.replace("_", " ").replace("-", " ").casefold().split()), EntityType.OBJECT).value


async def each(read: Callable[[A], Awaitable[T]], items: Iterable[A]) -> list[T]:
    """``read`` of every item, answers in order, at most CONCURRENT_READS in flight."""
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def one(item: A) -> T:
        async with gate:
            return await read(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def relation(fact: FactOut, names: dict[str, str]) -> Relation:
    return Relation.model_validate({"from": names[fact.subject_id], "to": names[fact.object_id],
                                    "relationType": fact.predicate})


class Graph:
    """One namespace's knowledge graph as the reference server shapes it, through the API."""

    def __init__(self, client: AsyncMemoryClient, agent_id: str, namespace: str) -> None:
        self.client, self.agent_id, self.namespace = client, agent_id, namespace

    # Reading.

    async def find(self, name: str) -> EntityOut | None:
        """The namespace's entity of this name (as the graph compares names), if any."""
        key = normalise_name(name)
        if not key:
            return None
        page = await self.client.list_entities(self.agent_id, namespace=self.namespace, name=name, limit=LOOKUP_PAGE)
        return next((entity for entity in page.entities if normalise_name(entity.name) == key), None)

    async def all_entities(self) -> list[EntityOut]:
        found: list[EntityOut] = []
        cursor: str | None = None
        while True:
            page = await self.client.list_entities(self.agent_id, namespace=self.namespace, cursor=cursor,
                                                   limit=MAX_ENTITY_PAGE)
            found += page.entities
            if (cursor := page.next) is None:
                return found

    async def observations(self, entity_id: str | None = None) -> dict[str, list[MemoryRecord]]:
        """The live observations of the entity (or of every entity), oldest first, by entity id."""
        by_entity: dict[str, list[MemoryRecord]] = {}
        async for memory in self.client.iter_memories(self.agent_id, namespace=self.namespace, kinds=["observation"],
                                                      tags=[entity_id] if entity_id else (), page_size=200):
            for tag in memory.tags:
                if tag.startswith("ent_") and (entity_id is None or tag == entity_id):
                    by_entity.setdefault(tag, []).append(memory)
        for memories in by_entity.values():
            memories.sort(key=lambda memory: (memory.created_at, memory.id))
        return by_entity

    async def facts(self, entity: EntityOut) -> tuple[list[FactOut], dict[str, str]]:
        """The entity's current facts of the namespace, and the names of the entities they link."""
        facts: list[FactOut] = []
        names = {entity.id: entity.name}
        cursor: str | None = None
        while True:
            detail = await self.client.get_entity(self.agent_id, entity.id, cursor=cursor, limit=MAX_FACT_PAGE)
            facts += (fact for fact in detail.facts if fact.namespace == self.namespace)
            names.update((neighbour.id, neighbour.name) for neighbour in detail.neighbours)
            if (cursor := detail.next) is None:
                return facts, names

    async def relations(self, entities: list[EntityOut]) -> list[Relation]:
        """The current facts with an end among ``entities``, each once, oldest first."""
        facts: dict[str, FactOut] = {}
        names: dict[str, str] = {}
        for found, named in await each(self.facts, entities):
            facts.update((fact.id, fact) for fact in found)
            names.update(named)
        return [relation(fact, names) for fact in sorted(facts.values(), key=lambda fact: (fact.created_at, fact.id))]

    def shown(self, entity: EntityOut, memories: list[MemoryRecord]) -> Entity:
        prefix = f"{entity.name}: "
        return Entity(name=entity.name, entityType=entity.type.value,
                      observations=[m.content.removeprefix(prefix) for m in memories])

    async def read(self) -> KnowledgeGraph:
        entities = await self.all_entities()
        observations = await self.observations()
        return KnowledgeGraph(entities=[self.shown(e, observations.get(e.id, [])) for e in entities],
                              relations=await self.relations(entities))

    async def search(self, query: str) -> KnowledgeGraph:
        """As the reference: the entities whose name, type or an observation holds the query
        (case aside), and the relations with an end among them."""
        graph = await self.read()
        words = query.casefold()
        entities = [e for e in graph.entities if words in e.name.casefold() or words in e.entityType.casefold()
                    or any(words in o.casefold() for o in e.observations)]
        names = {e.name for e in entities}
        return KnowledgeGraph(entities=entities,
                              relations=[r for r in graph.relations if r.source in names or r.to in names])

    async def open(self, names: list[str]) -> KnowledgeGraph:
        found = {e.id: e for e in await each(self.find, names) if e is not None}
        entities = list(found.values())
        observations = await each(self.observations, [e.id for e in entities])
        return KnowledgeGraph(entities=[self.shown(e, o.get(e.id, [])) for e, o in zip(entities, observations)],
                              relations=await self.relations(entities))

    # Writing.

    async def write(self, items: list[dict[str, Any]]) -> WriteBlocksOut:
        """The items as write blocks (MAX_ITEMS each) of one request, into the namespace."""
        blocks = [items[n:n + MAX_ITEMS] for n in range(0, len(items), MAX_ITEMS)]
        if len(blocks) > MAX_BLOCKS:
            raise ToolError(f"at most {MAX_BLOCKS * MAX_ITEMS} entities, relations and observations in one call")
        text = "\n".join(f"<memory_write>{json.dumps({'items': block}, ensure_ascii=False)}</memory_write>"
                         for block in blocks)
        return await self.client.write_blocks(self.agent_id, text, namespace=self.namespace)

    async def add(self, additions: list[tuple[EntityOut, list[str]]]) -> list[list[str]]:
        """Each entity's observations it does not hold yet, written; the added ones, per entity."""
        held = await each(self.observations, [entity.id for entity, _ in additions])
        added: list[list[str]] = []
        items: list[dict[str, Any]] = []
        for (entity, contents), memories in zip(additions, held):
            shown = set(self.shown(entity, memories.get(entity.id, [])).observations)
            new = [content for content in dict.fromkeys(contents) if content not in shown]
            added.append(new)
            items += ({"kind": "observation", "name": entity.name, "text": f"{entity.name}: {content}",
                       "tags": [entity.id]} for content in new)
        if items:
            answer = await self.write(items)
            for memory in answer.written:  # written before and since deleted: the write block answers it as it is
                if memory.deleted_at is not None:
                    await self.client.memory_undelete(self.agent_id, memory.id)
        return added

    async def create_entities(self, entities: list[EntityIn]) -> list[Entity]:
        """The entities whose names the namespace does not hold yet, with their observations."""
        new: dict[str, EntityIn] = {}  # by the name as the graph compares names: the first of a name
        for entity, held in zip(entities, await each(self.find, [e.name for e in entities])):
            if held is None:
                new.setdefault(normalise_name(entity.name) or entity.name, entity)
        if not new:
            return []
        answer = await self.write([{"kind": "entity", "name": e.name, "type": graph_type(e.entityType)}
                                   for e in new.values()])
        stored = {normalise_name(entity.name): entity for entity in answer.entities}
        # A name the write resolved to another (by an alias the lookup does not read) was held already.
        made = [(stored[key], e.observations) for key, e in new.items() if key in stored]
        added = await self.add([pair for pair in made if pair[1]])
        observations = iter(added)
        return [Entity(name=entity.name, entityType=entity.type.value,
                       observations=next(observations) if contents else []) for entity, contents in made]

    async def add_observations(self, observations: list[ObservationsIn]) -> list[AddedObservations]:
        entities = await each(self.find, [o.entityName for o in observations])
        missing = [o.entityName for o, entity in zip(observations, entities) if entity is None]
        if missing:  # the reference's sentence; nothing is written
            raise ToolError(f"Entity with name {missing[0]} not found")
        added = await self.add([(entity, o.contents) for o, entity in zip(observations, entities) if entity])
        return [AddedObservations(entityName=o.entityName, addedObservations=new) for o, new in zip(observations, added)]

    async def create_relations(self, relations: list[RelationIn]) -> list[Relation]:
        """The relations not held yet, written (an unknown end is created, typed from the relation)."""
        answer = await self.write([{"kind": "edge", "source": r.source, "target": r.to, "rel_type": r.relationType}
                                   for r in relations])
        names = {entity.id: entity.name for entity in answer.entities}
        old = set(answer.already_stored)
        new = {fact.id: fact for fact in answer.facts if fact.id not in old}
        return [relation(fact, names) for fact in new.values()]

    async def delete_observations(self, deletions: list[DeletionIn]) -> None:
        """Soft-delete the observations named (undone by memory_undelete until purged); an
        unknown entity or observation is passed over, as the reference does."""
        entities = await each(self.find, [d.entityName for d in deletions])
        for deletion, entity in zip(deletions, entities):
            if entity is None:
                continue
            doomed = set(deletion.observations)
            for memory in (await self.observations(entity.id)).get(entity.id, []):
                if memory.content.removeprefix(f"{entity.name}: ") in doomed:
                    await self.client.memory_delete(self.agent_id, memory.id)


def register(server: MCPServer, api: Api, agent_id: str, namespace: str) -> None:
    """The reference profile's nine tools, on ``server``, over ``namespace``'s graph."""

    def graph(ctx: Context) -> Graph:
        return Graph(api.client(ctx), agent_id, namespace)

    @server.tool(annotations=writes("Create Entities", destructive=False, idempotent=True))
    async def create_entities(ctx: Context, entities: Annotated[list[EntityIn], Field(max_length=MAX_ITEMS)]
                              ) -> CreatedEntities:
        """Create multiple new entities in the knowledge graph. An entity whose name the graph holds already is
        left as it is (add_observations adds to it); the answer lists the new ones."""
        return CreatedEntities(entities=await api.call(lambda: graph(ctx).create_entities(entities)))

    @server.tool(annotations=writes("Create Relations", destructive=True, idempotent=True))
    async def create_relations(ctx: Context, relations: Annotated[list[RelationIn], Field(max_length=MAX_ITEMS)]
                               ) -> CreatedRelations:
        """Create multiple new relations between entities in the knowledge graph. Relations should be in active
        voice. A relation that holds one value (lives_in, works_at, married_to...) replaces its current one, kept as
        history; the answer lists the new relations."""
        return CreatedRelations(relations=await api.call(lambda: graph(ctx).create_relations(relations)))

    @server.tool(annotations=writes("Add Observations", destructive=False, idempotent=True))
    async def add_observations(ctx: Context,
                               observations: Annotated[list[ObservationsIn], Field(max_length=MAX_ITEMS)]
                               ) -> ObservationResults:
        """Add new observations to existing entities in the knowledge graph"""
        return ObservationResults(results=await api.call(lambda: graph(ctx).add_observations(observations)))

    @server.tool(annotations=reads("Delete Entities (not available)"))
    async def delete_entities(ctx: Context, entityNames: Annotated[list[Name], Field(
            description="An array of entity names to delete")]) -> Outcome:
        """Not available in memory-service, which keeps entities as history: answers an error and changes
        nothing. Delete an entity's observations with delete_observations."""
        raise ToolError(UNDELETABLE)

    @server.tool(annotations=writes("Delete Observations", destructive=True, idempotent=True))
    async def delete_observations(ctx: Context, deletions: Annotated[list[DeletionIn], Field(max_length=MAX_ITEMS)]
                                  ) -> Outcome:
        """Delete specific observations from entities in the knowledge graph"""
        await api.call(lambda: graph(ctx).delete_observations(deletions))
        return Outcome(success=True, message="Observations deleted successfully")

    @server.tool(annotations=reads("Delete Relations (not available)"))
    async def delete_relations(ctx: Context, relations: Annotated[list[RelationIn], Field(
            description="An array of relations to delete")]) -> Outcome:
        """Not available in memory-service, which keeps relations as history (a new value of lives_in, works_at...
        replaces the current one): answers an error and changes nothing."""
        raise ToolError(UNDELETABLE)

    @server.tool(annotations=reads("Read Graph"))
    async def read_graph(ctx: Context) -> KnowledgeGraph:
        """Read the entire knowledge graph"""
        return await api.call(lambda: graph(ctx).read())

    @server.tool(annotations=reads("Search Nodes"))
    async def search_nodes(ctx: Context, query: Annotated[str, Field(min_length=1, max_length=1000, description=(
            "The search query to match against entity names, types, and observation content"))]) -> KnowledgeGraph:
        """Search for nodes in the knowledge graph based on a query"""
        return await api.call(lambda: graph(ctx).search(query))

    @server.tool(annotations=reads("Open Nodes"))
    async def open_nodes(ctx: Context, names: Annotated[list[Name], Field(max_length=MAX_ENTITY_PAGE, description=(
            "An array of entity names to retrieve"))]) -> KnowledgeGraph:
        """Open specific nodes in the knowledge graph by their names"""
        return await api.call(lambda: graph(ctx).open(names))
