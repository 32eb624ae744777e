"""1-row /score latency while two clients post ~17 MiB V2 JSON bodies (issue 33 item 5).

Starts a gateway (the echo model of the tests as the Python servable, no prediction logging) and
runs, for ``--duration`` seconds each, two phases: 1-row BASIC ``/score`` requests open-loop at
``--rate`` req/s alone, then the same beside two clients posting ~17 MiB V2 JSON bodies to
``/v2/models/bench.big.1/infer`` back to back. Prints the 1-row p50/p99 of both phases and the
big bodies' count and mean latency.

    python bench/large_bodies.py                 # 100 req/s, 5 s per phase
    python bench/large_bodies.py --rows 100000   # body size scales with --rows (~85 bytes a row)

Target: 1-row p99 beside the big bodies under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 100.0

MODEL = """
import numpy as np
from forestflow.core.frame import Frame

def predict(frame):
    return Frame({"double": np.asarray(frame["x"], dtype=np.float64) * 2})
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deploy_body(project: str, directory: Path) -> dict[str, Any]:
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": "bench", "project": project, "contract_number": 1}, "release_version": "v1"},
        "flavor": {"Python": {"modulePath": "model.py", "entryPoint": "predict"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE", "keyFeatures": []},
        },
    }


def big_body(rows: int) -> bytes:
    """A V2 JSON request: four FP64 columns of ``rows`` values each, written the way clients do."""
    cols = {f"c{j}": [round(i * 0.123457 + j, 6) + 1000.0 for i in range(rows)] for j in range(3)}
    cols["x"] = [i * 0.5 + 0.123456 for i in range(rows)]
    inputs = [{"name": n, "datatype": "FP64", "shape": [rows], "data": v} for n, v in cols.items()]
    return orjson.dumps({"inputs": inputs})


def small_body(i: int) -> bytes:
    return orjson.dumps(
        {
            "schema": [{"type": "Float64", "fields": ["x"]}],
            "datum": [{"tensors": [{"Float64": {"data": [float(i % 100)]}}]}],
            "configs": {},
        }
    )


def pct(data: list[float], q: float) -> float:
    data = sorted(data)
    return data[min(len(data) - 1, int(q / 100 * len(data)))] if data else float("nan")


async def small_phase(session: aiohttp.ClientSession, url: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Open loop: request i leaves at start + i/rate; latency from its scheduled time."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0
    start = loop.time() + 0.05

    async def one(i: int, due: float) -> None:
        nonlocal errors
        async with session.post(url, data=small_body(i), headers={"Content-Type": "application/json"}) as r:
            await r.read()
            if r.status != 200:
                errors += 1
        latencies.append((loop.time() - due) * 1000)

    tasks = []
    for i in range(int(rate * seconds)):
        due = start + i / rate
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return latencies, errors


async def big_client(
    session: aiohttp.ClientSession, url: str, body: bytes, stop: asyncio.Event, out: list[float], statuses: list[int]
) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            await r.read()
            statuses.append(r.status)
        out.append((time.perf_counter() - started) * 1000)


async def run(args: argparse.Namespace, base: str) -> int:
    models = Path(tempfile.mkdtemp(prefix="ff-bench-models-"))
    (models / "model.py").write_text(MODEL)
    body_mib = len(big_body(args.rows)) / 2**20
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for project in ("small", "big"):
            async with session.post(base + "/servable", json=deploy_body(project, models)) as r:
                assert r.status == 200, await r.text()
        score = base + "/bench/small/1/score"
        await small_phase(session, score, args.rate, 1.0)  # warm-up
        alone, alone_errors = await small_phase(session, score, args.rate, args.duration)
        # The two big clients run in another process: posting and reading their bodies must not
        # stall the loop that times the small requests.
        big_proc = subprocess.Popen(  # noqa: ASYNC220 (started once, before the timed phase)
            [sys.executable, __file__, "--big-client", base + "/v2/models/bench.big.1/infer", "--rows", str(args.rows)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert big_proc.stdout is not None
        assert big_proc.stdout.readline().strip() == "posting"
        await asyncio.sleep(0.5)
        beside, beside_errors = await small_phase(session, score, args.rate, args.duration)
        big_proc.send_signal(signal.SIGINT)
        result = orjson.loads(big_proc.communicate(timeout=120)[0].strip().splitlines()[-1])
        big_ms, statuses = result["ms"], result["statuses"]
    print(
        f"big body: {body_mib:.1f} MiB ({args.rows} rows x 4 FP64 columns), {len(big_ms)} answered "
        f"(statuses {sorted(set(statuses))}), mean {sum(big_ms) / max(1, len(big_ms)):.0f} ms"
    )
    print(
        f"1-row /score alone:       p50 {pct(alone, 50):7.1f} ms  p99 {pct(alone, 99):7.1f} ms  "
        f"({len(alone)} requests, {alone_errors} errors)"
    )
    print(
        f"1-row /score beside them: p50 {pct(beside, 50):7.1f} ms  p99 {pct(beside, 99):7.1f} ms  "
        f"({len(beside)} requests, {beside_errors} errors)"
    )
    ok = pct(beside, 99) < TARGET_P99_MS and not alone_errors and not beside_errors and set(statuses) == {200}
    print(f"target p99 beside big bodies < {TARGET_P99_MS:.0f} ms: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


def big_clients(url: str, rows: int) -> int:
    """Two clients posting the big body back to back until SIGINT; prints their latencies as JSON."""
    body = big_body(rows)

    async def go() -> None:
        stop, out, statuses = asyncio.Event(), [], []
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            print("posting", flush=True)
            await asyncio.gather(*(big_client(session, url, body, stop, out, statuses) for _ in range(2)))
        print(orjson.dumps({"ms": out, "statuses": statuses}).decode(), flush=True)

    asyncio.run(go())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="1-row requests per second")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per phase")
    parser.add_argument("--rows", type=int, default=350_000, help="rows of each big body")
    parser.add_argument("--big-client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.big_client:
        return big_clients(args.big_client, args.rows)
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="ff-bench-data-"))
    env = {
        **os.environ,
        "FORESTFLOW_ALLOW_PYTHON": "1",
        "FORESTFLOW_GRPC_PORT": "-1",
        "FORESTFLOW_ACCESS_LOG": "0",
        "FORESTFLOW_ARTIFACT_ROOTS": tempfile.gettempdir(),
        "FORESTFLOW_LOG_LEVEL": "warning",
        "FORESTFLOW_DRAIN_GRACE_S": "0",
        "FORESTFLOW_MAX_ROWS": "1000000",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "forestflow.cli", "serve", "--port", str(port), "--data-dir", str(data)], env=env, cwd=ROOT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("gateway did not start")
            time.sleep(0.1)
        return asyncio.run(run(args, base))
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    raise SystemExit(main())
