"""What live and shadow traffic show about a release: sliding windows and the checks built on them.

Protocol-free and without I/O. The service records each scored event's outcome and latency
(:meth:`ReleaseWindow.record`, cheap: deque appends) and, off the request path, whether a shadow
copy agreed with the served answer (:meth:`ReleaseWindow.record_agreement`, rows counted by
:func:`agreeing_rows`). Validity rules read :meth:`ReleaseWindow.error_rate_ok`; ``/stats`` reads
:meth:`ReleaseWindow.observed` (``agreement``, ``errorRate``, ``p99LatencyMs``).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from forestflow.core.frame import Frame

#: Events (outcomes, latencies) and rows (agreement) kept per release when no rule asks for more.
DEFAULT_WINDOW = 100
#: Relative difference under which two float answers agree.
FLOAT_TOLERANCE = 1e-6


class ReleaseWindow:
    """The last outcomes, latencies and shadow agreements of one release (one process's view)."""

    __slots__ = ("outcomes", "failures", "latencies", "agreements", "agreeing")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        size = max(int(size), DEFAULT_WINDOW)
        #: True for a success, False for a failure, newest last.
        self.outcomes: deque[bool] = deque(maxlen=size)
        self.failures = 0
        self.latencies: deque[float] = deque(maxlen=size)
        #: 1 per agreeing row, 0 per disagreeing one, newest last.
        self.agreements: deque[int] = deque(maxlen=size * 10)
        self.agreeing = 0

    @property
    def size(self) -> int:
        """How many outcomes the window keeps."""
        return self.outcomes.maxlen or DEFAULT_WINDOW

    def resize(self, size: int) -> None:
        """Keep at least ``max(size, 100)`` outcomes from now on (the newest are kept)."""
        size = max(int(size), DEFAULT_WINDOW)
        if size != self.size:
            self.outcomes = deque(self.outcomes, maxlen=size)
            self.failures = self.outcomes.count(False)
            self.latencies = deque(self.latencies, maxlen=size)

    def record(self, ok: bool, latency_ms: float | None = None) -> None:
        """One scored event (live or shadow): whether it succeeded, and how long it took."""
        outcomes = self.outcomes
        if len(outcomes) == outcomes.maxlen and not outcomes[0]:
            self.failures -= 1
        outcomes.append(ok)
        if not ok:
            self.failures += 1
        if latency_ms is not None:
            self.latencies.append(latency_ms)

    def record_agreement(self, agreeing: int, rows: int) -> None:
        """A shadow copy's rows compared with the served answer: ``agreeing`` of ``rows`` matched."""
        window = self.agreements
        for value in (1,) * agreeing + (0,) * (rows - agreeing):
            if len(window) == window.maxlen:
                self.agreeing -= window[0]
            window.append(value)
            self.agreeing += value

    def clear(self) -> None:
        """Forget every outcome (after a rollback: only fresh events count)."""
        self.outcomes.clear()
        self.failures = 0

    @property
    def agreement(self) -> float | None:
        """The share of compared shadow rows that agreed (None before any was compared)."""
        return self.agreeing / len(self.agreements) if self.agreements else None

    @property
    def error_rate(self) -> float:
        """Failures over the events in the window (0.0 when empty)."""
        return self.failures / len(self.outcomes) if self.outcomes else 0.0

    def error_rate_ok(self, max_error_rate: float, min_events: int) -> bool:
        """At least ``min_events`` in the window and a failure rate of at most ``max_error_rate``.

        Crossing the bound clears the window, so validity comes back only after ``min_events``
        fresh events under it.
        """
        self.resize(min_events)
        if len(self.outcomes) < min_events:
            return False
        if self.error_rate > max_error_rate:
            self.clear()
            return False
        return True

    def observed(self) -> dict[str, float]:
        """``agreement`` (when shadow copies were compared), ``errorRate`` and ``p99LatencyMs`` (when events were seen)."""
        out: dict[str, float] = {}
        if (agreement := self.agreement) is not None:
            out["agreement"] = agreement
        if self.outcomes:
            out["errorRate"] = self.error_rate
        if self.latencies:
            ordered = sorted(self.latencies)
            out["p99LatencyMs"] = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        return out


def first_output(frame: Frame) -> np.ndarray | None:
    """The first output of each row (the first column, first element of each row), or None."""
    if not frame.columns or frame.num_rows == 0:
        return None
    column = np.asarray(next(iter(frame.columns.values())))
    if column.ndim == 0:
        return None
    return column.reshape(column.shape[0], -1)[:, 0] if column.ndim > 1 else column


def agreeing_rows(shadow: Frame, served: Frame) -> tuple[int, int]:
    """``(agreeing, compared)`` rows between a shadow's answer and the served one.

    Labels (strings, integer classes, booleans) agree when equal; floats when their relative
    difference is at most 1e-6. A shadow without a comparable answer disagrees on every row.
    """
    theirs, ours = first_output(shadow), first_output(served)
    if ours is None:
        return 0, 0
    rows = len(ours)
    if theirs is None or len(theirs) != rows:
        return 0, rows
    if theirs.dtype.kind == "f" or ours.dtype.kind == "f":
        try:
            a, b = theirs.astype(np.float64), ours.astype(np.float64)
        except (TypeError, ValueError):
            return 0, rows
        close = np.abs(a - b) <= FLOAT_TOLERANCE * np.maximum(np.abs(a), np.abs(b))
        close |= (a == b) | (np.isnan(a) & np.isnan(b))
        return int(np.count_nonzero(close)), rows
    same = sum(1 for x, y in zip(theirs.tolist(), ours.tolist()) if _label(x) == _label(y))
    return same, rows


def _label(value: object) -> object:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
