"""The official graphpipe client with vector-input models: metadata shapes, unnamed and named tensors.

Models (tests/api/servables): ``vector.py`` takes INPUT0 FP32 [-1, 4] and answers OUTPUT0 [-1, 2]
(row sum, row max); ``multi.py`` takes INPUT0 [-1, 4], SCALE FP64 and TAG BYTES. Both check that
INPUT0 reaches them as float32 [N, 4], so a wrong mapping fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graphpipe import remote

from tests.api_gp.helpers import client, deploy, execute_multi
from tests.support import InProcessGateway, python_servable

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

SERVABLES = Path(__file__).parent.parent / "api" / "servables"
X = np.array([[0, 1, 2, 3], [4.5, 5, 6, 7]], dtype=np.float32)
X_OUT = [[6.0, 3.0], [22.5, 7.0]]


def servable(module: str, n: int) -> dict[str, Any]:
    return python_servable(contract=("acme", "demo", n), directory=SERVABLES, module=module)


async def deploy_both(gw: InProcessGateway) -> tuple[str, str]:
    await deploy(gw, servable("vector.py", 1))
    await deploy(gw, servable("multi.py", 2))
    return gw.url + "/acme/demo/1/gp", gw.url + "/acme/demo/2/gp"


async def test_metadata_reports_the_declared_shapes(gw: InProcessGateway) -> None:
    vector, multi = await deploy_both(gw)
    assert await client(remote.get_input_names, vector) == ["INPUT0"]
    assert await client(remote.get_input_shapes, vector) == [[None, 4]]
    assert await client(remote.get_output_names, vector) == ["fqrv", "OUTPUT0"]
    assert await client(remote.get_output_shapes, vector) == [[1, 1], [None, 2]]
    assert await client(remote.get_output_types, vector) == [np.dtype("O"), np.dtype("float32")]
    assert await client(remote.get_input_names, multi) == ["INPUT0", "SCALE", "TAG"]
    assert await client(remote.get_input_shapes, multi) == [[None, 4], [None, 1], [None, 1]]
    meta = await client(remote.metadata, multi)
    assert [meta.Inputs(i).Type() for i in range(meta.InputsLength())] == [10, 11, 12]  # Float32, Float64, String
    async with gw.session.get(vector) as r:
        described = await r.json()
    assert [(i["name"], i["type"], i["shape"]) for i in described["inputs"]] == [("INPUT0", "Float32", [-1, 4])]


async def test_execute_feeds_a_vector_input(gw: InProcessGateway) -> None:
    vector, _ = await deploy_both(gw)
    # No names at all: the tensor is the only input's batch; no output names: FQRV first (ForestFlow's layout).
    fqrv, out = await client(remote.execute, vector, X)
    assert fqrv.tolist() == [[b"acme.demo.1.v1"]]
    assert out.dtype == np.float32 and out.tolist() == X_OUT
    # A named output: exactly that array.
    out = await client(remote.execute, vector, X, None, "OUTPUT0")
    assert isinstance(out, np.ndarray) and out.tolist() == X_OUT
    out = await client(remote.execute, vector, X, "INPUT0", "OUTPUT0")
    assert out.tolist() == X_OUT
    # Other numeric types are cast to the declared FP32 when no value changes kind.
    for dtype in ("float64", "int64", "uint8"):
        out = await client(remote.execute, vector, np.array([[0, 1, 2, 3]], dtype=dtype), None, "OUTPUT0")
        assert out.tolist() == [[6.0, 3.0]], dtype


async def test_execute_multi_maps_unnamed_tensors_in_metadata_order(gw: InProcessGateway) -> None:
    _, multi = await deploy_both(gw)
    scale, tag = np.array([2.0, 0.5]), np.array(["a", "ü"])
    fqrv, scaled, label = await execute_multi(multi, [X, scale, tag], None)
    assert fqrv.tolist() == [[b"acme.demo.2.v1"]]
    np.testing.assert_array_equal(scaled, X * np.array([[2.0], [0.5]], dtype=np.float32))
    assert [v.decode() for v in label[:, 0]] == ["a:12", "ü:11.25"]
    # By name, in any order, scalars as [n, 1]; outputs exactly as asked.
    label, scaled = await execute_multi(
        multi, [tag.reshape(2, 1), X, scale.reshape(2, 1)], ["TAG", "INPUT0", "SCALE"], ["LABEL", "SCALED"]
    )
    assert [v.decode() for v in label[:, 0]] == ["a:12", "ü:11.25"] and scaled.shape == (2, 4)


async def test_bad_vector_requests_get_error_entries(gw: InProcessGateway) -> None:
    vector, multi = await deploy_both(gw)
    cases: list[tuple[str, list[np.ndarray], list[str] | None, list[str] | None, str]] = [
        (
            vector,
            [np.ones((2, 3), np.float32)],
            None,
            None,
            "input_tensors[0]: shape [2, 3] does not fit input 'INPUT0' (declared [-1, 4]: send [n, 4])",
        ),
        (vector, [np.ones(8, np.float32)], None, None, "input_tensors[0]: shape [8] does not fit input 'INPUT0'"),
        (
            vector,
            [np.ones((2, 2, 2), np.float32)],
            ["INPUT0"],
            None,
            "input_tensors[0]: shape [2, 2, 2] does not fit input 'INPUT0'",
        ),
        (vector, [np.array([["a"] * 4])], None, None, "input_tensors[0]: a String tensor for input 'INPUT0', which takes FP32"),
        (vector, [X, X], None, None, "got 2 tensor(s) without input_names for 1 input(s) (INPUT0)"),
        (vector, [X], None, ["OUTPUT0", "nope"], "unknown output(s) nope; available: OUTPUT0"),
        (vector, [X], None, ["OUTPUT0", "OUTPUT0"], "output_names: duplicate names"),
        (multi, [X, np.array([2.0, 0.5])], None, None, "got 2 tensor(s) without input_names for 3 input(s) (INPUT0, SCALE, TAG)"),
        (
            multi,
            [X, np.ones((2, 2)), np.array(["a", "b"])],
            None,
            None,
            "input_tensors[1]: shape [2, 2] has more than one value per record; input 'SCALE' takes one",
        ),
        (
            multi,
            [X, np.array(["a", "b"]), np.array([1.0, 2.0])],
            None,
            None,
            "input_tensors[1]: a String tensor for input 'SCALE', which takes FP64",
        ),
    ]
    for uri, inputs, names, outputs, message in cases:
        with pytest.raises(Exception) as caught:
            await execute_multi(uri, inputs, names, outputs)
        assert message in str(caught.value), (message, caught.value)
        assert "Traceback" not in str(caught.value)
    assert (await client(remote.execute, vector, X, None, "OUTPUT0")).tolist() == X_OUT  # still serving
