"""ForestFlow's GraphPipe front-end: ``POST /{org}/{project}/{n}/gp``.

The body is a GraphPipe ``Request`` flatbuffer (no Content-Type needed). An ``InferRequest`` is
routed like ``/score`` (phase-in pick, shadow copies, prediction log with the raw request and the
encoded response); a ``MetadataRequest`` describes the contract's active release. As in
ForestFlow the answer is always HTTP 200 with ``application/octet-stream``: failures travel in
``InferResponse.errors`` with an HTTP-style code and our message, never a stack trace.
``GET`` on the same path gives the metadata as JSON, as the GraphPipe spec suggests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
from aiohttp import web

from forestflow.api.common import (
    FQRV_TAG,
    GATEWAY,
    Exchange,
    Reply,
    contract_from,
    exchange_handler,
    path_contract,
    register_exchange,
    timeout_from,
)
from forestflow.api.responses import json_response
from forestflow.codecs.graphpipe import (
    GP_TYPE_NAMES,
    GP_TYPE_OF_DATATYPE,
    GPInferRequest,
    PlainRequest,
    encode_errors,
    encode_infer_response,
    encode_metadata,
    frame_from_request,
    io_description,
    parse_config,
    parse_request,
    plain_frame,
    plain_request,
    response_specs,
    wire_shape,
)
from forestflow.core.contract_state import ContractState
from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import GatewayError, InvalidInput, http_status
from forestflow.predlog.record import Wire
from forestflow.service import Gateway

log = structlog.get_logger("forestflow.graphpipe")

OCTET_STREAM = "application/octet-stream"
SERVER_NAME = "forestflow"


def _octets(body: bytes) -> Reply:
    return Reply(body, OCTET_STREAM)


async def gp_exchange(exchange: Exchange) -> Reply:
    """Answer one GraphPipe request (infer or metadata) for the contract in the path."""
    gateway = exchange.gateway
    try:
        contract, exchange.contract = path_contract(exchange.params)
        state = gateway.contract_state(contract)  # unknown contract: answered before reading the body
        body = await exchange.read()
        plain = plain_request(body)  # the usual request, checked whole in C; else read in Python
        if plain is not None:
            return _octets(await _infer(exchange, state, plain[0], plain[1], body, plain))
        parsed = parse_request(body)
        if not isinstance(parsed, GPInferRequest):
            fqrv = _describing(gateway, state)
            exchange.fqrv = str(fqrv)
            return _octets(encode_metadata(fqrv, gateway.metadata(fqrv), SERVER_NAME))
        return _octets(await _infer(exchange, state, parsed.config, parsed.output_names, body, parsed))
    except GatewayError as error:
        return _octets(encode_errors([(http_status(error), error.message)]))
    except Exception:  # a bug must not become a 500 or a stack trace for GraphPipe clients
        request_id = exchange.request_id
        log.exception("graphpipe_failed", request_id=request_id, path=exchange.path)
        return _octets(encode_errors([(500, f"internal error; see the gateway log with request_id {request_id}")]))


gp = register_exchange(exchange_handler(gp_exchange), gp_exchange)


async def _infer(
    exchange: Exchange,
    state: ContractState,
    config: str,
    output_names: list[str],
    body: bytes,
    request: GPInferRequest | PlainRequest,
) -> bytes:
    # Routed first: tensors without names are laid out as the inputs of the release that scores.
    gateway, contract = exchange.gateway, state.contract
    configs = parse_config(config)  # a sticky router reads its key there
    route = gateway.route(contract, state=state, configs=configs)
    await gateway.load_routed(route)  # a cold release: loaded before its inputs lay out the tensors
    meta = gateway.decoding_metadata(route)
    if meta is None:
        raise gateway.registry.inactive_error(contract)  # 503 while its releases load, else 422
    if isinstance(request, GPInferRequest):
        frame = frame_from_request(request, meta.inputs)
    else:
        frame = plain_frame(body, request, meta.inputs)
    frame.parameters = dict(configs)
    encode_logged = _LoggedResponse(output_names)
    result = await gateway.infer(
        contract,
        frame,
        configs=configs,
        request_id=exchange.request_id,
        protocol="graphpipe",
        timeout_s=timeout_from(exchange.headers),
        route=route,
        wire=Wire(body, encode_logged, graphpipe=True),
    )
    exchange.fqrv = str(result.fqrv)
    exchange.scoring_s = result.latency_ms / 1000
    return encode_logged.reply(result.fqrv, result.frame)


class _LoggedResponse:
    """Encodes responses for the prediction log, and reuses the served one for the reply.

    A shadow release may lack the requested outputs or give a type GraphPipe cannot carry; its
    log entry then holds all its outputs or an error response rather than failing the request.
    """

    def __init__(self, output_names: Sequence[str]) -> None:
        self.output_names = list(output_names)
        self._encoded: tuple[Frame, bytes] | None = None

    def __call__(self, fqrv: FQRV, frame: Frame) -> bytes:
        try:
            body = encode_infer_response(fqrv, frame, self.output_names)
        except InvalidInput as error:
            try:
                return encode_infer_response(fqrv, frame)
            except InvalidInput:
                return encode_errors([(http_status(error), error.message)])
        self._encoded = (frame, body)
        return body

    def reply(self, fqrv: FQRV, frame: Frame) -> bytes:
        """The response for the client (raises InvalidInput for unknown output names)."""
        if self._encoded is not None and self._encoded[0] is frame:
            return self._encoded[1]
        return encode_infer_response(fqrv, frame, self.output_names)


def _describing(gateway: Gateway, state: ContractState) -> FQRV:
    """The release whose metadata describes the contract (:meth:`Gateway.describing_release`)."""
    fqrv = gateway.describing_release(state)
    if fqrv is None:
        raise gateway.registry.inactive_error(state.contract)  # 503 while its releases load, else 422
    return fqrv


def _io_json(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [
        {
            "name": spec.name,
            "description": io_description(spec),
            "shape": wire_shape(spec),
            "type": GP_TYPE_NAMES[GP_TYPE_OF_DATATYPE.get(spec.datatype, 0)],
        }
        for spec in specs
    ]


async def gp_metadata_json(request: web.Request) -> web.Response:
    """``GET .../gp``: the GraphPipe metadata of the release that describes the contract, as JSON."""
    gateway = request.app[GATEWAY]
    fqrv = _describing(gateway, gateway.contract_state(contract_from(request)))
    request[FQRV_TAG] = str(fqrv)
    meta = gateway.metadata(fqrv)
    return json_response(
        {
            "name": meta.name,
            "version": str(fqrv),
            "server": SERVER_NAME,
            "description": meta.description or f"{meta.platform} servable {fqrv}",
            "inputs": _io_json(meta.inputs),
            "outputs": _io_json(response_specs(meta)),
        }
    )


def add_routes(app: web.Application) -> None:
    """Register the GraphPipe routes."""
    path = "/{org}/{project}/{n:\\d+}/gp"
    app.router.add_post(path, gp)
    app.router.add_get(path, gp_metadata_json)
