"""`memory-service import`: legacy markdown memory files into startup records and memories, kept in
step with the files.

The mapping by file and heading, deterministic ids (a second import changes nothing; the same
note in two files is one memory), a changed line replacing its memory and a deleted section
removing its memories (and nothing another file, a conversation or the tools gave), emptied
and missing files kept unless --prune, imported notes found by search and in the memory
block, bad input refused before anything is stored, and the command itself against a running
`serve` (its search and context over HTTP) and on its own. Real stores throughout."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from memory_service.curation.legacy_import import plan_import
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.runtime import open_service
from memory_service.schemas.startup import Priority

from .conftest import REPO, clean_env, flush, free_port, suite_settings
from .store_state import snapshot
from .test_cli import CLI, _wait_healthy

SAMPLE = REPO / "tests/data/legacy"
AGENT, USER = "atlas", "ada"


@pytest.fixture
def sample(tmp_path) -> Path:
    """A copy of the sample files, to edit."""
    return Path(shutil.copytree(SAMPLE, tmp_path / "legacy"))


def test_files_and_headings_map_to_priorities_and_memories():
    plan = plan_import(SAMPLE, AGENT, USER, suite_settings("redis://unused"))
    assert plan.files == ["IDENTITY.md", "MEMORY.md", "SOUL.md", "notes/airports.md", "notes/packing.md"]
    assert plan.skipped == ["notes/scan.txt"]
    records = {(r.body.priority, r.body.title): r for r in plan.records}
    assert sorted(records) == [
        (Priority.P0, "Identity"), (Priority.P0, "Soul"),
        (Priority.P1, "Operating rules"), (Priority.P1, "Payments"),  # a subheading keeps its parent's kind
        (Priority.P2, "Communication style"),
    ]
    soul = records[(Priority.P0, "Soul")]
    assert soul.source == "SOUL.md" and soul.body.content.startswith("I am Atlas") and "# Soul" not in soul.body.content
    assert records[(Priority.P1, "Operating rules")].body.content == (
        "- Always confirm travel dates before booking anything.\n- Never share passport numbers in chat.")
    memories = {m.content: m for m in plan.memories}
    assert set(memories) == {
        "Notes carried over from the old assistant.",
        "Ada Okafor prefers window seats on long flights.",
        "Tunde is vegetarian and allergic to peanuts.\n  - He carries an EpiPen; mention it when booking meals.",
        "The family lives in Porto, near the São Bento station.",
        "The kids' passports expire in March 2027.",
        "Ada books late at night and answers quickly then.",
        "Trains beat flights for anything under four hours, in her view.",
        # Notes are memories, block by block (not startup records): searchable like any other.
        "OPO is Porto, LIS is Lisbon, LHR is London Heathrow. Avoid connections under 90 minutes in LIS.",
        "Packing list for winter trips: thermal layers, the blue suitcase, Tunde's EpiPen, adapters for the UK.",
    }
    assert memories["Ada books late at night and answers quickly then."].kind is MemoryKind.OBSERVATION
    assert memories["The kids' passports expire in March 2027."].kind is MemoryKind.FACT
    assert {m.namespace for m in plan.memories} == {str(Namespace.user(AGENT, USER))}
    assert all(m.metadata.user_id == USER and m.metadata.agent_id == AGENT for m in plan.memories)
    assert {s: len(items) for s, items in plan.items.items()} == {
        "IDENTITY.md": 0, "MEMORY.md": 7, "SOUL.md": 0, "notes/airports.md": 1, "notes/packing.md": 1}
    without_user = plan_import(SAMPLE, AGENT, None, suite_settings("redis://unused"))
    assert {m.namespace for m in without_user.memories} == {str(Namespace.agent(AGENT))}


def test_ids_depend_on_agent_namespace_and_content_and_identical_notes_are_one(sample):
    settings = suite_settings("redis://unused")
    first, moved = plan_import(SAMPLE, AGENT, USER, settings), plan_import(sample, AGENT, USER, settings)
    ids = [r.record_id for r in first.records] + [m.id for m in first.memories]
    assert ids == [r.record_id for r in moved.records] + [m.id for m in moved.memories]  # the folder moved: same ids
    other = plan_import(SAMPLE, "hermes", USER, settings)
    assert not set(ids) & ({r.record_id for r in other.records} | {m.id for m in other.memories})
    (sample / "SOUL.md").write_text("# Soul\n\nI am Atlas, renamed.\n")
    edited = plan_import(sample, AGENT, USER, settings)
    changed = set(ids) ^ ({r.record_id for r in edited.records} | {m.id for m in edited.memories})
    assert len(changed) == 2  # the old soul record and the new one; nothing else
    single = plan_import(SAMPLE / "MEMORY.md", AGENT, USER, settings)  # one file: its own name is its source
    assert {r.source for r in single.records} == {"MEMORY.md"} and single.files == ["MEMORY.md"]
    assert [m.id for m in single.memories] == [m.id for m in first.memories][:7]

    # The same note in two files, and twice in one: one memory, listed by both files.
    (sample / "notes/copy.md").write_text((sample / "notes/packing.md").read_text() + "\n\n- Porto is home.\n"
                                          "- Porto is home.\n")
    dup = plan_import(sample, AGENT, USER, settings)
    packing = next(m for m in dup.memories if m.content.startswith("Packing list"))
    assert [m.content for m in dup.memories].count(packing.content) == 1
    assert [i.memory_id for i in dup.items["notes/copy.md"]] == [packing.id, dup.memories[-1].id]
    assert [i.memory_id for i in dup.items["notes/packing.md"]] == [packing.id]
    assert len(dup.memories) == len(edited.memories) + 1


def _bad_inputs(tmp: Path) -> list[tuple[Path, str, str | None, dict, str]]:
    (tmp / "empty-dir").mkdir()
    (tmp / "only-text").mkdir()
    (tmp / "only-text/a.txt").write_text("hello")
    (tmp / "big.md").write_text("x" * 2048)
    (tmp / "latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    (tmp / "long-soul").mkdir()
    (tmp / "long-soul/SOUL.md").write_text("I am " + "very " * 40)
    (tmp / "two").mkdir()
    (tmp / "two/a.md").write_text("a")
    (tmp / "two/b.md").write_text("b")
    (tmp / "long-line").mkdir()
    (tmp / "long-line/MEMORY.md").write_text("- " + "word " * 30)
    (tmp / "unreadable.md").symlink_to("/proc/self/mem")  # a regular file every read of fails (even as root)
    return [
        (tmp / "missing", AGENT, None, {}, "does not exist"),
        (tmp / "only-text/a.txt", AGENT, None, {}, "not a markdown file"),
        (tmp / "empty-dir", AGENT, None, {}, "holds no markdown files"),
        (tmp / "only-text", AGENT, None, {}, "holds no markdown files"),
        (tmp / "big.md", AGENT, None, {"import_max_file_bytes": 1024}, "IMPORT_MAX_FILE_BYTES"),
        (tmp / "latin1.md", AGENT, None, {}, "not UTF-8"),
        (tmp / "unreadable.md", AGENT, None, {}, "unreadable.md: cannot be read"),
        (tmp / "long-soul", AGENT, None, {"startup_max_record_chars": 100}, "STARTUP_MAX_RECORD_CHARS"),
        (tmp / "two", AGENT, None, {"import_max_files": 1}, "IMPORT_MAX_FILES"),
        (tmp / "long-line", AGENT, None, {"max_message_chars": 100}, "MAX_MESSAGE_CHARS"),
        (SAMPLE, "a:b", None, {}, "agent_id"),
        (SAMPLE, AGENT, " ada", {}, "user_id"),
    ]


def test_bad_input_is_refused_naming_what_and_which_limit(tmp_path):
    for path, agent, user, overrides, detail in _bad_inputs(tmp_path):
        with pytest.raises(InvalidInput, match=detail):
            plan_import(path, agent, user, suite_settings("redis://unused", **overrides))


@pytest.fixture
async def quiet_service(falkordb_url):
    """A service without a worker: nothing writes on its own while the store is compared."""
    await flush(falkordb_url)
    async with open_service(suite_settings(falkordb_url), run_worker=False) as service:
        yield service


def _changes(report) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """(added, replaced, unchanged, removed) of the records, then of the memories."""
    return tuple((c.added, c.replaced, c.unchanged, c.removed) for c in (report.records, report.memories))  # type: ignore[return-value]


async def _import(service, path: Path, prune: bool = False):
    return await service.import_legacy(plan_import(path, AGENT, USER, service.settings, prune=prune))


async def _found(service, query: str) -> list[str]:
    return [r.content for r in (await service.search(AGENT, query, scope="user", user_id=USER, top_k=20)).results]


async def test_importing_twice_stores_each_thing_once(quiet_service, falkordb_url):
    service = quiet_service
    first = await _import(service, SAMPLE)
    assert _changes(first) == ((5, 0, 0, 0), (9, 0, 0, 0))
    records = await service.list_startup_records(AGENT)
    assert [r.priority.value for r in records] == ["P0", "P0", "P1", "P1", "P2"]
    before = await asyncio.to_thread(snapshot, falkordb_url)
    again = await _import(service, SAMPLE)
    assert _changes(again) == ((0, 0, 5, 0), (0, 0, 9, 0))
    changes = before.changes(await asyncio.to_thread(snapshot, falkordb_url))
    # Only the audit log grew (the second import is recorded too); no record, memory or manifest changed.
    assert (changes["added"], changes["removed"], changes["changed"]) == ([], [], [f"ms:audit:agent:{AGENT}"])
    assert await service.list_startup_records(AGENT) == records
    audit = await service.audit.read(AGENT, action="startup.import")
    assert [e.key_id for e in audit.entries] == ["cli", "cli"]
    assert audit.entries[0].after["memories"]["unchanged"] == 9 and audit.entries[1].after["records"]["added"] == 5

    # The memories went through the backend: stored, embedded, searchable in the user's scope, notes too.
    _, backend = await service.agents.backend_for(AGENT)
    assert await backend.count(AGENT, Namespace.user(AGENT, USER)) == 9
    assert await backend.unembedded(AGENT, 10) == []
    assert "allergic to peanuts" in (await _found(service, "peanut allergy"))[0]
    assert (await _found(service, "Heathrow connections"))[0].startswith("OPO is Porto")
    # ... and the memory block shows a note among its relevant memories.
    block = await service.assemble_memory_context(AGENT, USER, "s-1", query="Which airport is LHR?")
    assert "LHR is London Heathrow" in block.xml


async def test_a_changed_line_replaces_its_memory_and_the_old_one_leaves_search(quiet_service, sample):
    service = quiet_service
    memory_md = sample / "MEMORY.md"
    memory_md.write_text(memory_md.read_text().replace("- The family lives in Porto", "- Bob lives in Leeds.\n"
                                                       "- The family lives in Porto"))
    await _import(service, sample)
    assert "Bob lives in Leeds." in await _found(service, "Where does Bob live? Leeds")
    memory_md.write_text(memory_md.read_text().replace("Bob lives in Leeds.", "Bob lives in York."))
    report = await _import(service, sample)
    assert _changes(report) == ((0, 0, 5, 0), (0, 1, 9, 0))
    found = await _found(service, "Where does Bob live? Leeds")
    assert "Bob lives in York." in found and not any("Leeds" in c for c in found)
    # Removed the normal way: soft-deleted (undeletable until the purge), audited under the CLI's key id.
    deleted = (await service.audit.read(AGENT, action="memory.delete")).entries
    assert [e.key_id for e in deleted] == ["cli"]
    old = await service.memory_get(AGENT, deleted[0].target)
    assert old.content == "Bob lives in Leeds." and old.deleted_at is not None
    # The line back as it was: the same memory, live again, the York one gone.
    memory_md.write_text(memory_md.read_text().replace("Bob lives in York.", "Bob lives in Leeds."))
    assert _changes(await _import(service, sample)) == ((0, 0, 5, 0), (0, 1, 9, 0))
    assert (await service.memory_get(AGENT, deleted[0].target)).deleted_at is None
    assert "Bob lives in York." not in await _found(service, "Where does Bob live? York")


async def test_a_deleted_section_removes_its_memories_and_nothing_else(quiet_service, sample):
    service = quiet_service
    _, backend = await service.agents.backend_for(AGENT)
    namespace = str(Namespace.user(AGENT, USER))
    # A memory from elsewhere (a conversation, the tools) with the same words as a line of the file: never touched.
    said = Memory(id="conv-1", kind=MemoryKind.FACT, namespace=namespace,
                  content="Ada books late at night and answers quickly then.",
                  metadata=Provenance(agent_id=AGENT, user_id=USER))
    await backend.write([said])
    (sample / "notes/family.md").write_text("- Tunde is vegetarian and allergic to peanuts.\n"
                                            "  - He carries an EpiPen; mention it when booking meals.\n")
    first = await _import(service, sample)
    assert _changes(first)[1] == (9, 0, 0, 0)  # the family note's line is MEMORY.md's: one memory
    memory_md = sample / "MEMORY.md"
    text = memory_md.read_text()
    memory_md.write_text(text[:text.index("## About the family")] + text[text.index("## Observations"):])
    report = await _import(service, sample)
    # Three of the section's four items removed; Tunde's stays, notes/family.md still gives it.
    assert _changes(report) == ((0, 0, 5, 0), (0, 0, 6, 3))
    assert await backend.count(AGENT, Namespace.user(AGENT, USER)) == 6 + 1
    assert not any("window seats" in c for c in await _found(service, "window seats on long flights"))
    assert any("allergic to peanuts" in c for c in await _found(service, "peanut allergy"))
    assert [m.deleted_at for m in await backend.find(AGENT, ["conv-1"])] == [None]
    # The note gone from the folder: kept unless --prune, then its memory goes too.
    (sample / "notes/family.md").unlink()
    kept = await _import(service, sample)
    assert kept.kept == ["notes/family.md"] and _changes(kept)[1] == (0, 0, 5, 0)  # unchanged: of what PATH gives
    pruned = await _import(service, sample, prune=True)
    assert pruned.pruned == ["notes/family.md"] and _changes(pruned)[1] == (0, 0, 5, 1)
    assert not any("allergic to peanuts" in c for c in await _found(service, "peanut allergy"))
    assert [m.deleted_at for m in await backend.find(AGENT, ["conv-1"])] == [None]


async def test_a_line_another_file_still_gives_stays_when_one_file_is_imported_alone(quiet_service, sample):
    service = quiet_service
    (sample / "notes/family.md").write_text("- The family lives in Porto, near the São Bento station.\n")
    await _import(service, sample)
    memory_md = sample / "MEMORY.md"
    memory_md.write_text(memory_md.read_text().replace("- The family lives in Porto, near the São Bento station.\n", ""))
    alone = await _import(service, memory_md)  # notes/family.md is not imported now, and still lists the line
    assert _changes(alone) == ((0, 0, 3, 0), (0, 0, 6, 0))  # MEMORY.md's records and memories
    assert any("São Bento" in c for c in await _found(service, "Sao Bento station Porto"))
    memory_md.write_text(memory_md.read_text().replace("The kids' passports expire in March 2027.\n", ""))
    assert _changes(await _import(service, memory_md)) == ((0, 0, 3, 0), (0, 0, 5, 1))  # a line only MEMORY.md gave


async def test_an_emptied_file_keeps_what_it_gave_unless_pruned(quiet_service, sample):
    service = quiet_service
    await _import(service, sample)
    (sample / "notes/airports.md").write_text("  \n")
    (sample / "SOUL.md").write_text("")
    kept = await _import(service, sample)
    assert kept.kept == ["SOUL.md", "notes/airports.md"] and kept.pruned == []
    assert _changes(kept) == ((0, 0, 4, 0), (0, 0, 8, 0))
    assert "Soul" in {r.title for r in await service.list_startup_records(AGENT)}
    pruned = await _import(service, sample, prune=True)
    assert pruned.pruned == ["SOUL.md", "notes/airports.md"]
    assert _changes(pruned) == ((0, 0, 4, 1), (0, 0, 8, 1))
    assert "Soul" not in {r.title for r in await service.list_startup_records(AGENT)}
    assert not any("Heathrow" in c for c in await _found(service, "Heathrow connections"))
    # A single file imported with --prune prunes that file only (known by its own name, relative to
    # its folder: "packing.md", which nothing gave), never the others it does not name.
    (sample / "notes/packing.md").write_text("")
    alone = await _import(service, sample / "notes/packing.md", prune=True)
    assert (alone.pruned, alone.kept, _changes(alone)) == ([], [], ((0, 0, 0, 0), (0, 0, 0, 0)))
    assert any("Packing list" in c for c in await _found(service, "packing list winter"))


async def test_memories_of_a_first_release_import_are_adopted(quiet_service, sample):
    """Before the manifest, a memory's id had its file in the digest: the first re-import
    replaces those ids by the new ones (same words), instead of keeping both."""
    service = quiet_service
    plan = plan_import(sample, AGENT, USER, service.settings)
    legacy = {i.memory_id: i.legacy_id for items in plan.items.values() for i in items}
    _, backend = await service.agents.backend_for(AGENT)
    await backend.write([m.model_copy(update={"id": legacy[m.id]}) for m in plan.memories])
    # ... and a note was a P3 record: the note's memory replaces it.
    from memory_service.schemas.startup import StartupRecordIn

    note = StartupRecordIn(priority=Priority.P3, title="Airports we use", content="OPO is Porto, ...")
    await service.startup.put(AGENT, "imp-oldnote", note, source="notes/airports.md")
    report = await service.import_legacy(plan)
    assert _changes(report) == ((5, 0, 0, 1), (0, 9, 0, 0))
    assert "imp-oldnote" not in {r.id for r in await service.list_startup_records(AGENT)}
    assert await backend.count(AGENT, Namespace.user(AGENT, USER)) == 9
    assert sorted(await _found(service, "window seats")).count("Ada Okafor prefers window seats on long flights.") == 1


async def test_a_bad_file_changes_nothing_stored(quiet_service, falkordb_url, sample):
    service = quiet_service
    await _import(service, sample)
    before = await asyncio.to_thread(snapshot, falkordb_url)
    memory_md = sample / "MEMORY.md"
    good = memory_md.read_bytes()
    for bad, detail in ((good.replace(b"Porto", "Porto caf\xe9".encode("latin-1")), "not UTF-8"),
                        (good + b"x" * 2048, "IMPORT_MAX_FILE_BYTES")):
        memory_md.write_bytes(bad)
        with pytest.raises(InvalidInput, match=detail):
            await service.import_legacy(plan_import(sample, AGENT, USER,
                                                    suite_settings(falkordb_url, import_max_file_bytes=2048)))
    memory_md.write_bytes(good.replace(b"Porto", b"Lisbon"))  # a change, and an unreadable note beside it
    (sample / "notes/broken.md").symlink_to("/proc/self/mem")
    with pytest.raises(InvalidInput, match="notes/broken.md: cannot be read"):
        await _import(service, sample)
    assert await asyncio.to_thread(snapshot, falkordb_url) == before


async def test_a_changed_file_replaces_its_records(quiet_service, sample):
    service = quiet_service
    await _import(service, sample)
    (sample / "SOUL.md").write_text("# Soul\n\nI am Atlas, and I now plan trains only.\n")
    report = await _import(service, sample)
    assert _changes(report)[0] == (0, 1, 4, 0)
    souls = [r for r in await service.list_startup_records(AGENT) if r.source == "SOUL.md"]
    assert [r.content for r in souls] == ["I am Atlas, and I now plan trains only."]
    # A record an admin made stays, whatever is imported.
    from memory_service.schemas.startup import StartupRecordIn

    await service.put_startup_record(AGENT, "house-rule", StartupRecordIn(priority=Priority.P1, title="t", content="c"))
    await _import(service, sample, prune=True)
    assert "house-rule" in {r.id for r in await service.list_startup_records(AGENT)}


async def test_an_import_past_the_record_limit_stores_nothing(falkordb_url):
    await flush(falkordb_url)
    async with open_service(suite_settings(falkordb_url, startup_max_records=4), run_worker=False) as service:
        before = await asyncio.to_thread(snapshot, falkordb_url)
        with pytest.raises(InvalidInput, match="STARTUP_MAX_RECORDS"):
            await service.import_legacy(plan_import(SAMPLE, AGENT, USER, service.settings))
        assert await asyncio.to_thread(snapshot, falkordb_url) == before


# The command, as an operator runs it -------------------------------------------------

HASH_EMBEDDER = {"EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64"}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**clean_env(), **HASH_EMBEDDER, "COLUMNS": "200"}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=180, env=env)


def row(output: str, what: str) -> list[str]:
    """The numbers of a row of the command's summary table."""
    line = next(line for line in output.splitlines() if what in line and "│" in line)
    return [cell.strip() for cell in line.strip("│┃ ").split("│")][1:]


