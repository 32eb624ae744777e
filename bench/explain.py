"""What explanations cost: TreeSHAP per row against genmodel and xgboost, /explain against /score.

1. CPU per explained row, in this process, of three ways to get TreeSHAP values of one tree model,
   in alternating rounds (the machine may be shared: each round of each method is timed with this
   thread's CPU clock; medians printed, and each method's ratio to forestflow's):
   - ``forestflow``: the H2O servable's ``shap_inputs`` (the Frame encoded, the C kernel's decisions)
     plus ``treeshap.contributions`` (C), for the whole batch;
   - ``genmodel``: H2O genmodel's contributions predictor through JPype, one Java call per row (the
     rows already Java arrays: only genmodel's own work and the call are timed);
   - ``xgboost``: ``pred_contribs`` (nthread 1) on an XGBoost model of the same size trained on the
     same data, and forestflow's kernel on that same model (``forestflow-xgb``: read by the XGBoost
     flavor's reader, decisions by its tree kernel, neither timed), when xgboost is installed.
   Models: the prostate GBM fixtures ``prostate_gbm_50`` (50 trees, depth 5) and
   ``prostate_gbm_200x6`` (200 trees, depth 6); batches of 1 and 100 rows.
2. The p50 latency of a 1-row ``/explain`` against a 1-row ``/score`` on the same gateway (a child
   process; the requests alternate on one keep-alive connection).
3. With ``--baseline CHECKOUT``: ``/score`` CPU per request of this checkout's gateway against the
   baseline's (e.g. main, without explanations), both loaded at once (bench/servers.side_by_side).

    python bench/explain.py                       # 1 and 2
    python bench/explain.py --baseline /work/main # and 3
    python bench/explain.py --smoke               # a few seconds, for tests/test_bench_smoke.py
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.h2o_scoring import data_rows, frame_of  # noqa: E402
from bench.servers import Server, side_by_side, start_gateway  # noqa: E402
from forestflow.core.frame import Frame  # noqa: E402
from forestflow.core.ids import FQRV, Contract  # noqa: E402
from forestflow.runtime import jvm  # noqa: E402
from forestflow.runtime.h2o_inputs import NA, build_matrix  # noqa: E402
from forestflow.runtime.h2o_mojo import H2OMojoServable  # noqa: E402
from forestflow.runtime.trees import xgboost_reader  # noqa: E402
from forestflow.runtime.trees.shap_forest import shap_forest, tiled_decisions  # noqa: E402
from forestflow.runtime.treeshap import contributions  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "h2o"
MODELS = {"prostate_gbm_50": (50, 5), "prostate_gbm_200x6": (200, 6)}
CONTRACT = ("bench", "explain", 1)


def cpu_per_row(fns: dict[str, Callable[[], Any]], rows: int, seconds: float, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per row of each function, over alternating rounds of about ``seconds``."""

    def one_round(fn: Callable[[], Any]) -> float:
        calls, start = 0, time.thread_time()
        while True:
            fn()
            calls += 1
            spent = time.thread_time() - start
            if spent >= seconds:
                return spent / (calls * rows) * 1e6

    for fn in fns.values():  # warm-up (JIT, caches)
        one_round(fn)
    got: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            got[name].append(one_round(fn))
    return {name: statistics.median(v) for name, v in got.items()}


def genmodel_call(servable: H2OMojoServable, frame: Frame, path: Path) -> Callable[[], Any]:
    """genmodel's TreeSHAP over the frame's rows, one Java call per row (rows converted beforehand)."""
    import jpype

    jvm.ensure_jvm()
    model = jvm.jclass("hex.genmodel.MojoModel").load(str(path))
    predictor = model.makeContributionsPredictor()
    X, _, _ = build_matrix(frame, servable._columns, servable._offset, NA, servable._index)
    rows = [jpype.JArray(jpype.JDouble)(row) for row in X.tolist()]

    def run() -> None:
        for row in rows:
            predictor.calculateContributions(row)

    return run


