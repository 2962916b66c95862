"""The arq worker against a real embedded Redis/FalkorDB: gated formation exactly once,
whatever fails. Workers run as real `memory-service worker` processes (killed with SIGKILL
where the test says so) or in-process, on a store of this module's own, so that no other
test's worker takes these jobs."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.config import Settings
from memory_service.domain.models import MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.formation.jobs import formation_job_id
from memory_service.runtime import open_service
from memory_service.schemas.formation import FormationSummary

from .conftest import clean_env
from .fake_llm import EchoLLM
from .helpers import msg, queued_formations

CLI = str(Path(sys.executable).parent / "memory-service")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    server = EmbeddedFalkorDB(tmp_path_factory.mktemp("worker-store"))
    yield server.start()
    server.stop()


@pytest.fixture
async def url(store) -> str:
    redis = Redis.from_url(store)
    await redis.flushall()
    await redis.aclose()
    return store


# Small gates and fast retries; a short job timeout so that a killed worker's job is
# picked up again within seconds (arq waits job timeout + 10 s for a lost job).
FAST = {
    "memory_formation_msg_interval": 4,
    "worker_retry_backoff_seconds": 0.1,
    "worker_job_timeout_seconds": 2,
    "consider_cold_after_minutes": 10,
    "embedder": "hash",
    "embedding_dimension": 64,
}


def make_settings(url: str, **overrides) -> Settings:
    return Settings(_env_file=None, falkordb_url=url, redis_url=None, mongodb_uri=None, **{**FAST, **overrides})


class WorkerProcess:
    """`memory-service worker` as an operator runs it, with settings from the environment."""

    def __init__(self, url: str, log: Path, **overrides):
        self.env = clean_env()
        self.env.update({k.upper(): str(v) for k, v in {**FAST, **overrides}.items()}, FALKORDB_URL=url)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        out = open(self.log, "a")
        self.proc = subprocess.Popen([CLI, "worker", "--log-level", "info"], env=self.env, stdout=out, stderr=out)
        return self

    async def ready(self, timeout: float = 60) -> WorkerProcess:
        """Until arq says the worker polls the queue (a cold start imports a lot)."""
        for _ in range(int(timeout / 0.1)):
            if "Starting worker for" in self.log.read_text():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited: {self.log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        raise AssertionError("the worker did not start")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


async def wait_until_formed(service, sessions, timeout: float = 90) -> None:
    """Until no session has a claimed window or a pending one (a gate left open)."""
    for _ in range(int(timeout / 0.1)):
        statuses = [await service.session_status(s) for s in sessions]
        if all(st["pending_job"] is None and not st["gate"]["open"] for st in statuses):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not formed within {timeout}s: {[s for s in statuses if s['pending_job']]}")


async def form_leftovers(service, sessions) -> None:
    """Form what no gate took: fewer messages than the gate needs, left after the last window."""
    for session_id in sessions:
        leftover = (await service.session_status(session_id))["gate"]["pending_messages"]
        assert leftover < FAST["memory_formation_msg_interval"], f"{session_id}: an open gate was left"
        summary = await service.form_memories(session_id)
        assert summary.formed == (leftover > 0) and len(summary.message_ids) == leftover


async def assert_formed_exactly_once(service, sessions: dict[str, tuple[str, list[str]]], agent: str = "a1",
                                     one_directive_per_message: bool = True) -> None:
    """Every message in exactly one formed window; every directive stored exactly once.

    The rule extractor makes one directive of each stated preference; the LLM extractor
    caps directives per window, so there only duplicates are checked.
    """
    _, backend = await service.agents.backend_for(agent)
    for session_id, (user, message_ids) in sessions.items():
        episodes = await backend.recent(agent, Namespace.session(session_id), [MemoryKind.EPISODE], 10_000)
        covered = [mid for episode in episodes for mid in episode.metadata.message_ids]
        assert sorted(covered) == sorted(message_ids), f"{session_id}: windows skipped or repeated messages"
        status = await service.session_status(session_id)
        assert status["formed_windows"] == len(episodes) and status["formed_messages"] == len(message_ids)
        directives = await backend.recent(agent, Namespace.user(agent, user), [MemoryKind.DIRECTIVE], 10_000)
        contents = [d.content for d in directives]
        assert len(contents) == len(set(contents)), f"{session_id}: directives duplicated"
        if one_directive_per_message:
            assert len(contents) == len(message_ids), f"{session_id}: directives lost"


def preference(session: str, i: int) -> str:
    return f"I prefer seat number {i} on every flight of {session.replace('-', ' ')}."


async def converse(service, sessions: int, messages: int, pause: float = 0.0) -> dict[str, tuple[str, list[str]]]:
    """Record ``messages`` user preferences in each of ``sessions`` sessions, interleaved."""
    out = {f"s{k}": (f"user{k}", []) for k in range(sessions)}
    for i in range(messages):
        for session_id, (user, ids) in out.items():
            mid = f"{session_id}-{i}"
            await service.record_message(session_id, msg("a1", user, preference(session_id, i), mid=mid, minute=i))
            ids.append(mid)
        if pause:
            await asyncio.sleep(pause)
    return out


async def test_a_gate_enqueues_one_job_per_window_and_duplicates_collapse(url):
    async with open_service(make_settings(url), run_worker=False) as service:
        results = [await service.record_message("g", msg("a1", "alice", f"note {i}", mid=f"m{i}")) for i in range(6)]
        jobs = {r.formation_job for r in results if r.formation_job}
        assert jobs == {formation_job_id("g", 1)}  # messages 5 and 6 joined the open window's job
        assert await service.maybe_form_memories("g") == formation_job_id("g", 1)
        assert await service.sweep_cold_sessions() == []  # not cold yet
        assert await queued_formations(service) == 1
        claim = await service.formation.windows.current_claim("g")
        assert claim.message_ids == [f"m{i}" for i in range(4)]  # the window is what was pending at the gate
        status = await service.session_status("g")
        assert status["pending_job"]["status"] == "queued" and status["pending_job"]["messages"] == 4


async def test_a_gate_read_before_a_window_completed_claims_no_undersized_window(url):
    """A record reads the counters (the open window's messages included), the window
    completes, then the record claims: what is left must still pass the gate itself."""
    from memory_service.formation.steps import form_window

    async with open_service(make_settings(url), run_worker=False) as service:
        for i in range(7):
            await service.record_message("r", msg("a1", "alice", f"note {i}", mid=f"m{i}"))
        first = await service.formation.windows.current_claim("r")
        assert first.message_ids == [f"m{i}" for i in range(4)]
        _, backend = await service.agents.backend_for("a1")
        await form_window(claim=first, agent_id="a1", backend=backend, windows=service.formation.windows,
                          extractor=service.extractor, shards=[])
        assert await service.formation.schedule("r", gated=True) is None  # 3 left: below the gate
        assert await service.formation.windows.current_claim("r") is None
        summary = await service.form_memories("r", wait=False)  # forced: any size
        assert summary.job_id == formation_job_id("r", 2)
        assert (await service.formation.windows.current_claim("r")).message_ids == ["m4", "m5", "m6"]


async def test_the_worker_forms_each_window_once_and_the_rest_later(url, tmp_path):
    worker = WorkerProcess(url, tmp_path / "worker.log").start()
    try:
        async with open_service(make_settings(url), run_worker=False) as service:
            sessions = await converse(service, sessions=3, messages=10)
            await wait_until_formed(service, sessions)
            for session_id in sessions:  # gate-formed windows hold at least the gate's 4 messages
                assert (await service.session_status(session_id))["formed_windows"] <= 10 // 4
            await form_leftovers(service, sessions)
            await assert_formed_exactly_once(service, sessions)
            metrics = await service.state.metrics()
            assert metrics["formed_messages"] == 30
    finally:
        assert worker.stop() in (0, -signal.SIGTERM)


async def test_two_workers_on_one_queue_form_every_window_once(url, tmp_path):
    # One job at a time each, so that neither worker can take every queued window alone.
    workers = [WorkerProcess(url, tmp_path / f"worker{i}.log", worker_max_jobs=1).start() for i in range(2)]
    try:
        for worker in workers:
            await worker.ready()
        async with open_service(make_settings(url), run_worker=False) as service:
            sessions = await converse(service, sessions=6, messages=12)
            await wait_until_formed(service, sessions)
            await form_leftovers(service, sessions)
            await assert_formed_exactly_once(service, sessions)
        logs = [w.log.read_text() for w in workers]
        assert all("form_window" in log for log in logs), "both workers should have taken jobs"
    finally:
        for w in workers:
            w.stop()


async def test_a_worker_killed_mid_job_and_restarted_loses_and_repeats_nothing(url, tmp_path):
    """SIGKILL the worker at random moments while conversations go on; restart it each time."""
    rng = random.Random(int(os.environ.get("KILL_SEED", "7")))
    worker = WorkerProcess(url, tmp_path / "worker.log").start()
    try:
        async with open_service(make_settings(url), run_worker=False) as service:
            talk = asyncio.create_task(converse(service, sessions=4, messages=16, pause=0.05))
            kills = 0
            while not talk.done():
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                worker.kill()
                kills += 1
                worker.start()
            sessions = await talk
            worker.kill()  # once more, after the last gate opened
            worker.start()
            await wait_until_formed(service, sessions, timeout=120)
            await form_leftovers(service, sessions)
            await assert_formed_exactly_once(service, sessions)
            assert kills >= 2
    finally:
        worker.stop()


async def test_cold_sessions_are_swept_once_even_alongside_a_forced_formation(url):
    settings = make_settings(url, consider_cold_after_minutes=0, memory_formation_msg_interval=50)
    async with open_service(settings, run_worker=False) as service:
        for i in range(4):
            await service.record_message("cold", msg("a1", "alice", f"I prefer aisle seat {i}.", mid=f"c{i}"))
        for i in range(3):  # below the minimum: left alone
            await service.record_message("short", msg("a1", "bob", f"hello {i}", mid=f"h{i}"))
        for i in range(5):
            await service.record_message("secret", msg("a1", "eve", f"I prefer tea {i}.", mid=f"e{i}", incognito=True))
        first = await service.sweep_cold_sessions()
        second = await service.sweep_cold_sessions()
        assert first == second == [formation_job_id("cold", 1)]
        forced = await service.form_memories("cold", wait=False)
        assert forced.job_id == first[0]
        assert await queued_formations(service) == 1
    async with open_service(settings, run_worker=True) as service:
        await wait_until_formed(service, ["cold"])
        assert await service.sweep_cold_sessions() == []  # formed: nothing left to sweep
        await assert_formed_exactly_once(service, {"cold": ("alice", [f"c{i}" for i in range(4)])})
        assert (await service.session_status("short"))["formed_windows"] == 0
        assert (await service.session_status("secret"))["formed_windows"] == 0


async def test_an_in_process_worker_stopped_as_its_jobs_start_lets_them_finish_and_raises_nothing(url):
    """Shutdown used to re-raise the CancelledError of a job cancelled before its first
    round trip, which skipped closing the service (and, in the suite, broke the next tests)."""
    from memory_service.workers.worker import InProcessWorker

    async with open_service(make_settings(url), run_worker=False) as service:
        for i in range(4):
            await service.record_message("stop", msg("a1", "alice", f"I prefer aisle seat {i}.", mid=f"m{i}"))
        worker = InProcessWorker(service)
        worker.start()
        job_id = formation_job_id("stop", 1)
        for _ in range(6000):
            if job_id in worker.worker.tasks:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the worker did not take the job")
        await worker.stop()  # at once: the startup sweep and the formation have just started
        assert worker.worker.tasks == {}
        status = await service.session_status("stop")
        assert status["formed_windows"] == 1 and status["pending_job"] is None


async def test_a_graph_outage_during_formation_is_retried_and_past_max_tries_fails_visibly(url, tmp_path):
    """The graph store goes down under a formation job: the job retries with backoff, the
    window waits; past the maximum of tries the job fails visibly; once the store is back,
    the same window is formed, once."""
    graph = EmbeddedFalkorDB(tmp_path / "graph")
    graph_url = graph.start()
    settings = make_settings(url, worker_max_tries=4).model_copy(update={"falkordb_url": graph_url, "redis_url": url})
    try:
        async with open_service(settings, run_worker=True) as service:
            for i in range(4):
                await service.record_message("f", msg("a1", "alice", preference("f", i), mid=f"f{i}"))
            graph.stop()
            with pytest.raises(Exception, match="stays pending"):
                await service.form_memories("f")
            status = await service.session_status("f")
            assert status["pending_job"]["status"] == "complete" and status["pending_job"]["success"] is False
            assert status["pending_job"]["tries"] == 4 and status["gate"]["pending_messages"] == 4
            assert status["formed_windows"] == 0
            assert (await service.state.metrics())["formation_failures"] == 4

            # Down again for the first tries of a new job, then back: the retries carry it.
            queued = await service.form_memories("f", wait=False)
            for _ in range(100):
                if (await service.queue.status(queued.job_id)).get("tries", 0) >= 2:
                    break
                await asyncio.sleep(0.05)
            graph.start()
            summary = FormationSummary.model_validate(await service.queue.wait(queued.job_id, timeout=60))
            assert summary.formed and summary.window == 1
            await assert_formed_exactly_once(service, {"f": ("alice", [f"f{i}" for i in range(4)])})
    finally:
        graph.stop()


async def test_serve_without_worker_and_a_separate_worker_attached_to_its_store(tmp_path):
    import httpx

    from .conftest import free_port
    from .test_cli import _wait_healthy

    env = clean_env()
    data = tmp_path / "data"
    port = free_port()
    api = subprocess.Popen([CLI, "serve", "--no-worker", "--port", str(port), "--data-dir", str(data),
                            "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", api)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for i in range(4):
                body = {"agent_id": "a1", "user_id": "u1", "role": "user", "content": f"I prefer green tea {i}.",
                        "message_id": f"m{i}"}
                assert (await http.post("/v1/sessions/s1/messages", json=body)).status_code == 200
            queued = (await http.post("/v1/sessions/s1/form", params={"wait": "false"})).json()
            assert queued["reason"] == "queued" and not queued["formed"]
            assert (await http.get("/v1/sessions/s1")).json()["pending_job"]["status"] == "queued"
            worker = subprocess.Popen([CLI, "worker", "--data-dir", str(data)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(300):
                status = (await http.get("/v1/sessions/s1")).json()
                if status["pending_job"] is None:
                    break
                await asyncio.sleep(0.1)
            assert status["formed_windows"] == 1 and status["cursor"] == 4
            metrics = (await http.get("/metrics")).text
            # The worker process formed it: the API's own counters did not, the deployment's total did.
            assert 'memory_service_deployment_counter{name="formations"} 1.0' in metrics
            assert "\nmemory_service_formations_total " not in metrics
    finally:
        for proc in (worker, api):
            if proc:
                proc.terminate()
                proc.wait(timeout=30)


def test_a_worker_with_no_store_says_so(tmp_path):
    env = clean_env()
    result = subprocess.run([CLI, "worker", "--data-dir", str(tmp_path / "none")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "no store to work on" in result.stdout + result.stderr


@pytest.fixture
async def llm():
    server = await EchoLLM().start()
    yield server
    await server.stop()


def llm_settings(llm: EchoLLM, **overrides) -> dict:
    return {"extractor": "llm", "llm_base_url": llm.base_url, "llm_model": "echo", **overrides}


async def test_the_llm_fails_twice_then_succeeds_and_the_window_is_formed_once(url, tmp_path, llm):
    """One LLM call per window; a failed call fails the try, the job retries with backoff."""
    overrides = llm_settings(llm, llm_max_attempts=1)
    worker = WorkerProcess(url, tmp_path / "worker.log", **overrides).start()
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="travel"))
            llm.failures = [500, 503]
            sessions = await converse(service, sessions=1, messages=4)
            await wait_until_formed(service, sessions)
            await assert_formed_exactly_once(service, sessions, one_directive_per_message=False)
            assert llm.calls == 3 and not llm.failures
            metrics = await service.state.metrics()
            assert metrics["formation_failures"] == 2 and metrics["formations"] == 1
            assert metrics["llm_calls"] == 1 and metrics["llm_prompt_tokens"] == llm.prompt_tokens
    finally:
        worker.stop()


async def test_a_worker_killed_during_the_llm_call_forms_the_window_once_after_restart(url, tmp_path, llm):
    overrides = llm_settings(llm)
    worker = WorkerProcess(url, tmp_path / "worker.log", **overrides).start()
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            llm.hold = asyncio.Event()
            sessions = await converse(service, sessions=1, messages=4)
            for _ in range(300):
                if llm.held:
                    break
                await asyncio.sleep(0.05)
            assert llm.held == 1, "the worker should be waiting on the LLM"
            worker.kill()
            llm.hold.set()  # the answer goes to a dead worker
            for _ in range(100):  # the held call has returned before the restart
                if not llm.held:
                    break
                await asyncio.sleep(0.05)
            status = await service.session_status("s0")
            assert status["formed_windows"] == 0 and status["pending_job"]["status"] == "in_progress"
            worker.start()  # arq takes the job again once the dead worker's claim on it expires
            await wait_until_formed(service, sessions)
            await assert_formed_exactly_once(service, sessions, one_directive_per_message=False)
            assert llm.calls == 2
    finally:
        worker.stop()


async def test_a_worker_built_without_a_redis_url_says_which_setting_is_missing(url):
    """open_service always sets REDIS_URL; a service built otherwise without one used to
    fail deep in redis-py ("Redis URL must specify one of the following schemes")."""
    from memory_service.workers.worker import build_worker

    async with open_service(make_settings(url), run_worker=False) as service:
        service.settings.redis_url = None
        with pytest.raises(ValueError, match="REDIS_URL"):
            build_worker(service)


async def test_an_idle_worker_takes_a_new_job_when_its_doorbell_rings_not_at_its_next_poll(url, tmp_path):
    """Every enqueue rings the queue's doorbell (JobQueue.ring): an idle worker blocked on it
    takes the job at once, however long its poll interval. With a 30 s interval and no
    doorbell, the form call below would wait out the interval (and its 20 s wait)."""
    worker = WorkerProcess(url, tmp_path / "worker.log", worker_poll_seconds=30).start()
    try:
        await worker.ready()
        await asyncio.sleep(0.5)  # past the worker's first poll: it now waits on the doorbell
        async with open_service(make_settings(url, form_wait_seconds=20), run_worker=False) as service:
            for i in range(2):
                await service.record_message("bell", msg("a1", "alice", preference("bell", i), mid=f"b{i}", minute=i))
            summary = await service.form_memories("bell")
            assert summary.formed and summary.message_ids == ["b0", "b1"]
            redis = Redis.from_url(url)
            try:  # the rings are bounded: a queue nobody serves keeps at most DOORBELL_RINGS
                for _ in range(40):
                    await service.queue.ring()
                assert await redis.llen("ms:queue:doorbell") <= 16
            finally:
                await redis.aclose()
    finally:
        assert worker.stop() in (0, -signal.SIGTERM)
