"""Every Redis key of the service, in one place: the map of what the service keeps in Redis.

Every ``ms:*`` key is built here and nowhere else (tests/test_keyspace.py fails on an
``ms:`` literal in any other module), so this docstring is the whole keyspace. Ids never
contain ':' (memory_service/domain/namespaces.py), so no two keys below can collide. The
names are stored data: a builder's output changes only with a migration of the keyspace
(``KEYSPACE_VERSION``; memory_service/state/upgrade.py renames what an older release wrote,
``memory-service upgrade-keyspace``, docs/operations.md "Upgrading the keyspace").

Hash tags, for a Redis Cluster (docs/operations.md, "Scaling"): ``{...}`` in a key is its
hash tag, and the keys sharing one are on one slot, so a Lua script or a MULTI/EXEC may
name them together (anything else fails with CROSSSLOT on a cluster; tests/test_slots.py
checks every script and transaction of the service). The tags, chosen so that what one
step changes together shares a slot and no agent lands on one slot as a whole:

- ``{s:<bucket>}``, a session's bucket (``session_tag``: CRC-32 of the session id modulo
  SESSION_BUCKETS): the session's ledger, window and write generation, with the bucket's
  shards of the three indexes every record or formation updates in the same step (the active
  set, the in-flight index, the metrics). So recording and forming stay one atomic script
  each, and those indexes, once single hot keys, are spread over SESSION_BUCKETS slots.
- ``{<namespace>}`` for a user, shard or agent namespace (``namespace_tag``): its write
  generation and consolidation queue and version; a user's session indexes; an agent's
  startup records (stored with a bump of the agent-wide generation).
- ``{embed:<agent>}``: the agent's embedding mark and lock. ``{retention:<agent>}``: the
  agent's soft-delete index and memory_get counts (``ms:retention:deleted`` was one key for
  every agent).
- ``{<key id>}``: an API key's record and rate counters. ``{outbox}``: the outbox, whose
  queues are ordered across agents (one slot: its throughput is one node's).

Keys without a tag are only ever touched alone (or in a pipeline that is not a
transaction). A tag holds the text up to the first '}' of the key: an id holding '}' only
shares its slot with more keys, never splits keys that must share one (each tag starts with
a fixed prefix, so it is never empty).

Grows with: what adds keys (or entries in a key). "Kept" means no lifetime: the key stays
until an erasure, a purge or an operator removes it.

Agents (memory_service/state/store.py unless named)::

    ms:agent:<agent>                        string  the agent's settings (JSON AgentSettings)       per agent
    ms:agent:<agent>:sessions               set     every session the agent recorded in (added by a
                                                    session's first message)                         per session
    ms:agent:<agent>:session-order          zset    session id -> its creation number (the browse
                                                    API's list of sessions, newest first: a keyset
                                                    page is one ZRANGE, memory_service/recall/
                                                    browse.py)                                       per session
    ms:agent:<agent>:session-count          string  the last creation number given to a session    per agent
    ms:agent:<agent>:users                  zset    user id -> 0: every user who spoke, had a message
                                                    recorded under their id, or had a memory written
                                                    in their namespace (the browse API's list, by id,
                                                    ZRANGE BYLEX)                                    per user
    ms:agent:<agent>:backends               set     the backends its settings named since its last
                                                    migration (the graph reads MongoDB for an agent
                                                    that named mongo)                                per agent (a few)
    ms:shards:<agent>                       hash    shard id -> JSON ShardIn                         per shard
    ms:u:{user:<agent>:<user>}:sessions     set     the sessions the user spoke in (the "user" search
                                                    scope; erasure and export read it, no scan)       per user and session
    ms:u:{user:<agent>:<user>}:recorded     set     the sessions holding a message recorded under the
                                                    user's id, any role (what an erasure visits)     per user and session
    ms:u:{user:<agent>:<user>}:joined       set     the sessions a reservation named the user in,
                                                    written before it (what an erasure visits too;
                                                    it may name sessions the user was refused)       per user and session
    ms:embed:{embed:<agent>}:due            string  set when a message of the agent was stored to be
                                                    embedded later                                   per agent
    ms:embed:{embed:<agent>}:job            string  the agent's embedding lock, with a lifetime: a job
                                                    is queued or running (or the embedder failed
                                                    lately)                                          per agent
    ms:embed:{embed:<agent>}:claim:<memory> string  a claim on embedding the memory: the claimer's
                                                    token, with a short lifetime (a claimer that
                                                    dies leaves it to the next after it; memory_
                                                    service/state/embed_claims.py)                   per memory being
                                                                                                     embedded
    ms:reembed:<agent>                      hash    the agent's embedding model after a re-embed
                                                    (``model``, ``switched_at``) and, while one runs,
                                                    its target, cursor and counts (memory_service/
                                                    embedding/reembed.py)                            per agent
    ms:startup:{agent:<agent>}              hash    record id -> JSON startup record, at most
                                                    STARTUP_MAX_RECORDS (memory_service/recall/
                                                    startup.py)                                      per record (bounded)
    ms:import:<agent>                       hash    file (its path relative to the imported PATH) ->
                                                    JSON [[section digest, memory id], ...]: the
                                                    memories the file gave at its last import
                                                    (memory_service/curation/legacy_import.py)       per imported file
    ms:memaccess:{retention:<agent>}        hash    'n:<id>' -> memory_get calls, 't:<id>' -> the last
                                                    one's time (memory_service/curation/retention.py) per memory read by
                                                                                                     memory_get
    ms:retention:{retention:<agent>}:deleted zset   memory id -> the soft delete's time
                                                    (memory_service/curation/retention.py)           per soft-deleted memory
    ms:retention:agents                     set     the agents that ever had a memory soft-deleted
                                                    (where the daily purge looks)                    per agent
    ms:forget:{forget:<agent>}              hash    memory id -> JSON: a forget in progress (its plan and
                                                    step; ids only), and a soft one done, kept for its
                                                    undo (memory_service/curation/forget.py)         per forget
    ms:audit:agent:<agent>                  stream  the agent's changes, append-only, kept
                                                    (memory_service/access/audit.py)                 per change

Change events (memory_service/events/), each agent's on the ``{ev:<agent>}`` slot (the delivery
of one webhook names its keys together; docs/events.md)::

    ms:ev:{ev:<agent>}:stream               stream  the agent's change events (memories formed, written,
                                                    updated, deleted, ...), the entry id the event's
                                                    id; capped at about EVENTS_STREAM_MAXLEN          per change (bounded)
    ms:ev:{ev:<agent>}:hooks                hash    webhook id -> JSON webhook (its URL and secret)   per webhook
    ms:ev:{ev:<agent>}:hook:<hook>          hash    the webhook's delivery: cursor (the last event
                                                    delivered or dead-lettered), attempts and
                                                    next_at of the event at its head, last_error      per webhook
    ms:ev:{ev:<agent>}:dead:<hook>          hash    event id -> JSON dead letter (the event, its
                                                    attempts, the last error), kept until an
                                                    operator replays or drops it                     per dead letter
    ms:ev:{ev:<agent>}:replay:<hook>        hash    event id -> JSON dead letter to deliver again     per replay asked
    ms:ev:{ev:<agent>}:lock:<hook>          string  the lease of the worker delivering the webhook,
                                                    with a lifetime                                  per webhook delivering
    ms:ev:hook-agents                       set     the agents with a webhook (where the delivery
                                                    looks)                                           per agent

Sessions (the ledger, memory_service/state/store.py; the window, memory_service/formation/window.py);
``<b>`` is the session's bucket, ``session_tag``::

    ms:s:{s:<b>}:<session>:meta             hash    agent_id, next_seq, pending_tokens, cursor,
                                                    claimed/formed_windows, formed_messages,
                                                    incognito, last_activity, participants ("1":
                                                    the participants set is complete: the session
                                                    began after it existed)                          per session
    ms:s:{s:<b>}:<session>:ids              hash    message id -> "<seq> <content digest>", kept     per message
    ms:s:{s:<b>}:<session>:committed        set     the message ids committed (made pending once)    per message
    ms:s:{s:<b>}:<session>:pending          zset    message id -> seq: recorded, not yet formed      per pending message
    ms:s:{s:<b>}:<session>:tokens           hash    message id -> weighted tokens, while pending     per pending message
    ms:s:{s:<b>}:<session>:users            set     the user ids who spoke in the session            per speaker
    ms:s:{s:<b>}:<session>:participants     set     the user ids with a message reserved under their
                                                    id, any role: who took part (decided with the
                                                    reservation, memory_service/state/store.py)      per participant
    ms:s:{s:<b>}:<session>:formed           zset    one JSON entry per formed window (its number,
                                                    extractor, first and last sequence, message count,
                                                    time) -> its last sequence: which window and
                                                    extractor formed a memory (the browse API), kept per formed window
    ms:s:{s:<b>}:<session>:reform           hash    window number -> JSON: a formed window being re-formed
                                                    (its plan, state and new extraction; state/records.py,
                                                    formation/reform.py); deleted once re-formed      per window re-forming
    ms:s:{s:<b>}:<session>:startup          string  the startup digest last sent to the session
                                                    (modes first-run and digest, ~70 bytes), expiring
                                                    STARTUP_SESSION_TTL_SECONDS after its last block per session asking
    ms:s:{s:<b>}:<session>:inflight         hash    message id -> "<seq> <reserved at> <holders>
                                                    <incognito>": reservations not committed yet (a
                                                    record between its reserve and its commit)       per message in flight
    ms:s:{s:<b>}:<session>:window           hash    the window being formed: its number, claimed ids,
                                                    state, stored extraction and, once completed, the
                                                    effects to apply (queues, generations); deleted
                                                    once formed                                      per session forming
    ms:s:{s:<b>}:<session>:claim            hash    a claimed window of the first release, adopted
                                                    (and deleted) by the session's next claim        none (legacy)
    ms:active:{s:<b>}                       zset    session id -> last activity (or the cold sweep's
                                                    last visit), while messages are pending: the
                                                    bucket's share of the active set                 per session pending
    ms:windows:{s:<b>}                      zset    session id -> when its window was claimed (or first
                                                    seen held), while it holds one: where the
                                                    recovery of lost formation jobs looks            per session forming
    ms:inflight:{s:<b>}                     zset    session id -> time of its oldest in-flight
                                                    reservation (at most): where the recovery looks  per session in flight
    ms:metrics:{s:<b>}                      hash    the service's counters (formations, LLM calls,
                                                    tokens, ...), one shard per bucket; ``metrics``
                                                    sums them (with the outbox's shard)              a fixed set of fields

Namespaces (``<namespace>`` is a namespace's text: ``session:<s>``, ``user:<a>:<u>``,
``shard:<a>:<sh>``, ``agent:<a>``; ``<tag>`` its ``namespace_tag``: the session's bucket
tag for a session namespace, the namespace's text for the others)::

    ms:cons:{<tag>}:<namespace>:pending     list    memory ids not consolidated yet (directives,
                                                    suggestions)                                     per queued memory
    ms:cons:{<tag>}:<namespace>:version     string  the version of the namespace's consolidated
                                                    memory                                           per namespace
    ms:gen:{<tag>}:<namespace>              string  the namespace's write generation: bumped by every
                                                    change a cached memory block could show
                                                    (memory_service/state/cache.py owns them)        per namespace written

The memory block's cache (memory_service/state/cache.py)::

    ms:ctx:<digest>                         string  a cached memory block with the generations it
                                                    read (JSON [generations, block]), expiring after
                                                    CONTEXT_CACHE_TTL_SECONDS; the digest covers the
                                                    request and the namespaces it reads              per block request
    ms:ctx:last:<identity>                  string  the last complete block of an identity (JSON
                                                    [agent, user, session, budget, the caller's
                                                    users]), expiring after a day                    per identity served
    ms:ctxkeys:<agent>                      zset    cached-block key -> expiry time: the agent's
                                                    cached blocks, so that an erasure deletes them
                                                    without a scan; pruned as blocks arrive          per live cached block

LLM usage and budgets (memory_service/formation/budgets.py), all on the ``{llm}`` slot, so that
the reservation of a call checks and counts the agent's and the deployment's periods in one
script (one slot: a few commands per LLM call, far below one node's throughput)::

    ms:llm:{llm}:<agent>:<period>           hash    the agent's LLM usage in a UTC day (``d<YYYY-MM-DD>``)
                                                    or month (``m<YYYY-MM>``): tokens (counted against
                                                    its budget: settled calls' own, in-flight calls'
                                                    estimates), reserved, prompt_tokens, completion_tokens,
                                                    calls, attempts, formations, consolidations,
                                                    offline_formations, offline_consolidations, waits;
                                                    expiring a day after its period ends               per agent and period used
    ms:llmd:{llm}:<period>                  hash    the same for the whole deployment                per period

API keys (memory_service/access/keys.py; grows with keys, never with traffic)::

    ms:key:{<id>}                           hash    the key's record (``hash``: its secret's SHA-256) per key
    ms:keys                                 set     every key id, for an operator's list             per key
    ms:agent:<agent>:keys                   set     the ids of the keys naming the agent             per key and agent
    ms:rl:{<id>}:<r|t>:<minute>             string  requests (r) or tokens (t) of one minute,
                                                    expiring after two minutes                       per key in use

Agents' rate limits across their keys (memory_service/access/agent_limits.py)::

    ms:arl:{arl:<agent>}:<r|t>:<minute>     string  the agent's requests (r) or tokens (t) of one
                                                    minute, every key and replica; expiring after
                                                    two minutes                                      per agent in use

The outbox (memory_service/backends/outbox.py; ``<target>``: graph or mongo), all on the
``{outbox}`` slot::

    ms:outbox:{outbox}:entries              hash    entry id -> the operation (JSON)                 per undelivered entry
    ms:outbox:{outbox}:refs                 hash    entry id -> how many targets still hold it       per undelivered entry
    ms:outbox:{outbox}:seq                  string  the order of appends                             global
    ms:outbox:{outbox}:legacy_seq           string  the order of adopted first-outbox entries        global
    ms:outbox:{outbox}:queue:<target>       zset    entry id -> seq: undelivered, oldest first       per undelivered entry
    ms:outbox:{outbox}:attempts:<target>    hash    entry id -> failed deliveries                    per failing entry
    ms:outbox:{outbox}:errors:<target>      hash    entry id -> the last delivery error              per failing entry
    ms:outbox:{outbox}:dead:<target>        zset    entry id -> time: dead letters, kept             per dead letter
    ms:outbox:{outbox}:lock:<target>        string  the lease of the process delivering the target   per target
    ms:outbox:{outbox}:<target>             list    a queue of the first outbox, adopted on the
                                                    next drain                                       none (legacy)
    ms:metrics:{outbox}                     hash    the outbox's counters (dead letters)             a fixed set of fields

The graph store's full-text postings (memory_service/backends/postings.py), in the agent's
FalkorDB server beside its graph, under the agent's hash tag (one slot: the scripts name
them together)::

    ms:ft:{<agent>}:stats                   hash    docs (live memories indexed), len (their indexed
                                                    words), seq (the last memory number given), built
                                                    (the layout, "2", once the postings cover every
                                                    memory of the graph)                             per agent
    ms:ft:{<agent>}:docs                    hash    memory id -> "<indexed words> <stem> <stem>*<tf>
                                                    ...": what a removal takes out (the node's
                                                    ``terms`` holds the same)                        per live memory
    ms:ft:{<agent>}:nums                    hash    memory id -> its number in the postings          per live memory
    ms:ft:{<agent>}:ids                     hash    number -> memory id                              per live memory
    ms:ft:{<agent>}:p:<stem>                string  the word's postings in number order, 12 bytes
                                                    each: the memory's number (uint32) and the
                                                    word's BM25 impact in it (float64, its weight
                                                    without the idf; 0 once the memory is removed)   per memory and
                                                                                                     distinct word
    ms:ft:{<agent>}:dead                    hash    stem -> zeroed postings in its list (rewritten
                                                    without them once they are half of it)           per word with removals
    ms:ft:{<agent>}:build                   string  the lock of the process building the postings of
                                                    a graph written before them, with a lifetime     per agent building

Global::

    ms:embedder                             hash    name and dimension of the embedder whose vectors
                                                    are stored (the name changes when a re-embed
                                                    switches every agent), and ``untagged``: the
                                                    model of vectors stored before each vector
                                                    carried its model's name                         global
    ms:user-digest-key                      string  the secret of user-id digests, unless
                                                    USER_DIGEST_KEY is set (memory_service/access/
                                                    pseudonyms.py)                                   global
    ms:audit:system                         stream  changes spanning every agent (operator keys)     per change
    ms:agents                               zset    agent id -> 0: every agent that recorded a message,
                                                    got settings or had a memory written (the browse
                                                    API's list, by id, ZRANGE BYLEX)                 per agent
    ms:browse-index                         string  the version of the browse indexes the stored data
                                                    was last indexed for (a start-up indexes what an
                                                    older release stored, once)                      global
    ms:trace:job:<job id>                   string  the trace context of the request that enqueued
                                                    the job (W3C traceparent), while tracing is on;
                                                    expires with the job                             per queued job
    ms:keyspace                             string  the keyspace's version (KEYSPACE_VERSION), written
                                                    by the service's start and by upgrade-keyspace   global

The job queue's Redis (QUEUE_REDIS_URL, a plain Redis; memory_service/formation/leases.py)::

    ms:workers                              zset    worker id -> the end of its lease (ms): a job
                                                    whose in-progress mark names a worker whose
                                                    lease ended is run again; ended leases are
                                                    forgotten an hour later                          per worker running
    ms:queue:doorbell                       list    rung by every enqueue (at most DOORBELL_RINGS
                                                    entries): an idle worker blocks on it between
                                                    polls and takes a new job at once                global

Not built here: the job queue (``memory-service:jobs``, memory_service/formation/jobs.py)
and arq's own ``arq:*`` keys, on QUEUE_REDIS_URL (arq's transactions name a job's keys and
the queue together, so the queue is a plain Redis, never a cluster); each agent's FalkorDB
graph ``ms_agent__<agent>`` (memory_service/backends/graph.py: one key, so one agent's graph
is on one node) and FalkorDB's query log of a graph (``telemetry{<graph>}``).
"""

