"""This checkout's gateway against another checkout's (say main's), side by side on one core.

Cells measured one after the other drift on this machine by more than the differences worth
measuring, so both gateways run at the same time, pinned to core 0, each loaded by its own wrk
(core 1) at the same concurrency for the same seconds; whatever slows the core slows both. Per cell
and round: each gateway's CPU per request and requests per second; printed: the medians over the
rounds and the ratio this/baseline of CPU per request (below 1: this checkout spends less), and
each one's median p99 latency.

    python bench/versus.py --baseline /path/to/main-checkout          # its .venv/bin/python runs it
    python bench/versus.py --baseline ../main --endpoints score --rows 1 --rounds 7
    python bench/versus.py --baseline . --env FORESTFLOW_OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
    python bench/versus.py --baseline floor --this ../main    # main's gateway against bench/floor_server.py

The baseline checkout needs its own virtual environment (``bash scripts/test.sh --co`` makes one), as does
``--this`` when it names another checkout. ``--baseline floor`` loads the bare floor server
(bench/floor_server.py) instead: the printed ratio is then gateway/floor CPU per request.
``--env`` settings apply to this checkout's gateway only (e.g. tracing on against the same code off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import PYTHON, Server, deploy, endpoints, side_by_side, start_floor, start_gateway  # noqa: E402

CONTRACT = ("bench", "versus", 1)


@dataclass
class Comparison:
    """One cell of two servers loaded side by side: per round, each one's CPU per request, req/s and p99."""

    cpu: list[tuple[float, float]]
    rps: list[tuple[float, float]]
    p99: list[tuple[float, float]]
    errors: int

    @property
    def ratios(self) -> list[float]:
        """Per round, this server's CPU per request over the baseline's."""
        return [a / b for a, b in self.cpu]

    @property
    def ratio(self) -> float:
        """The median of :attr:`ratios`."""
        return statistics.median(self.ratios)

    def median(self, figures: list[tuple[float, float]], side: int) -> float:
        """The median of one side's figure (0: this, 1: the baseline)."""
        return statistics.median(f[side] for f in figures)

    def line(self) -> str:
        """The cell's figures as printed: medians, the ratio's quartiles, errors."""
        ratios = self.ratios
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        return (
            f"CPU/request this {self.median(self.cpu, 0):.0f} us, baseline {self.median(self.cpu, 1):.0f} us, "
            f"ratio {self.ratio:.3f} (quartiles {q[0]:.3f} / {q[2]:.3f}); req/s this {self.median(self.rps, 0):.0f}, "
            f"baseline {self.median(self.rps, 1):.0f}; p99 this {self.median(self.p99, 0):.1f} ms, "
            f"baseline {self.median(self.p99, 1):.1f} ms; errors {self.errors}"
        )


def compare(
    this: Server, base: Server, path: str, body: bytes, ctype: str, concurrency: int, rounds: int, seconds: float
) -> Comparison:
    """``rounds`` side-by-side loads of the two servers (after a 2 s warm-up), each at ``concurrency``."""
    side_by_side(this, base, path, body, ctype, concurrency, 2.0)  # warm-up
    cell = Comparison([], [], [], 0)
    for _ in range(rounds):
        a, b = side_by_side(this, base, path, body, ctype, concurrency, seconds)
        cell.cpu.append((a.cpu_us, b.cpu_us))
        cell.rps.append((a.rps, b.rps))
        cell.p99.append((a.p99_ms, b.p99_ms))
        cell.errors += a.errors + b.errors
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--baseline", type=Path, required=True, help="the other checkout (with its own .venv), or floor: bench/floor_server.py"
    )
    parser.add_argument("--this", type=Path, default=ROOT, help="the checkout whose gateway is measured (default: this one)")
    parser.add_argument("--endpoints", nargs="+", default=["score", "v2"], choices=["score", "v2", "gp"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16, help="per gateway")
    parser.add_argument("--log-level", default="NONE", choices=["NONE", "FULL"], help="the servable's logging on both")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for this checkout's gateway only")
    args = parser.parse_args()

    def venv_python(root: Path) -> str:
        python = root / ".venv" / "bin" / "python"
        if not python.exists():
            parser.error(f"{python} not found: make the checkout's venv first")
        return str(python)

    floor = str(args.baseline) == "floor"
    baseline = args.baseline if floor else args.baseline.resolve()
    base_python = "" if floor else venv_python(baseline)
    this_root = args.this.resolve()
    this_python = PYTHON if this_root == ROOT else venv_python(this_root)
    extra = dict(item.split("=", 1) for item in args.env)
    work = Path(tempfile.mkdtemp(prefix="ff-versus-"))
    print(f"# this: {this_root}  baseline: {baseline}  logs: {work}", flush=True)
    servers: list[Server] = []
    try:
        this = start_gateway(work / "data-this", extra, work, "this", root=this_root, python=this_python)
        servers.append(this)
        if floor:
            base = start_floor(work)
        else:
            base = start_gateway(work / "data-base", {}, work, "baseline", root=baseline, python=base_python)
            deploy(base, CONTRACT, args.log_level)
        servers.append(base)
        deploy(this, CONTRACT, args.log_level)
        for rows in args.rows:
            for name in args.endpoints:
                entry = endpoints(rows, ".".join(map(str, CONTRACT))).get(name)
                if entry is None:
                    continue
                path, body, ctype = entry
                cell = compare(this, base, path, body, ctype, args.concurrency, args.rounds, args.seconds)
                print(f"{name:5} {rows:>3}-row c{args.concurrency}: {cell.line()}", flush=True)
    finally:
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
