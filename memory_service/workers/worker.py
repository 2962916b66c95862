"""The arq worker. Jobs are thin: each one calls MemoryService, which does the work.

Job model (see docs/concepts.md, "Jobs", and docs/formation.md):
- ``form_window(session_id, window)``: enqueued when a gate opens, by the cold-session
  sweep, or by ``POST /form``; its id names the window, so all three collapse into one job.
  A failure is retried with exponential backoff up to WORKER_MAX_TRIES; then the job fails
  visibly and the window stays claimed and pending, to be enqueued again by the next gate,
  sweep or forced formation. A try resumes at the step the window's state names
  (memory_service.formation.window).
- ``consolidate(namespace, version, count)``: merges pending directives or suggestions.
- Both stop at WORKER_JOB_TIMEOUT_SECONDS themselves, count it (``formation_timeouts``,
  ``consolidation_timeouts``) and retry like any failure: arq's own timeout (a little
  later, as a backstop) fails a job for good, without a retry.
- ``embed_pending(agent_id)``: embeds the agent's messages recorded without an embedding;
  enqueued by the record that takes the agent's embedding lock (one job per agent at a
  time), never retried (the lock expires and the next record enqueues again).
- cron ``sweep_cold_sessions`` every CLEANUP_COLD_SESSIONS_EVERY_MINUTES, cron
  ``backfill_embeddings`` every 2 minutes (memories stored while the embedder was down),
  cron ``retention`` daily, cron ``recover_in_flight`` every minute (records a crashed API
  process left between their store write and their commit, once RECORD_RECOVERY_AFTER_SECONDS
  old: docs/ingest.md), cron ``recover_windows`` every minute (a window claimed with no job
  queued for it, a crash between the claim and the enqueue: enqueued again), cron
  ``deliver_webhooks`` every WEBHOOK_POLL_SECONDS (change events to webhooks, docs/events.md).
  arq runs each cron tick on one worker only, however many run.
- Leases (memory_service/formation/leases.py): each worker holds one, renewed every quarter
  of WORKER_LEASE_SECONDS; a job whose worker's lease ended is released and run again by a
  live worker at once, not after arq's job timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast

from memory_service._vendor.arq import Retry
from memory_service._vendor.arq.cron import cron
from memory_service._vendor.arq.worker import Worker, func
from memory_service.access.pseudonyms import install_log_filter, namespace_for_log
from memory_service.config import Settings
from memory_service.formation.jobs import CONSOLIDATE_JOB, EMBED_JOB, FORM_JOB, QUEUE_NAME
from memory_service.formation.leases import Leases, WorkerLease, new_worker_id
from memory_service.service import MemoryService
from memory_service.state import keyspace, metrics, tracing
from memory_service.state.pools import arq_client

log = logging.getLogger(__name__)

# How long a stopping worker lets its running jobs finish before cancelling them.
SHUTDOWN_WAIT_SECONDS = 5
# How much later than a job's own timeout arq cancels it: time for the job to count its
# timeout and ask for a retry. (arq gives a dead worker's job to another worker after
# its timeout + 10 s.)
ARQ_TIMEOUT_GRACE_SECONDS = 2


T = TypeVar("T")
# arq's job context: its own keys (job_try, redis, ...) and the "service" build_worker puts there.
Ctx = dict[str, Any]


class JobTimedOut(Exception):
    """A job ran past WORKER_JOB_TIMEOUT_SECONDS and was stopped; it is retried."""


def _service(ctx: Ctx) -> MemoryService:
    return cast(MemoryService, ctx["service"])


def _retry_or_raise(ctx: Ctx, what: str, exc: Exception) -> NoReturn:
    service = _service(ctx)
    tries: int = ctx["job_try"]
    max_tries = service.settings.worker_max_tries
    if tries >= max_tries:
        log.error("%s failed on try %d of %d, giving up (it stays pending): %s", what, tries, max_tries, exc)
        raise exc
    delay = service.settings.worker_retry_backoff_seconds * 2 ** (tries - 1)
    log.warning("%s failed on try %d of %d, retrying in %.1fs: %s", what, tries, max_tries, delay, exc)
    raise Retry(defer=delay) from exc


async def _run(ctx: Ctx, what: str, metric: str, job: Callable[[], Awaitable[T]]) -> T:
    """Run ``job`` under the job timeout; count a failed try (``<metric>_failures``, and
    ``<metric>_timeouts`` when it timed out) and retry it with backoff, or fail for good."""
    service = _service(ctx)
    timeout = service.settings.worker_job_timeout_seconds
    limit = asyncio.timeout(timeout)
    parent = await tracing.job_traceparent(service.queue.pool, ctx.get("job_id"))
    try:
        with metrics.timed(metric), tracing.job_span(f"memory_service.job.{metric}", parent, job_try=ctx.get("job_try")):
            async with limit:
                return await job()
    except Exception as exc:
        error = exc
        counters: dict[str, float] = {f"{metric}_failures": 1}
        if limit.expired():
            error = JobTimedOut(f"{what} took longer than WORKER_JOB_TIMEOUT_SECONDS={timeout:g}")
            counters[f"{metric}_timeouts"] = 1
        await service.state.add_metrics(**counters)
        _retry_or_raise(ctx, what, error)


async def form_window(ctx: Ctx, session_id: str, window: int) -> dict[str, Any]:
    summary = await _run(ctx, f"forming window {window} of session {session_id!r}", "formation",
                         lambda: _service(ctx).run_formation(session_id, window))
    return summary.model_dump(mode="json")


async def consolidate(ctx: Ctx, namespace: str, version: int, count: int) -> dict[str, Any]:
    return await _run(ctx, f"consolidating {namespace_for_log(namespace)} version {version}", "consolidation",
                      lambda: _service(ctx).run_consolidation(namespace, version, count))


async def embed_pending(ctx: Ctx, agent_id: str) -> dict[str, int]:
    return await _service(ctx).embed_pending(agent_id)


async def sweep_cold_sessions(ctx: Ctx) -> list[str]:
    return await _service(ctx).sweep_cold_sessions()


async def recover_in_flight(ctx: Ctx) -> dict[str, int]:
    return await _service(ctx).recover_in_flight()


async def recover_windows(ctx: Ctx) -> list[str]:
    return await _service(ctx).recover_windows()


async def backfill_embeddings(ctx: Ctx) -> dict[str, int]:
    """Embed memories stored while the embedder was down, a bounded batch per tick."""
    return await _service(ctx).backfill_embeddings(limit=_service(ctx).settings.embedding_backfill_per_run)


async def deliver_webhooks(ctx: Ctx) -> dict[str, int]:
    """Send the agents' new change events to their webhooks (memory_service/events/delivery.py)."""
    return await _service(ctx).deliver_webhooks()


