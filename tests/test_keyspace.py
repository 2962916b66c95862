"""memory_service/state/keyspace.py builds every ``ms:*`` Redis key, builds the keys of its
KEYSPACE_VERSION (stored data: a change of names is a new version, with its upgrade in
memory_service/state/upgrade.py), and its docstring maps them all."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from memory_service.state import keyspace

ROOT = Path(__file__).resolve().parent.parent / "memory_service"
KEYSPACE = ROOT / "state" / "keyspace.py"

# An ``ms:`` key, whole or a prefix, in code, a docstring or a comment: "ms:" right after
# something that is not part of a word, followed by anything but a space ("took_ms: float",
# "items:" and "5 ms: the" do not match).
KEY_LITERAL = re.compile(r"(?<![\w-])ms:(?=\S)")

# Each builder with example arguments, and the key it builds: stored data, changed only with
# KEYSPACE_VERSION and a rename in memory_service/state/upgrade.py (tests/test_upgrade.py
# checks the keys of version 1, as the first releases wrote them, move to these).
S1 = "s:240"  # session_tag("s1")
EXAMPLES: list[tuple[str, tuple[object, ...], object]] = [
    ("KEYSPACE", (), "ms:keyspace"),
    ("EMBEDDER", (), "ms:embedder"),
    ("USER_DIGEST_KEY", (), "ms:user-digest-key"),
    ("AGENTS", (), "ms:agents"),
    ("BROWSE_INDEX", (), "ms:browse-index"),
    ("RETENTION_AGENTS", (), "ms:retention:agents"),
    ("WORKERS", (), "ms:workers"),
    ("DOORBELL", (), "ms:queue:doorbell"),
    ("windows", (S1,), "ms:windows:{s:240}"),
    ("active", (S1,), "ms:active:{s:240}"),
    ("in_flight", (S1,), "ms:inflight:{s:240}"),
    ("metrics", (S1,), "ms:metrics:{s:240}"),
    ("metrics", ("outbox",), "ms:metrics:{outbox}"),
    ("agent_settings", ("a1",), "ms:agent:a1"),
    ("agent_sessions", ("a1",), "ms:agent:a1:sessions"),
    ("agent_backends", ("a1",), "ms:agent:a1:backends"),
    ("agent_session_order", ("a1",), "ms:agent:a1:session-order"),
    ("agent_session_count", ("a1",), "ms:agent:a1:session-count"),
    ("agent_users", ("a1",), "ms:agent:a1:users"),
    ("shards", ("a1",), "ms:shards:a1"),
    ("user_sessions", ("a1", "alice"), "ms:u:{user:a1:alice}:sessions"),
    ("user_recorded", ("a1", "alice"), "ms:u:{user:a1:alice}:recorded"),
    ("user_joined", ("a1", "alice"), "ms:u:{user:a1:alice}:joined"),
    ("embed_due", ("a1",), "ms:embed:{embed:a1}:due"),
    ("embed_lock", ("a1",), "ms:embed:{embed:a1}:job"),
    ("embed_claim", ("a1", "m1"), "ms:embed:{embed:a1}:claim:m1"),
    ("startup_records", ("a1",), "ms:startup:{agent:a1}"),
    ("reembed", ("a1",), "ms:reembed:a1"),
    ("trace_job", ("j1",), "ms:trace:job:j1"),
    ("import_manifest", ("a1",), "ms:import:a1"),
    ("memory_access", ("a1",), "ms:memaccess:{retention:a1}"),
    ("retention_deleted", ("a1",), "ms:retention:{retention:a1}:deleted"),
    ("forget_records", ("a1",), "ms:forget:{forget:a1}"),
    ("audit_stream", ("a1",), "ms:audit:agent:a1"),
    ("HOOK_AGENTS", (), "ms:ev:hook-agents"),
    ("event_stream", ("a1",), "ms:ev:{ev:a1}:stream"),
    ("webhooks", ("a1",), "ms:ev:{ev:a1}:hooks"),
    ("webhook_delivery", ("a1", "h1"), "ms:ev:{ev:a1}:hook:h1"),
    ("webhook_dead", ("a1", "h1"), "ms:ev:{ev:a1}:dead:h1"),
    ("webhook_replay", ("a1", "h1"), "ms:ev:{ev:a1}:replay:h1"),
    ("webhook_lock", ("a1", "h1"), "ms:ev:{ev:a1}:lock:h1"),
    ("audit_stream", (None,), "ms:audit:system"),
    ("session_keys", ("s1",), {part: f"ms:s:{{s:240}}:s1:{part}" for part in
                               ("meta", "ids", "pending", "tokens", "users", "committed", "startup", "inflight", "formed",
                                "participants", "reform")}),
    ("window", ("s1",), "ms:s:{s:240}:s1:window"),
    ("legacy_claim", ("s1",), "ms:s:{s:240}:s1:claim"),
    ("cons_pending", ("user:a1:alice",), "ms:cons:{user:a1:alice}:user:a1:alice:pending"),
    ("cons_version", ("shard:a1:sh1",), "ms:cons:{shard:a1:sh1}:shard:a1:sh1:version"),
    ("cons_pending", ("session:s1",), "ms:cons:{s:240}:session:s1:pending"),
    ("generation", ("session:s1",), "ms:gen:{s:240}:session:s1"),
    ("generation", ("agent:a1",), "ms:gen:{agent:a1}:agent:a1"),
    ("cached_block", ("9f86d081",), "ms:ctx:9f86d081"),
    ("last_good_block", ('["a1", "alice", "s1", 4000, null]',), 'ms:ctx:last:["a1", "alice", "s1", 4000, null]'),
    ("cache_index", ("a1",), "ms:ctxkeys:a1"),
    ("API_KEYS", (), "ms:keys"),
    ("api_key", ("3f9c0a7d2b1e4c58",), "ms:key:{3f9c0a7d2b1e4c58}"),
    ("agent_api_keys", ("a1",), "ms:agent:a1:keys"),
    ("rate_counter", ("3f9c0a7d2b1e4c58", "r", 29_000_000), "ms:rl:{3f9c0a7d2b1e4c58}:r:29000000"),
    ("rate_counter", ("3f9c0a7d2b1e4c58", "t", 28_999_999), "ms:rl:{3f9c0a7d2b1e4c58}:t:28999999"),
    ("agent_rate_counter", ("a1", "r", 29_000_000), "ms:arl:{arl:a1}:r:29000000"),
    ("llm_usage", ("a1", "d2026-12-07"), "ms:llm:{llm}:a1:d2026-12-07"),
    ("llm_usage", (None, "m2026-12"), "ms:llmd:{llm}:m2026-12"),
    ("OUTBOX_ENTRIES", (), "ms:outbox:{outbox}:entries"),
    ("OUTBOX_REFS", (), "ms:outbox:{outbox}:refs"),
    ("OUTBOX_SEQ", (), "ms:outbox:{outbox}:seq"),
    ("OUTBOX_LEGACY_SEQ", (), "ms:outbox:{outbox}:legacy_seq"),
    ("OUTBOX_METRICS", (), "ms:metrics:{outbox}"),
    ("outbox_queue", ("mongo",), "ms:outbox:{outbox}:queue:mongo"),
    ("outbox_attempts", ("mongo",), "ms:outbox:{outbox}:attempts:mongo"),
    ("outbox_errors", ("graph",), "ms:outbox:{outbox}:errors:graph"),
    ("outbox_dead", ("mongo",), "ms:outbox:{outbox}:dead:mongo"),
    ("outbox_lock", ("graph",), "ms:outbox:{outbox}:lock:graph"),
    ("outbox_legacy_queue", ("mongo",), "ms:outbox:{outbox}:mongo"),
    ("postings_prefix", ("a1",), "ms:ft:{a1}:"),
    ("postings_stats", ("a1",), "ms:ft:{a1}:stats"),
    ("postings_docs", ("a1",), "ms:ft:{a1}:docs"),
    ("postings_term", ("a1", "flight"), "ms:ft:{a1}:p:flight"),
    ("postings_nums", ("a1",), "ms:ft:{a1}:nums"),
    ("postings_ids", ("a1",), "ms:ft:{a1}:ids"),
    ("postings_dead", ("a1",), "ms:ft:{a1}:dead"),
    ("postings_build_lock", ("a1",), "ms:ft:{a1}:build"),
]

# keyspace's functions that build hash tags, not keys.
# Helpers that build tags or read keys, not keys.
TAG_HELPERS = {"session_tag", "bucket_tags", "namespace_tag", "metric_tags", "user_of"}

# How the map writes each builder's parameters.
PLACEHOLDERS = {"agent_id": "<agent>", "user_id": "<user>", "session_id": "<session>", "namespace": "<namespace>",
                "digest": "<digest>", "identity": "<identity>", "key_id": "<id>", "kind": "<r|t>", "minute": "<minute>",
                "target": "<target>", "tag": "s:<b>", "job_id": "<job id>", "term": "<stem>",
                "memory_id": "<memory>", "period": "<period>", "hook_id": "<hook>"}


def _builders() -> dict[str, object]:
    """keyspace's public names that are keys or build them."""
    return {name: value for name, value in vars(keyspace).items()
            if not name.startswith("_") and name not in TAG_HELPERS
            and (inspect.isfunction(value) or (isinstance(value, str) and value.startswith("ms:")))}


