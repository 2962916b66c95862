"""What an erasure removes from Redis: the user's messages in the session ledger, the
sessions left empty, consolidation queues, job results and the user's own keys
(docs/erasure.md; the cached memory blocks: memory_service/state/cache.py).
memory_service.curation.erasure decides what to remove; this module knows where Redis keeps
it (the keys: memory_service/state/keyspace.py).

Every step is idempotent: a second erasure, or a retry after a crash, removes nothing more.
Nothing here scans the keyspace: every key is named from the user's session index, the
session's counters or the user's consolidation version.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from memory_service._vendor.arq.constants import job_key_prefix, result_key_prefix, retry_key_prefix
from memory_service._vendor.arq.jobs import deserialize_result
from memory_service.formation.jobs import QUEUE_NAME, JobQueue, consolidation_job_id, formation_job_id
from memory_service.state import keyspace
from memory_service.state.cache import generation_key
from memory_service.state.store import StateStore

# Take a user's messages out of a session's ledger, in one step. KEYS: meta, ids, pending,
# tokens, committed, users, window, the bucket's active set, participants (all under the
# session's tag); ARGV: user id, session id, then the message ids. The user leaves the
# session's speakers and participants. Their pending tokens leave the counters; the window
# is dropped if it holds any of them (its claim and stored extraction name them; the other
# messages stay pending and the next gate claims them again). Returns {message entries removed, window dropped}.
_REMOVE_MESSAGES = """
local removed, tokens, mine = 0, 0, {}
for i = 3, #ARGV do
  local id = ARGV[i]
  mine[id] = true
  removed = removed + redis.call('HDEL', KEYS[2], id)
  if redis.call('ZREM', KEYS[3], id) == 1 then
    tokens = tokens + tonumber(redis.call('HGET', KEYS[4], id) or '0')
  end
  redis.call('HDEL', KEYS[4], id)
  redis.call('SREM', KEYS[5], id)
end
if tokens > 0 then redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', -tokens) end
redis.call('SREM', KEYS[6], ARGV[1])
redis.call('SREM', KEYS[9], ARGV[1])
local dropped = 0
local ids = redis.call('HGET', KEYS[7], 'ids')
if ids then
  for _, row in ipairs(cjson.decode(ids)) do
    if mine[row[1]] then dropped = 1 end
  end
  if dropped == 1 then redis.call('DEL', KEYS[7]) end
