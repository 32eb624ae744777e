"""The tree flavors against the libraries, in process and in the gateway.

1. In process, rows/s of each flavor's ``predict(frame)`` (a Frame as the codecs build it: one
   float64 column per feature; input mapping and output columns included) against the library's
   own predict (xgboost ``inplace_predict``, lightgbm ``Booster.predict``, scikit-learn
   ``predict_proba``) at 1, 10, 100 and 1,000 rows, on binary classifiers of 100 trees of depth 6
   (scikit-learn: a GradientBoostingClassifier; targets: >= 2x the library at 1 row, >= 1x at 1,000).
2. The gateway's CPU per 1-row and 100-row ``/score`` and V2 request for an XGBoost model trained on
   the prostate rows (25 trees of depth 5, categoricals as pandas categoricals) against the native
   H2O flavor on the prostate GBM fixture (25 trees), the two gateways loaded side by side on one
   core (bench/servers.py); target: within 1.1x.
3. RSS of a gateway with five 100-tree models of each flavor loaded, against an empty one (the smoke: one 5-tree model).

    python bench/trees.py                 # everything (a few minutes)
    python bench/trees.py --smoke         # tiny models, short cells (the tests run it)
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import Server, endpoints, side_by_side, start_gateway  # noqa: E402
from forestflow.core.frame import Frame  # noqa: E402
from forestflow.core.ids import FQRV  # noqa: E402
from forestflow.runtime.flavors import create_servable  # noqa: E402

BATCHES = (1, 10, 100, 1000)
N_FEATURES = 8
CONTRACT = ("bench", "trees", 1)


def rows_per_second(call: Callable[[], Any], rows: int, seconds: float) -> float:
    """Median rows/s over a few timed runs of ``call`` (which scores ``rows`` rows)."""
    call()
    rates = []
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            call()
            n += 1
        rates.append(n * rows / elapsed)
    return statistics.median(rates)


def train(directory: Path, trees: int, depth: int) -> dict[str, tuple[str, Any, Callable[[np.ndarray], Any]]]:
    """flavor -> (model file, library model, library predict on a float64 matrix)."""
    import joblib
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.ensemble import GradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, N_FEATURES))
    y = (X[:, 0] + X[:, 1] * X[:, 2] - X[:, 3] > 0).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": depth, "nthread": 1}, xgb.DMatrix(X, y), trees)
    booster.save_model(str(directory / "model.json"))
    params = {"objective": "binary", "num_leaves": 2**depth, "max_depth": depth, "verbose": -1, "num_threads": 1}
    gbm = lgb.train(params, lgb.Dataset(X, y), trees)
    gbm.save_model(str(directory / "model.txt"))
    sk = GradientBoostingClassifier(n_estimators=trees, max_depth=depth, random_state=0).fit(X[:2000], y[:2000])
    joblib.dump(sk, directory / "model.joblib")
    return {
        "XGBoost": ("model.json", booster, lambda m: booster.inplace_predict(m)),
        "LightGBM": ("model.txt", gbm, lambda m: gbm.predict(m, num_threads=1)),
        "SKLearn": ("model.joblib", sk, lambda m: sk.predict_proba(m)),
    }


def in_process(
    directory: Path, models: dict[str, tuple[str, Any, Callable[[np.ndarray], Any]]], trees: int, depth: int, seconds: float
) -> None:
    rng = np.random.default_rng(1)
    print(f"# in process: rows/s, {trees} trees of depth {depth}, {N_FEATURES} features (machine shared with other work)")
    print(f"{'flavor':9} {'rows':>5} {'forestflow':>12} {'library':>12} {'ratio':>7}  target")
    for flavor, (file, _, library) in models.items():
        servable = create_servable(flavor, FQRV.parse("bench.trees.1.r1"), directory, {"modelPath": file})
        servable.load()
        names = [f"x{j}" if flavor == "SKLearn" else f"f{j}" for j in range(N_FEATURES)]
        for rows in BATCHES:
            X = rng.normal(size=(rows, N_FEATURES))
            frame = Frame({n: np.ascontiguousarray(X[:, j]) for j, n in enumerate(names)})
            ours = rows_per_second(lambda s=servable, f=frame: s.predict(f), rows, seconds)  # defaults bind this loop's values
            theirs = rows_per_second(lambda p=library, m=X: p(m), rows, seconds)
            target = 2.0 if rows == 1 else 1.0 if rows == 1000 else None
            verdict = "" if target is None else f">= {target:.0f}x {'HOLDS' if ours / theirs >= target else 'MISSED'}"
            print(f"{flavor:9} {rows:>5} {ours:>12.0f} {theirs:>12.0f} {ours / theirs:>7.2f}  {verdict}", flush=True)


def prostate_xgboost(directory: Path, trees: int) -> None:
    """An XGBoost model of the H2O fixture's size on the prostate rows (strings as categories)."""
    import pandas as pd
    import xgboost as xgb

    with open(payloads.FIXTURE.with_suffix(".golden.csv")) as fh:
        data = [r for r in csv.DictReader(fh) if r["kind"] == "data"]
    frame = pd.DataFrame({c: pd.Categorical([r[c] for r in data]) for c in payloads.CATEGORICAL})
    for c in payloads.NUMERIC:
        frame[c] = [float(r[c]) if r[c] not in ("", "NA") else np.nan for r in data]
    y = [int(r["out:predict"]) for r in data]
    params = {"objective": "binary:logistic", "max_depth": 5, "max_cat_to_onehot": 1}
    xgb.train(params, xgb.DMatrix(frame, y, enable_categorical=True), trees).save_model(str(directory / "prostate.json"))


