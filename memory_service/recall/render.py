"""Rendering the memory context: an escaped XML block that always fits its budget.

``render_context`` is pure: it takes what the caller already fetched and returns the
block, in the element order DESIGN.md fixes::

    <MemoryContext>
      <StartupRecords><Record priority="P0" title="...">...</Record></StartupRecords>
      <CollectiveMemory>
        <MemoryShard name="...">
          <ConsolidatedMemory>...</ConsolidatedMemory>
          <Facts><Fact>...</Fact></Facts>
          <RecentSuggestions><Suggestion>...</Suggestion></RecentSuggestions>
        </MemoryShard>
      </CollectiveMemory>
      <UserMemory>
        <User id="..."><ConsolidatedMemory/><Directives><Directive/></Directives></User>
      </UserMemory>
      <CurrentConversationContext><Episode>...</Episode></CurrentConversationContext>
      <KnownFacts as_of="..."><Fact about="..." valid_at="..." invalid_at="...">...</Fact></KnownFacts>
      <RelevantMemories><Memory kind="..." date="..." age="...">...</Memory></RelevantMemories>
    </MemoryContext>

``<KnownFacts>`` holds facts of the knowledge graph (docs/graph.md): those of the entities
the query names, then the requesting user's own (about the user's person entity); current
ones, or with ``as_of`` (the container says when) those true then. ``valid_at`` is when a
fact became true (left out when unknown), ``invalid_at`` when it stopped (only shown for a
fact true at ``as_of`` that later changed).

Empty sections and containers are left out; with nothing to show the block is
``<MemoryContext/>``. All text is escaped and characters XML 1.0 forbids are removed,
so no memory can close, forge or break an element.

Budget: ``len(xml) <= budget_chars`` always (newlines and indentation included). The
minimum budget is 64 characters; below that ``render_context`` raises ValueError. Items
are kept greedily in this priority order, highest first:

1. the agent's P0 (identity), then P1 (operating rules) startup records;
2. the most recent episode;
3. the query-relevant memories (best first; the first ``RECENT_ITEMS`` of them);
4. the facts of the query's entities (the first ``RECENT_ITEMS``);
5. the requesting user's consolidated memory;
6. the requesting user's most recent directives;
7. the user's own facts (the first ``RECENT_ITEMS``);
8. the P2 (behaviour) startup records;
9. the shards' consolidated memories;
10. the other query-relevant memories, best first;
11. the most recent facts (round-robin over shards);
12. the other recent episodes;
13. the recent suggestions (round-robin over shards);
14. the other users' consolidated memories and recent directives;
15. the P3 (reference) startup records;
16. older items of every list (beyond the ``RECENT_ITEMS`` newest), newest first,
    round-robin over the lists in the order above.

"Recent" means among the ``RECENT_ITEMS`` newest of its list. Within one list the oldest
items go first: once an item of a list is left out, every older item of it is too. The
relevant memories and the startup records are the exception (a startup record is kept
whole or not at all, and one that does not fit leaves the room to a shorter one; all of a
priority rank in its tier, whatever their count): the relevant memories come already shaped (the best in full, the next
as snippets, the rest as one-line references, see ``RelevantItem``), and a shorter one
further down still takes the room a longer one left, so unused budget is carried forward.
Every relevant memory shows its date and age.

The known facts have a share of the budget, ``FACTS_SHARE`` (a fifth): their lines (and
their container's) never take more, so the facts of an entity-rich query cannot crowd out
the memories that say more than a fact. A fact is kept whole or not at all (half a fact can
state a falsehood), and one that does not fit leaves the room to a shorter one. The user's
own facts come without a query match, so they rank lower (after the user's directives) and
are few (the assembler passes at most ``OWN_FACTS``): a principle, not a measurement. An item too long for the room left is cut
with an ellipsis if at least ``MIN_TRUNCATED_CHARS`` of it fit. Sizes are computed incrementally (an item's line, plus the open and close lines of its
containers the first time one of their items is kept), so rendering is O(n log n).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from itertools import count
from typing import TypeGuard
from xml.sax.saxutils import escape, quoteattr

from memory_service.domain.models import Memory, MemoryKind

MIN_BUDGET_CHARS = 64
RECENT_ITEMS = 5
FACTS_SHARE = 0.2  # of the budget, at most, for <KnownFacts>
MIN_TRUNCATED_CHARS = 40
ELLIPSIS = "…"
EMPTY = "<MemoryContext/>"
_INDENT = "  "

# Everything outside XML 1.0's Char production: C0 controls but \t \n \r, lone
# surrogates, U+FFFE and U+FFFF.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class ShardContext:
    shard_id: str
    name: str
    facts: Sequence[Memory] = ()  # oldest first
    suggestions: Sequence[Memory] = ()  # oldest first
    consolidated: str | None = None


@dataclass(frozen=True)
class UserContext:
    user_id: str
    directives: Sequence[Memory] = ()  # oldest first
    consolidated: str | None = None


@dataclass(frozen=True)
class RelevantItem:
    """A query-relevant memory as the block shows it: in full, a snippet, or a reference."""

    kind: MemoryKind
    valid_at: datetime
    text: str

    @classmethod
    def whole(cls, memory: Memory) -> RelevantItem:
        return cls(memory.kind, memory.valid_at, memory.content)


@dataclass(frozen=True)
class FactItem:
    """A fact of the knowledge graph as the block shows it."""

    text: str
    about: str  # the name of the entity it was found through
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    own: bool = False  # about the requesting user, shown without a query match


@dataclass(frozen=True)
class StartupItem:
    """A startup record as the block shows it (memory_service/recall/startup.py)."""

    priority: int  # 0 (identity) to 3 (reference)
    title: str
    content: str


@dataclass(frozen=True)
class ContextInputs:
    shards: Sequence[ShardContext] = ()
    users: Sequence[UserContext] = ()  # the requesting user first
    episodes: Sequence[Memory] = ()  # the session's recent episodes, oldest first
    relevant: Sequence[RelevantItem] = ()  # query-relevant memories, best first
    startup: Sequence[StartupItem] = ()  # the agent's startup records, in the order shown
    facts: Sequence[FactItem] = ()  # the query's entities' facts (best first), then the user's own
    facts_as_of: datetime | None = None  # the facts are those true then (None: current ones)


@dataclass(frozen=True)
class RenderedContext:
    xml: str
    chars: int  # len(xml)
    budget: int
    sections: dict[str, int]  # items kept per section: startup, collective, user, conversation, facts, relevant
    dropped: int  # items left out to fit the budget
    source: str = ""  # where the memories came from: graph, mongo, cache, last-good, none


def clean(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot carry."""
    return _NOT_XML.sub("", text)


