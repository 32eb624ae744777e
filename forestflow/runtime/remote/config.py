"""A RemoteV2 servable's flavor object, read and checked (a bad one is a 422 naming the key).

``{"RemoteV2": {"url": "http://host:port", "model": "iris", "version": "1", "protocol": "rest",
"headers": {...}, "timeoutMs": 5000, "maxConcurrency": 8}}``: ``url`` is ``http(s)://host:port``
for REST and ``host:port`` for gRPC (a scheme is accepted and dropped); ``version``, ``headers``,
``timeoutMs`` (a cap on every call, below the request's own deadline), ``maxConcurrency``
(requests in flight to the backend; default the ``remote_max_concurrency`` setting),
``failureThreshold`` and ``cooldownMs`` (the circuit breaker; defaults ``remote_failure_threshold``
and ``remote_cooldown_s``) and ``binaryTensors`` (REST: the binary tensor layout on or off;
default on when the server lists the extension) are optional.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from forestflow.errors import CreateServableRequestInvalidError

REST = "rest"
GRPC = "grpc"
_KEYS = frozenset(
    {
        "url",
        "model",
        "version",
        "protocol",
        "headers",
        "timeoutMs",
        "maxConcurrency",
        "failureThreshold",
        "cooldownMs",
        "binaryTensors",
    }
)
#: Micro-batching settings every flavor may carry, read by the loader for the scheduler (the
#: batching work's runtime/batching.py), not by this flavor: accepted, not refused as unknown.
_SHARED_KEYS = frozenset({"maxBatchRows", "max_batch_rows", "maxBatchWaitUs", "max_batch_wait_us"})


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """Where the backend is and how to call it."""

    url: str
    model: str
    version: str = ""
    protocol: str = REST
    headers: dict[str, str] = field(default_factory=dict)
    #: Cap of every call to the backend (None: the request's deadline alone).
    timeout_s: float | None = None
    #: Requests in flight to the backend (None: the gateway's remote_max_concurrency).
    max_concurrency: int | None = None
    failure_threshold: int | None = None
    cooldown_s: float | None = None
    #: REST only: send tensors in the binary layout (None: when the server lists the extension).
    binary_tensors: bool | None = None

    @property
    def target(self) -> str:
        """The backend as logs and errors name it: its URL and model (and version)."""
        version = f"/versions/{self.version}" if self.version else ""
        return f"{self.url} model {self.model}{version}"


def _bad(key: str, what: str) -> CreateServableRequestInvalidError:
    return CreateServableRequestInvalidError(f"flavor.RemoteV2.{key}: {what}")


def _positive(settings: dict[str, Any], key: str) -> float | None:
    value = settings.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _bad(key, f"expected a positive number, got {value!r}")
    return float(value)


def parse_config(settings: dict[str, Any]) -> RemoteConfig:
    """The flavor object as a RemoteConfig; CreateServableRequestInvalidError names what is wrong."""
    unknown = sorted(set(settings) - _KEYS - _SHARED_KEYS)
    if unknown:
        raise _bad(unknown[0], f"unknown key; known: {', '.join(sorted(_KEYS))}")
    protocol = settings.get("protocol", REST)
    if protocol not in (REST, GRPC):
        raise _bad("protocol", f'expected "rest" or "grpc", got {protocol!r}')
    url = settings.get("url")
    if not isinstance(url, str) or not url.strip():
        raise _bad("url", "required, the backend's address (http://host:port, or host:port for grpc)")
    url = url.strip().rstrip("/")
    if protocol == REST:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _bad("url", f"expected http(s)://host:port for protocol rest, got {url!r}")
    else:
        if "://" in url:
            url = urlsplit(url).netloc
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise _bad("url", f"expected host:port for protocol grpc, got {settings['url']!r}")
    model = settings.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad("model", "required, the model's name on the backend")
    version = settings.get("version", "")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str):
        raise _bad("version", f"expected a string, got {version!r}")
    headers = settings.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise _bad("headers", "expected an object of string values")
    timeout_ms = _positive(settings, "timeoutMs")
    concurrency = _positive(settings, "maxConcurrency")
    threshold = _positive(settings, "failureThreshold")
    cooldown_ms = _positive(settings, "cooldownMs")
    for key, value in (("maxConcurrency", concurrency), ("failureThreshold", threshold)):
        if value is not None and value != int(value):
            raise _bad(key, f"expected a whole number, got {value!r}")
    binary = settings.get("binaryTensors")
    if binary is not None and not isinstance(binary, bool):
        raise _bad("binaryTensors", f"expected true or false, got {binary!r}")
    return RemoteConfig(
        url=url,
        model=model.strip(),
        version=version.strip(),
        protocol=protocol,
        headers=dict(headers),
        timeout_s=timeout_ms / 1000 if timeout_ms is not None else None,
        max_concurrency=int(concurrency) if concurrency is not None else None,
        failure_threshold=int(threshold) if threshold is not None else None,
        cooldown_s=cooldown_ms / 1000 if cooldown_ms is not None else None,
        binary_tensors=binary,
    )
