"""Release loads that must eventually succeed on this process, retried with backoff.

A release this process should hold but did not load itself on a deploy (learnt from the shared
store by a ``--workers N`` worker or a Redis replica, restored at start, deployed from the model
repository at start) is *followed* here: one task per release runs attempts until one succeeds or
the release is no longer wanted (deleted, or replaced by a definition that is followed instead).
A failed attempt is logged once with its reason, counted per fqrv, and retried after a bounded,
jittered exponential :class:`Backoff`. Meanwhile the release is shown as ``loading`` (its first
attempt) or ``failed`` (with the last error, the attempts made and when the next one starts).

What an attempt is belongs to the owner (:mod:`forestflow.replica_sync` loads and installs,
:mod:`forestflow.repository` deploys): an :data:`Attempt` returns True when it is done, False
when it should be made again at once (the definition changed meanwhile), and raises when it failed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import structlog

from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import GatewayError
from forestflow.registry.registry import Registry

log = structlog.get_logger("forestflow.service")

#: One attempt of a followed release (see the module's docstring).
Attempt = Callable[[ServableDefinition], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between attempts: doubling from ``first_s`` up to ``max_s``, each cut by up to half at
    random, so processes that failed together do not all retry at the same moment."""

    first_s: float = 0.5
    max_s: float = 30.0

    def delay(self, failures: int, draw: float) -> float:
        """Seconds before the next attempt after ``failures`` failed ones (``draw`` in [0, 1))."""
        base = min(self.max_s, self.first_s * 2.0 ** min(max(failures - 1, 0), 32))
        return base * (1.0 - 0.5 * draw)


class LoadState(StrEnum):
    """Where a followed release stands on this process (a loaded one is no longer followed)."""

    LOADING = "loading"
    FAILED = "failed"


@dataclass(slots=True, eq=False)
class LoadStatus:
    """One followed release: its definition, how it goes, and the task's wake-up call."""

    definition: ServableDefinition
    attempt: Attempt
    #: Whether the release is in the registry store (a follower must hold it): it then counts in
    #: readiness and inactive contracts; False for a model repository entry not deployed yet.
    registered: bool = True
    state: LoadState = LoadState.LOADING
    attempts: int = 0
    error: str = ""
    #: ``time.monotonic()`` of the next attempt while waiting for it.
    next_attempt_at: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the first attempt has finished (however it went).
    first_done: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self, now: float | None = None) -> dict[str, Any]:
        """As JSON: state, attempts made, the last error and seconds to the next attempt."""
        out: dict[str, Any] = {"state": self.state.value, "attempts": self.attempts}
        if self.error:
            out["error"] = self.error
        if self.next_attempt_at is not None:
            now = time.monotonic() if now is None else now
            out["retryInS"] = round(max(0.0, self.next_attempt_at - now), 1)
        return out


