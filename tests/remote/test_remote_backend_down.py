"""A RemoteV2 release whose backend stops and comes back: 503s of its own, never the gateway's readiness."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.v2_support import V2Gateway, v2_gateway
from tests.remote.support import FRONT_MODEL, backend_gateway, remote_servable, v2_body
from tests.support import free_port, python_servable, wait_for


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "front", access_log=False) as gw:
        yield gw


async def infer(front: V2Gateway) -> tuple[int, Any, Any]:
    return await front.post_json(f"/v2/models/{FRONT_MODEL}/infer", v2_body([1.0], ["a"]))


async def backend_of(front: V2Gateway) -> dict[str, Any]:
    async with front.server.session.get(front.url + "/acme/front/1/r1/metadata") as r:
        assert r.status == 200
        backend: dict[str, Any] = (await r.json())["BasicMetaData"]["backend"]
        return backend


async def ready_status(front: V2Gateway) -> int:
    async with front.server.session.get(front.url + "/health/ready") as r:
        return r.status


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["rest", "grpc"])
async def test_backend_down_is_503_for_its_release_only_then_served_again(
    tmp_path: Path, front: V2Gateway, protocol: str
) -> None:
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}" if protocol == "rest" else f"127.0.0.1:{grpc_port}"
    async with backend_gateway(tmp_path / "backend", port, grpc_port) as backend:
        await backend.deploy(python_servable())
        body = remote_servable(url, protocol=protocol, timeoutMs=3000, failureThreshold=2, cooldownMs=200)
        await front.deploy(body)
        status, answer, _ = await infer(front)
        assert status == 200 and answer["outputs"][0]["data"] == [2.0]
    # The backend is gone: its release answers 503 well within its timeout, naming the backend.
    for _ in range(2):
        started = time.monotonic()
        status, answer, headers = await infer(front)
        assert time.monotonic() - started < 3.0
        assert status == 503, answer
        assert url in answer["error"] and int(headers["Retry-After"]) >= 1
    backend = await backend_of(front)
    assert backend["state"] == "down" and backend["lastError"] and backend["url"] == url
    assert backend["circuit"] == "open" and backend["consecutiveFailures"] == 2
    assert await ready_status(front) == 200  # one backend down never fails the gateway's readiness
    async with front.server.session.get(front.url + f"/v2/models/{FRONT_MODEL}/ready") as r:
        assert r.status != 200  # but the model says it cannot answer now
    # Open circuit: refused at once, counted.
    status, answer, _ = await infer(front)
    assert status == 503 and "circuit open" in answer["error"]
    async with front.server.session.get(front.url + "/metrics/json") as r:
        backends = (await r.json())["backends"]
    assert backends["acme.front.1.r1"]["refused"] >= 1 and backends["acme.front.1.r1"]["circuit"] == "open"
    async with front.server.session.get(front.url + "/acme/front/1/stats") as r:
        stats = (await r.json())[0]["ServableMetrics"]
    assert int(stats["errorCount"]) == 3  # release errors, as the gates count them
    # Back on the same ports (its registry restored): the probe closes the circuit, served again.
    async with backend_gateway(tmp_path / "backend", port, grpc_port):
        await wait_for(lambda: _is_up(front), 10, "the probe to find the backend up")
        status, answer, _ = await infer(front)
        assert status == 200 and answer["outputs"][0]["data"] == [2.0]
        backend = await backend_of(front)
        assert backend["circuit"] == "closed" and backend["consecutiveFailures"] == 0
        async with front.server.session.get(front.url + f"/v2/models/{FRONT_MODEL}/ready") as r:
            assert r.status == 200
    async with front.server.session.get(front.url + "/metrics") as r:
        text = await r.text()
    assert 'forestflow_backend_circuit_open{fqrv="acme.front.1.r1"' in text


async def _is_up(front: V2Gateway) -> bool:
    return (await backend_of(front))["state"] == "up"


@pytest.mark.slow
async def test_restored_with_its_backend_away_loads_down_and_recovers(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    async with backend_gateway(tmp_path / "backend", port, grpc_port) as backend:
        await backend.deploy(python_servable())
        async with v2_gateway(tmp_path / "front", access_log=False) as front:
            await front.deploy(remote_servable(url, cooldownMs=200))
    # The gateway starts again while the backend is away: the release it had accepted loads down
    # (a fresh deploy would be refused) and the gateway is ready.
    async with v2_gateway(tmp_path / "front", access_log=False) as front:
        async with front.server.session.get(front.url + "/health/ready") as r:
            assert r.status == 200, await r.text()
        backend_state = await backend_of(front)
        assert backend_state["state"] == "down" and backend_state["circuit"] == "open"
        status, answer, _ = await infer(front)
        assert status == 503 and url in answer["error"]
        async with backend_gateway(tmp_path / "backend", port, grpc_port):
            await wait_for(lambda: _is_up(front), 10, "the probe to find the backend up")
            status, answer, _ = await infer(front)
            assert status == 200 and answer["outputs"][0]["data"] == [2.0], answer
            async with front.server.session.get(front.url + f"/v2/models/{FRONT_MODEL}") as r:
                meta = await r.json()
            assert [i["name"] for i in meta["inputs"]] == ["x", "label"]  # learnt once it answered
