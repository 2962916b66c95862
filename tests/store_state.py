"""What the store holds, compared before and after a request: every key and graph, by content."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import redis

# Counters of what the service did (reads served included): they change on any request.
METRICS_KEY = b"ms:metrics"
# The job queue's keys (arq:*): the worker's cron jobs write them on their own schedule.
JOB_QUEUE_PREFIX = b"arq:"


@dataclass(frozen=True)
class StoreState:
    keys: int  # DBSIZE, or the keys counted when some are left out
    graphs: tuple[str, ...]  # GRAPH.LIST
    bytes: int  # MEMORY USAGE of every key but the metrics (a graph reports its header only)
    digest: str  # of every key's name and content but the metrics'


def _graph_content(client: redis.Redis, key: bytes) -> bytes:
    # DUMP of a graph differs from call to call; its nodes, edges and indexes do not.
    queries = ("MATCH (n) RETURN id(n), labels(n), properties(n) ORDER BY id(n)",
               "MATCH ()-[e]->() RETURN id(e), type(e), properties(e) ORDER BY id(e)",
               "CALL db.indexes() YIELD label, properties, types RETURN label, properties, types ORDER BY label")
    return repr([client.execute_command("GRAPH.RO_QUERY", key, q)[1] for q in queries]).encode()


def snapshot(url: str, *, with_job_queue: bool = True) -> StoreState:
    """The store's state. ``with_job_queue=False`` leaves out the arq:* keys (for tests that
    run a worker, whose cron jobs write them at any time)."""
    client = redis.Redis.from_url(url)
    try:
        keys = sorted(k for k in client.scan_iter(count=1000) if with_job_queue or not k.startswith(JOB_QUEUE_PREFIX))
        digest = hashlib.sha256()
        size = 0
        for key in keys:
            if key == METRICS_KEY:
                continue
            kind = client.type(key)
            content = _graph_content(client, key) if kind == b"graphdata" else client.dump(key) or b""
            digest.update(b"%d:%s%d:%s" % (len(key), key, len(content), content))
            size += client.memory_usage(key) or 0
        graphs = tuple(sorted(g.decode() for g in client.execute_command("GRAPH.LIST")))
        count = client.dbsize() if with_job_queue else len(keys)
        return StoreState(keys=count, graphs=graphs, bytes=size, digest=digest.hexdigest())
    finally:
        client.close()
