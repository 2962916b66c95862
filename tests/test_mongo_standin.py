"""The MongoDB stand-in (tests/mongo_standin.py), driven by the real PyMongo clients.

The CRUD tests take the `db` fixture: a fresh database on a real server when MONGODB_URI
is set, else on a fresh stand-in, so the same assertions check that the stand-in answers
like MongoDB. Tests about the stand-in itself (outages, cursors it keeps, what it logs)
take the `standin` fixture and always run against it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import uuid
import zlib

import bson
import pymongo
import pytest
from pymongo import (
    ASCENDING,
    DESCENDING,
    AsyncMongoClient,
    DeleteOne,
    InsertOne,
    ReplaceOne,
    ReturnDocument,
    UpdateMany,
    UpdateOne,
)
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    ServerSelectionTimeoutError,
)
from pymongo.write_concern import WriteConcern

from .mongo_standin import MongoStandIn

MONGODB_URI = os.environ.get("MONGODB_URI")


@pytest.fixture
def standin():
    """One stand-in per test, stopped afterwards."""
    with MongoStandIn() as server:
        yield server


@pytest.fixture
def uri():
    """The server at MONGODB_URI if set, else a fresh stand-in."""
    if MONGODB_URI:
        yield MONGODB_URI
        return
    with MongoStandIn() as server:
        yield server.uri


@pytest.fixture
async def db(uri):
    """A fresh database on `uri`, dropped afterwards."""
    client = AsyncMongoClient(uri, serverSelectionTimeoutMS=5000)
    name = f"standin_test_{uuid.uuid4().hex[:10]}"
    try:
        yield client[name]
        await client.drop_database(name)
    finally:
        await client.close()


async def eventually(make_call, timeout: float = 10.0):
    """Await make_call() until it stops failing with a connection error (a driver reconnecting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await make_call()
        except ConnectionFailure:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- CRUD


async def test_insert_and_find_with_sort_limit_and_find_one(db):
    coll = db.items
    result = await coll.insert_one({"_id": "a", "n": 5, "tags": ["x"]})
    assert result.inserted_id == "a"
    many = await coll.insert_many([{"n": i, "tags": ["y"] * i} for i in range(4)])
    assert len(many.inserted_ids) == 4

    top = await coll.find({"n": {"$gte": 1}}, {"_id": 0, "n": 1}).sort("n", DESCENDING).limit(3).to_list()
    assert top == [{"n": 5}, {"n": 3}, {"n": 2}]

    skipped = await coll.find({}, {"n": 1}).sort([("n", ASCENDING)]).skip(1).limit(2).to_list()
    assert [d["n"] for d in skipped] == [1, 2]

    assert await coll.find_one({"_id": "a"}) == {"_id": "a", "n": 5, "tags": ["x"]}
    assert await coll.find_one({"_id": "missing"}) is None
    assert await coll.find_one({"tags": "y", "n": {"$in": [2, 3]}}, sort=[("n", -1)], projection={"_id": 0}) == {
        "n": 3,
        "tags": ["y", "y", "y"],
    }


async def test_update_one_push_each_slice_inc_and_upsert(db):
    coll = db.shards
    await coll.insert_one({"_id": "s1", "facts": ["f0", "f1"], "count": 1})

    result = await coll.update_one(
        {"_id": "s1"},
        {"$push": {"facts": {"$each": ["f2", "f3", "f4"], "$slice": -3}}, "$inc": {"count": 2}},
    )
    assert (result.matched_count, result.modified_count, result.upserted_id) == (1, 1, None)
    assert await coll.find_one({"_id": "s1"}) == {"_id": "s1", "facts": ["f2", "f3", "f4"], "count": 3}

    result = await coll.update_one(
        {"_id": "s2"},
        {"$setOnInsert": {"created": True}, "$inc": {"count": 1}, "$push": {"facts": {"$each": ["g"], "$slice": -3}}},
        upsert=True,
    )
    assert result.upserted_id == "s2"
    assert (result.matched_count, result.modified_count) == (0, 0)
    assert await coll.find_one({"_id": "s2"}) == {"_id": "s2", "created": True, "count": 1, "facts": ["g"]}

    result = await coll.update_one({"_id": "nope"}, {"$set": {"x": 1}})
    assert (result.matched_count, result.modified_count, result.upserted_id) == (0, 0, None)

    result = await coll.update_many({}, {"$max": {"count": 2}, "$addToSet": {"facts": "g"}})
    assert (result.matched_count, result.modified_count) == (2, 2)
    assert await coll.find_one({"_id": "s1"}, {"_id": 0}) == {"facts": ["f2", "f3", "f4", "g"], "count": 3}

    result = await coll.replace_one({"_id": "s2"}, {"replaced": True})
    assert result.modified_count == 1
    assert await coll.find_one({"_id": "s2"}) == {"_id": "s2", "replaced": True}


async def test_find_one_and_update_returns_the_document_after(db):
    coll = db.counters
    await coll.insert_many([{"_id": 1, "k": "a", "v": 1}, {"_id": 2, "k": "a", "v": 10}])
    after = await coll.find_one_and_update(
        {"k": "a"}, {"$inc": {"v": 5}}, sort=[("v", DESCENDING)], return_document=ReturnDocument.AFTER
    )
    assert after == {"_id": 2, "k": "a", "v": 15}
    before = await coll.find_one_and_update({"_id": 1}, {"$set": {"v": 0}}, projection={"_id": 0, "v": 1})
    assert before == {"v": 1}
    upserted = await coll.find_one_and_update(
        {"_id": 3}, {"$set": {"k": "b"}}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert upserted == {"_id": 3, "k": "b"}
    assert await coll.find_one_and_update({"_id": 99}, {"$set": {"k": "z"}}) is None
    deleted = await coll.find_one_and_delete({"k": "b"})
    assert deleted == {"_id": 3, "k": "b"}
    assert await coll.count_documents({}) == 2


async def test_delete_many_and_count_documents(db):
    coll = db.msgs
    await coll.insert_many([{"session": "s1" if i % 3 else "s2", "i": i} for i in range(12)])
    assert await coll.count_documents({}) == 12
    assert await coll.count_documents({"session": "s2"}) == 4
    assert await coll.count_documents({"session": "s1"}, skip=2, limit=5) == 5
    assert await coll.estimated_document_count() == 12
    result = await coll.delete_many({"session": "s1"})
    assert result.deleted_count == 8
    result = await coll.delete_one({"session": "s2", "i": 0})
    assert result.deleted_count == 1
    assert await coll.count_documents({}) == 3
    assert sorted(await coll.distinct("i")) == [3, 6, 9]


async def test_unique_index_reports_duplicate_keys_like_a_server(db):
    coll = db.users
    name = await coll.create_index([("agent", ASCENDING), ("user", ASCENDING)], unique=True, name="agent_user")
    assert name == "agent_user"
    await coll.create_index("ts")
    indexes = {ix["name"]: ix async for ix in await coll.list_indexes()}
    assert set(indexes) == {"_id_", "agent_user", "ts_1"}
    assert indexes["agent_user"]["unique"] is True
    assert dict(indexes["agent_user"]["key"]) == {"agent": 1, "user": 1}

    await coll.insert_one({"agent": "a", "user": "u"})
    with pytest.raises(DuplicateKeyError) as excinfo:
        await coll.insert_one({"agent": "a", "user": "u"})
    assert excinfo.value.code == 11000
    assert "E11000" in str(excinfo.value)
    with pytest.raises(DuplicateKeyError):
        await coll.insert_one({"_id": (await coll.find_one())["_id"], "agent": "b", "user": "u"})
    with pytest.raises(DuplicateKeyError):
        await coll.update_one({"agent": "b"}, {"$set": {"user": "u", "agent": "a"}}, upsert=True)

    with pytest.raises(BulkWriteError) as excinfo:
        await coll.insert_many([{"agent": "b", "user": "u"}, {"agent": "a", "user": "u"}, {"agent": "c", "user": "u"}])
    details = excinfo.value.details
    assert details["nInserted"] == 1
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000)]

    with pytest.raises(BulkWriteError) as excinfo:
        await coll.insert_many([{"agent": "a", "user": "u"}, {"agent": "d", "user": "u"}], ordered=False)
    assert excinfo.value.details["nInserted"] == 1
    assert sorted(await coll.distinct("agent")) == ["a", "b", "d"]

    await coll.drop_index("ts_1")
    assert {ix["name"] async for ix in await coll.list_indexes()} == {"_id_", "agent_user"}