async def retention(ctx: Ctx) -> dict[str, int]:
    """Purge memories soft-deleted more than PURGE_AFTER_DAYS ago, and those past their
    expires_at (memory_service/curation/retention.py): it logs its counts and records them in /metrics and the audit log."""
    return (await _service(ctx).purge_expired()).counts()


class DoorbellWorker(Worker):
    """arq's worker, woken by the queue's doorbell (rung by every enqueue, JobQueue.ring)
    between its polls: a job is taken within a round trip of its enqueue, not after up to a
    poll interval (``POST /form?wait=true`` waits for it). A ring while the worker is busy
    stays on the list and ends its next wait at once; with no ring it polls every
    poll_delay as arq does (deferred jobs, retries, a lost ring)."""

    async def ticks(self) -> AsyncGenerator[float, None]:
        while True:
            yield 0.0
            await self.pool.blpop([keyspace.DOORBELL], timeout=self.poll_delay_s)


def build_worker(service: MemoryService, *, handle_signals: bool = False, burst: bool = False) -> Worker:
    """A worker on the service's Redis (its own connections), with the service in every job's
    ctx, and a lease of its own (memory_service/formation/leases.py) held while it runs."""
    s: Settings = service.settings
    every = s.cleanup_cold_sessions_every_minutes
    install_log_filter("arq.worker", "arq.jobs")  # arq's job lines quote job ids and arguments: user namespaces
    worker_id = new_worker_id()
    pool = arq_client(s.job_queue_url(), s, QUEUE_NAME)  # open_service set REDIS_URL
    lease = WorkerLease(Leases(pool, QUEUE_NAME), worker_id, s.worker_lease_seconds)

    async def take_lease(ctx: Ctx) -> None:
        await lease.start()

    async def end_lease(ctx: Ctx) -> None:
        await lease.stop()

    return DoorbellWorker(
        functions=[
            func(form_window, name=FORM_JOB, max_tries=s.worker_max_tries),
            func(consolidate, name=CONSOLIDATE_JOB, max_tries=s.worker_max_tries),
            func(embed_pending, name=EMBED_JOB, max_tries=1, keep_result=0),
        ],
        cron_jobs=[
            cron(sweep_cold_sessions, minute=set(range(0, 60, every)), run_at_startup=True),
            cron(retention, hour={3}, minute={17}),
            cron(deliver_webhooks, second=set(range(0, 60, s.webhook_poll_seconds)), run_at_startup=True),
            cron(recover_in_flight, minute=set(range(60)), run_at_startup=True),
            cron(recover_windows, minute=set(range(60)), run_at_startup=True),
            cron(backfill_embeddings, minute=set(range(0, 60, 2)), run_at_startup=True),
        ],
        # Its own bounded pool with the store timeouts (arq's RedisSettings has no read timeout).
        redis_pool=pool,
        queue_name=QUEUE_NAME,
        worker_id=worker_id,
        on_startup=take_lease,
        on_shutdown=end_lease,
        ctx={"service": service},
        handle_signals=handle_signals,
        burst=burst,
        job_timeout=s.worker_job_timeout_seconds + ARQ_TIMEOUT_GRACE_SECONDS,
        keep_result=s.worker_keep_result_seconds,
        max_jobs=s.worker_max_jobs,
        max_tries=s.worker_max_tries,
        poll_delay=s.worker_poll_seconds,
        # Cancelling a job on shutdown re-queues it; a window is never half-claimed.
        job_completion_wait=SHUTDOWN_WAIT_SECONDS,
    )


class InProcessWorker:
    """A worker running as a task beside the API, for the embedded default."""

    def __init__(self, service: MemoryService):
        self.worker = build_worker(service)
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.worker.main(), name="memory-service-worker")

    async def stop(self) -> None:
        """Stop taking jobs, give running ones a moment to finish, cancel the rest, close.

        arq's ``close()`` gathers the running jobs after cancelling them, so a job cancelled
        before its first Redis round trip (the startup sweep, typically) would raise its
        CancelledError out of shutdown and skip the rest of it. Jobs are settled here first.
        """
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        running = list(self.worker.tasks.values())
        if running:
            _, late = await asyncio.wait(running, timeout=SHUTDOWN_WAIT_SECONDS)
            for task in late:
                task.cancel()  # arq re-queues a job cancelled while it runs
            await asyncio.gather(*running, return_exceptions=True)
            self.worker.tasks.clear()
        try:
            await self.worker.close()
        except Exception as exc:  # the store may be gone; shutting down must still finish
            log.warning("worker shut down without reaching Redis: %s", exc)
