"""Sticky assignment and bandit routing at the core: simulated populations, seeded.

Sticky: 1,000 users keep their release over 10,000 requests; when the new release's phase-in
goes from 30 % to 60 %, only users moving from the old release to the new one change, and
with three releases a growing or leaving release moves only its own users. Bandit: release B
converts at 12 %, A at 8 %; over 5,000 requests with the reward of each fed back, the router sends
at least 80 % of the last 1,000 to B, while the floor keeps A alive and a phase-in caps B.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from forestflow.core.bandit import RewardStats, shaped
from forestflow.core.contract_state import ContractState, ServableEntry
from forestflow.core.ids import FQRV, Contract
from forestflow.core.policies import (
    BanditParams,
    ContractSettings,
    ImmediatePhaseIn,
    KeepLatest,
    LinearTimeBasedPhaseIn,
    NeverValid,
    PolicySettings,
    RewardKind,
    RouterType,
    ServableMetrics,
    ServableSettings,
    StickyParams,
)
from forestflow.core.sticky import sticky_pick

C = Contract("acme", "exp", 1)
USERS = [f"user-{i}" for i in range(1000)]
RATES = {"A": 0.08, "B": 0.12}


def _state(settings: ContractSettings, phase_ins: dict[str, int | None]) -> ContractState:
    """Releases created in order (A oldest), each immediately valid; a number is a linear phase-in
    over 100 s (evaluated at that many seconds, i.e. that percentage), None is immediate."""
    state = ContractState(C, settings)
    for i, (release, pct) in enumerate(phase_ins.items()):
        policy = PolicySettings(phase_in=ImmediatePhaseIn() if pct is None else LinearTimeBasedPhaseIn(100))
        state.add(ServableEntry(FQRV(C, release), ServableSettings(policy=policy), ServableMetrics(created_at_ms=i)))
    state.evaluate(now_ms=1000)  # every release valid from t = 1000 ms
    _set_pct(state, max((p for p in phase_ins.values() if p is not None), default=100))
    return state


def _set_pct(state: ContractState, pct: int) -> None:
    """Evaluate at the moment the phasing-in releases reach ``pct`` % (valid since t = 1000 ms)."""
    state.evaluate(now_ms=1000 + pct * 1000)


def sticky(over: RouterType = RouterType.FAIR) -> ContractSettings:
    return ContractSettings(KeepLatest(5), RouterType.STICKY, StickyParams("userid", over))


def assignments(state: ContractState) -> dict[str, str | None]:
    return {user: state.route(sticky_value=user) for user in USERS}


def test_users_keep_their_release_and_only_move_from_old_to_new_as_the_phase_in_grows() -> None:
    state = _state(sticky(), {"A": None, "B": 30})
    assert {i.key: i.weight for i in state.picker.items} == {"A": 100, "B": 30}
    first = assignments(state)
    rng = np.random.default_rng(7)
    for user in rng.choice(USERS, 10_000):  # 10,000 requests of the same users: nobody moves
        assert state.route(sticky_value=str(user)) == first[str(user)]
    share = Counter(first.values())["B"] / len(USERS)
    assert abs(share - 30 / 130) < 0.05, share  # Fair weights: 30 against 100

    _set_pct(state, 60)
    second = assignments(state)
    moved = Counter((first[u], second[u]) for u in USERS if first[u] != second[u])
    assert set(moved) == {("A", "B")}, moved  # only old -> new, never back
    assert abs(Counter(second.values())["B"] / len(USERS) - 60 / 160) < 0.05
    print(f"\nsticky 30% -> 60%: B {share:.1%} -> {Counter(second.values())['B'] / 1000:.1%}, moved A->B {moved[('A', 'B')]}")


def test_with_three_releases_a_growing_release_only_takes_and_a_leaving_one_only_gives() -> None:
    state = _state(sticky(), {"A": None, "B": None, "C": 10})
    before = assignments(state)
    _set_pct(state, 80)
    grown = assignments(state)
    assert {(before[u], grown[u]) for u in USERS if before[u] != grown[u]} <= {("A", "C"), ("B", "C")}
    assert Counter(before[u] for u in USERS if before[u] != grown[u]).keys() == {"A", "B"}  # from both old ones
    state.remove("B")
    left = assignments(state)
    assert all(grown[u] == left[u] for u in USERS if grown[u] != "B")  # only B's users move
    assert {left[u] for u in USERS if grown[u] == "B"} == {"A", "C"}


def test_requests_without_the_key_route_by_phase_in_and_latest_can_be_the_base() -> None:
    state = _state(sticky(RouterType.LATEST), {"A": None, "B": 30})
    picks = Counter(state.route() for _ in range(1300))
    assert picks == {"A": 1000, "B": 300}  # the weighted picker, exactly as without stickiness
    _set_pct(state, 100)  # Latest at 100 %: the newest alone, for keyed requests too
    assert set(assignments(state).values()) == {"B"}


def test_the_assignment_is_the_same_in_another_process() -> None:
    weights = [("A", 100), ("B", 30)]
    here = [sticky_pick(u, weights, str(C)) for u in USERS[:200]]
    code = (
        "from forestflow.core.sticky import sticky_pick\n"
        f"print(','.join(sticky_pick(f'user-{{i}}', {weights!r}, 'acme.exp.1') for i in range(200)))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str hash: it must not matter
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().split(",") == here


def simulate(
    state: ContractState, requests: int, seed: int, rates: dict[str, float] = RATES
) -> tuple[list[str], Callable[[], dict[str, RewardStats]]]:
    """Route ``requests`` with each answer's conversion (0/1, drawn at its release's rate) fed back."""
    rng = np.random.default_rng(seed)
    state.rng = np.random.default_rng(seed + 1)
    stats = {release: [0, 0.0] for release in state.servables}

    def rewards() -> dict[str, RewardStats]:
        return {r: RewardStats(n, total, total) for r, (n, total) in stats.items()}

    routed = []
    for _ in range(requests):
        release = state.route(rewards=rewards())
        assert release is not None
        routed.append(release)
        stats[release][0] += 1
        stats[release][1] += float(rng.random() < rates[release])
    return routed, rewards


@pytest.mark.parametrize(
    ("router", "params"),
    [
        (RouterType.THOMPSON, BanditParams()),
        (RouterType.THOMPSON, BanditParams(rewards=RewardKind.GAUSSIAN)),
        (RouterType.EPSILON_GREEDY, BanditParams(epsilon=0.1)),
    ],
    ids=["thompson", "thompson-gaussian", "epsilon-greedy"],
)
def test_the_bandit_sends_most_of_the_last_thousand_requests_to_the_better_release(
    router: RouterType, params: BanditParams
) -> None:
    state = _state(ContractSettings(KeepLatest(5), router, params), {"A": None, "B": None})
    routed, _ = simulate(state, 5000, seed=2024)
    last = Counter(routed[-1000:])
    print(f"\n{router.value} {params.rewards.value}: B got {last['B']} of the last 1000 (A {last['A']})")
    assert last["B"] >= 800
    assert last["A"] >= 20  # the 5 % floor: A is still tried


def test_a_phasing_in_release_is_capped_at_its_phase_in_share_whatever_it_earns() -> None:
    state = _state(ContractSettings(KeepLatest(5), RouterType.THOMPSON, BanditParams()), {"A": None, "B": 30})
    routed, _ = simulate(state, 2000, seed=5, rates={"A": 0.05, "B": 0.5})
    assert state.bandit_shares["B"] == pytest.approx(0.30)
    assert Counter(routed[-1000:])["B"] < 360


def test_shaping_keeps_floors_and_caps() -> None:
    assert shaped([1.0, 0.0], [1.0, 1.0], 0.05) == pytest.approx([0.95, 0.05])
    assert shaped([0.0, 1.0], [1.0, 0.3], 0.05) == pytest.approx([0.7, 0.3])
    assert shaped([0.2, 0.2, 0.6], [1.0, 1.0, 0.1], 0.0) == pytest.approx([0.45, 0.45, 0.1])
    assert shaped([0.5, 0.5], [0.2, 0.2], 0.05) == pytest.approx([0.5, 0.5])  # caps that cannot all hold
    assert shaped([1.0, 0.0, 0.0], [1.0, 1.0, 1.0], 0.5) == pytest.approx([1 / 3] * 3)  # floors past 1/n


def test_the_bandit_routes_only_among_valid_releases() -> None:
    state = _state(ContractSettings(KeepLatest(5), RouterType.EPSILON_GREEDY, BanditParams()), {"A": None, "B": None})
    state.servables["B"].settings = ServableSettings(policy=PolicySettings(validity=(NeverValid(),)))
    state.evaluate(now_ms=200_000)  # B stops being valid (a gate, a rollback): it leaves the arms
    good_for_b = {"A": RewardStats(100, 1.0, 1.0), "B": RewardStats(100, 90.0, 90.0)}
    assert {state.route(rewards=good_for_b) for _ in range(200)} == {"A"}
