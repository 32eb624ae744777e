"""Prediction events and Kafka ingestion replies read by the CloudEvents SDK from a real broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from forestflow._proto import forestflow_pb2 as pb
from tests.api.test_kafka_ingest import create_topics, ingest_settings, names, produce, score_message
from tests.kafka_broker import KafkaBroker, running_broker
from tests.predlog import read_topic, wait_for
from tests.predlog.test_gateway_kafka import kafka_settings
from tests.support import python_servable, score_body, serve_in_process


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with running_broker() as b:
        yield b


def cloud_event(record: object) -> object:
    """The record as the SDK reads a binary-mode CloudEvent (headers as a dict, value as bytes)."""
    message = ce_kafka.KafkaMessage(headers=dict(record.headers), key=record.key, value=record.value)
    return ce_kafka.from_binary(message, JSONFormat())


async def test_served_and_shadow_events_are_binary_mode_cloudevents(broker: KafkaBroker, tmp_path: Path) -> None:
    topic = "ce.predictions"
    before = datetime.now(UTC)
    async with serve_in_process(tmp_path / "d", **kafka_settings(broker, topic)) as gw:
        for release, validity in (("live", None), ("shade", [{"NeverValid": {}}])):
            body = python_servable(release=release, log_level="FULL", validity=validity)
            async with gw.session.post(gw.url + "/servable", json=body) as r:
                assert r.status == 200, await r.text()
        ids = []
        for i in range(3):
            async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([float(i)])) as r:
                assert r.status == 200
                ids.append(r.headers["X-Request-Id"])
        log = gw.gateway.prediction_log
        await wait_for(lambda: log.stats.delivered == 6, 30, "3 served and 3 shadow events delivered")
        records = await read_topic(broker.bootstrap, topic, expect=6)
    assert len(records) == 6
    seen = set()
    for record in records:
        event = cloud_event(record)
        proto = pb.PredictionEvent.FromString(event.get_data())  # the value is ForestFlow's event, unchanged
        assert event.get_attributes()["specversion"] == "1.0"
        assert event.get_id() == proto.requestId and proto.requestId in ids
        assert event.get_source() == "/acme/demo/1"
        served = proto.fqrv.release_version == "live"
        assert event.get_type() == ("org.forestflow.prediction.served" if served else "org.forestflow.prediction.shadow")
        assert event.get_datacontenttype() == "application/x-protobuf"
        assert before.replace(microsecond=0) <= event.get_time() <= datetime.now(UTC)
        seen.add((event.get_id(), served))
    assert seen == {(i, s) for i in ids for s in (True, False)}


async def test_kafka_ingestion_replies_are_cloudevents(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("ce")
    await create_topics(broker, (requests, 1), (replies, 1))
    async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
        async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
            assert r.status == 200
        await produce(broker, requests, [score_message(i) for i in range(3)])
        records = await read_topic(broker.bootstrap, replies, expect=3, timeout_s=30)
    assert len(records) == 3
    for record in records:
        event = cloud_event(record)
        headers = {k: v.decode() for k, v in record.headers}
        assert event.get_id() == headers["forestflow-request-id"]
        assert event.get_type() == "org.forestflow.prediction.reply"
        assert event.get_source() == "/acme/demo/1" and event.get_datacontenttype() == "application/json"
        assert event.get_data() == json.loads(record.value)  # the SDK parses a JSON body
