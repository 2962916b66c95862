"""Full-text postings for agent-wide search: per (agent, word) a Redis sorted set of the
memories holding the word, scored by the word's BM25 impact in each, read best first with
early termination.

Why: FalkorDB's full-text procedure returns every match of each word and has no top-k of
its own for an OR of words, so an agent-wide search cost O(matches) per common word, and
re-scoring only a cut of the matches lost good hits (issue 18: at 50,000 memories five times
slower than a brute-force BM25 scan, and finding the target half as often). Here:

* **Written with the memory.** The graph backend indexes a memory's searchable words
  (``bm25.term_counts`` of its search text: stems, stopwords left out) after storing it,
  and takes them out when it is evicted, soft-deleted, changed, purged or erased. A
  memory's entry in ``docs`` names its words, so a removal needs nothing from the graph.
  Indexing is idempotent by memory id (a retried write indexes nothing twice). It is not
  one transaction with the graph's write (a FalkorDB query cannot run inside a Redis
  script): the graph's write returns the live memories it holds, and those are indexed, so
  a write retried after a crash between the two (the ingest's recovery and formation both
  retry) completes the postings too. A removal runs before the graph's delete, so a crash
  between them leaves a memory outside search, never a posting of an erased one.
* **Impact-ordered.** A posting's score is the word's BM25 weight in the memory without the
  idf: ``tf (k1 + 1) / (tf + k1 (1 - b + b len / avglen))``, with the agent's average
  length when it was indexed (``avglen`` moves little once an agent holds a few hundred
  memories; a batch is scored with the average including itself). The idf comes at query
  time from the live counts: ``ZCARD`` of the word's set and the agent's ``docs``.
* **Top k by the threshold algorithm** (Fagin's TA), in one Lua script: read each query
  word's postings best first, a chunk at a time; score each new memory fully (``ZSCORE``
  in the other words' sets); stop when the k-th best score reaches the sum over the words
  of idf x the last impact read (no unseen memory can score more). Exact BM25 top k (as
  the impacts define it) reading a few chunks of each list, whatever the lists' lengths;
  a cap on memories scored (SEARCH_POSTINGS_BUDGET) bounds a query of only very common
  words, which then returns the best found (``complete`` False).

Scope: the postings cover every namespace of an agent, so they answer agent-wide search. A
search inside some namespaces (a user's, a session's) reads its scope once instead
(memory_service/backends/graph.py, ``_scan_scope``): each memory's node carries its entry
(``terms``), and BM25 over the scope comes from those; the full-text index, whose per-word
queries cost each word's matches in the whole agent, answers only scopes larger than
SEARCH_SCOPE_SCAN_MAX.

On a cluster every key of an agent carries the agent's hash tag (one slot, one node).
The index and removal scripts build the word keys from the agent's prefix (the words are in
the memory's entry): keys of the same slot, as the scripts of a tag may use.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from memory_service.domain import bm25
from memory_service.domain.text import stem
from memory_service.state import keyspace

log = logging.getLogger(__name__)

MAX_TERMS = 32  # query words read (as the full-text path)
CHUNK = 256  # postings read per word and step, at least: the script reads max(CHUNK, k)

# KEYS: stats, docs. ARGV: k1, b, fresh (1: the graph was created by this write, the
# postings cover it), the agent's word-key prefix, then per memory: id, its entry
# ("<length> <stem> <stem>*<tf> ..."). The words' keys are built from the prefix, as the
# removal's are: each word was an argument of its own, and packing a message's fifty
# arguments cost the API more than the script costs the store.
_INDEX = """
local k1, b = tonumber(ARGV[1]), tonumber(ARGV[2])
local fresh = ARGV[3] == '1'
local prefix = ARGV[4]
local docs = {}
local added, added_len = 0, 0
for i = 5, #ARGV, 2 do
  local id, entry = ARGV[i], ARGV[i + 1]
  if redis.call('HSETNX', KEYS[2], id, entry) == 1 then
    local len, words = nil, {}
    for token in string.gmatch(entry, '%S+') do
      if not len then
        len = tonumber(token)
      else
        local term, tf = string.match(token, '^([^*]+)%*(%d+)$')
        if term then words[#words + 1] = {term, tonumber(tf)} else words[#words + 1] = {token, 1} end
      end
    end
    docs[#docs + 1] = {id, len, words}
    added, added_len = added + 1, added_len + len
  end
end
local total = redis.call('HINCRBY', KEYS[1], 'docs', added)
local total_len = redis.call('HINCRBY', KEYS[1], 'len', added_len)
local average = total > 0 and total_len / total or 1
if average <= 0 then average = 1 end
-- One ZADD per word of the batch, with every new memory holding it.
local adds = {}
for _, doc in ipairs(docs) do
  local norm = k1 * (1 - b + b * doc[2] / average)
  for _, w in ipairs(doc[3]) do
    local tf = w[2]
    local pairs_ = adds[w[1]]
    if not pairs_ then pairs_ = {}; adds[w[1]] = pairs_ end
    pairs_[#pairs_ + 1] = tf * (k1 + 1) / (tf + norm)
    pairs_[#pairs_ + 1] = doc[1]
  end
end
-- In pieces: Lua's unpack takes at most about 8,000 values (an even piece keeps the pairs).
for key, pairs_ in pairs(adds) do
  for s = 1, #pairs_, 4000 do
    redis.call('ZADD', prefix .. key, unpack(pairs_, s, math.min(s + 3999, #pairs_)))
  end
end
if fresh then redis.call('HSETNX', KEYS[1], 'built', '1') end
return added
"""

# KEYS: stats, docs. ARGV: the agent's word-key prefix, then memory ids.
_REMOVE = """
local removed, removed_len = 0, 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('HGET', KEYS[2], id)
  if entry then
    local first = true
    for word in string.gmatch(entry, '%S+') do
      if first then removed_len = removed_len + tonumber(word); first = false
      else redis.call('ZREM', ARGV[1] .. string.match(word, '^[^*]+'), id) end
    end
    redis.call('HDEL', KEYS[2], id)
    removed = removed + 1
  end
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[1], 'docs', -removed)
  redis.call('HINCRBY', KEYS[1], 'len', -removed_len)
end
return removed
"""

# KEYS: stats, then one key per query word. ARGV: k, chunk, the cap on memories scored.
# Returns {docs, complete (0/1), scored, id, score, id, score, ...} best first; {-1, 0, 0}
# when the postings do not cover the graph yet.
_TOP = """
local k, chunk, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local stats = redis.call('HMGET', KEYS[1], 'docs', 'built')
if not stats[2] then return {-1, 0, 0} end
local n = tonumber(stats[1] or '0')
local lists = {}
for i = 2, #KEYS do
  local df = redis.call('ZCARD', KEYS[i])
  if df > 0 then
    local top = redis.call('ZREVRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    local docs = math.max(n, df)
    local idf = math.log(1 + (docs - df + 0.5) / (df + 0.5))
    lists[#lists + 1] = {key = KEYS[i], idf = idf, bound = idf * tonumber(top[2])}
  end
end
-- The list that can add the most first; rest[i]: what the lists after i can add at most.
table.sort(lists, function(a, b) return a.bound > b.bound or (a.bound == b.bound and a.key < b.key) end)
local rest = {}
local after = 0
for i = #lists, 1, -1 do rest[i] = after; after = after + lists[i].bound end
local best, seen = {}, {}
local scored, complete = 0, 1
local function offer(id, score)
  if #best >= k then
    local worst = best[#best]
    if score < worst[2] or (score == worst[2] and id > worst[1]) then return end
    best[#best] = nil
  end
  local at = #best + 1
  while at > 1 and (best[at - 1][2] < score or (best[at - 1][2] == score and best[at - 1][1] > id)) do
    best[at] = best[at - 1]
    at = at - 1
  end
  best[at] = {id, score}
end
local function theta() if #best >= k then return best[k][2] end return -1 end
for i, l in ipairs(lists) do
  if l.bound + rest[i] < theta() then break end
  local pos = 0
  while true do
    if scored >= budget then complete = 0; break end
    local rows = redis.call('ZREVRANGE', l.key, pos, pos + chunk - 1, 'WITHSCORES')
    if #rows == 0 then break end
    if l.idf * tonumber(rows[2]) + rest[i] < theta() then break end
    -- A memory first read here is in no list before this one (each was read to its end, or
    -- the search would have stopped), and holds at most the best of each list after it: it
    -- is scored only if that could reach the k-th best, and looked up in those lists only.
    local ids, scores = {}, {}
    for j = 1, #rows, 2 do
      local id = rows[j]
      if not seen[id] then
        seen[id] = true
        scored = scored + 1
        local score = l.idf * tonumber(rows[j + 1])
        if score + rest[i] >= theta() then
          ids[#ids + 1] = id
          scores[#scores + 1] = score
        end
      end
    end
    if #ids > 0 then
      for o = i + 1, #lists do
        local found = redis.call('ZMSCORE', lists[o].key, unpack(ids))
        for j = 1, #ids do
          if found[j] then scores[j] = scores[j] + lists[o].idf * tonumber(found[j]) end
        end
      end
      for j = 1, #ids do offer(ids[j], scores[j]) end
    end
    pos = pos + #rows / 2
    if #rows / 2 < chunk then break end
  end
  if complete == 0 then break end
end
local out = {n, complete, scored}
for _, pair in ipairs(best) do
  out[#out + 1] = pair[1]
  out[#out + 1] = tostring(pair[2])
end
return out
"""


@dataclass(frozen=True)
class Ranked:
    """The best memories for a query by BM25 over the agent's postings."""

    hits: list[tuple[str, float]]  # (memory id, BM25) best first
    docs: int  # memories indexed
    complete: bool  # False: the cap on memories scored stopped the read early
    scored: int  # memories scored (read in a list and looked up in the others)


def entry(text: str) -> tuple[int, dict[str, int], str]:
    """A text's indexed length, stem counts and ``docs`` entry: the length, then each stem,
    with ``*<tf>`` when it occurs more than once (what a removal and a scope's BM25 read)."""
    length, counts = bm25.indexed(text)
    return length, counts, " ".join([str(length), *(t if n == 1 else f"{t}*{n}" for t, n in counts.items())])


def find_stems(lines: Sequence[str], wanted: Iterable[str]) -> dict[str, dict[int, int]]:
    """Where each of the ``wanted`` stems occurs among ``docs`` entries: by stem, the index of
    each entry holding it and how often (stems found nowhere are left out).

    A scope's BM25 reads a few stems of hundreds of entries: splitting every entry into all
    its words cost more than the ranking, and a regular expression of the stems costs its
    compilation on every query (about a fifth of the parse, 450 entries and ten stems). Each
    stem is found by ``str.find`` in the entries joined, and each find placed in its entry by
    bisection."""
    found: dict[str, dict[int, int]] = {}
    if not lines:
        return found
    text = "\n".join(lines)
    starts = list(accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    for term in wanted:
        needle = " " + term  # after a space: the first token, the length, is never a stem's match
        where: dict[int, int] = {}
        at = text.find(needle)
        while at >= 0:
            end = at + len(needle)
            follow = text[end:end + 1]
            if follow == "*":  # "<stem>*<tf>"
                stop = end + 1
                while text[stop:stop + 1].isdigit():
                    stop += 1
                if stop > end + 1 and text[stop:stop + 1] in ("", " ", "\n"):
                    where[bisect_right(starts, at) - 1] = int(text[end + 1:stop])
            elif follow in ("", " ", "\n"):
                where[bisect_right(starts, at) - 1] = 1
            at = text.find(needle, end)
        if where:
            found[term] = where
    return found


def rank_entries(lines: Sequence[str], words: Sequence[str]) -> dict[int, float]:
    """``bm25.rank`` of the texts whose ``docs`` entries are ``lines`` (the whole collection),
    by entry index: the scope's full-text signal, from the entries alone."""
    terms = list(dict.fromkeys(stem(w) for w in words))
    return bm25.rank_matches([_length(line) for line in lines], find_stems(lines, terms))


def _length(line: str) -> int:
    """An entry's first token: the text's indexed length."""
    end = line.find(" ")
    return int(line[:end] if end >= 0 else line or 0)


class Postings:
    """One agent-independent handle on the postings in a Redis server (``redis``: an asyncio
    client answering strings)."""

    def __init__(self, redis: Any):
        self.redis = redis
        self._index = redis.register_script(_INDEX)
        self._remove = redis.register_script(_REMOVE)
        self._top = redis.register_script(_TOP)

    async def built(self, agent_id: str) -> bool:
        """Whether the agent's postings cover its whole graph (else search reads the index)."""
        return bool(await self.redis.hexists(keyspace.postings_stats(agent_id), "built"))

    async def mark_built(self, agent_id: str) -> None:
        await self.redis.hset(keyspace.postings_stats(agent_id), "built", "1")

    async def index(self, agent_id: str, texts: Iterable[tuple[str, str]], fresh: bool = False) -> int:
        """Index ``(memory id, search text)`` pairs; ids indexed already are left as they are.
        ``fresh``: the graph was created by this write (so the postings cover all of it).
        Returns how many were added."""
        return await self.index_entries(agent_id, [(memory_id, entry(text)) for memory_id, text in texts], fresh)

    async def index_entries(self, agent_id: str, entries: Sequence[tuple[str, tuple[int, dict[str, int], str]]],
                            fresh: bool = False) -> int:
        """``index`` of texts whose ``entry`` the caller made already."""
        if not entries and not fresh:
            return 0
        keys = [keyspace.postings_stats(agent_id), keyspace.postings_docs(agent_id)]
        args: list[Any] = [bm25.K1, bm25.B, "1" if fresh else "0", keyspace.postings_term(agent_id, "")]
        for memory_id, (_, _, line) in entries:
            args += [memory_id, line]
        return int(await self._index(keys=keys, args=args))

    async def remove(self, agent_id: str, ids: Sequence[str]) -> int:
        """Take these memories out of the postings (unknown ids are skipped); how many were in."""
        if not ids:
            return 0
        keys = [keyspace.postings_stats(agent_id), keyspace.postings_docs(agent_id)]
        return int(await self._remove(keys=keys, args=[keyspace.postings_term(agent_id, ""), *dict.fromkeys(ids)]))

    async def reindex(self, agent_id: str, texts: Sequence[tuple[str, str]]) -> None:
        """Index these memories anew (their text may have changed)."""
        await self.remove(agent_id, [memory_id for memory_id, _ in texts])
        await self.index(agent_id, texts)

    async def top(self, agent_id: str, terms: Sequence[str], k: int, budget: int) -> Ranked | None:
        """The ``k`` memories of the agent with the highest BM25 for ``terms`` (query words,
        stemmed here), scoring at most ``budget`` memories; None when the postings do not
        cover the agent's graph yet (``build_postings`` has not finished)."""
        if k <= 0:
            return Ranked([], 0, True, 0)
        stems = list(dict.fromkeys(stem(t) for t in terms))[:MAX_TERMS]
        keys = [keyspace.postings_stats(agent_id), *(keyspace.postings_term(agent_id, s) for s in stems)]
        reply = await self._top(keys=keys, args=[k, max(CHUNK, k), budget])
        if int(reply[0]) < 0:
            return None
        pairs = reply[3:]
        hits = [(str(pairs[i]), float(pairs[i + 1])) for i in range(0, len(pairs), 2)]
        return Ranked(hits, int(reply[0]), bool(reply[1]), int(reply[2]))

    async def entries(self, agent_id: str, ids: Sequence[str]) -> dict[str, str] | None:
        """By memory id, its ``docs`` entry (``entry``: what ranking a scope by BM25 needs,
        without reading and tokenising texts). Ids not indexed are left out; None when the
        postings do not cover the agent's graph yet."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hexists(keyspace.postings_stats(agent_id), "built")
            if ids:
                pipe.hmget(keyspace.postings_docs(agent_id), list(ids))
            built, *replies = await pipe.execute()
        if not built:
            return None
        lines = replies[0] if replies else []
        return {memory_id: line for memory_id, line in zip(ids, lines, strict=True) if line}

    async def indexed_ids(self, agent_id: str) -> AsyncIterator[str]:
        """Every memory id the agent's postings hold (a scan: for maintenance)."""
        async for memory_id, _ in self.redis.hscan_iter(keyspace.postings_docs(agent_id), count=1000):
            yield memory_id

    async def clear(self, agent_id: str) -> int:
        """Delete every postings key of the agent; how many keys went."""
        deleted = 0
        async for key in self.redis.scan_iter(match=keyspace.postings_prefix(agent_id).replace("{", "\\{")
                                              .replace("}", "\\}").replace("*", "\\*").replace("?", "\\?")
                                              .replace("[", "\\[") + "*", count=1000):
            if key == keyspace.postings_build_lock(agent_id):
                continue
            deleted += int(await self.redis.delete(key))
        return deleted
