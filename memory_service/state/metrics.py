"""Prometheus metrics of this process: latency histograms and counters with labels.

Why per process: a counter kept in one Redis hash and served by every replica is counted
once per replica when Prometheus sums them (and the old /metrics did just that). Here each
process counts what it did, in its own registry (``REGISTRY``, not prometheus_client's
global one, so that libraries' metrics and a second app in a test process do not mix in),
and Prometheus sums the replicas. Totals that are facts about the whole deployment (what
the Redis hashes ``keyspace.metrics`` shards hold, the outbox's depth, the job queue, the
memories stored) are gauges read from the store at scrape time: the same on every replica,
to be aggregated with ``max``.

Labels are bounded: route templates (never raw paths: ids would make one series per user),
operation names, statuses, outcomes. No label carries a user, session or agent id.

What code counts: the HTTP middleware (memory_service/http/telemetry.py), the facade's
operations (``timed``), the worker's jobs, the embedder, the LLM client, and
``StateStore.add_metrics`` (``count``), whose flat names are turned into labelled series
here (``count`` says how). docs/deploy.md lists every metric.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)
PREFIX = "memory_service_"

# Seconds: the memory block's deadline is 1 s by default, a formation with an LLM can take a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

HTTP_REQUESTS = Histogram(
    f"{PREFIX}http_request_duration_seconds",
    "HTTP requests by method, route template ('(no route)' for unmatched paths) and status, from the first byte "
    "received to the last byte sent",
    ["method", "route", "status"], registry=REGISTRY, buckets=LATENCY_BUCKETS)
HTTP_IN_FLIGHT = Gauge(f"{PREFIX}http_requests_in_flight", "HTTP requests this process is serving now",
                       registry=REGISTRY)
OPERATIONS = Histogram(
    f"{PREFIX}operation_duration_seconds",
    "Service operations: context (one memory block), search, record (one message), formation (one window, in the "
    "worker), consolidation, embedding (one call of the embedder); outcome ok or error",
    ["operation", "outcome"], registry=REGISTRY, buckets=LATENCY_BUCKETS)
SEARCH_SIGNALS = Histogram(
    f"{PREFIX}search_signal_duration_seconds",
    "One search signal's time: fulltext and vector (the graph store's query), graph (the knowledge graph's entities, "
    "facts and the memories that mention them)", ["signal"],
    registry=REGISTRY, buckets=LATENCY_BUCKETS)
LLM_REQUESTS = Histogram(
    f"{PREFIX}llm_request_duration_seconds",
    "One request to the LLM endpoint (each attempt, whatever its outcome; llm_attempts_total - llm_calls_total "
    "failed)", registry=REGISTRY, buckets=LATENCY_BUCKETS)
LLM_CALLS = Counter(f"{PREFIX}llm_calls", "LLM calls that answered, by purpose (extraction, consolidation)",
                    ["purpose"], registry=REGISTRY)
LLM_ATTEMPTS = Counter(f"{PREFIX}llm_attempts", "LLM attempts, retries included, by purpose", ["purpose"],
                       registry=REGISTRY)
LLM_TOKENS = Counter(f"{PREFIX}llm_tokens", "LLM tokens by purpose and kind (prompt, completion)",
                     ["purpose", "kind"], registry=REGISTRY)
LLM_SECONDS = Counter(f"{PREFIX}llm_seconds", "Seconds spent waiting for the LLM, by purpose", ["purpose"],
                      registry=REGISTRY)
CONTEXT_BLOCKS = Counter(f"{PREFIX}context_blocks", "Memory blocks served, by where they came from (graph, mongo, "
                         "graph_mongo, last_good, ...)", ["source"], registry=REGISTRY)
JOB_FAILURES = Counter(f"{PREFIX}job_failures", "Failed tries of worker jobs (formation, consolidation), "
                       "timeouts included", ["job"], registry=REGISTRY)
JOB_TIMEOUTS = Counter(f"{PREFIX}job_timeouts", "Worker job tries stopped by WORKER_JOB_TIMEOUT_SECONDS", ["job"],
                       registry=REGISTRY)
STORE_FROZEN = Counter(f"{PREFIX}store_frozen", "Requests answered 503 because a store did not answer its probe",
                       ["store"], registry=REGISTRY)
REDACTED = Counter(f"{PREFIX}redacted_values", "Secrets and personal data redacted before they were stored "
                   "(docs/redaction.md), by kind", ["kind"], registry=REGISTRY)
REDACTION_REFUSALS = Counter(f"{PREFIX}redaction_refusals", "Texts refused (422) by an agent's redaction policy "
                             "(mode refuse), by the first kind found", ["kind"], registry=REGISTRY)
BULK_PAUSE_SECONDS = Counter(f"{PREFIX}bulk_pause_seconds", "Seconds batches' steps waited while other agents' "
                             "requests were in flight (memory_service/ingest/pacing.py)", registry=REGISTRY)

# Flat names of StateStore.add_metrics (and the formation's completion) -> HELP text, for
# the names that stay one series each (memory_service_<name>_total).
HELP = {
    "formations": "Windows formed",
    "formed_messages": "Messages in formed windows",
    "formed_memories": "Memories written by formations",
    "consolidations": "Consolidations that merged items",
    "consolidated_items": "Items merged by consolidations",
    "embedded_at_record": "Messages embedded as they were recorded (a live session's, by the API process)",
    "embedded_after_record": "Messages embedded after they were recorded",
    "embeddings_backfilled": "Memories embedded by the backfill",
    "purged_memories": "Soft-deleted memories purged by retention",
    "purge_runs": "Retention runs",
    "stale_purged_memories": "Stale memories purged",
    "stale_purge_runs": "Stale purge runs",
    "budget_offline_formations": "Windows formed by the offline extractor because an LLM budget was spent",
    "budget_offline_consolidations": "Merges made by rule because an LLM budget was spent",
    "budget_waits": "Formation runs that left a window pending because an LLM budget was spent (when_spent: wait)",
    "expired_purged_memories": "Memories purged past their expires_at",
}
_LLM = re.compile(r"^(consolidation_)?llm_(calls|attempts|prompt_tokens|completion_tokens|seconds)$")
_flat: dict[str, Counter] = {}
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def redacted(counts: Mapping[str, int]) -> None:
    """Count what a redaction took out, by kind (``memory_service_redacted_values_total``)."""
    for kind, n in counts.items():
        REDACTED.labels(kind).inc(n)


def count(name: str, value: float = 1.0) -> None:
    """Add ``value`` to this process's series for the flat counter ``name``.

    Names with a dimension baked in become a label: ``context_from_<source>`` ->
    ``context_blocks_total{source}``, ``<job>_failures``/``<job>_timeouts`` ->
    ``job_failures_total{job}``/``job_timeouts_total{job}``, ``[consolidation_]llm_<x>`` ->
    ``llm_<x>_total{purpose}`` (tokens: ``llm_tokens_total{purpose, kind}``). Durations
    summed as counters (``formation_seconds``) are left to the histograms. Any other name
    is ``memory_service_<name>_total``.
    """
    if value < 0 or not _NAME.match(name):
        return
    if name.startswith("context_from_"):
        CONTEXT_BLOCKS.labels(name.removeprefix("context_from_")).inc(value)
    elif (llm := _LLM.match(name)) is not None:
        purpose = "consolidation" if llm.group(1) else "extraction"
        what = llm.group(2)
        if what.endswith("_tokens"):
            LLM_TOKENS.labels(purpose, what.removesuffix("_tokens")).inc(value)
        else:
            {"calls": LLM_CALLS, "attempts": LLM_ATTEMPTS, "seconds": LLM_SECONDS}[what].labels(purpose).inc(value)
    elif name.endswith("_failures"):
        JOB_FAILURES.labels(name.removesuffix("_failures")).inc(value)
    elif name.endswith("_timeouts"):
        JOB_TIMEOUTS.labels(name.removesuffix("_timeouts")).inc(value)
    elif name.endswith("_seconds"):
        return
    else:
        counter = _flat.get(name)
        if counter is None:
            counter = _flat[name] = Counter(f"{PREFIX}{name}", HELP.get(name, f"{name.replace('_', ' ')} (this process)"),
                                            registry=REGISTRY)
        counter.inc(value)


def count_all(counters: Mapping[str, float]) -> None:
    for name, value in counters.items():
        count(name, value)


@contextmanager
def timed(operation: str) -> Iterator[None]:
    """Observe the block's duration in ``operation_duration_seconds{operation, outcome}``."""
    started = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        OPERATIONS.labels(operation, outcome).observe(time.perf_counter() - started)


