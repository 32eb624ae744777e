"""What the benchmark scripts share: child server processes (gateway, floor), ports, pinning, deploys,
the request bodies of each endpoint, and measuring a server's CPU per request. Every bench script
imports these from here instead of from another script (bench/run.py calls into logging_cost.py and
workers.py for its cells, logging_instructions.py reuses logging_cost.py's gateway pair).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.driver import Result, drive  # noqa: E402

#: Connections per gateway in the logging-cost cells (the issue's c16 cells).
LOGGING_CONCURRENCY = 16

PYTHON = sys.executable
TASKSET = shutil.which("taskset")


def pinned(cpu: int, argv: list[str]) -> list[str]:
    """``argv`` under taskset on one core when possible."""
    return [TASKSET, "-c", str(cpu), *argv] if TASKSET and (os.cpu_count() or 1) > 1 else argv


def pin_process(pid: int, cpu: int) -> None:
    """Move every thread of a running process to one core (when the machine has more than one)."""
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:  # a thread that ended meanwhile
            pass


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


@dataclass
class Server:
    """A child server process and its base URL."""

    proc: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far (all its threads, the JVM's included)."""
        return sum(self.cpu_split_s())

    def cpu_split_s(self) -> tuple[float, float]:
        """User and system CPU seconds of the process so far (all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident MiB (``RssAnon``: the private part, without mapped files such as shared libraries)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")


def start_floor(log_dir: Path) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        pinned(0, [PYTHON, str(ROOT / "bench" / "floor_server.py"), str(port)]),
        stdout=open(log_dir / "floor.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server(proc, f"http://127.0.0.1:{port}")
    wait_http(server.url + "/")
    return server


def start_gateway(
    data_dir: Path,
    env: dict[str, str],
    log_dir: Path,
    name: str,
    root: Path = ROOT,
    python: str = PYTHON,
    args: Sequence[str] = (),
    pin: bool = True,
    wait_path: str = "/health/ready",
    cpu: int = 0,
) -> Server:
    """A gateway started from the checkout ``root`` with its interpreter ``python`` (by default this
    one) and ``serve`` arguments ``args``, pinned to core ``cpu`` (0) unless ``pin`` is false; returned
    once ``wait_path`` answers (ready by default: its registry restored)."""
    port = free_port()
    # file:// deploys read the repository's fixtures and models the bench writes beside the data dir.
    roots = {"FORESTFLOW_ARTIFACT_ROOTS": f"{ROOT},{log_dir}"}
    # No drain grace (5 s by default, for load balancers; a bench has none): every stop() would wait it out.
    # Not for another checkout (a --baseline): one older than the setting refuses it.
    grace = {"FORESTFLOW_DRAIN_GRACE_S": "0"} if root == ROOT else {}
    full_env = {**os.environ, "FORESTFLOW_GRPC_PORT": "-1", **roots, **grace, **env}
    argv = [python, "-m", "forestflow.cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *args]
    proc = subprocess.Popen(
        pinned(cpu, argv) if pin else argv,
        env=full_env,
        cwd=root,
        stdout=open(log_dir / f"{name}.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server(proc, f"http://127.0.0.1:{port}")
    wait_http(server.url + wait_path)
    return server


def deploy_body(server: Server, body: dict[str, Any], starting_s: float = 120.0) -> None:
    """POST a BasicServeRequest; a RuntimeError with the gateway's answer unless it is 200. A gateway
    still restoring its registry (503 StoreUnavailable: live, not yet ready, e.g. a ``--workers``
    gateway) is asked again for up to ``starting_s``."""
    deadline = time.monotonic() + starting_s
    while True:
        r = requests.post(server.url + "/servable", json=body, timeout=120)
        if r.status_code == 503 and "StoreUnavailable" in r.text and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        if r.status_code != 200:
            raise RuntimeError(f"deploy failed: {r.status_code} {r.text}")
        return


def deploy(server: Server, contract: tuple[str, str, int], log_level: str) -> None:
    """Deploy the prostate GBM fixture (bench/payloads.py) as ``contract``."""
    deploy_body(server, payloads.definition(contract, log_level))


def measured(server: Server, path: str, body: bytes, ctype: str, conc: int, duration: float) -> Result:
    """drive() plus the server's CPU time per request (robust when other work shares the machine)."""
    before = server.cpu_s()
    result = drive(server.url + path, body, ctype, conc, duration)
    result.cpu_us = (server.cpu_s() - before) / result.requests * 1e6 if result.requests else float("nan")
    return result


def endpoints(rows: int, contract: str) -> dict[str, tuple[str, bytes, str]]:
    """endpoint name -> (path, body, content type) for one contract."""
    org, project, n = contract.split(".")
    out = {
        "score": (f"/{org}/{project}/{n}/score", payloads.score_body(rows), "application/json"),
        "v2": (f"/v2/models/{contract}/infer", payloads.v2_body(rows), "application/json"),
    }
    gp = payloads.graphpipe_body(rows)
    if gp is not None:
        out["gp"] = (f"/{org}/{project}/{n}/gp", gp, "application/octet-stream")
    return out


#: One load's request: (path, body, content type, extra headers).
Request = tuple[str, bytes, str, dict[str, str]]


def round_options(parser: argparse.ArgumentParser, concurrency: int, per: str, smoke: str) -> None:
    """The options of a script that measures cells in rounds: ``--rounds``, ``--seconds``, ``--warmup``,
    ``--concurrency`` (``per`` load generator or gateway) and ``--smoke`` (what it runs then)."""
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per cell (0: none)")
    parser.add_argument("--concurrency", type=int, default=concurrency, help=f"per {per}")
    parser.add_argument("--smoke", action="store_true", help=smoke)


def side_by_side(
    none: Server,
    full: Server,
    path: str,
    body: bytes,
    ctype: str,
    concurrency: int,
    seconds: float,
    other: Request | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 2.0,
    pause_ms: int = 0,
) -> tuple[Result, Result]:
    """Two servers loaded at once, each by its own load generator; each result carries its server's CPU
    per request (the ratio of the two is what bench/logging_cost.py and bench/versus.py report). The
    second server gets ``other`` instead of the same request when given (bench/images.py); a request
    unanswered after ``timeout_s`` is an error. ``pause_ms`` paces both loads (:func:`drive`)."""
    results: dict[str, Result] = {}
    before = {"none": none.cpu_split_s(), "full": full.cpu_split_s()}
    requests_of = {"none": (path, body, ctype, headers or {}), "full": other or (path, body, ctype, headers or {})}

    def load(name: str, server: Server) -> None:
        p, b, c, h = requests_of[name]
        results[name] = drive(server.url + p, b, c, concurrency, seconds, h, timeout_s, pause_ms)

    threads = [threading.Thread(target=load, args=(n, s)) for n, s in (("none", none), ("full", full))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, server in (("none", none), ("full", full)):
        r = results[name]
        user, system = server.cpu_split_s()
        if r.requests:
            r.cpu_us = (user + system - sum(before[name])) / r.requests * 1e6
            r.sys_us = (system - before[name][1]) / r.requests * 1e6
    return results["none"], results["full"]
