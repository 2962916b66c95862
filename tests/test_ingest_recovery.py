"""Recovery of records a crash left between their store write and their commit (issue 21,
docs/ingest.md "Crashes"): a real `memory-service serve` process SIGKILLed at that exact
point (a TCP proxy on its Redis connection sees the commit go by and kills the server
before Redis gets it), and under many concurrent clients; then the worker's recovery runs
and every stored message is pending or formed, every acknowledged one stored once."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from memory_service.backends.loopback import free_port
from memory_service.domain.models import MemoryKind, MessageIn
from memory_service.domain.namespaces import Namespace
from memory_service.runtime import open_service
from memory_service.state.keyspace import session_keys
from memory_service.state.store import _COMMIT

from .conftest import clean_env
from .tcp_proxy import TcpProxy
from .test_worker import make_settings, store, url  # noqa: F401 (fixtures)

CLI = str(Path(sys.executable).parent / "memory-service")
# Gates that stay shut while the clients talk: what is pending is not formed under the test.
SETTINGS = {"embedder": "hash", "embedding_dimension": 64, "memory_formation_msg_interval": 10_000,
            "memory_formation_token_interval": 1_000_000, "worker_job_timeout_seconds": 5}


class ApiProcess:
    """`memory-service serve` on a store of its own choosing (FALKORDB_URL, REDIS_URL)."""

    def __init__(self, log: Path, falkordb_url: str, redis_url: str, *, worker: bool = False, **overrides):
        self.env = clean_env()
        self.env.update({k.upper(): str(v) for k, v in {**SETTINGS, **overrides}.items()},
                        FALKORDB_URL=falkordb_url, REDIS_URL=redis_url)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log, self.worker = log, worker
        self.proc: subprocess.Popen | None = None

    async def start(self) -> ApiProcess:
        out = open(self.log, "a")
        self.proc = subprocess.Popen(
            [CLI, "serve", "--port", str(self.port), "--log-level", "info", "--worker" if self.worker else "--no-worker"],
            env=self.env, stdout=out, stderr=out)
        async with httpx.AsyncClient() as client:
            for _ in range(600):
                if self.proc.poll() is not None:
                    raise AssertionError(f"serve exited: {self.log.read_text()[-2000:]}")
                try:
                    if (await client.get(f"{self.base_url}/health/live")).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError("serve did not start")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


class KillOnCommand:
    """A proxy tap that SIGKILLs ``server`` as the ``nth`` command containing ``needle``
    goes up to Redis, and drops that command: it never takes effect."""

    def __init__(self, server: ApiProcess, needle: bytes, nth: int = 1):
        self.server, self.needle, self.left = server, needle, nth
        self.fired = asyncio.Event()

    def __call__(self, connection: int, direction: str, data: bytes) -> bool:
        if direction == "up" and not self.fired.is_set():
            self.left -= data.count(self.needle)
            if self.left <= 0:
                self.server.proc.send_signal(signal.SIGKILL)
                self.fired.set()
        return not self.fired.is_set()  # nothing more reaches Redis from the dying server


COMMIT_SHA = hashlib.sha1(_COMMIT.encode()).hexdigest().encode()


def body(session: str, i: int) -> dict:
    return {"agent_id": "a1", "user_id": f"user-{session}", "role": "user", "message_id": f"{session}-m{i}",
            "content": f"message {i} of {session}: the ferry leaves at {i} o'clock"}


async def ledger(service, session_id: str) -> tuple[list[str], list[str], list[str]]:
    """(stored, pending, formed) message ids of the session, each sorted; stored with repeats."""
    _, backend = await service.agents.backend_for("a1")
    namespace = Namespace.session(session_id)
    stored = [m.metadata.message_ids[0] for m in await backend.export("a1", namespace) if m.kind is MemoryKind.MESSAGE]
    pending = await service.state.redis.zrange(session_keys(session_id)["pending"], 0, -1)
    episodes = await backend.recent("a1", namespace, [MemoryKind.EPISODE], 10_000)
    formed = [mid for episode in episodes for mid in episode.metadata.message_ids]
    return sorted(stored), sorted(pending), sorted(formed)


async def assert_every_stored_message_pending_or_formed(service, sessions) -> dict[str, list[str]]:
    """Each session's stored messages: each stored once, each pending or formed (not both),
    nothing pending or formed that is not stored, nothing left in flight."""
    stored_by_session = {}
    for session_id in sessions:
        stored, pending, formed = await ledger(service, session_id)
        assert len(stored) == len(set(stored)), f"{session_id}: a message stored twice"
        assert not set(pending) & set(formed), f"{session_id}: pending and formed"
        assert sorted(pending + formed) == stored, f"{session_id}: stored {stored}, pending {pending}, formed {formed}"
        assert await service.state.in_flight(session_id) == []
        stored_by_session[session_id] = stored
    assert await service.state.in_flight_count() == 0
    return stored_by_session


async def test_a_server_killed_between_the_store_write_and_the_commit_loses_no_stored_message(url, tmp_path):
    """The server dies as its first commit goes to Redis: that message (and any of its
    batch) is stored and searchable but not pending, which no window would ever form.
    The recovery commits what the store holds, releases the ids of what it does not, and
    the clients' retries then record the rest exactly once."""
    parts = urlsplit(url)
    proxy = await TcpProxy(parts.hostname, parts.port).start()
    proxy.password = parts.password
    server = ApiProcess(tmp_path / "serve.log", url, proxy.url)
    proxy.tap = kill = KillOnCommand(server, COMMIT_SHA)
    try:
        await server.start()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            outcomes = await asyncio.gather(*(http.post("/v1/sessions/s1/messages", json=body("s1", i))
                                              for i in range(12)), return_exceptions=True)
        assert kill.fired.is_set()
        assert all(isinstance(o, httpx.TransportError) for o in outcomes), outcomes  # none acknowledged
        server.proc.wait(timeout=10)
    finally:
        server.stop()
        await proxy.stop()

    settings = make_settings(url, **SETTINGS, record_recovery_after_seconds=0)
    async with open_service(settings, run_worker=False) as service:
        stored, pending, _ = await ledger(service, "s1")
        assert stored and pending == []  # the crash's damage: stored, never to be formed
        held = {e.message_id for e in await service.state.in_flight("s1")}
        assert set(stored) <= held  # each reserved message is in flight until its commit

        report = await service.recover_in_flight()
        assert report == {"sessions": 1, "committed": len(stored), "released": len(held) - len(stored)}
        assert await assert_every_stored_message_pending_or_formed(service, ["s1"]) == {"s1": stored}

        # The clients send again what was never acknowledged: stored ones are duplicates,
        # released ids are free and recorded as new; all twelve once.
        results = [await service.record_message("s1", MessageIn(**body("s1", i))) for i in range(12)]
        assert sorted(r.message_id for r in results if r.duplicate) == stored
        final = await assert_every_stored_message_pending_or_formed(service, ["s1"])
        assert final["s1"] == sorted(f"s1-m{i}" for i in range(12))


