"""The ``RemoteV2`` servable: a model served by another V2 server, scored over REST or gRPC.

It runs on the event loop (``runs_on_loop``): each call is a coroutine awaiting the backend, so a
slot holds no thread, and a call every caller gave up on is cancelled at once. The scheduler's
slots are the backend's concurrency limit (``maxConcurrency``); more requests wait in its queue.
Loading reads the backend model's metadata and readiness: an unreachable backend or an unknown
model fails the deploy with a 422 naming both.

A backend that fails (unreachable, 5xx, timeouts) fails that release's requests with 503/502/504,
counted as the release's errors like any servable's; after ``failureThreshold`` failures in a row
its circuit opens: requests are refused at once with 503 + Retry-After while a probe asks the
backend every cool-down whether the model is ready. Its state is in the release's metadata
(``backend``), never in the gateway's readiness: one backend down fails only its own release.

Inside a pipeline (platform ``remote_v2``) the step is called from the pipeline's thread:
``load``/``predict`` hand the coroutine to the gateway's loop and wait for it there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path
from typing import Any

import structlog

from forestflow import tracing
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.errors import (
    BackendFailed,
    BackendUnavailable,
    CreateServableRequestInvalidError,
    DeadlineExceeded,
    GatewayError,
)
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.remote.backend import Backend, ModelInfo, NotSent
from forestflow.runtime.remote.breaker import CircuitBreaker
from forestflow.runtime.remote.config import REST, parse_config
from forestflow.runtime.remote.wire import answer_frame, forwarded_parameters, request_tensors

log = structlog.get_logger("forestflow.remote")

#: Deadline of the metadata and readiness calls of a deploy (and of probes) without ``timeoutMs``.
_LOAD_TIMEOUT_S = 10.0
#: A request whose connection could not be made (nothing was sent) is tried again this many times.
_CONNECT_RETRIES = 1
#: Defaults when a servable is built without the gateway's settings (tests, tools).
_DEFAULT_CONCURRENCY, _DEFAULT_THRESHOLD, _DEFAULT_COOLDOWN_S = 16, 5, 2.0


class RemoteV2Servable(Servable):
    """Scores on a remote V2 server; see the module docstring."""

    runs_on_loop = True
    batchable = True
    #: Never scored inline, not even an empty batch: its ``predict`` waits on the loop (and so
    #: does a pipeline's with a remote step, which takes the smallest of its steps' values).
    inline_max_rows = -1

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self.config = parse_config(settings)
        self.backend: Backend | None = None
        self.breaker = CircuitBreaker(_DEFAULT_THRESHOLD, _DEFAULT_COOLDOWN_S)
        self._meta: ServableMetadata | None = None
        #: The live state shown in the metadata's ``backend`` (updated in place).
        self.state: dict[str, Any] = {
            "url": self.config.url,
            "model": self.config.model,
            "protocol": self.config.protocol,
            "state": "up",
            "lastError": "",
            "circuit": "closed",
            "consecutiveFailures": 0,
            "failures": 0,
            "refused": 0,
            "circuitOpened": 0,
        }
        #: Calls that failed (``/metrics``), and calls refused by the open circuit.
        self.failures = 0
        self.refused = 0
        self._probe: asyncio.Task[None] | None = None

    # -- loading -----------------------------------------------------------------------------
    async def aload(self) -> None:
        """Connect, read the model's metadata and check it is ready; a 422 naming the backend if not."""
        config, gateway = self.config, self.gateway_settings
        self.loop = asyncio.get_running_loop()
        self.max_concurrency = int(_either(config.max_concurrency, gateway, "remote_max_concurrency", _DEFAULT_CONCURRENCY))
        self.breaker = CircuitBreaker(
            int(_either(config.failure_threshold, gateway, "remote_failure_threshold", _DEFAULT_THRESHOLD)),
            float(_either(config.cooldown_s, gateway, "remote_cooldown_s", _DEFAULT_COOLDOWN_S)),
        )
        backend = self._make_backend()
        await backend.open()
        try:
            info = await self._connect(backend)
        except GatewayError as error:
            if not self.restoring:
                await backend.close()
                raise CreateServableRequestInvalidError(
                    f"RemoteV2 backend {config.target} cannot be used: {_described(error)}"
                ) from None
            # Accepted before and its backend away now: loaded down, refusing with 503 until a probe
            # finds it (its inputs and outputs are learnt then), rather than failing readiness.
            self.backend = backend
            self._meta = self._build_metadata(ModelInfo(config.model, "", (), (), ()))
            self.ready = True
            self.breaker.trip()
            self._note_failure(error)
            log.warning("remote_backend_restored_down", fqrv=str(self.fqrv), backend=config.target, reason=_described(error))
            self._start_probe()
            return
        except BaseException:
            await backend.close()
            raise
        self.backend = backend
        self._meta = self._build_metadata(info)
        self.state["binaryTensors"] = backend.binary
        self.ready = True
        log.info("remote_backend_loaded", fqrv=str(self.fqrv), backend=config.target, protocol=config.protocol)

    async def _connect(self, backend: Backend) -> ModelInfo:
        """The backend model's metadata, once it says the model is ready; a GatewayError if not."""
        timeout = self.config.timeout_s or _LOAD_TIMEOUT_S
        info = await backend.model_metadata(timeout)
        if not await backend.model_ready(timeout):
            raise BackendUnavailable(self.fqrv, self.config.url, f"model {self.config.model!r} is not ready there")
        return info

    def _make_backend(self) -> Backend:
        if self.config.protocol == REST:
            from forestflow.runtime.remote.http1 import MAX_BODY
            from forestflow.runtime.remote.rest_client import RestBackend

            return RestBackend(self.config, self.fqrv, int(_either(None, self.gateway_settings, "max_body_bytes", MAX_BODY)))
        from forestflow.runtime.remote.grpc_client import GrpcBackend

        return GrpcBackend(self.config, self.fqrv)

    def _build_metadata(self, info: ModelInfo) -> ServableMetadata:
        return ServableMetadata(
            name=info.name,
            platform=info.platform or "remote_v2",
            inputs=info.inputs,
            outputs=info.outputs,
            description=f"{self.config.protocol} backend {self.config.target}",
            extra={"backend": self.state},
        )

    def load(self) -> None:
        """``aload`` from a pipeline's loading thread, run on the gateway's loop."""
        self._on_loop(self.aload(), _LOAD_TIMEOUT_S * 3)

    # -- scoring -----------------------------------------------------------------------------
    async def apredict(self, frame: Frame, timeout_s: float) -> Frame:
        """Score on the backend within ``timeout_s`` (capped by ``timeoutMs``)."""
        backend, meta, config = self.backend, self._meta, self.config
        if backend is None or meta is None:
            raise BackendUnavailable(self.fqrv, config.url, "not loaded")
        if self.breaker.open:
            self.refused += 1
            self.state["refused"] = self.refused
            raise BackendUnavailable(
                self.fqrv,
                config.url,
                f"circuit open after {self.breaker.consecutive_failures} failures in a row (last: {self.state['lastError']})",
                retry_after=self.breaker.retry_after() or self.breaker.cooldown_s,
            )
        loop = asyncio.get_running_loop()
        timeout = min(timeout_s, config.timeout_s) if config.timeout_s else timeout_s
        deadline = loop.time() + timeout
        tensors = request_tensors(frame, meta.inputs)
        parameters = forwarded_parameters(frame.parameters)
        headers = _trace_headers()
        attempt = 0
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise DeadlineExceeded(f"deadline of {timeout * 1000:.0f} ms exceeded calling backend {config.url}")
                try:
                    outputs = await backend.infer(tensors, parameters, remaining, headers)
                    break
                except NotSent:
                    if attempt >= _CONNECT_RETRIES:
                        raise
                    attempt += 1  # the backend never saw it: trying again cannot score it twice
        except (BackendUnavailable, BackendFailed, DeadlineExceeded) as error:
            self._failed(error)
            raise
        except GatewayError:  # the backend refused the request itself (400): it is up
            self._succeeded()
            raise
        except asyncio.CancelledError:
            if loop.time() >= deadline - 0.001:  # abandoned at its deadline: the backend was too slow
                self._failed(DeadlineExceeded(f"backend {config.url} did not answer within {timeout * 1000:.0f} ms"))
            raise
        except Exception as exc:  # a client library failure we did not foresee: the backend's call failed
            failure = BackendFailed(self.fqrv, config.url, type(exc).__name__, detail=str(exc))
            self._failed(failure)
            raise failure from exc
        out, problem = answer_frame(outputs, frame.num_rows)
        if out is None:
            broken = BackendFailed(self.fqrv, config.url, problem)
            self._failed(broken)
            raise broken
        self._succeeded()
        return out

    def predict(self, frame: Frame) -> Frame:
        """``apredict`` from a pipeline's scoring thread, run on the gateway's loop."""
        timeout = self.config.timeout_s
        if timeout is None:
            timeout = getattr(self.gateway_settings, "request_timeout_ms", 30000) / 1000
        out: Frame = self._on_loop(self.apredict(frame, timeout), timeout + 1.0)
        return out

    def _on_loop(self, coroutine: Any, timeout_s: float) -> Any:
        """Run a coroutine on the gateway's loop from another thread and wait for its result."""
        loop = self.loop
        if loop is None or _running_loop() is loop:
            coroutine.close()
            raise RuntimeError(f"{self.fqrv}: a RemoteV2 step needs the gateway's loop, called from another thread")
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise DeadlineExceeded(f"backend {self.config.url} did not answer within {timeout_s * 1000:.0f} ms") from None

    # -- backend state -----------------------------------------------------------------------
    def _failed(self, error: GatewayError) -> None:
        """Count a failed call. It is logged here, one line without a traceback: the gateway logs
        a failure with its cause's traceback, which for a refused connection or a backend's 5xx
        says nothing the message does not (and formatting it costs more than the call)."""
        opened = self.breaker.failure()
        self._note_failure(error)
        if error.__cause__ is None:
            log.warning("remote_call_failed", fqrv=str(self.fqrv), backend=self.config.target, error=_described(error))
        if opened:
            log.warning("remote_circuit_open", fqrv=str(self.fqrv), backend=self.config.target, reason=_described(error))
            self._start_probe()

    def _note_failure(self, error: GatewayError) -> None:
        self.failures += 1
        # Unreachable or too slow: down. A 5xx of its own (its model failed on one request) says
        # the server answers: down only once such failures in a row have opened the circuit.
        if not isinstance(error, BackendFailed) or self.breaker.open:
            self.state["state"] = "down"
        self.state["lastError"] = _described(error)
        self.state["lastErrorAtMS"] = time.time_ns() // 1_000_000
        self._sync()

    def _succeeded(self) -> None:
        if self.state["state"] != "up":
            log.info("remote_backend_up", fqrv=str(self.fqrv), backend=self.config.target)
        self.breaker.success()
        self.state["state"] = "up"
        self._sync()

    def _sync(self) -> None:
        """Copy the breaker's and the counters' state into the one the metadata shows."""
        breaker, state = self.breaker, self.state
        if self.backend is not None:  # loaded: V2/V1 model readiness says whether it can answer now
            self.ready = not breaker.open
        state["circuit"] = "open" if breaker.open else "closed"
        state["consecutiveFailures"] = breaker.consecutive_failures
        state["circuitOpened"] = breaker.opened_count
        state["failures"] = self.failures
        state["refused"] = self.refused

    def backend_state(self) -> dict[str, Any] | None:
        """The backend's address and state (a copy)."""
        return dict(self.state)

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_ready(), name=f"probe-{self.fqrv}")

    async def _probe_until_ready(self) -> None:
        """While the circuit is open: every cool-down, ask the backend whether the model is ready."""
        while self.breaker.open and self.backend is not None:
            await asyncio.sleep(max(self.breaker.retry_after(), 0.01))
            backend = self.backend
            if backend is None:
                return
            if await self._probe_once(backend):
                self._succeeded()
                return
            self.breaker.probe_failed()
            log.info("remote_probe_failed", fqrv=str(self.fqrv), backend=self.config.target)

    async def _probe_once(self, backend: Backend) -> bool:
        """Whether the model is ready there (and, when it was loaded down, its metadata read)."""
        meta = self._meta
        if meta is not None and (meta.inputs or meta.outputs):
            return await backend.model_ready(self.config.timeout_s or _LOAD_TIMEOUT_S)
        try:
            info = await self._connect(backend)
        except GatewayError:
            return False
        self._meta = self._build_metadata(info)
        self.state["binaryTensors"] = backend.binary
        return True

    def metadata(self) -> ServableMetadata:
        assert self._meta is not None, "metadata before load"
        return self._meta

    def health_problem(self) -> str | None:
        """None: a backend that is down fails its own release's requests, never the gateway's readiness."""
        return None

    # -- unloading ---------------------------------------------------------------------------
    async def aunload(self) -> None:
        """Stop probing and close the backend's connections."""
        self.ready = False
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.cancel()
        backend, self.backend = self.backend, None
        if backend is not None:
            await backend.close()

    def unload(self) -> None:
        """``aunload`` from a pipeline's thread (waited for), or scheduled when called on the loop."""
        loop = self.loop
        if loop is None or loop.is_closed():
            self.ready = False
            return
        if _running_loop() is loop:
            task = loop.create_task(self.aunload())
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)
            return
        try:
            asyncio.run_coroutine_threadsafe(self.aunload(), loop).result(5.0)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("remote_unload_timed_out", fqrv=str(self.fqrv))


#: Closes scheduled from the loop's own thread, held until done.
_CLOSING: set[asyncio.Task[None]] = set()


def _described(error: GatewayError) -> str:
    """An error's message with what the backend said (kept from clients: logs and metadata only)."""
    detail = getattr(error, "detail", "")
    return f"{error.message} ({detail})" if detail else error.message


def _either(own: float | None, gateway: Any, name: str, default: float) -> float:
    """The servable's own value, else the gateway's setting, else the default."""
    if own is not None:
        return own
    value = getattr(gateway, name, None)
    return float(value) if isinstance(value, int | float) else default


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _trace_headers() -> dict[str, str]:
    """The W3C trace context of the current span, for the backend (empty when tracing is off)."""
    if not tracing.ON:
        return {}
    return tracing.current_context_headers()


__all__ = ["RemoteV2Servable"]
