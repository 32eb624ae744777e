"""Prediction-log tests; this module holds their shared builders and a topic reader."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import LoggingSettings, LogLevel
from forestflow.predlog.kafka_sink import KafkaSink
from forestflow.predlog.record import PredictionRecord
from tests.support import wait_for  # noqa: F401  (shared helper, re-exported for these tests)

FQ = FQRV(Contract("acme", "predlog", 3), "v1.2")
#: Key = configs["user"] + "|" + configs["session"], names that are missing skipped.
LOGGING = LoggingSettings(LogLevel.FULL, ("user", "session"), "|")


def make_record(
    i: int,
    configs: dict[str, str] | None = None,
    *,
    graphpipe: bool = False,
    pad: int = 0,
    served: bool = True,
    logging: LoggingSettings = LOGGING,
) -> PredictionRecord:
    """Record ``i``: request id ``req-{i}``; a String, a Float64 and an Int64 input; one score out."""
    request = Frame.from_columns(
        {
            "label": [f"row{i}" + "x" * pad],
            "x": np.array([i * 0.25], dtype=np.float64),
            "n": np.array([i * 1000], dtype=np.int64),
        }
    )
    response = Frame.from_columns({"score": np.array([i * 2.5], dtype=np.float64)})
    return PredictionRecord(
        fqrv=FQ,
        served=served,
        request=request,
        configs=dict(configs or {}),
        logging=logging,
        request_id=f"req-{i}",
        protocol="graphpipe" if graphpipe else "basic",
        event_time_ms=1_700_000_000_000 + i,
        latency_ms=1.5,
        response=response,
        raw_request=b"\x10flatbuffer-request-%d" % i if graphpipe else None,
        raw_response=b"\x20flatbuffer-response-%d" % i if graphpipe else None,
    )


def logged_request_ids(path: Path) -> list[str]:
    """The request ids of a JSON-lines prediction log, in file order (every line must be an event)."""
    return [json.loads(line)["event"]["requestId"] for line in path.read_bytes().splitlines()]


def columns_of(schema: Any, datum: Any) -> dict[str, list[Any]]:
    """Rebuild ``{field: [values per record]}`` from a ForestFlow schema + datum (test decoder)."""
    columns: dict[str, list[Any]] = {f: [] for entry in schema for f in entry.fields}
    for record in datum:
        assert len(record.tensors) == len(schema)
        for entry, tensor in zip(schema, record.tensors):
            values = list(getattr(tensor, tensor.WhichOneof("sealed_value")).data)
            assert len(values) == len(entry.fields)
            for field, value in zip(entry.fields, values):
                columns[field].append(value)
    return columns


def kafka_sink(bootstrap: str, topic: str, gp_topic: str | None = None, **kw: Any) -> KafkaSink:
    """A sink for the test broker (tansu has no idempotent producer); short timeouts for speed."""
    kw.setdefault("request_timeout_ms", 2000)
    return KafkaSink(bootstrap, topic, gp_topic or topic + ".gp", enable_idempotence=False, **kw)


async def read_topic(
    bootstrap: str, topic: str, expect: int, timeout_s: float = 30.0, settle_s: float = 1.0
) -> list[ConsumerRecord]:
    """Every record of ``topic`` from the start: wait for ``expect`` of them, then ``settle_s``
    more to catch any extra (duplicates) that would follow."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        deadline = time.monotonic() + timeout_s
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            if time.monotonic() > deadline:
                return records
            await consumer.topics()
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await asyncio.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while len(records) < expect and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=300)).values():
                records.extend(batch)
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def produce_raw(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes]]) -> None:
    """Write records one batch each (tansu reports the end offset of multi-record batches wrong)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=0)
    await producer.start()
    try:
        for key, value in items:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()
