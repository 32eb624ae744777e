"""Replica sync: bring a gateway's registry to the documents of its store.

With a shared store (Redis) every replica follows the others' changes: servables it learns about
are loaded in the background (the replica is not ready until they are), deleted ones unloaded,
changed settings applied, shared validity stamps and performance metrics adopted. At start-up the
same reconciliation restores the registry from the store (the file store included). A load that
fails here is retried with backoff by :class:`~forestflow.registry.release_loads.ReleaseLoads`
until it succeeds or the store no longer has the release; meanwhile its contract keeps the
releases this replica holds (as during a rollout).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog

from forestflow.administration import Administration
from forestflow.codecs.ff_settings import parse_contract_settings, parse_serve_request
from forestflow.codecs.jsonread import Obj
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition, same_artifact
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings, ServableMetrics
from forestflow.errors import GatewayError, StoreUnavailable
from forestflow.registry.loader import ServableLoader
from forestflow.registry.registry import Loaded, Registry
from forestflow.registry.release_loads import ReleaseLoads
from forestflow.registry.residency import Residency
from forestflow.registry.store import (
    MICROS,
    Store,
    contract_key,
    metrics_from_doc,
    metrics_key,
    performance_from_doc,
    routing_key,
    servable_key,
)

log = structlog.get_logger("forestflow.service")


class ReplicaSync:
    """Follows the store: reconciles the registry with the store's documents."""

    def __init__(
        self,
        registry: Registry,
        store: Store,
        loader: ServableLoader,
        admin: Administration,
        loads: ReleaseLoads,
        residency: Residency | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.loader = loader
        #: Evaluates (and persists the expirations of) the contracts a reconciliation touched.
        self.admin = admin
        #: Loads of the servables learnt from the store (attempted until they succeed).
        self.loads = loads
        #: With lazy loading: releases learnt from the store join their contract cold (not loaded).
        self.residency = residency
        #: The store's documents as last reconciled (routing state and metrics are read from it).
        self._snapshot: dict[str, Any] = {}
        #: Each servable document as last reconciled, with its parsed definition.
        self._parsed: dict[str, tuple[Any, ServableDefinition]] = {}
        #: Contracts keeping releases the store deleted until their new releases are loaded here.
        self._deferred: set[Contract] = set()
        self.closed = False

    def close(self) -> None:
        """Stop following the store: later notifications are ignored, loads under way are discarded."""
        self.closed = True
        self.loads.close()

    async def sync_from_store(self) -> None:
        """Reload the store's documents and bring this replica to them (the store calls this on change)."""
        if self.closed:
            return
        async with self.registry.lock:
            # Loaded under the admin lock, so a snapshot never overtakes this replica's own writes;
            # adopted before the next await, because the store diffs the next flush against it.
            docs = await self.store.load()
            await self._reconcile(docs, wait=False)

    async def reconcile(self, docs: dict[str, Any], *, wait: bool = False) -> None:
        """Bring the registry to ``docs`` (every document of the store).

        Servables it learns about are loaded (awaited with ``wait``, else in the background: the
        replica reports not ready until they are), deleted ones unloaded, changed servable and
        contract settings applied, shared stamps and performance metrics adopted, and the touched
        contracts re-evaluated. Counters and router state of servables already held stay local.
        With ``wait``, returns once every new servable's first load attempt is done (a failed one
        is retried in the background).
        """
        async with self.registry.lock:
            started = await self._reconcile(docs, wait=wait)
        await self.loads.first_attempts(started)

    async def _reconcile(self, docs: dict[str, Any], *, wait: bool) -> list[FQRV]:
        """Apply ``docs`` (the lock is held); returns the releases whose loads it started."""
        registry = self.registry
        loads = self.loads
        self._snapshot = docs
        wanted: dict[FQRV, ServableDefinition] = {}
        contracts: dict[Contract, ContractSettings] = {}
        parsed, self._parsed = self._parsed, {}
        for key, doc in docs.items():
            try:
                if key.startswith("servable/"):
                    # A document as it was last time is not parsed again (with 10,000 releases,
                    # parsing every one on each change of the store took seconds).
                    known = parsed.get(key)
                    defn = known[1] if known is not None and known[0] == doc else parse_serve_request(doc)
                    self._parsed[key] = (doc, defn)
                    wanted[defn.fqrv] = defn
                elif key.startswith("contract/"):
                    contracts[Contract.parse(key.removeprefix("contract/"))] = parse_contract_settings(Obj(doc, key))
            except GatewayError as error:  # what it described stays as it is here
                log.error("registry_document_invalid", key=key, reason=error.message)
        present = set(docs)
        touched: set[Contract] = set()
        for contract, settings in contracts.items():
            state = registry.contracts.get(contract)
            if state is None:
                self._new_contract_state(contract, settings)
            elif state.settings != settings:
                registry.update_settings(state, settings)
                touched.add(contract)
        # Make-before-break: a contract that gets releases to load keeps serving the ones the
        # store deleted until those loads are done (then the snapshot is applied again), and for
        # as long as a load fails here and is retried.
        incoming: set[Contract] = set()
        for fqrv, expected in wanted.items():
            held = registry.loaded.get(fqrv)
            if self.residency is None and (held is None or not same_artifact(held.definition, expected)):
                incoming.add(fqrv.contract)  # with lazy loading a new release routes at once (cold)
        self._deferred = set()
        registry.kept = set()
        unload: list[Loaded] = []
        for contract, state in list(registry.contracts.items()):
            for release, entry in list(state.servables.items()):
                target, loaded = wanted.get(entry.fqrv), registry.loaded.get(entry.fqrv)
                cold = registry.cold.get(entry.fqrv)
                if target is not None and cold is not None and same_artifact(cold, target):
                    if cold != target:
                        registry.update_definition(target)
                        touched.add(contract)
                    if _adopt_shared_metrics(entry.metrics, docs.get(metrics_key(entry.fqrv))):
                        touched.add(contract)
                    continue
                if target is not None and loaded is not None and same_artifact(loaded.definition, target):
                    if loaded.definition != target:
                        registry.update_definition(target)
                        touched.add(contract)
                    if _adopt_shared_metrics(entry.metrics, docs.get(metrics_key(entry.fqrv))):
                        touched.add(contract)
                    continue
                if target is None and servable_key(entry.fqrv) in present:
                    continue  # its document did not parse: keep serving what we have
                if target is None and contract in incoming:
                    self._deferred.add(contract)  # deleted elsewhere: it goes once the new ones are loaded
                    registry.kept.add(entry.fqrv)
                    continue
                # Deleted elsewhere, or redeployed from another artifact: out of routing now,
                # unloaded after the evaluation below, once the requests it has finished.
                unload.extend(registry.remove(contract, [release]))
                touched.add(contract)
                log.info("servable_removed_by_sync", fqrv=str(entry.fqrv))
            if (
                not state.servables
                and contract_key(contract) not in present
                and not any(f.contract == contract for f in registry.pending)
                and contract not in loads.contracts()
            ):
                registry.drop_contract(contract)
        for fqrv, status in list(loads.statuses.items()):
            if status.registered and fqrv not in wanted:
                loads.drop(fqrv)  # deleted from the store: an attempt under way is discarded
        started = []
        for fqrv, defn in wanted.items():
            if fqrv in registry.loaded or fqrv in registry.cold or (fqrv in registry.pending and fqrv not in loads.statuses):
                continue  # held, or being deployed through this process right now
            if self.residency is not None:  # routed at once, loaded on first use or in the background
                if fqrv.contract not in registry.contracts:
                    self._new_contract_state(fqrv.contract, defn.contract_settings or ContractSettings())
                registry.add_cold(defn, metrics_from_doc(docs.get(metrics_key(fqrv)), defn.created_at_ms))
                touched.add(fqrv.contract)
                self.residency.cold_added()
                continue
            if fqrv not in loads.statuses:
                started.append(fqrv)
                if fqrv.contract not in registry.contracts:
                    self._new_contract_state(fqrv.contract, defn.contract_settings or ContractSettings())
            loads.follow(defn, self._load_attempt)  # a release followed already takes the newest definition
        for contract in touched:
            if contract in registry.contracts:
                await self._evaluate_quietly(registry.contracts[contract])
        for loaded in unload:
            await self.loader.unload(loaded)
        return started if wait else []

    def _new_contract_state(self, contract: Contract, settings: ContractSettings) -> ContractState:
        state = self.registry.ensure_contract(contract, settings)
        routing = self._snapshot.get(routing_key(contract))
        if routing:
            state.restore_routing_state(routing)
        return state

    def _install(self, defn: ServableDefinition, loaded: Loaded) -> ContractState:
        contract = defn.fqrv.contract
        if contract not in self.registry.contracts:
            self._new_contract_state(contract, defn.contract_settings or ContractSettings())
        metrics = metrics_from_doc(self._snapshot.get(metrics_key(defn.fqrv)), defn.created_at_ms)
        return self.registry.install(defn, loaded, metrics)

    async def _load_attempt(self, defn: ServableDefinition) -> bool:
        """One attempt at a servable learnt from the store (run by :attr:`loads`): load it, then
        install it unless the registry moved on meanwhile. False: load it again at once (it was
        redeployed from another artifact meanwhile); a failure raises."""
        fqrv = defn.fqrv
        loaded = await self.loader.load(defn, restoring=True)
        async with self.registry.lock:
            current = self.loads.target(fqrv)
            if current is None or self.closed or fqrv in self.registry.loaded:
                await self.loader.unload(loaded)  # deleted (or loaded by other means) meanwhile
                return True
            if current != defn and not same_artifact(current, defn):
                await self.loader.unload(loaded)
                return False
            self.loads.drop(fqrv)
            state = self._install(current, loaded)
            log.info("servable_synced", fqrv=str(fqrv))
            await self._evaluate_quietly(state)
            if self._deferred:  # the removals that waited for this load may go now
                await self._reconcile(self._snapshot, wait=False)
        return True

    async def _evaluate_quietly(self, state: ContractState) -> None:
        try:
            await self.admin.evaluate(state)
        except StoreUnavailable as error:  # expirations are persisted by the next evaluation round
            log.warning("evaluation_not_persisted", contract=str(state.contract), reason=error.message)

    def stats_metrics(self, entry: ServableEntry) -> ServableMetrics:
        """A servable's metrics for /stats: counters summed over every replica sharing the store."""
        peer_counters = getattr(self.store, "peer_counters", None)
        if peer_counters is None:
            return entry.metrics
        m = entry.metrics
        score, shade, errors, shade_errors, feedback, reward, squares = peer_counters(entry.fqrv)  # COUNTERS order
        return replace(
            m,
            score_count=m.score_count + score,
            shade_count=m.shade_count + shade,
            error_count=m.error_count + errors,
            shade_error_count=m.shade_error_count + shade_errors,
            feedback_count=m.feedback_count + feedback,
            reward_sum=m.reward_sum + reward / MICROS,
            reward_squares=m.reward_squares + squares / MICROS,
        )


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
