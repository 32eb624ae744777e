"""``_kafka_records.usual_entry``: the C path of PredictionLog.emit for the usual event writes the entry
the Python encoders write (key, value, headers, topic and size), and leaves every other record to them."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings, LogLevel
from forestflow.predlog._kafka_records import LogEntry
from forestflow.predlog.encode import (
    USUAL_JSONL,
    USUAL_KAFKA,
    USUAL_PROTOBUF,
    encode_event,
    encode_event_json,
    kafka_entry,
    usual_entry,
)
from forestflow.predlog.log import NO_HEADERS, PredictionLog
from forestflow.predlog.record import PredictionRecord, WireBody
from tests import tiers
from tests.predlog.test_encode_golden import golden_records

MODES = {"kafka": USUAL_KAFKA, "protobuf": USUAL_PROTOBUF, "jsonl": USUAL_JSONL}


def python_entry(record: PredictionRecord, mode: int) -> LogEntry:
    """The entry PredictionLog built before usual_entry (and still builds for any other record)."""
    key_text = record.logging.key_for(record.configs)
    if mode == USUAL_KAFKA:
        return kafka_entry(record, key_text)
    value = encode_event_json(record, key_text) if mode == USUAL_JSONL else encode_event(record)
    return LogEntry(record.raw_request is not None, None if key_text is None else key_text.encode(), value, NO_HEADERS)


def fields(entry: LogEntry) -> tuple[object, ...]:
    return (entry.graphpipe, entry.key, entry.value, entry.headers, entry.size)


def c_entry(record: PredictionRecord, mode: int) -> LogEntry | None:
    """usual_entry after the Python path has seen the record's protocol (its field is cached then)."""
    python_entry(record, mode)
    return usual_entry(record, mode)


@functools.lru_cache(maxsize=1)
def variants() -> dict[str, PredictionRecord]:
    """The golden records and what the C path must tell apart: shadows, keys, V2 bodies with binary
    tensors, gRPC, failures, pins, traces, feedback, pipelines, a time whose Kafka headers Python writes."""
    out = dict(golden_records())
    v2 = out["v2-wire-1"]
    graphpipe = out.get("graphpipe-1")
    one_key = LoggingSettings(LogLevel.FULL, ("reqid",))
    assert v2.response is not None
    answer = dict(v2.response.columns)
    out |= {
        "v2-shadow": dataclasses.replace(v2, served=False),
        "v2-no-key-feature": dataclasses.replace(v2, logging=LoggingSettings(LogLevel.FULL, ())),
        "v2-key-missing": dataclasses.replace(v2, configs={"other": "x"}),
        "v2-key-unicode": dataclasses.replace(v2, configs={"reqid": "caf\u00e9 \U0001f600"}, request_id="r\u00e9q"),
        "v2-two-key-features": dataclasses.replace(v2, logging=LoggingSettings(LogLevel.FULL, ("reqid", "x"), "|")),
        "v2-binary-request": dataclasses.replace(v2, request_json=WireBody.of(bytes(v2.request_json or b"") + b"\0" * 8, 40)),
        "v2-binary-answer": dataclasses.replace(v2, response_json=WireBody.of(bytes(v2.response_json or b""), 10)),
        "v2-grpc": dataclasses.replace(v2, protocol="v2-grpc"),
        "v2-no-answer": dataclasses.replace(v2, response_json=None),
        "v2-failed": dataclasses.replace(v2, error="model failed", error_code="ModelFailed", status=500, response=None),
        "v2-pinned": dataclasses.replace(v2, pinned=True),
        "v2-traced": dataclasses.replace(v2, trace_id="0af7651916cd43dd8448eb211c80319c"),
        "v2-feedback": dataclasses.replace(v2, feedback=1.0),
        "v2-before-1970": dataclasses.replace(v2, event_time_ms=-5),
        "v2-pipeline": dataclasses.replace(v2, response=Frame(answer, {"intermediate": {"x": np.array([1.0])}})),
        "v2-flavor-parameters": dataclasses.replace(v2, response=Frame(answer, {"unknown": ["a"]})),
        "score-other-fqrv": dataclasses.replace(out["score-1"], fqrv=FQRV.parse("a.b.2.c"), logging=one_key),
    }
    if graphpipe is not None:
        out["gp-shadow-1"] = dataclasses.replace(graphpipe, served=False)
    return out


#: The records the C path writes itself, per mode (the others return None and go to Python).
USUAL = {
    "kafka": {"v2-wire-1", "v2-wire-100", "v2-shadow", "v2-no-key-feature", "v2-key-missing", "v2-key-unicode"},
    "jsonl": {"score-1", "score-100", "v2-wire-1", "v2-wire-100", "v2-shadow", "v2-key-unicode", "score-other-fqrv"},
}
USUAL["protobuf"] = USUAL["kafka"] | {"v2-before-1970"}
USUAL["kafka"] |= {"v2-binary-request", "v2-binary-answer", "v2-grpc", "v2-no-answer", "v2-pipeline", "v2-flavor-parameters"}
USUAL["protobuf"] |= {"v2-binary-request", "v2-binary-answer", "v2-grpc", "v2-no-answer", "v2-pipeline", "v2-flavor-parameters"}
# /score answers (and V2 ones logged from their frames), written from the frames by _ffwire.message.
FRAMES = {"score-1", "score-100", "score-other-fqrv", "v2-frames-1", "v2-frames-100"}
USUAL["kafka"] |= FRAMES
USUAL["protobuf"] |= FRAMES
USUAL["jsonl"] |= {"v2-no-key-feature", "v2-key-missing", "v2-flavor-parameters", "v2-before-1970"}


