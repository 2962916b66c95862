"""The store's reader of FalkorDB's compact replies (memory_service/backends/compact_reply.py)
against the falkordb client's own parser, on replies of the real embedded server: the same
values for every scalar type, the client's parser for graph entities, errors raised."""

from __future__ import annotations

import pytest
from falkordb.asyncio import FalkorDB
from falkordb.asyncio.query_result import QueryResult
from redis.exceptions import ResponseError

from memory_service.backends import compact_reply

GRAPH = "compact_reply_test"
EVERY_SCALAR = (
    "RETURN 'text' AS s, 'été ✓' AS unicode, 42 AS i, -7 AS negative, 2.5 AS d, true AS yes, false AS no, "
    "null AS nothing, [1, 'two', [3.0, null], {k: 'v'}] AS list, {a: 1, b: [true], c: {d: 'e'}} AS map, "
    "vecf32([0.5, -1.25, 3.0]) AS vector, localdatetime({year: 2026, month: 3, day: 1, hour: 9}) AS moment, "
    "'' AS empty, [] AS no_items"
)


@pytest.fixture
async def graph(settings):
    client = FalkorDB.from_url(settings.falkordb_url)
    graph = client.select_graph(GRAPH)
    await graph.query("CREATE (:Thing {name: 'a', n: 1})")
    yield graph
    await graph.delete()
    await client.aclose()


async def _both(graph, cypher: str):
    reply = await graph.execute_command("GRAPH.RO_QUERY", graph.name, cypher, "--compact")
    client = QueryResult(graph)
    await client.parse(reply)
    names = [compact_reply.text(h[1]) for h in client.header]
    return compact_reply.rows(reply), (names, client.result_set)


async def test_every_scalar_reads_as_the_client_reads_it(graph):
    ours, theirs = await _both(graph, EVERY_SCALAR)
    assert ours is not None
    assert ours[0] == theirs[0] and ours[1] == [[dict(v) if isinstance(v, dict) else v for v in row] for row in theirs[1]]
    row = dict(zip(*ours[0:1], ours[1][0], strict=True))
    assert row["unicode"] == "été ✓" and row["i"] == 42 and row["yes"] is True and row["no"] is False
    assert row["list"] == [1, "two", [3.0, None], {"k": "v"}] and row["vector"] == [0.5, -1.25, 3.0]
    assert row["moment"].year == 2026 and row["no_items"] == [] and row["nothing"] is None


async def test_rows_of_a_match_and_an_empty_result(graph):
    ours, theirs = await _both(graph, "MATCH (t:Thing) RETURN t.name AS name, t.n AS n, t.missing AS missing")
    assert ours == (["name", "n", "missing"], [["a", 1, None]]) == (theirs[0], theirs[1])
    ours, theirs = await _both(graph, "MATCH (t:Thing) WHERE t.n > 5 RETURN t.name AS name")
    assert ours == (["name"], []) == theirs


async def test_a_reply_holding_a_node_is_left_to_the_client(graph):
    ours, theirs = await _both(graph, "MATCH (t:Thing) RETURN t.name AS name, t AS node")
    assert ours is None
    assert theirs[1][0][1].properties == {"name": "a", "n": 1}


async def test_a_run_time_error_is_raised(graph):
    # redis-py raises an error reply itself; a parser that hands back an error inside the
    # reply (its last element, as the client checks) gets it raised here.
    with pytest.raises(ResponseError, match="Division by zero"):
        compact_reply.rows(await graph.execute_command(
            "GRAPH.RO_QUERY", graph.name, "UNWIND [1, 0] AS x RETURN 1 / x AS y", "--compact"))
    with pytest.raises(ResponseError, match="Division by zero"):
        compact_reply.rows([[[1, b"y"]], [[[3, 1]]], ResponseError("Division by zero")])
