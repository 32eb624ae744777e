"""ForestFlow's BASIC API: ``POST /{org}/{project}/{n}/score``, ``/explain`` and the metadata routes.

``/explain`` takes a ``/score`` body and answers ``{"Prediction": ..., "Explanation": ...}``: the
Prediction ``/score`` gives, and per datum the contributions keyed by column name with the bias
(``BiasTerm``), from the release that answered (named in both).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from forestflow import tracing
from forestflow.api.common import (
    GATEWAY,
    Exchange,
    Reply,
    content_type_of,
    contract_from,
    exchange_handler,
    fqrv_from,
    input_headers,
    parse_json,
    path_contract,
    register_exchange,
    timeout_from,
    with_load,
)
from forestflow.api.pinning import PIN_HEADER, headers_pinned_route
from forestflow.api.responses import JSON, dumps, json_response
from forestflow.codecs.ff_protobuf import prediction_bytes
from forestflow.codecs.ff_settings import fqrv_to_json
from forestflow.codecs.schema_datum import (
    ff_type_name,
    frame_from_json,
    frame_from_json_body,
    frame_from_proto,
    prediction_json,
)
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.input_report import missing_inputs, unknown_inputs
from forestflow.predlog.record import Wire
from forestflow.runtime.base import ServableMetadata
from forestflow.runtime.explanation import EXPLANATION, Explanation
from forestflow.runtime.pipeline import RESPONSE_METADATA
from forestflow.service import Gateway, InferResult, Route

PROTOBUF = "application/x-protobuf"
SERVER_NAME = "ForestFlow"


async def score_exchange(exchange: Exchange) -> Reply:
    """Score a batch of records on the contract's routed servable."""
    return await _answer(exchange, explain=False)


async def explain_exchange(exchange: Exchange) -> Reply:
    """Score and explain a batch of records on the contract's routed servable (always answers JSON)."""
    return await _answer(exchange, explain=True)


score = register_exchange(exchange_handler(score_exchange), score_exchange)
explain = register_exchange(exchange_handler(explain_exchange), explain_exchange)


async def _answer(exchange: Exchange, explain: bool) -> Reply:
    gateway, headers = exchange.gateway, exchange.headers
    contract, exchange.contract = path_contract(exchange.params)
    state = gateway.contract_state(contract)  # 404 before reading a body for an unknown contract
    pinned = headers_pinned_route(gateway, state, headers) if PIN_HEADER in headers else None
    as_proto = content_type_of(headers) == PROTOBUF
    result, payload = await score_payload(
        gateway,
        contract,
        await exchange.read(),
        as_proto=as_proto,
        request_id=exchange.request_id,
        protocol="basic",
        timeout_s=timeout_from(headers),
        route=pinned,
        explain=explain,
    )
    exchange.fqrv = str(result.fqrv)
    exchange.scoring_s = result.latency_ms / 1000
    proto_answer = as_proto and not explain
    return Reply(payload, PROTOBUF if proto_answer else JSON, headers=input_headers(result.frame) or None)


async def score_payload(
    gateway: Gateway,
    contract: Contract,
    body: bytes,
    *,
    as_proto: bool,
    request_id: str,
    protocol: str,
    timeout_s: float | None,
    route: Route | None = None,
    explain: bool = False,
) -> tuple[InferResult, bytes]:
    """Decode a ``/score`` body (InferenceRequest JSON, or protobuf), score it, encode the answer.

    The answer is the body ``/score`` returns: ``{"Prediction": ...}`` JSON, or a Prediction
    protobuf. Shared by the HTTP route and the Kafka front-end. ``route``: the routing already
    decided (a pinned release); otherwise the request is routed by its contract's router.
    ``explain``: the answer is ``{"Prediction": ..., "Explanation": ...}`` JSON (logged as such for a
    JSON body).
    """
    if tracing.ON:
        with tracing.child("decode", **{"forestflow.bytes": len(body)}):
            frame, configs = frame_from_proto(body) if as_proto else _frame_from_json(body)
    elif as_proto:
        frame, configs = frame_from_proto(body)
    else:
        frame, configs = _frame_from_json(body)
    result = await gateway.infer(
        contract,
        frame,
        configs=configs,
        request_id=request_id,
        protocol=protocol,
        timeout_s=timeout_s,
        wire=None if as_proto else Wire(body, _explained_json if explain else _prediction_json),
        route=route,
        explain=explain,
    )
    if explain:
        return result, result.response_json if result.response_json is not None else _explained_json(result.fqrv, result.frame)
    if as_proto:
        return result, prediction_bytes(result.fqrv, result.frame)
    assert result.response_json is not None
    returned = result.frame.parameters.get(RESPONSE_METADATA)
    if returned:  # what pipeline steps returned, beside the Prediction (absent unless one did)
        return result, b'{"Prediction":' + result.response_json + b',"Metadata":' + dumps(returned) + b"}"
    return result, b'{"Prediction":' + result.response_json + b"}"


