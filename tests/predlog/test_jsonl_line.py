"""The C writer of the usual JSON line (predlog/_jsonl.c) against orjson: the same bytes, or None.

The oracle is the dict orjson wrote these lines from before the C writer (the /score, V2 REST and
GraphPipe shapes of ``encode_event_json``, GraphPipe's flatbuffers as ``base64.b64encode`` text). The
writer reads request data (bodies, configs values as the key, request ids), so it is fuzzed here: any
text, any bytes, any float latency and 64-bit integer; the answer is the oracle's bytes or None (the
caller then builds the line with orjson).
"""

from __future__ import annotations

import base64
import dataclasses
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import predlog_encode
from forestflow.core.frame import Frame
from forestflow.predlog._jsonl import _set_simd, usual_line
from forestflow.predlog.encode import _servable_fields, _usual_line, encode_event_json, one_line_json
from forestflow.predlog.record import WireBody
from tests.tiers import examples

FUZZ = settings(
    max_examples=examples(600), deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

LOGGING = b'{"logLevel":"FULL","keyFeatures":["user"],"keyFeaturesSeparator":"."}'
FQRV = b'{"contract":{"organization":"acme","project":"fraud","contractNumber":1},"releaseVersion":"gbm"}'


def oracle(args: tuple[Any, ...]) -> bytes:
    """The line as orjson writes it from the dict display the log used before the C writer."""
    kind, key, request, response, served, logging, event_time, request_id, fqrv, latency, status, protocol = args
    if kind == 2:  # GraphPipe
        event = {
            "prediction": {"inferResponse": base64.b64encode(response).decode(), "fqrv": orjson.Fragment(fqrv)},
            "servedRequest": served,
            "inferBytes": base64.b64encode(request).decode(),
            "loggingSettings": orjson.Fragment(logging),
            "eventTimeMS": str(event_time),
            "requestId": request_id,
            "fqrv": orjson.Fragment(fqrv),
            "latencyMs": latency,
            "status": status,
            "protocol": protocol,
        }
        return orjson.dumps({"topic": "graphpipe", "key": key, "event": event})
    if not kind:
        event = {
            "prediction": orjson.Fragment(one_line_json(response)),
            "servedRequest": served,
            "inferenceRequest": orjson.Fragment(one_line_json(request)),
            "loggingSettings": orjson.Fragment(logging),
            "eventTimeMS": str(event_time),
            "requestId": request_id,
            "fqrv": orjson.Fragment(fqrv),
            "latencyMs": latency,
            "status": status,
            "protocol": protocol,
        }
    else:
        event = {
            "servedRequest": served,
            "loggingSettings": orjson.Fragment(logging),
            "eventTimeMS": str(event_time),
            "requestId": request_id,
            "fqrv": orjson.Fragment(fqrv),
            "latencyMs": latency,
            "status": status,
            "protocol": "v2",
            "wireRequest": orjson.Fragment(one_line_json(bytes(request))),
            "wireResponse": orjson.Fragment(one_line_json(bytes(response))),
        }
    return orjson.dumps({"topic": "basic", "key": key, "event": event})


def check(args: tuple[Any, ...]) -> bytes | None:
    """The C line of ``args`` (the latency as a number, as the oracle takes it), checked against the oracle."""
    line = usual_line(*args[:9], orjson.dumps(args[9]), *args[10:])
    if line is not None:
        assert line == oracle(args)
    return line


texts = st.text(max_size=40) | st.sampled_from(["u42", "7f3a", "ñandú", 'a"b', "a\\b", "tab\there", "\ud800", ""])
bodies = st.binary(max_size=300) | st.sampled_from([b'{"a": 1}', b'{\n  "a": [1,\r\n 2]\n}', b""])
latencies = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.4, 12.0, 1e-4, 1e-5, 123456.789, 1e16])
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(min_value=2**63, max_value=2**70)


@FUZZ
@given(
    kind=st.sampled_from([False, True, 0, 1, 2]),
    key=st.none() | texts,
    request=bodies,
    response=bodies,
    served=st.booleans(),
    event_time=ints,
    request_id=texts,
    latency=latencies,
    status=ints,
    protocol=texts,
)
def test_fuzzed_lines_equal_orjson_or_are_left_to_it(
    kind: int,
    key: str | None,
    request: bytes,
    response: bytes,
    served: bool,
    event_time: int,
    request_id: str,
    latency: float,
    status: int,
    protocol: str,
) -> None:
    check((kind, key, request, response, served, LOGGING, event_time, request_id, FQRV, latency, status, protocol))


@pytest.mark.parametrize("latency", [0.4, 0.0, 12.0, 0.8123456789, 999999.5, 1e15 + 0.5, 1e-05, math.nan])
def test_usual_values_are_written_in_c(latency: float) -> None:
    """The values a gateway's events carry take the C path (None would only cost time, but the test
    of the bytes above would then prove nothing)."""
    args = (False, "u42", b'{"a": 1}', b'{"b": 2}', True, LOGGING, 1_790_000_000_000, "7f3a", FQRV, latency, 200, "basic")
    assert check(args) is not None
    assert check((True, None, *args[2:])) is not None
    assert check((2, None, b"\x00\xff" * 50, b"\x10", *args[4:11], "graphpipe")) is not None


#: Base64's paths: AVX2 then SSSE3, SSSE3, the plain loop (a level the CPU lacks runs as the best it has).
SIMD_LEVELS = pytest.mark.parametrize("level", [2, 1, 0], ids=["avx2", "ssse3", "plain"])


