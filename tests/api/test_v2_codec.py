"""np / pd layouts (TrustyAI, MLServer) and the tensor encodings, unit-level and over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forestflow.codecs.v2 import decode_inputs, encode_outputs
from forestflow.codecs.v2_tensor import (
    Tensor,
    array_from_json,
    array_from_raw,
    json_data,
    raw_bytes,
    split_bytes,
)
from forestflow.core.frame import Frame, TensorSpec
from forestflow.errors import InvalidInput
from tests.support import InProcessGateway, python_servable

LINEAR = Path(__file__).with_name("servables")
SPECS = (TensorSpec("a", "FP64"), TensorSpec("b", "FP64"), TensorSpec("c", "FP64"))
ROWS = [[1.0, 2.0, 3.0], [0.5, -1.0, 4.0], [10.0, 0.0, -2.0], [7.0, 7.0, 7.0]]


def t(name: str, array: Any, datatype: str = "FP64") -> Tensor:
    return Tensor(name, datatype, np.asarray(array, dtype=object if datatype == "BYTES" else None))


# ---- element encodings -----------------------------------------------------------------------------
@pytest.mark.parametrize("datatype", ["BOOL", "INT8", "UINT16", "INT32", "UINT64", "FP16", "FP32", "FP64", "BYTES"])
def test_raw_round_trip(datatype: str) -> None:
    values = {"BOOL": [True, False, True, True], "BYTES": ["x", "ÿ", "", "long text"]}.get(datatype, [1, 2, 3, 4])
    array = array_from_json("v", datatype, [2, 2], values)
    again = array_from_raw("v", datatype, [2, 2], raw_bytes(array, datatype))
    assert again.shape == (2, 2) and again.tolist() == array.tolist()


def test_bytes_layout_is_length_prefixed_and_non_utf8_stays_bytes() -> None:
    blob = raw_bytes(np.array(["ab", b"\xff"], dtype=object), "BYTES")
    assert blob == b"\x02\x00\x00\x00ab\x01\x00\x00\x00\xff"
    assert array_from_raw("s", "BYTES", [2], blob).tolist() == [b"ab", b"\xff"]
    with pytest.raises(InvalidInput, match="'s'.*runs past"):
        split_bytes("s", blob[:-1], 2)


def test_json_decoding_accepts_nested_and_null_as_nan() -> None:
    assert array_from_json("v", "FP32", [2, 2], [[1, 2], [3, 4]]).dtype == np.float32
    assert np.isnan(array_from_json("v", "FP64", [2], [1.0, None])[1])
    with pytest.raises(InvalidInput, match="out of range"):
        array_from_json("v", "UINT8", [1], [300])
    with pytest.raises(InvalidInput, match="true/false"):
        array_from_json("v", "BOOL", [1], [1])
    # Found by fuzzing: these were 500s.
    assert array_from_json("v", "UINT64", [2], [True, 2**64 - 1]).tolist() == [1, 2**64 - 1]
    with pytest.raises(InvalidInput, match="out of range for FP32"):
        array_from_json("v", "FP32", [1], [1e308])
    with pytest.raises(InvalidInput, match="in range"):
        array_from_json("v", "INT64", [1], [2**70])
    assert json_data(np.array([1.5, np.nan]), "FP64").tolist()[0] == 1.5


# ---- layout detection --------------------------------------------------------------------------------
def decoded(tensors: list[Tensor], parameters: dict[str, Any] | None = None) -> tuple[dict[str, list[float]], Any]:
    frame, layout = decode_inputs(tensors, SPECS, parameters or {})
    return {n: c.tolist() for n, c in frame.columns.items()}, layout


EXPECTED = {"a": [1.0, 0.5, 10.0, 7.0], "b": [2.0, -1.0, 0.0, 7.0], "c": [3.0, 4.0, -2.0, 7.0]}
COLS = {n: [r[j] for r in ROWS] for j, n in enumerate("abc")}


@pytest.mark.parametrize(
    ("case", "tensors", "content_type", "rank"),
    [
        ("np, TrustyAI name", [t("predict", ROWS)], "np", 2),
        ("np, explicit", [t("a", ROWS)], "np", 2),
        ("np, named like an input", [t("a", ROWS)], "np", 2),
        ("pd 1-D", [t(n, COLS[n]) for n in "abc"], "pd", 1),
        ("pd MLServer [N,1]", [t(n, [[v] for v in COLS[n]]) for n in "abc"], "pd", 2),
        ("pd TrustyAI [1,N]", [t(n, [COLS[n]]) for n in "abc"], "pd", 2),
        ("pd mixed forms", [t("a", COLS["a"]), t("b", [COLS["b"]]), t("c", [[v] for v in COLS["c"]])], "pd", 2),
    ],
)
def test_layouts_decode_to_the_same_columns(case: str, tensors: list[Tensor], content_type: str, rank: int) -> None:
    params = {"content_type": "np"} if case == "np, explicit" else {}
    columns, layout = decoded(tensors, params)
    assert columns == EXPECTED
    assert (layout.content_type, layout.rank) == (content_type, rank)


def test_one_row_ambiguity_is_resolved_with_the_model_inputs() -> None:
    # [1, 3] named after no input: one row of the three features (np).
    columns, layout = decoded([t("predict", [[1.0, 2.0, 3.0]])])
    assert columns == {"a": [1.0], "b": [2.0], "c": [3.0]} and layout.content_type == "np"
    # [1, 3] named after a one-value-per-row input: three rows of that feature (TrustyAI pd).
    frame, layout = decode_inputs([t("a", [[1.0, 2.0, 3.0]])], SPECS, {})
    assert frame["a"].tolist() == [1.0, 2.0, 3.0] and layout.content_type == "pd"
    # TrustyAI's single-row pd: shape [1] per feature.
    columns, layout = decoded([t(n, [COLS[n][0]]) for n in "abc"])
    assert columns == {n: [COLS[n][0]] for n in "abc"} and layout.rank == 1
    # np for a one-input model: [1, N] is N rows (TrustyAI pd of the only feature), [N] too.
    one = (TensorSpec("a", "FP64"),)
    assert decode_inputs([t("predict", [[1.0, 2.0]])], one, {})[0]["a"].tolist() == [1.0, 2.0]
    assert decode_inputs([t("predict", [1.0, 2.0])], one, {})[0]["a"].tolist() == [1.0, 2.0]


def test_layout_errors_name_the_input() -> None:
    with pytest.raises(InvalidInput, match=r"'predict'.*\[N, 3\]"):
        decoded([t("predict", [[1.0, 2.0]])])
    with pytest.raises(InvalidInput, match="disagree"):
        decoded([t("a", [1.0, 2.0]), t("b", [1.0])])
    with pytest.raises(InvalidInput, match="np layout takes one"):
        decoded([t("a", [1.0]), t("b", [1.0])], {"content_type": "np"})
    with pytest.raises(InvalidInput, match="'b'.*one value per row"):
        decoded([t("a", [1.0, 2.0]), t("b", [[1.0, 2.0], [3.0, 4.0]])])


def test_mlserver_base64_inputs_are_decoded() -> None:
    tensor = Tensor("a", "BYTES", np.array(["aGk=", "/w=="], dtype=object), {"content_type": "base64"})
    frame, _ = decode_inputs([tensor], (TensorSpec("a", "BYTES"),), {})
    assert frame["a"].tolist() == [b"hi", b"\xff"]
    tensor.array[1] = "not base64!"
    with pytest.raises(InvalidInput, match="'a'.*base64"):
        decode_inputs([tensor], (TensorSpec("a", "BYTES"),), {})


def test_outputs_are_batch_first_in_the_request_rank() -> None:
    frame = Frame({"y": np.arange(4.0), "pair": np.arange(8.0).reshape(4, 2)})
    _, rank2 = decoded([t("predict", ROWS)])
    out = encode_outputs(frame, rank2)
    assert [(o.name, o.shape) for o in out] == [("y", [4, 1]), ("pair", [4, 2])]
    _, rank1 = decoded([t(n, COLS[n]) for n in "abc"])
    assert [o.shape for o in encode_outputs(frame, rank1, ["pair", "y"])] == [[4, 2], [4]]


# ---- over HTTP: every layout scores identically -------------------------------------------------------
async def test_np_mlserver_pd_and_trustyai_pd_score_identically(gw: InProcessGateway) -> None:
    body = python_servable(directory=LINEAR, module="linear.py")
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()
    n = len(ROWS)
    flat = [v for row in ROWS for v in row]
    requests = {
        "np": {"inputs": [{"name": "predict", "shape": [n, 3], "datatype": "FP64", "data": flat}]},
        "np nested": {
            "parameters": {"content_type": "np"},
            "inputs": [{"name": "input-0", "shape": [n, 3], "datatype": "FP64", "data": ROWS}],
        },
        "mlserver pd": {
            "parameters": {"content_type": "pd"},
            "inputs": [{"name": c, "shape": [n, 1], "datatype": "FP64", "data": COLS[c]} for c in "abc"],
        },
        "trustyai pd": {"inputs": [{"name": c, "shape": [1, n], "datatype": "FP64", "data": [COLS[c]]} for c in "abc"]},
        "1-D pd": {"inputs": [{"name": c, "shape": [n], "datatype": "FP64", "data": COLS[c]} for c in "abc"]},
    }
    expected_y = [a + 2 * b + 3 * c for a, b, c in ROWS]
    for case, payload in requests.items():
        async with gw.session.post(gw.url + "/v2/models/acme.demo.1/infer", json=payload) as r:
            assert r.status == 200, (case, await r.text())
            reply = await r.json()
        y, pair = reply["outputs"]
        assert y["data"] == expected_y, case
        assert pair["shape"] == [n, 2] and pair["data"][1::2] == expected_y, case  # never [1, N*k]
        assert y["shape"] == ([n] if case == "1-D pd" else [n, 1]), case
        explicit = payload.get("parameters", {}).get("content_type")
        assert reply.get("parameters") == ({"content_type": explicit} if explicit else None), case
