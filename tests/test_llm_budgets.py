"""LLM budgets and usage per agent (tracker issue 36, item 4; docs/llm-budgets.md).

Against real components: the scripted OpenAI-compatible endpoint on loopback
(tests/fake_llm.py, which counts its calls and the tokens it reports), the real LLM
extractor and consolidator, the embedded FalkorDB/Redis and the service's own formation
with its worker in-process; the HTTP tests run the real app on loopback.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient, InvalidRequest, MemoryClient, PermissionDenied
from memory_service.domain.models import AgentSettings, LLMBudget, MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.formation.budgets import BudgetedConsolidator, Refusal, Reservation, UsageLedger
from memory_service.formation.consolidation import RuleBasedConsolidator
from memory_service.formation.llm_client import StructuredChat
from memory_service.formation.llm_consolidator import ConsolidationFailed, LLMConsolidator
from memory_service.formation.pipeline import WINDOW_RECOVERY_GRACE_SECONDS
from memory_service.http.app import create_app
from memory_service.runtime import open_service
from memory_service.schemas.usage import AgentUsage
from memory_service.state.pools import redis_client

from .conftest import flush, suite_settings
from .fake_llm import EchoLLM
from .helpers import msg

AGENT = "budgeted"
LINES = ["I prefer aisle seats on every flight.", "Always answer me in French, please.",
         "I prefer window tables at restaurants.", "My sister lives in Porto."]


@pytest.fixture
async def echo():
    server = await EchoLLM().start()
    yield server
    await server.stop()


def llm_settings(falkordb_url: str, echo: EchoLLM, **overrides):
    return suite_settings(falkordb_url, extractor="llm", llm_base_url=echo.base_url, llm_model="echo",
                          consolidator="rules", llm_max_attempts=1, memory_formation_msg_interval=1000,
                          memory_formation_token_interval=100_000, **overrides)


@pytest.fixture
async def service(falkordb_url, echo):
    await flush(falkordb_url)
    async with open_service(llm_settings(falkordb_url, echo), run_worker=True) as opened:
        yield opened


async def budget(service, **fields) -> None:
    await service.put_agent(AGENT, AgentSettings(llm_budget=LLMBudget(**fields)))


async def say(service, session: str, lines=LINES, start: int = 0) -> None:
    for i, text in enumerate(lines, start):
        await service.record_message(session, msg(AGENT, "alice", text, mid=f"{session}-{i}", minute=i))


async def test_under_budget_the_llm_forms_the_window_and_its_tokens_are_counted(service, echo):
    await budget(service, tokens_per_day=1_000_000, tokens_per_month=10_000_000)
    await say(service, "s1")
    formed = await service.form_memories("s1")
    assert formed.formed and formed.extractor == "llm" and formed.llm_budget is None and not formed.waiting
    assert echo.extractions == 1
    spent = echo.prompt_tokens + echo.completion_tokens
    usage = await service.agent_usage(AGENT)
    for period in (usage.day, usage.month):
        assert (period.tokens, period.prompt_tokens, period.completion_tokens) == \
               (spent, echo.prompt_tokens, echo.completion_tokens)
        assert (period.calls, period.attempts, period.formations, period.reserved, period.offline_formations) == \
               (1, 1, 1, 0, 0)
    assert usage.day.limit == 1_000_000 and usage.day.remaining == 1_000_000 - spent
    assert usage.month.remaining == 10_000_000 - spent
    assert usage.day.period == time.strftime("%Y-%m-%d", time.gmtime())
    # The window's own tokens: in the answer and the session's last window.
    assert formed.usage is not None and formed.usage["prompt_tokens"] + formed.usage["completion_tokens"] == spent
    last = (await service.session_status("s1"))["last_window"]
    assert last["llm_tokens"] == spent and last["extractor"] == "llm" and last["llm_budget"] is None
    # The deployment's counters and the metrics (no series per agent).
    assert usage.deployment.day.limit is None and not usage.deployment.day.spent


async def test_a_spent_budget_forms_the_window_offline_and_says_why(service, echo):
    await budget(service, tokens_per_day=50)
    await say(service, "s1")
    formed = await service.form_memories("s1")
    assert echo.calls == 0  # the reservation refused the call: none was made
    assert formed.formed and formed.extractor == "rules" and formed.memories  # nothing lost
    assert formed.llm_budget and "agent's daily LLM budget is spent: 0 of 50 tokens used" in formed.llm_budget
    assert formed.llm_budget.endswith("more than the whole budget")
    status = await service.session_status("s1")
    assert status["last_window"]["extractor"] == "rules" and status["last_window"]["llm_budget"] == formed.llm_budget
    assert status["pending_job"] is None and status["formed_windows"] == 1
    usage = await service.agent_usage(AGENT)
    assert (usage.day.tokens, usage.day.calls, usage.day.offline_formations, usage.day.remaining) == (0, 0, 1, 50)
    totals = await service.state.metrics()
    assert totals.get("budget_offline_formations") == 1
    # A memory's provenance names the extractor that formed it, and why.
    backend = (await service.agents.backend_for(AGENT))[1]
    (directive, *_) = await backend.recent(AGENT, Namespace.user(AGENT, "alice"), [MemoryKind.DIRECTIVE], 10)
    window = (await service.memory_detail(AGENT, directive.id)).window
    assert window is not None and (window.extractor, window.llm_tokens, window.llm_budget) == \
           ("rules", 0, formed.llm_budget)


async def test_a_budget_crossed_mid_window_forms_that_whole_window_offline(service, echo):
    await budget(service, tokens_per_day=1_000_000)
    await say(service, "s1", LINES[:2])
    first = await service.form_memories("s1")
    assert first.extractor == "llm" and echo.extractions == 1
    spent = (await service.agent_usage(AGENT)).day.tokens
    # Some budget is left, less than the next window's call would take.
    await budget(service, tokens_per_day=spent + 20)
    await say(service, "s1", LINES[2:], start=2)
    second = await service.form_memories("s1")
    assert echo.extractions == 1  # no call for the second window: never half LLM, half offline
    assert second.formed and second.extractor == "rules" and second.memories
    assert second.llm_budget and f"{spent} of {spent + 20} tokens used" in second.llm_budget
    usage = await service.agent_usage(AGENT)
    assert usage.day.tokens == spent <= usage.day.limit and usage.day.remaining == 20
    # Each window formed once.
    status = await service.session_status("s1")
    assert (status["formed_windows"], status["formed_messages"]) == (2, len(LINES))
    assert (await service.form_memories("s1")).reason == "no pending messages"


async def spend_today(service, tokens: int) -> None:
    """Spend ``tokens`` of the agent's day, as calls of other sessions would have."""
    assert isinstance(await service.usage_ledger.reserve(AGENT, LLMBudget(), tokens), Reservation)


