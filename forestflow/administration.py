"""Administration: deploy, update and delete servables and contracts (persisted, then applied).

Every change is validated, written to the store first (a store that is away answers 503 and
changes nothing), then applied to the :class:`~forestflow.registry.registry.Registry` and
re-evaluated. Evaluation (after each change and on the gateway's timer) and the persistence of
counters live here as well, since both write to the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from forestflow.codecs.ff_settings import contract_settings_to_json, serve_request_to_json
from forestflow.core.contract_state import ContractState
from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings, LoggingSettings, PolicySettings, ServableMetrics
from forestflow.errors import (
    ContractValidationError,
    CreateServableRequestInvalidError,
    GatewayError,
    ServableAlreadyExistsError,
    StoreUnavailable,
)
from forestflow.registry.loader import ServableLoader
from forestflow.registry.registry import Registry
from forestflow.registry.release_loads import ReleaseLoads
from forestflow.registry.store import Store, contract_key, metrics_key, metrics_to_doc, routing_key, servable_key
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")

#: How long the timer's round evaluates contracts before it lets requests run (it holds the lock, so
#: no change interleaves). With 10,000 contracts a round takes about a second of CPU on a loaded core;
#: in 200-contract slices the waiting requests' p99 was 3.6x a 10-contract gateway's (bench/scale.py).
EVALUATION_SLICE_S = 0.0005


class Administration:
    """The admin operations: each persisted to the store, then applied to the registry."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        store: Store,
        loader: ServableLoader,
        clock: Callable[[], int],
        loads: ReleaseLoads,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.store = store
        self.loader = loader
        self.clock = clock
        #: Releases of the store this process is still loading (or retrying): deletable here too.
        self.loads = loads

    # ---- servables --------------------------------------------------------------------------------
    async def create_servable(self, defn: ServableDefinition) -> FQRV:
        """Fetch, load and register a servable; answers only once it is ready."""
        registry = self.registry
        fqrv = defn.fqrv
        if defn.flavor in ("Python", "SKLearn") and not self.settings.allow_python:
            raise CreateServableRequestInvalidError(
                f"the {defn.flavor} flavor is disabled on this gateway (it runs code named by the request"
                f"{': unpickling' if defn.flavor == 'SKLearn' else ''}); start it with FORESTFLOW_ALLOW_PYTHON=1 to allow it"
            )
        async with registry.lock:
            if registry.is_held(fqrv):
                holding = registry.loaded.get(fqrv)
                held = holding.definition if holding is not None else registry.cold.get(fqrv)
                raise ServableAlreadyExistsError(fqrv, held.settings if held is not None else None)
            existing = registry.contracts.get(fqrv.contract)
            if existing is not None and defn.contract_settings is not None and existing.settings != defn.contract_settings:
                raise ContractValidationError(
                    fqrv.contract,
                    f"contract {fqrv.contract} exists: change its settings with "
                    f"PUT /{fqrv.contract.organization}/{fqrv.contract.project}/{fqrv.contract.number}",
                )
            registry.pending.add(fqrv)
        try:
            defn = replace(defn, created_at_ms=defn.created_at_ms or self.clock())
            loaded = await self.loader.load(defn)
            async with registry.lock:
                changes: dict[str, Any] = {servable_key(fqrv): serve_request_to_json(defn)}
                if fqrv.contract not in registry.contracts:
                    settings = defn.contract_settings or ContractSettings()
                    changes[contract_key(fqrv.contract)] = contract_settings_to_json(settings)
                try:
                    await self.persist(changes)
                except GatewayError:  # persist turns any store failure into one
                    await self.loader.unload(loaded)
                    raise
                state = registry.install(defn, loaded, ServableMetrics(created_at_ms=defn.created_at_ms))
                self.loads.drop(fqrv)  # a release this process was retrying is deployed here now
                await self.evaluate(state)
        finally:
            registry.pending.discard(fqrv)
        log.info("servable_created", fqrv=str(fqrv), flavor=defn.flavor)
        return fqrv

    async def update_policy(self, fqrv: FQRV, policy: PolicySettings) -> None:
        """Replace a servable's policy settings (counters kept, unlike ForestFlow) and re-evaluate."""
        await self._update_definition(fqrv, lambda d: d.with_policy(policy))

    async def update_logging(self, fqrv: FQRV, logging: LoggingSettings) -> None:
        """Replace a servable's logging settings; takes effect on the next request."""
        await self._update_definition(fqrv, lambda d: d.with_logging(logging))

    async def update_performance(self, fqrv: FQRV, values: dict[str, float]) -> None:
        """Merge reported performance metrics (drives PerformanceBased validity and KeepTopRanked)."""
        async with self.registry.lock:
            entry = self.registry.entry(fqrv)
            merged = {**entry.metrics.performance_metrics, **values}
            # Persisted first (a store that is away changes nothing), then applied.
            await self.persist({metrics_key(fqrv): metrics_to_doc(replace(entry.metrics, performance_metrics=merged))})
            entry.metrics.performance_metrics.update(values)
            await self.evaluate(self.registry.contracts[fqrv.contract])

    async def _update_definition(self, fqrv: FQRV, change: Callable[[ServableDefinition], ServableDefinition]) -> None:
        registry = self.registry
        async with registry.lock:
            registry.entry(fqrv)
            new = change(registry.definition(fqrv))
            await self.persist({servable_key(fqrv): serve_request_to_json(new)})
            registry.update_definition(new)
            await self.evaluate(registry.contracts[fqrv.contract])

    async def delete_servable(self, fqrv: FQRV) -> list[FQRV]:
        """Remove a servable (and its contract when it was the last); unknown ones are a no-op.

        A release of the store that this process is still loading, or failing to load, is removed
        as well (its loads stop)."""
        async with self.registry.lock:
            state = self.registry.contracts.get(fqrv.contract)
            if state is None or (fqrv.release not in state.servables and fqrv not in self._followed(state.contract)):
                return []
            await self._remove(state, [fqrv.release])
        return [fqrv]

    def _followed(self, contract: Contract) -> set[FQRV]:
        """The contract's releases of the store that this process is loading or retrying."""
        return {f for f, status in self.loads.statuses.items() if status.registered and f.contract == contract}

    async def _remove(self, state: ContractState, releases: list[str]) -> None:
        """Persist and apply the removal of servables (the caller holds the lock)."""
        changes: dict[str, Any] = {}
        for release in releases:
            fqrv = FQRV(state.contract, release)
            changes[servable_key(fqrv)] = None
            changes[metrics_key(fqrv)] = None
        # What the store keeps of the contract: releases held here (but not the ones the store
        # deleted already, kept here until their successors load) and the ones still loading here.
        kept = [r for r in state.servables if FQRV(state.contract, r) in self.registry.kept]
        remaining = (set(state.servables) - set(kept)) | {f.release for f in self._followed(state.contract)}
        remaining -= set(releases)
        if not remaining:
            changes[contract_key(state.contract)] = None
            changes[routing_key(state.contract)] = None
            releases = sorted(set(releases) | set(kept))  # the contract goes: so do those here
        await self.persist(changes)
        # Out of routing at once; the others are re-evaluated (routing rebuilt) before the removed
        # ones are unloaded, and each unload lets the requests already routed to it finish first.
        unload = self.registry.remove(state.contract, releases)
        for release in releases:
            self.loads.drop(FQRV(state.contract, release))
            log.info("servable_removed", fqrv=f"{state.contract}.{release}")
        try:
            if not remaining:
                self.registry.drop_contract(state.contract)
            else:
                await self.evaluate(state)
        finally:
            for loaded in unload:
                await self.loader.unload(loaded)

    # ---- contracts --------------------------------------------------------------------------------
    async def create_contract(self, contract: Contract, settings: ContractSettings) -> None:
        """Register an empty contract (422 if it exists)."""
        async with self.registry.lock:
            if contract in self.registry.contracts:
                raise ContractValidationError(contract, f"contract {contract} already exists")
            await self.persist({contract_key(contract): contract_settings_to_json(settings)})
            self.registry.ensure_contract(contract, settings)

    async def update_contract(self, contract: Contract, settings: ContractSettings) -> None:
        """Replace a contract's settings and rebuild its router."""
        async with self.registry.lock:
            state = self.registry.contract_state(contract)
            await self.persist({contract_key(contract): contract_settings_to_json(settings)})
            self.registry.update_settings(state, settings)
            await self.evaluate(state)

    # ---- evaluation and persistence ---------------------------------------------------------------
    async def evaluate_all(self, everything: bool = False) -> None:
        """Re-evaluate the contracts whose evaluation may give another result than their last one
        (the gateway's timer): those whose settings, releases or metrics moved since, and those
        whose moment came (a valid-from time, a phase-in step). ``everything``: every contract."""
        registry = self.registry
        async with registry.lock:
            contracts = list(registry.contracts) if everything else registry.due(self.clock())
            slice_ends = time.perf_counter() + EVALUATION_SLICE_S
            for contract in contracts:
                state = registry.contracts.get(contract)
                if state is None:  # its last release expired or was removed meanwhile
                    continue
                await self.evaluate(state)
                if time.perf_counter() >= slice_ends:  # thousands of contracts: requests are served in between
                    await asyncio.sleep(0)
                    slice_ends = time.perf_counter() + EVALUATION_SLICE_S

    async def evaluate(self, state: ContractState) -> None:
        """Evaluate one contract (the caller holds the lock); persist and unload what expired."""
        expiry = self.registry.evaluate(state, self.clock())
        for fqrv in expiry.rolled_back:
            metrics = state.servables[fqrv.release].metrics
            log.warning(
                "release_rolled_back",
                fqrv=str(fqrv),
                error_rate=round(metrics.window.error_rate, 4),
                errors=metrics.error_count,
                shade_errors=metrics.shade_error_count,
                routed=[str(FQRV(state.contract, r)) for r in state.picker.keys()],  # noqa: SIM118 (a WeightedPicker)
            )
        if not expiry.releases:
            return
        try:
            changes: dict[str, Any] = {}
            for fqrv in expiry.releases:
                changes[servable_key(fqrv)] = None
                changes[metrics_key(fqrv)] = None
            await self.persist(changes)
        finally:
            for fqrv in expiry.releases:
                log.info("servable_expired", fqrv=str(fqrv), policy=type(state.settings.expiration).__name__)
            for loaded in expiry.unload:
                await self.loader.unload(loaded)

    async def flush_metrics(self, force: bool = False) -> None:
        """Persist counters and router state when they changed."""
        registry = self.registry
        if not (registry.counters_dirty or force):
            return
        registry.counters_dirty = False
        dirty, registry.dirty = registry.dirty, set()
        changes: dict[str, Any] = {}
        for contract in list(registry.contracts) if force else dirty:
            state = registry.contracts.get(contract)
            if state is None:
                continue
            for entry in state.servables.values():
                if entry.fqrv not in registry.kept:  # deleted in the store: not written back
                    changes[metrics_key(entry.fqrv)] = metrics_to_doc(entry.metrics)
            if state.servables:
                changes[routing_key(contract)] = state.routing_state()
        if not changes:
            return
        try:
            await self.store.apply(changes)
        except Exception:
            registry.counters_dirty = True
            registry.dirty |= dirty
            raise

    async def persist(self, changes: dict[str, Any]) -> None:
        """Write documents to the store; any failure of the store is StoreUnavailable (503)."""
        try:
            await self.store.apply(changes)
        except GatewayError:
            raise
        except Exception as exc:
            raise StoreUnavailable(f"registry store unavailable: {exc}") from exc
