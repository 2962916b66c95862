"""The graph backend: memories as Graphiti episodes on FalkorDB, one graph per agent.

Layout (see docs/storage.md, "Storage layout"): every memory of an agent, in every one of its
namespaces, is an ``Episodic`` node in the agent's graph ``ms_agent__<agent>``, with
Graphiti's own properties (``uuid``, ``name``, ``group_id`` = the namespace's group_id,
``content`` = the JSON body, ``source``, ``created_at``, ``valid_at``, ...) built from
graphiti-core's ``EpisodicNode`` model, so Graphiti can later run entity extraction on
them. Ours beside them:

* ``kind``, ``ts``/``seq`` (a numeric sort key: ISO strings with and without microseconds
  do not sort), ``evicted``, ``deleted_at`` (a soft delete's time, as a Unix timestamp),
  ``expires_at`` (a Unix timestamp, indexed: every read but by id skips the memory once
  FalkorDB's clock passes it, docs/expiry.md), ``corrected_at`` (a Unix timestamp: a memory
  found wrong, read by id only, docs/corrections.md) and ``tags`` (a list, for the search filter; the body holds them too);
* ``group_kind`` = ``<group_id>|<kind>``, indexed, so the context's reads ("the 8 latest
  episodes of this session") are one index lookup, not a scan of the group;
* ``text``: what search reads (a message under its speaker), in a full-text index with
  ``group_key``, a case-proof token of the group_id (RediSearch folds case, group_ids do
  not), so a scoped full-text query is filtered inside the index;
* ``ts`` in a range index, so the stale purge reads "memories written before T" without
  scanning the graph (``written_before``);
* ``embedding`` (vecf32) in a native vector index, and ``embedding_model``, the name of the
  embedder that made it (search compares a query only with vectors of its own model; a
  vector stored before vectors carried their model is of ``untagged_model``);
  ``needs_embedding`` (indexed) marks memories stored while the embedder was down, for the
  backfill;
* while a re-embed runs (``memory-service reembed``), ``embedding_next`` (vecf32, not in the
  vector index) and ``embedding_next_model`` (indexed): the new model's vector, staged beside
  the searched one until every memory has one, then promoted (docs/embeddings.md).

An empty namespace costs nothing; a new session adds nodes to an existing graph (index
creation runs once per agent graph); a read of an unknown agent or namespace creates
nothing (read-only queries; a missing graph reads as empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis.exceptions
from falkordb.asyncio.query_result import QueryResult

from memory_service.backends import compact_reply, postings, readiness
from memory_service.backends.base import (
    Brief,
    Candidate,
    Facet,
    Found,
    ListedPage,
    MemoryListing,
    MemoryState,
    Position,
    RecentRead,
    SignalHits,
    speakers_of,
)
from memory_service.backends.graph_entities import ENTITY, ENTITY_INDEXES, EntityGraph
from memory_service.backends.graph_layout import migrate_layout
from memory_service.backends.postings import Postings
from memory_service.config import Settings, redact_url
from memory_service.domain import bm25
from memory_service.domain.models import Memory, MemoryKind, StoreQuery
from memory_service.domain.namespaces import Namespace
from memory_service.state import keyspace, metrics, tracing

if TYPE_CHECKING:
    from falkordb.asyncio.graph import AsyncGraph  # untyped: Any to mypy, named for the reader

# A row of a read: the query's RETURN names -> FalkorDB values.
Row = dict[str, Any]

log = logging.getLogger(__name__)

GRAPH_PREFIX = "ms_"  # + the agent namespace's group_id: ms_agent__<agent>
LABEL = "Episodic"
# How many more nearest neighbours the vector index is asked for when filters (kinds,
# time) apply after it, so that enough survive them.
VECTOR_OVERSAMPLE = 4
MAX_FULLTEXT_TERMS = 32
FULLTEXT_RESCORED = 10  # x the candidates asked for: each term's best (by the index) that BM25 ranks
QUERY_LOG_FLUSH_SECONDS = 10.0  # how long an erasure waits for FalkorDB to log its marker query
QUERY_LOG_PAGE = 500  # entries of the query log read a round trip while looking for the marker
DELETE_BATCH = 500  # nodes per statement when erasing: one statement holds the graph's write lock
POSTINGS_BUILD_BATCH = 2000  # memories read per statement when building an old graph's postings
POSTINGS_BUILD_LOCK_SECONDS = 120  # renewed after every batch
COUNT_BATCH = 500  # agent graphs per pipeline when the gauges count what is stored
COUNT_WAIT_SECONDS = 1.0  # how long a scrape waits for that count before it answers with the last one

# The model of a memory's stored vector (one stored before vectors carried their model is
# of ``$untagged_model``).
_VECTOR_MODEL = "coalesce(n.embedding_model, $untagged_model)"
_READ_FIELDS = ("n.uuid AS uuid, n.group_id AS group_id, n.content AS content, n.valid_at AS valid_at, "
                "n.evicted AS evicted, n.deleted_at AS deleted_at")
# What a read of live memories needs of each (in this order: ``_live_memory``'s arguments),
# and the model of its stored vector, if it has one (not the vector: whether a search can
# reuse it).
_LIVE_FIELDS = ("n.uuid, n.group_id, n.content, n.valid_at, "
                f"CASE WHEN n.embedding IS NULL THEN NULL ELSE {_VECTOR_MODEL} END")
# Not expired: no ``expires_at`` (a Unix timestamp), or one still ahead of the store's clock
# (``timestamp()``: milliseconds), so an expired memory leaves every read at once.
_UNEXPIRED = "(n.expires_at IS NULL OR n.expires_at * 1000 > timestamp())"
# What every read but find/export/unembedded asks of a memory: neither evicted, soft-deleted,
# corrected (docs/corrections.md) nor expired.
_LIVE = f"n.evicted IS NULL AND n.deleted_at IS NULL AND n.corrected_at IS NULL AND {_UNEXPIRED}"
_STATES = {MemoryState.LIVE: _LIVE, MemoryState.DELETED: "n.deleted_at IS NOT NULL",
           MemoryState.EVICTED: "n.evicted = true", MemoryState.CORRECTED: "n.corrected_at IS NOT NULL",
           MemoryState.ALL: None}

# Listing memories (``list_memories``). FalkorDB sorts every row a query matches before its
# LIMIT (no ordered index scan), so a page is read from a window of time below the cursor,
# through the ``ts`` index: each probe reads at most LIST_PROBE_ROWS nodes of the window; a
# window that holds more is narrowed, one that holds few widened, and a page reads at most
# LIST_MAX_PROBES windows (then it ends early, its cursor where the scan stopped). The
# window's width rides in the cursor, so the next page starts at the right scale.
LIST_PROBE_ROWS = 2000
LIST_MAX_PROBES = 24
LIST_FIRST_WINDOW = 3600.0  # seconds
LIST_MIN_WINDOW = 0.001  # below this, memories sharing a time are read together (their count)
_TOP_ID = "\U0010ffff"  # above every id: a position (t, _TOP_ID) keeps every memory of time t


def _disable_telemetry_unless_asked(settings: Settings) -> None:
    # graphiti-core reads this variable when it is imported; private conversations
    # must not leave the machine by default.
    os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "true" if settings.graphiti_telemetry_enabled else "false"


# What readiness queries (never created: a read of a missing graph is answered "empty key").
READINESS_GRAPH = GRAPH_PREFIX + "readiness"
# The write each agent graph takes after its server started, before the service is ready.
WARM_UP = "CREATE (n) DELETE n"
# How long a start waits for that warm-up before it goes on in the background.
WARM_UP_WAIT_SECONDS = 5.0


def graph_name(agent_id: str) -> str:
    return GRAPH_PREFIX + Namespace.agent(agent_id).group_id


def agent_of_graph(name: str) -> str | None:
    """The agent whose graph ``name`` is, or None for any other graph."""
    if not name.startswith(GRAPH_PREFIX):
        return None
    try:
        namespace = Namespace.from_group_id(name[len(GRAPH_PREFIX):])
    except Exception:
        return None
    return namespace.fields[0] if namespace.kind == "agent" else None


def group_key(group_id: str) -> str:
    """A token for ``group_id`` that survives full-text tokenising (letters and digits, one case)."""
    return "g" + hashlib.sha1(group_id.encode()).hexdigest()[:20]


def _group_kind(group_id: str, kind: MemoryKind | str) -> str:
    return f"{group_id}|{kind}"


class _FloatList:
    """A vector as the query's parameter header writes it, in one formatting operation and
    with the 9 significant digits that carry a float32 exactly (``vecf32`` stores float32):
    the client's own formatting (falkordb's ``stringify_param_value``, a call and a 17-digit
    repr per element) took about as long as the rest of a message's record."""

    __slots__ = ("text",)

    def __init__(self, values: Sequence[float]):
        self.text = "[" + ",".join(["%.9g"] * len(values)) % tuple(values) + "]"

    def __str__(self) -> str:  # what the client writes for a value that is not a str, list or dict
        return self.text


