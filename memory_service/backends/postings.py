"""Full-text postings for agent-wide search: per (agent, word) the memories holding the word,
each with the word's BM25 impact in it, every posting of the query's words scored at once.

Why: FalkorDB's full-text procedure returns every match of each word and has no top-k of
its own for an OR of words, so an agent-wide search cost O(matches) per common word, and
re-scoring only a cut of the matches lost good hits (issue 18). The first postings (sorted
sets read best first, stopping once no unread memory could reach the k-th best, with a cap
on memories scored) were exact when a query held a rare word, but a query of only common
words (issue 34: 100 everyday words) has flat impacts, so no bound stops the read early:
every list was read through Lua's look-ups (4-18 microseconds a memory), the cap cut it,
and the target was lost. Now every posting is read and scored, in bulk, and cheaply:

* **A list is a string of fixed records** (``RECORD``: the memory's number, uint32, and the
  word's impact in it, float64: 12 bytes against about 80 for a sorted-set entry), in
  number order. Each memory gets a number when indexed, higher than any before
  (``seq`` in the stats; ``nums``/``ids`` map both ways), so a batch's postings are
  APPENDed to its words' lists and every list stays sorted.
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
* **A removal zeroes** the memory's record in each of its words' lists in place (found by
  bisection, SETRANGE: no copy), and a list whose records are half zeroed is rewritten
  without them (``dead`` counts them), so removals cost O(words x log list) amortised and
  a list never holds more dead records than live ones. A changed memory is removed and
  indexed again under a new number.
* **Impacts**: ``tf (k1 + 1) / (tf + k1 (1 - b + b len / avglen))``, the word's BM25 weight
  without the idf, with the agent's average length when it was indexed (``avglen`` moves
  little once an agent holds a few hundred memories; a batch is scored with the average
  including itself). The idf comes at query time from the live counts: the list's live
  records and the agent's ``docs``.
* **Top k, exact**: one script answers the query words' lists (one round trip, never
  decoded), numpy adds each list's ``idf x impact`` into the memories' scores (a dense
  array by number, or the numbers made dense first when they are sparse) and takes the k
  best (``argpartition``); their ids come in a second round trip. The cost is the query
  words' postings, 12 bytes and a few nanoseconds each: at 100,000 memories of 100
  everyday words (a query's four lists about 60,000 postings) a few ms. A cap
  (SEARCH_POSTINGS_BUDGET, 2,000,000 postings) bounds a query of very many common words
  in a huge agent: the lists are taken rarest first, and one that would pass the cap is
  left out (``complete`` False).

Scope: the postings cover every namespace of an agent, so they answer agent-wide search. A
search inside some namespaces (a user's, a session's) reads its scope once instead
(memory_service/backends/graph.py, ``_scan_scope``): each memory's node carries its entry
(``terms``), and BM25 over the scope comes from those; the full-text index, whose per-word
queries cost each word's matches in the whole agent, answers only scopes larger than
SEARCH_SCOPE_SCAN_MAX.

On a cluster every key of an agent carries the agent's hash tag (one slot, one node).
The removal script builds its word keys from the agent's prefix (the words are stored in
the memory's entry): keys of the same slot, as the scripts of a tag may use.
"""

from __future__ import annotations

import hashlib
import logging
from bisect import bisect_right
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, cast

import numpy as np
from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError

from memory_service.domain import bm25
from memory_service.domain.text import stem
from memory_service.state import keyspace

log = logging.getLogger(__name__)

MAX_TERMS = 32  # query words read (as the full-text path)
LAYOUT = "2"  # the stats' ``built``: postings of this layout cover the agent's graph (1: sorted sets, rebuilt)
# A posting: the memory's number (uint32, little-endian) and the word's impact in it (float64).
RECORD = np.dtype([("num", "<u4"), ("impact", "<f8")])
_SIZE = RECORD.itemsize  # 12: the scripts' struct format '<Id'

