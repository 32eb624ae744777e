"""Scoring requests read from Kafka: what a request message asks for, and the reply it gets.

A request message's value is a body one of the HTTP scoring routes takes; its headers (names
matched without regard to case) say how to read it and where the answer goes:

``content-type``
    ``application/json`` (or none): a ForestFlow InferenceRequest as ``/score`` takes it;
    ``application/x-protobuf``: the same as protobuf; ``application/vnd.v2+json``: a V2 (Open
    Inference Protocol) inference request, JSON, optionally followed by binary tensors whose
    JSON length ``inference-header-content-length`` gives (Triton's binary extension).
``forestflow-contract: org/project/N`` (or ``forestflow-model: org.project.N``, V2's naming)
    the contract that scores it, routed by phase-in with shadow copies, as over HTTP.
``forestflow-reply-topic``
    where the answer goes (default: the ``kafka_reply_topic`` setting). Without one the message
    is not scored: it is logged and counted as dropped.
``forestflow-request-id``
    optional; by default ``topic:partition:offset``, so a message delivered again keeps its id and
    a consumer of the replies can drop duplicates (a V2 body's ``id`` takes precedence, as over HTTP).

The reply carries the request's key, the body the HTTP route would have answered (error bodies
included: ForestFlow's envelope, or V2's ``{"error": ...}``) and the headers ``content-type``,
``forestflow-status`` (the HTTP status), ``forestflow-request-id``, ``forestflow-fqrv`` (who
answered) and, where they apply, ``forestflow-unknown-inputs`` and ``inference-header-content-length``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import structlog

from forestflow.api import basic, v2_rest
from forestflow.api.responses import JSON, dumps, error_payload
from forestflow.core.ids import Contract
from forestflow.errors import GatewayError, InvalidInput, Overloaded, http_status
from forestflow.service import Gateway

log = structlog.get_logger("forestflow.kafka")

BASIC_JSON = "basic-json"
BASIC_PROTOBUF = "basic-protobuf"
V2 = "v2"
#: content-type of a request -> its format.
FORMATS = {"": BASIC_JSON, JSON: BASIC_JSON, basic.PROTOBUF: BASIC_PROTOBUF, "application/vnd.v2+json": V2}
HEADER_LENGTH = "inference-header-content-length"

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_MAX_REQUEST_ID = 128


@dataclass(slots=True)
class Request:
    """A request message as its headers describe it (the body is decoded when it is scored)."""

    format: str
    contract: Contract | None
    #: Where the answer goes; None: nowhere, the message is dropped (``dropped`` says why).
    reply_topic: str | None
    request_id: str
    #: A header problem: the message is answered with this error instead of being scored.
    error: GatewayError | None = None
    dropped: str = ""
    v2_model: str = ""
    v2_header_length: str | None = None


@dataclass(slots=True)
class Reply:
    """What goes to the reply topic."""

    status: int
    value: bytes
    headers: list[tuple[str, bytes]]


def _headers(raw: Any) -> dict[str, bytes]:
    return {str(name).lower(): value or b"" for name, value in raw or ()}


def _text(headers: dict[str, bytes], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return value.decode().strip()
    except UnicodeDecodeError:
        raise InvalidInput(f"header {name}: not UTF-8 text") from None


def read_request(topic: str, partition: int, offset: int, raw_headers: Any, default_reply_topic: str) -> Request:
    """Read what a message asks for from its headers; never raises (problems become ``error``)."""
    headers = _headers(raw_headers)
    request_id = f"{topic}:{partition}:{offset}"
    try:
        given = _text(headers, "forestflow-request-id")
        if given and len(given) <= _MAX_REQUEST_ID and given.isprintable():
            request_id = given
    except InvalidInput:
        pass
    try:
        reply_topic = _text(headers, "forestflow-reply-topic") or default_reply_topic
    except InvalidInput:
        reply_topic = ""
    if not reply_topic:
        return Request(BASIC_JSON, None, None, request_id, dropped="no_reply_topic")
    if not _TOPIC.match(reply_topic):
        return Request(BASIC_JSON, None, None, request_id, dropped="invalid_reply_topic")
    request = Request(BASIC_JSON, None, reply_topic, request_id)
    try:
        content_type = (_text(headers, "content-type") or "").split(";")[0].strip().lower()
        request.format = FORMATS.get(content_type, "")
        if not request.format:
            request.format = BASIC_JSON
            raise InvalidInput(f"content-type {content_type!r}: expected one of {', '.join(t for t in FORMATS if t)}")
        request.contract = _contract(headers, request)
        request.v2_header_length = _text(headers, HEADER_LENGTH)
    except GatewayError as error:
        request.error = error
    return request


def _contract(headers: dict[str, bytes], request: Request) -> Contract:
    contract, model = _parse_contract(headers.get("forestflow-contract"), headers.get("forestflow-model"))
    request.v2_model = model
    return contract


@functools.lru_cache(maxsize=1024)
def _parse_contract(path_header: bytes | None, model_header: bytes | None) -> tuple[Contract, str]:
    """The contract the headers name and its V2 model name (cached: a topic's messages repeat them)."""
    headers = {k: v for k, v in (("forestflow-contract", path_header), ("forestflow-model", model_header)) if v is not None}
    path = _text(headers, "forestflow-contract")
    model = _text(headers, "forestflow-model")
    if path:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or not parts[2].isdigit():
            raise InvalidInput(f"header forestflow-contract: expected org/project/N, got {path!r}")
        contract = Contract(parts[0], parts[1], int(parts[2]))
    elif model:
        try:
            contract = Contract.parse(model)
        except InvalidInput:
            raise InvalidInput(f"header forestflow-model: expected org.project.N, got {model!r}") from None
    else:
        raise InvalidInput("header forestflow-contract (org/project/N) or forestflow-model (org.project.N) is required")
    return contract, model or str(contract)


async def answer(gateway: Gateway, request: Request, value: bytes | None) -> Reply:
    """Score a request message and build its reply; every failure becomes an error reply.

    :class:`Overloaded` is the one error raised instead of answered: the caller holds the message
    back and tries again when there is room (a Kafka request is never refused for load).
    """
    try:
        if request.error is not None:
            raise request.error
        assert request.contract is not None
        gateway.contract_state(request.contract)
        body = value or b""
        if request.format == V2:
            v2 = await v2_rest.infer_payload(
                gateway,
                request.v2_model,
                None,
                body,
                request.v2_header_length,
                request_id=request.request_id,
                protocol="kafka",
                timeout_s=None,
            )
            request.request_id = v2.request_id
            headers = [("content-type", JSON.encode() if v2.json_length is None else b"application/octet-stream")]
            if v2.json_length is not None:
                headers.append((HEADER_LENGTH, str(v2.json_length).encode()))
            result, payload = v2.result, v2.body
        else:
            as_proto = request.format == BASIC_PROTOBUF
            result, payload = await basic.score_payload(
                gateway,
                request.contract,
                body,
                as_proto=as_proto,
                request_id=request.request_id,
                protocol="kafka",
                timeout_s=None,
            )
            headers = [("content-type", (basic.PROTOBUF if as_proto else JSON).encode())]
    except Overloaded:
        raise
    except GatewayError as error:
        return error_reply(request, error)
    except Exception:  # a defect must not stop the partition: answer 500, log the detail
        log.exception("kafka_request_failed", request_id=request.request_id)
        return error_reply(request, GatewayError("internal error while scoring the request"))
    headers += [
        ("forestflow-status", b"200"),
        ("forestflow-request-id", request.request_id.encode()),
        ("forestflow-fqrv", str(result.fqrv).encode()),
    ]
    unknown = result.frame.parameters.get("unknown_inputs") or []
    if unknown:
        headers.append(("forestflow-unknown-inputs", ",".join(unknown).encode()))
    return Reply(200, payload, headers)


def error_reply(request: Request, error: GatewayError) -> Reply:
    """The error body the HTTP route would have answered, with its status in a header."""
    status = http_status(error)
    if request.format == V2:
        body = dumps({"error": error.message})
    else:
        body = dumps(error_payload(error, request.request_id))
    headers = [
        ("content-type", JSON.encode()),
        ("forestflow-status", str(status).encode()),
        ("forestflow-request-id", request.request_id.encode()),
    ]
    return Reply(status, body, headers)
