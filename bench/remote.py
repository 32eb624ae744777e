"""The gateway in front of MLServer (a RemoteV2 servable) against MLServer called directly, in one run.

Two measurements per cell (V2 REST infer, 1 and 100 rows, c16; the gateway calls MLServer over REST
or over gRPC):

- **direct vs through.** One MLServer pinned to core 0 (a core of its own), the gateway and the load
  generator on core 1. Rounds alternate between loading MLServer directly and loading the gateway in
  front of it (direct first in odd rounds, through first in even ones), so the machine's drift hits
  both; each round's through/direct ratio of req/s says how much of what MLServer can serve the
  gateway keeps, and the median of the rounds is the cell's. Printed: req/s of both, the latency the
  gateway adds (p50, p99; at c16 requests queue at MLServer, so this is mostly queueing, not the hop),
  MLServer's CPU per request on both paths and the gateway's. (Loading two MLServers sharing one core
  at the same moment, one directly and one through the gateway, was tried first: in the gRPC cells
  the one behind the gateway served 1.08-1.11x the other's req/s at no lower CPU per request, i.e. it
  got more of the core, likely by having more threads: a ratio of shares, not of what the gateway keeps.)
  On a loaded machine the req/s ratio also carries how much of core 0 MLServer got from the other work
  in each phase, and that share follows its runnable threads: its gRPC server has more than its
  REST server, so the gRPC cells can read well above 1.0x. The capacity line divides that out:
  MLServer's requests per CPU-second through the gateway over direct (what it would serve on a core
  of its own), next to the gateway's requests per CPU-second (it must stay above MLServer's).
- **remote vs local, side by side.** The gateway in front of MLServer and a second gateway serving the
  local twin of the model in process (tests/fixtures/servables/iris_twin, a Python servable with the
  same weights, inputs and outputs), both on core 1, loaded at the same moment by their own wrk
  (bench/servers.side_by_side): the ratio of their CPU per request is what forwarding costs the
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
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.driver import Result, drive  # noqa: E402
from bench.servers import Server, deploy_body, round_options, side_by_side, start_gateway  # noqa: E402
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
    #: MLServer's CPU per request in the through rounds (the direct rounds' is in ``direct``).
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

    def capacity_ratio(self) -> float:
        """MLServer's requests per CPU-second through the gateway over direct: what it could serve on a
        core of its own, whatever share of core 0 it got from the machine's other work."""
        return statistics.median(d.cpu_us / b for d, b in zip(self.direct, self.behind_cpu))

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
            f"{name}: MLServer requests per CPU-second through the gateway / direct {self.capacity_ratio():.2f}x "
            f"(its req/s, when it is the bottleneck on a core of its own; the gateway serves "
            f"{1e6 / med(r.cpu_us for r in self.through):.0f} req/s per CPU-second)",
        ]


def direct_and_through(
    mlserver: MLServerBench, gateway: Server, path: str, body: bytes, concurrency: int, seconds: float, through_first: bool
) -> tuple[Result, Result, float]:
    """One round: MLServer loaded directly, then through the gateway (``path``), or the other way round.
    The direct result's CPU is MLServer's; the through result's is the gateway's; the third figure is
    MLServer's CPU per request behind the gateway."""
    direct_url = mlserver.url + f"/v2/models/{IRIS_MODEL}/versions/{IRIS_VERSION}/infer"
    results: dict[str, tuple[Result, float, float]] = {}
    for name in ("through", "direct") if through_first else ("direct", "through"):
        before = (mlserver.cpu_s(), gateway.cpu_s())
        r = drive(direct_url if name == "direct" else gateway.url + path, body, "application/json", concurrency, seconds)
        n = r.requests or 1
        results[name] = (r, (mlserver.cpu_s() - before[0]) / n * 1e6, (gateway.cpu_s() - before[1]) / n * 1e6)
    direct, direct_ml, _ = results["direct"]
    through, behind_ml, gateway_us = results["through"]
    direct.cpu_us, through.cpu_us = direct_ml, gateway_us
    return direct, through, behind_ml


@contextlib.contextmanager
def servers(work: Path) -> Iterator[tuple[MLServerBench, Server, Server]]:
    """(MLServer, gateway in front of it, gateway serving the twin); the twin and a RemoteV2 release of
    each protocol deployed."""
    model_dir = train_iris(work / "models")
    with contextlib.ExitStack() as stack:
        process = MLServerProcess(work / "models", work / "mlserver.log", cpu=MLSERVER_CORE).start()
        stack.callback(process.stop)
        mlserver = MLServerBench(process)
        gateways = []
        for name in ("remote", "local"):
            gw = start_gateway(work / f"data-{name}", {"FORESTFLOW_ALLOW_PYTHON": "1"}, work, f"gateway-{name}", cpu=GATEWAY_CORE)
            stack.callback(gw.stop)
            gateways.append(gw)
        twin = {"Python": {"modulePath": "twin.py", "entryPoint": "Iris"}}
        for protocol, contract in CONTRACTS.items():
            deploy_body(gateways[0], definition(contract, f"mlserver-{protocol}", remote_flavor(process, protocol)))
            deploy_body(gateways[1], definition(contract, "twin", twin, model_dir))
        yield mlserver, gateways[0], gateways[1]


def measure(args: argparse.Namespace, work: Path) -> list[Cell]:
    """Every (protocol, rows) cell, each printed as soon as it is measured."""
    cells: list[Cell] = []
    with servers(work) as (mlserver, remote, local):
        for protocol in args.protocols:
            path = infer_path(CONTRACTS[protocol])
            for rows in args.rows:
                cell = Cell(protocol, rows)
                body = v2_body(rows)
                if args.warmup:
                    direct_and_through(mlserver, remote, path, body, args.concurrency, args.warmup, False)
                    side_by_side(remote, local, path, body, "application/json", args.concurrency, args.warmup)
                for i in range(args.rounds):
                    d, t, behind_us = direct_and_through(mlserver, remote, path, body, args.concurrency, args.seconds, i % 2 == 1)
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
    round_options(parser, 16, "load generator", "one 0.5-s round of the 1-row REST cell, no warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.protocols, args.rows, args.rounds, args.seconds, args.warmup = ["rest"], [1], 1, 0.5, 0.0
    work = Path(tempfile.mkdtemp(prefix="ff-remote-"))
    print(
        f"# logs under {work}; MLServer on core {MLSERVER_CORE}, gateways and wrk on core {GATEWAY_CORE}; "
        f"medians of {args.rounds} round(s) of {args.seconds:g} s per side; "
        f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    cells = measure(args, work)
    held = sum(line.endswith("HOLDS") for cell in cells for line in cell.lines(args.concurrency))
    print(f"# {held} of {2 * len(cells)} target lines hold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