# KEYS: stats, docs, nums, ids, then one key per distinct word of the batch.
# ARGV: k1, b, fresh (1: the graph was created by this write, the postings cover it), then per
# memory: id, length, its entry ("<length> <stem> ..."), the number of words, then per word
# (index into KEYS, tf).
_INDEX = """
local k1, b = tonumber(ARGV[1]), tonumber(ARGV[2])
local fresh = ARGV[3] == '1'
local docs = {}
local i = 4
local added, added_len = 0, 0
while i <= #ARGV do
  local id, len, entry, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  local words = {}
  for j = 0, n - 1 do
    words[#words + 1] = {tonumber(ARGV[i + 4 + 2 * j]), tonumber(ARGV[i + 5 + 2 * j])}
  end
  i = i + 4 + 2 * n
  if redis.call('HSETNX', KEYS[2], id, entry) == 1 then
    docs[#docs + 1] = {id, len, words}
    added, added_len = added + 1, added_len + len
  end
end
local total = redis.call('HINCRBY', KEYS[1], 'docs', added)
local total_len = redis.call('HINCRBY', KEYS[1], 'len', added_len)
local average = total > 0 and total_len / total or 1
if average <= 0 then average = 1 end
-- Each new memory a number, higher than any before: every word's list stays in number order.
local first = redis.call('HINCRBY', KEYS[1], 'seq', #docs) - #docs
local records, nums, ids = {}, {}, {}
for d, doc in ipairs(docs) do
  local num = first + d
  nums[#nums + 1] = doc[1]; nums[#nums + 1] = num
  ids[#ids + 1] = num; ids[#ids + 1] = doc[1]
  local norm = k1 * (1 - b + b * doc[2] / average)
  for _, w in ipairs(doc[3]) do
    local tf = w[2]
    local list = records[w[1]]
    if not list then list = {}; records[w[1]] = list end
    list[#list + 1] = struct.pack('<Id', num, tf * (k1 + 1) / (tf + norm))
  end
end
for key, list in pairs(records) do redis.call('APPEND', KEYS[key], table.concat(list)) end
-- In pieces: Lua's unpack takes at most about 8,000 values (an even piece keeps the pairs).
for s = 1, #nums, 4000 do
  redis.call('HSET', KEYS[3], unpack(nums, s, math.min(s + 3999, #nums)))
  redis.call('HSET', KEYS[4], unpack(ids, s, math.min(s + 3999, #ids)))
end
if fresh then redis.call('HSET', KEYS[1], 'built', '""" + LAYOUT + """') end
return added
"""

# KEYS: stats, docs, nums, ids, dead. ARGV: the agent's word-key prefix, then memory ids.
# A memory's posting in each of its words' lists is found by bisection (the lists are in number
# order) and its impact set to 0 in place (SETRANGE); a list whose records are half dead is
# rewritten without them, and deleted when none is left.
_REMOVE = """
local zero = struct.pack('<d', 0)
local removed, removed_len = 0, 0
local function compact(key, term)
  local blob = redis.call('GET', key)
  local kept = {}
  for p = 1, #blob, 12 do
    if string.sub(blob, p + 4, p + 11) ~= zero then kept[#kept + 1] = string.sub(blob, p, p + 11) end
  end
  if #kept == 0 then redis.call('DEL', key) else redis.call('SET', key, table.concat(kept)) end
  redis.call('HDEL', KEYS[5], term)
end
for i = 2, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('HGET', KEYS[2], id)
  if entry then
    local num = tonumber(redis.call('HGET', KEYS[3], id))
    local first = true
    for word in string.gmatch(entry, '%S+') do
      if first then removed_len = removed_len + tonumber(word); first = false
      elseif num then
        local term = string.match(word, '^[^*]+')
        local key = ARGV[1] .. term
        local size = redis.call('STRLEN', key) / 12
        local lo, hi = 0, size - 1
        while lo <= hi do
          local mid = math.floor((lo + hi) / 2)
          local at = struct.unpack('<I', redis.call('GETRANGE', key, mid * 12, mid * 12 + 3))
          if at == num then
            redis.call('SETRANGE', key, mid * 12 + 4, zero)
            if redis.call('HINCRBY', KEYS[5], term, 1) * 2 >= size then compact(key, term) end
            break
          elseif at < num then lo = mid + 1 else hi = mid - 1 end
        end
      end
    end
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    if num then redis.call('HDEL', KEYS[4], num) end
    removed = removed + 1
  end
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[1], 'docs', -removed)
  redis.call('HINCRBY', KEYS[1], 'len', -removed_len)
end
return removed
"""

