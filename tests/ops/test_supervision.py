"""Background work is supervised (issue 33 item 7): the prediction log's drain task is restarted
when it dies (counted, readiness false meanwhile); a failed background start exits non-zero with
one line; the ``--workers`` supervisor gives a worker its whole graceful stop before SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from forestflow.settings import Settings
from forestflow.supervisor import Supervisor, stop_deadline_s
from tests.support import ROOT, InProcessGateway, python_servable, score_body, wait_for


class DrainBug(BaseException):
    """Stands for a defect that escapes the drain's per-batch error handling."""


async def test_a_dead_drain_is_restarted_counted_and_unready_meanwhile(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(log_level="FULL")) as r:
        assert r.status == 200, await r.text()
    plog = gw.gateway.prediction_log
    plog.restart_backoff_s = 0.5
    real_send = plog.sink.send
    broken = asyncio.Event()
    broken.set()

    async def send(entries: list[Any]) -> list[Any]:
        if broken.is_set():
            raise DrainBug("a bug in the drain")
        return await real_send(entries)

    plog.sink.send = send
    for i in range(3):
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([float(i)], configs={"reqid": f"r{i}"})) as r:
            assert r.status == 200
    await wait_for(lambda: plog.stats.drain_restarts >= 1, 5, "the drain died")
    async with gw.session.get(gw.url + "/health/ready") as r:
        body = await r.json()
        assert r.status == 503 and body["predictionLogRunning"] is False, body
    broken.clear()
    await wait_for(lambda: plog.stats.delivered == 3, 10, f"the restarted drain delivers ({plog.stats})")
    assert plog.stats.buffered == 0 and plog.stats.dropped == 0
    async with gw.session.get(gw.url + "/health/ready") as r:
        assert r.status == 200, await r.text()
    async with gw.session.get(gw.url + "/metrics") as r:
        text = await r.text()
        assert "forestflow_prediction_log_drain_restarts_total" in text, text[:2000]
        restarts = next(line for line in text.splitlines() if line.startswith("forestflow_prediction_log_drain_restarts_total"))
        assert float(restarts.split()[-1]) >= 1


def test_a_failed_start_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    """A registry file that cannot be read: before, the process stayed alive, never ready."""
    data = tmp_path / "data"
    (data / "state").mkdir(parents=True)
    (data / "state" / "registry.json").write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "forestflow.cli", "serve", "--port", "0", "--grpc-port", "-1", "--data-dir", str(data)],
        env={"PATH": "/usr/bin:/bin", "FORESTFLOW_DRAIN_GRACE_S": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("forestflow: error:")]
    assert len(errors) == 1 and "gateway start failed: JSONDecodeError" in errors[0], result.stderr[-2000:]
    assert (data / "state" / "registry.json").read_text() == "{not json"  # left as it was


@pytest.mark.slow
def test_supervisor_waits_for_the_drain_grace_before_sigkill(tmp_path: Path) -> None:
    """A worker that needs its whole drain grace to stop is not killed: it exits 0 (before, the
    wait ignored drain_grace_s and it was SIGKILLed after shutdown + flush timeouts + 5 s)."""
    settings = Settings.load(
        environ={},
        overrides={
            "data_dir": tmp_path,
            "drain_grace_s": 6.0,
            "shutdown_timeout_s": 0.1,
            "log_flush_timeout_s": 0.1,
        },
    )
    assert stop_deadline_s(settings) >= 6.0 + 0.1 + 0.1
    # Stands for a worker draining for 5.6 s (less than grace + timeouts, more than the old 5.2 s wait).
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(5.6), sys.exit(0)))\n"
        "print('up', flush=True)\ntime.sleep(60)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"up\n"
        slot = type("Slot", (), {"process": worker})()
        started = time.monotonic()
        Supervisor(settings, [], 1)._stop_all([slot])
        assert worker.returncode == 0, worker.returncode  # before: -9 (SIGKILL)
        assert 5.5 < time.monotonic() - started < 10
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


async def test_close_does_not_wait_out_a_restart_backoff(tmp_path: Path) -> None:
    """A drain that died just before shutdown: close() restarts it at once and flushes."""
    from forestflow.predlog.file_sink import FileSink
    from forestflow.predlog.log import PredictionLog
    from tests.predlog import make_record

    plog = PredictionLog(FileSink(tmp_path / "p.jsonl"), 1 << 20, restart_backoff_s=30.0)
    real_send = plog.sink.send
    calls = [0]

    async def send(entries: list[Any]) -> list[Any]:
        calls[0] += 1
        if calls[0] == 1:
            raise DrainBug("once")
        return await real_send(entries)

    plog.sink.send = send
    plog.start()
    assert plog.emit(make_record(1))
    await wait_for(lambda: plog.stats.drain_restarts == 1, 5, "the drain died")
    started = time.monotonic()
    await plog.close(10)
    assert time.monotonic() - started < 5 and plog.stats.delivered == 1 and plog.stats.dropped == 0


def test_supervisor_passes_sighup_to_its_workers() -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGHUP, lambda *a: (print('hup', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\ntime.sleep(60)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"up\n"
        supervisor = Supervisor(Settings.load(environ={}), [], 1)
        supervisor._slots = [type("Slot", (), {"process": worker})()]
        supervisor._on_hangup(signal.SIGHUP, None)
        assert worker.stdout.readline() == b"hup\n" and worker.wait(10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
