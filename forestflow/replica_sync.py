"""Replica sync: bring a gateway's in-memory registry to the documents of its store.

With a shared store (Redis) every replica follows the others' changes: servables it learns about
are loaded in the background (the replica is not ready until they are), deleted ones unloaded,
changed settings applied, shared validity stamps and performance metrics adopted. At start-up the
same reconciliation restores the registry from the store (the file store included).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from forestflow.codecs.ff_settings import parse_contract_settings, parse_serve_request
from forestflow.codecs.jsonread import Obj
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings, ServableMetrics
from forestflow.errors import GatewayError, StoreUnavailable
from forestflow.registry.store import (
    contract_key,
    metrics_from_doc,
    metrics_key,
    performance_from_doc,
    routing_key,
    servable_key,
)

if TYPE_CHECKING:
    from forestflow.administration import Loaded
    from forestflow.registry.store import Store

log = structlog.get_logger("forestflow.service")


class ReplicaSync:
    """The part of the Gateway that follows the store (mixed into :class:`forestflow.service.Gateway`)."""

    store: Store
    contracts: dict[Contract, ContractState]
    loaded: dict[FQRV, Loaded]
    failed: dict[FQRV, str]
    draining: bool
    _admin_lock: asyncio.Lock
    _pending: set[FQRV]
    _tasks: set[asyncio.Future[Any]]
    _snapshot: dict[str, Any]
    _syncing: dict[FQRV, ServableDefinition]
    _failed_defs: dict[FQRV, ServableDefinition]

    if TYPE_CHECKING:

        async def _load(self, defn: ServableDefinition) -> Loaded: ...
        async def _unload(self, loaded: Loaded) -> None: ...
        async def _evaluate(self, state: ContractState) -> None: ...

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
        state.add(ServableEntry(defn.fqrv, defn.settings, metrics_from_doc(self._snapshot.get(metrics_key(defn.fqrv)), defn.created_at_ms)))
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
    performance = performance_from_doc(doc)
    if performance != m.performance_metrics:
        m.performance_metrics = performance
        changed = True
    return changed
