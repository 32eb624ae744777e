"""The C readers of request JSON (codecs/_ffjson.c) agree with orjson.loads and the Python conversions.

Every body either decodes in C to the very columns (names, order, dtypes, values) the Python path
makes of it, or is declined and then answered by the Python path: so the front-ends keep every
4xx message. Random bodies (seeded) mix regular records with every kind of damage.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import orjson
import pytest

from bench import payloads
from forestflow.api.basic import _frame_from_json
from forestflow.api.common import parse_json
from forestflow.codecs import _ffjson
from forestflow.codecs.ff_settings import fqrv_to_json
from forestflow.codecs.schema_datum import frame_from_json, frame_from_json_body, one_name_per_value, prediction_json
from forestflow.codecs.v1 import frame_from_instances
from forestflow.codecs.v2_request import loads, parse_inputs
from forestflow.core.frame import Frame, TensorSpec
from forestflow.errors import InvalidInput
from tests.codecs.test_schema_datum_json import FQ, FRAMES, oracle_schema_datum

SCORE_TYPES = ["String", "Float64", "Float32", "Float16", "Int64", "Int32", "Int16", "Int8", "Bool", "Bytes"]
TEXTS = ["", "a", "é", "naïve café", "日本語", "😀", 'quote " and \\ backslash', "tab\tnew\nline", "\u0000nul", "\u2028"]
NUMBERS: list[Any] = [
    0,
    -0.0,
    1,
    -1,
    0.5,
    6.7,
    1e-7,
    1.5e300,
    5e-324,
    2**53 + 1,
    2**62,
    -(2**63),
    127,
    128,
    32768,
    2**31,
    123456789.125,
]


def _same_column(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True)) and bool(np.all(np.signbit(a) == np.signbit(b)))
    return a.tolist() == b.tolist() and [type(v) for v in a.tolist()] == [type(v) for v in b.tolist()]


def _same_frame(a: Frame, b: Frame) -> bool:
    return (
        list(a.columns) == list(b.columns)
        and all(_same_column(a.columns[n], b.columns[n]) for n in a.columns)
        and a.parameters == b.parameters
    )


def _python_path(body: bytes) -> tuple[Frame, dict[str, str]] | str:
    """What the gateway answered before the C reader: the frame, or the 400 message."""
    try:
        return frame_from_json(parse_json(body))
    except InvalidInput as error:
        return error.message


def _front_end(body: bytes) -> tuple[Frame, dict[str, str]] | str:
    try:
        return _frame_from_json(body)
    except InvalidInput as error:
        return error.message


def _value(rng: random.Random, ff_type: str) -> Any:
    roll = rng.random()
    if roll < 0.04:
        return None
    if roll < 0.06:  # a value of another kind
        return rng.choice([True, "1", 1.5, [1], {"a": 1}, 2**64 - 1])
    if ff_type in ("String", "Bytes"):
        return rng.choice(TEXTS) if ff_type == "String" else rng.choice(["", "AAE=", "aGk=", "not base64!"])
    if ff_type == "Bool":
        return rng.random() < 0.5
    if ff_type.startswith("Float"):
        return rng.choice([*NUMBERS, rng.uniform(-1e6, 1e6), rng.randint(-1000, 1000)])
    return rng.choice([*NUMBERS[:7], rng.randint(-128, 127), rng.randint(-(2**40), 2**40), 2**63 - 1])


def _score_body(rng: random.Random) -> bytes:
    types = rng.sample(SCORE_TYPES, rng.randint(1, 3))
    names = iter(f"f{i}" for i in range(100))
    schema = [{"type": t, "fields": [next(names) for _ in range(rng.randint(1, 3))]} for t in types]
    datum = []
    for _ in range(rng.randint(0 if rng.random() < 0.05 else 1, 4)):
        tensors = [{t: {"data": [_value(rng, t) for _ in entry["fields"]]}} for t, entry in zip(types, schema)]
        datum.append({"tensors": tensors})
    body: dict[str, Any] = {"schema": schema, "datum": datum}
    if rng.random() < 0.5:
        body["configs"] = rng.choice([{"reqid": "x"}, {}, None, {"n": 1}, [], False])
    return _damaged(rng, orjson.dumps(body) if rng.random() < 0.9 else _reordered(body))


def _reordered(body: dict[str, Any]) -> bytes:
    """Datum before schema, and an unknown member: legal JSON the C reader declines."""
    return orjson.dumps({"extra": [1, {"x": None}], **{k: body[k] for k in reversed(list(body))}})


def _damaged(rng: random.Random, text: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.8 or not text:
        return text
    at = rng.randrange(len(text))
    if roll < 0.85:
        return text[:at]  # cut short
    if roll < 0.9:
        return text[:at] + bytes([rng.choice(b'{}[],:"\\\x00\xff\xc3 1en-.')]) + text[at:]  # a stray byte
    if roll < 0.95:
        return text[:at] + text[at + 1 :]  # a lost byte
    return text.replace(b'"', b"'", 1)


def test_the_bench_bodies_decode_in_c_to_the_python_frames() -> None:
    for rows in (1, 3, 100):
        body = payloads.score_body(rows)
        decoded = frame_from_json_body(body)
        assert decoded is not None, "the regular body must not fall back"
        expected = _python_path(body)
        assert not isinstance(expected, str)
        assert _same_frame(decoded[0], expected[0]) and decoded[1] == expected[1] == {"reqid": "bench"}
        assert decoded[0].columns["PSA"].dtype == np.float64 and decoded[0].columns["RACE"].dtype == object


def test_random_score_bodies_decode_as_the_python_path_does() -> None:
    rng = random.Random(37)
    in_c = 0
    for _ in range(3000):
        body = _score_body(rng)
        expected, got = _python_path(body), _front_end(body)
        if isinstance(expected, str):
            assert got == expected, body
            continue
        assert not isinstance(got, str), (body, got)
        assert _same_frame(got[0], expected[0]) and got[1] == expected[1], body
        in_c += frame_from_json_body(body) is not None
    assert in_c > 150  # the C reader took a fair share of the good bodies, not none of them


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "body: empty; expected JSON"),
        (b"{", "body: not valid JSON (unexpected end of data at position 1)"),
        (b'{"schema": [], "datum": []}', "schema: at least one entry is required"),
        (b'{"schema": [{"type": "Float64", "fields": ["a"]}], "datum": []}', "datum: at least one record is required"),
        (
            b'{"schema": [{"type": "Float64", "fields": ["a", "b"]}], "datum": [{"tensors": [{"Float64": {"data": [1, 2]}}]},'
            b' {"tensors": [{"Float64": {"data": [1]}}]}]}',
            "datum[1]: the Float64 tensor has 1 value(s) for 2 schema field(s)",
        ),
        (
            b'{"schema": [{"type": "Float64", "fields": ["a"]}], "datum": [{"tensors": [{"Float64": {"data": [1e400]}}]}]}',
            "body: not valid JSON (number is infinity when parsed as double at position 96)",
        ),
        (
            b'{"schema": [{"type": "Float64", "fields": ["a"]}], "datum": [{"tensors": [{"Float64": {"data": [true]}}]}]}',
            "field 'a': Float64 tensors take numbers",
        ),
        (
            b'{"schema": [{"type": "Int8", "fields": ["a"]}], "datum": [{"tensors": [{"Int8": {"data": [300]}}]}]}',
            "field 'a': value out of range for Int8",
        ),
        (
            b'{"schema": [{"type": "String", "fields": ["a"]}], "datum": [{"tensors": [{"String": {"data": ["\\ud800"]}}]}]}',
            "body: not valid JSON (no low surrogate in string at position 95)",
        ),
        (
            b'{"schema": [{"type": "String", "fields": ["a"]}], "datum": [{"tensors": [{"String": {"data": ["\xff"]}}]}]}',
            "body: not valid JSON (str is not valid UTF-8: surrogates not allowed at position 0)",
        ),
    ],
)
def test_bad_bodies_get_the_messages_they_always_got(body: bytes, message: str) -> None:
    assert _python_path(body) == message
    assert _front_end(body) == message


@pytest.mark.parametrize("name", ["Float64\u0000junk", "Int8\u0000", "String\u0000\u0000"])
def test_a_type_name_with_a_nul_inside_is_refused_by_both_paths(name: str) -> None:
    """The C reader compared the UTF-8 name with strcmp, so "Float64\\0junk" read as Float64."""
    key = name.split("\u0000")[0]
    value = "a" if key == "String" else 1
    body = orjson.dumps({"schema": [{"type": name, "fields": ["x"]}], "datum": [{"tensors": [{key: {"data": [value]}}]}]})
    assert _ffjson.score_request(body) is None
    message = _python_path(body)
    assert isinstance(message, str) and message.startswith("schema[0].type: unknown tensor type"), message
    assert _front_end(body) == message


def test_strings_nulls_and_large_numbers_read_exactly() -> None:
    texts = [*TEXTS, None]
    body = orjson.dumps(
        {
            "schema": [
                {"type": "String", "fields": ["s"]},
                {"type": "Float64", "fields": ["x"]},
                {"type": "Int64", "fields": ["i"]},
            ],
            "datum": [
                {"tensors": [{"String": {"data": [t]}}, {"Float64": {"data": [x]}}, {"Int64": {"data": [i]}}]}
                for t, x, i in zip(
                    texts, [None, 0.1, 1e-7, 5e-324, 1.7976931348623157e308, -0.0, 2**53 + 1, 3, 1e22, 1e23, 0.3], range(11)
                )
            ],
        }
    ).replace(b'"\\u0000nul"', b'"\\u0000n\\u0075l"')  # an escape orjson does not write
    decoded = frame_from_json_body(body)
    assert decoded is not None
    columns = decoded[0].columns
    assert columns["s"].tolist() == texts
    assert math.isnan(columns["x"][0]) and columns["x"][1:].tolist() == [
        0.1,
        1e-7,
        5e-324,
        1.7976931348623157e308,
        -0.0,
        2.0**53,
        3.0,
        1e22,
        1e23,
        0.3,
    ]
    assert columns["i"].dtype == np.int64 and columns["i"].tolist() == list(range(11))
    assert _same_frame(decoded[0], frame_from_json(orjson.loads(body))[0])


def test_random_numbers_read_as_orjson_reads_them() -> None:
    rng = random.Random(5)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(3000)]
    texts = (
        [repr(v) for v in values]
        + [f"{v:.{rng.randint(0, 17)}e}" for v in values]
        + [f"{rng.randint(0, 10**15)}.{rng.randint(0, 999)}" for _ in values]
    )
    body = (
        '{"schema":[{"type":"Float64","fields":["x"]}],"datum":['
        + ",".join('{"tensors":[{"Float64":{"data":[' + t + "]}}]}" for t in texts)
        + "]}"
    ).encode()
    decoded = frame_from_json_body(body)
    assert decoded is not None
    assert decoded[0].columns["x"].tolist() == [float(t) for t in texts]


# ---- V2 -----------------------------------------------------------------------------------------
V2_TYPES = ["FP64", "FP32", "FP16", "INT64", "INT32", "INT8", "UINT8", "UINT64", "BOOL", "BYTES", "FOO"]


def _v2_data(rng: random.Random, datatype: str, n: int) -> Any:
    kind = rng.choice(["ints", "floats", "bools", "texts", "mixed", "nested", "nulls"] if rng.random() < 0.3 else [datatype])
    pick = {
        "ints": lambda: rng.choice([0, 1, -1, 127, 255, 2**40, -(2**63), 2**64 - 1, 2**63]),
        "floats": lambda: rng.choice([0.5, -0.0, 1e-7, 3.0, 1e300, 1e39]),
        "bools": lambda: rng.random() < 0.5,
        "texts": lambda: rng.choice(TEXTS),
        "nulls": lambda: rng.choice([None, 1.5, 2]),
        "mixed": lambda: rng.choice([1, 2.5, True, "x", None]),
    }
    by_type = {"BOOL": "bools", "BYTES": "texts", "FOO": "ints"}
    kind = by_type.get(kind, "floats" if kind.startswith("FP") else "ints" if kind in V2_TYPES else kind)
    if kind == "nested":
        return [[pick["ints"]()] for _ in range(n)]
    return [pick[kind]() for _ in range(n)]


def _v2_body(rng: random.Random) -> bytes:
    inputs = []
    for i in range(rng.randint(1, 3)):
        datatype, n = rng.choice(V2_TYPES), rng.randint(0, 4)
        item: dict[str, Any] = {"name": f"in{i}", "shape": [n if rng.random() < 0.95 else n + 1], "datatype": datatype}
        item["data"] = _v2_data(rng, datatype, n)
        if rng.random() < 0.1:  # data before its datatype: read as lists
            item = {"data": item.pop("data"), **item}
        inputs.append(item)
    body: dict[str, Any] = {"id": "r", "inputs": inputs, "parameters": {"content_type": "pd"}}
    if rng.random() < 0.2:
        body["outputs"] = [{"name": "o", "parameters": {"binary_data": False}}]
    return _damaged(rng, orjson.dumps(body))


def _v2_python(head: bytes) -> list[tuple[str, str, np.ndarray]] | str:
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        return f"body: not valid JSON ({exc.msg} at position {exc.pos})"
    return _tensors(doc)


def _tensors(doc: Any) -> list[tuple[str, str, np.ndarray]] | str:
    try:
        if not isinstance(doc, dict):
            return "not an object"
        return [(t.name, t.datatype, t.array) for t in parse_inputs(doc, memoryview(b""))]
    except InvalidInput as error:
        return error.message


def _v2_front_end(head: bytes) -> list[tuple[str, str, np.ndarray]] | str:
    try:
        doc = loads(head)
    except InvalidInput as error:
        return error.message
    return _tensors(doc)


def test_random_v2_bodies_decode_as_the_python_path_does() -> None:
    rng = random.Random(2)
    typed = 0
    for _ in range(3000):
        head = _v2_body(rng)
        expected, got = _v2_python(head), _v2_front_end(head)
        if isinstance(expected, str):
            assert got == expected, head
            continue
        assert not isinstance(got, str), (head, got)
        assert [(n, d) for n, d, _ in got] == [(n, d) for n, d, _ in expected], head
        assert all(_same_column(a, b) for (_, _, a), (_, _, b) in zip(got, expected)), head
        doc = _ffjson.v2_request(head)
        typed += doc is not None and any(isinstance(i.get("data"), np.ndarray) for i in doc["inputs"])
    assert typed > 500


def test_v2_documents_equal_orjson_but_for_typed_data() -> None:
    body = payloads.v2_body(5)
    doc = _ffjson.v2_request(body)
    assert doc is not None
    expected = orjson.loads(body)
    for item, want in zip(doc["inputs"], expected["inputs"]):
        assert isinstance(item["data"], np.ndarray) and item["data"].tolist() == want["data"]
        item["data"] = want["data"]
    assert doc == expected


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b" ",
        b"[]",
        b"null",
        b'{"a":1,}',
        b'{"a":01}',
        b'{"a":"\x01"}',
        b'\xef\xbb\xbf{"a":1}',
        b'{"a":1} x',
        b'{"a":' + b"[" * 600 + b"]" * 600 + b"}",
    ],
)
def test_what_the_v2_reader_declines_orjson_decides(body: bytes) -> None:
    assert _ffjson.v2_request(body) is None
    try:
        expected: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        with pytest.raises(InvalidInput, match="body: not valid JSON"):
            loads(body)
    else:
        assert loads(body) == expected


# ---- answers ------------------------------------------------------------------------------------
def _answer_frames() -> list[Frame]:
    rng = random.Random(11)
    frames = list(FRAMES.values())
    for _ in range(300):
        rows = rng.randint(1, 6)
        columns: dict[str, np.ndarray] = {}
        for i in range(rng.randint(1, 4)):
            kind = rng.choice(["text", "float", "bool", "vector"])
            if kind == "text":
                columns[f"c{i}"] = np.array([rng.choice([*TEXTS, '"],["', "],[", None]) for _ in range(rows)], dtype=object)
            elif kind == "float":
                columns[f"c{i}"] = np.array([rng.choice([*map(float, NUMBERS), math.nan, 1e-5, 1e16]) for _ in range(rows)])
            elif kind == "bool":
                columns[f"c{i}"] = np.array([rng.random() < 0.5 for _ in range(rows)])
            else:
                columns[f"c{i}"] = np.array([[rng.uniform(-9, 9) for _ in range(2)] for _ in range(rows)])
        frames.append(Frame(columns))
    return frames


def test_prediction_json_is_byte_for_byte_orjson_of_the_per_row_construction() -> None:
    for frame in _answer_frames():
        schema, datum = oracle_schema_datum(one_name_per_value(frame))
        expected = {"fqrv": fqrv_to_json(FQ), "schema": schema, "datum": datum}
        assert prediction_json(FQ, frame) == orjson.dumps(expected, option=orjson.OPT_SERIALIZE_NUMPY), frame


def test_datum_declines_groups_of_another_number_of_rows() -> None:
    assert _ffjson.datum(2, [b"<"], [b"[[1],[2]]"], b">") == b"[<[1]>,<[2]>]"
    assert _ffjson.datum(2, [b"<"], [b"[[1]]"], b">") is None
    assert _ffjson.datum(1, [b"<"], [b"[[1],[2]]"], b">") is None
    assert _ffjson.datum(1, [b"<", b"|"], [b'[["],[\\""]]', b"[[true]]"], b">") == b'[<["],[\\""]|[true]>]'
    assert _ffjson.datum(0, [b"<"], [b"[]"], b">") == b"[]"


# ---- V1 -----------------------------------------------------------------------------------------
def _v1_reference(instances: list[Any], names: list[str]) -> dict[str, list[Any]]:
    """The table of instances value by value (what frame_from_instances did before zip/map)."""
    if all(isinstance(row, dict) for row in instances):
        order = list(names)
        for row in instances:
            order.extend(k for k in row if k not in names and k not in order)
        return {n: [row.get(n) for row in instances] for n in order if any(n in row for row in instances)}
    return {n: [row[j] for row in instances] for j, n in enumerate(names)}


def test_v1_instances_make_the_columns_of_the_value_by_value_table() -> None:
    rng = random.Random(3)
    specs = [TensorSpec("a", "FP64"), TensorSpec("b", "BYTES"), TensorSpec("c", "INT64")]
    names = [s.name for s in specs]
    for _ in range(300):
        rows = rng.randint(1, 5)
        if rng.random() < 0.5:
            instances: list[Any] = [[rng.uniform(-5, 5), rng.choice(TEXTS), rng.randint(-9, 9)] for _ in range(rows)]
            if rng.random() < 0.2:
                instances[rng.randrange(rows)].pop()  # a short row: the error names it
        else:
            keys = [*names, "extra"]
            instances = []
            for _ in range(rows):
                values = [rng.uniform(-5, 5), rng.choice(TEXTS), rng.randint(-9, 9), 1]
                instances.append({k: v for k, v in zip(keys, values) if k == "c" or rng.random() < 0.8})
        try:
            got: Any = frame_from_instances(instances, specs, {})
        except InvalidInput as error:
            got = error.message
        if isinstance(got, str):
            bad = next(i for i, row in enumerate(instances) if isinstance(row, list) and len(row) != 3)
            assert got == f"instances[{bad}]: expected 3 values (a, b, c), got {len(instances[bad])}"
            continue
        table = _v1_reference(instances, names)
        assert list(got.columns) == list(table)
        for name, values in table.items():
            if name == "a":
                assert np.array_equal(got.columns[name], np.array([math.nan if v is None else v for v in values]), equal_nan=True)
            else:
                assert got.columns[name].tolist() == values
