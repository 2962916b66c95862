"""Formation gates: when a session has enough new conversation to form memories.

``evaluate`` is the gates' only definition. The claim (memory_service.formation.window) does not
evaluate them again on its own: it receives the verdict with the ``formed_windows``
counter it was reached on and refuses a new claim if a window completed since (the only
change that can close an open gate), so the gate a caller sees and the claim it makes
cannot disagree.
"""

from __future__ import annotations

from memory_service.config import Settings
from memory_service.domain.models import Role
from memory_service.schemas.formation import GateStatus
from memory_service.state.store import SessionCounters

# Users' words say most about them; an agent's own words least.
ROLE_WEIGHTS: dict[Role, float] = {Role.USER: 1.0, Role.TOOL: 0.5, Role.SYSTEM: 0.5, Role.ASSISTANT: 0.2}
CHARS_PER_TOKEN = 4.5  # tiktoken would download its tables at run time


def weighted_tokens(role: Role, content: str) -> float:
    return len(content) * ROLE_WEIGHTS[role] / CHARS_PER_TOKEN


def evaluate(counters: SessionCounters, settings: Settings) -> GateStatus:
    # The exact counter decides; rounding it first (as once done here) opened gates that
    # the claim, comparing the exact value, then refused.
    pending, tokens = counters.pending_messages, counters.pending_tokens
    if counters.incognito:
        is_open, reason = False, "incognito session: memories are never formed"
    elif pending < settings.never_form_memories_less_than_n_messages:
        is_open, reason = False, f"{pending} new message(s), fewer than the minimum {settings.never_form_memories_less_than_n_messages}"
    elif pending >= settings.memory_formation_msg_interval:
        is_open, reason = True, f"{pending} new messages reached the interval {settings.memory_formation_msg_interval}"
    elif tokens >= settings.memory_formation_token_interval:
        is_open, reason = True, f"{tokens:.0f} weighted tokens reached the interval {settings.memory_formation_token_interval}"
    else:
        is_open, reason = False, "waiting for more messages or tokens"
    return GateStatus(
        open=is_open,
        reason=reason,
        pending_messages=pending,
        pending_tokens=round(tokens, 3),
        min_messages=settings.never_form_memories_less_than_n_messages,
        message_interval=settings.memory_formation_msg_interval,
        token_interval=settings.memory_formation_token_interval,
    )