def xgboost_pair(X: np.ndarray, y: np.ndarray, trees: int, depth: int, batch: np.ndarray) -> dict[str, Callable[[], Any]]:
    """xgboost's pred_contribs and forestflow's kernel on one XGBoost model of this size ({} without xgboost)."""
    try:
        import xgboost as xgb
    except ImportError:
        return {}
    params = {"objective": "binary:logistic", "max_depth": depth, "eta": 0.1, "nthread": 1, "tree_method": "exact"}
    booster = xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=trees)
    # The XGBoost flavor's own reader and kernel: the model's JSON, its forest, each row's decisions.
    model = xgboost_reader.read(json.loads(booster.save_raw("json")))
    forest = shap_forest(model.forest, [f.name for f in model.features])
    decisions = tiled_decisions(model.forest, model.forest.decisions(np.ascontiguousarray(batch, dtype=np.float64)))
    dmatrix = xgb.DMatrix(batch)
    ours = contributions(forest, decisions)[:, 0]
    theirs = booster.predict(dmatrix, pred_contribs=True)
    print(f"#   xgboost {trees}x{depth}: max |forestflow - pred_contribs| = {np.abs(ours - theirs).max():.2e}", flush=True)
    return {
        "xgboost": lambda: booster.predict(dmatrix, pred_contribs=True),
        "forestflow-xgb": lambda: contributions(forest, decisions),
    }


def section_cpu(seconds: float, rounds: int, batch_sizes: list[int]) -> None:
    print("# 1. CPU per explained row (this thread's CPU clock; medians of alternating rounds)")
    print(
        f"{'model':<22}{'rows':>5}  {'method':<16}{'us/row':>10}{'x ours':>8} (xgboost vs forestflow-xgb, genmodel vs forestflow)"
    )
    rows = data_rows("prostate")
    numeric = np.array([[float(r[c]) for c in ("AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON")] for r in rows])
    labels = np.array([float(r["CAPSULE"]) for r in rows])
    for name, (trees, depth) in MODELS.items():
        path = FIXTURES / f"{name}.zip"
        if not path.exists():
            print(f"{name:<22}  missing: make it with scripts/make_h2o_fixtures.py --only {name}")
            continue
        servable = H2OMojoServable(
            FQRV(Contract("bench", "explain", 1), name), FIXTURES, {"mojoPath": path.name, "scorer": "native"}
        )
        servable.load()
        for n in batch_sizes:
            frame = frame_of(servable, rows[:n])
            fns: dict[str, Callable[[], Any]] = {
                "forestflow": lambda frame=frame, servable=servable: contributions(*servable.shap_inputs(frame)),
                "genmodel": genmodel_call(servable, frame, path),
                **xgboost_pair(numeric, labels, trees, depth, numeric[:n]),
            }
            got = cpu_per_row(fns, n, seconds, rounds)
            for method, us in got.items():
                base = got["forestflow-xgb"] if method.endswith("xgb") or method == "xgboost" else got["forestflow"]
                print(f"{name:<22}{n:>5}  {method:<16}{us:>10.1f}{us / base:>8.2f}", flush=True)


def _one_row_bodies() -> tuple[bytes, str]:
    row = {"AGE": 65.0, "RACE": "1", "DPROS": "2", "DCAPS": "1", "PSA": 1.4, "VOL": 0.0, "GLEASON": 6.0}
    strings = [k for k, v in row.items() if isinstance(v, str)]
    numbers = [k for k, v in row.items() if not isinstance(v, str)]
    body = {
        "schema": [{"type": "String", "fields": strings}, {"type": "Float64", "fields": numbers}],
        "datum": [
            {"tensors": [{"String": {"data": [row[k] for k in strings]}}, {"Float64": {"data": [row[k] for k in numbers]}}]}
        ],
    }
    return json.dumps(body).encode(), "application/json"


