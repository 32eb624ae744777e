"""Stopping background tasks for good."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_until_done(tasks: Iterable[asyncio.Task[Any]], retry_s: float = 1.0) -> None:
    """Cancel ``tasks`` and return once every one is done, cancelling again every ``retry_s``.

    One cancel is not always enough: Python 3.11's ``wait_for`` drops a cancel that coincides with its
    inner wait ending, and a client may turn a cancel into an error a retry loop catches. A loop that
    lost its cancel then goes on (a store's subscription reconnecting, a gateway timer) and a shutdown
    waiting for it never ends. Their errors are taken as seen (asyncio does not log them as never
    retrieved): a task that stops on shutdown logs its own failures.
    """
    every = set(tasks)
    pending = set(every)
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=retry_s)
    for task in every:
        if not task.cancelled():
            task.exception()
