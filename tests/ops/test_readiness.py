"""Readiness tells the truth: loading at start, registry store unreachable at start, dead JVM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jpype
import pytest
import requests

from tests.api.test_h2o_score import definition
from tests.registry.redis_server import RedisServer
from tests.support import GatewayProcess, InProcessGateway, free_port, python_servable, score_body

SERVABLES = Path(__file__).resolve().parent / "servables"


def ready(url: str) -> tuple[int, dict[str, Any]]:
    r = requests.get(url + "/health/ready", timeout=5)
    return r.status_code, r.json()


def wait_ready(url: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = ready(url)
        if status == 200:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


@pytest.mark.slow
def test_not_ready_while_servables_load_at_start(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    data = tmp_path / "data"
    first = gateway_process(data).start()
    r = requests.post(first.url + "/servable", json=python_servable(directory=SERVABLES, module="slow_load.py"), timeout=60)
    assert r.status_code == 200, r.text
    assert first.stop() == 0

    again = gateway_process(data).start(wait_started=False)  # the server answers before the registry is loaded
    assert requests.get(again.url + "/health/live", timeout=5).status_code == 200
    status, body = ready(again.url)
    assert status == 503
    assert body["ready"] is False and not body["started"]
    assert body["servables"] == 0  # the restore is still loading it
    early = requests.post(again.url + "/acme/demo/1/score", json=score_body([1.0]), timeout=5)
    assert early.status_code in (404, 422, 503) and early.json()["code"], early.text  # a clear refusal, never a 500
    assert requests.get(again.url + "/v2/health/ready", timeout=5).status_code == 503
    body = wait_ready(again.url, 30)
    assert body["started"] and body["loading"] == [] and body["servables"] == 1


def test_not_ready_while_the_registry_store_is_unreachable_at_start(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    redis = RedisServer(tmp_path / "redis", port=free_port())  # not started yet: Redis is away
    gw = gateway_process(tmp_path / "data", env={"FORESTFLOW_REDIS_URL": redis.url, "FORESTFLOW_REDIS_SYNC_INTERVAL_S": "0.2"})
    gw.start(wait_started=False)
    try:
        time.sleep(0.5)
        assert requests.get(gw.url + "/health/live", timeout=5).status_code == 200
        status, body = ready(gw.url)
        assert status == 503 and body["started"] is False and body["storeAvailable"] is False
        r = requests.post(gw.url + "/servable", json=python_servable(), timeout=30)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
        assert gw.proc is not None and gw.proc.poll() is None  # it waits for the store instead of exiting
        redis.start()
        body = wait_ready(gw.url, 15)
        assert body["storeAvailable"] is True
        r = requests.post(gw.url + "/servable", json=python_servable(), timeout=60)
        assert r.status_code == 200, r.text
        assert redis.client().hget("forestflow:meta", "version") is not None
    finally:
        redis.stop()


async def test_not_ready_when_the_jvm_of_an_h2o_servable_is_gone(gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    body = definition("prostate_gbm_binomial")
    body["flavor"]["H2OMojo"]["scorer"] = "jvm"  # genmodel in the JVM (a GBM is scored natively by default)
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()
    async with gw.session.get(gw.url + "/health/ready") as r:
        assert r.status == 200
    # The JVM runs inside this test process: stopping it for real would end every later H2O test,
    # so the probe jpype answers is what is replaced.
    monkeypatch.setattr(jpype, "isJVMStarted", lambda: False)
    async with gw.session.get(gw.url + "/health/ready") as r:
        body = await r.json()
        assert r.status == 503
        assert body["unhealthy"] == {"h2o.prostate-gbm-binomial.1.r1": "the JVM that scores this H2O MOJO is not running"}
    async with gw.session.get(gw.url + "/v2/health/ready") as r:
        assert r.status == 503
    monkeypatch.undo()
    async with gw.session.get(gw.url + "/health/ready") as r:
        assert r.status == 200
        assert (await r.json())["unhealthy"] == {}


async def test_a_natively_scored_h2o_servable_needs_no_jvm_to_be_ready(
    gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gw.session.post(gw.url + "/servable", json=definition("prostate_gbm_binomial")) as r:  # GBM: native
        assert r.status == 200, await r.text()
    monkeypatch.setattr(jpype, "isJVMStarted", lambda: False)
    async with gw.session.get(gw.url + "/health/ready") as r:
        body = await r.json()
        assert r.status == 200 and body["unhealthy"] == {}, body
