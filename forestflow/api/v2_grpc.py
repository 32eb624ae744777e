"""KServe / Open Inference Protocol V2 over gRPC: ``inference.GRPCInferenceService`` on grpc.aio.

The message classes come from our own ``proto/grpc_predict_v2.proto``, built in a **private
descriptor pool** by forestflow/_proto/grpc_predict_v2.py: tritonclient, kserve and mlserver
register the same ``inference.*`` names in the default pool, and a process that has both would
fail with "duplicate symbol". The service is served through generic method handlers, so no
generated stubs are needed; on the wire it is the standard service.

Inputs may come typed (``contents``, as TrustyAI sends) or raw (``raw_input_contents``, as
tritonclient and kserve send); answers always use ``raw_output_contents``: tritonclient reads
nothing else, and kserve and TrustyAI read it too. Gateway errors map once, by kind, to status codes.
"""

from __future__ import annotations

import contextvars
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from aiohttp import web

from forestflow import tracing
from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.api import grpc_probes, v2_common
from forestflow.api.common import GATEWAY, GRPC_METRICS, GRPC_PORT, SETTINGS, WORKER
from forestflow.api.pinning import PIN_HEADER, pinned_route
from forestflow.api.prom import RequestMetrics
from forestflow.codecs.v2 import Layout, encode_outputs
from forestflow.codecs.v2_request import add_raw_tensors, parameters_of, set_parameter, tensors_of
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.errors import DeadlineExceeded, GatewayError, Kind
from forestflow.predlog.record import WireBody
from forestflow.service import Gateway

log = structlog.get_logger("forestflow.grpc")

#: Per call (each runs in its own task): which servable answered and its scoring time, for metrics.
_answered: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar("answered", default=None)

STATUS: dict[Kind, grpc.StatusCode] = {
    Kind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Kind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Kind.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    Kind.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Kind.UNPROCESSABLE: grpc.StatusCode.FAILED_PRECONDITION,
    Kind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Kind.DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
    Kind.CANCELLED: grpc.StatusCode.CANCELLED,
    Kind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Kind.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    Kind.INTERNAL: grpc.StatusCode.INTERNAL,
    Kind.BAD_GATEWAY: grpc.StatusCode.INTERNAL,
}


