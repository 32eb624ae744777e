"""KServe / Open Inference Protocol V2 over REST, with Triton's binary tensor data extension.

Routes: ``/v2`` (server metadata), ``/v2/health/live|ready``, ``/v2/models/{model}[/versions/{v}]``
(model metadata), ``.../ready`` and ``.../infer``. Errors are ``{"error": "..."}`` with
``Content-Type: application/json`` exactly; health answers are JSON because the kserve SDK reads
``live``/``ready`` from the body. No Content-Type is required on requests (tritonclient sends none);
``Content-Encoding: gzip|deflate`` bodies are inflated by aiohttp, and responses are compressed
when the client accepts gzip or deflate and the body is worth it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import hdrs, web

from forestflow import tracing
from forestflow.api import body_pool, v2_common
from forestflow.api.common import (
    CONTRACT,
    GATEWAY,
    SETTINGS,
    Exchange,
    Reply,
    exchange_handler,
    input_headers,
    register_exchange,
    request_id_of,
    timeout_from,
)
from forestflow.api.pinning import PIN_HEADER, headers_pinned_route
from forestflow.api.responses import JSON, dumps, json_response, v2_error_response
from forestflow.codecs import _ffjson
from forestflow.codecs.v2 import NP, Layout, encode_outputs
from forestflow.codecs.v2_request import TRANSPORT_PARAMETERS, configs_from, loads, object_of, parse_inputs, tensor_name
from forestflow.codecs.v2_tensor import Tensor, json_entry
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.errors import GatewayError, InvalidInput, PayloadTooLarge
from forestflow.predlog.record import Wire, WireBody
from forestflow.service import Gateway, InferResult, Route

HEADER_LENGTH = "Inference-Header-Content-Length"
#: Responses smaller than this are not worth compressing.
MIN_COMPRESS_BYTES = 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def v2_errors(handler: Handler, *, detailed: bool = False) -> Handler:
    """Answer gateway errors as V2 error bodies (``{"error": ...}``) instead of ForestFlow envelopes;
    ``detailed`` adds ``code`` and ``request_id`` (routes no inference client parses: the repository's)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as error:
            return v2_error_response(error, request_id_of(request), detailed=detailed)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SETTINGS].max_body_bytes
            too_large = PayloadTooLarge(f"request body over the limit of {limit} bytes")
            return v2_error_response(too_large, request_id_of(request), detailed=detailed)

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


def parse_outputs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The requested outputs with their parameters (empty = every output)."""
    items = doc.get("outputs")
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidInput("outputs: expected a list of {name, parameters}")
    wanted = []
    for i, item in enumerate(items):
        name = tensor_name(item, f"outputs[{i}]")
        params = object_of(item.get("parameters"), f"output {name!r}: parameters")
        if not isinstance(params.get("binary_data", False), bool):
            raise InvalidInput(f"output {name!r}: parameters.binary_data must be true or false")
        wanted.append((name, params))
    return wanted


def split_body(body: bytes, header: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary data of a request (all JSON without the length header)."""
    if header is None:
        return body, memoryview(b"")
    try:
        length = int(header)
    except ValueError:
        raise InvalidInput(f"{HEADER_LENGTH}: expected a byte count, got {header!r}") from None
    if not 0 <= length <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH}: {length} is outside the {len(body)}-byte body")
    return body[:length], memoryview(body)[length:]


def encode_response(
    doc: dict[str, Any], outputs: list[Tensor], wanted: dict[str, dict[str, Any]], binary_default: bool
) -> tuple[bytes, int | None]:
    """The response body, and the JSON length when binary outputs follow it."""
    blobs: list[bytes] = []
    doc["outputs"] = [json_entry(t, wanted.get(t.name, {}).get("binary_data", binary_default), blobs) for t in outputs]
    for entry, tensor in zip(doc["outputs"], outputs):
        if tensor.parameters:  # an output's own parameters (the contributions' column names)
            entry["parameters"] = {**tensor.parameters, **entry.get("parameters", {})}
    head = dumps(doc)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def response_coding(headers: Mapping[str, str], size: int) -> str | None:
    """How a ``size``-byte answer is compressed for a client sending ``headers``: gzip or deflate
    when it accepts one and the body is worth it, else None."""
    if size < MIN_COMPRESS_BYTES:
        return None
    accepted = {part.split(";")[0].strip().lower() for part in headers.get(hdrs.ACCEPT_ENCODING, "").split(",")}
    if "gzip" in accepted:
        return "gzip"
    if "deflate" in accepted:
        return "deflate"
    return None


