"""`memory-service mcp` through the official MCP SDK's own client: over stdio (the CLI as a
subprocess) and over streamable HTTP (the CLI serving on a port), against a real API that
requires keys. A key of another agent gets an error result naming the API's refusal, and
nothing stored changes."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from memory_service.backends.loopback import LoopbackServer, free_port
from memory_service.client import AsyncMemoryClient
from memory_service.http.app import create_app

from .conftest import clean_env, flush, suite_settings
from .store_state import snapshot

CLI = str(Path(sys.executable).parent / "memory-service")
OPERATOR_KEY = secrets.token_urlsafe(32)
AGENT, OTHER = "acme", "rival"
# Each tool's hints: (readOnlyHint, destructiveHint, idempotentHint, openWorldHint).
HINTS = {
    "memory_record": (False, False, False, False),
    "memory_context": (True, False, True, False),
    "memory_search": (True, False, True, False),
    "memory_get": (True, False, True, False),
    "memory_write": (False, False, False, False),
    "memory_update": (False, True, True, False),
    "memory_correct": (False, True, False, False),
    "memory_delete": (False, True, True, False),
    "memory_undelete": (False, False, True, False),
    "memory_forget": (False, True, True, False),
    "entity_search": (True, False, True, False),
    "entity_get": (True, False, True, False),
    "entity_write": (False, True, True, False),
}
TOOLS = set(HINTS)


@pytest.fixture(scope="module")
async def api(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              memory_write_agents=[AGENT])
    async with LoopbackServer(create_app(settings, run_worker=False)) as server:
        yield server


@pytest.fixture
async def keys(api, falkordb_url) -> dict[str, str]:
    """An admin key of AGENT, one of OTHER, and AGENT's data: a message about a pelican."""
    await flush(falkordb_url)
    async with AsyncMemoryClient(api.base_url, OPERATOR_KEY) as operator:
        made = {name: (await operator.create_key(name=name, role="admin", agents=[agent])).key
                for name, agent in (("agent", AGENT), ("other", OTHER))}
        await operator.record("s1", agent_id=AGENT, user_id="alice", role="user",
                              content="I keep a pelican named Bo.", message_id="m1")
    return made


def stdio(api_url: str, key: str | None, agent: str = AGENT, extra: Sequence[str] = ()) -> Client:
    """`memory-service mcp` over stdio (``extra``: more options, e.g. the profile)."""
    env = {k: v for k, v in clean_env().items() if k != "MEMORY_SERVICE_API_KEY"}
    if key:
        env["MEMORY_SERVICE_API_KEY"] = key
    return Client(StdioServerParameters(command=CLI, args=["mcp", "--transport", "stdio", "--api", api_url,
                                                           "--agent", agent, *extra], env=env))


@asynccontextmanager
async def http_mcp(api_url: str, *extra: str, agent: str = AGENT) -> AsyncIterator[str]:
    """`memory-service mcp --transport http` on a free port; yields its endpoint."""
    port = free_port()
    proc = subprocess.Popen([CLI, "mcp", "--transport", "http", "--port", str(port), "--api", api_url,
                             "--agent", agent, *extra], env=clean_env(), stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # a bound on start-up, not a speed check
            if proc.poll() is not None:
                raise AssertionError(f"mcp exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def over_http(url: str, key: str | None = None, authorization: str | None = None) -> Client:
    headers = {"Authorization": authorization or f"Bearer {key}"} if (key or authorization) else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30)))


def text(result: Any) -> str:
    return " ".join(block.text for block in result.content if getattr(block, "text", None))


@asynccontextmanager
async def connected(transport: str, api_url: str, key: str, extra: Sequence[str] = ()) -> AsyncIterator[Client]:
    """A client of `memory-service mcp` over ``transport`` (stdio or http), calling with ``key``."""
    if transport == "stdio":
        async with stdio(api_url, key, extra=extra) as client:
            yield client
        return
    async with http_mcp(api_url, *extra) as url, over_http(url, key) as client:
        yield client


