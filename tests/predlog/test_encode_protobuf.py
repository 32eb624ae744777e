"""The hand-assembled prediction events parse to exactly what the protobuf API builds field by field."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from forestflow._proto import forestflow_pb2 as pb
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings, LogLevel
from forestflow.predlog.encode import decode_event, encode_event
from forestflow.predlog.record import PredictionRecord
from tests.codecs.test_ff_protobuf import prediction_to_proto, request_to_proto
from tests.predlog import make_record
from tests.predlog.test_encode_json import records


def _fill_fqrv(message: Any, fqrv: FQRV) -> None:
    message.contract.organization = fqrv.contract.organization
    message.contract.project = fqrv.contract.project
    message.contract.contract_number = fqrv.contract.number
    message.release_version = fqrv.release


def event_to_proto(record: PredictionRecord) -> Any:
    """The oracle: the event built through the protobuf API."""
    event = pb.PredictionEventGP() if record.is_graphpipe else pb.PredictionEvent()
    event.servedRequest = record.served
    event.loggingSettings.logLevel = record.logging.log_level.value
    event.loggingSettings.keyFeatures.extend(record.logging.key_features)
    event.loggingSettings.keyFeaturesSeparator = record.logging.key_features_separator
    event.eventTimeMS = record.event_time_ms
    event.requestId = record.request_id
    _fill_fqrv(event.fqrv, record.fqrv)
    if record.pinned:
        event.pinned = True
    if record.feedback is not None:  # a feedback event: who answered, when, and the reward
        event.protocol = record.protocol
        event.feedback.reward = record.feedback
        return event
    event.latencyMs = record.latency_ms
    event.status = record.status
    if record.error:
        event.error = record.error
        event.errorCode = record.error_code
    event.protocol = record.protocol
    if record.trace_id:
        event.traceId = record.trace_id
    if record.is_graphpipe:
        event.inferBytes = record.raw_request
        if record.raw_response is not None:
            event.prediction.inferResponse = record.raw_response
            _fill_fqrv(event.prediction.fqrv, record.fqrv)
    else:
        event.inferenceRequest.CopyFrom(request_to_proto(record.request, record.configs))
        if record.response is not None:
            event.prediction.CopyFrom(prediction_to_proto(record.fqrv, record.response))
    return event


def more_records() -> list[PredictionRecord]:
    base = records()
    odd = dataclasses.replace(
        base[0],
        logging=LoggingSettings(LogLevel.SAMPLE, ("user", "sessión"), "::"),
        request_id="r" * 300,
        event_time_ms=2**41 + 7,
        latency_ms=0.0,
        status=-1,
        error="x" * 200,
        error_code="",
        protocol="",
    )
    traced = [dataclasses.replace(base[i], trace_id="4bf92f3577b34da6a3ce929d0e0e4736") for i in (0, 4)]
    pinned = dataclasses.replace(base[0], pinned=True)
    feedback = dataclasses.replace(base[0], protocol="feedback", feedback=-0.25, response=None, request_json=None)
    return [*base, odd, *traced, pinned, feedback, dataclasses.replace(feedback, pinned=True)]


@pytest.mark.parametrize(
    "record",
    more_records(),
    ids=[
        "ok",
        "vector",
        "failed",
        "shadow",
        "gp",
        "gp-failed",
        "odd",
        "traced",
        "gp-traced",
        "pinned",
        "feedback",
        "feedback-pinned",
    ],
)
def test_event_matches_protobuf_api(record: PredictionRecord) -> None:
    decoded = decode_event(encode_event(record), record.is_graphpipe)
    assert decoded == event_to_proto(record)
    # Every field the oracle sets is present on the wire, so consumers see the same presence.
    assert decoded.ListFields() == event_to_proto(record).ListFields()


def test_record_fields_keep_the_order_the_service_builds_them_in() -> None:
    # service.Gateway._log_outcome builds records positionally (keywords cost 3x on the request
    # path): a field moved or inserted in the middle would shift every value after it.
    assert [f.name for f in dataclasses.fields(PredictionRecord)] == [
        "fqrv",
        "served",
        "request",
        "configs",
        "logging",
        "request_id",
        "protocol",
        "event_time_ms",
        "latency_ms",
        "status",
        "response",
        "error",
        "error_code",
        "raw_request",
        "raw_response",
        "request_json",
        "response_json",
        "trace_id",
        "pinned",
        "feedback",
    ]


def test_uint64_values_past_int64_reach_consumers_as_their_digits() -> None:
    """In the request and the prediction of an event (they were negative Int64 values)."""
    big = np.array([2**64 - 1], dtype=np.uint64)
    record = dataclasses.replace(
        make_record(1),
        request=Frame.from_columns({"id": big, "x": np.array([1.0])}),
        response=Frame.from_columns({"hash": big - np.uint64(1), "n": np.array([3], dtype=np.uint64)}),
    )
    event = decode_event(encode_event(record))
    assert event == event_to_proto(record)
    assert [e.type for e in event.inferenceRequest.schema] == [pb.String, pb.Float64]
    assert list(event.inferenceRequest.datum[0].tensors[0].String.data) == [str(2**64 - 1)]
    assert list(event.prediction.datum[0].tensors[0].String.data) == [str(2**64 - 2)]
    assert list(event.prediction.datum[0].tensors[1].Int64.data) == [3]
