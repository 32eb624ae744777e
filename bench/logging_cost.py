"""The prediction log's cost per request, with both sides of the comparison measured at the same moment.

NONE and FULL measured one after the other differ on this machine by up to 20% between two
consecutive 3-4 s cells with no change at all. Here two gateways run side by side on the same
core (core 0): one serves the contract with logging NONE, the other the same contract with FULL
(to the file, or to the test Kafka broker), each loaded by its own wrk at the same concurrency for
the same seconds. Whatever slows the core slows both, so the ratio of their CPU per request is the
logging cost. The two also differ by themselves: two NONE gateways side by side measured 1.7-6.6% apart,
the second one started cheaper in 28 of 30 rounds. So the rounds cross over: both are started with the same
sink, and each round PUTs FULL on one and NONE on the other, in turn; each two rounds make one cost
(1 - the geometric mean of their two NONE/FULL ratios), in which the gateways' own difference
cancels (printed as their bias). The median and the quartiles of ``--rounds`` (made even) rounds'
costs are printed. ``bench/run.py`` takes its logging-cost lines from
:func:`measure`.

Each wrk drives its gateway as hard as it can (the target's measure). ``--paced F`` instead has every
connection pause after each answer so that both gateways together keep about ``F`` of the core busy:
a production server's load rather than its limit (the same requests, each costlier, since fewer wait
together in one loop turn). ``--calibrate-us N`` first measures a cell whose cost is known: two NONE
gateways, the one cast as FULL busy-waiting N us in every request (bench/spin/sitecustomize.py); the
line says how many microseconds the method reports for those N.

    python bench/logging_cost.py                     # file and Kafka, /score and V2, 1 and 100 rows
    python bench/logging_cost.py --sinks kafka --rows 1 --rounds 9
    python bench/logging_cost.py --calibrate-us 10 --paced 0.6
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import (  # noqa: E402
    LOGGING_CONCURRENCY,
    ROOT,
    Result,
    Server,
    deploy,
    endpoints,
    pin_process,
    side_by_side,
    start_gateway,
)

CONTRACT = ("bench", "log", 1)
#: The most a FULL gateway may spend per request over a NONE one (issue 23).
TARGET = 0.10

ServerT = TypeVar("ServerT", bound=Server)


#: Starts one gateway of a pair: ``(name, env) -> Server``, the name unique in the work dir.
Starter = Callable[[str, dict[str, str]], ServerT]


@contextlib.contextmanager
def gateway_pair(work: Path, sink: str, start: Starter[ServerT] | None = None) -> Iterator[tuple[ServerT, ServerT]]:
    """(NONE, FULL) gateways for ``sink`` ("file" or "kafka"), the contract deployed on each.

    ``start`` starts each one (by default a gateway pinned to core 0, as the timed lines need); the
    test broker, for Kafka, runs on core 1 with the load generators.
    """
    if start is None:

        def start(name: str, env: dict[str, str]) -> Server:
            return start_gateway(work / f"data-{name}", env, work, f"gateway-{name}")

    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        if sink == "kafka":
            from tests.kafka_broker import running_broker

            broker = stack.enter_context(running_broker())
            for pid in broker.pids:  # with the load generators, off the gateways' core
                pin_process(pid, 1)
            env = {"FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE": "false"}
        servers = []
        for level in ("NONE", "FULL"):
            server = start(f"{sink}-{level}", env)
            stack.callback(server.stop)
            deploy(server, CONTRACT, level)
            servers.append(server)
        yield servers[0], servers[1]


@dataclass
class Cost:
    """One logging-cost cell: the median of ``rounds`` side-by-side measurements."""

    sink: str
    endpoint: str
    rows: int
    costs: list[float]
    none_us: float
    full_us: float
    errors: int
    #: FULL's system CPU per request over NONE's (median of the rounds): the sink's writes and sends.
    extra_sys_us: float = float("nan")
    #: How much more CPU per request the first gateway of the pair spent than the second at the same
    #: level (median of the pairs of rounds): what the crossover took out of ``costs``.
    bias: float = 0.0

    @property
    def median(self) -> float:
        """The cost of the cell: the median of its rounds."""
        return statistics.median(self.costs)

    @property
    def holds(self) -> bool:
        """Whether the cell is within the target, with no failed request."""
        return self.median <= TARGET and self.errors == 0

    def line(self, concurrency: int) -> str:
        """The cell as one printed line (median, quartiles, both CPU figures, verdict)."""
        q1, _, q3 = statistics.quantiles(self.costs, n=4) if len(self.costs) > 1 else (self.median,) * 3
        return (
            f"logging FULL-{self.sink} cost {self.endpoint} {self.rows}-row c{concurrency} <= {TARGET:.0%}: "
            f"{self.median * 100:.1f}% (quartiles {q1 * 100:.1f} / {q3 * 100:.1f}; CPU per request NONE "
            f"{self.none_us:.0f} us, FULL {self.full_us:.0f} us, of its extra {self.extra_sys_us:+.0f} us in the kernel; "
            f"gateway bias {self.bias * 100:+.1f}%; errors {self.errors}) "
            f"{'HOLDS' if self.holds else 'MISSED'}"
        )


def pause_for(warm_up: Result, concurrency: int, paced: float) -> int:
    """The pause (ms) after each answer that brings one of two gateways sharing a core to ``paced / 2`` of
    it, from its request rate in a side-by-side warm-up at full load (where it had about half the core)."""
    rate = warm_up.rps * paced  # requests per second wanted
    return max(1, round(concurrency / rate * 1000 - warm_up.p50_ms))


#: Sets which gateway of a pair plays FULL (0 or 1), the other NONE, before a round.
Roles = Callable[[int], None]


def _casting(pair: tuple[Server, Server], settings: Callable[[bool], dict[str, object]]) -> Roles:
    """:data:`Roles` that PUT ``settings(plays_full)`` as the contract's logging settings on each gateway."""
    release = "/{}/{}/{}/gbm/logging".format(*CONTRACT)

    def cast(full: int) -> None:
        for i, server in enumerate(pair):
            requests.put(server.url + release, json=settings(i == full), timeout=30).raise_for_status()

    return cast


