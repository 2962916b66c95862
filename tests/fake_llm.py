"""An OpenAI-compatible chat endpoint that answers from the request itself, on loopback.

The worker tests and the formation benchmark run the real LLM extractor (the real
``openai`` client, real HTTP) against it. It reads the numbered message lines the
extractor sends and answers in the requested JSON schema: an episode, one directive per
user message that states a preference, one fact per shard from the messages that
mention the shard's id, and (when the schema asks for the graph) the entities and facts
the offline ``extract_graph`` reads in the numbered lines, superseding every known fact
listed in the prompt whose subject and single-valued predicate a new fact gives another
object (as a model that follows the prompt would). Asked to consolidate, it lists the new items newest first, then
the current memory's lines, each once. Faults are scripted: answer the next calls with an HTTP error,
or hold them until released (to kill a worker in the middle of a call).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.graph import SINGLE_VALUED, normalise_name
from memory_service.domain.models import Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.entities import extract_graph
from memory_service.formation.extractor import Window, WindowMessage

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
    last_prompt: str = ""  # the user message of the last extraction call (a sample for the benchmark)

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
            self.last_prompt = prompt
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
    directives = [{"user_id": user, "content": text, "messages": [n], "holds": "in later conversations"}
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
    if "entities" in schema["properties"]:
        reply |= graph(prompt, messages, schema)
    return reply


_KNOWN = re.compile(r"^fact (\d+): [^;]+; (.+?) ([a-z][a-z0-9_]*) (.+?); [^;]+; \".*\"$")
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


def graph(prompt: str, messages: list[tuple[int, str | None, str]], schema: dict) -> dict:
    """Entities and facts as ``extract_graph`` reads the numbered lines, and the known facts
    they supersede."""
    shown, last_user = [], ""
    for n, user, text in messages:
        last_user = user or last_user
        shown.append(WindowMessage(message_id=str(n), sequence=n, role=Role.USER if user else Role.ASSISTANT,
                                   user_id=user or last_user, content=text, created_at=T0 + timedelta(seconds=n)))
    entities, facts = extract_graph(Window(agent_id="echo", session_id="echo", messages=tuple(shown)))
    props = schema["properties"]
    labels = set(props["entities"]["items"]["properties"]["namespace"].get("enum", ()))

    def label(namespace: str) -> str:
        return f"user:{Namespace.parse(namespace).fields[-1]}"

    out_entities = [{"name": e.name, "type": e.type.value, "aliases": e.aliases, "summary": e.summary,
                     "namespace": label(e.namespace)} for e in entities if label(e.namespace) in labels]
    out_facts = [{"subject": f.subject, "predicate": f.predicate, "object": f.object, "text": f.text,
                  "valid_at": f.valid_at.date().isoformat() if f.valid_at else "",
                  "messages": [int(m) for m in f.message_ids]} for f in facts if label(f.namespace) in labels]
    out_entities = out_entities[: props["entities"]["maxItems"]]
    out_facts = out_facts[: props["facts"]["maxItems"]]
    new = {(normalise_name(f["subject"]), f["predicate"]): normalise_name(f["object"]) for f in out_facts}
    supersedes = []
    for line in prompt.splitlines():
        if (match := _KNOWN.match(line)) and match.group(3) in SINGLE_VALUED:
            obj = new.get((normalise_name(match.group(2)), match.group(3)))
            if obj is not None and obj != normalise_name(match.group(4)):
                supersedes.append(int(match.group(1)))
    return {"entities": out_entities, "facts": out_facts, "supersedes": supersedes[: props["supersedes"]["maxItems"]]}


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
