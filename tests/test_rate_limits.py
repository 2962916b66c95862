"""Rate limits per API key: requests and recorded tokens per minute, counted in Redis and so
shared by every API replica, answered 429 with Retry-After; a refused record stores nothing."""

from __future__ import annotations

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .test_access import OPERATOR, OPERATOR_KEY, bearer, make_key

AGENT = "limited"


@pytest.fixture
async def replicas(falkordb_url):
    """Two API replicas on one store, each with default limits too high to matter here."""
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=False)) as one, \
            LoopbackServer(create_app(settings, run_worker=False)) as two:
        async with httpx.AsyncClient(base_url=one.base_url, timeout=30) as a, \
                httpx.AsyncClient(base_url=two.base_url, timeout=30) as b:
            assert (await a.put(f"/v1/agents/{AGENT}", json={}, headers=OPERATOR)).status_code == 200
            yield a, b


async def test_requests_per_minute_are_counted_across_replicas(replicas):
    a, b = replicas
    limited = bearer((await make_key(a, OPERATOR, role="read", agents=[AGENT], requests_per_minute=3))["key"])
    other = bearer((await make_key(a, OPERATOR, role="read", agents=[AGENT]))["key"])
    assert (await a.get(f"/v1/agents/{AGENT}", headers=limited)).status_code == 200
    assert (await b.get(f"/v1/agents/{AGENT}", headers=limited)).status_code == 200
    assert (await a.get(f"/v1/agents/{AGENT}", headers=limited)).status_code == 200
    refused = await b.get(f"/v1/agents/{AGENT}", headers=limited)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "requests per minute" in refused.json()["detail"]
    assert (await a.get(f"/v1/agents/{AGENT}", headers=other)).status_code == 200  # another key: its own budget


async def test_a_wrong_secret_does_not_spend_a_keys_budget(replicas):
    a, _ = replicas
    made = await make_key(a, OPERATOR, role="read", agents=[AGENT], requests_per_minute=2)
    forged = bearer(f"msk_{made['key_id']}_{'x' * 43}")
    for _ in range(5):
        assert (await a.get(f"/v1/agents/{AGENT}", headers=forged)).status_code == 401
    assert (await a.get(f"/v1/agents/{AGENT}", headers=bearer(made["key"]))).status_code == 200


async def test_recorded_tokens_per_minute_refuse_and_store_nothing(replicas):
    a, b = replicas
    key = bearer((await make_key(a, OPERATOR, role="write", agents=[AGENT], tokens_per_minute=100))["key"])
    line = {"agent_id": AGENT, "user_id": "u", "role": "user"}
    small = await a.post("/v1/sessions/t1/messages", headers=key, json={**line, "content": "x" * 270, "message_id": "1"})
    assert small.status_code == 200  # 60 tokens
    big = await b.post("/v1/sessions/t1/messages", headers=key, json={**line, "content": "y" * 270, "message_id": "2"})
    assert big.status_code == 429 and "tokens per minute" in big.json()["detail"], big.text
    assert int(big.headers["Retry-After"]) >= 1
    status = (await a.get("/v1/sessions/t1", headers=OPERATOR)).json()
    assert status["gate"]["pending_messages"] == 1  # the refused message was not recorded


async def test_a_limit_of_zero_means_none(replicas):
    a, _ = replicas
    key = bearer((await make_key(a, OPERATOR, role="read", agents=[AGENT], requests_per_minute=0))["key"])
    for _ in range(10):
        assert (await a.get(f"/v1/agents/{AGENT}", headers=key)).status_code == 200


async def test_bad_limits_are_refused(replicas):
    a, _ = replicas
    for bad in ({"requests_per_minute": -1}, {"tokens_per_minute": "many"}, {"role": "root"}, {"agents": []},
                {"agents": None, "users": ["bob"]}, {"agents": ["a", "b"], "users": ["bob"]}, {"agents": ["../x"]}):
        answer = await a.post("/v1/keys", headers=OPERATOR, json={"name": "n", "role": "read", "agents": [AGENT], **bad})
        assert answer.status_code == 422, (bad, answer.text)
    assert len((await a.get("/v1/keys", headers=OPERATOR)).json()) == 0  # nothing made
