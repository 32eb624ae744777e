"""docs/explanations.md's "Try it" commands run as written against a real gateway, and answer what the page says."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, GatewayProcess

PAGE = (ROOT / "docs" / "explanations.md").read_text()


@pytest.mark.slow
def test_try_it_runs_as_written(tmp_path: Path) -> None:
    section = PAGE[PAGE.index("## Try it") : PAGE.index("## What the values mean")]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    serve, *commands = [line for line in block.splitlines() if line.strip()]
    assert serve == "FORESTFLOW_ALLOW_PYTHON=true .venv/bin/forestflow serve"
    gw = GatewayProcess(tmp_path / "data", env={"FORESTFLOW_ALLOW_PYTHON": "true"}).start()

    def run(command: str) -> dict[str, object]:
        done = subprocess.run(
            ["bash", "-c", command.replace("localhost:8090", gw.url.removeprefix("http://"))],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (command, done.stderr)
        answer: dict[str, object] = json.loads(done.stdout)
        return answer

    try:
        deploy, explain, v1, v2, metadata, deploy_python, explain_python = commands
        assert "ServableCreatedSuccessfully" in run(deploy)
        answer = run(explain)
        explanation = answer["Explanation"]
        assert isinstance(explanation, dict) and explanation["method"] == "TreeSHAP"
        assert explanation["fqrv"]["releaseVersion"] == "gbm-v1"  # type: ignore[index]
        assert len(explanation["contributions"]) == 3 and "BiasTerm" in explanation["contributions"][0]  # type: ignore[index]
        answer = run(v1)
        assert answer["release"] == "samples.prostate.1.gbm-v1" and len(answer["explanations"]) == 1  # type: ignore[arg-type]
        outputs = {o["name"]: o for o in run(v2)["outputs"]}  # type: ignore[attr-defined]
        assert outputs["contributions"]["shape"] == [1, 8]
        meta = run(metadata)["BasicMetaData"]
        assert meta["explanations"] == {"method": "TreeSHAP", "space": "margin"}  # type: ignore[index]
        assert "ServableCreatedSuccessfully" in run(deploy_python)
        (values,) = run(explain_python)["Explanation"]["contributions"]  # type: ignore[index]
        background = [
            [float(v) for v in line.split(",")]
            for line in (ROOT / "servables/linear-python/background.csv").read_text().split()[1:]
        ]
        means = [sum(col) / len(col) for col in zip(*background)]
        # score = 0.5 + 2a - b + 0.25c: exact Shapley values are w_i * (x_i - mean_i)
        for name, w, x, mean in zip("abc", (2.0, -1.0, 0.25), (2.0, 1.0, 0.0), means):
            assert values[name] == pytest.approx(w * (x - mean), abs=1e-9)
    finally:
        assert gw.stop() == 0