async def test_bulk_write_with_mixed_operations(db):
    coll = db.bulk
    await coll.insert_many([{"_id": i, "v": i} for i in range(5)])
    result = await coll.bulk_write(
        [
            InsertOne({"_id": 10, "v": 10}),
            UpdateOne({"_id": 0}, {"$set": {"v": 100}}),
            UpdateMany({"v": {"$lt": 4}}, {"$inc": {"v": 1000}}),
            UpdateOne({"_id": 20}, {"$set": {"v": 20}}, upsert=True),
            ReplaceOne({"_id": 4}, {"v": "replaced"}),
            DeleteOne({"_id": 10}),
        ]
    )
    assert result.inserted_count == 1
    assert result.matched_count == 1 + 3 + 1
    assert result.modified_count == 1 + 3 + 1
    assert result.upserted_ids == {3: 20}
    assert result.deleted_count == 1
    docs = {d["_id"]: d["v"] async for d in coll.find()}
    assert docs == {0: 100, 1: 1001, 2: 1002, 3: 1003, 4: "replaced", 20: 20}

    with pytest.raises(BulkWriteError) as excinfo:
        await coll.bulk_write(
            [InsertOne({"_id": 30}), InsertOne({"_id": 1}), UpdateOne({"_id": 30}, {"$set": {"x": 1}})]
        )
    assert excinfo.value.details["nInserted"] == 1
    assert excinfo.value.details["nModified"] == 0
    assert excinfo.value.details["writeErrors"][0]["code"] == 11000


