"""The gateway in front of MLServer (a RemoteV2 servable) against MLServer called directly, in one run.

Two measurements per cell (V2 REST infer, 1 and 100 rows, c16; the gateway calls MLServer over REST
or over gRPC), both taken side by side, the two sides loaded at the same moment by their own wrk:

- **direct vs through.** Two MLServers serve the same iris model, both pinned to core 0: one is
  called directly, the other through a gateway on core 1 (with the load generators). Whatever slows
  core 0 slows both MLServers, and MLServer is the bottleneck of both paths, so the ratio of their
  req/s says how much the gateway takes from what MLServer can serve. Printed: req/s of both, the
  latency the gateway adds (p50, p99; at c16 both paths queue at MLServer, so this is mostly queueing,
  not the hop), and each process's CPU per request.
- **remote vs local.** The gateway in front of MLServer and a second gateway serving the local twin of
  the model in process (tests/fixtures/servables/iris_twin, a Python servable with the same weights,
  inputs and outputs), both on core 1: the ratio of their CPU per request is what forwarding costs the
  gateway against scoring in process, for the same protocol cell.

Targets (one line each, ending HOLDS or MISSED): the gateway's CPU per request <= 1.5x its in-process
cost for the same protocol cell, and throughput through the gateway >= 0.9x MLServer direct.

    python bench/remote.py                      # rest and grpc, 1 and 100 rows, 5 rounds of 3 s
    python bench/remote.py --protocols grpc --rows 1 --rounds 9
    python bench/remote.py --smoke              # one short round of the 1-row REST cell (the tests run it)

Needs ./.venv-mlserver (``bash scripts/mlserver_venv.sh``; made here when missing).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.driver import Result, drive  # noqa: E402
from bench.servers import Server, side_by_side, start_gateway  # noqa: E402
from tests.remote_backends import IRIS_MODEL, IRIS_ROWS, IRIS_VERSION, MLServerProcess, train_iris  # noqa: E402

#: The contract of each protocol's cell (on the twin's gateway, the twin serves both).
CONTRACTS = {"rest": ("bench", "remote", 1), "grpc": ("bench", "remote", 2)}
#: Gateway CPU per request forwarding to MLServer, at most this many times its in-process cost.
CPU_TARGET = 1.5
#: Throughput through the gateway, at least this fraction of MLServer's direct throughput.
THROUGHPUT_TARGET = 0.9
MLSERVER_CORE = 0
GATEWAY_CORE = 1


class MLServerBench(Server):
    """An MLServer process as a bench Server (its CPU read from /proc like a gateway's)."""

    def __init__(self, process: MLServerProcess) -> None:
        assert process.proc is not None
        super().__init__(process.proc, process.rest_url)
        self.process = process

    def stop(self) -> None:
        self.process.stop()


def v2_body(rows: int) -> bytes:
    """A V2 infer request of ``rows`` iris rows as one ``[N, 4]`` FP64 tensor (MLServer's layout)."""
    data = [IRIS_ROWS[i % len(IRIS_ROWS)] for i in range(rows)]
    flat = [value for row in data for value in row]
    return orjson.dumps({"inputs": [{"name": "input-0", "shape": [rows, 4], "datatype": "FP64", "data": flat}]})


def definition(contract: tuple[str, str, int], release: str, flavor: dict[str, Any], path: Path | None = None) -> dict[str, Any]:
    """A servable definition on ``contract``, logging NONE."""
    org, project, n = contract
    body: dict[str, Any] = {
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": flavor,
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE", "keyFeatures": []},
        },
    }
    if path is not None:
        body["path"] = path.as_uri()
    return body


def remote_flavor(mlserver: MLServerProcess, protocol: str) -> dict[str, Any]:
    """The RemoteV2 flavor object calling ``mlserver`` over ``protocol``."""
    url = mlserver.rest_url if protocol == "rest" else mlserver.grpc_target
    return {"RemoteV2": {"url": url, "model": IRIS_MODEL, "version": IRIS_VERSION, "protocol": protocol, "timeoutMs": 10000}}


