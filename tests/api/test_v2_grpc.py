"""The V2 gRPC service over a real channel: typed and raw tensors, status codes, limits, lifecycle."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pool

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.api.v2_grpc import GRPC_PORT, STATUS
from forestflow.errors import Kind
from tests.api.v2_support import V2Gateway, v2_gateway
from tests.support import python_servable, serve_in_process

MODEL = "acme.demo.1"
M = messages()


class Client:
    """Calls the service with our private-pool message classes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def __call__(self, method: str, timeout: float | None = None, **fields: Any) -> Any:
        call = self.channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M[f"{method}Response"].FromString,
        )
        return await call(M[f"{method}Request"](**fields), timeout=timeout)


@pytest.fixture
async def v2(tmp_path: Path) -> AsyncIterator[tuple[V2Gateway, Client]]:
    async with v2_gateway(tmp_path / "data", max_body_bytes=8 * 1024 * 1024) as gw:
        await gw.deploy(python_servable())
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            yield gw, Client(channel)


def raw_request(xs: list[float], labels: list[bytes], **kw: Any) -> dict[str, Any]:
    req = M["ModelInferRequest"](model_name=MODEL, **kw)
    req.inputs.add(name="x", datatype="FP64", shape=[len(xs)])
    req.inputs.add(name="label", datatype="BYTES", shape=[len(labels)])
    req.raw_input_contents.append(np.array(xs, dtype="<f8").tobytes())
    req.raw_input_contents.append(b"".join(struct.pack("<I", len(b)) + b for b in labels))
    return {
        "model_name": req.model_name,
        "model_version": req.model_version,
        "id": req.id,
        "inputs": req.inputs,
        "raw_input_contents": req.raw_input_contents,
        "outputs": req.outputs,
    }


def test_every_error_kind_has_a_status_and_the_pool_is_private() -> None:
    assert set(STATUS) == set(Kind)
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest")


async def test_health_and_metadata(v2: tuple[V2Gateway, Client]) -> None:
    _, call = v2
    assert (await call("ServerLive")).live and (await call("ServerReady")).ready
    assert (await call("ModelReady", name=MODEL)).ready
    assert (await call("ModelReady", name=MODEL, version="v1")).ready
    assert not (await call("ModelReady", name="no.such.1")).ready  # OK status, ready false
    assert not (await call("ModelReady", name=MODEL, version="v9")).ready
    meta = await call("ServerMetadata")
    assert meta.name == "forestflow" and "binary_tensor_data" in meta.extensions
    model = await call("ModelMetadata", name=MODEL)
    assert (model.name, list(model.versions), model.platform) == (MODEL, ["v1"], "python")
    assert [(i.name, i.datatype, list(i.shape)) for i in model.inputs] == [("x", "FP64", [-1]), ("label", "BYTES", [-1])]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("ModelMetadata", name="no.such.1")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no.such.1" in err.value.details()


