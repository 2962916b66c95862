"""Signed cursors (memory_service/access/cursors.py) on every route that takes one, against a
real server requiring keys (embedded FalkorDB and Redis): a page's `next` walks on; anything
else is a 422 with a clear message and never a 5xx, whatever it holds: random text and
bytes, base64 JSON with NaN, Infinity, U+0000, huge numbers and wrong types (unsigned or
with a made-up MAC), a real cursor with one character changed, a cursor of another list,
other filters, another agent, another entity or a key of another reach. Even a cursor
signed with the server's own key (read from Redis here, as only an operator could) is
refused when it holds a non-finite number or a control character, before any store.
The audit log's `before` (an entry id, not a cursor) is fuzzed alike."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.http.app import create_app
from memory_service.state import keyspace

from .conftest import suite_settings
from .threaded_server import ThreadedServer

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FUZZ_EXAMPLES"),
                suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])

OPERATOR_KEY = secrets.token_urlsafe(32)
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
AGENT, OTHER = "cur-a", "cur-b"
EDGES = "".join(f'{{"source": "Hub", "target": "Spoke {i}", "rel_type": "knows"}},' for i in range(5)).rstrip(",")
BLOCK = f'<memory_write>{{"edges": [{EDGES}]}}</memory_write>'


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.fixture(scope="module")
def world(falkordb_url):
    """Two agents, each with two users, two sessions, memories and entities; the Hub entity
    with five facts; keys: the operator, one limited to alice. Every list has pages of one."""
    client = redis.Redis.from_url(falkordb_url)
    client.flushall()
    client.close()
    app = create_app(suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                                    memory_write_agents=["*"], never_form_memories_less_than_n_messages=1_000_000))
    with ThreadedServer(app) as server, httpx.Client(base_url=server.base_url, headers=OPERATOR, timeout=60) as http:
        for agent in (AGENT, OTHER):
            assert http.put(f"/v1/agents/{agent}", json={}).status_code == 200
            for user in ("alice", "bob"):
                answer = http.post(f"/v1/sessions/{agent}-{user}/messages", json={
                    "agent_id": agent, "user_id": user, "role": "user", "content": f"{user} likes tea",
                    "message_id": "m1"})
                assert answer.status_code == 200, answer.text
                answer = http.post(f"/v1/agents/{agent}/writes/parse",
                                   json={"text": BLOCK, "namespace": f"user:{agent}:{user}"})
                assert answer.status_code == 200, answer.text
        made = http.post("/v1/keys", json={"name": "alice", "role": "read", "agents": [AGENT], "users": ["alice"]})
        assert made.status_code == 201, made.text
        alice = {"Authorization": f"Bearer {made.json()['key']}"}
        hubs = [e["id"] for e in http.get(f"/v1/agents/{AGENT}/entities", params={"name": "hub"}).json()["entities"]]
        yield {"http": http, "alice": alice, "hubs": hubs, "url": falkordb_url}


def lists(w: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each cursor-taking route, with the parameters of a page of one."""
    hub = w["hubs"][0]
    return {
        "agents": ("/v1/agents", {"limit": 1}),
        "users": (f"/v1/agents/{AGENT}/users", {"limit": 1}),
        "sessions": (f"/v1/agents/{AGENT}/sessions", {"limit": 1}),
        "memories": (f"/v1/agents/{AGENT}/memories", {"limit": 1}),
        "entities": (f"/v1/agents/{AGENT}/entities", {"limit": 1}),
        "facts": (f"/v1/agents/{AGENT}/entities/{hub}", {"limit": 1}),
    }


def get(w: dict[str, Any], path: str, params: dict[str, Any], auth: dict[str, str] | None = None) -> httpx.Response:
    answer = w["http"].get(path, params=params, headers=auth)
    assert answer.status_code < 500, f"{answer.status_code}: {answer.text[:500]}"
    return answer


def next_of(w: dict[str, Any], name: str, auth: dict[str, str] | None = None, **extra: Any) -> str:
    path, params = lists(w)[name]
    answer = get(w, path, {**params, **extra}, auth)
    assert answer.status_code == 200 and answer.json()["next"], (name, answer.text)
    return str(answer.json()["next"])


