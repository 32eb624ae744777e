"""Rollouts under traffic on the distributed shapes: every request answered right.

Clients keep scoring one contract through real HTTP (BASIC ``/score`` and V2 REST, keep-alive
connections) while releases are deployed one after another (ImmediatelyValid, a short linear
phase-in, ``KeepLatest {servablesToKeep: 2}``, so each deploy expires the oldest release while it
answers), on ``serve --workers 2`` and on two replicas sharing Redis. Followers load a new release
before they route to it, and an expiring release leaves routing before it is unloaded, so no
request fails: no 422 NoActiveServablesForContract, no 503 "was unloaded".
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.registry.redis_server import RedisServer
from tests.registry.test_replicas import SYNC_INTERVAL_S, deploy, wait_until
from tests.support import ECHO_DIR, GatewayProcess, python_servable, score_body

SCORE = "/acme/demo/1/score"
INFER = "/v2/models/acme.demo.1/infer"
KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
KEEP_ONE = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 1}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
PHASE_IN = {"LinearTimeBasedPhaseIn": {"phaseInOverSecs": 1}}
#: Each prediction takes a few milliseconds and each servable scores one at a time, so requests
#: are running and queued on a release when it expires.
SLEEP_S = 0.005
ENV = {"FORESTFLOW_SCORING_SLOTS": "1", "FORESTFLOW_ACCESS_LOG": "0"}


def replicas(gateway_process: type[GatewayProcess], tmp_path: Path, redis: RedisServer) -> list[GatewayProcess]:
    """Replicas A and B sharing ``redis``."""
    env = {**ENV, "FORESTFLOW_REDIS_URL": redis.url, "FORESTFLOW_REDIS_SYNC_INTERVAL_S": str(SYNC_INTERVAL_S)}
    return [gateway_process(tmp_path / name, env=env).start() for name in ("a", "b")]


def release_body(release: str, **kw: Any) -> dict[str, Any]:
    return python_servable(release=release, phase_in=PHASE_IN, contract_settings=KEEP_TWO, **kw)


class Clients:
    """Client threads scoring through keep-alive sessions; counts every answer and keeps failures."""

    def __init__(self, sessions: list[tuple[str, requests.Session, bool]]) -> None:
        self.sessions = sessions  # (base url, session, speaks V2)
        self.statuses: Counter[int] = Counter()
        self.failures: list[tuple[int, str]] = []
        self.seen: list[set[str]] = [set() for _ in sessions]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(sessions))]

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        for _, session, _ in self.sessions:
            session.close()

    def _run(self, index: int) -> None:
        url, session, v2 = self.sessions[index]
        while not self.stop.is_set():
            try:
                status, release, text = one_request(session, url, v2)
            except requests.RequestException as exc:
                status, release, text = 0, None, repr(exc)
            with self.lock:
                self.statuses[status] += 1
                if status != 200:
                    self.failures.append((status, text[:300]))
                elif release:
                    self.seen[index].add(release)

    def everyone_saw(self, release: str) -> bool:
        with self.lock:
            return all(release in seen for seen in self.seen)


def one_request(session: requests.Session, url: str, v2: bool) -> tuple[int, str | None, str]:
    """Status, answering release and body of one scoring call (BASIC or V2 REST)."""
    if v2:
        payload = {
            "inputs": [
                {"name": "x", "shape": [1], "datatype": "FP64", "data": [1.5]},
                {"name": "label", "shape": [1], "datatype": "BYTES", "data": ["a"]},
            ],
            "parameters": {"sleep": SLEEP_S},
        }
        r = session.post(url + INFER, json=payload, timeout=30)
        release = r.json().get("model_version") if r.status_code == 200 else None
        if r.status_code == 200:
            assert r.json()["outputs"][0]["data"] == [3.0]
    else:
        r = session.post(url + SCORE, json=score_body([1.5], configs={"sleep": str(SLEEP_S)}), timeout=30)
        release = r.json()["Prediction"]["fqrv"]["releaseVersion"] if r.status_code == 200 else None
    return r.status_code, release, r.text


def roll_out(leader: GatewayProcess, clients: Clients, releases: list[str]) -> None:
    """Deploy each release through ``leader``; wait until every client session has been answered by it."""
    for release in releases:
        r = deploy(leader, release_body(release))
        assert r.status_code == 200, r.text
        wait_until(lambda release=release: clients.everyone_saw(release), 15.0, f"every client answered by {release}")


def assert_no_failures(clients: Clients, minimum: int) -> None:
    assert clients.failures == [], (clients.statuses, clients.failures[:5])
    assert set(clients.statuses) == {200} and clients.statuses[200] >= minimum, clients.statuses


@pytest.mark.slow
def test_rollout_on_two_workers_answers_every_request(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    gw = gateway_process(tmp_path / "data", env=ENV, args=["--workers", "2"]).start(timeout_s=60)
    assert deploy(gw, release_body("v1")).status_code == 200
    # Keep-alive sessions, two on each worker (the kernel gives each new connection to one).
    by_worker: dict[str, list[requests.Session]] = {}
    deadline = time.monotonic() + 20
    while sum(min(2, len(s)) for s in by_worker.values()) < 4:
        assert time.monotonic() < deadline, f"connections reached only {sorted(by_worker)}"
        session = requests.Session()
        r = session.post(gw.url + SCORE, json=score_body([1.0]), timeout=10)
        if r.status_code != 200:  # the other worker has not loaded v1 yet
            session.close()
            continue
        worker = r.headers["X-Forestflow-Worker"]
        if len(by_worker.setdefault(worker, [])) < 2:
            by_worker[worker].append(session)
        else:
            session.close()
    assert len(by_worker) == 2
    sessions = [(gw.url, s, i == 1) for pair in by_worker.values() for i, s in enumerate(pair)]
    with Clients(sessions) as clients:
        wait_until(lambda: clients.everyone_saw("v1"), 10.0, "every client answered")
        roll_out(gw, clients, ["v2", "v3", "v4", "v5"])
    assert_no_failures(clients, 100)


@pytest.mark.slow
def test_rollout_on_two_redis_replicas_answers_every_request(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server)
    assert deploy(a, release_body("v1")).status_code == 200
    wait_until(lambda: requests.post(b.url + SCORE, json=score_body([1.0]), timeout=5).status_code == 200, 5.0, "B serves v1")
    sessions = [
        (b.url, requests.Session(), False),
        (b.url, requests.Session(), True),
        (b.url, requests.Session(), False),
        (a.url, requests.Session(), False),
    ]
    with Clients(sessions) as clients:
        wait_until(lambda: clients.everyone_saw("v1"), 10.0, "every client answered")
        roll_out(a, clients, ["v2", "v3", "v4"])
        # Expiry by a contract settings change (v3 goes), then a DELETE of the remaining older one.
        r = requests.put(a.url + "/acme/demo/1", json=KEEP_ONE, timeout=10)
        assert r.status_code == 200, r.text
        wait_until(lambda: _releases(b) == ["v4"], 10.0, "B keeps v4 alone")
        r = requests.put(a.url + "/acme/demo/1", json=KEEP_TWO, timeout=10)
        assert r.status_code == 200, r.text
        roll_out(a, clients, ["v5"])
        r = requests.delete(a.url + "/acme/demo/1/v4", timeout=10)
        assert r.status_code == 200, r.text
        wait_until(lambda: _releases(b) == ["v5"], 10.0, "B drops v4")
        served = sum(clients.statuses.values())
        wait_until(lambda: sum(clients.statuses.values()) > served + 20, 10.0, "traffic after the delete")
    assert_no_failures(clients, 100)
    assert _releases(a) == _releases(b) == ["v5"]


def _releases(gw: GatewayProcess) -> list[str]:
    r = requests.get(gw.url + "/acme/demo/1/releases", timeout=10)
    return sorted(e["FQRV"]["releaseVersion"] for e in r.json()) if r.status_code == 200 else []


@pytest.mark.slow
def test_slow_loading_release_on_a_follower_answers_every_request(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    """A release whose load takes 2 s replaces the only one (KeepLatest 1): the follower keeps
    answering with the old release until the new one is loaded there, then switches."""
    a, b = replicas(gateway_process, tmp_path, redis_server)
    assert deploy(a, python_servable(contract_settings=KEEP_ONE)).status_code == 200
    wait_until(lambda: _releases(b) == ["v1"], 5.0, "B learns v1")
    slow = python_servable(release="v2", module="slow_load.py", directory=ECHO_DIR)
    slow["flavor"]["Python"]["entryPoint"] = "SlowLoad"
    with Clients([(b.url, requests.Session(), False), (b.url, requests.Session(), True)]) as clients:
        wait_until(lambda: clients.everyone_saw("v1"), 10.0, "every client answered by v1")
        started = time.monotonic()
        assert deploy(a, slow).status_code == 200  # A loads it (2 s), then expires v1
        assert _releases(a) == ["v2"]
        # B learnt both changes at once: it loads v2 and keeps v1 routable meanwhile.
        ready = requests.get(b.url + "/health/ready", timeout=5).json()
        assert "acme.demo.1.v2" in ready["loading"] or clients.everyone_saw("v2"), ready
        wait_until(lambda: clients.everyone_saw("v2"), 15.0, "B's clients answered by v2")
        assert time.monotonic() - started >= 2.0
        wait_until(lambda: _releases(b) == ["v2"], 5.0, "B drops v1 once v2 is loaded")
    assert_no_failures(clients, 50)


@pytest.mark.slow  # two gateway processes and Redis, a release that takes 2 s to load
def test_a_contract_whose_only_release_is_loading_answers_503_not_422(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = replicas(gateway_process, tmp_path, redis_server)
    slow = python_servable(release="v1", module="slow_load.py")
    slow["flavor"]["Python"]["entryPoint"] = "SlowLoad"
    assert deploy(a, slow).status_code == 200
    wait_until(
        lambda: "acme.demo.1.v1" in requests.get(b.url + "/health/ready", timeout=5).json()["loading"], 3.0, "B loading v1"
    )
    r = requests.post(b.url + SCORE, json=score_body([1.0]), timeout=10)
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "1"
    assert r.json()["code"] == "ContractNotReady" and "acme.demo.1" in r.json()["error"]
    r = requests.post(
        b.url + INFER, json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1.0]}]}, timeout=10
    )
    assert r.status_code == 503 and "ready" in r.json()["error"], r.text
    wait_until(lambda: requests.post(b.url + SCORE, json=score_body([1.0]), timeout=5).status_code == 200, 10.0, "B serves v1")
    # All releases invalid by policy: still the 422 of ForestFlow.
    r = requests.put(
        a.url + "/acme/demo/1/v1/policy-settings",
        json={"validityPolicy": [{"NeverValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    r = requests.post(a.url + SCORE, json=score_body([1.0]), timeout=10)
    assert r.status_code == 422 and r.json()["code"] == "NoActiveServablesForContract", r.text
