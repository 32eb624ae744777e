"""Bad GraphPipe requests come back as error entries (HTTP 200, our message), and the server keeps serving."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graphpipe import convert, remote

from forestflow._proto.graphpipe.Req import Req
from forestflow._proto.graphpipe.Type import Type
from tests.api_gp.helpers import GP_PATH, client, deploy, execute_multi, post_raw, raw_tensor_request, request_with_union_type
from tests.support import InProcessGateway, python_servable, serve_in_process

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

F64 = np.array([1.0, 2.0]).tobytes()


async def assert_still_serving(gw: InProcessGateway) -> None:
    _, double, _ = await execute_multi(gw.url + GP_PATH, [np.array([21.0])], ["x"])
    assert double.tolist() == [[42.0]]


async def test_client_errors_carry_our_message(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    uri = gw.url + GP_PATH
    cases: list[tuple[list[np.ndarray], list[str] | None, list[str] | None, str]] = [
        ([np.array([1.0])], ["nope"], None, "unknown input 'nope'; the model takes x, label"),
        ([np.array([1.0]), np.array(["a"])], ["x", "x"], None, "duplicate names"),
        ([np.array([1.0, 2.0]), np.array(["a"])], ["x", "label"], None, "disagree on the record count"),
        (
            [np.array([[1.0, 2.0]])],
            None,
            None,
            "expected one String tensor for categorical inputs and one numeric tensor for numeric inputs",
        ),
        (
            [np.array([[1.0, 2.0]]), np.array([["a"]])],
            None,
            None,
            "the numeric tensor has 2 values per record for 1 numeric input(s) (x)",
        ),
        ([np.array([[1.0]]), np.array([[2.0]])], None, None, "got an extra numeric one"),
        ([np.array([1.0])], ["x"], ["double", "nope"], "unknown output(s) nope; available: double, echo"),
        ([np.zeros((0, 1))], ["x"], None, "at least one record"),
    ]
    for inputs, names, outputs, message in cases:
        with pytest.raises(Exception) as caught:
            await execute_multi(uri, inputs, names, outputs)
        assert message in str(caught.value), (message, caught.value)
        assert "Traceback" not in str(caught.value)
    await assert_still_serving(gw)


async def test_malformed_flatbuffers_are_400_entries(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    valid = raw_tensor_request([(Type.Float64, [2], F64, None)], ["x"])
    huge_vector = bytearray(valid)
    cases: list[tuple[bytes, str]] = [
        (b"", "empty or too short"),
        (b"\x00\x01\x02", "empty or too short"),
        (b"\xff" * 64, "not a valid GraphPipe Request flatbuffer"),
        (valid[: len(valid) // 2], "not a valid GraphPipe Request flatbuffer"),
        (request_with_union_type(7), "expected an InferRequest or a MetadataRequest, got union type 7"),
        (request_with_union_type(Req.NONE), "got union type 0"),
        (raw_tensor_request([(Type.Float64, [3], F64, None)], ["x"]), "shape [3] needs 3 values, the tensor has 2"),
        (raw_tensor_request([(Type.Float64, [], F64, None)], ["x"]), "shape: required"),
        (raw_tensor_request([(Type.Float64, [-1, -1], F64, None)], ["x"]), "at most one -1"),
        (raw_tensor_request([(Type.Float64, [2], F64[:-1], None)], ["x"]), "not a whole number of Float64 values"),
        (raw_tensor_request([(Type.Null, [2], F64, None)], ["x"]), "unsupported tensor type Null"),
        (raw_tensor_request([(13, [2], F64, None)], ["x"]), "unsupported tensor type 13"),
        (raw_tensor_request([(Type.String, [2], None, [b"\xff\xfe"])], ["label"]), "needs 2 values, the tensor has 1"),
        (raw_tensor_request([(Type.Float64, [2], F64, None)], ["x", "label"]), "input_names has 2 name(s) for 1 input tensor(s)"),
        (raw_tensor_request([], []), "at least one tensor"),
        (raw_tensor_request([(Type.Float64, [2], F64, None)], [b"\xff"]), "input_names[0]: not valid UTF-8"),
    ]
    for body, message in cases:
        outputs, errors = await post_raw(gw, body)
        assert outputs == [] and len(errors) == 1, (message, errors)
        assert errors[0]["code"] == 400, (message, errors)
        assert message in errors[0]["message"].decode(), (message, errors)
    # The data vector's length prefix set to 2^31 in an otherwise valid request: refused, not looped over.
    data_at = bytes(huge_vector).find(struct.pack("<I", len(F64)) + F64)
    assert data_at > 0
    huge_vector[data_at : data_at + 4] = struct.pack("<I", 2**31)
    _, errors = await post_raw(gw, bytes(huge_vector))
    assert errors[0]["code"] == 400 and b"does not fit" in errors[0]["message"]
    await assert_still_serving(gw)


async def test_scoring_failures_and_unknown_contracts_are_entries_with_their_status(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    with pytest.raises(Exception, match="the model failed to score the request"):
        await execute_multi(gw.url + GP_PATH, [np.array([1.0])], ["x"], config="fail:yes")
    request = bytes(convert.serialize_infer_request(convert.InferReq("fail:1", [np.array([1.0])], ["x"], None)))
    _, errors = await post_raw(gw, request)
    assert errors[0]["code"] == 500 and b"Traceback" not in errors[0]["message"]
    _, errors = await post_raw(gw, request, "/nobody/here/3/gp")
    assert errors == [{"code": 404, "message": b"unknown contract nobody.here.3"}]
    async with gw.session.post(gw.url + GP_PATH, data=request, headers={"X-Request-Timeout-Ms": "soon"}) as r:
        _, errors = convert.deserialize_infer_response(await r.read())
    assert errors[0]["code"] == 400 and b"X-Request-Timeout-Ms" in errors[0]["message"]
    await assert_still_serving(gw)


async def test_deadline_is_a_504_entry(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    request = bytes(convert.serialize_infer_request(convert.InferReq("sleep:1", [np.array([1.0])], ["x"], None)))
    async with gw.session.post(gw.url + GP_PATH, data=request, headers={"X-Request-Timeout-Ms": "100"}) as r:
        assert r.status == 200
        _, errors = convert.deserialize_infer_response(await r.read())
    assert errors[0]["code"] == 504


async def test_metadata_without_an_active_release_answers_at_once(gw: InProcessGateway) -> None:
    settings = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    async with gw.session.post(gw.url + "/contract/acme/demo/1", json=settings) as r:
        assert r.status == 200
    metadata_request = bytes(convert.serialize_metadata_request())
    started = time.monotonic()
    _, errors = await post_raw(gw, metadata_request)  # ForestFlow hung here for 240 s
    assert time.monotonic() - started < 30  # at once, not after ForestFlow's 240 s ask timeout
    assert errors == [{"code": 422, "message": b"no active servable for contract acme.demo.1"}]
    await deploy(gw, python_servable(validity=[{"NeverValid": {}}]))
    # Nothing answers, but a loaded release describes the contract (the one definition V2 uses too).
    meta: Any = await client(remote.metadata, gw.url + GP_PATH)
    assert meta.Version() == b"acme.demo.1.v1"
    await deploy(gw, python_servable(release="v2"))
    meta = await client(remote.metadata, gw.url + GP_PATH)
    assert meta.Version() == b"acme.demo.1.v2"


async def test_concurrent_garbage_does_not_disturb_good_requests(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    good = [execute_multi(gw.url + GP_PATH, [np.array([float(i)])], ["x"]) for i in range(10)]
    bad = [post_raw(gw, bytes([i]) * (8 + i)) for i in range(10)]
    results = await asyncio.gather(*good, *bad)
    assert [r[1].tolist() for r in results[:10]] == [[[2.0 * i]] for i in range(10)]
    assert all(r[1][0]["code"] == 400 for r in results[10:])


async def test_a_body_over_the_limit_is_a_413_entry(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", max_body_bytes=4096) as gw:
        await deploy(gw, python_servable())
        _, errors = await post_raw(
            gw, bytes(convert.serialize_infer_request(convert.InferReq(None, [np.zeros(1000)], ["x"], None)))
        )
        assert errors == [{"code": 413, "message": b"request body over the limit of 4096 bytes"}]
        await assert_still_serving(gw)