class StoreGauges(Collector):
    """Gauges read from the stores (MemoryService.gauges and the Redis totals), kept as of
    the last ``update``: prometheus_client collects synchronously, the stores are read
    asynchronously (by the /metrics route before it renders, or by a refresh task)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.totals: dict[str, float] = {}

    def update(self, values: Mapping[str, float], totals: Mapping[str, float]) -> None:
        self.values, self.totals = dict(values), dict(totals)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for sample, value in sorted(self.values.items()):
            name, _, rest = sample.partition("{")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(PREFIX + name, GAUGE_HELP.get(name, name.replace("_", " ")),
                                                            labels=sorted(labels))
            family.add_metric([labels[k] for k in sorted(labels)], value)
        yield from families.values()
        totals = GaugeMetricFamily(
            f"{PREFIX}deployment_counter",
            "Totals kept in Redis (the sharded metrics hashes) for the whole deployment since its store was created, by name; the same "
            "on every replica: aggregate with max, not sum", labels=["name"])
        for name, value in sorted(self.totals.items()):
            totals.add_metric([name], value)
        yield totals

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


GAUGE_HELP = {
    "outbox_pending": "Outbox entries not yet delivered to a target store",
    "outbox_dead_letters": "Outbox entries given up for a target store",
    "outbox_alarm": "1 while a target's outbox is past OUTBOX_ALARM_PENDING or holds dead letters",
    "circuit_breaker_open": "1 while a store's circuit breaker is open",
    "queue_jobs": "Jobs in the worker queue (due or deferred)",
    "queue_lag_seconds": "How long the oldest due job of the worker queue has waited (0: none waits)",
    "memories_stored": "Memories the store holds (soft-deleted and evicted ones until purged), for the whole "
                       "deployment, by store (graph, mongo: a mirror holds copies, do not add them); the same on every "
                       "replica: aggregate with max; counted at most every METRICS_STORED_REFRESH_SECONDS",
    "graph_entities_stored": "Knowledge-graph entities the graph store holds, for the whole deployment; aggregate "
                             "with max",
}

STORE_GAUGES = StoreGauges()
REGISTRY.register(STORE_GAUGES)


async def queue_gauges(redis: Any, queue_name: str) -> dict[str, float]:
    """The job queue's depth and lag, from arq's queue (a sorted set scored by due time in ms)."""
    now_ms = time.time() * 1000
    depth = await redis.zcard(queue_name)
    oldest = await redis.zrangebyscore(queue_name, "-inf", now_ms, start=0, num=1, withscores=True)
    lag = max(0.0, (now_ms - float(oldest[0][1])) / 1000) if oldest else 0.0
    return {"queue_jobs": float(depth), "queue_lag_seconds": lag}


def render() -> bytes:
    """This process's registry in the Prometheus text format."""
    return generate_latest(REGISTRY)
