"""Whether a model may score small batches on the event loop: decided per model by a timed probe at load.

Scoring a tiny batch right on the loop saves the thread hop, but a slow model scored there stalls
every contract, health check and gRPC call served by the same loop. So a flavor times a dummy
batch of :data:`INLINE_ROWS` rows a few times once the model is warm, and scores inline only
when the median is within :data:`INLINE_BUDGET_S`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Batches up to this many rows may score on the event loop (the scheduler gathers at most 64)...
INLINE_ROWS = 64
#: ... when a dummy batch that size takes at most this long (median of a few, at load).
INLINE_BUDGET_S = 200e-6
_CALLS = 5


def inline_rows(score_probe_batch: Callable[[], object], budget_s: float | None = None) -> int:
    """:data:`INLINE_ROWS` if the median of a few calls of ``score_probe_batch`` (scoring a dummy
    batch of that many rows) is within the budget, else 0 (always score on a thread)."""
    budget = INLINE_BUDGET_S if budget_s is None else budget_s
    times = []
    for _ in range(_CALLS):
        start = time.perf_counter()
        score_probe_batch()
        times.append(time.perf_counter() - start)
    return INLINE_ROWS if sorted(times)[_CALLS // 2] <= budget else 0
