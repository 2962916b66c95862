"""Fuzzing every route of the OpenAPI schema against a real server on loopback, backed by the
real store and a worker: no answer is a 5xx, and a refused request (4xx) changes nothing
stored (every key and graph but the job queue's and the metrics', by content).

* ``test_schema_fuzz``: schemathesis generates requests from the schema, both valid ones and
  ones that break it (wrong types, missing fields, values out of range, extra fields).
* ``test_hostile_json_in_any_field``: hypothesis plants what schemathesis does not make (NaN,
  Infinity, lone surrogates escaped or as raw bytes, bytes that are not UTF-8, U+0000,
  other C0 and C1 controls, deep nesting, huge strings and numbers) in any field of a valid
  body of each route that takes one.
* ``test_hostile_text_in_any_parameter``: the same text, percent-encoded, in any query
  parameter or path segment of each route.

FUZZ_EXAMPLES sets the examples per route (default 20, a run of well under a minute);
``FUZZ_EXAMPLES=1000 pytest tests/test_fuzz_api.py`` fuzzes for longer.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from urllib.parse import quote, quote_from_bytes

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memory_service.config import Settings
from memory_service.domain.errors import InvalidInput
from memory_service.domain.namespaces import validate_id
from memory_service.formation.jobs import QUEUE_NAME
from memory_service.http.app import create_app

from .conftest import suite_settings
from .store_state import snapshot
from .threaded_server import ThreadedServer

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FUZZ_EXAMPLES"),
                suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])

AGENT = "fuzz-agent"
MESSAGE = {"agent_id": AGENT, "user_id": "alice", "role": "user", "content": "I prefer aisle seats.",
           "message_id": "m1", "created_at": "2026-05-01T09:00:00Z", "incognito": False}

# The schema the app publishes; building the app starts nothing.
schema = schemathesis.openapi.from_dict(create_app(Settings(_env_file=None)).openapi())


@pytest.fixture(scope="module")
def fuzz_server(falkordb_url):
    """The API on a flushed store, with an agent, a shard and a session to find. Gates never
    open by themselves (only POST /form forms, and waits for it), so no formation runs in
    the background while a later request is checked."""
    client = redis.Redis.from_url(falkordb_url)
    client.flushall()
    client.close()
    app = create_app(suite_settings(falkordb_url, never_form_memories_less_than_n_messages=1_000_000,
                                    memory_write_agents=["*"],
                                    memory_formation_msg_interval=1_000_000,
                                    memory_formation_token_interval=1_000_000_000, form_wait_seconds=60,
                                    # an event stream ends within a second; a webhook is tried once, briefly
                                    events_sse_max_seconds=1, events_sse_heartbeat_seconds=0.5,
                                    webhook_timeout_seconds=0.5, webhook_max_attempts=1),
                     run_worker=True)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert http.put(f"/v1/agents/{AGENT}", json={"agent_extras": {"tone": "warm"}}).status_code == 200
        assert http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel"}).status_code == 201
        for i in range(3):
            assert http.post("/v1/sessions/s1/messages", json={**MESSAGE, "message_id": f"m{i}"}).status_code == 200
        assert http.put(f"/v1/agents/{AGENT}/startup/r1", json=STARTUP).status_code == 201
        memory = http.post(f"/v1/agents/{AGENT}/memories", json=MEMORY)
        assert memory.status_code == 201, memory.text
        server.memory_id = memory.json()["id"]
        yield server


def worker_idle(url: str, timeout: float = 60) -> None:
    """Wait until no job is queued or running: a job an earlier request queued (POST /form
    with wait=false, a consolidation) must not write while a later request is checked."""
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        # Jobs due now (a retry waits in the queue with a later score) or running.
        while client.zcount(QUEUE_NAME, "-inf", time.time() * 1000) or _running(client):
            assert time.monotonic() < deadline, (
                f"the worker did not finish its jobs: queued {client.zrangebyscore(QUEUE_NAME, '-inf', time.time() * 1000)}, "
                f"running {_running(client)}")
            time.sleep(0.05)
    finally:
        client.close()


def _running(client: redis.Redis) -> list[bytes]:
    # A cron job's in-progress key outlives the job by a minute (arq's keep_cronjob_progress);
    # the cron jobs (sweep, backfill) write nothing when there is nothing to do.
    return [k for k in client.scan_iter("arq:in-progress:*", count=1000) if not k.startswith(b"arq:in-progress:cron:")]


def checked(url: str, send) -> httpx.Response | object:
    """Send one request: never a 5xx, and a refusal changes nothing stored."""
    worker_idle(url)
    before = snapshot(url, worker_running=True)
    response = send()
    assert response.status_code < 500, f"{response.status_code}: {response.text[:2000]}"
    if response.status_code >= 400:
        after = snapshot(url, worker_running=True)
        assert after == before, f"a {response.status_code} changed the store: {before.changes(after)}"
    return response


@schema.parametrize()
@FUZZ
def test_schema_fuzz(case, fuzz_server, falkordb_url):
    checked(falkordb_url, lambda: case.call(base_url=fuzz_server.base_url, timeout=60))


# --- hostile JSON planted in valid bodies ----------------------------------------------------

STARTUP = {"priority": "P1", "title": "rules", "content": "be kind"}
MEMORY = {"content": "Alice likes tea", "namespace": f"agent:{AGENT}", "kind": "fact", "title": "tea",
          "tags": ["drinks"], "confidence": 0.9}
MEMORY_PATH = f"/v1/agents/{AGENT}/memories/{{memory_id}}"  # the fixture's memory
BODIES = {
    ("POST", "/v1/sessions/s1/messages"): {**MESSAGE, "message_id": "m-new"},
    ("POST", "/v1/keys"): {"name": "fuzz", "role": "read", "agents": [AGENT], "users": ["alice"],
                           "requests_per_minute": 10},
    ("PUT", f"/v1/agents/{AGENT}/startup/r2"): STARTUP,
    ("POST", f"/v1/agents/{AGENT}/memories"): MEMORY,
    ("PATCH", MEMORY_PATH): {"content": "Alice likes green tea", "title": "tea", "tags": ["drinks"], "confidence": 0.5},
    ("POST", f"/v1/agents/{AGENT}/writes/parse"): {
        "text": 'ok <memory_write>{"observations": [{"text": "Alice likes tea", "tags": ["drinks"]}]}</memory_write>',
        "namespace": f"agent:{AGENT}", "session_id": "s1", "message_id": "m1"},
    ("PUT", f"/v1/agents/{AGENT}"): {"memory_backend": "graph", "agent_extras": {"tone": "warm", "limits": [1, 2.5]}},
    ("PUT", f"/v1/agents/{AGENT}/shards/travel"): {"name": "travel", "extraction_focus": "flights", "active": True},
    ("POST", f"/v1/agents/{AGENT}/search"): {"query": "aisle seats", "scope": "namespaces", "namespaces": ["session:s1"],
                                             "top_k": 3, "min_score": 0.1, "kinds": ["message"],
                                             "since": "2026-01-01T00:00:00Z"},
}


def _paths(value, where=()):
    """Every place in a JSON value: object members and array items, nested ones included."""
    yield where
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*where, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, (*where, i))


def _planted(body, where, value):
    if not where:
        return value
    copy = json.loads(json.dumps(body))
    parent = copy
    for part in where[:-1]:
        parent = parent[part]
    parent[where[-1]] = value
    return copy


class Raw:
    """Bytes that json.dumps cannot write: planted as a placeholder, then swapped in."""

    def __init__(self, data: bytes):
        self.data = data


surrogate = st.integers(0xD800, 0xDFFF).map(chr)
# Text the stores cannot hold (docs/limits.md, "Text the stores hold"): U+0000 and lone surrogates.
unholdable = st.one_of(st.just("\x00"), surrogate)
# Controls and noncharacters the stores do hold: wherever the rules allow them, they are stored.
controls = st.one_of(st.integers(0x01, 0x1F), st.integers(0x7F, 0x9F), st.sampled_from([0xFFFE, 0xFFFF, 0x10FFFF, 0xFEFF,
                                                                                         0x200B, 0x202E])).map(chr)
# Values the service must refuse, wherever they are (422, or 413 when too large).
refused_values = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.tuples(st.text(max_size=5), unholdable, st.text(max_size=5)).map("".join),
    st.integers(33, 3_000).map(lambda depth: Raw(b"[" * depth + b"]" * depth)),
    st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc3", b"\x80abc", b"\xf4\x90\x80\x80"]).map(
        lambda bad: Raw(b'"' + bad + b'"')),
    st.just(Raw(b"1e999")),
    st.just(Raw(b"9" * 5_000)),
)
# Values that may or may not fit: any answer but a 5xx, and a refusal changes nothing.
other_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(10**300), 10**300), st.floats(allow_nan=False,
                                                                                          allow_infinity=False),
    st.text(max_size=50), st.sampled_from(["x" * 40_000, ".", "..", "a/b", "a:b", " x", "\U000e0001"]),
    st.tuples(st.text(max_size=5), controls, st.text(max_size=5)).map("".join),
    st.lists(st.text(max_size=5), max_size=5), st.dictionaries(st.text(max_size=5), st.integers(), max_size=5),
)


def _encode(value) -> bytes:
    raws: list[Raw] = []

    def placeholder(item):
        raws.append(item)
        return f"@@raw{len(raws) - 1}@@"

    text = json.dumps(value, allow_nan=True, default=placeholder)  # lone surrogates escaped as \udXXX
    data = text.encode()
    for i, item in enumerate(raws):
        data = data.replace(f'"@@raw{i}@@"'.encode(), item.data)
    return data


@given(route=st.sampled_from(sorted(BODIES)), data=st.data(), must_refuse=st.booleans())
@FUZZ
def test_hostile_json_in_any_field(fuzz_server, falkordb_url, route, data, must_refuse):
    method, path = route
    body = BODIES[route]
    path = path.format(memory_id=getattr(fuzz_server, "memory_id", ""))
    where = data.draw(st.sampled_from(list(_paths(body))), label="where")
    value = data.draw(refused_values if must_refuse else other_values, label="value")
    content = _encode(_planted(body, where, value))
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        response = checked(falkordb_url, lambda: http.request(method, path, content=content,
                                                               headers={"content-type": "application/json"}))
    if must_refuse:
        assert response.status_code in (413, 422), response.text[:2000]
        assert len(response.content) < 8_000


BATCH_ITEM = {k: v for k, v in MESSAGE.items() if k != "agent_id"} | {"session_id": "s-batch"}


@given(data=st.data(), must_refuse=st.booleans())
@FUZZ
def test_hostile_json_in_a_batch_item(fuzz_server, falkordb_url, data, must_refuse):
    """The batch route reads its items one by one: a value planted in one item refuses that
    item alone (422, or 413 when too large), and stores nothing of it; planted in the
    envelope, it refuses the whole body. Never a 5xx."""
    items = [{**BATCH_ITEM, "message_id": f"b{i}-{uuid.uuid4().hex}"} for i in range(3)]  # new ids: no duplicates
    body = {"messages": items}
    where = data.draw(st.sampled_from(list(_paths(body))), label="where")
    value = data.draw(refused_values if must_refuse else other_values, label="value")
    content = _encode(_planted(body, where, value))
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        worker_idle(falkordb_url)
        response = http.post(f"/v1/agents/{AGENT}/messages/batch", content=content,
                             headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text[:2000]
    in_item = len(where) >= 2  # ("messages", i, ...): an item, or a value inside one
    if must_refuse and not in_item:
        assert response.status_code in (413, 422), response.text[:2000]
    if response.status_code == 200:
        answers = response.json()["items"]
        if must_refuse and in_item:
            hit = where[1]
            assert answers[hit]["status"] == "refused" and answers[hit]["code"] in (413, 422), answers[hit]
        assert all(a["status"] in ("recorded", "refused") for a in answers), answers
        if not must_refuse and in_item:
            assert all(a["status"] == "recorded" for i, a in enumerate(answers) if i != where[1]), answers
        held = committed_ids(falkordb_url, "s-batch")
        for answer in answers:
            assert (answer["message_id"] in held) == (answer["status"] == "recorded"), (answer, held)


# Long text an echo would be seen in (printable: repr quotes it as it is), around the limit
# of what an answer may quote (PREVIEW_CHARS) and of an id (MAX_ID_LENGTH: 256), far beyond.
_printable = st.characters(codec="utf-8", categories=("L", "N", "P", "Zs"), exclude_characters=":/\\")
long_text = st.sampled_from([101, 150, 256, 257, 1_000, 5_000]).flatmap(
    lambda n: st.text(_printable, min_size=n, max_size=n).map(lambda t: "x" + t[2:] + "x"))
batch_ids = st.one_of(st.text("abcdef0123", min_size=1, max_size=12), long_text)
batch_values = {
    "session_id": batch_ids, "message_id": batch_ids, "user_id": batch_ids,
    "role": st.one_of(st.sampled_from(["user", "assistant"]), long_text),
    "content": st.one_of(st.text(max_size=40).filter(str.strip), long_text),
    "created_at": st.one_of(st.none(), long_text), "incognito": st.one_of(st.booleans(), long_text),
}
QUOTED = 100  # PREVIEW_CHARS: the most of a caller's input an answer may quote


def _strings(value, where=()):
    """Every string in a JSON value (keys too), with where it is."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield (*where, "<key>"), key
            yield from _strings(child, (*where, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _strings(child, (*where, i))


def _as_valid_id(value: object, what: str) -> str | None:
    """``value`` as the service keeps it if it is a valid id (NFC), else None."""
    try:
        return validate_id(value, what, colon_allowed=what == "message_id")
    except InvalidInput:
        return None


@given(data=st.data())
@FUZZ
def test_no_batch_answer_quotes_more_than_100_characters_of_it(fuzz_server, falkordb_url, data):
    """Whatever a batch's items hold (long ids, roles, contents, times, unknown fields; an id
    sent again with other content; a session of another agent), no answer holds more than
    100 consecutive characters of any string sent, but for the ids it names back: a valid
    id (at most 256 characters) in its item's own id field, and the sessions recorded in."""
    count = data.draw(st.integers(1, 4), label="items")
    items = []
    for _ in range(count):
        item = {**BATCH_ITEM, "message_id": uuid.uuid4().hex, "session_id": f"s-long-{uuid.uuid4().hex[:6]}"}
        for name in data.draw(st.lists(st.sampled_from(sorted(batch_values)), unique=True, max_size=4), label="fields"):
            item[name] = data.draw(batch_values[name], label=name)
        if data.draw(st.booleans(), label="unknown field"):
            item[data.draw(long_text, label="field name")] = data.draw(long_text, label="field value")
        items.append(item)
    if data.draw(st.booleans(), label="again with other content"):
        items.append({**items[0], "content": "other content " + "y" * 200})
    if data.draw(st.booleans(), label="another agent's session"):
        items.append({**BATCH_ITEM, "session_id": "s1", "message_id": "z" * 150})  # s1: the agent's; sent as other's
    agent = data.draw(st.sampled_from([AGENT, "fuzz-other"]), label="agent")
    body = {"messages": items}
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        worker_idle(falkordb_url)
        response = http.post(f"/v1/agents/{agent}/messages/batch", json=body)
    assert response.status_code < 500, response.text[:2000]
    answer = response.json()
    sent = [text for _, text in _strings(body) if len(text) > QUOTED]
    windows = {text[i : i + QUOTED + 1] for text in sent for i in range(len(text) - QUOTED)}
    named = {(i, field): item.get(field) for i, item in enumerate(items) for field in ("session_id", "message_id")}
    recorded_in = {_as_valid_id(item.get("session_id"), "session_id") for item in items}
    for where, text in _strings(answer):
        if len(where) == 3 and where[0] == "items" and where[2] in ("session_id", "message_id"):
            sent_id = named[where[1], where[2]]
            if (valid := _as_valid_id(sent_id, str(where[2]))) is not None and text in (sent_id, valid):
                continue  # the item's own valid id, named back
        if len(where) == 3 and where[0] == "sessions" and where[2] == "session_id" and text in recorded_in:
            continue
        quoted = next((text[i : i + QUOTED + 1] for i in range(len(text) - QUOTED) if text[i : i + QUOTED + 1] in windows),
                      None)
        assert quoted is None, (where, len(text), text[:300])


def committed_ids(url: str, session_id: str) -> set[str]:
    """The message ids committed in the session (what a recorded answer promises)."""
    from memory_service.state.keyspace import session_keys

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return set(client.smembers(session_keys(session_id)["committed"]))
    finally:
        client.close()


# --- hostile text in query parameters and path segments -------------------------------------

PARAM_ROUTES = [  # method, path template, query parameters, path segments (None: the fixture's memory)
    ("GET", "/v1/search", {"agent_id": AGENT, "query": "tea", "scope": "user", "user_id": "alice", "tags": "drinks"}, {}),
    ("GET", "/v1/context", {"agent_id": AGENT, "user_id": "alice", "session_id": "s1", "query": "tea",
                            "model": "gpt-4o"}, {}),
    ("GET", "/v1/audit", {"agent_id": AGENT, "action": "agent.put", "key_id": "ab" * 16}, {}),
    ("GET", "/v1/agents/{agent_id}/startup/block", {"model": "gpt-4o", "session_id": "s1"}, {"agent_id": AGENT}),
    ("GET", "/v1/sessions/{session_id}", {}, {"session_id": "s1"}),
    ("GET", "/v1/agents/{agent_id}/memories/{memory_id}", {}, {"agent_id": AGENT, "memory_id": None}),
    ("GET", "/v1/agents/{agent_id}/users/{user_id}/export", {}, {"agent_id": AGENT, "user_id": "alice"}),
    ("DELETE", "/v1/keys/{key_id}", {}, {"key_id": "ab" * 16}),
]
# As bytes before percent-encoding: U+0000, and bytes that are not UTF-8 (a lone surrogate
# can only be sent as its invalid UTF-8 encoding).
refused_bytes = st.one_of(
    st.tuples(st.text(max_size=5), unholdable, st.text(max_size=5)).map(
        lambda t: "".join(t).encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xff", b"\xc3", b"\x80abc", b"\xf4\x90\x80\x80"]),
)
other_bytes = st.one_of(st.text(max_size=20), st.tuples(st.text(max_size=5), controls, st.text(max_size=5)).map("".join),
                        st.sampled_from(["\ufffd", "a\u200bb", "cafe\u0301", "x" * 3_000])).map(str.encode)


@given(route=st.sampled_from(PARAM_ROUTES), data=st.data(), must_refuse=st.booleans())
@FUZZ
def test_hostile_text_in_any_parameter(fuzz_server, falkordb_url, route, data, must_refuse):
    method, template, query, segments = route
    segments = {k: v or fuzz_server.memory_id for k, v in segments.items()}
    slot = data.draw(st.sampled_from([("query", k) for k in query] + [("path", k) for k in segments]), label="slot")
    value = data.draw(refused_bytes if must_refuse else other_bytes, label="value")
    values = {where: {k: v.encode() for k, v in given.items()} for where, given in (("query", query), ("path", segments))}
    values[slot[0]][slot[1]] = value
    path = template.format(**{k: quote_from_bytes(v, safe="") for k, v in values["path"].items()})
    target = path + "?" + "&".join(f"{k}={quote_from_bytes(v, safe='')}" for k, v in values["query"].items())
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        response = checked(falkordb_url, lambda: http.request(method, target))
    if must_refuse:
        assert response.status_code == 422, response.text[:2000]
        assert response.json()["detail"].startswith(f"{slot[0]}.{slot[1]}: "), response.text[:2000]


# --- every id the rule accepts works as a path segment ----------------------------------------

def _accepted(text: str) -> bool:
    try:
        validate_id(text, "id")
    except InvalidInput:
        return False
    return True


# Any text the id rule accepts, drawn mostly from characters that mean something in a URL,
# so that a rule letting one through that breaks a path fails here.
path_ids = st.text(st.one_of(st.sampled_from(list("./\\%?#&=+;, ~:@!$'()*[]")), st.characters(codec="utf-8")),
                   min_size=1, max_size=12).filter(_accepted)


@given(agent=path_ids, shard=path_ids, session=path_ids)
@FUZZ
def test_every_id_the_rule_accepts_works_as_a_path_segment(fuzz_server, agent, shard, session):
    a, sh, se = (quote(part, safe="") for part in (agent, shard, session))
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        put = http.put(f"/v1/agents/{a}", json={"agent_extras": {}})
        assert put.status_code == 200 and put.json()["agent_id"] == agent, put.text
        assert http.get(f"/v1/agents/{a}").json()["agent_id"] == agent
        shard_put = http.put(f"/v1/agents/{a}/shards/{sh}", json={"name": "topic"})
        assert shard_put.status_code in (200, 201) and shard_put.json()["shard_id"] == shard, shard_put.text
        assert shard in [s["shard_id"] for s in http.get(f"/v1/agents/{a}/shards").json()]
        recorded = http.post(f"/v1/sessions/{se}/messages", json={**MESSAGE, "agent_id": agent})
        if recorded.status_code == 409:  # a session an earlier example's agent holds: its path worked
            assert "belongs to another agent" in recorded.json()["detail"]
        else:
            assert recorded.status_code == 200 and recorded.json()["session_id"] == session, recorded.text
        status = http.get(f"/v1/sessions/{se}")
        assert status.status_code == 200 and status.json()["session_id"] == session, status.text
