"""The weighted pick reproduces ForestFlow's shares exactly and survives re-weighting and restarts."""

from collections import Counter

import pytest

from forestflow.core.policies import RouterType, ServableMetrics
from forestflow.core.router import WeightedPicker, router_weights


def picks(weights: list[int], n: int = 1000) -> list[int]:
    picker = WeightedPicker().reweighted([(str(i), w) for i, w in enumerate(weights)])
    counts = Counter(picker.next() for _ in range(n))
    return [counts[str(i)] for i in range(len(weights))]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([100, 30], [769, 231]),
        ([100, 100], [500, 500]),
        ([10, 90], [100, 900]),
        ([50, 50, 100], [250, 250, 500]),
        ([0, 100], [1, 999]),
        ([0, 0], [1000, 0]),
    ],
)
def test_shares_over_1000_picks_match_forestflow(weights: list[int], expected: list[int]) -> None:
    assert picks(weights) == expected


def test_empty_picker_picks_nothing() -> None:
    assert WeightedPicker().next() is None


def test_same_keys_keep_cumulative_counters_on_reweight() -> None:
    picker = WeightedPicker().reweighted([("a", 100), ("b", 100)])
    for _ in range(10):
        picker.next()
    merged = picker.reweighted([("a", 100), ("b", 50)])
    assert merged.elements_served == 10
    assert sorted(i.served for i in merged.items) == [5, 5]
    assert merged.keys() == ["b", "a"]  # re-sorted by weight ascending, as ForestFlow merges


def test_state_round_trip_continues_the_same_sequence() -> None:
    a = WeightedPicker().reweighted([("x", 100), ("y", 30)])
    for _ in range(37):
        a.next()
    b = WeightedPicker.from_state(a.to_state())
    assert [a.next() for _ in range(100)] == [b.next() for _ in range(100)]


def m(valid_at: int, pct: int) -> ServableMetrics:
    return ServableMetrics(created_at_ms=valid_at, became_valid_at_ms=valid_at, current_phase_in_pct=pct)


def test_latest_router_gives_everything_to_newest_at_100() -> None:
    survivors = {"old": m(1, 100), "new": m(2, 100), "older": m(0, 100)}
    assert router_weights(RouterType.LATEST, survivors) == [("new", 100)]


def test_latest_router_shares_with_previous_while_phasing_in() -> None:
    survivors = {"old": m(1, 100), "new": m(2, 30), "older": m(0, 100)}
    assert router_weights(RouterType.LATEST, survivors) == [("old", 100), ("new", 30)]


def test_fair_router_weights_every_survivor_oldest_first() -> None:
    survivors = {"b": m(2, 30), "a": m(1, 100)}
    assert router_weights(RouterType.FAIR, survivors) == [("a", 100), ("b", 30)]
