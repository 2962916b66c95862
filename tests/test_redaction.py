"""Secrets kept out of every store, log, trace and the audit log (docs/redaction.md), on a real
server (loopback HTTP, the embedded FalkorDB and Redis, a worker in process).

Every path where text enters is exercised with secrets in it: a message (the single route
and a batch), a memory write and an update (content, title, tags), write blocks, a startup
record and an import; the session is formed and embedded. Then every key of Redis is read by
its type, every node and edge property of every graph, every log line, every span and the
whole audit log, and no secret is found in any of them, in any case or spelling. The policy's
other modes (refuse: 422 naming the kind, nothing stored; off) and its bad settings (422),
personal data kept unless asked for, dedup and idempotent writes with redacted content.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient
from memory_service.curation.legacy_import import plan_import
from memory_service.domain.models import AgentSettings
from memory_service.domain.redaction import RedactionMode, RedactionSettings, SecretsRefused
from memory_service.http.app import create_app
from memory_service.runtime import open_service
from memory_service.state import tracing

from .conftest import REPO, clean_env, flush, server_urls, state_keys, suite_settings
from .helpers import wait_embedding_idle
from .store_state import snapshot

AGENT = "vault"
CLI = str(Path(sys.executable).parent / "memory-service")
# One of each kind, written as a user would paste it.
SECRETS = {
    "api_key": "sk-proj-Q7xWm2Lp9RtY4vBn8KcZ3dHf6JsA1gUe",
    "aws": "AKIAQ2MV7XR4PZ6TLB3W",
    "github": "ghp_N4uTq8Zr2Wx6Yb0Cv3Ke7Lm1Pa5Sd9Fg2Hj8K",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZTQyIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ",
    "password": "Tr0ub4dor&3x",
    "card": "4539 1488 0343 6467",
    "iban": "GB82 WEST 1234 5698 7654 32",
    "ssn": "219-09-9999",
    "pem": "MIIEowIBAAKCAQEA7QxZ3nP9vKm2Lr8TgY4wHs6Jd1Uf0Ac5Xb",
}
MESSAGE = (f"Here are my details so you can finish the setup: OpenAI key {SECRETS['api_key']}, AWS id "
           f"{SECRETS['aws']}, GitHub token {SECRETS['github']}, session {SECRETS['jwt']}. My password is "
           f"{SECRETS['password']}. Charge card {SECRETS['card']}, refunds to IBAN {SECRETS['iban']}, my SSN is "
           f"{SECRETS['ssn']}. I live in Lyon and my sister Ana works at Renault.\n"
           f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS['pem']}\n-----END RSA PRIVATE KEY-----")


def needles(value: str) -> set[str]:
    """What of ``value`` must be nowhere: itself, without separators, and its distinctive
    middle part, in lower case (the full-text postings keep lower-case words)."""
    bare = value.replace(" ", "").replace("-", "")
    found = {value.lower(), bare.lower()}
    if len(bare) >= 16:
        found.add(bare[4:16].lower())
    return found


NEEDLES = {n for value in SECRETS.values() for n in needles(value)}


def leaks(text: str) -> list[str]:
    lowered = text.lower()
    return sorted(n for n in NEEDLES if n in lowered)


def everything_stored(url: str) -> str:
    """Every key of every server, by name and content: strings, hashes, lists, sets, sorted
    sets and streams read by their type, graphs by every node's and edge's labels and
    properties."""
    out: list[str] = []
    for server in server_urls(url):
        client = redis.Redis.from_url(server)
        try:
            for key in client.scan_iter(count=1000):
                kind = client.type(key).decode()
                out.append(key.decode(errors="replace"))
                if kind == "string":
                    out.append(repr(client.get(key)))
                elif kind == "hash":
                    out.append(repr(client.hgetall(key)))
                elif kind == "list":
                    out.append(repr(client.lrange(key, 0, -1)))
                elif kind == "set":
                    out.append(repr(client.smembers(key)))
                elif kind == "zset":
                    out.append(repr(client.zrange(key, 0, -1, withscores=True)))
                elif kind == "stream":
                    out.append(repr(client.xrange(key)))
                elif kind == "graphdata":
                    for query in ("MATCH (n) RETURN labels(n), properties(n)",
                                  "MATCH ()-[e]->() RETURN type(e), properties(e)"):
                        out.append(repr(client.execute_command("GRAPH.RO_QUERY", key, query)))
                else:
                    out.append(repr(client.dump(key)))
        finally:
            client.close()
    return "\n".join(out)


@pytest.fixture(scope="module")
def spans():
    """Every span of this module's server (installed before its clients are made)."""
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter))
    yield exporter
    RedisInstrumentor().uninstrument()
    exporter.clear()
    exporter.shutdown()


