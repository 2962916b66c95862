"""LLM budgets: what each agent's formation and consolidation may spend, counted in Redis.

Why reserve before the call: a call's tokens are known only once it answered, and a budget
checked after the fact is crossed by every call in flight at once. So each call first
*reserves* an estimate of its tokens (its prompt's characters / 4, plus an allowance for
the reply) against the agent's day and month and the deployment's day and month, in ONE
script on the ``{llm}`` slot (memory_service/state/keyspace.py): if the estimate would take
any of them past its limit, nothing is counted and the call is not made. Once it answered,
the reservation is *settled*: the estimate is replaced by the tokens the endpoint reported.
A worker killed mid-call never settles: its estimate stays counted (the budget errs on
the safe side), and the retry reserves again.

A window whose call would cross a budget is extracted whole by the offline (rule)
extractor, the reason kept with its stored extraction, or, with ``when_spent: wait``,
left claimed: the job ends with ``waiting`` and the window is tried again (by the
``recover_windows`` cron every minute, a new message's gate or ``POST /form``) until a
period turns or the budget is raised. A call estimated above a whole budget could wait for
ever: it is made offline in both modes. The decision is made once per extraction, before
the window's state moves, so it never mixes an LLM's and the offline extractor's items in
one window, and a stored extraction is never asked for again (memory_service/formation/
window.py). A merge (consolidation) that would cross a budget is made by rule, in both
modes: its items are already formed, and waiting would only hold the memory block back.

Per-agent counters are served by GET /v1/agents/{id}/usage; Prometheus gets the
deployment's counts only (``budget_offline_formations``, ``budget_waits``,
``budget_offline_consolidations``): a series per agent would grow without bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from redis.asyncio import Redis

from memory_service.domain.models import LLMBudget
from memory_service.formation.consolidation import Consolidator, Merged
from memory_service.formation.extractor import (
    Extraction,
    ExtractionFailed,
    ExtractionUsage,
    Extractor,
    GraphExtractor,
    KnownLimits,
    Window,
)
from memory_service.schemas.usage import AgentUsage, DeploymentCap, DeploymentCaps, PeriodUsage
from memory_service.state import keyspace

log = logging.getLogger(__name__)

# A period's counters are kept this long after it ends (yesterday's usage stays readable).
KEEP_AFTER_PERIOD_SECONDS = 86_400

# Reserve ARGV[1] tokens on KEYS[1..4] (agent day, agent month, deployment day, deployment
# month) unless one of them would pass its limit (ARGV[2..5], '' for none): then {i, used}
# of the first such key and nothing is counted; else {0}. ARGV[6], ARGV[7]: when the day's
# and the month's keys expire.
_RESERVE = """
local need = tonumber(ARGV[1])
for i = 1, 4 do
  if ARGV[i + 1] ~= '' then
    local used = tonumber(redis.call('HGET', KEYS[i], 'tokens') or '0')
    if used + need > tonumber(ARGV[i + 1]) then return {i, tostring(used)} end
  end
end
for i = 1, 4 do
  redis.call('HINCRBY', KEYS[i], 'tokens', need)
  redis.call('HINCRBY', KEYS[i], 'reserved', need)
  redis.call('EXPIREAT', KEYS[i], ARGV[6 + (i + 1) % 2])
end
return {0}
"""

# Settle a reservation of ARGV[1] tokens on KEYS[1..4]: ARGV[2] (the tokens the calls took)
# replaces it; ARGV[3], ARGV[4] as _RESERVE's expiries; the field/value pairs after are added.
_SETTLE = """
for i = 1, 4 do
  redis.call('HINCRBY', KEYS[i], 'tokens', tonumber(ARGV[2]) - tonumber(ARGV[1]))
  redis.call('HINCRBY', KEYS[i], 'reserved', -tonumber(ARGV[1]))
  for j = 5, #ARGV, 2 do redis.call('HINCRBY', KEYS[i], ARGV[j], ARGV[j + 1]) end
  redis.call('EXPIREAT', KEYS[i], ARGV[3 + (i + 1) % 2])
