"""The same XGBoost and LightGBM models served by MLServer 1.7 and by forestflow, side by side, one run.

Both servers read the same model files (100 trees of depth 6 on 8 numeric features, binary, the
tree-models issue's size, saved by ./.venv's xgboost and lightgbm): MLServer 1.7.1 with its
``mlserver-xgboost`` / ``mlserver-lightgbm`` runtimes (one process, ``parallel_workers`` 0, from
./.venv-mlserver-trees, which this script makes: bench/mlserver-trees-requirements.txt under
bench/mlserver-trees-constraints.txt), forestflow with its native XGBoost / LightGBM flavors.

Every cell sends the same V2 REST infer body to both: "np", one FP32 ``[N, 8]`` tensor, or "pd", one FP32
tensor per feature with ``"parameters": {"content_type": "pd"}`` (MLServer then decodes a DataFrame), at
1 and 100 rows. Before timing, both servers' answers to every body are compared with the library's
own prediction (MLServer's ``predict`` output, forestflow's output ``"1"``; relative 1e-6, XGBoost
computes in float32).

The two servers run at the same time pinned to core 0 (taskset), each loaded by its own wrk on core 1
at the same concurrency for the same seconds (bench/servers.side_by_side), so whatever slows the core
slows both. Per cell: the medians over the rounds of each server's req/s, CPU per request (its
process tree's user + system time from /proc over its requests), p50/p99 and, after the cell, RSS;
and the ratio MLServer CPU/request over forestflow CPU/request, i.e. forestflow's req/s per core over
MLServer's. Target, per cell: >= 4x (a HOLDS/MISSED line each).

    python bench/same_model.py                              # 2 models x np/pd x 1/100 rows x c16/c64, 5 rounds of 3 s
    python bench/same_model.py --models xgboost --bodies np --rows 1 --concurrency 16 --rounds 9
    python bench/same_model.py --smoke                      # one short round of the xgboost np 1-row c16 cell
    python bench/same_model.py --profile --models lightgbm  # where forestflow's CPU goes per cell instead (py-spy)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.driver import Result  # noqa: E402
from bench.servers import Server, deploy_body, free_port, pinned, side_by_side, start_gateway  # noqa: E402

VENV = ROOT / ".venv-mlserver-trees"
REQUIREMENTS = ROOT / "bench" / "mlserver-trees-requirements.txt"
CONSTRAINTS = ROOT / "bench" / "mlserver-trees-constraints.txt"
N_FEATURES = 8
FEATURES = [f"f{j}" for j in range(N_FEATURES)]
#: forestflow's req/s per core (MLServer's CPU per request over forestflow's) at least this, every cell.
TARGET = 4.0
CORE = 0
#: model -> (MLServer implementation, model file, forestflow flavor, forestflow contract).
MODELS: dict[str, tuple[str, str, str, tuple[str, str, int]]] = {
    "xgboost": ("mlserver_xgboost.XGBoostModel", "model.json", "XGBoost", ("bench", "samexgb", 1)),
    "lightgbm": ("mlserver_lightgbm.LightGBMModel", "model.txt", "LightGBM", ("bench", "samelgb", 1)),
}
#: wrk's per-request timeout: MLServer's p99 at c64 on a shared core passes wrk's default 2 s, and a
#: request it answers after the timeout would cost it CPU without counting as served.
TIMEOUT_S = 30.0
#: One thread of OpenMP in both servers' libraries (each is pinned to one core anyway).
THREADS_ENV = {"OMP_NUM_THREADS": "1"}


# ---- MLServer's venv ---------------------------------------------------------------------------
def ensure_venv() -> Path:
    """./.venv-mlserver-trees with MLServer and its two tree runtimes (instant when already made; two
    processes calling this at once: one installs, under a lock); its ``mlserver`` executable."""
    wanted = REQUIREMENTS.read_text() + CONSTRAINTS.read_text()
    marker = VENV / "requirements.installed"

    def current() -> bool:
        return (VENV / "bin" / "mlserver").exists() and marker.exists() and marker.read_text() == wanted

    if not current():
        with open(ROOT / ".venv-mlserver-trees.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not current():
                print(f"# making {VENV} (a minute or two)", flush=True)
                python = os.environ.get("PYTHON", "python3")
                if not (VENV / "bin" / "python").exists():
                    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
                pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
                subprocess.run([*pip, "--upgrade", "pip"], check=True)
                subprocess.run([*pip, "-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS)], check=True)
                marker.write_text(wanted)
    return VENV / "bin" / "mlserver"


# ---- models and bodies -------------------------------------------------------------------------
def train(models: Path, trees: int, depth: int) -> dict[str, Any]:
    """Both models, each in ``models/<name>/`` with MLServer's model-settings.json; name -> a function
    giving the library's own prediction (probability of class 1) for a float64 matrix."""
    import lightgbm as lgb
    import xgboost as xgb

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, N_FEATURES))
    y = (X[:, 0] + X[:, 1] * X[:, 2] - X[:, 3] > 0).astype(int)
    for name, (implementation, file, _, _) in MODELS.items():
        (models / name).mkdir(parents=True, exist_ok=True)
        settings = {"name": name, "implementation": implementation, "parameters": {"uri": f"./{file}", "version": "1"}}
        (models / name / "model-settings.json").write_text(json.dumps(settings))
    dtrain = xgb.DMatrix(X, y, feature_names=FEATURES)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": depth, "nthread": 1}, dtrain, trees)
    booster.save_model(str(models / "xgboost" / MODELS["xgboost"][1]))
    params = {"objective": "binary", "num_leaves": 2**depth, "max_depth": depth, "verbose": -1, "num_threads": 1}
    gbm = lgb.train(params, lgb.Dataset(X, y, feature_name=FEATURES), trees)
    gbm.save_model(str(models / "lightgbm" / MODELS["lightgbm"][1]))
    return {
        "xgboost": lambda m: booster.inplace_predict(m),
        "lightgbm": lambda m: gbm.predict(m, num_threads=1),
    }


