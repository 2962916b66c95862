"""Would a write succeed now? What readiness (``GET /health``) asks each Redis-protocol store.

A PING is not enough: a server that has just started answers PING as soon as it listens
(or answers ``LOADING`` while it reads its RDB/AOF, which a probe would count as up if it
only checked the connection), a replica answers PING and refuses every write, and a server
whose last save failed refuses writes (``MISCONF``) while it answers PING. ``refusal``
reads the server's own INFO (allowed while loading) on each primary and names the first
reason a write would fail, without writing anything (readiness must not change the store:
tests/test_reads_create_nothing.py).
"""

from __future__ import annotations

from typing import Any

from memory_service.state.pools import each_primary


async def check(client: Any) -> tuple[str | None, tuple[str, ...]]:
    """(None if every primary of ``client`` would take a write now, else why not; the run ids
    of its primaries: a new one means a server started since, its data loaded again)."""
    runs: list[str] = []
    for address, node in await each_primary(client):
        info = await node.execute_command("INFO", "server", "persistence", "replication")
        if "role" not in info and info and all(isinstance(v, dict) for v in info.values()):
            info = next(iter(info.values()))  # a cluster client's reply names its node
        where = f" ({address})" if address else ""
        if str(info.get("loading", 0)) == "1" or str(info.get("async_loading", 0)) == "1":
            return f"the store is loading its data{where}", ()
        if info.get("role", "master") != "master":
            return f"the store is a replica{where}: it refuses writes", ()
        if info.get("aof_last_write_status", "ok") != "ok":
            return f"the store cannot write its append-only file{where}: it refuses writes", ()
        runs.append(str(info.get("run_id", "")))
    return None, tuple(sorted(runs))


async def refusal(client: Any) -> str | None:
    """None if every primary of ``client`` would take a write now, else why not."""
    return (await check(client))[0]


async def report(client: Any) -> dict[str, Any]:
    """``client``'s part of a readiness report: ``{"ok": True}``, or ``ok`` False with the
    reason (an error reaching it included: a report never raises)."""
    try:
        why = await refusal(client)
    except Exception as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True} if why is None else {"ok": False, "error": why}