@pytest.mark.parametrize("mode", MODES)
def test_the_c_path_writes_the_python_entry_and_leaves_the_rest_to_python(mode: str) -> None:
    records = variants()
    written = set()
    for name, record in records.items():
        entry = c_entry(record, MODES[mode])
        if entry is not None:
            assert fields(entry) == fields(python_entry(record, MODES[mode])), name
            written.add(name)
    expected = set(USUAL[mode])
    if "graphpipe-1" in records:  # with the graphpipe client the bench's GraphPipe records are usual everywhere
        expected |= {"graphpipe-1", "graphpipe-100", "gp-shadow-1", "gp-shadow-100", "gp-no-key-1", "gp-empty-1"}
        # A request id JSON escapes is left to orjson by the C line writer; a pipeline's extras to Python.
        expected |= {"gp-escaped-1", "gp-pipeline-1"} if mode != "jsonl" else set()
    assert written == expected


def test_a_protocol_first_seen_goes_to_python_which_caches_its_field() -> None:
    record = dataclasses.replace(variants()["v2-wire-1"], protocol="v2-never-seen-before")
    assert usual_entry(record, USUAL_KAFKA) is None
    python_entry(record, USUAL_KAFKA)
    entry = usual_entry(record, USUAL_KAFKA)
    assert entry is not None and fields(entry) == fields(python_entry(record, USUAL_KAFKA))


def test_a_servable_whose_settings_change_gets_its_new_fields() -> None:
    record = variants()["v2-wire-1"]
    before = c_entry(record, USUAL_KAFKA)
    changed = dataclasses.replace(record, logging=LoggingSettings(LogLevel.FULL, ("reqid",), "/"))
    after = c_entry(changed, USUAL_KAFKA)
    assert before is not None and after is not None
    assert fields(after) == fields(python_entry(changed, USUAL_KAFKA)) and after.value != before.value


def test_usual_entry_leaves_what_is_not_a_record_to_python_and_refuses_a_bad_mode() -> None:
    assert usual_entry(object(), USUAL_KAFKA) is None
    with pytest.raises(TypeError):
        usual_entry(variants()["v2-wire-1"], "0")
    with pytest.raises(ValueError):
        usual_entry(variants()["v2-wire-1"], 7)


@pytest.mark.parametrize("sink_encoding", ["jsonl", "protobuf", "kafka"])
def test_emit_buffers_the_c_paths_entry(sink_encoding: str) -> None:
    class Sink:
        name = "test"
        encoding = "jsonl" if sink_encoding == "jsonl" else "protobuf"
        cloudevents = sink_encoding == "kafka"

    log = PredictionLog(Sink(), 1 << 30)  # type: ignore[arg-type]  # never started: emit only
    records = variants()
    for record in records.values():
        assert log.emit(record)
    mode = MODES[sink_encoding]
    assert [fields(e) for e in log._queue] == [fields(python_entry(r, mode)) for r in records.values()]
    assert log.stats.produced == log.stats.buffered == len(records)


texts = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=tiers.examples(300), deadline=None)
@given(
    served=st.booleans(),
    request_id=texts,
    key=st.one_of(st.none(), texts),
    time_ms=st.integers(-(2**62), 2**62),
    latency=st.floats(allow_nan=False, allow_infinity=False, width=64),
    status=st.integers(0, 2**40),
    kind=st.sampled_from(["v2-wire-1", "score-1", "graphpipe-1", "v2-grpc", "v2-binary-request"]),
)
def test_random_fields_give_the_python_entry(
    served: bool, request_id: str, key: str | None, time_ms: int, latency: float, status: int, kind: str
) -> None:
    base = variants().get(kind)
    if base is None:  # graphpipe-1 without the graphpipe client
        return
    record = dataclasses.replace(
        base,
        served=served,
        request_id=request_id,
        configs={} if key is None else {"reqid": key},
        event_time_ms=time_ms,
        latency_ms=latency,
        status=status,
    )
    for mode in MODES.values():
        try:
            expected: tuple[object, ...] | type[Exception] = fields(python_entry(record, mode))
        except (OverflowError, ValueError) as exc:  # what Python cannot write (a time or status out of range)
            expected = type(exc)
        try:
            entry = usual_entry(record, mode)
        except (OverflowError, ValueError) as exc:  # refused by both (emit counts an encode error either way)
            assert isinstance(expected, type), (mode, exc)
            continue
        # None sends the record to Python, which writes it (or refuses it) as before.
        assert entry is None or fields(entry) == expected, mode


def test_a_key_that_is_not_text_goes_to_python() -> None:
    record = dataclasses.replace(variants()["v2-wire-1"], configs={"reqid": 5})  # type: ignore[dict-item]
    assert usual_entry(record, USUAL_KAFKA) is None and usual_entry(record, USUAL_JSONL) is None
