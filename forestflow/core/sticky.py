"""Sticky assignment: a request key's value decides the release, the same way on every process.

Weighted rendezvous hashing: each (value, release) pair hashes to ``u`` in (0, 1) and scores
``weight / -ln(u)``; the highest score answers. A release gets the values in proportion to its
weight (the scores are exponential draws with rate ``weight``), and the scheme is consistent for
any number of releases:

- a release whose weight grows only takes values (from any other release), never gives any away,
  and the others keep theirs; a weight that shrinks only gives values away;
- a release joining only takes values; one leaving hands only its own values to the others.

So while a phase-in grows, callers move only from the old releases to the new one, never back
and forth. The hash is blake2b (not Python's per-process ``hash``), so every worker and replica
agrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from hashlib import blake2b

_SPAN = float(1 << 64)


def unit_hash(value: str, release: str, salt: str) -> float:
    """A stable point in (0, 1) for ``value`` on ``release`` (``salt``: the contract)."""
    digest = blake2b(f"{salt}\x00{release}\x00{value}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SPAN


def sticky_pick(value: str, weights: Sequence[tuple[str, int]], salt: str = "") -> str | None:
    """The release ``value`` is assigned to among ``(release, weight)`` (None with no releases).

    Releases of weight 0 get nothing; when every weight is 0, the first release answers (as the
    weighted picker does).
    """
    best: str | None = None
    best_score = -1.0
    for release, weight in weights:
        if weight <= 0:
            continue
        score = weight / -math.log(unit_hash(value, release, salt))
        if score > best_score:
            best, best_score = release, score
    if best is None and weights:
        return weights[0][0]
    return best
