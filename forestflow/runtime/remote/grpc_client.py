"""A V2 gRPC backend: one ``grpc.aio`` channel per server, reused by every call of every release
that calls it; raw tensor contents; the request's deadline passed on as the call's. A call that
never left the client (no connection) is retried by gRPC itself (its transparent retry); nothing
else is retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.codecs.v2_request import add_raw_tensors, set_parameter, tensors_of
from forestflow.codecs.v2_tensor import Tensor
from forestflow.core.frame import TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import BackendFailed, BackendUnavailable, DeadlineExceeded, GatewayError, InvalidInput
from forestflow.runtime.remote.backend import Backend, ModelInfo
from forestflow.runtime.remote.config import GRPC, RemoteConfig
from forestflow.runtime.remote.pools import SharedPool


class GrpcBackend(Backend):
    """Calls ``inference.GRPCInferenceService`` at ``host:port`` over one channel."""

    protocol = GRPC
    binary = True  # raw_input_contents / raw_output_contents

    def __init__(self, config: RemoteConfig, fqrv: FQRV) -> None:
        self.config = config
        self.fqrv = fqrv
        self.m = messages()
        self._channel: grpc.aio.Channel | None = None
        self._metadata = tuple((k.lower(), v) for k, v in config.headers.items())
        #: The channel's callable of each method, made on first use (one per call cost ~5% of a call).
        self._calls: dict[str, Any] = {}

    async def open(self) -> None:
        self._channel = _CHANNELS.acquire(self.config.url)
        self._calls = {}

    async def close(self) -> None:
        if self._channel is not None:
            self._channel = None
            self._calls = {}
            await _CHANNELS.release(self.config.url)

    async def _call(self, method: str, request: Any, timeout_s: float, headers: dict[str, str] | None = None) -> Any:
        if self._channel is None:
            raise BackendUnavailable(self.fqrv, self.config.url, "the backend client is closed")
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self._channel.unary_unary(
                f"/{SERVICE}/{method}",
                request_serializer=self.m[f"{method}Request"].SerializeToString,
                response_deserializer=self.m[f"{method}Response"].FromString,
            )
        metadata = self._metadata + tuple((k.lower(), v) for k, v in headers.items()) if headers else self._metadata
        try:
            return await call(request, timeout=timeout_s, metadata=metadata or None)
        except grpc.aio.AioRpcError as exc:
            raise self._status_error(exc, timeout_s) from None  # the message says it all: no traceback

    async def model_metadata(self, timeout_s: float) -> ModelInfo:
        request = self.m["ModelMetadataRequest"](name=self.config.model, version=self.config.version)
        meta = await self._call("ModelMetadata", request, timeout_s)
        return ModelInfo(
            name=meta.name or self.config.model,
            platform=meta.platform,
            versions=tuple(meta.versions),
            inputs=tuple(_spec(t) for t in meta.inputs),
            outputs=tuple(_spec(t) for t in meta.outputs),
        )

    async def model_ready(self, timeout_s: float) -> bool:
        request = self.m["ModelReadyRequest"](name=self.config.model, version=self.config.version)
        try:
            return bool((await self._call("ModelReady", request, timeout_s)).ready)
        except GatewayError:
            return False

    async def infer(
        self, inputs: Sequence[Tensor], parameters: dict[str, Any], timeout_s: float, headers: dict[str, str]
    ) -> list[Tensor]:
        request = self.m["ModelInferRequest"](model_name=self.config.model, model_version=self.config.version)
        add_raw_tensors(request.inputs, request.raw_input_contents, inputs)
        for key, value in parameters.items():
            set_parameter(request.parameters[key], value)
        response = await self._call("ModelInfer", request, timeout_s, headers)
        try:
            return tensors_of(response, "output")
        except (GatewayError, ValueError) as exc:
            reason = exc.message if isinstance(exc, GatewayError) else str(exc)
            raise BackendFailed(self.fqrv, self.config.url, "unreadable answer", detail=reason) from exc

    def _status_error(self, exc: grpc.aio.AioRpcError, timeout_s: float) -> GatewayError:
        code, details, url = exc.code(), exc.details() or "", self.config.url
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"backend {url} of {self.fqrv} did not answer within {timeout_s * 1000:.0f} ms")
        # RESOURCE_EXHAUSTED: the backend is overloaded (or the body is over its limit): retry later.
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED):
            return BackendUnavailable(self.fqrv, url, code.name, detail=details)
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
            return InvalidInput(f"backend {url} refused the request: {details}")
        if code == grpc.StatusCode.NOT_FOUND:
            return BackendFailed(self.fqrv, url, f"model {self.config.model!r} not found there", detail=details)
        return BackendFailed(self.fqrv, url, code.name, detail=details)


def _new_channel(target: str) -> grpc.aio.Channel:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return grpc.aio.insecure_channel(target, options=options)


async def _close_channel(channel: grpc.aio.Channel) -> None:
    await channel.close()


#: One channel per backend server, shared by the releases that call it (headers go per call).
_CHANNELS: SharedPool[grpc.aio.Channel] = SharedPool(_new_channel, _close_channel)


def _spec(tensor: Any) -> TensorSpec:
    return TensorSpec(tensor.name, tensor.datatype, tuple(int(d) for d in tensor.shape) or (-1,))
