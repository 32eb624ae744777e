"""ServableScheduler on a real thread pool: priorities, admission, deadlines, batching.

The probe servable blocks on ``threading.Event`` gates passed in the frame parameters, so every
test controls which jobs are running and which are queued, and asserts on order and counts
rather than on timing.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import DeadlineExceeded, InvalidInput, Overloaded, PredictionFailed
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.scheduler import _QUIET_TURNS, Priority, ServableScheduler, ShadowDropped, _Job

LIVE, SHADOW = Priority.LIVE, Priority.SHADOW
LONG = 30.0  # a deadline no test reaches
BAD_X = -99.0  # a row the probe refuses


class Probe(Servable):
    """Doubles ``x``; records when each call starts and ends; waits on ``parameters["gate"]``."""

    def __init__(self) -> None:
        super().__init__(FQRV(Contract("t", "sched", 1), "probe"), Path("."), {})
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.finished: list[str] = []
        self.rows_per_call: list[int] = []
        self.concurrent = 0
        self.max_concurrent = 0

    def load(self) -> None:
        self.ready = True

    def metadata(self) -> ServableMetadata:
        return ServableMetadata("probe", "test", (), ())

    def predict(self, frame: Frame) -> Frame:
        params = frame.parameters
        tag = str(params.get("tag", frame["x"][0]))
        with self.lock:
            self.started.append(tag)
            self.rows_per_call.append(frame.num_rows)
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            gate = params.get("gate")
            if gate is not None:
                assert gate.wait(10), "test gate never opened"
            if "raise" in params:
                raise params["raise"]
            if (frame["x"] == BAD_X).any():
                raise ValueError("a bad row")
            return Frame({"y": frame["x"] * 2})
        finally:
            with self.lock:
                self.concurrent -= 1
                self.finished.append(tag)


def job(tag: str, gate: threading.Event | None = None, x: float = 1.0, rows: int = 1, **extra: Any) -> Frame:
    """A frame the probe recognises by ``tag``."""
    params: dict[str, Any] = {"tag": tag, **extra}
    if gate is not None:
        params["gate"] = gate
    return Frame({"x": np.full(rows, x)}, params)


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` on the loop until it holds; fail the test after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(8, thread_name_prefix="test-predict")
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def gates() -> Iterator[Callable[[], threading.Event]]:
    """Make gates; every gate is opened at the end so no thread stays blocked."""
    made: list[threading.Event] = []

    def make() -> threading.Event:
        made.append(threading.Event())
        return made[-1]

    yield make
    for gate in made:
        gate.set()


def make_scheduler(
    executor: ThreadPoolExecutor,
    slots: int = 1,
    live_queue: int = 16,
    shadow_queue: int = 16,
    max_batch_rows: int = 0,
    batch_wait_us: int = 0,
) -> tuple[ServableScheduler, Probe]:
    probe = Probe()
    scheduler = ServableScheduler(probe, executor, slots, live_queue, shadow_queue, max_batch_rows, batch_wait_us=batch_wait_us)
    return scheduler, probe


def spawn(scheduler: ServableScheduler, frame: Frame, priority: Priority, timeout: float = LONG) -> asyncio.Task[Frame]:
    return asyncio.create_task(scheduler.submit(frame, priority, timeout))


async def test_every_queued_live_job_starts_before_any_shadow_job(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    blocker = spawn(scheduler, job("blocker", gate), LIVE)
    await wait_until(lambda: probe.started == ["blocker"])
    tasks = []
    for i in range(4):  # interleaved arrivals: shadow first each time
        tasks.append(spawn(scheduler, job(f"s{i}"), SHADOW))
        tasks.append(spawn(scheduler, job(f"l{i}"), LIVE))
    await wait_until(lambda: scheduler.queued(LIVE) == 4 and scheduler.queued(SHADOW) == 4)
    gate.set()
    await asyncio.gather(blocker, *tasks)
    assert probe.started == ["blocker", "l0", "l1", "l2", "l3", "s0", "s1", "s2", "s3"]
    assert probe.max_concurrent == 1


async def test_running_shadow_is_not_preempted_and_live_goes_next(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    shadow = spawn(scheduler, job("shadow", gate), SHADOW)
    await wait_until(lambda: probe.started == ["shadow"])
    later_shadow = spawn(scheduler, job("later-shadow"), SHADOW)
    live = spawn(scheduler, job("live"), LIVE)
    await wait_until(lambda: scheduler.queued(LIVE) == 1 and scheduler.queued(SHADOW) == 1)
    assert probe.started == ["shadow"]  # the live job waits for the running shadow job
    gate.set()
    await asyncio.gather(shadow, later_shadow, live)
    assert probe.started == ["shadow", "live", "later-shadow"]


async def test_slots_bound_concurrent_predict_calls(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=2)
    gate = gates()
    tasks = [spawn(scheduler, job(f"j{i}", gate), LIVE) for i in range(6)]
    await wait_until(lambda: len(probe.started) == 2 and scheduler.queued(LIVE) == 4)
    assert scheduler.running == 2
    gate.set()
    results = await asyncio.gather(*tasks)
    assert [float(r["y"][0]) for r in results] == [2.0] * 6
    assert probe.max_concurrent == 2
    assert scheduler.running == 0


async def test_full_live_queue_rejects_exactly_the_excess_at_once(executor, gates) -> None:
    slots, queue, excess = 2, 3, 4
    scheduler, probe = make_scheduler(executor, slots=slots, live_queue=queue)
    gate = gates()
    tasks = [spawn(scheduler, job(f"j{i}", gate), LIVE) for i in range(slots + queue + excess)]
    # The gate stays closed: refused jobs must finish without any slot becoming free.
    await wait_until(lambda: sum(t.done() for t in tasks) == excess)
    refused = [t for t in tasks if t.done()]
    assert all(isinstance(t.exception(), Overloaded) for t in refused)
    assert all(t.exception().retry_after > 0 for t in refused)
    assert scheduler.stats.live_rejected == excess
    assert scheduler.running == slots and scheduler.queued(LIVE) == queue
    gate.set()
    accepted = [t for t in tasks if t not in refused]
    assert len(await asyncio.gather(*accepted)) == slots + queue
    assert scheduler.stats.live_rejected == excess


async def test_full_shadow_queue_drops_copies_and_counts_them(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, live_queue=4, shadow_queue=2)
    gate = gates()
    blocker = spawn(scheduler, job("blocker", gate), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    shadows = [spawn(scheduler, job(f"s{i}"), SHADOW) for i in range(7)]
    await wait_until(lambda: sum(t.done() for t in shadows) == 5)
    assert all(isinstance(t.exception(), ShadowDropped) for t in shadows if t.done())
    assert scheduler.stats.shadow_dropped == 5
    # A full shadow queue does not refuse live work.
    live = spawn(scheduler, job("live"), LIVE)
    await wait_until(lambda: scheduler.queued(LIVE) == 1)
    gate.set()
    await asyncio.gather(blocker, live, *[t for t in shadows if not t.done()])
    assert probe.started == ["blocker", "live", "s0", "s1"]
    assert scheduler.stats.shadow_dropped == 5 and scheduler.stats.live_rejected == 0


async def test_deadline_while_scoring_frees_the_slot_for_the_next_job(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    with pytest.raises(DeadlineExceeded):
        await scheduler.submit(job("slow", gate), LIVE, 0.2)
    assert scheduler.running == 0
    assert scheduler.stats.deadline_exceeded == 1
    assert scheduler.stats.abandoned_running == 1
    # The slot is reused while the abandoned call is still blocked in its thread.
    out = await asyncio.wait_for(scheduler.submit(job("next", x=5.0), LIVE, LONG), 5.0)
    assert float(out["y"][0]) == 10.0
    assert probe.finished == ["next"]
    gate.set()
    await wait_until(lambda: scheduler.stats.abandoned_running == 0)
    assert scheduler.running == 0


async def test_deadline_while_queued_never_runs_the_job(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    blocker = spawn(scheduler, job("blocker", gate), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    with pytest.raises(DeadlineExceeded):
        await scheduler.submit(job("queued"), LIVE, 0.2)
    assert scheduler.queued(LIVE) == 0
    gate.set()
    await blocker
    after = await scheduler.submit(job("after"), LIVE, LONG)
    assert float(after["y"][0]) == 2.0
    assert probe.started == ["blocker", "after"]
    assert scheduler.stats.deadline_exceeded == 1


async def test_cancelled_caller_leaves_the_queue(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    blocker = spawn(scheduler, job("blocker", gate), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    doomed = spawn(scheduler, job("doomed"), LIVE)
    await wait_until(lambda: scheduler.queued(LIVE) == 1)
    doomed.cancel()
    await wait_until(lambda: scheduler.queued(LIVE) == 0)
    gate.set()
    await blocker
    await scheduler.submit(job("after"), LIVE, LONG)
    assert probe.started == ["blocker", "after"]


async def test_model_errors_reach_the_caller_and_free_the_slot(executor) -> None:
    scheduler, _ = make_scheduler(executor, slots=1)
    with pytest.raises(PredictionFailed) as info:
        await scheduler.submit(job("boom", **{"raise": RuntimeError("model bug")}), LIVE, LONG)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(InvalidInput):  # gateway errors from a model pass through unchanged
        await scheduler.submit(job("bad", **{"raise": InvalidInput("bad input")}), LIVE, LONG)
    assert scheduler.running == 0
    assert float((await scheduler.submit(job("ok"), LIVE, LONG))["y"][0]) == 2.0


async def test_queued_live_jobs_are_micro_batched_and_answered_separately(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, max_batch_rows=10)
    first, second = gates(), gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    shared = {"gate": second}  # equal parameters: these may share one call
    frames = [Frame({"x": np.array([10.0 * i, 10.0 * i + 1])}, dict(shared)) for i in range(1, 5)]
    # The second caller has a short deadline: it gives up while the combined call runs, and the
    # callers after it must still get their own rows back.
    tasks = [spawn(scheduler, f, LIVE, 1.0 if i == 1 else LONG) for i, f in enumerate(frames)]
    await wait_until(lambda: scheduler.queued(LIVE) == 4)
    first.set()
    await wait_until(lambda: len(probe.started) == 2)
    assert probe.rows_per_call == [1, 8]
    await wait_until(tasks[1].done)
    assert isinstance(tasks[1].exception(), DeadlineExceeded)
    assert scheduler.running == 1  # the others still wait for the call: the slot stays taken
    second.set()
    await blocker
    for i, task in enumerate(tasks):
        if i != 1:
            out = await task
            assert out["y"].tolist() == [20.0 * (i + 1), 20.0 * (i + 1) + 2]
    assert scheduler.stats.batches == 1 and scheduler.stats.batched_jobs == 4


async def test_jobs_with_different_parameters_are_not_batched(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, max_batch_rows=10)
    gate = gates()
    blocker = spawn(scheduler, job("blocker", gate), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    tasks = [spawn(scheduler, job(f"j{i}", x=float(i)), LIVE) for i in range(3)]
    await wait_until(lambda: scheduler.queued(LIVE) == 3)
    gate.set()
    results = await asyncio.gather(blocker, *tasks)
    assert probe.rows_per_call == [1, 1, 1, 1]
    assert [float(r["y"][0]) for r in results[1:]] == [0.0, 2.0, 4.0]


async def test_close_fails_queued_work_and_refuses_new_work(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1)
    gate = gates()
    running = spawn(scheduler, job("running", gate), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    queued = spawn(scheduler, job("queued"), SHADOW)
    await wait_until(lambda: scheduler.queued(SHADOW) == 1)
    await scheduler.close()
    with pytest.raises(Overloaded):
        await queued
    with pytest.raises(Overloaded):
        await scheduler.submit(job("late"), LIVE, LONG)
    gate.set()
    assert float((await running)["y"][0]) == 2.0  # work already running completes
    assert probe.started == ["running"]


async def test_own_pools_keep_a_saturated_shadow_servable_off_the_live_servables_threads(gates) -> None:
    shadow_probe, live_probe = Probe(), Probe()
    shadow_side = ServableScheduler(shadow_probe, None, slots=2, live_queue=4, shadow_queue=4)
    live_side = ServableScheduler(live_probe, None, slots=2, live_queue=4, shadow_queue=4)
    gate = gates()
    try:
        stuck = [spawn(shadow_side, job(f"s{i}", gate), SHADOW) for i in range(2 + 4)]
        await wait_until(lambda: shadow_side.running == 2 and shadow_side.queued(SHADOW) == 4)
        # Every thread the shadow servable may use is blocked; live work elsewhere is not.
        out = await asyncio.wait_for(live_side.submit(job("live", x=4.0), LIVE, LONG), 5.0)
        assert float(out["y"][0]) == 8.0
        gate.set()
        await asyncio.gather(*stuck)
    finally:
        gate.set()
        await shadow_side.close()
        await live_side.close()


async def test_own_pool_reuses_slots_of_abandoned_calls_until_its_spare_threads_run_out(gates) -> None:
    probe = Probe()
    scheduler = ServableScheduler(probe, None, slots=1, live_queue=4, shadow_queue=4, max_threads=2)
    first, second = gates(), gates()
    try:
        with pytest.raises(DeadlineExceeded):
            await scheduler.submit(job("stuck1", first), LIVE, 0.2)
        # One spare thread: the freed slot is reused at once.
        with pytest.raises(DeadlineExceeded):
            await scheduler.submit(job("stuck2", second), LIVE, 0.2)
        assert scheduler.stats.abandoned_running == 2 and scheduler.running == 0
        # Both threads are still blocked: new work waits in the queue, not on a thread that is busy.
        waiting = spawn(scheduler, job("next", x=3.0), LIVE)
        await wait_until(lambda: scheduler.queued(LIVE) == 1)
        assert probe.started == ["stuck1", "stuck2"]
        first.set()  # a thread comes back: the queued job starts on it
        assert float((await asyncio.wait_for(waiting, 5.0))["y"][0]) == 6.0
        assert probe.started == ["stuck1", "stuck2", "next"]
        assert scheduler.stats.abandoned_running == 1
    finally:
        first.set()
        second.set()
        # Its abandoned calls end on their own threads: wait, or they finish during the next test
        # (whose garbage check then finds this test's frames).
        await wait_until(lambda: scheduler.stats.abandoned_running == 0)
        await scheduler.close()
        # The abandoned calls end in their threads after close: wait, or their frames become
        # garbage during the next test (test_finished_jobs_leave_no_reference_cycles counts them).
        await wait_until(lambda: scheduler.stats.abandoned_running == 0)


async def test_finished_jobs_leave_no_reference_cycles(executor, gates) -> None:
    # A job caught in a cycle (with its frames) lives until a full GC pass: under load that means
    # memory growth and long gen-2 pauses on the event loop.
    scheduler, _ = make_scheduler(executor, slots=1, max_batch_rows=10)
    first, second = gates(), gates()
    gc.collect()
    gc.disable()
    try:
        await scheduler.submit(job("plain"), LIVE, LONG)
        blocker = spawn(scheduler, job("blocker", first), LIVE)
        await wait_until(lambda: scheduler.running == 1)
        batched = [spawn(scheduler, Frame({"x": np.ones(2)}), LIVE) for _ in range(3)]
        with pytest.raises(DeadlineExceeded):  # expires in the queue
            await scheduler.submit(job("expires-queued"), SHADOW, 0.05)
        first.set()
        await asyncio.gather(blocker, *batched)
        with pytest.raises(DeadlineExceeded):  # expires while running
            await scheduler.submit(job("expires-running", second), LIVE, 0.05)
        second.set()
        await wait_until(lambda: scheduler.stats.abandoned_running == 0)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leaked = [o for o in gc.garbage if isinstance(o, (_Job, Frame))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert leaked == []


class InlineProbe(Probe):
    """A probe that allows one-row live batches on the event loop, and records the scoring thread."""

    inline_max_rows = 1

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def predict(self, frame: Frame) -> Frame:
        self.threads.append(threading.get_ident())
        return super().predict(frame)


async def test_tiny_live_batches_run_on_the_loop_and_the_rest_in_threads() -> None:
    probe = InlineProbe()
    pool = ThreadPoolExecutor(2)
    scheduler = ServableScheduler(probe, pool, slots=1, live_queue=8, shadow_queue=8)
    loop_thread = threading.get_ident()
    out = await scheduler.submit(job("one", x=3.0), LIVE, LONG)
    assert out["y"].tolist() == [6.0]
    await scheduler.submit(job("two", rows=2), LIVE, LONG)
    await scheduler.submit(job("shadow"), SHADOW, LONG)
    assert [t == loop_thread for t in probe.threads] == [True, False, False]
    assert scheduler.stats.inline_calls == 1
    with pytest.raises(PredictionFailed) as info:
        await scheduler.submit(job("boom", **{"raise": RuntimeError("model bug")}), LIVE, LONG)
    assert isinstance(info.value.__cause__, RuntimeError)
    pool.shutdown()


async def test_inline_never_overtakes_queued_live_work() -> None:
    probe = InlineProbe()
    pool = ThreadPoolExecutor(2)
    scheduler = ServableScheduler(probe, pool, slots=1, live_queue=8, shadow_queue=8)
    gate = threading.Event()
    first = asyncio.ensure_future(scheduler.submit(job("held", gate, rows=2), LIVE, LONG))
    await wait_until(lambda: probe.started == ["held"])
    second = asyncio.ensure_future(scheduler.submit(job("queued", rows=2), LIVE, LONG))
    await asyncio.sleep(0)
    third = asyncio.ensure_future(scheduler.submit(job("tiny"), LIVE, LONG))  # one row, but the slot is busy
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, second, third)
    assert probe.started == ["held", "queued", "tiny"]
    assert scheduler.stats.inline_calls == 0
    pool.shutdown()


class CoalescingProbe(InlineProbe):
    """Scores up to four rows on the loop and ignores request parameters, so same-turn requests may share a call."""

    inline_max_rows = 4
    reads_parameters = False


def coalescing_scheduler(probe: Probe, coalesce_rows: int = 64) -> ServableScheduler:
    return ServableScheduler(probe, ThreadPoolExecutor(1), slots=1, live_queue=8, shadow_queue=8, coalesce_rows=coalesce_rows)


async def test_requests_of_one_loop_turn_share_one_call_once_load_is_seen() -> None:
    probe = CoalescingProbe()
    scheduler = coalescing_scheduler(probe)

    def burst(xs: list[float]) -> Any:
        return asyncio.gather(*(scheduler.submit(job(f"x{x}", x=x), LIVE, LONG) for x in xs))

    first = await burst([1.0, 2.0, 3.0])  # no load seen yet: each scored at once
    assert probe.rows_per_call == [1, 1, 1]
    second = await burst([4.0, 5.0, 6.0, 7.0])  # the previous turn had three: gathered into one call
    assert probe.rows_per_call == [1, 1, 1, 4]
    assert [o["y"].tolist() for o in first + second] == [[2.0], [4.0], [6.0], [8.0], [10.0], [12.0], [14.0]]
    assert scheduler.stats.coalesced_jobs == 4
    for i in range(_QUIET_TURNS):  # gathered, but alone in its turn: gathering goes on a few turns
        future = scheduler.offer(job(f"alone{i}", x=8.0), LIVE, LONG)
        assert not future.done()
        alone = await future
        assert alone["y"].tolist() == [16.0] and probe.rows_per_call[-1] == 1
    future = scheduler.offer(job("direct", x=9.0), LIVE, LONG)  # quiet turns before: scored at once again
    assert future.done() and future.result()["y"].tolist() == [18.0]


async def test_a_failing_request_does_not_fail_the_others_of_its_turn() -> None:
    probe = CoalescingProbe()
    scheduler = coalescing_scheduler(probe)
    await asyncio.gather(*(scheduler.submit(job(f"w{i}"), LIVE, LONG) for i in range(2)))
    bad = job("bad", **{"raise": RuntimeError("model bug")})  # first of the group: the combined call fails
    results = await asyncio.gather(
        scheduler.submit(bad, LIVE, LONG),
        scheduler.submit(job("ok1", x=2.0), LIVE, LONG),
        scheduler.submit(job("ok2", x=3.0), LIVE, LONG),
        return_exceptions=True,
    )
    assert isinstance(results[0], PredictionFailed) and isinstance(results[0].__cause__, RuntimeError)
    assert [r["y"].tolist() for r in results[1:]] == [[4.0], [6.0]]
    assert probe.rows_per_call[2:] == [3, 1, 1, 1]  # the failed combined call, then one call each


async def test_combined_calls_keep_to_the_row_limit_and_skip_withdrawn_requests() -> None:
    probe = CoalescingProbe()
    scheduler = coalescing_scheduler(probe, coalesce_rows=4)
    await asyncio.gather(*(scheduler.submit(job(f"w{i}"), LIVE, LONG) for i in range(2)))
    probe.rows_per_call.clear()
    outs = await asyncio.gather(*(scheduler.submit(job(f"p{i}", x=float(i), rows=2), LIVE, LONG) for i in range(3)))
    assert probe.rows_per_call == [4, 2]
    assert [o["y"].tolist() for o in outs] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]

    probe.rows_per_call.clear()
    tasks = [asyncio.ensure_future(scheduler.submit(job(f"c{i}", x=float(i)), LIVE, LONG)) for i in range(3)]

    async def leave() -> None:  # runs in the same turn, after the three offered: the client of the 2nd leaves
        tasks[1].cancel()

    await asyncio.gather(*tasks, asyncio.ensure_future(leave()), return_exceptions=True)
    assert tasks[1].cancelled()
    assert probe.rows_per_call == [2] and [tasks[0].result()["y"].tolist(), tasks[2].result()["y"].tolist()] == [[0.0], [4.0]]


async def test_servables_that_read_parameters_share_calls_only_with_equal_parameters() -> None:
    probe = InlineProbe()  # reads parameters
    probe.inline_max_rows = 4
    scheduler = coalescing_scheduler(probe)
    await asyncio.gather(*(scheduler.submit(job("w"), LIVE, LONG) for _ in range(2)))
    probe.rows_per_call.clear()
    await asyncio.gather(*(scheduler.submit(job(tag), LIVE, LONG) for tag in ("a", "b", "a", "a")))
    assert sorted(probe.rows_per_call) == [1, 3]


async def test_live_room_counts_exactly_the_offers_admitted_before_a_refusal(executor, gates) -> None:
    scheduler, _ = make_scheduler(executor, slots=2, live_queue=3)
    gate = gates()
    assert scheduler.live_room() == 5  # 2 free slots + 3 queue places
    tasks = []
    while scheduler.live_room():
        room = scheduler.live_room()
        tasks.append(spawn(scheduler, job(f"j{len(tasks)}", gate), LIVE))
        await asyncio.sleep(0)  # the offer is made
        assert scheduler.live_room() == room - 1
    assert len(tasks) == 5 and scheduler.stats.live_rejected == 0
    with pytest.raises(Overloaded):
        await scheduler.submit(job("one too many"), LIVE, LONG)
    gate.set()
    await asyncio.gather(*tasks)
    assert scheduler.live_room() == 5
    await scheduler.close()


# -- micro-batching on scoring threads: batch waits, shadow batches, failed combined calls --------


def shared(gate: threading.Event, x: float, **extra: Any) -> Frame:
    """A one-row frame whose parameters equal every other ``shared`` frame's with the same gate."""
    return Frame({"x": np.array([x])}, {"gate": gate, **extra})


