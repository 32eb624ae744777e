"""The file log follows rotation (issue 33 item 4): a renamed file is left for the new one, SIGHUP
reopens, and a write that fails half-way writes no event twice."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from forestflow.predlog import file_sink
from forestflow.predlog.file_sink import FileSink
from forestflow.predlog.log import PredictionLog
from tests.predlog import logged_request_ids, make_record, wait_for
from tests.support import GatewayProcess, python_servable, score_body


async def test_a_renamed_log_is_left_for_a_new_file_at_the_path(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    plog = PredictionLog(FileSink(path), 1 << 20)
    plog.start()
    for i in range(3):
        assert plog.emit(make_record(i))
    await wait_for(lambda: plog.stats.delivered == 3, 5, "first events written")
    path.rename(tmp_path / "predictions.jsonl.1")  # what logrotate does
    for i in range(3, 6):
        assert plog.emit(make_record(i))
    await wait_for(lambda: plog.stats.delivered == 6, 5, "later events written")
    await plog.close(5)
    assert logged_request_ids(tmp_path / "predictions.jsonl.1") == ["req-0", "req-1", "req-2"]
    assert logged_request_ids(path) == ["req-3", "req-4", "req-5"]  # before the fix: absent, all in .1
    assert plog.sink.reopened == 1


@pytest.mark.parametrize(("fmt", "meanwhile"), [("jsonl", None), ("protobuf", None), ("jsonl", "rotated"), ("jsonl", "sighup")])
async def test_a_write_failing_half_way_writes_no_event_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, meanwhile: str | None
) -> None:
    """The disk fills in the middle of the 4th event: the retry completes that event and writes the
    rest; every event is in the file exactly once, whole, and counted delivered once. Rotated as the write
    fails, the old file keeps the 4th event's torn start and the new one gets it whole; reopened by SIGHUP
    alone, the same file gets the rest of it."""
    path = tmp_path / f"predictions.{fmt}"
    sink = FileSink(path, fmt)
    real_writev, real_write = os.writev, os.write
    failures = [1]

    def short_writev(fd: int, buffers: list[bytes]) -> int:
        if not failures:
            return real_writev(fd, buffers)
        cut = sum(len(b) for b in buffers[:6]) + 40  # three events and a bit of the 4th: a short write
        return real_write(fd, b"".join(buffers)[:cut])

    def full_disk(fd: int, data: bytes) -> int:
        if failures and fd == sink._files[False].fileno():
            failures.pop()  # the rest of the batch meets a full disk
            if meanwhile == "rotated":
                path.rename(tmp_path / "rotated.log")
            elif meanwhile == "sighup":
                sink.reopen()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(file_sink.os, "writev", short_writev)
    monkeypatch.setattr(file_sink.os, "write", full_disk)
    plog = PredictionLog(sink, 1 << 20, retry_backoff_s=0.05, batch_size=500, linger_s=0.05)
    plog.start()
    for i in range(10):
        assert plog.emit(make_record(i))
    await wait_for(lambda: plog.stats.delivered == 10, 5, f"all delivered ({plog.stats})")
    await plog.close(5)
    assert not failures  # the failure did happen
    assert plog.stats.send_failures >= 1 and plog.stats.delivered == 10 and plog.stats.dropped == 0
    if meanwhile == "rotated":  # before the fix: the new file started with the rest of the torn event
        *whole, torn = (tmp_path / "rotated.log").read_bytes().split(b"\n")
        new = path.read_bytes().splitlines()
        assert len(whole) == 3 and len(torn) == 40 and new[0].startswith(torn)
        ids = [json.loads(line)["event"]["requestId"] for line in whole + new]
    elif fmt == "jsonl":  # SIGHUP, before the fix: the 4th event written whole after its own torn start
        ids = logged_request_ids(path)
    else:
        from forestflow._proto import forestflow_pb2 as pb
        from tests.predlog.test_prediction_log import _delimited

        ids = [pb.PredictionEvent.FromString(v).requestId for v in _delimited(path.read_bytes())]
    assert ids == [f"req-{i}" for i in range(10)], ids  # before the fix: req-0..2 twice and a torn req-3


def test_gateway_reopens_its_log_on_sighup(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    """SIGHUP (logrotate's postrotate) reopens the file log; before, it killed the gateway."""
    gw = gateway_process(tmp_path / "data", env={"FORESTFLOW_LOG_LINGER_MS": "0"}).start()
    assert requests.post(gw.url + "/servable", json=python_servable(log_level="FULL"), timeout=30).status_code == 200
    path = tmp_path / "data" / "predictions.jsonl"

    def score(n: int) -> None:
        for i in range(n):
            r = requests.post(gw.url + "/acme/demo/1/score", json=score_body([float(i)], configs={"reqid": f"r{i}"}), timeout=10)
            assert r.status_code == 200, r.text

    def lines(p: Path) -> int:
        return len(p.read_text().splitlines()) if p.exists() else 0

    score(2)
    deadline = time.monotonic() + 10
    while lines(path) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lines(path) == 2
    # logrotate's rename, then its postrotate script's "kill -HUP": the gateway lives on and the
    # later events go to the new file at the path.
    os.rename(path, tmp_path / "data" / "predictions.jsonl.1")
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "prediction_log_reopen_requested" not in gw.log() and time.monotonic() < deadline:
        assert gw.proc.poll() is None, gw.log()
        time.sleep(0.02)
    assert gw.proc.poll() is None, gw.log()
    score(3)
    deadline = time.monotonic() + 10
    while lines(path) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lines(path) == 3 and lines(tmp_path / "data" / "predictions.jsonl.1") == 2
    assert gw.stop() == 0