def deploy(server: Server, directory: Path, flavor: str, file: str, contract: tuple[str, str, int]) -> None:
    org, project, n = contract
    body = {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "r1"},
        "flavor": {flavor: {"modelPath" if flavor != "H2OMojo" else "mojoPath": file}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }
    r = requests.post(server.url + "/servable", json=body, timeout=120)
    assert r.status_code == 200, r.text


def gateway_cpu(work: Path, models: Path, rounds: int, seconds: float, concurrency: int) -> None:
    prostate_xgboost(models, 25)
    xgb_server = start_gateway(work / "data-xgb", {}, work, "xgboost")
    h2o_server = start_gateway(work / "data-h2o", {}, work, "h2o")
    try:
        deploy(xgb_server, models, "XGBoost", "prostate.json", CONTRACT)
        deploy(h2o_server, payloads.FIXTURE.parent, "H2OMojo", payloads.FIXTURE.name + ".zip", CONTRACT)
        print(f"# gateway CPU per request, XGBoost (25 trees) vs H2O native (25 trees), side by side on core 0, c{concurrency}")
        for rows in (1, 100):
            for name in ("score", "v2"):
                path, body, ctype = endpoints(rows, ".".join(map(str, CONTRACT)))[name]
                side_by_side(xgb_server, h2o_server, path, body, ctype, concurrency, min(seconds, 1.0))  # warm-up
                ratios, cpu, errors = [], [], 0
                for _ in range(rounds):
                    a, b = side_by_side(xgb_server, h2o_server, path, body, ctype, concurrency, seconds)
                    ratios.append(a.cpu_us / b.cpu_us)
                    cpu.append((a.cpu_us, b.cpu_us))
                    errors += a.errors + b.errors
                ratio = statistics.median(ratios)
                print(
                    f"{name:5} {rows:>3}-row: CPU/request xgboost {statistics.median(c[0] for c in cpu):.0f} us, "
                    f"h2o {statistics.median(c[1] for c in cpu):.0f} us, ratio {ratio:.3f} "
                    f"(<= 1.1 {'HOLDS' if ratio <= 1.1 else 'MISSED'}); errors {errors}",
                    flush=True,
                )
    finally:
        xgb_server.stop()
        h2o_server.stop()


def rss_kib(server: Server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def memory(
    work: Path, directory: Path, models: dict[str, tuple[str, Any, Callable[[np.ndarray], Any]]], trees: int, copies: int
) -> None:
    print(f"# RSS of a gateway with {copies} {trees}-tree models of one flavor (MiB)")
    empty = start_gateway(work / "data-empty", {}, work, "empty")
    try:
        base = rss_kib(empty) / 1024
    finally:
        empty.stop()
    print(f"{'empty':9} {base:8.1f}")
    for flavor, (file, _, _) in models.items():
        server = start_gateway(work / f"data-rss-{flavor}", {"FORESTFLOW_ALLOW_PYTHON": "1"}, work, f"rss-{flavor}")
        try:
            for k in range(copies):
                deploy(server, directory, flavor, file, ("bench", f"rss{k}", 1))
            rss = rss_kib(server) / 1024
        finally:
            server.stop()
        print(f"{flavor:9} {rss:8.1f}  (+{rss - base:.1f} over the empty gateway)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models, one short round of each cell")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cells", nargs="+", default=["process", "gateway", "memory"], choices=["process", "gateway", "memory"])
    args = parser.parse_args()
    trees, depth, seconds, rounds = (100, 6, args.seconds, args.rounds) if not args.smoke else (5, 3, 0.1, 1)
    work = Path(tempfile.mkdtemp(prefix="ff-trees-"))
    models = work / "models"  # deployed from: the gateways' data dirs must not be inside it
    models.mkdir()
    print(f"# logs and models: {work}", flush=True)
    trained = train(models, trees, depth) if {"process", "memory"} & set(args.cells) else {}  # once for both cells
    if "process" in args.cells:
        in_process(models, trained, trees, depth, seconds)
    if "gateway" in args.cells:
        gateway_cpu(work, models, rounds, seconds if not args.smoke else 0.5, args.concurrency)
    if "memory" in args.cells:
        memory(work, models, trained, trees, 5 if not args.smoke else 1)  # the smoke: one model each exercises the same path
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
