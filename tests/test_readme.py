"""The README and the pages under docs/ run as written: the quick start's commands use what the first command
installs, the APIs page's route table names every front-end, and the pages' sections with commands (safe
rollouts, models served elsewhere) run against real gateways."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from forestflow.runtime.remote.config import _KEYS as _REMOTE_KEYS
from tests.support import ROOT, GatewayProcess, free_port, run_cli

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """A page under docs/."""
    return (DOCS / name).read_text()


def section(text: str, heading: str) -> str:
    """One ``## `` section of a page: from its heading to the next one (or the end)."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def cli_command(line: str, url: str, *extra: str) -> str:
    """A ``.venv/bin/forestflow ...`` line of the docs as this checkout runs it against ``url``: through this
    interpreter, the trailing comment dropped, ``--url`` (and ``extra``) added; any other line unchanged."""
    if not line.startswith(".venv/bin/forestflow "):
        return line.replace("localhost:8090", url.removeprefix("http://"))
    command = line.split("  #", 1)[0].strip().removeprefix(".venv/bin/forestflow ")
    local = command.startswith(("logs ", "kafka "))  # read the log or a broker: no gateway URL
    return " ".join([sys.executable, "-m", "forestflow.cli", command, *([] if local else ["--url", url]), *extra])


def shell(command: str, timeout: float = 60) -> tuple[int, str, str]:
    """Run a command line from the repository root: exit code, stdout, stderr. A bare ``forestflow`` command (as
    :func:`cli_command` writes it, no pipe or redirection) goes through the CLI's ``main(argv)`` in this process
    with the words the shell would pass; any other line through bash."""
    prefix = f"{sys.executable} -m forestflow.cli "
    if command.startswith(prefix) and not any(c in command for c in "|&;<>$`\\*?~{"):
        done = run_cli(*shlex.split(command.removeprefix(prefix)), cwd=ROOT)
        return done.returncode, done.stdout, done.stderr
    ran = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return ran.returncode, ran.stdout, ran.stderr