UPGRADE = ROOT / "state" / "upgrade.py"  # names the keys of older layouts, to rename them


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p not in (KEYSPACE, UPGRADE))


def test_no_module_but_keyspace_names_a_key():
    found = []
    for path in _modules():
        source = path.read_text()
        for number, line in enumerate(source.splitlines(), 1):
            if KEY_LITERAL.search(line):
                found.append(f"{path.relative_to(ROOT.parent)}:{number}: {line.strip()}")
        # A key glued from pieces ("ms" + ":" + ...) is a key literal too.
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and node.value in ("ms", "ms:"):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.value!r}")
    assert not found, "build Redis keys in memory_service/state/keyspace.py:\n" + "\n".join(found)


def test_the_check_finds_a_key_literal():
    """The pattern above catches what it must, and lets the lookalikes pass."""
    for text in ('KEY = "ms:metrics"', 'f"ms:s:{{{sid}}}:window"', "# kept in ms:agent:<agent>", "``ms:gen:<ns>``"):
        assert KEY_LITERAL.search(text), text
    for text in ("took_ms: float", "items: list[str]", "answers within 5 ms: the", "GRAPH_PREFIX = \"ms_\""):
        assert not KEY_LITERAL.search(text), text
    assert KEY_LITERAL.search(KEYSPACE.read_text())


