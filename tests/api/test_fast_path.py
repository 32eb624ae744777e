"""The HTTP fast path (api/fast_http.py): what it must answer exactly as aiohttp does, over raw sockets.

Scoring requests are answered on the fast path; the first other request on a connection hands the
connection to aiohttp at that request's boundary. These tests drive one real gateway over raw
sockets (pipelining, chunked bodies, 100-continue, the body cap, handoff, disconnects, shutdown)
and check the fast path really answered (its connections are counted by the server).
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from forestflow.api.fast_http import FastServer
from forestflow.runtime.scheduler import Priority
from tests.support import FIXTURES, InProcessGateway, python_servable, score_body, serve_in_process, wait_for

CONTRACT = ("acme", "fast", 1)
SCORE = "/acme/fast/1/score"


@dataclass
class Served:
    gw: InProcessGateway
    host: str
    port: int

    @property
    def server(self) -> Any:
        assert self.gw.runner is not None
        return self.gw.runner.server

    @property
    def url(self) -> str:
        return self.gw.url


@asynccontextmanager
async def gateway(
    data_dir: Path, servable_dir: Path = FIXTURES / "servables" / "echo", **overrides: Any
) -> AsyncIterator[Served]:
    """A real gateway on a free port with the test servable deployed."""
    async with serve_in_process(data_dir, access_log=False, **overrides) as gw:
        body = python_servable(CONTRACT, directory=servable_dir)
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 200, await r.text()
        host, port = gw.url.removeprefix("http://").split(":")
        yield Served(gw, host, int(port))


def score_request(xs: list[float], request_id: str, extra: bytes = b"") -> bytes:
    body = orjson.dumps(score_body(xs))
    head = f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nX-Request-Id: {request_id}\r\n"
    return head.encode() + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, headers (lower-case names), body."""
    status_line = await asyncio.wait_for(reader.readline(), 10)
    assert status_line, "connection closed before a response"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 10)
    return status, headers, body


def doubles(body: bytes) -> list[float]:
    datum = orjson.loads(body)["Prediction"]["datum"]
    return [d["tensors"][0]["Float64"]["data"][0] for d in datum]


async def test_the_fast_path_is_used_and_can_be_turned_off(tmp_path: Path) -> None:
    async with gateway(tmp_path / "on") as served:
        assert isinstance(served.server, FastServer)
    async with gateway(tmp_path / "off", http_fast_path=False) as served:
        assert not isinstance(served.server, FastServer)
        async with aiohttp.ClientSession() as session, session.post(served.url + SCORE, json=score_body([1.5])) as r:
            assert r.status == 200
            assert doubles(await r.read()) == [3.0]


async def test_pipelined_scoring_and_other_requests_are_answered_in_order(tmp_path: Path) -> None:
    """Two scoring requests, a health check (handed to aiohttp mid-connection), two more scoring
    requests and an admin read, all sent at once: six answers in order, the connection kept alive."""
    async with gateway(tmp_path) as served:
        aiohttp_connections = len(served.server.connections)  # the deploy's, kept alive
        answered = served.server.answered
        reader, writer = await asyncio.open_connection(served.host, served.port)
        await wait_for(lambda: len(served.server.fast_connections) == 1, 5, "the connection on the fast path")
        writer.write(
            score_request([1.0], "a")
            + score_request([2.0], "b")
            + b"GET /health/live HTTP/1.1\r\nHost: t\r\nX-Request-Id: c\r\n\r\n"
            + score_request([3.0], "d")
            + score_request([4.0, 5.0], "e")
            + b"GET /acme/fast/1/metadata HTTP/1.1\r\nHost: t\r\nX-Request-Id: f\r\n\r\n"
        )
        answers = [await read_response(reader) for _ in range(6)]
        assert [h["x-request-id"] for _, h, _ in answers] == ["a", "b", "c", "d", "e", "f"]
        assert [s for s, _, _ in answers] == [200] * 6
        assert doubles(answers[0][2]) == [2.0] and doubles(answers[1][2]) == [4.0]
        assert orjson.loads(answers[2][2]) == {"live": True}
        assert doubles(answers[3][2]) == [6.0] and doubles(answers[4][2]) == [8.0, 10.0]
        assert orjson.loads(answers[5][2])[0]["BasicMetaData"]["fqrv"]["releaseVersion"] == "v1"
        # the first two were the fast path's; since the health check the connection is aiohttp's
        assert not served.server.fast_connections and len(served.server.connections) == aiohttp_connections + 1
        assert served.server.answered == answered + 2
        for _status, headers, _ in answers:
            assert headers["content-type"] == "application/json"
            assert headers["server"].startswith("Python/") and "date" in headers and "connection" not in headers
        writer.write(score_request([6.0], "g"))  # still open, now served by aiohttp
        status, headers, body = await read_response(reader)
        assert (status, headers["x-request-id"], doubles(body)) == (200, "g", [12.0])
        writer.close()


