"""KServe V1 with vector inputs: the unmodified kserve SDK V1 client and the 400s for bad requests.

Models: ``vector.py`` (one input INPUT0 FP32 [-1, 4]) and ``multi.py`` (INPUT0 [-1, 4], SCALE,
TAG). Each model checks that it got INPUT0 as float32 [N, 4], so a wrong mapping fails loudly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.v2_support import ensure_client_python, run_clients, v2_gateway
from tests.support import InProcessGateway, python_servable

SERVABLES = Path(__file__).with_name("servables")
VECTOR, MULTI = "acme.demo.1", "acme.demo.2"
ROWS = [[0, 1, 2, 3], [4.5, 5, 6, 7]]
ROW_OUT = [[6.0, 3.0], [22.5, 7.0]]  # (sum, max) per row
MULTI_ROWS = [{"INPUT0": [1, 2, 3, 4], "SCALE": 2, "TAG": "a"}, {"INPUT0": [0, 0, 0, 0.5], "SCALE": 0.5, "TAG": "ü"}]
MULTI_OUT = [{"SCALED": [2.0, 4.0, 6.0, 8.0], "LABEL": "a:20"}, {"SCALED": [0.0, 0.0, 0.0, 0.25], "LABEL": "ü:0.25"}]


def servable(module: str, n: int) -> dict[str, Any]:
    return python_servable(contract=("acme", "demo", n), directory=SERVABLES, module=module)


async def test_kserve_v1_client_with_vector_and_multi_input_models(tmp_path: Path) -> None:
    python = ensure_client_python()
    calls = [
        (VECTOR, {"instances": ROWS}),
        (VECTOR, {"instances": [{"INPUT0": row} for row in ROWS]}),
        (VECTOR, {"inputs": ROWS}),
        (VECTOR, {"inputs": {"INPUT0": ROWS}}),
        (VECTOR, {"instances": [[0, 1, 2]]}),
        (MULTI, {"instances": MULTI_ROWS}),
        (MULTI, {"instances": [[r["INPUT0"], r["SCALE"], r["TAG"]] for r in MULTI_ROWS]}),
        (MULTI, {"inputs": {name: [r[name] for r in MULTI_ROWS] for name in ("TAG", "SCALE", "INPUT0")}}),
        (MULTI, {"instances": [{"INPUT0": [1, 2, 3, 4], "SCALE": [2], "TAG": "a"}]}),
    ]
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(servable("vector.py", 1))
        await gw.deploy(servable("multi.py", 2))
        seen = await run_clients(python, "kserve_v1", {"http": gw.hostport, "calls": [{"model": m, "body": b} for m, b in calls]})
    results = seen["results"]
    assert results[:4] == [
        {"status": 200, "body": {"predictions": ROW_OUT}},
        {"status": 200, "body": {"predictions": ROW_OUT}},
        {"status": 200, "body": {"predictions": ROW_OUT}},
        {"status": 200, "body": {"outputs": ROW_OUT}},
    ]
    assert results[4]["status"] == 400
    assert results[4]["body"] == {
        "error": "instances[0]: input 'INPUT0' (shape [-1, 4]) takes shape [4] per instance, got shape [3]"
    }
    assert results[5] == results[6] == {"status": 200, "body": {"predictions": MULTI_OUT}}
    assert results[7] == {
        "status": 200,
        "body": {"outputs": {"SCALED": [r["SCALED"] for r in MULTI_OUT], "LABEL": [r["LABEL"] for r in MULTI_OUT]}},
    }
    assert results[8] == {"status": 400, "body": {"error": "input 'SCALE': takes one value per instance, got [2]"}}


@pytest.mark.parametrize(
    ("module", "payload", "mentions"),
    [
        (
            "vector.py",
            {"instances": [[0, 1, 2, 3], [0, 1]]},
            "instances[1]: input 'INPUT0' (shape [-1, 4]) takes shape [4] per instance, got shape [2]",
        ),
        (
            "vector.py",
            {"instances": [[0, 1, 2, [3]]]},
            "instances[0]: input 'INPUT0' (shape [-1, 4]) takes shape [4] per instance, got a ragged or mixed value",
        ),
        ("vector.py", {"instances": [[[0, 1, 2, 3]]]}, "got shape [1, 4]"),
        (
            "vector.py",
            {"instances": [["a", "b", "c", "d"]]},
            "instances[0]: input 'INPUT0' expects FP32 values, got ['a', 'b', 'c', 'd']",
        ),
        ("vector.py", {"instances": [[True, False, True, False]]}, "expects FP32 values"),
        (
            "vector.py",
            {"instances": [1, 2]},
            "instances[0]: input 'INPUT0' (shape [-1, 4]) takes shape [4] per instance, got shape []",
        ),
        ("vector.py", {"instances": [{"INPUT0": [1, 2, 3, 4, 5]}]}, "got shape [5]"),
        (
            "vector.py",
            {"inputs": {"INPUT0": [[0, 1, 2, 3]], "extra": [1, 2]}},
            "inputs: every input needs one entry per record, got INPUT0=1, extra=2",
        ),
        ("vector.py", {"inputs": {"INPUT0": 5}}, "inputs.INPUT0: expected a non-empty list"),
        (
            "vector.py",
            {"inputs": {"INPUT0": [[0, 1, 2, 3], [0, 1, 2, "x"]]}},
            "inputs.INPUT0[1]: input 'INPUT0' expects FP32 values",
        ),
        ("vector.py", {"inputs": {}}, "inputs: an object with at least one input"),
        ("multi.py", {"instances": [[[1, 2, 3, 4], 2]]}, "instances[0]: expected 3 values (INPUT0, SCALE, TAG), got 2"),
        (
            "multi.py",
            {"instances": [[[1, 2, 3], 2, "a"]]},
            "instances[0]: input 'INPUT0' (shape [-1, 4]) takes shape [4] per instance, got shape [3]",
        ),
        ("multi.py", {"instances": [[[1, 2, 3, 4], "2", "a"]]}, "input 'SCALE': expected numbers (FP64), got '2'"),
    ],
)
async def test_bad_vector_requests_get_a_clear_400(gw: InProcessGateway, module: str, payload: Any, mentions: str) -> None:
    async with gw.session.post(gw.url + "/servable", json=servable(module, 1)) as r:
        assert r.status == 200, await r.text()
    async with gw.session.post(gw.url + f"/v1/models/{VECTOR}:predict", json=payload) as r:
        assert r.status == 400, await r.text()
        assert r.headers["Content-Type"] == "application/json"
        body = await r.json()
    assert list(body) == ["error"] and mentions in body["error"], body
