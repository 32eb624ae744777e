"""PredictionLog end to end: Kafka (a real tansu broker, stopped and restarted) and the file sink."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from forestflow._proto import forestflow_pb2 as pb
from forestflow.predlog.encode import encode_event
from forestflow.predlog.file_sink import FileSink
from forestflow.predlog.log import LogEntry, PredictionLog
from forestflow.predlog.record import PredictionRecord
from tests.kafka_broker import KafkaBroker
from tests.predlog import FQ, columns_of, kafka_sink, make_record, read_topic, wait_for


def ids_in(records: list, graphpipe: bool = False) -> Counter[str]:
    message = pb.PredictionEventGP if graphpipe else pb.PredictionEvent
    return Counter(message.FromString(r.value).requestId for r in records)


async def delivered_all(plog: PredictionLog, timeout_s: float) -> None:
    """Wait until nothing is buffered (no batch in flight either)."""
    await wait_for(lambda: plog.stats.buffered == 0, timeout_s, f"the log to drain ({plog.stats})")


def assert_accounted(plog: PredictionLog) -> None:
    s = plog.stats
    assert s.produced == s.delivered + s.dropped + s.buffered, s


async def connected_log(broker: KafkaBroker, topic: str, capacity: int = 64 << 20, **kw: object) -> PredictionLog:
    """A started log whose sink has delivered one warm-up event (``req-warm``)."""
    plog = PredictionLog(kafka_sink(broker.bootstrap, topic), capacity, retry_backoff_s=0.2, **kw)
    plog.start()
    warm = make_record(0)
    warm.request_id = "req-warm"
    assert plog.emit(warm)
    await delivered_all(plog, 15)
    assert plog.stats.delivered == 1 and plog.stats.connected
    return plog


# ---- content ------------------------------------------------------------------------------------------
async def test_events_arrive_once_with_keys_and_intact_content(broker: KafkaBroker, topic: str) -> None:
    configs_for = [
        ({"user": "u{i}", "session": "s{i}", "extra": "e"}, "u{i}|s{i}"),
        ({"session": "s{i}"}, "s{i}"),  # missing key feature skipped
        ({"other": "o{i}"}, None),  # nothing matches: no key
    ]
    records: dict[str, tuple[PredictionRecord, str | None]] = {}
    plog = PredictionLog(kafka_sink(broker.bootstrap, topic), 64 << 20, retry_backoff_s=0.2)
    plog.start()
    for i in range(60):
        pattern, key = configs_for[i % 3]
        record = make_record(i, {k: v.format(i=i) for k, v in pattern.items()}, served=i % 4 != 0)
        if i == 59:  # a failed prediction is logged too, with its status and no prediction
            record.response, record.status, record.error, record.error_code = None, 503, "overloaded", "Overloaded"
        records[record.request_id] = (record, key.format(i=i) if key else None)
        assert plog.emit(record)
    gp_records = [make_record(100 + i, {"user": "g", "session": str(i)}, graphpipe=True) for i in range(4)]
    for record in gp_records:
        assert plog.emit(record)
    await delivered_all(plog, 20)
    await plog.close(5)
    assert plog.stats.delivered == 64 and plog.stats.dropped == 0

    got = await read_topic(broker.bootstrap, topic, expect=60)
    assert ids_in(got) == Counter(list(records))  # each exactly once
    for rec in got:
        event = pb.PredictionEvent.FromString(rec.value)
        record, key = records[event.requestId]
        i = int(event.requestId[4:])
        assert rec.key == (key.encode() if key else None)
        assert event.servedRequest is record.served
        assert dict(event.inferenceRequest.configs) == record.configs
        assert columns_of(event.inferenceRequest.schema, event.inferenceRequest.datum) == {
            "label": [f"row{i}"],
            "x": [i * 0.25],
            "n": [i * 1000],
        }
        assert list(event.loggingSettings.keyFeatures) == ["user", "session"]
        assert event.loggingSettings.keyFeaturesSeparator == "|"
        assert event.loggingSettings.logLevel == pb.FULL
        assert (event.fqrv.contract.organization, event.fqrv.contract.contract_number) == ("acme", 3)
        assert event.eventTimeMS == record.event_time_ms and event.protocol == "basic"
        if i == 59:
            assert (event.status, event.error, event.errorCode) == (503, "overloaded", "Overloaded")
            assert not event.HasField("prediction")
        else:
            assert event.status == 200 and not event.error
            assert columns_of(event.prediction.schema, event.prediction.datum) == {"score": [i * 2.5]}
            assert event.prediction.fqrv.release_version == FQ.release

    got_gp = await read_topic(broker.bootstrap, topic + ".gp", expect=4)
    assert ids_in(got_gp, graphpipe=True) == Counter(r.request_id for r in gp_records)
    by_id = {r.request_id: r for r in gp_records}
    for rec in got_gp:
        event = pb.PredictionEventGP.FromString(rec.value)
        record = by_id[event.requestId]
        assert rec.key == record.key.encode()
        assert event.inferBytes == record.raw_request
        assert event.prediction.inferResponse == record.raw_response
        assert event.prediction.fqrv.release_version == FQ.release


# ---- outages ------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_outage_within_buffer_delivers_everything_once(broker: KafkaBroker, topic: str) -> None:
    plog = await connected_log(broker, topic)
    for i in range(1000, 1500):
        assert plog.emit(make_record(i, {"user": "h"}))
    await delivered_all(plog, 15)
    await asyncio.to_thread(broker.stop)
    # 1,000 records emitted in two bursts while the log keeps failing to reach the broker: each burst
    # waits for one more failed send, so the outage spans retries however fast or slow the machine is.
    for burst in range(2):
        failures = plog.stats.send_failures
        for j in range(500):
            assert plog.emit(make_record(burst * 500 + j, {"user": f"u{j % 100}"}))  # accepted at once, never waits
        await wait_for(lambda failures=failures: plog.stats.send_failures > failures, 15, "another failed send")
    assert plog.stats.delivered == 501 and not plog.stats.connected
    await asyncio.to_thread(broker.restart)
    await delivered_all(plog, 30)
    await plog.close(5)
    assert (plog.stats.delivered, plog.stats.dropped) == (1501, 0)
    got = await read_topic(broker.bootstrap, topic, expect=1501)
    assert ids_in(got) == Counter([f"req-{i}" for i in range(1500)] + ["req-warm"])


async def test_broker_absent_at_startup_buffers_then_delivers(topic: str) -> None:
    late = KafkaBroker()  # its port is reserved but nothing listens yet
    try:
        plog = PredictionLog(kafka_sink(late.bootstrap, topic), 64 << 20, retry_backoff_s=0.2)
        plog.start()
        assert all(plog.emit(make_record(i)) for i in range(200))  # accepted at once: emit never waits for a broker
        await wait_for(lambda: plog.stats.send_failures >= 2, 10, "the log to try the absent broker")
        assert (plog.stats.delivered, plog.stats.buffered, plog.stats.connected) == (0, 200, False)
        await asyncio.to_thread(late.start)
        await delivered_all(plog, 30)
        await plog.close(5)
        assert (plog.stats.delivered, plog.stats.dropped) == (200, 0)
        got = await read_topic(late.bootstrap, topic, expect=200)
        assert ids_in(got) == Counter(f"req-{i}" for i in range(200))
    finally:
        late.cleanup()


async def test_overflow_beyond_buffer_counts_every_drop(broker: KafkaBroker, topic: str) -> None:
    plog = await connected_log(broker, topic, capacity=1 << 20)
    await asyncio.to_thread(broker.stop)
    accepted, refused = {"req-warm"}, set()
    for i in range(900):  # ~2.2 KB each: about twice what 1 MiB holds
        record = make_record(i, {"user": "u"}, pad=2000)
        (accepted if plog.emit(record) else refused).add(record.request_id)
        assert plog.stats.buffered_bytes <= plog.capacity_bytes
    assert len(refused) > 300 and len(accepted) > 300
    assert plog.stats.dropped_overflow == len(refused)
    await asyncio.to_thread(broker.restart)
    await delivered_all(plog, 30)
    await plog.close(5)
    stats = plog.stats
    assert stats.dropped == stats.produced - stats.delivered == len(refused)
    got = await read_topic(broker.bootstrap, topic, expect=stats.delivered)
    assert len(got) == stats.delivered
    assert ids_in(got) == Counter(accepted)


@pytest.mark.slow
@pytest.mark.parametrize("deadline_s", [0.8, 2.5])
async def test_close_with_broker_down_is_bounded_and_counts_the_rest(broker: KafkaBroker, topic: str, deadline_s: float) -> None:
    plog = await connected_log(broker, topic)
    await asyncio.to_thread(broker.stop)
    for i in range(300):
        assert plog.emit(make_record(i))
    # The sink gives up on a dead broker after ~2 s (request timeout): the short deadline cuts
    # the drain task off in the middle of that send, the long one while it reconnects.
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await plog.close(timeout_s=deadline_s)
    elapsed = time.monotonic() - started
    assert elapsed < deadline_s + max(1.0, deadline_s / 2) + 0.5  # drain deadline + the sink's close bound
    assert (plog.stats.delivered, plog.stats.dropped_shutdown, plog.stats.buffered) == (1, 300, 0)
    assert_accounted(plog)
    assert not plog.emit(make_record(999))  # closed: refused and counted
    assert_accounted(plog)
    # Nothing counted as dropped shows up once the broker is back.
    await asyncio.to_thread(broker.restart)
    assert ids_in(await read_topic(broker.bootstrap, topic, expect=2, timeout_s=3)) == Counter(["req-warm"])


async def test_close_never_connected_is_bounded(topic: str) -> None:
    absent = KafkaBroker()
    try:
        plog = PredictionLog(kafka_sink(absent.bootstrap, topic), 1 << 20, retry_backoff_s=0.2)
        plog.start()
        for i in range(50):
            assert plog.emit(make_record(i))
        await wait_for(lambda: plog.stats.send_failures >= 1, 10, "a failed connect")
        started = time.monotonic()
        await plog.close(timeout_s=1.0)
        assert time.monotonic() - started < 2.0
        assert (plog.stats.delivered, plog.stats.dropped_shutdown) == (0, 50)
        assert_accounted(plog)
    finally:
        absent.cleanup()


# ---- the file sink ------------------------------------------------------------------------------------
def _delimited(data: bytes) -> list[bytes]:
    """Split varint-length-delimited records (protobuf's writeDelimitedTo format)."""
    out, pos = [], 0
    while pos < len(data):
        size, shift = 0, 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        out.append(data[pos : pos + size])
        pos += size
    return out


async def _write_file_log(path: Path, fmt: str) -> tuple[list[PredictionRecord], list[PredictionRecord]]:
    basic = [make_record(i, {"user": f"u{i}"} if i % 2 else {}, pad=i * 50) for i in range(7)]
    gp = [make_record(10 + i, {"user": "g"}, graphpipe=True) for i in range(3)]
    plog = PredictionLog(FileSink(path, fmt), 1 << 20)
    plog.start()
    for record in basic[:3] + gp[:1] + basic[3:] + gp[1:]:
        assert plog.emit(record)
    await plog.close(5)
    assert (plog.stats.delivered, plog.stats.dropped) == (10, 0)
    return basic, gp


async def test_file_sink_jsonl(tmp_path: Path) -> None:
    basic, gp = await _write_file_log(tmp_path / "log" / "predictions.jsonl", "jsonl")
    lines = [json.loads(line) for line in (tmp_path / "log" / "predictions.jsonl").read_text().splitlines()]
    gp_lines = [json.loads(line) for line in (tmp_path / "log" / "predictions.gp.jsonl").read_text().splitlines()]
    assert [(d["topic"], d["key"], d["event"]["requestId"]) for d in lines] == [("basic", r.key, r.request_id) for r in basic]
    assert [(d["topic"], d["key"], d["event"]["requestId"]) for d in gp_lines] == [("graphpipe", "g", r.request_id) for r in gp]
    request = lines[5]["event"]["inferenceRequest"]
    assert request["configs"] == {"user": "u5"}
    assert {"type": "Float64", "fields": ["x"]} in request["schema"]
    assert lines[5]["event"]["prediction"]["datum"] == [{"tensors": [{"Float64": {"data": [12.5]}}]}]


async def test_file_sink_protobuf_length_delimited(tmp_path: Path) -> None:
    path = tmp_path / "predictions.pb"
    basic, gp = await _write_file_log(path, "protobuf")
    values = _delimited(path.read_bytes())
    gp_values = _delimited((tmp_path / "predictions.gp.pb").read_bytes())
    assert values == [encode_event(r) for r in basic]
    assert gp_values == [encode_event(r) for r in gp]
    assert [pb.PredictionEvent.FromString(v).requestId for v in values] == [r.request_id for r in basic]
    assert pb.PredictionEventGP.FromString(gp_values[0]).inferBytes == gp[0].raw_request


@pytest.mark.parametrize("events, pad", [(600, 10), (120, 40_000)], ids=["over-IOV_MAX-pieces", "thread-sized-batch"])
async def test_file_sink_batches_of_any_size_land_whole_and_in_order(tmp_path: Path, events: int, pad: int) -> None:
    """600 events are 1200 writev() pieces (more than one call); 120 padded ones are ~5 MB (the thread path)."""
    from forestflow.predlog.file_sink import INLINE_WRITE_BYTES, FileSink

    sink = FileSink(tmp_path / "p.jsonl")
    await sink.start()
    entries = [LogEntry(False, None, json.dumps({"i": i, "pad": "x" * pad}).encode()) for i in range(events)]
    assert (sum(len(e.value) for e in entries) > INLINE_WRITE_BYTES) == (pad > 10_000)
    assert await sink.send(entries) == []
    await sink.close()
    lines = (tmp_path / "p.jsonl").read_text().splitlines()
    assert [json.loads(line)["i"] for line in lines] == list(range(events))
