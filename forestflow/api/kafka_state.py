"""What the Kafka front-end keeps track of: each assigned partition's positions, and its counters."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from forestflow.api.kafka_messages import Request


@dataclass(eq=False)
class PartitionState:
    """What this replica holds of one assigned partition."""

    tp: TopicPartition
    #: Taken from the consumer, not started yet, in offset order.
    backlog: deque[tuple[ConsumerRecord, Request]] = field(default_factory=deque)
    #: Offsets being scored or answered (and, at shutdown, any whose reply was never confirmed).
    inflight: set[int] = field(default_factory=set)
    #: One past the last offset taken from the consumer.
    next_offset: int | None = None
    committed: int | None = None
    highwater: int | None = None
    paused_since: float | None = None
    paused_s: float = 0.0
    #: Messages crowded out by other traffic, waiting to be offered again (the partition waits too).
    retrying: int = 0

    def commit_point(self) -> int | None:
        """The offset to commit: the lowest one not answered yet."""
        points = [self.next_offset] if self.next_offset is not None else []
        if self.inflight:
            points.append(min(self.inflight))
        if self.backlog:
            points.append(self.backlog[0][0].offset)
        return min(points) if points else None

    def paused_seconds(self, now: float) -> float:
        """Time spent paused so far."""
        return self.paused_s + (now - self.paused_since if self.paused_since is not None else 0.0)

    def lag(self) -> int | None:
        """Messages not answered yet up to the high-water mark (None until both are known)."""
        point = self.commit_point()
        if self.highwater is None or point is None:
            return None
        return max(0, self.highwater - point)

    def to_json(self, now: float) -> dict[str, Any]:
        """The partition's line in ``/metrics/json``."""
        return {
            "committed": self.committed,
            "highwater": self.highwater,
            "lag": self.lag(),
            "waiting": len(self.backlog),
            "inflight": len(self.inflight),
            "paused": self.paused_since is not None,
            "pausedSeconds": round(self.paused_seconds(now), 3),
        }


@dataclass
class IngestStats:
    """Counters of the Kafka front-end (exposed in ``/metrics/json``)."""

    consumed: int = 0
    answered: Counter[int] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    pauses: int = 0
    #: Paused time of partitions this replica no longer holds.
    paused_s_released: float = 0.0
    overload_retries: int = 0
    reply_retries: int = 0
    commits: int = 0
    commit_failures: int = 0
