"""HTTP middleware: request id, error mapping (never a stack trace), one access-log line per request."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from forestflow import logs, tracing
from forestflow.api.common import CONTRACT, FQRV_TAG, REQUEST_ID, SCORING_S, SETTINGS
from forestflow.api.prom import RequestMetrics
from forestflow.api.responses import ANSWERED_ERROR, error_response
from forestflow.errors import GatewayError, InternalError, InvalidInput, MethodNotAllowed, NotFound, PayloadTooLarge

log = structlog.get_logger("forestflow.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MAX_REQUEST_ID = 128

# Request ids: a random per-process prefix and a counter. uuid4() per request costs a syscall,
# and every syscall on the event loop thread hands the GIL to a scoring thread (a convoy).
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)


def new_request_id() -> str:
    """A request id unique across processes (random prefix) and within one (counter)."""
    return f"{_ID_PREFIX}{next(_ids):010x}"


def _http_error(exc: web.HTTPException, request: web.Request) -> GatewayError:
    if exc.status == 413:
        return PayloadTooLarge(f"request body over the limit of {request.app[SETTINGS].max_body_bytes} bytes")
    if exc.status == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"method {request.method} not allowed on {request.path}")
    return InvalidInput(exc.reason or f"HTTP {exc.status}")


def build_middleware(enable_access_log: bool, metrics: RequestMetrics | None = None) -> Middleware:
    """The middleware that gives every request an id, maps errors to JSON, logs and counts it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        given = request.headers.get("X-Request-Id", "")
        request_id = given if 0 < len(given) <= _MAX_REQUEST_ID and given.isprintable() else new_request_id()
        request[REQUEST_ID] = request_id
        status = 500
        response: web.StreamResponse | None = None
        span = tracing.ServerSpan(f"{request.method} {request.path}", request.headers, "http") if tracing.ON else None
        try:
            response = await handler(request)
            status = response.status
            response.headers.setdefault("X-Request-Id", request_id)
            if span is not None and (parent := span.traceparent()):
                response.headers["traceparent"] = parent
            return response
        except GatewayError as error:
            response = error_response(error, request_id)
            status = response.status
            return response
        except web.HTTPException as exc:
            if exc.status < 400:
                status = exc.status
                raise
            response = error_response(_http_error(exc, request), request_id)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499  # the client disconnected; nothing is sent
            raise
        except Exception:
            log.exception("unhandled_error", request_id=request_id, path=request.path)
            status = 500
            response = error_response(
                InternalError(request.get(FQRV_TAG), "internal error; see the gateway log with this request_id"), request_id
            )
            return response
        finally:
            # One clock read and one lookup of each request field for the span, metrics and access log.
            elapsed = time.perf_counter() - started
            contract, fqrv = request.get(CONTRACT), request.get(FQRV_TAG)
            if span is not None:
                span.end(status, contract, fqrv)
            if metrics is not None:
                metrics.record(request.match_info.route.resource, contract, fqrv, status, elapsed, request.get(SCORING_S))
                if status >= 400:
                    code, message = response.get(ANSWERED_ERROR, (None, None)) if response is not None else (None, None)
                    metrics.errors.append(
                        (time.time(), request.method, request.path[:200], status, request_id, code, (message or "")[:300])
                    )
            if enable_access_log:
                logs.access(
                    request_id,
                    request.method,
                    request.path,
                    status,
                    contract,
                    fqrv,
                    round(elapsed * 1000, 3),
                    span.trace_id if span is not None else None,
                )

    return middleware
