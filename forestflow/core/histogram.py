"""Duration histograms filled on the request path and read by ``/metrics`` at scrape time."""

from __future__ import annotations

from bisect import bisect_left

#: Seconds; scoring a row of a tree model takes tens of microseconds, so the low end is fine.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Bucket counts and a sum, filled on the request path, read at scrape time."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration."""
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (upper bound, count at or below it), ending with +Inf."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out
