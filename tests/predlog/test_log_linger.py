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

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        self.batches.append(len(entries))
        return await super().send(entries)


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
    assert Settings().log_linger_ms == 50
    with pytest.raises(Exception, match="log_linger_ms"):
        Settings(log_linger_ms=-1)
