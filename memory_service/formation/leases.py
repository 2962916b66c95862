"""Worker leases: a job whose worker died runs again as soon as the worker is known dead.

arq marks a running job with ``arq:in-progress:<job id>``, kept for the job timeout plus
10 s, and no worker starts a job so marked: a worker killed in a job (``kill -9``, a lost
node) left it unrunnable for that long (five minutes by default), its window
``in_progress``, ``POST /form`` waiting on it and the session's next window with it.

Each worker has an id (``worker-<hex>``), which the vendored arq writes as the value of the
in-progress keys it sets, and a lease: its entry in ``keyspace.WORKERS`` (worker id -> the
lease's end), renewed every quarter of WORKER_LEASE_SECONDS. At each renewal a worker looks
at the jobs due at the head of the queue (``ORPHAN_SCAN``) and releases each whose in-progress
key names a worker whose lease ended: it deletes that key (if it still names that worker),
and the next poll of a live worker runs the job again, its next try, as arq runs again a job
cancelled at a shutdown. ``POST /form`` releases the job it waits on the same way
(``JobQueue.wait``). A job marked by an older release (its value is ``1``) waits for arq's
timeout, as before.

Exactly once: a window's formation is a state machine advanced by compare-and-set
(memory_service/formation/window.py), so a second run of a window (even beside a first that
was only stalled past its lease) resumes at the step the window's state names and never
advances it twice; consolidation is versioned, embedding and the cron jobs are idempotent.
Releasing early repeats only work that would be lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from memory_service._vendor.arq.constants import in_progress_key_prefix
from memory_service.state import keyspace

log = logging.getLogger(__name__)

WORKER_ID_PREFIX = "worker-"
# How many due jobs at the head of the queue each renewal looks at: the running ones are
# there (arq starts the oldest due first), and the look costs two round trips whatever it finds.
ORPHAN_SCAN = 500

# Delete the in-progress key KEYS[1] if it still names the worker ARGV[1]. 1 if it did.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def new_worker_id() -> str:
    return WORKER_ID_PREFIX + uuid.uuid4().hex


def _now_ms() -> int:
    return int(time.time() * 1000)


class Leases:
    """The workers' leases and the release of their dead jobs, on the job queue's Redis."""

    def __init__(self, pool: Any, queue_name: str):
        self.pool, self.queue_name = pool, queue_name
        self._release = pool.register_script(_RELEASE)

    async def renew(self, worker_id: str, lease_seconds: float) -> None:
        """Extend ``worker_id``'s lease to ``lease_seconds`` from now; forget leases long ended."""
        now = _now_ms()
        async with self.pool.pipeline(transaction=False) as pipe:
            pipe.zadd(keyspace.WORKERS, {worker_id: now + int(lease_seconds * 1000)})
            pipe.zremrangebyscore(keyspace.WORKERS, "-inf", now - 3_600_000)  # an hour past its end
            await pipe.execute()

    async def drop(self, worker_id: str) -> None:
        """A stopping worker's lease ends now (it re-queued its jobs)."""
        await self.pool.zrem(keyspace.WORKERS, worker_id)

    async def dead(self, owners: set[str]) -> set[str]:
        """The worker ids among ``owners`` whose lease ended (or who never had one)."""
        ordered = sorted(owners)
        ends = await self.pool.zmscore(keyspace.WORKERS, ordered) if ordered else []
        now = _now_ms()
        return {w for w, end in zip(ordered, ends, strict=True) if end is None or end <= now}

    async def release(self, job_ids: list[str]) -> list[str]:
        """Release those of ``job_ids`` in progress under a dead worker; the ones released."""
        if not job_ids:
            return []
        values = await self.pool.mget([in_progress_key_prefix + j for j in job_ids])
        owners = {j: v.decode() for j, v in zip(job_ids, values, strict=True)
                  if v is not None and v.startswith(WORKER_ID_PREFIX.encode())}
        dead = await self.dead(set(owners.values()))
        released = []
        for job_id, owner in owners.items():
            if owner in dead and await self._release(keys=[in_progress_key_prefix + job_id], args=[owner]):
                released.append(job_id)
        if released:
            log.warning("released %d job(s) of worker(s) whose lease ended, to run again: %s", len(released),
                        ", ".join(sorted(dead & set(owners.values()))))
        return released

    async def release_orphans(self, scan: int = ORPHAN_SCAN) -> list[str]:
        """Release the due jobs at the head of the queue whose worker died."""
        due = await self.pool.zrangebyscore(self.queue_name, "-inf", _now_ms(), start=0, num=scan)
        return await self.release([j.decode() if isinstance(j, bytes) else j for j in due])


class WorkerLease:
    """A worker's lease, renewed in the background, and its look for dead workers' jobs."""

    def __init__(self, leases: Leases, worker_id: str, lease_seconds: float):
        self.leases, self.worker_id, self.lease_seconds = leases, worker_id, lease_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.leases.renew(self.worker_id, self.lease_seconds)  # held before its first job starts
        self._task = asyncio.create_task(self._keep(), name=f"lease {self.worker_id}")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 4)
            try:
                await self.leases.renew(self.worker_id, self.lease_seconds)
                await self.leases.release_orphans()
            except Exception as exc:  # the queue's Redis is down: renewed on the next turn
                log.warning("the worker's lease was not renewed: %s: %s", type(exc).__name__, exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.leases.drop(self.worker_id)
        except Exception as exc:  # the store may be gone; the lease then ends on its own
            log.warning("the worker's lease was not dropped: %s", exc)
