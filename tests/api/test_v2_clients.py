"""The real clients (tritonclient HTTP+gRPC, kserve REST V1/V2 + gRPC) against a running gateway."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.api.v2_support import ensure_client_python, run_families, v2_gateway
from tests.support import H2O_DIR, prediction_columns, python_servable

MODEL = "acme.demo.1"
X = [1.5, 2.0, -3.25]
LABELS = ["a", "b", "ünï"]
JOB_COLUMNS = [
    {"name": "x", "datatype": "FP64", "values": X},
    {"name": "label", "datatype": "BYTES", "values": LABELS},
]


@pytest.fixture(scope="module")
def client_python() -> Path:
    """The interpreter of the venv holding tritonclient and kserve."""
    return ensure_client_python()


def check_outputs(seen: dict[str, Any], names: tuple[str, ...] = ("double", "echo")) -> None:
    outputs = seen["outputs"]
    assert tuple(outputs) == names
    assert outputs["double"]["values"] == [2 * x for x in X]
    assert outputs["double"]["shape"] == [3]
    if "echo" in names:
        assert outputs["echo"]["values"] == LABELS


async def test_real_clients_against_the_echo_servable(tmp_path: Path, client_python: Path) -> None:
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(python_servable())
        job = {
            "http": gw.hostport,
            "grpc": gw.grpc_target,
            "model": MODEL,
            "version": "v1",
            "columns": JOB_COLUMNS,
            "outputs": ["double", "echo"],
            "bad_input": "x",
        }
        triton, kserve = await run_families(client_python, job, "triton", "kserve")

    # The gateway's private-pool classes load beside each client's own inference.* ones, wire-identical.
    for seen in (triton["private_pool"], kserve["private_pool"]):
        assert seen == {"round_trip": True, "name": "a", "shape": [2, 1], "param": 3}
    for family, not_found, invalid in (("http", "404", "400"), ("grpc", "StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT")):
        seen = triton[family]
        assert (seen["live"], seen["ready"], seen["model_ready"], seen["version_ready"]) == (True, True, True, True)
        assert seen["unknown_ready"] is False
        assert seen["server_metadata"]["name"] == "forestflow"
        meta = seen["model_metadata"]
        assert meta["name"] == MODEL and meta["versions"] == ["v1"]
        assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("x", "FP64"), ("label", "BYTES")]
        check_outputs(seen["infer"])
        assert seen["infer"]["id"] == "req-1" and seen["infer"]["model_version"] == "v1"
        check_outputs(seen["infer_version"])
        assert seen["unknown_model"]["status"] == not_found and "no.such.1" in seen["unknown_model"]["message"]
        assert seen["bad_shape"]["status"] == invalid and "'x'" in seen["bad_shape"]["message"]
        check_outputs(seen["after_errors"])
    check_outputs(triton["http"]["infer_json"], ("double",))
    check_outputs(triton["http"]["infer_gzip"])
    check_outputs(triton["grpc"]["infer_subset"], ("double",))

    rest = kserve["rest_v2"]
    assert (rest["live"], rest["ready"], rest["model_ready"]) == (True, True, True)
    for key in ("infer_json", "infer_binary", "after_errors"):
        check_outputs(rest[key])
        assert rest[key]["id"] == "req-k" and rest[key]["model_name"] == MODEL
    assert rest["unknown_model"]["status"] == 404 and "no.such.1" in rest["unknown_model"]["message"]
    assert rest["bad_shape"]["status"] == 400 and "'x'" in rest["bad_shape"]["message"]

    v1 = kserve["rest_v1"]
    assert v1["live"] is True and v1["model_ready"] is True
    expected = [{"double": 2 * x, "echo": lab} for x, lab in zip(X, LABELS)]
    assert v1["predict_objects"] == {"predictions": expected}
    assert v1["predict_lists"] == {"predictions": expected}
    assert v1["unknown_model"]["status"] == 404

    grpc = kserve["grpc"]
    assert (grpc["live"], grpc["ready"], grpc["model_ready"]) == (True, True, True)
    check_outputs(grpc["infer"])
    check_outputs(grpc["after_errors"])
    assert grpc["unknown_model"]["status"] == "StatusCode.NOT_FOUND"
    assert grpc["bad_shape"]["status"] == "StatusCode.INVALID_ARGUMENT" and "'x'" in grpc["bad_shape"]["message"]


# ---- one real H2O model: the same rows through /score, raw V2 layouts and every client ---------------
H2O_MOJO = "prostate_gbm_binomial"
H2O_MODEL = "h2o.prostate.1"
FEATURES = ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"]  # the MOJO's input order
CATEGORICAL = {"RACE", "DPROS", "DCAPS"}


def h2o_rows(count: int = 8) -> list[dict[str, str]]:
    with open(H2O_DIR / f"{H2O_MOJO}.golden.csv", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row["kind"] == "data"][:count]


def score_predictions(body: dict[str, Any]) -> dict[str, list[Any]]:
    """Columns of a BASIC /score answer: schema entries name the fields of each datum's tensors."""
    return prediction_columns(body["Prediction"])


