"""The GraphPipe codec on its own: config parsing, tensor -> column mapping, response building."""

from __future__ import annotations

import numpy as np
import pytest
from graphpipe import convert

from forestflow._proto.graphpipe import InferResponse, MetadataResponse
from forestflow._proto.graphpipe.Type import Type
from forestflow.codecs.graphpipe import (
    GPInferRequest,
    GPMetadataRequest,
    encode_errors,
    encode_infer_response,
    encode_metadata,
    frame_from_request,
    parse_config,
    parse_request,
)
from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import InvalidInput
from forestflow.runtime.base import ServableMetadata
from tests.api_gp.helpers import raw_tensor_request

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

MIXED = (
    TensorSpec("age", "FP64"),
    TensorSpec("race", "BYTES", domain=("0", "1")),
    TensorSpec("count", "INT32"),
    TensorSpec("city", "BYTES"),
    TensorSpec("offset", "FP64"),
)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("", {}),
        ("reqid:1,user:bob", {"reqid": "1", "user": "bob"}),
        (" reqid : 1 , junk,,:novalue-key, time:12:30 ", {"reqid": "1", "time": "12:30"}),
        ("a:", {"a": ""}),
        ("a:1,a:2", {"a": "2"}),
    ],
)
def test_config_is_parsed_like_forestflow_and_junk_is_skipped(config: str, expected: dict[str, str]) -> None:
    assert parse_config(config) == expected


def test_request_round_trip_through_the_official_serializer() -> None:
    body = convert.serialize_infer_request(
        convert.InferReq("k:v", [np.arange(6, dtype=np.int16).reshape(3, 2), np.array(["x", "ü"])], ["a", "b"], ["out"])
    )
    parsed = parse_request(bytes(body))
    assert isinstance(parsed, GPInferRequest)
    assert (parsed.config, parsed.input_names, parsed.output_names) == ("k:v", ["a", "b"], ["out"])
    assert parsed.tensors[0].dtype == np.int16 and parsed.tensors[0].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert parsed.tensors[1].tolist() == ["x", "ü"]
    assert isinstance(parse_request(bytes(convert.serialize_metadata_request())), GPMetadataRequest)


def test_grouping_fills_inputs_in_metadata_order_and_casts_only_safely() -> None:
    request = GPInferRequest(
        tensors=[np.array([["0", "paris"], ["1", "oslo"]], dtype=object), np.array([[30, 2], [40, 3]], dtype=np.uint8)]
    )
    frame = frame_from_request(request, MIXED)
    assert list(frame.columns) == ["age", "race", "count", "city"]  # metadata order; the offset left out
    assert frame["age"].dtype == np.float64 and frame["age"].tolist() == [30.0, 40.0]
    assert frame["count"].dtype == np.int32 and frame["count"].tolist() == [2, 3]
    assert frame["city"].tolist() == ["paris", "oslo"]
    floats = GPInferRequest(tensors=[np.array([["0", "x"]], dtype=object), np.array([[1.5, 2.7]])])
    assert frame_from_request(floats, MIXED)["count"].dtype == np.float64  # FP64 -> INT32 would change 2.7


def test_named_tensors_squeeze_single_value_rows_and_keep_vectors() -> None:
    specs = (TensorSpec("x", "FP32"), TensorSpec("v", "FP32", (-1, 3)))
    request = GPInferRequest(input_names=["v", "x"], tensors=[np.ones((2, 3), np.float32), np.ones((2, 1), np.float32)])
    frame = frame_from_request(request, specs)
    assert frame["x"].shape == (2,) and frame["v"].shape == (2, 3)
    assert list(frame.columns) == ["x", "v"]


def test_minus_one_in_a_shape_is_resolved() -> None:
    body = raw_tensor_request([(Type.Float64, [-1, 2], np.arange(6.0).tobytes(), None)], ["x"])
    parsed = parse_request(body)
    assert isinstance(parsed, GPInferRequest) and parsed.tensors[0].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(InvalidInput, match=r"shape \[-1, 4\]: cannot hold 6 values"):
        parse_request(raw_tensor_request([(Type.Float64, [-1, 4], np.arange(6.0).tobytes(), None)], ["x"]))
    with pytest.raises(InvalidInput, match="model declares no inputs"):
        frame_from_request(GPInferRequest(tensors=[np.ones((2, 1))]), ())