def refused(answer: httpx.Response) -> None:
    assert answer.status_code == 422, f"{answer.status_code}: {answer.text[:500]}"
    assert "cursor" in answer.text


HOSTILE = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 10**400, -(10**30), 2**63, 1e308, -0.0, "\u0000",
                     "x\u0000y", "\u001b[31m", "\u0085", "\ud800", "", "a" * 5000, None, True, [], {}, [[[[]]]]]),
    st.integers(), st.floats(), st.text(max_size=20),
)
FIELDS = st.sampled_from(["k", "v", "f", "t", "i", "h", "n", "u", "a", "c"])


# The digest of the memories list's filters when none is given (browse.py's _digest).
MEMORIES_DIGEST = hashlib.sha256(json.dumps(
    {"agent": AGENT, "namespace": None, "user": None, "session": None, "kinds": [], "tags": [], "since": None,
     "until": None, "state": "live"}, sort_keys=True, default=str).encode()).hexdigest()[:16]


def raw_json(body: Any) -> bytes:
    """JSON with NaN/Infinity written as Python writes them, and lone surrogates escaped."""
    return json.dumps(body, allow_nan=True).encode()


@st.composite
def forged(draw: st.DrawFn) -> str:
    """A cursor-shaped forgery: random text or bytes, or base64 JSON of hostile values, bare
    or with a made-up MAC."""
    kind = draw(st.sampled_from(["text", "bytes", "json", "list"]))
    if kind == "text":
        return draw(st.text(min_size=1, max_size=300))
    if kind == "bytes":
        token = b64(draw(st.binary(min_size=1, max_size=300)))
    elif kind == "json":
        body = {"k": draw(st.sampled_from(["agents", "users", "sessions", "memories", "entities", "facts"])),
                **draw(st.dictionaries(FIELDS, HOSTILE, max_size=5))}
        token = b64(raw_json(body))
    else:
        token = b64(raw_json(draw(st.lists(HOSTILE, max_size=3))))
    mac = draw(st.sampled_from(["", ".", "." + b64(secrets.token_bytes(32)), "." + "A" * 43, ".!!"]))
    return token + mac


@pytest.mark.parametrize("name", ["agents", "users", "sessions", "memories", "entities", "facts"])
def test_a_forged_cursor_is_a_422_never_a_5xx(world, name):
    path, params = lists(world)[name]

    @FUZZ
    @given(cursor=forged())
    def check(cursor: str) -> None:
        answer = get(world, path, {**params, "cursor": cursor})
        assert answer.status_code == 422, f"{cursor!r}: {answer.status_code} {answer.text[:300]}"

    check()
    # The forgeries that were 500s when cursors were unsigned: NaN and Infinity in a memories
    # cursor of the right filters, a NUL in an entities cursor.
    for cursor in ("WyJcdTAwMDAiLCAieCJd", b64(raw_json({"v": 1, "k": "memories", "f": MEMORIES_DIGEST, "t": float("nan"),
                                                         "i": "m"})),
                   b64(raw_json({"v": 1, "k": "memories", "f": MEMORIES_DIGEST, "t": float("inf"), "i": "m"})),
                   "x" * (MAX_CURSOR_CHARS + 1)):
        assert get(world, path, {**params, "cursor": cursor}).status_code == 422


@pytest.mark.parametrize("name", ["agents", "users", "sessions", "memories", "entities", "facts"])
def test_a_real_cursor_walks_on_and_a_changed_one_is_refused(world, name):
    path, params = lists(world)[name]
    cursor = next_of(world, name)
    assert get(world, path, {**params, "cursor": cursor}).status_code == 200

    @FUZZ
    @given(at=st.integers(0, len(cursor) - 1), char=st.sampled_from("AQgw-_Z9.=!%"))
    def check(at: int, char: str) -> None:
        changed = cursor[:at] + char + cursor[at + 1:]
        if changed != cursor:
            refused(get(world, path, {**params, "cursor": changed}))

    check()


def test_a_cursor_is_refused_on_another_list(world):
    routes = lists(world)
    for name in routes:
        cursor = next_of(world, name)
        for other, (path, params) in routes.items():
            if other != name:
                answer = get(world, path, {**params, "cursor": cursor})
                refused(answer)
                assert "not a cursor of this list" in answer.text or "forged" in answer.text


