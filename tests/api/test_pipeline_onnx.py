"""An ONNX model as a pipeline step: map -> onnx (scikit-learn random forest) -> classifier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.onnx_models import FEATURES, multiclass
from tests.pipeline_support import pipeline_dir, port, servable_request, toml
from tests.support import InProcessGateway


async def test_map_onnx_classifier_pipeline_equals_scikit_learn(gw: InProcessGateway, tmp_path: Path) -> None:
    directory = tmp_path / "iris-pipeline"
    directory.mkdir()
    case = multiclass(directory)
    steps = [
        {  # the request's FP64 [N, 4] "measurements" -> the model's FP32 [N, 4] "input"
            "name": "prepare",
            "platform": "map",
            "rename": {"input": "measurements"},
            "inputs": [port("measurements", "FP64", shape=[-1, 4])],
            "outputs": [port("input", "FP32", "x", shape=[-1, 4])],
        },
        {
            "name": "forest",
            "platform": "onnx",
            "id": case.file,
            "inputs": [port("input", "FP32", "x", shape=[-1, 4])],
            "outputs": [port(c, "FP64", f"p_{c}") for c in case.classes],
        },
        {
            "name": "classify",
            "platform": "classifier",
            "labels": case.classes,
            "top_k": 2,
            "inputs": [port(f"p_{c}", "FP64", f"p_{c}") for c in case.classes],
            "outputs": [
                port("label", "BYTES"),
                port("probabilities", "FP64", shape=[-1, 3]),
                port("top_labels", "BYTES", shape=[-1, -1]),
            ],
        },
    ]
    pipeline_dir(directory, toml(steps))
    async with gw.session.post(gw.url + "/servable", json=servable_request(directory, contract=("pipe", "iris", 1))) as r:
        assert r.status == 200, await r.text()
    matrix = case.matrix(FEATURES)
    inputs = [{"name": "measurements", "shape": [case.rows, 4], "datatype": "FP64", "data": matrix.ravel().tolist()}]
    async with gw.session.post(gw.url + "/v2/models/pipe.iris.1/infer", json={"inputs": inputs}) as r:
        body = await r.json()
        assert r.status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    probabilities = np.array(outputs["probabilities"]["data"]).reshape(case.rows, 3)
    expected = np.column_stack([case.expected[c] for c in case.classes])
    assert probabilities == pytest.approx(expected, abs=1e-5)
    assert outputs["label"]["data"] == case.expected["output_label"]
    top = np.array(outputs["top_labels"]["data"], dtype=object).reshape(case.rows, 2)
    order = np.argsort(-expected, axis=1, kind="stable")[:, :2]
    assert top.tolist() == [[case.classes[i] for i in row] for row in order]
