"""The fast path: scoring requests answered without aiohttp's Request, Response, middleware chain
and router per request.

Every connection starts with :class:`FastProtocol`. It parses HTTP/1.1 with aiohttp's own C parser
(llhttp) one request at a time; the head of the usual request (a POST with a Content-Length, for a
target llhttp has read before) is read in C instead (``_ffhttp.request_head``), as llhttp reads it.
A request for a scoring route (``/score``, ``/explain``, V2 infer, V1 ``:predict``/``:explain``,
GraphPipe: those registered with ``common.register_exchange``) is read whole, given to the route's
protocol-free answer (the one the aiohttp handler calls too), and its response is written straight
to the transport: status line, headers and body in one write. Which route a request target is for is
asked of aiohttp's own router once per distinct target and kept, so both paths always agree.

Anything else (admin, ops, ``/metrics``, ``/ui``, websockets, a compressed body, an ``Expect``
other than ``100-continue``, a body over ``max_body_bytes``, a request llhttp refuses, tracing on)
is handed to aiohttp at that request's boundary: every earlier response has been written, the raw
bytes from that request's first byte on are still held, and aiohttp's ``RequestHandler`` takes over
the transport and those bytes. The connection then stays with aiohttp. What aiohttp answers is
thus what it always answered; the fast path only answers what it answers the same way (headers,
error bodies, request ids, access log, metrics, keep-alive, pipelining in order, handler
cancellation on disconnect, graceful shutdown).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import structlog
from aiohttp import hdrs, web
from aiohttp.compression_utils import ZLibCompressor
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion10, HttpVersion11
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.tcp_helpers import tcp_keepalive
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_urldispatcher import UrlDispatcher
from multidict import CIMultiDict, CIMultiDictProxy, istr

from forestflow import tracing
from forestflow.api._ffhttp import request_head
from forestflow.api.common import EXCHANGE_ROUTES, GATEWAY, SETTINGS, WORKER, Exchange, ExchangeRoute, Reply
from forestflow.api.middleware import RECORDER, internal_error, request_id_from
from forestflow.api.responses import JSON, error_parts
from forestflow.errors import GatewayError

try:  # the C parser (absent when aiohttp was installed without its extensions): no fast path without it
    from aiohttp._http_parser import HttpRequestParser
except ImportError:  # pragma: no cover
    HttpRequestParser = None

log = structlog.get_logger("forestflow.http")

#: Bytes of later (pipelined) requests buffered while one is answered, before reading pauses.
_HIGH_WATER = 1 << 18
#: A request head larger than this (without its blank line) goes to aiohttp, which refuses it.
_MAX_HEAD = 16384
#: Distinct (method, target) pairs whose route is remembered (cleared past it).
_MAX_TARGETS = 4096
_REASONS = {s.value: s.phrase for s in HTTPStatus}
#: (HTTP version, status, content type) -> the status line and Content-Type header of a response.
_STARTS: dict[tuple[Any, int, str], str] = {}
#: Known header names (lower case) -> the istr aiohttp's parser names them with (request_head).
_HEADER_NAMES = {name.lower(): name for name in vars(hdrs).values() if isinstance(name, istr)}


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the router sends a request target: the scoring route and what the request logs."""

    route: ExchangeRoute
    params: dict[str, str]
    resource: Any  # the aiohttp resource (its protocol label for the metrics)
    path: str  # the decoded path, as ``request.path``


class _Probe:
    """What aiohttp's router reads of a request: its method and relative URL."""

    __slots__ = ("method", "rel_url")

    def __init__(self, method: str, rel_url: Any) -> None:
        self.method = method
        self.rel_url = rel_url


def _resolve(router: UrlDispatcher, method: str, url: Any) -> Any:
    """The router's match for ``method url``. Resolving awaits nothing for plain resources: the
    coroutine is run to its end here; one that would wait (none of ours) counts as no match."""
    coro = router.resolve(_Probe(method, url))  # type: ignore[arg-type]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    return None


