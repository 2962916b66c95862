"""The OpenAI Agents SDK adapter (memory_service/integrations/openai_agents.py) against a real
server: Runner.run with the SDK's own scripted model (agents.testing.ScriptedModel: no key,
no network), the items given back whole, their text recorded, the memory carried from one
session to the next, the memory tools, pop and clear, and the failures."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from memory_service.client import ConflictError, MemoryClient
from memory_service.integrations.openai_agents import MemorySession, memory_instructions, memory_tools

from .integration_support import AGENT, READ_ONLY, USER, memory, memory_server, page_example, recorded, unreachable  # noqa: F401


@pytest.fixture(autouse=True, scope="module")
def no_tracing():
    """The SDK exports traces to OpenAI by default: never from the tests."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return f"Sunny and 24°C in {city}"


def planner(session: MemorySession, model: ScriptedModel, *tools) -> Agent:
    return Agent(name="planner", model=model, instructions=memory_instructions(session, "You plan trips."),
                 tools=[*tools, *memory_tools(session)])


async def test_a_run_keeps_every_item_whole_and_records_its_text(memory):
    session = MemorySession("s-items", memory, agent_id=AGENT, user_id=USER)
    model = ScriptedModel([[function_call("get_weather", {"city": "Lyon"}, call_id="call-1")],
                           [assistant_message("Sunny in Lyon: pack light.")]])
    result = await Runner.run(planner(session, model, get_weather), "What is the weather in Lyon?", session=session)
    assert result.final_output == "Sunny in Lyon: pack light."

    items = await session.get_items()
    assert [item.get("type", "message") for item in items] == ["message", "function_call", "function_call_output", "message"]
    assert items[0] == {"role": "user", "content": "What is the weather in Lyon?"}
    assert items[1]["call_id"] == "call-1" and json.loads(items[1]["arguments"]) == {"city": "Lyon"}
    assert items[2] == {"type": "function_call_output", "call_id": "call-1", "output": "Sunny and 24°C in Lyon"}
    assert items[3]["content"][0]["text"] == "Sunny in Lyon: pack light." and items[3]["id"] == "scripted-message"
    assert all("memory_service_message_id" not in item for item in items)
    assert await session.get_items(limit=2) == items[2:]

    assert await recorded(memory, "s-items") == [
        ("user", "What is the weather in Lyon?"),
        ("tool", 'called get_weather({"city":"Lyon"})'),
        ("tool", "get_weather returned: Sunny and 24°C in Lyon"),
        ("assistant", "Sunny in Lyon: pack light."),
    ]
    # The next run sends the model the history as the session gave it back.
    model.extend([[assistant_message("Yes.")]])
    await Runner.run(planner(session, model), "Still sunny?", session=session)
    assert model.last_call.input[:4] == items


async def test_memory_formed_in_one_session_is_in_the_next_sessions_instructions(memory):
    monday = MemorySession("s-monday", memory, agent_id=AGENT, user_id=USER)
    model = ScriptedModel([[assistant_message("Noted: a window seat.")]])
    await Runner.run(planner(monday, model), "I prefer window seats.", session=monday)
    assert "<MemoryContext>" not in model.first_call.system_instructions  # nothing formed yet, the rest is in the history
    formed = await memory.form("s-monday")
    assert formed.formed and formed.memories.get("directive") == 1

    tuesday = MemorySession("s-tuesday", memory, agent_id=AGENT, user_id=USER)
    model = ScriptedModel([[assistant_message("Rome, window seat, booked.")]])
    await Runner.run(planner(tuesday, model), "Book me a flight to Rome.", session=tuesday)
    instructions = model.first_call.system_instructions
    assert instructions.startswith("You plan trips.\n\n<MemoryContext>")
    assert "<Directive>I prefer window seats.</Directive>" in instructions
    assert len(model.first_call.input) == 1  # the new session's history: this run's input alone