async def test_a_lone_job_starts_at_once_even_with_a_batch_wait(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=2, max_batch_rows=10, batch_wait_us=1_000_000)
    gate = gates()
    task = spawn(scheduler, shared(gate, 1.0), LIVE)
    await asyncio.sleep(0)  # offer ran: nothing else scores, so it did not wait for company
    assert scheduler.running == 1 and scheduler.queued(LIVE) == 0
    gate.set()
    assert (await task)["y"].tolist() == [2.0]


async def test_a_batch_wait_holds_jobs_while_others_score_and_live_never_waits_behind_shadow(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=2, max_batch_rows=10, batch_wait_us=1_000_000)
    first, second = gates(), gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    held = spawn(scheduler, shared(second, 1.0), LIVE)  # a slot is free, but it waits for company
    await wait_until(lambda: scheduler.queued(LIVE) == 1)
    shadow = spawn(scheduler, shared(second, 5.0), SHADOW)  # may not take the free slot before it
    company = spawn(scheduler, shared(second, 2.0), LIVE)
    await wait_until(lambda: scheduler.queued(LIVE) == 2 and scheduler.queued(SHADOW) == 1)
    assert scheduler.running == 1 and probe.started == ["blocker"]
    first.set()  # nothing else scores now: the held live batch starts, then the shadow copy
    await blocker
    await wait_until(lambda: len(probe.rows_per_call) == 3)
    assert probe.rows_per_call == [1, 2, 1]
    second.set()
    assert [(await t)["y"].tolist() for t in (held, company, shadow)] == [[2.0], [4.0], [10.0]]
    assert scheduler.stats.batches == 1 and scheduler.stats.batched_jobs == 2


