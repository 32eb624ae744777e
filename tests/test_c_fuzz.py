"""Fuzzing every C entry point with hypothesis, against the Python path where there is one.

The C extensions read request bodies (``_ffjson``, ``_ffgp``), write answers and events
(``_ffwire``, ``_ffgp``, ``_kafka_records``) and walk model tables (``_h2o_trees``); the H2O reader
turns a model file into those tables. Each test feeds them what hypothesis makes of valid input
(bytes cut, dropped, replaced and inserted anywhere; numbers of every width) and checks the answer
against an oracle: the Python decoder, the protobuf library, graphpipe's and aiokafka's readers.
A crash would take the test process down; ``scripts/asan.sh`` runs this module under
AddressSanitizer, where a read one byte out of bounds fails too. Example counts are bounded (the
``slow`` mark runs many more of the cheap ones; the quick tier runs a fifth, tests/tiers.py).
"""

from __future__ import annotations

import asyncio
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp._http_parser import HttpRequestParser
from aiokafka.record.default_records import DefaultRecordBatch
from graphpipe import convert
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import istr

from bench import payloads
from forestflow._proto import forestflow_pb2 as pb
from forestflow.api import _ffhttp
from forestflow.api.fast_http import _HEADER_NAMES
from forestflow.codecs import _ffgp, _ffjson, _ffwire
from forestflow.codecs import graphpipe as gp_codec
from forestflow.codecs.graphpipe import encode_infer_response
from forestflow.codecs.v2_request import parse_inputs
from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import InvalidInput
from forestflow.predlog import _kafka_records
from forestflow.predlog.cloudevents import python_record_headers, record_headers
from forestflow.predlog.kafka_batch import RecordBatch
from forestflow.predlog.log import LogEntry
from forestflow.runtime import _forest, _h2o_trees, h2o_inputs
from forestflow.runtime.h2o_inputs import NA as NA_CODE
from forestflow.runtime.h2o_inputs import ModelColumn, build_matrix
from forestflow.runtime.h2o_native import NativeTreeScorer, node_table
from forestflow.runtime.h2o_tree_reader import InvalidMojo, flatten_trees, read_tree_model
from forestflow.runtime.trees.codes import CATEGORICAL, FLAGS, IDENTITY, LE, LE_X_F32, LT_F32, MISSING_SHIFT, SIGMOID
from forestflow.runtime.trees.forest import Forest, ForestBuilder
from tests.codecs.test_json_columns import (
    _front_end,
    _python_path,
    _same_frame,
    _score_body,
    _v2_body,
    _v2_front_end,
    _v2_python,
)
from tests.codecs.test_np_columns import check_v2_np, np_body
from tests.runtime.test_h2o_mojo import FIXTURES
from tests.tiers import examples

