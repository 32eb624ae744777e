"""The cost of one evaluation round (``Administration.evaluate_all``) over N contracts with no traffic.

Builds a registry of N contracts of one cold release each (ImmediatelyValid, ImmediatePhaseIn,
KeepLatest 1; nothing is loaded), makes the first round (every contract is new), then times rounds
in one process, alternating a round of every contract (``everything=True``: what the timer did
before issue 46's skipping) with the timer's round (only the contracts with something due):

    python bench/evaluation_round.py                    # 10,000 contracts, 20 rounds of each
    python bench/evaluation_round.py --contracts 1000

``--counted K`` makes K timer rounds inside ``functools.reduce``, for instruction counts of those
rounds alone (it runs on versions of the gateway without ``everything`` too)::

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce \\
        python bench/evaluation_round.py --counted 3
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from forestflow.administration import Administration  # noqa: E402
from forestflow.codecs.ff_settings import parse_serve_request  # noqa: E402
from forestflow.core.ids import FQRV, Contract  # noqa: E402
from forestflow.core.policies import ServableMetrics  # noqa: E402
from forestflow.registry.file_store import FileStore  # noqa: E402
from forestflow.registry.registry import Registry  # noqa: E402
from forestflow.registry.release_loads import Backoff, ReleaseLoads  # noqa: E402
from forestflow.service import now_ms  # noqa: E402
from forestflow.settings import Settings  # noqa: E402


def build(contracts: int, data_dir: Path) -> Administration:
    """An administration over ``contracts`` contracts of one cold release each (never loaded)."""
    registry = Registry()
    template = parse_serve_request(payloads.definition(("bench", "eval", 0), "NONE"))
    created = now_ms()
    for n in range(contracts):
        defn = replace(template, fqrv=FQRV(Contract("bench", "eval", n), "gbm"), created_at_ms=created)
        registry.add_cold(defn, ServableMetrics(created_at_ms=created))
    store = FileStore(data_dir / "registry.json")
    loads = ReleaseLoads(registry, Backoff())
    return Administration(Settings(), registry, store, None, now_ms, loads)  # type: ignore[arg-type]  # nothing unloads


async def timed(admin: Administration, everything: bool) -> float:
    started = time.perf_counter()
    if everything:
        await admin.evaluate_all(everything=True)
    else:
        await admin.evaluate_all()
    return (time.perf_counter() - started) * 1000


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ff-evalround-") as tmp:
        admin = build(args.contracts, Path(tmp))
        await admin.evaluate_all()  # the first round: every contract is new
        if args.rounds_only is not None:
            for _ in range(args.rounds_only):
                await admin.evaluate_all()
            return
        full: list[float] = []
        due: list[float] = []
        for _ in range(args.rounds):
            full.append(await timed(admin, True))
            due.append(await timed(admin, False))
        print(
            f"evaluate_all over {args.contracts} contracts, no traffic, {args.rounds} rounds of each alternated: "
            f"every contract median {statistics.median(full):.2f} ms (min {min(full):.2f}); "
            f"only those due median {statistics.median(due):.3f} ms (min {min(due):.3f})"
        )


def counted(args: argparse.Namespace) -> None:
    """``--counted``: under callgrind --collect-atstart=no --toggle-collect=functools_reduce only
    what runs inside reduce is counted: the rounds, nothing of the setup."""
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ff-evalround-") as tmp:
        admin = build(args.contracts, Path(tmp))
        loop.run_until_complete(admin.evaluate_all())  # the first round: every contract is new
        rounds = [admin.evaluate_all() for _ in range(args.counted)]
        functools.reduce(lambda _, r: loop.run_until_complete(r), rounds, None)
    loop.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contracts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds of each kind")
    parser.add_argument("--rounds-only", type=int, help="make this many timer rounds, time nothing")
    parser.add_argument("--counted", type=int, help="make this many timer rounds inside functools.reduce (for callgrind)")
    args = parser.parse_args()
    if args.counted is not None:
        counted(args)
    else:
        asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