def deploy_fixture(server: Server, name: str) -> None:
    import requests

    org, project, n = CONTRACT
    definition = {
        "path": FIXTURES.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "r1"},
        "flavor": {"H2OMojo": {"mojoPath": f"{name}.zip"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }
    requests.post(server.url + "/servable", json=definition, timeout=120).raise_for_status()


def section_latency(work: Path, requests_per_side: int) -> None:
    print("# 2. p50 latency of a 1-row request on one gateway (alternating, one keep-alive connection)")
    server = start_gateway(work / "data-latency", {"FORESTFLOW_ACCESS_LOG": "false"}, work, "latency")
    try:
        name = "prostate_gbm_50" if (FIXTURES / "prostate_gbm_50.zip").exists() else "prostate_gbm_binomial"
        deploy_fixture(server, name)
        body, ctype = _one_row_bodies()
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port))
        org, project, n = CONTRACT
        times: dict[str, list[float]] = {"score": [], "explain": []}
        for i in range(requests_per_side * 2 + 200):
            kind = "score" if i % 2 == 0 else "explain"
            start = time.perf_counter()
            conn.request("POST", f"/{org}/{project}/{n}/{kind}", body, {"Content-Type": ctype})
            response = conn.getresponse()
            response.read()
            elapsed = time.perf_counter() - start
            if response.status != 200:
                raise RuntimeError(f"/{kind} answered {response.status}")
            if i >= 200:  # after a warm-up
                times[kind].append(elapsed * 1e6)
        conn.close()
        p50 = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"model {name}: /score p50 {p50['score']:.0f} us, /explain p50 {p50['explain']:.0f} us, "
            f"ratio {p50['explain'] / p50['score']:.2f}",
            flush=True,
        )
    finally:
        server.stop()


def section_score_cpu(work: Path, baseline: Path, seconds: float, rounds: int) -> None:
    print(f"# 3. /score CPU per request: this checkout against {baseline} (both loaded at once, 16 connections each)")
    python = baseline / ".venv" / "bin" / "python"
    this = start_gateway(work / "data-this", {"FORESTFLOW_ACCESS_LOG": "false"}, work, "this")
    base = start_gateway(work / "data-base", {"FORESTFLOW_ACCESS_LOG": "false"}, work, "base", root=baseline, python=str(python))
    try:
        for server in (this, base):
            deploy_fixture(server, "prostate_gbm_binomial")
        body, ctype = _one_row_bodies()
        org, project, n = CONTRACT
        ratios, cpu_this, cpu_base = [], [], []
        for _ in range(rounds):
            a, b = side_by_side(this, base, f"/{org}/{project}/{n}/score", body, ctype, 16, seconds)
            if a.errors or b.errors:
                raise RuntimeError(f"errors: this {a.errors}, baseline {b.errors}")
            cpu_this.append(a.cpu_us)
            cpu_base.append(b.cpu_us)
            ratios.append(a.cpu_us / b.cpu_us)
        print(
            f"/score 1 row: this {statistics.median(cpu_this):.0f} us CPU/request, baseline {statistics.median(cpu_base):.0f}, "
            f"ratio {statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})",
            flush=True,
        )
    finally:
        this.stop()
        base.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=0.5, help="per round and method")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--requests", type=int, default=2000, help="per side, section 2")
    parser.add_argument("--baseline", type=Path, help="another checkout with its .venv: section 3")
    parser.add_argument("--smoke", action="store_true", help="tiny rounds (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.requests = 0.02, 1, 20
    print("# the machine may be loaded by other work: compare the ratios, not the absolute figures", flush=True)
    section_cpu(args.seconds, args.rounds, args.rows)
    work = Path(tempfile.mkdtemp(prefix="ff-explain-bench-"))
    section_latency(work, args.requests)
    if args.baseline is not None:
        section_score_cpu(work, args.baseline.resolve(), max(args.seconds, 2.0), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
