"""Errors raised inside model code are the server's (500 PredictionFailed, logged with type and
traceback) on every HTTP front-end; a servable answering the wrong number of rows is a 500 naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.support import InProcessGateway, python_servable, score_body

SERVABLES = Path(__file__).with_name("servables")


async def deploy_raising(gw: InProcessGateway) -> None:
    body = python_servable(directory=SERVABLES, module="raising.py")
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()


async def post(gw: InProcessGateway, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with gw.session.post(gw.url + path, json=body) as r:
        return r.status, await r.json()


def requests_for(label: str) -> list[tuple[str, str, Any]]:
    """The same two-row request on BASIC, V2 REST and V1 (front-end, path, body)."""
    return [
        ("basic", "/acme/demo/1/score", score_body([1.0, 2.0], [label, "ok"])),
        (
            "v2",
            "/v2/models/acme.demo.1/infer",
            {
                "inputs": [
                    {"name": "label", "datatype": "BYTES", "shape": [2], "data": [label, "ok"]},
                    {"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0, 2.0]},
                ]
            },
        ),
        ("v1", "/v1/models/acme.demo.1:predict", {"instances": [{"label": label, "x": 1.0}, {"label": "ok", "x": 2.0}]}),
    ]


@pytest.mark.parametrize("label", ["value", "key", "type"])
async def test_model_code_errors_are_500_prediction_failed_and_logged(gw: InProcessGateway, label: str) -> None:
    await deploy_raising(gw)
    for front_end, path, body in requests_for(label):
        with structlog.testing.capture_logs() as logs:
            status, payload = await post(gw, path, body)
        assert status == 500, (front_end, payload)
        assert "on purpose" not in str(payload), payload  # the model's own text stays in the log
        if front_end == "basic":
            assert payload["code"] == "PredictionFailed", payload
        failed = [e for e in logs if e["event"] == "predict_failed"]
        assert len(failed) == 1, (front_end, logs)
        expected = {"value": "ValueError", "key": "KeyError", "type": "TypeError"}[label]
        assert failed[0]["exception_type"] == expected and failed[0]["error_code"] == "PredictionFailed"
        assert isinstance(failed[0]["exc_info"], BaseException)  # rendered with its traceback by the log setup
    for front_end, path, body in requests_for("ok"):
        status, payload = await post(gw, path, body)
        assert status == 200, (front_end, payload)


async def test_decoding_errors_stay_400(gw: InProcessGateway) -> None:
    await deploy_raising(gw)
    status, payload = await post(
        gw, "/v2/models/acme.demo.1/infer", {"inputs": [{"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0]}]}
    )
    assert status == 400 and payload.get("error"), payload


async def test_wrong_row_count_is_a_500_naming_the_servable(gw: InProcessGateway) -> None:
    await deploy_raising(gw)
    for front_end, path, body in requests_for("short"):
        with structlog.testing.capture_logs() as logs:
            status, payload = await post(gw, path, body)
        assert status == 500, (front_end, payload)
        text = str(payload)
        assert "acme.demo.1.v1" in text and "1 row(s) for 2" in text, (front_end, payload)
        assert [e["event"] for e in logs].count("predict_failed") == 1, logs


@pytest.mark.parametrize("label", ["value", "key", "type"])
async def test_model_code_errors_are_internal_on_grpc_and_500_on_graphpipe(tmp_path: Path, label: str) -> None:
    import grpc
    import numpy as np
    from graphpipe import convert

    from tests.api.test_v2_grpc import Client, raw_request
    from tests.api.v2_support import v2_gateway
    from tests.api_gp.helpers import GP_PATH, post_raw

    async with v2_gateway(tmp_path / "data") as gw:
        await deploy_raising(gw.server)
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            call = Client(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call("ModelInfer", **raw_request([1.0, 2.0], [label.encode(), b"ok"]))
            assert err.value.code() == grpc.StatusCode.INTERNAL, err.value.details()
            assert "on purpose" not in err.value.details()
            reply = await call("ModelInfer", **raw_request([1.0], [b"ok"]))
            assert np.frombuffer(reply.raw_output_contents[0], dtype="<f8").tolist() == [2.0]
        body = convert.serialize_infer_request(
            convert.InferReq(None, [np.array([label, "ok"]), np.array([1.0, 2.0])], ["label", "x"], None)
        )
        _, errors = await post_raw(gw.server, bytes(body), GP_PATH)
        assert [e["code"] for e in errors] == [500], errors
