"""After an erasure, the Redis servers' files written again without the erased data.

A Redis server with the append-only file on keeps every write it ever acknowledged, the
erased user's among them, until the file is rewritten; its RDB snapshot keeps them until
the next save. So an erasure that removed anything asks each server it used (the state
Redis, the graph's FalkorDB: the same server on the embedded default) for BGREWRITEAOF,
waits for that rewrite to finish (at most ``wait_seconds``: a large store takes longer; the
report then says "requested") and, where snapshots are configured, for BGSAVE SCHEDULE
(the next snapshot, written once the rewrite is done, not awaited).

A rewrite already running was forked before the erasure and still holds the data: it is
let finish and a new one is asked for. A managed Redis may refuse these commands; the
report says so and its operator's schedule applies.

On a Redis Cluster each primary keeps files of its own: every primary is asked (a cluster
client would send INFO and BGSAVE to one default node), and the report names each by its
address ("state+graph 10.0.0.5:6379"). Replicas rewrite their own files on their own
schedule.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from memory_service.state.pools import each_primary

WAIT_SECONDS = 30.0  # how long an erasure waits for a rewrite to finish
POLL_SECONDS = 0.05


async def _persistence(server: Any) -> dict[str, Any]:
    info: dict[str, Any] = await server.info("persistence")
    return info


async def _server_id(server: Any) -> str:
    info = await server.info("server")
    return str(info.get("run_id"))


async def rewrite(servers: list[tuple[str, Any]], wait_seconds: float = WAIT_SECONDS) -> dict[str, str]:
    """Rewrite the files of each distinct server (named by the stores using it, e.g.
    "state+graph", and on a cluster by its address too), all at once: "rewritten",
    "requested" (still running after ``wait_seconds``), "aof off" or "refused: <why>", with
    "; snapshot scheduled" when RDB saves are on."""
    distinct: dict[str, tuple[list[str], str | None, Any]] = {}
    unknown: dict[str, str] = {}
    for name, client in servers:
        try:
            nodes = await each_primary(client)
        except Exception as exc:  # a cluster whose nodes cannot be learnt now
            unknown[name] = _refused(exc)
            continue
        for address, server in nodes:
            try:
                run_id = await _server_id(server)
            except Exception:  # INFO refused: the rewrite will say why
                run_id = f"?{name} {address}"
            distinct.setdefault(run_id, ([], address, server))[0].append(name)
    named = {"+".join(names) + (f" {address}" if address else ""): server for names, address, server in distinct.values()}
    done = await asyncio.gather(*(_rewrite_one(server, wait_seconds) for server in named.values()))
    return {**dict(zip(named, done, strict=True)), **unknown}


def _refused(exc: Exception) -> str:
    return f"refused: {type(exc).__name__}: {str(exc)[:200]}"


async def _rewrite_one(server: Any, wait_seconds: float) -> str:
    deadline = time.monotonic() + wait_seconds
    try:
        info = await _persistence(server)
        if not int(info.get("aof_enabled", 0)):
            state = "aof off"
        else:
            while int(info.get("aof_rewrite_in_progress", 0)) and time.monotonic() < deadline:
                await asyncio.sleep(POLL_SECONDS)  # forked before the erasure: let it finish, then ask again
                info = await _persistence(server)
            done_before = int(info.get("aof_rewrites", 0))
            await server.execute_command("BGREWRITEAOF")
            state = "requested"
            while time.monotonic() < deadline:
                info = await _persistence(server)
                if (int(info.get("aof_rewrites", 0)) > done_before and not int(info.get("aof_rewrite_in_progress", 0))
                        and not int(info.get("aof_rewrite_scheduled", 0))):
                    ok = str(info.get("aof_last_bgrewrite_status", "ok")) == "ok"
                    state = "rewritten" if ok else "failed: see the server's log"
                    break
                await asyncio.sleep(POLL_SECONDS)
        save = await server.config_get("save")
        if any(str(v).strip() for v in save.values()):
            await server.execute_command("BGSAVE", "SCHEDULE")
            state += "; snapshot scheduled"
        return state
    except Exception as exc:  # e.g. a managed Redis without these commands: reported, not raised
        return _refused(exc)
