"""A pipeline release phased in against a single-model release: shadow events, then a traffic split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tests.api.test_pipeline_api import EXAMPLE, GBM, golden_rows, h2o_definition
from tests.pipeline_support import PROSTATE, servable_request
from tests.support import InProcessGateway, serve_in_process, wait_for

CONTRACT = ("pipe", "prostate", 1)
PIPELINE_OUTPUTS = ["label", "probabilities", "top_labels", "top_scores"]


def events(data: Path) -> list[dict[str, Any]]:
    path = data / "predictions.jsonl"
    return [orjson.loads(line)["event"] for line in path.read_bytes().splitlines()] if path.exists() else []


def of(evts: list[dict[str, Any]], release: str, served: bool) -> list[dict[str, Any]]:
    return [e for e in evts if e["fqrv"]["releaseVersion"] == release and bool(e.get("servedRequest", False)) is served]


def request(i: int) -> dict[str, Any]:
    """One row in both the bare model's columns and the pipeline's lower-case ones."""
    row = golden_rows()[i % 30]
    names = PROSTATE + [c.lower() for c in PROSTATE]
    return {
        "schema": [{"type": "String", "fields": names}],
        "datum": [{"tensors": [{"String": {"data": [row[c.upper()] for c in names]}}]}],
        "configs": {"reqid": f"q{i}"},
    }


def fields(event_or_prediction: dict[str, Any]) -> list[str]:
    """The output names, a vector's ``name.0``, ``name.1``, ... counted once as ``name``."""
    names = (f for group in event_or_prediction["schema"] for f in group["fields"])
    return sorted({n.rpartition(".")[0] if "." in n and n.rpartition(".")[2].isdigit() else n for n in names})


async def test_pipeline_release_shadows_then_phases_in_against_a_single_model(tmp_path: Path) -> None:
    data = tmp_path / "data"
    answers: list[str] = []

    async def send(gw: InProcessGateway, n: int) -> None:
        for _ in range(n):
            async with gw.session.post(gw.url + "/pipe/prostate/1/score", json=request(len(answers))) as r:
                body = await r.json()
                assert r.status == 200, body
            release = body["Prediction"]["fqrv"]["releaseVersion"]
            answers.append(release)
            assert fields(body["Prediction"]) == (PIPELINE_OUTPUTS if release == "pipe" else ["0", "1", "predict"])

    async with serve_in_process(data, evaluation_interval_s=0.1, access_log=False, log_level="warning") as gw:
        model = h2o_definition(GBM, CONTRACT, release="gbm", log_level="FULL")
        model["servableSettings"]["loggingSettings"]["keyFeatures"] = ["reqid"]
        model["contractSettings"] = {
            "expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}},
            "router": {"LatestPhaseInPctBasedRouter": {}},
        }
        async with gw.session.post(gw.url + "/servable", json=model) as r:
            assert r.status == 200, await r.text()
        candidate = servable_request(EXAMPLE, release="pipe", log_level="FULL")
        candidate["servableSettings"]["policySettings"]["validityPolicy"] = [{"NeverValid": {}}]
        async with gw.session.post(gw.url + "/servable", json=candidate) as r:
            assert r.status == 200, await r.text()

        # 1. Shadow: the model answers, the pipeline gets one copy per request and logs one event each.
        await send(gw, 4)
        assert answers == ["gbm"] * 4
        await wait_for(lambda: len(events(data)) == 8, 10, "4 served + 4 shadow events")
        shadows = of(events(data), "pipe", False)
        assert len(shadows) == 4
        assert all(fields(e["prediction"]) == PIPELINE_OUTPUTS for e in shadows)
        assert sorted(e["inferenceRequest"]["configs"]["reqid"] for e in shadows) == ["q0", "q1", "q2", "q3"]

        # 2. Phase the pipeline in over 2 s: a split, then all traffic on it.
        policy = {
            "validityPolicy": [{"ImmediatelyValid": {}}],
            "phaseInPolicy": {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 2}},
        }
        async with gw.session.put(gw.url + "/pipe/prostate/1/pipe/policy-settings", json=policy) as r:
            assert r.status == 200, await r.text()
        start = len(answers)

        async def moved() -> bool:
            await send(gw, 1)
            return answers[-10:] == ["pipe"] * 10

        await wait_for(moved, 20, "all traffic on the pipeline")
        split = answers[start:]
        first = split.index("pipe")
        assert "gbm" in split[first:], f"no split while phasing in: {split}"
        # Every request: one served event on the release that answered and one shadow copy on the other.
        await wait_for(lambda: len(events(data)) == 2 * len(answers), 10, "two events per request")
        evts = events(data)
        assert len(of(evts, "pipe", True)) == answers.count("pipe") and len(of(evts, "gbm", False)) == answers.count("pipe")
        assert len(of(evts, "gbm", True)) == answers.count("gbm") and len(of(evts, "pipe", False)) == answers.count("gbm")
