"""ForestFlow's BASIC API: ``POST /{org}/{project}/{n}/score`` and the metadata routes."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from forestflow.api.common import SCORING_S, FQRV_TAG, GATEWAY, contract_from, fqrv_from, parse_json, request_id_of, timeout_from
from forestflow.api.responses import JSON, json_response
from forestflow.codecs.ff_settings import fqrv_to_json
from forestflow.codecs.ff_protobuf import prediction_bytes
from forestflow.codecs.schema_datum import ff_type_name, frame_from_json, frame_from_proto, prediction_json
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.runtime.base import ServableMetadata

PROTOBUF = "application/x-protobuf"
SERVER_NAME = "ForestFlow"


async def score(request: web.Request) -> web.Response:
    """Score a batch of records on the contract's routed servable."""
    gateway = request.app[GATEWAY]
    contract = contract_from(request)
    gateway.contract_state(contract)  # 404 before reading a body for an unknown contract
    as_proto = request.content_type == PROTOBUF
    body = await request.read()
    if as_proto:
        frame, configs = frame_from_proto(body)
    else:
        frame, configs = frame_from_json(parse_json(body))
    result = await gateway.infer(
        contract,
        frame,
        configs=configs,
        request_id=request_id_of(request),
        protocol="basic",
        timeout_s=timeout_from(request),
        request_json=None if as_proto else body,
        encode_response_json=None if as_proto else _prediction_json,
    )
    request[FQRV_TAG] = str(result.fqrv)
    request[SCORING_S] = result.latency_ms / 1000
    unknown = result.frame.parameters.get("unknown_inputs") or []
    headers = {"X-Forestflow-Unknown-Inputs": ",".join(unknown)} if unknown else None
    if as_proto:
        payload = prediction_bytes(result.fqrv, result.frame)
        return web.Response(body=payload, content_type=PROTOBUF, headers=headers)
    assert result.response_json is not None
    return web.Response(body=b'{"Prediction":' + result.response_json + b"}", content_type=JSON, headers=headers)


def _prediction_json(fqrv: FQRV, frame: Frame) -> bytes:
    """The Prediction JSON of an answer (unknown input names listed when there are any)."""
    return prediction_json(fqrv, frame, frame.parameters.get("unknown_inputs") or ())


def metadata_to_json(fqrv: FQRV, meta: ServableMetadata) -> dict[str, Any]:
    """ForestFlow's BasicMetaData (inputs and outputs both filled, unlike ForestFlow's H2O)."""

    def io(specs: Any) -> list[dict[str, Any]]:
        out = []
        for spec in specs:
            description = spec.description
            if spec.domain is not None:
                description = (description + " " if description else "") + "levels: [" + ",".join(spec.domain) + "]"
            out.append(
                {
                    "name": spec.name,
                    "description": description,
                    "shape": [str(d) for d in spec.shape],
                    "type": ff_type_name(spec.datatype),
                }
            )
        return out

    return {
        "fqrv": fqrv_to_json(fqrv),
        "name": meta.name,
        "server": SERVER_NAME,
        "description": meta.description or f"{meta.platform} servable {fqrv}",
        "inputs": io(meta.inputs),
        "outputs": io(meta.outputs),
    }


async def contract_metadata(request: web.Request) -> web.Response:
    """``[{"BasicMetaData": ...}]`` for every servable of the contract (empty list if none)."""
    gateway = request.app[GATEWAY]
    state = gateway.contract_state(contract_from(request))
    out = []
    for entry in sorted(state.servables.values(), key=lambda e: e.metrics.created_at_ms):
        out.append({"BasicMetaData": metadata_to_json(entry.fqrv, gateway.metadata(entry.fqrv))})
    return json_response(out)


async def servable_metadata(request: web.Request) -> web.Response:
    """``{"BasicMetaData": ...}`` of one release."""
    gateway = request.app[GATEWAY]
    fqrv = fqrv_from(request)
    return json_response({"BasicMetaData": metadata_to_json(fqrv, gateway.metadata(fqrv))})


def add_routes(app: web.Application) -> None:
    """Register the BASIC API routes."""
    contract = "/{org}/{project}/{n:\\d+}"
    app.router.add_post(contract + "/score", score)
    app.router.add_get(contract + "/metadata", contract_metadata)
    app.router.add_get(contract + "/{release}/metadata", servable_metadata)
