"""Hostile and malformed requests, each named case by hand, on a real server on loopback:
every one gets a 4xx that says what and where, quotes at most a short prefix of what was
sent, and changes nothing stored."""

import asyncio
import json

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.errors import PREVIEW_CHARS
from memory_service.domain.limits import MAX_JSON_DEPTH
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .helpers import wait_embedding_idle
from .store_state import snapshot

AGENT = "guarded"
MESSAGE = {"agent_id": AGENT, "user_id": "alice", "role": "user", "content": "I prefer aisle seats.",
           "message_id": "m1", "created_at": "2026-05-01T09:00:00Z"}
LIMIT = 1_048_576  # MAX_REQUEST_BYTES's default
JSON = {"content-type": "application/json"}


@pytest.fixture
async def seeded(http, falkordb_url):
    """The live server's client, with an agent, a shard and a session with one message."""
    assert (await http.put(f"/v1/agents/{AGENT}", json={"memory_backend": "graph", "agent_extras": {"tone": "warm"}})).status_code == 200
    assert (await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel"})).status_code == 201
    assert (await http.post("/v1/sessions/s1/messages", json=MESSAGE)).status_code == 200
    await wait_embedding_idle(falkordb_url, AGENT)  # its writes are not the request's
    return http


async def state(url):
    return await asyncio.to_thread(snapshot, url, worker_running=True)


async def refused(http, url, method, path, *, status=422, **request):
    """Send one request; assert it is refused with ``status``, changes nothing, and that its
    answer is small JSON with a sentence in ``detail``. The answer's body."""
    before = await state(url)
    answer = await http.request(method, path, **request)
    assert answer.status_code == status, answer.text[:2000]
    assert len(answer.content) < 8_000, f"a {len(answer.content)}-byte answer"
    body = answer.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for error in body.get("errors", []):
        assert len(error.get("input", "")) <= PREVIEW_CHARS
        assert all(len(str(part)) <= PREVIEW_CHARS for part in error["loc"])
    assert await state(url) == before
    return body


def raw(value) -> bytes:
    """JSON as a hostile client writes it: NaN and Infinity allowed, lone surrogates escaped."""
    return json.dumps(value, allow_nan=True).encode()


# --- size -------------------------------------------------------------------------------

async def test_a_body_over_the_limit_answers_413_whatever_the_route(seeded, falkordb_url):
    big = {**MESSAGE, "message_id": "m2", "content": "x" * (2 * LIMIT)}
    for method, path, content in [
        ("POST", "/v1/sessions/s1/messages", raw(big)),
        ("PUT", f"/v1/agents/{AGENT}", raw({"agent_extras": {"blob": "x" * (2 * LIMIT)}})),
        ("POST", f"/v1/agents/{AGENT}/search", raw({"query": "x" * (2 * LIMIT)})),
        # A route without a body never runs: the window stays pending, not formed.
        ("POST", "/v1/sessions/s1/form", b"x" * (2 * LIMIT)),
        ("GET", f"/v1/agents/{AGENT}", b"x" * (LIMIT + 1)),
        # Far more than socket buffers hold: the client, still sending, reads the 413 all the same.
        ("POST", "/v1/sessions/s1/messages", b"x" * (64 * LIMIT)),
    ]:
        body = await refused(seeded, falkordb_url, method, path, status=413, content=content, headers=JSON)
        assert body["detail"] == f"the request body is larger than {LIMIT} bytes (MAX_REQUEST_BYTES)"
    assert (await seeded.get("/v1/sessions/s1")).json()["gate"]["pending_messages"] == 1
    assert (await seeded.get(f"/v1/agents/{AGENT}")).json()["agent_extras"] == {"tone": "warm"}


async def test_a_body_streamed_without_content_length_is_cut_at_the_limit(seeded, falkordb_url):
    sent = 0

    async def chunks():
        nonlocal sent
        yield b'{"agent_id": "guarded", "user_id": "alice", "role": "user", "message_id": "m2", "content": "'
        for _ in range(64):  # 4 MB if all of it were read
            sent += 1
            yield b"x" * 65_536
        yield b'"}'

    body = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages", status=413, content=chunks(),
                         headers=JSON)
    assert "MAX_REQUEST_BYTES" in body["detail"]
    assert (await seeded.get("/v1/sessions/s1")).json()["gate"]["pending_messages"] == 1


