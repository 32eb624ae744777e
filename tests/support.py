"""Test helpers: real gateway servers (in-process or as a child process) and request builders."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import requests
from aiohttp import web

from forestflow.api.app import build_app, make_runner
from forestflow.api.common import GATEWAY, STARTING
from forestflow.service import Gateway
from forestflow.settings import Settings
from forestflow.supervisor import WorkerIdentity

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
ECHO_DIR = FIXTURES / "servables" / "echo"
H2O_DIR = FIXTURES / "h2o"
#: Where test gateways may read file:// artifacts: the repository's fixtures and what tests write
#: under the temp dir (tmp_path, module-scoped model directories). Tests of the roots set their own.
TEST_ARTIFACT_ROOTS = f"{ROOT},{tempfile.gettempdir()}"


async def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Poll a sync or async ``condition`` until it is truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


#: Set in the environment for the whole test session (tests/conftest.py): every process the suite
#: starts inherits it, so what is still running at the end can be told from other users' processes.
SESSION_MARK = "FF_TEST_SESSION"


def leftover_gateways(token: str) -> dict[int, str]:
    """Gateway processes (``forestflow.cli serve``) still running that carry this session's mark: pid -> command line."""
    found: dict[int, str] = {}
    needle = f"{SESSION_MARK}={token}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"forestflow.cli" not in argv or b"serve" not in argv:
                continue
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if process_alive(int(proc.name)):
            found[int(proc.name)] = b" ".join(argv).decode(errors="replace").strip()
    return found


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def python_servable(
    contract: tuple[str, str, int] = ("acme", "demo", 1),
    release: str = "v1",
    *,
    validity: list[dict[str, Any]] | None = None,
    phase_in: dict[str, Any] | None = None,
    log_level: str = "NONE",
    key_features: list[str] | None = None,
    contract_settings: dict[str, Any] | None = None,
    directory: Path = ECHO_DIR,
    module: str = "model.py",
) -> dict[str, Any]:
    """A BasicServeRequest for a Python-flavor test servable."""
    org, project, n = contract
    body: dict[str, Any] = {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": {"Python": {"modulePath": module, "entryPoint": "predict"}},
        "servableSettings": {
            "policySettings": {
                "validityPolicy": validity if validity is not None else [{"ImmediatelyValid": {}}],
                "phaseInPolicy": phase_in or {"ImmediatePhaseIn": {}},
            },
            "loggingSettings": {
                "logLevel": log_level,
                "keyFeatures": key_features if key_features is not None else (["reqid"] if log_level != "NONE" else []),
            },
        },
    }
    if contract_settings is not None:
        body["contractSettings"] = contract_settings
    return body


def prediction_columns(prediction: dict[str, Any]) -> dict[str, list[Any]]:
    """The output columns of a BASIC Prediction, one value per field name and row; the fields of a
    vector output (``top_labels.0``, ``top_labels.1``, ...) gathered back into one list per row."""
    flat: dict[str, list[Any]] = {}
    for g, entry in enumerate(prediction["schema"]):
        for datum in prediction["datum"]:
            (values,) = [t["data"] for t in datum["tensors"][g].values()]
            assert len(values) == len(entry["fields"]), (entry["fields"], values)  # one name per value
            for name, value in zip(entry["fields"], values):
                flat.setdefault(name, []).append(value)
    out: dict[str, list[Any]] = {}
    for name, column in flat.items():
        base, _, index = name.rpartition(".")
        if base and index.isdigit() and base not in flat:
            rows = out.setdefault(base, [[] for _ in column])
            for row, value in zip(rows, column):
                row.append(value)
        else:
            out[name] = column
    return out


def score_body(xs: list[float], labels: list[str] | None = None, configs: dict[str, str] | None = None) -> dict[str, Any]:
    """A mixed String + Float64 InferenceRequest with one record per value."""
    labels = labels or [f"r{i}" for i in range(len(xs))]
    return {
        "schema": [{"type": "String", "fields": ["label"]}, {"type": "Float64", "fields": ["x"]}],
        "datum": [{"tensors": [{"String": {"data": [lab]}}, {"Float64": {"data": [x]}}]} for x, lab in zip(xs, labels)],
        "configs": configs or {},
    }


@dataclass
class InProcessGateway:
    """A gateway app served on a real loopback port inside the test's event loop."""

    url: str
    app: web.Application
    session: aiohttp.ClientSession
    runner: web.AppRunner | None = None

    @property
    def gateway(self) -> Gateway:
        """The service object behind the app."""
        return self.app[GATEWAY]


