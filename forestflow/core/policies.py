"""Servable and contract settings, and the rules that evaluate them (no I/O).

Validity rules are ANDed; phase-in gives a percentage; expiration picks servables to remove.
Unlike ForestFlow, TimeBased, PerformanceBased and MinServedEvents validity really evaluate,
a 0-second linear phase-in means immediate, and KeepTopRanked does not divide by zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from forestflow.core.gates import ReleaseWindow


# ---- validity -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImmediatelyValid:
    """Always valid."""


@dataclass(frozen=True, slots=True)
class NeverValid:
    """Never valid: the servable only shadows (when it logs)."""


@dataclass(frozen=True, slots=True)
class TimeBasedValidity:
    """Valid from ``valid_after_ms`` (ms since the epoch) on."""

    valid_after_ms: int


@dataclass(frozen=True, slots=True)
class PerformanceBasedValidity:
    """Valid once a performance metric reaches ``min_threshold``.

    ``metric_name`` (JSON ``metric`` or ``metricName``) names the ``performanceMetrics`` entry:
    one set by ``PUT .../performance`` or, when none is, one the gateway observes (``agreement``,
    ``errorRate``, ``p99LatencyMs``). When empty, the servable's only reported metric (or, with
    several, the lowest of them) is compared, as ForestFlow read it.
    """

    min_threshold: float
    metric_name: str = ""


@dataclass(frozen=True, slots=True)
class MinServedEventsBasedValidity:
    """Valid once the servable has scored (served + shadow) at least this many requests successfully."""

    valid_after_min_served_events: int


@dataclass(frozen=True, slots=True)
class MaxErrorRateValidity:
    """Valid while, over the last ``max(min_events, 100)`` events, at least ``min_events`` were seen
    and at most ``max_error_rate`` of them failed; checked at every evaluation, so a release
    that starts failing leaves routing (rollback) until ``min_events`` fresh events are under
    the bound again."""

    max_error_rate: float
    min_events: int


ValidityRule = (
    ImmediatelyValid
    | NeverValid
    | TimeBasedValidity
    | PerformanceBasedValidity
    | MinServedEventsBasedValidity
    | MaxErrorRateValidity
)


# ---- phase-in -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImmediatePhaseIn:
    """100 % as soon as valid."""


@dataclass(frozen=True, slots=True)
class LinearTimeBasedPhaseIn:
    """0 -> 100 % linearly over ``phase_in_over_secs`` from the moment it became valid."""

    phase_in_over_secs: int


PhaseInPolicy = ImmediatePhaseIn | LinearTimeBasedPhaseIn


# ---- logging ----------------------------------------------------------------------------------
class LogLevel(enum.Enum):
    """How much a servable logs: nothing, every request, or a sample of shadow copies."""

    NONE = 1
    FULL = 2
    SAMPLE = 3


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """Prediction-log level and the ``configs`` names that make the Kafka key."""

    log_level: LogLevel = LogLevel.NONE
    key_features: tuple[str, ...] = ()
    key_features_separator: str = "."

    def key_for(self, configs: dict[str, str]) -> str | None:
        """``configs[name]`` for each key feature present, joined; None when nothing matched."""
        features = self.key_features
        if len(features) == 1:  # the usual case, asked once per logged event: no list to build
            return configs.get(features[0])
        parts = [configs[name] for name in features if name in configs]
        return self.key_features_separator.join(parts) if parts else None


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Validity rules (ANDed) and the phase-in policy of a servable."""

    validity: tuple[ValidityRule, ...] = (ImmediatelyValid(),)
    phase_in: PhaseInPolicy = ImmediatePhaseIn()