def test_a_cursor_is_refused_for_another_agent_entity_filters_or_reach(world):
    http = world["http"]
    for name in ("users", "sessions", "memories", "entities"):
        path, params = lists(world)[name]
        cursor = next_of(world, name)
        refused(get(world, path.replace(AGENT, OTHER), {**params, "cursor": cursor}))  # another agent
        refused(get(world, path, {**params, "cursor": cursor}, world["alice"]))  # a key of another reach
    # Another entity's facts, or the same entity's with other choices of facts.
    path, params = lists(world)["facts"]
    cursor = next_of(world, "facts")
    refused(get(world, path.replace(world["hubs"][0], world["hubs"][1]), {**params, "cursor": cursor}))
    refused(get(world, path, {**params, "cursor": cursor, "include_superseded": "true"}))
    # Entities listed with other filters.
    path, params = lists(world)["entities"]
    cursor = next_of(world, "entities")
    refused(get(world, path, {**params, "cursor": cursor, "type": "object"}))
    # The memories' own message for other filters.
    path, params = lists(world)["memories"]
    answer = get(world, path, {**params, "cursor": next_of(world, "memories"), "user_id": "alice"})
    refused(answer)
    assert "made for other filters" in answer.text
    # A confined key's cursor (alice's own entities, page by page) is refused to the operator.
    path, params = lists(world)["entities"]
    mine = next_of(world, "entities", world["alice"])
    assert http.get(path, params={**params, "cursor": mine}, headers=world["alice"]).status_code == 200
    refused(get(world, path, {**params, "cursor": mine}))


def signed(url: str, list_name: str, scope: Any, body: dict[str, Any]) -> str:
    """A cursor signed with the server's own key (derived from the pseudonym secret in Redis)."""
    client = redis.Redis.from_url(url)
    try:
        secret = client.get(keyspace.USER_DIGEST_KEY)
    finally:
        client.close()
    assert secret
    key = hmac.new(secret, b"memory-service cursor key v1", hashlib.sha256).digest()
    payload = raw_json(body)
    scope_text = json.dumps(scope, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(key, b"\x00".join((list_name.encode(), scope_text.encode(), payload)), hashlib.sha256).digest()
    return f"{b64(payload)}.{b64(mac)}"


@pytest.mark.parametrize("position", [
    {"t": float("nan"), "i": "m"}, {"t": float("inf"), "i": "m"}, {"t": 1.0, "i": "m\u0000"},
    {"t": 10**30, "i": "m"}, {"t": "soon", "i": "m"}, {"t": 1.0, "i": "\u001b[2J"},
])
def test_a_cursor_signed_by_the_server_is_still_checked_before_any_store(world, position):
    """Were the secret known (or a bug of ours to seal such a value), nothing hostile reaches a store."""
    next_of(world, "memories")  # the secret exists once a cursor was sealed
    path, params = lists(world)["memories"]
    cursor = signed(world["url"], f"memories|{AGENT}", None, {"k": "memories", "v": 1, "f": MEMORIES_DIGEST,
                                                             **position})
    refused(get(world, path, {**params, "cursor": cursor}))
    hub = world["hubs"][0]
    facts = signed(world["url"], f"facts|{AGENT}|{hub}||0", None,
                   {"k": "facts", "t": position["t"], "i": position["i"]})
    refused(get(world, f"/v1/agents/{AGENT}/entities/{hub}", {"limit": 1, "cursor": facts}))
    entities = signed(world["url"], "entities|" + json.dumps([AGENT, None, None, None]), None,
                      {"k": "entities", "c": b64(json.dumps(["\u0000", "x"]).encode())})
    refused(get(world, f"/v1/agents/{AGENT}/entities", {"limit": 1, "cursor": entities}))


@FUZZ
@given(before=st.one_of(st.text(max_size=60), st.from_regex(r"\A\d{1,25}-\d{1,25}\Z")))
def test_the_audit_logs_before_is_a_422_or_a_page_never_a_5xx(world, before):
    answer = get(world, "/v1/audit", {"agent_id": AGENT, "before": before})
    assert answer.status_code in (200, 422), answer.text