async def test_a_held_batch_starts_when_its_wait_is_over(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=2, max_batch_rows=10, batch_wait_us=20_000)
    first = gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    held = spawn(scheduler, job("held", x=3.0), LIVE)
    await wait_until(lambda: scheduler.queued(LIVE) == 1)
    assert (await held)["y"].tolist() == [6.0]  # started by its wait's end, the blocker still running
    assert not blocker.done()
    first.set()
    await blocker


async def test_a_deadline_holds_inside_a_batch_wait(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=2, max_batch_rows=10, batch_wait_us=1_000_000)
    first = gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    with pytest.raises(DeadlineExceeded):
        await scheduler.submit(job("late"), LIVE, 0.05)
    assert scheduler.queued(LIVE) == 0 and probe.started == ["blocker"]  # never started
    first.set()
    await blocker


async def test_queued_shadow_copies_are_batched_among_themselves(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, max_batch_rows=10)
    first, second = gates(), gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    copies = [spawn(scheduler, shared(second, float(i)), SHADOW) for i in range(3)]
    live = spawn(scheduler, shared(second, 9.0), LIVE)
    await wait_until(lambda: scheduler.queued(SHADOW) == 3 and scheduler.queued(LIVE) == 1)
    first.set()
    second.set()
    await asyncio.gather(blocker, live, *copies)
    assert probe.rows_per_call == [1, 1, 3]  # the live job alone first, then the copies in one call
    assert [(await c)["y"].tolist() for c in copies] == [[0.0], [2.0], [4.0]]


