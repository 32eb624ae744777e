"""Shadow copies and the GraphPipe prediction log for /gp, as for /score."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graphpipe import convert

from tests.api_gp.helpers import deploy, post_raw
from tests.support import FIXTURES, InProcessGateway, python_servable

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
KEYS = ["reqid", "user"]


async def wait_for_events(path: Path, count: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The JSON lines of a file log once it holds ``count`` events (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_text().splitlines() if path.exists() else []  # noqa: ASYNC240 (a small test file)
        if len(lines) >= count or time.monotonic() > deadline:
            assert len(lines) == count, f"{len(lines)} events in {path}, expected {count}"
            return [json.loads(line) for line in lines]
        await asyncio.sleep(0.05)


async def stats(gw: InProcessGateway) -> dict[str, dict[str, Any]]:
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
        return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in await r.json()}


def infer_bytes(values: list[float], config: str, output_names: list[str] | None = None) -> bytes:
    return bytes(convert.serialize_infer_request(convert.InferReq(config, [np.array(values)], ["x"], output_names)))


def data_dir(gw: InProcessGateway) -> Path:
    return gw.gateway.settings.data_dir


async def test_every_request_is_shadowed_and_both_sides_are_logged(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(log_level="FULL", key_features=KEYS, contract_settings=KEEP_TWO))
    await deploy(gw, python_servable(release="shadow", validity=[{"NeverValid": {}}], log_level="FULL", key_features=KEYS))
    sent = {}
    for i in range(6):
        body = infer_bytes([float(i), 0.5], f"reqid:r{i}, junk ,user: u{i},:nokey,,extra:a:b")
        outputs, errors = await post_raw(gw, body)
        assert errors == [] and outputs[0][0, 0] == b"acme.demo.1.v1"
        assert outputs[1][:, 0].tolist() == [2.0 * i, 1.0]
        sent[f"r{i}.u{i}"] = body

    counters = await stats(gw)
    assert (int(counters["v1"]["scoreCount"]), int(counters["v1"]["shadeCount"])) == (6, 0)
    assert (int(counters["shadow"]["scoreCount"]), int(counters["shadow"]["shadeCount"])) == (0, 6)

    events = await wait_for_events(data_dir(gw) / "predictions.gp.jsonl", 12)
    assert not (data_dir(gw) / "predictions.jsonl").exists()  # nothing on the BASIC topic
    seen = set()
    for line in events:
        event = line["event"]
        release = event["fqrv"]["releaseVersion"]
        served = event.get("servedRequest", False)
        assert line["topic"] == "graphpipe" and (release, served) in {("v1", True), ("shadow", False)}
        assert base64.b64decode(event["inferBytes"]) == sent[line["key"]]  # key from config: reqid.user
        assert event["protocol"] == "graphpipe" and event["status"] == 200
        assert event["prediction"]["fqrv"]["releaseVersion"] == release
        outputs, errors = convert.deserialize_infer_response(base64.b64decode(event["prediction"]["inferResponse"]))
        i = int(line["key"][1])
        assert errors == [] and outputs[0][0, 0] == f"acme.demo.1.{release}".encode()
        assert outputs[1][:, 0].tolist() == [2.0 * i, 1.0]
        seen.add((line["key"], served))
    assert seen == {(f"r{i}.u{i}", served) for i in range(6) for served in (True, False)}


async def test_without_an_active_release_the_shadow_still_gets_its_copy(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(release="shadow", validity=[{"NeverValid": {}}], log_level="FULL", key_features=["reqid"]))
    _, errors = await post_raw(gw, infer_bytes([3.0], "reqid:lonely"))
    assert errors == [{"code": 422, "message": b"no active servable for contract acme.demo.1"}]
    [line] = await wait_for_events(data_dir(gw) / "predictions.gp.jsonl", 1)
    assert line["key"] == "lonely" and not line["event"].get("servedRequest", False)
    outputs, _ = convert.deserialize_infer_response(base64.b64decode(line["event"]["prediction"]["inferResponse"]))
    assert outputs[1].tolist() == [[6.0]]
    assert int((await stats(gw))["shadow"]["shadeCount"]) == 1


async def test_shadow_without_the_requested_outputs_logs_all_of_its_own(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(contract_settings=KEEP_TWO))
    types_dir = FIXTURES / "servables" / "gp_types"
    await deploy(
        gw,
        python_servable(
            release="types", validity=[{"NeverValid": {}}], log_level="FULL", key_features=["reqid"], directory=types_dir
        ),
    )
    outputs, errors = await post_raw(gw, infer_bytes([2.0], "reqid:k", ["double"]))
    assert errors == [] and len(outputs) == 1 and outputs[0].tolist() == [[4.0]]
    [line] = await wait_for_events(data_dir(gw) / "predictions.gp.jsonl", 1)
    logged, errors = convert.deserialize_infer_response(base64.b64decode(line["event"]["prediction"]["inferResponse"]))
    assert errors == [] and len(logged) == 1 + 14  # fqrv + every gp_types output
    assert logged[0][0, 0] == b"acme.demo.1.types"
