"""What the stores hold, compared before and after a request: every key and graph, by content
(every server's: the embedded one, and each primary of the cluster when the suite runs on one)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import redis

from memory_service.formation.jobs import QUEUE_NAME
from memory_service.state.keyspace import DOORBELL, WORKERS, embed_claim, outbox_lock

# Keys neither compared nor counted (a read may write them): the service's counters (of
# reads served too), the API keys' request counters, and FalkorDB's log of the queries run
# on a graph (telemetry{<graph>}, created in the background after a graph's first queries).
METRICS_PREFIX = b"ms:metrics:"  # every shard of the counters
# Rate-limit counters of API keys count the requests themselves, refused ones too.
RATE_COUNTER_PREFIX = b"ms:rl:"
QUERY_LOG_PREFIX = b"telemetry{"
# The job queue's keys (arq:* and the queue itself), which a worker's cron jobs write on
# their own schedule, and the outbox's delivery leases, which its relay takes and releases
# on its own schedule too (ms:outbox:{outbox}:lock:<target>).
WORKER_KEYS = (b"arq:", QUEUE_NAME.encode(), outbox_lock("").encode(), WORKERS.encode(),  # WORKERS: their leases
               DOORBELL.encode())  # rung by every enqueue, emptied by the idle workers
# Embedding claims (ms:embed:{embed:<agent>}:claim:<memory>) are leases too: a written memory
# keeps its claim until the lease ends (EMBEDDING_CLAIM_SECONDS), so a claim taken by an
# earlier request's embedding expires on its own schedule, between any two snapshots.
EMBED_CLAIM_PREFIX, EMBED_CLAIM_MARK = embed_claim("", "").encode().split(b"{embed:}")
# The webhooks' delivery state (cursor, attempts, dead letters, replays, lease: ms:ev:{ev:<agent>}:hook:<id>
# and the like), which the worker's delivery writes on its own schedule (memory_service/events/delivery.py).
WEBHOOK_DELIVERY = re.compile(rb"^ms:ev:\{ev:[^}]*\}:(hook|dead|replay|lock):")


@dataclass(frozen=True)
class StoreState:
    keys: int  # the compared keys (the job queue's too, without a worker)
    graphs: tuple[str, ...]  # GRAPH.LIST
    bytes: int  # MEMORY USAGE of the compared keys (a graph reports its header only)
    contents: tuple[tuple[str, str], ...]  # each compared key, with a digest of its content

    def changes(self, after: StoreState) -> dict[str, list[str]]:
        """The keys ``after`` added, removed and changed, for an assertion's message."""
        mine, theirs = dict(self.contents), dict(after.contents)
        return {"added": sorted(theirs.keys() - mine.keys()), "removed": sorted(mine.keys() - theirs.keys()),
                "changed": sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]),
                "keys": (self.keys, after.keys), "graphs": (self.graphs, after.graphs), "bytes": (self.bytes, after.bytes)}


def _graph_content(client: redis.Redis, key: bytes) -> bytes:
    # DUMP of a graph differs from call to call; its nodes, edges and indexes do not.
    queries = ("MATCH (n) RETURN id(n), labels(n), properties(n) ORDER BY id(n)",
               "MATCH ()-[e]->() RETURN id(e), type(e), properties(e) ORDER BY id(e)",
               "CALL db.indexes() YIELD label, properties, types RETURN label, properties, types ORDER BY label")
    return repr([client.execute_command("GRAPH.RO_QUERY", key, q)[1] for q in queries]).encode()


def snapshot(url: str, *, worker_running: bool = False) -> StoreState:
    """The stores' state: the server at ``url`` and, when the suite runs on a Redis Cluster,
    every primary of it (tests/conftest.py, ``server_urls``). Counters and FalkorDB's query
    logs (telemetry{<graph>}, written in the background a moment after a graph's queries)
    and the embedding claims (leases that end on their own) are neither compared nor counted;
    with a worker running, neither are the job queue's keys, the outbox's delivery leases nor
    the workers' leases, which it writes at any time. A key that ends between the scan and
    its read (a lease, a job's key) is left out, as if the scan had not seen it."""
    from .conftest import server_urls

    parts = [_server_state(server, worker_running) for server in server_urls(url)]
    return StoreState(keys=sum(p.keys for p in parts), graphs=tuple(sorted(g for p in parts for g in p.graphs)),
                      bytes=sum(p.bytes for p in parts), contents=tuple(sorted(c for p in parts for c in p.contents)))


def _server_state(url: str, worker_running: bool) -> StoreState:
    client = redis.Redis.from_url(url)
    try:
        keys = sorted(k for k in client.scan_iter(count=1000)
                      if not (worker_running and (k.startswith(WORKER_KEYS) or WEBHOOK_DELIVERY.match(k))))
        bookkeeping = [k for k in keys if k.startswith((METRICS_PREFIX, QUERY_LOG_PREFIX, RATE_COUNTER_PREFIX))
                       or (k.startswith(EMBED_CLAIM_PREFIX) and EMBED_CLAIM_MARK in k)]
        keys = [k for k in keys if k not in bookkeeping]
        with client.pipeline(transaction=False) as pipe:  # one round trip per step, however many keys
            for key in keys:
                pipe.type(key)
            kinds = pipe.execute()
            for key, kind in zip(keys, kinds):
                if kind != b"graphdata":
                    pipe.dump(key)
                pipe.memory_usage(key, samples=0)  # every element: the default samples five
            replies = iter(pipe.execute())
        contents = []
        size = 0
        for key, kind in zip(keys, kinds):
            content = _graph_content(client, key) if kind == b"graphdata" else next(replies)
            usage = next(replies)
            if content is None or usage is None:  # it ended between the scan and its read
                continue
            if kind == b"hash":  # by its fields: a hash table's order changes as Redis rehashes it on reads
                content = repr(sorted(client.hgetall(key).items())).encode()
            size += usage
            contents.append((key.decode(errors="backslashreplace"), hashlib.sha256(content).hexdigest()))
        graphs = tuple(sorted(g.decode() for g in client.execute_command("GRAPH.LIST")))
        return StoreState(keys=len(contents), graphs=graphs, bytes=size, contents=tuple(contents))
    finally:
        client.close()
