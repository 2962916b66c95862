"""`memory-service import PATH`: legacy markdown memory files into startup records and memories.

What becomes what (docs/startup-records.md):

- ``SOUL.md`` and ``IDENTITY.md`` (any case): one P0 (identity) record each, the whole file;
- ``MEMORY.md``: each section whose heading names rules (rule, policy, guideline,
  constraint, boundary, principle, protocol, operating, always, never, must) is one P1
  record; each section whose heading names behaviour (behaviour, behavior, style, tone,
  voice, persona, personality, manner, communication, habit, conduct, etiquette) is one
  P2 record; a subheading without such a word belongs to its parent's kind. Every other
  section gives memories: one per top-level list item (its sub-items with it) and one per
  other top-level block (paragraph, quote, code). Memories are ``observation``s under
  headings naming observations, journals, logs, diaries or lessons, else ``fact``s, in the
  user's namespace with ``--user``, else the agent's;
- every other ``*.md`` (a folder of notes, searched recursively): one P3 (reference)
  record each, titled by its first heading (else its file name).

Ids are digests of (agent, source path relative to PATH, content), so importing the same
files again changes nothing; a record whose file changed is replaced (the record the file
gave before is removed). Everything is read and checked before anything is stored: a bad
file stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from memory_service.access.audit import AuditLog
from memory_service.config import Settings
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace, validate_id
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.recall.startup import StartupRecords
from memory_service.schemas.startup import MAX_TITLE_CHARS, Priority, StartupRecordIn
from memory_service.state.store import StateStore
from memory_service.stores.base import MemoryBackend

MARKDOWN_SUFFIXES = (".md", ".markdown")
IDENTITY_FILES = ("soul.md", "identity.md")
MEMORY_FILE = "memory.md"
WRITE_BATCH = 64  # memories embedded and written per step

_RULE_WORDS = frozenset({"rule", "rules", "policy", "policies", "guideline", "guidelines", "constraint", "constraints",
                         "boundary", "boundaries", "principle", "principles", "protocol", "protocols", "operating",
                         "always", "never", "must"})
_BEHAVIOUR_WORDS = frozenset({"behaviour", "behaviours", "behavior", "behaviors", "style", "tone", "voice", "persona",
                              "personality", "manner", "manners", "communication", "habit", "habits", "conduct",
                              "etiquette"})
_OBSERVATION_WORDS = frozenset({"observation", "observations", "journal", "log", "logs", "diary", "lesson", "lessons"})
_WORD = re.compile(r"[a-z]+")
_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])\s+(?:\[[ xX]\]\s+)?")


@dataclass(frozen=True)
class PlannedRecord:
    record_id: str
    body: StartupRecordIn
    source: str  # the file, relative to PATH


@dataclass
class ImportPlan:
    agent_id: str
    user_id: str | None
    root: Path
    records: list[PlannedRecord] = field(default_factory=list)
    memories: list[Memory] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # read, relative to PATH
    skipped: list[str] = field(default_factory=list)  # not markdown, or empty
    ids: set[str] = field(default_factory=set)  # of the records and memories planned

    @property
    def sources(self) -> set[str]:
        return set(self.files)


@dataclass
class ImportReport:
    records_created: int = 0
    records_updated: int = 0
    records_unchanged: int = 0
    records_removed: int = 0  # given before by a file that changed since
    memories_written: int = 0
    memories_present: int = 0  # already stored by an earlier import
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)}


def _digest(*parts: str) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()[:24]


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _heading_kind(title: str) -> Priority | MemoryKind | None:
    words = _words(title)
    if words & _RULE_WORDS:
        return Priority.P1
    if words & _BEHAVIOUR_WORDS:
        return Priority.P2
    if words & _OBSERVATION_WORDS:
        return MemoryKind.OBSERVATION
    return None


def plan_import(path: Path, agent_id: str, user_id: str | None, settings: Settings) -> ImportPlan:
    """Read and check everything under ``path``; what the import would store. Raises InvalidInput."""
    validate_id(agent_id, "agent_id")
    if user_id is not None:
        validate_id(user_id, "user_id")
    if not path.exists():
        raise InvalidInput(f"PATH: {path} does not exist")
    plan = ImportPlan(agent_id, user_id, path)
    if path.is_file():
        if not _is_markdown(path):
            raise InvalidInput(f"PATH: {path} is not a markdown file (.md, .markdown)")
        root, files = path.parent, [path]
    elif path.is_dir():
        root = path
        found = sorted(p for p in path.rglob("*") if p.is_file())
        files = [p for p in found if _is_markdown(p)]
        plan.skipped = [p.relative_to(root).as_posix() for p in found if not _is_markdown(p)]
        if not files:
            raise InvalidInput(f"PATH: {path} holds no markdown files (.md, .markdown)")
    else:
        raise InvalidInput(f"PATH: {path} is neither a file nor a directory")
    if len(files) > settings.import_max_files:
        raise InvalidInput(f"PATH: {path} holds {len(files)} markdown files; the limit is {settings.import_max_files} "
                           "(IMPORT_MAX_FILES)")
    for file in files:
        source = file.relative_to(root).as_posix()
        text = _read(file, source, settings)
        if not text.strip():
            plan.skipped.append(source)
            continue
        plan.files.append(source)
        at = datetime.fromtimestamp(file.stat().st_mtime, UTC)
        name = file.name.lower()
        top_level = file.parent == root
        if top_level and name in IDENTITY_FILES:
            _add_record(plan, source, Priority.P0, *_titled(text, file), settings)
        elif top_level and name == MEMORY_FILE:
            _plan_memory_file(plan, source, text, at, settings)
        else:
            _add_record(plan, source, Priority.P3, *_titled(text, file), settings)
    return plan


def _is_markdown(file: Path) -> bool:
    return file.name.lower().endswith(MARKDOWN_SUFFIXES)


def _read(file: Path, source: str, settings: Settings) -> str:
    size = file.stat().st_size
    if size > settings.import_max_file_bytes:
        raise InvalidInput(f"{source}: {size} bytes; the limit is {settings.import_max_file_bytes} (IMPORT_MAX_FILE_BYTES)")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{source}: not UTF-8 text (byte {exc.start})") from None


def _titled(text: str, file: Path) -> tuple[str, str]:
    """The heading the file opens with (else its name), and the rest of it."""
    tokens = MarkdownIt("commonmark").parse(text)
    if len(tokens) > 1 and tokens[0].type == "heading_open" and tokens[0].map and tokens[1].content.strip():
        title = tokens[1].content.strip()[:MAX_TITLE_CHARS]
        body = "\n".join(text.splitlines()[tokens[0].map[1]:]).strip()
        return title, body or title
    return file.stem[:MAX_TITLE_CHARS] or file.name, text.strip()


def _add_record(plan: ImportPlan, source: str, priority: Priority, title: str, content: str, settings: Settings) -> None:
    if len(content) > settings.startup_max_record_chars:
        raise InvalidInput(f"{source}: the {priority.value} record {title!r} is {len(content)} characters long; the limit "
                           f"is {settings.startup_max_record_chars} (STARTUP_MAX_RECORD_CHARS): shorten or split it")
    record_id = "imp-" + _digest(plan.agent_id, source, priority.value, title, content)
    if record_id in plan.ids:
        return  # the same section twice in one file
    plan.ids.add(record_id)
    plan.records.append(PlannedRecord(record_id, StartupRecordIn(priority=priority, title=title, content=content), source))


@dataclass
class _Section:
    title: str
    level: int
    kind: Priority | MemoryKind
    start: int  # the first line of its body
    end: int | None = None
    blocks: list[tuple[int, int]] = field(default_factory=list)  # top-level items, as line ranges


def _sections(text: str) -> list[_Section]:
    """MEMORY.md's sections (text before the first heading is one without a title), each with its kind."""
    sections = [_Section("", 0, MemoryKind.FACT, 0)]
    lists, in_heading = 0, False
    for token in MarkdownIt("commonmark").parse(text):
        if token.type in ("bullet_list_open", "ordered_list_open"):
            lists += 1
        elif token.type in ("bullet_list_close", "ordered_list_close"):
            lists -= 1
        if token.map is None:
            continue
        if token.type == "heading_open" and token.level == 0:
            level = int(token.tag[1])
            parents = [s for s in sections if 0 < s.level < level]
            inherited = parents[-1].kind if parents else MemoryKind.FACT
            sections[-1].end = token.map[0]
            sections.append(_Section("", level, inherited, token.map[1]))
            in_heading = True
        elif in_heading and token.type == "inline":
            current, in_heading = sections[-1], False
            current.title = token.content.strip()[:MAX_TITLE_CHARS] or f"section at line {token.map[0] + 1}"
            current.kind = _heading_kind(current.title) or current.kind
        elif token.type == "list_item_open" and lists == 1:
            sections[-1].blocks.append((token.map[0], token.map[1]))
        elif token.level == 0 and lists == 0 and token.type in (
                "paragraph_open", "blockquote_open", "fence", "code_block", "html_block", "table_open"):
            sections[-1].blocks.append((token.map[0], token.map[1]))
    return sections


