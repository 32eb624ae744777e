"""Connections shared by every release that calls the same backend server.

Two RemoteV2 releases of one contract often call the same server (two versions of one model, phased
in): they share one aiohttp session (its keep-alive connections) or one gRPC channel, created by the
first and closed with the last. Pools belong to the event loop they were made on. How many calls are
in flight stays bounded by each release's scheduler (its ``maxConcurrency`` slots).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Entry(Generic[T]):
    pool: T
    users: int = 0


class SharedPool(Generic[T]):
    """Reference-counted objects by key, one table per event loop."""

    def __init__(self, make: Callable[[str], T], close: Callable[[T], Awaitable[None]]) -> None:
        self._make = make
        self._close = close
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Entry[T]]] = weakref.WeakKeyDictionary()

    def acquire(self, key: str) -> T:
        """The pool for ``key`` on the running loop, made if none is open; :meth:`release` it once done."""
        table = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _Entry(self._make(key))
        entry.users += 1
        return entry.pool

    async def release(self, key: str) -> None:
        """Give back one use; the last closes the pool."""
        table = self._by_loop.get(asyncio.get_running_loop(), {})
        entry = table.get(key)
        if entry is None:
            return
        entry.users -= 1
        if entry.users <= 0:
            del table[key]
            await self._close(entry.pool)

    def users(self, key: str) -> int:
        """How many releases use the pool for ``key`` on the running loop (0: none open)."""
        entry = self._by_loop.get(asyncio.get_running_loop(), {}).get(key)
        return entry.users if entry is not None else 0
