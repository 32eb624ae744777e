"""``forestflow serve --workers N``: one port, several processes, one registry, one prediction log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from forestflow.registry.file_store import FileStore
from forestflow.supervisor import WorkerIdentity
from tests.support import ROOT, GatewayProcess, process_alive, python_servable, score_body, serve_in_process, wait_for

SCORE = "/acme/demo/1/score"


def fresh(method: str, url: str, **kwargs: Any) -> requests.Response:
    """One request on a new connection (the kernel hands each new connection to one worker)."""
    return requests.request(method, url, headers={"Connection": "close"}, timeout=30, **kwargs)


def worker_pids(data_dir: Path) -> dict[str, int]:
    out = {}
    for path in sorted((data_dir / "state" / "workers").glob("w*.json")):
        out[path.stem] = json.loads(path.read_text())["pid"]
    return out


def wait_until(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.02)


def start_workers(tmp_path: Path, count: int = 2, env: dict[str, str] | None = None) -> GatewayProcess:
    gw = GatewayProcess(tmp_path / "data", env=env, args=["--workers", str(count)]).start(timeout_s=60)
    wait_until(lambda: fresh("GET", gw.url + "/health/ready").status_code == 200, 60, "every worker ready")
    return gw


def seen_workers(gw: GatewayProcess, path: str = "/health/live", tries: int = 400, **kwargs: Any) -> dict[str, requests.Response]:
    """Requests on fresh connections until every worker answered one (or ``tries`` ran out)."""
    seen: dict[str, requests.Response] = {}
    for _ in range(tries):
        response = fresh("POST" if "json" in kwargs else "GET", gw.url + path, **kwargs)
        seen.setdefault(response.headers["X-Forestflow-Worker"], response)
        if len(seen) == 2:
            break
    return seen


def test_a_deploy_through_one_worker_is_scored_by_the_other_within_a_second(tmp_path: Path) -> None:
    gw = start_workers(tmp_path)
    try:
        assert set(seen_workers(gw)) == {"w0", "w1"}, "both workers accept on the shared port"
        deployed = fresh("POST", gw.url + "/servable", json=python_servable())
        assert deployed.status_code == 200, deployed.text
        deployer = deployed.headers["X-Forestflow-Worker"]
        done = time.monotonic()
        other_ok_at = None
        for _ in range(400):
            response = fresh("POST", gw.url + SCORE, json=score_body([2.0]))
            if response.headers["X-Forestflow-Worker"] != deployer and response.status_code == 200:
                other_ok_at = time.monotonic()
                assert response.json()["Prediction"]["fqrv"]["releaseVersion"] == "v1"
                break
        assert other_ok_at is not None, "the other worker never answered"
        assert other_ok_at - done < 1.0, f"the other worker scored the new release {other_ok_at - done:.2f}s after the deploy"

        # A delete through one worker is followed by the other as well.
        deleted = fresh("DELETE", gw.url + "/acme/demo/1/v1")
        assert deleted.status_code == 200
        deadline = time.monotonic() + 1.0  # within the second a deploy is given
        while True:
            answers = seen_workers(gw, SCORE, json=score_body([1.0]))
            if {r.status_code for r in answers.values()} == {404} or time.monotonic() > deadline:
                break
        assert set(answers) == {"w0", "w1"}
        assert {r.status_code for r in answers.values()} == {404}, {w: r.text for w, r in answers.items()}
    finally:
        assert gw.stop() == 0, gw.log()


@pytest.mark.slow
def test_stats_are_the_sum_of_every_workers_counts_and_the_shared_log_stays_one_event_per_line(tmp_path: Path) -> None:
    gw = start_workers(tmp_path)
    try:
        body = python_servable(log_level="FULL")
        assert fresh("POST", gw.url + "/servable", json=body).status_code == 200
        time.sleep(1.0)  # the other worker loads it
        labels = ["a\nb", 'q"uote', "é" * 300]  # strings that would break a naive line format

        def score(i: int) -> str:
            response = fresh(
                "POST", gw.url + SCORE, json=score_body([float(i)], labels=[labels[i % 3]], configs={"reqid": f"r{i}"})
            )
            assert response.status_code == 200, response.text
            return response.headers["X-Forestflow-Worker"]

        with ThreadPoolExecutor(8) as pool:
            answered_by = list(pool.map(score, range(300)))
        assert set(answered_by) == {"w0", "w1"}, "both workers scored some of the requests"

        seen: list[tuple[str, int]] = []

        def total() -> int:
            response = fresh("GET", gw.url + "/acme/demo/1/stats")
            count = int(response.json()[0]["ServableMetrics"]["scoreCount"])  # int64: a string in JSON
            seen.append((response.headers["X-Forestflow-Worker"], count))
            return count

        def settled() -> bool:  # counters are flushed every second and read by the others within 0.25 s
            total()
            recent = seen[-12:]
            return len(recent) == 12 and {w for w, _ in recent} == {"w0", "w1"} and all(c == 300 for _, c in recent)

        wait_until(settled, 5, "both workers' /stats to sum the 300 requests")

        def scored_in_metrics() -> tuple[str, float]:  # /metrics: this gateway's /score requests, all workers
            response = fresh("GET", gw.url + "/metrics")
            total = sum(
                float(line.rsplit(" ", 1)[1])
                for line in response.text.splitlines()
                if line.startswith("forestflow_requests_total{") and 'protocol="basic"' in line and 'status="200"' in line
            )
            return response.headers["X-Forestflow-Worker"], total

        metrics_seen: list[tuple[str, float]] = []

        def metrics_settled() -> bool:  # each worker writes its snapshot every second
            metrics_seen.append(scored_in_metrics())
            recent = metrics_seen[-8:]
            return len(recent) == 8 and {w for w, _ in recent} == {"w0", "w1"} and all(t == 300 for _, t in recent)

        wait_until(metrics_settled, 5, "both workers' /metrics to total the 300 requests")
    finally:
        assert gw.stop() == 0, gw.log()
    lines = (tmp_path / "data" / "predictions.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""
    events = [json.loads(line) for line in lines[:-1]]
    assert len(events) == 300
    assert sorted(int(e["key"][1:]) for e in events) == list(range(300))


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_serves_again(tmp_path: Path) -> None:
    gw = start_workers(tmp_path)
    try:
        assert fresh("POST", gw.url + "/servable", json=python_servable()).status_code == 200
        before = worker_pids(tmp_path / "data")
        os.kill(before["w1"], signal.SIGKILL)
        wait_until(lambda: worker_pids(tmp_path / "data").get("w1") not in (None, before["w1"]), 30, "w1 restarted")
        wait_until(lambda: fresh("GET", gw.url + "/health/ready").status_code == 200, 30, "ready again")
        answered = seen_workers(gw, SCORE, json=score_body([3.0]))
        assert "w1" in answered, "the restarted worker takes requests"
        assert all(r.status_code == 200 and r.json()["Prediction"]["fqrv"]["releaseVersion"] == "v1" for r in answered.values())
        assert "worker_exited" in gw.log_path.read_text()  # the whole log: gw.log() is its last 4 kB
    finally:
        assert gw.stop() == 0, gw.log()


def test_workers_end_with_a_supervisor_that_was_killed(tmp_path: Path) -> None:
    gw = start_workers(tmp_path)
    try:
        pids = worker_pids(tmp_path / "data")
        assert len(pids) == 2 and all(_alive(p) for p in pids.values())
        assert gw.proc is not None
        os.kill(gw.proc.pid, signal.SIGKILL)  # the supervisor alone, as the OOM killer would
        gw.proc.wait()
        wait_until(lambda: not any(_alive(p) for p in pids.values()), 5, "the workers to end with their supervisor")
        # every line a worker wrote names it
        lines = [json.loads(x) for x in gw.log_path.read_text().splitlines() if x.startswith("{")]
        assert {line.get("worker") for line in lines if line.get("event") == "serving" and "workers" not in line} == {"w0", "w1"}
    finally:
        gw.kill()


@pytest.mark.slow
def test_sigterm_answers_in_flight_requests_then_stops_every_worker(tmp_path: Path) -> None:
    gw = start_workers(tmp_path)
    assert fresh("POST", gw.url + "/servable", json=python_servable()).status_code == 200
    time.sleep(1.0)
    pids = worker_pids(tmp_path / "data")

    def slow(i: int) -> int:
        return fresh("POST", gw.url + SCORE, json=score_body([float(i)], configs={"sleep": "0.8"})).status_code

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(slow, i) for i in range(6)]
        time.sleep(0.4)  # all six are being scored
        assert gw.stop() == 0, gw.log()
        assert [f.result() for f in futures] == [200] * 6
    for pid in pids.values():
        wait_until(lambda pid=pid: not _alive(pid), 10, f"worker {pid} gone")


def test_a_taken_port_is_one_clear_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (["--port", str(port)], ["--port", "0", "--grpc-port", str(port)]):
            done = subprocess.run(
                [sys.executable, "-m", "forestflow.cli", "serve", "--workers", "2", "--data-dir", str(tmp_path / "d"), *args],
                capture_output=True, text=True, timeout=60, cwd=ROOT,
                env={**os.environ, "FORESTFLOW_GRPC_PORT": "-1"} if "--grpc-port" not in args else dict(os.environ),
            )  # fmt: skip
            assert done.returncode != 0
            assert done.stderr.strip().splitlines()[-1].startswith("forestflow: error: cannot serve "), done.stderr
            assert "in use" in done.stderr


async def test_two_workers_split_traffic_as_one_gateway_does(tmp_path: Path) -> None:
    """Each worker runs the router's exact sequence on its own share: the aggregate split is exact."""
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    phase = {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 100}}

    async def split(data_dir: Path, workers: int) -> dict[str, int]:
        now = [1_000_000]
        counts = {"v1": 0, "v2": 0}
        async with serve_in_process(data_dir, worker=WorkerIdentity(0, workers)) as first:
            gateways = [first]
            first.gateway.clock = lambda: now[0]
            async with first.session.post(first.url + "/servable", json=python_servable(contract_settings=keep_two)) as r:
                assert r.status == 200
            async with first.session.post(first.url + "/servable", json=python_servable(release="v2", phase_in=phase)) as r:
                assert r.status == 200
            now[0] += 30_000  # v2 at 30 %, v1 at 100 %: weights 100/30
            await first.gateway.admin.flush_metrics(force=True)  # the validity stamps the others adopt
            others = []
            for index in range(1, workers):  # more workers of the same gateway, following the same file
                others.append(serve_in_process(data_dir, worker=WorkerIdentity(index, workers)))
            try:
                for context in others:
                    gw = await context.__aenter__()
                    store = gw.gateway.store
                    assert isinstance(store, FileStore)
                    gateways.append(gw)
                for gw in gateways:
                    gw.gateway.clock = lambda: now[0]
                    await gw.gateway.admin.evaluate_all()
                for i in range(1040):
                    gw = gateways[i % len(gateways)]
                    async with gw.session.post(gw.url + SCORE, json=score_body([1.0])) as r:
                        assert r.status == 200
                        counts[(await r.json())["Prediction"]["fqrv"]["releaseVersion"]] += 1
            finally:
                for context in reversed(others):
                    await context.__aexit__(None, None, None)
        return counts

    one = await split(tmp_path / "one", 1)
    two = await split(tmp_path / "two", 2)
    assert one == {"v1": 800, "v2": 240}
    assert abs(two["v1"] - one["v1"]) <= 2 and abs(two["v2"] - one["v2"]) <= 2, (one, two)