async def test_text_search_matches_any_word_and_scores_like_mongodb(db):
    coll = db.notes
    await coll.insert_many([
        {"_id": 1, "agent": "a", "body": "hotel near the station"},
        {"_id": 2, "agent": "a", "body": "Hotel, hotel and HOTEL rooms"},
        {"_id": 3, "agent": "a", "body": "the flight leaves at nine"},
        {"_id": 4, "agent": "b", "body": "hotel"},
        {"_id": 5, "agent": "a", "body": "Café crème at the station"},
    ])
    with pytest.raises(OperationFailure) as excinfo:
        await coll.find_one({"agent": "a", "$text": {"$search": "hotel"}})
    assert excinfo.value.code == 27  # no text index
    await coll.create_index([("agent", ASCENDING), ("body", "text")], name="agent_body")
    await coll.create_index([("agent", ASCENDING), ("body", "text")], name="agent_body")  # again: a no-op

    score = {"score": {"$meta": "textScore"}}
    cursor = coll.find({"agent": "a", "$text": {"$search": "hotel station"}}, score).sort([("score", score["score"])])
    found = [(d["_id"], round(d["score"], 4)) for d in await cursor.to_list()]
    # 2: "hotel" 3 times in 4 terms: (1 + 1/2 + 1/4) x (0.5 + 0.5 x 3/4); 1: two terms of 3,
    # 2 x (0.5 + 0.5/3); 5: "station" once in 3 terms. Stop words are not terms.
    assert found == [(2, 1.5312), (1, 1.3333), (5, 0.6667)]
    # The agent (the index's prefix) keeps "b"'s memory out; a field that is the term alone: x 1.1.
    assert [(d["_id"], round(d["score"], 4)) async for d in coll.find({"agent": "b", "$text": {"$search": "hotel"}},
                                                                      score)] == [(4, 1.1)]
    # Case and diacritics do not matter; stop words alone match nothing.
    assert [d["_id"] async for d in coll.find({"agent": "a", "$text": {"$search": "CAFE"}})] == [5]
    assert await coll.find({"agent": "a", "$text": {"$search": "the and at"}}).to_list() == []
    # Exclusion projection beside the score, other filters, sort on score then a field, limit.
    rows = await coll.find(
        {"$and": [{"agent": "a"}, {"_id": {"$ne": 2}}, {"$text": {"$search": "station hotel"}}]},
        {"body": 0, "s": {"$meta": "textScore"}},
    ).sort([("s", {"$meta": "textScore"}), ("_id", DESCENDING)]).limit(1).to_list()
    assert rows == [{"_id": 1, "agent": "a", "s": pytest.approx(4 / 3)}]


