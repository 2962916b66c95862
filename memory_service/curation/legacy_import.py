"""`memory-service import PATH`: legacy markdown memory files into startup records and memories,
kept in step with the files: importing again after an edit changes what the edit changed.

What becomes what (docs/startup-records.md):

- ``SOUL.md`` and ``IDENTITY.md`` (any case, at the top of PATH): one P0 (identity) record
  each, the whole file;
- ``MEMORY.md`` (at the top of PATH): each section whose heading names rules (rule, policy,
  guideline, constraint, boundary, principle, protocol, operating, always, never, must) is
  one P1 record; each section whose heading names behaviour (behaviour, behavior, style,
  tone, voice, persona, personality, manner, communication, habit, conduct, etiquette) is
  one P2 record; a subheading without such a word belongs to its parent's kind;
- every other section of ``MEMORY.md``, and every section of every other ``*.md`` (a
  folder of notes, searched recursively), gives memories: one per top-level list item (its
  sub-items with it) and one per other top-level block (paragraph, quote, code). They are
  ``observation``s under headings naming observations, journals, logs, diaries or lessons,
  else ``fact``s, in the user's namespace with ``--user``, else the agent's. Notes are
  memories, not startup records, so that search and the memory block's relevant memories
  find them like any other memory, and a note costs nothing in the startup budget.

Why the ids are what they are. A record's id is a digest of (agent, file, priority, title,
content): an edited section is a new record and the file's old one goes. A memory's id is a
digest of (agent, namespace, content) only, so the same note in two files, or twice in one,
is one memory. Which file gave which memory is the import's manifest (one Redis hash per
agent, ``keyspace.import_manifest``: file -> [section digest, memory id]): a re-import
compares each file's memories with what its manifest entry lists, writes the new ones,
soft-deletes (through ``MemoryTools.retire``, audited as ``memory.delete``, purged later
like any deleted memory) those no file lists any more, and counts a new memory and a
removed one in the same section as one replaced. Memories from conversations, from the
memory tools and from other files' lines are never in the file's entry, so never touched.
Memories of the first releases' imports (their ids had the file in the digest) are adopted
by the first re-import of their file: still-present lines are replaced by the new ids.

Secrets: every record's and memory's text is redacted as the agent's redaction policy says
before its id is taken (docs/redaction.md): the import stores no secret, nor a digest of one,
and a file imported again gives the same ids. In mode refuse a file holding one imports
nothing (the error names the file, the line and the kinds, never the value). The files are
planned with the server's policy (REDACTION_MODE, REDACTION_KINDS) before the store is
opened; ``MemoryService.import_legacy`` plans again if the agent's own differs.

A file that is empty, or missing from a folder imported again, is not taken to mean "forget
what it gave" unless ``--prune`` says so: an emptied file is more often a mistake than a
wish, and the command says what it kept. Everything is read and checked before anything is
stored: a bad file (unreadable, not UTF-8, over a limit) stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from markdown_it import MarkdownIt
from redis.asyncio import Redis

from memory_service.access.audit import AuditLog
from memory_service.config import Settings
from memory_service.curation.tools import MemoryTools
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace, validate_id
from memory_service.domain.redaction import Policy, merged
from memory_service.embedding.memories import embed_memories
from memory_service.recall.startup import StartupRecords
from memory_service.schemas.startup import MAX_TITLE_CHARS, Priority, StartupRecordIn
from memory_service.state import keyspace

MARKDOWN_SUFFIXES = (".md", ".markdown")
IDENTITY_FILES = ("soul.md", "identity.md")
MEMORY_FILE = "memory.md"
WRITE_BATCH = 64  # memories embedded and written per step
ID_PREFIX = "imp-"  # every id an import gives: nothing else in the stores has it

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


@dataclass(frozen=True)
class PlannedItem:
    """One memory a file gives, and where in the file: the section pairs a changed line with
    the one it replaces in the report."""

    section: str  # a digest of the section's heading (the manifest keeps no text of the file)
    memory_id: str
    legacy_id: str = ""  # the id the first releases gave it (the file in the digest), to adopt


@dataclass
class ImportPlan:
    agent_id: str
    user_id: str | None
    root: Path
    path: Path  # as given: the file, or the folder (root)
    policy: Policy  # the redaction policy its texts were planned with
    prune: bool = False  # an empty file, or one missing from the folder, loses what it gave before
    folder: bool = False  # PATH is a folder (a file missing from it is known to be gone)
    records: list[PlannedRecord] = field(default_factory=list)
    memories: list[Memory] = field(default_factory=list)  # each once, however many files give it
    items: dict[str, list[PlannedItem]] = field(default_factory=dict)  # file -> the memories it gives, in order
    files: list[str] = field(default_factory=list)  # read, relative to PATH
    empty: list[str] = field(default_factory=list)  # markdown files with nothing in them
    skipped: list[str] = field(default_factory=list)  # not markdown
    ids: set[str] = field(default_factory=set)  # of the records and memories planned
    redacted: dict[str, int] = field(default_factory=dict)  # what the policy took out of them, by kind

    def redact(self, text: str, where: str) -> str:
        """``text`` (of the file and line ``where``) as the plan's policy stores it."""
        redacted = self.policy.apply(text, where)
        self.redacted = merged(self.redacted, redacted.counts)
        return redacted.text