async def test_many_clients_and_a_kill_9_then_the_worker_recovers_every_stored_message(url, tmp_path):
    """32 clients in 8 sessions record until the server is SIGKILLed under them, as its
    300th commit goes to Redis (so at least that message is stored and not pending, with
    others in flight). A new server with a worker starts: its recovery cron (run at start)
    settles what was in flight. Every stored message is pending (or formed), every
    acknowledged one stored exactly once; retrying everything unacknowledged then records
    each message once."""
    parts = urlsplit(url)
    proxy = await TcpProxy(parts.hostname, parts.port).start()
    proxy.password = parts.password
    server = ApiProcess(tmp_path / "serve.log", url, proxy.url)
    proxy.tap = kill = KillOnCommand(server, COMMIT_SHA, nth=300)
    sessions = [f"k{s}" for s in range(8)]
    acked: set[str] = set()
    attempted: dict[str, dict] = {}

    async def client(http: httpx.AsyncClient, c: int) -> None:
        session = sessions[c % len(sessions)]
        for i in range(10_000):
            message = body(session, c * 10_000 + i)
            attempted[message["message_id"]] = message
            try:
                answer = await http.post(f"/v1/sessions/{session}/messages", json=message)
            except httpx.TransportError:
                return  # the server is gone
            if answer.status_code == 200:
                acked.add(message["message_id"])

    try:
        await server.start()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30, limits=httpx.Limits(max_connections=64)) as http:
            await asyncio.wait_for(asyncio.gather(*(client(http, c) for c in range(32))), timeout=120)
        assert kill.fired.is_set() and len(acked) < len(attempted)
        server.proc.wait(timeout=10)
    finally:
        server.stop()
        await proxy.stop()

    async with open_service(make_settings(url, **SETTINGS), run_worker=False) as service:
        before = {s: await ledger(service, s) for s in sessions}
        assert any(set(stored) - set(pending) for stored, pending, _ in before.values())  # the crash's damage
        assert await service.state.in_flight_count() > 0

        restarted = ApiProcess(tmp_path / "restart.log", url, url, worker=True, record_recovery_after_seconds=0)
        await restarted.start()
        try:
            for _ in range(600):  # the worker's recovery runs at its start
                if await service.state.in_flight_count() == 0:
                    break
                await asyncio.sleep(0.1)
            stored = await assert_every_stored_message_pending_or_formed(service, sessions)
            all_stored = {mid for ids in stored.values() for mid in ids}
            assert acked <= all_stored
            async with httpx.AsyncClient(base_url=restarted.base_url, timeout=60) as http:
                for mid in sorted(set(attempted) - acked):
                    answer = await http.post(f"/v1/sessions/{mid.rsplit('-', 1)[0]}/messages", json=attempted[mid])
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["duplicate"] == (mid in all_stored)
            final = await assert_every_stored_message_pending_or_formed(service, sessions)
            assert sorted(mid for ids in final.values() for mid in ids) == sorted(attempted)
        finally:
            restarted.stop()