# ---- handlers ------------------------------------------------------------------------------------
@v2_errors
async def server_live(request: web.Request) -> web.Response:
    """GET /v2/health/live."""
    return json_response({"live": True})


@v2_errors
async def server_ready(request: web.Request) -> web.Response:
    """GET /v2/health/ready: 200 when every servable is loaded and the gateway is not draining."""
    ready = request.app[GATEWAY].ready
    return json_response({"ready": ready}, status=200 if ready else 503)


@v2_errors
async def server_metadata(request: web.Request) -> web.Response:
    """GET /v2."""
    return json_response(v2_common.server_metadata())


@v2_errors
async def model_metadata(request: web.Request) -> web.Response:
    """GET /v2/models/{model}[/versions/{version}]."""
    info = request.match_info
    request[CONTRACT] = info["model"]
    return json_response(v2_common.model_metadata(request.app[GATEWAY], info["model"], info.get("version")))


@v2_errors
async def model_ready(request: web.Request) -> web.Response:
    """GET .../ready: 200 ``{"name", "ready": true}``, 503 when not ready, 404 when unknown."""
    info = request.match_info
    ready = v2_common.model_ready(request.app[GATEWAY], info["model"], info.get("version"))
    return json_response({"name": info["model"], "ready": ready}, status=200 if ready else 503)


async def infer_exchange(exchange: Exchange) -> Reply:
    """POST .../infer: JSON or binary tensors in, JSON or binary tensors out."""
    gateway, params, headers = exchange.gateway, exchange.params, exchange.headers
    name, version = params["model"], params.get("version")
    exchange.contract = name
    contract = v2_common.model_contract(name)
    # Routed first (404 before reading the body); the body is decoded against the release that
    # scores. A sticky router needs the request's parameters: it routes once they are read.
    state = gateway.contract_state(contract)
    route: Route | None
    if not version and headers.get(PIN_HEADER):
        route = headers_pinned_route(gateway, state, headers)
    elif version or state.sticky_key is None:
        route = gateway.route(contract, v2_common.version_fqrv(contract, version).release if version else None, state)
    else:
        route = None
    answer = await infer_payload(
        gateway,
        name,
        version,
        await exchange.read(),
        headers.get(HEADER_LENGTH),
        request_id=exchange.request_id,
        protocol="v2",
        timeout_s=timeout_from(headers),
        route=route,
    )
    exchange.fqrv = str(answer.result.fqrv)
    exchange.scoring_s = answer.result.latency_ms / 1000
    # Feedback may name the answer by its body "id" or by its X-Request-Id.
    gateway.answers.alias(exchange.request_id, answer.request_id)
    reply_headers = input_headers(answer.result.frame)
    content_type = JSON
    if answer.json_length is not None:
        reply_headers[HEADER_LENGTH] = str(answer.json_length)
        content_type = "application/octet-stream"
    return Reply(answer.body, content_type, headers=reply_headers, compress=response_coding(headers, len(answer.body)))


infer = register_exchange(v2_errors(exchange_handler(infer_exchange)), infer_exchange, v2_errors=True)


@dataclass(slots=True)
class V2Answer:
    """A scored V2 inference request: the outcome, the response body and the request id it carries."""

    result: InferResult
    body: bytes
    #: Length of the JSON part when binary outputs follow it (``Inference-Header-Content-Length``).
    json_length: int | None
    request_id: str


#: A decoded V2 request: (parameters, id, input tensors, requested outputs, binary_data_output).
DecodedRequest = tuple[dict[str, Any], str | int | None, list[Tensor], list[tuple[str, dict[str, Any]]], bool]