FAST = settings(
    max_examples=examples(150), deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
MANY = settings(max_examples=3000, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
FQ = FQRV(Contract("acme", "fuzz", 1), "r1")


@st.composite
def mutated(draw: Any, body: bytes) -> bytes:
    """``body`` with up to four edits anywhere: cut short, a byte dropped, replaced or inserted."""
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        edit = draw(st.sampled_from(["cut", "drop", "replace", "insert"]))
        byte = draw(st.sampled_from(list(b'{}[],:"\\\x00\xff\xc3 1e-.0nt') + [draw(st.integers(0, 255))]))
        if edit == "cut":
            del data[at:]
        elif edit == "drop":
            del data[at]
        elif edit == "replace":
            data[at] = byte
        else:
            data.insert(at, byte)
    return bytes(data)


# ---- _ffjson: BASIC and V2 request bodies, C against orjson and the Python conversions ---------------------
@st.composite
def score_bodies(draw: Any) -> bytes:
    return draw(mutated(_score_body(draw(st.randoms(use_true_random=False)))))


@st.composite
def v2_bodies(draw: Any) -> bytes:
    return draw(mutated(_v2_body(draw(st.randoms(use_true_random=False)))))


def _check_score_body(body: bytes) -> None:
    expected, got = _python_path(body), _front_end(body)
    if isinstance(expected, str):
        assert got == expected, body
    else:
        assert not isinstance(got, str), (body, got)
        assert _same_frame(got[0], expected[0]) and got[1] == expected[1], body


def _check_v2_body(head: bytes) -> None:
    expected, got = _v2_python(head), _v2_front_end(head)
    if isinstance(expected, str):
        assert got == expected, head
    else:
        assert not isinstance(got, str), (head, got)
        assert [(n, d) for n, d, _ in got] == [(n, d) for n, d, _ in expected], head
        for (_, _, a), (_, _, b) in zip(got, expected):
            same = np.array_equal(a, b, equal_nan=True) if a.dtype.kind == "f" else a.tolist() == b.tolist()
            assert a.shape == b.shape and a.dtype == b.dtype and same, head


@FAST
@given(score_bodies())
def test_ffjson_score_request_agrees_with_the_python_path(body: bytes) -> None:
    _check_score_body(body)


@FAST
@given(v2_bodies())
def test_ffjson_v2_request_agrees_with_orjson(head: bytes) -> None:
    _check_v2_body(head)


def _check_v2_columns(head: bytes) -> None:
    """What ``v2_columns`` takes is JSON whose general decoding gives the same columns, parameters and id."""
    got = _ffjson.v2_columns(head)
    if got is None:
        return
    columns, parameters, client_id = got
    doc = orjson.loads(head)
    assert set(doc) <= {"inputs", "parameters", "id"}, head
    assert doc.get("parameters") == parameters and doc.get("id") == client_id, head
    tensors = parse_inputs(doc, memoryview(b""))
    assert [t.name for t in tensors] == list(columns) and len({len(c) for c in columns.values()}) == 1, head
    for tensor in tensors:
        column = columns[tensor.name]
        assert tensor.datatype in ("FP64", "BYTES") and not tensor.parameters, head
        assert tensor.array.shape == column.shape == (len(column),) and tensor.array.dtype == column.dtype, head
        if column.dtype.kind == "f":
            assert np.array_equal(tensor.array, column, equal_nan=True), head
        else:
            assert tensor.array.tolist() == column.tolist(), head


@FAST
@given(v2_bodies())
def test_ffjson_v2_columns_take_only_what_the_general_path_reads_alike(head: bytes) -> None:
    _check_v2_columns(head)


def test_ffjson_v2_columns_take_the_plain_request() -> None:
    body = payloads.v2_body(3)
    got = _ffjson.v2_columns(body)
    assert got is not None and list(got[0]) == payloads.CATEGORICAL + payloads.NUMERIC
    assert got[1] == {"reqid": "bench"} and got[2] is None
    _check_v2_columns(body)
    for declined in (b'{"inputs":[]}', b'{"inputs":[{"name":"a","datatype":"FP64","shape":[1],"data":[1]}]}'):
        assert _ffjson.v2_columns(declined) is None  # no input; integers only (converted in Python)
    rng, taken = random.Random(3), 0
    for _ in range(3000):
        head = _v2_body(rng)
        _check_v2_columns(head)
        taken += _ffjson.v2_columns(head) is not None
    assert taken > 40


@st.composite
def np_bodies(draw: Any) -> bytes:
    return draw(mutated(np_body(draw(st.randoms(use_true_random=False)))))


@FAST
@given(np_bodies())
def test_ffjson_v2_np_takes_only_what_the_general_path_reads_alike(head: bytes) -> None:
    check_v2_np(head)
    _check_v2_columns(head)


@pytest.mark.slow
@MANY
@given(score_bodies(), v2_bodies(), np_bodies())
def test_ffjson_many_more_bodies(body: bytes, head: bytes, np_head: bytes) -> None:
    _check_score_body(body)
    _check_v2_body(head)
    _check_v2_columns(head)
    check_v2_np(head)
    check_v2_np(np_head)


@FAST
@given(
    st.lists(st.lists(st.lists(st.integers(-5, 5) | st.text(max_size=3), max_size=2), max_size=5), min_size=1, max_size=3),
    st.integers(0, 5),
)
def test_ffjson_datum_interleaves_or_declines(groups: list[list[list[Any]]], rows: int) -> None:
    """Each group's rows as orjson writes them: the records, or None when a group has another row count."""
    openings = [b'{"tensors":[{"G0":{"data":'] + [b'}},{"G%d":{"data":' % g for g in range(1, len(groups))]
    out = _ffjson.datum(rows, openings, [orjson.dumps(g) for g in groups], b"}}]}")
    if any(len(g) != rows for g in groups):
        assert out is None
        return
    assert out is not None
    records = orjson.loads(out)
    assert [[t[f"G{g}"]["data"] for g, t in enumerate(r["tensors"])] for r in records] == [
        [groups[g][i] for g in range(len(groups))] for i in range(rows)
    ]


# ---- _ffgp: GraphPipe string vectors and answers ------------------------------------------------------------
def _strings_oracle(buf: bytes, start: int, count: int) -> list[bytes] | None:
    """The flatbuffer strings whose uoffsets start at ``start``, read in Python; None if any points outside."""
    if start < 0 or count > int((len(buf) - start) / 4):  # as C divides: toward zero
        return None
    out = []
    for i in range(count):
        at = start + 4 * i
        if at < 0 or at + 4 > len(buf):
            return None
        target = at + struct.unpack_from("<I", buf, at)[0]
        if target + 4 > len(buf):
            return None
        n = struct.unpack_from("<I", buf, target)[0]
        if target + 4 + n > len(buf):
            return None
        out.append(buf[target + 4 : target + 4 + n])
    return out


@FAST
@given(st.binary(max_size=64), st.integers(-8, 70), st.integers(0, 20))
def test_ffgp_read_strings_reads_what_python_reads(buf: bytes, start: int, count: int) -> None:
    got = _ffgp.read_strings(buf, start, count)
    expected = _strings_oracle(buf, start, count)
    if expected is None:
        assert got is None
        return
    assert got is not None
    try:
        assert got == [b.decode("utf-8") for b in expected]
    except UnicodeDecodeError:
        assert got == expected


@FAST
@given(st.lists(st.one_of(st.text(max_size=10), st.binary(max_size=10), st.none(), st.integers()), max_size=12))
def test_ffgp_write_strings_reads_back(values: list[Any]) -> None:
    written = _ffgp.write_strings(values)
    # A vector of strings: count, then a uoffset per element; read back at the first uoffset.
    (count,) = struct.unpack_from("<I", written, 0)
    assert count == len(values)
    expected = [v if isinstance(v, bytes) else b"" if v is None else str(v).encode() for v in values]
    assert _strings_oracle(written, 4, count) == expected


_GP_DTYPES = ["u1", "i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"]


@st.composite
def gp_frames(draw: Any) -> Frame:
    rows = draw(st.integers(0, 4))
    columns: dict[str, np.ndarray] = {}
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            column = np.empty(rows, dtype=object)
            column[:] = draw(st.lists(st.text(max_size=6) | st.binary(max_size=6), min_size=rows, max_size=rows))
        else:
            dtype = np.dtype(draw(st.sampled_from(_GP_DTYPES)))
            width = draw(st.integers(1, 3))
            column = np.frombuffer(
                draw(st.binary(min_size=rows * width * dtype.itemsize, max_size=rows * width * dtype.itemsize)), dtype=dtype
            )
            column = column.reshape(rows, width) if width > 1 else column
        columns[f"c{i}"] = column
    return Frame(columns)


@FAST
@given(gp_frames())
def test_ffgp_infer_response_reads_back_with_graphpipes_reader(frame: Frame) -> None:
    outputs, errors = convert.deserialize_infer_response(encode_infer_response(FQ, frame))
    assert errors == []
    assert outputs[0].reshape(-1).tolist() == [str(FQ).encode()]
    for got, column in zip(outputs[1:], frame.columns.values()):
        want = column.reshape(len(column), int(np.prod(column.shape[1:])))
        if column.dtype == object:
            # graphpipe's reader makes numpy bytes_ of them, which drop trailing NULs
            texts = [v if isinstance(v, bytes) else v.encode() for v in column]
            assert [bytes(v) for v in got.reshape(-1)] == [t.rstrip(b"\0") for t in texts]
        else:
            assert got.shape == want.shape and got.tobytes() == want.astype(want.dtype.newbyteorder("<")).tobytes()


@st.composite
def gp_columns(draw: Any) -> np.ndarray:
    """An output column of any kind a model gives: numbers of every width and byte order, booleans,
    objects (str, bytes, None, numbers; repeated objects), str arrays; C-ordered or not."""
    rows = draw(st.integers(0, 4))
    width = draw(st.sampled_from([0, 1, 1, 2, 3]))  # 0: a 1-D column
    count = rows * max(width, 1)
    kind = draw(st.sampled_from(["number", "number", "object", "bool", "str"]))
    if kind == "object":
        value = st.text(max_size=6) | st.binary(max_size=6) | st.none() | st.integers(-9, 9)
        pool = draw(st.lists(value, min_size=1, max_size=3))
        column = np.empty(count, dtype=object)
        column[:] = [pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1), min_size=count, max_size=count))]
    elif kind == "bool":
        column = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype=bool)
    elif kind == "str":
        column = np.array(draw(st.lists(_LEVELS, min_size=count, max_size=count)), dtype=str)
    else:
        dtype = np.dtype(draw(st.sampled_from(_GP_DTYPES + [">i4", ">f8", "=i8", "=f8", "q", "l", "Q", "L"])))
        column = np.frombuffer(draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize)), dtype=dtype)
    column = column.reshape(rows, width) if width else column.reshape(rows)
    if width > 1 and draw(st.booleans()):
        column = np.asfortranarray(column)  # not C-ordered
    elif rows > 1 and draw(st.integers(0, 4)) == 0:
        column = np.concatenate([column, column])[::2]  # strided
    return column


