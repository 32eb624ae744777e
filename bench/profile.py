"""Where a gateway's CPU goes per request: a sampling profile of each cell, split into categories.

Starts one gateway (pinned to core 0, as bench/run.py's) with the H2O prostate GBM deployed with
logging NONE and FULL (to the file sink), loads each cell (/score, V2 and GraphPipe at 1 and 100
rows, 16 connections) with wrk as bench/run.py does, and meanwhile samples every thread of the
gateway from outside with py-spy (``--nonblocking``: the process is not stopped to be read; nothing
is added to the gateway itself, so it costs nothing when not profiling). Idle threads are not
sampled, so the samples of a cell are the gateway's CPU time, all threads together.

Each sample is given to one category, so the shares of a cell add up to 100% (they are exclusive):

- the whole stack decides first, in this order: ``prediction log`` (forestflow/predlog, aiokafka),
  ``access log`` (forestflow/logs.py, structlog), ``metrics`` (api/prom.py, api/worker_metrics.py,
  prometheus_client), ``predict`` (forestflow/runtime except the scheduler: the model call and
  its thread); e.g. a FULL request's event encoding counts as prediction log, not as encode;
- otherwise the innermost frame that belongs to one of: ``decode`` / ``encode`` (forestflow/codecs
  and the front-ends' body reading and answer building, by function), ``frame`` (core/frame.py),
  ``routing/scheduling`` (service.py, forestflow/core, runtime/scheduler.py), ``front-end``
  (the rest of forestflow/api: handlers, middleware, request id, headers), ``aiohttp`` (aiohttp,
  multidict, yarl: parsing, routing the URL, writing), ``asyncio`` (the event loop, selectors);
- ``other``: the rest, including samples whose Python stack py-spy could not read (a thread in C
  code without a Python frame, e.g. the garbage collector or the C task step between frames).

Time inside C code called from Python (orjson, numpy, the native scorer) is charged to the Python
frame that called it. The profiler reads the process about ``--rate`` times a second, which costs
the gateway some CPU of its own: the figures are shares, and the req/s printed beside are lower
than bench/run.py's.

    python bench/profile.py                       # the 12 cells (6 per logging), ~10 s each
    python bench/profile.py --logging NONE --endpoints score --rows 1 --top 30
    python bench/profile.py --smoke               # one short cell (tests/test_bench_smoke.py)
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.driver import drive  # noqa: E402
from bench.servers import Server, deploy, endpoints, measured, start_gateway  # noqa: E402

CATEGORIES = (
    "aiohttp",
    "asyncio",
    "front-end",
    "decode",
    "encode",
    "frame",
    "routing/scheduling",
    "predict",
    "access log",
    "metrics",
    "prediction log",
    "other",
)

#: Categories decided by any frame of the stack, first match wins: (category, path pattern).
_WHOLE_STACK = (
    ("prediction log", re.compile(r"/forestflow/predlog/|/aiokafka/|/cramjam/")),
    ("access log", re.compile(r"/forestflow/logs\.py|/structlog/")),
    ("metrics", re.compile(r"/forestflow/api/(prom|worker_metrics)\.py|/prometheus_client/")),
    ("predict", re.compile(r"/forestflow/runtime/(?!scheduler\.py)|/jpype/|/onnxruntime/")),
)

#: Functions of the front-ends (forestflow/api) that read the body or build the answer.
_API_DECODE = re.compile(r"^(read_json|parse_json|parse_outputs|split_body|decode_request|_decoded)$")
_API_ENCODE = re.compile(
    r"^(encode_response|_compress|_prediction_json|_octets|V2Answer\..*|_LoggedResponse\..*|answer|reply|dumps|json_response)$"
)
#: Functions of forestflow/codecs that read a request, then those that build an answer; the others read.
_CODEC_DECODE = re.compile(r"from_|parse|decode|_read|_Reader")
_CODEC_ENCODE = re.compile(
    r"encode|_bytes|_json|json_|prediction|_rows|row_values|_wire|_Forward|_finish|_offsets|_shape$|_element_bytes"
    r"|columnar_outputs|predictions|type_groups|_ff_type|_plain"
)

_FRAME = re.compile(r"^(.*) \((.*)\)$")


def _inner_category(function: str, path: str) -> str | None:
    """The category of one frame for the innermost-frame rule, or None when it has none."""
    if "/forestflow/codecs/" in path:
        return "encode" if not _CODEC_DECODE.search(function) and _CODEC_ENCODE.search(function) else "decode"
    if path.endswith("/forestflow/core/frame.py"):
        return "frame"
    if "/forestflow/core/" in path or path.endswith(("/forestflow/service.py", "/forestflow/runtime/scheduler.py")):
        return "routing/scheduling"
    if "/forestflow/api/" in path:
        if _API_DECODE.match(function):
            return "decode"
        if _API_ENCODE.match(function):
            return "encode"
        return "front-end"
    if re.search(r"/(aiohttp|multidict|yarl|propcache)/", path):
        return "aiohttp"
    if re.search(r"/asyncio/|/uvloop/|/selectors\.py", path):
        return "asyncio"
    return None


def categorize(frames: list[tuple[str, str]]) -> str:
    """The category of one sample: ``frames`` as (function, path), outermost first."""
    for category, pattern in _WHOLE_STACK:
        if any(pattern.search(path) for _, path in frames):
            return category
    for function, path in reversed(frames):
        found = _inner_category(function, path)
        if found is not None:
            return found
    return "other"


@dataclass
class Profile:
    """The samples of one cell by category, and by innermost function (for ``--top``)."""

    by_category: collections.Counter[str] = field(default_factory=collections.Counter)
    by_leaf: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    @property
    def samples(self) -> int:
        return sum(self.by_category.values())

    def share(self, category: str) -> float:
        return 100.0 * self.by_category[category] / self.samples if self.samples else float("nan")


def read_raw(path: Path) -> Profile:
    """A py-spy ``--format raw`` file (``thread;frame;...;frame count`` per line) as a Profile."""
    profile = Profile()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = []
        for text in stack.split(";")[1:]:  # the first entry names the thread
            match = _FRAME.match(text)
            frames.append((match.group(1), match.group(2)) if match else (text, ""))
        category = categorize(frames)
        profile.by_category[category] += int(count)
        leaf = frames[-1] if frames else ("(no Python frame)", "")
        profile.by_leaf[(category, f"{leaf[0]} ({_short(leaf[1])})")] += int(count)
    return profile


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/forestflow/", "/lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1] if marker != "/forestflow/" else "forestflow/" + path.split(marker, 1)[1]
    return path


def py_spy() -> str:
    """The py-spy executable: on PATH or beside this interpreter (a venv's bin)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("py-spy is not installed (pip install py-spy; it comes with the test extra)")
    return found


def profile_cell(
    gw: Server, work: Path, name: str, path: str, body: bytes, ctype: str, seconds: float, rate: int
) -> tuple[Profile, float, float]:
    """Samples the gateway while wrk loads one cell: (profile, req/s, CPU µs per request)."""
    out = work / f"{name}.raw"
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(gw.proc.pid), "--format", "raw", "--full-filenames", "--nolineno"]
        + ["--threads", "--nonblocking", "--rate", str(rate), "--duration", str(max(1, round(seconds))), "-o", str(out)],
        stdout=open(work / f"{name}.py-spy.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    result = measured(gw, path, body, ctype, 16, seconds)
    if spy.wait(60) != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed, see {work / f'{name}.py-spy.log'}")
    return read_raw(out), result.rps, result.cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoints", nargs="+", default=["score", "v2", "gp"], choices=["score", "v2", "gp"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 100])
    parser.add_argument("--logging", nargs="+", default=["NONE", "FULL"], choices=["NONE", "FULL"])
    parser.add_argument("--seconds", type=float, default=10.0, help="load and sampling time per cell")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=0, help="also print the N innermost functions with most samples per cell")
    parser.add_argument("--smoke", action="store_true", help="one 2 s cell (/score, 1 row, NONE)")
    args = parser.parse_args()
    if args.smoke:
        args.endpoints, args.rows, args.logging, args.seconds = ["score"], [1], ["NONE"], 2.0
    work = Path(tempfile.mkdtemp(prefix="ff-profile-"))
    print(f"# logs, data and py-spy output under {work}", flush=True)
    gw = start_gateway(work / "data", {}, work, "gateway")
    cells: list[tuple[str, Profile, float, float]] = []
    try:
        for logging in args.logging:
            deploy(gw, ("bench", logging.lower(), 1), logging)
        for rows in args.rows:
            for logging in args.logging:
                for name, (path, body, ctype) in endpoints(rows, f"bench.{logging.lower()}.1").items():
                    if name not in args.endpoints:
                        continue
                    cell = f"{name}-{rows}-{logging}"
                    drive(gw.url + path, body, ctype, 16, 1.0)  # warm-up
                    profile, rps, cpu_us = profile_cell(gw, work, cell, path, body, ctype, args.seconds, args.rate)
                    cells.append((cell, profile, rps, cpu_us))
                    print(f"# {cell}: {profile.samples} samples, {rps:.0f} req/s, {cpu_us:.0f} µs CPU/request", flush=True)
    finally:
        gw.stop()
    print_table(cells)
    if args.top:
        for cell, profile, _, _ in cells:
            print(f"\n# {cell}: innermost functions with most samples (category: function (file))")
            for (category, leaf), n in profile.by_leaf.most_common(args.top):
                print(f"{100.0 * n / profile.samples:6.1f}%  {category}: {leaf}")


def print_table(cells: list[tuple[str, Profile, float, float]]) -> None:
    """Categories down, cells across, shares in % of the cell's samples (each column adds up to 100)."""
    width = max([len("category")] + [len(c) for c in CATEGORIES])
    names = [cell for cell, _, _, _ in cells]
    col = max([9] + [len(n) for n in names])
    print("\n# share of gateway CPU per category, % of samples (exclusive: each column sums to 100)")
    print("category".ljust(width) + "".join(n.rjust(col + 1) for n in names))
    for category in CATEGORIES:
        print(category.ljust(width) + "".join(f"{p.share(category):{col + 1}.1f}" for _, p, _, _ in cells))
    print("total".ljust(width) + "".join(f"{sum(p.share(c) for c in CATEGORIES):{col + 1}.1f}" for _, p, _, _ in cells))
    print("samples".ljust(width) + "".join(f"{p.samples:{col + 1}d}" for _, p, _, _ in cells))
    print("µs CPU/req".ljust(width) + "".join(f"{cpu:{col + 1}.0f}" for _, _, _, cpu in cells))


if __name__ == "__main__":
    main()
