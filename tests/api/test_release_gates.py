"""Release gates over real HTTP (issue 32): failure counters, error-rate rollback, shadow agreement."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.support import FIXTURES, InProcessGateway, python_servable, score_body, serve_in_process

GATES = FIXTURES / "servables" / "gates"
CONTRACT = ("acme", "demo", 1)
SCORE = "/acme/demo/1/score"
KEEP_ALL = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 5}}, "router": {"LatestPhaseInPctBasedRouter": {}}}


async def deploy(gw: InProcessGateway, **kwargs: Any) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(CONTRACT, **kwargs)) as resp:
        assert resp.status == 200, await resp.text()


async def score(gw: InProcessGateway, configs: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with gw.session.post(gw.url + SCORE, json=score_body([1.5, 2.5], configs=configs)) as resp:
        return resp.status, await resp.json()


async def stats(gw: InProcessGateway) -> dict[str, dict[str, Any]]:
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as resp:
        assert resp.status == 200
        return {m["fqrv"]["releaseVersion"]: m for m in (item["ServableMetrics"] for item in await resp.json())}


def answered_by(body: dict[str, Any]) -> str:
    return str(body["Prediction"]["fqrv"]["releaseVersion"])


async def test_a_shadow_failing_every_copy_never_becomes_valid_and_shows_its_failures(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", evaluation_interval_s=0.2) as gw:
        await deploy(gw, release="v1", contract_settings=KEEP_ALL)
        await deploy(
            gw,
            release="v2",
            directory=GATES,
            module="raises.py",
            log_level="FULL",
            validity=[{"MinServedEventsBasedValidity": {"validAfterMinServedEvents": 5}}],
        )
        for _ in range(20):
            status, body = await score(gw)
            assert status == 200 and answered_by(body) == "v1"

        async def failures_counted(expected: int) -> None:
            deadline = time.monotonic() + 10
            while (await stats(gw))["v2"]["shadeErrorCount"] != str(expected):
                assert time.monotonic() < deadline, await stats(gw)
                await asyncio.sleep(0.05)

        await failures_counted(20)
        await asyncio.sleep(1.0)  # five evaluation rounds: a failing shadow must stay invalid through them
        m = (await stats(gw))["v2"]
        assert m["shadeCount"] == "20" and m["shadeErrorCount"] == "20" and m["errorCount"] == "0", m
        assert m["currentPhaseInPct"] == 0 and "becameValidAtMS" not in m, m
        assert m["performanceMetrics"]["errorRate"] == 1.0, m
        for _ in range(5):
            status, body = await score(gw)
            assert status == 200 and answered_by(body) == "v1"
        await failures_counted(25)  # the shadow copies fail after the answers went out
        async with gw.session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        assert 'forestflow_servable_shade_errors_total{fqrv="acme.demo.1.v2"} 25.0' in text, text[:3000]


async def test_a_live_release_that_starts_failing_is_rolled_back(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    configs = {"broken": str(broken)}
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", evaluation_interval_s=0.25) as gw:
        await deploy(gw, release="v1", contract_settings=KEEP_ALL)
        await deploy(
            gw,
            release="v2",
            directory=GATES,
            log_level="FULL",
            validity=[{"MaxErrorRateValidity": {"maxErrorRate": 0.1, "min_events": 20}}],
        )
        for i in range(25):  # v1 answers, v2 gets a shadow copy of each
            status, body = await score(gw, configs)
            # v2 cannot be valid before its 20th event; after that an evaluation may make it so.
            assert status == 200 and answered_by(body) in (("v1",) if i < 20 else ("v1", "v2")), (i, body)
        deadline = time.monotonic() + 10
        while True:  # v2 becomes valid and, with the Latest router, answers everything
            status, body = await score(gw, configs)
            assert status == 200
            if answered_by(body) == "v2":
                break
            assert time.monotonic() < deadline, await stats(gw)
            await asyncio.sleep(0.05)
        # Every evaluation of the contract from here on: v2's window error rate and event count going in,
        # and whether v2 was routed going in and coming out. Counted in rounds, not seconds: a loaded
        # machine delays the timer, but no round may pass over a release whose gate failed.
        rounds: list[tuple[float, int, bool, bool]] = []
        admin = gw.gateway.admin
        evaluate = admin.evaluate

        async def observed(state: Any) -> None:
            entry = state.servables.get("v2") if state.contract.project == "demo" else None
            if entry is None:
                return await evaluate(state)
            window, routed = entry.metrics.window, "v2" in state.picker.keys()  # noqa: SIM118 (a WeightedPicker)
            rate, events = window.error_rate, len(window.outcomes)
            await evaluate(state)
            rounds.append((rate, events, routed, "v2" in state.picker.keys()))  # noqa: SIM118

        admin.evaluate = observed  # type: ignore[method-assign]
        broken.touch()
        failures = 0
        deadline = time.monotonic() + 10
        while True:
            status, body = await score(gw, configs)
            if status == 200:
                assert answered_by(body) == "v1", body
                break
            assert status == 500, body
            failures += 1
            assert time.monotonic() < deadline, ("still routed to the failing release", failures, rounds)
            await asyncio.sleep(0.02)
        admin.evaluate = evaluate  # type: ignore[method-assign]
        assert failures >= 3
        # The first round that found v2 routed with its error rate over the bound took it out of routing.
        crossed = [i for i, (rate, events, routed, _) in enumerate(rounds) if routed and events >= 20 and rate > 0.1]
        assert crossed and not rounds[crossed[0]][3], rounds
        assert all(after for *_, after in rounds[: crossed[0]]), rounds  # and no round before it did
        # The older release answers everything again; v2 sees only failing shadow copies now.
        for _ in range(10):
            status, body = await score(gw, configs)
            assert status == 200 and answered_by(body) == "v1"
        deadline = time.monotonic() + 10
        while int((m := (await stats(gw))["v2"])["shadeErrorCount"]) < 10:  # the last copies may still be running
            assert time.monotonic() < deadline, m
            await asyncio.sleep(0.02)
        assert int(m["errorCount"]) == failures, m
        assert m["currentPhaseInPct"] == 0, m
        async with gw.session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        assert 'forestflow_release_rollbacks_total{fqrv="acme.demo.1.v2"} 1.0' in text
        # Fixed: fresh good events under the bound make it valid again.
        broken.unlink()
        deadline = time.monotonic() + 10
        while True:
            status, body = await score(gw, configs)
            assert status == 200
            if answered_by(body) == "v2":
                break
            assert time.monotonic() < deadline, await stats(gw)


async def test_shadow_agreement_is_measured_and_gates_a_release(tmp_path: Path) -> None:
    gate = [{"PerformanceBasedValidity": {"metric": "agreement", "minThreshold": 0.99}}]
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", evaluation_interval_s=0.2) as gw:
        await deploy(gw, release="v1", contract_settings=KEEP_ALL)
        await deploy(gw, release="same", directory=GATES, log_level="FULL", validity=[{"NeverValid": {}}])
        await deploy(gw, release="other", directory=GATES, module="triple.py", log_level="FULL", validity=gate)
        for _ in range(10):
            status, body = await score(gw)
            assert status == 200 and answered_by(body) == "v1"
        deadline = time.monotonic() + 10
        while True:
            m = await stats(gw)
            if m["same"]["performanceMetrics"].get("agreement") == 1.0 and "agreement" in m["other"]["performanceMetrics"]:
                break
            assert time.monotonic() < deadline, m
            await asyncio.sleep(0.05)
        assert m["other"]["performanceMetrics"]["agreement"] == 0.0
        assert m["other"]["currentPhaseInPct"] == 0 and m["same"]["currentPhaseInPct"] == 0
        assert 0 <= m["same"]["performanceMetrics"]["p99LatencyMs"] < 5000
        # A release that agrees passes the same gate and takes the traffic.
        await deploy(gw, release="good", directory=GATES, log_level="FULL", validity=gate)
        deadline = time.monotonic() + 10
        while True:
            status, body = await score(gw)
            assert status == 200
            if answered_by(body) == "good":
                break
            assert answered_by(body) in ("v1",), body
            assert time.monotonic() < deadline, await stats(gw)
            await asyncio.sleep(0.05)
        # Values set by PUT .../performance win for the keys they name.
        async with gw.session.put(
            gw.url + "/acme/demo/1/good/performance-metrics", json={"performanceMetrics": {"agreement": 0.5}}
        ) as resp:
            assert resp.status == 200, await resp.text()
        assert (await stats(gw))["good"]["performanceMetrics"]["agreement"] == 0.5
        deadline = time.monotonic() + 10
        while True:
            status, body = await score(gw)
            if answered_by(body) == "v1":
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


async def test_the_evaluation_timer_honours_evaluation_interval_s(tmp_path: Path) -> None:
    interval = 0.3
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", evaluation_interval_s=interval) as gw:
        await deploy(gw, release="v1", contract_settings=KEEP_ALL)
        valid_at = time.time() + 0.5
        await deploy(gw, release="v2", validity=[{"TimeBasedValidity": {"validAfterMS": int(valid_at * 1000)}}])
        while True:  # only the timer makes v2 valid: nothing else changes the contract meanwhile
            status, body = await score(gw)
            assert status == 200
            if answered_by(body) == "v2":
                break
            assert time.time() < valid_at + interval + 1.0, "v2 not valid within an evaluation interval (+1 s)"
            await asyncio.sleep(0.02)
        assert time.time() >= valid_at