def _alive(pid: int) -> bool:
    return process_alive(pid)


@pytest.mark.slow  # a supervisor and two worker processes
def test_failure_counters_are_the_sum_of_every_workers_counts(tmp_path: Path) -> None:
    gates = ROOT / "tests" / "fixtures" / "servables" / "gates"
    gw = start_workers(tmp_path)
    try:
        keep = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"FairPhaseInPctBasedRouter": {}}}
        assert fresh("POST", gw.url + "/servable", json=python_servable(contract_settings=keep)).status_code == 200
        failing = python_servable(
            release="v2",
            directory=gates,
            module="raises.py",
            log_level="FULL",
            validity=[{"MinServedEventsBasedValidity": {"validAfterMinServedEvents": 2}}],
        )
        assert fresh("POST", gw.url + "/servable", json=failing).status_code == 200
        wait_until(
            lambda: all(r.json()["servables"] == 2 for r in seen_workers(gw, "/health/ready").values()),
            5,
            "both workers loaded both",
        )

        def score(i: int) -> str:
            response = fresh("POST", gw.url + SCORE, json=score_body([float(i)], configs={"reqid": f"r{i}"}))
            assert response.status_code == 200, response.text
            assert response.json()["Prediction"]["fqrv"]["releaseVersion"] == "v1"
            return response.headers["X-Forestflow-Worker"]

        with ThreadPoolExecutor(4) as pool:
            answered_by = list(pool.map(score, range(60)))
        assert set(answered_by) == {"w0", "w1"}, "both workers scored some of the requests"
        names = ("scoreCount", "shadeCount", "errorCount", "shadeErrorCount")
        expected = {"v1": (60, 0, 0, 0), "v2": (0, 60, 0, 60)}
        seen: list[tuple[str, dict[str, tuple[int, ...]]]] = []

        def settled() -> bool:
            response = fresh("GET", gw.url + "/acme/demo/1/stats")
            counts = {
                e["ServableMetrics"]["fqrv"]["releaseVersion"]: tuple(int(e["ServableMetrics"][n]) for n in names)
                for e in response.json()
            }
            seen.append((response.headers["X-Forestflow-Worker"], counts))
            recent = seen[-8:]
            return len(recent) == 8 and {w for w, _ in recent} == {"w0", "w1"} and all(c == expected for _, c in recent)

        wait_until(settled, 8, f"both workers' /stats to sum to {expected}")
    finally:
        assert gw.stop() == 0


