"""A V2 REST backend: per server, shared by the releases that call it, keep-alive connections for the
infer calls (http1.Http1Pool: one write per request, a small answer parser; aiohttp's client cost
the gateway twice its CPU per call) and an aiohttp session for metadata and readiness; binary
tensors when the server offers Triton's ``binary_tensor_data`` extension, JSON otherwise.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import numpy as np
import orjson

from forestflow.codecs.v2_tensor import Tensor, array_from_json, array_from_raw, check_header, json_entry
from forestflow.core.ids import FQRV
from forestflow.errors import BackendFailed, BackendUnavailable, DeadlineExceeded, GatewayError, InvalidInput, PayloadTooLarge
from forestflow.runtime.remote.backend import Backend, ModelInfo, NotSent
from forestflow.runtime.remote.config import REST, RemoteConfig
from forestflow.runtime.remote.http1 import MAX_BODY, Http1Pool, NotConnected
from forestflow.runtime.remote.pools import SharedPool
from forestflow.runtime.remote.wire import spec_of

HEADER_LENGTH = "Inference-Header-Content-Length"
_HEADER_LENGTH_KEY = HEADER_LENGTH.lower()
#: The deadline header forestflow gateways read (api/common.py's DEADLINE_HEADER; runtime cannot
#: import api): a forestflow backend then gives up when this gateway does.
DEADLINE_HEADER = "X-Request-Timeout-Ms"
#: How much of an error body is quoted in the error this gateway answers.
_QUOTED = 500


class RestBackend(Backend):
    """Calls ``{url}/v2/models/{model}[/versions/{v}]`` over one pooled session; answers of at most
    ``max_body`` bytes (the gateway's own request body limit)."""

    protocol = REST

    def __init__(self, config: RemoteConfig, fqrv: FQRV, max_body: int = MAX_BODY) -> None:
        self.config = config
        self.fqrv = fqrv
        self.max_body = max_body
        model = f"{config.url}/v2/models/{quote(config.model, safe='')}"
        self.model_url = model + (f"/versions/{quote(config.version, safe='')}" if config.version else "")
        self._session: aiohttp.ClientSession | None = None
        self._clients: _Clients | None = None
        #: The fixed head of an infer POST (built on the first call).
        self._infer_head: bytes | None = None
        #: Whether requests go out in the binary tensor layout (the server lists the extension).
        self.binary = False

    async def open(self) -> None:
        self._clients = _SESSIONS.acquire(self._pool_key)
        self._session = self._clients.session

    async def close(self) -> None:
        if self._session is not None:
            self._session = self._clients = None
            await _SESSIONS.release(self._pool_key)

    @property
    def _pool_key(self) -> str:
        return pool_key(self.config.url, self.config.headers, self.max_body)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled session (open)."""
        if self._session is None:
            raise BackendUnavailable(self.fqrv, self.config.url, "the backend client is closed")
        return self._session

    async def _get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                return response.status, await response.read()
        except Exception as exc:
            raise self._transport_error(exc, timeout_s) from None  # the message says it all: no traceback

    async def model_metadata(self, timeout_s: float) -> ModelInfo:
        status, body = await self._get(self.model_url, timeout_s)
        if status != 200:
            raise self._status_error(status, body, b"")
        try:
            doc = orjson.loads(body)
            info = ModelInfo(
                name=str(doc.get("name", self.config.model)),
                platform=str(doc.get("platform", "")),
                versions=tuple(str(v) for v in doc.get("versions") or ()),
                inputs=tuple(spec_of(i) for i in doc.get("inputs") or ()),
                outputs=tuple(spec_of(o) for o in doc.get("outputs") or ()),
            )
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise BackendFailed(self.fqrv, self.config.url, "unreadable model metadata", detail=str(exc)) from exc
        chosen = self.config.binary_tensors
        self.binary = chosen if chosen is not None else await self._offers_binary(timeout_s)
        return info

    async def _offers_binary(self, timeout_s: float) -> bool:
        """Whether the server metadata lists ``binary_tensor_data`` (False when it cannot be read)."""
        try:
            status, body = await self._get(f"{self.config.url}/v2", timeout_s)
            extensions = orjson.loads(body).get("extensions") if status == 200 else None
        except (GatewayError, orjson.JSONDecodeError, AttributeError):
            return False
        return isinstance(extensions, list) and "binary_tensor_data" in extensions

    async def model_ready(self, timeout_s: float) -> bool:
        try:
            status, _ = await self._get(self.model_url + "/ready", timeout_s)
        except GatewayError:
            return False
        return status == 200

    async def infer(
        self, inputs: Sequence[Tensor], parameters: dict[str, Any], timeout_s: float, headers: dict[str, str]
    ) -> list[Tensor]:
        body, extra = self._request_body(inputs, parameters)
        sent = {**headers, **extra, DEADLINE_HEADER: str(max(1, math.ceil(timeout_s * 1000)))}
        clients = self._clients
        if clients is None:
            raise BackendUnavailable(self.fqrv, self.config.url, "the backend client is closed")
        try:
            head = self._infer_head
            if head is None:
                head = self._infer_head = clients.posts.head(urlsplit(self.model_url + "/infer").path)
            answer = await clients.posts.post(head, sent, body, timeout_s)
        except Exception as exc:
            raise self._transport_error(exc, timeout_s) from None  # the message says it all: no traceback
        if answer.status != 200:
            raise self._status_error(answer.status, answer.body, answer.headers.get("retry-after", b""))
        return self._outputs(answer.body, answer.headers.get(_HEADER_LENGTH_KEY))

    def _request_body(self, inputs: Sequence[Tensor], parameters: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        blobs: list[bytes] = []
        doc: dict[str, Any] = {"inputs": [json_entry(tensor, self.binary, blobs) for tensor in inputs]}
        params = dict(parameters)
        if self.binary:
            params["binary_data_output"] = True
        if params:
            doc["parameters"] = params
        header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
        if not blobs:
            return header, {"Content-Type": "application/json"}
        return b"".join([header, *blobs]), {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}

    def _outputs(self, payload: bytes, length: str | None) -> list[Tensor]:
        try:
            header, binary = payload, memoryview(b"")
            if length is not None:
                size = int(length)
                header, binary = payload[:size], memoryview(payload)[size:]
            doc = orjson.loads(header)
            tensors, offset = [], 0
            for item in doc["outputs"]:
                name, datatype, shape = item["name"], item["datatype"], item["shape"]
                blob = (item.get("parameters") or {}).get("binary_data_size")
                if blob is not None:
                    array = array_from_raw(name, datatype, shape, binary[offset : offset + blob], "output")
                    offset += blob
                else:
                    array = _json_array(name, datatype, shape, item["data"])
                tensors.append(Tensor(name, datatype, array))
            return tensors
        except (GatewayError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            reason = exc.message if isinstance(exc, GatewayError) else f"{type(exc).__name__}: {exc}"
            raise BackendFailed(self.fqrv, self.config.url, "unreadable answer", detail=reason) from exc

    def _status_error(self, status: int, body: bytes, retry_after: Any) -> GatewayError:
        """The gateway error for a backend's non-200 answer."""
        message = _error_text(body)
        url = self.config.url
        if status in (400, 422):
            return InvalidInput(f"backend {url} refused the request: {message}")
        if status == 413:
            return PayloadTooLarge(f"backend {url} refused the request: {message}")
        if status == 404:
            return BackendFailed(self.fqrv, url, f"model {self.config.model!r} not found there", detail=message)
        if status in (429, 503):
            return BackendUnavailable(self.fqrv, url, f"HTTP {status}", _seconds(retry_after), detail=message)
        if status in (408, 504):
            return DeadlineExceeded(f"backend {url} of {self.fqrv} gave up in time: HTTP {status}: {message}")
        return BackendFailed(self.fqrv, url, f"HTTP {status}", detail=message)

    def _transport_error(self, exc: BaseException, timeout_s: float) -> GatewayError:
        url = self.config.url
        if isinstance(exc, GatewayError):
            return exc
        if isinstance(exc, asyncio.TimeoutError | TimeoutError):
            return DeadlineExceeded(f"backend {url} of {self.fqrv} did not answer within {timeout_s * 1000:.0f} ms")
        if isinstance(exc, aiohttp.ClientConnectorError):
            return NotSent(self.fqrv, url, f"cannot connect: {exc.os_error or exc}")
        if isinstance(exc, NotConnected):
            return NotSent(self.fqrv, url, f"cannot connect: {exc}")
        if isinstance(exc, ValueError):
            return BackendFailed(self.fqrv, url, "unreadable answer", detail=str(exc))
        return BackendUnavailable(self.fqrv, url, f"{type(exc).__name__}: {exc}")


@dataclass(slots=True)
class _Clients:
    """What the releases calling one server share: an aiohttp session (metadata, readiness) and the
    keep-alive connections of their infer calls."""

    session: aiohttp.ClientSession
    posts: Http1Pool


def pool_key(url: str, headers: dict[str, str], max_body: int) -> str:
    """Releases calling one server with the same headers (and answer size bound) share its clients."""
    return orjson.dumps([url, sorted(headers.items()), max_body]).decode()


def _new_clients(key: str) -> _Clients:
    url, headers, max_body = orjson.loads(key)
    return _Clients(_new_session(url, headers), Http1Pool(url, dict(headers), _MAX_CONNECTIONS, max_body))


async def _close_clients(clients: _Clients) -> None:
    clients.posts.close()
    await clients.session.close()


def _new_session(url: str, headers: list[list[str]]) -> aiohttp.ClientSession:
    # Keep-alive connections, at most _MAX_CONNECTIONS to the server: a bound on sockets however many
    # releases share it (each release's scheduler already bounds its own calls in flight).
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=_MAX_CONNECTIONS, keepalive_timeout=30)
    # Answers uncompressed unless the release's own headers ask otherwise: aiohttp asks for gzip by
    # default, so MLServer gzipped every answer over 500 bytes only for us to inflate it again.
    default_headers = {"Accept-Encoding": "identity", **dict(headers)}
    return aiohttp.ClientSession(connector=connector, headers=default_headers, raise_for_status=False)


