"""The prediction log's cost per request, with both sides of the comparison measured at the same moment.

``bench/run.py`` measures NONE and FULL one after the other; on this machine two consecutive 3-4 s
cells differ by up to 20% with no change at all. Here two gateways run side by side on the same
core (core 0): one serves the contract with logging NONE, the other the same contract with FULL
(to the file, or to the test Kafka broker), each loaded by its own wrk at the same concurrency for
the same seconds. Whatever slows the core slows both, so the ratio of their CPU per request is the
logging cost. Each cell is measured ``--rounds`` times, the gateways swapping nothing but time;
the median and the quartiles are printed.

    python bench/logging_cost.py                     # file and Kafka, /score and V2, 1 and 100 rows
    python bench/logging_cost.py --sinks kafka --rows 1 --rounds 9
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.driver import Result, drive  # noqa: E402
from bench.run import Server, deploy, endpoints, pin_process, start_gateway  # noqa: E402

CONTRACT = ("bench", "log", 1)


@contextlib.contextmanager
def gateway_pair(work: Path, sink: str) -> Iterator[tuple[Server, Server]]:
    """(NONE, FULL) gateways for ``sink`` ("file" or "kafka"), both on core 0."""
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
            server = start_gateway(work / f"data-{sink}-{level}", env, work, f"gateway-{sink}-{level}")
            stack.callback(server.stop)
            deploy(server, CONTRACT, level)
            servers.append(server)
        yield servers[0], servers[1]


def side_by_side(none: Server, full: Server, path: str, body: bytes, ctype: str, concurrency: int, seconds: float) -> tuple[Result, Result]:
    """Both gateways loaded at once; each result carries its gateway's CPU per request."""
    results: dict[str, Result] = {}
    before = {"none": none.cpu_s(), "full": full.cpu_s()}

    def load(name: str, server: Server) -> None:
        results[name] = drive(server.url + path, body, ctype, concurrency, seconds)

    threads = [threading.Thread(target=load, args=(n, s)) for n, s in (("none", none), ("full", full))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, server in (("none", none), ("full", full)):
        r = results[name]
        r.cpu_us = (server.cpu_s() - before[name]) / r.requests * 1e6 if r.requests else float("nan")
    return results["none"], results["full"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sinks", nargs="+", default=["file", "kafka"], choices=["file", "kafka"])
    parser.add_argument("--endpoints", nargs="+", default=["score", "v2"], choices=["score", "v2", "gp"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--rounds", type=int, default=7, help="side-by-side measurements per cell (median)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=8, help="per gateway (two gateways share the core)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ff-logcost-"))
    print(f"# logs under {work}; each line: median logging cost (1 - NONE CPU/req / FULL CPU/req), quartiles, "
          f"CPU per request of both, over {args.rounds} rounds of {args.seconds:.0f} s", flush=True)
    verdicts = []
    for sink in args.sinks:
        with gateway_pair(work, sink) as (none, full):
            for rows in args.rows:
                for name in args.endpoints:
                    path, body, ctype = endpoints(rows, ".".join(map(str, CONTRACT)))[name]
                    side_by_side(none, full, path, body, ctype, args.concurrency, 2.0)  # warm-up
                    costs, cpu = [], []
                    errors = 0
                    for _ in range(args.rounds):
                        a, b = side_by_side(none, full, path, body, ctype, args.concurrency, args.seconds)
                        costs.append(1 - a.cpu_us / b.cpu_us)
                        cpu.append((a.cpu_us, b.cpu_us))
                        errors += a.errors + b.errors
                    median = statistics.median(costs)
                    q1, _, q3 = statistics.quantiles(costs, n=4) if len(costs) > 1 else (median, median, median)
                    none_us = statistics.median(c[0] for c in cpu)
                    full_us = statistics.median(c[1] for c in cpu)
                    ok = median <= 0.10 and errors == 0
                    verdicts.append(ok)
                    print(f"logging FULL-{sink} cost {name} {rows}-row <= 10%: {median * 100:.1f}% "
                          f"(quartiles {q1 * 100:.1f} / {q3 * 100:.1f}; CPU per request NONE {none_us:.0f} us, "
                          f"FULL {full_us:.0f} us; errors {errors}) {'HOLDS' if ok else 'MISSED'}", flush=True)
    print(f"# {sum(verdicts)} of {len(verdicts)} cells hold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
