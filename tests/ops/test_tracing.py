"""Tracing end to end: spans exported over OTLP/HTTP to a receiver on loopback, decoded with opentelemetry-proto."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from forestflow import logs, tracing
from forestflow.settings import Settings
from tests.api.test_shadow_and_overload import events, of
from tests.support import python_servable, score_body, serve_in_process, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@asynccontextmanager
async def receiver() -> AsyncIterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP trace receiver on a free loopback port: (base URL, spans received)."""
    spans: list[Any] = []

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", spans
    finally:
        await runner.cleanup()


def attrs(span: Any) -> dict[str, str]:
    return {a.key: a.value.string_value or str(a.value.int_value) for a in span.attributes}


async def test_a_traced_request_yields_its_spans_the_header_the_log_line_and_the_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = io.BytesIO()
    monkeypatch.setattr(logs, "_sink", logs.LineSink(written))  # the access log's lines, to read them
    async with receiver() as (url, spans):
        async with serve_in_process(tmp_path / "data", otel_exporter_otlp_endpoint=url) as gw:
            assert tracing.ON
            for release, validity in (("live", None), ("shade", [{"NeverValid": {}}])):
                body = python_servable(release=release, log_level="FULL", validity=validity)
                async with gw.session.post(gw.url + "/servable", json=body) as r:
                    assert r.status == 200
            async with gw.session.post(
                gw.url + "/acme/demo/1/score", json=score_body([1.5]), headers={"traceparent": PARENT}
            ) as r:
                assert r.status == 200
                answer_parent = r.headers["traceparent"]
                request_id = r.headers["X-Request-Id"]
            await wait_for(lambda: len(events(tmp_path)) == 2, 10, "the served and the shadow event")
        assert not tracing.ON  # shut down (and flushed) with the gateway
        await wait_for(lambda: any(s.name == "shadow" for s in spans), 10, "the shadow span exported")
    # The answer continues the caller's trace with the gateway's server span.
    assert re.fullmatch(f"00-{TRACE_ID}-[0-9a-f]{{16}}-01", answer_parent)
    ours = [s for s in spans if s.trace_id.hex() == TRACE_ID]
    by_name = {s.name: s for s in ours}
    server = by_name["POST /acme/demo/1/score"]
    assert server.parent_span_id.hex() == "00f067aa0ba902b7" and server.span_id.hex() == answer_parent.split("-")[2]
    assert attrs(server)["forestflow.contract"] == "acme.demo.1" and attrs(server)["forestflow.fqrv"] == "acme.demo.1.live"
    assert attrs(server)["forestflow.status"] == "200" and attrs(server)["forestflow.protocol"] == "http"
    predict, queue, decode = by_name["predict"], by_name["queue"], by_name["decode"]
    assert predict.parent_span_id == server.span_id and attrs(predict)["forestflow.rows"] == "1"
    # decode, then the queue wait, then scoring, then encode: in that order inside the server span
    assert decode.parent_span_id == queue.parent_span_id == by_name["encode"].parent_span_id == server.span_id
    assert decode.end_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano
    assert queue.end_time_unix_nano <= predict.start_time_unix_nano <= predict.end_time_unix_nano
    assert predict.end_time_unix_nano <= by_name["encode"].start_time_unix_nano
    # The shadow copy: a trace of its own, linked to the request's span.
    shadow = next(s for s in spans if s.name == "shadow")
    assert shadow.trace_id.hex() != TRACE_ID and attrs(shadow)["forestflow.fqrv"] == "acme.demo.1.shade"
    assert [(link.trace_id.hex(), link.span_id) for link in shadow.links] == [(TRACE_ID, server.span_id)]
    # The prediction events (the JSON-lines log) and the access log line carry the trace id.
    evts = events(tmp_path)
    assert of(evts, "live", True)[0]["traceId"] == TRACE_ID and of(evts, "shade", False)[0]["traceId"] == TRACE_ID
    logs._sink.flush()
    lines = [json.loads(line) for line in written.getvalue().splitlines() if line.startswith(b"{")]
    access = [line for line in lines if line.get("request_id") == request_id and line.get("logger") == "forestflow.access"]
    assert len(access) == 1 and access[0]["trace_id"] == TRACE_ID


async def test_tracing_is_off_unless_configured_and_otel_variables_are_not_settings(tmp_path: Path) -> None:
    settings = Settings.load(environ={"OTEL_SERVICE_NAME": "gw", "OTEL_TRACES_SAMPLER": "always_on"})
    assert settings.otel_exporter_otlp_endpoint == ""
    async with serve_in_process(tmp_path / "data") as gw:
        assert not tracing.ON
        async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
            assert r.status == 200
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.5]), headers={"traceparent": PARENT}) as r:
            assert r.status == 200 and "traceparent" not in r.headers


async def test_grpc_metadata_traceparent_is_continued(tmp_path: Path) -> None:
    import grpc

    from forestflow._proto.grpc_predict_v2 import messages
    from tests.api.test_v2_grpc import raw_request
    from tests.api.v2_support import v2_gateway

    async with receiver() as (url, spans):
        async with v2_gateway(tmp_path / "data", otel_exporter_otlp_endpoint=url) as gw:
            await gw.deploy(python_servable())
            async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
                call = channel.unary_unary(
                    "/inference.GRPCInferenceService/ModelInfer",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=bytes,
                )
                answer = call(
                    messages()["ModelInferRequest"](**raw_request([1.0], [b"a"])), metadata=(("traceparent", PARENT),), timeout=10
                )
                await answer
                answer_parent = dict(await answer.initial_metadata())["traceparent"]
        await wait_for(lambda: any(s.name == "ModelInfer" for s in spans), 10, "the ModelInfer span exported")
    ours = {s.name: s for s in spans if s.trace_id.hex() == TRACE_ID}
    server = ours["ModelInfer"]
    assert server.parent_span_id.hex() == "00f067aa0ba902b7"
    assert answer_parent == f"00-{TRACE_ID}-{server.span_id.hex()}-01"
    assert attrs(server)["forestflow.status"] == "OK" and attrs(server)["forestflow.contract"] == "acme.demo.1"
    assert ours["predict"].parent_span_id == server.span_id
