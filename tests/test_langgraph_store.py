"""MemoryServiceStore (memory_service/integrations/langgraph/store.py) against a real server:
LangGraph's own store tests, then the mapping onto the service and its failure modes.

The first part is copied from the langchain-ai/langgraph repository:
libs/checkpoint-postgres/tests/test_store.py (PostgresStore) and
libs/checkpoint/tests/test_store.py (InMemoryStore), under this licence:

    MIT License

    Copyright (c) 2024 LangChain, Inc.

    Permission is hereby granted, free of charge, to any person obtaining a copy
    of this software and associated documentation files (the "Software"), to deal
    in the Software without restriction, including without limitation the rights
    to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
    copies of the Software, and to permit persons to whom the Software is
    furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all
    copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
    FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
    AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
    LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
    OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
    SOFTWARE.

They run as written except where the service's semantics differ; each such change says
"DIFFERS:" and why, and docs/integrations/langgraph.md ("What the adapter does not keep")
lists them. Left out: the tests of LangGraph's own helpers (get_text_at_path,
AsyncBatchedBaseStore, PostgresStore's SQL and migrations) and those of what the adapter
does not offer (TTL, per-field embeddings, exact cosine scores; named in the doc).

Every test has an agent of its own (the agent isolates everything in the service), so the
module's server is never flushed. The server runs in a thread of its own (ThreadedServer):
the blocking client can call it from the test's thread.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import httpx
import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from memory_service.backends.loopback import free_port
from memory_service.client import AsyncMemoryClient, MemoryClient, NotFoundError, PermissionDenied, keyed_memory_id
from memory_service.curation import tools as server_tools
from memory_service.http.app import create_app
from memory_service.integrations.langgraph import MemorySearchItem, MemoryServiceStore

from .conftest import suite_settings
from .threaded_server import ThreadedServer

RUN = uuid.uuid4().hex[:6]
WRITERS = [f"lg-{RUN}-{i}" for i in range(120)]  # the agents whose writes are on (MEMORY_WRITE_AGENTS)
_next_writer = itertools.count()


@pytest.fixture(scope="module")
def lg_server(falkordb_url):
    with ThreadedServer(create_app(suite_settings(falkordb_url, memory_write_agents=WRITERS), run_worker=True)) as server:
        yield server


@pytest.fixture(scope="module")
def clients(lg_server):
    with MemoryClient(lg_server.base_url) as client:
        yield client, AsyncMemoryClient(lg_server.base_url)


@pytest.fixture
def agent() -> str:
    return WRITERS[next(_next_writer)]


@pytest.fixture
def store(clients, agent) -> MemoryServiceStore:
    client, async_client = clients
    return MemoryServiceStore(agent, client=client, async_client=async_client)


# -------------------------------------------------------------------------------------------
# From libs/checkpoint-postgres/tests/test_store.py
# -------------------------------------------------------------------------------------------


def test_batch_order(store: MemoryServiceStore) -> None:
    # Setup test data
    store.put(("test", "foo"), "key1", {"data": "value1"})
    store.put(("test", "bar"), "key2", {"data": "value2"})

    ops = [
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(
            namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0
        ),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(namespace=("test",), key="key3"),
    ]

    results = store.batch(ops)
    assert len(results) == 5
    assert isinstance(results[0], Item)
    assert isinstance(results[0].value, dict)
    assert results[0].value == {"data": "value1"}
    assert results[0].key == "key1"
    assert results[1] is None  # Put operation returns None
    assert isinstance(results[2], list)
    assert len(results[2]) == 1
    assert isinstance(results[3], list)
    assert len(results[3]) > 0  # Should contain at least our test namespaces
    assert results[4] is None  # Non-existent key returns None

    # Test reordered operations
    ops_reordered = [
        SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
        GetOp(namespace=("test", "bar"), key="key2"),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
        PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
        GetOp(namespace=("test", "foo"), key="key1"),
    ]

    results_reordered = store.batch(ops_reordered)
    assert len(results_reordered) == 5
    assert isinstance(results_reordered[0], list)
    assert len(results_reordered[0]) >= 2  # Should find at least our two test items
    assert isinstance(results_reordered[1], Item)
    assert results_reordered[1].value == {"data": "value2"}
    assert results_reordered[1].key == "key2"
    assert isinstance(results_reordered[2], list)
    assert len(results_reordered[2]) > 0
    assert results_reordered[3] is None  # Put operation returns None
    assert isinstance(results_reordered[4], Item)
    assert results_reordered[4].value == {"data": "value1"}
    assert results_reordered[4].key == "key1"


def test_batch_get_ops(store: MemoryServiceStore) -> None:
    # Setup test data
    store.put(("test",), "key1", {"data": "value1"})
    store.put(("test",), "key2", {"data": "value2"})

    ops = [
        GetOp(namespace=("test",), key="key1"),
        GetOp(namespace=("test",), key="key2"),
        GetOp(namespace=("test",), key="key3"),  # Non-existent key
    ]

    results = store.batch(ops)

    assert len(results) == 3
    assert results[0] is not None
    assert results[1] is not None
    assert results[2] is None
    assert results[0].key == "key1"
    assert results[1].key == "key2"


def test_batch_put_ops(store: MemoryServiceStore) -> None:
    ops = [
        PutOp(namespace=("test",), key="key1", value={"data": "value1"}),
        PutOp(namespace=("test",), key="key2", value={"data": "value2"}),
        PutOp(namespace=("test",), key="key3", value=None),  # Delete operation
    ]

    results = store.batch(ops)
    assert len(results) == 3
    assert all(result is None for result in results)

    # Verify the puts worked
    item1 = store.get(("test",), "key1")
    item2 = store.get(("test",), "key2")
    item3 = store.get(("test",), "key3")

    assert item1 and item1.value == {"data": "value1"}
    assert item2 and item2.value == {"data": "value2"}
    assert item3 is None


def test_batch_search_ops(store: MemoryServiceStore) -> None:
    # Setup test data
    test_data = [
        (("test", "foo"), "key1", {"data": "value1", "tag": "a"}),
        (("test", "bar"), "key2", {"data": "value2", "tag": "a"}),
        (("test", "baz"), "key3", {"data": "value3", "tag": "b"}),
    ]
    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    ops = [
        SearchOp(namespace_prefix=("test",), filter={"tag": "a"}, limit=10, offset=0),
        SearchOp(namespace_prefix=("test",), filter=None, limit=2, offset=0),
        SearchOp(namespace_prefix=("test", "foo"), filter=None, limit=10, offset=0),
    ]

    results = store.batch(ops)
    assert len(results) == 3

    # First search should find items with tag "a"
    assert len(results[0]) == 2
    assert all(item.value["tag"] == "a" for item in results[0])

    # Second search should return first 2 items
    assert len(results[1]) == 2

    # Third search should only find items in test/foo namespace
    assert len(results[2]) == 1
    assert results[2][0].namespace == ("test", "foo")


def test_batch_list_namespaces_ops(store: MemoryServiceStore) -> None:
    # Setup test data with various namespaces
    test_data = [
        (("test", "documents", "public"), "doc1", {"content": "public doc"}),
        (("test", "documents", "private"), "doc2", {"content": "private doc"}),
        (("test", "images", "public"), "img1", {"content": "public image"}),
        (("prod", "documents", "public"), "doc3", {"content": "prod doc"}),
    ]
    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    ops = [
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=2, limit=10, offset=0),
        ListNamespacesOp(
            match_conditions=[MatchCondition("suffix", "public")],
            max_depth=None,
            limit=10,
            offset=0,
        ),
    ]

    results = store.batch(ops)
    assert len(results) == 3

    # First operation should list all namespaces
    assert len(results[0]) == len(test_data)

    # Second operation should only return namespaces up to depth 2
    assert all(len(ns) <= 2 for ns in results[1])

    # Third operation should only return namespaces ending with "public"
    assert all(ns[-1] == "public" for ns in results[2])


def test_basic_store_ops(store: MemoryServiceStore) -> None:
    namespace = ("test", "documents")
    item_id = "doc1"
    item_value = {"title": "Test Document", "content": "Hello, World!"}

    store.put(namespace, item_id, item_value)
    item = store.get(namespace, item_id)

    assert item
    assert item.namespace == namespace
    assert item.key == item_id
    assert item.value == item_value

    # Test update
    updated_value = {"title": "Updated Document", "content": "Hello, Updated!"}
    store.put(namespace, item_id, updated_value)
    updated_item = store.get(namespace, item_id)

    assert updated_item.value == updated_value
    # DIFFERS: the service keeps times in whole seconds, so an update within the second of the
    # write has the same updated_at (upstream: strictly greater).
    assert updated_item.updated_at >= item.updated_at

    # Test get from non-existent namespace
    different_namespace = ("test", "other_documents")
    item_in_different_namespace = store.get(different_namespace, item_id)
    assert item_in_different_namespace is None

    # Test delete
    store.delete(namespace, item_id)
    deleted_item = store.get(namespace, item_id)
    assert deleted_item is None


def test_list_namespaces(store: MemoryServiceStore) -> None:
    # Create test data with various namespaces
    test_namespaces = [
        ("test", "documents", "public"),
        ("test", "documents", "private"),
        ("test", "images", "public"),
        ("test", "images", "private"),
        ("prod", "documents", "public"),
        ("prod", "documents", "private"),
    ]

    # Insert test data
    for namespace in test_namespaces:
        store.put(namespace, "dummy", {"content": "dummy"})

    # Test listing with various filters
    all_namespaces = store.list_namespaces()
    assert len(all_namespaces) == len(test_namespaces)

    # Test prefix filtering
    test_prefix_namespaces = store.list_namespaces(prefix=["test"])
    assert len(test_prefix_namespaces) == 4
    assert all(ns[0] == "test" for ns in test_prefix_namespaces)

    # Test suffix filtering
    public_namespaces = store.list_namespaces(suffix=["public"])
    assert len(public_namespaces) == 3
    assert all(ns[-1] == "public" for ns in public_namespaces)

    # Test max depth
    depth_2_namespaces = store.list_namespaces(max_depth=2)
    assert all(len(ns) <= 2 for ns in depth_2_namespaces)

    # Test pagination
    paginated_namespaces = store.list_namespaces(limit=3)
    assert len(paginated_namespaces) == 3

    # Cleanup
    for namespace in test_namespaces:
        store.delete(namespace, "dummy")


def test_search_namespace_segment_boundary(store: MemoryServiceStore) -> None:
    """Prefix scoping must stop at namespace segment boundaries.

    Namespaces are stored dot-joined, so matching the raw text also returns
    siblings sharing leading characters. Callers isolate tenants by namespace,
    so prefix-shaped ids (1 vs 12) would cross-read.
    """
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
        ("foobar",),
        ("foobar", "baz"),
        ("foo2",),
    ]:
        store.put(namespace, "k", {"v": 1})

    def _namespaces(prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {item.namespace for item in store.search(prefix, limit=100)}

    assert _namespaces(("foo",)) == {
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
    }
    # The sibling scope is independent, not merely narrower.
    assert _namespaces(("foobar",)) == {("foobar",), ("foobar", "baz")}
    assert _namespaces(("foo", "child")) == {("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(("foo2",)) == {("foo2",)}
    assert _namespaces(("fo",)) == set()


def test_search_empty_prefix_is_unconstrained(store: MemoryServiceStore) -> None:
    """An empty prefix constrains nothing and must return every namespace."""
    for namespace in [("a",), ("b", "c"), ("d", "e", "f")]:
        store.put(namespace, "k", {"v": 1})

    assert {item.namespace for item in store.search((), limit=100)} == {
        ("a",),
        ("b", "c"),
        ("d", "e", "f"),
    }


def test_search_namespace_like_metacharacters(store: MemoryServiceStore) -> None:
    """`_` and `%` are legal namespace labels, not LIKE wildcards."""
    for namespace in [
        ("user_1",),
        ("user_1", "child"),
        ("userX1",),
        ("a%b",),
        ("axxb",),
    ]:
        store.put(namespace, "k", {"v": 1})

    def _namespaces(prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {item.namespace for item in store.search(prefix, limit=100)}

    # Also asserts the namespace still matches itself, which catches escaping
    # the equality arm by mistake.
    assert _namespaces(("user_1",)) == {("user_1",), ("user_1", "child")}
    assert _namespaces(("a%b",)) == {("a%b",)}


def test_list_namespaces_segment_boundary(store: MemoryServiceStore) -> None:
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foobar",),
        ("foobar", "baz"),
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    ]:
        store.put(namespace, "k", {"v": 1})

    assert set(store.list_namespaces(prefix=["foo"], limit=100)) == {
        ("foo",),
        ("foo", "child"),
    }
    # Suffix must align to a segment: "malice" does not end with the "alice"
    # segment.
    assert set(store.list_namespaces(suffix=["alice"], limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "a", "b", "alice"),
    }
    # "*" spans exactly one segment.
    assert set(store.list_namespaces(prefix=["uid", "*", "alice"], limit=100)) == {
        ("uid", "users", "alice"),
    }
    # Prefix matching stays open-ended across depth.
    assert set(store.list_namespaces(prefix=["uid"], limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    }


def test_search(store: MemoryServiceStore) -> None:
    # Create test data
    test_data = [
        (
            ("test", "docs"),
            "doc1",
            {"title": "First Doc", "author": "Alice", "tags": ["important"]},
        ),
        (
            ("test", "docs"),
            "doc2",
            {"title": "Second Doc", "author": "Bob", "tags": ["draft"]},
        ),
        (
            ("test", "images"),
            "img1",
            {"title": "Image 1", "author": "Alice", "tags": ["final"]},
        ),
    ]

    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    # Test basic search
    all_items = store.search(["test"])
    assert len(all_items) == 3

    # Test namespace filtering
    docs_items = store.search(["test", "docs"])
    assert len(docs_items) == 2
    assert all(item.namespace == ("test", "docs") for item in docs_items)

    # Test value filtering
    alice_items = store.search(["test"], filter={"author": "Alice"})
    assert len(alice_items) == 2
    assert all(item.value["author"] == "Alice" for item in alice_items)

    # Test pagination
    paginated_items = store.search(["test"], limit=2)
    assert len(paginated_items) == 2

    offset_items = store.search(["test"], offset=2)
    assert len(offset_items) == 1

    # Cleanup
    for namespace, key, _ in test_data:
        store.delete(namespace, key)


def test_vector_search_edge_cases(store: MemoryServiceStore) -> None:
    """Test edge cases in vector search."""
    store.put(("test",), "doc1", {"text": "test document"})

    results = store.search(("test",), query="")
    assert len(results) == 1

    results = store.search(("test",), query=None)
    assert len(results) == 1

    long_query = "test " * 100
    results = store.search(("test",), query=long_query)
    assert len(results) == 1

    special_query = "test!@#$%^&*()"
    results = store.search(("test",), query=special_query)
    assert len(results) == 1


def test_store_ttl(store: MemoryServiceStore) -> None:
    # DIFFERS: no TTL (supports_ttl is False, as BaseStore's default): the service's retention
    # (STALE_PURGE_DAYS, PURGE_AFTER_DAYS) governs every memory. Upstream puts with a TTL and
    # waits for it to expire; here a TTL is refused, in the call and in a batch.
    with pytest.raises(NotImplementedError):
        store.put(("foo",), key="item1", value={"foo": "bar"}, ttl=0.1)
    with pytest.raises(NotImplementedError):
        store.batch([PutOp(("foo",), "item1", {"foo": "bar"}, ttl=0.1)])
    assert store.get(("foo",), "item1") is None


def test_namespace_labels_with_trailing_newline(store: MemoryServiceStore) -> None:
    """Labels may contain newlines, and must not match a differently-named label."""
    store.put(("users", "alice"), "k", {"v": 1})
    store.put(("users", "alice\n"), "k", {"v": 2})

    assert set(store.list_namespaces(suffix=["alice"], limit=100)) == {
        ("users", "alice"),
    }
    assert set(store.list_namespaces(prefix=["users", "alice"], limit=100)) == {
        ("users", "alice"),
    }


# -------------------------------------------------------------------------------------------
# From libs/checkpoint/tests/test_store.py (InMemoryStore; the store there was made with a
# character-level fake embedding, `index={"dims": ..., "embed": fake_embeddings}`: here the
# service embeds, with the suite's hash embedder, and ranks by its hybrid search)
# -------------------------------------------------------------------------------------------


def test_list_namespaces_basic(store: MemoryServiceStore) -> None:
    namespaces = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
        ("users", "123"),
        ("users", "456", "settings"),
        ("admin", "users", "789"),
    ]

    for i, ns in enumerate(namespaces):
        store.put(namespace=ns, key=f"id_{i}", value={"data": f"value_{i:02d}"})

    result = store.list_namespaces(prefix=("a", "b"))
    expected = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert sorted(result) == sorted(expected)

    result = store.list_namespaces(suffix=("f",))
    expected = [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert sorted(result) == sorted(expected)

    result = store.list_namespaces(prefix=("a",), suffix=("f",))
    expected = [
        ("a", "b", "f"),
        ("a", "c", "f"),
    ]
    assert sorted(result) == sorted(expected)

    # Test max_depth
    result = store.list_namespaces(prefix=("a", "b"), max_depth=3)
    expected = [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    assert sorted(result) == sorted(expected)

    # Test limit and offset
    result = store.list_namespaces(prefix=("a", "b"), limit=2)
    expected = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
    ]
    assert result == expected

    result = store.list_namespaces(prefix=("a", "b"), offset=2)
    expected = [
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert result == expected

    result = store.list_namespaces(prefix=("a", "*", "f"))
    expected = [
        ("a", "b", "f"),
        ("a", "c", "f"),
    ]
    assert sorted(result) == sorted(expected)

    result = store.list_namespaces(suffix=("*", "f"))
    expected = [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert sorted(result) == sorted(expected)

    result = store.list_namespaces(prefix=("nonexistent",))
    assert result == []

    result = store.list_namespaces(prefix=("users", "123"))
    expected = [("users", "123")]
    assert result == expected


def test_list_namespaces_with_wildcards(store: MemoryServiceStore) -> None:
    namespaces = [
        ("users", "123"),
        ("users", "456"),
        ("users", "789", "settings"),
        ("admin", "users", "789"),
        ("guests", "123"),
        ("guests", "456", "preferences"),
    ]

    for i, ns in enumerate(namespaces):
        store.put(namespace=ns, key=f"id_{i}", value={"data": f"value_{i:02d}"})

    result = store.list_namespaces(prefix=("users", "*"))
    expected = [
        ("users", "123"),
        ("users", "456"),
        ("users", "789", "settings"),
    ]
    assert sorted(result) == sorted(expected)

    result = store.list_namespaces(suffix=("*", "preferences"))
    expected = [
        ("guests", "456", "preferences"),
    ]
    assert result == expected

    result = store.list_namespaces(prefix=("*", "users"), suffix=("*", "settings"))

    assert result == []


def test_list_namespaces_pagination(store: MemoryServiceStore) -> None:
    for i in range(20):
        ns = ("namespace", f"sub_{i:02d}")
        store.put(namespace=ns, key=f"id_{i:02d}", value={"data": f"value_{i:02d}"})

    result = store.list_namespaces(prefix=("namespace",), limit=5, offset=0)
    expected = [("namespace", f"sub_{i:02d}") for i in range(5)]
    assert result == expected

    result = store.list_namespaces(prefix=("namespace",), limit=5, offset=5)
    expected = [("namespace", f"sub_{i:02d}") for i in range(5, 10)]
    assert result == expected

    result = store.list_namespaces(prefix=("namespace",), limit=5, offset=15)
    expected = [("namespace", f"sub_{i:02d}") for i in range(15, 20)]
    assert result == expected


def test_list_namespaces_max_depth(store: MemoryServiceStore) -> None:
    namespaces = [
        ("a", "b", "c", "d"),
        ("a", "b", "c", "e"),
        ("a", "b", "f"),
        ("a", "g"),
        ("h", "i", "j", "k"),
    ]

    for i, ns in enumerate(namespaces):
        store.put(namespace=ns, key=f"id_{i}", value={"data": f"value_{i:02d}"})

    result = store.list_namespaces(max_depth=2)
    expected = [
        ("a", "b"),
        ("a", "g"),
        ("h", "i"),
    ]
    assert sorted(result) == sorted(expected)


def test_list_namespaces_no_conditions(store: MemoryServiceStore) -> None:
    namespaces = [
        ("a", "b"),
        ("c", "d"),
        ("e", "f", "g"),
    ]

    for i, ns in enumerate(namespaces):
        store.put(namespace=ns, key=f"id_{i}", value={"data": f"value_{i:02d}"})

    result = store.list_namespaces()
    expected = namespaces
    assert sorted(result) == sorted(expected)


def test_list_namespaces_empty_store(store: MemoryServiceStore) -> None:
    result = store.list_namespaces()
    assert result == []


async def test_cannot_put_empty_namespace(store: MemoryServiceStore) -> None:
    doc = {"foo": "bar"}

    with pytest.raises(InvalidNamespaceError):
        store.put((), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        await store.aput((), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        store.put(("the", "thing.about"), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        await store.aput(("the", "thing.about"), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        store.put(("some", "fun", ""), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        await store.aput(("some", "fun", ""), "foo", doc)

    with pytest.raises(InvalidNamespaceError):
        await store.aput(("langgraph", "foo"), "bar", doc)

    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "foo"), "bar", doc)

    await store.aput(("foo", "langgraph", "foo"), "bar", doc)
    assert (await store.aget(("foo", "langgraph", "foo"), "bar")).value == doc  # type: ignore[union-attr]
    assert (await store.asearch(("foo", "langgraph", "foo"), query="bar"))[
        0
    ].value == doc
    await store.adelete(("foo", "langgraph", "foo"), "bar")
    assert (await store.aget(("foo", "langgraph", "foo"), "bar")) is None
    store.put(("foo", "langgraph", "foo"), "bar", doc)
    assert store.get(("foo", "langgraph", "foo"), "bar").value == doc  # type: ignore[union-attr]
    assert store.search(("foo", "langgraph", "foo"), query="bar")[0].value == doc
    store.delete(("foo", "langgraph", "foo"), "bar")
    assert store.get(("foo", "langgraph", "foo"), "bar") is None

    # Do the same but go past the public put api
    await store.abatch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert (await store.aget(("langgraph", "foo"), "bar")).value == doc  # type: ignore[union-attr]
    assert (await store.asearch(("langgraph", "foo")))[0].value == doc
    await store.adelete(("langgraph", "foo"), "bar")
    assert (await store.aget(("langgraph", "foo"), "bar")) is None
    store.batch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert store.get(("langgraph", "foo"), "bar").value == doc  # type: ignore[union-attr]
    assert store.search(("langgraph", "foo"))[0].value == doc
    store.delete(("langgraph", "foo"), "bar")
    assert store.get(("langgraph", "foo"), "bar") is None
    # (Upstream then runs the same on its MockAsyncBatchedStore, a test helper of LangGraph's
    # AsyncBatchedBaseStore; the store here is not one.)


def test_vector_insert_with_auto_embedding(store: MemoryServiceStore) -> None:
    """Test inserting items that get auto-embedded."""
    docs = [
        ("doc1", {"text": "short text"}),
        ("doc2", {"text": "longer text document"}),
        ("doc3", {"text": "longest text document here"}),
        ("doc4", {"description": "text in description field"}),
        ("doc5", {"content": "text in content field"}),
        ("doc6", {"body": "text in body field"}),
    ]

    for key, value in docs:
        store.put(("test",), key, value)

    results = store.search(("test",), query="long text")
    assert len(results) > 0

    doc_order = [r.key for r in results]
    assert "doc2" in doc_order
    assert "doc3" in doc_order


async def test_async_vector_insert_with_auto_embedding(store: MemoryServiceStore) -> None:
    """Test inserting items that get auto-embedded using async methods."""
    docs = [
        ("doc1", {"text": "short text"}),
        ("doc2", {"text": "longer text document"}),
        ("doc3", {"text": "longest text document here"}),
        ("doc4", {"description": "text in description field"}),
        ("doc5", {"content": "text in content field"}),
        ("doc6", {"body": "text in body field"}),
    ]

    for key, value in docs:
        await store.aput(("test",), key, value)

    results = await store.asearch(("test",), query="long text")
    assert len(results) > 0

    doc_order = [r.key for r in results]
    assert "doc2" in doc_order
    assert "doc3" in doc_order


def test_vector_update_with_embedding(store: MemoryServiceStore) -> None:
    """Test that updating items properly updates their embeddings."""
    store.put(("test",), "doc1", {"text": "zany zebra Xerxes"})
    store.put(("test",), "doc2", {"text": "something about dogs"})
    store.put(("test",), "doc3", {"text": "text about birds"})

    results_initial = store.search(("test",), query="Zany Xerxes")
    assert len(results_initial) > 0
    assert results_initial[0].key == "doc1"
    initial_score = results_initial[0].score
    assert initial_score is not None

    store.put(("test",), "doc1", {"text": "new text about dogs"})

    results_after = store.search(("test",), query="Zany Xerxes")
    after_score = next((r.score for r in results_after if r.key == "doc1"), 0.0)
    assert after_score is not None
    assert after_score < initial_score

    results_new = store.search(("test",), query="new text about dogs")
    for r in results_new:
        if r.key == "doc1":
            assert r.score > after_score

    # Don't index this one
    store.put(("test",), "doc4", {"text": "new text about dogs"}, index=False)
    results_new = store.search(("test",), query="new text about dogs", limit=3)
    assert not any(r.key == "doc4" for r in results_new)


async def test_async_vector_update_with_embedding(store: MemoryServiceStore) -> None:
    """Test that updating items properly updates their embeddings using async methods."""
    await store.aput(("test",), "doc1", {"text": "zany zebra Xerxes"})
    await store.aput(("test",), "doc2", {"text": "something about dogs"})
    await store.aput(("test",), "doc3", {"text": "text about birds"})

    results_initial = await store.asearch(("test",), query="Zany Xerxes")
    assert len(results_initial) > 0
    assert results_initial[0].key == "doc1"
    initial_score = results_initial[0].score

    await store.aput(("test",), "doc1", {"text": "new text about dogs"})

    results_after = await store.asearch(("test",), query="Zany Xerxes")
    after_score = next((r.score for r in results_after if r.key == "doc1"), 0.0)
    assert after_score is not None
    assert after_score < initial_score

    results_new = await store.asearch(("test",), query="new text about dogs")
    for r in results_new:
        if r.key == "doc1":
            assert r.score is not None
            assert r.score > after_score

    # Don't index this one
    await store.aput(("test",), "doc4", {"text": "new text about dogs"}, index=False)
    results_new = await store.asearch(("test",), query="new text about dogs", limit=3)
    assert not any(r.key == "doc4" for r in results_new)


def test_vector_search_with_filters(store: MemoryServiceStore) -> None:
    """Test combining vector search with filters."""
    # Insert test documents
    docs = [
        ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
    ]

    for key, value in docs:
        store.put(("test",), key, value)

    results = store.search(("test",), query="apple", filter={"color": "red"})
    assert len(results) == 2
    assert results[0].key == "doc1"

    results = store.search(("test",), query="car", filter={"color": "red"})
    assert len(results) == 2
    assert results[0].key == "doc2"

    # DIFFERS: upstream queries "bbbbluuu", which its character-level fake embedding finds
    # closest to "blue"; the service's words and embedder need the word itself.
    results = store.search(
        ("test",), query="blue", filter={"score": {"$gt": 3.2}}
    )
    assert len(results) == 3
    assert results[0].key == "doc4"

    # Multiple filters
    results = store.search(
        ("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"}
    )
    assert len(results) == 1
    assert results[0].key == "doc3"


async def test_async_vector_search_with_filters(store: MemoryServiceStore) -> None:
    """Test combining vector search with filters using async methods."""
    # Insert test documents
    docs = [
        ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
    ]

    for key, value in docs:
        await store.aput(("test",), key, value)

    results = await store.asearch(("test",), query="apple", filter={"color": "red"})
    assert len(results) == 2
    assert results[0].key == "doc1"

    results = await store.asearch(("test",), query="car", filter={"color": "red"})
    assert len(results) == 2
    assert results[0].key == "doc2"

    # DIFFERS: "blue" for upstream's "bbbbluuu" (see test_vector_search_with_filters).
    results = await store.asearch(
        ("test",), query="blue", filter={"score": {"$gt": 3.2}}
    )
    assert len(results) == 3
    assert results[0].key == "doc4"

    # Multiple filters
    results = await store.asearch(
        ("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"}
    )
    assert len(results) == 1
    assert results[0].key == "doc3"


async def test_async_batched_vector_search_concurrent(store: MemoryServiceStore) -> None:
    """Test concurrent vector search operations using async batched store."""
    colors = ["red", "blue", "green", "yellow", "purple"]
    items = ["apple", "car", "house", "book", "phone"]
    scores = [3.0, 3.5, 4.0, 4.5, 5.0]

    docs = []
    for i in range(50):
        color = colors[i % len(colors)]
        item = items[i % len(items)]
        score = scores[i % len(scores)]
        docs.append(
            (
                f"doc{i}",
                {"text": f"{color} {item}", "color": color, "score": score, "index": i},
            )
        )

    # DIFFERS: upstream gathers every put, then every delete, then every put again, all at
    # once, on an AsyncBatchedBaseStore, whose queue runs them in the order called. This store
    # runs each call as it comes, so calls on one key are ordered only when awaited in turn:
    # the keys run concurrently, each key's put, delete and put in sequence.
    async def put_delete_put(key: str, value: dict[str, Any]) -> None:
        await store.aput(("test",), key, value)
        await store.adelete(("test",), key)
        await store.aput(("test",), key, value)

    await asyncio.gather(*[put_delete_put(key, value) for key, value in docs])

    # Prepare multiple search queries with different filters
    search_queries: list[tuple[str, dict[str, Any]]] = [
        ("apple", {"color": "red"}),
        ("car", {"color": "blue"}),
        ("house", {"color": "green"}),
        ("phone", {"score": {"$gt": 4.99}}),
        ("book", {"score": {"$lte": 3.5}}),
        ("apple", {"score": {"$gte": 3.0}, "color": "red"}),
        ("car", {"score": {"$lt": 5.1}, "color": "blue"}),
        ("house", {"index": {"$gt": 25}}),
        ("phone", {"index": {"$lte": 10}}),
    ]

    all_results = await asyncio.gather(
        *[
            store.asearch(("test",), query=query, filter=filter_)
            for query, filter_ in search_queries
        ]
    )

    for results, (query, filter_) in zip(all_results, search_queries, strict=False):
        assert len(results) > 0, f"No results for query '{query}' with filter {filter_}"

        for result in results:
            if "color" in filter_:
                assert result.value["color"] == filter_["color"]

            if "score" in filter_:
                score = result.value["score"]
                for op, value in filter_["score"].items():
                    if op == "$gt":
                        assert score > value
                    elif op == "$gte":
                        assert score >= value
                    elif op == "$lt":
                        assert score < value
                    elif op == "$lte":
                        assert score <= value

            if "index" in filter_:
                index = result.value["index"]
                for op, value in filter_["index"].items():
                    if op == "$gt":
                        assert index > value
                    elif op == "$gte":
                        assert index >= value
                    elif op == "$lt":
                        assert index < value
                    elif op == "$lte":
                        assert index <= value


def test_vector_search_pagination(store: MemoryServiceStore) -> None:
    """Test pagination with vector search."""
    for i in range(5):
        store.put(("test",), f"doc{i}", {"text": f"test document number {i}"})

    results_page1 = store.search(("test",), query="test", limit=2)
    results_page2 = store.search(("test",), query="test", limit=2, offset=2)

    assert len(results_page1) == 2
    assert len(results_page2) == 2
    assert results_page1[0].key != results_page2[0].key

    all_results = store.search(("test",), query="test", limit=10)
    assert len(all_results) == 5


async def test_async_vector_search_pagination(store: MemoryServiceStore) -> None:
    """Test pagination with vector search using async methods."""
    for i in range(5):
        await store.aput(("test",), f"doc{i}", {"text": f"test document number {i}"})

    results_page1 = await store.asearch(("test",), query="test", limit=2)
    results_page2 = await store.asearch(("test",), query="test", limit=2, offset=2)

    assert len(results_page1) == 2
    assert len(results_page2) == 2
    assert results_page1[0].key != results_page2[0].key

    all_results = await store.asearch(("test",), query="test", limit=10)
    assert len(all_results) == 5


async def test_embed_with_path(store: MemoryServiceStore) -> None:
    # DIFFERS: upstream embeds only the fields the index names, one vector per field, and
    # checks scores field by field. The service embeds a memory's whole content (the value's
    # JSON): `index=[...]` is accepted and the whole value is searched. What holds is kept:
    # every item is found, and an item put with index=False comes back without a score,
    # after the ranked ones.
    doc3 = {
        "key0": "aaa",
        "key1": "bbb",
        "key2": "ccc",
        "key3": "ddd",
    }
    doc4 = {
        "key0": "eee",
        "key1": "bbb",  # Same as doc3.key1
        "key2": "fff",
        "key3": "ggg",
    }

    await store.aput(("test",), "doc3", doc3, index=["key0", "key1"])
    await store.aput(("test",), "doc4", doc4, index=["key1", "key3"])

    results = await store.asearch(("test",), query="aaa")
    assert len(results) == 2
    assert results[0].key == "doc3"
    assert results[0].score is not None and results[0].score > results[1].score

    results = await store.asearch(("test",), query="ggg")
    assert len(results) == 2
    assert results[0].key == "doc4"
    assert results[0].score is not None and results[0].score > results[1].score

    doc5 = {
        "key0": "hhh",
        "key1": "iii",
    }
    await store.aput(("test",), "doc5", doc5, index=False)

    results = await store.asearch(("test",), query="hhh")
    assert len(results) == 3
    doc5_result = next(r for r in results if r.key == "doc5")
    assert doc5_result.score is None


def test_non_ascii(store: MemoryServiceStore) -> None:
    """Test support for non-ascii characters"""
    store.put(("user_123", "memories"), "1", {"text": "这是中文"})  # Chinese
    store.put(("user_123", "memories"), "2", {"text": "これは日本語です"})  # Japanese
    store.put(("user_123", "memories"), "3", {"text": "이건 한국어야"})  # Korean
    store.put(("user_123", "memories"), "4", {"text": "Это русский"})  # Russian
    store.put(("user_123", "memories"), "5", {"text": "यह रूसी है"})  # Hindi

    result1 = store.search(("user_123", "memories"), query="这是中文")
    result2 = store.search(("user_123", "memories"), query="これは日本語です")
    result3 = store.search(("user_123", "memories"), query="이건 한국어야")
    result4 = store.search(("user_123", "memories"), query="Это русский")
    result5 = store.search(("user_123", "memories"), query="यह रूसी है")

    assert result1[0].key == "1"
    assert result2[0].key == "2"
    assert result3[0].key == "3"
    assert result4[0].key == "4"
    assert result5[0].key == "5"


# -------------------------------------------------------------------------------------------
# The mapping onto the service (this project's own tests from here on)
# -------------------------------------------------------------------------------------------


def test_the_client_derives_the_id_the_server_gives_a_keyed_write():
    assert server_tools.keyed_memory_id is keyed_memory_id  # one function, imported by both


def test_an_item_is_one_memory_of_the_agent(store, clients, agent):
    client, _ = clients
    value = {"text": "Prefers window seats", "nested": {"n": 1.5, "ok": True, "none": None, "list": [1, "é"]}}
    store.put(("memories", "alice"), "seat", value)
    item = store.get(("memories", "alice"), "seat")
    assert item.value == value  # lossless: the value's JSON is the content
    found = store.search(("memories",), query="window seat")
    assert isinstance(found[0], MemorySearchItem) and found[0].key == "seat"
    assert found[0].explanation is not None and found[0].explanation.signals  # the service's explanation
    memory = client.memory_get(agent, found[0].memory_id)
    assert (memory.namespace, memory.kind, memory.title) == (f"agent:{agent}", "observation", '[["memories","alice"],"seat"]')
    assert memory.content.startswith('{"text": "Prefers window seats"')
    assert "langgraph" in memory.tags and item.created_at == memory.created_at


def test_times_come_from_the_service(store):
    store.put(("t",), "k", {"v": 1})
    first = store.get(("t",), "k")
    assert first.created_at == first.updated_at and first.created_at.tzinfo is not None
    store.put(("t",), "k", {"v": 2})
    second = store.get(("t",), "k")
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    store.put(("t",), "k", {"v": 2})  # the same value again changes nothing
    assert store.get(("t",), "k") == second


def test_index_false_on_a_stored_value_takes_it_out_of_the_ranking(store):
    store.put(("ns",), "k", {"text": "quiet harbour"})
    assert [i.score is not None for i in store.search(("ns",), query="harbour")] == [True]
    store.put(("ns",), "k", {"text": "quiet harbour"}, index=False)  # the same value: only the tags change
    assert [i.score for i in store.search(("ns",), query="harbour")] == [None]
    store.put(("ns",), "k", {"text": "quiet harbour"})
    assert [i.score is not None for i in store.search(("ns",), query="harbour")] == [True]


def test_a_deleted_key_put_again_is_live_and_keeps_its_first_creation(store, clients, agent):
    client, _ = clients
    store.put(("t",), "k", {"v": 1})
    created = store.get(("t",), "k").created_at
    store.delete(("t",), "k")
    store.delete(("t",), "k")  # deleting what is gone is no error
    assert store.get(("t",), "k") is None and store.search(("t",)) == [] and store.list_namespaces() == []
    store.put(("t",), "k", {"v": 1})  # the very value it held: brought back
    assert store.get(("t",), "k").value == {"v": 1}
    store.delete(("t",), "k")
    store.put(("t",), "k", {"v": 3})  # another value
    again = store.get(("t",), "k")
    assert again.value == {"v": 3} and again.created_at == created
    assert len(list(client.iter_memories(agent))) == 1


async def test_concurrent_puts_of_a_new_key_store_one_memory(store, clients, agent):
    client, _ = clients
    await asyncio.gather(*(store.aput(("race",), "k", {"n": n}) for n in range(6)))
    assert len(list(client.iter_memories(agent))) == 1
    assert (await store.aget(("race",), "k")).value["n"] in range(6)


def test_user_of_puts_a_users_items_in_their_namespace_and_erasure_removes_them(clients, agent):
    client, async_client = clients
    store = MemoryServiceStore(agent, client=client, async_client=async_client,
                               user_of=lambda ns: ns[1] if len(ns) > 1 and ns[0] == "users" else None)
    store.put(("users", "bob", "prefs"), "seat", {"seat": "aisle"})
    store.put(("shared",), "policy", {"text": "no pets"})
    assert {m.namespace for m in client.iter_memories(agent)} == {f"user:{agent}:bob", f"agent:{agent}"}
    assert [m.content for m in client.export_user(agent, "bob").other] == ['{"seat": "aisle"}']
    client.erase_user(agent, "bob")
    assert store.get(("users", "bob", "prefs"), "seat") is None
    assert store.list_namespaces() == [("shared",)]


def test_stores_with_other_names_never_meet(clients, agent):
    client, async_client = clients
    one = MemoryServiceStore(agent, client=client, async_client=async_client, name="one")
    two = MemoryServiceStore(agent, client=client, async_client=async_client, name="two")
    one.put(("ns",), "k", {"from": "one"})
    two.put(("ns",), "k", {"from": "two"})
    assert one.get(("ns",), "k").value == {"from": "one"} and two.get(("ns",), "k").value == {"from": "two"}
    assert [i.value for i in one.search(("ns",), query="from")] == [{"from": "one"}]
    assert [i.value for i in two.search(())] == [{"from": "two"}]


def test_memories_the_store_did_not_write_are_not_items(store, clients, agent):
    client, _ = clients
    client.memory_write(agent, content="A plain observation", namespace=f"agent:{agent}", kind="observation",
                        title='[["ns"],"k"]')  # an address-shaped title, without the store's tag
    assert store.search(()) == [] and store.list_namespaces() == [] and store.search((), query="plain") == []


def test_content_changed_outside_the_store_is_read_as_text(store, clients, agent):
    client, _ = clients
    store.put(("ns",), "k", {"text": "json"})
    memory_id = store.search(("ns",))[0].memory_id
    client.memory_update(agent, memory_id, content="now plain words")
    assert store.get(("ns",), "k").value == {"content": "now plain words"}


def test_get_counts_a_read_unless_refresh_ttl_is_off(store, clients, agent):
    client, _ = clients
    store.put(("ns",), "k", {"v": 1})
    memory_id = store.search(("ns",))[0].memory_id
    assert store.get(("ns",), "k", refresh_ttl=False).value == {"v": 1}
    store.search(("ns",), query="v", refresh_ttl=False)
    assert client.memory_detail(agent, memory_id).memory.access_count == 0
    store.get(("ns",), "k")
    store.search(("ns",), query="v")
    assert client.memory_detail(agent, memory_id).memory.access_count == 2


def test_filters_follow_jsonb_semantics(store):
    store.put(("f",), "a", {"n": 5, "s": "x", "obj": {"k": 1, "j": 2}, "arr": [1, 2]})
    store.put(("f",), "b", {"n": "not a number", "s": "y"})
    store.put(("f",), "c", {"s": "z"})

    def keys(flt: dict[str, Any]) -> set[str]:
        return {i.key for i in store.search(("f",), filter=flt)}

    assert keys({"obj": {"k": 1}}) == {"a"}  # a nested object matches field by field
    assert keys({"arr": [1, 2]}) == {"a"} and keys({"arr": [1]}) == set()  # a list, element by element
    assert keys({"n": {"$gt": 1}}) == {"a"}  # a field missing or not a number fails an order operator
    assert keys({"s": {"$ne": "x"}}) == {"b", "c"}
    assert keys({"n": {"$gte": 5, "$lte": 5}, "s": {"$eq": "x"}}) == {"a"}
    with pytest.raises(ValueError, match=r"\$regex"):
        store.search(("f",), filter={"s": {"$regex": "x"}})


def test_bad_input_is_refused_before_anything_is_stored(store, clients, agent):
    client, _ = clients
    with pytest.raises(TypeError, match="dict"):
        store.put(("ns",), "k", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON"):
        store.put(("ns",), "k", {"x": float("nan")})
    with pytest.raises(ValueError, match="JSON"):
        store.put(("ns",), "k", {"x": object()})
    with pytest.raises(ValueError, match="at most 200"):
        store.put(("ns",), "k" * 200, {"v": 1})
    assert store.get(("ns",), "k" * 200) is None
    with pytest.raises(InvalidNamespaceError, match="at most 18"):
        store.put(tuple(f"l{i}" for i in range(19)), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.batch([GetOp("not-a-tuple", "k")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        store.search(("ns",), limit=-1)
    assert list(client.iter_memories(agent)) == []
    with pytest.raises(ValueError, match="name"):
        MemoryServiceStore(agent, client=client, name="no spaces")
    with pytest.raises(ValueError, match="client"):
        MemoryServiceStore(agent)


def test_the_services_refusals_raise_its_errors(clients, store):
    client, async_client = clients
    read_only = MemoryServiceStore("lg-not-a-writer", client=client, async_client=async_client)
    with pytest.raises(PermissionDenied, match="MEMORY_WRITE_AGENTS"):
        read_only.put(("ns",), "k", {"v": 1})
    assert read_only.get(("ns",), "k") is None  # reading needs no writes
    with pytest.raises(Exception, match="query is 2001 characters long"):
        store.search(("ns",), query="x" * 2001)


async def test_a_store_without_the_client_a_call_needs_says_so(clients, agent):
    client, async_client = clients
    with pytest.raises(RuntimeError, match="blocking client"):
        MemoryServiceStore(agent, async_client=async_client).get(("ns",), "k")
    with pytest.raises(RuntimeError, match="async client"):
        await MemoryServiceStore(agent, client=client).aget(("ns",), "k")


async def test_a_server_that_is_down_raises_the_network_error(agent):
    down = f"http://127.0.0.1:{free_port()}"
    with MemoryClient(down, max_retries=0) as client:
        async with AsyncMemoryClient(down, max_retries=0) as async_client:
            store = MemoryServiceStore(agent, client=client, async_client=async_client)
            with pytest.raises(httpx.ConnectError):
                store.put(("ns",), "k", {"v": 1})
            with pytest.raises(httpx.ConnectError):
                await store.asearch(("ns",), query="v")


async def test_async_methods_do_what_the_blocking_ones_do(store):
    await store.aput(("a", "b"), "k", {"text": "async world"})
    assert (await store.aget(("a", "b"), "k")).value == {"text": "async world"}
    assert [i.key for i in await store.asearch(("a",), query="world")] == ["k"]
    assert await store.alist_namespaces(prefix=("a",)) == [("a", "b")]
    await store.adelete(("a", "b"), "k")
    assert await store.aget(("a", "b"), "k") is None


def test_an_unknown_memory_is_not_an_item(store, clients, agent):
    client, _ = clients
    with pytest.raises(NotFoundError):
        client.memory_get(agent, keyed_memory_id(agent, "nothing"))
    assert store.get(("never",), "put") is None
