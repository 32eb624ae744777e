"""ForestFlow's admin API: deploy, update and delete servables and contracts; list, stats, settings.

Everything that deploys, changes or deletes needs ``Authorization: Bearer <token>`` when an admin
token is configured (401 without, 403 wrong, compared in constant time, each refusal logged).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from forestflow.api.common import FQRV_TAG, GATEWAY, SETTINGS, contract_from, fqrv_from, read_json, request_id_of
from forestflow.api.responses import json_response
from forestflow.codecs.ff_settings import (
    contract_settings_to_json,
    contract_to_json,
    fqrv_to_json,
    metrics_to_json,
    parse_contract_settings,
    parse_logging,
    parse_policy,
    parse_serve_request,
    servable_settings_to_json,
)
from forestflow.codecs.jsonread import Obj
from forestflow.core.ids import Contract
from forestflow.core.policies import ContractSettings
from forestflow.errors import ContractValidationError, Forbidden, InvalidInput, StoreUnavailable, Unauthenticated

audit = structlog.get_logger("forestflow.audit")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _audit_refusal(request: web.Request, reason: str) -> None:
    """The audit line of an admin call refused for its credentials."""
    audit.warning(
        "admin_refused",
        reason=reason,
        method=request.method,
        path=request.path,
        peer=request.remote,
        request_id=request_id_of(request),
    )


def _bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    scheme, _, given = authorization.partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def is_admin_token(settings_token: str, authorization: str) -> bool:
    """Whether an ``Authorization`` header carries the configured admin token (never without one:
    a gateway without a token has no admin callers to tell apart)."""
    given = _bearer(authorization)
    return bool(settings_token) and given is not None and hmac.compare_digest(given.encode(), settings_token.encode())


def admin(handler: Handler) -> Handler:
    """Require the admin bearer token (when one is configured) before running ``handler``."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        token = request.app[SETTINGS].admin_token
        if token:
            given = _bearer(request.headers.get("Authorization", ""))
            if given is None:
                _audit_refusal(request, "no credentials")
                raise Unauthenticated("admin routes need Authorization: Bearer <token>")
            if not hmac.compare_digest(given.encode(), token.encode()):
                _audit_refusal(request, "wrong token")
                raise Forbidden("the admin token is wrong")
        if not request.app[GATEWAY].started:
            raise StoreUnavailable("the gateway is starting (restoring the registry); try again")
        # Shielded: a client that disconnects mid-deploy must not cut a write between the store
        # and the in-memory registry (the server cancels handlers of disconnected clients).
        response = await asyncio.shield(handler(request))
        audit.info(
            "admin_write",
            method=request.method,
            path=request.path,
            status=response.status,
            peer=request.remote,
            request_id=request_id_of(request),
        )
        return response

    return guarded


# ---- servables ------------------------------------------------------------------------------------
async def create_servable(request: web.Request) -> web.Response:
    """POST /servable (and /servable/{org}/{project}/{n}/{release}): deploy and load a servable."""
    url_fqrv = fqrv_from(request) if "release" in request.match_info else None
    body = await read_json(request)
    definition = parse_serve_request(body, url_fqrv)
    request[FQRV_TAG] = str(definition.fqrv)
    fqrv = await request.app[GATEWAY].admin.create_servable(definition)
    return json_response({"ServableCreatedSuccessfully": {"fqrv": fqrv_to_json(fqrv)}})


async def update_policy(request: web.Request) -> web.Response:
    """PUT .../{release}/policy-settings: replace validity and phase-in."""
    fqrv = fqrv_from(request)
    policy = parse_policy(Obj(await read_json(request), ""))
    await request.app[GATEWAY].admin.update_policy(fqrv, policy)
    return json_response({"ServableUpdatedSuccessfully": {"fqrv": fqrv_to_json(fqrv)}})


async def update_logging(request: web.Request) -> web.Response:
    """PUT .../{release}/logging-settings: replace the logging settings."""
    fqrv = fqrv_from(request)
    logging = parse_logging(Obj(await read_json(request), ""))
    await request.app[GATEWAY].admin.update_logging(fqrv, logging)
    return json_response({"ServableUpdatedSuccessfully": {"fqrv": fqrv_to_json(fqrv)}})


async def update_performance(request: web.Request) -> web.Response:
    """PUT .../{release}/performance-metrics: report metrics (``{"performanceMetrics": {"auc": 0.9}}``)."""
    fqrv = fqrv_from(request)
    o = Obj(await read_json(request), "")
    raw = o.raw("performanceMetrics")
    if not isinstance(raw, dict) or not raw:
        raise InvalidInput("performanceMetrics: required, an object of metric name -> number")
    values = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInput(f"performanceMetrics.{name}: expected a number, got {value!r}")
        values[str(name)] = float(value)
    await request.app[GATEWAY].admin.update_performance(fqrv, values)
    return json_response({"ServableUpdatedSuccessfully": {"fqrv": fqrv_to_json(fqrv)}})


