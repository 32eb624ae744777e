"""KServe V1 (TF-Serving style) REST: model list, model readiness, ``:predict`` and ``:explain``.

``POST /v1/models/{model}:predict`` takes ``{"instances": [...]}`` (or ``"inputs"``) and answers
``{"predictions": [...]}``, one per instance; TF Serving's columnar ``{"inputs": {name: batch}}``
is answered with ``{"outputs": ...}``. How instances map to the model's inputs (vector inputs
included) is in :mod:`forestflow.codecs.v1`. Routed by phase-in exactly like /score (shadows and
logging included). ``:explain`` takes the same body and answers KServe's explainer shape,
``{"predictions": [...], "explanations": [...]}`` (one per instance: contributions by column name,
the bias as ``BiasTerm``; per class for multi-output models), naming the release that answered.
"""

from __future__ import annotations

from aiohttp import web

from forestflow.api import v2_common
from forestflow.api.common import (
    GATEWAY,
    Exchange,
    Reply,
    exchange_handler,
    parse_json,
    register_exchange,
    timeout_from,
)
from forestflow.api.responses import JSON, dumps, json_response
from forestflow.api.v2_rest import v2_errors
from forestflow.codecs.v1 import columnar_outputs, frame_from_columnar, frame_from_instances, predictions
from forestflow.codecs.v2_request import configs_from
from forestflow.errors import InvalidInput
from forestflow.runtime.explanation import EXPLANATION, Explanation
from forestflow.service import InferResult


@v2_errors
async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: ``{"models": [names]}``."""
    return json_response({"models": [str(c) for c in sorted(request.app[GATEWAY].contracts)]})


@v2_errors
async def model_ready(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: ``{"name", "ready"}``, 200 ready, 503 not ready, 404 unknown."""
    name = request.match_info["model"]
    ready = v2_common.model_ready(request.app[GATEWAY], name, None)
    return json_response({"name": name, "ready": ready}, status=200 if ready else 503)


async def predict_exchange(exchange: Exchange) -> Reply:
    """POST /v1/models/{model}:predict."""
    result, columnar = await _infer(exchange, explain=False)
    if columnar:
        return Reply(dumps({"outputs": columnar_outputs(result.frame)}), JSON)
    return Reply(dumps({"predictions": predictions(result.frame)}), JSON)


async def explain_exchange(exchange: Exchange) -> Reply:
    """POST /v1/models/{model}:explain: the predictions and their explanations."""
    result, columnar = await _infer(exchange, explain=True)
    explanation: Explanation = result.frame.parameters[EXPLANATION]
    answer = columnar_outputs(result.frame) if columnar else predictions(result.frame)
    body = {
        "outputs" if columnar else "predictions": answer,
        "explanations": explanation.per_row(),
        "release": str(result.fqrv),
        "method": explanation.method,
    }
    return Reply(dumps(body), JSON)


predict = register_exchange(v2_errors(exchange_handler(predict_exchange)), predict_exchange, v2_errors=True)
explain = register_exchange(v2_errors(exchange_handler(explain_exchange)), explain_exchange, v2_errors=True)


async def _infer(exchange: Exchange, explain: bool) -> tuple[InferResult, bool]:
    """Decode a V1 body against the routed release and score (or explain) it; also whether it was columnar."""
    gateway = exchange.gateway
    name = exchange.contract = exchange.params["model"]
    contract = v2_common.model_contract(name)
    # Routed first (404 before reading the body); instances are laid out as the scoring release's inputs.
    route = gateway.route(contract)
    body = parse_json(await exchange.read())
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object with instances")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters: expected a JSON object")
    await gateway.load_routed(route)  # a cold release: loaded before its inputs lay out the body
    specs = v2_common.decoding_specs(gateway, route)
    columnar = "instances" not in body and isinstance(body.get("inputs"), dict)
    if columnar:
        frame = frame_from_columnar(body["inputs"], specs, parameters)
    else:
        frame = frame_from_instances(body.get("instances", body.get("inputs")), specs, parameters)
    result = await gateway.infer(
        contract,
        frame,
        configs=configs_from(parameters),
        request_id=exchange.request_id,
        protocol="v1",
        timeout_s=timeout_from(exchange.headers),
        route=route,
        explain=explain,
    )
    exchange.fqrv = str(result.fqrv)
    exchange.scoring_s = result.latency_ms / 1000
    return result, columnar


async def alive(request: web.Request) -> web.Response:
    """GET /: ``{"status": "alive"}`` (what the kserve V1 client checks for liveness)."""
    return json_response({"status": "alive"})


def add_routes(app: web.Application) -> None:
    """Register the V1 routes (and ``GET /`` unless another front-end already serves it)."""
    r = app.router
    r.add_get("/v1/models", list_models)
    r.add_get("/v1/models/{model:[^/:]+}", model_ready)
    r.add_post("/v1/models/{model:[^/:]+}:predict", predict)
    r.add_post("/v1/models/{model:[^/:]+}:explain", explain)
    if not any(getattr(res, "canonical", None) == "/" for res in r.resources()):
        r.add_get("/", alive)
