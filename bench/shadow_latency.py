"""Live latency with and without a slow shadow servable on the same contract, in one run.

Starts a gateway (pinned to core 0 when ``taskset`` exists) with three contracts:

* ``base``  — the live servable alone;
* ``sleep`` — the live servable + a shadow servable that *waits* ``--shadow-ms`` per call;
* ``cpu``   — the live servable + a shadow servable that *computes* (pure Python, holding the GIL)
  for ``--burn-ms`` per call.

Each shadow is NeverValid + FULL logging, so every live request also sends it a copy. Live traffic
is open-loop at ``--rate`` req/s (each request is sent on schedule, whether or not earlier ones
were answered) and latency is measured from the scheduled send time, so a stall shows up in the
figures instead of silently lowering the load. The driver runs in this process, pinned to core 1.

The machine may be shared, so the scenarios are interleaved: ``--duration`` measured seconds per
scenario are cut into ``--slice``-second slices run in turn (base, sleep, cpu, base, ...), each
after a warm-up on the same contract, and each scenario's figures pool its slices. Background
noise then lands on every scenario alike.

    python bench/shadow_latency.py                       # 100 req/s, 10 s per scenario
    python bench/shadow_latency.py --rate 200 --shadow-ms 100 --burn-ms 2

Target: live p99 with the sleeping shadow within 1.2x of live p99 without a shadow. The CPU-bound
shadow is reported without a target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TARGET_RATIO = 1.2

LIVE_MODEL = """
import numpy as np
from forestflow.core.frame import Frame

def predict(frame):
    return Frame({"double": frame["x"].astype(np.float64) * 2})
"""

SLEEP_MODEL = """
import time
import numpy as np
from forestflow.core.frame import Frame

def predict(frame):
    time.sleep({seconds})
    return Frame({{"double": frame["x"].astype(np.float64) * 2}})
"""

BURN_MODEL = """
import time
import numpy as np
from forestflow.core.frame import Frame

def predict(frame):
    end = time.perf_counter() + {seconds}
    spins = 0
    while time.perf_counter() < end:
        spins += 1
    return Frame({{"double": frame["x"].astype(np.float64) * 2}})
"""


def pinned(core: int, argv: list[str]) -> list[str]:
    """``argv`` run on one CPU core when taskset is available."""
    return ["taskset", "-c", str(core), *argv] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else argv


def pin_self(core: int) -> None:
    """Pin this process (the load driver) to one core, if the platform allows it."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {core})


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deploy_body(contract: str, release: str, directory: Path, module: str, shadow: bool, log_level: str) -> dict[str, Any]:
    """A BasicServeRequest for a Python servable; shadows are NeverValid + FULL."""
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": "bench", "project": contract, "contract_number": 1}, "release_version": release},
        "flavor": {"Python": {"modulePath": module, "entryPoint": "predict"}},
        "servableSettings": {
            "policySettings": {
                "validityPolicy": [{"NeverValid": {}}] if shadow else [{"ImmediatelyValid": {}}],
                "phaseInPolicy": {"ImmediatePhaseIn": {}},
            },
            "loggingSettings": {"logLevel": "FULL" if shadow else log_level, "keyFeatures": ["reqid"]},
        },
    }


def score_body(i: int) -> bytes:
    """One record, as a client of a small tabular model would send it."""
    return orjson.dumps(
        {
            "schema": [{"type": "Float64", "fields": ["x"]}],
            "datum": [{"tensors": [{"Float64": {"data": [float(i % 100)]}}]}],
            "configs": {"reqid": f"r{i}"},
        }
    )