end
return 1
"""


@dataclass(frozen=True, slots=True)
class Periods:
    """The UTC day and month a moment falls in, as key suffixes, and when each ends."""

    day: str
    day_ends: datetime
    month: str
    month_ends: datetime

    @classmethod
    def at(cls, now: float) -> Periods:
        moment = datetime.fromtimestamp(now, UTC)
        day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        month = day.replace(day=1)
        next_month = (month + timedelta(days=32)).replace(day=1)
        return cls(day.strftime("d%Y-%m-%d"), day + timedelta(days=1), month.strftime("m%Y-%m"), next_month)

    def keys(self, agent_id: str) -> list[str]:
        return [keyspace.llm_usage(agent_id, self.day), keyspace.llm_usage(agent_id, self.month),
                keyspace.llm_usage(None, self.day), keyspace.llm_usage(None, self.month)]

    def expiries(self) -> list[int]:
        return [int(self.day_ends.timestamp()) + KEEP_AFTER_PERIOD_SECONDS,
                int(self.month_ends.timestamp()) + KEEP_AFTER_PERIOD_SECONDS]


@dataclass(frozen=True, slots=True)
class Reservation:
    agent_id: str
    tokens: int
    periods: Periods


_SCOPES = ("", "the agent's daily", "the agent's monthly", "the deployment's daily (LLM_TOKENS_PER_DAY)",
           "the deployment's monthly (LLM_TOKENS_PER_MONTH)")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call that would take a budget past its limit: which one, and by how much."""

    which: int  # 1 agent day, 2 agent month, 3 deployment day, 4 deployment month
    used: int
    limit: int
    need: int
    resets_at: datetime

    @property
    def never_fits(self) -> bool:
        """The call alone is estimated above the whole budget: waiting for a period would not help."""
        return self.need > self.limit

    @property
    def reason(self) -> str:
        reason = (f"{_SCOPES[self.which]} LLM budget is spent: {self.used} of {self.limit} tokens used, and this "
                  f"call was estimated at {self.need}")
        if self.never_fits:
            return reason + ", more than the whole budget"
        return reason + f"; it resets at {self.resets_at.isoformat().replace('+00:00', 'Z')}"


class BudgetWait(Exception):
    """A window's call would cross a budget and the agent's budget says ``wait``: the window
    stays claimed, its job ends without forming it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UsageLedger:
    """The per-agent and deployment-wide LLM counters, and the reservation of a call against them."""

    def __init__(self, redis: Redis, *, tokens_per_day: int | None = None, tokens_per_month: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.deployment = (tokens_per_day, tokens_per_month)
        self.clock = clock
        self._scripts: tuple[Any, Any] | None = None  # registered at the first call (no LLM: never)

    def _script(self, which: int) -> Any:
        if self._scripts is None:
            self._scripts = (self.redis.register_script(_RESERVE), self.redis.register_script(_SETTLE))
        return self._scripts[which]

    async def reserve(self, agent_id: str, budget: LLMBudget, tokens: int) -> Reservation | Refusal:
        periods = Periods.at(self.clock())
        limits = [budget.tokens_per_day, budget.tokens_per_month, *self.deployment]
        row = await self._script(0)(keys=periods.keys(agent_id),
                                    args=[tokens, *("" if n is None else n for n in limits), *periods.expiries()])
        which = int(row[0])
        if which == 0:
            return Reservation(agent_id, tokens, periods)
        limit = limits[which - 1]
        assert limit is not None  # only a key with a limit refuses
        return Refusal(which, int(row[1]), limit, tokens, periods.day_ends if which % 2 else periods.month_ends)

    async def settle(self, reservation: Reservation, usage: ExtractionUsage | None, done: str | None) -> None:
        """Replace the reservation by what the calls took (``usage``; None: unknown, the
        estimate stays counted) and count ``done`` (``formations``, ``consolidations``) once."""
        taken = reservation.tokens if usage is None else usage.prompt_tokens + usage.completion_tokens
        fields: dict[str, int] = {}
        if usage is not None:
            fields = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "calls": usage.calls, "attempts": usage.attempts}
        if done:
            fields[done] = 1
        await self._script(1)(keys=reservation.periods.keys(reservation.agent_id),
                              args=[reservation.tokens, taken, *reservation.periods.expiries(),
                                    *(str(v) for pair in fields.items() for v in pair)])

    async def note(self, agent_id: str, field: str) -> None:
        """Count ``field`` (offline_formations, offline_consolidations, waits) for the agent and the deployment."""
        periods = Periods.at(self.clock())
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, expiry in zip(periods.keys(agent_id), periods.expiries() * 2, strict=True):
                pipe.hincrby(key, field, 1)
                pipe.expireat(key, expiry)
            await pipe.execute()

    async def usage(self, agent_id: str, budget: LLMBudget) -> AgentUsage:
        """Today's and this month's usage of the agent against its budgets, and the deployment's caps."""
        periods = Periods.at(self.clock())
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in periods.keys(agent_id):
                pipe.hgetall(key)
            rows = cast(list[dict[str, str]], await pipe.execute())
        day, month, deployment_day, deployment_month = ({k: int(float(v)) for k, v in row.items()} for row in rows)

        def period(label: str, ends: datetime, counts: dict[str, int], limit: int | None) -> PeriodUsage:
            fields = {k: v for k, v in counts.items() if k in PeriodUsage.model_fields}
            remaining = None if limit is None else max(0, limit - counts.get("tokens", 0))
            return PeriodUsage(period=label[1:], resets_at=ends, limit=limit, remaining=remaining, **fields)

        def cap(counts: dict[str, int], limit: int | None) -> DeploymentCap:
            return DeploymentCap(limit=limit, spent=limit is not None and counts.get("tokens", 0) >= limit)

        return AgentUsage(agent_id=agent_id, budget=budget,
                          day=period(periods.day, periods.day_ends, day, budget.tokens_per_day),
                          month=period(periods.month, periods.month_ends, month, budget.tokens_per_month),
                          deployment=DeploymentCaps(day=cap(deployment_day, self.deployment[0]),
                                                    month=cap(deployment_month, self.deployment[1])))