async def listed_tools(client: Client, hints: dict[str, tuple[bool, bool, bool, bool]]) -> dict[str, Any]:
    """The tools, checked: exactly those of ``hints``, each with those hints, a title and an output schema."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == set(hints)
    for name, tool in tools.items():
        a = tool.annotations
        assert a is not None and a.title, name
        assert (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == hints[name], name
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
        assert tool.description, name
    return tools


def answered(tools: dict[str, Any], name: str, result: Any) -> dict[str, Any]:
    """A successful call's structured content, valid against the tool's output schema."""
    assert not result.is_error, (name, text(result))
    jsonschema.validate(result.structured_content, tools[name].output_schema)
    content: dict[str, Any] = result.structured_content
    return content


async def test_stdio_lists_the_tools_with_schemas_and_searches(api, keys):
    async with stdio(api.base_url, keys["agent"]) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == TOOLS
        search = listed["memory_search"].input_schema
        assert search["required"] == ["query"] and {"scope", "tags", "kinds", "top_k"} <= set(search["properties"])
        assert set(listed["memory_write"].input_schema["required"]) == {"content", "namespace", "kind"}
        assert listed["memory_get"].input_schema["required"] == ["memory_id"]

        found = await client.call_tool("memory_search", {"query": "pelican"})
        assert not found.is_error, text(found)
        assert "pelican" in found.structured_content["results"][0]["content"]

        refused = await client.call_tool("memory_search", {"query": "pelican", "scope": "user"})
        assert refused.is_error and "422" in text(refused) and "user_id" in text(refused)


async def test_stdio_gives_the_memory_block_and_leaves_out_the_hosts_window(api, keys, falkordb_url):
    def memories(result: Any) -> list[str]:
        assert not result.is_error, text(result)
        return [m.text or "" for m in ET.fromstring(result.structured_content["xml"]).iter("Memory")]

    asked = {"user_id": "alice", "session_id": "s1", "query": "my pelican Bo", "budget": 4000}
    async with stdio(api.base_url, keys["agent"]) as client:
        schema = {tool.name: tool for tool in (await client.list_tools()).tools}["memory_context"]
        assert schema.annotations.read_only_hint and schema.input_schema["required"] == ["user_id", "session_id"]
        shown = await client.call_tool("memory_context", asked)
        assert any("pelican" in m for m in memories(shown))
        assert shown.structured_content["budget"] == 4000 and shown.structured_content["recall"]["host_window"] == 0
        windowed = await client.call_tool("memory_context", {**asked, "host_window": 1, "context_type": "task"})
        assert not any("pelican" in m for m in memories(windowed))  # the host sends s1's last message itself
        assert (windowed.structured_content["recall"]["host_window"], windowed.structured_content["context_type"]) == (
            1, "task")

        before = snapshot(falkordb_url, worker_running=True)
        for bad, named in (({"host_window": -1}, "host_window"), ({"host_window": 1001}, "host_window"),
                           ({"budget": 10}, "budget"), ({"budget": 10**8}, "budget"),
                           ({"context_type": "poem"}, "context_type"), ({"user_id": "a:b"}, "user_id")):
            refused = await client.call_tool("memory_context", {**asked, **bad})
            assert refused.is_error and named in text(refused), text(refused)
        assert snapshot(falkordb_url, worker_running=True) == before
    async with stdio(api.base_url, keys["other"]) as client:
        refused = await client.call_tool("memory_context", asked)
    assert refused.is_error and "403" in text(refused) and "pelican" not in text(refused)


async def test_stdio_with_a_key_of_another_agent_names_the_refusal_and_changes_nothing(api, keys, falkordb_url):
    before = snapshot(falkordb_url, worker_running=True)
    async with stdio(api.base_url, keys["other"]) as client:
        refused = await client.call_tool("memory_search", {"query": "pelican"})
    assert refused.is_error and "403" in text(refused) and "pelican" not in text(refused)
    assert AGENT in text(refused)  # the API's sentence: which agent the key does not reach
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_http_passes_each_callers_key_through(api, keys, falkordb_url):
    async with http_mcp(api.base_url) as url:
        async with over_http(url, keys["agent"]) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            found = await client.call_tool("memory_search", {"query": "pelican", "top_k": 1})
            assert not found.is_error, text(found)
            assert len(found.structured_content["results"]) == 1

        before = snapshot(falkordb_url, worker_running=True)
        async with over_http(url, keys["other"]) as client:
            refused = await client.call_tool("memory_search", {"query": "pelican"})
            assert refused.is_error and "403" in text(refused) and "pelican" not in text(refused)
        async with over_http(url) as client:  # no key of its own, and the server has none to lend
            anonymous = await client.call_tool("memory_search", {"query": "pelican"})
            assert anonymous.is_error and "401" in text(anonymous)
        async with over_http(url, authorization=f"Basic {keys['agent']}") as client:
            malformed = await client.call_tool("memory_search", {"query": "pelican"})
            assert malformed.is_error and "Bearer" in text(malformed)
        assert snapshot(falkordb_url, worker_running=True) == before


async def test_http_falls_back_to_the_key_given_at_start_only_for_requests_without_one(api, keys):
    async with http_mcp(api.base_url, "--key", keys["other"]) as url:
        async with over_http(url) as client:  # the fallback: OTHER's key, refused on AGENT
            assert "403" in text(await client.call_tool("memory_search", {"query": "pelican"}))
        async with over_http(url, keys["agent"]) as client:  # the caller's own key wins
            found = await client.call_tool("memory_search", {"query": "pelican"})
            assert not found.is_error, text(found)


def test_a_fixed_key_on_a_reachable_address_is_refused():
    answer = subprocess.run([CLI, "mcp", "--transport", "http", "--host", "0.0.0.0", "--agent", AGENT, "--key", "k"],
                            capture_output=True, text=True, env=clean_env(), timeout=60)
    assert answer.returncode == 2 and "fixed API key" in answer.stderr
    for args, named in ((["--agent", "a:b"], "agent_id"), (["--agent", AGENT, "--transport", "sse"], "--transport"),
                        (["--agent", AGENT, "--api", "ftp://x"], "--api")):
        answer = subprocess.run([CLI, "mcp", *args], capture_output=True, text=True, env=clean_env(), timeout=60)
        assert answer.returncode == 2 and named in answer.stderr, answer.stderr


# The write tools: run once the memory routes are merged (tests/memory_tools.py).


async def test_stdio_curates_a_memory_through_the_write_tools(api, keys, falkordb_url):
    async with stdio(api.base_url, keys["agent"]) as client:
        written = await client.call_tool("memory_write", {"content": "Bo the pelican eats sardines.",
                                                          "namespace": f"agent:{AGENT}", "kind": "fact",
                                                          "title": "Bo's diet", "tags": ["pets"]})
        assert not written.is_error, text(written)
        memory_id = written.structured_content["id"]
        got = await client.call_tool("memory_get", {"memory_id": memory_id})
        assert got.structured_content["tags"] == ["pets"]
        updated = await client.call_tool("memory_update", {"memory_id": memory_id, "confidence": 0.5})
        assert updated.structured_content["confidence"] == 0.5
        deleted = await client.call_tool("memory_delete", {"memory_id": memory_id})
        assert deleted.structured_content["deleted_at"]
        gone = await client.call_tool("memory_search", {"query": "sardines", "tags": ["pets"]})
        assert memory_id not in json.dumps(gone.structured_content["results"])
        back = await client.call_tool("memory_undelete", {"memory_id": memory_id})
        assert back.structured_content["deleted_at"] is None
        # Forget (docs/forget.md): soft, then undone; an unknown id is an error the agent reads.
        forgot = await client.call_tool("memory_forget", {"memory_id": memory_id})
        assert not forgot.is_error and forgot.structured_content["undoable"], text(forgot)
        assert memory_id in forgot.structured_content["memory_ids"]
        assert (await client.call_tool("memory_undelete", {"memory_id": memory_id})).structured_content["deleted_at"] is None
        unknown = await client.call_tool("memory_forget", {"memory_id": "no-such-memory"})
        assert unknown.is_error
        # Expiry (docs/expiry.md): set, cleared by name, refused when past.
        soon = "2999-01-01T00:00:00Z"
        expiring = await client.call_tool("memory_update", {"memory_id": memory_id, "expires_at": soon})
        assert expiring.is_error, text(expiring)  # beyond MEMORY_EXPIRY_MAX_DAYS
        when = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0).isoformat()
        expiring = await client.call_tool("memory_update", {"memory_id": memory_id, "expires_at": when})
        assert datetime.fromisoformat(expiring.structured_content["expires_at"]) == datetime.fromisoformat(when)
        cleared = await client.call_tool("memory_update", {"memory_id": memory_id, "clear": ["expires_at"]})
        assert cleared.structured_content["expires_at"] is None
        past = await client.call_tool("memory_write", {"content": "Never stored.", "namespace": f"agent:{AGENT}",
                                                       "kind": "fact", "expires_at": "2001-01-01T00:00:00Z"})
        assert past.is_error and "has passed" in text(past)
        naive = await client.call_tool("memory_write", {"content": "Never stored.", "namespace": f"agent:{AGENT}",
                                                        "kind": "fact", "expires_at": "2030-01-01T00:00:00"})
        assert naive.is_error
        written = await client.call_tool("memory_write", {"content": "Bo sleeps on the pier.", "kind": "fact",
                                                          "namespace": f"agent:{AGENT}", "expires_at": when})
        assert datetime.fromisoformat(written.structured_content["expires_at"]) == datetime.fromisoformat(when)
        # A correction (docs/corrections.md): the wrong memory kept as history, search finds the right one.
        fixed = await client.call_tool("memory_correct", {"memory_id": written.structured_content["id"],
                                                          "content": "Bo sleeps on the jetty."})
        assert not fixed.is_error, text(fixed)
        answer = fixed.structured_content
        assert answer["corrected"]["corrected_by"] == answer["correction"]["id"]
        assert answer["correction"]["content"] == "Bo sleeps on the jetty." and answer["correction"]["expires_at"]
        again = await client.call_tool("memory_correct", {"memory_id": written.structured_content["id"],
                                                          "content": "Bo sleeps at home."})
        assert again.is_error and "409" in text(again) and "corrected already" in text(again)
        blank = await client.call_tool("memory_correct", {"memory_id": answer["correction"]["id"], "content": ""})
        assert blank.is_error


async def test_stdio_writes_the_graph_through_entity_write(api, keys, falkordb_url):
    items = [{"kind": "entity", "name": "Bo", "type": "pet", "text": "a pelican"},
             {"kind": "edge", "source": "Alice", "target": "Bo", "rel_type": "has_pet"},
             {"kind": "observation", "name": "Bo", "text": "Bo eats sardines", "tags": ["pets"]}]
    async with stdio(api.base_url, keys["agent"]) as client:
        written = await client.call_tool("entity_write", {"items": items, "namespace": f"user:{AGENT}:alice"})
        assert not written.is_error, text(written)
        answer = written.structured_content
        assert [(e["name"], e["type"]) for e in answer["entities"]] == [("Bo", "object"), ("Alice", "person")]
        assert [f["text"] for f in answer["facts"]] == ["Alice has pet Bo"] and answer["already_stored"] == []
        again = await client.call_tool("entity_write", {"items": items, "namespace": f"user:{AGENT}:alice"})
        assert len(again.structured_content["already_stored"]) == 1 + 2 + 1  # the memory, the entities, the fact
        before = snapshot(falkordb_url, worker_running=True)
        bad = await client.call_tool("entity_write", {"items": [{"kind": "edge", "source": "Alice"}],
                                                      "namespace": f"user:{AGENT}:alice"})
        assert bad.is_error and "422" in text(bad) and "items[0].target" in text(bad), text(bad)
        assert snapshot(falkordb_url, worker_running=True) == before


async def test_write_tools_with_a_key_of_another_agent_change_nothing(api, keys, falkordb_url):
    before = snapshot(falkordb_url, worker_running=True)
    async with stdio(api.base_url, keys["other"]) as client:
        refused = await client.call_tool("memory_write", {"content": "Forged.", "namespace": f"agent:{AGENT}",
                                                          "kind": "fact"})
    assert refused.is_error and "403" in text(refused)
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_stdio_update_clears_the_fields_named_in_clear(api, keys, falkordb_url):
    async with stdio(api.base_url, keys["agent"]) as client:
        schema = {tool.name: tool for tool in (await client.list_tools()).tools}["memory_update"].input_schema
        assert "clear" in schema["properties"] and "clear" not in schema.get("required", [])
        arrays = [shape for shape in schema["properties"]["clear"]["anyOf"] if shape["type"] == "array"]
        assert [shape["items"]["enum"] for shape in arrays] == [["title", "confidence", "tags", "expires_at"]]
        written = await client.call_tool("memory_write", {"content": "Bo the pelican sleeps on the pier.",
                                                          "namespace": f"agent:{AGENT}", "kind": "fact",
                                                          "title": "Bo's bed", "tags": ["pets", "pier"],
                                                          "confidence": 0.7})
        assert not written.is_error, text(written)
        memory_id = written.structured_content["id"]

        nulls = await client.call_tool("memory_update", {"memory_id": memory_id, "title": None, "confidence": None,
                                                         "tags": None, "clear": None})
        assert not nulls.is_error, text(nulls)  # null is "unchanged", never a clear
        assert (nulls.structured_content["title"], nulls.structured_content["confidence"],
                nulls.structured_content["tags"]) == ("Bo's bed", 0.7, ["pets", "pier"])

        cleared = await client.call_tool("memory_update", {"memory_id": memory_id, "clear": ["title", "confidence"]})
        assert not cleared.is_error, text(cleared)
        got = (await client.call_tool("memory_get", {"memory_id": memory_id})).structured_content
        assert (got["title"], got["confidence"], got["tags"], got["content"]) == (
            None, None, ["pets", "pier"], "Bo the pelican sleeps on the pier.")

        untagged = await client.call_tool("memory_update", {"memory_id": memory_id, "title": "Bo's bed, again",
                                                            "clear": ["tags"]})
        assert not untagged.is_error, text(untagged)
        assert (untagged.structured_content["tags"], untagged.structured_content["title"]) == ([], "Bo's bed, again")

        before = snapshot(falkordb_url, worker_running=True)
        both = await client.call_tool("memory_update", {"memory_id": memory_id, "title": "New", "confidence": 0.2,
                                                        "clear": ["title", "confidence", "tags"]})
        assert both.is_error and "confidence, title" in text(both) and "both" in text(both), text(both)
        for unclearable in ("content", "kind", "everything"):
            refused = await client.call_tool("memory_update", {"memory_id": memory_id, "clear": [unclearable]})
            assert refused.is_error and "clear" in text(refused) and "'title', 'confidence', 'tags' or 'expires_at'" in text(refused)
        assert snapshot(falkordb_url, worker_running=True) == before


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_tool_is_listed_with_its_hints_and_output_schema_and_answers_it(api, keys, transport):
    """The memory profile over each transport: every tool listed with its four hints, a title
    and an output schema, then called, its structured content valid against that schema."""
    async with connected(transport, api.base_url, keys["agent"]) as client:
        tools = await listed_tools(client, HINTS)
        record = tools["memory_record"].input_schema
        assert set(record["required"]) == {"user_id", "session_id", "role", "content"}
        assert record["$defs"]["Role"]["enum"] == ["user", "assistant", "tool", "system"]

        async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return answered(tools, name, await client.call_tool(name, arguments))

        line = {"user_id": "alice", "session_id": "s1", "role": "user", "content": "Bo sleeps on the pier.",
                "message_id": f"m-{transport}"}
        recorded = await call("memory_record", line)
        assert (recorded["message_id"], recorded["duplicate"], recorded["sequence"]) == (f"m-{transport}", False, 2)
        assert (await call("memory_record", line))["duplicate"] is True  # the same id again: a safe retry
        fresh = await call("memory_record", {**line, "role": "assistant", "content": "Noted.", "message_id": None})
        assert fresh["message_id"] and fresh["sequence"] == 3  # no id: the server's client made one
        block = await call("memory_context", {"user_id": "alice", "session_id": "s1", "query": "where does Bo sleep"})
        assert "pier" in block["xml"]
        assert (await call("memory_search", {"query": "pelican"}))["results"]
        memory = await call("memory_write", {"content": "Bo dislikes rain.", "namespace": f"agent:{AGENT}",
                                             "kind": "fact"})
        assert (await call("memory_get", {"memory_id": memory["id"]}))["content"] == "Bo dislikes rain."
        assert (await call("memory_update", {"memory_id": memory["id"], "tags": ["bo"]}))["tags"] == ["bo"]
        assert (await call("memory_delete", {"memory_id": memory["id"]}))["purge_at"]
        assert (await call("memory_undelete", {"memory_id": memory["id"]}))["deleted_at"] is None
        graph = await call("entity_write", {"items": [{"kind": "edge", "source": "Alice", "target": "Porto",
                                                       "rel_type": "lives_in"}],
                                            "namespace": f"user:{AGENT}:alice"})
        porto = next(e for e in graph["entities"] if e["name"] == "Porto")
        assert [e["id"] for e in (await call("entity_search", {"name": "Por"}))["entities"]] == [porto["id"]]
        assert [f["text"] for f in (await call("entity_get", {"entity_id": porto["id"]}))["facts"]] == [
            "Alice lives in Porto"]


async def test_memory_record_refuses_bad_input_and_changes_nothing(api, keys, falkordb_url):
    line = {"user_id": "alice", "session_id": "s1", "role": "user", "content": "Bo sleeps on the pier.",
            "message_id": "m1"}  # m1 holds "I keep a pelican named Bo." already
    async with stdio(api.base_url, keys["agent"]) as client:
        before = snapshot(falkordb_url, worker_running=True)
        for bad, named in (({"role": "robot"}, "role"), ({"content": ""}, "content"), ({"user_id": "a:b"}, "user_id"),
                           ({"session_id": ""}, "session_id"), ({"created_at": "yesterday"}, "created_at"),
                           ({}, "409")):  # another content under a recorded message's id
            refused = await client.call_tool("memory_record", {**line, **bad})
            assert refused.is_error and named in text(refused), (bad, text(refused))
        assert snapshot(falkordb_url, worker_running=True) == before
    async with stdio(api.base_url, keys["other"]) as client:
        refused = await client.call_tool("memory_record", {**line, "message_id": "m9"})
    assert refused.is_error and "403" in text(refused)
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_a_tool_call_with_the_api_down_is_an_error_result_naming_it():
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with stdio(down, "msk_whatever") as client:
        result = await client.call_tool("memory_search", {"query": "pelican"})
    assert result.is_error and "did not answer" in text(result) and down in text(result), text(result)


async def test_the_host_configurations_of_the_docs_start_the_server(api, keys):
    """docs/mcp.md's stdio entries (mcpServers, as Claude Desktop, Cursor and Claude Code read
    them) parse and start the server that lists its tools, with the API's URL and key swapped
    for the test's."""
    page = (Path(__file__).parent.parent / "docs" / "mcp.md").read_text()
    entries = [entry for block in re.findall(r"```json\n(.*?)```", page, re.S) if "mcpServers" in block
               for entry in json.loads(block)["mcpServers"].values()]
    assert {"command" in entry for entry in entries} == {True, False}  # stdio entries and an HTTP one
    assert all(entry["url"].endswith("/mcp") for entry in entries if "url" in entry)
    for entry in (entry for entry in entries if "command" in entry):
        assert entry["command"] == "memory-service" and entry["args"][0] == "mcp"
        args = list(entry["args"])
        args[args.index("--api") + 1] = api.base_url
        args = [AGENT if arg in ("trip-planner", "assistant") else arg.replace("assistant", AGENT) for arg in args]
        env = {**clean_env(), "MEMORY_SERVICE_API_KEY": keys["agent"]}
        async with Client(StdioServerParameters(command=CLI, args=args, env=env)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == (TOOLS if "reference" not in args else {"create_entities", "create_relations",
               "add_observations", "delete_entities", "delete_observations", "delete_relations", "read_graph",
               "search_nodes", "open_nodes"}), args


async def test_stdio_writes_have_their_secrets_redacted_and_a_refusal_names_the_kind(api, keys, falkordb_url):
    """The write tools go through the API's redaction (docs/redaction.md): what an agent
    writes through MCP keeps no secret, and a policy that refuses answers an error result
    naming the kind, never the value."""
    api_key, password = "sk-proj-Q7xWm2Lp9RtY4vBn8KcZ3dHf6JsA1gUe", "Tr0ub4dor&3x"
    async with stdio(api.base_url, keys["agent"]) as client:
        written = await client.call_tool("memory_write", {"content": f"the deploy key is {api_key}",
                                                          "namespace": f"agent:{AGENT}", "kind": "fact"})
        assert not written.is_error, text(written)
        assert written.structured_content["content"] == "the deploy key is [redacted:api_key]"
        assert written.structured_content["redacted"] == {"api_key": 1}
        items = [{"kind": "entity", "name": "Router", "type": "device", "text": f"admin password: {password}"}]
        graph = await client.call_tool("entity_write", {"items": items, "namespace": f"user:{AGENT}:alice"})
        assert not graph.is_error, text(graph)
        assert graph.structured_content["entities"][0]["summary"] == "admin password: [redacted:password]"
        assert graph.structured_content["redacted"] == {"password": 1}
        async with AsyncMemoryClient(api.base_url, keys["agent"]) as admin:
            await admin.put_agent(AGENT, redaction={"mode": "refuse"})
        before = snapshot(falkordb_url, worker_running=True)
        refused = await client.call_tool("memory_write", {"content": f"my password is {password}",
                                                          "namespace": f"agent:{AGENT}", "kind": "fact"})
        assert refused.is_error and "422" in text(refused) and "holds 1 password" in text(refused), text(refused)
        assert password not in text(refused)
        assert snapshot(falkordb_url, worker_running=True) == before