@pytest.fixture(scope="module")
async def server(falkordb_url, spans):
    settings = suite_settings(falkordb_url, memory_write_agents=["*"], never_form_memories_less_than_n_messages=100,
                              memory_formation_msg_interval=100)
    async with LoopbackServer(create_app(settings, run_worker=True)) as started:
        yield started


@pytest.fixture
async def http(server, falkordb_url):
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client


async def record(http, session: str, content: str, mid: str, agent: str = AGENT) -> httpx.Response:
    return await http.post(f"/v1/sessions/{session}/messages", json={
        "agent_id": agent, "user_id": "alice", "role": "user", "content": content, "message_id": mid})


async def policy(http, agent: str = AGENT, **redaction) -> None:
    answer = await http.put(f"/v1/agents/{agent}", json={"redaction": redaction})
    assert answer.status_code == 200, answer.text


async def test_no_secret_reaches_a_store_a_log_a_trace_or_the_audit_log(http, server, falkordb_url, spans, caplog,
                                                                        tmp_path):
    caplog.set_level(logging.DEBUG)
    spans.clear()
    # A message, and a batch of two.
    answer = await record(http, "s1", MESSAGE, "m1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["redacted"] == {"api_key": 3, "token": 1, "private_key": 1, "password": 1, "card_number": 1,
                                         "iban": 1, "government_id": 1}
    batch = await http.post(f"/v1/agents/{AGENT}/messages/batch", json={"messages": [
        {"session_id": "s1", "user_id": "alice", "role": "user", "message_id": "m2",
         "content": f"the wifi password is {SECRETS['password']}"},
        {"session_id": "s2", "user_id": "alice", "role": "assistant", "message_id": "m3",
         "content": "Noted, I will not repeat it."}]})
    assert batch.status_code == 200, batch.text
    assert [(i["status"], i["redacted"]) for i in batch.json()["items"]] == [("recorded", {"password": 1}),
                                                                            ("recorded", {})]
    # A memory written and updated; write blocks; a startup record.
    written = await http.post(f"/v1/agents/{AGENT}/memories", json={
        "namespace": f"user:{AGENT}:alice", "kind": "fact", "content": f"Alice's card is {SECRETS['card']}",
        "title": f"key {SECRETS['api_key']}", "tags": ["billing", SECRETS["aws"]]})
    assert written.status_code == 201, written.text
    memory = written.json()
    assert memory["content"] == "Alice's card is [redacted:card_number]" and memory["title"] == "key [redacted:api_key]"
    assert memory["tags"] == ["billing", "[redacted:api_key]"]
    assert memory["redacted"] == {"api_key": 2, "card_number": 1}
    updated = await http.patch(f"/v1/agents/{AGENT}/memories/{memory['id']}",
                               json={"content": f"Alice's IBAN is {SECRETS['iban']}"})
    assert updated.status_code == 200 and updated.json()["content"] == "Alice's IBAN is [redacted:iban]"
    assert updated.json()["redacted"] == {"iban": 1}
    block = ('<memory_write>{"items": [{"kind": "entity", "name": "Ana", "type": "person", "text": "SSN '
             + SECRETS["ssn"] + '"}, {"kind": "observation", "name": "Ana", "text": "Ana\'s token is '
             + SECRETS["jwt"] + '"}, {"kind": "edge", "source": "Ana", "target": "Renault", "rel_type": "works_at"}]}'
             '</memory_write>')
    parsed = await http.post(f"/v1/agents/{AGENT}/writes/parse", json={"text": block, "namespace": f"user:{AGENT}:alice"})
    assert parsed.status_code == 200, parsed.text
    assert parsed.json()["redacted"] == {"token": 1, "government_id": 1}
    assert parsed.json()["written"][0]["content"] == "Ana's token is [redacted:token]"
    startup = await http.put(f"/v1/agents/{AGENT}/startup/creds", json={
        "priority": "P1", "title": "Deploy", "content": f"Deploy with {SECRETS['github']}; never share it."})
    assert startup.status_code == 201 and "[redacted:api_key]" in startup.json()["content"]
    # An import, in process as `memory-service import` runs it.
    (tmp_path / "MEMORY.md").write_text(f"# Notes\n\n- the backup passphrase: \"{SECRETS['password']}\"\n"
                                        f"- the bank wants {SECRETS['iban']}\n\n# Rules\n\nNever print "
                                        f"{SECRETS['api_key']}.\n")
    settings = suite_settings(falkordb_url, memory_write_agents=["*"])
    async with open_service(settings, run_worker=False) as service:
        report = await service.import_legacy(plan_import(tmp_path, AGENT, "alice", settings))
    assert report.redacted == {"api_key": 1, "password": 1, "iban": 1}
    # Formed (the rule extractor's entities and facts, the episode) and embedded.
    formed = await http.post("/v1/sessions/s1/form")
    assert formed.status_code == 200, formed.text
    await wait_embedding_idle(falkordb_url, AGENT)
    # The secrets are nowhere...
    assert not leaks(everything_stored(falkordb_url))
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "redacted 3 api_key, 1 token, 1 private_key" in logged  # what was redacted is logged, by kind
    assert not leaks(logged)
    kept = json.dumps([[s.name, dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]]
                       for s in spans.get_finished_spans()], default=str)
    assert "memory_service.record" in kept and not leaks(kept)
    audit = await http.get("/v1/audit", params={"agent_id": AGENT, "limit": 1000})
    assert audit.status_code == 200 and audit.json()["entries"]
    assert not leaks(json.dumps(audit.json()))
    # ...and what is left is what the user said around them.
    shown = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1",
                                                  "query": "Lyon sister Renault"})
    assert shown.status_code == 200 and "Lyon" in shown.text and not leaks(shown.text)


