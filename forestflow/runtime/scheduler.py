"""Per-servable scheduling: a bounded two-level queue in front of a few scoring slots.

LIVE work always starts before SHADOW work (no preemption of work already running). A full live
queue refuses at once (:class:`Overloaded`, answered 503 + Retry-After); a full shadow queue drops
the copy and counts it. Every job carries a deadline: one that passes while queued or scoring
fails the caller with :class:`DeadlineExceeded` and gives the slot back at once (a scoring thread
that cannot be interrupted finishes in the background; its result is discarded).

A servable that ``runs_on_loop`` (a remote backend) is scored by a task on the event loop instead
of a thread: its slots bound the calls in flight, and a job abandoned by every caller cancels it.

By default each servable runs ``predict`` on threads of its own. With one pool shared by every
servable, slow shadow servables could hold all its threads, and a live request, though first in
its own servable's queue, would wait in the pool's FIFO behind them, where priorities cannot
reach. A servable's own pool holds its slots plus spare threads, so a slot freed by a deadline
can be reused while the abandoned call still runs; once the spares are used up too, the
scheduler counts the servable as full rather than queueing work on threads that are not there.

Queued jobs of one priority whose frames have the same columns and parameters may be scored as
one batch (micro-batching) when the servable declares it batches (``Servable.batchable``): one
model call for many small concurrent requests. A lone request never waits for company while a slot
is free, unless ``batch_wait_us`` allows it to, and then only while other work of the servable is
scoring (under load, queued jobs are combined anyway). Live and shadow work are never combined, so
live work never waits behind shadow work. When a combined call fails, each of its jobs is scored
again on its own, once, so a bad request fails alone; its deadline still holds.

Tiny live batches of servables that allow it (``inline_max_rows``) are scored on the event loop,
without a thread hop. Under concurrent load, those arriving in the same turn of the event loop are
scored together, in one call at the end of that turn (see :meth:`ServableScheduler._end_turn`).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import BackendUnavailable, DeadlineExceeded, GatewayError, Overloaded, PredictionFailed
from forestflow.runtime.base import Servable

#: Most rows one combined call on the event loop may hold: it stays well under a millisecond.
_MAX_ROWS_ON_LOOP = 64
#: Only requests this small are gathered with others: for bigger ones a call of their own costs
#: little more per row, and waiting for the end of the turn would be all cost.
_GATHER_MAX_ROWS = 8
#: Gathering stops after this many turns in a row saw a single request each.
_QUIET_TURNS = 4


#: Failures of a combined call that say nothing about its rows: every job gets them as they are.
_NOT_RETRIED = (Overloaded, DeadlineExceeded, BackendUnavailable)


class Priority(enum.IntEnum):
    """LIVE answers a caller; SHADOW only feeds the prediction log."""

    LIVE = 0
    SHADOW = 1


class ShadowDropped(GatewayError):
    """A shadow copy refused because its queue was full (counted, never returned to a caller)."""


@dataclass(slots=True, eq=False)
class _Job:
    frame: Frame
    priority: Priority
    deadline: float  # loop.time() by which it must finish
    future: asyncio.Future[Frame]
    timeout_s: float
    timer: asyncio.TimerHandle | None = None
    #: Set while the job runs: frees the slot once every caller of its batch has given up.
    on_abandon: Callable[[], None] | None = None
    #: Called when the job leaves the queue and starts scoring (tracing's queue wait ends there).
    on_start: Callable[[], None] | None = None
    #: The caller's context (its trace span), for a call that runs as a task on the loop: a job
    #: started later from another job's callback would otherwise run in that job's context.
    context: contextvars.Context | None = None
    #: loop.time() when it was queued (a batch wait counts from its oldest job).
    queued_at: float = 0.0
    #: Scored on its own: it is being retried after the combined call it was part of failed.
    alone: bool = False
    #: Not ``predict`` but this call (an explanation): never combined with others, never on the loop.
    #: For a servable that ``runs_on_loop`` it is a coroutine function taking (frame, timeout_s).
    work: Callable[..., Any] | None = None


@dataclass(slots=True)
class SchedulerStats:
    """Counters a scheduler keeps (exposed in metrics)."""

    live_rejected: int = 0
    shadow_dropped: int = 0
    deadline_exceeded: int = 0
    #: combined calls on scoring threads, and the jobs they held.
    batches: int = 0
    batched_jobs: int = 0
    #: combined calls that failed and whose jobs were scored again one by one.
    batch_retries: int = 0
    #: predict calls still running in a thread after every caller gave up (their slot is free).
    abandoned_running: int = 0
    #: tiny live batches scored on the event loop (no thread hop).
    inline_calls: int = 0
    #: of those, calls that scored several requests together (gathered on the loop), and their requests.
    coalesced_calls: int = 0
    coalesced_jobs: int = 0


class ServableScheduler:
    """Queues and runs ``predict`` calls of one servable.

    ``executor`` runs the calls; None gives the servable a thread pool of its own with at most
    ``max_threads`` threads (default and minimum: twice the slots, so every slot has a spare),
    shut down by :meth:`close`. ``max_batch_rows`` (0 or 1: never) caps the rows of one combined
    call on a thread and ``coalesce_rows`` one on the loop; ``batch_wait_us`` is how long the
    oldest job of an unfilled batch may wait for more while other work is scoring (0: never waits).
    """

    def __init__(
        self,
        servable: Servable,
        executor: Executor | None,
        slots: int,
        live_queue: int,
        shadow_queue: int,
        max_batch_rows: int = 0,
        max_threads: int = 0,
        coalesce_rows: int = 0,
        batch_wait_us: int = 0,
    ) -> None:
        self.servable = servable
        self.slots = max(1, slots)
        self._own_pool: ThreadPoolExecutor | None = None
        #: Threads this servable may occupy, abandoned calls included (0: a shared pool, not counted).
        self.thread_limit = 0
        if executor is None and not servable.runs_on_loop:
            self.thread_limit = max(2 * self.slots, max_threads)
            # Threads start lazily: only as many as were ever busy at once exist.
            executor = self._own_pool = ThreadPoolExecutor(self.thread_limit, thread_name_prefix=f"predict-{servable.fqrv}")
        self.executor: Executor | None = executor
        #: Calls running as tasks on the loop (``runs_on_loop`` servables): held until done.
        self._tasks: set[asyncio.Future[Frame]] = set()
        self.live_limit = live_queue
        self.shadow_limit = shadow_queue
        #: 0 disables micro-batching; otherwise the most rows one combined call may hold.
        self.max_batch_rows = max_batch_rows
        #: 0 disables scoring same-turn inline requests together; otherwise the most rows per call.
        self.coalesce_rows = min(coalesce_rows, _MAX_ROWS_ON_LOOP)
        self._turn_armed = False
        self._turn_offers = 0
        self._coalescing = False
        #: Turns in a row that saw a single request while gathering (gathering stops at _QUIET_TURNS).
        self._quiet_turns = 0
        self._gathered: list[tuple[Frame, asyncio.Future[Frame]]] = []
        self._gathered_rows = 0
        #: How long an unfilled batch may wait for more (seconds; 0 = it never waits).
        self.batch_wait_s = max(0, batch_wait_us) / 1e6
        #: Flushes the loop's gathered requests once their batch wait is over.
        self._gather_timer: asyncio.TimerHandle | None = None
        #: Starts held queued jobs once the oldest one's batch wait is over.
        self._hold_timer: asyncio.TimerHandle | None = None
        self.running = 0
        self.queues: dict[Priority, deque[_Job]] = {Priority.LIVE: deque(), Priority.SHADOW: deque()}
        self.stats = SchedulerStats()
        self.closed = False
        #: Callers of :meth:`drain` waiting for the admitted work to finish.
        self._idle_waiters: list[asyncio.Future[None]] = []

    def idle(self) -> bool:
        """No admitted work is waiting or scoring (abandoned calls aside: nobody reads them)."""
        return self.running == 0 and not self._gathered and not any(self.queues.values())

    async def drain(self, timeout_s: float) -> bool:
        """Wait until the work already admitted has finished, at most ``timeout_s``; True if it has.

        Called once the servable has left routing and before :meth:`close`, so requests already
        routed to a release that expires or is deleted get their answer instead of a 503.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.idle():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._idle_waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return self.idle()
        return True

    def _wake_if_idle(self) -> None:
        if self._idle_waiters and self.idle():
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def queued(self, priority: Priority) -> int:
        """Jobs waiting at one priority."""
        return len(self.queues[priority])

    def live_room(self) -> int:
        """How many LIVE jobs offered now would be admitted before one is refused as Overloaded.

        Free slots (when nothing live waits) plus free live queue places; a front-end that must
        not be refused (the Kafka consumer) checks this and holds its input back at 0.
        """
        queue = self.queues[Priority.LIVE]
        free = 0
        if not queue and not self.closed:
            free = self.slots - self.running
            if self.thread_limit:
                free = min(free, self.thread_limit - self.running - self.stats.abandoned_running)
        return max(0, free) + max(0, self.live_limit - len(queue))

    def _can_start(self) -> bool:
        if self.closed or self.running >= self.slots:
            return False
        return not self.thread_limit or self.running + self.stats.abandoned_running < self.thread_limit

    async def submit(
        self,
        frame: Frame,
        priority: Priority,
        timeout_s: float,
        on_start: Callable[[], None] | None = None,
        work: Callable[..., Any] | None = None,
    ) -> Frame:
        """Score ``frame``; raises Overloaded / ShadowDropped / DeadlineExceeded / the model's error.

        Cancelling the caller withdraws the job: out of the queue, or its slot freed if running.
        ``on_start`` is called when the job starts scoring. ``work`` replaces ``predict`` for this job
        (an explanation): it runs alone, on a scoring thread (or as a task for a servable that
        ``runs_on_loop``), under the same queue, slots and deadline.
        """
        future = self.offer(frame, priority, timeout_s, on_start, work)
        del frame
        return await self.result(future)

    async def result(self, future: asyncio.Future[Frame]) -> Frame:
        """The result of a job :meth:`offer` admitted; cancelling the caller withdraws the job."""
        try:
            return await future
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise
        finally:
            # A failed future holds its exception, whose traceback holds this frame: without this,
            # that cycle keeps the request's frame alive until a full GC pass.
            del future

    def offer_live(self, frame: Frame, timeout_s: float) -> Frame | asyncio.Future[Frame]:
        """A LIVE job's answer when it is scored on the event loop at once (a tiny batch while a
        slot is free and nothing waits or is being gathered: no future, no await), else, as
        :meth:`offer`, the future of its result. Raises as :meth:`offer` and as the model does."""
        rows = frame.num_rows
        if (
            rows > self.servable.inline_max_rows
            or self.closed
            or self.queues[Priority.LIVE]
            or not self._can_start()
            or (self.coalesce_rows > 1 and rows <= _GATHER_MAX_ROWS and (self._coalescing or self._gather_timer is not None))
        ):
            return self.offer(frame, Priority.LIVE, timeout_s)
        if self.coalesce_rows > 1 and rows <= _GATHER_MAX_ROWS:
            self._count_turn_offer(asyncio.get_running_loop())  # as _inline: several in one turn start gathering
        self.stats.inline_calls += 1
        try:
            return self._predict(frame)
        except Exception as exc:
            error = self._caller_error(exc)
        try:
            raise error
        finally:
            del error, frame  # the traceback holds this frame: no cycle through its locals

    def offer(
        self,
        frame: Frame,
        priority: Priority,
        timeout_s: float,
        on_start: Callable[[], None] | None = None,
        work: Callable[..., Any] | None = None,
    ) -> asyncio.Future[Frame]:
        """Admit ``frame`` without waiting and return the future of its result.

        Refusal is immediate: :class:`Overloaded` when the live queue is full, :class:`ShadowDropped`
        when the shadow queue is. The future fails with :class:`DeadlineExceeded` once
        ``timeout_s`` has passed, queued or scoring; cancelling it withdraws the job.
        """
        if self.closed:
            raise Overloaded(f"servable {self.servable.fqrv} is unloading", retry_after=1.0)
        queue = self.queues[priority]
        # Queue when no slot is free, or when older work of this or a higher priority is waiting
        # (so a newcomer never overtakes it).
        must_queue = not self._can_start() or self.queues[Priority.LIVE] or (priority is Priority.SHADOW and queue)
        # With a batch wait, a job that could start waits for company while other work scores.
        wait = not must_queue and work is None and self._may_wait(frame.num_rows) and len(queue) < self._limit(priority)
        if must_queue and len(queue) >= self._limit(priority):
            if priority is Priority.LIVE:
                self.stats.live_rejected += 1
                raise Overloaded(
                    f"servable {self.servable.fqrv} is overloaded ({self.running} scoring, {len(queue)} queued)",
                    retry_after=1.0,
                )
            self.stats.shadow_dropped += 1
            raise ShadowDropped(f"shadow queue of {self.servable.fqrv} is full")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if not must_queue and work is None and priority is Priority.LIVE and frame.num_rows <= self.servable.inline_max_rows:
            if on_start is not None:  # scored on the loop, now or at the end of this turn: no queue
                on_start()
            return self._inline(frame, loop, deadline)
        job = _Job(frame, priority, deadline, loop.create_future(), timeout_s, on_start=on_start, queued_at=loop.time())
        if work is not None:
            job.work, job.alone = work, True
        if self.servable.runs_on_loop:
            job.context = contextvars.copy_context()
        job.timer = loop.call_at(deadline, self._expire, job)
        job.future.add_done_callback(lambda f: self._abandon(job) if f.cancelled() else None)
        if must_queue or wait:
            queue.append(job)
            self._dispatch()
        else:
            self._start([job])
        return job.future

    def _limit(self, priority: Priority) -> int:
        return self.live_limit if priority is Priority.LIVE else self.shadow_limit

    def _may_wait(self, rows: int) -> bool:
        """Whether a job of ``rows`` rows may wait for others to share its call: only with a batch
        wait, only while other work scores (alone, waiting buys nothing), only if rows fit beside it."""
        return bool(self.batch_wait_s) and self.running > 0 and rows < self.max_batch_rows

    def _inline(self, frame: Frame, loop: asyncio.AbstractEventLoop, deadline: float) -> asyncio.Future[Frame]:
        """Score a tiny live batch on the event loop: now, or with the others of this loop turn.

        Requests whose handlers run in the same turn of the loop (their bytes arrived together)
        are gathered and scored in one call when that turn ends: one model call for many tiny
        requests costs far less than one each (for H2O, a cold Java call per request). Gathering
        only pays under concurrent load, so it starts after a turn that saw several requests and
        stops after one that saw a single request; otherwise each is scored at once. With a batch
        wait, what was gathered is scored when that wait is over (or the rows fill a call), so the
        requests of several turns share one call (by the earliest deadline among them at the latest).
        """
        future = loop.create_future()
        if self.coalesce_rows > 1 and frame.num_rows <= _GATHER_MAX_ROWS:
            self._count_turn_offer(loop)
            if self._coalescing or self._gather_timer is not None:
                self._gathered.append((frame, future))
                self._gathered_rows += frame.num_rows
                if self.batch_wait_s:
                    due = min(deadline, loop.time() + self.batch_wait_s)
                    if self._gather_timer is None or due < self._gather_timer.when():
                        if self._gather_timer is not None:
                            self._gather_timer.cancel()
                        self._gather_timer = loop.call_at(due, self._flush_gathered)
                return future
        return self._run_inline(frame, future)

    def _count_turn_offer(self, loop: asyncio.AbstractEventLoop) -> None:
        """One more tiny live request in this turn of the loop (:meth:`_end_turn` reads the count)."""
        self._turn_offers += 1
        if not self._turn_armed:
            self._turn_armed = True
            loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        """After every handler of one loop turn ran: score what they gathered, choose the next mode."""
        self._turn_armed = False
        if self._turn_offers > 1:
            self._coalescing, self._quiet_turns = True, 0
        elif self._coalescing:
            # Under load, some turns see one request only: gathering goes on through a few of them
            # (for a lone request it costs one turn of the loop) rather than scoring each alone.
            self._quiet_turns += 1
            self._coalescing = self._quiet_turns < _QUIET_TURNS
        self._turn_offers = 0
        if self._gather_timer is None or self._gathered_rows >= self.coalesce_rows:
            self._flush_gathered()

    def _flush_gathered(self) -> None:
        """Score the gathered requests: together where their columns (and parameters) agree."""
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        gathered, self._gathered = self._gathered, []
        self._gathered_rows = 0
        groups: dict[object, list[tuple[Frame, asyncio.Future[Frame]]]] = {}
        reads_parameters = self.servable.reads_parameters
        for frame, future in gathered:
            if not future.done():  # a client that left cancelled it
                key = (_signature(frame), _parameters_key(frame) if reads_parameters else None)
                groups.setdefault(key, []).append((frame, future))
        for group in groups.values():
            start = 0
            while start < len(group):
                stop, rows = start, 0
                while stop < len(group) and (stop == start or rows + group[stop][0].num_rows <= self.coalesce_rows):
                    rows += group[stop][0].num_rows
                    stop += 1
                self._run_together(group[start:stop])
                start = stop
        self._wake_if_idle()

    def _run_together(self, jobs: list[tuple[Frame, asyncio.Future[Frame]]]) -> None:
        if len(jobs) == 1:
            self._run_inline(*jobs[0])
            return
        frames = [frame for frame, _ in jobs]
        try:
            out = self._predict(Frame.concat(frames))
        except Exception:
            # One bad request must not fail the others: each is scored (and fails) on its own.
            for frame, future in jobs:
                self._run_inline(frame, future)
            return
        self.stats.inline_calls += 1
        self.stats.coalesced_calls += 1
        self.stats.coalesced_jobs += len(jobs)
        offset = 0
        for frame, future in jobs:
            future.set_result(out.slice(offset, offset + frame.num_rows))
            offset += frame.num_rows

    def _run_inline(self, frame: Frame, future: asyncio.Future[Frame]) -> asyncio.Future[Frame]:
        """Score a tiny live batch right here on the event loop.

        For a model whose small batches take a few tens of microseconds, handing the call to a
        thread costs more than the call: the hop itself, and the GIL handed back and forth.
        """
        self.stats.inline_calls += 1
        try:
            future.set_result(self._predict(frame))
        except Exception as exc:
            future.set_exception(self._caller_error(exc))
        return future

    def _predict(self, frame: Frame) -> Frame:
        """The one call of a servable's ``predict`` on the scoring path (on the loop or a thread).

        An answer whose row count differs from the request's is the servable's failure, a
        :class:`PredictionFailed` naming it (logged by the service through its ``__cause__``),
        never rows handed to the wrong callers or a 200 with none.
        """
        return self._checked(frame, self.servable.predict(frame))

    async def _apredict(self, frame: Frame, timeout_s: float) -> Frame:
        """:meth:`_predict` of a servable that scores on the event loop."""
        return self._checked(frame, await self.servable.apredict(frame, timeout_s))

    def _checked(self, frame: Frame, out: Frame) -> Frame:
        if out.num_rows != frame.num_rows:
            reason = f"servable {self.servable.fqrv} returned {out.num_rows} row(s) for {frame.num_rows} input row(s)"
            raise PredictionFailed(self.servable.fqrv, reason) from ValueError(reason)
        return out

    def _caller_error(self, exc: BaseException) -> BaseException:
        """What the callers of a failed predict get: our own errors as they are, a model's own
        failure as a PredictionFailed whose ``__cause__`` (logged by the service) is that failure."""
        if isinstance(exc, GatewayError):
            return exc
        error = PredictionFailed(self.servable.fqrv)
        error.__cause__ = exc
        return error

    def _expire(self, job: _Job) -> None:
        job.timer = None  # the handle holds the job: drop the cycle
        if job.future.done():
            return
        self.stats.deadline_exceeded += 1
        job.future.set_exception(DeadlineExceeded(f"deadline of {job.timeout_s * 1000:.0f} ms exceeded for {self.servable.fqrv}"))
        self._abandon(job)

    def _abandon(self, job: _Job) -> None:
        """Forget a job nobody waits for any more: unqueue it, or free its slot if running."""
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        if job.on_abandon is not None:
            job.on_abandon()
            return
        try:
            self.queues[job.priority].remove(job)
        except ValueError:
            pass  # already started or already taken out
        self._wake_if_idle()

    def _dispatch(self) -> None:
        """Start queued jobs while slots are free: all live work before any shadow work."""
        while self._can_start():
            batch = self._take_batch()
            if not batch:
                return
            self._start(batch)

    def _take_batch(self) -> list[_Job]:
        """The next call to start: queued jobs of one priority (live first) that can share it.

        Empty when nothing waits, or when the head's batch is held for company (a batch wait):
        then shadow work does not start either, so live work never waits behind it.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        for priority in (Priority.LIVE, Priority.SHADOW):
            queue = self.queues[priority]
            while queue and (queue[0].future.done() or queue[0].deadline <= now):
                stale = queue.popleft()
                self._expire(stale)  # its timer is due: never start work nobody will read
            if not queue:
                continue
            first = queue.popleft()
            batch = [first]
            rows = first.frame.num_rows
            if self.max_batch_rows > 1 and not first.alone:
                shape = _signature(first.frame)
                reads_parameters = self.servable.reads_parameters
                # A combined call sees one set of parameters (configs), so only requests that
                # agree on them may share it (unless the servable does not read them).
                while (
                    queue
                    and not queue[0].alone
                    and not queue[0].future.done()
                    and _signature(queue[0].frame) == shape
                    and (not reads_parameters or _same_parameters(queue[0].frame, first.frame))
                    and rows + queue[0].frame.num_rows <= self.max_batch_rows
                ):
                    job = queue.popleft()
                    rows += job.frame.num_rows
                    batch.append(job)
                if rows < self.max_batch_rows and self._may_wait(rows) and now < first.queued_at + self.batch_wait_s:
                    queue.extendleft(reversed(batch))  # held: more may come before the wait is over
                    if self._hold_timer is None:
                        self._hold_timer = loop.call_at(first.queued_at + self.batch_wait_s, self._hold_over)
                    return []
            return batch
        return []

    def _hold_over(self) -> None:
        self._hold_timer = None
        self._dispatch()

    def _start(self, batch: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        for job in batch:
            if job.on_start is not None:
                job.on_start()
        frame = batch[0].frame if len(batch) == 1 else Frame.concat([j.frame for j in batch])
        on_loop = self.servable.runs_on_loop
        try:
            work = batch[0].work  # set only on a job that runs alone
            if on_loop:  # a coroutine on this loop: the call gets what is left of the latest deadline
                timeout_s = max(job.deadline for job in batch) - loop.time()
                call = self._apredict(frame, timeout_s) if work is None else work(frame, timeout_s)
                task: asyncio.Future[Frame] = loop.create_task(call, context=batch[0].context)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                task = loop.run_in_executor(self.executor, self._predict if work is None else work, frame)
        except RuntimeError:  # the executor was shut down (gateway stopping)
            self._finish(batch, error=Overloaded(f"servable {self.servable.fqrv} is unloading"))
            return
        self.running += 1
        if len(batch) > 1:
            self.stats.batches += 1
            self.stats.batched_jobs += len(batch)
        released = False
        abandoned = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.running -= 1
                self._dispatch()
                self._wake_if_idle()

        def on_done(fut: asyncio.Future[Frame]) -> None:
            nonlocal abandoned
            if abandoned:
                abandoned = False
                self.stats.abandoned_running -= 1
                self._dispatch()  # its thread is free again
            release()
            if fut.cancelled():  # the pool was shut down under it
                self._finish(batch, error=Overloaded(f"servable {self.servable.fqrv} was unloaded"))
                return
            exc = fut.exception()
            if exc is None:
                self._finish(batch, result=fut.result())
            else:
                self._finish(batch, error=self._caller_error(exc))

        def on_abandon() -> None:
            # Every caller of this batch gave up: free the slot now. The thread cannot be
            # interrupted; it finishes in the background and its result is dropped.
            nonlocal abandoned
            if not released and not task.done() and all(j.future.done() for j in batch):
                if on_loop:  # a coroutine can be stopped: cancelled, it holds nothing
                    task.cancel()
                    release()
                    return
                abandoned = True
                self.stats.abandoned_running += 1
                release()

        task.add_done_callback(on_done)
        for job in batch:
            job.on_abandon = on_abandon

    def _finish(self, batch: list[_Job], result: Frame | None = None, error: BaseException | None = None) -> None:
        """Hand each job of a batch its rows of ``result`` (or ``error``), skipping abandoned ones.

        A combined call that failed is not every job's failure: each job still waited for is
        queued again at the front, to be scored alone, once (within its own deadline). Failures
        that are no row's fault (overload, deadline, a backend that cannot be reached) are not retried.
        """
        if error is not None and len(batch) > 1 and not self.closed and not isinstance(error, _NOT_RETRIED):
            self._retry_alone(batch)
            return
        offset = 0
        for job in batch:
            rows = job.frame.num_rows
            # Unlink the timer and the batch's closure: both refer back to the job, and reference
            # cycles would keep every finished job (frames included) alive until a full GC pass.
            if job.timer is not None:
                job.timer.cancel()
                job.timer = None
            job.on_abandon = None
            if not job.future.done():
                if error is not None:
                    job.future.set_exception(error)
                else:
                    assert result is not None
                    job.future.set_result(result if len(batch) == 1 else result.slice(offset, offset + rows))
            offset += rows

    def _retry_alone(self, batch: list[_Job]) -> None:
        self.stats.batch_retries += 1
        waiting = [job for job in batch if not job.future.done()]
        for job in batch:
            job.on_abandon = None  # back in the queue: withdrawing it unqueues it
            job.on_start = None  # its queue wait was reported when the combined call started
            job.alone = True
        self.queues[batch[0].priority].extendleft(reversed(waiting))
        self._dispatch()
        self._wake_if_idle()

    async def close(self) -> None:
        """Refuse new work; queued jobs fail fast; calls already running finish in the background."""
        self.closed = True
        for timer in (self._gather_timer, self._hold_timer):
            if timer is not None:
                timer.cancel()
        self._gather_timer = self._hold_timer = None
        self._gathered_rows = 0
        gathered, self._gathered = self._gathered, []
        for _, future in gathered:
            if not future.done():
                future.set_exception(Overloaded(f"servable {self.servable.fqrv} was unloaded"))
        for queue in self.queues.values():
            while queue:
                self._finish([queue.popleft()], error=Overloaded(f"servable {self.servable.fqrv} was unloaded"))
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=False)


def _signature(frame: Frame) -> tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]:
    """What frames scored in one call must share: column names, dtypes and per-row shapes."""
    # The dtype itself (hashable; equal when .str is, stricter only for structured dtypes): .str
    # builds a new string per call, and this runs for every column of every gathered request.
    return tuple([(n, c.dtype, c.shape[1:]) for n, c in frame.columns.items()])


def _parameters_key(frame: Frame) -> object:
    """A hashable stand-in for a frame's parameters (identity when they are not hashable)."""
    try:
        return frozenset(frame.parameters.items())
    except TypeError:
        return id(frame)


def _same_parameters(a: Frame, b: Frame) -> bool:
    try:
        return bool(a.parameters == b.parameters)
    except Exception:  # e.g. arrays among the parameters: ambiguous truth value
        return False
