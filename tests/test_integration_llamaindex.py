"""The LlamaIndex adapter (memory_service/integrations/llamaindex.py) against a real server:
a chat engine and a FunctionAgent over LlamaIndex's own mock LLMs (no key, no network), each
message recorded as it is put, the memory block before the history, the memory carried from
one session to the next, the block inside LlamaIndex's Memory, the sync methods, and the
failures."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import Memory

from memory_service.client import ConflictError, MemoryClient
from memory_service.integrations.llamaindex import MemoryServiceBlock, MemoryServiceMemory, memory_tools

from .integration_support import AGENT, READ_ONLY, USER, memory, memory_server, page_example, recorded, unreachable  # noqa: F401


class Scripted(MockFunctionCallingLLM):
    """LlamaIndex's mock function-calling LLM answering scripted messages in turn; ``seen``
    keeps the messages of each call."""

    def __init__(self, *answers: ChatMessage | str):
        replies = [a if isinstance(a, ChatMessage) else ChatMessage(role="assistant", content=a) for a in answers]
        seen: list[list[ChatMessage]] = []

        def respond(messages, **kwargs) -> ChatMessage:
            seen.append(list(messages))
            return replies.pop(0)

        super().__init__(response_generator=respond)
        self._seen = seen

    @property
    def seen(self) -> list[list[ChatMessage]]:
        return self._seen


def session_memory(client, session_id: str, **kwargs) -> MemoryServiceMemory:
    return MemoryServiceMemory(client=client, agent_id=kwargs.pop("agent_id", AGENT), user_id=USER,
                               session_id=session_id, **kwargs)


async def test_a_chat_records_each_message_and_keeps_the_history(memory):
    chat_memory = session_memory(memory, "s-chat")
    llm = Scripted("A window seat, then.", "Yes, Lisbon.")
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory, system_prompt="You plan trips.")
    assert str(await engine.achat("I prefer window seats.")) == "A window seat, then."
    await engine.achat("Is Lisbon nice in May?")
    assert await recorded(memory, "s-chat") == [("user", "I prefer window seats."), ("assistant", "A window seat, then."),
                                                ("user", "Is Lisbon nice in May?"), ("assistant", "Yes, Lisbon.")]
    assert [m.content for m in await chat_memory.aget_all()] == [content for _, content in await recorded(memory, "s-chat")]
    second = llm.seen[1]
    assert second[0].content == "You plan trips." and second[-1].content == "Is Lisbon nice in May?"
    # Nothing formed yet, and the history shows the session's messages: the block is empty, so absent.
    assert [m.role for m in second] == [MessageRole.SYSTEM, MessageRole.USER, MessageRole.ASSISTANT, MessageRole.USER]


async def test_memory_formed_in_one_session_is_in_the_next_sessions_messages(memory):
    llm = Scripted("Noted: a window seat.", "Rome, window seat, booked.")
    await SimpleChatEngine.from_defaults(llm=llm, memory=session_memory(memory, "s-monday")).achat("I prefer window seats.")
    formed = await memory.form("s-monday")
    assert formed.formed and formed.memories.get("directive") == 1

    await SimpleChatEngine.from_defaults(llm=llm, memory=session_memory(memory, "s-tuesday"),
                                         system_prompt="You plan trips.").achat("Book me a flight to Rome.")
    sent = llm.seen[1]
    assert [m.role for m in sent] == [MessageRole.SYSTEM, MessageRole.SYSTEM, MessageRole.USER]
    assert sent[1].content.startswith("<MemoryContext>") and "<Directive>I prefer window seats.</Directive>" in sent[1].content


async def test_a_function_agent_records_its_tool_calls_and_their_results(memory):
    chat_memory = session_memory(memory, "s-agent")
    llm = Scripted(ChatMessage(role="assistant", blocks=[
                       ToolCallBlock(tool_call_id="w", tool_name="memory_write",
                                     tool_kwargs={"content": "Alice is allergic to peanuts.", "kind": "fact"})]),
                   "I will avoid peanuts.")
    agent = FunctionAgent(llm=llm, tools=memory_tools(chat_memory), system_prompt="You plan trips.")
    assert str(await agent.run("Remember that I am allergic to peanuts.", memory=chat_memory)) == "I will avoid peanuts."
    messages = await recorded(memory, "s-agent")
    assert messages[:2] == [("user", "Remember that I am allergic to peanuts."),
                            ("tool", 'called memory_write({"content": "Alice is allergic to peanuts.", "kind": "fact"})')]
    assert messages[2][0] == "tool" and messages[2][1].startswith("memory_write returned: Remembered as [")
    assert messages[3] == ("assistant", "I will avoid peanuts.")
    written = [m async for m in memory.iter_memories(AGENT, namespace=f"user:{AGENT}:{USER}")]
    assert [(m.kind.value, m.content) for m in written] == [("fact", "Alice is allergic to peanuts.")]
    assert [tool.metadata.name for tool in memory_tools(chat_memory, writes=False)] == ["memory_search", "memory_get"]


async def test_a_refusal_is_the_tools_answer(memory):
    chat_memory = session_memory(memory, "s-refused", agent_id=READ_ONLY)
    [write] = [tool for tool in memory_tools(chat_memory) if tool.metadata.name == "memory_write"]
    answer = await write.acall(content="Likes jazz.")
    assert str(answer).startswith("memory-service refused (403 PermissionDenied)") and "MEMORY_WRITE_AGENTS" in str(answer)


async def test_the_block_in_llamaindexs_memory_records_what_it_flushes(memory):
    block = MemoryServiceBlock(client=memory, agent_id=AGENT, user_id=USER, session_id="s-flush")
    short_term = Memory.from_defaults(session_id="s-flush", token_limit=60, chat_history_token_ratio=0.5,
                                      token_flush_size=20, memory_blocks=[block])
    said = [f"Message {i}: a trip to Lisbon in May." for i in range(6)]
    for text in said:
        await short_term.aput(ChatMessage(role="user", content=text))
    flushed = [content for _, content in await recorded(memory, "s-flush")]
    messages = await short_term.aget()
    assert messages[0].role == MessageRole.SYSTEM and "<memory_service>" in messages[0].content
    # Each message in one place for the model: flushed to the service, or still in the short-term queue.
    assert flushed and flushed + [m.content for m in messages[1:]] == said
    assert flushed[0] in messages[0].content  # the service's block shows a flushed message as relevant


async def test_set_and_reset_change_the_history_only(memory):
    chat_memory = session_memory(memory, "s-reset")
    await chat_memory.aput(ChatMessage(role="user", content="I prefer window seats."))
    await chat_memory.aset([ChatMessage(role="user", content="(an earlier conversation)")])
    assert [m.content for m in await chat_memory.aget_all()] == ["(an earlier conversation)"]
    await chat_memory.areset()
    assert await chat_memory.aget_all() == []
    assert await recorded(memory, "s-reset") == [("user", "I prefer window seats.")]


async def test_history_limit_and_the_block_before_it(memory):
    await memory.record("s-old", agent_id=AGENT, user_id=USER, role="user", content="I prefer window seats.")
    await memory.form("s-old")
    chat_memory = session_memory(memory, "s-limit", history_limit=2)
    await chat_memory.aput_messages([ChatMessage(role="user", content=f"Turn {i}") for i in range(4)])
    messages = await chat_memory.aget()
    assert [m.content for m in messages[1:]] == ["Turn 2", "Turn 3"] and "window seats" in messages[0].content
    assert len(await chat_memory.aget_all()) == 4


async def test_messages_of_other_shapes_are_recorded_readably(memory):
    chat_memory = session_memory(memory, "s-shapes", max_chars=40)
    await chat_memory.aput_messages([
        ChatMessage(role="system", content="Answer briefly."),
        ChatMessage(role="user", blocks=[TextBlock(text="What is this?"), ImageBlock(url="https://example.invalid/a.png")]),
        ChatMessage(role="tool", content="Sunny", additional_kwargs={"tool_call_id": "c1", "name": "get_weather"}),
        ChatMessage(role="user", content="x" * 60),
        ChatMessage(role="user", content="  "),
    ])
    assert len(await chat_memory.aget_all()) == 5
    assert await recorded(memory, "s-shapes") == [("system", "Answer briefly."), ("user", "What is this?\n[image]"),
                                                  ("tool", "get_weather returned: Sunny"), ("user", "x" * 39 + "…")]


async def test_the_sync_methods_serve_with_the_sync_client(memory, memory_server):
    llm = Scripted("Hello.", "Hello again.")

    def chat() -> list[str]:
        with MemoryClient(memory_server.base_url) as sync_client:
            chat_memory = session_memory(sync_client, "s-sync")
            engine = SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory)
            engine.chat("Hi")
            engine.chat("Hi again")
            return [m.content for m in chat_memory.get_all()]

    assert await asyncio.to_thread(chat) == ["Hi", "Hello.", "Hi again", "Hello again."]
    assert len(await recorded(memory, "s-sync")) == 4


async def test_the_sync_methods_refuse_the_async_client_clearly(memory):
    chat_memory = session_memory(memory, "s-async-only")
    with pytest.raises(TypeError, match="the sync methods need a memory_service.client.MemoryClient"):
        chat_memory.put(ChatMessage(role="user", content="Hi"))
    assert await chat_memory.aget_all() == [] and await recorded(memory, "s-async-only") == []


async def test_bad_input_is_refused_with_a_clear_error(memory):
    with pytest.raises(ValueError, match="user_id must be a non-empty string"):
        MemoryServiceMemory(client=memory, agent_id=AGENT, user_id="", session_id="s")
    with pytest.raises(TypeError, match="AsyncMemoryClient or MemoryClient"):
        MemoryServiceBlock(client="http://127.0.0.1:8080", agent_id=AGENT, user_id=USER, session_id="s")


async def test_a_refused_record_keeps_nothing_in_the_history(memory):
    await memory.record("s-owned", agent_id=READ_ONLY, user_id=USER, role="user", content="mine")
    chat_memory = session_memory(memory, "s-owned")
    with pytest.raises(ConflictError, match="belongs to another agent"):
        await chat_memory.aput(ChatMessage(role="user", content="Hello"))
    assert await chat_memory.aget_all() == []


async def test_the_service_down_fails_the_chat_and_keeps_nothing(unreachable):
    chat_memory = session_memory(unreachable, "s-down")
    llm = Scripted("never")
    with pytest.raises(httpx.ConnectError):
        await SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory).achat("Hello")
    assert await chat_memory.aget_all() == [] and llm.seen == []


async def test_the_pages_example_runs(memory, memory_server, capsys):
    code = page_example("llamaindex.md", "## Example")
    for placeholder in ('API, KEY = "http://127.0.0.1:8080", None', "LLM = OpenAI(model=\"gpt-4.1-mini\")",
                        "from llama_index.llms.openai import OpenAI"):
        assert placeholder in code
    code = code.replace('API, KEY = "http://127.0.0.1:8080", None', f'API, KEY = "{memory_server.base_url}", None')
    code = code.replace("from llama_index.llms.openai import OpenAI\n", "")
    code = code.replace("LLM = OpenAI(model=\"gpt-4.1-mini\")", "LLM = scripted")
    llm = Scripted("Noted: window seats.", "Booked, window seat.")
    await asyncio.to_thread(exec, compile(code, "llamaindex.md", "exec"), {"__name__": "page", "scripted": llm})
    assert any("<Directive>I prefer window seats.</Directive>" in (m.content or "") for m in llm.seen[-1])
    assert "Booked, window seat." in capsys.readouterr().out