async def test_a_body_at_the_limit_is_read_and_one_byte_more_is_not(seeded, falkordb_url):
    filler = {**MESSAGE, "message_id": "m2", "content": ""}
    at_limit = raw({**filler, "content": "x" * (LIMIT - len(raw(filler)))})
    assert len(at_limit) == LIMIT
    # Read and parsed: refused for its content (over MAX_MESSAGE_CHARS), not for its size.
    body = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages", content=at_limit, headers=JSON)
    assert body["detail"].startswith("content: ")
    over = raw({**filler, "content": "x" * (LIMIT + 1 - len(raw(filler)))})
    await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages", status=413, content=over, headers=JSON)


async def test_the_limits_are_settings(falkordb_url):
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, max_request_bytes=4096, max_message_chars=100, max_extras_bytes=64)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            small = await http.post("/v1/sessions/s9/messages", json={**MESSAGE, "content": "y" * 100})
            assert small.status_code == 200, small.text
            long = await http.post("/v1/sessions/s9/messages", json={**MESSAGE, "message_id": "m2", "content": "y" * 101})
            assert long.status_code == 422 and "content is 101 characters long; the limit is 100" in long.json()["detail"]
            big = await http.post("/v1/sessions/s9/messages", json={**MESSAGE, "message_id": "m3", "content": "y" * 5000})
            assert big.status_code == 413 and "4096 bytes" in big.json()["detail"]
            extras = await http.put(f"/v1/agents/{AGENT}", json={"agent_extras": {"note": "z" * 60}})
            assert extras.status_code == 422
            assert extras.json()["detail"] == "agent_extras is 71 bytes of JSON; the limit is 64 (MAX_EXTRAS_BYTES)"
            assert (await http.get(f"/v1/agents/{AGENT}")).status_code == 404


async def test_agent_extras_are_held_to_max_extras_bytes(seeded, falkordb_url):
    body = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}",
                         json={"agent_extras": {"blob": "é" * 10_000}})
    assert body["detail"] == "agent_extras is 20011 bytes of JSON; the limit is 16384 (MAX_EXTRAS_BYTES)"
    fits = await seeded.put(f"/v1/agents/{AGENT}", json={"agent_extras": {"blob": "é" * 8_000}})
    assert fits.status_code == 200


# --- answers quote a short prefix ---------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("message_id", "m" * 900_000),
    ("agent_id", "a" * 900_000),
    ("role", "r" * 900_000),
    ("created_at", "t" * 900_000),
    ("content", 7),
])
async def test_a_large_bad_value_is_quoted_by_a_short_prefix(seeded, falkordb_url, field, value):
    body = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages",
                         json={**MESSAGE, "message_id": "m2", field: value})
    assert body["errors"][0]["loc"] == ["body", field] and body["detail"].startswith(f"{field}: ")
    assert len(body["detail"]) < 1_000


async def test_many_problems_are_counted_not_listed(seeded, falkordb_url):
    body = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages",
                         json={**MESSAGE, **{f"extra{i}-" + "k" * 200: "v" * 200 for i in range(2_000)}})
    assert len(body["errors"]) == 10 and body["detail"].endswith("and 1990 more problem(s)")
    assert body["errors"][0]["loc"][1].startswith("extra0-kkk") and body["errors"][0]["loc"][1].endswith("…")


