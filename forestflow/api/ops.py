"""Operational routes on the API port: liveness, readiness and a metrics snapshot."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from forestflow.api.common import GATEWAY, SETTINGS, STARTING, WORKER
from forestflow.api.prom import exposition
from forestflow.api.responses import json_response
from forestflow.runtime.scheduler import Priority
from forestflow.supervisor import read_workers

PROMETHEUS = web.AppKey("prometheus", CollectorRegistry)


async def live(request: web.Request) -> web.Response:
    """The event loop answers: the process is alive."""
    return json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    """200 when every registered servable is loaded and the gateway is not draining, else 503.

    Also 503 until start-up has finished (the store reached, servables and the model repository
    loaded) and, under ``--workers N``, while any worker is not up, still loading, or failing to
    load a release (``workers`` says which, and why).
    """
    gateway = request.app[GATEWAY]
    details = gateway.readiness()
    details["storeAvailable"] = bool(getattr(gateway.store, "available", True))
    starting = request.app.get(STARTING)
    details["ready"] = (
        details["ready"]
        and starting is not None
        and starting.done()
        and not starting.cancelled()
        and starting.exception() is None
    )
    worker = request.app.get(WORKER)
    if worker is not None:  # each worker's state (ready, loading, failed with its failing loads, down)
        workers = read_workers(request.app[SETTINGS].data_dir, worker.count)
        details["workers"] = workers
        details["ready"] = details["ready"] and all(w["state"] == "ready" for w in workers.values())
    return json_response(details, status=200 if details["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    """Counters of the prediction log and the schedulers, as JSON."""
    gateway = request.app[GATEWAY]
    log_stats = gateway.prediction_log.stats
    schedulers = {
        str(fqrv): {
            "running": loaded.scheduler.running,
            "liveQueued": loaded.scheduler.queued(Priority.LIVE),
            "shadowQueued": loaded.scheduler.queued(Priority.SHADOW),
            "liveRejected": loaded.scheduler.stats.live_rejected,
            "shadowDropped": loaded.scheduler.stats.shadow_dropped,
            "deadlineExceeded": loaded.scheduler.stats.deadline_exceeded,
            # model calls that scored several requests together (on threads or on the loop), their
            # requests, and combined calls that failed and were scored again one by one
            "microBatches": loaded.scheduler.stats.batches + loaded.scheduler.stats.coalesced_calls,
            "microBatchedRequests": loaded.scheduler.stats.batched_jobs + loaded.scheduler.stats.coalesced_jobs,
            "microBatchRetries": loaded.scheduler.stats.batch_retries,
            # predict calls still running after every caller gave up (a stuck model shows here)
            "abandonedRunning": loaded.scheduler.stats.abandoned_running,
            "inlineCalls": loaded.scheduler.stats.inline_calls,
            # requests scored together with others of the same event-loop turn (in inlineCalls)
            "coalescedRequests": loaded.scheduler.stats.coalesced_jobs,
        }
        for fqrv, loaded in gateway.loaded.items()
    }
    return json_response(
        {
            "predictionLog": {
                "sink": gateway.prediction_log.sink.name,
                "connected": log_stats.connected,
                "produced": log_stats.produced,
                "delivered": log_stats.delivered,
                "dropped": log_stats.dropped,
                "droppedOverflow": log_stats.dropped_overflow,
                "droppedShutdown": log_stats.dropped_shutdown,
                "bufferedEvents": log_stats.buffered,
                "bufferedBytes": log_stats.buffered_bytes,
                "sendFailures": log_stats.send_failures,
                "drainRunning": log_stats.drain_running,
                "drainRestarts": log_stats.drain_restarts,
            },
            "schedulers": schedulers,
            # RemoteV2 releases: each one's backend, up or down, and its circuit
            "backends": {
                str(fqrv): state
                for fqrv, loaded in gateway.loaded.items()
                if (state := loaded.servable.backend_state()) is not None
            },
            **_kafka_ingest(request.app),
        }
    )


def _kafka_ingest(app: web.Application) -> dict[str, object]:
    """``{"kafkaIngest": counters}`` when the gateway scores requests from Kafka."""
    if not app[SETTINGS].kafka_ingest_topic_list:
        return {}
    from forestflow.api.kafka_ingest import KAFKA_INGEST  # imported only then (aiokafka)

    ingest = app.get(KAFKA_INGEST)
    return {"kafkaIngest": ingest.snapshot()} if ingest is not None else {}


async def prometheus(request: web.Request) -> web.Response:
    """Every metric in the Prometheus text format (404 when the ``metrics`` setting is off)."""
    registry = request.app.get(PROMETHEUS)
    if registry is None:
        raise web.HTTPNotFound()
    body, content_type = exposition(registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


def add_routes(app: web.Application) -> None:
    """Register the health and metrics routes."""
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/health/live", live)
    app.router.add_get("/health/ready", ready)
    app.router.add_get("/metrics/json", metrics)