async def test_a_message_sent_again_is_a_duplicate_and_an_idempotent_write_matches(http):
    first = await record(http, "s1", f"my key is {SECRETS['api_key']}", "m1")
    again = await record(http, "s1", f"my key is {SECRETS['api_key']}", "m1")
    assert first.json()["duplicate"] is False and again.json()["duplicate"] is True
    assert again.json()["redacted"] == {"api_key": 1}
    other = await record(http, "s1", "my key is something else entirely", "m1")
    assert other.status_code == 409  # another content under the same id, as ever
    body = {"namespace": f"agent:{AGENT}", "kind": "fact", "content": f"the router password is {SECRETS['password']}",
            "idempotency_key": "router"}
    written = [await http.post(f"/v1/agents/{AGENT}/memories", json=body) for _ in range(2)]
    assert [w.status_code for w in written] == [201, 200] and written[0].json()["id"] == written[1].json()["id"]
    assert written[1].json()["content"] == "the router password is [redacted:password]"


async def test_refuse_stores_nothing_and_names_the_kind_never_the_value(http, falkordb_url):
    await policy(http, mode="refuse")
    await record(http, "s1", "a first message, nothing secret", "m0")  # the session exists
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    refused = await record(http, "s1", f"use {SECRETS['api_key']} and card {SECRETS['card']}", "m1")
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("content: holds 1 api_key, 1 card_number, which this agent's redaction "
                                               "policy (mode refuse) does not store")
    writes = [
        await http.post(f"/v1/agents/{AGENT}/memories", json={"namespace": f"agent:{AGENT}", "kind": "fact",
                                                              "content": "fine", "title": SECRETS["github"]}),
        await http.patch(f"/v1/agents/{AGENT}/memories/nope", json={"content": SECRETS["iban"]}),
        await http.post(f"/v1/agents/{AGENT}/writes/parse", json={
            "namespace": f"agent:{AGENT}", "text": '<memory_write>{"observations": [{"text": "pin is 4821"}]}'
                                                    '</memory_write>'}),
        await http.put(f"/v1/agents/{AGENT}/startup/r1", json={"priority": "P0", "title": "Me",
                                                               "content": f"SSN {SECRETS['ssn']}"}),
    ]
    assert [w.status_code for w in writes] == [422, 404, 422, 422]  # the update finds no memory first
    assert "title: holds 1 api_key" in writes[0].json()["detail"]
    assert "text: holds 1 password" in writes[2].json()["detail"]
    assert "content: holds 1 government_id" in writes[3].json()["detail"]
    batch = await http.post(f"/v1/agents/{AGENT}/messages/batch", json={"messages": [
        {"session_id": "s1", "user_id": "alice", "role": "user", "message_id": "b1",
         "content": f"token: {SECRETS['jwt']}"}]})
    assert batch.status_code == 200
    [item] = batch.json()["items"]
    assert item["status"] == "refused" and item["code"] == 422 and "messages.0.content: holds 1 token" in item["detail"]
    for answer in (refused, *writes, batch):
        assert not leaks(answer.text), answer.text
    assert snapshot(falkordb_url, worker_running=True) == before
    clean = await record(http, "s1", "nothing secret here", "m2")
    assert clean.status_code == 200 and clean.json()["redacted"] == {}