def test_responses_parse_with_the_official_reader() -> None:
    fqrv = FQRV.parse("acme.demo.1.v1")
    frame = Frame({"p": np.array([0.25, 0.75]), "label": np.array(["no", None], dtype=object)})
    outputs, errors = convert.deserialize_infer_response(encode_infer_response(fqrv, frame, ["label"]))
    assert errors == [] and [o.tolist() for o in outputs] == [[[b"no"], [b""]]]
    outputs, _ = convert.deserialize_infer_response(encode_infer_response(fqrv, frame, ["label", "fqrv", "p"]))
    assert [o.tolist() for o in outputs] == [[[b"no"], [b""]], [[b"acme.demo.1.v1"]], [[0.25], [0.75]]]
    outputs, _ = convert.deserialize_infer_response(encode_infer_response(fqrv, frame))
    assert [o.tolist() for o in outputs] == [[[b"acme.demo.1.v1"]], [[0.25], [0.75]], [[b"no"], [b""]]]
    with pytest.raises(InvalidInput, match="duplicate names"):
        encode_infer_response(fqrv, frame, ["p", "p"])
    outputs, errors = convert.deserialize_infer_response(encode_errors([(422, "nope"), (400, "twice")]))
    assert outputs == [] and errors == [{"code": 422, "message": b"nope"}, {"code": 400, "message": b"twice"}]
    with pytest.raises(InvalidInput, match="has no GraphPipe type"):
        encode_infer_response(fqrv, Frame({"t": np.array(["2020-01-01"], dtype="datetime64[D]")}))


def test_responses_of_every_type_parse_with_the_official_reader_and_keep_data_aligned() -> None:
    n = 5
    rng = np.random.default_rng(5)
    columns = {
        "f64": rng.normal(size=n),
        "f32": rng.normal(size=n).astype(np.float32),
        "f16": rng.normal(size=n).astype(np.float16),
        "i8": np.array([-128, 0, 1, 127, -1], dtype=np.int8),
        "i16": np.arange(n, dtype=np.int16) - 3,
        "i32": np.arange(n, dtype=np.int32) * -7,
        "i64": np.array([-(2**62), 0, 2**40, 7, -1], dtype=np.int64),
        "u8": np.arange(n, dtype=np.uint8),
        "u16": np.arange(n, dtype=np.uint16) * 300,
        "u32": np.arange(n, dtype=np.uint32) * 2**30,
        "u64": np.arange(n, dtype=np.uint64) * 2**62,
        "flag": np.array([True, False, True, True, False]),
        "text": np.array(["a", "é", "", "long" * 80, None], dtype=object),
        "blob": np.array([b"\x00\x01", b"", b"x", b"yz", b"\xff"], dtype=object),
        "vec": rng.normal(size=(n, 3)),
    }
    fqrv = FQRV.parse("acme.demo.1.v1")
    body = encode_infer_response(fqrv, Frame(columns))
    outputs, errors = convert.deserialize_infer_response(body)
    assert errors == [] and outputs[0].tolist() == [[b"acme.demo.1.v1"]]
    for (name, column), got in zip(columns.items(), outputs[1:]):
        if column.dtype == object:
            want = [[b"" if v is None else v if isinstance(v, bytes) else v.encode()] for v in column]
            assert got.tolist() == want, name
        else:
            want = column.astype(np.uint8) if column.dtype == np.bool_ else column
            assert got.dtype == want.dtype.newbyteorder("<") and got.shape == (want.reshape(n, -1).shape), name
            np.testing.assert_array_equal(got, want.reshape(n, -1), err_msg=name)
    # Readers may view numeric data and shapes in place: both vectors start 8-aligned.
    response = InferResponse.InferResponse.GetRootAs(body, 0)
    for i in range(response.OutputTensorsLength()):
        tab = response.OutputTensors(i)._tab
        for slot in (6, 8):  # shape, data
            if tab.Offset(slot):
                assert tab.Vector(tab.Offset(slot)) % 8 == 0


def test_metadata_lists_inputs_and_the_response_tensors() -> None:
    meta = ServableMetadata("m", "python", MIXED[:2], (TensorSpec("flag", "BOOL"),), "desc")
    parsed = MetadataResponse.MetadataResponse.GetRootAs(encode_metadata(FQRV.parse("a.b.2.r"), meta), 0)
    assert (parsed.Name(), parsed.Version(), parsed.Server(), parsed.Description()) == (b"m", b"a.b.2.r", b"forestflow", b"desc")
    inputs = [(parsed.Inputs(i).Name(), parsed.Inputs(i).Type(), parsed.Inputs(i).Description()) for i in range(2)]
    assert inputs == [(b"age", 11, b""), (b"race", 12, b"levels: [0,1]")]
    outputs = [(parsed.Outputs(i).Name(), parsed.Outputs(i).Type(), parsed.Outputs(i).ShapeAsNumpy().tolist()) for i in range(2)]
    assert outputs == [(b"fqrv", 12, [1, 1]), (b"flag", 1, [-1, 1])]
