"""Bounds on what a caller sends, beyond each model field's own limit (docs/limits.md).

The HTTP layer (memory_service/http/guard.py) refuses oversized bodies and JSON that is not plain JSON
before a route runs; the checks here hold for the Python API as well: values the service
could neither store nor answer with (NaN, Infinity, lone surrogates, nesting deeper than
MAX_JSON_DEPTH), and the sizes that Settings make configurable.
"""

from __future__ import annotations

import json
import math
from collections import deque
from datetime import UTC, datetime
from typing import Any

from memory_service.domain.errors import InvalidInput, preview
from memory_service.domain.namespaces import MAX_ID_LENGTH

MAX_JSON_DEPTH = 32  # arrays and objects inside one another, in a body or in agent_extras
MESSAGE_CHARS_CEILING = 1_000_000  # MAX_MESSAGE_CHARS may not be set higher
MAX_SEARCH_NAMESPACES = 100  # namespaces one search may list
MAX_NAMESPACE_CHARS = len("shard") + 2 + 2 * MAX_ID_LENGTH  # kind, two separators, two ids
MAX_TOP_K_CEILING = 10_000  # SEARCH_MAX_TOP_K may not be set higher
CONTEXT_BUDGET_CEILING = 10_000_000  # characters; a memory block's budget may not be larger
# A memory block's host window (messages the host sends itself) is at most this many: each block reads them.
MAX_HOST_WINDOW = 1_000
TAGS_CEILING = 1_000  # MAX_MEMORY_TAGS may not be set higher
TAG_CHARS_CEILING = 1_000  # nor MAX_TAG_CHARS
MAX_GRAPH_HOPS = 2  # facts search's graph signal may follow out of the query's entities
MAX_GRAPH_FANOUT = 200  # entities it may follow out at each hop
MAX_RANK_WEIGHT = 10.0  # a structural re-rank weight (centrality, activation), per request or in Settings

# A time a caller gives must survive conversion to UTC and a day's arithmetic either way:
# 0001-01-01T00:00+14:00 is stored fine but breaks every later read of its session.
EARLIEST_TIME = datetime(1, 1, 2, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 30, tzinfo=UTC)

Location = tuple[str | int, ...]


# What text the stores cannot hold, found by putting each candidate through the service's
# own write paths (messages, formation, memory tools, write blocks, agents, shards, startup
# records, search) on the embedded FalkorDB and the MongoDB stand-in (docs/limits.md, "Text
# the stores hold"): only U+0000. FalkorDB reads query parameters from the query's text, and
# a NUL in a string parameter fails the whole query ("Failed to parse query parameter"),
# for every row of a batch. Every other C0 and C1 control, noncharacters (U+FFFE, U+FFFF,
# U+FDD0...), U+10FFFF, line separators, BOMs, private use, quotes, braces and 100,000-
# character lines are stored and read back unchanged. Lone surrogates cannot be encoded.
NUL = "\x00"


def text_problem(text: str) -> str | None:
    """Why the stores cannot hold ``text``, or None: it must be valid Unicode (a lone
    surrogate cannot be encoded, stored or answered with) without U+0000."""
    if NUL in text:
        return (f"contains U+0000 (NUL) at character {text.index(NUL)}; the stores cannot hold it: "
                "remove it or send it escaped as text")
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"contains a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}; "
                "text must be valid Unicode")
    return None


class DuplicateKey(ValueError):
    """A JSON object names one key twice: the last would silently win."""

    def __init__(self, key: str):
        super().__init__(f"the key {preview(key)} appears twice in one object; JSON keys must be unique")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object_pairs_hook: an object as a dict, refusing a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def json_problem(value: Any, where: Location = ()) -> tuple[Location, str] | None:
    """The first place in ``value`` (decoded JSON, or what a Python caller passes as such)
    that is not plain JSON, and why; None when all of it is. Visits each item once."""
    queue: deque[tuple[Location, Any, int]] = deque([(where, value, 0)])
    while queue:
        loc, item, depth = queue.popleft()
        if isinstance(item, str):
            if reason := text_problem(item):
                return loc, reason
        elif isinstance(item, float):
            if not math.isfinite(item):
                return loc, f"{item!r} is not a JSON number (NaN and Infinity are refused)"
        elif item is None or isinstance(item, (bool, int)):
            continue
        elif isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                return loc, f"nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str) and (reason := text_problem(key)):
                    return (*loc, key), f"key {reason}"
                if isinstance(item, dict) and not isinstance(key, str):
                    return loc, f"has the key {key!r}; JSON object keys are strings"
                queue.append(((*loc, key), child, depth + 1))
        else:
            return loc, f"a {type(item).__name__} is not a JSON value"
    return None


def check_json(value: Any, what: str) -> Any:
    """``value`` if it is plain JSON, else InvalidInput naming where inside it the problem is."""
    problem = json_problem(value)
    if problem is not None:
        loc, reason = problem
        inside = "".join(f"[{preview(part)}]" for part in loc)
        raise InvalidInput(f"{what}{inside} {reason}")
    return value


def check_time(value: datetime) -> datetime:
    """``value`` (timezone-aware) if it lies between EARLIEST_TIME and LATEST_TIME, else ValueError."""
    try:
        inside = EARLIEST_TIME <= value.astimezone(UTC) <= LATEST_TIME
    except OverflowError:
        inside = False
    if not inside:
        raise ValueError(f"must lie between {EARLIEST_TIME.date()} and {LATEST_TIME.date()} (UTC)")
    return value


def json_bytes(value: Any) -> int:
    """Size of ``value`` as compact UTF-8 JSON: what storing it costs."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def check_message_chars(content: str, limit: int) -> None:
    if len(content) > limit:
        raise InvalidInput(f"content is {len(content)} characters long; the limit is {limit} (MAX_MESSAGE_CHARS)")


def check_extras(extras: dict[str, Any], limit: int) -> None:
    """``agent_extras`` must be plain JSON of at most ``limit`` bytes."""
    check_json(extras, "agent_extras")
    size = json_bytes(extras)
    if size > limit:
        raise InvalidInput(f"agent_extras is {size} bytes of JSON; the limit is {limit} (MAX_EXTRAS_BYTES)")



def check_tags(tags: list[str], max_tags: int, max_chars: int, what: str = "tags") -> list[str]:
    """A memory's tags: at most ``max_tags`` (MAX_MEMORY_TAGS) distinct strings of 1 to
    ``max_chars`` (MAX_TAG_CHARS) characters, no white space at either end, no control
    characters. Returned without repeats, in their order."""
    if len(tags) > max_tags:
        raise InvalidInput(f"{what}: {len(tags)} tags; the limit is {max_tags} (MAX_MEMORY_TAGS)")
    for i, tag in enumerate(tags):
        where = f"{what}[{i}]"
        if not isinstance(tag, str):
            raise InvalidInput(f"{where} must be a string, got {type(tag).__name__}")
        if not tag.strip():
            raise InvalidInput(f"{where} must not be empty or blank")
        if len(tag) > max_chars:
            raise InvalidInput(f"{where} is {len(tag)} characters long; the limit is {max_chars} (MAX_TAG_CHARS)")
        if tag != tag.strip():
            raise InvalidInput(f"{where} {preview(tag)} must not start or end with white space")
        if any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in tag) or text_problem(tag):
            raise InvalidInput(f"{where} {preview(tag)} must not contain control characters or lone surrogates")
    return list(dict.fromkeys(tags))
