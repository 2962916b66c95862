"""Scheduling formation: when a session's window is claimed and its job enqueued.

Three callers schedule: a record whose gate opened (memory_service/ingest/sessions.py), the
worker's cold-session sweep (memory_service/formation/pipeline.py) and ``POST /form``
(``form_memories``, which waits for the worker and sums the windows it formed). Claiming
is a compare-and-set on the window (memory_service/formation/window.py): a gate's verdict
read before a window completed is refused, and evaluated again.
"""

from __future__ import annotations

import time
from typing import Any

from memory_service.config import Settings
from memory_service.domain.errors import FormationPending, NotFound
from memory_service.formation import gates
from memory_service.formation.jobs import JobQueue, formation_job_id
from memory_service.formation.window import StaleGate, WindowState, WindowStore
from memory_service.schemas.formation import FormationSummary, GateStatus
from memory_service.state.store import SessionCounters, StateStore

# How often a gated claim re-reads the counters when windows keep completing under it.
CLAIM_ATTEMPTS = 3


class FormationSchedule:
    def __init__(self, settings: Settings, state: StateStore, queue: JobQueue, extractor_name: str):
        self.settings, self.state, self.queue, self.extractor_name = settings, state, queue, extractor_name
        self.windows = WindowStore(state)

    async def session_gate(self, session_id: str) -> GateStatus:
        return gates.evaluate(await self.state.counters(session_id), self.settings)

    async def schedule(self, session_id: str, *, gated: bool = False, min_messages: int = 1,
                       counters: SessionCounters | None = None) -> str | None:
        """Claim the session's window (or find the one it holds) and enqueue its job.

        ``gated``: a new window only if the gates are open; they are evaluated here (on
        ``counters`` if the caller just read them) and the claim refuses the verdict if a
        window completed since, in which case they are evaluated again.
        """
        s = self.settings
        for _ in range(CLAIM_ATTEMPTS):
            formed_windows = None
            if gated:
                counters = counters or await self.state.counters(session_id)
                if not gates.evaluate(counters, s).open:
                    return None
                formed_windows, min_messages = counters.formed_windows, 1
            try:
                claim = await self.windows.claim(session_id, s.max_window_messages, min_messages, formed_windows)
            except StaleGate:
                counters = None
                continue
            return await self.queue.enqueue_formation(session_id, claim.window) if claim else None
        return None  # windows kept completing: the next message, sweep or POST /form claims it

    async def maybe_form_memories(self, session_id: str) -> str | None:
        """Enqueue the pending window's formation if a gate is open; the job id, or None."""
        return await self.schedule(session_id, gated=True)

    async def form_memories(self, session_id: str, wait: bool = True) -> FormationSummary:
        """Form whatever is pending now, gates or not (never in an incognito session).

        Enqueues the window's job (or joins the one already queued) and, with ``wait``,
        answers once every message pending at the call is stored: a window a gate claimed
        earlier holds only the messages pending then, so the windows after it are formed
        too, and the answer sums them. The worker does the forming.
        """
        counters = await self.state.counters(session_id)
        if counters.agent_id is None:
            raise NotFound(f"session {session_id!r} has no recorded messages")
        # A completed window whose post-processing is left holds none of the pending messages.
        held = await self.windows.load(session_id)
        completed = held.claim.window if held is not None and held.state is WindowState.COMPLETED else None
        job_id = await self.schedule(session_id)
        if job_id is None:
            reason = "incognito session: memories are never formed" if counters.incognito else "no pending messages"
            return FormationSummary(session_id=session_id, extractor=self.extractor_name, reason=reason)
        if not wait:
            return FormationSummary(session_id=session_id, extractor=self.extractor_name, job_id=job_id, reason="queued")
        deadline = time.monotonic() + self.settings.form_wait_seconds
        summaries: list[FormationSummary] = []
        formed = 0  # windows are formed oldest first: once this many are, all pending at the call are
        while job_id is not None:
            summaries.append(await self._wait_for_window(session_id, job_id, deadline))
            if summaries[-1].window != completed:
                formed += len(summaries[-1].message_ids) or counters.pending_messages  # formed elsewhere: stop
            job_id = await self.schedule(session_id) if formed < counters.pending_messages else None
        return FormationSummary.combined(summaries)

    async def _wait_for_window(self, session_id: str, job_id: str, deadline: float) -> FormationSummary:
        try:
            result = await self.queue.wait(job_id, max(deadline - time.monotonic(), 0.001))
            return FormationSummary.model_validate(result).model_copy(update={"job_id": job_id})
        except TimeoutError:
            raise FormationPending(
                f"the window of session {session_id!r} is not formed after {self.settings.form_wait_seconds:.0f}s; "
                f"job {job_id} is still queued or running (GET /v1/sessions/{session_id} shows it)"
            ) from None
        except Exception as exc:
            raise FormationPending(
                f"forming session {session_id!r} failed: {type(exc).__name__}: {exc}; its window stays pending "
                "and is retried by the next gate, sweep or POST /form"
            ) from exc

    async def session_status(self, session_id: str) -> dict[str, Any]:
        """The session's gate, formation cursor, the job of its claimed window and the last window formed."""
        counters = await self.state.counters(session_id)
        if counters.agent_id is None:
            raise NotFound(f"session {session_id!r} has no recorded messages")
        window = await self.windows.load(session_id)
        job = None
        if window is not None:
            job = {"window": window.claim.window, "messages": len(window.claim.messages), "state": window.state.value,
                   **await self.queue.status(formation_job_id(session_id, window.claim.window))}
        # The last window formed (extractor, sequences, memories made), as the pipeline kept it.
        last = await self.state.formed_window(session_id, counters.cursor) if counters.cursor > 0 else None
        return {
            "session_id": session_id,
            "agent_id": counters.agent_id,
            "gate": gates.evaluate(counters, self.settings).model_dump(),
            "cursor": counters.cursor,
            "formed_windows": counters.formed_windows,
            "formed_messages": counters.formed_messages,
            "incognito": counters.incognito,
            "last_activity": counters.last_activity,
            "pending_job": job,
            "last_window": last,
        }
