"""Issue 46: lazy loading and the memory budget, on real gateway processes (file store and Redis).

A restart with many releases is ready before any model is loaded and answers the first request;
concurrent first requests share one load; a budget smaller than the releases in use keeps the
loaded bytes within it while every request is answered; shadow copies never load a cold release;
a release bigger than the whole budget is refused; replicas each apply their own budget.
"""

from __future__ import annotations

import asyncio
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.payloads import FIXTURE, score_body
from forestflow.codecs.ff_settings import parse_serve_request, serve_request_to_json
from forestflow.registry.file_store import FileStore
from tests.registry.redis_server import RedisServer
from tests.support import GatewayProcess, python_servable, wait_for
from tests.support import score_body as echo_body

BODY = score_body(1)
HEADERS = {"Content-Type": "application/json"}


def gbm_dir(directory: Path, pad_bytes: int = 0) -> Path:
    """A directory holding the prostate GBM as ``gbm.zip`` (padded with an incompressible entry
    the MOJO reader ignores, to make the model file ``pad_bytes`` larger)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "gbm.zip"
    with zipfile.ZipFile(FIXTURE.with_suffix(".zip")) as src, zipfile.ZipFile(target, "w") as out:
        for item in src.infolist():
            out.writestr(item, src.read(item.filename))
        if pad_bytes:
            out.writestr(zipfile.ZipInfo("padding.bin"), os.urandom(pad_bytes), compress_type=zipfile.ZIP_STORED)
    return directory


def release(directory: Path, n: int, version: str = "gbm", log_level: str = "NONE") -> dict[str, Any]:
    """The serve request of contract acme/scale/<n> with the GBM of ``directory``."""
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": "acme", "project": "scale", "contract_number": n}, "release_version": version},
        "flavor": {"H2OMojo": {"mojoPath": "gbm.zip"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": log_level, "keyFeatures": ["reqid"] if log_level != "NONE" else []},
        },
    }


def seed_file_store(data: Path, bodies: list[dict[str, Any]]) -> None:
    """Write releases to a gateway's file store in one change, as a gateway that deployed them would."""
    docs: dict[str, Any] = {}
    for body in bodies:
        defn = parse_serve_request(body)
        docs[f"servable/{defn.fqrv}"] = serve_request_to_json(defn)
    store = FileStore(data / "state" / "registry.json")
    asyncio.run(store.apply(docs))


def metric(url: str, name: str) -> float:
    """One unlabelled metric of /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def score(url: str, n: int) -> requests.Response:
    return requests.post(f"{url}/acme/scale/{n}/score", data=BODY, headers=HEADERS, timeout=60)


def v2_ready(url: str, model: str, version: str) -> bool:
    r = requests.get(f"{url}/v2/models/{model}/versions/{version}/ready", timeout=10)
    assert r.status_code in (200, 503), r.text
    ready = r.json()["ready"]
    assert ready is (r.status_code == 200)
    return bool(ready)


def load_states(url: str, n: int) -> dict[str, str]:
    stats = requests.get(f"{url}/acme/scale/{n}/stats", timeout=10).json()
    return {s["ServableMetrics"]["fqrv"]["releaseVersion"]: s["ServableMetrics"]["load"]["state"] for s in stats}


@pytest.mark.slow
def test_restart_with_300_releases_is_ready_before_loading_and_first_requests_share_one_load(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    model = gbm_dir(tmp_path / "model")
    data = tmp_path / "data"
    seed_file_store(data, [release(model, n) for n in range(300)])
    gw = gateway_process(data, env={"FORESTFLOW_LAZY_LOADING": "1", "FORESTFLOW_WARM_CONCURRENCY": "0"}).start()
    ready = requests.get(gw.url + "/health/ready", timeout=10).json()
    assert ready["ready"] is True and ready["servables"] == 0 and ready["cold"] == 300, ready
    assert load_states(gw.url, 7) == {"gbm": "cold"}

    # Eight first requests at once: one load, eight answers.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: score(gw.url, 7), range(8)))
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert len({a.text for a in answers}) == 1
    assert metric(gw.url, "forestflow_release_loads_total") == 1
    assert load_states(gw.url, 7) == {"gbm": "loaded"} and load_states(gw.url, 8) == {"gbm": "cold"}
    # Each request that found it cold waited for that load (one that came after it did not).
    assert 1 <= metric(gw.url, "forestflow_cold_start_wait_seconds_count") <= 8
    meta = requests.get(gw.url + "/acme/scale/8/metadata", timeout=10).json()
    assert meta[0]["BasicMetaData"]["load"]["state"] == "cold" and meta[0]["BasicMetaData"]["inputs"] == []
    assert gw.stop() == 0


@pytest.mark.slow
def test_a_budget_smaller_than_the_releases_used_holds_while_every_request_is_answered(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    model = gbm_dir(tmp_path / "model", pad_bytes=300_000)  # ~350 kB: three fill a 1 MiB budget
    size = (model / "gbm.zip").stat().st_size
    data = tmp_path / "data"
    seed_file_store(data, [release(model, n) for n in range(8)])
    gw = gateway_process(data, env={"FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "1"}).start()
    budget = 1024 * 1024
    for rounds in range(2):
        for n in range(8):
            r = score(gw.url, n)
            assert r.status_code == 200, (rounds, n, r.text)
            # make-before-break: at most one release over the budget while the evictions run
            assert metric(gw.url, "forestflow_release_resident_bytes") <= budget + size
    asyncio.run(wait_for(lambda: metric(gw.url, "forestflow_release_resident_bytes") <= budget, 30, "evictions"))
    assert metric(gw.url, "forestflow_release_evictions_total") >= 8 * 2 - budget // size
    assert metric(gw.url, "forestflow_release_loads_total") >= 16 - budget // size
    assert "release_evicted" in gw.log()

    def states() -> list[str]:
        return [load_states(gw.url, n)["gbm"] for n in range(8)]

    # A warm-up load may still be under way (seen on a loaded machine): the states once it and its
    # evictions settled.
    def settled_in_budget() -> bool:
        return "loading" not in states() and metric(gw.url, "forestflow_release_resident_bytes") <= budget

    asyncio.run(wait_for(settled_in_budget, 30, "loads in flight"))
    settled = states()
    assert settled.count("loaded") <= budget // size and set(settled) <= {"loaded", "cold"}, settled
    assert gw.stop() == 0


@pytest.mark.slow
def test_shadow_copies_do_not_load_cold_releases_and_a_release_over_the_budget_is_refused(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    model = gbm_dir(tmp_path / "model")
    big = gbm_dir(tmp_path / "big", pad_bytes=1_200_000)
    data = tmp_path / "data"
    # Contract 1: v1 answers (the newest routed: v2 never becomes valid), v2 logs FULL so gets shadow copies.
    shadow = release(model, 1, "v2", log_level="FULL")
    shadow["servableSettings"]["policySettings"]["validityPolicy"] = [
        {"MinServedEventsBasedValidity": {"validAfterMinServedEvents": str(10**9)}}
    ]
    seed_file_store(data, [release(model, 1, "v1"), shadow, release(big, 2)])
    gw = gateway_process(data, env={"FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "1", "FORESTFLOW_WARM_CONCURRENCY": "0"}).start()
    for _ in range(3):
        assert score(gw.url, 1).status_code == 200
    assert load_states(gw.url, 1) == {"v1": "loaded", "v2": "cold"}
    assert metric(gw.url, "forestflow_shadow_cold_skipped_total") == 3

    refused = score(gw.url, 2)
    assert refused.status_code == 503, refused.text
    assert "more than the whole model_memory_budget_mb" in refused.text, refused.text
    assert load_states(gw.url, 2) == {"gbm": "failed"}
    # V2 readiness: a cold release that loads on demand can answer; one whose load failed cannot.
    assert v2_ready(gw.url, "acme.scale.1", "v2") is True and load_states(gw.url, 1)["v2"] == "cold"
    assert v2_ready(gw.url, "acme.scale.2", "gbm") is False
    deploy = requests.post(gw.url + "/servable", json=release(big, 3), timeout=30)
    assert deploy.status_code == 422 and "model_memory_budget_mb" in deploy.text, deploy.text
    assert gw.stop() == 0


@pytest.mark.slow
def test_redis_replicas_each_apply_their_own_budget_and_summed_counters_stay_right(
    tmp_path: Path, gateway_process: type[GatewayProcess], redis_server: RedisServer
) -> None:
    model = gbm_dir(tmp_path / "model", pad_bytes=300_000)
    size = (model / "gbm.zip").stat().st_size
    env = {
        "FORESTFLOW_REDIS_URL": redis_server.url,
        "FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "1",
        "FORESTFLOW_REDIS_SYNC_INTERVAL_S": "0.2",
    }
    a = gateway_process(tmp_path / "a", env=env).start()
    b = gateway_process(tmp_path / "b", env=env).start()
    for n in range(6):
        deployed = requests.post(a.url + "/servable", json=release(model, n), timeout=30)
        assert deployed.status_code == 200, deployed.text
    asyncio.run(wait_for(lambda: requests.get(b.url + "/acme/scale/5/stats", timeout=5).status_code == 200, 30, "b learns"))
    for n in range(6):
        for gw in (a, b):
            assert score(gw.url, n).status_code == 200
    for gw in (a, b):
        asyncio.run(wait_for(lambda gw=gw: metric(gw.url, "forestflow_release_resident_bytes") <= 1024 * 1024, 30, "evictions"))
        assert metric(gw.url, "forestflow_release_evictions_total") >= 6 - (1024 * 1024) // size - 1

    def summed() -> bool:  # each replica's counters flushed: both see 2 answers per release
        return all(
            int(requests.get(f"{gw.url}/acme/scale/{n}/stats", timeout=5).json()[0]["ServableMetrics"]["scoreCount"]) == 2
            for gw in (a, b)
            for n in range(6)
        )

    asyncio.run(wait_for(summed, 30, "summed counters"))
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.slow
def test_workers_each_apply_their_own_budget_and_summed_counters_stay_right(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    model = gbm_dir(tmp_path / "model", pad_bytes=300_000)
    data = tmp_path / "data"
    seed_file_store(data, [release(model, n) for n in range(6)])
    gw = gateway_process(data, env={"FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "1"}, args=["--workers", "2"]).start(timeout_s=120)
    for _ in range(3):
        for n in range(6):
            r = score(gw.url, n)
            assert r.status_code == 200, r.text
    # /metrics sums the workers: each keeps within its own budget once its evictions are done.
    asyncio.run(wait_for(lambda: metric(gw.url, "forestflow_release_resident_bytes") <= 2 * 1024 * 1024, 30, "evictions"))

    def summed() -> bool:  # every worker's counters flushed: 3 answers per release in total
        return all(
            int(requests.get(f"{gw.url}/acme/scale/{n}/stats", timeout=5).json()[0]["ServableMetrics"]["scoreCount"]) == 3
            for n in range(6)
        )

    asyncio.run(wait_for(summed, 30, "summed counters"))
    assert gw.stop() == 0


BALLAST_MODEL = """
import numpy as np

BALLAST = np.ones(8 * 2**20 // 8)  # 8 MiB written (resident) when the module is loaded


def predict(frame):
    return frame
"""


def test_the_budget_counts_a_release_by_the_memory_its_load_took(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    """Not by its model file: a model of a few hundred bytes that holds 8 MiB counts 8 MiB."""
    model = tmp_path / "ballast"
    model.mkdir()
    (model / "model.py").write_text(BALLAST_MODEL)
    data = tmp_path / "data"
    seed_file_store(data, [python_servable(("acme", "ballast", n), directory=model) for n in range(2)])
    env = {"FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "64", "FORESTFLOW_WARM_CONCURRENCY": "0"}
    gw = gateway_process(data, env=env).start()
    for n in range(2):
        r = requests.post(f"{gw.url}/acme/ballast/{n}/score", json=echo_body([1.0]), timeout=60)
        assert r.status_code == 200, r.text
    resident = metric(gw.url, "forestflow_release_resident_bytes")
    assert 2 * 7 * 2**20 < resident < 2 * 16 * 2**20, resident  # the file alone: 2 * ~150 bytes
    assert gw.stop() == 0
