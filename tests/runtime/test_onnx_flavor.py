"""OnnxServable on models built here: settings, input mapping and coercion, outputs, load failures.

The scikit-learn models come from tests/onnx_models.py (skl2onnx); the small graphs that test
element types, fixed batch sizes and odd outputs are written node by node with ``onnx.helper``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput, PredictionFailed, ServableNotReady
from forestflow.runtime.flavors import create_servable
from forestflow.runtime.onnx_flavor import OnnxServable
from tests import onnx_models

FQ = FQRV(Contract("tests", "onnx", 1), "r1")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scikit-learn case by name, and their directory under "dir"."""
    directory = tmp_path_factory.mktemp("onnx")
    cases: dict[str, Any] = {case.name: case for case in (build(directory) for build in onnx_models.CASES)}
    return cases | {"dir": directory}


def servable(directory: Path, **settings: Any) -> OnnxServable:
    s = create_servable("ONNX", FQ, directory, settings)
    assert isinstance(s, OnnxServable)
    s.load()
    return s


def save(directory: Path, name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 13) -> str:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    (directory / f"{name}.onnx").write_bytes(model.SerializeToString())
    return f"{name}.onnx"


@pytest.fixture(scope="module")
def typed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Identity-like outputs for an INT64, a BOOL, a STRING and a DOUBLE ['batch', 2] input."""
    directory = tmp_path_factory.mktemp("typed")
    save(
        directory,
        "typed",
        [
            helper.make_node("Identity", ["i"], ["i_out"]),
            helper.make_node("Not", ["b"], ["b_out"]),
            helper.make_node("Identity", ["s"], ["s_out"]),
            helper.make_node("Identity", ["d"], ["d_out"]),
        ],
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, ["N"]),
            helper.make_tensor_value_info("s", TensorProto.STRING, ["N"]),
            helper.make_tensor_value_info("d", TensorProto.DOUBLE, ["batch", 2]),
        ],
        [
            helper.make_tensor_value_info("i_out", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("b_out", TensorProto.BOOL, ["N"]),
            helper.make_tensor_value_info("s_out", TensorProto.STRING, ["N"]),
            helper.make_tensor_value_info("d_out", TensorProto.DOUBLE, ["batch", 2]),
        ],
    )
    return directory


def typed_frame(**overrides: Any) -> Frame:
    columns: dict[str, Any] = {"i": [1, 2, 3], "b": [True, False, True], "s": ["a", "b", "ç"], "d": np.arange(6.0).reshape(3, 2)}
    return Frame.from_columns(columns | overrides)


# ---- settings and load failures -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({}, 'needs "modelPath"'),
        ({"modelPath": "nope.onnx"}, "not found"),
        ({"modelPath": "../x.onnx"}, "inside the servable directory"),
        ({"modelPath": "binary.onnx", "intraOpThread": 2}, "unknown setting(s) intraOpThread"),
        ({"modelPath": "binary.onnx", "intraOpThreads": -1}, "intraOpThreads: expected an integer >= 0"),
        (
            {"modelPath": "binary.onnx", "graphOptimizationLevel": "max"},
            "graphOptimizationLevel: expected one of disable, basic, extended, all",
        ),
        ({"modelPath": "binary.onnx", "allowSpinning": "yes"}, "allowSpinning: expected true or false"),
        ({"modelPath": "binary.onnx", "featureOrder": ["a", "b"]}, "2 feature name(s) for an input of 4 columns"),
        ({"modelPath": "binary.onnx", "featureOrder": {"Y": ["a"]}}, "'Y' is not a 2-D input of the model; its 2-D inputs: X"),
        ({"modelPath": "binary.onnx", "featureOrder": ["a", "a", "b", "c"]}, "feature names repeat"),
        ({"modelPath": "pipeline.onnx", "featureOrder": ["x1", "x2"]}, "the model has 2 (color, x)"),
        ({"modelPath": "binary.onnx", "inlineMaxRows": -1}, "inlineMaxRows: expected an integer >= 0"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(models: dict[str, Any], settings: dict[str, Any], reason: str) -> None:
    with pytest.raises(CreateServableRequestInvalidError) as caught:
        servable(models["dir"], **settings)
    assert reason in caught.value.message


def test_files_that_are_no_onnx_model_are_refused(tmp_path: Path, models: dict[str, Any]) -> None:
    good = (models["dir"] / "binary.onnx").read_bytes()
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xffnot a model" * 50)
    (tmp_path / "truncated.onnx").write_bytes(good[: len(good) // 2])
    for name in ("garbage.onnx", "truncated.onnx"):
        with pytest.raises(CreateServableRequestInvalidError, match=f"'{name}' is not a valid ONNX model"):
            servable(tmp_path, modelPath=name)
    # Parses, but onnxruntime refuses it (an operator that does not exist).
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("NoSuchOp", ["a"], ["b"])],
            "g",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N"])],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N"])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    (tmp_path / "unknown_op.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(CreateServableRequestInvalidError) as caught:
        servable(tmp_path, modelPath="unknown_op.onnx")
    assert caught.value.message.startswith("onnxruntime cannot load 'unknown_op.onnx': ") and "NoSuchOp" in caught.value.message
    assert str(tmp_path) not in caught.value.message  # no path of the artifact cache


def test_a_sequence_output_is_refused_at_load(tmp_path: Path) -> None:
    save(
        tmp_path,
        "seq",
        [helper.make_node("SequenceConstruct", ["a"], ["s"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
    )
    with pytest.raises(CreateServableRequestInvalidError, match="output 's' has type seq"):
        servable(tmp_path, modelPath="seq.onnx")


# ---- inputs -------------------------------------------------------------------------------------
def test_columns_are_coerced_to_each_input_type(typed_model: Path) -> None:
    s = servable(typed_model, modelPath="typed.onnx")
    meta = s.metadata()
    assert [(i.name, i.datatype, i.shape) for i in meta.inputs] == [
        ("i", "INT64", (-1,)),
        ("b", "BOOL", (-1,)),
        ("s", "BYTES", (-1,)),
        ("d", "FP64", (-1, 2)),
    ]
    assert meta.platform == "onnx_onnxv1" and meta.extra["warmedUp"] is True
    frame = typed_frame(
        i=[1.0, 2.0, -3.0],
        b=[1, 0, 1],
        s=np.array([b"x", "y", "z"], dtype=object),
        d=np.arange(6, dtype=np.float32).reshape(3, 2),
    )
    out = s.predict(frame)
    assert out["i_out"].tolist() == [1, 2, -3] and out["i_out"].dtype == np.int64
    assert out["b_out"].tolist() == [False, True, False]
    assert out["s_out"].tolist() == ["x", "y", "z"]
    assert out["d_out"].tolist() == [[0, 1], [2, 3], [4, 5]] and out["d_out"].dtype == np.float64
    numeric_text = s.predict(typed_frame(i=np.array(["4", "5", "6"], dtype=object)))
    assert numeric_text["i_out"].tolist() == [4, 5, 6]


@pytest.mark.parametrize(
    ("column", "values", "reason"),
    [
        ("i", [1.5, 2.0, 3.0], "input 'i' takes INT64: the values must be whole numbers"),
        ("i", [float("nan"), 2.0, 3.0], "must be whole numbers (no NaN)"),
        ("i", [2.0**70, 1.0, 1.0], "input 'i': a value is out of range for INT64"),
        ("i", ["one", "2", "3"], "input 'i': 'one' is not a number; the model takes INT64"),
        ("b", [0, 2, 1], "input 'b' takes BOOL: only true/false (or 0/1)"),
        ("s", [1.0, 2.0, 3.0], "input 's' takes strings (BYTES), got numbers (float64)"),
        ("s", np.array(["a", None, "c"], dtype=object), "input 's': element 1 is missing (null)"),
        ("s", np.array(["a", b"\xff", "c"], dtype=object), "input 's': element 1 is not UTF-8 text"),
        ("d", np.ones((3, 3)), "input 'd' takes FP64 [N, 2]; got shape [3, 3]"),
    ],
)
def test_what_cannot_be_coerced_is_a_400_naming_the_input(typed_model: Path, column: str, values: Any, reason: str) -> None:
    s = servable(typed_model, modelPath="typed.onnx")
    with pytest.raises(InvalidInput) as caught:
        s.predict(typed_frame(**{column: values}))
    assert reason in caught.value.message


def test_missing_inputs_are_listed_with_their_features(models: dict[str, Any]) -> None:
    s = servable(models["dir"], modelPath="pipeline.onnx", featureOrder={"x": ["x1", "x2"]})
    with pytest.raises(InvalidInput) as caught:
        s.predict(Frame.from_columns({"x1": [1.0]}))
    assert caught.value.message == (
        "missing input 'x' (FP32 [N, 2]): send it as one tensor, or every feature as a column; missing feature(s): x2"
    )
    with pytest.raises(InvalidInput) as caught:
        s.predict(Frame.from_columns({"colour": ["red"], "x": [[1.0, 2.0]]}))
    assert caught.value.message == "missing model input(s): 'color' (BYTES [N, 1])"
    with pytest.raises(InvalidInput, match="feature 'x1' of input 'x' takes one value per row, got shape \\[1, 2\\]"):
        s.predict(Frame.from_columns({"color": ["red"], "x1": [[1.0, 2.0]], "x2": [1.0]}))
    with pytest.raises(InvalidInput, match="input 'x' \\(feature 'x2'\\): 'abc' is not a number"):
        s.predict(Frame.from_columns({"color": ["red"], "x1": [1.0], "x2": ["abc"]}))


def test_features_from_the_metadata_prop_unused_columns_and_one_tensor(models: dict[str, Any]) -> None:
    case = models["binary"]
    s = servable(models["dir"], modelPath=case.file)
    assert s.metadata().inputs[0].description == "features: f0, f1, f2, f3"
    by_feature = s.predict(Frame.from_columns(case.columns | {"extra": list(range(case.rows))}))
    assert by_feature.parameters["unknown_inputs"] == ["extra"]
    as_tensor = s.predict(Frame.from_columns({"X": case.matrix(onnx_models.FEATURES)}))
    for name, column in by_feature.columns.items():
        assert column.tolist() == as_tensor[name].tolist()
    assert by_feature["output_label"].tolist() == case.expected["output_label"]
    # featureOrder overrides the metadata prop.
    swapped = servable(models["dir"], modelPath=case.file, featureOrder=["f1", "f0", "f2", "f3"])
    assert swapped.predict(Frame.from_columns(case.columns))["1"].tolist() != by_feature["1"].tolist()


def test_an_empty_batch_gets_empty_columns(models: dict[str, Any]) -> None:
    s = servable(models["dir"], modelPath="multiclass.onnx")
    out = s.predict(Frame.from_columns({f: np.empty(0) for f in onnx_models.FEATURES}))
    assert list(out.columns) == ["output_label", "setosa", "versicolor", "virginica"]
    assert all(len(c) == 0 for c in out.columns.values())


# ---- outputs and batches ------------------------------------------------------------------------
def test_zipmap_is_cut_off_and_each_class_is_a_column(models: dict[str, Any]) -> None:
    s = servable(models["dir"], modelPath="multiclass.onnx")
    assert s._session is not None
    session_outputs = [(o.name, o.type) for o in s._session.get_outputs()]
    assert session_outputs[0] == ("output_label", "tensor(string)") and session_outputs[1][1] == "tensor(float)"
    meta = s.metadata()
    assert [(o.name, o.datatype, o.domain) for o in meta.outputs] == [
        ("output_label", "BYTES", ("setosa", "versicolor", "virginica")),
        ("setosa", "FP64", None),
        ("versicolor", "FP64", None),
        ("virginica", "FP64", None),
    ]
    assert meta.extra["classes"] == {"output_probability": ["setosa", "versicolor", "virginica"]}
    out = s.predict(Frame.from_columns(models["multiclass"].columns))
    total = out["setosa"] + out["versicolor"] + out["virginica"]
    assert np.allclose(total, 1.0, atol=1e-6) and out["setosa"].dtype == np.float64


def test_a_model_exported_with_a_batch_of_one_scores_any_batch(tmp_path: Path) -> None:
    save(
        tmp_path,
        "one",
        [helper.make_node("Mul", ["a", "a"], ["sq"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("sq", TensorProto.FLOAT, [1, 2])],
    )
    s = servable(tmp_path, modelPath="one.onnx")
    assert s.metadata().inputs[0].shape == (1, 2) and s.metadata().extra["batchOfOne"] is True
    assert s.inline_max_rows == 0  # one call per row: never on the event loop
    out = s.predict(Frame.from_columns({"a": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}))
    assert out["sq"].tolist() == [[1, 4], [9, 16], [25, 36]]


def test_an_output_without_a_row_per_input_row_is_a_scoring_error(tmp_path: Path) -> None:
    save(
        tmp_path,
        "total",
        [helper.make_node("ReduceSum", ["a"], ["t"], keepdims=0)],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [])],
    )
    s = servable(tmp_path, modelPath="total.onnx")
    with pytest.raises(PredictionFailed, match="output 't' has no row per input row"):
        s.predict(Frame.from_columns({"a": np.ones((3, 2))}))


def test_a_model_that_refuses_the_dummy_batch_still_loads(tmp_path: Path) -> None:
    """An encoder that rejects unknown categories fails the warm-up ('' is no category): it loads all the same."""
    encoder = helper.make_node("OneHotEncoder", ["c"], ["hot"], domain="ai.onnx.ml", cats_strings=["a", "b"], zeros=0)
    save(
        tmp_path,
        "strict",
        [encoder],
        [helper.make_tensor_value_info("c", TensorProto.STRING, ["N", 1])],
        [helper.make_tensor_value_info("hot", TensorProto.FLOAT, ["N", 1, 2])],
    )
    s = servable(tmp_path, modelPath="strict.onnx")
    assert s.ready and s.metadata().extra["warmedUp"] is False
    assert s.inline_max_rows == 0  # not timed: it may fail on what it gets
    assert s.predict(Frame.from_columns({"c": ["b", "a"]}))["hot"].tolist() == [[[0, 1]], [[1, 0]]]
    with pytest.raises(InvalidInput) as caught:  # the model's own rule on the values: a 400, not a 500
        s.predict(Frame.from_columns({"c": ["zzz"]}))
    assert caught.value.message == (
        "the model refused the input: Non-zero status code returned while running OneHotEncoder node. "
        "Name:'' Status Message: Unknown Category and zeros = 0."
    )


def test_unload_drops_the_session(models: dict[str, Any]) -> None:
    s = servable(
        models["dir"],
        modelPath="regressor.onnx",
        featureOrder=onnx_models.FEATURES,
        intraOpThreads=2,
        graphOptimizationLevel="basic",
    )
    assert s.predict(Frame.from_columns(models["regressor"].columns))["variable"].shape == (models["regressor"].rows, 1)
    s.unload()
    assert not s.ready
    with pytest.raises(ServableNotReady):
        s.predict(Frame.from_columns(models["regressor"].columns))


def test_inline_max_rows_can_be_set(models: dict[str, Any]) -> None:
    for rows in (0, 5):
        s = servable(models["dir"], modelPath="binary.onnx", inlineMaxRows=rows)
        assert s.inline_max_rows == rows and s.metadata().extra["inlineMaxRows"] == rows