class ReleaseLoads:
    """Every release this process follows, the task that attempts each, and their status."""

    def __init__(self, registry: Registry, backoff: Backoff, draw: Callable[[], float] = random.random) -> None:
        self.registry = registry
        self.backoff = backoff
        self._draw = draw
        self.statuses: dict[FQRV, LoadStatus] = {}
        #: Failed attempts per fqrv since start (``forestflow_release_load_failures_total``).
        self.failure_counts: dict[str, int] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    # ---- lookups ----------------------------------------------------------------------------------
    def target(self, fqrv: FQRV) -> ServableDefinition | None:
        """The definition a followed release should be loaded as (None: not followed any more)."""
        status = self.statuses.get(fqrv)
        return status.definition if status is not None and not self.closed else None

    def failed(self, contract: Contract | None = None) -> dict[FQRV, LoadStatus]:
        """The followed releases whose last attempt failed (of one contract, if given)."""
        return {
            f: s for f, s in self.statuses.items() if s.state is LoadState.FAILED and (contract is None or f.contract == contract)
        }

    def contracts(self) -> set[Contract]:
        """Contracts with a release this process follows (loading or failing)."""
        return {f.contract for f in self.statuses}

    # ---- following --------------------------------------------------------------------------------
    def follow(self, defn: ServableDefinition, attempt: Attempt, *, registered: bool = True, failed: str = "") -> None:
        """Load ``defn`` in the background until an attempt succeeds or :meth:`drop`.

        A release followed already takes the new definition and attempt (its task makes the next
        attempt with them), unless it is the store's and this one is not. ``failed``: the first
        attempt was made by the caller and failed with this reason; the task starts with the backoff.
        """
        if self.closed:
            return
        fqrv = defn.fqrv
        status = self.statuses.get(fqrv)
        if status is not None:
            if status.registered and not registered:  # the store's release: its follower's attempts stand
                return
            status.attempt = attempt
            if registered and not status.registered:  # a repository entry another process deployed
                status.registered = True
                if status.state is LoadState.FAILED:
                    self.registry.failed[fqrv] = status.error
                else:
                    self.registry.pending.add(fqrv)
            if status.definition != defn:  # attempted at once, its backoff afresh
                status.definition, status.attempts = defn, 0
                status.wake.set()
            return
        status = self.statuses[fqrv] = LoadStatus(defn, attempt, registered)
        if failed:
            self._record_failure(status, failed)
        elif registered:
            self.registry.pending.add(fqrv)
        task = asyncio.create_task(self._run(fqrv, status), name=f"load {fqrv}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def drop(self, fqrv: FQRV) -> None:
        """Stop following a release (deleted, or loaded by other means); an attempt under way is
        discarded by its owner when it finds the release no longer followed."""
        status = self.statuses.pop(fqrv, None)
        if status is None:
            return
        if status.registered:
            self.registry.pending.discard(fqrv)
            self.registry.failed.pop(fqrv, None)
        status.wake.set()
        status.first_done.set()

    def close(self) -> None:
        """Stop every task (attempts under way finish, their results are discarded)."""
        self.closed = True
        for status in self.statuses.values():
            status.wake.set()
            status.first_done.set()

    async def first_attempts(self, fqrvs: Iterable[FQRV]) -> None:
        """Wait until each of these releases has had its first attempt."""
        events = [s.first_done.wait() for f in fqrvs if (s := self.statuses.get(f)) is not None]
        await asyncio.gather(*events)

    # ---- the task of one release --------------------------------------------------------------------
    async def _run(self, fqrv: FQRV, status: LoadStatus) -> None:
        try:
            if status.state is LoadState.FAILED:
                await self._pause(status)
            while self._current(fqrv, status):
                if fqrv in self.registry.loaded:  # installed by other means (e.g. an admin deploy here)
                    self.drop(fqrv)
                    return
                defn = status.definition
                status.attempts += 1
                status.next_attempt_at = None
                try:
                    done = await status.attempt(defn)
                except Exception as exc:
                    if not self._current(fqrv, status):
                        return
                    self._record_failure(status, exc.message if isinstance(exc, GatewayError) else repr(exc))
                    status.first_done.set()
                    await self._pause(status)
                    continue
                status.first_done.set()
                if done:
                    if self.statuses.get(fqrv) is status:
                        self.drop(fqrv)
                    return
        finally:
            status.first_done.set()

    def _current(self, fqrv: FQRV, status: LoadStatus) -> bool:
        return not self.closed and self.statuses.get(fqrv) is status

    def _record_failure(self, status: LoadStatus, reason: str) -> None:
        fqrv = status.definition.fqrv
        if status.attempts == 0:
            status.attempts = 1
        status.state, status.error = LoadState.FAILED, reason
        delay = self.backoff.delay(status.attempts, self._draw())
        status.next_attempt_at = time.monotonic() + delay
        label = str(fqrv)
        self.failure_counts[label] = self.failure_counts.get(label, 0) + 1
        if status.registered:
            self.registry.pending.discard(fqrv)
            self.registry.failed[fqrv] = reason
        self.registry.stale.add(fqrv.contract)  # evaluated at the next round, as after a load that succeeded
        log.error("release_load_failed", fqrv=label, attempt=status.attempts, reason=reason, retry_in_s=round(delay, 2))

    async def _pause(self, status: LoadStatus) -> None:
        """Wait for the next attempt; woken early by a new definition, a drop or close."""
        status.wake.clear()
        delay = (status.next_attempt_at or time.monotonic()) - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(status.wake.wait(), delay)
            except TimeoutError:
                pass
        status.next_attempt_at = None
