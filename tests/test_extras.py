"""The lean core: serving imports none of the packages the extras install, and a feature whose extra is missing
is refused with the pip command that installs it (a 422 at deploy, one line at `serve`).

A missing extra is simulated in a child process whose import system refuses those packages as if they were not
installed (tests/fixtures/without_extras/sitecustomize.py, first on its PYTHONPATH), and logs every attempt."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

import forestflow
from forestflow.extras import EXTRAS, pip_command
from tests.support import ROOT, GatewayProcess

EXTRA_MODULES = sorted({module for extra in EXTRAS.values() for module in extra.modules})
BLOCKER = ROOT / "tests" / "fixtures" / "without_extras"
#: The modules that are the extras' own code: each imports its extra's packages, and is imported only when used.
EXTRA_CODE = {
    "forestflow.runtime.onnx_flavor",
    "forestflow.runtime.onnx_graph",
    "forestflow.registry.sources.s3",
    "forestflow.runtime.mlflow_model",
}


def without_extras(log: Path) -> dict[str, str]:
    """The environment of a child process in which no extra is installed."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BLOCKER), os.environ.get("PYTHONPATH", str(ROOT))]),
        "FF_BLOCK_MODULES": ",".join(EXTRA_MODULES),
        "FF_BLOCK_LOG": str(log),
    }


def attempts(log: Path) -> set[str]:
    """The top-level packages forestflow's own code tried to import in the child (a library's own optional probe,
    such as redis-py trying OpenTelemetry, is that library's business)."""
    lines = log.read_text().splitlines() if log.exists() else []
    package = str(Path(forestflow.__file__).parent)
    return {name.split(".", 1)[0] for name, importer in (line.split(" ", 1) for line in lines) if importer.startswith(package)}


def test_no_module_of_the_core_imports_an_extra(tmp_path: Path) -> None:
    """Every forestflow module but the extras' own imports without them (and without trying to)."""
    log = tmp_path / "imports.log"
    modules = sorted(
        info.name for info in pkgutil.walk_packages(forestflow.__path__, "forestflow.") if info.name not in EXTRA_CODE
    )
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", script, *modules], env=without_extras(log), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "forestflow.api.app" in modules and "forestflow.cli" in modules
    assert attempts(log) == set()


def _definition(path: str, flavor: dict[str, Any] | None, project: str) -> dict[str, Any]:
    """A serve request (an MLFlowServeRequest when ``flavor`` is None)."""
    definition = {
        "path": path,
        "fqrv": {"contract": {"organization": "lean", "project": project, "contract_number": 1}, "release_version": "r1"},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }
    return definition if flavor is None else {**definition, "flavor": flavor}


def test_the_core_serves_and_names_the_extra_of_what_it_cannot(tmp_path: Path) -> None:
    """Without any extra: native H2O GBM and Python models deploy and score, and trying nothing else; an ONNX
    model, an H2O GLM (genmodel in a JVM), an MLflow model and an S3 source are 422s naming the pip command of
    their extra."""
    log = tmp_path / "imports.log"
    gw = GatewayProcess(tmp_path / "data", env=without_extras(log)).start()
    try:

        def deploy(definition: dict[str, Any]) -> requests.Response:
            return requests.post(gw.url + "/servable", json=definition, timeout=60)

        gbm = _definition(f"file://{ROOT}/servables/prostate-gbm", {"H2OMojo": {"mojoPath": "prostate_gbm.zip"}}, "gbm")
        assert deploy(gbm).status_code == 200
        answer = requests.post(gw.url + "/lean/gbm/1/score", data=(ROOT / "servables" / "prostate-score.json").read_bytes())
        assert answer.status_code == 200 and answer.json()["Prediction"]["fqrv"]["releaseVersion"] == "r1"
        python = _definition(
            f"file://{ROOT}/tests/fixtures/servables/echo", {"Python": {"modulePath": "model.py", "entryPoint": "predict"}}, "py"
        )
        assert deploy(python).status_code == 200
        assert attempts(log) == set()  # serving those never even tried an extra's package

        onnx_dir = tmp_path / "onnx"
        onnx_dir.mkdir()
        (onnx_dir / "model.onnx").write_bytes(b"never read: the flavor is refused first")
        mlflow_dir = tmp_path / "mlflow"
        mlflow_dir.mkdir()
        (mlflow_dir / "MLmodel").write_text("flavors:\n  h2o_mojo:\n    data: data\n")
        refused = {
            "onnx": deploy(_definition(f"file://{onnx_dir}", {"ONNX": {"modelPath": "model.onnx"}}, "onnx")),
            "h2o-jvm": deploy(
                _definition(f"file://{ROOT}/tests/fixtures/h2o", {"H2OMojo": {"mojoPath": "prostate_glm_binomial.zip"}}, "glm")
            ),
            "mlflow": deploy(_definition(f"file://{mlflow_dir}/MLmodel", None, "mlflow")),
            "s3": deploy(
                _definition("s3::http://127.0.0.1:9/models/prostate bucket=models", {"H2OMojo": {"mojoPath": "gbm.zip"}}, "s3")
            ),
        }
        for extra, response in refused.items():
            assert response.status_code == 422, (extra, response.text)
            assert pip_command(extra) in response.json()["error"], (extra, response.json())
            assert response.json()["code"] == "CreateServableRequestInvalidError"  # ForestFlow's envelope
        assert attempts(log) == {"onnxruntime", "jpype", "yaml", "aiobotocore"}
        contracts = requests.get(gw.url + "/contracts/list", timeout=10).json()["Contracts"]["contracts"]
        assert sorted(c["project"] for c in contracts) == ["gbm", "py"]  # nothing of the refused ones stayed
    finally:
        assert gw.stop() == 0


def test_serve_with_a_setting_whose_extra_is_missing_stops_with_one_line(tmp_path: Path) -> None:
    for setting, value, extra in (
        ("FORESTFLOW_OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9", "tracing"),
        ("FORESTFLOW_EVENT_LOOP", "uvloop", "uvloop"),
        ("FORESTFLOW_H2O_SCORER", "jvm", "h2o-jvm"),
    ):
        env = {**without_extras(tmp_path / "imports.log"), setting: value}
        done = subprocess.run(
            [sys.executable, "-m", "forestflow.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (setting, done.stderr)
        assert pip_command(extra) in lines[0] and setting.removeprefix("FORESTFLOW_").lower() in lines[0], lines
    assert not (tmp_path / "data").exists()  # stopped before anything was made


def test_every_extra_is_declared_in_pyproject() -> None:
    """The extras the gateway names are the ones pip knows, and `all` installs every one of them."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared), sorted(set(EXTRAS) - set(declared))
    (everything,) = declared["all"]
    assert everything.startswith("forestflow[") and set(EXTRAS) <= set(everything[len("forestflow[") : -1].split(","))
    assert "forestflow[all]" in declared["test"]
