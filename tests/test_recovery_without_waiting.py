"""Recovery without waiting, with real processes killed at the moments that hurt:

- a worker SIGKILLed in a formation job (as it stores the window's extraction): the job is
  taken over once the worker's lease ends (memory_service/formation/leases.py), not after
  arq's job timeout, and ``POST /form`` gets the window formed instead of waiting on it;
- a server SIGKILLed between a window's claim and its job's enqueue: the worker's
  ``recover_windows`` cron (run at its start) enqueues the lost job, no request needed;
- a server SIGKILLed on a store whose append-only file then replays: ``GET /health``
  answers 200 only once a write succeeds (the graph server's first write to each graph
  after a replay blocked it for seconds while readiness said 200).

Each prints the time from the restart to the window formed (docs/formation.md, "Recovery, measured").
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from memory_service.backends.loopback import free_port
from memory_service.formation.window import _ADVANCE
from memory_service.runtime import open_service

from .conftest import clean_env
from .helpers import msg
from .tcp_proxy import TcpProxy
from .test_ingest_recovery import CLI, ApiProcess, KillOnCommand
from .test_worker import WorkerProcess, make_settings, store, url  # noqa: F401 (fixtures)

# A job timeout far longer than the test waits: only a takeover forms the window in time.
SLOW_TIMEOUT = {"worker_job_timeout_seconds": 120, "worker_lease_seconds": 2, "memory_formation_msg_interval": 4,
                "embedder": "hash", "embedding_dimension": 64}
EXTRACTION_STORED = hashlib.sha1(_ADVANCE.encode()).hexdigest().encode()  # the window's first advance


def message(session: str, i: int) -> dict:
    return {"agent_id": "a1", "user_id": "alice", "role": "user", "message_id": f"{session}-m{i}",
            "content": f"I moved to Lisbon in {2000 + i} and I prefer window seats on flight {i}."}


async def proxied(url: str) -> TcpProxy:
    parts = urlsplit(url)
    proxy = await TcpProxy(parts.hostname, parts.port).start()
    proxy.password = parts.password
    return proxy


async def formed_windows(service, session_id: str) -> int:
    return (await service.state.counters(session_id)).formed_windows


async def test_a_job_whose_worker_was_killed_is_taken_over_and_form_does_not_wait_for_it(url, tmp_path):
    proxy = await proxied(url)
    doomed = WorkerProcess(proxy.url, tmp_path / "doomed.log", **SLOW_TIMEOUT)
    proxy.tap = kill = KillOnCommand(doomed, EXTRACTION_STORED)
    settings = make_settings(url, **SLOW_TIMEOUT, form_wait_seconds=60)
    try:
        async with open_service(settings, run_worker=False) as service:
            await doomed.start().ready()
            for i in range(4):  # the fourth opens the gate: its job goes to the doomed worker
                answer = await service.record_message("s1", msg("a1", "alice", message("s1", i)["content"],
                                                                mid=f"s1-m{i}", minute=i))
            assert answer.formation_job
            await asyncio.wait_for(kill.fired.wait(), 60)
            doomed.proc.wait(timeout=10)
            status = await service.session_status("s1")
            assert status["pending_job"]["state"] == "claimed" and status["pending_job"]["status"] == "in_progress"

            started = time.monotonic()
            successor = await WorkerProcess(url, tmp_path / "successor.log", **SLOW_TIMEOUT).start().ready()
            try:
                summary = await service.form_memories("s1")  # waits at most 60 s: the job timeout is 120
                took = time.monotonic() - started
                assert summary.message_ids == [f"s1-m{i}" for i in range(4)]
                assert await formed_windows(service, "s1") == 1
                assert (await service.session_status("s1"))["pending_job"] is None
                print(f"\nworker killed mid-job: window formed {took:.1f}s after the next worker started")
            finally:
                successor.stop()
    finally:
        await proxy.stop()


async def test_a_window_claimed_without_its_job_is_enqueued_again_by_the_worker(url, tmp_path):
    proxy = await proxied(url)
    server = ApiProcess(tmp_path / "serve.log", url, proxy.url, worker_lease_seconds=2, memory_formation_msg_interval=4)
    proxy.tap = kill = KillOnCommand(server, b"arq:job:form:")  # the enqueue, after the claim
    try:
        await server.start()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for i in range(4):
                try:
                    await http.post("/v1/sessions/s1/messages", json=message("s1", i))
                except httpx.TransportError:
                    break  # killed at the fourth's enqueue
        assert kill.fired.is_set()
        server.proc.wait(timeout=10)
    finally:
        server.stop()
        await proxy.stop()

    async with open_service(make_settings(url, **SLOW_TIMEOUT), run_worker=False) as service:
        status = await service.session_status("s1")
        assert status["pending_job"]["state"] == "claimed" and status["pending_job"]["status"] == "not_found"
        started = time.monotonic()
        restarted = ApiProcess(tmp_path / "restart.log", url, url, worker=True, worker_lease_seconds=2,
                               memory_formation_msg_interval=4)
        await restarted.start()
        try:
            for _ in range(600):  # no request: the worker's recovery finds the window
                if await formed_windows(service, "s1") == 1:
                    break
                await asyncio.sleep(0.1)
            took = time.monotonic() - started
            assert await formed_windows(service, "s1") == 1, (await service.session_status("s1"))["pending_job"]
            print(f"\nserver killed between claim and enqueue: window formed {took:.1f}s after the restart")
        finally:
            restarted.stop()


FILL = {"EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64", "MEMORY_FORMATION_MSG_INTERVAL": "100000",
        "MEMORY_FORMATION_TOKEN_INTERVAL": "100000000"}


def serve(data_dir: Path, port: int, log: Path, worker: bool) -> subprocess.Popen:
    """`serve` on the embedded store. With its worker, which embeds the messages (the vectors
    are what the replay makes slow to write after); without, whose start-up jobs would write
    to the graph on their own, in a race with the test's writes."""
    env = clean_env()
    env.update(FILL)
    return subprocess.Popen([CLI, "serve", "--port", str(port), "--data-dir", str(data_dir),
                             "--worker" if worker else "--no-worker"], env=env,
                            stdout=open(log, "a"), stderr=subprocess.STDOUT)


