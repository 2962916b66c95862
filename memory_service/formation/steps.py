"""Forming memories from exactly one claimed window — the steps of the window's life.

A window (memory_service.formation.window) moves claimed → extracted → written → completed → gone,
each step a compare-and-set in Redis. ``form_window`` runs whatever steps are left, so a
retry after any failure resumes where the last try stopped:

- claimed: read exactly the claimed messages, make ONE extractor call, and store the
  extraction (the memories with their ids) in the window before writing anything;
- extracted: write the stored memories (one idempotent statement per agent graph);
- written: complete the window (pending set, cursor, consolidation queue, metrics);
- completed: the post-completion work (trims, consolidation triggers), then forget it.

Where an item goes: a directive and a personal fact to its user's namespace, a fact or
suggestion to its shard, unless ``PersonalGuard`` finds it is about a person: shards are
shared by every user of the agent, so such an item goes to that person's namespace
(memory_service.formation.personal says how it is judged). The same rule holds for the
entities and facts an LLM puts in a shard (``PersonalGuard.graph``).

The knowledge graph's share: an extractor that states it (the LLM one) is first shown what
the graph knows of the window (memory_service.formation.known_graph, no model); its
entities, facts and the ids of the known facts it supersedes are stored with the
extraction. Otherwise the offline ``extract_graph`` reads the window.

Ids are derived from the window and from the stored extraction's content, and every try
after the first reads the stored extraction, so memories from two extractions of one
window can never both be stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from memory_service.access.audit import AuditLog
from memory_service.backends.base import MemoryBackend
from memory_service.domain.errors import NotSupported
from memory_service.domain.expiry import ExpiryPolicy, sources_end
from memory_service.domain.graph import ExtractedEntity, ExtractedFact, normalise_name
from memory_service.domain.models import Memory, MemoryKind, Provenance, Role, Shard, count_kinds
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.events.log import Cause, EventLog
from memory_service.formation import graph_update, resolution
from memory_service.formation.budgets import BudgetWait
from memory_service.formation.entities import extract_graph
from memory_service.formation.extractor import (
    ExtractedItem,
    Extraction,
    ExtractionUsage,
    Extractor,
    GraphExtractor,
    Window,
    WindowMessage,
)
from memory_service.formation.known_graph import known_graph
from memory_service.formation.personal import is_personal, personal_item
from memory_service.formation.rule_extractor import split_sentences
from memory_service.formation.window import Claim, StoredExtraction, WindowState, WindowStore
from memory_service.schemas.events import EventType
from memory_service.schemas.formation import FormationSummary

log = logging.getLogger(__name__)

_ID_NAMESPACE = uuid.UUID("6f1d7c1e-8a53-4d0b-9a51-2f0c1f2b7a10")


def message_memory_id(session_id: str, message_id: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"message\x1f{session_id}\x1f{message_id}"))


def _formed_id(window_key: str, namespace: str, kind: MemoryKind, index: int) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{window_key}\x1f{namespace}\x1f{kind.value}\x1f{index}"))


@dataclass(slots=True)
class FormationResult:
    session_id: str
    window: int | None = None
    message_ids: list[str] = field(default_factory=list)
    memories: list[Memory] = field(default_factory=list)
    written: int = 0
    extractor: str = ""
    usage: ExtractionUsage | None = None
    already_formed: bool = False  # the window was finished before (by an earlier or a racing run)
    graph: graph_update.GraphChanges | None = None  # what the write step changed in the knowledge graph
    fallback: str | None = None  # why the offline extractor formed it: an LLM budget was spent
    waiting: str | None = None  # why it was not formed yet: an LLM budget was spent (``when_spent: wait``)

    @property
    def formed(self) -> bool:
        return bool(self.message_ids) and not self.already_formed

    def counts(self) -> dict[str, int]:
        return count_kinds(self.memories)

    def summary(self) -> FormationSummary:
        """What the job did, as the job returns it and the API shows it."""
        return FormationSummary(session_id=self.session_id, window=self.window, formed=self.formed,
                                message_ids=self.message_ids if self.formed else [],
                                memories=self.counts() if self.formed else {}, written=self.written,
                                extractor=self.extractor, usage=asdict(self.usage) if self.usage else None,
                                llm_budget=self.waiting or self.fallback, waiting=self.waiting is not None,
                                reason="formed" if self.formed else
                                "waiting for the LLM budget" if self.waiting else "window already formed")


# Kinds that are merged into a consolidated memory once enough of them are pending.
CONSOLIDATED_KINDS = (MemoryKind.DIRECTIVE, MemoryKind.SUGGESTION)


async def form_window(
    *,
    claim: Claim,
    agent_id: str,
    backend: MemoryBackend,
    windows: WindowStore,
    extractor: Extractor,
    shards: list[Shard],
    embedder: Embedder | None = None,
    post_process: Callable[[FormationResult], Awaitable[None]] | None = None,
    audit: AuditLog | None = None,
    events: EventLog | None = None,
    name_similarity: float = resolution.DEFAULT_THRESHOLD,
    resolve_candidates: int = resolution.DEFAULT_MAX_CANDIDATES,
    expiry: ExpiryPolicy | None = None,
) -> FormationResult:
    """Run the steps the window ``claim`` has left. Safe to run again, and beside itself.

    ``audit``: where each fact the window closes is logged (``fact.invalidate``, actor
    ``formation``), so that it can be found and undone (``MemoryService.restore_fact``),
    and each name merged into a stored entity (``entity.merge``, undone by
    ``MemoryService.split_entity``). ``embedder`` also embeds the entities' names, which
    resolution compares (``name_similarity``, ``resolve_candidates``: graph_update.resolve).

    ``events``: where the memories written are announced (``formed``, naming the session and
    window) and each fact closed (``superseded``): after the store took them and before the
    window is marked written, so a retried write step announces them again (at least once).
    ``expiry``: the agent's times to live; a memory the window forms expires that long after
    its extraction (stored with it, so every try writes the same time; docs/expiry.md).

    ``post_process`` is the post-completion work; it runs on every run that finds the
    window completed, so it must be idempotent.
    """
    started = time.perf_counter()
    session_id = claim.session_id
    result = FormationResult(session_id=session_id, window=claim.window, extractor=extractor.name)
    record = await windows.load(session_id)
    if record is None or record.claim.window != claim.window:
        result.already_formed = True
        return result
    claim = record.claim  # as stored: the snapshot every try reads

    if record.state is WindowState.CLAIMED:
        try:
            extraction = await extract_claim(claim, agent_id, backend, extractor, shards, expiry)
        except BudgetWait as wait:  # the window stays claimed: tried again when the budget allows
            result.waiting = wait.reason
            return result
        record = await windows.store_extraction(record, extraction)
        if record is None:
            result.already_formed = True
            return result
    stored = record.extraction
    if stored is None:  # the extracted state is stored with its extraction, in one step
        raise RuntimeError(f"session {session_id!r}: window {claim.window} is {record.state.value} "
                           "but holds no extraction")
    result.memories = list(stored.memories)
    result.usage = stored.usage
    result.extractor, result.fallback = stored.extractor or result.extractor, stored.fallback
    result.message_ids = claim.message_ids

    if record.state is WindowState.EXTRACTED:
        await embed_memories(embedder, result.memories)
        written = await backend.write(result.memories)
        cause = Cause(session_id=session_id, window=claim.window)
        result.graph = await write_graph(agent_id, backend, claim, stored, audit, embedder, name_similarity,
                                          resolve_candidates, events, cause)
        if events is not None:
            await events.emit_memories(agent_id, EventType.FORMED, result.memories, cause)
        record = await windows.mark_written(record, written)
        if record is None:
            result.already_formed = True
            return result
    result.written = record.written

    if record.state is WindowState.WRITTEN:
        consolidate = [(m.namespace, m.id) for m in result.memories if m.kind in CONSOLIDATED_KINDS]
        metrics = {"formations": 1, "formed_messages": len(claim.messages), "formed_memories": result.written,
                   "formation_seconds": time.perf_counter() - started}
        if usage := stored.usage:
            metrics.update(llm_calls=usage.calls, llm_attempts=usage.attempts, llm_prompt_tokens=usage.prompt_tokens,
                           llm_completion_tokens=usage.completion_tokens, llm_seconds=usage.latency_seconds)
        if stored.fallback:
            metrics["budget_offline_formations"] = 1
        # The namespaces whose cached blocks the window changes: its memories', and those of
        # the entities and facts it wrote (the block shows their facts, memory_service/recall).
        changed = [m.namespace for m in result.memories] + [e.namespace for e in stored.entities]
        if await windows.complete(record, consolidate, changed, metrics) >= 0:
            log.info("formed session %s window %d (%d messages): %s (%d new)",
                     session_id, claim.window, len(claim.messages), result.counts(), result.written)
            # Kept for the browse API: which window and extractor formed a memory (by the
            # sequences of its messages). Only the run that completed the window writes it.
            sequences = [seq for _, seq in claim.messages]
            if sequences:
                tokens = stored.usage.prompt_tokens + stored.usage.completion_tokens if stored.usage else 0
                await windows.state.record_formed_window(session_id, {
                    "window": claim.window, "extractor": result.extractor, "first_sequence": min(sequences),
                    "last_sequence": max(sequences), "messages": len(sequences), "memories": len(result.memories),
                    "formed_at": round(time.time(), 3), "llm_tokens": tokens, "llm_budget": stored.fallback,
                    "memory_ids": [m.id for m in result.memories]},
                    max(sequences))
        record = await windows.load(session_id)  # completed, by this run or a racing one
        if record is None or record.claim.window != claim.window:
            result.already_formed = True
            return result

    record = await windows.apply_effects(record)  # also on a retry that finds the window completed
    if post_process is not None:
        await post_process(result)
    await windows.finish(record)
    return result


async def write_graph(agent_id: str, backend: MemoryBackend, claim: Claim, stored: StoredExtraction,
                       audit: AuditLog | None = None, embedder: Embedder | None = None,
                       name_similarity: float = resolution.DEFAULT_THRESHOLD,
                       resolve_candidates: int = resolution.DEFAULT_MAX_CANDIDATES, events: EventLog | None = None,
                       cause: Cause = Cause()) -> graph_update.GraphChanges | None:
    """The window's entities, facts and mentions into the agent's graph (after its memories,
    which the mentions link from), and the facts it supersedes closed; None on a store
    without a graph (Mongo)."""
    if not stored.entities and not stored.supersedes:
        return None
    observed = stored.observed_at or max((m.valid_at for m in stored.memories), default=None)
    try:
        return await graph_update.apply(
            backend, agent_id, stored.entities, stored.facts, stored.mentions,
            memory_ids=[m.id for m in stored.memories], ends_at=sources_end(m.expires_at for m in stored.memories),
            observed_at=observed, audit=audit, embedder=embedder,
            threshold=name_similarity, max_candidates=resolve_candidates, supersedes=stored.supersedes,
            events=events, cause=cause)
    except NotSupported:
        return None


async def extract_claim(claim: Claim, agent_id: str, backend: MemoryBackend, extractor: Extractor,
                   shards: list[Shard], expiry: ExpiryPolicy | None = None) -> StoredExtraction:
    """The memories ONE extractor call makes of exactly the claimed messages."""
    session_id = claim.session_id
    session_ns = Namespace.session(session_id)
    ids_by_uuid = {message_memory_id(session_id, mid): mid for mid in claim.message_ids}
    stored = {ids_by_uuid[m.id]: m for m in await backend.get(agent_id, session_ns, list(ids_by_uuid))}
    if missing := [mid for mid in claim.message_ids if mid not in stored]:
        # A message deleted after it was recorded and before its window was formed is left
        # out: forming it would bring its words back in an episode. One that is not stored at
        # all is a fault of the store.
        found = await backend.find(agent_id, [message_memory_id(session_id, mid) for mid in missing])
        deleted = {m.id for m in found if m.deleted_at is not None or m.expired()}
        if lost := [mid for mid in missing if message_memory_id(session_id, mid) not in deleted]:
            raise RuntimeError(f"session {session_id!r}: messages of window {claim.window} missing from the store: "
                               f"{lost[:5]}")
    roles = {mid: role for mid, m in stored.items() if (role := m.metadata.role) is not None}
    if roleless := [mid for mid in stored if mid not in roles]:  # every recorded message has one
        raise RuntimeError(f"session {session_id!r}: messages of window {claim.window} stored without a role: "
                           f"{roleless[:5]}")
    messages = tuple(
        WindowMessage(
            message_id=mid,
            sequence=seq,
            role=roles[mid],
            user_id=stored[mid].metadata.user_id or "",
            content=stored[mid].content,
            created_at=stored[mid].valid_at,
        )
        for mid, seq in claim.messages if mid in stored
    )
    window = Window(agent_id=agent_id, session_id=session_id, messages=messages, shards=tuple(s for s in shards if s.active))
    if isinstance(extractor, GraphExtractor):  # shown what the graph knows, to say what the window supersedes
        window = replace(window, known=await known_graph(backend, window, extractor.known_limits))
    # A window whose every message was deleted forms nothing (no extractor call, no episode).
    extraction = await extractor.extract(window) if messages else Extraction()
    # The ids name the window AND this extraction: two extractions of one window (an LLM
    # answers differently each time) never share an id, whatever positions their items hold.
    window_digest = hashlib.sha256("\x1f".join(claim.message_ids).encode()).hexdigest()[:16]
    content_digest = hashlib.sha256(
        json.dumps([extraction.episode, [asdict(item) for item in extraction.items]], default=str).encode()
    ).hexdigest()[:16]
    window_key = f"{session_id}\x1f{claim.window}\x1f{window_digest}\x1f{content_digest}"
    memories = tuple(extraction_memories(window, window_key, extraction))
    if expiry is not None:  # each memory without an end takes its kind's or shard's time to live
        extracted_at = datetime.now(UTC)
        for memory in memories:
            memory.expires_at = memory.expires_at or expiry.expires_at(memory.kind.value, memory.namespace,
                                                                       extracted_at)
    # The knowledge graph's share of the window: the extractor's (checked like its shard
    # items), else read offline. Stored with the extraction, so every try of the write step
    # writes the same graph.
    supersedes: list[str] = []
    if extraction.graph is None:
        entities, facts = extract_graph(window)
    else:
        entities, facts = PersonalGuard(window).graph(extraction.graph.entities, extraction.graph.facts)
        supersedes = extraction.graph.supersedes
    texts = {message_memory_id(session_id, m.message_id): m.content for m in messages}
    texts |= {m.id: m.content for m in memories}
    return StoredExtraction(memories, extraction.usage, tuple(entities), tuple(facts),
                            tuple(graph_update.mentions(texts, entities)), tuple(supersedes),
                            max(m.created_at for m in messages) if messages else None,
                            extraction.extractor, extraction.fallback)


def extraction_memories(window: Window, window_key: str, extraction: Extraction) -> list[Memory]:
    """The memories an extraction of ``window`` makes, each in the namespace it belongs to."""
    users = sorted({m.user_id for m in window.messages if m.role == "user"})
    all_ids = [m.message_id for m in window.messages]
    by_id = {m.message_id: m for m in window.messages}
    memories: list[Memory] = []

    def add(kind: MemoryKind, namespace: Namespace, content: str, message_ids: Sequence[str], user_id: str | None) -> None:
        index = sum(1 for m in memories if m.kind is kind and m.namespace == str(namespace))
        # An item is as old as the latest message it was formed from, so that the items of
        # one window keep the conversation's order.
        sources = [by_id[mid] for mid in message_ids if mid in by_id] or [window.messages[-1]]
        latest = max(sources, key=lambda m: (m.created_at, m.sequence))
        memories.append(
            Memory(
                id=_formed_id(window_key, str(namespace), kind, index),
                kind=kind,
                namespace=str(namespace),
                content=content,
                metadata=Provenance(
                    agent_id=window.agent_id,
                    user_id=user_id,
                    user_ids=users,
                    session_id=window.session_id,
                    message_ids=list(message_ids),
                    sequence=latest.sequence,
                ),
                valid_at=latest.created_at,
            )
        )

    if extraction.episode:
        add(MemoryKind.EPISODE, Namespace.session(window.session_id), extraction.episode, all_ids, users[0] if len(users) == 1 else None)
    shard_ids = {s.shard_id for s in window.shards}
    guard = PersonalGuard(window)
    personal: set[tuple[str, str]] = set()  # (owner, content): one personal fact, though named for two shards

    def add_personal(owner: str, item: ExtractedItem) -> None:
        if (owner, item.content.casefold()) not in personal:
            personal.add((owner, item.content.casefold()))
            add(MemoryKind.FACT, Namespace.user(window.agent_id, owner), item.content, item.message_ids, owner)

    for item in extraction.items:
        if item.kind is MemoryKind.DIRECTIVE and item.user_id:
            add(item.kind, Namespace.user(window.agent_id, item.user_id), item.content, item.message_ids, item.user_id)
        elif item.kind is MemoryKind.FACT and item.shard_id is None and item.user_id in users:
            add_personal(item.user_id, item)
        elif item.kind in (MemoryKind.FACT, MemoryKind.SUGGESTION) and item.shard_id in shard_ids:
            if not guard.personal(item):
                add(item.kind, Namespace.shard(window.agent_id, item.shard_id), item.content, item.message_ids, item.user_id)
            elif owner := guard.owner(item):
                log.info("session %s: a %s about a person, extracted for shard %s, kept in its owner's namespace",
                         window.session_id, item.kind.value, item.shard_id)
                add_personal(owner, item)
            else:
                log.info("session %s: dropped a %s about a person with no user to keep it for", window.session_id,
                         item.kind.value)
        else:
            log.warning("dropping an extracted %s of session %s with no valid target (shard %s)", item.kind,
                        window.session_id, item.shard_id)  # never its words
    return memories


class PersonalGuard:
    """Formation's own check that no shard item is about a person, whatever extractor made it.

    An extractor is told to keep personal statements out of shards (the rule extractor
    does, an LLM is asked to); this is the second line: an item judged personal
    (memory_service.formation.personal.personal_item) goes to the namespace of the user it is about
    instead, and is dropped when there is no such user.
    """

    def __init__(self, window: Window) -> None:
        self.window = window
        self.users = sorted({m.user_id for m in window.messages if m.role == Role.USER and m.user_id})
        self.by_id = {m.message_id: m for m in window.messages}
        self.sentences = {m.message_id: split_sentences(m.content) for m in window.messages
                          if m.role in (Role.USER, Role.ASSISTANT)}
        self.personal_sentences = [
            sentence for m in window.messages for sentence in self.sentences.get(m.message_id, ())
            if is_personal(sentence, names=self.users, assistant=m.role == Role.ASSISTANT)
        ]

    def personal(self, item: ExtractedItem) -> bool:
        sources = [(m.user_id, m.role == Role.ASSISTANT, sentence)
                   for mid in item.message_ids if (m := self.by_id.get(mid)) and mid in self.sentences
                   for sentence in self.sentences[mid]]
        return personal_item(item.content, sources=sources, names=self.users,
                             personal_sentences=self.personal_sentences)

    def owner(self, item: ExtractedItem) -> str | None:
        """The user a personal item is about: who said it; for the assistant's words, the one
        user of the window (with two or more, whom "your" means is a guess: None)."""
        if item.user_id in self.users:
            return item.user_id
        return self.users[0] if len(self.users) == 1 else None

    def graph(self, entities: Sequence[ExtractedEntity],
              facts: Sequence[ExtractedFact]) -> tuple[list[ExtractedEntity], list[ExtractedFact]]:
        """An extractor's entities and facts, each in a namespace the window may write to and
        none about a person in a shared one (a shard's, the agent's).

        In a shared namespace: an entity that is a speaker, or whose summary is personal, goes
        to that user's namespace (the window's one user, for a summary), else is dropped; a
        fact naming a speaker, or judged personal as a shard item is, goes to the namespace of
        the speaker it names or of its owner (``owner``), with its two ends, else is dropped.
        A namespace the window does not write to (another user's, an inactive shard's) is
        dropped. Logged without content."""
        agent = self.window.agent_id
        users = {str(Namespace.user(agent, u)): u for u in self.users}
        shared = {str(Namespace.shard(agent, s.shard_id)) for s in self.window.shards if s.active}
        shared.add(str(Namespace.agent(agent)))
        speakers = {normalise_name(u): u for u in self.users}
        given = {(e.namespace, normalise_name(e.name)): e for e in entities}
        kept: dict[tuple[str, str], ExtractedEntity] = {}
        moved = dropped = 0

        def keep(entity: ExtractedEntity, namespace: str) -> None:
            kept.setdefault((namespace, normalise_name(entity.name)), entity.model_copy(update={"namespace": namespace}))

        for entity in entities:
            if entity.namespace in users:
                keep(entity, entity.namespace)
                continue
            if entity.namespace not in shared:
                dropped += 1
                continue
            owner = next((speakers[k] for k in map(normalise_name, (entity.name, *entity.aliases)) if k in speakers), None)
            personal = owner is not None or bool(entity.summary) and is_personal(entity.summary, names=self.users)
            if owner is None and personal and len(self.users) == 1:
                owner = self.users[0]
            if owner is not None:
                keep(entity, str(Namespace.user(agent, owner)))
                moved += 1
            elif personal:
                dropped += 1
            else:
                keep(entity, entity.namespace)

        routed: list[ExtractedFact] = []
        for fact in facts:
            if fact.namespace in users:
                routed.append(fact)
                continue
            if fact.namespace not in shared:
                dropped += 1
                continue
            cited = [m for mid in fact.message_ids if (m := self.by_id.get(mid))]
            said_by = cited[0].user_id if cited and cited[0].role == Role.USER else None
            item = ExtractedItem(MemoryKind.FACT, fact.text, tuple(fact.message_ids), said_by)
            owner = speakers.get(normalise_name(fact.subject)) or speakers.get(normalise_name(fact.object))
            if owner is None and self.personal(item):
                owner = self.owner(item) or ""  # personal with no one to keep it for: ""
            if owner is None:
                routed.append(fact)
                continue
            ends = [given.get((fact.namespace, normalise_name(n))) for n in (fact.subject, fact.object)]
            if not owner or None in ends:
                dropped += 1
                continue
            namespace = str(Namespace.user(agent, owner))
            for end in ends:
                if end is not None:
                    keep(end, namespace)
            routed.append(fact.model_copy(update={"namespace": namespace}))
            moved += 1
        # A fact is kept only with both ends in its namespace (one may have been dropped above).
        kept_facts = [f for f in routed if all((f.namespace, normalise_name(n)) in kept for n in (f.subject, f.object))]
        dropped += len(routed) - len(kept_facts)
        if moved or dropped:
            log.info("session %s: %d extracted graph item(s) about a person moved from a shared namespace to "
                     "their user's, %d dropped", self.window.session_id, moved, dropped)
        return list(kept.values()), kept_facts
