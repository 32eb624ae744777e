"""The prediction log: a bounded byte buffer in front of a sink, drained by one background task.

``emit`` never awaits: it encodes the event, and either appends it to the buffer or, when the
buffer's byte budget is spent, drops it and counts the drop; for a sink that writes on the spot (the
file) the emit that brings the buffer to the sink's ``ship_bytes`` writes it. The drain task ships batches to the
sink, keeps what the sink could not take (retrying with backoff, so an absent broker only delays
delivery), and on shutdown flushes within a deadline and counts what is left as dropped. At every
moment ``produced == delivered + dropped + buffered``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

import structlog

from forestflow.predlog import _kafka_records
from forestflow.predlog.encode import (
    USUAL_JSONL,
    USUAL_KAFKA,
    USUAL_PROTOBUF,
    encode_event,
    encode_event_json,
    kafka_entry,
    usual_entry,
)
from forestflow.predlog.record import PredictionRecord

log = structlog.get_logger("forestflow.predlog")

#: Fixed per-event overhead counted against the buffer besides key and value bytes.
EVENT_OVERHEAD_BYTES = _kafka_records.EVENT_OVERHEAD_BYTES
#: An encoded Kafka headers section holding no header (a zero count).
NO_HEADERS = b"\x00"
_SIZE = attrgetter("size")
#: An encoded event waiting for its sink: ``LogEntry(graphpipe, key, value, headers=NO_HEADERS)``, its
#: fields read-only, ``size`` the bytes it holds against the buffer budget. Written in C: one is built
#: per logged prediction, and a Python class's ``__init__`` cost ten times as much.
LogEntry = _kafka_records.LogEntry


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


class WritingSink(Sink, Protocol):
    """A sink that can also take a batch synchronously, on the event loop (the local file).

    The log hands it its waiting events from ``emit`` as soon as ``ship_bytes`` of them wait: written
    while they are still in the core's cache rather than when the linger ends."""

    #: Bytes of waiting events that are written at once.
    ship_bytes: int

    def write_now(self, entries: list[LogEntry]) -> list[LogEntry] | None:
        """Write a batch; return the entries that were NOT written, or None to leave the batch to
        ``send`` (a batch too large to write on the event loop)."""
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
    #: Whether the drain task runs (false from a crash until its restart: readiness fails meanwhile).
    drain_running: bool = False
    #: Times the drain task died of an unexpected error and was restarted.
    drain_restarts: int = 0
    #: Why events are not being delivered right now (None while deliveries succeed, or nothing waits).
    failing_reason: str | None = None

    @property
    def dropped(self) -> int:
        """Events that will never be delivered."""
        return self.dropped_overflow + self.dropped_shutdown + self.dropped_rejected + self.encode_errors

    def delivery(self) -> dict[str, object]:
        """The delivery state for people: ``ok`` or ``failing`` with the reason, and the drops so far.

        It never makes the gateway unready: scoring goes on while the log cannot be delivered
        (events are buffered, then dropped and counted)."""
        return {
            "state": "failing" if self.failing_reason else "ok",
            "reason": self.failing_reason,
            "dropped": self.dropped,
            "droppedOverflow": self.dropped_overflow,
            "bufferedEvents": self.buffered,
        }