def _shell_lines() -> list[str]:
    texts = [README] + [path.read_text() for path in sorted(DOCS.glob("*.md"))]
    blocks = [block for text in texts for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_commands_use_what_the_first_command_installs() -> None:
    lines = _shell_lines()
    # httpie is not among the gateway's dependencies: installed into the venv, then run from it.
    assert not [line for line in lines if line.startswith("http ")], "a bare `http` the venv does not provide"
    assert ".venv/bin/pip install httpie" in lines
    assert any(line.startswith(".venv/bin/http POST") for line in lines)


def test_curl_deploy_is_an_alternative_not_a_second_deploy() -> None:
    apis = page("apis.md")
    curl_intro = apis[apis.index("To deploy with curl") : apis.index('sed "s#file')]
    assert "instead of" in curl_intro and "409" in curl_intro


def test_shadow_section_explains_the_fan_out_to_the_old_release() -> None:
    text = " ".join(page("rollouts.md").split())
    assert "once `gbm-v2` answers some requests, `gbm-v1` receives shadow copies" in text


def test_route_table_lists_every_front_end_and_the_v2_name_rule() -> None:
    table = page("apis.md")
    for route in (
        "/{org}/{project}/{n}/score",
        "/{org}/{project}/{n}/gp",
        "/v2/models/{model}",
        "POST .../infer",
        "/v2/health/ready",
        "GRPCInferenceService",
        "8081",
        "/v1/models/{model}:predict",
        "/v1/models",
    ):
        assert route in table, route
    assert "`org.project.N`" in table and "version is a release" in table


@pytest.mark.slow  # a gateway process, and evaluation rounds (every 1 s) waited out
def test_safe_rollouts_section_runs_as_written(tmp_path: Any) -> None:
    """Each line of the section's bash block, run against a real gateway: gate, phase in, roll back."""
    text = section(page("rollouts.md"), "Safe rollouts")
    lines = [line for line in re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines() if line.strip()]
    broken = tmp_path / "v2-broken"
    gw = GatewayProcess(tmp_path / "data", env={"FORESTFLOW_EVALUATION_INTERVAL_S": "1"}).start()

    def run(line: str, *extra: str) -> str:
        command = cli_command(line, gw.url, *extra).replace("/tmp/v2-broken", str(broken))
        code, out, err = shell(command)
        assert code == 0, (line, err)
        return out

    def by_release(body: list[dict[str, Any]]) -> dict[str, Any]:
        return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in body}

    def stats() -> dict[str, Any]:
        return by_release(json.loads(run(lines[3], "--json")))

    def until(check: Any, what: str) -> dict[str, Any]:
        """Poll /stats (cheap) until ``check`` holds, then read them through the section's CLI line, as written."""
        deadline = time.monotonic() + 60  # the wait's own deadline: a loaded machine delays the timers, not the outcome
        while not check(current := by_release(requests.get(gw.url + "/acme/safe/1/stats", timeout=30).json())):
            assert time.monotonic() < deadline, (what, current)
            time.sleep(0.05)
        current = stats()
        assert check(current), (what, current)
        return current

    try:
        for line, release in zip(lines[:2], ("v1", "v2")):
            assert run(line).startswith(f"deployed acme/safe/1/{release} in "), line
        run(lines[2])
        shown = run(lines[3])  # the human table: a header and a row per release
        assert shown.split()[:3] == ["RELEASE", "PHASE-IN", "SCORES"] and "v1" in shown and "v2" in shown, shown
        # (shadow copies are scored after the answers went out: the last ones may still be counting)
        seen = until(
            lambda m: m["v2"]["currentPhaseInPct"] == 100 and int(m["v2"]["shadeCount"]) + int(m["v2"]["scoreCount"]) >= 25,
            "v2 phased in, every request counted",
        )
        # v2 scored a shadow copy of each request until its gates passed (20 events at least), then answered the rest
        shadows, answered = int(seen["v2"]["shadeCount"]), int(seen["v2"]["scoreCount"])
        assert shadows >= 20 and shadows + answered == 25, seen["v2"]
        assert seen["v2"]["performanceMetrics"]["agreement"] == 1.0
        assert seen["v2"]["performanceMetrics"]["errorRate"] == 0.0
        run(lines[4])
        answers = [json.loads(a) for a in run(lines[5]).split("\n") if a.strip()]
        assert any("error" in a for a in answers), answers  # v2 answered, and failed
        seen = until(lambda m: m["v2"]["currentPhaseInPct"] == 0, "v2 rolled back")
        assert int(seen["v2"]["errorCount"]) > 0
        answer = json.loads(run(lines[2].replace("seq 25", "seq 1").replace(">/dev/null", "")))
        assert answer["Prediction"]["fqrv"]["releaseVersion"] == "v1"
        shown = run(lines[6])
        assert lines[6].split("#")[0].strip() == lines[3].split("#")[0].strip() and "v2" in shown, shown
    finally:
        assert gw.stop() == 0


def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The quick start's commands in order, against a real gateway (the first command's), with what each prints."""
    blocks = re.findall(r"```bash\n(.*?)```", section(README, "Quick start"), flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]
    data = tmp_path / "data"
    gw = GatewayProcess(data).start()
    log = data / "predictions.jsonl"

    def run(line: str) -> str:
        extra = ("--count", "2", "--interval", "0.2") if "--watch" in line else ()
        command = cli_command(line, gw.url, *extra).replace("forestflow-data/", f"{data}/")
        if " logs tail" in command:
            command += f" --data-dir {data}"
        code, out, err = shell(command)
        assert code == 0, (line, out, err)
        return out

    def events() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    try:
        out = {line: run(line) for line in lines if not line.startswith("tail ")}  # tail below, once events are written
        said = " ".join(out.values())
        for expected in (
            "deployed samples/prostate/1/gbm-v1 in",
            "deployed samples/prostate/1/gbm-v2 in",
            "answered by gbm-v1",
            "samples/prostate/1/gbm-v2 phases in over 10m",
            "samples/prostate/1/gbm-v2 shadows",
            "undeployed samples/prostate/1/gbm-v2",
        ):
            assert expected in said, (expected, said)
        curl = next(line for line in lines if line.startswith("curl "))
        assert json.loads(out[curl])["Prediction"]["fqrv"]["releaseVersion"] == "gbm-v1"
        metadata = next(v for k, v in out.items() if " metadata " in k)
        assert "AGE" in metadata and "Float64" in metadata, metadata
        watched = next(v for k, v in out.items() if "--watch" in k)
        assert watched.count("gbm-v2") == 2 and "RATE" in watched, watched  # two refreshes, both releases
        logged = [json.loads(v.splitlines()[0]) for k, v in out.items() if " logs tail" in k][0]
        assert logged["servedRequest"] is True and logged["key"] == "req-1", logged
        deadline = time.monotonic() + 10
        while events() < 4:  # the two /score calls before the shadow one, its served and shadow events
            assert time.monotonic() < deadline, events()
            time.sleep(0.05)
        (tail,) = [line for line in lines if line.startswith("tail ")]
        served, shadow = (json.loads(e)["event"] for e in run(tail).splitlines())
        assert {served["servedRequest"], shadow["servedRequest"]} == {True, False}
    finally:
        assert gw.stop() == 0


def _commands(block: str) -> list[str]:
    """A bash block's commands, continuation lines joined."""
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