@FAST
@given(st.lists(gp_columns(), min_size=1, max_size=4), st.booleans())
def test_ffgp_infer_response_of_columns_writes_what_the_tuples_write(columns: list[np.ndarray], named: bool) -> None:
    """Numpy columns handed to the C writer as they are give the bytes of _wire_tensor's tuples, or None."""
    same_rows = len({len(c) for c in columns}) == 1
    frame = Frame({f"c{i}": column for i, column in enumerate(columns)} if same_rows else {"c0": columns[0]})
    fqrv_tensor = (12, (1, 1), _ffgp.write_strings([str(FQ)]), True)
    direct = _ffgp.infer_response([fqrv_tensor, *frame.columns.values()])
    tuples = _ffgp.infer_response([fqrv_tensor, *(gp_codec._wire_tensor(n, c) for n, c in frame.columns.items())])
    assert direct is None or direct == tuples
    usual = all(c.dtype.kind in "biufO" and c.dtype.byteorder != ">" and c.flags.c_contiguous for c in frame.columns.values())
    assert (direct is not None) == usual
    names = [*reversed(frame.columns), "fqrv"] if named else []
    assert encode_infer_response(FQ, frame, names) == _ffgp.infer_response(
        [fqrv_tensor if n == "fqrv" else gp_codec._wire_tensor(n, frame.columns[n]) for n in names]
        if named
        else [fqrv_tensor, *(gp_codec._wire_tensor(n, c) for n, c in frame.columns.items())]
    )


#: Short texts that repeat (categorical levels): ASCII, escaped, non-ASCII, and either side of the
#: 48-byte length up to which the readers hand out the same str object for a repeated value.
_LEVELS = st.sampled_from(["", "A", "B", "AB", "BA", 'a"b', "\\", "é", "日本", "x" * 47, "x" * 48, "x" * 49, "y" * 48])


@FAST
@given(st.lists(_LEVELS | st.binary(max_size=3), max_size=40))
def test_ffgp_read_strings_of_repeated_levels_reads_what_python_reads(values: list[Any]) -> None:
    vector = _ffgp.write_strings(values)
    buf = b"\0" * 4 + vector  # write_strings places its vector 4-aligned: read it at offset 4
    got = _ffgp.read_strings(buf, 8, len(values))
    expected = _strings_oracle(buf, 8, len(values))
    assert expected is not None and got is not None
    try:
        assert got == [b.decode("utf-8") for b in expected]
    except UnicodeDecodeError:
        assert got == expected


@FAST
@given(st.lists(_LEVELS, max_size=40), st.integers(0, 3))
def test_ffjson_v2_bytes_of_repeated_levels_agree_with_orjson(values: list[str], damage: int) -> None:
    head = orjson.dumps({"inputs": [{"name": "c", "shape": [len(values)], "datatype": "BYTES", "data": values}]})
    if damage:  # a cut inside the data: declined or refused alike
        head = head[: len(head) * damage // 4]
    _check_v2_body(head)


@FAST
@given(
    st.lists(_LEVELS | st.integers(-3, 3) | st.floats(allow_nan=True) | st.none() | st.binary(max_size=2), max_size=30),
    st.integers(1, 3),
)
def test_h2o_level_codes_write_what_codes_gives(values: list[Any], width: int) -> None:
    column = ModelColumn.make("c", ("A", "B", "é", "1", "x" * 48, "c.AB"))
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    X = np.full((len(values), width), -7.0)
    column.fill(arr, X, width - 1, unseen=-2.0)
    expected = np.asarray(column.codes(arr, unseen=-2.0), dtype=np.float64).reshape(len(values))
    assert np.array_equal(X[:, width - 1], expected, equal_nan=True)
    assert (X[:, : width - 1] == -7.0).all()  # only its own column written
    for bad in (X[:, :1].copy().reshape(-1), np.full((len(values) + 1, width), 0.0)):
        with pytest.raises((TypeError, ValueError)):
            _h2o_trees.level_codes(arr.tolist(), column.lookup, bad, 0)


_MODEL_COLUMNS = [
    ModelColumn.make("cat", ("A", "B", "é", "1", "x" * 48, "cat.AB")),
    ModelColumn.make("num", None),
    ModelColumn.make("cat2", ("A", "z")),
]


@st.composite
def h2o_frames(draw: Any) -> Frame:
    """A batch for ``_MODEL_COLUMNS`` as any front-end may give it: levels as str (known or not),
    numbers, bytes, None; numbers as FP64 (strided too), other dtypes, numeric strings; [n, 1]
    columns; columns missing or unknown."""
    rows = draw(st.integers(0, 5))
    columns: dict[str, np.ndarray] = {}
    for name in draw(st.permutations(["cat", "num", "cat2", "other"])):
        kind = draw(st.sampled_from(["levels", "known", "floats", "floats", "ints", "skip"]))
        if kind == "skip":
            continue
        if kind in ("levels", "known"):
            known = st.sampled_from(["A", "B", "é", "1", "x" * 48, "AB", "z"])
            values = st.one_of(known, _LEVELS, st.integers(-3, 3), st.floats(), st.none(), st.binary(max_size=2), st.just("6.5"))
            column = np.empty(rows, dtype=object)
            column[:] = draw(st.lists(known if kind == "known" else values, min_size=rows, max_size=rows))
        elif kind == "floats":
            column = np.array(draw(st.lists(st.floats(width=64), min_size=2 * rows, max_size=2 * rows)), dtype=np.float64)
            column = column[::2] if draw(st.booleans()) else column[:rows]
        else:
            dtype = draw(st.sampled_from(["i8", "f4", "u1", "?"]))
            column = np.array(draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows))).astype(dtype)
        if draw(st.integers(0, 5)) == 0:
            column = column.reshape(rows, 1)
        columns[name] = column
    return Frame(columns)