@pytest.fixture
def simd(level: int) -> Any:
    """Base64 written at ``level`` for the test, the level before restored after it."""
    was = _set_simd(level)
    yield level
    _set_simd(was)


#: Lengths around base64's steps: 28 bytes read 24 at a time (AVX2), 16 read 12 at a time (SSSE3), 8 read
#: 6 at a time, then 3 at a time, then 1 or 2 padded.
@SIMD_LEVELS
def test_graphpipe_flatbuffers_are_base64_text(simd: int) -> None:
    for length in [*range(0, 60), 127, 128, 129, 7000, 7001, 7002]:
        request = bytes((i * 37 + 11) % 256 for i in range(length))
        response = request[::-1] + b"\xfb\xff"
        args = (2, "u42", request, response, False, LOGGING, 1_790_000_000_000, "7f3a", FQRV, 0.4, 200, "graphpipe")
        line = check(args)
        assert line is not None, length
        event = orjson.loads(line)["event"]
        assert base64.b64decode(event["inferBytes"], validate=True) == request, length
        assert base64.b64decode(event["prediction"]["inferResponse"], validate=True) == response, length


@SIMD_LEVELS
def test_fuzzed_graphpipe_lines_equal_orjson(level: int) -> None:
    @FUZZ
    @given(request=st.binary(max_size=600), response=st.binary(max_size=600))
    def lines(request: bytes, response: bytes) -> None:
        args = (2, "k", request, response, True, LOGGING, 1_790_000_000_000, "r", FQRV, 1.25, 200, "graphpipe")
        assert check(args) is not None

    was = _set_simd(level)
    try:
        lines()
    finally:
        _set_simd(was)


def test_simd_levels_are_capped_by_the_cpu() -> None:
    best = _set_simd(99)  # the import's choice: the CPU's best
    try:
        assert _set_simd(0) == best and best in (0, 1, 2)
        assert _set_simd(-5) == 0
        assert _set_simd(1) == 0 and _set_simd(1) == min(1, best)
    finally:
        _set_simd(best)


@pytest.mark.parametrize(
    "args",
    [
        (False, 'a"b', b"{}", b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic"),  # needs escaping
        (False, "k", b"{}", b"{}", True, LOGGING, 1, "r\n", FQRV, b"0.5", 200, "basic"),
        (False, "k", b"{}", b"{}", 1, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic"),  # served not a bool
        (False, "k", b"{}", b"{}", True, LOGGING, 2**64, "r", FQRV, b"0.5", 200, "basic"),
        (False, "\ud800", b"{}", b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic"),  # not UTF-8
        (False, "k", "{}", b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic"),  # a str body
        (2, "k", b"{}", None, True, LOGGING, 1, "r", FQRV, b"0.5", 200, "graphpipe"),  # no GraphPipe answer
        (2, "k", bytearray(b"{}"), b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "graphpipe"),  # not bytes
    ],
)
def test_what_orjson_writes_otherwise_is_left_to_it(args: tuple[Any, ...]) -> None:
    assert usual_line(*args) is None


def test_wrong_arguments_raise() -> None:
    with pytest.raises(TypeError):
        usual_line(False, "k")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        usual_line(False, "k", b"{}", b"{}", True, "not bytes", 1, "r", FQRV, b"0.5", 200, "basic")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        usual_line(False, "k", b"{}", b"{}", True, LOGGING, 1, "r", FQRV, 0.5, 200, "basic")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kind must be an int"):
        usual_line(None, "k", b"{}", b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic")  # type: ignore[arg-type]
    for kind in (-1, 3, 2**70):
        with pytest.raises((ValueError, OverflowError)):
            usual_line(kind, "k", b"{}", b"{}", True, LOGGING, 1, "r", FQRV, b"0.5", 200, "basic")


@pytest.mark.parametrize("rows", [1, 100])
def test_the_bench_events_are_written_in_c(rows: int) -> None:
    """The /score, V2 REST and GraphPipe events of the bench take the C path, and their lines are orjson's."""
    for name, record in predlog_encode.records(rows).items():
        if name == "v2-frames (before)":
            continue
        fields = _servable_fields(record.logging, record.fqrv)
        graphpipe = record.raw_request is not None
        args = (
            2 if graphpipe else isinstance(record.request_json, WireBody),
            record.key,
            record.raw_request if graphpipe else record.request_json,
            record.raw_response if graphpipe else record.response_json,
            record.served,
            fields.logging_json_bytes,
            record.event_time_ms,
            record.request_id,
            fields.fqrv_json_bytes,
            record.latency_ms,
            record.status,
            record.protocol,
        )
        line = check(args)
        assert line is not None
        assert encode_event_json(record) == line


def test_an_answer_with_parameters_of_its_own_is_still_usual() -> None:
    """A flavor's answer carries parameters of its own (H2O: unknown and missing inputs), which the
    line does not hold: the C line is the one of the same answer without them. What a pipeline adds
    (metadata, intermediate tensors) is written by the orjson path."""
    record = predlog_encode.records(1)["score"]
    assert record.response is not None
    plain = encode_event_json(record)
    with_own = dataclasses.replace(record, response=Frame(record.response.columns, {"unknown_inputs": [], "missing_inputs": []}))
    fields = _servable_fields(record.logging, record.fqrv)
    assert _usual_line(with_own, fields, False, record.key) == plain == encode_event_json(with_own)
    piped = dataclasses.replace(record, response=Frame(record.response.columns, {"metadata": {"steps": ["a"]}}))
    assert _usual_line(piped, fields, False, record.key) is None
    assert b'"metadata":{"steps":["a"]}' in encode_event_json(piped)
