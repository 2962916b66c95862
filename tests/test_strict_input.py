"""Issue 21 at the edge, on a real server on loopback: text the stores cannot hold (U+0000)
refused in every field with 422 naming it, duplicate JSON keys 400, non-UTF-8 charsets 415,
ids NFC-normalised and refused with invisible characters or invalid UTF-8, and neither a
refusal nor an unexpected error costs the client its keep-alive connection. Each refusal
changes nothing stored (tests/test_hostile_input.py's ``refused``)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote, urlsplit

import pytest
from redis.exceptions import ResponseError

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.errors import BackendUnavailable
from memory_service.http.app import STORE_WORDS_WITHHELD, _public_detail, create_app
from memory_service.http.guard import StrictJSONRoute

from .conftest import flush, suite_settings
from .helpers import wait_embedding_idle
from .test_hostile_input import AGENT, JSON, MESSAGE, raw, refused, state

NUL = "\x00"


@pytest.fixture(scope="module")
async def live_server(falkordb_url):
    """The suite's server, with the memory tools' writes on (their routes are checked too)."""
    server = LoopbackServer(create_app(suite_settings(falkordb_url, memory_write_agents=["*"]), run_worker=True))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def seeded(http, falkordb_url):
    """An agent, a shard, a startup record, a session with one message and a memory to patch."""
    assert (await http.put(f"/v1/agents/{AGENT}", json={"agent_extras": {"tone": "warm"}})).status_code == 200
    assert (await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel"})).status_code == 201
    assert (await http.put(f"/v1/agents/{AGENT}/startup/r1",
                           json={"priority": "P1", "title": "rules", "content": "be kind"})).status_code == 201
    assert (await http.post("/v1/sessions/s1/messages", json=MESSAGE)).status_code == 200
    memory = await http.post(f"/v1/agents/{AGENT}/memories",
                             json={"content": "Alice likes tea", "namespace": f"agent:{AGENT}", "kind": "fact"})
    assert memory.status_code == 201, memory.text
    await wait_embedding_idle(falkordb_url, AGENT)
    http.memory_id = memory.json()["id"]
    return http


# --- keep-alive: a refusal or an error answers on the connection, which stays usable -----------

async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, target: str,
                   body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request on an open connection; its status and body (Content-Length framed)."""
    head = f"{method} {target} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    assert status_line, "the server closed the connection"
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return int(status_line.split()[1]), await reader.readexactly(length)


async def on_one_connection(base_url: str, requests: list[tuple[str, str, bytes]]) -> list[tuple[int, bytes]]:
    """Send ``requests`` one after the other on a single keep-alive connection."""
    where = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        return [await exchange(reader, writer, *request) for request in requests]
    finally:
        writer.close()


# --- U+0000 in every kind of text field ------------------------------------------------------

BODY_FIELDS = [
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": "m2", "content": f"bad {NUL} text"}, "content"),
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": f"m{NUL}"}, "message_id"),
    ("POST", f"/v1/agents/{AGENT}/memories", {"content": f"tea{NUL}", "namespace": f"agent:{AGENT}", "kind": "fact"},
     "content"),
    ("POST", f"/v1/agents/{AGENT}/memories", {"content": "tea", "namespace": f"agent:{AGENT}", "kind": "fact",
                                              "title": f"t{NUL}"}, "title"),
    ("POST", f"/v1/agents/{AGENT}/memories", {"content": "tea", "namespace": f"agent:{AGENT}", "kind": "fact",
                                              "tags": ["ok", f"t{NUL}"]}, "tags.1"),
    ("POST", f"/v1/agents/{AGENT}/writes/parse", {"text": f"said {NUL} so", "namespace": f"agent:{AGENT}"}, "text"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {"tone": [f"x{NUL}"]}}, "agent_extras.tone.0"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {f"k{NUL}": 1}}, f"agent_extras.k{NUL}"),
    ("PUT", f"/v1/agents/{AGENT}/shards/travel", {"name": "travel", "extraction_focus": NUL}, "extraction_focus"),
    ("PUT", f"/v1/agents/{AGENT}/startup/r1", {"priority": "P1", "title": "rules", "content": f"be{NUL}"}, "content"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": f"tea {NUL}"}, "query"),
    ("POST", "/v1/keys", {"name": f"k{NUL}", "role": "read"}, "name"),
]


@pytest.mark.parametrize("method, path, body, field", BODY_FIELDS)
async def test_nul_in_a_body_is_refused_naming_the_field(seeded, falkordb_url, method, path, body, field):
    answer = await refused(seeded, falkordb_url, method, path, content=raw(body), headers=JSON)
    shown = field.replace(NUL, "\\x00")
    assert answer["detail"].startswith(f"{field}: ") or answer["detail"].startswith(f"{shown}: "), answer
    assert "U+0000" in answer["detail"]


