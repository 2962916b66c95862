"""Re-forming an agent's formed windows with the extractor configured now (docs/reform.md).

An agent that ran on the offline extractor for months and then gets an LLM key (or a
better prompt, or a fixed bug) has its history formed by the old extractor: formation
never forms a window twice. ``Reformation.run`` chooses formed windows (of the agent, of
one user's sessions or of one session; optionally only those formed since a date) and
re-forms each through the one per-window re-formation (memory_service/curation/reform.py),
which replaces the window's memories in one step of the store and keeps, in the window's
entry, which run re-formed it and what it made.

A run has an id: the same id again resumes it (a crash, a ``limit`` reached, an LLM budget
spent), skipping the windows whose entry names it; a window a crash left half-way is
finished from its record, with the extraction stored there (never a second extractor call
for it). A dry run changes nothing and says how many windows and extractor calls the run
would take. Memories written by hand or by tools are never touched: a window's entry names
only what formation made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from memory_service.access.audit import AuditLog
from memory_service.backends.agents import AgentDirectory
from memory_service.curation.reform import Window, WindowReformer, formed_windows
from memory_service.domain.errors import InvalidInput, NotFound
from memory_service.formation.extractor import Extractor
from memory_service.formation.rule_extractor import RuleBasedExtractor
from memory_service.schemas.lifecycle import ReformIn, ReformReport
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

REFORM_ACTOR = "reform"  # the audit log's actor when no key asked (the CLI)
# (windows done, windows chosen): after each window.
ReformProgress = Callable[[int, int], None]


def _run_op(run_id: str) -> str:
    return f"reform:{run_id}"


class Reformation:
    def __init__(self, state: StateStore, agents: AgentDirectory, reformer: WindowReformer, extractor: Extractor,
                 audit: AuditLog):
        self.state, self.agents, self.reformer, self.extractor, self.audit = state, agents, reformer, extractor, audit

    async def _sessions(self, agent_id: str, ask: ReformIn) -> list[str]:
        if ask.session_id is not None:
            owner = (await self.state.counters(ask.session_id)).agent_id
            if owner != agent_id:  # unknown, or another agent's: one answer
                raise NotFound(f"session_id: session {ask.session_id!r} has no messages recorded by agent {agent_id!r}")
            if ask.user_id is not None and ask.user_id not in await self.state.session_users(ask.session_id):
                return []
            return [ask.session_id]
        if ask.user_id is not None:
            return sorted(await self.state.sessions_of_users(agent_id, [ask.user_id]))
        return await self.state.agent_sessions(agent_id)

    async def chosen(self, agent_id: str, ask: ReformIn) -> tuple[int, list[Window]]:
        """(sessions looked at, the formed windows the run covers, oldest first per session)."""
        if ask.since is not None and ask.since.tzinfo is None:
            raise InvalidInput("since: give a time zone (e.g. 2026-06-01T00:00:00Z)")
        since = ask.since.timestamp() if ask.since is not None else None
        sessions = await self._sessions(agent_id, ask)
        windows = []
        for session_id in sessions:
            for window in await formed_windows(self.state, session_id):
                formed_at = window.entry.get("formed_at")
                if since is None or (isinstance(formed_at, int | float) and formed_at >= since):
                    windows.append(window)
        return len(sessions), windows

    def llm_calls_per_window(self) -> int:
        return 0 if self.extractor.name == RuleBasedExtractor.name else 1

    async def run(self, agent_id: str, ask: ReformIn, on_progress: ReformProgress | None = None,
                  actor: str | None = None) -> ReformReport:
        run_id = ask.run_id or f"r{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 1_000_000:06d}"
        op = _run_op(run_id)
        sessions, windows = await self.chosen(agent_id, ask)
        todo = [w for w in windows if w.entry.get("op") != op]
        report = ReformReport(agent_id=agent_id, run_id=run_id, dry_run=ask.dry_run, extractor=self.extractor.name,
                              sessions=sessions, windows=len(windows), skipped=len(windows) - len(todo), reformed=0,
                              llm_calls=0, done=not todo)
        if ask.dry_run:
            report.llm_calls = len(todo) * self.llm_calls_per_window()
            report.done = False
            return report
        if ask.limit is not None and len(todo) > ask.limit:
            report.skipped += len(todo) - ask.limit
            todo = todo[: ask.limit]
        _, backend = await self.agents.backend_for(agent_id)
        shards = await self.agents.list_shards(agent_id)
        expiry = await self.agents.expiry_policy(agent_id, shards)
        for window in todo:
            done = await self.reformer.reform(agent_id=agent_id, backend=backend, window=window,
                                              extractor=self.extractor, shards=shards, expiry=expiry, op=op)
            report.reformed += 1
            report.llm_calls += done.llm_calls
            report.memories_removed += len(done.old)
            report.memories_formed += len(done.new)
            if on_progress is not None:
                on_progress(report.skipped + report.reformed, report.windows)
        _, after = await self.chosen(agent_id, ask)
        report.done = all(w.entry.get("op") == op for w in after)
        await self.audit.append(actor or REFORM_ACTOR, "memory.reform", agent_id, run_id,
                                after=report.model_dump(mode="json", exclude={"agent_id", "run_id"}))
        log.info("re-formed %d window(s) of agent %s (run %s): %d memories replaced by %d", report.reformed, agent_id,
                 run_id, report.memories_removed, report.memories_formed)
        return report


def parse_since(value: str) -> datetime:
    """A CLI's ``--since``: a date (midnight UTC) or a time with its zone."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"--since {value!r}: not an ISO 8601 date or time (e.g. 2026-06-01)") from None
    if when.tzinfo is None:
        if "T" in value or " " in value:
            raise InvalidInput(f"--since {value!r}: a time needs its zone (e.g. 2026-06-01T00:00:00Z), or give a date")
        when = when.replace(tzinfo=UTC)
    return when
