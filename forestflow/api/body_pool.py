"""Large request bodies decoded in worker processes, off the event loop.

Parsing a 17 MiB V2 JSON body (``orjson.loads`` and building its numpy columns) holds the event
loop for 100-300 ms, and every other request waits behind it. A thread does not help: orjson and
the list-to-array conversion hold the GIL throughout. So bodies over :data:`LARGE_BODY_BYTES` are
decoded in a small pool of ``spawn``-ed processes (a JVM in the gateway cannot survive a fork):
the body goes there as bytes and the decoded numpy arrays come back pickled (a copy of their
buffers, milliseconds, done by the pool's own thread). Smaller bodies stay on the loop, where
they cost less than the hop.

The pool starts on the first large body and is shut down with the app. If a worker process dies
(e.g. killed for memory), the pool is replaced and that body is decoded on the loop instead.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import structlog

from forestflow.errors import GatewayError

log = structlog.get_logger("forestflow.api")

#: Bodies (their JSON part) larger than this are decoded in a worker process.
LARGE_BODY_BYTES = 1 << 20
#: Worker processes of the pool (each holds one body being decoded, and its columns).
POOL_PROCESSES = max(1, min(2, os.cpu_count() or 1))

T = TypeVar("T")
_pool: ProcessPoolExecutor | None = None
#: Set when worker processes cannot run in this process at all.
_disabled = False
#: Bodies decoded by the pool's processes so far (tests and the bench read it).
decoded_off_loop = 0


def _ignore_interrupts() -> None:
    # Ctrl-C in a terminal signals the whole process group: the gateway handles it, not its helpers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(
            POOL_PROCESSES, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_interrupts
        )
    return _pool


async def run_off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker process (``fn`` and its arguments and result must pickle)."""
    global _pool, _disabled, decoded_off_loop
    if _disabled:
        return fn(*args)
    pool = _get_pool()
    try:
        result = await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        decoded_off_loop += 1
        return result
    except GatewayError:
        raise  # the body's own fault (e.g. not JSON), decoded there: the caller's 4xx
    except BrokenProcessPool:
        log.warning("body_pool_broken", action="decoding this body on the event loop; a new pool starts")
        if _pool is pool:
            _pool = None
            pool.shutdown(wait=False, cancel_futures=True)
        return fn(*args)
    except Exception:
        # The processes cannot start here at all (e.g. an embedding script whose main module
        # starts a gateway when imported, which spawn re-imports): decode on the loop from now on.
        log.exception("body_pool_unusable", action="large bodies are decoded on the event loop from now on")
        _disabled = True
        shutdown()
        return fn(*args)


def shutdown() -> None:
    """Stop the pool's processes (the app's cleanup); a later large body starts a new pool."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
