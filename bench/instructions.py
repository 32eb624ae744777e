"""A gateway's instructions per request (valgrind's callgrind), for one checkout or two side by side.

For changes to the per-request path too small to time on a shared 2-core machine: each checkout's
gateway runs under callgrind (the same pinned settings as bench/logging_instructions.py:
``max_batch_rows = 0``, so how many requests one model call gathers does not follow valgrind's
slowdown), serves a warm-up and then counts exactly ``--requests`` requests per cell at 16
concurrent requests. With two ``--roots`` (e.g. a baseline worktree first, this checkout second),
each cell's line gives both counts and the change. Each checkout is imported from its own working
directory with this interpreter, so a baseline worktree needs its compiled extensions
(``forestflow/**/*.so``) but no virtualenv of its own.

Noise: one 1-row cell counted again moved by up to 1.7% here (a pass of the garbage collector's
oldest generation, millions of instructions, falls inside a count or not): both gateways run at
once and ``--rounds`` alternates them, cell by cell, and keeps each one's median.

    python bench/instructions.py                                       # this checkout, NONE, 6 cells
    python bench/instructions.py --roots /work/wt/base . --endpoints score --rows 1
    python bench/instructions.py --roots /work/wt/base . --endpoints np   # same_model.py's LightGBM, np body
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import requests as http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads, same_model  # noqa: E402
from bench.logging_instructions import CountedGateway  # noqa: E402
from bench.servers import endpoints  # noqa: E402

CONTRACT = ("bench", "instr", 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roots", nargs="+", type=Path, default=[ROOT], help="checkouts to count (at most two)")
    parser.add_argument(
        "--endpoints",
        nargs="+",
        default=["score", "v2", "gp"],
        choices=["score", "v2", "gp", "np"],
        help="np: bench/same_model.py's model (--np-model) and V2 np body (one FP32 [N, 8] tensor)",
    )
    parser.add_argument("--np-model", default="lightgbm", choices=["lightgbm", "xgboost"], help="the np cell's model")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument(
        "--logging", default="NONE", choices=["NONE", "FULL"], help="the contract's log level (FULL: to the file)"
    )
    parser.add_argument("--requests", type=int, default=1000, help="counted requests per cell (half of it at 100 rows)")
    parser.add_argument("--rounds", type=int, default=1, help="counts per cell and checkout, alternating; the median is kept")
    args = parser.parse_args()
    if len(args.roots) > 2:
        parser.error("--roots takes one or two checkouts")
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("valgrind is not installed (apt-get install valgrind): nothing to count", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ff-instr-"))
    print(f"# logs under {work}; {args.logging}, c16, instructions per request over {args.requests} requests (1 row)", flush=True)
    gateways: list[CountedGateway] = []
    counts: list[dict[tuple[str, int], list[float]]] = [{} for _ in args.roots]
    try:
        for i, root in enumerate(args.roots):
            gateway = CountedGateway.start(work, f"gateway-{i}", {}, root.resolve())
            gateways.append(gateway)
            r = http.post(gateway.url + "/servable", json=payloads.definition(CONTRACT, args.logging), timeout=600)
            r.raise_for_status()
            if "np" in args.endpoints:
                if not (work / "models").exists():
                    same_model.train(work / "models", 100, 6)
                r = http.post(gateway.url + "/servable", json=same_model.definition(work / "models", args.np_model), timeout=600)
                r.raise_for_status()
        for _ in range(args.rounds):
            for rows in args.rows:
                n = args.requests if rows < 100 else max(50, args.requests // 2)
                cells = endpoints(rows, ".".join(map(str, CONTRACT)))
                cells["np"] = (
                    same_model.paths(args.np_model)[0],
                    same_model.body("np", same_model.rows_matrix(rows)),
                    "application/json",
                )
                for name, entry in cells.items():
                    if name not in args.endpoints:
                        continue
                    for root, gateway, counted in zip(args.roots, gateways, counts, strict=True):
                        count = gateway.instructions_per_request(*entry, n)
                        counted.setdefault((name, rows), []).append(count)
                        print(f"# {root}: {name} {rows}-row {count / 1000:.1f}k", flush=True)
    finally:
        for gateway in gateways:
            gateway.stop()
    medians = [{cell: statistics.median(values) for cell, values in counted.items()} for counted in counts]
    for cell in medians[0]:
        line = f"{cell[0]} {cell[1]}-row: " + ", ".join(f"{m[cell] / 1000:.1f}k" for m in medians)
        if len(medians) == 2:
            line += f" instructions per request ({(medians[1][cell] / medians[0][cell] - 1) * 100:+.1f}%)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
