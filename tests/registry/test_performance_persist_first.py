"""``PUT .../performance-metrics`` persists first: with the store down nothing changes (issue 33 item 8)."""

from __future__ import annotations

from typing import Any

from tests.support import InProcessGateway, python_servable, score_body

PERF = [{"PerformanceBasedValidity": {"minThreshold": 0.8, "metricName": "auc"}}]
RELEASE = "/acme/demo/1/v1"


async def test_performance_update_with_the_store_down_changes_nothing(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(validity=PERF)) as r:
        assert r.status == 200, await r.text()
    admin = gw.gateway.admin
    store = admin.store
    healthy_apply = store.apply

    async def down(changes: dict[str, Any]) -> None:
        raise ConnectionError("store is down")

    store.apply = down
    try:
        async with gw.session.put(gw.url + RELEASE + "/performance-metrics", json={"performanceMetrics": {"auc": 0.95}}) as r:
            assert r.status == 503, await r.text()
            assert "unavailable" in (await r.json())["error"]
        entry = admin.registry.entry(next(iter(admin.registry.contracts.values())).servables["v1"].fqrv)
        assert entry.metrics.performance_metrics == {}  # before the fix: {"auc": 0.95}
        await admin.evaluate_all()
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
            assert r.status != 200, await r.text()  # v1 is still not valid: nothing serves
    finally:
        store.apply = healthy_apply
    async with gw.session.put(gw.url + RELEASE + "/performance-metrics", json={"performanceMetrics": {"auc": 0.95}}) as r:
        assert r.status == 200, await r.text()
    assert entry.metrics.performance_metrics == {"auc": 0.95}
    async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
        assert r.status == 200, await r.text()
