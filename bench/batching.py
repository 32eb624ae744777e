"""Micro-batching on vs off: ONNX, 1-row /score requests at c64, two gateways side by side.

Both gateways run at once, pinned to core 0 and each loaded by its own wrk (core 1) at the same
concurrency for the same seconds, so whatever slows the machine slows both. The "off" gateway has
``FORESTFLOW_MAX_BATCH_ROWS=0`` (no combined calls, neither on threads nor on the event loop);
the "on" one the defaults (plus ``--env`` settings). Printed: per round both gateways' req/s and p99
and the servable's batching counters, then the medians of the on/off ratios and the target line

    batching onnx c64 1-row: <x>x req/s, p99 <y>x ... HOLDS|MISSED

(target: >= 2x the req/s at <= 2x the p99).

    python bench/batching.py                    # 5 rounds of 4 s
    python bench/batching.py --rounds 3 --seconds 3 --env FORESTFLOW_MAX_BATCH_WAIT_US=200
    python bench/batching.py --flavor inlineMaxRows=0   # scored on threads instead of the event loop
    python bench/batching.py --model-cost               # one ONNX predict call of 1, 8, 64 rows, in process
    python bench/run.py --only batching         # the same, from the matrix script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import Server, endpoints, side_by_side, start_gateway  # noqa: E402

CONTRACT = ("bench", "onnx", 1)
CONCURRENCY = 64


@dataclass
class Outcome:
    """Medians over the rounds of the on/off ratios."""

    rps_ratio: float
    p99_ratio: float

    @property
    def holds(self) -> bool:
        return self.rps_ratio >= 2.0 and self.p99_ratio <= 2.0

    def line(self) -> str:
        return (
            f"batching onnx c{CONCURRENCY} 1-row: {self.rps_ratio:.2f}x req/s, p99 {self.p99_ratio:.2f}x "
            f"(target >= 2x req/s at p99 <= 2x) {'HOLDS' if self.holds else 'MISSED'}"
        )


def _deploy_onnx(server: Server, work: Path, flavor: dict[str, Any]) -> None:
    directory = work / f"onnx-{server.proc.pid}"  # its own directory: the artifact fetch copies it whole
    directory.mkdir()
    model_file = payloads.onnx_model(directory)
    if model_file is None:
        raise SystemExit("the batching cell needs scikit-learn and skl2onnx (the test extra)")
    definition = payloads.onnx_definition(CONTRACT, directory, model_file)
    definition["flavor"]["ONNX"].update(flavor)
    r = requests.post(server.url + "/servable", json=definition, timeout=120)
    r.raise_for_status()


def _counters(server: Server) -> dict[str, int]:
    stats = requests.get(server.url + "/metrics/json", timeout=10).json()["schedulers"]
    return next(iter(stats.values()), {})


def measure(work: Path, rounds: int, seconds: float, env_on: dict[str, str], flavor: dict[str, Any] | None = None) -> Outcome:
    """Start both gateways, deploy the ONNX GBM twin on each, run the rounds, return the ratios."""
    servers: list[Server] = []
    try:
        on = start_gateway(work / "data-batching-on", env_on, work, "gateway-batching-on")
        servers.append(on)
        off = start_gateway(work / "data-batching-off", {"FORESTFLOW_MAX_BATCH_ROWS": "0"}, work, "gateway-batching-off")
        servers.append(off)
        for server in servers:
            _deploy_onnx(server, work, flavor or {})
        path, body, ctype = endpoints(1, ".".join(map(str, CONTRACT)))["score"]
        side_by_side(on, off, path, body, ctype, CONCURRENCY, 2.0)  # warm-up
        rps: list[float] = []
        p99: list[float] = []
        for round_no in range(rounds):
            a, b = side_by_side(on, off, path, body, ctype, CONCURRENCY, seconds)
            rps.append(a.rps / b.rps if b.rps else float("nan"))
            p99.append(a.p99_ms / b.p99_ms if b.p99_ms else float("nan"))
            print(
                f"round {round_no}: on {a.rps:.0f} req/s p99 {a.p99_ms:.2f} ms ({a.cpu_us:.0f} CPU us/req), "
                f"off {b.rps:.0f} req/s p99 {b.p99_ms:.2f} ms ({b.cpu_us:.0f} CPU us/req); errors {a.errors + b.errors}",
                flush=True,
            )
        print(f"# counters on: {_counters(on)}", flush=True)
        print(f"# counters off: {_counters(off)}", flush=True)
    finally:
        for server in servers:
            server.stop()
    return Outcome(statistics.median(rps), statistics.median(p99))


def model_cost(work: Path) -> None:
    """In process: wall-clock microseconds of one ONNX ``predict`` call of 1, 8 and 64 rows (what a
    combined call saves is the per-call part)."""
    import time

    import numpy as np

    from forestflow.core.frame import Frame
    from forestflow.core.ids import FQRV, Contract
    from forestflow.runtime.onnx_flavor import OnnxServable

    model_file = payloads.onnx_model(work)
    if model_file is None:
        raise SystemExit("needs scikit-learn and skl2onnx (the test extra)")
    settings = {"modelPath": model_file, "featureOrder": {"cat": payloads.CATEGORICAL, "num": payloads.NUMERIC}}
    servable = OnnxServable(FQRV(Contract("bench", "cost", 1), "r"), work, settings)
    servable.load()
    rows = payloads.rows(64)
    for n in (1, 8, 64):
        columns = {c: np.array([r[c] for r in rows[:n]], dtype=object) for c in payloads.CATEGORICAL}
        columns.update({c: np.array([float(r[c]) for r in rows[:n]]) for c in payloads.NUMERIC})
        frame = Frame(columns)
        servable.predict(frame)
        calls = 300
        started = time.perf_counter()
        for _ in range(calls):
            servable.predict(frame)
        us = (time.perf_counter() - started) / calls * 1e6
        print(f"ONNX predict of {n:>2} row(s): {us:.0f} us per call, {us / n:.1f} us per row", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the batching-on gateway only")
    parser.add_argument(
        "--flavor", action="append", default=[], help="KEY=INT ONNX flavor setting on both (e.g. inlineMaxRows=0: threads)"
    )
    parser.add_argument("--model-cost", action="store_true", help="only time one predict call of 1, 8, 64 rows in process")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ff-batching-"))
    if args.model_cost:
        model_cost(work)
        return 0
    print(f"# logs under {work}; ONNX GBM twin, 1-row /score, c{CONCURRENCY} per gateway, side by side", flush=True)
    flavor = {key: int(value) for key, value in (item.split("=", 1) for item in args.flavor)}
    outcome = measure(work, args.rounds, args.seconds, dict(item.split("=", 1) for item in args.env), flavor)
    print(outcome.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