def _is_missing_graph(exc: Exception) -> bool:
    return "empty key" in str(exc)


# Its own statement: graphs made before the stale purge get it from ``written_before``.
_TS_INDEX = f"CREATE INDEX FOR (n:{LABEL}) ON (n.ts)"
_EXPIRES_INDEX = f"CREATE INDEX FOR (n:{LABEL}) ON (n.expires_at)"
# Made by the first re-embed of a graph: the staged vectors are promoted through it.
_STAGED_INDEX = f"CREATE INDEX FOR (n:{LABEL}) ON (n.embedding_next_model)"
# Which stored vectors a query of the model ``$vector_model`` is compared with: those of the same
# model (one stored before vectors carried their model is of ``$untagged_model``).
_SAME_MODEL = f"{_VECTOR_MODEL} = $vector_model"


def _index_statements(dimension: int | None) -> list[str]:
    statements = [
        f"CREATE INDEX FOR (n:{LABEL}) ON (n.uuid, n.group_id, n.group_kind, n.needs_embedding)",
        f"CALL db.idx.fulltext.createNodeIndex({{label: '{LABEL}', language: 'english'}}, 'text', 'group_key')",
        _TS_INDEX,
        _EXPIRES_INDEX,
    ]
    if dimension:
        statements.append(f"CREATE VECTOR INDEX FOR (n:{LABEL}) ON (n.embedding) "
                          f"OPTIONS {{dimension: {int(dimension)}, similarityFunction: 'cosine'}}")
    return statements


