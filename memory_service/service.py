"""MemoryService: the one entry point. The HTTP API, the CLI and the worker call it.

It routes each agent to a backend from a registry of named factories, records messages,
runs the formation gates, forms memories, and assembles the memory context.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from backends.base import MemoryBackend, read_sources

from . import gates, limits
from .config import Settings
from .consolidation import Consolidator, RuleBasedConsolidator, consolidate
from .context import (
    MIN_BUDGET_CHARS,
    ContextInputs,
    RelevantItem,
    RenderedContext,
    ShardContext,
    UserContext,
    budget_for_model,
    render_context,
)
from .errors import BackendUnavailable, Conflict, FormationPending, InvalidInput, MemoryServiceError, NotFound, preview
from .extraction import Extractor
from .formation import FormationResult, FormationSummary, form_window, message_memory_id
from .jobs import JobQueue, formation_job_id
from .models import Agent, AgentSettings, Memory, MemoryKind, MessageIn, Provenance, Shard, ShardIn
from .namespaces import Namespace, NamespaceKind, validate_id
from .retrieval import Retriever, SearchRequest, SearchResult, embed_memories, query_terms, snippet
from .state import StateStore

log = logging.getLogger(__name__)

# The last complete memory block per (agent, user, session, budget) is kept to serve when
# every store fails: in Redis for a day, and the most recent ones in this process's memory.
LAST_GOOD_TTL_SECONDS = 86_400
LAST_GOOD_IN_PROCESS = 1_000
# The CONTEXT_RELEVANT_* counts are per this many characters of budget.
RELEVANT_COUNTS_PER_CHARS = 4_000

BackendFactory = Callable[[Settings], MemoryBackend | Awaitable[MemoryBackend]]


@dataclass(slots=True)
class RecordResult:
    session_id: str
    message_id: str
    sequence: int
    duplicate: bool
    gate: gates.GateStatus
    formation_job: str | None = None  # the job forming the session's window, if a gate opened


@dataclass(slots=True)
class _FailedFactory:
    error: str
    failed_at: float


@dataclass(slots=True)
class BackendRegistry:
    """Named backend factories; each backend is built once and reused.

    A factory that fails is remembered for ``retry_seconds`` so that a broken store
    costs one warning, not one failed connection per call.
    """

    settings: Settings
    factories: dict[str, BackendFactory] = field(default_factory=dict)
    _live: dict[str, MemoryBackend] = field(default_factory=dict)
    _failed: dict[str, _FailedFactory] = field(default_factory=dict)
    _warned: set[tuple[str, str]] = field(default_factory=set)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def register(self, name: str, factory: BackendFactory) -> None:
        self.factories[name] = factory

    def _warn_once(self, key: tuple[str, str], message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    async def get(self, name: str) -> MemoryBackend:
        """The live backend called ``name``; raises BackendUnavailable if it cannot start."""
        if name in self._live:
            return self._live[name]
        if name not in self.factories:
            raise BackendUnavailable(f"no memory backend named {name!r} is registered")
        failed = self._failed.get(name)
        if failed and time.monotonic() - failed.failed_at < self.settings.backend_retry_seconds:
            raise BackendUnavailable(f"memory backend {name!r} failed to start: {failed.error}")
        async with self._lock:
            if name in self._live:
                return self._live[name]
            try:
                backend = self.factories[name](self.settings)
                if asyncio.iscoroutine(backend):
                    backend = await backend
                await backend.start()
            except Exception as exc:
                self._failed[name] = _FailedFactory(f"{type(exc).__name__}: {exc}", time.monotonic())
                self._warned.discard(("failed", name))
                raise BackendUnavailable(f"memory backend {name!r} failed to start: {exc}") from exc
            self._failed.pop(name, None)
            self._live[name] = backend
            return backend

    async def resolve(self, requested: str | None, default: str, agent_id: str) -> tuple[str, MemoryBackend]:
        """The agent's backend, or the default with one logged warning."""
        if requested and requested != default:
            if requested not in self.factories:
                self._warn_once(("unknown", requested), "agent %s asks for unknown memory backend %r; using %r",
                                agent_id, requested, default)
            else:
                try:
                    return requested, await self.get(requested)
                except BackendUnavailable as exc:
                    self._warn_once(("failed", requested), "%s; agents that ask for it use %r", exc, default)
        return default, await self.get(default)

    async def live(self) -> list[MemoryBackend]:
        """The default backend and every other one started so far."""
        await self.get(self.settings.default_memory_backend)
        return list(self._live.values())

    async def close(self) -> None:
        for backend in self._live.values():
            await backend.close()
        self._live.clear()

    async def health(self) -> dict:
        report = {name: await b.health() for name, b in self._live.items()}
        for name, failed in self._failed.items():
            report.setdefault(name, {"ok": False, "error": failed.error})
        return report