@dataclass
class Changes:
    """What one import did to records or to memories. ``replaced``: a new one in the place
    (the file and section) of one removed; ``added`` and ``removed`` count the others."""

    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    removed: int = 0


@dataclass
class ImportReport:
    records: Changes = field(default_factory=Changes)
    memories: Changes = field(default_factory=Changes)
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)  # imported before, empty or missing now, their items removed
    kept: list[str] = field(default_factory=list)  # likewise, without --prune: what they gave is kept
    redacted: dict[str, int] = field(default_factory=dict)  # what the redaction policy took out, by kind

    def counts(self) -> dict[str, Any]:
        return {"records": self.records.__dict__.copy(), "memories": self.memories.__dict__.copy(),
                "redacted": dict(self.redacted)}


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


def plan_import(path: Path, agent_id: str, user_id: str | None, settings: Settings, prune: bool = False,
                policy: Policy | None = None) -> ImportPlan:
    """Read and check everything under ``path``; what the import would store, its texts
    redacted by ``policy`` (default: the server's). Raises InvalidInput (SecretsRefused, in
    mode refuse, for a text holding a secret)."""
    validate_id(agent_id, "agent_id")
    if user_id is not None:
        validate_id(user_id, "user_id")
    if not path.exists():
        raise InvalidInput(f"PATH: {path} does not exist")
    policy = policy or Policy.of(settings.redaction_mode, settings.redaction_kinds)
    plan = ImportPlan(agent_id, user_id, path, path, policy, prune=prune, folder=path.is_dir())
    if path.is_file():
        if not _is_markdown(path):
            raise InvalidInput(f"PATH: {path} is not a markdown file (.md, .markdown)")
        root, files = path.parent, [path]
    elif path.is_dir():
        root = path
        try:
            found = sorted(p for p in path.rglob("*") if p.is_file())
        except OSError as exc:
            raise InvalidInput(f"PATH: {path} cannot be listed: {exc.strerror or exc}") from None
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
            plan.empty.append(source)
            continue
        plan.files.append(source)
        plan.items[source] = []
        at = datetime.fromtimestamp(file.stat().st_mtime, UTC)
        name = file.name.lower()
        top_level = file.parent == root
        if top_level and name in IDENTITY_FILES:
            _add_record(plan, source, Priority.P0, *_titled(text, file), settings, line=1)
        else:
            _plan_sections(plan, source, text, at, settings, records=top_level and name == MEMORY_FILE)
    return plan


def _is_markdown(file: Path) -> bool:
    return file.name.lower().endswith(MARKDOWN_SUFFIXES)


def _read(file: Path, source: str, settings: Settings) -> str:
    try:
        size = file.stat().st_size
        if size > settings.import_max_file_bytes:
            raise InvalidInput(f"{source}: {size} bytes; the limit is {settings.import_max_file_bytes} "
                               "(IMPORT_MAX_FILE_BYTES)")
        data = file.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{source}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > settings.import_max_file_bytes:  # grew since its stat
        raise InvalidInput(f"{source}: {len(data)} bytes; the limit is {settings.import_max_file_bytes} "
                           "(IMPORT_MAX_FILE_BYTES)")
    try:
        return data.decode("utf-8")
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


def _add_record(plan: ImportPlan, source: str, priority: Priority, title: str, content: str, settings: Settings,
                line: int) -> None:
    title, content = plan.redact(title, f"{source}, line {line}"), plan.redact(content, f"{source}, line {line}")
    if len(content) > settings.startup_max_record_chars:
        raise InvalidInput(f"{source}: the {priority.value} record {title!r} is {len(content)} characters long; the limit "
                           f"is {settings.startup_max_record_chars} (STARTUP_MAX_RECORD_CHARS): shorten or split it")
    record_id = ID_PREFIX + _digest(plan.agent_id, source, priority.value, title, content)
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
    """A file's sections (text before the first heading is one without a title), each with its kind."""
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


