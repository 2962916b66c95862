"""FalkorDB's compact replies read without a coroutine per value.

The falkordb client's asyncio ``QueryResult`` parses each cell of a reply with an ``async``
function (``parse_scalar`` and one per type), so a reply of a few hundred rows costs a few
thousand coroutines: measured on a user-scope read of 200 rows x 3 columns, 0.48 ms of
parsing against 0.15 ms here, and the memory block makes about twenty reads. Our reads
return scalars only (strings, numbers, booleans, nulls, lists and vectors of them, maps),
which need no graph schema: they are read here, synchronously, with the client's
conversions. A reply holding a node, an edge, a path or a point (which need the schema
and its procedure calls) is left to the client's parser (``None`` here).

The reply's layout (``GRAPH.RO_QUERY ... --compact``): ``[header, rows, statistics]``, a
header entry ``[column type, name]``, each cell ``[value type, value]``; a reply with no
result set is ``[statistics]``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# falkordb.asyncio.query_result.ResultSetScalarTypes
NULL, STRING, INTEGER, BOOLEAN, DOUBLE, ARRAY, MAP, VECTORF32, DATETIME = 1, 2, 3, 4, 5, 6, 10, 12, 13


class NeedsSchema(Exception):
    """A cell this module does not read (a graph entity): the client's parser reads the reply."""


def text(value: Any) -> str:
    """A name or flag of the reply as text (bytes without decode_responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _cell(cell: list[Any]) -> Any:
    kind, value = cell[0], cell[1]
    if kind == STRING:
        return value.decode() if isinstance(value, bytes) else value
    if kind == NULL:
        return None
    if kind == DOUBLE:
        return float(value)
    if kind == INTEGER:
        return int(value)
    if kind == BOOLEAN:
        return text(value) == "true"
    if kind == ARRAY:
        return [_cell(c) for c in value]
    if kind == VECTORF32:
        return [float(v) for v in value]
    if kind == MAP:
        return {text(value[i]): _cell(value[i + 1]) for i in range(0, len(value), 2)}
    if kind == DATETIME:
        return datetime.fromtimestamp(value, tz=UTC)
    raise NeedsSchema(kind)


def rows(reply: list[Any]) -> tuple[list[str], list[list[Any]]] | None:
    """The column names and rows of a compact reply; None if a cell needs the client's parser.

    A reply that reports an error raises it, as the client does."""
    if isinstance(reply[-1], Exception):
        raise reply[-1]
    if len(reply) == 1:  # statistics only: no result set
        return [], []
    names = [text(column[1]) for column in reply[0]]
    try:
        return names, [[_cell(cell) for cell in row] for row in reply[1]]
    except NeedsSchema:
        return None