async def test_personal_data_is_kept_unless_the_policy_asks_and_off_keeps_everything(http):
    text = f"mail me at ana.lima@example.org or call +44 20 7946 0958; key {SECRETS['api_key']}"
    kept = await record(http, "s1", text, "m1")
    assert kept.json()["redacted"] == {"api_key": 1}
    await policy(http, kinds=["email", "phone", "api_key"])
    asked = await record(http, "s1", text, "m2")
    assert asked.json()["redacted"] == {"api_key": 1, "email": 1, "phone": 1}
    await policy(http, mode="off")
    off = await record(http, "s1", text, "m3")
    assert off.json()["redacted"] == {}
    page = (await http.get(f"/v1/agents/{AGENT}/memories", params={"kind": "message", "limit": 10})).json()
    assert sorted(m["content"] for m in page["memories"]) == sorted([
        "mail me at ana.lima@example.org or call +44 20 7946 0958; key [redacted:api_key]",
        "mail me at [redacted:email] or call [redacted:phone]; key [redacted:api_key]", text])


@pytest.mark.parametrize("redaction, field", [
    ({"mode": "scrub"}, "redaction.mode"),
    ({"kinds": ["api_key", "passport"]}, "redaction.kinds.1"),
    ({"kinds": "api_key"}, "redaction.kinds"),
    ({"mode": "redact", "extra": True}, "redaction.extra"),
])
async def test_bad_policy_settings_are_refused(http, falkordb_url, redaction, field):
    before = snapshot(falkordb_url, worker_running=True)
    answer = await http.put(f"/v1/agents/{AGENT}", json={"redaction": redaction})
    assert answer.status_code == 422 and field in answer.json()["detail"], answer.text
    assert snapshot(falkordb_url, worker_running=True) == before


def test_bad_server_settings_are_refused(falkordb_url):
    with pytest.raises(ValueError, match="redaction_mode"):
        suite_settings(falkordb_url, redaction_mode="scrub")
    with pytest.raises(ValueError, match="redaction_kinds"):
        suite_settings(falkordb_url, redaction_kinds=["ssn"])


async def test_an_error_quoting_the_input_never_quotes_a_secret(http):
    answer = await http.post("/v1/sessions/s1/messages", json={
        "agent_id": AGENT, "user_id": "alice", "role": "user", "content": f"key {SECRETS['api_key']}", "oops": 1})
    assert answer.status_code == 422 and not leaks(answer.text)
    missing = await http.post("/v1/sessions/s1/messages", json={  # no role: the body is quoted whole
        "agent_id": AGENT, "user_id": "alice", "content": f"pw: {SECRETS['password']}, card {SECRETS['card']}"})
    assert missing.status_code == 422 and "[redacted:password]" in missing.text and not leaks(missing.text)
    batch = await http.post(f"/v1/agents/{AGENT}/messages/batch", json={"messages": [
        {"session_id": "s1", "user_id": "alice", "message_id": "b1", "content": f"token={SECRETS['jwt']}"}]})
    assert batch.status_code == 200 and batch.json()["refused"] == 1 and not leaks(batch.text)
    block = '<memory_write>{"observations": [{"text": ["' + SECRETS["github"] + '"]}]}</memory_write>'
    malformed = await http.post(f"/v1/agents/{AGENT}/writes/parse", json={"text": block, "namespace": f"agent:{AGENT}"})
    assert malformed.status_code == 422 and "(got ['[redacted:api_key]'])" in malformed.text, malformed.text


async def test_the_python_client_sets_the_policy_and_reads_what_was_redacted(http, server):
    async with AsyncMemoryClient(server.base_url) as client:
        agent = await client.put_agent(AGENT, redaction={"kinds": ["password"]})
        assert agent.redaction.kinds == ["password"] and agent.redaction.mode is None
        result = await client.record("s1", agent_id=AGENT, user_id="alice", role="user",
                                     content=f"pw: {SECRETS['password']} and {SECRETS['api_key']}")
        assert result.redacted == {"password": 1}  # the api key is not among the agent's kinds
        written = await client.memory_write(AGENT, content="the safe PIN is 4821", namespace=f"agent:{AGENT}",
                                            kind="fact")
        assert written.content == "the safe PIN is [redacted:password]" and written.redacted == {"password": 1}


