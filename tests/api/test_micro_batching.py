"""Micro-batching through real HTTP: concurrent requests share model calls on ONNX, H2O and Python
models that opt in, each caller gets exactly its own rows back, a bad request in a combined call
fails alone, and the per-servable settings (maxBatchRows, maxBatchWaitUs, batchable) hold."""

from __future__ import annotations

import asyncio
import csv
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from forestflow.api.common import DEADLINE_HEADER
from forestflow.runtime.scheduler import Priority
from tests import onnx_models
from tests.api import batch_gate
from tests.support import H2O_DIR, InProcessGateway, python_servable, score_body, serve_in_process, wait_for

SERVABLES = Path(__file__).with_name("servables")
PROSTATE = "prostate_gbm_binomial"
CATEGORICAL = ["RACE", "DPROS", "DCAPS"]
NUMERIC = ["AGE", "PSA", "VOL", "GLEASON"]
#: Requests per wave of concurrent requests (one distinct row each).
WAVE = 24


def prostate_rows() -> list[dict[str, str]]:
    with open(H2O_DIR / f"{PROSTATE}.golden.csv", newline="") as fh:
        return [
            r for r in csv.DictReader(fh) if r["kind"] == "data" and all(r[c] not in ("", "NA") for c in CATEGORICAL + NUMERIC)
        ]


def candidate_rows() -> Iterator[dict[str, str]]:
    """The fixture's rows with other PSA and VOL values: trees answer many of them differently."""
    for i in range(400):
        for row in prostate_rows():
            yield {**row, "PSA": str(0.5 + 1.7 * i), "VOL": str(float(row["VOL"]) + 3.1 * (i % 7))}


def prostate_body(row: dict[str, str]) -> dict[str, Any]:
    """One record: the categorical features as strings, the numeric ones as Float64."""
    return {
        "schema": [{"type": "String", "fields": CATEGORICAL}, {"type": "Float64", "fields": NUMERIC}],
        "datum": [
            {
                "tensors": [
                    {"String": {"data": [row[c] for c in CATEGORICAL]}},
                    {"Float64": {"data": [float(row[c]) for c in NUMERIC]}},
                ]
            }
        ],
    }


def serve_request(contract: tuple[str, str, int], directory: Path, flavor: dict[str, Any]) -> dict[str, Any]:
    org, project, n = contract
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "r1"},
        "flavor": flavor,
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("onnx-prostate")
    # Trained on many rows with a label that turns often with PSA and VOL: many distinct answers.
    rows = [r for r, _ in zip(candidate_rows(), range(300))]
    train = [{**r, "out:predict": str(int((float(r["PSA"]) * 7 + float(r["VOL"])) % 10 > 5))} for r in rows]
    return directory, onnx_models.prostate_gbm(directory, train, CATEGORICAL, NUMERIC)


def onnx_request(onnx_dir: tuple[Path, str], project: str, **settings: Any) -> dict[str, Any]:
    directory, model = onnx_dir
    flavor = {"ONNX": {"modelPath": model, "featureOrder": {"cat": CATEGORICAL, "num": NUMERIC}, **settings}}
    return serve_request(("batch", project, 1), directory, flavor)


def h2o_request(project: str, **settings: Any) -> dict[str, Any]:
    flavor = {"H2OMojo": {"mojoPath": f"{PROSTATE}.zip", **settings}}
    return serve_request(("batch", project, 1), H2O_DIR, flavor)


async def deploy(gw: InProcessGateway, body: dict[str, Any]) -> None:
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        assert r.status == 200, await r.text()