# KEYS: stats, then one key per query word. ARGV: the most postings to read.
# Returns {docs, complete (0/1), then per word its list (empty when missing or left out)};
# {-1} when the postings do not cover the graph yet. The lists are taken shortest first (the
# rarest words weigh most); one that would pass the cap is left out (complete 0).
_READ = """
local stats = redis.call('HMGET', KEYS[1], 'docs', 'built')
if stats[2] ~= '""" + LAYOUT + """' then return {-1} end
local budget = tonumber(ARGV[1])
local sizes = {}
for i = 2, #KEYS do sizes[#sizes + 1] = {i, redis.call('STRLEN', KEYS[i])} end
table.sort(sizes, function(a, b) return a[2] < b[2] or (a[2] == b[2] and a[1] < b[1]) end)
local lists, read, complete = {}, 0, 1
for _, s in ipairs(sizes) do
  if s[2] > 0 then
    if read + s[2] / 12 > budget then complete = 0
    else read = read + s[2] / 12; lists[s[1]] = redis.call('GET', KEYS[s[1]]) end
  end
end
local out = {tonumber(stats[1] or '0'), complete}
for i = 2, #KEYS do out[#out + 1] = lists[i] or '' end
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


def best(docs: int, lists: Sequence[bytes], k: int) -> tuple[list[tuple[int, float]], int]:
    """The ``k`` best memory numbers by BM25 over these words' ``lists`` (the agent holding
    ``docs`` memories), best first, and how many postings were read.

    Every posting of every list is scored (a vectorised sum): exact whatever the words'
    frequencies. Each list holds a memory at most once, so a list's scores are added with one
    indexed sum; a memory's number indexes a dense array when the numbers are not sparse
    (the agent's memories were not mostly removed), else the numbers are first made dense."""
    nums, weights = [], []
    read = 0
    for blob in lists:
        if not blob:
            continue
        records = np.frombuffer(blob, dtype=RECORD)
        read += len(records)
        live = records[records["impact"] > 0]  # a removed memory's postings are zeroed
        if len(live):
            df = len(live)
            nums.append(live["num"])
            weights.append(bm25.idf(max(docs, df), df) * live["impact"])
    if not nums:
        return [], read
    top = max(int(n[-1]) for n in nums)  # each list is in number order
    total = sum(len(n) for n in nums)
    if top < 4 * total + 65_536:
        scores = np.zeros(top + 1)
        for n, w in zip(nums, weights, strict=True):
            scores[n] += w
        held = np.flatnonzero(scores) if len(nums) > 1 else nums[0].astype(np.int64)
        values = scores[held]
    else:
        held, inverse = np.unique(np.concatenate(nums), return_inverse=True)
        values = np.bincount(inverse, weights=np.concatenate(weights))
    if k < len(held):
        cut = np.argpartition(-values, k - 1)[:k]
        held, values = held[cut], values[cut]
    order = np.lexsort((held, -values))
    return [(int(held[i]), float(values[i])) for i in order], read


class Postings:
    """One agent-independent handle on the postings in a Redis server (``redis``: an asyncio
    client answering strings)."""

    def __init__(self, redis: Any):
        self.redis = redis
        self._index = redis.register_script(_INDEX)
        self._remove = redis.register_script(_REMOVE)
        # The read answers bytes (the lists), so it is sent as EVALSHA that is never decoded.
        self._read_sha = hashlib.sha1(_READ.encode()).hexdigest()

    async def built(self, agent_id: str) -> bool:
        """Whether the agent's postings, of this layout, cover its whole graph (else search
        reads the index)."""
        return bool(await self.redis.hget(keyspace.postings_stats(agent_id), "built") == LAYOUT)

    async def mark_built(self, agent_id: str) -> None:
        await self.redis.hset(keyspace.postings_stats(agent_id), "built", LAYOUT)

    async def index(self, agent_id: str, texts: Iterable[tuple[str, str]], fresh: bool = False) -> int:
        """Index ``(memory id, search text)`` pairs; ids indexed already are left as they are.
        ``fresh``: the graph was created by this write (so the postings cover all of it).
        Returns how many were added."""
        return await self.index_entries(agent_id, [(memory_id, entry(text)) for memory_id, text in texts], fresh)

    async def index_entries(self, agent_id: str, entries: Sequence[tuple[str, tuple[int, dict[str, int], str]]],
                            fresh: bool = False) -> int:
        """``index`` of texts whose ``entry`` the caller made already."""
        keys = [keyspace.postings_stats(agent_id), keyspace.postings_docs(agent_id),
                keyspace.postings_nums(agent_id), keyspace.postings_ids(agent_id)]
        slots: dict[str, int] = {}
        args: list[Any] = [bm25.K1, bm25.B, "1" if fresh else "0"]
        for memory_id, (length, counts, line) in entries:
            args += [memory_id, length, line, len(counts)]
            for term, tf in counts.items():
                if term not in slots:
                    keys.append(keyspace.postings_term(agent_id, term))
                    slots[term] = len(keys)  # Lua's 1-based index into KEYS
                args += [slots[term], tf]
        if len(args) == 3 and not fresh:
            return 0
        return int(await self._index(keys=keys, args=args))

    async def remove(self, agent_id: str, ids: Sequence[str]) -> int:
        """Take these memories out of the postings (unknown ids are skipped); how many were in."""
        if not ids:
            return 0
        keys = [keyspace.postings_stats(agent_id), keyspace.postings_docs(agent_id),
                keyspace.postings_nums(agent_id), keyspace.postings_ids(agent_id), keyspace.postings_dead(agent_id)]
        return int(await self._remove(keys=keys, args=[keyspace.postings_term(agent_id, ""), *dict.fromkeys(ids)]))

    async def reindex(self, agent_id: str, texts: Sequence[tuple[str, str]]) -> None:
        """Index these memories anew (their text may have changed)."""
        await self.remove(agent_id, [memory_id for memory_id, _ in texts])
        await self.index(agent_id, texts)

    async def _read(self, keys: list[str], args: list[Any]) -> list[Any]:
        """The read script's answer, its lists as bytes (loaded first if the server lacks it)."""
        command = ("EVALSHA", self._read_sha, len(keys), *keys, *args)
        try:
            return cast(list[Any], await self.redis.execute_command(*command, **{NEVER_DECODE: True}))
        except NoScriptError:
            await self.redis.script_load(_READ)
            return cast(list[Any], await self.redis.execute_command(*command, **{NEVER_DECODE: True}))

    async def top(self, agent_id: str, terms: Sequence[str], k: int, budget: int) -> Ranked | None:
        """The ``k`` memories of the agent with the highest BM25 for ``terms`` (query words,
        stemmed here), reading at most ``budget`` postings (the rarest words' first); None
        when the postings do not cover the agent's graph yet (``build_postings`` has not
        finished). Ties in score: the memory indexed first first."""
        if k <= 0:
            return Ranked([], 0, True, 0)
        stems = list(dict.fromkeys(stem(t) for t in terms))[:MAX_TERMS]
        keys = [keyspace.postings_stats(agent_id), *(keyspace.postings_term(agent_id, s) for s in stems)]
        reply = await self._read(keys, [budget])
        docs = int(reply[0])
        if docs < 0:
            return None
        ranked, read = best(docs, [bytes(blob) for blob in reply[2:]], k)
        if not ranked:
            return Ranked([], docs, bool(reply[1]), read)
        ids = await self.redis.hmget(keyspace.postings_ids(agent_id), [num for num, _ in ranked])
        hits = [(str(memory_id), score) for memory_id, (_, score) in zip(ids, ranked, strict=True) if memory_id]
        return Ranked(hits, docs, bool(reply[1]), read)

    async def entries(self, agent_id: str, ids: Sequence[str]) -> dict[str, str] | None:
        """By memory id, its ``docs`` entry (``entry``: what ranking a scope by BM25 needs,
        without reading and tokenising texts). Ids not indexed are left out; None when the
        postings do not cover the agent's graph yet."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keyspace.postings_stats(agent_id), "built")
            if ids:
                pipe.hmget(keyspace.postings_docs(agent_id), list(ids))
            built, *replies = await pipe.execute()
        if built != LAYOUT:
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