end
if redis.call('ZCARD', KEYS[3]) == 0 then redis.call('ZREM', KEYS[8], ARGV[2]) end
return {removed, dropped}
"""

# Steps of this many keys or list entries per round trip.
BATCH = 500


@dataclass(slots=True)
class SessionCleanup:
    ledger_entries: int = 0  # message ids taken out of the session's ledger
    window_dropped: bool = False
    job_results: int = 0


class ErasureState:
    def __init__(self, state: StateStore, queue: JobQueue):
        self.state, self.queue = state, queue
        self.redis = state.redis
        self._remove_messages = self.redis.register_script(_REMOVE_MESSAGES)

    async def user_sessions(self, agent_id: str, user_id: str) -> list[str]:
        """Every session of the agent the user took part in: with a message recorded under
        the user's id (the index written by each record, and the "spoke in" index: sessions
        recorded before the first existed), or among its participants without one (a
        reservation released, or still in flight: the index each reservation writes first,
        which also names sessions the user was refused, left out here)."""
        recorded = {str(m) for m in await self.redis.sunion([keyspace.user_recorded(agent_id, user_id),
                                                             keyspace.user_sessions(agent_id, user_id)])}
        named = sorted({str(m) for m in await self.redis.smembers(keyspace.user_joined(agent_id, user_id))} - recorded)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in named:
                pipe.sismember(keyspace.session_keys(session_id)["participants"], user_id)
            joined = await pipe.execute() if named else []
        return sorted(recorded | {s for s, member in zip(named, joined, strict=True) if member})

    async def remove_messages(self, session_id: str, user_id: str, message_ids: Sequence[str]) -> SessionCleanup:
        """Take the user's messages out of a session other users spoke in, too."""
        k = keyspace.session_keys(session_id)
        removed, dropped = 0, 0
        ids = list(message_ids) or [""]  # with none, the user still leaves the session's speakers
        for start in range(0, len(ids), BATCH):
            r, d = await self._remove_messages(
                keys=[k["meta"], k["ids"], k["pending"], k["tokens"], k["committed"], k["users"],
                      keyspace.window(session_id), keyspace.active(keyspace.session_tag(session_id)),
                      k["participants"]],
                args=[user_id, session_id, *ids[start : start + BATCH]])
            removed, dropped = removed + int(r), max(dropped, int(d))
        await self.state.cache.bump(f"session:{session_id}")
        cleanup = SessionCleanup(ledger_entries=removed, window_dropped=bool(dropped))
        cleanup.job_results = await self._forget_formation_results(session_id, set(message_ids))
        return cleanup

    async def drop_session(self, agent_id: str, session_id: str) -> SessionCleanup:
        """Remove a session that held nothing but the user's messages: its ledger, window,
        job results and place in the agent's and the sweep's sets."""
        k = keyspace.session_keys(session_id)
        entries = int(await self.redis.hlen(k["ids"]))
        results = await self._forget_formation_results(session_id, None)
        tag = keyspace.session_tag(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:  # all under the session's tag
            pipe.delete(*k.values(), keyspace.window(session_id), keyspace.legacy_claim(session_id),
                        generation_key(f"session:{session_id}"))
            pipe.zrem(keyspace.active(tag), session_id)
            pipe.zrem(keyspace.in_flight(tag), session_id)
            pipe.zrem(keyspace.windows(tag), session_id)
            await pipe.execute()
        # After (the agent's keys have the agent's tag): a crash between leaves the agent's set
        # and its session order naming an empty session (harmless).
        await self.redis.srem(keyspace.agent_sessions(agent_id), session_id)
        await self.redis.zrem(keyspace.agent_session_order(agent_id), session_id)
        return SessionCleanup(ledger_entries=entries, window_dropped=True, job_results=results)

    async def _forget_formation_results(self, session_id: str, message_ids: Collection[str] | None) -> int:
        """Delete the kept results of the session's formation jobs that list any of
        ``message_ids`` (None: all of them). Cost: the session's windows, read in batches."""
        windows = int(await self.redis.hget(keyspace.session_keys(session_id)["meta"], "claimed_windows") or 0)
        pool, forgotten = self.queue.pool, 0
        for start in range(1, windows + 1, BATCH):
            job_ids = [formation_job_id(session_id, w) for w in range(start, min(start + BATCH, windows + 1))]
            raws = await pool.mget([result_key_prefix + j for j in job_ids])
            doomed = [j for j, raw in zip(job_ids, raws) if raw is not None and _lists_any(raw, message_ids)]
            if doomed:
                forgotten += int(await pool.delete(*(result_key_prefix + j for j in doomed)))
        return forgotten

    async def forget_consolidation_items(self, namespace: str, memory_ids: Collection[str]) -> int:
        """Take removed memories off the namespace's consolidation queue; how many were on it."""
        if not memory_ids:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for memory_id in memory_ids:
                pipe.lrem(keyspace.cons_pending(namespace), 0, memory_id)
            removed = await pipe.execute()
        return sum(int(n) for n in removed)

    async def drop_user(self, agent_id: str, user_id: str) -> int:
        """The user's own keys: session indexes, consolidation queue and version, write
        generation, and the consolidation jobs of their namespace (queued ones are taken
        off the queue; a running one finds nothing left to merge). How many keys went."""
        namespace = f"user:{agent_id}:{user_id}"
        version = int(await self.redis.get(keyspace.cons_version(namespace)) or 0)
        job_ids = [consolidation_job_id(namespace, v) for v in range(version + 1)]
        pool = self.queue.pool
        jobs = 0
        for start in range(0, len(job_ids), BATCH):
            batch = job_ids[start : start + BATCH]
            await pool.zrem(QUEUE_NAME, *batch)
            jobs += int(await pool.delete(*(p + j for j in batch for p in (job_key_prefix, result_key_prefix,
                                                                            retry_key_prefix))))
        await self.redis.zrem(keyspace.agent_users(agent_id), user_id)  # the browse index of users
        keys = int(await self.redis.delete(
            keyspace.user_recorded(agent_id, user_id), keyspace.user_sessions(agent_id, user_id),
            keyspace.user_joined(agent_id, user_id), keyspace.cons_pending(namespace), keyspace.cons_version(namespace), generation_key(namespace)))
        return keys + jobs


def _lists_any(raw: bytes | str, message_ids: Collection[str] | None) -> bool:
    if message_ids is None:
        return True
    try:
        result = deserialize_result(raw if isinstance(raw, bytes) else raw.encode()).result
    except Exception:  # not a result this service wrote: leave it to expire
        return False
    listed = result.get("message_ids", []) if isinstance(result, dict) else []
    return any(m in message_ids for m in listed)
