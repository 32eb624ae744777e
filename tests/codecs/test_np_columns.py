"""The np reader (``_ffjson.v2_np``): one numeric ``[N, F]`` V2 tensor read straight into F columns.

Whatever it takes must be a body the general path decodes without an error into the very same
columns (dtype, values, NaN and the sign of zero) with the same parameters and id; whatever else
it declines, and the general path answers it (with its 4xx when the body is wrong). Random bodies
(seeded) mix every datatype, values at the edges of each, flat and nested data, shape and count
mismatches and damaged JSON.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import orjson

from forestflow.codecs import _ffjson
from forestflow.codecs.v2 import NP, decode_inputs
from forestflow.codecs.v2_request import loads, parse_inputs
from forestflow.core.frame import TensorSpec
from tests.codecs.test_json_columns import _damaged, _same_column

NP_TYPES = ["FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"]
#: Datatypes the reader leaves to the general path, and misspellings of taken ones.
OTHER_TYPES = ["FP16", "BYTES", "fp32", "FP32 ", "BF16", "INT128"]
EDGES: list[Any] = [
    0,
    -0.0,
    1,
    -1,
    0.5,
    -2.75,
    1e-46,  # below FP32's smallest subnormal: 0
    3.4028234663852886e38,
    3.4028235677973362e38,  # rounds to FP32's largest finite value
    3.4028235677973366e38,  # half way past it: rounds to infinity
    3.5e38,  # past it: infinity
    1e39,
    1.5e300,
    5e-324,
    127,
    128,
    -128,
    -129,
    255,
    256,
    32767,
    32768,
    65535,
    65536,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,  # rounds differently through a double
    2**62,
    -(2**63),
    10**18,
    10**19,
    16777217,  # FP32 rounds it
]


def _value(rng: random.Random, datatype: str) -> Any:
    roll = rng.random()
    if datatype == "BOOL":
        return rng.random() < 0.5 if roll < 0.97 else rng.choice([0, 1, None])
    if roll < 0.5:
        return rng.randint(-100, 100) if datatype.startswith(("INT", "UINT")) else round(rng.gauss(0, 4), rng.randint(0, 6))
    if roll < 0.9:
        return rng.choice(EDGES)
    return rng.choice([None, True, False, "1", [1], {}])


def np_body(rng: random.Random) -> bytes:
    """A V2 body of one ``[N, F]`` tensor, usually regular, sometimes not (see the module docstring)."""
    datatype = rng.choice(NP_TYPES) if rng.random() < 0.95 else rng.choice(OTHER_TYPES)
    rows, width = rng.randint(1, 4), rng.randint(1, 4)
    kind = rng.choice(["int", "float", "mixed"]) if rng.random() < 0.7 else "any"
    values = []
    for _ in range(rows * width):
        v = _value(rng, datatype)
        if kind == "int" and isinstance(v, float) and datatype != "BOOL":
            v = int(v) if math.isfinite(v) and abs(v) < 1e18 else 0
        elif kind == "float" and type(v) is int:
            v = float(v) + 0.5
        values.append(v)
    layout = rng.random()
    if layout < 0.5:
        data: Any = values
    elif layout < 0.8:
        data = [values[i * width : (i + 1) * width] for i in range(rows)]
    elif layout < 0.9:
        data = [values[i : i + 1] for i in range(len(values))]  # rows of one: another rectangle
    else:
        data = [values[:1], values[1:]] if len(values) > 2 else [values, [[v] for v in values]]  # ragged or deeper
    if rng.random() < 0.1:
        data = data[:-1] if rng.random() < 0.5 else [*data, data[0]]
    shape: Any = [rows, width]
    if rng.random() < 0.1:
        shape = rng.choice([[rows * width], [rows, width, 1], [rows, width + 1], [rows, -width], [float(rows), width], []])
    item: dict[str, Any] = {"name": rng.choice(["input-0", "x", "é", ""]), "shape": shape, "datatype": datatype, "data": data}
    if rng.random() < 0.3:
        item = dict(rng.sample(list(item.items()), len(item)))
    if rng.random() < 0.05:
        item["parameters"] = {"content_type": "np"}
    if rng.random() < 0.05:
        item["extra"] = [1, {"y": None}]
    body: dict[str, Any] = {"inputs": [item]}
    if rng.random() < 0.3:
        body["id"] = rng.choice(["r1", 7, None, True, [1]])
    if rng.random() < 0.3:
        body["parameters"] = rng.choice([{"content_type": "np"}, {"a": 1}, {}, {"binary_data_output": True}])
    if rng.random() < 0.1:
        body["model_name"] = "m"
    if rng.random() < 0.05:
        body["outputs"] = [{"name": "o"}]
    if rng.random() < 0.05:
        body["inputs"].append({**item, "name": "second"})
    if rng.random() < 0.3:
        body = dict(rng.sample(list(body.items()), len(body)))
    return _damaged(rng, orjson.dumps(body))


def check_v2_np(head: bytes) -> bool:
    """What ``v2_np`` takes is JSON whose general decoding gives the same columns, parameters and id
    (and the np layout, one column per model input); True when it took the body."""
    got = _ffjson.v2_np(head)
    if got is None:
        return False
    name, rows, values, parameters, client_id = got
    doc = loads(head)
    assert isinstance(doc, dict) and "outputs" not in doc, head
    assert doc.get("parameters") == parameters and doc.get("id") == client_id, head
    (tensor,) = parse_inputs(doc, memoryview(b""))  # raises when the general path refuses it
    assert tensor.name == name and tensor.array.shape == (rows, len(values)) and not tensor.parameters, head
    specs = tuple(TensorSpec(f"f{j}", tensor.datatype) for j in range(len(values)))
    frame, layout = decode_inputs([tensor], specs, {"content_type": NP})
    assert layout.content_type == NP and layout.rank == 2, head
    assert list(frame.columns) == [s.name for s in specs], head
    for column, value in zip(frame.columns.values(), values):
        assert _same_column(value, column), (head, value, column)
    return True


def test_the_np_request_is_read_into_columns() -> None:
    body = b'{"inputs":[{"name":"input-0","shape":[2,3],"datatype":"FP32","data":[[1,2.5,-0.0],[4,null,6]]}],"id":"a"}'
    name, rows, values, parameters, client_id = _ffjson.v2_np(body) or ((), 0, (), None, None)
    assert (name, rows, parameters, client_id) == ("input-0", 2, None, "a")
    assert [v.dtype for v in values] == [np.float32] * 3
    assert [v.tolist() for v in values[:2]] == [[1.0, 4.0], [2.5, np.float32(np.nan).item()]] or np.isnan(values[1][1])
    assert check_v2_np(body)


def test_what_the_general_path_refuses_or_converts_otherwise_is_declined() -> None:
    def body(datatype: str, shape: list[Any], data: Any) -> bytes:
        return orjson.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]})

    declined = [
        body("FP32", [1, 2], [1.0, 1e39]),  # past FP32's range
        body("INT8", [1, 2], [1, 128]),  # past INT8's range
        body("INT32", [1, 2], [1, 2.0]),  # a float for an integer type (the general path converts it)
        body("UINT8", [1, 2], [1, -1]),
        body("FP32", [1, 2], [1.0, True]),  # a boolean among numbers
        body("BOOL", [1, 2], [True, 1]),
        body("FP32", [2, 2], [1.0, 2.0, 3.0]),  # the count is not the shape's
        body("FP32", [2, 2], [[1.0, 2.0], [3.0]]),  # ragged
        body("FP32", [2, 1], [[[1.0]], [[2.0]]]),  # deeper
        body("FP32", [4], [1.0, 2.0, 3.0, 4.0]),  # one axis: pd or a one-input model's rows
        body("FP16", [1, 2], [1.0, 2.0]),
        body("FP32", [0, 2], []),
        body("INT64", [1, 1], [10**19]),  # orjson reads it as unsigned
        body("INT64", [1, 1], [2**53 + 1]),  # not exact in a double: left to the general path
        b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1],"parameters":{"binary_data_size":4}}]}',
        b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1]}],"outputs":[{"name":"p"}]}',
        b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1]},{"name":"y","shape":[1,1],"datatype":"FP32","data":[1]}]}',
        b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1]}],"id":1,"id":2}',
    ]
    for head in declined:
        assert _ffjson.v2_np(head) is None, head
    assert check_v2_np(body("FP32", [1, 2], [3.4028235677973362e38, -1e-46]))  # FP32's largest, and -0.0
    assert check_v2_np(body("INT8", [1, 2], [-128, 127])) and check_v2_np(body("BOOL", [1, 2], [True, False]))
    assert check_v2_np(body("FP64", [2, 2], [[1, 2], [3, 4]]))  # integers only: converted from int64, as numpy does
    assert check_v2_np(body("FP32", [1, 2], [16777217, 2**53]))  # rounded once, from the integer
    assert check_v2_np(body("FP32", [1, 2], [16777217, 0.5]))  # through a double, as np.array([...]) holds it
    skipped = b'{"model_name":"m","inputs":[{"name":"x","extra":{"a":[1]},"shape":[1,1],"datatype":"UINT64","data":[5]}]}'
    assert check_v2_np(skipped)


def test_random_np_bodies_are_taken_only_as_the_general_path_reads_them() -> None:
    rng, taken, types = random.Random(45), 0, set()
    for _ in range(4000):
        head = np_body(rng)
        if check_v2_np(head):
            taken += 1
            types.add(orjson.loads(head)["inputs"][0]["datatype"])
    assert taken > 300 and types == set(NP_TYPES), (taken, types)
