"""Every Redis key of the service, in one place: the map of what the service keeps in Redis.

Every ``ms:*`` key is built here and nowhere else (tests/test_keyspace.py fails on an
``ms:`` literal in any other module), so this docstring is the whole keyspace. Ids never
contain ':' (memory_service/domain/namespaces.py), so no two keys below can collide. The
names are stored data: changing one strands what is stored under the old one (no
migration renames keys), so a builder's output never changes.

``{...}`` is a cluster hash tag: the keys sharing one are on one slot, so a script may
name them together. Only an API key's keys and a session's window and in-flight hash
carry one; the other session keys do not (docs/formation.md, "Limits").

Grows with: what adds keys (or entries in a key). "Kept" means no lifetime: the key stays
until an erasure, a purge or an operator removes it.

Agents (memory_service/state/store.py unless named)::

    ms:agent:<agent>                        string  the agent's settings (JSON AgentSettings)       per agent
    ms:agent:<agent>:sessions               set     every session the agent recorded in              per session
    ms:agent:<agent>:backends               set     the backends its settings named since its last
                                                    migration (the graph reads MongoDB for an agent
                                                    that named mongo)                                per agent (a few)
    ms:shards:<agent>                       hash    shard id -> JSON ShardIn                         per shard
    ms:agent:<agent>:user:<user>:sessions   set     the sessions the user spoke in (the "user" search
                                                    scope; erasure and export read it, no scan)       per user and session
    ms:agent:<agent>:user:<user>:recorded   set     the sessions holding a message recorded under the
                                                    user's id, any role (what an erasure visits)     per user and session
    ms:embed:<agent>:due                    string  set when a message of the agent was stored to be
                                                    embedded later                                   per agent
    ms:embed:<agent>:job                    string  the agent's embedding lock, with a lifetime: a job
                                                    is queued or running (or the embedder failed
                                                    lately)                                          per agent
    ms:reembed:<agent>                      hash    the agent's embedding model after a re-embed
                                                    (``model``, ``switched_at``) and, while one runs,
                                                    its target, cursor and counts (memory_service/
                                                    embedding/reembed.py)                            per agent
    ms:startup:<agent>                      hash    record id -> JSON startup record, at most
                                                    STARTUP_MAX_RECORDS (memory_service/recall/
                                                    startup.py)                                      per record (bounded)
    ms:import:<agent>                       hash    file (its path relative to the imported PATH) ->
                                                    JSON [[section digest, memory id], ...]: the
                                                    memories the file gave at its last import
                                                    (memory_service/curation/legacy_import.py)       per imported file
    ms:memaccess:<agent>                    hash    'n:<id>' -> memory_get calls, 't:<id>' -> the last
                                                    one's time (memory_service/curation/retention.py) per memory read by
                                                                                                     memory_get
    ms:audit:agent:<agent>                  stream  the agent's changes, append-only, kept
                                                    (memory_service/access/audit.py)                 per change

Sessions (the ledger, memory_service/state/store.py; the window, memory_service/formation/window.py)::

    ms:s:<session>:meta                     hash    agent_id, next_seq, pending_tokens, cursor,
                                                    claimed/formed_windows, formed_messages,
                                                    incognito, last_activity                         per session
    ms:s:<session>:ids                      hash    message id -> "<seq> <content digest>", kept     per message
    ms:s:<session>:committed                set     the message ids committed (made pending once)    per message
    ms:s:<session>:pending                  zset    message id -> seq: recorded, not yet formed      per pending message
    ms:s:<session>:tokens                   hash    message id -> weighted tokens, while pending     per pending message
    ms:s:<session>:users                    set     the user ids who spoke in the session            per speaker
    ms:s:<session>:startup                  string  the startup digest last sent to the session
                                                    (modes first-run and digest, ~70 bytes), expiring
                                                    STARTUP_SESSION_TTL_SECONDS after its last block per session asking
    ms:s:{<session>}:inflight               hash    message id -> "<seq> <reserved at> <holders>
                                                    <incognito>": reservations not committed yet (a
                                                    record between its reserve and its commit)       per message in flight
    ms:s:{<session>}:window                 hash    the window being formed: its number, claimed ids,
                                                    state and stored extraction; deleted once formed per session forming
    ms:s:<session>:claim                    hash    a claimed window of the first release, adopted
                                                    (and deleted) by the session's next claim        none (legacy)

Namespaces (``<namespace>`` is a namespace's text: ``session:<s>``, ``user:<a>:<u>``,
``shard:<a>:<sh>``, ``agent:<a>``)::

    ms:cons:<namespace>:pending             list    memory ids not consolidated yet (directives,
                                                    suggestions)                                     per queued memory
    ms:cons:<namespace>:version             string  the version of the namespace's consolidated
                                                    memory                                           per namespace
    ms:gen:<namespace>                      string  the namespace's write generation: bumped by every
                                                    change a cached memory block could show
                                                    (memory_service/state/cache.py owns them)        per namespace written

The memory block's cache (memory_service/state/cache.py)::

    ms:ctx:<digest>                         string  a cached memory block (JSON), expiring after
                                                    CONTEXT_CACHE_TTL_SECONDS; the digest covers the
                                                    generations it read                              per block served
    ms:ctx:last:<identity>                  string  the last complete block of an identity (JSON
                                                    [agent, user, session, budget, the caller's
                                                    users]), expiring after a day                    per identity served
    ms:ctxkeys:<agent>                      zset    cached-block key -> expiry time: the agent's
                                                    cached blocks, so that an erasure deletes them
                                                    without a scan; pruned as blocks arrive          per live cached block

API keys (memory_service/access/keys.py; grows with keys, never with traffic)::

    ms:key:{<id>}                           hash    the key's record (``hash``: its secret's SHA-256) per key
    ms:keys                                 set     every key id, for an operator's list             per key
    ms:agent:<agent>:keys                   set     the ids of the keys naming the agent             per key and agent
    ms:rl:{<id>}:<r|t>:<minute>             string  requests (r) or tokens (t) of one minute,
                                                    expiring after two minutes                       per key in use

The outbox (memory_service/stores/outbox.py; ``<target>``: graph or mongo)::

    ms:outbox:entries                       hash    entry id -> the operation (JSON)                 per undelivered entry
    ms:outbox:refs                          hash    entry id -> how many targets still hold it       per undelivered entry
    ms:outbox:seq                           string  the order of appends                             global
    ms:outbox:legacy_seq                    string  the order of adopted first-outbox entries        global
    ms:outbox:queue:<target>                zset    entry id -> seq: undelivered, oldest first       per undelivered entry
    ms:outbox:attempts:<target>             hash    entry id -> failed deliveries                    per failing entry
    ms:outbox:errors:<target>               hash    entry id -> the last delivery error              per failing entry
    ms:outbox:dead:<target>                 zset    entry id -> time: dead letters, kept             per dead letter
    ms:outbox:lock:<target>                 string  the lease of the process delivering the target   per target
    ms:outbox:<target>                      list    a queue of the first outbox, adopted on the
                                                    next drain                                       none (legacy)

The graph store's full-text postings (memory_service/stores/postings.py), in the agent's
FalkorDB server beside its graph, under the agent's hash tag (one slot: the scripts name
them together)::

    ms:ft:{<agent>}:stats                   hash    docs (live memories indexed), len (their indexed
                                                    words), built (set once the postings cover every
                                                    memory of the graph)                             per agent
    ms:ft:{<agent>}:docs                    hash    memory id -> "<indexed words> <stem> <stem>*<tf>
                                                    ...": what a removal takes out (the node's
                                                    ``terms`` holds the same)                        per live memory
    ms:ft:{<agent>}:t:<stem>                zset    memory id -> the term's BM25 impact in it (its
                                                    weight without the idf), best first              per live memory and
                                                                                                     distinct word
    ms:ft:{<agent>}:build                   string  the lock of the process building the postings of
                                                    a graph written before them, with a lifetime     per agent building

Global::

    ms:active                               zset    session id -> last activity (or the cold sweep's
                                                    last visit), while messages are pending           per session pending
    ms:inflight                             zset    session id -> time of its oldest in-flight
                                                    reservation (at most): where the recovery looks  per session in flight
    ms:metrics                              hash    the service's counters (formations, LLM calls,
                                                    tokens, outbox dead letters, ...)                a fixed set of fields
    ms:embedder                             hash    name and dimension of the embedder whose vectors
                                                    are stored (the name changes when a re-embed
                                                    switches every agent), and ``untagged``: the
                                                    model of vectors stored before each vector
                                                    carried its model's name                         global
    ms:user-digest-key                      string  the secret of user-id digests, unless
                                                    USER_DIGEST_KEY is set (memory_service/access/
                                                    pseudonyms.py)                                   global
    ms:retention:deleted                    zset    '<agent>\\x00<memory id>' -> the soft delete's
                                                    time (memory_service/curation/retention.py)      per soft-deleted memory
    ms:audit:system                         stream  changes spanning every agent (operator keys)     per change

Not built here, in the same Redis: the job queue (``memory-service:jobs``,
memory_service/formation/jobs.py) and arq's own ``arq:*`` keys; each agent's FalkorDB graph
``ms_agent__<agent>`` (memory_service/stores/graph.py) and FalkorDB's query log of a graph
(``telemetry{<graph>}``).
"""

