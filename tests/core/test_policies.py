"""Validity rules really evaluate, phase-in is linear without dividing by zero, expiration keeps the right ones."""

from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import (
    ContractSettings,
    ImmediatelyValid,
    ImmediatePhaseIn,
    KeepLatest,
    KeepTopRanked,
    LinearTimeBasedPhaseIn,
    LoggingSettings,
    LogLevel,
    MinServedEventsBasedValidity,
    NeverValid,
    Ordering,
    PerformanceBasedValidity,
    PolicySettings,
    RouterType,
    ServableMetrics,
    ServableSettings,
    TimeBasedValidity,
    is_valid,
    phase_in_pct,
    to_expire,
)


def metrics(**kw: int) -> ServableMetrics:
    return ServableMetrics(created_at_ms=0, **kw)


def test_rules_are_anded_and_really_evaluated() -> None:
    m = metrics(score_count=3, shade_count=1)
    assert is_valid(PolicySettings((ImmediatelyValid(),)), m, 0)
    assert is_valid(PolicySettings(()), m, 0)
    assert not is_valid(PolicySettings((ImmediatelyValid(), NeverValid())), m, 0)
    assert not is_valid(PolicySettings((TimeBasedValidity(1000),)), m, 999)
    assert is_valid(PolicySettings((TimeBasedValidity(1000),)), m, 1000)
    assert is_valid(PolicySettings((MinServedEventsBasedValidity(4),)), m, 0)
    assert not is_valid(PolicySettings((MinServedEventsBasedValidity(5),)), m, 0)


def test_performance_validity_uses_the_named_metric() -> None:
    m = metrics()
    rule = PolicySettings((PerformanceBasedValidity(0.8, "auc"),))
    assert not is_valid(rule, m, 0)
    m.performance_metrics["auc"] = 0.79
    assert not is_valid(rule, m, 0)
    m.performance_metrics["auc"] = 0.8
    assert is_valid(rule, m, 0)


def test_linear_phase_in() -> None:
    policy = LinearTimeBasedPhaseIn(10)
    assert phase_in_pct(policy, 1000, 1000) == 0
    assert phase_in_pct(policy, 1000, 6000) == 50
    assert phase_in_pct(policy, 1000, 60000) == 100
    assert phase_in_pct(LinearTimeBasedPhaseIn(0), 1000, 1000) == 100  # ForestFlow divided by zero
    assert phase_in_pct(ImmediatePhaseIn(), 5, 5) == 100


def test_keep_latest_expires_older_valid_ones() -> None:
    valid = {"a": metrics(became_valid_at_ms=1), "b": metrics(became_valid_at_ms=3), "c": metrics(became_valid_at_ms=2)}
    assert sorted(to_expire(KeepLatest(2), valid)) == ["a"]
    assert to_expire(KeepLatest(3), valid) == []


def test_keep_top_ranked_without_division_by_zero() -> None:
    valid = {"a": metrics(became_valid_at_ms=1), "b": metrics(became_valid_at_ms=2), "c": metrics(became_valid_at_ms=3)}
    valid["a"].performance_metrics["auc"] = 0.9
    valid["b"].performance_metrics["auc"] = 0.7
    valid["c"].performance_metrics["auc"] = 0.8
    assert sorted(to_expire(KeepTopRanked(2, "auc", Ordering.DESC), valid)) == ["b"]
    assert sorted(to_expire(KeepTopRanked(1, "auc", Ordering.ASC), valid)) == ["a", "c"]


def state_with(*releases: tuple[str, ServableSettings, int]) -> ContractState:
    contract = Contract("o", "p", 1)
    state = ContractState(contract, ContractSettings(KeepLatest(5), RouterType.FAIR))
    for release, settings, created in releases:
        state.add(ServableEntry(FQRV(contract, release), settings, ServableMetrics(created_at_ms=created)))
    return state


def test_never_valid_servable_never_answers_but_shadows() -> None:
    full = LoggingSettings(LogLevel.FULL, ("k",))
    state = state_with(
        ("live", ServableSettings(), 1),
        ("shadow", ServableSettings(PolicySettings((NeverValid(),)), full), 2),
    )
    state.evaluate(10)
    answered = {state.route() for _ in range(50)}
    assert answered == {"live"}
    assert state.shadow_targets("live", 100) == ["shadow"]
    assert state.servables["shadow"].metrics.became_valid_at_ms is None


def test_sample_logging_shadows_every_nth_request() -> None:
    sample = LoggingSettings(LogLevel.SAMPLE, ("k",))
    state = state_with(("live", ServableSettings(), 1), ("s", ServableSettings(PolicySettings((NeverValid(),)), sample), 2))
    state.evaluate(10)
    shadowed = 0
    for _ in range(300):
        answered = state.route()
        shadowed += len(state.shadow_targets(answered, 100))
    assert shadowed == 3


def test_evaluation_stamps_became_valid_once_and_expires() -> None:
    state = state_with(("a", ServableSettings(), 1), ("b", ServableSettings(), 2))
    state.settings = ContractSettings(KeepLatest(1), RouterType.FAIR)
    result = state.evaluate(100)
    # Both became valid at the same moment: the newer creation survives.
    assert result.expired == ["a"]
    assert list(state.servables) == ["b"]
    assert state.servables["b"].metrics.became_valid_at_ms == 100
    state.evaluate(200)
    assert state.servables["b"].metrics.became_valid_at_ms == 100


def test_key_from_configs() -> None:
    settings = LoggingSettings(LogLevel.FULL, ("a", "missing", "b"), "|")
    assert settings.key_for({"a": "1", "b": "2"}) == "1|2"
    assert settings.key_for({"z": "1"}) is None
