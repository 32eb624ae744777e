"""Shadow traffic, overload and deadlines over HTTP, against a real in-process gateway.

Slow work is made with the ``gated`` test servable: it blocks until a gate file exists, so the
tests hold slots busy, inspect queues through ``GET /metrics/json``, and assert on order and
exact counts rather than on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from forestflow.runtime.scheduler import Priority
from tests.support import FIXTURES, InProcessGateway, python_servable, score_body, serve_in_process, wait_for

GATED = FIXTURES / "servables" / "gated"
CONTRACT = ("acme", "demo", 1)
SCORE = "/acme/demo/1/score"


# ---- helpers -------------------------------------------------------------------------------------
@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[InProcessGateway]:
    """An in-process gateway with quiet logs and the given settings."""
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", **overrides) as gw:
        yield gw


async def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll until ``condition`` holds (see tests.support.wait_for)."""
    await wait_for(condition, timeout, what)


async def deploy(gw: InProcessGateway, **kwargs: Any) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(CONTRACT, **kwargs)) as resp:
        assert resp.status == 200, await resp.text()


async def score(
    gw: InProcessGateway, configs: dict[str, str] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with gw.session.post(gw.url + SCORE, json=score_body([1.5], configs=configs), headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


def answered_by(body: dict[str, Any]) -> str:
    return str(body["Prediction"]["fqrv"]["releaseVersion"])


async def scheduler(gw: InProcessGateway, release: str) -> dict[str, int]:
    async with gw.session.get(gw.url + "/metrics/json") as resp:
        return (await resp.json())["schedulers"].get(f"acme.demo.1.{release}", {})


async def counts(gw: InProcessGateway) -> dict[str, tuple[int, int]]:
    """``release -> (scoreCount, shadeCount)`` from ``GET /{contract}/stats``."""
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as resp:
        assert resp.status == 200
        metrics = [item["ServableMetrics"] for item in await resp.json()]
    return {m["fqrv"]["releaseVersion"]: (int(m["scoreCount"]), int(m["shadeCount"])) for m in metrics}


async def error_counts(gw: InProcessGateway) -> dict[str, tuple[int, int]]:
    """``release -> (errorCount, shadeErrorCount)`` from ``GET /{contract}/stats``."""
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as resp:
        assert resp.status == 200
        metrics = [item["ServableMetrics"] for item in await resp.json()]
    return {m["fqrv"]["releaseVersion"]: (int(m.get("errorCount", 0)), int(m.get("shadeErrorCount", 0))) for m in metrics}


def events(tmp_path: Path) -> list[dict[str, Any]]:
    """Every prediction event written to the local log so far."""
    path = tmp_path / "data" / "predictions.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line)["event"] for line in path.read_bytes().splitlines() if line.strip()]


def of(evts: list[dict[str, Any]], release: str, served: bool) -> list[dict[str, Any]]:
    """The events of one release, served (answers) or not (shadow copies)."""
    return [e for e in evts if e["fqrv"]["releaseVersion"] == release and bool(e.get("servedRequest", False)) is served]


class Gate:
    """A file the gated servable waits for; opened at the end of every test that makes one."""

    def __init__(self, tmp_path: Path, name: str = "gate") -> None:
        self.path = tmp_path / name
        self.record = tmp_path / f"{name}.record"

    def open(self) -> None:
        self.path.touch()

    def configs(self, tag: str, **extra: str) -> dict[str, str]:
        return {"gate": str(self.path), "record": str(self.record), "tag": tag, "reqid": tag, **extra}

    def started(self) -> list[str]:
        """Tags in the order the gated servable started scoring them."""
        return self.record.read_text().split() if self.record.exists() else []


@pytest.fixture
def gate(tmp_path: Path) -> Any:
    made = Gate(tmp_path)
    yield made
    made.open()  # never leave a scoring thread blocked


# ---- shadow fan-out ------------------------------------------------------------------------------
async def test_shadow_copies_go_to_every_logging_servable_but_the_answering_one(tmp_path: Path) -> None:
    async with gateway(tmp_path, log_sample_every=5) as gw:
        await deploy(gw, release="live", log_level="FULL")
        await deploy(gw, release="full", log_level="FULL", validity=[{"NeverValid": {}}])
        await deploy(gw, release="sample", log_level="SAMPLE", validity=[{"NeverValid": {}}])
        await deploy(gw, release="silent", log_level="NONE", validity=[{"NeverValid": {}}])
        for i in range(10):
            status, body, _ = await score(gw, {"reqid": f"q{i}"})
            assert status == 200 and answered_by(body) == "live"
        assert await counts(gw) == {"live": (10, 0), "full": (0, 10), "sample": (0, 2), "silent": (0, 0)}
        await wait_until(lambda: len(events(tmp_path)) == 10 + 10 + 2, what="22 prediction events")
    evts = events(tmp_path)
    assert len(of(evts, "live", True)) == 10 and not of(evts, "live", False)
    assert sorted(e["inferenceRequest"]["configs"]["reqid"] for e in of(evts, "full", False)) == sorted(
        f"q{i}" for i in range(10)
    )
    # SAMPLE shadows the requests whose contract counter is a multiple of log_sample_every.
    assert sorted(e["inferenceRequest"]["configs"]["reqid"] for e in of(evts, "sample", False)) == ["q4", "q9"]
    assert not [e for e in evts if e["fqrv"]["releaseVersion"] in ("silent",)]
    assert all(not of(evts, r, True) for r in ("full", "sample"))
    shadow = of(evts, "full", False)[0]
    assert shadow["prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [3.0]


async def test_request_without_active_servable_gets_422_and_still_shadows(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        await deploy(gw, release="candidate", log_level="FULL", validity=[{"NeverValid": {}}])
        status, body, _ = await score(gw, {"reqid": "orphan"})
        assert status == 422 and "NoActiveServablesForContract" in body
        assert await counts(gw) == {"candidate": (0, 1)}
        await wait_until(lambda: len(events(tmp_path)) == 1, what="one shadow event")
    (event,) = events(tmp_path)
    assert event["fqrv"]["releaseVersion"] == "candidate" and event.get("servedRequest", False) is False
    assert event["inferenceRequest"]["configs"]["reqid"] == "orphan" and event["status"] == 200


async def test_shadow_drops_are_counted_exactly_and_never_delay_the_answer(tmp_path: Path, gate: Gate) -> None:
    sent, slots, shadow_queue = 9, 1, 2
    async with gateway(tmp_path, scoring_slots=slots, shadow_queue=shadow_queue) as gw:
        await deploy(gw, release="live")
        await deploy(gw, release="shadow", log_level="FULL", validity=[{"NeverValid": {}}], directory=GATED)
        for i in range(sent):
            # The shadow servable is blocked on the closed gate; answers come from the live one.
            status, body, _ = await score(gw, gate.configs(f"q{i}"))
            assert status == 200 and answered_by(body) == "live"
        await wait_until(lambda: _is(scheduler(gw, "shadow"), running=slots, shadowQueued=shadow_queue), what="shadow backlog")
        dropped = sent - slots - shadow_queue
        assert (await scheduler(gw, "shadow"))["shadowDropped"] == dropped
        assert await counts(gw) == {"live": (sent, 0), "shadow": (0, sent)}
        gate.open()
        await wait_until(lambda: len(of(events(tmp_path), "shadow", False)) == slots + shadow_queue, what="scored shadows")
        assert len(gate.started()) == slots + shadow_queue
        final = await scheduler(gw, "shadow")
        assert final["shadowDropped"] == dropped and final["running"] == 0 and final["shadowQueued"] == 0
        assert (await scheduler(gw, "live"))["liveRejected"] == 0
        # A dropped copy is a shadow failure (issue 32): it gives no evidence the release works.
        assert await error_counts(gw) == {"live": (0, 0), "shadow": (0, dropped)}


async def _is(metrics: Any, **expected: int) -> bool:
    current = await metrics
    return all(current.get(k) == v for k, v in expected.items())


async def test_queued_live_requests_start_before_queued_shadow_copies(tmp_path: Path, gate: Gate) -> None:
    # "left" answers at once; "right" is gated and gets both its own requests (live) and shadow
    # copies of those "left" answered. The fair router alternates between them.
    fair = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    requests = 12
    async with gateway(tmp_path, scoring_slots=1) as gw:
        await deploy(gw, release="left", contract_settings=fair)
        await deploy(gw, release="right", log_level="FULL", directory=GATED)
        tasks = [asyncio.create_task(score(gw, gate.configs(f"q{i}"))) for i in range(requests)]
        await wait_until(
            lambda: _queued_total(scheduler(gw, "right"), requests - 1), what="all work queued on the gated servable"
        )
        # The slot is taken when the job is handed to its thread; the servable records its start a moment later.
        await wait_until(lambda: gate.started(), what="the job holding the only slot to start")
        assert len(gate.started()) == 1  # one job holds the only slot
        gate.open()
        results = await asyncio.gather(*tasks)
        assert all(status == 200 for status, _, _ in results)
        live = {f"q{i}" for i, (_, body, _) in enumerate(results) if answered_by(body) == "right"}
        shadow = {f"q{i}" for i, (_, body, _) in enumerate(results) if answered_by(body) == "left"}
        assert live and shadow
        await wait_until(lambda: len(gate.started()) == requests, what="every job started")
    order = gate.started()[1:]  # after the job that was already running
    kinds = ["live" if tag in live else "shadow" for tag in order]
    assert kinds == sorted(kinds), f"a shadow copy started before queued live work: {order}"
    assert set(order) | set(gate.started()[:1]) == live | shadow


async def _queued_total(metrics: Any, expected: int) -> bool:
    current = await metrics
    return current.get("running") == 1 and current.get("liveQueued", 0) + current.get("shadowQueued", 0) == expected


# ---- overload and deadlines ----------------------------------------------------------------------
async def test_full_live_queue_answers_503_with_retry_after_at_once(tmp_path: Path, gate: Gate) -> None:
    slots, live_queue, excess = 1, 2, 3
    async with gateway(tmp_path, scoring_slots=slots, live_queue=live_queue) as gw:
        await deploy(gw, release="v1", directory=GATED)
        held = [asyncio.create_task(score(gw, gate.configs(f"held{i}"))) for i in range(slots + live_queue)]
        await wait_until(lambda: _is(scheduler(gw, "v1"), running=slots, liveQueued=live_queue), what="full live queue")
        for i in range(excess):
            # The gate is still closed: an answer here proves the request did not wait for a slot.
            status, body, headers = await asyncio.wait_for(score(gw, gate.configs(f"extra{i}")), 5.0)
            assert status == 503 and body["code"] == "Overloaded"
            assert int(headers["Retry-After"]) >= 1
        assert not any(t.done() for t in held)
        assert (await scheduler(gw, "v1"))["liveRejected"] == excess
        gate.open()
        assert [status for status, _, _ in await asyncio.gather(*held)] == [200] * (slots + live_queue)
        assert await counts(gw) == {"v1": (slots + live_queue + excess, 0)}
    assert not any(tag.startswith("extra") for tag in gate.started())


async def test_deadline_header_gives_504_and_the_slot_is_reused(tmp_path: Path, gate: Gate) -> None:
    async with gateway(tmp_path, scoring_slots=1) as gw:
        await deploy(gw, release="v1", directory=GATED)
        started = time.monotonic()
        status, body, _ = await score(gw, gate.configs("slow"), headers={"X-Request-Timeout-Ms": "200"})
        elapsed = time.monotonic() - started
        assert status == 504 and body["code"] == "DeadlineExceeded"
        assert elapsed < 5.0  # bounded by the deadline, not by the blocked model
        assert gate.started() == ["slow"]
        # The only slot is free again although the timed-out call is still blocked in its thread.
        status, body, _ = await score(gw, {"tag": "fast", "record": str(gate.record)})
        assert status == 200 and body["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [3.0]
        assert gate.started() == ["slow", "fast"] and not gate.path.exists()
        metrics = await scheduler(gw, "v1")
        assert metrics["deadlineExceeded"] == 1 and metrics["running"] == 0 and metrics["abandonedRunning"] == 1
        gate.open()  # the abandoned call ends; nothing of it is left behind
        await wait_until(lambda: _is(scheduler(gw, "v1"), abandonedRunning=0), what="abandoned call finished")
        assert not gw.gateway._tasks


async def test_configured_deadline_applies_while_queued(tmp_path: Path, gate: Gate) -> None:
    async with gateway(tmp_path, scoring_slots=1, request_timeout_ms=400) as gw:
        await deploy(gw, release="v1", directory=GATED)
        # The first request raises its own deadline above the configured one and holds the slot.
        first = asyncio.create_task(score(gw, gate.configs("first"), headers={"X-Request-Timeout-Ms": "20000"}))
        await wait_until(lambda: gate.started() == ["first"], what="first request running")
        status, body, _ = await score(gw, gate.configs("second"))
        assert status == 504 and body["code"] == "DeadlineExceeded"
        assert (await scheduler(gw, "v1"))["liveQueued"] == 0
        gate.open()
        assert (await first)[0] == 200
        assert (await score(gw, {"tag": "third", "record": str(gate.record)}))[0] == 200
        assert gate.started() == ["first", "third"]  # the queued request timed out unscored
        assert (await scheduler(gw, "v1"))["deadlineExceeded"] == 1


@pytest.mark.parametrize("value", ["abc", "0", "-5", "99999999"])
async def test_bad_deadline_header_is_a_400(tmp_path: Path, value: str) -> None:
    async with gateway(tmp_path) as gw:
        await deploy(gw, release="v1")
        status, body, _ = await score(gw, {"reqid": "x"}, headers={"X-Request-Timeout-Ms": value})
        assert status == 400 and "X-Request-Timeout-Ms" in body["error"]


# ---- promotion -----------------------------------------------------------------------------------
@pytest.mark.slow  # a timed phase-in and expiry waited out
async def test_promotion_from_shadow_to_live_by_phase_in_then_expiry(tmp_path: Path) -> None:
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    keep_one = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 1}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    answers: list[str] = []

    async def send(n: int) -> None:
        for _ in range(n):
            status, body, _ = await score(gw, {"reqid": f"q{len(answers)}"})
            assert status == 200
            answers.append(answered_by(body))

    async with gateway(tmp_path, evaluation_interval_s=0.1) as gw:
        await deploy(gw, release="old", log_level="FULL", contract_settings=keep_two)
        await deploy(
            gw,
            release="new",
            log_level="FULL",
            validity=[{"NeverValid": {}}],
            phase_in={"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 2}},
        )
        # 1. Pure shadow: every request is answered by "old" and copied to "new".
        await send(5)
        assert answers == ["old"] * 5
        await wait_until(lambda: len(of(events(tmp_path), "new", False)) == 5, what="shadow events of the candidate")
        assert not of(events(tmp_path), "new", True)

        # 2. Promote: valid now, phased in linearly over 2 s.
        policy = {
            "validityPolicy": [{"ImmediatelyValid": {}}],
            "phaseInPolicy": {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 2}},
        }
        async with gw.session.put(gw.url + "/acme/demo/1/new/policy-settings", json=policy) as resp:
            assert resp.status == 200, await resp.text()
        promoted_at = len(answers)
        partial: set[int] = set()

        async def fully_moved() -> bool:
            await send(1)
            async with gw.session.get(gw.url + "/acme/demo/1/stats") as resp:
                for item in await resp.json():
                    m = item["ServableMetrics"]
                    if m["fqrv"]["releaseVersion"] == "new" and 0 < m["currentPhaseInPct"] < 100:
                        partial.add(m["currentPhaseInPct"])
            return answers[-20:] == ["new"] * 20

        await wait_until(fully_moved, timeout=20.0, what="all traffic on the promoted release")
        moving = answers[promoted_at:]
        first_new = moving.index("new")
        assert "old" in moving[first_new:], f"no mixed phase: {moving}"
        assert len(partial) >= 2, f"phase-in jumped straight to 100 %: {sorted(partial)}"
        # Both logged every request: the answer as served, and a shadow copy on the other one.
        stats = await counts(gw)
        assert stats["old"][0] + stats["new"][0] == len(answers)
        assert stats["old"] == (answers.count("old"), answers.count("new"))
        assert stats["new"] == (answers.count("new"), answers.count("old"))
        await wait_until(lambda: len(events(tmp_path)) == 2 * len(answers), what="one served + one shadow event per request")
        evts = events(tmp_path)
        assert len(of(evts, "new", True)) == answers.count("new")
        assert len(of(evts, "old", False)) == answers.count("new")  # the old release now shadows

        # 3. Expire the old release.
        async with gw.session.put(gw.url + "/acme/demo/1", json=keep_one) as resp:
            assert resp.status == 200, await resp.text()
        async with gw.session.get(gw.url + "/acme/demo/1/releases") as resp:
            assert [item["FQRV"]["releaseVersion"] for item in await resp.json()] == ["new"]
        assert await scheduler(gw, "old") == {}
        before = len(evts)
        await send(3)
        assert answers[-3:] == ["new"] * 3
        await wait_until(lambda: len(events(tmp_path)) == before + 3, what="events after expiry")
        assert [e["fqrv"]["releaseVersion"] for e in events(tmp_path)[before:]] == ["new"] * 3


async def test_a_client_that_disconnects_gives_its_queue_place_back(tmp_path: Path) -> None:
    """The handler of a client that gave up is cancelled and its queued job withdrawn."""
    gate = tmp_path / "open"
    async with serve_in_process(tmp_path / "data", scoring_slots=1, access_log=False) as gw:
        body = python_servable(CONTRACT, directory=FIXTURES / "servables" / "gated", log_level="FULL")
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 200
        path = gw.url + "/" + "/".join(map(str, CONTRACT)) + "/score"
        held = asyncio.ensure_future(gw.session.post(path, json=score_body([1.0], configs={"gate": str(gate)})))
        scheduler = next(iter(gw.gateway.loaded.values())).scheduler
        await wait_for(lambda: scheduler.running == 1, 10, "the first request scoring")
        with pytest.raises(asyncio.TimeoutError):
            async with gw.session.post(path, json=score_body([2.0]), timeout=aiohttp.ClientTimeout(total=0.5)):
                pass
        assert scheduler.queued(Priority.LIVE) in (0, 1)
        await wait_for(lambda: scheduler.queued(Priority.LIVE) == 0, 5, "the abandoned job withdrawn")
        gate.write_text("go")
        response = await held
        assert response.status == 200
        response.release()
        log = gw.gateway.prediction_log
        await wait_for(lambda: log.stats.delivered == 2, 5, "both outcomes logged")
    lines = [orjson.loads(line) for line in (tmp_path / "data" / "predictions.jsonl").read_bytes().splitlines()]
    assert sorted((e["event"]["status"], e["event"].get("errorCode")) for e in lines) == [
        (200, None),
        (499, "ClientClosedRequest"),
    ]
