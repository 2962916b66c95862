"""MemoryMiddleware and memory_tools (memory_service/integrations/langgraph/) in LangChain 1.x
agents (create_agent) driven by LangChain's own fake chat model, against a real server;
and the examples of docs/integrations/langgraph.md, run as written.

No API key and no network: the model is langchain_core's GenericFakeChatModel, answering
scripted messages; ``ScriptedModel`` adds what an agent with tools needs of a model
(``bind_tools``, here a no-op: the script already holds the tool calls) and keeps the
messages each call was sent, so a test reads the system prompt the model got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.runtime import Runtime
from pydantic import Field

from memory_service.backends.loopback import free_port
from memory_service.client import AsyncMemoryClient, InvalidRequest, MemoryClient
from memory_service.http.app import create_app
from memory_service.integrations.langgraph import MemoryMiddleware, memory_tools

from .conftest import REPO, suite_settings
from .threaded_server import ThreadedServer

RUN = uuid.uuid4().hex[:6]
WRITER = f"lgw-{RUN}"  # writes on (MEMORY_WRITE_AGENTS), as for WRITERS; the other agents' are off
WRITERS = [f"lgw-{RUN}-{i}" for i in range(10)]
_writers = iter(WRITERS)
DOC_AGENT = "trip-planner"  # the docs page's agent


@pytest.fixture(scope="module")
def agent_server(falkordb_url):
    settings = suite_settings(falkordb_url, memory_write_agents=[WRITER, DOC_AGENT, *WRITERS])
    with ThreadedServer(create_app(settings, run_worker=True)) as server:
        yield server


@pytest.fixture(scope="module")
def memory(agent_server):
    with MemoryClient(agent_server.base_url) as client:
        yield client


@pytest.fixture
def amemory(agent_server):
    return AsyncMemoryClient(agent_server.base_url)


class ScriptedModel(GenericFakeChatModel):
    """GenericFakeChatModel that keeps what it was sent and takes tools (binding them changes nothing)."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def scripted(*answers: AIMessage | str) -> ScriptedModel:
    return ScriptedModel(messages=iter(answers))


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"{name}-{uuid.uuid4().hex[:8]}"}}


def recorded(memory: MemoryClient, agent: str, session: str) -> list[tuple[str | None, str]]:
    """(role, content) of the session's recorded messages, oldest first."""
    messages = [m for m in memory.iter_memories(agent, session_id=session, kinds=["message"])]
    return [(m.provenance.role, m.content) for m in sorted(messages, key=lambda m: m.provenance.sequence or 0)]


def new_agent() -> str:
    return f"lga-{uuid.uuid4().hex[:10]}"


def directive(memory: MemoryClient, user: str, text: str) -> str:
    """A new writer agent holding ``text`` as a directive of ``user``."""
    agent = next(_writers)
    memory.memory_write(agent, content=text, namespace=f"user:{agent}:{user}", kind="directive")
    return agent


def test_the_middleware_records_the_run_and_puts_the_block_into_the_system_prompt(memory):
    agent = directive(memory, "alice", "Always answer in French.")
    model = scripted(AIMessage("Noted: window seats."), AIMessage("Window seat it is."), AIMessage("Hello."))
    graph = create_agent(model, system_prompt="You are a travel agent.",
                         middleware=[MemoryMiddleware(agent, client=memory)], checkpointer=InMemorySaver())
    config = thread("t")
    session = config["configurable"]["thread_id"]
    graph.invoke({"messages": [{"role": "user", "content": "I prefer window seats."}]}, config,
                 context={"user_id": "alice"})
    assert recorded(memory, agent, session) == [("user", "I prefer window seats."), ("assistant", "Noted: window seats.")]
    system = model.seen[0][0]
    assert system.type == "system" and system.content.startswith("You are a travel agent.\n\n<MemoryContext>")
    assert "<Directive>Always answer in French.</Directive>" in system.content

    # The same thread again: only what is new is recorded, nothing twice.
    graph.invoke({"messages": [{"role": "user", "content": "Book the Lisbon flight."}]}, config,
                 context={"user_id": "alice"})
    assert [content for _, content in recorded(memory, agent, session)] == [
        "I prefer window seats.", "Noted: window seats.", "Book the Lisbon flight.", "Window seat it is."]
    assert "Always answer in French." in model.seen[1][0].content
    # A user with nothing to show: the block would be empty, and the prompt is left as it is.
    graph.invoke({"messages": [{"role": "user", "content": "Hi."}]}, thread("t"), context={"user_id": "zoe"})
    assert model.seen[2][0].content == "You are a travel agent."
    assert [m.type for m in graph.get_state(config).values["messages"]] == ["human", "ai", "human", "ai"]  # state untouched


