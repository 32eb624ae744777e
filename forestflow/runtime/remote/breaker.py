"""A circuit breaker for one backend: after N consecutive failures, refuse at once until a probe succeeds.

Closed, every call goes through and failures are counted; the Nth failure in a row opens it. Open,
calls are refused at once (the caller answers 503 with Retry-After) instead of each waiting for a
connect error or a timeout, and the owner probes the backend every cool-down; a probe that finds it
ready closes the breaker. Any success closes it too and resets the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CircuitBreaker:
    """Consecutive-failure counting with an open state probed by its owner."""

    def __init__(self, threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = max(1, threshold)
        self.cooldown_s = cooldown_s
        self._clock = clock
        #: Failures since the last success.
        self.consecutive_failures = 0
        self._opened_at: float | None = None
        #: Times it opened since start (``/metrics``).
        self.opened_count = 0

    @property
    def open(self) -> bool:
        """Whether calls are refused now."""
        return self._opened_at is not None

    def retry_after(self) -> float:
        """Seconds until the next probe may close it (0 when closed)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._opened_at + self.cooldown_s - self._clock())

    def success(self) -> None:
        """A call (or probe) succeeded: close and reset the count."""
        self.consecutive_failures = 0
        self._opened_at = None

    def failure(self) -> bool:
        """A call failed; True when this failure opened the breaker."""
        self.consecutive_failures += 1
        if self._opened_at is None and self.consecutive_failures >= self.threshold:
            self._opened_at = self._clock()
            self.opened_count += 1
            return True
        return False

    def trip(self) -> None:
        """Open now, whatever the count (a backend found down before any call)."""
        if self._opened_at is None:
            self.opened_count += 1
        self.consecutive_failures = max(self.consecutive_failures, self.threshold)
        self._opened_at = self._clock()

    def probe_failed(self) -> None:
        """A probe found the backend still down: stay open for another cool-down."""
        if self._opened_at is not None:
            self._opened_at = self._clock()
