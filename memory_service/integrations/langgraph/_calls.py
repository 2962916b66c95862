"""One body of logic for both clients: a plan is a generator that yields the client calls it
needs (a ``Call``, or a list of them to make at once) and is sent their answers.

LangGraph and LangChain call every hook, tool and store operation either blocking or
asynchronously (``batch``/``abatch``, ``before_model``/``abefore_model``, a tool's ``func``
and ``coroutine``). Written twice, the two copies would drift; written once as a plan, the
blocking driver runs it with ``MemoryClient`` and the async one with ``AsyncMemoryClient``,
whose methods have the same names and arguments (the sync client is generated from the
async one). A client error is thrown into the plan where it made the call, so a plan
handles a 404 or a 409 like any exception; in a list of calls, each failure is answered in
its place as the exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from memory_service.client import AsyncMemoryClient, MemoryApiError, MemoryClient


@dataclass(frozen=True)
class Call:
    """``client.<method>(*args, **kwargs)``, for whichever client runs the plan."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call(method, args, kwargs)


# What a plan yields, and is sent back: a Call's answer, or for a list one answer (or the
# MemoryApiError it raised) per call, in order.
Step = Call | list[Call]
type Plan[T] = Generator[Step, Any, T]


def run[T](client: MemoryClient | None, plan: Plan[T], *, needed_for: str) -> T:
    """Run ``plan`` with the blocking client."""
    if client is None:
        plan.close()
        raise RuntimeError(f"{needed_for} needs a blocking client: pass client=MemoryClient(...) (or use the "
                           "async methods, which use async_client)")
    try:
        step = next(plan)
        while True:
            if isinstance(step, list):
                step = plan.send([_captured(client, one) for one in step])
                continue
            try:
                answer = getattr(client, step.method)(*step.args, **step.kwargs)
            except MemoryApiError as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result


async def arun[T](client: AsyncMemoryClient | None, plan: Plan[T], *, needed_for: str) -> T:
    """Run ``plan`` with the async client; a list of calls is made concurrently."""
    if client is None:
        plan.close()
        raise RuntimeError(f"{needed_for} needs an async client: pass async_client=AsyncMemoryClient(...) (or use "
                           "the blocking methods, which use client)")
    try:
        step = next(plan)
        while True:
            if isinstance(step, list):
                step = plan.send(list(await asyncio.gather(*(_acaptured(client, one) for one in step))))
                continue
            try:
                answer = await getattr(client, step.method)(*step.args, **step.kwargs)
            except MemoryApiError as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result


def _captured(client: MemoryClient, one: Call) -> Any:
    try:
        return getattr(client, one.method)(*one.args, **one.kwargs)
    except MemoryApiError as exc:
        return exc


async def _acaptured(client: AsyncMemoryClient, one: Call) -> Any:
    try:
        return await getattr(client, one.method)(*one.args, **one.kwargs)
    except MemoryApiError as exc:
        return exc
