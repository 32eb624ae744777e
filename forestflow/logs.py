"""structlog configuration (JSON lines on stderr, level from settings) and the access log.

Every line goes through one :class:`LineSink`. structlog's lines (start-up, warnings, errors) are
written at once; the access log's one line per request is buffered and written every
``ACCESS_FLUSH_S`` or when 64 KiB have gathered, and always before any other line, so lines keep
their order. A write per request would cost a syscall per request on the event loop thread.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
from collections.abc import MutableMapping
from typing import Any, BinaryIO

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

#: Longest time an access line waits in the buffer.
ACCESS_FLUSH_S = 0.25
_MAX_PENDING = 64 * 1024


class LineSink:
    """Lines to one binary stream: some written at once, others gathered and written in batches."""

    def __init__(self, stream: BinaryIO, max_pending: int = _MAX_PENDING) -> None:
        self._stream = stream
        self._max_pending = max_pending
        self._pending = bytearray()
        self._lock = threading.Lock()  # structlog lines may come from scoring threads
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def write(self, line: bytes) -> None:
        """Write ``line`` now, after whatever is buffered."""
        with self._lock:
            if self._pending:
                line = bytes(self._pending) + line
                self._pending.clear()
            self._stream.write(line)
            self._stream.flush()

    def buffer(self, line: bytes) -> None:
        """Buffer ``line``: written within ``ACCESS_FLUSH_S`` (call from the event loop thread)."""
        with self._lock:
            self._pending += line
            full = len(self._pending) >= self._max_pending
        if full:
            self.flush()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test, a script): nothing would flush it later
            self.flush()
            return
        if self._timer is None or self._timer_loop is not loop:  # (a timer of a loop that ended never fires)
            self._timer, self._timer_loop = loop.call_later(ACCESS_FLUSH_S, self._timed_flush), loop

    def _timed_flush(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Write whatever is buffered."""
        with self._lock:
            if not self._pending:
                return
            data = bytes(self._pending)
            self._pending.clear()
            try:
                self._stream.write(data)
                self._stream.flush()
            except (OSError, ValueError):  # the stream is closed (interpreter exit): nothing to do
                pass


class _SinkLogger:
    """structlog's final logger: each rendered event is one line on the sink, written at once."""

    def __init__(self, sink: LineSink) -> None:
        self._sink = sink

    def msg(self, message: bytes) -> None:
        self._sink.write(message + b"\n")

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


_sink = LineSink(sys.stderr.buffer)
_access_enabled = True
#: ``w<i>`` in a worker of ``serve --workers N``: every line it writes says which worker wrote it.
_worker: str | None = None
atexit.register(lambda: _sink.flush())


def configure_logging(level: str = "info", stream: BinaryIO | None = None, worker: str | None = None) -> None:
    """Route structlog (and the stdlib loggers of our dependencies) to JSON lines on ``stream`` (stderr);
    a ``worker`` (``w1``) is named in every line."""
    global _sink, _access_enabled, _worker
    numeric = _LEVELS[level]
    _worker = worker
    _sink.flush()
    _sink = LineSink(stream if stream is not None else sys.stderr.buffer)
    _access_enabled = numeric <= logging.INFO
    logging.basicConfig(stream=sys.stderr, level=max(numeric, logging.WARNING), format="%(message)s")
    sink = _sink
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *([_name_worker] if worker else []),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *args: _SinkLogger(sink),
        cache_logger_on_first_use=True,
    )


def _name_worker(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["worker"] = _worker
    return event


_second = -1
_second_text = ""


def _utc_timestamp() -> str:
    """Now as structlog's ISO UTC stamp (``2026-11-21T16:01:57.634490Z``), the date part cached per second."""
    global _second, _second_text
    now = time.time()
    second = int(now)
    if second != _second:
        _second, _second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_second_text}.{int((now - second) * 1_000_000):06d}Z"


def access(
    request_id: str,
    method: str,
    path: str,
    status: int,
    contract: str | None,
    fqrv: str | None,
    ms: float,
    trace_id: str | None = None,
) -> None:
    """The access log's line for one request: the fields a structlog ``request`` event would carry.

    Built here rather than through structlog's processor chain: that chain costs ~10 us, on
    every request, on the event loop thread.
    """
    if not _access_enabled:
        return
    line: dict[str, Any] = {
        "request_id": request_id,
        "method": method,
        "path": path,
        "status": status,
        "contract": contract,
        "fqrv": fqrv,
        "ms": ms,
        "event": "request",
        "level": "info",
        "logger": "forestflow.access",
        "timestamp": _utc_timestamp(),
    }
    if trace_id:
        line["trace_id"] = trace_id
    if _worker:
        line["worker"] = _worker
    _sink.buffer(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
