"""The workers cell of the benchmark: one gateway process against ``--workers 2``, same run.

Both serve the 1-row ``/score`` cell (NONE logging) at concurrency 16 and 64, unpinned (two workers
need both cores); the load generator shares the machine, so the figures to compare are server CPU
per request (summed over the supervisor and every worker) and req/s.

    python bench/workers.py [--duration 6]      # also run at the end of bench/run.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.driver import Result, drive  # noqa: E402
from bench.servers import PYTHON, Server, deploy, endpoints, free_port, wait_http  # noqa: E402


@dataclass
class WorkersCell:
    """One measured cell: how many workers, at what concurrency, and the result."""

    workers: int
    concurrency: int
    result: Result


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and every live descendant (their threads included)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    family, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in family:
                family.add(child)
                frontier.append(child)
    total = 0.0
    for member in family:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def measure(workers: int, work: Path, duration: float, concurrencies: list[int]) -> list[WorkersCell]:
    """Start a gateway with ``workers`` processes, deploy the H2O example, drive /score 1-row."""
    port = free_port()
    env = {**os.environ, "FORESTFLOW_GRPC_PORT": "-1"}
    argv = [
        PYTHON,
        "-m",
        "forestflow.cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(work / f"data-w{workers}"),
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=open(work / f"workers-{workers}.log", "wb"), stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}")
    url = server.url
    cells = []
    try:
        wait_http(url + "/health/live")
        deploy(server, ("bench", "none", 1), "NONE")
        wait_http(url + "/health/ready")
        path, body, ctype = endpoints(1, "bench.none.1")["score"]
        drive(url + path, body, ctype, 16, 2.0)  # warm-up (every worker's JIT and caches)
        for conc in concurrencies:
            before = tree_cpu_s(proc.pid)
            result = drive(url + path, body, ctype, conc, duration)
            result.cpu_us = (tree_cpu_s(proc.pid) - before) / result.requests * 1e6 if result.requests else float("nan")
            cells.append(WorkersCell(workers, conc, result))
            print(
                f"workers {workers} score 1-row c{conc:<3} {result.rps:>8.0f} req/s  p50 {result.p50_ms:6.2f} ms  "
                f"p99 {result.p99_ms:6.2f} ms  cpu {result.cpu_us:6.0f} us/req  errors {result.errors}",
                flush=True,
            )
    finally:
        server.stop()
    return cells


def workers_cells(work: Path, duration: float, concurrencies: tuple[int, ...] = (16, 64)) -> list[WorkersCell]:
    """1 and 2 workers, one after the other, and the comparison lines."""
    one = measure(1, work, duration, list(concurrencies))
    two = measure(2, work, duration, list(concurrencies))
    for a, b in zip(one, two):
        cpu = b.result.cpu_us / a.result.cpu_us - 1 if a.result.cpu_us else float("nan")
        gain = b.result.rps / a.result.rps if a.result.rps else float("nan")
        print(
            f"workers c{a.concurrency}: 2 workers {gain:.2f}x the req/s of 1; CPU per request {cpu * 100:+.1f}% "
            f"(target within 10%: {'HOLDS' if abs(cpu) <= 0.10 else 'MISSED'})",
            flush=True,
        )
    return one + two


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=6.0)
    args = parser.parse_args()
    cells = workers_cells(Path(tempfile.mkdtemp(prefix="ff-bench-workers-")), args.duration)
    return 0 if all(c.result.requests for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