async def test_the_command_imports_into_a_running_server(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    files = Path(shutil.copytree(SAMPLE, tmp_path / "legacy"))
    proc = subprocess.Popen([CLI, "serve", "--port", str(port), "--data-dir", str(data_dir), "--no-worker"],
                            env={**clean_env(), **HASH_EMBEDDER}, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(base, proc)
        done = await asyncio.to_thread(cli, "import", str(files), "--agent", AGENT, "--user", USER,
                                       "--data-dir", str(data_dir))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "5 startup records (2 P0, 2 P1, 1 P2), 9 memories; skipped notes/scan.txt" in done.stdout
        assert row(done.stdout, "startup records") == ["5", "0", "0", "0"]
        assert row(done.stdout, "memories") == ["9", "0", "0", "0"]
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            listed = (await http.get(f"/v1/agents/{AGENT}/startup")).json()
            assert len(listed) == 5 and {r["source"] for r in listed} == {"SOUL.md", "IDENTITY.md", "MEMORY.md"}
            block = (await http.get(f"/v1/agents/{AGENT}/startup/block", params={"model": "phi-3"})).json()
            assert block["budget"] == 1000 and block["records"][0]["title"] in ("Identity", "Soul")

            async def search(query: str) -> list[str]:
                answer = await http.get("/v1/search", params={"agent_id": AGENT, "query": query, "scope": "user",
                                                              "user_id": USER})
                return [r["content"] for r in answer.json()["results"]]

            assert (await search("window seats"))[0] == "Ada Okafor prefers window seats on long flights."
            assert (await search("winter packing list"))[0].startswith("Packing list for winter trips")  # a note
            context = (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": USER, "session_id": "s-1",
                                                             "query": "What goes in the suitcase for winter?"})).json()
            assert "thermal layers" in context["xml"]

            again = await asyncio.to_thread(cli, "import", str(files), "--agent", AGENT, "--user", USER,
                                            "--data-dir", str(data_dir))
            assert again.returncode == 0, again.stdout + again.stderr
            assert row(again.stdout, "startup records") == ["0", "0", "5", "0"]
            assert row(again.stdout, "memories") == ["0", "0", "9", "0"]
            assert (await http.get(f"/v1/agents/{AGENT}/startup")).json() == listed

            # A line changed, a note emptied: one memory replaced, the emptied note kept and said so.
            memory_md = files / "MEMORY.md"
            memory_md.write_text(memory_md.read_text().replace("window seats", "aisle seats"))
            (files / "notes/airports.md").write_text("")
            edited = await asyncio.to_thread(cli, "import", str(files), "--agent", AGENT, "--user", USER,
                                             "--data-dir", str(data_dir))
            assert edited.returncode == 0, edited.stdout + edited.stderr
            assert row(edited.stdout, "memories") == ["0", "1", "7", "0"]
            assert "kept what these files gave before (empty or missing now; --prune removes it): notes/airports.md" \
                in edited.stdout
            found = await search("window seats on long flights")
            assert "Ada Okafor prefers aisle seats on long flights." in found and not any("window" in c for c in found)
            pruned = await asyncio.to_thread(cli, "import", str(files), "--agent", AGENT, "--user", USER, "--prune",
                                             "--data-dir", str(data_dir))
            assert row(pruned.stdout, "memories") == ["0", "0", "8", "1"], pruned.stdout
            assert "pruned (empty or missing now, what they gave removed): notes/airports.md" in pruned.stdout

            refused = await asyncio.to_thread(cli, "import", str(tmp_path / "nowhere"), "--agent", AGENT,
                                              "--data-dir", str(data_dir))
            assert refused.returncode == 2 and "does not exist" in refused.stdout
            audit = (await http.get("/v1/audit", params={"agent_id": AGENT, "action": "startup.import"})).json()
            assert [e["key_id"] for e in audit["entries"]] == ["cli"] * 4
            deletes = (await http.get("/v1/audit", params={"agent_id": AGENT, "action": "memory.delete"})).json()
            assert [e["key_id"] for e in deletes["entries"]] == ["cli", "cli"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_the_command_starts_the_store_when_no_server_runs(tmp_path):
    data_dir = tmp_path / "data"
    first = cli("import", str(SAMPLE / "SOUL.md"), "--agent", AGENT, "--data-dir", str(data_dir))
    assert first.returncode == 0, first.stdout + first.stderr
    assert row(first.stdout, "startup records") == ["1", "0", "0", "0"]
    second = cli("import", str(SAMPLE / "SOUL.md"), "--agent", AGENT, "--data-dir", str(data_dir))
    assert row(second.stdout, "startup records") == ["0", "0", "1", "0"]  # the first one was kept on disk
    bad = cli("import", str(SAMPLE / "notes/scan.txt"), "--agent", AGENT, "--data-dir", str(data_dir))
    assert bad.returncode == 2 and "not a markdown file" in bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
