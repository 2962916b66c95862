"""The memory block for one model call: what it shows, cached, and never failing the prompt.

The block is read from the session's episodes, each user's directives, the active shards'
facts and suggestions, and (with a query, or the latest user message, unless it is small
talk: memory_service/domain/smalltalk.py) the most relevant memories in the user's scope but
the session's latest messages the host sends itself (``host_window``), and the knowledge
graph's facts about the entities the query names and about the user
(memory_service/recall/graph_signal.py). Blocks are cached under the generations of everything they
read, so any write to those namespaces invalidates them (memory_service/state/cache.py owns
the cache, its generations and the last good blocks). A store that fails shrinks the block
or serves the last good one.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from memory_service.access.pseudonyms import for_log
from memory_service.access.reach import Reach
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend, RecentRead
from memory_service.config import Settings
from memory_service.domain.bm25 import QUERY_STOPWORDS
from memory_service.domain.errors import BackendUnavailable, InvalidInput, MemoryServiceError, NotSupported
from memory_service.domain.graph import EntityType, Fact, normalise_name, query_names
from memory_service.domain.models import AgentSettings, ContextType, Memory, MemoryKind, Recall, RecallScope, Shard
from memory_service.domain.namespaces import Namespace
from memory_service.domain.smalltalk import is_small_talk
from memory_service.domain.text import stem
from memory_service.embedding.fresh import FreshVectors
from memory_service.recall.graph_signal import QueryGraph, query_graph
from memory_service.recall.render import (
    MIN_BUDGET_CHARS,
    ContextInputs,
    FactItem,
    RelevantItem,
    RenderedContext,
    ShardContext,
    StartupItem,
    UserContext,
    budget_for_model,
    render_context,
)
from memory_service.recall.search import Retriever, Scored, SearchRequest, query_terms
from memory_service.recall.startup import StartupRecords
from memory_service.state.cache import agent_wide, identity
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

# CONTEXT_TOP_K is per this many characters of budget (when neither the agent nor the call sets top_k).
RELEVANT_COUNTS_PER_CHARS = 4_000
# The user's own facts shown without a query match: a few, the newest (render.py gives them a
# low rank and the facts' share of the budget).
OWN_FACTS = 5
# The facts of the query's entities passed to the renderer (it keeps what fits their share).
QUERY_FACTS = 30
# Without a query, the latest user message is looked for among the session's last this many.
LATEST_MESSAGES = 20


class ContextAssembler:
    def __init__(self, settings: Settings, state: StateStore, agents: AgentDirectory, retriever: Retriever,
                 fresh: FreshVectors | None = None):
        self.settings, self.state, self.agents, self.retriever = settings, state, agents, retriever
        self.fresh = fresh or FreshVectors(None)  # the vectors of live sessions' messages, embedded as recorded
        self.cache = state.cache
        self.startup = StartupRecords(settings, state)
        self._counting: set[asyncio.Task[None]] = set()  # blocks' counts on their way to the state store

    async def assemble(
        self, agent_id: str, user_id: str, session_id: str, model: str | None = None,
        query: str | None = None, budget: int | None = None, reach: Reach | None = None,
        as_of: datetime | None = None, context_type: ContextType = ContextType.CHAT, recall: Recall | None = None,
    ) -> RenderedContext:
        """The XML memory block for one model call; it fits the budget.

        ``budget`` (characters) overrides the model's. With a ``query`` the block gains the
        memories most relevant to it; without one, the session's latest user message is the
        query. A store that fails to answer shrinks the block; it never fails the prompt.

        ``reach`` is the caller's (memory_service/access/reach.py; default: all of the agent). A
        session it does not see (another agent's, or one none of a key's users took part
        in) gets exactly the block of an unknown session, and <UserMemory> shows only the
        users it sees. Cached and last-good blocks are kept per reach: a block made for a
        wider key is never served to a narrower one.

        ``as_of``: the block's <KnownFacts> are the facts true then, not the current ones.

        How the relevant memories are picked (threshold, top_k, scope): ``recall`` (this
        call's), over the agent's settings for ``context_type``, over the agent's, over the
        server's CONTEXT_* settings (``effective_recall``).
        """
        reach = reach or Reach(self.state, agent_id)
        if query is not None and len(query) > self.settings.search_max_query_chars:
            raise InvalidInput(f"query is {len(query)} characters long; the limit is {self.settings.search_max_query_chars}")
        if budget is not None and budget < MIN_BUDGET_CHARS:
            raise InvalidInput(f"budget must be at least {MIN_BUDGET_CHARS} characters, got {budget}")
        if budget is None:
            budget = budget_for_model(model, self.settings.context_budget_chars, self.settings.context_model_budgets)
        query = query.strip() if query else None
        as_of = as_of if as_of is None or as_of.tzinfo else as_of.replace(tzinfo=UTC)
        last_good_key = identity(agent_id, user_id, session_id, budget, reach.view)
        # Memory reads stop at the deadline and the block is rendered from what arrived; the
        # whole assembly (state reads, caching) stops at twice it: a hung store never holds
        # the prompt longer than that.
        allowed = self.settings.context_deadline_seconds
        deadline = asyncio.get_running_loop().time() + allowed
        try:
            async with asyncio.timeout_at(deadline + allowed):
                rendered = await self._assemble(agent_id, user_id, session_id, budget, last_good_key, query, deadline,
                                                reach, as_of, context_type, recall or Recall())
        except MemoryServiceError:
            raise  # the caller's mistake (e.g. a bad id), not an outage
        except Exception as exc:
            # The state store is down too: the last good block this process served, if any.
            last_good = self.cache.last_good_in_process(last_good_key)
            log.warning("memory context for %s/%s/%s from %s: state store failed: %s", agent_id,
                        for_log(agent_id, user_id), session_id,
                        "this process's last good block" if last_good else "nothing",
                        f"no answer within {2 * allowed:g}s" if isinstance(exc, TimeoutError) else exc)
            rendered = RenderedContext(**{**last_good, "source": "last-good"}) if last_good else replace(
                render_context(ContextInputs(), budget), source="none")
        # Counted after the answer: the prompt does not wait for a counter.
        counting = asyncio.create_task(self._count(rendered.source))
        self._counting.add(counting)
        counting.add_done_callback(self._counting.discard)
        return rendered

    async def _count(self, source: str) -> None:
        with suppress(Exception):
            async with asyncio.timeout(self.settings.context_deadline_seconds):
                await self.state.add_metrics(**{f"context_from_{source.replace('+', '_').replace('-', '_')}": 1})

    async def close(self) -> None:
        """Let the counts and the cached copies of the blocks already answered reach the state store."""
        await asyncio.gather(*self._counting, self.cache.flush(), return_exceptions=True)

    def effective_recall(self, agent: AgentSettings, context_type: ContextType, call: Recall, budget: int) -> Recall:
        """Every recall setting, from the narrowest level that sets it: the call, the agent's
        for the context type, the agent's, the server's (CONTEXT_TOP_K scaled by the budget)."""
        s = self.settings
        server = Recall(min_score=s.context_min_score, min_similarity=s.context_min_similarity,
                        top_k=min(round(s.context_top_k * max(1.0, budget / RELEVANT_COUNTS_PER_CHARS)), s.search_max_top_k),
                        scope=RecallScope(s.context_scope), host_window=s.context_host_window)
        return call.over(agent.context.types.get(context_type, Recall()).over(agent.context.over(server)))

    async def _assemble(self, agent_id: str, user_id: str, session_id: str, budget: int, last_good_key: str,
                        query: str | None, deadline: float, reach: Reach, as_of: datetime | None,
                        context_type: ContextType, call: Recall) -> RenderedContext:
        # A session the caller does not see is shown as one nobody recorded in: no session
        # content, no other user's memory (nothing tells it from an unknown session).
        # The reads the cache key needs, in one round trip (the speakers are read and dropped
        # for a session the caller does not see).
        state = await self.state.block_state(agent_id, session_id)
        seen = await reach.sees_owned_session(session_id, state.owner)
        agent = state.agent or AgentSettings()
        recall = self.effective_recall(agent, context_type, call, budget)
        shards = [Shard.of(agent_id, sid, s) for sid, s in state.shards.items() if s.active]
        spoken = state.speakers if seen else []
        users = [user_id] + [u for u in spoken if u != user_id and reach.sees_user(u)]
        # Only the block of a known session and speaker is cached: a read must not write for ids a caller guesses.
        cacheable = seen and user_id in spoken
        if cacheable and query is None:  # a session loop: its next user message is embedded as it is recorded
            self.fresh.block_asked(session_id)
        namespaces = [
            *([Namespace.session(session_id)] if seen else []),
            *(Namespace.user(agent_id, u) for u in users),
            *(Namespace.shard(agent_id, s.shard_id) for s in shards),
        ]
        dependencies = [agent_wide(agent_id), *map(str, namespaces)]
        # Kept per reach too: a block made for a wider key is never served to a narrower one.
        found = await self.cache.lookup([agent_id, user_id, session_id, budget, query, reach.view,
                                         as_of.isoformat() if as_of else None, recall.model_dump_json()], dependencies)
        if found.block is not None:
            return RenderedContext(**{**found.block, "source": "cache"})

        sources: set[str] = set()  # the stores that served the reads (each memory says which)
        (inputs, complete, backend_name, below), startup = await asyncio.gather(
            self._context_inputs(agent_id, agent, user_id, session_id if seen else None, users, shards, query,
                                 deadline, sources, recall, as_of),
            self.startup.list(agent_id))
        inputs = replace(inputs, startup=[StartupItem(r.priority.rank, r.title, r.content) for r in startup])
        rendered = render_context(inputs, budget)
        rendered = replace(rendered, source="+".join(sorted(sources)) or backend_name,
                           left_out={"below_threshold": below, **rendered.left_out},
                           recall=recall.model_dump(mode="json"))
        if complete and cacheable:  # never cache a block shrunk by an outage; stored after the answer
            self.cache.keep(found, last_good_key, _asdict(rendered),
                            cache_seconds(inputs, self.settings.context_cache_ttl_seconds),
                            agent_id, self.settings.context_deadline_seconds)
        elif not complete and (last := await self.cache.last_good(last_good_key)):
            # Every store that could answer failed: the last complete block beats a smaller one.
            log.warning("memory context for %s/%s/%s: stores failing, serving the last good block",
                        agent_id, for_log(agent_id, user_id), session_id)
            return RenderedContext(**{**last, "source": "last-good"})
        return rendered

    async def _context_inputs(
        self, agent_id: str, agent: AgentSettings, user_id: str, session_id: str | None, users: list[str],
        shards: list[Shard], query: str | None, deadline: float, sources: set[str], recall: Recall,
        as_of: datetime | None = None,
    ) -> tuple[ContextInputs, bool, str, int]:
        """What the block shows, whether every read succeeded, the backend read, and how many
        relevant candidates fell below the thresholds.
        ``session_id`` None: a session the caller does not see, nothing of it is read."""
        s = self.settings
        try:
            backend_name, backend = await self.agents.backend_for(agent_id, agent)
        except BackendUnavailable as exc:
            log.warning("memory context for agent %s without memories: %s", agent_id, exc)
            return ContextInputs(), False, "none", 0

        # Every recent read of the block in one call (one round trip on the graph): the
        # session's episodes, each user's directives and consolidated memory, each shard's
        # facts, suggestions and consolidated memory, and the session's latest messages:
        # without a query the latest user message among them is the query, and the host's
        # window of them (``recall.host_window``) is left out of the relevant memories.
        reads: list[RecentRead] = []

        def ask(namespace: Namespace, kind: MemoryKind, limit: int) -> int:
            reads.append(RecentRead(namespace, [kind], limit))
            return len(reads) - 1

        def ask_merged(namespace: Namespace, kind: MemoryKind, limit: int) -> tuple[int, int]:
            return ask(namespace, kind, limit), ask(namespace, MemoryKind.CONSOLIDATED, 1)

        shard_ns = [Namespace.shard(agent_id, shard.shard_id) for shard in shards]
        episodes_at = ask(Namespace.session(session_id), MemoryKind.EPISODE, s.context_recent_episodes) \
            if session_id else None
        users_at = [ask_merged(Namespace.user(agent_id, u), MemoryKind.DIRECTIVE, s.context_directives_per_user)
                    for u in users]
        facts_at = [ask(ns, MemoryKind.FACT, s.context_facts_per_shard) for ns in shard_ns]
        suggestions_at = [ask_merged(ns, MemoryKind.SUGGESTION, s.context_suggestions_per_shard) for ns in shard_ns]
        shown = len(reads)
        window = recall.host_window or 0
        latest = max(LATEST_MESSAGES if query is None else 0, window)
        messages_at = ask(Namespace.session(session_id), MemoryKind.MESSAGE, latest) if latest and session_id else None

        async def read_recent() -> list[list[Memory]] | None:
            try:
                async with asyncio.timeout_at(deadline):
                    found = await backend.recent_many(agent_id, reads)
            except Exception as exc:  # an outage or the deadline shrinks the block instead of failing the prompt
                log.warning("memory context: reading agent %s's recent memories failed: %s", agent_id,
                            "past the deadline" if isinstance(exc, TimeoutError) else exc)
                return None
            sources.update(m.served_by for memories in found[:shown] for m in memories if m.served_by)
            return found

        recent = asyncio.ensure_future(read_recent())

        async def latest_messages() -> list[Memory] | None:
            found = await recent
            return None if found is None or messages_at is None else found[messages_at]

        async def user_scope() -> list[Namespace] | None:
            """The user's namespaces for the search (None: the read failed)."""
            if recall.scope is RecallScope.SESSION:
                return []
            try:
                async with asyncio.timeout_at(deadline):
                    return await self.retriever.user_namespaces(agent_id, user_id)
            except Exception as exc:  # the search is left out, as when it fails
                log.warning("memory context: reading agent %s's user sessions failed: %s", agent_id,
                            "past the deadline" if isinstance(exc, TimeoutError) else exc)
                return None

        async def sections() -> tuple[list[list[Memory]] | None, list[tuple[str | None, list[Memory]]],
                                      list[tuple[str | None, list[Memory]]]]:
            """The recent reads, and each user's and shard's items against their consolidated
            memory: the latest consolidation's text, and the items not merged into it yet (the
            queues of the consolidated namespaces read in one round trip)."""
            found = await recent
            if found is None:
                return None, [(None, []) for _ in users_at], [(None, []) for _ in suggestions_at]
            consolidated = [at for at in (*users_at, *suggestions_at) if found[at[1]]]
            queues = await self.state.consolidation_pending_many([str(reads[at[1]].namespace) for at in consolidated])
            pending = {at: set(queue) for at, queue in zip(consolidated, queues, strict=True)}

            def merged(at: tuple[int, int]) -> tuple[str | None, list[Memory]]:
                items, latest = found[at[0]], found[at[1]]
                if not latest:
                    return None, items
                return latest[-1].content, [m for m in items if m.id in pending[at]]

            return found, [merged(at) for at in users_at], [merged(at) for at in suggestions_at]

        async def showing() -> tuple[ContextInputs, bool]:
            """What the block shows besides the relevant memories and the facts, and whether
            its reads succeeded."""
            found, user_reads, suggestion_reads = await sections()
            episodes = found[episodes_at] if found is not None and episodes_at is not None else []
            shard_contexts = [
                ShardContext(shard_id=shard.shard_id, name=shard.name, facts=found[at] if found is not None else [],
                             suggestions=suggestions, consolidated=consolidated)
                for shard, at, (consolidated, suggestions) in zip(shards, facts_at, suggestion_reads, strict=True)]
            inputs = ContextInputs(
                shards=shard_contexts,
                users=[UserContext(user_id=u, directives=d, consolidated=c) for u, (c, d) in zip(users, user_reads)],
                episodes=episodes,
            )
            return inputs, found is not None

        async def facts() -> tuple[list[FactItem], QueryGraph | None, bool]:
            asked = await question
            if asked.failed:
                return [], None, False
            return await self._facts(agent_id, user_id, shards, backend, asked.query, as_of, deadline)

        # Beside the recent reads: the block's question (the latest user message when there
        # is no query), then at once the known facts and the search, which waits for the
        # facts' entities only at its graph signal, after the scope's scan.
        question = asyncio.ensure_future(self._question(query, latest_messages if messages_at is not None else None))

        async def host_window() -> set[str]:
            """The ids of the messages the host sends the model itself: the session's latest ``window``."""
            said = await latest_messages() if window else None
            return {m.id for m in said[-window:]} if said else set()

        tasks = [recent, question, window_read := asyncio.ensure_future(host_window()),
                 facts_read := asyncio.ensure_future(facts()),
                 shown_read := asyncio.ensure_future(showing()), scope := asyncio.ensure_future(user_scope())]
        try:
            (inputs, complete), asked, (fact_items, _, facts_complete), (relevant, relevant_complete, below) = \
                await asyncio.gather(shown_read, question, facts_read, self._relevant(
                    agent_id, session_id, shards, backend, shown_read, question, facts_read, scope, deadline,
                    sources, recall, window_read, as_of))
        finally:
            for task in tasks:
                task.cancel()  # never left running when the gather failed
        return (replace(inputs, relevant=relevant, facts=fact_items, facts_as_of=as_of, asked=asked.query is not None),
                complete and relevant_complete and facts_complete, backend_name, below)

    async def _question(self, query: str | None, said: Callable[[], Awaitable[list[Memory] | None]] | None) -> _Question:
        """The block's query: ``query``, or without one the latest user message of what the
        session ``said`` (whose stored embedding the search reuses). Small talk is no query
        (memory_service/domain/smalltalk.py): searching "Thanks, bye!" finds the other goodbyes."""
        like, reusable = None, False
        if query is not None and is_small_talk(query):
            return _Question(None, None)
        if query is None:
            messages = await said() if said is not None else []
            if messages is None:  # the read failed: the block shows no relevant memories
                return _Question(None, None, failed=True)
            latest = [m for m in messages if m.metadata.role in (None, "user")]
            if latest and is_small_talk(latest[-1].content):
                return _Question(None, None)
            if latest:
                message, embedder = latest[-1], self.retriever.embedder
                query, like = message.content[: self.settings.search_max_query_chars], message.id
                # A message recorded a moment before has no vector yet (the worker embeds it);
                # in a live session this process may be embedding it already (embedding/fresh.py).
                reusable = embedder is not None and message.embedding_model == embedder.name
                if not reusable:
                    return _Question(query, like, fresh=self.fresh.vector(message.id))
        return _Question(query, like, reusable=reusable)

    async def _relevant(self, agent_id: str, session_id: str | None, shards: list[Shard], backend: MemoryBackend,
                        shown: Awaitable[tuple[ContextInputs, bool]], question: Awaitable[_Question],
                        facts: Awaitable[tuple[list[FactItem], QueryGraph | None, bool]],
                        user_scope: Awaitable[list[Namespace] | None], deadline: float,
                        sources: set[str], recall: Recall,
                        host_window: Awaitable[set[str]],
                        as_of: datetime | None = None) -> tuple[list[RelevantItem], bool, int]:
        """The block's query-relevant memories, best first, each with its score (the renderer
        gives each its share of the budget by it); whether every read succeeded; and how many
        candidates fell below the thresholds.

        The candidates are the search's best ``recall.top_k`` in ``recall.scope``, within what
        this user may see: the session (if the caller sees it); the user's memory and every
        session they spoke in (scope user and shared); the active shards and the agent's own
        namespace (scope shared). A candidate below ``recall.min_score``, or found by the vector
        signal alone below ``recall.min_similarity``, is left out: the budget is a ceiling,
        not a target. Memories the block reads for its other sections stay among the hits
        without counting against ``top_k`` (the renderer shows each thing once, and one its
        allowance leaves out earns its place here); the session's messages in the
        ``host_window`` (those the host sends the model itself) are left out.
        Without a query, the session's latest user message is the query (and is itself left out).
        ``as_of``: when the question is asked (the search reads its dates from it, and its
        graph signal follows the facts true then, as the block's facts do).

        The search starts once the ``question`` and ``user_scope`` are known; the ``facts``'
        entities (its graph signal) and what the block ``shown`` (left out) are awaited when
        it needs them.
        """
        s = self.settings
        wanted = recall.top_k or 0
        asked = await question
        if asked.failed:
            return [], False, 0
        if asked.query is None or wanted <= 0:
            return [], True, 0
        query = asked.query
        scope = await user_scope
        if scope is None:
            return [], False, 0

        # Shielded: the search's deadline must not cancel the reads the block awaits too.
        async def entities() -> QueryGraph | None:
            return (await asyncio.shield(facts))[1]

        def similar_enough(scored: Scored) -> bool:
            signals = scored.signals
            return recall.min_similarity is None or set(signals) != {"vector"} or \
                signals["vector"][0] >= recall.min_similarity

        try:
            async with asyncio.timeout_at(deadline):
                namespaces = list(dict.fromkeys([
                    *([Namespace.session(session_id)] if session_id else []),
                    *scope,  # the user's namespaces (none for scope session)
                    *((*(Namespace.shard(agent_id, sh.shard_id) for sh in shards), Namespace.agent(agent_id))
                      if recall.scope is RecallScope.SHARED else ())]))
                if not namespaces:
                    return [], True, 0
                # What the block reads for its other sections (read by now, but for
                # consolidation's reads) stays among the hits: the renderer shows each thing
                # once, and a directive or an episode the allowance leaves out earns its place
                # here by relevance. Those do not count against ``wanted``. The query's own
                # message and the host's window are left out.
                inputs, _ = await asyncio.shield(shown)
                elsewhere: set[str] = {m.id for m in inputs.episodes}
                elsewhere |= {m.id for u in inputs.users for m in u.directives}
                elsewhere |= {m.id for sh in inputs.shards for m in (*sh.facts, *sh.suggestions)}
                left_out = set(await host_window) | ({asked.like} if asked.like is not None else set())
                top_k = min(wanted + len(elsewhere) + len(left_out), s.search_max_top_k)
                request = SearchRequest(query=query, top_k=top_k, min_score=recall.min_score, as_of=as_of)
                vector = await asked.fresh if asked.fresh is not None else None
                ranking = await self.retriever.rank(agent_id, backend, request, namespaces, found=entities,
                                                    like=asked.like if asked.reusable else None, vector=vector)
                hits = [(m, e) for m, e in ranking.results(top_k) if m.id not in left_out]
                similar = [(m, e) for m, e in hits if similar_enough(e)]
                below = len([m for m, _ in ranking.candidates(top_k) if m.id not in left_out]) + len(hits) - len(similar)
                chosen, new = [], 0
                for hit in similar:
                    if new == wanted:
                        break
                    chosen.append(hit)
                    new += hit[0].id not in elsewhere
                kept = await ranking.briefs(chosen)  # only those shown are read, and only what it shows
        except MemoryServiceError:
            raise
        except Exception as exc:  # an outage shrinks the block instead of failing the prompt
            log.warning("memory context: searching agent %s failed: %s", agent_id,  # never the query's words
                        "past the deadline" if isinstance(exc, TimeoutError) else exc)
            return [], False, 0
        sources.update(m.served_by for m, _ in kept if m.served_by)
        terms = tuple(query_terms(query))
        items = [RelevantItem(kind=b.kind, valid_at=b.valid_at, text=b.text, score=e.score, terms=terms,
                              expires_at=b.expires_at) for b, e in kept]
        return items, True, below

    async def _facts(self, agent_id: str, user_id: str, shards: list[Shard], backend: MemoryBackend,
                     query: str | None, as_of: datetime | None,
                     deadline: float) -> tuple[list[FactItem], QueryGraph | None, bool]:
        """The known facts: those of the entities ``query`` names, in the namespaces this user's
        block covers (the user's own, the active shards', the agent's; never another user's),
        then the user's own facts (the user's person entity as subject; a few, the newest),
        current ones or those true at ``as_of``. Also the query's entities and facts, for the
        search's graph signal. A store without a graph shows none; a failing one shrinks the block."""
        user_ns = Namespace.user(agent_id, user_id)
        namespaces = [user_ns, *(Namespace.shard(agent_id, sh.shard_id) for sh in shards), Namespace.agent(agent_id)]
        names = query_names(query, QUERY_STOPWORDS) if query else []
        try:
            async with asyncio.timeout_at(deadline):
                found, mine = await asyncio.gather(query_graph(backend, agent_id, namespaces, names, as_of),
                                                   query_graph(backend, agent_id, [user_ns], [user_id], as_of))
        except NotSupported:
            return [], None, True
        except Exception as exc:
            log.warning("memory context: reading agent %s's graph failed: %s", agent_id,
                        "past the deadline" if isinstance(exc, TimeoutError) else exc)
            return [], None, False
        names_by_id = {e.id: e.name for e in (*found.entities, *mine.entities)}
        order = {name: i for i, name in enumerate(names)}
        rank = {e.id: min((order.get(n, len(order)) for n in map(normalise_name, (e.name, *e.aliases))), default=0)
                for e in found.entities}

        def about(fact: Fact) -> str:
            """The entity the fact was found through: the query's (its first named), else the subject."""
            ends = sorted((rank[i], i) for i in (fact.subject_id, fact.object_id) if i in rank)
            return names_by_id.get(ends[0][1] if ends else fact.subject_id, "")

        def newest_first(fact: Fact) -> float:
            return -(fact.valid_at or fact.created_at).timestamp()

        # A fact earns its room when the query asks about it, not merely names one of its ends:
        # "Where does Tom work?" wants "Tom works at Deloitte", not every fact about Tom (a
        # speaker named in every question would fill the facts' share with his whole profile).
        # A query that only names ("Tom?", "tell me about Tom") asks about all of them.
        named = {stem(w) for e in found.entities for n in (e.name, *e.aliases) for w in query_terms(n)}
        asked = {stem(w) for w in query_terms(query or "")} - named
        asked_about = [f for f in found.facts if not asked or asked & {stem(w) for w in query_terms(f.text)}]
        query_facts = sorted(asked_about, key=lambda f: (min(rank.get(f.subject_id, len(rank) + 1),
                                                             rank.get(f.object_id, len(rank) + 1)), newest_first(f)))
        me = {e.id for e in mine.entities if e.type is EntityType.PERSON and normalise_name(e.name) == normalise_name(user_id)}
        shown = {f.id for f in query_facts}
        # The user's own facts: without a query, the newest few (who they are); with one, those
        # it asks about, as for the query's facts (else they are padding the block pays for).
        own = sorted((f for f in mine.facts if f.subject_id in me and f.id not in shown
                      and (not asked or asked & {stem(w) for w in query_terms(f.text)})), key=newest_first)[:OWN_FACTS]
        items: dict[str, FactItem] = {}  # by text: two edges stated by one sentence show it once
        for fact, is_own in (*((f, False) for f in query_facts[:QUERY_FACTS]), *((f, True) for f in own)):
            items.setdefault(fact.text, FactItem(fact.text, about(fact), fact.valid_at,
                                                 fact.invalid_at if as_of else None, own=is_own))
        return list(items.values()), found, True


@dataclass(frozen=True)
class _Question:
    """What the block asks search: the query (None: nothing to ask), the stored memory whose
    text it is (``like``: left out of the answer), whether that memory's stored vector is of
    the search's model (``reusable``: else the query is embedded before the search, which then
    scans the scope once, not twice), the run of this process embedding it since its record
    (``fresh``: its vector is the query's), and whether reading the latest message failed (the
    block then shows no relevant memories)."""

    query: str | None
    like: str | None
    failed: bool = False
    reusable: bool = False
    fresh: Awaitable[list[float] | None] | None = None


def _asdict(rendered: RenderedContext) -> dict[str, Any]:
    return {f: getattr(rendered, f) for f in rendered.__dataclass_fields__}


def cache_seconds(inputs: ContextInputs, ttl_seconds: int) -> int:
    """How long a block of ``inputs`` may be served from the cache: CONTEXT_CACHE_TTL_SECONDS,
    but no longer than the soonest expiry of a memory it shows (an expired memory leaves
    the block at once, as it leaves the stores' reads: docs/expiry.md); 0, not cached, when
    that is less than a second away."""
    shown: list[Memory | RelevantItem] = [
        *inputs.episodes, *inputs.relevant, *(m for shard in inputs.shards for m in (*shard.facts, *shard.suggestions)),
        *(m for user in inputs.users for m in user.directives)]
    ends = [m.expires_at for m in shown if m.expires_at is not None]
    if not ends or ttl_seconds <= 0:
        return ttl_seconds
    return max(0, min(ttl_seconds, math.floor((min(ends) - datetime.now(UTC)).total_seconds())))