@dataclass(frozen=True, slots=True)
class ServableSettings:
    """Everything an admin sets on one servable."""

    policy: PolicySettings = field(default_factory=PolicySettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    #: Missing or unknown input columns are a 400 naming them (default: scored, NA, and reported).
    strict_inputs: bool = False


# ---- contract settings ------------------------------------------------------------------------
class Ordering(enum.Enum):
    """Sort direction for KeepTopRanked."""

    DESC = 1
    ASC = 2


@dataclass(frozen=True, slots=True)
class KeepLatest:
    """Keep the ``servables_to_keep`` most recently valid servables; expire older valid ones."""

    servables_to_keep: int = 1


@dataclass(frozen=True, slots=True)
class KeepTopRanked:
    """Keep the ``servables_to_keep`` valid servables ranked best by a performance metric."""

    servables_to_keep: int
    metric_to_evaluate: str
    ordering: Ordering = Ordering.DESC


ExpirationPolicy = KeepLatest | KeepTopRanked


class RouterType(enum.Enum):
    """How a contract splits its traffic among valid servables."""

    FAIR = "FairPhaseInPctBasedRouter"
    LATEST = "LatestPhaseInPctBasedRouter"
    #: Phase-in shares, a request's ``configs[key]`` keeping it on one release (:class:`StickyParams`).
    STICKY = "StickyPhaseInRouter"
    #: Bandits among the valid releases, learning from reward feedback (:class:`BanditParams`).
    THOMPSON = "ThompsonSamplingRouter"
    EPSILON_GREEDY = "EpsilonGreedyRouter"

    @property
    def is_bandit(self) -> bool:
        """Whether the router learns from rewards."""
        return self in _BANDIT_ROUTERS


#: The routers that learn from rewards (a member read through its Enum class costs a call of
#: EnumType's attribute hook on Python 3.11: is_bandit runs twice per request).
_BANDIT_ROUTERS = (RouterType.THOMPSON, RouterType.EPSILON_GREEDY)


@dataclass(frozen=True, slots=True)
class StickyParams:
    """StickyPhaseInRouter: ``key`` names the ``configs`` entry (V2: the request parameter) whose
    value keeps a caller on one release; ``over`` is the router whose phase-in weights are shared."""

    key: str
    over: RouterType = RouterType.FAIR


class RewardKind(enum.Enum):
    """What a bandit's rewards look like: 0/1 conversions, or any real number."""

    BERNOULLI = "bernoulli"
    GAUSSIAN = "gaussian"


@dataclass(frozen=True, slots=True)
class BanditParams:
    """ThompsonSamplingRouter and EpsilonGreedyRouter settings (each with a default, so ``{}`` works).

    ``min_share`` is the floor every routed release keeps (none starves); a release still phasing
    in is capped at its phase-in percentage.
    """

    rewards: RewardKind = RewardKind.BERNOULLI
    epsilon: float = 0.1
    min_share: float = 0.05
    prior_alpha: float = 1.0
    prior_beta: float = 1.0


RouterParams = StickyParams | BanditParams


@dataclass(frozen=True, slots=True)
class ContractSettings:
    """Router and expiration policy of a contract (defaults as ForestFlow: KeepLatest(1) + Fair).

    ``router_params`` holds the settings of the routers that have some (sticky, bandits);
    ``allow_pinned_releases`` lets any caller pick the answering release with
    ``X-Forestflow-Release`` (otherwise only the admin token holder may).
    """

    expiration: ExpirationPolicy = KeepLatest(1)
    router: RouterType = RouterType.FAIR
    router_params: RouterParams | None = None
    allow_pinned_releases: bool = False


# ---- evaluation -------------------------------------------------------------------------------
@dataclass(slots=True)
class ServableMetrics:
    """Counters and stamps of one servable (ForestFlow's ServableMetrics)."""

    created_at_ms: int
    score_count: int = 0
    shade_count: int = 0
    became_valid_at_ms: int | None = None
    current_phase_in_pct: int = 0
    #: Set by ``PUT .../performance`` (shared by replicas); they win over the observed values.
    performance_metrics: dict[str, float] = field(default_factory=dict)
    #: Live requests that failed (5xx: model errors, 503 not ready/overloaded, 504).
    error_count: int = 0
    #: Shadow copies that failed, timed out or were dropped.
    shade_error_count: int = 0
    #: Reward feedback joined to this release's answers: how many, their sum and sum of squares.
    feedback_count: int = 0
    reward_sum: float = 0.0
    reward_squares: float = 0.0
    #: This process's sliding windows (not persisted): error rate, latency, shadow agreement.
    window: ReleaseWindow = field(default_factory=ReleaseWindow, compare=False, repr=False)
    #: Requests and shadow copies this process sent here that have not finished (not persisted): the
    #: counts above include them at once, their failures only when they fail.
    in_flight: int = field(default=0, compare=False, repr=False)

    @property
    def successful_events(self) -> int:
        """Served and shadow events that finished and did not fail (one still running is not a success yet)."""
        return self.score_count + self.shade_count - self.error_count - self.shade_error_count - max(0, self.in_flight)

    def performance_view(self) -> dict[str, float]:
        """Observed metrics overlaid with the reported ones (reported win for the keys they name)."""
        return {**self.window.observed(), **self.performance_metrics}


def rule_holds(rule: ValidityRule, metrics: ServableMetrics, now_ms: int) -> bool:
    """Whether one validity rule passes now."""
    match rule:
        case ImmediatelyValid():
            return True
        case NeverValid():
            return False
        case TimeBasedValidity(valid_after_ms=after):
            return now_ms >= after
        case MinServedEventsBasedValidity(valid_after_min_served_events=n):
            return metrics.successful_events >= n
        case PerformanceBasedValidity(min_threshold=threshold, metric_name=name):
            values = metrics.performance_metrics
            if name:
                value = values.get(name)
                if value is None:
                    value = metrics.window.observed().get(name)
                return value is not None and value >= threshold
            return bool(values) and min(values.values()) >= threshold
        case MaxErrorRateValidity(max_error_rate=rate, min_events=n):
            return metrics.window.error_rate_ok(rate, n)
    raise TypeError(f"unknown validity rule {rule!r}")


def is_valid(policy: PolicySettings, metrics: ServableMetrics, now_ms: int) -> bool:
    """All rules must hold (an empty list is valid)."""
    return all(rule_holds(rule, metrics, now_ms) for rule in policy.validity)


def phase_in_pct(policy: PhaseInPolicy, became_valid_at_ms: int, now_ms: int) -> int:
    """The phase-in percentage (0..100) of a valid servable."""
    match policy:
        case ImmediatePhaseIn():
            return 100
        case LinearTimeBasedPhaseIn(phase_in_over_secs=secs):
            if secs <= 0:
                return 100
            elapsed = max(0, now_ms - became_valid_at_ms)
            return min(100, elapsed * 100 // (secs * 1000))
    raise TypeError(f"unknown phase-in policy {policy!r}")


def recency_key(metrics: ServableMetrics) -> tuple[int, int]:
    """Sort key: when it became valid, then when it was created (larger = newer)."""
    return (metrics.became_valid_at_ms or 0, metrics.created_at_ms)


def to_expire(policy: ExpirationPolicy, valid: dict[str, ServableMetrics]) -> list[str]:
    """Which of the valid servables (by id) the expiration policy removes."""
    match policy:
        case KeepLatest(servables_to_keep=keep):
            if len(valid) <= keep:
                return []
            ordered = sorted(valid, key=lambda k: recency_key(valid[k]), reverse=True)
            return ordered[max(keep, 0) :]
        case KeepTopRanked(servables_to_keep=keep, metric_to_evaluate=metric, ordering=ordering):
            if len(valid) <= keep:
                return []

            def score(k: str) -> tuple[float, tuple[int, int]]:
                value = valid[k].performance_view().get(metric, 0.0)
                # Ties go to the newer servable in both orderings.
                return (value if ordering is Ordering.DESC else -value, recency_key(valid[k]))

            ordered = sorted(valid, key=score, reverse=True)
            return ordered[max(keep, 0) :]
    raise TypeError(f"unknown expiration policy {policy!r}")