async def test_a_failed_combined_call_scores_each_job_alone_once(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, max_batch_rows=10)
    first = gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    xs = [1.0, BAD_X, 3.0, 4.0]
    tasks = [spawn(scheduler, Frame({"x": np.array([x])}), LIVE) for x in xs]  # equal (empty) parameters
    await wait_until(lambda: scheduler.queued(LIVE) == 4)
    first.set()
    results = await asyncio.gather(blocker, *tasks, return_exceptions=True)
    assert [r["y"].tolist() for r in (results[1], results[3], results[4])] == [[2.0], [6.0], [8.0]]
    assert isinstance(results[2], PredictionFailed) and isinstance(results[2].__cause__, ValueError)
    # The blocker, the combined call that failed, then each job alone, in its order.
    assert probe.rows_per_call == [1, 4, 1, 1, 1, 1]
    assert scheduler.stats.batches == 1 and scheduler.stats.batch_retries == 1
    assert scheduler.idle()


async def test_a_job_retried_alone_keeps_its_deadline(executor, gates) -> None:
    scheduler, probe = make_scheduler(executor, slots=1, max_batch_rows=10)
    first, second = gates(), gates()
    blocker = spawn(scheduler, job("blocker", first), LIVE)
    await wait_until(lambda: scheduler.running == 1)
    params = {"gate": second}
    bad = spawn(scheduler, Frame({"x": np.array([BAD_X])}, dict(params)), LIVE)
    short = spawn(scheduler, Frame({"x": np.array([2.0])}, dict(params)), LIVE, 0.3)
    await wait_until(lambda: scheduler.queued(LIVE) == 2)
    first.set()
    await wait_until(lambda: probe.rows_per_call == [1, 2])
    # The combined call is held at its gate past the short deadline: that caller gets a 504, and the
    # retry scores only the bad request (alone) once the gate opens.
    with pytest.raises(DeadlineExceeded):
        await short
    second.set()
    with pytest.raises(PredictionFailed):
        await bad
    await blocker
    assert probe.rows_per_call == [1, 2, 1]


