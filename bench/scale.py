"""Issue 46 at scale: N contracts of one native tree model each on one gateway, loaded lazily.

Seeds a file store with N releases (one contract each) of the prostate GBM fixture (``--model
gbm``, a small H2O MOJO) or of an XGBoost model of 100 trees of depth 6 trained at start on the
fixture's four numeric columns (``--model trees100``, served by the native XGBoost flavor), then
measures:
the time from a restart (after a first run persisted the releases' counters and routing) to ready
and to the first answer of a cold release; cold-request
latency (first requests to distinct releases); RSS after that traffic with and without a memory
budget; warm p50/p99 against a gateway with 10 contracts, side by side (both loaded at once, both
pinned to core 0, ``--rounds`` runs, medians); and
the time of a deploy through the admin API into the gateway holding N releases and into the small
one. Nothing is asserted; the machine may be loaded by other work, so compare the side-by-side
ratios rather than absolute figures.

    python bench/scale.py                       # 10,000 contracts
    python bench/scale.py --contracts 1000      # fewer
    python bench/scale.py --smoke               # 40 contracts, a few seconds
    python bench/scale.py --model trees100      # 1,000 contracts of a 100-tree XGBoost model

With ``--model trees100`` the budget gateway's budget defaults to a tenth of what all the releases
would take (the budget's own count of one release, measured on a probe gateway, times N / 10), so
the cold traffic moves over more releases than fit.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.driver import Result  # noqa: E402
from bench.servers import Server, pin_process, side_by_side, start_gateway  # noqa: E402
from forestflow.codecs.ff_settings import parse_serve_request, serve_request_to_json  # noqa: E402
from forestflow.registry.file_store import FileStore  # noqa: E402

BODY = payloads.score_body(1)
HEADERS = {"Content-Type": "application/json"}
#: The flavor of every release, per ``--model`` (the model file is in the run's model dir).
FLAVORS: dict[str, dict[str, Any]] = {
    "gbm": {"H2OMojo": {"mojoPath": "gbm.zip"}},
    "trees100": {"XGBoost": {"modelPath": "trees100.ubj"}},
}
FLAVOR = FLAVORS["gbm"]


def train_trees100(path: Path) -> None:
    """An XGBoost binary classifier of 100 trees of depth 6 on the prostate fixture's numeric
    columns (synthetic rows, so the trees are mostly full), saved as UBJSON."""
    import numpy as np
    import pandas as pd
    import xgboost as xgb

    rng = np.random.default_rng(0)
    n = 20_000
    frame = pd.DataFrame(
        {
            "AGE": rng.normal(66, 6, n),
            "PSA": rng.gamma(2, 8, n),
            "VOL": rng.gamma(2, 9, n),
            "GLEASON": rng.integers(0, 10, n).astype(float),
        }
    )
    score = 0.05 * (frame.AGE - 66) + 0.04 * frame.PSA - 0.02 * frame.VOL + 0.4 * (frame.GLEASON - 6) + rng.normal(0, 1, n)
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "seed": 0}
    booster = xgb.train(params, xgb.DMatrix(frame, (score > 0.5).astype(int)), num_boost_round=100)
    booster.save_model(str(path))


def release(model_dir: Path, n: int, version: str = "gbm") -> dict[str, Any]:
    """The serve request of contract bench/scale/<n> with the model of ``model_dir``."""
    body = payloads.definition(("bench", "scale", n), "NONE")
    body["path"] = model_dir.as_uri()
    body["flavor"] = FLAVOR
    body["fqrv"]["release_version"] = version
    return body


def seed(data_dir: Path, model_dir: Path, contracts: int) -> None:
    """The releases in the gateway's file store, written in one change."""
    docs: dict[str, Any] = {}
    for n in range(contracts):
        defn = parse_serve_request(release(model_dir, n))
        docs[f"servable/{defn.fqrv}"] = serve_request_to_json(defn)
    asyncio.run(FileStore(data_dir / "state" / "registry.json").apply(docs))


#: Seconds a started gateway is left to settle before it is stopped or measured: its first evaluation and a
#: counter flush (every 1 s by default) written. --smoke: just over one flush.
SETTLE_S = 3.0


def restart(data_dir: Path, env: dict[str, str], work: Path, name: str) -> tuple[Server, float]:
    """A gateway started once on ``data_dir`` (it persists the counters and routing of the seeded
    releases, as a gateway that deployed them would have), stopped, and started again: returned
    with the seconds from the second start to ready."""
    first = start_gateway(data_dir, env, work, f"{name}-first", pin=False)
    time.sleep(SETTLE_S)  # its first evaluation and flush of every release are written
    first.stop()
    started = time.perf_counter()
    server = start_gateway(data_dir, env, work, name, pin=False)
    return server, time.perf_counter() - started


