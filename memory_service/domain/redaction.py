"""An agent's redaction policy: what the record paths do with the secrets and personal data
they find (memory_service/domain/secrets.py) before anything is stored (docs/redaction.md).

Three modes: ``redact`` (the default) replaces each value with ``[redacted:<kind>]`` and
stores the rest; ``refuse`` stores nothing and answers 422 naming the kinds found (never a
value); ``off`` stores the text as it came. Which kinds count is a list of kinds: by
default the secrets (``SECRET_KINDS``); emails and phone numbers only when a policy lists
them. The server's REDACTION_MODE and REDACTION_KINDS are every agent's default; an agent's
settings (``AgentSettings.redaction``) may set either for itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memory_service.domain import secrets
from memory_service.domain.errors import InvalidInput
from memory_service.domain.secrets import ALL_KINDS, Kind, Redacted


class RedactionMode(StrEnum):
    REDACT = "redact"
    REFUSE = "refuse"
    OFF = "off"


class RedactionSettings(BaseModel):
    """An agent's redaction policy; a field left None takes the server's (REDACTION_MODE,
    REDACTION_KINDS)."""

    model_config = ConfigDict(extra="forbid")

    mode: RedactionMode | None = Field(
        default=None, description="redact (store the text with each value replaced by [redacted:<kind>]), refuse "
                                  "(store nothing: 422 naming the kinds found) or off; None: REDACTION_MODE")
    kinds: list[Kind] | None = Field(
        default=None, max_length=len(ALL_KINDS),
        description="the kinds looked for: api_key, token, private_key, password, card_number, iban, government_id, "
                    "email, phone; None: REDACTION_KINDS")

    @field_validator("kinds")
    @classmethod
    def _once_each(cls, kinds: list[Kind] | None) -> list[Kind] | None:
        return list(dict.fromkeys(kinds)) if kinds is not None else None


class SecretsRefused(InvalidInput):
    """A text the agent's policy (mode refuse) does not store: it names the kinds found and
    how many, never a value."""

    def __init__(self, field: str, counts: dict[str, int]):
        super().__init__(f"{field}: holds {secrets.describe(counts)}, which this agent's redaction policy (mode "
                         "refuse) does not store; nothing was stored: take it out and send it again")
        self.counts = counts


@dataclass(frozen=True, slots=True)
class Policy:
    mode: RedactionMode
    kinds: frozenset[Kind]

    @classmethod
    def of(cls, mode: RedactionMode, kinds: list[Kind], agent: RedactionSettings | None = None) -> Policy:
        """The server's policy (``mode``, ``kinds``) with what the agent's settings set over it."""
        agent = agent or RedactionSettings()
        return cls(agent.mode or mode, frozenset(agent.kinds if agent.kinds is not None else kinds))

    @property
    def active(self) -> bool:
        return self.mode is not RedactionMode.OFF and bool(self.kinds)

    def apply(self, text: str, field: str) -> Redacted:
        """``text`` as the policy stores it; SecretsRefused (422) if it refuses it. ``field``
        names the text in the refusal ("content", "title"...)."""
        if not self.active:
            return Redacted(text, {})
        redacted = secrets.redact(text, self.kinds)
        if redacted.changed and self.mode is RedactionMode.REFUSE:
            raise SecretsRefused(field, redacted.counts)
        return redacted


def merged(*counts: dict[str, int]) -> dict[str, int]:
    """The sum of several texts' counts, by kind in ``ALL_KINDS``' order."""
    total: dict[str, int] = {}
    for part in counts:
        for kind, n in part.items():
            total[kind] = total.get(kind, 0) + n
    return {k.value: total[k.value] for k in ALL_KINDS if k.value in total}