def deploy(server: Server, body: dict[str, Any]) -> None:
    r = requests.post(server.url + "/servable", json=body, timeout=120)
    if r.status_code != 200:
        raise RuntimeError(f"deploy failed: {r.status_code} {r.text}")


def infer_path(contract: tuple[str, str, int]) -> str:
    """The gateway's V2 infer path of ``contract``."""
    return f"/v2/models/{'.'.join(map(str, contract))}/infer"


@dataclass
class Cell:
    """One (protocol, rows) cell: its rounds' side-by-side figures."""

    protocol: str
    rows: int
    direct: list[Result] = field(default_factory=list)
    through: list[Result] = field(default_factory=list)
    #: MLServer CPU per request of the MLServer behind the gateway (the direct one's is in ``direct``).
    behind_cpu: list[float] = field(default_factory=list)
    #: Gateway CPU per request forwarding / serving the twin in process (remote vs local rounds).
    remote_cpu: list[float] = field(default_factory=list)
    local_cpu: list[float] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.direct + self.through)

    def throughput_ratio(self) -> float:
        return statistics.median(t.rps / d.rps for d, t in zip(self.direct, self.through))

    def cpu_ratio(self) -> float:
        return statistics.median(r / lo for r, lo in zip(self.remote_cpu, self.local_cpu))

    def lines(self, concurrency: int) -> list[str]:
        """The cell's figures and its two target lines."""

        def med(values: Any) -> float:
            return statistics.median(list(values))

        name = f"V2 REST {self.rows}-row c{concurrency}, gateway->MLServer over {self.protocol}"
        tput = self.throughput_ratio()
        cpu = self.cpu_ratio()
        ok_tput = tput >= THROUGHPUT_TARGET and self.errors == 0
        ok_cpu = cpu <= CPU_TARGET and self.errors == 0
        pairs = list(zip(self.direct, self.through))
        added_p50 = med(t.p50_ms - d.p50_ms for d, t in pairs)
        added_p99 = med(t.p99_ms - d.p99_ms for d, t in pairs)
        return [
            f"{name}: req/s direct {med(r.rps for r in self.direct):.0f}, through the gateway "
            f"{med(r.rps for r in self.through):.0f}; p50 direct {med(r.p50_ms for r in self.direct):.1f} ms, "
            f"added {added_p50:+.1f} ms; p99 direct {med(r.p99_ms for r in self.direct):.1f} ms, added {added_p99:+.1f} ms; "
            f"MLServer CPU/request direct {med(r.cpu_us for r in self.direct):.0f} us, behind the gateway "
            f"{med(self.behind_cpu):.0f} us; gateway CPU/request {med(r.cpu_us for r in self.through):.0f} us; "
            f"errors {self.errors}",
            f"{name}: gateway CPU/request forwarding {med(self.remote_cpu):.0f} us, serving the twin in process "
            f"{med(self.local_cpu):.0f} us",
            f"gateway CPU per request <= {CPU_TARGET}x its in-process cost for the same protocol cell "
            f"({self.protocol}, {self.rows} row): {cpu:.2f}x {'HOLDS' if ok_cpu else 'MISSED'}",
            f"throughput through the gateway >= {THROUGHPUT_TARGET}x MLServer direct ({self.protocol}, {self.rows} row): "
            f"{tput:.2f}x {'HOLDS' if ok_tput else 'MISSED'}",
        ]