def rows_matrix(rows: int) -> np.ndarray:
    """``rows`` request rows: multiples of 1/64, exact in float32 and in short decimals, so both servers
    parse the same numbers whatever precision they read FP32 data in."""
    rng = np.random.default_rng(rows)
    return np.round(rng.normal(size=(rows, N_FEATURES)) * 64) / 64


def body(kind: str, X: np.ndarray) -> bytes:
    """The V2 infer body: "np" (one ``[N, F]`` tensor) or "pd" (one tensor per feature, content type pd)."""
    n = len(X)
    if kind == "np":
        tensor = {"name": "input-0", "shape": [n, N_FEATURES], "datatype": "FP32", "data": X.ravel().tolist()}
        return orjson.dumps({"inputs": [tensor]})
    inputs = [{"name": f, "shape": [n], "datatype": "FP32", "data": X[:, j].tolist()} for j, f in enumerate(FEATURES)]
    return orjson.dumps({"parameters": {"content_type": "pd"}, "inputs": inputs})


# ---- servers -----------------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:
                pass
    return out


class TreeServer(Server):
    """A Server whose CPU time and RSS are its whole process tree's (a server that forks is not
    flattered)."""

    def cpu_s(self) -> float:
        total = 0
        for pid in _tree(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def rss_mb(self, field: str = "VmRSS") -> float:
        total = 0.0
        for pid in _tree(self.proc.pid):
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in lines if line.startswith(field + ":")), 0) / 1024
        return total


