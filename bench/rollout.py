"""Rollout soak: clients keep scoring one contract while new releases are deployed one after another.

The loop of issue 38, on each deployment shape: ``one`` gateway, ``workers`` (``serve --workers 2``,
deploys through the shared port) and ``replicas`` (two gateways sharing a redis-server, deploys
through A, clients on B). Every release is the binomial prostate H2O GBM, ImmediatelyValid with a
2 s linear phase-in, in a contract with ``KeepLatest {servablesToKeep: 2}`` and the Fair router, so
each deploy expires the oldest release while it still answers. Clients (BASIC ``/score`` and V2
REST, in turn, on keep-alive connections) count every answer by status; anything but a 200 is a
failure. Run through ``python bench/soak.py --rollout [--seconds 30] [--shapes one,workers,replicas]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import start_gateway  # noqa: E402

CONTRACT = ("roll", "prostate", 1)
BASE = "/roll/prostate/1"
MODEL = "roll.prostate.1"
SHAPES = ("one", "workers", "replicas")
CONTRACT_SETTINGS = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}


def release(n: int) -> dict[str, Any]:
    """Release ``rN`` of the GBM: ImmediatelyValid, 2 s linear phase-in, the contract's settings."""
    body = payloads.definition(CONTRACT, "NONE")
    body["fqrv"]["release_version"] = f"r{n}"
    body["servableSettings"]["policySettings"]["phaseInPolicy"] = {"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 2}}
    body["contractSettings"] = CONTRACT_SETTINGS
    return body


def start(work: Path, name: str, env: dict[str, str], args: list[str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A ``forestflow serve`` child process (not pinned: clients and gateways share the cores); it and
    its base URL once it answers live."""
    quiet = {"FORESTFLOW_ACCESS_LOG": "0", "FORESTFLOW_LOG_LEVEL": os.environ.get("FORESTFLOW_LOG_LEVEL", "warning")}
    server = start_gateway(
        work / f"data-{name}", {**quiet, **env}, work, name, args=args or (), pin=False, wait_path="/health/live"
    )
    return server.proc, server.url


async def clients(url: str, count: int, stop: asyncio.Event) -> tuple[Counter[str], Counter[str]]:
    """``count`` keep-alive loops scoring on ``url`` until ``stop``; (statuses, first words of failures)."""
    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    first_failure: dict[str, str] = {}
    bodies = {
        "score": (f"{BASE}/score", payloads.score_body(1)),
        "v2": (f"/v2/models/{MODEL}/infer", payloads.v2_body(1)),
    }

    async def loop(kind: str) -> None:
        path, body = bodies[kind]
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection per client
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            while not stop.is_set():
                try:
                    async with session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
                        text = await r.read()
                        statuses[f"{kind} {r.status}"] += 1
                        if r.status != 200:
                            worker = r.headers.get("X-Forestflow-Worker", "")
                            reasons[f"{worker} {_reason(text)}".strip()] += 1
                            first_failure.setdefault("at", time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}")
                except (TimeoutError, aiohttp.ClientError) as exc:
                    statuses[f"{kind} client-{type(exc).__name__}"] += 1

    await asyncio.gather(*(loop(("score", "v2")[i % 2]) for i in range(count)))
    if first_failure:
        reasons[f"(first failure at {first_failure['at']} UTC)"] = 0
    return statuses, reasons


def _reason(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return f"{doc.get('code', '')} {doc.get('error', '')}"[:100]
    except ValueError:
        return body[:100].decode(errors="replace")


async def deploys(url: str, first: int, seconds: float, pause_s: float, stop: asyncio.Event) -> Counter[str]:
    """Deploy releases one after another (each once the previous one answered, then ``pause_s``)."""
    answers: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    n = first
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while time.monotonic() < deadline:
            async with session.post(url + "/servable", json=release(n)) as r:
                text = await r.read()
                answers[f"deploy {r.status}" if r.status == 200 else f"deploy {r.status} ({_reason(text)})"] += 1
            n += 1
            await asyncio.sleep(pause_s)
    stop.set()
    return answers


async def run_shape(admin_url: str, client_url: str, args: argparse.Namespace) -> tuple[Counter[str], Counter[str], Counter[str]]:
    stop = asyncio.Event()
    traffic = asyncio.create_task(clients(client_url, args.clients, stop))
    admin = await deploys(admin_url, 2, args.seconds, args.pause, stop)
    statuses, reasons = await traffic
    return statuses, reasons, admin


def shape(name: str, work: Path, args: argparse.Namespace) -> bool:
    """Start the shape's gateways, deploy r1, run the loop, print the counts; True with 0 failures."""
    procs: list[subprocess.Popen[bytes]] = []
    redis = None
    try:
        if name == "one":
            proc, url = start(work, "one", {})
            procs, admin_url, client_url = [proc], url, url
        elif name == "workers":
            proc, url = start(work, "workers", {}, ["--workers", "2"])
            procs, admin_url, client_url = [proc], url, url
        else:
            from tests.registry.redis_server import RedisServer

            redis = RedisServer(work / "redis").start()
            env = {"FORESTFLOW_REDIS_URL": redis.url}
            (pa, admin_url), (pb, client_url) = start(work, "replica-a", env), start(work, "replica-b", env)
            procs = [pa, pb]
        requests.post(admin_url + "/servable", json=release(1), timeout=120).raise_for_status()
        # r1 answers on every process of the clients' gateway (each new connection goes to one worker).
        expected = 2 if name == "workers" else 1
        deadline, answered = time.monotonic() + 60, set()
        while len(answered) < expected:
            r = requests.post(
                client_url + f"{BASE}/score", data=payloads.score_body(1), headers={"Connection": "close"}, timeout=30
            )
            if r.status_code == 200:
                answered.add(r.headers.get("X-Forestflow-Worker", "w0"))
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: r1 does not answer on every process of the clients' gateway")
        started = time.monotonic()
        statuses, reasons, admin = asyncio.run(run_shape(admin_url, client_url, args))
        elapsed = time.monotonic() - started
        total = sum(statuses.values())
        failures = sum(n for key, n in statuses.items() if not key.endswith(" 200"))
        print(
            f"== {name}: {total - failures} of {total} answers right, {failures} failures in {elapsed:.0f} s; "
            f"{dict(admin)}; by status {dict(sorted(statuses.items()))}"
        )
        for reason, n in reasons.most_common(5):
            print(f"   {n} x {reason}")
        return failures == 0 and set(admin) <= {"deploy 200"}
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if redis is not None:
            redis.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py --rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the deploy loop per shape (default %(default)s)")
    parser.add_argument("--clients", type=int, default=6, help="keep-alive client connections (default %(default)s)")
    parser.add_argument(
        "--pause", type=float, default=1.0, help="seconds between one deploy's answer and the next deploy (default %(default)s)"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, among %(default)s")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="forestflow-rollout-"))
    print(
        f"# rollout: {args.clients} clients, a deploy every ~{args.pause:g} s for {args.seconds:g} s per shape; work dir {work}",
        flush=True,
    )
    ok = True
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown shape {name!r} (one of {', '.join(SHAPES)})")
        ok = shape(name, work, args) and ok
    print(f"# rollout {'passed' if ok else 'FAILED'}; logs in {work}")
    return 0 if ok else 1
