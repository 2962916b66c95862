"""What the framework adapters' tests share (tests/test_integration_*.py): a real server on
loopback with memory writes on for AGENT (pop_item and the write tools need them) and not for
READ_ONLY, a client of it on a flushed store, the messages a session recorded, and the example
code of a docs/integrations page."""

from __future__ import annotations

import pytest

from memory_service.backends.loopback import LoopbackServer, free_port
from memory_service.client import AsyncMemoryClient
from memory_service.http.app import create_app

from .conftest import REPO, flush, suite_settings

AGENT, READ_ONLY, USER = "trip-planner", "bystander", "alice"


@pytest.fixture(scope="module")
async def memory_server(falkordb_url):
    settings = suite_settings(falkordb_url, memory_write_agents=[AGENT])
    async with LoopbackServer(create_app(settings, run_worker=True)) as server:
        yield server


@pytest.fixture
async def memory(memory_server, falkordb_url):
    """A client of the server, on a flushed store."""
    await flush(falkordb_url)
    async with AsyncMemoryClient(memory_server.base_url) as client:
        yield client


@pytest.fixture
async def unreachable():
    """A client of a loopback port nothing listens on: the service down."""
    async with AsyncMemoryClient(f"http://127.0.0.1:{free_port()}", max_retries=0) as client:
        yield client


async def recorded(client: AsyncMemoryClient, session_id: str, agent_id: str = AGENT, state: str = "live") -> list[tuple[str, str]]:
    """(role, content) of the session's recorded messages, in the order recorded."""
    messages = [m async for m in client.iter_memories(agent_id, session_id=session_id, kinds=["message"], state=state)]
    return [(str(m.provenance.role), m.content) for m in sorted(messages, key=lambda m: m.provenance.sequence)]


def page_example(page: str, heading: str) -> str:
    """The first Python block after ``heading`` on docs/integrations/<page>."""
    text = (REPO / "docs" / "integrations" / page).read_text()
    start = text.index("```python\n", text.index(heading)) + len("```python\n")
    return text[start:text.index("```", start)]