def _frame_from_json(body: bytes) -> tuple[Frame, dict[str, str]]:
    """The usual body read straight into columns; any other parsed and converted in Python (which says what is wrong)."""
    decoded = frame_from_json_body(body)
    return decoded if decoded is not None else frame_from_json(parse_json(body))


def _prediction_json(fqrv: FQRV, frame: Frame) -> bytes:
    """The Prediction JSON of an answer (unknown and missing input names listed when there are any)."""
    return prediction_json(fqrv, frame, unknown_inputs(frame), missing_inputs(frame))


def _explained_json(fqrv: FQRV, frame: Frame) -> bytes:
    """``{"Prediction": ..., "Explanation": ...}`` of an explained answer; a shadow copy's answer
    (a plain score, encoded for the log) is its Prediction alone, as for ``/score``."""
    explanation: Explanation | None = frame.parameters.get(EXPLANATION)
    if explanation is None:
        return _prediction_json(fqrv, frame)
    return (
        b'{"Prediction":'
        + _prediction_json(fqrv, frame)
        + b',"Explanation":'
        + dumps(
            {
                "fqrv": fqrv_to_json(fqrv),
                "method": explanation.method,
                "columns": explanation.names,
                "groups": explanation.groups,
                "contributions": explanation.per_row(),
            }
        )
        + b"}"
    )


def metadata_to_json(fqrv: FQRV, meta: ServableMetadata, explains: dict[str, Any] | None = None) -> dict[str, Any]:
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

    out: dict[str, Any] = {
        "fqrv": fqrv_to_json(fqrv),
        "name": meta.name,
        "server": SERVER_NAME,
        "description": meta.description or f"{meta.platform} servable {fqrv}",
        "inputs": io(meta.inputs),
        "outputs": io(meta.outputs),
    }
    backend = meta.extra.get("backend")
    if backend is not None:  # a RemoteV2 release: where it scores and whether that server is up
        out["backend"] = dict(backend)
    out["explanations"] = explains  # null: the release cannot explain
    return out


async def contract_metadata(request: web.Request) -> web.Response:
    """``[{"BasicMetaData": ...}]`` for every servable of the contract (empty list if none); a
    release whose load keeps failing on this process follows, without inputs or outputs and with
    ``"load": {"state": "failed", "error", "attempts", "retryInS"}``."""
    gateway = request.app[GATEWAY]
    contract = contract_from(request)
    state = gateway.contract_state(contract)
    out = []
    for entry in sorted(state.servables.values(), key=lambda e: e.metrics.created_at_ms):
        load = gateway.load_view(entry.fqrv)
        if entry.fqrv in gateway.loaded:
            doc = metadata_to_json(entry.fqrv, gateway.metadata(entry.fqrv), gateway.explanation(entry.fqrv))
            out.append({"BasicMetaData": with_load(doc, load)})
        elif load is not None:  # cold (lazy loading): described once it is loaded
            reason = load.get("error") or f"{load['state']} (loaded on its first request)"
            out.append({"BasicMetaData": _not_loaded(entry.fqrv, reason) | {"load": load}})
    for entry, status in gateway.failing_entries(contract):
        out.append({"BasicMetaData": _not_loaded(entry.fqrv, status.error) | {"load": status.view()}})
    return json_response(out)


def _not_loaded(fqrv: Any, reason: str) -> dict[str, Any]:
    """The metadata of a release not loaded on this process, without inputs or outputs."""
    doc = {"fqrv": fqrv_to_json(fqrv), "name": fqrv.release, "server": SERVER_NAME}
    return doc | {"description": f"not loaded on this process: {reason}", "inputs": [], "outputs": []}


async def servable_metadata(request: web.Request) -> web.Response:
    """``{"BasicMetaData": ...}`` of one release."""
    gateway = request.app[GATEWAY]
    fqrv = fqrv_from(request)
    return json_response({"BasicMetaData": metadata_to_json(fqrv, gateway.metadata(fqrv), gateway.explanation(fqrv))})


def add_routes(app: web.Application) -> None:
    """Register the BASIC API routes."""
    contract = "/{org}/{project}/{n:\\d+}"
    app.router.add_post(contract + "/score", score)
    app.router.add_post(contract + "/explain", explain)
    app.router.add_get(contract + "/metadata", contract_metadata)
    app.router.add_get(contract + "/{release}/metadata", servable_metadata)