@asynccontextmanager
async def serve_in_process(
    data_dir: Path, worker: WorkerIdentity | None = None, **overrides: Any
) -> AsyncIterator[InProcessGateway]:
    """Run the real app on a free port (as one ``worker`` of several, if given); yields its URL and a client session."""
    roots = {"artifact_roots": TEST_ARTIFACT_ROOTS}
    settings = Settings.load(
        environ={},
        overrides={
            "data_dir": data_dir,
            "port": 0,
            "grpc_port": -1,
            "allow_python": True,
            "shutdown_timeout_s": 5,
            **roots,
            **overrides,
        },
    )
    app = build_app(settings, worker)
    runner = make_runner(app, settings)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    # The gateway restores and loads in the background while the server answers; tests start from a started one.
    await asyncio.wait_for(asyncio.shield(app[STARTING]), 60)
    try:
        async with aiohttp.ClientSession() as session:
            yield InProcessGateway(f"http://127.0.0.1:{port}", app, session, runner)
    finally:
        await runner.cleanup()


@dataclass
class CliRun:
    """What one ``forestflow`` command did: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path | None = None) -> CliRun:
    """``forestflow <args>`` run in this process (in ``cwd``, if given), through the console script's ``main(argv)``:
    the same parser, commands and exit codes as the installed command without starting an interpreter for each
    (tests of the entry point itself start ``python -m forestflow.cli``). As there, no ``FORESTFLOW_*`` variable is set."""
    from forestflow.cli import main

    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("FORESTFLOW_")}
    # Help is wrapped to the terminal's width: a child process writing to a pipe sees COLUMNS or 80.
    columns = os.environ.get("COLUMNS")
    os.environ.setdefault("COLUMNS", "80")
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.chdir(cwd or Path.cwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.update(saved)
        if columns is None:
            del os.environ["COLUMNS"]
    return CliRun(code, out.getvalue(), err.getvalue())


class ChildProcess:
    """A server in a child process whose output goes to ``log_path``: stopped, killed and read the same
    way whatever it is (the gateway here, MLServer in tests/remote_backends.py).

    Started in a process group of its own (``start_new_session=True``): stopping or killing it ends
    the whole group, so nothing it started (a supervisor's workers, MLServer's) outlives the test."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (graceful shutdown), SIGKILL after ``timeout_s``; the exit code (None: never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._kill_group()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the process and everything in its process group (no graceful shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._kill_group()

    def _kill_group(self) -> None:
        """SIGKILL what is left of the process group the child leads (nothing, normally)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def log(self) -> str:
        """What the process printed so far (last 4 kB)."""
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


class GatewayProcess(ChildProcess):
    """``forestflow serve`` in a child process on a free port (for restarts and multi-process tests)."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        loop = {"FORESTFLOW_EVENT_LOOP": os.environ["FF_TEST_LOOP"]} if os.environ.get("FF_TEST_LOOP") else {}
        roots = {"FORESTFLOW_ARTIFACT_ROOTS": TEST_ARTIFACT_ROOTS}
        # No drain grace unless a test asks for one: a stop would otherwise wait it out every time.
        self.env = {
            **os.environ,
            "FORESTFLOW_ALLOW_PYTHON": "1",
            "FORESTFLOW_GRPC_PORT": "-1",
            "FORESTFLOW_DRAIN_GRACE_S": "0",
            **roots,
            **loop,
            **(env or {}),
        }
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"gateway-{self.port}.log"

    def start(self, timeout_s: float = 30.0, wait_started: bool = True) -> GatewayProcess:
        """Start and wait until /health/live answers and (``wait_started``) the gateway has restored its
        registry: /health/ready says started, with nothing left loading (under --workers N, on every worker)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "forestflow.cli",
                "serve",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                *self.args,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log()}")
            try:
                if requests.get(self.url + "/health/live", timeout=1).status_code == 200:
                    if not wait_started:
                        return self
                    ready = requests.get(self.url + "/health/ready", timeout=1).json()
                    # under --workers N the worker that answered may be the only one started so far
                    workers = ready.get("workers", {}).values()
                    if ready["started"] and not ready["loading"] and all(w["state"] in ("ready", "failed") for w in workers):
                        return self
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"gateway did not start: {self.log()}")
