"""End to end: the gateway scores over HTTP and its prediction events land in a real Kafka topic."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from forestflow._proto import forestflow_pb2 as pb
from tests.kafka_broker import KafkaBroker, running_broker
from tests.predlog import read_topic, wait_for
from tests.support import ROOT, GatewayProcess, python_servable, score_body, serve_in_process

TOPIC = "e2e.predictions"


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with running_broker() as b:
        yield b


def kafka_settings(broker: KafkaBroker, topic: str) -> dict[str, object]:
    return {
        "kafka_bootstrap_servers": broker.bootstrap,
        "kafka_topic": topic,
        "kafka_enable_idempotence": False,
        "kafka_request_timeout_ms": 3000,
    }


async def test_n_batches_give_n_served_events_keyed_by_configs(broker: KafkaBroker, tmp_path: Path) -> None:
    topic = TOPIC + ".n"
    async with serve_in_process(tmp_path / "d", **kafka_settings(broker, topic)) as gw:
        body = python_servable(log_level="FULL", key_features=["customer", "missing", "order"])
        body["servableSettings"]["loggingSettings"]["keyFeaturesSeparator"] = "/"
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 200
        sent = {}
        for i in range(12):
            configs = {"customer": f"c{i}", "order": str(100 + i)} if i % 3 else {}
            xs = [float(i), i + 0.5]
            async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body(xs, configs=configs)) as r:
                assert r.status == 200
                sent[r.headers["X-Request-Id"]] = (configs, xs)
        # Read once the log has them (the test broker's consumer can miss a multi-record batch
        # that lands while it waits on a partition: tansu reports such a batch's end offset wrong).
        log = gw.gateway.prediction_log
        await wait_for(lambda: log.stats.delivered == 12, 30, "all 12 events delivered")
        records = await read_topic(broker.bootstrap, topic, expect=12)
    assert len(records) == 12
    for record in records:
        event = pb.PredictionEvent.FromString(record.value)
        configs, xs = sent[event.requestId]
        assert event.servedRequest and event.status == 200 and event.protocol == "basic"
        expected_key = f"{configs['customer']}/{configs['order']}".encode() if configs else None
        assert record.key == expected_key
        assert dict(event.inferenceRequest.configs) == configs
        got_x = [
            d.tensors[[s.type for s in event.inferenceRequest.schema].index(pb.Float64)].Float64.data[0]
            for d in event.inferenceRequest.datum
        ]
        assert got_x == xs
        assert [d.tensors[0].Float64.data[0] for d in event.prediction.datum] == [2 * x for x in xs]
        assert event.prediction.fqrv.release_version == "v1"


@pytest.mark.slow
async def test_broker_stopped_while_1000_requests_are_scored(broker: KafkaBroker, tmp_path: Path) -> None:
    topic = TOPIC + ".outage"
    async with serve_in_process(tmp_path / "d", **kafka_settings(broker, topic)) as gw:
        async with gw.session.post(gw.url + "/servable", json=python_servable(log_level="FULL")) as r:
            assert r.status == 200
        broker.stop()
        try:
            ids: list[str] = []

            async def one(i: int) -> None:
                async with gw.session.post(
                    gw.url + "/acme/demo/1/score", json=score_body([float(i)], configs={"reqid": str(i)})
                ) as r:
                    assert r.status == 200
                    ids.append(r.headers["X-Request-Id"])

            for start in range(0, 1000, 50):
                await asyncio.gather(*(one(i) for i in range(start, start + 50)))
            assert len(ids) == 1000
            assert log_stats_delivered(gw) == 0
            # The broker stays away until the log has failed to reach it twice (not a fixed time).
            stats = gw.gateway.prediction_log.stats
            await wait_for(lambda: stats.send_failures >= 2 and not stats.connected, 30, "the log to notice the outage")
        finally:
            broker.restart()
        log = gw.gateway.prediction_log
        await wait_for(lambda: log.stats.delivered == 1000, 60, "all 1000 events delivered")
        records = await read_topic(broker.bootstrap, topic, expect=1000)
    counts = Counter(pb.PredictionEvent.FromString(r.value).requestId for r in records)
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1, "an event arrived twice"
    assert log.stats.dropped == 0


def log_stats_delivered(gw: object) -> int:
    return gw.gateway.prediction_log.stats.delivered


async def test_logs_tail_cli_prints_json_lines(broker: KafkaBroker, tmp_path: Path) -> None:
    topic = TOPIC + ".tail"  # its own topic: xdist may run this module's tests on different workers (brokers)
    async with serve_in_process(tmp_path / "d", **kafka_settings(broker, topic)) as gw:
        body = python_servable(log_level="FULL", key_features=["customer", "order"])
        body["servableSettings"]["loggingSettings"]["keyFeaturesSeparator"] = "/"
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 200
        for configs in ({"customer": "c0", "order": "100"}, {"customer": "c1", "order": "101"}):
            async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0], configs=configs)) as r:
                assert r.status == 200
        log = gw.gateway.prediction_log
        await wait_for(lambda: log.stats.delivered == 2, 30, "both events delivered")
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "forestflow.cli",
            "logs",
            "tail",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--key",
            "c1/101",
            "--max-events",
            "1",
            "--idle-timeout",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0]["key"] == "c1/101"
    assert lines[0]["inferenceRequest"]["configs"] == {"customer": "c1", "order": "101"}


@pytest.mark.slow  # a gateway process, and a 3 s window that must see no retry
def test_a_broker_refusing_the_idempotent_producer_is_named_once_and_shown_while_ready(
    broker: KafkaBroker, tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    # The settings a newcomer starts with: idempotence on (the default), a broker without it (tansu).
    env = {
        "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "FORESTFLOW_KAFKA_REQUEST_TIMEOUT_MS": "2000",
        "FORESTFLOW_LOG_BUFFER_BYTES": "2048",  # a few events: the rest are dropped, and counted
    }
    gw = gateway_process(tmp_path / "d", env=env).start()
    assert requests.post(gw.url + "/servable", json=python_servable(log_level="FULL"), timeout=30).status_code == 200
    for i in range(40):
        assert requests.post(gw.url + "/acme/demo/1/score", json=score_body([float(i)]), timeout=10).status_code == 200

    def delivery() -> dict[str, object]:
        return requests.get(gw.url + "/health/ready", timeout=5).json()["predictionLog"]

    deadline = time.monotonic() + 20
    while delivery()["state"] != "failing" and time.monotonic() < deadline:
        time.sleep(0.05)
    # Retries would come after 0.5, 1 and 2 s: a window that holds several of them sees none.
    time.sleep(3.0)
    ready = requests.get(gw.url + "/health/ready", timeout=5)
    assert ready.status_code == 200, ready.text  # still in its balancer: scoring goes on
    state = ready.json()["predictionLog"]
    assert state["state"] == "failing" and "FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE=false" in str(state["reason"])
    assert int(state["dropped"]) > 0 and state["dropped"] == state["droppedOverflow"]
    metrics = requests.get(gw.url + "/metrics", timeout=5).text
    assert "forestflow_prediction_log_failing 1.0" in metrics
    assert f'forestflow_prediction_log_dropped_total{{reason="overflow"}} {float(state["dropped"])}' in metrics
    dashboard = requests.get(gw.url + "/ops/dashboard", timeout=5).json()["predictionLog"]
    assert dashboard["state"] == "failing" and dashboard["reason"] == state["reason"]
    lines = [x for x in gw.log_path.read_text().splitlines() if '"forestflow.access"' not in x]
    assert len([x for x in lines if "ENABLE_IDEMPOTENCE" in x]) == 1, lines
    assert not [x for x in lines if "InitProducerId" in x and "ENABLE_IDEMPOTENCE" not in x], lines
    assert requests.get(gw.url + "/metrics/json", timeout=5).json()["predictionLog"]["sendFailures"] == 1
