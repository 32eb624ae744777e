"""ONNX servables built at test time answer like scikit-learn through /score, V2 REST, V2 gRPC and GraphPipe.

Four models (tests/onnx_models.py): a regressor on one [N, 4] input, a binary and a multiclass
classifier with ZipMap probabilities, and a pipeline with a one-hot encoded string input. Each is
deployed on a live gateway (HTTP + gRPC on free ports) and scored with the same rows through
every protocol and request layout; every answer must equal scikit-learn's ``predict`` and
``predict_proba`` within 1e-5 (the graphs compute in float32).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graphpipe import remote

from tests import onnx_models
from tests.api.test_v2_clients import score_predictions
from tests.api.v2_support import ensure_client_python, v2_gateway
from tests.api_gp.helpers import client, execute_multi
from tests.onnx_models import FEATURES, OnnxCase
from tests.support import InProcessGateway

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

TOLERANCE = 1e-5
CLIENT_SCRIPT = Path(__file__).with_name("onnx_client_calls.py")
#: The ONNX input each single-input model takes its [N, 4] matrix on.
MATRIX_INPUT = {"regressor": "float_input", "binary": "X", "multiclass": "input"}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[OnnxCase]]:
    directory = tmp_path_factory.mktemp("onnx-models")
    return directory, [build(directory) for build in onnx_models.CASES]


def definition(directory: Path, case: OnnxCase, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": "onnx", "project": case.name, "contract_number": 1}, "release_version": "r1"},
        "flavor": {"ONNX": {"modelPath": case.file, **case.settings, **(settings or {})}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def model_name(case: OnnxCase) -> str:
    return f"onnx.{case.name}.1"


def check(case: OnnxCase, got: dict[str, list[Any]], where: str) -> None:
    """Every expected column is in ``got`` (flattened) and equals scikit-learn's answer."""
    for name, want in case.expected.items():
        assert name in got, f"{case.name} via {where}: no output {name!r} in {sorted(got)}"
        values = list(np.asarray(got[name], dtype=object).reshape(-1))
        values = [v.decode() if isinstance(v, bytes) else v for v in values]
        if isinstance(want[0], int):  # ForestFlow's JSON prints Int64 as strings (ScalaPB's json4s)
            assert [int(v) for v in values] == want, f"{case.name} via {where}: {name}"
        elif isinstance(want[0], str):
            assert values == want, f"{case.name} via {where}: {name}"
        else:
            assert np.allclose(np.asarray(values, dtype=np.float64), want, rtol=0, atol=TOLERANCE), (
                f"{case.name} via {where}: {name}"
            )


def score_body(case: OnnxCase, drop: str | None = None) -> dict[str, Any]:
    """A BASIC request: string columns in a String entry, numbers in a Float64 entry."""
    names = [n for n in case.columns if n != drop]
    text = [n for n in names if isinstance(case.columns[n][0], str)]
    numbers = [n for n in names if n not in text]
    schema = ([{"type": "String", "fields": text}] if text else []) + [{"type": "Float64", "fields": numbers}]
    datum = []
    for i in range(case.rows):
        tensors = [{"String": {"data": [case.columns[n][i] for n in text]}}] if text else []
        tensors.append({"Float64": {"data": [case.columns[n][i] for n in numbers]}})
        datum.append({"tensors": tensors})
    return {"schema": schema, "datum": datum}


def pd_inputs(case: OnnxCase, shape: str, drop: str | None = None) -> list[dict[str, Any]]:
    """One V2 tensor per feature: ``[N]``, ``[N, 1]`` (MLServer) or ``[1, N]`` (TrustyAI)."""
    n = case.rows
    dims = {"[N]": [n], "[N,1]": [n, 1], "[1,N]": [1, n]}[shape]
    return [
        {"name": f, "shape": dims, "datatype": "BYTES" if isinstance(v[0], str) else "FP64", "data": v}
        for f, v in case.columns.items()
        if f != drop
    ]


