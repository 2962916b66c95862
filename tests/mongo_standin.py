"""An in-process MongoDB stand-in that speaks the MongoDB wire protocol.

What it is
----------
No MongoDB server can be installed on the build machines, so the Mongo backend's tests
run against this stand-in there. It is a real TCP server on ``127.0.0.1``: the real
``pymongo.AsyncMongoClient`` (and the sync ``MongoClient``) connect to it with
``mongodb://127.0.0.1:<port>/?directConnection=true`` and talk to it exactly as they talk
to a standalone ``mongod``: OP_MSG commands (plus the legacy OP_QUERY ``isMaster``/``hello``
handshake), cursors with ``getMore``/``killCursors``, write commands with ``writeErrors``
(duplicate keys are error code 11000, so the driver raises ``DuplicateKeyError`` /
``BulkWriteError``), unacknowledged writes (``moreToCome``), and real outages: ``stop()``
closes the listener and every open connection, so the driver sees connection refused /
reset, and ``start(same_port)`` brings the same data back.

The data engine is a ``mongomock.MongoClient`` that lives on the ``MongoStandIn`` object:
query operators, update operators, upserts, sorting, projections, indexes (including
unique and partial ones) and aggregation are mongomock's. Commands are executed one at a
time under a lock, so concurrent clients see serialised, atomic single-document writes,
as on a real server.

``$text`` (which mongomock lacks) is the stand-in's own, in ``find`` only, in the simplest
faithful way: a text index (one per collection; equality-prefix fields allowed, e.g.
``{agent_id: 1, search_text: "text"}``, and then every ``$text`` query must give them by
equality, as on a real server; ``weights``; ``default_language`` ``english`` or ``none``)
is required (else code 27). Text is tokenised into words (letters, digits, ``_``; white
space, punctuation and dashes split), case folded, diacritics removed, MongoDB's English
stop words dropped; a document matches when it holds ANY of the ``$search`` words, and
its ``textScore`` is MongoDB's formula (FTSSpec::_scoreStringV2): per matched term, the
k-th occurrence adds 1/2^(k-1), times (0.5 + 0.5 x occurrences / terms in the field),
times 1.1 when the term is the whole field, times the field weight; summed over the
query's distinct terms and the text fields. ``{$meta: "textScore"}`` works in the
projection (any field name) and in the sort (always best first, combinable with other
sort keys); asking for it without ``$text`` is code 40218, as on a real server. The
filter's other conditions are mongomock's; the whole collection is scanned (no index).

What it is not
--------------
- Not a replica set: no transactions (commands carrying ``txnNumber``/``startTransaction``
  fail with code 20 IllegalOperation, the answer of a real standalone server), no
  retryable writes, no change streams, no ``$clusterTime``/causal consistency.
- No authentication, no TLS, no compression (compression is never offered in the
  handshake, so drivers never send OP_COMPRESSED).
- Operator coverage is mongomock's: e.g. ``arrayFilters``, ``collation`` and ``let`` are
  not implemented there and come back as error code 238 (NotImplemented) instead of being
  silently ignored; geo queries and many aggregation operators are missing or approximate.
- ``$text`` is partial (all of these are code 238 unless said otherwise): NO STEMMING (a
  real server stems English, so "flights" finds "flight" there and not here; scores then
  differ too), no phrases (``"..."``), no negated terms (``-word``), no ``$caseSensitive``
  / ``$diacriticSensitive``, languages ``english`` and ``none`` only, no per-document
  ``language`` override (the field is ignored), no wildcard (``$**``) text index, no
  fields after the text fields in a compound text index; ``$text`` only at the top level
  or in a top-level ``$and`` of a ``find`` (not in ``aggregate``, ``count_documents``,
  ``$or``). ``listIndexes`` shows a text index by its fields (a real server shows
  ``{_fts: "text", _ftsx: 1}``), with ``weights`` and ``default_language``. Cursors are snapshots taken when the ``find``/``aggregate``
  runs (a real server reads lazily). Index options other than ``unique``, ``sparse``,
  ``name``, ``partialFilterExpression`` and ``expireAfterSeconds`` (and a text index's
  ``weights`` and ``default_language``) are ignored (logged), and TTL indexes never expire
  anything.
- Commands it does not know are answered like a real server answers an unknown command
  (``ok: 0``, code 59 CommandNotFound) and logged, and counted in ``unknown_commands``,
  so a missing command is easy to spot.

The suite runs against a real MongoDB server whenever ``MONGODB_URI`` is set; this
stand-in is only the fallback for machines where no server can run.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import logging
import random
import re
import socket
import struct
import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable

import bson
import bson.errors
import bson.json_util
import mongomock
import mongomock.filtering
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.int64 import Int64
from pymongo.errors import (
    CollectionInvalid,
    DuplicateKeyError,
    InvalidName,
    OperationFailure,
    PyMongoError,
)

__all__ = ["MongoStandIn", "CommandError"]

log = logging.getLogger(__name__)

# Wire protocol constants.
OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013
MSG_CHECKSUM_PRESENT = 1 << 0
MSG_MORE_TO_COME = 1 << 1
MSG_EXHAUST_ALLOWED = 1 << 16
REPLY_QUERY_FAILURE = 1 << 1

MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
MAX_MESSAGE_SIZE = 48_000_000
MAX_WRITE_BATCH_SIZE = 100_000
MAX_WIRE_VERSION = 21  # MongoDB 7.0
DEFAULT_FIRST_BATCH = 101
# Leave room for the reply envelope around a batch.
BATCH_BYTES = MAX_BSON_OBJECT_SIZE - 16 * 1024

CODEC_OPTIONS = CodecOptions(
    document_class=dict,
    tz_aware=False,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)

CODE_NAMES = {
    1: "InternalError",
    2: "BadValue",
    9: "FailedToParse",
    14: "TypeMismatch",
    20: "IllegalOperation",
    26: "NamespaceNotFound",
    27: "IndexNotFound",
    43: "CursorNotFound",
    48: "NamespaceExists",
    59: "CommandNotFound",
    67: "CannotCreateIndex",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    85: "IndexOptionsConflict",
    238: "NotImplemented",
    352: "UnsupportedOpQueryCommand",
    11000: "DuplicateKey",
    40218: "Location40218",
}

# Fields of the command envelope that carry no meaning for a standalone stand-in.
ENVELOPE_FIELDS = {
    "$db",
    "lsid",
    "$clusterTime",
    "$readPreference",
    "readConcern",
    "writeConcern",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "comment",
    "maxTimeMS",
    "$audit",
    "$client",
    "$configServerState",
    "$gleStats",
}
TRANSACTION_FIELDS = {"txnNumber", "startTransaction", "autocommit", "stmtId", "stmtIds"}


class CommandError(Exception):
    """A command failure answered as ``{ok: 0, errmsg, code, codeName}``."""

    def __init__(self, code: int, errmsg: str, **extra: Any) -> None:
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.extra = extra


@dataclass
class _Cursor:
    ns: str
    docs: list[dict]
    pos: int = 0


@dataclass
class _Connection:
    sock: socket.socket
    conn_id: int
    thread: threading.Thread | None = None
    handshake: dict | None = field(default=None)


def _error_doc(code: int, errmsg: str, **extra: Any) -> dict:
    return {"ok": 0.0, "errmsg": errmsg, "code": code, "codeName": CODE_NAMES.get(code, "Error"), **extra}


def _exception_to_error(exc: BaseException) -> tuple[int, str, dict]:
    """Map an exception from mongomock (or from a handler) to (code, errmsg, extra)."""
    if isinstance(exc, CommandError):
        return exc.code, exc.errmsg, exc.extra
    if isinstance(exc, DuplicateKeyError):
        return 11000, str(exc), {}
    if isinstance(exc, OperationFailure):
        message = str(exc)
        if "already exists with different options" in message:
            return 85, message, {}
        return exc.code or 2, message, {}
    if isinstance(exc, InvalidName):
        return 73, str(exc), {}
    if isinstance(exc, bson.errors.BSONError):
        return 2, str(exc), {}
    if isinstance(exc, NotImplementedError):
        message = f"not implemented by mongomock (MongoStandIn): {exc}"
        log.warning("MongoStandIn: %s", message)
        return 238, message, {}
    if isinstance(exc, (ValueError, TypeError, PyMongoError)):
        log.debug("MongoStandIn: bad value", exc_info=exc)
        return 2, f"{type(exc).__name__}: {exc}", {}
    log.error("MongoStandIn: internal error", exc_info=exc)
    return 1, f"MongoStandIn internal error: {type(exc).__name__}: {exc}", {}


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:], n - got)
        if count == 0:
            return None
        got += count
    return bytes(buf)


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\x00", pos)
    return data[pos:end].decode("utf-8"), end + 1


def _decode_docs(data: bytes) -> list[dict]:
    return bson.decode_all(data, CODEC_OPTIONS)


def parse_op_msg(payload: bytes) -> tuple[int, dict]:
    """Parse an OP_MSG body (after the 16-byte header) into (flagBits, command)."""
    (flags,) = struct.unpack_from("<I", payload, 0)
    end = len(payload) - (4 if flags & MSG_CHECKSUM_PRESENT else 0)
    pos = 4
    body: dict | None = None
    sequences: dict[str, list[dict]] = {}
    while pos < end:
        kind = payload[pos]
        pos += 1
        if kind == 0:
            (size,) = struct.unpack_from("<i", payload, pos)
            body = bson.decode(payload[pos : pos + size], CODEC_OPTIONS)
            pos += size
        elif kind == 1:
            (size,) = struct.unpack_from("<i", payload, pos)
            section_end = pos + size
            identifier, doc_pos = _cstring(payload, pos + 4)
            sequences.setdefault(identifier, []).extend(_decode_docs(payload[doc_pos:section_end]))
            pos = section_end
        else:
            raise CommandError(2, f"OP_MSG section kind {kind} is not supported")
    if body is None:
        raise CommandError(2, "OP_MSG without a body section")
    for identifier, docs in sequences.items():
        body[identifier] = docs
    return flags, body


# ---------------------------------------------------------------------------- $text

# MongoDB's English stop words (src/mongo/db/fts/stop_words_english.txt).
ENGLISH_STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before being below
between both but by can't cannot could couldn't did didn't do does doesn't doing don't down during each few
for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself
him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same shan't
she she'd she'll she's should shouldn't so some such than that that's the their theirs them themselves then
there there's these they they'd they'll they're they've this those through to too under until up very was
wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while who who's
whom why why's with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
""".split())
TEXT_LANGUAGES = {"english": ENGLISH_STOP_WORDS, "en": ENGLISH_STOP_WORDS, "none": frozenset()}
# A word: letters, digits and underscores (MongoDB splits on white space, punctuation,
# dashes and quotes), with an apostrophe inside it kept (so that "don't" meets the stop word).
_TEXT_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")