@FAST
@given(h2o_frames(), st.sampled_from([NA_CODE, -1.0]))
def test_h2o_build_matrix_writes_what_each_column_gives(frame: Frame, unseen: float) -> None:
    """build_matrix (encode_columns in C for the usual columns) against each column encoded on its own."""
    X, offsets, unknown = build_matrix(frame, _MODEL_COLUMNS, None, unseen)
    assert X.shape == (frame.num_rows, len(_MODEL_COLUMNS)) and offsets is None
    assert unknown == [n for n in frame.columns if n == "other"]
    for j, column in enumerate(_MODEL_COLUMNS):
        arr = frame.columns.get(column.name)
        if arr is None:
            expected = np.full(frame.num_rows, np.nan)
        else:
            values = arr.reshape(len(arr))
            if frame.num_rows == 1:  # one row: value by value
                expected = np.array([column.code_of(values[0], unseen) if column.domain else h2o_inputs._number(values[0])])
            else:
                raw = column.codes(values, unseen) if column.domain else h2o_inputs.numbers(values)
                expected = np.asarray(raw, dtype=np.float64).reshape(len(arr))
        assert np.array_equal(X[:, j], expected, equal_nan=True), (column.name, arr)


def test_h2o_encode_columns_leaves_what_it_cannot_read() -> None:
    lookup = _MODEL_COLUMNS[0].lookup
    X = np.full((2, 3), np.nan)
    arrays: list[Any] = [np.array(["A", "zz"], dtype=object), np.array([1.0, 2.0]), np.array(["B", "A"], dtype=object)]
    assert _h2o_trees.encode_columns(arrays, [lookup, None, lookup], X) == [0]  # "zz" names no level
    assert X[:, 1:].tolist() == [[1.0, 1.0], [2.0, 0.0]]
    assert _h2o_trees.encode_columns([np.array([1, 2]), np.zeros((2, 1)), None], [None, None, lookup], X) == [0, 1]
    with pytest.raises(ValueError):
        _h2o_trees.encode_columns([None], [None], X)


@st.composite
def gp_requests(draw: Any) -> bytes:
    """A GraphPipe InferRequest as the official client writes it (String and numeric tensors,
    names, a config), then up to four edits anywhere (``mutated``)."""
    rows = draw(st.integers(0, 4))
    tensors: list[np.ndarray] = []
    for _ in range(draw(st.integers(0, 3))):
        width = draw(st.integers(1, 3))
        if draw(st.booleans()):
            values = draw(st.lists(_LEVELS, min_size=rows * width, max_size=rows * width))
            tensors.append(np.array(values, dtype=object).reshape(rows, width))
        else:
            dtype = draw(st.sampled_from([np.float64, np.float32, np.int64, np.uint8, np.int16]))
            tensors.append(np.arange(rows * width, dtype=dtype).reshape(rows, width))
    names = draw(st.lists(_LEVELS, max_size=3)) if draw(st.booleans()) else []
    outputs = draw(st.lists(_LEVELS, max_size=2))
    config = draw(st.sampled_from(["", "reqid:1", "a:b,c:d", "é"]))
    body = bytes(convert.serialize_infer_request(convert.InferReq(config, tensors, names, outputs)))
    return draw(mutated(body))


def _gp_outcome(body: bytes, walk_in_c: bool) -> Any:
    saved = _ffgp.infer_request
    if not walk_in_c:
        setattr(_ffgp, "infer_request", lambda _body: None)  # noqa: B010 - the Python reader alone
    try:
        request = gp_codec.parse_request(body)
    except InvalidInput as error:
        return error.message
    finally:
        setattr(_ffgp, "infer_request", saved)  # noqa: B010
    if not isinstance(request, gp_codec.GPInferRequest):
        return type(request).__name__
    arrays = [(t.dtype.str, t.shape, t.tolist()) for t in request.tensors]
    return request.config, request.input_names, request.output_names, arrays


@FAST
@given(gp_requests())
def test_ffgp_infer_request_walks_what_the_python_reader_reads(body: bytes) -> None:
    assert _gp_outcome(body, walk_in_c=True) == _gp_outcome(body, walk_in_c=False)


@pytest.mark.slow
@MANY
@given(gp_requests())
def test_ffgp_infer_request_many_more_bodies(body: bytes) -> None:
    assert _gp_outcome(body, walk_in_c=True) == _gp_outcome(body, walk_in_c=False)


@FAST
@given(st.binary(max_size=96))
def test_ffgp_infer_request_of_any_bytes_declines_or_agrees(body: bytes) -> None:
    assert _gp_outcome(body, walk_in_c=True) == _gp_outcome(body, walk_in_c=False)


#: Inputs of a scalar-column model: text (BYTES) and FP64 ones interleaved (prostate's order among them).
_LAYOUTS = [
    [("AGE", "FP64"), ("RACE", "BYTES"), ("DPROS", "BYTES"), ("DCAPS", "BYTES"), ("PSA", "FP64"), ("VOL", "FP64")],
    [("a", "BYTES")],
    [("x", "FP64"), ("y", "FP64")],
    [("t", "BYTES"), ("n", "FP32")],  # not FP64: the general path lays it out
]


@st.composite
def gp_grouped_requests(draw: Any) -> tuple[bytes, list[TensorSpec]]:
    """An InferRequest of unnamed grouped tensors (mostly as wide as the model's groups) for one of
    ``_LAYOUTS``, as the official client writes it, half of them with up to four edits anywhere (``mutated``)."""
    inputs = [TensorSpec(name, datatype) for name, datatype in draw(st.sampled_from(_LAYOUTS))]
    rows = draw(st.sampled_from([0, 1, 1, 2, 3, 4]))
    texts = sum(spec.datatype == "BYTES" for spec in inputs)
    tensors: list[np.ndarray] = []
    for text, width in ((True, texts), (False, len(inputs) - texts)):
        width = draw(st.sampled_from([width, width, width, 1, 2]))
        if not width or not draw(st.integers(0, 5)):
            continue
        if text != (not draw(st.integers(0, 5))):  # now and then the other kind
            values = draw(st.lists(_LEVELS | st.just(b"\xff"), min_size=rows * width, max_size=rows * width))
            tensors.append(np.array(values, dtype=object).reshape(rows, width))
        else:
            dtype = draw(st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.uint64, np.int8, np.uint16, np.int32]))
            scale = draw(st.sampled_from([1, -1, 2**40, 0.5]))
            with np.errstate(all="ignore"):  # wrapped around in the narrow types: any values will do
                tensors.append((np.arange(rows * width) * scale).astype(dtype).reshape(rows, width))
    tensors = draw(st.permutations(tensors))
    names = [] if draw(st.integers(0, 7)) else ["a"]
    config, outputs = draw(st.sampled_from(["", "reqid:1", "é"])), draw(st.lists(_LEVELS, max_size=2))
    body = bytes(convert.serialize_infer_request(convert.InferReq(config, tensors, names, outputs)))
    return (draw(mutated(body)) if draw(st.booleans()) else body), inputs