def tensor_inputs(case: OnnxCase) -> list[dict[str, Any]]:
    """The model's own ONNX inputs as whole tensors (np layout for the one-input models)."""
    n = case.rows
    if case.name == "pipeline":
        return [
            {"name": "color", "shape": [n, 1], "datatype": "BYTES", "data": case.columns["color"]},
            {"name": "x", "shape": [n, 2], "datatype": "FP64", "data": case.matrix(["x1", "x2"]).tolist()},
        ]
    return [{"name": "predict", "shape": [n, 4], "datatype": "FP64", "data": case.matrix(FEATURES).tolist()}]


def graphpipe_tensors(case: OnnxCase) -> tuple[list[np.ndarray], list[str]]:
    if case.name == "pipeline":
        return [np.array(case.columns["color"], dtype=object).reshape(-1, 1), case.matrix(["x1", "x2"]).astype(np.float32)], [
            "color",
            "x",
        ]
    return [case.matrix(FEATURES).astype(np.float32)], [MATRIX_INPUT[case.name]]


async def run_triton(python: Path, job: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(python),
        str(CLIENT_SCRIPT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-4000:]
    return json.loads(out)


def triton_job(case: OnnxCase) -> dict[str, Any]:
    features = [
        {"name": f, "datatype": "BYTES" if isinstance(v[0], str) else "FP64", "values": v} for f, v in case.columns.items()
    ]
    tensors = [{"name": t["name"], "datatype": t["datatype"], "values": t["data"]} for t in tensor_inputs(case)]
    return {"model": model_name(case), "requests": {"pd": features, "tensors": tensors, "missing": features[:-1]}}


async def test_answers_equal_scikit_learn_through_every_protocol(tmp_path: Path, cases: tuple[Path, list[OnnxCase]]) -> None:
    directory, models = cases
    python = await asyncio.to_thread(ensure_client_python)
    async with v2_gateway(tmp_path / "data") as gw:
        for case in models:
            await gw.deploy(definition(directory, case))
        triton = asyncio.ensure_future(run_triton(python, {"grpc": gw.grpc_target, "models": [triton_job(c) for c in models]}))
        for case in models:
            status, reply, _ = await gw.post_json(f"/onnx/{case.name}/1/score", score_body(case))
            assert status == 200, reply
            check(case, score_predictions(reply), "/score")

            layouts = {
                "pd [N]": {"inputs": pd_inputs(case, "[N]")},
                "mlserver pd [N,1]": {"parameters": {"content_type": "pd"}, "inputs": pd_inputs(case, "[N,1]")},
                "trustyai pd [1,N]": {"inputs": pd_inputs(case, "[1,N]")},
                "np / ONNX tensors": {"inputs": tensor_inputs(case)},
            }
            for layout, payload in layouts.items():
                status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", payload)
                assert status == 200, (case.name, layout, reply)
                check(case, {o["name"]: o["data"] for o in reply["outputs"]}, f"V2 REST {layout}")

            uri = f"{gw.url}/onnx/{case.name}/1/gp"
            tensors, names = graphpipe_tensors(case)
            for label, input_names in (("named", names), ("grouped", None)):
                fqrv, *outputs = await execute_multi(uri, tensors, input_names)
                assert fqrv.tolist() == [[f"{model_name(case)}.r1".encode()]]
                check(case, dict(zip(case.expected, outputs)), f"GraphPipe {label}")
        seen = await triton

    for case in models:
        got = seen[model_name(case)]
        for label in ("pd", "tensors"):
            check(case, {name: out["values"] for name, out in got[label].items()}, f"tritonclient gRPC {label}")
        missing = got["missing"]
        assert missing["status"] == "StatusCode.INVALID_ARGUMENT", missing
        assert list(case.columns)[-1] in missing["message"], missing
        meta = got["metadata"]
        assert meta["platform"] == "onnx_onnxv1"
        assert [o["name"] for o in meta["outputs"]] == list(case.expected)
    inputs = {name: [(i["name"], i["datatype"], i["shape"]) for i in seen[name]["metadata"]["inputs"]] for name in seen}
    assert inputs == {  # symbolic batch dimensions as -1 (int64 shapes come as strings from as_json)
        "onnx.regressor.1": [("float_input", "FP32", ["-1", "4"])],
        "onnx.binary.1": [("X", "FP32", ["-1", "4"])],
        "onnx.multiclass.1": [("input", "FP32", ["-1", "4"])],
        "onnx.pipeline.1": [("color", "BYTES", ["-1", "1"]), ("x", "FP32", ["-1", "2"])],
    }


async def test_metadata_in_every_protocol(gw: InProcessGateway, cases: tuple[Path, list[OnnxCase]]) -> None:
    directory, models = cases
    case = next(c for c in models if c.name == "multiclass")
    async with gw.session.post(gw.url + "/servable", json=definition(directory, case)) as r:
        assert r.status == 200, await r.text()
    async with gw.session.get(gw.url + "/v2/models/onnx.multiclass.1") as r:
        v2 = await r.json()
    assert v2["platform"] == "onnx_onnxv1"
    assert v2["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert v2["outputs"] == [{"name": "output_label", "datatype": "BYTES", "shape": [-1]}] + [
        {"name": c, "datatype": "FP64", "shape": [-1]} for c in ("setosa", "versicolor", "virginica")
    ]
    async with gw.session.get(gw.url + "/onnx/multiclass/1/r1/metadata") as r:
        basic = (await r.json())["BasicMetaData"]
    assert basic["inputs"] == [
        {"name": "input", "description": "features: f0, f1, f2, f3", "shape": ["-1", "4"], "type": "Float32"}
    ]
    assert basic["outputs"][0] == {
        "name": "output_label",
        "description": "predicted label levels: [setosa,versicolor,virginica]",
        "shape": ["-1"],
        "type": "String",
    }
    assert basic["description"].startswith("ONNX model from skl2onnx")
    uri = gw.url + "/onnx/multiclass/1/gp"
    assert await client(remote.get_input_names, uri) == ["input"]
    assert await client(remote.get_input_shapes, uri) == [[None, 4]]
    assert await client(remote.get_output_names, uri) == ["fqrv", "output_label", "setosa", "versicolor", "virginica"]


async def test_a_corrupt_model_is_422_and_a_missing_input_is_400(
    gw: InProcessGateway, tmp_path: Path, cases: tuple[Path, list[OnnxCase]]
) -> None:
    directory, models = cases
    case = next(c for c in models if c.name == "binary")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / case.file).write_bytes((directory / case.file).read_bytes()[:200])
    async with gw.session.post(gw.url + "/servable", json=definition(bad, case)) as r:
        payload = await r.json()
    assert r.status == 422, payload
    assert payload["code"] == "CreateServableRequestInvalidError"
    assert payload["error"].startswith("'binary.onnx' is not a valid ONNX model"), payload
    async with gw.session.post(gw.url + "/servable", json=definition(directory, case, {"featureOrder": ["f0"]})) as r:
        payload = await r.json()
    assert r.status == 422 and "1 feature name(s) for an input of 4 columns" in payload["error"], payload

    async with gw.session.post(gw.url + "/servable", json=definition(directory, case)) as r:
        assert r.status == 200, await r.text()
    async with gw.session.post(gw.url + "/onnx/binary/1/score", json=score_body(case, drop="f2")) as r:
        payload = await r.json()
    assert r.status == 400, payload
    assert (
        payload["error"]
        == "missing input 'X' (FP32 [N, 4]): send it as one tensor, or every feature as a column; missing feature(s): f2"
    )
    async with gw.session.post(
        gw.url + "/v2/models/onnx.binary.1/infer", json={"inputs": pd_inputs(case, "[N]", drop="f0")}
    ) as r:
        payload = await r.json()
    assert r.status == 400 and payload["error"].endswith("missing feature(s): f0"), payload
    text = [{"name": f, "shape": [case.rows], "datatype": "BYTES", "data": ["abc"] * case.rows} for f in FEATURES]
    async with gw.session.post(gw.url + "/v2/models/onnx.binary.1/infer", json={"inputs": text}) as r:
        payload = await r.json()
    assert r.status == 400 and payload["error"] == "input 'X' (feature 'f0'): 'abc' is not a number; the model takes FP32", (
        payload
    )
    # The GraphPipe codec checks a vector input's declared shape before the model sees the tensor.
    with pytest.raises(Exception, match="shape \\[2, 3\\] does not fit input 'X' \\(declared \\[-1, 4\\]"):
        await execute_multi(gw.url + "/onnx/binary/1/gp", [np.ones((2, 3), dtype=np.float32)], ["X"])
