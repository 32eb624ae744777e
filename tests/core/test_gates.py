"""The release windows behind the error-rate gate and shadow agreement (no I/O)."""

from __future__ import annotations

import numpy as np

from forestflow.core.frame import Frame
from forestflow.core.gates import ReleaseWindow, agreeing_rows
from forestflow.core.policies import MaxErrorRateValidity, MinServedEventsBasedValidity, ServableMetrics, rule_holds


def test_error_rate_gate_needs_min_events_then_trips_and_needs_fresh_events() -> None:
    window = ReleaseWindow()
    for _ in range(19):
        window.record(True, 1.0)
    assert not window.error_rate_ok(0.1, 20)
    window.record(True, 1.0)
    assert window.error_rate_ok(0.1, 20)
    for _ in range(3):
        window.record(False, 1.0)
    assert window.error_rate == 3 / 23
    assert not window.error_rate_ok(0.1, 20)  # crossed: cleared
    assert len(window.outcomes) == 0
    for _ in range(19):
        window.record(True)
    assert not window.error_rate_ok(0.1, 20)
    window.record(True)
    assert window.error_rate_ok(0.1, 20)


def test_the_window_slides_so_old_successes_cannot_hide_new_failures() -> None:
    window = ReleaseWindow()
    for _ in range(10_000):
        window.record(True)
    for _ in range(11):
        window.record(False)
    assert window.failures == 11 and len(window.outcomes) == 100
    assert not window.error_rate_ok(0.1, 20)
    big = ReleaseWindow()
    big.resize(500)
    assert big.size == 500


def test_min_served_events_counts_successes_only() -> None:
    metrics = ServableMetrics(created_at_ms=0, shade_count=60, shade_error_count=60)
    assert not rule_holds(MinServedEventsBasedValidity(5), metrics, 0)
    metrics.shade_count += 5
    assert rule_holds(MinServedEventsBasedValidity(5), metrics, 0)
    assert not rule_holds(MaxErrorRateValidity(0.1, 20), metrics, 0)  # no events in this process's window


def test_min_served_events_waits_for_events_in_flight() -> None:
    # Sent, not finished: counted in shadeCount at once, but not a success until it has answered.
    metrics = ServableMetrics(created_at_ms=0, score_count=3, shade_count=2, in_flight=2)
    assert metrics.successful_events == 3
    assert not rule_holds(MinServedEventsBasedValidity(5), metrics, 0)
    metrics.in_flight -= 1
    metrics.shade_error_count += 1  # one copy failed
    metrics.in_flight -= 1  # the other answered
    assert metrics.successful_events == 4
    assert not rule_holds(MinServedEventsBasedValidity(5), metrics, 0)


def test_agreement_on_floats_labels_and_integer_classes() -> None:
    served = Frame({"y": np.array([1.0, 2.0, 3.0])})
    assert agreeing_rows(Frame({"y": np.array([1.0, 2.0 * (1 + 1e-9), 3.1])}), served) == (2, 3)
    labels = Frame({"c": np.array(["a", "b"], dtype=object)})
    assert agreeing_rows(Frame({"c": np.array([b"a", "x"], dtype=object)}), labels) == (1, 2)
    classes = Frame({"k": np.array([1, 2], dtype=np.int64)})
    assert agreeing_rows(Frame({"k": np.array([1, 2], dtype=np.int32)}), classes) == (2, 2)
    probabilities = Frame({"p": np.array([[0.2, 0.8], [0.6, 0.4]])})
    assert agreeing_rows(Frame({"p": np.array([[0.2, 0.1], [0.5, 0.5]])}), probabilities) == (1, 2)
    assert agreeing_rows(Frame({"y": np.array([1.0])}), served) == (0, 3)  # wrong row count: all disagree


def test_observed_metrics() -> None:
    window = ReleaseWindow()
    assert window.observed() == {}
    for i in range(100):
        window.record(i % 4 != 0, float(i))
    window.record_agreement(9, 10)
    observed = window.observed()
    assert observed["agreement"] == 0.9 and observed["errorRate"] == 0.25 and observed["p99LatencyMs"] == 98.0