async def test_an_import_the_agents_policy_refuses_stores_nothing(falkordb_url, tmp_path):
    await flush(falkordb_url)
    (tmp_path / "notes.md").write_text(f"# Ops\n\n- deploy key {SECRETS['github']}\n- the DNS is at Gandi\n")
    settings = suite_settings(falkordb_url)
    async with open_service(settings, run_worker=False) as service:
        await service.put_agent(AGENT, AgentSettings(redaction=RedactionSettings(mode=RedactionMode.REFUSE)))
        before = snapshot(falkordb_url)
        with pytest.raises(SecretsRefused) as refused:
            await service.import_legacy(plan_import(tmp_path, AGENT, None, settings))  # planned with the server's
        assert str(refused.value).startswith("notes.md, line 3: holds 1 api_key")
        assert SECRETS["github"] not in str(refused.value)
        assert snapshot(falkordb_url) == before


def test_the_planner_redacts_before_it_takes_ids(tmp_path, falkordb_url):
    (tmp_path / "MEMORY.md").write_text(f"# Facts\n\n- my pw: {SECRETS['password']}\n")
    settings = suite_settings(falkordb_url)
    first = plan_import(tmp_path, AGENT, None, settings)
    (tmp_path / "MEMORY.md").write_text("# Facts\n\n- my pw: An0therOne\n")
    second = plan_import(tmp_path, AGENT, None, settings)
    assert [m.content for m in first.memories] == ["my pw: [redacted:password]"]
    assert [m.id for m in first.memories] == [m.id for m in second.memories]  # the same memory, whatever the secret
    refuse = suite_settings(falkordb_url, redaction_mode="refuse")
    with pytest.raises(SecretsRefused, match=r"MEMORY.md, line 3: holds 1 password"):
        plan_import(tmp_path, AGENT, None, refuse)


async def test_the_import_command_redacts_and_refuses_naming_the_file_and_line(falkordb_url, tmp_path):
    await flush(falkordb_url)
    (tmp_path / "MEMORY.md").write_text(f"# Ops\n\n- deploy with {SECRETS['github']}\n- the NAS password is "
                                        f"{SECRETS['password']}\n- backups run at 2am\n")
    settings = suite_settings(falkordb_url)
    env = {**clean_env(), "EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64", "COLUMNS": "200",
           "FALKORDB_URL": settings.falkordb_url, **({"REDIS_URL": settings.redis_url} if settings.redis_url else {})}

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([CLI, "import", str(tmp_path), "--agent", AGENT], capture_output=True, text=True,
                              timeout=180, env={**env, **extra})

    refused = await asyncio.to_thread(run, REDACTION_MODE="refuse")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "cannot import: MEMORY.md, line 3: holds 1 api_key" in refused.stdout
    assert not leaks(refused.stdout + refused.stderr)
    assert not (await agent_keys(falkordb_url))  # nothing stored: the command stopped before the store
    done = await asyncio.to_thread(run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "redacted before anything was stored (docs/redaction.md): 1 api_key, 1 password" in done.stdout
    assert not leaks(done.stdout + done.stderr) and not leaks(everything_stored(falkordb_url))
    assert "[redacted:password]" in everything_stored(falkordb_url)


async def agent_keys(url: str) -> list[bytes]:
    """The state store's keys of the agent (none before anything was recorded for it)."""
    return [k for k in await state_keys(url) if AGENT.encode() in k]


async def test_the_pages_example_runs(http, server, capsys):
    page = (REPO / "docs" / "redaction.md").read_text()
    start = page.index("```python\n", page.index("## An example")) + len("```python\n")
    code = page[start:page.index("```", start)]
    placeholder = 'API, KEY = "http://127.0.0.1:8080", None'
    assert placeholder in code
    code = code.replace(placeholder, f'API, KEY = "{server.base_url}", None')
    await asyncio.to_thread(exec, compile(code, "docs/redaction.md", "exec"), {"__name__": "page"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "{'password': 1}"
    assert out[1].startswith("422 content: holds 1 phone, which this agent's redaction policy (mode refuse)")
    assert out[2] == "['My password is [redacted:password], mail me at ana@example.org']"


def test_the_docs_name_the_settings_and_the_page():
    config = (REPO / "docs" / "configuration.md").read_text()
    assert "`REDACTION_MODE`" in config and "`REDACTION_KINDS`" in config
    assert "(redaction.md)" in (REPO / "docs" / "security.md").read_text()
    assert "Secrets kept out of the stores: redaction.md" in (REPO / "mkdocs.yml").read_text()
