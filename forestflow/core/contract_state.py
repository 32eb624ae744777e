"""One contract's routing state: its servables' settings and metrics, evaluation, routing, shadows.

Pure logic with an injected clock value: the service calls :meth:`ContractState.evaluate` on every
change and on a timer, :meth:`route` once per request, and :meth:`shadow_targets` for the
shadow fan-out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forestflow.core.bandit import RewardStats, arm_shares, pick, shaped
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import (
    BanditParams,
    ContractSettings,
    ImmediatelyValid,
    ImmediatePhaseIn,
    KeepLatest,
    KeepTopRanked,
    LinearTimeBasedPhaseIn,
    LogLevel,
    MaxErrorRateValidity,
    MinServedEventsBasedValidity,
    NeverValid,
    PerformanceBasedValidity,
    RouterType,
    ServableMetrics,
    ServableSettings,
    StickyParams,
    TimeBasedValidity,
    is_valid,
    phase_in_pct,
    recency_key,
    to_expire,
)
from forestflow.core.router import WeightedPicker, router_weights
from forestflow.core.sticky import sticky_pick

#: Routed requests between two recomputations of a bandit's shares (when its rewards moved).
BANDIT_REFRESH_EVERY = 16
#: RouterType.STICKY, read per request without EnumType's attribute hook (a call on Python 3.11).
_STICKY = RouterType.STICKY


@dataclass(slots=True)
class ServableEntry:
    """What the contract knows of one of its servables."""

    fqrv: FQRV
    settings: ServableSettings
    metrics: ServableMetrics


@dataclass(slots=True)
class Evaluation:
    """The outcome of one evaluation: which releases to expire, and whether routing changed."""

    expired: list[str] = field(default_factory=list)
    routing_changed: bool = False


class ContractState:
    """Servables of one contract, their validity/phase-in, and the router built from them."""

    def __init__(self, contract: Contract, settings: ContractSettings) -> None:
        self.contract = contract
        self.settings = settings
        self.servables: dict[str, ServableEntry] = {}
        self.picker = WeightedPicker()
        #: Set by a settings change: the next evaluation builds the router afresh.
        self._fresh_router = False
        #: Requests that reached this contract (drives SAMPLE shadowing).
        self.request_count = 0
        self._rng: np.random.Generator | None = None
        #: The bandit's current shares by release, the rewards they came from, and routed
        #: requests since they were computed.
        self.bandit_shares: dict[str, float] = {}
        self._bandit_basis: tuple[Any, ...] | None = None
        self._since_shares = 0
        #: The releases the last evaluation found valid (:meth:`next_change_ms` reads it).
        self._valid: list[str] = []

    @property
    def rng(self) -> np.random.Generator:
        """Draws of the bandit routers (set it for reproducible routing). Made on first use: making
        one for each of 10,000 contracts at start took a second."""
        if self._rng is None:
            self._rng = np.random.default_rng()
        return self._rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    # ---- membership ---------------------------------------------------------------------------
    def add(self, entry: ServableEntry) -> None:
        """Add (or replace) a servable."""
        self.servables[entry.fqrv.release] = entry

    def remove(self, release: str) -> ServableEntry | None:
        """Remove a servable; returns it, or None if unknown.

        It leaves routing at once (the router goes on with the others until the next
        evaluation), so no request is routed to a release that is about to be unloaded.
        """
        self.picker = self.picker.without(release)
        return self.servables.pop(release, None)

    def update_settings(self, settings: ContractSettings) -> None:
        """Replace the contract settings; the router is rebuilt fresh at the next evaluation
        (until then the current one keeps answering: a contract never routes to nothing between)."""
        self.settings = settings
        self._fresh_router = True

    # ---- evaluation ---------------------------------------------------------------------------
    def valid_releases(self, now_ms: int) -> list[str]:
        """Releases whose validity rules all hold now."""
        return [r for r, e in self.servables.items() if is_valid(e.settings.policy, e.metrics, now_ms)]

    def evaluate(self, now_ms: int) -> Evaluation:
        """Stamp newly valid servables, recompute phase-in, pick expirations, rebuild the router.

        Expired servables are removed from this state and returned; the caller unloads them.
        """
        valid = self._valid = self.valid_releases(now_ms)
        for release, entry in self.servables.items():
            metrics = entry.metrics
            if release in valid:
                if metrics.became_valid_at_ms is None:
                    metrics.became_valid_at_ms = now_ms
                metrics.current_phase_in_pct = phase_in_pct(entry.settings.policy.phase_in, metrics.became_valid_at_ms, now_ms)
            else:
                metrics.current_phase_in_pct = 0
        expired = to_expire(self.settings.expiration, {r: self.servables[r].metrics for r in valid})
        for release in expired:
            del self.servables[release]
        survivors = {r: self.servables[r].metrics for r in valid if r not in expired}
        weights = router_weights(self.weights_router, survivors)
        before = [(i.key, i.weight) for i in self.picker.items]
        if self._fresh_router:
            self._fresh_router = False
            self.picker = WeightedPicker()
        self.picker = self.picker.reweighted(weights)
        after = [(i.key, i.weight) for i in self.picker.items]
        return Evaluation(expired=expired, routing_changed=before != after)

    def next_change_ms(self, now_ms: int) -> int | None:
        """The first moment after the evaluation made at ``now_ms`` when evaluating again could give
        another result by the passing of time alone (None: none could).

        Only valid-from times and linear phase-ins move with time; every other input is a setting,
        the membership or a metric, whose changes are marked where they are made (see
        :attr:`~forestflow.registry.registry.Registry.stale`). A policy this does not know answers
        ``now_ms``: the contract is evaluated at every round.
        """
        soonest: int | None = None
        valid = self._valid
        for release, entry in self.servables.items():
            for rule in entry.settings.policy.validity:
                match rule:
                    case TimeBasedValidity(valid_after_ms=after):
                        if now_ms < after and (soonest is None or after < soonest):
                            soonest = after
                    case (
                        ImmediatelyValid()
                        | NeverValid()
                        | MinServedEventsBasedValidity()
                        | PerformanceBasedValidity()
                        | MaxErrorRateValidity()
                    ):
                        pass
                    case _:
                        return now_ms
            metrics = entry.metrics
            match entry.settings.policy.phase_in:
                case ImmediatePhaseIn():
                    pass
                case LinearTimeBasedPhaseIn(phase_in_over_secs=secs):
                    pct, stamp = metrics.current_phase_in_pct, metrics.became_valid_at_ms
                    if secs > 0 and pct < 100 and stamp is not None and release in valid:
                        # phase_in_pct is elapsed * 100 // (secs * 1000): it reaches pct + 1 then.
                        at = stamp + (pct + 1) * secs * 10
                        if soonest is None or at < soonest:
                            soonest = at
                case _:
                    return now_ms
        if not isinstance(self.settings.expiration, KeepLatest | KeepTopRanked):
            return now_ms
        return soonest

    @property
    def weights_router(self) -> RouterType:
        """The router whose phase-in weights this contract routes by (a sticky router's ``over``)."""
        params = self.settings.router_params
        return params.over if isinstance(params, StickyParams) else self.settings.router

    @property
    def sticky_key(self) -> str | None:
        """The ``configs`` name whose value keeps a caller on one release (sticky routers only)."""
        params = self.settings.router_params
        return params.key if self.settings.router is _STICKY and isinstance(params, StickyParams) else None

    # ---- per request --------------------------------------------------------------------------
    def route(self, sticky_value: str | None = None, rewards: Mapping[str, RewardStats] | None = None) -> str | None:
        """Count the request and pick the release that answers it (None: nothing is active).

        ``sticky_value``: the request's value of :attr:`sticky_key` (a sticky router assigns it by
        its hash; requests without one are routed by phase-in as the Fair router does).
        ``rewards``: every routed release's reward statistics (a bandit router picks from them).
        """
        self.request_count += 1
        router = self.settings.router
        if router is _STICKY and sticky_value is not None:
            weights = [(i.key, i.weight) for i in self.picker.items if i.key in self.servables]
            return sticky_pick(sticky_value, weights, str(self.contract))
        if router.is_bandit and rewards is not None:
            return self._bandit_route(rewards)
        # A router restored from the store can name releases whose servables are not held here
        # yet (while the gateway starts or a follower loads them): the next routed one answers.
        for _ in range(max(1, len(self.picker.items))):
            picked = self.picker.next()
            if picked is None or picked in self.servables:
                return picked
        return None

    def _bandit_route(self, rewards: Mapping[str, RewardStats]) -> str | None:
        arms = [(i.key, i.weight) for i in self.picker.items if i.key in self.servables]
        if not arms:
            return None
        basis = tuple((key, weight, rewards.get(key, RewardStats())) for key, weight in arms)
        self._since_shares += 1
        if basis != self._bandit_basis and (
            self._bandit_basis is None
            or self._since_shares >= BANDIT_REFRESH_EVERY
            or [a[:2] for a in basis] != [a[:2] for a in self._bandit_basis]
        ):
            params = self.settings.router_params
            params = params if isinstance(params, BanditParams) else BanditParams()
            raw = arm_shares(self.settings.router, params, [stats for _, _, stats in basis], self.rng)
            # A release still phasing in gets at most its phase-in share; the others are uncapped.
            caps = [weight / 100 if weight < 100 else 1.0 for _, weight in arms]
            self.bandit_shares = dict(zip((key for key, _ in arms), shaped(raw, caps, params.min_share)))
            self._bandit_basis = basis
            self._since_shares = 0
        keys = list(self.bandit_shares)
        return keys[pick(list(self.bandit_shares.values()), float(self.rng.random()))]

    def shadow_targets(self, answered: str | None, sample_every: int) -> list[str]:
        """Releases that get a shadow copy of the current request.

        Every servable that logs, except the one that answered, whatever its validity: FULL
        always, SAMPLE when the contract's request counter is a multiple of ``sample_every``.
        """
        targets = []
        for release, entry in self.servables.items():
            if release == answered:
                continue
            level = entry.settings.logging.log_level
            if level is LogLevel.FULL or (
                level is LogLevel.SAMPLE and sample_every > 0 and self.request_count % sample_every == 0
            ):
                targets.append(release)
        return targets

    def latest_valid(self) -> str | None:
        """The most recently valid release with routing weight (for metadata of 'the contract')."""
        keys = [k for k in self.picker.keys() if k in self.servables]  # noqa: SIM118 (a WeightedPicker)
        if not keys:
            return None
        return max(keys, key=lambda r: recency_key(self.servables[r].metrics))

    # ---- persistence --------------------------------------------------------------------------
    def routing_state(self) -> dict[str, Any]:
        """Router counters and the request counter, as plain data."""
        return {"picker": self.picker.to_state(), "requestCount": self.request_count}

    def restore_routing_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`routing_state` (unknown releases are dropped at next evaluation)."""
        self.picker = WeightedPicker.from_state(state.get("picker", {}))
        self.request_count = int(state.get("requestCount", 0))
