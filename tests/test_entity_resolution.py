"""Entity resolution beyond exact names (memory_service/formation/resolution.py and
graph_update.resolve) and its undo (split), on the real embedded FalkorDB and Redis: the
lexical guard, nicknames, name embeddings, ambiguity, never across namespaces, merges in
the audit log, and a split that moves back exactly what came through the alias; bad input
changes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from memory_service.domain.errors import Conflict, InvalidInput, NotFound
from memory_service.domain.graph import EntityType, ExtractedEntity, ExtractedFact, Mention
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import HashEmbedder
from memory_service.formation.graph_update import apply, resolve
from memory_service.formation.resolution import name_match

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
P = EntityType.PERSON


@pytest.mark.parametrize(("new", "old", "type_", "kind"), [
    ("bob", "robert", P, "nickname"),
    ("bob smith", "robert smith", P, "nickname"),
    ("peggy", "margaret", P, "nickname"),
    ("tom", "tom baker", P, "extension"),
    ("j smith", "john smith", P, "initial"),
    ("max", "maximilian", P, "truncation"),
    ("deloite", "deloitte", EntityType.ORGANISATION, "typo"),
    ("bbc", "british broadcasting corporation", EntityType.ORGANISATION, "acronym"),
    ("the hobbit", "hobbit", EntityType.OBJECT, "extension"),
    ("acme", "acme ltd", EntityType.ORGANISATION, "extension"),
    # Not one entity by their form, whatever their embeddings say:
    ("tom", "tim", P, None),
    ("anna", "anne", P, None),
    ("smith", "john smith", P, None),
    ("j", "john", P, None),
    ("manchester", "manchester airport", EntityType.PLACE, None),
    ("mexico", "mexico city", EntityType.PLACE, None),
    ("ivan", "ivana", P, None),
    ("paris", "lyon", EntityType.PLACE, None),
    ("bob", "robert", EntityType.OBJECT, None),  # nicknames are people's
])
def test_the_lexical_guard(new, old, type_, kind):
    assert name_match(new, old, type_) == kind
    assert name_match(old, new, type_) == kind


@pytest.fixture
async def world(service):
    agent = f"er-{uuid.uuid4().hex[:8]}"
    backend = (await service.agents.backend_for(agent))[1]
    embedder = HashEmbedder(64)
    return service, backend, agent, embedder


def person(ns: Namespace, name: str, *aliases: str) -> ExtractedEntity:
    return ExtractedEntity(name=name, type=P, aliases=list(aliases), namespace=str(ns))


async def test_a_nickname_resolves_to_the_stored_entity_and_the_merge_is_logged(world):
    service, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    await apply(backend, agent, [person(alice, "Robert")], [], [], embedder=embedder, audit=service.audit)
    changes = await apply(backend, agent, [person(alice, "Bob")], [], [], embedder=embedder, audit=service.audit)
    [robert] = await backend.find_entities(agent, alice, ["robert"])
    assert robert.aliases == ["Bob"] and changes.merges == [robert.id] and changes.entities == 0
    page = await service.audit.read(agent, action="entity.merge")
    [entry] = page.entries
    assert (entry.key_id, entry.target) == ("formation", robert.id)
    assert entry.after["how"] == "nickname" and "Bob" not in str(entry.after)  # ids, never the name
    # The same window again merges nothing new and logs nothing.
    again = await apply(backend, agent, [person(alice, "Bob")], [], [], embedder=embedder, audit=service.audit)
    assert again.merges == [] and len((await service.audit.read(agent, action="entity.merge")).entries) == 1


async def test_two_users_sharing_a_first_name_are_never_merged(world):
    _, backend, agent, embedder = world
    alice, bob = Namespace.user(agent, "alice"), Namespace.user(agent, "bob")
    await apply(backend, agent, [person(alice, "Tom Baker")], [], [], embedder=embedder)
    # Exactly the name, a nickname, an extension: in bob's namespace each is bob's own Tom.
    for name in ("Tom Baker", "Thomas Baker", "Tom"):
        resolved = await resolve(backend, agent, [person(bob, name)], embedder=embedder, threshold=0.0)
        assert {e.namespace for e in resolved.entities.values()} == {str(bob)} and resolved.merges == []
    await apply(backend, agent, [person(bob, "Tom")], [], [], embedder=embedder, threshold=0.0)
    [alices] = await backend.find_entities(agent, alice, ["tom baker"])
    [bobs] = await backend.find_entities(agent, bob, ["tom"])
    assert alices.id != bobs.id and alices.aliases == [] and bobs.aliases == []
    # Nor across agents: another agent's user of the same id has a graph of its own.
    other = f"{agent}-x"
    await apply(backend, other, [person(Namespace.user(other, "alice"), "Tom")], [], [], embedder=embedder, threshold=0.0)
    assert (await backend.find_entities(agent, alice, ["tom baker"]))[0].aliases == []


async def test_a_weak_form_needs_close_embeddings_and_a_single_candidate(world):
    _, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    await apply(backend, agent, [person(alice, "Tom Baker")], [], [], embedder=embedder)
    # "Tom" extends to "Tom Baker": merged only when the names' embeddings are close enough.
    far = await resolve(backend, agent, [person(alice, "Tom")], embedder=embedder, threshold=0.99)
    assert far.merges == []
    near = await resolve(backend, agent, [person(alice, "Tom")], embedder=embedder, threshold=0.5)
    assert [(m.how, m.alias) for m in near.merges] == [("extension", "Tom")]
    # Without an embedder only exact names and strong forms resolve.
    assert (await resolve(backend, agent, [person(alice, "Tom")], threshold=0.5)).merges == []
    # Two stored Toms: "Tom" is either, so neither.
    await apply(backend, agent, [person(alice, "Tom Hanks")], [], [], embedder=embedder)
    both = await resolve(backend, agent, [person(alice, "Tom")], embedder=embedder, threshold=0.0)
    assert both.merges == [] and both.entities[(str(alice), "tom")].name == "Tom"


async def test_types_do_not_mix(world):
    _, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    await apply(backend, agent, [ExtractedEntity(name="Manchester", type=EntityType.PLACE, namespace=str(alice))],
                [], [], embedder=embedder)
    united = ExtractedEntity(name="Manchester City", type=EntityType.ORGANISATION, namespace=str(alice))
    assert (await resolve(backend, agent, [united], embedder=embedder, threshold=0.0)).merges == []


async def written_memory(backend, agent: str, memory_id: str, content: str) -> None:
    await backend.write([Memory(id=memory_id, kind=MemoryKind.MESSAGE, namespace=str(Namespace.session("s-er")),
                                content=content, metadata=Provenance(agent_id=agent, user_id="alice", session_id="s-er"),
                                valid_at=T0)])


async def test_a_split_moves_back_what_came_through_the_alias(world):
    service, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    ns = str(alice)
    place = ExtractedEntity(name="Leeds", type=EntityType.PLACE, namespace=ns)
    bank = ExtractedEntity(name="Barclays", type=EntityType.ORGANISATION, namespace=ns)
    await written_memory(backend, agent, "m-1", "Robert lives in Leeds")
    await written_memory(backend, agent, "m-2", "Bob works at Barclays")
    await written_memory(backend, agent, "m-3", "Bob, I mean Robert, called")
    await apply(backend, agent, [person(alice, "Robert"), place],
                [ExtractedFact(subject="Robert", predicate="lives_in", object="Leeds", text="Robert lives in Leeds",
                               namespace=ns)], [Mention("m-1", ("robert", "leeds"))], embedder=embedder)
    await apply(backend, agent, [person(alice, "Bob"), bank],
                [ExtractedFact(subject="Bob", predicate="works_at", object="Barclays", text="Bob works at Barclays",
                               namespace=ns)],
                [Mention("m-2", ("bob", "barclays")), Mention("m-3", ("bob", "robert"))], embedder=embedder)
    [robert] = await backend.find_entities(agent, alice, ["robert"])
    merged = await backend.get_entity(agent, robert.id)
    assert robert.aliases == ["Bob"] and {f.predicate for f in merged.facts} == {"lives_in", "works_at"}

    split = await service.split_entity(agent, robert.id, "bob", actor="key-1")
    assert split.entity.aliases == [] and split.split_off.name == "Bob" and split.split_off.namespace == ns
    assert len(split.facts) == 1 and split.mentions == 2  # m-2 and m-3 (which named both)
    kept, bob = await backend.get_entity(agent, robert.id), await backend.get_entity(agent, split.split_off.id)
    assert [f.text for f in kept.facts] == ["Robert lives in Leeds"]
    assert [(f.text, f.id) for f in bob.facts] == [("Bob works at Barclays", next(iter(split.facts.values())))]
    mentioning = await backend.memories_mentioning(agent, [robert.id, bob.entity.id], None, 10)
    assert {m.entity_id: sorted(m.memory_ids) for m in mentioning} == {robert.id: ["m-1", "m-3"],
                                                                        bob.entity.id: ["m-2", "m-3"]}
    # A name found exactly now goes to its own entity; the alias is gone from the first.
    assert [e.id for e in await backend.find_entities(agent, alice, ["bob"])] == [bob.entity.id]
    [entry] = (await service.audit.read(agent, action="entity.split")).entries
    assert (entry.key_id, entry.target, entry.after["split_off"]) == ("key-1", robert.id, bob.entity.id)


async def test_a_split_keeps_the_chain_of_superseded_facts(world):
    service, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    ns = str(alice)
    cities = [ExtractedEntity(name=c, type=EntityType.PLACE, namespace=ns) for c in ("Leeds", "York")]
    await apply(backend, agent, [person(alice, "Robert"), *cities],
                [ExtractedFact(subject="Robert", predicate="lives_in", object="Leeds", text="Robert lives in Leeds",
                               namespace=ns, valid_at=T0)], [], embedder=embedder)
    await apply(backend, agent, [person(alice, "Bob"), *cities],
                [ExtractedFact(subject="Bob", predicate="lives_in", object="York", text="Bob lives in York",
                               namespace=ns, valid_at=T0.replace(month=6))], [], embedder=embedder)
    [robert] = await backend.find_entities(agent, alice, ["robert"])
    split = await service.split_entity(agent, robert.id, "Bob")
    [(old_id, new_id)] = split.facts.items()
    [leeds] = await backend.current_facts(agent, alice, [robert.id], include_superseded=True)
    assert leeds.superseded_by == new_id and (await backend.get_fact(agent, new_id)).text == "Bob lives in York"
    with pytest.raises(NotFound):
        await backend.get_fact(agent, old_id)


async def test_bad_splits_change_nothing(world):
    service, backend, agent, embedder = world
    alice = Namespace.user(agent, "alice")
    await apply(backend, agent, [person(alice, "Robert")], [], [], embedder=embedder)
    await apply(backend, agent, [person(alice, "Bob")], [], [], embedder=embedder)
    [robert] = await backend.find_entities(agent, alice, ["robert"])

    async def state():
        return await backend._read(agent, "MATCH (n) OPTIONAL MATCH (n)-[e]->() RETURN n.uuid AS n, n.aliases AS a, "
                                          "n.name_keys AS k, collect(e.uuid) AS e ORDER BY n")

    before = await state()
    with pytest.raises(NotFound):
        await service.split_entity(agent, "ent_" + "0" * 24, "Bob")
    with pytest.raises(Conflict, match="own name"):
        await service.split_entity(agent, robert.id, "ROBERT")
    with pytest.raises(InvalidInput, match="no alias"):
        await service.split_entity(agent, robert.id, "Rob")
    with pytest.raises(InvalidInput, match="no letter"):
        await service.split_entity(agent, robert.id, "!!")
    assert await state() == before
    assert (await service.audit.read(agent, action="entity.split")).entries == []
