"""The hand-assembled protobuf bytes parse to exactly what the protobuf API builds."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs.ff_protobuf import (
    inference_request_between,
    inference_request_bytes,
    prediction_bytes,
    read_varint,
    varint,
)
from forestflow.codecs.schema_datum import TENSOR_KEY, exact_columns, one_name_per_value, prediction_json, type_groups
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract


# The oracle: the same messages built field by field through the protobuf API.
def _fill_proto_datums(frame: Frame, schema: Any, datums: Any) -> None:
    frame = Frame(exact_columns(frame.columns), {})  # uint64 past Int64's range: its decimal text
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
    """A Prediction built through the protobuf API (one field name per value of a vector output)."""
    frame = one_name_per_value(frame)
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


class _Label(str):
    """A str subclass: stored apart from its object, unlike a plain str."""


def test_text_of_every_str_storage_matches_protobuf_api() -> None:
    # ASCII strs are read in place, the others through their UTF-8: 1-, 2- and 4-byte characters,
    # a str subclass, and a column mixing them, in a message over 16 rows (allocated buffers).
    labels = ["plain", "é", "ñandú", "日本", "🌲 forest", "", _Label("sub"), _Label("sübclass"), "x" * 300]
    frame = Frame.from_columns({"label": np.array(labels * 3, dtype=object), "n": np.arange(27, dtype=np.float64)})
    configs = {"reqid": "🌲"}
    assert pb.InferenceRequest.FromString(inference_request_bytes(frame, configs)) == request_to_proto(frame, configs)
    parsed = pb.Prediction.FromString(prediction_bytes(FQ, frame))
    assert parsed == prediction_to_proto(FQ, frame)
    assert list(parsed.datum[4].tensors[0].String.data) == ["🌲 forest"]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**31)])
def test_varint_matches_protobuf(value: int) -> None:
    message = pb.Int64Data()
    message.data.append(value)
    assert message.SerializeToString() == b"\x08" + varint(value)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, 2**64 - 1])
def test_read_varint_reads_what_varint_writes(value: int) -> None:
    data = b"\xff" + varint(value) + b"tail"
    assert read_varint(data, 1) == (value, len(data) - 4)
    assert read_varint(memoryview(data), 1) == (value, len(data) - 4)


@pytest.mark.parametrize(
    ("data", "pos"), [(b"", 0), (b"\x80", 0), (b"\x80\x80", 1), (b"\x01", 1), (b"\x01", -1), (b"\xff" * 11, 0)]
)
def test_read_varint_refuses_what_is_cut_short(data: bytes, pos: int) -> None:
    with pytest.raises(ValueError, match="no whole varint"):
        read_varint(data, pos)


# ---- the C writer (codecs/_ffwire.c) on every layout the frames of the gateway can take ------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from forestflow.codecs import _ffwire  # noqa: E402
from tests.tiers import examples  # noqa: E402

_NUMERIC = ["<f8", "<f4", "<f2", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "?", ">f8", ">i4", ">u2"]


def _numbers(dtype: np.dtype, size: int, draw: Any) -> np.ndarray:
    if dtype.kind == "f":
        values = draw(st.lists(st.floats(width=min(64, dtype.itemsize * 8), allow_nan=True), min_size=size, max_size=size))
    elif dtype.kind == "b":
        values = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    else:
        info = np.iinfo(dtype)
        values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size))
    return np.array(values, dtype=dtype)


@st.composite
def any_frame(draw: Any) -> Frame:
    rows = draw(st.integers(1, 5))
    columns: dict[str, np.ndarray] = {}
    for i in range(draw(st.integers(1, 6))):
        shape = draw(st.sampled_from(["flat", "vector", "strided", "reversed", "matrix-view"]))
        width = 2 if shape in ("vector", "matrix-view") else 1
        kind = draw(st.sampled_from(["str", "bytes", "unicode-fixed", "bytes-fixed", "number"]))
        size = rows * (3 if shape == "strided" else width)
        if kind == "str":
            col = np.array(draw(st.lists(st.text(max_size=8), min_size=size, max_size=size)) + [""], dtype=object)[:size]
        elif kind == "bytes":
            col = np.array(draw(st.lists(st.binary(max_size=8), min_size=size, max_size=size)) + [b""], dtype=object)[:size]
        elif kind == "unicode-fixed":
            col = np.array(
                draw(st.lists(st.text(alphabet="abcé", min_size=1, max_size=4), min_size=size, max_size=size)), dtype="U4"
            )
        elif kind == "bytes-fixed":
            col = np.array(
                draw(
                    st.lists(
                        st.binary(min_size=1, max_size=4).filter(lambda b: not b.endswith(b"\x00")), min_size=size, max_size=size
                    )
                ),
                dtype="S4",
            )
        else:
            col = _numbers(np.dtype(draw(st.sampled_from(_NUMERIC))), size, draw)
        if shape == "vector":
            col = col.reshape(rows, width)
        elif shape == "strided":
            col = col[::3]
        elif shape == "reversed":
            col = col[::-1]
        elif shape == "matrix-view":  # a 2-D view that is not C-contiguous: the slow path
            col = np.stack([col.reshape(rows, width)] * 2, axis=2)[:, :, 0]
        columns[f"c{i}"] = col
    return Frame(columns, {})


def _same(fast: bytes, oracle: Any) -> None:
    parsed = type(oracle).FromString(fast)
    assert parsed.SerializeToString(deterministic=True) == oracle.SerializeToString(deterministic=True)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_frame(), st.dictionaries(st.text(max_size=5), st.text(max_size=200), max_size=3))
def test_c_writer_matches_protobuf_api_on_any_layout(frame: Frame, configs: dict[str, str]) -> None:
    _same(inference_request_bytes(frame, configs), request_to_proto(frame, configs))
    _same(prediction_bytes(FQ, frame), prediction_to_proto(FQ, frame))


def test_a_frame_without_records_is_its_schema_alone() -> None:
    frame = Frame({"s": np.array([], dtype=object), "x": np.zeros((0, 3))}, {})
    _same(inference_request_bytes(frame, {}), request_to_proto(Frame({"s": frame.columns["s"], "x": np.zeros(0)}, {}), {}))
    assert list(pb.Prediction.FromString(prediction_bytes(FQ, frame)).datum) == []


def test_unsigned_64_bit_values_past_int64_go_out_as_their_digits() -> None:
    """No ForestFlow type holds 2^63 and above: written as Int64 they read back negative (-1 for
    2^64 - 1). Such a column is a String column of its decimal digits in protobuf and JSON alike;
    one whose values fit stays Int64."""
    frame = Frame({"u": np.array([2**64 - 1, 2**63], dtype=np.uint64), "fits": np.array([0, 2**63 - 1], dtype=np.uint64)}, {})
    expected = [["18446744073709551615", "9223372036854775808"]], [[0], [2**63 - 1]]
    for message in (
        pb.InferenceRequest.FromString(inference_request_bytes(frame, {})),
        pb.Prediction.FromString(prediction_bytes(FQ, frame)),
    ):
        assert [(e.type, list(e.fields)) for e in message.schema] == [(pb.String, ["u"]), (pb.Int64, ["fits"])]
        assert [list(d.tensors[0].String.data) for d in message.datum] == [[t] for t in expected[0][0]]
        assert [list(d.tensors[1].Int64.data) for d in message.datum] == expected[1]
    answer = orjson.loads(prediction_json(FQ, frame))
    assert answer["schema"] == [{"type": "String", "fields": ["u"]}, {"type": "Int64", "fields": ["fits"]}]
    assert [d["tensors"][0]["String"]["data"] for d in answer["datum"]] == [[t] for t in expected[0][0]]
    assert [d["tensors"][1]["Int64"]["data"] for d in answer["datum"]] == [["0"], [str(2**63 - 1)]]


def test_text_columns_of_the_wrong_kind_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="a String column holds a int"):
        inference_request_bytes(Frame({"s": np.array(["a", 3], dtype=object)}, {}), {})
    with pytest.raises(TypeError, match="a Bytes column holds a str"):
        inference_request_bytes(Frame({"b": np.array([b"a", "b"], dtype=object)}, {}), {})


@pytest.mark.parametrize(("columns", "rows"), [(32, 16), (33, 1), (2, 17), (40, 30)])
def test_c_writer_on_either_side_of_its_stack_buffers(columns: int, rows: int) -> None:
    # Up to 32 columns and 16 records the writer works in stack buffers, past that in the heap.
    rng = np.random.default_rng(columns * 100 + rows)
    kinds = [
        lambda: rng.normal(size=rows),
        lambda: rng.integers(-9, 9, size=rows),
        lambda: np.array([f"t{i}" for i in range(rows)], dtype=object),
    ]
    frame = Frame({f"c{i}": kinds[i % 3]() for i in range(columns)}, {})
    configs = {"user": "u1", "region": "eu"}
    assert pb.InferenceRequest.FromString(inference_request_bytes(frame, configs)) == request_to_proto(frame, configs)
    fqrv = FQRV(Contract("org", "proj", 1), "r")
    assert pb.Prediction.FromString(prediction_bytes(fqrv, frame)) == prediction_to_proto(fqrv, frame)


def test_c_writer_reads_numpy_arrays_of_one_element_whatever_stride_they_report() -> None:
    # numpy calls a one-element view contiguous whatever its stride (here -8): the writer reads it as
    # it is (numpy's C API, no buffer), instead of asking for a converted copy.
    one = np.array([b"x", b"y"], dtype=object)[::-1][:1]
    assert one.strides == (-8,) and one.flags["C_CONTIGUOUS"]
    written = _ffwire.message(b"", b"", 0x0A, 0x12, 1, {"b": one}, None)
    assert written is not None
    assert pb.InferenceRequest.FromString(written).datum[0].tensors[0].Byte.data == [b"y"]


def test_event_head_checks_its_arguments() -> None:
    good: list[Any] = [b"\x10\x01", 1700000000000, "req-1", b"", 1.5, 200, b""]
    assert _ffwire.event_head(*good)[:2] == b"\x10\x01"
    for at, bad, error in [
        (0, "text", "argument 1 must be bytes, not str"),
        (1, 1.5, "argument 2 must be int, not float"),
        (2, b"req", "argument 3 must be str, not bytes"),
        (3, None, "argument 4 must be bytes, not NoneType"),
        (5, "200", "argument 6 must be int, not str"),
        (6, bytearray(), "argument 7 must be bytes, not bytearray"),
    ]:
        args = list(good)
        args[at] = bad
        with pytest.raises(TypeError, match=error):
            _ffwire.event_head(*args)
    with pytest.raises(TypeError, match="must be real number, not str"):
        _ffwire.event_head(*good[:4], "1.5", *good[5:])
    with pytest.raises(OverflowError, match="int32"):
        _ffwire.event_head(*good[:5], 2**31, good[6])
    with pytest.raises(TypeError, match="takes exactly 7 arguments \\(6 given\\)"):
        _ffwire.event_head(*good[:6])


def test_c_writer_checks_its_arguments() -> None:
    def message(rows: int, columns: Any, configs: Any = None, outer: bytes = b"") -> Any:
        return _ffwire.message(outer, b"", 0x0A, 0x12, rows, columns, configs)

    with pytest.raises(TypeError, match="must be dict, not list"):
        message(1, [np.zeros(1)])
    with pytest.raises(TypeError, match="argument 1 must be bytes, not str"):
        _ffwire.message("", b"", 0x0A, 0x12, 1, {}, None)
    with pytest.raises(TypeError, match="argument 5 must be int, not float"):
        message(1.0, {})
    with pytest.raises(TypeError, match="takes exactly 7 arguments"):
        _ffwire.message(b"", b"", 0x0A, 0x12, 1, {})
    with pytest.raises(ValueError, match="does not split into 2 records"):
        message(2, {"a": np.zeros(3)})
    with pytest.raises(ValueError, match="rows must not be negative"):
        message(-2, {})
    # -1: as many records as the first column has (what Frame.num_rows says)
    assert message(-1, {"a": np.arange(3.0), "b": np.zeros(3)}) == message(3, {"a": np.arange(3.0), "b": np.zeros(3)})
    assert message(-1, {}) == message(0, {})
    with pytest.raises(TypeError, match="has no len"):
        message(-1, {"a": np.float64(1.0)})
    with pytest.raises(TypeError, match="column names must be str"):
        message(1, {1: np.zeros(1)})
    with pytest.raises(TypeError, match="dict of str to str"):
        message(1, {"a": np.zeros(1)}, {"k": 1})
    with pytest.raises(TypeError, match="dict of str to str or None"):
        message(1, {"a": np.zeros(1)}, ["k"])
    with pytest.raises(ValueError, match="single bytes"):
        message(1, {"a": np.zeros(1)}, outer=b"\x1a\x1a\x1a\x1a")
    # What it cannot read as it is, it leaves to the caller to convert: None, no error.
    for unreadable in (np.zeros(2, dtype=np.complex64), np.zeros((2, 2))[:, :1], "not a buffer", np.zeros(2, dtype=">f8")):
        assert message(2, {"a": unreadable}) is None
    assert message(0, {}) == b"" and message(0, {}, {}) == b""
    assert message(1, {"x": np.zeros(1)}, outer=b"\x1a")[:2] == b"\x1a" + bytes((len(message(1, {"x": np.zeros(1)})),))
    # Columns in the dict's order: the schema lists them as inserted.
    two = pb.InferenceRequest.FromString(message(1, {"b": np.zeros(1), "a": np.ones(1)}))
    assert list(two.schema[0].fields) == ["b", "a"]
    with pytest.raises(OverflowError):
        varint(2**64)


def test_wire_event_checks_its_arguments() -> None:
    good: list[Any] = [b"\x10\x01", 1700000000000, "req-1", b"", 1.5, 200, b"", b"{}", None, None, None]
    assert _ffwire.wire_event(*good) == _ffwire.event_head(*good[:7]) + b"\x92\x01\x02{}"
    assert _ffwire.wire_event(*good[:7], None, None, None, None) == _ffwire.event_head(*good[:7])  # no wire field
    for at, bad, error in [
        (7, "{}", "argument 8 must be bytes, not str"),
        (8, "{}", "argument 9 must be bytes, not str"),
        (9, 1.0, "argument 10 must be int, not float"),
        (10, "3", "argument 11 must be int, not str"),
    ]:
        args = list(good)
        args[at] = bad
        with pytest.raises(TypeError, match=error):
            _ffwire.wire_event(*args)
    with pytest.raises(TypeError, match="takes exactly 11 arguments \\(7 given\\)"):
        _ffwire.wire_event(*good[:7])


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_frame(), st.binary(max_size=200), st.binary(max_size=200))
def test_a_request_between_two_parts_is_the_three_joined(frame: Frame, before: bytes, after: bytes) -> None:
    # Every layout: the ones the C writer takes as they are, and the converted ones (strided, fixed width).
    configs = {"k": "v"}
    expected = before + inference_request_bytes(frame, configs, b"\x1a") + after
    assert inference_request_between(before, frame, configs, b"\x1a", after) == expected


def test_message_takes_bytes_before_and_after() -> None:
    columns = {"a": np.arange(3.0)}
    plain = _ffwire.message(b"\x1a", b"", 0x0A, 0x12, 3, columns, None)
    assert plain is not None
    assert _ffwire.message(b"\x1a", b"", 0x0A, 0x12, 3, columns, None, False, b"head", b"tail") == b"head" + plain + b"tail"
    assert _ffwire.message(b"\x1a", b"", 0x0A, 0x12, 3, columns, None, False, b"", b"") == plain
    with pytest.raises(TypeError, match="argument 9 must be bytes, not str"):
        _ffwire.message(b"\x1a", b"", 0x0A, 0x12, 3, columns, None, False, "head", b"")
    with pytest.raises(TypeError, match="argument 10 must be bytes, not NoneType"):
        _ffwire.message(b"\x1a", b"", 0x0A, 0x12, 3, columns, None, False, b"", None)