def test_memory_is_carried_from_one_thread_to_the_next(memory):
    agent = new_agent()
    model = scripted(AIMessage("Noted."), AIMessage("Booked."), AIMessage("Hello."))
    graph = create_agent(model, middleware=[MemoryMiddleware(agent, client=memory)], checkpointer=InMemorySaver())
    first = thread("one")
    graph.invoke({"messages": [{"role": "user", "content": "I prefer window seats."}]}, first,
                 context={"user_id": "alice"})
    formed = memory.form(first["configurable"]["thread_id"])
    assert formed.memories
    graph.invoke({"messages": [{"role": "user", "content": "Book me a flight to Lisbon."}]}, thread("two"),
                 context={"user_id": "alice"})
    block = model.seen[1][0].content  # no system prompt of the agent's: the block is the system message
    assert block.startswith("<MemoryContext>") and "<Directive>I prefer window seats.</Directive>" in block
    # Another user's thread holds none of it.
    graph.invoke({"messages": [{"role": "user", "content": "Hello"}]}, thread("three"), context={"user_id": "bob"})
    assert all("window seats" not in m.content for m in model.seen[2])


async def test_the_async_agent_runs_the_same_loop_on_the_async_client(memory, amemory):
    agent = directive(memory, "carol", "Keep answers short.")
    model = scripted(AIMessage("Noted."))
    graph = create_agent(model, system_prompt=[{"type": "text", "text": "Be brief."}],  # type: ignore[arg-type]
                         middleware=[MemoryMiddleware(agent, async_client=amemory, user_id="carol")],
                         checkpointer=InMemorySaver())
    config = thread("async")
    await graph.ainvoke({"messages": [{"role": "user", "content": "My dog is called Bo."}]}, config)
    assert recorded(memory, agent, config["configurable"]["thread_id"]) == [
        ("user", "My dog is called Bo."), ("assistant", "Noted.")]
    system = model.seen[0][0]
    assert system.content[0] == {"type": "text", "text": "Be brief."} and "Keep answers short." in system.content[1]["text"]
    with pytest.raises(RuntimeError, match="blocking client"):
        graph.invoke({"messages": [{"role": "user", "content": "hi"}]}, thread("sync"))


def test_tool_calls_and_answers_are_recorded_and_the_tools_reach_the_runs_user(memory):
    model = scripted(
        AIMessage("", tool_calls=[{"name": "memory_write", "id": "call-1",
                                   "args": {"content": "Alice is allergic to hazelnuts", "kind": "fact",
                                            "tags": ["health"]}}]),
        AIMessage("", tool_calls=[{"name": "memory_search", "id": "call-2", "args": {"query": "hazelnuts allergy"}}]),
        AIMessage("I will remember that."))
    graph = create_agent(model, tools=memory_tools(WRITER, client=memory),
                         middleware=[MemoryMiddleware(WRITER, client=memory)], checkpointer=InMemorySaver())
    config = thread("tools")
    session = config["configurable"]["thread_id"]
    out = graph.invoke({"messages": [{"role": "user", "content": "Remember my allergy."}]}, config,
                       context={"user_id": "alice"})
    written, found = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert '"namespace": "user:' + WRITER + ':alice"' in written.content and '"kind": "fact"' in written.content
    assert "Alice is allergic to hazelnuts" in found.content
    assert [role for role, _ in recorded(memory, WRITER, session)] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"]
    call_line = recorded(memory, WRITER, session)[1][1]
    assert call_line.startswith("[tool call] memory_write(") and "hazelnuts" in call_line
    assert recorded(memory, WRITER, session)[2][1].startswith("[memory_write answered] {")
    # The write is keyed by the tool call's id: the same call run again stores nothing new.
    facts = [m for m in memory.iter_memories(WRITER, user_id="alice") if m.kind == "fact"]
    assert len(facts) == 1