def _leave_to_send(entries: list[LogEntry]) -> None:
    """``write_now`` of a sink without one: every batch is left to ``send``."""
    return None


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
        restart_backoff_s: float = 1.0,
    ) -> None:
        self.sink = sink
        self.capacity_bytes = capacity_bytes
        self.batch_size = batch_size
        self.retry_backoff_s = retry_backoff_s
        self.warn_interval_s = warn_interval_s
        #: How long the drain task lets events gather before shipping a batch smaller than
        #: ``batch_size``: one write or produce per batch instead of one per event.
        self.linger_s = linger_s
        #: First wait before restarting a drain task that died (doubling up to 30 s while it keeps dying).
        self.restart_backoff_s = restart_backoff_s
        #: The batch handed to the sink and not yet accounted (put back if the drain dies inside send).
        self._inflight: list[LogEntry] | None = None
        self.stats = LogStats()
        # A sink may ask for JSON lines (the local file); everything else gets the protobuf event.
        self._jsonl = getattr(sink, "encoding", "protobuf") == "jsonl"
        #: Whether records carry CloudEvents headers (a sink with record headers: Kafka).
        self._cloudevents = getattr(sink, "cloudevents", False)
        #: usual_entry()'s mode for this sink.
        self._usual = USUAL_KAFKA if self._cloudevents else USUAL_JSONL if self._jsonl else USUAL_PROTOBUF
        write_now = getattr(sink, "write_now", None)
        #: A sink that writes in place (``WritingSink``): its ``write_now`` and the bytes of waiting events
        #: that call it; another sink is never called so (no limit), its batches all go through ``send``.
        self._write_now: Callable[[list[LogEntry]], list[LogEntry] | None] = write_now or _leave_to_send
        self._ship_bytes: int = (getattr(sink, "ship_bytes", 0) if write_now is not None else 0) or sys.maxsize
        self._queue: deque[LogEntry] = deque()
        self._wakeup = asyncio.Event()
        #: Ends a linger early: set when the queue reaches ``batch_size`` and by close().
        self._ship = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # set by close(): ends a restart backoff at once
        self._last_warned_drops = 0
        self._rejected_seen = 0
        self._last_warn_at = 0.0

    # ---- request path ------------------------------------------------------------------------------
    def emit(self, record: PredictionRecord) -> bool:
        """Encode and buffer one event without waiting; False if it was dropped."""
        stats = self.stats
        stats.produced += 1
        try:
            # The usual event in one C call; any other (an error, a pin, a trace, feedback, a frame the
            # C writers leave to Python) in Python.
            entry = usual_entry(record, self._usual) or self._entry(record)
        except Exception:  # a model output the encoder cannot represent must not fail the request
            self.stats.encode_errors += 1
            log.exception("prediction_log_encode_failed", fqrv=str(record.fqrv), request_id=record.request_id)
            return False
        size = entry.size
        if self._closing or stats.buffered_bytes + size > self.capacity_bytes:
            stats.dropped_overflow += 1
            self._maybe_warn()
            return False
        queue = self._queue
        if not queue:  # the drain waits only on an empty queue: one wake-up per batch, not per event
            self._wakeup.set()
        queue.append(entry)
        stats.buffered += 1
        stats.buffered_bytes += size
        if len(queue) == self.batch_size:  # a whole batch: no need to linger for more
            self._ship.set()
        elif stats.buffered_bytes >= self._ship_bytes:
            self._write_waiting()
        return True

    def _write_waiting(self) -> None:
        """Hand the waiting events to a sink that writes in place, now (``WritingSink``).

        Only while deliveries succeed, nothing is in flight and no more than a batch waits: a failing sink
        is retried by the drain task with its backoff, a backlog is shipped by the drain a batch at a time,
        and so is a batch the sink leaves to ``send``."""
        stats, queue = self.stats, self._queue
        if self._inflight is not None or not stats.connected or stats.failing_reason is not None or len(queue) > self.batch_size:
            self._ship.set()
            return
        batch = list(queue)
        queue.clear()
        send_error: str | None = None
        try:
            failed = self._write_now(batch)
        except Exception as exc:  # a bug of the sink must not fail the request that logged the event
            log.warning("prediction_log_send_failed", sink=self.sink.name, error=str(exc), events=len(batch))
            send_error, failed = str(exc), batch
        if failed is None:  # too large to write on the loop: the drain ships it
            queue.extendleft(reversed(batch))
            self._ship.set()
            return
        if self._settle(batch, failed, send_error):
            self._wakeup.set()  # the drain retries what failed, with its backoff
            self._ship.set()

    def _entry(self, record: PredictionRecord) -> LogEntry:
        """The entry of any record, encoded in Python (predlog/encode.py)."""
        key_text = record.logging.key_for(record.configs)
        if self._cloudevents:  # Kafka: the entry, its headers included, in one call
            return kafka_entry(record, key_text)
        return LogEntry(
            record.raw_request is not None,
            None if key_text is None else key_text.encode(),
            encode_event_json(record, key_text) if self._jsonl else encode_event(record),
            NO_HEADERS,
        )

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
        """Start the drain task, supervised (the sink connects lazily inside it)."""
        self.stats.drain_running = True
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name="prediction-log-drain")

    @property
    def running(self) -> bool:
        """Whether events are being drained (false while a dead drain task waits for its restart)."""
        return self.stats.drain_running

    async def _supervise(self) -> None:
        """Run the drain; when it dies of an unexpected error, log it, count it and restart it
        with backoff (readiness fails meanwhile). Events stay buffered, none is lost."""
        backoff = self.restart_backoff_s
        while True:
            started = time.monotonic()
            self.stats.drain_running = True
            try:
                await self._drain()
                return
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - whatever killed it, delivery must go on
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                self.stats.drain_running = False
                self.stats.drain_restarts += 1
                if self._inflight is not None:  # died inside the sink: the batch was not accounted
                    self._queue.extendleft(reversed(self._inflight))
                    self._inflight = None
                self.stats.connected = False
                if time.monotonic() - started >= 60.0:
                    backoff = self.restart_backoff_s
                log.error(
                    "prediction_log_drain_died",
                    sink=self.sink.name,
                    restarts=self.stats.drain_restarts,
                    restart_in_s=backoff,
                    exc_info=exc,
                )
                try:  # close() ends the wait: a shutdown does not sit out the backoff
                    await asyncio.wait_for(self._closed.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, 30.0)
            finally:
                self.stats.drain_running = False

    def reopen(self) -> None:
        """Reopen the sink's files before its next write (SIGHUP after a log rotation); a sink
        without files (Kafka) ignores it."""
        reopen = getattr(self.sink, "reopen", None)
        if reopen is not None:
            reopen()
            log.info("prediction_log_reopen_requested", sink=self.sink.name)

    async def close(self, timeout_s: float) -> None:
        """Stop taking events, deliver what is buffered within ``timeout_s``, count the rest."""
        self._closing = True
        self._wakeup.set()
        self._ship.set()
        self._closed.set()
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
        log.info(
            "prediction_log_closed", produced=self.stats.produced, delivered=self.stats.delivered, dropped=self.stats.dropped
        )

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
                    self.stats.failing_reason = f"cannot connect: {exc}"
                    if getattr(exc, "permanent", False):
                        # Retrying cannot help (e.g. the broker refuses the idempotent producer):
                        # say it once, keep buffering (then dropping, counted) until shutdown.
                        self.stats.failing_reason = str(exc)
                        log.error("prediction_log_sink_refused", sink=self.sink.name, error=str(exc))
                        await self._closed.wait()
                        return
                    log.warning("prediction_log_sink_unavailable", sink=self.sink.name, error=str(exc), retry_in_s=backoff)
                    await self._sleep_unless_closing(backoff)
                    backoff = min(backoff * 2, 5.0)
                    if self._closing:
                        return
                    continue
            if (
                self.linger_s
                and len(self._queue) < self.batch_size
                and self.stats.buffered_bytes < self._ship_bytes
                and not self._closing
            ):
                # Up to linger_s, or until a whole batch (or a WritingSink's ship_bytes) waits or the log closes.
                self._ship.clear()
                try:
                    await asyncio.wait_for(self._ship.wait(), self.linger_s)
                except TimeoutError:
                    pass
            queue = self._queue
            if not queue:  # written meanwhile (a WritingSink, from emit)
                continue
            if len(queue) <= self.batch_size:  # the whole queue, copied in C (the usual batch after a linger)
                batch = list(queue)
                queue.clear()
            else:
                batch = [queue.popleft() for _ in range(self.batch_size)]
            self._inflight = batch
            send_error: str | None = None
            try:
                failed = await self.sink.send(batch)
            except asyncio.CancelledError:
                # close() hit its deadline mid-send: put the batch back so it is counted as dropped.
                self._inflight = None
                self._queue.extendleft(reversed(batch))
                raise
            except Exception as exc:
                log.warning("prediction_log_send_failed", sink=self.sink.name, error=str(exc), events=len(batch))
                send_error = str(exc)
                failed = batch
            self._inflight = None
            if self._settle(batch, failed, send_error):
                self.stats.connected = False
                try:
                    await self.sink.close()
                except Exception:  # the connection is already broken; reconnect next round
                    pass
                await self._sleep_unless_closing(backoff)
                backoff = min(backoff * 2, 5.0)
                if self._closing and not self._queue:
                    return

    def _settle(self, batch: list[LogEntry], failed: list[LogEntry], send_error: str | None) -> bool:
        """Count a batch the sink was handed; put what failed back at the head of the queue. True if some failed."""
        stats = self.stats
        # A sink that refuses an event for good counts it in ``rejected``: dropped, not delivered.
        rejected = getattr(self.sink, "rejected", 0) - self._rejected_seen
        self._rejected_seen += rejected
        stats.dropped_rejected += rejected
        delivered = len(batch) - len(failed) - rejected
        stats.delivered += delivered
        stats.buffered -= delivered + rejected
        stats.buffered_bytes -= sum(map(_SIZE, batch)) - (sum(map(_SIZE, failed)) if failed else 0)
        reason = send_error or getattr(self.sink, "last_error", None) or "not confirmed"
        stats.failing_reason = f"delivery failed: {reason}" if failed else None
        if not failed:
            return False
        stats.send_failures += 1
        self._queue.extendleft(reversed(failed))
        return True

    async def _sleep_unless_closing(self, seconds: float) -> None:
        # During shutdown keep retrying quickly until close()'s deadline cancels us.
        await asyncio.sleep(min(seconds, 0.2) if self._closing else seconds)