class MemoryService:
    def __init__(self, settings: Settings, state: StateStore, extractor: Extractor, queue: JobQueue,
                 consolidator: Consolidator | None = None, embedder=None):
        self.settings = settings
        self.state = state
        self.extractor = extractor
        self.queue = queue
        self.consolidator = consolidator or RuleBasedConsolidator()
        self.embedder = embedder
        self.retriever = Retriever(settings, state, embedder)
        self.registry = BackendRegistry(settings)
        self._last_good: OrderedDict[str, RenderedContext] = OrderedDict()

    def register_backend(self, name: str, factory: BackendFactory) -> None:
        self.registry.register(name, factory)

    async def close(self) -> None:
        await self.registry.close()
        await self.queue.close()
        await self.state.close()
        for llm_user in (self.extractor, self.consolidator, self.embedder):
            if aclose := getattr(llm_user, "aclose", None):
                await aclose()

    # Agents and shards -------------------------------------------------------------

    async def put_agent(self, agent_id: str, settings: AgentSettings) -> Agent:
        validate_id(agent_id, "agent_id")
        limits.check_extras(settings.agent_extras, self.settings.max_extras_bytes)
        requested = settings.requested_backend()
        if requested and requested not in self.registry.factories:
            known = ", ".join(sorted(self.registry.factories))
            raise InvalidInput(f"unknown memory backend {preview(requested)}; registered backends: {known}")
        await self.state.put_agent(agent_id, settings)
        return await self.get_agent(agent_id)

    async def get_agent(self, agent_id: str) -> Agent:
        validate_id(agent_id, "agent_id")
        settings = await self.state.get_agent(agent_id)
        if settings is None:
            raise NotFound(f"agent {agent_id!r} has no settings; PUT /v1/agents/{agent_id} creates them")
        name, _ = await self.backend_for(agent_id, settings)
        return Agent(agent_id=agent_id, effective_backend=name, **settings.model_dump())

    async def backend_for(self, agent_id: str, settings: AgentSettings | None = None) -> tuple[str, MemoryBackend]:
        if settings is None:
            settings = await self.state.get_agent(agent_id) or AgentSettings()
        return await self.registry.resolve(settings.requested_backend(), self.settings.default_memory_backend, agent_id)

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> tuple[Shard, bool]:
        validate_id(agent_id, "agent_id")
        validate_id(shard_id, "shard_id")
        created = await self.state.put_shard(agent_id, shard_id, shard)
        try:  # a copy for the store's own readers (MongoDB dashboards); Redis holds the truth
            _, backend = await self.backend_for(agent_id)
            await backend.describe_shard(agent_id, shard_id, shard.name, shard.extraction_focus, shard.active)
        except Exception as exc:
            log.warning("shard %s/%s saved; its copy in the memory store failed: %s", agent_id, shard_id, exc)
        return Shard(agent_id=agent_id, shard_id=shard_id, **shard.model_dump()), created

    async def list_shards(self, agent_id: str) -> list[Shard]:
        validate_id(agent_id, "agent_id")
        return [Shard(agent_id=agent_id, shard_id=sid, **s.model_dump()) for sid, s in (await self.state.shards(agent_id)).items()]

    # Recording and formation -------------------------------------------------------

    async def record_message(self, session_id: str, message: MessageIn) -> RecordResult:
        """Store one message (idempotent by message_id) and evaluate the gates."""
        validate_id(session_id, "session_id")
        limits.check_message_chars(message.content, self.settings.max_message_chars)
        message_id = message.message_id or uuid.uuid4().hex
        digest = hashlib.sha256(f"{message.role}\x1f{message.user_id}\x1f{message.content}".encode()).hexdigest()[:16]
        reservation = await self.state.reserve_message(session_id, message.agent_id, message_id, digest)
        if reservation.digest != digest:
            raise Conflict(f"message_id {message_id!r} was already recorded in session {session_id!r} with other content")
        _, backend = await self.backend_for(message.agent_id)
        memory = Memory(
            id=message_memory_id(session_id, message_id),
            kind=MemoryKind.MESSAGE,
            namespace=str(Namespace.session(session_id)),
            content=message.content,
            metadata=Provenance(
                agent_id=message.agent_id,
                user_id=message.user_id,
                user_ids=[message.user_id],
                session_id=session_id,
                message_ids=[message_id],
                sequence=reservation.sequence,
                role=message.role,
            ),
            valid_at=message.created_at or datetime.now(UTC),
        )
        # Store first, then make it pending: a failed write leaves nothing pending that
        # formation could not read, and the client's retry completes the same message.
        # A failing embedder does not fail it: the message is stored and embedded later.
        await embed_memories(self.embedder, [memory])
        try:
            await backend.write([memory])
        except Exception as exc:
            raise BackendUnavailable(
                f"could not store message {message_id!r} of session {session_id!r}: {type(exc).__name__}: {exc}; "
                "nothing is pending for it: send it again with the same message_id"
            ) from exc
        first = await self.state.commit_message(
            session_id, message_id, reservation.sequence, gates.weighted_tokens(message.role, message.content),
            message.user_id if message.role == "user" else None, message.incognito, message.agent_id,
        )
        gate = gates.evaluate(await self.state.counters(session_id), self.settings)
        result = RecordResult(session_id, message_id, reservation.sequence, duplicate=not first, gate=gate)
        if gate.open:
            result.formation_job = await self._schedule(session_id, gated=True)
        return result

    async def session_gate(self, session_id: str) -> gates.GateStatus:
        validate_id(session_id, "session_id")
        return gates.evaluate(await self.state.counters(session_id), self.settings)

    async def _schedule(self, session_id: str, *, gated: bool = False, min_messages: int = 1) -> str | None:
        """Claim the session's window (or find the claimed one) and enqueue its job.

        ``gated``: only if the gates are open on what is pending at the claim itself.
        """
        s = self.settings
        if gated:
            min_messages = s.never_form_memories_less_than_n_messages
        claim = await self.state.claim_window(
            session_id, s.max_window_messages, min_messages,
            s.memory_formation_msg_interval if gated else 0, s.memory_formation_token_interval if gated else 0,
        )
        if claim is None:
            return None
        return await self.queue.enqueue_formation(session_id, claim.window)

    async def maybe_form_memories(self, session_id: str) -> str | None:
        """Enqueue the pending window's formation if a gate is open; the job id, or None."""
        if not (await self.session_gate(session_id)).open:
            return None
        return await self._schedule(session_id, gated=True)

    async def form_memories(self, session_id: str, wait: bool = True) -> FormationSummary:
        """Form whatever is pending now, gates or not (never in an incognito session).

        Enqueues the window's job (or joins the one already queued) and, with ``wait``,
        answers once every message pending at the call is stored: a window a gate claimed
        earlier holds only the messages pending then, so the windows after it are formed
        too, and the answer sums them. The worker does the forming.
        """
        validate_id(session_id, "session_id")
        counters = await self.state.counters(session_id)
        if counters.agent_id is None:
            raise NotFound(f"session {session_id!r} has no recorded messages")
        job_id = await self._schedule(session_id)
        if job_id is None:
            reason = "incognito session: memories are never formed" if counters.incognito else "no pending messages"
            return FormationSummary(session_id=session_id, extractor=self.extractor.name, reason=reason)
        if not wait:
            return FormationSummary(session_id=session_id, extractor=self.extractor.name, job_id=job_id, reason="queued")
        deadline = time.monotonic() + self.settings.form_wait_seconds
        summaries: list[FormationSummary] = []
        formed = 0  # windows are formed oldest first: once this many are, all pending at the call are
        while job_id is not None:
            summaries.append(await self._wait_for_window(session_id, job_id, deadline))
            formed += len(summaries[-1].message_ids) or counters.pending_messages  # formed elsewhere: stop
            job_id = await self._schedule(session_id) if formed < counters.pending_messages else None
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

    async def session_status(self, session_id: str) -> dict:
        """The session's gate, formation cursor and the job of its claimed window."""
        validate_id(session_id, "session_id")
        counters = await self.state.counters(session_id)
        if counters.agent_id is None:
            raise NotFound(f"session {session_id!r} has no recorded messages")
        claim = await self.state.current_claim(session_id)
        job = None
        if claim is not None:
            job = {"window": claim.window, "messages": len(claim.messages),
                   **await self.queue.status(formation_job_id(session_id, claim.window))}
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
        }

    # Work the worker does (workers/jobs.py calls these) ------------------------------

    async def run_formation(self, session_id: str, window: int) -> FormationSummary:
        """Form the claimed window ``window`` of the session, exactly once across retries."""
        claim = await self.state.current_claim(session_id)
        if claim is None or claim.window != window:
            return FormationSummary(session_id=session_id, window=window, extractor=self.extractor.name,
                                    reason="window already formed")
        counters = await self.state.counters(session_id)
        agent_id = counters.agent_id
        _, backend = await self.backend_for(agent_id)
        started = time.perf_counter()
        result = await form_window(claim=claim, agent_id=agent_id, backend=backend, state=self.state,
                                   extractor=self.extractor, shards=await self.list_shards(agent_id),
                                   embedder=self.embedder)
        if not result.already_formed:
            await self._after_formation(agent_id, backend, result, time.perf_counter() - started)
        if (await self.session_gate(session_id)).open:  # messages that arrived meanwhile
            await self._schedule(session_id, gated=True)
        return FormationSummary.of(result)

    async def _after_formation(self, agent_id: str, backend: MemoryBackend, result: FormationResult, seconds: float) -> None:
        usage = result.usage
        await self.state.add_metrics(
            formations=1, formed_messages=len(result.message_ids), formed_memories=result.written,
            formation_seconds=seconds,
            **({"llm_calls": usage.calls, "llm_attempts": usage.attempts, "llm_prompt_tokens": usage.prompt_tokens,
                "llm_completion_tokens": usage.completion_tokens, "llm_seconds": usage.latency_seconds} if usage else {}),
        )
        touched = {m.namespace for m in result.memories}
        for namespace in sorted(touched):
            ns = Namespace.parse(namespace)
            if ns.kind is NamespaceKind.SHARD:
                await backend.trim(agent_id, ns, MemoryKind.FACT, self.settings.facts_per_shard)
            if ns.kind in (NamespaceKind.USER, NamespaceKind.SHARD):
                await self._maybe_consolidate(namespace)

    def _consolidation_threshold(self, namespace: Namespace) -> int:
        if namespace.kind is NamespaceKind.USER:
            return self.settings.consolidate_directives_after
        return self.settings.consolidate_suggestions_after

    async def _maybe_consolidate(self, namespace: str) -> str | None:
        backlog = await self.state.consolidation_backlog(namespace)
        if backlog < self._consolidation_threshold(Namespace.parse(namespace)):
            return None
        version = await self.state.consolidation_version(namespace)
        return await self.queue.enqueue_consolidation(namespace, version, backlog)

    async def run_consolidation(self, namespace: str, version: int, count: int) -> dict:
        """Merge the ``count`` oldest pending items of ``namespace`` into consolidated version+1."""
        ns = Namespace.parse(namespace)
        agent_id = ns.fields[0]
        _, backend = await self.backend_for(agent_id)
        words = self.settings.user_memory_words if ns.kind is NamespaceKind.USER else self.settings.shard_memory_words
        outcome = await consolidate(namespace=ns, version=version, count=count, backend=backend, state=self.state,
                                    consolidator=self.consolidator, word_limit=words, agent_id=agent_id,
                                    embedder=self.embedder)
        counters = {"consolidations": 1, "consolidated_items": outcome["items"]} if outcome["consolidated"] else {}
        if usage := outcome.get("usage"):
            counters.update(
                consolidation_llm_calls=usage["calls"], consolidation_llm_attempts=usage["attempts"],
                consolidation_llm_prompt_tokens=usage["prompt_tokens"],
                consolidation_llm_completion_tokens=usage["completion_tokens"], consolidation_llm_seconds=usage["latency_seconds"])
        if counters:
            await self.state.add_metrics(**counters)
        if outcome["consolidated"]:
            await self._maybe_consolidate(namespace)
        return outcome

    async def sweep_cold_sessions(self) -> list[str]:
        """Enqueue the window of every session idle long enough with the minimum of messages."""
        idle_before = time.time() - self.settings.consider_cold_after_minutes * 60
        min_messages = self.settings.never_form_memories_less_than_n_messages
        enqueued = []
        for session_id in await self.state.idle_sessions(idle_before):
            # The claim itself refuses incognito sessions and those below the minimum.
            if job_id := await self._schedule(session_id, min_messages=min_messages):
                enqueued.append(job_id)
        if enqueued:
            log.info("cold-session sweep enqueued %d window(s)", len(enqueued))
        return enqueued

    # The memory context --------------------------------------------------------------

    # Search ----------------------------------------------------------------------------

    async def search(self, agent_id: str, query: str | SearchRequest, **options) -> SearchResult:
        """Memories of ``agent_id`` relevant to ``query``, best first, each explained.

        ``options`` are the fields of ``SearchRequest``: ``scope`` (agent, user, session,
        shard, namespaces), ``user_id``/``session_id``/``shard_id``/``namespaces``, ``top_k``,
        ``min_score``, ``kinds``, ``since``, ``until``. A scope never reaches another agent's
        namespaces.
        """
        validate_id(agent_id, "agent_id")
        request = query if isinstance(query, SearchRequest) else SearchRequest(query=query, **options)
        _, backend = await self.backend_for(agent_id)
        return await self.retriever.search(agent_id, backend, request)

    async def backfill_embeddings(self, batch: int = 64, limit: int | None = None,
                                  on_progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
        """Embed the memories stored without an embedding (the embedder was down); counts.

        Resumable by construction: what is embedded is no longer ``unembedded``. Stops at
        ``limit`` memories, or when the embedder fails (what is left waits for the next run).
        """
        report = {"embedded": 0, "failed_batches": 0}
        if self.embedder is None:
            return report
        for backend in await self.registry.live():
            for agent_id in await backend.agents():
                while limit is None or report["embedded"] < limit:
                    size = batch if limit is None else min(batch, limit - report["embedded"])
                    memories = await backend.unembedded(agent_id, size)
                    if not memories:
                        break
                    if not await embed_memories(self.embedder, memories):  # it logged why
                        report["failed_batches"] += 1
                        return report
                    done = await backend.set_embeddings(agent_id, {m.id: m.embedding for m in memories})
                    report["embedded"] += done
                    if on_progress:
                        on_progress(agent_id, done)
                    if done < len(memories):  # removed meanwhile: do not loop on them
                        break
        if report["embedded"]:
            await self.state.add_metrics(embeddings_backfilled=report["embedded"])
        return report

    # The memory context --------------------------------------------------------------

    async def assemble_memory_context(
        self, agent_id: str, user_id: str, session_id: str, model: str | None = None,
        query: str | None = None, budget: int | None = None,
    ) -> RenderedContext:
        """The XML memory block for one model call; it fits the budget.

        ``budget`` (characters) overrides the model's. With a ``query`` the block gains the
        memories most relevant to it; without one, the session's latest user message is the
        query. A store that fails to answer shrinks the block; it never fails the prompt.
        """
        for value, what in ((agent_id, "agent_id"), (user_id, "user_id"), (session_id, "session_id")):
            validate_id(value, what)
        if query is not None and len(query) > self.settings.search_max_query_chars:
            raise InvalidInput(f"query is {len(query)} characters long; the limit is {self.settings.search_max_query_chars}")
        if budget is not None and budget < MIN_BUDGET_CHARS:
            raise InvalidInput(f"budget must be at least {MIN_BUDGET_CHARS} characters, got {budget}")
        if budget is None:
            budget = budget_for_model(model, self.settings.context_budget_chars, self.settings.context_model_budgets)
        query = query.strip() if query else None
        last_good_key = json.dumps([agent_id, user_id, session_id, budget])
        try:
            rendered = await self._assemble(agent_id, user_id, session_id, budget, last_good_key, query)
        except MemoryServiceError:
            raise  # the caller's mistake (e.g. another agent's session), not an outage
        except Exception as exc:
            # The state store is down too: the last good block this process served, if any.
            rendered = self._last_good.get(last_good_key)
            log.warning("memory context for %s/%s/%s from %s: state store failed: %s", agent_id, user_id, session_id,
                        "this process's last good block" if rendered else "nothing", exc)
            rendered = replace(rendered, source="last-good") if rendered else replace(
                render_context(ContextInputs(), budget), source="none")
        with suppress(Exception):
            await self.state.add_metrics(**{f"context_from_{rendered.source.replace('+', '_').replace('-', '_')}": 1})
        return rendered

    async def _assemble(self, agent_id: str, user_id: str, session_id: str, budget: int, last_good_key: str,
                        query: str | None) -> RenderedContext:
        counters = await self.state.counters(session_id)
        if counters.agent_id not in (None, agent_id):
            raise Conflict(f"session {session_id!r} belongs to agent {counters.agent_id!r}, not {agent_id!r}")
        shards = [s for s in await self.list_shards(agent_id) if s.active]
        spoken = await self.state.session_users(session_id)
        users = [user_id] + [u for u in spoken if u != user_id]
        # Only the block of a known session and speaker is cached: a read must not write for ids a caller guesses.
        cacheable = counters.agent_id == agent_id and user_id in spoken
        namespaces = [
            Namespace.session(session_id),
            *(Namespace.user(agent_id, u) for u in users),
            *(Namespace.shard(agent_id, s.shard_id) for s in shards),
        ]
        dependencies = [f"agent:{agent_id}", *map(str, namespaces)]
        generations = await self.state.generations(dependencies)
        key = hashlib.sha256(json.dumps([agent_id, user_id, session_id, budget, query, dependencies, generations]).encode()).hexdigest()
        if cached := await self.state.cache_get(key):
            return RenderedContext(**{**cached, "source": "cache"})

        sources: set[str] = set()
        token = read_sources.set(sources)
        try:
            inputs, complete, backend_name = await self._context_inputs(agent_id, user_id, session_id, users, shards,
                                                                        query, budget)
        finally:
            read_sources.reset(token)
        rendered = replace(render_context(inputs, budget), source="+".join(sorted(sources)) or backend_name)
        if complete and cacheable:  # never cache a block shrunk by an outage
            await self.state.cache_put(key, _asdict(rendered), self.settings.context_cache_ttl_seconds)
            await self.state.cache_put(f"last:{last_good_key}", _asdict(rendered), LAST_GOOD_TTL_SECONDS)
            self._remember_last_good(last_good_key, rendered)
        elif last := await self.state.cache_get(f"last:{last_good_key}"):
            # Every store that could answer failed: the last complete block beats a smaller one.
            log.warning("memory context for %s/%s/%s: stores failing, serving the last good block",
                        agent_id, user_id, session_id)
            return RenderedContext(**{**last, "source": "last-good"})
        return rendered

    def _remember_last_good(self, key: str, rendered: RenderedContext) -> None:
        self._last_good[key] = rendered
        self._last_good.move_to_end(key)
        while len(self._last_good) > LAST_GOOD_IN_PROCESS:
            self._last_good.popitem(last=False)

    async def _context_inputs(
        self, agent_id: str, user_id: str, session_id: str, users: list[str], shards: list[Shard],
        query: str | None, budget: int,
    ) -> tuple[ContextInputs, bool, str]:
        """What the block shows, whether every read succeeded, and the backend read."""
        s = self.settings
        try:
            backend_name, backend = await self.backend_for(agent_id)
        except BackendUnavailable as exc:
            log.warning("memory context for agent %s without memories: %s", agent_id, exc)
            return ContextInputs(), False, "none"

        async def read(namespace: Namespace, kinds: list[MemoryKind], limit: int) -> list[Memory] | None:
            try:
                return await backend.recent(agent_id, namespace, kinds, limit)
            except Exception as exc:  # an outage shrinks the block instead of failing the prompt
                log.warning("memory context: reading %s failed: %s", namespace, exc)
                return None

        async def read_merged(namespace: Namespace, kind: MemoryKind, limit: int) -> tuple[str | None, list[Memory]] | None:
            """The consolidated memory and the items not merged into it yet."""
            items, latest = await asyncio.gather(read(namespace, [kind], limit), read(namespace, [MemoryKind.CONSOLIDATED], 1))
            if items is None or latest is None:
                return None
            if not latest:
                return None, items
            pending = set(await self.state.consolidation_pending(str(namespace)))
            return latest[-1].content, [m for m in items if m.id in pending]

        reads = [read(Namespace.session(session_id), [MemoryKind.EPISODE], s.context_recent_episodes)]
        reads += [read_merged(Namespace.user(agent_id, u), MemoryKind.DIRECTIVE, s.context_directives_per_user) for u in users]
        for shard in shards:
            ns = Namespace.shard(agent_id, shard.shard_id)
            reads.append(read(ns, [MemoryKind.FACT], s.context_facts_per_shard))
            reads.append(read_merged(ns, MemoryKind.SUGGESTION, s.context_suggestions_per_shard))
        results = await asyncio.gather(*reads)
        complete = all(r is not None for r in results)
        episodes = results[0] or []
        user_reads = [r or (None, []) for r in results[1 : 1 + len(users)]]
        shard_reads = results[1 + len(users) :]
        shard_contexts = []
        for i, shard in enumerate(shards):
            consolidated, suggestions = shard_reads[2 * i + 1] or (None, [])
            shard_contexts.append(ShardContext(shard_id=shard.shard_id, name=shard.name, facts=shard_reads[2 * i] or [],
                                               suggestions=suggestions, consolidated=consolidated))
        inputs = ContextInputs(
            shards=shard_contexts,
            users=[UserContext(user_id=u, directives=d, consolidated=c) for u, (c, d) in zip(users, user_reads)],
            episodes=episodes,
        )
        relevant, relevant_complete = await self._relevant(agent_id, user_id, session_id, shards, backend, inputs,
                                                           query, budget)
        return replace(inputs, relevant=relevant), complete and relevant_complete, backend_name

    async def _relevant(self, agent_id: str, user_id: str, session_id: str, shards: list[Shard],
                        backend: MemoryBackend, shown: ContextInputs, query: str | None,
                        budget: int) -> tuple[list[RelevantItem], bool]:
        """The block's query-relevant memories, shaped: the best in full, then snippets, then references.

        How many of each: the CONTEXT_RELEVANT_* settings per 4,000 characters of budget,
        so a larger budget shows proportionally more (never fewer than the settings say).

        The scope is what this user may see: the session, the user's memory and every
        session they spoke in, the active shards and the agent's own namespace. Memories
        the block already shows elsewhere are left out. Without a query, the session's
        latest user message is the query (and is itself left out).
        """
        s = self.settings
        scale = max(1.0, budget / RELEVANT_COUNTS_PER_CHARS)
        wanted = min(round(s.context_relevant_items * scale), s.search_max_top_k)
        full = round(s.context_relevant_full * scale)
        snippets = round(s.context_relevant_snippets * scale)
        if wanted <= 0:
            return [], True
        exclude: set[str] = {m.id for m in shown.episodes}
        exclude |= {m.id for u in shown.users for m in u.directives}
        exclude |= {m.id for sh in shown.shards for m in (*sh.facts, *sh.suggestions)}
        try:
            if query is None:
                latest = [m for m in await backend.recent(agent_id, Namespace.session(session_id), [MemoryKind.MESSAGE], 20)
                          if m.metadata.role in (None, "user")]
                if not latest:
                    return [], True
                query, exclude = latest[-1].content[: s.search_max_query_chars], exclude | {latest[-1].id}
            namespaces = list(dict.fromkeys([
                Namespace.session(session_id), *await self.retriever.user_namespaces(agent_id, user_id),
                *(Namespace.shard(agent_id, sh.shard_id) for sh in shards), Namespace.agent(agent_id)]))
            request = SearchRequest(query=query, top_k=min(wanted + len(exclude), s.search_max_top_k))
            result = await self.retriever.search(agent_id, backend, request, namespaces=namespaces, resolve_scope=False)
        except MemoryServiceError:
            raise
        except Exception as exc:  # an outage shrinks the block instead of failing the prompt
            log.warning("memory context: searching for %r failed: %s", query[:80] if query else None, exc)
            return [], False
        hits = [h for h in result.results if h.id not in exclude][:wanted]
        terms = query_terms(query)
        items = []
        for rank, h in enumerate(hits):
            text = h.content
            if rank >= full + snippets:
                text = snippet(text, terms, s.context_reference_chars)
            elif rank >= full:
                text = snippet(text, terms, s.context_snippet_chars)
            items.append(RelevantItem(kind=h.kind, valid_at=h.valid_at, text=text))
        return items, True

    async def health(self) -> dict:
        try:
            state_ok = await self.state.ping()
            state = {"ok": state_ok}
        except Exception as exc:
            state = {"ok": False, "error": str(exc)}
        backends = await self.registry.health()
        try:
            queue = {"ok": await self.queue.ping()}
        except Exception as exc:
            queue = {"ok": False, "error": str(exc)}
        return {
            "ok": state["ok"] and queue["ok"] and all(b.get("ok") for b in backends.values()),
            "state": state,
            "queue": queue,
            "backends": backends,
            "default_backend": self.settings.default_memory_backend,
        }


def _asdict(rendered: RenderedContext) -> dict:
    return {f: getattr(rendered, f) for f in rendered.__dataclass_fields__}
