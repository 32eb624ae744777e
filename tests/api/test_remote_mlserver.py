"""A model served by a real MLServer (tests/remote_backends.py), deployed as a RemoteV2 release.

The gateway answers what MLServer answers (V2 REST and BASIC /score, the backend called over REST
and over gRPC), routes, shadows and phases it in beside a local release of the same contract (the
twin: the same weights scored in process), and when MLServer stops, answers 503 for that release
within its timeout while the gateway stays ready, then serves again once MLServer is back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests

from tests.remote_backends import IRIS_MODEL, IRIS_ROWS, IRIS_VERSION, MLServerProcess, iris_probabilities
from tests.support import GatewayProcess, InProcessGateway, python_servable, wait_for

# Slow tier: MLServer (its own 1.3 GB venv) takes seconds to start, the longest setup of the quick tier.
# The RemoteV2 flavor stays in the quick tier against gateway backends (tests/remote/).
pytestmark = pytest.mark.slow

CONTRACT = ("iris", "remote", 1)
V2_INFER = "/v2/models/iris.remote.1/infer"
SCORE = "/iris/remote/1/score"
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
#: Two releases on the contract, the fair router alternating between the valid ones.
FAIR_KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}


def policy(valid: bool) -> dict[str, Any]:
    return {
        "validityPolicy": [{"ImmediatelyValid": {}} if valid else {"NeverValid": {}}],
        "phaseInPolicy": {"ImmediatePhaseIn": {}},
    }


def remote_release(
    mlserver: MLServerProcess,
    protocol: str,
    contract: tuple[str, str, int] = CONTRACT,
    release: str = "mlserver",
    *,
    valid: bool = True,
    log_level: str = "NONE",
    **flavor: Any,
) -> dict[str, Any]:
    """A RemoteV2 definition of MLServer's iris model, over ``protocol`` (no path: nothing to fetch)."""
    org, project, n = contract
    url = mlserver.rest_url if protocol == "rest" else mlserver.grpc_target
    return {
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": {"RemoteV2": {"url": url, "model": IRIS_MODEL, "version": IRIS_VERSION, "protocol": protocol, **flavor}},
        "servableSettings": {
            "policySettings": policy(valid),
            "loggingSettings": {"logLevel": log_level, "keyFeatures": ["reqid"] if log_level != "NONE" else []},
        },
    }


def twin_release(mlserver: MLServerProcess, **kwargs: Any) -> dict[str, Any]:
    """The local twin (a Python servable with the same weights, inputs and outputs) on the contract."""
    body = python_servable(CONTRACT, "twin", directory=mlserver.model_dir, module="twin.py", **kwargs)
    body["flavor"]["Python"]["entryPoint"] = "Iris"
    return body


def v2_body(rows: list[list[float]]) -> dict[str, Any]:
    """MLServer's layout: the four features of every row as one [N, 4] FP64 tensor."""
    return {"inputs": [{"name": "input-0", "shape": [len(rows), 4], "datatype": "FP64", "data": [v for r in rows for v in r]}]}


def score_body(rows: list[list[float]], reqid: str = "r") -> dict[str, Any]:
    """The same rows as a BASIC request: four Float64 fields per record."""
    return {
        "schema": [{"type": "Float64", "fields": FEATURES}],
        "datum": [{"tensors": [{"Float64": {"data": row}}]} for row in rows],
        "configs": {"reqid": reqid},
    }


def score_values(prediction: dict[str, Any]) -> list[list[float]]:
    """Each record's predict_proba from a BASIC answer (or a logged prediction): one field per class."""
    assert prediction["schema"] == [{"type": "Float64", "fields": [f"predict_proba.{k}" for k in range(3)]}], prediction
    return [record["tensors"][0]["Float64"]["data"] for record in prediction["datum"]]


async def post(gw: InProcessGateway, path: str, body: Any) -> tuple[int, Any, float]:
    """Status, JSON answer and seconds taken."""
    started = time.monotonic()
    async with gw.session.post(gw.url + path, json=body) as r:
        return r.status, await r.json(), time.monotonic() - started


async def deploy(gw: InProcessGateway, definition: dict[str, Any]) -> None:
    async with gw.session.post(gw.url + "/servable", json=definition) as r:
        assert r.status == 200, await r.text()


async def get_json(gw: InProcessGateway, path: str) -> tuple[int, Any]:
    async with gw.session.get(gw.url + path) as r:
        return r.status, await r.json()


