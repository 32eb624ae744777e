"""The Gateway: the protocol-free service every front-end calls.

It owns the registry state (contracts, servable definitions, loaded servables and their
schedulers), routes each request batch to one servable, fans shadow copies out, and hands every
outcome to the prediction log. Front-ends convert their payloads to a Frame and call
:meth:`Gateway.infer`; admin front-ends call the ``create_*``/``update_*``/``delete_*`` methods
(:mod:`forestflow.administration`); :mod:`forestflow.replica_sync` follows the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from forestflow.administration import Administration, Loaded
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import (
    LogLevel,
)
from forestflow.errors import (
    ClientClosedRequest,
    GatewayError,
    InvalidInput,
    NoActiveServablesForContract,
    ServableNotReady,
    StoreUnavailable,
    UnknownContract,
    UnknownServable,
    http_status,
)
from forestflow.predlog.log import PredictionLog
from forestflow.predlog.record import PredictionRecord
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.store import Store, metrics_key, metrics_to_doc, routing_key, servable_key
from forestflow.replica_sync import ReplicaSync
from forestflow.runtime.base import ServableMetadata
from forestflow.runtime.scheduler import Priority, ShadowDropped
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class InferResult:
    """What a front-end gets back: who answered and the output batch."""

    fqrv: FQRV
    frame: Frame
    latency_ms: float
    #: The front-end's encoding of the answer, when it asked the service to make it (made once,
    #: shared with the prediction log).
    response_json: bytes | None = None


class Gateway(Administration, ReplicaSync):
    """Routing, scoring, shadowing and the registry, independent of any protocol."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        artifacts: ArtifactCache,
        prediction_log: PredictionLog,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.settings = settings
        self.store = store
        self.artifacts = artifacts
        self.prediction_log = prediction_log
        self.clock = clock
        self.contracts: dict[Contract, ContractState] = {}
        self.loaded: dict[FQRV, Loaded] = {}
        self.failed: dict[FQRV, str] = {}
        self._pending: set[FQRV] = set()
        self._admin_lock = asyncio.Lock()
        self._tasks: set[asyncio.Future[Any]] = set()  # background work (shadow copies, loads) waited for at stop
        self._timers: list[asyncio.Task[None]] = []
        self._metrics_dirty = False
        # Replica sync: the store's documents as last reconciled, background loads, failed loads.
        self._snapshot: dict[str, Any] = {}
        self._syncing: dict[FQRV, ServableDefinition] = {}
        self._failed_defs: dict[FQRV, ServableDefinition] = {}
        self.started = False
        self.draining = False

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Restore the registry from the store, load every servable, start the timers."""
        docs = await self.store.load()
        await self._restore(docs)
        self.prediction_log.start()
        self._timers = [
            asyncio.create_task(self._every(self.settings.evaluation_interval_s, self.evaluate_all), name="evaluate"),
            asyncio.create_task(self._every(self.settings.metrics_flush_interval_s, self.flush_metrics), name="flush"),
        ]
        watch = getattr(self.store, "watch", None)
        if watch is not None:  # a shared store (Redis): follow the other replicas' changes
            watch(self.sync_from_store)
        self.started = True

    async def stop(self) -> None:
        """Stop timers, wait briefly for shadow work, persist counters, flush the log, unload."""
        self.draining = True
        for timer in self._timers:
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        try:
            await self.flush_metrics(force=True)
        except StoreUnavailable as error:  # Redis away: the last flushed counters stand; shut down anyway
            log.warning("final_flush_failed", reason=error.message)
        await self.prediction_log.close(self.settings.log_flush_timeout_s)
        for loaded in list(self.loaded.values()):
            await loaded.scheduler.close()
            loaded.servable.unload()
        self.loaded.clear()
        await self.store.close()

    async def _every(self, seconds: float, action: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await action()
            except StoreUnavailable as error:  # Redis away: the store logs that once; retry next round
                log.debug("timer_store_unavailable", action=getattr(action, "__name__", str(action)), reason=error.message)
            except Exception:  # a timer must survive a failed round
                log.exception("timer_failed", action=getattr(action, "__name__", str(action)))

    async def _restore(self, docs: dict[str, Any]) -> None:
        await self.reconcile(docs, wait=True)
        log.info("registry_restored", contracts=len(self.contracts), servables=len(self.loaded), failed=len(self.failed))

    # ---- health -------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Serving: started, not draining, every registered servable loaded."""
        return self.started and not self.draining and not self.failed and not self._pending and not self.unhealthy()

    def unhealthy(self) -> dict[str, str]:
        """Loaded servables that cannot score now (e.g. their JVM died), with the reason."""
        return {str(f): p for f, loaded in self.loaded.items() if (p := loaded.servable.health_problem())}

    def readiness(self) -> dict[str, Any]:
        """Details behind :attr:`ready`."""
        return {
            "ready": self.ready,
            "started": self.started,
            "unhealthy": self.unhealthy(),
            "servables": len(self.loaded),
            "loading": sorted(str(f) for f in self._pending),
            "failed": {str(f): r for f, r in self.failed.items()},
            "draining": self.draining,
        }

    # ---- data plane ---------------------------------------------------------------------------------
    def contract_state(self, contract: Contract) -> ContractState:
        """The state of a contract or UnknownContract."""
        state = self.contracts.get(contract)
        if state is None:
            raise UnknownContract(contract)
        return state

    async def infer(
        self,
        contract: Contract,
        frame: Frame,
        *,
        configs: dict[str, str],
        request_id: str,
        protocol: str,
        timeout_s: float | None = None,
        release: str | None = None,
        raw_request: bytes | None = None,
        encode_raw_response: Callable[[FQRV, Frame], bytes] | None = None,
        request_json: bytes | None = None,
        encode_response_json: Callable[[FQRV, Frame], bytes] | None = None,
    ) -> InferResult:
        """Score one batch on the contract's routed servable (or ``release`` directly).

        Shadow copies go to every other logging servable and are never awaited. Both the answer
        and failures are logged for servables that log. A BASIC JSON front-end passes its body as
        ``request_json`` and its Prediction encoder as ``encode_response_json``: the log then
        reuses both instead of encoding the request and the answer a second time.
        """
        if frame.num_rows > self.settings.max_rows:
            raise InvalidInput(f"batch of {frame.num_rows} records is over the limit of {self.settings.max_rows}")
        state = self.contract_state(contract)
        timeout = timeout_s if timeout_s is not None else self.settings.request_timeout_ms / 1000
        if release is not None:
            if release not in state.servables:
                raise UnknownServable(FQRV(contract, release))
            answered: str | None = release
            shadows: list[str] = []
        else:
            answered = state.route()
            shadows = state.shadow_targets(answered, self.settings.log_sample_every)
        context = _RequestContext(
            frame, configs, request_id, protocol, raw_request, encode_raw_response, request_json, encode_response_json
        )
        if answered is None:
            self._fan_out(state, shadows, context)
            raise NoActiveServablesForContract(contract)
        entry = state.servables[answered]
        entry.metrics.score_count += 1
        self._metrics_dirty = True
        fqrv = entry.fqrv
        started = time.perf_counter()
        loaded = self.loaded.get(fqrv)
        try:
            if loaded is None:
                raise ServableNotReady(f"servable {fqrv} is not loaded")
            submitted = loaded.scheduler.submit(frame, Priority.LIVE, timeout)
            self._fan_out(state, shadows, context)
            out = await submitted
        except GatewayError as error:
            self._log_outcome(entry, context, True, started, error=error)
            if error.__cause__ is not None:
                log.error("predict_failed", fqrv=str(fqrv), request_id=request_id, exc_info=error.__cause__)
            raise
        except asyncio.CancelledError:
            # The client went away: its job is withdrawn, and the prediction log still says so.
            self._log_outcome(entry, context, True, started, error=ClientClosedRequest("the client closed the request"))
            raise
        response_json = encode_response_json(fqrv, out) if encode_response_json is not None else None
        latency = self._log_outcome(entry, context, True, started, output=out, response_json=response_json)
        return InferResult(fqrv, out, latency, response_json)

    def _fan_out(self, state: ContractState, releases: list[str], context: _RequestContext) -> None:
        timeout = self.settings.request_timeout_ms / 1000
        for release in releases:
            entry = state.servables[release]
            loaded = self.loaded.get(entry.fqrv)
            if loaded is None:
                continue
            entry.metrics.shade_count += 1
            self._metrics_dirty = True
            started = time.perf_counter()
            try:
                pending = loaded.scheduler.offer(context.frame, Priority.SHADOW, timeout)
            except ShadowDropped:
                continue  # counted by the scheduler; nothing was scored, so nothing to log
            except GatewayError as error:  # e.g. the servable is being unloaded
                self._log_outcome(entry, context, False, started, error=error)
                continue
            # A callback, not a task per copy: nobody waits for shadow work, so it needs no coroutine.
            pending.add_done_callback(partial(self._shadow_done, entry, context, started))
            self._tasks.add(pending)
            pending.add_done_callback(self._tasks.discard)

    def _shadow_done(
        self, entry: ServableEntry, context: _RequestContext, started: float, pending: asyncio.Future[Frame]
    ) -> None:
        if pending.cancelled():
            return
        error = pending.exception()
        if error is None:
            self._log_outcome(entry, context, False, started, output=pending.result())
        elif isinstance(error, GatewayError):
            self._log_outcome(entry, context, False, started, error=error)

    def _log_outcome(
        self,
        entry: ServableEntry,
        context: _RequestContext,
        served: bool,
        started: float,
        output: Frame | None = None,
        error: GatewayError | None = None,
        response_json: bytes | None = None,
    ) -> float:
        latency = (time.perf_counter() - started) * 1000
        logging = entry.settings.logging
        if logging.log_level is LogLevel.NONE:
            return latency
        raw_response = None
        if context.raw_request is not None and context.encode_raw_response is not None and output is not None:
            raw_response = context.encode_raw_response(entry.fqrv, output)
        if response_json is None and context.encode_response_json is not None and output is not None:
            response_json = context.encode_response_json(entry.fqrv, output)
        self.prediction_log.emit(
            PredictionRecord(
                fqrv=entry.fqrv,
                served=served,
                request=context.frame,
                configs=context.configs,
                logging=logging,
                request_id=context.request_id,
                protocol=context.protocol,
                event_time_ms=self.clock(),
                latency_ms=latency,
                status=200 if error is None else http_status(error),
                response=output,
                error=error.message if error else "",
                error_code=error.code if error else "",
                raw_request=context.raw_request,
                raw_response=raw_response,
                request_json=context.request_json,
                response_json=response_json,
            )
        )
        return latency

    # ---- lookups ----------------------------------------------------------------------------------
    def definition(self, fqrv: FQRV) -> ServableDefinition:
        """The definition of a loaded servable or UnknownServable."""
        loaded = self.loaded.get(fqrv)
        if loaded is None:
            raise UnknownServable(fqrv)
        return loaded.definition

    def metadata(self, fqrv: FQRV) -> ServableMetadata:
        """A servable's inputs and outputs."""
        loaded = self.loaded.get(fqrv)
        if loaded is None:
            raise UnknownServable(fqrv)
        return loaded.servable.metadata()

    def active_release(self, contract: Contract) -> FQRV:
        """The servable that represents the contract in metadata calls (the newest routed one)."""
        state = self.contract_state(contract)
        release = state.latest_valid()
        if release is None:
            raise NoActiveServablesForContract(contract)
        return state.servables[release].fqrv

    def servable_entries(self, contract: Contract) -> list[ServableEntry]:
        """The contract's servables, oldest first; 422 when it has none (as ForestFlow)."""
        state = self.contract_state(contract)
        if not state.servables:
            raise NoActiveServablesForContract(contract)
        return sorted(state.servables.values(), key=lambda e: (e.metrics.created_at_ms, e.fqrv.release))

    def entry(self, fqrv: FQRV) -> ServableEntry:
        """One servable's entry or UnknownServable."""
        state = self.contracts.get(fqrv.contract)
        if state is None or fqrv.release not in state.servables:
            raise UnknownServable(fqrv)
        return state.servables[fqrv.release]

    # ---- evaluation and persistence ----------------------------------------------------------------
    async def evaluate_all(self) -> None:
        """Re-evaluate every contract (timer)."""
        async with self._admin_lock:
            for state in list(self.contracts.values()):
                await self._evaluate(state)

    async def _evaluate(self, state: ContractState) -> None:
        """Evaluate one contract; persist and unload what its expiration policy removed."""
        stamps_before = {r: e.metrics.became_valid_at_ms for r, e in state.servables.items()}
        result = state.evaluate(self.clock())
        if result.expired:
            changes: dict[str, Any] = {}
            for release in result.expired:
                fqrv = FQRV(state.contract, release)
                changes[servable_key(fqrv)] = None
                changes[metrics_key(fqrv)] = None
            await self._apply(changes)
            for release in result.expired:
                fqrv = FQRV(state.contract, release)
                log.info("servable_expired", fqrv=str(fqrv), policy=type(state.settings.expiration).__name__)
                loaded = self.loaded.pop(fqrv, None)
                if loaded is not None:
                    await self._unload(loaded)
        stamped = any(stamps_before.get(r) != e.metrics.became_valid_at_ms for r, e in state.servables.items())
        if stamped or result.routing_changed:
            self._metrics_dirty = True

    async def flush_metrics(self, force: bool = False) -> None:
        """Persist counters and router state when they changed."""
        if not (self._metrics_dirty or force):
            return
        self._metrics_dirty = False
        changes: dict[str, Any] = {}
        for contract, state in self.contracts.items():
            for entry in state.servables.values():
                changes[metrics_key(entry.fqrv)] = metrics_to_doc(entry.metrics)
            if state.servables:
                changes[routing_key(contract)] = state.routing_state()
        if not changes:
            return
        try:
            await self.store.apply(changes)
        except Exception:
            self._metrics_dirty = True
            raise


@dataclass(slots=True)
class _RequestContext:
    frame: Frame
    configs: dict[str, str]
    request_id: str
    protocol: str
    raw_request: bytes | None
    encode_raw_response: Callable[[FQRV, Frame], bytes] | None
    request_json: bytes | None = None
    encode_response_json: Callable[[FQRV, Frame], bytes] | None = None
