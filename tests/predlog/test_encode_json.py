"""The JSON line of the local log is exactly protobuf's JSON mapping of the same PredictionEvent."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

from forestflow.core.frame import Frame
from forestflow.predlog.encode import encode_event, encode_event_json, event_to_dict
from forestflow.predlog.record import PredictionRecord
from tests.predlog import make_record


def records() -> list[PredictionRecord]:
    ok = make_record(3, {"user": "u3"})
    vector = dataclasses.replace(
        make_record(4),
        response=Frame.from_columns({"label": ["a", "b"], "p": np.array([[0.25, 0.75], [0.5, 0.5]])}),
        request=Frame.from_columns({"x": np.array([1.0, 2.0]), "b": np.array([True, False])}),
    )
    failed = dataclasses.replace(
        make_record(5), response=None, status=504, error="deadline exceeded", error_code="DeadlineExceeded"
    )
    shadow = make_record(6, served=False)
    gp = make_record(7, {"user": "g"}, graphpipe=True)
    gp_failed = dataclasses.replace(
        make_record(8, graphpipe=True), raw_response=None, status=400, error="bad", error_code="InvalidInput"
    )
    return [ok, vector, failed, shadow, gp, gp_failed]


@pytest.mark.parametrize("record", records(), ids=["ok", "vector", "failed", "shadow", "gp", "gp-failed"])
def test_json_line_equals_protobuf_json_mapping(record: PredictionRecord) -> None:
    line = orjson.loads(encode_event_json(record))
    assert line["topic"] == ("graphpipe" if record.is_graphpipe else "basic")
    assert line["key"] == record.key
    assert line["event"] == event_to_dict(encode_event(record), record.is_graphpipe)


def test_basic_json_bodies_are_embedded_verbatim() -> None:
    request_json = (
        b'{"schema":[{"type":"Float64","fields":["x"]}],"datum":[{"tensors":[{"Float64":{"data":[3]}}]}],"configs":{"user":"u3"}}'
    )
    response_json = b'{"fqrv":{"releaseVersion":"r"},"schema":[],"datum":[]}'
    record = dataclasses.replace(make_record(3, {"user": "u3"}), request_json=request_json, response_json=response_json)
    event = orjson.loads(encode_event_json(record))["event"]
    assert event["inferenceRequest"] == orjson.loads(request_json)
    assert event["prediction"] == orjson.loads(response_json)
    # The protobuf event (Kafka) is still built from the frames.
    assert event_to_dict(encode_event(record))["inferenceRequest"]["configs"] == {"user": "u3"}
