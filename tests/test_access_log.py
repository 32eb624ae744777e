"""The access log: one JSON line per request, buffered briefly, never out of order with other lines."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path

import requests

from forestflow import logs
from tests.support import GatewayProcess, python_servable, score_body


async def test_buffered_lines_wait_for_the_timer_and_precede_immediate_ones() -> None:
    out = io.BytesIO()
    sink = logs.LineSink(out)
    sink.buffer(b"a\n")
    sink.buffer(b"b\n")
    assert out.getvalue() == b""
    await asyncio.sleep(logs.ACCESS_FLUSH_S + 0.1)
    assert out.getvalue() == b"a\nb\n"
    sink.buffer(b"c\n")
    sink.write(b"now\n")  # an error line: the buffered one goes out first
    assert out.getvalue() == b"a\nb\nc\nnow\n"


def test_a_full_buffer_is_written_at_once_and_without_a_loop_nothing_waits() -> None:
    out = io.BytesIO()
    sink = logs.LineSink(out, max_pending=10)
    sink.buffer(b"0123456789\n")
    assert out.getvalue() == b"0123456789\n"
    sink = logs.LineSink(out := io.BytesIO())
    sink.buffer(b"x\n")  # no running loop: no timer could flush it later
    assert out.getvalue() == b"x\n"


def _lines(gw: GatewayProcess) -> list[dict]:
    return [json.loads(line) for line in gw.log_path.read_text().splitlines() if line.startswith("{")]


def test_every_request_gets_one_line_with_id_contract_servable_status_latency(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    gw = gateway_process(tmp_path / "data").start()
    assert requests.post(gw.url + "/servable", json=python_servable(), timeout=30).status_code == 200
    ok = requests.post(gw.url + "/acme/demo/1/score", json=score_body([1.0]), timeout=10)
    unknown = requests.post(gw.url + "/acme/nope/1/score", json=score_body([1.0]), timeout=10)
    bad = requests.post(gw.url + "/acme/demo/1/score", data=b"{", timeout=10)
    assert (ok.status_code, unknown.status_code, bad.status_code) == (200, 404, 400)

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(e.get("request_id") == bad.headers["X-Request-Id"] for e in _lines(gw)):
        time.sleep(0.05)  # written by the flush timer while the gateway keeps running
    access = {e["request_id"]: e for e in _lines(gw) if e.get("event") == "request"}
    line = access[ok.headers["X-Request-Id"]]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/acme/demo/1/score", 200)
    assert (line["contract"], line["fqrv"], line["level"]) == ("acme.demo.1", "acme.demo.1.v1", "info")
    assert isinstance(line["ms"], float) and line["ms"] >= 0 and line["timestamp"].endswith("Z")
    assert (access[unknown.headers["X-Request-Id"]]["status"], access[unknown.headers["X-Request-Id"]]["fqrv"]) == (404, None)
    assert access[bad.headers["X-Request-Id"]]["status"] == 400

    for _ in range(3):
        requests.get(gw.url + "/health/live", timeout=10)
    assert gw.stop() == 0
    events = [e.get("event") for e in _lines(gw)]
    assert events[-1] == "stopped"  # the last access lines were written before it, at shutdown
    assert events.count("request") == len(access) + 3


def test_a_timer_left_behind_by_an_ended_loop_does_not_hold_later_lines() -> None:
    out = io.BytesIO()
    sink = logs.LineSink(out)

    async def buffer_then_leave() -> None:
        sink.buffer(b"first\n")  # its loop ends before the timer fires

    async def buffer_and_wait() -> None:
        sink.buffer(b"second\n")
        await asyncio.sleep(logs.ACCESS_FLUSH_S + 0.1)

    asyncio.run(buffer_then_leave())
    assert out.getvalue() == b""
    asyncio.run(buffer_and_wait())
    assert out.getvalue() == b"first\nsecond\n"
