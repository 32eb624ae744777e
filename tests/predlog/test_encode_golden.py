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
    out |= graphpipe_records()
    return out


def graphpipe_records() -> dict[str, PredictionRecord]:
    """PredictionEventGP records beside the bench's (``graphpipe-1``, ``graphpipe-100``): a shadow copy,
    a failure, a pinned and traced answer, texts that JSON escapes, no key, an empty request, a pipeline's
    extras (pinned before the GraphPipe encoders' C rewrite, 2026-11-27, from 85afed0)."""
    bench = predlog_encode.records(100).get("graphpipe")
    if bench is None:  # no graphpipe client to write the request
        return {}
    small = predlog_encode.records(1)["graphpipe"]
    piped = Frame(dict(small.response.columns), {"metadata": {"steps": ["impute", "gbm"]}})  # type: ignore[union-attr]
    return {
        "gp-shadow-100": dataclasses.replace(bench, served=False, latency_ms=12.0625),
        "gp-failed-1": dataclasses.replace(
            small, response=None, raw_response=None, status=503, error="servable not ready", error_code="ServableNotReady"
        ),
        "gp-pinned-traced-1": dataclasses.replace(small, pinned=True, trace_id="0af7651916cd43dd8448eb211c80319c"),
        "gp-escaped-1": dataclasses.replace(small, request_id='r"\\\u00e9\n', configs={"reqid": 'caf\u00e9 "x"'}),
        "gp-no-key-1": dataclasses.replace(small, configs={}, event_time_ms=0, latency_ms=1e-7),
        "gp-empty-1": dataclasses.replace(small, raw_request=b"", raw_response=b""),
        "gp-pipeline-1": dataclasses.replace(small, response=piped),
    }


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


#: Written by the encoders as they were before the rewrite (a checkout of 38a5ca0); the GraphPipe
#: records' (``gp-*``, ``graphpipe-*``) by those of 85afed0, before the GraphPipe event's rewrite.
GOLDEN = {
    "gp-empty-1": "47ec0b646364f9d7e27f3664",
    "gp-escaped-1": "fa449aa3068550f70720aacc",
    "gp-failed-1": "f721f3d2772114970fcddabe",
    "gp-no-key-1": "8db5611addf17919c5236f3f",
    "gp-pinned-traced-1": "0a24b04777378a363ea5a3bb",
    "gp-pipeline-1": "2206e9f5fb292d007e6c224d",
    "gp-shadow-100": "283a585ac0e79f6115600865",
    "graphpipe-1": "32708ceae8647b163d0ffc60",
    "graphpipe-100": "184e4de227f5d34a4836382c",
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