async def _until_indexes_operational(graph: AsyncGraph, timeout: float = 10.0) -> None:
    """FalkorDB builds indexes in the background; until they are operational a full-text
    query finds nothing and a vector query fails. A new graph's are built in moments."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        result = await graph.ro_query("CALL db.indexes() YIELD status RETURN collect(status)")
        if all(status == "OPERATIONAL" for status in result.result_set[0][0]):
            return
        await asyncio.sleep(0.01)
    log.warning("indexes of graph %s still building after %.0f s", graph.name, timeout)


def fulltext_queries(terms: Sequence[str], group_ids: Sequence[str] | None) -> dict[str, str]:
    """One RediSearch query per term: the term in ``text``, inside the groups if given."""
    words = [t for t in dict.fromkeys(terms) if t.replace("_", "").isalnum()][:MAX_FULLTEXT_TERMS]
    scope = f"@group_key:({'|'.join(group_key(g) for g in group_ids)}) " if group_ids is not None else ""
    return {word: f"{scope}@text:{word}" for word in words}


class GraphBackend(EntityGraph):
    """Memories as ``Episodic`` nodes (this module) and the knowledge graph beside them
    (entities, facts, mentions: memory_service/backends/graph_entities.py)."""

    name = "graph"

    def __init__(self, url: str, settings: Settings | None = None, embedding_dimension: int | None = None,
                 untagged_model: str | None = None):
        self.settings = settings or Settings()
        _disable_telemetry_unless_asked(self.settings)
        # Imported here, after the telemetry switch and at start: importing graphiti-core
        # takes seconds, which a first formation job must not spend inside its timeout.
        from graphiti_core.nodes import EpisodeType, EpisodicNode

        self._episode_type, self._episodic_node = EpisodeType, EpisodicNode

        from memory_service.backends.falkordb_client import falkordb_client

        self.url = url
        # Bounded pools with the store timeouts, on one server or a Redis Cluster
        # (memory_service/backends/falkordb_client.py).
        self.client = falkordb_client(url, self.settings)
        self.embedding_dimension = embedding_dimension
        # The model of vectors stored before each vector carried its model's name.
        self.untagged_model = untagged_model
        self._staged_indexed: set[str] = set()  # agent graphs known to hold the index of staged vectors
        self._ts_indexed: set[tuple[str, str]] = set()  # (agent graph, index) known to exist: ``_late_index``
        self._entity_indexed: set[str] = set()  # agent graphs known to hold the entity indexes
        self.postings = Postings(self.client.connection)
        self._building: asyncio.Task[None] | None = None
        self._stored: tuple[float, dict[str, float]] | None = None  # (when, gauges) of the last count
        self._counting: asyncio.Task[None] | None = None
        self._warmed: tuple[str, ...] | None = None  # the servers' run ids the agent graphs were warmed for
        self._warming: tuple[tuple[str, ...], asyncio.Task[None]] | None = None

    async def start(self) -> None:
        await self.client.connection.ping()
        if (warming := self._warm_up(await readiness.check(self.client.connection))) is not None:
            with suppress(TimeoutError):  # a big store goes on warming in the background (GET /health: 503)
                await asyncio.wait_for(asyncio.shield(warming), WARM_UP_WAIT_SECONDS)
        await migrate_layout(self.client, self)
        self._building = asyncio.create_task(self._build_missing_postings())

    async def _build_missing_postings(self) -> None:
        """Graphs written before the postings existed get theirs, one at a time, in the
        background; agent-wide search reads the full-text index for them meanwhile."""
        try:
            for agent_id in await self.agents():
                if not await self.postings.built(agent_id):
                    await self.build_postings(agent_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next start tries again; search works meanwhile
            log.warning("building the full-text postings failed: %s", exc)

    async def startup_build(self) -> None:
        """Until the build of missing postings that ``start`` began has ended (at once when
        there was none): a caller comparing the store before and after a request must not
        see that build's writes."""
        if self._building is not None and not self._building.cancelled():  # cancelled: closed
            with contextlib.suppress(Exception):  # its failure is logged; the next start retries
                await asyncio.shield(self._building)

    async def build_postings(self, agent_id: str, batch: int = POSTINGS_BUILD_BATCH) -> int | None:
        """Index every live memory of the agent's graph into fresh postings; how many, or
        None when another process holds the agent's build lock. Writes during the build
        index their own memories; a memory deleted while its batch was in flight is taken
        out again by the check at the end."""
        lock = keyspace.postings_build_lock(agent_id)
        redis = self.client.connection
        if not await redis.set(lock, "1", nx=True, ex=POSTINGS_BUILD_LOCK_SECONDS):
            return None
        try:
            await self.postings.clear(agent_id)
            after, indexed = -1, 0
            while True:
                rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE ID(n) > $after AND n.kind IS NOT NULL "
                                                  f"AND {_LIVE} RETURN ID(n) AS i, n.uuid AS uuid, n.text AS text "
                                                  "ORDER BY i LIMIT $limit", after=after, limit=batch)
                if not rows:
                    break
                indexed += await self.postings.index(agent_id, [(r["uuid"], r["text"] or "") for r in rows])
                after = int(rows[-1]["i"])
                await redis.expire(lock, POSTINGS_BUILD_LOCK_SECONDS)
            await self.postings.mark_built(agent_id)
            # What was deleted or evicted while the build read it.
            async for chunk in _chunks(self.postings.indexed_ids(agent_id), batch):
                live = {r["uuid"] for r in await self._read(
                    agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND {_LIVE} RETURN n.uuid AS uuid", ids=chunk)}
                await self.postings.remove(agent_id, [i for i in chunk if i not in live])
            log.info("full-text postings of agent %s built: %d memories", agent_id, indexed)
            return indexed
        finally:
            await redis.delete(lock)

    async def close(self) -> None:
        if self._warming is not None:
            self._warming[1].cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warming[1]
        if self._building is not None:
            self._building.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._building
        if self._counting is not None:
            self._counting.cancel()
        await self.client.aclose()
        if (pool := getattr(self.client.connection, "connection_pool", None)) is not None:
            await pool.disconnect()  # the client does not own the pool it was given

    async def health(self) -> dict[str, Any]:
        """Ready when a write would succeed: the server takes writes (memory_service/backends/
        readiness.py), answers a query, and every agent graph it loaded at its start took its
        first write (``_warm_up``)."""
        try:
            why, runs = await readiness.check(self.client.connection)
            if why is None and self._warm_up((why, runs)) is not None:
                why = "the graph store is warming up its graphs after its start"
            if why is None:
                await self._probe_query()
        except Exception as exc:  # health reports, it never raises
            return {"ok": False, "url": redact_url(self.url), "error": str(exc)}
        if why is not None:
            return {"ok": False, "url": redact_url(self.url), "error": why}
        return {"ok": True, "url": redact_url(self.url), "agent_graphs": len(await self.agents())}

    async def _probe_query(self) -> None:
        """A real query through FalkorDB's query path, which creates nothing: a read of a graph
        that does not exist (answered "empty key")."""
        try:
            await self.client.connection.execute_command("GRAPH.RO_QUERY", READINESS_GRAPH, "RETURN 1")
        except Exception as exc:
            if not _is_missing_graph(exc):
                raise

    def _warm_up(self, checked: tuple[str | None, tuple[str, ...]]) -> asyncio.Task[None] | None:
        """The warm-up of the agent graphs for the servers' current run, if it is not done.

        After a server replays its append-only file (a restart after a crash), the first
        write to each graph it loaded blocks the whole server for seconds (about 10 s for
        a graph of 10,000 messages: FalkorDB applies what the replay left pending), and
        every other command waits meanwhile. Each agent graph takes one write that changes
        nothing (a node created and deleted in one query) before the service calls itself
        ready; a write blocked past the read timeout is sent again.
        """
        why, runs = checked
        if why is not None or runs == self._warmed:
            return None
        if self._warming is None or self._warming[0] != runs or self._warming[1].done():
            self._warming = (runs, asyncio.create_task(self._warm_graphs(runs)))
        return self._warming[1]

    async def _warm_graphs(self, runs: tuple[str, ...]) -> None:
        started = time.monotonic()
        try:
            names = [name for name in await self.client.list_graphs() if agent_of_graph(name) is not None]
            for name in names:
                while True:
                    try:
                        if await self.client.connection.exists(name):  # not one an erasure just removed
                            await self.client.connection.execute_command("GRAPH.QUERY", name, WARM_UP)
                        break
                    except redis.exceptions.TimeoutError:  # still blocked on this graph: it will answer
                        continue
            self._warmed = runs
            if names:
                log.info("the graph store's %d agent graph(s) warmed up in %.1fs", len(names), time.monotonic() - started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next GET /health starts it again
            log.warning("warming up the agent graphs failed: %s: %s", type(exc).__name__, exc)

    async def gauges(self) -> dict[str, float]:
        """``memories_stored{store="graph"}`` and ``graph_entities_stored``, counted at most once
        per METRICS_STORED_REFRESH_SECONDS by this process, however often /metrics is asked.

        A scrape waits for a count it started for at most COUNT_WAIT_SECONDS, then answers
        with the last count (none before the first) while the count goes on: a frozen or
        busy FalkorDB must not make /metrics miss Prometheus's scrape timeout, which would
        lose every other metric just when they matter."""
        stale = self._stored is None or time.monotonic() - self._stored[0] >= self.settings.metrics_stored_refresh_seconds
        if stale and (self._counting is None or self._counting.done()):
            self._counting = asyncio.create_task(self._recount())
        if self._counting is not None and not self._counting.done():
            with suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._counting), COUNT_WAIT_SECONDS)
        return dict(self._stored[1]) if self._stored is not None else {}

    async def _recount(self) -> None:
        try:
            self._stored = (time.monotonic(), await self._count_stored())
        except Exception as exc:  # the store is down: /health says so; the last count stands
            log.debug("memories stored not counted: %s: %s", type(exc).__name__, exc)

    async def _count_stored(self) -> dict[str, float]:
        """Every agent graph's ``Episodic`` and ``Entity`` nodes, summed. Cheap at any size:
        FalkorDB answers ``MATCH (n:L) RETURN count(n)`` from the label's matrix without
        visiting a node (its plan is a single Project; 0.1 ms on a graph of 500,000 memories,
        where counting them by kind, which visits each, took 53 ms), so the cost is one tiny
        query per agent graph, sent in pipelines of COUNT_BATCH. Soft-deleted and evicted
        memories count until purged: this is what the store holds."""
        names = [name for name in await self.client.list_graphs() if agent_of_graph(name) is not None]
        totals = {"memories": 0, "entities": 0}
        with tracing.span("memory_service.count_stored", graphs=len(names)), tracing.unspanned():
            for start in range(0, len(names), COUNT_BATCH):
                pipe = self.client.connection.pipeline(transaction=False)
                for name in names[start : start + COUNT_BATCH]:
                    for label in (LABEL, ENTITY):
                        pipe.execute_command("GRAPH.RO_QUERY", name, f"MATCH (n:{label}) RETURN count(n)")
                replies = await pipe.execute(raise_on_error=False)
                for i, reply in enumerate(replies):
                    if isinstance(reply, Exception):  # a graph deleted since it was listed
                        continue
                    totals["memories" if i % 2 == 0 else "entities"] += int(reply[1][0][0])
        return {'memories_stored{store="graph"}': float(totals["memories"]),
                "graph_entities_stored": float(totals["entities"])}

    # Queries -------------------------------------------------------------------------

    async def _read(self, agent_id: str, cypher: str, **params: Any) -> list[Row]:
        """A read-only query on the agent's graph; a graph that does not exist reads as empty."""
        names, rows = await self._read_table(agent_id, cypher, **params)
        return [dict(zip(names, row, strict=True)) for row in rows]

    async def _read_table(self, agent_id: str, cypher: str, **params: Any) -> tuple[list[str], list[list[Any]]]:
        """``_read``'s column names and rows as lists (a read of hundreds of rows builds no dicts)."""
        graph = self.client.select_graph(graph_name(agent_id))
        try:
            reply = await graph.execute_command(*_read_only(graph, cypher, params), "--compact")
        except Exception as exc:
            if _is_missing_graph(exc):
                return [], []
            raise
        return await _table(graph, reply)

    async def _read_plain(self, agent_id: str, cypher: str, **params: Any) -> list[list[Any]]:
        """The rows of a read whose columns are strings and numbers, as FalkorDB's verbose reply
        gives them: strings, integers, None, and any other number as its text (the caller
        converts what it uses; a double has 15 significant digits, a boolean is 'true'). For
        a read of hundreds of rows: parsing the compact reply cost twice the read itself
        (300 rows of a scope scan: 2.7 ms of client CPU against 0.9 ms)."""
        return (await self._read_plain_many(agent_id, [(cypher, params)]))[0]

    async def _read_plain_many(self, agent_id: str, queries: Sequence[tuple[str, dict[str, Any]]]) -> list[list[list[Any]]]:
        """``_read_plain`` of several queries in one round trip (a pipeline of them, on the
        graph's node; one query is sent alone)."""
        graph = self.client.select_graph(graph_name(agent_id))
        if len(queries) == 1:
            try:
                replies: list[Any] = [await graph.execute_command(*_read_only(graph, *queries[0]))]
            except Exception as exc:
                replies = [exc]
        else:
            pipe = self.client.connection.pipeline(transaction=False)
            for cypher, params in queries:
                pipe.execute_command(*_read_only(graph, cypher, params))
            replies = await pipe.execute(raise_on_error=False)
        out: list[list[list[Any]]] = []
        for reply in replies:
            if isinstance(reply, Exception):
                if _is_missing_graph(reply):
                    out.append([])
                    continue
                raise reply
            out.append(reply[1] if len(reply) > 1 else [])
        return out

    async def _writable(self, agent_id: str) -> AsyncGraph:
        """The agent's graph, with its indexes, created with the graph (for updates; ``write``
        checks inside its own statement).

        Checked on every call (one EXISTS), not remembered: a graph deleted under a running
        process (an erased agent, a flushed store) must get its indexes again, or the
        full-text index would silently find nothing. Creating them twice is harmless.
        """
        graph = self.client.select_graph(graph_name(agent_id))
        if not await self.client.connection.exists(graph.name):
            await self._create_indexes(graph)
        return graph

    async def _entity_graph(self, agent_id: str) -> AsyncGraph:
        """The agent's graph for a knowledge-graph write: a new graph gets the memories'
        indexes first (``write`` makes them only for a graph with no index at all), and the
        entity indexes are made once per graph and process (and again for a graph that was
        deleted under it: the same EXISTS that ``_writable`` pays tells)."""
        name = graph_name(agent_id)
        existed = await self.client.connection.exists(name)
        graph = self.client.select_graph(name)
        if not existed:
            await self._create_indexes(graph)
        if not existed or name not in self._entity_indexed:
            for statement in ENTITY_INDEXES:
                await _create_index(graph, statement)
            await _until_indexes_operational(graph)
            self._entity_indexed.add(name)
        return graph

    async def _create_indexes(self, graph: AsyncGraph) -> None:
        for statement in _index_statements(self.embedding_dimension):
            await _create_index(graph, statement)
        await _until_indexes_operational(graph)

    # Writes --------------------------------------------------------------------------

    async def write(self, memories: Sequence[Memory]) -> int:
        by_agent: dict[str, list[Memory]] = {}
        for memory in memories:
            by_agent.setdefault(memory.metadata.agent_id, []).append(memory)
        written = 0
        for agent_id, group in by_agent.items():
            graph = self.client.select_graph(graph_name(agent_id))
            # One idempotent statement per agent: MERGE on uuid, properties only on create.
            # It also counts the graph's indexes, so a write that created the graph (new,
            # or deleted under this process) is seen without a round trip of its own; the
            # indexes are then made, and index what was just written.
            # It returns the ids of the live memories it holds, which the postings index (a
            # retried write too: indexing is idempotent, and completes a write that died
            # between the graph and the postings).
            firsts = _first_of_each(group)
            entries = {m.id: postings.entry(m.search_text) for m in firsts}
            result = await graph.query(
                f"UNWIND $rows AS row MERGE (n:{LABEL} {{uuid: row.uuid}}) "
                "ON CREATE SET n += row.props, n.embedding = CASE WHEN row.embedding IS NULL THEN NULL "
                "ELSE vecf32(row.embedding) END "
                f"WITH collect(CASE WHEN {_LIVE} THEN n.uuid END) AS live "
                "CALL db.indexes() YIELD label RETURN live, count(label)",
                {"rows": [self._row(m, entries[m.id][2]) for m in firsts]},
            )
            fresh = not (result.result_set and result.result_set[0][1])
            if fresh:  # no index at all: the graph is new, and all of it was written now
                await self._create_indexes(graph)
                live = [m.id for m in firsts if m.live]
            else:
                live = list(result.result_set[0][0])
            await self.postings.index_entries(agent_id, [(i, entries[i]) for i in live if i in entries], fresh=fresh)
            written += int(result.nodes_created)
        return written

    def _row(self, memory: Memory, terms: str) -> dict[str, Any]:
        EpisodeType = self._episode_type  # noqa: N806 (graphiti-core's classes)
        namespace = Namespace.parse(memory.namespace)
        node = self._episodic_node(
            uuid=memory.id,
            name=f"{memory.kind.value}:{memory.id}",
            group_id=namespace.group_id,
            source=EpisodeType.message if memory.kind is MemoryKind.MESSAGE else EpisodeType.json,
            source_description=f"memory-service {memory.kind.value}",
            content=memory.episode_body(),
            created_at=memory.valid_at,
            valid_at=memory.valid_at,
        )
        embedding = self._checked(memory.embedding)
        props = {
            "name": node.name,
            "group_id": node.group_id,
            "source": node.source.value,
            "source_description": node.source_description,
            "content": node.content,
            "entity_edges": node.entity_edges,
            "created_at": node.created_at.isoformat(),
            "valid_at": node.valid_at.isoformat(),
            "kind": memory.kind.value,
            "ts": memory.valid_at.timestamp(),
            "seq": memory.metadata.sequence,
            "evicted": True if memory.evicted else None,  # null leaves the property out
            "deleted_at": memory.deleted_at.timestamp() if memory.deleted_at else None,
            "expires_at": memory.expires_at.timestamp() if memory.expires_at else None,
            "corrected_at": memory.corrected_at.timestamp() if memory.corrected_at else None,
            "tags": list(memory.tags) or None,
            "group_kind": _group_kind(node.group_id, memory.kind),
            "group_key": group_key(node.group_id),
            "text": memory.search_text,
            "terms": terms,
            "needs_embedding": None if embedding else True,
            "embedding_model": memory.embedding_model if embedding else None,
        }
        return {"uuid": memory.id, "props": props, "embedding": _FloatList(embedding) if embedding else None}

    def _checked(self, vector: Sequence[float] | None) -> list[float] | None:
        if vector is None or not self.embedding_dimension:
            return None
        if len(vector) != self.embedding_dimension:
            raise ValueError(f"an embedding of {len(vector)} dimensions cannot be stored beside "
                             f"{self.embedding_dimension}-dimensional vectors")
        return list(vector)

    async def trim(self, agent_id: str, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        graph = await self._writable(agent_id)
        result = await graph.query(
            f"MATCH (n:{LABEL}) WHERE n.group_kind = $gk AND n.evicted IS NULL "
            "WITH n ORDER BY n.ts DESC, n.seq DESC, n.uuid DESC SKIP $keep "
            "SET n.evicted = true RETURN collect(n.uuid) AS ids",
            {"gk": _group_kind(namespace.group_id, kind), "keep": keep},
        )
        evicted = list(result.result_set[0][0]) if result.result_set else []
        await self.postings.remove(agent_id, evicted)
        return len(evicted)

    async def set_embeddings(self, agent_id: str, vectors: Mapping[str, Sequence[float]],
                             model: str | None = None) -> int:
        if not vectors:
            return 0
        graph = await self._writable(agent_id)
        rows = [{"id": i, "v": _FloatList(checked) if (checked := self._checked(v)) else None} for i, v in vectors.items()]
        result = await graph.query(
            f"UNWIND $rows AS row MATCH (n:{LABEL} {{uuid: row.id}}) "
            "SET n.embedding = vecf32(row.v), n.embedding_model = $model, n.needs_embedding = NULL RETURN count(n) AS c",
            {"rows": rows, "model": model},
        )
        return int(result.result_set[0][0]) if result.result_set else 0

    # Changing the embedding model (the interface's docstrings; docs/embeddings.md) ------------

    async def reembed_candidates(self, agent_id: str, model: str, after: str | None,
                                 limit: int) -> tuple[list[tuple[str, str]], str | None]:
        # The cursor is the node id: a filter on it is a scan of the label from there (FalkorDB
        # scans in id order and stops at the limit), so a page costs the page, not the graph.
        # Ids of deleted nodes are reused: a memory written behind the cursor is found by the
        # pass from the start that the re-embed ends with.
        rows = await self._read(
            agent_id,
            f"MATCH (n:{LABEL}) WHERE id(n) > $after AND n.kind IS NOT NULL "
            "AND NOT (n.embedding IS NOT NULL AND coalesce(n.embedding_model, $untagged_model, '') = $model) "
            "AND coalesce(n.embedding_next_model, '') <> $model "
            "RETURN n.uuid AS uuid, n.text AS text, id(n) AS nid LIMIT $limit",
            after=int(after) if after else -1, model=model, untagged_model=self.untagged_model, limit=limit,
        )
        following = str(max(int(r["nid"]) for r in rows)) if len(rows) >= limit else None
        return [(r["uuid"], r["text"] or "") for r in rows], following

    async def _staging(self, agent_id: str) -> AsyncGraph | None:
        """The agent's graph with the index of staged vectors; None when there is no graph."""
        name = graph_name(agent_id)
        if not await self.client.connection.exists(name):
            return None
        graph = self.client.select_graph(name)
        if name not in self._staged_indexed:
            await _create_index(graph, _STAGED_INDEX)
            await _until_indexes_operational(graph)
            self._staged_indexed.add(name)
        return graph

    async def stage_embeddings(self, agent_id: str, model: str, vectors: Mapping[str, tuple[str, Sequence[float]]]) -> int:
        if not vectors or (graph := await self._staging(agent_id)) is None:
            return 0
        rows = [{"id": i, "text": text, "v": _FloatList(self._checked(v) or list(v))} for i, (text, v) in vectors.items()]
        result = await graph.query(
            f"UNWIND $rows AS row MATCH (n:{LABEL} {{uuid: row.id}}) WHERE n.text = row.text "
            "SET n.embedding_next = vecf32(row.v), n.embedding_next_model = $model RETURN count(n)",
            {"rows": rows, "model": model})
        return int(result.result_set[0][0]) if result.result_set else 0

    async def promote_embeddings(self, agent_id: str, model: str, limit: int) -> int:
        if (graph := await self._staging(agent_id)) is None:
            return 0
        # Setting ``embedding`` re-indexes the node's vector; the staged copy is dropped.
        result = await graph.query(
            f"MATCH (n:{LABEL}) WHERE n.embedding_next_model = $model WITH n LIMIT $limit "
            "SET n.embedding = n.embedding_next, n.embedding_model = $model, n.needs_embedding = NULL, "
            "n.embedding_next = NULL, n.embedding_next_model = NULL RETURN count(n)",
            {"model": model, "limit": limit})
        return int(result.result_set[0][0]) if result.result_set else 0

    async def delete(self, agent_id: str, ids: Sequence[str]) -> int:
        # Deleting a node takes it out of every index (uuid, group, full text, vector) too.
        ids = list(dict.fromkeys(ids))
        if not ids or not await self.client.connection.exists(graph_name(agent_id)):
            return 0  # nothing stored: a missing graph is not created to delete from it
        graph = self.client.select_graph(graph_name(agent_id))
        # The postings first: a failure after them leaves a memory the retry deletes, never
        # a posting (the erased words, as key names) of a memory gone.
        await self.postings.remove(agent_id, ids)
        deleted = 0
        for start in range(0, len(ids), DELETE_BATCH):
            result = await graph.query(f"UNWIND $ids AS id MATCH (n:{LABEL} {{uuid: id}}) DELETE n",
                                       {"ids": ids[start : start + DELETE_BATCH]})
            deleted += int(result.nodes_deleted)
        return deleted

    async def swap(self, agent_id: str, new: Sequence[Memory], old_ids: Sequence[str],
                   retired_at: datetime | None = None) -> tuple[int, int]:
        old = [i for i in dict.fromkeys(old_ids) if i not in {m.id for m in new}]
        if not new or not old or not await self.client.connection.exists(graph_name(agent_id)):
            return await super().swap(agent_id, new, old, retired_at)  # one statement each way already
        if len(old) > DELETE_BATCH:  # a window's memories are a few dozen; never one statement this large
            raise ValueError(f"a swap takes out at most {DELETE_BATCH} memories, not {len(old)}")
        graph = await self._writable(agent_id)
        firsts = [m for m in _first_of_each(new) if m.metadata.agent_id == agent_id]
        entries = {m.id: postings.entry(m.search_text) for m in firsts}
        # One statement: the new nodes MERGEd (as ``write``), then the old ones deleted or
        # soft-deleted. FalkorDB runs a query under the graph's write lock, whole or not at all.
        change = "DELETE o" if retired_at is None else "SET o.deleted_at = $at"
        result = await graph.query(
            f"UNWIND $rows AS row MERGE (n:{LABEL} {{uuid: row.uuid}}) "
            "ON CREATE SET n += row.props, n.embedding = CASE WHEN row.embedding IS NULL THEN NULL "
            "ELSE vecf32(row.embedding) END "
            f"WITH count(n) AS written UNWIND $old AS id MATCH (o:{LABEL} {{uuid: id}}) {change} "
            "RETURN count(o)",
            {"rows": [self._row(m, entries[m.id][2]) for m in firsts], "old": old,
             "at": retired_at.timestamp() if retired_at else None})
        found = int(result.result_set[0][0]) if result.result_set else 0
        await self.postings.remove(agent_id, old)
        await self.postings.index_entries(agent_id, [(m.id, entries[m.id]) for m in firsts if m.live])
        return int(result.nodes_created), found

    async def set_provenance(self, agent_id: str, memories: Sequence[Memory]) -> int:
        if not memories or not await self.client.connection.exists(graph_name(agent_id)):
            return 0
        graph = self.client.select_graph(graph_name(agent_id))
        rows = [{"id": m.id, "body": m.episode_body()} for m in _first_of_each(memories)]
        updated = 0
        for start in range(0, len(rows), DELETE_BATCH):
            result = await graph.query(f"UNWIND $rows AS row MATCH (n:{LABEL} {{uuid: row.id}}) "
                                       "SET n.content = row.body RETURN count(n)", {"rows": rows[start : start + DELETE_BATCH]})
            updated += int(result.result_set[0][0]) if result.result_set else 0
        return updated

    async def replace(self, agent_id: str, memories: Sequence[Memory]) -> int:
        if not memories or not await self.client.connection.exists(graph_name(agent_id)):
            return 0
        graph = await self._writable(agent_id)
        rows = []
        for memory in _first_of_each(memories):
            embedding = self._checked(memory.embedding)
            rows.append({"id": memory.id, "body": memory.episode_body(), "text": memory.search_text,
                         "terms": postings.entry(memory.search_text)[2],
                         "tags": list(memory.tags) or None,
                         "deleted_at": memory.deleted_at.timestamp() if memory.deleted_at else None,
                         "expires_at": memory.expires_at.timestamp() if memory.expires_at else None,
                         "corrected_at": memory.corrected_at.timestamp() if memory.corrected_at else None,
                         "embedding": _FloatList(embedding) if embedding else None,
                         "model": memory.embedding_model if embedding else None,
                         "needs_embedding": None if embedding else True})
        updated = 0
        for start in range(0, len(rows), DELETE_BATCH):
            # Setting ``text`` and ``embedding`` re-indexes the node (full text, vector). A
            # row without a vector keeps the stored one while its text is the same (a soft
            # delete, a new title); a new text without one waits for the backfill. A vector
            # staged by a re-embed goes with a new text (the re-embed finds the memory again).
            result = await graph.query(
                f"UNWIND $rows AS row MATCH (n:{LABEL} {{uuid: row.id}}) "
                "WITH n, row, row.embedding IS NULL AND n.text = row.text AS keep, n.text = row.text AS same "
                "SET n.content = row.body, n.text = row.text, n.terms = row.terms, n.tags = row.tags, "
                "n.deleted_at = row.deleted_at, n.expires_at = row.expires_at, n.corrected_at = row.corrected_at, "
                "n.embedding = CASE WHEN keep THEN n.embedding WHEN row.embedding IS NULL THEN NULL "
                "ELSE vecf32(row.embedding) END, "
                "n.embedding_model = CASE WHEN keep THEN n.embedding_model ELSE row.model END, "
                "n.embedding_next = CASE WHEN same THEN n.embedding_next ELSE NULL END, "
                "n.embedding_next_model = CASE WHEN same THEN n.embedding_next_model ELSE NULL END, "
                "n.needs_embedding = CASE WHEN keep THEN n.needs_embedding ELSE row.needs_embedding END "
                f"RETURN n.uuid, {_LIVE}, n.text",
                {"rows": rows[start : start + DELETE_BATCH]})
            # Its words may have changed, or it left search (soft-deleted) or came back.
            await self.postings.remove(agent_id, [memory_id for memory_id, _, _ in result.result_set])
            await self.postings.index(agent_id, [(i, text or "") for i, live, text in result.result_set if live])
            updated += len(result.result_set)
        return updated

    def redis_servers(self) -> list[Any]:
        return [self.client.connection]

    async def purge_query_log(self, agent_id: str, timeout: float = QUERY_LOG_FLUSH_SECONDS) -> int:
        """FalkorDB keeps each graph's last queries, parameters included, in the stream
        ``telemetry{<graph>}`` (CMD_INFO, on by default), written a second or two after the
        queries ran. A marker query is run, and once the stream shows it the stream is
        deleted whole: the queries that wrote or read the erased data, the erasure's own, and
        the few logged after the marker. Not trimmed: XTRIM takes a node of the stream out
        only when all its entries go, and merely flags the others deleted, their bytes left in
        place; a snapshot or a rewritten append-only file then kept what XRANGE no longer
        shows. Returns the number of entries removed (as the stream counted them just before)."""
        from memory_service.state.pools import node_of

        name = graph_name(agent_id)
        stream, connection = f"telemetry{{{name}}}", self.client.connection
        try:  # asked of the graph's server: on a cluster, the node of its slot (the stream's too)
            server = await node_of(connection, name)
            enabled = str((await server.execute_command("GRAPH.CONFIG", "GET", "CMD_INFO"))[1]).lower()
        except Exception as exc:  # a managed server may refuse GRAPH.CONFIG
            log.warning("cannot tell whether FalkorDB logs the queries of %s: %s", name, exc)
            enabled = "1"
        if enabled in ("0", "false", "no"):
            return 0
        if not await connection.exists(name):
            return int(await connection.delete(stream))
        # Read forward from the last entry before the marker: under load more than a page of
        # queries may be logged after it before a poll comes.
        newest = await connection.xrevrange(stream, count=1)
        cursor = newest[0][0] if newest else "0-0"
        marker = uuid.uuid4().hex
        await self.client.select_graph(name).ro_query(f"RETURN '{marker}'")
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            entries = await connection.xrange(stream, min=f"({cursor}", count=QUERY_LOG_PAGE)
            for entry_id, fields in entries:
                if marker in str(fields.get("Query", "")):
                    removed = int(await connection.xlen(stream))
                    await connection.delete(stream)  # with any entry a flush added between the two
                    return removed
                cursor = entry_id
            if len(entries) < QUERY_LOG_PAGE:
                await asyncio.sleep(0.05)
        log.warning("FalkorDB's query log of %s did not show the erasure's marker within %.0f s; it keeps its last "
                    "queries until newer ones push them out", name, timeout)
        return 0

    # Reads ---------------------------------------------------------------------------

    async def get(self, agent_id: str, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        rows = await self._read(
            agent_id,
            f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND n.group_id = $g AND n.deleted_at IS NULL "
            f"AND n.corrected_at IS NULL AND {_UNEXPIRED} "
            f"RETURN {_READ_FIELDS} ORDER BY n.ts, n.seq, n.uuid",
            ids=list(ids), g=namespace.group_id,
        )
        return [_memory(row) for row in rows]

    async def find(self, agent_id: str, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND n.kind IS NOT NULL "
                                          f"RETURN {_READ_FIELDS} ORDER BY n.ts, n.seq, n.uuid", ids=list(ids))
        return [_memory(row) for row in rows]

    async def admitted(self, agent_id: str, ids: Sequence[str], query: StoreQuery) -> list[Candidate]:
        if not ids or query.namespaces == []:
            return []
        filters, params = _admission(query)
        rows = await self._read_plain(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND n.kind IS NOT NULL AND "
                                                f"{' AND '.join(filters)} RETURN n.uuid, n.valid_at",
                                      ids=list(ids), **params)
        return [Found(memory_id, _moment(valid_at)) for memory_id, valid_at in rows]

    async def briefs(self, agent_id: str, ids: Sequence[str]) -> list[Brief]:
        if not ids:
            return []
        rows = await self._read_plain(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND n.kind IS NOT NULL "
                                                f"AND {_LIVE} RETURN n.uuid, n.kind, n.valid_at, n.text, n.expires_at",
                                      ids=list(ids))
        return [Brief(i, MemoryKind(kind), _moment(valid_at), text or "", "graph",
                      None if expires is None else datetime.fromtimestamp(float(expires), UTC))
                for i, kind, valid_at, text, expires in rows]

    async def facets(self, agent_id: str, ids: Sequence[str]) -> list[Facet]:
        # The speaker, role and session live in the stored body (``content``): read it, not the text.
        if not ids:
            return []
        rows = await self._read_plain(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND n.kind IS NOT NULL "
                                                f"AND {_LIVE} RETURN n.uuid, n.kind, n.valid_at, n.content",
                                      ids=list(ids))
        out = []
        for memory_id, kind, valid_at, content in rows:
            meta = json.loads(content).get("metadata") or {}
            out.append(Facet(memory_id, MemoryKind(kind), _moment(valid_at), meta.get("session_id"), meta.get("role"),
                             speakers_of(meta.get("user_id"), meta.get("user_ids") or ())))
        return out

    async def recent(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        return (await self.recent_many(agent_id, [RecentRead(namespace, kinds, limit)]))[0]

    async def recent_many(self, agent_id: str, reads: Sequence[RecentRead]) -> list[list[Memory]]:
        """Every read in one round trip (a pipeline of queries): the memory block's reads of
        its session, users and shards cost one wait, not one each."""
        asked = [r for r in reads if r.limit > 0 and r.kinds]
        queries = [(f"MATCH (n:{LABEL}) WHERE n.group_kind IN $gks AND {_LIVE} RETURN {_LIVE_FIELDS} "
                    "ORDER BY n.ts DESC, n.seq DESC, n.uuid DESC LIMIT $limit",
                    {"gks": [_group_kind(r.namespace.group_id, k) for k in r.kinds], "limit": r.limit,
                     "untagged_model": self.untagged_model}) for r in asked]
        found = iter(await self._read_plain_many(agent_id, queries) if queries else [])
        return [[_live_memory(*row) for row in reversed(next(found))] if r.limit > 0 and r.kinds else [] for r in reads]

    async def count(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        params: dict[str, Any]
        if kinds:
            where, params = "n.group_kind IN $gks", {"gks": [_group_kind(namespace.group_id, k) for k in kinds]}
        else:
            where, params = "n.group_id = $g", {"g": namespace.group_id}
        rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE {where} AND {_LIVE} RETURN count(n) AS c",
                                **params)
        return int(rows[0]["c"]) if rows else 0

    async def export(self, agent_id: str, namespace: Namespace) -> list[Memory]:
        rows = await self._read(
            agent_id,
            f"MATCH (n:{LABEL}) WHERE n.group_id = $g AND n.kind IS NOT NULL RETURN {_READ_FIELDS} "
            "ORDER BY n.ts, n.seq, n.uuid",
            g=namespace.group_id,
        )
        return [_memory(row) for row in rows]

    async def written_before(self, agent_id: str, before: datetime, limit: int,
                             after: tuple[float, str] | None = None) -> list[Memory]:
        if limit <= 0:
            return []
        name = graph_name(agent_id)
        await self._late_index(name, _TS_INDEX)
        # The range on ``ts`` is what the index answers; the id breaks ties at the cursor.
        params: dict[str, Any] = {}
        if after is None:
            where = "n.ts < $before"
        else:
            where = "n.ts >= $from AND n.ts < $before AND (n.ts > $from OR n.uuid > $id)"
            params = {"from": after[0], "id": after[1]}
        rows = await self._read(
            agent_id,
            # Sorted and cut before the fields are read: only the page's rows are projected.
            f"MATCH (n:{LABEL}) WHERE {where} AND n.kind IS NOT NULL "
            f"WITH n ORDER BY n.ts, n.uuid LIMIT $limit RETURN {_READ_FIELDS}",
            before=before.timestamp(), limit=limit, **params,
        )
        return [_memory(row) for row in rows]

    async def _late_index(self, name: str, statement: str) -> None:
        """Graphs made before an index existed get it here, once per process; a missing graph
        is not created for it (its first write makes every index)."""
        if (name, statement) not in self._ts_indexed and await self.client.connection.exists(name):
            await _create_index(self.client.select_graph(name), statement)
            self._ts_indexed.add((name, statement))

    async def expired(self, agent_id: str, now: datetime, limit: int) -> list[Memory]:
        if limit <= 0:
            return []
        await self._late_index(graph_name(agent_id), _EXPIRES_INDEX)
        rows = await self._read(
            agent_id,
            f"MATCH (n:{LABEL}) WHERE n.expires_at <= $now AND n.kind IS NOT NULL "
            f"WITH n ORDER BY n.expires_at, n.uuid LIMIT $limit RETURN {_READ_FIELDS}",
            now=now.timestamp(), limit=limit,
        )
        return [_memory(row) for row in rows]

    async def list_memories(self, agent_id: str, listing: MemoryListing) -> ListedPage:
        """See MemoryBackend.list_memories, and LIST_PROBE_ROWS above for how a page is read."""
        groups = [ns.group_id for ns in listing.namespaces] if listing.namespaces is not None else None
        if groups == [] or listing.limit <= 0:
            return ListedPage([])
        indexed, rest, params = [], ["n.kind IS NOT NULL"], {}  # what the index answers; what is checked after
        if groups is not None and listing.kinds:
            indexed.append("n.group_kind IN $gks")
            params["gks"] = [_group_kind(g, k) for g in groups for k in listing.kinds]
        elif groups is not None:
            indexed.append("n.group_id IN $groups")
            params["groups"] = groups
        elif listing.kinds:
            rest.append("n.kind IN $kinds")
            params["kinds"] = [k.value for k in listing.kinds]
        if listing.tags:
            rest.append("all(t IN $tags WHERE t IN n.tags)")
            params["tags"] = list(listing.tags)
        if (state := _STATES[listing.state]) is not None:
            rest.append(state)
        floor = listing.since.timestamp() if listing.since else None
        top: float | None
        if listing.after is not None:
            top, top_id = listing.after
        elif listing.until is not None:
            top, top_id = listing.until.timestamp(), _TOP_ID
        else:
            top, top_id = None, _TOP_ID
        width = listing.hint if listing.hint and listing.hint > 0 else LIST_FIRST_WINDOW
        found: list[Position] = []
        too_wide = float("inf")  # the narrowest width seen holding more than a probe reads: never grow back to it
        for _ in range(LIST_MAX_PROBES):
            low = (top if top is not None else time.time()) - width
            last = floor is not None and low <= floor
            if floor is not None and last:
                low = floor
            where = [*indexed, "n.ts >= $low", *(["n.ts <= $top"] if top is not None else [])]
            scanned, hits = await self._probe(agent_id, where, rest, dict(params, low=low, top=top),
                                              LIST_PROBE_ROWS)
            if scanned >= LIST_PROBE_ROWS:
                if width > LIST_MIN_WINDOW:
                    too_wide = min(too_wide, width)
                    width /= 4  # too dense: a narrower window
                    continue
                _, hits = await self._probe(agent_id, where, rest, dict(params, low=low, top=top), None)
            below = sorted(((float(ts), str(i)) for ts, i in hits
                            if top is None or ts < top or (ts == top and i < top_id)), reverse=True)
            found.extend(below[: listing.limit - len(found)])
            if len(found) >= listing.limit:
                return await self._page(agent_id, found, found[-1], width)
            if last:
                return await self._page(agent_id, found, None, width)
            top, top_id = low, ""  # below the window: every memory of time ``low`` was in it
            if scanned == 0 and not await self._any_below(agent_id, indexed, params, top):
                return await self._page(agent_id, found, None, width)
            if scanned < LIST_PROBE_ROWS // 4:
                width = min(width * 4, too_wide / 2)
        return await self._page(agent_id, found, (top, top_id) if top is not None else None, width)

    async def _probe(self, agent_id: str, where: list[str], rest: list[str], params: dict[str, Any],
                     cap: int | None) -> tuple[int, list[tuple[float, str]]]:
        """At most ``cap`` nodes matching ``where`` (through the index), unsorted: how many were
        read, and the (time, id) of those that pass ``rest``."""
        limit = "WITH n LIMIT $cap " if cap is not None else ""
        if cap is not None:  # counted first, without reading the nodes: a window too dense costs little
            counted = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE {' AND '.join(where)} {limit}"
                                                 "RETURN count(n) AS scanned", cap=cap, **params)
            if counted and int(counted[0]["scanned"]) >= cap:
                return cap, []
        rows = await self._read(
            agent_id,
            f"MATCH (n:{LABEL}) WHERE {' AND '.join(where)} {limit}WITH collect(n) AS raw "
            f"RETURN size(raw) AS scanned, [n IN raw WHERE {' AND '.join(rest)} | [n.valid_at, n.uuid]] AS hits",
            cap=cap, **params)
        if not rows:
            return 0, []
        # The time from ``valid_at`` (what ``ts`` was computed from): FalkorDB answers a float
        # with 15 significant digits, and a cursor must name the stored value exactly.
        return int(rows[0]["scanned"]), [(_timestamp(at), str(i)) for at, i in rows[0]["hits"]]

    async def _any_below(self, agent_id: str, indexed: list[str], params: dict[str, Any], top: float) -> bool:
        rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE {' AND '.join([*indexed, 'n.ts < $top'])} "
                                          "RETURN 1 AS one LIMIT 1", **params, top=top)
        return bool(rows)

    async def _page(self, agent_id: str, found: list[Position], resume: Position | None, width: float) -> ListedPage:
        """The memories of ``found``, in its order."""
        rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids RETURN {_READ_FIELDS}",
                                ids=[i for _, i in found]) if found else []
        by_id = {row["uuid"]: _memory(row) for row in rows}
        return ListedPage([by_id[i] for _, i in found if i in by_id], resume, width)

    async def agents(self) -> list[str]:
        names = await self.client.list_graphs()
        return sorted(a for a in map(agent_of_graph, names) if a is not None)

    async def unembedded(self, agent_id: str, limit: int, exclude: Collection[str] = ()) -> list[Memory]:
        skip = " AND NOT n.uuid IN $exclude" if exclude else ""
        rows = await self._read(
            agent_id, f"MATCH (n:{LABEL}) WHERE n.needs_embedding = true{skip} RETURN {_READ_FIELDS} LIMIT $limit",
            limit=limit, exclude=list(exclude),
        )
        return [_memory(row) for row in rows]

    async def stored_embedding(self, agent_id: str, memory_id: str, model: str | None) -> list[float] | None:
        same = _SAME_MODEL if model is not None else "true"
        rows = await self._read(agent_id, f"MATCH (n:{LABEL} {{uuid: $id}}) WHERE n.embedding IS NOT NULL AND {same} "
                                          "RETURN n.embedding AS v", id=memory_id, vector_model=model,
                                untagged_model=self.untagged_model)
        return [float(x) for x in rows[0]["v"]] if rows else None

    async def search(self, agent_id: str, query: StoreQuery) -> SignalHits:
        filters, params = _admission(query)
        groups: list[str] | None = params.get("groups")  # None: the agent's whole graph
        if groups == []:
            return {}
        params["limit"] = query.limit
        where = " AND ".join(filters)
        if groups is not None and (scanned := await self._scan_scope(agent_id, query, where, params)) is not None:
            return scanned
        if query.like is not None:  # the indexes need the vector itself
            query = dataclasses.replace(query, like=None,
                                        vector=await self.stored_embedding(agent_id, query.like, query.vector_model))
        hits: SignalHits = {}
        # The two signals at once: the store answers each on a thread of its own.
        vector_hits = asyncio.ensure_future(self._vector(agent_id, query, groups, filters, where, params))
        try:
            if queries := fulltext_queries(query.terms, groups):
                with metrics.SEARCH_SIGNALS.labels("fulltext").time():
                    ranked = None
                    if groups is None:  # agent-wide: the postings, once they cover the graph
                        k = query.limit * (VECTOR_OVERSAMPLE if len(filters) > 1 else 1)
                        ranked = await self.postings.top(agent_id, list(queries), k,
                                                         self.settings.search_postings_budget)
                    if ranked is not None:
                        hits["fulltext"] = await self._ranked(agent_id, ranked.hits, where, params)
                    else:
                        hits["fulltext"] = await self._fulltext(agent_id, queries, groups, where, params)
        finally:
            found = await vector_hits
        if found is not None:
            hits["vector"] = found
        return hits

    async def _vector(self, agent_id: str, query: StoreQuery, groups: list[str] | None, filters: list[str],
                      where: str, params: dict[str, Any]) -> list[tuple[Found, float]] | None:
        """The vector signal's candidates, as ``Found`` (id and time: the search reads whole
        only those it keeps); None without a query vector, without vectors in this store, or
        while the vector index does not answer."""
        params = dict(params)
        if (vector := self._checked(query.vector)) is not None:
            # Like with like: a query is compared only with vectors of its own model.
            where_vector = where
            if query.vector_model is not None:
                where_vector = f"{where} AND {_SAME_MODEL}"
                params.update(vector_model=query.vector_model, untagged_model=self.untagged_model)
            if groups is None:
                # The agent's whole graph: the vector index's nearest neighbours.
                k = query.limit * (VECTOR_OVERSAMPLE if len(filters) > 1 else 1)
                cypher = (f"CALL db.idx.vector.queryNodes('{LABEL}', 'embedding', $k, vecf32($v)) "
                          f"YIELD node AS n, score WHERE {where_vector} "
                          "RETURN n.uuid, n.valid_at, score AS d ORDER BY d ASC LIMIT $limit")
                params["k"] = k
            else:
                # A scope inside the agent: exact distances over the scope's memories,
                # found through the group_id index (cost: the scope's size, not the graph's).
                cypher = (f"MATCH (n:{LABEL}) WHERE {where_vector} AND n.embedding IS NOT NULL "
                          "WITH n, vec.cosineDistance(n.embedding, vecf32($v)) AS d "
                          "RETURN n.uuid, n.valid_at, d ORDER BY d ASC LIMIT $limit")
            try:
                with metrics.SEARCH_SIGNALS.labels("vector").time():
                    rows = await self._read_plain(agent_id, cypher, v=_FloatList(vector), **params)
            except Exception as exc:
                # After a restart FalkorDB rebuilds vector indexes in the background and
                # refuses queries meanwhile ("Invalid arguments"): full text still answers.
                log.warning("vector search of agent %s failed, full text only: %s", agent_id, exc)
                return None
            # Cosine distance (0 = same direction) as a similarity in [-1, 1].
            return [(Found(memory_id, _moment(valid_at)), 1.0 - float(d)) for memory_id, valid_at, d in rows]
        return None

    async def _scan_scope(self, agent_id: str, query: StoreQuery, where: str,
                          params: dict[str, Any]) -> SignalHits | None:
        """Both signals of a search inside some namespaces, from one read of the scope: each
        memory's id, time, cosine distance to the query vector, and its words from the
        postings' entries (BM25 over the scope). The winners are answered as ``Found`` (id
        and time): the search reads whole only those it keeps. Cost: the scope's size, not
        the agent's (the full-text index's per-word queries cost each word's matches in the
        whole agent, the common words of a message among them). None when the scope holds
        more than SEARCH_SCOPE_SCAN_MAX memories: the indexes answer then."""
        cap = self.settings.search_scope_scan_max
        terms = [t for t in query.terms if t]
        vector = self._checked(query.vector)
        like = query.like if vector is None else None
        if cap <= 0 or (not terms and vector is None and like is None):
            return None
        scan = dict(params, cap=cap + 1)
        distance, start = "NULL", ""
        if vector is not None or like is not None:
            same = _SAME_MODEL if query.vector_model is not None else "true"
            target = "vecf32($v)" if vector is not None else "qv"
            distance = f"CASE WHEN n.embedding IS NOT NULL AND {same} THEN vec.cosineDistance(n.embedding, {target}) END"
            scan.update(vector_model=query.vector_model, untagged_model=self.untagged_model)
            if vector is not None:
                scan["v"] = _FloatList(vector)
        if like is not None:
            # The stored vector, read by the scan itself (no round trip, no vector sent back).
            start = (f"OPTIONAL MATCH (q:{LABEL} {{uuid: $like}}) WHERE q.embedding IS NOT NULL AND "
                     f"{same.replace('n.embedding_model', 'q.embedding_model')} WITH q.embedding AS qv ")
            distance = f"CASE WHEN qv IS NULL THEN NULL ELSE {distance} END"
            scan["like"] = like
        # Rows of (uuid, distance, terms, valid_at), the distance as text.
        rows = await self._read_plain(agent_id, f"{start}MATCH (n:{LABEL}) WHERE {where} RETURN n.uuid, {distance}, "
                                                f"{'n.terms' if terms else 'NULL'}, n.valid_at LIMIT $cap", **scan)
        if len(rows) > cap:
            return None
        limit = params["limit"]
        ranked: dict[str, list[tuple[str, float]]] = {}
        if terms:
            # The scope's words as the memories' ``terms`` hold them (the postings' entry of
            # each: no text to read and tokenise); a memory written before it had one, from
            # the postings.
            ids = [memory_id for memory_id, _, entry, _ in rows if entry is not None]
            lines = [entry for _, _, entry, _ in rows if entry is not None]
            if older := [memory_id for memory_id, _, entry, _ in rows if entry is None]:
                indexed = await self.postings.entries(agent_id, older)
                if indexed is None:
                    return None  # not built yet: the full-text index answers
                ids += indexed
                lines += indexed.values()
            scores = postings.rank_entries(lines, terms)
            ranked["fulltext"] = [(ids[at], score) for at, score in
                                  sorted(scores.items(), key=lambda p: (-p[1], ids[p[0]]))[:limit]]
        if near := sorted((float(d), memory_id) for memory_id, d, _, _ in rows if d is not None):
            ranked["vector"] = [(memory_id, 1.0 - d) for d, memory_id in near[:limit]]
        winners = {i for best in ranked.values() for i, _ in best}
        found = {memory_id: Found(memory_id, _moment(valid_at))
                 for memory_id, _, _, valid_at in rows if memory_id in winners}
        return {signal: [(found[i], round(score, 6)) for i, score in best if i in found]
                for signal, best in ranked.items()}

    async def _ranked(self, agent_id: str, ranked: list[tuple[str, float]], where: str,
                      params: dict[str, Any]) -> list[tuple[Found, float]]:
        """The postings' best memories (memory_service/backends/postings.py) that pass the
        search's filters, best first, at most the limit, as ``Found`` (one query for their
        times: the search reads whole only those it keeps)."""
        if not ranked:
            return []
        rows = await self._read_plain(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids AND {where} "
                                                "RETURN n.uuid, n.valid_at", ids=[memory_id for memory_id, _ in ranked],
                                      **params)
        times = {memory_id: valid_at for memory_id, valid_at in rows}
        return [(Found(i, _moment(times[i])), round(score, 6)) for i, score in ranked if i in times][: params["limit"]]


    async def _fulltext(self, agent_id: str, queries: dict[str, str], groups: list[str] | None, where: str,
                        params: dict[str, Any]) -> list[tuple[Memory, float]]:
        """The index counts the memories holding each term (stemmed, inside the scope) and
        gives its best few for each; BM25 ranks their union (memory_service/domain/bm25.py says
        why not the index's own OR score). One query for all terms."""
        per_term = FULLTEXT_RESCORED * params["limit"]
        rows = await self._read(
            agent_id,
            f"UNWIND $queries AS q CALL db.idx.fulltext.queryNodes('{LABEL}', q[1]) YIELD node AS n, score "
            f"WITH q, n, score WHERE {where} WITH q, n, score ORDER BY score DESC "
            "WITH q, collect(n.uuid) AS ids RETURN q[0] AS term, size(ids) AS df, ids[0..$per_term] AS best",
            queries=[[term, q] for term, q in queries.items()], per_term=per_term, **params,
        )
        if not rows:
            return []
        df = {row["term"]: int(row["df"]) for row in rows}
        matches: dict[str, set[str]] = {}
        for row in rows:
            for memory_id in row["best"]:
                matches.setdefault(memory_id, set()).add(row["term"])
        scope_size = await self._scope_size(agent_id, groups)
        rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE n.uuid IN $ids RETURN {_READ_FIELDS}, n.text AS text",
                                ids=list(matches))
        scored = bm25.scores(matches, {r["uuid"]: r["text"] for r in rows}, df, scope_size)
        ranked = sorted(rows, key=lambda r: (-scored[r["uuid"]], r["uuid"]))[: params["limit"]]
        return [(_memory(r), round(scored[r["uuid"]], 6)) for r in ranked]

    async def _scope_size(self, agent_id: str, groups: list[str] | None) -> int:
        if groups is None:
            rows = await self._read(agent_id, f"MATCH (n:{LABEL}) RETURN count(n) AS c")
        else:
            rows = await self._read(agent_id, f"MATCH (n:{LABEL}) WHERE n.group_id IN $groups RETURN count(n) AS c",
                                    groups=groups)
        return int(rows[0]["c"]) if rows else 0


