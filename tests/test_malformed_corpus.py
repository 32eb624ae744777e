"""A malformed-input corpus for every front-end: never a 5xx, never a hang, and the gateway keeps serving.

One gateway process (a Python servable with a logging shadow, and a real H2O MOJO) takes, per
front-end (BASIC JSON and protobuf, V2 JSON and binary, V2 gRPC, GraphPipe): every truncation of
a valid body, values of the wrong type at every position of a valid body, invalid UTF-8, lying
binary sizes and random bytes, most generated with hypothesis (derandomized: the same cases every
run, so CI is stable). Each answer must be a 4xx with a message (a GraphPipe error entry with a
4xx code; a gRPC client-error status with details), or a success when the mutation happened to
leave a valid request. After each front-end's corpus a good request of every kind still succeeds,
and the gateway's log has no traceback.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
from graphpipe import convert
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forestflow._proto import forestflow_pb2 as pb
from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from tests.api.test_h2o_score import body as h2o_body
from tests.api.test_h2o_score import definition as h2o_definition
from tests.api.test_h2o_score import golden
from tests.api_gp.helpers import raw_tensor_request
from tests.support import GatewayProcess, free_port, python_servable, score_body
from tests.tiers import examples

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

H2O = "prostate_gbm_binomial"
SCORE = "/acme/demo/1/score"
H2O_SCORE = "/h2o/prostate-gbm-binomial/1/score"
V2 = "/v2/models/acme.demo.1/infer"
H2O_V2 = "/v2/models/h2o.prostate-gbm-binomial.1/infer"
GP = "/acme/demo/1/gp"
M = messages()
#: Each generated test runs this many cases (a few ms each; a fifth in the quick tier, tests/tiers.py).
CASES = settings(
    max_examples=examples(120),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CLIENT_ERRORS = {400, 404, 405, 409, 413, 415, 422}
GRPC_CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


# ---- the gateway -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("corpus")
    grpc_port = free_port()
    proc = GatewayProcess(base / "data", env={"FORESTFLOW_GRPC_PORT": str(grpc_port), "FORESTFLOW_ACCESS_LOG": "0"})
    proc.grpc_port = grpc_port
    proc.start(timeout_s=60)
    try:
        for body in (
            python_servable(release="v1", log_level="FULL"),
            python_servable(release="shadow", validity=[{"NeverValid": {}}], log_level="FULL"),
            h2o_definition(H2O),
        ):
            r = requests.post(proc.url + "/servable", json=body, timeout=120)
            assert r.status_code == 200, r.text
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def channel(gw: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as ch:
        yield ch


def post(gw: GatewayProcess, path: str, data: bytes, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(gw.url + path, data=data, headers=headers or {"Content-Type": "application/json"}, timeout=30)


def check_http(r: requests.Response, must_fail: bool = False) -> None:
    """A success (only when the case may be valid), or a 4xx with a JSON error message."""
    if r.status_code == 200 and not must_fail:
        return
    assert r.status_code in CLIENT_ERRORS, (r.status_code, r.text[:500])
    error = r.json().get("error")
    assert isinstance(error, str) and error and "Traceback" not in error, r.text[:500]


def check_gp(r: requests.Response, must_fail: bool = False) -> None:
    """GraphPipe: HTTP 200 always; an error entry with a 4xx code and a message, or an answer."""
    assert r.status_code == 200, r.text[:300]
    try:
        outputs, errors = convert.deserialize_infer_response(r.content)
    except Exception:  # the body was (or became) a MetadataRequest: a metadata answer
        assert not must_fail
        convert.deserialize_metadata_response(r.content)
        return
    if not errors:
        assert outputs and not must_fail
        return
    for error in errors:
        assert error["code"] in CLIENT_ERRORS, errors
        assert error["message"], errors


def check_grpc(call: Any, payload: bytes, must_fail: bool = False) -> None:
    try:
        call(payload, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in GRPC_CLIENT_ERRORS, (exc.code(), exc.details())
        assert exc.details()
        return
    assert not must_fail


def assert_still_serving(gw: GatewayProcess, channel: grpc.Channel) -> None:
    """A good request of every kind succeeds, and nothing unhandled reached the log."""
    ok = requests.post(gw.url + SCORE, json=score_body([2.0], configs={"reqid": "ok"}), timeout=30)
    assert ok.status_code == 200, ok.text
    ok = requests.post(gw.url + H2O_SCORE, json=h2o_body(H2O, golden(H2O)[:1], typed=True), timeout=30)
    assert ok.status_code == 200, ok.text
    ok = post(gw, V2, json.dumps(V2_BODY).encode())
    assert ok.status_code == 200, ok.text
    _, double, _ = convert.deserialize_infer_response(post(gw, GP, GP_BODY, {}).content)[0]
    assert double.tolist() == [[2.0], [4.0]]
    infer = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=None, response_deserializer=None)
    assert infer(GRPC_BODY, timeout=30)
    log = gw.log()
    assert "Traceback" not in log and "unhandled" not in log, log[-3000:]
    assert gw.proc is not None and gw.proc.poll() is None


# ---- valid bodies, the corpus's seeds --------------------------------------------------------------
BASIC_BODY = score_body([1.0, 2.0], labels=["a", "b"], configs={"reqid": "corpus"})
BASIC_PROTO = pb.InferenceRequest(
    schema=[pb.TensorSchema(type=pb.Float64, fields=["x"]), pb.TensorSchema(type=pb.String, fields=["label"])],
    datum=[pb.Datum(tensors=[pb.Tensor(Float64=pb.Float64Data(data=[1.0])), pb.Tensor(String=pb.StringData(data=["a"]))])],
    configs={"reqid": "corpus"},
).SerializeToString()
V2_BODY: dict[str, Any] = {
    "id": "corpus",
    "inputs": [
        {"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0, 2.0]},
        {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
    ],
    "parameters": {"reqid": "corpus"},
}
GP_BODY = raw_tensor_request(
    [(11, [2], struct.pack("<2d", 1.0, 2.0), None), (12, [2], None, [b"a", b"b"])], names=["x", "label"], config="reqid:gp"
)


def _grpc_request(**overrides: Any) -> Any:
    req = M["ModelInferRequest"](model_name=overrides.pop("model_name", "acme.demo.1"), id="corpus")
    req.inputs.add(name="x", datatype="FP64", shape=[2])
    req.inputs.add(name="label", datatype="BYTES", shape=[2])
    req.raw_input_contents.append(struct.pack("<2d", 1.0, 2.0))
    req.raw_input_contents.append(struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b")
    return req


GRPC_BODY = _grpc_request().SerializeToString()


def v2_binary(x: bytes, labels: bytes, x_size: int | None = None, label_size: int | None = None) -> tuple[bytes, int]:
    """A V2 binary-tensor body (JSON header + raw tensors) and its header length."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP64",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(x) if x_size is None else x_size},
                },
                {
                    "name": "label",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(labels) if label_size is None else label_size},
                },
            ],
        }
    ).encode()
    return header + x + labels, len(header)