async def test_large_bad_namespaces_are_bounded(seeded, falkordb_url):
    many = await refused(seeded, falkordb_url, "POST", f"/v1/agents/{AGENT}/search",
                         json={"query": "seats", "scope": "namespaces", "namespaces": [f"session:s{i}" for i in range(101)]})
    assert many["detail"].startswith("namespaces: List should have at most 100 items")
    long = await refused(seeded, falkordb_url, "GET", "/v1/search",
                         params={"agent_id": AGENT, "query": "seats", "scope": "namespaces", "namespaces": "n" * 5000})
    assert long["errors"][0]["loc"] == ["namespaces", 0]
    unknown = await refused(seeded, falkordb_url, "POST", f"/v1/agents/{AGENT}/search", status=404,
                            json={"query": "seats", "scope": "namespaces", "namespaces": ["user:other:" + "u" * 250]})
    assert len(unknown["detail"]) < 300


# --- NaN, Infinity ------------------------------------------------------------------------

@pytest.mark.parametrize("constant", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": "m2", "content": None}, "content"),
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": None}, "message_id"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {"tone": {"level": None}}}, "agent_extras.tone.level"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {"weights": [1.0, None]}}, "agent_extras.weights.1"),
    ("PUT", f"/v1/agents/{AGENT}/shards/travel", {"name": "travel", "active": None}, "active"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": "seats", "min_score": None}, "min_score"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": "seats", "top_k": None}, "top_k"),
])
async def test_nan_and_infinity_are_refused_naming_the_field(seeded, falkordb_url, constant, method, path, body, field):
    text = raw(body).decode().replace("null", json.dumps(constant, allow_nan=True), 1)
    answer = await refused(seeded, falkordb_url, method, path, content=text.encode(), headers=JSON)
    assert answer["detail"].startswith(f"{field}: ") and "is not a JSON number" in answer["detail"], answer


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
async def test_nan_in_a_query_parameter_is_refused(seeded, falkordb_url, value):
    answer = await refused(seeded, falkordb_url, "GET", "/v1/search",
                           params={"agent_id": AGENT, "query": "seats", "min_score": value})
    assert answer["detail"] == "query.min_score: Input should be a finite number"
    assert answer["errors"][0]["input"] == repr(value)


# --- lone surrogates ----------------------------------------------------------------------

LONE = "\ud800"


@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": "m2", "content": f"hi {LONE}"}, "content"),
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "agent_id": f"a{LONE}"}, "agent_id"),
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "user_id": LONE}, "user_id"),
    ("POST", "/v1/sessions/s1/messages", {**MESSAGE, "message_id": f"m{LONE}"}, "message_id"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {"tone": ["warm", f"x{LONE}"]}}, "agent_extras.tone.1"),
    ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {f"k{LONE}": 1}}, f"agent_extras.k{LONE}"),
    ("PUT", f"/v1/agents/{AGENT}", {"memory_backend": f"graph{LONE}"}, "memory_backend"),
    ("PUT", f"/v1/agents/{AGENT}/shards/travel", {"name": f"travel {LONE}"}, "name"),
    ("PUT", f"/v1/agents/{AGENT}/shards/travel", {"name": "travel", "extraction_focus": LONE}, "extraction_focus"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": f"seats {LONE}"}, "query"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": "seats", "scope": "namespaces",
                                            "namespaces": [f"session:s{LONE}"]}, "namespaces.0"),
    ("POST", f"/v1/agents/{AGENT}/search", {"query": "seats", "scope": "user", "user_id": LONE}, "user_id"),
])
async def test_lone_surrogates_are_refused_naming_the_field(seeded, falkordb_url, method, path, body, field):
    answer = await refused(seeded, falkordb_url, method, path, content=raw(body), headers=JSON)
    shown = field.encode("utf-8", "backslashreplace").decode()
    assert answer["detail"].startswith(f"{shown}: "), answer
    assert "lone surrogate U+D800" in answer["detail"]


