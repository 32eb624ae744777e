"""grpc.health.v1 and server reflection beside the V2 service, called with gRPC's own clients."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from forestflow._proto.grpc_predict_v2 import SERVICE
from forestflow.api.common import GATEWAY
from tests.api.v2_support import v2_gateway
from tests.support import python_servable

MODEL = "acme.demo.1"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_health_answers_the_server_and_each_model(tmp_path: Path) -> None:
    async with v2_gateway(tmp_path / "data") as gw, grpc.aio.insecure_channel(gw.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = lambda service: health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)  # noqa: E731
        # No model yet: the server is up; the unknown model's name is NOT_FOUND.
        assert (await check("")).status == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(MODEL)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and MODEL in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check("not a model name")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        await gw.deploy(python_servable())
        assert (await check("")).status == SERVING
        assert (await check(MODEL)).status == SERVING
        assert (await check(f"{MODEL}/v1")).status == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(f"{MODEL}/v9")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        # Watch sends the status at once.
        stream = health.Watch(health_pb2.HealthCheckRequest(service=MODEL))
        first = await asyncio.wait_for(stream.read(), 5)
        assert first.status == SERVING
        stream.cancel()

        # Draining: neither the server nor the model is SERVING any more.
        gateway = gw.server.app[GATEWAY]
        gateway.draining = True
        try:
            assert (await check("")).status == NOT_SERVING
            assert (await check(MODEL)).status == NOT_SERVING
        finally:
            gateway.draining = False


async def test_reflection_lists_and_describes_the_v2_service(tmp_path: Path) -> None:
    async with v2_gateway(tmp_path / "data") as gw:
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            responses = [r async for r in stub.ServerReflectionInfo(iter([request]), timeout=5)]
            names = {s.name for s in responses[0].list_services_response.service}
            assert SERVICE in names and "grpc.health.v1.Health" in names
            assert "grpc.reflection.v1alpha.ServerReflection" in names
        # grpcio-reflection's descriptor database (what grpcurl-like tools do), on a synchronous
        # channel in a thread: the gateway answers from this test's event loop.
        service = await asyncio.to_thread(describe, gw.grpc_target)
        methods = {m.name for m in service.methods}
        assert {"ModelInfer", "ModelReady", "ServerLive"} <= methods
        assert service.methods_by_name["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"


def describe(target: str) -> Any:
    """The V2 service's descriptor as reflection gives it."""
    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert SERVICE in db.get_services()
        return DescriptorPool(db).FindServiceByName(SERVICE)