GOOD_X = struct.pack("<2d", 1.0, 2.0)
GOOD_LABELS = struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b"

JSON_PATHS_BASIC: list[tuple[Any, ...]] = [
    (),
    ("schema",),
    ("schema", 0),
    ("schema", 0, "type"),
    ("schema", 0, "fields"),
    ("schema", 0, "fields", 0),
    ("schema", 1, "type"),
    ("datum",),
    ("datum", 0),
    ("datum", 0, "tensors"),
    ("datum", 0, "tensors", 0),
    ("datum", 0, "tensors", 0, "String"),
    ("datum", 0, "tensors", 0, "String", "data"),
    ("datum", 0, "tensors", 0, "String", "data", 0),
    ("datum", 1, "tensors", 1, "Float64", "data"),
    ("datum", 1, "tensors", 1, "Float64", "data", 0),
    ("configs",),
    ("configs", "reqid"),
]
JSON_PATHS_V2: list[tuple[Any, ...]] = [
    (),
    ("inputs",),
    ("inputs", 0),
    ("inputs", 0, "name"),
    ("inputs", 0, "datatype"),
    ("inputs", 0, "shape"),
    ("inputs", 0, "shape", 0),
    ("inputs", 0, "data"),
    ("inputs", 0, "data", 0),
    ("inputs", 1, "data"),
    ("inputs", 1, "data", 1),
    ("inputs", 1, "datatype"),
    ("inputs", 1, "parameters"),
    ("outputs",),
    ("parameters",),
    ("parameters", "content_type"),
    ("id",),
]


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of ``doc`` with the value at ``path`` replaced (the whole document for ())."""
    if not path:
        return value
    out = json.loads(json.dumps(doc))
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity tokens too: not JSON, must be a 400


# ---- BASIC JSON --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_basic_json_truncations_and_fixed_cases(gw: GatewayProcess, channel: grpc.Channel) -> None:
    valid = json.dumps(BASIC_BODY).encode()
    for path in (SCORE, H2O_SCORE):
        for cut in range(0, len(valid), 3):
            check_http(post(gw, path, valid[:cut]), must_fail=True)
    fixed = [
        b"\xff\xfe{}",
        valid.replace(b'"a"', b'"\xff\xfe"'),
        b"\xef\xbb\xbf" + valid,
        b"[]",
        b"null",
        b"1e999999",
        b'{"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": [1e400]}}]}]}',
        b'{"schema": [{"type": "Nope", "fields": ["x"]}], "datum": []}',
        b'{"schema": [{"type": "Float64", "fields": ["x", "x"]}], "datum": [{"tensors": [{"Float64": {"data": [1, 2]}}]}]}',
        b'{"schema": [{"type": "Int64", "fields": ["x"]}], '
        b'"datum": [{"tensors": [{"Int64": {"data": ["99999999999999999999999"]}}]}]}',
        b'{"schema": [{"type": "Byte", "fields": ["x"]}], "datum": [{"tensors": [{"Byte": {"data": ["%%%"]}}]}]}',
        b"[" * 100_000,
    ]
    for body in fixed:
        for path in (SCORE, H2O_SCORE):
            check_http(post(gw, path, body), must_fail=body not in (b"\xef\xbb\xbf" + valid,))
    assert_still_serving(gw, channel)


@CASES
@given(path=st.sampled_from(JSON_PATHS_BASIC), value=JSON_VALUES, h2o=st.booleans())
def test_basic_json_wrong_values_anywhere(gw: GatewayProcess, path: tuple[Any, ...], value: Any, h2o: bool) -> None:
    check_http(post(gw, H2O_SCORE if h2o else SCORE, dumps(replaced(BASIC_BODY, path, value))))


@CASES
@given(data=st.binary(max_size=300), h2o=st.booleans())
def test_basic_random_bytes_json_and_protobuf(gw: GatewayProcess, data: bytes, h2o: bool) -> None:
    path = H2O_SCORE if h2o else SCORE
    check_http(post(gw, path, data))
    check_http(post(gw, path, data, {"Content-Type": "application/x-protobuf"}))


# ---- BASIC protobuf ----------------------------------------------------------------------------------
@CASES
@given(cut=st.integers(0, len(BASIC_PROTO) - 1), at=st.integers(0, len(BASIC_PROTO) - 1), byte=st.integers(0, 255))
def test_basic_protobuf_truncated_and_mutated(gw: GatewayProcess, cut: int, at: int, byte: int) -> None:
    headers = {"Content-Type": "application/x-protobuf"}
    check_http(post(gw, SCORE, BASIC_PROTO[:cut], headers))
    mutated = bytearray(BASIC_PROTO)
    mutated[at] = byte
    check_http(post(gw, SCORE, bytes(mutated), headers))
    check_http(post(gw, H2O_SCORE, bytes(mutated), headers))


def test_basic_protobuf_fixed_cases(gw: GatewayProcess, channel: grpc.Channel) -> None:
    headers = {"Content-Type": "application/x-protobuf"}
    lying_length = b"\x12\xff\xff\xff\xff\x0f" + b"\x00" * 8  # datum field claiming 4 GB
    bad_utf8 = (
        pb.InferenceRequest(
            schema=[pb.TensorSchema(type=pb.String, fields=["label"])],
            datum=[pb.Datum(tensors=[pb.Tensor(String=pb.StringData(data=["a"]))])],
        )
        .SerializeToString()
        .replace(b"\x01a", b"\x01\xff")
    )
    for body in (lying_length, bad_utf8, b"\x08" * 50, b"\xff" * 64):
        check_http(post(gw, SCORE, body, headers), must_fail=True)
    assert_still_serving(gw, channel)


# ---- V2 JSON -----------------------------------------------------------------------------------------
def test_v2_json_truncations_and_fixed_cases(gw: GatewayProcess, channel: grpc.Channel) -> None:
    valid = json.dumps(V2_BODY).encode()
    for cut in range(0, len(valid), 3):
        check_http(post(gw, V2, valid[:cut]), must_fail=True)
    x = V2_BODY["inputs"][0]
    fixed = [
        {"inputs": [{**x, "shape": [-1]}]},
        {"inputs": [{**x, "shape": [2**62, 2**62]}]},
        {"inputs": [{**x, "shape": [3]}]},
        {"inputs": [{**x, "datatype": "FP128"}]},
        {"inputs": [{**x, "datatype": "UINT8", "data": [300, -1]}]},
        {"inputs": [{**x, "datatype": "BOOL", "data": ["yes", 2]}]},
        {"inputs": [{**x, "data": [[1.0], [2.0, 3.0]]}]},
        {"inputs": [x, x]},
        {"inputs": []},
        {"inputs": [{**x, "shape": [0]}]},
        {"inputs": [x], "outputs": [{"name": "nope"}]},
        {"inputs": [{**x, "parameters": {"binary_data_size": 16}}]},
    ]
    for doc in fixed:
        check_http(post(gw, V2, json.dumps(doc).encode()), must_fail=True)
    check_http(post(gw, V2, valid.replace(b'"a"', b'"\xff"')), must_fail=True)
    check_http(post(gw, "/v2/models/no.such.1/infer", valid), must_fail=True)
    check_http(post(gw, "/v2/models/..%2F..%2Fetc/infer", valid), must_fail=True)
    assert_still_serving(gw, channel)


@CASES
@given(path=st.sampled_from(JSON_PATHS_V2), value=JSON_VALUES, h2o=st.booleans())
def test_v2_json_wrong_values_anywhere(gw: GatewayProcess, path: tuple[Any, ...], value: Any, h2o: bool) -> None:
    check_http(post(gw, H2O_V2 if h2o else V2, dumps(replaced(V2_BODY, path, value))))


# ---- V2 binary ---------------------------------------------------------------------------------------
@CASES
@given(
    header_length=st.one_of(st.integers(-5, 400), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=6)),
    x_size=st.one_of(st.none(), st.integers(-5, 40), st.just(2**63)),
    label_size=st.one_of(st.none(), st.integers(-5, 40)),
    x=st.one_of(st.just(GOOD_X), st.binary(max_size=24)),
    labels=st.one_of(st.just(GOOD_LABELS), st.binary(max_size=16), st.just(struct.pack("<I", 2**31) + b"a")),
)
def test_v2_binary_lying_sizes(
    gw: GatewayProcess, header_length: int | str, x_size: int | None, label_size: int | None, x: bytes, labels: bytes
) -> None:
    body, real_length = v2_binary(x, labels, x_size, label_size)
    headers = {"Content-Type": "application/octet-stream"}
    check_http(post(gw, V2, body, {**headers, "Inference-Header-Content-Length": str(real_length)}))
    check_http(post(gw, V2, body, {**headers, "Inference-Header-Content-Length": str(header_length)}))


def test_v2_binary_good_body_still_scores(gw: GatewayProcess, channel: grpc.Channel) -> None:
    body, length = v2_binary(GOOD_X, GOOD_LABELS)
    r = post(gw, V2, body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)})
    assert r.status_code == 200, r.text
    assert_still_serving(gw, channel)


# ---- V2 gRPC -----------------------------------------------------------------------------------------
@CASES
@given(data=st.binary(max_size=200), cut=st.integers(0, len(GRPC_BODY) - 1))
def test_grpc_random_and_truncated_messages(gw: GatewayProcess, channel: grpc.Channel, data: bytes, cut: int) -> None:
    infer = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=None, response_deserializer=None)
    check_grpc(infer, data)
    check_grpc(infer, GRPC_BODY[:cut])
    meta = channel.unary_unary(f"/{SERVICE}/ModelMetadata", request_serializer=None, response_deserializer=None)
    check_grpc(meta, data)


@CASES
@given(
    shape=st.lists(st.integers(-3, 2**40), max_size=3),
    datatype=st.sampled_from(["FP64", "FP32", "INT64", "UINT8", "BOOL", "BYTES", "FP16", "NOPE", ""]),
    raw=st.binary(max_size=40),
    typed=st.lists(st.floats(allow_nan=True), max_size=4),
    model=st.sampled_from(["acme.demo.1", "h2o.prostate-gbm-binomial.1", "no.such.1", "../x", ""]),
)
def test_grpc_lying_tensors(
    gw: GatewayProcess, channel: grpc.Channel, shape: list[int], datatype: str, raw: bytes, typed: list[float], model: str
) -> None:
    infer = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=None, response_deserializer=None)
    req = _grpc_request(model_name=model)
    req.inputs[0].datatype = datatype
    del req.inputs[0].shape[:]
    req.inputs[0].shape.extend(shape)
    req.raw_input_contents[0] = raw
    check_grpc(infer, req.SerializeToString())
    typed_req = M["ModelInferRequest"](model_name=model)
    tensor = typed_req.inputs.add(name="x", datatype=datatype, shape=shape)
    tensor.contents.fp64_contents.extend(typed)
    check_grpc(infer, typed_req.SerializeToString())


def test_grpc_still_serving(gw: GatewayProcess, channel: grpc.Channel) -> None:
    assert_still_serving(gw, channel)


# ---- GraphPipe ---------------------------------------------------------------------------------------
@CASES
@given(
    data=st.binary(max_size=300),
    cut=st.integers(0, len(GP_BODY) - 1),
    at=st.integers(0, len(GP_BODY) - 1),
    byte=st.integers(0, 255),
)
def test_graphpipe_random_truncated_and_mutated(gw: GatewayProcess, data: bytes, cut: int, at: int, byte: int) -> None:
    check_gp(post(gw, GP, data, {}))
    check_gp(post(gw, GP, GP_BODY[:cut], {}), must_fail=True)
    mutated = bytearray(GP_BODY)
    mutated[at] = byte
    check_gp(post(gw, GP, bytes(mutated), {}))


@CASES
@given(
    gp_type=st.integers(0, 14),
    shape=st.lists(st.integers(-2, 2**40), max_size=3),
    data=st.one_of(st.none(), st.binary(max_size=40)),
    strings=st.one_of(st.none(), st.lists(st.binary(max_size=5), max_size=3)),
    names=st.lists(st.sampled_from([b"x", b"label", b"nope", b"\xff"]), max_size=3),
)
def test_graphpipe_lying_tensors(
    gw: GatewayProcess, gp_type: int, shape: list[int], data: bytes | None, strings: list[bytes] | None, names: list[bytes]
) -> None:
    check_gp(post(gw, GP, raw_tensor_request([(gp_type, shape, data, strings)], names), {}))


def test_graphpipe_still_serving(gw: GatewayProcess, channel: grpc.Channel) -> None:
    assert_still_serving(gw, channel)