async def _decoded(head: bytes | memoryview, binary: memoryview, max_rows: int) -> DecodedRequest:
    if len(head) > body_pool.LARGE_BODY_BYTES:  # parsed off the loop: every other request goes on meanwhile
        return await body_pool.run_off_loop(decode_request, bytes(head), bytes(binary), max_rows)
    return decode_request(head, binary, max_rows)


def decode_request(head: bytes | memoryview, binary: bytes | memoryview, max_rows: int | None = None) -> DecodedRequest:
    """The JSON part of a V2 inference request decoded: ``(parameters, id, input tensors, requested
    outputs, binary_data_output)``; raises InvalidInput. Runs on the loop or in a worker process."""
    doc = object_of(loads(head), "body")
    parameters = object_of(doc.get("parameters"), "parameters")
    client_id = doc.get("id")
    if client_id is not None and not isinstance(client_id, (str, int)):
        raise InvalidInput("id: expected a string")
    tensors = parse_inputs(doc, binary if isinstance(binary, memoryview) else memoryview(binary), max_rows)
    wanted = parse_outputs(doc)
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidInput("parameters.binary_data_output must be true or false")
    return parameters, client_id, tensors, wanted, binary_default


def answer_body(
    gateway: Gateway,
    name: str,
    request_id: str,
    wanted: list[tuple[str, dict[str, Any]]],
    ks: dict[str, int],
    binary_default: bool,
    layout: Layout,
    fqrv: FQRV,
    frame: Frame,
) -> WireBody:
    """The response body of a scored request, made once for the client and the prediction log
    (shadows get theirs): ``wanted`` outputs (all when empty), ``ks`` classes of classified ones,
    binary outputs by default or not."""
    if not wanted and not ks and not binary_default:
        plain = v2_common.plain_answer(name, request_id, fqrv, frame, layout)
        if plain is not None:
            return WireBody.of(plain)
    outputs = encode_outputs(frame, layout, [n for n, _ in wanted])
    outputs = v2_common.classify_outputs(gateway, fqrv, frame, outputs, ks)
    v2_common.base64_images(gateway, fqrv, outputs)
    contributions = v2_common.explanation_tensor(fqrv, frame)
    if contributions is not None:
        outputs = [*outputs, contributions]
    reply: dict[str, Any] = {"model_name": name, "model_version": fqrv.release, "id": request_id}
    returned = v2_common.response_metadata(frame)
    if layout.explicit or returned:
        reply["parameters"] = {**returned, "content_type": layout.content_type} if layout.explicit else dict(returned)
    return WireBody.of(*encode_response(reply, outputs, dict(wanted), binary_default))


#: Request parameters that change how a request is decoded or answered: left to the general path.
_NOT_PLAIN = TRANSPORT_PARAMETERS | {"content_type", "explain"}
#: Those an np request leaves to the general path (it takes ``content_type: "np"``).
_NOT_PLAIN_NP = _NOT_PLAIN - {"content_type"}
_NO_OUTPUTS: list[tuple[str, dict[str, Any]]] = []
_NO_CLASSES: dict[str, int] = {}


async def _plain_frame(gateway: Gateway, body: bytes, route: Route) -> tuple[Frame, Layout, str | int | None] | None:
    """The Frame, layout and client id of a plain request, read straight into the columns of its
    Frame: every input a named ``[n]`` FP64 or BYTES tensor (pd), or one numeric ``[n, F]`` tensor
    (np); no requested outputs, no parameter that changes the decoding or the answer. None for
    any other, which the general path then decodes (it answers the same for these, in more steps)."""
    plain = _ffjson.v2_columns(body)
    if plain is not None:
        columns, parameters, client_id = plain
        rows = len(next(iter(columns.values())))  # every input has the same rows
    else:
        tensor = _ffjson.v2_np(body)
        if tensor is None:
            return None
        name, rows, values, parameters, client_id = tensor
    explicit = False  # the layout named by parameters.content_type (np requests only)
    if parameters is None:
        parameters = {}
    elif not _NOT_PLAIN.isdisjoint(parameters):
        explicit = plain is None and parameters.get("content_type") == NP and _NOT_PLAIN_NP.isdisjoint(parameters)
        if not explicit:
            return None
    if client_id is not None and not isinstance(client_id, (str, int)):
        return None  # the general path says what is wrong with it
    if rows > gateway.settings.max_rows:
        return None
    await gateway.load_routed(route)  # a cold release: loaded before its inputs lay out the columns
    meta = gateway.decoding_metadata(route)
    layout: Layout | None
    loose: frozenset[str] = frozenset()
    if plain is not None:
        layout = v2_common.plain_layout(meta, columns)
    else:
        laid = v2_common.np_plain(meta, name, values, explicit)
        if laid is None:
            return None
        columns, layout = laid
        loose = frozenset(columns)  # one tensor's datatype for every feature, as decode_inputs says
    if layout is None:
        return None  # a vector input, or one tensor that is no input (the np layout)
    return Frame(columns, dict(parameters), loose), layout, client_id


