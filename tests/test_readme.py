"""The README's quick start works when followed top to bottom, and its route table names every front-end."""

from __future__ import annotations

import re

from tests.support import ROOT

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
    curl_intro = README[README.index("To deploy with curl"):README.index("sed \"s#file")]
    assert "instead of" in curl_intro and "409" in curl_intro


def test_shadow_section_explains_the_fan_out_to_the_old_release() -> None:
    text = " ".join(README.split())
    assert "once `gbm-v2` answers some requests, `gbm-v1` receives shadow copies" in text


def test_route_table_lists_every_front_end_and_the_v2_name_rule() -> None:
    table = README[README.index("## APIs"):README.index("## Deployment shapes")]
    for route in ("/{org}/{project}/{n}/score", "/{org}/{project}/{n}/gp", "/v2/models/{model}", "POST .../infer",
                  "/v2/health/ready", "GRPCInferenceService", "8081", "/v1/models/{model}:predict", "/v1/models"):
        assert route in table, route
    assert "`org.project.N`" in table and "version is a release" in table
