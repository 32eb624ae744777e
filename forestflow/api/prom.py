"""Prometheus metrics at ``/metrics``, exposed through prometheus-client.

The request path does plain-Python work only: :meth:`RequestMetrics.record` adds one to a dict
entry and puts two durations in histogram buckets (a bisect each). Everything else (queues, the
prediction log, phase-in, validity, the store) is read from the Gateway when Prometheus scrapes,
by :class:`GatewayCollector`, which hands prometheus-client metric families to format.

Label values are bounded: contract and fqrv come from the gateway's own registry, status is an
HTTP code or a gRPC status name, protocol one of a fixed few; past ``max_series`` request series,
new contract/fqrv pairs are counted under ``"other"``. Refused requests (4xx) carry no names.
"""

from __future__ import annotations

import gc
import platform
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

import forestflow
from forestflow.core.histogram import Histogram
from forestflow.core.policies import is_valid
from forestflow.runtime.scheduler import Priority

OTHER = "other"


class RequestMetrics:
    """Counters of HTTP requests: by contract, fqrv, protocol and status; server and scoring time."""

    def __init__(self, max_series: int = 1000) -> None:
        self.max_series = max_series
        self.requests: dict[tuple[str, str, str, str], int] = {}
        self.server_time: dict[str, Histogram] = {}
        self.scoring_time: dict[str, Histogram] = {}
        #: The latest failed requests (wall time, method, path, status, request id, error code, message) for /ui.
        self.errors: deque[tuple[float, str, str, int, str, str | None, str]] = deque(maxlen=50)
        #: aiohttp resource -> protocol label, filled by :meth:`classify_routes`.
        self.protocols: dict[Any, str] = {}

    def classify_routes(self, app: web.Application) -> None:
        """Give each registered route its protocol label (a fixed, small set)."""
        for resource in app.router.resources():
            path = resource.canonical
            if path.startswith("/v2"):
                protocol = "v2"
            elif path.startswith("/v1"):
                protocol = "v1"
            elif path.endswith("/score") or path.endswith("/metadata"):
                protocol = "basic"
            elif path.endswith("/gp"):
                protocol = "graphpipe"
            elif path.startswith(("/health", "/metrics", "/openapi", "/ui", "/ops")) or path == "/":
                protocol = "ops"
            else:
                protocol = "admin"
            self.protocols[resource] = protocol

    def record(
        self, resource: Any, contract: str | None, fqrv: str | None, status: int, server_s: float, scoring_s: float | None
    ) -> None:
        """Count one finished HTTP request (called by the middleware)."""
        # Names from refused requests (4xx) may be anything a client typed: they never become labels.
        if 400 <= status < 500:
            contract = fqrv = None
        self.count(self.protocols.get(resource, OTHER), contract, fqrv, str(status), server_s, scoring_s)

    def count(
        self, protocol: str, contract: str | None, fqrv: str | None, status: str, server_s: float, scoring_s: float | None
    ) -> None:
        """Count one finished call of any protocol (gRPC calls report their status code name)."""
        key = (contract or "", fqrv or "", protocol, status)
        requests = self.requests
        if key in requests:
            requests[key] += 1
        elif len(requests) < self.max_series:
            requests[key] = 1
        else:
            key = (OTHER, OTHER, protocol, str(status))
            requests[key] = requests.get(key, 0) + 1
        hist = self.server_time.get(protocol)
        if hist is None:
            hist = self.server_time[protocol] = Histogram()
        hist.observe(server_s)
        if scoring_s is not None and fqrv:
            hist = self.scoring_time.get(fqrv)
            if hist is None:
                if len(self.scoring_time) >= self.max_series:
                    return
                hist = self.scoring_time[fqrv] = Histogram()
            hist.observe(scoring_s)