@pytest.mark.parametrize("garbage, words", [
    (b"\xed\xa0\x80", "byte 10 (0xed)"),  # a surrogate encoded as UTF-8, which Python's json would take
    (b"\xff", "byte 10 (0xff)"),
    (b"\xc3", "byte 10 (0xc3)"),  # a truncated sequence
])
async def test_a_body_that_is_not_utf8_is_refused(seeded, falkordb_url, garbage, words):
    content = b'{"name": "' + garbage + b'"}'
    answer = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}/shards/travel", content=content,
                           headers=JSON)
    assert answer["detail"].startswith("body: the body is not UTF-8: ") and words in answer["detail"]


async def test_surrogates_in_the_path_or_query_are_not_a_500(seeded):
    # URLs are percent-decoded as UTF-8 with replacement: an encoded surrogate becomes U+FFFD.
    for path in ["/v1/agents/%ED%A0%80", "/v1/sessions/%ED%A0%80", "/v1/agents/%ED%A0%80/shards/%ED%A0%80"]:
        answer = await seeded.request("PUT" if "shards/" in path else "GET", path, json={"name": "x"})
        assert answer.status_code < 500, (path, answer.text)
    answer = await seeded.get(f"/v1/search?agent_id={AGENT}&query=%ED%A0%80&user_id=%ED%A0%80&scope=user")
    assert answer.status_code < 500, answer.text


# --- nesting and other unusable JSON ----------------------------------------------------------

@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 1_000, 100_000])
async def test_deep_nesting_is_refused(seeded, falkordb_url, depth):
    nested = b"[" * depth + b"]" * depth
    content = b'{"agent_extras": {"deep": ' + nested + b"}}"
    answer = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}", content=content, headers=JSON)
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in answer["detail"]


async def test_nesting_within_the_limit_is_stored(seeded):
    nested = {"deep": json.loads("[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2))}
    answer = await seeded.put(f"/v1/agents/{AGENT}", json={"agent_extras": nested})
    assert answer.status_code == 200, answer.text
    assert (await seeded.get(f"/v1/agents/{AGENT}")).json()["agent_extras"] == nested


@pytest.mark.parametrize("content, words", [
    (b'{"name": "x"', "the body is not JSON: Expecting ',' delimiter at character 12"),
    (b"\xef\xbb\xbf{}", "the body is not JSON: Unexpected UTF-8 BOM"),
    (b'{"name": ' + b"9" * 5_000 + b"}", "the body is not usable JSON: 'Exceeds the limit (4300 digits)"),
    (b'{"name": "x", "extraction_focus": 1e999}', "is not a JSON number"),
])
async def test_other_unusable_json_is_refused(seeded, falkordb_url, content, words):
    answer = await refused(seeded, falkordb_url, "PUT", f"/v1/agents/{AGENT}/shards/travel", content=content,
                           headers=JSON)
    assert words in answer["detail"], answer


# --- ids that cannot be path segments -------------------------------------------------------

@pytest.mark.parametrize("bad", [".", "..", "a/b", "a\\b"])
async def test_ids_that_cannot_be_path_segments_are_refused_everywhere(seeded, falkordb_url, bad):
    for field in ("agent_id", "user_id", "message_id"):
        answer = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages", json={**MESSAGE, field: bad})
        assert answer["detail"].startswith(f"{field}: ") and "any Unicode letters, digits, punctuation" in answer["detail"]
        assert "except ':', '/' and '\\'" in answer["detail"] or field == "message_id"
    for params in ({"scope": "session", "session_id": bad}, {"scope": "shard", "shard_id": bad},
                   {"scope": "user", "user_id": bad}):
        answer = await refused(seeded, falkordb_url, "GET", "/v1/search", params={"agent_id": AGENT, "query": "x", **params})
        assert "not '.' or '..'" in answer["detail"]


@pytest.mark.parametrize("path", ["/v1/agents/%2E%2E", "/v1/agents/%2E", "/v1/agents/a%5Cb", "/v1/sessions/%2E%2E",
                                  "/v1/agents/guarded/shards/%2E%2E"])
async def test_dot_segments_sent_encoded_are_refused_with_the_rule(seeded, falkordb_url, path):
    method = "PUT" if "/shards/" in path else "GET"
    answer = await refused(seeded, falkordb_url, method, path, json={"name": "x"} if method == "PUT" else None)
    assert "not '.' or '..'" in answer["detail"]


# --- times ------------------------------------------------------------------------------------

@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "0001-01-01T23:59:59Z", "9999-12-31T23:59:59-14:00",
                                  "9999-12-30T00:00:01Z"])
