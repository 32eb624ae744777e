"""The admin commands of the ``forestflow`` CLI against a live gateway: what they change on the server, what
they print (tables, or the server's JSON with --json), and their exit codes (0 done, 1 refused with the
server's message, 2 unreachable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from forestflow.cli_format import duration, parse_duration, percent, table
from tests.support import ROOT, GatewayProcess, python_servable, run_cli, score_body

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FORESTFLOW_")}


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The installed command's way in: ``python -m forestflow.cli`` in a child process (its exit code is the process's)."""
    return subprocess.run(
        [sys.executable, "-m", "forestflow.cli", *args], env=CLEAN_ENV, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def ok(*args: str) -> str:
    done = run_cli(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def refused(*args: str) -> str:
    """The one line on stderr of a command the gateway (or the CLI) refused."""
    done = run_cli(*args)
    assert done.returncode == 1, (args, done.returncode, done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway child process for the module's tests (each uses contracts of its own)."""
    gw = GatewayProcess(tmp_path_factory.mktemp("cli-admin") / "data").start()
    yield gw
    assert gw.stop() == 0


def write(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_human_formats() -> None:
    assert [duration(s) for s in (0.42, 45, 600, 3900, 97200)] == ["0.4s", "45s", "10m", "1h 5m", "1d 3h"]
    assert [parse_duration(t) for t in ("90", "90s", "10m", "1h30m", "2d")] == [90, 90, 600, 5400, 172800]
    assert [percent(v) for v in (1.0, 0.573, 0.0004, None)] == ["100%", "57.3%", "0.04%", "-"]
    lines = table(["RELEASE", "SCORES"], [["v1", "7"], ["long-name", "1,234"]]).splitlines()
    assert lines == ["RELEASE    SCORES", "v1              7", "long-name   1,234"]  # names left, numbers right


def test_admin_commands_against_a_live_gateway(tmp_path: Path, live: GatewayProcess) -> None:
    gw = live
    url = ("--url", gw.url.removeprefix("http://"))
    v1 = write(tmp_path / "v1.json", python_servable(("acme", "demo", 1), "v1", log_level="FULL"))
    # The installed command's way in once (exit code 0); the other commands run through main(argv) in this process.
    deployed = cli("deploy", v1, *url)
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.startswith("deployed acme/demo/1/v1 in ")
    assert "409 ServableAlreadyExistsError" in refused("deploy", v1, *url)  # the server's refusal, exit 1
    ok("settings", "acme/demo/1", "--keep", "2", "--router", "latest", *url)  # so that v2 does not expire v1
    contract = requests.get(gw.url + "/acme/demo/1/contract-settings", timeout=10).json()["ContractSettings"]
    assert contract == {
        "expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}},
        "router": {"LatestPhaseInPctBasedRouter": {}},
    }

    # A release that logs nothing must be told how to log before it can shadow.
    v2 = write(tmp_path / "v2.json", python_servable(("acme", "demo", 1), "v2", validity=[{"ImmediatelyValid": {}}]))
    ok("deploy", v2, *url)
    assert "logs nothing" in refused("shadow", "acme/demo/1/v2", *url)
    assert ok("shadow", "acme/demo/1/v2", "--key", "reqid", *url).startswith("acme/demo/1/v2 shadows")
    settings = requests.get(gw.url + "/acme/demo/1/v2/settings", timeout=10).json()["ServableSettings"]
    assert settings["policySettings"]["validityPolicy"] == [{"NeverValid": {}}]
    assert settings["loggingSettings"]["logLevel"] == "FULL" and settings["loggingSettings"]["keyFeatures"] == ["reqid"]

    shown = ok("releases", "acme/demo/1", *url).splitlines()
    assert shown[0].split()[:3] == ["RELEASE", "PHASE-IN", "VALIDITY"]
    assert shown[1].split()[:3] == ["v1", "100%", "ImmediatelyValid"] and shown[2].split()[:3] == ["v2", "0%", "NeverValid"]
    listed = json.loads(ok("releases", "acme/demo/1", "--json", *url))
    assert [r["release"] for r in listed] == ["v1", "v2"]

    ok("phase-in", "acme/demo/1/v2", "--over", "90s", *url)
    policy = requests.get(gw.url + "/acme/demo/1/v2/settings", timeout=10).json()["ServableSettings"]["policySettings"]
    assert policy == {
        "validityPolicy": [{"ImmediatelyValid": {}}],
        "phaseInPolicy": {"LinearTimeBasedPhaseIn": {"phaseInOverSecs": 90}},
    }
    assert "--over: 'soon' is not a duration" in refused("phase-in", "acme/demo/1/v2", "--over", "soon", *url)

    assert "expiration: KeepLatest(servablesToKeep=2)" in ok("settings", "acme/demo/1", *url)
    assert "linear over 1m 30s" in ok("settings", "acme/demo/1/v2", *url)

    # Scoring: a /score body and a V2 body from files, printed as a table of the answer's rows.
    basic = write(tmp_path / "basic.json", score_body([1.5, 2.0], configs={"reqid": "r1"}))
    answer = ok("score", basic, "--contract", "acme/demo/1", *url).splitlines()
    assert answer[0].startswith("answered by v") and answer[1].split() == ["double", "echo"] and answer[2].split()[0] == "3"
    v2_body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0, 4.0]}]}
    v2_file = write(tmp_path / "v2-body.json", v2_body)
    answer = ok("score", v2_file, "--contract", "acme/demo/1", "--release", "v1", *url).splitlines()
    assert answer[0] == "answered by v1" and [row.split()[0] for row in answer[2:]] == ["2", "8"]
    scored = json.loads(ok("score", v2_file, "--contract", "acme.demo.1", "--release", "v1", "--json", *url))
    assert scored["outputs"][0]["data"] == [2.0, 8.0]

    # stats: the table, and --watch refreshing (two refreshes asked), in JSON a line each.
    stats = ok("stats", "acme/demo/1", *url).splitlines()
    assert stats[0].split()[:4] == ["RELEASE", "PHASE-IN", "SCORES", "RATE"] and len(stats) == 3
    watched = ok("stats", "acme/demo/1", "--watch", "--count", "2", "--interval", "0.1", "--json", *url).splitlines()
    assert len(watched) == 2 and all(len(json.loads(line)) == 2 for line in watched)
    assert ok("stats", "acme/demo/1", "--watch", "--count", "2", "--interval", "0.1", *url).count("RELEASE") == 2

    meta = ok("metadata", "acme/demo/1/v1", *url)
    assert "x" in meta.split() and "double" in meta.split() and "Float64" in meta
    # /explain answers, with the reason a release that has no trees and declares no explainer cannot explain
    assert "422 CannotExplain" in refused("explain", basic, "--contract", "acme/demo/1", *url)
    assert "404 UnknownContract" in refused("stats", "acme/nope/1", *url)
    assert "is not a release" in refused("undeploy", "acme/demo/1", *url)

    assert ok("undeploy", "acme/demo/1/v2", *url).strip() == "undeployed acme/demo/1/v2"
    assert [r["release"] for r in json.loads(ok("releases", "acme/demo/1", "--json", *url))] == ["v1"]


