"""Small builders shared by the tests."""

from datetime import UTC, datetime, timedelta

from memory_service.models import MessageIn

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


def msg(agent: str, user: str, content: str, *, role: str = "user", mid: str | None = None, minute: int = 0, **extra) -> MessageIn:
    return MessageIn(agent_id=agent, user_id=user, role=role, content=content, message_id=mid,
                     created_at=T0 + timedelta(minutes=minute), **extra)


async def record_all(service, session_id: str, agent: str, lines: list[tuple[str, str, str]]):
    """Record (user, role, content) lines with ids '<session>-<i>'; return the results."""
    return [
        await service.record_message(session_id, msg(agent, user, content, role=role, mid=f"{session_id}-{i}", minute=i))
        for i, (user, role, content) in enumerate(lines)
    ]
