"""The audit log: every change appends who, when, what, before and after; admins read it
with filters; no route rewrites it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from .test_access import OPERATOR, bearer, keyed_server, make_key  # noqa: F401 (keyed_server: a fixture)

AGENT = "audited"


@pytest.fixture
async def admin(keyed_server, falkordb_url):  # noqa: F811
    from .conftest import flush

    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=keyed_server.base_url, timeout=30) as http:
        made = await make_key(http, OPERATOR, role="admin", agents=[AGENT])
        yield http, bearer(made["key"]), made["key_id"]


async def audit(http, auth, **params):
    answer = await http.get("/v1/audit", headers=auth, params={"agent_id": AGENT, **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_changes_are_logged_with_who_before_and_after(admin):
    http, auth, key_id = admin
    await http.put(f"/v1/agents/{AGENT}", headers=auth, json={"agent_extras": {"tone": "warm"}})
    await http.put(f"/v1/agents/{AGENT}", headers=auth, json={"agent_extras": {"tone": "dry"}})
    await http.put(f"/v1/agents/{AGENT}/shards/faq", headers=auth, json={"name": "FAQ"})
    entries = (await audit(http, auth))["entries"]
    assert [e["action"] for e in entries] == ["shard.put", "agent.put", "agent.put", "key.create"]  # newest first
    latest_put, first_put = entries[1], entries[2]
    assert latest_put["key_id"] == key_id and latest_put["agent_id"] == AGENT
    assert latest_put["before"]["agent_extras"] == {"tone": "warm"}
    assert latest_put["after"]["agent_extras"] == {"tone": "dry"}
    assert first_put["before"] is None
    assert entries[0]["target"] == "faq" and entries[0]["after"]["name"] == "FAQ"
    assert entries[3]["key_id"] == "operator" and entries[3]["target"] == key_id
    assert "key" not in entries[3]["after"]  # the secret is never logged
    assert datetime.fromisoformat(entries[0]["at"]) >= datetime.fromisoformat(entries[3]["at"])


async def test_filters_and_pages(admin):
    http, auth, key_id = admin
    for tone in ("a", "b", "c"):
        await http.put(f"/v1/agents/{AGENT}", headers=auth, json={"agent_extras": {"tone": tone}})
    puts = await audit(http, auth, action="agent.put")
    assert [e["after"]["agent_extras"]["tone"] for e in puts["entries"]] == ["c", "b", "a"]
    assert [e["action"] for e in (await audit(http, auth, key_id="operator"))["entries"]] == ["key.create"]
    first = await audit(http, auth, action="agent.put", limit=2)
    assert len(first["entries"]) == 2 and first["next"]
    rest = await audit(http, auth, action="agent.put", before=first["next"])
    assert [e["after"]["agent_extras"]["tone"] for e in rest["entries"]] == ["a"] and rest["next"] is None
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await audit(http, auth, since=future))["entries"] == []
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert (await audit(http, auth, until=past))["entries"] == []


async def test_the_system_log_holds_changes_spanning_every_agent(admin):
    http, auth, _ = admin
    operator_key = await make_key(http, OPERATOR, role="admin")  # no agents: an operator key
    system = await http.get("/v1/audit", headers=OPERATOR)
    assert system.status_code == 200
    assert [(e["action"], e["target"]) for e in system.json()["entries"]] == [("key.create", operator_key["key_id"])]
    assert (await http.get("/v1/audit", headers=auth)).status_code == 403


async def test_no_route_rewrites_the_log_and_bad_filters_are_refused(admin):
    http, auth, _ = admin
    spec = (await http.get("/openapi.json")).json()
    assert set(spec["paths"]["/v1/audit"]) == {"get"}
    for method in ("DELETE", "PUT", "POST", "PATCH"):
        assert (await http.request(method, "/v1/audit", headers=OPERATOR)).status_code == 405
    for bad in ({"before": "abc"}, {"limit": 0}, {"limit": 10_000}, {"since": "yesterday"}, {"agent_id": "a/b"}):
        answer = await http.get("/v1/audit", headers=auth, params={"agent_id": AGENT, **bad})
        assert answer.status_code == 422, (bad, answer.text)
    for bad in ("99999999999999999999-0", "1-99999999999999999999"):  # beyond 64 bits: not an entry id
        answer = await http.get("/v1/audit", headers=auth, params={"agent_id": AGENT, "before": bad})
        assert answer.status_code == 422 and "before" in answer.text, answer.text
    assert (await audit(http, auth, before="0-0")) == {"entries": [], "next": None, "scanned": 0}
    assert len((await audit(http, auth))["entries"]) == 1  # the key's creation, nothing else


async def test_an_erasure_is_logged_with_its_report(admin):
    http, auth, key_id = admin
    line = {"agent_id": AGENT, "user_id": "dora", "role": "user", "content": "I live in Lyon.", "message_id": "d1"}
    assert (await http.post("/v1/sessions/dora-s1/messages", headers=auth, json=line)).status_code == 200
    erased = await http.delete(f"/v1/agents/{AGENT}/users/dora", headers=auth)
    assert erased.status_code == 200, erased.text
    entry = (await audit(http, auth, action="user.erase"))["entries"][0]
    # The log names the user by a keyed digest and keeps the report's counts, never the ids
    # erased; the server digests an id to find its entries.
    assert entry["key_id"] == key_id and entry["target"].startswith("hmac-sha256-")
    assert (await audit(http, auth, user_id="dora"))["entries"] == [entry]
    assert (await audit(http, auth, user_id="dorb"))["entries"] == []
    assert entry["after"]["memories"] == erased.json()["memories"] and entry["after"]["sessions_removed"] == 1
    assert "dora" not in str(entry) and "Lyon" not in str(entry)
