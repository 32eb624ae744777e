"""What a model declares is checked before it runs, on every front-end (issue 42 item 8).

A declared input sent with a datatype of another kind, or a shape its declaration (``-1`` = any
size) does not admit, is a 400 / INVALID_ARGUMENT naming the input, the expected and the received
datatype or shape, as Triton answers (it was the model's 500). Numbers of another numeric type are
converted exactly; the np and pd layouts still decode as before; answers follow the declared
output shapes. Models: ``vector.py`` (INPUT0 FP32 [-1, 4] -> OUTPUT0 FP32 [-1, 2]) and
``typed.py`` (q INT8 [-1, 2], u UINT8 [-1] -> total INT64 [-1]).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from graphpipe import convert

from forestflow._proto.graphpipe.Type import Type
from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from tests.api.v2_support import V2Gateway, v2_gateway
from tests.api_gp.helpers import raw_tensor_request
from tests.support import python_servable

SERVABLES = Path(__file__).with_name("servables")
VECTOR, TYPED = "acme.demo.1", "acme.demo.2"
M = messages()


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "data") as gateway:
        for n, module in ((1, "vector.py"), (2, "typed.py")):
            await gateway.deploy(python_servable(contract=("acme", "demo", n), directory=SERVABLES, module=module))
        await gateway.deploy(python_servable(contract=("acme", "demo", 3)))  # the echo model: x FP64, label BYTES
        yield gateway


def tensor(name: str, datatype: str, shape: list[int], data: list[Any]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


REFUSED = [
    (VECTOR, [tensor("INPUT0", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])], "input 'INPUT0': expected shape [-1, 4], got [2, 3]"),
    (VECTOR, [tensor("INPUT0", "BYTES", [1, 4], ["a", "b", "c", "d"])], "input 'INPUT0': expected datatype FP32, got BYTES"),
    (
        TYPED,
        [tensor("q", "INT8", [2, 2], [1, 2, 3, 4]), tensor("u", "UINT8", [2, 2], [1, 2, 3, 4])],
        "input 'u': expected one value per row",
    ),
    (
        TYPED,
        [tensor("q", "BOOL", [1, 2], [True, False]), tensor("u", "UINT8", [1], [1])],
        "input 'q': expected datatype INT8, got BOOL",
    ),
    (
        TYPED,
        [tensor("q", "INT32", [1, 2], [300, 1]), tensor("u", "UINT8", [1], [1])],
        "input 'q': INT32 values sent for INT8: value out of range for INT8",
    ),
]


@pytest.mark.parametrize(("model", "inputs", "message"), REFUSED)
async def test_v2_rest_and_grpc_refuse_what_the_model_does_not_declare(
    gw: V2Gateway, model: str, inputs: list[dict[str, Any]], message: str
) -> None:
    status, body, _ = await gw.post_json(f"/v2/models/{model}/infer", {"inputs": inputs})
    assert status == 400 and message in body["error"], body
    request = M["ModelInferRequest"](model_name=model)
    for item in inputs:
        entry = request.inputs.add(name=item["name"], datatype=item["datatype"], shape=item["shape"])
        field = {
            "FP32": "fp32_contents",
            "BYTES": "bytes_contents",
            "BOOL": "bool_contents",
            "INT8": "int_contents",
            "INT32": "int_contents",
            "UINT8": "uint_contents",
        }[item["datatype"]]
        values = [v.encode() for v in item["data"]] if item["datatype"] == "BYTES" else item["data"]
        getattr(entry.contents, field).extend(values)
    async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M["ModelInferResponse"].FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (caught.value.details() or "")


async def test_what_fits_is_scored_and_answers_follow_the_declared_output_shapes(gw: V2Gateway) -> None:
    # Triton's layout: a vector input [N, 2] and a one-value input [N]; total is declared [-1]: [N], not [N, 1].
    typed = [tensor("q", "INT8", [2, 2], [100, 27, -1, -2]), tensor("u", "UINT8", [2], [255, 0])]
    status, body, _ = await gw.post_json(f"/v2/models/{TYPED}/infer", {"inputs": typed})
    assert status == 200, body
    assert body["outputs"] == [{"name": "total", "datatype": "INT64", "shape": [2], "data": [382, -3]}]
    # Numbers of another numeric type, converted exactly; MLServer's pd [N, 1] columns still answer [N, 1].
    converted = [tensor("q", "INT64", [1, 2], [1, 2]), tensor("u", "FP64", [1, 1], [3.0])]
    status, body, _ = await gw.post_json(f"/v2/models/{TYPED}/infer", {"inputs": converted})
    assert status == 200 and body["outputs"][0]["shape"] == [1, 1] and body["outputs"][0]["data"] == [6], body
    # One row given without its batch axis (pd), and TrustyAI's np layout: still decoded and scored.
    for inputs in ([tensor("INPUT0", "FP32", [4], [1, 2, 3, 4])], [tensor("predict", "FP32", [1, 4], [1, 2, 3, 4])]):
        status, body, _ = await gw.post_json(f"/v2/models/{VECTOR}/infer", {"inputs": inputs})
        assert status == 200 and body["outputs"][0]["data"] == [10.0, 4.0], body


async def test_v1_graphpipe_and_basic_check_the_declared_inputs_too(gw: V2Gateway) -> None:
    session, url = gw.server.session, gw.url
    async with session.post(url + f"/v1/models/{TYPED}:predict", json={"instances": [{"q": ["a", "b"], "u": 1}]}) as r:
        body = await r.json()
        assert r.status == 400 and "'q'" in body["error"], body
    # GraphPipe: text for the UINT8 input, then tensors that fit (uint8 values for INT8, int64 for UINT8: converted)
    for q, u, want in (
        (
            (Type.Int8, [1, 2], bytes([1, 2]), None),
            (Type.String, [1], None, [b"7"]),
            b"input 'u': expected datatype UINT8, got BYTES",
        ),
        ((Type.Uint8, [1, 2], bytes([4, 5]), None), (Type.Int64, [1], np.array([6], dtype="<i8").tobytes(), None), None),
    ):
        request = raw_tensor_request([q, u], ["q", "u"])
        async with session.post(url + "/acme/demo/2/gp", data=request) as r:
            outputs, errors = convert.deserialize_infer_response(await r.read())
        if want is None:
            assert not errors and outputs[-1].reshape(-1).tolist() == [15], (outputs, errors)  # after the fqrv
        else:
            assert errors and errors[0]["code"] == 400 and want in errors[0]["message"], errors
    # BASIC (the echo model): text for the FP64 input is refused; Int64 values are converted exactly.
    for ff_type, value, status_code, message in (
        ("String", "1", 400, "input 'x': expected datatype FP64, got BYTES"),
        ("Int64", 7, 200, ""),
    ):
        body = {"schema": [{"type": ff_type, "fields": ["x"]}], "datum": [{"tensors": [{ff_type: {"data": [value]}}]}]}
        async with session.post(url + "/acme/demo/3/score", json=body) as r:
            payload = await r.json()
        assert r.status == status_code and message in payload.get("error", ""), payload
    assert payload["Prediction"]["datum"][0]["tensors"][0] == {"Float64": {"data": [14.0]}}
