"""One gateway per data dir and per port: a second ``forestflow serve`` exits at start with one line.

Before: a second gateway on the same data dir ran, and the first one's next registry write undid
the second one's deploy; a second gateway on the same gRPC port shared it (SO_REUSEPORT) and
answered some calls from its own state; a taken HTTP port was found only after gRPC had bound.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import requests

from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.datadir_lock import DataDirInUse, DataDirLock
from tests.support import ROOT, GatewayProcess, free_port, python_servable


def _second_serve(data_dir: Path, port: int, grpc_port: int) -> subprocess.CompletedProcess[str]:
    """``forestflow serve`` that is expected to refuse to start (it would otherwise run forever)."""
    env = {**os.environ, "FORESTFLOW_ALLOW_PYTHON": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "forestflow.cli",
            "serve",
            "--port",
            str(port),
            "--grpc-port",
            str(grpc_port),
            "--data-dir",
            str(data_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("forestflow: error:")]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


def _model_ready(grpc_port: int, name: str) -> bool:
    """ModelReady over a fresh connection (a shared port would send some to another process)."""
    m = messages()
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/ModelReady",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=m["ModelReadyResponse"].FromString,
        )
        return bool(call(m["ModelReadyRequest"](name=name), timeout=10).ready)


@pytest.mark.slow
def test_second_gateway_on_same_data_dir_or_ports_exits_and_first_keeps_state(
    tmp_path: Path, gateway_process: type[GatewayProcess]
) -> None:
    grpc_port = free_port()
    first = gateway_process(tmp_path / "data", env={"FORESTFLOW_GRPC_PORT": str(grpc_port)}).start()
    deployed = requests.post(first.url + "/servable", json=python_servable(("acme", "demo", 1), "v1"), timeout=60)
    assert deployed.status_code == 200, deployed.text
    name = "acme.demo.1"

    # Same data dir, other ports: refused, naming the first gateway's pid.
    same_dir = _second_serve(tmp_path / "data", free_port(), free_port())
    assert same_dir.returncode != 0
    line = _error_line(same_dir)
    assert "in use" in line and f"pid {first.proc.pid}" in line, line

    # Other data dir, the first gateway's gRPC port: refused before start-up (no state written).
    other = tmp_path / "other"
    same_grpc = _second_serve(other, free_port(), grpc_port)
    assert same_grpc.returncode != 0
    line = _error_line(same_grpc)
    assert "gRPC" in line and str(grpc_port) in line, line
    assert not (other / "state").exists()

    # Other data dir, the first gateway's HTTP port: refused too, before gRPC or anything binds.
    spare_grpc = free_port()
    same_http = _second_serve(tmp_path / "third", first.port, spare_grpc)
    assert same_http.returncode != 0
    line = _error_line(same_http)
    assert "HTTP" in line and str(first.port) in line, line
    with socket.socket() as probe:  # the refused gateway never bound its gRPC port
        probe.bind(("127.0.0.1", spare_grpc))

    # The first gateway still owns its state and its ports: every fresh gRPC connection reaches it.
    assert requests.get(first.url + "/acme/demo/1/list", timeout=10).status_code == 200
    assert all(_model_ready(grpc_port, name) for _ in range(6))
    assert first.stop() == 0


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    with DataDirLock(tmp_path) as held:
        assert held.held
        assert (tmp_path / "forestflow.lock").read_text().strip() == str(os.getpid())
        # flock locks belong to the open file: a second open in this very process is refused too.
        with pytest.raises(DataDirInUse, match=f"pid {os.getpid()}"):
            DataDirLock(tmp_path).acquire()
    with DataDirLock(tmp_path) as again:
        assert again.held
