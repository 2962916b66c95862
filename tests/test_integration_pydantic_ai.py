"""The Pydantic AI adapter (memory_service/integrations/pydantic_ai.py) against a real server:
agent runs with Pydantic AI's own test models (FunctionModel, TestModel: no key, no network),
the exchange recorded after each run, the memory block in the instructions, the memory
carried from one session to the next, the toolset, and the failures."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic_ai import Agent, ImageUrl
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from memory_service.client import ConflictError
from memory_service.integrations.pydantic_ai import MemoryCapability

from .integration_support import AGENT, READ_ONLY, USER, memory, memory_server, page_example, recorded, unreachable  # noqa: F401


class Scripted:
    """A FunctionModel's function: answers the scripted responses in turn, keeping the
    instructions each request was sent with."""

    def __init__(self, *responses: ModelResponse):
        self.responses = list(responses)
        self.instructions: list[str | None] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.instructions.append(info.instructions)
        return self.responses.pop(0)


def text(answer: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(answer)])


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return f"Sunny and 24°C in {city}"


async def test_a_run_records_its_exchange_and_the_next_run_only_its_own(memory):
    script = Scripted(ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Lyon"}, tool_call_id="c1")]),
                      text("Sunny in Lyon: pack light."), text("Yes."))
    agent = Agent(FunctionModel(script), instructions="You plan trips.", tools=[get_weather])
    memory_of = MemoryCapability(memory, AGENT, USER, "s-run")
    first = await agent.run("What is the weather in Lyon?", capabilities=[memory_of])
    assert first.output == "Sunny in Lyon: pack light."
    assert await recorded(memory, "s-run") == [
        ("user", "What is the weather in Lyon?"),
        ("tool", 'called get_weather({"city":"Lyon"})'),
        ("tool", "get_weather returned: Sunny and 24°C in Lyon"),
        ("assistant", "Sunny in Lyon: pack light."),
    ]
    await agent.run("Still sunny?", capabilities=[memory_of], message_history=first.all_messages())
    assert (await recorded(memory, "s-run"))[4:] == [("user", "Still sunny?"), ("assistant", "Yes.")]


async def test_memory_formed_in_one_session_is_in_the_next_sessions_instructions(memory):
    script = Scripted(text("Noted: a window seat."), text("Rome, window seat, booked."))
    agent = Agent(FunctionModel(script), instructions="You plan trips.")
    await agent.run("I prefer window seats.", capabilities=[MemoryCapability(memory, AGENT, USER, "s-monday")])
    formed = await memory.form("s-monday")
    assert formed.formed and formed.memories.get("directive") == 1

    await agent.run("Book me a flight to Rome.", capabilities=[MemoryCapability(memory, AGENT, USER, "s-tuesday")])
    assert script.instructions[0] == "You plan trips."  # nothing in memory yet: no block
    assert script.instructions[1].startswith("You plan trips.\n\n<MemoryContext>")
    assert "<Directive>I prefer window seats.</Directive>" in script.instructions[1]


async def test_the_block_leaves_out_what_the_history_already_shows(memory):
    script = Scripted(text("Noted."), text("A window seat."), text("A window seat."))
    agent = Agent(FunctionModel(script))
    memory_of = MemoryCapability(memory, AGENT, USER, "s-window")
    first = await agent.run("I prefer window seats on long flights.", capabilities=[memory_of])
    # Given the history, the model sees the message: the block does not repeat it.
    await agent.run("Which seats do I prefer on long flights?", capabilities=[memory_of], message_history=first.all_messages())
    assert "window seats" not in (script.instructions[1] or "")
    # Without it (a new history, the same session), the block brings it back.
    await agent.run("Which seats do I prefer on long flights?", capabilities=[memory_of])
    assert "I prefer window seats on long flights." in (script.instructions[2] or "")


async def test_the_toolset_holds_the_memory_tools_bound_to_the_user(memory):
    model = TestModel(call_tools=["memory_write", "memory_search"])
    agent = Agent(model)
    await agent.run("Remember my allergy.", capabilities=[MemoryCapability(memory, AGENT, USER, "s-tools")])
    tools = [tool.name for tool in model.last_model_request_parameters.function_tools]
    assert tools == ["memory_search", "memory_get", "memory_write", "memory_update", "memory_correct", "memory_delete",
                     "memory_undelete"]
    written = [m async for m in memory.iter_memories(AGENT, namespace=f"user:{AGENT}:{USER}")]
    assert len(written) == 1 and written[0].kind.value == "observation"
    tool_messages = [content for role, content in await recorded(memory, "s-tools") if role == "tool"]
    assert any(content.startswith("memory_write returned: Remembered as [") for content in tool_messages)

    model = TestModel(call_tools=[])
    await Agent(model).run("Hi", capabilities=[MemoryCapability(memory, AGENT, USER, "s-tools", writes=False)])
    assert [tool.name for tool in model.last_model_request_parameters.function_tools] == ["memory_search", "memory_get"]


async def test_a_refusal_is_the_tools_answer(memory):
    script = Scripted(ModelResponse(parts=[ToolCallPart("memory_write", {"content": "Likes jazz."}, tool_call_id="w")]),
                      text("I could not remember that."))
    result = await Agent(FunctionModel(script)).run(
        "Remember I like jazz.", capabilities=[MemoryCapability(memory, READ_ONLY, USER, "s-refused")])
    returned = [part.content for message in result.new_messages() for part in message.parts
                if part.part_kind == "tool-return"]
    assert returned[0].startswith("memory-service refused (403 PermissionDenied)") and "MEMORY_WRITE_AGENTS" in returned[0]


async def test_a_run_level_capability_replaces_the_agents_own(memory):
    agent = Agent(TestModel(call_tools=[], custom_output_text="Hello."),
                  capabilities=[MemoryCapability(memory, AGENT, USER, "s-default")])
    await agent.run("Hi", capabilities=[MemoryCapability(memory, AGENT, "bob", "s-bob")])
    assert await recorded(memory, "s-bob") == [("user", "Hi"), ("assistant", "Hello.")]
    assert await recorded(memory, "s-default") == []
    await agent.run("Hi again")
    assert await recorded(memory, "s-default") == [("user", "Hi again"), ("assistant", "Hello.")]


async def test_a_streamed_run_is_recorded_once_read_to_its_end(memory):
    agent = Agent(TestModel(call_tools=[], custom_output_text="Hello there."))
    async with agent.run_stream("Hi", capabilities=[MemoryCapability(memory, AGENT, USER, "s-stream")]) as stream:
        assert await stream.get_output() == "Hello there."
    assert await recorded(memory, "s-stream") == [("user", "Hi"), ("assistant", "Hello there.")]


async def test_a_prompt_with_an_image_is_recorded_as_text_with_a_mark(memory):
    agent = Agent(TestModel(call_tools=[], custom_output_text="A cat."))
    await agent.run(["What is this?", ImageUrl("https://example.invalid/cat.png")],
                    capabilities=[MemoryCapability(memory, AGENT, USER, "s-image")])
    assert await recorded(memory, "s-image") == [("user", "What is this?\n[image-url]"), ("assistant", "A cat.")]


async def test_bad_input_is_refused_with_a_clear_error(memory, memory_server):
    with pytest.raises(ValueError, match="session_id must be a non-empty string"):
        MemoryCapability(memory, AGENT, USER, " ")
    with pytest.raises(TypeError, match="AsyncMemoryClient or MemoryClient"):
        MemoryCapability(memory_server.base_url, AGENT, USER, "s")  # type: ignore[arg-type]


async def test_a_refused_record_fails_the_run(memory):
    await memory.record("s-owned", agent_id=READ_ONLY, user_id=USER, role="user", content="mine")
    agent = Agent(TestModel(call_tools=[], custom_output_text="Hello."))
    with pytest.raises(ConflictError, match="belongs to another agent"):
        await agent.run("Hi", capabilities=[MemoryCapability(memory, AGENT, USER, "s-owned")])


async def test_the_service_down_stops_the_run_before_the_model(unreachable):
    script = Scripted(text("never"))
    with pytest.raises(httpx.ConnectError):
        await Agent(FunctionModel(script)).run("Hi", capabilities=[MemoryCapability(unreachable, AGENT, USER, "s-down")])
    assert script.instructions == []


async def test_the_pages_example_runs(memory, memory_server, capsys):
    code = page_example("pydantic-ai.md", "## Example")
    for placeholder in ('API, KEY = "http://127.0.0.1:8080", None', 'MODEL = "openai:gpt-4.1-mini"'):
        assert placeholder in code
    code = code.replace('API, KEY = "http://127.0.0.1:8080", None', f'API, KEY = "{memory_server.base_url}", None')
    code = code.replace('MODEL = "openai:gpt-4.1-mini"', "MODEL = scripted")
    script = Scripted(text("Noted: window seats."), text("Booked, window seat."))
    await asyncio.to_thread(exec, compile(code, "pydantic-ai.md", "exec"), {"__name__": "page", "scripted": FunctionModel(script)})
    assert "<Directive>I prefer window seats.</Directive>" in script.instructions[-1]
    assert "Booked, window seat." in capsys.readouterr().out


def test_request_parts_alone_are_recorded_as_the_users():
    from pydantic_ai.messages import SystemPromptPart, UserPromptPart

    from memory_service.integrations.pydantic_ai import message_turns

    messages = [ModelRequest(parts=[SystemPromptPart("You plan trips."), UserPromptPart("Hi")]),
                ModelResponse(parts=[TextPart("Hello."), TextPart("  ")])]
    assert [(t.role, t.content) for t in message_turns(messages)] == [("user", "Hi"), ("assistant", "Hello.")]