async def stats(gw: InProcessGateway) -> dict[str, dict[str, Any]]:
    status, body = await get_json(gw, "/iris/remote/1/stats")
    assert status == 200, body
    return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in body}


def events(tmp_path: Path) -> list[dict[str, Any]]:
    """The prediction events in the gateway's local log so far."""
    path = tmp_path / "data" / "predictions.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [orjson.loads(line)["event"] for line in lines if line.strip()]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
async def test_gateway_answers_what_mlserver_answers(gw: InProcessGateway, mlserver: MLServerProcess, protocol: str) -> None:
    await deploy(gw, remote_release(mlserver, protocol))
    expected = iris_probabilities(mlserver.model_dir, IRIS_ROWS)

    direct = mlserver.infer(v2_body(IRIS_ROWS))["outputs"]
    assert np.allclose(np.asarray(direct[0]["data"]).reshape(3, 3), expected, rtol=0, atol=1e-12), direct
    status, answer, _ = await post(gw, V2_INFER, v2_body(IRIS_ROWS))
    assert status == 200, answer
    assert (answer["model_name"], answer["model_version"]) == ("iris.remote.1", "mlserver")
    assert [(o["name"], o["datatype"], o["shape"], o["data"]) for o in answer["outputs"]] == [
        (o["name"], o["datatype"], o["shape"], o["data"]) for o in direct
    ]

    # BASIC /score: four Float64 fields per record, stacked into MLServer's [N, 4] input.
    status, answer, _ = await post(gw, SCORE, score_body(IRIS_ROWS))
    assert status == 200, answer
    assert answer["Prediction"]["fqrv"]["releaseVersion"] == "mlserver"
    assert score_values(answer["Prediction"]) == np.asarray(direct[0]["data"]).reshape(3, 3).tolist()

    status, meta = await get_json(gw, "/iris/remote/1/mlserver/metadata")
    assert status == 200, meta
    meta = meta["BasicMetaData"]
    assert meta["backend"]["state"] == "up" and meta["backend"]["protocol"] == protocol, meta
    assert meta["backend"]["url"] == (mlserver.rest_url if protocol == "rest" else mlserver.grpc_target)
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [("input-0", ["-1", "4"])]
    assert [o["name"] for o in meta["outputs"]] == ["predict_proba"]


async def test_shadow_then_phase_in_beside_a_local_release(
    gw: InProcessGateway, mlserver: MLServerProcess, tmp_path: Path
) -> None:
    """MLServer's release first scores shadow copies of the twin's answers, then answers its share."""
    expected = iris_probabilities(mlserver.model_dir, IRIS_ROWS).tolist()
    direct = np.asarray(mlserver.infer(v2_body(IRIS_ROWS))["outputs"][0]["data"]).reshape(3, 3).tolist()
    await deploy(gw, twin_release(mlserver, log_level="FULL", contract_settings=FAIR_KEEP_TWO))
    await deploy(gw, remote_release(mlserver, "grpc", valid=False, log_level="FULL"))

    for i in range(4):
        status, answer, _ = await post(gw, SCORE, score_body(IRIS_ROWS, f"s{i}"))
        assert status == 200 and answer["Prediction"]["fqrv"]["releaseVersion"] == "twin", answer
        assert np.allclose(score_values(answer["Prediction"]), expected, rtol=0, atol=1e-12)

    def shadows(release: str) -> list[dict[str, Any]]:
        return [e for e in events(tmp_path) if e["fqrv"]["releaseVersion"] == release and not e.get("servedRequest", False)]

    await wait_for(lambda: len(shadows("mlserver")) == 4, 10, "four shadow events of the MLServer release")
    counts = await stats(gw)
    assert (int(counts["mlserver"]["scoreCount"]), int(counts["mlserver"]["shadeCount"])) == (0, 4)
    assert sorted(e["inferenceRequest"]["configs"]["reqid"] for e in shadows("mlserver")) == ["s0", "s1", "s2", "s3"]
    assert all(score_values(e["prediction"]) == direct for e in shadows("mlserver"))  # what MLServer answered

    async with gw.session.put(gw.url + "/iris/remote/1/mlserver/policy-settings", json=policy(True)) as r:
        assert r.status == 200, await r.text()
    answered: list[str] = []

    async def both_answer() -> bool:
        status, answer, _ = await post(gw, SCORE, score_body(IRIS_ROWS, f"p{len(answered)}"))
        assert status == 200, answer
        release = answer["Prediction"]["fqrv"]["releaseVersion"]
        values = score_values(answer["Prediction"])
        assert values == direct if release == "mlserver" else np.allclose(values, expected, rtol=0, atol=1e-12)
        answered.append(release)
        return {"mlserver", "twin"} <= set(answered[-4:])

    await wait_for(both_answer, 10, "MLServer's release and the twin both answering")
    # The fan-out: the twin scores shadow copies of what MLServer's release answered.
    served_by_mlserver = answered.count("mlserver")
    await wait_for(lambda: len(shadows("twin")) == served_by_mlserver, 10, "the twin's shadow copies")
    counts = await stats(gw)
    assert int(counts["mlserver"]["scoreCount"]) == served_by_mlserver
    assert int(counts["twin"]["shadeCount"]) == served_by_mlserver
    assert int(counts["mlserver"]["errorCount"]) == 0


