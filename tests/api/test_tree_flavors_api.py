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
