"""MLflow models (ForestFlow's MLFlowServeRequest): the ``MLmodel`` file picks the flavor that loads.

The artifact is the model's directory. Its ``MLmodel`` YAML lists ``flavors``; the first one this
gateway supports wins. Supported: ``h2o_mojo`` (ForestFlow's): ``data`` names a sub-directory whose
``h2o.yaml`` gives ``model_file``, the MOJO loaded by the H2O flavor. MLflow's own ``h2o`` flavor
(a binary model that needs a running H2O cluster) and ``python_function`` (which needs the mlflow
package and the model's environment) are not supported: such a model is refused with a 422 that
names the flavors it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime.base import Servable

SUPPORTED = ("h2o_mojo",)


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CreateServableRequestInvalidError(f"{what}: not found in the MLflow model") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CreateServableRequestInvalidError(f"{what}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise CreateServableRequestInvalidError(f"{what}: expected a YAML mapping")
    return doc


def _inside(rel: str, what: str) -> str:
    path = Path(rel)
    if path.is_absolute() or ".." in path.parts:
        raise CreateServableRequestInvalidError(f"{what}: {rel!r} must be a relative path inside the model")
    return str(path)


def create_mlflow_servable(fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> Servable:
    """The servable of the first supported flavor of the model in ``artifact_dir`` (not loaded yet)."""
    mlmodel = artifact_dir / "MLmodel"
    if not mlmodel.is_file():
        raise CreateServableRequestInvalidError(
            "no MLmodel file at the path: an MLFlowServeRequest's path names an MLflow model (its directory "
            "or its MLmodel file); a BasicServeRequest needs a flavor (H2OMojo, Python)"
        )
    doc = _read_yaml(mlmodel, "MLmodel")
    flavors = doc.get("flavors")
    if not isinstance(flavors, dict) or not flavors:
        raise CreateServableRequestInvalidError("MLmodel: no flavors")
    for name, props in flavors.items():
        if name == "h2o_mojo":
            return _h2o_mojo(fqrv, artifact_dir, props if isinstance(props, dict) else {})
    raise CreateServableRequestInvalidError(
        f"MLmodel: no supported flavor; the model has {', '.join(map(str, flavors))}; supported: {', '.join(SUPPORTED)}"
    )


def _h2o_mojo(fqrv: FQRV, artifact_dir: Path, props: dict[str, Any]) -> Servable:
    from forestflow.runtime.h2o_mojo import H2OMojoServable

    data = _inside(str(props.get("data") or "."), "MLmodel flavors.h2o_mojo.data")
    spec = _read_yaml(artifact_dir / data / "h2o.yaml", f"{data}/h2o.yaml")
    model_file = spec.get("model_file")
    if not isinstance(model_file, str) or not model_file:
        raise CreateServableRequestInvalidError(f"{data}/h2o.yaml: model_file is required (the MOJO's file name)")
    mojo = _inside(str(Path(data) / model_file), f"{data}/h2o.yaml model_file")
    return H2OMojoServable(fqrv, artifact_dir, {"mojoPath": mojo, "version": str(props.get("h2o_version", ""))})