class MLServer(TreeServer):
    def stop(self) -> None:
        """The process group (MLServer's children too, if any); once stopped, nothing."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_mlserver(mlserver: Path, models: Path, log: Path, timeout_s: float = 180.0) -> MLServer:
    """``mlserver start models`` pinned to core 0, one process; returned once both models are ready."""
    port = free_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_endpoint": None,
        "metrics_dir": str(models / ".metrics"),
        "parallel_workers": 0,
        "debug": False,
    }
    (models / "settings.json").write_text(json.dumps(settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSERVER_")} | THREADS_ENV
    proc = subprocess.Popen(
        pinned(CORE, [str(mlserver), "start", str(models)]),
        cwd=models,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = MLServer(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlserver exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            if all(requests.get(f"{server.url}/v2/models/{m}/ready", timeout=1).status_code == 200 for m in MODELS):
                return server
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"mlserver not ready: {log.read_text()[-3000:]}")
        time.sleep(0.1)


def definition(models: Path, name: str) -> dict[str, Any]:
    """forestflow's servable definition of the model ``name`` (trained by :func:`train` under ``models``)."""
    _, file, flavor, (org, project, n) = MODELS[name]
    return {
        "path": (models / name).as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": "r1"},
        "flavor": {flavor: {"modelPath": file}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE", "keyFeatures": []},
        },
    }


def start_forestflow(work: Path, models: Path) -> TreeServer:
    """A gateway pinned to core 0 with both models deployed through the admin API."""
    gw = start_gateway(work / "data-forestflow", THREADS_ENV, work, "forestflow", cpu=CORE)
    server = TreeServer(gw.proc, gw.url)
    for name in MODELS:
        deploy_body(server, definition(models, name))
    return server


def paths(model: str) -> tuple[str, str]:
    """(forestflow's, MLServer's) V2 infer path of ``model``."""
    return f"/v2/models/{'.'.join(map(str, MODELS[model][3]))}/infer", f"/v2/models/{model}/infer"


def check_answers(ff: Server, ml: Server, predict: dict[str, Any], models: list[str], kinds: list[str], rows: list[int]) -> None:
    """Both servers answer every body with the library's prediction (SystemExit naming the cell if not)."""
    for model in models:
        ff_path, ml_path = paths(model)
        for n in rows:
            X = rows_matrix(n)
            expected = np.asarray(predict[model](X), dtype=np.float64)
            for kind in kinds:
                b = body(kind, X)
                ours = requests.post(ff.url + ff_path, data=b, headers={"Content-Type": "application/json"}, timeout=30)
                theirs = requests.post(ml.url + ml_path, data=b, headers={"Content-Type": "application/json"}, timeout=30)
                if ours.status_code != 200 or theirs.status_code != 200:
                    raise SystemExit(
                        f"{model} {kind} {n}-row: forestflow {ours.status_code} {ours.text[:300]}; "
                        f"MLServer {theirs.status_code} {theirs.text[:300]}"
                    )
                got_ff = np.asarray(next(o["data"] for o in ours.json()["outputs"] if o["name"] == "1"), dtype=np.float64)
                got_ml = np.asarray(next(o["data"] for o in theirs.json()["outputs"] if o["name"] == "predict"), dtype=np.float64)
                for who, got in (("forestflow", got_ff), ("MLServer", got_ml)):
                    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-6, atol=0):
                        raise SystemExit(f"{model} {kind} {n}-row: {who} answered {got[:5]}, the library {expected[:5]}")
    cells = f"{', '.join(models)} x {', '.join(kinds)} x {rows} rows"
    print(f"# answers checked: both servers give the library's predictions (rtol 1e-6) for {cells}", flush=True)


