"""The Registry: every servable this gateway holds, and the lock that orders changes to them.

It owns the contracts (their routing state), the loaded servables with their schedulers, the
releases whose load failed, and the releases being loaded. It knows nothing of protocols, of the
store the state is persisted in, or of the prediction log: :mod:`forestflow.administration`
persists a change and then applies it here, :mod:`forestflow.replica_sync` applies what the store
says, and :mod:`forestflow.service` reads it on the request path.

Changes are made with :attr:`Registry.lock` held by the caller; lookups need no lock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forestflow.core.contract_state import ContractState, Evaluation, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import ContractSettings, ServableMetrics
from forestflow.errors import ContractNotReady, NoActiveServablesForContract, UnknownContract, UnknownServable
from forestflow.registry.artifacts import ArtifactClaim
from forestflow.runtime.base import Servable
from forestflow.runtime.scheduler import ServableScheduler


@dataclass(slots=True)
class Loaded:
    """A servable in memory with its scheduler."""

    definition: ServableDefinition
    servable: Servable
    scheduler: ServableScheduler
    #: The cached artifact it was loaded from (released when it is unloaded for good).
    artifact: ArtifactClaim | None = None
    #: How long ``load`` took (``/metrics``).
    load_seconds: float = 0.0
    #: The model-agnostic explainer its definition declares (a ``runtime.kernel_shap.KernelExplainer``), if any.
    explainer: Any = None
    #: Its size for the memory budget: the bytes of its model file (see :mod:`residency`).
    size_bytes: int = 0


@dataclass(slots=True)
class Expiry:
    """What one evaluation of a contract took out: the releases and the servables to unload."""

    releases: list[FQRV] = field(default_factory=list)
    unload: list[Loaded] = field(default_factory=list)
    #: Releases that had routing weight before and lost it because a validity rule stopped holding.
    rolled_back: list[FQRV] = field(default_factory=list)


class Registry:
    """Contracts, loaded and failed servables, releases being loaded, and the admin lock."""

    def __init__(self) -> None:
        self.contracts: dict[Contract, ContractState] = {}
        self.loaded: dict[FQRV, Loaded] = {}
        #: Releases of the store whose load failed here, with the last reason (the gateway is not
        #: ready while any is here; ``release_loads`` retries them and keeps this up to date).
        self.failed: dict[FQRV, str] = {}
        #: Releases being loaded (deploys in flight and loads learnt from the store).
        self.pending: set[FQRV] = set()
        #: Releases the store deleted that this process keeps serving until the releases replacing
        #: them are loaded here (make-before-break; ``replica_sync`` keeps this up to date).
        self.kept: set[FQRV] = set()
        #: Releases that are part of their contract's routing but not loaded here (lazy loading:
        #: restored, learnt from the store, or evicted), with the definition to load them from.
        self.cold: dict[FQRV, ServableDefinition] = {}
        #: Called with each servable that becomes loaded (the residency's accounting).
        self.on_loaded: Callable[[Loaded], None] | None = None
        #: Taken by every change, so a change and the store write before it are never interleaved.
        self.lock = asyncio.Lock()
        #: Set when counters or routing moved since they were last persisted.
        self.counters_dirty = False
        #: The contracts whose counters or routing moved since they were last persisted (a flush
        #: writes only theirs: with 10,000 contracts, building every document each second would
        #: keep the event loop busy).
        self.dirty: set[Contract] = set()
        #: Rollbacks (a routed release became invalid) per fqrv, since start (``/metrics``).
        self.rollbacks: dict[str, int] = {}
        #: Contracts to evaluate at the timer's next round: something their evaluation reads moved
        #: since their last one (settings, releases, loads, or a metric: traffic, outcomes, shadow
        #: agreement, feedback). With 10,000 contracts, evaluating every one each round took a good
        #: share of a core (and of the requests' time) with nothing to change.
        self.stale: set[Contract] = set()
        #: When each contract's evaluation next changes by the passing of time alone (a valid-from
        #: moment, a phase-in step), as a heap (older entries of a contract are skipped) and by contract.
        self._due: list[tuple[int, int, Contract]] = []
        self._due_at: dict[Contract, int] = {}
        self._pushes = itertools.count()
        #: The latest clock value an evaluation used: a clock that went back makes a round evaluate all.
        self._latest_ms: int | None = None

    # ---- lookups ----------------------------------------------------------------------------------
    def contract_state(self, contract: Contract) -> ContractState:
        """The state of a contract or UnknownContract."""
        state = self.contracts.get(contract)
        if state is None:
            raise UnknownContract(contract)
        return state

    def entry(self, fqrv: FQRV) -> ServableEntry:
        """One servable's entry or UnknownServable."""
        state = self.contracts.get(fqrv.contract)
        if state is None or fqrv.release not in state.servables:
            raise UnknownServable(fqrv)
        return state.servables[fqrv.release]

    def loaded_servable(self, fqrv: FQRV) -> Loaded:
        """A loaded servable or UnknownServable."""
        loaded = self.loaded.get(fqrv)
        if loaded is None:
            raise UnknownServable(fqrv)
        return loaded

    def servable_entries(self, contract: Contract, *, empty_ok: bool = False) -> list[ServableEntry]:
        """The contract's servables, oldest first; NoActiveServablesForContract when it has none
        (unless ``empty_ok``)."""
        state = self.contract_state(contract)
        if not state.servables and not empty_ok:
            raise NoActiveServablesForContract(contract)
        return sorted(state.servables.values(), key=lambda e: (e.metrics.created_at_ms, e.fqrv.release))

    def active_release(self, contract: Contract) -> FQRV:
        """The servable that represents the contract in metadata calls (the newest routed one)."""
        state = self.contract_state(contract)
        release = state.latest_valid()
        if release is None:
            raise self.inactive_error(contract)
        return state.servables[release].fqrv

    def inactive_error(self, contract: Contract) -> NoActiveServablesForContract:
        """Why nothing answers for a contract: 503 ContractNotReady while one of its releases is
        loading here (or failed to load), else 422 NoActiveServablesForContract (all invalid)."""
        if any(f.contract == contract for f in self.pending):
            return ContractNotReady(contract)
        failed = sorted(str(f) for f in self.failed if f.contract == contract)
        if failed:
            return ContractNotReady(contract, f"{', '.join(failed)} failed to load on this process (retried)")
        return NoActiveServablesForContract(contract)

    def is_held(self, fqrv: FQRV) -> bool:
        """Whether the release is loaded, being loaded, or registered here without being loaded."""
        return fqrv in self.loaded or fqrv in self.pending or fqrv in self.cold

    def definition(self, fqrv: FQRV) -> ServableDefinition:
        """The definition of a loaded or cold release, or UnknownServable."""
        loaded = self.loaded.get(fqrv)
        if loaded is not None:
            return loaded.definition
        defn = self.cold.get(fqrv)
        if defn is None:
            raise UnknownServable(fqrv)
        return defn

    # ---- changes (the caller holds the lock) ------------------------------------------------------
    def ensure_contract(self, contract: Contract, settings: ContractSettings | None) -> ContractState:
        """The contract's state, created with ``settings`` (or the defaults) when it is new."""
        state = self.contracts.get(contract)
        if state is None:
            state = self.contracts[contract] = ContractState(contract, settings or ContractSettings())
            self.stale.add(contract)
        return state

    def install(self, defn: ServableDefinition, loaded: Loaded, metrics: ServableMetrics) -> ContractState:
        """Make a loaded servable part of its contract (created when new); clears a past failure."""
        state = self.ensure_contract(defn.fqrv.contract, defn.contract_settings)
        loaded.definition = defn
        self.loaded[defn.fqrv] = loaded
        self.failed.pop(defn.fqrv, None)
        self.cold.pop(defn.fqrv, None)
        state.add(ServableEntry(defn.fqrv, defn.settings, metrics))
        self.stale.add(state.contract)
        if self.on_loaded is not None:
            self.on_loaded(loaded)
        return state

    def add_cold(self, defn: ServableDefinition, metrics: ServableMetrics) -> ContractState:
        """Make a release part of its contract (created when new) without loading it."""
        state = self.ensure_contract(defn.fqrv.contract, defn.contract_settings)
        self.cold[defn.fqrv] = defn
        state.add(ServableEntry(defn.fqrv, defn.settings, metrics))
        self.stale.add(state.contract)
        return state

    def warm(self, loaded: Loaded) -> None:
        """A cold release is loaded now (its entry, counters and routing stay as they are)."""
        fqrv = loaded.definition.fqrv
        loaded.definition = self.cold.pop(fqrv, loaded.definition)
        self.loaded[fqrv] = loaded
        self.failed.pop(fqrv, None)
        self.stale.add(fqrv.contract)
        if self.on_loaded is not None:
            self.on_loaded(loaded)

    def evict(self, fqrv: FQRV) -> Loaded | None:
        """Take a loaded release out of memory but not out of its contract (it becomes cold);
        returns the servable the caller must unload."""
        loaded = self.loaded.pop(fqrv, None)
        if loaded is not None:
            self.cold[fqrv] = loaded.definition
            self.stale.add(fqrv.contract)
        return loaded

    def remove(self, contract: Contract, releases: list[str]) -> list[Loaded]:
        """Take releases out of their contract; returns the servables the caller must unload."""
        state = self.contracts.get(contract)
        unload: list[Loaded] = []
        self.stale.add(contract)
        for release in releases:
            if state is not None:
                state.remove(release)
            self.cold.pop(FQRV(contract, release), None)
            loaded = self.loaded.pop(FQRV(contract, release), None)
            if loaded is not None:
                unload.append(loaded)
        return unload

    def drop_contract(self, contract: Contract) -> None:
        """Forget a contract (its servables must already be removed)."""
        self.contracts.pop(contract, None)
        self.stale.discard(contract)
        self._due_at.pop(contract, None)

    def update_definition(self, defn: ServableDefinition) -> None:
        """A loaded (or cold) servable's new settings (same artifact): kept on it and on its contract entry."""
        if defn.fqrv in self.cold:
            self.cold[defn.fqrv] = defn
        else:
            self.loaded[defn.fqrv].definition = defn
        self.entry(defn.fqrv).settings = defn.settings
        self.stale.add(defn.fqrv.contract)

    def update_settings(self, state: ContractState, settings: ContractSettings) -> None:
        """A contract's new settings (its router is rebuilt at its next evaluation)."""
        state.update_settings(settings)
        self.stale.add(state.contract)

    def due(self, now_ms: int) -> list[Contract]:
        """The contracts an evaluation round at ``now_ms`` evaluates: the stale ones and those whose
        moment has come (every contract when the clock went back since the last evaluation)."""
        if self._latest_ms is not None and now_ms < self._latest_ms:
            self.stale.update(self.contracts)
            self._latest_ms = now_ms
        heap, due_at = self._due, self._due_at
        while heap and heap[0][0] <= now_ms:
            at, _, contract = heapq.heappop(heap)
            if due_at.get(contract) == at:
                del due_at[contract]
                self.stale.add(contract)  # until it is evaluated (a round that fails leaves it stale)
        contracts = self.contracts
        self.stale = {c for c in self.stale if c in contracts}  # not intersection_update: it walks the dict
        return list(self.stale)

    def evaluate(self, state: ContractState, now_ms: int) -> Expiry:
        """Evaluate one contract at ``now_ms``: validity stamps, phase-in, router, expirations.

        Expired releases leave the contract and the loaded set; the caller persists their removal
        and unloads what is returned.
        """
        contract = state.contract
        self.stale.discard(contract)
        if self._latest_ms is None or now_ms > self._latest_ms:
            self._latest_ms = now_ms
        stamps_before = {r: e.metrics.became_valid_at_ms for r, e in state.servables.items()}
        routed_before = {r for r, e in state.servables.items() if e.metrics.current_phase_in_pct > 0}
        result: Evaluation = state.evaluate(now_ms)
        expiry = Expiry()
        for release in sorted(routed_before):
            entry = state.servables.get(release)
            if entry is not None and entry.metrics.current_phase_in_pct == 0:
                fqrv = FQRV(state.contract, release)
                expiry.rolled_back.append(fqrv)
                self.rollbacks[str(fqrv)] = self.rollbacks.get(str(fqrv), 0) + 1
        for release in result.expired:
            fqrv = FQRV(state.contract, release)
            expiry.releases.append(fqrv)
            self.cold.pop(fqrv, None)
            loaded = self.loaded.pop(fqrv, None)
            if loaded is not None:
                expiry.unload.append(loaded)
        stamped = any(stamps_before.get(r) != e.metrics.became_valid_at_ms for r, e in state.servables.items())
        if stamped or result.routing_changed or expiry.rolled_back:
            self.counters_dirty = True  # persisted; not stale: an evaluation right after changes nothing
            self.dirty.add(contract)
        at = state.next_change_ms(now_ms)
        if at is None:
            self._due_at.pop(contract, None)
        elif self._due_at.get(contract) != at:
            self._due_at[contract] = at
            heapq.heappush(self._due, (at, next(self._pushes), contract))
            if len(self._due) > 2 * len(self._due_at) + 64:  # mostly moments that moved since: drop those
                self._due = [e for e in self._due if self._due_at.get(e[2]) == e[0]]
                heapq.heapify(self._due)
        return expiry

    def mark_counted(self, contract: Contract) -> None:
        """A counter (or the routing) of ``contract`` moved: the next flush writes its document, and
        the next evaluation round evaluates it."""
        self.counters_dirty = True
        self.dirty.add(contract)
        self.stale.add(contract)
