"""Test helpers for pipelines: TOML definitions written from Python values, and pipeline directories."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support import H2O_DIR

PROSTATE = ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"]
CATEGORICAL = {"RACE", "DPROS", "DCAPS"}


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _value(k)


def port(name: str, datatype: str = "FP64", tensor: str | None = None, shape: list[int] | None = None) -> dict[str, Any]:
    """One ``[[models.inputs]]`` / ``[[models.outputs]]`` entry."""
    out: dict[str, Any] = {"name": name, "datatype": datatype}
    if tensor is not None:
        out["id"] = tensor
    if shape is not None:
        out["shape"] = shape
    return out


def toml(steps: list[dict[str, Any]], outputs: list[str] | None = None) -> str:
    """A ``[[models]]`` definition; each step dict has name, platform, id?, inputs, outputs, options."""
    lines = []
    if outputs is not None:
        lines += ["[pipeline]", f"outputs = {_value(outputs)}", ""]
    for step in steps:
        lines.append("[[models]]")
        for k, v in step.items():
            if k not in ("inputs", "outputs"):
                lines.append(f"{_key(k)} = {_value(v)}")
        for kind in ("inputs", "outputs"):
            for p in step.get(kind, []):
                lines.append(f"  [[models.{kind}]]")
                lines += [f"  {_key(k)} = {_value(v)}" for k, v in p.items()]
        lines.append("")
    return "\n".join(lines)


def pipeline_dir(root: Path, text: str, mojos: tuple[str, ...] = (), files: dict[str, str] | None = None) -> Path:
    """A servable directory with ``pipeline.toml``, copies of H2O fixture MOJOs and extra files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.toml").write_text(text)
    for mojo in mojos:
        shutil.copy(H2O_DIR / mojo, root / mojo)
    for name, content in (files or {}).items():
        (root / name).write_text(content)
    return root


def prostate_map_step(name: str = "prepare") -> dict[str, Any]:
    """Lower-case request columns -> the prostate models' columns (race codes mapped)."""
    return {
        "name": name,
        "platform": "map",
        "rename": {c: c.lower() for c in PROSTATE},
        "values": {"RACE": {"white": "1", "black": "2", "other": "0"}},
        "inputs": [port(c.lower(), "BYTES") for c in PROSTATE],
        "outputs": [port(c, "BYTES" if c in CATEGORICAL else "FP64", c.lower()) for c in PROSTATE],
    }


def h2o_step(name: str, mojo: str, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """An H2O MOJO step reading the map step's prostate tensors."""
    return {
        "name": name,
        "platform": "h2o_mojo",
        "id": mojo,
        "inputs": [port(c, "BYTES" if c in CATEGORICAL else "FP64", c.lower()) for c in PROSTATE],
        "outputs": outputs,
    }


def servable_request(
    directory: Path,
    release: str = "p1",
    contract: tuple[str, str, int] = ("pipe", "prostate", 1),
    log_level: str = "NONE",
    phase_in: dict[str, Any] | None = None,
    definition: str = "pipeline.toml",
) -> dict[str, Any]:
    """A BasicServeRequest deploying a pipeline directory."""
    org, project, n = contract
    return {
        "path": directory.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": {"Pipeline": {"definition": definition}},
        "servableSettings": {
            "policySettings": {
                "validityPolicy": [{"ImmediatelyValid": {}}],
                "phaseInPolicy": phase_in or {"ImmediatePhaseIn": {}},
            },
            "loggingSettings": {"logLevel": log_level, "keyFeatures": [] if log_level == "NONE" else ["reqid"]},
        },
    }
