"""Agents and shards: their settings (in the state store) and the backend each agent uses."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from memory_service.config import Settings
from memory_service.domain import limits
from memory_service.domain.errors import InvalidInput, NotFound, preview
from memory_service.domain.expiry import TTL_KINDS, ExpiryPolicy
from memory_service.domain.models import (
    BACKEND_ALIASES,
    LEGACY_BACKEND_FLAG,
    Agent,
    AgentSettings,
    Shard,
    ShardIn,
    backend_name,
)
from memory_service.state.store import StateStore
from memory_service.stores.base import MemoryBackend
from memory_service.stores.registry import BackendRegistry

log = logging.getLogger(__name__)


class AgentDirectory:
    def __init__(self, settings: Settings, state: StateStore, registry: BackendRegistry):
        self.settings, self.state, self.registry = settings, state, registry

    async def put_agent(self, agent_id: str, settings: AgentSettings) -> Agent:
        return (await self.replace_agent(agent_id, settings))[1]

    async def replace_agent(self, agent_id: str, settings: AgentSettings) -> tuple[AgentSettings | None, Agent]:
        """Create or replace the agent's settings: (the settings replaced, the agent now)."""
        limits.check_extras(settings.agent_extras, self.settings.max_extras_bytes)
        self._check_backends(settings)
        for kind, ttl in settings.memory_ttl.items():
            if kind.value not in TTL_KINDS:
                raise InvalidInput(f"memory_ttl.{kind.value}: {kind.value} memories take no time to live; one of "
                                   f"{', '.join(TTL_KINDS)}")
            self._check_ttl(f"memory_ttl.{kind.value}", ttl)
        previous = await self.state.put_agent(agent_id, settings)
        return previous, await self.get_agent(agent_id)

    def _check_backends(self, settings: AgentSettings) -> None:
        """Each backend the settings name (the field, and the seeds' flag in agent_extras) must be
        registered or an alias of one; settings stored before this check still read."""
        legacy_field = f"agent_extras.{LEGACY_BACKEND_FLAG}"
        legacy = settings.agent_extras.get(LEGACY_BACKEND_FLAG)
        if legacy is not None and not isinstance(legacy, str):
            raise InvalidInput(f"{legacy_field}: a memory backend's name, not {preview(legacy)}")
        for field, name in (("memory_backend", settings.memory_backend), (legacy_field, legacy)):
            if name and backend_name(name) not in self.registry.factories:
                known = ", ".join(sorted(self.registry.factories))
                aliases = ", ".join(f"{alias!r} for {target!r}" for alias, target in sorted(BACKEND_ALIASES.items())
                                    if target in self.registry.factories)
                raise InvalidInput(f"{field}: unknown memory backend {preview(name)}; registered backends: {known}"
                                   + (f" (aliases: {aliases})" if aliases else ""))

    def _check_ttl(self, field: str, ttl: int | None) -> None:
        horizon = self.settings.memory_expiry_max_days
        if ttl is not None and ttl > horizon * 86_400:
            raise InvalidInput(f"{field}: {ttl} s is beyond MEMORY_EXPIRY_MAX_DAYS ({horizon} days)")

    async def expiry_policy(self, agent_id: str, shards: Sequence[Shard] | None = None) -> ExpiryPolicy:
        """The agent's times to live: per kind (its settings) and per shard (``shards``, or read)."""
        settings = await self.state.get_agent(agent_id) or AgentSettings()
        if shards is None:
            shards = await self.list_shards(agent_id)
        return ExpiryPolicy.of({k.value: ttl for k, ttl in settings.memory_ttl.items()},
                               ((s.shard_id, s.memory_ttl) for s in shards))

    async def get_agent(self, agent_id: str) -> Agent:
        settings = await self.state.get_agent(agent_id)
        if settings is None:
            raise NotFound(f"agent {agent_id!r} has no settings; PUT /v1/agents/{agent_id} creates them")
        name, _ = await self.backend_for(agent_id, settings)
        return Agent(agent_id=agent_id, effective_backend=name, **settings.model_dump())

    async def backend_for(self, agent_id: str, settings: AgentSettings | None = None) -> tuple[str, MemoryBackend]:
        """The name and backend serving ``agent_id``: the one its settings ask for, or the default."""
        if settings is None:
            settings = await self.state.get_agent(agent_id) or AgentSettings()
        return await self.registry.resolve(settings.requested_backend(), self.settings.default_memory_backend, agent_id)

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> tuple[Shard, bool]:
        previous, stored = await self.replace_shard(agent_id, shard_id, shard)
        return stored, previous is None

    async def replace_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> tuple[Shard | None, Shard]:
        """Create or replace a shard: (the shard replaced, None when created; the shard now)."""
        self._check_ttl("memory_ttl", shard.memory_ttl)
        previous = await self.state.put_shard(agent_id, shard_id, shard)
        try:  # a copy for the store's own readers (MongoDB dashboards); Redis holds the truth
            _, backend = await self.backend_for(agent_id)
            await backend.describe_shard(agent_id, shard_id, shard.name, shard.extraction_focus, shard.active)
        except Exception as exc:
            log.warning("shard %s/%s saved; its copy in the memory store failed: %s", agent_id, shard_id, exc)
        return Shard.of(agent_id, shard_id, previous) if previous else None, Shard.of(agent_id, shard_id, shard)

    async def list_shards(self, agent_id: str) -> list[Shard]:
        return [Shard.of(agent_id, sid, s) for sid, s in (await self.state.shards(agent_id)).items()]
