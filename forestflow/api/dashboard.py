"""The live page (``/ui``) and the JSON it is drawn from (``/ops/dashboard``), plus ``/openapi.json``.

The page is one static HTML file with its script and style inline (no build step, no CDN); it
polls ``/ops/dashboard`` and draws the traffic share of each contract's releases over the last
minutes from score-count samples the gateway keeps while someone is looking.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from aiohttp import web

from forestflow.api.common import GATEWAY
from forestflow.api.openapi import document
from forestflow.api.prom import RequestMetrics
from forestflow.api.responses import json_response
from forestflow.core.contract_state import ContractState
from forestflow.core.policies import is_valid

REQUEST_METRICS = web.AppKey("request_metrics", RequestMetrics)
HISTORY = web.AppKey("dashboard_history", deque)
PAGE = Path(__file__).resolve().parent / "static" / "ui.html"
#: About one sample a second (the page polls every second), ten minutes of them.
_SAMPLE_EVERY_MS = 900
_HISTORY_LEN = 600


def _servables(gateway: Any, now_ms: int) -> list[dict[str, Any]]:
    contracts = []
    for contract, state in sorted(gateway.contracts.items(), key=lambda kv: str(kv[0])):
        weights = {item.key: item.weight for item in state.picker.items}
        total = sum(weights.values())
        releases = []
        for release, entry in sorted(state.servables.items(), key=lambda kv: (kv[1].metrics.created_at_ms, kv[0])):
            loaded = gateway.loaded.get(entry.fqrv)
            row = _release_row(gateway, entry)
            row["loaded"] = loaded is not None
            row["valid"] = is_valid(entry.settings.policy, entry.metrics, now_ms)
            row["phaseInPct"] = entry.metrics.current_phase_in_pct
            row["routingSharePct"] = _share_pct(state, release, weights, total)
            # RemoteV2: where it scores and whether that server answers (None: here)
            row["backend"] = loaded.servable.backend_state() if loaded is not None else None
            releases.append(row)
        for entry, status in gateway.failing_entries(contract):  # not loaded here: no routing
            releases.append(_release_row(gateway, entry) | {"load": status.view()})
        contracts.append({"contract": str(contract), "releases": releases})
    return contracts


def _share_pct(state: ContractState, release: str, weights: dict[str, int], total: int) -> float:
    """The share of traffic the router gives a release now: a bandit's learnt share, else its weight's."""
    if state.settings.router.is_bandit and state.bandit_shares:
        return round(100 * state.bandit_shares.get(release, 0.0), 1)
    return round(100 * weights.get(release, 0) / total, 1) if total else 0.0


def _release_row(gateway: Any, entry: Any) -> dict[str, Any]:
    """One release's row of the page, as for a release not loaded here (the caller fills the rest)."""
    m = entry.metrics
    shared = gateway.stats_metrics(entry)  # rewards summed over the processes sharing the registry
    return {
        "fqrv": str(entry.fqrv),
        "release": entry.fqrv.release,
        "loaded": False,
        "valid": False,
        "phaseInPct": 0,
        "routingSharePct": 0.0,
        "scoreCount": m.score_count,
        "shadeCount": m.shade_count,
        "errorCount": m.error_count,
        "shadeErrorCount": m.shade_error_count,
        "performanceMetrics": m.performance_view(),
        "feedbackCount": shared.feedback_count,
        "rewardSum": shared.reward_sum,
        "rewardMean": shared.reward_sum / shared.feedback_count if shared.feedback_count else None,
        "logLevel": entry.settings.logging.log_level.name,
        "createdAtMs": m.created_at_ms,
        "backend": None,
    }


def _sample(history: deque[dict[str, Any]], contracts: list[dict[str, Any]], now_ms: int) -> None:
    if history and now_ms - history[-1]["t"] < _SAMPLE_EVERY_MS:
        return
    history.append({"t": now_ms, "counts": {r["fqrv"]: r["scoreCount"] for c in contracts for r in c["releases"]}})


async def dashboard(request: web.Request) -> web.Response:
    """Contracts, releases, validity, phase-in, counts, traffic history, log health, recent errors."""
    gateway = request.app[GATEWAY]
    now_ms = int(time.time() * 1000)
    contracts = _servables(gateway, now_ms)
    history = request.app[HISTORY]
    _sample(history, contracts, now_ms)
    stats = gateway.prediction_log.stats
    metrics = request.app.get(REQUEST_METRICS)
    errors = [
        {"time": round(t * 1000), "method": m, "path": p, "status": s, "requestId": rid}
        for t, m, p, s, rid in reversed(metrics.errors if metrics is not None else ())
    ]
    return json_response(
        {
            "time": now_ms,
            "ready": gateway.ready,
            "readiness": gateway.readiness(),
            "contracts": contracts,
            "history": list(history),
            "predictionLog": {
                "sink": gateway.prediction_log.sink.name,
                "connected": stats.connected,
                "produced": stats.produced,
                "delivered": stats.delivered,
                "dropped": stats.dropped,
                "bufferedEvents": stats.buffered,
                "bufferedBytes": stats.buffered_bytes,
                "sendFailures": stats.send_failures,
            },
            "errors": errors,
        }
    )


async def page(request: web.Request) -> web.Response:
    """The live page (read-only)."""
    return web.Response(body=PAGE.read_bytes(), content_type="text/html", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 document."""
    return json_response(document())


def add_routes(app: web.Application, metrics: RequestMetrics | None) -> None:
    """Register /ui, /ops/dashboard and /openapi.json."""
    if metrics is not None:
        app[REQUEST_METRICS] = metrics
    app[HISTORY] = deque(maxlen=_HISTORY_LEN)
    app.router.add_get("/ui", page)
    app.router.add_get("/ops/dashboard", dashboard)
    app.router.add_get("/openapi.json", openapi)
