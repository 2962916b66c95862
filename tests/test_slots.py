"""Every Lua script and MULTI/EXEC transaction of the service names keys of one slot.

On a Redis Cluster a script or a transaction whose keys hash to two slots fails
(CROSSSLOT); memory_service/state/keyspace.py gives what one step touches together one hash
tag. This test watches the real client while the service records, forms, consolidates,
sweeps, recovers, searches agent-wide, erases, serves startup records, authenticates keys, counts retention and
drives the outbox: each script call's keys and each transaction's keys (as the server names
them, COMMAND GETKEYS) must share a slot, every script the service registered must have
run, and every function that opens a transaction must have opened one. It runs on the
embedded server (no cluster needed: the slots are computed) and in ``make test-cluster``.
"""

from __future__ import annotations

import ast
import asyncio
import traceback
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from memory_service._vendor.arq.constants import in_progress_key_prefix
from memory_service.backends.outbox import Outbox, WriteOp
from memory_service.domain.models import Memory, MemoryKind, Provenance, Role, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.runtime import open_service
from memory_service.schemas.keys import KeyIn
from memory_service.schemas.startup import StartupMode, StartupRecordIn
from memory_service.state import keyspace

from .conftest import cluster_url
from .helpers import msg

ROOT = Path(__file__).resolve().parent.parent / "memory_service"


def slots(keys) -> set[int]:
    return {key_slot(k.encode() if isinstance(k, str) else k) for k in keys}


class SlotWatch:
    """Records every script call and transaction of the real client while installed."""

    def __init__(self, url: str):
        self.server = redis.Redis.from_url(url)  # names a command's keys: COMMAND GETKEYS
        self.registered: set[bytes] = set()
        self.by_sha: dict[str, bytes] = {}  # a registered script's SHA1 -> its source
        self.ran: set[bytes] = set()
        self.transactions: set[tuple[str, str]] = set()  # (module, function) that opened one
        self.crossing: list[str] = []

    def install(self, monkeypatch) -> None:
        watch = self
        script_init, script_call = AsyncScript.__init__, AsyncScript.__call__
        transaction, pipeline = Pipeline._execute_transaction, Pipeline._execute_pipeline

        def init(self, registered_client, script):
            script_init(self, registered_client, script)
            source = self.script if isinstance(self.script, bytes) else self.script.encode()
            watch.registered.add(source)
            watch.by_sha[self.sha] = source

        def ran(source: bytes, keys) -> None:
            watch.ran.add(source)
            if len(slots(keys or [])) > 1:
                watch.crossing.append(f"script {source[:60]!r}... keys {keys}")

        async def call(self, keys=None, args=None, client=None):
            ran(self.script if isinstance(self.script, bytes) else self.script.encode(), keys)
            return await script_call(self, keys, args, client)

        async def in_pipeline(self, connection, commands, raise_on_error):
            # A script sent by EVALSHA in a pipeline (memory_service/state/store.py, ``_with_scripts``).
            for args, _ in commands:
                if str(args[0]).upper() == "EVALSHA" and args[1] in watch.by_sha:
                    ran(watch.by_sha[args[1]], list(args[3 : 3 + int(args[2])]))
            return await pipeline(self, connection, commands, raise_on_error)

        async def execute(self, connection, commands, raise_on_error):
            keys = [k for args, _ in commands for k in watch.keys_of(args)]
            if keys and not any((k.decode() if isinstance(k, bytes) else k).startswith("ms:") for k in keys):
                # The job queue's (arq's own transactions): on QUEUE_REDIS_URL, a plain Redis.
                return await transaction(self, connection, commands, raise_on_error)
            caller = next(((Path(f.filename).stem, f.name) for f in reversed(traceback.extract_stack())
                           if f.filename.startswith(str(ROOT))), ("?", "?"))
            watch.transactions.add(caller)
            if len(slots(keys)) > 1:
                watch.crossing.append(f"transaction in {caller}: keys {keys}")
            return await transaction(self, connection, commands, raise_on_error)

        monkeypatch.setattr(AsyncScript, "__init__", init)
        monkeypatch.setattr(AsyncScript, "__call__", call)
        monkeypatch.setattr(Pipeline, "_execute_transaction", execute)
        monkeypatch.setattr(Pipeline, "_execute_pipeline", in_pipeline)

    def keys_of(self, args) -> list[bytes]:
        try:
            return list(self.server.command_getkeys(*args))
        except redis.ResponseError:  # a command without keys
            return []


