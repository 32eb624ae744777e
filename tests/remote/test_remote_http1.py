"""The infer calls' HTTP/1.1 client (runtime/remote/http1.py) against a real socket server that answers
each request with the next scripted answer: keep-alive reuse, Content-Length, chunked, gzip and
read-to-close bodies, Connection: close, deadlines, bytes after an answer, refused connections and answers that are not HTTP."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from forestflow.runtime.remote.http1 import Http1Pool, NotConnected


@dataclass
class Scripted:
    """A server answering each request with the next of ``answers`` (None: never answer)."""

    answers: list[bytes | None]
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)  # (head, body)
    connections: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
                )
                self.requests.append((head, await reader.readexactly(length)))
                answer = self.answers.pop(0)
                if answer is None:
                    await asyncio.Event().wait()  # never answers
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer or b"Content-Length" not in answer and b"chunked" not in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    script = Scripted([])
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    script.port = server.sockets[0].getsockname()[1]
    async with server:
        yield script


def ok(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def test_calls_reuse_one_connection_and_send_head_and_body(scripted: Scripted) -> None:
    scripted.answers = [ok(b'{"a":1}', "Inference-Header-Content-Length: 7"), ok(b"second")]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {"X-Team": "t1"}, 4)
    head = pool.head("/v2/models/m/infer")
    first = await pool.post(head, {"X-Request-Timeout-Ms": "900"}, b"body-1", 5.0)
    assert (first.status, first.body, first.headers["inference-header-content-length"]) == (200, b'{"a":1}', "7")
    second = await pool.post(head, {}, b"body-22", 5.0)
    assert second.body == b"second"
    assert scripted.connections == 1
    sent_head, sent_body = scripted.requests[0]
    assert sent_head.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")
    for line in (f"Host: 127.0.0.1:{scripted.port}", "Accept-Encoding: identity", "X-Team: t1", "X-Request-Timeout-Ms: 900"):
        assert line.encode() + b"\r\n" in sent_head, line
    assert sent_body == b"body-1" and scripted.requests[1][1] == b"body-22"
    pool.close()


async def test_chunked_gzip_and_read_to_close_bodies(scripted: Scripted) -> None:
    packed = gzip.compress(b"inflated")
    scripted.answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n",
        ok(packed, "Content-Encoding: gzip"),
        b"HTTP/1.0 503 Busy\r\nRetry-After: 3\r\n\r\nuntil the close",
    ]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {}, 4)
    head = pool.head("/x")
    assert (await pool.post(head, {}, b"", 5.0)).body == b"abcdefg"
    assert (await pool.post(head, {}, b"", 5.0)).body == b"inflated"
    last = await pool.post(head, {}, b"", 5.0)
    assert (last.status, last.headers["retry-after"], last.body) == (503, "3", b"until the close")
    assert scripted.connections == 1
    pool.close()


async def test_connection_close_and_a_deadline_leave_the_connection_unused(scripted: Scripted) -> None:
    scripted.answers = [ok(b"one", "Connection: close"), ok(b"two"), None, ok(b"four") + b"junk", ok(b"five")]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {}, 4)
    head = pool.head("/x")
    assert (await pool.post(head, {}, b"", 5.0)).body == b"one"
    assert (await pool.post(head, {}, b"", 5.0)).body == b"two"
    assert scripted.connections == 2  # the server said close: a new connection
    with pytest.raises(TimeoutError):
        await pool.post(head, {}, b"", 0.2)
    assert (await pool.post(head, {}, b"", 5.0)).body == b"four"
    assert scripted.connections == 3  # the one that timed out was closed, not reused
    assert (await pool.post(head, {}, b"", 5.0)).body == b"five"
    assert scripted.connections == 4  # bytes after an answer: that connection is not trusted again
    pool.close()


async def test_refused_connection_and_an_answer_that_is_not_http(scripted: Scripted) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(NotConnected):
        await Http1Pool(f"http://127.0.0.1:{free}", {}, 4).post(b"POST / HTTP/1.1\r\n", {}, b"", 5.0)
    scripted.answers = [b"SSH-2.0-OpenSSH\r\n\r\n"]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {}, 4)
    with pytest.raises(ValueError, match="not an HTTP/1.x answer"):
        await pool.post(pool.head("/x"), {}, b"", 5.0)
    with pytest.raises(ValueError, match="line break"):
        await pool.post(pool.head("/x"), {"X-Bad": "a\r\nInjected: 1"}, b"", 5.0)
    pool.close()


def chunked(*body: bytes, headers: str = "") -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + headers.encode() + b"\r\n" + b"".join(body)


BROKEN_FRAMING = {
    "negative chunk size": (chunked(b"-6\r\nabcdef\r\n0\r\n\r\n"), "bad chunk size"),
    "0x chunk size": (chunked(b"0x5\r\nabcde\r\n0\r\n\r\n"), "bad chunk size"),
    "signed chunk size": (chunked(b"+5\r\nabcde\r\n0\r\n\r\n"), "bad chunk size"),
    "underscored chunk size": (chunked(b"1_0\r\n0123456789abcdef\r\n0\r\n\r\n"), "bad chunk size"),
    "chunk data without CRLF": (chunked(b"3\r\nabcXY0\r\n\r\n"), "not followed by CRLF"),
    "endless chunk-size line": (chunked(b"5" * 5000), "chunk-size line too long"),
    "signed Content-Length": (b"HTTP/1.1 200 OK\r\nContent-Length: +1_0\r\n\r\n0123456789", "bad Content-Length"),
    "two Content-Lengths": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", "bad Content-Length"),
    "Content-Length over the cap": (b"HTTP/1.1 200 OK\r\nContent-Length: 4097\r\n\r\n", "over 4096"),
    "chunks over the cap": (chunked(b"800\r\n" + b"a" * 2048 + b"\r\n801\r\n"), "over 4096"),
    "read-to-close over the cap": (b"HTTP/1.0 200 OK\r\n\r\n" + b"a" * 5000, "over 4096"),
    "gzip past the cap": (ok(gzip.compress(b"z" * 5000), "Content-Encoding: gzip"), "inflates past 4096"),
    "truncated gzip": (ok(gzip.compress(b"inflated")[:-6], "Content-Encoding: gzip"), "truncated"),
    "gzip then junk": (ok(gzip.compress(b"inflated") + b"junk", "Content-Encoding: gzip"), "after its end"),
}


@pytest.mark.parametrize("case", BROKEN_FRAMING)
async def test_an_answer_that_breaks_the_framing_fails_its_call_and_closes_the_connection(scripted: Scripted, case: str) -> None:
    answer, reason = BROKEN_FRAMING[case]
    scripted.answers = [answer, ok(b"next")]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {}, 4, max_body=4096)
    head = pool.head("/x")
    with pytest.raises(ValueError, match=reason):
        await asyncio.wait_for(pool.post(head, {}, b"", 5.0), 5.0)
    assert (await pool.post(head, {}, b"", 5.0)).body == b"next"
    assert scripted.connections == 2  # the broken one was closed, never reused
    pool.close()


async def test_gzip_members_are_all_inflated_and_sizes_are_hex(scripted: Scripted) -> None:
    two = gzip.compress(b"first,") + gzip.compress(b"second")
    scripted.answers = [
        ok(two, "Content-Encoding: gzip"),
        chunked(b"A\r\n0123456789\r\nf ; ext\r\n" + b"f" * 15 + b"\r\n0\r\nTrailer: x\r\n\r\n"),
    ]
    pool = Http1Pool(f"http://127.0.0.1:{scripted.port}", {}, 4)
    head = pool.head("/x")
    assert (await pool.post(head, {}, b"", 5.0)).body == b"first,second"
    assert (await pool.post(head, {}, b"", 5.0)).body == b"0123456789" + b"f" * 15
    assert scripted.connections == 1
    pool.close()
