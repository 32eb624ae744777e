"""The ``inference.*`` (KServe V2 gRPC) message classes, built in a private descriptor pool.

Hand-written, not generated: it loads ``grpc_predict_v2.binpb`` (the FileDescriptorSet that
scripts/gen_proto.py compiles from proto/grpc_predict_v2.proto). tritonclient, kserve and
mlserver register the same ``inference.*`` names in protobuf's *default* pool, so a module that
registered ours there would make any process that also imports one of them fail with
"duplicate symbol". Only protobuf is needed here, so client-side tests can load it too.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "inference.GRPCInferenceService"
DESCRIPTOR_SET = "grpc_predict_v2.binpb"


@cache
def messages() -> dict[str, Any]:
    """Request and response classes of every call of the service, by short name."""
    data = resources.files(__package__).joinpath(DESCRIPTOR_SET).read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    out: dict[str, Any] = {}
    for method in pool.FindServiceByName(SERVICE).methods:
        out[method.input_type.name] = message_factory.GetMessageClass(method.input_type)
        out[method.output_type.name] = message_factory.GetMessageClass(method.output_type)
    return out