@pytest.mark.slow
def test_models_served_elsewhere_section_runs_as_written(tmp_path: Path) -> None:
    """The section's commands, in order, against a real gateway and the MLServer its own start line starts
    (on free ports, its model directory and the definition's URL moved accordingly)."""
    text = page("remote.md")
    setup, use = (_commands(block) for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    (shown,) = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    definition = ROOT / "servables" / "iris-remote.json"
    assert json.loads(shown) == json.loads(definition.read_text())  # the page shows the file deployed
    documented = text[text.index("| key | what |") :]
    assert all(f"`{key}`" in documented for key in _REMOTE_KEYS), documented

    ports = {"8180": str(free_port()), "8181": str(free_port()), "8182": str(free_port())}
    models = tmp_path / "models"
    moved = tmp_path / "iris-remote.json"
    moved.write_text(definition.read_text().replace("localhost:8180", f"localhost:{ports['8180']}"))
    gw = GatewayProcess(tmp_path / "data").start()

    def adapted(command: str) -> str:
        command = command.replace("localhost:8090", gw.url.removeprefix("http://")).replace("/tmp/mlserver-models", str(models))
        for port, free in ports.items():
            command = command.replace(port, free)
        return command.replace("@servables/iris-remote.json", f"@{moved}")

    def run(command: str) -> str:
        done = subprocess.run(["bash", "-c", adapted(command)], cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    *install, start = setup
    assert start.endswith("mlserver start /tmp/mlserver-models"), start
    mlserver: subprocess.Popen[bytes] | None = None
    try:
        for command in install:
            run(command)
        # MLServer keeps the foreground: started here as the reader's other shell would, in its own group.
        start = adapted(start).replace(".venv-mlserver/", f"{ROOT}/.venv-mlserver/")
        log = open(tmp_path / "mlserver.log", "wb")
        mlserver = subprocess.Popen(
            ["bash", "-c", start], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait, deploy, v2, score, metadata = use
        run(wait)
        assert json.loads(run(deploy)) == {
            "ServableCreatedSuccessfully": {
                "fqrv": {
                    "contract": {"organization": "samples", "project": "iris", "contractNumber": 1},
                    "releaseVersion": "mlserver-v1",
                }
            }
        }
        v2_body = json.loads(v2[v2.index("-d '") + 4 : -1])
        direct = requests.post(f"http://127.0.0.1:{ports['8180']}/v2/models/iris/infer", json=v2_body, timeout=30).json()
        answer = json.loads(run(v2))
        assert answer["model_version"] == "mlserver-v1"
        assert answer["outputs"][0]["data"] == direct["outputs"][0]["data"] and answer["outputs"][0]["shape"] == [2, 3]
        prediction = json.loads(run(score))["Prediction"]
        values = [record["tensors"][0]["Float64"]["data"] for record in prediction["datum"]]
        assert [v for row in values for v in row] == direct["outputs"][0]["data"]
        backend = json.loads(run(metadata))["BasicMetaData"]["backend"]
        assert backend["state"] == "up" and backend["url"] == f"http://localhost:{ports['8180']}", backend
        assert backend["binaryTensors"] is False, backend  # MLServer does not list the extension (the key table)
        # The key table's gRPC variant of the same definition reaches the same model.
        assert '`"url": "localhost:8181", "protocol": "grpc"`' in documented
        over_grpc = json.loads(moved.read_text())
        over_grpc["fqrv"]["contract"]["contract_number"] = 2
        over_grpc["flavor"]["RemoteV2"].update(url=f"localhost:{ports['8181']}", protocol="grpc")
        assert requests.post(gw.url + "/servable", json=over_grpc, timeout=30).status_code == 200
        answer = requests.post(gw.url + "/v2/models/samples.iris.2/infer", json=v2_body, timeout=30).json()
        assert answer["outputs"][0]["data"] == direct["outputs"][0]["data"], answer
    finally:
        if mlserver is not None and mlserver.poll() is None:
            os.killpg(mlserver.pid, signal.SIGTERM)
            try:
                mlserver.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(mlserver.pid, signal.SIGKILL)
                mlserver.wait()
        assert gw.stop() == 0


@pytest.mark.slow
def test_quick_start_runs_as_written_and_its_rollout_ends_with_the_new_release_answering(tmp_path: Path) -> None:
    """The quick start's rollout in order against a real gateway (the CLI run from this checkout, the
    phase-in shortened from 10 minutes to 3 seconds): gbm-v2 is phased in and then answers every request."""
    blocks = [_commands(b) for b in re.findall(r"```bash\n(.*?)```", section(README, "Quick start"), flags=re.S)]
    data = tmp_path / "data"
    gw = GatewayProcess(data, env={"FORESTFLOW_EVALUATION_INTERVAL_S": "0.5"}).start()

    def run(line: str, *extra: str) -> str:
        command = cli_command(line.replace("--over 10m", "--over 3s"), gw.url, *extra).replace("forestflow-data/", f"{data}/")
        code, out, err = shell(command)
        assert code == 0, (command, err)
        return out

    def answered_by(line: str) -> str:
        return str(json.loads(run(line, "--json"))["Prediction"]["fqrv"]["releaseVersion"])

    def stats(line: str) -> dict[str, Any]:
        listed = json.loads(run(line.split(" --watch")[0], "--json"))
        return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in listed}

    try:
        first, rollout = blocks[:2]
        for command in first:
            run(command)
        settings, deploy, score, tail, phase_in, watch, *after = rollout
        assert [c for c in after if not c.startswith("#")] == [score.split("  #")[0].rstrip()]  # it scores again
        assert "--router latest" in settings and "--keep 2" in settings
        for command in (settings, deploy):
            run(command)
        assert answered_by(score) == "gbm-v1"
        # The shadow copy is scored, and the log written, off the request path: the file may not exist yet
        # when the score command returns. Once both events are in it, the README's tail shows them.
        log_file, deadline = data / "predictions.jsonl", time.monotonic() + 10

        def last_two_served() -> set[bool]:
            lines = log_file.read_text().splitlines()[-2:] if log_file.exists() else []
            return {json.loads(x)["event"].get("servedRequest", False) for x in lines}

        while last_two_served() != {True, False}:
            assert time.monotonic() < deadline, f"{log_file}: no served and shadow event within 10 s"
            time.sleep(0.1)
        assert {json.loads(x)["event"].get("servedRequest", False) for x in run(tail).splitlines()} == {True, False}
        run(phase_in)
        deadline = time.monotonic() + 30
        while stats(watch)["gbm-v2"]["currentPhaseInPct"] != 100:
            assert time.monotonic() < deadline, stats(watch)
            time.sleep(0.2)
        answers = [answered_by(score) for _ in range(20)]
        assert answers == ["gbm-v2"] * 20  # the new release answers everything
        assert set(stats(watch)) == {"gbm-v1", "gbm-v2"}  # gbm-v1 kept, idle: a rollback is one policy change away
        page = requests.get(gw.url + "/ops/dashboard", timeout=10).json()["contracts"][0]
        assert page["settings"]["router"] == {"LatestPhaseInPctBasedRouter": {}}
        assert {r["release"]: r["routingSharePct"] for r in page["releases"]} == {"gbm-v1": 0.0, "gbm-v2": 100.0}
    finally:
        assert gw.stop() == 0
