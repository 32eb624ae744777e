"""Top-k through every protocol and the V2 classification extension, through the unmodified tritonclient."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from graphpipe import remote

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from tests.api.v2_support import V2Gateway, ensure_client_python, v2_gateway
from tests.pipeline_support import PROSTATE, servable_request
from tests.support import H2O_DIR, ROOT

EXAMPLE = ROOT / "servables" / "prostate-pipeline"
SCRIPT = Path(__file__).with_name("v2_classify_calls.py")
M = messages()


def golden(name: str, count: int) -> list[dict[str, str]]:
    with (H2O_DIR / f"{name}.golden.csv").open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["kind"] == "data"][:count]


def h2o(mojo: str, project: str) -> dict[str, Any]:
    return {
        "path": H2O_DIR.as_uri(),
        "fqrv": {"contract": {"organization": "h2o", "project": project, "contract_number": 1}, "release_version": "r1"},
        "flavor": {"H2OMojo": {"mojoPath": mojo}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def v2_columns(
    rows: list[dict[str, str]], names: list[str], numeric: set[str], rename: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    rename = rename or {}
    return [
        {
            "name": rename.get(n, n),
            "datatype": "FP64" if n in numeric else "BYTES",
            "values": [float(r[n]) if n in numeric else r[n] for r in rows],
        }
        for n in names
    ]


def expected_top(probs: np.ndarray, labels: list[str], k: int) -> list[str]:
    out = []
    for row in probs:
        order = np.argsort(-row, kind="stable")[:k]
        out += [f"{row[i]:f}:{i}:{labels[i]}" for i in order]
    return out


@pytest.fixture
async def gw(tmp_path: Path) -> Any:
    async with v2_gateway(tmp_path / "data") as gateway:
        await gateway.deploy(h2o("prostate_gbm_binomial.zip", "binomial"))
        await gateway.deploy(h2o("iris_gbm_multinomial.zip", "iris"))
        await gateway.deploy(h2o("prostate_gbm_regression.zip", "regression"))
        await gateway.deploy(servable_request(EXAMPLE))
        yield gateway


PROSTATE_NUMERIC = {"AGE", "PSA", "VOL", "GLEASON"}
IRIS = ["Sepal.Length", "Sepal.Width", "Petal.Length", "Petal.Width", "SepalSize"]
IRIS_LABELS = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]


async def test_classification_extension_through_tritonclient_http_and_grpc(gw: V2Gateway) -> None:
    prostate, iris = golden("prostate_gbm_binomial", 5), golden("iris_gbm_multinomial", 6)
    lower = {c: c.lower() for c in PROSTATE}
    calls = [
        {"model": "h2o.binomial.1", "columns": v2_columns(prostate, PROSTATE, PROSTATE_NUMERIC), "output": "predict", "k": 2},
        {"model": "h2o.iris.1", "columns": v2_columns(iris, IRIS, set(IRIS[:4])), "output": "predict", "k": 2},
        {
            "model": "pipe.prostate.1",
            "columns": v2_columns(prostate, PROSTATE, PROSTATE_NUMERIC, lower),
            "output": "label",
            "k": 1,
        },
        {"model": "h2o.regression.1", "columns": v2_columns(prostate, PROSTATE, PROSTATE_NUMERIC), "output": "predict", "k": 1},
    ]
    job = {"http": gw.hostport, "grpc": gw.grpc_target, "calls": calls}
    python = await asyncio.to_thread(ensure_client_python)
    proc = await asyncio.create_subprocess_exec(
        str(python), str(SCRIPT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    seen = json.loads(out)
    p_bin = np.array([[float(r["out:0"]), float(r["out:1"])] for r in prostate])
    p_iris = np.array([[float(r[f"out:{c}"]) for c in IRIS_LABELS] for r in iris])
    for family in ("http", "grpc"):
        binomial, multinomial, pipeline, regression = seen[family]
        assert binomial == {"shape": [5, 2], "values": expected_top(p_bin, ["0", "1"], 2)}, family
        assert multinomial == {"shape": [6, 2], "values": expected_top(p_iris, IRIS_LABELS, 2)}, family
        assert pipeline == {"shape": [5, 1], "values": expected_top(p_bin, ["no capsule", "capsule"], 1)}, family
        assert "cannot classify" in regression["error"], family


async def test_classification_errors_are_400(gw: V2Gateway) -> None:
    rows = golden("prostate_gbm_binomial", 2)
    inputs = [
        {"name": c["name"], "datatype": c["datatype"], "shape": [2], "data": c["values"]}
        for c in v2_columns(rows, PROSTATE, PROSTATE_NUMERIC)
    ]
    for model, outputs, needle in (
        ("h2o.regression.1", [{"name": "predict", "parameters": {"classification": 2}}], "cannot classify"),
        ("h2o.binomial.1", [{"name": "predict", "parameters": {"classification": 0}}], "positive integer"),
        ("h2o.binomial.1", [{"name": "nope", "parameters": {"classification": 1}}], "not an output"),
    ):
        status, body, _ = await gw.post_json(f"/v2/models/{model}/infer", {"inputs": inputs, "outputs": outputs})
        assert status == 400, body
        assert needle in body["error"]


async def test_top_k_of_the_example_pipeline_through_v2_rest_grpc_and_graphpipe(gw: V2Gateway) -> None:
    rows = golden("prostate_gbm_binomial", 3)
    probs = np.array([[float(r["out:0"]), float(r["out:1"])] for r in rows])
    labels = np.array(["no capsule", "capsule"])
    top1 = labels[np.argsort(-probs, axis=1, kind="stable")[:, :1]].tolist()
    top2 = labels[np.argsort(-probs, axis=1, kind="stable")].tolist()
    cols = v2_columns(rows, PROSTATE, PROSTATE_NUMERIC, {c: c.lower() for c in PROSTATE})
    inputs = [{"name": c["name"], "datatype": c["datatype"], "shape": [3], "data": c["values"]} for c in cols]
    # V2 REST: the default k (2), then k per request through the requested output's parameters.
    status, body, _ = await gw.post_json(
        "/v2/models/pipe.prostate.1/infer", {"inputs": inputs, "outputs": [{"name": "top_labels"}]}
    )
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [3, 2] and body["outputs"][0]["data"] == sum(top2, [])
    request = {"inputs": inputs, "outputs": [{"name": "top_labels", "parameters": {"top_k": 1}}]}
    status, body, _ = await gw.post_json("/v2/models/pipe.prostate.1/infer", request)
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [3, 1] and body["outputs"][0]["data"] == sum(top1, [])
    # V2 gRPC, k through the request parameters.
    req = M["ModelInferRequest"](model_name="pipe.prostate.1")
    for c in cols:
        t = req.inputs.add(name=c["name"], datatype=c["datatype"], shape=[3])
        if c["datatype"] == "BYTES":
            t.contents.bytes_contents.extend(v.encode() for v in c["values"])
        else:
            t.contents.fp64_contents.extend(c["values"])
    req.parameters["top_k"].int64_param = 1
    req.outputs.add(name="top_labels")
    async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M["ModelInferResponse"].FromString,
        )
        response = await call(req)
    assert list(response.outputs[0].shape) == [3, 1]
    raw = response.raw_output_contents[0]
    values, at = [], 0
    while at < len(raw):
        n = int.from_bytes(raw[at : at + 4], "little")
        values.append(raw[at + 4 : at + 4 + n].decode())
        at += 4 + n
    assert values == sum(top1, [])
    # GraphPipe: the official client, k through the config string (request configs).
    arrays = [
        np.array(
            [float(v) if c["datatype"] == "FP64" else v for v in c["values"]],
            dtype=np.float64 if c["datatype"] == "FP64" else object,
        )
        for c in cols
    ]
    names = [c["name"] for c in cols]
    uri = gw.url + "/pipe/prostate/1/gp"
    for config, expected in ((None, top2), ("top_k:1", top1)):  # named outputs answer exactly those; "fqrv" names the FQRV tensor
        fqrv, top = await asyncio.to_thread(remote.execute_multi, uri, arrays, names, ["fqrv", "top_labels"], config)
        assert fqrv[0, 0] == b"pipe.prostate.1.p1"
        assert [[v.decode() for v in row] for row in top.tolist()] == expected
