"""Forget and re-form over HTTP (docs/forget.md, docs/reform.md), on a loopback server that
requires keys, with its worker: the good path through the Python client, and every refusal
(a key without the role, another agent's key, a key limited to other users, unknown and
foreign ids, bad modes and dates), each changing nothing."""

from __future__ import annotations

import secrets

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient
from memory_service.formation.steps import message_memory_id
from memory_service.http.app import create_app

from .conftest import flush, suite_settings

OPERATOR_KEY = secrets.token_urlsafe(32)
AGENT, OTHER = "family", "rival"
LINES = ["I am planning a trip to Lisbon next month.", "My grandmother's maiden name is Quillfeather.",
         "Please always answer me in short sentences."]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def server(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=True)) as running:
        yield running


@pytest.fixture
async def keys(server, falkordb_url) -> dict[str, str]:
    await flush(falkordb_url)
    made = {}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        for name, role, agent, users in [("read", "read", AGENT, None), ("write", "write", AGENT, None),
                                         ("admin", "admin", AGENT, None), ("other", "admin", OTHER, None),
                                         ("bo_admin", "admin", AGENT, ["bo"])]:
            spec = {"name": name, "role": role, "agents": [agent], **({"users": users} if users else {})}
            answer = await http.post("/v1/keys", headers=bearer(OPERATOR_KEY), json=spec)
            assert answer.status_code == 201, answer.text
            made[name] = answer.json()["key"]
        for session, agent, user, lines, key in [("kitchen", AGENT, "ada", LINES, made["admin"]),
                                                 ("elsewhere", OTHER, "cy", LINES[:1], made["other"])]:
            for i, line in enumerate(lines):
                answer = await http.post(f"/v1/sessions/{session}/messages", headers=bearer(key), json={
                    "agent_id": agent, "user_id": user, "role": "user", "content": line, "message_id": f"m{i}"})
                assert answer.status_code in (200, 201), answer.text
            answer = await http.post(f"/v1/sessions/{session}/form", headers=bearer(key), params={"wait": "true"})
            assert answer.status_code == 200 and answer.json()["formed"], answer.text
    return made


async def test_forget_and_reform_through_the_client_and_every_refusal(server, keys):
    secret = message_memory_id("kitchen", "m1")
    foreign = message_memory_id("elsewhere", "m0")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async def status(method: str, url: str, key: str, **kw) -> int:
            return (await http.request(method, url, headers=bearer(key), **kw)).status_code

        forget = f"/v1/agents/{AGENT}/memories/{secret}/forget"
        assert await status("POST", forget, keys["read"], json={}) == 403  # read may not change
        assert await status("POST", forget, keys["write"], json={"mode": "hard"}) == 403  # hard needs admin
        assert await status("POST", forget, keys["other"], json={}) == 403  # another agent's key
        assert await status("POST", forget, keys["bo_admin"], json={}) == 404  # Ada's session is unseen by Bo's key
        assert await status("POST", forget, keys["admin"], json={"mode": "erase"}) == 422
        assert await status("POST", forget, keys["admin"], json={"mode": "soft", "why": "x"}) == 422
        assert await status("POST", f"/v1/agents/{AGENT}/memories/no-such-id/forget", keys["admin"], json={}) == 404
        assert await status("POST", f"/v1/agents/{AGENT}/memories/{foreign}/forget", keys["admin"], json={}) == 404
        got = await http.get(f"/v1/agents/{AGENT}/memories/{secret}", headers=bearer(keys["admin"]))
        assert got.status_code == 200 and got.json()["deleted_at"] is None  # nothing changed

        reform = f"/v1/agents/{AGENT}/reform"
        assert await status("POST", reform, keys["write"], json={"dry_run": True}) == 403
        assert await status("POST", reform, keys["bo_admin"], json={"dry_run": True}) == 403  # not for all users
        assert await status("POST", reform, keys["admin"], json={"since": "2026-01-01T00:00:00"}) == 422  # no zone
        assert await status("POST", reform, keys["admin"], json={"since": "yesterday"}) == 422
        assert await status("POST", reform, keys["admin"], json={"session_id": "elsewhere"}) == 404  # another agent's
        assert await status("POST", reform, keys["admin"], json={"limit": 0}) == 422

    async with AsyncMemoryClient(server.base_url, api_key=keys["write"]) as client:
        soft = await client.memory_forget(AGENT, secret)
        assert soft.undoable and len(soft.reformed) == 1 and secret in soft.memory_ids
        found = await client.search(AGENT, "Quillfeather grandmother")
        assert not [h for h in found.results if "quillfeather" in h.content.lower()]
        assert (await client.memory_undelete(AGENT, secret)).deleted_at is None
        found = await client.search(AGENT, "Quillfeather grandmother")
        assert [h for h in found.results if "quillfeather" in h.content.lower()]
    async with AsyncMemoryClient(server.base_url, api_key=keys["admin"]) as client:
        hard = await client.memory_forget(AGENT, secret, mode="hard")
        assert not hard.undoable and hard.ledger_entries == 1
        found = await client.search(AGENT, "Quillfeather grandmother")
        assert not [h for h in found.results if "quillfeather" in h.content.lower()]
        audit = await client.audit(agent_id=AGENT, action="memory.forget")
        assert [e.target for e in audit.entries] == [secret, secret]
        dry = await client.reform(AGENT, dry_run=True)
        assert (dry.windows, dry.reformed, dry.llm_calls) == (1, 0, 0)
        run = await client.reform(AGENT, session_id="kitchen", run_id="api-run")
        assert run.done and run.reformed == 1 and run.extractor == "rules"