def text_tokens(text: str, stop_words: frozenset[str]) -> list[str]:
    """The terms a text index keeps of ``text``: case folded, diacritics removed, stop words
    dropped (a version-3 text index). Not stemmed: a real server also stems (see the module
    docstring)."""
    folded = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).casefold()
    words = (w.replace("\u2019", "'") for w in _TEXT_WORD.findall(folded))
    return [w for w in words if w not in stop_words]


def text_field_scores(raw: str, stop_words: frozenset[str], weight: float, scores: dict[str, float]) -> None:
    """Add one field's term scores to ``scores`` as MongoDB does (FTSSpec::_scoreStringV2):
    the k-th occurrence of a term adds 1/2^(k-1) to its frequency, times
    (0.5 + 0.5 * occurrences / terms in the field), times 1.1 when the term is the whole field,
    times the field's weight."""
    tokens = text_tokens(raw, stop_words)
    counts: dict[str, int] = collections.Counter(tokens)
    for term, count in counts.items():
        freq = sum(0.5 ** k for k in range(count))  # 1 / 2**k overflowed past k = 1023
        coeff = 0.5 * count / len(tokens) + 0.5
        adjustment = 1.1 if raw.casefold() == term else 1.0
        scores[term] = scores.get(term, 0.0) + weight * freq * coeff * adjustment


@dataclass(frozen=True)
class _TextIndex:
    name: str
    prefix: tuple[str, ...]  # fields before the text fields: each $text query needs them by equality
    weights: dict[str, float]
    language: str


def _is_text_meta(value: Any) -> bool:
    return isinstance(value, dict) and value.get("$meta") == "textScore"


