"""Two gateway processes sharing one registry in a real redis-server.

Deploys and settings changes made through one replica reach the other; a SIGKILLed replica comes
back from Redis; a lost pub/sub message is caught by the version check; a Redis outage under
traffic costs no predictions and refuses admin writes with 503; /stats sums both replicas.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.registry.redis_server import RedisServer
from tests.support import FIXTURES, GatewayProcess, python_servable, score_body

SYNC_INTERVAL_S = 0.5
NEVER = {"validityPolicy": [{"NeverValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}}
GATES = FIXTURES / "servables" / "gates"
KEEP_THREE = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"FairPhaseInPctBasedRouter": {}}}
ALWAYS = {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}}


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` is truthy (exceptions count as not yet); fails at the deadline."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < timeout_s:
        try:
            last = condition()
            if last:
                return time.monotonic() - started
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s}s (last: {last!r})")


def replicas(
    gateway_process: type[GatewayProcess],
    tmp_path: Path,
    redis: RedisServer,
    *names: str,
    sync_interval_s: float = SYNC_INTERVAL_S,
) -> list[GatewayProcess]:
    env = {
        "FORESTFLOW_REDIS_URL": redis.url,
        "FORESTFLOW_REDIS_SYNC_INTERVAL_S": str(sync_interval_s),
        "FORESTFLOW_METRICS_FLUSH_INTERVAL_S": "0.2",
        "FORESTFLOW_ACCESS_LOG": "0",
    }
    procs = [gateway_process(tmp_path / name, env=env) for name in names]
    for proc in procs:
        proc.start()
    return procs


def deploy(gw: GatewayProcess, body: dict[str, Any]) -> requests.Response:
    return requests.post(gw.url + "/servable", json=body, timeout=30)


def score(gw: GatewayProcess, x: float = 1.0) -> tuple[int, str | None]:
    """Status and answering release of one BASIC score call."""
    r = requests.post(gw.url + "/acme/demo/1/score", json=score_body([x]), timeout=10)
    return r.status_code, (r.json()["Prediction"]["fqrv"]["releaseVersion"] if r.status_code == 200 else None)


def releases(gw: GatewayProcess) -> list[str]:
    r = requests.get(gw.url + "/acme/demo/1/releases", timeout=10)
    return [e["FQRV"]["releaseVersion"] for e in r.json()] if r.status_code == 200 else []


def score_counts(gw: GatewayProcess) -> dict[str, int]:
    """scoreCount by release; empty while the replica cannot count for the contract yet: 404 before it knows
    the contract, 422 while it knows the contract but none of its releases yet (they sync one after the other)."""
    r = requests.get(gw.url + "/acme/demo/1/stats", timeout=10)
    if r.status_code in (404, 422):
        return {}
    r.raise_for_status()
    stats = r.json()
    return {e["ServableMetrics"]["fqrv"]["releaseVersion"]: int(e["ServableMetrics"]["scoreCount"]) for e in stats}


def test_changes_through_one_replica_reach_the_other_and_stats_sum_both(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server, "a", "b")
    answered: Counter[str] = Counter()
    by_replica: Counter[str] = Counter()

    def scored_on(gw: GatewayProcess, release: str) -> bool:
        status, got = score(gw)
        if status == 200:
            answered[got or ""] += 1
            by_replica[gw.url] += 1
        return got == release

    assert deploy(a, python_servable(contract_settings=KEEP_THREE)).status_code == 200
    wait_until(lambda: scored_on(b, "v1"), 2.0, "a servable deployed through A scores on B")
    assert requests.get(b.url + "/health/ready", timeout=5).status_code == 200

    # v2 arrives never valid; a policy PUT on B makes it the only valid one, and A routes to it.
    assert deploy(a, python_servable(release="v2", validity=[{"NeverValid": {}}])).status_code == 200
    wait_until(lambda: releases(b) == ["v1", "v2"], 2.0, "B learns v2")
    for release, policy in (("v2", ALWAYS), ("v1", NEVER)):
        r = requests.put(f"{b.url}/acme/demo/1/{release}/policy-settings", json=policy, timeout=10)
        assert r.status_code == 200, r.text
    wait_until(lambda: all(scored_on(a, "v2") for _ in range(5)), 2.0, "A routes to v2 after B's policy change")
    for _ in range(3):
        assert scored_on(b, "v2")
    assert requests.get(a.url + "/acme/demo/1/v1/settings", timeout=5).json()["ServableSettings"]["policySettings"] == NEVER

    # Each replica counts its own requests; /stats on either shows the sum over both.
    expected = dict(answered)
    assert set(by_replica) == {a.url, b.url}  # both replicas answered some: each alone has a part
    wait_until(lambda: score_counts(a) == expected and score_counts(b) == expected, 3.0, f"stats sum to {expected}")
    assert shared_stats(a) == shared_stats(b)


@pytest.mark.slow
def test_a_sigkilled_replica_restarts_from_redis(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server, "a", "b")
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    assert deploy(a, python_servable(contract_settings=keep_two)).status_code == 200
    assert deploy(a, python_servable(release="v2")).status_code == 200
    logging = {"logLevel": "FULL", "keyFeatures": ["reqid"], "keyFeaturesSeparator": "|"}
    assert requests.put(a.url + "/acme/demo/1/v2/logging", json=logging, timeout=10).status_code == 200
    for _ in range(4):
        assert score(a)[0] == 200
    wait_until(lambda: sum(score_counts(b).values()) == 4, 3.0, "A's counters flushed")
    a.kill()

    # A new process with an empty data dir: everything it serves comes from Redis.
    a2 = gateway_process(tmp_path / "a2", env={k: v for k, v in a.env.items() if k.startswith("FORESTFLOW_")}).start()
    assert requests.get(a2.url + "/health/ready", timeout=5).status_code == 200
    assert releases(a2) == ["v1", "v2"]
    assert requests.get(a2.url + "/acme/demo/1/c-settings", timeout=5).json() == {"ContractSettings": keep_two}
    settings = requests.get(a2.url + "/acme/demo/1/v2/settings", timeout=5).json()
    assert settings["ServableSettings"]["loggingSettings"] == logging
    assert sum(score_counts(a2).values()) == 4
    assert score(a2)[0] == 200 and score(b)[0] == 200


@pytest.mark.slow  # two gateway processes and Redis, converging by the 1 s version check
def test_a_lost_pubsub_message_is_caught_by_the_version_check(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server, "a", "b", sync_interval_s=1.0)
    raw = redis_server.client()
    stop = threading.Event()
    kills = 0

    def cut_subscribers() -> None:
        nonlocal kills
        while not stop.is_set():
            kills += raw.client_kill_filter(_type="pubsub")
            time.sleep(0.002)

    cutter = threading.Thread(target=cut_subscribers)
    cutter.start()
    try:
        # B's subscription is cut every few ms from before the publish until B has converged, so
        # the change reaches it through the (epoch, version) check, not through a message.
        time.sleep(0.1)
        assert deploy(a, python_servable()).status_code == 200
        wait_until(lambda: score(b) == (200, "v1"), 10.0, "B converges by the version check")
    finally:
        stop.set()
        cutter.join()
    assert kills > 0


@pytest.mark.slow
def test_redis_outage_under_traffic(tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server, "a", "b")
    assert deploy(a, python_servable(contract_settings=KEEP_THREE)).status_code == 200
    wait_until(lambda: score(b)[0] == 200, 2.0, "B serves v1")
    statuses: dict[str, Counter[int]] = {"a": Counter(), "b": Counter()}
    stop = threading.Event()

    def traffic(name: str, gw: GatewayProcess) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    r = session.post(gw.url + "/acme/demo/1/score", json=score_body([2.0]), timeout=5)
                    statuses[name][r.status_code] += 1
                except requests.RequestException:
                    statuses[name][0] += 1
                time.sleep(0.01)

    threads = [threading.Thread(target=traffic, args=(n, g)) for n, g in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    try:
        redis_server.stop()
        r = deploy(b, python_servable(release="v2"))
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["code"] and "Redis" in body["error"] and "unavailable" in body["error"]
        r = requests.put(a.url + "/acme/demo/1/v1/policy-settings", json=NEVER, timeout=10)
        assert r.status_code == 503 and "Redis" in r.json()["error"]
        assert requests.get(a.url + "/health/ready", timeout=5).status_code == 200  # the snapshot serves
        # The outage lasts until both replicas have noticed it and served on through it, not a fixed time.
        for gw in (a, b):
            wait_until(
                lambda gw=gw: requests.get(gw.url + "/health/ready", timeout=5).json()["storeAvailable"] is False,
                20.0,
                "the replica notices Redis is gone",
            )
        served_during = {name: counts[200] for name, counts in statuses.items()}
        wait_until(
            lambda: all(statuses[n][200] >= served_during[n] + 100 for n in statuses), 20.0, "traffic served without Redis"
        )
        redis_server.start()  # same port, and empty: the replicas write their snapshot back
        wait_until(lambda: deploy(b, python_servable(release="v2")).status_code == 200, 5.0, "deploy after Redis returns")
        wait_until(lambda: releases(a) == ["v1", "v2"], 2.0, "A learns the deploy made through B")
        wait_until(lambda: requests.get(a.url + "/health/ready", timeout=5).status_code == 200, 5.0, "A ready")
        assert score(a)[0] == 200 and score(b)[0] == 200
    finally:
        stop.set()
        for t in threads:
            t.join()
    for name, counts in statuses.items():
        assert set(counts) == {200} and counts[200] > 100, (name, counts)


def shared_stats(replica: Any) -> list[dict[str, Any]]:
    """``/stats`` without what each replica observes alone (its sliding windows: errorRate, p99LatencyMs, agreement)."""
    items = requests.get(replica.url + "/acme/demo/1/stats", timeout=5).json()
    for item in items:
        metrics = item["ServableMetrics"]["performanceMetrics"]
        for key in ("errorRate", "p99LatencyMs", "agreement"):
            metrics.pop(key, None)
    return items


def failure_counts(gw: GatewayProcess) -> dict[str, tuple[int, int, int, int]]:
    """``release -> (scoreCount, shadeCount, errorCount, shadeErrorCount)`` from ``/stats``."""
    stats = requests.get(gw.url + "/acme/demo/1/stats", timeout=10).json()
    names = ("scoreCount", "shadeCount", "errorCount", "shadeErrorCount")
    return {e["ServableMetrics"]["fqrv"]["releaseVersion"]: tuple(int(e["ServableMetrics"][n]) for n in names) for e in stats}


@pytest.mark.slow  # two gateway processes and Redis
def test_failure_counters_are_summed_over_replicas(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server, "a", "b")
    assert deploy(a, python_servable(contract_settings=KEEP_THREE)).status_code == 200
    failing = python_servable(
        release="v2",
        directory=GATES,
        module="raises.py",
        log_level="FULL",
        validity=[{"MinServedEventsBasedValidity": {"validAfterMinServedEvents": 2}}],
    )
    assert deploy(a, failing).status_code == 200
    wait_until(
        lambda: releases(b) == ["v1", "v2"] and requests.get(b.url + "/health/ready", timeout=5).status_code == 200,
        3.0,
        "B has v1 and v2 loaded",
    )
    sent = 0
    for gw in (a, b, a, b, a, b):
        status, got = score(gw)
        assert status == 200 and got == "v1"
        sent += 1
    expected = {"v1": (sent, 0, 0, 0), "v2": (0, sent, 0, sent)}
    wait_until(lambda: failure_counts(a) == expected and failure_counts(b) == expected, 3.0, f"stats sum to {expected}")
