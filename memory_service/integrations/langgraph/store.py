"""LangGraph's long-term memory store (``BaseStore``) kept in the memory service.

A LangGraph item (a namespace tuple, a key, a JSON object) is one memory of one agent,
written by the memory tools (docs/memory-tools.md), so what a graph keeps with
``store.put`` is searchable by the service's hybrid search, shown in the memory block
when relevant, audited, soft-deleted and purged by the retention policy, and, when it
belongs to a user, exported and erased with that user. The mapping
(docs/integrations/langgraph.md):

- the memory's content is the value as JSON (lossless: that text is what is indexed);
- its title is the address, ``[[namespace labels], key]`` as JSON (read back by get,
  search and list_namespaces; at most the service's 200 title characters);
- its id follows from the address: the write is idempotent by a key made of the store's
  name and a digest of the address, and ``keyed_memory_id`` gives the id of such a write,
  so get and delete are one request by id, and two processes putting the same new key
  store one memory;
- its tags are the store's name and one digest per namespace prefix (``<name>:ns<depth>:
  <digest>``), so a search under a prefix is a tag filter inside the service's query,
  plus ``<name>:noindex`` for ``index=False``;
- its namespace is ``agent:<agent>``, or ``user:<agent>:<user>`` when ``user_of`` names
  the user a LangGraph namespace belongs to.

Every operation runs as a plan (``_calls``): the same code for ``batch`` on the blocking
client and ``abatch`` on the async one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from memory_service.client import (
    AsyncMemoryClient,
    ConflictError,
    MemoryApiError,
    MemoryClient,
    MemoryRecord,
    NotFoundError,
    keyed_memory_id,
)
from memory_service.integrations.langgraph._calls import Plan, arun, call, run
from memory_service.schemas.search import Explanation, SearchHit

TITLE_CHARS = 200  # the service's longest title: the item's address is kept there
# The service's default MAX_MEMORY_TAGS is 20: the store's own tag, one per namespace level
# and the not-indexed tag.
MAX_DEPTH = 18
LIST_PAGE = 200  # the browse API's largest page
NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


class MemorySearchItem(SearchItem):
    """A search result with the memory behind it: ``memory_id`` (for the memory tools) and,
    for a search with a query, the service's ``explanation`` of its score (each signal's
    score and rank, the fusion, recency, graph paths)."""

    __slots__ = ("memory_id", "explanation")

    def __init__(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], created_at: datetime,
                 updated_at: datetime, score: float | None = None, *, memory_id: str,
                 explanation: Explanation | None = None) -> None:
        super().__init__(namespace, key, value, created_at, updated_at, score)
        self.memory_id = memory_id
        self.explanation = explanation


class MemoryServiceStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are memories of ``agent_id`` in the service.

    ``client`` serves the blocking methods (get, search, put, delete, list_namespaces,
    batch), ``async_client`` the async ones (aget, asearch, ...); give one or both. Writes
    need the agent in the operator's MEMORY_WRITE_AGENTS. ``user_of`` maps a LangGraph
    namespace to the user it belongs to (or None): that user's items live in their
    ``user:`` namespace, are exported with them and erased with them; the others live in
    ``agent:<agent_id>``. ``kind`` is the memories' kind (observation by default). ``name``
    tells stores of one agent apart (their items never meet); ``search_depth`` is how many
    results a search with a query asks the service for (at most its SEARCH_MAX_TOP_K),
    among which ``filter`` and ``offset`` are applied.
    """

    def __init__(self, agent_id: str, *, client: MemoryClient | None = None,
                 async_client: AsyncMemoryClient | None = None,
                 user_of: Callable[[tuple[str, ...]], str | None] | None = None, kind: str = "observation",
                 name: str = "langgraph", search_depth: int = 100) -> None:
        if client is None and async_client is None:
            raise ValueError("give client=MemoryClient(...), async_client=AsyncMemoryClient(...) or both")
        if not agent_id:
            raise ValueError("agent_id must not be empty")
        if not NAME.fullmatch(name):
            raise ValueError(f"name {name!r}: 1 to 32 letters, digits, '_' or '-' (it is a tag of every item)")
        if not 1 <= search_depth <= 1000:
            raise ValueError(f"search_depth {search_depth}: 1 to 1000 (the service's SEARCH_MAX_TOP_K bounds it)")
        self.agent_id, self.client, self.async_client = agent_id, client, async_client
        self.user_of, self.kind, self.name, self.search_depth = user_of, kind, name, search_depth

    # BaseStore -----------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order (a put is read by the operations after it)."""
        return [run(self.client, self._plan(op), needed_for="MemoryServiceStore.batch") for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order (a put is read by the operations after it)."""
        return [await arun(self.async_client, self._plan(op), needed_for="MemoryServiceStore.abatch") for op in ops]

    def _plan(self, op: Op) -> Plan[Result]:
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise ValueError(f"unknown store operation {type(op).__name__}")

    # Operations ----------------------------------------------------------------------------

    def _get(self, op: GetOp) -> Plan[Result]:
        _labels(op.namespace, "namespace")
        address = _address(op.namespace, op.key)
        if len(address) > TITLE_CHARS:
            return None  # never stored: a put of it is refused
        # memory_get counts a read, the clock of the stale purge (STALE_PURGE_DAYS): the service's
        # counterpart of refreshing a TTL. memory_detail reads without counting.
        method = "memory_get" if op.refresh_ttl else "memory_detail"
        try:
            answer = yield call(method, self.agent_id, self._memory_id(address))
        except NotFoundError:
            return None
        record = answer if isinstance(answer, MemoryRecord) else answer.memory
        found = self._record_item(record)
        return found if found is not None and record.deleted_at is None else None

    def _put(self, op: PutOp) -> Plan[Result]:
        namespace = _labels(op.namespace, "namespace")
        if not namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if len(namespace) > MAX_DEPTH:
            raise InvalidNamespaceError(f"namespace {namespace}: at most {MAX_DEPTH} labels (each level is one of the "
                                        "memory's tags, and the service keeps at most MAX_MEMORY_TAGS = 20)")
        if not isinstance(op.key, str):
            raise TypeError(f"key must be a string, not {type(op.key).__name__}")
        address = _address(namespace, op.key)
        if len(address) > TITLE_CHARS:
            raise ValueError(f"namespace and key take {len(address)} characters as the memory's title "
                             f"({address[:60]}...); the service keeps at most {TITLE_CHARS}")
        memory_id = self._memory_id(address)
        if op.value is None:
            try:
                yield call("memory_delete", self.agent_id, memory_id)
            except NotFoundError:
                pass
            return None
        if op.ttl is not None:
            raise NotImplementedError("TTL is not supported by MemoryServiceStore: the service's retention "
                                      "(STALE_PURGE_DAYS, PURGE_AFTER_DAYS) applies to every memory")
        content = _dumps(op.value)
        tags = self._tags(namespace, indexed=op.index is not False)
        try:
            record = yield call("memory_write", self.agent_id, content=content, namespace=self._namespace_of(namespace),
                                kind=self.kind, title=address, tags=tags, idempotency_key=self._key(address))
        except ConflictError:
            record = None  # stored before with another value
        if record is not None and record.deleted_at is None and sorted(record.tags) == sorted(tags):
            return None  # stored now, or stored before with this very value
        if record is not None and record.deleted_at is not None:
            yield call("memory_undelete", self.agent_id, memory_id)
        try:
            yield call("memory_update", self.agent_id, memory_id, content=content, title=address, tags=tags)
        except ConflictError:  # deleted (before this put, or meanwhile): bring it back, then change it
            yield call("memory_undelete", self.agent_id, memory_id)
            yield call("memory_update", self.agent_id, memory_id, content=content, title=address, tags=tags)
        return None

    def _search(self, op: SearchOp) -> Plan[Result]:
        prefix = _labels(op.namespace_prefix, "namespace_prefix")
        if op.limit < 0 or op.offset < 0:
            raise ValueError("limit and offset must be at least 0")
        _check_filter(op.filter)
        if op.limit == 0:
            return []
        if op.query is not None and op.query.strip():
            found: list[SearchItem] = list((yield from self._query_search(op, prefix)))
            return found
        listed: list[SearchItem] = yield from self._listed(op, prefix, [self._prefix_tag(prefix)],
                                                                 op.offset + op.limit)
        return listed[op.offset:]

    def _query_search(self, op: SearchOp, prefix: tuple[str, ...]) -> Plan[list[SearchItem]]:
        assert op.query is not None
        tag = self._prefix_tag(prefix)
        result = yield call("search", self.agent_id, op.query, scope="agent", tags=[tag], top_k=self.search_depth)
        ranked = [hit for hit in result.results if self._hit_matches(hit, prefix, op.filter)]
        page = ranked[op.offset:op.offset + op.limit]
        # The records give updated_at, which a hit has not, and read the memories as get does.
        method = "memory_get" if op.refresh_ttl else "memory_detail"
        answers = yield [call(method, self.agent_id, hit.id) for hit in page]
        items: list[SearchItem] = []
        for hit, answer in zip(page, answers, strict=True):
            if isinstance(answer, NotFoundError):
                continue  # deleted meanwhile
            if isinstance(answer, MemoryApiError):
                raise answer
            record = answer if isinstance(answer, MemoryRecord) else answer.memory
            item = self._record_item(record, score=hit.score, explanation=hit.explanation)
            if item is not None and record.deleted_at is None:
                items.append(item)
        if len(items) < op.limit:
            # Items put with index=False are not ranked: as LangGraph's own stores do, they fill
            # a page the ranked ones leave short, without a score.
            skip = max(0, op.offset - len(ranked))
            unranked = yield from self._listed(op, prefix, [tag, self._noindex_tag()], skip + op.limit - len(items))
            items.extend(unranked[skip:])
        return items

    def _listed(self, op: SearchOp, prefix: tuple[str, ...], tags: list[str],
                wanted: int) -> Plan[list[SearchItem]]:
        """The first ``wanted`` items under ``prefix`` carrying ``tags`` that pass the filter,
        newest first, read page by page."""
        items: list[SearchItem] = []
        cursor: str | None = None
        while len(items) < wanted:
            page = yield call("list_memories", self.agent_id, tags=tags, cursor=cursor, limit=LIST_PAGE)
            for record in page.memories:
                item = self._record_item(record)
                if item is not None and item.namespace[:len(prefix)] == prefix and _matches(item.value, op.filter):
                    items.append(item)
            if (cursor := page.next) is None:
                break
        return items[:wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> Plan[Result]:
        # A path given as one string is one label (PostgresStore reads it so too).
        conditions = tuple(MatchCondition(c.match_type, (c.path,) if isinstance(c.path, str) else tuple(c.path))
                           for c in op.match_conditions or ())
        for condition in conditions:
            if condition.match_type not in ("prefix", "suffix"):
                raise ValueError(f"unknown match type {condition.match_type!r}: prefix or suffix")
            _labels(condition.path, f"{condition.match_type} path")
        if op.max_depth is not None and op.max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        # The longest literal start of a prefix condition narrows the listing to its tag.
        literal = max((_literal_start(c.path) for c in conditions if c.match_type == "prefix"), key=len, default=())
        namespaces: set[tuple[str, ...]] = set()
        cursor: str | None = None
        while True:
            page = yield call("list_memories", self.agent_id, tags=[self._prefix_tag(literal)], cursor=cursor,
                              limit=LIST_PAGE)
            for record in page.memories:
                if (address := _parse_address(record.title)) is not None:
                    namespaces.add(address[0])
            if (cursor := page.next) is None:
                break
        kept = [ns for ns in namespaces if all(_does_match(c, ns) for c in conditions)]
        if op.max_depth is not None:
            kept = list({ns[:op.max_depth] for ns in kept})
        return sorted(kept)[op.offset:op.offset + op.limit]

    # The mapping ---------------------------------------------------------------------------

    def _namespace_of(self, namespace: tuple[str, ...]) -> str:
        user = self.user_of(namespace) if self.user_of is not None else None
        return f"user:{self.agent_id}:{user}" if user else f"agent:{self.agent_id}"

    def _key(self, address: str) -> str:
        return f"{self.name}:{hashlib.sha256(address.encode()).hexdigest()}"

    def _memory_id(self, address: str) -> str:
        return keyed_memory_id(self.agent_id, self._key(address))

    def _prefix_tag(self, prefix: Sequence[str]) -> str:
        if not prefix:
            return self.name
        digest = hashlib.sha256(json.dumps(list(prefix), ensure_ascii=False).encode()).hexdigest()[:16]
        return f"{self.name}:ns{len(prefix)}:{digest}"

    def _noindex_tag(self) -> str:
        return f"{self.name}:noindex"

    def _tags(self, namespace: tuple[str, ...], *, indexed: bool) -> list[str]:
        tags = [self.name, *(self._prefix_tag(namespace[:depth]) for depth in range(1, len(namespace) + 1))]
        return tags if indexed else [*tags, self._noindex_tag()]

    def _hit_matches(self, hit: SearchHit, prefix: tuple[str, ...], filter: dict[str, Any] | None) -> bool:
        address = _parse_address(hit.title)
        return address is not None and address[0][:len(prefix)] == prefix and self._noindex_tag() not in hit.tags \
            and _matches(_loads(hit.content), filter)

    def _record_item(self, record: MemoryRecord, *, score: float | None = None,
                     explanation: Explanation | None = None) -> MemorySearchItem | None:
        """The item a memory of this store holds (None: not one of its items)."""
        address = _parse_address(record.title)
        if address is None or self.name not in record.tags:
            return None
        namespace, key = address
        return MemorySearchItem(namespace, key, _loads(record.content), record.created_at,
                                record.updated_at or record.created_at, score, memory_id=record.id,
                                explanation=explanation)


# Addresses, values and filters ---------------------------------------------------------------

def _labels(namespace: Sequence[Any], what: str) -> tuple[str, ...]:
    if isinstance(namespace, str) or not all(isinstance(label, str) for label in namespace):
        raise InvalidNamespaceError(f"{what} {namespace!r}: a tuple of strings")
    return tuple(namespace)


def _address(namespace: Sequence[str], key: str) -> str:
    return json.dumps([list(namespace), key], ensure_ascii=False, separators=(",", ":"))


def _parse_address(title: str | None) -> tuple[tuple[str, ...], str] | None:
    try:
        parsed = json.loads(title) if title else None
    except ValueError:
        return None
    if isinstance(parsed, list) and len(parsed) == 2 and isinstance(parsed[0], list) and isinstance(parsed[1], str) \
            and all(isinstance(label, str) for label in parsed[0]):
        return tuple(parsed[0]), parsed[1]
    return None


def _dumps(value: Any) -> str:
    if not isinstance(value, dict):
        raise TypeError(f"a store value is a dict, not {type(value).__name__}")
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the value cannot be stored as JSON: {exc}") from None


def _loads(content: str) -> dict[str, Any]:
    """The value a memory holds. Content that is not a JSON object (changed by a memory tool
    outside the store) is read as ``{"content": <text>}``."""
    try:
        value = json.loads(content)
    except ValueError:
        return {"content": content}
    return value if isinstance(value, dict) else {"content": content}


def _literal_start(path: Sequence[str]) -> tuple[str, ...]:
    labels: list[str] = []
    for label in path:
        if label == "*":
            break
        labels.append(label)
    return tuple(labels)


def _does_match(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[:len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(want == "*" or have == want for have, want in zip(part, path, strict=True))


def _check_filter(filter: dict[str, Any] | None) -> None:
    """Refuse operators the filter does not know before anything is read."""
    def walk(condition: Any) -> None:
        if isinstance(condition, dict):
            for name, inner in condition.items():
                if isinstance(name, str) and name.startswith("$") and name not in OPERATORS:
                    raise ValueError(f"filter operator {name!r}: one of {', '.join(OPERATORS)}")
                walk(inner)
    if filter is not None and not isinstance(filter, dict):
        raise TypeError(f"filter is a dict, not {type(filter).__name__}")
    walk(filter)


def _matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether ``value`` passes ``filter``: each field equal to the filter's value (nested
    objects field by field, lists element by element), or passing its operators ($eq, $ne,
    $gt, $gte, $lt, $lte; the order ones compare numbers, and a field that is missing or not
    a number fails them)."""
    return not filter or all(_compare(value.get(name), wanted) for name, wanted in filter.items())


def _compare(have: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(have, op, operand) for op, operand in wanted.items())
        return isinstance(have, dict) and all(_compare(have.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return isinstance(have, (list, tuple)) and len(have) == len(wanted) and \
            all(_compare(h, w) for h, w in zip(have, wanted, strict=True))
    return bool(have == wanted)


def _operator(have: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(have == operand)
    if op == "$ne":
        return bool(have != operand)
    a, b = _number(have), _number(operand)
    if a is None or b is None:
        return False
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number
