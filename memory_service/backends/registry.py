"""Which memory backend serves an agent: named factories, each built once, with fallback."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from memory_service.backends.base import MemoryBackend
from memory_service.config import Settings
from memory_service.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)

BackendFactory = Callable[[Settings], MemoryBackend | Awaitable[MemoryBackend]]


@dataclass(slots=True)
class _FailedFactory:
    error: str
    failed_at: float


@dataclass(slots=True)
class BackendRegistry:
    """Named backend factories; each backend is built once and reused.

    A factory that fails is remembered for ``retry_seconds`` so that a broken store
    costs one warning, not one failed connection per call.
    """

    settings: Settings
    factories: dict[str, BackendFactory] = field(default_factory=dict)
    _live: dict[str, MemoryBackend] = field(default_factory=dict)
    _failed: dict[str, _FailedFactory] = field(default_factory=dict)
    _warned: set[tuple[str, str]] = field(default_factory=set)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def register(self, name: str, factory: BackendFactory) -> None:
        self.factories[name] = factory

    def _warn_once(self, key: tuple[str, str], message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    async def get(self, name: str) -> MemoryBackend:
        """The live backend called ``name``; raises BackendUnavailable if it cannot start."""
        if name in self._live:
            return self._live[name]
        if name not in self.factories:
            raise BackendUnavailable(f"no memory backend named {name!r} is registered")
        failed = self._failed.get(name)
        if failed and time.monotonic() - failed.failed_at < self.settings.backend_retry_seconds:
            raise BackendUnavailable(f"memory backend {name!r} failed to start: {failed.error}")
        async with self._lock:
            if name in self._live:
                return self._live[name]
            try:
                built = self.factories[name](self.settings)
                backend = await built if isinstance(built, Awaitable) else built
                await backend.start()
            except Exception as exc:
                self._failed[name] = _FailedFactory(f"{type(exc).__name__}: {exc}", time.monotonic())
                self._warned.discard(("failed", name))
                raise BackendUnavailable(f"memory backend {name!r} failed to start: {exc}") from exc
            self._failed.pop(name, None)
            self._live[name] = backend
            return backend

    async def resolve(self, requested: str | None, default: str, agent_id: str) -> tuple[str, MemoryBackend]:
        """The agent's backend, or the default with one logged warning."""
        if requested and requested != default:
            if requested not in self.factories:
                self._warn_once(("unknown", requested), "agent %s asks for unknown memory backend %r; using %r",
                                agent_id, requested, default)
            else:
                try:
                    return requested, await self.get(requested)
                except BackendUnavailable as exc:
                    self._warn_once(("failed", requested), "%s; agents that ask for it use %r", exc, default)
        return default, await self.get(default)

    async def live(self) -> list[MemoryBackend]:
        """The default backend and every other one started so far."""
        await self.get(self.settings.default_memory_backend)
        return list(self._live.values())

    async def close(self) -> None:
        for backend in self._live.values():
            await backend.close()
        self._live.clear()

    async def health(self) -> dict[str, dict[str, Any]]:
        report: dict[str, dict[str, Any]] = {name: await b.health() for name, b in self._live.items()}
        for name, failed in self._failed.items():
            report.setdefault(name, {"ok": False, "error": failed.error})
        return report
