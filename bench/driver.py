"""Load drivers: wrk with a Lua body script (pinned to core 1), or an asyncio client when wrk is missing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LUA = """
local f = io.open(os.getenv("BENCH_BODY"), "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = os.getenv("BENCH_CT")
for name, value in (os.getenv("BENCH_HEADERS") or ""):gmatch("([^:\\n]+): ([^\\n]*)") do
  wrk.headers[name] = value
end
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if pause > 0 then
  delay = function() return pause end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.stderr:write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"status_errors":%d,"socket_errors":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
"""


#: Whether the missing-wrk warning was printed (once per process).
_warned = False


@dataclass
class Result:
    """One load run's figures."""

    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: Server CPU microseconds per request (filled in by the runner when it knows the server's pid).
    cpu_us: float = float("nan")
    #: The part of ``cpu_us`` spent in the kernel (filled in where the runner splits it).
    sys_us: float = float("nan")


def drive(
    url: str,
    body: bytes,
    content_type: str,
    concurrency: int,
    duration_s: float,
    headers: dict[str, str] | None = None,
    timeout_s: float = 2.0,
    pause_ms: int = 0,
) -> Result:
    """POST ``body`` to ``url`` at ``concurrency`` for ``duration_s`` seconds (with ``headers`` besides
    the content type, e.g. V2's Inference-Header-Content-Length); wrk counts a request unanswered after
    ``timeout_s`` as an error (its default, 2 s). ``pause_ms``: each connection waits that long after an
    answer before its next request (wrk's ``delay``), which paces the load below saturation."""
    if shutil.which("wrk"):
        return _wrk(url, body, content_type, concurrency, duration_s, headers or {}, timeout_s, pause_ms)
    if pause_ms:
        raise RuntimeError("a paced load (pause_ms) needs wrk (apt-get install wrk)")
    global _warned
    if not _warned:
        _warned = True
        print(
            "# wrk not found (apt-get install wrk): an asyncio client in this process drives the load, unpinned "
            "and slower than the servers; its figures do not compare with wrk's",
            file=sys.stderr,
            flush=True,
        )
    return asyncio.run(_asyncio_client(url, body, content_type, concurrency, duration_s, headers or {}))


def _wrk(
    url: str,
    body: bytes,
    content_type: str,
    concurrency: int,
    duration_s: float,
    headers: dict[str, str],
    timeout_s: float,
    pause_ms: int = 0,
) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(LUA)
        threads = 1 if concurrency < 4 else 2
        argv = ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(duration_s))}s", "--latency"]
        argv += [f"--timeout={max(1, round(timeout_s))}s", "-s", str(script), url]
        if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
            argv = ["taskset", "-c", "1", *argv]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "BENCH_BODY": str(body_file),
                "BENCH_CT": content_type,
                "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
                "BENCH_DELAY_MS": str(pause_ms),
            },
            timeout=duration_s + 60,
        )
    line = next((text for text in done.stderr.splitlines() if text.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {done.stdout}\n{done.stderr}")
    data = json.loads(line)
    seconds = data["duration_us"] / 1e6
    return Result(
        requests=data["requests"],
        rps=data["requests"] / seconds if seconds else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=data["status_errors"] + data["socket_errors"],
    )


async def _asyncio_client(
    url: str, body: bytes, content_type: str, concurrency: int, duration_s: float, headers: dict[str, str]
) -> Result:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers={"Content-Type": content_type, **headers}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    # Without Accept-Encoding, as wrk sends: aiohttp's client asks for gzip by default, and a gateway
    # would then compress every answer of 1 KiB or more (a third of a 100-row V2 request's CPU).
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), skip_auto_headers=("Accept-Encoding",)
    ) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return Result(len(latencies), len(latencies) / elapsed, pct(0.5), pct(0.99), errors)
