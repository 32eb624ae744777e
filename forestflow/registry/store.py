"""Registry stores: where servable definitions, contract settings and counters are kept.

A store holds JSON documents under string keys (``servable/<fqrv>``, ``contract/<contract>``,
``metrics/<fqrv>``, ``routing/<contract>``). Writes come in batches applied atomically. The
embedded default is :class:`~forestflow.registry.file_store.FileStore`: one JSON file under the
data dir, replaced atomically, shared by the worker processes of one gateway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

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
        "errorCount": m.error_count,
        "shadeErrorCount": m.shade_error_count,
        "feedbackCount": m.feedback_count,
        "rewardMicros": to_micros(m.reward_sum),
        "rewardSquareMicros": to_micros(m.reward_squares),
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
        error_count=int(doc.get("errorCount", 0)),
        shade_error_count=int(doc.get("shadeErrorCount", 0)),
        feedback_count=int(doc.get("feedbackCount", 0)),
        reward_sum=int(doc.get("rewardMicros", 0)) / MICROS,
        reward_squares=int(doc.get("rewardSquareMicros", 0)) / MICROS,
    )


#: Rewards are kept as integer millionths, so they ride with the (integer) per-replica counters.
MICROS = 1_000_000


def to_micros(value: float) -> int:
    """A reward sum in millionths."""
    return round(value * MICROS)


def performance_from_doc(doc: dict[str, Any]) -> dict[str, float]:
    """The performance metrics of a ``metrics/<fqrv>`` document (shared by every replica)."""
    return {str(k): float(v) for k, v in (doc.get("performanceMetrics") or {}).items()}


#: The per-replica counters of a ``metrics/*`` document, in the order the stores keep them
#: (reward sums in millionths, :data:`MICROS`).
COUNTERS = (
    "scoreCount",
    "shadeCount",
    "errorCount",
    "shadeErrorCount",
    "feedbackCount",
    "rewardMicros",
    "rewardSquareMicros",
)


def counters_of(doc: dict[str, Any]) -> list[int]:
    """A metrics document's counters, in :data:`COUNTERS` order (0 for those it lacks)."""
    return [int(doc.get(name, 0) or 0) for name in COUNTERS]


def counters_doc(values: Any) -> dict[str, int]:
    """Counter values (any length up to :data:`COUNTERS`; older stores kept two) by name."""
    out = dict.fromkeys(COUNTERS, 0)
    for name, value in zip(COUNTERS, values):
        out[name] = int(value)
    return out


#: A release's counters before anything was counted, in :data:`COUNTERS` order.
NO_COUNTS = (0,) * len(COUNTERS)


def _add_counters(a: tuple[int, ...], b: Sequence[Any]) -> tuple[int, ...]:
    """Element-wise sum of two counter tuples (the shorter padded with zeros)."""
    b = [int(v) for v in b]
    return tuple(x + (b[i] if i < len(b) else 0) for i, x in enumerate(a))


def split_counters(
    fields: Iterable[tuple[str, Sequence[Any]]], replica_id: str
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Per-process counter fields (``fqrv@replica`` -> values) summed by fqrv: this process's own
    and the other processes' (what :meth:`peer_counters` of a shared store answers)."""
    own: dict[str, tuple[int, ...]] = {}
    peers: dict[str, tuple[int, ...]] = {}
    for field_name, values in fields:
        fqrv, _, replica = field_name.rpartition("@")
        target = own if replica == replica_id else peers
        target[fqrv] = _add_counters(target.get(fqrv, NO_COUNTS), values)
    return own, peers


#: Fields of a ``metrics/*`` document that all replicas share (counters are per replica).
SHARED_METRICS = ("createdAtMS", "becameValidAtMS", "performanceMetrics")


def merge_shared_metrics(current: dict[str, Any] | None, known: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The shared part of a metrics document after one replica's write.

    Stamps are first-writer-wins (every replica stamps the moment it sees a servable valid; the
    first stamp is the one all adopt). Performance metrics: only names whose value differs from
    what this replica last read (``known``) are its own changes; the rest may be stale and are
    left alone.
    """
    out = dict(current or {})
    if not out.get("createdAtMS") and new.get("createdAtMS"):
        out["createdAtMS"] = int(new["createdAtMS"])
    if out.get("becameValidAtMS") is None and new.get("becameValidAtMS") is not None:
        out["becameValidAtMS"] = int(new["becameValidAtMS"])
    perf = dict(out.get("performanceMetrics") or {})
    seen = (known or {}).get("performanceMetrics") or {}
    for name, value in (new.get("performanceMetrics") or {}).items():
        if seen.get(name) != value:
            perf[name] = value
    out["performanceMetrics"] = perf
    return {k: out[k] for k in SHARED_METRICS if k in out}


class Store(Protocol):
    """What the gateway needs from a registry backend.

    A store shared by several gateway processes (``redis_store.RedisStore`` between replicas,
    ``file_store.FileStore`` between the workers of one host) also offers ``watch(on_change)``, to
    be told when another process changed the documents, and ``peer_counters(fqrv)``, the other
    processes' counters for /stats; the gateway uses them when present
    (``ReplicaSync.sync_from_store``, ``ReplicaSync.stats_metrics``).
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