async def until_healthy(http: httpx.AsyncClient, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "serve exited"
        try:
            if (await http.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("never ready")


async def test_health_answers_200_only_once_writes_work_after_a_crash_and_a_replay(tmp_path):
    """kill -9 of `serve` on the embedded store after 10,000 messages: the store replays its
    append-only file at the restart, and the first write to the agent's graph then blocked
    the server for seconds (503 "the graph store does not answer") while /health said 200."""
    data, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    first = serve(data, port, tmp_path / "first.log", worker=True)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await until_healthy(http, first)
            for b in range(100):
                items = [{"session_id": f"s{b % 20}", "user_id": "alice", "role": "user", "message_id": f"m{b}-{i}",
                          "content": f"message {i} of batch {b}: the ferry to island {i} leaves at {b % 24} o'clock"}
                         for i in range(100)]
                answer = await http.post("/v1/agents/a1/messages/batch", json={"messages": items})
                assert answer.status_code == 200, answer.text
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)

    second = serve(data, port, tmp_path / "second.log", worker=False)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            started = time.monotonic()
            await until_healthy(http, second)
            ready = time.monotonic() - started
            failed = []
            for i in range(20):  # from the first 200 on, every write works
                answer = await http.post("/v1/sessions/after/messages", json={
                    "agent_id": "a1", "user_id": "alice", "role": "user", "message_id": f"after-{i}", "content": "hi"})
                if answer.status_code != 200:
                    failed.append((i, answer.status_code, answer.text[:100]))
            assert not failed, failed
            print(f"\nserver killed after 10,000 messages: ready {ready:.1f}s after the restart")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