async def test_text_search_errors_as_on_a_server(db):
    coll = db.notes
    await coll.create_index([("agent", ASCENDING), ("body", "text")])
    await coll.insert_one({"_id": 1, "agent": "a", "body": "hotel"})
    with pytest.raises(OperationFailure):  # a compound text index needs its prefix by equality
        await coll.find_one({"$text": {"$search": "hotel"}})
    with pytest.raises(OperationFailure) as excinfo:  # a score without a text search
        await coll.find_one({"agent": "a"}, {"score": {"$meta": "textScore"}})
    assert excinfo.value.code == 40218
    with pytest.raises(OperationFailure):  # one text index per collection
        await coll.create_index([("title", "text")])


async def test_text_search_limits_of_the_stand_in(standin):
    client = AsyncMongoClient(standin.uri)
    try:
        coll = client.memory.notes
        await coll.create_index([("body", "text")])
        await coll.insert_one({"_id": 1, "body": "the flight leaves at nine"})
        # No stemming here (a real server finds "flight" for "flights").
        assert await coll.find({"$text": {"$search": "flights"}}).to_list() == []
        assert [d["_id"] async for d in coll.find({"$text": {"$search": "flight"}})] == [1]
        for search in ('"leaves at"', "flight -nine"):  # phrases and negations: refused, not misread
            with pytest.raises(OperationFailure) as excinfo:
                await coll.find_one({"$text": {"$search": search}})
            assert excinfo.value.code == 238
        with pytest.raises(OperationFailure) as excinfo:  # $text in aggregate: mongomock's, missing
            await coll.count_documents({"$text": {"$search": "flight"}})
        assert excinfo.value.code == 238
    finally:
        await client.close()


async def test_aggregate(db):
    coll = db.events
    await coll.insert_many(
        [{"ns": f"shard:{i % 3}", "score": i, "kind": "fact" if i % 2 else "suggestion"} for i in range(12)]
    )
    pipeline = [
        {"$match": {"kind": "fact"}},
        {"$group": {"_id": "$ns", "total": {"$sum": "$score"}, "n": {"$sum": 1}}},
        {"$sort": {"total": -1}},
        {"$project": {"_id": 0, "ns": "$_id", "total": 1, "n": 1}},
    ]
    rows = await (await coll.aggregate(pipeline)).to_list()
    # facts are the odd scores: shard:0 gets 3 and 9, shard:1 gets 1 and 7, shard:2 gets 5 and 11.
    assert rows == [
        {"ns": "shard:2", "total": 16, "n": 2},
        {"ns": "shard:0", "total": 12, "n": 2},
        {"ns": "shard:1", "total": 8, "n": 2},
    ]

    page_pipeline = [{"$sort": {"score": 1}}, {"$skip": 3}, {"$limit": 2}, {"$project": {"_id": 0, "score": 1}}]
    page = await (await coll.aggregate(page_pipeline)).to_list()
    assert page == [{"score": 3}, {"score": 4}]


async def test_cursor_bigger_than_a_batch_iterates_fully_via_get_more(db):
    coll = db.many
    await coll.insert_many([{"_id": i, "pad": "x" * 100} for i in range(250)])
    ids = [d["_id"] async for d in coll.find({}, {"pad": 0}).sort("_id", 1).batch_size(7)]
    assert ids == list(range(250))
    # The default first batch (101) is smaller than the result too.
    assert len(await coll.find().to_list()) == 250
    # A cursor abandoned half-way is killed, and aggregate cursors page as well.
    cursor = coll.find().batch_size(5)
    assert (await cursor.next())["_id"] == 0
    await cursor.close()
    rows = await (await coll.aggregate([{"$match": {"_id": {"$lt": 40}}}], batchSize=3)).to_list()
    assert len(rows) == 40


async def test_collections_and_databases(db):
    await db.create_collection("made")
    with pytest.raises(pymongo.errors.CollectionInvalid):  # the driver checks listCollections first
        await db.create_collection("made")
    with pytest.raises(OperationFailure) as excinfo:  # and the server answers NamespaceExists
        await db.create_collection("made", check_exists=False)
    assert excinfo.value.code == 48
    await db.other.insert_one({"x": 1})
    assert set(await db.list_collection_names()) == {"made", "other"}
    assert [c["name"] async for c in await db.list_collections(filter={"name": "other"})] == ["other"]
    assert db.name in await db.client.list_database_names()
    await db.other.drop()
    assert await db.list_collection_names() == ["made"]
    assert (await db.command("ping"))["ok"] == 1


