"""An OpenAI-compatible embeddings endpoint on loopback, for the tests of a failing embedder.

It answers ``POST /v1/embeddings`` with the deterministic hash embedder's vectors (so the
service's vector search still ranks sensibly), and can be told to fail: ``down = True``
answers every call with HTTP 503 until it is set back.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from memory_service.embedding import HashEmbedder
from memory_service.loopback import LoopbackServer


@dataclass
class FakeEmbeddings:
    dimension: int = 64
    down: bool = False
    calls: int = 0
    texts: int = 0

    def __post_init__(self) -> None:
        self.embedder = HashEmbedder(self.dimension)
        self.app = FastAPI()
        self.app.post("/v1/embeddings")(self._embed)
        self._server = LoopbackServer(self.app)
        self.base_url = f"{self._server.base_url}/v1"

    async def start(self) -> FakeEmbeddings:
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop()

    async def _embed(self, request: Request):
        self.calls += 1
        if self.down:
            return JSONResponse({"error": {"message": "scripted outage"}}, status_code=503)
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.texts += len(inputs)
        vectors = await self.embedder.embed(inputs)
        return {"object": "list", "model": body.get("model", "fake"),
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": 0, "total_tokens": 0}}
