"""Scoring from Kafka against a real Kafka-protocol broker: requests in, replies out, offsets, pauses."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests as http
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord

from forestflow._proto import forestflow_pb2 as pb
from forestflow.api.kafka_ingest import KAFKA_INGEST, KafkaIngest
from tests.kafka_broker import KafkaBroker, running_broker
from tests.predlog import read_topic
from tests.support import (
    ROOT,
    GatewayProcess,
    InProcessGateway,
    free_port,
    python_servable,
    score_body,
    serve_in_process,
    wait_for,
)

CONTRACT = [("forestflow-contract", b"acme/demo/1")]


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with running_broker() as b:
        yield b


def names(prefix: str) -> tuple[str, str, str]:
    """A request topic, a reply topic and a group no other test uses."""
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}.req.{tag}", f"{prefix}.rep.{tag}", f"{prefix}.group.{tag}"


def ingest_settings(broker: KafkaBroker, requests: str, replies: str, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "kafka_bootstrap_servers": broker.bootstrap,
        "kafka_enable_idempotence": False,  # tansu has no idempotent producer
        "kafka_request_timeout_ms": 3000,
        "kafka_linger_ms": 1,
        "kafka_topic": requests + ".predictions",
        "kafka_ingest_topics": requests,
        "kafka_ingest_group": group,
        "kafka_reply_topic": replies,
        "kafka_ingest_session_timeout_ms": 1500,  # a dead replica's partitions move on quickly
        "kafka_ingest_fetch_max_wait_ms": 20,  # tansu holds a fetch for all of it, even when records arrive
        **extra,
    }


async def create_topics(broker: KafkaBroker, *topics: tuple[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name, partitions in topics])
    finally:
        await admin.close()


async def produce(
    broker: KafkaBroker, topic: str, messages: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]], one_by_one: bool = False
) -> None:
    """Produce (key, value, headers) messages; ``one_by_one`` waits for each (one record per batch)."""
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False, linger_ms=2)
    await producer.start()
    try:
        pending = []
        for key, value, headers in messages:
            if one_by_one:
                await producer.send_and_wait(topic, value, key=key, headers=headers)
            else:
                pending.append(await producer.send(topic, value, key=key, headers=headers))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def score_message(i: int, **configs: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    return f"k{i}".encode(), json.dumps(score_body([float(i)], [f"r{i}"], configs=configs or None)).encode(), CONTRACT


def header(record: ConsumerRecord, name: str) -> str:
    return dict(record.headers)[name].decode()


def doubled(record: ConsumerRecord) -> float:
    datum = json.loads(record.value)["Prediction"]["datum"]
    assert len(datum) == 1
    return float(datum[0]["tensors"][0]["Float64"]["data"][0])


async def deploy(gw: InProcessGateway, body: dict[str, Any]) -> None:
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()


async def ingest_metrics(gw: InProcessGateway) -> dict[str, Any]:
    async with gw.session.get(gw.url + "/metrics/json") as r:
        return await r.json()


def ingest(gw: InProcessGateway) -> KafkaIngest:
    return gw.app[KAFKA_INGEST]


def committed(gw: InProcessGateway) -> int:
    """Offsets committed over every partition (each topic's partitions start at 0)."""
    return sum(p["committed"] or 0 for p in ingest(gw).snapshot()["partitions"].values())


async def test_1000_requests_give_1000_replies_with_their_keys_and_predictions(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("many")
    await create_topics(broker, (requests, 3), (replies, 2))
    async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
        await deploy(gw, python_servable())
        await produce(broker, requests, [score_message(i) for i in range(1000)])
        records = await read_topic(broker.bootstrap, replies, expect=1000, timeout_s=60, settle_s=0.5)
        await wait_for(lambda: committed(gw) == 1000, 5, "every offset committed")
        metrics = (await ingest_metrics(gw))["kafkaIngest"]
    assert len(records) == 1000
    by_key = {r.key: r for r in records}
    assert len(by_key) == 1000, "a request was answered twice"
    for i in range(1000):
        record = by_key[f"k{i}".encode()]
        assert header(record, "forestflow-status") == "200"
        assert header(record, "content-type") == "application/json"
        assert header(record, "forestflow-fqrv") == "acme.demo.1.v1"
        assert doubled(record) == 2.0 * i
        assert json.loads(record.value)["Prediction"]["datum"][0]["tensors"][1]["String"]["data"] == [f"r{i}"]
    ids = [header(r, "forestflow-request-id") for r in records]
    assert len(set(ids)) == 1000 and all(i.startswith(requests + ":") for i in ids)  # topic:partition:offset
    assert metrics["consumed"] == 1000 and metrics["answered"] == {"200": 1000} and metrics["dropped"] == {}
    assert len(metrics["partitions"]) == 3
    assert sum(p["committed"] or 0 for p in metrics["partitions"].values()) == 1000
    assert all(p["lag"] == 0 for p in metrics["partitions"].values())


def proto_body(xs: list[float]) -> bytes:
    request = pb.InferenceRequest()
    entry = request.schema.add()
    entry.type = pb.Float64
    entry.fields.append("x")
    for x in xs:
        request.datum.add().tensors.add().Float64.data.append(x)
    request.configs["reqid"] = "proto"
    return request.SerializeToString()


def v2_body(x: float) -> bytes:
    return json.dumps({"id": "v2-client-id", "inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [x]}]}).encode()


async def test_bad_messages_get_error_replies_and_later_ones_are_still_answered(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("errors")
    await create_topics(broker, (requests, 1), (replies, 1))
    to = [("forestflow-reply-topic", replies.encode())]
    json_ct = [("content-type", b"application/json")]
    messages = [
        (b"malformed", b'{"schema": [', CONTRACT + to),
        (b"unknown", json.dumps(score_body([1.0])).encode(), [("forestflow-contract", b"acme/nope/7"), *to]),
        (b"no-contract", json.dumps(score_body([1.0])).encode(), to),
        (b"bad-type", json.dumps(score_body([1.0])).encode(), CONTRACT + to + [("content-type", b"text/csv")]),
        (b"bad-v2", b'{"inputs": 3}', [("forestflow-model", b"acme.demo.1"), ("content-type", b"application/vnd.v2+json"), *to]),
        (b"no-reply-topic", json.dumps(score_body([1.0])).encode(), CONTRACT),
        (b"json", json.dumps(score_body([5.0], configs={"reqid": "json"})).encode(), CONTRACT + to + json_ct),
        (b"proto", proto_body([2.0, 3.0]), CONTRACT + to + [("content-type", b"application/x-protobuf")]),
        (
            b"v2",
            v2_body(4.0),
            [
                ("forestflow-model", b"acme.demo.1"),
                ("content-type", b"application/vnd.v2+json"),
                ("forestflow-request-id", b"ignored-for-v2-body-id"),
                *to,
            ],
        ),
        (b"own-id", json.dumps(score_body([6.0])).encode(), CONTRACT + to + [("forestflow-request-id", b"my-id-6")]),
    ]
    # No default reply topic: a message that names none is dropped.
    settings = ingest_settings(broker, requests, replies, group, kafka_reply_topic="")
    async with serve_in_process(tmp_path / "d", **settings) as gw:
        await deploy(gw, python_servable(log_level="FULL"))
        await deploy(gw, python_servable(release="shadow", validity=[{"NeverValid": {}}], log_level="FULL"))
        await produce(broker, requests, messages, one_by_one=True)
        records = await read_topic(broker.bootstrap, replies, expect=9, timeout_s=30, settle_s=0.5)
        await wait_for(lambda: committed(gw) == len(messages), 5, "every offset committed, the dropped one included")
        metrics = (await ingest_metrics(gw))["kafkaIngest"]
        events = await read_topic(broker.bootstrap, requests + ".predictions", expect=8, timeout_s=30, settle_s=0.5)
        # A reply topic the broker does not know is a drop, not a retry forever (tansu creates topics
        # on demand, so only the check itself can be seen here).
        assert await ingest(gw)._replies._topic_missing(f"no.such.topic.{uuid.uuid4().hex[:6]}")
        assert not await ingest(gw)._replies._topic_missing(replies)
    got = {r.key.decode(): r for r in records}
    assert sorted(got) == sorted(k.decode() for k, _, _ in messages if k != b"no-reply-topic")
    status = {k: int(header(r, "forestflow-status")) for k, r in got.items()}
    assert status == {
        "malformed": 400,
        "unknown": 404,
        "no-contract": 400,
        "bad-type": 400,
        "bad-v2": 400,
        "json": 200,
        "proto": 200,
        "v2": 200,
        "own-id": 200,
    }
    body = {k: json.loads(r.value) for k, r in got.items() if k != "proto"}
    assert body["malformed"]["code"] == "InvalidInput" and "not valid JSON" in body["malformed"]["error"]
    assert body["unknown"]["UnknownContract"]["contract"]["project"] == "nope"
    assert "forestflow-contract" in body["no-contract"]["error"]
    assert "text/csv" in body["bad-type"]["error"]
    assert set(body["bad-v2"]) == {"error"}  # the V2 error body, as over HTTP
    assert doubled(got["json"]) == 10.0
    prediction = pb.Prediction.FromString(got["proto"].value)
    assert header(got["proto"], "content-type") == "application/x-protobuf"
    assert [d.tensors[0].Float64.data[0] for d in prediction.datum] == [4.0, 6.0]
    assert body["v2"]["outputs"][0]["name"] == "double" and body["v2"]["outputs"][0]["data"] == [8.0]
    assert body["v2"]["id"] == header(got["v2"], "forestflow-request-id") == "v2-client-id"
    assert header(got["own-id"], "forestflow-request-id") == "my-id-6"
    assert header(got["malformed"], "forestflow-request-id") == f"{requests}:0:0"
    assert metrics["dropped"] == {"no_reply_topic": 1}
    assert metrics["answered"] == {"200": 4, "400": 4, "404": 1}
    # Prediction events as for HTTP: the served one and the shadow copy of each scored message (field 12
    # names the servable: V2 events carry the wire bodies instead of a Prediction).
    decoded = [pb.PredictionEvent.FromString(e.value) for e in events]
    assert all(e.protocol == "kafka" and e.status == 200 for e in decoded)
    assert Counter((e.servedRequest, e.fqrv.release_version) for e in decoded) == {(True, "v1"): 4, (False, "shadow"): 4}
    assert {e.requestId for e in decoded} == {header(got[k], "forestflow-request-id") for k in ("json", "proto", "v2", "own-id")}


@pytest.mark.slow
async def test_a_slow_servable_pauses_consumption_and_it_catches_up(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("slow")
    await create_topics(broker, (requests, 1), (replies, 1))
    # One slot and 4 queue places, 30 ms a request, no micro-batching: ~33 requests/s.
    settings = ingest_settings(broker, requests, replies, group, scoring_slots=1, live_queue=4, max_batch_rows=0)
    async with serve_in_process(tmp_path / "d", **settings) as gw:
        await deploy(gw, python_servable())
        lags: list[tuple[int, int]] = []  # (wave being produced, lag)
        wave = 1

        async def sample() -> None:
            while True:
                part = ingest(gw).snapshot()["partitions"].get(f"{requests}/0")
                if part and part["lag"] is not None:
                    lags.append((wave, part["lag"]))
                await asyncio.sleep(0.05)

        await wait_for(lambda: f"{requests}/0" in ingest(gw).snapshot()["partitions"], 20, "the partition assigned")
        sampler = asyncio.create_task(sample())
        try:
            # One record per batch: tansu reports the end offset of multi-record batches wrong.
            await produce(broker, requests, [score_message(i, sleep="0.03") for i in range(80)], one_by_one=True)
            await wait_for(lambda: ingest(gw).snapshot()["partitions"][f"{requests}/0"]["paused"] and lags, 10, "a pause")
            wave = 2
            await produce(broker, requests, [score_message(i, sleep="0.03") for i in range(80, 160)], one_by_one=True)
            records = await read_topic(broker.bootstrap, replies, expect=160, timeout_s=60, settle_s=0.3)
            await wait_for(lambda: committed(gw) == 160, 5, "every offset committed")
        finally:
            sampler.cancel()
        metrics = await ingest_metrics(gw)
    kafka = metrics["kafkaIngest"]
    assert sorted(r.key for r in records) == sorted(f"k{i}".encode() for i in range(160))
    assert {header(r, "forestflow-status") for r in records} == {"200"}
    assert sorted(doubled(r) for r in records) == [2.0 * i for i in range(160)]
    # Nothing was refused: no 503 reply, no live request rejected, no retried offer, nothing dropped.
    assert kafka["answered"] == {"200": 160} and kafka["dropped"] == {} and kafka["overloadRetries"] == 0
    assert metrics["schedulers"]["acme.demo.1.v1"]["liveRejected"] == 0
    assert kafka["pauses"] >= 1 and kafka["pausedSeconds"] > 1.0
    # The lag grew while the second wave arrived, then went back to nothing.
    before = max(lag for w, lag in lags if w == 1)
    during = max(lag for w, lag in lags if w == 2)
    assert during > before and during >= 80, lags
    part = kafka["partitions"][f"{requests}/0"]
    assert part["lag"] == 0 and not part["paused"] and part["waiting"] == 0


class ReplyCollector:
    """Reads a reply topic from its start in the background while a test runs."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.records: list[ConsumerRecord] = []
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ReplyCollector:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.broker.bootstrap, group_id=None, enable_auto_commit=False)
        await self._consumer.start()
        await wait_for(lambda: self._partitions(), 10, f"partitions of {self.topic}")
        tps = [TopicPartition(self.topic, p) for p in sorted(self._partitions())]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._read())
        return self

    def _partitions(self) -> set[int]:
        assert self._consumer is not None
        return self._consumer.partitions_for_topic(self.topic) or set()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            for batch in (await self._consumer.getmany(timeout_ms=200)).values():
                self.records.extend(batch)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None and self._consumer is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()


def process_env(settings: dict[str, Any]) -> dict[str, str]:
    return {f"FORESTFLOW_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in settings.items()}


@pytest.mark.slow
async def test_a_gateway_killed_mid_stream_and_restarted_answers_every_request(
    broker: KafkaBroker, tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    requests, replies, group = names("restart")
    await create_topics(broker, (requests, 2), (replies, 1))
    # One slot, no micro-batching, 5 ms a request: 400 requests take ~2 s, so the kill lands mid-stream.
    env = process_env(ingest_settings(broker, requests, replies, group, scoring_slots=1, max_batch_rows=0))
    data = tmp_path / "data"
    first = gateway_process(data, env=env).start()
    response = await asyncio.to_thread(http.post, first.url + "/servable", json=python_servable(), timeout=30)
    assert response.status_code == 200, response.text

    def assigned(proc: GatewayProcess) -> bool:
        metrics = http.get(proc.url + "/metrics/json", timeout=5).json()
        return len(metrics["kafkaIngest"]["partitions"]) == 2

    await wait_for(lambda: asyncio.to_thread(assigned, first), 20, "both partitions assigned")
    async with ReplyCollector(broker, replies) as collector:
        await produce(broker, requests, [score_message(i, sleep="0.005") for i in range(400)])
        await wait_for(lambda: len(collector.records) >= 100, 30, "100 replies")
        first.kill()
        answered_by_first = len(collector.records)
        second = gateway_process(data, env=env).start()  # same data dir: the servable is restored
        keys = {f"k{i}".encode() for i in range(400)}
        await wait_for(lambda: keys <= {r.key for r in collector.records}, 60, "a reply to every request")
        await asyncio.sleep(0.5)  # any duplicate still on its way
        records = list(collector.records)
    assert answered_by_first < 400, "the gateway was killed after it had answered everything"
    assert {r.key for r in records} == keys
    assert {header(r, "forestflow-status") for r in records} == {"200"}
    by_key: dict[bytes, list[ConsumerRecord]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    for i in range(400):
        answers = by_key[f"k{i}".encode()]
        assert {doubled(a) for a in answers} == {2.0 * i}
        # A request answered twice (delivered again after the kill) keeps its id: consumers can drop the copy.
        assert len({header(a, "forestflow-request-id") for a in answers}) == 1
    second.stop()


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "forestflow.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow  # the CLI's kafka commands in child processes
async def test_kafka_score_and_replies_commands(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("cli")
    await create_topics(broker, (requests, 1), (replies, 1))
    body = tmp_path / "score.json"
    body.write_text(json.dumps(score_body([21.0], ["cli"])))
    async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
        await deploy(gw, python_servable())
        code, out, err = await run_cli(
            "kafka",
            "score",
            str(body),
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            requests,
            "--reply-topic",
            replies,
            "--contract",
            "acme/demo/1",
            "--key",
            "mine",
        )
        assert code == 0, err
        line = json.loads(out)
        assert (line["key"], line["status"]) == ("mine", 200) and line["requestId"].startswith("cli-")
        assert line["body"]["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [42.0]
        code, out, err = await run_cli(
            "kafka",
            "score",
            str(body),
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            requests,
            "--reply-topic",
            replies,
            "--contract",
            "acme/other/1",
        )
        assert code == 1 and json.loads(out)["status"] == 404, err
        code, out, err = await run_cli(
            "kafka",
            "replies",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            replies,
            "--from-beginning",
            "--key",
            "mine",
            "--idle-timeout",
            "2",
        )
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [(x["key"], x["status"]) for x in lines] == [("mine", 200)]


@pytest.mark.slow  # five CLI child processes, one waiting out its idle timeout
async def test_kafka_cli_reads_the_settings_of_serve_and_waits_for_no_topic(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("fresh")  # no topic made beforehand: the gateway creates them
    body = tmp_path / "score.json"
    body.write_text(json.dumps(score_body([4.0], ["fresh"])))
    env = {
        "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "FORESTFLOW_KAFKA_INGEST_TOPICS": requests,
        "FORESTFLOW_KAFKA_REPLY_TOPIC": replies,
        "FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE": "false",
    }
    async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
        await deploy(gw, python_servable())
        await wait_for(lambda: ingest(gw).connected, 20, "the ingestion connected")
        code, out, err = await run_cli("kafka", "score", str(body), "--contract", "acme/demo/1", "--timeout", "20", env=env)
        assert code == 0, err
        assert json.loads(out)["body"]["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [8.0]
        # a topic no gateway consumes: said at once, in one line
        code, out, err = await run_cli(
            "kafka", "score", str(body), "--contract", "acme/demo/1", "--topic", "nobody.reads", env=env
        )
        assert code == 2 and out == "" and err.count("\n") == 1 and "nobody.reads does not exist" in err, err
    # a reply topic nobody has written to yet is made, not waited for
    code, out, err = await run_cli("kafka", "replies", "--topic", f"{replies}.new", "--idle-timeout", "1", env=env)
    assert (code, out) == (0, ""), err
    # no broker there: one line, no traceback
    absent = {**env, "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    for command in (["score", str(body), "--contract", "acme/demo/1"], ["replies"]):
        code, out, err = await run_cli("kafka", *command, env=absent)
        assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("forestflow: error: Kafka at 127.0.0.1:"), err


@pytest.mark.slow
async def test_a_broker_outage_mid_stream_loses_no_request(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("outage")
    await create_topics(broker, (requests, 2), (replies, 1))
    # One slot, no micro-batching, 10 ms a request: 200 requests take ~2 s.
    settings = ingest_settings(broker, requests, replies, group, scoring_slots=1, max_batch_rows=0)
    async with serve_in_process(tmp_path / "d", **settings) as gw:
        await deploy(gw, python_servable())
        await wait_for(lambda: len(ingest(gw).snapshot()["partitions"]) == 2, 20, "both partitions assigned")
        await produce(broker, requests, [score_message(i, sleep="0.01") for i in range(200)])
        async with ReplyCollector(broker, replies) as collector:
            await wait_for(lambda: len(collector.records) >= 30, 30, "30 replies")
            answered_before = len({r.key for r in collector.records})
        broker.stop()  # connections reset, the port refuses; tansu keeps its data
        try:
            await asyncio.sleep(3.0)
        finally:
            broker.restart()
        keys = {f"k{i}".encode() for i in range(200)}
        async with ReplyCollector(broker, replies) as collector:
            await wait_for(lambda: keys <= {r.key for r in collector.records}, 60, "a reply to every request")
            records = list(collector.records)
    assert answered_before < 150, "the broker was stopped after most requests were answered"
    assert {header(r, "forestflow-status") for r in records} == {"200"}
    for record in records:
        assert doubled(record) == 2.0 * int(record.key[1:])


async def test_offers_refused_after_a_stale_room_check_are_retried_not_answered_503(
    broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Other traffic can fill a queue between the room check and the offer; that race cannot be
    # timed from a test, so the check is made to always see room: every offer over the queue's
    # bound is then refused by the real scheduler and must be retried, never answered 503.
    from forestflow.runtime.scheduler import ServableScheduler

    monkeypatch.setattr(ServableScheduler, "live_room", lambda self: 1000)
    requests, replies, group = names("race")
    await create_topics(broker, (requests, 1), (replies, 1))
    settings = ingest_settings(broker, requests, replies, group, scoring_slots=1, live_queue=2, max_batch_rows=0)
    async with serve_in_process(tmp_path / "d", **settings) as gw:
        await deploy(gw, python_servable())
        await produce(broker, requests, [score_message(i, sleep="0.01") for i in range(30)])
        records = await read_topic(broker.bootstrap, replies, expect=30, timeout_s=30, settle_s=0.3)
        stats = ingest(gw).stats
        rejected = gw.gateway.loaded[next(iter(gw.gateway.loaded))].scheduler.stats.live_rejected
    assert sorted(r.key for r in records) == sorted(f"k{i}".encode() for i in range(30))
    assert {header(r, "forestflow-status") for r in records} == {"200"}
    assert stats.overload_retries == rejected > 0


@pytest.mark.slow
async def test_a_broker_absent_at_start_is_waited_for(broker: KafkaBroker, tmp_path: Path) -> None:
    requests, replies, group = names("absent")
    await create_topics(broker, (requests, 1), (replies, 1))
    broker.stop()
    try:
        async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
            await deploy(gw, python_servable())  # HTTP serves while Kafka is away
            await asyncio.sleep(1.5)
            assert (await ingest_metrics(gw))["kafkaIngest"]["connected"] is False
            broker.restart()
            await wait_for(lambda: ingest(gw).connected, 20, "the ingestion connected")
            await produce(broker, requests, [score_message(i) for i in range(20)])
            records = await read_topic(broker.bootstrap, replies, expect=20, timeout_s=30, settle_s=0.2)
    finally:
        broker.start()
    assert sorted(doubled(r) for r in records) == [2.0 * i for i in range(20)]


async def test_a_model_error_gets_a_500_prediction_failed_reply(broker: KafkaBroker, tmp_path: Path) -> None:
    """Errors raised inside model code are the server's on Kafka too (issue 33 item 2)."""
    requests, replies, group = names("model-error")
    await create_topics(broker, (requests, 1), (replies, 1))
    messages = [
        (b"raises", json.dumps(score_body([1.0], ["value"])).encode(), CONTRACT),
        (b"fine", json.dumps(score_body([3.0], ["ok"])).encode(), CONTRACT),
    ]
    async with serve_in_process(tmp_path / "d", **ingest_settings(broker, requests, replies, group)) as gw:
        servables = Path(__file__).with_name("servables")
        await deploy(gw, python_servable(directory=servables, module="raising.py"))
        await produce(broker, requests, messages, one_by_one=True)
        records = await read_topic(broker.bootstrap, replies, expect=2, timeout_s=30, settle_s=0.2)
    got = {r.key.decode(): r for r in records}
    assert int(header(got["raises"], "forestflow-status")) == 500
    assert json.loads(got["raises"].value)["code"] == "PredictionFailed"
    assert int(header(got["fine"], "forestflow-status")) == 200


@pytest.mark.slow
def test_the_kafka_page_runs_as_written_with_the_test_broker(broker: KafkaBroker, tmp_path: Path) -> None:
    """docs/kafka.md's commands against the test extras' broker (its settings as the page shows them):
    the exports, serve, then the CLI commands of the second block (kcat aside: not installed here)."""
    import re
    import subprocess

    text = (ROOT / "docs" / "kafka.md").read_text()
    setup, use = (
        [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)[:2]
    )
    env: dict[str, str] = {}
    for line in setup:
        if line.startswith("export "):
            for pair in line.split("#")[0].split()[1:]:
                name, _, value = pair.partition("=")
                env[name] = value.replace("localhost:9092", broker.bootstrap)
    assert env["FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE"] == "false" and "forestflow serve" in setup[-1]
    gw = GatewayProcess(tmp_path / "data", env=env).start()
    try:
        deploy = json.loads((ROOT / "servables" / "prostate-gbm.json").read_text())
        deploy["path"] = (ROOT / "servables" / "prostate-gbm").as_uri()
        assert http.post(gw.url + "/servable", json=deploy, timeout=60).status_code == 200

        def run(command: str) -> str:
            command = command.replace(".venv/bin/forestflow", f"{sys.executable} -m forestflow.cli")
            done = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=90, env={**os.environ, **env}
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            return done.stdout

        commands = [c for c in use if not c.startswith(("#", "kcat"))]
        score, replies, tail = commands
        reply = json.loads(run(score))
        assert (reply["key"], reply["status"], reply["headers"]["forestflow-fqrv"]) == (
            "patient-17",
            200,
            "samples.prostate.1.gbm-v1",
        )
        assert [json.loads(x)["requestId"] for x in run(replies).splitlines()] == [reply["requestId"]]
        events = [json.loads(x) for x in run(tail).splitlines()]
        assert events and {e["protocol"] for e in events} == {"kafka"}
    finally:
        assert gw.stop() == 0
