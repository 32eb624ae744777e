"""Residency: which releases are in memory on this process (lazy loading and the memory budget).

With lazy loading a release can be part of its contract's routing without being loaded here
(*cold*: restored at start, learnt from the store, or evicted). The first request routed to it
loads it; concurrent first requests share that one load and wait for it within their deadline. A
load that fails answers 503 with the reason and is retried with backoff by
:class:`~forestflow.registry.release_loads.ReleaseLoads`. In the background, routed releases are
loaded too (most used first, ``warm_concurrency`` at a time) while the budget has room, while no
request is being served (:data:`BUSY_WINDOW_S`): a load's thread holds the GIL the event loop
needs, so the warm-up waits for a quiet moment instead of slowing the requests down. Traffic that
never pauses still lets one load through now and then (:data:`WARM_BUSY_INTERVAL_S`,
:data:`WARM_BUSY_SHARE`), so the warm-up progresses without touching the requests' tail.

With ``model_memory_budget_mb`` every loaded release is counted by what it took: the growth of
the process's RSS over its load, measured one load at a time, the largest seen for the same model
file, never less than the file (:meth:`~forestflow.registry.loader.ServableLoader._measured_load`;
the file's size alone understated a GBM 7 to 17 times). A release known to be larger than the
whole budget is refused before it is loaded, one measured larger is unloaded and refused. When a
load takes the sum over the budget, the least recently used idle releases (no admitted work) are
unloaded until it fits again: make-before-break, the new release is loaded before the old ones
go, so the peak is the budget plus one release. Warming in the background never evicts.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from typing import Any

import structlog

from forestflow.core.definition import ServableDefinition, same_artifact
from forestflow.core.histogram import Histogram
from forestflow.core.ids import FQRV
from forestflow.errors import DeadlineExceeded, GatewayError, ServableNotReady, UnknownServable
from forestflow.registry.loader import ServableLoader
from forestflow.registry.registry import Loaded, Registry
from forestflow.registry.release_loads import LoadState, ReleaseLoads
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")

#: The warm-up counts the gateway as serving when a request was routed within this many seconds.
BUSY_WINDOW_S = 0.5
#: While requests keep coming, one background load may start this many seconds after the traffic began
#: or after the last one ended, whichever is later ...
WARM_BUSY_INTERVAL_S = 10.0
#: ... and loads take at most this share of the time (the wait after a load is its duration over it), so
#: they stall fewer than 1% of the requests and the p99 stays the one of a gateway with nothing to warm.
WARM_BUSY_SHARE = 0.005


class Residency:
    """On-demand and background loads of cold releases, and the memory budget's LRU evictions."""

    def __init__(self, settings: Settings, registry: Registry, loader: ServableLoader, loads: ReleaseLoads) -> None:
        self.registry = registry
        self.loader = loader
        self.loads = loads
        self.budget = settings.memory_budget_bytes
        #: Releases load on first use (requests routed to loaded ones are :meth:`touch`-ed).
        self.lazy = settings.lazy
        self.warm_concurrency = settings.warm_concurrency
        #: Releases that were loaded here, least recently used first (some may be gone since).
        self.recent: OrderedDict[FQRV, None] = OrderedDict()
        #: Loads of cold releases under way (one per release, shared by every request waiting).
        self._loading: dict[FQRV, asyncio.Task[Loaded]] = {}
        self._evicting = False
        #: Requests waiting for a release to load, per release (it is not evicted meanwhile).
        self._waiting: dict[FQRV, int] = {}
        self._warm_wake = asyncio.Event()
        #: Set while the background warm-up waits for the requests to stop.
        self.warm_paused = asyncio.Event()
        #: When a request was last routed to a loaded release (the warm-up waits for a quiet moment).
        self.last_request = 0.0
        #: The earliest moment a background load may start while requests keep coming.
        self._next_busy_load = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        # Counters since start (``/metrics``).
        self.loads_done = 0
        self.evictions = 0
        self.bytes_loaded = 0
        self.shadow_cold_skipped = 0
        self.cold_waits = Histogram()
        registry.on_loaded = self._loaded

    # ---- the state of one release -------------------------------------------------------------
    def state(self, fqrv: FQRV) -> str:
        """loaded, loading, failed or cold (``/stats``, ``/metadata``, the page)."""
        if fqrv in self.registry.loaded:
            return "loaded"
        status = self.loads.statuses.get(fqrv)
        if status is not None and status.state is LoadState.FAILED:
            return "failed"
        if fqrv in self._loading or fqrv in self.registry.pending or status is not None:
            return "loading"
        return "cold"

    def touch(self, fqrv: FQRV) -> None:
        """A request was routed to a loaded release (it becomes the most recently used)."""
        self.last_request = time.monotonic()
        if fqrv in self.recent:
            self.recent.move_to_end(fqrv)

    @property
    def used_bytes(self) -> int:
        """The sizes of the releases loaded here."""
        return sum(loaded.size_bytes for loaded in list(self.registry.loaded.values()))

    # ---- on demand ------------------------------------------------------------------------------
    async def get(self, fqrv: FQRV, timeout_s: float) -> Loaded:
        """The loaded servable of ``fqrv``, loading it first when it is cold (within ``timeout_s``).

        A release whose load failed answers 503 with the reason until its retry (with backoff)
        succeeds; one that does not load within the deadline is a 504."""
        loaded = self.registry.loaded.get(fqrv)
        if loaded is not None:
            return loaded
        status = self.loads.statuses.get(fqrv)
        if status is not None and status.state is LoadState.FAILED:
            raise ServableNotReady(
                f"servable {fqrv} failed to load on this process ({status.attempts} attempts, retried): {status.error}"
            )
        started = time.perf_counter()
        # Not evicted while requests wait for it: they submit as soon as it is loaded.
        self._waiting[fqrv] = self._waiting.get(fqrv, 0) + 1
        try:
            while (loaded := self.registry.loaded.get(fqrv)) is None:
                task = self.load(fqrv)
                if task is None:
                    raise ServableNotReady(f"servable {fqrv} is not loaded")
                remaining = timeout_s - (time.perf_counter() - started)
                await asyncio.wait_for(asyncio.shield(task), max(remaining, 0.0))
            return loaded
        except TimeoutError:
            raise DeadlineExceeded(f"servable {fqrv} did not load within the request's deadline ({timeout_s:g} s)") from None
        except GatewayError as error:
            raise ServableNotReady(f"servable {fqrv} failed to load on this process (retried): {error.message}") from None
        finally:
            self.cold_waits.observe(time.perf_counter() - started)
            if self._waiting[fqrv] == 1:
                del self._waiting[fqrv]
            else:
                self._waiting[fqrv] -= 1

    def load(self, fqrv: FQRV) -> asyncio.Task[Loaded] | None:
        """Start loading a cold release (or join the load under way); None when it is not cold."""
        task = self._loading.get(fqrv)
        if task is not None:
            return task
        defn = self.registry.cold.get(fqrv)
        if defn is None or self.closed:
            return None
        task = self._loading[fqrv] = asyncio.create_task(self._load(defn), name=f"cold load {fqrv}")
        task.add_done_callback(lambda t: self._loaded_or_failed(fqrv, t))
        return task

    async def _load(self, defn: ServableDefinition) -> Loaded:
        loaded = await self.loader.load(defn, restoring=True)
        fqrv = defn.fqrv
        wanted = self.registry.cold.get(fqrv)
        if self.closed or wanted is None or not same_artifact(wanted, defn):  # deleted, loaded or redeployed meanwhile
            await self.loader.unload(loaded)
            held = self.registry.loaded.get(fqrv)
            if held is None:
                raise UnknownServable(fqrv)
            return held
        self.loads.drop(fqrv)
        self.registry.warm(loaded)
        log.info("servable_loaded_on_demand", fqrv=str(fqrv), size_bytes=loaded.size_bytes)
        return loaded

    def _loaded_or_failed(self, fqrv: FQRV, task: asyncio.Task[Loaded]) -> None:
        self._loading.pop(fqrv, None)
        if task.cancelled():
            return
        error = task.exception()
        if error is None or fqrv not in self.registry.cold:
            return
        reason = error.message if isinstance(error, GatewayError) else repr(error)
        defn = self.registry.cold[fqrv]
        # Retried with backoff until it loads or leaves the registry; answered 503 meanwhile.
        self.loads.follow(defn, self._retry, failed=reason)

    async def _retry(self, defn: ServableDefinition) -> bool:
        """One attempt of :attr:`loads` at a cold release whose load failed."""
        task = self.load(defn.fqrv)
        if task is not None:
            await task
        return True

    # ---- the budget -------------------------------------------------------------------------------
    def _loaded(self, loaded: Loaded) -> None:
        fqrv = loaded.definition.fqrv
        self.recent[fqrv] = None
        self.recent.move_to_end(fqrv)
        self.loads_done += 1
        self.bytes_loaded += loaded.size_bytes
        if self.budget and self.used_bytes > self.budget and not self._evicting:
            self._spawn(self._evict_to_budget(), "evict")

    async def _evict_to_budget(self) -> None:
        """Unload the least recently used idle releases until the loaded ones fit the budget."""
        self._evicting = True
        try:
            registry = self.registry
            while (used := self.used_bytes) > self.budget:
                for gone in [f for f in self.recent if f not in registry.loaded]:
                    del self.recent[gone]
                newest = next(reversed(self.recent), None)
                victim = next(
                    (f for f in self.recent if f != newest and f not in self._waiting and registry.loaded[f].scheduler.idle()),
                    None,
                )
                if victim is None:
                    log.warning("memory_budget_exceeded", used_bytes=used, budget_bytes=self.budget)
                    return  # everything else is busy: evicted once it is idle (the next load retries)
                async with registry.lock:
                    held = registry.loaded.get(victim)
                    if held is None or victim in self._waiting or not held.scheduler.idle():
                        continue
                    registry.evict(victim)
                del self.recent[victim]
                self.evictions += 1
                log.info(
                    "release_evicted",
                    fqrv=str(victim),
                    size_bytes=held.size_bytes,
                    used_bytes=used - held.size_bytes,
                    budget_bytes=self.budget,
                )
                await self.loader.unload(held, keep_artifact=True)  # it loads from there again
        finally:
            self._evicting = False

    # ---- background warm-up -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the background warm-up of routed cold releases (``warm_concurrency`` at a time)."""
        if self.warm_concurrency > 0:
            self._spawn(self._warm_loop(), "warm")
            self._warm_wake.set()

    def cold_added(self) -> None:
        """Cold releases were added (restored or learnt from the store): the warm-up looks again."""
        self._warm_wake.set()

    async def _warm_loop(self) -> None:
        gate = asyncio.Semaphore(self.warm_concurrency)
        while not self.closed:
            await self._warm_wake.wait()
            self._warm_wake.clear()
            for fqrv in self._warm_order():
                if self.closed or (self.budget and self.used_bytes >= self.budget):
                    break  # warming never evicts: traffic decides what stays
                await gate.acquire()
                # Only between requests: a load's thread holds the GIL the event loop needs (warm p99
                # was 1.7-3.3x with loads paced at a fifth of the time while serving). Cold requests
                # load what they need on demand meanwhile.
                await self._until_idle()
                started = time.monotonic()
                task = self.load(fqrv)
                if task is None:
                    gate.release()
                else:
                    task.add_done_callback(functools.partial(self._background_load_done, gate, started))

    def _background_load_done(self, gate: asyncio.Semaphore, started: float, _task: object) -> None:
        gate.release()
        ended = time.monotonic()
        pause = max(WARM_BUSY_INTERVAL_S, (ended - started) / WARM_BUSY_SHARE)
        self._next_busy_load = max(self._next_busy_load, ended + pause)

    async def _until_idle(self) -> None:
        """Return once no request was routed for :data:`BUSY_WINDOW_S`, or once requests have kept
        coming for :data:`WARM_BUSY_INTERVAL_S` since they began or since the last background load
        (longer after a long load: :data:`WARM_BUSY_SHARE`), or at close."""
        due: float | None = None
        while not self.closed:
            now = time.monotonic()
            idle_in = self.last_request + BUSY_WINDOW_S - now
            if idle_in <= 0:
                break
            if due is None:
                due = max(self._next_busy_load, now + WARM_BUSY_INTERVAL_S)
            if now >= due:
                break
            self.warm_paused.set()
            await asyncio.sleep(min(idle_in, due - now))
        self.warm_paused.clear()

    def _warm_order(self) -> list[FQRV]:
        """Cold releases that get traffic, most used first (routed ones before the others)."""
        registry = self.registry
        ranked = []
        for fqrv in list(registry.cold):
            state = registry.contracts.get(fqrv.contract)
            entry = state.servables.get(fqrv.release) if state is not None else None
            if entry is None or fqrv in self.loads.statuses:
                continue
            m = entry.metrics
            ranked.append((m.current_phase_in_pct > 0, m.score_count + m.shade_count, m.created_at_ms, fqrv))
        ranked.sort(key=lambda r: r[:3], reverse=True)
        return [r[3] for r in ranked]

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> list[asyncio.Task[Any]]:
        """Stop warming and evicting; returns what is still running (to wait for briefly)."""
        self.closed = True
        self._warm_wake.set()
        return [*self._tasks, *self._loading.values()]

    def view(self) -> dict[str, Any]:
        """For ``/stats`` and ``/health/ready``: the budget, the bytes loaded, counts."""
        return {
            "budgetBytes": self.budget,
            "usedBytes": self.used_bytes,
            "loaded": len(self.registry.loaded),
            "cold": len(self.registry.cold),
            "loads": self.loads_done,
            "evictions": self.evictions,
            "shadowColdSkipped": self.shadow_cold_skipped,
        }