def _escape_text(text: str) -> str:
    # \r as a reference: a literal one would be normalised to \n by any XML parser.
    return escape(text, {"\r": "&#13;"})


def _shown(consolidated: str | None) -> TypeGuard[str]:
    return bool(consolidated and clean(consolidated).strip())


def _attr(value: str) -> str:
    # Always double-quoted (quoteattr would switch to single quotes around a '"').
    return quoteattr(clean(value), {'"': "&quot;"})


class _Node:
    """A container element; its open and close lines count once, when first opened."""

    def __init__(self, parent: _Node | None, tag: str, attrs: str = "") -> None:
        self.parent = parent
        self.depth: int = parent.depth + 1 if parent else 0
        pad = _INDENT * self.depth
        self.open = f"{pad}<{tag}{attrs}>\n"
        # The root's close line ends the document, so it carries no newline.
        self.close = f"{pad}</{tag}>" + ("\n" if parent else "")
        self.children: list[_Node | _Item] = []
        self.opened = False
        if parent:
            parent.children.append(self)

    def unopened_overhead(self) -> int:
        node: _Node | None = self
        total = 0
        while node and not node.opened:
            total += len(node.open) + len(node.close)
            node = node.parent
        return total

    def mark_opened(self) -> None:
        node: _Node | None = self
        while node and not node.opened:
            node.opened = True
            node = node.parent


@dataclass(eq=False)
class _Item:
    parent: _Node
    tag: str
    attrs: str
    text: str  # already cleaned
    section: str
    group: int  # the list it belongs to, for "drop oldest first"
    line: str | None = None  # set when kept

    def __post_init__(self) -> None:
        self.parent.children.append(self)
        pad = _INDENT * (self.parent.depth + 1)
        self._head = f"{pad}<{self.tag}{self.attrs}>"
        self._tail = f"</{self.tag}>\n"

    def render(self, body: str) -> str:
        return self._head + body + self._tail

    def shell(self) -> int:
        return len(self._head) + len(self._tail)