def score_ms(server: Server, n: int) -> float:
    started = time.perf_counter()
    r = requests.post(f"{server.url}/bench/scale/{n}/score", data=BODY, headers=HEADERS, timeout=120)
    r.raise_for_status()
    return (time.perf_counter() - started) * 1000


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def warm_side_by_side(many: Server, few: Server, rounds: int, seconds: float) -> tuple[list[Result], list[Result]]:
    """``rounds`` warm c4 runs of release 0 on both gateways at once, both pinned to core 0 (wrk runs
    on core 1), so each gets half of one core. Unpinned, the kernel's placement decided the ratio:
    two identical 10-contract gateways side by side differed by 2-5x in req/s (load average ~10)."""
    for server in (many, few):
        pin_process(server.proc.pid, 0)
    runs = [side_by_side(many, few, "/bench/scale/0/score", BODY, "application/json", 4, seconds) for _ in range(rounds)]
    return [r[0] for r in runs], [r[1] for r in runs]


def ratios(many: list[Result], few: list[Result]) -> str:
    """Median p50, p99 and req/s of each side and the medians of the runs' ratios."""
    med = statistics.median

    def side(runs: list[Result]) -> str:
        p50, p99, rps = (med(getattr(r, name) for r in runs) for name in ("p50_ms", "p99_ms", "rps"))
        return f"p50 {p50:.2f} ms p99 {p99:.2f} ms ({rps:.0f} req/s)"

    pairs = list(zip(many, few, strict=True))
    return (
        f"{side(many)} against {side(few)}; ratios (median of {len(pairs)}): p50 "
        f"{med(a.p50_ms / b.p50_ms for a, b in pairs):.2f}, p99 {med(a.p99_ms / b.p99_ms for a, b in pairs):.2f}, "
        f"req/s {med(a.rps / b.rps for a, b in pairs):.2f}; errors {sum(r.errors for r in many)} / {sum(r.errors for r in few)}"
    )


def deploy_ms(server: Server, model_dir: Path, first: int, count: int) -> float:
    """Mean milliseconds of ``count`` deploys of new contracts through the admin API."""
    started = time.perf_counter()
    for n in range(first, first + count):
        r = requests.post(server.url + "/servable", json=release(model_dir, n), timeout=120)
        r.raise_for_status()
    return (time.perf_counter() - started) * 1000 / count


def metric(server: Server, name: str) -> float:
    """One unlabelled figure of the gateway's /metrics (0 when absent)."""
    for line in requests.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def resident_mb(server: Server) -> float:
    return metric(server, "forestflow_release_resident_bytes") / 2**20


def loads_done(server: Server) -> int:
    return int(metric(server, "forestflow_release_loads_total"))


def evictions(server: Server) -> int:
    return int(metric(server, "forestflow_release_evictions_total"))


