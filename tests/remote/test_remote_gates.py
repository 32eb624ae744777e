"""A RemoteV2 release under the release gates (rolled back when its backend fails) and traced
end to end (the backend continues the caller's trace)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from forestflow import tracing
from tests.api.v2_support import v2_gateway
from tests.ops.test_tracing import PARENT, TRACE_ID, receiver
from tests.remote.support import FRONT, backend_gateway, remote_servable
from tests.support import free_port, python_servable, score_body, wait_for

KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}


def events(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "predictions.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line)["event"] for line in path.read_bytes().splitlines() if line.strip()]


@pytest.mark.slow
async def test_max_error_rate_rolls_back_from_a_failing_backend(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    async with v2_gateway(tmp_path / "front", access_log=False, evaluation_interval_s=0.1) as front:

        async def score() -> tuple[int, Any]:
            status, body, _ = await front.post_json("/acme/front/1/score", score_body([1.0], configs={"reqid": "r"}))
            return status, body

        async with backend_gateway(tmp_path / "backend", port, grpc_port) as backend:
            await backend.deploy(python_servable())
            await front.deploy(python_servable(FRONT, release="v1", contract_settings=KEEP_TWO))
            gate = [{"MaxErrorRateValidity": {"maxErrorRate": 0.2, "minEvents": 5}}]
            await front.deploy(remote_servable(url, release="v2", log_level="FULL", validity=gate, failureThreshold=100))

            async def remote_answers() -> bool:
                status, body = await score()
                assert status == 200, body
                return bool(body["Prediction"]["fqrv"]["releaseVersion"] == "v2")

            await wait_for(remote_answers, 10, "the remote release to pass its gate and answer")
        # The backend is gone: v2 fails (503), its error rate closes the gate, v1 answers again.
        failed_at, failures = time.monotonic(), 0
        while True:
            status, body = await score()
            if status == 200:
                assert body["Prediction"]["fqrv"]["releaseVersion"] == "v1", body
                break
            assert status == 503 and url in body["error"], body
            failures += 1
            assert time.monotonic() - failed_at < 5, "still routed to the release whose backend is down"
            await asyncio.sleep(0.02)
        assert failures >= 1
        for _ in range(5):
            status, body = await score()
            assert status == 200 and body["Prediction"]["fqrv"]["releaseVersion"] == "v1"


async def test_the_backend_continues_the_callers_trace(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    # Tracing is on for the whole process once the front starts: the backend, started after it,
    # serves gRPC traced too.
    async with (
        receiver() as (collector, _spans),
        v2_gateway(tmp_path / "front", access_log=False, otel_exporter_otlp_endpoint=collector) as front,
        backend_gateway(tmp_path / "backend", port, grpc_port) as backend,
    ):
        assert tracing.ON
        await backend.deploy(python_servable(log_level="FULL"))
        for protocol, url in (("rest", backend.url), ("grpc", backend.grpc_target)):
            release = f"r-{protocol}"
            await front.deploy(remote_servable(url, protocol=protocol, release=release))
            status, body, _ = await front.post_json(
                f"/v2/models/acme.front.1/versions/{release}/infer",
                {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [1.0]}]},
                headers={"traceparent": PARENT},
            )
            assert status == 200, body
        await wait_for(lambda: len(events(tmp_path / "backend")) == 2, 10, "the backend's two events")
    # Both calls reached the backend inside the caller's trace (traceparent header / gRPC metadata).
    assert [e.get("traceId") for e in events(tmp_path / "backend")] == [TRACE_ID, TRACE_ID]