async def score(
    gw: InProcessGateway, path: str, body: dict[str, Any], deadline_ms: int | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {DEADLINE_HEADER: str(deadline_ms)} if deadline_ms else {}
    async with gw.session.post(gw.url + path, json=body, headers=headers) as r:
        return r.status, await r.json()


async def counters(gw: InProcessGateway, project: str) -> dict[str, int]:
    """The scheduler counters of the one servable of contract ``*.{project}.1`` (/metrics/json)."""
    async with gw.session.get(gw.url + "/metrics/json") as r:
        schedulers = (await r.json())["schedulers"]
    (stats,) = [v for k, v in schedulers.items() if k.split(".")[1] == project]
    return stats


async def distinct_rows(gw: InProcessGateway, path: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """WAVE rows whose answers, each scored alone, differ pairwise: (request, its single answer)."""
    chosen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    seen: set[str] = set()
    for row in candidate_rows():
        body = prostate_body(row)
        status, answer = await score(gw, path, body)
        assert status == 200, answer
        key = repr(answer["Prediction"]["datum"])
        if key not in seen:
            seen.add(key)
            chosen.append((body, answer))
        if len(chosen) == WAVE:
            return chosen
    raise AssertionError(f"only {len(chosen)} distinct answers among the candidate rows")


async def waves_until_batched(gw: InProcessGateway, path: str, project: str, want_batches: bool) -> dict[str, int]:
    """Concurrent waves of the distinct rows (every answer checked against its single answer) until
    combined calls formed (or, without ``want_batches``, a fixed number of waves); the counters."""
    singles = await distinct_rows(gw, path)
    for _ in range(20):
        answers = await asyncio.gather(*(score(gw, path, body) for body, _ in singles))
        for (body, single), (status, answer) in zip(singles, answers):
            assert status == 200, answer
            assert answer["Prediction"]["datum"] == single["Prediction"]["datum"], (
                body,
                answer,
                single,
            )  # exactly its own row back
        stats = await counters(gw, project)
        if want_batches and stats["microBatches"] > 0:
            return stats
    assert not want_batches, f"no combined call formed in 20 waves of {WAVE}: {stats}"
    return stats


@pytest.mark.parametrize("inline", [True, False], ids=["on-the-loop", "on-threads"])
async def test_concurrent_onnx_requests_share_calls_and_get_their_own_rows(
    gw: InProcessGateway, onnx_dir: tuple[Path, str], inline: bool
) -> None:
    await deploy(gw, onnx_request(onnx_dir, "onnx", **({} if inline else {"inlineMaxRows": 0})))
    stats = await waves_until_batched(gw, "/batch/onnx/1/score", "onnx", want_batches=True)
    assert stats["microBatchedRequests"] >= 2 * stats["microBatches"] > 0
    assert stats["microBatchRetries"] == 0
    async with gw.session.get(gw.url + "/metrics") as r:
        text = await r.text()
    line = next(ln for ln in text.splitlines() if ln.startswith('forestflow_micro_batches_total{fqrv="batch.onnx.1.r1"}'))
    assert float(line.split()[-1]) >= stats["microBatches"]


async def test_concurrent_h2o_requests_share_calls_and_get_their_own_rows(gw: InProcessGateway) -> None:
    await deploy(gw, h2o_request("h2o"))
    stats = await waves_until_batched(gw, "/batch/h2o/1/score", "h2o", want_batches=True)
    assert stats["microBatchedRequests"] >= 2 * stats["microBatches"] > 0


async def test_max_batch_rows_1_on_a_servable_means_no_combined_calls(gw: InProcessGateway, onnx_dir: tuple[Path, str]) -> None:
    await deploy(gw, onnx_request(onnx_dir, "single", maxBatchRows=1, inlineMaxRows=0))
    stats = await waves_until_batched(gw, "/batch/single/1/score", "single", want_batches=False)
    assert stats["microBatches"] == 0 and stats["microBatchedRequests"] == 0


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"maxBatchRows": -1}, "maxBatchRows"),
        ({"max_batch_wait_us": "soon"}, "max_batch_wait_us"),
        ({"maxBatchWaitUs": 2_000_000}, "maxBatchWaitUs"),
    ],
)
async def test_bad_batching_settings_are_a_422_naming_them(
    gw: InProcessGateway, onnx_dir: tuple[Path, str], settings: dict[str, Any], named: str
) -> None:
    async with gw.session.post(gw.url + "/servable", json=onnx_request(onnx_dir, "bad", **settings)) as r:
        assert r.status == 422, await r.text()
        assert named in await r.text()


# -- Python models: opting in, a bad request in a combined call, a deadline in a batch wait ----------


@pytest.fixture
async def one_slot(tmp_path: Path) -> AsyncIterator[InProcessGateway]:
    """A gateway whose servables score one call at a time (so concurrent requests queue)."""
    batch_gate.reset()
    try:
        async with serve_in_process(tmp_path / "data", scoring_slots=1) as server:
            yield server
    finally:
        batch_gate.GATE.set()


