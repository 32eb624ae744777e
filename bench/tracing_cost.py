"""What tracing costs a 1-row /score: tracing off, then on with every request sampled, in turns.

Runs the real app in process (tests/support.serve_in_process) with a Python echo servable and
sends 1-row /score requests one at a time over loopback; with tracing on, spans go over OTLP/HTTP
to a receiver on loopback in the same process (tests/ops/test_tracing.receiver), so the export
is counted too. Prints process CPU microseconds per request (client, gateway and receiver: the
difference is tracing's) and the median latency, the best of the rounds of each.

    python bench/tracing_cost.py [requests per round, default 1500] [rounds, default 2]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.ops.test_tracing import receiver  # noqa: E402
from tests.support import python_servable, score_body, serve_in_process  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def one_round(tracing_on: bool, n: int) -> tuple[float, float]:
    """(CPU us per request, median ms) of ``n`` 1-row /score requests."""
    with tempfile.TemporaryDirectory() as tmp:
        async with receiver() as (url, spans):
            extra = {"otel_exporter_otlp_endpoint": url, "otel_traces_sampler_ratio": 1.0} if tracing_on else {}
            async with serve_in_process(Path(tmp) / "data", access_log=False, log_level="warning", **extra) as gw:
                async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
                    assert r.status == 200
                body = score_body([1.5])
                headers = {"traceparent": PARENT} if tracing_on else {}
                for _ in range(200):  # warm up
                    async with gw.session.post(gw.url + "/acme/demo/1/score", json=body, headers=headers) as r:
                        await r.read()
                latencies = []
                cpu = time.process_time()
                for _ in range(n):
                    started = time.perf_counter()
                    async with gw.session.post(gw.url + "/acme/demo/1/score", json=body, headers=headers) as r:
                        await r.read()
                        assert r.status == 200
                    latencies.append(time.perf_counter() - started)
                cpu = time.process_time() - cpu
            if tracing_on:
                assert len(spans) >= 3 * n, f"only {len(spans)} spans exported"
    return cpu / n * 1e6, statistics.median(latencies) * 1000


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(rounds):
        for on in (False, True):
            results[on].append(await one_round(on, n))
    for on in (False, True):
        cpu, ms = min(c for c, _ in results[on]), min(m for _, m in results[on])
        print(
            f"tracing {'on (100%)' if on else 'off':9}: {cpu:7.1f} us CPU per request, median {ms:.3f} ms  "
            f"(rounds: {', '.join(f'{c:.0f}' for c, _ in results[on])} us)"
        )
    off, on_ = min(c for c, _ in results[False]), min(c for c, _ in results[True])
    print(f"tracing on costs +{on_ - off:.1f} us CPU per request ({(on_ / off - 1) * 100:.0f}%)")


if __name__ == "__main__":
    asyncio.run(main())
