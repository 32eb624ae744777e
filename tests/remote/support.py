"""Helpers of the RemoteV2 tests: a backend gateway (V2 over REST and gRPC) and a front gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.api.app import build_app, make_runner
from forestflow.api.common import STARTING
from forestflow.settings import Settings
from tests.api.v2_support import V2Gateway
from tests.support import TEST_ARTIFACT_ROOTS, InProcessGateway

BACKEND_MODEL = "acme.demo.1"
FRONT = ("acme", "front", 1)
FRONT_MODEL = "acme.front.1"
M = messages()


def remote_servable(
    url: str,
    model: str = BACKEND_MODEL,
    *,
    protocol: str = "rest",
    release: str = "r1",
    contract: tuple[str, str, int] = FRONT,
    validity: list[dict[str, Any]] | None = None,
    phase_in: dict[str, Any] | None = None,
    log_level: str = "NONE",
    **flavor: Any,
) -> dict[str, Any]:
    """A BasicServeRequest of a RemoteV2 servable (no path: nothing to fetch)."""
    org, project, n = contract
    return {
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": {"RemoteV2": {"url": url, "model": model, "protocol": protocol, **flavor}},
        "servableSettings": {
            "policySettings": {
                "validityPolicy": validity if validity is not None else [{"ImmediatelyValid": {}}],
                "phaseInPolicy": phase_in or {"ImmediatePhaseIn": {}},
            },
            "loggingSettings": {"logLevel": log_level, "keyFeatures": ["reqid"] if log_level != "NONE" else []},
        },
    }


def v2_body(xs: list[float], labels: list[str], **parameters: Any) -> dict[str, Any]:
    """A V2 REST request for the echo model (pd layout, one tensor per input)."""
    body: dict[str, Any] = {
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [len(xs)], "data": xs},
            {"name": "label", "datatype": "BYTES", "shape": [len(labels)], "data": labels},
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


async def grpc_infer(target: str, model: str, xs: list[float], labels: list[str], timeout: float = 10.0) -> Any:
    """A V2 gRPC ModelInfer with typed contents; the response message."""
    request = M["ModelInferRequest"](model_name=model)
    x = request.inputs.add(name="x", datatype="FP64", shape=[len(xs)])
    x.contents.fp64_contents.extend(xs)
    label = request.inputs.add(name="label", datatype="BYTES", shape=[len(labels)])
    label.contents.bytes_contents.extend(v.encode() for v in labels)
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M["ModelInferResponse"].FromString,
        )
        return await call(request, timeout=timeout)


@asynccontextmanager
async def backend_gateway(data_dir: Path, port: int, grpc_port: int) -> AsyncIterator[V2Gateway]:
    """A backend gateway on fixed loopback ports (so a test can stop it and start it again there)."""
    settings = Settings.load(
        environ={},
        overrides={
            "data_dir": data_dir,
            "port": port,
            "grpc_port": grpc_port,
            "allow_python": True,
            "shutdown_timeout_s": 1,
            "drain_grace_s": 0,
            "access_log": False,
            "artifact_roots": TEST_ARTIFACT_ROOTS,
        },
    )
    app = build_app(settings)
    runner = make_runner(app, settings)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.wait_for(asyncio.shield(app[STARTING]), 60)
        async with aiohttp.ClientSession() as session:
            yield V2Gateway(InProcessGateway(f"http://127.0.0.1:{port}", app, session), grpc_port)
    finally:
        await runner.cleanup()