@dataclass
class Samples:
    """Latencies (ms, from the scheduled send time) and non-200 answers of one scenario."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # gateway process CPU time (user + system) during the measured slices
    late_sends: int = 0  # sends that left > 5 ms after their slot (driver falling behind)

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q / 100 * len(data)))]


async def drive(session: aiohttp.ClientSession, url: str, rate: float, seconds: float, samples: Samples | None) -> None:
    """Open loop: request i leaves at start + i/rate, whatever happened to the earlier ones."""
    loop = asyncio.get_running_loop()
    total = int(rate * seconds)
    bodies = [score_body(i) for i in range(total)]
    tasks: list[asyncio.Task[None]] = []
    start = loop.time() + 0.05

    async def one(i: int, due: float) -> None:
        if samples is not None and loop.time() - due > 0.005:
            samples.late_sends += 1
        try:
            async with session.post(url, data=bodies[i], headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                status = resp.status
        except aiohttp.ClientError:
            status = -1
        if samples is not None:
            samples.latencies.append((loop.time() - due) * 1000)
            if status != 200:
                samples.statuses[status] = samples.statuses.get(status, 0) + 1

    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        return await resp.json()


async def wait_idle(session: aiohttp.ClientSession, base: str, timeout: float = 60.0) -> None:
    """Wait until no scheduler has work running or queued (shadow backlog of the last scenario)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await get_json(session, base + "/metrics/json")
        busy = [s for s in metrics["schedulers"].values() if s["running"] or s["liveQueued"] or s["shadowQueued"]]
        if not busy and not metrics["predictionLog"]["bufferedEvents"]:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("gateway did not become idle")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace, base: str, models: Path, gateway_pid: int) -> int:
    scenarios = {
        "no shadow": ("base", None),
        f"sleeping shadow{'s' if args.shadows > 1 else ''} ({args.shadows}x{args.shadow_ms:g} ms)": ("sleep", "sleep.py"),
        f"CPU-bound shadow ({args.burn_ms:g} ms)": ("cpu", "burn.py"),
    }
    results: dict[str, Samples] = {name: Samples() for name in scenarios}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for contract, shadow_module in scenarios.values():
            servables = [("live", "live.py", False)]
            if shadow_module is not None:
                copies = args.shadows if contract == "sleep" else 1
                servables += [("shadow" if i == 0 else f"shadow{i}", shadow_module, True) for i in range(copies)]
            for release, module, shadow in servables:
                body = deploy_body(contract, release, models, module, shadow, args.live_log)
                async with session.post(base + "/servable", json=body) as resp:
                    if resp.status != 200:
                        print(f"deploy failed: {resp.status} {await resp.text()}", file=sys.stderr)
                        return 2
        rounds = max(1, round(args.duration / args.slice))
        for _ in range(rounds):
            for name, (contract, _) in scenarios.items():
                url = f"{base}/bench/{contract}/1/score"
                await wait_idle(session, base)
                await drive(session, url, args.rate, args.warmup, None)
                cpu_before = cpu_seconds(gateway_pid)
                await drive(session, url, args.rate, args.duration / rounds, results[name])
                results[name].cpu_s += cpu_seconds(gateway_pid) - cpu_before
        await wait_idle(session, base)
        metrics = await get_json(session, base + "/metrics/json")
        stats = {c: await get_json(session, f"{base}/bench/{c}/1/stats") for c, _ in scenarios.values()}

    print(
        f"\nlive traffic: {args.rate:g} req/s open-loop, {args.duration:g} s per scenario in {rounds} interleaved "
        f"slices (each after {args.warmup:g} s warm-up); live servable logLevel {args.live_log}; "
        f"scoring_slots={args.slots}; GIL switch interval "
        f"{args.switch_interval_ms or 5:g} ms; load average {os.getloadavg()[0]:.2f} (1 min)"
    )
    print(
        f"{'scenario':<30}{'sent':>7}{'non-200':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'p99/base':>10}{'CPU ms/req':>12}{'shadow copies':>15}{'scored':>8}{'dropped':>9}"
    )
    base_p99 = results["no shadow"].pct(99)
    for name, (contract, _) in scenarios.items():
        s = results[name]
        # Shadow figures cover the whole run (warm-ups included) and every shadow servable.
        prefix = f"bench.{contract}.1.shadow"
        dropped = sum(v["shadowDropped"] for k, v in metrics["schedulers"].items() if k.startswith(prefix))
        copies = sum(int(m["ServableMetrics"]["shadeCount"]) for m in stats[contract])
        errors = sum(s.statuses.values())
        shadow_cols = f"{copies:>15}{copies - dropped:>8}{dropped:>9}" if copies else f"{'-':>15}{'-':>8}{'-':>9}"
        print(
            f"{name:<30}{len(s.latencies):>7}{errors:>9}{s.pct(50):>9.2f}{s.pct(90):>9.2f}{s.pct(99):>9.2f}"
            f"{max(s.latencies):>9.2f}{s.pct(99) / base_p99:>9.2f}x{s.cpu_s * 1000 / len(s.latencies):>12.2f}"
            f"{shadow_cols}"
        )
        if s.late_sends:
            print(f"  ({s.late_sends} sends left > 5 ms late: the driver fell behind)")
    sleep_name = next(n for n in scenarios if n.startswith("sleeping"))
    ratio = results[sleep_name].pct(99) / base_p99
    ok = ratio <= TARGET_RATIO and not results[sleep_name].statuses
    print(f"\ntarget: live p99 with sleeping shadow <= {TARGET_RATIO}x without: {ratio:.2f}x -> {'PASS' if ok else 'FAIL'}")
    cpu_name = next(n for n in scenarios if n.startswith("CPU"))
    print(
        f"(no target) CPU-bound shadow: live p99 {results[cpu_name].pct(99) / base_p99:.2f}x, "
        f"p50 {results[cpu_name].pct(50) / results['no shadow'].pct(50):.2f}x of no-shadow"
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="live requests per second (open loop)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    parser.add_argument("--slice", type=float, default=1.0, help="seconds of one interleaved measurement slice")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each slice")
    parser.add_argument("--shadow-ms", type=float, default=50.0, help="how long the sleeping shadow waits per call")
    parser.add_argument("--shadows", type=int, default=1, help="how many sleeping shadow servables share the contract")
    parser.add_argument("--burn-ms", type=float, default=5.0, help="how long the CPU-bound shadow computes per call")
    parser.add_argument("--slots", type=int, default=2, help="FORESTFLOW_SCORING_SLOTS for the gateway")
    parser.add_argument("--live-log", default="FULL", choices=["NONE", "FULL"], help="logLevel of the live servable")
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.0,
        help="run the gateway with sys.setswitchinterval (0 = Python's default, 5 ms)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (gateway log, prediction log)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ff-shadow-bench-"))
    models = work / "models"
    models.mkdir()
    (models / "live.py").write_text(LIVE_MODEL)
    (models / "sleep.py").write_text(SLEEP_MODEL.format(seconds=args.shadow_ms / 1000))
    (models / "burn.py").write_text(BURN_MODEL.format(seconds=args.burn_ms / 1000))
    port = free_port()
    env = {
        **os.environ,
        "FORESTFLOW_ALLOW_PYTHON": "1",
        "FORESTFLOW_GRPC_PORT": "-1",
        "FORESTFLOW_SCORING_SLOTS": str(args.slots),
        "FORESTFLOW_LOG_LEVEL": "warning",
    }
    log_path = work / "gateway.log"
    # The gateway's own entry point, optionally with a shorter GIL switch interval (analysis aid:
    # how long the event loop waits for the GIL while a shadow thread computes).
    launcher = f"import sys; sys.setswitchinterval({args.switch_interval_ms / 1000!r}); " if args.switch_interval_ms else ""
    launcher += "from forestflow.cli import main; raise SystemExit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        pinned(0, [PYTHON, "-c", "import sys; " + launcher, "serve", "--port", str(port), "--data-dir", str(work / "data")]),
        env=env,
        cwd=ROOT,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                print(log_path.read_text()[-3000:], file=sys.stderr)
                return 2
            try:
                import urllib.request

                with urllib.request.urlopen(base + "/health/live", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        pin_self(1)
        return asyncio.run(run(args, base, models, proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