def _frame_outcome(make: Any) -> Any:
    try:
        frame = make()
    except InvalidInput as error:
        return error.message
    return [(name, column.dtype.str, column.shape, column.tolist()) for name, column in frame.columns.items()]


def _check_plain(body: bytes, inputs: list[TensorSpec]) -> None:
    plain = gp_codec.plain_request(body)
    if plain is None:
        return  # the general path reads it
    parsed = gp_codec.parse_request(body)  # no error for a body the plain path takes
    assert isinstance(parsed, gp_codec.GPInferRequest) and not parsed.input_names, body
    assert (plain[0], plain[1]) == (parsed.config, parsed.output_names), body
    expected = _frame_outcome(lambda: gp_codec.frame_from_request(parsed, inputs))
    got = _frame_outcome(lambda: gp_codec.plain_frame(body, plain, inputs))
    assert repr(got) == repr(expected), body  # repr: NaN equals NaN, and -0.0 differs from 0.0


@FAST
@given(gp_grouped_requests())
def test_ffgp_plain_path_reads_what_the_general_path_reads(case: tuple[bytes, list[TensorSpec]]) -> None:
    _check_plain(*case)


@pytest.mark.slow
@MANY
@given(gp_grouped_requests())
def test_ffgp_plain_path_many_more_bodies(case: tuple[bytes, list[TensorSpec]]) -> None:
    _check_plain(*case)


def test_ffgp_plain_path_takes_the_usual_request() -> None:
    body = payloads.graphpipe_body(3)
    assert body is not None
    plain = gp_codec.plain_request(body)
    assert plain is not None and plain[:3] == ("reqid:bench", [], 3)
    inputs = [TensorSpec(n, d) for n, d in _LAYOUTS[0]] + [TensorSpec("GLEASON", "FP64")]
    assert _ffgp.grouped_columns(body, plain[2], plain[3], tuple((s.name, s.datatype == "BYTES") for s in inputs)) is not None
    _check_plain(body, inputs)
    with pytest.raises(TypeError):
        _ffgp.grouped_columns(body, plain[2], ([12, 3, 0],), (("a", True),))  # type: ignore[arg-type]


@FAST
@given(
    st.binary(max_size=96),
    st.integers(-2, 6),
    st.lists(st.tuples(st.sampled_from([0, 1, 8, 9, 10, 11, 12, 13]), st.integers(-1, 4), st.integers(-8, 100)), max_size=3),
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=4),
)
def test_ffgp_grouped_columns_of_any_arguments_stays_in_the_body(
    body: bytes, rows: int, tensors: list[tuple[int, int, int]], layout: list[tuple[str, bool]]
) -> None:
    """Offsets that point anywhere (the C call checks every bound again): None or columns, never a read outside."""
    columns = _ffgp.grouped_columns(body, rows, tuple(tensors), tuple(layout))
    if columns is not None:
        assert all(len(column) == rows for column in columns.values())


# ---- _ffhttp: plain request heads, C against llhttp (aiohttp's request parser) ----------------------------------
_HEAD_NAMES = [
    "Host", "host", "Content-Length", "content-length", "CONTENT-LENGTH", "Content-Type", "Connection", "connection",
    "Transfer-Encoding", "Expect", "Upgrade", "Proxy-Connection", "Sec-WebSocket-Key1", "Content-Encoding",
    "X-Request-Id", "x-request-id", "X-Request-Timeout-Ms", "Accept", "User-Agent", "X-Forestflow-Release", "A", "x_y",
    "Bad Name", "Na:me", "N\u00e9", "",
]  # fmt: skip
_HEAD_VALUES = [
    "x", "127.0.0.1:8080", "0", "12", "0012", "-1", "1 2", "99999999999999999999", "close", "Close", "keep-alive",
    "Keep-Alive", "upgrade", "close, upgrade", "chunked", "gzip", "identity", "100-continue", "websocket",
    "application/json", "  padded  ", "\tt\tab\t", "a\x00b", "a\x7fb", "caf\u00e9", "a\rb", "a\nb", "", " ", "\t",
]  # fmt: skip


_PLAIN_NAMES = [
    "Content-Length", "content-length", "Content-Type", "Connection", "X-Request-Id", "x-request-id", "Accept", "A", "x_y",
]  # fmt: skip
_PLAIN_VALUES = ["0", "12", "0012", "close", "Keep-Alive", "application/json", "  padded  ", "\tt\tab\t", "a b"]


@st.composite
def request_heads(draw: Any) -> bytes:
    """Request heads around the plain one: methods, targets, versions, header names and values of
    every kind that matters to llhttp or aiohttp, line ends, then (half of them) a few random edits."""
    plain = draw(st.booleans())  # a plain request line, names given once, values llhttp takes: mostly a head C reads too
    method = "POST" if plain else draw(st.sampled_from(["POST", "GET", "PUT", "post", "POS", "CONNECT"]))
    targets = ["/acme/fuzz/1/score", "/v2/models/m/infer?x=1#f"] + ([] if plain else ["*", "", "/a b", '/a"b'])
    versions = ["HTTP/1.1", "HTTP/1.0"] + ([] if plain else ["HTTP/2.0", "HTTP/1.2", "http/1.1", "HTTP/1.1 "])
    target, version = draw(st.sampled_from(targets)), draw(st.sampled_from(versions))
    eol = "\r\n" if plain else draw(st.sampled_from(["\r\n"] * 4 + ["\n", "\r"]))
    lines = [f"{method} {target} {version}"]
    if draw(st.integers(0, 5)):
        lines.append("Host: " + draw(st.sampled_from(["h", "127.0.0.1:8080"] + ([] if plain else [""]))))
    names = st.sampled_from(_PLAIN_NAMES if plain else _HEAD_NAMES)
    for name in draw(st.lists(names, max_size=6, unique_by=str.lower if plain else lambda n: n)):
        sep = draw(st.sampled_from([": "] * 6 + [":", ":  ", ":\t"] + ([] if plain else [" : "])))
        value = draw(st.sampled_from(_PLAIN_VALUES if plain else _HEAD_VALUES))
        lines.append(name + sep + value)
    head = "".join(line + draw(st.sampled_from([eol, "\r\n"])) for line in lines) + "\r\n"
    data = head.encode("utf-8")
    return draw(mutated(data)) if draw(st.booleans()) else data


