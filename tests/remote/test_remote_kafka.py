"""Kafka ingestion reaches a RemoteV2 release: requests from a topic scored on the backend, replies out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_kafka_ingest import create_topics, doubled, header, ingest_settings, names, produce, score_message
from tests.api.v2_support import v2_gateway
from tests.kafka_broker import KafkaBroker, running_broker
from tests.predlog import read_topic
from tests.remote.support import remote_servable
from tests.support import python_servable


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with running_broker() as b:
        yield b


@pytest.mark.slow
async def test_kafka_requests_are_scored_on_the_backend(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("remote")
    await create_topics(broker, (requests, 2), (replies, 1))
    async with v2_gateway(tmp_path / "backend", access_log=False) as backend:
        await backend.deploy(python_servable())
        settings = ingest_settings(broker, requests, replies, group)
        async with v2_gateway(tmp_path / "front", access_log=False, **settings) as front:
            # The front's acme.demo.1 (the contract the messages name) is scored by the backend's.
            await front.deploy(remote_servable(backend.grpc_target, protocol="grpc", contract=("acme", "demo", 1)))
            await produce(broker, requests, [score_message(i) for i in range(40)])
            records = await read_topic(broker.bootstrap, replies, expect=40, timeout_s=30, settle_s=0.2)
    assert len(records) == 40
    by_key = {r.key: r for r in records}
    for i in range(40):
        record = by_key[f"k{i}".encode()]
        assert header(record, "forestflow-status") == "200" and header(record, "forestflow-fqrv") == "acme.demo.1.r1"
        assert doubled(record) == 2.0 * i
        assert json.loads(record.value)["Prediction"]["datum"][0]["tensors"][1]["String"]["data"] == [f"r{i}"]