async def test_chunked_bodies_100_continue_and_connection_close(tmp_path: Path) -> None:
    async with gateway(tmp_path) as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        body = orjson.dumps(score_body([7.0, 8.0]))
        # chunks that split the JSON anywhere, one holding a CRLF inside the body (whitespace to JSON)
        pieces = [body[:1], b"\r\n" + body[1:20], body[20:]]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        head = f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Request-Id: ch\r\n\r\n".encode()
        writer.write(head + chunked[:7])  # the rest comes later, with a pipelined request after it
        await asyncio.sleep(0.05)
        writer.write(chunked[7:] + score_request([1.0], "after"))
        status, headers, answer = await read_response(reader)
        assert (status, headers["x-request-id"], doubles(answer)) == (200, "ch", [14.0, 16.0])
        status, headers, answer = await read_response(reader)
        assert (status, headers["x-request-id"], doubles(answer)) == (200, "after", [2.0])

        # Expect: 100-continue: the interim answer comes before the body is sent
        body = orjson.dumps(score_body([9.0]))
        writer.write(f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status, _, answer = await read_response(reader)
        assert (status, doubles(answer)) == (200, [18.0])

        writer.write(score_request([1.0], "last", extra=b"Connection: close\r\n"))
        status, headers, _ = await read_response(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
        assert len(served.server.fast_connections) == 0
        writer.close()


async def test_http_1_0_keep_alive_and_close(tmp_path: Path) -> None:
    async with gateway(tmp_path) as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        request = score_request([1.0], "k").replace(b"HTTP/1.1", b"HTTP/1.0")
        writer.write(request.replace(b"Host: t\r\n", b"Host: t\r\nConnection: keep-alive\r\n"))
        status, headers, _ = await read_response(reader)
        assert (status, headers["connection"]) == (200, "keep-alive")
        writer.write(request)
        status, headers, _ = await read_response(reader)
        assert status == 200 and "connection" not in headers
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def test_the_body_cap_and_bad_requests_answer_as_before(tmp_path: Path) -> None:
    async with gateway(tmp_path, max_body_bytes=2000) as served:
        big = b"x" * 3000
        for path, error in ((SCORE, "PayloadTooLarge"), ("/v2/models/acme.fast.1/infer", None)):
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big)
            status, headers, body = await read_response(reader)
            assert status == 413 and headers["content-type"] == "application/json"
            doc = orjson.loads(body)
            assert "over the limit of 2000 bytes" in doc["error"]
            assert doc.get("code") == error  # V2 errors are {"error": ...} alone
            writer.close()
        # a request line llhttp refuses: aiohttp's 400, never a 500
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(b"POST /acme/fast/1/score HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
        status, _, _ = await read_response(reader)
        assert status == 400
        writer.close()
        # a bad body on the fast path: a 400 with a JSON body naming the problem
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\n{{bad".encode())
        status, _, body = await read_response(reader)
        assert status == 400 and orjson.loads(body)["code"] == "InvalidInput"
        assert len(served.server.fast_connections) == 1 and served.server.answered == 1  # answered there, and kept
        writer.close()


async def test_metrics_and_recent_errors_count_fast_requests(tmp_path: Path) -> None:
    async with gateway(tmp_path) as served:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(served.url + SCORE, json=score_body([1.0])) as r:
                    assert r.status == 200
            async with session.post(served.url + "/v2/models/acme.fast.1/infer", data=b"[") as r:
                assert r.status == 400
            async with session.get(served.url + "/metrics") as r:
                text = await r.text()
        assert 'forestflow_requests_total{contract="acme.fast.1",fqrv="acme.fast.1.v1",protocol="basic",status="200"} 3.0' in text
        assert 'forestflow_requests_total{contract="",fqrv="",protocol="v2",status="400"} 1.0' in text


async def test_a_client_that_disconnects_on_the_fast_path_withdraws_its_job(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    async with gateway(tmp_path / "data", FIXTURES / "servables" / "gated", scoring_slots=1) as served:
        gw = served.gw.gateway
        scheduler = next(iter(gw.loaded.values())).scheduler
        held_reader, held_writer = await asyncio.open_connection(served.host, served.port)
        body = orjson.dumps(score_body([1.0], configs={"gate": str(gate)}))
        held_writer.write(f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await wait_for(lambda: scheduler.running == 1, 10, "the first request scoring")
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(score_request([2.0], "gone"))
        await wait_for(lambda: scheduler.queued(Priority.LIVE) == 1, 10, "the second request queued")
        writer.close()  # the client gives up
        await wait_for(lambda: scheduler.queued(Priority.LIVE) == 0, 5, "the abandoned job withdrawn")
        gate.write_text("go")
        status, _, answer = await read_response(held_reader)
        assert (status, doubles(answer)) == (200, [2.0])
        held_writer.close()


async def test_shutdown_finishes_in_flight_requests_and_closes_idle_connections(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    async with gateway(tmp_path / "data", FIXTURES / "servables" / "gated") as served:
        gw = served.gw.gateway
        scheduler = next(iter(gw.loaded.values())).scheduler
        idle_reader, idle_writer = await asyncio.open_connection(served.host, served.port)
        idle_writer.write(score_request([1.0], "idle"))
        assert (await read_response(idle_reader))[0] == 200
        busy_reader, busy_writer = await asyncio.open_connection(served.host, served.port)
        body = orjson.dumps(score_body([3.0], configs={"gate": str(gate)}))
        busy_writer.write(f"POST {SCORE} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await wait_for(lambda: scheduler.running == 1, 10, "the request scoring")
        served.server.pre_shutdown()  # what runner.cleanup() does once the listener is closed
        stopping = asyncio.ensure_future(served.server.shutdown(5))
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # the idle connection is closed
        assert not stopping.done()
        gate.write_text("go")
        status, _, answer = await read_response(busy_reader)  # the in-flight request is answered
        assert (status, doubles(answer)) == (200, [6.0])
        await asyncio.wait_for(stopping, 10)
        idle_writer.close()
        busy_writer.close()


async def test_a_large_body_is_read_whole_on_the_fast_path(tmp_path: Path) -> None:
    """Megabytes of body arrive in many reads; the fast path reads them all (the body stream never
    stops the socket) and answers, then the next request on the connection."""
    async with gateway(tmp_path) as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        xs = [float(i % 97) for i in range(40000)]
        request = score_request(xs, "big")
        assert len(request) > 2_000_000
        writer.write(request + score_request([1.0], "small"))
        status, headers, body = await read_response(reader)
        assert (status, headers["x-request-id"]) == (200, "big")
        assert doubles(body) == [2 * x for x in xs]
        status, headers, _ = await read_response(reader)
        assert (status, headers["x-request-id"]) == (200, "small")
        assert served.server.answered == 2
        writer.close()


async def test_plain_heads_are_read_in_c_once_llhttp_has_read_their_target(tmp_path: Path, monkeypatch: Any) -> None:
    """The first request for a target is read by llhttp (which routes it); later plain ones by
    _ffhttp.request_head, their bodies taken from the buffer however they arrive, headers kept."""
    taken: list[str] = []  # the targets of the heads read in C and routed from the cache

    def cached(server: FastServer, method: str, path: str) -> Any:
        target = cached_target(server, method, path)
        if target is not None:
            taken.append(path)
        return target

    cached_target = FastServer.cached_target
    monkeypatch.setattr(FastServer, "cached_target", cached)
    async with gateway(tmp_path) as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(score_request([1.0], "first"))
        status, headers, body = await read_response(reader)
        assert (status, headers["x-request-id"], doubles(body)) == (200, "first", [2.0])
        second = score_request([2.0, 3.0], "second", extra=b"X-Request-Timeout-Ms: 5000\r\n")
        for at in range(0, len(second), 7):  # the head and the body in pieces, a read each
            writer.write(second[at : at + 7])
            await asyncio.sleep(0.001)
        status, headers, body = await read_response(reader)
        assert (status, headers["x-request-id"], doubles(body)) == (200, "second", [4.0, 6.0])
        writer.write(score_request([4.0], "third", extra=b"X-Request-Timeout-Ms: nope\r\n"))  # headers reach the route
        status, headers, body = await read_response(reader)
        assert (status, headers["x-request-id"]) == (400, "third")
        assert b"X-Request-Timeout-Ms" in body
        assert taken == [SCORE, SCORE] and served.server.answered == 3 and len(served.server.fast_connections) == 1
        writer.close()


async def test_a_compressed_answer_is_the_one_aiohttp_writes(tmp_path: Path) -> None:
    """A V2 answer the client accepts gzipped: compressed on the fast path as aiohttp compresses it."""
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [300], "datatype": "FP64", "data": [float(i) for i in range(300)]}]})
    request = (
        f"POST /v2/models/acme.fast.1/infer HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nX-Request-Id: z\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answers = []
    for fast in (True, False):
        async with gateway(tmp_path / str(fast), http_fast_path=fast) as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(request + request)  # the second: a head read in C on the fast path
            for _ in range(2):
                status, headers, answer = await read_response(reader)
                assert (status, headers["content-encoding"], headers["x-request-id"]) == (200, "gzip", "z")
                answers.append((gzip.decompress(answer), headers["content-type"]))
            writer.close()
    assert answers[0] == answers[1] == answers[2] == answers[3]
    assert orjson.loads(answers[0][0])["outputs"][0]["data"] == [2.0 * i for i in range(300)]