from __future__ import annotations

# Global ------------------------------------------------------------------------------

ACTIVE = "ms:active"
IN_FLIGHT = "ms:inflight"
METRICS = "ms:metrics"
EMBEDDER = "ms:embedder"
USER_DIGEST_KEY = "ms:user-digest-key"
RETENTION_DELETED = "ms:retention:deleted"

# Agents ------------------------------------------------------------------------------


def agent_settings(agent_id: str) -> str:
    return f"ms:agent:{agent_id}"


def agent_sessions(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:sessions"


def agent_backends(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:backends"


def shards(agent_id: str) -> str:
    return f"ms:shards:{agent_id}"


def user_sessions(agent_id: str, user_id: str) -> str:
    return f"ms:agent:{agent_id}:user:{user_id}:sessions"


def user_recorded(agent_id: str, user_id: str) -> str:
    return f"ms:agent:{agent_id}:user:{user_id}:recorded"


def embed_due(agent_id: str) -> str:
    return f"ms:embed:{agent_id}:due"


def embed_lock(agent_id: str) -> str:
    return f"ms:embed:{agent_id}:job"


def reembed(agent_id: str) -> str:
    return f"ms:reembed:{agent_id}"


def startup_records(agent_id: str) -> str:
    return f"ms:startup:{agent_id}"


def import_manifest(agent_id: str) -> str:
    return f"ms:import:{agent_id}"


def memory_access(agent_id: str) -> str:
    return f"ms:memaccess:{agent_id}"


def audit_stream(agent_id: str | None) -> str:
    """The agent's audit stream; None: the system stream (changes spanning every agent)."""
    return f"ms:audit:agent:{agent_id}" if agent_id else "ms:audit:system"


# The graph store's full-text postings ----------------------------------------------


def postings_prefix(agent_id: str) -> str:
    """What every postings key of the agent starts with (its hash tag included)."""
    return f"ms:ft:{{{agent_id}}}:"


def postings_stats(agent_id: str) -> str:
    return postings_prefix(agent_id) + "stats"


def postings_docs(agent_id: str) -> str:
    return postings_prefix(agent_id) + "docs"


def postings_term(agent_id: str, term: str) -> str:
    return postings_prefix(agent_id) + "t:" + term


def postings_build_lock(agent_id: str) -> str:
    return postings_prefix(agent_id) + "build"


# Sessions ----------------------------------------------------------------------------

# The parts of a session's ledger, all under ``ms:s:<session>:`` (the in-flight hash under
# the session's hash tag, like its window).
SESSION_PARTS = ("meta", "ids", "pending", "tokens", "users", "committed", "startup")


def session_keys(session_id: str) -> dict[str, str]:
    """The session's ledger keys by part (SESSION_PARTS and ``inflight``); not its window."""
    keys = {part: f"ms:s:{session_id}:{part}" for part in SESSION_PARTS}
    keys["inflight"] = f"ms:s:{{{session_id}}}:inflight"
    return keys


def window(session_id: str) -> str:
    return f"ms:s:{{{session_id}}}:window"


def legacy_claim(session_id: str) -> str:
    """Where the first release kept a claimed window (adopted by the next claim)."""
    return f"ms:s:{session_id}:claim"


# Namespaces --------------------------------------------------------------------------


def cons_pending(namespace: str) -> str:
    return f"ms:cons:{namespace}:pending"


def cons_version(namespace: str) -> str:
    return f"ms:cons:{namespace}:version"


def generation(namespace: str) -> str:
    return f"ms:gen:{namespace}"


# The memory block's cache ------------------------------------------------------------


def cached_block(digest: str) -> str:
    return f"ms:ctx:{digest}"


def last_good_block(identity: str) -> str:
    return cached_block(f"last:{identity}")


def cache_index(agent_id: str) -> str:
    return f"ms:ctxkeys:{agent_id}"


# API keys ----------------------------------------------------------------------------

API_KEYS = "ms:keys"


def api_key(key_id: str) -> str:
    return f"ms:key:{{{key_id}}}"


def agent_api_keys(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:keys"


def rate_counter(key_id: str, kind: str, minute: int) -> str:
    """The key's counter of requests (``kind`` r) or tokens (t) in one minute since the epoch."""
    return f"ms:rl:{{{key_id}}}:{kind}:{minute}"


# The outbox --------------------------------------------------------------------------

OUTBOX_ENTRIES = "ms:outbox:entries"
OUTBOX_REFS = "ms:outbox:refs"
OUTBOX_SEQ = "ms:outbox:seq"
OUTBOX_LEGACY_SEQ = "ms:outbox:legacy_seq"


def outbox_queue(target: str) -> str:
    return f"ms:outbox:queue:{target}"


def outbox_attempts(target: str) -> str:
    return f"ms:outbox:attempts:{target}"


def outbox_errors(target: str) -> str:
    return f"ms:outbox:errors:{target}"


def outbox_dead(target: str) -> str:
    return f"ms:outbox:dead:{target}"


def outbox_lock(target: str) -> str:
    return f"ms:outbox:lock:{target}"


def outbox_legacy_queue(target: str) -> str:
    return f"ms:outbox:{target}"
