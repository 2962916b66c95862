"""Moving one agent's memories between backends, then switching the agent over.

The copy reads every namespace of the agent from the backend it uses now (its sessions,
the users who spoke in them, its shards, the agent namespace), writes each memory to the
other backend by id (insert-if-absent: running it again, or after an interruption,
copies only what is missing), verifies that every memory id of the source is in the
target, copies the shards' settings to where the target keeps them, and only then flips
the agent's ``memory_backend``. Switching back is the same
command in the other direction: what was written meanwhile is copied back.

It works on the agent directory (the agents' settings, and the state store and the
backend registry behind it), not on the facade: ``MemoryService.migrate_agent`` and
``memory-service migrate`` call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from memory_service.backends.agents import AgentDirectory
from memory_service.domain.errors import InvalidInput, MemoryServiceError, NotFound
from memory_service.domain.models import AgentSettings
from memory_service.domain.namespaces import Namespace

log = logging.getLogger(__name__)

BATCH = 100


class MigrationFailed(MemoryServiceError):
    status_code = 409


@dataclass
class NamespaceReport:
    namespace: str
    source: int  # memories in the source
    copied: int = 0  # newly written to the target by this run
    missing: int = 0  # source ids not in the target after the copy


@dataclass
class MigrationReport:
    agent_id: str
    source: str
    target: str
    dry_run: bool
    namespaces: list[NamespaceReport] = field(default_factory=list)
    switched: bool = False

    @property
    def total(self) -> int:
        return sum(n.source for n in self.namespaces)

    @property
    def copied(self) -> int:
        return sum(n.copied for n in self.namespaces)

    @property
    def missing(self) -> int:
        return sum(n.missing for n in self.namespaces)


async def agent_namespaces(agents: AgentDirectory, agent_id: str) -> list[Namespace]:
    sessions = await agents.state.agent_sessions(agent_id)
    users = sorted({u for s in sessions for u in await agents.state.session_users(s)})
    shards = [s.shard_id for s in await agents.list_shards(agent_id)]
    return [
        *(Namespace.session(s) for s in sessions),
        *(Namespace.user(agent_id, u) for u in users),
        *(Namespace.shard(agent_id, s) for s in shards),
        Namespace.agent(agent_id),
    ]


async def migrate_agent(
    agents: AgentDirectory,
    agent_id: str,
    to: str,
    *,
    dry_run: bool = False,
    on_namespace: Callable[[Namespace, int], None] | None = None,
    on_copied: Callable[[int], None] | None = None,
) -> MigrationReport:
    """Copy the agent's memories to backend ``to``, verify, and switch the agent to it.

    ``on_namespace(namespace, size)`` and ``on_copied(n)`` report progress.
    """
    state, registry = agents.state, agents.registry
    if to not in registry.factories:
        known = ", ".join(sorted(registry.factories))
        raise InvalidInput(f"unknown memory backend {to!r}; registered backends: {known}")
    stored = await state.get_agent(agent_id)
    if stored is None and not await state.agent_sessions(agent_id):
        raise NotFound(f"agent {agent_id!r} has no settings and no sessions: nothing to migrate")
    settings = stored or AgentSettings()
    source_name, source = await agents.backend_for(agent_id, settings)
    if source_name == to:
        raise InvalidInput(f"agent {agent_id!r} already uses the {to!r} backend; nothing to migrate")
    target = await registry.get(to)
    report = MigrationReport(agent_id, source_name, to, dry_run)

    for namespace in await agent_namespaces(agents, agent_id):
        memories = await source.export(agent_id, namespace)
        entry = NamespaceReport(str(namespace), len(memories))
        report.namespaces.append(entry)
        if on_namespace:
            on_namespace(namespace, len(memories))
        present = {m.id for m in await target.export(agent_id, namespace)} if memories else set()
        todo = [m for m in memories if m.id not in present]
        if dry_run:
            entry.copied, entry.missing = 0, len(todo)
            if on_copied:
                on_copied(len(memories))
            continue
        if on_copied and present:
            on_copied(len(memories) - len(todo))
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            entry.copied += await target.write(batch)
            if on_copied:
                on_copied(len(batch))
        landed = {m.id for m in await target.export(agent_id, namespace)} if memories else set()
        entry.missing = sum(1 for m in memories if m.id not in landed)

    if dry_run:
        return report
    for shard in await agents.list_shards(agent_id):  # where the target keeps shard settings
        await target.describe_shard(agent_id, shard.shard_id, shard.name, shard.extraction_focus, shard.active)
    if report.missing:
        raise MigrationFailed(
            f"{report.missing} of {report.total} memories of agent {agent_id!r} are not in {to!r} after the copy; "
            f"the agent stays on {source_name!r}. Run the migration again to resume."
        )
    updated = settings.model_copy(update={"memory_backend": to})
    await agents.put_agent(agent_id, updated)
    await state.migrated(agent_id, to)  # the graph no longer reads MongoDB for it
    report.switched = True
    log.info("agent %s migrated from %s to %s: %d memories, %d copied", agent_id, source_name, to,
             report.total, report.copied)
    return report
