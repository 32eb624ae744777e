"""The V2 REST np request (one numeric ``[N, F]`` tensor) on the plain path answers as the general path.

A real gateway on a free port serves numeric XGBoost and LightGBM models and two H2O MOJOs. Each
np body is sent as it is (read by ``_ffjson.v2_np`` straight into its Frame) and again made
general by an empty ``outputs`` list (same meaning, decoded by the general path): both answers
must be the same bytes, content type and request id; the plain path must really have taken the
first (and left every bad body to the general path, whose 400 names what is wrong).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from forestflow.api import v2_rest
from forestflow.codecs import _ffjson
from tests.api.v2_support import V2Gateway, v2_gateway
from tests.support import H2O_DIR

FEATURES = ["f0", "f1", "f2", "f3"]


def _definition(path: Path, project: str, flavor: dict[str, Any]) -> dict[str, Any]:
    return {
        "path": path.as_uri(),
        "fqrv": {"contract": {"organization": "np", "project": project, "contract_number": 1}, "release_version": "r1"},
        "flavor": flavor,
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def rows_of(n: int) -> np.ndarray:
    """Multiples of 1/64 with a missing value: exact in FP32 and in short decimals."""
    X = np.round(np.random.default_rng(n).normal(size=(n, len(FEATURES))) * 64) / 64
    X[0, 1] = np.nan
    return X


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Binary XGBoost and multiclass LightGBM models on four numeric features, and their predictions."""
    import lightgbm as lgb
    import xgboost as xgb

    directory = tmp_path_factory.mktemp("np-models")
    X = np.random.default_rng(0).normal(size=(400, len(FEATURES)))
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int) + (X[:, 3] > 1)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 3}, xgb.DMatrix(X, y > 0, feature_names=FEATURES), 10)
    booster.save_model(str(directory / "xgb.json"))
    params = {"objective": "multiclass", "num_class": 3, "num_leaves": 8, "verbose": -1}
    gbm = lgb.train(params, lgb.Dataset(X, y, feature_name=FEATURES), 10)
    gbm.save_model(str(directory / "lgb.txt"))
    return directory, {"xgb": lambda m: booster.inplace_predict(m), "lgb": lambda m: gbm.predict(m)}