def _truncate(text: str, room: int) -> str | None:
    """The escaped longest prefix of ``text`` that, with an ellipsis, fits ``room``."""
    if room < MIN_TRUNCATED_CHARS + len(ELLIPSIS):
        return None
    out, used = [], len(ELLIPSIS)
    for char in text:
        piece = _escape_text(char)
        if used + len(piece) > room:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out).rstrip() + ELLIPSIS


def age(then: datetime, now: datetime) -> str:
    """``then`` relative to ``now``, e.g. "just now", "1 hour ago", "3 days ago"."""
    seconds = int((now - then).total_seconds())
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("day", 86400),
                       ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"  # also for the (clock-skewed) future


def memory_date(moment: datetime) -> str:
    """The date a memory shows, so that questions about when can be answered."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


# Tiers, in the priority order the module docstring lists.
(_STARTUP_P0, _STARTUP_P1, _LATEST_EPISODE, _RELEVANT, _QUERY_FACTS, _USER_CONSOLIDATED, _USER_DIRECTIVES,
 _OWN_FACTS, _STARTUP_P2, _SHARD_CONSOLIDATED, _RELEVANT_MORE, _FACTS, _EPISODES, _SUGGESTIONS, _OTHER_USERS,
 _STARTUP_P3, _OLDER) = range(17)
_STARTUP_TIERS = (_STARTUP_P0, _STARTUP_P1, _STARTUP_P2, _STARTUP_P3)
# Sections whose items are kept each on its own merit: one that does not fit leaves the
# room to a shorter one after it (in every other list, the older items go with it).
_SKIPPING = ("relevant", "startup", "facts")
# Sections whose items are kept whole or not at all.
_WHOLE = ("startup", "facts")


def render_context(inputs: ContextInputs, budget_chars: int, now: datetime | None = None) -> RenderedContext:
    if budget_chars < MIN_BUDGET_CHARS:
        raise ValueError(f"the context budget must be at least {MIN_BUDGET_CHARS} characters, got {budget_chars}")
    now = now or datetime.now(UTC)
    now = now if now.tzinfo else now.replace(tzinfo=UTC)

    # Build the full tree in document order, and each item's priority key beside it.
    root = _Node(None, "MemoryContext")
    ranked: list[tuple[tuple[int, int, int, int], _Item]] = []
    groups = count()  # one id per list, for "drop oldest first" and as the last tie-breaker

    def add(parent: _Node, tag: str, texts: Sequence[str], section: str, tier: int,
            newest_first: bool = False, attrs: Sequence[str] = (), first_tier: int | None = None,
            later_tier: int = _OLDER) -> None:
        group = next(groups)
        for pos, text in enumerate(texts):
            rank = pos if newest_first else len(texts) - 1 - pos  # 0 = the newest (or the best)
            item = _Item(parent, tag, attrs[pos] if attrs else "", clean(text), section, group)
            item_tier = first_tier if rank == 0 and first_tier is not None else tier
            # Equal ranks across lists (round-robin) are broken by the list's own tier, so
            # older items of every list go in the docstring's order too.
            ranked.append(((item_tier if rank < RECENT_ITEMS else later_tier, rank, tier, group), item))

    startup = _Node(root, "StartupRecords")
    collective = _Node(root, "CollectiveMemory")
    user_memory = _Node(root, "UserMemory")
    conversation = _Node(root, "CurrentConversationContext")
    facts_node = _Node(root, "KnownFacts", f" as_of={_attr(memory_date(inputs.facts_as_of))}" if inputs.facts_as_of else "")
    relevant_node = _Node(root, "RelevantMemories")

    add(conversation, "Episode", [m.content for m in inputs.episodes], "conversation",
        _EPISODES, first_tier=_LATEST_EPISODE)
    add(relevant_node, "Memory", [r.text for r in inputs.relevant], "relevant", _RELEVANT,
        newest_first=True, later_tier=_RELEVANT_MORE,
        attrs=[f" kind={_attr(r.kind.value)} date={_attr(memory_date(r.valid_at))}"
               f" age={_attr(age(r.valid_at, now))}" for r in inputs.relevant])

    for own, tier in ((False, _QUERY_FACTS), (True, _OWN_FACTS)):
        facts = [f for f in inputs.facts if f.own is own]
        add(facts_node, "Fact", [f.text for f in facts], "facts", tier, newest_first=True,
            attrs=[f" about={_attr(f.about)}" + (f" valid_at={_attr(memory_date(f.valid_at))}" if f.valid_at else "")
                   + (f" invalid_at={_attr(memory_date(f.invalid_at))}" if f.invalid_at else "") for f in facts])

    for priority, tier in enumerate(_STARTUP_TIERS):
        records = [r for r in inputs.startup if r.priority == priority]
        add(startup, "Record", [r.content for r in records], "startup", tier, newest_first=True, later_tier=tier,
            attrs=[f" priority={_attr(f'P{priority}')} title={_attr(r.title)}" for r in records])

    for index, user in enumerate(inputs.users):
        node = _Node(user_memory, "User", f" id={_attr(user.user_id)}")
        requesting = index == 0
        if _shown(user.consolidated):
            add(node, "ConsolidatedMemory", [user.consolidated], "user",
                _USER_CONSOLIDATED if requesting else _OTHER_USERS)
        add(_Node(node, "Directives"), "Directive", [m.content for m in user.directives], "user",
            _USER_DIRECTIVES if requesting else _OTHER_USERS)

    for shard in inputs.shards:
        node = _Node(collective, "MemoryShard", f" name={_attr(shard.name)}")
        if _shown(shard.consolidated):
            add(node, "ConsolidatedMemory", [shard.consolidated], "collective", _SHARD_CONSOLIDATED)
        add(_Node(node, "Facts"), "Fact", [m.content for m in shard.facts], "collective", _FACTS)
        add(_Node(node, "RecentSuggestions"), "Suggestion", [m.content for m in shard.suggestions],
            "collective", _SUGGESTIONS)

    # Keep greedily in priority order, counting the exact size as we go.
    size = dropped = facts_size = 0
    facts_room = int(budget_chars * FACTS_SHARE)
    closed: set[int] = set()  # lists that already lost an item: their older items go too
    sections = {"startup": 0, "collective": 0, "user": 0, "conversation": 0, "facts": 0, "relevant": 0}
    for _, item in sorted(ranked, key=lambda entry: entry[0]):
        if item.group in closed:
            dropped += 1
            continue
        room = budget_chars - size - item.parent.unopened_overhead()
        # The facts' share counts their lines and their own container, not the root's.
        own_overhead = 0 if item.parent.opened else len(item.parent.open) + len(item.parent.close)
        if item.section == "facts":
            room = min(room, facts_room - facts_size - own_overhead)
        line = item.render(_escape_text(item.text))
        if len(line) > room:
            if item.section not in _SKIPPING:
                closed.add(item.group)
            # A startup record or a fact is given whole or not at all: half a rule can mislead.
            body = None if item.section in _WHOLE else _truncate(item.text, room - item.shell())
            if body is None:
                dropped += 1
                continue
            line = item.render(body)
        if item.section == "facts":
            facts_size += len(line) + own_overhead
        size += len(line) + item.parent.unopened_overhead()
        item.parent.mark_opened()
        item.line = line
        sections[item.section] += 1

    xml = "".join(_emit(root)) if root.opened else EMPTY
    # The incremental count must equal the real length; the budget guarantee rests on it.
    if len(xml) != (size or len(EMPTY)) or len(xml) > budget_chars:
        raise AssertionError(f"context renderer miscounted: {len(xml)} chars, counted {size}, budget {budget_chars}")
    return RenderedContext(xml=xml, chars=len(xml), budget=budget_chars, sections=sections, dropped=dropped)


def _emit(node: _Node) -> Iterator[str]:
    yield node.open
    for child in node.children:
        if isinstance(child, _Node):
            if child.opened:
                yield from _emit(child)
        elif child.line is not None:
            yield child.line
    yield node.close


def budget_for_model(model: str | None, default: int, overrides: Mapping[str, int]) -> int:
    """The budget of the first ``overrides`` pattern (fnmatch, case-insensitive) matching ``model``."""
    if model is None:
        return default
    name = model.casefold()
    for pattern, budget in overrides.items():
        if fnmatchcase(name, pattern.casefold()):
            return budget
    return default