async def delete_servable(request: web.Request) -> web.Response:
    """DELETE /{org}/{project}/{n}/{release}: remove it (a no-op for an unknown release, as ForestFlow)."""
    fqrv = fqrv_from(request)
    deleted = await request.app[GATEWAY].admin.delete_servable(fqrv)
    return json_response({"ServablesDeletedSuccessfully": {"fqrv": [fqrv_to_json(f) for f in deleted] or [fqrv_to_json(fqrv)]}})


# ---- contracts ------------------------------------------------------------------------------------
def _contract_settings(contract: Contract, body: Any) -> ContractSettings:
    """A contract settings body; settings that cannot be applied are a 422 naming the field."""
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a ContractSettings object")
    try:
        return parse_contract_settings(Obj(body, ""))
    except InvalidInput as error:
        raise ContractValidationError(contract, error.message) from None


async def create_contract(request: web.Request) -> web.Response:
    """POST /contract/{org}/{project}/{n}: register a contract with its settings."""
    contract = contract_from(request)
    settings = _contract_settings(contract, await read_json(request))
    await request.app[GATEWAY].admin.create_contract(contract, settings)
    return json_response({"ContractCreatedSuccessfully": {"contract": contract_to_json(contract)}})


async def update_contract(request: web.Request) -> web.Response:
    """PUT /{org}/{project}/{n}: replace a contract's settings, rebuilding its router."""
    contract = contract_from(request)
    settings = _contract_settings(contract, await read_json(request))
    await request.app[GATEWAY].admin.update_contract(contract, settings)
    return json_response({"ContractUpdatedSuccessfully": {"contract": contract_to_json(contract)}})


# ---- reads ----------------------------------------------------------------------------------------
async def list_contracts(request: web.Request) -> web.Response:
    """GET /contracts/list."""
    contracts = sorted(request.app[GATEWAY].contracts)
    return json_response({"Contracts": {"contracts": [contract_to_json(c) for c in contracts]}})


async def list_releases(request: web.Request) -> web.Response:
    """GET .../releases or .../list: ``[{"FQRV": ...}]``."""
    entries = request.app[GATEWAY].servable_entries(contract_from(request))
    return json_response([{"FQRV": fqrv_to_json(e.fqrv)} for e in entries])


async def stats(request: web.Request) -> web.Response:
    """GET .../stats: ``[{"ServableMetrics": ...}]``; a release whose load keeps failing on this
    process follows, with ``"load": {"state": "failed", "error", "attempts", "retryInS"}``."""
    gateway = request.app[GATEWAY]
    contract = contract_from(request)
    failing = gateway.failing_entries(contract)
    entries = gateway.servable_entries(contract, empty_ok=bool(failing))
    # Counters summed over every replica sharing the registry (this one's own with a file store).
    out = [{"ServableMetrics": metrics_to_json(e.fqrv, gateway.stats_metrics(e))} for e in entries]
    out += [{"ServableMetrics": metrics_to_json(e.fqrv, e.metrics) | {"load": status.view()}} for e, status in failing]
    return json_response(out)


async def servable_settings_list(request: web.Request) -> web.Response:
    """GET .../servable-settings: ``[{"ServableSettings": ...}]`` (with the fqrv added to each)."""
    entries = request.app[GATEWAY].servable_entries(contract_from(request))
    return json_response(
        [{"ServableSettings": servable_settings_to_json(e.settings) | {"fqrv": fqrv_to_json(e.fqrv)}} for e in entries]
    )


async def contract_settings(request: web.Request) -> web.Response:
    """GET .../contract-settings."""
    gateway = request.app[GATEWAY]
    contract = contract_from(request)
    state = gateway.contract_state(contract)
    return json_response({"ContractSettings": contract_settings_to_json(state.settings)})


async def servable_settings(request: web.Request) -> web.Response:
    """GET .../{release}/settings."""
    entry = request.app[GATEWAY].entry(fqrv_from(request))
    return json_response({"ServableSettings": servable_settings_to_json(entry.settings)})


def add_routes(app: web.Application) -> None:
    """Register the admin routes (ForestFlow's paths and their aliases)."""
    contract = "/{org}/{project}/{n:\\d+}"
    release = contract + "/{release}"
    r = app.router
    r.add_post("/servable", admin(create_servable))
    r.add_post("/servable" + release, admin(create_servable))
    r.add_post("/contract" + contract, admin(create_contract))
    r.add_put(contract, admin(update_contract))
    r.add_get("/contracts/list", list_contracts)
    for suffix in ("/releases", "/list"):
        r.add_get(contract + suffix, list_releases)
    r.add_get(contract + "/stats", stats)
    for suffix in ("/servable-settings", "/s-settings"):
        r.add_get(contract + suffix, servable_settings_list)
    for suffix in ("/contract-settings", "/c-settings"):
        r.add_get(contract + suffix, contract_settings)
    r.add_get(release + "/settings", servable_settings)
    for suffix in ("/policy-settings", "/policy"):
        r.add_put(release + suffix, admin(update_policy))
    for suffix in ("/logging-settings", "/logging"):
        r.add_put(release + suffix, admin(update_logging))
    r.add_put(release + "/performance-metrics", admin(update_performance))
    r.add_delete(release, admin(delete_servable))