def release_mb(work: Path, model: Path, env: dict[str, str]) -> float:
    """The memory budget's own count of one release (MiB): one release loaded on a probe gateway
    with a budget far larger than it."""
    probe = start_gateway(work / "probe", {**env, "FORESTFLOW_MODEL_MEMORY_BUDGET_MB": "100000"}, work, "probe", pin=False)
    try:
        requests.post(probe.url + "/servable", json=release(model, 0), timeout=120).raise_for_status()
        score_ms(probe, 0)
        return resident_mb(probe)
    finally:
        probe.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", choices=sorted(FLAVORS), default="gbm", help="gbm: the small H2O GBM; trees100: XGBoost, 100 trees of depth 6"
    )
    parser.add_argument(
        "--contracts", type=int, help="releases on the big gateway (one contract each; 10,000, or 1,000 with trees100)"
    )
    parser.add_argument("--cold", type=int, default=200, help="distinct cold releases requested (cold p99, RSS)")
    parser.add_argument(
        "--budget-mb", type=int, help="model_memory_budget_mb of the budget gateway (gbm: 4; trees100: a tenth of all releases)"
    )
    parser.add_argument("--deploys", type=int, default=50, help="deploys timed on each gateway")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each warm side-by-side run")
    parser.add_argument("--rounds", type=int, default=3, help="warm side-by-side runs per cell (medians printed)")
    parser.add_argument("--smoke", action="store_true", help="40 contracts, 10 cold, 5 deploys, 1 round of 0.5 s")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and gateway logs")
    args = parser.parse_args()
    global FLAVOR, SETTLE_S
    FLAVOR = FLAVORS[args.model]
    if args.contracts is None:
        args.contracts = 1_000 if args.model == "trees100" else 10_000
    if args.smoke:
        args.contracts, args.cold, args.deploys, args.seconds, args.rounds = 40, 10, 5, 0.5, 1
        SETTLE_S = 1.2
    work = Path(tempfile.mkdtemp(prefix="ff-scale-"))
    model = work / "model"
    model.mkdir()
    if args.model == "trees100":
        file = model / FLAVOR["XGBoost"]["modelPath"]
        train_trees100(file)
        described = "one XGBoost model of 100 trees of depth 6"
    else:
        file = model / "gbm.zip"
        shutil.copy(payloads.FIXTURE.with_suffix(".zip"), file)
        described = "one GBM"
    size = file.stat().st_size
    print(f"# {args.contracts} contracts of {described} ({size} B model file); logs under {work}; machine may be loaded")
    started = time.perf_counter()
    for name in ("big", "budget", "warming"):
        seed(work / name, model, args.contracts)
    print(f"seed {args.contracts} releases into three file stores: {time.perf_counter() - started:.2f} s")
    lazy = {"FORESTFLOW_LAZY_LOADING": "1", "FORESTFLOW_WARM_CONCURRENCY": "0", "FORESTFLOW_ACCESS_LOG": "0"}
    if args.budget_mb is None and args.model == "gbm":
        args.budget_mb = 4
    elif args.budget_mb is None:
        one = release_mb(work, model, lazy)
        args.budget_mb = max(1, math.ceil(one * args.contracts / 10))
        print(
            f"one release by the budget's count: {one:.2f} MiB; all {args.contracts}: {one * args.contracts:.0f} MiB; "
            f"budget {args.budget_mb} MiB (about {args.budget_mb / one:.0f} releases)"
        )
    servers: list[Server] = []
    try:
        big, ready_s = restart(work / "big", lazy, work, "big")
        servers.append(big)
        first_ms = score_ms(big, args.contracts - 1)
        print(
            f"restart to ready with {args.contracts} releases: {ready_s:.2f} s; first answer of a cold release {first_ms:.1f} ms"
        )
        budget_env = {**lazy, "FORESTFLOW_MODEL_MEMORY_BUDGET_MB": str(args.budget_mb)}
        budgeted, _ = restart(work / "budget", budget_env, work, "budget")
        servers.append(budgeted)
        score_ms(budgeted, args.contracts - 1)
        time.sleep(min(2.0, SETTLE_S))  # both settled: their first flush and evaluation done
        rss_before = big.rss_mb(), budgeted.rss_mb()
        cold = [score_ms(big, n) for n in range(args.cold)]
        for n in range(args.cold):
            score_ms(budgeted, n)
        print(
            f"cold requests ({args.cold} distinct releases): p50 {percentile(cold, 50):.1f} ms, "
            f"p99 {percentile(cold, 99):.1f} ms, max {max(cold):.1f} ms"
        )
        print(
            f"RSS MiB after ready and one answer: no budget {rss_before[0]:.0f}, budget {rss_before[1]:.0f}; after "
            f"{args.cold} releases used: no budget {big.rss_mb():.0f} (+{big.rss_mb() - rss_before[0]:.0f}), budget "
            f"{args.budget_mb} MiB {budgeted.rss_mb():.0f} (+{budgeted.rss_mb() - rss_before[1]:.0f}; "
            f"resident by the budget's count {resident_mb(budgeted):.1f} MiB, {loads_done(budgeted)} loads, "
            f"{evictions(budgeted)} evictions); model files {args.cold * size / 2**20:.1f} MiB"
        )
        started = time.perf_counter()
        # The same settings as the big gateway: only the number of releases differs between the two.
        small = start_gateway(work / "small", lazy, work, "small", pin=False)
        servers.append(small)
        print(
            f"start to ready of an empty gateway (the process alone, same run): {time.perf_counter() - started:.2f} s; "
            f"with {args.contracts} releases {ready_s:.2f} s"
        )
        small_deploy = deploy_ms(small, model, 0, 10)
        score_ms(small, 0)  # warm, as release 0 of the big gateway is
        many, few = warm_side_by_side(big, small, args.rounds, args.seconds)
        print(f"warm c4 {args.rounds} x {args.seconds:g} s side by side, {args.contracts} contracts vs 10: {ratios(many, few)}")
        # The background warm-up (warm_concurrency 2) loading releases while the warm release is driven.
        warming, _ = restart(work / "warming", {**lazy, "FORESTFLOW_WARM_CONCURRENCY": "2"}, work, "warming")
        servers.append(warming)
        score_ms(warming, 0)
        loads_before = loads_done(warming)
        during, few = warm_side_by_side(warming, small, args.rounds, args.seconds)
        print(
            f"warm c4 {args.rounds} x {args.seconds:g} s during the background warm-up ({loads_before} loads done before, "
            f"{loads_done(warming)} after), "
            f"{args.contracts} contracts vs 10: {ratios(during, few)}"
        )
        warming.stop()
        servers.remove(warming)
        big_deploy = deploy_ms(big, model, args.contracts, args.deploys)
        small_deploy = statistics.mean([small_deploy, deploy_ms(small, model, 10, args.deploys)])
        print(
            f"deploy through the admin API: {big_deploy:.1f} ms per release into {args.contracts} releases, "
            f"{small_deploy:.1f} ms into ~10 (ratio {big_deploy / small_deploy:.1f})"
        )
    finally:
        for server in servers:
            server.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