@pytest.fixture
async def gw(tmp_path: Path, models: tuple[Path, dict[str, Any]]) -> AsyncIterator[V2Gateway]:
    directory, _ = models
    async with v2_gateway(tmp_path / "data") as gateway:
        await gateway.deploy(_definition(directory, "xgb", {"XGBoost": {"modelPath": "xgb.json"}}))
        await gateway.deploy(_definition(directory, "lgb", {"LightGBM": {"modelPath": "lgb.txt"}}))
        await gateway.deploy(_definition(H2O_DIR, "binomial", {"H2OMojo": {"mojoPath": "prostate_gbm_binomial.zip"}}))
        await gateway.deploy(_definition(H2O_DIR, "iris", {"H2OMojo": {"mojoPath": "iris_gbm_multinomial.zip"}}))
        yield gateway


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the plain path took each request (in order), recorded around v2_rest._plain_frame."""
    seen: list[bool] = []
    real = v2_rest._plain_frame

    async def spy(*args: Any) -> Any:
        plain = await real(*args)
        seen.append(plain is not None)
        return plain

    monkeypatch.setattr(v2_rest, "_plain_frame", spy)
    return seen


def np_body(X: np.ndarray, datatype: str = "FP32", nested: bool = False, **extra: Any) -> dict[str, Any]:
    integers = datatype.startswith(("INT", "UINT"))  # sent as integers: 1.0 would be converted, not read plain
    values = [[None if np.isnan(v) else int(v) if integers else v for v in row] for row in X.tolist()]
    data = values if nested else [v for row in values for v in row]
    return {"inputs": [{"name": "input-0", "shape": list(X.shape), "datatype": datatype, "data": data}], **extra}


async def both(gw: V2Gateway, model: str, body: dict[str, Any]) -> tuple[int, bytes, str, str]:
    """The plain answer (status, body, content type, X-Request-Id), checked equal to the general one."""
    answers = []
    for sent in (body, {**body, "outputs": []}):
        headers = {"X-Request-Id": "req-7"}
        async with gw.server.session.post(f"{gw.url}/v2/models/{model}/infer", data=orjson.dumps(sent), headers=headers) as r:
            answers.append((r.status, await r.read(), r.headers["Content-Type"], r.headers.get("X-Request-Id", "")))
    assert answers[0] == answers[1], (model, body)
    return answers[0]


def output(answer: bytes, name: str) -> np.ndarray:
    out = next(o for o in orjson.loads(answer)["outputs"] if o["name"] == name)
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


async def test_np_bodies_of_the_tree_flavors_answer_as_the_general_path_and_the_library(
    gw: V2Gateway, models: tuple[Path, dict[str, Any]], taken: list[bool]
) -> None:
    _, predict = models
    for rows in (1, 3, 100):
        X = rows_of(rows)
        for nested in (False, True):
            body = np_body(X, nested=nested)
            assert _ffjson.v2_np(orjson.dumps(body)) is not None
            status, answer, content_type, _ = await both(gw, "np.xgb.1", body)
            assert status == 200 and content_type == "application/json", answer
            assert taken[-2:] == [True, False]  # the plain path took the first, the general path the second
            reply = orjson.loads(answer)
            assert reply["model_name"] == "np.xgb.1" and reply["id"] == "req-7" and "parameters" not in reply
            assert [o["shape"] for o in reply["outputs"]] == [[rows, 1]] * 3
            np.testing.assert_allclose(output(answer, "1")[:, 0], predict["xgb"](X.astype(np.float32)), rtol=1e-6)

            status, answer, _, _ = await both(gw, "np.lgb.1", body)
            assert status == 200 and taken[-2:] == [True, False], answer
            got = np.column_stack([output(answer, str(k))[:, 0] for k in range(3)])
            np.testing.assert_allclose(got, predict["lgb"](X.astype(np.float32).astype(np.float64)), rtol=1e-12)


async def test_np_bodies_of_every_numeric_datatype_and_the_request_parameters(gw: V2Gateway, taken: list[bool]) -> None:
    X = np.array([[1.0, 2.0, -3.0, 4.0], [0.0, 5.0, 6.0, -1.0]])
    variants = [
        np_body(X, "FP64"),
        np_body(X, "INT32", nested=True),
        np_body(X, "INT8", id="mine", parameters={"reqid": "a", "n": 2}),
        np_body(np.abs(X), "UINT16", id=12),
        np_body(X, "FP32", parameters={"content_type": "np"}, model_name="np.xgb.1"),
    ]
    for body in variants:
        status, answer, _, request_id = await both(gw, "np.xgb.1", body)
        assert status == 200 and taken[-2:] == [True, False], (body, answer)
        reply = orjson.loads(answer)
        assert reply["id"] == str(body.get("id", "req-7"))
        if body.get("parameters", {}).get("content_type"):
            assert reply["parameters"] == {"content_type": "np"}
    flags = {"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "BOOL", "data": [True, False, True, True]}]}
    status, answer, _, _ = await both(gw, "np.xgb.1", flags)
    assert status == 200 and taken[-2:] == [True, False], answer


async def test_np_bodies_of_h2o_mojos_answer_as_the_general_path(gw: V2Gateway, taken: list[bool]) -> None:
    prostate = np.array([[65.0, 1.0, 2.0, 1.0, 1.4, 0.0, 6.0], [70.0, 2.0, 3.0, 2.0, 4.8, 12.5, 7.0]])
    iris = np.array([[5.1, 3.5, 1.4, 0.2, 0.0], [6.7, 3.0, 5.2, 2.3, 1.0]])
    for model, X in (("np.binomial.1", prostate), ("np.iris.1", iris)):
        for rows in (1, 2):
            status, answer, _, _ = await both(gw, model, np_body(X[:rows]))
            assert status == 200 and taken[-2:] == [True, False], (model, answer)
            assert all(o["shape"][0] == rows for o in orjson.loads(answer)["outputs"])


async def test_bad_np_bodies_get_the_general_paths_400(gw: V2Gateway, taken: list[bool]) -> None:
    X = rows_of(2)
    cases = [
        ({"inputs": [{**np_body(X)["inputs"][0], "data": [1.0] * 7}]}, "shape [2, 4] needs 8 elements, got 7"),
        ({"inputs": [{**np_body(X)["inputs"][0], "shape": [2, 3], "data": [1.0] * 6}]}, "np layout needs shape [N, 4]"),
        (np_body(np.full((1, 4), 1e39)), "out of range"),
        (np_body(np.full((1, 4), 300.0), "INT8"), "out of range"),
        (np_body(np.full((1, 4), -1.0), "UINT8"), "out of range"),
        ({"inputs": [{**np_body(X)["inputs"][0], "datatype": "INT32"}]}, "INT32 data must be"),
        ({"inputs": [{**np_body(X)["inputs"][0], "datatype": "FP33"}]}, "unknown datatype"),
        ({"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "BOOL", "data": [1, 0, 1, 1]}]}, "BOOL data"),
        ({"inputs": [{**np_body(X)["inputs"][0], "data": [[1.0, 2.0], [3.0]]}]}, "ragged"),
        (np_body(X, parameters={"content_type": "table"}), "content_type"),
        (np_body(X, id=[1]), "id: expected a string"),
    ]
    for body, message in cases:
        status, answer, content_type, _ = await both(gw, "np.lgb.1", body)
        assert status == 400 and content_type == "application/json", (body, answer)
        assert message in orjson.loads(answer)["error"], (message, answer)
        assert taken[-2:] == [False, False], body
