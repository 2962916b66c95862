"""Who a run is for: the service's user and session of one LangGraph run.

The middleware and the tools both need them, from what LangGraph hands each: the
middleware a ``Runtime``, a tool a ``ToolRuntime``; both carry the run's ``context`` and
``execution_info`` (its thread). The session is the LangGraph thread, so one conversation
thread is one session of the service, formed into memories like any other; the user is
the run context's ``user_id`` (the way LangChain's docs pass a user), else the config's
``configurable.user_id``, else the fixed one the adapter was made with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.config import get_config


@dataclass(frozen=True)
class RunIdentity:
    user_id: str
    session_id: str


def identify(runtime: Any, *, user_id: str | None = None, session_id: str | None = None) -> RunIdentity:
    """The user and session of the run ``runtime`` belongs to (a ``Runtime`` or ``ToolRuntime``).
    ``user_id`` and ``session_id`` are the adapter's fixed ones, used when the run names none."""
    configurable = _configurable(runtime)
    user = _field(getattr(runtime, "context", None), "user_id") or _text(configurable.get("user_id")) or user_id
    info = getattr(runtime, "execution_info", None)
    session = _text(getattr(info, "thread_id", None)) or _text(configurable.get("thread_id")) or session_id
    if not user:
        raise ValueError("no user for this run: run the agent with context={'user_id': ...} (or "
                         "config={'configurable': {'user_id': ...}}), or give the adapter user_id=...")
    if not session:
        raise ValueError("no session for this run: run the agent with a checkpointer and "
                         "config={'configurable': {'thread_id': ...}}, or give the adapter session_id=...")
    return RunIdentity(user, session)


def _configurable(runtime: Any) -> Mapping[str, Any]:
    config = getattr(runtime, "config", None)  # a ToolRuntime carries its config
    if config is None:
        try:
            config = get_config()  # inside a graph node: the run's config
        except RuntimeError:
            return {}
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    return configurable if isinstance(configurable, Mapping) else {}


def _field(context: Any, name: str) -> str | None:
    if isinstance(context, Mapping):
        return _text(context.get(name))
    return _text(getattr(context, name, None))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