async def test_the_tools_update_delete_and_answer_refusals_to_the_model(memory, amemory):
    tools = {tool.name: tool for tool in memory_tools(WRITER, client=memory, async_client=amemory,
                                                      user_id="dana", session_id="unused")}
    assert set(tools) == {"memory_search", "memory_get", "memory_write", "memory_update", "memory_correct",
                          "memory_delete"}
    assert "runtime" not in tools["memory_write"].tool_call_schema.model_json_schema()["properties"]
    written = memory.memory_write(WRITER, content="Dana likes tea", namespace=f"user:{WRITER}:dana", kind="directive",
                                  title="tea", confidence=0.5)

    def run(name: str, args: dict[str, Any]) -> str:
        return str(tools[name].invoke({"type": "tool_call", "name": name, "id": uuid.uuid4().hex, "args": args}).content)

    assert '"content": "Dana likes tea"' in run("memory_get", {"memory_id": written.id})
    updated = run("memory_update", {"memory_id": written.id, "content": "Dana likes green tea", "clear": ["title"]})
    assert '"content": "Dana likes green tea"' in updated and '"title": null' in updated
    assert memory.memory_get(WRITER, written.id).confidence == 0.5  # what was not named stays
    assert "nothing to change" in run("memory_update", {"memory_id": written.id})
    assert "also given a new value" in run("memory_update", {"memory_id": written.id, "title": "x", "clear": ["title"]})
    assert "NotFoundError (404)" in run("memory_get", {"memory_id": "no-such-memory"})
    wrong = memory.memory_write(WRITER, content="Dana's cat is Tom", namespace=f"user:{WRITER}:dana", kind="fact")
    corrected = json.loads(run("memory_correct", {"memory_id": wrong.id, "content": "Dana's cat is Tim"}))
    assert corrected["correction"]["content"] == "Dana's cat is Tim"
    assert memory.memory_get(WRITER, wrong.id).corrected_by == corrected["correction"]["id"]
    assert "ConflictError (409)" in run("memory_correct", {"memory_id": wrong.id, "content": "Dana's cat is Tam"})
    assert '"deleted_at"' in run("memory_delete", {"memory_id": written.id})
    answer = await tools["memory_get"].ainvoke({"type": "tool_call", "name": "memory_get", "id": "a-1",
                                                "args": {"memory_id": written.id}})
    assert '"deleted_at": "' in answer.content  # the async path, on the async client
    # Writes off for the agent: the model reads why.
    off = {t.name: t for t in memory_tools(new_agent(), client=memory, user_id="dana")}
    refused = off["memory_delete"].invoke({"type": "tool_call", "name": "memory_delete", "id": "x",
                                           "args": {"memory_id": written.id}})
    assert "PermissionDenied (403)" in refused.content and "MEMORY_WRITE_AGENTS" in refused.content
    assert [t.name for t in memory_tools(WRITER, client=memory, read_only=True)] == ["memory_search", "memory_get"]


def test_write_blocks_in_the_models_answer_are_stored_for_the_user(memory):
    answer = ('Noted.\n<memory_write>{"observations": [{"text": "Erin flies to Oslo on May 2nd", '
              '"tags": ["travel"]}]}</memory_write>')
    graph = create_agent(scripted(AIMessage(answer)),
                         middleware=[MemoryMiddleware(WRITER, client=memory, write_blocks=True)],
                         checkpointer=InMemorySaver())
    graph.invoke({"messages": [{"role": "user", "content": "I fly to Oslo on May 2nd."}]}, thread("blocks"),
                 context={"user_id": "erin"})
    stored = [m for m in memory.iter_memories(WRITER, user_id="erin") if m.kind == "observation"]
    assert [m.content for m in stored] == ["Erin flies to Oslo on May 2nd"] and stored[0].tags == ["travel"]


def test_a_server_that_is_down_stops_the_run_unless_the_middleware_is_lenient(caplog):
    down = MemoryClient(f"http://127.0.0.1:{free_port()}", max_retries=0)
    strict = create_agent(scripted(AIMessage("hi")), middleware=[MemoryMiddleware("a", client=down, user_id="u")])
    with pytest.raises(httpx.ConnectError):
        strict.invoke({"messages": [{"role": "user", "content": "hello"}]}, thread("down"))
    model = scripted(AIMessage("hi"))
    lenient = create_agent(model, system_prompt="Sys.",
                           middleware=[MemoryMiddleware("a", client=down, user_id="u", strict=False)])
    with caplog.at_level(logging.WARNING):
        out = lenient.invoke({"messages": [{"role": "user", "content": "hello"}]}, thread("down"))
    assert out["messages"][-1].content == "hi" and model.seen[0][0].content == "Sys."  # called without a block
    assert {r.message.split(" went on")[0] for r in caplog.records} >= {
        "memory service: before_model", "memory service: wrap_model_call", "memory service: after_model"}