def direct_and_through(
    direct: MLServerBench, behind: MLServerBench, gateway: Server, path: str, body: bytes, concurrency: int, seconds: float
) -> tuple[Result, Result, float]:
    """Load MLServer directly and the gateway (``path``) in front of the other MLServer at the same moment."""
    targets = {
        "direct": (direct.url + f"/v2/models/{IRIS_MODEL}/versions/{IRIS_VERSION}/infer", direct),
        "through": (gateway.url + path, gateway),
    }
    before = {"direct": direct.cpu_s(), "through": gateway.cpu_s(), "behind": behind.cpu_s()}
    results: dict[str, Result] = {}

    def load(name: str) -> None:
        results[name] = drive(targets[name][0], body, "application/json", concurrency, seconds)

    threads = [threading.Thread(target=load, args=(name,)) for name in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d, t = results["direct"], results["through"]
    d.cpu_us = (direct.cpu_s() - before["direct"]) / d.requests * 1e6 if d.requests else float("nan")
    t.cpu_us = (gateway.cpu_s() - before["through"]) / t.requests * 1e6 if t.requests else float("nan")
    behind_us = (behind.cpu_s() - before["behind"]) / t.requests * 1e6 if t.requests else float("nan")
    return d, t, behind_us


@contextlib.contextmanager
def servers(work: Path) -> Iterator[tuple[MLServerBench, MLServerBench, Server, Server]]:
    """(MLServer called directly, MLServer behind the gateway, gateway in front of it, gateway serving
    the twin); the twin and a RemoteV2 release of each protocol deployed."""
    model_dir = train_iris(work / "models")
    with contextlib.ExitStack() as stack:
        started = []
        for name in ("direct", "behind"):
            process = MLServerProcess(work / "models", work / f"mlserver-{name}.log", cpu=MLSERVER_CORE)
            # Both read settings.json from the models dir when they start: one after the other.
            process.start()
            stack.callback(process.stop)
            started.append(MLServerBench(process))
        gateways = []
        for name in ("remote", "local"):
            gw = start_gateway(work / f"data-{name}", {"FORESTFLOW_ALLOW_PYTHON": "1"}, work, f"gateway-{name}", cpu=GATEWAY_CORE)
            stack.callback(gw.stop)
            gateways.append(gw)
        twin = {"Python": {"modulePath": "twin.py", "entryPoint": "Iris"}}
        for protocol, contract in CONTRACTS.items():
            deploy(gateways[0], definition(contract, f"mlserver-{protocol}", remote_flavor(started[1].process, protocol)))
            deploy(gateways[1], definition(contract, "twin", twin, model_dir))
        yield started[0], started[1], gateways[0], gateways[1]


def measure(args: argparse.Namespace, work: Path) -> list[Cell]:
    """Every (protocol, rows) cell, each printed as soon as it is measured."""
    cells: list[Cell] = []
    with servers(work) as (direct, behind, remote, local):
        for protocol in args.protocols:
            path = infer_path(CONTRACTS[protocol])
            for rows in args.rows:
                cell = Cell(protocol, rows)
                body = v2_body(rows)
                if args.warmup:
                    direct_and_through(direct, behind, remote, path, body, args.concurrency, args.warmup)
                    side_by_side(remote, local, path, body, "application/json", args.concurrency, args.warmup)
                for _ in range(args.rounds):
                    d, t, behind_us = direct_and_through(direct, behind, remote, path, body, args.concurrency, args.seconds)
                    cell.direct.append(d)
                    cell.through.append(t)
                    cell.behind_cpu.append(behind_us)
                    a, b = side_by_side(remote, local, path, body, "application/json", args.concurrency, args.seconds)
                    cell.remote_cpu.append(a.cpu_us)
                    cell.local_cpu.append(b.cpu_us)
                    if a.errors or b.errors:
                        cell.through[-1].errors += a.errors + b.errors
                for line in cell.lines(args.concurrency):
                    print(line, flush=True)
                cells.append(cell)
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocols", nargs="+", default=["rest", "grpc"], choices=["rest", "grpc"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per cell (0: none)")
    parser.add_argument("--concurrency", type=int, default=16, help="per load generator")
    parser.add_argument("--smoke", action="store_true", help="one 1-s round of the 1-row REST cell, no warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.protocols, args.rows, args.rounds, args.seconds, args.warmup = ["rest"], [1], 1, 1.0, 0.0
    work = Path(tempfile.mkdtemp(prefix="ff-remote-"))
    print(
        f"# logs under {work}; MLServers on core {MLSERVER_CORE}, gateways and wrk on core {GATEWAY_CORE}; "
        f"medians of {args.rounds} round(s) of {args.seconds:.0f} s, each side loaded by its own wrk",
        flush=True,
    )
    cells = measure(args, work)
    held = sum(line.endswith("HOLDS") for cell in cells for line in cell.lines(args.concurrency))
    print(f"# {held} of {2 * len(cells)} target lines hold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
