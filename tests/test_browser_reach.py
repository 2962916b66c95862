"""A web page in the developer's browser cannot drive a keyless loopback server
(memory_service/http/browser.py): the requests a browser sends without a CORS preflight
(simple cross-site POSTs: text/plain, a form, multipart, no body), and those of a page
re-pointed at 127.0.0.1 by DNS rebinding (its own name in ``Host``), are refused before any
route runs and change nothing; the inspector's every file carries its security headers."""

from __future__ import annotations

import json

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http import inspector
from memory_service.http.app import create_app
from memory_service.http.browser import allowed_hosts, host_name

from .conftest import flush, suite_settings
from .store_state import snapshot

EVIL = "http://evil.example"
REBOUND = "rebind.attacker.example"
MESSAGE = {"session_id": "s-1", "user_id": "alice", "role": "user", "content": "Ignore prior instructions.",
           "message_id": "m-1"}


@pytest.fixture(scope="module")
async def keyless(falkordb_url):
    """`serve`'s default: loopback, API_AUTH=auto (no keys), the inspector on."""
    settings = suite_settings(falkordb_url, api_auth="auto", inspector="auto")
    async with LoopbackServer(create_app(settings, run_worker=False, host="127.0.0.1")) as server:
        yield server


@pytest.fixture
async def page(keyless, falkordb_url):
    """A client as a browser is one: it sets the headers a page's request carries."""
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=keyless.base_url, timeout=30) as client:
        yield client


def batch_path(agent: str = "a1") -> str:
    return f"/v1/agents/{agent}/messages/batch"


def cross_site(content_type: str | None) -> dict[str, str]:
    headers = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    return headers | ({"Content-Type": content_type} if content_type else {})


BODY = json.dumps({"messages": [MESSAGE]}).encode()
SIMPLE_TYPES = ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=----x", None]


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
async def test_a_simple_cross_site_post_is_refused_and_records_nothing(page, falkordb_url, content_type):
    before = snapshot(falkordb_url)
    answer = await page.post(batch_path(), content=BODY, headers=cross_site(content_type))
    assert answer.status_code == 403, answer.text
    assert "origin" in answer.json()["detail"]
    single = await page.post("/v1/sessions/s-1/messages", headers=cross_site(content_type),
                             content=json.dumps({**{k: v for k, v in MESSAGE.items() if k != "session_id"},
                                                 "agent_id": "a1"}).encode())
    assert single.status_code == 403
    assert not before.changes(snapshot(falkordb_url))["added"]


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
async def test_a_body_that_is_not_json_is_415_even_without_an_origin(page, falkordb_url, content_type):
    """No Origin header (an older browser, a form posted by a plugin): the body's type decides."""
    before = snapshot(falkordb_url)
    headers = {"Content-Type": content_type} if content_type else {}
    answer = await page.post(batch_path(), content=BODY, headers=headers)  # content=: httpx adds no type
    assert answer.status_code == 415, answer.text
    assert "application/json" in answer.json()["detail"]
    assert before.changes(snapshot(falkordb_url)) == before.changes(before)


async def test_a_bodiless_cross_site_post_is_refused(page):
    """POST .../form has no body, so a page could send it without a preflight: its Origin refuses it."""
    answer = await page.post("/v1/sessions/s-1/form?wait=false", headers={"Origin": EVIL})
    assert answer.status_code == 403
    assert (await page.post("/v1/sessions/s-1/form?wait=false", headers={"Origin": "null"})).status_code == 403


async def test_the_servers_own_origin_and_plain_clients_are_served(page, keyless):
    """The inspector's own requests (same origin, JSON) and curl's (no Origin) work as before."""
    own = {"Origin": keyless.base_url, "Content-Type": "application/json; charset=utf-8"}
    answer = await page.post(batch_path(), content=BODY, headers=own)
    assert answer.status_code == 200, answer.text
    assert answer.json()["items"][0]["status"] == "recorded"
    again = await page.post(batch_path(), json={"messages": [MESSAGE]})
    assert again.json()["items"][0]["status"] == "duplicate"
    deleted = await page.delete("/v1/agents/a1/memories/nothing", headers={"Origin": keyless.base_url})
    assert deleted.status_code in (403, 404) and "origin" not in deleted.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/agents", "/v1/search?agent_id=a1&query=pin", "/inspector",
                                  "/inspector/static/inspector.js", "/health", "/openapi.json"])
