"""Small helpers shared by the HTTP front-ends: path ids, JSON bodies, deadlines, the app's keys."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from forestflow.core.ids import FQRV, Contract
from forestflow.errors import InvalidInput
from forestflow.service import Gateway
from forestflow.settings import Settings

GATEWAY = web.AppKey("gateway", Gateway)
SETTINGS = web.AppKey("settings", Settings)
#: The task that starts the gateway (restore and load) while the server already answers.
STARTING = web.AppKey("starting", asyncio.Task)
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


def contract_from(request: web.Request) -> Contract:
    """The contract named by ``/{org}/{project}/{n}`` in the path."""
    info = request.match_info
    contract = Contract(info["org"], info["project"], int(info["n"]))
    request[CONTRACT] = str(contract)
    return contract


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
