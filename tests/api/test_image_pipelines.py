"""Image pipelines end to end through every front-end: V2 REST (JSON and binary), V2 gRPC, BASIC /score
and GraphPipe (the official client).

Two pipelines: scikit-learn's 8x8 digits classifier exported to ONNX behind ``image_decode`` (its labels
must equal scikit-learn's predictions on the same images), and AMD's invert ensemble (PNG in, PNG out,
pixel-exact). Bad images are 400s naming the row through each front-end.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from graphpipe import remote

from forestflow._proto.grpc_predict_v2 import messages
from tests.api.test_v2_grpc import Client
from tests.api.test_v2_rest import bytes_blob, split_binary
from tests.api.v2_support import V2Gateway, v2_gateway
from tests.api_gp.helpers import client
from tests.image_support import Digits, b64, digits_pipeline, encode, invert_pipeline, pixels_of, png16, random_rgb
from tests.pipeline_support import servable_request

M = messages()
# graphpipe's client passes numElems to EndVector, which flatbuffers >= 2 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")
DIGITS = ("img", "digits", 1)
INVERT = ("img", "invert", 1)
#: One protocol's call: (contract, input name, images) -> (status, {output: values} or the error text).
Send = Callable[[tuple[str, str, int], str, list[bytes]], Awaitable[tuple[int, Any]]]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return digits_pipeline(tmp_path_factory.mktemp("images") / "digits")


@pytest.fixture
async def v2(tmp_path: Path, digits: Digits) -> AsyncIterator[tuple[V2Gateway, Client]]:
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(servable_request(digits.directory, contract=DIGITS))
        await gw.deploy(servable_request(invert_pipeline(tmp_path / "invert"), contract=INVERT))
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            yield gw, Client(channel)


def _model(contract: tuple[str, str, int]) -> str:
    return ".".join(map(str, contract))


def _split(blob: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(blob):
        (n,) = struct.unpack_from("<I", blob, pos)
        out.append(blob[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def _text_or_bytes(b: bytes) -> str | bytes:
    """Text as the JSON answer gives it (labels), bytes when not UTF-8 (images: PNG starts with 0x89)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def _values(datatype: str, blob: bytes) -> list[Any]:
    if datatype == "BYTES":
        return [_text_or_bytes(b) for b in _split(blob)]
    return np.frombuffer(blob, dtype={"FP64": "<f8", "FP32": "<f4"}[datatype]).tolist()


def senders(gw: V2Gateway, call: Client) -> dict[str, Send]:
    """How each front-end sends images and reads the answer back into plain values (images as bytes)."""

    async def v2_json(contract: tuple[str, str, int], name: str, images: list[bytes]) -> tuple[int, Any]:
        payload = {"inputs": [{"name": name, "datatype": "BYTES", "shape": [len(images)], "data": [b64(i) for i in images]}]}
        status, body, _ = await gw.post_json(f"/v2/models/{_model(contract)}/infer", payload)
        if status != 200:
            return status, body["error"]
        out = {}
        for o in body["outputs"]:
            if (o.get("parameters") or {}).get("content_type") == "base64":
                out[o["name"]] = [base64.b64decode(v) for v in o["data"]]
            else:
                out[o["name"]] = o["data"]
        return status, out

    async def v2_binary(contract: tuple[str, str, int], name: str, images: list[bytes]) -> tuple[int, Any]:
        blob = bytes_blob(images)
        tensor = {"name": name, "datatype": "BYTES", "shape": [len(images)], "parameters": {"binary_data_size": len(blob)}}
        head = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        headers = {"Inference-Header-Content-Length": str(len(head))}
        url = gw.url + f"/v2/models/{_model(contract)}/infer"
        async with gw.server.session.post(url, data=head + blob, headers=headers) as r:
            body = await r.read()
            if r.status != 200:
                return r.status, orjson.loads(body)["error"]
            reply, blobs = split_binary(body, int(r.headers["Inference-Header-Content-Length"]))
        return 200, {o["name"]: _values(o["datatype"], blobs[o["name"]]) for o in reply["outputs"]}

    async def v2_grpc(contract: tuple[str, str, int], name: str, images: list[bytes]) -> tuple[int, Any]:
        request = M["ModelInferRequest"](model_name=_model(contract))
        request.inputs.add(name=name, datatype="BYTES", shape=[len(images)])
        request.raw_input_contents.append(bytes_blob(images))
        try:
            reply = await call(
                "ModelInfer", model_name=request.model_name, inputs=request.inputs, raw_input_contents=request.raw_input_contents
            )
        except grpc.aio.AioRpcError as err:
            return {grpc.StatusCode.INVALID_ARGUMENT: 400}.get(err.code(), 500), err.details()
        return 200, {o.name: _values(o.datatype, raw) for o, raw in zip(reply.outputs, reply.raw_output_contents)}

    async def basic(contract: tuple[str, str, int], name: str, images: list[bytes]) -> tuple[int, Any]:
        body = {
            "schema": [{"type": "String", "fields": [name]}],
            "datum": [{"tensors": [{"String": {"data": [b64(i)]}}]} for i in images],
        }
        status, reply, _ = await gw.post_json("/{}/{}/{}/score".format(*contract), body)
        if status != 200:
            return status, reply["error"]
        prediction = reply["Prediction"]
        out: dict[str, list[Any]] = {}
        for g, entry in enumerate(prediction["schema"]):
            for datum in prediction["datum"]:
                (values,) = datum["tensors"][g].values()
                for field, value in zip(entry["fields"], values["data"]):
                    out.setdefault(field, []).append(base64.b64decode(value) if entry["type"] == "Bytes" else value)
        return status, out

    async def graphpipe(contract: tuple[str, str, int], name: str, images: list[bytes]) -> tuple[int, Any]:
        column = np.empty(len(images), dtype=object)
        column[:] = images
        uri = gw.url + "/{}/{}/{}/gp".format(*contract)
        try:
            outputs = await client(remote.execute_multi, uri, [column], [name], None, None)
            names = await client(remote.get_output_names, uri)
        except Exception as exc:  # the client raises the server's error entry
            return 400, str(exc)
        return 200, {
            n: [_text_or_bytes(v) if isinstance(v, bytes) else v for v in a.reshape(-1).tolist()] for n, a in zip(names, outputs)
        }

    return {"v2-json": v2_json, "v2-binary": v2_binary, "v2-grpc": v2_grpc, "basic": basic, "graphpipe": graphpipe}


