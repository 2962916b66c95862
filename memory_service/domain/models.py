"""The service's data: messages, memories and their provenance, agents, shards."""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from memory_service.domain.errors import MemoryServiceError
from memory_service.domain.expiry import Ttl
from memory_service.domain.limits import MAX_HOST_WINDOW, MESSAGE_CHARS_CEILING, check_time, text_problem
from memory_service.domain.namespaces import Namespace, normalize_id, validate_id, validate_message_id
from memory_service.domain.redaction import RedactionSettings


def _checked_id(what: str) -> AfterValidator:
    return AfterValidator(lambda v: validate_id(v, what))


AgentId = Annotated[str, _checked_id("agent_id")]
UserId = Annotated[str, _checked_id("user_id")]
SessionId = Annotated[str, _checked_id("session_id")]
ShardId = Annotated[str, _checked_id("shard_id")]
MessageId = Annotated[str, AfterValidator(validate_message_id)]
# Ids the service makes (memory ids, key ids), given back in a path or query: held to the
# message id rule, so that they are NFC and hold no invisible or replacement characters.
OpaqueId = Annotated[str, AfterValidator(lambda v: validate_message_id(v, "the id"))]
# A namespace as text ('user:<agent_id>:<user_id>'): its ids NFC-normalised like every id,
# checked in full where it is parsed (Namespace.parse).
NamespaceText = Annotated[str, AfterValidator(normalize_id)]


def keyed_memory_id(agent_id: str, idempotency_key: str) -> str:
    """The memory id of an idempotent write (memory_write with ``idempotency_key``): the same
    agent and key, the same id (the width of a random one, within the tools' MEMORY_ID_CHARS).
    The agent is in it, so two agents' keys never meet. The client exports it, so that a
    caller that writes by key can read, update or delete by that key without writing first
    (the LangGraph store does: memory_service/integrations/langgraph/store.py)."""
    return hashlib.sha256(f"{agent_id}\x1f{idempotency_key}".encode()).hexdigest()[:32]


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class MemoryKind(StrEnum):
    MESSAGE = "message"
    EPISODE = "episode"
    DIRECTIVE = "directive"
    FACT = "fact"
    SUGGESTION = "suggestion"
    OBSERVATION = "observation"
    CONSOLIDATED = "consolidated"  # a user's or a shard's merged memory, versioned by sequence


# Word limits on what is stored, per DESIGN.md.
WORD_LIMITS: dict[MemoryKind, int] = {
    MemoryKind.EPISODE: 50,
    MemoryKind.DIRECTIVE: 25,
    MemoryKind.FACT: 30,
    MemoryKind.SUGGESTION: 35,
}


def _message_content(value: str) -> str:
    if not value.strip():
        raise ValueError("content must not be blank")
    if problem := text_problem(value):  # the HTTP layer refuses it in the body already (not in a batch)
        raise ValueError(problem)
    return value


def _message_time(value: datetime | None) -> datetime | None:
    return check_time(_aware(value)) if value else value


# A message's content and time, as the single route and a batch's items take them. The
# service holds content to MAX_MESSAGE_CHARS (a setting, up to this ceiling).
MessageContent = Annotated[str, Field(min_length=1, max_length=MESSAGE_CHARS_CEILING), AfterValidator(_message_content)]
MessageTime = Annotated[datetime | None, AfterValidator(_message_time)]


class MessageIn(BaseModel):
    """A message as the host application records it."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    agent_id: AgentId
    user_id: UserId
    role: Role
    content: MessageContent
    message_id: MessageId | None = None
    created_at: MessageTime = None
    incognito: bool = False


class BatchMessageIn(BaseModel):
    """One message of a batch (``POST /v1/agents/{agent_id}/messages/batch``): a message of
    the path's agent, with the session it belongs to. Its ``message_id`` is required: a
    batch sent again is recognised by its ids (docs/ingest.md, "Batches")."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    session_id: SessionId
    user_id: UserId
    role: Role
    content: MessageContent
    message_id: MessageId
    created_at: MessageTime = None
    incognito: bool = False

    def message(self, agent_id: str) -> MessageIn:
        """As the single-message route takes it (the fields are checked already)."""
        return MessageIn.model_construct(agent_id=agent_id, user_id=self.user_id, role=self.role, content=self.content,
                                         message_id=self.message_id, created_at=self.created_at,
                                         incognito=self.incognito)


