"""GraphPipe against real H2O MOJOs: the official client gets what /score gives and the golden file holds."""

from __future__ import annotations

import csv
import importlib.util
from typing import Any

import numpy as np
import pytest
from graphpipe import remote

from tests.api_gp.helpers import client, deploy, execute_multi, score_column, score_rows
from tests.support import H2O_DIR, InProcessGateway

pytestmark = [
    pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning"),
    pytest.mark.skipif(importlib.util.find_spec("h2o") is None, reason="the h2o wheel (genmodel jar) is not installed"),
]

NUMERIC = ["AGE", "PSA", "VOL", "GLEASON"]
CATEGORICAL = ["RACE", "DPROS", "DCAPS"]


def h2o_servable(mojo: str) -> dict[str, Any]:
    return {
        "path": H2O_DIR.as_uri(),
        "fqrv": {"contract": {"organization": "h2o", "project": "prostate", "contract_number": 1}, "release_version": mojo},
        "flavor": {"H2OMojo": {"mojoPath": f"{mojo}.zip"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def golden_rows(mojo: str, count: int = 12) -> list[dict[str, str]]:
    with open(H2O_DIR / f"{mojo}.golden.csv", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row["kind"] == "data"][:count]


def score_body(rows: list[dict[str, str]], numeric: list[str]) -> dict[str, Any]:
    return {
        "schema": [{"type": "String", "fields": CATEGORICAL}, {"type": "Float64", "fields": numeric}],
        "datum": [
            {
                "tensors": [
                    {"String": {"data": [r[c] for c in CATEGORICAL]}},
                    {"Float64": {"data": [float(r[n]) for n in numeric]}},
                ]
            }
            for r in rows
        ],
    }


async def test_binomial_gbm_by_grouping_and_by_name(gw: InProcessGateway) -> None:
    mojo = "prostate_gbm_binomial"
    await deploy(gw, h2o_servable(mojo))
    uri = gw.url + "/h2o/prostate/1/gp"
    names = await client(remote.get_input_names, uri)
    assert names == ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"]
    assert await client(remote.get_output_names, uri) == ["fqrv", "predict", "0", "1"]
    rows = golden_rows(mojo)
    prediction = await score_rows(gw, score_body(rows, NUMERIC), "/h2o/prostate/1/score")

    # ForestFlow's layout: one String tensor (categoricals in model order), one numeric tensor (numerics in model order).
    categorical = np.array([[r[c] for c in CATEGORICAL] for r in rows])
    numeric = np.array([[float(r[n]) for n in NUMERIC] for r in rows], dtype=np.float32)
    fqrv, label, p0, p1 = await execute_multi(uri, [categorical, numeric], None)
    assert fqrv[0, 0] == f"h2o.prostate.1.{mojo}".encode()
    assert [v.decode() for v in label[:, 0]] == score_column(prediction, "predict") == [r["out:predict"] for r in rows]
    np.testing.assert_allclose(p1[:, 0], score_column(prediction, "1"), rtol=1e-6)  # float32 inputs: near, not equal
    np.testing.assert_allclose(p0[:, 0], [float(r["out:0"]) for r in rows], rtol=1e-5)

    # By name, float64 numbers: the same values as /score exactly.
    inputs = [np.array([float(r[n]) for r in rows]) for n in NUMERIC] + [np.array([r[c] for r in rows]) for c in CATEGORICAL]
    label, p1 = await execute_multi(uri, inputs, NUMERIC + CATEGORICAL, ["predict", "1"], config="reqid:h2o")
    assert [v.decode() for v in label[:, 0]] == score_column(prediction, "predict")
    assert p1[:, 0].tolist() == score_column(prediction, "1")


async def test_regression_drf_matches_score(gw: InProcessGateway) -> None:
    mojo = "prostate_drf_regression"
    await deploy(gw, h2o_servable(mojo))
    uri = gw.url + "/h2o/prostate/1/gp"
    numeric = ["AGE", "PSA", "GLEASON"]
    rows = golden_rows(mojo)
    prediction = await score_rows(gw, score_body(rows, numeric), "/h2o/prostate/1/score")
    categorical = np.array([[r[c] for c in CATEGORICAL] for r in rows])
    values = np.array([[float(r[n]) for n in numeric] for r in rows])
    _, predict = await execute_multi(uri, [values, categorical], None)
    assert predict.shape == (len(rows), 1)
    assert predict[:, 0].tolist() == score_column(prediction, "predict")
    np.testing.assert_allclose(predict[:, 0], [float(r["out:predict"]) for r in rows], rtol=1e-9)
