"""An OpenAI-compatible embeddings endpoint on loopback, for the tests of the OpenAI
embedder and of a service whose embedder fails.

It answers ``POST /v1/embeddings`` with the deterministic hash embedder's vectors (so the
service's vector search still ranks sensibly), scaled and in reverse order so that the
client must normalise and sort. Faults are scripted: ``failures`` answers the next calls
with those statuses, ``down`` answers 503 until it is unset, ``delay`` holds every call, and
``hold`` (an event) holds every call until it is set. ``seen`` counts each text it embedded.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from memory_service.backends.loopback import LoopbackServer
from memory_service.embedding.embedders import HashEmbedder


@dataclass
class EmbeddingsServer:
    """POST /v1/embeddings answered with hash vectors (scaled by 3: the client must normalise),
    returned in reverse order with their indexes (the client must sort)."""

    dimension: int = 48
    api_key: str | None = "sk-test"
    failures: list[int | None] = field(default_factory=list)  # statuses for the next calls (None: answer)
    delay: float = 0.0
    batches: list[int] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)  # text -> how many times it was embedded
    calls: int = 0
    down: bool = False  # while set, every call answers 503
    hold: asyncio.Event | None = None  # while not set, every call waits

    def __post_init__(self) -> None:
        self.hash = HashEmbedder(self.dimension)
        self.app = FastAPI()
        self.app.post("/v1/embeddings")(self._embed)
        self.server = LoopbackServer(self.app)
        self.base_url = f"{self.server.base_url}/v1"

    @property
    def texts(self) -> int:
        return sum(self.batches)

    async def _embed(self, request: Request):
        self.calls += 1
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "Incorrect API key provided"}}, status_code=401)
        if self.down:
            return JSONResponse({"error": {"message": "scripted outage"}}, status_code=503)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.hold is not None:
            await self.hold.wait()
        if self.failures and (status := self.failures.pop(0)) is not None:
            return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
        body = await request.json()
        inputs = body["input"]
        self.batches.append(len(inputs))
        self.seen.update(inputs)
        vectors = await self.hash.embed(inputs)
        data = [{"object": "embedding", "index": i, "embedding": [3 * x for x in v]} for i, v in enumerate(vectors)]
        return {"object": "list", "model": body["model"], "data": data[::-1],
                "usage": {"prompt_tokens": 0, "total_tokens": 0}}
