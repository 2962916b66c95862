"""An OpenAI-compatible chat endpoint that answers from the request itself, on loopback.

The worker tests and the formation benchmark run the real LLM extractor (the real
``openai`` client, real HTTP) against it. It reads the numbered message lines the
extractor sends and answers in the requested JSON schema: an episode, one directive per
user message that states a preference, and one fact per shard from the messages that
mention the shard's id. Asked to consolidate, it lists the new items newest first, then
the current memory's lines, each once. Faults are scripted: answer the next calls with an HTTP error,
or hold them until released (to kill a worker in the middle of a call).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from memory_service.stores.loopback import LoopbackServer

_LINE = re.compile(r'^\[(\d+)\] (user (\S+)|assistant): (".*")$')


@dataclass
class EchoLLM:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: list[int] = field(default_factory=list)  # statuses to answer the next calls with
    hold: asyncio.Event | None = None  # while set to an unset Event, calls wait on it
    held: int = 0  # calls waiting on ``hold`` now
    schemas: list[str] = field(default_factory=list)  # the schema name of every call answered
    # Answer each extraction differently, as a real model does: the k-th answer marks its
    # directives "(answer k)" and holds k of them (up to the schema's cap).
    drift: bool = False
    extractions: int = 0  # extraction calls answered

    def __post_init__(self) -> None:
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._complete)
        self._server = LoopbackServer(self.app)
        self.base_url = f"{self._server.base_url}/v1"

    async def start(self) -> EchoLLM:
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        await self._server.stop()

    async def _complete(self, request: Request):
        body = await request.json()
        self.calls += 1
        if self.hold is not None and not self.hold.is_set():
            self.held += 1
            try:
                await self.hold.wait()
            finally:
                self.held -= 1
        if self.failures:
            status = self.failures.pop(0)
            return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
        prompt = body["messages"][-1]["content"]
        schema = body["response_format"]["json_schema"]
        self.schemas.append(schema["name"])
        if schema["name"] == "memory_consolidation":
            reply = consolidate(prompt)
        else:
            self.extractions += 1
            reply = answer(prompt, schema["schema"], take=self.extractions if self.drift else None)
        content = json.dumps(reply)
        prompt_tokens, completion_tokens = len(json.dumps(body)) // 4, len(content) // 4
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        return {
            "id": f"echo-{self.calls}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def answer(prompt: str, schema: dict, take: int | None = None) -> dict:
    """A reply in ``schema`` built from the prompt's numbered message lines (``take``: see
    ``EchoLLM.drift``)."""
    messages = []
    for line in prompt.splitlines():
        if match := _LINE.match(line):
            messages.append((int(match.group(1)), match.group(3), json.loads(match.group(4))))
    episode = " ".join(text.split(".")[0] + "." for _, _, text in messages)
    directives = [{"user_id": user, "content": text, "messages": [n]}
                  for n, user, text in messages if user and "prefer" in text.lower()]
    directives = directives[: schema["properties"]["directives"]["maxItems"]]
    if take is not None:
        directives = [{**d, "content": f"{d['content']} (answer {take})"} for d in directives[:take]]
    reply: dict = {"episode": " ".join(episode.split()[:50]), "directives": directives}
    if "shards" in schema["properties"]:
        shard_ids = schema["properties"]["shards"]["items"]["properties"]["shard_id"]["enum"]
        reply["shards"] = [
            {"shard_id": shard, "suggestions": [],
             "facts": [{"content": f"{user or 'assistant'}: {text}", "messages": [n]}
                       for n, user, text in messages if shard in text.lower()][:1]}
            for shard in shard_ids
        ]
    return reply


_ITEM = re.compile(r'^\[(\d+)\] (".*")$')


def consolidate(prompt: str) -> dict:
    """The new items newest first, then the current memory's lines, each once."""
    previous, items = "", []
    for line in prompt.splitlines():
        if line.startswith("Current memory: "):
            previous = json.loads(line.removeprefix("Current memory: "))
        elif match := _ITEM.match(line):
            items.append(json.loads(match.group(2)))
    lines = [f"- {item}" for item in reversed(items)] + [line for line in previous.splitlines() if line.strip()]
    return {"memory": "\n".join(dict.fromkeys(lines))}