async def test_nul_in_a_patch_and_in_a_write_blocks_json_is_refused(seeded, falkordb_url):
    memory = f"/v1/agents/{AGENT}/memories/{seeded.memory_id}"
    for body, field in [({"content": f"tea{NUL}"}, "content"), ({"title": NUL}, "title"), ({"tags": [NUL]}, "tags.0")]:
        answer = await refused(seeded, falkordb_url, "PATCH", memory, json=body)
        assert answer["detail"].startswith(f"{field}: ") and "U+0000" in answer["detail"], answer
    # Escaped inside the block's own JSON: the body is clean, the observation is not.
    block = '<memory_write>{"observations": [{"text": "tea\\u0000time"}]}</memory_write>'
    answer = await refused(seeded, falkordb_url, "POST", f"/v1/agents/{AGENT}/writes/parse",
                           json={"text": block, "namespace": f"agent:{AGENT}"})
    assert "observations[0].text: contains U+0000" in answer["detail"], answer
    assert (await seeded.get(memory)).json()["content"] == "Alice likes tea"


@pytest.mark.parametrize("path, params, field", [
    ("/v1/search", {"agent_id": AGENT, "query": f"tea{NUL}"}, "query"),
    ("/v1/search", {"agent_id": AGENT, "query": "tea", "tags": f"t{NUL}"}, "tags"),
    ("/v1/context", {"agent_id": AGENT, "user_id": "alice", "session_id": "s1", "query": NUL}, "query"),
    ("/v1/context", {"agent_id": AGENT, "user_id": "alice", "session_id": "s1", "model": f"m{NUL}"}, "model"),
    ("/v1/audit", {"agent_id": AGENT, "action": f"agent.put{NUL}"}, "action"),
    (f"/v1/agents/{AGENT}/startup/block", {"model": f"m{NUL}"}, "model"),
    ("/v1/search", {"agent_id": f"a{NUL}", "query": "tea"}, "agent_id"),
])
async def test_nul_in_a_query_parameter_is_refused_naming_it(seeded, falkordb_url, path, params, field):
    answer = await refused(seeded, falkordb_url, "GET", path, params=params)
    assert answer["detail"].startswith(f"query.{field}: ") and "U+0000" in answer["detail"], answer


@pytest.mark.parametrize("method, path, field", [
    ("GET", "/v1/agents/{agent}/memories/m%00x", "memory_id"),
    ("PATCH", "/v1/agents/{agent}/memories/m%00x", "memory_id"),
    ("DELETE", "/v1/keys/k%00", "key_id"),
    ("GET", "/v1/sessions/s%001", "session_id"),
    ("PUT", "/v1/agents/{agent}/startup/r%001", "record_id"),
])
async def test_nul_in_a_path_is_refused_naming_the_segment(seeded, falkordb_url, method, path, field):
    answer = await refused(seeded, falkordb_url, method, path.format(agent=AGENT),
                           json={"content": "x"} if method in ("PATCH", "PUT") else None)
    assert answer["detail"].startswith(f"path.{field}: "), answer


async def test_after_a_refused_nul_the_connection_still_serves(seeded, live_server):
    bad_message = raw({**MESSAGE, "message_id": "m2", "content": f"bad {NUL} text"})
    bad_memory = raw({"content": f"tea{NUL}", "namespace": f"agent:{AGENT}", "kind": "fact"})
    answers = await on_one_connection(live_server.base_url, [
        ("POST", "/v1/sessions/s1/messages", bad_message),
        ("POST", f"/v1/agents/{AGENT}/memories", bad_memory),
        ("PATCH", f"/v1/agents/{AGENT}/memories/{seeded.memory_id}", raw({"content": NUL})),
        ("GET", f"/v1/search?agent_id={AGENT}&query=tea%00", b""),
        ("POST", "/v1/sessions/s1/messages", raw({**MESSAGE, "message_id": "m2", "content": "bad  text"})),
    ])
    assert [status for status, _ in answers] == [422, 422, 422, 422, 200], answers
    # The message once refused is recorded when sent clean: its id was never taken.
    assert json.loads(answers[-1][1])["duplicate"] is False


async def test_other_controls_and_noncharacters_are_stored_as_sent(seeded):
    text = "tab\t bell\x07 esc\x1b del\x7f c1\x85\x9f nonchar\ufffe\uffff\U0010ffff ls\u2028 bom\ufeff zwsp\u200b"
    written = await seeded.post(f"/v1/agents/{AGENT}/memories",
                                json={"content": text, "title": text, "namespace": f"agent:{AGENT}", "kind": "fact"})
    assert written.status_code == 201, written.text
    read = (await seeded.get(f"/v1/agents/{AGENT}/memories/{written.json()['id']}")).json()
    assert read["content"] == read["title"] == text
    recorded = await seeded.post("/v1/sessions/s1/messages", json={**MESSAGE, "message_id": "m3", "content": text})
    assert recorded.status_code == 200, recorded.text


