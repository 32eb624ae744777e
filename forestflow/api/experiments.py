"""Reward feedback over HTTP (pinned releases are :mod:`forestflow.api.pinning`).

- ``POST /{org}/{project}/{n}/feedback`` and ``POST /v2/models/{model}/feedback`` with
  ``{"requestId": "<the answer's X-Request-Id>", "reward": 1.0}`` count the reward for the release
  that answered that request (``/stats``, ``/metrics``, the page, the bandit routers) and log it as a
  feedback event.
"""

from __future__ import annotations

import math

from aiohttp import web

from forestflow.api import v2_common
from forestflow.api.common import CONTRACT, FQRV_TAG, GATEWAY, contract_from, read_json
from forestflow.api.responses import json_response
from forestflow.api.v2_rest import v2_errors
from forestflow.codecs.ff_settings import fqrv_to_json
from forestflow.codecs.jsonread import Obj
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import InvalidInput

#: Longest request id a feedback may name (the middleware takes no longer X-Request-Id).
MAX_REQUEST_ID = 200


async def _parse_feedback(request: web.Request) -> tuple[str, float]:
    o = Obj(await read_json(request), "")
    request_id = o.str("requestId")
    if not 0 < len(request_id) <= MAX_REQUEST_ID:
        raise InvalidInput(f"requestId: expected the X-Request-Id of an answer (1 to {MAX_REQUEST_ID} characters)")
    reward = o.float("reward")
    if not math.isfinite(reward):
        raise InvalidInput(f"reward: expected a finite number, got {reward!r}")
    return request_id, reward


async def _record(request: web.Request, contract: Contract) -> tuple[FQRV, str, float]:
    gateway = request.app[GATEWAY]
    gateway.contract_state(contract)  # 404 for an unknown contract, whatever the body
    request_id, reward = await _parse_feedback(request)
    fqrv = await gateway.feedback(contract, request_id, reward)
    request[FQRV_TAG] = str(fqrv)
    return fqrv, request_id, reward


async def feedback(request: web.Request) -> web.Response:
    """POST /{org}/{project}/{n}/feedback: ``{"FeedbackRecorded": {"fqrv", "requestId", "reward"}}``."""
    fqrv, request_id, reward = await _record(request, contract_from(request))
    return json_response({"FeedbackRecorded": {"fqrv": fqrv_to_json(fqrv), "requestId": request_id, "reward": reward}})


@v2_errors
async def v2_feedback(request: web.Request) -> web.Response:
    """POST /v2/models/{model}/feedback: ``{"model_name", "model_version", "id", "reward"}`` of the
    answer rewarded."""
    name = request.match_info["model"]
    request[CONTRACT] = name
    fqrv, request_id, reward = await _record(request, v2_common.model_contract(name))
    return json_response({"model_name": name, "model_version": fqrv.release, "id": request_id, "reward": reward})


def add_routes(app: web.Application) -> None:
    """Register the feedback routes."""
    app.router.add_post("/{org}/{project}/{n:\\d+}/feedback", feedback)
    app.router.add_post("/v2/models/{model}/feedback", v2_feedback)