def test_refusals_of_the_service_and_missing_identities_are_clear(memory):
    graph = create_agent(scripted(AIMessage("hi")), middleware=[MemoryMiddleware(new_agent(), client=memory)])
    with pytest.raises(ValueError, match="no user for this run"):
        graph.invoke({"messages": [{"role": "user", "content": "hello"}]}, thread("nouser"))
    with pytest.raises(ValueError, match="no session for this run"):
        graph.invoke({"messages": [{"role": "user", "content": "hello"}]}, context={"user_id": "u"})
    from memory_service.integrations.langgraph import NotRecorded

    too_long = create_agent(scripted(AIMessage("hi")), middleware=[MemoryMiddleware(new_agent(), client=memory)])
    with pytest.raises(NotRecorded, match="refused"):
        too_long.invoke({"messages": [{"role": "user", "content": "x" * 40_000}]}, thread("long"),
                        context={"user_id": "u"})
    with pytest.raises(ValueError, match="context_options"):
        MemoryMiddleware("a", client=memory, context_options={"user_id": "x"})
    tiny = create_agent(scripted(AIMessage("hi")),
                        middleware=[MemoryMiddleware(new_agent(), client=memory, context_options={"budget": 1})])
    with pytest.raises(InvalidRequest, match="budget"):  # the service's 422, naming the field
        tiny.invoke({"messages": [{"role": "user", "content": "hello"}]}, thread("tiny"), context={"user_id": "u"})


# The docs page's examples, run as written against the server.

def doc_blocks() -> list[str]:
    page = (REPO / "docs/integrations/langgraph.md").read_text()
    blocks, start = [], 0
    while (start := page.find("```python\n", start)) != -1:
        end = page.index("```", start + 10)
        blocks.append(page[start + 10:end])
        start = end + 3
    return [block for block in blocks if "API, KEY =" in block]


def test_the_docs_pages_examples_run(agent_server, capsys):
    blocks = doc_blocks()
    assert len(blocks) == 2
    for block in blocks:
        code = block.replace('API, KEY = "http://127.0.0.1:8080", None', f'API, KEY = "{agent_server.base_url}", None')
        assert code != block
        exec(compile(code, "docs/integrations/langgraph.md", "exec"), {"__name__": "docs"})
    out = capsys.readouterr().out
    assert "<Directive>I prefer window seats.</Directive>" in out  # thread 2's system prompt
    assert "{'city': 'Lisbon', 'month': 'June', 'seat': 'window'}" in out and "('users', 'alice', 'trips')" in out


async def test_the_examples_hooks_and_tools_run_concurrently_on_one_async_client(memory, amemory):
    graphs = [create_agent(scripted(AIMessage(f"answer {i}")),
                           middleware=[MemoryMiddleware(WRITER, async_client=amemory)], checkpointer=InMemorySaver())
              for i in range(4)]
    configs = [thread(f"c{i}") for i in range(4)]
    await asyncio.gather(*(g.ainvoke({"messages": [{"role": "user", "content": f"question {i}"}]}, c,
                                     context={"user_id": f"user{i}"})
                           for i, (g, c) in enumerate(zip(graphs, configs, strict=True))))
    for i, config in enumerate(configs):
        assert recorded(memory, WRITER, config["configurable"]["thread_id"]) == [
            ("user", f"question {i}"), ("assistant", f"answer {i}")]


async def test_a_graph_reads_and_writes_the_store_through_its_runtime(memory, amemory):
    from typing_extensions import TypedDict

    from memory_service.integrations.langgraph import MemoryServiceStore

    class State(TypedDict, total=False):
        text: str
        found: list[str]

    def remember(state: State, runtime: Runtime) -> State:
        runtime.store.put(("notes", "alice"), "n1", {"text": state["text"]})
        return {"found": [item.value["text"] for item in runtime.store.search(("notes",), query="window seats")]}

    async def aremember(state: State, runtime: Runtime) -> State:
        await runtime.store.aput(("notes", "alice"), "n2", {"text": state["text"]})
        return {"found": [item.key for item in await runtime.store.asearch(("notes", "alice"))]}

    store = MemoryServiceStore(next(_writers), client=memory, async_client=amemory)
    graph = StateGraph(State).add_node("remember", remember).add_edge(START, "remember").compile(store=store)
    assert (await asyncio.to_thread(graph.invoke, {"text": "window seats"}))["found"] == ["window seats"]
    agraph = StateGraph(State).add_node("remember", aremember).add_edge(START, "remember").compile(store=store)
    assert sorted((await agraph.ainvoke({"text": "aisle seats"}))["found"]) == ["n1", "n2"]
