"""V2 wire events -> ForestFlow's event shape, for readers that ask (``logs tail --format forestflow``).

The gateway logs a V2 request and its answer as they were on the wire (``wireRequest`` /
``wireResponse``, see :mod:`forestflow.predlog.encode`), so nothing is re-encoded on the request
path. This module does that work later, on the reader's side: it decodes the V2 bodies (REST JSON,
REST with binary tensors, or gRPC protobuf) into frames and writes ForestFlow's
``inferenceRequest`` (schema + datum + configs) and ``prediction`` (fqrv + schema + datum), as a
BASIC event has them. Without the model's metadata an "np" request (one [N, F] tensor) stays one
vector column named after its tensor.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from forestflow.codecs.schema_datum import prediction_json, request_json
from forestflow.codecs.v2 import decode_inputs
from forestflow.codecs.v2_request import TRANSPORT_PARAMETERS, configs_from, parameters_of, parse_inputs, tensors_of
from forestflow.codecs.v2_tensor import array_from_json, array_from_raw
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract

#: Event fields that only wire events have; the converted event drops them.
WIRE_FIELDS = ("wireRequest", "wireResponse", "wireRequestJsonLength", "wireResponseJsonLength")


def is_wire_event(event: dict[str, Any]) -> bool:
    """Whether ``event`` carries a V2 request as it was on the wire."""
    return "wireRequest" in event


def _body(value: Any) -> bytes | dict[str, Any]:
    # Protobuf's JSON mapping (and the file log, for non-JSON bodies) writes bytes as base64 text;
    # the file log embeds a REST JSON body as the document itself.
    return base64.b64decode(value) if isinstance(value, str) else value


def _rest_document(body: bytes | dict[str, Any], json_length: int | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON document of a REST body and the binary tensor data after it."""
    if isinstance(body, dict):
        return body, memoryview(b"")
    if json_length:
        return orjson.loads(body[:json_length]), memoryview(body)[json_length:]
    return orjson.loads(body), memoryview(b"")


def _request_frame(event: dict[str, Any]) -> tuple[Frame, dict[str, str]]:
    # The front-ends' own parsers: a logged request was accepted by them, so it parses the same way.
    body = _body(event["wireRequest"])
    if event.get("protocol") == "v2-grpc":
        from forestflow._proto.grpc_predict_v2 import messages

        assert isinstance(body, bytes)
        message = messages()["ModelInferRequest"].FromString(body)
        tensors, parameters = tensors_of(message), parameters_of(message.parameters)
    else:
        doc, binary = _rest_document(body, event.get("wireRequestJsonLength"))
        tensors, parameters = parse_inputs(doc, binary), dict(doc.get("parameters") or {})
    model_parameters = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS}
    frame, _ = decode_inputs(tensors, (), model_parameters)
    return frame, configs_from(parameters)


def _response_frame(event: dict[str, Any]) -> Frame:
    body = _body(event["wireResponse"])
    columns: dict[str, np.ndarray] = {}
    if event.get("protocol") == "v2-grpc":
        from forestflow._proto.grpc_predict_v2 import messages

        assert isinstance(body, bytes)
        message = messages()["ModelInferResponse"].FromString(body)
        for i, out in enumerate(message.outputs):
            columns[out.name] = array_from_raw(out.name, out.datatype, list(out.shape), message.raw_output_contents[i], "output")
        return Frame.from_columns(columns)
    doc, binary = _rest_document(body, event.get("wireResponseJsonLength"))
    offset = 0
    for out in doc.get("outputs") or []:
        name, datatype, shape = out["name"], out["datatype"], out["shape"]
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            columns[name] = array_from_raw(name, datatype, shape, binary[offset : offset + size], "output")
            offset += size
        else:
            columns[name] = array_from_json(name, datatype, shape, out["data"], "output")
    return Frame.from_columns(columns)


def _fqrv(value: dict[str, Any]) -> FQRV:
    contract = value.get("contract") or {}
    number = int(contract.get("contractNumber") or 0)
    return FQRV(Contract(contract.get("organization", ""), contract.get("project", ""), number), value.get("releaseVersion", ""))


def to_forestflow(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` in ForestFlow's shape: a V2 wire event gets ``inferenceRequest`` and ``prediction``
    (on success) in place of its wire fields; any other event is returned unchanged.

    A body that cannot be decoded keeps its wire fields and gains ``conversionError``.
    """
    if not is_wire_event(event):
        return event
    try:
        frame, configs = _request_frame(event)
        converted: dict[str, Any] = {}
        if "wireResponse" in event:
            fqrv = _fqrv(event["fqrv"])
            converted["prediction"] = orjson.loads(prediction_json(fqrv, _response_frame(event)))
        converted["inferenceRequest"] = orjson.loads(request_json(frame, configs))
    except Exception as exc:  # a reader must keep going past one odd event
        return {**event, "conversionError": f"{type(exc).__name__}: {exc}"}
    out = {k: v for k, v in event.items() if k not in WIRE_FIELDS}
    return {**converted, **out}