async def test_digits_classifier_behind_image_decode_answers_scikit_learns_labels_everywhere(
    v2: tuple[V2Gateway, Client], digits: Digits
) -> None:
    gw, call = v2
    for protocol, send in senders(gw, call).items():
        for images, expected in ((digits.images[:1], digits.expected[:1]), (digits.images, digits.expected)):
            status, out = await send(DIGITS, "image", images)
            assert status == 200, (protocol, out)
            assert out["label"] == expected, protocol
            assert len(out["score"]) == len(images) and all(0 < s <= 1 + 1e-6 for s in out["score"]), protocol


async def test_invert_ensemble_gives_back_the_inverted_png_pixel_exact_everywhere(v2: tuple[V2Gateway, Client]) -> None:
    gw, call = v2
    rng = np.random.default_rng(5)
    originals = [random_rgb(rng, 12, 20) for _ in range(3)]
    images = [encode(originals[0]), encode(originals[1], "PNG", optimize=True), encode(originals[2], "BMP")]
    for protocol, send in senders(gw, call).items():
        status, out = await send(INVERT, "image_in", images)
        assert status == 200, (protocol, out)
        assert len(out["image_out"]) == 3, protocol
        for original, png in zip(originals, out["image_out"]):
            assert png.startswith(b"\x89PNG\r\n\x1a\n"), protocol
            assert np.array_equal(pixels_of(png), 255 - original), protocol


async def test_bad_images_are_400s_naming_the_row_through_every_front_end(v2: tuple[V2Gateway, Client], digits: Digits) -> None:
    gw, call = v2
    good = digits.images[0]
    png = encode(random_rgb(np.random.default_rng(1), 16, 16))
    cases = [
        ([good, b"certainly not an image"], DIGITS, "row 1", "not an image"),
        ([good, good, png[: len(png) // 2]], DIGITS, "row 2", "truncated PNG image"),
        ([png16()], DIGITS, "row 0", "unsupported mode I;16"),
        ([png, encode(random_rgb(np.random.default_rng(2), 16, 17))], INVERT, "row 1", "rows of a batch must have one size"),
    ]
    for protocol, send in senders(gw, call).items():
        for images, contract, row, reason in cases:
            status, error = await send(contract, "image" if contract == DIGITS else "image_in", images)
            assert status == 400, (protocol, reason, error)
            assert row in error and reason in error, (protocol, error)
    # The gateway still serves after all of them.
    status, out = await senders(gw, call)["v2-json"](DIGITS, "image", digits.images[:2])
    assert status == 200 and out["label"] == digits.expected[:2]


async def test_metadata_declares_image_inputs_and_outputs(v2: tuple[V2Gateway, Client]) -> None:
    gw, _ = v2
    async with gw.server.session.get(gw.url + "/v2/models/img.digits.1") as r:
        meta = await r.json()
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "image"}}]
    async with gw.server.session.get(gw.url + "/v2/models/img.invert.1") as r:
        meta = await r.json()
    assert meta["inputs"][0]["parameters"] == {"content_type": "image"}
    assert meta["outputs"] == [{"name": "image_out", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "image"}}]
