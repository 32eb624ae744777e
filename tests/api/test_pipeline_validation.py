"""Deploy-time checks of pipeline definitions: each a 422 naming the step and tensor, nothing left loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.pipeline_support import h2o_step, pipeline_dir, port, prostate_map_step, servable_request, toml
from tests.support import InProcessGateway, serve_in_process


def passthrough(name: str, reads: list[dict[str, Any]], writes: list[dict[str, Any]]) -> dict[str, Any]:
    """A map step copying input ``x`` (or a constant) to each output."""
    return {"name": name, "platform": "map", "constants": {p["name"]: 1.0 for p in writes}, "inputs": reads, "outputs": writes}


CASES: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
    "cycle": (
        [
            passthrough("a", [port("x", tensor="t2")], [port("y", tensor="t1")]),
            passthrough("b", [port("x", tensor="t1")], [port("y", tensor="t2")]),
        ],
        ["cycle", "step 'a'", "step 'b'", "tensor 't1'", "tensor 't2'"],
    ),
    "unknown input id": (
        [passthrough("a", [port("x", tensor="nowhere")], [port("y", tensor="t1")])],
        ["step 'a' input 'x'", "no step produces tensor 'nowhere'"],
    ),
    "duplicate output id": (
        [passthrough("a", [port("x")], [port("y", tensor="t")]), passthrough("b", [port("x")], [port("z", tensor="t")])],
        ["step 'b' output 'z'", "tensor id 't' is already produced by step 'a'"],
    ),
    "datatype mismatch": (
        [passthrough("a", [port("x")], [port("y", "FP64", "t")]), passthrough("b", [port("x", "BYTES", "t")], [port("z")])],
        ["step 'b' input 'x' (tensor 't')", "datatype BYTES", "step 'a' produces it as FP64"],
    ),
    "shape mismatch": (
        [
            passthrough("a", [port("x")], [port("y", "FP64", "t", [-1, 4])]),
            passthrough("b", [port("x", "FP64", "t", [-1, 3])], [port("z")]),
        ],
        ["step 'b' input 'x' (tensor 't')", "shape [-1, 3]", "step 'a' produces it as [-1, 4]"],
    ),
    "unknown platform": (
        [{"name": "net", "platform": "tensorflow_graphdef", "id": "net.pb", "outputs": [port("y")]}],
        ["step 'net'", "unknown platform 'tensorflow_graphdef'", "h2o_mojo"],
    ),
    "missing artifact": (
        [h2o_step("gbm", "missing.zip", [port("1", tensor="p")])],
        ["step 'gbm'", "artifact 'missing.zip' not found"],
    ),
    "port the model lacks": (
        [prostate_map_step(), h2o_step("gbm", "prostate_gbm_binomial.zip", [port("2", tensor="p")])],
        ["step 'gbm' output '2' (tensor 'p')", "the model has no output '2'", "predict, 0, 1"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_invalid_definition_is_a_422_naming_step_and_tensor(gw: InProcessGateway, tmp_path: Path, case: str) -> None:
    steps, needles = CASES[case]
    mojos = ("prostate_gbm_binomial.zip",) if case == "port the model lacks" else ()
    directory = pipeline_dir(tmp_path / "p", toml(steps), mojos)
    async with gw.session.post(gw.url + "/servable", json=servable_request(directory)) as r:
        body = await r.json()
        assert r.status == 422, body
    message = body["CreateServableRequestInvalidError"]["errorMessage"]
    for needle in needles:
        assert needle in message, message
    assert gw.gateway.loaded == {}
    async with gw.session.get(gw.url + "/pipe/prostate/1/metadata") as r:
        assert r.status == 404


async def test_python_steps_need_the_python_flavor_allowed(tmp_path: Path) -> None:
    steps = [{"name": "py", "platform": "python", "id": "m.py", "inputs": [port("x")], "outputs": [port("y")]}]
    directory = pipeline_dir(tmp_path / "p", toml(steps), files={"m.py": "def predict(frame):\n    return {'y': frame['x']}\n"})
    async with serve_in_process(tmp_path / "data", allow_python=False) as gw:
        async with gw.session.post(gw.url + "/servable", json=servable_request(directory)) as r:
            body = await r.json()
            assert r.status == 422
        assert "step 'py': platform 'python' is disabled" in body["CreateServableRequestInvalidError"]["errorMessage"]
        assert gw.gateway.loaded == {}


async def test_missing_definition_file_and_bad_toml(gw: InProcessGateway, tmp_path: Path) -> None:
    directory = pipeline_dir(tmp_path / "p", "[[models]\nname = ")
    for definition, needle in (("nope.toml", "'nope.toml' not found"), ("pipeline.toml", "not valid TOML")):
        async with gw.session.post(gw.url + "/servable", json=servable_request(directory, definition=definition)) as r:
            body = await r.json()
            assert r.status == 422
        assert needle in body["CreateServableRequestInvalidError"]["errorMessage"]