async def test_unacknowledged_writes_get_no_reply_and_keep_the_connection_usable(uri, db):
    client = AsyncMongoClient(uri, maxPoolSize=1, serverSelectionTimeoutMS=5000)
    try:
        coll = client[db.name].get_collection("w0", write_concern=WriteConcern(w=0))
        result = await coll.insert_one({"_id": 1})
        assert not result.acknowledged
        await coll.update_one({"_id": 1}, {"$set": {"done": True}})
        # One connection: had the server answered the w:0 writes, this reply would be out of step.
        assert await client[db.name].w0.find_one({"_id": 1}) == {"_id": 1, "done": True}
    finally:
        await client.close()


async def test_unknown_command_is_command_not_found(db):
    with pytest.raises(OperationFailure) as excinfo:
        await db.command("noSuchCommandAnywhere")
    assert excinfo.value.code == 59


# --------------------------------------------------------------------------- the stand-in itself


async def test_stop_is_an_outage_and_start_on_the_same_port_restores_the_data(standin):
    client = AsyncMongoClient(standin.uri, serverSelectionTimeoutMS=500)
    try:
        coll = client.memory.items
        await coll.insert_many([{"_id": i} for i in range(3)])
        port, uri = standin.port, standin.uri

        standin.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        with pytest.raises(ConnectionFailure):
            await coll.find_one({"_id": 0})
        with pytest.raises(ServerSelectionTimeoutError):
            await coll.insert_one({"_id": 99})

        assert standin.start(port) == uri
        assert await eventually(lambda: coll.count_documents({})) == 3
        await coll.insert_one({"_id": 3})
        assert [d["_id"] async for d in coll.find().sort("_id")] == [0, 1, 2, 3]
    finally:
        await client.close()


async def test_stop_resets_open_connections(standin):
    sock = socket.create_connection(("127.0.0.1", standin.port), timeout=5)
    try:
        for _ in range(100):  # wait until the stand-in has registered the connection
            if standin._connections:
                break
            await asyncio.sleep(0.01)
        standin.stop()
        try:
            data = sock.recv(1)
        except ConnectionResetError:
            data = b""
        assert data == b""
    finally:
        sock.close()


async def test_concurrent_increments_are_all_applied(standin):
    client = AsyncMongoClient(standin.uri)
    try:
        coll = client.memory.counters
        await coll.insert_one({"_id": "c", "n": 0})
        inc = {"$inc": {"n": 1}}
        await asyncio.gather(coll.update_one({"_id": "c"}, inc), coll.update_one({"_id": "c"}, inc))
        assert (await coll.find_one({"_id": "c"}))["n"] == 2
        await asyncio.gather(*(coll.update_one({"_id": "c"}, inc) for _ in range(50)))
        assert (await coll.find_one({"_id": "c"}))["n"] == 52
        assert len(standin.handshakes) >= 2  # several pooled connections took part
    finally:
        await client.close()


async def test_get_more_and_kill_cursors_reach_the_stand_in(standin):
    client = AsyncMongoClient(standin.uri)
    try:
        coll = client.memory.many
        await coll.insert_many([{"_id": i} for i in range(30)])
        assert len([d async for d in coll.find().batch_size(4)]) == 30
        assert standin.commands_seen["getMore"] == 7
        cursor = coll.find().batch_size(4)
        await cursor.next()
        await cursor.close()
        assert standin.commands_seen["killCursors"] == 1
        assert standin._cursors == {}
    finally:
        await client.close()


async def test_unknown_commands_are_logged_and_counted(standin, caplog):
    client = AsyncMongoClient(standin.uri)
    try:
        with pytest.raises(OperationFailure, match="no such command: 'frobnicate' \\(MongoStandIn\\)"):
            await client.admin.command("frobnicate")
        assert standin.unknown_commands["frobnicate"] == 1
        assert "unknown command 'frobnicate'" in caplog.text
    finally:
        await client.close()


