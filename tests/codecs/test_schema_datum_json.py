"""The bytes-assembled Prediction / InferenceRequest JSON equals what per-row dicts give, and reads back."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import orjson
import pytest

from forestflow.codecs.schema_datum import (
    TENSOR_KEY,
    frame_from_json,
    one_name_per_value,
    prediction_json,
    request_json,
    type_groups,
)
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract

FQ = FQRV(Contract("org", "proj", 3), "r1")


def _value(ff_type: str, v: Any) -> Any:
    if ff_type == "Int64":
        return str(v)
    if ff_type == "Bytes":
        return base64.b64encode(v).decode()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def oracle_schema_datum(frame: Frame) -> tuple[list[Any], list[Any]]:
    """One dict per row and tensor, value by value: the straightforward construction."""
    groups = type_groups(frame)
    datum = []
    for r in range(frame.num_rows):
        tensors = []
        for ff_type, names in groups:
            values: list[Any] = []
            for name in names:
                cell = frame.columns[name][r]
                values += [
                    _value(ff_type, v)
                    for v in (cell.tolist() if isinstance(cell, np.ndarray) else [cell.item() if hasattr(cell, "item") else cell])
                ]
            tensors.append({TENSOR_KEY[ff_type]: {"data": values}})
        datum.append({"tensors": tensors})
    return [{"type": t, "fields": names} for t, names in groups], datum


FRAMES = {
    "binomial": Frame(
        {
            "predict": np.array(["yes", "no", "yes"], dtype=object),
            "no": np.array([0.25, 0.5, float("nan")]),
            "yes": np.array([0.75, 0.5, 1e-300]),
        }
    ),
    "every type and vectors": Frame(
        {
            "i64": np.array([2**62, -1], dtype=np.int64),
            "i32": np.array([7, -7], dtype=np.int32),
            "f32": np.array([1.5, -0.25], dtype=np.float32),
            "flag": np.array([True, False]),
            "blob": np.array([b"\x00\xff", b"ok"], dtype=object),
            "vec": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
            "text": np.array(['quote " and \\ and \u00e9', "x"], dtype=object),
        }
    ),
    "zero rows": Frame({"predict": np.array([], dtype=np.float64)}),
    "one row with vectors, bytes and int64": Frame(
        {
            "vec": np.array([[1.0, float("nan")]]),
            "blob": np.array([b"\x01"], dtype=object),
            "i64": np.array([[5, 6]], dtype=np.int64),
            "flag": np.array([True]),
        }
    ),
    "row boundaries inside values": Frame(
        {
            "a": np.array(['x"],["y', '"],["', "],["], dtype=object),
            "b": np.array(["\\", '\\"', "end"], dtype=object),
            "n": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64),
        }
    ),
    "a null among strings, a one-row frame": Frame({"s": np.array([None], dtype=object), "t": np.array(["k"], dtype=object)}),
    "nulls among strings": Frame({"s": np.array(["a", None, "c"], dtype=object)}),
    "empty vectors": Frame({"v": np.zeros((2, 0))}),
}


@pytest.mark.parametrize("name", FRAMES)
def test_prediction_json_equals_the_per_row_construction(name: str) -> None:
    frame = FRAMES[name]
    schema, datum = oracle_schema_datum(one_name_per_value(frame))  # a vector's values are fields v.0, v.1, ...
    expected = {
        "fqrv": {"contract": {"organization": "org", "project": "proj", "contractNumber": 3}, "releaseVersion": "r1"},
        "schema": schema,
        "datum": datum,
    }
    assert orjson.loads(prediction_json(FQ, frame)) == expected
    assert orjson.loads(prediction_json(FQ, frame, ["typo"])) == {**expected, "unknownInputs": ["typo"]}


@pytest.mark.parametrize("name", FRAMES)
def test_request_json_equals_the_per_row_construction(name: str) -> None:
    frame = FRAMES[name]
    schema, datum = oracle_schema_datum(frame)
    assert orjson.loads(request_json(frame, {"reqid": "7"})) == {"schema": schema, "datum": datum, "configs": {"reqid": "7"}}
    assert "configs" not in orjson.loads(request_json(frame, {}))


def test_a_prediction_names_each_value_of_a_vector_output() -> None:
    frame = Frame(
        {"label": np.array(["a", "b"], dtype=object), "top_labels": np.array([["a", "c", "b"], ["b", "a", "c"]], dtype=object)}
    )
    prediction = orjson.loads(prediction_json(FQ, frame))
    assert prediction["schema"] == [{"type": "String", "fields": ["label", "top_labels.0", "top_labels.1", "top_labels.2"]}]
    assert [d["tensors"][0]["String"]["data"] for d in prediction["datum"]] == [["a", "a", "c", "b"], ["b", "b", "a", "c"]]


def test_a_logged_request_parses_back_to_the_same_frame() -> None:
    frame = Frame(
        {
            "RACE": np.array(["1", "2"], dtype=object),
            "AGE": np.array([65.0, float("nan")]),
            "PSA": np.array([1.5, 2.5]),
        }
    )
    back, configs = frame_from_json(orjson.loads(request_json(frame, {"reqid": "a"})))
    assert configs == {"reqid": "a"}
    assert back.columns["RACE"].tolist() == ["1", "2"] and back.columns["PSA"].tolist() == [1.5, 2.5]
    assert back.columns["AGE"][0] == 65.0 and math.isnan(back.columns["AGE"][1])
