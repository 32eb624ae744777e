"""docs/experiments.md runs as written: its commands, in order, against a real gateway process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, GatewayProcess

DOC = (ROOT / "docs" / "experiments.md").read_text()


@pytest.mark.slow
def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    walk, bandit = (
        [line for line in block.splitlines() if line.strip()] for block in re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
    )
    gw = GatewayProcess(tmp_path / "data").start()

    def run(line: str) -> str:
        command = line.replace("localhost:8090", gw.url.removeprefix("http://")).replace(
            ".venv/bin/forestflow deploy", f"{sys.executable} -m forestflow.cli deploy --url {gw.url}"
        )
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done.stdout

    try:
        deploy_v1, put, deploy_v2, pinned, phase_in, users, order, reward, stats = walk
        for line in (deploy_v1, put, deploy_v2):
            run(line)
        assert json.loads(run(pinned))["Prediction"]["fqrv"]["releaseVersion"] == "gbm-v2"
        assert "ServableUpdatedSuccessfully" in run(phase_in)
        answers = run(users).split()
        assert len(answers) == 6 and answers[:3] == answers[3:]  # each user twice, on the same release
        run(order)
        recorded = json.loads(run(reward))["FeedbackRecorded"]
        assert recorded["requestId"] == "order-42" and recorded["reward"] == 1
        rewarded = [m["ServableMetrics"] for m in json.loads(run(stats)) if "feedbackCount" in m["ServableMetrics"]]
        assert [(m["feedbackCount"], m["rewardMean"]) for m in rewarded] == [("1", 1.0)]
        assert "ContractUpdatedSuccessfully" in run(bandit[0])
        assert len(run(bandit[1]).split()) == 2  # a routing share per release
    finally:
        assert gw.stop() == 0
