"""The ``forestflow`` command as a newcomer meets it: help text, URLs, deploy errors, ``logs tail`` on files.

Before: ``--help`` showed raw reST backticks; deploy/contracts options had no help or default;
``--url localhost:8090`` failed with "unknown url type"; ``logs tail`` required Kafka, so the
embedded default's ``predictions.jsonl`` had no reader.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from forestflow.cli_admin import gateway_url
from tests.api_gp.helpers import raw_tensor_request
from tests.support import ROOT, GatewayProcess, python_servable, run_cli, score_body

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FORESTFLOW_")}


def cli(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forestflow.cli", *args],
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def test_help_is_plain_text_and_shows_defaults() -> None:
    top = cli("--help")  # the entry point once; the subcommands' help through main(argv) in this process
    assert top.returncode == 0
    assert "``" not in top.stdout and "logs" in top.stdout
    for command in ("deploy", "contracts"):
        out = run_cli(command, "--help").stdout
        assert "http://127.0.0.1:8090" in out, out  # the default URL is shown
        assert "host:port means http" in out
    assert "servable definition" in run_cli("deploy", "--help").stdout  # the file argument has help
    tail = run_cli("logs", "tail", "--help").stdout
    for option in ("--follow", "--from-beginning", "--key", "--data-dir", "--file"):
        assert option in tail


def test_url_without_scheme_means_http() -> None:
    assert gateway_url("localhost:8090") == "http://localhost:8090"
    assert gateway_url(":8090") == "http://127.0.0.1:8090"
    assert gateway_url("https://gw.example:443/") == "https://gw.example:443"


def test_deploy_of_a_non_json_file_says_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "model.toml"
    bad.write_text('path = "file://x"\n')
    result = run_cli("deploy", str(bad), "--url", "127.0.0.1:9")
    assert result.returncode != 0
    assert "not JSON" in result.stderr and result.stderr.count("\n") == 1, result.stderr


def _gp_request(reqid: str) -> bytes:
    return raw_tensor_request(
        [(11, [1], struct.pack("<d", 4.0), None), (12, [1], None, [b"gp"])], names=["x", "label"], config=f"reqid:{reqid}"
    )


def _score(gw: GatewayProcess, reqid: str) -> None:
    # Pretty-printed, as `curl --data-binary @file` sends a file.
    body = json.dumps(score_body([1.0], configs={"reqid": reqid}), indent=2)
    r = requests.post(gw.url + "/acme/demo/1/score", data=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text


def _traffic(gw: GatewayProcess, reqids: list[str]) -> None:
    for reqid in reqids:
        _score(gw, reqid)
    r = requests.post(gw.url + "/acme/demo/1/gp", data=_gp_request("gp-1"), timeout=30)
    assert r.status_code == 200


def _lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _run_gateway(gateway_process: type[GatewayProcess], data_dir: Path, fmt: str) -> GatewayProcess:
    env = {"FORESTFLOW_LOG_FILE_FORMAT": fmt, "FORESTFLOW_METRICS_FLUSH_INTERVAL_S": "0.2"}
    if fmt == "protobuf":
        env["FORESTFLOW_LOG_FILE"] = "predictions.pb"
    gw = gateway_process(data_dir, env=env).start()
    # `--url host:port`, no scheme: the CLI assumes http.
    deployed = subprocess.run(
        [sys.executable, "-m", "forestflow.cli", "contracts", "--url", gw.url.removeprefix("http://")],
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert deployed.returncode == 0, deployed.stderr
    r = requests.post(gw.url + "/servable", json=python_servable(("acme", "demo", 1), "v1", log_level="FULL"), timeout=60)
    assert r.status_code == 200, r.text
    return gw


def _wait_for_log(path: Path, minimum_bytes: int = 1) -> None:
    deadline = time.monotonic() + 10
    while not (path.exists() and path.stat().st_size >= minimum_bytes):
        assert time.monotonic() < deadline, f"nothing written to {path}"
        time.sleep(0.05)


@pytest.mark.slow
def test_logs_tail_reads_the_local_file_log_in_both_formats(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    for fmt, name in (("jsonl", "predictions.jsonl"), ("protobuf", "predictions.pb")):
        data_dir = tmp_path / fmt
        gw = _run_gateway(gateway_process, data_dir, fmt)
        _traffic(gw, ["req-1", "req-2"])
        gp_name = name.replace(".", ".gp.", 1)
        _wait_for_log(data_dir / name)
        _wait_for_log(data_dir / gp_name)
        extra = ["--file-format", fmt, "--file", str(data_dir / name)] if fmt == "protobuf" else ["--data-dir", str(data_dir)]

        everything = _lines(cli("logs", "tail", *extra))
        assert sorted(e["key"] for e in everything) == ["gp-1", "req-1", "req-2"], everything
        assert {e["topic"] for e in everything} == {"basic", "graphpipe"}
        basic = [e for e in everything if e["topic"] == "basic"]
        assert all(e["inferenceRequest"]["configs"]["reqid"] == e["key"] for e in basic)
        assert all(e["fqrv"]["releaseVersion"] == "v1" and e["status"] == 200 for e in everything)

        only = _lines(cli("logs", "tail", *extra, "--key", "req-2", "--from-beginning"))
        assert [e["key"] for e in only] == ["req-2"]

        # --follow starts at the end: only what is written afterwards, until --max-events. New
        # requests go on until it has printed one (it may take a while to start on a busy machine).
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "forestflow.cli",
                "logs",
                "tail",
                *extra,
                "--follow",
                "--max-events",
                "1",
                "--idle-timeout",
                "60",
            ],
            env=CLEAN_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while follower.poll() is None and time.monotonic() < deadline:
            _score(gw, "req-3")
            time.sleep(0.3)
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        followed = [json.loads(line) for line in out.splitlines()]
        assert [e["key"] for e in followed] == ["req-3"]
        assert gw.stop() == 0
