"""The Servable interface every flavor implements, and the flavor registry."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError


@dataclass(frozen=True, slots=True)
class ServableMetadata:
    """What a servable takes and gives: used by every protocol's metadata call."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Servable(abc.ABC):
    """One loaded release of a model.

    ``load`` and ``predict`` are synchronous and may be CPU-bound: the registry runs ``load`` in a
    worker thread and the scheduler runs ``predict`` off the event loop. ``predict`` must be safe
    to call from several threads at once unless the flavor says otherwise via ``max_concurrency``.
    """

    #: How many ``predict`` calls may run at once for this servable (None = scheduler default).
    max_concurrency: int | None = None
    #: Live batches of at most this many rows are scored on the event loop, without a thread hop.
    #: Only for flavors whose small batches take well under ~100 us and never block (0 = never).
    inline_max_rows: int = 0
    #: Whether ``predict`` reads ``frame.parameters`` (request configs): if not, requests with
    #: different configs may be scored together in one call.
    reads_parameters: bool = True

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        self.fqrv = fqrv
        self.artifact_dir = artifact_dir
        self.settings = settings
        self.ready = False
        #: The gateway's Settings, set by the registry before ``load`` (flavors that compose others
        #: read its gates, e.g. ``allow_python``); None when a servable is built on its own.
        self.gateway_settings: Any = None

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact and warm the model; raise ``CreateServableRequestInvalidError`` on failure."""

    @abc.abstractmethod
    def predict(self, frame: Frame) -> Frame:
        """Score a batch: one output row per input row, in order."""

    @abc.abstractmethod
    def metadata(self) -> ServableMetadata:
        """Inputs and outputs of the loaded model."""

    def unload(self) -> None:
        """Release what ``load`` acquired."""
        self.ready = False

    def health_problem(self) -> str | None:
        """Why this loaded servable cannot score now (None: it can); readiness reports it."""
        return None


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
        raise CreateServableRequestInvalidError(
            f"unknown flavor {flavor!r}; supported: {', '.join(flavor_names())}"
        ) from None
    return loader()(fqrv, artifact_dir, settings)


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


register_flavor("Python", _python_flavor)
register_flavor("H2OMojo", _h2o_flavor)
register_flavor("ONNX", _onnx_flavor)


# ---- pipeline step platforms --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepPlatform:
    """How a pipeline step of a ``platform`` (AMD's TOML name) becomes a servable of a flavor.

    ``artifact_key`` is the flavor setting that receives the step's ``id`` (the artifact file);
    None for built-in steps without an artifact. ``gate`` names the gateway setting that must be on
    (e.g. ``allow_python``) before a step of this platform may load. ``takes_ports``: the flavor
    reads the step's declared ports (``pipelineInputs``/``pipelineOutputs`` settings); model
    flavors do not, and some refuse settings they do not know.
    """

    flavor: str
    artifact_key: str | None
    gate: str | None = None
    takes_ports: bool = False


_PLATFORMS: dict[str, StepPlatform] = {}


def register_platform(platform: str, step: StepPlatform) -> None:
    """Let pipeline steps name a flavor by its platform (``h2o_mojo``, ``python``, ``map``...)."""
    _PLATFORMS[platform] = step


def step_platform(platform: str) -> StepPlatform | None:
    """The flavor behind a step platform, None if unknown."""
    return _PLATFORMS.get(platform)


def platform_names() -> list[str]:
    """Every platform a pipeline step may name."""
    return sorted(_PLATFORMS)


def _pipeline_flavor() -> FlavorFactory:
    from forestflow.runtime.pipeline import PipelineServable

    return PipelineServable


def _step_flavor(name: str) -> Callable[[], FlavorFactory]:
    def load() -> FlavorFactory:
        from forestflow.runtime import pipeline_steps

        return getattr(pipeline_steps, name)  # type: ignore[no-any-return]

    return load


register_flavor("Pipeline", _pipeline_flavor)
register_flavor("Map", _step_flavor("MapStep"))
register_flavor("Classifier", _step_flavor("ClassifierStep"))
register_flavor("Regressor", _step_flavor("RegressorStep"))
register_platform("h2o_mojo", StepPlatform("H2OMojo", "mojoPath"))
register_platform("python", StepPlatform("Python", "modulePath", gate="allow_python"))
register_platform("map", StepPlatform("Map", None, takes_ports=True))
register_platform("classifier", StepPlatform("Classifier", None, takes_ports=True))
register_platform("regressor", StepPlatform("Regressor", None, takes_ports=True))
register_platform("onnx", StepPlatform("ONNX", "modelPath"))
register_flavor("MLflow", _mlflow_flavor)  # MLFlowServeRequest: the model's MLmodel picks the flavor
