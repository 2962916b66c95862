"""A circuit breaker: stop calling a store that keeps failing, try it again after a pause.

Closed, calls go through; ``failures`` failures within ``window`` seconds open it. Open,
calls are refused (``allow()`` is False) for ``cooloff`` seconds; then it is half-open:
one trial call goes through, its success closes the breaker and its failure opens it for
another cool-off. A trial whose caller never reports back (cancelled) lets another trial
through after a cool-off, so the breaker never stays stuck.

In-process, per store: each process learns on its own that a store is down, in at most
``failures`` calls. (pybreaker, the usual library, wraps synchronous calls, or Tornado
coroutines for asynchronous ones; this is the part of it we need.)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class CircuitBreaker:
    def __init__(self, name: str, failures: int, window: float, cooloff: float,
                 clock: Callable[[], float] = time.monotonic):
        if failures < 1 or window <= 0 or cooloff <= 0:
            raise ValueError("a breaker needs failures >= 1 and a positive window and cool-off")
        self.name = name
        self.failures, self.window, self.cooloff = failures, window, cooloff
        self._clock = clock
        self._recent: deque[float] = deque(maxlen=failures)  # times of the latest failures
        self._opened_at: float | None = None
        self._trial_at: float | None = None
        self.opened = 0  # how often it opened
        self.last_error = ""

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return CLOSED
        return OPEN if self._clock() - self._opened_at < self.cooloff else HALF_OPEN

    def allow(self) -> bool:
        """Whether a call may go to the store now (a half-open breaker lets one trial through)."""
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN:
            return False
        now = self._clock()
        if self._trial_at is not None and now - self._trial_at < self.cooloff:
            return False  # a trial is under way
        self._trial_at = now
        return True

    def success(self) -> None:
        self._opened_at = self._trial_at = None
        self._recent.clear()

    def failure(self, error: BaseException | str | None = None) -> None:
        now = self._clock()
        if error is not None:
            self.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if self._opened_at is not None:  # a failed trial (or a late failure): open again
            self._opened_at, self._trial_at = now, None
            return
        self._recent.append(now)
        if len(self._recent) == self.failures and now - self._recent[0] <= self.window:
            self._opened_at, self._trial_at = now, None
            self.opened += 1

    def snapshot(self) -> dict[str, Any]:
        """For /health and /metrics."""
        return {"state": self.state, "opened": self.opened, "last_error": self.last_error}