def seen_columns(seen: dict[str, Any]) -> dict[str, list[Any]]:
    return {name: out["values"] for name, out in seen["outputs"].items()}


@pytest.mark.skipif(importlib.util.find_spec("h2o") is None, reason="the h2o wheel (genmodel jar) is not installed")
async def test_h2o_scores_agree_across_score_v2_layouts_and_clients(tmp_path: Path, client_python: Path) -> None:
    rows = h2o_rows()
    n = len(rows)
    numbers = {f: [float(r[f]) for r in rows] for f in FEATURES}
    body = {
        "path": H2O_DIR.as_uri(),
        "fqrv": {"contract": {"organization": "h2o", "project": "prostate", "contract_number": 1}, "release_version": H2O_MOJO},
        "flavor": {"H2OMojo": {"mojoPath": f"{H2O_MOJO}.zip"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }
    score = {
        "schema": [
            {"type": "String", "fields": sorted(CATEGORICAL)},
            {"type": "Float64", "fields": [f for f in FEATURES if f not in CATEGORICAL]},
        ],
        "datum": [
            {
                "tensors": [
                    {"String": {"data": [r[c] for c in sorted(CATEGORICAL)]}},
                    {"Float64": {"data": [float(r[f]) for f in FEATURES if f not in CATEGORICAL]}},
                ]
            }
            for r in rows
        ],
    }

    def pd_input(f: str, shape: list[int]) -> dict[str, Any]:
        if f in CATEGORICAL:
            return {"name": f, "shape": shape, "datatype": "BYTES", "data": [r[f] for r in rows]}
        return {"name": f, "shape": shape, "datatype": "FP64", "data": numbers[f]}

    layouts = {
        "np": {
            "inputs": [
                {
                    "name": "predict",
                    "shape": [n, len(FEATURES)],
                    "datatype": "FP64",
                    "data": [[numbers[f][i] for f in FEATURES] for i in range(n)],
                }
            ]
        },
        "mlserver pd": {"parameters": {"content_type": "pd"}, "inputs": [pd_input(f, [n, 1]) for f in FEATURES]},
        "trustyai pd": {"inputs": [pd_input(f, [1, n]) for f in FEATURES]},
    }
    job = {
        "model": H2O_MODEL,
        "version": H2O_MOJO,
        "outputs": ["1", "predict", "0"],
        "bad_input": "AGE",
        "columns": [
            {
                "name": f,
                "datatype": "BYTES" if f in CATEGORICAL else "FP64",
                "values": [r[f] for r in rows] if f in CATEGORICAL else numbers[f],
            }
            for f in FEATURES
        ],
    }
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(body)
        status, reply, _ = await gw.post_json("/h2o/prostate/1/score", score)
        assert status == 200, reply
        expected = score_predictions(reply)
        assert expected["predict"] == [r["out:predict"] for r in rows]
        by_layout = {}
        for name, payload in layouts.items():
            status, reply, _ = await gw.post_json(f"/v2/models/{H2O_MODEL}/infer", payload)
            assert status == 200, (name, reply)
            by_layout[name] = {o["name"]: o["data"] for o in reply["outputs"]}
        job |= {"http": gw.hostport, "grpc": gw.grpc_target}
        triton, kserve = await run_families(client_python, job, "triton", "kserve")

    want = {k: expected[k] for k in ("predict", "0", "1")}
    for name, got in by_layout.items():
        assert got == want, name
    for seen in (
        triton["http"]["infer"],
        triton["grpc"]["infer"],
        triton["grpc"]["after_errors"],
        kserve["rest_v2"]["infer_json"],
        kserve["rest_v2"]["infer_binary"],
        kserve["grpc"]["infer"],
    ):
        assert seen_columns(seen) == want
    assert seen_columns(triton["http"]["infer_json"]) == {"1": want["1"]}
    assert triton["http"]["bad_shape"]["status"] == "400" and "'AGE'" in triton["http"]["bad_shape"]["message"]
    assert (
        kserve["rest_v1"]["predict_lists"]
        == kserve["rest_v1"]["predict_objects"]
        == {"predictions": [{"predict": p, "0": a, "1": b} for p, a, b in zip(want["predict"], want["0"], want["1"])]}
    )
