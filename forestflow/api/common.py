"""Small helpers shared by the HTTP front-ends: path ids, JSON bodies, deadlines, the app's keys."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web

from forestflow.api.prom import RequestMetrics
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.input_report import missing_inputs, unknown_inputs
from forestflow.errors import InvalidInput, PayloadTooLarge
from forestflow.service import Gateway
from forestflow.settings import Settings
from forestflow.supervisor import WorkerIdentity

GATEWAY = web.AppKey("gateway", Gateway)
SETTINGS = web.AppKey("settings", Settings)
#: Which worker of ``forestflow serve --workers N`` this process is (absent: a single process).
WORKER = web.AppKey("worker", WorkerIdentity)
#: The task that starts the gateway (restore and load) while the server already answers.
STARTING = web.AppKey("starting", asyncio.Task)
#: What runs once the gateway has started, in order (model repository, Kafka ingestion).
AFTER_START = web.AppKey("after_start", list)
#: The port the V2 gRPC server listens on (None when disabled); tests read it when grpc_port = 0.
GRPC_PORT = web.AppKey("grpc_port", object)
#: Set by the app when /metrics counts requests; gRPC calls are counted there too.
GRPC_METRICS = web.AppKey("grpc_metrics", RequestMetrics)
#: Per-request values the middleware and the access log read.
REQUEST_ID = web.RequestKey("request_id", str)
CONTRACT = web.RequestKey("contract", str)
FQRV_TAG = web.RequestKey("fqrv", str)
#: Seconds the answering servable took (queue wait and predict), for the scoring-time histogram.
SCORING_S = web.RequestKey("scoring_s", float)

#: Per-request deadline header (milliseconds), lowering or raising the configured default.
DEADLINE_HEADER = "X-Request-Timeout-Ms"


def request_id_of(request: web.Request) -> str:
    """The id the middleware gave this request (``X-Request-Id`` when the client sent a sane one)."""
    return request.get(REQUEST_ID) or ""


#: Contracts already named in a request path, with their text. Making a Contract checks its names
#: with two regular expressions and a frozen dataclass sets each field through object.__setattr__:
#: a cost on every request otherwise. Bounded, since clients may name any number of (unknown) contracts.
_PATH_CONTRACTS: dict[tuple[str, str, str], tuple[Contract, str]] = {}
MAX_CACHED_CONTRACTS = 1024


def contract_from(request: web.Request) -> Contract:
    """The contract named by ``/{org}/{project}/{n}`` in the path."""
    contract, text = path_contract(request.match_info)
    request[CONTRACT] = text
    return contract


def path_contract(params: Mapping[str, str]) -> tuple[Contract, str]:
    """The contract named by the path parameters ``org``, ``project`` and ``n``, and its text."""
    key = (params["org"], params["project"], params["n"])
    known = _PATH_CONTRACTS.get(key)
    if known is None:
        contract = Contract(key[0], key[1], int(key[2]))  # InvalidInput for a bad name: never cached
        if len(_PATH_CONTRACTS) >= MAX_CACHED_CONTRACTS:
            _PATH_CONTRACTS.clear()
        known = _PATH_CONTRACTS[key] = (contract, str(contract))
    return known


def fqrv_from(request: web.Request) -> FQRV:
    """The servable named by ``/{org}/{project}/{n}/{release}`` in the path."""
    fqrv = FQRV(contract_from(request), request.match_info["release"])
    request[FQRV_TAG] = str(fqrv)
    return fqrv


async def read_json(request: web.Request) -> Any:
    """The request body parsed as JSON, or a 400 that says why not."""
    return parse_json(await request.read())


def parse_json(body: bytes) -> Any:
    """``body`` parsed as JSON, or a 400 that says why not."""
    if not body:
        raise InvalidInput("body: empty; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body: not valid JSON ({exc.msg} at position {exc.pos})") from None


def timeout_from(headers: Mapping[str, str]) -> float | None:
    """The deadline the client asked for (request headers), in seconds (None = the configured default)."""
    value = headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        raise InvalidInput(f"{DEADLINE_HEADER}: expected milliseconds, got {value!r}") from None
    if not 0 < ms <= 3_600_000:
        raise InvalidInput(f"{DEADLINE_HEADER}: must be between 1 and 3600000 ms")
    return ms / 1000


def content_type_of(headers: Mapping[str, str]) -> str:
    """The media type of a request's ``Content-Type`` (lower case, without parameters), as aiohttp's ``content_type``."""
    return headers.get("Content-Type", "application/octet-stream").partition(";")[0].strip().lower()


def input_headers(output: Frame) -> dict[str, str]:
    """``X-Forestflow-Unknown-Inputs`` / ``X-Forestflow-Missing-Inputs`` for an answer, when it has any.

    Unknown: request columns the model ignored; missing: model inputs the request lacked (scored
    as NA). Servables with ``strictInputs`` answer 400 instead.
    """
    headers = {}
    unknown, missing = unknown_inputs(output), missing_inputs(output)
    if unknown:
        headers["X-Forestflow-Unknown-Inputs"] = header_names(unknown)
    if missing:
        headers["X-Forestflow-Missing-Inputs"] = header_names(missing)
    return headers


#: Printable ASCII but the comma (the separator) and the percent sign (the escape) stays as is.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in ",%")


def header_names(names: list[str]) -> str:
    """Column names for a header value: comma-separated, anything else than printable ASCII
    percent-encoded (a client-chosen name may hold a newline, a comma or any character)."""
    return ",".join(quote(str(n), safe=_HEADER_SAFE) for n in names)


def with_load(doc: dict[str, Any], load: dict[str, Any] | None) -> dict[str, Any]:
    """A release's document with its ``"load"`` state (``Gateway.load_view``: lazy loading only)."""
    return doc if load is None else doc | {"load": load}