class InferenceService:
    """The six core calls, each mapping gateway errors to a gRPC status."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.m = messages()

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Always live while the event loop answers."""
        return self.m["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Ready when every servable is loaded and the gateway is not draining."""
        return self.m["ServerReadyResponse"](ready=self.gateway.ready)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Whether the model (or one version) can score now."""
        # An unknown model is "not ready" with status OK: tritonclient raises on a status error.
        try:
            ready = v2_common.model_ready(self.gateway, request.name, request.version or None)
        except GatewayError as error:
            if error.kind is not Kind.NOT_FOUND:
                raise
            ready = False
        return self.m["ModelReadyResponse"](ready=ready)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Name, version and extensions."""
        return self.m["ServerMetadataResponse"](**v2_common.server_metadata())

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Inputs, outputs, versions and platform of a model (NOT_FOUND when unknown)."""
        meta = v2_common.model_metadata(self.gateway, request.name, request.version or None)
        response = self.m["ModelMetadataResponse"](name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for key in ("inputs", "outputs"):
            for spec in meta[key]:
                getattr(response, key).add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        return response

    async def ModelInfer(self, call: tuple[bytes, Any], context: grpc.aio.ServicerContext) -> bytes:
        """Score typed or raw tensors; routed by phase-in unless a version is named.

        Takes the request as received with its parsed message, and answers the serialized
        response: both go to the prediction log as they are on the wire.
        """
        wire, request = call
        tensors = tensors_of(request)
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded("the request's deadline passed before it was scored")
        request_id = request.id or uuid.uuid4().hex
        wanted = [(o.name, parameters_of(o.parameters)) for o in request.outputs]
        ks, options = v2_common.output_parameters(wanted)

        def answer(fqrv: FQRV, frame: Frame, layout: Layout) -> WireBody:
            outputs = encode_outputs(frame, layout, [name for name, _ in wanted])
            outputs = v2_common.classify_outputs(self.gateway, fqrv, frame, outputs, ks)
            response = self.m["ModelInferResponse"](model_name=request.model_name, model_version=fqrv.release, id=request_id)
            add_raw_tensors(response.outputs, response.raw_output_contents, outputs)
            contributions = v2_common.explanation_tensor(fqrv, frame)
            if contributions is not None:  # its names as JSON text: InferParameter holds no lists
                add_raw_tensors(response.outputs, response.raw_output_contents, [contributions])
                for key, value in contributions.parameters.items():
                    set_parameter(response.outputs[-1].parameters[key], value if isinstance(value, str) else json.dumps(value))
            for key, value in v2_common.response_metadata(frame).items():
                set_parameter(response.parameters[key], value)
            if layout.explicit:
                response.parameters["content_type"].string_param = layout.content_type
            return WireBody.of(response.SerializeToString())

        route = None
        if not request.model_version:  # X-Forestflow-Release as gRPC metadata (keys are lower case)
            metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            pin = metadata.get(PIN_HEADER.lower())
            if pin:
                state = self.gateway.contract_state(v2_common.model_contract(request.model_name))
                route = pinned_route(
                    self.gateway, state, pin, metadata.get("authorization", ""), self.gateway.settings.admin_token
                )
        result, _ = await v2_common.infer(
            self.gateway,
            request.model_name,
            request.model_version or None,
            tensors,
            {**options, **parameters_of(request.parameters)},
            request_id=request_id,
            protocol="v2-grpc",
            timeout_s=remaining,
            classification=ks,
            wire_request=WireBody.of(wire),
            encode_response=answer,
            route=route,
        )
        assert result.response_json is not None
        _answered.set((str(result.fqrv), result.latency_ms / 1000))
        return result.response_json


class _Undecodable:
    """Stands for a request message that did not parse (gRPC would answer UNKNOWN with the exception)."""

    def __init__(self, message_type: str) -> None:
        self.message_type = message_type


def _lenient(parse: Callable[[bytes], Any], message_type: str) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:
            return _Undecodable(message_type)

    return deserialize


def _guard(
    call: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], metrics: RequestMetrics | None = None
) -> Callable[..., Awaitable[Any]]:
    if metrics is not None:
        return _counted(_guard(call), metrics)

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {request.message_type} protobuf")
        try:
            return await call(request, context)
        except GatewayError as error:
            await context.abort(STATUS[error.kind], error.message)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("grpc_unhandled_error", method=call.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the gateway log")

    return tracing.traced_grpc(handler, call.__name__) if tracing.ON else handler


_REFUSED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}


def _counted(handler: Callable[..., Awaitable[Any]], metrics: RequestMetrics) -> Callable[..., Awaitable[Any]]:
    """Count each call in /metrics (protocol v2-grpc, status the gRPC code name)."""

    async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        status = grpc.StatusCode.OK
        _answered.set(None)
        try:
            return await handler(request, context)
        except grpc.aio.AbortError:
            status = context.code() or grpc.StatusCode.UNKNOWN
            raise
        except BaseException:
            status = grpc.StatusCode.CANCELLED
            raise
        finally:
            answered = _answered.get()
            message = request[1] if isinstance(request, tuple) else request  # ModelInfer: (wire bytes, message)
            model = None if status in _REFUSED else (getattr(message, "model_name", "") or getattr(message, "name", "") or None)
            metrics.count(
                "v2-grpc",
                model,
                answered[0] if answered else None,
                status.name,
                time.perf_counter() - started,
                answered[1] if answered else None,
            )

    return counted


def generic_handler(gateway: Gateway, metrics: RequestMetrics | None = None) -> grpc.GenericRpcHandler:
    """The service's method handlers, (de)serializing with the private-pool classes."""
    service = InferenceService(gateway)
    m = service.m
    handlers = {}
    for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata"):
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _guard(getattr(service, name), metrics),
            request_deserializer=_lenient(m[f"{name}Request"].FromString, f"inference.{name}Request"),
            response_serializer=m[f"{name}Response"].SerializeToString,
        )
    # ModelInfer keeps the request's bytes and answers bytes it serialized itself (for the log).
    parse_infer = m["ModelInferRequest"].FromString
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        _guard(service.ModelInfer, metrics),
        request_deserializer=_lenient(lambda wire: (wire, parse_infer(wire)), "inference.ModelInferRequest"),
        response_serializer=bytes,
    )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def grpc_context(app: web.Application) -> AsyncIterator[None]:
    """Run the gRPC server alongside the app (needs the Gateway: register after it)."""
    settings = app[SETTINGS]
    if settings.grpc_port < 0:
        app[GRPC_PORT] = None
        yield
        return
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            # Answers are as large as the model makes them; the receive limit guards the gateway.
            ("grpc.max_send_message_length", -1),
            # gRPC sets SO_REUSEPORT by default: a second gateway would then share this port and answer
            # some of its calls from another state, so a lone gateway binds it alone and a taken port
            # fails the bind. The workers of one gateway share the port the supervisor reserved.
            ("grpc.so_reuseport", 1 if app.get(WORKER) is not None else 0),
        ]
    )
    server.add_generic_rpc_handlers((generic_handler(app[GATEWAY], app.get(GRPC_METRICS)),))
    grpc_probes.add_probes(server, app[GATEWAY])  # grpc.health.v1 and server reflection
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    port = server.add_insecure_port(f"{host}:{settings.grpc_port}")
    if not port:
        raise OSError(f"cannot serve gRPC on {host}:{settings.grpc_port}: address already in use or not available")
    await server.start()
    app[GRPC_PORT] = port
    log.info("grpc_serving", host=settings.host, port=port)
    try:
        yield
    finally:
        await server.stop(grace=min(5.0, settings.shutdown_timeout_s))