class MessageBatchIn(BaseModel):
    """The body of ``POST /v1/agents/{agent_id}/messages/batch`` (its schema; the route reads
    each item on its own, so that one bad item is refused alone)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[BatchMessageIn] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class RefusedItem:
    """An item of a batch refused before it is recorded (unreadable, or beyond the caller's
    key): answered ``refused`` with ``error``, and the ids it named where they could be read."""

    error: MemoryServiceError
    session_id: str | None = None
    message_id: str | None = None


class Provenance(BaseModel):
    """Where a memory came from. Serialised as the episode body's ``metadata``."""

    agent_id: str
    user_id: str | None = None
    user_ids: list[str] = Field(default_factory=list)
    session_id: str | None = None
    message_ids: list[str] = Field(default_factory=list)
    memory_ids: list[str] = Field(default_factory=list)  # for consolidated memories: what they merged
    sequence: int = 0
    role: Role | None = None


@functools.lru_cache(maxsize=4096)
def _canonical_namespace(value: str) -> str:
    """A namespace's text, checked and in its one spelling: parsed once per text (a search
    builds dozens of memories of a few namespaces)."""
    return str(Namespace.parse(value))


class Memory(BaseModel):
    """One stored memory. ``id`` is deterministic for formed memories, so rewrites are no-ops."""

    id: str
    kind: MemoryKind
    namespace: str
    content: str
    metadata: Provenance
    valid_at: datetime = Field(default_factory=utcnow)
    evicted: bool = False  # past a FIFO cap: kept for retention and migration, no longer read
    # Of ``search_text``, unit length; None until embedded (a failing embedder never
    # blocks a write: the memory is stored and embedded later).
    embedding: list[float] | None = Field(default=None, repr=False)
    # The name of the embedder that made ``embedding`` (``Embedder.name``): stored beside the
    # vector, so that search compares a query only with vectors of its own model. A read that
    # leaves the vector out may still set it (the graph's recent reads do): the memory has a
    # stored vector of that model, which a search ``like`` it can reuse.
    embedding_model: str | None = Field(default=None, repr=False)
    # Written by the memory tools (memory_service/curation/tools.py); formed memories have none.
    title: str | None = None
    tags: list[str] = Field(default_factory=list)
    confidence: float | None = None
    updated_at: datetime | None = None
    # Soft delete: set, the memory is read by id only (memory_get, undelete, erasure,
    # migration) until the retention policy purges it; every other read skips it.
    deleted_at: datetime | None = None
    # Expiry (docs/expiry.md): from this time on, every read but those by id skips it, as it
    # skips a soft-deleted one, and the retention job purges it. Set by the writer
    # (memory_write's ``expires_at``) or by the agent's time to live for its kind or shard.
    expires_at: datetime | None = None
    # Corrections (docs/corrections.md): a memory found wrong keeps its words as history but
    # leaves every read but those by id, as a soft-deleted one does, and is never purged for
    # it; ``corrected_by`` names the memory that replaced it, whose ``corrects`` names it back.
    # Told apart from an update (memory_update: ``updated_at``, the world changed).
    corrected_at: datetime | None = None
    corrected_by: str | None = None
    corrects: str | None = None
    # Which store answered the read that returned it ("graph", "mongo"): set by the backend
    # that built it, never stored (a mirrored backend may answer from either store).
    served_by: str | None = Field(default=None, exclude=True, repr=False)

    @property
    def live(self) -> bool:
        """Neither soft-deleted, corrected, evicted nor expired: what reads and searches give."""
        return self.deleted_at is None and self.corrected_at is None and not self.evicted and not self.expired()

    def expired(self, now: datetime | None = None) -> bool:
        """Past its ``expires_at`` (at ``now``, by default the current time)."""
        return self.expires_at is not None and self.expires_at <= (now or utcnow())

    @property
    def search_text(self) -> str:
        """What full-text and vector search index: a message under its speaker, else the content."""
        if self.kind is MemoryKind.MESSAGE:
            role = self.metadata.role
            speaker = self.metadata.user_id if role in (None, Role.USER) and self.metadata.user_id else (role or "user")
            return f"{speaker}: {self.content}"
        return self.content

    @property
    def source_message_ids(self) -> list[str]:
        return list(self.metadata.message_ids)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return _canonical_namespace(value)

    @field_validator("valid_at")
    @classmethod
    def _timezone(cls, value: datetime) -> datetime:
        return _aware(value)

    @field_validator("updated_at", "deleted_at", "expires_at")
    @classmethod
    def _optional_timezone(cls, value: datetime | None) -> datetime | None:
        return _aware(value) if value else value

    def curated_fields(self) -> dict[str, Any]:
        """The tool-written fields that are set, as JSON (the body carries them beside DESIGN.md's)."""
        fields = {"title": self.title, "tags": self.tags or None, "confidence": self.confidence,
                  "updated_at": self.updated_at.isoformat() if self.updated_at else None,
                  "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                  "corrected_at": self.corrected_at.isoformat() if self.corrected_at else None,
                  "corrected_by": self.corrected_by, "corrects": self.corrects}
        return {k: v for k, v in fields.items() if v is not None}

    def episode_body(self) -> str:
        """The JSON body written to Graphiti, in the shape DESIGN.md fixes (plus the
        tool-written fields, only when set: formed memories' bodies are unchanged)."""
        return json.dumps(
            {
                "memory_type": self.kind.value,
                "content": self.content,
                "metadata": self.metadata.model_dump(mode="json"),
                **self.curated_fields(),
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_episode_body(cls, *, id: str, namespace: str, body: str, valid_at: Any) -> Memory:
        data = json.loads(body)
        return cls(
            id=id,
            kind=data["memory_type"],
            namespace=namespace,
            content=data["content"],
            metadata=Provenance.model_validate(data["metadata"]),
            valid_at=valid_at,
            title=data.get("title"),
            tags=data.get("tags") or [],
            confidence=data.get("confidence"),
            updated_at=data.get("updated_at"),
            expires_at=data.get("expires_at"),
            corrected_at=data.get("corrected_at"),
            corrected_by=data.get("corrected_by"),
            corrects=data.get("corrects"),
        )


def count_kinds(memories: Iterable[Memory]) -> dict[str, int]:
    """How many of ``memories`` are of each kind, by the kind's name, in the order the kinds
    first appear: what a formation, an erasure and a purge report, and their audit entries."""
    return dict(Counter(memory.kind.value for memory in memories))


@dataclass(frozen=True, slots=True)
class StoreQuery:
    """What retrieval asks a backend for: candidates per signal, inside a scope."""

    terms: Sequence[str]  # full-text terms, normalised (lowercase words, stopwords removed)
    vector: Sequence[float] | None = None  # the query's embedding
    # The model that embedded ``vector``: only stored vectors of this model are compared with
    # it (None: no filter, for callers that write and search without naming models).
    vector_model: str | None = None
    # Instead of ``vector``: the id of a stored memory whose vector of ``vector_model`` is the
    # query's (the memory block searches with the session's latest message); without one,
    # the answer has no vector signal.
    like: str | None = None
    namespaces: Sequence[Namespace] | None = None  # None: every namespace of the agent
    kinds: Sequence[MemoryKind] | None = None  # None: every kind
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 50  # candidates per signal
    tags: Sequence[str] = ()  # only memories carrying every one of these tags


# Other names of a backend: the seed systems' agent flag
# ``agent_extras.experimental_memory_backend = "graphiti"`` selects the graph backend (Graphiti's
# model on FalkorDB), so agents configured for them keep their memories in the graph.
BACKEND_ALIASES = {"graphiti": "graph"}
LEGACY_BACKEND_FLAG = "experimental_memory_backend"  # in agent_extras


def backend_name(name: str) -> str:
    """The registered name a backend is asked for by: an alias resolved, any other name as given."""
    return BACKEND_ALIASES.get(name, name)


class ContextType(StrEnum):
    """What the query of a memory block is: each type may carry its own recall settings."""

    CHAT = "chat"  # a chat turn (the default)
    TASK = "task"  # a task the agent is to carry out
    DOCUMENT = "document"  # a document the agent reads


class RecallScope(StrEnum):
    """Where a memory block looks for the memories relevant to its query."""

    SESSION = "session"  # the session alone
    USER = "user"  # the user's memory and every session of the agent they spoke in
    SHARED = "shared"  # those, the agent's active shards and its own namespace (the default)


class Recall(BaseModel):
    """How a memory block picks the memories relevant to its query. Set per agent, per
    context type and per call; a field left None takes the wider level's value, and the
    server's CONTEXT_* settings at the end (memory_service/recall/assembler.py)."""

    model_config = ConfigDict(extra="forbid")

    min_score: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False,
                                    description="fused score below which a memory is left out (0 to 1)")
    min_similarity: float | None = Field(
        default=None, ge=-1, le=1, allow_inf_nan=False,
        description="a memory found by the vector signal alone is left out below this cosine similarity")
    top_k: int | None = Field(default=None, ge=0, le=1000, description="most query-relevant memories the block shows")
    scope: RecallScope | None = Field(default=None, description="where relevant memories are looked for")
    host_window: int | None = Field(
        default=None, ge=0, le=MAX_HOST_WINDOW,
        description="how many of the session's latest messages the host already sends to the model: they are left "
                    "out of the relevant memories")

    def over(self, wider: Recall) -> Recall:
        """These settings, with ``wider``'s where these leave one unset."""
        mine = self.model_dump(exclude_none=True, include=set(Recall.model_fields))
        return Recall(**{**wider.model_dump(include=set(Recall.model_fields)), **mine})


class ContextSettings(Recall):
    """An agent's recall settings, and those of each context type (over the agent's)."""

    types: dict[ContextType, Recall] = Field(default_factory=dict)


class LLMBudget(BaseModel):
    """How many LLM tokens (prompt and completion, formation and consolidation together) an
    agent may spend per UTC day and per UTC month (None: no limit of the agent's own; the
    deployment's caps, LLM_TOKENS_PER_DAY and LLM_TOKENS_PER_MONTH, still hold), and what
    formation does once a call would cross one (docs/llm-budgets.md)."""

    model_config = ConfigDict(extra="forbid")

    tokens_per_day: int | None = Field(default=None, ge=1, le=10**12,
                                       description="tokens the agent may spend per UTC day; null: no daily limit")
    tokens_per_month: int | None = Field(default=None, ge=1, le=10**13,
                                         description="tokens the agent may spend per UTC month; null: no monthly limit")
    when_spent: Literal["offline", "wait"] = Field(
        default="offline", description="once a window's call would cross a budget: `offline` forms it with the offline "
                                       "(rule) extractor, `wait` keeps it pending until the budget allows the call")


class AgentSettings(BaseModel):
    """Per-agent settings. ``memory_backend`` routes the agent; None means the default.

    ``agent_extras.experimental_memory_backend`` is the legacy spelling of the same switch;
    either may name a backend by an alias (BACKEND_ALIASES: "graphiti" is the graph backend).
    """

    model_config = ConfigDict(extra="forbid")

    memory_backend: str | None = Field(default=None, min_length=1, max_length=64)
    users_join_sessions: bool = Field(
        default=False, description="whether a key limited to some users may record into a session other users of the "
                                   "agent started (and from then on see it); off: it is refused as a session of "
                                   "another agent. Keys for all users are not limited by it")
    context: ContextSettings = Field(default_factory=ContextSettings,
                                     description="how its memory blocks pick the memories relevant to a query")
    redaction: RedactionSettings = Field(
        default_factory=RedactionSettings,
        description="what recording does with the secrets and personal data it finds (docs/redaction.md); unset "
                    "fields take REDACTION_MODE and REDACTION_KINDS")
    llm_budget: LLMBudget = Field(default_factory=LLMBudget,
                                  description="its LLM token budgets per day and month, and what formation does when "
                                              "one is spent")
    memory_ttl: dict[MemoryKind, Ttl] = Field(
        default_factory=dict,
        description="time to live per memory kind (seconds, or a text like '90d', '12h'): a memory of the kind "
                    "formed or written without its own expires_at expires that long after it is stored "
                    "(docs/expiry.md)")
    # Plain JSON of at most MAX_EXTRAS_BYTES: the service checks it on writes (limits.check_extras),
    # so that settings stored before the check was made still read.
    agent_extras: dict[str, Any] = Field(default_factory=dict)

    def requested_backend(self) -> str | None:
        legacy = self.agent_extras.get(LEGACY_BACKEND_FLAG)
        requested = self.memory_backend or (legacy if isinstance(legacy, str) and legacy else None)
        return backend_name(requested) if requested else None


class Agent(AgentSettings):
    agent_id: str
    effective_backend: str | None = None


class ShardIn(BaseModel):
    """A topic an agent keeps collective knowledge on."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=120)
    extraction_focus: str = Field(default="", max_length=2_000)
    active: bool = True
    memory_ttl: Ttl | None = Field(
        default=None, description="time to live of the shard's memories (seconds, or a text like '90d'): one formed "
                                  "or written without its own expires_at expires that long after it is stored "
                                  "(docs/expiry.md)")


class Shard(ShardIn):
    agent_id: str
    shard_id: str

    @classmethod
    def of(cls, agent_id: str, shard_id: str, settings: ShardIn) -> Shard:
        return cls(agent_id=agent_id, shard_id=shard_id, **settings.model_dump())