def logging_roles(pair: tuple[Server, Server]) -> Roles:
    """:data:`Roles` of a logging pair: FULL (keyed as deployed) or NONE; both gateways were started with the
    same sink, so the level is all that tells them apart."""
    return _casting(pair, lambda full: {"logLevel": "FULL", "keyFeatures": ["reqid"]} if full else {"logLevel": "NONE"})


def spin_roles(pair: tuple[Server, Server]) -> Roles:
    """:data:`Roles` of the calibration pair: both log nothing, the one cast as FULL busy-waits
    (bench/spin/sitecustomize.py)."""
    return _casting(pair, lambda full: {"logLevel": "NONE", "keyFeatures": ["spin"] if full else []})


def crossover(second_full: list[float], first_full: list[float]) -> tuple[list[float], float]:
    """Costs and the gateways' bias from the NONE/FULL CPU ratios of rounds with the second gateway cast as
    FULL and of rounds with the first (paired in order).

    With a logging cost ``c`` and the first gateway spending ``1 + b`` times the second's CPU on the same
    work, a round with the second gateway FULL reads ``(1 - c) * (1 + b)`` and one with the first FULL
    ``(1 - c) / (1 + b)``: their geometric mean is ``1 - c`` whatever ``b``, their ratio ``(1 + b) ** 2``.
    Returns each pair's cost and the median ``b``."""
    pairs = list(zip(second_full, first_full, strict=True))
    costs = [1 - math.sqrt(x * y) for x, y in pairs]
    return costs, statistics.median(math.sqrt(x / y) for x, y in pairs) - 1


def _cell(
    pair: tuple[Server, Server],
    label: tuple[str, str, int],
    rounds: int,
    seconds: float,
    concurrency: int,
    paced: float,
    roles: Roles,
) -> Cost | None:
    """One cell of ``label`` = (sink, endpoint, rows) on ``pair``; None without its client.

    A crossover: the rounds alternate which gateway plays FULL (``roles``), so whatever makes one
    process or one position cheaper than the other (two idle NONE gateways side by side differ by a
    few percent here, the same one cheaper run after run) cancels. Each two rounds, one of each
    casting, give one cost: 1 - the geometric mean of their NONE/FULL CPU ratios."""
    sink, name, rows = label
    entry = endpoints(rows, ".".join(map(str, CONTRACT))).get(name)
    if entry is None:  # GraphPipe without its client library
        return None
    path, body, ctype = entry
    warm: Result | None = None
    for full in (1, 0):  # each casting warmed once (a sink connects on its first event); ends with 0
        roles(full)
        warm, _ = side_by_side(pair[1 - full], pair[full], path, body, ctype, concurrency, 1.0)
    assert warm is not None
    pause = pause_for(warm, concurrency, paced) if paced else 0
    ratios: list[list[float]] = [[], []]  # NONE/FULL CPU per request, by which gateway plays FULL
    cpu, system, errors = [], [], 0
    for i in range(rounds + rounds % 2):  # an even count: as many rounds of each casting
        full = i % 2  # the warm-up left the first gateway cast as FULL
        if i:
            roles(full)
        a, b = side_by_side(pair[1 - full], pair[full], path, body, ctype, concurrency, seconds, pause_ms=pause)
        ratios[full].append(a.cpu_us / b.cpu_us)
        cpu.append((a.cpu_us, b.cpu_us))
        system.append(b.sys_us - a.sys_us)
        errors += a.errors + b.errors
    costs, bias = crossover(ratios[1], ratios[0])
    return Cost(
        sink,
        name,
        rows,
        costs,
        statistics.median(c[0] for c in cpu),
        statistics.median(c[1] for c in cpu),
        errors,
        statistics.median(system),
        bias,
    )


