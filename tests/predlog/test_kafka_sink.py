"""KafkaSink and ``logs tail`` against a real Kafka-protocol broker (tansu, see tests/kafka_broker.py)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import DefaultPartitioner

from forestflow._proto import forestflow_pb2 as pb
from forestflow.predlog.encode import encode_event
from forestflow.predlog.kafka_sink import KafkaSink
from forestflow.predlog.log import EVENT_OVERHEAD_BYTES, LogEntry
from forestflow.predlog.record import PredictionRecord
from forestflow.predlog.tail import add_tail_arguments, run_tail, tail
from forestflow.settings import Settings
from tests.kafka_broker import KafkaBroker, free_port
from tests.predlog import kafka_sink, make_record, produce_raw, read_topic
from tests.support import ROOT


def entry(record: PredictionRecord) -> LogEntry:
    key = record.key
    return LogEntry(record.is_graphpipe, key.encode() if key is not None else None, encode_event(record))


def request_ids(records: list, graphpipe: bool = False) -> Counter[str]:
    message = pb.PredictionEventGP if graphpipe else pb.PredictionEvent
    return Counter(message.FromString(r.value).requestId for r in records)


# ---- the sink ---------------------------------------------------------------------------------------
async def test_send_routes_by_topic_with_keys(broker: KafkaBroker, topic: str) -> None:
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    basic = [
        make_record(0, {"user": "u0", "session": "s0"}),
        make_record(1, {"session": "s1"}),
        make_record(2, {"other": "x"}),
    ]
    gp = [make_record(3, {"user": "u3"}, graphpipe=True)]
    entries = [entry(r) for r in basic + gp]
    try:
        assert await sink.send(entries) == []
    finally:
        await sink.close()
    got = await read_topic(broker.bootstrap, topic, expect=3)
    got_gp = await read_topic(broker.bootstrap, topic + ".gp", expect=1)
    assert sorted(((r.key, r.value) for r in got), key=str) == sorted(
        [(b"u0|s0", entries[0].value), (b"s1", entries[1].value), (None, entries[2].value)], key=str
    )
    assert [(r.key, r.value) for r in got_gp] == [(b"u3", entries[3].value)]


async def test_entries_over_several_record_batches_arrive_once_on_their_keys_partitions(broker: KafkaBroker, topic: str) -> None:
    # 400 events of ~3 KB: more than one 512 KiB record batch per partition.
    entries = [entry(make_record(i, {"user": f"u{i % 37}"}, pad=3000)) for i in range(400)]
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    try:
        assert await sink.send(entries) == []
    finally:
        await sink.close()
    got = await read_topic(broker.bootstrap, topic, expect=400)
    assert request_ids(got) == Counter(f"req-{i}" for i in range(400))
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
    finally:
        await producer.stop()
    consumer_view = {r.key: r.partition for r in got}
    assert len(consumer_view) == 37 and len(set(consumer_view.values())) == len(partitions) > 1
    for key, partition in consumer_view.items():
        assert partition == DefaultPartitioner()(key, partitions, partitions)
    # Within one key, events keep the order they were handed over in.
    for key in consumer_view:
        ids = [int(pb.PredictionEvent.FromString(r.value).requestId.split("-")[1]) for r in got if r.key == key]
        assert ids == sorted(ids)


async def test_start_raises_promptly_without_broker() -> None:
    sink = kafka_sink(f"127.0.0.1:{free_port()}", "nowhere")
    started = time.monotonic()
    with pytest.raises((KafkaConnectionError, TimeoutError)):
        await sink.start()
    assert time.monotonic() - started < sink.delivery_timeout_s + 1
    assert not sink.connected
    assert await sink.send([entry(make_record(1))]) != []


@pytest.mark.slow
async def test_broker_death_mid_run_hands_back_everything_then_fresh_producer_delivers_once(
    broker: KafkaBroker, topic: str
) -> None:
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    first_producer = sink._producer
    try:
        assert await sink.send([entry(make_record(i, {"user": f"u{i}"})) for i in range(5)]) == []
        await asyncio.to_thread(broker.stop)
        lost = [entry(make_record(i, {"user": f"u{i}"})) for i in range(5, 55)]
        started = time.monotonic()
        failed = await sink.send(lost)
        assert time.monotonic() - started < sink.delivery_timeout_s + 1.0
        assert failed == lost  # every entry, in order
        assert not sink.connected
        assert await sink.send(lost[:3]) == lost[:3]  # a broken producer is not used again

        await asyncio.to_thread(broker.restart)
        await sink.start()
        assert sink.connected and sink._producer is not first_producer
        assert await sink.send(failed) == []
    finally:
        await sink.close()
    ids = request_ids(await read_topic(broker.bootstrap, topic, expect=55))
    assert ids == Counter(f"req-{i}" for i in range(55))


@pytest.mark.slow
async def test_recovers_after_the_broker_process_is_killed_and_comes_back_empty(broker: KafkaBroker, topic: str) -> None:
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    try:
        assert await sink.send([entry(make_record(0))]) == []
        await asyncio.to_thread(broker.stop, lose_data=True)
        assert not broker.running
        batch = [entry(make_record(i)) for i in range(1, 11)]
        assert await sink.send(batch) == batch
        await asyncio.to_thread(broker.restart)  # a new tansu process: new cluster state, no data
        await sink.start()
        assert await sink.send(batch) == []
    finally:
        await sink.close()
    assert request_ids(await read_topic(broker.bootstrap, topic, expect=10)) == Counter(f"req-{i}" for i in range(1, 11))


@pytest.mark.slow
async def test_send_is_bounded_when_the_broker_hangs(broker: KafkaBroker, topic: str) -> None:
    sink = kafka_sink(broker.bootstrap, topic, request_timeout_ms=1500)
    await sink.start()
    try:
        assert await sink.send([entry(make_record(0))]) == []
        broker.pause()  # connections stay open, nothing answers
        batch = [entry(make_record(i)) for i in range(1, 40)]
        started = time.monotonic()
        failed = await sink.send(batch)
        elapsed = time.monotonic() - started
        assert failed == batch
        assert elapsed < sink.delivery_timeout_s + 1.0
        started = time.monotonic()
        await sink.close()
        assert time.monotonic() - started < 6.0
        broker.resume()
        await sink.start()
        assert await sink.send(failed) == []
    finally:
        broker.resume()
        await sink.close()
    # A request the hung broker received may be written once it answers again: at least once.
    ids = request_ids(await read_topic(broker.bootstrap, topic, expect=40))
    assert set(ids) == {f"req-{i}" for i in range(40)}


@pytest.mark.slow
async def test_cut_short_send_is_not_delivered_later_and_close_is_bounded(broker: KafkaBroker, topic: str) -> None:
    # A long request timeout: aiokafka itself would keep the batches alive through the outage.
    sink = kafka_sink(broker.bootstrap, topic, request_timeout_ms=10000)
    await sink.start()
    assert await sink.send([entry(make_record(0))]) == []
    await asyncio.to_thread(broker.stop)
    # A send cut short (PredictionLog.close cancels its drain at the deadline and counts these
    # entries as dropped) must not leave them in the producer to go out when the broker returns.
    task = asyncio.create_task(sink.send([entry(make_record(i)) for i in range(1, 20)]))
    await asyncio.sleep(0.3)  # let the producer take them
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(broker.restart)
    # aiokafka retries every 100 ms; an undiscarded batch would land within this window.
    assert request_ids(await read_topic(broker.bootstrap, topic, expect=2, timeout_s=3)) == Counter(["req-0"])
    await asyncio.to_thread(broker.stop)
    started = time.monotonic()
    await sink.close()
    assert time.monotonic() - started < 3.0


async def test_oversized_event_is_counted_not_retried(broker: KafkaBroker, topic: str) -> None:
    sink = kafka_sink(broker.bootstrap, topic, max_request_size=2000)
    await sink.start()
    big, small = entry(make_record(1, pad=5000)), entry(make_record(2))
    try:
        assert await sink.send([big, small]) == []
    finally:
        await sink.close()
    assert sink.rejected == 1
    assert request_ids(await read_topic(broker.bootstrap, topic, expect=1)) == Counter(["req-2"])


def test_from_settings_and_validation() -> None:
    settings = Settings(
        kafka_bootstrap_servers="127.0.0.1:1",
        kafka_topic="a",
        kafka_gp_topic="a.gp",
        kafka_compression="none",
        kafka_acks="1",
        kafka_enable_idempotence=False,
        kafka_request_timeout_ms=1234,
    )
    sink = KafkaSink.from_settings(settings)
    assert (sink.bootstrap_servers, sink.topic, sink.gp_topic) == ("127.0.0.1:1", "a", "a.gp")
    assert (sink.compression, sink.acks) == ("none", "1")
    assert (sink.enable_idempotence, sink.request_timeout_ms) == (False, 1234)
    with pytest.raises(ValueError, match="acks=all"):
        KafkaSink("x:1", "a", "b", acks="1", enable_idempotence=True)
    with pytest.raises(ValueError, match="compression"):
        KafkaSink("x:1", "a", "b", compression="snappy")
    with pytest.raises(ValueError, match="kafka_compression"):
        Settings(kafka_compression="brotli")
    assert Settings().kafka_compression == "zstd"


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd"])
async def test_every_compression_reaches_a_consumer_intact(broker: KafkaBroker, topic: str, compression: str) -> None:
    entries = [entry(make_record(i, {"user": f"u{i % 3}"}, pad=200)) for i in range(30)]
    sink = kafka_sink(broker.bootstrap, topic, compression=compression)
    await sink.start()
    try:
        assert await sink.send(entries) == []
    finally:
        await sink.close()
    got = await read_topic(broker.bootstrap, topic, expect=30, settle_s=0.2)
    assert sorted(r.value for r in got) == sorted(e.value for e in entries)


# ---- logs tail --------------------------------------------------------------------------------------
async def _fill(broker: KafkaBroker, topic: str, records: list[PredictionRecord]) -> list[LogEntry]:
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    entries = [entry(r) for r in records]
    try:
        assert await sink.send(entries) == []
    finally:
        await sink.close()
    return entries


async def test_tail_from_beginning_prints_json_lines(broker: KafkaBroker, topic: str) -> None:
    records = [make_record(i, {"user": f"u{i % 3}", "session": "s"}) for i in range(12)]
    await _fill(broker, topic, records)
    out = io.StringIO()
    n = await tail(broker.bootstrap, topic, True, None, out, max_events=12, idle_timeout_s=10)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert n == len(lines) == 12
    by_id = {line["requestId"]: line for line in lines}
    assert set(by_id) == {f"req-{i}" for i in range(12)}
    line = by_id["req-4"]
    assert line["key"] == "u1|s"
    assert isinstance(line["partition"], int) and isinstance(line["offset"], int) and line["timestamp"] > 0
    assert line["servedRequest"] is True
    assert line["inferenceRequest"]["configs"] == {"user": "u1", "session": "s"}
    assert line["fqrv"]["releaseVersion"] == "v1.2"


async def test_tail_filters_by_exact_key(broker: KafkaBroker, topic: str) -> None:
    records = [make_record(i, {"user": f"u{i % 3}"}) for i in range(9)] + [make_record(9, {"user": "u11"})]
    await _fill(broker, topic, records)
    out = io.StringIO()
    n = await tail(broker.bootstrap, topic, True, "u1", out, idle_timeout_s=1.5)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert n == 3
    assert sorted(line["requestId"] for line in lines) == ["req-1", "req-4", "req-7"]
    assert {line["key"] for line in lines} == {"u1"}


async def test_tail_without_from_beginning_prints_only_new_events(broker: KafkaBroker, topic: str) -> None:
    await produce_raw(broker.bootstrap, topic, [(b"old", entry(make_record(i)).value) for i in range(6)])
    out = io.StringIO()
    task = asyncio.create_task(tail(broker.bootstrap, topic, False, None, out, max_events=3, idle_timeout_s=20))
    # The tail positions itself at some point; keep writing new events until it has seen three.
    i = 100
    while not task.done():
        await produce_raw(broker.bootstrap, topic, [(b"new", entry(make_record(i)).value)])
        i += 1
        await asyncio.wait([task], timeout=0.2)
    assert await task == 3
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 3
    assert all(line["key"] == "new" and int(line["requestId"][4:]) >= 100 for line in lines)


async def test_tail_detects_graphpipe_topics(broker: KafkaBroker, topic: str) -> None:
    records = [make_record(i, {"user": "g"}, graphpipe=True) for i in range(3)]
    await _fill(broker, topic, records)
    out = io.StringIO()
    assert await tail(broker.bootstrap, topic + ".gp", True, None, out, max_events=3, idle_timeout_s=10) == 3
    lines = sorted((json.loads(line) for line in out.getvalue().splitlines()), key=lambda d: d["requestId"])
    assert [base64.b64decode(line["inferBytes"]) for line in lines] == [r.raw_request for r in records]
    assert [base64.b64decode(line["prediction"]["inferResponse"]) for line in lines] == [r.raw_response for r in records]


def test_run_tail_cli_arguments(broker: KafkaBroker, topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(_fill(broker, topic, [make_record(1, {"user": "a"}), make_record(2, {"user": "b"})]))
    parser = argparse.ArgumentParser()
    add_tail_arguments(parser)
    args = parser.parse_args(
        ["--bootstrap", broker.bootstrap, "--topic", topic, "--from-beginning", "--key", "b", "--idle-timeout", "1.5"]
    )
    assert run_tail(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["requestId"], line["key"]) for line in lines] == [("req-2", "b")]
    assert run_tail(parser.parse_args(["--bootstrap", f"127.0.0.1:{free_port()}", "--topic", topic])) == 1


async def test_partition_cache_follows_the_topics_partitions() -> None:
    class Partitions:  # stands in for the producer's metadata: only partitions_for() is read
        def __init__(self) -> None:
            self.current = {0, 1}

        async def partitions_for(self, topic: str) -> set[int]:
            return self.current

    sink, producer = KafkaSink("x:1", "a", "b", enable_idempotence=False), Partitions()
    keys = [f"customer-{i}".encode() for i in range(50)]
    known = await sink._partitions(producer, "a")
    assert [sink._partition(k, known) for k in keys] == [DefaultPartitioner()(k, [0, 1], [0, 1]) for k in keys]
    assert len(known[1]) == 50 and await sink._partitions(producer, "a") is known
    producer.current = {0, 1, 2, 3}  # partitions added: no key keeps a cached answer
    grown = await sink._partitions(producer, "a")
    assert grown[1] == {} and grown[0] == [0, 1, 2, 3]
    assert [sink._partition(k, grown) for k in keys] == [DefaultPartitioner()(k, [0, 1, 2, 3], [0, 1, 2, 3]) for k in keys]
    assert sink._partition(None, grown) in (0, 1, 2, 3)


async def test_the_usual_batch_is_packed_as_the_general_loop_packs_it() -> None:
    class Partitions:  # stands in for the producer's metadata: only partitions_for() is read
        async def partitions_for(self, topic: str) -> set[int]:
            return {0, 1, 2}

    sink, producer = KafkaSink("x:1", "a", "b", enable_idempotence=False), Partitions()

    def packed(batches: list[Any]) -> list[Any]:
        return [(where, members, batch._body) for where, batch, members in batches]

    same = [entry(make_record(i, {"user": "u1"})) for i in range(20)]
    general = await sink._pack(producer, same, set())  # the key not cached yet: the general loop (caches it)
    assert await sink._pack_usual(producer, same) is not None
    assert packed(await sink._pack(producer, same, set())) == packed(general)
    # Anything else goes through the general loop.
    spread = [entry(make_record(i, {"user": f"u{i}"})) for i in range(20)]
    await sink._pack(producer, spread, set())  # every key cached now, on more than one partition
    assert len({where for where, _, _ in await sink._pack(producer, spread, set())}) > 1
    assert await sink._pack_usual(producer, spread) is None
    assert await sink._pack_usual(producer, [entry(make_record(0, {}))]) is None  # no key: a random partition
    assert await sink._pack_usual(producer, [*same, entry(make_record(1, {"user": "u1"}, graphpipe=True))]) is None
    # A batch of GraphPipe events alone: its own topic, packed as the general loop packs it.
    gp = [entry(make_record(i, {"user": "u1"}, graphpipe=True)) for i in range(20)]
    assert await sink._pack_usual(producer, gp) is None  # the key not cached for that topic yet
    general = await sink._pack(producer, gp, set())
    assert [where for where, _, _ in general] == [("b", general[0][0][1])]
    assert await sink._pack_usual(producer, gp) is not None
    assert packed(await sink._pack(producer, gp, set())) == packed(general)
    assert await sink._pack_usual(producer, []) is None


async def _cut(entries: list[LogEntry], batch_bytes: int | None = None) -> list[list[LogEntry]]:
    """The record batches of ``entries`` as the general loop cuts them (a sink without cached keys) and,
    checked to be the same batches, as _pack_usual cuts them (the keys cached by then)."""

    class Partitions:  # stands in for the producer's metadata: only partitions_for() is read
        async def partitions_for(self, topic: str) -> set[int]:
            return {0, 1, 2}

    sink, producer = KafkaSink("x:1", "a", "b", enable_idempotence=False), Partitions()
    if batch_bytes is not None:
        sink._batch_bytes = batch_bytes
    ratios = dict(sink._ratio)
    general = [(where, members, batch._body) for where, batch, members in await sink._pack(producer, entries, set())]
    sink._ratio = ratios  # as the general loop found it: both cut at the same place
    usual = await sink._pack_usual(producer, entries)
    assert usual is not None
    assert [(where, members, batch._body) for where, batch, members in usual] == general
    return [members for _, members, _ in general]


@pytest.mark.parametrize("seed", range(6))
async def test_a_batch_past_one_record_batch_is_cut_where_the_general_loop_cuts_it(seed: int) -> None:
    """Events of one partition worth several record batches: _pack_usual cuts them by bisection where
    the general loop, a step per event, cuts them."""
    rng = random.Random(seed)
    pads = [rng.choice([0, 10, 3000, 9000, 40000]) for _ in range(rng.randint(1, 120))]
    entries = [entry(make_record(i, {"user": "u1"}, pad=pad, graphpipe=seed % 2 == 1)) for i, pad in enumerate(pads)]
    batches = await _cut(entries)
    assert [e for members in batches for e in members] == entries


async def test_a_record_batch_filled_to_the_byte_is_cut_after_its_last_event() -> None:
    entries = [entry(make_record(i, {"user": "u1"})) for i in range(3)]
    exact = 61 + sum(e.size + 24 - EVENT_OVERHEAD_BYTES for e in entries[:2])  # the header and the first two records
    assert [len(members) for members in await _cut(entries, exact)] == [2, 1]
    assert [len(members) for members in await _cut(entries, exact - 1)][0] == 1
    assert [len(members) for members in await _cut(entries, 10)] == [1, 1, 1]  # a first record always fits


async def test_record_batches_hold_what_compresses_to_under_the_cap() -> None:
    """A topic whose events compress well gets fewer, larger record batches once its ratio is known; one whose
    events stop compressing is halved until each batch is under the cap, and cut at the cap from then on."""

    class Partitions:  # stands in for the producer's metadata: only partitions_for() is read
        async def partitions_for(self, topic: str) -> set[int]:
            return {0, 1, 2}

    sink, producer = KafkaSink("x:1", "a", "b", enable_idempotence=False), Partitions()
    cap = sink._batch_bytes
    compressible = [entry(make_record(i, {"user": "u1"}, pad=9000)) for i in range(200)]  # ~1.8 MB of records
    first = await sink._pack(producer, compressible, set())  # no ratio known: cut at the cap before compression
    assert len(first) == 4 and all(batch.records_bytes <= cap for _, batch, _ in first)
    second = await sink._pack(producer, compressible, set())
    assert len(second) == 1 and second[0][2] == compressible
    assert second[0][1].records_bytes > cap >= second[0][1].size()
    rng = random.Random(7)
    noise = [LogEntry(False, b"u1", rng.randbytes(9000)) for _ in range(200)]  # as much that does not compress
    halved = await sink._pack(producer, noise, set())
    assert [e for _, _, members in halved for e in members] == noise
    assert len(halved) == 4 and all(batch.size() <= cap for _, batch, _ in halved)
    assert sink._room("a") == cap
    cut = await sink._pack(producer, noise, set())  # cut before compression now, none halved
    assert [len(m) for _, _, m in cut] == [58, 58, 58, 26] and all(batch.records_bytes <= cap for _, batch, _ in cut)


async def test_a_record_batch_larger_than_the_cap_before_compression_arrives_whole(broker: KafkaBroker, topic: str) -> None:
    """600 events of ~9 KB that compress well: the second send packs its 300 (~2.7 MB before compression)
    in one record batch; the broker takes it and every event is read back once."""
    entries = [entry(make_record(i, {"user": "u1"}, pad=9000)) for i in range(600)]
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    try:
        assert await sink.send(entries[:300]) == []
        assert sink._room(topic) > 300 * 9000
        assert await sink.send(entries[300:]) == []
    finally:
        await sink.close()
    got = await read_topic(broker.bootstrap, topic, expect=600)
    assert request_ids(got) == Counter(f"req-{i}" for i in range(600))
    assert [r.value for r in got] == [e.value for e in entries]  # one partition: in order


async def test_refused_entry_then_partitions_timeout_is_counted_once(broker: KafkaBroker, topic: str) -> None:
    """A too-large basic event is refused, then looking up the GraphPipe topic's partitions times
    out: the refused one is counted once and not handed back (before: both, so the log's
    ``delivered`` went down by one and the event was refused and counted again on every retry)."""
    sink = kafka_sink(broker.bootstrap, topic, max_request_size=2000, request_timeout_ms=500)
    await sink.start()
    assert sink._producer is not None
    real = sink._producer.partitions_for

    async def stalled(name: str) -> Any:
        if name == sink.gp_topic:
            await asyncio.sleep(3600)
        return await real(name)

    sink._producer.partitions_for = stalled
    big, gp = entry(make_record(1, pad=5000)), entry(make_record(2, graphpipe=True))
    try:
        failed = await sink.send([big, gp])
    finally:
        await sink.close()
    assert failed == [gp] and sink.rejected == 1
    delivered = 2 - len(failed) - sink.rejected  # what PredictionLog computes from these
    assert delivered == 0


def test_missing_aiokafka_internals_refuse_to_start(tmp_path: Path) -> None:
    """Without a private attribute the sink needs, KafkaSink and ``forestflow serve`` refuse with one line."""
    script = (
        "import sys\n"
        "from aiokafka.producer.message_accumulator import MessageAccumulator\n"
        "del MessageAccumulator.fail_all\n"
        "from forestflow.cli import main\n"
        f"sys.exit(main(['serve', '--port', '0', '--grpc-port', '-1', '--data-dir', {str(tmp_path)!r}]))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "MessageAccumulator.fail_all" in lines[0], result.stderr


def test_missing_aiokafka_internals_refuse_the_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.producer.sender import Sender

    from forestflow.predlog.kafka_sink import KafkaInternalsChanged

    monkeypatch.delattr(Sender, "sender_task")
    with pytest.raises(KafkaInternalsChanged, match="Sender.sender_task"):
        kafka_sink("127.0.0.1:1", "t")
