"""Helpers for the GraphPipe tests: deploys, the official client off the event loop, raw requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import flatbuffers
import numpy as np
from graphpipe import convert, remote

from forestflow._proto.graphpipe import InferRequest, Request, Tensor
from forestflow._proto.graphpipe.Req import Req
from tests.support import InProcessGateway

GP_PATH = "/acme/demo/1/gp"


async def deploy(gw: InProcessGateway, body: dict[str, Any]) -> None:
    """Create a servable through the admin API; fail the test unless it answers 200."""
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()


async def client(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking ``graphpipe.remote`` call in a thread (the server shares this event loop)."""
    return await asyncio.to_thread(call, *args, **kwargs)


async def execute_multi(
    uri: str, inputs: list[np.ndarray], names: list[str] | None, outputs: list[str] | None = None, config: str | None = None
) -> list[np.ndarray]:
    """The official client's execute_multi."""
    return await client(remote.execute_multi, uri, inputs, names, outputs, config)


async def post_raw(gw: InProcessGateway, body: bytes, path: str = GP_PATH) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """POST bytes to a /gp route; check the ForestFlow envelope (200, octet-stream) and decode the InferResponse."""
    async with gw.session.post(gw.url + path, data=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "application/octet-stream"
        return convert.deserialize_infer_response(await r.read())


async def score_rows(gw: InProcessGateway, body: dict[str, Any], path: str = "/acme/demo/1/score") -> dict[str, Any]:
    """POST a BASIC /score body; return the Prediction."""
    async with gw.session.post(gw.url + path, json=body) as r:
        payload = await r.json()
        assert r.status == 200, payload
        return payload["Prediction"]


def score_column(prediction: dict[str, Any], field: str) -> list[Any]:
    """One output field's values, one per datum, from a BASIC Prediction."""
    for t, entry in enumerate(prediction["schema"]):
        if field in entry["fields"]:
            i = entry["fields"].index(field)
            return [next(iter(d["tensors"][t].values()))["data"][i] for d in prediction["datum"]]
    raise KeyError(field)


def raw_tensor_request(
    tensors: Sequence[tuple[int, Sequence[int], bytes | None, Sequence[bytes] | None]],
    names: Sequence[str | bytes] = (),
    config: str = "",
) -> bytes:
    """An InferRequest built field by field, so tests can send what the official client never would.

    Each tensor is ``(type, shape, data, strings)``; ``data``/``strings`` None leaves the field out.
    """
    builder = flatbuffers.Builder(1024)
    offsets = []
    for gp_type, shape, data, strings in tensors:
        string_vec = None
        if strings is not None:
            made = [builder.CreateString(s) for s in strings]
            builder.StartVector(4, len(made), 4)
            for s in reversed(made):
                builder.PrependUOffsetTRelative(s)
            string_vec = builder.EndVector()
        data_vec = builder.CreateByteVector(data) if data is not None else None
        shape_vec = builder.CreateNumpyVector(np.asarray(shape, dtype="<i8"))
        Tensor.Start(builder)
        Tensor.AddType(builder, gp_type)
        Tensor.AddShape(builder, shape_vec)
        if data_vec is not None:
            Tensor.AddData(builder, data_vec)
        if string_vec is not None:
            Tensor.AddStringVal(builder, string_vec)
        offsets.append(Tensor.End(builder))
    made_names = [builder.CreateString(n) for n in names]
    builder.StartVector(4, len(made_names), 4)
    for n in reversed(made_names):
        builder.PrependUOffsetTRelative(n)
    names_vec = builder.EndVector()
    builder.StartVector(4, len(offsets), 4)
    for t in reversed(offsets):
        builder.PrependUOffsetTRelative(t)
    tensors_vec = builder.EndVector()
    config_str = builder.CreateString(config)
    InferRequest.Start(builder)
    InferRequest.AddConfig(builder, config_str)
    InferRequest.AddInputNames(builder, names_vec)
    InferRequest.AddInputTensors(builder, tensors_vec)
    infer = InferRequest.End(builder)
    Request.Start(builder)
    Request.AddReqType(builder, Req.InferRequest)
    Request.AddReq(builder, infer)
    builder.Finish(Request.End(builder))
    return bytes(builder.Output())


def request_with_union_type(kind: int) -> bytes:
    """A Request whose union type byte is ``kind`` (with an empty table behind it)."""
    builder = flatbuffers.Builder(64)
    InferRequest.Start(builder)
    table = InferRequest.End(builder)
    Request.Start(builder)
    Request.AddReqType(builder, kind)
    Request.AddReq(builder, table)
    builder.Finish(Request.End(builder))
    return bytes(builder.Output())
