"""MLflow models (ForestFlow's MLFlowServeRequest): the ``MLmodel`` file picks the flavor that loads.

The artifact is the model's directory. Its ``MLmodel`` YAML lists ``flavors``; the first one this
gateway serves natively wins, without the mlflow package:

- ``h2o_mojo`` (ForestFlow's): ``data`` names a sub-directory whose ``h2o.yaml`` gives
  ``model_file``, the MOJO loaded by the H2O flavor;
- ``xgboost`` (``data``: the saved booster, JSON or UBJSON) -> the XGBoost flavor;
- ``lightgbm`` (``data``: a Booster's text model -> the LightGBM flavor; a pickled
  LGBMClassifier/Regressor -> the SKLearn flavor, gated like it);
- ``sklearn`` (``pickled_model``) -> the SKLearn flavor (unpickling: gated by ``allow_python``);
- ``onnx`` (``data``) -> the ONNX flavor.

A model with only ``python_function`` is served when its ``loader_module`` is one of those
flavors' modules (``mlflow.xgboost``...), from its ``data``/``model_path``; any other loader module
(custom Python models need mlflow and the model's environment) is a 422 that names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime.base import Servable

SUPPORTED = ("h2o_mojo", "xgboost", "lightgbm", "sklearn", "onnx")
#: python_function loader modules and the flavor whose reading they stand for.
LOADER_MODULES = {f"mlflow.{name}": name for name in ("xgboost", "lightgbm", "sklearn", "onnx")}


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
        if name in SUPPORTED:
            return _servable(str(name), fqrv, artifact_dir, props if isinstance(props, dict) else {})
    pyfunc = flavors.get("python_function")
    loader = pyfunc.get("loader_module") if isinstance(pyfunc, dict) else None
    if isinstance(pyfunc, dict) and loader in LOADER_MODULES:
        data = pyfunc.get("model_path") or pyfunc.get("data")
        return _servable(LOADER_MODULES[loader], fqrv, artifact_dir, {"data": data, "pickled_model": data})
    why = (
        f" (its python_function's loader_module {loader!r} needs the mlflow package and the model's own environment; "
        f"served natively: loader_module {', '.join(LOADER_MODULES)})"
        if isinstance(pyfunc, dict)
        else ""
    )
    raise CreateServableRequestInvalidError(
        f"MLmodel: no supported flavor; the model has {', '.join(map(str, flavors))}; supported: {', '.join(SUPPORTED)}{why}"
    )


def _servable(name: str, fqrv: FQRV, artifact_dir: Path, props: dict[str, Any]) -> Servable:
    if name == "h2o_mojo":
        return _h2o_mojo(fqrv, artifact_dir, props)
    from forestflow.runtime.flavors import create_servable

    pickled = name == "sklearn" or Path(str(props.get("data", ""))).suffix in (".pkl", ".pickle", ".joblib", ".skops")
    if pickled and (props.get("serialization_format") == "skops" or str(props.get("data", "")).endswith(".skops")):
        raise CreateServableRequestInvalidError(
            f"MLmodel flavors.{name}: serialization_format skops is not read here; log the model with "
            "serialization_format='cloudpickle' (or 'pickle')"
        )
    key = "pickled_model" if name == "sklearn" else "data"
    raw = props.get(key)
    if not isinstance(raw, str) or not raw:
        raise CreateServableRequestInvalidError(f"MLmodel flavors.{name}.{key}: required (the model file)")
    model = _inside(raw, f"MLmodel flavors.{name}.{key}")
    flavor = {"xgboost": "XGBoost", "lightgbm": "LightGBM", "sklearn": "SKLearn", "onnx": "ONNX"}[name]
    if name == "lightgbm" and Path(model).suffix in (".pkl", ".pickle", ".joblib"):
        flavor = "SKLearn"  # an LGBMClassifier/Regressor pickled by mlflow: its own predict, gated
    path = artifact_dir / model
    if path.is_dir():  # some flavors name a directory holding the one model file
        files = sorted(p.name for p in path.iterdir() if p.is_file())
        if len(files) != 1:
            raise CreateServableRequestInvalidError(
                f"MLmodel flavors.{name}.{key}: {model!r} is a directory of {len(files)} files"
            )
        model = str(Path(model) / files[0])
    return create_servable(flavor, fqrv, artifact_dir, {"modelPath": model})


def _h2o_mojo(fqrv: FQRV, artifact_dir: Path, props: dict[str, Any]) -> Servable:
    from forestflow.runtime.h2o_mojo import H2OMojoServable

    data = _inside(str(props.get("data") or "."), "MLmodel flavors.h2o_mojo.data")
    spec = _read_yaml(artifact_dir / data / "h2o.yaml", f"{data}/h2o.yaml")
    model_file = spec.get("model_file")
    if not isinstance(model_file, str) or not model_file:
        raise CreateServableRequestInvalidError(f"{data}/h2o.yaml: model_file is required (the MOJO's file name)")
    mojo = _inside(str(Path(data) / model_file), f"{data}/h2o.yaml model_file")
    return H2OMojoServable(fqrv, artifact_dir, {"mojoPath": mojo, "version": str(props.get("h2o_version", ""))})
