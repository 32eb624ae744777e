"""The prediction log's cost per request counted in instructions (valgrind's callgrind), not timed.

``bench/logging_cost.py`` times NONE and FULL gateways side by side; on this 2-core VM a cell's
median still moves 3-5 points from run to run, as much as most changes to the logging path are
worth. Instructions do not depend on what else the machine does: each gateway runs under
``valgrind --tool=callgrind`` with counting off, serves a warm-up, and then counts exactly the
instructions of ``--requests`` requests (the events' delivery included: the count runs until the
log has shipped them). The cost of a cell is ``1 - NONE / FULL`` instructions per request, the
same formula as the timed lines.

Two settings are pinned, the same for NONE and FULL, because under valgrind (here ~40x slower:
1000 1-row requests take ~8 s) they would otherwise follow the slowdown rather than the code:

- ``max_batch_rows = 0``: tiny requests are not gathered into one model call; how many arrive
  in one loop turn depends on timing.
- ``log_linger_ms = 1000``: ~125 events per Kafka batch or file write at 1 row, the order of what
  the default 50 ms gathers at full speed (150-250), so per-batch work is shared alike.

Instructions are not time: cache misses, memory traffic and branch mispredictions cost cycles,
not instructions. On this machine the instruction cost came out below the timed cost in most
cells, far below at 100 rows (FULL to the file, /score 100 rows: 1.6-2.5% in instructions, 5-12.6%
timed), where events move and compress kilobytes; at 1 row to Kafka the two agreed within the timed
lines' noise. The target is judged by the timed lines; this script is for
comparing two versions of the logging path. Its own noise: one 1-row cell counted four times spread
over 1% of its total (FULL to Kafka, /score 1 row: 812.8k-821.1k instructions per request), so a
change of a few thousand instructions per request needs several counts. A 100-row cell counts half
as many requests, each with more work; counted over 100 requests, the same 100-row cell moved by
~20k instructions per request from run to run (a collection of the garbage collector's oldest
generation, millions of instructions, falls inside a count or not).

    python bench/logging_instructions.py                      # file and Kafka, /score and V2, 1 and 100 rows
    python bench/logging_instructions.py --sinks kafka --rows 1 --endpoints score
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.logging_cost import CONTRACT, TARGET, add_cell_arguments, gateway_pair  # noqa: E402
from bench.servers import PYTHON, Server, endpoints, free_port, wait_http  # noqa: E402

#: Settings pinned for both gateways (see the module docstring).
PINNED = {"FORESTFLOW_MAX_BATCH_ROWS": "0", "FORESTFLOW_LOG_LINGER_MS": "1000", "FORESTFLOW_GRPC_PORT": "-1"}
#: Concurrent requests while counting (as the timed lines).
CONCURRENCY = 16
WARMUP_REQUESTS = 300


async def _fire(url: str, body: bytes, ctype: str, count: int) -> None:
    """Exactly ``count`` POSTs at CONCURRENCY; any answer but 200 stops the bench."""
    left = [count]
    # No Accept-Encoding (aiohttp's client offers gzip by default): as wrk, so a V2 100-row answer
    # is not compressed and the count is the one of the timed cells.
    async with aiohttp.ClientSession(skip_auto_headers=["Accept-Encoding"]) as session:

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                async with session.post(url, data=body, headers={"Content-Type": ctype}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


@dataclass
class CountedGateway(Server):
    """A gateway under callgrind whose counting is switched on for one batch of requests at a time."""

    out: Path = Path()  # callgrind's output file; dump N is written beside it as <out>.N
    dumps: int = 0

    @classmethod
    def start(cls, work: Path, name: str, env: dict[str, str], root: Path = ROOT) -> CountedGateway:
        """Starts the gateway ``name`` of the checkout ``root`` under callgrind (counting off) and
        waits until it is ready."""
        out = work / f"{name}.callgrind"
        port = free_port()
        roots = {"FORESTFLOW_ARTIFACT_ROOTS": f"{ROOT},{work}"}
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            PYTHON,
            "-m",
            "forestflow.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(work / f"data-{name}"),
        ]
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **roots, **PINNED, **env},
            cwd=root,  # `python -m` imports forestflow from the working directory first
            stdout=open(work / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        gateway = cls(proc, f"http://127.0.0.1:{port}", out)
        wait_http(gateway.url + "/health/ready", 600)
        return gateway

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True, timeout=120)

    def instructions_per_request(self, path: str, body: bytes, ctype: str, requests: int) -> float:
        """Instructions the gateway ran for ``requests`` requests and the delivery of their events."""
        url = self.url + path
        asyncio.run(_fire(url, body, ctype, WARMUP_REQUESTS))
        time.sleep(1.5)  # the warm-up's events shipped before counting starts
        self._control("--zero")
        self._control("--instr=on")
        asyncio.run(_fire(url, body, ctype, requests))
        time.sleep(1.5)  # one linger and some: the counted requests' events shipped
        self._control("--instr=off")
        self._control("--dump")
        self.dumps += 1
        return _total(Path(f"{self.out}.{self.dumps}")) / requests


def _total(dump: Path) -> int:
    """The instruction total of a callgrind dump (its ``totals:`` line, the last one written)."""
    deadline = time.monotonic() + 30
    while True:
        if dump.exists():
            match = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.M)
            if match:
                return int(match.group(1))
        if time.monotonic() > deadline:
            raise RuntimeError(f"no callgrind totals in {dump}")
        time.sleep(0.2)


@dataclass
class InstructionCost:
    """One cell: instructions per request of NONE and FULL."""

    sink: str
    endpoint: str
    rows: int
    none: float
    full: float

    @property
    def cost(self) -> float:
        """``1 - NONE / FULL``, as the timed logging-cost lines."""
        return 1 - self.none / self.full

    def line(self) -> str:
        """The cell as one printed line."""
        verdict = "HOLDS" if self.cost <= TARGET else "MISSED"
        return (
            f"logging FULL-{self.sink} instructions {self.endpoint} {self.rows}-row <= {TARGET:.0%}: {self.cost * 100:.1f}% "
            f"(instructions per request NONE {self.none / 1000:.1f}k, FULL {self.full / 1000:.1f}k, "
            f"+{(self.full - self.none) / 1000:.1f}k) {verdict}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_arguments(parser)
    parser.add_argument("--requests", type=int, default=1000, help="counted requests per cell (half of it at 100 rows and more)")
    args = parser.parse_args()
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("valgrind is not installed (apt-get install valgrind): nothing to count", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ff-loginstr-"))
    print(
        f"# logs under {work}; instructions per request counted by callgrind over {args.requests} requests "
        f"(1-row) at c{CONCURRENCY}, {', '.join(f'{k}={v}' for k, v in PINNED.items())}",
        flush=True,
    )
    held = total = 0
    for sink in args.sinks:
        with gateway_pair(work, sink, lambda name, env: CountedGateway.start(work, name, env)) as (none, full):
            for rows in args.rows:
                requests = args.requests if rows < 100 else max(50, args.requests // 2)
                for name in args.endpoints:
                    entry = endpoints(rows, ".".join(map(str, CONTRACT))).get(name)
                    if entry is None:  # GraphPipe without its client library
                        continue
                    cell = InstructionCost(
                        sink,
                        name,
                        rows,
                        none.instructions_per_request(*entry, requests),
                        full.instructions_per_request(*entry, requests),
                    )
                    print(cell.line(), flush=True)
                    held += cell.cost <= TARGET
                    total += 1
    print(f"# {held} of {total} cells hold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