async def test_transactions_are_refused_as_on_a_standalone_server(standin):
    client = AsyncMongoClient(standin.uri)
    try:
        coll = client.memory.tx
        await coll.insert_one({"_id": 0})
        with pytest.raises(OperationFailure) as excinfo:
            async with client.start_session() as session:
                async with await session.start_transaction():
                    await coll.insert_one({"_id": 1}, session=session)
        assert excinfo.value.code == 20  # IllegalOperation, as a standalone mongod answers
        assert await coll.count_documents({}) == 1
        assert not standin.unknown_commands  # abortTransaction is answered, not unknown
    finally:
        await client.close()


async def test_unimplemented_mongomock_features_fail_loudly(standin):
    client = AsyncMongoClient(standin.uri)
    try:
        coll = client.memory.af
        await coll.insert_one({"_id": 1, "a": [{"x": 1}, {"x": 2}]})
        with pytest.raises(OperationFailure) as excinfo:
            await coll.update_one({"_id": 1}, {"$set": {"a.$[e].x": 9}}, array_filters=[{"e.x": 2}])
        assert excinfo.value.code == 238
    finally:
        await client.close()


def test_sync_client_and_restart_keep_data():
    with MongoStandIn() as server:
        client = pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=2000)
        try:
            client.memory.sync.insert_one({"_id": "x", "v": 1})
            server.stop()
            server.start()
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert client.memory.sync.find_one({"_id": "x"}) == {"_id": "x", "v": 1}
                    break
                except ConnectionFailure:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert server.opcodes_seen[2004] >= 1 or server.opcodes_seen[2013] >= 1
        finally:
            client.close()


def _raw_roundtrip(port: int, message: bytes) -> tuple[int, bytes]:
    """Send one framed message on a fresh socket; return (opCode, body after the header)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(message)
        header = b""
        while len(header) < 16:
            header += sock.recv(16 - len(header))
        length, _request_id, response_to, opcode = struct.unpack("<iiii", header)
        assert response_to == 7
        body = b""
        while len(body) < length - 16:
            body += sock.recv(length - 16 - len(body))
        return opcode, body


def _op_query(collection: str, query: dict) -> bytes:
    body = struct.pack("<i", 0) + collection.encode() + b"\x00" + struct.pack("<ii", 0, -1) + bson.encode(query)
    return struct.pack("<iiii", 16 + len(body), 7, 0, 2004) + body


def test_legacy_op_query_handshake_is_answered_with_op_reply(standin):
    opcode, body = _raw_roundtrip(standin.port, _op_query("admin.$cmd", {"isMaster": 1, "helloOk": True}))
    flags, cursor_id, _start, returned = struct.unpack_from("<iqii", body)
    reply = bson.decode(body[20:])
    assert (opcode, flags, cursor_id, returned) == (1, 0, 0, 1)
    assert reply["ismaster"] is True and reply["helloOk"] is True and reply["maxWireVersion"] == 21
    assert "setName" not in reply and "topologyVersion" not in reply

    opcode, body = _raw_roundtrip(standin.port, _op_query("db.$cmd", {"find": "c"}))
    flags = struct.unpack_from("<i", body)[0]
    assert (opcode, flags & 2) == (1, 2)  # QueryFailure, like a 7.0 server
    assert bson.decode(body[20:])["code"] == 352


def test_op_msg_with_checksum_and_document_sequence(standin):
    payload = (
        struct.pack("<I", 1)  # checksumPresent
        + b"\x00"
        + bson.encode({"insert": "c", "$db": "raw"})
        + b"\x01"
    )
    docs = bson.encode({"_id": 1}) + bson.encode({"_id": 2})
    ident = b"documents\x00"
    payload += struct.pack("<i", 4 + len(ident) + len(docs)) + ident + docs
    message = struct.pack("<iiii", 16 + len(payload) + 4, 7, 0, 2013) + payload
    message += struct.pack("<I", zlib.crc32(message))  # any 4 bytes: the stand-in skips the checksum
    opcode, body = _raw_roundtrip(standin.port, message)
    assert opcode == 2013
    assert struct.unpack_from("<I", body)[0] == 0 and body[4] == 0
    assert bson.decode(body[5:]) == {"n": 2, "ok": 1.0}
    assert sorted(standin.client.raw.c.distinct("_id")) == [1, 2]
