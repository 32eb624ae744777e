"""Explanations through every front-end of a real gateway: BASIC /explain, V1 :explain, V2 REST and gRPC.

Routed like a score (the release that answered is named, shadow copies stay plain scores, the
prediction log keeps the contributions), TreeSHAP for H2O trees, KernelSHAP for a Python model that
declares an explainer, 422 for one that cannot explain, 504 past the deadline.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from tests.api.test_h2o_score import INFOS, body, golden
from tests.api.v2_support import v2_gateway
from tests.support import FIXTURES, H2O_DIR, InProcessGateway, python_servable, score_body, serve_in_process, wait_for

GBM = "prostate_gbm_binomial"
FEATURES = [c["name"] for c in INFOS[GBM]["inputs"]]
SERVABLES = Path(__file__).resolve().parent / "servables"


def h2o_definition(mojo: str, release: str, log_level: str = "NONE", phase_in: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "path": H2O_DIR.as_uri(),
        "fqrv": {"contract": {"organization": "acme", "project": "trees", "contract_number": 1}, "release_version": release},
        "flavor": {"H2OMojo": {"mojoPath": mojo}},
        "servableSettings": {
            "policySettings": {
                "validityPolicy": [{"ImmediatelyValid": {}}],
                "phaseInPolicy": phase_in or {"ImmediatePhaseIn": {}},
            },
            "loggingSettings": {"logLevel": log_level, "keyFeatures": ["reqid"] if log_level != "NONE" else []},
        },
    }


async def post(gw: InProcessGateway, path: str, payload: Any, **kw: Any) -> tuple[int, Any]:
    async with gw.session.post(gw.url + path, json=payload, **kw) as r:
        return r.status, await r.json(content_type=None)


async def deploy(gw: InProcessGateway, definition: dict[str, Any]) -> None:
    status, answer = await post(gw, "/servable", definition)
    assert status == 200, answer


def logit_of(prediction: dict[str, Any]) -> list[float]:
    """log(p1 / p0) of each datum of a binomial Prediction (its Float64 group holds p0, p1)."""
    out = []
    for datum in prediction["datum"]:
        (p0, p1) = next(iter(datum["tensors"][1].values()))["data"]
        out.append(math.log(p1 / p0))
    return out


def events(gw: InProcessGateway) -> list[dict[str, Any]]:
    path = gw.gateway.settings.data_dir / "predictions.jsonl"
    return [orjson.loads(line)["event"] for line in path.read_bytes().splitlines() if line.strip()] if path.exists() else []


@pytest.fixture
async def trees(tmp_path: Path) -> Any:
    async with v2_gateway(tmp_path / "data", access_log=False, log_level="warning") as gw:
        await gw.deploy(h2o_definition(INFOS[GBM]["mojo"], "r1", log_level="FULL"))
        yield gw


async def test_basic_explain_answers_the_prediction_and_contributions(trees: Any) -> None:
    gw = trees.server
    rows = golden(GBM)[:6]
    request = {**body(GBM, rows, typed=False), "configs": {"reqid": "e1"}}
    status, explained = await post(gw, "/acme/trees/1/explain", request)
    assert status == 200, explained
    status, scored = await post(gw, "/acme/trees/1/score", {**request, "configs": {"reqid": "s1"}})
    assert explained["Prediction"] == scored["Prediction"]
    explanation = explained["Explanation"]
    assert explanation["fqrv"]["releaseVersion"] == "r1" and explanation["method"] == "TreeSHAP"
    assert explanation["groups"] == ["margin"]
    assert explanation["columns"] == [*FEATURES, "BiasTerm"]
    contributions = explanation["contributions"]
    assert len(contributions) == len(rows) and list(contributions[0]) == [*FEATURES, "BiasTerm"]
    sums = [sum(c.values()) for c in contributions]
    np.testing.assert_allclose(sums, logit_of(scored["Prediction"]), rtol=1e-9)
    # Logged like a score, with the same keys, the contributions in the event (FULL).
    await wait_for(lambda: len(events(gw)) >= 2, 10, "two events")
    logged = {e["inferenceRequest"]["configs"]["reqid"]: e for e in events(gw)}
    assert logged["e1"]["prediction"]["Explanation"]["contributions"] == contributions
    assert "Explanation" not in logged["s1"]["prediction"]
    # /metadata says how it explains.
    async with gw.session.get(gw.url + "/acme/trees/1/r1/metadata") as r:
        assert (await r.json())["BasicMetaData"]["explanations"] == {"method": "TreeSHAP", "space": "margin"}


async def test_bad_input_gets_what_score_gets(trees: Any) -> None:
    gw = trees.server
    for payload in ({"schema": "nope"}, {"schema": [{"type": "Float64", "fields": ["AGE"]}], "datum": [{"tensors": []}]}):
        (status, score), (explain_status, explain) = (
            await post(gw, "/acme/trees/1/score", payload),
            await post(gw, "/acme/trees/1/explain", payload),
        )
        assert status == explain_status == 400
        assert {k: v for k, v in explain.items() if k != "request_id"} == {k: v for k, v in score.items() if k != "request_id"}


async def test_v1_explain_in_kserves_shape(trees: Any) -> None:
    gw = trees.server
    instances = [{"AGE": 65, "RACE": "1", "DPROS": "2", "DCAPS": "1", "PSA": 1.4, "VOL": 0, "GLEASON": 6}, {"AGE": 70}]
    status, predicted = await post(gw, "/v1/models/acme.trees.1:predict", {"instances": instances})
    assert status == 200
    status, explained = await post(gw, "/v1/models/acme.trees.1:explain", {"instances": instances})
    assert status == 200, explained
    assert explained["predictions"] == predicted["predictions"]
    assert explained["release"] == "acme.trees.1.r1" and explained["method"] == "TreeSHAP"
    for prediction, explanation in zip(predicted["predictions"], explained["explanations"]):
        assert list(explanation) == [*FEATURES, "BiasTerm"]
        assert sum(explanation.values()) == pytest.approx(math.log(prediction["1"] / prediction["0"]), rel=1e-9)
    assert explained["explanations"][1]["PSA"] != 0 or explained["explanations"][1]["AGE"] != 0  # a mostly-missing row


async def test_v2_rest_and_grpc_add_a_contributions_output(trees: Any) -> None:
    gw = trees.server
    inputs = [
        {"name": "AGE", "datatype": "FP64", "shape": [2], "data": [65.0, 71.0]},
        {"name": "DPROS", "datatype": "BYTES", "shape": [2], "data": ["2", "4"]},
        {"name": "PSA", "datatype": "FP64", "shape": [2], "data": [1.4, 20.0]},
    ]
    status, plain = await post(gw, "/v2/models/acme.trees.1/infer", {"inputs": inputs})
    assert status == 200 and "contributions" not in [o["name"] for o in plain["outputs"]]
    status, answer = await post(gw, "/v2/models/acme.trees.1/infer", {"inputs": inputs, "parameters": {"explain": True}})
    assert status == 200, answer
    outputs = {o["name"]: o for o in answer["outputs"]}
    contributions = outputs["contributions"]
    assert contributions["shape"] == [2, len(FEATURES) + 1] and contributions["datatype"] == "FP64"
    assert contributions["parameters"]["columns"] == [*FEATURES, "BiasTerm"]
    assert contributions["parameters"]["release"] == "acme.trees.1.r1"
    values = np.array(contributions["data"]).reshape(2, -1)
    p1 = np.array(outputs["1"]["data"])
    np.testing.assert_allclose(values.sum(axis=1), np.log(p1 / (1 - p1)), rtol=1e-9)
    status, refused = await post(gw, "/v2/models/acme.trees.1/infer", {"inputs": inputs, "parameters": {"explain": "yes"}})
    assert status == 400 and "explain" in refused["error"]

    m = messages()
    request = m["ModelInferRequest"](model_name="acme.trees.1")
    request.parameters["explain"].bool_param = True
    for item in inputs:
        tensor = request.inputs.add(name=item["name"], datatype=item["datatype"], shape=item["shape"])
        if item["datatype"] == "FP64":
            tensor.contents.fp64_contents.extend(item["data"])
        else:
            tensor.contents.bytes_contents.extend(v.encode() for v in item["data"])
    async with grpc.aio.insecure_channel(trees.grpc_target) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=m["ModelInferResponse"].FromString,
        )
        response = await call(request)
    names = [o.name for o in response.outputs]
    k = names.index("contributions")
    out = response.outputs[k]
    assert list(out.shape) == [2, len(FEATURES) + 1]
    assert orjson.loads(out.parameters["columns"].string_param) == [*FEATURES, "BiasTerm"]
    grpc_values = np.frombuffer(response.raw_output_contents[k], dtype="<f8").reshape(2, -1)
    np.testing.assert_array_equal(grpc_values, values)


async def test_the_release_that_answered_explains_and_shadows_stay_scores(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning") as gw:
        first = h2o_definition(INFOS[GBM]["mojo"], "r1", log_level="FULL")
        first["contractSettings"] = {
            "expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}},
            "router": {"LatestPhaseInPctBasedRouter": {}},
        }
        await deploy(gw, first)
        await deploy(gw, h2o_definition(INFOS["prostate_drf_binomial"]["mojo"], "r2", log_level="FULL"))
        request = {**body(GBM, golden(GBM)[:3], typed=False), "configs": {"reqid": "x"}}
        status, explained = await post(gw, "/acme/trees/1/explain", request)
        assert status == 200, explained
        assert explained["Prediction"]["fqrv"]["releaseVersion"] == "r2" == explained["Explanation"]["fqrv"]["releaseVersion"]
        # The DRF's margin is the probability of the second class.
        for contributions, datum in zip(explained["Explanation"]["contributions"], explained["Prediction"]["datum"]):
            p1 = next(iter(datum["tensors"][1].values()))["data"][1]
            assert sum(contributions.values()) == pytest.approx(p1, rel=1e-9)
        await wait_for(lambda: len(events(gw)) >= 2, 10, "the served event and the shadow copy")
        served = [e for e in events(gw) if e.get("servedRequest")]
        shadow = [e for e in events(gw) if not e.get("servedRequest")]
        assert [e["fqrv"]["releaseVersion"] for e in served] == ["r2"] and "Explanation" in served[0]["prediction"]
        assert [e["fqrv"]["releaseVersion"] for e in shadow] == ["r1"] and "Explanation" not in shadow[0]["prediction"]
        assert shadow[0]["inferenceRequest"]["configs"] == served[0]["inferenceRequest"]["configs"] == {"reqid": "x"}


async def test_kernel_shap_explains_a_python_model_that_declares_it(tmp_path: Path) -> None:
    directory = tmp_path / "linear"
    directory.mkdir()
    shutil.copy(SERVABLES / "linear.py", directory / "linear.py")
    rng = np.random.default_rng(0)
    background = rng.normal(size=(20, 3))
    (directory / "background.csv").write_text("a,b,c\n" + "\n".join(",".join(map(repr, row)) for row in background.tolist()))
    definition = python_servable(directory=directory, module="linear.py")
    definition["explainer"] = {"KernelShap": {"background": "background.csv", "samples": 100}}
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning") as gw:
        await deploy(gw, definition)
        x = [[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]]
        request = {
            "schema": [{"type": "Float64", "fields": ["a", "b", "c"]}],
            "datum": [{"tensors": [{"Float64": {"data": r}}]} for r in x],
        }
        status, explained = await post(gw, "/acme/demo/1/explain", request)
        assert status == 200, explained
        assert explained["Explanation"]["method"] == "KernelSHAP"
        assert explained["Explanation"]["groups"] == ["y", "pair[0]", "pair[1]"]
        means = background.mean(axis=0)
        for row, contributions in zip(x, explained["Explanation"]["contributions"]):
            y = contributions["y"]
            expected = np.array([1, 2, 3]) * (np.array(row) - means)
            np.testing.assert_allclose([y["a"], y["b"], y["c"]], expected, atol=1e-9)
            assert y["BiasTerm"] == pytest.approx(float(means @ [1, 2, 3]), abs=1e-12)
        async with gw.session.get(gw.url + "/acme/demo/1/v1/metadata") as r:
            meta = (await r.json())["BasicMetaData"]["explanations"]
        assert meta == {"method": "KernelSHAP", "backgroundRows": 20, "samples": 100, "space": "output"}


async def test_a_release_that_cannot_explain_answers_422(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", explain_max_rows=2) as gw:
        await deploy(gw, python_servable())
        status, refused = await post(gw, "/acme/demo/1/explain", score_body([1.0]))
        assert status == 422, refused
        assert "acme.demo.1.v1 cannot explain" in str(refused) and "explainer" in str(refused)
        status, refused = await post(gw, "/v1/models/acme.demo.1:explain", {"instances": [{"x": 1.0, "label": "a"}]})
        assert status == 422
        status, refused = await post(gw, "/acme/demo/1/explain", score_body([1.0, 2.0, 3.0]))
        assert status == 400 and "over the limit of 2" in str(refused)
        async with gw.session.get(gw.url + "/acme/demo/1/v1/metadata") as r:
            assert (await r.json())["BasicMetaData"]["explanations"] is None


async def test_an_explanation_past_its_deadline_is_a_504(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    definition = python_servable(directory=FIXTURES / "servables" / "gated")
    definition["explainer"] = {"KernelShap": {"background": [{"x": 1.0}, {"x": 3.0}], "samples": 10}}
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning") as gw:
        await deploy(gw, definition)
        try:
            request = score_body([2.0], configs={"gate": str(gate)})
            status, answer = await post(gw, "/acme/demo/1/explain", request, headers={"X-Request-Timeout-Ms": "300"})
            assert status == 504, answer
        finally:
            gate.touch()
        status, answer = await post(gw, "/acme/demo/1/explain", score_body([2.0]))
        assert status == 200, answer
        assert answer["Explanation"]["groups"] == ["double"]  # one numeric output: contributions by column name
        assert answer["Explanation"]["contributions"] == [{"x": 0.0, "BiasTerm": 4.0}]