def _llhttp_head(head: bytes) -> Any:
    """What aiohttp's C parser (llhttp) makes of a head: its one message, or None (refused, several messages)."""

    class Protocol:
        _reading_paused = False

    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(Protocol(), loop, 1 << 20, auto_decompress=False)
        try:
            messages, upgraded, _ = parser.feed_data(head)
        except Exception:
            return None
        return messages[0][0] if len(messages) == 1 and not upgraded else None
    finally:
        loop.close()


def request_head(buf: bytes, end: int) -> Any:
    """``_ffhttp.request_head`` with the names the fast path gives it."""
    return _ffhttp.request_head(buf, end, _HEADER_NAMES, istr)


def _check_request_head(head: bytes) -> None:
    end = head.find(b"\r\n\r\n")
    if end < 0:
        assert request_head(head, len(head)) is None
        return
    got = request_head(head + b"next request bytes", end + 4)  # a pipelined request after it is not read
    if got is None:
        return  # llhttp reads it (or refuses it) as before
    if _llhttp_head(b"POST " + got[0].encode() + b" HTTP/1.1\r\nHost: h\r\n\r\n") is None:
        return  # a target llhttp refuses: never a cached route's, so the fast path never takes its head
    message = _llhttp_head(head[: end + 4])
    assert message is not None, head
    path, minor, should_close, length, headers = got
    assert (message.method, message.path, message.version, message.should_close) == ("POST", path, (1, minor), should_close)
    assert (message.compression, message.upgrade, message.chunked) == (None, False, False)
    assert list(message.headers.items()) == headers
    assert [type(name) for name in message.headers] == [type(name) for name, _ in headers]
    assert length == int(message.headers.get("Content-Length", -1))
    assert "Expect" not in message.headers


@FAST
@given(request_heads())
def test_ffhttp_request_head_reads_what_llhttp_reads(head: bytes) -> None:
    _check_request_head(head)


@pytest.mark.slow
@MANY
@given(request_heads())
def test_ffhttp_request_head_many_more_heads(head: bytes) -> None:
    _check_request_head(head)


@FAST
@given(st.binary(max_size=200), st.integers(-2, 220))
def test_ffhttp_request_head_of_any_bytes_declines_or_agrees(data: bytes, end: int) -> None:
    got = request_head(data, end)
    if got is not None:
        _check_request_head(data[:end])


def test_ffhttp_request_head_takes_the_usual_request() -> None:
    head = b"POST /acme/fuzz/1/score HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n"
    assert request_head(head, len(head)) == (
        "/acme/fuzz/1/score",
        1,
        False,
        27,
        [("Host", "h"), ("Content-Type", "application/json"), ("Content-Length", "27")],
    )
    _check_request_head(head)


# ---- _ffwire: varints and event heads ----------------------------------------------------------------------
def _varint_oracle(data: bytes, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return (value & (2**64 - 1), pos) if shift <= 70 else None
    return None


@FAST
@given(st.binary(max_size=14), st.integers(0, 14))
def test_ffwire_read_varint_reads_what_python_reads(data: bytes, pos: int) -> None:
    expected = _varint_oracle(data, pos)
    try:
        got = _ffwire.read_varint(data, pos)
    except ValueError:
        assert expected is None or expected[1] - pos > 10 or (expected[1] - pos == 10 and data[expected[1] - 1] > 1)
        return
    assert got == expected


@FAST
@given(
    st.integers(0, 2**62),
    st.text(max_size=40),
    st.binary(max_size=30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**31), 2**31 - 1),
)
def test_ffwire_event_head_parses_with_protobuf(time_ms: int, request_id: str, fqrv: bytes, latency: float, status: int) -> None:
    try:
        request_id.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate: not a str the gateway makes
    head = _ffwire.event_head(b"", time_ms, request_id, b"", latency, status, b"")
    event = pb.PredictionEvent.FromString(head)
    assert (event.eventTimeMS, event.requestId, event.latencyMs, event.status) == (time_ms, request_id, latency, status)


@FAST
@given(
    st.none() | st.binary(max_size=3000),
    st.none() | st.binary(max_size=3000),
    st.none() | st.integers(0, 2**31 - 1),  # int32 fields (a JSON part's length)
    st.none() | st.integers(0, 2**31 - 1),
    st.binary(max_size=40),
)
def test_ffwire_wire_event_is_the_head_and_the_wire_fields(
    request: bytes | None, response: bytes | None, request_json: int | None, response_json: int | None, tail: bytes
) -> None:
    head = (b"\x10\x01", 1_790_000_000_000, "req-\u00e9", b"", 0.25, 200, tail)
    event = _ffwire.wire_event(*head, request, response, request_json, response_json)
    expected = _ffwire.event_head(*head)
    if request is not None:
        expected += b"\x92\x01" + _ffwire.varint(len(request)) + request
    if response is not None:
        expected += b"\x9a\x01" + _ffwire.varint(len(response)) + response
    if request_json is not None:
        expected += b"\xa0\x01" + _ffwire.varint(request_json)
    if response_json is not None:
        expected += b"\xa8\x01" + _ffwire.varint(response_json)
    assert event == expected
    if not tail:  # fields 18-21 as protobuf reads them
        parsed = pb.PredictionEvent.FromString(event)
        assert (parsed.wireRequest, parsed.wireResponse) == (request or b"", response or b"")
        assert (parsed.wireRequestJsonLength, parsed.wireResponseJsonLength) == (request_json or 0, response_json or 0)


# ---- _kafka_records: record batches read back by aiokafka ---------------------------------------------------
@FAST
@given(st.lists(st.tuples(st.none() | st.binary(max_size=300), st.binary(max_size=400)), min_size=1, max_size=6))
def test_kafka_records_read_back_with_aiokafka(items: list[tuple[bytes | None, bytes]]) -> None:
    entries = [LogEntry(False, key, value) for key, value in items]
    parsed = DefaultRecordBatch(bytes(RecordBatch(entries, "none")._build()))
    assert parsed.validate_crc()
    assert [(r.offset, r.key, r.value) for r in parsed] == [(i, k, v) for i, (k, v) in enumerate(items)]


