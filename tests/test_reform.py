"""Re-forming formed windows with the extractor configured now (memory_service/curation/reformation.py,
docs/reform.md): windows formed by the offline extractor, re-formed by the real LLM extractor
against the scripted endpoint (tests/fake_llm.py, which counts its calls); a dry run; a run
resumed; memories written by tools left alone; bad input.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_service.curation.tools import MemoryWrite
from memory_service.domain.errors import InvalidInput, NotFound
from memory_service.domain.models import MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.runtime import open_service
from memory_service.schemas.lifecycle import ReformIn

from .conftest import suite_settings
from .fake_llm import EchoLLM
from .helpers import msg

AGENT = "planner"
SESSIONS = {
    "s-ada": ("ada", ["I am planning a trip to Lisbon next month.", "Please always answer me in short sentences.",
                      "I prefer window seats on long flights."]),
    "s-bo": ("bo", ["Please always reply in French.", "We are visiting Oslo in the spring."]),
}


@pytest.fixture
async def llm():
    server = await EchoLLM().start()
    yield server
    await server.stop()


async def formed_offline(settings) -> str:
    """Both sessions formed by the rule extractor; a memory written by a tool; its id."""
    async with open_service(settings.model_copy(update={"memory_write_agents": ["*"]}), run_worker=True) as service:
        for session, (user, lines) in SESSIONS.items():
            for i, line in enumerate(lines):
                await service.record_message(session, msg(AGENT, user, line, mid=f"{session}-{i}", minute=i))
            assert (await service.form_memories(session)).formed
        tool = await service.memory_write(AGENT, MemoryWrite(content="Ada keeps bees.", namespace=f"user:{AGENT}:ada",
                                                             kind=MemoryKind.FACT))
        return tool.id


def with_llm(settings, llm: EchoLLM):
    return suite_settings(settings.falkordb_url, extractor="llm", llm_base_url=llm.base_url, llm_model="echo")


async def formed_ids(service, session: str) -> list[str]:
    return [w[1]["memory_ids"] for w in await service.state.formed_windows(session)][0]


async def test_windows_formed_offline_are_re_formed_by_the_llm_once(settings, llm):
    tool_id = await formed_offline(settings)
    async with open_service(with_llm(settings, llm), run_worker=False) as service:
        before = {s: await formed_ids(service, s) for s in SESSIONS}
        dry = await service.reform(AGENT, ReformIn(dry_run=True))
        assert (dry.windows, dry.sessions, dry.llm_calls, dry.reformed, dry.extractor) == (2, 2, 2, 0, "llm")
        assert llm.calls == 0 and {s: await formed_ids(service, s) for s in SESSIONS} == before  # nothing changed
        seen: list[tuple[int, int]] = []
        report = await service.reform(AGENT, ReformIn(run_id="to-llm"), on_progress=lambda d, t: seen.append((d, t)))
        assert (report.reformed, report.llm_calls, report.done) == (2, 2, True) and llm.extractions == 2
        assert seen == [(1, 2), (2, 2)]
        _, backend = await service.agents.backend_for(AGENT)
        for session in SESSIONS:
            entry = (await service.state.formed_windows(session))[0][1]
            assert entry["extractor"] == "llm" and entry["reforms"] == 1 and entry["op"] == "reform:to-llm"
            assert set(entry["replaced"]) == set(before[session]) - set(entry["memory_ids"])
            assert not await backend.find(AGENT, entry["replaced"])  # never both
            assert len(await backend.find(AGENT, entry["memory_ids"])) == len(entry["memory_ids"])  # never neither
            episodes = [m for m in await backend.export(AGENT, Namespace.session(session)) if m.kind is MemoryKind.EPISODE]
            assert len(episodes) == 1 and episodes[0].id in entry["memory_ids"]
        assert [m.live for m in await backend.find(AGENT, [tool_id])] == [True]  # a tool's memory is never touched
        # The same run again: nothing left to do, no extractor call.
        again = await service.reform(AGENT, ReformIn(run_id="to-llm"))
        assert (again.reformed, again.skipped, again.done, llm.extractions) == (0, 2, True, 2)
        audit = (await service.audit_page(AGENT, action="memory.reform")).entries
        assert [e.target for e in audit] == ["to-llm", "to-llm"]


async def test_a_run_chooses_by_user_session_and_date_and_is_limited(settings, llm):
    await formed_offline(settings)
    async with open_service(with_llm(settings, llm), run_worker=False) as service:
        assert (await service.reform(AGENT, ReformIn(user_id="bo", dry_run=True))).windows == 1
        assert (await service.reform(AGENT, ReformIn(session_id="s-ada", dry_run=True))).windows == 1
        assert (await service.reform(AGENT, ReformIn(session_id="s-ada", user_id="bo", dry_run=True))).windows == 0
        future = datetime.now(UTC) + timedelta(days=1)
        assert (await service.reform(AGENT, ReformIn(since=future, dry_run=True))).windows == 0
        first = await service.reform(AGENT, ReformIn(run_id="slow", limit=1))
        assert (first.reformed, first.done) == (1, False)
        rest = await service.reform(AGENT, ReformIn(run_id="slow", limit=1))
        assert (rest.reformed, rest.done) == (1, True) and llm.extractions == 2


async def test_bad_input_is_refused_and_changes_nothing(settings, llm):
    await formed_offline(settings)
    async with open_service(with_llm(settings, llm), run_worker=False) as service:
        before = {s: await formed_ids(service, s) for s in SESSIONS}
        with pytest.raises(NotFound):
            await service.reform(AGENT, ReformIn(session_id="no-such-session"))
        with pytest.raises(NotFound):  # another agent's session is an unknown one
            await service.reform("other-agent", ReformIn(session_id="s-ada"))
        with pytest.raises(ValueError):
            ReformIn(since=datetime(2026, 1, 1))  # no time zone
        from memory_service.curation.reformation import parse_since

        with pytest.raises(InvalidInput):
            parse_since("next tuesday")
        assert (await service.reform("unknown-agent", ReformIn())).windows == 0
        assert {s: await formed_ids(service, s) for s in SESSIONS} == before and llm.calls == 0
