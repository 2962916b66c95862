"""`memory-service mcp --profile reference`: the reference memory server's nine tools
(@modelcontextprotocol/server-memory), through the official MCP SDK's own client over stdio
and streamable HTTP, against a real API requiring keys. The tools keep the reference's
names and shapes, and what they write is the service's graph and memories: entities by
name, observations as tagged memories, relations as facts (docs/mcp.md, "The reference
profile")."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from memory_service.client import AsyncMemoryClient

from .conftest import clean_env
from .store_state import snapshot
from .test_mcp import AGENT, CLI, answered, api, connected, keys, listed_tools, stdio, text  # noqa: F401 - fixtures

REFERENCE = ["--profile", "reference"]
ALICE_NS = f"user:{AGENT}:alice"
HINTS = {
    "create_entities": (False, False, True, False),
    "create_relations": (False, True, True, False),
    "add_observations": (False, False, True, False),
    "delete_entities": (True, False, True, False),  # never changes anything: it answers why it cannot
    "delete_observations": (False, True, True, False),
    "delete_relations": (True, False, True, False),
    "read_graph": (True, False, True, False),
    "search_nodes": (True, False, True, False),
    "open_nodes": (True, False, True, False),
}
# The reference server's input shapes (src/memory/index.ts): each tool's parameters, and
# the fields of the items of its list parameter.
SHAPES = {
    "create_entities": ({"entities"}, {"name", "entityType", "observations"}),
    "create_relations": ({"relations"}, {"from", "to", "relationType"}),
    "add_observations": ({"observations"}, {"entityName", "contents"}),
    "delete_entities": ({"entityNames"}, None),
    "delete_observations": ({"deletions"}, {"entityName", "observations"}),
    "delete_relations": ({"relations"}, {"from", "to", "relationType"}),
    "read_graph": (set(), None),
    "search_nodes": ({"query"}, None),
    "open_nodes": ({"names"}, None),
}
OUTPUTS = {"create_entities": {"entities"}, "create_relations": {"relations"}, "add_observations": {"results"},
           "delete_entities": {"success", "message"}, "delete_observations": {"success", "message"},
           "delete_relations": {"success", "message"}, "read_graph": {"entities", "relations"},
           "search_nodes": {"entities", "relations"}, "open_nodes": {"entities", "relations"}}


def item_fields(schema: dict[str, Any], parameter: str) -> set[str]:
    items = schema["properties"][parameter]["items"]
    if "$ref" in items:
        items = schema["$defs"][items["$ref"].rsplit("/", 1)[1]]
    return set(items["properties"])


def graph_of(answer: dict[str, Any]) -> tuple[dict[str, tuple[str, list[str]]], list[tuple[str, str, str]]]:
    return ({e["name"]: (e["entityType"], e["observations"]) for e in answer["entities"]},
            sorted((r["from"], r["relationType"], r["to"]) for r in answer["relations"]))


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_the_reference_tools_keep_its_shapes_and_write_the_graph(api, keys, falkordb_url, transport):
    async with connected(transport, api.base_url, keys["agent"], [*REFERENCE, "--namespace", ALICE_NS]) as client:
        tools = await listed_tools(client, HINTS)
        for name, (parameters, fields) in SHAPES.items():
            schema = tools[name].input_schema
            assert set(schema["properties"]) == parameters and set(schema.get("required", [])) == parameters, name
            if fields:
                assert item_fields(schema, next(iter(parameters))) == fields, name
            assert set(tools[name].output_schema["properties"]) == OUTPUTS[name], name

        async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return answered(tools, name, await client.call_tool(name, arguments))

        made = await call("create_entities", {"entities": [
            {"name": "Alice", "entityType": "person", "observations": ["Speaks fluent Spanish", "Likes jazz"]},
            {"name": "Globex", "entityType": "organization", "observations": []},
            {"name": "Bo", "entityType": "pelican", "observations": ["Eats sardines"]}]})
        assert [(e["name"], e["entityType"], e["observations"]) for e in made["entities"]] == [
            ("Alice", "person", ["Speaks fluent Spanish", "Likes jazz"]), ("Globex", "organisation", []),
            ("Bo", "object", ["Eats sardines"])]  # organization: the graph's spelling; pelican: no type, an object
        again = await call("create_entities", {"entities": [{"name": "alice", "entityType": "person",
                                                             "observations": ["Other"]}]})
        assert again["entities"] == []  # the graph holds that name (case aside): left as it is

        related = await call("create_relations", {"relations": [
            {"from": "Alice", "to": "Globex", "relationType": "works at"},
            {"from": "Alice", "to": "Bo", "relationType": "has_pet"}]})
        assert sorted((r["from"], r["relationType"], r["to"]) for r in related["relations"]) == [
            ("Alice", "has_pet", "Bo"), ("Alice", "works_at", "Globex")]
        assert (await call("create_relations", {"relations": [{"from": "Alice", "to": "Bo",
                                                               "relationType": "has_pet"}]}))["relations"] == []

        added = await call("add_observations", {"observations": [
            {"entityName": "Alice", "contents": ["Likes jazz", "Runs marathons"]},
            {"entityName": "Globex", "contents": ["Makes widgets"]}]})
        assert added["results"] == [{"entityName": "Alice", "addedObservations": ["Runs marathons"]},
                                    {"entityName": "Globex", "addedObservations": ["Makes widgets"]}]

        entities, relations = graph_of(await call("read_graph", {}))
        alices = entities.pop("Alice")  # oldest first to the second (memories' times are whole seconds)
        assert alices[0] == "person" and sorted(alices[1]) == ["Likes jazz", "Runs marathons", "Speaks fluent Spanish"]
        assert entities == {"Globex": ("organisation", ["Makes widgets"]), "Bo": ("object", ["Eats sardines"])}
        assert relations == [("Alice", "has_pet", "Bo"), ("Alice", "works_at", "Globex")]

        found, linked = graph_of(await call("search_nodes", {"query": "SARDINE"}))  # an observation, case aside
        assert set(found) == {"Bo"} and linked == [("Alice", "has_pet", "Bo")]
        assert set(graph_of(await call("search_nodes", {"query": "organisation"}))[0]) == {"Globex"}  # a type
        opened, linked = graph_of(await call("open_nodes", {"names": ["Globex", "Nobody"]}))
        assert opened == {"Globex": ("organisation", ["Makes widgets"])}
        assert linked == [("Alice", "works_at", "Globex")]  # a relation with one end among them

        done = await call("delete_observations", {"deletions": [
            {"entityName": "Alice", "observations": ["Likes jazz", "Never said"]},
            {"entityName": "Nobody", "observations": ["x"]}]})
        assert done == {"success": True, "message": "Observations deleted successfully"}
        assert sorted(graph_of(await call("open_nodes", {"names": ["Alice"]}))[0]["Alice"][1]) == [
            "Runs marathons", "Speaks fluent Spanish"]
        back = await call("add_observations", {"observations": [{"entityName": "Alice", "contents": ["Likes jazz"]}]})
        assert back["results"][0]["addedObservations"] == ["Likes jazz"]  # deleted, then added again: it is back
        assert "Likes jazz" in graph_of(await call("open_nodes", {"names": ["Alice"]}))[0]["Alice"][1]

        before = snapshot(falkordb_url, worker_running=True)
        for name, arguments in (("delete_entities", {"entityNames": ["Bo"]}),
                                ("delete_relations", {"relations": [{"from": "Alice", "to": "Bo",
                                                                     "relationType": "has_pet"}]})):
            refused = await client.call_tool(name, arguments)
            assert refused.is_error and "keeps entities and relations as history" in text(refused), name
        assert snapshot(falkordb_url, worker_running=True) == before

    # What they wrote is the service's memory: observations are memories about their entity.
    async with AsyncMemoryClient(api.base_url, keys["agent"]) as service:
        alice = (await service.list_entities(AGENT, namespace=ALICE_NS, name="Alice")).entities[0]
        hits = (await service.search(AGENT, "marathons", scope="user", user_id="alice")).results
        assert hits[0].content == "Alice: Runs marathons" and alice.id in hits[0].tags
        assert {f.text for f in (await service.get_entity(AGENT, alice.id)).facts} == {
            "Alice works at Globex", "Alice has pet Bo"}


async def test_reference_tools_refuse_bad_input_and_change_nothing(api, keys, falkordb_url):
    async with stdio(api.base_url, keys["agent"], extra=REFERENCE) as client:  # the agent's own namespace
        made = await client.call_tool("create_entities", {"entities": [{"name": "Lyon", "entityType": "city",
                                                                        "observations": []}]})
        assert not made.is_error and made.structured_content["entities"][0]["entityType"] == "place"
        before = snapshot(falkordb_url, worker_running=True)
        for name, arguments, named in (
            ("add_observations", {"observations": [{"entityName": "Lyon", "contents": ["On the Rhone"]},
                                                   {"entityName": "Atlantis", "contents": ["Sunk"]}]},
             "Entity with name Atlantis not found"),
            ("create_relations", {"relations": [{"from": "Lyon", "to": "Paris", "relationType": "is near!"}]},
             "relationType"),
            ("create_relations", {"relations": [{"from": "Lyon", "to": "lyon", "relationType": "near"}]},
             "same entity"),
            ("create_entities", {"entities": [{"name": "Paris", "observations": []}]}, "entityType"),
            ("create_entities", {"entities": [{"name": "", "entityType": "city", "observations": []}]}, "name"),
            ("create_entities", {"entities": "Paris"}, "entities"),
            ("add_observations", {"observations": [{"entityName": "Lyon", "contents": [""]}]}, "contents"),
            ("search_nodes", {"query": ""}, "query"),
            ("open_nodes", {}, "names"),
        ):
            refused = await client.call_tool(name, arguments)
            assert refused.is_error and named in text(refused), (name, text(refused))
        assert snapshot(falkordb_url, worker_running=True) == before
    async with stdio(api.base_url, keys["other"], extra=REFERENCE) as client:  # a key of another agent
        refused = await client.call_tool("create_entities", {"entities": [{"name": "Forged", "entityType": "city",
                                                                           "observations": []}]})
        assert refused.is_error and "403" in text(refused)
        assert (await client.call_tool("read_graph", {})).is_error
    assert snapshot(falkordb_url, worker_running=True) == before


def test_the_profile_and_namespace_options_are_checked():
    for args, named in ((["--profile", "fancy"], "--profile"),
                        ([*REFERENCE, "--namespace", "session:s1"], "session holds no entities"),
                        ([*REFERENCE, "--namespace", "user:rival:alice"], "not a namespace of agent"),
                        ([*REFERENCE, "--namespace", "nowhere"], "--namespace"),
                        (["--namespace", f"agent:{AGENT}"], "reference profile")):
        answer = subprocess.run([CLI, "mcp", "--agent", AGENT, *args], capture_output=True, text=True,
                                env=clean_env(), timeout=60)
        assert answer.returncode == 2 and named in answer.stderr, (args, answer.stderr)