@FAST
@given(
    st.integers(-(2**63), 2**63 - 1)
    | st.integers(0, 253402300799999)
    | st.sampled_from([0, 999, 253402300799999, 253402300800000]),
    st.text(max_size=80),
    st.booleans(),
    st.sampled_from(["acme", "a", "org-with-a-long-name_" * 3]),
)
def test_kafka_ce_headers_are_the_python_headers(time_ms: int, request_id: str, served: bool, org: str) -> None:
    """The CloudEvents headers written in C are byte for byte the Python ones (or C declines the time)."""
    contract = Contract(org, "fuzz", 1)
    try:
        expected = python_record_headers(contract, served, request_id, time_ms)
    except (UnicodeEncodeError, ValueError, OverflowError, OSError) as error:
        # A lone surrogate, or a time datetime cannot hold: the same error (C declines such a time).
        with pytest.raises(type(error)):
            record_headers(contract, served, request_id, time_ms)
        return
    assert record_headers(contract, served, request_id, time_ms) == expected
    fixed = python_record_headers(contract, served, "", 0)[: -len(b"\x0ace_id\x00\x0ece_time\x30") - 24]
    written = _kafka_records.ce_headers(fixed, request_id, time_ms)
    assert written is None if not 0 <= time_ms <= 253402300799999 else written == expected


# ---- _h2o_trees: random tables are refused or scored, never walked out of bounds ----------------------------
@st.composite
def tables(draw: Any) -> tuple[np.ndarray, ...]:
    n = draw(st.integers(1, 12))
    small = st.integers(-2, n + 2)
    nodes = np.array(draw(st.lists(st.lists(small, min_size=8, max_size=8), min_size=n, max_size=n)), dtype=np.int32)
    nodes[:, 0] %= 5  # node kinds 0-3, and 4 (unknown)
    bits = np.frombuffer(draw(st.binary(min_size=1, max_size=8)), dtype=np.uint8).copy()
    trees = draw(st.integers(0, 3))
    roots = np.array(draw(st.lists(small, min_size=trees, max_size=trees)), dtype=np.int32)
    target = np.array(draw(st.lists(st.integers(-1, 3), min_size=trees, max_size=trees)), dtype=np.int32)
    params = np.array(
        [
            draw(st.integers(0, 2)),
            draw(st.integers(-1, 3)),
            draw(st.integers(0, 4)),
            0.1,
            draw(st.integers(0, 4)),
            2,
            0,
            0,
            0.5,
            2,
        ],
        dtype=np.float64,
    )
    return nodes, np.linspace(-1, 1, n), bits, roots, target, params


@FAST
@given(tables(), st.integers(1, 4), st.integers(1, 5), st.integers(0, 3))
def test_h2o_kernel_refuses_or_scores_random_tables(tabs: tuple[np.ndarray, ...], features: int, width: int, rows: int) -> None:
    nodes, values, bits, roots, target, params = tabs
    X = np.where(np.arange(rows * features).reshape(rows, features) % 3 == 0, np.nan, 1.0)
    dom_len = np.full(features, 4, dtype=np.int64)
    prior = np.ones(max(width - 1, 1))
    try:
        _h2o_trees.check_tables(nodes, values, bits, roots, target, features, width)
        checked = True
    except ValueError:
        checked = False
    preds = np.zeros((rows, width))
    try:
        _h2o_trees.score(
            X,
            np.zeros(rows),
            nodes,
            values,
            bits,
            roots,
            target,
            dom_len,
            params,
            prior,
            prior,
            preds,
            np.zeros(rows, dtype=np.uint8),
        )
    except ValueError:
        scored = False
    else:
        scored = True
        assert checked  # score() accepts only tables check_tables() accepts
    frozen = [a.copy() for a in (nodes, values, bits, roots, target, dom_len, params, prior, prior)]
    for array in frozen:
        array.flags.writeable = False
    try:
        held = _h2o_trees.tables(*frozen, width)
    except ValueError:
        assert not scored  # tables() refuses what score() refuses, and only that (the rows' shapes aside)
        return
    assert scored
    again = np.zeros((rows, width))
    _h2o_trees.score_tables(held, X, np.zeros(rows), again, np.zeros(rows, dtype=np.uint8), False)
    np.testing.assert_array_equal(again, preds)


def test_h2o_tables_are_held_read_only_and_rows_checked() -> None:
    """tables() takes only read-only arrays (what it checked cannot change); score_tables() checks the rows."""
    nodes = np.array([[0, 0, 0, 0, 0, -1, 0, 0]], dtype=np.int32)  # one leaf, one tree: a GBM regression
    arrays = [nodes, np.full(1, 0.25), np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32)]
    arrays += [np.full(2, -1, dtype=np.int64), np.array([0, 2, 0, 0.5, 1, 1, 0, 0, 0.5, 2]), np.ones(1), np.ones(1)]
    with pytest.raises(TypeError, match="nodes must be a read-only array"):
        _h2o_trees.tables(*arrays, 1)
    for array in arrays:
        array.flags.writeable = False
    held = _h2o_trees.tables(*arrays, 1)
    preds, ties = np.zeros((2, 1)), np.zeros(2, dtype=np.uint8)
    _h2o_trees.score_tables(held, np.zeros((2, 2)), np.zeros(2), preds, ties, True)  # no layout: the node table
    np.testing.assert_array_equal(preds, [[0.75], [0.75]])
    with pytest.raises(ValueError, match="do not fit the tables"):
        _h2o_trees.score_tables(held, np.zeros((2, 3)), np.zeros(2), preds, ties, False)
    with pytest.raises(ValueError, match="do not fit the tables"):
        _h2o_trees.score_tables(held, np.zeros((2, 2)), np.zeros(2), np.zeros((2, 2)), ties, False)
    with pytest.raises(TypeError, match="takes Tables"):
        _h2o_trees.score_tables(arrays, np.zeros((2, 2)), np.zeros(2), preds, ties, False)


# ---- the H2O reader: mutated tree files and model.ini are refused by name, or read into tables that score ------
_TREE_MOJOS = ["prostate_gbm_binomial.zip", "iris_drf_multinomial.zip", "prostate_gbm_highcard.zip"]


def _zip_files(name: str) -> dict[str, bytes]:
    with zipfile.ZipFile(FIXTURES / name) as z:
        return {n: z.read(n) for n in z.namelist()}


_FILES = {name: _zip_files(name) for name in _TREE_MOJOS}


@st.composite
def damaged_mojos(draw: Any) -> tuple[str, dict[str, bytes]]:
    name = draw(st.sampled_from(_TREE_MOJOS))
    files = dict(_FILES[name])
    target = draw(st.sampled_from(sorted(n for n in files if n.startswith("trees/") or n == "model.ini")))
    files[target] = draw(mutated(files[target]))
    return name, files


def _read(tmp: Path, files: dict[str, bytes]) -> Any:
    path = tmp / "fuzz.zip"
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return read_tree_model(path)


