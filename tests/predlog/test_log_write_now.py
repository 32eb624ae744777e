"""A sink that writes in place (the local file) is handed the waiting events from ``emit`` once
``ship_bytes`` of them wait, without the linger; a failed write is retried by the drain task, in order."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from forestflow.predlog.file_sink import INLINE_WRITE_BYTES, SHIP_BYTES, FileSink
from forestflow.predlog.log import LogEntry, PredictionLog
from tests.predlog import logged_request_ids, make_record, wait_for


class _CountingFileSink(FileSink):
    """The real file sink, counting what it is handed by ``send`` (the drain) and ``write_now`` (emit)."""

    def __init__(self, path: Path, ship_bytes: int) -> None:
        super().__init__(path)
        self.ship_bytes = ship_bytes
        self.sent: list[int] = []
        self.written_now: list[int] = []

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        self.sent.append(len(entries))
        return await super().send(entries)

    def write_now(self, entries: list[LogEntry]) -> list[LogEntry] | None:
        self.written_now.append(len(entries))
        return super().write_now(entries)


class _SendingSink:
    """A sink with ``send`` alone (as Kafka's): its batches end with the linger or a whole batch."""

    name = "sending"
    ship_bytes = 1000

    async def start(self) -> None: ...

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        return []

    async def close(self) -> None: ...


def test_only_a_sink_that_writes_in_place_is_written_from_emit() -> None:
    sink = FileSink(Path("unused.jsonl"))
    assert sink.ship_bytes == SHIP_BYTES < INLINE_WRITE_BYTES
    assert PredictionLog(sink, 1 << 20)._ship_bytes == SHIP_BYTES
    assert PredictionLog(_SendingSink(), 1 << 20)._ship_bytes == sys.maxsize


async def test_events_are_in_the_file_when_emit_returns_once_ship_bytes_wait(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    sink = _CountingFileSink(path, ship_bytes=4000)
    plog = PredictionLog(sink, 1 << 20, linger_s=60.0)  # a linger nothing here sits out
    plog.start()
    assert plog.emit(make_record(0))
    await wait_for(lambda: plog.stats.connected, 10, "the sink opened")  # the drain opened the sink and lingers on event 0
    size = plog.stats.buffered_bytes
    n = 1
    while plog.stats.buffered_bytes + 2 * size < 4000:  # below ship_bytes: nothing is written yet
        assert plog.emit(make_record(n))
        n += 1
    assert not path.exists() and sink.written_now == []
    before = n
    while not sink.written_now:  # at ship_bytes every waiting event is written before emit returns
        assert plog.emit(make_record(n)) and n - before < 3
        n += 1
    assert sink.written_now == [n] and sink.sent == []
    assert logged_request_ids(path) == [f"req-{i}" for i in range(n)]
    assert (plog.stats.delivered, plog.stats.buffered, plog.stats.buffered_bytes) == (n, 0, 0)
    assert plog.emit(make_record(n))  # one more waits for the linger, here cut by close()
    await asyncio.wait_for(plog.close(30), 10)
    assert sink.sent == [1]  # the drain sent no empty batch for the events emit wrote
    assert logged_request_ids(path) == [f"req-{i}" for i in range(n + 1)]
    assert plog.stats.delivered == n + 1 and plog.stats.dropped == 0


async def test_a_failed_write_from_emit_is_retried_by_the_drain_in_order(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    sink = _CountingFileSink(logs / "predictions.jsonl", ship_bytes=2000)
    plog = PredictionLog(sink, 1 << 20, linger_s=60.0, retry_backoff_s=0.05)
    plog.start()
    assert plog.emit(make_record(0))
    await wait_for(lambda: plog.stats.connected, 10, "the sink opened")
    logs.rmdir()
    logs.write_bytes(b"")  # the file's directory is now a file: opening it fails
    n = 1
    while not sink.written_now:
        assert plog.emit(make_record(n)) and n < 100
        n += 1
    # Nothing lost, nothing dropped: the events wait for the drain, which retries with its backoff.
    assert plog.stats.delivered == 0 and plog.stats.buffered == n and plog.stats.dropped == 0
    # Why, in the sink's words (before: "delivery failed: not confirmed").
    assert plog.stats.failing_reason is not None and "Not a directory" in plog.stats.failing_reason
    assert plog.emit(make_record(n))  # while it fails, emit leaves the writing to the drain
    n += 1
    assert len(sink.written_now) == 1
    await wait_for(lambda: plog.stats.send_failures >= 3, 10, "three failed attempts")
    logs.unlink()
    await wait_for(lambda: plog.stats.delivered == n, 10, "every event delivered")
    assert plog.stats.failing_reason is None and plog.stats.buffered == 0
    assert logged_request_ids(logs / "predictions.jsonl") == [f"req-{i}" for i in range(n)]
    while len(sink.written_now) == 1:  # delivering again: emit writes again
        assert plog.emit(make_record(n)) and n < 200
        n += 1
    await asyncio.wait_for(plog.close(30), 10)
    assert logged_request_ids(logs / "predictions.jsonl") == [f"req-{i}" for i in range(n)]


async def test_a_batch_of_megabytes_is_left_to_the_drain(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    sink = _CountingFileSink(path, ship_bytes=1000)
    plog = PredictionLog(sink, 64 << 20, linger_s=60.0)
    plog.start()
    assert plog.emit(make_record(0))
    await wait_for(lambda: plog.stats.connected, 10, "the sink opened")
    assert plog.emit(make_record(1, pad=INLINE_WRITE_BYTES))  # too large to write on the event loop
    assert sink.written_now == [2] and not path.exists()
    # Shipped by the drain (in a worker thread) at once.
    await wait_for(lambda: plog.stats.delivered == 2, 10, "both events delivered")
    assert sink.sent == [2]
    assert logged_request_ids(path) == ["req-0", "req-1"]
    await plog.close(10)