def _admission(query: StoreQuery) -> tuple[list[str], dict[str, Any]]:
    """The conditions a search for ``query`` puts on a memory (live, in its namespaces, of
    its kinds, time range and tags), as Cypher on ``n``, and their parameters."""
    filters = [_LIVE]
    params: dict[str, Any] = {}
    if query.namespaces is not None:
        filters.append("n.group_id IN $groups")
        params["groups"] = [ns.group_id for ns in query.namespaces]
    if query.kinds:
        filters.append("n.kind IN $kinds")
        params["kinds"] = [k.value for k in query.kinds]
    if query.since:
        filters.append("n.ts >= $since")
        params["since"] = query.since.timestamp()
    if query.until:
        filters.append("n.ts <= $until")
        params["until"] = query.until.timestamp()
    if query.tags:
        filters.append("all(t IN $tags WHERE t IN n.tags)")
        params["tags"] = list(query.tags)
    return filters, params


async def _table(graph: AsyncGraph, reply: Any) -> tuple[list[str], list[list[Any]]]:
    """A query's compact reply as column names and rows: read by compact_reply (the client
    awaits a coroutine per value), or by the client when the reply holds nodes or edges."""
    if (parsed := compact_reply.rows(reply)) is None:
        result = QueryResult(graph)
        await result.parse(reply)
        parsed = [compact_reply.text(h[1]) for h in result.header], result.result_set
    return parsed


