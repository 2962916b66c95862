"""Agents and shards: their settings (in the state store), the backend each agent uses, and
its redaction policy applied to the texts recorded for it (``Redactor``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from memory_service.backends.base import MemoryBackend
from memory_service.backends.registry import BackendRegistry
from memory_service.config import Settings
from memory_service.domain import limits, secrets
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
from memory_service.domain.redaction import Policy, SecretsRefused
from memory_service.domain.secrets import Redacted
from memory_service.state import metrics
from memory_service.state.store import StateStore

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

    async def redaction_policy(self, agent_id: str) -> Policy:
        """The agent's redaction policy: its settings' ``redaction`` over REDACTION_MODE and
        REDACTION_KINDS (docs/redaction.md)."""
        settings = await self.state.get_agent(agent_id)
        return Policy.of(self.settings.redaction_mode, self.settings.redaction_kinds,
                         settings.redaction if settings is not None else None)

    def redactor(self, agent_id: str) -> Redactor:
        """The agent's texts as its policy stores them (one redactor per request)."""
        return Redactor(self, agent_id)

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


class Redactor:
    """One agent's texts as its redaction policy stores them: what every record path calls on
    what it was given, before anything is stored, embedded, logged or audited.

    A text in which no detector finds anything of any kind (most) is answered as it is,
    without reading the policy; else the policy is read (once per redactor: a batch reads it
    once) and applied: the text redacted, or SecretsRefused (422) in mode refuse. What it
    redacts is counted (``memory_service_redacted_values_total``) and logged by kind and
    count, never a value."""

    def __init__(self, agents: AgentDirectory, agent_id: str):
        self.agents, self.agent_id = agents, agent_id
        self._policy: Policy | None = None

    async def redacted(self, text: str, field: str) -> Redacted:
        """``text`` as the policy stores it; ``field`` names it in a refusal and in the log."""
        if not secrets.find(text):
            return Redacted(text, {})
        if self._policy is None:
            self._policy = await self.agents.redaction_policy(self.agent_id)
        try:
            redacted = self._policy.apply(text, field)
        except SecretsRefused as refused:
            metrics.REDACTION_REFUSALS.labels(next(iter(refused.counts))).inc()
            log.info("agent %s: refused a %s holding %s (redaction mode refuse)", self.agent_id, field,
                     secrets.describe(refused.counts))
            raise
        if redacted.changed:
            metrics.redacted(redacted.counts)
            log.info("agent %s: redacted %s in a %s", self.agent_id, secrets.describe(redacted.counts), field)
        return redacted

    async def text(self, text: str, field: str) -> str:
        return (await self.redacted(text, field)).text

    async def optional(self, text: str | None, field: str) -> str | None:
        return None if text is None else await self.text(text, field)
