"""Small helpers shared by the HTTP front-ends: path ids, JSON bodies, deadlines, the app's keys."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web

from forestflow.api.prom import RequestMetrics
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.input_report import missing_inputs, unknown_inputs
from forestflow.errors import InvalidInput
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
    info = request.match_info
    key = (info["org"], info["project"], info["n"])
    known = _PATH_CONTRACTS.get(key)
    if known is None:
        contract = Contract(key[0], key[1], int(key[2]))  # InvalidInput for a bad name: never cached
        if len(_PATH_CONTRACTS) >= MAX_CACHED_CONTRACTS:
            _PATH_CONTRACTS.clear()
        known = _PATH_CONTRACTS[key] = (contract, str(contract))
    request[CONTRACT] = known[1]
    return known[0]


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


def timeout_from(request: web.Request) -> float | None:
    """The deadline the client asked for, in seconds (None = the configured default)."""
    value = request.headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        raise InvalidInput(f"{DEADLINE_HEADER}: expected milliseconds, got {value!r}") from None
    if not 0 < ms <= 3_600_000:
        raise InvalidInput(f"{DEADLINE_HEADER}: must be between 1 and 3600000 ms")
    return ms / 1000


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
