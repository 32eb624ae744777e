"""OpenTelemetry tracing of the gateway, off unless configured.

On when the ``otel_exporter_otlp_endpoint`` setting (or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``
/ ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variable) names a collector: spans go there over
OTLP/HTTP protobuf, sampled by ``otel_traces_sampler_ratio`` (parent-based: a caller's sampled
``traceparent`` is followed). The other ``OTEL_*`` variables (service name, resource attributes,
headers, timeouts) are read by the SDK itself; they are not forestflow settings.

The request path checks :data:`ON` once and does nothing more when it is False. When on, each
request gets a server span (continuing the W3C ``traceparent``/``tracestate`` it came with, from
HTTP headers, gRPC metadata or Kafka headers) carrying contract, fqrv, protocol, rows and status;
``predict`` (queue wait and scoring) and ``encode`` are its children; each shadow copy is a span
of its own trace linked to the request's span. The trace id is written to the access log line, the
prediction event and the response's ``traceparent``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: Whether tracing is on (set once by :func:`configure`); the only check on the request path.
ON = False

_tracer: Any = None
_provider: Any = None


def wanted(endpoint: str) -> bool:
    """Whether tracing is to be on: an endpoint is configured (setting or OTEL_* variable), the SDK not disabled."""
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint or env_endpoint) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def configure(endpoint: str, ratio: float, service_name: str = "forestflow") -> bool:
    """Turn tracing on when :func:`wanted`; True if on. The SDK comes with the tracing extra (checked at start)."""
    global ON, _tracer, _provider
    if not wanted(endpoint):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    if endpoint:
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    else:
        exporter = OTLPSpanExporter()  # the SDK reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT itself
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    _provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
    _provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    _tracer = _provider.get_tracer("forestflow")
    ON = True
    return True


def shutdown() -> None:
    """Export what is left and stop (at gateway stop)."""
    global ON, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ON, _tracer, _provider = False, None, None


def _extract(carrier: Mapping[str, str]) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def carrier_of(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    """traceparent/tracestate from gRPC metadata or Kafka headers (names in any case, values str or bytes)."""
    out = {}
    for name, value in pairs or ():
        name = str(name).lower()
        if name in ("traceparent", "tracestate"):
            out[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return out


class ServerSpan:
    """The span of one request, current (in the context) until :meth:`end`."""

    __slots__ = ("span", "token")

    def __init__(self, name: str, carrier: Mapping[str, str], protocol: str) -> None:
        from opentelemetry import context, trace

        self.span = _tracer.start_span(
            name, context=_extract(carrier), kind=trace.SpanKind.SERVER, attributes={"forestflow.protocol": protocol}
        )
        self.token = context.attach(trace.set_span_in_context(self.span))

    def end(self, status: int | str, contract: str | None = None, fqrv: str | None = None) -> None:
        """Close the span with the request's outcome."""
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        span.set_attribute("forestflow.status", str(status))
        if contract:
            span.set_attribute("forestflow.contract", contract)
        if fqrv:
            span.set_attribute("forestflow.fqrv", fqrv)
        if isinstance(status, int) and status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        try:
            context.detach(self.token)
        except ValueError:  # ended in another context (a cancelled task): nothing to restore
            pass

    def traceparent(self) -> str | None:
        """The W3C traceparent of this span (None when not sampled)."""
        ctx = self.span.get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @property
    def trace_id(self) -> str:
        """The trace id in hex."""
        return f"{self.span.get_span_context().trace_id:032x}"


def current_context_headers() -> dict[str, str]:
    """The current span's ``traceparent`` (and ``tracestate``), for a call to another server."""
    if not ON:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def current_trace_id() -> str:
    """The current span's trace id in hex, "" when there is none (or tracing is off)."""
    if not ON:
        return ""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else ""


def child(name: str, **attributes: Any) -> Any:
    """A span under the current one, as a context manager."""
    return _tracer.start_as_current_span(name, attributes=attributes or None)


class QueueThenPredict:
    """The two child spans of one scoring job: ``queue`` (from submit until the scheduler starts it)
    and ``predict`` (from then until its answer or failure).

    Both are made when the job is over, with the times taken on the way (the scheduler calls
    :meth:`started` from the event loop), so nothing is ended twice whatever way the job ends.
    """

    __slots__ = ("_attributes", "_parent", "_submitted_ns", "_started_ns")

    def __init__(self, fqrv: str, rows: int) -> None:
        from opentelemetry import context

        self._parent = context.get_current()
        self._attributes = {"forestflow.fqrv": fqrv, "forestflow.rows": rows}
        self._submitted_ns = time.time_ns()
        self._started_ns: int | None = None

    def started(self) -> None:
        """The scheduler started the job (its queue wait ends here)."""
        self._started_ns = time.time_ns()

    def finish(self, failed: bool) -> None:
        """Export the spans: the queue wait, and the scoring when the job got that far."""
        from opentelemetry.trace import Status, StatusCode

        now = time.time_ns()
        started = self._started_ns
        queue = _tracer.start_span("queue", context=self._parent, start_time=self._submitted_ns, attributes=self._attributes)
        queue.end(end_time=started if started is not None else now)
        if started is None:
            return
        predict = _tracer.start_span("predict", context=self._parent, start_time=started, attributes=self._attributes)
        if failed:
            predict.set_status(Status(StatusCode.ERROR))
        predict.end(end_time=now)


def set_attributes(**attributes: Any) -> None:
    """Attributes on the current span (e.g. rows, fqrv once known)."""
    from opentelemetry import trace

    trace.get_current_span().set_attributes({f"forestflow.{k}": v for k, v in attributes.items() if v is not None})


def shadow_span(fqrv: str) -> Any:
    """A span for one shadow copy: its own trace, linked to the current request's span."""
    from opentelemetry import trace
    from opentelemetry.context import Context

    link = trace.Link(trace.get_current_span().get_span_context())
    return _tracer.start_span("shadow", context=Context(), links=[link], attributes={"forestflow.fqrv": fqrv})


def end_on_done(span: Any) -> Any:
    """A done-callback that ends ``span`` when a shadow copy finishes."""
    return lambda _fut: span.end()


def traced_grpc(handler: Any, method: str) -> Any:
    """A gRPC method handler in a server span continuing the call's traceparent metadata."""

    async def traced(request: Any, context: Any) -> Any:
        span = ServerSpan(method, carrier_of(context.invocation_metadata()), "v2-grpc")
        message = request[1] if isinstance(request, tuple) else request  # ModelInfer: (wire bytes, message)
        parent = span.traceparent()
        try:
            if parent is not None:  # the answer's traceparent, as HTTP answers carry it
                await context.send_initial_metadata((("traceparent", parent),))
            return await handler(request, context)
        finally:
            code = context.code()
            span.end(code.name if code is not None else "OK", getattr(message, "model_name", "") or None)

    return traced
