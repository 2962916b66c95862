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
      <RelevantMemories><Memory kind="..." date="..." also="...">...</Memory></RelevantMemories>
    </MemoryContext>

``<KnownFacts>`` holds facts of the knowledge graph (docs/graph.md): those of the entities
the query names, then the requesting user's own (about the user's person entity); current
ones, or with ``as_of`` (the container says when) those true then. ``valid_at`` is when a
fact became true (left out when unknown), ``invalid_at`` when it stopped (only shown for a
fact true at ``as_of`` that later changed).

Empty sections and containers are left out; with nothing to show the block is
``<MemoryContext/>``. All text is escaped and characters XML 1.0 forbids are removed,
so no memory can close, forge or break an element.

Budget: ``len(xml) <= budget_chars`` always (newlines and indentation included): a
ceiling, not a target (the assembler leaves out what falls below the relevance threshold,
and an empty list shows nothing). The minimum budget is 64 characters; below that
``render_context`` raises ValueError. Items are kept greedily in a priority order, highest
first. Without a query (``ContextInputs.asked`` False):

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

With a query, the sections compete by relevance: the agent's P0 and P1 records, then an
**allowance** (``ALLOWANCE_SHARE`` of the budget, 15 %) for what says how to act and where
the conversation stands: the requesting user's consolidated memory and directives, then the
latest episode (up to half the allowance is held for it until it comes, and it is shortened,
never dropped, when it does not fit). What does not fit the allowance comes back after the
relevant memories. Then what matches the query (its entities' facts, then every relevant
memory, best first), then the background in the order above (the user's own facts, the
shards' consolidated memories, ...): ``_ASKED_ORDER``.

"Recent" means among the ``RECENT_ITEMS`` newest of its list. Within one list the oldest
items go first: once an item of a list is left out, every older item of it is too. The
relevant memories and the startup records are the exception (a startup record is kept
whole or not at all, and one that does not fit leaves the room to a shorter one; all of a
priority rank in its tier, whatever their count).

**The relevant memories share a sliding budget** (seed 002's accordion): when the first of
them comes, the room left is theirs; each gets a share of what remains in proportion to its
search score among the ones still to come, and what a short one leaves goes to the next. One
of at most ``WHOLE_CHARS`` characters (or of at most its share; the best of them, of at most
half the room) is shown whole or not at all:
one that does not fit leaves the room to a shorter one after it (a message cut to its share
loses what it said). A longer one shows its **passage** (``passage``): the sentence that holds
the most of the query's words, with its neighbours before and after while they fit whole, in
its share (at least ``MIN_EXCERPT_CHARS``), with an ellipsis where the text goes on.
Each shows its ``date`` (the day, UTC) and its ``kind`` unless it is a message: about 40
characters of markup an item, half what a kind, a minute and an age cost.

**Each thing once.** A sentence (of ``MIN_DUPLICATE_WORDS`` words or more; a message's
"speaker: " prefix aside) is shown once where it can be: an item one kept item shows all
of is left out as a duplicate, and its form (message, directive, episode, fact...) is named
in the keeping item's ``also`` attribute. The priority order decides which form is kept (with
a query: the allowance's directives and episode, then the query's facts, then search's
rank). Two exceptions keep every item whole: an item is never split across elements (one
whose sentences are shown by several items, or partly, is shown whole), and a directive, a
fact or a suggestion is never folded into a composite (an episode or a consolidated memory
that happens to show it). Only a composite shows its sentences not shown already, an
ellipsis where the others were.

The known facts have a share of the budget, ``FACTS_SHARE`` (a fifth): their lines (and
their container's) never take more, so the facts of an entity-rich query cannot crowd out
the memories that say more than a fact. A fact is kept whole or not at all (half a fact can
state a falsehood), and one that does not fit leaves the room to a shorter one. The user's
own facts come without a query match, so they rank lower (after the user's directives) and
are few (the assembler passes at most ``OWN_FACTS``): a principle, not a measurement. An item too long for the room left is cut
with an ellipsis if at least ``MIN_TRUNCATED_CHARS`` of it fit. Sizes are computed incrementally (an item's line, plus the open and close lines of its
containers the first time one of their items is kept), so rendering is O(n log n).

``RenderedContext.left_out`` counts what was left out: ``duplicate`` and ``over_budget``
here, ``below_threshold`` by the assembler.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from functools import lru_cache
from itertools import count
from typing import Any, TypeGuard
from xml.sax.saxutils import escape, quoteattr, unescape

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
    text: str  # whole: the renderer cuts it to its share of the budget
    score: float = 1.0  # the search's score (0 to 1]: the item's weight in the sliding budget
    terms: tuple[str, ...] = ()  # the query's words: a cut item keeps the text around them
    expires_at: datetime | None = None  # the memory's (a cached block showing it lives no longer)

    @classmethod
    def whole(cls, memory: Memory) -> RelevantItem:
        return cls(memory.kind, memory.valid_at, memory.content, expires_at=memory.expires_at)


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
    asked: bool = False  # the block answers a query: what matches it comes before the background


@dataclass(frozen=True)
class RenderedContext:
    xml: str
    chars: int  # len(xml)
    budget: int
    sections: dict[str, int]  # items kept per section: startup, collective, user, conversation, facts, relevant
    dropped: int  # items left out to fit the budget
    source: str = ""  # where the memories came from: graph, mongo, cache, last-good, none
    # Candidates left out, by why: below_threshold (the assembler's), duplicate, over_budget.
    left_out: dict[str, int] = field(default_factory=dict)
    recall: dict[str, Any] | None = None  # the resolved recall settings (the assembler's)


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
    form: str = ""  # what it is, named in the ``also`` of an item that shows its content
    weight: float = 1.0  # a relevant item's score: its share of the sliding budget
    terms: tuple[str, ...] = ()  # a relevant item's query words: its cut keeps them
    tier_name: str = ""  # the tier it is kept in (the priority order's name)
    line: str | None = None  # set when kept
    body: str = ""  # the escaped text of ``line``
    also: tuple[str, ...] = ()  # the forms of left-out duplicates whose content it shows

    def __post_init__(self) -> None:
        self.parent.children.append(self)
        self._pad = _INDENT * (self.parent.depth + 1)
        self._tail = f"</{self.tag}>\n"

    def render(self, body: str, also: tuple[str, ...] = ()) -> str:
        folded = f" also={_attr(' '.join(also))}" if also else ""
        return f"{self._pad}<{self.tag}{self.attrs}{folded}>{body}{self._tail}"

    def shell(self) -> int:
        return len(self.render(""))


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


def item_date(moment: datetime) -> str:
    """The date a relevant memory shows: the day (the block's items are seldom about the hour)."""
    return moment.astimezone(UTC).date().isoformat()  # as strftime("%Y-%m-%d"), in a fifth of its time


def memory_date(moment: datetime) -> str:
    """The date a memory shows, so that questions about when can be answered."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


# The block's lists, and the order they are kept in: without a query, the docstring's;
# with one, what matches the query comes before the background (``_ASKED_ORDER``).
_RECENT_ORDER = ("startup_p0", "startup_p1", "latest_episode", "relevant", "query_facts", "user_consolidated",
                 "user_directives", "own_facts", "startup_p2", "shard_consolidated", "relevant_more", "facts",
                 "episodes", "suggestions", "other_users", "startup_p3", "older")
_ASKED_ORDER = ("startup_p0", "startup_p1", "user_consolidated", "user_directives", "latest_episode", "query_facts",
                "relevant", "relevant_more", "own_facts", "startup_p2", "shard_consolidated", "facts",
                "episodes", "suggestions", "other_users", "startup_p3", "older")
# With a query, these tiers are kept within the allowance (ALLOWANCE_SHARE); what does not fit
# it comes back after the relevant memories (before ``own_facts``).
_ALLOWANCE_TIERS = ("user_consolidated", "user_directives", "latest_episode")
_STARTUP_TIERS = ("startup_p0", "startup_p1", "startup_p2", "startup_p3")
# Sections whose items are kept each on its own merit: one that does not fit leaves the
# room to a shorter one after it (in every other list, the older items go with it).
_SKIPPING = ("relevant", "startup", "facts")
# Sections whose items are kept whole or not at all.
_WHOLE = ("startup", "facts")
# A relevant item no longer than this is shown whole, whatever its share, when it fits the
# room left (a message cut to its share loses what it said); one that does not fit leaves the
# room to a shorter one after it. About the longest user turn of a chat (LongMemEval's user
# turns: median 285, p90 416 characters; an assistant's answers run to thousands).
WHOLE_CHARS = 800
# A longer one shows its passage: the sentences that hold the query's words, with their
# neighbours, in its share, never below this many characters (a share too small to say
# anything would take the room of a next item's whole text). Measured against 600 on both
# benchmarks' captured blocks (bench/block_replay.py): a bigger floor lets long assistant
# replies crowd out the short user turns that hold the evidence.
MIN_EXCERPT_CHARS = 200
# The best relevant memory is shown whole up to this share of the relevant room (a long
# answer is most often the one asked about; 0.35 to 0.75 measured alike, 0 worse).
BEST_WHOLE_SHARE = 0.5
# With a query, the background that says how to act and where the conversation stands (the
# latest episode, the requesting user's consolidated memory and directives) is kept first,
# but only within this share of the budget; the rest of it competes after the query's facts
# and relevant memories, like the other background.
ALLOWANCE_SHARE = 0.15
# Forms that gather several things said (a window's episode, a consolidation): one may show
# only its sentences not shown already. Every other form is one thing said, shown whole or
# left out as a duplicate of one item that shows all of it: never split across elements.
_COMPOSITE_FORMS = frozenset({"episode", "consolidated", "consolidatedmemory"})
# A composite that shows all of a thing said (a message, an episode) carries it; a directive,
# a fact or a suggestion is kept in its own form even then (how to act is not a summary).
_SAID_FORMS = frozenset({"message", "episode", "observation"})
# A sentence of fewer words is never a duplicate ("Thanks!" said twice is not repetition).
MIN_DUPLICATE_WORDS = 3
SENTENCES_CACHED = 4096  # texts whose sentences are kept (a few MB)
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")
_WORDS = re.compile(r"\w+")
_SPEAKER = re.compile(r"^\s*[^\s:<>]{1,40}:\s")


@lru_cache(maxsize=SENTENCES_CACHED)
def _sentences(text: str) -> tuple[tuple[str, str | None], ...]:
    """``text``'s sentences, each with its key for "shown already" (None: too short to count).
    A message's "speaker: " prefix is not part of the key: the directive formed from it is
    the same sentence.

    Cached: the regular expressions cost about 25 µs for a 200-character text (a quarter
    of the renderer's time), and a session's blocks show the same texts turn after turn
    (its episodes, its users' directives, facts, the memories a conversation keeps finding)."""
    out: list[tuple[str, str | None]] = []
    for piece in _SENTENCE_END.split(text):
        if not piece.strip():
            continue
        words = _WORDS.findall(_SPEAKER.sub("", piece, count=1).casefold())
        out.append((piece.strip(), " ".join(words) if len(words) >= MIN_DUPLICATE_WORDS else None))
    return tuple(out)


def excerpt(text: str, terms: Sequence[str], chars: int) -> str:
    """``text`` cut to at most ``chars`` characters around its first matching term, at word
    boundaries, with an ellipsis at each cut end (whole when short enough)."""
    if len(text) <= chars:
        return text
    lowered = text.lower()
    positions = [p for t in terms if (p := lowered.find(t)) >= 0]
    center = min(positions) if positions else 0
    room = chars - 2 * len(ELLIPSIS)
    start = max(0, min(center - room // 3, len(text) - room))
    if start:  # start at a word
        space = text.find(" ", start, center if center > start else start + room // 4)
        start = space + 1 if space >= 0 else start
    end = min(len(text), start + room)
    if end < len(text):  # end at a word
        space = text.rfind(" ", start + room // 2, end)
        end = space if space > 0 else end
    return (ELLIPSIS if start else "") + text[start:end].strip() + (ELLIPSIS if end < len(text) else "")


def render_context(inputs: ContextInputs, budget_chars: int, now: datetime | None = None) -> RenderedContext:
    if budget_chars < MIN_BUDGET_CHARS:
        raise ValueError(f"the context budget must be at least {MIN_BUDGET_CHARS} characters, got {budget_chars}")
    now = now or datetime.now(UTC)
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    tier_of = {name: i for i, name in enumerate(_ASKED_ORDER if inputs.asked else _RECENT_ORDER)}

    # Build the full tree in document order, and each item's priority key beside it.
    root = _Node(None, "MemoryContext")
    ranked: list[tuple[tuple[int, int, int, int], _Item]] = []
    groups = count()  # one id per list, for "drop oldest first" and as the last tie-breaker

    def add(parent: _Node, tag: str, texts: Sequence[str], section: str, tier: str,
            newest_first: bool = False, attrs: Sequence[str] = (), first_tier: str | None = None,
            later_tier: str = "older", forms: Sequence[str] = (), weights: Sequence[float] = (),
            terms: Sequence[tuple[str, ...]] = ()) -> None:
        group = next(groups)
        for pos, text in enumerate(texts):
            rank = pos if newest_first else len(texts) - 1 - pos  # 0 = the newest (or the best)
            name = first_tier if rank == 0 and first_tier is not None else tier
            item = _Item(parent, tag, attrs[pos] if attrs else "", clean(text), section, group,
                         form=forms[pos] if forms else tag.lower(), weight=weights[pos] if weights else 1.0,
                         terms=terms[pos] if terms else (), tier_name=name)
            item_tier = tier_of[name]
            # Equal ranks across lists (round-robin) are broken by the list's own tier, so
            # older items of every list go in the docstring's order too.
            ranked.append(((item_tier if rank < RECENT_ITEMS else tier_of[later_tier], rank, tier_of[tier], group),
                           item))

    startup = _Node(root, "StartupRecords")
    collective = _Node(root, "CollectiveMemory")
    user_memory = _Node(root, "UserMemory")
    conversation = _Node(root, "CurrentConversationContext")
    facts_node = _Node(root, "KnownFacts", f" as_of={_attr(memory_date(inputs.facts_as_of))}" if inputs.facts_as_of else "")
    relevant_node = _Node(root, "RelevantMemories")

    add(conversation, "Episode", [m.content for m in inputs.episodes], "conversation",
        "episodes", first_tier="latest_episode")
    # A relevant memory says its date; its kind unless it is a message (most are).
    add(relevant_node, "Memory", [r.text for r in inputs.relevant], "relevant", "relevant",
        newest_first=True, later_tier="relevant_more",
        attrs=[(f" kind={_attr(r.kind.value)}" if r.kind is not MemoryKind.MESSAGE else "")
               + f" date={_attr(item_date(r.valid_at))}" for r in inputs.relevant],
        forms=[r.kind.value for r in inputs.relevant], weights=[max(r.score, 1e-6) for r in inputs.relevant],
        terms=[r.terms for r in inputs.relevant])

    for own, tier in ((False, "query_facts"), (True, "own_facts")):
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
                "user_consolidated" if requesting else "other_users")
        # With a query, every directive of the requesting user says how to act: all before the matches.
        add(_Node(node, "Directives"), "Directive", [m.content for m in user.directives], "user",
            "user_directives" if requesting else "other_users",
            later_tier="user_directives" if requesting and inputs.asked else "older")

    for shard in inputs.shards:
        node = _Node(collective, "MemoryShard", f" name={_attr(shard.name)}")
        if _shown(shard.consolidated):
            add(node, "ConsolidatedMemory", [shard.consolidated], "collective", "shard_consolidated")
        add(_Node(node, "Facts"), "Fact", [m.content for m in shard.facts], "collective", "facts")
        add(_Node(node, "RecentSuggestions"), "Suggestion", [m.content for m in shard.suggestions],
            "collective", "suggestions")

    # Keep greedily in priority order, counting the exact size as we go.
    size = dropped = duplicates = facts_size = allowance_size = 0
    facts_room = int(budget_chars * FACTS_SHARE)
    allowance_room = int(budget_chars * ALLOWANCE_SHARE) if inputs.asked else None
    allowance_tiers = {tier_of[t] for t in _ALLOWANCE_TIERS} if inputs.asked else set()
    # The relevant memories share what is left when the first of them comes: each its part of
    # the rest by its score; what a short one leaves goes to the next (the sliding budget).
    relevant_room: int | None = None
    best = True  # the next relevant memory is the best
    relevant_weight = sum(item.weight for _, item in ranked if item.section == "relevant")
    shown_in: dict[str, list[_Item]] = {}  # each sentence key shown, and the items showing it whole
    closed: set[int] = set()  # lists that already lost an item: their older items go too
    sections = {"startup": 0, "collective": 0, "user": 0, "conversation": 0, "facts": 0, "relevant": 0}
    deferred: list[_Item] = []  # allowance items that did not fit the allowance
    # Within the allowance the latest episode comes last (it shows what the directives do not)
    # but keeps its room: up to half the allowance is held for it until it comes.
    latest = next((item for _, item in ranked if item.tier_name == "latest_episode"), None)
    reserve = min(latest.shell() + len(latest.text) + len(conversation.open) + len(conversation.close),
                  allowance_room // 2) if latest is not None and allowance_room is not None else 0

    def in_order() -> Iterator[tuple[_Item, bool]]:
        """Every item in priority order, each with whether it is within the allowance; the
        items deferred from the allowance come back after the relevant memories."""
        back_at = tier_of["own_facts"]
        pending = True
        for key, item in sorted(ranked, key=lambda entry: entry[0]):
            if pending and key[0] >= back_at:
                pending = False
                yield from ((d, False) for d in deferred)
            yield item, key[0] in allowance_tiers
        if pending:
            yield from ((d, False) for d in deferred)

    for item, allowed in in_order():
        if item.group in closed:
            dropped += 1
            continue
        # Each thing once: an item one kept item shows all of is left out, its form folded
        # into that item's ``also``. A composite (an episode, a consolidation) that repeats
        # some sentences shows the rest; any other item is shown whole (never split).
        sentences = _sentences(item.text)
        keys = [key for _, key in sentences if key]
        holder = _holder(keys, shown_in, absorbs=item.form in _SAID_FORMS)
        if holder is not None:
            duplicates += 1
            if item.section == "relevant":
                relevant_weight -= item.weight
            if item.form != holder.form and item.form not in holder.also and holder.line is not None:
                folded = holder.render(holder.body, (*holder.also, item.form))
                grown = len(folded) - len(holder.line)
                # Within the budget, and a fact within the facts' share too.
                if size + grown <= budget_chars and (holder.section != "facts" or facts_size + grown <= facts_room):
                    size += grown
                    facts_size += grown if holder.section == "facts" else 0
                    holder.line, holder.also = folded, (*holder.also, item.form)
            continue
        text = item.text
        if item.form in _COMPOSITE_FORMS and any(key in shown_in for key in keys):
            text = f" {ELLIPSIS} ".join(piece for piece, key in sentences if key is None or key not in shown_in)
        room = budget_chars - size - item.parent.unopened_overhead()
        # The facts' share counts their lines and their own container, not the root's.
        own_overhead = 0 if item.parent.opened else len(item.parent.open) + len(item.parent.close)
        if item.section == "facts":
            room = min(room, facts_room - facts_size - own_overhead)
        if allowed and allowance_room is not None:  # its lines and containers, not the root's
            reserve = 0 if item is latest else reserve
            room = min(room, allowance_room - allowance_size - reserve - item.parent.unopened_overhead()
                       + (0 if root.opened else len(root.open) + len(root.close)))
        body = _escape_text(text)  # escaped once: its length sizes the relevant room, then the line
        passage = False
        if item.section == "relevant":
            if relevant_room is None:
                relevant_room = room
            share = int(relevant_room * item.weight / relevant_weight) if relevant_weight > 0 else relevant_room
            relevant_weight -= item.weight
            # The best is shown whole up to half the room (a long answer is most often the one
            # asked about); any other up to WHOLE_CHARS or its share.
            whole_up_to = max(WHOLE_CHARS, share, int(relevant_room * BEST_WHOLE_SHARE) if best else 0)
            best = False
            if len(text) > whole_up_to:  # long: its passage, in its share
                passage = True
                room = min(room, item.shell() + max(share, MIN_EXCERPT_CHARS))
        line = item.render(body)
        if len(line) > room:
            if allowed and item.tier_name != "latest_episode":
                deferred.append(item)  # it competes again after the relevant memories
                continue
            if item.section not in _SKIPPING:
                closed.add(item.group)
            # A startup record or a fact is given whole or not at all: half a rule can mislead;
            # a short relevant memory too (one that does not fit leaves the room to the next).
            if item.section in _WHOLE or (item.section == "relevant" and not passage):
                cut = None
            elif item.section == "relevant":
                cut = _passage_escaped(text, item.terms, room - item.shell())
            else:
                cut = _truncate(text, room - item.shell())
            if cut is None:
                dropped += 1
                continue
            body, line = cut, item.render(cut)
            sentences = _sentences(_unescape(cut))  # what the cut shows, not the whole text
        if item.section == "facts":
            facts_size += len(line) + own_overhead
        if allowed:
            allowance_size += len(line) + item.parent.unopened_overhead() - (
                0 if root.opened else len(root.open) + len(root.close))
        if item.section == "relevant" and relevant_room is not None:
            relevant_room -= len(line)
        size += len(line) + item.parent.unopened_overhead()
        item.parent.mark_opened()
        item.line, item.body = line, body
        for _, key in sentences:  # the sentences it shows (a repeated one was dropped from it)
            if key:
                shown_in.setdefault(key, []).append(item)
        sections[item.section] += 1

    xml = "".join(_emit(root)) if root.opened else EMPTY
    # The incremental count must equal the real length; the budget guarantee rests on it.
    if len(xml) != (size or len(EMPTY)) or len(xml) > budget_chars:
        raise AssertionError(f"context renderer miscounted: {len(xml)} chars, counted {size}, budget {budget_chars}")
    return RenderedContext(xml=xml, chars=len(xml), budget=budget_chars, sections=sections, dropped=dropped,
                           left_out={"duplicate": duplicates, "over_budget": dropped})


def _holder(keys: Sequence[str], shown_in: Mapping[str, Sequence[_Item]], absorbs: bool) -> _Item | None:
    """The first kept item that shows every sentence of ``keys`` (None: none, or no keys);
    a composite only when it ``absorbs`` the item (a thing said, not how to act or a fact)."""
    if not keys or any(key not in shown_in for key in keys):
        return None
    holders = set(shown_in[keys[0]]).intersection(*(shown_in[key] for key in keys[1:]))
    return next((item for item in shown_in[keys[0]] if item in holders
                 and (absorbs or item.form not in _COMPOSITE_FORMS)), None)


def passage(text: str, terms: Sequence[str], chars: int) -> str:
    """The passage of ``text`` that holds the query's ``terms``, in at most ``chars``
    characters: the sentence with the most of them (the first such), then its neighbours,
    before and after in turn, while they fit whole; an ellipsis where the text goes on. A
    sentence longer than ``chars`` is cut around its first term (``excerpt``)."""
    if len(text) <= chars:
        return text
    pieces = [p.strip() for p in _SENTENCE_END.split(text) if p.strip()]
    if not pieces:
        return excerpt(text, terms, chars)
    lowered = [p.lower() for p in pieces]
    hits = [sum(1 for t in set(terms) if t in low) for low in lowered]
    best = max(range(len(pieces)), key=lambda i: (hits[i], -i))
    start = end = best  # the passage is pieces[start:end + 1]

    def size(first: int, last: int) -> int:
        return sum(len(p) + 1 for p in pieces[first:last + 1]) - 1 + len(ELLIPSIS) * ((first > 0) + (last < len(pieces) - 1))

    if size(start, end) > chars:
        return excerpt(text, terms, chars)
    grown = True
    while grown:
        grown = False
        if start > 0 and size(start - 1, end) <= chars:
            start, grown = start - 1, True
        if end < len(pieces) - 1 and size(start, end + 1) <= chars:
            end, grown = end + 1, True
    return (ELLIPSIS if start > 0 else "") + " ".join(pieces[start:end + 1]) + (ELLIPSIS if end < len(pieces) - 1 else "")


def _passage_escaped(text: str, terms: Sequence[str], room: int) -> str | None:
    """The escaped passage of ``text`` around ``terms`` that fits ``room`` characters (None:
    less than MIN_EXCERPT_CHARS of room)."""
    chars = room
    while chars >= MIN_EXCERPT_CHARS:
        body = _escape_text(passage(text, terms, chars))
        if len(body) <= room:
            return body or None
        chars -= max(1, len(body) - room)
    return None


def _unescape(body: str) -> str:
    return unescape(body, {"&#13;": "\r"})


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
