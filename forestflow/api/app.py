"""Builds the aiohttp application: the Gateway and its resources, the middleware, every route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import structlog
from aiohttp import web

from forestflow import tracing
from forestflow.api import (
    admin,
    basic,
    body_pool,
    dashboard,
    experiments,
    graphpipe,
    ops,
    v1_rest,
    v2_repository,
    v2_rest,
    worker_metrics,
)
from forestflow.api.common import AFTER_START, GATEWAY, GRPC_METRICS, GRPC_PORT, SETTINGS, STARTING, WORKER
from forestflow.api.fast_http import FastRunner
from forestflow.api.middleware import RECORDER, RequestRecorder, build_middleware
from forestflow.api.prom import RequestMetrics, build_registry
from forestflow.errors import StoreUnavailable
from forestflow.predlog import make_prediction_log
from forestflow.registry.answers import FileAnswers, RedisAnswers, SharedAnswers
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.file_store import FileStore
from forestflow.registry.store import Store
from forestflow.runtime import jvm
from forestflow.service import Gateway
from forestflow.settings import Settings
from forestflow.supervisor import WorkerIdentity, report_worker_status, write_worker_status

log = structlog.get_logger("forestflow")

#: The task that keeps a worker's status file up to date (``--workers N``).
REPORTING = web.AppKey("worker_status_reporting", asyncio.Task)


def make_store(settings: Settings, worker: WorkerIdentity | None = None) -> Store:
    """The registry store the settings choose: Redis when a URL is set, else the embedded file."""
    if settings.redis_url:
        from forestflow.registry.redis_store import RedisStore

        return RedisStore(settings.redis_url, settings.redis_sync_interval_s)
    replica = worker.replica_id if worker is not None else "w0"
    replicas = worker.count if worker is not None else 1
    return FileStore(settings.data_dir / "state" / "registry.json", replica, settings.file_sync_interval_s, replicas)


def make_gateway(settings: Settings, worker: WorkerIdentity | None = None) -> Gateway:
    """A Gateway wired to the store, artifact cache and prediction log the settings choose."""
    store = make_store(settings, worker)
    return Gateway(
        settings,
        store,
        ArtifactCache.from_settings(settings, worker.replica_id if worker is not None else None),
        make_prediction_log(settings),
        shared_answers=make_shared_answers(settings, store, worker),
    )


def make_shared_answers(settings: Settings, store: Store, worker: WorkerIdentity | None) -> SharedAnswers | None:
    """Where the answers reward feedback joins are shared with the other processes of the registry:
    Redis for replicas, files under the data dir for the workers of one host, nowhere for one process."""
    if settings.redis_url:
        from forestflow.registry.redis_store import RedisStore

        assert isinstance(store, RedisStore)
        return RedisAnswers(store.client, store.namespace)
    if worker is not None and worker.count > 1:
        return FileAnswers(settings.data_dir / "state" / "answers", worker.replica_id, settings.feedback_index_size)
    return None


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
    """The gateway is made here and started by :func:`_begin_start` once every context is set up."""
    gateway = make_gateway(app[SETTINGS], app.get(WORKER))
    app[GATEWAY] = gateway
    app[AFTER_START] = []
    yield
    for task in (app.get(STARTING), app.get(REPORTING)):
        if task is not None:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    worker = app.get(WORKER)
    if worker is not None:
        write_worker_status(app[SETTINGS].data_dir, worker, ready=False)
    await gateway.stop()


async def _begin_start(app: web.Application) -> None:
    """Start the gateway (restore and load its servables) while the server already answers.

    Liveness passes and readiness fails until it is done: the store reached, every servable loaded,
    then what needs a started gateway (``AFTER_START``: the model repository, Kafka ingestion).
    """
    settings, worker = app[SETTINGS], app.get(WORKER)
    if worker is not None:
        write_worker_status(settings.data_dir, worker, ready=False)

    async def start() -> None:
        await _start_until_reachable(app[GATEWAY], min(2.0, settings.redis_sync_interval_s))
        for after in app[AFTER_START]:
            await after()

    starting = app[STARTING] = asyncio.create_task(start(), name="gateway-start")
    if worker is not None:  # its readiness and failing loads, for the other workers and the supervisor
        gateway = app[GATEWAY]

        def status() -> tuple[bool, dict[str, Any]]:
            started = starting.done() and not starting.cancelled() and starting.exception() is None
            failed = {
                str(f): {"error": s.error, "attempts": s.attempts} for f, s in gateway.loads.failed().items() if s.registered
            }
            return started and gateway.ready, failed

        app[REPORTING] = asyncio.create_task(report_worker_status(settings.data_dir, worker, status), name="worker-status")


async def _stop_body_pool(app: web.Application) -> None:
    body_pool.shutdown()  # the processes that decode large bodies, if any started


async def _tag_worker(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Forestflow-Worker"] = request.app[WORKER].replica_id


def build_app(settings: Settings, worker: WorkerIdentity | None = None) -> web.Application:
    """The HTTP application serving ForestFlow's admin and BASIC APIs and the health routes."""
    request_metrics = RequestMetrics() if settings.metrics else None
    recorder = RequestRecorder(settings.access_log, request_metrics)
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[build_middleware(recorder)])
    app[SETTINGS] = settings
    app[RECORDER] = recorder
    jvm.configure(settings.jvm_opts, settings.genmodel_jar)  # used only if a model starts the JVM
    if worker is not None:
        app[WORKER] = worker
        app.on_response_prepare.append(_tag_worker)  # which worker answered: for operators and tests
    app.cleanup_ctx.append(_tracing_context)
    app.cleanup_ctx.append(_gateway_context)
    app.on_cleanup.append(_stop_body_pool)
    app.cleanup_ctx.append(v2_repository.repository_context)  # deploys the model repository, if any
    if settings.grpc_port >= 0:  # the V2 gRPC server; imported only then (grpc maps ~13 MiB of library alone)
        from forestflow.api import v2_grpc

        app.cleanup_ctx.append(v2_grpc.grpc_context)  # after the gateway: it serves it, and stops first
    else:
        app[GRPC_PORT] = None
    if settings.kafka_ingest_topic_list:  # scoring requests from Kafka; imported only then (aiokafka)
        from forestflow.api import kafka_ingest

        kafka_ingest.add_to(app)  # after the gateway: it scores through it, and stops first
    # aiohttp tries dynamic routes in registration order: the data plane goes first.
    basic.add_routes(app)
    v2_repository.add_routes(app)
    v2_rest.add_routes(app)
    graphpipe.add_routes(app)
    v1_rest.add_routes(app)
    ops.add_routes(app)
    dashboard.add_routes(app, request_metrics)
    admin.add_routes(app)
    experiments.add_routes(app)
    app.on_startup.append(_begin_start)  # after every context above is set up
    if request_metrics is not None:
        request_metrics.classify_routes(app)
        registry = build_registry(request_metrics, lambda: app.get(GATEWAY))
        app[ops.PROMETHEUS] = registry
        if worker is not None:  # /metrics gives the totals of every worker of the gateway
            app[ops.PROMETHEUS] = worker_metrics.workers_registry(registry, settings.data_dir, worker)
            app.cleanup_ctx.append(worker_metrics.snapshot_context(registry, settings.data_dir, worker))
        app[GRPC_METRICS] = request_metrics
    return app


def make_runner(app: web.Application, settings: Settings) -> web.AppRunner:
    """The runner serving ``app``: a client that disconnects cancels its handler.

    Cancelling the handler withdraws its queued scoring job, so a client that gave up does not hold
    a queue place (or a slot) for work nobody will read. Admin writes are shielded from this (see
    ``api.admin.admin``), and the prediction-log enqueue never sits behind an await. With
    ``http_fast_path``, scoring requests are answered on the fast path (``api/fast_http.py``).
    """
    runner_class = FastRunner if settings.http_fast_path else web.AppRunner
    return runner_class(
        app, access_log=None, shutdown_timeout=settings.shutdown_timeout_s, handle_signals=False, handler_cancellation=True
    )


async def _tracing_context(app: web.Application) -> AsyncIterator[None]:
    """OpenTelemetry tracing for the app's life, when configured (forestflow/tracing.py)."""
    settings = app[SETTINGS]
    if not tracing.configure(settings.otel_exporter_otlp_endpoint, settings.otel_traces_sampler_ratio):
        yield
        return
    try:
        yield
    finally:
        # Off the loop: the last export is an HTTP call that may take up to its timeout (and a
        # collector on this same loop could not answer it while the loop waited).
        await asyncio.to_thread(tracing.shutdown)