def measure(
    work: Path,
    sinks: list[str],
    endpoint_names: list[str],
    row_counts: list[int],
    rounds: int,
    seconds: float,
    concurrency: int,
    report: Callable[[Cost], None] = lambda cost: None,
    paced: float = 0.0,
) -> list[Cost]:
    """Every (sink, rows, endpoint) cell, each handed to ``report`` as soon as it is measured."""
    out: list[Cost] = []
    for sink in sinks:
        with gateway_pair(work, sink) as pair:
            for rows in row_counts:
                for name in endpoint_names:
                    cost = _cell(pair, (sink, name, rows), rounds, seconds, concurrency, paced, logging_roles(pair))
                    if cost is not None:
                        report(cost)
                        out.append(cost)
    return out


def calibrate(
    work: Path,
    spin_us: float,
    endpoint_names: list[str],
    row_counts: list[int],
    rounds: int,
    seconds: float,
    concurrency: int,
    paced: float = 0.0,
) -> list[str]:
    """Lines saying what the method reports for a known ``spin_us`` per request (two NONE gateways, the
    one cast as FULL busy-waiting), one per (rows, endpoint) cell."""
    lines = []
    spin = {"PYTHONPATH": str(ROOT / "bench" / "spin"), "BENCH_SPIN_US": str(spin_us)}
    with contextlib.ExitStack() as stack:
        pair = []
        for name in ("calibrate-0", "calibrate-1"):
            server = start_gateway(work / f"data-{name}", spin, work, name)
            stack.callback(server.stop)
            deploy(server, CONTRACT, "NONE")
            pair.append(server)
        roles = spin_roles((pair[0], pair[1]))
        for rows in row_counts:
            for name in endpoint_names:
                cost = _cell((pair[0], pair[1]), ("spin", name, rows), rounds, seconds, concurrency, paced, roles)
                if cost is None:
                    continue
                # The extra the cost stands for on a request of the NONE gateway's CPU (the medians of the
                # two CPU figures come from different rounds, their difference from the casting as well).
                extra = cost.none_us * cost.median / (1 - cost.median)
                share = spin_us / (cost.none_us + spin_us)
                lines.append(
                    f"calibration {name} {rows}-row: a known {spin_us:.0f} us per request ({share:.1%} of it) measures "
                    f"{extra:.1f} us ({cost.median:.1%}), {extra / spin_us:.2f}x; CPU per request {cost.none_us:.0f} us without"
                )
    return lines


def add_cell_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose the cells: ``--sinks``, ``--endpoints``, ``--rows``."""
    parser.add_argument("--sinks", nargs="+", default=["file", "kafka"], choices=["file", "kafka"])
    parser.add_argument("--endpoints", nargs="+", default=["score", "v2"], choices=["score", "v2", "gp"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_arguments(parser)
    parser.add_argument("--rounds", type=int, default=7, help="side-by-side measurements per cell (median)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--paced",
        type=float,
        default=0.0,
        metavar="F",
        help="pace both loads so the two gateways keep about F (0-1) of the core busy (default: each as fast as it can)",
    )
    parser.add_argument("--calibrate-us", type=float, default=0.0, metavar="N", help="first measure a known N us per request")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=LOGGING_CONCURRENCY,
        help="per gateway (two gateways share the core); bench/run.py's logging lines use the default",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ff-logcost-"))
    print(
        f"# logs under {work}; each line: median logging cost (1 - NONE CPU/req / FULL CPU/req), quartiles, "
        f"CPU per request of both, over {args.rounds} rounds of {args.seconds:.0f} s",
        flush=True,
    )
    if args.paced:
        print(f"# paced: each connection pauses after an answer, both gateways together ~{args.paced:.0%} of the core")
    if args.calibrate_us:
        calibration = calibrate(
            work, args.calibrate_us, args.endpoints, args.rows, args.rounds, args.seconds, args.concurrency, args.paced
        )
        print("\n".join(calibration), flush=True)
    costs = measure(
        work,
        args.sinks,
        args.endpoints,
        args.rows,
        args.rounds,
        args.seconds,
        args.concurrency,
        lambda cost: print(cost.line(args.concurrency), flush=True),
        args.paced,
    )
    print(f"# {sum(c.holds for c in costs)} of {len(costs)} cells hold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