def fast_path_usable(app: web.Application) -> bool:
    """Whether the fast path answers exactly as the app would: the C parser is there, and the app
    has only its own middleware and (for a worker) its own response hook."""
    if HttpRequestParser is None:
        return False
    hooks = 1 if WORKER in app else 0
    return len(app.middlewares) == 1 and len(app.on_response_prepare) == hooks


class FastServer(web.Server):
    """aiohttp's low-level server whose connections start on the fast path (:class:`FastProtocol`)."""

    def __init__(self, app: web.Application, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gateway = app[GATEWAY]
        self.max_body_bytes = app[SETTINGS].max_body_bytes
        self.recorder = app[RECORDER]
        worker = app.get(WORKER)
        self.worker_header = f"X-Forestflow-Worker: {worker.replica_id}\r\n" if worker is not None else ""
        self.keepalive_timeout = float(kwargs.get("keepalive_timeout", 3630.0))
        self.router = app.router
        #: Connections on the fast path (those handed to aiohttp are in ``_connections``).
        self.fast_connections: set[FastProtocol] = set()
        #: Requests answered on the fast path so far.
        self.answered = 0
        self._targets: dict[tuple[str, str], _Target | None] = {}

    def __call__(self) -> FastProtocol:  # type: ignore[override]
        return FastProtocol(self)

    def aiohttp_handler(self) -> RequestHandler:
        """A connection handler of aiohttp's own."""
        return super().__call__()

    def target(self, method: str, path: str, url: Any) -> _Target | None:
        """The scoring route ``method path`` goes to, or None (not a scoring route)."""
        key = (method, path)
        try:
            return self._targets[key]
        except KeyError:
            pass
        target = None
        match = _resolve(self.router, method, url) if path.startswith("/") else None
        if match is not None and match.http_exception is None:
            route = EXCHANGE_ROUTES.get(match.route.handler)
            if route is not None:
                target = _Target(route, dict(match), match.route.resource, url.path)
        if len(self._targets) >= _MAX_TARGETS:
            self._targets.clear()
        self._targets[key] = target
        return target

    def cached_target(self, method: str, path: str) -> _Target | None:
        """The scoring route of ``method path`` when a request for it was routed before, else None."""
        return self._targets.get((method, path))

    def pre_shutdown(self) -> None:
        super().pre_shutdown()
        for conn in list(self.fast_connections):
            conn.close()

    async def shutdown(self, timeout: float | None = None) -> None:
        fast = [conn.shutdown(timeout) for conn in list(self.fast_connections)]
        await asyncio.gather(super().shutdown(timeout), *fast)


@dataclass(slots=True)
class _Message:
    """The request being read: its route, what its head says, its body stream and where its body
    ends in the connection's buffer (-1: chunked, found by the parser)."""

    target: _Target
    method: str
    headers: CIMultiDictProxy[str]
    version: Any  # aiohttp's HttpVersion
    should_close: bool
    payload: Any  # aiohttp's StreamReader, EMPTY_PAYLOAD, or None: read from the buffer (a plain head, _plain_request)
    body_end: int


class FastProtocol(asyncio.Protocol):
    """One connection: scoring requests answered here, one at a time and in order; the connection
    is handed to aiohttp's ``RequestHandler`` at the first request that is not one."""

    def __init__(self, server: FastServer) -> None:
        self._server = server
        self._loop = server._loop
        self.transport: asyncio.Transport | None = None
        #: Raw bytes from the first byte of the request being read (or of the next one) on.
        self._buf = bytearray()
        self._parser: Any = None
        #: Bytes of ``_buf`` the parser has read (all of them part of the current request).
        self._fed = 0
        self._current: _Message | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._reading_paused = False  # read by aiohttp's StreamReader
        self._writing_paused = False
        self._idle_handle: asyncio.TimerHandle | None = None
        self._last_seen = 0.0

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        tcp_keepalive(self.transport)
        self._server.fast_connections.add(self)
        self._last_seen = self._loop.time()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._last_seen = self._loop.time()
        self._buf += data
        if self._task is None:
            self._process()
        elif len(self._buf) > _HIGH_WATER and not self._reading_paused:
            self.pause_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._detach()
        task = self._task
        if task is not None and self._server.handler_cancellation:
            task.cancel()  # the client gave up: its queued job is withdrawn

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._task is None:
            self._process()

    # ---- what aiohttp's StreamReader calls -----------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the connection is open (aiohttp's protocols say so)."""
        return self.transport is not None

    def pause_reading(self) -> None:
        """Stop reading from the socket."""
        if self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True

    def resume_reading(self, resume_parser: bool = True) -> None:
        """Read from the socket again."""
        if self.transport is not None and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    # ---- shutdown (the server's pre_shutdown and shutdown) -------------------------------------
    def close(self) -> None:
        """Close once the request being answered is (at once when idle)."""
        self._closing = True
        if self._task is None and self._current is None:
            self._close_transport()

    async def shutdown(self, timeout: float | None) -> None:
        """Let the request being answered finish (up to ``timeout``), then close."""
        self._closing = True
        task = self._task
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        self._close_transport()

    # ---- reading requests ----------------------------------------------------------------------
    def _process(self) -> None:
        """Read and start the next request(s) buffered, while none is being answered."""
        while self._task is None and self.transport is not None and not self._writing_paused:
            current = self._current
            if current is None:
                if self._closing:
                    self._close_transport()
                    return
                if not self._buf:
                    return
                current = self._start_request()
                if current is None:
                    return
            body = self._read_body(current)
            if body is None:
                return
            self._current = None
            del self._buf[: self._fed]
            self._fed = 0
            if self._reading_paused and len(self._buf) < _HIGH_WATER:
                self.resume_reading()
            self._task = self._loop.create_task(self._serve(current, body))

    def _start_request(self) -> _Message | None:
        """Parse the head of the next request; None: wait for more bytes, or handed to aiohttp."""
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD or b"\n\n" in buf:  # too large, or bare LF line ends: aiohttp decides
                self._hand_off()
            return None
        if tracing.ON:  # spans are made by the middleware
            self._hand_off()
            return None
        head_end = end + 4
        plain = self._plain_request(head_end)
        if plain is not None:
            return plain
        if self._parser is None:
            # The body stream's limit is the body cap: it never asks to pause reading (the body is
            # read whole here, and a body over the cap goes to aiohttp).
            self._parser = HttpRequestParser(self, self._loop, self._server.max_body_bytes, auto_decompress=False)
        try:
            messages, upgraded, _ = self._parser.feed_data(bytes(buf[:head_end]))
        except Exception:  # refused by llhttp: aiohttp answers it (400) as it always did, handed over below
            messages, upgraded = (), False  # (outside this block: aiohttp's log shows its error alone)
        if len(messages) != 1 or upgraded or (messages[0][1] is not EMPTY_PAYLOAD and messages[0][1].total_bytes):
            # (llhttp refuses bare-LF line ends in requests: the head ends exactly at the blank line)
            self._hand_off()
            return None
        message, payload = messages[0]
        target = self._server.target(message.method, message.path, message.url)
        if target is None or message.compression is not None or message.upgrade:
            self._hand_off()
            return None
        if payload is EMPTY_PAYLOAD:
            body_end = head_end
        elif message.chunked:
            body_end = -1
        else:
            length = message.headers.get("Content-Length")
            if length is None or int(length) >= self._server.max_body_bytes:  # aiohttp answers the 413 as before
                self._hand_off()
                return None
            body_end = head_end + int(length)
        expect = message.headers.get("Expect")
        if expect is not None:
            if message.version != HttpVersion11 or expect.lower() != "100-continue":
                self._hand_off()
                return None
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._fed = head_end
        current = self._current = _Message(
            target, message.method, message.headers, message.version, message.should_close, payload, body_end
        )
        return current

    def _plain_request(self, head_end: int) -> _Message | None:
        """The usual request, its head read in C without llhttp (``_ffhttp.request_head``: a POST with
        a Content-Length, nothing that changes how it is read), for a target llhttp has read before
        and found a scoring route for; None: read by llhttp (a head it refuses is read there too)."""
        head = request_head(self._buf, head_end, _HEADER_NAMES, istr)
        if head is None:
            return None
        path, minor, should_close, length, headers = head
        target = self._server.cached_target("POST", path)
        if target is None or length >= self._server.max_body_bytes:  # over the cap: llhttp's path hands it over
            return None
        self._fed = head_end
        version = HttpVersion11 if minor == 1 else HttpVersion10
        current = self._current = _Message(
            target, "POST", CIMultiDictProxy(CIMultiDict(headers)), version, should_close, None, head_end + max(length, 0)
        )
        return current

    def _read_body(self, current: _Message) -> bytes | None:
        """The whole body of the current request; None: wait for more bytes, or handed to aiohttp.
        The parser is never fed a byte past the request's end, so the next request's bytes stay
        whole in the buffer (for aiohttp, should it be handed over)."""
        payload = current.payload
        if payload is None:  # a plain head: the body is the next Content-Length bytes
            if len(self._buf) < current.body_end:
                return None
            body = bytes(self._buf[self._fed : current.body_end])
            self._fed = current.body_end
            return body
        if payload is EMPTY_PAYLOAD:
            return b""
        buf, parser = self._buf, self._parser
        try:
            if current.body_end >= 0:
                stop = min(len(buf), current.body_end)
                if stop > self._fed:
                    parser.feed_data(bytes(buf[self._fed : stop]))
                    self._fed = stop
            else:  # chunked: the request ends at the end of a line, so it is fed line by line
                while not payload.is_eof():
                    if payload.total_bytes >= self._server.max_body_bytes or len(buf) - self._fed > self._server.max_body_bytes:
                        self._hand_off()
                        return None
                    line_end = buf.find(b"\r\n", self._fed)
                    if line_end < 0:
                        return None
                    parser.feed_data(bytes(buf[self._fed : line_end + 2]))
                    self._fed = line_end + 2
        except Exception:  # a malformed body: aiohttp answers it as it always did, handed over below
            refused = True
        else:
            refused = False
        if refused or payload.exception() is not None:
            self._hand_off()
            return None
        if not payload.is_eof():
            return None
        if current.body_end < 0 and payload.total_bytes >= self._server.max_body_bytes:
            self._hand_off()
            return None
        return bytes(payload.read_nowait(-1))

    # ---- answering -----------------------------------------------------------------------------
    async def _serve(self, current: _Message, body: bytes) -> None:
        try:
            await self._answer(current, body)
        except Exception:  # a bug past the answer (writing it): the connection cannot go on
            log.exception("fast_path_failed", path=current.target.path)
            self._close_transport()
        finally:
            self._task = None
        if self.transport is not None:
            self._last_seen = self._loop.time()
            if current.should_close:
                self._close_transport()
            else:
                self._process()

    async def _answer(self, current: _Message, body: bytes) -> None:
        server, target = self._server, current.target
        server.answered += 1
        started = time.perf_counter()
        request_id = request_id_from(current.headers.get("X-Request-Id", ""))

        async def read() -> bytes:
            return body

        exchange = Exchange(server.gateway, target.params, current.headers, read, request_id, target.path)
        status, error = 500, None
        try:
            reply = await target.route.answer(exchange)
            status = reply.status
        except GatewayError as exc:
            reply, error = self._error_reply(exc, request_id, target.route.v2_errors)
            status = reply.status
        except asyncio.CancelledError:
            status = 499  # the client disconnected; nothing is sent
            raise
        except Exception:
            log.exception("unhandled_error", request_id=request_id, path=target.path)
            reply, error = self._error_reply(internal_error(exchange.fqrv), request_id, False)
            status = reply.status
        finally:
            server.recorder.finish(
                target.resource,
                current.method,
                target.path,
                request_id,
                status,
                time.perf_counter() - started,
                exchange.contract,
                exchange.fqrv,
                exchange.scoring_s,
                error,
            )
        content = reply.body  # (not `body`: the request's, which read() returns)
        if reply.compress is not None:
            compressor = ZLibCompressor(encoding=reply.compress, max_sync_chunk_size=None)
            content = await compressor.compress(content) + compressor.flush()
        self._write(current, reply, content, request_id)

    @staticmethod
    def _error_reply(error: GatewayError, request_id: str, v2: bool) -> tuple[Reply, tuple[str, str]]:
        status, content, headers = error_parts(error, request_id, v2=v2)
        return Reply(content, JSON, status, headers), (error.code, error.message)

    def _write(self, current: _Message, reply: Reply, body: bytes, request_id: str) -> None:
        """The response as aiohttp's ``web.Response`` writes it (the same headers), in one write;
        ``body``: the reply's, compressed when it asks to be (a plain call: no coroutine per request)."""
        version = current.version
        key = (version, reply.status, reply.content_type)
        start = _STARTS.get(key)
        if start is None:  # the status line and content type, made once per (version, status, type)
            start = f"HTTP/{version.major}.{version.minor} {reply.status} {_REASONS.get(reply.status, '')}\r\n"
            start += f"Content-Type: {reply.content_type}\r\n"
            if len(_STARTS) >= _MAX_TARGETS:
                _STARTS.clear()
            _STARTS[key] = start
        head = [start]
        extra = reply.headers
        if extra:
            head.extend(f"{name}: {value}\r\n" for name, value in extra.items())
        if not extra or "X-Request-Id" not in extra:
            head.append(f"X-Request-Id: {request_id}\r\n")
        if reply.compress is not None:
            head.append(f"Content-Encoding: {reply.compress}\r\n")
        head.append(f"Content-Length: {len(body)}\r\nDate: {rfc822_formatted_time()}\r\nServer: {SERVER_SOFTWARE}\r\n")
        if current.should_close:
            if version == HttpVersion11:
                head.append("Connection: close\r\n")
        elif version != HttpVersion11:
            head.append("Connection: keep-alive\r\n")
        head.append(self._server.worker_header)
        head.append("\r\n")
        transport = self.transport
        if transport is None:
            return
        data = "".join(head).encode()
        if len(body) < 65536:
            transport.write(data + body)
        else:
            transport.write(data)
            transport.write(body)

    # ---- connection ----------------------------------------------------------------------------
    def _hand_off(self) -> None:
        """Give the connection to aiohttp from the start of the current request on."""
        transport = self.transport
        assert transport is not None
        paused = self._reading_paused
        data = bytes(self._buf)
        self._detach()
        handler = self._server.aiohttp_handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if paused:
            transport.resume_reading()
        if data:
            handler.data_received(data)

    def _detach(self) -> None:
        self.transport = None
        self._server.fast_connections.discard(self)
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        self._parser = None
        self._current = None
        self._buf = bytearray()

    def _close_transport(self) -> None:
        transport = self.transport
        if transport is not None:
            self._detach()
            transport.close()

    def _arm_idle(self) -> None:
        timeout = self._server.keepalive_timeout
        if timeout > 0:
            self._idle_handle = self._loop.call_at(self._last_seen + timeout, self._idle_check)

    def _idle_check(self) -> None:
        """Close a keep-alive connection idle for ``keepalive_timeout`` (as aiohttp does)."""
        self._idle_handle = None
        if self.transport is None:
            return
        idle = self._task is None and self._current is None
        if idle and self._loop.time() >= self._last_seen + self._server.keepalive_timeout:
            self._close_transport()
        else:
            self._arm_idle()


class FastRunner(web.AppRunner):
    """aiohttp's AppRunner whose server answers scoring requests on the fast path."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        app = self.app
        if not fast_path_usable(app):
            log.warning("http_fast_path_off", reason="the app has middleware or hooks the fast path does not run")
            return server
        try:  # aiohttp's server as it made it, with the same handler, factory and options
            return FastServer(
                app,
                server.request_handler,
                request_factory=server.request_factory,
                handler_cancellation=server.handler_cancellation,
                loop=server._loop,
                **server._kwargs,
            )
        except (AttributeError, TypeError) as exc:  # an aiohttp whose server differs: plain aiohttp
            log.warning("http_fast_path_off", reason=f"aiohttp's server changed: {exc}")
            return server