def python_request(entry: str, **settings: Any) -> dict[str, Any]:
    body = python_servable(directory=SERVABLES, module="batching.py")
    body["flavor"]["Python"].update(entryPoint=entry, **settings)
    return body


async def blocked_then_queued(gw: InProcessGateway, labels: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """One request holds the only slot while the others (one row each, x = 1, 2, ...) queue; then the
    gate opens; the answers of the queued ones."""
    blocker = asyncio.ensure_future(score(gw, "/acme/demo/1/score", score_body([0.0], ["block"])))
    await wait_for(lambda: batch_gate.ROWS_PER_CALL == [1], 10, "the blocking call")
    queued = [
        asyncio.ensure_future(score(gw, "/acme/demo/1/score", score_body([float(i + 1)], [label])))
        for i, label in enumerate(labels)
    ]
    scheduler = next(iter(gw.gateway.loaded.values())).scheduler
    await wait_for(lambda: scheduler.queued(Priority.LIVE) == len(labels), 10, "queued requests")
    batch_gate.GATE.set()
    assert (await blocker)[0] == 200
    return list(await asyncio.gather(*queued))


async def test_a_bad_request_in_a_combined_call_fails_alone(one_slot: InProcessGateway) -> None:
    await deploy(one_slot, python_request("Model"))
    answers = await blocked_then_queued(one_slot, ["a", "bad", "c", "d"])
    assert [status for status, _ in answers] == [200, 500, 200, 200]
    assert answers[1][1]["code"] == "PredictionFailed"
    for i in (0, 2, 3):
        (record,) = answers[i][1]["Prediction"]["datum"]  # exactly one row: its own
        assert {"Float64": {"data": [2.0 * (i + 1)]}} in record["tensors"], answers[i]
    # The blocker, the combined call of four that failed, then each request alone, once.
    assert batch_gate.ROWS_PER_CALL == [1, 4, 1, 1, 1, 1]
    stats = await counters(one_slot, "demo")
    assert stats["microBatches"] == 1 and stats["microBatchedRequests"] == 4 and stats["microBatchRetries"] == 1


@pytest.mark.parametrize(
    ("entry", "settings"), [("Unbatched", {}), ("Model", {"batchable": False})], ids=["not-opted-in", "setting-off"]
)
async def test_python_models_share_calls_only_when_they_opt_in(
    one_slot: InProcessGateway, entry: str, settings: dict[str, Any]
) -> None:
    await deploy(one_slot, python_request(entry, **settings))
    answers = await blocked_then_queued(one_slot, ["a", "b", "c"])
    assert [status for status, _ in answers] == [200, 200, 200]
    assert batch_gate.ROWS_PER_CALL == [1, 1, 1, 1]
    assert (await counters(one_slot, "demo"))["microBatches"] == 0


async def test_python_opt_in_setting_batches_a_model_without_the_attribute(one_slot: InProcessGateway) -> None:
    await deploy(one_slot, python_request("Unbatched", batchable=True))
    answers = await blocked_then_queued(one_slot, ["a", "b", "c"])
    assert [status for status, _ in answers] == [200, 200, 200]
    assert batch_gate.ROWS_PER_CALL == [1, 3]


async def test_a_deadline_passes_inside_a_batch_wait(tmp_path: Path) -> None:
    batch_gate.reset()
    try:
        async with serve_in_process(tmp_path / "data", scoring_slots=2) as gw:
            await deploy(gw, python_request("Model", maxBatchWaitUs=1_000_000))
            blocker = asyncio.ensure_future(score(gw, "/acme/demo/1/score", score_body([0.0], ["block"])))
            await wait_for(lambda: batch_gate.ROWS_PER_CALL == [1], 10, "the blocking call")
            # A slot is free, but another call scores: the request waits for company, up to its deadline.
            status, answer = await score(gw, "/acme/demo/1/score", score_body([1.0], ["a"]), deadline_ms=200)
            assert status == 504, answer
            assert batch_gate.ROWS_PER_CALL == [1]  # it never reached the model
            batch_gate.GATE.set()
            assert (await blocker)[0] == 200
            # Nothing else scores now: a lone request does not wait.
            status, answer = await score(gw, "/acme/demo/1/score", score_body([2.0], ["b"]))
            assert status == 200 and batch_gate.ROWS_PER_CALL == [1, 1], answer
    finally:
        batch_gate.GATE.set()
