"""A crash in the middle of a forget and of a re-formation (docs/forget.md, docs/reform.md):
the `memory-service forget` / `reform` process is SIGKILLed as its swap of a window's
memories goes up to the store (a TCP proxy on its connection sees the statement, kills the
process and drops the statement: it never runs). Run again, each finishes: the window is
re-formed once, from the extraction stored before the crash (the scripted LLM endpoint
counts the calls), the forgotten sentence is nowhere.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from memory_service.domain.models import MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.formation.steps import message_memory_id
from memory_service.runtime import open_service

from .conftest import clean_env
from .fake_llm import EchoLLM
from .helpers import msg, wait_embedded
from .tcp_proxy import TcpProxy
from .test_erasure import graph_findings, redis_findings
from .test_worker import make_settings, store, url  # noqa: F401 (fixtures)

CLI = str(Path(sys.executable).parent / "memory-service")
SWAP = b"UNWIND $old AS id"  # the one statement that replaces a window's memories (GraphBackend.swap)
AGENT, ADA = "family", "ada"
LINES = ["I am planning a trip to Lisbon next month with my sister.",
         "My grandmother's maiden name is Quillfeather, and she was born in Dundee.",
         "I prefer window seats on long flights.", "Please always answer me in short sentences."]
NEEDLES = ("quillfeather", "dundee")


class Cli:
    """One `memory-service` command, SIGKILLed by the proxy's tap when ``needle`` goes up."""

    def __init__(self, args: list[str], env: dict[str, str], needle: bytes | None = None):
        self.args, self.env, self.needle = args, env, needle
        self.proc: asyncio.subprocess.Process | None = None
        self.killed = False

    def tap(self, connection: int, direction: str, data: bytes) -> bool:
        if direction == "up" and self.needle is not None and self.needle in data and not self.killed:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.killed = True
        return not self.killed  # nothing more reaches the store from the dying process

    async def run(self) -> tuple[int, str]:
        self.proc = await asyncio.create_subprocess_exec(CLI, *self.args, env=self.env, stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout=120)
        return int(self.proc.returncode or 0), out.decode()


def cli_env(store_url: str, **extra: str) -> dict[str, str]:
    env = clean_env()
    env.update(FALKORDB_URL=store_url, REDIS_URL=store_url, EMBEDDER="hash", EMBEDDING_DIMENSION="64", **extra)
    return env


async def proxied(url: str) -> TcpProxy:
    parts = urlsplit(url)
    proxy = await TcpProxy(parts.hostname, parts.port).start()
    proxy.password = parts.password
    return proxy


async def test_a_hard_forget_killed_mid_swap_is_finished_once_by_the_next_run(url, tmp_path):
    settings = make_settings(url, memory_formation_msg_interval=100)
    async with open_service(settings, run_worker=True) as service:
        for i, line in enumerate(LINES):
            await service.record_message("kitchen", msg(AGENT, ADA, line, mid=f"kitchen-{i}", minute=i))
        assert (await service.form_memories("kitchen")).formed
        await wait_embedded(service, AGENT)
        before = (await service.state.formed_windows("kitchen"))[0][1]["memory_ids"]
    target = message_memory_id("kitchen", "kitchen-1")

    proxy = await proxied(url)
    cli = Cli(["forget", "--agent", AGENT, "--hard", "--json", target], cli_env(proxy.url), needle=SWAP)
    proxy.tap = cli.tap
    try:
        code, out = await cli.run()
    finally:
        await proxy.stop()
    assert cli.killed and code == -signal.SIGKILL, out

    async with open_service(settings, run_worker=False) as service:
        _, backend = await service.agents.backend_for(AGENT)
        # The crash's state: the message gone, the window's old memories still there, both plans kept.
        assert not await backend.find(AGENT, [target])
        assert len(await backend.find(AGENT, before)) == len(before)
        assert await service.forgetter.unfinished(AGENT) == [target]
        assert len(await service.reformer.in_progress("kitchen")) == 1  # planned or extracted, not swapped

    code, out = await Cli(["forget", "--agent", AGENT, "--resume", "--json"], cli_env(url)).run()
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["id"] == target and report["mode"] == "hard" and len(report["reformed"]) == 1

    async with open_service(settings, run_worker=False) as service:
        _, backend = await service.agents.backend_for(AGENT)
        entry = (await service.state.formed_windows("kitchen"))[0][1]
        assert entry["reforms"] == 1 and not set(entry["memory_ids"]) & set(before)
        assert not await backend.find(AGENT, before)
        episodes = [m for m in await backend.export(AGENT, Namespace.session("kitchen")) if m.kind is MemoryKind.EPISODE]
        assert len(episodes) == 1 and episodes[0].id in entry["memory_ids"]
        assert not await service.forgetter.unfinished(AGENT) and not await service.reformer.in_progress("kitchen")
        assert await redis_findings(url, NEEDLES) == [] and await graph_findings(url, NEEDLES) == []
    # Asked again, nothing is left to forget.
    code, out = await Cli(["forget", "--agent", AGENT, "--hard", target], cli_env(url)).run()
    assert code == 2 and "no such memory" in out


async def test_a_reform_killed_after_its_extraction_reuses_it_and_forms_each_window_once(url, tmp_path):
    settings = make_settings(url, memory_formation_msg_interval=100)
    async with open_service(settings, run_worker=True) as service:
        for session in ("s1", "s2"):
            for i, line in enumerate(LINES[:1] + LINES[2:]):
                await service.record_message(session, msg(AGENT, ADA, line, mid=f"{session}-{i}", minute=i))
            assert (await service.form_memories(session)).formed
    llm = await EchoLLM().start()
    proxy = await proxied(url)
    llm_env = {"EXTRACTOR": "llm", "LLM_BASE_URL": llm.base_url, "LLM_MODEL": "echo"}
    try:
        cli = Cli(["reform", "--agent", AGENT, "--run-id", "r1", "--json"], cli_env(proxy.url, **llm_env), needle=SWAP)
        proxy.tap = cli.tap
        code, out = await cli.run()
        assert cli.killed and code == -signal.SIGKILL, out
        assert llm.extractions == 1  # the first window's extraction was stored, then the process died
        code, out = await Cli(["reform", "--agent", AGENT, "--run-id", "r1", "--json"], cli_env(url, **llm_env)).run()
        assert code == 0, out
        report = json.loads(out.strip().splitlines()[-1])
        assert report["done"] and report["reformed"] == 2 and report["llm_calls"] == 1
        assert llm.extractions == 2  # one call per window in all: the stored extraction was reused
    finally:
        await proxy.stop()
        await llm.stop()
    async with open_service(settings, run_worker=False) as service:
        _, backend = await service.agents.backend_for(AGENT)
        for session in ("s1", "s2"):
            entry = (await service.state.formed_windows(session))[0][1]
            assert entry["reforms"] == 1 and entry["extractor"] == "llm" and entry["op"] == "reform:r1"
            episodes = [m for m in await backend.export(AGENT, Namespace.session(session))
                        if m.kind is MemoryKind.EPISODE]
            assert [e.id for e in episodes] == [i for i in entry["memory_ids"] if i in {e.id for e in episodes}]
            assert len(episodes) == 1
