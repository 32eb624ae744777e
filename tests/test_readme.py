"""The README's quick start works when followed top to bottom, and its route table names every front-end."""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

from tests.support import ROOT, GatewayProcess

README = (ROOT / "README.md").read_text()


def _shell_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_commands_use_what_the_first_command_installs() -> None:
    lines = _shell_lines()
    # httpie is not among the gateway's dependencies: installed into the venv, then run from it.
    assert not [line for line in lines if line.startswith("http ")], "a bare `http` the venv does not provide"
    assert ".venv/bin/pip install httpie" in lines
    assert any(line.startswith(".venv/bin/http POST") for line in lines)


def test_curl_deploy_is_an_alternative_not_a_second_deploy() -> None:
    curl_intro = README[README.index("To deploy with curl") : README.index('sed "s#file')]
    assert "instead of" in curl_intro and "409" in curl_intro


def test_shadow_section_explains_the_fan_out_to_the_old_release() -> None:
    text = " ".join(README.split())
    assert "once `gbm-v2` answers some requests, `gbm-v1` receives shadow copies" in text


def test_route_table_lists_every_front_end_and_the_v2_name_rule() -> None:
    table = README[README.index("## APIs") : README.index("## Deployment shapes")]
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


def test_safe_rollouts_section_runs_as_written(tmp_path: Any) -> None:
    """Each line of the section's bash block, run against a real gateway: gate, phase in, roll back."""
    section = README[README.index("## Safe rollouts") : README.index("## Operations")]
    lines = [line for line in re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).splitlines() if line.strip()]
    broken = tmp_path / "v2-broken"
    gw = GatewayProcess(tmp_path / "data", env={"FORESTFLOW_EVALUATION_INTERVAL_S": "1"}).start()

    def run(line: str) -> str:
        command = line.replace("localhost:8090", gw.url.removeprefix("http://")).replace("/tmp/v2-broken", str(broken))
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
        return done.stdout

    def stats() -> dict[str, Any]:
        return {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in json.loads(run(lines[3]))}

    def until(check: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + 10
        while True:
            current = stats()
            if check(current):
                return current
            assert time.monotonic() < deadline, (what, current)
            time.sleep(0.1)

    try:
        for line in lines[:3]:
            run(line)
        seen = until(lambda m: m["v2"]["currentPhaseInPct"] == 100, "v2 phased in")
        assert seen["v2"]["shadeCount"] == "25" and seen["v2"]["performanceMetrics"]["agreement"] == 1.0
        assert seen["v2"]["performanceMetrics"]["errorRate"] == 0.0
        run(lines[4])
        answers = [json.loads(a) for a in run(lines[5]).split("\n") if a.strip()]
        assert any("error" in a for a in answers), answers  # v2 answered, and failed
        seen = until(lambda m: m["v2"]["currentPhaseInPct"] == 0, "v2 rolled back")
        assert int(seen["v2"]["errorCount"]) > 0
        answer = json.loads(run(lines[2].replace("seq 25", "seq 1").replace(">/dev/null", "")))
        assert answer["Prediction"]["fqrv"]["releaseVersion"] == "v1"
    finally:
        assert gw.stop() == 0