async def test_wait_keeps_the_window_pending_until_the_next_period(service, echo):
    await budget(service, tokens_per_day=100_000, when_spent="wait")
    await spend_today(service, 99_000)
    await say(service, "s1")
    waited = await service.form_memories("s1")
    assert waited.waiting and not waited.formed and waited.reason == "waiting for the LLM budget"
    assert waited.llm_budget and "daily LLM budget is spent" in waited.llm_budget and echo.calls == 0
    status = await service.session_status("s1")
    assert status["pending_job"]["state"] == "claimed" and status["pending_job"]["waiting"] == waited.llm_budget
    assert status["formed_windows"] == 0 and status["gate"]["pending_messages"] == len(LINES)
    # Asked again in the same day: still waiting, still no call.
    assert (await service.form_memories("s1")).waiting and echo.calls == 0
    assert (await service.agent_usage(AGENT)).day.waits == 2
    assert (await service.state.metrics()).get("budget_waits") == 2

    # The next UTC day (the ledger's clock moved on): the recovery cron enqueues the window again.
    service.usage_ledger.clock = lambda: time.time() + 86_400
    await asyncio.sleep(WINDOW_RECOVERY_GRACE_SECONDS + 0.1)
    assert await service.pipeline.recover_windows()
    formed = await service.form_memories("s1")
    assert formed.formed and formed.extractor == "llm" and not formed.waiting
    assert echo.extractions == 1
    status = await service.session_status("s1")
    assert (status["formed_windows"], status["formed_messages"], status["pending_job"]) == (1, len(LINES), None)
    tomorrow = await service.agent_usage(AGENT)
    assert tomorrow.day.formations == 1 and tomorrow.day.waits == 0


async def test_wait_never_holds_a_window_whose_call_exceeds_the_whole_budget(service, echo):
    await budget(service, tokens_per_day=50, when_spent="wait")
    await say(service, "s1")
    formed = await service.form_memories("s1")
    assert formed.formed and not formed.waiting and formed.extractor == "rules" and echo.calls == 0
    assert formed.llm_budget and "more than the whole budget" in formed.llm_budget


async def test_a_raised_budget_lets_a_waiting_window_form_on_the_next_request(service, echo):
    await budget(service, tokens_per_day=100_000, when_spent="wait")
    await spend_today(service, 99_000)
    await say(service, "s1")
    assert (await service.form_memories("s1")).waiting
    await budget(service, tokens_per_day=1_000_000, when_spent="wait")
    formed = await service.form_memories("s1")  # drops the kept "waiting" result and runs the job again
    assert formed.formed and formed.extractor == "llm" and echo.extractions == 1


