"""GraphPipe prediction events (PredictionEventGP) written in one C call, against the Python path.

The oracle is the way ``encode._event`` wrote a GraphPipe event before ``_ffwire.graphpipe_event``:
event_head()'s fields, then ``embedded(3, request)`` and, with an answer,
``embedded(1, embedded(1, answer) + embedded(2, fqrv))``. The C call copies the request's body and the
answer (bytes a client sent), so it is fuzzed: any body, any answer or none, any text and number.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import predlog_encode
from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs import _ffwire
from forestflow.codecs.ff_protobuf import embedded, fqrv_bytes
from forestflow.core.ids import FQRV, Contract
from forestflow.predlog.encode import _common_fields, _servable_fields, encode_event, kafka_entry
from forestflow.predlog.record import PredictionRecord
from tests.predlog import make_record
from tests.tiers import examples

FUZZ = settings(
    max_examples=examples(600), deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def oracle(record: PredictionRecord) -> bytes:
    """The event as the Python path wrote it (85afed0's ``encode._event`` for a GraphPipe record)."""
    assert record.raw_request is not None
    payload = _common_fields(record, _servable_fields(record.logging, record.fqrv))
    payload += embedded(3, record.raw_request)
    if record.raw_response is not None:
        payload += embedded(1, embedded(1, record.raw_response) + embedded(2, fqrv_bytes(record.fqrv)))
    return payload


texts = st.text(max_size=40) | st.sampled_from(["req-1", "ñandú", 'a"b', ""])
#: Bodies around the lengths where a length's varint grows (127/128 bytes, 16383/16384).
bodies = (
    st.binary(max_size=300)
    | st.integers(120, 135).map(lambda n: bytes(range(256))[:n] if n <= 256 else b"x" * n)
    | st.sampled_from([b"", b"x" * 16383, b"y" * 16384])
)
ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
fqrvs = st.builds(
    lambda org, project, n, release: FQRV(Contract(org, project, n), release),
    st.sampled_from(["acme", "o-_9", "o" * 128]),
    st.sampled_from(["p", "fraud"]),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["v1", "gbm", "r" * 128]),
)


@FUZZ
@given(
    served=st.booleans(),
    event_time=ints64,
    request_id=texts,
    latency=st.floats(allow_nan=True, allow_infinity=True),
    status=st.integers(-(2**31), 2**31 - 1),
    request=bodies,
    response=st.none() | bodies,
    error=st.sampled_from(["", "bad input"]),
    pinned=st.booleans(),
    trace_id=st.sampled_from(["", "0af7651916cd43dd8448eb211c80319c"]),
    fqrv=fqrvs,
)
def test_fuzzed_events_equal_the_python_path(
    served: bool,
    event_time: int,
    request_id: str,
    latency: float,
    status: int,
    request: bytes,
    response: bytes | None,
    error: str,
    pinned: bool,
    trace_id: str,
    fqrv: FQRV,
) -> None:
    record = dataclasses.replace(
        make_record(1, {"user": "u"}, graphpipe=True),
        fqrv=fqrv,
        served=served,
        event_time_ms=event_time,
        request_id=request_id,
        latency_ms=latency,
        status=status,
        raw_request=request,
        raw_response=response,
        error=error,
        error_code="InvalidInput" if error else "",
        pinned=pinned,
        trace_id=trace_id,
    )
    try:
        expected = oracle(record)
    except UnicodeEncodeError:  # a lone surrogate in the request id: neither path writes it
        with pytest.raises(UnicodeEncodeError):
            encode_event(record)
        return
    assert encode_event(record) == expected
    if 0 <= event_time < 253_402_300_800_000:  # a time the CloudEvents header can write (years 1970-9999)
        assert kafka_entry(record, record.key).value == expected


@pytest.mark.parametrize("rows", [1, 100])
def test_the_bench_event_parses_to_what_it_holds(rows: int) -> None:
    record = predlog_encode.records(rows).get("graphpipe")
    if record is None:
        pytest.skip("no graphpipe client to write the bench's request")
    event = pb.PredictionEventGP.FromString(encode_event(record))
    assert (event.inferBytes, event.prediction.inferResponse) == (record.raw_request, record.raw_response)
    assert event.prediction.fqrv.release_version == event.fqrv.release_version == record.fqrv.release
    assert (event.requestId, event.eventTimeMS, event.protocol) == (record.request_id, record.event_time_ms, "graphpipe")


def test_graphpipe_event_checks_its_arguments() -> None:
    good: list[Any] = [b"\x10\x01", 1700000000000, "req-1", b"", 1.5, 200, b"", b"req", b"resp", b"\x12\x00"]
    head = _ffwire.event_head(*good[:7])
    assert _ffwire.graphpipe_event(*good) == head + b"\x1a\x03req" + b"\x0a\x08" + b"\x0a\x04resp" + b"\x12\x00"
    assert _ffwire.graphpipe_event(*good[:8], None, b"\x12\x00") == head + b"\x1a\x03req"  # no answer: no prediction
    for at, bad, error in [
        (7, None, "argument 8 must be bytes, not NoneType"),
        (7, bytearray(b"r"), "argument 8 must be bytes, not bytearray"),
        (8, "resp", "argument 9 must be bytes, not str"),
        (9, None, "argument 10 must be bytes, not NoneType"),
    ]:
        args = list(good)
        args[at] = bad
        with pytest.raises(TypeError, match=error):
            _ffwire.graphpipe_event(*args)
    with pytest.raises(TypeError, match="takes exactly 10 arguments \\(11 given\\)"):
        _ffwire.graphpipe_event(*good, None)
