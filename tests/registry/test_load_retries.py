"""A release whose load fails on one process is retried there until it loads (issue 51).

Real processes: ``forestflow serve --workers 2`` and two replicas sharing a real redis-server, with
a Python release whose first load in each process fails (``tests/fixtures/servables/flaky``). The
process that takes the deploy has loaded it before (its marker is written first), so the deploy
answers 200 and the *other* process is the one whose first load fails: it must answer every request
within seconds, without a restart. A release that always fails on one replica is shown as failed
there while that replica answers with the release it holds. In process: the backoff, a retry that
succeeds once the artifact appears, the 503 of a contract with nothing loaded, the model repository
at start, and the refusal of a source that holds the data directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import requests

from forestflow.codecs.ff_settings import parse_serve_request
from forestflow.core.ids import FQRV
from forestflow.registry.registry import Registry
from forestflow.registry.release_loads import Backoff, ReleaseLoads
from tests.registry.redis_server import RedisServer
from tests.registry.test_reconcile import registry, servable_doc, until
from tests.registry.test_replicas import deploy, wait_until
from tests.support import ECHO_DIR, FIXTURES, GatewayProcess, python_servable, score_body, serve_in_process
from tests.test_workers import fresh, seen_workers, start_workers, worker_pids

FLAKY_DIR = FIXTURES / "servables" / "flaky"
SCORE = "/acme/demo/1/score"
V1, V2 = FQRV.parse("acme.demo.1.v1"), FQRV.parse("acme.demo.1.v2")
KEEP_ONE = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 1}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
RETRY_ENV = {"FORESTFLOW_LOAD_RETRY_FIRST_S": "0.2", "FORESTFLOW_LOAD_RETRY_MAX_S": "1", "FORESTFLOW_ACCESS_LOG": "0"}


def flaky(release: str = "v1", **kw: Any) -> dict[str, Any]:
    return python_servable(release=release, directory=FLAKY_DIR, **kw)


def load_failures(gw_url: str, fqrv: str) -> float:
    """``forestflow_release_load_failures_total{fqrv}`` of a gateway (summed over its workers)."""
    text = requests.get(gw_url + "/metrics", timeout=10).text
    prefix = f'forestflow_release_load_failures_total{{fqrv="{fqrv}"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def answered(url: str) -> tuple[int, str | None]:
    r = fresh("POST", url + SCORE, json=score_body([1.0]))
    return r.status_code, r.json()["Prediction"]["fqrv"]["releaseVersion"] if r.status_code == 200 else None


# ---- workers ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_worker_whose_first_load_fails_retries_and_answers_within_seconds(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    gw = start_workers(tmp_path, env={**RETRY_ENV, "FF_TEST_MARKER_DIR": str(markers)})
    try:
        pids = worker_pids(tmp_path / "data")
        with requests.Session() as session:  # one keep-alive connection: the deploy goes to this worker
            leader = session.get(gw.url + "/health/live", timeout=10).headers["X-Forestflow-Worker"]
            (markers / f"loaded-{pids[leader]}").touch()
            r = session.post(gw.url + "/servable", json=flaky(), timeout=30)
        assert r.status_code == 200 and r.headers["X-Forestflow-Worker"] == leader, r.text
        follower = ({"w0", "w1"} - {leader}).pop()

        def every_worker_answers() -> bool:
            answers = seen_workers(gw, SCORE, json=score_body([2.0]))
            return set(answers) == {"w0", "w1"} and all(a.status_code == 200 for a in answers.values())

        wait_until(every_worker_answers, 5.0, "both workers answer 200 after the deploy")
        assert (markers / f"loaded-{pids[follower]}").exists(), "the follower's first load ran (and failed)"
        wait_until(lambda: load_failures(gw.url, "acme.demo.1.v1") == 1.0, 5.0, "one failed attempt counted")
        wait_until(lambda: fresh("GET", gw.url + "/health/ready").status_code == 200, 5.0, "ready")
        assert worker_pids(tmp_path / "data") == pids, "no worker was restarted"
        assert all(fresh("POST", gw.url + SCORE, json=score_body([1.0])).status_code == 200 for _ in range(20))
    finally:
        assert gw.stop() == 0, gw.log()


@pytest.mark.slow
def test_a_worker_that_stays_broken_is_reported_then_restarted(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**RETRY_ENV, "FF_TEST_MARKER_DIR": str(markers), "FORESTFLOW_WORKER_BROKEN_RESTART_S": "3"}
    gw = start_workers(tmp_path, env=env)
    try:
        pids = worker_pids(tmp_path / "data")
        with requests.Session() as session:
            leader = session.get(gw.url + "/health/live", timeout=10).headers["X-Forestflow-Worker"]
            follower = ({"w0", "w1"} - {leader}).pop()
            (markers / f"loaded-{pids[leader]}").touch()
            (markers / f"broken-{pids[follower]}").touch()
            assert session.post(gw.url + "/servable", json=flaky(), timeout=30).status_code == 200

        seen: list[dict[str, Any]] = []

        def follower_failed() -> bool:
            r = fresh("GET", gw.url + "/health/ready")
            worker = r.json()["workers"][follower]
            if r.status_code == 503 and worker["state"] == "failed":
                seen.append(worker)
            return bool(seen)

        wait_until(follower_failed, 3.0, "readiness names the broken worker")
        assert "cannot load" in seen[0]["failed"]["acme.demo.1.v1"]["error"], seen
        wait_until(lambda: worker_pids(tmp_path / "data").get(follower) not in (None, pids[follower]), 60.0, "restarted")
        # The new process's first load fails (transient) and is retried: then every request is answered.
        wait_until(lambda: fresh("GET", gw.url + "/health/ready").status_code == 200, 60.0, "ready again")
        answers = seen_workers(gw, SCORE, json=score_body([1.0]))
        assert set(answers) == {"w0", "w1"} and all(a.status_code == 200 for a in answers.values())
        assert worker_pids(tmp_path / "data")[leader] == pids[leader]
        assert "worker_restarted_broken" in gw.log()
    finally:
        assert gw.stop() == 0, gw.log()


# ---- Redis replicas -----------------------------------------------------------------------------------
def _replicas(gateway_process: type[GatewayProcess], tmp_path: Path, redis: RedisServer) -> list[GatewayProcess]:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {
        **RETRY_ENV,
        "FF_TEST_MARKER_DIR": str(markers),
        "FORESTFLOW_REDIS_URL": redis.url,
        "FORESTFLOW_REDIS_SYNC_INTERVAL_S": "0.5",
    }
    return [gateway_process(tmp_path / name, env=env).start() for name in ("a", "b")]


def test_a_replica_whose_first_load_fails_retries_and_answers_within_seconds(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = _replicas(gateway_process, tmp_path, redis_server)
    assert a.proc is not None and b.proc is not None
    (tmp_path / "markers" / f"loaded-{a.proc.pid}").touch()
    assert deploy(a, flaky()).status_code == 200
    wait_until(lambda: all(answered(b.url) == (200, "v1") for _ in range(5)), 5.0, "B answers 200 after the deploy")
    assert (tmp_path / "markers" / f"loaded-{b.proc.pid}").exists(), "B's first load ran (and failed)"
    assert load_failures(b.url, "acme.demo.1.v1") == 1.0 and load_failures(a.url, "acme.demo.1.v1") == 0.0
    assert requests.get(b.url + "/health/ready", timeout=5).status_code == 200
    assert b.running and "release_load_failed" in b.log()


@pytest.mark.slow
def test_a_release_that_always_fails_on_one_replica_is_shown_failed_while_it_serves_what_it_holds(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    a, b = _replicas(gateway_process, tmp_path, redis_server)
    assert a.proc is not None and b.proc is not None
    (tmp_path / "markers" / f"loaded-{a.proc.pid}").touch()
    (tmp_path / "markers" / f"broken-{b.proc.pid}").touch()
    assert deploy(a, python_servable(contract_settings=KEEP_ONE)).status_code == 200
    wait_until(lambda: answered(b.url) == (200, "v1"), 5.0, "B serves v1")
    # v2 replaces v1 (KeepLatest 1): A loads v2 and drops v1; B cannot load v2 and keeps v1.
    assert deploy(a, flaky("v2")).status_code == 200
    wait_until(lambda: answered(a.url) == (200, "v2"), 5.0, "A serves v2")

    def failed_on_b() -> dict[str, Any] | None:
        r = requests.get(b.url + "/health/ready", timeout=5)
        status = r.json()["failed"].get("acme.demo.1.v2")
        return status if r.status_code == 503 and status and status["attempts"] >= 2 else None

    wait_until(failed_on_b, 10.0, "B shows v2 failed after two attempts")
    status = failed_on_b()
    assert status is not None and status["state"] == "failed" and "cannot load" in status["error"]
    assert all(answered(b.url) == (200, "v1") for _ in range(10)), "B answers with the release it holds"
    assert load_failures(b.url, "acme.demo.1.v2") >= 2.0

    stats = {e["ServableMetrics"]["fqrv"]["releaseVersion"]: e["ServableMetrics"] for e in _get(b, "/acme/demo/1/stats")}
    assert set(stats) == {"v1", "v2"} and "load" not in stats["v1"]
    assert stats["v2"]["load"]["state"] == "failed" and "cannot load" in stats["v2"]["load"]["error"]
    meta = {m["BasicMetaData"]["fqrv"]["releaseVersion"]: m["BasicMetaData"] for m in _get(b, "/acme/demo/1/metadata")}
    assert meta["v2"]["load"]["state"] == "failed" and meta["v2"]["inputs"] == [] and meta["v1"]["inputs"]
    r = requests.get(b.url + "/acme/demo/1/v2/metadata", timeout=5)
    assert r.status_code == 503 and "failed to load" in r.json()["error"], r.text
    page = _get(b, "/ops/dashboard")["contracts"][0]["releases"]
    assert [(r["release"], r["loaded"], r.get("load", {}).get("state")) for r in page] == [
        ("v1", True, None),
        ("v2", False, "failed"),
    ]
    assert requests.get(a.url + "/health/ready", timeout=5).status_code == 200  # A is fine

    # Deleted through B, where it fails: its loads stop everywhere; the contract is gone on both.
    r = requests.delete(b.url + "/acme/demo/1/v2", timeout=10)
    assert r.status_code == 200, r.text
    wait_until(lambda: requests.get(b.url + "/health/ready", timeout=5).status_code == 200, 5.0, "B ready")
    wait_until(lambda: answered(a.url)[0] == answered(b.url)[0] == 404, 5.0, "the contract is gone on both")


def _get(gw: GatewayProcess, path: str) -> Any:
    r = requests.get(gw.url + path, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


# ---- in process -----------------------------------------------------------------------------------------
def test_backoff_doubles_up_to_its_bound_with_jitter() -> None:
    backoff = Backoff(first_s=0.5, max_s=30.0)
    assert [backoff.delay(n, 0.0) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.delay(1, 0.999) == pytest.approx(0.25, abs=0.001)  # cut by up to half at random
    assert backoff.delay(10_000, 0.5) == 22.5


async def test_release_loads_retry_until_done_and_stop_when_dropped_or_redefined() -> None:
    registry = Registry()
    loads = ReleaseLoads(registry, Backoff(0.01, 0.02))
    calls: list[str] = []

    async def flaky_twice(defn: Any) -> bool:
        calls.append(defn.fqrv.release)
        if len(calls) <= 2:
            raise RuntimeError(f"attempt {len(calls)} fails")
        return True

    v1 = parse_serve_request(python_servable(release="v1"))
    loads.follow(v1, flaky_twice)
    assert V1 in registry.pending  # the first attempt: loading
    await loads.first_attempts([V1])
    assert registry.failed == {V1: "RuntimeError('attempt 1 fails')"} and V1 not in registry.pending
    await until(lambda: V1 not in loads.statuses)
    assert calls == ["v1", "v1", "v1"] and loads.failure_counts == {"acme.demo.1.v1": 2} and registry.failed == {}

    async def never(defn: Any) -> bool:
        calls.append(defn.settings.logging.log_level.name)
        raise RuntimeError("never")

    calls.clear()
    loads = ReleaseLoads(registry, Backoff(60.0, 60.0))  # no retry by the clock in this test
    loads.follow(v1, never)
    await loads.first_attempts([V1])
    loads.follow(parse_serve_request(python_servable(release="v1", log_level="FULL")), never)  # redefined: at once
    await until(lambda: len(calls) == 2)
    assert calls == ["NONE", "FULL"] and loads.statuses[V1].attempts == 1
    loads.drop(V1)
    assert loads.statuses == {} and registry.failed == {}
    await until(lambda: not loads.tasks)


async def test_a_failed_restore_is_retried_until_it_loads_and_a_contract_with_nothing_loaded_answers_503(
    tmp_path: Path,
) -> None:
    artifact = tmp_path / "later"
    async with serve_in_process(tmp_path / "data", load_retry_first_s=0.05, load_retry_max_s=0.2) as gw:
        gateway = gw.gateway
        docs = registry("v1")
        docs["servable/acme.demo.1.v1"] = servable_doc("v1", directory=artifact)
        await gateway.replica_sync.reconcile(docs, wait=True)  # as at start: the first attempt is done
        assert V1 in gateway.failed and "does not exist" in gateway.failed[V1]
        await until(lambda: gateway.loads.statuses[V1].attempts >= 2)
        assert not gateway.ready
        async with gw.session.post(gw.url + SCORE, json=score_body([1.0])) as r:
            body = await r.json()
            assert r.status == 503 and r.headers["Retry-After"] == "1", body
            assert body["code"] == "ContractNotReady" and "acme.demo.1.v1 failed to load" in body["error"]
        async with gw.session.get(gw.url + "/health/ready") as r:
            failed = (await r.json())["failed"]["acme.demo.1.v1"]
            assert r.status == 503 and failed["state"] == "failed" and "does not exist" in failed["error"]
        shutil.copytree(ECHO_DIR, artifact)  # the artifact appears: the next attempt loads it, unchanged
        await until(lambda: gateway.ready and V1 in gateway.loaded)
        assert gateway.failed == {} and gateway.loads.statuses == {}
        assert gateway.loads.failure_counts["acme.demo.1.v1"] >= 2
        async with gw.session.post(gw.url + SCORE, json=score_body([1.0])) as r:
            assert r.status == 200


async def test_a_repository_entry_that_fails_at_start_is_deployed_by_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("FF_TEST_MARKER_DIR", str(markers))  # this process's first load of it fails
    entry = tmp_path / "repo" / "flaky"
    shutil.copytree(FLAKY_DIR, entry)
    (entry / "model.toml").write_text('contract = "acme.demo.1"\nrelease = "v1"\nplatform = "python"\nid = "model.py"\n')
    async with serve_in_process(tmp_path / "data", repository=str(tmp_path / "repo"), load_retry_first_s=0.05) as gw:
        await until(lambda: V1 in gw.gateway.loaded)
        assert gw.gateway.loads.failure_counts == {"acme.demo.1.v1": 1}
        async with gw.session.post(gw.url + SCORE, json=score_body([1.0])) as r:
            assert r.status == 200


async def test_a_source_that_holds_what_the_gateway_writes_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    own = data / "models" / "echo"  # a model directory of its own under the data dir is fine
    shutil.copytree(ECHO_DIR, own)
    async with serve_in_process(data) as gw:
        for source, says in (
            (tmp_path, "contains the gateway's data directory"),
            (data, "contains the gateway's data directory"),
            (data / "state" / "sub", "is inside the gateway's registry state"),
        ):
            async with gw.session.post(gw.url + "/servable", json=python_servable(directory=source)) as r:
                body = await r.json()
                assert r.status == 422 and says in body["error"] and "writes to while it runs" in body["error"], body
        async with gw.session.post(gw.url + "/servable", json=python_servable(directory=own)) as r:
            assert r.status == 200, await r.text()