def _plan_sections(plan: ImportPlan, source: str, text: str, at: datetime, settings: Settings, records: bool) -> None:
    """A file's memories, and with ``records`` (MEMORY.md) its rule and behaviour sections as records."""
    lines = text.splitlines()
    namespace = str(Namespace.user(plan.agent_id, plan.user_id) if plan.user_id else Namespace.agent(plan.agent_id))
    provenance = Provenance(agent_id=plan.agent_id, user_id=plan.user_id,
                            user_ids=[plan.user_id] if plan.user_id else [])
    items, listed = plan.items[source], set[str]()
    for section in _sections(text):
        if isinstance(section.kind, Priority) and records:
            body = "\n".join(lines[section.start:section.end]).strip()
            if body:
                _add_record(plan, source, section.kind, section.title, body, settings, line=section.start)
            continue
        kind = section.kind if isinstance(section.kind, MemoryKind) else MemoryKind.FACT
        where = _digest(section.title)[:12]
        for first, last in section.blocks:
            content = _MARKER.sub("", "\n".join(lines[first:last]).strip(), count=1).strip()
            if not content:
                continue
            if len(content) > settings.max_message_chars:
                raise InvalidInput(f"{source}, line {first + 1}: {len(content)} characters; the limit of a memory is "
                                   f"{settings.max_message_chars} (MAX_MESSAGE_CHARS)")
            content = plan.redact(content, f"{source}, line {first + 1}")
            memory_id = ID_PREFIX + _digest(plan.agent_id, namespace, content)
            if memory_id in listed:
                continue  # the same line twice in one file: one memory, listed once
            listed.add(memory_id)
            items.append(PlannedItem(where, memory_id, ID_PREFIX + _digest(plan.agent_id, namespace, source, content)))
            if memory_id in plan.ids:
                continue  # given by an earlier file too: one memory
            plan.ids.add(memory_id)
            plan.memories.append(Memory(id=memory_id, kind=kind, namespace=namespace, content=content,
                                        metadata=provenance, valid_at=at))


class ImportManifest:
    """Which memories each imported file of an agent gave (``keyspace.import_manifest``)."""

    def __init__(self, redis: Redis, agent_id: str):
        self.redis, self.key = redis, keyspace.import_manifest(agent_id)

    async def read(self) -> dict[str, list[PlannedItem]]:
        raw = cast(dict[str, str], await self.redis.hgetall(self.key))
        return {source: [PlannedItem(section, memory_id) for section, memory_id in json.loads(value)]
                for source, value in raw.items()}

    async def write(self, entries: dict[str, list[PlannedItem]]) -> None:
        """Set each file's entry; a file with no memories loses its entry."""
        kept = {s: json.dumps([[i.section, i.memory_id] for i in items]) for s, items in entries.items() if items}
        gone = [s for s, items in entries.items() if not items]
        if kept:
            await self.redis.hset(self.key, mapping=cast(dict[Any, Any], kept))  # redis-py's mapping type is invariant
        if gone:
            await self.redis.hdel(self.key, *gone)


Progress = Callable[[str, int], None]  # (what is being done, how many items it completed)


def _paired(new: Iterable[tuple[str, str]], old: Iterable[tuple[str, str]]) -> int:
    """How many of the added (source, section) places match a removed one: the replaced."""
    added, removed = Counter(new), Counter(old)
    return sum(min(n, removed[place]) for place, n in added.items())