async def test_the_memory_tools_write_and_find_the_users_memories(memory):
    session = MemorySession("s-tools", memory, agent_id=AGENT, user_id=USER)
    model = ScriptedModel([
        [function_call("memory_write", {"content": "Alice is allergic to peanuts.", "kind": "fact", "title": None,
                                        "tags": ["health"]}, call_id="w")],
        [function_call("memory_search", {"query": "peanuts allergy", "top_k": 3}, call_id="s")],
        [assistant_message("I will avoid peanuts.")],
    ])
    await Runner.run(planner(session, model), "Remember that I am allergic to peanuts.", session=session)
    outputs = {item["call_id"]: item["output"] for item in await session.get_items()
               if item.get("type") == "function_call_output"}
    assert outputs["w"].startswith("Remembered as [")
    memory_id = outputs["w"].split("[")[1].split("]")[0]
    assert f"[{memory_id}] fact" in outputs["s"] and "allergic to peanuts" in outputs["s"]
    stored = await memory.memory_get(AGENT, memory_id)
    assert (stored.namespace, stored.tags) == (f"user:{AGENT}:{USER}", ["health"])
    assert [t.name for t in memory_tools(session, writes=False)] == ["memory_search", "memory_get"]


async def test_a_refusal_reaches_the_model_as_the_tools_answer(memory):
    session = MemorySession("s-refused", memory, agent_id=READ_ONLY, user_id=USER)  # writes off for this agent
    model = ScriptedModel([
        [function_call("memory_write", {"content": "Likes jazz.", "kind": "observation", "title": None, "tags": None},
                       call_id="w"),
         function_call("memory_get", {"memory_id": "no-such-memory"}, call_id="g")],
        [assistant_message("I could not remember that.")],
    ])
    await Runner.run(planner(session, model), "Remember I like jazz.", session=session)
    outputs = {item["call_id"]: item["output"] for item in await session.get_items()
               if item.get("type") == "function_call_output"}
    assert outputs["w"].startswith("memory-service refused (403 PermissionDenied)") and "MEMORY_WRITE_AGENTS" in outputs["w"]
    assert outputs["g"].startswith("memory-service refused (404 NotFoundError)")


async def test_pop_item_takes_the_item_off_the_history_and_the_service_keeps_its_message(memory):
    session = MemorySession("s-pop", memory, agent_id=AGENT, user_id=USER)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    await session.add_items([{"role": "user", "content": "I prefer aisle seats."}, reasoning,
                             {"role": "user", "content": "Sorry, I meant: I prefer window seats."}])
    assert await session.pop_item() == {"role": "user", "content": "Sorry, I meant: I prefer window seats."}
    assert await session.get_items() == [{"role": "user", "content": "I prefer aisle seats."}, reasoning]
    assert await session.recorded_count() == 1  # the reasoning item was not recorded
    assert await recorded(memory, "s-pop") == [("user", "I prefer aisle seats."),
                                               ("user", "Sorry, I meant: I prefer window seats.")]
    assert await session.pop_item() == reasoning
    assert await session.pop_item() == {"role": "user", "content": "I prefer aisle seats."}
    assert await session.pop_item() is None
    assert len(await recorded(memory, "s-pop")) == 2


async def test_clear_session_empties_the_history_and_the_service_keeps_the_messages(memory):
    session = MemorySession("s-clear", memory, agent_id=AGENT, user_id=USER)
    await session.add_items([{"role": "user", "content": "I prefer window seats."},
                             {"role": "assistant", "content": "Noted."}])
    await session.clear_session()
    assert await session.get_items() == []
    await session.add_items([{"role": "user", "content": "Book Rome."}])
    assert await session.get_items() == [{"role": "user", "content": "Book Rome."}]
    assert [content for _, content in await recorded(memory, "s-clear")] == ["I prefer window seats.", "Noted.", "Book Rome."]


