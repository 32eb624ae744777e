"""Issue 46: a warm request's instructions (callgrind) on a gateway of N contracts and on one of 10.

Both gateways hold one release of the prostate GBM per contract, seeded as bench/scale.py seeds
them (lazy loading, no background warm-up), run under callgrind as bench/instructions.py runs its
gateways, load ``--cold`` releases first (the 10-contract one loads its 10 again and again) and
then count ``--requests`` warm requests to release 0 (c16), ``--rounds`` times each, alternating;
medians. ``--cache-sim`` adds callgrind's cache simulation (D1 and LL misses per request).

    python bench/scale_instructions.py                      # 10,000 contracts
    python bench/scale_instructions.py --cold 100 --cache-sim
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import logging_instructions, payloads  # noqa: E402
from bench.logging_instructions import CountedGateway  # noqa: E402
from bench.scale import BODY, score_ms, seed  # noqa: E402

LAZY = {"FORESTFLOW_LAZY_LOADING": "1", "FORESTFLOW_WARM_CONCURRENCY": "0", "FORESTFLOW_ACCESS_LOG": "0"}


def with_cache_sim() -> None:
    """Start the counted gateways with ``--cache-sim=yes``."""
    popen = logging_instructions.subprocess.Popen

    def started(argv: list[str], *args: object, **kwargs: object) -> object:
        return popen([argv[0], "--cache-sim=yes", *argv[1:]] if argv[0] == "valgrind" else argv, *args, **kwargs)

    logging_instructions.subprocess.Popen = started  # type: ignore[assignment]


def totals(gateway: CountedGateway) -> dict[str, int]:
    """The events of the gateway's last dump (Ir, and the cache misses with ``--cache-sim``)."""
    text = Path(f"{gateway.out}.{gateway.dumps}").read_text(errors="replace")
    events = re.search(r"^events: (.+)$", text, re.M)
    counts = re.findall(r"^totals: (.+)$", text, re.M)
    assert events and counts, gateway.out
    return dict(zip(events.group(1).split(), map(int, counts[-1].split()), strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contracts", type=int, default=10_000)
    parser.add_argument("--cold", type=int, default=0, help="releases loaded before counting")
    parser.add_argument("--requests", type=int, default=1000, help="counted requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-sim", action="store_true")
    args = parser.parse_args()
    if args.cache_sim:
        with_cache_sim()
    work = Path(tempfile.mkdtemp(prefix="ff-scale-instr-"))
    model = work / "model"
    model.mkdir()
    shutil.copy(payloads.FIXTURE.with_suffix(".zip"), model / "gbm.zip")
    sizes = {"many": args.contracts, "few": 10}
    for name, contracts in sizes.items():
        seed(work / f"data-{name}", model, contracts)
    print(f"# logs under {work}; {args.requests} warm requests per round at c16, {args.cold} releases loaded first", flush=True)
    gateways: dict[str, CountedGateway] = {}
    counts: dict[str, list[dict[str, int]]] = {name: [] for name in sizes}
    try:
        for name, contracts in sizes.items():
            gateway = gateways[name] = CountedGateway.start(work, name, LAZY)
            for n in range(args.cold):
                score_ms(gateway, n % contracts)
            score_ms(gateway, 0)
        for _ in range(args.rounds):
            for name, gateway in gateways.items():
                gateway.instructions_per_request("/bench/scale/0/score", BODY, "application/json", args.requests)
                counts[name].append(totals(gateway))
                print(f"# {sizes[name]} contracts: {counts[name][-1]['Ir'] / args.requests / 1000:.1f}k", flush=True)
    finally:
        for gateway in gateways.values():
            gateway.stop()
    per = {name: {e: statistics.median(c[e] for c in runs) / args.requests for e in runs[0]} for name, runs in counts.items()}
    many, few = per["many"], per["few"]
    for event in many:
        ratio = many[event] / few[event]
        print(f"{event} per request: {args.contracts} contracts {many[event]:,.0f}, 10 contracts {few[event]:,.0f} ({ratio:.3f})")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
