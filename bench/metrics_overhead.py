"""CPU the /metrics counting adds to one request, measured in process (no network, no scheduler noise).

Runs the HTTP middleware around a trivial handler 100,000 times with counting off and on, twice,
and prints microseconds of process CPU per request. ``bench/run.py --metrics-cost`` measures the
same end to end on the 1-row /score cell; on a shared machine that figure is noisier than the
difference it looks for, so this one is the precise number.

    python bench/metrics_overhead.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forestflow.api.common import CONTRACT, FQRV_TAG, SCORING_S  # noqa: E402
from forestflow.api.middleware import RequestRecorder, build_middleware  # noqa: E402
from forestflow.api.prom import RequestMetrics  # noqa: E402

N = 100_000


async def handler(request: web.Request) -> web.Response:
    """What a scoring front-end leaves for the middleware: the names and the scoring time."""
    request[CONTRACT] = "bench.none.1"
    request[FQRV_TAG] = "bench.none.1.v1"
    request[SCORING_S] = 0.0001
    return web.Response(body=b"{}")


async def main() -> None:
    app = web.Application()
    app.router.add_post("/{org}/{project}/{n}/score", handler)
    metrics = RequestMetrics()
    metrics.classify_routes(app)
    results: dict[str, list[float]] = {"off": [], "on": []}
    for label in ("off", "on", "off", "on"):
        middleware = build_middleware(RequestRecorder(False, metrics if label == "on" else None))
        request = make_mocked_request("POST", "/bench/none/1/score", app=app)
        request._match_info = await app.router.resolve(request)
        started = time.process_time()
        for _ in range(N):
            await middleware(request, handler)
        results[label].append((time.process_time() - started) / N * 1e6)
    off, on = min(results["off"]), min(results["on"])
    print(f"middleware CPU per request: counting off {off:.2f} us, on {on:.2f} us: +{on - off:.2f} us per request")


if __name__ == "__main__":
    asyncio.run(main())
