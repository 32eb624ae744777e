"""The hand-assembled protobuf bytes parse to exactly what the protobuf API builds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs.ff_protobuf import inference_request_bytes, prediction_bytes, varint
from forestflow.codecs.schema_datum import TENSOR_KEY, type_groups
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract

# The oracle: the same messages built field by field through the protobuf API.
def _fill_proto_datums(frame: Frame, schema: Any, datums: Any) -> None:
    groups = type_groups(frame)
    n = frame.num_rows
    for ff_type, names in groups:
        entry = schema.add()
        entry.type = pb.TensorType.Value(ff_type)
        entry.fields.extend(names)
    out = [datums.add() for _ in range(n)]
    for ff_type, names in groups:
        key = TENSOR_KEY[ff_type]
        tensors = [getattr(d.tensors.add(), key) for d in out]
        for name in names:
            col = frame.columns[name]
            flat = col.reshape(n, -1).tolist() if col.ndim > 1 else [[v] for v in col.tolist()]
            for tensor, vals in zip(tensors, flat):
                if ff_type in ("Float32", "Float16", "Float64"):
                    vals = [float(v) for v in vals]
                elif ff_type not in ("String", "Bytes", "Bool"):
                    vals = [int(v) for v in vals]
                tensor.data.extend(vals)


def prediction_to_proto(fqrv: FQRV, frame: Frame) -> pb.Prediction:
    """A Prediction built through the protobuf API."""
    message = pb.Prediction()
    message.fqrv.contract.organization = fqrv.contract.organization
    message.fqrv.contract.project = fqrv.contract.project
    message.fqrv.contract.contract_number = fqrv.contract.number
    message.fqrv.release_version = fqrv.release
    _fill_proto_datums(frame, message.schema, message.datum)
    return message


def request_to_proto(frame: Frame, configs: dict[str, str]) -> pb.InferenceRequest:
    """An InferenceRequest built through the protobuf API."""
    message = pb.InferenceRequest()
    _fill_proto_datums(frame, message.schema, message.datum)
    message.configs.update(configs)
    return message


FQ = FQRV(Contract("org", "proj", 300), "release-1.2")
RNG = np.random.default_rng(7)


def frames() -> list[Frame]:
    n = 5
    return [
        Frame.from_columns({"x": [1.5]}),
        Frame.from_columns(
            {
                "label": np.array(["a", "é", "", "long" * 40, "z"], dtype=object),
                "f64": RNG.normal(size=n),
                "f32": RNG.normal(size=n).astype(np.float32),
                "f16": RNG.normal(size=n).astype(np.float16),
                "i8": np.array([-128, 0, 1, 127, -1], dtype=np.int8),
                "i64": np.array([-(2**62), 0, 2**40, 7, -1], dtype=np.int64),
                "u32": np.array([0, 1, 2**31, 5, 9], dtype=np.uint32),
                "flag": np.array([True, False, True, True, False]),
                "blob": np.array([b"\x00\x01", b"", b"x", b"yz", b"\xff"], dtype=object),
                "vec": RNG.normal(size=(n, 3)),
                "nan": np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]),
            }
        ),
    ]


@pytest.mark.parametrize("frame", frames(), ids=["one", "every-type"])
def test_inference_request_matches_protobuf_api(frame: Frame) -> None:
    configs = {"reqid": "r-1", "user": "ü"}
    fast = pb.InferenceRequest.FromString(inference_request_bytes(frame, configs))
    assert fast == request_to_proto(frame, configs)


@pytest.mark.parametrize("frame", frames(), ids=["one", "every-type"])
def test_prediction_matches_protobuf_api(frame: Frame) -> None:
    fast = pb.Prediction.FromString(prediction_bytes(FQ, frame))
    assert fast == prediction_to_proto(FQ, frame)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**31)])
def test_varint_matches_protobuf(value: int) -> None:
    message = pb.Int64Data()
    message.data.append(value)
    assert message.SerializeToString() == b"\x08" + varint(value)