async def test_the_deployment_cap_holds_for_every_agent(falkordb_url, echo):
    await flush(falkordb_url)
    async with open_service(llm_settings(falkordb_url, echo, llm_tokens_per_day=30), run_worker=True) as service:
        await say(service, "s1")  # the agent has no budget of its own
        formed = await service.form_memories("s1")
        assert formed.extractor == "rules" and echo.calls == 0
        assert formed.llm_budget and "deployment's daily (LLM_TOKENS_PER_DAY) LLM budget" in formed.llm_budget
        usage = await service.agent_usage(AGENT)
        assert usage.day.limit is None and usage.deployment.day.limit == 30 and not usage.deployment.day.spent


async def test_a_failed_call_releases_its_reservation_and_counts_what_it_took(service, echo):
    await budget(service, tokens_per_day=1_000_000)
    await say(service, "s1")
    echo.failures = [400]  # the first try fails (not retryable by the client); the job's retry forms the window
    formed = await service.form_memories("s1")
    assert formed.formed and formed.extractor == "llm" and echo.calls == 2 and echo.extractions == 1
    usage = await service.agent_usage(AGENT)
    assert (usage.day.reserved, usage.day.attempts, usage.day.calls, usage.day.formations) == (0, 2, 1, 1)
    assert usage.day.tokens == echo.prompt_tokens + echo.completion_tokens  # the failed try's estimate released


async def test_reservations_never_let_concurrent_calls_pass_the_budget(falkordb_url):
    await flush(falkordb_url)
    redis = redis_client(falkordb_url, suite_settings(falkordb_url), state=True)
    try:
        ledger = UsageLedger(redis, tokens_per_month=10_000)
        limit = LLMBudget(tokens_per_day=1_000)
        answers = await asyncio.gather(*(ledger.reserve("a1", limit, 300) for _ in range(6)))
        assert sum(isinstance(a, Reservation) for a in answers) == 3  # 900 of 1000; a 4th would cross it
        refused = [a for a in answers if isinstance(a, Refusal)]
        assert refused[0].which == 1 and refused[0].used == 900
        usage = await ledger.usage("a1", limit)
        assert (usage.day.tokens, usage.day.reserved) == (900, 900)
        for reservation in [a for a in answers if isinstance(a, Reservation)]:
            await ledger.settle(reservation, None, None)  # unknown usage (a crash): the estimate stays counted
        usage = await ledger.usage("a1", limit)
        assert (usage.day.tokens, usage.day.reserved, usage.month.tokens) == (900, 0, 900)
        other = await ledger.usage("a2", LLMBudget())
        assert other.day.tokens == 0 and other.day.limit is None and other.day.remaining is None
    finally:
        await redis.aclose()


async def test_a_merge_that_would_cross_the_budget_is_made_by_rule(falkordb_url, echo):
    await flush(falkordb_url)
    redis = redis_client(falkordb_url, suite_settings(falkordb_url), state=True)
    llm = LLMConsolidator(StructuredChat(base_url=echo.base_url, model="echo", max_attempts=1))
    try:
        ledger = UsageLedger(redis)
        budgets = {"a1": LLMBudget(tokens_per_day=40)}

        async def budget_of(agent_id: str) -> LLMBudget:
            return budgets[agent_id]

        merger = BudgetedConsolidator(llm, RuleBasedConsolidator(), ledger, "a1", budget_of)
        items = ["I prefer aisle seats.", "Answer in French."]
        merged = await merger.merge(None, items, 50, subject="alice")
        assert echo.calls == 0 and merged.usage is None and merged.fallback and "daily" in merged.fallback
        assert "aisle" in merged.content
        budgets["a1"] = LLMBudget(tokens_per_day=100_000)
        merged = await merger.merge(None, items, 50, subject="alice")
        assert echo.calls == 1 and merged.fallback is None and merged.usage is not None
        usage = await ledger.usage("a1", budgets["a1"])
        assert (usage.day.consolidations, usage.day.offline_consolidations, usage.day.reserved) == (1, 1, 0)
        assert usage.day.tokens == merged.usage.prompt_tokens + merged.usage.completion_tokens
        echo.failures = [400]  # a failed merge releases its estimate and counts its attempt
        with pytest.raises(ConsolidationFailed):
            await merger.merge(None, items, 50, subject="alice")
        after = await ledger.usage("a1", budgets["a1"])
        assert (after.day.tokens, after.day.reserved, after.day.attempts) == (usage.day.tokens, 0, 2)
    finally:
        await llm.aclose()
        await redis.aclose()


