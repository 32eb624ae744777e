"""Helpers for the V2/V1 tests: a gateway with its gRPC port, and the real clients in their own venv.

tritonclient 2.73 and kserve 0.21 pin ``protobuf<7`` while the gateway's generated code needs
``protobuf>=7.35.1``, so the clients cannot live in the project venv. They are installed (once,
with pip from the usual index) into a cached venv, ``~/.cache/forestflow/v2-clients-<hash>``
(``FORESTFLOW_CLIENT_VENV`` overrides the location), and run as child processes
(tests/api/v2_client_calls.py) while the gateway serves from the test's event loop. scripts/test.sh builds the
venv before the tests start (``python -m tests.api.v2_support``), so no test waits on pip.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forestflow.api.v2_grpc import GRPC_PORT
from tests.support import ROOT, InProcessGateway, serve_in_process

CLIENT_REQUIREMENTS = ["tritonclient[http,grpc]==2.73.0", "kserve==0.21.0", "pandas<3"]
CLIENT_SCRIPT = Path(__file__).with_name("v2_client_calls.py")


def client_venv_dir() -> Path:
    """Where the client venv lives (keyed by the requirements so a change makes a new one)."""
    override = os.environ.get("FORESTFLOW_CLIENT_VENV")
    if override:
        return Path(override)
    digest = hashlib.sha256("\n".join(CLIENT_REQUIREMENTS).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "forestflow" / f"v2-clients-{digest}"


def ensure_client_python() -> Path:
    """The client venv's interpreter, creating the venv first if needed (~80 s the first time)."""
    venv = client_venv_dir()
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it right now
        if not marker.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *CLIENT_REQUIREMENTS],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"installing the V2 clients failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            marker.write_text("\n".join(CLIENT_REQUIREMENTS))
    return python


async def run_clients(python: Path, family: str, job: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
    """Run one client family against the gateway without blocking its event loop."""
    job = {"repo": str(ROOT), **job}
    proc = await asyncio.create_subprocess_exec(
        str(python),
        str(CLIENT_SCRIPT),
        family,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), timeout_s)
    finally:
        if proc.returncode is None:  # timed out or cancelled: never leave a client behind
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise AssertionError(f"{family} clients failed ({proc.returncode}):\n{err.decode()[-4000:]}")
    return json.loads(out)


async def run_families(python: Path, job: dict[str, Any], *families: str) -> list[dict[str, Any]]:
    """Run several client families at once; every one finishes before any failure is raised."""
    results = await asyncio.gather(*(run_clients(python, f, job) for f in families), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@dataclass
class V2Gateway:
    """An in-process gateway plus the address of its gRPC server."""

    server: InProcessGateway
    grpc_port: int

    @property
    def url(self) -> str:
        """The HTTP base URL."""
        return self.server.url

    @property
    def hostport(self) -> str:
        """``127.0.0.1:port`` of the HTTP API (tritonclient wants no scheme)."""
        return self.server.url.removeprefix("http://")

    @property
    def grpc_target(self) -> str:
        """``127.0.0.1:port`` of the gRPC API."""
        return f"127.0.0.1:{self.grpc_port}"

    async def deploy(self, body: dict[str, Any]) -> None:
        """Deploy a servable and wait until it is loaded."""
        async with self.server.session.post(self.url + "/servable", json=body) as r:
            assert r.status == 200, await r.text()

    async def post_json(self, path: str, payload: Any, **kw: Any) -> tuple[int, Any, Any]:
        """POST JSON; returns (status, parsed body, headers)."""
        async with self.server.session.post(self.url + path, json=payload, **kw) as r:
            return r.status, await r.json(content_type=None), r.headers


@asynccontextmanager
async def v2_gateway(data_dir: Path, **overrides: Any) -> AsyncIterator[V2Gateway]:
    """A gateway serving HTTP and gRPC on free loopback ports."""
    async with serve_in_process(data_dir, grpc_port=0, **overrides) as server:
        port = server.app[GRPC_PORT]
        assert isinstance(port, int) and port > 0
        yield V2Gateway(server, port)


if __name__ == "__main__":  # scripts/test.sh: build the client venv before the suite starts
    print(ensure_client_python())
