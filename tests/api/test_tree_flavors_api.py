"""XGBoost, LightGBM and scikit-learn models served natively answer what the libraries answer,
through /score, V2 REST, V2 gRPC, V1 and GraphPipe (rows with missing numbers, a missing, an
unseen and string categories); bad model files are 422s, bad inputs 400s naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.codecs.v2_request import tensors_of
from tests import tree_models
from tests.api.test_v2_clients import score_predictions
from tests.api.v2_support import v2_gateway
from tests.api_gp.helpers import execute_multi
from tests.tree_models import TreeCase

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")
M = messages()
CASES = tree_models.XGBOOST_CASES + tree_models.LIGHTGBM_CASES + tree_models.SKLEARN_CASES


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[TreeCase]]:
    directory = tmp_path_factory.mktemp("tree-models")
    return directory, [build(directory) for build in CASES]


def definition(directory: Path, case: TreeCase, file: str | None = None, flavor: str | None = None) -> dict[str, Any]:
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": "trees", "project": case.name, "contract_number": 1}, "release_version": "r1"},
        "flavor": {flavor or case.flavor: {"modelPath": file or case.file}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def model_name(case: TreeCase) -> str:
    return f"trees.{case.name}.1"


def check(case: TreeCase, got: dict[str, Any], where: str) -> None:
    for name, want in case.expected.items():
        assert name in got, f"{case.name} via {where}: no output {name!r} in {sorted(got)}"
        values = [v.decode() if isinstance(v, bytes) else v for v in np.asarray(got[name], dtype=object).reshape(-1)]
        if isinstance(want[0], str):
            assert values == want, f"{case.name} via {where}: {name}"
        else:
            np.testing.assert_allclose(
                np.asarray(values, dtype=np.float64), want, rtol=case.rtol, atol=0, err_msg=f"{case.name} via {where}: {name}"
            )


def is_text(values: list[Any]) -> bool:
    return any(isinstance(v, str) for v in values)


def score_body(case: TreeCase) -> dict[str, Any]:
    """BASIC: categories in a String entry, numbers in a Float64 entry (missing numbers as null)."""
    text = [n for n, v in case.columns.items() if is_text(v)]
    numbers = [n for n in case.columns if n not in text]
    schema = ([{"type": "String", "fields": text}] if text else []) + [{"type": "Float64", "fields": numbers}]
    datum = []
    for i in range(case.rows):
        tensors = [{"String": {"data": [case.columns[n][i] or "" for n in text]}}] if text else []
        tensors.append({"Float64": {"data": [case.columns[n][i] for n in numbers]}})
        datum.append({"tensors": tensors})
    return {"schema": schema, "datum": datum}


def v2_inputs(case: TreeCase) -> list[dict[str, Any]]:
    """Missing numbers as null, a missing category as an empty string (BYTES data are strings)."""
    return [
        {"name": n, "shape": [case.rows], "datatype": "BYTES", "data": [x or "" for x in v]}
        if is_text(v)
        else {"name": n, "shape": [case.rows], "datatype": "FP64", "data": v}
        for n, v in case.columns.items()
    ]


def grpc_request(case: TreeCase) -> Any:
    req = M["ModelInferRequest"](model_name=model_name(case))
    for n, v in case.columns.items():
        tensor = req.inputs.add(name=n, shape=[case.rows])
        if is_text(v):
            tensor.datatype = "BYTES"
            tensor.contents.bytes_contents.extend((x or "").encode() for x in v)
        else:
            tensor.datatype = "FP64"
            tensor.contents.fp64_contents.extend(np.nan if x is None else x for x in v)
    return req


def grpc_outputs(reply: Any) -> dict[str, list[Any]]:
    return {t.name: t.array.tolist() for t in tensors_of(reply, "output")}


def gp_tensors(case: TreeCase) -> tuple[list[np.ndarray], list[str]]:
    tensors, names = [], []
    for n, v in case.columns.items():
        names.append(n)
        if is_text(v):
            tensors.append(np.array([x or "" for x in v], dtype=object))
        else:
            tensors.append(np.array([np.nan if x is None else x for x in v], dtype=np.float64))
    return tensors, names


@pytest.mark.slow  # sixteen models trained and deployed
async def test_answers_equal_the_libraries_through_every_protocol(tmp_path: Path, cases: tuple[Path, list[TreeCase]]) -> None:
    directory, models = cases
    async with v2_gateway(tmp_path / "data", allow_python=True) as gw:  # SKLearn unpickles
        for case in models:
            await gw.deploy(definition(directory, case))
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            infer = channel.unary_unary(
                f"/{SERVICE}/ModelInfer",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=M["ModelInferResponse"].FromString,
            )
            for case in models:
                status, reply, _ = await gw.post_json(f"/trees/{case.name}/1/score", score_body(case))
                assert status == 200, reply
                check(case, score_predictions(reply), "/score")

                status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", {"inputs": v2_inputs(case)})
                assert status == 200, (case.name, reply)
                check(case, {o["name"]: o["data"] for o in reply["outputs"]}, "V2 REST")

                check(case, grpc_outputs(await infer(grpc_request(case))), "V2 gRPC")

                instances = [{n: v[i] for n, v in case.columns.items()} for i in range(case.rows)]
                status, reply, _ = await gw.post_json(f"/v1/models/{model_name(case)}:predict", {"instances": instances})
                assert status == 200, (case.name, reply)
                rows = reply["predictions"]  # one output: its values; several: one object per row
                check(case, {k: [r[k] for r in rows] for k in rows[0]} if isinstance(rows[0], dict) else {"predict": rows}, "V1")

                tensors, names = gp_tensors(case)
                _, *outputs = await execute_multi(f"{gw.url}/trees/{case.name}/1/gp", tensors, names)
                check(case, dict(zip(case.expected, outputs)), "GraphPipe")


def mlflow_models(root: Path, cases: dict[str, TreeCase], directory: Path) -> dict[str, Path]:
    """MLflow model directories written by the real mlflow package (xgboost, lightgbm, sklearn
    flavors), a python_function-only one and a custom python_function one. Their pip requirements are
    given: inferring them, mlflow loads each model again in a child interpreter (about 3 s a model), and the
    gateway reads neither requirements.txt nor conda.yaml."""
    import lightgbm as lgb
    import mlflow.lightgbm
    import mlflow.sklearn
    import mlflow.xgboost
    import xgboost as xgb
    import yaml
    from joblib import load

    models: dict[str, Path] = {}
    booster = xgb.Booster(model_file=str(directory / cases["xgb_binary"].file))
    mlflow.xgboost.save_model(booster, str(root / "xgb"), model_format="json", pip_requirements=["xgboost"])
    models["xgb_binary"] = root / "xgb"
    lgb_booster = lgb.Booster(model_file=str(directory / cases["lgb_multiclass"].file))
    mlflow.lightgbm.save_model(lgb_booster, str(root / "lgb"), pip_requirements=["lightgbm"])
    models["lgb_multiclass"] = root / "lgb"
    estimator = load(directory / cases["sk_gb_binary"].file)
    mlflow.sklearn.save_model(estimator, str(root / "sk"), serialization_format="cloudpickle", pip_requirements=["scikit-learn"])
    models["sk_gb_binary"] = root / "sk"
    # Only python_function left: served from its loader module and data.
    mlflow.xgboost.save_model(booster, str(root / "pyfunc"), model_format="ubj", pip_requirements=["xgboost"])
    doc = yaml.safe_load((root / "pyfunc" / "MLmodel").read_text())
    del doc["flavors"]["xgboost"]
    (root / "pyfunc" / "MLmodel").write_text(yaml.safe_dump(doc))
    models["pyfunc_xgb_binary"] = root / "pyfunc"
    custom = root / "custom"
    custom.mkdir()
    (custom / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": {"loader_module": "my_team.model"}}}))
    models["custom"] = custom
    return models


@pytest.mark.slow  # the mlflow package takes seconds to import and write the directories
async def test_mlflow_models_are_served_natively_without_mlflow(tmp_path: Path, cases: tuple[Path, list[TreeCase]]) -> None:
    directory, models = cases
    by_name = {c.name: c for c in models}
    root = tmp_path / "models"
    root.mkdir()
    dirs = mlflow_models(root, by_name, directory)
    async with v2_gateway(tmp_path / "data", allow_python=True, artifact_roots=str(root)) as gw:
        for label, path in dirs.items():
            case = by_name[label.removeprefix("pyfunc_")] if label != "custom" else by_name["xgb_binary"]
            body = definition(path, case)
            del body["flavor"]
            body["fqrv"]["contract"]["project"] = label
            status, reply, _ = await gw.post_json("/servable", body)
            if label == "custom":
                assert status == 422 and "'my_team.model'" in reply["error"], reply
                continue
            assert status == 200, (label, reply)
            status, reply, _ = await gw.post_json(f"/v2/models/trees.{label}.1/infer", {"inputs": v2_inputs(case)})
            assert status == 200, (label, reply)
            check(case, {o["name"]: o["data"] for o in reply["outputs"]}, f"MLflow {label}")
            status, reply, _ = await gw.post_json(f"/trees/{label}/1/score", score_body(case))
            check(case, score_predictions(reply), f"MLflow {label} /score")


async def test_bad_model_files_are_422_and_bad_inputs_400(tmp_path: Path) -> None:
    directory = tmp_path / "models"
    directory.mkdir()
    by_name = {c.name: c for c in (tree_models.xgb_binary(directory), tree_models.lgb_binary(directory))}
    bad = tmp_path / "bad"
    bad.mkdir()
    xgb_text = (directory / by_name["xgb_binary"].file).read_text()
    lgb_text = (directory / by_name["lgb_binary"].file).read_text()
    (bad / "truncated.json").write_text(xgb_text[: len(xgb_text) // 2])
    import xgboost as xgb

    xgb.Booster(model_file=str(directory / by_name["xgb_binary"].file)).save_model(str(directory / "binary.ubj"))
    (bad / "truncated.ubj").write_bytes((directory / "binary.ubj").read_bytes()[:500])
    (bad / "rank.json").write_text(xgb_text.replace('"binary:logistic"', '"rank:pairwise"'))
    (bad / "cycle.json").write_text(xgb_text.replace('"left_children":[1,', '"left_children":[0,', 1))
    (bad / "truncated.txt").write_text(lgb_text[: len(lgb_text) // 2])
    (bad / "linear.txt").write_text(lgb_text.replace("is_linear=0", "is_linear=1", 1))
    (bad / "lambdarank.txt").write_text(lgb_text.replace("objective=binary sigmoid:1", "objective=lambdarank"))
    (bad / "garbage.joblib").write_bytes(b"\x80\x04not a pickle")
    refused = {
        ("XGBoost", "truncated.json"): "not valid JSON",
        ("XGBoost", "truncated.ubj"): "truncated",
        ("XGBoost", "rank.json"): "learner.objective.name: 'rank:pairwise' is not scored",
        ("XGBoost", "cycle.json"): "trees[0]: node 0 is reached twice",
        ("LightGBM", "truncated.txt"): "no 'end of trees' line",
        ("LightGBM", "linear.txt"): "Tree=0.is_linear: linear trees are not scored",
        ("LightGBM", "lambdarank.txt"): "objective: 'lambdarank' is not scored",
        ("SKLearn", "garbage.joblib"): "not a readable pickle",
    }
    case = by_name["xgb_binary"]
    async with v2_gateway(tmp_path / "data", allow_python=False) as gw:
        for (flavor, file), why in refused.items():
            body = definition(bad, case, file, flavor)
            status, reply, _ = await gw.post_json("/servable", body)
            if flavor == "SKLearn":  # off unless the Python flavor is allowed
                assert status == 422 and "SKLearn flavor is disabled" in reply["error"], reply
                continue
            assert status == 422, (file, reply)
            assert reply["error"].startswith(f"{flavor} model {file!r}: ") and why in reply["error"], reply

        await gw.deploy(definition(directory, case))
        rows = {"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]}
        status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", rows)
        assert status == 400 and reply["error"] == "input 'a': 'abc' is not a number; the model takes a number for 'a'", reply
        matrix = {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]}]}
        status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", matrix)
        assert status == 400 and reply["error"].startswith("input 'X': the np layout needs shape [N, 3]"), reply
        good = {"inputs": [{"name": "X", "shape": [1, 3], "datatype": "BYTES", "data": ["0.5", "1.0", "red"]}]}
        status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", good)
        assert status == 200, reply
        assert [o["data"][0] for o in reply["outputs"]][1:] == [case.expected["0"][0], case.expected["1"][0]]


async def test_xgboost_explanations_equal_pred_contribs(tmp_path: Path) -> None:
    import xgboost as xgb

    directory = tmp_path / "models"
    directory.mkdir()
    case = tree_models.xgb_binary(directory)
    _, rows = tree_models.request_rows()
    booster = xgb.Booster(model_file=str(directory / case.file))
    want = booster.predict(xgb.DMatrix(rows, enable_categorical=True), pred_contribs=True)
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(definition(directory, case))
        status, reply, _ = await gw.post_json(f"/trees/{case.name}/1/explain", score_body(case))
    assert status == 200, reply
    explanation = reply["Explanation"]
    assert explanation["method"] == "TreeSHAP" and explanation["columns"] == ["a", "b", "color", "BiasTerm"]
    got = [[row[c] for c in explanation["columns"]] for row in explanation["contributions"]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # xgboost sums in float32


@pytest.mark.parametrize("build", [tree_models.lgb_binary, tree_models.lgb_regression_zero, tree_models.lgb_multiclass])
async def test_lightgbm_explanations_equal_pred_contrib(tmp_path: Path, build: Any) -> None:
    """V2 `"explain": true` on a LightGBM release answers what `Booster.predict(pred_contrib=True)` answers,
    per class for a multiclass model (LightGBM lays the classes out side by side, F + 1 values each)."""
    import lightgbm as lgb

    directory = tmp_path / "models"
    directory.mkdir()
    case = build(directory)
    _, rows = tree_models.request_rows()
    flat = lgb.Booster(model_file=str(directory / case.file)).predict(rows, pred_contrib=True)
    features = len(case.columns)
    want = flat.reshape(case.rows, -1, features + 1)
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(definition(directory, case))
        body = {"inputs": v2_inputs(case), "parameters": {"explain": True}}
        status, reply, _ = await gw.post_json(f"/v2/models/{model_name(case)}/infer", body)
    assert status == 200, reply
    (out,) = [o for o in reply["outputs"] if o["name"] == "contributions"]
    got = np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])
    assert got.shape[0] == case.rows and got.shape[-1] == features + 1, out["shape"]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-9, atol=1e-12)  # both in float64