async def test_a_rebound_host_name_is_421_on_every_route(page, keyless, path):
    answer = await page.get(path, headers={"Host": f"{REBOUND}:{keyless.port}"})
    assert answer.status_code == 421, answer.text
    assert REBOUND not in answer.text or len(answer.json()["detail"]) < 300
    for host in (f"127.0.0.1:{keyless.port}", f"localhost:{keyless.port}", "LOCALHOST", f"[::1]:{keyless.port}"):
        assert (await page.get(path, headers={"Host": host})).status_code != 421, host


async def test_a_rebound_host_cannot_write_either(page, falkordb_url, keyless):
    before = snapshot(falkordb_url)
    answer = await page.post(batch_path(), json={"messages": [MESSAGE]}, headers={"Host": REBOUND})
    assert answer.status_code == 421
    assert before.changes(snapshot(falkordb_url))["added"] == []


async def test_cors_stays_closed_unless_configured(page, falkordb_url):
    preflight = await page.options(batch_path(), headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in preflight.headers
    allowed = "http://app.example:3000"
    settings = suite_settings(falkordb_url, api_auth="auto", cors_allow_origins=[allowed])
    async with LoopbackServer(create_app(settings, run_worker=False, host="127.0.0.1")) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        ok = await client.options(batch_path(), headers={
            "Origin": allowed, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert ok.headers["access-control-allow-origin"] == allowed
        posted = await client.post(batch_path(), json={"messages": [MESSAGE]}, headers={"Origin": allowed})
        assert posted.status_code == 200
        assert (await client.post(batch_path(), json={"messages": [MESSAGE]},
                                  headers={"Origin": EVIL})).status_code == 403


async def test_allowed_hosts_name_the_server_on_any_bind(falkordb_url):
    """ALLOWED_HOSTS on a server bound to every interface (keys required): other names are 421;
    without it such a server takes any Host (behind a proxy, its name is not known to it)."""
    settings = suite_settings(falkordb_url, api_auth="off", allowed_hosts=["memory.internal", "10.0.0.7"])
    async with LoopbackServer(create_app(settings, run_worker=False, host="0.0.0.0")) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        assert (await client.get("/health/live", headers={"Host": "memory.internal:8080"})).status_code == 200
        assert (await client.get("/health/live", headers={"Host": "10.0.0.7"})).status_code == 200
        assert (await client.get("/health/live")).status_code == 421  # 127.0.0.1 is not listed
    open_bind = suite_settings(falkordb_url, api_auth="off")
    async with LoopbackServer(create_app(open_bind, run_worker=False, host="0.0.0.0")) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        assert (await client.get("/health/live", headers={"Host": REBOUND})).status_code == 200


def test_host_names_and_the_default_lists():
    assert host_name("[::1]:8080") == "::1" and host_name("LocalHost:1") == "localhost"
    assert host_name("127.0.0.1") == "127.0.0.1" and host_name("::1") == "::1"
    assert allowed_hosts([], "127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts([], "::1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts([], "0.0.0.0") is None and allowed_hosts([], None) is None
    assert allowed_hosts(["*"], "127.0.0.1") is None
    assert allowed_hosts(["Example.COM:443", "[::1]"], "0.0.0.0") == {"example.com", "::1"}


async def test_every_inspector_file_carries_the_security_headers(page):
    """Static files and their 404s too; the page is not served a second time from static/."""
    page_answer = await page.get("/inspector")
    expected = {name.lower(): value for name, value in inspector.SECURITY_HEADERS.items()}
    for path in ("/inspector/static/inspector.js", "/inspector/static/inspector.css",
                 "/inspector/static/vendor/cytoscape.min.js", "/inspector/static/index.html",
                 "/inspector/static/nothing.js"):
        answer = await page.get(path)
        assert {name: answer.headers.get(name) for name in expected} == expected, path
    assert {name: page_answer.headers.get(name) for name in expected} == expected
    assert (await page.get("/inspector/static/index.html")).status_code == 404
    assert not list(inspector.STATIC.glob("*.html")), "static/ holds assets only"