@pytest.mark.parametrize("bad", [
    {"tokens_per_day": 0}, {"tokens_per_day": -5}, {"tokens_per_month": "lots"}, {"tokens_per_day": 1.5},
    {"when_spent": "later"}, {"tokens_per_hour": 10}, {"tokens_per_month": 10**14},
])
async def test_bad_budgets_are_refused_and_nothing_is_stored(falkordb_url, echo, bad):
    await flush(falkordb_url)
    async with LoopbackServer(create_app(llm_settings(falkordb_url, echo), run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        good = await http.put(f"/v1/agents/{AGENT}", json={"llm_budget": {"tokens_per_day": 500}})
        assert good.status_code == 200 and good.json()["llm_budget"] == \
               {"tokens_per_day": 500, "tokens_per_month": None, "when_spent": "offline"}
        refused = await http.put(f"/v1/agents/{AGENT}", json={"llm_budget": bad})
        assert refused.status_code == 422, refused.text
        assert "llm_budget" in refused.text
        assert (await http.get(f"/v1/agents/{AGENT}")).json()["llm_budget"]["tokens_per_day"] == 500
        usage = await http.get(f"/v1/agents/{AGENT}/usage")
        assert usage.status_code == 200 and usage.json()["day"]["limit"] == 500
        assert (await http.get("/v1/agents/no:such/usage")).status_code == 422


OPERATOR_KEY = secrets.token_urlsafe(32)


async def test_the_usage_route_and_the_clients(falkordb_url, echo):
    """GET /v1/agents/{id}/usage needs `read` over all the agent's users (usage is the agent's);
    the async and the sync client's ``usage`` read it, ``put_agent`` sets the budget."""
    await flush(falkordb_url)
    settings = llm_settings(falkordb_url, echo, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=True)) as server, \
            AsyncMemoryClient(server.base_url, OPERATOR_KEY) as operator:
        reader = await operator.create_key(name="reader", role="read", agents=[AGENT])
        alices = await operator.create_key(name="alice's", role="read", agents=[AGENT], users=["alice"])
        others = await operator.create_key(name="other", role="admin", agents=["other"])
        agent = await operator.put_agent(AGENT, llm_budget=LLMBudget(tokens_per_day=1_000_000, when_spent="wait"))
        assert agent.llm_budget.when_spent == "wait"
        for i, text in enumerate(LINES):
            await operator.record("s1", agent_id=AGENT, user_id="alice", role="user", content=text, message_id=f"m{i}")
        formed = await operator.form("s1")
        assert formed.formed and formed.extractor == "llm" and formed.llm_budget is None

        async with AsyncMemoryClient(server.base_url, reader.key) as client:
            usage = await client.usage(AGENT)
        assert usage.day.formations == 1 and usage.day.tokens == echo.prompt_tokens + echo.completion_tokens
        assert usage.budget == LLMBudget(tokens_per_day=1_000_000, when_spent="wait")

        def sync_usage() -> AgentUsage:
            with MemoryClient(server.base_url, reader.key) as client:
                return client.usage(AGENT)

        assert (await asyncio.to_thread(sync_usage)) == usage
        for key, refused in ((alices.key, PermissionDenied), (others.key, PermissionDenied)):
            async with AsyncMemoryClient(server.base_url, key) as client:
                with pytest.raises(refused):
                    await client.usage(AGENT)
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            assert (await http.get(f"/v1/agents/{AGENT}/usage")).status_code == 401
        with pytest.raises(InvalidRequest):
            await operator.put_agent(AGENT, llm_budget={"tokens_per_day": 0})
        assert (await operator.usage(AGENT)).budget.tokens_per_day == 1_000_000


async def test_a_window_extracted_offline_stays_offline_on_its_retry(falkordb_url, echo, monkeypatch):
    """A try that dies after storing the offline extraction: the retry, with the budget raised
    meanwhile, writes the stored extraction and asks no extractor (docs/formation.md)."""
    await flush(falkordb_url)
    async with open_service(llm_settings(falkordb_url, echo), run_worker=False) as service:
        await budget(service, tokens_per_day=50)
        await say(service, "s1")
        assert await service.formation.schedule("s1")  # claimed; no worker runs the job
        window = (await service.formation.windows.load("s1")).claim.window
        _, backend = await service.agents.backend_for(AGENT)
        write = type(backend).write

        async def dies(self, memories):
            raise ConnectionError("the store went away")

        monkeypatch.setattr(type(backend), "write", dies)
        with pytest.raises(ConnectionError):
            await service.pipeline.run_formation("s1", window)
        stored = await service.formation.windows.load("s1")
        assert stored.state.value == "extracted" and stored.extraction.extractor == "rules"
        monkeypatch.setattr(type(backend), "write", write)
        await budget(service, tokens_per_day=1_000_000)
        summary = await service.pipeline.run_formation("s1", window)
        assert summary.formed and summary.extractor == "rules" and summary.llm_budget and echo.calls == 0
        status = await service.session_status("s1")
        assert (status["formed_windows"], status["formed_messages"]) == (1, len(LINES))
        usage = await service.agent_usage(AGENT)
        assert (usage.day.offline_formations, usage.day.formations, usage.day.tokens) == (1, 0, 0)
