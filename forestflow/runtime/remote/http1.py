"""A small keep-alive HTTP/1.1 client for one server: the POSTs of a REST backend's inference calls.

aiohttp's client builds a request object, a header multidict, a payload, a timer and a response
object per call; for a V2 infer call that is most of what forwarding costs this gateway (client CPU
per call, c16 against a local server: ~118 µs through aiohttp, ~40 µs through a client of this
shape). This one writes each request in one ``write`` (head and body together, the head's fixed part
built once) on a pooled connection and reads the answer with a small parser: a status line, headers,
then a body of ``Content-Length`` bytes, chunked, or up to the close. Metadata and readiness calls
stay on aiohttp. Nothing is retried here; the caller maps what is raised (``OSError`` for a
connection that could not be made, ``ConnectionError`` for one lost before the whole answer came,
``TimeoutError``, ``ValueError`` for an answer that is not HTTP/1.x or breaks its framing) to its own
errors.

The framing is read strictly, because a lenient reading of a hostile answer is how a client hangs or
mixes answers up: ``Content-Length`` is plain decimal digits, a chunk size plain hex digits, chunk
data ends in CRLF, a gzip body is inflated whole (every member) or refused, and neither the body as
sent nor as inflated may pass ``max_body`` bytes. An answer that breaks any of this closes its
connection and fails its call.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import zlib
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

#: An idle connection is closed after this many seconds (aiohttp's connector used 30).
IDLE_S = 30.0
#: Largest head (status line and headers) read from an answer.
_MAX_HEAD = 65536
#: Largest answer body (as sent, and as inflated) unless the pool is given its own bound.
MAX_BODY = 64 * 1024 * 1024
#: Longest chunk-size line (size and extensions) and trailer section read.
_MAX_CHUNK_LINE = 4096
_DIGITS = re.compile(rb"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


class NotConnected(OSError):
    """The connection to the server could not be made: nothing was sent."""


@dataclass(slots=True)
class Answer:
    """A server's answer: status, headers (names in lower case), body."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.reader = _Reader(max_body)
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: this connection cannot be trusted
            self.close()
            return
        try:
            answer = self.reader.feed(data)
        except ValueError as exc:
            self.close()
            waiter.set_exception(exc)
            return
        if answer is not None:
            self.waiter = None
            if self.reader.must_close or self.reader.buf:  # bytes past the answer: not to be trusted
                self.close()
            waiter.set_result(answer)

    def eof_received(self) -> bool | None:
        self.closed = True  # not to be taken from the idle ones again
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            try:
                answer = self.reader.at_close()
            except ValueError as broken:  # read to the close, and over the size bound
                waiter.set_exception(broken)
                return
            if answer is not None:
                waiter.set_result(answer)
            else:
                waiter.set_exception(
                    ConnectionError(f"the server closed the connection before answering{f': {exc}' if exc else ''}")
                )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Reader:
    """An HTTP/1.x answer read from the bytes as they come."""

    __slots__ = ("buf", "status", "headers", "length", "chunked", "must_close", "chunks", "size", "max_body", "_head_done")

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self.buf = bytearray()
        self.max_body = max_body
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.length = -1  # -1: up to the close (no Content-Length, not chunked)
        self.chunked = False
        self.must_close = False
        self.chunks: list[bytes] = []
        self.size = 0  # bytes of body in chunks so far
        self._head_done = False

    def feed(self, data: bytes) -> Answer | None:
        """The answer once it is whole, else None; ValueError when it is not HTTP/1.x."""
        self.buf += data
        if not self._head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEAD:
                    raise ValueError("answer head too long")
                return None
            self._head(bytes(self.buf[:end]))
            del self.buf[: end + 4]
            if 100 <= self.status < 200:  # an interim answer: the real one follows
                self._reset()
                return self.feed(b"")
        if self.chunked:
            return self._chunks()
        if self.length < 0 and len(self.buf) > self.max_body:
            raise ValueError(f"answer body over {self.max_body} bytes")
        if self.length >= 0 and len(self.buf) >= self.length:
            body = bytes(self.buf[: self.length])
            del self.buf[: self.length]
            return self._answer(body)
        return None

    def at_close(self) -> Answer | None:
        """The answer read up to the connection's close, when that is where its body ends."""
        if self._head_done and self.length < 0 and not self.chunked:
            self.must_close = True
            body = bytes(self.buf)
            self.buf.clear()
            return self._answer(body)
        return None

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        self.status = int(code)
        headers = self.headers
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._head_done = True
        connection = headers.get("connection", "").lower()
        self.must_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunked = True
        elif "content-length" in headers:
            text = headers["content-length"]
            if not _DIGITS.fullmatch(text.encode("latin-1")):
                raise ValueError(f"bad Content-Length {text[:40]!r}")
            self.length = int(text)
            if self.length > self.max_body:
                raise ValueError(f"answer body of {self.length} bytes is over {self.max_body}")
        elif self.status in (204, 304):
            self.length = 0
        else:
            self.must_close = True

    def _chunks(self) -> Answer | None:
        buf = self.buf
        while True:
            end = buf.find(b"\r\n", 0, _MAX_CHUNK_LINE + 2)
            if end < 0:
                if len(buf) > _MAX_CHUNK_LINE:
                    raise ValueError("chunk-size line too long")
                return None
            size_text = bytes(buf[:end]).split(b";", 1)[0].rstrip(b" \t")
            if not _HEX.fullmatch(size_text):
                raise ValueError(f"bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                trailer = buf.find(b"\r\n\r\n", end)
                if trailer < 0:
                    if len(buf) > end + _MAX_CHUNK_LINE:
                        raise ValueError("chunked trailer too long")
                    return None
                del buf[: trailer + 4]
                return self._answer(b"".join(self.chunks))
            if self.size + size > self.max_body:
                raise ValueError(f"answer body over {self.max_body} bytes")
            start = end + 2
            if len(buf) < start + size + 2:
                return None
            if buf[start + size : start + size + 2] != b"\r\n":
                raise ValueError("chunk data not followed by CRLF")
            self.chunks.append(bytes(buf[start : start + size]))
            del buf[: start + size + 2]
            self.size += size

    def _answer(self, body: bytes) -> Answer:
        encoding = self.headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            body = _inflate(body, encoding, self.max_body)
        elif encoding != "identity":
            raise ValueError(f"unsupported Content-Encoding {encoding!r}")
        answer = Answer(self.status, self.headers, body)
        must_close = self.must_close
        self._reset()
        self.must_close = must_close
        return answer


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip body inflated whole, every member of it (or a zlib one); ValueError when it is
    truncated, followed by bytes that are not another member, or inflates past ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        inflater = zlib.decompressobj(47)  # gzip or zlib, told by its header
        try:
            part = inflater.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise ValueError(f"bad {encoding} body: {exc}") from None
        size += len(part)
        if size > limit:
            raise ValueError(f"{encoding} body inflates past {limit} bytes")
        if not inflater.eof:
            raise ValueError(f"bad {encoding} body: truncated")
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return b"".join(parts)
        if not rest.startswith(b"\x1f\x8b"):
            raise ValueError(f"bad {encoding} body: {len(rest)} bytes after its end")


class Http1Pool:
    """Keep-alive connections to one server (``http`` or ``https`` URL), at most ``limit`` at once;
    answer bodies (as sent and as inflated) of at most ``max_body`` bytes."""

    def __init__(self, url: str, headers: dict[str, str], limit: int, max_body: int = MAX_BODY) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.headers = {"Accept-Encoding": "identity", **headers}
        self.max_body = max_body
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(limit) if limit > 0 else None
        self._open: set[_Connection] = set()

    def head(self, path: str) -> bytes:
        """The fixed start of a POST to ``path``: request line and the pool's headers."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in self.headers.items() if _check_header(name, value)]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    async def post(self, head: bytes, headers: dict[str, str], body: bytes, timeout_s: float) -> Answer:
        """POST ``body`` with the fixed ``head`` (from :meth:`head`) and ``headers``; the answer within
        ``timeout_s`` (``TimeoutError`` past it: the connection is closed, never reused)."""
        extra = "".join([f"{name}: {value}\r\n" for name, value in headers.items() if _check_header(name, value)])
        data = b"".join([head, extra.encode("latin-1"), b"Content-Length: %d\r\n\r\n" % len(body), body])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._slots is not None:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()
        try:
            return await self._post(data, deadline)
        finally:
            if self._slots is not None:
                self._slots.release()

    async def _post(self, data: bytes, deadline: float) -> Answer:
        loop = asyncio.get_running_loop()
        connection = self._take()
        if connection is None:
            connection = await self._connect(deadline)
        waiter: asyncio.Future[Answer] = loop.create_future()
        connection.waiter = waiter
        assert connection.transport is not None
        connection.transport.write(data)
        handle = loop.call_at(deadline, _expire, waiter)
        try:
            answer = await waiter
        except BaseException:
            connection.close()  # an answer may still come on it: never reused
            self._open.discard(connection)
            raise
        finally:
            handle.cancel()
        if connection.closed or connection.reader.must_close:
            connection.close()
            self._open.discard(connection)
        else:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        return answer

    def _take(self) -> _Connection | None:
        """An idle connection still open (the newest first), or None."""
        idle = self._idle
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if (
                not connection.closed
                and transport is not None
                and not transport.is_closing()
                and now - connection.idle_since < IDLE_S
            ):
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    async def _connect(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self.max_body),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise
        except OSError as exc:
            raise NotConnected(exc.errno, str(exc)) from None
        self._open.add(connection)
        return connection

    def close(self) -> None:
        """Close every connection (those in use fail their calls)."""
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()


def _expire(waiter: asyncio.Future[Answer]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _check_header(name: str, value: str) -> bool:
    """True; a ValueError for a header that would break the request (a line break in it)."""
    if any(c in name or c in value for c in "\r\n") or ":" in name:
        raise ValueError(f"header {name!r} holds a line break or a colon")
    return True
