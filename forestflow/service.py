"""The Gateway: the protocol-free service every front-end calls.

It owns the registry state (contracts, servable definitions, loaded servables and their
schedulers), routes each request batch to one servable, fans shadow copies out, and hands every
outcome to the prediction log. Front-ends convert their payloads to a Frame and call
:meth:`Gateway.infer`; admin front-ends call the ``create_*``/``update_*``/``delete_*`` methods.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import structlog

from forestflow.codecs.ff_settings import (
    contract_settings_to_json,
    parse_contract_settings,
    parse_serve_request,
    serve_request_to_json,
)
from forestflow.codecs.jsonread import Obj
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings, LoggingSettings, LogLevel, PolicySettings, ServableMetrics
from forestflow.errors import (
    ContractValidationError,
    CreateServableRequestInvalidError,
    GatewayError,
    InvalidInput,
    NoActiveServablesForContract,
    ServableAlreadyExistsError,
    ServableNotReady,
    StoreUnavailable,
    UnknownContract,
    UnknownServable,
    http_status,
)
from forestflow.predlog.log import PredictionLog
from forestflow.predlog.record import PredictionRecord
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.store import Store, contract_key, metrics_key, routing_key, servable_key
from forestflow.runtime.base import Servable, ServableMetadata, create_servable
from forestflow.runtime.scheduler import Priority, ServableScheduler, ShadowDropped
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


@dataclass(slots=True)
class Loaded:
    """A servable in memory with its scheduler."""

    definition: ServableDefinition
    servable: Servable
    scheduler: ServableScheduler


class Gateway:
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

    # ---- replica sync -------------------------------------------------------------------------------
    async def sync_from_store(self) -> None:
        """Reload the store's documents and bring this replica to them (the store calls this on change)."""
        if self.draining:
            return
        async with self._admin_lock:
            # Loaded under the admin lock, so a snapshot never overtakes this replica's own writes;
            # adopted before the next await, because the store diffs the next flush against it.
            docs = await self.store.load()
            await self._reconcile(docs, wait=False)

    async def reconcile(self, docs: dict[str, Any], *, wait: bool = False) -> None:
        """Bring the in-memory registry to ``docs`` (every document of the store).

        Servables it learns about are loaded (awaited with ``wait``, else in the background: the
        replica reports not ready until they are), deleted ones unloaded, changed servable and
        contract settings applied, shared stamps and performance metrics adopted, and the touched
        contracts re-evaluated. Counters and router state of servables already held stay local.
        """
        async with self._admin_lock:
            await self._reconcile(docs, wait=wait)

    async def _reconcile(self, docs: dict[str, Any], *, wait: bool) -> None:
        self._snapshot = docs
        wanted: dict[FQRV, ServableDefinition] = {}
        contracts: dict[Contract, ContractSettings] = {}
        for key, doc in docs.items():
            try:
                if key.startswith("servable/"):
                    defn = parse_serve_request(doc)
                    wanted[defn.fqrv] = defn
                elif key.startswith("contract/"):
                    contracts[Contract.parse(key.removeprefix("contract/"))] = parse_contract_settings(Obj(doc, key))
            except GatewayError as error:  # what it described stays as it is here
                log.error("registry_document_invalid", key=key, reason=error.message)
        present = set(docs)
        touched: set[Contract] = set()
        for contract, settings in contracts.items():
            state = self.contracts.get(contract)
            if state is None:
                self._new_contract_state(contract, settings)
            elif state.settings != settings:
                state.update_settings(settings)
                touched.add(contract)
        unload: list[Loaded] = []
        for contract, state in list(self.contracts.items()):
            for release, entry in list(state.servables.items()):
                defn, loaded = wanted.get(entry.fqrv), self.loaded.get(entry.fqrv)
                if defn is not None and loaded is not None and _same_artifact(loaded.definition, defn):
                    if loaded.definition != defn:
                        loaded.definition, entry.settings = defn, defn.settings
                        touched.add(contract)
                    if _adopt_shared_metrics(entry.metrics, docs.get(metrics_key(entry.fqrv))):
                        touched.add(contract)
                    continue
                if defn is None and servable_key(entry.fqrv) in present:
                    continue  # its document did not parse: keep serving what we have
                state.remove(release)  # deleted elsewhere, or redeployed from another artifact
                touched.add(contract)
                if loaded is not None:
                    unload.append(self.loaded.pop(entry.fqrv))
                log.info("servable_removed_by_sync", fqrv=str(entry.fqrv))
            if not state.servables and contract_key(contract) not in present and not any(f.contract == contract for f in self._pending):
                del self.contracts[contract]
        for fqrv in [f for f in self.failed if f not in wanted]:
            self.failed.pop(fqrv)
            self._failed_defs.pop(fqrv, None)
        for fqrv, defn in list(self._syncing.items()):
            if fqrv in wanted:
                self._syncing[fqrv] = wanted[fqrv]
            else:
                del self._syncing[fqrv]  # the loader discards it when done
        new = [d for f, d in wanted.items() if f not in self.loaded and f not in self._pending and self._failed_defs.get(f) != d]
        for loaded in unload:
            await self._unload(loaded)
        if wait:
            results = await asyncio.gather(*(self._load(d) for d in new), return_exceptions=True)
            for defn, result in zip(new, results):
                if isinstance(result, BaseException):
                    self._record_failure(defn, result)
                else:
                    self._install(defn, result)
            touched = set(self.contracts)
        else:
            for defn in new:
                self._start_sync_load(defn)
        for contract in touched:
            if contract in self.contracts:
                await self._evaluate_quietly(self.contracts[contract])

    def _new_contract_state(self, contract: Contract, settings: ContractSettings) -> ContractState:
        state = self.contracts[contract] = ContractState(contract, settings)
        routing = self._snapshot.get(routing_key(contract))
        if routing:
            state.restore_routing_state(routing)
        return state

    def _install(self, defn: ServableDefinition, loaded: Loaded) -> ContractState:
        contract = defn.fqrv.contract
        state = self.contracts.get(contract) or self._new_contract_state(contract, defn.contract_settings or ContractSettings())
        loaded.definition = defn
        self.loaded[defn.fqrv] = loaded
        self.failed.pop(defn.fqrv, None)
        self._failed_defs.pop(defn.fqrv, None)
        state.add(ServableEntry(defn.fqrv, defn.settings, _metrics_from_doc(self._snapshot.get(metrics_key(defn.fqrv)), defn.created_at_ms)))
        return state

    def _record_failure(self, defn: ServableDefinition, error: BaseException) -> None:
        reason = error.message if isinstance(error, GatewayError) else repr(error)
        self.failed[defn.fqrv] = reason
        self._failed_defs[defn.fqrv] = defn
        if defn.fqrv.contract not in self.contracts:
            self._new_contract_state(defn.fqrv.contract, defn.contract_settings or ContractSettings())
        log.error("servable_restore_failed", fqrv=str(defn.fqrv), reason=reason)

    def _start_sync_load(self, defn: ServableDefinition) -> None:
        self._syncing[defn.fqrv] = defn
        self._pending.add(defn.fqrv)
        task = asyncio.create_task(self._sync_load(defn), name=f"sync-load {defn.fqrv}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync_load(self, defn: ServableDefinition) -> None:
        """Load a servable learnt from the store; install it unless the registry moved on meanwhile."""
        fqrv = defn.fqrv
        loaded: Loaded | None = None
        error: BaseException | None = None
        try:
            try:
                loaded = await self._load(defn)
            except Exception as exc:
                error = exc
            async with self._admin_lock:
                current = self._syncing.pop(fqrv, None)
                if current is None or self.draining or (current != defn and not (loaded and _same_artifact(current, defn))):
                    if loaded is not None:
                        await self._unload(loaded)
                    if current is not None and not self.draining:
                        self._start_sync_load(current)  # redeployed from another artifact meanwhile
                    return
                if loaded is None:
                    self._record_failure(current, error or RuntimeError("load failed"))
                    return
                state = self._install(current, loaded)
                log.info("servable_synced", fqrv=str(fqrv))
                await self._evaluate_quietly(state)
        finally:
            if fqrv not in self._syncing:
                self._pending.discard(fqrv)

    async def _evaluate_quietly(self, state: ContractState) -> None:
        try:
            await self._evaluate(state)
        except StoreUnavailable as error:  # expirations are persisted by the next evaluation round
            log.warning("evaluation_not_persisted", contract=str(state.contract), reason=error.message)

    def stats_metrics(self, entry: ServableEntry) -> ServableMetrics:
        """A servable's metrics for /stats: counters summed over every replica sharing the store."""
        peer_counters = getattr(self.store, "peer_counters", None)
        if peer_counters is None:
            return entry.metrics
        score, shade = peer_counters(entry.fqrv)
        return replace(entry.metrics, score_count=entry.metrics.score_count + score, shade_count=entry.metrics.shade_count + shade)

    # ---- health -------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Serving: started, not draining, every registered servable loaded."""
        return self.started and not self.draining and not self.failed and not self._pending

    def readiness(self) -> dict[str, Any]:
        """Details behind :attr:`ready`."""
        return {
            "ready": self.ready,
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

    # ---- admin --------------------------------------------------------------------------------------
    async def create_servable(self, defn: ServableDefinition) -> FQRV:
        """Fetch, load and register a servable; answers only once it is ready."""
        fqrv = defn.fqrv
        if defn.flavor == "Python" and not self.settings.allow_python:
            raise CreateServableRequestInvalidError(
                "the Python flavor is disabled on this gateway (it runs code named by the request); "
                "start it with FORESTFLOW_ALLOW_PYTHON=1 to allow it"
            )
        async with self._admin_lock:
            if fqrv in self.loaded or fqrv in self._pending:
                raise ServableAlreadyExistsError(fqrv, self.loaded[fqrv].definition.settings if fqrv in self.loaded else None)
            existing = self.contracts.get(fqrv.contract)
            if existing is not None and defn.contract_settings is not None and existing.settings != defn.contract_settings:
                raise ContractValidationError(
                    fqrv.contract, f"contract {fqrv.contract} exists: change its settings with PUT /{fqrv.contract.organization}/{fqrv.contract.project}/{fqrv.contract.number}"
                )
            self._pending.add(fqrv)
        try:
            defn = replace(defn, created_at_ms=defn.created_at_ms or self.clock())
            loaded = await self._load(defn)
            async with self._admin_lock:
                state = self.contracts.get(fqrv.contract)
                new_contract = state is None
                if state is None:
                    state = ContractState(fqrv.contract, defn.contract_settings or ContractSettings())
                changes: dict[str, Any] = {servable_key(fqrv): serve_request_to_json(defn)}
                if new_contract:
                    changes[contract_key(fqrv.contract)] = contract_settings_to_json(state.settings)
                try:
                    await self.store.apply(changes)
                except GatewayError:
                    await self._unload(loaded)
                    raise
                except Exception as exc:
                    await self._unload(loaded)
                    raise StoreUnavailable(f"registry store unavailable: {exc}") from exc
                self.contracts[fqrv.contract] = state
                self.loaded[fqrv] = loaded
                self.failed.pop(fqrv, None)
                state.add(ServableEntry(fqrv, defn.settings, ServableMetrics(created_at_ms=defn.created_at_ms)))
                await self._evaluate(state)
        finally:
            self._pending.discard(fqrv)
        log.info("servable_created", fqrv=str(fqrv), flavor=defn.flavor)
        return fqrv

    async def _load(self, defn: ServableDefinition) -> Loaded:
        directory = await self.artifacts.fetch(defn.path)
        servable = create_servable(defn.flavor, defn.fqrv, directory, defn.flavor_settings)
        try:
            await asyncio.to_thread(servable.load)
        except GatewayError:
            raise
        except Exception as exc:  # a flavor bug or an unexpected artifact: a 422 with the reason
            log.exception("servable_load_failed", fqrv=str(defn.fqrv))
            raise CreateServableRequestInvalidError(f"loading {defn.fqrv} failed: {type(exc).__name__}: {exc}") from exc
        slots = servable.max_concurrency or self.settings.scoring_slots
        scheduler = ServableScheduler(
            servable,
            None,  # threads of its own: shadow servables cannot take the threads live work needs
            slots=slots,
            live_queue=self.settings.live_queue,
            shadow_queue=self.settings.shadow_queue,
            max_batch_rows=self.settings.max_batch_rows if getattr(servable, "batchable", False) else 0,
            max_threads=self.settings.scoring_threads,
        )
        return Loaded(defn, servable, scheduler)

    async def _unload(self, loaded: Loaded) -> None:
        await loaded.scheduler.close()
        await asyncio.to_thread(loaded.servable.unload)

    async def create_contract(self, contract: Contract, settings: ContractSettings) -> None:
        """Register an empty contract (422 if it exists)."""
        async with self._admin_lock:
            if contract in self.contracts:
                raise ContractValidationError(contract, f"contract {contract} already exists")
            await self._apply({contract_key(contract): contract_settings_to_json(settings)})
            self.contracts[contract] = ContractState(contract, settings)

    async def update_contract(self, contract: Contract, settings: ContractSettings) -> None:
        """Replace a contract's settings and rebuild its router."""
        async with self._admin_lock:
            state = self.contract_state(contract)
            await self._apply({contract_key(contract): contract_settings_to_json(settings)})
            state.update_settings(settings)
            await self._evaluate(state)

    async def update_policy(self, fqrv: FQRV, policy: PolicySettings) -> None:
        """Replace a servable's policy settings (counters kept, unlike ForestFlow) and re-evaluate."""
        await self._update_definition(fqrv, lambda d: d.with_policy(policy))

    async def update_logging(self, fqrv: FQRV, logging: LoggingSettings) -> None:
        """Replace a servable's logging settings; takes effect on the next request."""
        await self._update_definition(fqrv, lambda d: d.with_logging(logging))

    async def update_performance(self, fqrv: FQRV, values: dict[str, float]) -> None:
        """Merge reported performance metrics (drives PerformanceBased validity and KeepTopRanked)."""
        async with self._admin_lock:
            entry = self.entry(fqrv)
            entry.metrics.performance_metrics.update(values)
            await self._apply({metrics_key(fqrv): _metrics_to_doc(entry.metrics)})
            await self._evaluate(self.contracts[fqrv.contract])

    async def _update_definition(self, fqrv: FQRV, change: Callable[[ServableDefinition], ServableDefinition]) -> None:
        async with self._admin_lock:
            entry = self.entry(fqrv)
            loaded = self.loaded[fqrv]
            new = change(loaded.definition)
            await self._apply({servable_key(fqrv): serve_request_to_json(new)})
            loaded.definition = new
            entry.settings = new.settings
            await self._evaluate(self.contracts[fqrv.contract])

    async def delete_servable(self, fqrv: FQRV) -> list[FQRV]:
        """Remove a servable (and its contract when it was the last); unknown ones are a no-op."""
        async with self._admin_lock:
            state = self.contracts.get(fqrv.contract)
            if state is None or fqrv.release not in state.servables:
                return []
            await self._remove(state, [fqrv.release])
            if state.servables:
                await self._evaluate(state)
        return [fqrv]

    async def _remove(self, state: ContractState, releases: list[str]) -> None:
        """Persist and apply the removal of servables (the caller holds the admin lock)."""
        changes: dict[str, Any] = {}
        for release in releases:
            fqrv = FQRV(state.contract, release)
            changes[servable_key(fqrv)] = None
            changes[metrics_key(fqrv)] = None
        remaining = set(state.servables) - set(releases)
        if not remaining:
            changes[contract_key(state.contract)] = None
            changes[routing_key(state.contract)] = None
        await self._apply(changes)
        for release in releases:
            state.remove(release)
            loaded = self.loaded.pop(FQRV(state.contract, release), None)
            if loaded is not None:
                await self._unload(loaded)
            log.info("servable_removed", fqrv=f"{state.contract}.{release}")
        if not remaining:
            self.contracts.pop(state.contract, None)

    async def _apply(self, changes: dict[str, Any]) -> None:
        try:
            await self.store.apply(changes)
        except GatewayError:
            raise
        except Exception as exc:
            raise StoreUnavailable(f"registry store unavailable: {exc}") from exc

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
                changes[metrics_key(entry.fqrv)] = _metrics_to_doc(entry.metrics)
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


def _metrics_to_doc(m: ServableMetrics) -> dict[str, Any]:
    return {
        "createdAtMS": m.created_at_ms,
        "scoreCount": m.score_count,
        "shadeCount": m.shade_count,
        "becameValidAtMS": m.became_valid_at_ms,
        "currentPhaseInPct": m.current_phase_in_pct,
        "performanceMetrics": m.performance_metrics,
    }


def _metrics_from_doc(doc: dict[str, Any] | None, created_at_ms: int) -> ServableMetrics:
    if not doc:
        return ServableMetrics(created_at_ms=created_at_ms)
    return ServableMetrics(
        created_at_ms=int(doc.get("createdAtMS") or created_at_ms),
        score_count=int(doc.get("scoreCount", 0)),
        shade_count=int(doc.get("shadeCount", 0)),
        became_valid_at_ms=doc.get("becameValidAtMS"),
        current_phase_in_pct=int(doc.get("currentPhaseInPct", 0)),
        performance_metrics={str(k): float(v) for k, v in (doc.get("performanceMetrics") or {}).items()},
    )


def _same_artifact(a: ServableDefinition, b: ServableDefinition) -> bool:
    return a.path == b.path and a.flavor == b.flavor and a.flavor_settings == b.flavor_settings


def _adopt_shared_metrics(m: ServableMetrics, doc: dict[str, Any] | None) -> bool:
    """Take the shared stamp and performance metrics from the store (counters stay this replica's)."""
    if not doc:
        return False
    changed = False
    stamp = doc.get("becameValidAtMS")
    if stamp is not None and int(stamp) != m.became_valid_at_ms:
        m.became_valid_at_ms = int(stamp)
        changed = True
    performance = {str(k): float(v) for k, v in (doc.get("performanceMetrics") or {}).items()}
    if performance != m.performance_metrics:
        m.performance_metrics = performance
        changed = True
    return changed
