"""API keys on the wire: a key's role and scope as a new key asks for it (POST /v1/keys),
a stored key without its secret, and a new key with it, shown once. Storing and checking
keys is memory_service/access/keys.py."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from memory_service.domain.models import AgentId, UserId

MAX_KEY_AGENTS = 100
MAX_KEY_USERS = 1_000


class Role(StrEnum):
    READ = "read"
    WRITE = "write"  # record messages, form, write memories; reads too
    ADMIN = "admin"  # agent settings, shards, migration, keys, audit, erasure; everything else too

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Role.READ: 0, Role.WRITE: 1, Role.ADMIN: 2}


class KeyIn(BaseModel):
    """What a new key may do. No ``agents`` means every agent: an operator key."""

    name: str = Field(min_length=1, max_length=120, description="what the key is for, e.g. 'support-bot prod'")
    role: Role
    agents: Annotated[list[AgentId], Field(max_length=MAX_KEY_AGENTS)] | None = Field(
        default=None, description="the agents the key reaches; omitted: every agent (an operator key)")
    users: Annotated[list[UserId], Field(max_length=MAX_KEY_USERS)] | None = Field(
        default=None, description="only these users of its one agent; omitted: every user")
    requests_per_minute: int | None = Field(default=None, ge=0, description="overrides RATE_LIMIT_REQUESTS_PER_MINUTE; 0: no limit")
    tokens_per_minute: int | None = Field(default=None, ge=0, description="overrides RATE_LIMIT_TOKENS_PER_MINUTE; 0: no limit")

    @model_validator(mode="after")
    def _scope(self) -> KeyIn:
        if self.agents is not None and not self.agents:
            raise ValueError("agents: name at least one agent, or omit it for an operator key")
        if self.users is not None:
            if not self.agents or len(self.agents) != 1:
                raise ValueError("users: a key limited to users names exactly one agent")
            if not self.users:
                raise ValueError("users: name at least one user, or omit it for every user")
        if self.agents is not None:
            self.agents = sorted(set(self.agents))
        if self.users is not None:
            self.users = sorted(set(self.users))
        return self


class ApiKey(KeyIn):
    """A stored key, without its secret."""

    key_id: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None = None


class NewKey(ApiKey):
    key: str = Field(description="the key itself: shown this once, stored only as a hash")