def _read_only(graph: AsyncGraph, cypher: str, params: dict[str, Any]) -> tuple[str, str, str]:
    """The GRAPH.RO_QUERY command of a read, as the client's ro_query sends it (without
    ``--compact``: its caller adds it when it parses the compact reply)."""
    return "GRAPH.RO_QUERY", graph.name, graph._build_params_header(params) + cypher


async def _create_index(graph: AsyncGraph, statement: str) -> None:
    try:
        await graph.query(statement)
    except Exception as exc:
        if "already" not in str(exc).lower():
            raise


async def _chunks(items: AsyncIterator[str], size: int) -> AsyncIterator[list[str]]:
    chunk: list[str] = []
    async for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _first_of_each(memories: Sequence[Memory]) -> list[Memory]:
    """One memory per id, the first: a statement whose rows repeat an id would apply the
    later row's ON CREATE properties too (FalkorDB 4), and the first write must win."""
    first: dict[str, Memory] = {}
    for memory in memories:
        first.setdefault(memory.id, memory)
    return list(first.values())


@functools.lru_cache(maxsize=4096)
def _namespace_text(group_id: str) -> str:
    """A group_id's namespace, as text: decoded once per group (a search reads many memories
    of a few groups)."""
    return str(Namespace.from_group_id(group_id))


def _moment(valid_at: str) -> datetime:
    """A stored ``valid_at`` as a time (naive times are UTC)."""
    moment = datetime.fromisoformat(valid_at)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _timestamp(valid_at: str) -> float:
    """``ts`` as the write computed it from the memory's ``valid_at``."""
    return _moment(valid_at).timestamp()


def _memory(row: Row) -> Memory:
    memory = _live_memory(row["uuid"], row["group_id"], row["content"], row["valid_at"])
    memory.evicted = bool(row.get("evicted"))
    if row.get("deleted_at") is not None:
        memory.deleted_at = datetime.fromtimestamp(float(row["deleted_at"]), UTC)
    return memory


def _live_memory(uuid: str, group_id: str, content: str, valid_at: str, vector_model: str | None = None) -> Memory:
    """A memory from its ``_LIVE_FIELDS`` (neither evicted nor deleted)."""
    memory = Memory.from_episode_body(id=uuid, namespace=_namespace_text(group_id), body=content, valid_at=valid_at)
    memory.embedding_model = vector_model
    memory.served_by = "graph"
    return memory