def test_an_unreachable_gateway_is_exit_code_2() -> None:
    refused_connection = "forestflow: cannot reach http://127.0.0.1:9: [Errno 111] Connection refused"
    done = cli("stats", "acme/demo/1", "--url", "127.0.0.1:9")  # the process's exit code
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == refused_connection
    for args in (("contracts",), ("undeploy", "acme/demo/1/v1")):
        ran = run_cli(*args, "--url", "127.0.0.1:9")
        assert ran.returncode == 2, (args, ran.stderr)
        assert ran.stderr.strip() == refused_connection


@pytest.mark.slow  # a CLI child process waiting out a load that takes 1.5 s
def test_deploy_wait_shows_the_load_and_fails_with_its_error(tmp_path: Path, live: GatewayProcess) -> None:
    model = tmp_path / "broken"
    model.mkdir()
    # A model that takes a moment to load and then fails: the progress, then the load error.
    (model / "model.py").write_text("import time\ntime.sleep(1.5)\nraise RuntimeError('the weights file is truncated')\n")
    gw = live
    before = requests.get(gw.url + "/contracts/list", timeout=10).json()
    definition = write(tmp_path / "broken.json", python_servable(("acme", "broken", 1), "v1", directory=model))
    done = cli("deploy", definition, "--wait", "--url", gw.url)  # the process's exit code
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("deploying: acme.broken.1.v1 loading ("), lines
    assert lines[-1].startswith("forestflow: refused: 422 CreateServableRequestInvalidError: ") and "truncated" in lines[-1]
    assert requests.get(gw.url + "/contracts/list", timeout=10).json() == before  # no contract left behind
