"""The timer's evaluation round evaluates only the contracts with something due (issue 46).

A contract is evaluated when its settings, releases or metrics moved since its last evaluation, or
when a moment its policies name arrives (a valid-from time, a linear phase-in's next step); the
others are skipped, which with 10,000 contracts took a good share of a core every round.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from forestflow.core.ids import Contract
from tests.support import InProcessGateway, python_servable, score_body, serve_in_process, wait_for

KEEP_ALL = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 5}}, "router": {"FairPhaseInPctBasedRouter": {}}}
START_MS = 1_900_000_000_000


class Rounds:
    """A gateway whose clock the test sets, and the contracts each timer round evaluated."""

    def __init__(self, gw: InProcessGateway) -> None:
        self.gw = gw
        self.now = START_MS
        gw.gateway.clock = lambda: self.now
        admin = gw.gateway.admin
        evaluate = admin.evaluate
        self.evaluated: list[str] = []

        async def recorded(state: Any) -> None:
            self.evaluated.append(str(state.contract))
            await evaluate(state)

        admin.evaluate = recorded  # type: ignore[method-assign]

    async def round(self, at_ms: int | None = None) -> list[str]:
        """Run the timer's round at ``at_ms`` (the current time when None); the contracts it evaluated."""
        if at_ms is not None:
            self.now = at_ms
        self.evaluated.clear()
        await self.gw.gateway.admin.evaluate_all()
        return sorted(self.evaluated)

    async def deploy(self, contract: int, release: str = "v1", **kwargs: Any) -> None:
        body = python_servable(("acme", "demo", contract), release, contract_settings=KEEP_ALL, **kwargs)
        if release != "v1":
            del body["contractSettings"]
        async with self.gw.session.post(self.gw.url + "/servable", json=body) as resp:
            assert resp.status == 200, await resp.text()

    def phase_in(self, contract: int, release: str) -> int:
        state = self.gw.gateway.registry.contracts[_contract(contract)]
        return state.servables[release].metrics.current_phase_in_pct


def _contract(n: int) -> Contract:
    return Contract("acme", "demo", n)


@pytest.fixture
async def rounds(tmp_path: Path) -> AsyncIterator[Rounds]:
    # The gateway's own timer never runs during a test: the test makes every round.
    async with serve_in_process(tmp_path / "data", access_log=False, log_level="warning", evaluation_interval_s=3600) as gw:
        yield Rounds(gw)


async def test_contracts_with_nothing_due_are_not_evaluated(rounds: Rounds) -> None:
    for n in (1, 2, 3):
        await rounds.deploy(n)
    await rounds.deploy(3, "v2", validity=[{"TimeBasedValidity": {"validAfterMS": START_MS + 60_000}}])
    await rounds.round()  # whatever the deploys left
    assert await rounds.round() == []
    assert await rounds.round(START_MS + 59_999) == []  # v2's moment has not come
    assert rounds.phase_in(3, "v2") == 0


async def test_a_contract_is_evaluated_when_its_valid_from_moment_arrives(rounds: Rounds) -> None:
    await rounds.deploy(1)
    await rounds.deploy(2)
    await rounds.deploy(2, "v2", validity=[{"TimeBasedValidity": {"validAfterMS": START_MS + 60_000}}])
    await rounds.round()
    assert await rounds.round(START_MS + 59_999) == []
    assert await rounds.round(START_MS + 60_000) == ["acme.demo.2"]
    assert rounds.phase_in(2, "v2") == 100
    assert await rounds.round(START_MS + 120_000) == []  # nothing moves by time any more


async def test_a_linear_phase_in_is_evaluated_at_each_step(rounds: Rounds) -> None:
    await rounds.deploy(1)
    await rounds.deploy(2)
    # 100 s to 100 %: one percent a second, from the deploy (at START_MS).
    await rounds.deploy(2, "v2", phase_in={"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 100}})
    await rounds.round()
    assert rounds.phase_in(2, "v2") == 0
    assert await rounds.round(START_MS + 999) == []
    assert await rounds.round(START_MS + 1_000) == ["acme.demo.2"]
    assert rounds.phase_in(2, "v2") == 1
    assert await rounds.round(START_MS + 30_500) == ["acme.demo.2"]
    assert rounds.phase_in(2, "v2") == 30
    assert await rounds.round(START_MS + 30_999) == []
    assert await rounds.round(START_MS + 100_000) == ["acme.demo.2"]
    assert rounds.phase_in(2, "v2") == 100
    assert await rounds.round(START_MS + 200_000) == []


async def test_a_contract_that_got_traffic_is_evaluated(rounds: Rounds) -> None:
    await rounds.deploy(1)
    await rounds.deploy(2)
    # v2 gets a shadow copy of each request and is valid after 3 successful ones.
    await rounds.deploy(2, "v2", validity=[{"MinServedEventsBasedValidity": {"validAfterMinServedEvents": 3}}], log_level="FULL")
    await rounds.round()
    assert await rounds.round() == []
    for _ in range(3):
        async with rounds.gw.session.post(rounds.gw.url + "/acme/demo/2/score", json=score_body([1.0])) as resp:
            assert resp.status == 200
    entry = rounds.gw.gateway.registry.contracts[_contract(2)].servables["v2"]
    await wait_for(lambda: entry.metrics.successful_events == 3, 10, "v2's three shadow copies")
    assert rounds.phase_in(2, "v2") == 0
    assert await rounds.round() == ["acme.demo.2"]
    assert rounds.phase_in(2, "v2") == 100  # valid now: evaluated after its traffic, not skipped
    assert await rounds.round() == []


async def test_every_contract_is_evaluated_when_the_clock_went_back(rounds: Rounds) -> None:
    rounds.now = START_MS + 10_000
    for n in (1, 2):
        await rounds.deploy(n)  # evaluated at START_MS + 10 s
    assert await rounds.round() == []
    assert await rounds.round(START_MS + 5_000) == ["acme.demo.1", "acme.demo.2"]  # as the round before it did
    assert await rounds.round(START_MS + 6_000) == []
