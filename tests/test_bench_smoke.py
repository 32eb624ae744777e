"""The benchmark harness runs end to end (a few seconds; nothing about speed is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT


@pytest.mark.slow
def test_bench_smoke_prints_a_table() -> None:
    result = subprocess.run([sys.executable, "bench/run.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("score ")]
    assert [r[3] for r in rows] == ["NONE", "NONE-onnx", "FULL-file"], result.stdout
    assert all(float(r[4]) > 0 and int(r[-1]) == 0 for r in rows), result.stdout  # req/s > 0, no errors


@pytest.mark.slow
def test_kafka_ingest_bench_smoke_prints_its_cells() -> None:
    result = subprocess.run(
        [sys.executable, "bench/kafka_ingest.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        " ".join(line.split()[:2]): line.split() for line in result.stdout.splitlines() if line.startswith(("http ", "kafka "))
    }
    assert sorted(rows) == ["http c16", "kafka flood", "kafka w16"], result.stdout
    assert all(float(r[3]) > 0 and int(r[7]) == 0 for r in rows.values()), result.stdout  # req/s > 0, no errors


@pytest.mark.slow
def test_remote_bench_smoke_prints_both_sides_and_its_targets() -> None:
    result = subprocess.run([sys.executable, "bench/remote.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    (figures,) = [line for line in lines if "req/s direct" in line]
    direct, through = (float(figures.split(key)[1].split()[0].rstrip(",;")) for key in ("req/s direct", "through the gateway"))
    assert direct > 0 and through > 0 and figures.endswith("errors 0"), result.stdout
    targets = [line for line in lines if line.startswith(("gateway CPU per request <=", "throughput through the gateway >="))]
    assert len(targets) == 2 and all(line.endswith(("HOLDS", "MISSED")) for line in targets), result.stdout


@pytest.mark.slow
def test_profile_bench_smoke_prints_shares_that_add_up() -> None:
    result = subprocess.run(
        [sys.executable, "bench/profile.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line and not line.startswith("#")}
    assert rows["category"] == ["score-1-NONE"], result.stdout
    assert int(rows["samples"][0]) > 0, result.stdout
    assert abs(float(rows["total"][0]) - 100.0) < 0.5, result.stdout
    # The request path is seen: the gateway's front-end code and the event loop both have samples. aiohttp may
    # have none (the 1-row /score request is read and answered by api/fast_http.py, without aiohttp); its row stays.
    assert float(rows["front-end"][0]) > 0 and float(rows["asyncio"][0]) > 0, result.stdout
    assert "aiohttp" in rows, result.stdout


@pytest.mark.slow
def test_images_bench_smoke_prints_both_encodings_side_by_side() -> None:
    result = subprocess.run([sys.executable, "bench/images.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("v2-")}
    assert sorted(rows) == ["v2-binary", "v2-json"], result.stdout
    for line in rows.values():
        piped = float(line.split("CPU/request pipeline ")[1].split()[0])
        bare = float(line.split("bare ONNX ")[1].split()[0])
        decode = float(line.split("decode step alone ")[1].split()[0])
        assert piped > 0 and bare > 0 and decode > 0 and line.endswith("errors 0"), result.stdout


@pytest.mark.slow
def test_explain_bench_smoke_prints_every_method_and_the_latencies() -> None:
    result = subprocess.run(
        [sys.executable, "bench/explain.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("prostate_gbm_")]
    methods = {r[2] for r in rows}
    assert {"forestflow", "genmodel", "xgboost", "forestflow-xgb"} <= methods, result.stdout
    assert {(r[0], r[1]) for r in rows} == {(m, n) for m in ("prostate_gbm_50", "prostate_gbm_200x6") for n in ("1", "100")}
    assert all(float(r[3]) > 0 for r in rows), result.stdout
    (latency,) = [line for line in result.stdout.splitlines() if "/explain p50" in line]
    assert "ratio" in latency, result.stdout


@pytest.mark.slow
def test_trees_bench_smoke_prints_every_cell() -> None:
    result = subprocess.run([sys.executable, "bench/trees.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    in_process = [line.split() for line in lines if line.startswith(("XGBoost ", "LightGBM ", "SKLearn ")) and "MiB" not in line]
    rates = [r for r in in_process if len(r) >= 5 and r[1].isdigit()]
    assert sorted({(r[0], int(r[1])) for r in rates}) == sorted(
        (f, n) for f in ("LightGBM", "SKLearn", "XGBoost") for n in (1, 10, 100, 1000)
    ), result.stdout
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rates), result.stdout
    gateway = [line for line in lines if "CPU/request xgboost" in line]
    assert len(gateway) == 4 and all(line.endswith("errors 0") for line in gateway), result.stdout
    rss = [line.split()[0] for line in lines if re.match(r"(empty|XGBoost|LightGBM|SKLearn) +\d+\.\d+( |$)", line)]
    assert rss == ["empty", "XGBoost", "LightGBM", "SKLearn"], result.stdout


@pytest.mark.slow
def test_scale_bench_smoke_prints_its_figures() -> None:
    result = subprocess.run([sys.executable, "bench/scale.py", "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    starts = ("restart to ready", "cold requests", "RSS MiB", "warm c4", "deploy through")
    assert all(any(line.startswith(s) for line in lines) for s in starts), result.stdout
    side, during = [line for line in lines if line.startswith("warm c4")]
    assert side.endswith("errors 0 / 0"), result.stdout  # both gateways answered every request
    assert "during the background warm-up" in during and during.endswith("errors 0 / 0"), result.stdout


def test_same_model_bench_pins_the_test_venvs_xgboost_and_lightgbm() -> None:
    # bench/same_model.py trains its models with ./.venv's libraries and MLServer's venv reads them: the
    # same versions on both sides (the bench itself, with MLServer's 1.3 GB venv, is run by hand).
    def pins(path: str) -> dict[str, str]:
        lines = (ROOT / path).read_text().splitlines()
        return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))

    bench, suite = pins("bench/mlserver-trees-constraints.txt"), pins("scripts/test-constraints.txt")
    assert bench["xgboost"] == suite["xgboost-cpu"] and bench["lightgbm"] == suite["lightgbm"]
    assert bench["mlserver"] == bench["mlserver-xgboost"] == bench["mlserver-lightgbm"] == "1.7.1"


@pytest.mark.slow
def test_logging_cost_calibration_sees_its_known_cost_and_paces_the_load() -> None:
    # Two short rounds: the calibration pair (NONE, NONE busy-waiting 200 us in every request), then the
    # file cell, both paced; the measured extra of a known 200 us cannot fall far below it.
    argv = [sys.executable, "bench/logging_cost.py", "--calibrate-us", "200", "--paced", "0.5", "--sinks", "file"]
    argv += ["--endpoints", "score", "--rows", "1", "--rounds", "2", "--seconds", "1"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    calibration = re.search(r"^calibration score 1-row: a known 200 us .* measures ([\d.]+) us", result.stdout, re.M)
    assert calibration is not None and float(calibration.group(1)) > 100, result.stdout
    assert "# paced:" in result.stdout, result.stdout
    cost = [line for line in result.stdout.splitlines() if line.startswith("logging FULL-file cost score 1-row")]
    assert len(cost) == 1 and "errors 0)" in cost[0], result.stdout
    assert re.search(r"gateway bias [+-]\d+\.\d%", cost[0]), cost[0]  # the rounds crossed over


def test_a_pause_brings_the_rate_to_the_paced_share() -> None:
    from bench.driver import Result
    from bench.logging_cost import pause_for

    # 4000 req/s at full load with 16 connections and a 2 ms median: 60% of that rate is 2400 req/s, one
    # request per connection every 6.67 ms, of which 2 ms are the answer's wait.
    assert pause_for(Result(12000, 4000.0, 2.0, 5.0, 0), 16, 0.6) == 5
    assert pause_for(Result(100, 50000.0, 0.3, 1.0, 0), 16, 0.9) == 1  # never less than 1 ms


def test_the_crossover_takes_the_gateways_own_difference_out_of_the_cost() -> None:
    from bench.logging_cost import crossover

    # A 12% logging cost measured on a pair whose first gateway spends 5% more CPU than the second on the
    # same work: the rounds read 0.88 * 1.05 (second FULL) and 0.88 / 1.05 (first FULL), 7.6% and 16.2%
    # each alone, then a pair of a 20% cost.
    costs, bias = crossover([0.88 * 1.05, 0.80 * 1.05], [0.88 / 1.05, 0.80 / 1.05])
    assert costs == pytest.approx([0.12, 0.20])
    assert bias == pytest.approx(0.05)
