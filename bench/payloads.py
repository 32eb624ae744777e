"""Request bodies for the benchmarks: the same prostate rows as /score, V2 and GraphPipe payloads.

The ONNX cell scores the same bodies on a scikit-learn GBM of the H2O fixture's size, exported to
ONNX at run time (scikit-learn and skl2onnx come with the test extra).
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "h2o" / "prostate_gbm_binomial"
CATEGORICAL = ["RACE", "DPROS", "DCAPS"]
NUMERIC = ["AGE", "PSA", "VOL", "GLEASON"]


def rows(n: int) -> list[dict[str, str]]:
    """``n`` input rows taken (cyclically) from the fixture's golden file, missing values skipped."""
    with open(FIXTURE.with_suffix(".golden.csv")) as fh:
        data = [
            r for r in csv.DictReader(fh) if r["kind"] == "data" and all(r[c] not in ("", "NA") for c in CATEGORICAL + NUMERIC)
        ]
    return [data[i % len(data)] for i in range(n)]


def _number(text: str) -> float:
    return float(text)


def score_body(n: int, configs: dict[str, str] | None = None) -> bytes:
    """A ForestFlow InferenceRequest with ``n`` records."""
    body: dict[str, Any] = {
        "schema": [{"type": "String", "fields": CATEGORICAL}, {"type": "Float64", "fields": NUMERIC}],
        "datum": [
            {
                "tensors": [
                    {"String": {"data": [r[c] for c in CATEGORICAL]}},
                    {"Float64": {"data": [_number(r[c]) for c in NUMERIC]}},
                ]
            }
            for r in rows(n)
        ],
        "configs": configs or {"reqid": "bench"},
    }
    return orjson.dumps(body)


def v2_body(n: int) -> bytes:
    """A V2 inference request in the pd layout (one tensor per feature)."""
    data = rows(n)
    inputs = [{"name": c, "shape": [n], "datatype": "BYTES", "data": [r[c] for r in data]} for c in CATEGORICAL]
    inputs += [{"name": c, "shape": [n], "datatype": "FP64", "data": [_number(r[c]) for r in data]} for c in NUMERIC]
    return orjson.dumps({"inputs": inputs, "parameters": {"reqid": "bench"}})


def graphpipe_body(n: int) -> bytes | None:
    """A GraphPipe InferRequest (categorical strings + numeric floats) built by the official client."""
    try:
        import numpy as np
        from graphpipe import convert
    except ImportError:
        return None
    data = rows(n)
    strings = np.array([[r[c] for c in CATEGORICAL] for r in data], dtype=object)
    numbers = np.array([[_number(r[c]) for c in NUMERIC] for r in data], dtype=np.float64)
    request = convert.InferReq("reqid:bench", [strings, numbers], [], [])
    with warnings.catch_warnings():  # the client passes numElems to EndVector, which flatbuffers >= 2 deprecates
        warnings.filterwarnings("ignore", "numElems is deprecated", DeprecationWarning)
        return bytes(convert.serialize_infer_request(request))


def definition(contract: tuple[str, str, int], log_level: str) -> dict[str, Any]:
    """The BasicServeRequest deploying the binomial prostate GBM fixture."""
    org, project, n = contract
    return {
        "path": FIXTURE.parent.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "gbm"},
        "flavor": {"H2OMojo": {"mojoPath": FIXTURE.name + ".zip"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": log_level, "keyFeatures": ["reqid"] if log_level != "NONE" else []},
        },
    }


PIPELINE = ROOT / "servables" / "prostate-pipeline"


def pipeline_score_body(n: int) -> bytes:
    """The /score body of ``score_body`` with the example pipeline's lower-case column names."""
    body: dict[str, Any] = {
        "schema": [
            {"type": "String", "fields": [c.lower() for c in CATEGORICAL]},
            {"type": "Float64", "fields": [c.lower() for c in NUMERIC]},
        ],
        "datum": [
            {
                "tensors": [
                    {"String": {"data": [r[c] for c in CATEGORICAL]}},
                    {"Float64": {"data": [_number(r[c]) for c in NUMERIC]}},
                ]
            }
            for r in rows(n)
        ],
        "configs": {"reqid": "bench"},
    }
    return orjson.dumps(body)


def pipeline_definition(contract: tuple[str, str, int]) -> dict[str, Any]:
    """The BasicServeRequest deploying the example pipeline (map -> the same GBM -> classifier top-2)."""
    org, project, n = contract
    return {
        "path": PIPELINE.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "pipe"},
        "flavor": {"Pipeline": {"definition": "pipeline.toml"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE", "keyFeatures": []},
        },
    }


def onnx_model(directory: Path) -> str | None:
    """Export the ONNX twin of the H2O GBM into ``directory``; None without scikit-learn/skl2onnx."""
    try:
        from tests.onnx_models import prostate_gbm
    except ImportError:
        return None
    return prostate_gbm(directory, rows(200), CATEGORICAL, NUMERIC)


def onnx_definition(contract: tuple[str, str, int], directory: Path, model_file: str) -> dict[str, Any]:
    """The BasicServeRequest deploying the ONNX twin (no logging, like the H2O NONE cells)."""
    org, project, n = contract
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "gbm"},
        "flavor": {"ONNX": {"modelPath": model_file, "featureOrder": {"cat": CATEGORICAL, "num": NUMERIC}}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }
