"""ReplicaSync.reconcile: an in-process gateway brought to a set of store documents, as a replica is."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from forestflow.codecs.ff_settings import contract_settings_to_json, parse_serve_request, serve_request_to_json
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings
from tests.support import InProcessGateway, python_servable, serve_in_process

V1, V2 = FQRV.parse("acme.demo.1.v1"), FQRV.parse("acme.demo.1.v2")
KEEP_THREE = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"FairPhaseInPctBasedRouter": {}}}


def servable_doc(release: str, **kwargs: Any) -> dict[str, Any]:
    defn = parse_serve_request(python_servable(release=release, **kwargs))
    return serve_request_to_json(defn)


def registry(*releases: str, **kwargs: Any) -> dict[str, Any]:
    docs: dict[str, Any] = {f"servable/acme.demo.1.{r}": servable_doc(r, **kwargs) for r in releases}
    docs["contract/acme.demo.1"] = KEEP_THREE
    return docs


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def score(gw: InProcessGateway) -> tuple[int, Any]:
    body = {"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": [1.0]}}]}]}
    async with gw.session.post(gw.url + "/acme/demo/1/score", json=body) as r:
        return r.status, await r.json()


async def test_learns_loads_in_background_then_follows_settings_and_deletes(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data") as gw:
        gateway = gw.gateway
        await gateway.replica_sync.reconcile(registry("v1", "v2"))
        assert not gateway.ready  # loading in the background: not ready until both are in
        await until(lambda: gateway.ready and len(gateway.loaded) == 2)
        assert sorted(e.fqrv.release for e in gateway.servable_entries(V1.contract)) == ["v1", "v2"]

        docs = registry("v1", "v2")
        docs["servable/acme.demo.1.v2"] = servable_doc("v2", validity=[{"NeverValid": {}}], log_level="FULL")
        docs["contract/acme.demo.1"] = contract_settings_to_json(ContractSettings())
        await gateway.replica_sync.reconcile(docs)
        assert gateway.entry(V2).settings.logging.log_level.name == "FULL"
        assert gateway.contract_state(V1.contract).settings == ContractSettings()
        for _ in range(5):
            status, body = await score(gw)
            assert status == 200 and body["Prediction"]["fqrv"]["releaseVersion"] == "v1"

        del docs["servable/acme.demo.1.v1"]
        await gateway.replica_sync.reconcile(docs)
        assert set(gateway.loaded) == {V2}
        assert (await score(gw))[0] == 422  # v2 is never valid: nothing active
        await gateway.replica_sync.reconcile({})
        assert gateway.loaded == {} and gateway.contracts == {}


async def test_shared_stamps_and_performance_are_adopted_counters_stay_local(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data") as gw:
        gateway = gw.gateway
        await gateway.replica_sync.reconcile(registry("v1"), wait=True)
        for _ in range(3):
            assert (await score(gw))[0] == 200
        docs = registry("v1")
        docs["metrics/acme.demo.1.v1"] = {
            "createdAtMS": 1,
            "becameValidAtMS": 12345,
            "scoreCount": 99,
            "performanceMetrics": {"auc": 0.75},
        }
        await gateway.replica_sync.reconcile(docs)
        metrics = gateway.entry(V1).metrics
        assert (metrics.became_valid_at_ms, metrics.performance_metrics, metrics.score_count) == (12345, {"auc": 0.75}, 3)


async def test_a_document_that_does_not_parse_leaves_the_servable_serving(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data") as gw:
        gateway = gw.gateway
        await gateway.replica_sync.reconcile(registry("v1"), wait=True)
        docs = registry("v1")
        docs["servable/acme.demo.1.v1"] = {"flavor": "garbage"}
        docs["contract/acme.demo.1"] = {"router": {"NoSuchRouter": {}}}
        await gateway.replica_sync.reconcile(docs)
        assert set(gateway.loaded) == {V1} and (await score(gw))[0] == 200
        assert gateway.contract_state(Contract.parse("acme.demo.1")).settings.expiration.servables_to_keep == 3


async def test_a_servable_that_fails_to_load_is_reported_and_loaded_at_once_when_its_definition_changes(
    tmp_path: Path,
) -> None:
    async with serve_in_process(tmp_path / "data", load_retry_first_s=30) as gw:  # no retry by the clock here
        gateway = gw.gateway
        broken = registry("v1")
        broken["servable/acme.demo.1.v1"] = servable_doc("v1", directory=tmp_path / "missing")
        await gateway.replica_sync.reconcile(broken)
        await until(lambda: V1 in gateway.failed and not gateway.registry.pending)
        assert not gateway.ready
        await gateway.replica_sync.reconcile(broken)  # same definition: its retry waits for its backoff
        assert not gateway.registry.pending and gateway.loads.statuses[V1].attempts == 1
        await gateway.replica_sync.reconcile(registry("v1"))  # a new definition: attempted at once
        await until(lambda: gateway.ready and V1 in gateway.loaded)
        assert gateway.failed == {}


async def test_shutdown_completes_while_redis_is_away(tmp_path: Path) -> None:
    from tests.registry.redis_server import RedisServer

    redis = RedisServer(tmp_path / "redis").start()
    try:
        async with serve_in_process(tmp_path / "data", redis_url=redis.url) as gw:
            async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
                assert r.status == 200
            assert (await score(gw))[0] == 200  # counters to flush at shutdown
            redis.stop()
        assert gw.gateway.loaded == {}  # stop() went on past the failed final flush and unloaded
    finally:
        redis.stop()


async def test_shutdown_completes_when_a_timer_loses_a_cancel(tmp_path: Path, monkeypatch: Any) -> None:
    # Python 3.11's wait_for can drop a cancel that coincides with its inner wait ending (seen inside a
    # Redis call of the metrics flush): the timer's action then returns normally, as here once.
    from forestflow.administration import Administration

    flush = Administration.flush_metrics
    in_flush, lost = asyncio.Event(), []

    async def flush_losing_a_cancel(self: Administration, force: bool = False) -> None:
        if force:  # stop()'s final flush
            return await flush(self, force)
        in_flush.set()
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            if lost:
                raise
            lost.append(True)  # swallowed: the timer goes on to its next turn

    monkeypatch.setattr(Administration, "flush_metrics", flush_losing_a_cancel)
    async with asyncio.timeout(20):  # before, shutdown waited for that timer forever
        async with serve_in_process(tmp_path / "data", metrics_flush_interval_s=0.01):
            await in_flush.wait()
    assert lost == [True]
