"""/metrics: Prometheus text from prometheus-client with the counters the issue lists (HTTP and gRPC)."""

from __future__ import annotations

import platform
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import forestflow
from tests.api.test_v2_grpc import raw_request, v2  # noqa: F401 (v2 is a fixture)
from tests.support import InProcessGateway, python_servable, score_body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, parsed with the reference parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(parsed: dict[Any, float], name: str, **labels: str) -> float:
    return parsed[(name, tuple(sorted(labels.items())))]


async def scrape(gw: InProcessGateway) -> tuple[str, dict[Any, float]]:
    async with gw.session.get(gw.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = await r.text()
    return text, samples(text)


async def test_metrics_count_requests_latency_servables_and_log(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(log_level="FULL")) as r:
        assert r.status == 200
    for _ in range(3):
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
            assert r.status == 200
    for n in range(5):  # unknown contracts: counted, but their names never become label values
        async with gw.session.post(gw.url + f"/nobody/x/{n}/score", json=score_body([1.0])) as r:
            assert r.status == 404
    async with gw.session.post(
        gw.url + "/v2/models/acme.demo.1/infer", json={"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [2.0]}]}
    ) as r:
        assert r.status == 200, await r.text()

    text, parsed = await scrape(gw)
    assert (
        value(parsed, "forestflow_requests_total", contract="acme.demo.1", fqrv="acme.demo.1.v1", protocol="basic", status="200")
        == 3
    )
    assert (
        value(parsed, "forestflow_requests_total", contract="acme.demo.1", fqrv="acme.demo.1.v1", protocol="v2", status="200")
        == 1
    )
    assert value(parsed, "forestflow_requests_total", contract="", fqrv="", protocol="basic", status="404") == 5
    assert "nobody" not in text
    # sub-millisecond buckets, and every scored request in the scoring histogram
    assert ("forestflow_scoring_duration_seconds_bucket", (("fqrv", "acme.demo.1.v1"), ("le", "0.0001"))) in parsed
    assert value(parsed, "forestflow_scoring_duration_seconds_count", fqrv="acme.demo.1.v1") == 4
    assert value(parsed, "forestflow_request_duration_seconds_count", protocol="basic") == 8
    assert value(parsed, "forestflow_servable_phase_in_percent", fqrv="acme.demo.1.v1") == 100
    assert value(parsed, "forestflow_servable_valid", fqrv="acme.demo.1.v1") == 1
    assert value(parsed, "forestflow_servable_scores_total", fqrv="acme.demo.1.v1") == 4
    assert value(parsed, "forestflow_queue_depth", fqrv="acme.demo.1.v1", priority="shadow") == 0
    assert value(parsed, "forestflow_shadow_dropped_total", fqrv="acme.demo.1.v1") == 0
    assert value(parsed, "forestflow_live_rejected_total", fqrv="acme.demo.1.v1") == 0
    assert value(parsed, "forestflow_deadline_exceeded_total", fqrv="acme.demo.1.v1") == 0
    assert value(parsed, "forestflow_servable_load_seconds", fqrv="acme.demo.1.v1") > 0
    assert value(parsed, "forestflow_servable_load_failures_total") == 0
    assert value(parsed, "forestflow_prediction_log_produced_total") == 4
    log = gw.gateway.prediction_log.stats
    assert value(parsed, "forestflow_prediction_log_delivered_total") == log.delivered
    assert value(parsed, "forestflow_prediction_log_buffer_bytes") == log.buffered_bytes
    assert value(parsed, "forestflow_prediction_log_dropped_total", reason="overflow") == 0
    assert value(parsed, "forestflow_registry_store_available") == 1
    assert value(parsed, "forestflow_ready") == 1
    # prometheus-client's process, platform and GC collectors, and the build
    assert value(parsed, "process_resident_memory_bytes") > 0 and value(parsed, "process_cpu_seconds_total") > 0
    assert any(
        name == "python_info" and dict(labels)["implementation"] == platform.python_implementation() for name, labels in parsed
    )
    assert any(name == "python_gc_collections_total" for name, _ in parsed)
    build = [labels for name, labels in parsed if name == "forestflow_build_info"]
    assert [dict(labels)["version"] for labels in build] == [forestflow.__version__]
    assert value(parsed, "forestflow_build_info", **dict(build[0])) == 1


async def test_recent_errors_on_the_page_carry_the_error_code_and_message(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/nobody/x/1/score", json=score_body([1.0])) as r:
        assert r.status == 404
        request_id = r.headers["X-Request-Id"]
    async with gw.session.post(gw.url + "/v2/models/nobody.x.1/infer", json={"inputs": []}) as r:
        assert r.status == 404  # a V2 body has no code: the page still has it
    async with gw.session.get(gw.url + "/ops/dashboard") as r:
        errors = (await r.json())["errors"]
    v2_error, basic = errors[0], errors[1]  # newest first
    assert (basic["requestId"], basic["status"], basic["code"]) == (request_id, 404, "UnknownContract")
    assert "nobody" in basic["message"]
    assert v2_error["code"] == "UnknownContract" and "nobody" in v2_error["message"]


async def test_deadline_and_failed_load_are_counted(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
        assert r.status == 200
    slow = score_body([1.0], configs={"sleep": "0.3"})
    async with gw.session.post(gw.url + "/acme/demo/1/score", json=slow, headers={"X-Request-Timeout-Ms": "50"}) as r:
        assert r.status == 504
    broken = python_servable(release="v2", module="missing.py")
    async with gw.session.post(gw.url + "/servable", json=broken) as r:
        assert r.status >= 400
    _, parsed = await scrape(gw)
    assert value(parsed, "forestflow_deadline_exceeded_total", fqrv="acme.demo.1.v1") == 1
    assert value(parsed, "forestflow_requests_total", contract="acme.demo.1", fqrv="", protocol="basic", status="504") == 1
    assert value(parsed, "forestflow_servable_load_failures_total") == 1


async def test_grpc_calls_are_counted(v2: tuple[Any, Any]) -> None:  # noqa: F811 (the fixture imported above)
    gw, call = v2
    for _ in range(2):
        await call("ModelInfer", **raw_request([1.0], [b"a"]))
    with pytest.raises(grpc.aio.AioRpcError):
        await call("ModelInfer", **(raw_request([1.0], [b"a"]) | {"model_name": "no.such.1"}))
    await call("ServerReady")
    _, parsed = await scrape(gw.server)
    assert (
        value(parsed, "forestflow_requests_total", contract="acme.demo.1", fqrv="acme.demo.1.v1", protocol="v2-grpc", status="OK")
        == 2
    )
    assert value(parsed, "forestflow_requests_total", contract="", fqrv="", protocol="v2-grpc", status="NOT_FOUND") == 1
    assert value(parsed, "forestflow_requests_total", contract="", fqrv="", protocol="v2-grpc", status="OK") == 1
    assert value(parsed, "forestflow_scoring_duration_seconds_count", fqrv="acme.demo.1.v1") == 2
    assert "no.such" not in (await scrape(gw.server))[0]