# --- unexpected errors: a clean 500, no store words, the connection kept ---------------------------

async def test_an_unexpected_error_is_a_500_that_keeps_the_connection(falkordb_url):
    await flush(falkordb_url)
    app = create_app(suite_settings(falkordb_url), run_worker=False)

    async def broken() -> None:
        raise ResponseError("Failed to parse query parameter 'rows' value")

    app.add_api_route("/broken", broken)
    async with LoopbackServer(app) as server:
        answers = await on_one_connection(server.base_url, [("GET", "/broken", b""), ("GET", "/health/live", b""),
                                                            ("GET", "/broken", b""), ("GET", "/health/live", b"")])
    assert [status for status, _ in answers] == [500, 200, 500, 200]
    assert json.loads(answers[0][1]) == {"detail": "internal error"}


def test_a_store_query_error_is_not_quoted_to_the_client():
    try:
        try:
            raise ResponseError("Failed to parse query parameter 'rows' value")
        except ResponseError as exc:
            raise BackendUnavailable(f"could not store message 'm:1' of session 's1': {type(exc).__name__}: {exc}; "
                                     "send it again") from exc
    except BackendUnavailable as exc:
        detail = _public_detail(exc)
    assert detail == f"could not store message 'm:1' of session 's1': {STORE_WORDS_WITHHELD}; send it again"


# --- strict parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path, content", [
    ("POST", "/v1/keys", b'{"name": "k", "role": "read", "role": "admin"}'),
    ("POST", "/v1/sessions/s1/messages",
     b'{"agent_id": "guarded", "user_id": "alice", "user_id": "bob", "role": "user", "content": "hi"}'),
    ("PUT", f"/v1/agents/{AGENT}", b'{"agent_extras": {"tone": "cold", "tone": "warm"}}'),
    ("PUT", f"/v1/agents/{AGENT}/startup/r1", b'{"priority": "P1", "title": "a", "content": "b", "content": "c"}'),
    ("POST", f"/v1/agents/{AGENT}/search", b'{"query": "tea", "scope": "user", "scope": "agent"}'),
    ("POST", f"/v1/agents/{AGENT}/memories",
     b'{"content": "x", "namespace": "agent:guarded", "namespace": "agent:other", "kind": "fact"}'),
])
async def test_duplicate_keys_are_refused_with_400(seeded, falkordb_url, method, path, content):
    answer = await refused(seeded, falkordb_url, method, path, status=400, content=content, headers=JSON)
    assert "appears twice in one object" in answer["detail"], answer


async def test_duplicate_keys_made_no_admin_key(seeded, falkordb_url):
    await refused(seeded, falkordb_url, "POST", "/v1/keys", status=400,
                  content=b'{"name": "k", "role": "read", "role": "admin"}', headers=JSON)
    assert [k for k in (await seeded.get("/v1/keys")).json() if k["name"] == "k"] == []
    block = '<memory_write>{"observations": [{"text": "a", "text": "b"}]}</memory_write>'
    answer = await refused(seeded, falkordb_url, "POST", f"/v1/agents/{AGENT}/writes/parse",
                           json={"text": block, "namespace": f"agent:{AGENT}"})
    assert "appears twice" in answer["detail"]


@pytest.mark.parametrize("charset, encoding", [("utf-16", "utf-16"), ("latin-1", "latin-1"), ("UTF-32", "utf-32"),
                                               ("ascii", "ascii")])
async def test_a_charset_other_than_utf8_is_refused_with_415(seeded, falkordb_url, charset, encoding):
    body = json.dumps({"agent_extras": {"tone": "cold"}}).encode(encoding)
    answer = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}", status=415, content=body,
                           headers={"content-type": f"application/json; charset={charset}"})
    assert "must be UTF-8" in answer["detail"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/json;charset=UTF-8",
                                          'application/json; charset="utf8"', "application/json"])
async def test_utf8_charsets_are_taken(seeded, content_type):
    answer = await seeded.put(f"/v1/agents/{AGENT}", content=json.dumps({"agent_extras": {"tone": "é"}}).encode(),
                              headers={"content-type": content_type})
    assert answer.status_code == 200 and answer.json()["agent_extras"] == {"tone": "é"}, answer.text


def _all_api_routes(routes) -> list:
    found = []
    for route in routes:
        if hasattr(route, "original_router"):  # an included router
            found += _all_api_routes(route.original_router.routes)
        elif hasattr(route, "endpoint") and getattr(route, "include_in_schema", False):
            found.append(route)
    return found


