"""ServableScheduler with a servable that scores on the event loop (``runs_on_loop``, as RemoteV2):
its slots bound the coroutines in flight, a job every caller gave up on cancels its coroutine and
frees the slot at once, the deadline reaches ``apredict``, and queued work is batched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import DeadlineExceeded, PredictionFailed
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.scheduler import Priority, ServableScheduler

LIVE = Priority.LIVE


class Waiter(Servable):
    """Doubles ``x`` once its gate opens; records the calls, their deadlines and cancellations."""

    runs_on_loop = True
    inline_max_rows = -1
    batchable = True

    def __init__(self) -> None:
        super().__init__(FQRV(Contract("t", "loop", 1), "w"), Path("."), {})
        self.gate = asyncio.Event()
        self.calls: list[tuple[list[float], float]] = []
        self.in_flight = 0
        self.cancelled = 0
        self.short = False  # answer one row fewer than asked

    def load(self) -> None:
        raise AssertionError("a servable that runs on the loop is never loaded on a thread")

    def predict(self, frame: Frame) -> Frame:
        raise AssertionError("a servable that runs on the loop is never scored on a thread")

    def metadata(self) -> ServableMetadata:
        return ServableMetadata("w", "test", (), ())

    async def apredict(self, frame: Frame, timeout_s: float) -> Frame:
        self.calls.append((frame["x"].tolist(), timeout_s))
        self.in_flight += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        x = frame["x"][:-1] if self.short else frame["x"]
        return Frame({"y": x * 2})


def batch(*xs: float) -> Frame:
    return Frame({"x": np.array(xs, dtype=np.float64)})


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_slots_bound_calls_and_queued_jobs_go_together() -> None:
    servable = Waiter()
    scheduler = ServableScheduler(servable, None, slots=1, live_queue=8, shadow_queue=8, max_batch_rows=64)
    assert scheduler.executor is None  # no thread pool at all
    futures = [asyncio.ensure_future(scheduler.submit(batch(float(i)), LIVE, 30.0)) for i in range(3)]
    await settle()
    assert servable.in_flight == 1 and scheduler.running == 1 and scheduler.queued(LIVE) == 2
    assert 29.0 < servable.calls[0][1] <= 30.0  # the job's deadline reaches apredict
    servable.gate.set()
    results = await asyncio.gather(*futures)
    assert [r["y"].tolist() for r in results] == [[0.0], [2.0], [4.0]]
    assert [xs for xs, _ in servable.calls] == [[0.0], [1.0, 2.0]]  # the two queued in one call
    assert scheduler.running == 0 and scheduler.idle()


async def test_a_job_at_its_deadline_cancels_its_call_and_frees_the_slot_at_once() -> None:
    servable = Waiter()
    scheduler = ServableScheduler(servable, None, slots=1, live_queue=8, shadow_queue=8)
    late = asyncio.ensure_future(scheduler.submit(batch(1.0), LIVE, 0.05))
    waiting = asyncio.ensure_future(scheduler.submit(batch(2.0), LIVE, 30.0))
    with pytest.raises(DeadlineExceeded):
        await late
    await settle()
    assert servable.cancelled == 1  # the coroutine was stopped, not left running
    assert scheduler.stats.abandoned_running == 0 and scheduler.running == 1  # the next one runs
    assert servable.calls[-1][0] == [2.0]
    servable.gate.set()
    assert (await waiting)["y"].tolist() == [4.0]


async def test_a_caller_that_leaves_cancels_the_call() -> None:
    servable = Waiter()
    scheduler = ServableScheduler(servable, None, slots=2, live_queue=8, shadow_queue=8)
    caller = asyncio.ensure_future(scheduler.submit(batch(1.0), LIVE, 30.0))
    await settle()
    caller.cancel()
    await settle()
    assert servable.cancelled == 1 and scheduler.running == 0 and scheduler.idle()


async def test_an_answer_with_the_wrong_rows_is_the_servables_failure() -> None:
    servable = Waiter()
    servable.short = True
    servable.gate.set()
    scheduler = ServableScheduler(servable, None, slots=1, live_queue=8, shadow_queue=8)
    with pytest.raises(PredictionFailed, match="returned 1 row"):
        await scheduler.submit(batch(1.0, 2.0), LIVE, 30.0)
    # An empty batch is never scored inline (inline_max_rows -1): it goes to apredict too.
    servable.short = False
    assert (await scheduler.submit(batch(), LIVE, 30.0))["y"].tolist() == []
    assert servable.calls[-1][0] == []