def _split_text_filter(filt: dict) -> tuple[dict | None, dict]:
    """(the $text clause, the rest of the filter). $text may stand at the top level or in a
    top-level $and, as on a real server; anywhere deeper mongomock refuses it (238)."""
    rest = dict(filt)
    found = []
    if "$text" in rest:
        found.append(rest.pop("$text"))
    if isinstance(rest.get("$and"), list):
        clauses = []
        for clause in rest["$and"]:
            if isinstance(clause, dict) and "$text" in clause:
                clause = dict(clause)
                found.append(clause.pop("$text"))
            if clause:
                clauses.append(clause)
        if clauses:
            rest["$and"] = clauses
        else:
            del rest["$and"]
    if len(found) > 1:
        raise CommandError(2, "Too many text expressions")
    return (found[0] if found else None), rest



class MongoStandIn:
    """A loopback MongoDB stand-in; see the module docstring.

    ``start(port=None)`` serves on an ephemeral port the first time and on the previous
    port after a ``stop()`` (so the URI stays the same); ``stop()`` closes the listener and
    every client connection; the data (``self.client``, a ``mongomock.MongoClient``)
    survives restarts, cursors do not (as with a real server).
    """

    def __init__(self, host: str = "127.0.0.1", client: mongomock.MongoClient | None = None) -> None:
        self.host = host
        self.client = client if client is not None else mongomock.MongoClient()
        self.port: int | None = None
        self.commands_seen: collections.Counter[str] = collections.Counter()
        self.unknown_commands: collections.Counter[str] = collections.Counter()
        self.opcodes_seen: collections.Counter[int] = collections.Counter()
        self.handshakes: list[dict] = []
        self.ignored_options: collections.Counter[str] = collections.Counter()
        self._data_lock = threading.RLock()
        self._conn_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._connections: dict[int, _Connection] = {}
        self._conn_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._cursors: dict[int, _Cursor] = {}
        self._stopping = threading.Event()
        self._handlers: dict[str, Callable[[str, dict, _Connection], dict]] = {
            "hello": self._cmd_hello,
            "isMaster": self._cmd_hello,
            "ismaster": self._cmd_hello,
            "ping": lambda db, cmd, conn: {},
            "buildInfo": self._cmd_build_info,
            "buildinfo": self._cmd_build_info,
            "endSessions": lambda db, cmd, conn: {},
            "insert": self._cmd_insert,
            "find": self._cmd_find,
            "getMore": self._cmd_get_more,
            "killCursors": self._cmd_kill_cursors,
            "update": self._cmd_update,
            "delete": self._cmd_delete,
            "findAndModify": self._cmd_find_and_modify,
            "findandmodify": self._cmd_find_and_modify,
            "aggregate": self._cmd_aggregate,
            "count": self._cmd_count,
            "distinct": self._cmd_distinct,
            "createIndexes": self._cmd_create_indexes,
            "listIndexes": self._cmd_list_indexes,
            "dropIndexes": self._cmd_drop_indexes,
            "deleteIndexes": self._cmd_drop_indexes,
            "listCollections": self._cmd_list_collections,
            "listDatabases": self._cmd_list_databases,
            "drop": self._cmd_drop,
            "dropDatabase": self._cmd_drop_database,
            "create": self._cmd_create,
            "renameCollection": self._cmd_rename_collection,
            "commitTransaction": self._cmd_transaction,
            "abortTransaction": self._cmd_transaction,
        }

    # ------------------------------------------------------------------ lifecycle

    @property
    def uri(self) -> str:
        if self.port is None:
            raise RuntimeError("MongoStandIn was never started")
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self, port: int | None = None) -> str:
        """Listen on ``port`` (default: the previous port, else an ephemeral one); return the URI."""
        if self._listener is not None:
            raise RuntimeError("MongoStandIn is already running")
        if port is None:
            port = self.port or 0
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, port))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        self._stopping.clear()
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop, args=(listener,), name=f"MongoStandIn-accept-{self.port}", daemon=True
        )
        self._accept_thread.start()
        log.info("MongoStandIn listening on %s", self.uri)
        return self.uri

    def stop(self) -> None:
        """Close the listener and every open client connection (a real outage for clients)."""
        listener = self._listener
        if listener is None:
            return
        self._stopping.set()
        with self._conn_lock:
            self._listener = None
            connections = list(self._connections.values())
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
            self._accept_thread = None
        listener.close()
        for conn in connections:
            try:
                # SO_LINGER 0: the peer gets a reset, not a polite end of stream.
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for conn in connections:
            if conn.thread is not None:
                conn.thread.join(timeout=5)
        with self._data_lock:
            self._cursors.clear()  # a restarted server has no open cursors
        log.info("MongoStandIn on port %s stopped", self.port)

    def __enter__(self) -> "MongoStandIn":
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def drop_all(self) -> None:
        """Drop every database (handy between tests sharing one stand-in)."""
        with self._data_lock:
            for name in self.client.list_database_names():
                self.client.drop_database(name)
            self._cursors.clear()

    # ------------------------------------------------------------------ networking

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock=sock, conn_id=next(self._conn_ids))
            with self._conn_lock:
                if self._stopping.is_set():
                    sock.close()
                    break
                self._connections[conn.conn_id] = conn
                conn.thread = threading.Thread(
                    target=self._serve_connection, args=(conn,), name=f"MongoStandIn-conn-{conn.conn_id}", daemon=True
                )
            conn.thread.start()

    def _serve_connection(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            while True:
                header = _recv_exact(sock, 16)
                if header is None:
                    break
                length, request_id, _response_to, opcode = struct.unpack("<iiii", header)
                if length < 16 or length > MAX_MESSAGE_SIZE:
                    log.warning("MongoStandIn: bad message length %d; closing connection", length)
                    break
                payload = _recv_exact(sock, length - 16)
                if payload is None:
                    break
                with self._data_lock:
                    self.opcodes_seen[opcode] += 1
                if opcode == OP_MSG:
                    reply = self._handle_op_msg(request_id, payload, conn)
                elif opcode == OP_QUERY:
                    reply = self._handle_op_query(request_id, payload, conn)
                else:
                    log.warning("MongoStandIn: unsupported opcode %d; closing connection", opcode)
                    break
                if reply is not None:
                    sock.sendall(reply)
        except OSError:
            pass  # the peer went away, or stop() shut the socket
        except Exception:  # pragma: no cover - a bug in the stand-in
            log.exception("MongoStandIn: connection %d failed", conn.conn_id)
        finally:
            with self._conn_lock:
                self._connections.pop(conn.conn_id, None)
            try:
                sock.close()
            except OSError:
                pass

    def _header(self, length: int, response_to: int, opcode: int) -> bytes:
        return struct.pack("<iiii", 16 + length, next(self._request_ids) & 0x7FFFFFFF, response_to, opcode)

    def _handle_op_msg(self, request_id: int, payload: bytes, conn: _Connection) -> bytes | None:
        try:
            flags, cmd = parse_op_msg(payload)
        except Exception as exc:
            flags, response = 0, _error_doc(*_exception_to_error(exc)[:2])
        else:
            response = self.run_command(cmd, conn)
        if flags & MSG_MORE_TO_COME:
            return None  # unacknowledged (w: 0): the client expects no reply
        body = struct.pack("<I", 0) + b"\x00" + bson.encode(response)
        return self._header(len(body), request_id, OP_MSG) + body

    def _handle_op_query(self, request_id: int, payload: bytes, conn: _Connection) -> bytes:
        pos = 4  # flags
        full_name, pos = _cstring(payload, pos)
        pos += 8  # numberToSkip, numberToReturn
        (size,) = struct.unpack_from("<i", payload, pos)
        query = bson.decode(payload[pos : pos + size], CODEC_OPTIONS)
        if "$query" in query:
            query = dict(query["$query"])
        db_name, _, coll_name = full_name.partition(".")
        name = next(iter(query), "")
        reply_flags = 0
        if coll_name == "$cmd" and name in ("isMaster", "ismaster", "hello"):
            query["$db"] = db_name
            response = self.run_command(query, conn)
        else:
            # What a real 7.0 server answers to any other legacy OP_QUERY.
            message = f"Unsupported OP_QUERY command: {name or full_name}. The client driver may require an upgrade."
            log.warning("MongoStandIn: %s", message)
            response = {"$err": message, "code": 352, "ok": 0.0}
            reply_flags = REPLY_QUERY_FAILURE
        doc = bson.encode(response)
        body = struct.pack("<iqii", reply_flags, 0, 0, 1) + doc
        return self._header(len(body), request_id, OP_REPLY) + body

    # ------------------------------------------------------------------ dispatch

    def run_command(self, cmd: dict, conn: _Connection | None = None) -> dict:
        """Execute one command document (as sent by a driver) and return the reply document."""
        if not cmd:
            return _error_doc(9, "empty command")
        name = next(iter(cmd))
        db_name = cmd.get("$db", "admin")
        # One command at a time: the lock makes every command atomic, as single-document
        # writes are on a real server, and keeps mongomock (not thread-safe) consistent.
        with self._data_lock:
            self.commands_seen[name] += 1
            handler = self._handlers.get(name)
            if handler is None:
                self.unknown_commands[name] += 1
                log.warning("MongoStandIn: unknown command %r (db %r): %r", name, db_name, cmd)
                return _error_doc(59, f"no such command: '{name}' (MongoStandIn)")
            if TRANSACTION_FIELDS & cmd.keys():
                return _error_doc(20, "Transaction numbers are only allowed on a replica set member or mongos")
            args = {k: v for k, v in cmd.items() if k not in ENVELOPE_FIELDS}
            try:
                result = handler(db_name, args, conn)
            except Exception as exc:
                code, errmsg, extra = _exception_to_error(exc)
                return _error_doc(code, errmsg, **extra)
        result.setdefault("ok", 1.0)
        return result

    def _ignore(self, command: str, args: dict, used: set[str], harmless: set[str] = frozenset()) -> None:
        """Log options that the stand-in does not honour (and that are not mere hints)."""
        for key in args.keys() - used - harmless - {command}:
            self.ignored_options[f"{command}.{key}"] += 1
            log.warning("MongoStandIn: %s option %r ignored", command, key)

    def _collection(self, db_name: str, name: Any) -> mongomock.Collection:
        if not isinstance(name, str) or not name:
            raise CommandError(73, f"Invalid namespace specified '{db_name}.{name}'")
        return self.client[db_name][name]

    def _exists(self, db_name: str, name: str) -> bool:
        return name in self.client[db_name].list_collection_names()

    # ------------------------------------------------------------------ cursors

    def _batch(self, cursor: _Cursor, batch_size: int | None) -> list[dict]:
        out: list[dict] = []
        size = 0
        while cursor.pos < len(cursor.docs):
            if batch_size is not None and len(out) >= batch_size:
                break
            doc = cursor.docs[cursor.pos]
            doc_size = len(bson.encode(doc))
            if out and size + doc_size > BATCH_BYTES:
                break
            out.append(doc)
            size += doc_size
            cursor.pos += 1
        return out

    def _cursor_reply(self, ns: str, docs: list[dict], batch_size: int | None, single_batch: bool = False) -> dict:
        cursor = _Cursor(ns=ns, docs=docs)
        first = self._batch(cursor, DEFAULT_FIRST_BATCH if batch_size is None else batch_size)
        cursor_id = 0
        if not single_batch and cursor.pos < len(cursor.docs):
            cursor_id = random.getrandbits(62) + 1
            while cursor_id in self._cursors:
                cursor_id = random.getrandbits(62) + 1
            self._cursors[cursor_id] = cursor
        return {"cursor": {"firstBatch": first, "id": Int64(cursor_id), "ns": ns}}

    def _cmd_get_more(self, db_name: str, args: dict, conn: Any) -> dict:
        cursor_id = int(args["getMore"])
        ns = f"{db_name}.{args.get('collection')}"
        cursor = self._cursors.get(cursor_id)
        if cursor is None or cursor.ns != ns:
            raise CommandError(43, f"cursor id {cursor_id} not found")
        batch_size = args.get("batchSize") or None
        batch = self._batch(cursor, batch_size)
        if cursor.pos >= len(cursor.docs):
            del self._cursors[cursor_id]
            cursor_id = 0
        return {"cursor": {"nextBatch": batch, "id": Int64(cursor_id), "ns": ns}}

    def _cmd_kill_cursors(self, db_name: str, args: dict, conn: Any) -> dict:
        killed, not_found = [], []
        for cursor_id in args.get("cursors", []):
            if self._cursors.pop(int(cursor_id), None) is not None:
                killed.append(Int64(cursor_id))
            else:
                not_found.append(Int64(cursor_id))
        return {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []}

    # ------------------------------------------------------------------ handshake, info

    def _cmd_hello(self, db_name: str, args: dict, conn: _Connection | None) -> dict:
        if conn is not None and conn.handshake is None:
            conn.handshake = args
            self.handshakes.append(args)
        reply: dict[str, Any] = {}
        if next(iter(args)) == "hello":
            reply["isWritablePrimary"] = True
        else:
            reply["ismaster"] = True
        if args.get("helloOk"):
            reply["helloOk"] = True
        # No topologyVersion: the driver polls (no streaming/exhaust hello), no compression offered.
        reply.update(
            maxBsonObjectSize=MAX_BSON_OBJECT_SIZE,
            maxMessageSizeBytes=MAX_MESSAGE_SIZE,
            maxWriteBatchSize=MAX_WRITE_BATCH_SIZE,
            localTime=datetime.datetime.now(datetime.timezone.utc),
            logicalSessionTimeoutMinutes=30,
            connectionId=conn.conn_id if conn is not None else 0,
            minWireVersion=0,
            maxWireVersion=MAX_WIRE_VERSION,
            readOnly=False,
        )
        return reply

    def _cmd_build_info(self, db_name: str, args: dict, conn: Any) -> dict:
        return {
            "version": "7.0.0-standin",
            "versionArray": [7, 0, 0, 0],
            "gitVersion": "MongoStandIn",
            "bits": 64,
            "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
            "storageEngines": ["mongomock"],
        }

    def _cmd_transaction(self, db_name: str, args: dict, conn: Any) -> dict:
        raise CommandError(20, "Transactions are only supported on replica set members or mongos (MongoStandIn)")

    # ------------------------------------------------------------------ writes

    def _duplicate_details(self, coll: mongomock.Collection, doc: dict) -> tuple[str, dict]:
        """Best-effort real-server error text and keyPattern/keyValue for a duplicate ``doc``."""
        indexes = [("_id_", {"_id": 1}, None)]
        for info in coll.list_indexes():
            if info.get("unique") and info["name"] != "_id_":
                indexes.append((info["name"], dict(info["key"]), info.get("partialFilterExpression")))
        for name, key, partial in indexes:
            value = {}
            for field_name in key:
                try:
                    value[field_name] = mongomock.helpers.get_value_by_dot(doc, field_name)
                except KeyError:
                    value[field_name] = None
            query: dict = dict(value)
            if partial is not None:
                query = {"$and": [partial, query]}
            if name != "_id_" and "_id" in doc:
                query = {"$and": [query, {"_id": {"$ne": doc["_id"]}}]}
            if coll.find_one(query) is not None:
                shown = ", ".join(f"{k}: {bson.json_util.dumps(v)}" for k, v in value.items())
                message = (
                    f"E11000 duplicate key error collection: {coll.full_name} index: {name}"
                    f" dup key: {{ {shown} }}"
                )
                return message, {"keyPattern": key, "keyValue": value}
        return f"E11000 duplicate key error collection: {coll.full_name}", {}

    @staticmethod
    def _write_error(index: int, exc: BaseException) -> dict:
        code, errmsg, extra = _exception_to_error(exc)
        return {"index": index, "code": code, "errmsg": errmsg, **extra}

    def _cmd_insert(self, db_name: str, args: dict, conn: Any) -> dict:
        coll = self._collection(db_name, args["insert"])
        self._ignore("insert", args, {"documents", "ordered"}, {"bypassDocumentValidation"})
        ordered = args.get("ordered", True)
        n = 0
        errors = []
        for index, doc in enumerate(args.get("documents", [])):
            try:
                coll.insert_one(doc)
                n += 1
            except DuplicateKeyError:
                message, extra = self._duplicate_details(coll, doc)
                errors.append({"index": index, "code": 11000, "errmsg": message, **extra})
            except Exception as exc:
                errors.append(self._write_error(index, exc))
            if errors and ordered:
                break
        reply: dict[str, Any] = {"n": n}
        if errors:
            reply["writeErrors"] = errors
        return reply

    def _cmd_update(self, db_name: str, args: dict, conn: Any) -> dict:
        coll = self._collection(db_name, args["update"])
        self._ignore("update", args, {"updates", "ordered"}, {"bypassDocumentValidation"})
        ordered = args.get("ordered", True)
        n = n_modified = 0
        upserted = []
        errors = []
        for index, spec in enumerate(args.get("updates", [])):
            try:
                raw = self._update_one_statement(coll, spec)
                n += raw["n"]
                n_modified += raw["nModified"]
                if raw.get("upserted") is not None:
                    upserted.append({"index": index, "_id": raw["upserted"]})
            except Exception as exc:
                errors.append(self._write_error(index, exc))
                if ordered:
                    break
        reply: dict[str, Any] = {"n": n, "nModified": n_modified}
        if upserted:
            reply["upserted"] = upserted
        if errors:
            reply["writeErrors"] = errors
        return reply

    def _update_one_statement(self, coll: mongomock.Collection, spec: dict) -> dict:
        self._ignore("update.updates", spec, {"q", "u", "upsert", "multi", "arrayFilters", "collation"}, {"hint"})
        query = spec.get("q", {})
        update = spec.get("u")
        upsert = bool(spec.get("upsert", False))
        multi = bool(spec.get("multi", False))
        kwargs = {}
        if spec.get("arrayFilters") is not None:
            kwargs["array_filters"] = spec["arrayFilters"]
        if spec.get("collation") is not None:
            kwargs["collation"] = spec["collation"]
        if not isinstance(update, (dict, list)):
            raise CommandError(14, "Update argument must be either an object or an array")
        is_replacement = isinstance(update, dict) and not (update and next(iter(update)).startswith("$"))
        if is_replacement:
            if multi:
                raise CommandError(9, "multi update is not supported for replacement-style update")
            if kwargs:
                raise NotImplementedError(", ".join(kwargs) + " with a replacement document")
            return coll.replace_one(query, update, upsert=upsert).raw_result
        if multi:
            return coll.update_many(query, update, upsert=upsert, **kwargs).raw_result
        return coll.update_one(query, update, upsert=upsert, **kwargs).raw_result

    def _cmd_delete(self, db_name: str, args: dict, conn: Any) -> dict:
        coll = self._collection(db_name, args["delete"])
        self._ignore("delete", args, {"deletes", "ordered"})
        ordered = args.get("ordered", True)
        n = 0
        errors = []
        for index, spec in enumerate(args.get("deletes", [])):
            try:
                self._ignore("delete.deletes", spec, {"q", "limit", "collation"}, {"hint"})
                kwargs = {"collation": spec["collation"]} if spec.get("collation") is not None else {}
                if spec.get("limit", 0) == 1:
                    n += coll.delete_one(spec.get("q", {}), **kwargs).deleted_count
                else:
                    n += coll.delete_many(spec.get("q", {}), **kwargs).deleted_count
            except Exception as exc:
                errors.append(self._write_error(index, exc))
                if ordered:
                    break
        reply: dict[str, Any] = {"n": n}
        if errors:
            reply["writeErrors"] = errors
        return reply

    def _cmd_find_and_modify(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args.get("findAndModify", args.get("findandmodify"))
        coll = self._collection(db_name, name)
        self._ignore(
            "findAndModify",
            args,
            {"findandmodify", "query", "sort", "update", "remove", "new", "fields", "upsert", "arrayFilters",
             "collation"},
            {"hint", "bypassDocumentValidation"},
        )
        query = args.get("query") or {}
        sort = list((args.get("sort") or {}).items()) or None
        fields = args.get("fields")
        remove = bool(args.get("remove", False))
        update = args.get("update")
        new = bool(args.get("new", False))
        upsert = bool(args.get("upsert", False))
        if remove and update is not None:
            raise CommandError(9, "Cannot specify both an update and remove=true")
        if remove and new:
            raise CommandError(9, "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document")
        if remove and upsert:
            raise CommandError(9, "Cannot specify both upsert=true and remove=true")
        if not remove and update is None:
            raise CommandError(9, "Either an update or remove=true must be specified")
        if args.get("collation") is not None:
            raise NotImplementedError("collation")
        if args.get("arrayFilters") is not None:
            raise NotImplementedError("arrayFilters")

        old = coll.find_one(query, sort=sort)
        if old is None and not (upsert and not remove):
            return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}
        if old is not None:
            target = {"$and": [{"_id": old["_id"]}, query]} if "_id" in query else {**query, "_id": old["_id"]}
            old_projected = coll.find_one({"_id": old["_id"]}, projection=fields) if fields else old
            if remove:
                coll.delete_one({"_id": old["_id"]})
                return {"lastErrorObject": {"n": 1}, "value": old_projected}
            statement = {"q": target, "u": update}
            self._update_one_statement(coll, statement)
            value = coll.find_one({"_id": old["_id"]}, projection=fields) if new else old_projected
            return {"lastErrorObject": {"n": 1, "updatedExisting": True}, "value": value}
        raw = self._update_one_statement(coll, {"q": query, "u": update, "upsert": True})
        upserted_id = raw.get("upserted")
        value = coll.find_one({"_id": upserted_id}, projection=fields) if new else None
        return {"lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": upserted_id}, "value": value}

    # ------------------------------------------------------------------ reads

    def _cmd_find(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["find"]
        coll = self._collection(db_name, name)
        self._ignore(
            "find",
            args,
            {"filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch", "collation", "let"},
            {"hint", "allowDiskUse", "noCursorTimeout", "allowPartialResults", "readOnce"},
        )
        for unsupported in ("collation", "let", "min", "max", "returnKey", "showRecordId", "tailable", "awaitData"):
            if args.get(unsupported):
                raise NotImplementedError(f"find option {unsupported!r}")
        limit = int(args.get("limit") or 0)
        skip = int(args.get("skip") or 0)
        if limit < 0 or skip < 0:
            raise CommandError(2, "limit and skip must be non-negative")
        sort = list((args.get("sort") or {}).items()) or None
        projection = args.get("projection") or None
        text, rest = _split_text_filter(args.get("filter") or {})
        wants_score = any(_is_text_meta(v) for v in (projection or {}).values()) or any(
            _is_text_meta(v) for _, v in sort or [])
        if text is not None or wants_score:
            docs = self._text_find(coll, text, rest, projection, sort, skip, limit)
        else:
            docs = list(coll.find(rest, projection=projection, skip=skip, limit=limit, sort=sort))
        batch_size = args.get("batchSize")
        return self._cursor_reply(f"{db_name}.{name}", docs, batch_size, bool(args.get("singleBatch")))

    def _text_find(self, coll: mongomock.Collection, text: Any, rest: dict, projection: dict | None,
                   sort: list | None, skip: int, limit: int) -> list[dict]:
        """A find with ``$text`` and/or ``{$meta: "textScore"}``: mongomock filters on the rest
        of the query, the documents matching any of the terms are scored here."""
        if text is None:
            raise CommandError(40218, "query requires text score metadata, but it is not available")
        index = self._text_index(coll)
        if not isinstance(text, dict) or not isinstance(text.get("$search"), str):
            raise CommandError(2, "$text needs a String $search")
        for option in text.keys() - {"$search", "$language", "$caseSensitive", "$diacriticSensitive"}:
            raise CommandError(2, f"Unrecognized $text option: {option}")
        if text.get("$caseSensitive") or text.get("$diacriticSensitive"):
            raise NotImplementedError("$text with $caseSensitive or $diacriticSensitive")
        language = text.get("$language", index.language)
        if language not in TEXT_LANGUAGES:
            raise NotImplementedError(f"$text $language {language!r} (english and none only)")
        search = text["$search"]
        if '"' in search or re.search(r"(^|\s)-", search):
            raise NotImplementedError("$text phrases and negated terms")
        conditions = [rest, *(c for c in rest.get("$and", []) if isinstance(c, dict))]
        for name in index.prefix:
            values = [c[name] for c in conditions if name in c]
            equality = any(v is not None and not (isinstance(v, dict) and any(
                k.startswith("$") and k != "$eq" for k in v)) for v in values)
            if not equality:
                raise CommandError(2, "error processing query: planner returned error :: caused by :: failed to use "
                                      "text index to satisfy $text query (if text index is compound, are equality "
                                      f"predicates given for all prefix fields?) (missing: {name})")
        terms = set(text_tokens(search, TEXT_LANGUAGES[language]))
        stop_words = TEXT_LANGUAGES[index.language]
        scored: list[tuple[dict, float]] = []
        for doc in coll.find(rest) if terms else ():
            scores: dict[str, float] = {}
            for name, weight in index.weights.items():
                try:
                    value = mongomock.helpers.get_value_by_dot(doc, name)
                except KeyError:
                    continue
                for raw in value if isinstance(value, list) else [value]:
                    if isinstance(raw, str):
                        text_field_scores(raw, stop_words, weight, scores)
            score = sum(scores.get(term, 0.0) for term in terms)
            if score > 0:
                scored.append((doc, score))
        for key, direction in reversed(sort or []):
            if _is_text_meta(direction):  # always best first
                scored.sort(key=lambda pair: pair[1], reverse=True)
            elif key == "$natural" or key.startswith("$"):
                raise NotImplementedError(f"sorting a $text query by {key}")
            else:
                scored.sort(key=lambda pair, k=key: mongomock.filtering.resolve_sort_key(k, pair[0]),
                            reverse=direction < 0)
        page = scored[skip:skip + limit] if limit else scored[skip:]
        meta_fields = [k for k, v in (projection or {}).items() if _is_text_meta(v)]
        plain = {k: v for k, v in (projection or {}).items() if not _is_text_meta(v)}
        docs = []
        for doc, score in page:
            projected = coll._copy_only_fields(doc, dict(plain), dict) if plain else doc
            for name in meta_fields:
                projected[name] = score
            docs.append(projected)
        return docs

    @staticmethod
    def _text_index(coll: mongomock.Collection) -> _TextIndex:
        for info in coll.list_indexes():
            key = list(info["key"].items())
            if any(v == "text" for _, v in key):
                first_text = next(i for i, (_, v) in enumerate(key) if v == "text")
                return _TextIndex(name=info["name"], prefix=tuple(k for k, _ in key[:first_text]),
                                  weights={k: float(w) for k, w in info.get("weights", {}).items()},
                                  language=info.get("default_language", "english"))
        raise CommandError(27, "text index required for $text query")

    def _cmd_aggregate(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["aggregate"]
        if not isinstance(name, str):
            raise NotImplementedError("database-level aggregate ({aggregate: 1})")
        coll = self._collection(db_name, name)
        self._ignore("aggregate", args, {"pipeline", "cursor", "explain", "collation", "let"},
                     {"hint", "allowDiskUse", "bypassDocumentValidation"})
        for unsupported in ("explain", "collation", "let"):
            if args.get(unsupported):
                raise NotImplementedError(f"aggregate option {unsupported!r}")
        if "cursor" not in args:
            raise CommandError(9, "The 'cursor' option is required, except for aggregate with the explain argument")
        docs = list(coll.aggregate(list(args.get("pipeline") or [])))
        batch_size = (args.get("cursor") or {}).get("batchSize")
        return self._cursor_reply(f"{db_name}.{name}", docs, batch_size)

    def _cmd_count(self, db_name: str, args: dict, conn: Any) -> dict:
        coll = self._collection(db_name, args["count"])
        self._ignore("count", args, {"query", "limit", "skip", "collation"}, {"hint"})
        if args.get("collation"):
            raise NotImplementedError("count option 'collation'")
        skip = int(args.get("skip") or 0)
        limit = abs(int(args.get("limit") or 0))
        n = sum(1 for _ in coll.find(args.get("query") or {}, skip=skip, limit=limit))
        return {"n": n}

    def _cmd_distinct(self, db_name: str, args: dict, conn: Any) -> dict:
        coll = self._collection(db_name, args["distinct"])
        self._ignore("distinct", args, {"key", "query", "collation"}, {"hint"})
        if args.get("collation"):
            raise NotImplementedError("distinct option 'collation'")
        return {"values": coll.distinct(args["key"], args.get("query") or None)}

    # ------------------------------------------------------------------ indexes

    def _cmd_create_indexes(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["createIndexes"]
        coll = self._collection(db_name, name)
        self._ignore("createIndexes", args, {"indexes"}, {"commitQuorum"})
        existed = self._exists(db_name, name)
        before = len(list(coll.list_indexes())) if existed else 0
        known = {"key", "name", "unique", "sparse", "partialFilterExpression", "expireAfterSeconds", "background", "v"}
        for spec in args.get("indexes", []):
            if not spec.get("key"):
                raise CommandError(9, "Index spec has no 'key'")
            if "text" in spec["key"].values():
                self._create_text_index(coll, spec)
                continue
            for option in spec.keys() - known:
                self.ignored_options[f"createIndexes.indexes.{option}"] += 1
                log.warning("MongoStandIn: index option %r ignored (index %r)", option, spec.get("name"))
            kwargs = {k: spec[k] for k in ("name", "unique", "sparse", "partialFilterExpression",
                                          "expireAfterSeconds") if spec.get(k) is not None}
            coll.create_index(list(spec["key"].items()), **kwargs)
        after = len(list(coll.list_indexes()))
        reply: dict[str, Any] = {"numIndexesBefore": max(before, 1), "numIndexesAfter": after,
                                 "createdCollectionAutomatically": not existed}
        if after == before:
            reply["note"] = "all indexes already exist"
        return reply

    def _create_text_index(self, coll: mongomock.Collection, spec: dict) -> None:
        """A text index: key fields (equality prefix, then the text fields), weights and
        default_language (english or none), kept with the index as a real server lists them."""
        key = list(spec["key"].items())
        kinds = ["text" if v == "text" else "other" for _, v in key]
        first = kinds.index("text")
        last = len(kinds) - 1 - kinds[::-1].index("text")
        if "other" in kinds[first:last + 1]:
            raise CommandError(67, "'text' fields in index must all be adjacent")
        if last != len(kinds) - 1:
            raise NotImplementedError("text index with fields after the text fields")
        if any(k == "$**" for k, _ in key) or spec.get("weights") == "$**":
            raise NotImplementedError("wildcard text index")
        for option in spec.keys() - {"key", "name", "weights", "default_language", "language_override",
                                    "textIndexVersion", "background", "v"}:
            raise NotImplementedError(f"text index option {option!r}")
        language = spec.get("default_language", "english")
        if language not in TEXT_LANGUAGES:
            raise NotImplementedError(f"text index default_language {language!r} (english and none only)")
        weights = {k: 1 for k, v in key if v == "text"}
        weights.update({k: int(w) for k, w in (spec.get("weights") or {}).items()})
        name = spec.get("name") or "_".join(f"{k}_{v}" for k, v in key)
        options = {"weights": weights, "default_language": language,
                   "language_override": spec.get("language_override", "language"), "textIndexVersion": 3}
        for info in coll.list_indexes():
            if "text" not in info["key"].values():
                continue
            if info["name"] == name and list(info["key"].items()) == key and all(
                    info.get(k) == v for k, v in options.items()):
                return  # the same index again: a no-op, as on a real server
            raise CommandError(85, f"An equivalent index already exists with a different name and options: "
                                   f"only one text index per collection ({info['name']!r} exists)")
        coll.create_index(key, name=name)
        coll._store.indexes[name].update(options)

    def _cmd_list_indexes(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["listIndexes"]
        coll = self._collection(db_name, name)
        if not self._exists(db_name, name):
            raise CommandError(26, f"ns does not exist: {db_name}.{name}")
        docs = [{"v": 2, **info} for info in coll.list_indexes()]
        return self._cursor_reply(f"{db_name}.{name}", docs, (args.get("cursor") or {}).get("batchSize"))

    def _cmd_drop_indexes(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args.get("dropIndexes", args.get("deleteIndexes"))
        coll = self._collection(db_name, name)
        if not self._exists(db_name, name):
            raise CommandError(26, f"ns not found {db_name}.{name}")
        infos = list(coll.list_indexes())
        spec = args.get("index")
        if spec == "*":
            coll.drop_indexes()
            return {"nIndexesWas": len(infos), "msg": "non-_id indexes dropped for collection"}
        if isinstance(spec, dict):
            matches = [info["name"] for info in infos if dict(info["key"]) == dict(spec)]
            if not matches:
                raise CommandError(27, f"can't find index with key: {spec}")
            names = matches[:1]
        elif isinstance(spec, str):
            names = [spec]
        elif isinstance(spec, list):
            names = list(spec)
        else:
            raise CommandError(14, "dropIndexes 'index' must be a string, a document or an array")
        existing = {info["name"] for info in infos}
        for index_name in names:
            if index_name == "_id_":
                raise CommandError(72, "cannot drop _id index")
            if index_name not in existing:
                raise CommandError(27, f"index not found with name [{index_name}]")
        for index_name in names:
            coll.drop_index(index_name)
        return {"nIndexesWas": len(infos)}

    # ------------------------------------------------------------------ collections, databases

    def _cmd_list_collections(self, db_name: str, args: dict, conn: Any) -> dict:
        self._ignore("listCollections", args, {"filter", "nameOnly", "cursor"}, {"authorizedCollections"})
        db = self.client[db_name]
        name_only = bool(args.get("nameOnly"))
        docs = []
        for name in sorted(db.list_collection_names()):
            doc: dict[str, Any] = {"name": name, "type": "collection"}
            if not name_only:
                doc.update(options={}, info={"readOnly": False},
                           idIndex={"v": 2, "key": {"_id": 1}, "name": "_id_"})
            docs.append(doc)
        filt = args.get("filter") or {}
        if filt:
            docs = [d for d in docs if mongomock.filtering.filter_applies(filt, d)]
        return self._cursor_reply(f"{db_name}.$cmd.listCollections", docs,
                                  (args.get("cursor") or {}).get("batchSize"))

    def _cmd_list_databases(self, db_name: str, args: dict, conn: Any) -> dict:
        if db_name != "admin":
            raise CommandError(13, "listDatabases may only be run against the admin database.")
        self._ignore("listDatabases", args, {"filter", "nameOnly"}, {"authorizedDatabases"})
        docs = []
        for name in sorted(self.client.list_database_names()):
            if args.get("nameOnly"):
                docs.append({"name": name})
            else:
                docs.append({"name": name, "sizeOnDisk": 0, "empty": False})
        filt = args.get("filter") or {}
        if filt:
            docs = [d for d in docs if mongomock.filtering.filter_applies(filt, d)]
        reply: dict[str, Any] = {"databases": docs}
        if not args.get("nameOnly"):
            reply.update(totalSize=0, totalSizeMb=0)
        return reply

    def _cmd_drop(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["drop"]
        coll = self._collection(db_name, name)
        n_indexes = len(list(coll.list_indexes())) if self._exists(db_name, name) else 0
        self.client[db_name].drop_collection(name)
        ns = f"{db_name}.{name}"
        for cursor_id in [cid for cid, c in self._cursors.items() if c.ns == ns]:
            del self._cursors[cursor_id]
        return {"ns": ns, "nIndexesWas": n_indexes}

    def _cmd_drop_database(self, db_name: str, args: dict, conn: Any) -> dict:
        self.client.drop_database(db_name)
        prefix = f"{db_name}."
        for cursor_id in [cid for cid, c in self._cursors.items() if c.ns.startswith(prefix)]:
            del self._cursors[cursor_id]
        return {"dropped": db_name}

    def _cmd_create(self, db_name: str, args: dict, conn: Any) -> dict:
        name = args["create"]
        self._collection(db_name, name)
        self._ignore("create", args, set())
        try:
            self.client[db_name].create_collection(name)
        except CollectionInvalid as exc:
            raise CommandError(48, f"Collection {db_name}.{name} already exists.") from exc
        return {}

    def _cmd_rename_collection(self, db_name: str, args: dict, conn: Any) -> dict:
        source, target = args["renameCollection"], args.get("to", "")
        self._ignore("renameCollection", args, {"to", "dropTarget"}, {"stayTemp"})
        src_db, _, src_name = source.partition(".")
        dst_db, _, dst_name = target.partition(".")
        if src_db != dst_db:
            raise NotImplementedError("renameCollection across databases")
        if not self._exists(src_db, src_name):
            raise CommandError(26, "Source collection does not exist")
        if self._exists(dst_db, dst_name):
            if not args.get("dropTarget"):
                raise CommandError(48, "target namespace exists")
            self.client[dst_db].drop_collection(dst_name)
        self.client[src_db][src_name].rename(dst_name)
        return {}