async def test_raw_inputs_give_raw_outputs(v2: tuple[V2Gateway, Client]) -> None:
    _, call = v2
    reply = await call("ModelInfer", **raw_request([1.0, -2.5], [b"a", b"\xff"], id="r-1"))
    assert (reply.model_name, reply.model_version, reply.id) == (MODEL, "v1", "r-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [("double", "FP64", [2]), ("echo", "BYTES", [2])]
    assert np.frombuffer(reply.raw_output_contents[0], dtype="<f8").tolist() == [2.0, -5.0]
    assert reply.raw_output_contents[1] == b"\x01\x00\x00\x00a\x01\x00\x00\x00\xff"
    assert not reply.outputs[0].contents.fp64_contents


async def test_typed_inputs_trustyai_layouts_and_raw_outputs(v2: tuple[V2Gateway, Client]) -> None:
    _, call = v2
    req = M["ModelInferRequest"](model_name=MODEL, id="t")
    req.inputs.add(name="x", datatype="FP64", shape=[1, 3]).contents.fp64_contents.extend([1.0, 2.0, 3.0])  # TrustyAI pd [1, N]
    req.inputs.add(name="label", datatype="BYTES", shape=[1, 3]).contents.bytes_contents.extend([b"p", b"q", b"r"])
    req.outputs.add(name="double")
    reply = await call("ModelInfer", model_name=req.model_name, id=req.id, inputs=req.inputs, outputs=req.outputs)
    assert [(o.name, list(o.shape)) for o in reply.outputs] == [("double", [3, 1])]
    assert np.frombuffer(reply.raw_output_contents[0], dtype="<f8").tolist() == [2.0, 4.0, 6.0]
    assert not reply.outputs[0].contents.fp64_contents

    req = M["ModelInferRequest"](model_name=MODEL)
    req.parameters["content_type"].string_param = "np"
    req.inputs.add(name="predict", datatype="FP64", shape=[2, 2]).contents.fp64_contents.extend([1.0, 7.0, 3.0, 8.0])
    reply = await call("ModelInfer", model_name=MODEL, parameters=req.parameters, inputs=req.inputs)
    assert np.frombuffer(reply.raw_output_contents[0], dtype="<f8").tolist() == [2.0, 6.0]
    assert list(reply.outputs[0].shape) == [2, 1]
    assert reply.parameters["content_type"].string_param == "np"


async def test_errors_map_to_status_codes_and_the_server_keeps_serving(v2: tuple[V2Gateway, Client]) -> None:
    _, call = v2
    fp16 = M["ModelInferRequest"](model_name=MODEL)
    fp16.inputs.add(name="x", datatype="FP16", shape=[1])
    mismatch = raw_request([1.0], [b"a"])
    mismatch["raw_input_contents"] = mismatch["raw_input_contents"][:1]
    short = raw_request([1.0, 2.0], [b"a", b"b"])
    short["raw_input_contents"][0] = b"\x00" * 12
    huge = M["ModelInferRequest"](model_name=MODEL)
    huge.inputs.add(name="x", datatype="FP64", shape=[1, 2**62, 2**62, 0])
    cases = [
        (
            {"model_name": MODEL, "inputs": huge.inputs, "raw_input_contents": [b""]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "'x': shape",
        ),
        ({"model_name": MODEL, "inputs": huge.inputs}, grpc.StatusCode.INVALID_ARGUMENT, "'x': shape"),
        (raw_request([1.0], [b"a"]) | {"model_name": "no.such.1"}, grpc.StatusCode.NOT_FOUND, "no.such.1"),
        (raw_request([1.0], [b"a"]) | {"model_version": "v9"}, grpc.StatusCode.NOT_FOUND, "v9"),
        (mismatch, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
        (short, grpc.StatusCode.INVALID_ARGUMENT, "'x'"),
        ({"model_name": MODEL, "inputs": fp16.inputs}, grpc.StatusCode.INVALID_ARGUMENT, "'x'"),
        ({"model_name": MODEL}, grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
    ]
    for fields, code, mentions in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call("ModelInfer", **fields)
        assert err.value.code() == code and mentions in err.value.details(), err.value.details()
    reply = await call("ModelInfer", **raw_request([4.0], [b"z"]))
    assert np.frombuffer(reply.raw_output_contents[0], dtype="<f8").tolist() == [8.0]


async def test_deadline_and_message_size(v2: tuple[V2Gateway, Client]) -> None:
    _, call = v2
    slow = raw_request([1.0], [b"a"])
    req = M["ModelInferRequest"]()
    req.parameters["sleep"].double_param = 1.0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("ModelInfer", timeout=0.2, parameters=req.parameters, **slow)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Over gRPC's 4 MiB default but under max_body_bytes (8 MiB): accepted.
    big = raw_request([0.0] * 1000, [b""] * 1000)
    big["inputs"].add(name="blob", datatype="FP64", shape=[1000, 600])
    big["raw_input_contents"].append(bytes(1000 * 600 * 8))
    reply = await call("ModelInfer", **big)
    assert list(reply.outputs[0].shape) == [1000, 1]  # a 2-D input makes the answer 2-D
    big["inputs"][2].shape[1] = 1200
    big["raw_input_contents"][2] = bytes(1000 * 1200 * 8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("ModelInfer", **big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_grpc_port_disabled_and_released_on_shutdown(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "off", grpc_port=-1) as server:
        assert server.app[GRPC_PORT] is None
    async with v2_gateway(tmp_path / "on") as gw:
        port = gw.grpc_port
    # The server stopped with the app: the port is free to bind again.
    async with serve_in_process(tmp_path / "again", grpc_port=port) as server:
        assert server.app[GRPC_PORT] == port


def test_grpc_is_not_imported_when_disabled(tmp_path: Path) -> None:
    """With grpc_port = -1 the app is built without importing grpc (its library alone maps ~13 MiB)."""
    code = (
        "import sys\n"
        "from forestflow.api.app import build_app\n"
        "from forestflow.api.common import GRPC_PORT\n"
        "from forestflow.settings import Settings\n"
        f"app = build_app(Settings.load(environ={{}}, overrides={{'grpc_port': -1, 'data_dir': {str(tmp_path)!r}}}))\n"
        "assert app[GRPC_PORT] is None\n"
        "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


async def test_x_forestflow_release_metadata_pins_a_release_when_the_contract_allows_it(tmp_path: Path) -> None:
    keep = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(python_servable(contract_settings=keep))
        await gw.deploy(python_servable(release="v2", validity=[{"NeverValid": {}}]))
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            call = channel.unary_unary(
                f"/{SERVICE}/ModelInfer",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=M["ModelInferResponse"].FromString,
            )
            request = M["ModelInferRequest"](**raw_request([1.0], [b"a"]))
            pin = (("x-forestflow-release", "v2"),)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(request, metadata=pin)
            assert refused.value.code() == STATUS[Kind.FORBIDDEN]
            async with gw.server.session.put(gw.url + "/acme/demo/1", json={**keep, "allowPinnedReleases": True}) as r:
                assert r.status == 200
            assert (await call(request, metadata=pin)).model_version == "v2"
            assert (await call(request)).model_version == "v1"
