"""The arq worker. Jobs are thin: each one calls MemoryService, which does the work.

Job model (see the README's "Jobs" section):
- ``form_window(session_id, window)``: enqueued when a gate opens, by the cold-session
  sweep, or by ``POST /form``; its id names the window, so all three collapse into one job.
  A failure is retried with exponential backoff up to WORKER_MAX_TRIES; then the job fails
  visibly and the window stays claimed and pending, to be enqueued again by the next gate,
  sweep or forced formation.
- ``consolidate(namespace, version, count)``: merges pending directives or suggestions.
- ``embed_pending(agent_id)``: embeds the agent's messages recorded without an embedding;
  enqueued by the record that takes the agent's embedding lock (one job per agent at a
  time), never retried (the lock expires and the next record enqueues again).
- cron ``sweep_cold_sessions`` every CLEANUP_COLD_SESSIONS_EVERY_MINUTES, cron
  ``backfill_embeddings`` every 2 minutes (memories stored while the embedder was down),
  cron ``retention`` daily. arq runs each cron tick on one worker only, however many run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from arq import Retry
from arq.connections import RedisSettings
from arq.cron import cron
from arq.worker import Worker, func

from memory_service.config import Settings
from memory_service.jobs import CONSOLIDATE_JOB, EMBED_JOB, FORM_JOB, QUEUE_NAME
from memory_service.service import MemoryService

log = logging.getLogger(__name__)

# How long a stopping worker lets its running jobs finish before cancelling them.
SHUTDOWN_WAIT_SECONDS = 5


def _service(ctx: dict) -> MemoryService:
    return ctx["service"]


def _retry_or_raise(ctx: dict, what: str, exc: Exception) -> None:
    service = _service(ctx)
    tries, max_tries = ctx["job_try"], service.settings.worker_max_tries
    if tries >= max_tries:
        log.error("%s failed on try %d of %d, giving up (it stays pending): %s", what, tries, max_tries, exc)
        raise exc
    delay = service.settings.worker_retry_backoff_seconds * 2 ** (tries - 1)
    log.warning("%s failed on try %d of %d, retrying in %.1fs: %s", what, tries, max_tries, delay, exc)
    raise Retry(defer=delay) from exc


async def form_window(ctx: dict, session_id: str, window: int) -> dict:
    service = _service(ctx)
    try:
        summary = await service.run_formation(session_id, window)
    except Exception as exc:
        await service.state.add_metrics(formation_failures=1)
        _retry_or_raise(ctx, f"forming window {window} of session {session_id!r}", exc)
    return summary.model_dump(mode="json")


async def consolidate(ctx: dict, namespace: str, version: int, count: int) -> dict:
    service = _service(ctx)
    try:
        return await service.run_consolidation(namespace, version, count)
    except Exception as exc:
        await service.state.add_metrics(consolidation_failures=1)
        _retry_or_raise(ctx, f"consolidating {namespace} version {version}", exc)


async def embed_pending(ctx: dict, agent_id: str) -> dict:
    return await _service(ctx).embed_pending(agent_id)


async def sweep_cold_sessions(ctx: dict) -> list[str]:
    return await _service(ctx).sweep_cold_sessions()


async def backfill_embeddings(ctx: dict) -> dict:
    """Embed memories stored while the embedder was down, a bounded batch per tick."""
    return await _service(ctx).backfill_embeddings(limit=_service(ctx).settings.embedding_backfill_per_run)


async def retention(ctx: dict) -> dict:
    # The retention policy (purging soft-deleted and evicted memories, with counts) comes
    # with the memory tools; until then nothing is ever removed.
    log.info("retention: no policy configured yet; nothing purged")
    return {"purged": 0}


def build_worker(service: MemoryService, *, handle_signals: bool = False, burst: bool = False) -> Worker:
    """A worker on the service's Redis (its own connections), with the service in every job's ctx."""
    s: Settings = service.settings
    every = s.cleanup_cold_sessions_every_minutes
    return Worker(
        functions=[
            func(form_window, name=FORM_JOB, max_tries=s.worker_max_tries),
            func(consolidate, name=CONSOLIDATE_JOB, max_tries=s.worker_max_tries),
            func(embed_pending, name=EMBED_JOB, max_tries=1, keep_result=0),
        ],
        cron_jobs=[
            cron(sweep_cold_sessions, minute=set(range(0, 60, every)), run_at_startup=True),
            cron(retention, hour={3}, minute={17}),
            cron(backfill_embeddings, minute=set(range(0, 60, 2)), run_at_startup=True),
        ],
        redis_settings=RedisSettings.from_dsn(s.redis_url),
        queue_name=QUEUE_NAME,
        ctx={"service": service},
        handle_signals=handle_signals,
        burst=burst,
        job_timeout=s.worker_job_timeout_seconds,
        keep_result=s.worker_keep_result_seconds,
        max_jobs=s.worker_max_jobs,
        max_tries=s.worker_max_tries,
        poll_delay=0.05,
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