@FAST
@given(damaged_mojos())
def test_h2o_reader_refuses_damaged_files_or_reads_tables_that_score(
    tmp_path_factory: Any, case: tuple[str, dict[str, bytes]]
) -> None:
    _, files = case
    try:
        model = _read(tmp_path_factory.mktemp("mojo"), files)
    except InvalidMojo as exc:
        assert str(exc)
        return
    except Exception as exc:  # NativeUnsupported (e.g. a damaged algo name) leaves it to genmodel
        assert type(exc).__name__ == "NativeUnsupported", exc
        return
    scorer = NativeTreeScorer(model)  # check_tables passes for whatever the reader accepted
    rows = np.full((3, scorer.n_features), np.nan)
    rows[1] = 0.0
    rows[2] = 3.0
    assert scorer.score(rows).shape == (3, scorer.preds_size)


@FAST
@given(st.sampled_from(_TREE_MOJOS), st.data())
def test_h2o_flatten_of_any_tree_bytes_is_bounded_or_refused(name: str, data: Any) -> None:
    blob = data.draw(mutated(_FILES[name]["trees/t00_000.bin"]))
    try:
        table = flatten_trees([0], [blob])
    except InvalidMojo:
        return
    assert len(table.kind) <= len(blob)  # one node per byte at most: never expanded
    _h2o_trees.check_tables(node_table(table), table.split, table.bits, table.roots, table.target, 65535, 1)


# ---- _forest: the padded perfect-tree walk against the node-table walk, bit for bit ------------------------------
def _near(values: list[float]) -> list[float]:
    """Each value, its float64 and float32 neighbours, and its float32 rounding."""
    out = []
    with np.errstate(over="ignore"):
        for v in values:
            f = np.float32(v)
            out += [v, float(f), float(np.nextafter(v, np.inf)), float(np.nextafter(v, -np.inf))]
            out += [float(np.nextafter(f, np.float32(np.inf))), float(np.nextafter(f, np.float32(-np.inf)))]
    return out


#: Thresholds and row values: zeros of both signs, LightGBM's zero band, infinities, values beyond float32, and
#: values between float32 neighbours.
_EDGES = _near([0.0, 1e-35, -1e-35, float(np.float32(1e-35)), 1e-36, 0.1, -0.7, 1.5, 3.4e38, 1e39, -1e39])
_EDGES += [-0.0, np.inf, -np.inf, 1e300, -1e300]
_TREE_VALUES = st.sampled_from(_EDGES) | st.floats(-3, 3, allow_nan=False)


@st.composite
def random_trees(draw: Any, n_features: int, n_groups: int) -> dict[str, Any]:
    """One tree for ForestBuilder.add_tree: any shape up to depth 10 (over the padded bound of 8), any flags."""
    left: list[int] = []
    right: list[int] = []
    feature: list[int] = []
    flags: list[int] = []
    thresholds: list[float] = []
    cat_sets: dict[int, list[int]] = {}
    deep = draw(st.integers(0, 10))
    budget = draw(st.integers(1, 60))

    def node(depth: int) -> int:
        k = len(left)
        for column in (left, right, feature):
            column.append(-1)
        flags.append(0)
        thresholds.append(0.0)
        if depth < deep and len(left) < budget and draw(st.integers(0, 4)) > 0:
            feature[k] = draw(st.integers(0, n_features - 1))
            # default left, categorical (rare), in-set-left on a numeric node, missing kind 0-3
            flags[k] = (
                draw(st.integers(0, 1)) | (CATEGORICAL if draw(st.integers(0, 15)) == 0 else 0) | 4 * draw(st.integers(0, 1))
            )
            flags[k] |= draw(st.integers(0, 3)) << MISSING_SHIFT
            thresholds[k] = np.nan if draw(st.integers(0, 40)) == 0 else draw(_TREE_VALUES)
            if flags[k] & CATEGORICAL:
                cat_sets[k] = draw(st.lists(st.integers(0, 40), max_size=4))
            left[k] = node(depth + 1)
            right[k] = node(depth + 1)
        return k

    node(0)
    n = len(left)
    leaves = draw(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=n, max_size=n))
    return {
        "left": np.array(left),
        "right": np.array(right),
        "feature": np.array(feature),
        "flags": np.array(flags),
        "thresholds": np.array(thresholds),
        "leaves": np.array(leaves),
        "cover": np.ones(n),
        "group": draw(st.integers(0, n_groups - 1)),
        "weight": draw(st.sampled_from([1.0, 0.5, 1.25])),
        "cat_sets": cat_sets,
    }


@st.composite
def random_forests(draw: Any) -> tuple[Forest, np.ndarray]:
    n_features, n_groups = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    builder = ForestBuilder(n_features)
    for k in range(draw(st.integers(1, 12))):
        builder.add_tree(f"tree {k}", **draw(random_trees(n_features, n_groups)))
    forest = builder.build(
        [draw(st.floats(-1, 1))] * n_groups,
        draw(st.sampled_from([LT_F32, LE, LE_X_F32])),
        float32_sum=draw(st.booleans()),
        link=draw(st.sampled_from([IDENTITY, SIGMOID])),
        weighted=draw(st.booleans()),
    )
    rows = draw(st.sampled_from([0, 1, 2, 15, 16, 17, 40, 70]))
    pool = [*_EDGES, np.nan, *forest.thresholds.tolist()]
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=rows * n_features, max_size=rows * n_features))
    return forest, np.array([pool[p] for p in picks], dtype=np.float64).reshape(rows, n_features)


@FAST
@given(random_forests())
def test_forest_padded_walk_scores_what_the_node_table_walk_scores(case: tuple[Forest, np.ndarray]) -> None:
    forest, X = case
    assert forest.score(X).tobytes() == forest.score(X, padded=False).tobytes()
    # Trees with a categorical split are walked in the node table.
    ends = [*forest.roots.tolist(), len(forest.nodes)]
    for t, depth in enumerate(forest.layout.trees[:, 0].tolist()):
        if np.any(forest.nodes[ends[t] : ends[t + 1], FLAGS] & CATEGORICAL):
            assert depth == -1


@FAST
@given(
    random_forests(),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 12), st.integers(-3, 300)), min_size=1, max_size=4),
)
def test_forest_layout_check_refuses_indices_out_of_range(
    case: tuple[Forest, np.ndarray], edits: list[tuple[int, int, int]]
) -> None:
    """A damaged layout is refused by check_layout() or, when its indices stay in range, scores without a stray read."""
    forest, X = case
    arrays = tuple(a.copy() for a in forest.layout.tables)
    for which, at, value in edits:
        if which == 2 or arrays[which].size == 0:
            continue
        arrays[which].flat[at % arrays[which].size] = value
    try:
        _forest.check_layout(*forest.tables, *arrays, forest.n_features, forest.compare)
    except ValueError:
        return
    out = np.empty((len(X), forest.n_groups))
    _forest.score(X, *forest.tables, forest.params, forest.base, out, tuple(arrays))
