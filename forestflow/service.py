"""The Gateway: the protocol-free service every front-end calls.

It composes the collaborators that hold and change the registry, and keeps the request path:
each request batch is routed to one servable, shadow copies fan out, and every outcome goes to the
prediction log. Front-ends convert their payloads to a Frame and call :meth:`Gateway.infer`.

Layers, top-down: this module; :mod:`forestflow.administration` (admin changes, evaluation,
persistence) and :mod:`forestflow.replica_sync` (following the store); the
:class:`~forestflow.registry.registry.Registry` (contracts, loaded and failed servables); and
:mod:`forestflow.core` (routing and policies, no I/O). Admin front-ends call :attr:`Gateway.admin`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import structlog

from forestflow import tracing
from forestflow.administration import Administration
from forestflow.cancelling import cancel_until_done
from forestflow.core import declared, input_report
from forestflow.core.bandit import RewardStats
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.definition import ServableDefinition
from forestflow.core.frame import Frame
from forestflow.core.gates import agreeing_rows
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import LogLevel, ServableMetrics
from forestflow.errors import (
    ClientClosedRequest,
    Forbidden,
    GatewayError,
    InvalidInput,
    Kind,
    NotFound,
    ServableNotReady,
    StoreUnavailable,
    UnknownServable,
    http_status,
)
from forestflow.predlog.log import PredictionLog
from forestflow.predlog.record import PredictionRecord, Wire, new_record
from forestflow.registry.answers import SHARE_EVERY_S, Answered, AnsweredIndex, SharedAnswers
from forestflow.registry.artifacts import ArtifactCache
from forestflow.registry.loader import ServableLoader
from forestflow.registry.registry import Loaded, Registry
from forestflow.registry.release_loads import Backoff, LoadStatus, ReleaseLoads
from forestflow.registry.residency import Residency
from forestflow.registry.store import Store
from forestflow.replica_sync import ReplicaSync
from forestflow.runtime.base import ServableMetadata
from forestflow.runtime.explanation import describe, explain_call
from forestflow.runtime.scheduler import Priority, ShadowDropped
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.service")

#: LogLevel.NONE, read per request without EnumType's attribute hook (a call on Python 3.11).
_LOG_NONE = LogLevel.NONE
#: A restored registry of this many contracts or more is frozen out of the garbage collector's passes.
FREEZE_AFTER_CONTRACTS = 1000


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


class Gateway:
    """Routing, scoring, shadowing and logging over a registry, independent of any protocol."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        artifacts: ArtifactCache,
        prediction_log: PredictionLog,
        clock: Callable[[], int] = now_ms,
        shared_answers: SharedAnswers | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.prediction_log = prediction_log
        self.registry = Registry()
        loader = ServableLoader(settings, artifacts)
        #: Loads this process follows (learnt from the store, restored, the repository's), retried until done.
        self.loads = ReleaseLoads(self.registry, Backoff(settings.load_retry_first_s, settings.load_retry_max_s))
        self.admin = Administration(settings, self.registry, store, loader, clock, self.loads)
        #: Cold releases loaded on demand and in the background; the memory budget.
        self.residency = Residency(settings, self.registry, loader, self.loads)
        self.replica_sync = ReplicaSync(
            self.registry, store, loader, self.admin, self.loads, self.residency if settings.lazy else None
        )
        self.loader = loader
        self._tasks: set[asyncio.Future[Any]] = set()  # shadow copies, waited for briefly at stop
        self._timers: list[asyncio.Task[None]] = []
        #: (shadow entry, shadow answer, served answer) waiting to be compared off the request path.
        self._comparisons: deque[tuple[ServableEntry, Frame, Frame]] = deque(maxlen=10_000)
        #: Recent answers by request id, for reward feedback (shared with the other processes
        #: of the registry when there are any).
        self.answers = AnsweredIndex(settings.feedback_index_size, settings.feedback_ttl_s, lambda: self.clock(), shared_answers)
        self.started = False
        self.draining = False

    @property
    def clock(self) -> Callable[[], int]:
        """Milliseconds now: stamps prediction events and drives evaluation (one clock for both)."""
        return self.admin.clock

    @clock.setter
    def clock(self, clock: Callable[[], int]) -> None:
        self.admin.clock = clock

    # ---- registry views ---------------------------------------------------------------------------
    @property
    def contracts(self) -> Mapping[Contract, ContractState]:
        """Every contract this gateway holds (read-only: change them through :attr:`admin`)."""
        return self.registry.contracts

    @property
    def loaded(self) -> Mapping[FQRV, Loaded]:
        """The loaded servables (read-only)."""
        return self.registry.loaded

    @property
    def failed(self) -> Mapping[FQRV, str]:
        """Releases whose load failed, with the reason (read-only)."""
        return self.registry.failed

    def failing_entries(self, contract: Contract) -> list[tuple[ServableEntry, LoadStatus]]:
        """The contract's releases whose load keeps failing on this process (retried meanwhile), as
        entries with this gateway's view of their counters (the other replicas' sums), oldest first."""
        out = []
        failed = [(f, s) for f, s in self.loads.failed(contract).items() if f not in self.registry.cold]  # cold: routed
        for fqrv, status in sorted(failed, key=lambda kv: kv[1].definition.created_at_ms):
            defn = status.definition
            entry = ServableEntry(fqrv, defn.settings, ServableMetrics(created_at_ms=defn.created_at_ms))
            out.append((replace(entry, metrics=self.stats_metrics(entry)), status))
        return out

    def release_ready(self, fqrv: FQRV) -> bool:
        """Whether a request for ``fqrv`` can be answered now (V2 model readiness): loaded and
        ready, or, with lazy loading, cold or loading (it loads on demand); a release whose load
        failed is not, nor is anything while the gateway drains."""
        if self.draining:
            return False
        loaded = self.registry.loaded.get(fqrv)
        if loaded is not None:
            return bool(loaded.servable.ready)
        return self.settings.lazy and fqrv in self.registry.cold and self.residency.state(fqrv) != "failed"

    def load_view(self, fqrv: FQRV) -> dict[str, Any] | None:
        """With lazy loading, whether a release of a contract is loaded, loading, cold or failed here
        (with the failure's error, attempts and next retry); None without lazy loading."""
        if not self.settings.lazy:
            return None
        status = self.loads.statuses.get(fqrv)
        view = status.view() if status is not None else {}
        return view | {"state": self.residency.state(fqrv)}

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Restore the registry from the store, load every servable, start the timers."""
        collecting = gc.isenabled()
        if collecting:
            # Restoring builds millions of objects that all live on: the collector's passes over the
            # growing heap took a third of restoring 10,000 releases (py-spy); ready 6.4 -> 4.8 s.
            gc.disable()
        try:
            docs = await self.store.load()
            await self.replica_sync.reconcile(docs, wait=True)
        finally:
            if collecting:
                gc.enable()
        if len(self.registry.contracts) >= FREEZE_AFTER_CONTRACTS and collecting:
            # ... and out of the passes for good (the serve command froze what existed before the
            # restore), or each full pass walks it and pauses the event loop.
            gc.freeze()
        if not self.settings.lazy:
            await self.loader.prune_artifacts()  # what no restored servable uses (deleted while down, crashes)
        else:  # what neither a loaded nor a cold release uses, after ready (it reads local sources' digests)
            self._spawn_prune(list(self.registry.cold.values()))
        registry = self.registry
        log.info(
            "registry_restored",
            contracts=len(registry.contracts),
            servables=len(registry.loaded),
            cold=len(registry.cold),
            failed=len(registry.failed),
        )
        self.prediction_log.start()
        if self.settings.lazy:
            self.residency.start()
        self._timers = [
            asyncio.create_task(self._every(self.settings.evaluation_interval_s, self.admin.evaluate_all), name="evaluate"),
            asyncio.create_task(self._every(self.settings.metrics_flush_interval_s, self.admin.flush_metrics), name="flush"),
            asyncio.create_task(self._every(COMPARE_INTERVAL_S, self.compare_shadows), name="compare-shadows"),
        ]
        if self.answers.shared is not None:  # answers the other processes may get feedback for
            self._timers.append(asyncio.create_task(self._every(SHARE_EVERY_S, self.answers.share), name="share-answers"))
        watch = getattr(self.store, "watch", None)
        if watch is not None:  # follow the changes of other processes sharing the store (replicas, workers)
            watch(self.replica_sync.sync_from_store)
        self.started = True

    def _spawn_prune(self, cold: list[ServableDefinition]) -> None:
        async def prune() -> None:
            try:
                await self.loader.prune_artifacts(cold)
            except Exception:  # the cache is pruned at the next start
                log.exception("artifacts_prune_failed")

        task = asyncio.ensure_future(prune())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Stop timers, wait briefly for background work, persist counters, flush the log, unload."""
        self.draining = True
        self.replica_sync.close()
        # A cancel lost inside a timer's action (a Redis call) left shutdown waiting for that timer for
        # ever: cancelled until done, and _every also stops at its next turn once draining.
        await cancel_until_done(self._timers)
        background = [*self._tasks, *self.loads.tasks, *self.residency.close()]
        if background:
            await asyncio.wait(background, timeout=5.0)
        await self.answers.share()
        try:
            await self.admin.flush_metrics(force=True)
        except StoreUnavailable as error:  # Redis away: the last flushed counters stand; shut down anyway
            log.warning("final_flush_failed", reason=error.message)
        await self.prediction_log.close(self.settings.log_flush_timeout_s)
        for loaded in list(self.registry.loaded.values()):
            await loaded.scheduler.close()
            await loaded.servable.aunload()
        self.registry.loaded.clear()
        await self.store.close()

    async def _every(self, seconds: float, action: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self.draining:
                return
            try:
                await action()
            except StoreUnavailable as error:  # Redis away: the store logs that once; retry next round
                log.debug("timer_store_unavailable", action=getattr(action, "__name__", str(action)), reason=error.message)
            except Exception:  # a timer must survive a failed round
                log.exception("timer_failed", action=getattr(action, "__name__", str(action)))

    # ---- health -------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Serving: started, not draining, every registered servable loaded (with lazy loading: the
        routing state restored), the prediction log draining."""
        registry = self.registry
        return (
            self.started
            and not self.draining
            and (self.settings.lazy or (not registry.failed and not registry.pending))
            and not self.unhealthy()
            and self.prediction_log.running
        )

    def unhealthy(self) -> dict[str, str]:
        """Loaded servables that cannot score now (e.g. their JVM died), with the reason."""
        return {str(f): p for f, loaded in self.registry.loaded.items() if (p := loaded.servable.health_problem())}

    def readiness(self) -> dict[str, Any]:
        """Details behind :attr:`ready`."""
        return {
            "ready": self.ready,
            "started": self.started,
            "unhealthy": self.unhealthy(),
            "servables": len(self.registry.loaded),
            "cold": len(self.registry.cold),
            "loading": sorted(str(f) for f in self.registry.pending),
            # fetching (the artifact) or loading, for each load under way (`forestflow deploy --wait`)
            "loadingPhases": {str(f): phase for f, phase in self.loader.phases.items()},
            # Releases whose loads fail here: the last error, attempts so far, the next one in (s).
            "failed": {str(f): status.view() for f, status in self.loads.failed().items()},
            "draining": self.draining,
            "predictionLogRunning": self.prediction_log.running,
            # shown, never a reason to leave the balancer: scoring goes on while the log is failing
            "predictionLog": self.prediction_log.stats.delivery(),
        }

    # ---- data plane ---------------------------------------------------------------------------------
    def contract_state(self, contract: Contract) -> ContractState:
        """The state of a contract or UnknownContract."""
        return self.registry.contract_state(contract)

    def route(
        self,
        contract: Contract,
        release: str | None = None,
        state: ContractState | None = None,
        *,
        configs: Mapping[str, str] | None = None,
        pinned: bool = False,
    ) -> Route:
        """Decide which release answers one request (and which get shadow copies), before its body
        is decoded: positional layouts are then decoded against the release that scores.

        Resolves the contract (UnknownContract) and ``release`` (UnknownServable) once; counts the
        request for the contract's routing and sampling. A caller that holds the contract's
        ``state`` already passes it. ``configs``: the request's (a sticky router reads its key
        there); ``pinned``: ``release`` was named by the caller's ``X-Forestflow-Release``.
        """
        if state is None:
            state = self.contract_state(contract)
        if release is not None:
            if release not in state.servables:
                raise UnknownServable(FQRV(contract, release))
            return Route(state, release, [], pinned)
        key = state.sticky_key
        sticky_value = configs.get(key) if key is not None and configs else None
        rewards = self.reward_stats(state) if state.settings.router.is_bandit else None
        answered = state.route(sticky_value, rewards)
        return Route(state, answered, state.shadow_targets(answered, self.settings.log_sample_every))

    def pinned_release(self, state: ContractState, release: str, admin: bool) -> str:
        """The release an ``X-Forestflow-Release`` header names, when the caller may pin one: the
        contract allows it (``allowPinnedReleases``) or ``admin`` (the caller showed the admin
        token). 403 otherwise; 404 for a release the contract does not have."""
        if not (state.settings.allow_pinned_releases or admin):
            raise Forbidden(
                f"pinning a release of contract {state.contract} is not allowed: its contract settings "
                "need allowPinnedReleases: true, or the request the admin token"
            )
        if release not in state.servables:
            raise UnknownServable(FQRV(state.contract, release))
        return release

    def reward_stats(self, state: ContractState) -> dict[str, RewardStats]:
        """Every release's reward statistics, summed over the processes sharing the registry."""
        out = {}
        for release, entry in state.servables.items():
            m = self.stats_metrics(entry)
            out[release] = RewardStats(m.feedback_count, m.reward_sum, m.reward_squares)
        return out

    async def feedback(self, contract: Contract | None, request_id: str, reward: float) -> FQRV:
        """Count a reward for the answer to ``request_id`` on the release that gave it, and log it.

        404 when the id is unknown, expired, of another contract than ``contract``, or its
        release has left the contract since.
        """
        answered = await self.answers.lookup(request_id)
        if answered is None or (contract is not None and answered.fqrv.contract != contract):
            where = f" of contract {contract}" if contract is not None else ""
            raise NotFound(
                f"unknown request id {request_id!r}{where}: no answer with that X-Request-Id in the last "
                f"{self.settings.feedback_ttl_s:g} s (or it was one of the oldest past the index size)"
            )
        fqrv = answered.fqrv
        entry = self.registry.entry(fqrv)  # UnknownServable: the release has left the contract
        metrics = entry.metrics
        metrics.feedback_count += 1
        metrics.reward_sum += reward
        metrics.reward_squares += reward * reward
        self.registry.mark_counted(fqrv.contract)
        logging = entry.settings.logging
        if logging.log_level is not LogLevel.NONE:
            self.prediction_log.emit(
                PredictionRecord(
                    fqrv,
                    True,
                    _NO_FRAME,
                    answered.key_configs,
                    logging,
                    request_id,
                    FEEDBACK_PROTOCOL,
                    self.clock(),
                    0.0,
                    pinned=answered.pinned,
                    feedback=reward,
                )
            )
        return fqrv

    def describing_release(self, state: ContractState) -> FQRV | None:
        """The release whose metadata describes the contract (its inputs and outputs in metadata
        calls, and the layout of requests nothing can answer): the newest routed release when it is
        loaded, else the newest loaded one; None when none is loaded."""
        loaded = self.registry.loaded
        release = state.latest_valid()
        if release is not None and (fqrv := state.servables[release].fqrv) in loaded:
            return fqrv
        newest = None
        for entry in state.servables.values():
            if entry.fqrv in loaded and (newest is None or entry.metrics.created_at_ms >= newest.metrics.created_at_ms):
                newest = entry
        return newest.fqrv if newest is not None else None

    async def load_routed(self, route: Route, timeout_s: float | None = None) -> None:
        """Load the answering release when it is cold, before a request's body is decoded against
        it (503 when its load fails, 504 when it does not load within the deadline)."""
        entry = route.state.servables.get(route.answered) if route.answered is not None else None
        if entry is not None and entry.fqrv not in self.registry.loaded and entry.fqrv in self.registry.cold:
            timeout = timeout_s if timeout_s is not None else self.settings.request_timeout_ms / 1000
            await self.residency.get(entry.fqrv, timeout)

    def decoding_metadata(self, route: Route) -> ServableMetadata | None:
        """The metadata a request's positional tensors are laid out against: the answering
        release's when it is loaded, else the describing release's (None: nothing is loaded)."""
        entry = route.state.servables.get(route.answered) if route.answered is not None else None
        if entry is not None:  # None too when the release left the contract since it was routed
            loaded = self.registry.loaded.get(entry.fqrv)
            if loaded is not None:
                return loaded.servable.metadata()
        fqrv = self.describing_release(route.state)
        return self.registry.loaded[fqrv].servable.metadata() if fqrv is not None else None

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
        wire: Wire | None = None,
        route: Route | None = None,
        explain: bool = False,
    ) -> InferResult:
        """Score one batch on the contract's routed servable (or ``release`` directly).

        Shadow copies go to every other logging servable and are never awaited. Both the answer
        and failures are logged for servables that log. A front-end that has the request's body
        passes it with its answer encoder as ``wire`` (:class:`Wire`): the log then reuses both
        instead of encoding the request and the answer a second time. A front-end that
        decoded the request against the release that scores passes the ``route`` it took
        (:meth:`route`); otherwise the request is routed here.

        ``explain``: the release that answers also explains its answer (routed, queued, timed and
        logged exactly as a score; shadow copies are plain scores): the output frame then holds a
        ``runtime.explanation.Explanation`` in its parameters; CannotExplain (422) if that release
        can explain neither exactly nor with a declared explainer.
        """
        limit = self.settings.explain_max_rows if explain else self.settings.max_rows
        if frame.num_rows > limit:
            what = "explanation batch" if explain else "batch"
            raise InvalidInput(f"{what} of {frame.num_rows} records is over the limit of {limit}")
        if route is None or (route.answered is not None and route.answered not in route.state.servables):
            # Not routed yet, or routed (before the body was read) to a release that has left the
            # contract since (expired, deleted, removed by a follower): routed now.
            route = self.route(contract, release, configs=configs)
        state, answered, shadows = route.state, route.answered, route.shadows
        timeout = timeout_s if timeout_s is not None else self.settings.request_timeout_ms / 1000
        context = _RequestContext(frame, configs, request_id, protocol, wire, route.pinned)
        if answered is None:
            self._fan_out(state, shadows, context)
            raise self.registry.inactive_error(contract)
        entry = state.servables[answered]
        loaded = self.registry.loaded.get(entry.fqrv)
        if loaded is not None and loaded.servable.ready:  # what the model declares, checked before it runs (a 400, not its 500)
            servable = loaded.servable
            frame = declared.fit_inputs(frame, servable.metadata().inputs, not servable.converts_inputs)
        entry.metrics.score_count += 1
        entry.metrics.in_flight += 1  # until its outcome is counted (_count_outcome)
        self.registry.mark_counted(contract)
        fqrv = entry.fqrv
        started = time.perf_counter()
        try:
            if loaded is None:  # cold: loaded now (one load for every request waiting), else a 503
                loaded = await self.residency.get(fqrv, timeout)
                timeout = max(0.001, timeout - (time.perf_counter() - started))
            elif self.residency.lazy:  # the budget's LRU order; the warm-up's pace
                self.residency.touch(fqrv)
            work = explain_call(loaded.servable, loaded.explainer) if explain else None
            if tracing.ON:  # the queue wait and the scoring as children of the request's span
                timing = tracing.QueueThenPredict(str(fqrv), frame.num_rows)
                submitted = loaded.scheduler.submit(frame, Priority.LIVE, timeout, timing.started, work)
                self._fan_out(state, shadows, context)
                failed = True
                try:
                    out = input_report.checked(entry.settings, await submitted)
                    failed = False
                finally:
                    timing.finish(failed)
            elif work is None:
                self._fan_out(state, shadows, context)
                scheduler = loaded.scheduler
                scored = scheduler.offer_live(frame, timeout)  # a tiny batch on an idle scheduler: scored now
                if isinstance(scored, asyncio.Future):
                    scored = await scheduler.result(scored)
                out = input_report.checked(entry.settings, scored)  # strictInputs: a 400
            else:
                submitted = loaded.scheduler.submit(frame, Priority.LIVE, timeout, None, work)
                self._fan_out(state, shadows, context)
                out = input_report.checked(entry.settings, await submitted)  # strictInputs: a 400
        except GatewayError as error:
            self._log_outcome(entry, context, True, started, error=error)
            if error.__cause__ is not None:
                cause = error.__cause__
                log.error(
                    "predict_failed",
                    fqrv=str(fqrv),
                    request_id=request_id,
                    error_code=error.code,
                    exception_type=type(cause).__name__,
                    exc_info=cause,
                )
            raise
        except asyncio.CancelledError:
            # The client went away: its job is withdrawn, and the prediction log still says so.
            self._log_outcome(entry, context, True, started, error=ClientClosedRequest("the client closed the request"))
            raise
        encode = wire.encode if wire is not None and not wire.graphpipe else None  # the caller's answer, once
        response_json: bytes | None
        try:
            if tracing.ON and encode is not None:
                with tracing.child("encode"):
                    response_json = encode(fqrv, out)
            else:
                response_json = encode(fqrv, out) if encode is not None else None
        except GatewayError as error:  # the answer cannot be put in the caller's terms (e.g. an unknown output)
            self._log_outcome(entry, context, True, started, error=error)
            raise
        latency = self._log_outcome(entry, context, True, started, output=out, response_json=response_json)
        self._remember(request_id, entry, configs, route.pinned)
        context.served = out
        if context.waiting:  # shadow copies that finished first: compare them now (off this path)
            self._comparisons.extend((shadow, answer, out) for shadow, answer in context.waiting)
            context.waiting = None
        return InferResult(fqrv, out, latency, response_json)

    def _remember(self, request_id: str, entry: ServableEntry, configs: dict[str, str], pinned: bool) -> None:
        """Index the answer for reward feedback (with the configs its log key is made of)."""
        logging = entry.settings.logging
        features = logging.key_features if logging.log_level is not _LOG_NONE else ()
        self.answers.remember(request_id, Answered.of(entry.fqrv, features, configs, self.clock(), pinned))

    def _fan_out(self, state: ContractState, releases: list[str], context: _RequestContext) -> None:
        timeout = self.settings.request_timeout_ms / 1000
        for release in releases:
            entry = state.servables.get(release)  # None: it left the contract since it was routed
            loaded = self.registry.loaded.get(entry.fqrv) if entry is not None else None
            if entry is None or loaded is None:
                if entry is not None and entry.fqrv in self.registry.cold:
                    # Never loaded for a shadow copy: shadow traffic cannot evict what live traffic uses.
                    self.residency.shadow_cold_skipped += 1
                continue
            entry.metrics.shade_count += 1
            entry.metrics.in_flight += 1  # until its outcome is counted (_count_outcome)
            self.registry.mark_counted(state.contract)
            started = time.perf_counter()
            try:
                pending = loaded.scheduler.offer(context.frame, Priority.SHADOW, timeout)
            except ShadowDropped:
                # Counted by the scheduler too; nothing was scored, so nothing to log.
                _count_outcome(self.registry, entry, False, False, None)
                continue
            except GatewayError as error:  # e.g. the servable is being unloaded
                self._log_outcome(entry, context, False, started, error=error)
                continue
            # A callback, not a task per copy: nobody waits for shadow work, so it needs no coroutine.
            if tracing.ON:  # a span of its own, linked to the request's
                pending.add_done_callback(tracing.end_on_done(tracing.shadow_span(str(entry.fqrv))))
            pending.add_done_callback(partial(self._shadow_done, entry, context, started))
            self._tasks.add(pending)
            pending.add_done_callback(self._tasks.discard)

    def _shadow_done(
        self, entry: ServableEntry, context: _RequestContext, started: float, pending: asyncio.Future[Frame]
    ) -> None:
        if pending.cancelled():
            _count_outcome(self.registry, entry, False, False, None)
            return
        error = pending.exception() or input_report.strict_inputs_error(entry.settings, pending.result())
        if error is None:
            answer = pending.result()
            self._log_outcome(entry, context, False, started, output=answer)
            if context.served is not None:
                self._comparisons.append((entry, answer, context.served))
            elif context.waiting is None:
                context.waiting = [(entry, answer)]
            else:
                context.waiting.append((entry, answer))
        elif isinstance(error, GatewayError):
            self._log_outcome(entry, context, False, started, error=error)
        else:
            _count_outcome(self.registry, entry, False, False, None)

    async def compare_shadows(self) -> None:
        """Compare the finished shadow copies with the served answers (the gateway's timer).

        Each copy's first output per row is checked against the served one; the result goes to
        the shadow release's ``agreement`` window.
        """
        comparisons = self._comparisons
        while comparisons:
            entry, answer, served = comparisons.popleft()
            try:
                agreeing, rows = agreeing_rows(answer, served)
            except Exception:  # an answer that cannot be compared must not stop the others
                log.exception("shadow_compare_failed", fqrv=str(entry.fqrv))
                continue
            if rows:
                entry.metrics.window.record_agreement(agreeing, rows)
                self.registry.stale.add(entry.fqrv.contract)  # agreement: a performance metric

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
        _count_outcome(self.registry, entry, served, error is None, error, latency)
        logging = entry.settings.logging
        if logging.log_level is _LOG_NONE:
            return latency
        wire = context.wire
        raw_request = raw_response = request_json = None
        if wire is not None and wire.graphpipe:
            raw_request = wire.request
            if output is not None:
                raw_response = wire.encode(entry.fqrv, output)
        elif wire is not None:
            request_json = wire.request
            if response_json is None and output is not None:
                try:  # a shadow's answer, encoded for the log alone
                    response_json = wire.encode(entry.fqrv, output)
                except GatewayError as failed:  # e.g. a shadow that cannot classify: logged as that failure
                    output, error = None, failed
        # Positional, in PredictionRecord's field order, built in C without the dataclass's __init__
        # (new_record): this runs for every logged prediction.
        self.prediction_log.emit(
            new_record(
                entry.fqrv,
                served,
                context.frame,
                context.configs,
                logging,
                context.request_id,
                context.protocol,
                self.admin.clock(),  # the clock property, without its frame (per logged prediction)
                latency,
                200 if error is None else http_status(error),
                output,
                error.message if error else "",
                error.code if error else "",
                raw_request,
                raw_response,
                request_json,
                response_json,
                tracing.current_trace_id() if tracing.ON else "",
                served and context.pinned,
            )
        )
        return latency

    # ---- lookups ----------------------------------------------------------------------------------
    def definition(self, fqrv: FQRV) -> ServableDefinition:
        """The definition of a loaded (or cold) servable or UnknownServable."""
        return self.registry.definition(fqrv)

    def metadata(self, fqrv: FQRV) -> ServableMetadata:
        """A servable's inputs and outputs (503 ServableNotReady for one whose load fails here, and
        for a cold one, whose load this starts)."""
        loaded = self.registry.loaded.get(fqrv)
        if loaded is None and self.residency.load(fqrv) is not None:
            raise ServableNotReady(f"servable {fqrv} is not loaded on this process yet (loading now): retry")
        if loaded is None and (status := self.loads.failed(fqrv.contract).get(fqrv)) is not None:
            raise ServableNotReady(
                f"servable {fqrv} failed to load on this process ({status.attempts} attempts, retried): {status.error}"
            )
        return self.registry.loaded_servable(fqrv).servable.metadata()

    def explanation(self, fqrv: FQRV) -> dict[str, Any] | None:
        """How a loaded release explains (``{"method": "TreeSHAP", ...}``), None when it cannot."""
        loaded = self.registry.loaded_servable(fqrv)
        return describe(loaded.servable, loaded.explainer)

    def active_release(self, contract: Contract) -> FQRV:
        """The servable that represents the contract in metadata calls (the newest routed one)."""
        return self.registry.active_release(contract)

    def servable_entries(self, contract: Contract, *, empty_ok: bool = False) -> list[ServableEntry]:
        """The contract's servables, oldest first; 422 when it has none (as ForestFlow) unless ``empty_ok``."""
        return self.registry.servable_entries(contract, empty_ok=empty_ok)

    def entry(self, fqrv: FQRV) -> ServableEntry:
        """One servable's entry or UnknownServable."""
        return self.registry.entry(fqrv)

    def stats_metrics(self, entry: ServableEntry) -> ServableMetrics:
        """A servable's metrics for /stats (summed over the replicas sharing a store)."""
        return self.replica_sync.stats_metrics(entry)