async def test_items_of_other_shapes_are_recorded_readably(memory):
    session = MemorySession("s-shapes", memory, agent_id=AGENT, user_id=USER, max_chars=70)
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": "https://example.invalid/a.png", "detail": "auto"},
                                     {"type": "input_file", "filename": "plan.pdf", "file_data": "JVBERi0="}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "Lyon"}},
        {"role": "user", "content": "x" * 100},
        {"role": "user", "content": "   "},
    ]
    await session.add_items(items)
    assert await session.get_items() == items  # whole, long and blank ones too
    assert await recorded(memory, "s-shapes") == [
        ("system", "Answer briefly."),
        ("user", "What is this?\n[image]\n[file plan.pdf]"),
        ("tool", 'web_search_call: {"action": {"type": "search", "query": "Lyon"}}'),
        ("user", "x" * 69 + "…"),
    ]


async def test_bad_input_is_refused_with_a_clear_error(memory, memory_server):
    with pytest.raises(ValueError, match="agent_id must be a non-empty string"):
        MemorySession("s", memory, agent_id="", user_id=USER)
    with pytest.raises(ValueError, match="user_id must be a non-empty string"):
        MemorySession("s", memory, agent_id=AGENT, user_id=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AsyncMemoryClient or MemoryClient"):
        MemorySession("s", memory_server.base_url, agent_id=AGENT, user_id=USER)  # type: ignore[arg-type]
    session = MemorySession("s-bad", memory, agent_id=AGENT, user_id=USER)
    with pytest.raises(TypeError, match=r"items\[1\] must be an input item"):
        await session.add_items([{"role": "user", "content": "ok"}, "not an item"])  # type: ignore[list-item]
    assert await session.get_items() == [] and await recorded(memory, "s-bad") == []


async def test_the_sync_client_serves_too(memory, memory_server):
    with MemoryClient(memory_server.base_url) as sync_client:
        session = MemorySession("s-sync", sync_client, agent_id=AGENT, user_id=USER)
        model = ScriptedModel([[assistant_message("Hello.")]])
        await Runner.run(planner(session, model), "Hi", session=session)
    assert await recorded(memory, "s-sync") == [("user", "Hi"), ("assistant", "Hello.")]


async def test_a_refused_record_keeps_nothing_in_the_history(memory):
    await memory.record("s-owned", agent_id=READ_ONLY, user_id=USER, role="user", content="mine")
    session = MemorySession("s-owned", memory, agent_id=AGENT, user_id=USER)  # the session is another agent's
    with pytest.raises(ConflictError):
        await session.add_items([{"role": "user", "content": "Hello"}])
    assert await session.get_items() == []


async def test_the_service_down_stops_the_run_and_keeps_nothing(unreachable):
    session = MemorySession("s-down", unreachable, agent_id=AGENT, user_id=USER)
    with pytest.raises(httpx.ConnectError):
        await session.add_items([{"role": "user", "content": "Hello"}])
    assert await session.get_items() == []
    model = ScriptedModel([[assistant_message("never")]])
    with pytest.raises(httpx.ConnectError):
        await Runner.run(planner(session, model), "Hello", session=session)
    assert model.calls == ()


async def test_the_pages_example_runs(memory, memory_server, capsys):
    code = page_example("openai-agents.md", "## Example")
    for placeholder in ('API, KEY = "http://127.0.0.1:8080", None', 'MODEL = "gpt-4.1-mini"'):
        assert placeholder in code
    code = code.replace('API, KEY = "http://127.0.0.1:8080", None', f'API, KEY = "{memory_server.base_url}", None')
    code = code.replace('MODEL = "gpt-4.1-mini"', "MODEL = scripted")
    model = ScriptedModel([[assistant_message("Noted: window seats.")], [assistant_message("Booked, window seat.")]])
    await asyncio.to_thread(exec, compile(code, "openai-agents.md", "exec"), {"__name__": "page", "scripted": model})
    assert "<Directive>I prefer window seats.</Directive>" in model.last_call.system_instructions
    assert "Booked, window seat." in capsys.readouterr().out

