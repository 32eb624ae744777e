"""Switching registry stores: a gateway refuses to start over the other store's registry, and
``forestflow store migrate`` copies the registry across (file store -> Redis -> file store)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.registry.redis_server import RedisServer
from tests.support import ROOT, GatewayProcess, free_port, python_servable, score_body

SCORE = "/acme/demo/1/score"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forestflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "FORESTFLOW_GRPC_PORT": "-1", **(env or {})},
    )


def scores(gw: GatewayProcess) -> int:
    stats = requests.get(gw.url + "/acme/demo/1/stats", timeout=10)
    assert stats.status_code == 200, stats.text
    return int(stats.json()[0]["ServableMetrics"]["scoreCount"])


@pytest.mark.slow
def test_a_store_switch_is_refused_in_one_line_and_store_migrate_copies_the_registry(
    tmp_path: Path, redis_server: RedisServer, gateway_process: type[GatewayProcess]
) -> None:
    data = tmp_path / "data"
    redis = {"FORESTFLOW_REDIS_URL": redis_server.url}
    gw = gateway_process(data).start()  # the embedded file store
    assert requests.post(gw.url + "/servable", json=python_servable(), timeout=30).status_code == 200
    for x in (1.0, 2.0, 3.0):
        assert requests.post(gw.url + SCORE, json=score_body([x]), timeout=10).status_code == 200
    assert gw.stop() == 0

    refused = cli("serve", "--port", str(free_port()), "--data-dir", str(data), env=redis)
    assert refused.returncode == 1 and refused.stdout == ""
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("forestflow: error: the file store of") and "forestflow store migrate --to redis" in line, (
        refused.stderr
    )
    assert "artifacts_pruned" not in refused.stderr

    moved = cli("store", "migrate", "--to", "redis", "--data-dir", str(data), env=redis)
    assert moved.returncode == 0 and "copied 1 servable" in moved.stdout, moved.stderr
    gw = gateway_process(data, env=redis).start()
    assert scores(gw) == 3  # definitions and counters came along
    assert requests.post(gw.url + SCORE, json=score_body([4.0]), timeout=10).status_code == 200
    assert gw.stop() == 0

    refused = cli("serve", "--port", str(free_port()), "--data-dir", str(data))  # back to the file store
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    assert "lives in Redis" in line and "forestflow store migrate --to file" in line, refused.stderr

    moved = cli("store", "migrate", "--to", "file", "--data-dir", str(data), env=redis)
    assert moved.returncode == 0 and "copied 1 servable" in moved.stdout, moved.stderr
    gw = gateway_process(data).start()
    assert scores(gw) == 4
    assert gw.stop() == 0