#: How often finished shadow copies are compared with the served answers.
COMPARE_INTERVAL_S = 0.25
#: The protocol of feedback events in the prediction log.
FEEDBACK_PROTOCOL = "feedback"
#: The request frame of a feedback event (it has none).
_NO_FRAME = Frame({})


def _count_outcome(
    registry: Registry,
    entry: ServableEntry,
    served: bool,
    ok: bool,
    error: GatewayError | None,
    latency_ms: float | None = None,
) -> None:
    """Count one event's outcome in the release's counters and window.

    A live request fails on a server-side error (5xx: the model, not ready, overloaded, deadline);
    the caller's mistakes (4xx) and clients going away are neither successes nor failures. Any
    shadow copy that did not produce an answer is a failure.
    """
    metrics = entry.metrics
    metrics.in_flight -= 1
    contract = entry.fqrv.contract
    registry.stale.add(contract)  # validity reads the successes and the window
    if not ok and served:
        if error is None or error.kind is Kind.CANCELLED or http_status(error) < 500:
            return
        metrics.error_count += 1
        registry.dirty.add(contract)
    elif not ok:
        metrics.shade_error_count += 1
        registry.dirty.add(contract)
    metrics.window.record(ok, latency_ms)


@dataclass(slots=True)
class Route:
    """Which release answers one request and which get shadow copies (:meth:`Gateway.route`)."""

    state: ContractState
    #: The release that scores (None: nothing is active; the request gets a 422).
    answered: str | None
    shadows: list[str]
    #: The caller named the release (``X-Forestflow-Release``): logged as pinned.
    pinned: bool = False


@dataclass(slots=True)
class _RequestContext:
    frame: Frame
    configs: dict[str, str]
    request_id: str
    protocol: str
    wire: Wire | None
    pinned: bool = False
    #: The served answer, once there is one (shadow copies are compared with it).
    served: Frame | None = None
    #: Shadow answers that arrived before the served one.
    waiting: list[tuple[ServableEntry, Frame]] | None = None