async def test_times_that_break_utc_arithmetic_are_refused(seeded, falkordb_url, when):
    # 0001-01-01T00:00+14:00 was stored, and then every memory block of its session came out empty.
    body = await refused(seeded, falkordb_url, "POST", "/v1/sessions/s1/messages",
                         json={**MESSAGE, "message_id": "m2", "created_at": when})
    assert body["detail"] == "created_at: Value error, must lie between 0001-01-02 and 9999-12-30 (UTC)"
    for bound in ("since", "until"):
        body = await refused(seeded, falkordb_url, "GET", "/v1/search", params={"agent_id": AGENT, "query": "x", bound: when})
        assert body["detail"].startswith(f"{bound}: Value error, must lie between")


async def test_times_at_the_bounds_are_stored_and_read(seeded):
    for i, when in enumerate(["0001-01-02T00:00:00Z", "9999-12-29T10:00:00-14:00"]):
        answer = await seeded.post("/v1/sessions/s1/messages", json={**MESSAGE, "message_id": f"t{i}", "created_at": when})
        assert answer.status_code == 200, answer.text
    block = (await seeded.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1",
                                                     "query": "aisle seats"})).json()
    assert block["source"] == "graph" and "aisle seats" in block["xml"]


# --- the Python API ---------------------------------------------------------------------------

@pytest.mark.parametrize("extras, words", [
    ({"w": [1.0, float("nan")]}, "agent_extras['w'][1] nan is not a JSON number"),
    ({"t": "a\ud800"}, "agent_extras['t'] contains a lone surrogate U+D800"),
    ({"deep": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32 levels"),
    ({"s": {1, 2}}, "a set is not a JSON value"),
    ({"blob": "x" * 20_000}, "agent_extras is 20011 bytes of JSON; the limit is 16384 (MAX_EXTRAS_BYTES)"),
])
async def test_the_python_api_holds_agent_extras_to_the_same_rules(service, falkordb_url, extras, words):
    from memory_service.domain.errors import InvalidInput
    from memory_service.domain.models import AgentSettings

    await wait_embedding_idle(falkordb_url, AGENT)  # the live server's last job, a test ago
    before = await state(falkordb_url)
    with pytest.raises(InvalidInput) as raised:
        await service.put_agent(AGENT, AgentSettings(agent_extras=extras))
    assert words in str(raised.value)
    assert await state(falkordb_url) == before


async def test_the_python_api_refuses_lone_surrogates_and_long_content(service, falkordb_url):
    from pydantic import ValidationError

    from memory_service.domain.errors import InvalidInput
    from memory_service.domain.models import MessageIn, ShardIn

    # pydantic itself refuses lone surrogates in text fields (string_unicode).
    with pytest.raises(ValidationError, match="unable to parse raw data as a unicode string"):
        MessageIn(**{**MESSAGE, "content": "hi \udc00"})
    with pytest.raises(ValidationError, match="unable to parse raw data as a unicode string"):
        ShardIn(name="\ud800")
    before = await state(falkordb_url)
    with pytest.raises(InvalidInput, match="the limit is 32000 \\(MAX_MESSAGE_CHARS\\)"):
        await service.record_message("s1", MessageIn(**{**MESSAGE, "content": "x" * 32_001}))
    assert await state(falkordb_url) == before
