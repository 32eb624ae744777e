"""The official graphpipe 1.0.4 client against /gp: metadata, execute, execute_multi, types, outputs."""

from __future__ import annotations

import numpy as np
import pytest
from graphpipe import convert, remote

from forestflow._proto.graphpipe import InferResponse
from tests.api_gp.helpers import GP_PATH, client, deploy, execute_multi, score_column, score_rows
from tests.support import FIXTURES, InProcessGateway, python_servable, score_body

# graphpipe's client passes numElems to EndVector, which flatbuffers >= 2 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
XS = [1.5, -2.0, 10.0, 0.25]
LABELS = ["a", "b", "", "héllo"]


async def test_metadata_describes_the_active_release(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(contract_settings=KEEP_TWO))
    uri = gw.url + GP_PATH
    meta = await client(remote.metadata, uri)
    assert (meta.Name(), meta.Version(), meta.Server()) == (b"predict", b"acme.demo.1.v1", b"forestflow")
    assert meta.Description().startswith(b"Test servable")
    assert await client(remote.get_input_names, uri) == ["x", "label"]
    assert await client(remote.get_output_names, uri) == ["fqrv", "double", "echo"]
    assert await client(remote.get_input_shapes, uri) == [[None, 1], [None, 1]]
    assert await client(remote.get_output_shapes, uri) == [[1, 1], [None, 1], [None, 1]]
    assert await client(remote.get_output_types, uri) == [np.dtype("O"), np.dtype("float64"), np.dtype("O")]
    assert [meta.Inputs(i).Type() for i in range(meta.InputsLength())] == [11, 12]  # Float64, String

    await deploy(gw, python_servable(release="v2"))  # the newest valid release now represents the contract
    assert (await client(remote.metadata, uri)).Version() == b"acme.demo.1.v2"
    async with gw.session.get(gw.url + GP_PATH) as r:
        described = await r.json()
    assert described["version"] == "acme.demo.1.v2" and described["server"] == "forestflow"
    assert [(i["name"], i["type"], i["shape"]) for i in described["inputs"]] == [
        ("x", "Float64", [-1, 1]),
        ("label", "String", [-1, 1]),
    ]


async def test_execute_multi_gives_the_same_predictions_as_score(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    prediction = await score_rows(gw, score_body(XS, LABELS))
    want_double, want_echo = score_column(prediction, "double"), score_column(prediction, "echo")
    uri = gw.url + GP_PATH

    # By name, in any order, 1-D tensors.
    fqrv, double, echo = await execute_multi(uri, [np.array(LABELS), np.array(XS)], ["label", "x"])
    assert fqrv.tolist() == [[b"acme.demo.1.v1"]]
    assert double.shape == (4, 1) and double.dtype == np.float64
    assert double[:, 0].tolist() == want_double
    assert [v.decode() for v in echo[:, 0]] == want_echo

    # Without names: ForestFlow's grouping (String tensor -> categorical inputs, numbers -> numeric ones).
    grouped = await execute_multi(uri, [np.array(XS).reshape(4, 1), np.array(LABELS).reshape(4, 1)], None)
    assert grouped[1][:, 0].tolist() == want_double
    assert [v.decode() for v in grouped[2][:, 0]] == want_echo


async def test_execute_single_input_and_output_names(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    uri = gw.url + GP_PATH
    # Named outputs are answered exactly, in the requested order: execute hands back the one array.
    double = await client(remote.execute, uri, np.array([[3.0], [4.5]]), "x", "double")
    assert isinstance(double, np.ndarray) and double.tolist() == [[6.0], [9.0]]
    echo = await client(remote.execute, uri, np.array(["a", "b"]), "label", "echo")
    assert isinstance(echo, np.ndarray) and echo.tolist() == [[b"a"], [b"b"]]
    echo, double = await execute_multi(uri, [np.array(["p", "q"])], ["label"], ["echo", "double"])
    assert echo[:, 0].tolist() == [b"p", b"q"] and double[:, 0].tolist() == [0.0, 0.0]  # x absent: the echo model uses 0
    # The FQRV tensor only where its documented name asks for it.
    double, fqrv = await execute_multi(uri, [np.array([1.0])], ["x"], ["double", "fqrv"])
    assert double.tolist() == [[2.0]] and fqrv.tolist() == [[b"acme.demo.1.v1"]]
    [fqrv] = await execute_multi(uri, [np.array([1.0])], ["x"], ["fqrv"])
    assert fqrv.tolist() == [[b"acme.demo.1.v1"]]
    # No names: ForestFlow's layout, FQRV first.
    fqrv, double, echo = await execute_multi(uri, [np.array([1.0])], ["x"])
    assert (fqrv.tolist(), double.tolist(), echo.tolist()) == ([[b"acme.demo.1.v1"]], [[2.0]], [[b""]])


@pytest.mark.parametrize(
    "dtype",
    ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64"],
)
async def test_every_numeric_input_type_is_decoded_by_value(gw: InProcessGateway, dtype: str) -> None:
    await deploy(gw, python_servable())
    values = np.array([0, 1, 7, 100], dtype=dtype)
    if values.dtype.kind == "f":
        values = np.array([0.5, -1.25, 3.0, 100.0], dtype=dtype)  # ForestFlow read Float16 bits as integers
    _, double, _ = await execute_multi(gw.url + GP_PATH, [values], ["x"])
    assert double[:, 0].tolist() == (values.astype(np.float64) * 2).tolist()


async def test_output_tensors_keep_their_types_and_shapes(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(directory=FIXTURES / "servables" / "gp_types"))
    uri = gw.url + GP_PATH
    names = await client(remote.get_output_names, uri)
    outputs = dict(zip(names, await execute_multi(uri, [np.array([1.0, 2.0, -3.0])], ["x"])))
    for name in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64"):
        assert outputs[name].dtype == np.dtype(name), name
        assert outputs[name].shape == (3, 1), name
    assert outputs["int64"][:, 0].tolist() == [1, 2, -3]
    assert outputs["float16"][:, 0].tolist() == [1.0, 2.0, -3.0]
    assert outputs["positive"].dtype == np.uint8 and outputs["positive"][:, 0].tolist() == [1, 1, 0]  # no Bool in GraphPipe
    assert outputs["triple"].shape == (3, 3) and outputs["triple"][2].tolist() == [-3.0, -2.0, -1.0]
    assert outputs["raw"][:, 0].tolist() == [b"\x01\x00\xff", b"\x02\x00\xff", b"\xfd\x00\xff"]
    types = dict(zip(names, await client(remote.get_output_types, uri)))
    assert types["positive"] == np.uint8 and types["triple"] == np.float32 and types["raw"] == np.dtype("O")


async def test_response_is_a_bare_infer_response_without_errors(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    request = convert.serialize_infer_request(convert.InferReq(None, [np.array([1.0])], ["x"], None))
    async with gw.session.post(gw.url + GP_PATH, data=bytes(request)) as r:  # no Content-Type sent
        assert r.status == 200 and r.headers["Content-Type"] == "application/octet-stream"
        body = await r.read()
    outputs, errors = convert.deserialize_infer_response(body)
    assert errors == [] and len(outputs) == 3
    assert InferResponse.InferResponse.GetRootAs(body, 0).ErrorsIsNone()  # absent, not merely empty
