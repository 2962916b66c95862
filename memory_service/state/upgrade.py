"""The keyspace's upgrade: the keys of an older layout (version 1, the untagged keyspace of
the first releases) renamed to those of memory_service/state/keyspace.py (version 2).

Run it once with the service stopped (every API replica and worker: an old process writes
old names, and a new one does not read them), on the Redis that holds the state, before
the new release starts, and before moving that Redis's data into a cluster (RENAME needs
both names on one node): ``memory-service upgrade-keyspace`` (docs/operations.md,
"Upgrading the keyspace"). The new release's start writes ``ms:keyspace`` on an empty
store, and warns (``stale_layout``) when it finds a key that only version 1 wrote.

Idempotent, resumable: each step moves what is still under an old name (RENAME, or for
the split global keys, a merge then a DEL); a key already under its new name is merged
into, never overwritten. One SCAN of ``ms:*``, so its cost grows with the keyspace.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

from redis.asyncio import Redis

from memory_service.state import keyspace

SEP = "\x00"  # version 1's member of ms:retention:deleted: '<agent>\x00<memory id>'

# Version 1's single keys, split (per session bucket or per agent) in version 2.
V1_ACTIVE, V1_IN_FLIGHT, V1_METRICS, V1_DELETED = "ms:active", "ms:inflight", "ms:metrics", "ms:retention:deleted"
V1_MARKERS = (V1_ACTIVE, V1_IN_FLIGHT, V1_METRICS, V1_DELETED, "ms:outbox:seq")

_SESSION_PARTS = "|".join(keyspace.SESSION_PARTS + ("window", "claim"))
# Version 1's names -> the builder of version 2's, from the pattern's groups.
_RENAMES: list[tuple[re.Pattern[str], Callable[..., str]]] = [
    (re.compile(rf"^ms:s:([^:{{}}]+):({_SESSION_PARTS})$"), lambda s, part: _session(s, part)),
    (re.compile(r"^ms:s:\{([^:}]+)\}:(inflight|window)$"), lambda s, part: _session(s, part)),
    (re.compile(r"^ms:agent:([^:]+):user:([^:]+):sessions$"), keyspace.user_sessions),
    (re.compile(r"^ms:agent:([^:]+):user:([^:]+):recorded$"), keyspace.user_recorded),
    (re.compile(r"^ms:embed:([^:{]+):due$"), keyspace.embed_due),
    (re.compile(r"^ms:embed:([^:{]+):job$"), keyspace.embed_lock),
    (re.compile(r"^ms:startup:([^:{]+)$"), keyspace.startup_records),
    (re.compile(r"^ms:memaccess:([^:{]+)$"), keyspace.memory_access),
    (re.compile(r"^ms:cons:([^{].*):pending$"), keyspace.cons_pending),
    (re.compile(r"^ms:cons:([^{].*):version$"), keyspace.cons_version),
    (re.compile(r"^ms:gen:([^{].*)$"), keyspace.generation),
    (re.compile(r"^ms:outbox:(entries|refs|seq|legacy_seq)$"),
     lambda name: {"entries": keyspace.OUTBOX_ENTRIES, "refs": keyspace.OUTBOX_REFS, "seq": keyspace.OUTBOX_SEQ,
                   "legacy_seq": keyspace.OUTBOX_LEGACY_SEQ}[name]),
    (re.compile(r"^ms:outbox:(queue|attempts|errors|dead|lock):([^:{]+)$"),
     lambda kind, target: getattr(keyspace, f"outbox_{kind}")(target)),
    (re.compile(r"^ms:outbox:([^:{]+)$"), keyspace.outbox_legacy_queue),
]


def _session(session_id: str, part: str) -> str:
    if part == "window":
        return keyspace.window(session_id)
    if part == "claim":
        return keyspace.legacy_claim(session_id)
    return keyspace.session_keys(session_id)[part]


def new_name(old: str) -> str | None:
    """Version 2's name of a version-1 key that is only renamed; None for any other key."""
    for pattern, build in _RENAMES:
        if match := pattern.match(old):
            return build(*match.groups())
    return None


async def stale_layout(redis: Redis) -> bool:
    """Whether the store holds a key only version 1 wrote (a few EXISTS, no scan)."""
    return bool(await redis.exists(*V1_MARKERS))


async def mark_current(redis: Redis) -> None:
    """Record the layout's version (on a store that holds no older one)."""
    await redis.set(keyspace.KEYSPACE, keyspace.KEYSPACE_VERSION, nx=True)


async def upgrade(redis: Redis, progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Move every version-1 key to its version-2 name; counts ``renamed``, ``merged`` (a
    target already there: merged into) and ``split`` (the single keys spread out)."""
    report = {"renamed": 0, "merged": 0, "split": 0}
    seen = 0
    async for raw in redis.scan_iter(match="ms:*", count=1000):
        old = raw.decode() if isinstance(raw, bytes) else str(raw)
        seen += 1
        if progress and seen % 1000 == 0:
            progress(seen)
        target = new_name(old)
        if target is None or target == old:
            continue
        if await redis.renamenx(old, target):
            report["renamed"] += 1
        else:
            await _merge(redis, old, target)
            report["merged"] += 1
    report["split"] = await _split_globals(redis)
    await redis.set(keyspace.KEYSPACE, keyspace.KEYSPACE_VERSION)
    return report


async def _merge(redis: Redis, old: str, new: str) -> None:
    """``old`` into ``new`` (both there: an interrupted run, or a process that wrote both)."""
    kind = await redis.type(old)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "hash":
        values = cast(dict[str, str], await redis.hgetall(old))
        for field, value in values.items():
            await redis.hsetnx(new, field, value)
    elif kind == "set":
        if members := await redis.smembers(old):
            await redis.sadd(new, *members)
    elif kind == "zset":
        if rows := cast(list[tuple[str, float]], await redis.zrange(old, 0, -1, withscores=True)):
            await redis.zadd(new, dict(rows), gt=True)
    elif kind == "list":
        if items := await redis.lrange(old, 0, -1):
            await redis.rpush(new, *items)
    # A string (a counter, a lock, a digest): the one under the new name is the newer.
    await redis.delete(old)


async def _split_globals(redis: Redis) -> int:
    """ms:active and ms:inflight into their buckets' shards, ms:metrics into one shard,
    ms:retention:deleted into each agent's index; how many entries moved."""
    moved = 0
    for old, shard in ((V1_ACTIVE, keyspace.active), (V1_IN_FLIGHT, keyspace.in_flight)):
        rows = cast(list[tuple[str, float]], await redis.zrange(old, 0, -1, withscores=True))
        for member, score in rows:
            sid = member.decode() if isinstance(member, bytes) else member
            await redis.zadd(shard(keyspace.session_tag(sid)), {sid: score}, gt=True)
        moved += len(rows)
        await redis.delete(old)
    metrics = cast(dict[str, str], await redis.hgetall(V1_METRICS))
    for name, value in metrics.items():
        await redis.hincrbyfloat(keyspace.metrics(keyspace.bucket_tags()[0]), name, float(value))
    moved += len(metrics)
    await redis.delete(V1_METRICS)
    deleted = cast(list[tuple[str, float]], await redis.zrange(V1_DELETED, 0, -1, withscores=True))
    for member, score in deleted:
        text = member.decode() if isinstance(member, bytes) else member
        agent_id, _, memory_id = text.partition(SEP)
        await redis.sadd(keyspace.RETENTION_AGENTS, agent_id)
        await redis.zadd(keyspace.retention_deleted(agent_id), {memory_id: score})
    moved += len(deleted)
    await redis.delete(V1_DELETED)
    return moved