from __future__ import annotations

import zlib

# The layout's version: 1 was the untagged keyspace of the first releases (read by
# memory_service/state/upgrade.py only), 2 the one below.
KEYSPACE_VERSION = 2
KEYSPACE = "ms:keyspace"

# Sessions are spread over this many buckets, each a hash tag; a cluster spreads the
# buckets over its nodes, so at most this many nodes share the sessions' work. Stored data:
# changing it moves every session's keys (memory_service/state/upgrade.py).
SESSION_BUCKETS = 256


def session_tag(session_id: str) -> str:
    """The hash tag of the session's keys (without braces): its bucket."""
    return f"s:{zlib.crc32(session_id.encode()) % SESSION_BUCKETS:03d}"


def bucket_tags() -> list[str]:
    """Every session bucket's tag, in order."""
    return [f"s:{b:03d}" for b in range(SESSION_BUCKETS)]


def namespace_tag(namespace: str) -> str:
    """The hash tag of a namespace's keys: its session's bucket, or the namespace's text."""
    kind, _, rest = namespace.partition(":")
    return session_tag(rest) if kind == "session" else namespace


# Global ------------------------------------------------------------------------------

EMBEDDER = "ms:embedder"
USER_DIGEST_KEY = "ms:user-digest-key"
AGENTS = "ms:agents"
BROWSE_INDEX = "ms:browse-index"
RETENTION_AGENTS = "ms:retention:agents"
HOOK_AGENTS = "ms:ev:hook-agents"
WORKERS = "ms:workers"  # on the job queue's Redis
DOORBELL = "ms:queue:doorbell"  # on the job queue's Redis
OUTBOX_TAG = "outbox"


