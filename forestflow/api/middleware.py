"""HTTP middleware: request id, error mapping (never a stack trace), one access-log line per request."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

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


def request_id_from(given: str) -> str:
    """The id of a request: the client's ``X-Request-Id`` when it sent a sane one, else a new one."""
    return given if 0 < len(given) <= _MAX_REQUEST_ID and given.isprintable() else new_request_id()


def internal_error(fqrv: str | None) -> InternalError:
    """What a request that failed on a bug answers (the log has the stack trace, under its request id)."""
    return InternalError(fqrv, "internal error; see the gateway log with this request_id")


class RequestRecorder:
    """What every finished HTTP request leaves behind, whichever path served it (the middleware, or
    the fast path of ``api/fast_http.py``): its count and times, the recent errors, its access-log line."""

    def __init__(self, enable_access_log: bool, metrics: RequestMetrics | None) -> None:
        self.access_log = enable_access_log
        self.metrics = metrics

    def finish(
        self,
        resource: Any,
        method: str,
        path: str,
        request_id: str,
        status: int,
        elapsed: float,
        contract: str | None,
        fqrv: str | None,
        scoring_s: float | None,
        error: tuple[str | None, str | None] | None,
        trace_id: str | None = None,
    ) -> None:
        """Record one request: ``resource`` is the aiohttp resource that answered (its protocol label),
        ``error`` the (code, message) of the error it answered, if any."""
        metrics = self.metrics
        if metrics is not None:
            metrics.record(resource, contract, fqrv, status, elapsed, scoring_s)
            if status >= 400:
                code, message = error if error is not None else (None, None)
                metrics.errors.append((time.time(), method, path[:200], status, request_id, code, (message or "")[:300]))
        if self.access_log:
            logs.access(request_id, method, path, status, contract, fqrv, round(elapsed * 1000, 3), trace_id)


#: The app's recorder (the fast path records its requests there too).
RECORDER = web.AppKey("request_recorder", RequestRecorder)


def build_middleware(recorder: RequestRecorder) -> Middleware:
    """The middleware that gives every request an id, maps errors to JSON, logs and counts it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = request[REQUEST_ID] = request_id_from(request.headers.get("X-Request-Id", ""))
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
            response = error_response(internal_error(request.get(FQRV_TAG)), request_id)
            return response
        finally:
            # One clock read and one lookup of each request field for the span, metrics and access log.
            elapsed = time.perf_counter() - started
            contract, fqrv = request.get(CONTRACT), request.get(FQRV_TAG)
            if span is not None:
                span.end(status, contract, fqrv)
            recorder.finish(
                request.match_info.route.resource,
                request.method,
                request.path,
                request_id,
                status,
                elapsed,
                contract,
                fqrv,
                request.get(SCORING_S),
                response.get(ANSWERED_ERROR) if response is not None else None,
                span.trace_id if span is not None else None,
            )

    return middleware
