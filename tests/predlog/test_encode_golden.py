"""The bytes the prediction log writes, pinned: Kafka records (key, PredictionEvent, CloudEvents
headers) and JSON lines are compared, by digest, with what the encoders wrote before their C rewrites
(issue 45, 2026-11-27: ``_ffwire.message``'s single text read, the C CloudEvents headers). Protobuf
parse-equality (test_encode_protobuf.py) would let a different but equivalent encoding through; a
consumer that hashes or deduplicates records would not."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from bench import predlog_encode
from forestflow.core.frame import Frame
from forestflow.predlog._kafka_records import records
from forestflow.predlog.cloudevents import record_headers
from forestflow.predlog.encode import encode_event, encode_event_json, kafka_entry
from forestflow.predlog.log import LogEntry
from forestflow.predlog.record import PredictionRecord
from tests.predlog import make_record
from tests.predlog.test_encode_json import records as json_records


def golden_records() -> dict[str, PredictionRecord]:
    """Records of every shape the log writes: the bench's /score and V2 requests at 1 and 100 rows,
    the JSON tests' records (vector output, failure, shadow, GraphPipe), a wide text-heavy frame."""
    out: dict[str, PredictionRecord] = {}
    for rows in (1, 100):
        for name, record in predlog_encode.records(rows).items():
            out[f"{name.split()[0]}-{rows}"] = record
    for i, record in enumerate(json_records()):
        out[f"json-{i}"] = record
    wide = {f"t{j}": np.array([f"level-{j}-{r % 7}" * (1 + r % 3) for r in range(40)], dtype=object) for j in range(12)}
    wide |= {f"i{j}": np.arange(40, dtype=np.int32) * (j - 5) for j in range(4)}
    wide["h"] = np.linspace(-2, 2, 40).astype(np.float16)
    out["wide-40"] = dataclasses.replace(make_record(9, {"user": "w", "session": "s"}), request=Frame.from_columns(wide))
    return out


def digest(record: PredictionRecord) -> str:
    """sha256 of the record's Kafka record (key, value, headers) and of its JSON line, hex, first 24."""
    key = record.key
    entry = LogEntry(
        record.is_graphpipe,
        None if key is None else key.encode(),
        encode_event(record),
        record_headers(record.fqrv.contract, record.served, record.request_id, record.event_time_ms),
    )
    kafka = records([entry])  # the batch header holds the time it was built: not compared
    return hashlib.sha256(kafka + b"\n" + encode_event_json(record)).hexdigest()[:24]


#: Written by the encoders as they were before the rewrite (a checkout of 38a5ca0).
GOLDEN = {
    "json-0": "e6d90449cfa473ec32e276c7",
    "json-1": "d42f0bd909d093566a85893a",
    "json-2": "393fc5741a191da47fb0a023",
    "json-3": "b6d5c2435fdd03fb186fbbdc",
    "json-4": "1715bfbf760cfa0170f048af",
    "json-5": "8a85e624e2b0dfb06561304b",
    "score-1": "4aa0fd129937cc68ce643e71",
    "score-100": "a0a5ca3fb966cdf2f6ec4c8e",
    "v2-frames-1": "0690db23c7ad33b7404d9034",
    "v2-frames-100": "5dffe6e3a49a874b143a4cb9",
    "v2-wire-1": "2f7eeb50108ec58e225916a8",
    "v2-wire-100": "097639bd0423c86aa7364216",
    "wide-40": "e7414518e87bd75b0371e61c",
}


@pytest.mark.parametrize("name", sorted(golden_records()))
def test_the_log_writes_the_bytes_it_wrote_before(name: str) -> None:
    assert digest(golden_records()[name]) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(golden_records()))
def test_the_kafka_entry_the_log_builds_is_the_pinned_record(name: str) -> None:
    # emit() builds Kafka entries with kafka_entry (the servable's fields looked up once for event
    # and headers): the same key, value and headers as the pinned record above.
    record = golden_records()[name]
    key = record.key
    entry = kafka_entry(record, key)
    assert (entry.graphpipe, entry.key, entry.value, entry.headers) == (
        record.is_graphpipe,
        None if key is None else key.encode(),
        encode_event(record),
        record_headers(record.fqrv.contract, record.served, record.request_id, record.event_time_ms),
    )
    assert hashlib.sha256(records([entry]) + b"\n" + encode_event_json(record)).hexdigest()[:24] == GOLDEN[name]
    # Before 1970 C writes no ce_time: the headers come from Python, the rest is unchanged.
    early = dataclasses.replace(record, event_time_ms=-1)
    assert kafka_entry(early, key).headers == record_headers(early.fqrv.contract, early.served, early.request_id, -1)