def _plan_memory_file(plan: ImportPlan, source: str, text: str, at: datetime, settings: Settings) -> None:
    lines = text.splitlines()
    namespace = Namespace.user(plan.agent_id, plan.user_id) if plan.user_id else Namespace.agent(plan.agent_id)
    provenance = Provenance(agent_id=plan.agent_id, user_id=plan.user_id,
                            user_ids=[plan.user_id] if plan.user_id else [])
    for section in _sections(text):
        if isinstance(section.kind, Priority):
            body = "\n".join(lines[section.start:section.end]).strip()
            if body:
                _add_record(plan, source, section.kind, section.title, body, settings)
            continue
        for first, last in section.blocks:
            content = _MARKER.sub("", "\n".join(lines[first:last]).strip(), count=1).strip()
            if not content:
                continue
            if len(content) > settings.max_message_chars:
                raise InvalidInput(f"{source}, line {first + 1}: {len(content)} characters; the limit of a memory is "
                                   f"{settings.max_message_chars} (MAX_MESSAGE_CHARS)")
            memory_id = "imp-" + _digest(plan.agent_id, str(namespace), source, content)
            if memory_id in plan.ids:
                continue  # the same line twice in one file: one memory
            plan.ids.add(memory_id)
            plan.memories.append(Memory(id=memory_id, kind=section.kind, namespace=str(namespace), content=content,
                                        metadata=provenance, valid_at=at))


