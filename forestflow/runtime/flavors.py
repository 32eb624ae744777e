"""The registry of flavors: the ForestFlow JSON key of each flavor and the code that builds its servables.

It sits above the flavor modules (each imported lazily, when a servable of it is first created) and
below the registry's loader and the pipeline flavor, which create servables through it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.extras import needed_for
from forestflow.runtime.base import Servable

FlavorFactory = Callable[[FQRV, Path, dict[str, Any]], Servable]

_FLAVORS: dict[str, Callable[[], FlavorFactory]] = {}


def register_flavor(name: str, loader: Callable[[], FlavorFactory]) -> None:
    """Register a flavor under its ForestFlow JSON key; ``loader`` imports it lazily."""
    _FLAVORS[name] = loader


def flavor_names() -> list[str]:
    """The names of every registered flavor."""
    return sorted(_FLAVORS)


def create_servable(flavor: str, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> Servable:
    """Instantiate (not load) a servable of the named flavor."""
    try:
        loader = _FLAVORS[flavor]
    except KeyError:
        raise CreateServableRequestInvalidError(f"unknown flavor {flavor!r}; supported: {', '.join(flavor_names())}") from None
    # A flavor's module imports its libraries when it is first used: one an extra installs is a 422 naming it.
    with needed_for(f"the {flavor} flavor"):
        factory = loader()
    return factory(fqrv, artifact_dir, settings)


def _python_flavor() -> FlavorFactory:
    from forestflow.runtime.python_flavor import PythonServable

    return PythonServable


def _h2o_flavor() -> FlavorFactory:
    from forestflow.runtime.h2o_mojo import H2OMojoServable

    return H2OMojoServable


def _onnx_flavor() -> FlavorFactory:
    from forestflow.runtime.onnx_flavor import OnnxServable

    return OnnxServable


def _mlflow_flavor() -> FlavorFactory:
    from forestflow.runtime.mlflow_model import create_mlflow_servable

    return create_mlflow_servable


def _pipeline_flavor() -> FlavorFactory:
    from forestflow.runtime.pipeline import PipelineServable

    # The pipeline builds its steps through this registry, handed to it rather than imported.
    return partial(PipelineServable, create_step=create_servable)


def _remote_flavor() -> FlavorFactory:
    from forestflow.runtime.remote.servable import RemoteV2Servable

    return RemoteV2Servable


def _map_step() -> FlavorFactory:
    from forestflow.runtime.pipeline_steps import MapStep

    return MapStep


def _classifier_step() -> FlavorFactory:
    from forestflow.runtime.pipeline_steps import ClassifierStep

    return ClassifierStep


def _regressor_step() -> FlavorFactory:
    from forestflow.runtime.pipeline_steps import RegressorStep

    return RegressorStep


def _image_decode_step() -> FlavorFactory:
    from forestflow.runtime.image_steps import ImageDecodeStep

    return ImageDecodeStep


def _image_encode_step() -> FlavorFactory:
    from forestflow.runtime.image_steps import ImageEncodeStep

    return ImageEncodeStep


register_flavor("Python", _python_flavor)
register_flavor("H2OMojo", _h2o_flavor)
register_flavor("ONNX", _onnx_flavor)
register_flavor("Pipeline", _pipeline_flavor)
register_flavor("Map", _map_step)
register_flavor("Classifier", _classifier_step)
register_flavor("Regressor", _regressor_step)
register_flavor("ImageDecode", _image_decode_step)
register_flavor("ImageEncode", _image_encode_step)
register_flavor("RemoteV2", _remote_flavor)  # a model served by another V2 server: no artifact
register_flavor("MLflow", _mlflow_flavor)  # MLFlowServeRequest: the model's MLmodel picks the flavor