def transaction_sites() -> set[tuple[str, str]]:
    """(module, function) of every ``pipeline(transaction=True)`` in the service's code."""
    sites = set()
    for path in ROOT.rglob("*.py"):
        if "_vendor" in path.parts:  # arq's own: the job queue is on a plain Redis (QUEUE_REDIS_URL)
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "pipeline"
                            and any(k.arg == "transaction" and isinstance(k.value, ast.Constant) and k.value.value
                                    for k in node.keywords)):
                        sites.add((path.stem, fn.name))
    return sites


async def until(check, what: str, timeout: float = 60) -> None:
    for _ in range(int(timeout / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_every_script_and_transaction_names_one_slot(settings, monkeypatch):
    watch = SlotWatch(settings.job_queue_url() if settings.redis_url else settings.falkordb_url)
    watch.install(monkeypatch)
    config = settings.model_copy(update={"consolidate_directives_after": 2, "memory_formation_msg_interval": 100,
                                         "consider_cold_after_minutes": 0, "purge_after_days": 1})
    async with open_service(config, run_worker=True) as service:
        state, user_ns = service.state, str(Namespace.user("a1", "alice"))
        # Recording and forming (reserve, commit; claim, advance, complete, finish), then
        # the consolidation of the directives (and the embedding job's release).
        for i, text in enumerate(["I prefer aisle seats.", "I prefer window tables.", "hello", "thanks"]):
            await service.record_message("s1", msg("a1", "alice", text, mid=f"m{i}", minute=i))
        await service.form_memories("s1")

        async def consolidated() -> bool:
            return await state.consolidation_version(user_ns) >= 1

        await until(consolidated, "the directives consolidated")
        # The sweep, a release and the in-flight recovery's settling.
        await service.record_message("s2", msg("a1", "bob", "just one", mid="x1"))
        await service.sweep_cold_sessions()
        reservation = await state.reserve_message("s2", "a1", "x2", "digest")
        await state.release_message("s2", "x2", reservation.sequence, "refused")
        await state.settle_in_flight("s2")
        # The recovery of held windows, and the release of a job whose worker's lease ended
        # (on the job queue's Redis).
        await service.recover_windows()
        await service.queue.pool.set(in_progress_key_prefix + "orphan", "worker-gone")
        assert await service.queue.leases.release(["orphan"]) == ["orphan"]
        await state.counters("s2")
        # An embedding claim let go of unwritten (the job's written ones expire instead).
        claim = await state.embed_claims.claim("a1", ["unwritten1", "unwritten2"])
        assert await state.embed_claims.release(claim) == 2
        await state.migrated("a1", "graph")
        await state.put_shard("a1", "sh1", ShardIn(name="travel"))
        # Startup records, retention's indexes, keys and rate limits.
        await service.startup.put("a1", "soul", StartupRecordIn(priority="P0", title="Identity", content="I am Atlas."))
        await service.startup.block("a1", session_id="s1", mode=StartupMode.FIRST_RUN)
        await service.retention_index.mark_deleted("a1", "mem1", datetime.now(UTC))
        await service.retention_index.count_access("a1", "mem1", datetime.now(UTC))
        await service.retention_index.forget("a1", ["mem1"])
        key = await service.keys.create(KeyIn(name="t", role="write", agents=["a1"], tokens_per_minute=100), "test")
        principal = await service.keys.authenticate(key.key)
        assert not isinstance(principal, str), principal
        await service.keys.charge_tokens(principal, 10)
        # The outbox: append, a failure to a dead letter, replay, delivery, adoption, rewrite, lease.
        outbox = Outbox(state.redis, ["graph", "mongo"], max_attempts=1)
        memory = Memory(id="o1", kind=MemoryKind.MESSAGE, namespace="session:s9", content="text",
                        metadata=Provenance(agent_id="a1", session_id="s9"), valid_at=datetime.now(UTC))
        entry = await outbox.append(WriteOp(memories=[memory]))
        await outbox.failed("mongo", entry, "refused")
        await outbox.replay("mongo", [entry])
        await outbox.delivered("graph", entry)
        await outbox.rewrite(lambda op: op)
        await state.redis.rpush(keyspace.outbox_legacy_queue("mongo"), "old1")
        await outbox.pending("mongo", 10)
        token = await outbox.lease("mongo", 5)
        assert token is not None
        await outbox.release("mongo", token)
        await outbox.drop("mongo", [entry])
        # Change events and a webhook that is down: a dead letter, its replay, the webhook deleted.
        from memory_service.backends.loopback import free_port
        from memory_service.events.delivery import Delivery
        from memory_service.events.log import Changed
        from memory_service.schemas.events import EventType, WebhookIn

        service.webhooks.allow_private = True
        await service.webhooks.put("a1", "h1", WebhookIn(url=f"http://127.0.0.1:{free_port()}/", secret="x" * 16))
        await service.events.emit("a1", EventType.WRITTEN, [Changed("user:a1:alice", "fact", ("m1",))])
        down = Delivery(service.settings.model_copy(update={"webhook_allow_private": True, "webhook_max_attempts": 1,
                                                            "webhook_timeout_seconds": 1}),
                        state.redis, service.events, service.webhooks)
        await down.run()

        async def dead_letters() -> list:  # dead-lettered by this run, or by the worker's cron run beside it
            return (await service.webhooks.dead_letters("a1", "h1")).dead_letters

        await until(dead_letters, "the event dead-lettered")
        (letter,) = await dead_letters()
        await service.webhooks.replay("a1", "h1", letter.event.id)
        await down.run()
        await service.webhooks.delete("a1", "h1")
        # An agent's rate limits across its keys (memory_service/access/agent_limits.py).
        from memory_service.access.agent_limits import AgentLimits

        limits = AgentLimits(state.redis, requests_per_minute=10, tokens_per_minute=1000)
        await limits.charge_request("a1")
        await limits.charge_tokens("a1", 5)
        # A forget (its record, the window's re-formation record and entry) and a re-formation.
        from memory_service.formation.steps import message_memory_id
        from memory_service.schemas.lifecycle import ForgetMode, ReformIn

        await service.memory_forget("a1", message_memory_id("s1", "m2"), ForgetMode.HARD)
        await service.reform("a1", ReformIn(session_id="s1"))
        # An erasure: a session shared with another user, and one of hers alone; the cache purge.
        await service.record_message("s1", msg("a1", "carol", "hi", mid="c1", role=Role.USER))
        await service.record_message("s3", msg("a1", "alice", "mine", mid="a3"))
        await service.assemble_memory_context("a1", "alice", "s1")
        # Agent-wide search: the postings' top k.
        assert (await service.search("a1", "aisle seats", scope="agent")).results
        await service.erase_user("a1", "alice")

    assert not watch.crossing, "keys of several slots in one step:\n" + "\n".join(watch.crossing)
    never = [s[:70] for s in watch.registered - watch.ran]
    assert not never, f"scripts the scenario never ran (add a step that does): {never}"
    if cluster_url() is None:  # on a cluster, the cluster client runs them (and refuses CROSSSLOT itself)
        missing = transaction_sites() - watch.transactions
        assert not missing, f"transactions the scenario never opened (add a step that does): {sorted(missing)}"


def test_the_watch_finds_keys_of_two_slots():
    """The check can fail: the first keyspace's keys of one record were on many slots."""
    first_release = ["ms:s:s1:meta", "ms:s:s1:ids", "ms:agent:a1:sessions", "ms:agent:a1", "ms:inflight"]
    assert len(slots(first_release)) > 1
    now = [keyspace.session_keys("s1")["meta"], keyspace.session_keys("s1")["inflight"],
           keyspace.in_flight(keyspace.session_tag("s1")), keyspace.generation("session:s1"), keyspace.window("s1")]
    assert len(slots(now)) == 1
    # Ids holding '}' only ever add keys to a slot, never split a tag.
    odd = "a}b"
    assert len(slots([keyspace.embed_due(odd), keyspace.embed_lock(odd)])) == 1
    assert len(slots([keyspace.retention_deleted("}x"), keyspace.memory_access("}x")])) == 1


@pytest.mark.parametrize("bucket", [0, 1, keyspace.SESSION_BUCKETS - 1])
def test_the_buckets_spread_over_the_slots(bucket):
    """Session buckets are distinct slots (each a tag), so a cluster spreads them over nodes."""
    tags = keyspace.bucket_tags()
    assert len(slots(keyspace.active(t) for t in tags)) == len(tags)
    assert slots([keyspace.active(tags[bucket]), keyspace.metrics(tags[bucket])]) == slots([keyspace.active(tags[bucket])])


def test_sessions_fill_the_buckets_evenly():
    counts: dict[str, int] = defaultdict(int)
    for i in range(100_000):
        counts[keyspace.session_tag(f"session-{i}")] += 1
    assert len(counts) == keyspace.SESSION_BUCKETS
    assert max(counts.values()) < 1.3 * 100_000 / keyspace.SESSION_BUCKETS