#: Sockets one gateway process opens to one backend server at most.
_MAX_CONNECTIONS = 256
#: One session per backend server (and headers), shared by the releases that call it.
_SESSIONS: SharedPool[_Clients] = SharedPool(_new_clients, _close_clients)


def _json_array(name: str, datatype: Any, shape: Any, data: Any) -> np.ndarray:
    """An output's JSON ``data`` as an array: a flat list numpy reads as the very dtype of an INT64 or
    FP64 output (the usual answer) is taken as it is, which is what ``array_from_json`` makes of it,
    without its range checks and copies (an int64 array holds no value out of INT64's range);
    anything else goes through ``array_from_json``."""
    if datatype in _AS_READ and type(data) is list:
        dtype, dims = check_header(name, datatype, shape, "output")
        flat = np.array(data)
        if flat.dtype == dtype and flat.ndim == 1 and flat.size == math.prod(dims):
            return flat.reshape(dims)
    return array_from_json(name, datatype, shape, data, "output")


#: Output datatypes whose flat JSON data numpy reads straight into their own dtype.
_AS_READ = frozenset({"INT64", "FP64"})


def _error_text(body: bytes) -> str:
    """A backend's error message: V2's ``{"error": ...}`` or the start of its body."""
    try:
        doc = orjson.loads(body)
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, str):
            return error[:_QUOTED]
    except orjson.JSONDecodeError:
        pass
    return body[:_QUOTED].decode("utf-8", "replace") or "(no body)"


def _seconds(value: Any) -> float:
    try:
        return max(1.0, float(value))
    except (TypeError, ValueError):
        return 1.0
