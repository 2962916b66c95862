"""memory_service/state/keyspace.py builds every ``ms:*`` Redis key, builds the keys the
service always built (stored data must stay readable: there is no migration of key names),
and its docstring maps them all."""

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

# Each builder with example arguments, and the key the code built before keyspace.py did
# (as the modules wrote them: store, window, keys, audit, outbox, retention, startup, pseudonyms).
EXAMPLES: list[tuple[str, tuple[object, ...], object]] = [
    ("ACTIVE", (), "ms:active"),
    ("IN_FLIGHT", (), "ms:inflight"),
    ("METRICS", (), "ms:metrics"),
    ("EMBEDDER", (), "ms:embedder"),
    ("USER_DIGEST_KEY", (), "ms:user-digest-key"),
    ("RETENTION_DELETED", (), "ms:retention:deleted"),
    ("agent_settings", ("a1",), "ms:agent:a1"),
    ("agent_sessions", ("a1",), "ms:agent:a1:sessions"),
    ("agent_backends", ("a1",), "ms:agent:a1:backends"),
    ("shards", ("a1",), "ms:shards:a1"),
    ("user_sessions", ("a1", "alice"), "ms:agent:a1:user:alice:sessions"),
    ("user_recorded", ("a1", "alice"), "ms:agent:a1:user:alice:recorded"),
    ("embed_due", ("a1",), "ms:embed:a1:due"),
    ("embed_lock", ("a1",), "ms:embed:a1:job"),
    ("reembed", ("a1",), "ms:reembed:a1"),
    ("startup_records", ("a1",), "ms:startup:a1"),
    ("import_manifest", ("a1",), "ms:import:a1"),
    ("memory_access", ("a1",), "ms:memaccess:a1"),
    ("audit_stream", ("a1",), "ms:audit:agent:a1"),
    ("audit_stream", (None,), "ms:audit:system"),
    ("session_keys", ("s1",), {
        "meta": "ms:s:s1:meta", "ids": "ms:s:s1:ids", "pending": "ms:s:s1:pending", "tokens": "ms:s:s1:tokens",
        "users": "ms:s:s1:users", "committed": "ms:s:s1:committed", "startup": "ms:s:s1:startup",
        "inflight": "ms:s:{s1}:inflight"}),
    ("window", ("s1",), "ms:s:{s1}:window"),
    ("legacy_claim", ("s1",), "ms:s:s1:claim"),
    ("cons_pending", ("user:a1:alice",), "ms:cons:user:a1:alice:pending"),
    ("cons_version", ("shard:a1:sh1",), "ms:cons:shard:a1:sh1:version"),
    ("generation", ("session:s1",), "ms:gen:session:s1"),
    ("generation", ("agent:a1",), "ms:gen:agent:a1"),
    ("cached_block", ("9f86d081",), "ms:ctx:9f86d081"),
    ("last_good_block", ('["a1", "alice", "s1", 4000, null]',), 'ms:ctx:last:["a1", "alice", "s1", 4000, null]'),
    ("cache_index", ("a1",), "ms:ctxkeys:a1"),
    ("API_KEYS", (), "ms:keys"),
    ("api_key", ("3f9c0a7d2b1e4c58",), "ms:key:{3f9c0a7d2b1e4c58}"),
    ("agent_api_keys", ("a1",), "ms:agent:a1:keys"),
    ("rate_counter", ("3f9c0a7d2b1e4c58", "r", 29_000_000), "ms:rl:{3f9c0a7d2b1e4c58}:r:29000000"),
    ("rate_counter", ("3f9c0a7d2b1e4c58", "t", 28_999_999), "ms:rl:{3f9c0a7d2b1e4c58}:t:28999999"),
    ("OUTBOX_ENTRIES", (), "ms:outbox:entries"),
    ("OUTBOX_REFS", (), "ms:outbox:refs"),
    ("OUTBOX_SEQ", (), "ms:outbox:seq"),
    ("OUTBOX_LEGACY_SEQ", (), "ms:outbox:legacy_seq"),
    ("outbox_queue", ("mongo",), "ms:outbox:queue:mongo"),
    ("outbox_attempts", ("mongo",), "ms:outbox:attempts:mongo"),
    ("outbox_errors", ("graph",), "ms:outbox:errors:graph"),
    ("outbox_dead", ("mongo",), "ms:outbox:dead:mongo"),
    ("outbox_lock", ("graph",), "ms:outbox:lock:graph"),
    ("outbox_legacy_queue", ("mongo",), "ms:outbox:mongo"),
    ("postings_prefix", ("a1",), "ms:ft:{a1}:"),
    ("postings_stats", ("a1",), "ms:ft:{a1}:stats"),
    ("postings_docs", ("a1",), "ms:ft:{a1}:docs"),
    ("postings_term", ("a1", "flight"), "ms:ft:{a1}:t:flight"),
    ("postings_build_lock", ("a1",), "ms:ft:{a1}:build"),
]

# How the map writes each builder's parameters.
PLACEHOLDERS = {"agent_id": "<agent>", "user_id": "<user>", "session_id": "<session>", "namespace": "<namespace>",
                "digest": "<digest>", "identity": "<identity>", "key_id": "<id>", "kind": "<r|t>", "minute": "<minute>",
                "target": "<target>", "term": "<stem>"}


def _builders() -> dict[str, object]:
    """keyspace's public names that are keys or build them."""
    return {name: value for name, value in vars(keyspace).items()
            if not name.startswith("_") and (inspect.isfunction(value) or (isinstance(value, str) and value.startswith("ms:")))}


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p != KEYSPACE)


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
def test_keys_are_the_ones_the_service_always_built(name, args, expected):
    value = getattr(keyspace, name)
    assert (value(*args) if callable(value) else value) == expected


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