def _histograms(name: str, doc: str, label: str, hists: dict[str, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, hist in list(hists.items()):
        family.add_metric([value], hist.cumulative(), hist.total)
    return family


class GatewayCollector:
    """Reads the gateway's state when Prometheus scrapes (nothing of this runs per request)."""

    def __init__(self, requests: RequestMetrics, gateway: Callable[[], Any]) -> None:
        self.request_metrics = requests
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        """Every metric family of the gateway."""
        rm = self.request_metrics
        family = CounterMetricFamily(
            "forestflow_requests",
            "Requests (HTTP and gRPC) by contract, answering fqrv, protocol and status",
            labels=["contract", "fqrv", "protocol", "status"],
        )
        for labels, count in list(rm.requests.items()):
            family.add_metric(list(labels), count)
        yield family
        yield _histograms(
            "forestflow_request_duration_seconds", "Server time of requests (HTTP and gRPC)", "protocol", rm.server_time
        )
        yield _histograms(
            "forestflow_scoring_duration_seconds",
            "Scoring time (queue wait and predict) of answered requests",
            "fqrv",
            rm.scoring_time,
        )
        gateway = self.gateway()
        if gateway is None:
            return
        yield from self._servables(gateway)
        yield from self._prediction_log(gateway)
        yield from self._residency(gateway)
        yield from self._health(gateway)

    def _servables(self, gateway: Any) -> Iterator[Metric]:
        now = gateway.clock()
        phase = GaugeMetricFamily("forestflow_servable_phase_in_percent", "Current phase-in percentage", labels=["fqrv"])
        valid = GaugeMetricFamily("forestflow_servable_valid", "1 when every validity rule holds", labels=["fqrv"])
        scored = CounterMetricFamily("forestflow_servable_scores", "Requests a servable answered", labels=["fqrv"])
        shaded = CounterMetricFamily("forestflow_servable_shades", "Shadow copies a servable received", labels=["fqrv"])
        errors = CounterMetricFamily("forestflow_servable_errors", "Live requests a servable failed (5xx)", labels=["fqrv"])
        shade_errors = CounterMetricFamily(
            "forestflow_servable_shade_errors", "Shadow copies that failed, timed out or were dropped", labels=["fqrv"]
        )
        agreement = GaugeMetricFamily(
            "forestflow_servable_agreement", "Share of recent shadow rows agreeing with the served answer", labels=["fqrv"]
        )
        rollbacks = CounterMetricFamily(
            "forestflow_release_rollbacks", "Times a routed release became invalid and left routing", labels=["fqrv"]
        )
        feedback = CounterMetricFamily(
            "forestflow_servable_feedback", "Reward feedback joined to a servable's answers", labels=["fqrv"]
        )
        rewards = GaugeMetricFamily(
            "forestflow_servable_reward_sum", "Sum of the rewards reported for a servable's answers", labels=["fqrv"]
        )
        bandit = GaugeMetricFamily(
            "forestflow_bandit_share", "Share of traffic a bandit router gives a release now", labels=["fqrv"]
        )
        for fqrv_label, count in list(gateway.registry.rollbacks.items()):
            rollbacks.add_metric([fqrv_label], count)
        for state in list(gateway.contracts.values()):
            for entry in list(state.servables.values()):
                label = [str(entry.fqrv)]
                phase.add_metric(label, entry.metrics.current_phase_in_pct)
                valid.add_metric(label, 1.0 if is_valid(entry.settings.policy, entry.metrics, now) else 0.0)
                scored.add_metric(label, entry.metrics.score_count)
                shaded.add_metric(label, entry.metrics.shade_count)
                errors.add_metric(label, entry.metrics.error_count)
                shade_errors.add_metric(label, entry.metrics.shade_error_count)
                feedback.add_metric(label, entry.metrics.feedback_count)
                rewards.add_metric(label, entry.metrics.reward_sum)
                if entry.fqrv.release in state.bandit_shares:
                    bandit.add_metric(label, state.bandit_shares[entry.fqrv.release])
                share = entry.metrics.window.agreement  # not observed(): that also sorts the latencies
                if share is not None:
                    agreement.add_metric(label, share)
        queue = GaugeMetricFamily("forestflow_queue_depth", "Jobs waiting per servable and priority", labels=["fqrv", "priority"])
        running = GaugeMetricFamily("forestflow_scoring_running", "predict calls running per servable", labels=["fqrv"])
        dropped = CounterMetricFamily("forestflow_shadow_dropped", "Shadow copies dropped on a full queue", labels=["fqrv"])
        rejected = CounterMetricFamily("forestflow_live_rejected", "Live requests refused with 503 (queue full)", labels=["fqrv"])
        deadline = CounterMetricFamily("forestflow_deadline_exceeded", "Jobs failed with 504 (deadline passed)", labels=["fqrv"])
        batches = CounterMetricFamily(
            "forestflow_micro_batches", "Model calls that scored several requests together", labels=["fqrv"]
        )
        batched = CounterMetricFamily(
            "forestflow_micro_batched_requests", "Requests scored in a call shared with others", labels=["fqrv"]
        )
        retries = CounterMetricFamily(
            "forestflow_micro_batch_retries", "Combined calls that failed; their requests were scored alone", labels=["fqrv"]
        )
        load = GaugeMetricFamily("forestflow_servable_load_seconds", "Time the servable took to load", labels=["fqrv"])
        up = GaugeMetricFamily("forestflow_backend_up", "1 while a RemoteV2 release's backend answers", labels=["fqrv", "url"])
        circuit = GaugeMetricFamily(
            "forestflow_backend_circuit_open", "1 while a RemoteV2 release refuses calls to its backend", labels=["fqrv", "url"]
        )
        failures = CounterMetricFamily(
            "forestflow_backend_failures", "Failed calls to a RemoteV2 backend (unreachable, 5xx, late)", labels=["fqrv", "url"]
        )
        refused = CounterMetricFamily(
            "forestflow_backend_refused", "Calls refused at once with 503 while the circuit was open", labels=["fqrv", "url"]
        )
        for fqrv, loaded in list(gateway.loaded.items()):
            name, scheduler = str(fqrv), loaded.scheduler
            backend = loaded.servable.backend_state()
            if backend is not None:
                labels = [name, str(backend.get("url", ""))]
                up.add_metric(labels, 1.0 if backend.get("state") == "up" else 0.0)
                circuit.add_metric(labels, 1.0 if backend.get("circuit") == "open" else 0.0)
                failures.add_metric(labels, backend.get("failures", 0))
                refused.add_metric(labels, backend.get("refused", 0))
            queue.add_metric([name, "live"], scheduler.queued(Priority.LIVE))
            queue.add_metric([name, "shadow"], scheduler.queued(Priority.SHADOW))
            running.add_metric([name], scheduler.running)
            dropped.add_metric([name], scheduler.stats.shadow_dropped)
            rejected.add_metric([name], scheduler.stats.live_rejected)
            deadline.add_metric([name], scheduler.stats.deadline_exceeded)
            stats = scheduler.stats
            batches.add_metric([name], stats.batches + stats.coalesced_calls)
            batched.add_metric([name], stats.batched_jobs + stats.coalesced_jobs)
            retries.add_metric([name], stats.batch_retries)
            load.add_metric([name], loaded.load_seconds)
        yield from (
            phase,
            valid,
            scored,
            shaded,
            errors,
            shade_errors,
            agreement,
            rollbacks,
            feedback,
            rewards,
            bandit,
            queue,
            running,
            batches,
            batched,
            retries,
            dropped,
            rejected,
            deadline,
            load,
            up,
            circuit,
            failures,
            refused,
        )
        yield CounterMetricFamily(
            "forestflow_servable_load_failures", "Servable loads that failed", value=gateway.loader.load_failures
        )
        retried = CounterMetricFamily(
            "forestflow_release_load_failures",
            "Failed load attempts of releases this process follows (learnt from the store, restored, the repository's)",
            labels=["fqrv"],
        )
        for fqrv_label, count in list(gateway.loads.failure_counts.items()):
            retried.add_metric([fqrv_label], count)
        yield retried
        yield GaugeMetricFamily(
            "forestflow_servables_failed", "Registered servables that failed to load", value=len(gateway.failed)
        )
        yield GaugeMetricFamily("forestflow_servables_loaded", "Servables loaded", value=len(gateway.loaded))

    def _prediction_log(self, gateway: Any) -> Iterator[Metric]:
        stats = gateway.prediction_log.stats
        yield GaugeMetricFamily(
            "forestflow_prediction_log_buffer_bytes", "Bytes of events waiting for the sink", value=stats.buffered_bytes
        )
        yield GaugeMetricFamily("forestflow_prediction_log_buffer_events", "Events waiting for the sink", value=stats.buffered)
        yield CounterMetricFamily("forestflow_prediction_log_produced", "Events produced", value=stats.produced)
        yield CounterMetricFamily("forestflow_prediction_log_delivered", "Events the sink took", value=stats.delivered)
        dropped = CounterMetricFamily(
            "forestflow_prediction_log_dropped", "Events that will never be delivered", labels=["reason"]
        )
        dropped.add_metric(["overflow"], stats.dropped_overflow)
        dropped.add_metric(["shutdown"], stats.dropped_shutdown)
        dropped.add_metric(["rejected"], stats.dropped_rejected)
        dropped.add_metric(["encode_error"], stats.encode_errors)
        yield dropped
        yield CounterMetricFamily(
            "forestflow_prediction_log_send_failures", "Failed sends to the sink", value=stats.send_failures
        )
        yield CounterMetricFamily(
            "forestflow_prediction_log_drain_restarts", "Times the drain task died and was restarted", value=stats.drain_restarts
        )
        yield GaugeMetricFamily(
            "forestflow_prediction_log_connected", "1 when the sink is connected", value=1.0 if stats.connected else 0.0
        )
        yield GaugeMetricFamily(
            "forestflow_prediction_log_failing",
            "1 while events cannot be delivered (the reason is in /health/ready's predictionLog)",
            value=1.0 if stats.failing_reason else 0.0,
        )

    def _residency(self, gateway: Any) -> Iterator[Metric]:
        residency = gateway.residency
        yield CounterMetricFamily("forestflow_release_loads", "Releases loaded on this process", value=residency.loads_done)
        yield CounterMetricFamily(
            "forestflow_release_evictions", "Idle releases unloaded to keep within the memory budget", value=residency.evictions
        )
        yield CounterMetricFamily(
            "forestflow_release_loaded_bytes",
            "Bytes of the releases loaded (their memory, measured at load with a budget, else file sizes) since start",
            value=residency.bytes_loaded,
        )
        yield GaugeMetricFamily(
            "forestflow_release_resident_bytes",
            "Bytes of the releases loaded now (their memory, measured at load with a budget, else file sizes)",
            value=residency.used_bytes,
        )
        yield GaugeMetricFamily(
            "forestflow_releases_cold", "Releases routed but not loaded here", value=len(gateway.registry.cold)
        )
        yield CounterMetricFamily(
            "forestflow_shadow_cold_skipped",
            "Shadow copies not sent because their release is not loaded",
            value=residency.shadow_cold_skipped,
        )
        family = HistogramMetricFamily("forestflow_cold_start_wait_seconds", "Requests' waits for their release to load")
        family.add_metric([], residency.cold_waits.cumulative(), residency.cold_waits.total)
        yield family

    def _health(self, gateway: Any) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "forestflow_registry_store_available",
            "1 when the registry store answers (Redis; the file store always does)",
            value=1.0 if getattr(gateway.store, "available", True) else 0.0,
        )
        yield GaugeMetricFamily("forestflow_ready", "1 when the readiness probe passes", value=1.0 if gateway.ready else 0.0)
        yield GaugeMetricFamily("forestflow_draining", "1 while shutting down", value=1.0 if gateway.draining else 0.0)


def build_registry(requests: RequestMetrics, gateway: Callable[[], Any]) -> CollectorRegistry:
    """A registry of this app's own (tests run several gateways in one process): the gateway's
    metrics, the build, and prometheus-client's process (``process_*``), platform (``python_info``)
    and garbage-collector (``python_gc_*``) collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(requests, gateway))
    registry.register(BuildInfoCollector())
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class BuildInfoCollector:
    """``forestflow_build_info{version, python, implementation} 1``: what this process runs."""

    def collect(self) -> Iterator[Metric]:
        """The one sample."""
        info = GaugeMetricFamily(
            "forestflow_build_info",
            "The forestflow build this process runs (always 1)",
            labels=["version", "python", "implementation"],
        )
        info.add_metric([forestflow.__version__, platform.python_version(), platform.python_implementation()], 1.0)
        yield info


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registry`` and its content type."""
    # With 10,000 releases a scrape holds some 100,000 samples at once (5.8 MB of text): the
    # collector's full passes walked them, 9 in 5 scrapes (up to 70 ms each). They hold no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return generate_latest(registry), CONTENT_TYPE_LATEST
    finally:
        if collecting:
            gc.enable()