def active(tag: str) -> str:
    """A bucket's share of the active set (``tag``: ``session_tag``)."""
    return f"ms:active:{{{tag}}}"


def windows(tag: str) -> str:
    """A bucket's index of the sessions holding a window (memory_service/formation/window.py)."""
    return f"ms:windows:{{{tag}}}"


def in_flight(tag: str) -> str:
    """A bucket's share of the in-flight index."""
    return f"ms:inflight:{{{tag}}}"


def metrics(tag: str) -> str:
    """A shard of the service's counters: a session bucket's, or the outbox's (OUTBOX_TAG)."""
    return f"ms:metrics:{{{tag}}}"


def metric_tags() -> list[str]:
    """The tags of every metrics shard."""
    return [*bucket_tags(), OUTBOX_TAG]


# Agents ------------------------------------------------------------------------------


def agent_settings(agent_id: str) -> str:
    return f"ms:agent:{agent_id}"


def agent_sessions(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:sessions"


def agent_session_order(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:session-order"


def agent_session_count(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:session-count"


def agent_users(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:users"


def agent_backends(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:backends"


def shards(agent_id: str) -> str:
    return f"ms:shards:{agent_id}"


def user_sessions(agent_id: str, user_id: str) -> str:
    return f"ms:u:{{user:{agent_id}:{user_id}}}:sessions"


def user_recorded(agent_id: str, user_id: str) -> str:
    return f"ms:u:{{user:{agent_id}:{user_id}}}:recorded"


def user_joined(agent_id: str, user_id: str) -> str:
    return f"ms:u:{{user:{agent_id}:{user_id}}}:joined"


def user_of(agent_id: str, key: str) -> str | None:
    """The user id in one of ``agent_id``'s per-user keys (``user_sessions``, ``user_recorded``, ``user_joined``)."""
    head = f"ms:u:{{user:{agent_id}:"
    if not key.startswith(head) or "}" not in key[len(head):]:
        return None
    return key[len(head):].split("}", 1)[0] or None


def trace_job(job_id: str) -> str:
    """The trace context a request left for the job it enqueued (memory_service/state/tracing.py)."""
    return f"ms:trace:job:{job_id}"


def embed_due(agent_id: str) -> str:
    return f"ms:embed:{{embed:{agent_id}}}:due"


def embed_lock(agent_id: str) -> str:
    return f"ms:embed:{{embed:{agent_id}}}:job"


def embed_claim(agent_id: str, memory_id: str) -> str:
    return f"ms:embed:{{embed:{agent_id}}}:claim:{memory_id}"


def reembed(agent_id: str) -> str:
    return f"ms:reembed:{agent_id}"


def startup_records(agent_id: str) -> str:
    return f"ms:startup:{{agent:{agent_id}}}"


def import_manifest(agent_id: str) -> str:
    return f"ms:import:{agent_id}"


def memory_access(agent_id: str) -> str:
    return f"ms:memaccess:{{retention:{agent_id}}}"


def retention_deleted(agent_id: str) -> str:
    return f"ms:retention:{{retention:{agent_id}}}:deleted"


def audit_stream(agent_id: str | None) -> str:
    """The agent's audit stream; None: the system stream (changes spanning every agent)."""
    return f"ms:audit:agent:{agent_id}" if agent_id else "ms:audit:system"


# Change events (memory_service/events/) ---------------------------------------------


def _events_prefix(agent_id: str) -> str:
    return f"ms:ev:{{ev:{agent_id}}}:"


def event_stream(agent_id: str) -> str:
    return _events_prefix(agent_id) + "stream"


def webhooks(agent_id: str) -> str:
    return _events_prefix(agent_id) + "hooks"


def webhook_delivery(agent_id: str, hook_id: str) -> str:
    return _events_prefix(agent_id) + f"hook:{hook_id}"


def webhook_dead(agent_id: str, hook_id: str) -> str:
    return _events_prefix(agent_id) + f"dead:{hook_id}"


def webhook_replay(agent_id: str, hook_id: str) -> str:
    return _events_prefix(agent_id) + f"replay:{hook_id}"


def webhook_lock(agent_id: str, hook_id: str) -> str:
    return _events_prefix(agent_id) + f"lock:{hook_id}"


# The graph store's full-text postings ----------------------------------------------


def postings_prefix(agent_id: str) -> str:
    """What every postings key of the agent starts with (its hash tag included)."""
    return f"ms:ft:{{{agent_id}}}:"


def postings_stats(agent_id: str) -> str:
    return postings_prefix(agent_id) + "stats"


def postings_docs(agent_id: str) -> str:
    return postings_prefix(agent_id) + "docs"


def postings_term(agent_id: str, term: str) -> str:
    """A word's list of postings (a string of fixed-size records; "t:" held the sorted sets
    of the first layout)."""
    return postings_prefix(agent_id) + "p:" + term


def postings_nums(agent_id: str) -> str:
    """memory id -> its number in the postings."""
    return postings_prefix(agent_id) + "nums"


def postings_ids(agent_id: str) -> str:
    """A number in the postings -> its memory id."""
    return postings_prefix(agent_id) + "ids"


def postings_dead(agent_id: str) -> str:
    """word -> its list's postings of removed memories (zeroed in place until the list is rewritten)."""
    return postings_prefix(agent_id) + "dead"


def postings_build_lock(agent_id: str) -> str:
    return postings_prefix(agent_id) + "build"


# Sessions ----------------------------------------------------------------------------

# The parts of a session's ledger, all under ``ms:s:{<bucket>}:<session>:``.
SESSION_PARTS = ("meta", "ids", "pending", "tokens", "users", "committed", "startup", "inflight", "formed",
                 "participants", "reform")


def _session_prefix(session_id: str) -> str:
    return f"ms:s:{{{session_tag(session_id)}}}:{session_id}:"


def _session_key(session_id: str, part: str) -> str:
    return _session_prefix(session_id) + part


def session_keys(session_id: str) -> dict[str, str]:
    """The session's ledger keys by part (SESSION_PARTS); not its window."""
    prefix = _session_prefix(session_id)  # its tag found once, not once a part
    return {part: prefix + part for part in SESSION_PARTS}


def window(session_id: str) -> str:
    return _session_key(session_id, "window")


def legacy_claim(session_id: str) -> str:
    """Where the first release kept a claimed window (adopted by the next claim)."""
    return _session_key(session_id, "claim")


# Namespaces --------------------------------------------------------------------------


def forget_records(agent_id: str) -> str:
    """The agent's forgets in progress (and the soft ones kept for undo): memory id -> JSON."""
    return f"ms:forget:{{forget:{agent_id}}}"


def cons_pending(namespace: str) -> str:
    return f"ms:cons:{{{namespace_tag(namespace)}}}:{namespace}:pending"


def cons_version(namespace: str) -> str:
    return f"ms:cons:{{{namespace_tag(namespace)}}}:{namespace}:version"


def generation(namespace: str) -> str:
    return f"ms:gen:{{{namespace_tag(namespace)}}}:{namespace}"


# The memory block's cache ------------------------------------------------------------


def cached_block(digest: str) -> str:
    return f"ms:ctx:{digest}"


def last_good_block(identity: str) -> str:
    return cached_block(f"last:{identity}")


def cache_index(agent_id: str) -> str:
    return f"ms:ctxkeys:{agent_id}"


# LLM usage and budgets ---------------------------------------------------------------

LLM_TAG = "{llm}"


def llm_usage(agent_id: str | None, period: str) -> str:
    """The LLM usage of ``agent_id`` (None: the whole deployment) in ``period`` (``d2026-12-07``,
    ``m2026-12``). Agent ids hold no ':', so no agent's key can be the deployment's."""
    return f"ms:llmd:{LLM_TAG}:{period}" if agent_id is None else f"ms:llm:{LLM_TAG}:{agent_id}:{period}"


# API keys ----------------------------------------------------------------------------

API_KEYS = "ms:keys"


def api_key(key_id: str) -> str:
    return f"ms:key:{{{key_id}}}"


def agent_api_keys(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:keys"


def rate_counter(key_id: str, kind: str, minute: int) -> str:
    """The key's counter of requests (``kind`` r) or tokens (t) in one minute since the epoch."""
    return f"ms:rl:{{{key_id}}}:{kind}:{minute}"


def agent_rate_counter(agent_id: str, kind: str, minute: int) -> str:
    """The agent's counter of requests (``kind`` r) or tokens (t) in one minute since the
    epoch, whichever key and replica they came through."""
    return f"ms:arl:{{arl:{agent_id}}}:{kind}:{minute}"


# The outbox --------------------------------------------------------------------------

_OUTBOX = "ms:outbox:{outbox}"
OUTBOX_ENTRIES = f"{_OUTBOX}:entries"
OUTBOX_REFS = f"{_OUTBOX}:refs"
OUTBOX_SEQ = f"{_OUTBOX}:seq"
OUTBOX_LEGACY_SEQ = f"{_OUTBOX}:legacy_seq"
OUTBOX_METRICS = metrics(OUTBOX_TAG)


def outbox_queue(target: str) -> str:
    return f"{_OUTBOX}:queue:{target}"


def outbox_attempts(target: str) -> str:
    return f"{_OUTBOX}:attempts:{target}"


def outbox_errors(target: str) -> str:
    return f"{_OUTBOX}:errors:{target}"


def outbox_dead(target: str) -> str:
    return f"{_OUTBOX}:dead:{target}"


def outbox_lock(target: str) -> str:
    return f"{_OUTBOX}:lock:{target}"


def outbox_legacy_queue(target: str) -> str:
    return f"{_OUTBOX}:{target}"
