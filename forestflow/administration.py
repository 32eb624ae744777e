"""Administration: deploy, update and delete servables and contracts (persisted, then applied).

Every change is validated, written to the store first (a store that is away answers 503 and
changes nothing), then applied to the in-memory registry and re-evaluated. Mixed into
:class:`forestflow.service.Gateway`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from forestflow.codecs.ff_settings import (
    contract_settings_to_json,
    serve_request_to_json,
)
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import (
    ContractSettings,
    LoggingSettings,
    PolicySettings,
    ServableMetrics,
)
from forestflow.errors import (
    ContractValidationError,
    CreateServableRequestInvalidError,
    GatewayError,
    ServableAlreadyExistsError,
    StoreUnavailable,
)
from forestflow.registry.store import (
    contract_key,
    metrics_key,
    metrics_to_doc,
    routing_key,
    servable_key,
)
from forestflow.runtime.base import Servable, create_servable
from forestflow.runtime.scheduler import ServableScheduler

if TYPE_CHECKING:
    from forestflow.registry.artifacts import ArtifactCache
    from forestflow.registry.store import Store
    from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")


@dataclass(slots=True)
class Loaded:
    """A servable in memory with its scheduler."""

    definition: ServableDefinition
    servable: Servable
    scheduler: ServableScheduler
    load_seconds: float = 0.0  # /metrics


class Administration:
    """The admin operations of the Gateway."""

    settings: Settings
    store: Store
    artifacts: ArtifactCache
    clock: Callable[[], int]
    contracts: dict[Contract, ContractState]
    loaded: dict[FQRV, Loaded]
    failed: dict[FQRV, str]
    _admin_lock: asyncio.Lock
    _pending: set[FQRV]
    load_failures: int = 0  # /metrics

    if TYPE_CHECKING:

        def contract_state(self, contract: Contract) -> ContractState: ...
        def entry(self, fqrv: FQRV) -> ServableEntry: ...
        async def _evaluate(self, state: ContractState) -> None: ...

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
                    await self._apply(changes)
                except GatewayError:  # _apply turns any store failure into one
                    await self._unload(loaded)
                    raise
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
        started = time.perf_counter()
        try:
            await asyncio.to_thread(servable.load)
        except GatewayError:
            self.load_failures += 1
            raise
        except Exception as exc:
            self.load_failures += 1  # a flavor bug or an unexpected artifact: a 422 with the reason
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
            coalesce_rows=self.settings.max_batch_rows,
        )
        return Loaded(defn, servable, scheduler, time.perf_counter() - started)

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
            await self._apply({metrics_key(fqrv): metrics_to_doc(entry.metrics)})
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