async def _infer_plain(
    gateway: Gateway, name: str, body: bytes, request_id: str, protocol: str, timeout_s: float | None, route: Route
) -> V2Answer | None:
    """A plain request (:func:`_plain_frame`) scored and answered; None for any other."""
    plain = await _plain_frame(gateway, body, route)
    if plain is None:
        return None
    frame, layout, client_id = plain
    if client_id not in (None, ""):
        request_id = str(client_id)
    result = await gateway.infer(
        route.state.contract,
        frame,
        configs=configs_from(frame.parameters),
        request_id=request_id,
        protocol=protocol,
        timeout_s=timeout_s,
        route=route,
        wire=Wire(
            WireBody.of(body),
            partial(answer_body, gateway, name, request_id, _NO_OUTPUTS, _NO_CLASSES, False, layout),
        ),
    )
    out = result.response_json
    assert isinstance(out, WireBody)
    return V2Answer(result, out, out.json_length, request_id)


async def infer_payload(
    gateway: Gateway,
    name: str,
    version: str | None,
    body: bytes,
    header_length: str | None,
    *,
    request_id: str,
    protocol: str,
    timeout_s: float | None,
    route: Route | None = None,
) -> V2Answer:
    """Decode a V2 inference request body, score it, and encode the V2 response body.

    ``request_id`` is used unless the body carries an ``id``. Shared by the REST route and the
    Kafka front-end; ``route`` is the routing already decided for it, if any.
    """
    if header_length is None and route is not None and not tracing.ON and len(body) <= body_pool.LARGE_BODY_BYTES:
        plain = await _infer_plain(gateway, name, body, request_id, protocol, timeout_s, route)
        if plain is not None:
            return plain
    head, binary = split_body(body, header_length)
    max_rows = gateway.settings.max_rows
    if tracing.ON:
        with tracing.child("decode", **{"forestflow.bytes": len(body)}):
            decoded = await _decoded(head, binary, max_rows)
    elif len(head) > body_pool.LARGE_BODY_BYTES:
        decoded = await _decoded(head, binary, max_rows)
    else:
        decoded = decode_request(head, binary, max_rows)  # the usual body: no coroutine more
    parameters, client_id, tensors, wanted, binary_default = decoded
    if client_id not in (None, ""):
        request_id = str(client_id)
    ks, options = v2_common.output_parameters(wanted)

    def answer(fqrv: FQRV, frame: Frame, layout: Layout) -> WireBody:
        return answer_body(gateway, name, request_id, wanted, ks, binary_default, layout, fqrv, frame)

    result, _ = await v2_common.infer(
        gateway,
        name,
        version,
        tensors,
        {**options, **parameters} if options else parameters,
        request_id=request_id,
        protocol=protocol,
        timeout_s=timeout_s,
        classification=ks,
        wire_request=WireBody.of(body, len(head) if binary else None),
        encode_response=answer,
        route=route,
    )
    out = result.response_json
    assert isinstance(out, WireBody)
    return V2Answer(result, out, out.json_length, request_id)


def add_routes(app: web.Application) -> None:
    """Register the V2 REST routes."""
    r = app.router
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/", server_metadata)
    r.add_get("/v2/health/live", server_live)
    r.add_get("/v2/health/ready", server_ready)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, model_metadata)
        r.add_get(base + "/ready", model_ready)
        r.add_post(base + "/infer", infer)
