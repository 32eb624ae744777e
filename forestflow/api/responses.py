"""JSON responses and the error body every HTTP front-end answers with.

Errors keep ForestFlow's envelope (``{"UnknownContract": {"contract": {...}}}``) and add the
fields every client can rely on: ``error`` (a safe message), ``code`` and ``request_id``. The
Content-Type is exactly ``application/json`` (the kserve SDK only reads errors with that value).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from forestflow.codecs.ff_settings import contract_to_json, fqrv_to_json, servable_settings_to_json
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ServableSettings
from forestflow.errors import GatewayError, http_status

JSON = "application/json"
#: The error a response answers (code, message), for the page's "Recent errors".
ANSWERED_ERROR = web.ResponseKey("answered_error", tuple)


def dumps(payload: Any) -> bytes:
    """orjson with numpy support (NaN becomes null)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response with ``Content-Type: application/json`` exactly."""
    return web.Response(body=dumps(payload), status=status, content_type=JSON, headers=headers)


def _field_json(value: Any) -> Any:
    if isinstance(value, FQRV):
        return fqrv_to_json(value)
    if isinstance(value, Contract):
        return contract_to_json(value)
    if isinstance(value, ServableSettings):
        return servable_settings_to_json(value)
    return value


def error_payload(error: GatewayError, request_id: str) -> dict[str, Any]:
    """ForestFlow's envelope plus ``error``, ``code`` and ``request_id``."""
    body = {k: _field_json(v) for k, v in error.fields.items() if v is not None}
    return {error.envelope_key: body, "error": error.message, "code": error.code, "request_id": request_id}


def error_response(error: GatewayError, request_id: str) -> web.Response:
    """The HTTP response for a gateway error (503s carry Retry-After)."""
    return _response(error_parts(error, request_id), error)


def v2_error_response(error: GatewayError, request_id: str, *, detailed: bool = False) -> web.Response:
    """The KServe V1/V2 error: exactly ``{"error": message}`` (what tritonclient and kserve read);
    ``detailed`` adds ``code`` and ``request_id`` as every other error of the gateway has them."""
    return _response(error_parts(error, request_id, v2=True, detailed=detailed), error)


def error_parts(
    error: GatewayError, request_id: str, *, v2: bool = False, detailed: bool = False
) -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body and headers of the answer to a gateway error: ForestFlow's envelope, or
    (``v2``) the KServe V1/V2 ``{"error": message}`` (``detailed``: with ``code`` and ``request_id``)."""
    headers = {"X-Request-Id": request_id}
    status = http_status(error)
    if status == 503:
        headers["Retry-After"] = _retry_after(error)
    if not v2:
        return status, dumps(error_payload(error, request_id)), headers
    body: dict[str, Any] = {"error": error.message}
    if detailed:
        body.update(code=error.code, request_id=request_id)
    return status, dumps(body), headers


def _response(parts: tuple[int, bytes, dict[str, str]], error: GatewayError) -> web.Response:
    status, body, headers = parts
    response = web.Response(body=body, status=status, content_type=JSON, headers=headers)
    response[ANSWERED_ERROR] = (error.code, error.message)
    return response


def _retry_after(error: GatewayError) -> str:
    """Whole seconds, at least 1: the error's own ``retry_after`` (queues, backends), else 1."""
    seconds = getattr(error, "retry_after", None)
    return str(max(1, round(seconds))) if isinstance(seconds, int | float) else "1"