def test_every_route_parses_strictly():
    from memory_service.config import Settings

    routes = _all_api_routes(create_app(Settings(_env_file=None)).routes)
    paths = {r.path for r in routes}
    assert {"/v1/keys", "/v1/agents/{agent_id}/writes/parse", "/v1/agents/{agent_id}/startup/{record_id}",
            "/v1/sessions/{session_id}/messages"} <= paths  # the included routers' routes are walked too
    lax = [f"{sorted(r.methods)} {r.path}" for r in routes if not isinstance(r, StrictJSONRoute)]
    assert lax == []


# --- ids: NFC, invisible characters, invalid UTF-8 -----------------------------------------------

NFD_CAFE, NFC_CAFE = "cafe\u0301", "caf\u00e9"


async def test_nfd_and_nfc_spellings_are_one_id(seeded):
    recorded = await seeded.post(f"/v1/sessions/{quote(NFD_CAFE)}/messages",
                                 json={**MESSAGE, "user_id": "jose\u0301", "message_id": f"m-{NFD_CAFE}"})
    assert recorded.status_code == 200 and recorded.json()["session_id"] == NFC_CAFE, recorded.text
    assert recorded.json()["message_id"] == f"m-{NFC_CAFE}"
    found = await seeded.get(f"/v1/sessions/{quote(NFC_CAFE)}")
    assert found.status_code == 200 and found.json()["session_id"] == NFC_CAFE, found.text
    again = await seeded.post(f"/v1/sessions/{quote(NFC_CAFE)}/messages",
                              json={**MESSAGE, "user_id": "jos\u00e9", "message_id": f"m-{NFC_CAFE}"})
    assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
    put = await seeded.put(f"/v1/agents/{quote(NFD_CAFE)}", json={"agent_extras": {}})
    assert put.json()["agent_id"] == NFC_CAFE
    assert (await seeded.get(f"/v1/agents/{quote(NFC_CAFE)}")).status_code == 200
    search = await seeded.post(f"/v1/agents/{AGENT}/search", json={"query": "aisle", "scope": "namespaces",
                                                                  "namespaces": [f"session:{NFD_CAFE}"]})
    assert search.status_code == 200, search.text


INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u202a", "\u202e", "\u2066", "\u2069", "\u200e",
             "\u200f", "\u061c", "\u00ad"]


@pytest.mark.parametrize("char", INVISIBLE + ["\ufffd"])
async def test_ids_with_invisible_or_replacement_characters_are_refused(seeded, falkordb_url, char):
    bad = f"a{char}b"
    for field in ("agent_id", "user_id", "message_id"):
        answer = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages", json={**MESSAGE, field: bad})
        assert answer["detail"].startswith(f"{field}: ") and f"U+{ord(char):04X}" in answer["detail"], answer
    answer = await refused(seeded, falkordb_url, "GET", f"/v1/sessions/{quote(bad)}")
    assert answer["detail"].startswith("path.session_id: "), answer
    answer = await refused(seeded, falkordb_url, "GET", "/v1/search",
                           params={"agent_id": AGENT, "query": "x", "scope": "user", "user_id": bad})
    assert answer["detail"].startswith("query.user_id: "), answer
    answer = await refused(seeded, falkordb_url, "POST", "/v1/keys", json={"name": "k", "role": "read", "users": [bad]})
    assert answer["detail"].startswith("users.0: "), answer


@pytest.mark.parametrize("encoded", ["%FF", "%C3", "%ED%A0%80", "%80abc", "%F4%90%80%80"])
async def test_ids_with_invalid_utf8_are_refused_naming_them(seeded, falkordb_url, encoded):
    answer = await refused(seeded, falkordb_url, "GET", f"/v1/agents/a{encoded}b")
    assert answer["detail"].startswith("path.agent_id: is not UTF-8"), answer
    answer = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}/shards/s{encoded}", json={"name": "x"})
    assert answer["detail"].startswith("path.shard_id: is not UTF-8"), answer
    answer = await refused(seeded, falkordb_url, "GET", f"/v1/context?agent_id={AGENT}&user_id=u{encoded}&session_id=s1")
    assert answer["detail"].startswith("query.user_id: is not UTF-8"), answer
    answer = await refused(seeded, falkordb_url, "GET", f"/v1/search?agent_id={AGENT}&query=tea{encoded}")
    assert answer["detail"].startswith("query.query: is not UTF-8"), answer


async def test_the_python_api_refuses_nul_in_a_message(service, falkordb_url):
    from pydantic import ValidationError

    from memory_service.domain.models import MessageIn

    before = await state(falkordb_url)
    with pytest.raises(ValidationError, match="U\\+0000"):
        MessageIn(**{**MESSAGE, "content": f"bad {NUL} text"})
    assert await state(falkordb_url) == before