# ---- exchanges: the scoring routes, whatever carries the request -----------------------------------
@dataclass(slots=True)
class Exchange:
    """One scoring request as its front-end sees it, whether aiohttp's Request carries it or the fast
    path (``api/fast_http.py``): path parameters, headers, the body's reader, the request id and path. The
    front-end fills in what the access log and the metrics read (contract, fqrv, scoring time)."""

    gateway: Gateway
    params: Mapping[str, str]
    headers: Mapping[str, str]
    read: Callable[[], Awaitable[bytes]]
    request_id: str
    path: str
    contract: str | None = None
    fqrv: str | None = None
    scoring_s: float | None = None


@dataclass(slots=True)
class Reply:
    """What a scoring route answers: status, content type, body, extra headers, and the coding
    (``gzip``/``deflate``) its body is to be compressed with, if any."""

    body: bytes
    content_type: str
    status: int = 200
    headers: dict[str, str] | None = None
    compress: str | None = None


Answer = Callable[[Exchange], Awaitable[Reply]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ExchangeRoute:
    """A route whose aiohttp handler answers through a protocol-free :data:`Answer` (which the fast
    path calls directly); ``v2_errors``: gateway errors are answered as V2 error bodies."""

    answer: Answer
    v2_errors: bool


#: aiohttp handler -> its exchange, for the fast path (filled by :func:`exchange_handler`).
EXCHANGE_ROUTES: dict[Callable[..., Any], ExchangeRoute] = {}


def exchange_handler(answer: Answer) -> Handler:
    """The aiohttp handler of a scoring route: ``answer`` on the request's Exchange."""

    async def handler(request: web.Request) -> web.StreamResponse:
        exchange = Exchange(
            request.app[GATEWAY], request.match_info, request.headers, _reader(request), request_id_of(request), request.path
        )
        try:
            reply = await answer(exchange)
        finally:
            if exchange.contract is not None:
                request[CONTRACT] = exchange.contract
            if exchange.fqrv is not None:
                request[FQRV_TAG] = exchange.fqrv
            if exchange.scoring_s is not None:
                request[SCORING_S] = exchange.scoring_s
        response = web.Response(body=reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)
        if reply.compress is not None:
            response.enable_compression(web.ContentCoding(reply.compress))
        return response

    handler.__name__ = answer.__name__
    handler.__doc__ = answer.__doc__
    return handler


def register_exchange(handler: Handler, answer: Answer, *, v2_errors: bool = False) -> Handler:
    """Record that the route ``handler`` answers through ``answer`` (the fast path calls it directly)."""
    EXCHANGE_ROUTES[handler] = ExchangeRoute(answer, v2_errors)
    return handler


def _reader(request: web.Request) -> Callable[[], Awaitable[bytes]]:
    async def read() -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SETTINGS].max_body_bytes
            raise PayloadTooLarge(f"request body over the limit of {limit} bytes") from None

    return read
