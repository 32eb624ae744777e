"""The drain task gathers the events of separate requests into one batch for the sink."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from forestflow.predlog import make_prediction_log
from forestflow.predlog.file_sink import FileSink
from forestflow.predlog.log import LogEntry, PredictionLog
from forestflow.settings import Settings
from tests.predlog import make_record


class _CountingFileSink(FileSink):
    """The real file sink, counting the batches it is given."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[int] = []
        #: Set after each batch is written.
        self.sent = asyncio.Event()

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        self.batches.append(len(entries))
        failed = await super().send(entries)
        self.sent.set()
        return failed


@pytest.mark.parametrize("linger_s", [0.0, 0.2])
async def test_linger_gathers_events_of_separate_requests_into_one_batch(tmp_path: Path, linger_s: float) -> None:
    sink = _CountingFileSink(tmp_path / "predictions.jsonl")
    plog = PredictionLog(sink, 1 << 20, linger_s=linger_s)
    plog.start()
    for i in range(20):
        assert plog.emit(make_record(i, {"user": f"u{i}"}))
        await asyncio.sleep(0)  # one request per event-loop turn
        await asyncio.sleep(0)
    await asyncio.sleep(linger_s + 0.1)
    assert plog.stats.delivered == 20
    await plog.close(5)
    assert sum(sink.batches) == 20
    assert (sink.batches == [20]) if linger_s else (len(sink.batches) > 1)
    assert len((tmp_path / "predictions.jsonl").read_bytes().splitlines()) == 20


def test_linger_setting() -> None:
    assert make_prediction_log(Settings(log_linger_ms=7)).linger_s == 0.007
    assert Settings().log_linger_ms == 200
    with pytest.raises(Exception, match="log_linger_ms"):
        Settings(log_linger_ms=-1)


async def test_a_whole_batch_or_close_ends_a_linger(tmp_path: Path) -> None:
    sink = _CountingFileSink(tmp_path / "predictions.jsonl")
    plog = PredictionLog(sink, 1 << 20, batch_size=5, linger_s=60.0)
    plog.start()
    for i in range(5):  # the fifth event makes a whole batch: shipped without sitting out the minute
        assert plog.emit(make_record(i, {"user": f"u{i}"}))
    await asyncio.wait_for(sink.sent.wait(), 10)
    assert sink.batches == [5]
    assert plog.emit(make_record(5, {"user": "u5"}))  # one event: its linger would last a minute
    await asyncio.sleep(0)
    await asyncio.wait_for(plog.close(30), 10)  # close() ends it and delivers the event
    assert plog.stats.delivered == 6 and sink.batches == [5, 1]
    assert len((tmp_path / "predictions.jsonl").read_bytes().splitlines()) == 6
