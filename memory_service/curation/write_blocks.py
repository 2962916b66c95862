"""Strict structured writes in model output: ``<memory_write>{...}</memory_write>`` blocks.

A model may end its answer with blocks such as::

    <memory_write>{"observations": [{"text": "Alice flies on June 3rd", "confidence": 0.8,
                                      "tags": ["travel"]}],
                   "entities": [{"name": "Alice", "type": "person"}],
                   "edges": [{"source": "Alice", "target": "Lyon", "rel_type": "lives_in"}]}</memory_write>

``<shadow_write>`` (the seed systems' spelling) is the same block. Parsing is all or
nothing: a block that is not closed, a block inside a block, JSON that is not plain JSON,
a field that is missing, unknown, of the wrong type or out of bounds fails the whole text
with an error that says which block, where it starts (line and column) and which field;
nothing is returned, so nothing is stored. Text outside the blocks is ignored.

Parsing is idempotent: every memory a block stores gets an idempotency key derived from the
namespace, the message it came in (session_id and message_id, when given), the block's
position in the text and the item's kind, position and content. Parsing the same text for
the same message again stores nothing new and answers the same ids (``already_stored``):
a client that retries, or re-posts a message's output, never stores a second copy.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from memory_service.curation.tools import TITLE_CHARS, MemoryTools, MemoryWrite, NamespaceGuard, Written
from memory_service.domain.errors import InvalidInput, preview
from memory_service.domain.limits import check_message_chars, json_problem, unique_keys
from memory_service.domain.models import MemoryKind

TAGS = ("memory_write", "shadow_write")
MAX_BLOCKS = 20
MAX_ITEMS = 100  # observations, entities or edges in one block
MAX_TEXT_CHARS = 2_000  # of one observation
MAX_NAME_CHARS = 200  # of an entity's name or type, an edge's ends and relation
MAX_TAGS = 20
MAX_TAG_CHARS = 64

_TAG = re.compile(r"<(/?)(memory_write|shadow_write)>")

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS)]
Tag = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TAG_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Observation(_Strict):
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TEXT_CHARS)]
    confidence: float = Field(default=1.0, ge=0, le=1)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)

    @field_validator("confidence", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        # JSON has one number type: 1 is as good a confidence as 1.0 (strict mode refuses ints).
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Entity(_Strict):
    name: Name
    type: Name | None = None
    description: Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_TEXT_CHARS)] | None = None


class Edge(_Strict):
    source: Name
    target: Name
    rel_type: Name


class WriteBlock(_Strict):
    """What one block writes."""

    observations: list[Observation] = Field(default_factory=list, max_length=MAX_ITEMS)
    entities: list[Entity] = Field(default_factory=list, max_length=MAX_ITEMS)
    edges: list[Edge] = Field(default_factory=list, max_length=MAX_ITEMS)

    @field_validator("entities", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        # An entity may be just its name.
        return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @property
    def empty(self) -> bool:
        return not (self.observations or self.entities or self.edges)


@dataclass(frozen=True)
class LocatedBlock:
    """A parsed block and where it starts in the text (1-based line and column)."""

    block: WriteBlock
    tag: str
    line: int
    column: int


class WriteBlockError(InvalidInput):
    """A malformed block: the whole text is refused."""


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse_write_blocks(text: str) -> list[LocatedBlock]:
    """Every write block of ``text``, in order; WriteBlockError at the first malformed one."""
    blocks: list[LocatedBlock] = []
    open_tag: tuple[str, int, int] | None = None  # name, offset of the tag, offset after it
    for match in _TAG.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        line, column = _position(text, match.start())
        if not closing:
            if open_tag is not None:
                first = _position(text, open_tag[1])
                raise WriteBlockError(f"line {line}, column {column}: <{name}> inside the <{open_tag[0]}> block opened "
                                      f"at line {first[0]}, column {first[1]}; blocks do not nest")
            open_tag = (name, match.start(), match.end())
            continue
        if open_tag is None:
            raise WriteBlockError(f"line {line}, column {column}: </{name}> closes no block")
        if name != open_tag[0]:
            first = _position(text, open_tag[1])
            raise WriteBlockError(f"line {line}, column {column}: </{name}> closes the <{open_tag[0]}> block opened at "
                                  f"line {first[0]}, column {first[1]}")
        if len(blocks) == MAX_BLOCKS:
            raise WriteBlockError(f"more than {MAX_BLOCKS} write blocks in one text")
        blocks.append(_block(text, open_tag, match.start(), len(blocks) + 1))
        open_tag = None
    if open_tag is not None:
        line, column = _position(text, open_tag[1])
        raise WriteBlockError(f"line {line}, column {column}: <{open_tag[0]}> is never closed")
    return blocks


def _block(text: str, opened: tuple[str, int, int], end: int, number: int) -> LocatedBlock:
    name, start, body_start = opened
    line, column = _position(text, start)
    where = f"block {number} (<{name}> at line {line}, column {column})"
    body = text[body_start:end]
    try:
        value = json.loads(body, object_pairs_hook=unique_keys)  # a key twice: DuplicateKey, a ValueError
    except json.JSONDecodeError as exc:
        at_line, at_column = _position(text, body_start + exc.pos)
        raise WriteBlockError(f"{where}: not JSON: {exc.msg} at line {at_line}, column {at_column}") from None
    except (RecursionError, ValueError) as exc:
        raise WriteBlockError(f"{where}: not usable JSON: {preview(str(exc), 120)}") from None
    if problem := json_problem(value):
        loc, reason = problem
        raise WriteBlockError(f"{where}: {_path(loc) or 'the block'}: {reason}")
    if not isinstance(value, dict):
        raise WriteBlockError(f"{where}: a block holds a JSON object with observations, entities and/or edges, "
                              f"not {preview(value, 40)}")
    try:
        block = WriteBlock.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise WriteBlockError(f"{where}: {_path(first['loc']) or 'the block'}: {first['msg']}"
                              + (f" (got {preview(first['input'], 60)})" if 'input' in first else "")) from None
    if block.empty:
        raise WriteBlockError(f"{where}: the block writes nothing (no observations, entities or edges)")
    return LocatedBlock(block, name, line, column)


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def block_key(namespace: str, session_id: str | None, message_id: str | None, block: int, kind: str, item: int,
              content: str) -> str:
    """The idempotency key of one item of a block: where it was said and what it says."""
    parts = (namespace, session_id or "", message_id or "", str(block), kind, str(item), content)
    return "write-block:" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def memory_writes(block: WriteBlock, namespace: str, number: int = 1, session_id: str | None = None,
                  message_id: str | None = None) -> list[MemoryWrite]:
    """What a block stores, as the memory tools write it: an observation each; an entity as
    a fact titled with its name and tagged ``entity``; an edge as a fact ``source rel target``
    tagged ``relation`` (the graph signal that would link them is not built). ``number``: the
    block's position in its text (1-based), which with the message keys every write.

    A parsed block always makes valid MemoryWrites: the block's bounds are within theirs
    (non-blank stripped texts, confidence in [0, 1], names within TITLE_CHARS). The
    service's own settings (MAX_TAG_CHARS, MAX_MESSAGE_CHARS) are checked when they are
    written, with the field named."""
    def key(kind: str, item: int, content: str) -> str:
        return block_key(namespace, session_id, message_id, number, kind, item, content)

    writes = [MemoryWrite(content=o.text, namespace=namespace, kind=MemoryKind.OBSERVATION, tags=o.tags,
                          confidence=o.confidence, idempotency_key=key("observation", i, o.text))
              for i, o in enumerate(block.observations)]
    for i, entity in enumerate(block.entities):
        described = f"{entity.name} ({entity.type})" if entity.type else entity.name
        content = f"{described}: {entity.description}" if entity.description else described
        writes.append(MemoryWrite(content=content, namespace=namespace, kind=MemoryKind.FACT,
                                  title=entity.name[:TITLE_CHARS], tags=["entity"],
                                  idempotency_key=key("entity", i, content)))
    for i, edge in enumerate(block.edges):
        content = f"{edge.source} {edge.rel_type} {edge.target}"
        writes.append(MemoryWrite(content=content, namespace=namespace, kind=MemoryKind.FACT,
                                  title=edge.rel_type[:TITLE_CHARS], tags=["relation"],
                                  idempotency_key=key("edge", i, content)))
    return writes


async def store_write_blocks(tools: MemoryTools, agent_id: str, text: str, namespace: str,
                             session_id: str | None = None, message_id: str | None = None,
                             guard: NamespaceGuard = None) -> tuple[int, Written]:
    """Parse ``text`` and store its blocks' memories, all or none: (blocks found, what was
    stored, with the ids a previous parse of the same message had stored already)."""
    check_message_chars(text, tools.settings.max_message_chars)
    parsed = parse_write_blocks(text)
    writes = [write for number, located in enumerate(parsed, 1)
              for write in memory_writes(located.block, namespace, number, session_id, message_id)]
    return len(parsed), await tools.write_many(agent_id, writes, guard, session_id, message_id)
