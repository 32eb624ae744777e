"""Large V2 bodies do not stall the gateway (issue 33 item 5): bodies over 1 MiB are decoded in a
worker process, and the row limit is checked before any column is built."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from forestflow.api import body_pool
from forestflow.codecs import v2_request
from tests.support import InProcessGateway, python_servable, serve_in_process

INFER = "/v2/models/acme.demo.1/infer"


def big_payload(rows: int) -> bytes:
    """``rows`` records; only the numeric output is asked for (this is about the request)."""
    xs = [i * 0.5 + 0.123456789 for i in range(rows)]
    labels = [f"r{i % 1000}" for i in range(rows)]
    return orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [rows], "datatype": "FP64", "data": xs},
                {"name": "label", "shape": [rows], "datatype": "BYTES", "data": labels},
            ],
            "outputs": [{"name": "double"}],
        }
    )


async def deploy(gw: InProcessGateway) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
        assert r.status == 200, await r.text()


async def test_a_large_body_is_decoded_off_the_event_loop(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", max_rows=1_000_000) as gw:
        await deploy(gw)
        await _decoded_off_the_loop(gw)


async def _decoded_off_the_loop(gw: InProcessGateway) -> None:
    rows = 250_000
    body = big_payload(rows)
    assert len(body) > 4 * body_pool.LARGE_BODY_BYTES
    before = body_pool.decoded_off_loop
    async with gw.session.post(gw.url + INFER, data=big_payload(3)) as r:
        assert r.status == 200, await r.text()
    assert body_pool.decoded_off_loop == before  # a small body is decoded where it arrives
    async with gw.session.post(gw.url + INFER, data=body, headers={"Accept-Encoding": "identity"}) as r:
        answer = await r.read()
        assert r.status == 200, answer[:500]
    outputs = {o["name"]: o for o in orjson.loads(answer)["outputs"]}
    assert outputs["double"]["shape"] == [rows] and outputs["double"]["data"][-1] == pytest.approx(
        2 * ((rows - 1) * 0.5 + 0.123456789)
    )
    # Decoded by a pool process: how long the loop would have stalled otherwise is bench/large_bodies.py's.
    assert body_pool.decoded_off_loop == before + 1


async def test_a_large_body_that_is_not_json_is_a_400(gw: InProcessGateway) -> None:
    await deploy(gw)
    body = b'{"inputs": [' + b"1," * (body_pool.LARGE_BODY_BYTES // 2) + b"oops"
    async with gw.session.post(gw.url + INFER, data=body) as r:
        assert r.status == 400
        assert "not valid JSON" in (await r.json())["error"]


async def test_the_row_limit_is_checked_before_columns_are_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = v2_request.array_from_json

    def counting(name, *args, **kw):
        built.append(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(v2_request, "array_from_json", counting)
    async with serve_in_process(tmp_path / "data", max_rows=10) as gw:
        await deploy(gw)
        payload = {"inputs": [{"name": "x", "shape": [11], "datatype": "FP64", "data": [1.0] * 11}]}
        async with gw.session.post(gw.url + INFER, json=payload) as r:
            assert r.status == 400
            assert "batch of 11 records is over the limit of 10" in (await r.json())["error"]
        assert built == []  # before: the column was built, then refused
        # Integers for FP64: not the plain request _ffjson.v2_columns reads, so the Python decoding builds it.
        payload["inputs"][0].update(shape=[10], data=[1] * 10)
        async with gw.session.post(gw.url + INFER, json=payload) as r:
            assert r.status == 200, await r.text()
        assert built == ["x"]
