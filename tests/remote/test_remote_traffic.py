"""RemoteV2 releases among others: shadow copies, phase-in beside a local release, the concurrency
limit's queue, deadlines, the backend's errors, GraphPipe and a pipeline step on a backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.api.v2_support import V2Gateway, v2_gateway
from tests.api_gp.helpers import execute_multi
from tests.pipeline_support import port, toml
from tests.remote.support import BACKEND_MODEL, FRONT, FRONT_MODEL, remote_servable, v2_body
from tests.support import python_servable, score_body, wait_for

KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "backend", access_log=False, max_rows=50) as gw:
        await gw.deploy(python_servable())  # acme.demo.1 v1: the echo model
        yield gw


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "front", access_log=False, evaluation_interval_s=0.1) as gw:
        yield gw


def events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "front" / "predictions.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line)["event"] for line in path.read_bytes().splitlines() if line.strip()]


async def score(front: V2Gateway, xs: list[float], reqid: str = "q") -> tuple[int, Any]:
    status, body, _ = await front.post_json("/acme/front/1/score", score_body(xs, configs={"reqid": reqid}))
    return status, body


async def test_shadow_copy_to_a_remote_release_is_logged(tmp_path: Path, backend: V2Gateway, front: V2Gateway) -> None:
    await front.deploy(python_servable(FRONT, release="local", contract_settings=KEEP_TWO))
    await front.deploy(remote_servable(backend.url, release="remote", log_level="FULL", validity=[{"NeverValid": {}}]))
    for i in range(3):
        status, body = await score(front, [float(i)], f"q{i}")
        assert status == 200 and body["Prediction"]["fqrv"]["releaseVersion"] == "local"
    await wait_for(lambda: len(events(tmp_path)) == 3, 10, "three shadow events of the remote release")
    shadows = events(tmp_path)
    assert {e["fqrv"]["releaseVersion"] for e in shadows} == {"remote"}
    assert not any(e.get("servedRequest") for e in shadows)
    doubles = sorted(e["prediction"]["datum"][0]["tensors"][0]["Float64"]["data"][0] for e in shadows)
    assert doubles == [0.0, 2.0, 4.0]  # scored by the backend
    async with front.server.session.get(front.url + "/acme/front/1/stats") as r:
        counts = {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in await r.json()}
    assert counts["remote"]["shadeCount"] == "3" and counts["remote"]["shadeErrorCount"] == "0"


@pytest.mark.slow
async def test_phase_in_from_a_local_release_to_a_remote_one(backend: V2Gateway, front: V2Gateway) -> None:
    await front.deploy(python_servable(FRONT, release="local", contract_settings=KEEP_TWO))
    await front.deploy(
        remote_servable(backend.url, release="remote", phase_in={"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 1}})
    )
    answers: list[str] = []

    async def moved() -> bool:
        status, body = await score(front, [2.5])
        assert status == 200, body
        prediction = body["Prediction"]
        assert prediction["datum"][0]["tensors"][0]["Float64"]["data"] == [5.0]  # the same answer from either
        answers.append(prediction["fqrv"]["releaseVersion"])
        return answers[-10:] == ["remote"] * 10

    await wait_for(moved, 15, "all traffic on the remote release")
    assert "local" in answers and "remote" in answers


async def test_concurrency_limit_queues_and_deadline_is_passed_on(backend: V2Gateway, front: V2Gateway) -> None:
    await front.deploy(remote_servable(backend.url, maxConcurrency=1, timeoutMs=5000))
    path = f"/v2/models/{FRONT_MODEL}/infer"
    calls = [asyncio.create_task(front.post_json(path, v2_body([float(i)], ["s"], sleep=0.3))) for i in range(3)]
    peak_queued = 0

    async def seen_queue() -> bool:
        nonlocal peak_queued
        async with front.server.session.get(front.url + "/metrics/json") as r:
            scheduler = (await r.json())["schedulers"]["acme.front.1.r1"]
        assert scheduler["running"] <= 1  # never more in flight to the backend than its limit
        peak_queued = max(peak_queued, scheduler["liveQueued"])
        return peak_queued == 2

    await wait_for(seen_queue, 10, "two requests queued behind the one in flight")
    results = await asyncio.gather(*calls)
    assert sorted(body["outputs"][0]["data"][0] for status, body, _ in results if status == 200) == [0.0, 2.0, 4.0]
    async with front.server.session.get(front.url + "/metrics/json") as r:
        scheduler = (await r.json())["schedulers"]["acme.front.1.r1"]
    assert scheduler["microBatches"] >= 1  # the queued requests went to the backend together, in one call
    # A deadline shorter than the backend takes: 504 at the deadline, not after the backend answered.
    started = time.monotonic()
    status, body, _ = await front.post_json(path, v2_body([1.0], ["s"], sleep=2.0), headers={"X-Request-Timeout-Ms": "300"})
    assert status == 504, body
    assert time.monotonic() - started < 1.5
    async with front.server.session.get(front.url + "/metrics/json") as r:
        scheduler = (await r.json())["schedulers"]["acme.front.1.r1"]
    # The call was cancelled with its job: its slot is free at once, nothing runs on abandoned.
    assert scheduler["running"] == 0 and scheduler["abandonedRunning"] == 0
    status, body, _ = await front.post_json(path, v2_body([1.0], ["s"]))
    assert status == 200, body


async def test_backend_errors_are_400_for_bad_requests_and_502_for_its_failures(backend: V2Gateway, front: V2Gateway) -> None:
    await front.deploy(remote_servable(backend.url))
    path = f"/v2/models/{FRONT_MODEL}/infer"
    # The backend takes at most 50 rows: its 400 reaches the caller with its message.
    status, body, _ = await front.post_json(path, v2_body([1.0] * 60, ["a"] * 60))
    assert status == 400 and backend.url in body["error"] and "over the limit of 50" in body["error"], body
    # The backend's model fails (its 500): a 502 naming the backend, never a 4xx.
    status, body, _ = await front.post_json(path, v2_body([1.0], ["a"], fail="yes"))
    assert status == 502 and backend.url in body["error"] and "HTTP 500" in body["error"], body
    assert "the model failed" not in body["error"]  # what the backend said stays in the log and metadata
    async with front.server.session.get(front.url + "/acme/front/1/stats") as r:
        metrics = (await r.json())[0]["ServableMetrics"]
    assert metrics["errorCount"] == "1"  # the 502 counts for the gates; the caller's 400 does not
    async with front.server.session.get(front.url + "/acme/front/1/r1/metadata") as r:
        state = (await r.json())["BasicMetaData"]["backend"]
    assert state["state"] == "up" and "HTTP 500 (the model failed" in state["lastError"]  # it answered: not down
    status, body, _ = await front.post_json(path, v2_body([1.0], ["a"]))
    assert status == 200


async def test_graphpipe_reaches_the_remote_release(backend: V2Gateway, front: V2Gateway) -> None:
    await front.deploy(remote_servable(backend.grpc_target, protocol="grpc"))
    inputs = [np.array(["a", "b"]), np.array([1.0, 4.0])]
    _, double, echo = await execute_multi(front.url + "/acme/front/1/gp", inputs, ["label", "x"])
    _, direct_double, direct_echo = await execute_multi(backend.url + "/acme/demo/1/gp", inputs, ["label", "x"])
    assert double.tolist() == direct_double.tolist() == [[2.0], [8.0]]
    assert echo.tolist() == direct_echo.tolist() == [[b"a"], [b"b"]]


async def test_pipeline_step_on_a_backend(tmp_path: Path, backend: V2Gateway, front: V2Gateway) -> None:
    directory = tmp_path / "pipeline"
    directory.mkdir()
    steps = [
        {
            "name": "remote",
            "platform": "remote_v2",
            "url": backend.url,
            "model": BACKEND_MODEL,
            "inputs": [port("x"), port("label", "BYTES")],
            "outputs": [port("double", tensor="d"), port("echo", "BYTES", tensor="e")],
        },
        {
            "name": "again",
            "platform": "remote_v2",
            "url": backend.grpc_target,
            "protocol": "grpc",
            "model": BACKEND_MODEL,
            "inputs": [port("x", tensor="d"), port("label", "BYTES", tensor="e")],
            "outputs": [port("double", tensor="quad"), port("echo", "BYTES", tensor="label_out")],
        },
    ]
    (directory / "pipeline.toml").write_text(toml(steps, outputs=["quad", "label_out"]))
    body = python_servable(FRONT, release="pipe", directory=directory)
    body["flavor"] = {"Pipeline": {"definition": "pipeline.toml"}}
    await front.deploy(body)
    status, answer, _ = await front.post_json(f"/v2/models/{FRONT_MODEL}/infer", v2_body([1.0, 2.5], ["a", "b"]))
    assert status == 200, answer
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs == {"quad": [4.0, 10.0], "label_out": ["a", "b"]}
    status, answer = await score(front, [3.0])
    assert status == 200 and answer["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [12.0], answer
    # Undeployed (unloaded on a thread): each remote step gives its connections back on the loop.
    from forestflow.runtime.remote import grpc_client, rest_client
    from forestflow.runtime.remote.http1 import MAX_BODY

    assert (
        rest_client._SESSIONS.users(rest_client.pool_key(backend.url, {}, MAX_BODY)) == 1
        and grpc_client._CHANNELS.users(backend.grpc_target) == 1
    )
    async with front.server.session.delete(front.url + "/acme/front/1/pipe") as r:
        assert r.status == 200
    await wait_for(
        lambda: rest_client._SESSIONS.users(rest_client.pool_key(backend.url, {}, MAX_BODY)) == 0,
        10,
        "the REST step's session closed",
    )
    assert grpc_client._CHANNELS.users(backend.grpc_target) == 0
