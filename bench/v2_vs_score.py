"""Throughput of KServe V2 ``/v2/models/{m}/infer`` beside ForestFlow's ``/score``, same rows, same run.

Starts one gateway child process (pinned to core 0 when ``taskset`` exists) serving the binomial
prostate GBM MOJO, then drives it from this process (pinned to core 1) with an asyncio/aiohttp
loop: a fixed number of requests at concurrency 16 per endpoint, after a warm-up, the endpoints
alternating in rounds so that load from elsewhere on the machine hits them alike. Endpoints:

* ``/score``: ForestFlow BASIC JSON (schema + datum), the reference;
* ``v2 json``: V2 JSON in the pd layout (one tensor per feature);
* ``v2 np``: V2 JSON in the np layout (one [N, 7] FP64 tensor, TrustyAI style);
* ``v2 binary``: V2 with the binary tensor extension in and out (what tritonclient sends by default).

Every answer is checked (status 200, one prediction per row). Responses are requested uncompressed
(``Accept-Encoding: identity``) so that no endpoint pays for gzip the others do not.

    .venv/bin/python bench/v2_vs_score.py [--requests 2000] [--rows 1 100] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import Server, free_port, pinned, wait_http  # noqa: E402

CONTRACT = ("bench", "v2", 1)
MODEL = "bench.v2.1"
FEATURES = ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"]


@dataclass
class Endpoint:
    """One way of sending the same rows."""

    name: str
    path: str
    body: bytes
    headers: dict[str, str]


def v2_np_body(n: int) -> bytes:
    """The rows as one [N, F] FP64 tensor, columns in the model's input order."""
    rows = payloads.rows(n)
    data = [[float(r[f]) for f in FEATURES] for r in rows]
    return orjson.dumps({"inputs": [{"name": "predict", "shape": [n, len(FEATURES)], "datatype": "FP64", "data": data}]})


def v2_binary_body(n: int) -> tuple[bytes, int]:
    """The rows in the pd layout with every tensor in the binary extension; binary outputs asked for."""
    rows = payloads.rows(n)
    inputs, blobs = [], []
    for f in FEATURES:
        if f in payloads.CATEGORICAL:
            blob = b"".join(struct.pack("<I", len(v)) + v for v in (r[f].encode() for r in rows))
            datatype = "BYTES"
        else:
            blob = struct.pack(f"<{n}d", *(float(r[f]) for r in rows))
            datatype = "FP64"
        inputs.append({"name": f, "shape": [n], "datatype": datatype, "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    head = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    return head + b"".join(blobs), len(head)


def endpoints(n: int) -> list[Endpoint]:
    """The four ways of scoring ``n`` rows."""
    org, project, number = CONTRACT
    json_ct = {"Content-Type": "application/json"}
    binary, head = v2_binary_body(n)
    infer = f"/v2/models/{MODEL}/infer"
    return [
        Endpoint("/score", f"/{org}/{project}/{number}/score", payloads.score_body(n), json_ct),
        Endpoint("v2 json (pd)", infer, payloads.v2_body(n), json_ct),
        Endpoint("v2 np", infer, v2_np_body(n), json_ct),
        Endpoint("v2 binary", infer, binary, {"Inference-Header-Content-Length": str(head)}),
    ]


def check(endpoint: Endpoint, status: int, body: bytes, headers: dict[str, str], n: int) -> None:
    """Fail loudly unless the answer is a 200 carrying ``n`` predictions."""
    if status != 200:
        raise RuntimeError(f"{endpoint.name}: HTTP {status}: {body[:300]!r}")
    if endpoint.path.endswith("/score"):
        got = len(orjson.loads(body)["Prediction"]["datum"])
    else:
        length = int(headers.get("Inference-Header-Content-Length", len(body)))
        got = orjson.loads(body[:length])["outputs"][0]["shape"][0]
    if got != n:
        raise RuntimeError(f"{endpoint.name}: {got} predictions for {n} rows")


async def load(
    session: aiohttp.ClientSession, endpoint: Endpoint, total: int, concurrency: int, n: int
) -> tuple[list[float], float]:
    """``total`` requests from ``concurrency`` workers: the latency of each and the wall time of all."""
    latencies: list[float] = []
    remaining = [total]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            started = time.perf_counter()
            async with session.post(endpoint.path, data=endpoint.body, headers=endpoint.headers) as r:
                body = await r.read()
                latencies.append(time.perf_counter() - started)
                check(endpoint, r.status, body, dict(r.headers), n)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


async def measure(url: str, args: argparse.Namespace) -> None:
    """Per row count: warm up, then alternate the endpoints in rounds so that drift hits all alike."""
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    headers = {"Accept-Encoding": "identity"}
    async with aiohttp.ClientSession(url, connector=connector, headers=headers) as session:
        print(f"{'rows':>5}  {'endpoint':<14} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs /score':>10}")
        for n in args.rows:
            points = endpoints(n)
            for endpoint in points:  # warm-up: JIT, connection pool, caches
                await load(session, endpoint, args.warmup, args.concurrency, n)
            latencies: dict[str, list[float]] = {e.name: [] for e in points}
            walls = dict.fromkeys(latencies, 0.0)
            for _ in range(args.rounds):
                for endpoint in points:
                    lat, wall = await load(session, endpoint, args.requests // args.rounds, args.concurrency, n)
                    latencies[endpoint.name] += lat
                    walls[endpoint.name] += wall
            reference = len(latencies["/score"]) / walls["/score"]
            for endpoint in points:
                lat = sorted(latencies[endpoint.name])
                rps = len(lat) / walls[endpoint.name]
                p50, p99 = statistics.median(lat) * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
                print(f"{n:>5}  {endpoint.name:<14} {rps:>9.0f} {p50:>8.2f} {p99:>8.2f} {rps / reference:>9.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per endpoint and row count")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the endpoints per row count")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100], help="rows per request")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ff-v2-bench-"))
    port = free_port()
    env = {**os.environ, "FORESTFLOW_GRPC_PORT": "-1"}
    proc = subprocess.Popen(
        pinned(0, [sys.executable, "-m", "forestflow.cli", "serve", "--port", str(port), "--data-dir", str(work / "data")]),
        env=env,
        cwd=ROOT,
        stdout=open(work / "gateway.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server(proc, f"http://127.0.0.1:{port}")
    try:
        wait_http(server.url + "/health/live")
        r = requests.post(server.url + "/servable", json=payloads.definition(CONTRACT, "NONE"), timeout=120)
        r.raise_for_status()
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})  # the load loop on the other core
        print(
            f"# gateway pid {proc.pid} on core 0, load on core 1; {args.requests} requests per cell at "
            f"concurrency {args.concurrency}; H2O MOJO {payloads.FIXTURE.name}; logs in {work}"
        )
        asyncio.run(measure(server.url, args))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
