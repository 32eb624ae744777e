"""The prediction log: a bounded byte buffer in front of a sink, drained by one background task.

``emit`` never waits: it encodes the event, and either appends it to the buffer or, when the
buffer's byte budget is spent, drops it and counts the drop. The drain task ships batches to the
sink, keeps what the sink could not take (retrying with backoff, so an absent broker only delays
delivery), and on shutdown flushes within a deadline and counts what is left as dropped. At every
moment ``produced == delivered + dropped + buffered``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import structlog

from forestflow.predlog.cloudevents import record_headers
from forestflow.predlog.encode import encode_event, encode_event_json
from forestflow.predlog.record import PredictionRecord

log = structlog.get_logger("forestflow.predlog")

#: Fixed per-event overhead counted against the buffer besides key and value bytes.
EVENT_OVERHEAD_BYTES = 64
#: An encoded Kafka headers section holding no header (a zero count).
NO_HEADERS = b"\x00"


class LogEntry:
    """An encoded event waiting for its sink."""

    __slots__ = ("graphpipe", "key", "value", "headers", "size")

    def __init__(self, graphpipe: bool, key: bytes | None, value: bytes, headers: bytes = NO_HEADERS) -> None:
        # A plain __init__, not a dataclass's: one Python call per logged event instead of two
        # (__init__ and __post_init__).
        self.graphpipe = graphpipe
        self.key = key
        self.value = value
        #: The Kafka record's headers section, encoded (predlog/cloudevents.py); NO_HEADERS for none.
        self.headers = headers
        #: Bytes this entry holds against the buffer budget (computed once: the drain sums it per batch).
        self.size = len(value) + (len(key) if key else 0) + len(headers) - 1 + EVENT_OVERHEAD_BYTES

    def __repr__(self) -> str:
        return f"LogEntry(graphpipe={self.graphpipe}, key={self.key!r}, value=<{len(self.value)} bytes>, size={self.size})"


class Sink(Protocol):
    """Where encoded events go (Kafka, a local file)."""

    name: str

    async def start(self) -> None:
        """Connect; may raise (the log retries)."""
        ...

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        """Deliver a batch; return the entries that were NOT delivered (to retry)."""
        ...

    async def close(self) -> None:
        """Flush and disconnect."""
        ...


@dataclass(slots=True)
class LogStats:
    """Counters of the prediction log (metrics and tests read them)."""

    produced: int = 0
    delivered: int = 0
    dropped_overflow: int = 0
    dropped_shutdown: int = 0
    #: Events the sink refused for good (e.g. over Kafka's max request size).
    dropped_rejected: int = 0
    encode_errors: int = 0
    send_failures: int = 0
    buffered: int = 0
    buffered_bytes: int = 0
    connected: bool = False

    @property
    def dropped(self) -> int:
        """Events that will never be delivered."""
        return self.dropped_overflow + self.dropped_shutdown + self.dropped_rejected + self.encode_errors


class PredictionLog:
    """Owns the buffer and the drain task; one per gateway process."""

    def __init__(
        self,
        sink: Sink,
        capacity_bytes: int,
        batch_size: int = 500,
        retry_backoff_s: float = 0.5,
        warn_interval_s: float = 10.0,
        linger_s: float = 0.0,
    ) -> None:
        self.sink = sink
        self.capacity_bytes = capacity_bytes
        self.batch_size = batch_size
        self.retry_backoff_s = retry_backoff_s
        self.warn_interval_s = warn_interval_s
        #: How long the drain task lets events gather before shipping a batch smaller than
        #: ``batch_size``: one write or produce per batch instead of one per event.
        self.linger_s = linger_s
        self.stats = LogStats()
        # A sink may ask for JSON lines (the local file); everything else gets the protobuf event.
        self._jsonl = getattr(sink, "encoding", "protobuf") == "jsonl"
        #: Whether records carry CloudEvents headers (a sink with record headers: Kafka).
        self._cloudevents = getattr(sink, "cloudevents", False)
        self._queue: deque[LogEntry] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_warned_drops = 0
        self._rejected_seen = 0
        self._last_warn_at = 0.0

    # ---- request path ------------------------------------------------------------------------------
    def emit(self, record: PredictionRecord) -> bool:
        """Encode and buffer one event without waiting; False if it was dropped."""
        self.stats.produced += 1
        key_text = record.logging.key_for(record.configs)
        try:
            value = encode_event_json(record, key_text) if self._jsonl else encode_event(record)
        except Exception:  # a model output the encoder cannot represent must not fail the request
            self.stats.encode_errors += 1
            log.exception("prediction_log_encode_failed", fqrv=str(record.fqrv), request_id=record.request_id)
            return False
        entry = LogEntry(
            record.raw_request is not None, None if key_text is None else key_text.encode(), value,
            record_headers(record.fqrv.contract, record.served, record.request_id, record.event_time_ms) if self._cloudevents else NO_HEADERS,
        )
        size = entry.size
        stats = self.stats
        if self._closing or stats.buffered_bytes + size > self.capacity_bytes:
            stats.dropped_overflow += 1
            self._maybe_warn()
            return False
        self._queue.append(entry)
        stats.buffered += 1
        stats.buffered_bytes += size
        self._wakeup.set()
        return True

    def _maybe_warn(self) -> None:
        now = time.monotonic()
        if now - self._last_warn_at >= self.warn_interval_s:
            log.warning(
                "prediction_log_dropping",
                dropped_since_last=self.stats.dropped_overflow - self._last_warned_drops,
                dropped_total=self.stats.dropped,
                buffered_bytes=self.stats.buffered_bytes,
                capacity_bytes=self.capacity_bytes,
                sink=self.sink.name,
            )
            self._last_warn_at = now
            self._last_warned_drops = self.stats.dropped_overflow

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the drain task (the sink connects lazily inside it)."""
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="prediction-log-drain")

    async def close(self, timeout_s: float) -> None:
        """Stop taking events, deliver what is buffered within ``timeout_s``, count the rest."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    pass
        left = len(self._queue)
        if left:
            self.stats.dropped_shutdown += left
            self._queue.clear()
            self.stats.buffered = 0
            self.stats.buffered_bytes = 0
            log.warning("prediction_log_unflushed_at_shutdown", events=left, sink=self.sink.name)
        try:
            await asyncio.wait_for(self.sink.close(), max(1.0, timeout_s / 2))
        except Exception:  # closing a dead connection must not break shutdown
            log.warning("prediction_log_sink_close_failed", sink=self.sink.name, exc_info=True)
        log.info("prediction_log_closed", produced=self.stats.produced, delivered=self.stats.delivered, dropped=self.stats.dropped)

    # ---- drain -------------------------------------------------------------------------------------
    async def _drain(self) -> None:
        backoff = self.retry_backoff_s
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not self.stats.connected:
                try:
                    await self.sink.start()
                    self.stats.connected = True
                    backoff = self.retry_backoff_s
                    log.info("prediction_log_sink_connected", sink=self.sink.name)
                except Exception as exc:  # broker absent: keep buffering and retry
                    self.stats.send_failures += 1
                    log.warning("prediction_log_sink_unavailable", sink=self.sink.name, error=str(exc), retry_in_s=backoff)
                    await self._sleep_unless_closing(backoff)
                    backoff = min(backoff * 2, 5.0)
                    if self._closing:
                        return
                    continue
            if self.linger_s and len(self._queue) < self.batch_size and not self._closing:
                await asyncio.sleep(self.linger_s)
            batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
            try:
                failed = await self.sink.send(batch)
            except asyncio.CancelledError:
                # close() hit its deadline mid-send: put the batch back so it is counted as dropped.
                self._queue.extendleft(reversed(batch))
                raise
            except Exception as exc:
                log.warning("prediction_log_send_failed", sink=self.sink.name, error=str(exc), events=len(batch))
                failed = batch
            # A sink that refuses an event for good counts it in ``rejected``: dropped, not delivered.
            rejected = getattr(self.sink, "rejected", 0) - self._rejected_seen
            self._rejected_seen += rejected
            self.stats.dropped_rejected += rejected
            delivered = len(batch) - len(failed) - rejected
            self.stats.delivered += delivered
            self.stats.buffered -= delivered + rejected
            self.stats.buffered_bytes -= sum(e.size for e in batch) - sum(e.size for e in failed)
            if failed:
                self.stats.send_failures += 1
                self._queue.extendleft(reversed(failed))
                self.stats.connected = False
                try:
                    await self.sink.close()
                except Exception:  # the connection is already broken; reconnect next round
                    pass
                await self._sleep_unless_closing(backoff)
                backoff = min(backoff * 2, 5.0)
                if self._closing and not self._queue:
                    return

    async def _sleep_unless_closing(self, seconds: float) -> None:
        # During shutdown keep retrying quickly until close()'s deadline cancels us.
        await asyncio.sleep(min(seconds, 0.2) if self._closing else seconds)
