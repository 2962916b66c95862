"""The formation window's state machine against real worker processes, a real embedded
Redis/FalkorDB and the fake LLM over real HTTP: a worker SIGKILLed at the exact step the
test names (a TCP proxy between the worker and its store sees the step's command go by),
an LLM that answers each call differently, jobs that outlive their timeout; the gate and
the claim agreeing; the cold-session sweep bounded and fair."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import signal
from urllib.parse import urlsplit

import pytest

from memory_service.domain.models import MemoryKind, Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.gates import weighted_tokens
from memory_service.formation.jobs import QUEUE_NAME, formation_job_id
from memory_service.formation.window import _COMPLETE, StaleGate, WindowState, WindowStore
from memory_service.runtime import open_service
from memory_service.state import keyspace

from .helpers import msg, queued_formations
from .tcp_proxy import TcpProxy
from .test_worker import (  # noqa: F401 (fixtures)
    WorkerProcess,
    assert_formed_exactly_once,
    converse,
    llm,
    llm_settings,
    make_settings,
    store,
    url,
    wait_until_formed,
)


@pytest.fixture
async def proxy(url):
    """A proxy between the worker and its store, whose tap sees every command and reply."""
    parts = urlsplit(url)
    server = await TcpProxy(parts.hostname, parts.port).start()
    server.password = parts.password
    yield server
    await server.stop()


class KillOnReply:
    """A proxy tap that SIGKILLs ``worker`` when the store answers the first command that
    contains ``needle``: the command took effect, the worker never learns it did."""

    def __init__(self, worker: WorkerProcess, needle: bytes):
        self.worker, self.needle = worker, needle
        self.connection: int | None = None
        self.fired = False

    def __call__(self, connection: int, direction: str, data: bytes) -> bool:
        if self.fired:
            return True
        if direction == "up" and self.needle in data:
            self.connection = connection
        elif direction == "down" and connection == self.connection:
            self.worker.proc.send_signal(signal.SIGKILL)
            self.fired = True
            return False  # the reply dies with the worker
        return True

    async def done(self) -> bool:
        return self.fired


async def until(condition, timeout: float = 90, what: str = "condition") -> None:
    for _ in range(int(timeout / 0.1)):
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not reached within {timeout}s")


async def test_a_retry_never_mixes_two_extractions_of_one_window(url, tmp_path, llm, proxy):
    """The worker dies after the graph took the window's memories and before the window
    completed. The LLM would answer the retry differently (more directives, other text);
    the retry writes the extraction stored before the first write instead, so every stored
    item comes from one extraction (with positional ids, the first answer's items and the
    second's extra one were both stored)."""
    overrides = llm_settings(llm, memory_formation_msg_interval=8)
    llm.drift = True
    worker = WorkerProcess(proxy.url, tmp_path / "worker.log", **overrides).start()
    proxy.tap = kill = KillOnReply(worker, b"MERGE (n:")
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            sessions = await converse(service, sessions=1, messages=8)
            await until(kill.done, what="the worker killed after its write")
            worker.proc.wait(timeout=10)
            window = await service.formation.windows.load("s0")
            assert window.state is WindowState.EXTRACTED and len(window.extraction.memories) == 2  # episode + 1 directive
            _, backend = await service.agents.backend_for("a1")
            user_ns = Namespace.user("a1", "user0")
            assert await backend.count("a1", user_ns, [MemoryKind.DIRECTIVE]) == 1  # the write took effect

            worker.start()  # arq gives the job to it once the dead worker's claim expires
            await wait_until_formed(service, sessions, timeout=120)
            directives = await backend.recent("a1", user_ns, [MemoryKind.DIRECTIVE], 100)
            assert [d.content.endswith("(answer 1)") for d in directives] == [True]
            assert {d.id for d in directives} == {m.id for m in window.extraction.memories if m.kind is MemoryKind.DIRECTIVE}
            assert llm.extractions == 1  # the retry did not ask again
            await assert_formed_exactly_once(service, sessions, one_directive_per_message=False)
            metrics = await service.state.metrics()
            assert metrics["formations"] == 1 and metrics["llm_calls"] == 1
    finally:
        worker.stop()


async def test_a_worker_killed_after_completing_a_window_still_post_processes_it(url, tmp_path, proxy):
    """The worker dies right after the window completed (cursor moved, its effects stored:
    directives to queue for consolidation, on another slot of a cluster) and before the
    post-completion work: the retry finds the window completed, applies its effects and
    runs that work, so the four directives are consolidated (before, the retry saw "already
    formed" and the consolidation waited for the next directive)."""
    overrides = {"consolidate_directives_after": 4}
    async with open_service(make_settings(url, **overrides), run_worker=False) as service:
        # Loaded now, so that the worker's first call of the script is the one completing.
        await service.state.redis.script_load(_COMPLETE)
        worker = WorkerProcess(proxy.url, tmp_path / "worker.log", **overrides).start()
        proxy.tap = kill = KillOnReply(worker, hashlib.sha1(_COMPLETE.encode()).hexdigest().encode())
        try:
            sessions = await converse(service, sessions=1, messages=4)
            await until(kill.done, what="the worker killed after completing")
            worker.proc.wait(timeout=10)
            status = await service.session_status("s0")
            assert status["formed_windows"] == 1 and status["pending_job"]["state"] == "completed"
            user_ns = str(Namespace.user("a1", "user0"))
            record = await WindowStore(service.state).load("s0")
            assert record is not None and record.effects and not record.applied
            assert [ns for ns, _ in json.loads(record.effects)["push"]] == [user_ns] * 4
            assert await service.state.consolidation_pending(user_ns) == []  # applied by the retry
            assert await service.state.consolidation_version(user_ns) == 0

            worker.start()
            await wait_until_formed(service, sessions, timeout=120)

            async def consolidated() -> bool:
                return await service.state.consolidation_version(user_ns) == 1

            await until(consolidated, what="the directives consolidated")
            assert await service.state.consolidation_pending(user_ns) == []
            await assert_formed_exactly_once(service, sessions)
            metrics = await service.state.metrics()
            assert metrics["formations"] == 1 and metrics["consolidations"] == 1
        finally:
            worker.stop()


async def test_a_formation_past_its_timeout_is_retried_and_counted(url, tmp_path, llm):
    """arq fails a job that outlives its timeout for good; the job stops itself first,
    counts the timeout, and retries."""
    overrides = llm_settings(llm)  # FAST: a 2 s job timeout
    worker = WorkerProcess(url, tmp_path / "worker.log", **overrides).start()
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            llm.hold = asyncio.Event()  # the first call hangs past the job's timeout
            sessions = await converse(service, sessions=1, messages=4)

            async def timed_out() -> bool:
                return (await service.state.metrics()).get("formation_timeouts", 0) >= 1

            await until(timed_out, what="a timeout counted")
            llm.hold.set()
            await wait_until_formed(service, sessions)
            await assert_formed_exactly_once(service, sessions, one_directive_per_message=False)
            metrics = await service.state.metrics()
            assert metrics["formation_timeouts"] == 1 and metrics["formation_failures"] == 1
            assert metrics["formations"] == 1
            assert "took longer than WORKER_JOB_TIMEOUT_SECONDS=2" in worker.log.read_text()
    finally:
        worker.stop()


async def test_a_consolidation_past_its_timeout_is_retried_and_counted(url, tmp_path, llm):
    overrides = {"consolidator": "llm", "llm_base_url": llm.base_url, "llm_model": "echo",
                 "consolidate_directives_after": 4}
    worker = WorkerProcess(url, tmp_path / "worker.log", **overrides).start()
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            llm.hold = asyncio.Event()
            await converse(service, sessions=1, messages=4)  # formed by rules; 4 directives to merge
            user_ns = str(Namespace.user("a1", "user0"))

            async def timed_out() -> bool:
                return (await service.state.metrics()).get("consolidation_timeouts", 0) >= 1

            await until(timed_out, what="a timeout counted")
            llm.hold.set()

            async def consolidated() -> bool:
                return await service.state.consolidation_version(user_ns) == 1

            await until(consolidated, what="the directives consolidated")
            metrics = await service.state.metrics()
            assert metrics["consolidation_timeouts"] == 1 and metrics["consolidations"] == 1
    finally:
        worker.stop()


async def test_a_job_that_keeps_timing_out_fails_visibly_past_max_tries(url, tmp_path, llm):
    overrides = llm_settings(llm, worker_job_timeout_seconds=0.5, worker_max_tries=2)
    worker = WorkerProcess(url, tmp_path / "worker.log", **overrides).start()
    try:
        async with open_service(make_settings(url, **overrides), run_worker=False) as service:
            llm.hold = asyncio.Event()  # never released: every try times out
            await converse(service, sessions=1, messages=4)
            job_id = formation_job_id("s0", 1)

            async def failed() -> bool:
                return (await service.queue.status(job_id)).get("success") is False

            await until(failed, what="the job failed")
            status = await service.session_status("s0")
            assert status["pending_job"]["tries"] == 2 and "JobTimedOut" in status["pending_job"]["error"]
            assert status["formed_windows"] == 0 and status["gate"]["pending_messages"] == 4
            metrics = await service.state.metrics()
            assert metrics["formation_timeouts"] == 2
    finally:
        llm.hold.set()
        worker.stop()


# The gate ------------------------------------------------------------------------------


async def test_the_gate_and_the_claim_agree_where_rounding_once_split_them(url):
    """99.96 weighted tokens against an interval of 100: the gate once rounded it to 100.0
    and said open, the claim compared the exact value and refused: an open gate, no job."""
    settings = make_settings(url, memory_formation_token_interval=100, memory_formation_msg_interval=50,
                             never_form_memories_less_than_n_messages=2)
    user_text, assistant_text = "x" * 449, "okay"
    tokens = weighted_tokens(Role.USER, user_text) + weighted_tokens(Role.ASSISTANT, assistant_text)
    assert 99.95 <= tokens < 100 and round(tokens, 1) == 100.0
    async with open_service(settings, run_worker=False) as service:
        results = [await service.record_message("t", msg("a1", "alice", user_text, mid="m1")),
                   await service.record_message("t", msg("a1", "alice", assistant_text, role="assistant", mid="m2"))]
        for result in results:
            assert result.gate.open == (result.formation_job is not None), result.gate.reason
        assert not results[-1].gate.open and await service.maybe_form_memories("t") is None
        opened = await service.record_message("t", msg("a1", "alice", "y", mid="m3"))
        assert opened.gate.open and opened.formation_job == formation_job_id("t", 1)


async def test_a_gate_verdict_reached_before_a_window_completed_is_evaluated_again(url):
    """The claim refuses a verdict reached on counters older than a completed window (it
    took its messages away), and the caller evaluates the gate on fresh counters."""
    from memory_service.formation.steps import form_window

    async with open_service(make_settings(url), run_worker=False) as service:
        for i in range(6):
            await service.record_message("r", msg("a1", "alice", f"note {i}", mid=f"m{i}"))
        stale = await service.state.counters("r")  # 6 pending: open
        windows = service.formation.windows
        _, backend = await service.agents.backend_for("a1")
        await form_window(claim=await windows.current_claim("r"), agent_id="a1", backend=backend, windows=windows,
                          extractor=service.extractor, shards=[])
        with pytest.raises(StaleGate):
            await windows.claim("r", 100, 1, formed_windows=stale.formed_windows)
        assert await service.formation.schedule("r", gated=True, counters=stale) is None  # 2 left: closed
        assert await windows.current_claim("r") is None
        for i in range(6, 8):
            await service.record_message("r", msg("a1", "alice", f"note {i}", mid=f"m{i}"))
        assert (await windows.current_claim("r")).message_ids == [f"m{i}" for i in range(4, 8)]


# The cold-session sweep ----------------------------------------------------------------


async def _record_many(service, sessions: list[str], **extra) -> None:
    gate = asyncio.Semaphore(16)

    async def one(session_id: str) -> None:
        async with gate:
            await service.record_message(session_id, msg("a1", "bob", "hello there", mid=f"{session_id}-0", **extra))

    await asyncio.gather(*(one(s) for s in sessions))


async def test_the_sweep_gets_past_a_thousand_sessions_that_cannot_form(url):
    """1,001 idle sessions that can never form (one message each, or incognito) used to
    fill the 1,000 the sweep read, run after run: the session behind them never formed.
    They leave the active set when the sweep sees them, every run is bounded, and the
    formable session is reached."""
    settings = make_settings(url, consider_cold_after_minutes=0, memory_formation_msg_interval=50,
                             cold_sweep_batch=40, cold_sweep_max_sessions=300)
    short = [f"short{i}" for i in range(700)]
    secret = [f"secret{i}" for i in range(301)]
    async with open_service(settings, run_worker=False) as service:
        await _record_many(service, short)
        for session_id in secret[:5]:  # incognito with enough messages: still never formed
            for i in range(4):
                await service.record_message(session_id, msg("a1", "eve", f"tea {i}", mid=f"{session_id}-{i}",
                                                             incognito=True))
        await _record_many(service, secret[5:], incognito=True)
        for i in range(4):
            await service.record_message("formable", msg("a1", "alice", f"I prefer aisle seat {i}.", mid=f"f{i}"))
        assert len(await service.state.active_sessions()) == 1002

        runs = []
        for _ in range(math.ceil(1002 / 300) + 1):
            before = len(await service.state.active_sessions())
            runs.append(await service.sweep_cold_sessions())
            assert before - len(await service.state.active_sessions()) <= 300  # bounded: at most 300 looked at
            if runs[-1]:
                break
        assert runs[-1] == [formation_job_id("formable", 1)] and len(runs) == 4
        assert list(await service.state.active_sessions()) == ["formable"]  # the rest left the set
        assert await queued_formations(service) == 1

        # A message brings a session back; with the minimum it is swept.
        for i in range(1, 4):
            await service.record_message("short7", msg("a1", "bob", f"more {i}", mid=f"short7-{i}"))
        assert "short7" in await service.state.active_sessions()
        assert formation_job_id("short7", 1) in await service.sweep_cold_sessions()


async def test_the_sweep_takes_stuck_sessions_in_turn(url):
    """Formable sessions whose jobs do not finish (no worker here) stay in the active set:
    each run takes the ones waiting longest, so all get their turn, two per run."""
    settings = make_settings(url, consider_cold_after_minutes=0, memory_formation_msg_interval=50,
                             cold_sweep_batch=1, cold_sweep_max_sessions=2)
    sessions = [f"s{k}" for k in range(5)]
    async with open_service(settings, run_worker=False) as service:
        for session_id in sessions:
            for i in range(4):
                await service.record_message(session_id, msg("a1", "alice", f"note {i}", mid=f"{session_id}-{i}"))
        runs = [await service.sweep_cold_sessions() for _ in range(3)]
        assert [len(r) for r in runs] == [2, 2, 2]
        assert runs[0] + runs[1] + runs[2][:1] == [formation_job_id(s, 1) for s in sessions]
        assert runs[2][1] == formation_job_id("s0", 1)  # then the first again


# Races and resumption, in-process ---------------------------------------------------------


async def test_two_runs_racing_on_one_window_store_one_extraction(url, llm):
    """Two runs of one window (a late duplicate of a job beside its retry) both ask the LLM,
    which answers each differently; one extraction is stored first and both write that one."""
    from memory_service.formation.steps import form_window

    settings = make_settings(url, **llm_settings(llm, memory_formation_msg_interval=8))
    async with open_service(settings, run_worker=False) as service:
        await converse(service, sessions=1, messages=8)
        windows = service.formation.windows
        claim = await windows.current_claim("s0")
        _, backend = await service.agents.backend_for("a1")
        llm.drift, llm.hold = True, asyncio.Event()
        runs = [asyncio.create_task(form_window(claim=claim, agent_id="a1", backend=backend, windows=windows,
                                                extractor=service.extractor, shards=[])) for _ in range(2)]
        async def both_asking() -> bool:
            return llm.held == 2

        await until(both_asking, what="both runs asking the LLM")
        llm.hold.set()
        first, second = await asyncio.gather(*runs)
        assert llm.extractions == 2
        assert [m.id for m in first.memories] == [m.id for m in second.memories]
        directives = await backend.recent("a1", Namespace.user("a1", "user0"), [MemoryKind.DIRECTIVE], 100)
        stored = {m.id for m in first.memories if m.kind is MemoryKind.DIRECTIVE}
        assert {d.id for d in directives} == stored  # one answer's directives (1 or 2), not both answers'
        assert len({d.content.rpartition("(answer ")[2] for d in directives}) == 1
        assert await windows.load("s0") is None
        metrics = await service.state.metrics()
        assert metrics["formations"] == 1 and (await service.session_status("s0"))["formed_windows"] == 1


async def test_a_claim_left_by_the_first_layout_is_adopted_not_lost(url):
    """A data directory from before the window hash holds its claim at ms:s:<session>:claim."""
    async with open_service(make_settings(url, memory_formation_msg_interval=50), run_worker=False) as service:
        for i in range(5):
            await service.record_message("old", msg("a1", "alice", f"note {i}", mid=f"m{i}"))
        redis = service.state.redis
        await redis.hset(keyspace.session_keys("old")["meta"], "claimed_windows", 1)
        await redis.hset(keyspace.legacy_claim("old"), mapping={"window": "1", "ids": '[["m0", 1], ["m1", 2], ["m2", 3]]'})
        summary = await service.form_memories("old", wait=False)
        assert summary.job_id == formation_job_id("old", 1)
        window = await service.formation.windows.load("old")
        assert window.state is WindowState.CLAIMED and window.claim.message_ids == ["m0", "m1", "m2"]
        assert not await redis.exists(keyspace.legacy_claim("old"))


async def test_post_form_finishes_a_completed_window_and_forms_what_is_pending(url):
    """A window completed but not post-processed (its post-processing failed) does not hold
    the messages pending now: POST /form runs its post-processing AND forms those."""
    from memory_service._vendor.arq.constants import job_key_prefix
    from memory_service.formation.steps import form_window

    settings = make_settings(url, consolidate_directives_after=4)
    async with open_service(settings, run_worker=False) as service:
        windows = service.formation.windows
        for i in range(4):
            await service.record_message("p", msg("a1", "alice", f"I prefer aisle seat {i}.", mid=f"m{i}"))
        job_id = formation_job_id("p", 1)  # gone, as a job is once its failure's result expired
        await service.queue.pool.zrem(QUEUE_NAME, job_id)
        await service.queue.pool.delete(job_key_prefix + job_id)
        _, backend = await service.agents.backend_for("a1")

        async def unreachable(result) -> None:
            raise ConnectionError("the job queue is unreachable")

        with pytest.raises(ConnectionError):
            await form_window(claim=await windows.current_claim("p"), agent_id="a1", backend=backend,
                              windows=windows, extractor=service.extractor, shards=[], post_process=unreachable)
        assert (await windows.load("p")).state is WindowState.COMPLETED
        for i in range(4, 7):
            await service.record_message("p", msg("a1", "alice", f"I prefer aisle seat {i}.", mid=f"m{i}"))
    async with open_service(settings, run_worker=True) as service:
        summary = await service.form_memories("p")
        assert summary.formed and summary.message_ids[-3:] == ["m4", "m5", "m6"]
        status = await service.session_status("p")
        assert status["formed_windows"] == 2 and status["gate"]["pending_messages"] == 0
        user_ns = str(Namespace.user("a1", "alice"))

        async def consolidated() -> bool:  # the first window's trigger ran at last
            return await service.state.consolidation_version(user_ns) >= 1

        await until(consolidated, what="the directives consolidated")


async def test_a_window_marked_extracted_without_its_extraction_fails_clearly_and_stays(url):
    """The extracted state is stored with its extraction in one step; a hash that lost it
    (hand-edited, restored in part) fails the run with a sentence, not an AttributeError."""
    from memory_service.formation.steps import form_window

    async with open_service(make_settings(url, memory_formation_msg_interval=50), run_worker=False) as service:
        for i in range(3):
            await service.record_message("x", msg("a1", "alice", f"note {i}", mid=f"m{i}"))
        windows = service.formation.windows
        claim = await windows.claim("x", limit=10)
        await service.state.redis.hset(keyspace.window("x"), "state", "extracted")
        _, backend = await service.agents.backend_for("a1")
        with pytest.raises(RuntimeError, match="window 1 is extracted but holds no extraction"):
            await form_window(claim=claim, agent_id="a1", backend=backend, windows=windows,
                              extractor=service.extractor, shards=[])
        record = await windows.load("x")
        assert record.state is WindowState.EXTRACTED and record.claim.message_ids == ["m0", "m1", "m2"]
        assert (await service.session_status("x"))["formed_windows"] == 0


async def test_a_window_whose_stored_message_has_no_role_is_not_formed(url):
    """Every recorded message has a role; one stored without (a damaged store) stops the
    window with the message named, rather than extracting it under no speaker."""
    from memory_service.domain.models import Memory, Provenance
    from memory_service.formation.steps import form_window, message_memory_id

    async with open_service(make_settings(url, memory_formation_msg_interval=50), run_worker=False) as service:
        await service.record_message("r", msg("a1", "alice", "I prefer aisle seats.", mid="m0"))
        _, backend = await service.agents.backend_for("a1")
        await backend.write([Memory(
            id=message_memory_id("r", "ghost"), kind=MemoryKind.MESSAGE, namespace=str(Namespace.session("r")),
            content="I always fly at night.",
            metadata=Provenance(agent_id="a1", user_id="alice", session_id="r", message_ids=["ghost"], sequence=2),
        )])
        redis = service.state.redis
        await redis.hset(keyspace.window("r"), mapping={"window": "1", "ids": '[["m0", 1], ["ghost", 2]]', "state": "claimed"})
        windows = service.formation.windows
        with pytest.raises(RuntimeError, match=r"stored without a role: \['ghost'\]"):
            await form_window(claim=await windows.current_claim("r"), agent_id="a1", backend=backend,
                              windows=windows, extractor=service.extractor, shards=[])
        assert (await windows.load("r")).state is WindowState.CLAIMED
        assert await backend.recent("a1", Namespace.user("a1", "alice"), [MemoryKind.DIRECTIVE], 10) == []


async def test_a_window_of_a_session_that_names_no_agent_fails_clearly(url):
    """A session's first record names its agent before any window exists; a window whose
    session lost its counters fails its job with a sentence (it used to reach the shard
    listing with agent None)."""

    async with open_service(make_settings(url, memory_formation_msg_interval=50), run_worker=False) as service:
        await service.state.redis.hset(keyspace.window("orphan"), mapping={"window": "1", "ids": '[["m0", 1]]',
                                                                      "state": "claimed"})
        with pytest.raises(RuntimeError, match="session 'orphan' holds window 1 but names no agent"):
            await service.run_formation("orphan", 1)
        assert (await service.formation.windows.load("orphan")).state is WindowState.CLAIMED