def test_backend_down_answers_503_in_time_and_back_up_serves_again(
    gateway_process: type[GatewayProcess], mlserver: MLServerProcess, tmp_path: Path
) -> None:
    """MLServer stopped: each release answers 503 within its timeout, its metadata says the backend is
    down, the gateway stays ready; MLServer started again: both are served again.

    A gateway process, as deployed (its own logging setup): before the flavor logged a backend failure
    as one warning line, each failure's traceback took an in-process gateway's console renderer 1-2 s,
    past the timeout this test holds the release to."""
    timeout_ms = 2000
    contracts = {"rest": ("iris", "remote", 1), "grpc": ("iris", "remote", 2)}
    gw = gateway_process(tmp_path / "data").start()
    http = requests.Session()
    for protocol, contract in contracts.items():
        definition = remote_release(mlserver, protocol, contract, timeoutMs=timeout_ms, failureThreshold=2, cooldownMs=200)
        r = http.post(gw.url + "/servable", json=definition, timeout=30)
        assert r.status_code == 200, r.text

    def infer(protocol: str) -> tuple[int, Any, float]:
        started = time.monotonic()
        r = http.post(f"{gw.url}/v2/models/iris.remote.{contracts[protocol][2]}/infer", json=v2_body(IRIS_ROWS[:1]), timeout=30)
        return r.status_code, r.json(), time.monotonic() - started

    def backend(protocol: str) -> dict[str, Any]:
        r = http.get(f"{gw.url}/iris/remote/{contracts[protocol][2]}/mlserver/metadata", timeout=10)
        assert r.status_code == 200, r.text
        state: dict[str, Any] = r.json()["BasicMetaData"]["backend"]
        return state

    for protocol in contracts:
        status, answer, _ = infer(protocol)
        assert status == 200, answer
    try:
        mlserver.stop()
        for protocol in contracts:
            for attempt in range(3):  # two failures open the circuit: the third is refused at once
                status, answer, seconds = infer(protocol)
                assert status == 503, (protocol, answer)
                assert seconds < timeout_ms / 1000, (protocol, attempt, seconds)
                assert "unavailable" in answer["error"], answer
                if attempt == 2:
                    assert "circuit open" in answer["error"], answer
            state = backend(protocol)
            assert state["state"] == "down" and state["lastError"], (protocol, state)
            assert http.get(gw.url + "/health/ready", timeout=10).status_code == 200
        r = http.get(gw.url + "/iris/remote/1/stats", timeout=10)
        (rest_stats,) = [m["ServableMetrics"] for m in r.json()]
        assert int(rest_stats["errorCount"]) == 3, rest_stats
        assert rest_stats["performanceMetrics"]["errorRate"] > 0, rest_stats  # what gates and rollbacks read
        mlserver.start()

        def served(protocol: str) -> bool:
            return infer(protocol)[0] == 200

        for protocol in contracts:
            deadline = time.monotonic() + 30
            while not served(protocol):
                assert time.monotonic() < deadline, f"the {protocol} release not served again: {backend(protocol)}"
                time.sleep(0.05)
            assert backend(protocol)["state"] == "up"
        expected = iris_probabilities(mlserver.model_dir, IRIS_ROWS[:1]).ravel()
        status, answer, _ = infer("grpc")
        assert status == 200 and np.allclose(answer["outputs"][0]["data"], expected, rtol=0, atol=1e-12), answer
    finally:
        if not mlserver.running:
            mlserver.start()
