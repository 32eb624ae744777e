"""Builds the aiohttp application: the Gateway and its resources, the middleware, every route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from forestflow.api import admin, basic, dashboard, graphpipe, ops
from forestflow.api import v1_rest, v2_grpc, v2_rest
from forestflow.api.common import GATEWAY, SETTINGS, STARTING
from forestflow.api.middleware import build_middleware
from forestflow.api.prom import RequestMetrics, build_registry
from forestflow.predlog import make_prediction_log
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.store import FileStore, Store
from forestflow.service import Gateway
from forestflow.errors import StoreUnavailable
from forestflow.settings import Settings

log = structlog.get_logger("forestflow")


def make_store(settings: Settings) -> Store:
    """The registry store the settings choose: Redis when a URL is set, else the embedded file."""
    if settings.redis_url:
        from forestflow.registry.redis_store import RedisStore

        return RedisStore(settings.redis_url, settings.redis_sync_interval_s)
    return FileStore(settings.data_dir / "state" / "registry.json")


def make_gateway(settings: Settings) -> Gateway:
    """A Gateway wired to the store, artifact cache and prediction log the settings choose."""
    return Gateway(
        settings,
        make_store(settings),
        ArtifactCache(settings.data_dir / "artifacts"),
        make_prediction_log(settings),
    )


async def _start_until_reachable(gateway: Gateway, retry_s: float) -> None:
    """Start the gateway; while the registry store cannot be reached, retry (readiness says so)."""
    while True:
        try:
            await gateway.start()
            return
        except StoreUnavailable as error:
            log.warning("store_unreachable_at_start", reason=error.message, retry_in_s=retry_s)
            await asyncio.sleep(retry_s)
        except Exception:
            log.exception("gateway_start_failed")
            raise


async def _gateway_context(app: web.Application) -> AsyncIterator[None]:
    """The gateway starts (restores and loads its servables) while the server already answers:
    liveness passes, readiness fails until every servable is loaded."""
    settings = app[SETTINGS]
    gateway = make_gateway(settings)
    app[GATEWAY] = gateway
    starting = asyncio.create_task(_start_until_reachable(gateway, min(2.0, settings.redis_sync_interval_s)), name="gateway-start")
    app[STARTING] = starting
    yield
    if not starting.done():
        starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    await gateway.stop()


def build_app(settings: Settings) -> web.Application:
    """The HTTP application serving ForestFlow's admin and BASIC APIs and the health routes."""
    request_metrics = RequestMetrics() if settings.metrics else None
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[build_middleware(settings.access_log, request_metrics)],
    )
    app[SETTINGS] = settings
    app.cleanup_ctx.append(_gateway_context)
    app.cleanup_ctx.append(v2_grpc.grpc_context)  # after the gateway: it serves it, and stops first
    # aiohttp tries dynamic routes in registration order: the data plane goes first.
    basic.add_routes(app)
    v2_rest.add_routes(app)
    graphpipe.add_routes(app)
    v1_rest.add_routes(app)
    ops.add_routes(app)
    dashboard.add_routes(app, request_metrics)
    admin.add_routes(app)
    if request_metrics is not None:
        request_metrics.classify_routes(app)
        app[ops.PROMETHEUS] = build_registry(request_metrics, lambda: app.get(GATEWAY))
        app[v2_grpc.GRPC_METRICS] = request_metrics
    return app


def make_runner(app: web.Application, settings: Settings) -> web.AppRunner:
    """The runner serving ``app``: a client that disconnects cancels its handler.

    Cancelling the handler withdraws its queued scoring job, so a client that gave up does not hold
    a queue place (or a slot) for work nobody will read. Admin writes are shielded from this (see
    ``api.admin.admin``), and the prediction-log enqueue never sits behind an await.
    """
    return web.AppRunner(
        app, access_log=None, shutdown_timeout=settings.shutdown_timeout_s, handle_signals=False, handler_cancellation=True
    )
