"""The standard gRPC probes beside the V2 service: ``grpc.health.v1.Health`` and server reflection.

Kubernetes' gRPC probes, grpc_health_probe and grpcurl speak these, not the V2 calls. Health
answers from the gateway itself at each call: the service name "" is the server (SERVING while it
is ready: every servable loaded, not draining), any other name is a V2 model name (a contract,
``org.project.N``, optionally ``/version``) answering that model's readiness; an unknown name is
NOT_FOUND, as the health protocol says. Reflection lists the V2 service, Health and itself, and
describes them from a descriptor pool of their own (the V2 messages live in a private pool, see
forestflow/_proto/grpc_predict_v2.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from forestflow._proto import grpc_predict_v2
from forestflow.api import v2_common
from forestflow.errors import GatewayError, Kind
from forestflow.service import Gateway

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: How often Watch looks at the status again.
WATCH_INTERVAL_S = 1.0

_Status: Any = health_pb2.HealthCheckResponse.ServingStatus


def serving_status(gateway: Gateway, service: str) -> int | None:
    """SERVING / NOT_SERVING for ``service`` ("" the server, else a model), None when unknown."""
    if not service:
        ready = gateway.ready
    else:
        name, _, version = service.partition("/")
        try:
            ready = v2_common.model_ready(gateway, name, version or None)
        except GatewayError as error:
            if error.kind in (Kind.NOT_FOUND, Kind.INVALID):
                return None
            raise
    status: int = _Status.SERVING if ready else _Status.NOT_SERVING
    return status


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # grpcio-health-checking ships no types
    """``grpc.health.v1.Health`` answered from the gateway's state at each call."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The status now; NOT_FOUND for a name that is neither "" nor a known model."""
        status = serving_status(self.gateway, request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """The status now, then each change (SERVICE_UNKNOWN while the name is unknown)."""
        last = None
        while True:
            status = serving_status(self.gateway, request.service)
            status = _Status.SERVICE_UNKNOWN if status is None else status
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(WATCH_INTERVAL_S)


@cache
def reflection_pool() -> descriptor_pool.DescriptorPool:
    """A pool holding the V2 service's files, health.proto and reflection.proto (for reflection only)."""
    pool = descriptor_pool.DescriptorPool()
    data = resources.files(grpc_predict_v2.__package__).joinpath(grpc_predict_v2.DESCRIPTOR_SET).read_bytes()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    for module in (health_pb2, reflection_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


def add_probes(server: grpc.aio.Server, gateway: Gateway) -> None:
    """Serve Health and reflection on ``server`` (before it starts)."""
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(gateway), server)
    names = (grpc_predict_v2.SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server, pool=reflection_pool())