async def test_with_a_batch_wait_requests_of_several_loop_turns_share_one_call_by_the_earliest_deadline() -> None:
    probe = CoalescingProbe()
    scheduler = ServableScheduler(
        probe, ThreadPoolExecutor(1), slots=1, live_queue=8, shadow_queue=8, coalesce_rows=64, batch_wait_us=1_000_000
    )
    await asyncio.gather(*(scheduler.submit(job(f"w{i}"), LIVE, LONG) for i in range(2)))  # load seen
    probe.rows_per_call.clear()
    first = scheduler.offer(job("a", x=1.0), LIVE, LONG)
    for _ in range(3):
        await asyncio.sleep(0)  # later turns of the loop
    second = scheduler.offer(job("b", x=2.0), LIVE, LONG)
    await asyncio.sleep(0)
    assert not first.done() and not second.done() and probe.rows_per_call == []
    # The third caller's deadline comes long before the 1 s wait is over: all three are scored by then.
    third = scheduler.offer(job("c", x=3.0), LIVE, 0.05)
    outs = await asyncio.wait_for(asyncio.gather(first, second, third), 0.5)
    assert [o["y"].tolist() for o in outs] == [[2.0], [4.0], [6.0]]
    assert probe.rows_per_call == [3] and scheduler.stats.coalesced_calls == 1