@pytest.mark.parametrize(("name", "args", "expected"), EXAMPLES, ids=[f"{n}{a}" for n, a, _ in EXAMPLES])
def test_keys_are_the_ones_of_the_keyspace_version(name, args, expected):
    value = getattr(keyspace, name)
    assert (value(*args) if callable(value) else value) == expected


def test_user_of_reads_the_user_back():
    for user in ("alice", "bob-2", "a.b"):
        assert keyspace.user_of("a1", keyspace.user_sessions("a1", user)) == user
        assert keyspace.user_of("a1", keyspace.user_recorded("a1", user)) == user
    assert keyspace.user_of("a2", keyspace.user_sessions("a1", "alice")) is None
    assert keyspace.user_of("a1", keyspace.agent_sessions("a1")) is None


def test_every_key_has_an_example():
    missing = set(_builders()) - {name for name, _, _ in EXAMPLES}
    assert not missing, f"add an example of each to EXAMPLES: {sorted(missing)}"


def test_the_map_names_every_key():
    """The module docstring lists each key as its builder writes it, with placeholders."""
    doc = keyspace.__doc__ or ""
    for name, builder in _builders().items():
        if isinstance(builder, str):
            patterns = [builder]
        else:
            assert inspect.isfunction(builder)
            built = builder(*(PLACEHOLDERS[p] for p in inspect.signature(builder).parameters))
            patterns = list(built.values()) if isinstance(built, dict) else [built]
        # A session's bucket is computed from its id: the map writes it <b>; a namespace's tag <tag>.
        patterns = [re.sub(r"\{s:\d{3}\}", "{s:<b>}", p).replace("{<namespace>}", "{<tag>}") for p in patterns]
        for pattern in patterns:
            assert pattern in doc, f"keyspace's docstring does not list {pattern} ({name})"
    assert keyspace.audit_stream(None) in doc


# The keys of the memory block's cache: only memory_service/state/cache.py names them, so
# every invalidation (a generation bumped, a cached block purged) goes through it.
CACHE_KEYS = {"generation", "cached_block", "last_good_block", "cache_index"}


def test_only_the_cache_module_names_the_cache_keys():
    found = []
    for path in _modules():
        if path == ROOT / "state" / "cache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: set[str] = set()
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "keyspace":
                names = {node.attr}
            elif isinstance(node, ast.ImportFrom) and node.module == "memory_service.state.keyspace":
                names = {alias.name for alias in node.names}
            found += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {n}" for n in sorted(names & CACHE_KEYS)]
    assert not found, "invalidate through memory_service/state/cache.py:\n" + "\n".join(found)
