"""Bandit routing among the valid releases: Thompson sampling and epsilon-greedy (no I/O).

Each release is an arm with its reward statistics (count, sum, sum of squares: what feedback
collected over every process sharing the store). :func:`arm_shares` turns them into the share of
traffic each arm gets now: Thompson sampling's probability that the arm is the best (estimated by
drawing from each posterior), or epsilon-greedy's ``1 - epsilon`` to the best mean and ``epsilon``
spread evenly. :func:`shaped` then gives every arm its floor (``min_share``) and caps an arm still
phasing in at its phase-in percentage. The request picks an arm from those shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from forestflow.core.policies import BanditParams, RewardKind, RouterType

#: Posterior draws per arm when Thompson shares are recomputed.
THOMPSON_DRAWS = 2000


@dataclass(frozen=True, slots=True)
class RewardStats:
    """What feedback said about one release: how many rewards, their sum and sum of squares."""

    count: int = 0
    total: float = 0.0
    squares: float = 0.0

    @property
    def mean(self) -> float | None:
        """The mean reward (None before any feedback)."""
        return self.total / self.count if self.count else None


def arm_shares(router: RouterType, params: BanditParams, stats: Sequence[RewardStats], rng: np.random.Generator) -> list[float]:
    """The share of traffic each arm gets before floors and caps (sums to 1)."""
    n = len(stats)
    if n == 0:
        return []
    if router is RouterType.EPSILON_GREEDY:
        return _epsilon_greedy(params.epsilon, stats)
    if all(s.count == 0 for s in stats):
        return [1.0 / n] * n
    draws = _posterior_draws(params, stats, rng)
    wins = np.bincount(np.argmax(draws, axis=1), minlength=n)
    return [float(w) / THOMPSON_DRAWS for w in wins]


def _epsilon_greedy(epsilon: float, stats: Sequence[RewardStats]) -> list[float]:
    n = len(stats)
    means = [s.mean for s in stats]
    known = [m for m in means if m is not None]
    if not known:
        return [1.0 / n] * n
    best = max(known)
    leaders = [i for i, m in enumerate(means) if m == best]
    shares = [epsilon / n] * n
    for i in leaders:
        shares[i] += (1.0 - epsilon) / len(leaders)
    return shares


def _posterior_draws(params: BanditParams, stats: Sequence[RewardStats], rng: np.random.Generator) -> np.ndarray:
    """``THOMPSON_DRAWS`` x arms samples of each arm's mean reward from its posterior."""
    columns = []
    for s in stats:
        if params.rewards is RewardKind.BERNOULLI:
            # Rewards outside [0, 1] are clipped into the Beta's counts (a conversion is 0 or 1).
            successes = min(max(s.total, 0.0), float(s.count))
            alpha = params.prior_alpha + successes
            beta = params.prior_beta + s.count - successes
            columns.append(rng.beta(alpha, beta, THOMPSON_DRAWS))
        else:
            # Normal posterior of the mean with one pseudo-observation of mean 0 and variance 1.
            n = s.count + 1
            mean = s.total / n
            variance = 1.0 if s.count < 2 else max(s.squares / s.count - (s.total / s.count) ** 2, 1e-9)
            columns.append(rng.normal(mean, math.sqrt(variance / n), THOMPSON_DRAWS))
    return np.stack(columns, axis=1)


def shaped(shares: Sequence[float], caps: Sequence[float], min_share: float) -> list[float]:
    """``shares`` with every arm at ``min_share`` at least and at its cap at most (sums to 1).

    The floor is mixed in (``(1 - n*floor) * share + floor``, the floor shrunk to ``1/n`` when
    ``n`` floors would not fit); arms over their cap give the excess to the uncapped ones in
    proportion to what they have. When the caps together are under 1 (only phasing-in arms) they
    cannot all hold: the shares are the caps, normalised.
    """
    n = len(shares)
    if n == 0:
        return []
    floor = min(max(min_share, 0.0), 1.0 / n)
    out = [(1.0 - n * floor) * s + floor for s in shares]
    caps = [min(max(c, 0.0), 1.0) for c in caps]
    if sum(caps) < 1.0 - 1e-12:
        total = sum(caps)
        return [c / total for c in caps] if total > 0 else [1.0 / n] * n
    capped: set[int] = set()
    for _ in range(n):
        over = [i for i in range(n) if i not in capped and out[i] > caps[i] + 1e-12]
        if not over:
            break
        excess = sum(out[i] - caps[i] for i in over)
        for i in over:
            out[i] = caps[i]
            capped.add(i)
        free = [i for i in range(n) if i not in capped]
        room = sum(out[i] for i in free)
        for i in free:
            out[i] += excess * (out[i] / room if room > 0 else 1.0 / len(free))
    total = sum(out)
    return [x / total for x in out]


def pick(shares: Sequence[float], u: float) -> int:
    """The arm a uniform draw ``u`` in [0, 1) lands on."""
    acc = 0.0
    for i, share in enumerate(shares):
        acc += share
        if u < acc:
            return i
    return len(shares) - 1
