"""``/metrics`` under ``--workers N``: the gateway's totals, whichever worker answers the scrape.

Every worker writes what its own registry collects to ``<data_dir>/state/workers/metrics-w<i>.json``
once a second. The worker that answers a scrape merges its live metrics with the latest snapshot of
every other worker that is up: counters, histograms and most gauges are summed (requests, latency
buckets, queue depths, drops, prediction-log counts); the few gauges that describe the one registry
all workers follow, or the gateway as a whole, are merged as :data:`MERGE` says.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from forestflow.supervisor import WorkerIdentity, replace_file, workers_status

log = structlog.get_logger("forestflow.metrics")

#: How often a worker writes its snapshot (a scrape sees the others' counts at most this old).
SNAPSHOT_EVERY_S = 1.0

#: Families not summed over workers: "own" = the answering worker's value (the same everywhere),
#: "min" / "max" over the workers. Every other family is summed.
MERGE: dict[str, str] = {
    "forestflow_servable_phase_in_percent": "own",
    "forestflow_servable_valid": "own",
    "forestflow_bandit_share": "own",
    "forestflow_servables_loaded": "own",
    "forestflow_servables_failed": "max",
    "forestflow_servable_load_seconds": "max",
    "forestflow_registry_store_available": "min",
    "forestflow_prediction_log_connected": "min",
    "forestflow_ready": "min",
    "forestflow_draining": "max",
}

_Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _snapshot_path(data_dir: Path, index: int) -> Path:
    return data_dir / "state" / "workers" / f"metrics-w{index}.json"


def snapshot(registry: CollectorRegistry) -> bytes:
    """What ``registry`` collects now, as JSON: ``[[name, type, documentation, [[sample, labels, value]...]]...]``."""
    families = [[m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]] for m in registry.collect()]
    return orjson.dumps(families)


def _read(path: Path) -> list[Any]:
    try:
        document: list[Any] = orjson.loads(path.read_bytes())
        return document
    except (OSError, orjson.JSONDecodeError):
        return []  # not written yet, or a worker that never got that far


class WorkersCollector:
    """The merged metrics of every live worker (this one's live, the others' from their snapshots)."""

    def __init__(self, own: CollectorRegistry, data_dir: Path, worker: WorkerIdentity) -> None:
        self.own = own
        self.data_dir = data_dir
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        """Every family, merged over the workers."""
        status = workers_status(self.data_dir, self.worker.count)
        peers = [
            _read(_snapshot_path(self.data_dir, index))
            for index in range(self.worker.count)
            if index != self.worker.index and status.get(f"w{index}") != "down"
        ]
        order: list[str] = []
        meta: dict[str, tuple[str, str]] = {}
        own: dict[str, _Samples] = {}
        others: dict[str, list[_Samples]] = {}
        for family in self.own.collect():
            order.append(family.name)
            meta[family.name] = (family.type, family.documentation)
            own[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        for families in peers:
            for name, kind, doc, samples in families:
                if name not in meta:
                    order.append(name)
                    meta[name] = (kind, doc)
                others.setdefault(name, []).append({(s, tuple(sorted(labels.items()))): v for s, labels, v in samples})
        for name in order:
            kind, doc = meta[name]
            merged = _merge(MERGE.get(name, "sum"), own.get(name, {}), others.get(name, []))
            family = Metric(name, doc, kind)
            for (sample, labels), value in merged.items():
                family.add_sample(sample, dict(labels), value)
            yield family


def _merge(mode: str, own: _Samples, others: list[_Samples]) -> _Samples:
    if mode == "own" and own:
        return own
    out: _Samples = dict(own)
    for samples in others:
        for key, value in samples.items():
            if key not in out:
                out[key] = value
            elif mode in ("sum", "own"):
                out[key] += value
            elif mode == "min":
                out[key] = min(out[key], value)
            else:
                out[key] = max(out[key], value)
    return out


def workers_registry(own: CollectorRegistry, data_dir: Path, worker: WorkerIdentity) -> CollectorRegistry:
    """A registry whose exposition is the gateway's totals over its workers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector(own, data_dir, worker))
    return registry


def snapshot_context(own: CollectorRegistry, data_dir: Path, worker: WorkerIdentity) -> Any:
    """An app cleanup context that writes this worker's snapshot every :data:`SNAPSHOT_EVERY_S`."""
    path = _snapshot_path(data_dir, worker.index)

    def write() -> None:
        replace_file(path, snapshot(own))

    async def loop() -> None:
        while True:
            try:
                write()
            except Exception:  # a failed round must not end the snapshots
                log.exception("worker_metrics_snapshot_failed", path=str(path))
            await asyncio.sleep(SNAPSHOT_EVERY_S)

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(loop(), name="worker-metrics-snapshot")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(Exception):
            write()  # the last counts, for the scrapes the other workers still answer

    return context