BudgetOf = Callable[[str], Awaitable[LLMBudget]]


class _Estimating(Protocol):
    def estimate_tokens(self, window: Window) -> int: ...


def extraction_estimate(extractor: Extractor, window: Window) -> int:
    """The tokens ``extractor``'s call on ``window`` is expected to take (0: it makes none)."""
    if hasattr(extractor, "estimate_tokens"):
        return cast(_Estimating, extractor).estimate_tokens(window)
    chars = sum(len(m.content) for m in window.messages)
    return chars // 4 + 512 if chars else 0


class BudgetedExtractor:
    """An LLM extractor held to its agents' budgets, with the offline extractor to fall back on."""

    known_limits: KnownLimits  # set only if the LLM extractor has it (GraphExtractor is checked by attribute)

    def __init__(self, inner: Extractor, offline: Extractor, ledger: UsageLedger, budget_of: BudgetOf) -> None:
        self.inner, self.offline, self.ledger, self.budget_of = inner, offline, ledger, budget_of
        self.name = inner.name
        if isinstance(inner, GraphExtractor):
            self.known_limits = inner.known_limits

    async def aclose(self) -> None:
        if closer := getattr(self.inner, "aclose", None):
            await closer()

    async def extract(self, window: Window) -> Extraction:
        need = extraction_estimate(self.inner, window)
        if need <= 0:  # no call: nothing to reserve
            return await self.inner.extract(window)
        budget = await self.budget_of(window.agent_id)
        admitted = await self.ledger.reserve(window.agent_id, budget, need)
        if isinstance(admitted, Refusal):
            reason = admitted.reason
            if budget.when_spent == "wait" and not admitted.never_fits:  # else it would wait for ever
                await self.ledger.note(window.agent_id, "waits")
                log.info("session %s: window left pending: %s", window.session_id, reason)
                raise BudgetWait(reason)
            await self.ledger.note(window.agent_id, "offline_formations")
            log.info("session %s: window formed offline: %s", window.session_id, reason)
            extraction = await self.offline.extract(window)
            extraction.extractor, extraction.fallback = self.offline.name, reason
            return extraction
        usage: ExtractionUsage | None = None
        done = None
        try:
            extraction = await self.inner.extract(window)
            usage, done = extraction.usage, "formations"
            return extraction
        except ExtractionFailed as exc:
            usage = exc.usage
            raise
        finally:
            await self.ledger.settle(admitted, usage, done)


class _EstimatingConsolidator(Protocol):
    def estimate_tokens(self, previous: str | None, items: list[str], word_limit: int) -> int: ...


class BudgetedConsolidator:
    """An LLM consolidator held to one agent's budgets; a merge that would cross one is made by rule."""

    def __init__(self, inner: Consolidator, offline: Consolidator, ledger: UsageLedger, agent_id: str,
                 budget_of: BudgetOf) -> None:
        self.inner, self.offline, self.ledger, self.agent_id, self.budget_of = inner, offline, ledger, agent_id, budget_of
        self.name = inner.name

    async def merge(self, previous: str | None, items: list[str], word_limit: int, *, subject: str = "") -> Merged:
        if hasattr(self.inner, "estimate_tokens"):
            need = cast(_EstimatingConsolidator, self.inner).estimate_tokens(previous, items, word_limit)
        else:
            need = (len(previous or "") + sum(map(len, items))) // 4 + 2 * word_limit + 256
        admitted = await self.ledger.reserve(self.agent_id, await self.budget_of(self.agent_id), need)
        if isinstance(admitted, Refusal):
            await self.ledger.note(self.agent_id, "offline_consolidations")
            log.info("agent %s: %s merged by rule: %s", self.agent_id, subject or "a memory", admitted.reason)
            merged = await self.offline.merge(previous, items, word_limit, subject=subject)
            return replace(merged, fallback=admitted.reason)
        usage: ExtractionUsage | None = None
        done = None
        try:
            merged = await self.inner.merge(previous, items, word_limit, subject=subject)
            usage, done = merged.usage, "consolidations"
            return merged
        except Exception as exc:  # ConsolidationFailed says what its attempts cost; anything else: unknown
            usage = getattr(exc, "usage", None)
            raise
        finally:
            await self.ledger.settle(admitted, usage, done)
