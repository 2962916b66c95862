"""The job queue seen from the API side: enqueue formation and consolidation, wait, inspect.

Jobs run in the arq worker (``workers/``). Every job id is derived from what the job
forms, so that a gate, the cold-session sweep and a forced formation asking for the same
window enqueue ONE job: arq refuses a second job with an id it already holds. Embedding
jobs are kept to one per agent by the agent's embedding lock instead (memory_service/state/store.py), since a
job that runs out of time enqueues its own sequel while it still runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from memory_service._vendor.arq.connections import ArqRedis
from memory_service._vendor.arq.constants import result_key_prefix, retry_key_prefix
from memory_service._vendor.arq.jobs import Job, JobStatus
from memory_service.access.pseudonyms import scrub_text
from memory_service.config import Settings
from memory_service.domain.namespaces import Namespace
from memory_service.formation.leases import Leases
from memory_service.state import keyspace, tracing
from memory_service.state.pools import arq_client

log = logging.getLogger(__name__)

QUEUE_NAME = "memory-service:jobs"
FORM_JOB = "form_window"
CONSOLIDATE_JOB = "consolidate"
EMBED_JOB = "embed_pending"
# The agent's embedding lock lives this long past its job's last sign of life: how soon a
# job lost with its worker is replaced (by the next record), and how long a failing
# embedder is left alone before a record tries it again.
EMBED_LOCK_MS = 30_000


def formation_job_id(session_id: str, window: int) -> str:
    return f"form:{Namespace.session(session_id).group_id}:{window}"


def consolidation_job_id(namespace: str, version: int) -> str:
    return f"consolidate:{Namespace.parse(namespace).group_id}:{version}"


def waited(result: Any) -> bool:
    """Whether a formation job's result says it left its window waiting for the LLM budget."""
    return isinstance(result, dict) and result.get("waiting") is True


# How often POST /form, waiting on a job, checks that its worker is alive (leases.py).
WAIT_CHECK_SECONDS = 1.0
# How often a waiter reads the job's result: often in the first check, when most windows
# are done (a window is formed in a few hundred ms), then less.
FIRST_POLL_SECONDS, LATER_POLL_SECONDS = 0.01, 0.05
# How many rings the doorbell keeps: one per idle worker it can wake at once.
DOORBELL_RINGS = 16


class JobQueue:
    def __init__(self, pool: ArqRedis):
        self.pool = pool
        self.leases = Leases(pool, QUEUE_NAME)

    @classmethod
    async def connect(cls, redis_url: str, settings: Settings | None = None) -> JobQueue:
        """On a bounded pool with the settings' timeouts; fails at once if Redis is unreachable
        (the service degrades on its own: start-up must not stall)."""
        pool = arq_client(redis_url, settings or Settings(), QUEUE_NAME)
        try:
            await pool.ping()
        except BaseException:
            await pool.aclose()
            raise
        return cls(pool)

    async def close(self) -> None:
        await self.pool.aclose()

    async def _enqueue(self, job_id: str, function: str, *args: Any) -> str:
        await tracing.remember_job(self.pool, job_id)  # the worker's span continues this request's trace
        job = await self.pool.enqueue_job(function, *args, _job_id=job_id, _queue_name=QUEUE_NAME)
        if job is not None:
            await self.ring()
        else:
            # arq holds the id: the job is queued or running (a duplicate, nothing to do), or
            # its result is kept. A kept failure must not block the window for keep_result
            # seconds, nor a formation that left its window waiting for the LLM budget
            # (memory_service/formation/budgets.py): drop it and enqueue again.
            info = await self.job(job_id).result_info()
            if info is not None and (not info.success or waited(info.result)):
                log.info("re-enqueueing %s after its %s: %s", scrub_text(job_id), "failure" if not info.success else
                         "wait for the LLM budget", scrub_text(str(info.result)))
                await self.pool.delete(result_key_prefix + job_id)
                await self.pool.enqueue_job(function, *args, _job_id=job_id, _queue_name=QUEUE_NAME)
                await self.ring()
        return job_id

    async def ring(self) -> None:
        """Wake an idle worker (memory_service/workers/worker.py blocks on the doorbell between
        polls), so a job waits for no poll interval."""
        async with self.pool.pipeline(transaction=False) as pipe:
            pipe.lpush(keyspace.DOORBELL, 1)
            pipe.ltrim(keyspace.DOORBELL, 0, DOORBELL_RINGS - 1)
            await pipe.execute()

    async def enqueue_formation(self, session_id: str, window: int) -> str:
        return await self._enqueue(formation_job_id(session_id, window), FORM_JOB, session_id, window)

    async def enqueue_embedding(self, agent_id: str) -> str:
        """Enqueue a job embedding the agent's memories stored without (the caller holds the
        agent's embedding lock, so at most one is queued or running)."""
        job_id = f"embed:{Namespace.agent(agent_id).group_id}:{time.time_ns()}"
        return await self._enqueue(job_id, EMBED_JOB, agent_id)

    async def enqueue_consolidation(self, namespace: str, version: int, count: int) -> str:
        return await self._enqueue(consolidation_job_id(namespace, version), CONSOLIDATE_JOB, namespace, version, count)

    def job(self, job_id: str) -> Job:
        return Job(job_id, self.pool, _queue_name=QUEUE_NAME)

    async def wait(self, job_id: str, timeout: float) -> Any:
        """The job's result; raises the job's own error if it failed, TimeoutError if late.

        Never waits on a dead worker: every WAIT_CHECK_SECONDS, a job in progress under a
        worker whose lease ended is released, and a live worker runs it again."""
        deadline = time.monotonic() + timeout
        poll_delay = FIRST_POLL_SECONDS
        while True:
            left = deadline - time.monotonic()
            try:
                return await self.job(job_id).result(timeout=min(left, WAIT_CHECK_SECONDS), poll_delay=poll_delay)
            except TimeoutError:
                if left <= WAIT_CHECK_SECONDS:
                    raise
                poll_delay = LATER_POLL_SECONDS
                await self.leases.release([job_id])

    async def status(self, job_id: str) -> dict[str, Any]:
        job = self.job(job_id)
        status = await job.status()
        out: dict[str, Any] = {"job_id": job_id, "status": status.value}
        if status is JobStatus.complete and (info := await job.result_info()) is not None:
            out["success"] = info.success
            out["tries"] = info.job_try
            if waited(info.result):  # the window is still held: it waits for the LLM budget
                out["waiting"] = info.result.get("llm_budget")
            if not info.success:
                out["error"] = f"{type(info.result).__name__}: {info.result}"
        elif status in (JobStatus.queued, JobStatus.deferred, JobStatus.in_progress):
            tries = await self.pool.get(retry_key_prefix + job_id)
            out["tries"] = int(tries or 0)
        return out

    async def ping(self) -> bool:
        return bool(await self.pool.ping())
