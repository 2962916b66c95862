"""The installed `memory-service` command, run as a user runs it."""

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import httpx

from .conftest import clean_env, free_port

CLI = str(Path(sys.executable).parent / "memory-service")


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = clean_env()
    env["COLUMNS"] = "200"
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_demo_prints_a_memory_block_with_all_three_sections(tmp_path):
    result = run("demo", "--data-dir", str(tmp_path / "demo"))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    start, end = out.index("<MemoryContext>"), out.index("</MemoryContext>") + len("</MemoryContext>")
    root = ET.fromstring(out[start:end])
    sections = [e.tag for e in root]
    assert [t for t in sections if t != "KnownFacts"] == ["CollectiveMemory", "UserMemory", "CurrentConversationContext",
                                                          "RelevantMemories"]
    assert len(list(root.iter("Episode"))) >= 1 and len(list(root.iter("Directive"))) >= 1
    assert len(list(root.iter("Fact"))) + len(list(root.iter("Suggestion"))) >= 1
    assert "What was formed" in out
    # The knowledge graph formation built from the conversation, through the API.
    graph = out[out.index("the knowledge graph, "):]
    assert int(graph.split("the knowledge graph, ")[1].split(" ")[0]) >= 2 and "(person)" in graph


def test_demo_rejects_a_data_dir_in_use(tmp_path):
    from memory_service.backends.embedded import EmbeddedFalkorDB

    held = EmbeddedFalkorDB(tmp_path / "busy")
    held.start()
    try:
        result = run("demo", "--data-dir", str(tmp_path / "busy"), timeout=60)
    finally:
        held.stop()
    assert result.returncode != 0
    assert "in use by another memory-service process" in result.stdout + result.stderr


def test_cli_usage_errors_exit_nonzero_with_a_sentence():
    result = run("serve", "--port", "0")
    assert result.returncode == 2 and "port" in (result.stdout + result.stderr).lower()


async def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(300):
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stderr.read()}")
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("serve did not become healthy")


async def test_two_servers_with_two_data_dirs_share_nothing(tmp_path):
    env = clean_env()
    procs, urls = [], []
    try:
        for name in ("one", "two"):
            port = free_port()
            procs.append(subprocess.Popen([CLI, "serve", "--port", str(port), "--data-dir", str(tmp_path / name),
                                           "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            await _wait_healthy(url, proc)
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"agent_id": "a1", "user_id": "u1", "role": "user", "content": "only in one", "message_id": "m1"}
            first = (await client.post(f"{urls[0]}/v1/sessions/s1/messages", json=body)).json()
            other = (await client.post(f"{urls[1]}/v1/sessions/s1/messages", json={**body, "agent_id": "a2"})).json()
            assert first["duplicate"] is False and other["duplicate"] is False  # a2 may own s1 in server two
            await client.put(f"{urls[0]}/v1/agents/a1", json={"agent_extras": {"where": "one"}})
            assert (await client.get(f"{urls[1]}/v1/agents/a1")).status_code == 404
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught.
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not list(tmp_path.glob("*/falkordb.pid"))  # each server stopped its embedded store


async def test_backfill_embeddings_embeds_what_was_stored_without(settings):
    """Memories stored while the embedder was down, embedded by the command; with the
    embedder unreachable it fails with a sentence and changes nothing."""
    from memory_service.backends.graph import GraphBackend
    from memory_service.runtime import open_service

    from .helpers import msg

    async with open_service(settings, run_worker=False) as service:
        service.sessions.embedder, saved = None, service.sessions.embedder  # as if the embedder were down
        for i in range(5):
            await service.record_message("s1", msg("a1", "alice", f"note {i} about the garden shed", mid=f"m{i}"))
        service.sessions.embedder = saved
    env = {**clean_env(), "FALKORDB_URL": settings.falkordb_url, "EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64",
           "COLUMNS": "200"}

    async def backfill(**extra: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(CLI, "backfill-embeddings", "--batch", "2", env={**env, **extra},
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return proc.returncode if await proc.wait() is not None else -1, (await proc.stdout.read()).decode()

    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=64)
    try:
        code, out = await backfill(EMBEDDER="openai", EMBEDDING_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
                                   EMBEDDING_MODEL="m")
        assert code == 1 and "backfill failed" in out, out
        assert len(await backend.unembedded("a1", 10)) == 5
        code, out = await backfill()
        assert code == 0 and "5 memories embedded" in out, out
        assert await backend.unembedded("a1", 10) == []
        code, out = await backfill()
        assert code == 0 and "0 memories embedded" in out, out
    finally:
        await backend.close()