Progress = Callable[[str, int], None]  # (what is being done, how many items it completed)


async def apply_import(plan: ImportPlan, startup: StartupRecords, backend: MemoryBackend, state: StateStore,
                       embedder: Embedder | None, audit: AuditLog, key_id: str = "cli",
                       on_progress: Progress | None = None) -> ImportReport:
    """Store what ``plan`` holds: records first, then memories (embedded, through the backend), then one audit entry."""
    progress = on_progress or (lambda what, done: None)
    report = ImportReport(files=plan.files, skipped=plan.skipped)
    planned = {r.record_id for r in plan.records}
    existing = await startup.list(plan.agent_id)
    stale = [r for r in existing if r.source in plan.sources and r.id not in planned]
    new = len(planned - {r.id for r in existing})
    if new - len(stale) > await startup.room(plan.agent_id):
        raise InvalidInput(f"agent {plan.agent_id!r} would hold {len(existing) + new - len(stale)} startup records; the "
                           f"limit is {startup.settings.startup_max_records} (STARTUP_MAX_RECORDS)")
    for record in stale:  # given by a file that changed since
        await startup.delete(plan.agent_id, record.id)
        report.records_removed += 1
    for planned_record in plan.records:
        _, before, changed = await startup.put(plan.agent_id, planned_record.record_id, planned_record.body,
                                               source=planned_record.source)
        if not changed:
            report.records_unchanged += 1
        elif before is None:
            report.records_created += 1
        else:
            report.records_updated += 1
        progress(f"record {planned_record.body.title[:40]}", 1)
    for start in range(0, len(plan.memories), WRITE_BATCH):
        batch = plan.memories[start:start + WRITE_BATCH]
        await embed_memories(embedder, batch)
        written = await backend.write(batch)
        report.memories_written += written
        report.memories_present += len(batch) - written
        if written:
            await state.cache.bump(*{m.namespace for m in batch})
        progress("memories", len(batch))
    await audit.append(key_id, "startup.import", plan.agent_id, str(plan.root.name or plan.root),
                       after={**report.counts(), "user_id": plan.user_id, "files": plan.files[:200]})
    return report


def describe(records: Sequence[PlannedRecord]) -> dict[str, int]:
    """How many records of each priority."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.body.priority.value] = counts.get(record.body.priority.value, 0) + 1
    return dict(sorted(counts.items()))
