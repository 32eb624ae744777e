"""Experiments through HTTP: pinned releases, reward feedback, sticky assignment, the bandit routers.

Real in-process gateways on loopback ports (file store, file prediction log); one test shares
answers between two workers of one data dir, one between two replicas on a real redis-server.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from forestflow.core.ids import Contract
from forestflow.supervisor import WorkerIdentity
from tests.registry.redis_server import RedisServer
from tests.support import InProcessGateway, python_servable, score_body, serve_in_process, wait_for

CONTRACT = "/acme/demo/1"
MODEL = "/v2/models/acme.demo.1"
KEEP = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 5}}}
FAIR = {**KEEP, "router": {"FairPhaseInPctBasedRouter": {}}}
NEVER = [{"NeverValid": {}}]


async def deploy(gw: InProcessGateway, release: str, headers: dict[str, str] | None = None, **kw: Any) -> None:
    kw.setdefault("log_level", "FULL")
    kw.setdefault("key_features", ["userid"])
    kw.setdefault("contract_settings", FAIR)
    async with gw.session.post(gw.url + "/servable", json=python_servable(release=release, **kw), headers=headers) as r:
        assert r.status == 200, await r.text()


async def score(gw: InProcessGateway, userid: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """Status, body and X-Request-Id of one /score call."""
    body = score_body([1.0], configs={"userid": userid} if userid else None)
    async with gw.session.post(gw.url + CONTRACT + "/score", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers["X-Request-Id"]


def answered_by(body: Any) -> str:
    return str(body["Prediction"]["fqrv"]["releaseVersion"])


async def v2_infer(
    gw: InProcessGateway, userid: str | None = None, headers: dict[str, str] | None = None, body_id: str | None = None
) -> tuple[int, Any]:
    doc: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [1.0]}]}
    if userid:
        doc["parameters"] = {"userid": userid}
    if body_id:
        doc["id"] = body_id
    async with gw.session.post(gw.url + MODEL + "/infer", json=doc, headers=headers) as r:
        return r.status, await r.json()


async def feedback(gw: InProcessGateway, request_id: str, reward: Any, path: str = CONTRACT) -> tuple[int, Any]:
    async with gw.session.post(gw.url + path + "/feedback", json={"requestId": request_id, "reward": reward}) as r:
        return r.status, await r.json()


async def put_settings(gw: InProcessGateway, settings: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with gw.session.put(gw.url + CONTRACT, json=settings, headers=headers) as r:
        return r.status, await r.json()


async def stats(gw: InProcessGateway) -> dict[str, dict[str, Any]]:
    async with gw.session.get(gw.url + CONTRACT + "/stats") as r:
        assert r.status == 200
        return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in await r.json()}


def events(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "predictions.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


async def test_pinned_requests_answer_from_the_shadow_release_only_when_allowed(gw: InProcessGateway, tmp_path: Path) -> None:
    await deploy(gw, "v1")
    await deploy(gw, "v2", validity=NEVER)  # shadow-only
    pin = {"X-Forestflow-Release": "v2"}

    status, body, _ = await score(gw, "u1", pin)
    assert status == 403 and "allowPinnedReleases" in body["error"]
    status, body = await v2_infer(gw, "u1", pin)
    assert status == 403 and "allowPinnedReleases" in body["error"]

    status, _ = await put_settings(gw, {**FAIR, "allowPinnedReleases": True})
    assert status == 200
    async with gw.session.get(gw.url + CONTRACT + "/c-settings") as r:
        assert (await r.json())["ContractSettings"]["allowPinnedReleases"] is True

    status, body, pinned_id = await score(gw, "u1", pin)
    assert status == 200 and answered_by(body) == "v2"
    status, body, _ = await score(gw, "u1")
    assert status == 200 and answered_by(body) == "v1"  # without the header: routed as ever
    status, body = await v2_infer(gw, "u1", pin)
    assert status == 200 and body["model_version"] == "v2"
    status, body, _ = await score(gw, "u1", {"X-Forestflow-Release": "v9"})
    assert status == 404 and "UnknownServable" in body

    def pinned_events() -> list[dict[str, Any]]:
        return [e["event"] for e in events(tmp_path / "data") if e["event"].get("pinned")]

    await wait_for(lambda: len(pinned_events()) == 2, 10, "the two pinned events")
    basic, v2 = sorted(pinned_events(), key=lambda e: e["protocol"])
    assert basic["requestId"] == pinned_id and basic["protocol"] == "basic" and v2["protocol"] == "v2"
    assert all(e["servedRequest"] is True and e["fqrv"]["releaseVersion"] == "v2" for e in (basic, v2))
    assert (await stats(gw))["v2"]["scoreCount"] == "2"


async def test_the_admin_token_may_pin_without_the_contract_allowing_it(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data", admin_token="s3cret") as gw:
        admin = {"Authorization": "Bearer s3cret"}
        await deploy(gw, "v1", headers=admin)
        await deploy(gw, "v2", headers=admin, validity=NEVER)
        status, body, _ = await score(gw, None, {"X-Forestflow-Release": "v2", **admin})
        assert status == 200 and answered_by(body) == "v2"
        status, body, _ = await score(gw, None, {"X-Forestflow-Release": "v2", "Authorization": "Bearer wrong"})
        assert status == 403 and "Forbidden" in body
        status, body = await v2_infer(gw, None, {"X-Forestflow-Release": "v2", **admin})
        assert status == 200 and body["model_version"] == "v2"


async def test_feedback_is_joined_to_the_answering_release_counted_and_logged(gw: InProcessGateway, tmp_path: Path) -> None:
    await deploy(gw, "v1")
    ids = []
    for user in ("u1", "u2", "u3"):
        status, body, request_id = await score(gw, user)
        assert status == 200
        ids.append(request_id)
    assert await feedback(gw, ids[0], 1.0) == (
        200,
        {
            "FeedbackRecorded": {
                "fqrv": {"contract": {"organization": "acme", "project": "demo", "contractNumber": 1}, "releaseVersion": "v1"},
                "requestId": ids[0],
                "reward": 1.0,
            }
        },
    )
    assert (await feedback(gw, ids[1], 0))[0] == 200
    assert (await feedback(gw, ids[2], 0.5))[0] == 200

    # A V2 answer takes feedback by its body id and by its X-Request-Id, on the V2 route.
    status, body = await v2_infer(gw, "u4", body_id="v2-request-1")
    assert status == 200
    status, body = await feedback(gw, "v2-request-1", 1.5, MODEL)
    assert (status, body) == (200, {"model_name": "acme.demo.1", "model_version": "v1", "id": "v2-request-1", "reward": 1.5})

    m = (await stats(gw))["v1"]
    assert (m["feedbackCount"], m["rewardSum"], m["rewardMean"]) == ("4", 3.0, 0.75)
    async with gw.session.get(gw.url + "/metrics") as r:
        text = await r.text()
    assert 'forestflow_servable_feedback_total{fqrv="acme.demo.1.v1"} 4.0' in text
    assert 'forestflow_servable_reward_sum{fqrv="acme.demo.1.v1"} 3.0' in text
    async with gw.session.get(gw.url + "/ops/dashboard") as r:
        [release] = (await r.json())["contracts"][0]["releases"]
    assert (release["feedbackCount"], release["rewardMean"]) == (4, 0.75)

    def feedback_events() -> list[dict[str, Any]]:
        return [e for e in events(tmp_path / "data") if e["event"]["protocol"] == "feedback"]

    await wait_for(lambda: len(feedback_events()) == 4, 10, "four feedback events")
    first = feedback_events()[0]
    assert first["key"] == "u1"  # the key of the prediction it rewards
    assert first["event"]["requestId"] == ids[0] and first["event"]["feedback"] == {"reward": 1.0}


async def test_bad_unknown_and_expired_feedback_is_refused(gw: InProcessGateway) -> None:
    await deploy(gw, "v1")
    status, _, request_id = await score(gw, "u1")
    assert status == 200
    status, body = await feedback(gw, "no-such-request", 1.0)
    assert status == 404 and "unknown request id" in body["error"]
    status, body = await feedback(gw, request_id, "yes")
    assert status == 400 and "reward" in body["error"]
    async with gw.session.post(gw.url + CONTRACT + "/feedback", json={"reward": 1}) as r:
        assert r.status == 400 and "requestId: required" in (await r.json())["error"]
    status, body = await feedback(gw, request_id, 1.0, "/acme/other/1")
    assert status == 404 and "UnknownContract" in body
    status, body = await feedback(gw, "no-such-request", 1.0, MODEL)
    assert status == 404 and set(body) == {"error"}  # a V2 error body

    later = gw.gateway.clock() + int(gw.gateway.settings.feedback_ttl_s * 1000) + 1
    gw.gateway.clock = lambda: later
    status, body = await feedback(gw, request_id, 1.0)
    assert status == 404  # expired
    assert "feedbackCount" not in (await stats(gw))["v1"]


async def test_sticky_users_keep_their_release_and_only_move_to_the_new_one(gw: InProcessGateway) -> None:
    start = gw.gateway.clock()
    gw.gateway.clock = lambda: start
    sticky = {**KEEP, "router": {"StickyPhaseInRouter": {"key": "userid"}}}
    await deploy(gw, "A", contract_settings=sticky)
    await deploy(gw, "B", contract_settings=None, phase_in={"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 100}})

    async def at(pct: int) -> dict[str, str]:
        gw.gateway.clock = lambda: start + pct * 1000
        await gw.gateway.admin.evaluate_all()
        seen: dict[str, set[str]] = {}
        for _ in range(3):
            for i in range(60):
                status, body, _ = await score(gw, f"user-{i}")
                assert status == 200
                seen.setdefault(f"user-{i}", set()).add(answered_by(body))
        assert all(len(releases) == 1 for releases in seen.values()), "a user changed release"
        return {user: releases.pop() for user, releases in seen.items()}

    thirty = await at(30)
    assert 0 < Counter(thirty.values())["B"] < 30
    for i in range(20):  # V2 reads the same key from the request parameters
        status, body = await v2_infer(gw, f"user-{i}")
        assert status == 200 and body["model_version"] == thirty[f"user-{i}"]
    sixty = await at(60)
    moved = {(thirty[u], sixty[u]) for u in thirty if thirty[u] != sixty[u]}
    assert moved == {("A", "B")}


@pytest.mark.parametrize(
    "router",
    [{"ThompsonSamplingRouter": {}}, {"EpsilonGreedyRouter": {"epsilon": 0.1}}],
    ids=["thompson", "epsilon-greedy"],
)
async def test_the_bandit_learns_from_feedback_posted_to_the_gateway(gw: InProcessGateway, router: dict[str, Any]) -> None:
    await deploy(gw, "A", contract_settings={**KEEP, "router": router})
    await deploy(gw, "B", contract_settings=None)
    rng = np.random.default_rng(11)
    gw.gateway.contract_state(Contract("acme", "demo", 1)).rng = np.random.default_rng(12)
    rates = {"A": 0.1, "B": 0.5}
    routed = []
    for _ in range(300):
        status, body, request_id = await score(gw)
        assert status == 200
        release = answered_by(body)
        routed.append(release)
        assert (await feedback(gw, request_id, float(rng.random() < rates[release])))[0] == 200
    last = Counter(routed[-100:])
    assert last["B"] >= 75, last
    m = await stats(gw)
    assert int(m["A"]["feedbackCount"]) + int(m["B"]["feedbackCount"]) == 300
    assert math.isclose(m["B"]["rewardMean"], 0.5, abs_tol=0.12)


async def test_router_settings_are_validated_and_round_trip(gw: InProcessGateway) -> None:
    await deploy(gw, "v1")
    good = [
        {"StickyPhaseInRouter": {"key": "userid", "over": "LatestPhaseInPctBasedRouter"}},
        {"ThompsonSamplingRouter": {"rewards": "gaussian", "minShare": 0.1, "priorAlpha": 1.0, "priorBeta": 1.0}},
        {"EpsilonGreedyRouter": {"epsilon": 0.2, "minShare": 0.05, "rewards": "bernoulli"}},
    ]
    for router in good:
        assert (await put_settings(gw, {**KEEP, "router": router}))[0] == 200
        async with gw.session.get(gw.url + CONTRACT + "/c-settings") as r:
            assert (await r.json())["ContractSettings"]["router"] == router
    async with gw.session.put(gw.url + CONTRACT, json={**KEEP, "router": {"EpsilonGreedyRouter": {}}}) as r:
        assert r.status == 200
    bad = {
        "router.EpsilonGreedyRouter.epsilon": {"EpsilonGreedyRouter": {"epsilon": 2}},
        "router.ThompsonSamplingRouter.minShare": {"ThompsonSamplingRouter": {"minShare": 0.9}},
        "router.ThompsonSamplingRouter.rewards": {"ThompsonSamplingRouter": {"rewards": "poisson"}},
        "router.ThompsonSamplingRouter.epsilonn": {"ThompsonSamplingRouter": {"epsilonn": 0.1}},
        "router.StickyPhaseInRouter.key": {"StickyPhaseInRouter": {}},
        "router.StickyPhaseInRouter.over": {"StickyPhaseInRouter": {"key": "u", "over": "StickyPhaseInRouter"}},
    }
    for field, router in bad.items():
        status, body = await put_settings(gw, {**KEEP, "router": router})
        assert status == 422 and "ContractValidationError" in body and body["error"].startswith(field), body
    status, body = await put_settings(gw, {**FAIR, "allowPinnedReleases": "yes"})
    assert status == 422 and body["error"].startswith("allowPinnedReleases")


async def test_feedback_reaches_the_worker_that_did_not_answer(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with (
        serve_in_process(data_dir, worker=WorkerIdentity(0, 2), metrics_flush_interval_s=0.1) as w0,
        serve_in_process(data_dir, worker=WorkerIdentity(1, 2), metrics_flush_interval_s=0.1) as w1,
    ):
        await deploy(w0, "v1")
        await wait_for(lambda: w1.gateway.ready and bool(w1.gateway.loaded), 20, "w1 to load v1")
        status, _, request_id = await score(w0, "u1")
        assert status == 200
        assert (await feedback(w1, request_id, 2.0))[0] == 200
        assert (await stats(w1))["v1"]["feedbackCount"] == "1"

        async def counted_on_w0() -> bool:
            return (await stats(w0))["v1"].get("rewardSum") == 2.0

        await wait_for(counted_on_w0, 10, "w0 to count w1's reward")


async def test_feedback_reaches_the_replica_that_did_not_answer(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    try:
        async with (
            serve_in_process(tmp_path / "a", redis_url=redis.url, redis_sync_interval_s=0.1) as a,
            serve_in_process(tmp_path / "b", redis_url=redis.url, redis_sync_interval_s=0.1) as b,
        ):
            await deploy(a, "v1")
            await wait_for(lambda: b.gateway.ready and bool(b.gateway.loaded), 20, "b to load v1")
            status, _, request_id = await score(a, "u1")
            assert status == 200
            assert (await feedback(b, request_id, 1.0))[0] == 200
            assert (await feedback(b, "never-answered", 1.0))[0] == 404
    finally:
        redis.stop()


@pytest.mark.slow
async def test_two_redis_replicas_learn_together_which_release_converts_better(tmp_path: Path) -> None:
    """5,000 requests alternating between two replicas, each answer's conversion (B 12 %, A 8 %)
    posted as feedback to the *other* replica after each block of 50: both route from the rewards
    they share."""
    redis = RedisServer(tmp_path / "redis").start()
    try:
        fast = {"redis_url": redis.url, "redis_sync_interval_s": 0.1, "metrics_flush_interval_s": 0.1, "access_log": False}
        async with (
            serve_in_process(tmp_path / "a", **fast) as a,
            serve_in_process(tmp_path / "b", **fast) as b,
        ):
            await deploy(a, "A", log_level="NONE", contract_settings={**KEEP, "router": {"ThompsonSamplingRouter": {}}})
            await deploy(a, "B", log_level="NONE", contract_settings=None)
            await wait_for(lambda: len(b.gateway.loaded) == 2 and b.gateway.ready, 20, "b to load A and B")
            contract = Contract("acme", "demo", 1)
            for i, gw in enumerate((a, b)):
                gw.gateway.contract_state(contract).rng = np.random.default_rng(100 + i)
            rng = np.random.default_rng(2024)
            rates = {"A": 0.08, "B": 0.12}
            routed = []
            for _block in range(100):  # conversions come in a little after the answers
                answers = []
                for i in range(50):
                    status, body, request_id = await score((a, b)[i % 2])
                    assert status == 200
                    answers.append((i, request_id, answered_by(body)))
                for i, request_id, release in answers:
                    routed.append(release)
                    assert (await feedback((b, a)[i % 2], request_id, float(rng.random() < rates[release])))[0] == 200
            last = Counter(routed[-1000:])
            print(f"\ntwo replicas, Thompson: B got {last['B']} of the last 1000 requests (A {last['A']})")
            assert last["B"] >= 800

            async def summed() -> bool:
                ms = [await stats(gw) for gw in (a, b)]
                return all(int(m["A"]["feedbackCount"]) + int(m["B"]["feedbackCount"]) == 5000 for m in ms)

            await wait_for(summed, 10, "both replicas to count all 5,000 rewards")
    finally:
        redis.stop()


async def test_rewards_survive_a_restart(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "data") as gw:
        await deploy(gw, "v1")
        status, _, request_id = await score(gw, "u1")
        assert status == 200
        assert (await feedback(gw, request_id, 0.25))[0] == 200
    async with serve_in_process(tmp_path / "data") as gw:  # the same data dir: counters restored
        m = (await stats(gw))["v1"]
        assert (m["feedbackCount"], m["rewardSum"]) == ("1", 0.25)
        status, body = await feedback(gw, request_id, 1.0)
        assert status == 404  # the answers index is memory: feedback is for answers of this run
