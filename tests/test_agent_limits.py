"""Rate limits per agent across its keys (memory_service/access/agent_limits.py): an agent's
requests and recorded tokens per minute, whichever of its keys and API replicas they come
through, counted in Redis, answered 429 with Retry-After; a refused request records
nothing and another agent's budget is its own. Real replicas on one store, on loopback."""

from __future__ import annotations

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .test_access import OPERATOR, OPERATOR_KEY, bearer, make_key

HEAVY, LIGHT = "heavy", "light"


async def replicas_of(falkordb_url: str, **overrides):
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY, **overrides)
    return settings


@pytest.fixture
async def limited(falkordb_url, request):
    """Two API replicas on one store with the agent limits ``request.param`` (a dict), the
    agents made, two write keys of HEAVY and one of LIGHT (keys' own limits off)."""
    settings = await replicas_of(falkordb_url, **request.param)
    async with LoopbackServer(create_app(settings, run_worker=False)) as one, \
            LoopbackServer(create_app(settings, run_worker=False)) as two:
        async with httpx.AsyncClient(base_url=one.base_url, timeout=30) as a, \
                httpx.AsyncClient(base_url=two.base_url, timeout=30) as b:
            for agent in (HEAVY, LIGHT):
                assert (await a.put(f"/v1/agents/{agent}", json={}, headers=OPERATOR)).status_code == 200
            keys = [bearer((await make_key(a, OPERATOR, role="write", agents=[agent], requests_per_minute=0,
                                           tokens_per_minute=0))["key"]) for agent in (HEAVY, HEAVY, LIGHT)]
            yield a, b, keys


def batch(session: str, n: int, chars: int = 45, start: int = 0) -> dict:
    return {"messages": [{"session_id": session, "user_id": "u", "role": "user", "content": "w" * chars,
                          "message_id": f"m{start + i}"} for i in range(n)]}


@pytest.mark.parametrize("limited", [{"agent_requests_per_minute": 5}], indirect=True)
async def test_an_agents_requests_are_counted_across_its_keys_and_replicas(limited):
    a, b, (heavy1, heavy2, light) = limited
    # The operator's PUT that made HEAVY was one (every caller counts); four more of HEAVY
    # through two keys and two replicas spend its minute.
    for http, key in ((a, heavy1), (b, heavy2), (a, heavy2), (b, heavy1)):
        assert (await http.get(f"/v1/agents/{HEAVY}", headers=key)).status_code == 200
    for http, key in ((a, heavy1), (b, heavy2)):
        refused = await http.post(f"/v1/agents/{HEAVY}/messages/batch", headers=key, json=batch("s1", 2))
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "agent heavy is over its requests per minute" in refused.json()["detail"]
        assert "AGENT_REQUESTS_PER_MINUTE" in refused.json()["detail"]
    # Nothing of the refused batches was recorded (the operator's key: not an agent's lane).
    assert (await a.get("/v1/sessions/s1", headers=OPERATOR)).status_code == 404
    # Another agent's budget is its own, on either replica.
    for http in (a, b, a, b):
        assert (await http.get(f"/v1/agents/{LIGHT}", headers=light)).status_code == 200


@pytest.mark.parametrize("limited", [{"agent_requests_per_minute": 3, "api_max_concurrent_requests": 0}],
                         indirect=True)
async def test_an_agents_requests_are_counted_without_an_admission_pool(limited):
    a, _, (heavy1, heavy2, light) = limited  # the operator's PUT of each agent was one
    assert (await a.get(f"/v1/agents/{HEAVY}", headers=heavy1)).status_code == 200
    assert (await a.get(f"/v1/agents/{HEAVY}", headers=heavy2)).status_code == 200
    assert (await a.get(f"/v1/agents/{HEAVY}", headers=heavy1)).status_code == 429
    assert (await a.get(f"/v1/agents/{LIGHT}", headers=light)).status_code == 200


@pytest.mark.parametrize("limited", [{"agent_tokens_per_minute": 100}], indirect=True)
async def test_an_agents_recorded_tokens_are_counted_across_its_keys(limited):
    """45 characters are 10 tokens: a batch of 6 (60 tokens) through one key, then one of 6
    through the agent's other key on the other replica is over the agent's 100: 429, nothing
    of it recorded; a single message of 45 tokens is too; the other agent records."""
    a, b, (heavy1, heavy2, light) = limited
    first = await a.post(f"/v1/agents/{HEAVY}/messages/batch", headers=heavy1, json=batch("s1", 6))
    assert first.status_code == 200 and first.json()["recorded"] == 6, first.text
    second = await b.post(f"/v1/agents/{HEAVY}/messages/batch", headers=heavy2, json=batch("s2", 6))
    assert second.status_code == 429, second.text
    assert "agent heavy is over its recorded tokens per minute" in second.json()["detail"]
    assert int(second.headers["Retry-After"]) >= 1
    single = await b.post("/v1/sessions/s3/messages", headers=heavy2, json={
        "agent_id": HEAVY, "user_id": "u", "role": "user", "content": "w" * 200, "message_id": "x"})
    assert single.status_code == 429, single.text
    for session in ("s2", "s3"):
        assert (await a.get(f"/v1/sessions/{session}", headers=OPERATOR)).status_code == 404
    assert (await a.get("/v1/sessions/s1", headers=OPERATOR)).json()["gate"]["pending_messages"] == 6
    other = await a.post(f"/v1/agents/{LIGHT}/messages/batch", headers=light, json=batch("l1", 6))
    assert other.status_code == 200 and other.json()["recorded"] == 6, other.text


@pytest.mark.parametrize("limited", [{}], indirect=True)
async def test_no_agent_limit_by_default(limited):
    a, b, (heavy1, _, _) = limited
    for http in (a, b) * 5:
        assert (await http.get(f"/v1/agents/{HEAVY}", headers=heavy1)).status_code == 200
    assert (await a.post(f"/v1/agents/{HEAVY}/messages/batch", headers=heavy1,
                         json=batch("s1", 50, 900))).status_code == 200


async def test_bad_agent_limits_are_refused_at_start():
    from pydantic import ValidationError

    from memory_service.config import Settings

    for bad in ({"agent_requests_per_minute": -1}, {"agent_tokens_per_minute": "many"}):
        with pytest.raises(ValidationError):
            Settings(_env_file=None, **bad)