async def apply_import(plan: ImportPlan, startup: StartupRecords, tools: MemoryTools, audit: AuditLog,
                       key_id: str = "cli", on_progress: Progress | None = None) -> ImportReport:
    """Bring the agent's records and memories in step with ``plan``'s files: records first,
    then new memories (embedded, through the backend), then removals, then the manifest, then
    one audit entry for the import (and one per memory removed or restored)."""
    progress = on_progress or (lambda what, done: None)
    agent_id = plan.agent_id
    _, backend = await tools.agents.backend_for(agent_id)
    manifest = ImportManifest(tools.state.redis, agent_id)
    known = await manifest.read()
    existing = await startup.list(agent_id)
    before = set(known) | {r.source for r in existing if r.source}
    gone = sorted(s for s in before if s in plan.empty or (plan.folder and s not in plan.files))
    report = ImportReport(files=plan.files, skipped=[*plan.skipped, *plan.empty],
                          pruned=gone if plan.prune else [], kept=[] if plan.prune else gone,
                          redacted=dict(plan.redacted))
    synced = {*plan.files, *report.pruned}  # the files whose records and memories follow the plan

    # Records: a file's records are exactly the ones it gives now.
    planned = {r.record_id for r in plan.records}
    stale = [r for r in existing if r.source in synced and r.id not in planned]
    new_records = [r for r in plan.records if r.record_id not in {e.id for e in existing}]
    if len(new_records) - len(stale) > await startup.room(agent_id):
        raise InvalidInput(f"agent {agent_id!r} would hold {len(existing) + len(new_records) - len(stale)} startup "
                           f"records; the limit is {startup.settings.startup_max_records} (STARTUP_MAX_RECORDS)")
    replaced = _paired(((r.source, "") for r in new_records), ((r.source or "", "") for r in stale))
    report.records = Changes(added=len(new_records) - replaced, replaced=replaced,
                             unchanged=len(plan.records) - len(new_records), removed=len(stale) - replaced)
    for record in stale:
        await startup.delete(agent_id, record.id)
    for planned_record in plan.records:
        await startup.put(agent_id, planned_record.record_id, planned_record.body, source=planned_record.source)
        progress(f"record {planned_record.body.title[:40]}", 1)

    # Memories: what the files list now against what their manifest entries listed.
    old = {s: known[s] for s in synced if s in known}
    legacy = {i.legacy_id: (s, i) for s in plan.files if s not in known for i in plan.items[s]}
    new_ids = {m.id for m in plan.memories}
    elsewhere = {i.memory_id for s, items in known.items() if s not in synced for i in items}
    looked_up = new_ids | {i.memory_id for items in old.values() for i in items} | set(legacy)
    stored = {m.id: m for m in await backend.find(agent_id, sorted(looked_up)) if m.metadata.agent_id == agent_id}
    for legacy_id, (source, item) in legacy.items():  # a first release's import of the file: adopted
        if legacy_id in stored and legacy_id not in new_ids:
            old.setdefault(source, []).append(PlannedItem(item.section, legacy_id))
    old_ids = {i.memory_id for items in old.values() for i in items}
    write = [m for m in plan.memories if m.id not in stored]
    revive = [stored[i] for i in sorted(new_ids - old_ids - elsewhere)
              if i in stored and stored[i].deleted_at is not None]
    retire = [stored[i] for i in sorted(old_ids - new_ids - elsewhere)
              if i in stored and stored[i].deleted_at is None and i.startswith(ID_PREFIX)]
    added, removed = {m.id for m in (*write, *revive)}, {m.id for m in retire}
    replaced = _paired(_first_places(plan.items, added), _first_places(old, removed))
    report.memories = Changes(added=len(added) - replaced, replaced=replaced, unchanged=len(new_ids) - len(added),
                              removed=len(removed) - replaced)

    for start in range(0, len(write), WRITE_BATCH):
        batch = write[start:start + WRITE_BATCH]
        await embed_memories(tools.embedder, batch)
        await backend.write(batch)
        await tools.state.cache.bump(*{m.namespace for m in batch})
        progress("memories", len(batch))
    for memory in await tools.revive(agent_id, backend, revive):
        await audit.append(key_id, "memory.undelete", agent_id, memory.id,  # as the memory tools' undelete
                           after={"id": memory.id, "kind": memory.kind.value, "namespace": memory.namespace,
                                  "content_chars": len(memory.content), "deleted_at": None})
    for deleted in await tools.retire(agent_id, backend, retire):
        await audit.append(key_id, "memory.delete", agent_id, deleted.id, after=deleted.model_dump(mode="json"))
    progress("memories", len(plan.memories) - len(write))
    await manifest.write({s: plan.items.get(s, []) for s in sorted(synced)})
    await audit.append(key_id, "startup.import", agent_id, str(plan.root.name or plan.root),
                       after={**report.counts(), "user_id": plan.user_id, "files": plan.files[:200],
                              "pruned": report.pruned[:200], "kept": report.kept[:200]})
    return report


def _first_places(items: dict[str, list[PlannedItem]], ids: set[str]) -> list[tuple[str, str]]:
    """The (file, section) of each of ``ids``, where it first appears."""
    places: dict[str, tuple[str, str]] = {}
    for source in sorted(items):
        for item in items[source]:
            if item.memory_id in ids:
                places.setdefault(item.memory_id, (source, item.section))
    return list(places.values())


def describe(records: Sequence[PlannedRecord]) -> dict[str, int]:
    """How many records of each priority."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.body.priority.value] = counts.get(record.body.priority.value, 0) + 1
    return dict(sorted(counts.items()))
