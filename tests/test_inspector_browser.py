"""The web inspector (docs/inspector.md) in a real browser: Debian's headless Chromium, driven
through chromedriver (selenium), against `memory-service serve` on loopback with keys
required, on a temporary embedded store, seeded through the API. Each view loads and shows
the seeded data; the search playground shows what the API explains for the same query; a
delete through the page is seen by the API; a read key's delete is refused on the page and
the memory stays.

Run by `make test-browser` (CI) and in the suite; skipped, saying why, only where chromium
or chromedriver is not installed (`apt-get install chromium chromium-driver`). With
INSPECTOR_SCREENSHOTS=<folder> (`make screenshots`) each view is saved as a PNG there
(docs/inspector/)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = os.environ.get("INSPECTOR_SCREENSHOTS")
AGENT = "travel-agent"

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="no chromium/chromedriver: `apt-get install chromium chromium-driver` (CI installs them, .ci/run)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class World:
    base_url: str
    operator: str
    read: str
    write: str
    ids: dict[str, str]

    def http(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """`memory-service serve` on 127.0.0.1 (keys required), seeded through the API."""
    data = Path(tempfile.mkdtemp(prefix="inspector-browser-"))
    operator = secrets.token_urlsafe(32)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k.upper() not in ("FALKORDB_URL", "REDIS_URL", "MONGODB_URI")}
    env.update(PYTHONPATH=str(REPO), EMBEDDER="hash", API_AUTH="keys", OPERATOR_API_KEY=operator,
               MEMORY_WRITE_AGENTS='["*"]')
    server = subprocess.Popen(
        [sys.executable, "-m", "memory_service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data / "store"), "--log-level", "warning"],
        cwd=data, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited: {server.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.3)
        yield seed(base_url, operator)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(data, ignore_errors=True)


def seed(base_url: str, operator: str) -> World:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {operator}"}, timeout=120) as http:
        def ok(answer: httpx.Response) -> Any:
            assert answer.status_code in (200, 201), answer.text
            return answer.json()

        ok(http.put(f"/v1/agents/{AGENT}", json={}))
        lines = [("alice", "alice-s1", "I live in Paris and I work at Acme as a pilot."),
                 ("alice", "alice-s1", "My cat Miso loves sardines."),
                 ("alice", "alice-s1", "I prefer window seats on long flights."),
                 ("bob", "bob-s1", "I am allergic to peanuts."),
                 ("bob", "bob-s1", "Book me a hotel near the station in Lyon.")]
        for n, (user, session, text) in enumerate(lines):
            ok(http.post(f"/v1/sessions/{session}/messages", json={
                "agent_id": AGENT, "user_id": user, "role": "user", "content": text, "message_id": f"m{n}"}))
        for session in ("alice-s1", "bob-s1"):
            ok(http.post(f"/v1/sessions/{session}/form", params={"wait": "true"}))
        # A message left pending (its window not formed): the formation view shows it.
        ok(http.post("/v1/sessions/alice-s2/messages", json={
            "agent_id": AGENT, "user_id": "alice", "role": "user", "content": "Next month I fly to Oslo.",
            "message_id": "m9"}))
        alice = f"user:{AGENT}:alice"
        ids: dict[str, str] = {}
        ids["kayak"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "observation", "content": "Alice kayaks on the Seine every Sunday.",
            "tags": ["hobby"]}))["id"]
        ids["doomed"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "fact", "content": "Alice's old passport expires in March."}))["id"]
        ids["kept"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "fact", "content": "Alice collects vintage maps of Norway."}))["id"]
        ids["markup"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "observation",
            "content": 'Alice wrote <img src=x onerror="document.body.dataset.pwned=1"> in a note.'}))["id"]
        # Expiry: one memory past its end already when the tests run, one ending in ten days; the
        # agent's times to live per kind and a shard's (set last: the memories above have none).
        soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
        ids["expired"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "fact", "content": "Alice's boarding pass for Oslo is gate 12.",
            "expires_at": soon}))["id"]
        later = (datetime.now(UTC) + timedelta(days=10)).replace(microsecond=0)
        ids["expiring"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "fact", "content": "Alice's hotel in Oslo is booked until the 14th.",
            "expires_at": later.isoformat()}))["id"]
        ids["expiring_at"] = later.strftime("%Y-%m-%d %H:%M:%S")
        ids["wrong"] = ok(http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": alice, "kind": "observation", "content": "Alice's seat on the Oslo flight is 14C."}))["id"]
        # The graph: Alice lived in Paris, then in Lyon (the Paris fact superseded).
        for city in ("Paris", "Lyon"):
            block = ('<memory_write>{"entities": [{"name": "Alice", "type": "person"}, {"name": "%s", "type": "city"}], '
                     '"edges": [{"source": "Alice", "target": "%s", "rel_type": "lives in"}, '
                     '{"source": "Alice", "target": "Acme", "rel_type": "works at"}]}</memory_write>') % (city, city)
            ok(http.post(f"/v1/agents/{AGENT}/writes/parse", json={"text": block, "namespace": alice}))
        # Formation made her entity (the user's, named by her id); the blocks' "Alice" resolved to it.
        entities = ok(http.get(f"/v1/agents/{AGENT}/entities", params={"user_id": "alice"}))["entities"]
        (ids["alice_entity"],) = [e["id"] for e in entities if e["name"].lower() == "alice"]
        ok(http.put(f"/v1/agents/{AGENT}", json={"memory_ttl": {"episode": "30d", "suggestion": "12h"}}))
        ok(http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel", "memory_ttl": "2w"}))
        read = ok(http.post("/v1/keys", json={"name": "viewer", "role": "read", "agents": [AGENT]}))["key"]
        write = ok(http.post("/v1/keys", json={"name": "editor", "role": "write", "agents": [AGENT]}))["key"]
        ids["bob_key"] = ok(http.post("/v1/keys", json={"name": "bob's", "role": "read", "agents": [AGENT],
                                                        "users": ["bob"]}))["key"]
    return World(base_url, operator, read, write, ids)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="inspector-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1440,1000",
                "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# ---- driving the page --------------------------------------------------------------------------

class Page:
    def __init__(self, driver: Any, world: World):
        self.driver, self.world = driver, world

    def open(self, key: str | None, view: str = "agents") -> Page:
        self.driver.get("about:blank")  # a new document: not the hash change of the one before
        self.driver.get(f"{self.world.base_url}/inspector#{view}")
        self.wait(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        if key:
            self.fill("#api-key", key)
            self.click("#use-key")
            self.settle()
        return self

    def wait(self, condition: Any, timeout: float = 30) -> Any:
        """``condition`` true; the page redraws tables as answers arrive, so an element
        found a moment ago may be gone (stale): looked for again."""
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, ignored_exceptions=(
            NoSuchElementException, StaleElementReferenceException)).until(condition)

    def settle(self) -> None:
        self.wait(lambda d: d.execute_script("return document.body.dataset.busy === '0'"))

    def el(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def els(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.el(css).text)

    def click(self, css: str) -> None:
        self.wait(lambda d: self.el(css).click() or True)

    def fill(self, css: str, value: str) -> None:
        field = self.el(css)
        field.clear()
        field.send_keys(value)

    def view(self, name: str) -> None:
        self.click(f'#nav a[data-view="{name}"]')
        self.settle()

    def open_memory(self, key: str, user_id: str, memory_id: str) -> None:
        """The memories view as ``key`` sees it, listed for ``user_id``, with ``memory_id`` opened."""
        self.open(key, "memories")
        self.fill('#memories-form input[name="user_id"]', user_id)
        self.click('#memories-form button[type="submit"]')
        self.settle()
        self.click(f'#memories-table tr[data-id="{memory_id}"]')
        self.settle()

    def ask_delete(self) -> None:
        """The open memory's delete button, up to its confirmation dialog (open, not answered)."""
        self.click("#memory-delete")
        self.wait(lambda d: self.el("#confirm").get_attribute("open") is not None)

    def shows(self, css: str, words: str) -> str:
        """Wait until ``css``'s text holds ``words``; its text."""
        self.wait(lambda d: words in self.text(css))
        return self.text(css)

    def shot(self, name: str) -> None:
        if SHOTS:
            folder = Path(SHOTS)
            folder.mkdir(parents=True, exist_ok=True)
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(1440, min(max(int(height), 800), 2400))
            self.driver.save_screenshot(str(folder / f"{name}.png"))
            self.driver.set_window_size(1440, 1000)

    def errors(self) -> list[str]:
        """The browser console's errors (a Content-Security-Policy refusal is one, a script's
        error another), but the API's refusals (the page loads before a key is typed: 401)."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"
                and not re.search(r"/v1/\S+ - Failed to load resource: the server responded with a status of 4\d\d",
                                  entry["message"])]


@pytest.fixture
def page(browser: Any, world: World) -> Page:
    browser.get_log("browser")  # start each test with an empty console
    return Page(browser, world)


def test_without_a_key_the_page_asks_for_one_and_shows_nothing(page):
    page.open(None)
    notice = page.shows("#notice", "needs an API key")
    assert "401" not in notice or "API key" in notice
    assert page.els("#agents-table tbody tr td.muted")  # "nothing"


def test_agents_users_and_sessions(page, world):
    page.open(world.operator)
    assert page.shows("#agents-table", AGENT)
    users = page.shows("#users-table", "alice")
    assert "bob" in users
    sessions = page.shows("#sessions-table", "alice-s1")
    assert "bob-s1" in sessions and "alice-s2" in sessions
    page.shot("agents")
    # Nothing the page loaded came from another origin, and the console has no error.
    origins = page.driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert origins and set(origins) == {world.base_url}, origins
    assert page.errors() == []
    # The key lives in the page's memory only: no cookie, nothing in the browser's storage.
    stored = page.driver.execute_script(
        "return [document.cookie, localStorage.length, sessionStorage.length, document.getElementById('api-key').value]")
    assert stored == ["", 0, 0, ""]


def test_memories_filtered_with_provenance(page, world):
    page.open(world.operator)
    page.click('#users-table tr[data-id="alice"]')  # a user's memories
    page.settle()
    listed = page.shows("#memories-table", "vintage maps")
    assert "allergic to peanuts" not in listed  # bob's, filtered out
    # A formed memory: its provenance names the window, the extractor and the messages.
    formed = [row for row in page.els("#memories-table tbody tr") if "lives in Paris" in row.text]
    assert formed, listed
    formed[0].click()
    page.settle()
    assert "lives in Paris" in page.shows("#memory-detail", "Provenance")
    assert re.search(r"Formed by window 1 \(extractor \w+", page.text("#memory-window"))
    assert "I live in Paris and I work at Acme as a pilot." in page.text("#memory-messages")
    page.shot("memories")
    # Markup in a memory is shown as text, never run.
    page.fill('#memories-form input[name="user_id"]', "alice")
    page.click('#memories-form button[type="submit"]')
    page.settle()
    page.click(f'#memories-table tr[data-id="{world.ids["markup"]}"]')
    page.settle()
    assert '<img src=x onerror="document.body.dataset.pwned=1">' in page.shows("#memory-content", "<img")
    assert page.driver.execute_script("return document.body.dataset.pwned") is None
    # Filters: a kind and a tag.
    page.fill('#memories-form input[name="tag"]', "hobby")
    page.click('#memories-form button[type="submit"]')
    page.settle()
    assert [r.get_attribute("data-id") for r in page.els("#memories-table tbody tr")] == [world.ids["kayak"]]


def test_the_search_playground_explains_as_the_api_does(page, world):
    query = "where does alice live and work"
    with world.http(world.operator) as http:
        api = http.get("/v1/search", params={"agent_id": AGENT, "query": query, "min_score": 0.5}).json()
    assert api["results"] or api["candidates"]
    page.open(world.operator, "search")
    page.fill('#search-form input[name="query"]', query)
    page.fill('#search-form input[name="min_score"]', "0.5")
    page.click('#search-form button[type="submit"]')
    page.settle()
    page.shows("#search-summary", "activated")
    table = page.el("#search-table")
    headers = [th.text for th in table.find_elements("css selector", "thead th")]
    rows = table.find_elements("css selector", "tbody tr")
    hits = [(h, True) for h in api["results"]] + [(h, False) for h in api["candidates"]]
    assert [r.get_attribute("data-id") for r in rows] == [h["id"] for h, _ in hits]
    for row, (hit, activated) in zip(rows, hits, strict=True):
        cells = dict(zip(headers, [td.text for td in row.find_elements("css selector", "td")], strict=True))
        explained = hit["explanation"]
        assert cells[""] == ("activated" if activated else "candidate")
        assert float(cells["fused"]) == pytest.approx(explained["fused"], abs=1e-3)
        assert float(cells["recency"]) == pytest.approx(explained["recency"], abs=1e-3)
        assert float(cells["score"]) == pytest.approx(explained["score"], abs=1e-3)
        for signal, scored in explained["signals"].items():
            assert int(cells[f"{signal} rank"]) == scored["rank"]
            assert float(cells[f"{signal} score"]) == pytest.approx(scored["score"], abs=1e-3)
    # The chart draws the same results: one bar per result in each dataset.
    bars = page.driver.execute_script(
        "const c = Chart.getChart('search-chart'); return c.data.datasets.map(d => d.data.length)")
    assert bars == [len(hits)] * 3
    assert page.errors() == []  # the library drew within the Content-Security-Policy
    page.shot("search")


def test_the_memory_block_with_what_was_left_out(page, world):
    params = {"agent_id": AGENT, "user_id": "alice", "session_id": "alice-s1", "query": "flights and seats",
              "budget": "600"}
    with world.http(world.operator) as http:
        api = http.get("/v1/context", params=params).json()
    page.open(world.operator, "context")
    for name in ("user_id", "session_id", "query", "budget"):
        page.fill(f'#context-form input[name="{name}"]', params[name])
    page.click('#context-form button[type="submit"]')
    page.settle()
    page.shows("#context-stats", "budget")
    # Exactly the block the API gives (the browser's text is the XML, not rendered markup).
    shown = page.driver.execute_script("return document.getElementById('context-xml').textContent")
    assert shown == api["xml"]
    left = page.text("#context-left-out")
    for why, count in api["left_out"].items():
        assert f"{why} {count}" in left
    assert "min_score" in page.text("#context-recall")
    page.shot("context")


def test_formation_windows_and_the_last_extraction(page, world):
    page.open(world.operator, "formation")
    summary = page.shows("#formation-summary", "Windows formed")
    assert "Windows formed: 2; pending: 1; failed: 0" in summary, summary
    assert "pending: 1 message(s)" in page.text('#formation-table tr[data-id="alice-s2"]')
    page.click('#formation-table tr[data-id="alice-s1"]')
    page.settle()
    last = page.shows("#last-window", "extractor")
    assert "1–3 (3)" in last  # the window of alice-s1's three messages
    assert "lives in Paris" in page.shows("#formation-memories", "lives in Paris")
    assert "job queue" in page.shows("#formation-outbox", "job queue")  # an operator key reads the deployment's health
    page.shot("formation")


def test_the_graph_around_an_entity_with_a_superseded_fact(page, world):
    page.open(world.operator, "graph")
    page.fill('#graph-form input[name="user_id"]', "alice")
    page.click('#graph-form button[type="submit"]')
    page.settle()
    page.shows("#entities-table", "Lyon")
    page.click(f'#entities-table tr[data-id="{world.ids["alice_entity"]}"]')
    page.settle()
    page.shows("#facts-table", "superseded")
    assert re.search(r"\d+ of \d+ facts, \d+ neighbours", page.shows("#facts-count", "facts"))  # one page, counted
    drawn = page.driver.execute_script("""
        const cy = document.getElementById('graph-canvas')._cyreg.cy;
        return {nodes: cy.nodes().map(n => n.data('label').split('\\n')[0]).sort(),
                edges: cy.edges().map(e => [e.data('label'), e.hasClass('superseded'),
                                            e.style('line-style')]).sort()};""")
    assert {"Acme", "alice", "Lyon", "Paris"} <= set(drawn["nodes"]), drawn
    assert ["lives_in", True, "dashed"] in drawn["edges"] and ["lives_in", False, "solid"] in drawn["edges"]
    assert ["works_at", False, "solid"] in drawn["edges"]
    assert page.errors() == []  # the library drew within the Content-Security-Policy
    page.shot("graph")


def test_a_key_for_one_user_shows_only_theirs(page, world):
    page.open(world.ids["bob_key"])
    assert page.shows("#users-table", "bob")
    assert "alice" not in page.text("#users-table") and "alice" not in page.text("#sessions-table")
    page.view("memories")
    listed = page.shows("#memories-table", "peanuts")
    assert "alice" not in listed.lower()
    page.view("search")
    page.fill('#search-form input[name="query"]', "paris")
    page.click('#search-form button[type="submit"]')
    page.settle()
    assert "403" in page.shows("#view-search [data-error]", "Refused")  # scope agent spans every user
    assert page.els("#search-table tbody tr") == []


def test_a_read_key_cannot_delete(page, world):
    memory = world.ids["kept"]
    page.open_memory(world.read, "alice", memory)
    page.ask_delete()
    page.click("#confirm-ok")
    refusal = page.shows("#memory-action-error", "Refused")
    assert "403" in refusal and "role is read" in refusal
    with world.http(world.operator) as http:
        assert http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()["deleted_at"] is None
    # The read key sees no audit log either (admin): the page says the API's refusal.
    page.view("audit")
    assert "403" in page.shows("#view-audit [data-error]", "Refused")


def test_a_delete_and_an_undelete_through_the_page_reach_the_api(page, world):
    memory = world.ids["doomed"]
    page.open_memory(world.write, "alice", memory)
    # Cancelled: nothing changes.
    page.ask_delete()
    page.click("#confirm-cancel")
    with world.http(world.operator) as http:
        assert http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()["deleted_at"] is None
    page.ask_delete()
    page.shot("delete-confirmation")
    page.click("#confirm-ok")
    page.settle()
    page.wait(lambda d: page.els("#memory-undelete"))
    with world.http(world.operator) as http:
        assert http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()["deleted_at"] is not None
        listed = http.get(f"/v1/agents/{AGENT}/memories", params={"user_id": "alice"}).json()["memories"]
        assert memory not in [m["id"] for m in listed]
    assert memory not in [r.get_attribute("data-id") for r in page.els("#memories-table tbody tr")]
    # Undeleted, then edited: the API sees both.
    page.click("#memory-undelete")
    page.click("#confirm-ok")
    page.settle()
    page.wait(lambda d: page.els("#memory-delete"))
    page.click("#memory-edit")
    page.fill("#edit-title", "Passport")
    page.click("#confirm-ok")
    page.settle()
    page.shows("#memory-detail", "Passport")
    with world.http(world.operator) as http:
        got = http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()
        assert got["deleted_at"] is None and got["title"] == "Passport"
    history = page.text("#memory-history")
    assert "memory.delete" in history and "memory.undelete" in history and "memory.update" in history


def test_the_audit_log_filtered(page, world):
    page.open(world.operator, "audit")
    page.shows("#audit-table", "key.create")
    page.fill('#audit-form input[name="action"]', "memory.write")
    page.click('#audit-form button[type="submit"]')
    page.settle()
    actions = {row.find_elements("css selector", "td")[1].text for row in page.els("#audit-table tbody tr")}
    assert actions == {"memory.write"}
    page.fill('#audit-form input[name="action"]', "")
    page.click('#audit-form button[type="submit"]')
    page.settle()
    page.shot("audit")


def test_expiry_the_memories_ends_and_the_agents_times_to_live(page, world):
    page.open(world.operator, "memories")
    ttl = page.shows("#memory-ttl", "Times to live")
    assert "per kind: episode 30d, suggestion 12h" in ttl and "per shard: travel 14d" in ttl, ttl
    page.fill('#memories-form input[name="user_id"]', "alice")
    page.click('#memories-form button[type="submit"]')
    page.settle()
    listed = page.shows("#memories-table", "hotel in Oslo")
    assert "boarding pass" not in listed  # expired: the live list skips it at once
    assert world.ids["expiring_at"] in page.text(f'#memories-table tr[data-id="{world.ids["expiring"]}"]')
    # State "all" lists it, said expired, and its detail says when.
    page.el('#memories-form select[name="state"]').send_keys("all")
    page.click('#memories-form button[type="submit"]')
    page.settle()
    row = page.shows(f'#memories-table tr[data-id="{world.ids["expired"]}"]', "expired")
    assert "boarding pass" in row
    page.click(f'#memories-table tr[data-id="{world.ids["expired"]}"]')
    page.settle()
    assert "expired" in page.shows("#memory-expires", "expired")
    assert "null" not in page.text("#memory-detail")  # nothing absent is shown as "null"
    page.shot("expiry")
    # A read key for one user cannot read the agent's settings: the page says so, and lists hers.
    page.open(world.ids["bob_key"], "memories")
    assert "not readable with this key" in page.shows("#memory-ttl", "Times to live")
    assert page.errors() == []


def test_the_change_events_live(page, world):
    page.open(world.operator, "events")
    page.wait(lambda d: page.el("#view-events").get_attribute("data-following") == "1")
    held = page.shows("#events-table", "written")
    assert "formed" in held and "superseded" in held  # the windows formed and the Paris fact closed
    # A change made now reaches the page while it follows the stream, newest first.
    with world.http(world.operator) as http:
        written = http.post(f"/v1/agents/{AGENT}/memories", json={
            "namespace": f"user:{AGENT}:alice", "kind": "observation", "content": "Alice learns Norwegian."}).json()
    page.wait(lambda d: written["id"] in page.text("#events-table tbody tr:first-child"))
    first = page.text("#events-table tbody tr:first-child")
    assert page.text("#events-table tbody tr:first-child span.badge") == "written"
    assert "written" in first and f"user:{AGENT}:alice" in first and "Norwegian" not in first  # ids, never words
    page.shot("events")
    # A row opens its memory.
    page.click("#events-table tbody tr:first-child")
    page.settle()
    assert "Alice learns Norwegian." in page.shows("#memory-content", "Norwegian")
    assert page.el("#view-events").get_attribute("data-following") == "0"  # leaving the view closed the stream
    assert page.errors() == []  # the stream was read within the Content-Security-Policy
    # A key for one user follows only what it may read.
    page.open(world.ids["bob_key"], "events")
    page.wait(lambda d: page.el("#view-events").get_attribute("data-following") == "1")
    page.shows("#events-table", "bob")
    assert "user:travel-agent:alice" not in page.text("#events-table")


def test_a_correction_and_its_undoing_through_the_page(page, world):
    memory = world.ids["wrong"]
    page.open_memory(world.write, "alice", memory)
    page.click("#memory-correct")
    page.wait(lambda d: page.el("#confirm").get_attribute("open") is not None)
    page.fill("#correct-content", "Alice's seat on the Oslo flight is 22A.")
    page.shot("correct-dialog")
    page.click("#confirm-ok")
    page.settle()
    page.shows("#memory-content", "22A")
    correction = page.text("#memory-corrects")
    assert correction == memory  # the correction's detail names the memory it corrects
    with world.http(world.operator) as http:
        old = http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()
        assert old["corrected_by"] and old["corrected_by"] != memory
        new = http.get(f"/v1/agents/{AGENT}/memories/{old['corrected_by']}").json()
        assert new["content"] == "Alice's seat on the Oslo flight is 22A." and new["corrects"] == memory
        listed = [m["id"] for m in http.get(f"/v1/agents/{AGENT}/memories", params={"user_id": "alice"}).json()["memories"]]
        assert memory not in listed and new["id"] in listed
    # The old one, opened from the link: shown as wrong, with its history, and undone.
    page.click("#memory-corrects")
    page.settle()
    assert "Found wrong" in page.shows("#memory-wrong", "corrected")
    assert "null" not in page.text("#memory-detail")
    assert "14C" in page.text("#memory-content")
    history = page.text("#memory-history")
    assert "memory.correct" in history and "correction" in history
    assert not page.els("#memory-correct") and not page.els("#memory-edit")
    page.click("#memory-uncorrect")
    page.click("#confirm-ok")
    page.settle()
    page.wait(lambda d: page.els("#memory-correct"))
    with world.http(world.operator) as http:
        assert http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()["corrected_by"] is None
        assert http.get(f"/v1/agents/{AGENT}/memories/{new['id']}").json()["deleted_at"] is not None
    assert "memory.uncorrect" in page.text("#memory-history")
    # A read key's correction is refused with the API's words, and nothing changes.
    page.open_memory(world.read, "alice", memory)
    page.click("#memory-correct")
    page.fill("#correct-content", "Alice's seat is 1A.")
    page.click("#confirm-ok")
    assert "403" in page.shows("#memory-action-error", "Refused")
    with world.http(world.operator) as http:
        assert http.get(f"/v1/agents/{AGENT}/memories/{memory}").json()["corrected_by"] is None
    assert page.errors() == []
