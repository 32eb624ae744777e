"""KServe V1 REST: model list, readiness and :predict with list or object instances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import InProcessGateway, python_servable

LINEAR = Path(__file__).with_name("servables")
PREDICT = "/v1/models/acme.demo.1:predict"


async def deploy_linear(gw: InProcessGateway, **kw: Any) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(directory=LINEAR, module="linear.py", **kw)) as r:
        assert r.status == 200, await r.text()


async def test_models_ready_and_alive(gw: InProcessGateway) -> None:
    await deploy_linear(gw)
    async with gw.session.get(gw.url + "/v1/models") as r:
        assert (r.status, await r.json()) == (200, {"models": ["acme.demo.1"]})
    async with gw.session.get(gw.url + "/v1/models/acme.demo.1") as r:
        assert (r.status, await r.json()) == (200, {"name": "acme.demo.1", "ready": True})
    async with gw.session.get(gw.url + "/v1/models/acme.demo.7") as r:
        assert r.status == 404 and r.headers["Content-Type"] == "application/json"
        assert "acme.demo.7" in (await r.json())["error"]
    async with gw.session.get(gw.url + "/") as r:
        assert (r.status, await r.json()) == (200, {"status": "alive"})


async def test_model_not_ready_is_503(gw: InProcessGateway) -> None:
    await deploy_linear(gw, validity=[{"NeverValid": {}}])
    async with gw.session.get(gw.url + "/v1/models/acme.demo.1") as r:
        assert (r.status, await r.json()) == (503, {"name": "acme.demo.1", "ready": False})


async def test_predict_with_lists_objects_and_inputs_key(gw: InProcessGateway) -> None:
    await deploy_linear(gw)
    expected = [{"y": 14.0, "pair": [1.0, 14.0]}, {"y": 0.5 - 2.0 + 12.0, "pair": [0.5, 10.5]}]
    for payload in (
        {"instances": [[1, 2, 3], [0.5, -1, 4]]},
        {"instances": [{"a": 1, "b": 2, "c": 3}, {"c": 4, "b": -1, "a": 0.5}]},
        {"inputs": [[1, 2, 3], [0.5, -1, 4]]},
    ):
        async with gw.session.post(gw.url + PREDICT, json=payload) as r:
            assert r.status == 200, await r.text()
            assert await r.json() == {"predictions": expected}


@pytest.mark.parametrize(
    ("payload", "status", "mentions"),
    [
        ({"instances": [[1, 2]]}, 400, "instances[0]"),
        ({"instances": [["x", 2, 3]]}, 400, "'a'"),
        ({"instances": [[1, 2, [3, 4]], [1, 2, 3]]}, 400, "'c'"),
        ({"instances": []}, 400, "instances"),
        ({"nothing": 1}, 400, "instances"),
        ({"instances": [{"a": 1, "b": 2}]}, 500, "the model failed"),  # the model itself raises (KeyError): the server's 500
        ({"instances": [1, 2]}, 400, "instances"),
    ],
)
async def test_bad_predict_requests(gw: InProcessGateway, payload: Any, status: int, mentions: str) -> None:
    await deploy_linear(gw)
    async with gw.session.post(gw.url + PREDICT, json=payload) as r:
        assert r.status == status, await r.text()
        assert r.headers["Content-Type"] == "application/json"
        body = await r.json()
    assert list(body) == ["error"] and mentions in body["error"]
    async with gw.session.post(gw.url + "/v1/models/acme.demo.2:predict", json={"instances": [[1, 2, 3]]}) as r:
        assert r.status == 404
    async with gw.session.post(gw.url + PREDICT, json={"instances": [[1, 1, 1]]}) as r:
        assert await r.json() == {"predictions": [{"y": 6.0, "pair": [1.0, 6.0]}]}


@pytest.mark.parametrize(
    ("instances", "mentions"),
    [
        ([{"q": [300, 1], "u": 1}], "input 'q': value out of range for INT8"),  # was answered as 44 + 1 + 1
        ([[[1, -129], 1]], "input 'q': value out of range for INT8"),
        ([{"q": [1, 2], "u": -1}], "input 'u': value out of range for UINT8"),  # was answered as 255
        ([{"q": [1, 2], "u": 256}], "input 'u': value out of range for UINT8"),
        ([{"q": [1, 2], "u": 1.5}], "input 'u': UINT8 data must be integers"),
    ],
)
async def test_values_an_integer_input_cannot_hold_are_400(gw: InProcessGateway, instances: Any, mentions: str) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(directory=LINEAR, module="typed.py")) as r:
        assert r.status == 200, await r.text()
    async with gw.session.post(gw.url + PREDICT, json={"instances": [{"q": [100, 27], "u": 255}]}) as r:
        assert (r.status, await r.json()) == (200, {"predictions": [382]})
    async with gw.session.post(gw.url + PREDICT, json={"instances": instances}) as r:
        body = await r.json()
        assert r.status == 400, body
        assert mentions in body["error"], body


async def test_a_float_past_an_fp32_inputs_range_is_400(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(directory=LINEAR, module="vector.py")) as r:
        assert r.status == 200, await r.text()
    async with gw.session.post(gw.url + PREDICT, json={"instances": [[1e39, 0, 0, 0]]}) as r:
        body = await r.json()
        assert r.status == 400 and "input 'INPUT0': value out of range for FP32" in body["error"], body