@pytest.mark.slow  # a supervisor and two workers, then a single process
async def test_stats_metrics_and_the_page_agree_after_worker_and_single_process_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fqrv = "acme.demo.1.v1"

    async def score(gw: Any, n: int) -> None:
        for i in range(n):
            async with gw.session.post(gw.url + SCORE, json=score_body([float(i)])) as r:
                assert r.status == 200

    async def views(gw: Any) -> tuple[int, int, int]:
        """scoreCount of v1 as /stats, /metrics and the page's JSON show it."""
        async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
            stats = int((await r.json())[0]["ServableMetrics"]["scoreCount"])
        async with gw.session.get(gw.url + "/metrics") as r:
            line = next(
                x for x in (await r.text()).splitlines() if x.startswith(f'forestflow_servable_scores_total{{fqrv="{fqrv}"}}')
            )
        async with gw.session.get(gw.url + "/ops/dashboard") as r:
            page = (await r.json())["contracts"][0]["releases"][0]["scoreCount"]
        return stats, int(float(line.split()[-1])), page

    async def settle(gw: Any, expected: int) -> None:
        async def agree() -> bool:
            return await views(gw) == (expected,) * 3

        try:
            await wait_for(agree, 10, f"/stats, /metrics and the page at {expected}")
        except AssertionError:
            raise AssertionError(f"{await views(gw)} != {expected}") from None

    async with serve_in_process(data, worker=WorkerIdentity(0, 3)) as w0:  # three workers
        async with w0.session.post(w0.url + "/servable", json=python_servable()) as r:
            assert r.status == 200
        async with (
            serve_in_process(data, worker=WorkerIdentity(1, 3)) as w1,
            serve_in_process(data, worker=WorkerIdentity(2, 3)) as w2,
        ):
            await wait_for(lambda: w1.gateway.loaded and w2.gateway.loaded, 10, "the other workers to load v1")
            await score(w0, 2)
            await score(w1, 3)
            await score(w2, 4)
            await settle(w0, 9)
    async with serve_in_process(data) as one:  # then one process
        await settle(one, 9)
        await score(one, 1)
        await settle(one, 10)
    # then two workers
    async with (
        serve_in_process(data, worker=WorkerIdentity(0, 2)) as w0,
        serve_in_process(data, worker=WorkerIdentity(1, 2)) as w1,
    ):
        await wait_for(lambda: w1.gateway.loaded, 10, "w1 to load v1")
        await score(w1, 5)
        await settle(w0, 15)
        await settle(w1, 15)
    async with serve_in_process(data) as one:
        await settle(one, 15)
