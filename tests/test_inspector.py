"""The web inspector's routes (memory_service/http/inspector), without a browser: when the
page is served (INSPECTOR: auto on loopback only, on, off), that it holds no data and is the
same for every caller, its headers (a Content-Security-Policy of its own origin only), and
that nothing it references lives on another origin. tests/test_inspector_browser.py drives
it in Chromium."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http import inspector
from memory_service.http.app import create_app

from .conftest import suite_settings

STATIC = inspector.STATIC
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("setting", "host", "served"), [
    ("auto", "127.0.0.1", True), ("auto", "::1", True), ("auto", "localhost", True), ("auto", "0.0.0.0", False),
    ("auto", "10.1.2.3", False), ("auto", None, False), ("on", "0.0.0.0", True), ("on", None, True),
    ("off", "127.0.0.1", False),
])
async def test_served_on_loopback_by_default_and_as_the_setting_says(falkordb_url, setting, host, served):
    app = create_app(suite_settings(falkordb_url, inspector=setting, api_auth="off"), run_worker=False, host=host)
    async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.base_url) as http:
        page = await http.get("/inspector")
        script = await http.get("/inspector/static/inspector.js")
        assert (page.status_code, script.status_code) == ((200, 200) if served else (404, 404))


def test_a_bad_setting_is_refused():
    with pytest.raises(ValueError, match="inspector"):
        suite_settings("redis://unused", inspector="yes")


@pytest.fixture(scope="module")
async def keyed(falkordb_url):
    """Keys required, the inspector on: its pages answer without a key, and hold nothing."""
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key="o" * 40, inspector="on")
    async with LoopbackServer(create_app(settings, run_worker=False, host="0.0.0.0")) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            yield http


async def test_the_page_is_static_the_same_for_every_caller(keyed):
    anonymous = await keyed.get("/inspector")
    operator = await keyed.get("/inspector/", headers={"Authorization": f"Bearer {'o' * 40}"})
    assert anonymous.status_code == operator.status_code == 200
    assert anonymous.content == operator.content == inspector.PAGE.read_bytes()
    assert anonymous.headers["content-type"].startswith("text/html")
    policy = anonymous.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "unsafe" not in policy
    assert anonymous.headers["x-content-type-options"] == "nosniff"
    assert anonymous.headers["referrer-policy"] == "no-referrer"
    assert anonymous.headers["cache-control"] == "no-store"
    assert "set-cookie" not in anonymous.headers  # the key is never a cookie
    # The API behind it still needs a key.
    assert (await keyed.get("/v1/agents")).status_code == 401


async def test_the_page_routes_are_not_api_operations(keyed):
    spec = (await keyed.get("/openapi.json")).json()
    assert not [path for path in spec["paths"] if path.startswith("/inspector")]


async def test_static_files_stay_inside_their_folder(keyed):
    for path in ("/inspector/static/../__init__.py", "/inspector/static/%2e%2e/__init__.py",
                 "/inspector/static/nothing.js"):
        answer = await keyed.get(path)
        assert answer.status_code == 404, path


class References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [value for name, value in attrs if name in ("src", "href", "action") and value]


async def test_the_page_references_no_other_origin(keyed):
    """Every src and href is a path of this server that answers; our scripts and styles name
    no URL at all (the vendored libraries' licence headers and docs links are comments, and
    the Content-Security-Policy refuses any other origin in the browser)."""
    parser = References()
    parser.feed(inspector.PAGE.read_text())
    assert parser.found, "the page references its scripts and styles"
    for ref in parser.found:
        if ref.startswith("#") or ref == "data:,":  # the empty icon: no request for /favicon.ico
            continue
        assert ref.startswith("/inspector/static/"), ref
        assert (await keyed.get(ref)).status_code == 200, ref
    for own in (STATIC / "inspector.js", STATIC / "inspector.css", inspector.PAGE):
        text = own.read_text()
        assert not re.search(r"https?://", text), f"{own} names a URL"
        assert "@import" not in text and "url(" not in text, own


def test_the_vendored_libraries_are_the_locked_ones():
    """static/vendor holds the builds of the versions scripts/inspector-vendor locks, each with its licence."""
    lock = json.loads((REPO / "scripts" / "inspector-vendor" / "package-lock.json").read_text())["packages"]
    vendor = STATIC / "vendor"
    chart = (vendor / "chart.umd.min.js").read_text()
    assert f"Chart.js v{lock['node_modules/chart.js']['version']}" in chart[:300]
    cytoscape = (vendor / "cytoscape.min.js").read_text()
    assert f'version="{lock["node_modules/cytoscape"]["version"]}"' in cytoscape
    for licence in ("chart.js.LICENSE.md", "cytoscape.LICENSE", "kurkle-color.LICENSE.md"):
        assert "MIT" in (vendor / licence).read_text() or "Permission is hereby granted" in (vendor / licence).read_text()
    assert "sourceMappingURL" not in chart  # `make inspector-vendor` strips it: no request for a file not shipped