# ---- cells -------------------------------------------------------------------------------------
@dataclass
class Cell:
    """One (model, body, rows, concurrency) cell: its rounds' side-by-side results."""

    model: str
    kind: str
    rows: int
    concurrency: int
    ff: list[Result] = field(default_factory=list)
    ml: list[Result] = field(default_factory=list)
    rss: tuple[float, float] = (float("nan"), float("nan"))

    def ratio(self) -> float:
        """Median over the rounds of MLServer CPU/request over forestflow's (req/s per core ratio)."""
        return statistics.median(m.cpu_us / f.cpu_us for f, m in zip(self.ff, self.ml))

    def rps_ratio(self) -> float:
        return statistics.median(f.rps / m.rps for f, m in zip(self.ff, self.ml))

    def errors(self, side: str) -> int:
        return sum(r.errors for r in (self.ff if side == "ff" else self.ml))

    def holds(self) -> bool:
        """The target, with every request answered by both (a request one server answers after wrk gave
        up on it costs that server CPU but counts as no request)."""
        return self.ratio() >= TARGET and self.errors("ff") == 0 and self.errors("ml") == 0

    def row(self) -> str:
        def med(rs: list[Result], attr: str) -> float:
            return statistics.median(getattr(r, attr) for r in rs)

        return (
            f"| {self.model} | {self.kind} | {self.rows} | c{self.concurrency} "
            f"| {med(self.ff, 'rps'):.0f} | {med(self.ml, 'rps'):.0f} | {self.rps_ratio():.2f}x "
            f"| {med(self.ff, 'cpu_us'):.0f} | {med(self.ml, 'cpu_us'):.0f} | **{self.ratio():.2f}x** "
            f"| {med(self.ff, 'p50_ms'):.1f} / {med(self.ff, 'p99_ms'):.1f} "
            f"| {med(self.ml, 'p50_ms'):.1f} / {med(self.ml, 'p99_ms'):.1f} "
            f"| {self.rss[0]:.0f} / {self.rss[1]:.0f} | {self.errors('ff')} / {self.errors('ml')} |"
        )


