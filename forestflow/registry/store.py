"""Registry stores: where servable definitions, contract settings and counters are kept.

A store holds JSON documents under string keys (``servable/<fqrv>``, ``contract/<contract>``,
``metrics/<fqrv>``, ``routing/<contract>``). Writes come in batches applied atomically. The
embedded default is :class:`FileStore`: one JSON file under the data dir, replaced atomically.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Protocol

import orjson

from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ServableMetrics


def servable_key(fqrv: FQRV) -> str:
    """Key of a servable definition document."""
    return f"servable/{fqrv}"


def contract_key(contract: Contract) -> str:
    """Key of a contract settings document."""
    return f"contract/{contract}"


def metrics_key(fqrv: FQRV) -> str:
    """Key of a servable's counters document."""
    return f"metrics/{fqrv}"


def routing_key(contract: Contract) -> str:
    """Key of a contract's router state document."""
    return f"routing/{contract}"


def metrics_to_doc(m: ServableMetrics) -> dict[str, Any]:
    """A servable's metrics as its ``metrics/<fqrv>`` document."""
    return {
        "createdAtMS": m.created_at_ms,
        "scoreCount": m.score_count,
        "shadeCount": m.shade_count,
        "becameValidAtMS": m.became_valid_at_ms,
        "currentPhaseInPct": m.current_phase_in_pct,
        "performanceMetrics": m.performance_metrics,
    }


def metrics_from_doc(doc: dict[str, Any] | None, created_at_ms: int) -> ServableMetrics:
    """Inverse of :func:`metrics_to_doc` (fresh metrics when there is no document)."""
    if not doc:
        return ServableMetrics(created_at_ms=created_at_ms)
    return ServableMetrics(
        created_at_ms=int(doc.get("createdAtMS") or created_at_ms),
        score_count=int(doc.get("scoreCount", 0)),
        shade_count=int(doc.get("shadeCount", 0)),
        became_valid_at_ms=doc.get("becameValidAtMS"),
        current_phase_in_pct=int(doc.get("currentPhaseInPct", 0)),
        performance_metrics=performance_from_doc(doc),
    )


def performance_from_doc(doc: dict[str, Any]) -> dict[str, float]:
    """The performance metrics of a ``metrics/<fqrv>`` document (shared by every replica)."""
    return {str(k): float(v) for k, v in (doc.get("performanceMetrics") or {}).items()}


class Store(Protocol):
    """What the gateway needs from a registry backend.

    A store shared by several gateway processes (``redis_store.RedisStore``) also offers
    ``watch(on_change)``, to be told when another process changed the documents, and
    ``peer_counters(fqrv)``, the other processes' counters for /stats; the gateway uses them when
    present (``Gateway.sync_from_store``, ``Gateway.stats_metrics``).
    """

    async def load(self) -> dict[str, Any]:
        """Every document, by key."""
        ...

    async def apply(self, changes: dict[str, Any | None]) -> None:
        """Write documents (None deletes one) as one atomic change; raise StoreUnavailable if it cannot."""
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...


class FileStore:
    """All documents in one JSON file, rewritten atomically (temp file, fsync, rename) per change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._docs: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> dict[str, Any]:
        if self.path.exists():
            data = orjson.loads(self.path.read_bytes())
            self._docs = data.get("documents", {})
        return dict(self._docs)

    async def apply(self, changes: dict[str, Any | None]) -> None:
        async with self._lock:
            for key, doc in changes.items():
                if doc is None:
                    self._docs.pop(key, None)
                else:
                    self._docs[key] = doc
            payload = orjson.dumps({"format": 1, "documents": self._docs}, option=orjson.OPT_SORT_KEYS)
            write = asyncio.ensure_future(asyncio.to_thread(_atomic_write, self.path, payload))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # A cancelled caller must not release the lock while the thread still writes: the
                # next write would race it on the same temporary file.
                await asyncio.wait([write])
                raise

    async def close(self) -> None:
        return None


def _atomic_write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