HEADER = (
    "| model | body | rows | conc. | forestflow req/s | MLServer req/s | req/s ratio | forestflow CPU/req (us) "
    "| MLServer CPU/req (us) | req/s per core ratio | forestflow p50 / p99 (ms) | MLServer p50 / p99 (ms) "
    "| RSS MiB ff / MLServer | errors ff / MLServer |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def measure(args: argparse.Namespace, ff: Server, ml: Server) -> list[Cell]:
    cells = []
    print(HEADER, flush=True)
    for model in args.models:
        ff_path, ml_path = paths(model)
        for kind in args.bodies:
            for rows in args.rows:
                b = body(kind, rows_matrix(rows))
                ctype = "application/json"
                for conc in args.concurrency:
                    cell = Cell(model, kind, rows, conc)
                    other = (ml_path, b, ctype, {})
                    if args.warmup:
                        side_by_side(ff, ml, ff_path, b, ctype, conc, args.warmup, other=other, timeout_s=TIMEOUT_S)
                    for _ in range(args.rounds):
                        a, m = side_by_side(ff, ml, ff_path, b, ctype, conc, args.seconds, other=other, timeout_s=TIMEOUT_S)
                        cell.ff.append(a)
                        cell.ml.append(m)
                    cell.rss = (ff.rss_mb(), ml.rss_mb())
                    print(cell.row(), flush=True)
                    cells.append(cell)
    return cells


def cpu_us(call: Any, seconds: float = 1.0) -> float:
    """CPU microseconds per call of ``call`` (this process's time, robust to the machine's other work)."""
    for _ in range(20):
        call()
    n, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        call()
        n += 1
    return (time.process_time() - start) / n * 1e6


def in_process(models: Path, names: list[str], rows: list[int]) -> None:
    """The scoring alone: CPU per predict of forestflow's servable (a Frame of float64 columns, as the
    codecs build it) against the library's own predict on the float32 matrix MLServer gives it, one thread."""
    import lightgbm as lgb
    import xgboost as xgb

    from forestflow.core.frame import Frame
    from forestflow.core.ids import FQRV
    from forestflow.runtime.flavors import create_servable

    booster = xgb.Booster(model_file=str(models / "xgboost" / MODELS["xgboost"][1]))
    booster.set_param({"nthread": 1})
    gbm = lgb.Booster(model_file=str(models / "lightgbm" / MODELS["lightgbm"][1]))
    library = {"xgboost": booster.inplace_predict, "lightgbm": lambda m: gbm.predict(m, num_threads=1)}
    print("# in process, one thread: CPU per predict call, forestflow's servable / the library's predict")
    for name in names:
        _, file, flavor, _ = MODELS[name]
        servable = create_servable(flavor, FQRV.parse("bench.same.1.r1"), models / name, {"modelPath": file})
        servable.load()
        for n in rows:
            X = rows_matrix(n)
            frame = Frame({f: np.ascontiguousarray(X[:, j]) for j, f in enumerate(FEATURES)})
            ours = cpu_us(lambda s=servable, fr=frame: s.predict(fr))
            X32 = X.astype(np.float32)
            theirs = cpu_us(lambda p=library[name], m=X32: p(m))
            print(f"{name:8} {n:>4} rows: forestflow {ours:.0f} us, library {theirs:.0f} us", flush=True)


def profile(args: argparse.Namespace, ff: Server, work: Path) -> None:
    """forestflow alone under load (c16) per (model, body, rows), sampled with py-spy as bench/profile.py
    does: its category table, then each cell's innermost functions with most samples; then the scoring
    alone in process against the library."""
    from bench.profile import print_table, profile_cell

    cells = []
    for model in args.models:
        for kind in args.bodies:
            for rows in args.rows:
                name = f"{model}-{kind}-{rows}"
                b = body(kind, rows_matrix(rows))
                prof, rps, cpu_us = profile_cell(ff, work, name, paths(model)[0], b, "application/json", 2 * args.seconds, 500)
                cells.append((name, prof, rps, cpu_us))
    print_table(cells)
    for name, prof, _, _ in cells:
        print(f"\n# {name}: innermost functions with most samples (category: function (file))")
        for (category, leaf), n in prof.by_leaf.most_common(12):
            print(f"{100.0 * n / prof.samples:6.1f}%  {category}: {leaf}")
    in_process(work / "models", args.models, args.rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--bodies", nargs="+", default=["np", "pd"], choices=["np", "pd"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64], help="per server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per cell (0: none)")
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="one 1-s round of the xgboost np 1-row c16 cell, no warm-up")
    parser.add_argument("--profile", action="store_true", help="profile forestflow per cell (py-spy) instead of timing")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.bodies, args.rows, args.concurrency = ["xgboost"], ["np"], [1], [16]
        args.rounds, args.seconds, args.warmup = 1, 1.0, 0.0
    mlserver = ensure_venv()
    work = Path(tempfile.mkdtemp(prefix="ff-same-model-"))
    models = work / "models"  # deployed from and MLServer's model repository: no data dir inside
    predict = train(models, args.trees, args.depth)
    print(
        f"# logs and models under {work}; {args.trees} trees of depth {args.depth}, {N_FEATURES} features, binary; "
        f"both servers on core {CORE}, each loaded by its own wrk on core 1; medians of {args.rounds} round(s) of "
        f"{args.seconds:.0f} s; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    servers: list[Server] = []
    try:
        servers.append(ml := start_mlserver(mlserver, models, work / "mlserver.log"))
        servers.append(ff := start_forestflow(work, models))
        check_answers(ff, ml, predict, args.models, args.bodies, sorted({1, 100, *args.rows}))
        if args.profile:
            ml.stop()
            profile(args, ff, work)
            return 0
        cells = measure(args, ff, ml)
    finally:
        for server in servers:
            server.stop()
    for cell in cells:
        print(
            f"forestflow req/s per core >= {TARGET:.0f}x MLServer's ({cell.model}, {cell.kind}, {cell.rows} row, "
            f"c{cell.concurrency}): {cell.ratio():.2f}x {'HOLDS' if cell.holds() else 'MISSED'}"
        )
    print(f"# {sum(c.holds() for c in cells)} of {len(cells)} target lines hold; load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
